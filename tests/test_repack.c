/* test_repack.c - the CPU's repacked weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL, MXFP4, Q4_K, Q6_K; BF16 on AVX2 builds without AVX-512; cpu.h,
 * backends/cpu/repack.c): a repacked
 * matrix gives bitwise what the plain one gives, on every path (decode
 * tiles, the prompt GEMM, MUL_MAT_ID with several experts, 1 and 2 threads,
 * the reference kernels; GET_ROWS), its bytes unpack to the plain ones, only
 * tensors with a layout and whole groups of 16 rows are repacked, the
 * repack buffer type repacks what is set in it, and nothing but the matmul
 * may read one. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "baton/backend.h"
#include "quants.h"
#include "testutil.h"

static const enum bt_type rp_types[10] = {BT_TYPE_Q8_0, BT_TYPE_Q4_0, BT_TYPE_Q4_K,  BT_TYPE_Q6_K,
                                         BT_TYPE_MXFP4, BT_TYPE_Q5_0, BT_TYPE_Q4_1, BT_TYPE_Q5_1,
                                         BT_TYPE_IQ4_NL, BT_TYPE_BF16};
#define N_RP 10

/* the types scramble changes (the second round of test_mul_mat_bitwise) */
static bool is_scrambled(enum bt_type t) { return t != BT_TYPE_Q8_0 && t != BT_TYPE_Q4_0; }

/* Q4_K: every block's 12 scale bytes and 128 quant bytes random (d and dmin
 * kept), so that every bit of the packed 6-bit scales and mins is exercised;
 * Q6_K: every ql, qh and scale byte random (d kept: every 6-bit value, every
 * scale from -128 to 127); MXFP4: every nibble random, but an eighth of
 * the blocks all 12 (the largest value, against test_mul_mat_bitwise's
 * block of 127s: the int16 sums' bound), a fourth of the blocks' E8M0
 * scales 0 .. 3 (the denormal scales), the rest 100 .. 139; Q5_0, Q4_1,
 * Q5_1, IQ4_NL: every nibble and fifth bit random, but an eighth of the
 * blocks all 31, 15 or -127 (the int16 sums' bound again); BF16: an eighth
 * of the elements denormal (which the pair order reads as zero) */
static void scramble(struct bt_tensor *w, tu_rng *r) {
    if (w->type == BT_TYPE_BF16) {
        const size_t n = bt_nelements(w);
        for (size_t i = 0; i < n; i++)
            if (tu_rng_int(r, 8) == 0)
                ((bt_bf16_t *)w->data)[i] = (bt_bf16_t)(tu_rng_int(r, 2) << 15 | (1 + tu_rng_int(r, 127)));
    } else if (w->type == BT_TYPE_Q4_K) {
        const size_t n = bt_nbytes(w) / sizeof(bt_block_q4_K);
        for (size_t i = 0; i < n; i++) {
            bt_block_q4_K *b = (bt_block_q4_K *)w->data + i;
            for (size_t j = 0; j < sizeof b->scales; j++) b->scales[j] = (uint8_t)tu_rng_int(r, 256);
            for (size_t j = 0; j < sizeof b->qs; j++) b->qs[j] = (uint8_t)tu_rng_int(r, 256);
        }
    } else if (w->type == BT_TYPE_Q6_K) {
        const size_t n = bt_nbytes(w) / sizeof(bt_block_q6_K);
        for (size_t i = 0; i < n; i++) {
            bt_block_q6_K *b = (bt_block_q6_K *)w->data + i;
            for (size_t j = 0; j < sizeof b->ql; j++) b->ql[j] = (uint8_t)tu_rng_int(r, 256);
            for (size_t j = 0; j < sizeof b->qh; j++) b->qh[j] = (uint8_t)tu_rng_int(r, 256);
            for (size_t j = 0; j < sizeof b->scales; j++) b->scales[j] = (int8_t)(tu_rng_int(r, 256) - 128);
        }
    } else if (w->type == BT_TYPE_MXFP4) {
        const size_t n = bt_nbytes(w) / sizeof(bt_block_mxfp4);
        for (size_t i = 0; i < n; i++) {
            bt_block_mxfp4 *b = (bt_block_mxfp4 *)w->data + i;
            b->e = (uint8_t)(i % 4 == 0 ? tu_rng_int(r, 4) : 100 + tu_rng_int(r, 40));
            for (size_t j = 0; j < sizeof b->qs; j++) b->qs[j] = i % 8 == 1 ? 0x77 : (uint8_t)tu_rng_int(r, 256);
        }
    } else if (w->type == BT_TYPE_Q5_0 || w->type == BT_TYPE_Q4_1 || w->type == BT_TYPE_Q5_1 ||
               w->type == BT_TYPE_IQ4_NL) {
        /* the quants after the fp16 scale (Q5_0, IQ4_NL) or scale and min (Q4_1, Q5_1); Q5_0's and Q5_1's fifth
         * bits first; IQ4_NL's extreme blocks all -127 */
        const size_t bs = bt_row_size(w->type, 32), n = bt_nbytes(w) / bs;
        const size_t q0 = w->type == BT_TYPE_Q4_1 || w->type == BT_TYPE_Q5_1 ? 4 : 2;
        const uint8_t top = w->type == BT_TYPE_IQ4_NL ? 0x00 : 0xff;
        for (size_t i = 0; i < n; i++)
            for (size_t j = q0; j < bs; j++)
                ((uint8_t *)w->data)[i * bs + j] = i % 8 == 1 ? top : (uint8_t)tu_rng_int(r, 256);
    }
}

/* k of nb blocks of type t (BF16: of its repacked layout's 16 elements) */
static int64_t kb(enum bt_type t, int64_t nb) { return nb * (t == BT_TYPE_BF16 ? 16 : bt_blck_size(t)); }

/* a repacked copy of w (same shape, in ctx) */
static struct bt_tensor *repacked_copy(bt_context *ctx, const struct bt_tensor *w) {
    struct bt_tensor *r = bt_new_tensor(ctx, w->type, 4, w->ne);
    TU_OK(ctx, r);
    ck_assert(bt_cpu_weight_repackable(r));
    bt_cpu_weight_repack(r, w->data);
    ck_assert(bt_cpu_weight_is_repacked(r));
    return r;
}

/* outs[0] (plain weights) and outs[1] (repacked) computed together with 1
 * and 2 threads: bitwise equal (what: the case, for the message) */
static void expect_same(bt_context *ctx, struct bt_tensor *outs[2], const char *what) {
    TU_OK(ctx, outs[0]);
    TU_OK(ctx, outs[1]);
    struct bt_graph *g = tu_graph(ctx, outs, 2);
    for (int nt = 1; nt <= 2; nt++) {
        memset(outs[1]->data, 0x7f, bt_nbytes(outs[1]));
        ck_assert_int_eq(tu_run(g, nt), BT_OK);
        ck_assert_msg(memcmp(outs[0]->data, outs[1]->data, bt_nbytes(outs[0])) == 0,
                      "%s, threads %d: repacked differs from plain", what, nt);
    }
}

/* MUL_MAT: k (blocks even, odd, the model's 2048) x m rows x n columns, the
 * plain and the repacked weights in one graph, 1 and 2 threads */
static const int64_t mm_kb[] = {2, 3, 0}; /* 0: k = 2048 */
static const int64_t mm_m[] = {16, 48, 160};
static const int64_t mm_n[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 129}; /* 129: Q6_K's rpack */

START_TEST(test_mul_mat_bitwise) {
    const enum bt_type type = rp_types[_i % N_RP];
    const int64_t k = mm_kb[(_i / N_RP) % 3] ? kb(type, mm_kb[(_i / N_RP) % 3]) : 2048, m = mm_m[(_i / (3 * N_RP)) % 3];
    if (_i / (9 * N_RP) && !is_scrambled(type)) return; /* the second round: the scrambled types' */
    bt_context *ctx = tu_ctx(64);
    tu_rng r;
    tu_rng_init(&r, 900 + (uint64_t)_i);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, type, k, m);
    TU_OK(ctx, w);
    tu_fill(w, &r);
    if (_i / (9 * N_RP)) scramble(w, &r);
    if (!bt_cpu_weight_repackable(w)) { /* a build without the kernels: nothing is repacked */
        ck_assert(!bt_cpu_weight_repack_available(type));
        bt_free(ctx);
        return;
    }
    struct bt_tensor *wr = repacked_copy(ctx, w);
    /* the bytes moved (a repack that copied would pass every comparison) */
    ck_assert(memcmp(w->data, wr->data, bt_nbytes(w)) != 0);
    void *back = malloc(bt_nbytes(w));
    bt_cpu_weight_unpack(wr, back);
    ck_assert_mem_eq(back, w->data, bt_nbytes(w));
    free(back);
    for (size_t ni = 0; ni < sizeof mm_n / sizeof mm_n[0]; ni++) {
        const int64_t n = mm_n[ni];
        struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, k, n);
        TU_OK(ctx, x);
        tu_fill(x, &r);
        if (_i / (9 * N_RP) && k >= 64) /* block 1 of every column all 127 */
            for (int64_t c = 0; c < n; c++)
                for (int64_t i = 32; i < 64; i++) ((float *)x->data)[c * k + i] = 1.0f;
        struct bt_tensor *outs[2] = {bt_mul_mat(ctx, w, x), bt_mul_mat(ctx, wr, x)};
        char what[96];
        snprintf(what, sizeof what, "%s k %lld m %lld n %lld", bt_type_name(type), (long long)k, (long long)m,
                 (long long)n);
        expect_same(ctx, outs, what);
    }
    bt_free(ctx);
}
END_TEST

/* MUL_MAT_ID: 6 experts of 48 rows, 1, 3 and 17 tokens choosing 2 each,
 * activations broadcast to the slots (gate, up) or one per slot (down) */
START_TEST(test_mul_mat_id_bitwise) {
    const enum bt_type type = rp_types[_i % N_RP];
    const int64_t k = _i / N_RP ? kb(type, 3) : 2048, m = 48, E = 6, U = 2;
    const int64_t toks[3] = {1, 3, 17};
    bt_context *ctx = tu_ctx(64);
    tu_rng r;
    tu_rng_init(&r, 1700 + (uint64_t)_i);
    struct bt_tensor *as = bt_new_tensor_3d(ctx, type, k, m, E);
    TU_OK(ctx, as);
    tu_fill(as, &r);
    scramble(as, &r);
    if (!bt_cpu_weight_repackable(as)) {
        bt_free(ctx);
        return;
    }
    struct bt_tensor *ar = repacked_copy(ctx, as);
    for (int ti = 0; ti < 3; ti++)
        for (int64_t nb = 1; nb <= U; nb += U - 1) {
            const int64_t T = toks[ti];
            struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, nb, T);
            struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, U, T);
            TU_OK(ctx, b);
            TU_OK(ctx, ids);
            tu_fill(b, &r);
            for (int64_t t = 0; t < T; t++) { /* two distinct experts per token */
                const int32_t e0 = (int32_t)tu_rng_int(&r, E);
                ((int32_t *)ids->data)[t * U] = e0;
                ((int32_t *)ids->data)[t * U + 1] = (int32_t)((e0 + 1 + tu_rng_int(&r, E - 1)) % E);
            }
            struct bt_tensor *outs[2] = {bt_mul_mat_id(ctx, as, b, ids), bt_mul_mat_id(ctx, ar, b, ids)};
            char what[96];
            snprintf(what, sizeof what, "%s k %lld tokens %lld n_b %lld", bt_type_name(type), (long long)k,
                     (long long)T, (long long)nb);
            expect_same(ctx, outs, what);
        }
    bt_free(ctx);
}
END_TEST

/* the reference kernels (bt_cpu_set_reference) read a repacked row as the
 * plain one */
START_TEST(test_reference_path) {
    const enum bt_type type = rp_types[_i];
    const int64_t K = kb(type, 3);
    bt_context *ctx = tu_ctx(16);
    tu_rng r;
    tu_rng_init(&r, 31 + (uint64_t)_i);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, type, K, 32);
    struct bt_tensor *as = bt_new_tensor_3d(ctx, type, K, 32, 3);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, K, 5);
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, 2, 5);
    TU_OK(ctx, w);
    TU_OK(ctx, as);
    TU_OK(ctx, x);
    TU_OK(ctx, ids);
    tu_fill(w, &r);
    tu_fill(as, &r);
    tu_fill(x, &r);
    tu_fill_ids(ids, &r, 3);
    if (!bt_cpu_weight_repackable(w)) {
        bt_free(ctx);
        return;
    }
    struct bt_tensor *xb = bt_reshape_3d(ctx, x, K, 1, 5);
    struct bt_tensor *outs[4] = {bt_mul_mat(ctx, w, x), bt_mul_mat(ctx, repacked_copy(ctx, w), x),
                                 bt_mul_mat_id(ctx, as, xb, ids), bt_mul_mat_id(ctx, repacked_copy(ctx, as), xb, ids)};
    for (int i = 0; i < 4; i++) TU_OK(ctx, outs[i]);
    struct bt_graph *g = tu_graph(ctx, outs, 4);
    bt_cpu *cpu = bt_cpu_new(2);
    ck_assert_ptr_nonnull(cpu);
    bt_cpu_set_reference(cpu, true);
    ck_assert_int_eq(bt_cpu_graph_compute(cpu, g), BT_OK);
    bt_cpu_free(cpu);
    ck_assert_mem_eq(outs[0]->data, outs[1]->data, bt_nbytes(outs[0]));
    ck_assert_mem_eq(outs[2]->data, outs[3]->data, bt_nbytes(outs[2]));
    bt_free(ctx);
}
END_TEST

/* which tensors can be repacked: the 32-element types, Q4_K and Q6_K (where the build
 * has the kernels; not Q5_K), whole groups of 16 rows, whole tensors */
/* the repack buffer type (the CPU backend's weight buffer type): a weight
 * set there whole, or by whole experts as a rank that holds some sets them,
 * holds the bytes bt_cpu_weight_repack writes and is flagged; a tensor
 * without a layout keeps the bytes it was given */
START_TEST(test_repack_buffer_type) {
    const enum bt_type type = rp_types[_i];
    bt_backend_t cpu = bt_backend_cpu_init(1);
    ck_assert_ptr_nonnull(cpu);
    ck_assert_ptr_eq(bt_backend_get_weight_buffer_type(cpu), bt_cpu_repack_buffer_type());
    bt_backend_free(cpu);
    ck_assert(bt_buft_is_host(bt_cpu_repack_buffer_type()));
    ck_assert_str_eq(bt_buft_name(bt_cpu_repack_buffer_type()), "CPU_REPACK");

    bt_context *ctx = tu_ctx(16);
    tu_rng r;
    tu_rng_init(&r, 2100 + (uint64_t)_i);
    const int64_t k = kb(type, 3), m = 32, E = 4;
    struct bt_tensor *plain = bt_new_tensor_3d(ctx, type, k, m, E);
    TU_OK(ctx, plain);
    tu_fill(plain, &r);
    scramble(plain, &r);
    bt_context *wctx = bt_init((struct bt_init_params){8 * bt_tensor_overhead(), NULL, true});
    ck_assert_ptr_nonnull(wctx);
    struct bt_tensor *whole = bt_new_tensor_3d(wctx, type, k, m, E);
    struct bt_tensor *held = bt_new_tensor_3d(wctx, type, k, m, E);
    struct bt_tensor *f = bt_new_tensor_2d(wctx, BT_TYPE_F32, 64, 16);
    bt_buffer_t buf = bt_alloc_ctx_tensors_from_buft(wctx, bt_cpu_repack_buffer_type());
    ck_assert_ptr_nonnull(buf);
    const size_t n = bt_nbytes(plain), nb2 = plain->nb[2];
    bt_tensor_set(whole, plain->data, 0, n);
    if (!bt_cpu_weight_repackable(whole)) { /* a build without the layout: plain */
        ck_assert(!(whole->flags & BT_TENSOR_FLAG_REPACKED));
        ck_assert(memcmp(whole->data, plain->data, n) == 0);
    } else {
        const struct bt_tensor *ref = repacked_copy(ctx, plain);
        ck_assert(whole->flags & BT_TENSOR_FLAG_REPACKED);
        ck_assert(memcmp(whole->data, ref->data, n) == 0);
        ck_assert(memcmp(whole->data, plain->data, n) != 0);
        bt_tensor_set(held, (const uint8_t *)plain->data + nb2, nb2, 2 * nb2); /* experts [1, 3) */
        ck_assert(held->flags & BT_TENSOR_FLAG_REPACKED);
        ck_assert(memcmp((const uint8_t *)held->data + nb2, (const uint8_t *)ref->data + nb2, 2 * nb2) == 0);
    }
    float v[64 * 16];
    for (int i = 0; i < 64 * 16; i++) v[i] = tu_rng_f32(&r, -1.0f, 1.0f);
    bt_tensor_set(f, v, 0, sizeof v);
    ck_assert(!(f->flags & BT_TENSOR_FLAG_REPACKED));
    ck_assert(memcmp(f->data, v, sizeof v) == 0);
    bt_buffer_free(buf);
    bt_free(wctx);
    bt_free(ctx);
}
END_TEST

START_TEST(test_repackable) {
    bt_context *ctx = tu_ctx(4);
    const bool have = bt_cpu_weight_repack_available(BT_TYPE_Q8_0);
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_Q4_0));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_Q4_K));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_Q6_K));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_MXFP4));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_Q5_0));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_Q4_1));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_Q5_1));
    ck_assert(have == bt_cpu_weight_repack_available(BT_TYPE_IQ4_NL));
    ck_assert(!bt_cpu_weight_repack_available(BT_TYPE_Q5_K));
    struct bt_tensor *q8 = bt_new_tensor_2d(ctx, BT_TYPE_Q8_0, 64, 32);
    struct bt_tensor *q4 = bt_new_tensor_3d(ctx, BT_TYPE_Q4_0, 64, 16, 3);
    struct bt_tensor *odd = bt_new_tensor_2d(ctx, BT_TYPE_Q8_0, 64, 24);
    struct bt_tensor *k4 = bt_new_tensor_2d(ctx, BT_TYPE_Q4_K, 256, 32);
    struct bt_tensor *k6 = bt_new_tensor_2d(ctx, BT_TYPE_Q6_K, 256, 32);
    struct bt_tensor *k5 = bt_new_tensor_2d(ctx, BT_TYPE_Q5_K, 256, 32);
    struct bt_tensor *f = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 32);
    struct bt_tensor *h = bt_new_tensor_2d(ctx, BT_TYPE_F16, 64, 32);
    struct bt_tensor *bf = bt_new_tensor_2d(ctx, BT_TYPE_BF16, 64, 32);
    struct bt_tensor *bf_k = bt_new_tensor_2d(ctx, BT_TYPE_BF16, 72, 32); /* rows not whole blocks of 16 */
    struct bt_tensor *v = bt_view_2d(ctx, q8, 64, 16, q8->nb[1], 0);
    ck_assert(bt_cpu_weight_repackable(q8) == have);
    ck_assert(bt_cpu_weight_repackable(q4) == have);
    ck_assert(!bt_cpu_weight_repackable(odd));
    ck_assert(bt_cpu_weight_repackable(k4) == have);
    ck_assert(bt_cpu_weight_repackable(k6) == have);
    ck_assert(!bt_cpu_weight_repackable(k5));
    ck_assert(!bt_cpu_weight_repackable(f));
    ck_assert(!bt_cpu_weight_repackable(h));
    ck_assert(bt_cpu_weight_repackable(bf) == bt_cpu_weight_repack_available(BT_TYPE_BF16));
    ck_assert(!bt_cpu_weight_repackable(bf_k));
    ck_assert(!bt_cpu_weight_repackable(v));
    ck_assert(!bt_cpu_weight_is_repacked(q8));
    bt_free(ctx);
}
END_TEST

/* Only the matmul (weights) and GET_ROWS (table) read a repacked tensor,
 * whole: a view of it is a broken invariant (abort), as is bt_tensor_get. */
static struct bt_tensor *abort_setup(bt_context **pctx) {
    bt_context *ctx = *pctx = tu_ctx(4);
    tu_rng r;
    tu_rng_init(&r, 5);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, BT_TYPE_Q8_0, 64, 32);
    tu_fill(w, &r);
    if (!bt_cpu_weight_repackable(w)) raise(SIGABRT); /* nothing to test: let the test pass */
    return repacked_copy(ctx, w);
}

/* GET_ROWS reads a repacked table (a tied output's token_embd) as the plain
 * one: rows of several groups, repeated, 1 and 2 threads */
START_TEST(test_get_rows) {
    const enum bt_type type = rp_types[_i];
    bt_context *ctx = tu_ctx(16);
    tu_rng r;
    tu_rng_init(&r, 77 + (uint64_t)_i);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, type, kb(type, 3), 64);
    struct bt_tensor *ids = bt_new_tensor_1d(ctx, BT_TYPE_I32, 9);
    TU_OK(ctx, w);
    TU_OK(ctx, ids);
    tu_fill(w, &r);
    if (!bt_cpu_weight_repackable(w)) {
        bt_free(ctx);
        return;
    }
    const int32_t rows[9] = {0, 15, 16, 17, 63, 31, 17, 48, 1};
    memcpy(ids->data, rows, sizeof rows);
    struct bt_tensor *outs[2] = {bt_get_rows(ctx, w, ids), bt_get_rows(ctx, repacked_copy(ctx, w), ids)};
    expect_same(ctx, outs, bt_type_name(type));
    bt_free(ctx);
}
END_TEST

/* a view of a repacked tensor would address plain rows: any op reading one aborts */
START_TEST(test_view_aborts) {
    bt_context *ctx;
    struct bt_tensor *wr = abort_setup(&ctx);
    struct bt_tensor *v = bt_view_2d(ctx, wr, 64, 16, wr->nb[1], 16 * wr->nb[1]);
    struct bt_tensor *rows = bt_new_tensor_1d(ctx, BT_TYPE_I32, 2);
    memset(rows->data, 0, bt_nbytes(rows));
    struct bt_tensor *out = bt_get_rows(ctx, v, rows);
    TU_OK(ctx, out);
    tu_run(tu_graph(ctx, &out, 1), 1);
}
END_TEST

START_TEST(test_tensor_get_aborts) {
    bt_context *ctx;
    struct bt_tensor *wr = abort_setup(&ctx);
    char buf[64];
    bt_tensor_get(wr, buf, 0, sizeof buf);
}
END_TEST

int main(void) {
    Suite *s = suite_create("repack");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_mul_mat_bitwise, 0, 9 * N_RP + 9 * N_RP); /* then again, the scrambled types */
    tcase_add_loop_test(tc, test_mul_mat_id_bitwise, 0, 2 * N_RP);
    tcase_add_loop_test(tc, test_reference_path, 0, N_RP);
    tcase_add_test(tc, test_repackable);
    tcase_add_loop_test(tc, test_repack_buffer_type, 0, N_RP);
    tcase_add_loop_test(tc, test_get_rows, 0, N_RP);
    tcase_add_test_raise_signal(tc, test_view_aborts, SIGABRT);
    tcase_add_test_raise_signal(tc, test_tensor_get_aborts, SIGABRT);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
