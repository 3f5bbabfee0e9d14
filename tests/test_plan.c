/* test_plan.c - the distributed plan as a value, without mpiexec: what it
 * holds (owners, layer ranges, splits, transfers, tags, device edges), that
 * it is a pure function of its inputs, that it travels as bytes unchanged,
 * that bytes which do not fit are refused, and that it scales to 256 ranks of
 * a 94-layer, 128-expert model. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "synth_model.h"
#include "plan.h"
#include "testutil.h"

struct fixture {
    struct bt_model *m;
    bt_context *ctx;
    struct bt_model_graph g;
};

static void fixture_init(struct fixture *f, const struct bt_model_config *c) {
    char err[256];
    ck_assert_msg(bt_model_new(c, &f->m, err, sizeof err) == BT_OK, "%s", err);
    f->ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(c), NULL, true});
    ck_assert_ptr_nonnull(f->ctx);
    ck_assert_int_eq(bt_model_build_graph(f->m, f->ctx, &f->g), BT_OK);
}

static void fixture_free(struct fixture *f) {
    bt_free(f->ctx);
    bt_model_free(f->m);
}

static struct bt_rank_desc *descs_new(int P) {
    struct bt_rank_desc *d = calloc((size_t)P, sizeof *d);
    ck_assert_ptr_nonnull(d);
    for (int r = 0; r < P; r++) {
        snprintf(d[r].backend, sizeof d[r].backend, "CPU");
        d[r].gflops = 100.0;
        d[r].mem_bytes = (int64_t)64 << 30;
    }
    return d;
}

/* The plan as text (bt_plan_dump), malloc'd. */
static char *dump(const struct bt_plan *p) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ck_assert_ptr_nonnull(f);
    bt_plan_dump(p, f);
    fclose(f);
    return buf;
}

/* What every plan must hold, whatever the graph and ranks. */
static void check_invariants(const struct bt_plan *p, const struct bt_graph *g) {
    ck_assert_int_eq(p->n_nodes, g->n_nodes);
    ck_assert_int_eq(p->n_leafs, g->n_leafs);
    for (int i = 0; i < g->n_nodes; i++) ck_assert(p->node_owner[i] >= 0 && p->node_owner[i] < p->n_ranks);
    for (int i = 0; i < g->n_leafs; i++) ck_assert(p->leaf_owner[i] >= 0 && p->leaf_owner[i] < p->n_ranks);
    /* splits cover the nodes in order, each node on its split's rank */
    int next = 0;
    for (int s = 0; s < p->n_splits; s++) {
        ck_assert_int_eq(p->splits[s].i_start, next);
        ck_assert_int_gt(p->splits[s].i_end, p->splits[s].i_start);
        for (int i = p->splits[s].i_start; i < p->splits[s].i_end; i++)
            ck_assert_int_eq(p->node_owner[i], p->splits[s].rank);
        next = p->splits[s].i_end;
    }
    ck_assert_int_eq(next, g->n_nodes);
    /* layers: contiguous, in rank order, each layer on exactly one rank */
    int covered = 0, last = -1;
    for (int r = 0; r < p->n_ranks; r++) {
        if (p->layer_first[r] < 0) continue;
        ck_assert_int_eq(p->layer_first[r], last + 1);
        ck_assert_int_ge(p->layer_last[r], p->layer_first[r]);
        covered += p->layer_last[r] - p->layer_first[r] + 1;
        last = p->layer_last[r];
    }
    ck_assert_int_eq(covered, p->n_layers);
    /* transfers: between two ranks, in the order their data is made, one tag
     * range each; a consumer's split runs on the receiving rank */
    for (int x = 0; x < p->n_transfers; x++) {
        const struct bt_plan_transfer *t = &p->transfers[x];
        ck_assert_int_ne(t->src, t->dst);
        ck_assert_int_eq(t->tag0, x * p->n_copies);
        if (x > 0) ck_assert_int_le(p->transfers[x - 1].producer, t->producer);
        if (t->consumer >= 0) ck_assert_int_eq(p->splits[t->consumer].rank, t->dst);
        else ck_assert_int_eq(t->dst, 0);
        if (t->producer >= 0) ck_assert_int_eq(p->splits[t->producer].rank, t->src);
        ck_assert_int_eq(t->bytes, (int64_t)bt_nbytes(bt_plan_tensor(g, t->tensor)));
    }
}

START_TEST(test_plan_two_ranks) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = 6;
    struct fixture f;
    fixture_init(&f, &c);
    struct bt_rank_desc *d = descs_new(2);
    struct bt_plan p;
    ck_assert_msg(bt_plan_make(&p, f.g.graph, d, 2, NULL, NULL) == BT_OK, "%s", p.error);
    check_invariants(&p, f.g.graph);
    ck_assert_int_eq(p.n_layers, 6);
    ck_assert_int_eq(p.layer_first[0], 0);
    ck_assert_int_eq(p.layer_last[1], 5);
    ck_assert_int_eq(p.layer_last[0] + 1, p.layer_first[1]);
    ck_assert_int_eq(p.n_copies, 2);
    /* the logits come back to rank 0 */
    bool logits_back = false;
    for (int x = 0; x < p.n_transfers; x++)
        logits_back |= p.transfers[x].consumer < 0 && bt_plan_tensor(f.g.graph, p.transfers[x].tensor) == f.g.logits;
    ck_assert(logits_back);
    /* nothing goes over a device transport no rank has */
    for (int x = 0; x < p.n_transfers; x++) ck_assert_int_eq(p.transfers[x].direct, 0);
    ck_assert_double_ge(p.seconds, 0.0);
    bt_plan_free(&p);
    bt_plan_free(&p); /* twice is harmless */
    free(d);
    fixture_free(&f);
}
END_TEST

/* The same inputs give the same plan; the graph is left as built. */
START_TEST(test_plan_is_a_pure_function) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = 8;
    c.ffn = BT_FFN_MOE_SHARED;
    struct fixture f;
    fixture_init(&f, &c);
    const uint64_t h = bt_graph_hash(f.g.graph);
    struct bt_rank_desc *d = descs_new(3);
    struct bt_plan a, b;
    ck_assert_msg(bt_plan_make(&a, f.g.graph, d, 3, NULL, NULL) == BT_OK, "%s", a.error);
    ck_assert_uint_eq(bt_graph_hash(f.g.graph), h);
    ck_assert_msg(bt_plan_make(&b, f.g.graph, d, 3, NULL, NULL) == BT_OK, "%s", b.error);
    char *da = dump(&a), *db = dump(&b);
    ck_assert_str_eq(da, db);
    ck_assert_uint_eq(a.graph_hash, h);
    free(da);
    free(db);
    bt_plan_free(&a);
    bt_plan_free(&b);
    free(d);
    fixture_free(&f);
}
END_TEST

/* The plan through bytes (its broadcast) is the same plan; bytes that do not
 * fit the graph are refused with a message. */
START_TEST(test_plan_pack_unpack) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    struct fixture f;
    fixture_init(&f, &c);
    struct bt_rank_desc *d = descs_new(4);
    struct bt_plan p, q;
    ck_assert_msg(bt_plan_make(&p, f.g.graph, d, 4, NULL, NULL) == BT_OK, "%s", p.error);
    void *buf = NULL;
    size_t n = 0;
    ck_assert_int_eq(bt_plan_pack(&p, &buf, &n), BT_OK);
    ck_assert_int_eq(bt_plan_unpack(&q, buf, n, f.g.graph), BT_OK);
    char *dp = dump(&p), *dq = dump(&q);
    ck_assert_str_eq(dp, dq);
    free(dp);
    free(dq);
    bt_plan_free(&q);
    /* truncated, and a byte too many */
    ck_assert_int_eq(bt_plan_unpack(&q, buf, n - 1, f.g.graph), BT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(q.error, "does not fit"));
    ck_assert_int_eq(bt_plan_unpack(&q, buf, 8, f.g.graph), BT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(q.error, "truncated"));
    /* a transfer's rank, and a rank an input is set on, out of range */
    ck_assert_int_gt(p.n_transfers, 0);
    ck_assert_int_gt(p.n_inputs, 0);
    for (int which = 0; which < 2; which++) {
        struct bt_plan bad = p;
        struct bt_plan_transfer *tr = malloc(sizeof *tr * (size_t)p.n_transfers);
        struct bt_plan_input *in = malloc(sizeof *in * (size_t)p.n_inputs);
        memcpy(tr, p.transfers, sizeof *tr * (size_t)p.n_transfers);
        memcpy(in, p.inputs, sizeof *in * (size_t)p.n_inputs);
        if (which == 0) tr[0].dst = 99;
        else in[0].rank = 4;
        bad.transfers = tr;
        bad.inputs = in;
        void *b2 = NULL;
        size_t n2 = 0;
        ck_assert_int_eq(bt_plan_pack(&bad, &b2, &n2), BT_OK);
        ck_assert_int_eq(bt_plan_unpack(&q, b2, n2, f.g.graph), BT_ERR_INVALID);
        ck_assert_ptr_nonnull(strstr(q.error, "out of range"));
        free(b2);
        free(tr);
        free(in);
    }
    /* for another graph */
    struct bt_model_config c2 = c;
    c2.n_layers = c.n_layers + 1;
    struct fixture f2;
    fixture_init(&f2, &c2);
    ck_assert_int_eq(bt_plan_unpack(&q, buf, n, f2.g.graph), BT_ERR_INVALID);
    fixture_free(&f2);
    free(buf);
    bt_plan_free(&p);
    free(d);
    fixture_free(&f);
}
END_TEST

/* One rule for the device transport: computed tensors between two ranks
 * that both have one, on an allowed edge. */
START_TEST(test_plan_device_edges) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = 6;
    struct fixture f;
    fixture_init(&f, &c);
    struct bt_rank_desc *d = descs_new(3);
    d[1].device = d[2].device = 1;
    struct bt_plan p;
    ck_assert_msg(bt_plan_make(&p, f.g.graph, d, 3, NULL, NULL) == BT_OK, "%s", p.error);
    check_invariants(&p, f.g.graph);
    int n_direct = 0, n_12 = 0;
    for (int x = 0; x < p.n_transfers; x++) {
        const struct bt_plan_transfer *t = &p.transfers[x];
        const bool want = t->producer >= 0 && t->consumer >= 0 && t->src != 0 && t->dst != 0;
        ck_assert_int_eq(t->direct, want);
        n_direct += t->direct;
        n_12 += t->src == 1 && t->dst == 2 && t->producer >= 0;
    }
    ck_assert_int_gt(n_12, 0);
    ck_assert_int_eq(n_direct, n_12);
    bt_plan_free(&p);
    /* the options can close the edge 1 -> 2 */
    uint8_t edges[9] = {0};
    edges[2 * 3 + 1] = 1;
    const struct bt_plan_options opt = {.device_edges = edges};
    ck_assert_msg(bt_plan_make(&p, f.g.graph, d, 3, NULL, &opt) == BT_OK, "%s", p.error);
    for (int x = 0; x < p.n_transfers; x++) ck_assert_int_eq(p.transfers[x].direct, 0);
    bt_plan_free(&p);
    free(d);
    fixture_free(&f);
}
END_TEST

/* A boundary carries one activation, and graph inputs
 * never travel.  On P ranks with layers on every rank: P - 1 activations
 * (each layer's output, "blk.N.out") and the logits back to rank 0; inp_pos
 * and inp_mask are set on the ranks that read them. */
START_TEST(test_plan_one_activation_per_boundary) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = 8;
    struct fixture f;
    fixture_init(&f, &c);
    for (int P = 2; P <= 8; P *= 2) {
        struct bt_rank_desc *d = descs_new(P);
        int *counts = malloc(sizeof(int) * (size_t)P);
        for (int r = 0; r < P; r++) counts[r] = c.n_layers / P;
        const struct bt_plan_options opt = {.layers_per_rank = counts};
        struct bt_plan p;
        ck_assert_msg(bt_plan_make(&p, f.g.graph, d, P, NULL, &opt) == BT_OK, "%s", p.error);
        check_invariants(&p, f.g.graph);
        ck_assert_int_eq(p.n_transfers, P);
        int activations = 0;
        for (int x = 0; x < p.n_transfers; x++) {
            const struct bt_plan_transfer *t = &p.transfers[x];
            const struct bt_tensor *tensor = bt_plan_tensor(f.g.graph, t->tensor);
            if (t->consumer < 0) {
                ck_assert_ptr_eq(tensor, f.g.logits);
                continue;
            }
            ck_assert_int_eq(t->dst, t->src + 1);
            char want[32];
            snprintf(want, sizeof want, "blk.%d.out", p.layer_last[t->src]);
            ck_assert_str_eq(tensor->name, want);
            activations++;
        }
        ck_assert_int_eq(activations, P - 1);
        /* pos and mask on every rank but rank 0 (their owner), nothing else */
        ck_assert_int_eq(p.n_inputs, 2 * (P - 1));
        for (int i = 0; i < p.n_inputs; i++) {
            const struct bt_tensor *t = bt_plan_tensor(f.g.graph, p.inputs[i].tensor);
            ck_assert(t == f.g.pos || t == f.g.mask);
            ck_assert_int_ne(p.inputs[i].rank, 0);
            ck_assert_int_eq(p.splits[p.inputs[i].consumer].rank, p.inputs[i].rank);
        }
        /* baton plan shows the bytes of each boundary */
        char *buf = NULL;
        size_t n = 0;
        FILE *mf = open_memstream(&buf, &n);
        bt_plan_print(&p, f.g.graph, mf);
        fclose(mf);
        char line[128];
        snprintf(line, sizeof line, "rank 0 -> 1: 1 tensor, %.1f KiB (blk.%d.out)",
                 (double)c.d_model * c.n_tokens * sizeof(float) / 1024.0, p.layer_last[0]);
        ck_assert_msg(strstr(buf, line) != NULL, "no '%s' in:\n%s", line, buf);
        free(buf);
        bt_plan_free(&p);
        free(counts);
        free(d);
    }
    fixture_free(&f);
}
END_TEST

START_TEST(test_plan_errors) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    struct fixture f;
    fixture_init(&f, &c);
    struct bt_rank_desc *d = descs_new(2);
    struct bt_plan p;
    ck_assert_int_eq(bt_plan_make(&p, f.g.graph, d, 0, NULL, NULL), BT_ERR_CAPACITY);
    ck_assert_ptr_nonnull(strstr(p.error, "0 ranks"));
    const struct bt_dist_pin pin = {"token_embd*", 5, false};
    const struct bt_plan_options opt = {.pins = &pin, .n_pins = 1};
    ck_assert_int_eq(bt_plan_make(&p, f.g.graph, d, 2, NULL, &opt), BT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(p.error, "token_embd*"));
    const struct bt_plan_options many = {.n_copies = BT_SCHED_MAX_COPIES + 1};
    ck_assert_int_eq(bt_plan_make(&p, f.g.graph, d, 2, NULL, &many), BT_ERR_INVALID);
    const struct bt_plan_options counts = {.layers_per_rank = (const int[]){1, 1}};
    ck_assert_int_ne(bt_plan_make(&p, f.g.graph, d, 2, NULL, &counts), BT_OK);
    ck_assert_ptr_nonnull(strstr(p.error, "placement"));
    bt_plan_free(&p);
    free(d);
    fixture_free(&f);
}
END_TEST

/* 256 ranks of a 94-layer, 128-expert model (the
 * splitter used to stop at 16). */
START_TEST(test_plan_256_ranks) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = 94;
    c.ffn = BT_FFN_MOE_TOPK;
    c.n_experts = 128;
    c.top_k = 8;
    c.d_model = 64;
    c.n_heads = 4;
    c.d_ff = 32;
    c.n_vocab = 256;
    c.n_tokens = 4;
    struct fixture f;
    fixture_init(&f, &c);
    const int P = 256;
    struct bt_rank_desc *d = descs_new(P);
    struct bt_plan p;
    ck_assert_msg(bt_plan_make(&p, f.g.graph, d, P, NULL, NULL) == BT_OK, "%s", p.error);
    check_invariants(&p, f.g.graph);
    ck_assert_int_eq(p.n_ranks, P);
    ck_assert_int_eq(p.n_layers, 94);
    int with_layers = 0;
    for (int r = 0; r < P; r++) with_layers += p.layer_first[r] >= 0;
    ck_assert_int_eq(with_layers, 94); /* fewer layers than ranks: one layer each where the speeds are equal */
    /* the last rank holds the output head, the logits come back */
    ck_assert_int_eq(p.node_owner[f.g.graph->n_nodes - 1], P - 1);
    /* and the same with fixed counts: a layer for each of the first 94 ranks
     * is not a layout the cost model may refuse */
    int *counts = calloc(P, sizeof(int));
    for (int r = 0; r < 94; r++) counts[r] = 1;
    struct bt_plan q;
    const struct bt_plan_options opt = {.layers_per_rank = counts};
    ck_assert_msg(bt_plan_make(&q, f.g.graph, d, P, NULL, &opt) == BT_OK, "%s", q.error);
    check_invariants(&q, f.g.graph);
    for (int r = 0; r < 94; r++) ck_assert(q.layer_first[r] == r && q.layer_last[r] == r);
    bt_plan_free(&q);
    free(counts);
    bt_plan_free(&p);
    free(d);
    fixture_free(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_plan_two_ranks);
    tcase_add_test(tc, test_plan_is_a_pure_function);
    tcase_add_test(tc, test_plan_pack_unpack);
    tcase_add_test(tc, test_plan_device_edges);
    tcase_add_test(tc, test_plan_one_activation_per_boundary);
    tcase_add_test(tc, test_plan_errors);
    tcase_add_test(tc, test_plan_256_ranks);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
