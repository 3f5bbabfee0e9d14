/* test_quants.c - the block types of quants.h: traits and sizes, quantiser
 * output identical to ggml's reference quantisers (hashes of ggml's bytes for
 * one fixed input), error bounds on a weight-like tensor, Q8_K's sums, element
 * access and shape errors for 256-element blocks.  Dequantisation against the
 * gguf Python package: tests/quants_gguf.py (ctest quants_gguf). */
#include <math.h>
#include <string.h>

#include "baton/cpu.h"
#include "cpu_variant.h"
#include "qtypes.h"
#include "quant_dot.h"
#include "quants.h"
#include "testutil.h"

static const enum bt_type all_blocks[] = {BT_TYPE_Q8_0, BT_TYPE_Q4_0, BT_TYPE_Q4_1,  BT_TYPE_Q5_0,  BT_TYPE_Q5_1,
                                          BT_TYPE_Q2_K, BT_TYPE_Q3_K, BT_TYPE_Q4_K,  BT_TYPE_Q5_K,  BT_TYPE_Q6_K,
                                          BT_TYPE_Q8_K, BT_TYPE_MXFP4, BT_TYPE_IQ4_NL, BT_TYPE_IQ4_XS};
#define N_BLOCKS ((int)(sizeof all_blocks / sizeof all_blocks[0]))

START_TEST(test_traits) {
    static const struct { enum bt_type t; const char *name; int64_t blck; size_t size; } want[] = {
        {BT_TYPE_Q4_1, "q4_1", 32, 20},   {BT_TYPE_Q5_0, "q5_0", 32, 22},   {BT_TYPE_Q5_1, "q5_1", 32, 24},
        {BT_TYPE_Q2_K, "q2_K", 256, 84},  {BT_TYPE_Q3_K, "q3_K", 256, 110}, {BT_TYPE_Q4_K, "q4_K", 256, 144},
        {BT_TYPE_Q5_K, "q5_K", 256, 176}, {BT_TYPE_Q6_K, "q6_K", 256, 210}, {BT_TYPE_Q8_K, "q8_K", 256, 292},
        {BT_TYPE_MXFP4, "mxfp4", 32, 17}, {BT_TYPE_IQ4_NL, "iq4_nl", 32, 18}, {BT_TYPE_IQ4_XS, "iq4_xs", 256, 136},
        {BT_TYPE_IQ2_XXS, "iq2_xxs", 256, 66}, {BT_TYPE_IQ2_XS, "iq2_xs", 256, 74}, {BT_TYPE_IQ2_S, "iq2_s", 256, 82},
        {BT_TYPE_IQ3_XXS, "iq3_xxs", 256, 98}, {BT_TYPE_IQ3_S, "iq3_s", 256, 110}, {BT_TYPE_IQ1_S, "iq1_s", 256, 50},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ck_assert_str_eq(bt_type_name(want[i].t), want[i].name);
        ck_assert_int_eq(bt_blck_size(want[i].t), want[i].blck);
        ck_assert_uint_eq(bt_type_size(want[i].t), want[i].size);
        ck_assert(bt_type_traits(want[i].t)->is_quantized);
        ck_assert_uint_eq(bt_row_size(want[i].t, 1024), 1024 / want[i].blck * want[i].size);
        /* the lattice types (from IQ2_XXS on) are read, never written */
        ck_assert_int_eq(bt_type_can_quantize(want[i].t), want[i].t < BT_TYPE_IQ2_XXS);
    }
}
END_TEST

/* Exact arithmetic only (an integer hash, one IEEE division each), so the
 * input has the same bits on every machine. */
static void golden_input(float *x, int n) {
    unsigned int h = 12345;
    for (int i = 0; i < n; i++) {
        h = h * 1103515245u + 12345u;
        const int v = (int)((h >> 8) % 2001) - 1000;
        x[i] = (float)v / (float)(100 + 37 * (i % 23)) - (i / 256 == 2 ? 0.5f : 0.0f);
    }
}
static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* FNV-1a of the bytes ggml's ggml_quantize_chunk (quantize_row_q8_K_ref for
 * Q8_K) writes for golden_input(1024), llama.cpp as vendored in
 * llama-cpp-python 0.3.36 (ggml 0.25.3); IQ4_NL and IQ4_XS without an
 * importance matrix. */
START_TEST(test_same_bytes_as_ggml) {
    static const struct { enum bt_type t; uint64_t h; } want[] = {
        {BT_TYPE_Q4_0, 0xb9648b89ae059b74ull}, {BT_TYPE_Q4_1, 0xc70ad4bc210d1261ull},
        {BT_TYPE_Q5_0, 0xd18c38b74cec3feeull}, {BT_TYPE_Q5_1, 0x568d0f2f70e6de1bull},
        {BT_TYPE_Q8_0, 0x2511b4bdaecfb508ull}, {BT_TYPE_Q2_K, 0x142709d65a8bb409ull},
        {BT_TYPE_Q3_K, 0x140a12337a8d6c2full}, {BT_TYPE_Q4_K, 0x5411fe489a0351c1ull},
        {BT_TYPE_Q5_K, 0x97177655592fb210ull}, {BT_TYPE_Q6_K, 0xbd6e1f20dd4726c6ull},
        {BT_TYPE_Q8_K, 0x3a9335d0a7d48398ull}, {BT_TYPE_IQ4_NL, 0x9a5b14b5d9227c73ull},
        {BT_TYPE_IQ4_XS, 0x4f4ef4accc8bbf94ull}, {BT_TYPE_MXFP4, 0x12d0bf547f1069bfull},
    };
    float x[1024];
    golden_input(x, 1024);
    uint8_t q[1024 / 32 * 292 / 8 + 2048];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const size_t nb = bt_row_size(want[i].t, 1024);
        ck_assert_uint_le(nb, sizeof q);
        bt_row_from_f32(want[i].t, x, q, 1024);
        ck_assert_msg(fnv1a(q, nb) == want[i].h, "%s: bytes differ from ggml's (hash %016llx)",
                      bt_type_name(want[i].t), (unsigned long long)fnv1a(q, nb));
    }
}
END_TEST

/* A weight-like tensor (normal-ish, rows of different scales, rare
 * outliers): each type's NMSE stays under a bound a little above what ggml's
 * quantiser gets on it (tests/bench_quants_ggml.c; the bytes are identical). */
START_TEST(test_error_bounds) {
    static const struct { enum bt_type t; double max_nmse; } want[] = {
        {BT_TYPE_Q8_0, 5e-5}, {BT_TYPE_Q4_0, 1.2e-2}, {BT_TYPE_Q4_1, 8e-3}, {BT_TYPE_Q5_0, 3e-3},
        {BT_TYPE_Q5_1, 2e-3}, {BT_TYPE_Q2_K, 1.1e-1}, {BT_TYPE_Q3_K, 3e-2}, {BT_TYPE_Q4_K, 7e-3},
        {BT_TYPE_Q5_K, 1.8e-3}, {BT_TYPE_Q6_K, 5e-4}, {BT_TYPE_Q8_K, 2e-4}, {BT_TYPE_MXFP4, 1.6e-2},
        {BT_TYPE_IQ4_NL, 7e-3}, {BT_TYPE_IQ4_XS, 7e-3},
    };
    enum { ROWS = 64, COLS = 2048 };
    tu_rng r;
    tu_rng_init(&r, 1313);
    float *x = malloc(sizeof(float) * ROWS * COLS), *y = malloc(sizeof(float) * ROWS * COLS);
    uint8_t *q = malloc(bt_row_size(BT_TYPE_Q8_K, COLS) * ROWS);
    for (int i = 0; i < ROWS * COLS; i++) {
        /* sum of 4 uniforms: close to normal */
        float v = 0;
        for (int k = 0; k < 4; k++) v += tu_rng_f32(&r, -1.0f, 1.0f);
        v *= 0.02f * (0.5f + (float)(i / COLS) / ROWS);
        if (i % 997 == 0) v *= 8.0f;
        x[i] = v;
    }
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        bt_row_from_f32(want[i].t, x, q, (int64_t)ROWS * COLS);
        bt_row_to_f32(want[i].t, q, y, (int64_t)ROWS * COLS);
        const double e = tu_nmse(y, x, (int64_t)ROWS * COLS);
        ck_assert_msg(e <= want[i].max_nmse, "%s: NMSE %.3e > %.1e", bt_type_name(want[i].t), e,
                      want[i].max_nmse);
    }
    free(x);
    free(y);
    free(q);
}
END_TEST

/* All-zero and constant blocks quantise to exact zeros / near constants, with
 * no NaN from a zero scale. */
START_TEST(test_degenerate_blocks) {
    float x[256], y[256];
    uint8_t q[512];
    for (int i = 0; i < N_BLOCKS; i++) {
        const enum bt_type t = all_blocks[i];
        const int64_t n = bt_blck_size(t) == 256 ? 256 : 256;
        memset(x, 0, sizeof x);
        bt_row_from_f32(t, x, q, n);
        bt_row_to_f32(t, q, y, n);
        for (int j = 0; j < n; j++) ck_assert_msg(y[j] == 0.0f, "%s: zero -> %g", bt_type_name(t), y[j]);
        for (int j = 0; j < n; j++) x[j] = 0.75f;
        bt_row_from_f32(t, x, q, n);
        bt_row_to_f32(t, q, y, n);
        for (int j = 0; j < n; j++)
            ck_assert_msg(fabsf(y[j] - 0.75f) < 0.05f, "%s: 0.75 -> %g", bt_type_name(t), y[j]);
    }
}
END_TEST

START_TEST(test_q8_K_sums) {
    float x[512];
    tu_rng r;
    tu_rng_init(&r, 77);
    for (int i = 0; i < 512; i++) x[i] = tu_rng_f32(&r, -3.0f, 2.0f);
    bt_block_q8_K b[2];
    bt_row_from_f32(BT_TYPE_Q8_K, x, b, 512);
    for (int k = 0; k < 2; k++) {
        int amax = 0;
        for (int j = 0; j < 256; j++) amax = abs(b[k].qs[j]) > amax ? abs(b[k].qs[j]) : amax;
        ck_assert_int_eq(amax, 127); /* the element of largest magnitude maps to +-127 */
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += b[k].qs[16 * g + j];
            ck_assert_int_eq(b[k].bsums[g], s);
        }
        for (int j = 0; j < 256; j++) ck_assert(fabsf(b[k].d * b[k].qs[j] - x[256 * k + j]) <= fabsf(b[k].d) * 0.5001f);
    }
}
END_TEST

/* Element access into a K-quant tensor reads and rewrites whole 256-element
 * blocks at the right byte offsets. */
START_TEST(test_k_tensor_access) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *t = bt_new_tensor_2d(ctx, BT_TYPE_Q6_K, 512, 3);
    TU_OK(ctx, t);
    ck_assert_uint_eq(t->nb[0], 210);
    ck_assert_uint_eq(t->nb[1], 420);
    float v[512 * 3], row[512];
    for (int i = 0; i < 512 * 3; i++) v[i] = (float)((i * 7) % 13) - 6.0f;
    tu_write_f32(t, v);
    for (int64_t i1 = 0; i1 < 3; i1++) {
        bt_row_to_f32(BT_TYPE_Q6_K, (const char *)t->data + i1 * t->nb[1], row, 512);
        for (int64_t i0 = 0; i0 < 512; i0++) ck_assert(bt_get_f32_nd(t, i0, i1, 0, 0) == row[i0]);
    }
    bt_set_f32_nd(t, 300, 2, 0, 0, 5.5f);
    ck_assert(fabsf(bt_get_f32_nd(t, 300, 2, 0, 0) - 5.5f) < 0.1f);
    bt_free(ctx);
}
END_TEST

START_TEST(test_k_shape_errors) {
    bt_context *ctx = tu_ctx(1);
    ck_assert_ptr_null(bt_new_tensor_1d(ctx, BT_TYPE_Q4_K, 128));
    ck_assert_str_eq(bt_context_error(ctx), "new tensor: ne[0] = 128 is not a multiple of q4_K's block size 256");
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, 96, 8);
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_Q4_K, 256, 3);
    TU_OK(ctx, a);
    TU_OK(ctx, b);
    ck_assert_ptr_null(bt_cpy(ctx, a, b));
    ck_assert_msg(strstr(bt_context_error(ctx), "whole 256-element blocks") != NULL, "%s", bt_context_error(ctx));
    bt_free(ctx);
}
END_TEST

/* a row of weights of type t: w quantised, or for the lattice types (no
 * quantiser) random blocks */
static void weights_row(enum bt_type t, const float *w, void *q, int64_t k, tu_rng *r) {
    if (bt_type_can_quantize(t)) {
        bt_row_from_f32(t, w, q, k);
        return;
    }
    uint64_t s = (uint64_t)tu_rng_int(r, 1 << 30) * 2654435761u + 7;
    bt_row_random_blocks(t, q, k, 0.02f, &s);
}

/* Each weight type's dot product: the fast and plain versions bitwise equal,
 * and both the dot of the dequantised weights with the dequantised
 * activations up to float rounding. */
START_TEST(test_vec_dots) {
    static const enum bt_type types[] = {BT_TYPE_Q2_K, BT_TYPE_Q3_K, BT_TYPE_Q4_K, BT_TYPE_Q5_K, BT_TYPE_Q6_K};
    enum { K = 4096 };
    static float w[K], x[K], wd[K], xd[K];
    static uint8_t wq[K / 32 * 34 + 4096], xq[K / 256 * 292 + 4096];
    tu_rng r;
    tu_rng_init(&r, 4242);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const struct bt_quant_dot *qd = bt_quant_dot_of(types[t]);
        ck_assert_msg(qd != NULL, "%s has no dot product", bt_type_name(types[t]));
        for (int trial = 0; trial < 20; trial++) {
            const int64_t k = trial % 4 == 0 ? 256 : K;
            const float off = trial % 3 == 1 ? 0.5f : 0.0f; /* rows not centred on 0 */
            for (int64_t i = 0; i < k; i++) {
                w[i] = tu_rng_f32(&r, -1.0f, 1.0f) * (1.0f + (float)(i % 300) / 50.0f) + off;
                x[i] = tu_rng_f32(&r, -2.0f, 2.0f) * (trial % 5 == 2 && i % 64 == 7 ? 30.0f : 1.0f);
            }
            bt_row_from_f32(types[t], w, wq, k);
            qd->quantize_act(x, xq, k);
            bt_row_to_f32(types[t], wq, wd, k);
            bt_row_to_f32(qd->act_type, xq, xd, k);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < k; i++) {
                ref += (double)wd[i] * xd[i];
                mag += fabs((double)wd[i] * xd[i]);
            }
            float fast = NAN, plain = NAN;
            qd->vec_dot(k, &fast, wq, xq);
            qd->vec_dot_ref(k, &plain, wq, xq);
            ck_assert_msg(memcmp(&fast, &plain, sizeof fast) == 0, "%s trial %d: fast %.9g, plain %.9g",
                          bt_type_name(types[t]), trial, fast, plain);
            ck_assert_msg(fabs(plain - ref) <= 1e-5 * mag, "%s trial %d: %.9g, dequantised dot %.9g",
                          bt_type_name(types[t]), trial, plain, ref);
        }
    }
}
END_TEST

/* IQ4_XS and the lattice types against Q8_K columns (quant_iq.c): the dot is
 * the dot of the dequantised weights with the dequantised activations up to
 * float rounding, on rows of several blocks, activations with outliers, and
 * every type's scales and signs exercised by random blocks. */
START_TEST(test_iq_dots) {
    static const enum bt_type types[] = {BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS, BT_TYPE_IQ2_S,
                                         BT_TYPE_IQ3_XXS, BT_TYPE_IQ3_S, BT_TYPE_IQ1_S};
    enum { K = 2048 };
    static float w[K], x[K], wd[K], xd[K];
    static uint8_t wq[K / 256 * 136], xq[K / 256 * 292];
    tu_rng r;
    tu_rng_init(&r, 5151);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(types[t]);
        ck_assert_ptr_nonnull(qt);
        for (int trial = 0; trial < 16; trial++) {
            /* one block; 7 (a decode row's 4 blocks at once, then 3 one by one); 8 */
            const int64_t k = trial % 4 == 0 ? 256 : trial % 4 == 1 ? 7 * 256 : K;
            for (int64_t i = 0; i < k; i++) {
                w[i] = tu_rng_f32(&r, -1.0f, 1.0f) * (1.0f + (float)(i % 300) / 50.0f);
                x[i] = tu_rng_f32(&r, -2.0f, 2.0f) * (trial % 5 == 2 && i % 64 == 7 ? 30.0f : 1.0f);
            }
            weights_row(types[t], w, wq, k, &r);
            bt_row_to_f32(types[t], wq, wd, k);
            bt_q8_K_from_f32(x, xq, k);
            bt_q8_K_to_f32(xq, xd, k);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < k; i++) {
                ref += (double)wd[i] * xd[i];
                mag += fabs((double)wd[i] * xd[i]);
            }
            ck_assert(mag > 0);
            float fast = NAN, plain = NAN;
            qt->vec_dot(k, &fast, wq, xq);
            qt->vec_dot_ref(k, &plain, wq, xq);
            ck_assert_msg(memcmp(&fast, &plain, sizeof fast) == 0, "%s trial %d: fast %.9g, plain %.9g",
                          bt_type_name(types[t]), trial, fast, plain);
            ck_assert_msg(fabs(plain - ref) <= 1e-5 * mag, "%s trial %d: %.9g, dequantised dot %.9g",
                          bt_type_name(types[t]), trial, plain, ref);
        }
    }
}
END_TEST

/* Every entry of qtypes.h's table: the fast activation quantiser and dot
 * give the bytes and bits of their plain C versions (odd block counts, an
 * outlier, zero blocks, k of one block), and the dot is the dot of the
 * dequantised operands up to float rounding. */
START_TEST(test_table_refs) {
    enum { K = 4096 };
    static float w[K], x[K], wd[K];
    static uint8_t wq[K / 32 * 34 + 4096], xq[2][K / 32 * 40 + K / 256 * 292 + 64];
    tu_rng r;
    tu_rng_init(&r, 4243);
    int n = 0;
    for (int t = 0; t < BT_TYPE_COUNT; t++) {
        const struct bt_cpu_qtype *qt = bt_cpu_qtype_of((enum bt_type)t);
        if (!qt) continue;
        n++;
        ck_assert_msg(qt->quantize_act_ref && qt->vec_dot_ref, "%s: no plain C versions", bt_type_name((enum bt_type)t));
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        /* a build with AVX2 (or AVX-512) runs SIMD kernels, which the
         * comparisons below check against the plain C ones */
        ck_assert_msg(qt->vec_dot != qt->vec_dot_ref && qt->tiles[0].fn, "%s: this build has no SIMD dot or tiles",
                      bt_type_name((enum bt_type)t));
#endif
        const int64_t blk = bt_blck_size((enum bt_type)t);
        for (int trial = 0; trial < 12; trial++) {
            const int64_t k = trial % 4 == 0 ? (blk == 32 ? 32 * 7 : 256 * 3) : trial % 4 == 1 ? blk : K;
            for (int64_t i = 0; i < k; i++) {
                w[i] = tu_rng_f32(&r, -1.0f, 1.0f) * (1.0f + (float)(i % 300) / 50.0f) + (trial % 3 == 1 ? 0.5f : 0.0f);
                x[i] = tu_rng_f32(&r, -2.0f, 2.0f) * (trial % 5 == 2 && i % 64 == 7 ? 30.0f : 1.0f);
                if (trial % 6 == 3 && i < 64) x[i] = 0.0f; /* zero blocks */
            }
            weights_row((enum bt_type)t, w, wq, k, &r);
            bt_row_to_f32((enum bt_type)t, wq, wd, k);
            memset(xq, 0x5a, sizeof xq[0]);
            memset(xq[1], 0xa5, sizeof xq[1]);
            qt->quantize_act(x, xq[0], k);
            qt->quantize_act_ref(x, xq[1], k);
            ck_assert_msg(memcmp(xq[0], xq[1], qt->act_size(k)) == 0, "%s trial %d: quantize_act differs from its plain C version",
                          bt_type_name((enum bt_type)t), trial);
            float fast = NAN, plain = NAN;
            qt->vec_dot(k, &fast, wq, xq[0]);
            qt->vec_dot_ref(k, &plain, wq, xq[0]);
            ck_assert_msg(memcmp(&fast, &plain, sizeof fast) == 0, "%s trial %d k %ld: fast %.9g, plain %.9g",
                          bt_type_name((enum bt_type)t), trial, (long)k, fast, plain);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < k; i++) {
                ref += (double)wd[i] * x[i];
                mag += fabs((double)wd[i] * x[i]);
            }
            /* against the f32 activations: the activations' int8 rounding */
            ck_assert_msg(fabs(plain - ref) <= 2e-2 * mag, "%s trial %d: %.9g, dot of the dequantised weights %.9g",
                          bt_type_name((enum bt_type)t), trial, plain, ref);
        }
    }
    ck_assert_int_eq(n, 19);
}
END_TEST

/* Every tile of qtypes.h's entries gives, element by
 * element, the bits of the entry's vec_dot (rows and columns of different
 * content, the same row twice as matmul.c may pass it). */
START_TEST(test_tiles_equal_vec_dot) {
    static const enum bt_type types[] = {BT_TYPE_Q8_0, BT_TYPE_Q4_0, BT_TYPE_Q4_1, BT_TYPE_Q5_0,  BT_TYPE_Q5_1,
                                         BT_TYPE_Q2_K, BT_TYPE_Q3_K, BT_TYPE_Q4_K, BT_TYPE_Q5_K,  BT_TYPE_Q6_K,
                                         BT_TYPE_IQ4_NL, BT_TYPE_MXFP4, BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS,
                                         BT_TYPE_IQ2_S, BT_TYPE_IQ3_XXS, BT_TYPE_IQ3_S, BT_TYPE_IQ1_S};
    enum { K = 1024, R = 16 };
    static float x[K];
    static uint8_t w[R][K / 32 * 34], act[R][K / 256 * 292 + K / 32 * 40 + 64];
    tu_rng r;
    tu_rng_init(&r, 99);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(types[t]);
        ck_assert_msg(qt != NULL, "%s is not in qtypes.h's table", bt_type_name(types[t]));
        ck_assert_uint_le(qt->act_size(K), sizeof act[0]);
        /* for the 32-element types also an odd block count that ends in a
         * part of a 16-block chunk */
        for (int64_t k = K; k >= 800; k -= 160) {
            if (k != K && bt_blck_size(types[t]) != 32) break;
            for (int i = 0; i < R; i++) {
                for (int j = 0; j < k; j++) x[j] = tu_rng_f32(&r, -1.0f, 1.0f) + (i % 3 == 1 ? 0.3f : 0.0f);
                weights_row(types[t], x, w[i], k, &r);
                for (int j = 0; j < k; j++) x[j] = tu_rng_f32(&r, -3.0f, 3.0f);
                qt->quantize_act(x, act[i], k);
            }
            for (int ti = 0; ti < BT_CPU_QTILES && qt->tiles[ti].fn; ti++) {
                const int rm = qt->tiles[ti].rm, rn = qt->tiles[ti].rn;
                const void *rows[BT_CPU_TILE_MAX], *cols[BT_CPU_TILE_MAX];
                /* distinct rows, and the last one repeated as matmul.c passes it */
                for (int i = 0; i < rm; i++) rows[i] = w[i == rm - 1 && rm > 1 ? 0 : (i * 5 + 1) % R];
                for (int c = 0; c < rn; c++) cols[c] = act[(c * 5 + 2) % R];
                float out[BT_CPU_TILE_MAX * BT_CPU_TILE_MAX];
                qt->tiles[ti].fn(k, rows, cols, NULL, out);
                for (int c = 0; c < rn; c++)
                    for (int i = 0; i < rm; i++) {
                        float one;
                        qt->vec_dot(k, &one, rows[i], cols[c]);
                        ck_assert_msg(memcmp(&one, &out[c * rm + i], sizeof one) == 0,
                                      "%s k %ld tile %dx%d element (%d,%d): %.9g, vec_dot %.9g", bt_type_name(types[t]),
                                      (long)k, rm, rn, i, c, out[c * rm + i], one);
                    }
            }
        }
    }
}
END_TEST

/* The packed GEMM of qtypes.h's entries (Q8_0, Q4_0, the K-quants, IQ4_XS,
 * the lattice IQ types; none for the other 32-element types, whose prompts
 * take the repacked kernels) gives,
 * element by element, the bits of vec_dot: every column count up to 19 (each
 * tile width and remainder), panels of 16 rows and of fewer (the last row
 * repeated). */
START_TEST(test_gemm_equal_vec_dot) {
    static const enum bt_type types[] = {BT_TYPE_Q8_0,   BT_TYPE_Q4_0,    BT_TYPE_Q2_K,    BT_TYPE_Q3_K,
                                         BT_TYPE_Q4_K,   BT_TYPE_Q5_K,    BT_TYPE_Q6_K,    BT_TYPE_IQ4_XS,
                                         BT_TYPE_IQ4_NL, BT_TYPE_MXFP4,   BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS,
                                         BT_TYPE_IQ2_S,  BT_TYPE_IQ3_XXS, BT_TYPE_IQ3_S,   BT_TYPE_IQ1_S,
                                         BT_TYPE_Q5_0};
    enum { K = 768, R = 16, C = 19 };
    static float x[K], d[C][R];
    static uint8_t w[R][K / 32 * 34], act[C][K / 256 * 292 + K / 32 * 40 + 64];
    static _Alignas(64) uint8_t panel[K / 256 * 10240];
    tu_rng r;
    tu_rng_init(&r, 77);
    int with_gemm = 0;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(types[t]);
        ck_assert_ptr_nonnull(qt);
        if (!qt->gemm) continue; /* a build without AVX-512 VNNI */
        with_gemm++;
        /* the 32-element types: an odd block count (23) */
        const int64_t k = bt_blck_size(types[t]) == 32 ? K - 32 : K;
        ck_assert_uint_le(qt->panel_size(k), sizeof panel);
        ck_assert_int_ge(qt->gemm_min_cols, 1);
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < k; j++) x[j] = tu_rng_f32(&r, -1.0f, 1.0f) * (1.0f + (float)(j % 97) / 20.0f) + (i % 3 == 1 ? 0.4f : 0.0f);
            weights_row(types[t], x, w[i], k, &r);
        }
        for (int c = 0; c < C; c++) {
            for (int j = 0; j < k; j++) x[j] = tu_rng_f32(&r, -3.0f, 3.0f) * (c % 4 == 2 && j % 50 == 3 ? 20.0f : 1.0f);
            qt->quantize_act(x, act[c], k);
        }
        for (int nrows = 16; nrows >= 5; nrows -= 3) { /* 16, 13, 10, 7: both halves of 8, partly */
            const void *rows[BT_CPU_PANEL_ROWS], *cols[C];
            for (int i = 0; i < BT_CPU_PANEL_ROWS; i++) rows[i] = w[i < nrows ? i : nrows - 1];
            qt->pack(k, rows, panel);
            for (int64_t ncols = 1; ncols <= C; ncols++) {
                float *dcols[C];
                for (int c = 0; c < ncols; c++) {
                    cols[c] = act[(c * 7 + ncols) % C];
                    dcols[c] = d[c];
                    for (int i = 0; i < R; i++) d[c][i] = -12345.0f;
                }
                qt->gemm(k, panel, cols, ncols, dcols, 0, nrows);
                for (int c = 0; c < ncols; c++)
                    for (int i = 0; i < R; i++) {
                        if (i >= nrows) {
                            ck_assert_msg(d[c][i] == -12345.0f, "%s: gemm wrote row %d of %d", bt_type_name(types[t]), i, nrows);
                            continue;
                        }
                        float one;
                        qt->vec_dot(k, &one, rows[i], cols[c]);
                        ck_assert_msg(memcmp(&one, &d[c][i], sizeof one) == 0,
                                      "%s gemm %d rows x %ld columns, element (%d,%d): %.9g, vec_dot %.9g",
                                      bt_type_name(types[t]), nrows, (long)ncols, i, c, d[c][i], one);
                    }
            }
        }
    }
    /* the AVX2 variants (and AVX-512 without VNNI, which runs them) have the K-quants' and the IQ types' GEMM
     * (Q2_K .. Q6_K, IQ4_XS, the lattice types); AVX-512 VNNI Q8_0's and Q4_0's too */
    const char *variant = bt_cpu_variant_name();
    if (!strcmp(variant, "avx2") || !strcmp(variant, "avx2vnni") || !strcmp(variant, "avx512f"))
        ck_assert_int_eq(with_gemm, 12);
    if (!strcmp(variant, "avx512") || !strcmp(variant, "avx512bf16")) ck_assert_int_eq(with_gemm, 14);
}
END_TEST

/* Every variant of the CPU kernels this CPU runs (cpu_variant.h: plain C,
 * AVX2, AVX-512 in a build of several; the one a build of one holds) gives,
 * for every entry of qtypes.h's table, the bytes of the plain C activation
 * quantiser and, element by element, the bits of the plain C dot in its
 * vec_dot, each tile and the packed GEMM: the bits ranks on different CPUs
 * must agree on. */
START_TEST(test_variants_same_bits) {
    enum { K = 544, R = 16, C = 11 };
    static float x[K], ref[C][R], d[C][R];
    static uint8_t w[R][K / 32 * 34 + 64], act[C][K / 32 * 40 + K / 256 * 292 + 64], act_v[K / 32 * 40 + K / 256 * 292 + 64];
    static _Alignas(64) uint8_t panel[K / 32 * 1280];
    tu_rng r;
    tu_rng_init(&r, 2828);
    const struct bt_cpu_kernels *plain = bt_cpu_variant_at(0);
    int checked = 0;
    for (int t = 0; t < BT_TYPE_COUNT; t++) {
        const struct bt_cpu_qtype *q0 = plain->qtype_of((enum bt_type)t);
        if (!q0) continue;
        const int64_t k = bt_blck_size((enum bt_type)t) == 32 ? K : K / 256 * 256; /* 17 blocks, or 2 */
        ck_assert_uint_le(q0->act_size(k), sizeof act[0]);
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < k; j++) x[j] = tu_rng_f32(&r, -1.0f, 1.0f) * (1.0f + (float)(j % 91) / 25.0f) + (i % 3 == 1 ? 0.4f : 0.0f);
            if (bt_type_can_quantize((enum bt_type)t)) {
                bt_row_from_f32((enum bt_type)t, x, w[i], k);
            } else { /* the lattice types: random blocks */
                uint64_t st = 77 + (uint64_t)(t * R + i);
                bt_row_random_blocks((enum bt_type)t, w[i], k, 0.02f, &st);
            }
            /* MXFP4: every fourth row's scales 2^-128 .. 2^-125 (E8M0 0 .. 3: the
             * scale formula's special case e < 2 and its neighbours) */
            if (t == BT_TYPE_MXFP4 && i % 4 == 3)
                for (int64_t b = 0; b < k / 32; b++) w[i][(size_t)b * sizeof(bt_block_mxfp4)] = (uint8_t)(b % 4);
        }
        for (int c = 0; c < C; c++) {
            for (int j = 0; j < k; j++) x[j] = tu_rng_f32(&r, -3.0f, 3.0f) * (c % 4 == 2 && j % 50 == 3 ? 25.0f : 1.0f);
            q0->quantize_act_ref(x, act[c], k);
            for (int i = 0; i < R; i++) q0->vec_dot_ref(k, &ref[c][i], w[i], act[c]);
        }
        for (int v = 0; v < bt_cpu_n_variants(); v++) {
            if (!bt_cpu_variant_runs(v)) continue;
            const struct bt_cpu_kernels *kv = bt_cpu_variant_at(v);
            const struct bt_cpu_qtype *qt = kv->qtype_of((enum bt_type)t);
            const char *tn = bt_type_name((enum bt_type)t), *vn = kv->name;
            ck_assert_msg(qt != NULL, "%s: variant %s has no entry", tn, vn);
            checked++;
            /* the activations: the same bytes (the last column's x is still in x) */
            memset(act_v, 0x5a, sizeof act_v);
            qt->quantize_act(x, act_v, k);
            ck_assert_msg(memcmp(act_v, act[C - 1], qt->act_size(k)) == 0, "%s, variant %s: quantize_act's bytes differ", tn, vn);
            for (int c = 0; c < C; c++)
                for (int i = 0; i < R; i++) {
                    float one;
                    qt->vec_dot(k, &one, w[i], act[c]);
                    ck_assert_msg(memcmp(&one, &ref[c][i], sizeof one) == 0, "%s, variant %s: vec_dot (%d,%d) %.9g, plain C %.9g",
                                  tn, vn, i, c, one, ref[c][i]);
                }
            for (int ti = 0; ti < BT_CPU_QTILES && qt->tiles[ti].fn; ti++) {
                const int rm = qt->tiles[ti].rm, rn = qt->tiles[ti].rn;
                const void *rows[BT_CPU_TILE_MAX], *cols[BT_CPU_TILE_MAX];
                int ri[BT_CPU_TILE_MAX], ci[BT_CPU_TILE_MAX];
                for (int i = 0; i < rm; i++) rows[i] = w[ri[i] = (i * 7 + 3) % R];
                for (int c = 0; c < rn; c++) cols[c] = act[ci[c] = (c * 3 + 1) % C];
                float out[BT_CPU_TILE_MAX * BT_CPU_TILE_MAX];
                qt->tiles[ti].fn(k, rows, cols, NULL, out);
                for (int c = 0; c < rn; c++)
                    for (int i = 0; i < rm; i++)
                        ck_assert_msg(memcmp(&out[c * rm + i], &ref[ci[c]][ri[i]], sizeof(float)) == 0,
                                      "%s, variant %s: tile %dx%d (%d,%d) %.9g, plain C %.9g", tn, vn, rm, rn, i, c,
                                      out[c * rm + i], ref[ci[c]][ri[i]]);
            }
            if (qt->gemm) {
                ck_assert_uint_le(qt->panel_size(k), sizeof panel);
                const void *rows[BT_CPU_PANEL_ROWS], *cols[C];
                float *dcols[C];
                for (int i = 0; i < BT_CPU_PANEL_ROWS; i++) rows[i] = w[i];
                for (int c = 0; c < C; c++) {
                    cols[c] = act[c];
                    dcols[c] = d[c];
                }
                qt->pack(k, rows, panel);
                qt->gemm(k, panel, cols, C, dcols, 0, R);
                ck_assert_msg(memcmp(d, ref, sizeof d) == 0, "%s, variant %s: the packed GEMM differs from plain C", tn, vn);
            }
        }
    }
    ck_assert_int_ge(checked, 10);
}
END_TEST

int main(void) {
    Suite *s = suite_create("quants");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_traits);
    tcase_add_test(tc, test_variants_same_bits);
    tcase_add_test(tc, test_same_bytes_as_ggml);
    tcase_add_test(tc, test_error_bounds);
    tcase_add_test(tc, test_degenerate_blocks);
    tcase_add_test(tc, test_q8_K_sums);
    tcase_add_test(tc, test_k_tensor_access);
    tcase_add_test(tc, test_k_shape_errors);
    tcase_add_test(tc, test_vec_dots);
    tcase_add_test(tc, test_iq_dots);
    tcase_add_test(tc, test_table_refs);
    tcase_add_test(tc, test_tiles_equal_vec_dot);
    tcase_add_test(tc, test_gemm_equal_vec_dot);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
