/* quantize.c - `baton quantize IN OUT TYPE`: a GGUF file's F32 / F16 / BF16
 * weights quantised to Q8_0, Q4_0, Q6_K, the K-quant mixes Q4_K_M / Q5_K_M
 * (Q4_K and Q5_K are their aliases, as in llama-quantize), IQ4_NL, IQ4_XS or
 * MXFP4_MOE, every other tensor and every metadata value copied.  The 1-3-bit
 * IQ types are refused: quantising to them well needs an importance matrix,
 * which this does not read.
 *
 * Which tensor gets which type is a plan made first, as a value, from names
 * and shapes alone (plan_tensor_types; `--dry-run` prints it).  It follows
 * llama.cpp's src/llama-quant.cpp for these types:
 *   - quantised: tensors of 2 or more dimensions whose name ends in "weight",
 *     except norms, MoE router weights (ffn_gate_inp), position / token-type
 *     embeddings and a few small special tensors;
 *   - output.weight (or token_embd.weight when there is no output.weight,
 *     the embeddings being tied): Q6_K (Q8_0 stays Q8_0; Q8_0 when rows are
 *     not whole 256-element blocks);
 *   - Q4_K_M / Q5_K_M: attention V (attn_v, attn_qkv, attn_kv_b) and
 *     ffn_down get Q6_K on "more bits" layers (the first and last eighth and
 *     every third in between); with 8 experts attn_v and attn_k get Q8_0 and
 *     (Q4_K_M) attn_output Q5_K;
 *   - IQ4_NL / IQ4_XS (no importance matrix): attention V gets Q5_K where 4
 *     or more query heads share a KV head, ffn_down Q5_K in the first eighth
 *     of the layers; with 8 experts attn_v and attn_k Q8_0 and attn_output
 *     Q5_K;
 *   - MXFP4_MOE: the expert tensors (3 dimensions, ne[2] > 1) MXFP4, every
 *     other quantised tensor and output.weight Q8_0;
 *   - a row length that is not a multiple of the chosen type's block falls
 *     back as llama.cpp does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
 *     IQ4_XS -> IQ4_NL, then F16).
 * Not taken over: importance matrices, llama.cpp's 70B attn_v rule (it needs
 * the model's size class) and its Falcon-specific rules.
 *
 * Tensors are converted one at a time (rows split among --threads threads:
 * each row is quantised on its own, so the bytes do not depend on the thread
 * count) and streamed to OUT.tmp.XXXXXX, renamed to OUT at the end: a failure
 * leaves no OUT behind.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "gguf.h"
#include "outfile.h"
#include "quants.h"
#include "baton/tensor.h"

/* llama.cpp's llama_ftype numbers, written to general.file_type */
enum {
    FTYPE_Q4_0 = 2, FTYPE_Q8_0 = 7, FTYPE_Q4_K_M = 15, FTYPE_Q5_K_M = 17, FTYPE_Q6_K = 18,
    FTYPE_IQ4_NL = 25, FTYPE_IQ4_XS = 30, FTYPE_MXFP4_MOE = 38,
};

enum mix_rules { MIX_PLAIN, MIX_K, MIX_IQ4, MIX_MXFP4_MOE }; /* which of llama.cpp's rules (above) */

struct qmix {
    const char *name;
    enum bt_type base;
    int ftype;
    enum mix_rules rules;
};
static const struct qmix mixes[] = {
    {"Q8_0", BT_TYPE_Q8_0, FTYPE_Q8_0, MIX_PLAIN},       {"Q4_0", BT_TYPE_Q4_0, FTYPE_Q4_0, MIX_PLAIN},
    {"Q6_K", BT_TYPE_Q6_K, FTYPE_Q6_K, MIX_PLAIN},       {"Q4_K_M", BT_TYPE_Q4_K, FTYPE_Q4_K_M, MIX_K},
    {"Q4_K", BT_TYPE_Q4_K, FTYPE_Q4_K_M, MIX_K},         {"Q5_K_M", BT_TYPE_Q5_K, FTYPE_Q5_K_M, MIX_K},
    {"Q5_K", BT_TYPE_Q5_K, FTYPE_Q5_K_M, MIX_K},         {"IQ4_NL", BT_TYPE_IQ4_NL, FTYPE_IQ4_NL, MIX_IQ4},
    {"IQ4_XS", BT_TYPE_IQ4_XS, FTYPE_IQ4_XS, MIX_IQ4},   {"MXFP4_MOE", BT_TYPE_MXFP4, FTYPE_MXFP4_MOE, MIX_MXFP4_MOE},
    {"MXFP4", BT_TYPE_MXFP4, FTYPE_MXFP4_MOE, MIX_MXFP4_MOE},
};
/* llama-quantize's types that need an importance matrix */
static const char *const imatrix_types[] = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS",
                                            "IQ3_XS",  "IQ3_S",  "IQ3_M", "IQ1_S", "IQ1_M"};

/* ---- the plan ------------------------------------------------------------- */

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
static bool ends_with(const char *s, const char *suf) {
    const size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static bool is_quantisable(const struct bt_gguf_tensor *t) {
    const char *n = t->name;
    if (t->n_dims < 2 || !ends_with(n, "weight")) return false;
    if (has(n, "_norm.weight") || has(n, "ffn_gate_inp.weight") || has(n, "ffn_gate_tid2eid.weight")) return false;
    if (has(n, "altup") || has(n, "laurel") || has(n, "per_layer_model_proj")) return false;
    if (!strcmp(n, "position_embd.weight") || !strcmp(n, "token_types.weight")) return false;
    if (has(n, "ssm_conv1d") || has(n, "shortconv.conv.weight")) return false;
    return true;
}

static bool is_attn_v_like(const char *n) {
    return has(n, "attn_v.weight") || has(n, "attn_qkv.weight") || has(n, "attn_kv_b.weight");
}

/* llama.cpp's use_more_bits: the first and last eighth, and every third layer between */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama.cpp's tensor_type_fallback for rows of ne0 elements */
static enum bt_type shape_fallback(enum bt_type t, int64_t ne0) {
    if (ne0 % bt_blck_size(t) == 0) return t;
    switch (t) {
    case BT_TYPE_Q4_K: t = BT_TYPE_Q5_0; break;
    case BT_TYPE_Q5_K: t = BT_TYPE_Q5_1; break;
    case BT_TYPE_Q6_K: t = BT_TYPE_Q8_0; break;
    case BT_TYPE_IQ4_XS: t = BT_TYPE_IQ4_NL; break;
    default: break;
    }
    return ne0 % bt_blck_size(t) == 0 ? t : BT_TYPE_F16;
}

struct model_info {
    int n_layer;  /* {arch}.block_count, else 1 + the largest blk.N */
    int n_expert; /* {arch}.expert_count, else 0 */
    int n_head, n_head_kv; /* {arch}.attention.head_count(_kv) when single numbers, else 0 */
};

/* Block N of a "blk.N." name; -1 when the name has none. */
static int layer_of(const char *name) {
    int l, n = 0;
    if (sscanf(name, "blk.%d.%n", &l, &n) == 1 && n > 0 && l >= 0) return l;
    return -1;
}

/* The type of every tensor of g (out[i], BT_TYPE_COUNT: copied as it is). */
static void plan_tensor_types(const struct bt_gguf *g, const struct qmix *mix, bool pure,
                              const struct model_info *mi, enum bt_type *out) {
    const int64_t n = bt_gguf_n_tensors(g);
    const bool tied = bt_gguf_find_tensor(g, "output.weight") < 0;
    int n_attn_v = 0, i_attn_v = 0, i_ffn_down = 0;
    for (int64_t i = 0; i < n; i++)
        if (is_attn_v_like(bt_gguf_tensor(g, i)->name)) n_attn_v++;
    for (int64_t i = 0; i < n; i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        out[i] = BT_TYPE_COUNT;
        if (!is_quantisable(t)) continue;
        const char *name = t->name;
        enum bt_type ty = mix->base;
        const bool k_mix = mix->rules == MIX_K, iq4 = mix->rules == MIX_IQ4;
        const bool gqa4 = mi->n_head_kv > 0 && mi->n_head >= 4 * mi->n_head_kv;
        if (!pure && mix->rules == MIX_MXFP4_MOE) {
            if (t->n_dims < 3 || t->ne[2] <= 1) ty = BT_TYPE_Q8_0;
        } else if (!pure) {
            if (!strcmp(name, "output.weight") || (tied && !strcmp(name, "token_embd.weight"))) {
                if (t->ne[0] % BT_QK_K != 0) ty = BT_TYPE_Q8_0;
                else if (ty != BT_TYPE_Q8_0) ty = BT_TYPE_Q6_K;
            } else if (is_attn_v_like(name)) {
                if (k_mix && more_bits(i_attn_v, n_attn_v)) ty = BT_TYPE_Q6_K;
                if (iq4 && gqa4) ty = BT_TYPE_Q5_K;
                if (mi->n_expert == 8) ty = BT_TYPE_Q8_0;
                i_attn_v++;
            } else if (has(name, "attn_k.weight")) {
                if (mi->n_expert == 8) ty = BT_TYPE_Q8_0;
            } else if (has(name, "ffn_down")) {
                /* with experts, the layer from the name (llama.cpp: they are not in order) */
                const int layer = mi->n_expert > 1 && layer_of(name) >= 0 ? layer_of(name) : i_ffn_down;
                if (k_mix && more_bits(layer, mi->n_layer)) ty = BT_TYPE_Q6_K;
                if (iq4 && layer < mi->n_layer / 8) ty = BT_TYPE_Q5_K;
                i_ffn_down++;
            } else if (has(name, "attn_output.weight")) {
                if (mi->n_expert == 8 && (mix->ftype == FTYPE_Q4_K_M || iq4)) ty = BT_TYPE_Q5_K;
            }
        }
        out[i] = shape_fallback(ty, t->ne[0]);
    }
}

/* ---- converting one tensor --------------------------------------------------- */

struct conv_job {
    const uint8_t *src;
    enum bt_type src_type, dst_type;
    int64_t ne0, nrows;
    size_t src_row, dst_row;
    uint8_t *dst;
    int nth;
    /* per thread: the first non-finite element (row * ne0 + col), or -1 */
    int64_t bad[64];
    bool nomem[64];
};
struct conv_arg {
    struct conv_job *job;
    int ith;
};

static void *conv_thread(void *p) {
    struct conv_arg *a = p;
    struct conv_job *j = a->job;
    const int64_t r0 = j->nrows * a->ith / j->nth, r1 = j->nrows * (a->ith + 1) / j->nth;
    j->bad[a->ith] = -1;
    float *row = malloc((size_t)j->ne0 * sizeof *row);
    if (!row) {
        j->nomem[a->ith] = true;
        return NULL;
    }
    for (int64_t r = r0; r < r1; r++) {
        bt_row_to_f32(j->src_type, j->src + (size_t)r * j->src_row, row, j->ne0);
        for (int64_t c = 0; c < j->ne0; c++)
            if (!isfinite(row[c])) {
                j->bad[a->ith] = r * j->ne0 + c;
                free(row);
                return NULL;
            }
        bt_row_from_f32(j->dst_type, row, j->dst + (size_t)r * j->dst_row, j->ne0);
    }
    free(row);
    return NULL;
}

/* Convert job->nrows rows with nth threads; 0, or 1 with a message in err. */
static int convert(struct conv_job *job, const char *path, const char *name, char *err, size_t n_err) {
    pthread_t th[64];
    bool created[64] = {false};
    struct conv_arg args[64];
    for (int i = 0; i < job->nth; i++) {
        args[i] = (struct conv_arg){job, i};
        job->nomem[i] = false;
    }
    for (int i = 1; i < job->nth; i++) created[i] = pthread_create(&th[i], NULL, conv_thread, &args[i]) == 0;
    conv_thread(&args[0]);
    for (int i = 1; i < job->nth; i++) {
        if (created[i])
            pthread_join(th[i], NULL);
        else
            conv_thread(&args[i]); /* no thread: its share runs here */
    }
    int64_t bad = -1;
    for (int i = 0; i < job->nth; i++) {
        if (job->nomem[i]) {
            snprintf(err, n_err, "%s: tensor \"%s\": out of memory", path, name);
            return 1;
        }
        if (job->bad[i] >= 0 && (bad < 0 || job->bad[i] < bad)) bad = job->bad[i];
    }
    if (bad >= 0) {
        snprintf(err, n_err, "%s: tensor \"%s\": row %lld, element %lld is not a finite number: cannot quantise",
                 path, name, (long long)(bad / job->ne0), (long long)(bad % job->ne0));
        return 1;
    }
    return 0;
}

/* ---- the command -------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: baton quantize [options] IN.gguf OUT.gguf TYPE\n"
            "\n"
            "Quantise the F32 / F16 / BF16 weights of IN into OUT (written to a temporary\n"
            "file beside OUT and renamed at the end).  TYPE:\n"
            "  Q8_0 Q4_0 Q6_K     one type for the weights (output.weight: Q6_K unless Q8_0)\n"
            "  Q4_K_M Q5_K_M      llama.cpp's mixes: Q4_K / Q5_K with Q6_K for the attention\n"
            "                     V and ffn_down tensors of some layers and for output.weight\n"
            "  Q4_K Q5_K          aliases of Q4_K_M and Q5_K_M (as in llama-quantize)\n"
            "  IQ4_NL IQ4_XS      4-bit non-linear types (Q5_K for some attention V and\n"
            "                     ffn_down tensors, Q6_K for output.weight)\n"
            "  MXFP4_MOE          the experts in MXFP4, the other weights in Q8_0 (alias MXFP4)\n"
            "  (IQ1_S .. IQ3_S need an importance matrix, which this does not read)\n"
            "\n"
            "options:\n"
            "  -t, --threads N    threads (default: the online cores)\n"
            "  --pure             every quantised tensor gets TYPE's base type\n"
            "  --dry-run          print each tensor's type and write nothing\n"
            "  -h, --help         this text\n");
}

static void shape_str(const struct bt_gguf_tensor *t, char *buf, size_t n) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->n_dims && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)t->ne[d]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static const char *ggml_name(uint32_t id) {
    const struct bt_ggml_type_info *info = bt_ggml_type_info(id);
    return info ? info->name : "?";
}

struct quant_opts {
    long nth;
    bool pure, dry;
    const char *in, *out;
    const struct qmix *mix;
};

/* the command line; 0, or the exit code (2 for a usage error, 0 after --help: *done set) */
static int parse_quantize(int argc, char **argv, struct quant_opts *o, bool *done) {
    o->nth = sysconf(_SC_NPROCESSORS_ONLN);
    const char *pos[3];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            *done = true;
            return 0;
        } else if (!strcmp(a, "--pure")) {
            o->pure = true;
        } else if (!strcmp(a, "--dry-run")) {
            o->dry = true;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            char *end;
            if (i + 1 >= argc) {
                fprintf(stderr, "baton quantize: %s needs a value\n", a);
                return 2;
            }
            errno = 0;
            o->nth = strtol(argv[++i], &end, 10);
            if (errno || *end || end == argv[i] || o->nth < 1 || o->nth > 64) {
                fprintf(stderr, "baton quantize: %s %s: threads must be 1 to 64\n", a, argv[i]);
                return 2;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "baton quantize: unknown option '%s' (try: baton quantize --help)\n", a);
            return 2;
        } else if (npos < 3) {
            pos[npos++] = a;
        } else {
            fprintf(stderr, "baton quantize: unexpected argument '%s' (IN OUT TYPE expected)\n", a);
            return 2;
        }
    }
    if (npos != 3) {
        fprintf(stderr, "baton quantize: IN, OUT and TYPE are required\n");
        usage(stderr);
        return 2;
    }
    if (o->nth < 1) o->nth = 1;
    if (o->nth > 64) o->nth = 64;
    o->in = pos[0];
    o->out = pos[1];
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++)
        if (!strcasecmp(pos[2], mixes[i].name)) o->mix = &mixes[i];
    for (size_t i = 0; i < sizeof imatrix_types / sizeof imatrix_types[0] && !o->mix; i++) {
        if (strcasecmp(pos[2], imatrix_types[i])) continue;
        fprintf(stderr,
                "baton quantize: TYPE %s needs an importance matrix (llama.cpp's imatrix), which baton quantize "
                "does not read; without one: IQ4_XS, IQ4_NL or a K-quant mix\n",
                imatrix_types[i]);
        return 2;
    }
    if (!o->mix) {
        fprintf(stderr,
                "baton quantize: unknown TYPE '%s' (one of Q8_0 Q4_0 Q6_K Q4_K_M Q5_K_M Q4_K Q5_K IQ4_NL IQ4_XS "
                "MXFP4_MOE MXFP4)\n",
                pos[2]);
        return 2;
    }
    if (!o->in[0] || !o->out[0]) {
        fprintf(stderr, "baton quantize: %s: the file name is empty\n", o->in[0] ? "OUT" : "IN");
        return 2;
    }
    return 0;
}

/* the model's layer and expert counts, for the mixes; 0 or 1 (said) */
static int read_model_info(struct bt_gguf *g, const char *in, struct model_info *mi) {
    *mi = (struct model_info){bt_gguf_n_layers(g), 0, 0, 0};
    struct bt_gguf_str arch;
    if (bt_gguf_get_str(g, "general.architecture", &arch) == BT_OK && arch.n < 200) {
        char key[256];
        const char *what[4] = {"block_count", "expert_count", "attention.head_count", "attention.head_count_kv"};
        int *dst[4] = {&mi->n_layer, &mi->n_expert, &mi->n_head, &mi->n_head_kv};
        for (int k = 0; k < 4; k++) {
            snprintf(key, sizeof key, "%.*s.%s", (int)arch.n, arch.data, what[k]);
            const int64_t ki = bt_gguf_find_key(g, key);
            if (ki < 0) continue;
            const struct bt_gguf_value *v = bt_gguf_kv_value(g, ki);
            if (k >= 2 && v->type == BT_GGUF_TYPE_ARRAY) continue; /* per-layer head counts: no GQA rule */
            if (v->type > BT_GGUF_TYPE_INT32 && v->type != BT_GGUF_TYPE_UINT64 && v->type != BT_GGUF_TYPE_INT64) {
                fprintf(stderr, "baton quantize: %s: key \"%s\" is %s, not an integer\n", in, key,
                        bt_gguf_type_name(v->type));
                return 1;
            }
            const int64_t x = bt_gguf_value_i64(g, v);
            if (x < 0 || x > 1000000) {
                fprintf(stderr, "baton quantize: %s: key \"%s\" = %lld is out of range\n", in, key, (long long)x);
                return 1;
            }
            *dst[k] = (int)x;
        }
    }
    return 0;
}

/* the header: every key but the two this rewrites, then the tensor table; 0 or 1 */
static int write_header(struct bt_gguf_writer *w, struct bt_gguf *g, const struct qmix *mix,
                        const enum bt_type *types) {
    int rc = 0;
    for (int64_t i = 0; i < bt_gguf_n_kv(g) && !rc; i++) {
        const char *key = bt_gguf_kv_key(g, i);
        if (!strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version")) continue;
        if (bt_gguf_writer_set_value(w, key, g, bt_gguf_kv_value(g, i)) != BT_OK) rc = 1;
    }
    if (!rc && (bt_gguf_writer_set_u32(w, "general.quantization_version", 2) != BT_OK ||
                bt_gguf_writer_set_u32(w, "general.file_type", (uint32_t)mix->ftype) != BT_OK))
        rc = 1;
    for (int64_t i = 0; i < bt_gguf_n_tensors(g) && !rc; i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        const uint32_t gt = types[i] == BT_TYPE_COUNT ? t->ggml_type : bt_ggml_type_from_bt(types[i]);
        if (bt_gguf_writer_add_tensor(w, t->name, gt, t->n_dims, t->ne, NULL) != BT_OK) rc = 1;
    }
    return rc;
}

/* the data, one tensor at a time; 0 or 1 (said unless the writer's error) */
static int write_data(struct bt_gguf_writer *w, struct bt_gguf *g, const struct quant_opts *o,
                      const enum bt_type *types, uint64_t *bytes_in, uint64_t *bytes_out) {
    const int64_t n = bt_gguf_n_tensors(g);
    const long nth = o->nth;
    const char *in = o->in;
    char err[1024];
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        const uint8_t *src = bt_gguf_tensor_data(g, t);
        char shape[128];
        shape_str(t, shape, sizeof shape);
        *bytes_in += t->size;
        if (types[i] == BT_TYPE_COUNT) {
            if (bt_gguf_writer_write_data(w, src, t->size) != BT_OK) rc = 1;
            *bytes_out += t->size;
            fprintf(stderr, "[%*lld/%lld] %-40s %-20s %-5s copied\n", (int)snprintf(NULL, 0, "%lld", (long long)n),
                    (long long)i + 1, (long long)n, t->name, shape, ggml_name(t->ggml_type));
            continue;
        }
        int64_t nrows = 1;
        for (int d = 1; d < t->n_dims; d++) nrows *= t->ne[d];
        struct conv_job job = {
            .src = src, .src_type = t->type, .dst_type = types[i], .ne0 = t->ne[0], .nrows = nrows,
            .src_row = bt_row_size(t->type, t->ne[0]), .dst_row = bt_row_size(types[i], t->ne[0]),
            .nth = (int)(nrows < nth ? (nrows > 0 ? nrows : 1) : nth),
        };
        const size_t out_size = job.dst_row * (size_t)nrows;
        job.dst = malloc(out_size ? out_size : 1);
        if (!job.dst) {
            fprintf(stderr, "baton quantize: %s: tensor \"%s\": out of memory for %zu bytes\n", in, t->name,
                    out_size);
            rc = 1;
            break;
        }
        if (convert(&job, in, t->name, err, sizeof err)) {
            fprintf(stderr, "baton quantize: %s\n", err);
            rc = 1;
        } else if (bt_gguf_writer_write_data(w, job.dst, out_size) != BT_OK) {
            rc = 1;
        }
        free(job.dst);
        *bytes_out += out_size;
        if (!rc)
            fprintf(stderr, "[%*lld/%lld] %-40s %-20s %-5s -> %-5s %8.2f MiB -> %8.2f MiB\n",
                    (int)snprintf(NULL, 0, "%lld", (long long)n), (long long)i + 1, (long long)n, t->name, shape,
                    ggml_name(t->ggml_type), ggml_name(bt_ggml_type_from_bt(types[i])), t->size / 1048576.0,
                    out_size / 1048576.0);
    }
    return rc;
}

int bt_cli_quantize(int argc, char **argv) {
    struct quant_opts o = {0};
    bool done = false;
    int rc = parse_quantize(argc, argv, &o, &done);
    if (rc || done) return rc;
    const char *in = o.in, *out_path = o.out;
    char err[1024];
    /* an OUT that cannot be written (a directory, no such folder) is found
     * before the work, not at the rename after it */
    if (!o.dry && bt_outfile_check(out_path, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton quantize: %s\n", err);
        return 1;
    }
    struct bt_gguf *g = NULL;
    if (bt_gguf_open(in, &g, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton quantize: %s\n", err);
        return 1;
    }
    struct model_info mi;
    if (read_model_info(g, in, &mi)) {
        bt_gguf_close(g);
        return 1;
    }
    const int64_t n = bt_gguf_n_tensors(g);
    enum bt_type *types = calloc((size_t)(n > 0 ? n : 1), sizeof *types);
    if (!types) {
        fprintf(stderr, "baton quantize: out of memory\n");
        bt_gguf_close(g);
        return 1;
    }
    plan_tensor_types(g, o.mix, o.pure, &mi, types);
    /* the plan's tensors must be of a type this converts from */
    for (int64_t i = 0; i < n; i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        if (types[i] == BT_TYPE_COUNT) continue;
        if (t->type != BT_TYPE_F32 && t->type != BT_TYPE_F16 && t->type != BT_TYPE_BF16) {
            fprintf(stderr,
                    "baton quantize: %s: tensor \"%s\" is %s: only F32, F16 and BF16 tensors are quantised\n", in,
                    t->name, ggml_name(t->ggml_type));
            free(types);
            bt_gguf_close(g);
            return 1;
        }
    }
    if (o.dry) {
        for (int64_t i = 0; i < n; i++) {
            const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
            char shape[128];
            shape_str(t, shape, sizeof shape);
            printf("%-40s %-20s %-5s -> %s\n", t->name, shape, ggml_name(t->ggml_type),
                   types[i] == BT_TYPE_COUNT ? ggml_name(t->ggml_type) : ggml_name(bt_ggml_type_from_bt(types[i])));
        }
        free(types);
        bt_gguf_close(g);
        return 0;
    }

    /* header: every key but the two this rewrites, then the tensor table */
    struct bt_gguf_writer *w = NULL;
    if (bt_gguf_writer_open(out_path, &w, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton quantize: %s\n", err);
        free(types);
        bt_gguf_close(g);
        return 1;
    }
    rc = write_header(w, g, o.mix, types);
    if (rc) {
        fprintf(stderr, "baton quantize: %s\n", bt_gguf_writer_error(w));
        bt_gguf_writer_close(w);
        free(types);
        bt_gguf_close(g);
        return 1;
    }

    const double t0 = bt_now_s();
    uint64_t bytes_in = 0, bytes_out = 0;
    rc = write_data(w, g, &o, types, &bytes_in, &bytes_out);
    if (rc) {
        if (bt_gguf_writer_error(w)[0]) fprintf(stderr, "baton quantize: %s\n", bt_gguf_writer_error(w));
        bt_gguf_writer_close(w);
        fprintf(stderr, "baton quantize: %s not written\n", out_path);
        free(types);
        bt_gguf_close(g);
        return 1;
    }
    if (bt_gguf_writer_finish(w, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton quantize: %s\n", err);
        free(types);
        bt_gguf_close(g);
        return 1;
    }
    fprintf(stderr, "baton quantize: %s (%.2f MiB) -> %s (%.2f MiB, %s) in %.1f s with %ld threads\n", in,
            bytes_in / 1048576.0, out_path, bytes_out / 1048576.0, o.mix->name, bt_now_s() - t0, o.nth);
    free(types);
    bt_gguf_close(g);
    return 0;
}
