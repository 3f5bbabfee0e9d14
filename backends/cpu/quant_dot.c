/* quant_dot.c - dot products of quantised weight rows (Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with int8-quantised activation columns, as
 * ggml computes them: per weight block an exact integer dot (and an exact
 * integer from the activation block sums for the types with a min), then one
 * float step per block:
 *
 *   Q4_1, Q5_1 (x Q8_0):  acc += (dw * da) * isum + (mw * da) * asum
 *   Q5_0       (x Q8_0):  acc += (dw * da) * isum
 *   Q2_K, Q4_K, Q5_K (x Q8_K): acc += (da * dw) * isum - (da * dmin) * imin
 *   Q3_K, Q6_K (x Q8_K):  acc += (da * dw) * isum
 *
 * isum = sum over sub-blocks of scale * (sum of q_w * q_a), imin = sum of
 * min * (activation block sums), asum = sum of q_a: integers, exact in any
 * order.  The plain C and AVX-512 versions compute the same integers and the
 * same float expression (this file is built with -ffp-contract=off), so they
 * are bitwise equal; tests/test_quants.c checks it.
 */
#include "quant_dot.h"

#include "qtypes.h"

#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_QDOT_AVX512 1
#endif

static inline float h2f(bt_fp16_t h) { return bt_fp16_to_fp32(h); }

/* ---- plain C ---------------------------------------------------------------- */

/* element j (0..31) of a Q5 block's 5-bit value: nibble and bit j of qh */
static inline int q5_get(const uint8_t *qs, uint32_t qh, int j) {
    const int lo = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
    return lo | (int)(((qh >> j) & 1) << 4);
}
static inline uint32_t qh_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline int asum_q8_0(const bt_block_q8_0 *a) {
    int s = 0;
    for (int j = 0; j < BT_QK; j++) s += a->qs[j];
    return s;
}

static void dot_q4_1_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q4_1 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK; b++) {
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += (w[b].qs[j] & 0xF) * a[b].qs[j] + (w[b].qs[j] >> 4) * a[b].qs[j + 16];
        const float da = h2f(a[b].d);
        acc += (h2f(w[b].d) * da) * (float)isum + (h2f(w[b].m) * da) * (float)asum_q8_0(&a[b]);
    }
    *s = acc;
}

static void dot_q5_0_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_0 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK; b++) {
        const uint32_t qh = qh_u32(w[b].qh);
        int isum = 0;
        for (int j = 0; j < BT_QK; j++) isum += (q5_get(w[b].qs, qh, j) - 16) * a[b].qs[j];
        acc += (h2f(w[b].d) * h2f(a[b].d)) * (float)isum;
    }
    *s = acc;
}

static void dot_q5_1_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_1 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK; b++) {
        const uint32_t qh = qh_u32(w[b].qh);
        int isum = 0;
        for (int j = 0; j < BT_QK; j++) isum += q5_get(w[b].qs, qh, j) * a[b].qs[j];
        const float da = h2f(a[b].d);
        acc += (h2f(w[b].d) * da) * (float)isum + (h2f(w[b].m) * da) * (float)asum_q8_0(&a[b]);
    }
    *s = acc;
}

/* 2-bit field of element j (0..255) in Q2_K / Q3_K's qs */
static inline int q2_get(const uint8_t *qs, int j) {
    return (qs[32 * (j / 128) + j % 32] >> (2 * ((j % 128) / 32))) & 3;
}

static void dot_q2_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q2_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        int isum = 0, imin = 0;
        for (int j = 0; j < 16; j++) {
            int sub = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) sub += q2_get(w[b].qs, i) * a[b].qs[i];
            isum += (w[b].scales[j] & 0xF) * sub;
            imin += (w[b].scales[j] >> 4) * a[b].bsums[j];
        }
        acc += (a[b].d * h2f(w[b].d)) * (float)isum - (a[b].d * h2f(w[b].dmin)) * (float)imin;
    }
    *s = acc;
}

static void dot_q3_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q3_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        int8_t sc[16];
        bt_q3_K_scales(w[b].scales, sc);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int sub = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) {
                const int hi = (w[b].hmask[i % 32] >> (i / 32)) & 1;
                sub += (q2_get(w[b].qs, i) - (hi ? 0 : 4)) * a[b].qs[i];
            }
            isum += sc[j] * sub;
        }
        acc += (a[b].d * h2f(w[b].d)) * (float)isum;
    }
    *s = acc;
}

/* Q4_K and Q5_K (Q5_K when qh != NULL) */
static float dot_q45_K_block(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, float dw,
                             float dmin, const bt_block_q8_K *a) {
    int isum = 0, imin = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        bt_q4_K_scale_min(j, scales, &sc, &m);
        int sub = 0;
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
            if (qh) q |= ((qh[l] >> j) & 1) << 4;
            sub += q * a->qs[32 * j + l];
        }
        isum += sc * sub;
        imin += m * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    }
    return (a->d * dw) * (float)isum - (a->d * dmin) * (float)imin;
}

static void dot_q4_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q4_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++)
        acc += dot_q45_K_block(w[b].scales, w[b].qs, NULL, h2f(w[b].d), h2f(w[b].dmin), &a[b]);
    *s = acc;
}

static void dot_q5_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++)
        acc += dot_q45_K_block(w[b].scales, w[b].qs, w[b].qh, h2f(w[b].d), h2f(w[b].dmin), &a[b]);
    *s = acc;
}

static void dot_q6_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q6_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int sub = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) {
                const int h = i / 128, sb = (i % 128) / 32, l = i % 32;
                const int lo = (w[b].ql[64 * h + l + 32 * (sb & 1)] >> (4 * (sb >> 1))) & 0xF;
                const int hi = (w[b].qh[32 * h + l] >> (2 * sb)) & 3;
                sub += ((lo | (hi << 4)) - 32) * a[b].qs[i];
            }
            isum += w[b].scales[j] * sub;
        }
        acc += (a[b].d * h2f(w[b].d)) * (float)isum;
    }
    *s = acc;
}

/* ---- AVX-512 (BW, VL, VNNI) --------------------------------------------------- *
 * Weights are unpacked to unsigned bytes, multiplied with the signed
 * activation bytes pairwise (vpmaddubsw: at most 2 * 63 * 127 < 32768, no
 * saturation), and the int16 pairs weighted by their sub-block's scale into
 * int32 lanes (vpdpwssd); offsets (Q5_0's 16, Q3_K's 4, Q6_K's 32) come off
 * exactly through the activation sums. */
#ifdef HAVE_QDOT_AVX512

#define UPPER16 ((__mmask32)0xFFFF0000u) /* the upper 256 bits, in 16-bit lanes */
#define UPPER8 ((__mmask64)0xFFFFFFFF00000000ull) /* the same, in bytes */

/* int16 scale vector: lanes 0..15 = lo, lanes 16..31 = hi */
static inline __m512i scale_pair(int lo, int hi) {
    return _mm512_mask_mov_epi16(_mm512_set1_epi16((short)lo), UPPER16, _mm512_set1_epi16((short)hi));
}

/* 32 bytes broadcast to both halves of a 512-bit vector */
static inline __m512i bcast32(const uint8_t *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* sum over j of s16[j] * b16[j], 16 int16 pairs */
static inline int dot16_i16(__m256i s16, const int16_t *b16) {
    const __m256i t = _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)b16));
    return _mm512_reduce_add_epi32(_mm512_zextsi256_si512(t));
}

static float dot_q45_K_block_avx512(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                                    float dw, float dmin, const bt_block_q8_K *a) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) bt_q4_K_scale_min(j, scales, &sc[j], &mn[j]);
    __m512i acc = _mm512_setzero_si512();
    const __m512i hb = qh ? bcast32(qh) : _mm512_setzero_si512();
    for (int g = 0; g < 4; g++) {
        /* sub-blocks 2g (low nibbles) and 2g+1 (high nibbles): elements 64g .. 64g+63 */
        __m512i q = bcast32(qs + 32 * g);
        q = _mm512_and_si512(_mm512_mask_srli_epi16(q, UPPER16, q, 4), m4);
        if (qh) {
            const __m512i bit = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)(1 << (2 * g))), UPPER8,
                                                     _mm512_set1_epi8((char)(2 << (2 * g))));
            q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hb, bit), q, sixteen);
        }
        const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(a->qs + 64 * g));
        acc = _mm512_dpwssd_epi32(acc, p, scale_pair(sc[2 * g], sc[2 * g + 1]));
    }
    const int isum = _mm512_reduce_add_epi32(acc);
    int imin = 0;
    for (int j = 0; j < 8; j++) imin += mn[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
    return (a->d * dw) * (float)isum - (a->d * dmin) * (float)imin;
}

static void dot_q4_K_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q4_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++)
        acc += dot_q45_K_block_avx512(w[b].scales, w[b].qs, NULL, h2f(w[b].d), h2f(w[b].dmin), &a[b]);
    *s = acc;
}

static void dot_q5_K_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++)
        acc += dot_q45_K_block_avx512(w[b].scales, w[b].qs, w[b].qh, h2f(w[b].d), h2f(w[b].dmin), &a[b]);
    *s = acc;
}

/* int16 lanes i -> element base + i / 8 of a 16-entry int16 table (the scale
 * of the 16-element sub-block a maddubs pair lane belongs to) */
static inline __m512i spread_scales(__m512i table, int base) {
    const __m512i idx = _mm512_add_epi16(
        _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                           15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                          3),
        _mm512_set1_epi16((short)base));
    return _mm512_permutexvar_epi16(idx, table);
}

static void dot_q6_K_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q6_K *w = vw;
    const bt_block_q8_K *a = va;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
        const __m512i table = _mm512_zextsi256_si512(sc16);
        __m512i accv = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512(w[b].ql + 64 * h);
            const __m512i qhb = bcast32(w[b].qh + 32 * h);
            /* elements 128h + 0..63: low nibbles of ql, qh bits 0-1 (first 32) and 2-3 */
            __m512i hi = _mm512_mask_srli_epi16(qhb, UPPER16, qhb, 2);
            __m512i q = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                        _mm512_slli_epi16(_mm512_and_si512(hi, m3), 4));
            __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(a[b].qs + 128 * h));
            accv = _mm512_dpwssd_epi32(accv, p, spread_scales(table, 8 * h));
            /* elements 128h + 64..127: high nibbles, qh bits 4-5 and 6-7 */
            hi = _mm512_srli_epi16(qhb, 4);
            hi = _mm512_mask_srli_epi16(hi, UPPER16, hi, 2);
            q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                _mm512_slli_epi16(_mm512_and_si512(hi, m3), 4));
            p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(a[b].qs + 128 * h + 64));
            accv = _mm512_dpwssd_epi32(accv, p, spread_scales(table, 8 * h + 4));
        }
        const int isum = _mm512_reduce_add_epi32(accv) - 32 * dot16_i16(sc16, a[b].bsums);
        acc += (a[b].d * h2f(w[b].d)) * (float)isum;
    }
    *s = acc;
}

/* Q2_K (hmask NULL) and Q3_K: the 2-bit fields of half h, pair pr (elements
 * 128h + 64pr .. +63) as bytes 0..3, plus 4 where Q3_K's high bit is set */
static inline __m512i q23_unpack(const uint8_t *qs, const uint8_t *hmask, int h, int pr) {
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512i q = bcast32(qs + 32 * h);
    q = _mm512_srli_epi16(q, 4 * pr);
    q = _mm512_and_si512(_mm512_mask_srli_epi16(q, UPPER16, q, 2), m3);
    if (hmask) {
        const int sb = 4 * h + 2 * pr; /* hmask bit of the first 32 elements */
        const __m512i bit = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)(1 << sb)), UPPER8,
                                                 _mm512_set1_epi8((char)(1 << (sb + 1))));
        q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(bcast32(hmask), bit), q, _mm512_set1_epi8(4));
    }
    return q;
}

static void dot_q2_K_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q2_K *w = vw;
    const bt_block_q8_K *a = va;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const __m128i raw = _mm_loadu_si128((const __m128i *)w[b].scales);
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        const __m512i table = _mm512_zextsi256_si512(sc16);
        __m512i accv = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++)
            for (int pr = 0; pr < 2; pr++) {
                const __m512i p = _mm512_maddubs_epi16(q23_unpack(w[b].qs, NULL, h, pr),
                                                       _mm512_loadu_si512(a[b].qs + 128 * h + 64 * pr));
                accv = _mm512_dpwssd_epi32(accv, p, spread_scales(table, 8 * h + 4 * pr));
            }
        const int isum = _mm512_reduce_add_epi32(accv);
        const int imin = dot16_i16(mn16, a[b].bsums);
        acc += (a[b].d * h2f(w[b].d)) * (float)isum - (a[b].d * h2f(w[b].dmin)) * (float)imin;
    }
    *s = acc;
}

static void dot_q3_K_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q3_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        int8_t sc[16];
        bt_q3_K_scales(w[b].scales, sc);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        const __m512i table = _mm512_zextsi256_si512(sc16);
        __m512i accv = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++)
            for (int pr = 0; pr < 2; pr++) {
                const __m512i p = _mm512_maddubs_epi16(q23_unpack(w[b].qs, w[b].hmask, h, pr),
                                                       _mm512_loadu_si512(a[b].qs + 128 * h + 64 * pr));
                accv = _mm512_dpwssd_epi32(accv, p, spread_scales(table, 8 * h + 4 * pr));
            }
        /* the unpacked values are q + 4 */
        const int isum = _mm512_reduce_add_epi32(accv) - 4 * dot16_i16(sc16, a[b].bsums);
        acc += (a[b].d * h2f(w[b].d)) * (float)isum;
    }
    *s = acc;
}

/* 32-element types x Q8_0: one block per 256-bit vector */
static inline int hsum256_i32(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
    return _mm_cvtsi128_si32(t);
}
/* the 32 nibbles of a Q4 block as bytes 0..15, element order */
static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}
/* plus 16 where bit j of qh is set */
static inline __m256i add_qh(__m256i q, const uint8_t *qh) {
    const __mmask32 k = (__mmask32)qh_u32(qh);
    return _mm256_mask_add_epi8(q, k, q, _mm256_set1_epi8(16));
}
/* (sum of q_w * q_a, sum of q_a) of one block; q_w unsigned bytes */
static inline int dot32_u8_i8(__m256i q, const int8_t *act, int *asum) {
    const __m256i av = _mm256_loadu_si256((const __m256i *)act);
    const __m256i ones = _mm256_set1_epi8(1);
    *asum = hsum256_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, av));
    return hsum256_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, av));
}

static void dot_q4_1_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q4_1 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK; b++) {
        int asum;
        const int isum = dot32_u8_i8(nibbles32(w[b].qs), a[b].qs, &asum);
        const float da = h2f(a[b].d);
        acc += (h2f(w[b].d) * da) * (float)isum + (h2f(w[b].m) * da) * (float)asum;
    }
    *s = acc;
}

static void dot_q5_0_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_0 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK; b++) {
        int asum;
        const int isum = dot32_u8_i8(add_qh(nibbles32(w[b].qs), w[b].qh), a[b].qs, &asum) - 16 * asum;
        acc += (h2f(w[b].d) * h2f(a[b].d)) * (float)isum;
    }
    *s = acc;
}

static void dot_q5_1_avx512(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_1 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc = 0;
    for (int64_t b = 0; b < k / BT_QK; b++) {
        int asum;
        const int isum = dot32_u8_i8(add_qh(nibbles32(w[b].qs), w[b].qh), a[b].qs, &asum);
        const float da = h2f(a[b].d);
        acc += (h2f(w[b].d) * da) * (float)isum + (h2f(w[b].m) * da) * (float)asum;
    }
    *s = acc;
}

#define FAST(name) dot_##name##_avx512
#else
#define FAST(name) dot_##name##_ref
#endif

/* ---- the table ------------------------------------------------------------------ */

#define ENTRY(T, name, act, actname)                                                         \
    [T] = {/* .act_type     = */ act,                                                       \
           /* .quantize_act = */ bt_##actname##_from_f32,                                  \
           /* .vec_dot      = */ FAST(name),                                                \
           /* .vec_dot_ref  = */ dot_##name##_ref}

static const struct bt_quant_dot quant_dots[BT_TYPE_COUNT] = {
    ENTRY(BT_TYPE_Q4_1, q4_1, BT_TYPE_Q8_0, q8_0), ENTRY(BT_TYPE_Q5_0, q5_0, BT_TYPE_Q8_0, q8_0),
    ENTRY(BT_TYPE_Q5_1, q5_1, BT_TYPE_Q8_0, q8_0), ENTRY(BT_TYPE_Q2_K, q2_K, BT_TYPE_Q8_K, q8_K),
    ENTRY(BT_TYPE_Q3_K, q3_K, BT_TYPE_Q8_K, q8_K), ENTRY(BT_TYPE_Q4_K, q4_K, BT_TYPE_Q8_K, q8_K),
    ENTRY(BT_TYPE_Q5_K, q5_K, BT_TYPE_Q8_K, q8_K), ENTRY(BT_TYPE_Q6_K, q6_K, BT_TYPE_Q8_K, q8_K),
};

const struct bt_quant_dot *bt_quant_dot_of(enum bt_type t) {
    if ((int)t < 0 || t >= BT_TYPE_COUNT || !quant_dots[t].vec_dot) return NULL;
    return &quant_dots[t];
}

/* ---- qtypes.h entries: matmul.c's table of quantised weight types ---------- */

/* an activation column: k / 32 Q8_0 blocks, or k / 256 Q8_K blocks */
static size_t act_size_q8_0(int64_t k) { return (size_t)(k / BT_QK) * sizeof(bt_block_q8_0); }
static size_t act_size_q8_K(int64_t k) { return (size_t)(k / BT_QK_K) * sizeof(bt_block_q8_K); }

#define QTYPE(name, act)                                                  \
    const struct bt_cpu_qtype bt_cpu_qtype_##name = {                     \
        /* .act_name     = */ #act " (ggml's block_" #act ")",            \
        /* .act_size     = */ act_size_##act,                             \
        /* .quantize_act = */ bt_##act##_from_f32,                        \
        /* .vec_dot      = */ FAST(name),                                 \
        /* .tiles        = */ {{0, 0, NULL}},                             \
    }
QTYPE(q4_1, q8_0);
QTYPE(q5_0, q8_0);
QTYPE(q5_1, q8_0);
QTYPE(q2_K, q8_K);
QTYPE(q3_K, q8_K);
QTYPE(q4_K, q8_K);
QTYPE(q5_K, q8_K);
QTYPE(q6_K, q8_K);
