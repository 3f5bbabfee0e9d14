/* test_determinism.c - cpu.h promises that results never depend on the thread
 * count: a graph of mixed ops computed with 1, 2, 3 and 4 threads must give
 * bitwise identical outputs.  Shapes are large enough that every thread gets
 * work and odd enough that the splits are uneven.  And a token's MUL_MAT /
 * MUL_MAT_ID result never depends on the batch it shares: the same column
 * alone and at several positions of batches of 1..64 columns (MUL_MAT_ID: with
 * any number of other tokens choosing the same experts) gives the same bits,
 * for every weight type.  And float weights follow fdot.c's one order on
 * every path: each element bitwise equal to a scalar model of it. */
#include <math.h>
#include <string.h>

#include "cpu_impl.h" /* BT_MM_FKC */
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
    /* decode shapes: one column (the dot paths, whose rows the threads take
     * in chunks from a shared counter), each matmul behind a view so that
     * computed nodes and node indices alternate differently */
    for (int i = 0; i < 5; i++) {
        struct bt_tensor *w = bt_new_tensor_2d(ctx, wtypes[i], K, 3 * M);
        tu_fill(w, &r);
        struct bt_tensor *col = bt_view_2d(ctx, x, K, 1, x->nb[1], (size_t)(i + 1) * x->nb[1]);
        add_out(m, bt_mul_mat(ctx, w, col), "mul_mat_decode");
        struct bt_tensor *as = bt_new_tensor_3d(ctx, wtypes[i], K, M, NE);
        tu_fill(as, &r);
        struct bt_tensor *id1 = bt_view_2d(ctx, ids, NU, 1, ids->nb[1], (size_t)i * ids->nb[1]);
        add_out(m, bt_mul_mat_id(ctx, as, bt_reshape_3d(ctx, col, K, 1, 1), id1), "mul_mat_id_decode");
    }
    /* the K-quants' decode tiles (4 rows; a thread's last tile of a chunk
     * claims its next chunk, for MUL_MAT_ID maybe in the next expert): 283
     * rows (9 chunks of 32) and 2 experts of 83 rows (3 chunks each), rows
     * of 2 and 1 blocks */
    const enum bt_type ktypes[2] = {BT_TYPE_Q4_K, BT_TYPE_Q6_K};
    for (int i = 0; i < 2; i++) {
        const int64_t KK = 512 / (i + 1);
        struct bt_tensor *xk = bt_new_tensor_2d(ctx, BT_TYPE_F32, KK, 1);
        tu_fill(xk, &r);
        struct bt_tensor *w = bt_new_tensor_2d(ctx, ktypes[i], KK, 283);
        tu_fill(w, &r);
        add_out(m, bt_mul_mat(ctx, w, xk), "mul_mat_decode_k");
        struct bt_tensor *as = bt_new_tensor_3d(ctx, ktypes[i], KK, 83, NE);
        tu_fill(as, &r);
        struct bt_tensor *id1 = bt_view_2d(ctx, ids, NU, 1, ids->nb[1], (size_t)(i + 5) * ids->nb[1]);
        add_out(m, bt_mul_mat_id(ctx, as, bt_reshape_3d(ctx, xk, KK, 1, 1), id1), "mul_mat_id_decode_k");
    }
    /* long decode nodes: enough 32-row units that a chunk holds several and
     * the chunks near the node's end shrink (matmul.c, chunk_end) at 2-4
     * threads: 4113 rows, and 6 of 8 experts of 1040 rows (units never
     * cross an expert) */
    const enum bt_type ltypes[3] = {BT_TYPE_F32, BT_TYPE_BF16, BT_TYPE_Q8_0};
    struct bt_tensor *ids6 = bt_new_tensor_2d(ctx, BT_TYPE_I32, 6, 1);
    for (int e = 0; e < 6; e++) ((int32_t *)ids6->data)[e] = (int32_t)((e * 5 + 3) % 8);
    for (int i = 0; i < 3; i++) {
        struct bt_tensor *xl = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 1);
        tu_fill(xl, &r);
        struct bt_tensor *w = bt_new_tensor_2d(ctx, ltypes[i], 64, 4113);
        tu_fill(w, &r);
        add_out(m, bt_mul_mat(ctx, w, xl), "mul_mat_decode_long");
        struct bt_tensor *as = bt_new_tensor_3d(ctx, ltypes[i], 64, 1040, 8);
        tu_fill(as, &r);
        add_out(m, bt_mul_mat_id(ctx, as, bt_reshape_3d(ctx, xl, 64, 1, 1), ids6), "mul_mat_id_decode_long");
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

/* Poison the outputs that own their data, compute, snapshot every output.
 * Each run poisons with a different byte, so an element no kernel writes
 * differs between two runs instead of comparing equal. */
static void run_snapshot(struct model *m, bt_cpu *cpu, void **snap) {
    static int run_no;
    const int poison = 0x11 * (run_no++ % 15 + 1); /* 0x11, 0x22, ..., 0xff */
    for (int i = 0; i < m->n_outs; i++)
        if (!m->outs[i]->view_src) memset(tu_data(m->outs[i]), poison, bt_nbytes(m->outs[i]));
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


/* ---- batch invariance ------------------------------------------------------ */

static const enum bt_type bi_types[] = {BT_TYPE_F32,  BT_TYPE_F16,  BT_TYPE_BF16, BT_TYPE_Q8_0, BT_TYPE_Q4_0,
                                        /* quants.h's weight types */
                                        BT_TYPE_Q4_1, BT_TYPE_Q5_0, BT_TYPE_Q5_1, BT_TYPE_Q2_K, BT_TYPE_Q3_K,
                                        BT_TYPE_Q4_K, BT_TYPE_Q5_K, BT_TYPE_Q6_K, BT_TYPE_IQ4_NL, BT_TYPE_MXFP4,
                                        BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS, BT_TYPE_IQ2_S,
                                        BT_TYPE_IQ3_XXS, BT_TYPE_IQ3_S, BT_TYPE_IQ1_S};
#define N_BI ((int)(sizeof bi_types / sizeof bi_types[0]))

/* d = mul_mat(w, b) where b holds n columns: random ones, with column `pos`
 * equal to x; returns d's column pos (m floats, malloc'd).  Output poisoned
 * with a byte that differs per call so an unwritten element cannot match. */
static float *bi_mul_mat_col(const struct bt_tensor *w, const float *x, int64_t n, int64_t pos,
                             int nt, uint64_t seed, int poison) {
    const int64_t k = w->ne[0], m = w->ne[1];
    bt_context *ctx = tu_ctx(8);
    struct bt_tensor *wc = bt_new_tensor_2d(ctx, w->type, k, m);
    memcpy(wc->data, w->data, bt_nbytes(w));
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, k, n);
    tu_rng r;
    tu_rng_init(&r, seed);
    tu_fill(b, &r);
    memcpy((float *)b->data + pos * k, x, sizeof(float) * (size_t)k);
    struct bt_tensor *d = bt_mul_mat(ctx, wc, b);
    ck_assert_ptr_nonnull(d);
    struct bt_graph *g = tu_graph(ctx, &d, 1);
    memset(d->data, poison, bt_nbytes(d));
    ck_assert_int_eq(tu_run(g, nt), BT_OK);
    float *col = malloc(sizeof(float) * (size_t)m);
    memcpy(col, (const float *)d->data + pos * m, sizeof(float) * (size_t)m);
    bt_free(ctx);
    return col;
}

START_TEST(test_batch_invariance_mul_mat) {
    const enum bt_type wt = bi_types[_i];
    /* k: not a multiple of 16 for the float types (a tail), several blocks
     * otherwise; m not a multiple of any tile */
    const int64_t k = bt_blck_size(wt) > 32 ? 512 : bt_blck_size(wt) > 1 ? 320 : 203, m = 45;
    bt_context *ctx = tu_ctx(8);
    tu_rng r;
    tu_rng_init(&r, 5150 + (uint64_t)_i);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, wt, k, m);
    tu_fill(w, &r);
    float *x = malloc(sizeof(float) * (size_t)k);
    for (int64_t i = 0; i < k; i++) x[i] = tu_rng_f32(&r, -1.0f, 1.0f);
    float *alone = bi_mul_mat_col(w, x, 1, 0, 1, 1, 0xff);
    double s2 = 0.0;
    for (int64_t i = 0; i < m; i++) {
        ck_assert(isfinite(alone[i]));
        s2 += (double)alone[i] * alone[i];
    }
    ck_assert(s2 > 1.0);
    int calls = 0;
    for (int64_t n = 1; n <= 64; n++) {
        const int64_t poss[3] = {0, n / 2, n - 1};
        for (int pi = 0; pi < 3; pi++) {
            if (pi > 0 && poss[pi] == poss[pi - 1]) continue;
            const int nt = 1 + (int)((n + pi) % 3);
            float *got = bi_mul_mat_col(w, x, n, poss[pi], nt, 77 + (uint64_t)n, 0x11 * (++calls % 15 + 1));
            for (int64_t i = 0; i < m; i++)
                ck_assert_msg(memcmp(&got[i], &alone[i], sizeof(float)) == 0,
                              "%s: mul_mat row %ld: alone %.9g, column %ld of %ld (%d threads) %.9g",
                              bt_type_name(wt), (long)i, alone[i], (long)poss[pi], (long)n, nt,
                              got[i]);
            free(got);
        }
    }
    free(alone);
    free(x);
    bt_free(ctx);
}
END_TEST

/* d = mul_mat_id(as, b, ids) over T tokens; token pos uses x and ids xid
 * (n_used of them), the others random columns and random ids (so the number
 * of columns each expert gets varies with T).  Returns d[:, :, pos]
 * (m * n_used floats, malloc'd). */
static float *bi_mul_mat_id_tok(const struct bt_tensor *as, const float *x, const int32_t *xid,
                                int64_t n_used, bool bcast, int64_t T, int64_t pos, int nt,
                                uint64_t seed, int poison) {
    const int64_t k = as->ne[0], m = as->ne[1], ne = as->ne[2], nb = bcast ? 1 : n_used;
    bt_context *ctx = tu_ctx(16);
    struct bt_tensor *ac = bt_new_tensor_3d(ctx, as->type, k, m, ne);
    memcpy(ac->data, as->data, bt_nbytes(as));
    struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, nb, T);
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, n_used, T);
    tu_rng r;
    tu_rng_init(&r, seed);
    tu_fill(b, &r);
    tu_fill_ids(ids, &r, (int32_t)ne);
    for (int64_t s = 0; s < nb; s++)
        memcpy((float *)b->data + (pos * nb + s) * k, x + s * k, sizeof(float) * (size_t)k);
    memcpy((int32_t *)ids->data + pos * n_used, xid, sizeof(int32_t) * (size_t)n_used);
    struct bt_tensor *d = bt_mul_mat_id(ctx, ac, b, ids);
    ck_assert_ptr_nonnull(d);
    struct bt_graph *g = tu_graph(ctx, &d, 1);
    memset(d->data, poison, bt_nbytes(d));
    ck_assert_int_eq(tu_run(g, nt), BT_OK);
    float *out = malloc(sizeof(float) * (size_t)(m * n_used));
    memcpy(out, (const float *)d->data + pos * m * n_used, sizeof(float) * (size_t)(m * n_used));
    bt_free(ctx);
    return out;
}

START_TEST(test_batch_invariance_mul_mat_id) {
    const enum bt_type wt = bi_types[_i % N_BI];
    const bool bcast = _i >= N_BI; /* one activation row shared by the used experts */
    const int64_t k = bt_blck_size(wt) > 1 ? 256 : 141, m = 37, ne = 4, nu = 2;
    bt_context *ctx = tu_ctx(8);
    tu_rng r;
    tu_rng_init(&r, 6160 + (uint64_t)_i);
    struct bt_tensor *as = bt_new_tensor_3d(ctx, wt, k, m, ne);
    tu_fill(as, &r);
    const int64_t nx = bcast ? k : nu * k;
    float *x = malloc(sizeof(float) * (size_t)nx);
    for (int64_t i = 0; i < nx; i++) x[i] = tu_rng_f32(&r, -1.0f, 1.0f);
    const int32_t xid[2] = {3, 1};
    float *alone = bi_mul_mat_id_tok(as, x, xid, nu, bcast, 1, 0, 1, 1, 0xff);
    int calls = 0;
    for (int64_t T = 1; T <= 64; T++) {
        const int64_t poss[3] = {0, T / 2, T - 1};
        for (int pi = 0; pi < 3; pi++) {
            if (pi > 0 && poss[pi] == poss[pi - 1]) continue;
            const int nt = 1 + (int)((T + pi) % 3);
            float *got = bi_mul_mat_id_tok(as, x, xid, nu, bcast, T, poss[pi], nt, 99 + (uint64_t)T,
                                           0x11 * (++calls % 15 + 1));
            for (int64_t i = 0; i < m * nu; i++)
                ck_assert_msg(memcmp(&got[i], &alone[i], sizeof(float)) == 0,
                              "%s%s: mul_mat_id slot %ld row %ld: alone %.9g, token %ld of %ld "
                              "(%d threads) %.9g",
                              bt_type_name(wt), bcast ? " (shared b)" : "", (long)(i / m),
                              (long)(i % m), alone[i], (long)poss[pi], (long)T, nt, got[i]);
            free(got);
        }
    }
    free(alone);
    free(x);
    bt_free(ctx);
}
END_TEST

/* BF16 MUL_MAT_ID, odd k, 1 thread: expert 0 (token 0 alone: the dot path,
 * which converts the column to BF16 pairs once per node and keeps it), then
 * expert 1 (tokens 1..8: the GEMM path, whose packing of an odd k's last
 * block writes the same buffer), then expert 2 (token 0 alone again: it
 * must convert the column again).  Token 0's outputs against token 0 alone. */
START_TEST(test_bf16_dot_after_gemm) {
    const int64_t k = 141, m = 37, ne = 4, nu = 2, T = 9;
    bt_context *ctx = tu_ctx(8);
    tu_rng r;
    tu_rng_init(&r, 7171);
    struct bt_tensor *as = bt_new_tensor_3d(ctx, BT_TYPE_BF16, k, m, ne);
    struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, 1, T);
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, nu, T);
    struct bt_tensor *b1 = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, 1, 1);
    struct bt_tensor *ids1 = bt_new_tensor_2d(ctx, BT_TYPE_I32, nu, 1);
    tu_fill(as, &r);
    tu_fill(b, &r);
    memcpy(b1->data, b->data, sizeof(float) * (size_t)k);
    for (int64_t t = 0; t < T; t++) {
        ((int32_t *)ids->data)[t * nu] = t == 0 ? 0 : 1;
        ((int32_t *)ids->data)[t * nu + 1] = t == 0 ? 2 : 3;
    }
    memcpy(ids1->data, ids->data, sizeof(int32_t) * (size_t)nu);
    struct bt_tensor *outs[2] = {bt_mul_mat_id(ctx, as, b, ids), bt_mul_mat_id(ctx, as, b1, ids1)};
    ck_assert_ptr_nonnull(outs[0]);
    ck_assert_ptr_nonnull(outs[1]);
    struct bt_graph *g = tu_graph(ctx, outs, 2);
    memset(outs[0]->data, 0x5a, bt_nbytes(outs[0]));
    memset(outs[1]->data, 0xa5, bt_nbytes(outs[1]));
    ck_assert_int_eq(tu_run(g, 1), BT_OK);
    const float *got = outs[0]->data, *alone = outs[1]->data;
    for (int64_t i = 0; i < m * nu; i++)
        ck_assert_msg(memcmp(&got[i], &alone[i], sizeof(float)) == 0,
                      "bf16 mul_mat_id slot %ld row %ld: alone %.9g, beside a GEMM expert %.9g", (long)(i / m),
                      (long)(i % m), alone[i], got[i]);
    bt_free(ctx);
}
END_TEST

/* ---- the float order (backends/cpu/fdot.c), as a scalar model ------------- */

/* one rounding per step: the vector FMA, and fmaf in the plain C build */
#define MODEL_FMA(a, b, c) fmaf(a, b, c)
#define N_FO 2 /* BF16 weights have their own order (the pair order of vdpbf16ps) */
static const enum bt_type fo_types[N_FO] = {BT_TYPE_F32, BT_TYPE_F16};

/* w . x: chunks of BT_MM_FKC; in a chunk 16 lanes, lane e % 16 takes element
 * e by FMA; the chunk's sum by the tree (l, l+8), (l, l+4), (l, l+2), (0, 1);
 * the chunk sums added in order. */
static float model_dot(const float *w, const float *x, int64_t k) {
    float d = 0.0f;
    for (int64_t c0 = 0; c0 < k; c0 += BT_MM_FKC) {
        float p[16] = {0};
        for (int64_t e = c0; e < k && e < c0 + BT_MM_FKC; e++) p[e % 16] = MODEL_FMA(w[e], x[e], p[e % 16]);
        float u[8], v[4], t[2];
        for (int l = 0; l < 8; l++) u[l] = p[l] + p[l + 8];
        for (int l = 0; l < 4; l++) v[l] = u[l] + u[l + 4];
        for (int l = 0; l < 2; l++) t[l] = v[l] + v[l + 2];
        const float s = t[0] + t[1];
        d = c0 == 0 ? s : d + s;
    }
    return d;
}

/* every element of mul_mat(w, b) for n = 1 .. 131 columns (the direct tiles,
 * both blocked paths and their column remainders), several thread counts, k
 * below, at and past a chunk, with and without a 16-element tail; m past a
 * block of rows (and not a whole tile) where the columns are many */
START_TEST(test_float_order_mul_mat) {
    const enum bt_type wt = fo_types[_i];
    static const int64_t ks[] = {1, 15, 203, 2 * BT_MM_FKC, 2 * BT_MM_FKC + 203, 5 * BT_MM_FKC + 17};
    static const int64_t ns[] = {1, 2, 3, 4, 5, 7, 8, 13, 70, 131};
    int calls = 0;
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        const int64_t k = ks[ki];
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int64_t n = ns[ni], m = n >= 64 ? 150 : 37;
            bt_context *ctx = tu_ctx(64);
            tu_rng r;
            tu_rng_init(&r, 7100 + (uint64_t)(ki * 16 + ni));
            struct bt_tensor *w = bt_new_tensor_2d(ctx, wt, k, m);
            struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, k, n);
            tu_fill(w, &r);
            tu_fill(b, &r);
            struct bt_tensor *d = bt_mul_mat(ctx, w, b);
            ck_assert_ptr_nonnull(d);
            struct bt_graph *g = tu_graph(ctx, &d, 1);
            memset(d->data, 0x11 * (++calls % 15 + 1), bt_nbytes(d));
            const int nt = 1 + (int)((ki + ni) % 3);
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            float *wrow = malloc(sizeof(float) * (size_t)k);
            for (int64_t i = 0; i < m; i++) {
                bt_row_to_f32(wt, (const char *)w->data + (size_t)i * w->nb[1], wrow, k);
                for (int64_t j = 0; j < n; j++) {
                    const float want = model_dot(wrow, (const float *)b->data + j * k, k);
                    const float got = ((const float *)d->data)[j * m + i];
                    ck_assert_msg(memcmp(&want, &got, sizeof(float)) == 0,
                                  "%s k=%ld n=%ld (%d threads): element (%ld, %ld) %.9g, the "
                                  "order gives %.9g",
                                  bt_type_name(wt), (long)k, (long)n, nt, (long)i, (long)j, got, want);
                }
            }
            free(wrow);
            bt_free(ctx);
        }
    }
}
END_TEST

/* MUL_MAT_ID: every (slot, token) element against the model, tokens 1..200
 * over 5 experts (experts get 0 .. 100 columns: every path) */
START_TEST(test_float_order_mul_mat_id) {
    const enum bt_type wt = fo_types[_i];
    const int64_t m = 21, ne = 5, nu = 2;
    static const int64_t Ts[] = {1, 3, 17, 40, 200, 1, 2};
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
        /* the last tokens: k past several chunks (one column tiles several chunks at once) */
        const int64_t T = Ts[ti], k = ti < 5 ? BT_MM_FKC + 77 : 4 * BT_MM_FKC + 33;
        bt_context *ctx = tu_ctx(64);
        tu_rng r;
        tu_rng_init(&r, 7300 + (uint64_t)ti);
        struct bt_tensor *as = bt_new_tensor_3d(ctx, wt, k, m, ne);
        struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, nu, T);
        struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, nu, T);
        tu_fill(as, &r);
        tu_fill(b, &r);
        tu_fill_ids(ids, &r, (int32_t)ne);
        struct bt_tensor *d = bt_mul_mat_id(ctx, as, b, ids);
        ck_assert_ptr_nonnull(d);
        struct bt_graph *g = tu_graph(ctx, &d, 1);
        memset(d->data, 0x5a, bt_nbytes(d));
        ck_assert_int_eq(tu_run(g, 1 + (int)(ti % 3)), BT_OK);
        float *wrow = malloc(sizeof(float) * (size_t)k);
        for (int64_t t = 0; t < T; t++)
            for (int64_t s = 0; s < nu; s++) {
                const int32_t id = ((const int32_t *)ids->data)[t * nu + s];
                const float *x = (const float *)b->data + (t * nu + s) * k;
                for (int64_t i = 0; i < m; i++) {
                    bt_row_to_f32(wt, (const char *)as->data + (size_t)id * as->nb[2] + (size_t)i * as->nb[1],
                                  wrow, k);
                    const float want = model_dot(wrow, x, k);
                    const float got = ((const float *)d->data)[(t * nu + s) * m + i];
                    ck_assert_msg(memcmp(&want, &got, sizeof(float)) == 0,
                                  "%s T=%ld: token %ld slot %ld row %ld: %.9g, the order gives %.9g",
                                  bt_type_name(wt), (long)T, (long)t, (long)s, (long)i, got, want);
                }
            }
        free(wrow);
        bt_free(ctx);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("determinism");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_thread_count_invariance);
    tcase_add_test(tc, test_rebuild_same_result);
    suite_add_tcase(s, tc);
    TCase *tb = tcase_create("batch");
    tcase_set_timeout(tb, 120);
    tcase_add_loop_test(tb, test_batch_invariance_mul_mat, 0, N_BI);
    tcase_add_loop_test(tb, test_batch_invariance_mul_mat_id, 0, 2 * N_BI);
    tcase_add_test(tb, test_bf16_dot_after_gemm);
    suite_add_tcase(s, tb);
    TCase *tf = tcase_create("float_order");
    tcase_set_timeout(tf, 120);
    tcase_add_loop_test(tf, test_float_order_mul_mat, 0, N_FO);
    tcase_add_loop_test(tf, test_float_order_mul_mat_id, 0, N_FO);
    suite_add_tcase(s, tf);
    return tu_run_suite(s);
}
