/* test_graph.c - the static graph: topological DFS order, leaf/node split,
 * deduplication, capacity errors, graph views, the structural hash, and the
 * pointer hash set underneath. */
#include <string.h>

#include "testutil.h"

static int index_in(struct bt_tensor **arr, int n, const struct bt_tensor *t) {
    for (int i = 0; i < n; i++)
        if (arr[i] == t) return i;
    return -1;
}

/* every tensor appears once; nodes have an op, leafs have none; every node's
 * sources are leafs or earlier nodes */
static void check_topology(const struct bt_graph *g) {
    for (int i = 0; i < g->n_leafs; i++) {
        ck_assert_int_eq(g->leafs[i]->op, BT_OP_NONE);
        ck_assert_int_eq(index_in(g->leafs, i, g->leafs[i]), -1);
        ck_assert_int_eq(index_in(g->nodes, g->n_nodes, g->leafs[i]), -1);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        struct bt_tensor *n = g->nodes[i];
        ck_assert_int_ne(n->op, BT_OP_NONE);
        ck_assert_int_eq(index_in(g->nodes, i, n), -1);
        ck_assert_int_eq(bt_graph_node_index(g, n), i);
        for (int s = 0; s < BT_MAX_SRC; s++) {
            struct bt_tensor *src = n->src[s];
            if (!src) continue;
            if (src->op == BT_OP_NONE) {
                ck_assert_msg(index_in(g->leafs, g->n_leafs, src) >= 0, "leaf src missing");
            } else {
                int j = index_in(g->nodes, g->n_nodes, src);
                ck_assert_msg(j >= 0 && j < i, "node %d (%s) has src at %d", i, bt_op_name(n->op),
                              j);
            }
        }
    }
}

START_TEST(test_build_order) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 16, 4);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, BT_TYPE_F32, 16, 8);
    struct bt_tensor *b = bt_new_tensor_1d(ctx, BT_TYPE_F32, 8);
    struct bt_tensor *y = bt_mul_mat(ctx, w, x);   /* [8,4] */
    struct bt_tensor *yb = bt_add(ctx, y, b);       /* shared below */
    struct bt_tensor *r = bt_relu(ctx, yb);
    struct bt_tensor *s = bt_sigmoid(ctx, yb);
    struct bt_tensor *z = bt_mul(ctx, r, s);
    struct bt_tensor *o = bt_add(ctx, z, yb); /* yb reachable three times */
    TU_OK(ctx, o);
    struct bt_graph *g = bt_graph_new(ctx, 64);
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(g->size, 64);
    ck_assert_int_eq(g->n_nodes, 0);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, o), BT_OK);
    ck_assert_int_eq(g->n_leafs, 3);
    ck_assert_int_eq(g->n_nodes, 6);
    check_topology(g);
    ck_assert_ptr_eq(bt_graph_node(g, -1), o);
    ck_assert_ptr_eq(bt_graph_node(g, g->n_nodes - 1), o);
    ck_assert_ptr_eq(bt_graph_node(g, 0), y);
    ck_assert_int_eq(bt_graph_node_index(g, yb), 1);
    ck_assert_int_eq(bt_graph_node_index(g, x), -1);
    /* post-order DFS visits src[0] before src[1]: leafs in first-use order */
    ck_assert_ptr_eq(g->leafs[0], w);
    ck_assert_ptr_eq(g->leafs[1], x);
    ck_assert_ptr_eq(g->leafs[2], b);
    ck_assert_ptr_eq(g->nodes[2], r);
    ck_assert_ptr_eq(g->nodes[3], s);

    /* expanding again with something already there adds nothing; a new
     * output reuses the visited set */
    ck_assert_int_eq(bt_graph_build_forward_expand(g, o), BT_OK);
    ck_assert_int_eq(g->n_nodes, 6);
    struct bt_tensor *o2 = bt_scale(ctx, r, 2.0f);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, o2), BT_OK);
    ck_assert_int_eq(g->n_nodes, 7);
    ck_assert_int_eq(g->n_leafs, 3);
    ck_assert_ptr_eq(bt_graph_node(g, -1), o2);
    check_topology(g);

    /* views are nodes; their source is visited first */
    struct bt_tensor *v = bt_view_1d(ctx, x, 4, 0);
    struct bt_tensor *vt = bt_transpose(ctx, x);
    struct bt_tensor *c = bt_cont(ctx, vt);
    struct bt_tensor *c2 = bt_add(ctx, bt_sum_rows(ctx, c), bt_sum_rows(ctx, bt_reshape_2d(ctx, v, 4, 1)));
    TU_OK(ctx, c2);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, c2), BT_OK);
    check_topology(g);
    ck_assert_int_ge(bt_graph_node_index(g, vt), 0);
    ck_assert_int_ge(bt_graph_node_index(g, v), 0);
    ck_assert_int_eq(g->n_leafs, 3);

    /* a lone leaf as output */
    struct bt_graph *g2 = bt_graph_new(ctx, 8);
    struct bt_tensor *lone = bt_new_tensor_1d(ctx, BT_TYPE_F32, 3);
    ck_assert_int_eq(bt_graph_build_forward_expand(g2, lone), BT_OK);
    ck_assert_int_eq(g2->n_leafs, 1);
    ck_assert_int_eq(g2->n_nodes, 0);

    /* NULL tensor */
    ck_assert_int_eq(bt_graph_build_forward_expand(g2, NULL), BT_ERR_INVALID);
    bt_free(ctx);
}
END_TEST

START_TEST(test_build_diamond_dedup) {
    /* a deep diamond lattice: every level combines the two previous ones, so a
     * naive traversal would be exponential and duplicate nodes */
    bt_context *ctx = tu_ctx(8);
    struct bt_tensor *a = bt_new_tensor_1d(ctx, BT_TYPE_F32, 4);
    struct bt_tensor *b = bt_new_tensor_1d(ctx, BT_TYPE_F32, 4);
    struct bt_tensor *p = a, *q = b;
    for (int i = 0; i < 60; i++) {
        struct bt_tensor *n = bt_add(ctx, p, q);
        p = q;
        q = n;
    }
    TU_OK(ctx, q);
    struct bt_graph *g = bt_graph_new(ctx, 256);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, q), BT_OK);
    ck_assert_int_eq(g->n_nodes, 60);
    ck_assert_int_eq(g->n_leafs, 2);
    check_topology(g);

    /* and it computes: a Fibonacci-like recurrence */
    float one[4] = {1, 1, 1, 1}, zero[4] = {0, 0, 0, 0};
    tu_write_f32(a, zero);
    tu_write_f32(b, one);
    ck_assert_int_eq(tu_run(g, 2), BT_OK);
    /* the same recurrence in float, same rounding: bitwise equal */
    float f0 = 0, f1 = 1;
    for (int i = 0; i < 60; i++) {
        float f2 = f0 + f1;
        f0 = f1;
        f1 = f2;
    }
    float *v = tu_read_f32(q);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(v[i], f1);
    free(v);
    bt_free(ctx);
}
END_TEST

START_TEST(test_capacity) {
    bt_context *ctx = tu_ctx(4);
    /* nodes overflow */
    struct bt_tensor *x = bt_new_tensor_1d(ctx, BT_TYPE_F32, 8);
    struct bt_tensor *t = x;
    for (int i = 0; i < 10; i++) t = bt_relu(ctx, t);
    TU_OK(ctx, t);
    struct bt_graph *g = bt_graph_new(ctx, 4);
    ck_assert_ptr_nonnull(g);
    bt_context_clear_error(ctx);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, t), BT_ERR_CAPACITY);
    ck_assert_str_ne(bt_context_error(ctx), "");
    ck_assert_int_le(g->n_nodes, 4);

    /* exactly at capacity is fine */
    struct bt_tensor *u = x;
    for (int i = 0; i < 4; i++) u = bt_relu(ctx, u);
    struct bt_graph *g4 = bt_graph_new(ctx, 4);
    ck_assert_int_eq(bt_graph_build_forward_expand(g4, u), BT_OK);
    ck_assert_int_eq(g4->n_nodes, 4);
    check_topology(g4);

    /* leafs overflow */
    bt_context_clear_error(ctx);
    struct bt_tensor *s = bt_new_tensor_1d(ctx, BT_TYPE_F32, 8);
    for (int i = 0; i < 5; i++) s = bt_add(ctx, s, bt_new_tensor_1d(ctx, BT_TYPE_F32, 8));
    TU_OK(ctx, s);
    struct bt_graph *g5 = bt_graph_new(ctx, 5);
    ck_assert_int_eq(bt_graph_build_forward_expand(g5, s), BT_ERR_CAPACITY);
    ck_assert_str_ne(bt_context_error(ctx), "");

    /* graph_new from an arena that is too small */
    struct bt_init_params ip = {bt_graph_overhead(1000) / 2, NULL, true};
    bt_context *small = bt_init(ip);
    ck_assert_ptr_nonnull(small);
    ck_assert_ptr_null(bt_graph_new(small, 1000));
    ck_assert_str_ne(bt_context_error(small), "");
    bt_free(small);
    bt_free(ctx);
}
END_TEST

START_TEST(test_graph_view) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *t = bt_new_tensor_1d(ctx, BT_TYPE_F32, 8);
    struct bt_tensor *chain[6];
    for (int i = 0; i < 6; i++) chain[i] = t = bt_scale(ctx, t, 2.0f);
    struct bt_graph *g = bt_graph_new(ctx, 16);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, t), BT_OK);
    ck_assert_int_eq(g->n_nodes, 6);
    struct bt_graph v = bt_graph_view(g, 1, 4);
    ck_assert_int_eq(v.n_nodes, 3);
    ck_assert_int_eq(v.n_leafs, 0);
    ck_assert_uint_eq(v.visited.size, 0);
    for (int i = 0; i < 3; i++) ck_assert_ptr_eq(v.nodes[i], chain[1 + i]);
    ck_assert_ptr_eq(bt_graph_node(&v, -1), chain[3]);
    ck_assert_int_eq(bt_graph_node_index(&v, chain[2]), 1);
    ck_assert_int_eq(bt_graph_node_index(&v, chain[0]), -1);
    ck_assert_int_eq(bt_graph_node_index(&v, chain[4]), -1);
    struct bt_graph e = bt_graph_view(g, 6, 6);
    ck_assert_int_eq(e.n_nodes, 0);

    /* computing the pieces in order equals computing the whole */
    float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    tu_write_f32(g->leafs[0], ones);
    struct bt_graph v0 = bt_graph_view(g, 0, 2), v1 = bt_graph_view(g, 2, 6);
    ck_assert_int_eq(tu_run(&v0, 1), BT_OK);
    float *r1 = tu_read_f32(chain[1]);
    ck_assert_float_eq(r1[0], 4.0f);
    free(r1);
    ck_assert_int_eq(tu_run(&v1, 2), BT_OK);
    float *r = tu_read_f32(t);
    for (int i = 0; i < 8; i++) ck_assert_float_eq(r[i], 64.0f);
    free(r);
    bt_free(ctx);
}
END_TEST

/* ---- structural hash ---- */

struct variant {
    float eps;
    int rope_mode;
    int64_t d;
    enum bt_type wtype;
    float scale;
};

static struct bt_graph *build_model(bt_context *ctx, struct variant v, uint64_t seed,
                                    const char *name) {
    tu_rng r;
    tu_rng_init(&r, seed);
    const int64_t d = v.d, nh = 2, T = 5;
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, d, T);
    bt_set_input(x);
    bt_set_name(x, name);
    struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, T);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, v.wtype, d, d);
    bt_set_weight(w);
    struct bt_tensor *h = bt_rms_norm(ctx, x, v.eps);
    struct bt_tensor *q = bt_mul_mat(ctx, w, h);
    q = bt_reshape_3d(ctx, q, d / nh, nh, T);
    q = bt_rope(ctx, q, pos, (int)(d / nh), v.rope_mode, 10000.0f, 1.0f);
    q = bt_permute(ctx, q, 0, 2, 1, 3);
    q = bt_cont(ctx, q);
    q = bt_scale(ctx, q, v.scale);
    struct bt_tensor *o = bt_soft_max(ctx, q);
    TU_OK(ctx, o);
    bt_set_output(o);
    tu_fill(x, &r);
    tu_fill(w, &r);
    tu_fill_ids(pos, &r, 100);
    struct bt_graph *g = bt_graph_new(ctx, 64);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, o), BT_OK);
    return g;
}

START_TEST(test_graph_hash) {
    struct variant base = {1e-5f, BT_ROPE_NEOX, 64, BT_TYPE_F16, 0.5f};
    bt_context *c1 = tu_ctx(4), *c2 = tu_ctx(4);
    /* waste some arena in c2 so that addresses differ */
    bt_new_tensor_1d(c2, BT_TYPE_F32, 1000);
    uint64_t h1 = bt_graph_hash(build_model(c1, base, 1, "x"));
    uint64_t h2 = bt_graph_hash(build_model(c2, base, 2, "another name"));
    ck_assert_uint_eq(h1, h2); /* data and names do not count */
    ck_assert_uint_eq(bt_graph_hash(build_model(c1, base, 3, "x")), h1); /* stable */

    struct variant v;
    v = base;
    v.eps = 1e-6f;
    ck_assert_uint_ne(bt_graph_hash(build_model(c2, v, 1, "x")), h1);
    v = base;
    v.rope_mode = BT_ROPE_NORMAL;
    ck_assert_uint_ne(bt_graph_hash(build_model(c2, v, 1, "x")), h1);
    v = base;
    v.d = 96;
    ck_assert_uint_ne(bt_graph_hash(build_model(c2, v, 1, "x")), h1);
    v = base;
    v.wtype = BT_TYPE_Q8_0;
    ck_assert_uint_ne(bt_graph_hash(build_model(c2, v, 1, "x")), h1);
    v = base;
    v.scale = 0.25f;
    ck_assert_uint_ne(bt_graph_hash(build_model(c2, v, 1, "x")), h1);

    /* source positions count: a - b vs b - a */
    bt_context *c3 = tu_ctx(1);
    struct bt_tensor *a = bt_new_tensor_1d(c3, BT_TYPE_F32, 4);
    struct bt_tensor *b = bt_new_tensor_1d(c3, BT_TYPE_F32, 4);
    struct bt_graph *ga = bt_graph_new(c3, 8), *gb = bt_graph_new(c3, 8), *gc = bt_graph_new(c3, 8);
    bt_graph_build_forward_expand(ga, bt_sub(c3, a, b));
    bt_graph_build_forward_expand(gb, bt_sub(c3, b, a));
    bt_graph_build_forward_expand(gc, bt_sub(c3, a, a));
    ck_assert_uint_eq(bt_graph_hash(ga), bt_graph_hash(gb)); /* a and b are interchangeable */
    ck_assert_uint_ne(bt_graph_hash(ga), bt_graph_hash(gc));
    /* flags count */
    struct bt_tensor *e = bt_new_tensor_1d(c3, BT_TYPE_F32, 4);
    struct bt_tensor *f = bt_new_tensor_1d(c3, BT_TYPE_F32, 4);
    bt_set_input(f);
    struct bt_graph *ge = bt_graph_new(c3, 8), *gf = bt_graph_new(c3, 8);
    bt_graph_build_forward_expand(ge, bt_relu(c3, e));
    bt_graph_build_forward_expand(gf, bt_relu(c3, f));
    ck_assert_uint_ne(bt_graph_hash(ge), bt_graph_hash(gf));
    /* view offsets count */
    struct bt_tensor *big = bt_new_tensor_1d(c3, BT_TYPE_F32, 16);
    struct bt_graph *gv0 = bt_graph_new(c3, 8), *gv1 = bt_graph_new(c3, 8);
    bt_graph_build_forward_expand(gv0, bt_relu(c3, bt_view_1d(c3, big, 4, 0)));
    bt_graph_build_forward_expand(gv1, bt_relu(c3, bt_view_1d(c3, big, 4, 16)));
    ck_assert_uint_ne(bt_graph_hash(gv0), bt_graph_hash(gv1));

    FILE *devnull = fopen("/dev/null", "w");
    bt_graph_print(ga, devnull);
    fclose(devnull);
    bt_free(c1);
    bt_free(c2);
    bt_free(c3);
}
END_TEST

/* ---- hash set ---- */

START_TEST(test_hash_set) {
    size_t sz = bt_hash_size(100);
    ck_assert_uint_ge(sz, 100);
    for (size_t d = 2; d * d <= sz; d++) ck_assert_uint_ne(sz % d, 0); /* prime */
    ck_assert_uint_ge(bt_hash_size(1), 1);

    struct bt_tensor ts[40];
    struct bt_tensor *keys[41];
    memset(keys, 0, sizeof(keys));
    struct bt_hash_set set = {41, keys};
    for (int i = 0; i < 40; i++) {
        ck_assert(!bt_hash_contains(&set, &ts[i]));
        size_t slot = bt_hash_insert(&set, &ts[i]);
        ck_assert_uint_lt(slot, 41);
        ck_assert_ptr_eq(keys[slot], &ts[i]);
        ck_assert(bt_hash_contains(&set, &ts[i]));
        ck_assert_uint_eq(bt_hash_find(&set, &ts[i]), slot);
        ck_assert_uint_eq(bt_hash_insert(&set, &ts[i]), slot); /* idempotent */
    }
    struct bt_tensor extra[2];
    ck_assert(!bt_hash_contains(&set, &extra[0]));
    ck_assert_uint_ne(bt_hash_insert(&set, &extra[0]), BT_HASHSET_FULL); /* 41st slot */
    ck_assert(!bt_hash_contains(&set, &extra[1]));
    ck_assert_uint_eq(bt_hash_find(&set, &extra[1]), BT_HASHSET_FULL);
    ck_assert_uint_eq(bt_hash_insert(&set, &extra[1]), BT_HASHSET_FULL);
    for (int i = 0; i < 40; i++) ck_assert(bt_hash_contains(&set, &ts[i]));
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_build_order);
    tcase_add_test(tc, test_build_diamond_dedup);
    tcase_add_test(tc, test_capacity);
    tcase_add_test(tc, test_graph_view);
    tcase_add_test(tc, test_graph_hash);
    tcase_add_test(tc, test_hash_set);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
