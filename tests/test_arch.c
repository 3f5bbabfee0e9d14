/* test_arch.c - llama-family models from GGUF (src/model/arch.h) against the
 * independent numpy reference of tests/model_ref.py, which writes a tiny
 * random-weight model of each architecture and its logits:
 *   - logits of a 12-token prompt within 1e-4 (max abs difference over max
 *     abs logit) in F32, within the quantisation's error in Q8_0 and the
 *     table types (MXFP4, IQ4_NL, IQ4_XS, IQ2_XXS .. IQ1_S);
 *   - incremental decoding through the KV cache gives bitwise the logits of
 *     the whole prompt at once, for F16, F32 and Q8_0 caches and any ubatch;
 *   - several sequences decoded together (interleaved in the cache, in one
 *     batch) give bitwise what each gives alone, and removing a sequence
 *     frees its cells for another;
 *   - broken files stop with the exact message (unknown architecture,
 *     missing tensor, wrong shape, deepseek2's older attn_kv_b layout and
 *     expert groups that do not divide the experts, glm4moe's missing
 *     selection bias, too many prediction layers and GLM-4.5V's rope,
 *     minimax-m2's missing selection bias, gating function and output
 *     projection, the experts' two widths that differ and shared experts);
 *   - glm4moe's next-token-prediction layer is in the file but not loaded.
 * Needs python3 with numpy and gguf (launch/bootstrap.sh installs them). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "baton/backend.h"
#include "backend_limited.h"
#include "kv.h"
#include "model/arch.h"
#include "model/arch_impl.h"
#include "model/random_model.h"
#include "testutil.h"

#ifndef BATON_SOURCE_DIR
#error "BATON_SOURCE_DIR must be defined"
#endif

struct ref {
    int n_tok, n_vocab;
    int32_t *tokens;
    float *logits; /* [n_tok][n_vocab] */
    char dir[256], path[300];
};

/* the reference folder: the model, the reference logits, the folder */
static void ref_dir_remove(const char *dir) {
    char p[300];
    snprintf(p, sizeof p, "%s/model.gguf", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/ref.bin", dir);
    unlink(p);
    rmdir(dir);
}

static void make_model(const char *arch, const char *type, const char *brk, struct ref *r) {
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "/tmp/bt_arch_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(r->dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s/tests/model_ref.py %s %s %s %s", BATON_SOURCE_DIR, arch, type, r->dir, brk);
    const int rc = system(cmd);
    if (rc != 0) ref_dir_remove(r->dir); /* leave nothing behind */
    ck_assert_msg(rc == 0, "%s failed (%d): python3 with numpy and gguf 0.19.0 is needed", cmd, rc);
    snprintf(r->path, sizeof r->path, "%s/model.gguf", r->dir);
    if (strcmp(brk, "none") != 0 && strcmp(brk, "long") != 0 && strcmp(brk, "slideall") != 0) return;
    char rp[300];
    snprintf(rp, sizeof rp, "%s/ref.bin", r->dir);
    FILE *f = fopen(rp, "rb");
    ck_assert_ptr_nonnull(f);
    int32_t hdr[2];
    ck_assert_int_eq(fread(hdr, 4, 2, f), 2);
    r->n_tok = hdr[0];
    r->n_vocab = hdr[1];
    r->tokens = malloc((size_t)r->n_tok * 4);
    r->logits = malloc((size_t)r->n_tok * r->n_vocab * 4);
    ck_assert_int_eq(fread(r->tokens, 4, (size_t)r->n_tok, f), (size_t)r->n_tok);
    ck_assert_int_eq(fread(r->logits, 4, (size_t)r->n_tok * r->n_vocab, f), (size_t)r->n_tok * r->n_vocab);
    fclose(f);
}

static void ref_free(struct ref *r) {
    ref_dir_remove(r->dir);
    free(r->tokens);
    free(r->logits);
}

static struct bt_llm *load(const char *path) {
    char err[512];
    struct bt_llm *m = NULL;
    const enum bt_status st = bt_llm_load(path, 0, -1, &m, err, sizeof err);
    ck_assert_msg(st == BT_OK, "load: %s", err);
    return m;
}

static struct bt_llm_ctx *new_ctx(struct bt_llm *m, int64_t n_ctx, int n_seq, int64_t n_ubatch, enum bt_type kv,
                                  int threads) {
    struct bt_llm_ctx_params p;
    bt_llm_ctx_default_params(&p);
    p.n_ctx = n_ctx;
    p.n_seq_max = n_seq;
    p.n_ubatch = n_ubatch;
    p.kv_type = kv;
    p.n_threads = threads;
    char err[512];
    struct bt_llm_ctx *c = NULL;
    ck_assert_msg(bt_llm_ctx_new(m, &p, &c, err, sizeof err) == BT_OK, "ctx: %s", err);
    return c;
}

/* decode tokens[0..n) of sequence seq at positions p0.. in one batch; logits
 * of every token into out[n][V] */
static void decode(struct bt_llm_ctx *c, const int32_t *tokens, int n, int32_t seq, int32_t p0, float *out) {
    int32_t *pos = malloc((size_t)n * 4), *sq = malloc((size_t)n * 4);
    int8_t *lg = malloc((size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        sq[i] = seq;
        lg[i] = 1;
    }
    struct bt_llm_batch b = {n, tokens, pos, sq, lg, BT_LLM_OUT_LOGITS};
    char err[512];
    const enum bt_status st = bt_llm_decode(c, &b, out, err, sizeof err);
    ck_assert_msg(st == BT_OK, "decode: %s", err);
    free(pos);
    free(sq);
    free(lg);
}

static double max_rel(const float *a, const float *r, int64_t n) {
    double md = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - r[i]);
        if (!(d <= md)) md = d; /* NaN wins */
        if (fabs(r[i]) > mr) mr = fabs(r[i]);
    }
    return md / mr;
}

static const char *const ARCHES[] = {"llama",     "llama-moe", "qwen2",      "qwen3",         "qwen2moe",
                                     "qwen3moe",  "olmoe",     "gemma3",     "deepseek2",     "gpt-oss",
                                     "glm4moe",   "minimax-m2", "deepseek2-lite"};
#define N_ARCHES ((int)(sizeof ARCHES / sizeof ARCHES[0]))

static void check_reference_of(const char *arch, const char *type, const char *brk, double tol) {
    struct ref r;
    make_model(arch, type, brk, &r);
    struct bt_llm *m = load(r.path);
    ck_assert_int_eq(bt_llm_hparams(m)->n_vocab, r.n_vocab);
    struct bt_llm_ctx *c = new_ctx(m, 64, 1, 64, BT_TYPE_F32, 2);
    const size_t nl = (size_t)r.n_tok * r.n_vocab;
    float *out = malloc(nl * sizeof *out);
    decode(c, r.tokens, r.n_tok, 0, 0, out);
    const double e = max_rel(out, r.logits, (int64_t)nl);
    ck_assert_msg(e <= tol, "%s %s %s: max |baton - numpy| / max |numpy| = %g > %g", arch, type, brk, e, tol);
    fprintf(stderr, "%-10s %-7s %-8s logits vs numpy reference: relative error %.3g (bound %g)\n", arch, type, brk, e,
            tol);
    free(out);
    bt_llm_ctx_free(c);
    bt_llm_free(m);
    ref_free(&r);
}

static void check_reference(const char *arch, const char *type, double tol) {
    check_reference_of(arch, type, "none", tol);
}

/* Gemma 3 with every layer sliding (a window pattern longer than the model):
 * no layer reads the full layers' cells and mask, which the graph then does
 * not have (a stage of sliding layers only is the same case) */
START_TEST(test_reference_all_sliding) {
    check_reference_of("gemma3", "f32", "slideall", 1e-4);
}
END_TEST

START_TEST(test_reference_f32) {
    check_reference(ARCHES[_i], "f32", 1e-4);
}
END_TEST

START_TEST(test_reference_q8_0) {
    /* the reference multiplies by the dequantised weights in float64; baton
     * also rounds the activations to 8 bits for Q8_0 dot products.  deepseek2
     * rounds them more often (q_a, q_b, the absorbed attn_k_b and attn_v_b)
     * and scales the routed experts by 2.5: measured 1.8e-2 on these models
     * (2.9e-2 on an earlier one); on another such file llama.cpp's Q8_0
     * logits were 1.9e-2 from numpy and baton's 2.2e-2.  glm4moe scales its
     * routed experts by 2.5 too: measured 2.3e-2 */
    const bool ds = strncmp(ARCHES[_i], "deepseek2", 9) == 0 || strcmp(ARCHES[_i], "glm4moe") == 0;
    check_reference(ARCHES[_i], "q8_0", ds ? 4e-2 : 3e-2);
}
END_TEST

/* The table types (MXFP4, IQ4_NL, IQ4_XS and the lattice types), dense and
 * MoE (MUL_MAT and MUL_MAT_ID): the reference multiplies by the weights
 * dequantised by the gguf package; baton dots them with 8-bit activations
 * (Q8_0 or Q8_K columns).  Measured here 1.3e-2 to 4.7e-2 (per token up to
 * 6.4e-2 once, a MoE token; the models of the 256-element types are 256
 * wide); a wrong scale or sign in a kernel is an error of order 1, and
 * test_quants checks every dot to 1e-5 of the dequantised one. */
static const char *const IQ_TYPES[] = {"mxfp4", "iq4_nl", "iq4_xs", "iq2_xxs", "iq2_xs",
                                       "iq2_s", "iq3_xxs", "iq3_s", "iq1_s"};
#define N_IQ_TYPES ((int)(sizeof IQ_TYPES / sizeof IQ_TYPES[0]))
START_TEST(test_reference_iq) {
    check_reference(_i % 2 ? "qwen3moe" : "llama", IQ_TYPES[_i / 2], 6e-2);
}
END_TEST

/* gpt-oss as its files come: MXFP4 experts (MUL_MAT_ID against Q8_0
 * columns), the other matrices f32; measured 1.2e-2 (the activations'
 * 8 bits, as the table types above) */
START_TEST(test_reference_gpt_oss_mxfp4) {
    check_reference("gpt-oss", "mxfp4", 3e-2);
}
END_TEST

/* whole prompt at once vs token by token vs ubatches of 5, for one cache type */
static void check_incremental(const char *arch, enum bt_type kv) {
    struct ref r;
    make_model(arch, "f32", "none", &r);
    struct bt_llm *m = load(r.path);
    const int n = r.n_tok, V = r.n_vocab;
    float *whole = malloc((size_t)n * V * 4), *inc = malloc((size_t)n * V * 4);
    struct bt_llm_ctx *c = new_ctx(m, 64, 1, 64, kv, 2);
    decode(c, r.tokens, n, 0, 0, whole);
    bt_llm_ctx_free(c);

    c = new_ctx(m, 64, 1, 64, kv, 3);
    for (int i = 0; i < n; i++) decode(c, r.tokens + i, 1, 0, i, inc + (size_t)i * V);
    ck_assert_msg(memcmp(whole, inc, (size_t)n * V * 4) == 0, "%s kv %s: token by token differs from at once", arch,
                  bt_type_name(kv));
    bt_llm_ctx_free(c);

    c = new_ctx(m, 64, 1, 5, kv, 1); /* ubatches of 5, 5, 2 */
    memset(inc, 0, (size_t)n * V * 4);
    decode(c, r.tokens, n, 0, 0, inc);
    ck_assert_msg(memcmp(whole, inc, (size_t)n * V * 4) == 0, "%s kv %s: ubatches of 5 differ", arch, bt_type_name(kv));
    ck_assert_int_eq(bt_llm_ctx_n_graphs(c), 2); /* [5 tokens] reused, [2 tokens] */
    bt_llm_ctx_free(c);

    free(whole);
    free(inc);
    bt_llm_free(m);
    ref_free(&r);
}

START_TEST(test_incremental_bitwise) {
    check_incremental(ARCHES[_i], BT_TYPE_F16);
}
END_TEST

START_TEST(test_incremental_kv_types) {
    check_incremental("qwen3moe", BT_TYPE_F32);
    check_incremental("qwen3", BT_TYPE_Q8_0); /* head_dim 32: whole Q8_0 blocks */
    check_incremental("deepseek2", BT_TYPE_Q8_0); /* the latent cache: K 64 + 32, V 64 */
}
END_TEST

/* A stage on a backend that cannot run some of its ops (the tests'
 * "cpu-limited", as a GPU: the weights and the cache in its own memory, a
 * buffer type the CPU cannot use) runs those nodes on the CPU backend the
 * stage starts beside it, the scheduler copying their inputs across and the
 * results back; every row's logits are bitwise those of a CPU stage, and
 * the limited backend did compute the rest. */
START_TEST(test_stage_fallback) {
    struct ref r;
    make_model("qwen3moe", "f32", "none", &r);
    char err[512];
    struct bt_llm *m = load(r.path);
    const int n = r.n_tok, V = r.n_vocab;
    float *want = malloc((size_t)n * V * sizeof *want), *got = malloc((size_t)n * V * sizeof *got);
    struct bt_llm_ctx *c = new_ctx(m, 64, 1, 64, BT_TYPE_F32, 1);
    decode(c, r.tokens, n, 0, 0, want);
    bt_llm_ctx_free(c);
    bt_llm_free(m);

    const enum bt_op refused[] = {BT_OP_FLASH_ATTN, BT_OP_ARGSORT, BT_OP_SOFT_MAX};
    bt_backend_t lim = bt_backend_limited_init("LIMITED0", 1, refused, 3);
    ck_assert_ptr_nonnull(lim);
    bt_buffer_type_t buft = bt_backend_get_default_buffer_type(lim);
    struct bt_gguf *g = NULL;
    ck_assert_msg(bt_gguf_open(r.path, &g, err, sizeof err) == BT_OK, "%s", err);
    struct bt_llm *dm = NULL;
    ck_assert_msg(bt_llm_load_gguf(g, 0, -1, buft, false, &dm, err, sizeof err) == BT_OK, "%s", err);
    struct bt_kv_config kc;
    bt_llm_kv_config(dm, 64, 1, 64, BT_TYPE_F32, &kc);
    kc.buft = buft;
    struct bt_kv *kv = NULL;
    ck_assert_msg(bt_kv_new(&kc, &kv, err, sizeof err) == BT_OK, "kv: %s", err);
    struct bt_llm_stage *st = NULL;
    ck_assert_msg(bt_llm_stage_new(dm, kv, lim, 64, &st, err, sizeof err) == BT_OK, "stage: %s", err);
    int32_t *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4), *cells = malloc((size_t)n * 4),
            *rows = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    ck_assert(bt_kv_place(kv, n, seq, pos, cells, err, sizeof err) == BT_OK);
    bt_backend_limited_reset_stats(lim);
    ck_assert_msg(bt_llm_stage_run(st, n, r.tokens, NULL, pos, seq, cells, n, rows, got, err, sizeof err) == BT_OK,
                  "run: %s", err);
    ck_assert_msg(memcmp(want, got, (size_t)n * V * sizeof *got) == 0, "logits differ from the CPU stage's");
    const struct bt_limited_stats ls = bt_backend_limited_stats(lim);
    ck_assert_uint_gt(ls.nodes_computed, 0); /* the device ran what it could... */
    ck_assert_uint_gt(ls.graph_computes, 1); /* ...in several splits, the refused ops between them */
    free(pos);
    free(seq);
    free(cells);
    free(rows);
    bt_llm_stage_free(st);
    bt_kv_free(kv);
    bt_llm_free(dm);
    bt_gguf_close(g);
    bt_backend_free(lim);
    free(want);
    free(got);
    ref_free(&r);
}
END_TEST

/* A model loaded into the CPU's weight buffer type (bt_llm_load_gguf with
 * bt_backend_get_weight_buffer_type: the repack buffer type) has its Q8_0
 * matrices repacked as their bytes are set, and a CPU stage over it gives
 * bitwise the logits of the plain model's. */
START_TEST(test_load_repacked) {
    struct ref r;
    make_model("qwen3moe", "q8_0", "none", &r);
    char err[512];
    struct bt_llm *m = load(r.path);
    ck_assert_uint_eq(m->repacked_bytes, 0);
    const int n = r.n_tok, V = r.n_vocab;
    float *want = malloc((size_t)n * V * sizeof *want), *got = malloc((size_t)n * V * sizeof *got);
    struct bt_llm_ctx *c = new_ctx(m, 64, 1, 64, BT_TYPE_F32, 1);
    decode(c, r.tokens, n, 0, 0, want);
    bt_llm_ctx_free(c);
    bt_llm_free(m);

    bt_backend_t be = bt_backend_cpu_init(1);
    ck_assert_ptr_nonnull(be);
    struct bt_gguf *g = NULL;
    ck_assert_msg(bt_gguf_open(r.path, &g, err, sizeof err) == BT_OK, "%s", err);
    struct bt_llm *dm = NULL;
    ck_assert_msg(bt_llm_load_gguf(g, 0, -1, bt_backend_get_weight_buffer_type(be), false, &dm, err, sizeof err) ==
                      BT_OK,
                  "%s", err);
    if (bt_cpu_weight_repack_available(BT_TYPE_Q8_0))
        ck_assert_uint_gt(dm->repacked_bytes, 0);
    else
        ck_assert_uint_eq(dm->repacked_bytes, 0);
    struct bt_kv_config kc;
    bt_llm_kv_config(dm, 64, 1, 64, BT_TYPE_F32, &kc);
    struct bt_kv *kv = NULL;
    ck_assert_msg(bt_kv_new(&kc, &kv, err, sizeof err) == BT_OK, "kv: %s", err);
    struct bt_llm_stage *st = NULL;
    ck_assert_msg(bt_llm_stage_new(dm, kv, be, 64, &st, err, sizeof err) == BT_OK, "stage: %s", err);
    int32_t *pos = malloc((size_t)n * 4), *seq = calloc((size_t)n, 4), *cells = malloc((size_t)n * 4),
            *rows = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    ck_assert(bt_kv_place(kv, n, seq, pos, cells, err, sizeof err) == BT_OK);
    ck_assert_msg(bt_llm_stage_run(st, n, r.tokens, NULL, pos, seq, cells, n, rows, got, err, sizeof err) == BT_OK,
                  "run: %s", err);
    ck_assert_msg(memcmp(want, got, (size_t)n * V * sizeof *got) == 0, "repacked logits differ from the plain ones");
    free(pos);
    free(seq);
    free(cells);
    free(rows);
    bt_llm_stage_free(st);
    bt_kv_free(kv);
    bt_llm_free(dm);
    bt_gguf_close(g);
    bt_backend_free(be);
    free(want);
    free(got);
    ref_free(&r);
}
END_TEST

/* Graphs are reused while the shape repeats on every range, the last or
 * not, and a ubatch that asks for no rows of logits has no output
 * projection (only the rows asked for reach it) without changing the bits
 * of the rows asked for later. */
START_TEST(test_stage_graphs) {
    struct ref r;
    make_model("llama", "f32", "none", &r);
    char err[512];
    struct bt_llm *m = load(r.path);
    const int L = bt_llm_hparams(m)->n_layer, n = r.n_tok, V = r.n_vocab;
    ck_assert_int_ge(L, 2);
    /* a first range without the last layer: three ubatches of 3 tokens in
     * one 32-cell window of the cache, one graph */
    struct bt_llm *part = NULL;
    ck_assert_msg(bt_llm_load(r.path, 0, 1, &part, err, sizeof err) == BT_OK, "load: %s", err);
    struct bt_kv_config kc;
    bt_llm_kv_config(part, 64, 1, 64, BT_TYPE_F16, &kc);
    struct bt_kv *kv = NULL;
    ck_assert_msg(bt_kv_new(&kc, &kv, err, sizeof err) == BT_OK, "kv: %s", err);
    bt_backend_t be = bt_backend_cpu_init(1);
    ck_assert_ptr_nonnull(be);
    struct bt_llm_stage *st = NULL;
    ck_assert_msg(bt_llm_stage_new(part, kv, be, 4, &st, err, sizeof err) == BT_OK, "stage: %s", err);
    const int64_t d = bt_llm_hparams(part)->n_embd;
    float *x = malloc((size_t)(3 * d) * sizeof *x);
    for (int u = 0; u < 3; u++) {
        const int32_t pos[3] = {3 * u, 3 * u + 1, 3 * u + 2}, seq[3] = {0, 0, 0};
        int32_t cells[3];
        ck_assert(bt_kv_place(kv, 3, seq, pos, cells, err, sizeof err) == BT_OK);
        ck_assert_msg(bt_llm_stage_run(st, 3, r.tokens + 3 * u, NULL, pos, seq, cells, 0, NULL, x, err, sizeof err) ==
                          BT_OK,
                      "run: %s", err);
    }
    ck_assert_int_eq(bt_llm_stage_n_graphs(st), 1);
    free(x);
    bt_llm_stage_free(st);
    bt_kv_free(kv);
    bt_backend_free(be);
    bt_llm_free(part);

    /* the last range: no rows asked, no output projection */
    struct bt_llm_ctx *c = new_ctx(m, 64, 1, 64, BT_TYPE_F32, 1);
    for (int rows = 0; rows <= 1; rows++) {
        bt_context *gctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(m), NULL, true});
        ck_assert_ptr_nonnull(gctx);
        struct bt_llm_graph g;
        ck_assert(bt_llm_build_graph(m, bt_llm_ctx_kv(c), gctx, 4, 32, rows, &g) == BT_OK);
        bool proj = false;
        for (int i = 0; i < g.graph->n_nodes; i++) proj |= strcmp(g.graph->nodes[i]->name, "result_output") == 0;
        ck_assert_msg(proj == (rows > 0), "%d rows asked: output projection %s", rows, proj ? "built" : "missing");
        ck_assert_int_eq(g.n_out, rows);
        bt_free(gctx);
    }
    /* the prompt in ubatches of 5 asking only for its last row: that row's
     * logits are the bits of the whole prompt's */
    float *whole = malloc((size_t)n * V * 4), *last = malloc((size_t)V * 4);
    decode(c, r.tokens, n, 0, 0, whole);
    bt_llm_ctx_free(c);
    c = new_ctx(m, 64, 1, 5, BT_TYPE_F32, 1);
    int32_t *pos = malloc((size_t)n * 4), *sq = malloc((size_t)n * 4);
    int8_t *lg = calloc((size_t)n, 1);
    for (int i = 0; i < n; i++) pos[i] = i, sq[i] = 0;
    lg[n - 1] = 1;
    const struct bt_llm_batch b = {n, r.tokens, pos, sq, lg, BT_LLM_OUT_LOGITS};
    ck_assert_msg(bt_llm_decode(c, &b, last, err, sizeof err) == BT_OK, "decode: %s", err);
    ck_assert_msg(memcmp(last, whole + (size_t)(n - 1) * V, (size_t)V * 4) == 0, "the last row differs");
    bt_llm_ctx_free(c);
    free(pos);
    free(sq);
    free(lg);
    free(whole);
    free(last);
    bt_llm_free(m);
    ref_free(&r);
}
END_TEST

/* three sequences (different prompts) alone, then together: prompts in one
 * batch, then decode steps of all three in one batch */
START_TEST(test_sequences_bitwise) {
    const char *arch = ARCHES[_i];
    struct ref r;
    make_model(arch, "f32", "none", &r);
    struct bt_llm *m = load(r.path);
    const int V = r.n_vocab, NS = 3, NP = 5, ND = 4;
    int32_t prompts[3][9];
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < NP + ND; i++) prompts[s][i] = r.tokens[(i + 3 * s) % r.n_tok];
    float alone[3][9][100], together[3][9][100];
    ck_assert_int_le(V, 100);
    for (int s = 0; s < NS; s++) {
        struct bt_llm_ctx *c = new_ctx(m, 64, NS, 64, BT_TYPE_F16, 2);
        decode(c, prompts[s], NP, s, 0, &alone[s][0][0]);
        for (int i = NP; i < NP + ND; i++) decode(c, &prompts[s][i], 1, s, i, &alone[s][i][0]);
        bt_llm_ctx_free(c);
    }
    struct bt_llm_ctx *c = new_ctx(m, 64, NS, 64, BT_TYPE_F16, 3);
    /* an unrelated sequence first, removed: its cells are reused */
    decode(c, r.tokens, 7, 2, 0, &together[0][0][0]);
    ck_assert_int_eq(bt_kv_seq_rm(bt_llm_ctx_kv(c), 2), 7);
    ck_assert_int_eq(bt_kv_n_used(bt_llm_ctx_kv(c)), 0);
    {
        int32_t tok[15], pos[15], seq[15];
        int8_t lg[15];
        for (int i = 0; i < NS * NP; i++) { /* interleaved: s0 p0, s1 p0, s2 p0, s0 p1, ... */
            const int s = i % NS, p = i / NS;
            tok[i] = prompts[s][p];
            pos[i] = p;
            seq[i] = s;
            lg[i] = 1;
        }
        float out[15][100];
        struct bt_llm_batch b = {NS * NP, tok, pos, seq, lg, BT_LLM_OUT_LOGITS};
        char err[512];
        ck_assert_msg(bt_llm_decode(c, &b, &out[0][0], err, sizeof err) == BT_OK, "%s", err);
        for (int i = 0; i < NS * NP; i++) memcpy(together[i % NS][i / NS], out[i], (size_t)V * 4);
    }
    for (int step = NP; step < NP + ND; step++) {
        int32_t tok[3], pos[3], seq[3];
        int8_t lg[3] = {1, 1, 1};
        for (int s = 0; s < NS; s++) {
            tok[s] = prompts[NS - 1 - s][step]; /* another order in the batch */
            pos[s] = step;
            seq[s] = NS - 1 - s;
        }
        float out[3][100];
        struct bt_llm_batch b = {NS, tok, pos, seq, lg, BT_LLM_OUT_LOGITS};
        char err[512];
        ck_assert_msg(bt_llm_decode(c, &b, &out[0][0], err, sizeof err) == BT_OK, "%s", err);
        for (int s = 0; s < NS; s++) memcpy(together[NS - 1 - s][step], out[s], (size_t)V * 4);
    }
    for (int s = 0; s < NS; s++)
        for (int i = 0; i < NP + ND; i++)
            ck_assert_msg(memcmp(alone[s][i], together[s][i], (size_t)V * 4) == 0,
                          "%s: sequence %d token %d differs together from alone", arch, s, i);
    /* removing a sequence frees its cells */
    ck_assert_int_eq(bt_kv_seq_rm(bt_llm_ctx_kv(c), 1), NP + ND);
    ck_assert_int_eq(bt_kv_n_used(bt_llm_ctx_kv(c)), 2 * (NP + ND));
    ck_assert_int_eq(bt_kv_seq_pos_max(bt_llm_ctx_kv(c), 1), -1);
    ck_assert_int_eq(bt_kv_seq_pos_max(bt_llm_ctx_kv(c), 0), NP + ND - 1);
    bt_llm_ctx_free(c);
    bt_llm_free(m);
    ref_free(&r);
}
END_TEST

/* Gemma 3's sliding layers over an 80-token prompt (window 4): with a ring
 * (ubatches of 5: 32 cells, wrapped twice) and without (a ubatch as large as
 * the context), each within 1e-4 of the numpy reference; token by token
 * gives the ring's bits; two sequences sharing the cache give each one's
 * bits alone; the ring takes less memory; a position too far behind its
 * sequence is refused. */
START_TEST(test_sliding_window_ring) {
    const char *arch = _i ? "gpt-oss" : "gemma3"; /* both: layer 0 slides over 4 tokens, layer 1 is global */
    struct ref r;
    make_model(arch, "f32", "long", &r);
    struct bt_llm *m = load(r.path);
    const int n = r.n_tok, V = r.n_vocab;
    ck_assert_int_eq(n, 80);
    float *full = malloc((size_t)n * V * 4), *ring = malloc((size_t)n * V * 4), *inc = malloc((size_t)n * V * 4);
    struct bt_llm_ctx *c = new_ctx(m, 128, 1, 128, BT_TYPE_F32, 2);
    decode(c, r.tokens, n, 0, 0, full);
    const size_t bytes_full = bt_kv_bytes(bt_llm_ctx_kv(c));
    bt_llm_ctx_free(c);
    double e = max_rel(full, r.logits, (int64_t)n * V);
    ck_assert_msg(e <= 1e-4, "without a ring: %g", e);
    fprintf(stderr, "%s 80 tokens, window 4, no ring: relative error %.3g\n", arch, e);

    c = new_ctx(m, 128, 1, 5, BT_TYPE_F32, 2);
    decode(c, r.tokens, n, 0, 0, ring);
    const size_t bytes_ring = bt_kv_bytes(bt_llm_ctx_kv(c));
    e = max_rel(ring, r.logits, (int64_t)n * V);
    ck_assert_msg(e <= 1e-4, "with a ring: %g", e);
    fprintf(stderr, "%s 80 tokens, window 4, ring of 32: relative error %.3g; cache %zu bytes, %zu without\n", arch,
            e, bytes_ring, bytes_full);
    /* layer 0 slides (32 cells), layer 1 is global (128): 2 * 32 * 4 bytes a row */
    ck_assert_uint_eq(bytes_full, 2 * 128 * 2 * 256);
    ck_assert_uint_eq(bytes_ring, (32 + 128) * 2 * 256);
    /* a position too far behind the highest: what it would see is gone */
    {
        const int32_t tok = r.tokens[0], seq = 0, far = 200, behind = 150;
        int32_t cell;
        char err[512];
        ck_assert_int_eq(bt_kv_place(bt_llm_ctx_kv(c), 1, &seq, &far, &cell, err, sizeof err), BT_OK);
        ck_assert_int_eq(bt_kv_place(bt_llm_ctx_kv(c), 1, &seq, &behind, &cell, err, sizeof err), BT_ERR_INVALID);
        ck_assert_str_eq(err, "token 0: sequence 0 position 150 is more than 28 behind its position 200: the sliding "
                              "window's ring of 32 cells no longer holds what it would see");
        (void)tok;
    }
    bt_llm_ctx_free(c);

    c = new_ctx(m, 128, 1, 5, BT_TYPE_F32, 3);
    for (int i = 0; i < n; i++) decode(c, r.tokens + i, 1, 0, i, inc + (size_t)i * V);
    ck_assert_msg(memcmp(ring, inc, (size_t)n * V * 4) == 0, "ring: token by token differs from at once");
    bt_llm_ctx_free(c);

    /* two sequences in one cache (regions of 128 cells, rings of 32):
     * sequence 1 with sequence 0's tokens interleaved gives its bits alone */
    c = new_ctx(m, 256, 2, 5, BT_TYPE_F32, 2);
    decode(c, r.tokens, n, 1, 0, ring);
    bt_llm_ctx_free(c);
    c = new_ctx(m, 256, 2, 5, BT_TYPE_F32, 1);
    for (int i0 = 0; i0 < n; i0 += 4) {
        int32_t tok[8], pos[8], seq[8];
        int8_t lg[8];
        for (int k = 0; k < 8; k++) {
            const int i = i0 + k / 2;
            tok[k] = k % 2 ? r.tokens[i] : r.tokens[n - 1 - i];
            pos[k] = i;
            seq[k] = k % 2;
            lg[k] = 1;
        }
        float out[8][100];
        struct bt_llm_batch b = {8, tok, pos, seq, lg, BT_LLM_OUT_LOGITS};
        char err[512];
        ck_assert_msg(bt_llm_decode(c, &b, &out[0][0], err, sizeof err) == BT_OK, "%s", err);
        for (int k = 1; k < 8; k += 2) memcpy(inc + (size_t)(i0 + k / 2) * V, out[k], (size_t)V * 4);
    }
    ck_assert_msg(memcmp(ring, inc, (size_t)n * V * 4) == 0, "ring: sequence 1 differs beside sequence 0");
    bt_llm_ctx_free(c);
    free(full);
    free(ring);
    free(inc);
    bt_llm_free(m);
    ref_free(&r);
}
END_TEST

static void check_broken(const char *arch, const char *brk, enum bt_status want, const char *msg) {
    struct ref r;
    make_model(arch, "f32", brk, &r);
    char err[512] = "";
    struct bt_llm *m = (struct bt_llm *)1;
    const enum bt_status st = bt_llm_load(r.path, 0, -1, &m, err, sizeof err);
    ck_assert_int_eq(st, want);
    ck_assert_ptr_null(m);
    char full[700];
    snprintf(full, sizeof full, "%s: %s", r.path, msg);
    ck_assert_str_eq(err, full);
    ref_free(&r);
}

START_TEST(test_broken_files) {
    check_broken("qwen2", "arch", BT_ERR_UNSUPPORTED,
                 "architecture \"gpt9\" is not supported (baton knows llama, qwen2, qwen3, qwen2moe, qwen3moe, olmoe, "
                 "gemma3, deepseek2, gpt-oss, glm4moe, minimax-m2)");
    check_broken("llama", "missing", BT_ERR_INVALID, "tensor \"blk.1.attn_k.weight\" is missing (expected [64, 32])");
    check_broken("llama", "shape", BT_ERR_INVALID,
                 "tensor \"blk.0.ffn_up.weight\" has shape [64, 64], expected [64, 96]");
    check_broken("olmoe", "shape", BT_ERR_INVALID,
                 "tensor \"blk.0.ffn_up_exps.weight\" has shape [64, 16, 4], expected [64, 32, 4]");
    check_broken("deepseek2", "missing", BT_ERR_INVALID,
                 "tensor \"blk.1.attn_k_b.weight\" is missing (expected [32, 64, 4])");
    check_broken("deepseek2", "legacy", BT_ERR_UNSUPPORTED,
                 "the older MLA layout (attn_kv_b, no key deepseek2.attention.key_length_mla) is not supported; "
                 "convert the model again with today's convert_hf_to_gguf.py (attn_k_b, attn_v_b)");
    check_broken("deepseek2", "groups", BT_ERR_INVALID,
                 "keys deepseek2.expert_group_count = 3, expert_group_used_count = 1: 4 experts do not make groups of "
                 "2 or more, 2 of them in the groups used");
    check_broken("deepseek2", "geometry", BT_ERR_INVALID,
                 "deepseek2's latent attention needs head_count_kv 1 (is 1), key_length = kv_lora_rank + "
                 "rope.dimension_count (97, 64 + 32), value_length = kv_lora_rank (64) and key_length_mla (64) > "
                 "rope.dimension_count");
    check_broken("deepseek2-lite", "yarn", BT_ERR_INVALID, "key deepseek2.rope.scaling.yarn_log_multiplier is missing");
    check_broken("gpt-oss", "missing", BT_ERR_INVALID, "tensor \"blk.1.attn_k.weight\" is missing (expected [64, 64])");
    check_broken("gpt-oss", "sinks", BT_ERR_INVALID, "tensor \"blk.0.attn_sinks.weight\" is missing (expected [4])");
    check_broken("gpt-oss", "nowindow", BT_ERR_INVALID, "key gpt-oss.attention.sliding_window is missing");
    check_broken("glm4moe", "missing", BT_ERR_INVALID, "tensor \"blk.1.attn_k.weight\" is missing (expected [64, 64])");
    check_broken("glm4moe", "shape", BT_ERR_INVALID,
                 "tensor \"blk.0.ffn_up.weight\" has shape [64, 64], expected [64, 96]");
    check_broken("glm4moe", "probsb", BT_ERR_INVALID, "tensor \"blk.1.exp_probs_b.bias\" is missing (expected [4])");
    check_broken("glm4moe", "nextn", BT_ERR_INVALID, "key glm4moe.nextn_predict_layers = 3 out of [0, 2]");
    check_broken("glm4moe", "mrope", BT_ERR_UNSUPPORTED,
                 "key glm4moe.rope.dimension_sections (GLM-4.5V's multimodal rope) is not supported");
    check_broken("minimax-m2", "missing", BT_ERR_INVALID,
                 "tensor \"blk.1.attn_k.weight\" is missing (expected [64, 64])");
    check_broken("minimax-m2", "shape", BT_ERR_INVALID,
                 "tensor \"blk.0.ffn_up_exps.weight\" has shape [64, 16, 4], expected [64, 32, 4]");
    check_broken("minimax-m2", "probsb", BT_ERR_INVALID, "tensor \"blk.1.exp_probs_b.bias\" is missing (expected [4])");
    check_broken("minimax-m2", "tied", BT_ERR_INVALID, "tensor \"output.weight\" is missing (expected [64, 100])");
    check_broken("minimax-m2", "gating", BT_ERR_INVALID, "key minimax-m2.expert_gating_func is missing");
    check_broken("minimax-m2", "ffwidth", BT_ERR_INVALID,
                 "key minimax-m2.feed_forward_length (96, the experts' width) is not expert_feed_forward_length (32)");
    check_broken("minimax-m2", "shared", BT_ERR_UNSUPPORTED,
                 "key minimax-m2.expert_shared_count = 1 is not supported (MiniMax-M2 has none; llama.cpp's "
                 "minimax-m2 does not read it)");
}
END_TEST

/* GLM-4.5's file counts its next-token-prediction layer in block_count
 * (3): the model has the 2 others; the third layer's tensors stay in the
 * file, neither expected nor loaded. */
START_TEST(test_glm4moe_nextn) {
    struct ref r;
    make_model("glm4moe", "f32", "none", &r);
    char err[512];
    struct bt_gguf *g = NULL;
    ck_assert_msg(bt_gguf_open(r.path, &g, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_int_eq(bt_gguf_n_layers(g), 3);
    ck_assert_int_ge(bt_gguf_find_tensor(g, "blk.2.nextn.eh_proj.weight"), 0);
    struct bt_llm *m = NULL;
    ck_assert_msg(bt_llm_load_gguf(g, 0, -1, NULL, false, &m, err, sizeof err) == BT_OK, "%s", err);
    const struct bt_hparams *hp = bt_llm_hparams(m);
    ck_assert_int_eq(hp->n_layer, 2);
    ck_assert_int_eq(hp->n_rot, 16);
    ck_assert_int_eq(hp->n_layer_dense_lead, 1);
    ck_assert(hp->moe_sigmoid && hp->moe_norm_w && hp->moe_w_scale == 2.5f && hp->n_expert_shared == 1);
    ck_assert_ptr_nonnull(bt_llm_layer(m, 1)->ffn_exp_probs_b);
    ck_assert_ptr_nonnull(bt_llm_layer(m, 1)->q_norm);
    /* the weights are the globals' and the two layers', not the third's */
    const uint64_t want = bt_gguf_layer_bytes(g, -1) + bt_gguf_layer_bytes(g, 0) + bt_gguf_layer_bytes(g, 1);
    ck_assert_uint_ge(bt_llm_weight_bytes(m), want);
    ck_assert_uint_lt(bt_llm_weight_bytes(m), want + bt_gguf_layer_bytes(g, 2) / 2);
    bt_llm_free(m);
    bt_gguf_close(g);
    ref_free(&r);
}
END_TEST

/* The random-weight model: made in memory, written to a file, or its header
 * alone: the same bytes and tensor table, loadable, its options checked. */
START_TEST(test_random_model) {
    static const char *const archs[] = {"llama",  "qwen2",     "qwen3",   "qwen2moe", "qwen3moe",  "olmoe",
                                        "gemma3", "deepseek2", "gpt-oss", "glm4moe",  "minimax-m2"};
    char err[512];
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        struct bt_random_model rm;
        bt_random_model_default(&rm);
        rm.arch = archs[a];
        rm.n_layer = 2;
        rm.n_embd = 64;
        rm.type = a % 2 ? BT_TYPE_Q8_0 : BT_TYPE_F16;
        struct bt_gguf *g = NULL, *h = NULL;
        void *bytes = NULL, *header = NULL;
        ck_assert_msg(bt_random_model_open(&rm, 0, &g, &bytes, err, sizeof err) == BT_OK, "%s: %s", archs[a], err);
        struct bt_llm *m = NULL;
        ck_assert_msg(bt_llm_load_gguf(g, 0, -1, NULL, false, &m, err, sizeof err) == BT_OK, "%s", err);
        const struct bt_hparams *hp = bt_llm_hparams(m);
        ck_assert_int_eq(hp->n_layer, 2);
        ck_assert_int_eq(hp->n_embd, 64);
        ck_assert_int_eq(hp->n_vocab, rm.n_vocab);
        ck_assert_int_eq(hp->n_expert, (a >= 3 && a <= 5) || a == 0 || a >= 7 ? rm.n_expert : 0);
        if (a == 7) { /* V3's proportions to a head of 32: the cache's one latent head of 128 + 16 */
            ck_assert_int_eq(hp->n_head_kv, 1);
            ck_assert_int_eq(hp->head_dim, 144);
            ck_assert_int_eq(hp->n_lora_q, 384);
            ck_assert_int_eq(hp->n_layer_dense_lead, 1);
            ck_assert(hp->kv_v_in_k && hp->moe_sigmoid && hp->moe_norm_w && hp->moe_w_scale == 2.5f);
        }
        if (a == 9) { /* GLM-4.5's form: rope over half a head, the first layer dense, one shared expert */
            ck_assert_int_eq(hp->n_rot, 16);
            ck_assert_int_eq(hp->n_layer_dense_lead, 1);
            ck_assert(hp->moe_sigmoid && hp->moe_norm_w && hp->moe_w_scale == 2.5f && hp->n_expert_shared == 1);
            ck_assert_ptr_nonnull(bt_llm_layer(m, 1)->bq);
            ck_assert_ptr_nonnull(bt_llm_layer(m, 1)->ffn_exp_probs_b);
            ck_assert_ptr_nonnull(bt_llm_layer(m, 1)->ffn_gate_shexp);
        }
        if (a == 10) { /* MiniMax-M2's form: rope over half a head, whole-q/k norms, every layer MoE, untied */
            ck_assert_int_eq(hp->n_rot, 16);
            ck_assert_int_eq(hp->n_layer_dense_lead, 0);
            ck_assert(hp->moe_sigmoid && hp->moe_norm_w && hp->moe_w_scale == 1.0f && hp->n_expert_shared == 0);
            ck_assert(!hp->tied_output && m->gl.output != NULL);
            ck_assert_int_eq(bt_llm_layer(m, 0)->q_norm->ne[0], hp->n_head * hp->head_dim);
            ck_assert_int_eq(bt_llm_layer(m, 0)->k_norm->ne[0], hp->n_head_kv * hp->head_dim);
            ck_assert_ptr_nonnull(bt_llm_layer(m, 0)->ffn_exp_probs_b);
            ck_assert_ptr_null(bt_llm_layer(m, 0)->bq);
            ck_assert_ptr_null(bt_llm_layer(m, 0)->ffn_gate_shexp);
        }
        const bool sliding = strcmp(archs[a], "gemma3") == 0 || strcmp(archs[a], "gpt-oss") == 0;
        ck_assert_int_eq(hp->n_swa, sliding ? rm.n_swa : 0);
        /* the file writer gives the same bytes */
        char dir[] = "/tmp/bt_rm_XXXXXX", path[64];
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/m.gguf", dir);
        struct bt_gguf_writer *w = NULL;
        ck_assert_int_eq(bt_gguf_writer_open(path, &w, err, sizeof err), BT_OK);
        ck_assert_int_eq(bt_random_model_write(&rm, NULL, w, err, sizeof err), BT_OK);
        ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
        FILE *f = fopen(path, "rb");
        ck_assert_ptr_nonnull(f);
        const uint64_t size = bt_gguf_file_size(g);
        uint8_t *file = malloc(size + 1);
        ck_assert_uint_eq(fread(file, 1, size + 1, f), size);
        fclose(f);
        ck_assert_int_eq(memcmp(file, bytes, size), 0);
        free(file);
        unlink(path);
        rmdir(dir);
        /* the header alone: the same table and size, described without data */
        ck_assert_int_eq(bt_random_model_describe(&rm, &h, &header, err, sizeof err), BT_OK);
        ck_assert_uint_eq(bt_gguf_file_size(h), size);
        ck_assert_int_eq(bt_gguf_n_tensors(h), bt_gguf_n_tensors(g));
        for (int64_t i = 0; i < bt_gguf_n_tensors(g); i++) {
            const struct bt_gguf_tensor *x = bt_gguf_tensor(g, i), *y = bt_gguf_tensor(h, i);
            ck_assert_str_eq(x->name, y->name);
            ck_assert_uint_eq(x->ggml_type, y->ggml_type);
            ck_assert_uint_eq(x->file_offset, y->file_offset);
        }
        struct bt_llm *d = NULL;
        ck_assert_int_eq(bt_llm_describe_gguf(h, &d, err, sizeof err), BT_OK);
        bt_llm_free(d);
        bt_llm_free(m);
        bt_gguf_close(h);
        bt_gguf_close(g);
        free(header);
        free(bytes);
    }
    /* a model larger than the memory allowed is refused before it is made */
    {
        struct bt_random_model rm;
        bt_random_model_default(&rm);
        struct bt_gguf *g = NULL;
        void *bytes = NULL;
        ck_assert_int_eq(bt_random_model_open(&rm, 1 << 20, &g, &bytes, err, sizeof err), BT_ERR_NOMEM);
        ck_assert_ptr_null(g);
        ck_assert_ptr_null(bytes);
        ck_assert_msg(strstr(err, "the built-in model is ") && strstr(err, "more than the 1.0 MiB a rank may use here"),
                      "%s", err);
    }
    /* options that do not fit each other: one message naming them */
    struct bt_random_model rm;
    bt_random_model_default(&rm);
    rm.n_head_kv = 3;
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--heads 4 is not a multiple of --heads-kv 3");
    bt_random_model_default(&rm);
    rm.head_dim = 31;
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--head-dim 31: must be even (rotary pairs)");
    bt_random_model_default(&rm);
    rm.n_expert_used = 9;
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--experts-used 9 is more than --experts 8");
    bt_random_model_default(&rm);
    rm.n_expert = 0;
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--experts 0: qwen3moe is a MoE architecture");
    bt_random_model_default(&rm);
    rm.type = BT_TYPE_Q8_0;
    rm.n_embd = 48;
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--type q8_0: --embd, --ff, --ff-exp and --heads x --head-dim must be multiples of 32");
    bt_random_model_default(&rm);
    rm.arch = "gpt9";
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err,
                     "--arch: 'gpt9' is not one of llama, qwen2, qwen3, qwen2moe, qwen3moe, olmoe, gemma3, deepseek2, "
                     "gpt-oss, glm4moe, minimax-m2");
    rm.arch = "deepseek2";
    rm.head_dim = 34;
    ck_assert_int_eq(bt_random_model_check(&rm, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--head-dim 34: deepseek2's rope part (half a head) must be even");
}
END_TEST

START_TEST(test_batch_errors) {
    struct ref r;
    make_model("llama", "f32", "none", &r);
    struct bt_llm *m = load(r.path);
    struct bt_llm_ctx *c = new_ctx(m, 8, 2, 8, BT_TYPE_F16, 1);
    char err[512];
    int32_t tok[3] = {1, 2, 300}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0};
    struct bt_llm_batch b = {3, tok, pos, seq, NULL, BT_LLM_OUT_LOGITS};
    ck_assert_int_eq(bt_llm_decode(c, &b, NULL, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "token 2: id 300 out of the vocabulary [0, 100)");
    tok[2] = 3;
    seq[1] = 2;
    ck_assert_int_eq(bt_llm_decode(c, &b, NULL, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "token 1: sequence id 2 out of [0, 2)");
    seq[1] = 0;
    ck_assert_int_eq(bt_llm_decode(c, &b, NULL, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_llm_decode(c, &b, NULL, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "token 0: sequence 0 already has position 0");
    int32_t tok6[6] = {1, 2, 3, 4, 5, 6}, pos6[6] = {0, 1, 2, 3, 4, 5}, seq6[6] = {1, 1, 1, 1, 1, 1};
    struct bt_llm_batch b6 = {6, tok6, pos6, seq6, NULL, BT_LLM_OUT_LOGITS};
    ck_assert_int_eq(bt_llm_decode(c, &b6, NULL, err, sizeof err), BT_ERR_CAPACITY);
    ck_assert_str_eq(err, "KV cache full: 6 tokens, 5 of 8 cells free");
    bt_llm_ctx_free(c);

    /* a context the cache cannot hold */
    struct bt_llm_ctx_params p;
    bt_llm_ctx_default_params(&p);
    p.n_ctx = 0;
    struct bt_llm_ctx *c2 = NULL;
    ck_assert_int_ne(bt_llm_ctx_new(m, &p, &c2, err, sizeof err), BT_OK);
    ck_assert_ptr_null(c2);
    const size_t full = bt_llm_weight_bytes(m);
    bt_llm_free(m);

    /* a layer range outside the model */
    struct bt_llm *m2 = NULL;
    ck_assert_int_eq(bt_llm_load(r.path, 1, 5, &m2, err, sizeof err), BT_ERR_INVALID);
    char want[400];
    snprintf(want, sizeof want, "%s: layer range [1, 5) is not inside the model's 2 layers", r.path);
    ck_assert_str_eq(err, want);
    /* a range loads only its layers' tensors */
    ck_assert_int_eq(bt_llm_load(r.path, 1, 2, &m2, err, sizeof err), BT_OK);
    ck_assert_ptr_nonnull(bt_llm_layer(m2, 1)->wq);
    ck_assert_uint_lt(bt_llm_weight_bytes(m2), full);
    int il0, il1;
    bt_llm_range(m2, &il0, &il1);
    ck_assert_int_eq(il0, 1);
    ck_assert_int_eq(il1, 2);
    bt_llm_free(m2);
    ref_free(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("arch");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_reference_f32, 0, N_ARCHES);
    tcase_add_loop_test(tc, test_reference_q8_0, 0, N_ARCHES);
    tcase_add_loop_test(tc, test_reference_iq, 0, 2 * N_IQ_TYPES);
    tcase_add_test(tc, test_reference_gpt_oss_mxfp4);
    tcase_add_loop_test(tc, test_incremental_bitwise, 0, N_ARCHES);
    tcase_add_test(tc, test_incremental_kv_types);
    tcase_add_test(tc, test_stage_graphs);
    tcase_add_test(tc, test_stage_fallback);
    tcase_add_test(tc, test_load_repacked);
    tcase_add_loop_test(tc, test_sequences_bitwise, 0, N_ARCHES);
    tcase_add_loop_test(tc, test_sliding_window_ring, 0, 2);
    tcase_add_test(tc, test_reference_all_sliding);
    tcase_add_test(tc, test_broken_files);
    tcase_add_test(tc, test_glm4moe_nextn);
    tcase_add_test(tc, test_batch_errors);
    tcase_add_test(tc, test_random_model);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
