/* gguf_cmd.c - `baton gguf FILE`: what a GGUF file holds, without loading it.
 *
 * The summary: format, architecture, the model's hyperparameters (the
 * "{arch}.*" keys), vocabulary size, tensors by type (count and bytes),
 * bytes per layer, then every metadata key (arrays shown by their first
 * elements).  --tensors adds every tensor (name, type, shape, file offset,
 * bytes); --json prints the same as one JSON object.  Files with types baton
 * cannot compute are listed like any other.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "gguf.h"

static void gguf_usage(FILE *f) {
    fprintf(f,
            "usage: baton gguf FILE [options]\n"
            "\n"
            "Shows what a GGUF model file holds: architecture, hyperparameters, vocabulary\n"
            "size, tensors by type, bytes per layer and every metadata key.  The file is\n"
            "checked as a whole (every size and offset); a damaged file is one message\n"
            "naming the byte offset and the key or tensor, and exit code 1.\n"
            "\n"
            "  --tensors     list every tensor: name, type, shape, file offset, bytes\n"
            "  --json        print one JSON object instead of text\n"
            "  -h, --help    this text\n");
}

/* ---- printing helpers ---- */

static const char *human(uint64_t b, char *buf, size_t n) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, n, "%" PRIu64 " B", b);
    else snprintf(buf, n, "%.2f %s", v, unit[u]);
    return buf;
}

/* a string for the terminal: control bytes and quotes escaped, cut at max */
static void put_text(FILE *f, const char *s, uint64_t n, uint64_t max) {
    fputc('"', f);
    for (uint64_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (n > max) fputs("...", f);
}


static void put_number(FILE *f, const struct bt_gguf *g, const struct bt_gguf_value *v, bool json) {
    switch (v->type) {
    case BT_GGUF_TYPE_FLOAT32:
    case BT_GGUF_TYPE_FLOAT64: {
        double d = bt_gguf_value_f64(g, v);
        if (json && !isfinite(d)) {
            fputs("null", f);
            break;
        }
        /* the shortest decimal that reads back as the same value */
        char buf[40];
        bool f32 = v->type == BT_GGUF_TYPE_FLOAT32;
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, d);
            double r = strtod(buf, NULL);
            if (f32 ? (float)r == (float)d : r == d) break;
        }
        fputs(buf, f);
        break;
    }
    case BT_GGUF_TYPE_BOOL: fputs(bt_gguf_value_i64(g, v) ? "true" : "false", f); break;
    case BT_GGUF_TYPE_UINT64: fprintf(f, "%" PRIu64, bt_gguf_value_u64(g, v)); break;
    default: fprintf(f, "%" PRId64, bt_gguf_value_i64(g, v)); break;
    }
}

/* text: a value, arrays by their first `show` elements */
static void put_value(FILE *f, const struct bt_gguf *g, const struct bt_gguf_value *v, int show) {
    if (v->type == BT_GGUF_TYPE_STRING) {
        struct bt_gguf_str s = bt_gguf_value_str(g, v);
        put_text(f, s.data, s.n, 120);
    } else if (v->type == BT_GGUF_TYPE_ARRAY) {
        fprintf(f, "[%s x %" PRIu64 "]", bt_gguf_type_name(v->elem_type), v->n);
        if (v->n) fputs(" [", f);
        for (uint64_t i = 0; i < v->n && i < (uint64_t)show; i++) {
            struct bt_gguf_value e = bt_gguf_arr_elem(g, v, i);
            if (i) fputs(", ", f);
            put_value(f, g, &e, 3);
        }
        if (v->n > (uint64_t)show) fputs(", ...", f);
        if (v->n) fputs("]", f);
    } else {
        put_number(f, g, v, false);
    }
}

/* JSON: scalars and strings as values, arrays of up to 16 scalars in full,
 * other arrays as {"type": ..., "length": n} */
static void put_json_value(FILE *f, const struct bt_gguf *g, const struct bt_gguf_value *v) {
    if (v->type == BT_GGUF_TYPE_STRING) {
        struct bt_gguf_str s = bt_gguf_value_str(g, v);
        bt_cli_json_str(f, s.data, s.n);
    } else if (v->type == BT_GGUF_TYPE_ARRAY) {
        if (v->n <= 16 && bt_gguf_type_size(v->elem_type) > 0) {
            fputc('[', f);
            for (uint64_t i = 0; i < v->n; i++) {
                struct bt_gguf_value e = bt_gguf_arr_elem(g, v, i);
                if (i) fputs(", ", f);
                put_number(f, g, &e, true);
            }
            fputc(']', f);
        } else {
            fprintf(f, "{\"array\": \"%s\", \"length\": %" PRIu64 "}", bt_gguf_type_name(v->elem_type), v->n);
        }
    } else {
        put_number(f, g, v, true);
    }
}

static void shape_str(const struct bt_gguf_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int d = 0; d < (t->n_dims ? t->n_dims : 1) && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, d ? " x " : "", t->ne[d]);
}

/* ---- the summary ---- */

struct type_row {
    uint32_t id;
    int64_t count;
    uint64_t bytes;
};

/* hyperparameters worth a line of their own, as "{arch}." + suffix */
static const char *const hparams[] = {
    "block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon", "rope.dimension_count", "rope.freq_base",
    "rope.scaling.type", "rope.scaling.factor", "expert_count", "expert_used_count", "expert_shared_count",
    "expert_feed_forward_length", "vocab_size",
};

/* what both outputs show: architecture, vocabulary, tensors by type (in
 * type-number order), layers */
struct gguf_summary {
    struct bt_gguf_str arch;
    bool has_arch;
    char archz[128];
    int64_t vocab, nt;
    struct type_row rows[64];
    int n_rows, n_layers;
    uint64_t total;
};

static void summarize(struct bt_gguf *g, struct gguf_summary *s) {
    /* architecture, vocabulary */
    s->arch = (struct bt_gguf_str){0, ""};
    s->has_arch = bt_gguf_get_str(g, "general.architecture", &s->arch) == BT_OK;
    snprintf(s->archz, sizeof s->archz, "%.*s", (int)(s->arch.n < 100 ? s->arch.n : 100), s->arch.data);
    s->vocab = -1;
    const struct bt_gguf_value *toks;
    if (bt_gguf_get_arr(g, "tokenizer.ggml.tokens", BT_GGUF_TYPE_COUNT, &toks) == BT_OK) s->vocab = (int64_t)toks->n;

    /* tensors by type (in type-number order) */
    s->nt = bt_gguf_n_tensors(g);
    s->n_rows = 0;
    s->total = 0;
    const int64_t nt = s->nt;
    struct type_row *rows = s->rows;
    for (int64_t i = 0; i < nt; i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        s->total += t->size;
        int r = 0;
        while (r < s->n_rows && rows[r].id != t->ggml_type) r++;
        if (r == s->n_rows) {
            /* keep sorted by id */
            while (r > 0 && rows[r - 1].id > t->ggml_type) {
                rows[r] = rows[r - 1];
                r--;
            }
            rows[r] = (struct type_row){t->ggml_type, 0, 0};
            s->n_rows++;
        }
        rows[r].count++;
        rows[r].bytes += t->size;
    }
    s->n_layers = bt_gguf_n_layers(g);
}

static void print_json(struct bt_gguf *g, const char *path, const struct gguf_summary *s, bool tensors) {
    const struct bt_gguf_str arch = s->arch;
    const bool has_arch = s->has_arch;
    const int64_t vocab = s->vocab, nt = s->nt;
    const struct type_row *rows = s->rows;
    const int n_rows = s->n_rows, n_layers = s->n_layers;
    const uint64_t total = s->total;
    FILE *f = stdout;
    fputs("{\"file\": ", f);
    bt_cli_json_str(f, path, strlen(path));
    fprintf(f, ", \"version\": %" PRIu32 ", \"size\": %" PRIu64 ", \"files\": %d, \"alignment\": %" PRIu32
               ", \"data_offset\": %" PRIu64 ", \"header_checksum\": \"%016" PRIx64 "\",\n",
            bt_gguf_version(g), bt_gguf_file_size(g), bt_gguf_n_files(g), bt_gguf_alignment(g),
            bt_gguf_data_offset(g), bt_gguf_header_checksum(g));
    fputs(" \"architecture\": ", f);
    if (has_arch) bt_cli_json_str(f, arch.data, arch.n);
    else fputs("null", f);
    fputs(", \"vocab_size\": ", f);
    if (vocab >= 0) fprintf(f, "%" PRId64, vocab);
    else fputs("null", f);
    fprintf(f, ",\n \"tensor_count\": %" PRId64 ", \"tensor_bytes\": %" PRIu64 ",\n \"metadata\": {", nt, total);
    for (int64_t i = 0; i < bt_gguf_n_kv(g); i++) {
        const char *k = bt_gguf_kv_key(g, i);
        fputs(i ? ",\n  " : "\n  ", f);
        bt_cli_json_str(f, k, strlen(k));
        fputs(": ", f);
        put_json_value(f, g, bt_gguf_kv_value(g, i));
    }
    fputs("},\n \"types\": [", f);
    for (int r = 0; r < n_rows; r++)
        fprintf(f, "%s{\"type\": \"%s\", \"count\": %" PRId64 ", \"bytes\": %" PRIu64 "}", r ? ", " : "",
                bt_ggml_type_info(rows[r].id)->name, rows[r].count, rows[r].bytes);
    fputs("],\n \"layers\": [", f);
    for (int l = 0; l < n_layers; l++) {
        const int64_t *idx;
        int64_t n = bt_gguf_layer_tensors(g, l, &idx);
        fprintf(f, "%s{\"layer\": %d, \"tensors\": %" PRId64 ", \"bytes\": %" PRIu64 "}", l ? ", " : "", l, n,
                bt_gguf_layer_bytes(g, l));
    }
    const int64_t *idx;
    int64_t n_other = bt_gguf_layer_tensors(g, -1, &idx);
    fprintf(f, "],\n \"other\": {\"tensors\": %" PRId64 ", \"bytes\": %" PRIu64 "}", n_other,
            bt_gguf_layer_bytes(g, -1));
    if (tensors) {
        fputs(",\n \"tensors\": [", f);
        for (int64_t i = 0; i < nt; i++) {
            const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
            fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
            bt_cli_json_str(f, t->name, strlen(t->name));
            fprintf(f, ", \"type\": \"%s\", \"shape\": [", bt_ggml_type_info(t->ggml_type)->name);
            for (int d = 0; d < t->n_dims; d++) fprintf(f, "%s%" PRId64, d ? ", " : "", t->ne[d]);
            fprintf(f, "], \"offset\": %" PRIu64 ", \"bytes\": %" PRIu64 "}", t->file_offset, t->size);
        }
        fputs("]", f);
    }
    fputs("}\n", f);
}

static void print_text(struct bt_gguf *g, const char *path, const struct gguf_summary *s, bool tensors) {
    const bool has_arch = s->has_arch;
    const char *archz = s->archz;
    const int64_t vocab = s->vocab, nt = s->nt;
    const struct type_row *rows = s->rows;
    const int n_rows = s->n_rows, n_layers = s->n_layers;
    const uint64_t total = s->total;
    char h1[32], h2[32];
    printf("%s: GGUF v%" PRIu32 ", %s, %" PRId64 " keys, %" PRId64 " tensors, alignment %" PRIu32 "\n", path,
           bt_gguf_version(g), human(bt_gguf_file_size(g), h1, sizeof h1), bt_gguf_n_kv(g), nt, bt_gguf_alignment(g));
    if (bt_gguf_n_files(g) > 1)
        printf("size %" PRIu64 " bytes in %d files (a split model), header checksum %016" PRIx64
               " (FNV-1a 64 of each file's bytes before its data)\n",
               bt_gguf_file_size(g), bt_gguf_n_files(g), bt_gguf_header_checksum(g));
    else
        printf("size %" PRIu64 " bytes, header checksum %016" PRIx64 " (FNV-1a 64 of the %" PRIu64
               " bytes before the data)\n",
               bt_gguf_file_size(g), bt_gguf_header_checksum(g),
               bt_gguf_data_offset(g) < bt_gguf_file_size(g) ? bt_gguf_data_offset(g) : bt_gguf_file_size(g));
    printf("\narchitecture       %s\n", has_arch ? archz : "(none: no general.architecture)");
    struct bt_gguf_str name;
    if (bt_gguf_get_str(g, "general.name", &name) == BT_OK) {
        printf("name               ");
        put_text(stdout, name.data, name.n, 80);
        printf("\n");
    }
    if (vocab >= 0) printf("vocabulary         %" PRId64 " tokens\n", vocab);
    if (has_arch) {
        bool any = false;
        for (size_t i = 0; i < sizeof hparams / sizeof hparams[0]; i++) {
            char key[256];
            snprintf(key, sizeof key, "%s.%s", archz, hparams[i]);
            int64_t k = bt_gguf_find_key(g, key);
            if (k < 0) continue;
            if (!any) printf("\nhyperparameters (%s.*)\n", archz);
            any = true;
            printf("  %-34s ", hparams[i]);
            put_value(stdout, g, bt_gguf_kv_value(g, k), 8);
            printf("\n");
        }
    }

    printf("\ntensors by type     count        bytes\n");
    for (int r = 0; r < n_rows; r++)
        printf("  %-16s %7" PRId64 " %12s\n", bt_ggml_type_info(rows[r].id)->name, rows[r].count,
               human(rows[r].bytes, h1, sizeof h1));
    printf("  %-16s %7" PRId64 " %12s", "total", nt, human(total, h1, sizeof h1));
    if (nt) printf("  (data section at offset %" PRIu64 ")", bt_gguf_data_offset(g));
    printf("\n");

    if (n_layers > 0) {
        printf("\nbytes per layer    tensors        bytes\n");
        /* runs of layers alike in tensor count and bytes on one line */
        for (int l = 0; l < n_layers;) {
            const int64_t *idx;
            int64_t n = bt_gguf_layer_tensors(g, l, &idx);
            uint64_t b = bt_gguf_layer_bytes(g, l);
            int e = l + 1;
            while (e < n_layers && bt_gguf_layer_tensors(g, e, &idx) == n && bt_gguf_layer_bytes(g, e) == b) e++;
            char range[32];
            if (e - l > 1) snprintf(range, sizeof range, "blk.%d-%d", l, e - 1);
            else snprintf(range, sizeof range, "blk.%d", l);
            printf("  %-16s %7" PRId64 " %12s%s\n", range, n, human(b, h1, sizeof h1), e - l > 1 ? " each" : "");
            l = e;
        }
        const int64_t *idx;
        int64_t n = bt_gguf_layer_tensors(g, -1, &idx);
        printf("  %-16s %7" PRId64 " %12s\n", "other", n, human(bt_gguf_layer_bytes(g, -1), h2, sizeof h2));
    }

    printf("\nmetadata\n");
    for (int64_t i = 0; i < bt_gguf_n_kv(g); i++) {
        const struct bt_gguf_value *v = bt_gguf_kv_value(g, i);
        printf("  %-44s %-8s ", bt_gguf_kv_key(g, i), bt_gguf_type_name(v->type));
        put_value(stdout, g, v, 8);
        printf("\n");
    }

    if (tensors) {
        printf("\ntensors\n  %5s  %-40s %-8s %-24s %14s %12s\n", "#", "name", "type", "shape", "offset", "bytes");
        for (int64_t i = 0; i < nt; i++) {
            const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
            char shape[128];
            shape_str(t, shape, sizeof shape);
            printf("  %5" PRId64 "  %-40s %-8s %-24s %14" PRIu64 " %12" PRIu64 "\n", i, t->name,
                   bt_ggml_type_info(t->ggml_type)->name, shape, t->file_offset, t->size);
        }
    }
}

int bt_cli_gguf(int argc, char **argv) {
    bool tensors = false, json = false;
    static const struct option longs[] = {
        {"tensors", no_argument, 0, 'T'},
        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    while ((code = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        if (code == 'T') tensors = true;
        else if (code == 'j') json = true;
        else if (code == 'h') {
            gguf_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "baton gguf: unknown option %s (try: baton gguf --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "baton gguf: missing FILE (try: baton gguf --help)\n");
        return 2;
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "baton gguf: unexpected argument '%s' (try: baton gguf --help)\n", argv[optind + 1]);
        return 2;
    }
    const char *path = argv[optind];
    if (!*path) {
        fprintf(stderr, "baton gguf: FILE: the file name is empty (try: baton gguf --help)\n");
        return 2;
    }
    struct bt_gguf *g;
    char err[1024];
    if (bt_gguf_open(path, &g, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }

    struct gguf_summary *sum = malloc(sizeof *sum);
    if (!sum) {
        fprintf(stderr, "baton gguf: out of memory\n");
        bt_gguf_close(g);
        return 1;
    }
    summarize(g, sum);
    if (json) print_json(g, path, sum, tensors);
    else print_text(g, path, sum, tensors);
    free(sum);
    bt_gguf_close(g);
    return 0;
}
