/* test_sched.c - the multi-backend scheduler (sched.h) as a user sees it:
 * the splitter's plan for the seed's A..F chain, user assignments, views,
 * unsupported ops, bitwise agreement with the CPU backend alone for an MLP,
 * an attention block and three MoE variants over a stream of micro-batches
 * with n_copies 1, 2 and 4, the MoE "copy only the used experts" path, the
 * eval callback, the n_copies ring and the allocator's buffer sizes.
 *
 * Backends: "LIMITED0" (tests/backend_limited.h: CPU kernels behind a buffer
 * type the CPU backend cannot read, as a GPU's, refusing a chosen set of ops)
 * at priority 0, and the CPU backend last (the fallback).  Every reference
 * result comes from the CPU backend alone on a separate graph in a separate
 * context (the scheduler rewrites the sources of the graph it plans).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "baton/alloc.h"
#include "baton/backend.h"
#include "backend_limited.h"
#include "baton/sched.h"
#include "testutil.h"

#define N_THREADS 1
#define N_MICRO 8

/* ---- small helpers ----------------------------------------------------------- */

/* A metadata-only context: tensors get memory from a buffer or the scheduler. */
static bt_context *meta_ctx(size_t mb) {
    bt_context *ctx = bt_init((struct bt_init_params){mb << 20, NULL, true});
    ck_assert_ptr_nonnull(ctx);
    return ctx;
}

static bt_backend_t cpu_backend(void) {
    bt_backend_t b = bt_backend_cpu_init(N_THREADS);
    ck_assert_ptr_nonnull(b);
    return b;
}

static bt_backend_t limited_backend(const char *name, const enum bt_op *refused, int n) {
    bt_backend_t b = bt_backend_limited_init(name, N_THREADS, refused, n);
    ck_assert_ptr_nonnull(b);
    return b;
}

/* Every tensor of wctx into one buffer of backend's type, marked as weights. */
static bt_buffer_t alloc_weights(bt_context *wctx, bt_backend_t backend) {
    bt_buffer_t buf = bt_alloc_ctx_tensors(wctx, backend);
    ck_assert_msg(buf != NULL, "alloc weights: %s", bt_context_error(wctx));
    bt_buffer_set_usage(buf, BT_BUFFER_USAGE_WEIGHTS);
    return buf;
}

/* Fill a contiguous tensor (F32, I32 by value, Q8_0/Q4_0 quantised row by
 * row) with uniform values in [lo, hi), through bt_tensor_set so that it
 * works for any buffer. */
static void set_uniform(struct bt_tensor *t, tu_rng *r, float lo, float hi) {
    ck_assert(bt_is_contiguous(t));
    const int64_t n = bt_nelements(t), ne0 = t->ne[0];
    float *v = malloc((size_t)n * sizeof *v);
    uint8_t *bytes = malloc(bt_nbytes(t));
    ck_assert(v && bytes);
    for (int64_t i = 0; i < n; i++) {
        v[i] = tu_rng_f32(r, lo, hi);
        if (t->type == BT_TYPE_I32) v[i] = floorf(v[i]);
    }
    const size_t row = bt_row_size(t->type, ne0);
    for (int64_t i = 0; i < n / ne0; i++) bt_row_from_f32(t->type, v + i * ne0, bytes + (size_t)i * row, ne0);
    bt_tensor_set(t, bytes, 0, bt_nbytes(t));
    free(v);
    free(bytes);
}

static void set_i32(struct bt_tensor *t, const int32_t *v) {
    ck_assert_int_eq(t->type, BT_TYPE_I32);
    bt_tensor_set(t, v, 0, bt_nbytes(t));
}

static void *get_bytes(const struct bt_tensor *t) {
    void *p = malloc(bt_nbytes(t));
    ck_assert_ptr_nonnull(p);
    bt_tensor_get(t, p, 0, bt_nbytes(t));
    return p;
}

/* Assert two F32 outputs are bitwise equal; name the first differing element. */
static void assert_bitwise(const float *got, const float *want, int64_t n, const char *what) {
    if (memcmp(got, want, (size_t)n * sizeof(float)) == 0) return;
    int64_t first = -1, n_diff = 0;
    double max_abs = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a == b) continue;
        if (first < 0) first = i;
        n_diff++;
        const double d = fabs((double)got[i] - (double)want[i]);
        if (d > max_abs || isnan(d)) max_abs = d;
    }
    ck_abort_msg("%s: %lld of %lld elements differ from the CPU-only result; first [%lld] = %.9g, want %.9g; "
                 "max |diff| %.3g",
                 what, (long long)n_diff, (long long)n, (long long)first, (double)got[first], (double)want[first],
                 max_abs);
}

/* Place a reference graph's tensors in one CPU buffer. */
static bt_buffer_t alloc_ref(bt_context *ctx, bt_backend_t cpu) {
    bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, cpu);
    ck_assert_msg(buf != NULL, "%s", bt_context_error(ctx));
    return buf;
}

static bt_sched_t new_sched(bt_backend_t *backends, int n, int n_copies) {
    bt_sched_t s = NULL;
    char err[256];
    ck_assert_msg(bt_sched_new(backends, NULL, n, 1024, n_copies, &s, err, sizeof err) == BT_OK, "%s", err);
    return s;
}

#define CK_STATUS(sched, expr)                                                                                \
    do {                                                                                                      \
        enum bt_status st_ = (expr);                                                                          \
        ck_assert_msg(st_ == BT_OK, "%s: %s: %s", #expr, bt_status_str(st_), bt_sched_error(sched));          \
    } while (0)

/* The whole plan as text. */
static char *plan_text(bt_sched_t sched) {
    enum { PLAN_MAX = 1 << 16 };
    char *text = calloc(PLAN_MAX, 1);
    ck_assert_ptr_nonnull(text);
    FILE *f = fmemopen(text, PLAN_MAX - 1, "w");
    ck_assert_ptr_nonnull(f);
    bt_sched_print_plan(sched, f);
    fclose(f);
    return text;
}

/* Does the line starting at `line` contain `needle`? */
static bool line_has(const char *line, const char *needle) {
    const char *end = strchr(line, '\n');
    const char *hit = strstr(line, needle);
    return hit && (!end || hit < end);
}

/* ---- the seed's chain: A B C D E F --------------------------------------------
 *
 *   x [32, 4] (user input)   W [32, 16] (weights)
 *   A = W x        [16, 4]   (pass 1: runs where its weight lives)
 *   B = A * 0.5
 *   C = B^2
 *   D = sqrt(C)              (LIMITED0 refuses SQRT: only the CPU runs it)
 *   E = D * 2
 *   F = E + D                (D is needed twice on LIMITED0, copied once)
 */
struct chain {
    bt_context *wctx, *ctx, *xctx, *octx;
    bt_buffer_t wbuf, xbuf, obuf;
    struct bt_tensor *W, *x, *A, *B, *C, *D, *E, *F, *out;
    struct bt_graph *g;
};

/* W in a weights buffer of w_backend; x without memory (the scheduler places
 * it) or, when x_backend is given, in a buffer of x_backend (usage ANY).
 * out_user: F is copied into a user tensor in a CPU buffer (bt_cpy). */
static void chain_build(struct chain *c, bt_backend_t w_backend, bt_backend_t x_backend, bt_backend_t out_cpu) {
    memset(c, 0, sizeof *c);
    c->wctx = meta_ctx(1);
    c->W = bt_set_name(bt_new_tensor_2d(c->wctx, BT_TYPE_F32, 32, 16), "W");
    c->wbuf = alloc_weights(c->wctx, w_backend);
    tu_rng r;
    tu_rng_init(&r, 11);
    set_uniform(c->W, &r, -1, 1);

    c->ctx = meta_ctx(4);
    c->x = bt_set_name(bt_new_tensor_2d(c->ctx, BT_TYPE_F32, 32, 4), "x");
    bt_set_input(c->x);
    if (x_backend) {
        /* a context of its own so that only x is placed */
        bt_context *xctx = c->xctx = meta_ctx(1);
        struct bt_tensor *x = bt_set_name(bt_new_tensor_2d(xctx, BT_TYPE_F32, 32, 4), "x");
        bt_set_input(x);
        c->xbuf = bt_alloc_ctx_tensors(xctx, x_backend);
        ck_assert_ptr_nonnull(c->xbuf);
        c->x = x;
    }
    c->A = bt_set_name(bt_mul_mat(c->ctx, c->W, c->x), "A");
    c->B = bt_set_name(bt_scale(c->ctx, c->A, 0.5f), "B");
    c->C = bt_set_name(bt_sqr(c->ctx, c->B), "C");
    c->D = bt_set_name(bt_sqrt(c->ctx, c->C), "D");
    c->E = bt_set_name(bt_scale(c->ctx, c->D, 2.0f), "E");
    c->F = bt_set_name(bt_add(c->ctx, c->E, c->D), "F");
    TU_OK(c->ctx, c->F);
    c->out = c->F;
    if (out_cpu) {
        bt_context *octx = c->octx = meta_ctx(1);
        struct bt_tensor *o = bt_set_name(bt_new_tensor_2d(octx, BT_TYPE_F32, 16, 4), "out_user");
        c->obuf = bt_alloc_ctx_tensors(octx, out_cpu);
        ck_assert_ptr_nonnull(c->obuf);
        c->out = bt_set_name(bt_cpy(c->ctx, c->F, o), "G");
        TU_OK(c->ctx, c->out);
    }
    bt_set_output(c->out);
    c->g = bt_graph_new(c->ctx, 64);
    ck_assert_ptr_nonnull(c->g);
    ck_assert_int_eq(bt_graph_build_forward_expand(c->g, c->out), BT_OK);
}

static void chain_free(struct chain *c) {
    bt_buffer_free(c->wbuf);
    if (c->xbuf) bt_buffer_free(c->xbuf);
    if (c->obuf) bt_buffer_free(c->obuf);
    bt_free(c->wctx);
    bt_free(c->ctx);
    if (c->xctx) bt_free(c->xctx);
    if (c->octx) bt_free(c->octx);
}

static void chain_set_input(struct chain *c, int mb) {
    tu_rng r;
    tu_rng_init(&r, 1000 + (uint64_t)mb);
    set_uniform(c->x, &r, -1, 1);
}

/* The chain's F for micro-batch mb on the CPU backend alone. */
static float *chain_reference(bt_backend_t cpu, int mb) {
    struct chain c;
    chain_build(&c, cpu, NULL, NULL);
    bt_buffer_t buf = alloc_ref(c.ctx, cpu);
    chain_set_input(&c, mb);
    ck_assert_int_eq(bt_backend_graph_compute(cpu, c.g), BT_OK);
    float *out = get_bytes(c.F);
    bt_buffer_free(buf);
    chain_free(&c);
    return out;
}

/* c's F equals the chain's F for micro-batch mb on the CPU alone, bitwise. */
static void assert_chain_output(const struct chain *c, bt_backend_t cpu, int mb, const char *what) {
    float *got = get_bytes(c->F), *want = chain_reference(cpu, mb);
    assert_bitwise(got, want, 64, what);
    free(got);
    free(want);
}

/* The usual set-up of the chain tests: LIMITED0 (refusing `refused`) and the
 * CPU, the chain's weights on LIMITED0, a scheduler over both, one copy. */
struct rig {
    bt_backend_t lim, cpu;
    bt_backend_t backends[2];
    struct chain c;
    bt_sched_t sched;
};

static void rig_open(struct rig *r, const enum bt_op *refused, int n_refused) {
    r->lim = limited_backend("LIMITED0", refused, n_refused);
    r->cpu = cpu_backend();
    r->backends[0] = r->lim;
    r->backends[1] = r->cpu;
    chain_build(&r->c, r->lim, NULL, NULL);
    r->sched = new_sched(r->backends, 2, 1);
}

static void rig_close(struct rig *r) {
    bt_sched_free(r->sched);
    chain_free(&r->c);
    bt_backend_free(r->lim);
    bt_backend_free(r->cpu);
}

static void assert_split(bt_sched_t sched, int i, bt_backend_t backend, int i_start, int i_end) {
    const struct bt_sched_split *s = bt_sched_get_split(sched, i);
    ck_assert_msg(bt_sched_get_backend(sched, s->backend_id) == backend, "split %d: backend %s, want %s", i,
                  bt_backend_name(bt_sched_get_backend(sched, s->backend_id)), bt_backend_name(backend));
    ck_assert_msg(s->i_start == i_start && s->i_end == i_end, "split %d: nodes [%d, %d), want [%d, %d)", i,
                  s->i_start, s->i_end, i_start, i_end);
}

/* 1. The seed's example: LIMITED0 [A B C], CPU [D], LIMITED0 [E F]. */
START_TEST(test_seed_example_plan) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};

    /* (a) x has no memory of its own.  Pass 1 gives a user input without a
     * buffer to the CPU (the last backend), as ggml does, so A on LIMITED0
     * needs it copied: split 0's only input is x. */
    struct chain c;
    chain_build(&c, lim, NULL, NULL);
    bt_sched_t sched = new_sched(backends, 2, 1);
    CK_STATUS(sched, bt_sched_split_graph(sched, c.g));
    ck_assert_int_eq(c.g->n_nodes, 6);
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);
    assert_split(sched, 0, lim, 0, 3); /* A B C */
    assert_split(sched, 1, cpu, 3, 4); /* D */
    assert_split(sched, 2, lim, 4, 6); /* E F */
    const struct bt_sched_split *s0 = bt_sched_get_split(sched, 0), *s1 = bt_sched_get_split(sched, 1),
                                *s2 = bt_sched_get_split(sched, 2);
    ck_assert_int_eq(s0->n_inputs, 1);
    ck_assert_ptr_eq(s0->inputs[0], c.x);
    ck_assert_int_eq(s1->n_inputs, 1);
    ck_assert_ptr_eq(s1->inputs[0], c.C);
    ck_assert_int_eq(s2->n_inputs, 1); /* D once, although E and F both read it */
    ck_assert_ptr_eq(s2->inputs[0], c.D);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c.x), cpu);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c.W), lim);
    struct bt_tensor *const nodes[6] = {c.A, c.B, c.C, c.D, c.E, c.F};
    for (int i = 0; i < 6; i++)
        ck_assert_msg(bt_sched_get_tensor_backend(sched, nodes[i]) == (i == 3 ? cpu : lim), "node %s on %s",
                      nodes[i]->name, bt_backend_name(bt_sched_get_tensor_backend(sched, nodes[i])));
    /* the plan rewrites D's and E's, F's sources to the copies */
    ck_assert_ptr_eq(c.D->src[0], bt_sched_get_tensor_copy(sched, c.C, 1, 0));
    ck_assert_ptr_eq(c.E->src[0], bt_sched_get_tensor_copy(sched, c.D, 0, 0));
    ck_assert_ptr_eq(c.F->src[1], bt_sched_get_tensor_copy(sched, c.D, 0, 0));

    char *plan = plan_text(sched);
    ck_assert_msg(strstr(plan, "3 splits") != NULL, "%s", plan);
    ck_assert_msg(strstr(plan, "split 0: backend LIMITED0") != NULL, "%s", plan);
    ck_assert_msg(strstr(plan, "split 1: backend CPU") != NULL, "%s", plan);
    ck_assert_msg(strstr(plan, "split 2: backend LIMITED0") != NULL, "%s", plan);
    /* each split's inputs are listed between its header and the next one */
    const char *p0 = strstr(plan, "split 0:"), *p1 = strstr(plan, "split 1:"), *p2 = strstr(plan, "split 2:");
    ck_assert(p0 && p1 && p2 && p0 < p1 && p1 < p2);
    const char *ix = strstr(p0, "input x "), *ic = strstr(p1, "input C "), *id = strstr(p2, "input D ");
    ck_assert_msg(ix && ix < p1 && line_has(ix, "from CPU"), "x is not listed as split 0's input:\n%s", plan);
    ck_assert_msg(ic && ic < p2 && line_has(ic, "from LIMITED0"), "C is not listed as split 1's input:\n%s", plan);
    ck_assert_msg(id && line_has(id, "from CPU"), "D is not listed as split 2's input:\n%s", plan);
    free(plan);

    /* and it computes what the CPU alone computes */
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
    chain_set_input(&c, 0);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
    assert_chain_output(&c, cpu, 0, "chain");
    bt_sched_free(sched);
    /* freeing the scheduler gives the user's graph its sources back */
    ck_assert_ptr_eq(c.D->src[0], c.C);
    ck_assert_ptr_eq(c.E->src[0], c.D);
    ck_assert_ptr_eq(c.F->src[1], c.D);

    /* (b) x placed by the user in a LIMITED0 buffer: pass 1 puts the leaf
     * where its buffer is, so split 0 needs no input at all. */
    struct chain c2;
    chain_build(&c2, lim, lim, NULL);
    sched = new_sched(backends, 2, 1);
    CK_STATUS(sched, bt_sched_split_graph(sched, c2.g));
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);
    assert_split(sched, 0, lim, 0, 3);
    assert_split(sched, 1, cpu, 3, 4);
    assert_split(sched, 2, lim, 4, 6);
    ck_assert_int_eq(bt_sched_get_split(sched, 0)->n_inputs, 0);
    ck_assert_ptr_eq(bt_sched_get_split(sched, 1)->inputs[0], c2.C);
    ck_assert_ptr_eq(bt_sched_get_split(sched, 2)->inputs[0], c2.D);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c2.x), lim);
    plan = plan_text(sched);
    p1 = strstr(plan, "split 1:");
    ck_assert_msg(p1 && !strstr(plan, "input x "), "%s", plan);
    ck_assert_msg(strstr(plan, "split 0: backend LIMITED0, nodes 0..2 (3), 0 inputs") != NULL, "%s", plan);
    free(plan);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c2.g));
    chain_set_input(&c2, 3);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c2.g));
    assert_chain_output(&c2, cpu, 3, "chain, x on LIMITED0");
    bt_sched_free(sched);
    chain_free(&c);
    chain_free(&c2);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* 2a. A user's assignment is kept (and reset forgets it). */
START_TEST(test_user_assignment) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    struct rig r;
    rig_open(&r, refused, 1);
    bt_backend_t lim = r.lim, cpu = r.cpu;
    bt_sched_t sched = r.sched;
    struct chain *c = &r.c;

    /* B would go to LIMITED0 (test 1); pinned to the CPU it stays there, and
     * the CPU then expands over the rest (2c: C E F follow B down) */
    bt_sched_set_tensor_backend(sched, c->B, cpu);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c->B), cpu);
    CK_STATUS(sched, bt_sched_split_graph(sched, c->g));
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c->B), cpu);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c->A), lim);
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 2);
    assert_split(sched, 0, lim, 0, 1);
    assert_split(sched, 1, cpu, 1, 6);
    ck_assert_ptr_eq(bt_sched_get_split(sched, 1)->inputs[0], c->A);

    /* reset forgets the assignment (and the plan): B is back on LIMITED0.
     * (Before any allocation: once the scheduler has placed the graph's
     * tensors, they keep their buffers and pass 1 sees them as placed.) */
    bt_sched_reset(sched);
    ck_assert_ptr_null(bt_sched_get_tensor_backend(sched, c->B));
    ck_assert_ptr_eq(c->E->src[0], c->D);
    CK_STATUS(sched, bt_sched_split_graph(sched, c->g));
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c->B), lim);
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);

    /* pinned again (a fresh scheduler state), the assignment survives
     * micro-batches and is what runs */
    bt_sched_reset(sched);
    bt_sched_set_tensor_backend(sched, c->B, cpu);
    for (int mb = 0; mb < 2; mb++) {
        CK_STATUS(sched, bt_sched_alloc_graph(sched, c->g));
        ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c->B), cpu);
        ck_assert_int_eq(bt_sched_get_n_splits(sched), 2);
        ck_assert(bt_buffer_is_host(c->B->buffer)); /* placed in the CPU's memory */
        chain_set_input(c, mb);
        CK_STATUS(sched, bt_sched_graph_compute(sched, c->g));
        assert_chain_output(c, cpu, mb, "chain with B pinned to the CPU");
    }
    rig_close(&r);
}
END_TEST

/* 2c. A pin given after a plan was made replaces that plan: the result is the
 * plan a pin given before planning makes (LIMITED0 [A], CPU [B..F]), not the
 * old plan with B moved (which would cut 5 splits). */
START_TEST(test_pin_after_plan) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    struct rig r;
    rig_open(&r, refused, 1);
    bt_backend_t lim = r.lim, cpu = r.cpu;
    bt_sched_t sched = r.sched;
    struct chain *c = &r.c;
    CK_STATUS(sched, bt_sched_split_graph(sched, c->g));
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);
    bt_sched_set_tensor_backend(sched, c->B, cpu);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c->g));
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c->B), cpu);
    char *plan = plan_text(sched);
    ck_assert_msg(bt_sched_get_n_splits(sched) == 2, "%d splits, want 2 (C, E, F follow B to the CPU):\n%s",
                  bt_sched_get_n_splits(sched), plan);
    free(plan);
    assert_split(sched, 0, lim, 0, 1);
    assert_split(sched, 1, cpu, 1, 6);
    rig_close(&r);
}
END_TEST

/* 2e. Two pins on a backend that refuses nothing (as tests/gpu/test_cuda.c's
 * split example on [CUDA, CPU]): D pinned to the CPU alone would take E and
 * F with it (2c); F pinned back to LIMITED0 takes E there too (the upward
 * expansion), so the seed's three splits return. */
START_TEST(test_two_pins) {
    struct rig r;
    rig_open(&r, NULL, 0);
    bt_backend_t lim = r.lim, cpu = r.cpu;
    bt_sched_t sched = r.sched;
    struct chain *c = &r.c;
    bt_sched_set_tensor_backend(sched, c->D, cpu);
    CK_STATUS(sched, bt_sched_split_graph(sched, c->g));
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 2);
    assert_split(sched, 0, lim, 0, 3); /* A B C */
    assert_split(sched, 1, cpu, 3, 6); /* D E F */
    bt_sched_reset(sched);
    bt_sched_set_tensor_backend(sched, c->D, cpu);
    bt_sched_set_tensor_backend(sched, c->F, lim);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c->g));
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);
    assert_split(sched, 0, lim, 0, 3); /* A B C */
    assert_split(sched, 1, cpu, 3, 4); /* D */
    assert_split(sched, 2, lim, 4, 6); /* E F */
    chain_set_input(c, 0);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c->g));
    assert_chain_output(c, cpu, 0, "chain with D on the CPU, F on LIMITED0");
    rig_close(&r);
}
END_TEST

/* 2d. bt_sched_reset forgets the plan and the user's assignments also after
 * the graph was allocated and run: replanned, B is back on LIMITED0. */
START_TEST(test_reset_after_run) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    struct rig r;
    rig_open(&r, refused, 1);
    bt_backend_t lim = r.lim, cpu = r.cpu;
    bt_sched_t sched = r.sched;
    struct chain *c = &r.c;
    bt_sched_set_tensor_backend(sched, c->B, cpu);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c->g));
    chain_set_input(c, 0);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c->g));
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 2);
    bt_sched_reset(sched);
    CK_STATUS(sched, bt_sched_split_graph(sched, c->g));
    char *plan = plan_text(sched);
    ck_assert_msg(bt_sched_get_tensor_backend(sched, c->B) == lim && bt_sched_get_n_splits(sched) == 3,
                  "after reset: B on %s, %d splits (want LIMITED0, 3):\n%s",
                  bt_backend_name(bt_sched_get_tensor_backend(sched, c->B)), bt_sched_get_n_splits(sched), plan);
    free(plan);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c->g));
    chain_set_input(c, 1);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c->g));
    assert_chain_output(c, cpu, 1, "chain replanned after reset");
    rig_close(&r);
}
END_TEST

/* ---- views ---------------------------------------------------------------------
 *
 *   A = W x [16, 4]                                   LIMITED0 (weight)
 *   P = transpose(A) [4, 16], Q = cont(P)             P follows A
 *   C = A^2, D = sqrt(C)                              D on the CPU (SQRT refused)
 *   R = reshape_1d(D) [64], S = R * 3                 R follows D
 *   T = reshape_2d(S) [16, 4], U = T + cont(transpose(Q))
 */
struct views {
    bt_context *wctx, *ctx;
    bt_buffer_t wbuf;
    struct bt_tensor *W, *x, *A, *P, *Q, *C, *D, *R, *S, *T, *U;
    struct bt_graph *g;
};

static void views_build(struct views *v, bt_backend_t w_backend) {
    memset(v, 0, sizeof *v);
    v->wctx = meta_ctx(1);
    v->W = bt_set_name(bt_new_tensor_2d(v->wctx, BT_TYPE_F32, 32, 16), "W");
    v->wbuf = alloc_weights(v->wctx, w_backend);
    tu_rng r;
    tu_rng_init(&r, 12);
    set_uniform(v->W, &r, -1, 1);
    bt_context *ctx = v->ctx = meta_ctx(4);
    v->x = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, 32, 4), "x");
    bt_set_input(v->x);
    v->A = bt_set_name(bt_mul_mat(ctx, v->W, v->x), "A");
    v->P = bt_set_name(bt_transpose(ctx, v->A), "P");
    v->Q = bt_set_name(bt_cont(ctx, v->P), "Q");
    v->C = bt_set_name(bt_sqr(ctx, v->A), "C");
    v->D = bt_set_name(bt_sqrt(ctx, v->C), "D");
    v->R = bt_set_name(bt_reshape_1d(ctx, v->D, 64), "R");
    v->S = bt_set_name(bt_scale(ctx, v->R, 3.0f), "S");
    v->T = bt_set_name(bt_reshape_2d(ctx, v->S, 16, 4), "T");
    struct bt_tensor *Qt = bt_set_name(bt_cont(ctx, bt_transpose(ctx, v->Q)), "Qt");
    v->U = bt_set_name(bt_add(ctx, v->T, Qt), "U");
    TU_OK(ctx, v->U);
    bt_set_output(v->U);
    v->g = bt_graph_new(ctx, 64);
    ck_assert_int_eq(bt_graph_build_forward_expand(v->g, v->U), BT_OK);
}

static void views_free(struct views *v) {
    bt_buffer_free(v->wbuf);
    bt_free(v->wctx);
    bt_free(v->ctx);
}

START_TEST(test_views_follow_source) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    struct views v;
    views_build(&v, lim);
    bt_sched_t sched = new_sched(backends, 2, 2);
    CK_STATUS(sched, bt_sched_split_graph(sched, v.g));
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, v.A), lim);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, v.D), cpu);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, v.P), lim); /* view of A */
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, v.R), cpu); /* view of D */
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, v.S), lim);
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, v.T), lim); /* view of S */
    /* every view node is on its view source's backend */
    for (int i = 0; i < v.g->n_nodes; i++) {
        struct bt_tensor *n = v.g->nodes[i];
        if (!bt_op_is_view(n->op)) continue;
        ck_assert_msg(bt_sched_get_tensor_backend(sched, n) == bt_sched_get_tensor_backend(sched, n->view_src),
                      "view %s on %s, its source %s on %s", n->name,
                      bt_backend_name(bt_sched_get_tensor_backend(sched, n)), n->view_src->name,
                      bt_backend_name(bt_sched_get_tensor_backend(sched, n->view_src)));
    }
    /* computed right over a few micro-batches */
    struct views ref;
    views_build(&ref, cpu);
    bt_buffer_t ref_buf = alloc_ref(ref.ctx, cpu);
    for (int mb = 0; mb < 3; mb++) {
        CK_STATUS(sched, bt_sched_alloc_graph(sched, v.g));
        tu_rng r;
        tu_rng_init(&r, 500 + (uint64_t)mb);
        set_uniform(v.x, &r, -1, 1);
        tu_rng_init(&r, 500 + (uint64_t)mb);
        set_uniform(ref.x, &r, -1, 1);
        CK_STATUS(sched, bt_sched_graph_compute(sched, v.g));
        ck_assert_int_eq(bt_backend_graph_compute(cpu, ref.g), BT_OK);
        float *got = get_bytes(v.U), *want = get_bytes(ref.U);
        assert_bitwise(got, want, 64, "views graph");
        free(got);
        free(want);
    }
    bt_sched_free(sched);
    bt_buffer_free(ref_buf);
    views_free(&v);
    views_free(&ref);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* 2c. A node the user allocated in memory that only a backend which cannot
 * run its op can use (as a GPU buffer holding an op only the CPU runs): a
 * status and a message naming the node, its buffer and the backend, where
 * the CPU would otherwise write into memory it cannot use. */
START_TEST(test_preallocated_node_unusable) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    struct chain c;
    chain_build(&c, lim, NULL, NULL);
    bt_buffer_t dbuf = bt_backend_alloc_buffer(lim, bt_nbytes(c.D) + BT_MEM_ALIGN);
    ck_assert_ptr_nonnull(dbuf);
    ck_assert_int_eq(bt_tensor_alloc(dbuf, c.D, bt_buffer_get_base(dbuf)), BT_OK);
    bt_sched_t sched = new_sched(backends, 2, 1);
    ck_assert_int_eq(bt_sched_split_graph(sched, c.g), BT_ERR_UNSUPPORTED);
    const char *err = bt_sched_error(sched);
    ck_assert_msg(strstr(err, "'D'") != NULL && strstr(err, "LIMITED0 buffer") != NULL &&
                      strstr(err, "CPU") != NULL,
                  "message: \"%s\"", err);
    /* where LIMITED0 runs SQRT itself the same graph plans */
    bt_backend_limited_refuse(lim, BT_OP_SQRT, false);
    CK_STATUS(sched, bt_sched_split_graph(sched, c.g));
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c.D), lim);
    bt_sched_free(sched);
    c.D->buffer = NULL;
    c.D->data = NULL;
    bt_buffer_free(dbuf);
    chain_free(&c);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* 2b. An op that no backend runs: a status and a message naming the node and
 * the op, from both split_graph and graph_compute; never an abort. */
START_TEST(test_unsupported_op) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t l0 = limited_backend("LIMITED0", refused, 1);
    bt_backend_t l1 = limited_backend("LIMITED1", refused, 1);
    bt_backend_t backends[2] = {l0, l1};
    struct chain c;
    chain_build(&c, l0, NULL, NULL);
    bt_sched_t sched = new_sched(backends, 2, 1);
    enum bt_status st = bt_sched_split_graph(sched, c.g);
    ck_assert_int_eq(st, BT_ERR_UNSUPPORTED);
    const char *err = bt_sched_error(sched);
    ck_assert_msg(strstr(err, "'D'") != NULL && strstr(err, "SQRT") != NULL, "message: \"%s\"", err);
    st = bt_sched_graph_compute(sched, c.g);
    ck_assert_int_eq(st, BT_ERR_UNSUPPORTED);
    err = bt_sched_error(sched);
    ck_assert_msg(strstr(err, "'D'") != NULL && strstr(err, "SQRT") != NULL, "message: \"%s\"", err);
    ck_assert_int_eq(bt_sched_alloc_graph(sched, c.g), BT_ERR_UNSUPPORTED);
    /* the user's graph is left as it was */
    ck_assert_ptr_eq(c.D->src[0], c.C);
    ck_assert_ptr_eq(c.E->src[0], c.D);
    /* once one backend runs SQRT again the same scheduler plans and runs */
    bt_backend_limited_refuse(l1, BT_OP_SQRT, false);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
    ck_assert_ptr_eq(bt_sched_get_tensor_backend(sched, c.D), l1);
    chain_set_input(&c, 0);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
    bt_backend_t cpu = cpu_backend();
    assert_chain_output(&c, cpu, 0, "chain on LIMITED0 + LIMITED1");
    bt_sched_free(sched);
    chain_free(&c);
    bt_backend_free(l0);
    bt_backend_free(l1);
    bt_backend_free(cpu);
}
END_TEST

/* ---- model blocks ----------------------------------------------------------------
 *
 * x [DM, NT] is a micro-batch of NT token vectors.
 *   MLP        out = x + Wd (silu(Wg h) * (Wu h)),  h = rms_norm(x) * norm
 *   attention  q, k = rope(Wq x, Wk x) [HD, NH, NT], v = Wv x; causal softmax
 *              over k q / sqrt(HD) per head; out = x + Wo (v softmax)
 *   MoE        h as in the MLP; probs = softmax(router h) [n_exp, NT];
 *              sel = top_k(probs, k) [k, NT]; gates = probs[sel] normalised;
 *              out = x + sum_e gate_e * expert_sel_e(h)   (each expert an MLP,
 *              run with MUL_MAT_ID) [+ a shared expert MLP for every token]
 *   dense MoE: k = n_exp = 4; top-2: k = 2 of 8; shared: top-2 of 8 + 1 shared
 */
#define DM 64
#define NT 6
#define NH 4
#define HD 16
#define FF 96
#define FFE 32

enum net_kind { NET_MLP, NET_ATTN, NET_MOE_DENSE, NET_MOE_TOP2, NET_MOE_SHARED };
static const char *const net_names[] = {"MLP", "attention", "dense MoE", "top-2 MoE", "shared+top-2 MoE"};

/* where the weights live and what the user pins */
enum placement {
    PLACE_LIMITED,            /* all weights in LIMITED0 buffers */
    PLACE_CPU_PINNED,         /* all weights in CPU buffers; matmuls pinned to LIMITED0 */
    PLACE_EXPERTS_CPU,        /* dense weights LIMITED0, experts CPU (MoE runs on the CPU) */
    PLACE_EXPERTS_CPU_PINNED, /* as above with the MUL_MAT_IDs pinned to LIMITED0 */
};
static const char *const place_names[] = {"weights on LIMITED0", "weights on CPU, matmuls pinned to LIMITED0",
                                          "experts on CPU", "experts on CPU, MUL_MAT_ID pinned to LIMITED0"};

struct net {
    enum net_kind kind;
    int n_exp, k;
    bt_context *wctx, *ectx; /* dense weights, expert weights */
    bt_buffer_t wbuf, ebuf;
    struct bt_tensor *norm, *wg, *wu, *wd, *wq, *wk, *wv, *wo, *router, *eg, *eu, *ed;
    bt_context *ctx;
    struct bt_graph *g;
    struct bt_tensor *x, *pos, *mask, *out;
    struct bt_tensor *mm[16]; /* MUL_MAT and MUL_MAT_ID nodes */
    int n_mm;
    struct bt_tensor *mmid[4]; /* MUL_MAT_ID nodes */
    int n_mmid;
};

static bool is_moe(enum net_kind k) { return k >= NET_MOE_DENSE; }

static struct bt_tensor *net_mm(struct net *n, struct bt_tensor *t) {
    if (t) {
        BT_ASSERT(n->n_mm < 16);
        n->mm[n->n_mm++] = t;
        if (t->op == BT_OP_MUL_MAT_ID) n->mmid[n->n_mmid++] = t;
    }
    return t;
}

/* h [DM, NT] -> Wd (silu(Wg h) * (Wu h)) [DM, NT] */
static struct bt_tensor *net_ffn(struct net *n, struct bt_tensor *h) {
    bt_context *ctx = n->ctx;
    struct bt_tensor *g = net_mm(n, bt_mul_mat(ctx, n->wg, h));
    struct bt_tensor *u = net_mm(n, bt_mul_mat(ctx, n->wu, h));
    return net_mm(n, bt_mul_mat(ctx, n->wd, bt_swiglu(ctx, g, u)));
}

static struct bt_tensor *net_attention(struct net *n) {
    bt_context *ctx = n->ctx;
    struct bt_tensor *x = n->x;
    struct bt_tensor *q = bt_reshape_3d(ctx, net_mm(n, bt_mul_mat(ctx, n->wq, x)), HD, NH, NT);
    struct bt_tensor *k = bt_reshape_3d(ctx, net_mm(n, bt_mul_mat(ctx, n->wk, x)), HD, NH, NT);
    struct bt_tensor *v = bt_reshape_3d(ctx, net_mm(n, bt_mul_mat(ctx, n->wv, x)), HD, NH, NT);
    q = bt_set_name(bt_rope(ctx, q, n->pos, HD, BT_ROPE_NEOX, 10000.0f, 1.0f), "q");
    k = bt_set_name(bt_rope(ctx, k, n->pos, HD, BT_ROPE_NEOX, 10000.0f, 1.0f), "k");
    struct bt_tensor *qp = bt_permute(ctx, q, 0, 2, 1, 3);                  /* [HD, NT, NH] */
    struct bt_tensor *kp = bt_permute(ctx, k, 0, 2, 1, 3);                  /* [HD, NT, NH] */
    struct bt_tensor *kq = bt_set_name(bt_mul_mat(ctx, kp, qp), "kq");      /* [NT_k, NT_q, NH] */
    struct bt_tensor *sm = bt_soft_max_ext(ctx, kq, n->mask, 1.0f / sqrtf((float)HD));
    struct bt_tensor *vt = bt_cont(ctx, bt_permute(ctx, v, 1, 2, 0, 3));    /* [NT, HD, NH] */
    struct bt_tensor *kqv = bt_mul_mat(ctx, vt, sm);                        /* [HD, NT_q, NH] */
    struct bt_tensor *o = bt_cont(ctx, bt_permute(ctx, kqv, 0, 2, 1, 3));   /* [HD, NH, NT] */
    o = bt_reshape_2d(ctx, o, DM, NT);
    return bt_add(ctx, x, net_mm(n, bt_mul_mat(ctx, n->wo, o)));
}

static struct bt_tensor *net_moe(struct net *n) {
    bt_context *ctx = n->ctx;
    const int E = n->n_exp, K = n->k;
    struct bt_tensor *h = bt_set_name(bt_mul(ctx, bt_rms_norm(ctx, n->x, 1e-5f), n->norm), "h");
    struct bt_tensor *logits = bt_set_name(net_mm(n, bt_mul_mat(ctx, n->router, h)), "logits"); /* [E, NT] */
    struct bt_tensor *probs = bt_set_name(bt_soft_max(ctx, logits), "probs");
    struct bt_tensor *sel = bt_top_k(ctx, probs, K);                                /* I32 [K, NT] */
    struct bt_tensor *w = bt_get_rows(ctx, bt_reshape_3d(ctx, probs, 1, E, NT), sel); /* [1, K, NT] */
    w = bt_reshape_2d(ctx, w, K, NT);
    w = bt_div(ctx, w, bt_sum_rows(ctx, w));                                        /* gates sum to 1 */
    w = bt_reshape_3d(ctx, w, 1, K, NT);
    struct bt_tensor *h3 = bt_reshape_3d(ctx, h, DM, 1, NT);
    struct bt_tensor *ge = net_mm(n, bt_mul_mat_id(ctx, n->eg, h3, sel));          /* [FFE, K, NT] */
    struct bt_tensor *ue = net_mm(n, bt_mul_mat_id(ctx, n->eu, h3, sel));
    struct bt_tensor *de = net_mm(n, bt_mul_mat_id(ctx, n->ed, bt_swiglu(ctx, ge, ue), sel)); /* [DM, K, NT] */
    struct bt_tensor *we = bt_mul(ctx, de, w);
    if (!we) return NULL;
    struct bt_tensor *moe = bt_view_2d(ctx, we, DM, NT, we->nb[2], 0);
    for (int e = 1; e < K; e++) moe = bt_add(ctx, moe, bt_view_2d(ctx, we, DM, NT, we->nb[2], (size_t)e * we->nb[1]));
    if (n->kind == NET_MOE_SHARED) moe = bt_add(ctx, moe, net_ffn(n, h));
    return bt_add(ctx, n->x, moe);
}

/* Weights (deterministic in creation order, so that two nets built alike hold
 * the same values) in a buffer of w_backend, experts in one of e_backend;
 * the block's graph in a fresh context.  Experts of the shared variant are
 * Q8_0 (MUL_MAT_ID over a block type). */
static void net_build(struct net *n, enum net_kind kind, bt_backend_t w_backend, bt_backend_t e_backend) {
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->n_exp = kind == NET_MOE_DENSE ? 4 : 8;
    n->k = kind == NET_MOE_DENSE ? 4 : 2;
    bt_context *w = n->wctx = meta_ctx(1);
    if (kind == NET_ATTN) {
        n->wq = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, DM), "wq");
        n->wk = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, DM), "wk");
        n->wv = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, DM), "wv");
        n->wo = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, DM), "wo");
    } else {
        n->norm = bt_set_name(bt_new_tensor_1d(w, BT_TYPE_F32, DM), "norm");
    }
    if (kind == NET_MLP || kind == NET_MOE_SHARED) {
        n->wg = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, FF), "wg");
        n->wu = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, FF), "wu");
        n->wd = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, FF, DM), "wd");
    }
    if (is_moe(kind)) {
        n->router = bt_set_name(bt_new_tensor_2d(w, BT_TYPE_F32, DM, n->n_exp), "router");
        bt_context *e = n->ectx = meta_ctx(1);
        const enum bt_type et = kind == NET_MOE_SHARED ? BT_TYPE_Q8_0 : BT_TYPE_F32;
        n->eg = bt_set_name(bt_new_tensor_3d(e, et, DM, FFE, n->n_exp), "exp_gate");
        n->eu = bt_set_name(bt_new_tensor_3d(e, et, DM, FFE, n->n_exp), "exp_up");
        n->ed = bt_set_name(bt_new_tensor_3d(e, et, FFE, DM, n->n_exp), "exp_down");
        n->ebuf = alloc_weights(e, e_backend);
    }
    n->wbuf = alloc_weights(w, w_backend);
    tu_rng r;
    tu_rng_init(&r, 77 + (uint64_t)kind);
    for (int i = 0; i < bt_context_n_tensors(w); i++) {
        struct bt_tensor *t = bt_context_tensor(w, i);
        if (t == n->norm)
            set_uniform(t, &r, 0.5f, 1.5f);
        else if (t == n->router)
            set_uniform(t, &r, -1.0f, 1.0f);
        else
            set_uniform(t, &r, -0.25f, 0.25f);
    }
    if (n->ectx)
        for (int i = 0; i < bt_context_n_tensors(n->ectx); i++)
            set_uniform(bt_context_tensor(n->ectx, i), &r, -0.25f, 0.25f);

    bt_context *ctx = n->ctx = meta_ctx(8);
    n->x = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, DM, NT), "x");
    bt_set_input(n->x);
    if (kind == NET_ATTN) {
        n->pos = bt_set_name(bt_new_tensor_1d(ctx, BT_TYPE_I32, NT), "pos");
        n->mask = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, NT, NT), "mask");
        bt_set_input(n->pos);
        bt_set_input(n->mask);
    }
    switch (kind) {
        case NET_MLP: {
            struct bt_tensor *h = bt_mul(ctx, bt_rms_norm(ctx, n->x, 1e-5f), n->norm);
            n->out = bt_add(ctx, n->x, net_ffn(n, h));
            break;
        }
        case NET_ATTN:
            n->out = net_attention(n);
            break;
        default:
            n->out = net_moe(n);
            break;
    }
    TU_OK(ctx, n->out);
    bt_set_name(n->out, "out");
    bt_set_output(n->out);
    n->g = bt_graph_new(ctx, 512);
    ck_assert_ptr_nonnull(n->g);
    ck_assert_int_eq(bt_graph_build_forward_expand(n->g, n->out), BT_OK);
}

static void net_free(struct net *n) {
    bt_buffer_free(n->wbuf);
    if (n->ebuf) bt_buffer_free(n->ebuf);
    bt_free(n->wctx);
    if (n->ectx) bt_free(n->ectx);
    bt_free(n->ctx);
}

/* Micro-batch mb's inputs: new token vectors, positions mb*NT.., a causal mask. */
static void net_set_inputs(struct net *n, int mb) {
    tu_rng r;
    tu_rng_init(&r, 9000 + 31 * (uint64_t)n->kind + (uint64_t)mb);
    set_uniform(n->x, &r, -1.0f, 1.0f);
    if (n->pos) {
        int32_t pos[NT];
        for (int i = 0; i < NT; i++) pos[i] = mb * NT + i;
        set_i32(n->pos, pos);
        float mask[NT * NT];
        for (int i = 0; i < NT; i++)
            for (int j = 0; j < NT; j++) mask[i * NT + j] = j <= i ? 0.0f : -INFINITY;
        bt_tensor_set(n->mask, mask, 0, sizeof mask);
    }
}

/* The block's output for micro-batches 0..N_MICRO-1 on the CPU backend alone. */
static void net_reference(enum net_kind kind, bt_backend_t cpu, float *out[N_MICRO]) {
    struct net n;
    net_build(&n, kind, cpu, cpu);
    bt_buffer_t buf = alloc_ref(n.ctx, cpu);
    for (int mb = 0; mb < N_MICRO; mb++) {
        net_set_inputs(&n, mb);
        const enum bt_status st = bt_backend_graph_compute(cpu, n.g);
        ck_assert_msg(st == BT_OK, "%s reference: %s", net_names[kind], bt_backend_error(cpu));
        out[mb] = get_bytes(n.out);
    }
    bt_buffer_free(buf);
    net_free(&n);
}

/* 3. One block through the scheduler, N_MICRO micro-batches, against the
 * CPU-only reference, bitwise. */
static void net_stream(enum net_kind kind, enum placement place, int n_copies, bt_backend_t lim, bt_backend_t cpu,
                       float *const want[N_MICRO]) {
    struct net n;
    net_build(&n, kind, place == PLACE_CPU_PINNED ? cpu : lim, place == PLACE_LIMITED ? lim : cpu);
    bt_backend_t backends[2] = {lim, cpu};
    bt_sched_t sched = new_sched(backends, 2, n_copies);
    if (place == PLACE_CPU_PINNED)
        for (int i = 0; i < n.n_mm; i++) bt_sched_set_tensor_backend(sched, n.mm[i], lim);
    if (place == PLACE_EXPERTS_CPU_PINNED)
        for (int i = 0; i < n.n_mmid; i++) bt_sched_set_tensor_backend(sched, n.mmid[i], lim);
    char what[160];
    for (int mb = 0; mb < N_MICRO; mb++) {
        snprintf(what, sizeof what, "%s, %s, n_copies %d, micro-batch %d", net_names[kind], place_names[place],
                 n_copies, mb);
        enum bt_status st = bt_sched_alloc_graph(sched, n.g);
        ck_assert_msg(st == BT_OK, "%s: alloc: %s: %s", what, bt_status_str(st), bt_sched_error(sched));
        net_set_inputs(&n, mb);
        st = bt_sched_graph_compute(sched, n.g);
        ck_assert_msg(st == BT_OK, "%s: compute: %s: %s", what, bt_status_str(st), bt_sched_error(sched));
        float *got = get_bytes(n.out);
        assert_bitwise(got, want[mb], DM * NT, what);
        free(got);
    }
    /* the configurations really split the graph */
    ck_assert_msg(bt_sched_get_n_splits(sched) >= 2, "%s, %s: %d split(s)", net_names[kind], place_names[place],
                  bt_sched_get_n_splits(sched));
    const struct bt_sched_stats stats = bt_sched_get_stats(sched);
    ck_assert_uint_eq(stats.splits_run, (uint64_t)N_MICRO * (uint64_t)bt_sched_get_n_splits(sched));
    if (is_moe(kind) && (place == PLACE_CPU_PINNED || place == PLACE_EXPERTS_CPU_PINNED))
        ck_assert_msg(stats.moe_copies > 0, "%s, %s: no partial expert copies", net_names[kind], place_names[place]);
    bt_sched_free(sched);
    net_free(&n);
}

/* Micro-batches submitted back to back without a synchronise in between,
 * as a streaming user of an asynchronous backend does: the n_copies ring and
 * its events keep micro-batch mb + 1's input copies from overwriting slots
 * that mb's queued work still reads.  Each pair's second output is checked
 * (the first one is overwritten before the synchronise by design). */
static void net_stream_back_to_back(enum net_kind kind, int n_copies, bt_backend_t lim, bt_backend_t cpu,
                                    float *const want[N_MICRO]) {
    struct net n;
    net_build(&n, kind, lim, cpu);
    bt_backend_t backends[2] = {lim, cpu};
    bt_sched_t sched = new_sched(backends, 2, n_copies);
    char what[160];
    for (int mb = 0; mb + 1 < N_MICRO; mb += 2) {
        snprintf(what, sizeof what, "%s, back to back, n_copies %d, micro-batches %d and %d", net_names[kind],
                 n_copies, mb, mb + 1);
        for (int k = mb; k <= mb + 1; k++) {
            enum bt_status st = bt_sched_alloc_graph(sched, n.g); /* the next slot of the ring */
            ck_assert_msg(st == BT_OK, "%s: alloc: %s", what, bt_sched_error(sched));
            net_set_inputs(&n, k);
            st = bt_sched_graph_compute_async(sched, n.g);
            ck_assert_msg(st == BT_OK, "%s: %s", what, bt_sched_error(sched));
        }
        bt_sched_synchronize(sched);
        float *got = get_bytes(n.out);
        assert_bitwise(got, want[mb + 1], DM * NT, what);
        free(got);
    }
    bt_sched_free(sched);
    net_free(&n);
}

static void net_check_all(enum net_kind kind, bool async) {
    const enum bt_op refused[] = {BT_OP_SOFT_MAX, BT_OP_ARGSORT, BT_OP_ROPE, BT_OP_SWIGLU};
    bt_backend_t lim = limited_backend(async ? "ASYNC0" : "LIMITED0", refused, 4);
    if (async) bt_backend_limited_set_async(lim, 300);
    bt_backend_t cpu = cpu_backend();
    float *want[N_MICRO];
    net_reference(kind, cpu, want);
    /* the micro-batches differ (else the stream would prove little) */
    ck_assert(memcmp(want[0], want[1], DM * NT * sizeof(float)) != 0);
    const int n_places = is_moe(kind) ? 4 : 2;
    const int copies[] = {1, 2, 4};
    for (int p = 0; p < n_places; p++)
        for (int c = 0; c < 3; c++) net_stream(kind, (enum placement)p, copies[c], lim, cpu, want);
    for (int c = 0; async && c < 3; c++) net_stream_back_to_back(kind, copies[c], lim, cpu, want);
    for (int mb = 0; mb < N_MICRO; mb++) free(want[mb]);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}

/* 3a'. The same nets with the limited backend asynchronous (a queue run by
 * a worker thread, each compute late), as a GPU is: results only right when
 * the scheduler waits where it must (copies after the producer, slots free
 * before they are overwritten, outputs after a synchronise), also for
 * micro-batches submitted back to back. */
START_TEST(test_async_backend_matches_cpu) {
    net_check_all(NET_MLP, true);
    net_check_all(NET_ATTN, true);
    net_check_all(NET_MOE_DENSE, true);
    net_check_all(NET_MOE_TOP2, true);
    net_check_all(NET_MOE_SHARED, true);
}
END_TEST

START_TEST(test_mlp_matches_cpu) { net_check_all(NET_MLP, false); }
END_TEST
START_TEST(test_attention_matches_cpu) { net_check_all(NET_ATTN, false); }
END_TEST
START_TEST(test_moe_dense_matches_cpu) { net_check_all(NET_MOE_DENSE, false); }
END_TEST
START_TEST(test_moe_top2_matches_cpu) { net_check_all(NET_MOE_TOP2, false); }
END_TEST
START_TEST(test_moe_shared_matches_cpu) { net_check_all(NET_MOE_SHARED, false); }
END_TEST

/* 3b. Two graphs on one scheduler, alternately (a prefill graph and a decode
 * graph, say): each switch replans; both stay right.  The second graph needs
 * more memory than the first, so the scheduler's buffers grow after the
 * first graph was placed in them. */
START_TEST(test_two_graphs_alternate) {
    const enum bt_op refused[] = {BT_OP_SQRT, BT_OP_SOFT_MAX, BT_OP_ARGSORT, BT_OP_ROPE, BT_OP_SWIGLU};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 5);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    float *want_net[N_MICRO];
    net_reference(NET_MOE_SHARED, cpu, want_net);
    struct chain c;
    chain_build(&c, lim, NULL, NULL);
    struct net n;
    net_build(&n, NET_MOE_SHARED, lim, cpu);
    bt_sched_t sched = new_sched(backends, 2, 2);
    for (int round = 0; round < 4; round++) {
        char what[64];
        CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
        chain_set_input(&c, round);
        CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
        snprintf(what, sizeof what, "chain, round %d", round);
        assert_chain_output(&c, cpu, round, what);

        CK_STATUS(sched, bt_sched_alloc_graph(sched, n.g));
        net_set_inputs(&n, round);
        CK_STATUS(sched, bt_sched_graph_compute(sched, n.g));
        float *got = get_bytes(n.out);
        snprintf(what, sizeof what, "shared MoE, round %d", round);
        assert_bitwise(got, want_net[round], DM * NT, what);
        free(got);
    }
    bt_sched_free(sched);
    chain_free(&c);
    net_free(&n);
    for (int mb = 0; mb < N_MICRO; mb++) free(want_net[mb]);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* ---- 4. MoE: only the experts the ids select are copied ---------------------------
 *
 *   experts [32, 16, 8] in a CPU weights buffer (host memory)
 *   b [32, 1, 5] and ids I32 [1, 5] user inputs
 *   y = mul_mat_id(experts, b, ids) [16, 1, 5], pinned to LIMITED0
 */
struct moe1 {
    bt_context *ectx, *ctx;
    bt_buffer_t ebuf;
    struct bt_tensor *as, *b, *ids, *y;
    struct bt_graph *g;
};

static void moe1_build(struct moe1 *m, enum bt_type type, bt_backend_t cpu) {
    memset(m, 0, sizeof *m);
    m->ectx = meta_ctx(1);
    m->as = bt_set_name(bt_new_tensor_3d(m->ectx, type, 32, 16, 8), "experts");
    m->ebuf = alloc_weights(m->ectx, cpu);
    tu_rng r;
    tu_rng_init(&r, 4242);
    set_uniform(m->as, &r, -1, 1);
    m->ctx = meta_ctx(1);
    m->b = bt_set_name(bt_new_tensor_3d(m->ctx, BT_TYPE_F32, 32, 1, 5), "b");
    m->ids = bt_set_name(bt_new_tensor_2d(m->ctx, BT_TYPE_I32, 1, 5), "ids");
    bt_set_input(m->b);
    bt_set_input(m->ids);
    m->y = bt_set_name(bt_mul_mat_id(m->ctx, m->as, m->b, m->ids), "y");
    TU_OK(m->ctx, m->y);
    bt_set_output(m->y);
    m->g = bt_graph_new(m->ctx, 16);
    ck_assert_int_eq(bt_graph_build_forward_expand(m->g, m->y), BT_OK);
}

static void moe1_free(struct moe1 *m) {
    bt_buffer_free(m->ebuf);
    bt_free(m->ectx);
    bt_free(m->ctx);
}

static void moe1_set_inputs(struct moe1 *m, int mb, const int32_t ids[5]) {
    tu_rng r;
    tu_rng_init(&r, 300 + (uint64_t)mb);
    set_uniform(m->b, &r, -1, 1);
    set_i32(m->ids, ids);
}

START_TEST(test_moe_copies_used_experts) {
    static const int32_t id_sets[][5] = {{1, 1, 4, 6, 6}, {4, 5, 6, 4, 5}, {7, 0, 7, 0, 7}, {2, 3, 2, 3, 2},
                                         {0, 1, 2, 3, 7}, {6, 6, 6, 6, 6}};
    /* expert runs copied and experts used for each set */
    static const int runs[] = {3, 1, 2, 1, 2, 1};
    static const int used[] = {3, 3, 2, 2, 5, 1};
    const enum bt_type types[] = {BT_TYPE_F32, BT_TYPE_Q8_0};
    for (int ti = 0; ti < 2; ti++) {
        bt_backend_t lim = limited_backend("LIMITED0", NULL, 0);
        bt_backend_t cpu = cpu_backend();
        bt_backend_t backends[2] = {lim, cpu};
        struct moe1 m, ref;
        moe1_build(&m, types[ti], cpu);
        moe1_build(&ref, types[ti], cpu);
        bt_buffer_t ref_buf = alloc_ref(ref.ctx, cpu);
        const size_t expert_bytes = m.as->nb[2];
        ck_assert_uint_eq(expert_bytes, 16 * bt_row_size(types[ti], 32));

        bt_sched_t sched = new_sched(backends, 2, 1);
        bt_sched_set_tensor_backend(sched, m.y, lim);
        CK_STATUS(sched, bt_sched_split_graph(sched, m.g));
        ck_assert_int_eq(bt_sched_get_n_splits(sched), 1);
        const struct bt_sched_split *s = bt_sched_get_split(sched, 0);
        ck_assert_ptr_eq(bt_sched_get_backend(sched, s->backend_id), lim);
        ck_assert_int_eq(s->n_inputs, 3);
        ck_assert_ptr_eq(s->inputs[0], m.as); /* the ids are copied after the experts */
        for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
            const int32_t *ids = id_sets[k];
            CK_STATUS(sched, bt_sched_alloc_graph(sched, m.g));
            moe1_set_inputs(&m, (int)k, ids);
            bt_backend_limited_reset_stats(lim);
            const struct bt_sched_stats before = bt_sched_get_stats(sched);
            CK_STATUS(sched, bt_sched_graph_compute(sched, m.g));
            const struct bt_limited_stats ls = bt_backend_limited_stats(lim);
            const struct bt_sched_stats after = bt_sched_get_stats(sched);
            ck_assert_msg(ls.set_async_calls == (uint64_t)runs[k] &&
                              ls.set_async_bytes == (uint64_t)used[k] * expert_bytes,
                          "%s ids {%d %d %d %d %d}: %llu uploads of %llu bytes, want %d of %llu", bt_type_name(types[ti]),
                          ids[0], ids[1], ids[2], ids[3], ids[4], (unsigned long long)ls.set_async_calls,
                          (unsigned long long)ls.set_async_bytes, runs[k],
                          (unsigned long long)(used[k] * expert_bytes));
            ck_assert_uint_eq(after.moe_copies - before.moe_copies, (uint64_t)runs[k]);
            ck_assert_uint_eq(after.copy_bytes - before.copy_bytes,
                              used[k] * expert_bytes + bt_nbytes(m.b) + bt_nbytes(m.ids));
            /* b and ids went in whole (synchronous sets), the experts did not */
            ck_assert_uint_eq(ls.buffer_set_bytes, bt_nbytes(m.b) + bt_nbytes(m.ids));

            moe1_set_inputs(&ref, (int)k, ids);
            ck_assert_int_eq(bt_backend_graph_compute(cpu, ref.g), BT_OK);
            float *got = get_bytes(m.y), *want = get_bytes(ref.y);
            char what[96];
            snprintf(what, sizeof what, "MUL_MAT_ID %s, id set %zu", bt_type_name(types[ti]), k);
            assert_bitwise(got, want, 16 * 5, what);
            free(got);
            free(want);
        }
        bt_sched_free(sched);
        bt_buffer_free(ref_buf);
        moe1_free(&m);
        moe1_free(&ref);
        bt_backend_free(lim);
        bt_backend_free(cpu);
    }
}
END_TEST

/* 4b. The router and the experts' consumer in one LIMITED0 split: x pinned to
 * LIMITED0 (so the split has no other input), logits and top-k computed on
 * LIMITED0, experts in host memory copied in for a MUL_MAT_ID pinned to
 * LIMITED0.  The ids that select the experts are computed inside the split
 * that needs the experts copied: the result must still be right.
 *
 *   x [32, 5] (pinned LIMITED0)   router [32, 8] (LIMITED0 weights)
 *   sel = top_k(router x, 2) [2, 5]
 *   y = mul_mat_id(experts [32, 16, 8] (CPU weights), x [32,1,5], sel) [16, 2, 5]
 */
struct moe2 {
    bt_context *wctx, *ectx, *ctx;
    bt_buffer_t wbuf, ebuf;
    struct bt_tensor *router, *as, *x, *sel, *y;
    struct bt_graph *g;
};

static void moe2_build(struct moe2 *m, bt_backend_t w_backend, bt_backend_t cpu) {
    memset(m, 0, sizeof *m);
    tu_rng r;
    tu_rng_init(&r, 777);
    m->wctx = meta_ctx(1);
    m->router = bt_set_name(bt_new_tensor_2d(m->wctx, BT_TYPE_F32, 32, 8), "router");
    m->wbuf = alloc_weights(m->wctx, w_backend);
    set_uniform(m->router, &r, -1, 1);
    m->ectx = meta_ctx(1);
    m->as = bt_set_name(bt_new_tensor_3d(m->ectx, BT_TYPE_F32, 32, 16, 8), "experts");
    m->ebuf = alloc_weights(m->ectx, cpu);
    set_uniform(m->as, &r, -1, 1);
    m->ctx = meta_ctx(1);
    m->x = bt_set_name(bt_new_tensor_2d(m->ctx, BT_TYPE_F32, 32, 5), "x");
    bt_set_input(m->x);
    m->sel = bt_top_k(m->ctx, bt_set_name(bt_mul_mat(m->ctx, m->router, m->x), "logits"), 2);
    m->y = bt_set_name(bt_mul_mat_id(m->ctx, m->as, bt_reshape_3d(m->ctx, m->x, 32, 1, 5), m->sel), "y");
    TU_OK(m->ctx, m->y);
    bt_set_output(m->y);
    m->g = bt_graph_new(m->ctx, 32);
    ck_assert_int_eq(bt_graph_build_forward_expand(m->g, m->y), BT_OK);
}

static void moe2_free(struct moe2 *m) {
    bt_buffer_free(m->wbuf);
    bt_buffer_free(m->ebuf);
    bt_free(m->wctx);
    bt_free(m->ectx);
    bt_free(m->ctx);
}

START_TEST(test_moe_ids_computed_in_split) {
    bt_backend_t lim = limited_backend("LIMITED0", NULL, 0);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    struct moe2 m, ref;
    moe2_build(&m, lim, cpu);
    moe2_build(&ref, cpu, cpu);
    bt_buffer_t ref_buf = alloc_ref(ref.ctx, cpu);
    bt_sched_t sched = new_sched(backends, 2, 1);
    bt_sched_set_tensor_backend(sched, m.x, lim);
    bt_sched_set_tensor_backend(sched, m.y, lim);
    for (int mb = 0; mb < 4; mb++) {
        CK_STATUS(sched, bt_sched_alloc_graph(sched, m.g));
        tu_rng r;
        tu_rng_init(&r, 60 + (uint64_t)mb);
        set_uniform(m.x, &r, -1, 1);
        tu_rng_init(&r, 60 + (uint64_t)mb);
        set_uniform(ref.x, &r, -1, 1);
        const enum bt_status st = bt_sched_graph_compute(sched, m.g);
        if (st != BT_OK || mb == 0) {
            char *plan = plan_text(sched);
            if (st != BT_OK) ck_abort_msg("micro-batch %d: %s: %s\n%s", mb, bt_status_str(st), bt_sched_error(sched), plan);
            free(plan);
        }
        ck_assert_int_eq(bt_backend_graph_compute(cpu, ref.g), BT_OK);
        float *got = get_bytes(m.y), *want = get_bytes(ref.y);
        char what[64];
        snprintf(what, sizeof what, "MoE with ids computed in the split, micro-batch %d", mb);
        assert_bitwise(got, want, 16 * 2 * 5, what);
        free(got);
        free(want);
    }
    bt_sched_free(sched);
    bt_buffer_free(ref_buf);
    moe2_free(&m);
    moe2_free(&ref);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* 4c. One expert tensor read by two MUL_MAT_IDs on LIMITED0 with a CPU split
 * between them (shared or tied expert weights): the copy the first split
 * made holds only the experts its ids chose, so the second split, whose ids
 * choose others, must get its own experts copied.
 *
 *   experts [32, 16, 8] (CPU weights), b [32, 1, 5], ids1, ids2 [1, 5]
 *   y1 = mul_mat_id(experts, b, ids1)     LIMITED0
 *   c  = b * 2                            CPU
 *   y2 = mul_mat_id(experts, c, ids2)     LIMITED0
 */
struct moe3 {
    bt_context *ectx, *ctx;
    bt_buffer_t ebuf;
    struct bt_tensor *as, *b, *ids1, *ids2, *c, *y1, *y2, *out;
    struct bt_graph *g;
};

static void moe3_build(struct moe3 *m, bt_backend_t cpu) {
    memset(m, 0, sizeof *m);
    m->ectx = meta_ctx(1);
    m->as = bt_set_name(bt_new_tensor_3d(m->ectx, BT_TYPE_F32, 32, 16, 8), "experts");
    m->ebuf = alloc_weights(m->ectx, cpu);
    tu_rng r;
    tu_rng_init(&r, 4343);
    set_uniform(m->as, &r, -1, 1);
    m->ctx = meta_ctx(1);
    m->b = bt_set_name(bt_new_tensor_3d(m->ctx, BT_TYPE_F32, 32, 1, 5), "b");
    m->ids1 = bt_set_name(bt_new_tensor_2d(m->ctx, BT_TYPE_I32, 1, 5), "ids1");
    m->ids2 = bt_set_name(bt_new_tensor_2d(m->ctx, BT_TYPE_I32, 1, 5), "ids2");
    bt_set_input(m->b);
    bt_set_input(m->ids1);
    bt_set_input(m->ids2);
    m->y1 = bt_set_name(bt_mul_mat_id(m->ctx, m->as, m->b, m->ids1), "y1");
    m->c = bt_set_name(bt_scale(m->ctx, m->b, 2.0f), "c");
    m->y2 = bt_set_name(bt_mul_mat_id(m->ctx, m->as, m->c, m->ids2), "y2");
    m->out = bt_set_name(bt_concat(m->ctx, m->y1, m->y2, 0), "out");
    TU_OK(m->ctx, m->out);
    bt_set_output(m->out);
    m->g = bt_graph_new(m->ctx, 32);
    ck_assert_int_eq(bt_graph_build_forward_expand(m->g, m->out), BT_OK);
}

static void moe3_set_inputs(struct moe3 *m, int mb, const int32_t *ids1, const int32_t *ids2) {
    tu_rng r;
    tu_rng_init(&r, 500 + (uint64_t)mb);
    set_uniform(m->b, &r, -1, 1);
    set_i32(m->ids1, ids1);
    set_i32(m->ids2, ids2);
}

START_TEST(test_moe_copy_reused_by_later_split) {
    static const int32_t ids1[][5] = {{0, 1, 1, 0, 1}, {6, 7, 6, 7, 6}, {3, 3, 3, 3, 3}};
    static const int32_t ids2[][5] = {{6, 7, 7, 6, 6}, {0, 1, 0, 1, 0}, {3, 4, 5, 4, 3}};
    bt_backend_t lim = limited_backend("LIMITED0", NULL, 0);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    for (int nc = 1; nc <= 2; nc++) {
        struct moe3 m, ref;
        moe3_build(&m, cpu);
        moe3_build(&ref, cpu);
        bt_buffer_t ref_buf = alloc_ref(ref.ctx, cpu);
        bt_sched_t sched = new_sched(backends, 2, nc);
        bt_sched_set_tensor_backend(sched, m.y1, lim);
        bt_sched_set_tensor_backend(sched, m.c, cpu);
        bt_sched_set_tensor_backend(sched, m.y2, lim);
        bt_sched_set_tensor_backend(sched, m.out, lim);
        for (int k = 0; k < 3; k++) {
            CK_STATUS(sched, bt_sched_alloc_graph(sched, m.g));
            if (k == 0) {
                char *plan = plan_text(sched);
                ck_assert_msg(bt_sched_get_n_splits(sched) == 3, "%d splits, want 3 (LIMITED0, CPU, LIMITED0):\n%s",
                              bt_sched_get_n_splits(sched), plan);
                free(plan);
            }
            moe3_set_inputs(&m, k, ids1[k], ids2[k]);
            const struct bt_sched_stats before = bt_sched_get_stats(sched);
            CK_STATUS(sched, bt_sched_graph_compute(sched, m.g));
            const struct bt_sched_stats after = bt_sched_get_stats(sched);
            /* still only the used experts: at most 2 + 3 of the 8, twice */
            ck_assert_uint_le(after.copy_bytes - before.copy_bytes,
                              5 * m.as->nb[2] + 2 * bt_nbytes(m.b) + 2 * bt_nbytes(m.ids1) + bt_nbytes(m.c));
            moe3_set_inputs(&ref, k, ids1[k], ids2[k]);
            ck_assert_int_eq(bt_backend_graph_compute(cpu, ref.g), BT_OK);
            float *got = get_bytes(m.out), *want = get_bytes(ref.out);
            char what[96];
            snprintf(what, sizeof what, "n_copies %d, ids set %d: [y1 y2]", nc, k);
            assert_bitwise(got, want, 2 * 16 * 5, what);
            free(got);
            free(want);
        }
        bt_sched_free(sched);
        bt_buffer_free(ref_buf);
        bt_buffer_free(m.ebuf);
        bt_buffer_free(ref.ebuf);
        bt_free(m.ectx);
        bt_free(ref.ectx);
        bt_free(m.ctx);
        bt_free(ref.ctx);
    }
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* ---- 5. the eval callback -------------------------------------------------------- */

struct eval_log {
    const char *want;    /* ask only for this node (NULL: every node) */
    const char *stop_at; /* return false after this node (NULL: never) */
    char asked[32][BT_MAX_NAME];
    int n_asked;
    char seen[32][BT_MAX_NAME];
    int n_seen;
    float F[64]; /* F's data when seen */
    bool have_F;
};

static bool eval_cb(struct bt_tensor *t, bool ask, void *user_data) {
    struct eval_log *log = user_data;
    if (ask) {
        if (log->n_asked < 32) snprintf(log->asked[log->n_asked++], BT_MAX_NAME, "%s", t->name);
        return log->want == NULL || strcmp(t->name, log->want) == 0;
    }
    if (log->n_seen < 32) snprintf(log->seen[log->n_seen++], BT_MAX_NAME, "%s", t->name);
    if (strcmp(t->name, "F") == 0) {
        bt_tensor_get(t, log->F, 0, sizeof log->F);
        log->have_F = true;
    }
    return log->stop_at == NULL || strcmp(t->name, log->stop_at) != 0;
}

static void assert_names(char names[][BT_MAX_NAME], int n, const char *const *want, int n_want, const char *what) {
    char got[512] = "";
    for (int i = 0; i < n; i++) {
        strncat(got, names[i], sizeof got - strlen(got) - 2);
        strncat(got, " ", sizeof got - strlen(got) - 1);
    }
    ck_assert_msg(n == n_want, "%s: %d calls (%s), want %d", what, n, got, n_want);
    for (int i = 0; i < n; i++) ck_assert_msg(strcmp(names[i], want[i]) == 0, "%s: [%s], want %s at %d", what, got, want[i], i);
}

START_TEST(test_eval_callback) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    /* G = cpy(F, out_user): the last node writes into a user tensor in a CPU
     * buffer, so a run stopped early leaves it untouched */
    struct chain c;
    chain_build(&c, lim, NULL, cpu);
    struct bt_tensor *out_user = c.out->view_src;
    bt_sched_t sched = new_sched(backends, 2, 2);
    CK_STATUS(sched, bt_sched_split_graph(sched, c.g));
    ck_assert_int_eq(bt_sched_get_n_splits(sched), 4); /* LIMITED0 [A B C], CPU [D], LIMITED0 [E F], CPU [G] */
    static const char *const all[] = {"A", "B", "C", "D", "E", "F", "G"};
    ck_assert_int_eq(c.g->n_nodes, 7);
    float *want = chain_reference(cpu, 0);

    /* (a) every node, once, in order; data readable when seen */
    struct eval_log log = {0};
    bt_sched_set_eval_callback(sched, eval_cb, &log);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
    chain_set_input(&c, 0);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
    assert_names(log.asked, log.n_asked, all, 7, "asked");
    assert_names(log.seen, log.n_seen, all, 7, "seen");
    ck_assert(log.have_F);
    assert_bitwise(log.F, want, 64, "F as the callback saw it");
    float out[64];
    bt_tensor_get(out_user, out, 0, sizeof out);
    assert_bitwise(out, want, 64, "out_user");

    /* (b) stop after B (LIMITED0, split 0): C and everything after never run */
    float sentinel[64];
    for (int i = 0; i < 64; i++) sentinel[i] = -12345.0f;
    for (int stop = 0; stop < 2; stop++) {
        const char *stop_at = stop == 0 ? "B" : "D";
        memset(&log, 0, sizeof log);
        log.stop_at = stop_at;
        bt_tensor_set(out_user, sentinel, 0, sizeof sentinel);
        CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
        chain_set_input(&c, 1);
        bt_backend_limited_reset_stats(lim);
        const enum bt_status st = bt_sched_graph_compute(sched, c.g);
        ck_assert_int_eq(st, BT_ERR_ABORTED);
        ck_assert_msg(strstr(bt_sched_error(sched), stop_at) != NULL, "message: %s", bt_sched_error(sched));
        const int n_run = stop == 0 ? 2 : 4; /* A B, or A B C D */
        assert_names(log.seen, log.n_seen, all, n_run, "seen before the stop");
        assert_names(log.asked, log.n_asked, all, n_run, "asked before the stop");
        const struct bt_limited_stats ls = bt_backend_limited_stats(lim);
        /* LIMITED0 ran A B (and C): one node per compute, nothing of E F */
        ck_assert_uint_eq(ls.nodes_computed, stop == 0 ? 2 : 3);
        bt_tensor_get(out_user, out, 0, sizeof out);
        ck_assert_msg(memcmp(out, sentinel, sizeof out) == 0, "G ran after the stop at %s", stop_at);
    }

    /* (c) ask only for D: every node is asked once, only D is seen, and the
     * nodes between are computed in ranges (one compute per LIMITED0 split) */
    memset(&log, 0, sizeof log);
    log.want = "D";
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
    chain_set_input(&c, 0);
    bt_backend_limited_reset_stats(lim);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
    assert_names(log.asked, log.n_asked, all, 7, "asked (want D)");
    static const char *const only_d[] = {"D"};
    assert_names(log.seen, log.n_seen, only_d, 1, "seen (want D)");
    ck_assert_uint_eq(bt_backend_limited_stats(lim).graph_computes, 2);
    ck_assert_uint_eq(bt_backend_limited_stats(lim).nodes_computed, 5);
    bt_tensor_get(out_user, out, 0, sizeof out);
    assert_bitwise(out, want, 64, "out_user (callback asking for D)");

    /* (d) without the callback the scheduler runs normally again */
    bt_sched_set_eval_callback(sched, NULL, NULL);
    bt_tensor_set(out_user, sentinel, 0, sizeof sentinel);
    CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
    chain_set_input(&c, 0);
    CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
    bt_tensor_get(out_user, out, 0, sizeof out);
    assert_bitwise(out, want, 64, "out_user (no callback)");
    free(want);
    bt_sched_free(sched);
    chain_free(&c);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* ---- 6. the n_copies ring ---------------------------------------------------------- */

static bool overlap(const struct bt_tensor *a, const struct bt_tensor *b) {
    const uint8_t *pa = a->data, *pb = b->data;
    return pa < pb + bt_nbytes(b) && pb < pa + bt_nbytes(a);
}

START_TEST(test_copy_ring) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    for (int nc = 1; nc <= 4; nc *= 2) {
        struct chain c;
        chain_build(&c, lim, NULL, NULL);
        bt_sched_t sched = new_sched(backends, 2, nc);
        ck_assert_int_eq(bt_sched_get_n_copies(sched), nc);
        uint64_t events = bt_backend_limited_stats(lim).events_recorded;
        for (int mb = 0; mb < 2 * nc + 1; mb++) {
            CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
            const int cur = bt_sched_get_cur_copy(sched);
            ck_assert_msg(cur == mb % nc, "n_copies %d, micro-batch %d: cur_copy %d", nc, mb, cur);
            /* every split input has n_copies distinct copies on its split's
             * backend, with memory of their own */
            ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);
            for (int s = 0; s < 3; s++) {
                const struct bt_sched_split *sp = bt_sched_get_split(sched, s);
                ck_assert_int_eq(sp->n_inputs, 1);
                const struct bt_tensor *in = sp->inputs[0];
                for (int a = 0; a < nc; a++) {
                    struct bt_tensor *ca = bt_sched_get_tensor_copy(sched, in, sp->backend_id, a);
                    ck_assert_msg(ca != NULL && ca->data != NULL, "split %d: no copy %d of %s", s, a, in->name);
                    ck_assert_ptr_ne(ca, in);
                    ck_assert_uint_eq(bt_nbytes(ca), bt_nbytes(in));
                    ck_assert(bt_buffer_get_type(ca->buffer) ==
                              bt_backend_get_default_buffer_type(bt_sched_get_backend(sched, sp->backend_id)));
                    for (int b = 0; b < a; b++) {
                        struct bt_tensor *cb = bt_sched_get_tensor_copy(sched, in, sp->backend_id, b);
                        ck_assert_ptr_ne(ca, cb);
                        ck_assert_msg(!overlap(ca, cb), "split %d: copies %d and %d of %s overlap", s, a, b, in->name);
                    }
                }
                ck_assert_ptr_null(bt_sched_get_tensor_copy(sched, in, sp->backend_id == 0 ? 1 : 0, 0));
            }
            /* between calls the graph has the user's sources */
            ck_assert_ptr_eq(c.D->src[0], c.C);
            ck_assert_ptr_eq(c.E->src[0], c.D);
            ck_assert_ptr_eq(c.A->src[1], c.x);
            chain_set_input(&c, mb);
            CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
            ck_assert_ptr_eq(c.E->src[0], c.D);
            if (nc > 1) {
                /* the run went through the current slot: its copies hold this
                 * micro-batch's x and D (a slot's memory is its own) */
                const struct bt_tensor *cx = bt_sched_get_tensor_copy(sched, c.x, 0, cur),
                                       *cd = bt_sched_get_tensor_copy(sched, c.D, 0, cur);
                float *gx = get_bytes(cx), *wx = get_bytes(c.x), *gd = get_bytes(cd), *wd = get_bytes(c.D);
                ck_assert_msg(memcmp(gx, wx, bt_nbytes(c.x)) == 0, "n_copies %d, micro-batch %d: slot %d's x", nc, mb, cur);
                ck_assert_msg(memcmp(gd, wd, bt_nbytes(c.D)) == 0, "n_copies %d, micro-batch %d: slot %d's D", nc, mb, cur);
                free(gx);
                free(wx);
                free(gd);
                free(wd);
            }
            /* LIMITED0's two splits have inputs: an event each */
            const uint64_t ev = bt_backend_limited_stats(lim).events_recorded;
            ck_assert_msg(ev >= events + 2, "events %llu -> %llu", (unsigned long long)events, (unsigned long long)ev);
            events = ev;
            assert_chain_output(&c, cpu, mb, "chain through the ring");
        }
        bt_sched_free(sched);
        ck_assert_ptr_eq(c.E->src[0], c.D);
        ck_assert_ptr_eq(c.A->src[1], c.x);
        chain_free(&c);
    }
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* ---- 7. the allocator behind the scheduler --------------------------------------- */

START_TEST(test_buffer_sizes_stable) {
    const enum bt_op refused[] = {BT_OP_SOFT_MAX, BT_OP_ARGSORT, BT_OP_ROPE, BT_OP_SWIGLU};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 4);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    float *want[N_MICRO];
    net_reference(NET_MOE_SHARED, cpu, want);
    for (int nc = 1; nc <= 2; nc++) {
        struct net n;
        net_build(&n, NET_MOE_SHARED, cpu, cpu);
        bt_sched_t sched = new_sched(backends, 2, nc);
        for (int i = 0; i < n.n_mm; i++) bt_sched_set_tensor_backend(sched, n.mm[i], lim);
        /* before anything is planned: no memory */
        ck_assert_uint_eq(bt_sched_get_buffer_size(sched, lim), 0);
        ck_assert_uint_eq(bt_sched_get_buffer_size(sched, cpu), 0);
        CK_STATUS(sched, bt_sched_reserve(sched, n.g));
        const size_t size_lim = bt_sched_get_buffer_size(sched, lim), size_cpu = bt_sched_get_buffer_size(sched, cpu);
        ck_assert_uint_gt(size_lim, 0);
        ck_assert_uint_gt(size_cpu, 0);
        void *out_data = NULL;
        for (int mb = 0; mb < N_MICRO; mb++) {
            CK_STATUS(sched, bt_sched_alloc_graph(sched, n.g));
            if (mb == 0) out_data = n.out->data;
            ck_assert_ptr_nonnull(out_data);
            ck_assert_ptr_eq(n.out->data, out_data); /* placed once */
            net_set_inputs(&n, mb);
            CK_STATUS(sched, bt_sched_graph_compute(sched, n.g));
            ck_assert_uint_eq(bt_sched_get_buffer_size(sched, lim), size_lim);
            ck_assert_uint_eq(bt_sched_get_buffer_size(sched, cpu), size_cpu);
            float *got = get_bytes(n.out);
            assert_bitwise(got, want[mb], DM * NT, "shared MoE, reserved");
            free(got);
        }
        bt_sched_free(sched);
        net_free(&n);
    }
    for (int mb = 0; mb < N_MICRO; mb++) free(want[mb]);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST


/* ---- 8. capacity: many graphs on one scheduler, many inputs in one split ---- */

/* A small scheduler planning one new graph after another (earlier contexts
 * still alive): the table of tensors does not fill up, and an earlier graph's
 * pins do not leak into later ones. */
/* bt_sched_new's bad arguments are a status and a message
 * in the caller's buffer, with nothing printed. */
START_TEST(test_new_errors) {
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[1] = {cpu};
    struct tu_stderr cap;
    tu_stderr_begin(&cap);
    bt_sched_t s = (bt_sched_t)backends; /* overwritten */
    char err[256] = "";
    const enum bt_status st1 = bt_sched_new(backends, NULL, 1, 8, BT_SCHED_MAX_COPIES + 1, &s, err, sizeof err);
    const bool null1 = s == NULL;
    char err1[256];
    snprintf(err1, sizeof err1, "%s", err);
    const enum bt_status st2 = bt_sched_new(backends, NULL, 0, 8, 1, &s, err, sizeof err);
    const enum bt_status st3 = bt_sched_new(backends, NULL, 1, 0, 1, &s, NULL, 0);
    const long printed = tu_stderr_end(&cap);
    ck_assert_int_eq(st1, BT_ERR_INVALID);
    ck_assert(null1);
    char want[64];
    snprintf(want, sizeof want, "n_copies = %d", BT_SCHED_MAX_COPIES + 1);
    ck_assert_msg(strstr(err1, want) != NULL, "%s", err1);
    ck_assert_int_eq(st2, BT_ERR_INVALID);
    ck_assert_msg(strstr(err, "0 backends") != NULL, "%s", err);
    ck_assert_int_eq(st3, BT_ERR_INVALID);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(printed, 0); /* nothing on stderr */
    bt_backend_free(cpu);
}
END_TEST

START_TEST(test_many_graphs) {
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[1] = {cpu};
    bt_sched_t sched = NULL;
    ck_assert_int_eq(bt_sched_new(backends, NULL, 1, 8, 1, &sched, NULL, 0), BT_OK);
    bt_context *ctxs[300];
    for (int it = 0; it < 300; it++) {
        bt_context *ctx = bt_init((struct bt_init_params){1 << 16, NULL, true});
        ctxs[it] = ctx;
        struct bt_tensor *x = bt_new_tensor_1d(ctx, BT_TYPE_F32, 4);
        bt_set_input(x);
        struct bt_tensor *y = bt_sqr(ctx, x);
        struct bt_tensor *z = bt_scale(ctx, y, 2.0f);
        struct bt_graph *g = bt_graph_new(ctx, 8);
        ck_assert_int_eq(bt_graph_build_forward_expand(g, z), BT_OK);
        bt_sched_set_tensor_backend(sched, y, cpu);
        CK_STATUS(sched, bt_sched_alloc_graph(sched, g));
        const float in[4] = {1, 2, 3, (float)it};
        bt_tensor_set(x, in, 0, sizeof in);
        CK_STATUS(sched, bt_sched_graph_compute(sched, g));
        float out[4];
        bt_tensor_get(z, out, 0, sizeof out);
        ck_assert(out[3] == 2.0f * (float)it * (float)it);
    }
    bt_sched_free(sched);
    for (int it = 0; it < 300; it++) bt_free(ctxs[it]);
    bt_backend_free(cpu);
}
END_TEST

/* 8b. The usual loop: one scheduler, a new graph every step, the previous
 * step's contexts freed before the next plan.  Planning the next graph must
 * not write into the freed one (under -DBATON_SANITIZE=ON a write there is a
 * heap-use-after-free), and every step's result is right. */
START_TEST(test_free_every_step) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    for (int nc = 1; nc <= 2; nc++) {
        bt_sched_t sched = new_sched(backends, 2, nc);
        for (int step = 0; step < 6; step++) {
            struct chain c;
            chain_build(&c, lim, NULL, NULL);
            CK_STATUS(sched, bt_sched_alloc_graph(sched, c.g));
            ck_assert_int_eq(bt_sched_get_n_splits(sched), 3);
            chain_set_input(&c, step);
            CK_STATUS(sched, bt_sched_graph_compute(sched, c.g));
            char what[64];
            snprintf(what, sizeof what, "n_copies %d, step %d", nc, step);
            assert_chain_output(&c, cpu, step, what);
            /* after the run the graph is the user's again: sources as built */
            ck_assert_ptr_eq(c.D->src[0], c.C);
            ck_assert_ptr_eq(c.E->src[0], c.D);
            ck_assert_ptr_eq(c.A->src[1], c.x);
            chain_free(&c);
        }
        bt_sched_free(sched); /* after the last graph was freed, too */
    }
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* The chain of test 1 in a context over the caller's arena, W given. */
static struct bt_graph *arena_chain(void *arena, size_t size, struct bt_tensor *W, int64_t n_tok, bt_context **ctx,
                                    struct chain *c) {
    memset(c, 0, sizeof *c);
    *ctx = bt_init((struct bt_init_params){size, arena, true});
    ck_assert_ptr_nonnull(*ctx);
    c->W = W;
    c->x = bt_set_name(bt_new_tensor_2d(*ctx, BT_TYPE_F32, 32, n_tok), "x");
    bt_set_input(c->x);
    c->A = bt_set_name(bt_mul_mat(*ctx, W, c->x), "A");
    c->B = bt_set_name(bt_scale(*ctx, c->A, 0.5f), "B");
    c->C = bt_set_name(bt_sqr(*ctx, c->B), "C");
    c->D = bt_set_name(bt_sqrt(*ctx, c->C), "D");
    c->E = bt_set_name(bt_scale(*ctx, c->D, 2.0f), "E");
    c->F = bt_set_name(bt_add(*ctx, c->E, c->D), "F");
    TU_OK(*ctx, c->F);
    bt_set_output(c->F);
    c->g = bt_graph_new(*ctx, 64);
    ck_assert_int_eq(bt_graph_build_forward_expand(c->g, c->F), BT_OK);
    return c->g;
}

/* 8c. The same loop with one arena reused for every step's context: each
 * new graph lies exactly where the previous one lay (same graph address,
 * structure two steps running, then another token count for two steps).  Nothing
 * the scheduler did to the old graph may show in the new one: each new graph
 * is placed and computed as if it were the first. */
START_TEST(test_arena_reused_every_step) {
    const enum bt_op refused[] = {BT_OP_SQRT};
    bt_backend_t lim = limited_backend("LIMITED0", refused, 1);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    bt_context *wctx = meta_ctx(1);
    struct bt_tensor *W = bt_set_name(bt_new_tensor_2d(wctx, BT_TYPE_F32, 32, 16), "W");
    bt_buffer_t wbuf = alloc_weights(wctx, lim);
    tu_rng r;
    tu_rng_init(&r, 11); /* chain_build's W */
    set_uniform(W, &r, -1, 1);
    const size_t size = 1 << 20;
    void *arena = malloc(size);
    ck_assert_ptr_nonnull(arena);
    bt_sched_t sched = new_sched(backends, 2, 2);
    struct bt_graph *first = NULL;
    for (int step = 0; step < 8; step++) {
        struct chain c;
        bt_context *ctx;
        struct bt_graph *g = arena_chain(arena, size, W, (step / 2) % 2 ? 3 : 4, &ctx, &c);
        if (step == 0) first = g;
        ck_assert_ptr_eq(g, first); /* the same address every step */
        CK_STATUS(sched, bt_sched_alloc_graph(sched, g));
        ck_assert_ptr_nonnull(c.x->data);
        chain_set_input(&c, step);
        CK_STATUS(sched, bt_sched_graph_compute(sched, g));
        ck_assert_ptr_eq(c.E->src[0], c.D);
        if ((step / 2) % 2 == 0) { /* chain_reference computes 4 tokens */
            char what[64];
            snprintf(what, sizeof what, "arena reused, step %d", step);
            assert_chain_output(&c, cpu, step, what);
        }
        bt_free(ctx);
        memset(arena, 0xa5, size); /* what a reused arena holds between steps */
    }
    bt_sched_free(sched);
    free(arena);
    bt_buffer_free(wbuf);
    bt_free(wctx);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

/* 40 nodes on LIMITED0 that each need two new inputs from the CPU: splits
 * are cut before the inputs overflow (no abort), and the result is right. */
START_TEST(test_many_inputs) {
    bt_backend_t lim = limited_backend("LIMITED0", NULL, 0);
    bt_backend_t cpu = cpu_backend();
    bt_backend_t backends[2] = {lim, cpu};
    bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, false});
    enum { N = 40 };
    struct bt_tensor *a[N], *b[N], *sum = NULL;
    for (int i = 0; i < N; i++) {
        a[i] = bt_new_tensor_1d(ctx, BT_TYPE_F32, 8);
        b[i] = bt_new_tensor_1d(ctx, BT_TYPE_F32, 8);
        for (int j = 0; j < 8; j++) {
            ((float *)a[i]->data)[j] = (float)(i + j);
            ((float *)b[i]->data)[j] = (float)(i * j);
        }
    }
    struct bt_tensor *nodes[N];
    for (int i = 0; i < N; i++) {
        nodes[i] = bt_add(ctx, a[i], b[i]);
        sum = sum ? bt_add(ctx, sum, nodes[i]) : nodes[i];
    }
    bt_set_output(sum);
    struct bt_graph *g = bt_graph_new(ctx, 4 * N);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, sum), BT_OK);
    bt_sched_t sched = new_sched(backends, 2, 1);
    for (int i = 0; i < N; i++) bt_sched_set_tensor_backend(sched, nodes[i], lim);
    CK_STATUS(sched, bt_sched_split_graph(sched, g));
    for (int s2 = 0; s2 < bt_sched_get_n_splits(sched); s2++)
        ck_assert_int_le(bt_sched_get_split(sched, s2)->n_inputs, BT_SCHED_MAX_SPLIT_INPUTS);
    CK_STATUS(sched, bt_sched_graph_compute(sched, g));
    float got[8];
    memcpy(got, sum->data, sizeof got);
    for (int j = 0; j < 8; j++) {
        float want = 0;
        for (int i = 0; i < N; i++) want += (float)(i + j) + (float)(i * j);
        ck_assert_msg(fabsf(got[j] - want) <= 1e-3f * fabsf(want), "[%d] %f want %f", j, got[j], want);
    }
    bt_sched_free(sched);
    bt_free(ctx);
    bt_backend_free(lim);
    bt_backend_free(cpu);
}
END_TEST

int main(void) {
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_seed_example_plan);
    tcase_add_test(tc, test_new_errors);
    tcase_add_test(tc, test_user_assignment);
    tcase_add_test(tc, test_pin_after_plan);
    tcase_add_test(tc, test_two_pins);
    tcase_add_test(tc, test_reset_after_run);
    tcase_add_test(tc, test_views_follow_source);
    tcase_add_test(tc, test_unsupported_op);
    tcase_add_test(tc, test_preallocated_node_unusable);
    tcase_add_test(tc, test_async_backend_matches_cpu);
    tcase_add_test(tc, test_mlp_matches_cpu);
    tcase_add_test(tc, test_attention_matches_cpu);
    tcase_add_test(tc, test_moe_dense_matches_cpu);
    tcase_add_test(tc, test_moe_top2_matches_cpu);
    tcase_add_test(tc, test_moe_shared_matches_cpu);
    tcase_add_test(tc, test_two_graphs_alternate);
    tcase_add_test(tc, test_moe_copies_used_experts);
    tcase_add_test(tc, test_moe_ids_computed_in_split);
    tcase_add_test(tc, test_moe_copy_reused_by_later_split);
    tcase_add_test(tc, test_eval_callback);
    tcase_add_test(tc, test_copy_ring);
    tcase_add_test(tc, test_buffer_sizes_stable);
    tcase_add_test(tc, test_many_graphs);
    tcase_add_test(tc, test_many_inputs);
    tcase_add_test(tc, test_free_every_step);
    tcase_add_test(tc, test_arena_reused_every_step);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
