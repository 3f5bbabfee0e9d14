/* quant_dot.c - dot products of quantised weight rows (Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with int8-quantised activation columns
 * (Q8_0 blocks for the 32-element types, Q8_K for the K-quants), and their
 * entries in matmul.c's table (qtypes.h).
 *
 * As in ggml, each weight block's dot is made of exact integers (the sums of
 * q_w * q_a, and for types with a min or an offset the activation sums);
 * only the float accumulation has an order, and it is fixed per type:
 *   - Q2_K, Q3_K: one accumulator, one float step per block;
 *   - Q4_1, Q5_0, Q5_1: 8 float lanes, Q4_K, Q5_K, Q6_K: 16 float lanes, each
 *     lane taking the integers of the same 4-element groups in every block
 *     (the groups vpdpbusd / vpdpwssd gather), then a fixed tree of sums.
 * The plain C versions (dot_*_ref) spell the order out; the AVX-512 versions
 * and the tiles compute the same integers and the same float operations, so
 * every path gives the same bits (tests/test_quants.c checks vec_dot against
 * the plain version and every tile against vec_dot).  The file is built with
 * -ffp-contract=off so that no other fusing happens.
 */
#include "quant_dot.h"

#include "qtypes.h"

#include <math.h>
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

/* Q4_1, Q5_0, Q5_1 keep 8 float lanes per dot: lane l takes, per block, the
 * exact integers of elements 4l .. 4l+3 (the bytes vpdpbusd gathers into a
 * lane): isum_l (sum of q_w * q_a) and asum_l (sum of q_a), as
 *     Q4_1, Q5_1: acc[l] = fma(isum_l, dw * da, acc[l]); acc[l] = fma(asum_l, mw * da, acc[l])
 *     Q5_0:       acc[l] = fma(isum_l - 16 asum_l, dw * da, acc[l])   (q_w unsigned 0..31)
 * and at the end the fixed tree hsum8 (lanes l + 4, then + 2, + 1). */
static float hsum8(const float a[8]) {
    float t4[4], t2[2];
    for (int i = 0; i < 4; i++) t4[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) t2[i] = t4[i] + t4[i + 2];
    return t2[0] + t2[1];
}

/* lane sums of one 32-element block: q[32] unsigned weights, a the activations */
static void lanes32(const int *q, const int8_t *a, int isum[8], int asum[8]) {
    for (int l = 0; l < 8; l++) {
        isum[l] = asum[l] = 0;
        for (int i = 4 * l; i < 4 * l + 4; i++) {
            isum[l] += q[i] * a[i];
            asum[l] += a[i];
        }
    }
}

static void dot_q4_1_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q4_1 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc[8] = {0};
    for (int64_t b = 0; b < k / BT_QK; b++) {
        int q[32], isum[8], asum[8];
        for (int j = 0; j < 16; j++) {
            q[j] = w[b].qs[j] & 0xF;
            q[j + 16] = w[b].qs[j] >> 4;
        }
        lanes32(q, a[b].qs, isum, asum);
        const float da = h2f(a[b].d), dd = h2f(w[b].d) * da, dm = h2f(w[b].m) * da;
        for (int l = 0; l < 8; l++) {
            acc[l] = fmaf((float)isum[l], dd, acc[l]);
            acc[l] = fmaf((float)asum[l], dm, acc[l]);
        }
    }
    *s = hsum8(acc);
}

static void dot_q5_0_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_0 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc[8] = {0};
    for (int64_t b = 0; b < k / BT_QK; b++) {
        const uint32_t qh = qh_u32(w[b].qh);
        int q[32], isum[8], asum[8];
        for (int j = 0; j < 32; j++) q[j] = q5_get(w[b].qs, qh, j);
        lanes32(q, a[b].qs, isum, asum);
        const float dd = h2f(w[b].d) * h2f(a[b].d);
        for (int l = 0; l < 8; l++) acc[l] = fmaf((float)(isum[l] - 16 * asum[l]), dd, acc[l]);
    }
    *s = hsum8(acc);
}

static void dot_q5_1_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_1 *w = vw;
    const bt_block_q8_0 *a = va;
    float acc[8] = {0};
    for (int64_t b = 0; b < k / BT_QK; b++) {
        const uint32_t qh = qh_u32(w[b].qh);
        int q[32], isum[8], asum[8];
        for (int j = 0; j < 32; j++) q[j] = q5_get(w[b].qs, qh, j);
        lanes32(q, a[b].qs, isum, asum);
        const float da = h2f(a[b].d), dd = h2f(w[b].d) * da, dm = h2f(w[b].m) * da;
        for (int l = 0; l < 8; l++) {
            acc[l] = fmaf((float)isum[l], dd, acc[l]);
            acc[l] = fmaf((float)asum[l], dm, acc[l]);
        }
    }
    *s = hsum8(acc);
}

/* 2-bit field of element j (0..255) in Q2_K / Q3_K's qs */
static inline int q2_get(const uint8_t *qs, int j) {
    return (qs[32 * (j / 128) + j % 32] >> (2 * ((j % 128) / 32))) & 3;
}

/* Q4_K, Q5_K and Q6_K keep 16 float lanes per dot instead of one
 * accumulator (so that the AVX-512 kernels and their tiles need no
 * horizontal sum per block).  Lane l takes, per block, an exact integer: for
 * each 64-element chunk g of the block, elements 64g + 4l .. 64g + 4l + 3 (the
 * bytes vpdpwssd gathers into lane l), each times its sub-block's scale; for
 * Q4_K / Q5_K lanes 0..7 also take the mins' term from the activation sums
 * (lane i: m_i * (bsum[2i] + bsum[2i+1]) terms), for Q6_K lanes 0..7 its
 * offset 32.  Then, block by block,
 *     acc[l] = fma(float(lane int), da * dw, acc[l])
 *     acc[l] = fma(-float(min int), da * dmin, acc[l])     (l < 8; Q4_K, Q5_K)
 * and at the end the fixed tree hsum16 (lanes l + 8, then + 4, + 2, + 1). */
static float hsum16(const float a[16]) {
    float t8[8], t4[4], t2[2];
    for (int i = 0; i < 8; i++) t8[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; i++) t4[i] = t8[i] + t8[i + 4];
    for (int i = 0; i < 2; i++) t2[i] = t4[i] + t4[i + 2];
    return t2[0] + t2[1];
}

/* Q4_K (qh NULL) and Q5_K: one block into the 16 lanes */
static void q45_K_lanes_ref(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, float dw, float dmin,
                            const bt_block_q8_K *a, float acc[16]) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) bt_q4_K_scale_min(j, scales, &sc[j], &mn[j]);
    const float dd = a->d * dw, dm = a->d * dmin;
    for (int l = 0; l < 16; l++) {
        int li = 0;
        for (int g = 0; g < 4; g++) {
            const int sub = 2 * g + (l >= 8);
            int part = 0;
            for (int i = 0; i < 4; i++) {
                const int e = 4 * (l % 8) + i; /* element of the sub-block */
                int q = (qs[32 * g + e] >> (4 * (l >= 8))) & 0xF;
                if (qh) q |= ((qh[e] >> sub) & 1) << 4;
                part += q * a->qs[64 * g + 4 * l + i];
            }
            li += sc[sub] * part;
        }
        acc[l] = fmaf((float)li, dd, acc[l]);
        if (l < 8) {
            const int mi = mn[l] * a->bsums[2 * l] + mn[l] * a->bsums[2 * l + 1];
            acc[l] = fmaf(-(float)mi, dm, acc[l]);
        }
    }
}

static void dot_q4_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q4_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc[16] = {0};
    for (int64_t b = 0; b < k / BT_QK_K; b++)
        q45_K_lanes_ref(w[b].scales, w[b].qs, NULL, h2f(w[b].d), h2f(w[b].dmin), &a[b], acc);
    *s = hsum16(acc);
}

static void dot_q5_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q5_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc[16] = {0};
    for (int64_t b = 0; b < k / BT_QK_K; b++)
        q45_K_lanes_ref(w[b].scales, w[b].qs, w[b].qh, h2f(w[b].d), h2f(w[b].dmin), &a[b], acc);
    *s = hsum16(acc);
}

/* the 6-bit value (0..63, offset 32) of element j of a Q6_K block */
static inline int q6_get(const bt_block_q6_K *w, int j) {
    const int h = j / 128, sb = (j % 128) / 32, l = j % 32;
    const int lo = (w->ql[64 * h + l + 32 * (sb & 1)] >> (4 * (sb >> 1))) & 0xF;
    const int hi = (w->qh[32 * h + l] >> (2 * sb)) & 3;
    return lo | (hi << 4);
}

static void dot_q6_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q6_K *w = vw;
    const bt_block_q8_K *a = va;
    float acc[16] = {0};
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const float dd = a[b].d * h2f(w[b].d);
        for (int l = 0; l < 16; l++) {
            int li = 0;
            for (int g = 0; g < 4; g++) {
                int part = 0;
                const int e0 = 64 * g + 4 * l; /* 4 elements, one 16-element sub-block */
                for (int i = 0; i < 4; i++) part += q6_get(&w[b], e0 + i) * a[b].qs[e0 + i];
                li += w[b].scales[e0 / 16] * part;
            }
            if (l < 8) /* the offset 32, through the sums of sub-blocks 2l and 2l+1 */
                li -= 32 * (w[b].scales[2 * l] * a[b].bsums[2 * l] + w[b].scales[2 * l + 1] * a[b].bsums[2 * l + 1]);
            acc[l] = fmaf((float)li, dd, acc[l]);
        }
    }
    *s = hsum16(acc);
}

/* Q2_K and Q3_K: the lanes of Q6_K (16-element sub-blocks, int8 scales):
 * Q2_K with its mins as Q4_K's (lane i < 8: mn[2i] bsum[2i] + mn[2i+1]
 * bsum[2i+1]), Q3_K with the offset 4 of its unsigned values q + 4. */
static void dot_q23_K_lanes_ref(int64_t k, float *s, const void *vw, const void *va, bool q3) {
    const bt_block_q8_K *a = va;
    float acc[16] = {0};
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        int sc[16], mn[16] = {0};
        const uint8_t *qs;
        float dd, dm = 0;
        const bt_block_q3_K *w3 = (const bt_block_q3_K *)vw + b;
        const bt_block_q2_K *w2 = (const bt_block_q2_K *)vw + b;
        if (q3) {
            int8_t s8[16];
            bt_q3_K_scales(w3->scales, s8);
            for (int j = 0; j < 16; j++) sc[j] = s8[j];
            qs = w3->qs;
            dd = a[b].d * h2f(w3->d);
        } else {
            for (int j = 0; j < 16; j++) {
                sc[j] = w2->scales[j] & 0xF;
                mn[j] = w2->scales[j] >> 4;
            }
            qs = w2->qs;
            dd = a[b].d * h2f(w2->d);
            dm = a[b].d * h2f(w2->dmin);
        }
        for (int l = 0; l < 16; l++) {
            int li = 0;
            for (int g = 0; g < 4; g++) {
                int part = 0;
                const int e0 = 64 * g + 4 * l;
                for (int i = e0; i < e0 + 4; i++) {
                    int q = q2_get(qs, i);
                    if (q3) q += 4 * ((w3->hmask[i % 32] >> (i / 32)) & 1);
                    part += q * a[b].qs[i];
                }
                li += sc[e0 / 16] * part;
            }
            if (l < 8 && q3) li -= 4 * (sc[2 * l] * a[b].bsums[2 * l] + sc[2 * l + 1] * a[b].bsums[2 * l + 1]);
            acc[l] = fmaf((float)li, dd, acc[l]);
            if (l < 8 && !q3) {
                const int mi = mn[2 * l] * a[b].bsums[2 * l] + mn[2 * l + 1] * a[b].bsums[2 * l + 1];
                acc[l] = fmaf(-(float)mi, dm, acc[l]);
            }
        }
    }
    *s = hsum16(acc);
}
static void dot_q2_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    dot_q23_K_lanes_ref(k, s, vw, va, false);
}
static void dot_q3_K_ref(int64_t k, float *s, const void *vw, const void *va) {
    dot_q23_K_lanes_ref(k, s, vw, va, true);
}

/* ---- AVX-512 (BW, VL, VNNI) --------------------------------------------------- *
 * Weights are unpacked to unsigned bytes, multiplied with the signed
 * activation bytes pairwise (vpmaddubsw: at most 2 * 63 * 127 < 32768, no
 * saturation), and the int16 pairs weighted by their sub-block's scale into
 * int32 lanes (vpdpwssd); offsets (Q5_0's 16, Q3_K's 4, Q6_K's 32) come off
 * exactly through the activation sums. */
#ifdef HAVE_QDOT_AVX512

/* fp16 -> fp32 with F16C (exact, as bt_fp16_to_fp32, for every finite value) */
static inline float h2f_fast(bt_fp16_t h) { return _cvtsh_ss(h); }

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

/* hsum16's tree */
static inline float hsum16_avx512(__m512 v) {
    const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/* int16 lanes i -> entry idx(i) of a table of 32 int16 */
static inline __m512i perm16(__m512i table, __m512i idx) { return _mm512_permutexvar_epi16(idx, table); }

/* A Q4_K / Q5_K block's 8 scales and 8 mins as 16 int16 (sc0..7, m0..7). */
static inline __m256i q4_K_scales16(const uint8_t *scales) {
    uint32_t u[4];
    memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    u[2] = mins_lo;
    u[0] &= 0x3f3f3f3f;
    /* from registers: a 16-byte load of the 4 words just stored would stall */
    return _mm256_cvtepu8_epi16(_mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]));
}

/* Weight row r, block b: its scale table and per-chunk unpacking. */
struct k_row {
    __m512i table; /* int16: the scales (and for Q4_K / Q5_K the mins at 8..15) */
    __m256i mins;  /* Q4_K / Q5_K: m_i twice per pair of activation sums */
    float d, dmin;
};

/* An RM x RN tile of Q4_K (qh false) or Q5_K rows against Q8_K columns, in the
 * lane order of q45_K_lanes_ref. */
static inline __attribute__((always_inline)) void q45_K_tile(int64_t k, const void *const *w_rows,
                                                             const void *const *acts, float *out,
                                                             const int RM, const int RN, const bool q5) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    /* vpermw indices: chunk g's scales (lanes 0..15 sub 2g, 16..31 sub 2g+1); mins */
    const __m512i half = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
                         10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        4);
    const __m256i min_idx = _mm256_add_epi16(
        _mm256_srli_epi16(_mm256_set_epi16(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1),
        _mm256_set1_epi16(8));
    __m512 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < RM; r++)
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) acc[r][c] = _mm512_setzero_ps();
    const size_t bs = q5 ? sizeof(bt_block_q5_K) : sizeof(bt_block_q4_K);
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const bt_block_q8_K *ab[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) ab[c] = (const bt_block_q8_K *)acts[c] + b;
        const uint8_t *wb[4];
        struct k_row kr[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            wb[r] = (const uint8_t *)w_rows[r] + (size_t)b * bs;
            const bt_block_q4_K *w4 = (const bt_block_q4_K *)wb[r]; /* d, dmin, scales: same in Q5_K */
            const __m256i s16 = q4_K_scales16(w4->scales);
            kr[r].table = _mm512_zextsi256_si512(s16);
            kr[r].mins = _mm256_permutexvar_epi16(min_idx, s16);
            kr[r].d = h2f_fast(w4->d);
            kr[r].dmin = h2f_fast(w4->dmin);
        }
        __m512i isum[4][4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++)
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int g = 0; g < 4; g++) {
            __m512i av[4];
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) av[c] = _mm512_loadu_si512(ab[c]->qs + 64 * g);
            const __m512i sidx = _mm512_add_epi16(half, _mm512_set1_epi16((short)(2 * g)));
            _Pragma("GCC unroll 4")
            for (int r = 0; r < RM; r++) {
                const uint8_t *qs = q5 ? ((const bt_block_q5_K *)wb[r])->qs : ((const bt_block_q4_K *)wb[r])->qs;
                __m512i q = bcast32(qs + 32 * g);
                q = _mm512_and_si512(_mm512_mask_srli_epi16(q, UPPER16, q, 4), m4);
                if (q5) {
                    const __m512i bit = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)(1 << (2 * g))), UPPER8,
                                                             _mm512_set1_epi8((char)(2 << (2 * g))));
                    const __m512i hb = bcast32(((const bt_block_q5_K *)wb[r])->qh);
                    q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(hb, bit), q, sixteen);
                }
                const __m512i scv = perm16(kr[r].table, sidx);
                _Pragma("GCC unroll 4")
                for (int c = 0; c < RN; c++)
                    isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(q, av[c]), scv);
            }
        }
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)ab[c]->bsums);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < RM; r++) {
                const float dd = ab[c]->d * kr[r].d, dm = ab[c]->d * kr[r].dmin;
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_set1_ps(dd), acc[r][c]);
                const __m512i mi = _mm512_zextsi256_si512(_mm256_madd_epi16(kr[r].mins, bsums));
                acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_set1_ps(dm), acc[r][c]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = hsum16_avx512(acc[r][c]);
}

enum { KQ2, KQ3, KQ6 };
/* An RM x RN tile of Q2_K, Q3_K or Q6_K rows (16-element sub-blocks) against
 * Q8_K columns, in the lane order of dot_q6_K_ref / dot_q23_K_lanes_ref. */
static inline __attribute__((always_inline)) void q236_K_tile(int64_t k, const void *const *w_rows,
                                                              const void *const *acts, float *out,
                                                              const int RM, const int RN, const int kind) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    /* int16 lane i of chunk g covers elements 64g + 2i, +1: sub-block 4g + i / 8 */
    const __m512i eighth = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
                         10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        3);
    __m512 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < RM; r++)
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const bt_block_q8_K *ab[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) ab[c] = (const bt_block_q8_K *)acts[c] + b;
        const bt_block_q6_K *wb[4];
        const bt_block_q3_K *w3[4];
        const bt_block_q2_K *w2[4];
        __m512i table[4];
        __m256i sc16[4], mn16[4];
        float dw[4], dmin[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            if (kind == KQ6) {
                wb[r] = (const bt_block_q6_K *)w_rows[r] + b;
                sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb[r]->scales));
                dw[r] = h2f_fast(wb[r]->d);
            } else if (kind == KQ3) {
                w3[r] = (const bt_block_q3_K *)w_rows[r] + b;
                /* the 16 6-bit scales (offset 32), as bt_q3_K_scales, in registers */
                uint32_t aux[3];
                memcpy(aux, w3[r]->scales, 12);
                const uint32_t m2 = 0x0f0f0f0f, m1 = 0x03030303;
                const __m128i s8 = _mm_sub_epi8(
                    _mm_set_epi32((int)(((aux[1] >> 4) & m2) | (((aux[2] >> 6) & m1) << 4)),
                                  (int)(((aux[0] >> 4) & m2) | (((aux[2] >> 4) & m1) << 4)),
                                  (int)((aux[1] & m2) | (((aux[2] >> 2) & m1) << 4)),
                                  (int)((aux[0] & m2) | ((aux[2] & m1) << 4))),
                    _mm_set1_epi8(32));
                sc16[r] = _mm256_cvtepi8_epi16(s8);
                dw[r] = h2f_fast(w3[r]->d);
            } else {
                w2[r] = (const bt_block_q2_K *)w_rows[r] + b;
                const __m128i raw = _mm_loadu_si128((const __m128i *)w2[r]->scales);
                sc16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0F)));
                mn16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
                dw[r] = h2f_fast(w2[r]->d);
                dmin[r] = h2f_fast(w2[r]->dmin);
            }
            table[r] = _mm512_zextsi256_si512(sc16[r]);
        }
        __m512i isum[4][4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++)
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) isum[r][c] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4")
        for (int g = 0; g < 4; g++) { /* chunk g: half g / 2, pair g % 2 */
            const int h = g / 2, pr = g % 2;
            __m512i av[4];
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) av[c] = _mm512_loadu_si512(ab[c]->qs + 64 * g);
            const __m512i sidx = _mm512_add_epi16(eighth, _mm512_set1_epi16((short)(4 * g)));
            _Pragma("GCC unroll 4")
            for (int r = 0; r < RM; r++) {
                __m512i q;
                if (kind == KQ6) {
                    const __m512i ql = _mm512_loadu_si512(wb[r]->ql + 64 * h);
                    const __m512i qhb = bcast32(wb[r]->qh + 32 * h);
                    /* pair 0: low nibbles, qh bits 0-1 then 2-3; pair 1: high nibbles, bits 4-5 then 6-7 */
                    __m512i hi = pr ? _mm512_srli_epi16(qhb, 4) : qhb;
                    hi = _mm512_mask_srli_epi16(hi, UPPER16, hi, 2);
                    const __m512i lo = pr ? _mm512_srli_epi16(ql, 4) : ql;
                    q = _mm512_or_si512(_mm512_and_si512(lo, m4), _mm512_slli_epi16(_mm512_and_si512(hi, m3), 4));
                } else if (kind == KQ3) {
                    q = q23_unpack(w3[r]->qs, w3[r]->hmask, h, pr);
                } else {
                    q = q23_unpack(w2[r]->qs, NULL, h, pr);
                }
                const __m512i scv = perm16(table[r], sidx);
                _Pragma("GCC unroll 4")
                for (int c = 0; c < RN; c++)
                    isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(q, av[c]), scv);
            }
        }
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)ab[c]->bsums);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < RM; r++) {
                const float dd = ab[c]->d * dw[r];
                if (kind == KQ2) {
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][c]), _mm512_set1_ps(dd), acc[r][c]);
                    const __m512i mi = _mm512_zextsi256_si512(_mm256_madd_epi16(mn16[r], bsums));
                    acc[r][c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_set1_ps(ab[c]->d * dmin[r]),
                                                 acc[r][c]);
                } else {
                    /* the offset (32, Q3_K's 4): lane i < 8 loses it times sc[2i] bsum[2i] + sc[2i+1] bsum[2i+1] */
                    const __m256i sb = _mm256_madd_epi16(sc16[r], bsums);
                    const __m256i off = kind == KQ6 ? _mm256_slli_epi32(sb, 5) : _mm256_slli_epi32(sb, 2);
                    const __m512i li = _mm512_sub_epi32(isum[r][c], _mm512_zextsi256_si512(off));
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(li), _mm512_set1_ps(dd), acc[r][c]);
                }
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = hsum16_avx512(acc[r][c]);
}

#define K_TILES(name, call)                                                                          \
    static void qtile_##name##_4x1(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        (void)next;                                                                                  \
        call(4, 1);                                                                                  \
    }                                                                                                \
    static void qtile_##name##_4x2(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        (void)next;                                                                                  \
        call(4, 2);                                                                                  \
    }                                                                                                \
    static void qtile_##name##_2x4(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        (void)next;                                                                                  \
        call(2, 4);                                                                                  \
    }                                                                                                \
    static void dot_##name##_avx512(int64_t k, float *s, const void *vw, const void *va) {           \
        const void *const *w = &vw, *const *a = &va;                                                 \
        float *out = s;                                                                              \
        call(1, 1);                                                                                  \
    }
#define CALL_Q4_K(RM, RN) q45_K_tile(k, w, a, out, RM, RN, false)
#define CALL_Q5_K(RM, RN) q45_K_tile(k, w, a, out, RM, RN, true)
#define CALL_Q6_K(RM, RN) q236_K_tile(k, w, a, out, RM, RN, KQ6)
#define CALL_Q3_K(RM, RN) q236_K_tile(k, w, a, out, RM, RN, KQ3)
#define CALL_Q2_K(RM, RN) q236_K_tile(k, w, a, out, RM, RN, KQ2)
K_TILES(q4_K, CALL_Q4_K)
K_TILES(q5_K, CALL_Q5_K)
K_TILES(q6_K, CALL_Q6_K)
K_TILES(q3_K, CALL_Q3_K)
K_TILES(q2_K, CALL_Q2_K)
#define K_TILE_LIST(name) {{4, 1, qtile_##name##_4x1}, {4, 2, qtile_##name##_4x2}, {2, 4, qtile_##name##_2x4}, {0, 0, NULL}}

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
/* hsum8's tree */
static inline float hsum8_avx(__m256 v) {
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

/* An RM x RN tile of Q4_1 (mode 0), Q5_0 (1) or Q5_1 (2) rows against Q8_0
 * columns, in lanes32's order (see dot_q4_1_ref). */
static inline __attribute__((always_inline)) void q32_tile(int64_t k, const void *const *w_rows,
                                                           const void *const *acts, float *out,
                                                           const int RM, const int RN, const int mode) {
    const size_t bs = mode == 0 ? sizeof(bt_block_q4_1) : mode == 1 ? sizeof(bt_block_q5_0) : sizeof(bt_block_q5_1);
    __m256 acc[4][4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < RM; r++)
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / BT_QK; b++) {
        __m256i av[4], asum[4];
        __m256 asumf[4];
        float da[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const bt_block_q8_0 *ab = (const bt_block_q8_0 *)acts[c] + b;
            av[c] = _mm256_loadu_si256((const __m256i *)ab->qs);
            asum[c] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), av[c]);
            asumf[c] = _mm256_cvtepi32_ps(asum[c]);
            da[c] = h2f_fast(ab->d);
        }
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            const uint8_t *wb = (const uint8_t *)w_rows[r] + (size_t)b * bs;
            __m256i q;
            float dw, mw = 0.0f;
            if (mode == 0) {
                const bt_block_q4_1 *w = (const bt_block_q4_1 *)wb;
                q = nibbles32(w->qs);
                dw = h2f_fast(w->d);
                mw = h2f_fast(w->m);
            } else if (mode == 1) {
                const bt_block_q5_0 *w = (const bt_block_q5_0 *)wb;
                q = add_qh(nibbles32(w->qs), w->qh);
                dw = h2f_fast(w->d);
            } else {
                const bt_block_q5_1 *w = (const bt_block_q5_1 *)wb;
                q = add_qh(nibbles32(w->qs), w->qh);
                dw = h2f_fast(w->d);
                mw = h2f_fast(w->m);
            }
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) {
                const __m256i isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, av[c]);
                if (mode == 1) {
                    const __m256i li = _mm256_sub_epi32(isum, _mm256_slli_epi32(asum[c], 4));
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(li), _mm256_set1_ps(dw * da[c]), acc[r][c]);
                } else {
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dw * da[c]), acc[r][c]);
                    acc[r][c] = _mm256_fmadd_ps(asumf[c], _mm256_set1_ps(mw * da[c]), acc[r][c]);
                }
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = hsum8_avx(acc[r][c]);
}

#define Q32_TILES(name, mode)                                                                        \
    static void qtile_##name##_4x1(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        (void)next;                                                                                  \
        q32_tile(k, w, a, out, 4, 1, mode);                                                          \
    }                                                                                                \
    static void qtile_##name##_4x2(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        (void)next;                                                                                  \
        q32_tile(k, w, a, out, 4, 2, mode);                                                          \
    }                                                                                                \
    static void qtile_##name##_4x4(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        (void)next;                                                                                  \
        q32_tile(k, w, a, out, 4, 4, mode);                                                          \
    }                                                                                                \
    static void dot_##name##_avx512(int64_t k, float *s, const void *vw, const void *va) {           \
        q32_tile(k, &vw, &va, s, 1, 1, mode);                                                        \
    }
Q32_TILES(q4_1, 0)
Q32_TILES(q5_0, 1)
Q32_TILES(q5_1, 2)
#define Q32_TILE_LIST(name) {{4, 1, qtile_##name##_4x1}, {4, 2, qtile_##name##_4x2}, {4, 4, qtile_##name##_4x4}, {0, 0, NULL}}

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

#define QTYPE(name, act, tiles)                                           \
    const struct bt_cpu_qtype bt_cpu_qtype_##name = {                     \
        /* .act_name     = */ #act " (ggml's block_" #act ")",            \
        /* .act_size     = */ act_size_##act,                             \
        /* .quantize_act = */ bt_##act##_from_f32,                        \
        /* .vec_dot      = */ FAST(name),                                 \
        /* .tiles        = */ tiles,                                      \
    }
#define NO_TILES {{0, 0, NULL}}
#ifndef HAVE_QDOT_AVX512
#define K_TILE_LIST(name) NO_TILES
#define Q32_TILE_LIST(name) NO_TILES
#endif
QTYPE(q4_1, q8_0, Q32_TILE_LIST(q4_1));
QTYPE(q5_0, q8_0, Q32_TILE_LIST(q5_0));
QTYPE(q5_1, q8_0, Q32_TILE_LIST(q5_1));
QTYPE(q2_K, q8_K, K_TILE_LIST(q2_K));
QTYPE(q3_K, q8_K, K_TILE_LIST(q3_K));
QTYPE(q4_K, q8_K, K_TILE_LIST(q4_K));
QTYPE(q5_K, q8_K, K_TILE_LIST(q5_K));
QTYPE(q6_K, q8_K, K_TILE_LIST(q6_K));
