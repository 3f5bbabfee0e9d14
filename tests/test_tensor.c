/* test_tensor.c - element types (traits, fp16/bf16 conversion, Q8_0/Q4_0
 * quantisation and their GGUF byte layout), contexts (arena, no_alloc,
 * exhaustion) and tensor geometry (nbytes, contiguity of views/permutes). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "testutil.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Independent IEEE half decoder (exact). */
static float ref_half_to_float(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f) return m ? NAN : (s ? -INFINITY : INFINITY);
    if (e == 0)
        v = ldexp((double)m, -24);
    else
        v = ldexp((double)(m | 0x400), e - 25);
    return (float)(s ? -v : v);
}

/* ---- type traits ---- */

START_TEST(test_type_traits) {
    ck_assert_int_eq(bt_blck_size(BT_TYPE_F32), 1);
    ck_assert_int_eq(bt_type_size(BT_TYPE_F32), 4);
    ck_assert_int_eq(bt_blck_size(BT_TYPE_F16), 1);
    ck_assert_int_eq(bt_type_size(BT_TYPE_F16), 2);
    ck_assert_int_eq(bt_blck_size(BT_TYPE_BF16), 1);
    ck_assert_int_eq(bt_type_size(BT_TYPE_BF16), 2);
    ck_assert_int_eq(bt_blck_size(BT_TYPE_I32), 1);
    ck_assert_int_eq(bt_type_size(BT_TYPE_I32), 4);
    ck_assert_int_eq(bt_blck_size(BT_TYPE_Q8_0), 32);
    ck_assert_int_eq(bt_type_size(BT_TYPE_Q8_0), 34);
    ck_assert_int_eq(bt_blck_size(BT_TYPE_Q4_0), 32);
    ck_assert_int_eq(bt_type_size(BT_TYPE_Q4_0), 18);

    ck_assert_uint_eq(bt_row_size(BT_TYPE_F32, 17), 68);
    ck_assert_uint_eq(bt_row_size(BT_TYPE_F16, 17), 34);
    ck_assert_uint_eq(bt_row_size(BT_TYPE_Q8_0, 96), 3 * 34);
    ck_assert_uint_eq(bt_row_size(BT_TYPE_Q4_0, 64), 2 * 18);

    for (int t = 0; t < BT_TYPE_COUNT; t++) {
        const struct bt_type_traits *tr = bt_type_traits((enum bt_type)t);
        ck_assert_ptr_nonnull(tr);
        ck_assert_ptr_nonnull(tr->name);
        ck_assert_str_eq(tr->name, bt_type_name((enum bt_type)t));
        ck_assert_int_eq(tr->blck_size, bt_blck_size((enum bt_type)t));
        ck_assert_uint_eq(tr->type_size, bt_type_size((enum bt_type)t));
        ck_assert_int_eq(tr->is_quantized, tr->blck_size > 1); /* the block types */
        ck_assert_int_eq(tr->is_quantized, t > BT_TYPE_I32);
        for (int u = 0; u < t; u++) ck_assert_str_ne(tr->name, bt_type_name((enum bt_type)u));
    }
    /* status and op names exist */
    ck_assert_str_ne(bt_status_str(BT_OK), "");
    ck_assert_str_ne(bt_status_str(BT_ERR_CAPACITY), bt_status_str(BT_ERR_NOMEM));
    for (int o = 0; o < BT_OP_COUNT; o++) ck_assert_ptr_nonnull(bt_op_name((enum bt_op)o));
    ck_assert(bt_op_is_view(BT_OP_VIEW) && bt_op_is_view(BT_OP_PERMUTE) &&
              bt_op_is_view(BT_OP_RESHAPE) && bt_op_is_view(BT_OP_TRANSPOSE));
    ck_assert(!bt_op_is_view(BT_OP_ADD) && !bt_op_is_view(BT_OP_MUL_MAT) &&
              !bt_op_is_view(BT_OP_CONT));
}
END_TEST

START_TEST(test_block_layout) {
    /* GGUF layout: d (fp16) at offset 0, qs at offset 2, no padding */
    ck_assert_uint_eq(sizeof(bt_block_q8_0), 34);
    ck_assert_uint_eq(offsetof(bt_block_q8_0, d), 0);
    ck_assert_uint_eq(offsetof(bt_block_q8_0, qs), 2);
    ck_assert_uint_eq(sizeof(bt_block_q4_0), 18);
    ck_assert_uint_eq(offsetof(bt_block_q4_0, d), 0);
    ck_assert_uint_eq(offsetof(bt_block_q4_0, qs), 2);

    /* hand-built Q8_0 bytes, two blocks: d little-endian fp16, then int8 q */
    uint8_t q8[68];
    float out[64];
    for (int b = 0; b < 2; b++) {
        uint16_t d = b == 0 ? 0x3800 /* 0.5 */ : 0xC400 /* -4.0 */;
        q8[b * 34 + 0] = (uint8_t)(d & 0xff);
        q8[b * 34 + 1] = (uint8_t)(d >> 8);
        for (int j = 0; j < 32; j++) q8[b * 34 + 2 + j] = (uint8_t)(int8_t)(j * 8 - 128 + b);
    }
    bt_row_to_f32(BT_TYPE_Q8_0, q8, out, 64);
    for (int j = 0; j < 32; j++) {
        ck_assert_float_eq(out[j], 0.5f * (float)(j * 8 - 128));
        ck_assert_float_eq(out[32 + j], -4.0f * (float)(j * 8 - 128 + 1));
    }

    /* hand-built Q4_0: element j low nibble of qs[j], j+16 high nibble; x = d*(q-8) */
    uint8_t q4[36];
    for (int b = 0; b < 2; b++) {
        uint16_t d = b == 0 ? 0x3C00 /* 1.0 */ : 0x3400 /* 0.25 */;
        q4[b * 18 + 0] = (uint8_t)(d & 0xff);
        q4[b * 18 + 1] = (uint8_t)(d >> 8);
        for (int j = 0; j < 16; j++) {
            int lo = (j + 3 * b) & 15, hi = (15 - j) & 15;
            q4[b * 18 + 2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
    bt_row_to_f32(BT_TYPE_Q4_0, q4, out, 64);
    for (int b = 0; b < 2; b++) {
        float d = b == 0 ? 1.0f : 0.25f;
        for (int j = 0; j < 16; j++) {
            ck_assert_float_eq(out[b * 32 + j], d * (float)(((j + 3 * b) & 15) - 8));
            ck_assert_float_eq(out[b * 32 + 16 + j], d * (float)(((15 - j) & 15) - 8));
        }
    }
}
END_TEST

/* ---- fp16 / bf16 ---- */

START_TEST(test_fp16_decode_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        float got = bt_fp16_to_fp32((bt_fp16_t)h), want = ref_half_to_float((uint16_t)h);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "fp16 0x%04x: want NaN, got %g", h, got);
        } else {
            ck_assert_msg(f2u(got) == f2u(want), "fp16 0x%04x: want %a got %a", h, want, got);
        }
    }
}
END_TEST

START_TEST(test_fp16_encode_rounding) {
    /* every finite half round-trips exactly (both signs, subnormals incl.) */
    for (uint32_t h = 0; h < 65536; h++) {
        if (((h >> 10) & 0x1f) == 0x1f) continue;
        float f = ref_half_to_float((uint16_t)h);
        ck_assert_msg(bt_fp32_to_fp16(f) == h, "round trip 0x%04x (%a) -> 0x%04x", h, f,
                      bt_fp32_to_fp16(f));
    }
    /* midpoints between consecutive positive finite halfs round to the even
     * one; just above goes up, just below goes down */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = ref_half_to_float((uint16_t)h), b = ref_half_to_float((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2.0); /* exact in fp32 */
        uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        ck_assert_msg(bt_fp32_to_fp16(mid) == even, "tie %a (0x%04x/0x%04x) -> 0x%04x", mid, h,
                      h + 1, bt_fp32_to_fp16(mid));
        ck_assert_msg(bt_fp32_to_fp16(-mid) == (even | 0x8000), "tie -%a", mid);
        ck_assert_uint_eq(bt_fp32_to_fp16(nextafterf(mid, INFINITY)), h + 1);
        ck_assert_uint_eq(bt_fp32_to_fp16(nextafterf(mid, 0.0f)), h);
    }
    /* overflow and specials */
    ck_assert_uint_eq(bt_fp32_to_fp16(65504.0f), 0x7bff);
    ck_assert_uint_eq(bt_fp32_to_fp16(65519.0f), 0x7bff);
    ck_assert_uint_eq(bt_fp32_to_fp16(65520.0f), 0x7c00); /* tie with "65536" rounds to inf */
    ck_assert_uint_eq(bt_fp32_to_fp16(1e10f), 0x7c00);
    ck_assert_uint_eq(bt_fp32_to_fp16(-1e10f), 0xfc00);
    ck_assert_uint_eq(bt_fp32_to_fp16(INFINITY), 0x7c00);
    ck_assert_uint_eq(bt_fp32_to_fp16(-0.0f), 0x8000);
    ck_assert_uint_eq(bt_fp32_to_fp16(ldexpf(1.0f, -25)), 0x0000);      /* tie -> even 0 */
    ck_assert_uint_eq(bt_fp32_to_fp16(ldexpf(1.0f, -26)), 0x0000);      /* underflow */
    ck_assert_uint_eq(bt_fp32_to_fp16(ldexpf(1.5f, -24)), 0x0002);      /* tie -> even 2 */
    ck_assert_uint_eq(bt_fp32_to_fp16(ldexpf(1.0f, -25) * 1.01f), 0x0001);
    uint16_t n = bt_fp32_to_fp16(NAN);
    ck_assert_msg(((n >> 10) & 0x1f) == 0x1f && (n & 0x3ff) != 0, "NaN -> 0x%04x", n);
}
END_TEST

START_TEST(test_bf16) {
    /* decode is a shift */
    for (uint32_t h = 0; h < 65536; h += 7) {
        float f = bt_bf16_to_fp32((bt_bf16_t)h);
        if (((h >> 7) & 0xff) == 0xff && (h & 0x7f)) {
            ck_assert(isnan(f));
        } else {
            ck_assert_uint_eq(f2u(f), h << 16);
        }
    }
    /* encode: round to nearest even on the low 16 bits */
    tu_rng r;
    tu_rng_init(&r, 11);
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)tu_rng_u64(&r);
        if (((u >> 23) & 0xff) == 0xff) continue; /* inf/nan below */
        uint32_t want = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        ck_assert_msg(bt_fp32_to_bf16(u2f(u)) == want, "bf16(%08x) = %04x want %04x", u,
                      bt_fp32_to_bf16(u2f(u)), want);
    }
    ck_assert_uint_eq(bt_fp32_to_bf16(u2f(0x3f808000u)), 0x3f80); /* tie, even below */
    ck_assert_uint_eq(bt_fp32_to_bf16(u2f(0x3f818000u)), 0x3f82); /* tie, even above */
    ck_assert_uint_eq(bt_fp32_to_bf16(u2f(0x3f808001u)), 0x3f81);
    ck_assert_uint_eq(bt_fp32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(bt_fp32_to_bf16(-INFINITY), 0xff80);
    uint16_t n = bt_fp32_to_bf16(NAN);
    ck_assert(((n >> 7) & 0xff) == 0xff && (n & 0x7f) != 0);
    ck_assert(isnan(bt_bf16_to_fp32(n)));

    /* row conversion agrees with the scalar ones */
    float src[37], back[37];
    uint16_t h16[37];
    for (int i = 0; i < 37; i++) src[i] = tu_rng_f32(&r, -3.0f, 3.0f);
    bt_row_from_f32(BT_TYPE_BF16, src, h16, 37);
    bt_row_to_f32(BT_TYPE_BF16, h16, back, 37);
    for (int i = 0; i < 37; i++) {
        ck_assert_uint_eq(h16[i], bt_fp32_to_bf16(src[i]));
        ck_assert_float_eq(back[i], bt_bf16_to_fp32(h16[i]));
    }
    bt_row_from_f32(BT_TYPE_F16, src, h16, 37);
    bt_row_to_f32(BT_TYPE_F16, h16, back, 37);
    for (int i = 0; i < 37; i++) {
        ck_assert_uint_eq(h16[i], bt_fp32_to_fp16(src[i]));
        ck_assert_float_eq(back[i], bt_fp16_to_fp32(h16[i]));
    }
    int32_t i32[5];
    float fi[5] = {0.0f, 1.0f, -7.0f, 12345.0f, -2.0f}, fo[5];
    bt_row_from_f32(BT_TYPE_I32, fi, i32, 5);
    bt_row_to_f32(BT_TYPE_I32, i32, fo, 5);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(i32[i], (int32_t)fi[i]);
        ck_assert_float_eq(fo[i], fi[i]);
    }
}
END_TEST

/* ---- quantisation ---- */

/* Round trip of nb blocks; asserts the per-element bound derived from the
 * formats: Q8_0 x = d*q, q in [-127,127] (ggml never uses -128), so with d
 * stored as fp16 (relative error <= 2^-11) the error is at most
 * d/2 + 127*|d|*2^-11; Q4_0 x = d*(q-8), q in [0,15], the same with 8 in
 * place of 127, except the value at the clamped end (q-8 = +7 for x = -8d's
 * mirror) which may be a whole step off. */
static void check_quant(enum bt_type type, const float *x, int64_t n) {
    size_t rs = bt_row_size(type, n);
    uint8_t *q = malloc(rs);
    float *y = malloc(sizeof(float) * (size_t)n);
    bt_row_from_f32(type, x, q, n);
    bt_row_to_f32(type, q, y, n);
    /* through the traits too */
    const struct bt_type_traits *tr = bt_type_traits(type);
    uint8_t *q2 = malloc(rs);
    tr->from_float(x, q2, n);
    ck_assert_msg(memcmp(q, q2, rs) == 0, "traits from_float differs from bt_row_from_f32");
    free(q2);
    int qmax = type == BT_TYPE_Q8_0 ? 127 : 8;
    size_t bs = bt_type_size(type);
    for (int64_t b = 0; b < n / 32; b++) {
        uint16_t dh = (uint16_t)(q[b * bs] | (q[b * bs + 1] << 8));
        float d = fabsf(bt_fp16_to_fp32(dh));
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        /* the scale is not wastefully large: a whole step would fit fewer levels */
        float dmax = type == BT_TYPE_Q8_0 ? amax / 127.0f : amax / 7.0f;
        ck_assert_msg(d <= dmax * (1.0f + 1.0f / 1024.0f) + 1e-30f,
                      "%s block %ld: d=%g too large for amax=%g", bt_type_name(type), (long)b, d,
                      amax);
        float half = d * 0.5f + (float)qmax * d / 2048.0f + 1e-6f * amax;
        float full = d + (float)qmax * d / 2048.0f + 1e-6f * amax;
        for (int j = 0; j < 32; j++) {
            float xi = x[b * 32 + j], err = fabsf(xi - y[b * 32 + j]);
            /* Q4_0: the level 7 side holds 7 steps, the other 8: values beyond
             * 7.5 steps on the short side clamp, up to a whole step off */
            float bound = half;
            if (type == BT_TYPE_Q4_0 && d > 0 && fabsf(xi) > 7.5f * d) bound = full;
            ck_assert_msg(err <= bound, "%s block %ld elem %d: x=%.9g deq=%.9g err=%g > %g (d=%g)",
                          bt_type_name(type), (long)b, j, xi, y[b * 32 + j], err, bound, d);
        }
    }
    free(q);
    free(y);
}

START_TEST(test_quant_roundtrip) {
    tu_rng r;
    tu_rng_init(&r, 1234);
    enum bt_type types[2] = {BT_TYPE_Q8_0, BT_TYPE_Q4_0};
    const int64_t n = 32 * 64;
    float *x = malloc(sizeof(float) * n);
    for (int ti = 0; ti < 2; ti++) {
        for (int rep = 0; rep < 20; rep++) {
            float scale = ldexpf(1.0f, (int)tu_rng_int(&r, 12) - 4);
            for (int64_t i = 0; i < n; i++) x[i] = tu_rng_f32(&r, -scale, scale);
            /* some special blocks: all zero, one spike, all equal, all negative */
            for (int j = 0; j < 32; j++) {
                x[j] = 0.0f;
                x[32 + j] = j == 5 ? -scale : 0.001f * scale;
                x[64 + j] = 0.75f * scale;
                x[96 + j] = -fabsf(x[96 + j]);
            }
            check_quant(types[ti], x, n);
        }
        /* all-zero block dequantises to exact zeros, no NaN */
        float z[32] = {0}, y[32];
        uint8_t q[34];
        bt_row_from_f32(types[ti], z, q, 32);
        bt_row_to_f32(types[ti], q, y, 32);
        for (int j = 0; j < 32; j++) ck_assert_float_eq(y[j], 0.0f);
    }
    free(x);
}
END_TEST

START_TEST(test_quant_exact_levels) {
    /* values already on the ggml grid come back exactly:
     * Q8_0: amax = 127 -> d = 1, q = x;  Q4_0: max = -8 -> d = 1, q-8 = x */
    float x[32], y[32];
    uint8_t q[34];
    for (int j = 0; j < 32; j++) x[j] = (float)((j * 37) % 255 - 127);
    x[3] = 127.0f;
    bt_row_from_f32(BT_TYPE_Q8_0, x, q, 32);
    ck_assert_uint_eq(q[0] | (q[1] << 8), 0x3C00); /* d = 1.0 */
    bt_row_to_f32(BT_TYPE_Q8_0, q, y, 32);
    for (int j = 0; j < 32; j++) {
        ck_assert_float_eq(y[j], x[j]);
        ck_assert_int_eq((int8_t)q[2 + j], (int)x[j]);
    }
    for (int j = 0; j < 32; j++) x[j] = (float)((j * 5) % 16 - 8); /* x[0] = -8 */
    bt_row_from_f32(BT_TYPE_Q4_0, x, q, 32);
    bt_row_to_f32(BT_TYPE_Q4_0, q, y, 32);
    for (int j = 0; j < 32; j++) ck_assert_float_eq(y[j], x[j]);
}
END_TEST

/* ---- contexts ---- */

START_TEST(test_context_alloc) {
    bt_context *ctx = tu_ctx(1);
    ck_assert(!bt_get_no_alloc(ctx));
    ck_assert_str_eq(bt_context_error(ctx), "");
    ck_assert_uint_gt(bt_tensor_overhead(), sizeof(struct bt_tensor) - 1);
    size_t u0 = bt_used_mem(ctx);
    struct bt_tensor *t = bt_new_tensor_2d(ctx, BT_TYPE_F32, 17, 3);
    TU_OK(ctx, t);
    ck_assert_ptr_nonnull(t->data);
    ck_assert_uint_eq((uintptr_t)t->data % BT_MEM_ALIGN, 0);
    ck_assert_uint_ge(bt_used_mem(ctx) - u0, 17 * 3 * 4);
    ck_assert_int_eq(t->op, BT_OP_NONE);
    ck_assert_ptr_null(t->src[0]);
    ck_assert_ptr_null(t->view_src);
    /* data is writable over its whole span */
    memset(t->data, 0x5a, bt_nbytes(t));

    void *p = bt_context_alloc(ctx, 100);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % BT_MEM_ALIGN, 0);

    /* exhaustion: NULL and a message, the context stays usable */
    struct bt_tensor *big = bt_new_tensor_1d(ctx, BT_TYPE_F32, 1 << 20);
    ck_assert_ptr_null(big);
    ck_assert_str_ne(bt_context_error(ctx), "");
    bt_context_clear_error(ctx);
    ck_assert_str_eq(bt_context_error(ctx), "");
    ck_assert_ptr_null(bt_context_alloc(ctx, (size_t)2 << 20));
    ck_assert_str_ne(bt_context_error(ctx), "");
    bt_context_clear_error(ctx);
    struct bt_tensor *small = bt_new_tensor_1d(ctx, BT_TYPE_F32, 16);
    TU_OK(ctx, small);

    bt_context_set_error(ctx, "custom %d", 42);
    ck_assert_str_eq(bt_context_error(ctx), "custom 42");
    bt_free(ctx);

    /* caller-owned buffer */
    static _Alignas(64) char buf[1 << 16];
    struct bt_init_params ip = {sizeof(buf), buf, false};
    ctx = bt_init(ip);
    ck_assert_ptr_nonnull(ctx);
    t = bt_new_tensor_1d(ctx, BT_TYPE_F32, 64);
    TU_OK(ctx, t);
    ck_assert((char *)t->data >= buf && (char *)t->data + 256 <= buf + sizeof(buf));
    ck_assert_ptr_null(bt_new_tensor_1d(ctx, BT_TYPE_F32, 1 << 16));
    ck_assert_str_ne(bt_context_error(ctx), "");
    bt_free(ctx);
}
END_TEST

START_TEST(test_context_no_alloc) {
    struct bt_init_params ip = {64 * bt_tensor_overhead(), NULL, true};
    bt_context *ctx = bt_init(ip);
    ck_assert_ptr_nonnull(ctx);
    ck_assert(bt_get_no_alloc(ctx));
    /* a tensor far larger than the arena: metadata only */
    struct bt_tensor *t = bt_new_tensor_2d(ctx, BT_TYPE_F32, 4096, 4096);
    TU_OK(ctx, t);
    ck_assert_ptr_null(t->data);
    ck_assert_uint_eq(bt_nbytes(t), (size_t)4096 * 4096 * 4);
    struct bt_tensor *v = bt_transpose(ctx, t);
    TU_OK(ctx, v);
    ck_assert_ptr_null(v->data);
    ck_assert_ptr_eq(v->view_src, t);
    /* metadata exhaustion still reported */
    int i;
    for (i = 0; i < 200; i++)
        if (!bt_new_tensor_1d(ctx, BT_TYPE_F32, 8)) break;
    ck_assert_int_lt(i, 200);
    ck_assert_str_ne(bt_context_error(ctx), "");
    bt_free(ctx);
}
END_TEST

/* ---- geometry ---- */

START_TEST(test_geometry) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *a = bt_new_tensor_4d(ctx, BT_TYPE_F32, 3, 5, 7, 2);
    TU_OK(ctx, a);
    ck_assert_uint_eq(a->nb[0], 4);
    ck_assert_uint_eq(a->nb[1], 12);
    ck_assert_uint_eq(a->nb[2], 60);
    ck_assert_uint_eq(a->nb[3], 420);
    ck_assert_uint_eq(bt_nbytes(a), 840);
    ck_assert_int_eq(bt_nelements(a), 210);
    ck_assert_int_eq(bt_nrows(a), 70);
    ck_assert_int_eq(bt_n_dims(a), 4);
    ck_assert(bt_is_contiguous(a) && bt_is_contiguous_rows(a));
    ck_assert(!bt_is_view(a));

    struct bt_tensor *m = bt_new_tensor_2d(ctx, BT_TYPE_F16, 17, 1);
    TU_OK(ctx, m);
    ck_assert_int_eq(bt_n_dims(m), 1);
    ck_assert_int_eq(m->ne[2], 1);
    ck_assert_int_eq(m->ne[3], 1);
    ck_assert_uint_eq(bt_nbytes(m), 34);

    /* transpose: swapped ne and nb, same span, not contiguous */
    struct bt_tensor *a2 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 3, 5);
    struct bt_tensor *t = bt_transpose(ctx, a2);
    TU_OK(ctx, t);
    ck_assert_int_eq(t->op, BT_OP_TRANSPOSE);
    ck_assert(bt_is_view(t));
    ck_assert_ptr_eq(t->view_src, a2);
    ck_assert_ptr_eq(t->src[0], a2);
    ck_assert_int_eq(t->ne[0], 5);
    ck_assert_int_eq(t->ne[1], 3);
    ck_assert_uint_eq(t->nb[0], 12);
    ck_assert_uint_eq(t->nb[1], 4);
    ck_assert_uint_eq(bt_nbytes(t), 60);
    ck_assert(!bt_is_contiguous(t));
    ck_assert(!bt_is_contiguous_rows(t));
    ck_assert_ptr_eq(tu_data(t), a2->data);

    /* permute: result dim axis[i] is a's dim i */
    struct bt_tensor *p = bt_permute(ctx, a, 2, 0, 1, 3);
    TU_OK(ctx, p);
    ck_assert_int_eq(p->ne[2], 3);
    ck_assert_int_eq(p->ne[0], 5);
    ck_assert_int_eq(p->ne[1], 7);
    ck_assert_int_eq(p->ne[3], 2);
    ck_assert_uint_eq(p->nb[2], 4);
    ck_assert_uint_eq(p->nb[0], 12);
    ck_assert_uint_eq(p->nb[1], 60);
    ck_assert_uint_eq(p->nb[3], 420);
    ck_assert_int_eq(bt_get_op_param_i32(p, 0), 2);
    ck_assert_int_eq(bt_get_op_param_i32(p, 1), 0);
    ck_assert_uint_eq(bt_nbytes(p), 840);
    ck_assert(!bt_is_contiguous(p));
    /* a permute of dims of size 1 stays contiguous in memory order */
    struct bt_tensor *c1 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 8, 1, 4);
    struct bt_tensor *p1 = bt_permute(ctx, c1, 0, 2, 1, 3);
    TU_OK(ctx, p1);
    ck_assert_int_eq(p1->ne[1], 4);
    ck_assert(bt_is_contiguous_rows(p1));

    /* views */
    struct bt_tensor *row = bt_view_1d(ctx, a2, 3, 2 * a2->nb[1]);
    TU_OK(ctx, row);
    ck_assert(bt_is_contiguous(row));
    ck_assert_ptr_eq(tu_data(row), (char *)a2->data + 24);
    ck_assert_uint_eq(row->view_offs, 24);
    struct bt_tensor *sv = bt_view_2d(ctx, a2, 2, 4, a2->nb[1], 4);
    TU_OK(ctx, sv);
    ck_assert(!bt_is_contiguous(sv));
    ck_assert(bt_is_contiguous_rows(sv));
    ck_assert_uint_eq(bt_nbytes(sv), 3 * 12 + 2 * 4);
    struct bt_tensor *vv = bt_view_tensor(ctx, t);
    TU_OK(ctx, vv);
    ck_assert(bt_are_same_shape(vv, t));
    ck_assert_uint_eq(vv->nb[0], t->nb[0]);
    ck_assert_uint_eq(vv->nb[1], t->nb[1]);
    ck_assert_ptr_eq(tu_data(vv), a2->data);
    /* a view of a view points at the owner of the data */
    struct bt_tensor *vrow = bt_view_1d(ctx, row, 2, 4);
    TU_OK(ctx, vrow);
    ck_assert_ptr_eq(vrow->view_src, a2);
    ck_assert_uint_eq(vrow->view_offs, 28);

    /* reshape keeps contiguity */
    struct bt_tensor *r = bt_reshape_3d(ctx, a, 15, 7, 2);
    TU_OK(ctx, r);
    ck_assert(bt_is_contiguous(r));
    ck_assert_uint_eq(r->nb[1], 60);
    ck_assert_uint_eq(r->nb[2], 420);
    ck_assert(bt_is_view(r));

    /* block types */
    struct bt_tensor *q = bt_new_tensor_2d(ctx, BT_TYPE_Q8_0, 64, 3);
    TU_OK(ctx, q);
    ck_assert_uint_eq(q->nb[0], 34);
    ck_assert_uint_eq(q->nb[1], 68);
    ck_assert_uint_eq(bt_nbytes(q), 204);
    ck_assert(bt_is_contiguous(q));
    struct bt_tensor *q4 = bt_new_tensor_3d(ctx, BT_TYPE_Q4_0, 96, 2, 2);
    TU_OK(ctx, q4);
    ck_assert_uint_eq(q4->nb[1], 54);
    ck_assert_uint_eq(bt_nbytes(q4), 216);
    ck_assert_ptr_null(bt_new_tensor_2d(ctx, BT_TYPE_Q8_0, 33, 2));
    ck_assert_str_ne(bt_context_error(ctx), "");
    bt_context_clear_error(ctx);

    /* dup_tensor: contiguous copy of the shape; dup_tensor_layout keeps strides */
    struct bt_tensor *d1 = bt_dup_tensor(ctx, t);
    TU_OK(ctx, d1);
    ck_assert(bt_are_same_shape(d1, t));
    ck_assert(bt_is_contiguous(d1));
    ck_assert_ptr_ne(d1->data, a2->data);
    struct bt_tensor *d2 = bt_dup_tensor_layout(ctx, t);
    TU_OK(ctx, d2);
    ck_assert_uint_eq(d2->nb[0], t->nb[0]);
    ck_assert_uint_eq(d2->nb[1], t->nb[1]);
    ck_assert_ptr_nonnull(d2->data);

    /* names and flags */
    bt_set_name(a, "weights");
    ck_assert_str_eq(bt_get_name(a), "weights");
    bt_format_name(a, "blk.%d.%s", 3, "attn_q");
    ck_assert_str_eq(bt_get_name(a), "blk.3.attn_q");
    char longname[200];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[199] = 0;
    bt_set_name(a, longname);
    ck_assert_uint_eq(strlen(bt_get_name(a)), BT_MAX_NAME - 1);
    bt_set_input(a);
    bt_set_output(a);
    ck_assert_int_eq(a->flags & (BT_TENSOR_FLAG_INPUT | BT_TENSOR_FLAG_OUTPUT),
                     BT_TENSOR_FLAG_INPUT | BT_TENSOR_FLAG_OUTPUT);
    bt_free(ctx);
}
END_TEST

START_TEST(test_element_access) {
    bt_context *ctx = tu_ctx(1);
    enum bt_type types[3] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16};
    for (int ti = 0; ti < 3; ti++) {
        struct bt_tensor *a = bt_new_tensor_3d(ctx, types[ti], 5, 3, 2);
        TU_OK(ctx, a);
        struct bt_tensor *t = bt_permute(ctx, a, 1, 2, 0, 3); /* [2,5,3] */
        TU_OK(ctx, t);
        for (int i2 = 0; i2 < 3; i2++)
            for (int i1 = 0; i1 < 5; i1++)
                for (int i0 = 0; i0 < 2; i0++)
                    bt_set_f32_nd(t, i0, i1, i2, 0, (float)(i0 * 100 + i1 * 10 + i2));
        /* t[i0,i1,i2] is a[i1,i2,i0] */
        for (int i2 = 0; i2 < 2; i2++)
            for (int i1 = 0; i1 < 3; i1++)
                for (int i0 = 0; i0 < 5; i0++) {
                    ck_assert_float_eq(bt_get_f32_nd(a, i0, i1, i2, 0),
                                       (float)(i2 * 100 + i0 * 10 + i1));
                }
    }
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, 4, 2);
    TU_OK(ctx, ids);
    for (int i = 0; i < 8; i++) bt_set_i32_nd(ids, i % 4, i / 4, 0, 0, i * 1000 - 3);
    for (int i = 0; i < 8; i++) ck_assert_int_eq(((int32_t *)ids->data)[i], i * 1000 - 3);
    ck_assert_int_eq(bt_get_i32_nd(ids, 1, 1, 0, 0), 5 * 1000 - 3);
    bt_free(ctx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tensor");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_type_traits);
    tcase_add_test(tc, test_block_layout);
    tcase_add_test(tc, test_fp16_decode_exhaustive);
    tcase_add_test(tc, test_fp16_encode_rounding);
    tcase_add_test(tc, test_bf16);
    tcase_add_test(tc, test_quant_roundtrip);
    tcase_add_test(tc, test_quant_exact_levels);
    tcase_add_test(tc, test_context_alloc);
    tcase_add_test(tc, test_context_no_alloc);
    tcase_add_test(tc, test_geometry);
    tcase_add_test(tc, test_element_access);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
