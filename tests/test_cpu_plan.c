/* test_cpu_plan.c - the CPU executor's plan (cpu_plan.c): where barriers go,
 * which nodes thread 0 computes alone, the work buffer's parts.
 *
 * Checked against the graph's structure, not against the plan's own rule
 * (memory ranges): every node that reads another computed node's output is
 * separated from it by a barrier unless both are solo; nodes between two
 * barriers have disjoint work buffer parts.  And the results: a decode-shaped
 * model graph placed by the graph allocator (buffers reused between nodes)
 * gives bitwise the logits of a run with a barrier after every node, for
 * 2, 3 and 4 threads; a run-time error anywhere in a stretch stops the run
 * with the failing node's message, never a hang.  And the executor's
 * profile (bt_cpu_set_profile): what it counts, and that it changes no bit. */
#include <stdlib.h>
#include <string.h>

#include "baton/alloc.h"
#include "baton/backend.h"
#include "synth_model.h"
#include "testutil.h"

/* The computed node whose output t's bytes are (views followed). */
static const struct bt_tensor *producer(const struct bt_tensor *t) {
    while (t && bt_op_is_view(t->op)) t = t->src[0];
    return t;
}

static int node_index(const struct bt_graph *g, const struct bt_tensor *t) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == t) return i;
    return -1;
}

struct plan_counts {
    int steps, barriers, solo;
};

/* The plan for nth threads, checked; returns its counts. */
static struct plan_counts check_plan(const struct bt_graph *g, int nth) {
    struct bt_cpu_step *steps = malloc((size_t)g->n_nodes * sizeof *steps);
    int *step_of = malloc((size_t)g->n_nodes * sizeof *step_of);
    ck_assert(steps && step_of);
    size_t wsize = 0;
    const int n = bt_cpu_plan(g, nth, false, steps, &wsize);
    struct plan_counts c = {n, 0, 0};
    for (int i = 0; i < g->n_nodes; i++) step_of[i] = -1;
    int prev = -1;
    for (int k = 0; k < n; k++) {
        ck_assert_msg(steps[k].node > prev, "step %d: node %d after node %d", k, steps[k].node, prev);
        prev = steps[k].node;
        step_of[steps[k].node] = k;
        c.barriers += steps[k].barrier;
        c.solo += steps[k].solo;
        ck_assert(steps[k].wofs + steps[k].wsize <= wsize);
        if (nth == 1) ck_assert(!steps[k].solo);
    }
    int computed = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!bt_op_is_view(g->nodes[i]->op) && g->nodes[i]->op != BT_OP_NONE) {
            computed++;
            ck_assert_msg(step_of[i] >= 0, "node %d '%s' has no step", i, g->nodes[i]->name);
        }
    ck_assert_int_eq(computed, n);
    ck_assert(n == 0 || steps[n - 1].barrier);
    for (int kb = 0; kb < n; kb++) {
        const struct bt_tensor *b = g->nodes[steps[kb].node];
        for (int s = 0; s < BT_MAX_SRC; s++) {
            const int ix = b->src[s] ? node_index(g, producer(b->src[s])) : -1;
            if (ix < 0 || step_of[ix] < 0) continue; /* a leaf */
            const int kx = step_of[ix];
            ck_assert_int_lt(kx, kb);
            if (steps[kx].solo && steps[kb].solo) continue; /* thread 0, in order */
            bool sep = false;
            for (int k = kx; k < kb && !sep; k++) sep = steps[k].barrier;
            ck_assert_msg(sep, "%d threads: '%s' reads '%s' with no barrier between", nth, b->name,
                          g->nodes[ix]->name);
        }
        /* parts of the work buffer of one stretch do not overlap */
        for (int k = kb - 1; k >= 0 && !steps[k].barrier; k--) {
            const struct bt_cpu_step *x = &steps[k], *y = &steps[kb];
            if (x->wsize == 0 || y->wsize == 0) continue;
            ck_assert_msg(x->wofs + x->wsize <= y->wofs || y->wofs + y->wsize <= x->wofs,
                          "'%s' and '%s' share work buffer bytes in one stretch", g->nodes[x->node]->name, b->name);
        }
    }
    free(steps);
    free(step_of);
    return c;
}

/* A decode step (one token) of a small MoE model with quantised weights, its
 * activations placed by the graph allocator. */
struct decode_graph {
    struct bt_model *m;
    bt_buffer_t wbuf;
    bt_context *ctx;
    bt_gallocr_t galloc;
    struct bt_model_graph g;
};

static void decode_graph_new(struct decode_graph *d, enum bt_ffn_kind kind) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = 2;
    c.d_model = 64;
    c.n_heads = 4;
    c.d_ff = 96;
    c.n_experts = 8;
    c.top_k = 2;
    c.n_shared = 1;
    c.ffn = kind;
    c.n_vocab = 100;
    c.n_tokens = 1;
    c.wtype = BT_TYPE_Q8_0;
    char err[256];
    ck_assert_msg(bt_model_new(&c, &d->m, err, sizeof err) == BT_OK, "%s", err);
    d->wbuf = bt_alloc_ctx_tensors_from_buft(bt_model_context(d->m), bt_cpu_buffer_type());
    ck_assert(d->wbuf != NULL);
    bt_model_init_weights(d->m);
    d->ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&c), NULL, true});
    ck_assert(d->ctx != NULL);
    ck_assert_msg(bt_model_build_graph(d->m, d->ctx, &d->g) == BT_OK, "%s", bt_context_error(d->ctx));
    d->galloc = bt_gallocr_new(bt_cpu_buffer_type());
    ck_assert(d->galloc && bt_gallocr_alloc_graph(d->galloc, d->g.graph));
    bt_model_set_inputs(d->m, &d->g, 2);
}

static void decode_graph_free(struct decode_graph *d) {
    bt_gallocr_free(d->galloc);
    bt_free(d->ctx);
    bt_buffer_free(d->wbuf);
    bt_model_free(d->m);
}

static float *logits_of(struct decode_graph *d, bt_cpu *cpu) {
    const enum bt_status s = bt_cpu_graph_compute(cpu, d->g.graph);
    ck_assert_msg(s == BT_OK, "compute: %s", bt_cpu_error(cpu));
    float *out = malloc(bt_nbytes(d->g.logits));
    bt_tensor_get(d->g.logits, out, 0, bt_nbytes(d->g.logits));
    return out;
}

START_TEST(test_plan_decode_graph) {
    const enum bt_ffn_kind kinds[] = {BT_FFN_MLP, BT_FFN_MOE_TOPK, BT_FFN_MOE_SHARED};
    const enum bt_ffn_kind kind = kinds[_i];
    struct decode_graph d;
    decode_graph_new(&d, kind);
    const struct bt_graph *g = d.g.graph;

    const struct plan_counts one = check_plan(g, 1);
    ck_assert_int_eq(one.solo, 0);
    const struct plan_counts two = check_plan(g, 2);
    /* a decode step is mostly tiny nodes: many need no barrier of their own
     * (this graph: 34 of 46 steps end in one, 38 of 58, 48 of 74; with a
     * barrier after every node, all of them) */
    ck_assert_int_gt(two.solo, 0);
    ck_assert_msg(two.barriers < two.steps, "%s: %d barriers for %d steps", bt_ffn_kind_name(kind), two.barriers,
                  two.steps);
    check_plan(g, 3);
    check_plan(g, 4);

    /* bitwise the logits of a barrier after every node, every thread count,
     * several runs (a missing barrier would show as a race sooner or later) */
    bt_cpu *ref_cpu = bt_cpu_new(2);
    bt_cpu_set_barrier_every_node(ref_cpu, true);
    float *ref = logits_of(&d, ref_cpu);
    const size_t nb = bt_nbytes(d.g.logits);
    for (int nt = 2; nt <= 4; nt++) {
        bt_cpu *cpu = bt_cpu_new(nt);
        ck_assert(cpu != NULL);
        for (int rep = 0; rep < 20; rep++) {
            float *l = logits_of(&d, cpu);
            ck_assert_msg(memcmp(l, ref, nb) == 0, "%s, %d threads, run %d: logits differ from a barrier after every node",
                          bt_ffn_kind_name(kind), nt, rep);
            free(l);
        }
        bt_cpu_free(cpu);
    }
    free(ref);
    bt_cpu_free(ref_cpu);
    decode_graph_free(&d);
}
END_TEST

/* barrier_every_node: one step per computed node, each followed by a barrier */
START_TEST(test_plan_every_node) {
    struct decode_graph d;
    decode_graph_new(&d, BT_FFN_MOE_TOPK);
    const struct bt_graph *g = d.g.graph;
    struct bt_cpu_step *steps = malloc((size_t)g->n_nodes * sizeof *steps);
    size_t wsize = 0;
    const int n = bt_cpu_plan(g, 2, true, steps, &wsize);
    ck_assert_int_gt(n, 0);
    for (int k = 0; k < n; k++) {
        ck_assert(steps[k].barrier);
        ck_assert(!steps[k].solo);
        ck_assert_uint_eq(steps[k].wofs, 0);
    }
    free(steps);
    decode_graph_free(&d);
}
END_TEST

/* A run-time error in a node that shares its stretch with others (a solo
 * GET_ROWS between views, or a MUL_MAT_ID next to an independent one): the
 * run stops with that node's message, every time, and the executor works
 * afterwards. */
START_TEST(test_plan_runtime_error) {
    for (int nt = 2; nt <= 3; nt++) {
        bt_cpu *cpu = bt_cpu_new(nt);
        for (int rep = 0; rep < 30; rep++) {
            bt_context *ctx = tu_ctx(4);
            tu_rng r;
            tu_rng_init(&r, 900 + (uint64_t)rep);
            struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, 16, 5);
            struct bt_tensor *rid = bt_new_tensor_1d(ctx, BT_TYPE_I32, 3);
            struct bt_tensor *as = bt_new_tensor_3d(ctx, BT_TYPE_Q8_0, 32, 64, 4);
            struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 1, 1);
            struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, 2, 1);
            tu_fill(a, &r);
            tu_fill(as, &r);
            tu_fill(b, &r);
            int32_t *rv = rid->data, *iv = ids->data;
            rv[0] = 0;
            rv[1] = 4;
            rv[2] = 2;
            iv[0] = 1;
            iv[1] = 3;
            const bool bad_rows = rep % 2 == 0;
            if (bad_rows) rv[1] = 5;
            else iv[1] = 4;
            /* mm1 and mm2 are independent: one stretch; gr between views */
            struct bt_tensor *mm1 = bt_mul_mat_id(ctx, as, b, ids);
            struct bt_tensor *v = bt_reshape_2d(ctx, bt_scale(ctx, a, 2.0f), 16, 5);
            struct bt_tensor *gr = bt_get_rows(ctx, bt_transpose(ctx, bt_transpose(ctx, v)), rid);
            bt_set_name(mm1, "mm1");
            bt_set_name(gr, "gr");
            struct bt_tensor *mm2 = bt_mul_mat_id(ctx, as, b, ids);
            struct bt_tensor *outs[3] = {mm1, gr, mm2};
            struct bt_graph *g = tu_graph(ctx, outs, 3);
            const enum bt_status s = bt_cpu_graph_compute(cpu, g);
            ck_assert_msg(s == BT_ERR_INVALID, "%d threads: status %d", nt, (int)s);
            ck_assert_msg(strstr(bt_cpu_error(cpu), bad_rows ? "gr" : "mm1") != NULL, "%d threads: message '%s'", nt,
                          bt_cpu_error(cpu));
            rv[1] = 4;
            iv[1] = 3;
            ck_assert_int_eq(bt_cpu_graph_compute(cpu, g), BT_OK);
            bt_free(ctx);
        }
        bt_cpu_free(cpu);
    }
}
END_TEST

/* The executor plans a graph once and keeps the plan while the graph's key
 * (its ops, shapes, strides, data addresses, the thread count) stays the
 * same: a decode step's graph computed again is not planned again.  A
 * different graph, or the same one with a node moved to other memory (or
 * without memory: refused), is planned anew; every run's logits are bitwise
 * those of a barrier after every node. */
START_TEST(test_plan_kept) {
    struct decode_graph a, b;
    decode_graph_new(&a, BT_FFN_MOE_TOPK);
    decode_graph_new(&b, BT_FFN_MLP);
    bt_cpu *ref_cpu = bt_cpu_new(2);
    bt_cpu_set_barrier_every_node(ref_cpu, true);
    float *ref_a = logits_of(&a, ref_cpu), *ref_b = logits_of(&b, ref_cpu);
    const size_t nba = bt_nbytes(a.g.logits), nbb = bt_nbytes(b.g.logits);
    bt_cpu *cpu = bt_cpu_new(3);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 0);
    for (int rep = 0; rep < 4; rep++) {
        float *l = logits_of(&a, cpu);
        ck_assert_msg(memcmp(l, ref_a, nba) == 0, "run %d: logits differ", rep);
        free(l);
    }
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 1); /* planned once, kept three times */
    /* another graph, then the first again: planned each time */
    float *l = logits_of(&b, cpu);
    ck_assert(memcmp(l, ref_b, nbb) == 0);
    free(l);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 2);
    l = logits_of(&a, cpu);
    ck_assert(memcmp(l, ref_a, nba) == 0);
    free(l);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 3);
    /* the same graph with its logits written elsewhere: another plan */
    struct bt_tensor *out = a.g.logits;
    void *old = out->data, *moved = aligned_alloc(64, (bt_nbytes(out) + 63) / 64 * 64);
    ck_assert_ptr_nonnull(moved);
    out->data = moved;
    l = logits_of(&a, cpu);
    ck_assert(memcmp(l, ref_a, nba) == 0);
    free(l);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 4);
    out->data = old;
    free(moved);
    /* the checks come with the plan: a kept graph whose node lost its data
     * is refused, then planned again once it has it back */
    l = logits_of(&a, cpu);
    free(l);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 5);
    out->data = NULL;
    ck_assert_int_eq(bt_cpu_graph_compute(cpu, a.g.graph), BT_ERR_INVALID);
    ck_assert_msg(strstr(bt_cpu_error(cpu), "has no data") != NULL, "%s", bt_cpu_error(cpu));
    out->data = old;
    l = logits_of(&a, cpu);
    ck_assert(memcmp(l, ref_a, nba) == 0);
    free(l);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 6);
    /* a barrier after every node asked for: another plan too */
    bt_cpu_set_barrier_every_node(cpu, true);
    l = logits_of(&a, cpu);
    ck_assert(memcmp(l, ref_a, nba) == 0);
    free(l);
    ck_assert_uint_eq(bt_cpu_n_plans(cpu), 7);
    bt_cpu_free(cpu);
    bt_cpu_free(ref_cpu);
    free(ref_a);
    free(ref_b);
    decode_graph_free(&a);
    decode_graph_free(&b);
}
END_TEST

/* The profile (bt_cpu_set_profile): per (op, first source's type) the count
 * of nodes run, the weight bytes of the matmuls (a MUL_MAT_ID's: the two
 * experts of its one token), times that add up to at most the runs' wall
 * time; the logits the same as without it; off, nothing. */
static const struct bt_cpu_op_profile *find_row(const struct bt_cpu_op_profile *rows, int n, enum bt_op op,
                                                enum bt_type t) {
    for (int i = 0; i < n; i++)
        if (rows[i].op == op && rows[i].type == t) return &rows[i];
    return NULL;
}

START_TEST(test_profile) {
    struct decode_graph d;
    decode_graph_new(&d, BT_FFN_MOE_TOPK);
    const struct bt_graph *g = d.g.graph;
    bt_cpu *cpu = bt_cpu_new(2);
    ck_assert(cpu != NULL);
    float *ref = logits_of(&d, cpu);
    const size_t nb = bt_nbytes(d.g.logits);
    uint64_t n_graphs = 1;
    double graph_s = 1.0;
    struct bt_cpu_op_profile rows[64];
    ck_assert_int_eq(bt_cpu_get_profile(cpu, rows, 64, &n_graphs, &graph_s), 0); /* off by default */
    ck_assert_uint_eq(n_graphs, 0);
    bt_cpu_set_profile(cpu, true);
    const int runs = 3;
    for (int r = 0; r < runs; r++) {
        float *l = logits_of(&d, cpu);
        ck_assert_msg(memcmp(l, ref, nb) == 0, "run %d: logits differ with the profile on", r);
        free(l);
    }
    const int n = bt_cpu_get_profile(cpu, rows, 64, &n_graphs, &graph_s);
    ck_assert_int_gt(n, 3);
    ck_assert_int_le(n, 64);
    ck_assert_uint_eq(n_graphs, runs);
    double sum = 0.0;
    uint64_t counted = 0;
    for (int i = 0; i < n; i++) {
        ck_assert(rows[i].compute_s >= 0.0 && rows[i].wait_s >= 0.0);
        sum += rows[i].compute_s + rows[i].wait_s;
        counted += rows[i].count;
    }
    ck_assert_msg(sum <= graph_s, "rows %g s, runs %g s", sum, graph_s);
    /* every computed node once a run, in the row of its op and type */
    uint64_t computed = 0;
    double mm_bytes = 0.0, mmid_bytes = 0.0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *node = g->nodes[i];
        if (bt_op_is_view(node->op) || node->op == BT_OP_NONE) continue;
        computed++;
        const enum bt_type t = node->src[0] ? node->src[0]->type : node->type;
        const struct bt_cpu_op_profile *row = find_row(rows, n, node->op, t);
        ck_assert_msg(row != NULL, "node %d (%s): no row", i, bt_op_name(node->op));
        if (node->op == BT_OP_MUL_MAT && t == BT_TYPE_Q8_0) mm_bytes += (double)bt_nbytes(node->src[0]);
        if (node->op == BT_OP_MUL_MAT_ID) mmid_bytes += 2.0 * (double)node->src[0]->nb[2];
    }
    ck_assert_uint_eq(counted, runs * computed);
    const struct bt_cpu_op_profile *mm = find_row(rows, n, BT_OP_MUL_MAT, BT_TYPE_Q8_0);
    const struct bt_cpu_op_profile *mmid = find_row(rows, n, BT_OP_MUL_MAT_ID, BT_TYPE_Q8_0);
    ck_assert(mm != NULL && mmid != NULL && mmid_bytes > 0.0);
    ck_assert_msg(mm->weight_bytes == runs * mm_bytes, "MUL_MAT: %g bytes, want %g", mm->weight_bytes, runs * mm_bytes);
    ck_assert_msg(mmid->weight_bytes == runs * mmid_bytes, "MUL_MAT_ID: %g bytes, want %g", mmid->weight_bytes,
                  runs * mmid_bytes);
    const struct bt_cpu_op_profile *norm = find_row(rows, n, BT_OP_RMS_NORM, BT_TYPE_F32);
    ck_assert(norm != NULL && norm->weight_bytes == 0.0);
    /* a MUL_MAT_ID whose 3 tokens choose experts 0 and 1 of 4 between them:
     * the bytes of those 2 experts, once */
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *as = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 16, 4);
    struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 1, 3);
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, 2, 3);
    TU_OK(ctx, as);
    TU_OK(ctx, b);
    TU_OK(ctx, ids);
    tu_rng rng;
    tu_rng_init(&rng, 3);
    tu_fill(as, &rng);
    tu_fill(b, &rng);
    const int32_t chosen[6] = {0, 1, 1, 0, 0, 1};
    memcpy(ids->data, chosen, sizeof chosen);
    struct bt_tensor *out = bt_mul_mat_id(ctx, as, b, ids);
    TU_OK(ctx, out);
    bt_cpu_set_profile(cpu, true);
    ck_assert_int_eq(bt_cpu_graph_compute(cpu, tu_graph(ctx, &out, 1)), BT_OK);
    ck_assert_int_eq(bt_cpu_get_profile(cpu, rows, 64, &n_graphs, &graph_s), 1);
    ck_assert_msg(rows[0].op == BT_OP_MUL_MAT_ID && rows[0].weight_bytes == 2.0 * (double)as->nb[2],
                  "%s: %g bytes, want %g", bt_op_name(rows[0].op), rows[0].weight_bytes, 2.0 * (double)as->nb[2]);
    bt_free(ctx);
    /* on again: from zero; off: nothing */
    bt_cpu_set_profile(cpu, true);
    ck_assert_int_eq(bt_cpu_get_profile(cpu, rows, 64, &n_graphs, &graph_s), 0);
    bt_cpu_set_profile(cpu, false);
    free(logits_of(&d, cpu));
    ck_assert_int_eq(bt_cpu_get_profile(cpu, rows, 64, &n_graphs, &graph_s), 0);
    ck_assert_uint_eq(n_graphs, 0);
    bt_cpu_free(cpu);
    free(ref);
    decode_graph_free(&d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_plan");
    TCase *tc = tcase_create("cpu_plan");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_plan_decode_graph, 0, 3);
    tcase_add_test(tc, test_plan_every_node);
    tcase_add_test(tc, test_plan_runtime_error);
    tcase_add_test(tc, test_plan_kept);
    tcase_add_test(tc, test_profile);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
