/* synth_model.c - the scheduler tests' synthetic transformer with MoE FFN
 * layers: config checks, weight metadata and deterministic data, the forward
 * graph of one micro-batch, inputs, and per-layer cost figures.  See
 * synth_model.h for the structure, the names and the layer-number
 * convention. */
#include "synth_model.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "baton/backend.h"
#include "model/ffn.h"

/* ---- FFN kind names ---------------------------------------------------------- */

static const char *const ffn_names[BT_FFN_COUNT] = {
    [BT_FFN_MLP] = "mlp",
    [BT_FFN_MOE_DENSE] = "moe-dense",
    [BT_FFN_MOE_TOPK] = "moe-topk",
    [BT_FFN_MOE_SHARED] = "moe-shared",
};

const char *bt_ffn_kind_name(enum bt_ffn_kind k) {
    return (k >= 0 && k < BT_FFN_COUNT) ? ffn_names[k] : "?";
}

int bt_ffn_kind_from_name(const char *name, enum bt_ffn_kind *k) {
    for (int i = 0; i < BT_FFN_COUNT; i++) {
        if (name && strcmp(name, ffn_names[i]) == 0) {
            *k = (enum bt_ffn_kind)i;
            return BT_OK;
        }
    }
    return BT_ERR_INVALID;
}

/* ---- config ----------------------------------------------------------------- */

void bt_model_config_default(struct bt_model_config *c) {
    memset(c, 0, sizeof *c);
    c->n_layers = 4;
    c->d_model = 64;
    c->n_heads = 4;
    c->d_ff = 128;
    c->n_experts = 8;
    c->top_k = 2;
    c->n_shared = 1;
    c->ffn = BT_FFN_MOE_TOPK;
    c->shared_gate = 1;
    c->norm_topk = 1;
    c->n_vocab = 256;
    c->n_tokens = 16;
    c->wtype = BT_TYPE_F32;
    c->rope_base = 10000.0f;
    c->norm_eps = 1e-5f;
    c->seed = 42;
}

/* the limits are in model.h (the command line's option table uses them) */
#define MAX_LAYERS BT_MODEL_MAX_LAYERS
#define MAX_D_MODEL BT_MODEL_MAX_D_MODEL
#define MAX_D_FF BT_MODEL_MAX_D_FF
#define MAX_EXPERTS BT_MODEL_MAX_EXPERTS
#define MAX_SHARED BT_MODEL_MAX_SHARED
#define MAX_VOCAB BT_MODEL_MAX_VOCAB
#define MAX_TOKENS BT_MODEL_MAX_TOKENS

static int check_range(const char *field, int v, int lo, int hi, char *err, size_t n) {
    if (v < lo || v > hi) {
        if (lo == 1 && v < 1) return bt_error_printf(err, n, BT_ERR_INVALID, "%s = %d: must be positive", field, v);
        if (lo == 0 && v < 0) return bt_error_printf(err, n, BT_ERR_INVALID, "%s = %d: must not be negative", field, v);
        return bt_error_printf(err, n, BT_ERR_INVALID, "%s = %d: must be in [%d, %d]", field, v, lo, hi);
    }
    return BT_OK;
}

int bt_model_config_check(const struct bt_model_config *c, char *err, size_t n) {
    if (err && n > 0) err[0] = '\0';
    if (!c) return bt_error_printf(err, n, BT_ERR_INVALID, "no config");
#define RANGE(f, lo, hi)                                                   \
    do {                                                                   \
        if (check_range(#f, c->f, (lo), (hi), err, n) != BT_OK) return BT_ERR_INVALID; \
    } while (0)
    RANGE(n_layers, 1, MAX_LAYERS);
    RANGE(d_model, 1, MAX_D_MODEL);
    RANGE(n_heads, 1, MAX_D_MODEL);
    if (c->d_model % c->n_heads != 0)
        return bt_error_printf(err, n, BT_ERR_INVALID, "n_heads = %d: d_model = %d is not a multiple of it", c->n_heads, c->d_model);
    if ((c->d_model / c->n_heads) % 2 != 0)
        return bt_error_printf(err, n, BT_ERR_INVALID, "n_heads = %d: head_dim = d_model / n_heads = %d must be even (rope)",
                    c->n_heads, c->d_model / c->n_heads);
    RANGE(d_ff, 1, MAX_D_FF);
    if ((int)c->ffn < 0 || c->ffn >= BT_FFN_COUNT)
        return bt_error_printf(err, n, BT_ERR_INVALID, "ffn = %d: unknown FFN kind (mlp, moe-dense, moe-topk, moe-shared)", (int)c->ffn);
    const bool moe = c->ffn != BT_FFN_MLP;
    const bool topk = c->ffn == BT_FFN_MOE_TOPK || c->ffn == BT_FFN_MOE_SHARED;
    RANGE(n_experts, moe ? 1 : 0, MAX_EXPERTS);
    if (topk) {
        if (c->top_k < 1) return bt_error_printf(err, n, BT_ERR_INVALID, "top_k = %d: must be positive", c->top_k);
        if (c->top_k > c->n_experts)
            return bt_error_printf(err, n, BT_ERR_INVALID, "top_k = %d: must not exceed n_experts = %d", c->top_k, c->n_experts);
    } else {
        RANGE(top_k, 0, MAX_EXPERTS);
    }
    RANGE(n_shared, c->ffn == BT_FFN_MOE_SHARED ? 1 : 0, MAX_SHARED);
    if (c->shared_gate != 0 && c->shared_gate != 1)
        return bt_error_printf(err, n, BT_ERR_INVALID, "shared_gate = %d: must be 0 or 1", c->shared_gate);
    if (c->norm_topk != 0 && c->norm_topk != 1)
        return bt_error_printf(err, n, BT_ERR_INVALID, "norm_topk = %d: must be 0 or 1", c->norm_topk);
    RANGE(n_vocab, 1, MAX_VOCAB);
    RANGE(n_tokens, 1, MAX_TOKENS);
    switch (c->wtype) {
    case BT_TYPE_F32:
    case BT_TYPE_F16:
    case BT_TYPE_BF16:
    case BT_TYPE_Q8_0:
    case BT_TYPE_Q4_0: break;
    default:
        return bt_error_printf(err, n, BT_ERR_INVALID, "wtype = %d (%s): weights must be f32, f16, bf16, q8_0 or q4_0", (int)c->wtype,
                    ((int)c->wtype >= 0 && c->wtype < BT_TYPE_COUNT) ? bt_type_name(c->wtype) : "unknown");
    }
    const int64_t blck = bt_blck_size(c->wtype);
    if (c->d_model % blck != 0)
        return bt_error_printf(err, n, BT_ERR_INVALID, "d_model = %d: wtype %s needs a multiple of %lld (its block size)", c->d_model,
                    bt_type_name(c->wtype), (long long)blck);
    if (c->d_ff % blck != 0)
        return bt_error_printf(err, n, BT_ERR_INVALID, "d_ff = %d: wtype %s needs a multiple of %lld (its block size)", c->d_ff,
                    bt_type_name(c->wtype), (long long)blck);
    if (!(c->rope_base > 0.0f) || !isfinite(c->rope_base))
        return bt_error_printf(err, n, BT_ERR_INVALID, "rope_base = %g: must be positive and finite", (double)c->rope_base);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        return bt_error_printf(err, n, BT_ERR_INVALID, "norm_eps = %g: must be positive and finite", (double)c->norm_eps);
#undef RANGE
    return BT_OK;
}

/* experts a token uses */
static int n_used(const struct bt_model_config *c) {
    switch (c->ffn) {
    case BT_FFN_MOE_DENSE: return c->n_experts;
    case BT_FFN_MOE_TOPK:
    case BT_FFN_MOE_SHARED: return c->top_k;
    default: return 0;
    }
}

/* ---- weights ---------------------------------------------------------------- */

#define WEIGHTS_PER_LAYER 17 /* upper bound: fields of bt_model_layer_weights */

static struct bt_tensor *new_weight(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                                    int il, const char *what) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    const int n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    struct bt_tensor *t = bt_new_tensor(ctx, type, n_dims, ne);
    if (!t) return NULL;
    if (il >= 0)
        bt_format_name(t, "blk.%d.%s", il, what);
    else
        bt_set_name(t, what);
    bt_set_weight(t);
    return t;
}

int bt_model_layer_weights_new(bt_context *ctx, const struct bt_model_config *c, int il,
                               struct bt_model_layer_weights *w) {
    BT_ASSERT(bt_model_config_check(c, NULL, 0) == BT_OK);
    BT_ASSERT(il >= 0 && il < c->n_layers);
    memset(w, 0, sizeof *w);
    const enum bt_type wt = c->wtype;
    const int64_t d = c->d_model, ff = c->d_ff, E = c->n_experts;
    bool ok = true;
#define W(field, type, ne0, ne1, ne2, what) \
    ok = ok && (w->field = new_weight(ctx, (type), (ne0), (ne1), (ne2), il, (what))) != NULL
    W(attn_norm, BT_TYPE_F32, d, 1, 1, "attn_norm");
    W(wq, wt, d, d, 1, "attn_q");
    W(wk, wt, d, d, 1, "attn_k");
    W(wv, wt, d, d, 1, "attn_v");
    W(wo, wt, d, d, 1, "attn_output");
    W(ffn_norm, BT_TYPE_F32, d, 1, 1, "ffn_norm");
    if (c->ffn == BT_FFN_MLP) {
        W(ffn_gate, wt, d, ff, 1, "ffn_gate");
        W(ffn_up, wt, d, ff, 1, "ffn_up");
        W(ffn_down, wt, ff, d, 1, "ffn_down");
    } else {
        W(ffn_gate_inp, BT_TYPE_F32, d, E, 1, "ffn_gate_inp");
        W(ffn_gate_exps, wt, d, ff, E, "ffn_gate_exps");
        W(ffn_up_exps, wt, d, ff, E, "ffn_up_exps");
        W(ffn_down_exps, wt, ff, d, E, "ffn_down_exps");
    }
    if (c->ffn == BT_FFN_MOE_SHARED) {
        const int64_t sff = (int64_t)c->n_shared * ff;
        W(ffn_gate_shexp, wt, d, sff, 1, "ffn_gate_shexp");
        W(ffn_up_shexp, wt, d, sff, 1, "ffn_up_shexp");
        W(ffn_down_shexp, wt, sff, d, 1, "ffn_down_shexp");
        if (c->shared_gate) W(ffn_gate_inp_shexp, BT_TYPE_F32, d, 1, 1, "ffn_gate_inp_shexp");
    }
#undef W
    return ok ? BT_OK : BT_ERR_NOMEM;
}

struct bt_model {
    struct bt_model_config cfg;
    bt_context *ctx; /* no_alloc: the weights' metadata */
    struct bt_tensor *token_embd, *output_norm, *output;
    struct bt_model_layer_weights *layers;
    int n_weights;
    struct bt_tensor **weights; /* every weight, in creation order */
};

enum bt_status bt_model_new(const struct bt_model_config *c, struct bt_model **out, char *err, size_t n_err) {
    BT_ASSERT(out);
    *out = NULL;
    if (err && n_err > 0) err[0] = '\0';
    enum bt_status st = (enum bt_status)bt_model_config_check(c, err, n_err);
    if (st != BT_OK) return st;
    struct bt_model *m = calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->cfg = *c;
    const int max_weights = c->n_layers * WEIGHTS_PER_LAYER + 3;
    m->ctx = bt_init((struct bt_init_params){
        .mem_size = (size_t)max_weights * bt_tensor_overhead() + 4 * BT_MEM_ALIGN,
        .mem_buffer = NULL,
        .no_alloc = true,
    });
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->ctx || !m->layers) goto nomem;

    const int64_t d = c->d_model, V = c->n_vocab;
    m->token_embd = new_weight(m->ctx, c->wtype, d, V, 1, -1, "token_embd");
    if (!m->token_embd) goto ctxerr;
    for (int il = 0; il < c->n_layers; il++)
        if (bt_model_layer_weights_new(m->ctx, c, il, &m->layers[il]) != BT_OK) goto ctxerr;
    m->output_norm = new_weight(m->ctx, BT_TYPE_F32, d, 1, 1, -1, "output_norm");
    m->output = new_weight(m->ctx, c->wtype, d, V, 1, -1, "output");
    if (!m->output_norm || !m->output) goto ctxerr;

    m->n_weights = bt_context_n_tensors(m->ctx);
    m->weights = malloc((size_t)m->n_weights * sizeof *m->weights);
    if (!m->weights) goto nomem;
    for (int i = 0; i < m->n_weights; i++) m->weights[i] = bt_context_tensor(m->ctx, i);
    *out = m;
    return BT_OK;

ctxerr:
    st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "%s", bt_context_error(m->ctx));
    bt_model_free(m);
    return st;
nomem:
    bt_model_free(m);
    return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
}

void bt_model_free(struct bt_model *m) {
    if (!m) return;
    if (m->ctx) bt_free(m->ctx);
    free(m->layers);
    free(m->weights);
    free(m);
}

const struct bt_model_config *bt_model_get_config(const struct bt_model *m) { return &m->cfg; }
bt_context *bt_model_context(const struct bt_model *m) { return m->ctx; }
int bt_model_n_weights(const struct bt_model *m) { return m->n_weights; }

struct bt_tensor *bt_model_weight(const struct bt_model *m, int i) {
    BT_ASSERT(i >= 0 && i < m->n_weights);
    return m->weights[i];
}

struct bt_tensor *bt_model_weight_by_name(const struct bt_model *m, const char *name) {
    for (int i = 0; i < m->n_weights; i++)
        if (strcmp(m->weights[i]->name, name) == 0) return m->weights[i];
    return NULL;
}

const struct bt_model_layer_weights *bt_model_layer(const struct bt_model *m, int il) {
    BT_ASSERT(il >= 0 && il < m->cfg.n_layers);
    return &m->layers[il];
}

int bt_model_name_layer(const char *name, int n_layers) {
    if (strncmp(name, "blk.", 4) == 0 && isdigit((unsigned char)name[4])) {
        long v = 0;
        const char *p = name + 4;
        while (isdigit((unsigned char)*p) && v <= MAX_LAYERS) v = v * 10 + (*p++ - '0');
        if (*p == '.') return (int)v;
    }
    if (strncmp(name, "output", 6) == 0 || strncmp(name, "result", 6) == 0) return n_layers;
    return -1;
}

int bt_model_tensor_layer(const struct bt_model *m, const struct bt_tensor *t) {
    return bt_model_name_layer(t->name, m->cfg.n_layers);
}

/* ---- deterministic weight data ---------------------------------------------- */

#define GOLDEN 0x9E3779B97F4A7C15ULL

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* element i of the splitmix64 stream that starts at key */
static uint64_t stream_at(uint64_t key, uint64_t i) { return mix64(key + (i + 1) * GOLDEN); }

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return h;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && strcmp(s + ls - lx, suffix) == 0;
}

void bt_model_fill_weight(uint64_t seed, struct bt_tensor *w) {
    BT_ASSERT(w->data != NULL);
    BT_ASSERT(bt_is_contiguous(w));
    const int64_t ne0 = w->ne[0], nrows = bt_nrows(w);
    const size_t row_bytes = bt_row_size(w->type, ne0);
    const uint64_t key = seed ^ fnv1a(w->name);
    const bool norm = ends_with(w->name, "_norm");
    /* Every value is one exact operation on a 24-bit integer, so the bits are
     * the same on every machine and compiler (no contraction, no libm). */
    const float s = strcmp(w->name, "token_embd") == 0 ? 1.0f : 1.0f / sqrtf((float)ne0);
    const float step = s * 0x1p-23f; /* r in [-2^23, 2^23) -> [-s, s) */

    int64_t rows_per_chunk = ne0 >= 65536 ? 1 : 65536 / ne0;
    if (rows_per_chunk > nrows) rows_per_chunk = nrows;
    float *f = malloc((size_t)(rows_per_chunk * ne0) * sizeof *f);
    uint8_t *q = malloc((size_t)rows_per_chunk * row_bytes);
    BT_ASSERT(f != NULL && q != NULL);
    for (int64_t r0 = 0; r0 < nrows; r0 += rows_per_chunk) {
        const int64_t nr = nrows - r0 < rows_per_chunk ? nrows - r0 : rows_per_chunk;
        for (int64_t j = 0; j < nr * ne0; j++) {
            const uint32_t u24 = (uint32_t)(stream_at(key, (uint64_t)(r0 * ne0 + j)) >> 40);
            if (norm)
                f[j] = (float)(int32_t)((1u << 23) - (1u << 20) + (u24 >> 3)) * 0x1p-23f; /* [0.875, 1.125) */
            else
                f[j] = (float)((int32_t)u24 - (1 << 23)) * step;
        }
        for (int64_t r = 0; r < nr; r++) bt_row_from_f32(w->type, f + r * ne0, q + r * row_bytes, ne0);
        bt_tensor_set(w, q, (size_t)r0 * row_bytes, (size_t)nr * row_bytes);
    }
    free(f);
    free(q);
}

void bt_model_init_weight(const struct bt_model *m, struct bt_tensor *w) { bt_model_fill_weight(m->cfg.seed, w); }

void bt_model_init_weights(const struct bt_model *m) {
    for (int i = 0; i < m->n_weights; i++)
        if (m->weights[i]->data) bt_model_fill_weight(m->cfg.seed, m->weights[i]);
}

/* ---- graph builders ---------------------------------------------------------- */

/* name a node of layer il ("blk.<il>.<what>") */
static struct bt_tensor *nm(struct bt_tensor *t, int il, const char *what) {
    if (t) bt_format_name(t, "blk.%d.%s", il, what);
    return t;
}

/* Give every tensor created in ctx since index n0 that does not carry layer
 * il's prefix one ("blk.<il>.<op>" or "blk.<il>.<old name>"): internal
 * tensors of compound constructors (top_k's argsort) and views named after
 * a source from another layer. */
static void name_rest(bt_context *ctx, int n0, int il) {
    char prefix[32];
    const int lp = snprintf(prefix, sizeof prefix, "blk.%d.", il);
    for (int i = n0; i < bt_context_n_tensors(ctx); i++) {
        struct bt_tensor *t = bt_context_tensor(ctx, i);
        if (strncmp(t->name, prefix, (size_t)lp) == 0) continue;
        char what[BT_MAX_NAME];
        if (t->name[0]) {
            snprintf(what, sizeof what, "%s", t->name);
        } else {
            snprintf(what, sizeof what, "%s", bt_op_name(t->op));
            for (char *p = what; *p; p++) *p = (char)tolower((unsigned char)*p);
        }
        bt_format_name(t, "%s%.*s", prefix, (int)(BT_MAX_NAME - 1 - lp), what);
    }
}

int bt_model_moe_route(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *cur,
                       const struct bt_model_layer_weights *w, int il, struct bt_tensor **ids,
                       struct bt_tensor **weights) {
    BT_ASSERT(c->ffn != BT_FFN_MLP);
    *ids = *weights = NULL;
    if (!cur) return BT_ERR_INVALID;
    const int64_t E = c->n_experts, T = cur->ne[1];
    /* router logits [E, T] */
    struct bt_tensor *logits = nm(bt_mul_mat(ctx, w->ffn_gate_inp, cur), il, "ffn_moe_logits");
    struct bt_tensor *id, *wt;
    if (c->ffn == BT_FFN_MOE_DENSE) {
        /* every expert, weighted by softmax(logits); ids in descending order
         * of probability (the order does not change the weighted sum) */
        struct bt_tensor *probs = nm(bt_soft_max(ctx, logits), il, "ffn_moe_probs"); /* [E, T] */
        id = nm(bt_argsort(ctx, probs, BT_SORT_DESC), il, "ffn_moe_ids");             /* [E, T] */
        struct bt_tensor *p3 = nm(bt_reshape_3d(ctx, probs, 1, E, T), il, "ffn_moe_probs_3d");
        wt = nm(bt_get_rows(ctx, p3, id), il, "ffn_moe_weights"); /* [1, E, T] */
    } else if (!c->norm_topk) {
        /* Qwen2-MoE: the full softmax's probabilities of the top K, not
         * renormalised (softmax is monotonic: top-K of the logits picks the
         * same experts, ties included, as top-K of the probabilities) */
        const int64_t K = c->top_k;
        struct bt_tensor *probs = nm(bt_soft_max(ctx, logits), il, "ffn_moe_probs"); /* [E, T] */
        id = nm(bt_top_k(ctx, logits, (int)K), il, "ffn_moe_ids");                   /* [K, T] view of argsort */
        if (id) nm(id->src[0], il, "ffn_moe_argsort");                                /* [E, T], descending */
        struct bt_tensor *p3 = nm(bt_reshape_3d(ctx, probs, 1, E, T), il, "ffn_moe_probs_3d");
        wt = nm(bt_get_rows(ctx, p3, id), il, "ffn_moe_weights"); /* [1, K, T] */
    } else {
        /* the seed's SparseMoE: top-K of the logits, softmax over those K */
        const int64_t K = c->top_k;
        id = nm(bt_top_k(ctx, logits, (int)K), il, "ffn_moe_ids"); /* [K, T] view of argsort */
        if (id) nm(id->src[0], il, "ffn_moe_argsort");              /* [E, T], descending */
        struct bt_tensor *l3 = nm(bt_reshape_3d(ctx, logits, 1, E, T), il, "ffn_moe_logits_3d");
        struct bt_tensor *sel = nm(bt_get_rows(ctx, l3, id), il, "ffn_moe_logits_sel"); /* [1, K, T] */
        struct bt_tensor *sel2 = nm(bt_reshape_2d(ctx, sel, K, T), il, "ffn_moe_logits_sel_2d");
        struct bt_tensor *sm = nm(bt_soft_max(ctx, sel2), il, "ffn_moe_weights_2d"); /* [K, T] */
        wt = nm(bt_reshape_3d(ctx, sm, 1, K, T), il, "ffn_moe_weights");            /* [1, K, T] */
    }
    if (!id || !wt) return BT_ERR_NOMEM;
    *ids = id;
    *weights = wt;
    return BT_OK;
}

struct bt_tensor *bt_model_moe_experts(bt_context *ctx, struct bt_tensor *cur,
                                       const struct bt_model_layer_weights *w, struct bt_tensor *ids,
                                       struct bt_tensor *weights, int il) {
    return bt_ffn_moe_experts(ctx, cur, w->ffn_gate_exps, w->ffn_up_exps, w->ffn_down_exps, ids, weights, il);
}

struct bt_tensor *bt_model_ffn(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *cur,
                               const struct bt_model_layer_weights *w, int il) {
    if (!cur) return NULL;
    const int n0 = bt_context_n_tensors(ctx);
    struct bt_tensor *out;
    if (c->ffn == BT_FFN_MLP) {
        out = bt_ffn_mlp(ctx, cur, w->ffn_gate, w->ffn_up, w->ffn_down, il, "ffn");
    } else {
        struct bt_tensor *ids, *weights;
        if (bt_model_moe_route(ctx, c, cur, w, il, &ids, &weights) != BT_OK) return NULL;
        out = bt_model_moe_experts(ctx, cur, w, ids, weights, il);
        if (c->ffn == BT_FFN_MOE_SHARED) {
            struct bt_tensor *sh =
                bt_ffn_mlp(ctx, cur, w->ffn_gate_shexp, w->ffn_up_shexp, w->ffn_down_shexp, il, "ffn_shexp");
            if (c->shared_gate) {
                struct bt_tensor *gl = nm(bt_mul_mat(ctx, w->ffn_gate_inp_shexp, cur), il, "ffn_shexp_gate_logit");
                struct bt_tensor *gs = nm(bt_sigmoid(ctx, gl), il, "ffn_shexp_gate_sig"); /* [1, T] */
                sh = nm(bt_mul(ctx, sh, gs), il, "ffn_shexp_out");                       /* [d, T] */
            }
            out = nm(bt_add(ctx, out, sh), il, "ffn_moe_shexp_out");
        }
    }
    name_rest(ctx, n0, il);
    return out;
}

/* causal multi-head self-attention; cur [d, T] normalised -> [d, T] */
static struct bt_tensor *attention(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *cur,
                                   const struct bt_model_layer_weights *w, int il, struct bt_tensor *pos,
                                   struct bt_tensor *mask) {
    const int64_t d = c->d_model, H = c->n_heads, hd = d / H, T = cur->ne[1];
    struct bt_tensor *q = nm(bt_mul_mat(ctx, w->wq, cur), il, "attn_q_proj"); /* [d, T] */
    struct bt_tensor *k = nm(bt_mul_mat(ctx, w->wk, cur), il, "attn_k_proj");
    struct bt_tensor *v = nm(bt_mul_mat(ctx, w->wv, cur), il, "attn_v_proj");
    q = nm(bt_reshape_3d(ctx, q, hd, H, T), il, "attn_q_heads"); /* [hd, H, T] */
    k = nm(bt_reshape_3d(ctx, k, hd, H, T), il, "attn_k_heads");
    v = nm(bt_reshape_3d(ctx, v, hd, H, T), il, "attn_v_heads");
    q = nm(bt_rope(ctx, q, pos, (int)hd, BT_ROPE_NEOX, c->rope_base, 1.0f), il, "attn_q_rope");
    k = nm(bt_rope(ctx, k, pos, (int)hd, BT_ROPE_NEOX, c->rope_base, 1.0f), il, "attn_k_rope");
    q = nm(bt_permute(ctx, q, 0, 2, 1, 3), il, "attn_q_perm"); /* [hd, T, H] */
    k = nm(bt_permute(ctx, k, 0, 2, 1, 3), il, "attn_k_perm");
    /* kq[i_k, i_q, h] = k_h[:, i_k] . q_h[:, i_q] */
    struct bt_tensor *kq = nm(bt_mul_mat(ctx, k, q), il, "attn_kq"); /* [T_k, T_q, H] */
    kq = nm(bt_soft_max_ext(ctx, kq, mask, 1.0f / sqrtf((float)hd)), il, "attn_kq_soft_max");
    /* v transposed per head: [T, hd, H] contiguous, so its rows are the
     * weights mul_mat needs */
    struct bt_tensor *vt = nm(bt_permute(ctx, v, 1, 2, 0, 3), il, "attn_v_perm");
    vt = nm(bt_cont(ctx, vt), il, "attn_v_t");
    struct bt_tensor *kqv = nm(bt_mul_mat(ctx, vt, kq), il, "attn_kqv"); /* [hd, T_q, H] */
    kqv = nm(bt_permute(ctx, kqv, 0, 2, 1, 3), il, "attn_kqv_perm"); /* [hd, H, T] */
    kqv = nm(bt_cont(ctx, kqv), il, "attn_kqv_cont");
    kqv = nm(bt_reshape_2d(ctx, kqv, d, T), il, "attn_kqv_merged"); /* [d, T] */
    return nm(bt_mul_mat(ctx, w->wo, kqv), il, "attn_out");
}

struct bt_tensor *bt_model_layer_forward(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *x,
                                         const struct bt_model_layer_weights *w, int il,
                                         struct bt_tensor *pos, struct bt_tensor *mask) {
    if (!x) return NULL;
    const int n0 = bt_context_n_tensors(ctx);
    struct bt_tensor *cur = nm(bt_rms_norm(ctx, x, c->norm_eps), il, "attn_rms");
    cur = nm(bt_mul(ctx, cur, w->attn_norm), il, "attn_norm_out");
    struct bt_tensor *h = cur ? attention(ctx, c, cur, w, il, pos, mask) : NULL;
    h = nm(bt_add(ctx, x, h), il, "attn_residual");
    cur = nm(bt_rms_norm(ctx, h, c->norm_eps), il, "ffn_rms");
    cur = nm(bt_mul(ctx, cur, w->ffn_norm), il, "ffn_norm_out");
    struct bt_tensor *f = bt_model_ffn(ctx, c, cur, w, il);
    struct bt_tensor *out = nm(bt_add(ctx, h, f), il, "out");
    name_rest(ctx, n0, il);
    return out;
}

/* tensors the graph context holds, upper bound: per layer 23 attention +
 * 5 norms/residuals + 8 routing + 6 experts + 2 per used expert + 8 shared */
static int64_t graph_tensors(const struct bt_model_config *c) {
    return 16 + (int64_t)c->n_layers * (64 + 2 * (int64_t)n_used(c));
}

int bt_model_graph_size(const struct bt_model_config *c) {
    return (int)(graph_tensors(c) + (int64_t)c->n_layers * WEIGHTS_PER_LAYER + 3);
}

size_t bt_model_graph_ctx_size(const struct bt_model_config *c) {
    return (size_t)graph_tensors(c) * bt_tensor_overhead() + bt_graph_overhead(bt_model_graph_size(c)) +
           8 * BT_MEM_ALIGN;
}

int bt_model_build_graph(const struct bt_model *m, bt_context *ctx, struct bt_model_graph *out) {
    const struct bt_model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    const int64_t T = c->n_tokens;

    struct bt_tensor *tokens = bt_new_tensor_1d(ctx, BT_TYPE_I32, T);
    struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, T);
    struct bt_tensor *mask = bt_new_tensor_2d(ctx, BT_TYPE_F32, T, T);
    if (!tokens || !pos || !mask) return BT_ERR_NOMEM;
    bt_set_name(tokens, "inp_tokens");
    bt_set_name(pos, "inp_pos");
    bt_set_name(mask, "inp_mask");
    bt_set_input(tokens);
    bt_set_input(pos);
    bt_set_input(mask);

    struct bt_tensor *x = bt_get_rows(ctx, m->token_embd, tokens); /* [d, T] */
    if (x) bt_set_name(x, "inp_embd");
    for (int il = 0; il < c->n_layers && x; il++)
        x = bt_model_layer_forward(ctx, c, x, &m->layers[il], il, pos, mask);
    struct bt_tensor *cur = bt_rms_norm(ctx, x, c->norm_eps);
    if (cur) bt_set_name(cur, "result_rms");
    cur = bt_mul(ctx, cur, m->output_norm);
    if (cur) bt_set_name(cur, "result_norm");
    struct bt_tensor *logits = bt_mul_mat(ctx, m->output, cur); /* [V, T] */
    if (!logits) return BT_ERR_NOMEM;
    bt_set_name(logits, "result_output");
    bt_set_output(logits);

    struct bt_graph *g = bt_graph_new(ctx, bt_model_graph_size(c));
    if (!g) return BT_ERR_NOMEM;
    const enum bt_status st = bt_graph_build_forward_expand(g, logits);
    if (st != BT_OK) return st;
    out->graph = g;
    out->tokens = tokens;
    out->pos = pos;
    out->mask = mask;
    out->logits = logits;
    return BT_OK;
}

/* ---- inputs ------------------------------------------------------------------ */

int32_t bt_model_input_token(const struct bt_model_config *c, int k, int i) {
    const uint64_t key = c->seed ^ 0x544f4b454e5321ULL; /* "TOKENS!" */
    const uint64_t idx = (uint64_t)(uint32_t)k * (uint64_t)c->n_tokens + (uint64_t)i;
    return (int32_t)(stream_at(key, idx) % (uint64_t)c->n_vocab);
}

/* into a tensor that has memory (bt_model_set_inputs) */
static enum bt_status set_direct(void *user, struct bt_tensor *t, const void *data, size_t size) {
    (void)user;
    if (t->data) bt_tensor_set(t, data, 0, size);
    return BT_OK;
}

enum bt_status bt_model_set_inputs_with(const struct bt_model *m, const struct bt_model_graph *g, int k,
                                        bt_model_input_fn set, void *user) {
    const int T = m->cfg.n_tokens;
    int32_t *tok = malloc((size_t)T * sizeof *tok), *pos = malloc((size_t)T * sizeof *pos);
    float *mask = malloc((size_t)T * (size_t)T * sizeof *mask);
    enum bt_status st = tok && pos && mask ? BT_OK : BT_ERR_NOMEM;
    if (st == BT_OK) {
        for (int i = 0; i < T; i++) {
            tok[i] = bt_model_input_token(&m->cfg, k, i);
            pos[i] = i;
        }
        /* mask[i_k, i_q]: key i_k is visible to query i_q when i_k <= i_q */
        for (int iq = 0; iq < T; iq++)
            for (int ik = 0; ik < T; ik++) mask[(size_t)iq * T + ik] = ik <= iq ? 0.0f : -INFINITY;
    }
    if (st == BT_OK && g->tokens) st = set(user, g->tokens, tok, (size_t)T * sizeof *tok);
    if (st == BT_OK && g->pos) st = set(user, g->pos, pos, (size_t)T * sizeof *pos);
    if (st == BT_OK && g->mask) st = set(user, g->mask, mask, (size_t)T * (size_t)T * sizeof *mask);
    free(tok);
    free(pos);
    free(mask);
    return st;
}

void bt_model_set_inputs(const struct bt_model *m, const struct bt_model_graph *g, int k) {
    BT_ASSERT(bt_model_set_inputs_with(m, g, k, set_direct, NULL) == BT_OK);
}

/* ---- cost figures ------------------------------------------------------------- */

double bt_model_layer_flops(const struct bt_model_config *c) {
    const double T = c->n_tokens, d = c->d_model, ff = c->d_ff, E = c->n_experts;
    double f = 4.0 * 2.0 * T * d * d; /* q, k, v, o */
    f += 2.0 * 2.0 * T * T * d;       /* kq and kqv over all heads */
    const double mlp = 3.0 * 2.0 * T * d * ff;
    switch (c->ffn) {
    case BT_FFN_MLP: f += mlp; break;
    case BT_FFN_MOE_DENSE: f += 2.0 * T * d * E + E * mlp; break;
    case BT_FFN_MOE_TOPK: f += 2.0 * T * d * E + c->top_k * mlp; break;
    case BT_FFN_MOE_SHARED:
        f += 2.0 * T * d * E + (c->top_k + c->n_shared) * mlp;
        if (c->shared_gate) f += 2.0 * T * d;
        break;
    default: break;
    }
    return f;
}

size_t bt_model_layer_weight_bytes(const struct bt_model_config *c) {
    const size_t d = (size_t)c->d_model, ff = (size_t)c->d_ff, E = (size_t)c->n_experts;
    const size_t rd = bt_row_size(c->wtype, c->d_model), rff = bt_row_size(c->wtype, c->d_ff);
    size_t b = 2 * d * sizeof(float) + 4 * rd * d; /* norms, q k v o */
    switch (c->ffn) {
    case BT_FFN_MLP: b += 2 * rd * ff + rff * d; break;
    case BT_FFN_MOE_DENSE:
    case BT_FFN_MOE_TOPK:
    case BT_FFN_MOE_SHARED: b += d * E * sizeof(float) + (2 * rd * ff + rff * d) * E; break;
    default: break;
    }
    if (c->ffn == BT_FFN_MOE_SHARED) {
        const size_t sff = (size_t)c->n_shared * ff;
        b += 2 * rd * sff + bt_row_size(c->wtype, (int64_t)sff) * d;
        if (c->shared_gate) b += d * sizeof(float);
    }
    return b;
}

size_t bt_model_weight_bytes(const struct bt_model_config *c) {
    return (size_t)c->n_layers * bt_model_layer_weight_bytes(c) +
           2 * bt_row_size(c->wtype, c->d_model) * (size_t)c->n_vocab + (size_t)c->d_model * sizeof(float);
}
