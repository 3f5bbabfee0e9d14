/* make_model.c - `baton make-model OUT.gguf --vocab FILE`: a small model of one
 * of the supported architectures (src/model/arch.h) with random weights and a
 * real vocabulary, as a GGUF file any GGUF reader (llama.cpp's included) can
 * open.  What the main job runs when no model is given: the text is nonsense,
 * but every path of a real model (tokenizer, layers, MoE routing, KV cache,
 * sampling, the pipeline over ranks) is taken.
 *
 * The tensors are the ones the architecture expects (bt_arch_tensors, the list
 * the loader checks against), the vocabulary's tokenizer.* keys are copied
 * as they are, and the weights come from a seed: the same options give the
 * same bytes. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "gguf.h"
#include "model/arch_impl.h"
#include "outfile.h"
#include "text/sampler.h"

#define MM_PROG "baton make-model"

struct mm_opts {
    const char *out, *vocab, *arch;
    long layers, embd, heads, heads_kv, head_dim, ff, experts, experts_used, ff_exp, ctx;
    enum bt_type type;
    uint64_t seed;
};

static void mm_usage(FILE *f, const struct mm_opts *o) {
    fprintf(f,
            "usage: baton make-model OUT.gguf --vocab FILE [options]\n"
            "\n"
            "Writes a small model with random weights (from --seed) and the vocabulary of\n"
            "FILE (a GGUF file's tokenizer.* keys, e.g. tests/data/vocab/ggml-vocab-gpt-2.gguf)\n"
            "to OUT.gguf.  It generates nonsense, through every path a real model takes.\n"
            "\n"
            "      --vocab FILE        the vocabulary (required)\n"
            "      --arch A            %s (default %s)\n"
            "      --layers N          (default %ld)\n"
            "      --embd N            embedding length (default %ld)\n"
            "      --heads N           attention heads (default %ld)\n"
            "      --heads-kv N        key/value heads (default %ld)\n"
            "      --head-dim N        (default %ld)\n"
            "      --ff N              dense feed-forward length (default %ld)\n"
            "      --experts N         MoE experts, 0: dense (llama only; default %ld)\n"
            "      --experts-used K    experts per token (default %ld)\n"
            "      --ff-exp N          an expert's feed-forward length (default %ld)\n"
            "      --ctx N             context_length written to the file (default %ld)\n"
            "      --type T            matrices: f32, f16 or q8_0 (default %s)\n"
            "      --seed N            (default %llu)\n"
            "  -h, --help              this text\n",
            bt_arch_names(), o->arch, o->layers, o->embd, o->heads, o->heads_kv, o->head_dim, o->ff, o->experts,
            o->experts_used, o->ff_exp, o->ctx, bt_type_name(o->type), (unsigned long long)o->seed);
}

/* GGUF's numbers for the types written */
static uint32_t gguf_type_of(enum bt_type t) { return t == BT_TYPE_F16 ? 1u : t == BT_TYPE_Q8_0 ? 8u : 0u; }

/* a tensor's random stream: the seed and its name */
static void tensor_rng(bt_rng *r, uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    bt_rng_seed(r, seed ^ h);
}

/* The values of one tensor, as the tests' numpy models make them: embeddings
 * in [-1, 1), matrices scaled by 1.7 / sqrt(inputs), the router by 4 more,
 * norms around 1, biases around 0. */
static void fill(const struct bt_arch_tensor *e, uint64_t seed, float *v, int64_t n) {
    bt_rng r;
    tensor_rng(&r, seed, e->name);
    const bool norm = strstr(e->name, "norm") != NULL, bias = strstr(e->name, ".bias") != NULL;
    double scale = 1.7 / sqrt((double)e->ne[0]), around = 0;
    if (!strcmp(e->name, "token_embd.weight")) scale = 1.0;
    else if (norm) scale = 0.25, around = 1.0;
    else if (bias) scale = 0.5;
    else if (strstr(e->name, "ffn_gate_inp.weight")) scale *= 4;
    for (int64_t i = 0; i < n; i++) v[i] = (float)(around + scale * (2 * bt_rng_uniform(&r) - 1));
}

static int parse_mm(int argc, char **argv, struct mm_opts *o, char *err, size_t errn) {
    enum { O_VOCAB = 1000, O_ARCH, O_LAYERS, O_EMBD, O_HEADS, O_HEADS_KV, O_HEAD_DIM, O_FF, O_EXPERTS, O_USED,
           O_FF_EXP, O_CTX, O_TYPE, O_SEED };
    static const struct option longs[] = {
        {"vocab", required_argument, 0, O_VOCAB},       {"arch", required_argument, 0, O_ARCH},
        {"layers", required_argument, 0, O_LAYERS},     {"embd", required_argument, 0, O_EMBD},
        {"heads", required_argument, 0, O_HEADS},       {"heads-kv", required_argument, 0, O_HEADS_KV},
        {"head-dim", required_argument, 0, O_HEAD_DIM}, {"ff", required_argument, 0, O_FF},
        {"experts", required_argument, 0, O_EXPERTS},   {"experts-used", required_argument, 0, O_USED},
        {"ff-exp", required_argument, 0, O_FF_EXP},     {"ctx", required_argument, 0, O_CTX},
        {"type", required_argument, 0, O_TYPE},         {"seed", required_argument, 0, O_SEED},
        {"help", no_argument, 0, 'h'},                  {0, 0, 0, 0},
    };
    struct {
        int code;
        const char *name;
        long *dst;
        long lo, hi;
    } ints[] = {
        {O_LAYERS, "--layers", &o->layers, 1, 512},       {O_EMBD, "--embd", &o->embd, 32, 16384},
        {O_HEADS, "--heads", &o->heads, 1, 256},          {O_HEADS_KV, "--heads-kv", &o->heads_kv, 1, 256},
        {O_HEAD_DIM, "--head-dim", &o->head_dim, 2, 1024}, {O_FF, "--ff", &o->ff, 1, 65536},
        {O_EXPERTS, "--experts", &o->experts, 0, 256},    {O_USED, "--experts-used", &o->experts_used, 1, 256},
        {O_FF_EXP, "--ff-exp", &o->ff_exp, 1, 65536},     {O_CTX, "--ctx", &o->ctx, 1, 1L << 24},
    };
    opterr = 0;
    optind = 1;
    int code;
    while ((code = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        err[0] = '\0';
        bool done = false;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            if (ints[i].code == code) {
                if (!bt_cli_parse_int(optarg, ints[i].lo, ints[i].hi, ints[i].dst))
                    snprintf(err, errn, "%s: '%s' is not an integer in [%ld, %ld]", ints[i].name, optarg, ints[i].lo,
                             ints[i].hi);
                done = true;
            }
        if (!done) switch (code) {
            case O_VOCAB:
                bt_cli_file_arg("--vocab", optarg, &o->vocab, err, errn);
                break;
            case O_ARCH:
                if (!bt_arch_find(optarg)) snprintf(err, errn, "--arch: '%s' is not one of %s", optarg, bt_arch_names());
                else o->arch = optarg;
                break;
            case O_TYPE:
                if (!strcmp(optarg, "f32")) o->type = BT_TYPE_F32;
                else if (!strcmp(optarg, "f16")) o->type = BT_TYPE_F16;
                else if (!strcmp(optarg, "q8_0")) o->type = BT_TYPE_Q8_0;
                else snprintf(err, errn, "--type: '%s' is not f32, f16 or q8_0", optarg);
                break;
            case O_SEED:
                if (!bt_cli_parse_u64(optarg, &o->seed)) snprintf(err, errn, "--seed: '%s' is not a non-negative integer", optarg);
                break;
            case 'h': return 0;
            case ':': snprintf(err, errn, "%s needs a value", argv[optind - 1]); break;
            default: snprintf(err, errn, "unknown option %s", argv[optind - 1]); break;
            }
        if (err[0]) {
            strncat(err, " (try: baton make-model --help)", errn - strlen(err) - 1);
            return 2;
        }
    }
    if (optind + 1 != argc) {
        snprintf(err, errn, "%s (try: baton make-model --help)",
                 optind >= argc ? "missing OUT.gguf" : "give one output file");
        return 2;
    }
    o->out = argv[optind];
    if (!o->out[0]) {
        snprintf(err, errn, "OUT.gguf: the file name is empty (try: baton make-model --help)");
        return 2;
    }
    if (!o->vocab) {
        snprintf(err, errn, "missing --vocab FILE (try: baton make-model --help)");
        return 2;
    }
    const struct bt_arch *a = bt_arch_find(o->arch);
    if (o->heads % o->heads_kv) {
        snprintf(err, errn, "--heads %ld is not a multiple of --heads-kv %ld", o->heads, o->heads_kv);
        return 2;
    }
    if (o->head_dim % 2) {
        snprintf(err, errn, "--head-dim %ld: must be even (rotary pairs)", o->head_dim);
        return 2;
    }
    if (a->moe == 0) o->experts = 0;
    if (a->moe == 1 && o->experts == 0) {
        snprintf(err, errn, "--experts 0: %s is a MoE architecture", o->arch);
        return 2;
    }
    if (o->experts && o->experts_used > o->experts) {
        snprintf(err, errn, "--experts-used %ld is more than --experts %ld", o->experts_used, o->experts);
        return 2;
    }
    if (o->type == BT_TYPE_Q8_0 && (o->embd % 32 || o->ff % 32 || o->ff_exp % 32 || (o->heads * o->head_dim) % 32)) {
        snprintf(err, errn, "--type q8_0: --embd, --ff, --ff-exp and --heads x --head-dim must be multiples of 32");
        return 2;
    }
    return -1;
}

/* The vocabulary file's tokenizer.* keys into w; its token count in *n_vocab. */
static int copy_vocab(struct bt_gguf_writer *w, const char *path, int64_t *n_vocab, char *err, size_t errn) {
    struct bt_gguf *g = NULL;
    if (bt_gguf_open(path, &g, err, errn) != BT_OK) return 1;
    int rc = 0;
    const int64_t it = bt_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (it < 0 || bt_gguf_kv_value(g, it)->type != BT_GGUF_TYPE_ARRAY) {
        snprintf(err, errn, "%s: no vocabulary (the array tokenizer.ggml.tokens is missing)", path);
        rc = 1;
    } else {
        *n_vocab = (int64_t)bt_gguf_kv_value(g, it)->n;
    }
    for (int64_t i = 0; !rc && i < bt_gguf_n_kv(g); i++) {
        const char *k = bt_gguf_kv_key(g, i);
        if (strncmp(k, "tokenizer.", 10) != 0) continue;
        if (bt_gguf_writer_set_value(w, k, g, bt_gguf_kv_value(g, i)) != BT_OK) {
            snprintf(err, errn, "%s", bt_gguf_writer_error(w));
            rc = 1;
        }
    }
    bt_gguf_close(g);
    return rc;
}

int bt_cli_make_model(int argc, char **argv) {
    struct mm_opts o = {
        .arch = "qwen3moe", .layers = 4, .embd = 128, .heads = 4, .heads_kv = 2, .head_dim = 32, .ff = 256,
        .experts = 8, .experts_used = 2, .ff_exp = 64, .ctx = 4096, .type = BT_TYPE_F32, .seed = 42,
    };
    char err[1024] = "";
    const int prc = parse_mm(argc, argv, &o, err, sizeof err);
    if (prc == 0) {
        mm_usage(stdout, &o);
        return 0;
    }
    if (prc > 0) {
        fprintf(stderr, MM_PROG ": %s\n", err);
        return prc;
    }
    /* an OUT that cannot be written (a directory, no such folder) is found
     * before the work, not at the rename after it */
    if (bt_outfile_check(o.out, err, sizeof err) != BT_OK) {
        fprintf(stderr, MM_PROG ": %s\n", err);
        return 1;
    }
    const struct bt_arch *a = bt_arch_find(o.arch);
    const bool moe = o.experts > 0;
    struct bt_hparams h = {
        .n_layer = (int)o.layers, .n_embd = o.embd, .n_head = o.heads, .n_head_kv = o.heads_kv,
        .head_dim = o.head_dim, .head_dim_v = o.head_dim, .n_ff = moe ? 0 : o.ff,
        .n_expert = o.experts, .n_expert_used = moe ? o.experts_used : 0, .n_ff_exp = o.ff_exp,
        .n_ff_shexp = o.ff, .tied_output = true,
    };
    struct bt_gguf_writer *w = NULL;
    struct bt_arch_tensor *tt = NULL;
    struct bt_llm_layer *layers = NULL;
    void **data = NULL;
    int n_t = 0, rc = 1;
    if (bt_gguf_writer_open(o.out, &w, err, sizeof err) != BT_OK) goto out;
    if (copy_vocab(w, o.vocab, &h.n_vocab, err, sizeof err)) goto out;

    char key[128];
#define SET_U32(what, v) (snprintf(key, sizeof key, "%s." what, o.arch), bt_gguf_writer_set_u32(w, key, (uint32_t)(v)))
    enum bt_status st = bt_gguf_writer_set_str(w, "general.architecture", o.arch);
    if (st == BT_OK) st = bt_gguf_writer_set_str(w, "general.name", "baton random-weight model");
    if (st == BT_OK) st = SET_U32("block_count", h.n_layer);
    if (st == BT_OK) st = SET_U32("context_length", o.ctx);
    if (st == BT_OK) st = SET_U32("embedding_length", h.n_embd);
    if (st == BT_OK) st = SET_U32("attention.head_count", h.n_head);
    if (st == BT_OK) st = SET_U32("attention.head_count_kv", h.n_head_kv);
    if (st == BT_OK) st = SET_U32("attention.key_length", h.head_dim);
    if (st == BT_OK) st = SET_U32("attention.value_length", h.head_dim);
    if (st == BT_OK) st = SET_U32("rope.dimension_count", h.head_dim);
    if (st == BT_OK) st = SET_U32("feed_forward_length", o.ff);
    if (st == BT_OK && moe) st = SET_U32("expert_count", h.n_expert);
    if (st == BT_OK && moe) st = SET_U32("expert_used_count", h.n_expert_used);
    if (st == BT_OK && moe) st = SET_U32("expert_feed_forward_length", h.n_ff_exp);
    if (st == BT_OK && moe && a->shared_expert) st = SET_U32("expert_shared_feed_forward_length", h.n_ff_shexp);
#undef SET_U32
    snprintf(key, sizeof key, "%s.rope.freq_base", o.arch);
    if (st == BT_OK) st = bt_gguf_writer_set_f32(w, key, 10000.0f);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", o.arch);
    if (st == BT_OK) st = bt_gguf_writer_set_f32(w, key, 1e-6f);
    if (st != BT_OK) {
        snprintf(err, sizeof err, "%s", bt_gguf_writer_error(w));
        goto out;
    }

    /* the tensors the loader expects, with q/k/v biases for the qwen2 family */
    const bool biases = strncmp(o.arch, "qwen2", 5) == 0;
    struct bt_llm_globals gl;
    tt = calloc((size_t)bt_arch_max_tensors(&h), sizeof *tt);
    layers = calloc((size_t)h.n_layer, sizeof *layers);
    data = calloc((size_t)bt_arch_max_tensors(&h), sizeof *data);
    if (!tt || !layers || !data) {
        snprintf(err, sizeof err, "out of memory");
        goto out;
    }
    const int n_all = bt_arch_tensors(a, &h, &gl, layers, tt);
    for (int i = 0; i < n_all; i++) {
        const struct bt_arch_tensor *e = &tt[i];
        if (!e->required && !(biases && strstr(e->name, ".bias"))) continue;
        const int64_t n = e->ne[0] * e->ne[1] * e->ne[2] * e->ne[3];
        const bool mat = !e->vector && !strstr(e->name, "ffn_gate_inp");
        const enum bt_type ty = mat ? o.type : BT_TYPE_F32;
        float *v = malloc((size_t)n * sizeof *v);
        const size_t bytes = bt_row_size(ty, n);
        void *d = ty == BT_TYPE_F32 ? (void *)v : malloc(bytes);
        if (!v || !d) {
            free(v);
            snprintf(err, sizeof err, "out of memory for %s", e->name);
            goto out;
        }
        fill(e, o.seed, v, n);
        if (ty != BT_TYPE_F32) bt_type_traits(ty)->from_float(v, d, n);
        if (d != v) free(v);
        data[n_t++] = d;
        int nd = 4;
        while (nd > 1 && e->ne[nd - 1] == 1) nd--;
        if (bt_gguf_writer_add_tensor(w, e->name, gguf_type_of(ty), nd, e->ne, d) != BT_OK) {
            snprintf(err, sizeof err, "%s", bt_gguf_writer_error(w));
            goto out;
        }
    }
    st = bt_gguf_writer_finish(w, err, sizeof err);
    w = NULL;
    if (st != BT_OK) goto out;
    rc = 0;
out:
    if (rc) fprintf(stderr, MM_PROG ": %s\n", err);
    bt_gguf_writer_close(w);
    for (int i = 0; i < n_t; i++) free(data[i]);
    free(data);
    free(tt);
    free(layers);
    return rc;
}
