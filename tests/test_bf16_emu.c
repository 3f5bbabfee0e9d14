/* test_bf16_emu.c - BF16 weights give the same bits on every CPU.
 *
 * matmul.c computes BF16 weights in the order and rounding of the
 * AVX512-BF16 dot instruction (vdpbf16ps), and emulates it where the build
 * lacks it.  This file holds an independent scalar model of that arithmetic
 * (model_dot) and checks, bit for bit:
 *  - the model against the instruction itself, lane by lane, on random and
 *    edge inputs (denormals, ties, NaN, infinities, sums that underflow),
 *    where this build has AVX512-BF16;
 *  - MUL_MAT and MUL_MAT_ID of the engine (any batch size, 1 and 3 threads)
 *    against the model, on data whose results change if a denormal is not
 *    read as zero or flushed;
 *  - the same products through matmul.c compiled without AVX512-BF16,
 *    without AVX-512 and without AVX (tests/bf16_emu.c; x86 native builds),
 *    with two threads' shares. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "testutil.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

/* ---- the model ------------------------------------------------------------- */

static uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}
static float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}
static bool g_ftz = true; /* off: the model without denormal handling (to show the data needs it) */
/* off: a result flushed when its value rounded to the denormal format is below FLT_MIN (the
 * rule this engine used before, which vdpbf16ps does not follow), to show the data tells them
 * apart */
static bool g_ftz_unbounded = true;
static float ftz(float v) { return g_ftz && fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }
/* a BF16 input of the dot: denormals read as zero */
static float in_bf16(bt_bf16_t h) { return ftz(bt_bf16_to_fp32(h)); }
/* an activation rounded to BF16: denormals to zero, then nearest even */
static bt_bf16_t act_bf16(float x) { return bt_fp32_to_bf16(ftz(x)); }
/* x rounded to 24 significant bits, nearest even, with an unbounded exponent */
static long double round24(long double x) {
    if (x == 0 || !isfinite(x)) return x;
    int e;
    const long double f = frexpl(x, &e); /* x = f 2^e, 0.5 <= |f| < 1 */
    return ldexpl(nearbyintl(ldexpl(f, 24)), e - 24);
}
/* c + a b (a, b products of BF16 values: at most 16 significant bits) rounded once as an F32
 * FMA with flush to zero: the exact sum in long double (exact here: the data's sums span fewer
 * bits than its significand), and a zero of the sum's sign where the sum rounded to 24 bits with
 * an unbounded exponent is below FLT_MIN (x86's MXCSR.FTZ and vdpbf16ps: tininess after
 * rounding) */
static float fma_ftz(float a, float b, float c) {
    const float r = fmaf(a, b, c);
    if (!g_ftz || !isfinite(r) || fabsf(r) > FLT_MIN) return r;
    if (!g_ftz_unbounded) return ftz(r);
    const long double x = (long double)c + (long double)a * (long double)b;
    return fabsl(round24(x)) < (long double)FLT_MIN ? copysignf(0.0f, r) : r;
}
/* one vdpbf16ps lane */
static float model_step(float acc, bt_bf16_t w0, bt_bf16_t w1, bt_bf16_t b0, bt_bf16_t b1) {
    acc = fma_ftz(in_bf16(w1), in_bf16(b1), ftz(acc));
    return fma_ftz(in_bf16(w0), in_bf16(b0), acc);
}
static float model_dot(const bt_bf16_t *w, const float *x, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i += 2) {
        const bool two = i + 1 < k;
        acc = model_step(acc, w[i], two ? w[i + 1] : 0, act_bf16(x[i]), two ? act_bf16(x[i + 1]) : 0);
    }
    return acc;
}

/* ---- test data -------------------------------------------------------------- */

/* a weight of row class c: 0 plain, 1 tiny (its products with tiny
 * activations fall below FLT_MIN), 2 denormal or zero (count only unless read
 * as zero, against huge activations), 3 a mix of all */
static bt_bf16_t rand_bf16(tu_rng *r, int c) {
    if (c == 3) c = (int)tu_rng_int(r, 3);
    switch (c) {
    case 1: return bt_fp32_to_bf16(tu_rng_f32(r, -1.0f, 1.0f) * 1e-19f);
    case 2: return (bt_bf16_t)(tu_rng_int(r, 128) | (tu_rng_int(r, 2) << 15));
    default: return bt_fp32_to_bf16(tu_rng_f32(r, -1.0f, 1.0f));
    }
}
/* an activation of column class c: 0 plain or a tie of the rounding to BF16,
 * 1 tiny, 2 huge, 3 denormal (rounded to zero; half of them so close to
 * FLT_MIN that rounding them as normal numbers would give FLT_MIN) */
static float rand_act(tu_rng *r, int c) {
    switch (c) {
    case 1: return tu_rng_f32(r, -1.0f, 1.0f) * 1e-19f;
    case 2: return tu_rng_f32(r, -1.0f, 1.0f) * 1e28f;
    case 3:
        return u2f((uint32_t)(tu_rng_int(r, 2) ? 0x7f8000 + tu_rng_int(r, 0x8000) : tu_rng_int(r, 0x800000)) |
                   ((uint32_t)tu_rng_int(r, 2) << 31));
    default:
        if (tu_rng_int(r, 4) == 0) return u2f((f2u(tu_rng_f32(r, -1.0f, 1.0f)) & 0xffff0000u) | 0x8000u);
        return tu_rng_f32(r, -1.0f, 1.0f);
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
START_TEST(test_model_is_the_instruction) {
    tu_rng r;
    tu_rng_init(&r, 1604);
    const bt_bf16_t special[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x8080, 0x7f80, 0xff80,
                                 0x7fc0, 0x7f81, 0x3f80, 0x0100, 0x7f7f, 0xff7f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    long n = 0;
    for (int it = 0; it < 400000; it++) {
        bt_bf16_t v[4];
        for (int i = 0; i < 4; i++)
            v[i] = tu_rng_int(&r, 4) == 0 ? special[tu_rng_int(&r, ns)] : rand_bf16(&r, 3);
        float acc;
        switch (it % 5) {
        case 0: acc = u2f((uint32_t)tu_rng_u64(&r)); break;                     /* any bits */
        case 1: acc = u2f(0x00800000u + (uint32_t)tu_rng_int(&r, 4096)); break; /* near FLT_MIN */
        case 2: acc = -in_bf16(v[1]) * in_bf16(v[3]) * (1.0f + 0x1p-20f); break;   /* cancels */
        case 3: acc = tu_rng_f32(&r, -2.0f, 2.0f); break;
        default: {
            /* sums within a few 2^-150 of FLT_MIN: acc a few ulps from it, products of 2^-150 to
             * 2^-153 times a BF16 mantissa (vdpbf16ps flushes 2^-126 - 2^-150, which the
             * denormal format would round up to FLT_MIN) */
            const uint32_t sign = (uint32_t)tu_rng_int(&r, 2) << 31;
            acc = u2f((0x00800000u + (uint32_t)tu_rng_int(&r, 3)) | sign);
            const int e = 75 + (int)tu_rng_int(&r, 3);
            const float m = tu_rng_int(&r, 2) ? 1.0f : 1.0f + (float)tu_rng_int(&r, 128) / 128.0f;
            v[1] = bt_fp32_to_bf16(copysignf(ldexpf(m, -e), tu_rng_int(&r, 2) ? 1.0f : -1.0f));
            v[3] = bt_fp32_to_bf16(ldexpf(1.0f, -75 - (int)tu_rng_int(&r, 2)));
            v[0] = tu_rng_int(&r, 2) ? v[1] : 0;
            v[2] = tu_rng_int(&r, 2) ? v[3] : 0;
            break;
        }
        }
        const __m512 ins = _mm512_dpbf16_ps(
            _mm512_set1_ps(acc), (__m512bh)_mm512_set1_epi32((int)(v[0] | ((uint32_t)v[1] << 16))),
            (__m512bh)_mm512_set1_epi32((int)(v[2] | ((uint32_t)v[3] << 16))));
        const float got = _mm512_cvtss_f32(ins), want = model_step(acc, v[0], v[1], v[2], v[3]);
        const bool same = f2u(got) == f2u(want) || (isnan(got) && isnan(want));
        ck_assert_msg(same, "vdpbf16ps(%a; w %04x %04x, b %04x %04x) = %a, model %a", acc, v[0], v[1],
                      v[2], v[3], got, want);
        n++;
        /* the rounding of activations */
        const float x = it % 3 == 0 ? u2f((uint32_t)tu_rng_u64(&r)) : rand_act(&r, it % 4);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_set1_ps(x));
        const bt_bf16_t hb = (bt_bf16_t)_mm256_extract_epi16(h, 0);
        ck_assert_msg(hb == act_bf16(x) || (isnan(x) && (hb & 0x7fc0) == 0x7fc0),
                      "vcvtneps2bf16(%a [%08x]) = %04x, model %04x", x, f2u(x), hb, act_bf16(x));
    }
    ck_assert_int_eq(n, 400000);
}
END_TEST
#endif

/* ---- products ------------------------------------------------------------------ */

struct prod {
    int64_t k, m, n;
    bt_bf16_t *w; /* [n_expert][m][k] */
    float *x;     /* [n][k] */
    int64_t n_expert, n_used;
    int32_t *ids; /* [n][n_used] (MUL_MAT_ID) */
};

static void prod_init(struct prod *p, int64_t k, int64_t m, int64_t n, int64_t n_expert,
                      int64_t n_used, uint64_t seed) {
    tu_rng r;
    tu_rng_init(&r, seed);
    p->k = k;
    p->m = m;
    p->n = n;
    p->n_expert = n_expert;
    p->n_used = n_used;
    p->w = malloc(sizeof(bt_bf16_t) * (size_t)(k * m * n_expert));
    p->x = malloc(sizeof(float) * (size_t)(k * n));
    p->ids = malloc(sizeof(int32_t) * (size_t)(n * (n_used > 0 ? n_used : 1)));
    /* class 4 of rows and columns: pairs (2q, 2q+1) of (-2^-75, 2^-63) and (2^-75, 2^-63), so
     * each pair's high half brings the sum to FLT_MIN and its low half takes 2^-150 off: a
     * flush where the sum rounded to 24 bits is below FLT_MIN, not where the denormal format
     * would round it below */
    for (int64_t i = 0; i < k * m * n_expert; i++)
        p->w[i] = (i / k) % 5 == 4 ? bt_fp32_to_bf16((i % k) % 2 ? 0x1p-63f : -0x1p-75f)
                                   : rand_bf16(&r, (int)((i / k) % 5));
    for (int64_t i = 0; i < k * n; i++)
        p->x[i] = (i / k + n) % 5 == 4 ? ((i % k) % 2 ? 0x1p-63f : 0x1p-75f) : rand_act(&r, (int)((i / k + n) % 5));
    for (int64_t t = 0; t < n; t++)
        for (int64_t s = 0; s < n_used; s++) /* distinct experts per token */
            p->ids[t * n_used + s] = (int32_t)((t * 3 + s * 5 + tu_rng_int(&r, 2)) % n_expert);
}

static void prod_free(struct prod *p) {
    free(p->w);
    free(p->x);
    free(p->ids);
}

/* the model's d[:, j] (MUL_MAT: slot s = 0 and expert 0) */
static float model_elem(const struct prod *p, int64_t e, int64_t i, int64_t j) {
    return model_dot(p->w + (e * p->m + i) * p->k, p->x + j * p->k, p->k);
}

/* the node d of p in ctx (MUL_MAT when n_used == 0) */
static struct bt_tensor *prod_node(bt_context *ctx, const struct prod *p) {
    struct bt_tensor *d;
    if (p->n_used == 0) {
        struct bt_tensor *w = bt_new_tensor_2d(ctx, BT_TYPE_BF16, p->k, p->m);
        struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, p->k, p->n);
        memcpy(w->data, p->w, bt_nbytes(w));
        memcpy(b->data, p->x, bt_nbytes(b));
        d = bt_mul_mat(ctx, w, b);
    } else {
        /* b broadcast over the slots: [k, 1, n] */
        struct bt_tensor *w = bt_new_tensor_3d(ctx, BT_TYPE_BF16, p->k, p->m, p->n_expert);
        struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, p->k, 1, p->n);
        struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, p->n_used, p->n);
        memcpy(w->data, p->w, bt_nbytes(w));
        memcpy(b->data, p->x, bt_nbytes(b));
        memcpy(ids->data, p->ids, bt_nbytes(ids));
        d = bt_mul_mat_id(ctx, w, b, ids);
    }
    ck_assert_ptr_nonnull(d);
    return d;
}

/* d (filled by some kernel) against the model, bitwise */
static void prod_check(const struct prod *p, const struct bt_tensor *d, const char *who) {
    const int64_t ns = p->n_used ? p->n_used : 1;
    for (int64_t t = 0; t < p->n; t++)
        for (int64_t s = 0; s < ns; s++) {
            const int64_t e = p->n_used ? p->ids[t * p->n_used + s] : 0;
            const char *base = d->data;
            const float *col = (const float *)(p->n_used ? base + (size_t)s * d->nb[1] + (size_t)t * d->nb[2]
                                                         : base + (size_t)t * d->nb[1]);
            for (int64_t i = 0; i < p->m; i++) {
                const float want = model_elem(p, e, i, t);
                ck_assert_msg(f2u(col[i]) == f2u(want),
                              "%s: k=%ld m=%ld n=%ld n_used=%ld: d[%ld] of token %ld slot %ld = %a, model %a",
                              who, (long)p->k, (long)p->m, (long)p->n, (long)p->n_used, (long)i,
                              (long)t, (long)s, col[i], want);
            }
        }
}

/* the shapes: k odd and below one k block, k across the F32 GEMM's k blocks
 * (256) and not a multiple of 16, k odd across the BF16 GEMM's (1024); m not a
 * multiple of any tile; n on both sides of the GEMM threshold (8) */
static const int64_t shape_k[] = {203, 600, 1101};
static const int64_t shape_n[] = {1, 3, 7, 8, 13, 40};
#define N_K ((int)(sizeof shape_k / sizeof shape_k[0]))
#define N_SHAPES (N_K * (int)(sizeof shape_n / sizeof shape_n[0]))

static void shape_of(int i, bool id, struct prod *p) {
    const int64_t k = shape_k[i % N_K], n = shape_n[i / N_K];
    prod_init(p, k, 45, n, id ? 6 : 1, id ? 2 : 0, 90 + (uint64_t)i + (id ? 1000 : 0));
}

START_TEST(test_data_needs_denormal_handling) {
    /* without denormals read as zero and flushed, the model's results on
     * this data differ: so the checks below can see a path that skips it */
    struct prod p;
    shape_of(_i, false, &p);
    int64_t differ = 0, edge = 0;
    for (int64_t j = 0; j < p.n; j++)
        for (int64_t i = 0; i < p.m; i++) {
            const float a = model_elem(&p, 0, i, j);
            g_ftz = false;
            const float b = model_elem(&p, 0, i, j);
            g_ftz = true;
            g_ftz_unbounded = false;
            const float c = model_elem(&p, 0, i, j);
            g_ftz_unbounded = true;
            differ += f2u(a) != f2u(b);
            edge += f2u(a) != f2u(c);
        }
    ck_assert_msg(differ > 0, "k=%ld n=%ld: no element depends on denormal handling", (long)p.k,
                  (long)p.n);
    /* every fifth column is of class 4 */
    ck_assert_msg(p.n < 5 || edge > 0, "k=%ld n=%ld: no element depends on when a sum is flushed", (long)p.k,
                  (long)p.n);
    prod_free(&p);
}
END_TEST

START_TEST(test_engine_is_the_model) {
    for (int id = 0; id < 2; id++) {
        struct prod p;
        shape_of(_i, id, &p);
        for (int nt = 1; nt <= 3; nt += 2) {
            bt_context *ctx = tu_ctx(16);
            struct bt_tensor *d = prod_node(ctx, &p);
            struct bt_graph *g = tu_graph(ctx, &d, 1);
            memset(d->data, 0x11 * nt, bt_nbytes(d));
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            prod_check(&p, d, nt == 1 ? "engine, 1 thread" : "engine, 3 threads");
            bt_free(ctx);
        }
        prod_free(&p);
    }
}
END_TEST

#if defined(BATON_BF16_EMU)
/* the copies of matmul.c (tests/bf16_emu.c) */
#define DECL_COPY(P)                                                                \
    void P##_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *dst);         \
    void P##_mul_mat_id(const struct bt_cpu_params *p, struct bt_tensor *dst);      \
    size_t P##_mul_mat_work_size(const struct bt_tensor *node, int nth);
DECL_COPY(bt_emu_nobf16)
DECL_COPY(bt_emu_avx2)
DECL_COPY(bt_emu_c)

struct copy {
    const char *name;
    void (*mul_mat)(const struct bt_cpu_params *, struct bt_tensor *);
    void (*mul_mat_id)(const struct bt_cpu_params *, struct bt_tensor *);
    size_t (*work_size)(const struct bt_tensor *, int);
};
static const struct copy copies[3] = {
    {"matmul.c without AVX512-BF16", bt_emu_nobf16_mul_mat, bt_emu_nobf16_mul_mat_id,
     bt_emu_nobf16_mul_mat_work_size},
    {"matmul.c without AVX-512", bt_emu_avx2_mul_mat, bt_emu_avx2_mul_mat_id,
     bt_emu_avx2_mul_mat_work_size},
    {"matmul.c without AVX", bt_emu_c_mul_mat, bt_emu_c_mul_mat_id, bt_emu_c_mul_mat_work_size},
};

START_TEST(test_copies_are_the_model) {
    for (int c = 0; c < 3; c++)
        for (int id = 0; id < 2; id++) {
            struct prod p;
            shape_of(_i, id, &p);
            bt_context *ctx = tu_ctx(16);
            struct bt_tensor *d = prod_node(ctx, &p);
            const int nth = 2;
            const size_t ws = (copies[c].work_size(d, nth) + 63) / 64 * 64;
            void *wdata = aligned_alloc(64, ws);
            ck_assert_ptr_nonnull(wdata);
            memset(d->data, 0x23 + c, bt_nbytes(d));
            volatile int status = BT_OK;
            char err[BT_CPU_ERRBUF] = "";
            for (int ith = 0; ith < nth; ith++) { /* two threads' shares, one after the other */
                const struct bt_cpu_params prm = {ith, nth, wdata, ws, false, NULL, &status, err, NULL, -1, NULL};
                (id ? copies[c].mul_mat_id : copies[c].mul_mat)(&prm, d);
            }
            ck_assert_msg(status == BT_OK, "%s: %s", copies[c].name, err);
            prod_check(&p, d, copies[c].name);
            free(wdata);
            bt_free(ctx);
            prod_free(&p);
        }
}
END_TEST
#endif

static Suite *suite(void) {
    Suite *s = suite_create("bf16_emu");
    TCase *tc = tcase_create("bf16");
    tcase_set_timeout(tc, 300);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    tcase_add_test(tc, test_model_is_the_instruction);
#endif
    tcase_add_loop_test(tc, test_data_needs_denormal_handling, 0, N_SHAPES);
    tcase_add_loop_test(tc, test_engine_is_the_model, 0, N_SHAPES);
#if defined(BATON_BF16_EMU)
    tcase_add_loop_test(tc, test_copies_are_the_model, 0, N_SHAPES);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
