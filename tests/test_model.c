/* test_model.c - the synthetic MoE transformer (src/model/): each FFN kind
 * and a whole forward pass computed on the CPU against plain reference loops
 * written here (routing included: top-K by value, ties to the lower index,
 * softmax over the K, weighted sum), deterministic weights and graphs
 * (same hash, bitwise equal logits), node names and layer numbers, cost
 * figures, and the config errors a user sees. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "baton/backend.h"
#include "synth_model.h"
#include "testutil.h"

#define TOL_MATMUL 5e-4
#define NT 2

static void small_config(struct bt_model_config *c, enum bt_ffn_kind kind) {
    bt_model_config_default(c);
    c->n_layers = 2;
    c->d_model = 64;
    c->n_heads = 4;
    c->d_ff = 96;
    c->n_experts = 8;
    c->top_k = 2;
    c->n_shared = 1;
    c->ffn = kind;
    c->n_vocab = 100;
    c->n_tokens = 12;
    c->seed = 1234;
}

/* ---- reference ------------------------------------------------------------------ */

/* the weights of one layer, dequantised, dense in logical order (NULL where absent) */
struct ref_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm;
    float *gate, *up, *down;
    float *router, *gate_exps, *up_exps, *down_exps;
    float *gate_sh, *up_sh, *down_sh, *gate_inp_sh;
};

static float *rd(const struct bt_tensor *t) {
    if (!t) return NULL;
    float *v = malloc((size_t)bt_nelements(t) * sizeof(float));
    ck_assert_ptr_nonnull(v);
    if (t->type == BT_TYPE_F32) {
        bt_tensor_get(t, v, 0, bt_nbytes(t)); /* any buffer */
        return v;
    }
    /* dequantise row by row through a host copy */
    const size_t rb = bt_row_size(t->type, t->ne[0]);
    uint8_t *row = malloc(rb);
    for (int64_t r = 0; r < bt_nrows(t); r++) {
        bt_tensor_get(t, row, (size_t)r * rb, rb);
        bt_row_to_f32(t->type, row, v + r * t->ne[0], t->ne[0]);
    }
    free(row);
    return v;
}

static void ref_layer_read(struct ref_layer *r, const struct bt_model_layer_weights *w) {
    r->attn_norm = rd(w->attn_norm);
    r->wq = rd(w->wq);
    r->wk = rd(w->wk);
    r->wv = rd(w->wv);
    r->wo = rd(w->wo);
    r->ffn_norm = rd(w->ffn_norm);
    r->gate = rd(w->ffn_gate);
    r->up = rd(w->ffn_up);
    r->down = rd(w->ffn_down);
    r->router = rd(w->ffn_gate_inp);
    r->gate_exps = rd(w->ffn_gate_exps);
    r->up_exps = rd(w->ffn_up_exps);
    r->down_exps = rd(w->ffn_down_exps);
    r->gate_sh = rd(w->ffn_gate_shexp);
    r->up_sh = rd(w->ffn_up_shexp);
    r->down_sh = rd(w->ffn_down_shexp);
    r->gate_inp_sh = rd(w->ffn_gate_inp_shexp);
}

static void ref_layer_free(struct ref_layer *r) {
    float **p = (float **)r;
    for (size_t i = 0; i < sizeof *r / sizeof(float *); i++) free(p[i]);
}

/* y[o] = sum_i W[i + n_in*o] x[i]  (W [n_in, n_out]) */
static void matvec(const float *W, const float *x, int n_in, int n_out, double *y) {
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++) s += (double)W[(size_t)o * n_in + i] * x[i];
        y[o] = s;
    }
}

/* out += scale * down(silu(gate x) * up x), widths d -> ff -> d */
static void ref_mlp(const float *g, const float *u, const float *dn, const float *x, int d, int ff, double scale,
                    double *out) {
    double *gv = malloc((size_t)ff * sizeof *gv), *uv = malloc((size_t)ff * sizeof *uv);
    float *a = malloc((size_t)ff * sizeof *a);
    double *o = malloc((size_t)d * sizeof *o);
    matvec(g, x, d, ff, gv);
    matvec(u, x, d, ff, uv);
    for (int f = 0; f < ff; f++) a[f] = (float)(gv[f] / (1.0 + exp(-gv[f])) * uv[f]);
    matvec(dn, a, ff, d, o);
    for (int i = 0; i < d; i++) out[i] += scale * o[i];
    free(gv);
    free(uv);
    free(a);
    free(o);
}

static double g_min_margin; /* smallest gap between the K-th and (K+1)-th logit seen */

/* FFN of one token x [d] -> out [d] */
static void ref_ffn(const struct bt_model_config *c, const struct ref_layer *w, const float *x, float *out) {
    const int d = c->d_model, ff = c->d_ff, E = c->n_experts;
    double *acc = calloc((size_t)d, sizeof *acc);
    if (c->ffn == BT_FFN_MLP) {
        ref_mlp(w->gate, w->up, w->down, x, d, ff, 1.0, acc);
    } else {
        double logits[64];
        int sel[64];
        bool used[64] = {false};
        ck_assert(E <= 64);
        matvec(w->router, x, d, E, logits);
        const int K = c->ffn == BT_FFN_MOE_DENSE ? E : c->top_k;
        for (int j = 0; j < K; j++) { /* top-K by value, ties to the lower index */
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (best < 0 || logits[e] > logits[best])) best = e;
            sel[j] = best;
            used[best] = true;
        }
        if (K < E) {
            double next = -INFINITY;
            for (int e = 0; e < E; e++)
                if (!used[e] && logits[e] > next) next = logits[e];
            const double margin = logits[sel[K - 1]] - next;
            if (margin < g_min_margin) g_min_margin = margin;
        }
        /* the routing weights as transformers' Qwen2MoeSparseMoeBlock (and
         * Mixtral's, Qwen3-MoE's) compute them: softmax over all E experts,
         * top-K of those probabilities, divided by their sum only when the
         * config's norm_topk_prob is true */
        double mx = logits[0], z = 0, probs[64], wgt[64], wsum = 0;
        for (int e = 1; e < E; e++)
            if (logits[e] > mx) mx = logits[e];
        for (int e = 0; e < E; e++) z += probs[e] = exp(logits[e] - mx);
        for (int e = 0; e < E; e++) probs[e] /= z;
        for (int j = 0; j < K; j++) wsum += wgt[j] = probs[sel[j]];
        const bool norm_topk_prob = c->ffn != BT_FFN_MOE_DENSE && c->norm_topk;
        for (int j = 0; j < K; j++) {
            const size_t e = (size_t)sel[j];
            ref_mlp(w->gate_exps + e * d * ff, w->up_exps + e * d * ff, w->down_exps + e * ff * d, x, d, ff,
                    norm_topk_prob ? wgt[j] / wsum : wgt[j], acc);
        }
        if (c->ffn == BT_FFN_MOE_SHARED) {
            double gate = 1.0;
            if (c->shared_gate) {
                double gl;
                matvec(w->gate_inp_sh, x, d, 1, &gl);
                gate = 1.0 / (1.0 + exp(-gl));
            }
            ref_mlp(w->gate_sh, w->up_sh, w->down_sh, x, d, c->n_shared * ff, gate, acc);
        }
    }
    for (int i = 0; i < d; i++) out[i] = (float)acc[i];
    free(acc);
}

/* y = x / sqrt(mean(x^2) + eps) * w */
static void ref_rms(const float *x, const float *w, int d, float eps, float *y) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(s / d + eps);
    for (int i = 0; i < d; i++) y[i] = (float)(x[i] * r * w[i]);
}

/* NEOX rope of one head vector v [hd] at position p */
static void ref_rope(float *v, int hd, int p, float base) {
    for (int i = 0; i < hd / 2; i++) {
        const double theta = p * pow(base, -2.0 * i / hd);
        const double x0 = v[i], x1 = v[i + hd / 2];
        v[i] = (float)(x0 * cos(theta) - x1 * sin(theta));
        v[i + hd / 2] = (float)(x0 * sin(theta) + x1 * cos(theta));
    }
}

/* one layer in place on x [d, T] (token-major) */
static void ref_layer_forward(const struct bt_model_config *c, const struct ref_layer *w, float *x) {
    const int d = c->d_model, T = c->n_tokens, H = c->n_heads, hd = d / H;
    float *y = malloc((size_t)d * T * sizeof *y), *q = malloc((size_t)d * T * sizeof *q),
          *k = malloc((size_t)d * T * sizeof *k), *v = malloc((size_t)d * T * sizeof *v),
          *att = malloc((size_t)d * T * sizeof *att), *tmp = malloc((size_t)d * sizeof *tmp);
    double *o = malloc((size_t)d * sizeof *o), *sc = malloc((size_t)T * sizeof *sc);
    for (int t = 0; t < T; t++) {
        ref_rms(x + t * d, w->attn_norm, d, c->norm_eps, y + t * d);
        matvec(w->wq, y + t * d, d, d, o);
        for (int i = 0; i < d; i++) q[t * d + i] = (float)o[i];
        matvec(w->wk, y + t * d, d, d, o);
        for (int i = 0; i < d; i++) k[t * d + i] = (float)o[i];
        matvec(w->wv, y + t * d, d, d, o);
        for (int i = 0; i < d; i++) v[t * d + i] = (float)o[i];
        for (int h = 0; h < H; h++) {
            ref_rope(q + t * d + h * hd, hd, t, c->rope_base);
            ref_rope(k + t * d + h * hd, hd, t, c->rope_base);
        }
    }
    for (int h = 0; h < H; h++)
        for (int tq = 0; tq < T; tq++) {
            double mx = -INFINITY, sum = 0;
            for (int tk = 0; tk <= tq; tk++) { /* causal */
                double s = 0;
                for (int j = 0; j < hd; j++) s += (double)q[tq * d + h * hd + j] * k[tk * d + h * hd + j];
                sc[tk] = s / sqrt((double)hd);
                if (sc[tk] > mx) mx = sc[tk];
            }
            for (int tk = 0; tk <= tq; tk++) sum += sc[tk] = exp(sc[tk] - mx);
            for (int j = 0; j < hd; j++) {
                double s = 0;
                for (int tk = 0; tk <= tq; tk++) s += sc[tk] / sum * v[tk * d + h * hd + j];
                att[tq * d + h * hd + j] = (float)s;
            }
        }
    for (int t = 0; t < T; t++) {
        matvec(w->wo, att + t * d, d, d, o);
        for (int i = 0; i < d; i++) x[t * d + i] += (float)o[i];
        ref_rms(x + t * d, w->ffn_norm, d, c->norm_eps, y + t * d);
        ref_ffn(c, w, y + t * d, tmp);
        for (int i = 0; i < d; i++) x[t * d + i] += tmp[i];
    }
    free(y);
    free(q);
    free(k);
    free(v);
    free(att);
    free(tmp);
    free(o);
    free(sc);
}

/* ---- helpers ----------------------------------------------------------------------- */

/* a model with every weight in one CPU buffer, initialised */
static struct bt_model *model_with_data(const struct bt_model_config *c, bt_buffer_t *buf) {
    struct bt_model *m = NULL;
    char err[256];
    ck_assert_msg(bt_model_new(c, &m, err, sizeof err) == BT_OK, "%s", err);
    *buf = bt_alloc_ctx_tensors_from_buft(bt_model_context(m), bt_cpu_buffer_type());
    ck_assert_msg(*buf != NULL, "%s", bt_context_error(bt_model_context(m)));
    bt_model_init_weights(m);
    return m;
}

/* build + run micro-batch k of m in a fresh context; returns the logits (malloc'd) */
static float *run_model(const struct bt_model *m, int k, uint64_t *hash) {
    const struct bt_model_config *c = bt_model_get_config(m);
    bt_context *ctx = tu_ctx(32);
    struct bt_model_graph g;
    const int st = bt_model_build_graph(m, ctx, &g);
    ck_assert_msg(st == BT_OK, "build: %s", bt_context_error(ctx));
    bt_model_set_inputs(m, &g, k);
    const enum bt_status s = tu_run(g.graph, NT);
    ck_assert_msg(s == BT_OK, "compute: %s", bt_cpu_error(tu_cpu(NT)));
    ck_assert_int_eq(g.logits->ne[0], c->n_vocab);
    ck_assert_int_eq(g.logits->ne[1], c->n_tokens);
    float *out = malloc(bt_nbytes(g.logits));
    bt_tensor_get(g.logits, out, 0, bt_nbytes(g.logits));
    if (hash) *hash = bt_graph_hash(g.graph);
    bt_free(ctx);
    return out;
}

/* ---- FFN kinds against the reference --------------------------------------------- */

static void check_ffn_norm(enum bt_ffn_kind kind, enum bt_type wtype, int shared_gate, int norm_topk) {
    struct bt_model_config c;
    small_config(&c, kind);
    c.wtype = wtype;
    c.shared_gate = shared_gate;
    c.norm_topk = norm_topk;
    c.n_tokens = 24;
    const int d = c.d_model, T = c.n_tokens;
    bt_context *ctx = tu_ctx(64);
    struct bt_model_layer_weights w;
    ck_assert_int_eq(bt_model_layer_weights_new(ctx, &c, 3 % c.n_layers, &w), BT_OK);
    const int il = 3 % c.n_layers;
    for (int i = 0; i < bt_context_n_tensors(ctx); i++) {
        struct bt_tensor *t = bt_context_tensor(ctx, i);
        ck_assert(t->flags & BT_TENSOR_FLAG_WEIGHT);
        bt_model_fill_weight(c.seed + (uint64_t)kind, t);
    }
    tu_rng r;
    tu_rng_init(&r, 77 + (uint64_t)kind);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, d, T);
    tu_fill(x, &r);
    const int n0 = bt_context_n_tensors(ctx);
    struct bt_tensor *out = bt_model_ffn(ctx, &c, x, &w, il);
    TU_OK(ctx, out);
    ck_assert_int_eq(out->ne[0], d);
    ck_assert_int_eq(out->ne[1], T);
    /* every tensor the builder made is named for its layer */
    for (int i = n0; i < bt_context_n_tensors(ctx); i++) {
        const struct bt_tensor *t = bt_context_tensor(ctx, i);
        ck_assert_msg(strncmp(t->name, "blk.1.", 6) == 0, "tensor %d named '%s'", i, t->name);
    }
    tu_compute(ctx, out, NT);

    struct ref_layer rw = {0};
    ref_layer_read(&rw, &w);
    float *xv = tu_read_f32(x), *ref = malloc((size_t)d * T * sizeof *ref);
    g_min_margin = INFINITY;
    for (int t = 0; t < T; t++) ref_ffn(&c, &rw, xv + t * d, ref + t * d);
    /* a near tie between the K-th and (K+1)-th logit would make the routing
     * depend on rounding: the data must not have one */
    ck_assert_msg(g_min_margin > 1e-4, "routing margin %g too small: change the seed", g_min_margin);
    const double e = tu_nmse_tensor(out, ref);
    printf("ffn %-10s %-4s gate %d norm_topk %d: nmse %.3g, routing margin %.3g\n", bt_ffn_kind_name(kind),
           bt_type_name(wtype), shared_gate, norm_topk, e, g_min_margin);
    ck_assert_msg(e <= TOL_MATMUL, "ffn %s (%s, gate %d, norm_topk %d): nmse %g", bt_ffn_kind_name(kind),
                  bt_type_name(wtype), shared_gate, norm_topk, e);
    free(xv);
    free(ref);
    ref_layer_free(&rw);
    bt_free(ctx);
}

static void check_ffn(enum bt_ffn_kind kind, enum bt_type wtype, int shared_gate) {
    check_ffn_norm(kind, wtype, shared_gate, 1);
}

START_TEST(test_ffn_mlp) { check_ffn(BT_FFN_MLP, BT_TYPE_F32, 0); }
END_TEST
START_TEST(test_ffn_dense) { check_ffn(BT_FFN_MOE_DENSE, BT_TYPE_F32, 0); }
END_TEST
START_TEST(test_ffn_topk) { check_ffn(BT_FFN_MOE_TOPK, BT_TYPE_F32, 0); }
END_TEST
START_TEST(test_ffn_shared) {
    check_ffn(BT_FFN_MOE_SHARED, BT_TYPE_F32, 1);
    check_ffn(BT_FFN_MOE_SHARED, BT_TYPE_F32, 0);
}
END_TEST
START_TEST(test_ffn_q8_0) {
    check_ffn(BT_FFN_MOE_TOPK, BT_TYPE_Q8_0, 0);
    check_ffn(BT_FFN_MOE_SHARED, BT_TYPE_Q8_0, 1);
}
END_TEST

/* Qwen2-MoE (norm_topk_prob false): the top-K probabilities of the full
 * softmax, not renormalised, with the sigmoid-gated shared expert; also
 * without shared experts and with q8_0 weights */
START_TEST(test_ffn_qwen2_moe) {
    check_ffn_norm(BT_FFN_MOE_SHARED, BT_TYPE_F32, 1, 0);
    check_ffn_norm(BT_FFN_MOE_TOPK, BT_TYPE_F32, 0, 0);
    check_ffn_norm(BT_FFN_MOE_SHARED, BT_TYPE_Q8_0, 1, 0);
}
END_TEST

/* top-1: the routed sum is a single slot (a view, no adds) */
START_TEST(test_ffn_top1) {
    struct bt_model_config c;
    small_config(&c, BT_FFN_MOE_TOPK);
    c.top_k = 1;
    bt_context *ctx = tu_ctx(32);
    struct bt_model_layer_weights w;
    ck_assert_int_eq(bt_model_layer_weights_new(ctx, &c, 0, &w), BT_OK);
    for (int i = 0; i < bt_context_n_tensors(ctx); i++) bt_model_fill_weight(5, bt_context_tensor(ctx, i));
    tu_rng r;
    tu_rng_init(&r, 3);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, c.d_model, c.n_tokens);
    tu_fill(x, &r);
    struct bt_tensor *out = bt_model_ffn(ctx, &c, x, &w, 0);
    TU_OK(ctx, out);
    tu_compute(ctx, out, NT);
    struct ref_layer rw = {0};
    ref_layer_read(&rw, &w);
    float *xv = tu_read_f32(x), *ref = malloc((size_t)c.d_model * c.n_tokens * sizeof *ref);
    g_min_margin = INFINITY;
    for (int t = 0; t < c.n_tokens; t++) ref_ffn(&c, &rw, xv + t * c.d_model, ref + t * c.d_model);
    ck_assert(g_min_margin > 1e-4);
    ck_assert_double_le(tu_nmse_tensor(out, ref), TOL_MATMUL);
    free(xv);
    free(ref);
    ref_layer_free(&rw);
    bt_free(ctx);
}
END_TEST

/* ---- whole model -------------------------------------------------------------------- */

/* 2 layers of each kind against the reference forward pass */
START_TEST(test_forward_reference) {
    const enum bt_ffn_kind kind = (enum bt_ffn_kind)_i;
    struct bt_model_config c;
    small_config(&c, kind);
    if (kind == BT_FFN_MOE_SHARED) c.norm_topk = 0; /* as Qwen2-MoE (gated shared expert) */
    bt_buffer_t buf;
    struct bt_model *m = model_with_data(&c, &buf);
    float *logits = run_model(m, 3, NULL);
    const int d = c.d_model, T = c.n_tokens, V = c.n_vocab;
    for (int i = 0; i < V * T; i++) ck_assert_msg(isfinite(logits[i]), "logit %d = %g", i, logits[i]);

    float *emb = rd(bt_model_weight_by_name(m, "token_embd"));
    float *onorm = rd(bt_model_weight_by_name(m, "output_norm"));
    float *wout = rd(bt_model_weight_by_name(m, "output"));
    float *x = malloc((size_t)d * T * sizeof *x), *y = malloc((size_t)d * sizeof *y);
    double *o = malloc((size_t)V * sizeof *o);
    float *ref = malloc((size_t)V * T * sizeof *ref);
    for (int t = 0; t < T; t++) {
        const int tok = bt_model_input_token(&c, 3, t);
        ck_assert(tok >= 0 && tok < V);
        memcpy(x + t * d, emb + (size_t)tok * d, (size_t)d * sizeof *x);
    }
    g_min_margin = INFINITY;
    for (int il = 0; il < c.n_layers; il++) {
        struct ref_layer rw = {0};
        ref_layer_read(&rw, bt_model_layer(m, il));
        ref_layer_forward(&c, &rw, x);
        ref_layer_free(&rw);
    }
    ck_assert_msg(g_min_margin > 1e-4, "routing margin %g too small", g_min_margin);
    for (int t = 0; t < T; t++) {
        ref_rms(x + t * d, onorm, d, c.norm_eps, y);
        matvec(wout, y, d, V, o);
        for (int v = 0; v < V; v++) ref[t * V + v] = (float)o[v];
    }
    const double e = tu_nmse(logits, ref, (int64_t)V * T);
    printf("forward %-10s 2 layers: nmse %.3g\n", bt_ffn_kind_name(kind), e);
    ck_assert_msg(e <= TOL_MATMUL, "forward %s: nmse %g", bt_ffn_kind_name(kind), e);
    free(emb);
    free(onorm);
    free(wout);
    free(x);
    free(y);
    free(o);
    free(ref);
    free(logits);
    bt_buffer_free(buf);
    bt_model_free(m);
}
END_TEST

/* the same config built twice: same hash, bitwise equal logits; another seed
 * or another micro-batch: different logits */
START_TEST(test_deterministic) {
    struct bt_model_config c;
    small_config(&c, BT_FFN_MOE_SHARED);
    c.wtype = BT_TYPE_Q8_0;
    bt_buffer_t b1, b2, b3;
    struct bt_model *m1 = model_with_data(&c, &b1), *m2 = model_with_data(&c, &b2);
    uint64_t h1, h2, h3;
    float *l1 = run_model(m1, 0, &h1), *l2 = run_model(m2, 0, &h2);
    ck_assert_uint_eq(h1, h2);
    const size_t n = (size_t)c.n_vocab * c.n_tokens;
    ck_assert(memcmp(l1, l2, n * sizeof(float)) == 0);
    for (int i = 0; i < bt_model_n_weights(m1); i++) { /* weights byte for byte */
        const struct bt_tensor *w1 = bt_model_weight(m1, i), *w2 = bt_model_weight(m2, i);
        ck_assert_str_eq(w1->name, w2->name);
        ck_assert(memcmp(w1->data, w2->data, bt_nbytes(w1)) == 0);
    }

    float *lk = run_model(m1, 1, NULL); /* another micro-batch */
    ck_assert_double_gt(tu_nmse(lk, l1, (int64_t)n), 1e-3);

    c.seed += 1;
    struct bt_model *m3 = model_with_data(&c, &b3);
    float *l3 = run_model(m3, 0, &h3);
    ck_assert_uint_eq(h1, h3); /* the structure does not depend on the seed */
    ck_assert_double_gt(tu_nmse(l3, l1, (int64_t)n), 1e-3);
    free(l1);
    free(l2);
    free(l3);
    free(lk);
    bt_buffer_free(b1);
    bt_buffer_free(b2);
    bt_buffer_free(b3);
    bt_model_free(m1);
    bt_model_free(m2);
    bt_model_free(m3);
}
END_TEST

/* weight data does not depend on which buffer or process makes it: filling a
 * copy of a tensor in a plain context gives the same bytes */
START_TEST(test_weight_data) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 40);
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 40);
    struct bt_tensor *n = bt_new_tensor_1d(ctx, BT_TYPE_F32, 64);
    bt_set_name(a, "blk.0.attn_q");
    bt_set_name(b, "blk.0.attn_k");
    bt_set_name(n, "blk.0.attn_norm");
    bt_model_fill_weight(9, a);
    bt_model_fill_weight(9, b);
    bt_model_fill_weight(9, n);
    const float *pa = a->data, *pb = b->data, *pn = n->data;
    ck_assert(memcmp(pa, pb, bt_nbytes(a)) != 0); /* the name matters */
    double s2 = 0;
    for (int i = 0; i < 64 * 40; i++) {
        ck_assert(fabsf(pa[i]) <= 1.0f / 8.0f); /* 1/sqrt(fan_in = 64) */
        s2 += (double)pa[i] * pa[i];
    }
    ck_assert_double_gt(s2 / (64 * 40), 0.5 * (1.0 / 64) / 3); /* ~ uniform variance s^2/3 */
    for (int i = 0; i < 64; i++) ck_assert(pn[i] >= 0.875f && pn[i] < 1.125f);
    /* a second fill of the same name and seed: the same bytes */
    struct bt_tensor *a2 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 40);
    bt_set_name(a2, "blk.0.attn_q");
    bt_model_fill_weight(9, a2);
    ck_assert(memcmp(pa, a2->data, bt_nbytes(a)) == 0);
    bt_free(ctx);
}
END_TEST

/* ---- graph structure ------------------------------------------------------------------ */

START_TEST(test_graph_structure) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    for (int kind = 0; kind < BT_FFN_COUNT; kind++) {
        c.ffn = (enum bt_ffn_kind)kind;
        struct bt_model *m = NULL;
        char err[256];
        ck_assert_msg(bt_model_new(&c, &m, err, sizeof err) == BT_OK, "%s", err);
        /* metadata only, in a context of exactly the advertised size */
        const size_t sz = bt_model_graph_ctx_size(&c);
        bt_context *ctx = bt_init((struct bt_init_params){sz, NULL, true});
        struct bt_model_graph g;
        ck_assert_msg(bt_model_build_graph(m, ctx, &g) == BT_OK, "%s", bt_context_error(ctx));
        const struct bt_graph *gr = g.graph;
        ck_assert_ptr_eq(bt_graph_node(gr, -1), g.logits);
        ck_assert(g.logits->flags & BT_TENSOR_FLAG_OUTPUT);
        ck_assert(g.tokens->flags & BT_TENSOR_FLAG_INPUT);
        ck_assert(g.pos->flags & BT_TENSOR_FLAG_INPUT);
        ck_assert(g.mask->flags & BT_TENSOR_FLAG_INPUT);
        printf("model %-10s default config: %d nodes, %d leafs, graph size %d, ctx %zu of %zu bytes, %d weights, "
               "%.3f MFLOP/layer, %zu weight bytes/layer\n",
               bt_ffn_kind_name(c.ffn), gr->n_nodes, gr->n_leafs, gr->size, bt_used_mem(ctx), sz,
               bt_model_n_weights(m), bt_model_layer_flops(&c) / 1e6, bt_model_layer_weight_bytes(&c));
        /* every node names its layer; layers never go back */
        int prev = -1;
        for (int i = 0; i < gr->n_nodes; i++) {
            const struct bt_tensor *t = gr->nodes[i];
            const int l = bt_model_tensor_layer(m, t);
            ck_assert_msg(l >= prev, "node %d '%s' (layer %d) after layer %d", i, t->name, l, prev);
            if (l == -1)
                ck_assert_msg(strncmp(t->name, "inp_", 4) == 0, "node %d '%s'", i, t->name);
            else if (l == c.n_layers)
                ck_assert_msg(strncmp(t->name, "result_", 7) == 0, "node %d '%s'", i, t->name);
            else
                ck_assert_msg(strncmp(t->name, "blk.", 4) == 0, "node %d '%s'", i, t->name);
            prev = l;
            ck_assert_msg(bt_cpu_supports_op(t), "node %d '%s' (%s)", i, t->name, bt_op_name(t->op));
        }
        ck_assert_int_eq(prev, c.n_layers);
        /* every leaf: a model weight or one of the three inputs */
        int n_w = 0;
        for (int i = 0; i < gr->n_leafs; i++) {
            const struct bt_tensor *t = gr->leafs[i];
            if (t->flags & BT_TENSOR_FLAG_WEIGHT) {
                ck_assert_ptr_eq(bt_model_weight_by_name(m, t->name), t);
                n_w++;
            } else {
                ck_assert(t == g.tokens || t == g.pos || t == g.mask);
            }
        }
        ck_assert_int_eq(n_w, bt_model_n_weights(m)); /* every weight is used */
        bt_free(ctx);

        /* a context too small: an error with a message, no crash */
        ctx = bt_init((struct bt_init_params){sz / 3, NULL, true});
        ck_assert_int_ne(bt_model_build_graph(m, ctx, &g), BT_OK);
        ck_assert_str_ne(bt_context_error(ctx), "");
        bt_free(ctx);
        bt_model_free(m);
    }
}
END_TEST

START_TEST(test_weights_and_layers) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    for (int kind = 0; kind < BT_FFN_COUNT; kind++) {
        c.ffn = (enum bt_ffn_kind)kind;
        c.wtype = kind % 2 ? BT_TYPE_Q4_0 : BT_TYPE_F16;
        struct bt_model *m = NULL;
        char err[256];
        ck_assert_msg(bt_model_new(&c, &m, err, sizeof err) == BT_OK, "%s", err);
        size_t per_layer[64] = {0}, total = 0;
        ck_assert(c.n_layers < 64);
        for (int i = 0; i < bt_model_n_weights(m); i++) {
            const struct bt_tensor *w = bt_model_weight(m, i);
            ck_assert(w->flags & BT_TENSOR_FLAG_WEIGHT);
            ck_assert_ptr_null(w->data); /* metadata only */
            const int l = bt_model_tensor_layer(m, w);
            if (strcmp(w->name, "token_embd") == 0)
                ck_assert_int_eq(l, -1);
            else if (strcmp(w->name, "output") == 0 || strcmp(w->name, "output_norm") == 0)
                ck_assert_int_eq(l, c.n_layers);
            else {
                ck_assert_msg(l >= 0 && l < c.n_layers, "'%s'", w->name);
                per_layer[l] += bt_nbytes(w);
            }
            total += bt_nbytes(w);
        }
        for (int l = 0; l < c.n_layers; l++) ck_assert_uint_eq(per_layer[l], bt_model_layer_weight_bytes(&c));
        ck_assert_uint_eq(total, bt_model_weight_bytes(&c));
        /* names that say what they hold */
        ck_assert_ptr_nonnull(bt_model_weight_by_name(m, "blk.3.attn_q"));
        ck_assert_ptr_nonnull(bt_model_weight_by_name(m, "output_norm"));
        if (kind != BT_FFN_MLP) {
            const struct bt_tensor *e = bt_model_weight_by_name(m, "blk.3.ffn_gate_exps");
            ck_assert_ptr_nonnull(e);
            ck_assert_int_eq(e->ne[0], c.d_model);
            ck_assert_int_eq(e->ne[1], c.d_ff);
            ck_assert_int_eq(e->ne[2], c.n_experts);
            ck_assert_int_eq(e->type, c.wtype);
            ck_assert_int_eq(bt_model_weight_by_name(m, "blk.3.ffn_gate_inp")->type, BT_TYPE_F32);
        }
        ck_assert_int_eq(bt_model_weight_by_name(m, "blk.0.ffn_gate_inp_shexp") != NULL, kind == BT_FFN_MOE_SHARED);
        ck_assert_ptr_eq(bt_model_layer(m, 2)->wq, bt_model_weight_by_name(m, "blk.2.attn_q"));
        bt_model_free(m);
    }
    /* FLOPs: top-2 of 8 routes 2 experts, dense all 8 */
    struct bt_model_config a = c, b = c;
    a.ffn = BT_FFN_MOE_TOPK;
    b.ffn = BT_FFN_MOE_DENSE;
    const double mlp = 6.0 * c.n_tokens * c.d_model * c.d_ff;
    ck_assert(fabs(bt_model_layer_flops(&b) - bt_model_layer_flops(&a) - 6 * mlp) < 1e-6 * mlp);

    ck_assert_int_eq(bt_model_name_layer("blk.12.attn_q", 40), 12);
    ck_assert_int_eq(bt_model_name_layer("blk.7.ffn_moe_out (view)", 8), 7);
    ck_assert_int_eq(bt_model_name_layer("inp_embd", 8), -1);
    ck_assert_int_eq(bt_model_name_layer("token_embd", 8), -1);
    ck_assert_int_eq(bt_model_name_layer("result_output", 8), 8);
    ck_assert_int_eq(bt_model_name_layer("blk.x", 8), -1);
    enum bt_ffn_kind k;
    ck_assert_int_eq(bt_ffn_kind_from_name("moe-shared", &k), BT_OK);
    ck_assert_int_eq(k, BT_FFN_MOE_SHARED);
    ck_assert_int_eq(bt_ffn_kind_from_name("moe", &k), BT_ERR_INVALID);
}
END_TEST

/* ---- config errors -------------------------------------------------------------------- */

struct bad_case {
    const char *field; /* the message must start with it */
    void (*set)(struct bt_model_config *c);
};
#define BAD(name, field, body)                                \
    static void name(struct bt_model_config *c) { body; }
BAD(b_layers, "n_layers", c->n_layers = 0)
BAD(b_layers_big, "n_layers", c->n_layers = 1 << 20)
BAD(b_dmodel, "d_model", c->d_model = -4)
BAD(b_heads0, "n_heads", c->n_heads = 0)
BAD(b_heads_div, "n_heads", c->n_heads = 3)
BAD(b_heads_odd, "n_heads", c->n_heads = 64)
BAD(b_dff, "d_ff", c->d_ff = 0)
BAD(b_ffn, "ffn", c->ffn = (enum bt_ffn_kind)9)
BAD(b_experts, "n_experts", c->n_experts = 0)
BAD(b_topk0, "top_k", c->top_k = 0)
BAD(b_topk_big, "top_k", c->top_k = 9)
BAD(b_shared, "n_shared", c->ffn = BT_FFN_MOE_SHARED; c->n_shared = 0)
BAD(b_shared_neg, "n_shared", c->n_shared = -1)
BAD(b_gate, "shared_gate", c->shared_gate = 2)
BAD(b_norm_topk, "norm_topk", c->norm_topk = -1)
BAD(b_vocab, "n_vocab", c->n_vocab = 0)
BAD(b_tokens, "n_tokens", c->n_tokens = -1)
BAD(b_wtype, "wtype", c->wtype = BT_TYPE_I32)
BAD(b_wtype_unknown, "wtype", c->wtype = (enum bt_type)77)
BAD(b_q_dmodel, "d_model", c->wtype = BT_TYPE_Q8_0; c->d_model = 48; c->n_heads = 4)
BAD(b_q_dff, "d_ff", c->wtype = BT_TYPE_Q4_0; c->d_ff = 100)
BAD(b_rope, "rope_base", c->rope_base = 0.0f)
BAD(b_rope_nan, "rope_base", c->rope_base = NAN)
BAD(b_eps, "norm_eps", c->norm_eps = -1e-5f)
BAD(b_eps_inf, "norm_eps", c->norm_eps = INFINITY)
BAD(b_dense_experts, "n_experts", c->ffn = BT_FFN_MOE_DENSE; c->n_experts = -2)

START_TEST(test_config_errors) {
    static const struct bad_case cases[] = {
        {"n_layers", b_layers},   {"n_layers", b_layers_big}, {"d_model", b_dmodel},
        {"n_heads", b_heads0},    {"n_heads", b_heads_div},   {"n_heads", b_heads_odd},
        {"d_ff", b_dff},          {"ffn", b_ffn},             {"n_experts", b_experts},
        {"top_k", b_topk0},       {"top_k", b_topk_big},      {"n_shared", b_shared},
        {"n_shared", b_shared_neg}, {"shared_gate", b_gate},  {"norm_topk", b_norm_topk}, {"n_vocab", b_vocab},
        {"n_tokens", b_tokens},   {"wtype", b_wtype},         {"wtype", b_wtype_unknown},
        {"d_model", b_q_dmodel},  {"d_ff", b_q_dff},          {"rope_base", b_rope},
        {"rope_base", b_rope_nan}, {"norm_eps", b_eps},       {"norm_eps", b_eps_inf},
        {"n_experts", b_dense_experts},
    };
    struct bt_model_config c;
    char err[256];
    bt_model_config_default(&c);
    ck_assert_int_eq(bt_model_config_check(&c, err, sizeof err), BT_OK);
    ck_assert_str_eq(err, "");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bt_model_config_default(&c);
        cases[i].set(&c);
        ck_assert_int_eq(bt_model_config_check(&c, err, sizeof err), BT_ERR_INVALID);
        const size_t lf = strlen(cases[i].field);
        ck_assert_msg(strncmp(err, cases[i].field, lf) == 0 && err[lf] == ' ', "case %zu: expected '%s': got '%s'",
                      i, cases[i].field, err);
        struct bt_model *m = (struct bt_model *)&c; /* overwritten */
        char err2[256];
        ck_assert_int_eq(bt_model_new(&c, &m, err2, sizeof err2), BT_ERR_INVALID);
        ck_assert_ptr_null(m);
        ck_assert_str_eq(err2, err); /* the check's message, as it is */
    }
    /* unused fields of an MLP are not errors when zero */
    bt_model_config_default(&c);
    c.ffn = BT_FFN_MLP;
    c.n_experts = c.top_k = c.n_shared = 0;
    ck_assert_int_eq(bt_model_config_check(&c, err, sizeof err), BT_OK);
    /* q8_0 with multiples of 32 passes */
    bt_model_config_default(&c);
    c.wtype = BT_TYPE_Q8_0;
    ck_assert_int_eq(bt_model_config_check(&c, NULL, 0), BT_OK);
}
END_TEST

/* A bad config given to bt_model_new is a status and the
 * message in the caller's buffer, with nothing printed on stderr. */
START_TEST(test_new_errors) {
    struct tu_stderr cap;
    tu_stderr_begin(&cap);
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_heads = 3;
    struct bt_model *m = (struct bt_model *)&c; /* overwritten */
    char err[256] = "";
    const enum bt_status st1 = bt_model_new(&c, &m, err, sizeof err);
    const bool null1 = m == NULL;
    bt_model_config_default(&c);
    c.n_layers = 0;
    struct bt_model *m2 = (struct bt_model *)&c;
    const enum bt_status st2 = bt_model_new(&c, &m2, NULL, 0); /* no buffer: still quiet */
    struct bt_model *m3 = (struct bt_model *)&c;
    char err3[256] = "";
    const enum bt_status st3 = bt_model_new(NULL, &m3, err3, sizeof err3);
    const long printed = tu_stderr_end(&cap);
    ck_assert_int_eq(st1, BT_ERR_INVALID);
    ck_assert(null1);
    ck_assert_str_eq(err, "n_heads = 3: d_model = 64 is not a multiple of it");
    ck_assert_int_eq(st2, BT_ERR_INVALID);
    ck_assert_ptr_null(m2);
    ck_assert_int_eq(st3, BT_ERR_INVALID);
    ck_assert_ptr_null(m3);
    ck_assert_str_eq(err3, "no config");
    ck_assert_int_eq(printed, 0); /* nothing on stderr */
}
END_TEST

int main(void) {
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_new_errors);
    tcase_add_test(tc, test_weights_and_layers);
    tcase_add_test(tc, test_weight_data);
    tcase_add_test(tc, test_graph_structure);
    tcase_add_test(tc, test_ffn_mlp);
    tcase_add_test(tc, test_ffn_dense);
    tcase_add_test(tc, test_ffn_topk);
    tcase_add_test(tc, test_ffn_shared);
    tcase_add_test(tc, test_ffn_q8_0);
    tcase_add_test(tc, test_ffn_top1);
    tcase_add_test(tc, test_ffn_qwen2_moe);
    tcase_add_loop_test(tc, test_forward_reference, 0, BT_FFN_COUNT);
    tcase_add_test(tc, test_deterministic);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
