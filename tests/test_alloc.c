/* test_alloc.c - the graph allocator: no two tensors live at the same time
 * overlap (liveness simulated here from the graph order), the peak of a chain
 * does not grow with its length, in-place reuse where allowed and only there,
 * reserve-then-smaller graphs without reallocation, re-reserve of a larger
 * graph, pre-allocated weights left alone, error messages, and results on the
 * CPU backend bitwise equal to a context that holds its own data. */
#include <string.h>

#include "baton/alloc.h"
#include "backend-impl.h"
#include "baton/backend.h"
#include "testutil.h"

#define N_THREADS 2

static bt_context *na_ctx(size_t mb) {
    bt_context *ctx = bt_init((struct bt_init_params){mb * 1024 * 1024, NULL, true});
    ck_assert_ptr_nonnull(ctx);
    return ctx;
}

static int index_in(struct bt_tensor **arr, int n, const struct bt_tensor *t) {
    for (int i = 0; i < n; i++)
        if (arr[i] == t) return i;
    return -1;
}

/* ---- liveness check ----------------------------------------------------------
 *
 * Every tensor that owns memory in buf (not a view) is live over the steps
 * [start, end]: start is the node that produces it (-1 for leafs and INPUT
 * nodes, which exist before the first node); end is the last node that reads
 * it directly or through a view.  Outputs, inputs, nodes nobody reads and
 * views nobody reads live to the end.  Two tensors live at the same step must
 * not overlap, except a node computed in place over a source whose last
 * reader it is (end of one == start of the other, same data). */

struct live {
    struct bt_tensor *t;
    int start, end;
};

static bool reads(const struct bt_tensor *node, const struct bt_tensor *owner) {
    for (int j = 0; j < BT_MAX_SRC; j++) {
        const struct bt_tensor *s = node->src[j];
        if (s && (s == owner || s->view_src == owner)) return true;
    }
    return false;
}

static void check_no_overlap(struct bt_graph *g, bt_buffer_t buf) {
    const int nn = g->n_nodes, nl = g->n_leafs;
    struct live *lv = calloc((size_t)(nn + nl), sizeof *lv);
    int *n_readers = calloc((size_t)(nn + nl), sizeof *n_readers); /* per graph tensor */
    ck_assert(lv && n_readers);
    for (int i = 0; i < nn; i++) {
        for (int j = 0; j < BT_MAX_SRC; j++) {
            const struct bt_tensor *s = g->nodes[i]->src[j];
            if (!s) continue;
            int k = index_in(g->nodes, nn, s);
            if (k < 0 && (k = index_in(g->leafs, nl, s)) >= 0) k += nn;
            if (k >= 0) n_readers[k]++;
        }
    }
    int n = 0;
    for (int k = 0; k < nl + nn; k++) {
        struct bt_tensor *t = k < nl ? g->leafs[k] : g->nodes[k - nl];
        ck_assert_msg(t->data != NULL, "tensor '%s' was not placed", t->name);
        if (t->view_src || t->buffer != buf) continue;
        const bool early = k < nl || (t->flags & BT_TENSOR_FLAG_INPUT);
        lv[n].t = t;
        lv[n].start = early ? -1 : k - nl;
        lv[n].end = lv[n].start;
        n++;
    }
    for (int a = 0; a < n; a++) {
        struct live *l = &lv[a];
        bool forever = (l->t->flags & (BT_TENSOR_FLAG_OUTPUT | BT_TENSOR_FLAG_INPUT)) != 0;
        for (int i = 0; i < nn; i++) {
            struct bt_tensor *node = g->nodes[i];
            if (reads(node, l->t) && i > l->end) l->end = i;
            if (node->view_src == l->t) {
                if (i > l->end) l->end = i;
                /* a view nobody reads, or a pinned view, is read after the run */
                if (n_readers[i] == 0 || (node->flags & (BT_TENSOR_FLAG_OUTPUT | BT_TENSOR_FLAG_INPUT)))
                    forever = true;
            }
        }
        const int k = index_in(g->nodes, nn, l->t);
        if (k >= 0 && l->end == l->start && n_readers[k] == 0) forever = true;
        if (k == nn - 1) forever = true;
        if (forever) l->end = nn;
    }
    const uint8_t *base = bt_buffer_get_base(buf);
    const size_t size = bt_buffer_get_size(buf);
    for (int a = 0; a < n; a++) {
        const uint8_t *pa = lv[a].t->data;
        ck_assert_msg(pa >= base && pa + bt_nbytes(lv[a].t) <= base + size, "'%s' outside its buffer",
                      lv[a].t->name);
        for (int b = a + 1; b < n; b++) {
            const uint8_t *pb = lv[b].t->data;
            const bool mem = pa < pb + bt_nbytes(lv[b].t) && pb < pa + bt_nbytes(lv[a].t);
            if (!mem) continue;
            const struct live *x = &lv[a], *y = &lv[b];
            if (y->start < x->start) {
                const struct live *tmp = x;
                x = y;
                y = tmp;
            }
            /* x starts first: y must start after x's last read, or exactly at
             * it as an in-place computation over x */
            if (y->start > x->end) continue;
            const bool inplace = y->start == x->end && y->start >= 0 && x->t->data == y->t->data &&
                                 bt_nbytes(x->t) == bt_nbytes(y->t) && reads(y->t, x->t);
            ck_assert_msg(inplace, "'%s' [%d, %d] and '%s' [%d, %d] overlap in memory", x->t->name,
                          x->start, x->end, y->t->name, y->start, y->end);
        }
    }
    free(lv);
    free(n_readers);
}

/* ---- graphs --------------------------------------------------------------------
 *
 * A builder makes its parameters in wctx (the same ones in the same order on
 * every call), its inputs in ctx flagged INPUT, and its outputs flagged
 * OUTPUT.  n is the batch (number of tokens). */

struct model {
    struct bt_tensor *params[32];
    int n_params;
    struct bt_tensor *inputs[4];
    int n_inputs;
    struct bt_tensor *outs[4];
    int n_outs;
};

typedef void (*build_fn)(bt_context *ctx, bt_context *wctx, int64_t n, struct model *m);

static struct bt_tensor *param(struct model *m, struct bt_tensor *t, const char *name) {
    bt_set_name(t, name);
    bt_set_weight(t);
    m->params[m->n_params++] = t;
    return t;
}

static struct bt_tensor *input(struct model *m, struct bt_tensor *t, const char *name) {
    bt_set_name(t, name);
    bt_set_input(t);
    m->inputs[m->n_inputs++] = t;
    return t;
}

static void output(struct model *m, struct bt_tensor *t) {
    bt_set_output(t);
    m->outs[m->n_outs++] = t;
}

/* Two pre-norm SwiGLU MLP layers with residuals. */
static void build_mlp(bt_context *ctx, bt_context *wctx, int64_t n, struct model *m) {
    const int64_t d = 64, h = 96;
    memset(m, 0, sizeof *m);
    struct bt_tensor *x = input(m, bt_new_tensor_2d(ctx, BT_TYPE_F32, d, n), "x");
    for (int l = 0; l < 2; l++) {
        struct bt_tensor *gn = param(m, bt_new_tensor_1d(wctx, BT_TYPE_F32, d), "norm");
        struct bt_tensor *w1 = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, d, h), "w1");
        struct bt_tensor *w2 = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, d, h), "w2");
        struct bt_tensor *w3 = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, h, d), "w3");
        struct bt_tensor *xn = bt_mul(ctx, bt_rms_norm(ctx, x, 1e-5f), gn);
        struct bt_tensor *gate = bt_set_name(bt_mul_mat(ctx, w1, xn), "gate"); /* [h, n] */
        struct bt_tensor *up = bt_set_name(bt_mul_mat(ctx, w2, xn), "up");
        struct bt_tensor *act = bt_set_name(bt_swiglu(ctx, gate, up), "act");
        struct bt_tensor *down = bt_set_name(bt_mul_mat(ctx, w3, act), "down"); /* [d, n] */
        x = bt_format_name(bt_add(ctx, down, x), "x%d", l + 1);
    }
    TU_OK(ctx, x);
    output(m, x);
}

/* Multi-head attention over reshapes and permutes, a copy into a data-less
 * cache tensor, a partial view and a transpose. */
static void build_attn(bt_context *ctx, bt_context *wctx, int64_t n, struct model *m) {
    const int64_t d = 64, nh = 4, hd = 16;
    memset(m, 0, sizeof *m);
    struct bt_tensor *x = input(m, bt_new_tensor_2d(ctx, BT_TYPE_F32, d, n), "x");
    struct bt_tensor *wq = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, d, d), "wq");
    struct bt_tensor *wk = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, d, d), "wk");
    struct bt_tensor *wv = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, d, d), "wv");
    struct bt_tensor *wo = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, d, d), "wo");

    struct bt_tensor *q = bt_set_name(bt_mul_mat(ctx, wq, x), "q");
    struct bt_tensor *k = bt_set_name(bt_mul_mat(ctx, wk, x), "k");
    struct bt_tensor *v = bt_set_name(bt_mul_mat(ctx, wv, x), "v");
    struct bt_tensor *qp = bt_permute(ctx, bt_reshape_3d(ctx, q, hd, nh, n), 0, 2, 1, 3); /* [hd, n, nh] */
    struct bt_tensor *kp = bt_permute(ctx, bt_reshape_3d(ctx, k, hd, nh, n), 0, 2, 1, 3);
    struct bt_tensor *kq = bt_set_name(bt_mul_mat(ctx, kp, qp), "kq"); /* [n, n, nh] */
    kq = bt_soft_max_ext(ctx, kq, NULL, 0.25f);
    struct bt_tensor *vt =
        bt_cont(ctx, bt_permute(ctx, bt_reshape_3d(ctx, v, hd, nh, n), 1, 2, 0, 3)); /* [n, hd, nh] */
    struct bt_tensor *kqv = bt_set_name(bt_mul_mat(ctx, vt, kq), "kqv"); /* [hd, n, nh] */
    struct bt_tensor *merged =
        bt_reshape_2d(ctx, bt_cont(ctx, bt_permute(ctx, kqv, 0, 2, 1, 3)), d, n); /* [d, n] */
    struct bt_tensor *o = bt_set_name(bt_mul_mat(ctx, wo, merged), "o");

    /* k copied into a cache tensor that only the allocator gives memory */
    struct bt_tensor *cache = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, d, n), "cache");
    struct bt_tensor *kc = bt_scale(ctx, bt_cpy(ctx, k, cache), 0.5f);

    struct bt_tensor *y = bt_set_name(bt_add(ctx, bt_add(ctx, o, x), kc), "y");
    struct bt_tensor *half = bt_view_2d(ctx, y, d / 2, n, y->nb[1], 0);
    struct bt_tensor *out1 = bt_sum_rows(ctx, bt_scale(ctx, half, 3.0f));
    struct bt_tensor *out2 = bt_cont(ctx, bt_transpose(ctx, y));
    TU_OK(ctx, out1);
    TU_OK(ctx, out2);
    output(m, out1);
    output(m, out2);
}

/* y feeds three consumers that meet again. */
static void build_diamond(bt_context *ctx, bt_context *wctx, int64_t n, struct model *m) {
    memset(m, 0, sizeof *m);
    struct bt_tensor *x = input(m, bt_new_tensor_2d(ctx, BT_TYPE_F32, 32, n), "x");
    struct bt_tensor *w = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, 32, 32), "w");
    struct bt_tensor *a = bt_set_name(bt_mul_mat(ctx, w, x), "a");
    struct bt_tensor *b = bt_set_name(bt_relu(ctx, a), "b");
    struct bt_tensor *c = bt_set_name(bt_sigmoid(ctx, a), "c");
    struct bt_tensor *dd = bt_set_name(bt_mul(ctx, b, c), "d");
    struct bt_tensor *e = bt_set_name(bt_add(ctx, dd, a), "e");
    struct bt_tensor *f = bt_set_name(bt_sqr(ctx, e), "f");
    TU_OK(ctx, f);
    output(m, f);
}

/* Subexpressions shared between three outputs. */
static void build_shared(bt_context *ctx, bt_context *wctx, int64_t n, struct model *m) {
    memset(m, 0, sizeof *m);
    struct bt_tensor *x = input(m, bt_new_tensor_2d(ctx, BT_TYPE_F32, 48, n), "x");
    struct bt_tensor *w = param(m, bt_new_tensor_2d(wctx, BT_TYPE_F32, 48, 48), "w");
    struct bt_tensor *y = bt_set_name(bt_mul_mat(ctx, w, x), "y");
    struct bt_tensor *s1 = bt_set_name(bt_silu(ctx, y), "s1");
    struct bt_tensor *s2 = bt_set_name(bt_gelu(ctx, y), "s2");
    struct bt_tensor *t = bt_set_name(bt_add(ctx, s1, s2), "t");
    struct bt_tensor *u = bt_set_name(bt_mul(ctx, t, y), "u");
    struct bt_tensor *v = bt_set_name(bt_scale(ctx, s2, 3.0f), "v");
    struct bt_tensor *z = bt_set_name(bt_add(ctx, bt_mul(ctx, s1, s1), t), "z");
    TU_OK(ctx, u);
    TU_OK(ctx, v);
    TU_OK(ctx, z);
    output(m, u);
    output(m, v);
    output(m, z);
}

static const build_fn builders[] = {build_mlp, build_attn, build_diamond, build_shared};
static const char *builder_names[] = {"mlp", "attn", "diamond", "shared"};
#define N_BUILDERS 4

static void fill_model(struct model *m, uint64_t seed) {
    tu_rng r;
    tu_rng_init(&r, seed);
    for (int i = 0; i < m->n_params; i++) tu_fill(m->params[i], &r);
    for (int i = 0; i < m->n_inputs; i++) tu_fill(m->inputs[i], &r);
}

/* A built model on the allocator: weights in their own buffer, the rest planned. */
struct placed {
    bt_context *ctx, *wctx;
    struct model m;
    struct bt_graph *g;
    bt_buffer_t wbuf;
};

static void build_placed(struct placed *p, build_fn build, int64_t n) {
    p->ctx = na_ctx(16);
    p->wctx = na_ctx(1);
    build(p->ctx, p->wctx, n, &p->m);
    p->wbuf = bt_alloc_ctx_tensors_from_buft(p->wctx, bt_cpu_buffer_type());
    ck_assert_msg(p->wbuf != NULL, "weights: %s", bt_context_error(p->wctx));
    p->g = tu_graph(p->ctx, p->m.outs, p->m.n_outs);
}

static void free_placed(struct placed *p) {
    bt_buffer_free(p->wbuf);
    bt_free(p->ctx);
    bt_free(p->wctx);
}

/* A second CPU-memory buffer type that is not the same object (its own buffer). */
static struct bt_buffer_type other_buft;
static bt_buffer_type_t make_other_buft(void) {
    other_buft = *bt_cpu_buffer_type();
    return &other_buft;
}

#define CK_GA(ga, call) ck_assert_msg((call), "%s: %s", #call, bt_gallocr_error(ga))

/* ---- no overlap ---------------------------------------------------------------- */

START_TEST(test_no_overlap) {
    for (int b = 0; b < N_BUILDERS; b++) {
        for (int64_t n = 1; n <= 33; n += 16) {
            struct placed p;
            build_placed(&p, builders[b], n);
            bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
            ck_assert_ptr_nonnull(ga);
            CK_GA(ga, bt_gallocr_reserve(ga, p.g));
            CK_GA(ga, bt_gallocr_alloc_graph(ga, p.g));
            ck_assert_str_eq(bt_gallocr_error(ga), "");
            check_no_overlap(p.g, bt_gallocr_get_buffer(ga, 0));
            /* reuse happened: the plan is smaller than every tensor side by side */
            size_t sum = 0;
            for (int i = 0; i < p.g->n_nodes; i++)
                if (!p.g->nodes[i]->view_src) sum += bt_nbytes(p.g->nodes[i]);
            ck_assert_msg(bt_gallocr_get_buffer_size(ga, 0) < sum, "%s: %zu >= %zu", builder_names[b],
                          bt_gallocr_get_buffer_size(ga, 0), sum);
            bt_gallocr_free(ga);
            free_placed(&p);
        }
    }
}
END_TEST

/* Node ids spread over two ids of the same buffer type: one shared buffer. */
START_TEST(test_shared_buffer_type) {
    struct placed p;
    build_placed(&p, build_attn, 24);
    bt_buffer_type_t bufts[2] = {bt_cpu_buffer_type(), bt_cpu_buffer_type()};
    bt_gallocr_t ga = bt_gallocr_new_n(bufts, 2);
    int node_ids[256], leaf_ids[256];
    ck_assert_int_le(p.g->n_nodes, 256);
    for (int i = 0; i < p.g->n_nodes; i++) node_ids[i] = i % 2;
    for (int i = 0; i < p.g->n_leafs; i++) leaf_ids[i] = (i + 1) % 2;
    CK_GA(ga, bt_gallocr_reserve_n(ga, p.g, node_ids, leaf_ids));
    ck_assert_ptr_eq(bt_gallocr_get_buffer(ga, 0), bt_gallocr_get_buffer(ga, 1));
    ck_assert_uint_gt(bt_gallocr_get_buffer_size(ga, 0), 0);
    ck_assert_uint_eq(bt_gallocr_get_buffer_size(ga, 1), 0); /* counted once */
    CK_GA(ga, bt_gallocr_alloc_graph(ga, p.g));
    check_no_overlap(p.g, bt_gallocr_get_buffer(ga, 0));
    bt_gallocr_free(ga);
    free_placed(&p);
}
END_TEST

/* Nodes with op NONE in the nodes array (as the scheduler's input copies). */
START_TEST(test_op_none_nodes) {
    bt_context *ctx = na_ctx(4);
    struct bt_tensor *x = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, 16, 8), "x");
    struct bt_tensor *xc = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, 16, 8), "x copy");
    struct bt_tensor *y = bt_set_name(bt_scale(ctx, xc, 2.0f), "y");
    struct bt_tensor *z = bt_set_name(bt_sqr(ctx, y), "z");
    struct bt_graph *g = bt_graph_new(ctx, 16);
    g->leafs[g->n_leafs++] = x;
    g->nodes[g->n_nodes++] = xc; /* a copy of x made by someone else */
    g->nodes[g->n_nodes++] = y;
    g->nodes[g->n_nodes++] = z;
    bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
    CK_GA(ga, bt_gallocr_alloc_graph(ga, g)); /* no reserve: one buffer reserves itself */
    check_no_overlap(g, bt_gallocr_get_buffer(ga, 0));
    ck_assert_ptr_eq(y->data, xc->data); /* in place over the copy */
    ck_assert_ptr_eq(z->data, y->data);
    ck_assert_ptr_ne(x->data, xc->data);
    bt_gallocr_free(ga);
    bt_free(ctx);
}
END_TEST

/* ---- the peak of a chain does not grow with its length ---------------------------- */

enum chain_kind { CHAIN_INPLACE, CHAIN_COPY, CHAIN_MIXED };

static size_t chain_peak(enum chain_kind kind, int n_ops) {
    bt_context *ctx = na_ctx(16);
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, 256, 4); /* 4 KiB */
    bt_set_input(a);
    for (int i = 0; i < n_ops; i++) {
        switch (kind) {
            case CHAIN_INPLACE: a = bt_sqr(ctx, a); break;
            case CHAIN_COPY: a = bt_cont(ctx, a); break;
            /* a view, a copy that cannot be in place, then one that is */
            case CHAIN_MIXED: a = bt_silu(ctx, bt_cont(ctx, bt_transpose(ctx, a))); break;
        }
    }
    TU_OK(ctx, a);
    struct bt_graph *g = tu_graph(ctx, &a, 1);
    bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
    CK_GA(ga, bt_gallocr_reserve(ga, g));
    const size_t size = bt_gallocr_get_buffer_size(ga, 0);
    CK_GA(ga, bt_gallocr_alloc_graph(ga, g));
    check_no_overlap(g, bt_gallocr_get_buffer(ga, 0));
    bt_gallocr_free(ga);
    bt_free(ctx);
    return size;
}

START_TEST(test_chain_peak) {
    const size_t blk = 256 * 4 * sizeof(float);
    for (int kind = CHAIN_INPLACE; kind <= CHAIN_MIXED; kind++) {
        const size_t p4 = chain_peak(kind, 4), p16 = chain_peak(kind, 16), p64 = chain_peak(kind, 64);
        ck_assert_msg(p4 == p16 && p16 == p64, "chain %d: peaks %zu %zu %zu", kind, p4, p16, p64);
        if (kind == CHAIN_INPLACE) ck_assert_uint_eq(p4, 2 * blk);    /* the input + one */
        if (kind != CHAIN_INPLACE) ck_assert_uint_eq(p4, 3 * blk);    /* the input + two */
    }
}
END_TEST

/* A block freed at the top of the buffer, next to a free block, gives both
 * back to the tail: a later larger tensor starts at the free block. */
START_TEST(test_tail_reuse) {
    bt_context *ctx = na_ctx(4);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 256, 4); /* S = 4 KiB */
    bt_set_input(x);
    struct bt_tensor *a = bt_cont(ctx, x);        /* [S, 2S) */
    struct bt_tensor *b = bt_sum_rows(ctx, a);    /* [2S, 2S+64); frees a */
    struct bt_tensor *c = bt_cont(ctx, b);        /* [S, S+64); frees b: tail from S+64 */
    struct bt_tensor *d = bt_add(ctx, x, c);      /* [S+64, 2S+64) */
    TU_OK(ctx, d);
    struct bt_graph *g = tu_graph(ctx, &d, 1);
    bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
    CK_GA(ga, bt_gallocr_reserve(ga, g));
    ck_assert_uint_eq(bt_gallocr_get_buffer_size(ga, 0), 2 * 4096 + BT_MEM_ALIGN);
    CK_GA(ga, bt_gallocr_alloc_graph(ga, g));
    check_no_overlap(g, bt_gallocr_get_buffer(ga, 0));
    ck_assert_ptr_eq(c->data, a->data); /* best fit: the smallest free block */
    bt_gallocr_free(ga);
    bt_free(ctx);
}
END_TEST

/* A graph with the counts, ops and sizes of the reserved one but other
 * sources or flags does not reuse the plan (which would overwrite a tensor
 * still needed). */
static struct bt_graph *wired(bt_context *ctx, int variant) {
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 4);
    bt_set_input(x);
    struct bt_tensor *n0 = bt_set_name(bt_cont(ctx, x), "n0");
    struct bt_tensor *n1 = bt_set_name(bt_cont(ctx, n0), "n1");
    struct bt_tensor *n2 = bt_set_name(bt_cont(ctx, variant == 1 ? x : n1), "n2");
    struct bt_tensor *n3 = bt_set_name(bt_add(ctx, n2, variant == 1 ? n0 : x), "n3");
    if (variant == 2) bt_set_output(n0);
    TU_OK(ctx, n3);
    /* in this order whatever the wiring (variant 1 leaves n1 unread) */
    struct bt_graph *g = bt_graph_new(ctx, 16);
    g->leafs[g->n_leafs++] = x;
    g->nodes[g->n_nodes++] = n0;
    g->nodes[g->n_nodes++] = n1;
    g->nodes[g->n_nodes++] = n2;
    g->nodes[g->n_nodes++] = n3;
    return g;
}

START_TEST(test_structure_mismatch) {
    for (int variant = 1; variant <= 2; variant++) {
        bt_context *ctx = na_ctx(4);
        struct bt_graph *g0 = wired(ctx, 0), *g1 = wired(ctx, variant);
        ck_assert_int_eq(g0->n_nodes, g1->n_nodes);
        ck_assert_int_eq(g0->n_leafs, g1->n_leafs);
        bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
        CK_GA(ga, bt_gallocr_reserve(ga, g0));
        CK_GA(ga, bt_gallocr_alloc_graph(ga, g1));
        check_no_overlap(g1, bt_gallocr_get_buffer(ga, 0));
        bt_gallocr_free(ga);

        /* with several buffers: refused, with the node named */
        bt_buffer_type_t bufts[2] = {bt_cpu_buffer_type(), make_other_buft()};
        ga = bt_gallocr_new_n(bufts, 2);
        struct bt_graph *g2 = wired(ctx, 0), *g3 = wired(ctx, variant);
        CK_GA(ga, bt_gallocr_reserve_n(ga, g2, NULL, NULL));
        ck_assert(!bt_gallocr_alloc_graph(ga, g3));
        ck_assert_msg(strstr(bt_gallocr_error(ga), variant == 1 ? "node 2 ('n2'" : "node 0 ('n0'"), "%s",
                      bt_gallocr_error(ga));
        bt_gallocr_free(ga);
        bt_free(ctx);
    }
}
END_TEST

/* ---- in place ---------------------------------------------------------------------------- */

struct ip {
    bt_context *ctx;
    struct bt_tensor *x, *a;
    bt_gallocr_t ga;
};

static void ip_begin(struct ip *s) {
    s->ctx = na_ctx(4);
    s->x = bt_set_name(bt_new_tensor_2d(s->ctx, BT_TYPE_F32, 64, 4), "x");
    bt_set_input(s->x);
    s->a = bt_set_name(bt_scale(s->ctx, s->x, 2.0f), "a");
    s->ga = bt_gallocr_new(bt_cpu_buffer_type());
}

static void ip_alloc(struct ip *s, struct bt_tensor **outs, int n) {
    struct bt_graph *g = tu_graph(s->ctx, outs, n);
    CK_GA(s->ga, bt_gallocr_alloc_graph(s->ga, g));
    check_no_overlap(g, bt_gallocr_get_buffer(s->ga, 0));
}

static void ip_end(struct ip *s) {
    bt_gallocr_free(s->ga);
    bt_free(s->ctx);
}

START_TEST(test_inplace_allowed) {
    struct ip s;
    ip_begin(&s);
    struct bt_tensor *si = bt_silu(s.ctx, s.a);
    struct bt_tensor *o = bt_add(s.ctx, si, s.x);
    bt_set_output(o);
    ip_alloc(&s, &o, 1);
    ck_assert_ptr_ne(s.a->data, s.x->data); /* x is an INPUT */
    ck_assert_ptr_eq(si->data, s.a->data);
    ck_assert_ptr_eq(o->data, s.a->data);
    ip_end(&s);

    /* through a view that is the whole of its source */
    ip_begin(&s);
    struct bt_tensor *vw = bt_view_tensor(s.ctx, s.a);
    struct bt_tensor *r = bt_relu(s.ctx, vw);
    ip_alloc(&s, &r, 1);
    ck_assert_ptr_eq(r->data, s.a->data);
    ip_end(&s);

    /* swiglu over its second operand when the first is still needed */
    ip_begin(&s);
    struct bt_tensor *b = bt_sqrt(s.ctx, s.x);
    struct bt_tensor *sw = bt_swiglu(s.ctx, s.a, b);
    struct bt_tensor *o2 = bt_add(s.ctx, sw, s.a); /* a read again after sw */
    ip_alloc(&s, &o2, 1);
    ck_assert_ptr_eq(sw->data, b->data);
    ip_end(&s);
}
END_TEST

/* The node of an element-wise op over a and (for two-source ops) x, made by
 * its constructor; NULL for any other op. */
static struct bt_tensor *elementwise_node(struct ip *s, enum bt_op op) {
    switch (op) {
        case BT_OP_ADD: return bt_add(s->ctx, s->a, s->x);
        case BT_OP_SUB: return bt_sub(s->ctx, s->a, s->x);
        case BT_OP_MUL: return bt_mul(s->ctx, s->a, s->x);
        case BT_OP_DIV: return bt_div(s->ctx, s->a, s->x);
        case BT_OP_SCALE: return bt_scale(s->ctx, s->a, 0.5f);
        case BT_OP_SQR: return bt_sqr(s->ctx, s->a);
        case BT_OP_SQRT: return bt_sqrt(s->ctx, s->a);
        case BT_OP_SILU: return bt_silu(s->ctx, s->a);
        case BT_OP_GELU: return bt_gelu(s->ctx, s->a);
        case BT_OP_RELU: return bt_relu(s->ctx, s->a);
        case BT_OP_SIGMOID: return bt_sigmoid(s->ctx, s->a);
        case BT_OP_SWIGLU: return bt_swiglu(s->ctx, s->a, s->x);
        case BT_OP_SWIGLU_OAI: return bt_swiglu_oai(s->ctx, s->a, s->x, 1.702f, 7.0f);
        default: return NULL;
    }
}

/* One list of element-wise ops (bt_op_elementwise), and the
 * allocator's in-place rule is that list: each takes the block of a source
 * it reads last, and no other op is element-wise. */
START_TEST(test_inplace_elementwise_list) {
    int n = 0;
    for (int op = 0; op < BT_OP_COUNT; op++) {
        const enum bt_elementwise kind = bt_op_elementwise((enum bt_op)op);
        struct ip s;
        ip_begin(&s);
        struct bt_tensor *node = elementwise_node(&s, (enum bt_op)op);
        ck_assert_msg((node != NULL) == (kind != BT_ELEMENTWISE_NONE), "op %s: element-wise %d", bt_op_name((enum bt_op)op),
                      (int)kind);
        if (node) {
            ck_assert(bt_op_is_well_formed(node));
            const bool glu = op == BT_OP_SWIGLU || op == BT_OP_SWIGLU_OAI;
            ck_assert_int_eq(kind, node->src[1] ? (glu ? BT_ELEMENTWISE_GLU : BT_ELEMENTWISE_BINARY)
                                                : BT_ELEMENTWISE_UNARY);
            ip_alloc(&s, &node, 1);
            ck_assert_msg(node->data == s.a->data, "op %s did not take its source's block", bt_op_name((enum bt_op)op));
            n++;
        }
        ip_end(&s);
    }
    ck_assert_int_eq(n, 13);
}
END_TEST

START_TEST(test_inplace_refused) {
    struct ip s;
    /* a has two consumers */
    ip_begin(&s);
    struct bt_tensor *si = bt_silu(s.ctx, s.a);
    struct bt_tensor *t = bt_add(s.ctx, si, s.a);
    ip_alloc(&s, &t, 1);
    ck_assert_ptr_ne(si->data, s.a->data);
    ip_end(&s);

    /* a is an OUTPUT */
    ip_begin(&s);
    bt_set_output(s.a);
    si = bt_silu(s.ctx, s.a);
    ip_alloc(&s, &si, 1);
    ck_assert_ptr_ne(si->data, s.a->data);
    ip_end(&s);

    /* a different type with the same layout (a node made by hand: every
     * element-wise constructor is f32 -> f32) */
    ip_begin(&s);
    struct bt_tensor *c = bt_cont(s.ctx, s.a);
    c->type = BT_TYPE_I32; /* 4-byte elements: same ne and nb */
    si = bt_silu(s.ctx, s.a);
    si->src[0] = c;
    ip_alloc(&s, &si, 1);
    ck_assert_ptr_ne(si->data, c->data);
    ip_end(&s);

    /* another layout: a transposed view */
    ip_begin(&s);
    struct bt_tensor *sq = bt_set_name(bt_new_tensor_2d(s.ctx, BT_TYPE_F32, 8, 8), "sq");
    struct bt_tensor *m = bt_scale(s.ctx, sq, 1.0f);
    si = bt_silu(s.ctx, bt_transpose(s.ctx, m));
    ip_alloc(&s, &si, 1);
    ck_assert_ptr_ne(si->data, m->data);
    ip_end(&s);

    /* through a whole view whose source is read again later */
    ip_begin(&s);
    struct bt_tensor *rv = bt_relu(s.ctx, bt_view_tensor(s.ctx, s.a));
    struct bt_tensor *o = bt_add(s.ctx, rv, s.a);
    ip_alloc(&s, &o, 1);
    ck_assert_ptr_ne(rv->data, s.a->data);
    ip_end(&s);

    /* a view flagged OUTPUT keeps its source: nothing later takes its block */
    ip_begin(&s);
    struct bt_tensor *vo = bt_view_tensor(s.ctx, s.a);
    bt_set_output(vo);
    struct bt_tensor *c1 = bt_cont(s.ctx, vo);
    struct bt_tensor *c2 = bt_cont(s.ctx, c1);
    struct bt_tensor *c3 = bt_relu(s.ctx, bt_cont(s.ctx, c2));
    ip_alloc(&s, &c3, 1);
    ck_assert_ptr_ne(c1->data, s.a->data);
    ck_assert_ptr_ne(c2->data, s.a->data);
    ck_assert_ptr_ne(c3->data, s.a->data);
    ip_end(&s);

    /* a view of part of its source */
    ip_begin(&s);
    struct bt_tensor *part = bt_view_1d(s.ctx, s.a, 64, 64 * sizeof(float));
    si = bt_silu(s.ctx, part);
    ip_alloc(&s, &si, 1);
    ck_assert(si->data < s.a->data || (uint8_t *)si->data >= (uint8_t *)s.a->data + bt_nbytes(s.a));
    ip_end(&s);

    /* a source that has data of its own (not the allocator's) */
    ip_begin(&s);
    bt_context *dctx = tu_ctx(1);
    struct bt_tensor *own = bt_new_tensor_2d(dctx, BT_TYPE_F32, 64, 4);
    si = bt_silu(s.ctx, own);
    ip_alloc(&s, &si, 1);
    ck_assert_ptr_ne(si->data, own->data);
    bt_free(dctx);
    ip_end(&s);
}
END_TEST

/* ---- worst case, then smaller and larger graphs -------------------------------------------- */

START_TEST(test_reserve_then_smaller) {
    struct placed big, small, larger;
    build_placed(&big, build_mlp, 64);
    build_placed(&small, build_mlp, 16);
    build_placed(&larger, build_mlp, 128);
    bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
    CK_GA(ga, bt_gallocr_reserve(ga, big.g));
    const bt_buffer_t buf = bt_gallocr_get_buffer(ga, 0);
    const size_t size = bt_gallocr_get_buffer_size(ga, 0);
    ck_assert_ptr_nonnull(buf);

    CK_GA(ga, bt_gallocr_alloc_graph(ga, small.g));
    ck_assert_ptr_eq(bt_gallocr_get_buffer(ga, 0), buf);
    ck_assert_uint_eq(bt_gallocr_get_buffer_size(ga, 0), size);
    check_no_overlap(small.g, buf);

    CK_GA(ga, bt_gallocr_alloc_graph(ga, big.g));
    ck_assert_ptr_eq(bt_gallocr_get_buffer(ga, 0), buf);
    check_no_overlap(big.g, buf);

    /* larger than the worst case: one buffer re-reserves itself */
    CK_GA(ga, bt_gallocr_alloc_graph(ga, larger.g));
    ck_assert_uint_gt(bt_gallocr_get_buffer_size(ga, 0), size);
    check_no_overlap(larger.g, bt_gallocr_get_buffer(ga, 0));
    bt_gallocr_free(ga);

    /* a graph of another structure re-reserves too */
    struct placed fresh, other;
    build_placed(&fresh, build_mlp, 16);
    build_placed(&other, build_diamond, 64);
    ga = bt_gallocr_new(bt_cpu_buffer_type());
    CK_GA(ga, bt_gallocr_reserve(ga, fresh.g));
    CK_GA(ga, bt_gallocr_alloc_graph(ga, other.g));
    check_no_overlap(other.g, bt_gallocr_get_buffer(ga, 0));
    bt_gallocr_free(ga);

    free_placed(&big);
    free_placed(&small);
    free_placed(&larger);
    free_placed(&fresh);
    free_placed(&other);
}
END_TEST

START_TEST(test_several_buffers_no_auto_reserve) {
    struct placed big, larger;
    build_placed(&big, build_mlp, 32);
    build_placed(&larger, build_mlp, 64);
    bt_buffer_type_t bufts[2] = {bt_cpu_buffer_type(), make_other_buft()};
    bt_gallocr_t ga = bt_gallocr_new_n(bufts, 2);
    int node_ids[256], leaf_ids[256];
    for (int i = 0; i < big.g->n_nodes; i++) node_ids[i] = i < big.g->n_nodes / 2 ? 0 : 1;
    for (int i = 0; i < big.g->n_leafs; i++) leaf_ids[i] = 0;
    CK_GA(ga, bt_gallocr_reserve_n(ga, big.g, node_ids, leaf_ids));
    ck_assert_ptr_ne(bt_gallocr_get_buffer(ga, 0), bt_gallocr_get_buffer(ga, 1));
    ck_assert_uint_gt(bt_gallocr_get_buffer_size(ga, 1), 0);
    CK_GA(ga, bt_gallocr_alloc_graph(ga, big.g));
    for (int i = 0; i < big.g->n_nodes; i++) {
        const struct bt_tensor *t = big.g->nodes[i];
        if (!t->view_src) ck_assert_ptr_eq(t->buffer, bt_gallocr_get_buffer(ga, node_ids[i]));
    }
    ck_assert(!bt_gallocr_alloc_graph(ga, larger.g));
    ck_assert_msg(strstr(bt_gallocr_error(ga), "reserve_n") && strstr(bt_gallocr_error(ga), "needs"),
                  "message: %s", bt_gallocr_error(ga));
    /* after reserve_n it works */
    CK_GA(ga, bt_gallocr_reserve_n(ga, larger.g, node_ids, leaf_ids));
    CK_GA(ga, bt_gallocr_alloc_graph(ga, larger.g));
    bt_gallocr_free(ga);
    free_placed(&big);
    free_placed(&larger);
}
END_TEST

/* ---- pre-allocated tensors ------------------------------------------------------------------- */

START_TEST(test_preallocated_untouched) {
    struct placed p;
    build_placed(&p, build_mlp, 8);
    tu_rng r;
    tu_rng_init(&r, 7);
    for (int i = 0; i < p.m.n_params; i++) tu_fill(p.m.params[i], &r);
    void *data[32];
    float *vals[32];
    for (int i = 0; i < p.m.n_params; i++) {
        data[i] = p.m.params[i]->data;
        vals[i] = tu_read_f32(p.m.params[i]);
    }
    bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
    CK_GA(ga, bt_gallocr_reserve(ga, p.g));
    /* only the input and the intermediates are planned, not the weights */
    size_t wbytes = 0;
    for (int i = 0; i < p.m.n_params; i++) wbytes += bt_nbytes(p.m.params[i]);
    CK_GA(ga, bt_gallocr_alloc_graph(ga, p.g));
    bt_buffer_t buf = bt_gallocr_get_buffer(ga, 0);
    /* and a run over the placed graph writes none of them */
    tu_fill(p.m.inputs[0], &r);
    bt_backend_t be = bt_backend_cpu_init(N_THREADS);
    ck_assert_int_eq(bt_backend_graph_compute(be, p.g), BT_OK);
    bt_backend_free(be);
    for (int i = 0; i < p.m.n_params; i++) {
        ck_assert_ptr_eq(p.m.params[i]->data, data[i]);
        ck_assert_ptr_eq(p.m.params[i]->buffer, p.wbuf);
        float *now = tu_read_f32(p.m.params[i]);
        ck_assert_int_eq(memcmp(now, vals[i], bt_nbytes(p.m.params[i])), 0);
        free(now);
        free(vals[i]);
    }
    for (int i = 0; i < p.g->n_nodes; i++)
        if (!p.g->nodes[i]->view_src) ck_assert_ptr_eq(p.g->nodes[i]->buffer, buf);
    ck_assert_uint_lt(bt_gallocr_get_buffer_size(ga, 0), wbytes); /* the weights are not in it */
    check_no_overlap(p.g, buf);
    bt_gallocr_free(ga);
    free_placed(&p);
}
END_TEST

/* ---- errors ------------------------------------------------------------------------------------- */

static size_t small_max(bt_buffer_type_t buft) {
    (void)buft;
    return 1024;
}
static bt_buffer_t no_memory(bt_buffer_type_t buft, size_t size) {
    (void)buft;
    (void)size;
    return NULL;
}

START_TEST(test_errors) {
    struct placed p;
    build_placed(&p, build_diamond, 16);

    /* a buffer id out of range */
    bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
    int node_ids[64] = {0};
    node_ids[2] = 5;
    ck_assert(!bt_gallocr_reserve_n(ga, p.g, node_ids, NULL));
    ck_assert_msg(strstr(bt_gallocr_error(ga), "node 2") && strstr(bt_gallocr_error(ga), "buffer id 5"),
                  "%s", bt_gallocr_error(ga));
    CK_GA(ga, bt_gallocr_reserve(ga, p.g)); /* recovers; the message is cleared */
    ck_assert_str_eq(bt_gallocr_error(ga), "");
    bt_gallocr_free(ga);

    /* more than the buffer type's largest buffer */
    struct bt_buffer_type tiny = *bt_cpu_buffer_type();
    tiny.iface.get_max_size = small_max;
    ga = bt_gallocr_new(&tiny);
    ck_assert(!bt_gallocr_reserve(ga, p.g));
    ck_assert_msg(strstr(bt_gallocr_error(ga), "largest buffer") && strstr(bt_gallocr_error(ga), "1024"),
                  "%s", bt_gallocr_error(ga));
    ck_assert(!bt_gallocr_alloc_graph(ga, p.g)); /* reserves again and fails again */
    ck_assert_ptr_null(bt_gallocr_get_buffer(ga, 0));
    bt_gallocr_free(ga);

    /* memory that cannot be had */
    struct bt_buffer_type none = *bt_cpu_buffer_type();
    none.iface.alloc_buffer = no_memory;
    ga = bt_gallocr_new(&none);
    ck_assert(!bt_gallocr_reserve(ga, p.g));
    ck_assert_msg(strstr(bt_gallocr_error(ga), "cannot allocate"), "%s", bt_gallocr_error(ga));
    bt_gallocr_free(ga);

    /* no buffer types */
    ck_assert_ptr_null(bt_gallocr_new_n(NULL, 0));
    free_placed(&p);
}
END_TEST

/* ---- results equal to a context with its own data ------------------------------------------------ */

START_TEST(test_compute_matches_reference) {
    bt_backend_t be = bt_backend_cpu_init(N_THREADS);
    ck_assert_ptr_nonnull(be);
    bt_cpu *cpu = bt_cpu_new(N_THREADS);
    ck_assert_ptr_nonnull(cpu);
    for (int b = 0; b < N_BUILDERS; b++) {
        const int64_t n = 19;
        /* reference: every tensor with its own data */
        bt_context *rctx = tu_ctx(32);
        struct model mr;
        builders[b](rctx, rctx, n, &mr);
        fill_model(&mr, 100 + (uint64_t)b);
        struct bt_graph *rg = tu_graph(rctx, mr.outs, mr.n_outs);
        enum bt_status st = bt_cpu_graph_compute(cpu, rg);
        ck_assert_msg(st == BT_OK, "%s reference: %s", builder_names[b], bt_cpu_error(cpu));

        /* planned: reserve a larger batch, then place this one */
        struct placed worst, p;
        build_placed(&worst, builders[b], 40);
        build_placed(&p, builders[b], n);
        bt_gallocr_t ga = bt_gallocr_new(bt_cpu_buffer_type());
        CK_GA(ga, bt_gallocr_reserve(ga, worst.g));
        CK_GA(ga, bt_gallocr_alloc_graph(ga, p.g));
        fill_model(&p.m, 100 + (uint64_t)b);
        /* poison the compute buffer's free memory: a wrong plan reads garbage */
        for (int i = 0; i < p.g->n_nodes; i++) {
            struct bt_tensor *t = p.g->nodes[i];
            if (!t->view_src && !(t->flags & BT_TENSOR_FLAG_INPUT))
                bt_tensor_memset(t, 0xff, 0, bt_nbytes(t));
        }
        st = bt_backend_graph_compute(be, p.g);
        ck_assert_msg(st == BT_OK, "%s: %s", builder_names[b], bt_backend_error(be));
        for (int o = 0; o < mr.n_outs; o++) {
            float *want = tu_read_f32(mr.outs[o]);
            float *got = tu_read_f32(p.m.outs[o]);
            ck_assert_int_eq(bt_nelements(mr.outs[o]), bt_nelements(p.m.outs[o]));
            ck_assert_msg(memcmp(want, got, (size_t)bt_nelements(mr.outs[o]) * sizeof(float)) == 0,
                          "%s: output %d differs (first %g vs %g)", builder_names[b], o, got[0], want[0]);
            free(want);
            free(got);
        }
        bt_gallocr_free(ga);
        free_placed(&worst);
        free_placed(&p);
        bt_free(rctx);
    }
    bt_cpu_free(cpu);
    bt_backend_free(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_no_overlap);
    tcase_add_test(tc, test_shared_buffer_type);
    tcase_add_test(tc, test_op_none_nodes);
    tcase_add_test(tc, test_chain_peak);
    tcase_add_test(tc, test_tail_reuse);
    tcase_add_test(tc, test_structure_mismatch);
    tcase_add_test(tc, test_inplace_allowed);
    tcase_add_test(tc, test_inplace_refused);
    tcase_add_test(tc, test_inplace_elementwise_list);
    tcase_add_test(tc, test_reserve_then_smaller);
    tcase_add_test(tc, test_several_buffers_no_auto_reserve);
    tcase_add_test(tc, test_preallocated_untouched);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_compute_matches_reference);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
