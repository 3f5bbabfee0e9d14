/* test_determinism.c - cpu.h promises that results never depend on the thread
 * count: a graph of mixed ops computed with 1, 2, 3 and 4 threads must give
 * bitwise identical outputs.  Shapes are large enough that every thread gets
 * work and odd enough that the splits are uneven. */
#include <math.h>
#include <string.h>

#include "testutil.h"

#define N_OUT_MAX 64

struct model {
    bt_context *ctx;
    struct bt_graph *g;
    struct bt_tensor *outs[N_OUT_MAX];
    int n_outs;
};

static void add_out(struct model *m, struct bt_tensor *t, const char *name) {
    ck_assert_msg(t != NULL, "%s: %s", name, bt_context_error(m->ctx));
    ck_assert(m->n_outs < N_OUT_MAX);
    bt_set_name(t, name);
    bt_set_output(t);
    m->outs[m->n_outs++] = t;
}

static void build(struct model *m) {
    const enum bt_type wtypes[5] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16, BT_TYPE_Q8_0,
                                    BT_TYPE_Q4_0};
    const int64_t K = 160, M = 67, T = 37, NE = 8, NU = 2;
    bt_context *ctx = m->ctx = tu_ctx(64);
    tu_rng r;
    tu_rng_init(&r, 4242);
    m->n_outs = 0;

    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, K, T);
    tu_fill(x, &r);
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, NU, T);
    tu_fill_ids(ids, &r, (int32_t)NE);
    struct bt_tensor *xb = bt_reshape_3d(ctx, x, K, 1, T);
    struct bt_tensor *y[5];
    for (int i = 0; i < 5; i++) {
        struct bt_tensor *w = bt_new_tensor_2d(ctx, wtypes[i], K, M);
        tu_fill(w, &r);
        y[i] = bt_mul_mat(ctx, w, x); /* [67, 37] */
        add_out(m, y[i], "mul_mat");
        struct bt_tensor *as = bt_new_tensor_3d(ctx, wtypes[i], K, M, NE);
        tu_fill(as, &r);
        add_out(m, bt_mul_mat_id(ctx, as, xb, ids), "mul_mat_id"); /* [67, 2, 37] */
    }
    /* a larger matmul with a transposed-activation operand and batch broadcast */
    struct bt_tensor *w3 = bt_new_tensor_3d(ctx, BT_TYPE_Q4_0, 320, 131, 2);
    struct bt_tensor *x3 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 320, 45, 4);
    tu_fill(w3, &r);
    tu_fill(x3, &r);
    add_out(m, bt_mul_mat(ctx, w3, x3), "mul_mat_bcast");
    struct bt_tensor *wf = bt_new_tensor_3d(ctx, BT_TYPE_F16, 96, 53, 3);
    struct bt_tensor *xp = bt_new_tensor_3d(ctx, BT_TYPE_F32, 96, 3, 29);
    tu_fill(wf, &r);
    tu_fill(xp, &r);
    add_out(m, bt_mul_mat(ctx, wf, bt_permute(ctx, xp, 0, 2, 1, 3)), "mul_mat_perm");

    /* row ops on the matmul results */
    struct bt_tensor *mask = bt_new_tensor_2d(ctx, BT_TYPE_F32, M, T);
    tu_fill(mask, &r);
    add_out(m, bt_soft_max_ext(ctx, y[0], mask, 0.3f), "soft_max_ext");
    add_out(m, bt_soft_max(ctx, bt_transpose(ctx, y[1])), "soft_max_t");
    add_out(m, bt_rms_norm(ctx, y[3], 1e-5f), "rms_norm");
    add_out(m, bt_norm(ctx, y[4], 1e-5f), "norm");
    add_out(m, bt_sum_rows(ctx, y[2]), "sum_rows");
    add_out(m, bt_mean(ctx, y[1]), "mean");
    add_out(m, bt_gelu(ctx, y[0]), "gelu");
    add_out(m, bt_silu(ctx, y[1]), "silu");
    add_out(m, bt_sigmoid(ctx, y[2]), "sigmoid");
    add_out(m, bt_swiglu(ctx, y[3], y[4]), "swiglu");
    add_out(m, bt_argsort(ctx, y[2], BT_SORT_DESC), "argsort");
    add_out(m, bt_top_k(ctx, y[3], 5), "top_k");
    add_out(m, bt_add(ctx, y[0], bt_view_1d(ctx, y[1], M, 0)), "add_bcast");
    add_out(m, bt_mul(ctx, bt_transpose(ctx, y[2]), bt_transpose(ctx, y[3])), "mul_t");
    add_out(m, bt_div(ctx, y[4], bt_sqrt(ctx, bt_add(ctx, bt_sqr(ctx, y[1]), y[0]))), "div");

    /* rope on a [16, 4, 37] view of a matmul */
    struct bt_tensor *wr = bt_new_tensor_2d(ctx, BT_TYPE_BF16, K, 64);
    tu_fill(wr, &r);
    struct bt_tensor *qr = bt_reshape_3d(ctx, bt_mul_mat(ctx, wr, x), 16, 4, T);
    struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, T);
    tu_fill_ids(pos, &r, 500);
    add_out(m, bt_rope(ctx, qr, pos, 12, BT_ROPE_NEOX, 10000.0f, 1.0f), "rope_neox");
    add_out(m, bt_rope(ctx, qr, pos, 16, BT_ROPE_NORMAL, 1e6f, 0.5f), "rope_normal");
    add_out(m, bt_cont(ctx, bt_permute(ctx, qr, 1, 2, 0, 3)), "cont_perm");
    add_out(m, bt_concat(ctx, y[0], y[1], 1), "concat");

    /* gathers and scatters */
    struct bt_tensor *tab = bt_new_tensor_2d(ctx, BT_TYPE_Q8_0, 96, 50);
    tu_fill(tab, &r);
    struct bt_tensor *rows = bt_new_tensor_1d(ctx, BT_TYPE_I32, 41);
    tu_fill_ids(rows, &r, 50);
    add_out(m, bt_get_rows(ctx, tab, rows), "get_rows");
    struct bt_tensor *kv = bt_new_tensor_2d(ctx, BT_TYPE_F16, M, 60);
    memset(kv->data, 0, bt_nbytes(kv));
    struct bt_tensor *slots = bt_new_tensor_1d(ctx, BT_TYPE_I32, T);
    for (int i = 0; i < T; i++) ((int32_t *)slots->data)[i] = (int32_t)((i * 7) % 60);
    add_out(m, bt_set_rows(ctx, kv, bt_transpose(ctx, bt_cont(ctx, bt_transpose(ctx, y[2]))), slots),
            "set_rows");
    struct bt_tensor *dq = bt_new_tensor_1d(ctx, BT_TYPE_F16, M * T);
    add_out(m, bt_cpy(ctx, y[4], dq), "cpy_f16");

    m->g = tu_graph(ctx, m->outs, m->n_outs);
}

/* Poison the outputs that own their data, compute, snapshot every output. */
static void run_snapshot(struct model *m, bt_cpu *cpu, void **snap) {
    for (int i = 0; i < m->n_outs; i++)
        if (!m->outs[i]->view_src) memset(tu_data(m->outs[i]), 0xff, bt_nbytes(m->outs[i]));
    enum bt_status s = bt_cpu_graph_compute(cpu, m->g);
    ck_assert_msg(s == BT_OK, "compute (%d threads): %s", bt_cpu_n_threads(cpu), bt_cpu_error(cpu));
    for (int i = 0; i < m->n_outs; i++) {
        size_t n = bt_nbytes(m->outs[i]);
        snap[i] = malloc(n);
        memcpy(snap[i], tu_data(m->outs[i]), n);
    }
}

static void compare(struct model *m, void **a, void **b, const char *what) {
    for (int i = 0; i < m->n_outs; i++) {
        const struct bt_tensor *t = m->outs[i];
        /* compare logical elements (views may have gaps) */
        size_t es = bt_type_size(t->type);
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                    size_t off = tu_offset(t, 0, i1, i2, i3);
                    size_t len = bt_is_contiguous_rows(t) ? bt_row_size(t->type, t->ne[0]) : 0;
                    if (len) {
                        ck_assert_msg(memcmp((char *)a[i] + off, (char *)b[i] + off, len) == 0,
                                      "%s: output %d '%s' (%s) differs in row (%ld,%ld,%ld)", what, i,
                                      t->name, bt_op_name(t->op), (long)i1, (long)i2, (long)i3);
                    } else {
                        for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                            size_t o = off + (size_t)i0 * t->nb[0];
                            ck_assert_msg(memcmp((char *)a[i] + o, (char *)b[i] + o, es) == 0,
                                          "%s: output %d '%s' differs", what, i, t->name);
                        }
                    }
                }
    }
}

static void free_snap(struct model *m, void **s) {
    for (int i = 0; i < m->n_outs; i++) free(s[i]);
}

START_TEST(test_thread_count_invariance) {
    struct model m;
    build(&m);
    ck_assert_int_ge(m.n_outs, 30);
    void *base[N_OUT_MAX], *other[N_OUT_MAX];
    run_snapshot(&m, tu_cpu(1), base);
    /* the outputs are not trivially constant or NaN */
    {
        float *v = tu_read_f32(m.outs[0]);
        int64_t n = bt_nelements(m.outs[0]);
        double s2 = 0;
        for (int64_t i = 0; i < n; i++) {
            ck_assert(isfinite(v[i]));
            s2 += (double)v[i] * v[i];
        }
        ck_assert(s2 > 1.0);
        free(v);
    }
    for (int nt = 1; nt <= 4; nt++) {
        char what[64];
        snprintf(what, sizeof(what), "%d threads vs 1", nt);
        run_snapshot(&m, tu_cpu(nt), other);
        compare(&m, base, other, what);
        free_snap(&m, other);
    }
    /* the plain reference kernels are deterministic across thread counts too */
    void *ref1[N_OUT_MAX];
    bt_cpu *c1 = tu_cpu(1);
    bt_cpu_set_reference(c1, true);
    run_snapshot(&m, c1, ref1);
    bt_cpu_set_reference(c1, false);
    for (int nt = 2; nt <= 4; nt++) {
        char what[64];
        snprintf(what, sizeof(what), "reference kernels, %d threads vs 1", nt);
        bt_cpu *c = tu_cpu(nt);
        bt_cpu_set_reference(c, true);
        run_snapshot(&m, c, other);
        bt_cpu_set_reference(c, false);
        compare(&m, ref1, other, what);
        free_snap(&m, other);
    }
    free_snap(&m, ref1);
    free_snap(&m, base);
    bt_free(m.ctx);
}
END_TEST

START_TEST(test_rebuild_same_result) {
    /* two independent builds of the same model on different executors agree */
    struct model a, b;
    build(&a);
    build(&b);
    ck_assert_uint_eq(bt_graph_hash(a.g), bt_graph_hash(b.g));
    void *sa[N_OUT_MAX], *sb[N_OUT_MAX];
    run_snapshot(&a, tu_cpu(3), sa);
    run_snapshot(&b, tu_cpu(2), sb);
    compare(&a, sa, sb, "rebuilt model, 3 vs 2 threads");
    free_snap(&a, sa);
    free_snap(&b, sb);
    bt_free(a.ctx);
    bt_free(b.ctx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("determinism");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_thread_count_invariance);
    tcase_add_test(tc, test_rebuild_same_result);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
