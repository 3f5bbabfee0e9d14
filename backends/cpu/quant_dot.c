/* quant_dot.c - dot products of the K-quants' weight rows (Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K) with int8-quantised activation columns (Q8_K), their
 * entries in matmul.c's table (qtypes.h), and the packed GEMMs of the
 * K-quants (IQ4_XS's and the lattice IQ types' too, as kinds KQI4 .. KQI1S).
 * The 32-element types are quant_i8.c's.
 *
 * As in ggml, each weight block's dot is made of exact integers (the sums of
 * q_w * q_a, and for types with a min or an offset the activation sums);
 * only the float accumulation has an order, and it is fixed per type: one
 * float accumulator, one or two fused steps per block on the block's two
 * integers (kq_step, described above dot_kq_ref).
 * The plain C versions (dot_*_ref) spell the order out; the AVX-512 versions,
 * the AVX2 ones (builds without AVX-512), the NEON dots (aarch64) and
 * the tiles compute the same
 * integers and the same float operations, so
 * every path gives the same bits (tests/test_quants.c checks vec_dot against
 * the plain version and every tile and the GEMM against vec_dot).  The file is built with
 * -ffp-contract=off so that no other fusing happens.
 */
#include "quant_dot.h"

#include "qtypes.h"
#include "cpu_impl.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_QDOT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_QDOT_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define HAVE_QDOT_NEON 1
#endif

static inline float h2f(bt_fp16_t h) { return bt_fp16_to_fp32(h); }

/* ---- plain C ---------------------------------------------------------------- */

/* 2-bit field of element j (0..255) in Q2_K / Q3_K's qs */
static inline int q2_get(const uint8_t *qs, int j) {
    return (qs[32 * (j / 128) + j % 32] >> (2 * ((j % 128) / 32))) & 3;
}

/* the 6-bit value (0..63, offset 32) of element j of a Q6_K block */
static inline int q6_get(const bt_block_q6_K *w, int j) {
    const int h = j / 128, sb = (j % 128) / 32, l = j % 32;
    const int lo = (w->ql[64 * h + l + 32 * (sb & 1)] >> (4 * (sb >> 1))) & 0xF;
    const int hi = (w->qh[32 * h + l] >> (2 * sb)) & 3;
    return lo | (hi << 4);
}

/* Q6_K's repacked payload (rp_q6_K below; the kernels' rp_k6_tile*): bytes
 * 12 j + 4 p + i (j < 16, p < 3, i < 4) hold the 6-bit value of element
 * 64 p + 4 j + i in bits 0..5 and bits 2p, 2p + 1 of element 192 + 4 j + i's
 * in bits 6, 7; bytes 192..207 the 16 scales as they were.  So a vector of
 * 16 rows' dwords gives three quarters' values by one AND each and the
 * fourth's by three shifts (the plain order needs a shift of the nibbles
 * for half of them and of the high bits for three quarters). */
static void q6_rp_enc(const uint8_t *plain, uint8_t *pay) {
    bt_block_q6_K w;
    memcpy(&w, plain, offsetof(bt_block_q6_K, d));
    for (int j = 0; j < 16; j++)
        for (int p = 0; p < 3; p++)
            for (int i = 0; i < 4; i++)
                pay[12 * j + 4 * p + i] =
                    (uint8_t)(q6_get(&w, 64 * p + 4 * j + i) | ((q6_get(&w, 192 + 4 * j + i) >> (2 * p)) & 3) << 6);
    memcpy(pay + 192, w.scales, sizeof w.scales);
}
static void q6_rp_dec(const uint8_t *pay, uint8_t *plain) {
    bt_block_q6_K w;
    uint8_t v[BT_QK_K];
    for (int j = 0; j < 16; j++)
        for (int i = 0; i < 4; i++) {
            const uint8_t *b = pay + 12 * j + i;
            for (int p = 0; p < 3; p++) v[64 * p + 4 * j + i] = b[4 * p] & 63;
            v[192 + 4 * j + i] = (uint8_t)(b[0] >> 6 | (b[4] >> 6) << 2 | (b[8] >> 6) << 4);
        }
    bt_q6_K_pack(v, w.ql, w.qh);
    memcpy(w.scales, pay + 192, sizeof w.scales);
    memcpy(plain, &w, offsetof(bt_block_q6_K, d));
}

/* The K-quants (Q2_K .. Q6_K) all dot the same way.  A weight block is seen
 * as 256 unsigned values q (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, Q2_K 0..3,
 * Q3_K 0..7), an integer scale sc[s] and an integer "min" mn[s] per
 * 16-element sub-block s, and the float scales d, dmin:
 *   Q4_K, Q5_K: sc, mn = the 6-bit scale and min of the 32-element sub-block;
 *   Q2_K: the 4-bit scale and min;   x = d sc q - dmin mn
 *   Q6_K: the int8 scale, mn = 32 sc; Q3_K: the 6-bit signed scale, mn = 4 sc;
 *         x = d (sc q - mn)   (the offsets 32 and 4, through the activation sums)
 * Per block, two exact integers against a Q8_K column a:
 *   I = sum_s sc[s] sum_{e in s} q[e] a.qs[e],   M = sum_s mn[s] a.bsums[s]
 * and one float step (kq_step), blocks in increasing order from acc = +0:
 *   with mins (Q2_K, Q4_K, Q5_K): acc = fma(I, da dw, acc); acc = fma(-M, da dmin, acc)
 *   without (Q3_K, Q6_K):         acc = fma(I - M, da dw, acc)
 * |I|, |M| < 2^29 for every type, so the integers are exact in int32 however
 * a path groups them: the plain C dot, the AVX-512 dot and tiles (16 int32
 * lanes, reduced per block), and the packed GEMM (a lane per weight row)
 * give the same bits. */
/* KQI4 .. KQI1S: the IQ types in the K-quants' packed GEMM only (quant_iq.c
 * has their dots).  Each is a signed value v per element (IQ4_XS's level,
 * the lattice types' signed grid values), an integer scale sc per 16 or 32
 * elements and d * mult (quant_iq.c's header): q = v + 128, mn = 128 sc, no
 * min, so I - M = sum_s sc[s] sum_{e in s} v[e] a.qs[e], dot_iq_ref's
 * integer, and kq_step's fma(I - M, da (d mult), acc) its float step. */
enum kq_kind { KQ2, KQ3, KQ4, KQ5, KQ6, KQI4, KQI2XXS, KQI2XS, KQI2S, KQI3XXS, KQI3S, KQI1S };
/* q holds v + 128 of signed values (the IQ types) */
static inline bool kq_signed(int kind) { return kind >= KQI4; }
/* the lattice IQ types, unpacked by quant_iq.c */
static inline bool kq_lattice(int kind) { return kind > KQI4; }
/* the elements that share one scale: 32 or 16 */
static inline int kq_sub_len(int kind) {
    return kind == KQ2 || kind == KQ3 || kind == KQ6 || kind == KQI2XS || kind == KQI2S ? 16 : 32;
}

struct kq_block {
    uint8_t q[BT_QK_K];
    /* sc .. dmin: 56 contiguous bytes, packed as they are (kq_pack) */
    int8_t sc[16];
    int16_t mn[16];
    float d, dmin;
};
_Static_assert(offsetof(struct kq_block, dmin) == offsetof(struct kq_block, sc) + 52,
               "kq_pack moves sc .. dmin as 14 words");

static inline bool kq_has_min(int kind) { return kind == KQ2 || kind == KQ4 || kind == KQ5; }

static size_t kq_block_bytes(int kind) {
    switch (kind) {
    case KQ2: return sizeof(bt_block_q2_K);
    case KQ3: return sizeof(bt_block_q3_K);
    case KQ4: return sizeof(bt_block_q4_K);
    case KQ5: return sizeof(bt_block_q5_K);
    case KQI4: return sizeof(bt_block_iq4_xs);
    case KQI2XXS: return sizeof(bt_block_iq2_xxs);
    case KQI2XS: return sizeof(bt_block_iq2_xs);
    case KQI2S: return sizeof(bt_block_iq2_s);
    case KQI3XXS: return sizeof(bt_block_iq3_xxs);
    case KQI3S: return sizeof(bt_block_iq3_s);
    case KQI1S: return sizeof(bt_block_iq1_s);
    default: return sizeof(bt_block_q6_K);
    }
}

/* the scales, mins and float scales of one block (not q) */
static void kq_unpack_scales(int kind, const void *blk, struct kq_block *o) {
    o->dmin = 0.0f;
    if (kind == KQ4 || kind == KQ5) {
        const bt_block_q4_K *w = blk; /* d, dmin, scales: the same in Q5_K */
        uint8_t sc[8], mn[8]; /* the 8 sub-blocks' 6-bit scales and mins, each on its two halves */
        bt_q4_K_scales_mins(w->scales, sc, mn);
        for (int j = 0; j < 8; j++) {
            o->sc[2 * j] = o->sc[2 * j + 1] = (int8_t)sc[j];
            o->mn[2 * j] = o->mn[2 * j + 1] = mn[j];
        }
        o->d = h2f(w->d);
        o->dmin = h2f(w->dmin);
    } else if (kind == KQ6) {
        const bt_block_q6_K *w = blk;
        for (int s = 0; s < 16; s++) {
            o->sc[s] = w->scales[s];
            o->mn[s] = (int16_t)(32 * w->scales[s]);
        }
        o->d = h2f(w->d);
    } else if (kind == KQI4) {
        const bt_block_iq4_xs *w = blk;
        for (int s = 0; s < 16; s++) {
            o->sc[s] = (int8_t)(bt_iq4_xs_scale(w, s / 2) - 32);
            o->mn[s] = (int16_t)(128 * o->sc[s]);
        }
        o->d = h2f(w->d);
    } else if (kind == KQ3) {
        const bt_block_q3_K *w = blk;
        bt_q3_K_scales(w->scales, o->sc);
        for (int s = 0; s < 16; s++) o->mn[s] = (int16_t)(4 * o->sc[s]);
        o->d = h2f(w->d);
    } else {
        const bt_block_q2_K *w = blk;
        for (int s = 0; s < 16; s++) {
            o->sc[s] = (int8_t)(w->scales[s] & 0xF);
            o->mn[s] = (int16_t)(w->scales[s] >> 4);
        }
        o->d = h2f(w->d);
        o->dmin = h2f(w->dmin);
    }
}

/* one block's q, in plain C */
static void kq_unpack_q_ref(int kind, const void *blk, uint8_t q[BT_QK_K]) {
    for (int j = 0; j < BT_QK_K; j++) {
        int v;
        if (kind == KQ4 || kind == KQ5) {
            const int g = j / 64, e = j % 64;
            const uint8_t *qs = kind == KQ4 ? ((const bt_block_q4_K *)blk)->qs : ((const bt_block_q5_K *)blk)->qs;
            v = (qs[32 * g + e % 32] >> (4 * (e >= 32))) & 0xF;
            if (kind == KQ5) v |= ((((const bt_block_q5_K *)blk)->qh[e % 32] >> (2 * g + (e >= 32))) & 1) << 4;
        } else if (kind == KQ6) {
            v = q6_get(blk, j);
        } else if (kind == KQ3) {
            const bt_block_q3_K *w = blk;
            v = q2_get(w->qs, j) + 4 * ((w->hmask[j % 32] >> (j / 32)) & 1);
        } else {
            v = q2_get(((const bt_block_q2_K *)blk)->qs, j);
        }
        q[j] = (uint8_t)v;
    }
}

/* the float step of one block (see above) */
static inline float kq_step(bool has_min, float acc, int32_t I, int32_t M, float da, float dw, float dmin) {
    if (has_min) {
        acc = fmaf((float)I, da * dw, acc);
        return fmaf(-(float)M, da * dmin, acc);
    }
    return fmaf((float)(I - M), da * dw, acc);
}

static void dot_kq_ref(int kind, int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q8_K *a = va;
    const size_t bs = kq_block_bytes(kind);
    float acc = 0.0f;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        struct kq_block o;
        const void *blk = (const char *)vw + (size_t)b * bs;
        kq_unpack_scales(kind, blk, &o);
        kq_unpack_q_ref(kind, blk, o.q);
        int32_t I = 0, M = 0;
        for (int sb = 0; sb < 16; sb++) {
            int32_t p = 0;
            for (int e = 16 * sb; e < 16 * sb + 16; e++) p += o.q[e] * a[b].qs[e];
            I += o.sc[sb] * p;
            M += o.mn[sb] * a[b].bsums[sb];
        }
        acc = kq_step(kq_has_min(kind), acc, I, M, a[b].d, o.d, o.dmin);
    }
    *s = acc;
}
static void dot_q2_K_ref(int64_t k, float *s, const void *vw, const void *va) { dot_kq_ref(KQ2, k, s, vw, va); }
static void dot_q3_K_ref(int64_t k, float *s, const void *vw, const void *va) { dot_kq_ref(KQ3, k, s, vw, va); }
static void dot_q4_K_ref(int64_t k, float *s, const void *vw, const void *va) { dot_kq_ref(KQ4, k, s, vw, va); }
static void dot_q5_K_ref(int64_t k, float *s, const void *vw, const void *va) { dot_kq_ref(KQ5, k, s, vw, va); }
static void dot_q6_K_ref(int64_t k, float *s, const void *vw, const void *va) { dot_kq_ref(KQ6, k, s, vw, va); }

/* ---- AVX-512 (BW, VL, VNNI) --------------------------------------------------- *
 * Weights are unpacked to unsigned bytes, multiplied with the signed
 * activation bytes pairwise (vpmaddubsw: at most 2 * 63 * 127 < 32768, no
 * saturation), and the int16 pairs weighted by their sub-block's scale into
 * int32 lanes (vpdpwssd); offsets (Q3_K's 4, Q6_K's 32) come off
 * exactly through the activation sums. */
#if defined(HAVE_QDOT_AVX512) || defined(HAVE_QDOT_AVX2)
/* the byte offset of a K-quant block's d (dmin follows it) */
static inline size_t kq_d_at(const int kind) {
    return kind == KQ2   ? offsetof(bt_block_q2_K, d)
           : kind == KQ3 ? offsetof(bt_block_q3_K, d)
           : kind == KQ6 ? offsetof(bt_block_q6_K, d)
                         : offsetof(bt_block_q4_K, d); /* Q5_K's d and dmin lie there too */
}
/* the float scales d (and dmin) of four rows' blocks at byte offset off,
 * converted together (the AVX2 and AVX-512 decode tiles): each taken alone
 * was a vpinsrw, a vcvtph2ps and a store per row, and a load of the four
 * stores that could not be forwarded */
static inline __attribute__((always_inline)) void kq_d4(const int kind, const void *const *w_rows, const size_t off,
                                                        __m128 *d, __m128 *dmin) {
    const size_t at = kq_d_at(kind);
    uint64_t h[4];
    _Pragma("GCC unroll 4")
    for (int r = 0; r < 4; r++) {
        uint32_t x = 0;
        memcpy(&x, (const char *)w_rows[r] + off + at, kq_has_min(kind) ? 4 : 2); /* d, then dmin */
        h[r] = x;
    }
    if (kq_has_min(kind)) {
        /* halves d0 m0 d1 m1 d2 m2 d3 m3 -> d0..d3 | m0..m3 */
        const __m128i x = _mm_set_epi64x((long long)(h[2] | h[3] << 32), (long long)(h[0] | h[1] << 32));
        const __m256 f = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(x), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        *d = _mm256_castps256_ps128(f);
        *dmin = _mm256_extractf128_ps(f, 1);
    } else {
        *d = _mm_cvtph_ps(_mm_cvtsi64_si128((long long)(h[0] | h[1] << 16 | h[2] << 32 | h[3] << 48)));
        *dmin = _mm_setzero_ps();
    }
}

/* Unlike Q8_0's and Q4_0's groups, read in address order, a Q6_K block's
 * 52 vectors are read out of order (ql, qh and scale vectors by turns), and
 * without a software prefetch the hardware prefetchers left a decode waiting
 * on memory (one 32000 x 2048 product from memory, 1 thread, 4 KiB pages,
 * repacked against plain: 0.38x).
 * So a block's worth of the bytes BT_RP6_PREFETCH ahead of each block's
 * (past the group's end: the next group's, `next`) goes to cache at each
 * block.  Two blocks ahead into L2 gave 1.20-1.24x there (1 block
 * 0.94-1.03x, 3 1.18-1.27x, 4 1.02-1.11x, 8 0.98-1.09x); with the payload
 * rearranged (q6_rp_enc), 2048 bytes ahead into L1 reads 75-76% of the
 * streaming bandwidth with AVX2 (2 threads, from memory; 65-68% so) and
 * 80-87% with AVX-512 (76-78%), as the 32-element types' and Q4_K's tiles
 * (BT_RP_AVX2_PREFETCH, BT_RPK4_PREFETCH) do; the decode tiles issue a
 * sixteenth of those lines at each of their 16 steps (bt_cpu_group_prefetch_part:
 * AVX-512 78-83% -> 89-103%, AVX2 70-76% -> 88-98%). */
#ifndef BT_RP6_PREFETCH
#define BT_RP6_PREFETCH 2048
#endif
/* Q4_K's groups are read in address order, but its decode tiles left as
 * much waiting on memory (2 threads from memory, 73-85% of the streaming
 * bandwidth with AVX-512, 67-80% with AVX2): the bytes BT_RPK4_PREFETCH
 * ahead of each block's go to L1, a block's worth at a time (85-88% and
 * 82% so, on an AVX-512 Xeon), spread over the tile's steps (AVX-512 4,
 * AVX2 8: 1 thread 86-87% -> 96-98%, 2 threads 86-88% -> 91-92%). */
#ifndef BT_RPK4_PREFETCH
#define BT_RPK4_PREFETCH 2048
#endif
/* (part i of n, bt_cpu_group_prefetch_part) */
static inline __attribute__((always_inline)) void rpk4_prefetch(const uint8_t *g, const uint8_t *next, int64_t b,
                                                                size_t gsize, int i, int n) {
    const size_t span = 16 * sizeof(bt_block_q4_K);
    if (BT_RPK4_PREFETCH > 0)
        bt_cpu_group_prefetch_part(g, gsize, next, (size_t)b * span + BT_RPK4_PREFETCH, span, i, n);
}
/* the prefetch above for the block at vof of a group of gsize bytes, part i
 * of n (bt_cpu_group_prefetch_part) */
static inline __attribute__((always_inline)) void rp6_prefetch(const uint8_t *g, const uint8_t *next, size_t vof,
                                                               size_t gsize, int i, int n) {
    if (BT_RP6_PREFETCH > 0)
        bt_cpu_group_prefetch_part(g, gsize, next, vof + BT_RP6_PREFETCH, 16 * sizeof(bt_block_q6_K), i, n);
}
/* column c's sums of 32 (bsums[2j] + bsums[2j+1], j = 0..7) of block b as
 * int16 pairs: s[0] = (S0, S2), s[1] = (S1, S3), s[2] = (S4, S6), s[3] = (S5, S7) */
static inline void k4_sum_pairs(const bt_block_q8_K *a, uint32_t s[4]) {
    uint16_t S[8];
    for (int j = 0; j < 8; j++) S[j] = (uint16_t)(a->bsums[2 * j] + a->bsums[2 * j + 1]);
    s[0] = S[0] | (uint32_t)S[2] << 16;
    s[1] = S[1] | (uint32_t)S[3] << 16;
    s[2] = S[4] | (uint32_t)S[6] << 16;
    s[3] = S[5] | (uint32_t)S[7] << 16;
}

/* ---- K-quant packed GEMM (prompt-size products) ----------------------------- *
 * matmul.c packs 16 weight rows at a time (a panel, in the thread's work
 * buffer) and runs every column against it.  Per block, the panel holds
 *   bytes 0..4095     q, 4-element group g of row r at 64g + 4r (a lane per row)
 *   4096..4351        sc: int32 16w + r holds the int8 scales of row r's
 *                     sub-blocks 4w .. 4w+3 (byte i: sub-block 4w + i)
 *   4352..4863        mn: int32 16j + r = row r's mn[2j] | mn[2j+1] << 16
 *   4864..4927        d, 4928..4991 dmin (float, row r at r)
 * that is, after q, the 16 x 14 words of each row's struct kq_block from sc
 * on, transposed.
 * and the kernel keeps a lane per row: vpdpbusd of 4 unsigned weight bytes
 * with 4 broadcast activation bytes, one sub-block at a time, times its
 * scale (vpmulld) into I; vpdpwssd of the mins with the activation sums into
 * M; then kq_step in float lanes.  The same integers as the dot, so the same
 * bits.  (The AVX-512 kernel below; AVX2's, on the same panel, further on.) */
#define KQ_PB 4992 /* bytes of one block of a 16-row panel */

static size_t kq_panel_size(int64_t k) { return (size_t)(k / BT_QK_K) * KQ_PB; }

/* one block's q (as kq_unpack_q_ref), 32 values per 256-bit step */
static inline __attribute__((always_inline)) void kq_unpack_q_avx(const int kind, const void *blk, uint8_t *q) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
#define SRL8(v, n) _mm256_srl_epi16((v), _mm_cvtsi32_si128(n)) /* bytes >> n, n < 8, before masking */
    if (kind == KQ4 || kind == KQ5) {
        const uint8_t *qs = kind == KQ4 ? ((const bt_block_q4_K *)blk)->qs : ((const bt_block_q5_K *)blk)->qs;
        const __m256i qh =
            kind == KQ5 ? _mm256_loadu_si256((const __m256i *)((const bt_block_q5_K *)blk)->qh) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (kind == KQ5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(SRL8(qh, 2 * g), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(SRL8(qh, 2 * g + 1), one), 4));
            }
            _mm256_store_si256((__m256i *)(q + 64 * g), lo);
            _mm256_store_si256((__m256i *)(q + 64 * g + 32), hi);
        }
    } else if (kind == KQI4) {
        const bt_block_iq4_xs *w = blk;
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_xor_si128(
            _mm_loadu_si128((const __m128i *)bt_iq4nl_values), _mm_set1_epi8((char)0x80))); /* levels + 128 */
        for (int s = 0; s < 8; s++) { /* sub-block s: the low nibbles of its 16 bytes, then the high */
            const __m128i x = _mm_loadu_si128((const __m128i *)(w->qs + 16 * s));
            const __m256i n = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), m4);
            _mm256_store_si256((__m256i *)(q + 32 * s), _mm256_shuffle_epi8(lut, n));
        }
    } else if (kind == KQ6) {
        const bt_block_q6_K *w = blk;
        for (int h = 0; h < 2; h++) {
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * h));
            for (int sb = 0; sb < 4; sb++) {
                const __m256i ql = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h + 32 * (sb & 1)));
                const __m256i lo = _mm256_and_si256(SRL8(ql, 4 * (sb >> 1)), m4);
                const __m256i hi = _mm256_and_si256(SRL8(qh, 2 * sb), m3);
                _mm256_store_si256((__m256i *)(q + 128 * h + 32 * sb), _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
            }
        }
    } else {
        const uint8_t *qs = kind == KQ3 ? ((const bt_block_q3_K *)blk)->qs : ((const bt_block_q2_K *)blk)->qs;
        const __m256i hm =
            kind == KQ3 ? _mm256_loadu_si256((const __m256i *)((const bt_block_q3_K *)blk)->hmask) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int sh = 0; sh < 4; sh++) {
                __m256i x = _mm256_and_si256(SRL8(v, 2 * sh), m3);
                if (kind == KQ3) x = _mm256_add_epi8(x, _mm256_slli_epi16(_mm256_and_si256(SRL8(hm, 4 * h + sh), one), 2));
                _mm256_store_si256((__m256i *)(q + 128 * h + 32 * sh), x);
            }
        }
    }
#undef SRL8
}

#ifdef BT_CPU_IQ_GEMM
static enum bt_type kq_iq_type(int kind) {
    switch (kind) {
    case KQI2XXS: return BT_TYPE_IQ2_XXS;
    case KQI2XS: return BT_TYPE_IQ2_XS;
    case KQI2S: return BT_TYPE_IQ2_S;
    case KQI3XXS: return BT_TYPE_IQ3_XXS;
    case KQI3S: return BT_TYPE_IQ3_S;
    default: return BT_TYPE_IQ1_S;
    }
}
#endif

/* one block's scales, mins and float scales (kq_unpack_scales) and q */
static inline __attribute__((always_inline)) void kq_unpack_block(const int kind, const void *blk, struct kq_block *o,
                                                                  uint8_t *q) {
#ifdef BT_CPU_IQ_GEMM
    if (kq_lattice(kind)) {
        bt_cpu_iq_unpack(kq_iq_type(kind), blk, q, o->sc, &o->d);
        for (int s = 0; s < 16; s++) o->mn[s] = (int16_t)(128 * o->sc[s]);
        o->dmin = 0.0f;
        return;
    }
#endif
    kq_unpack_scales(kind, blk, o);
    kq_unpack_q_avx(kind, blk, q);
}

/* A panel from 16 plain rows, block by block through pack_block (the
 * AVX-512 or the AVX2 one: the same bytes) */
typedef void kq_pack_block_fn(int kind, const void *const *blks, uint8_t *pb);
static inline __attribute__((always_inline)) void kq_pack(const int kind, int64_t k, const void *const *rows,
                                                          void *panel, kq_pack_block_fn *pack_block) {
    const size_t bs = kq_block_bytes(kind);
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const void *blks[16];
        for (int r = 0; r < 16; r++) blks[r] = (const char *)rows[r] + (size_t)b * bs;
        pack_block(kind, blks, (uint8_t *)panel + (size_t)b * KQ_PB);
    }
}

/* q6_rp_fourth on AVX2: bits 6, 7 of x0, x1, x2 masked, then moved to bits
 * 0..1, 2..3, 4..5 */
static inline __attribute__((always_inline)) __m256i q6_rp_fourth_avx2(__m256i x0, __m256i x1, __m256i x2) {
    const __m256i hi2 = _mm256_set1_epi8((char)0xC0);
    const __m256i t = _mm256_or_si256(_mm256_srli_epi16(_mm256_and_si256(x0, hi2), 2), _mm256_and_si256(x1, hi2));
    return _mm256_srli_epi16(_mm256_or_si256(_mm256_srli_epi16(t, 2), _mm256_and_si256(x2, hi2)), 2);
}
/* the values of a sub-block's vector j of quarter p, bytes 32 hf .. of each
 * (v: the block's vectors) */
static inline __attribute__((always_inline)) __m256i q6_rp_values_avx2(const uint8_t *v, const int j, const int p,
                                                                      const int hf) {
    const uint8_t *x = v + 64 * 3 * j + 32 * hf;
    if (p < 3) return _mm256_and_si256(_mm256_load_si256((const __m256i *)(x + 64 * p)), _mm256_set1_epi8(0x3F));
    return q6_rp_fourth_avx2(_mm256_load_si256((const __m256i *)x), _mm256_load_si256((const __m256i *)(x + 64)),
                             _mm256_load_si256((const __m256i *)(x + 128)));
}

/* The same panel from a repacked Q6_K group (rp_q6_K): group g = 16p + j of
 * the panel's q is the group's vector 3j + p's values as they stand (a lane
 * per row), the rest each row's scales and d through kq_unpack_scales.
 * With enough columns this is cheaper than the repacked kernel (rgemm),
 * which takes the values apart again for every few columns; the GEMM gives
 * the same bits. */
static void rpack_q6_K(int64_t k, const void *group, void *panel) {
    const int64_t nblk = k / BT_QK_K;
    for (int64_t b = 0; b < nblk; b++) {
        uint8_t *pb = (uint8_t *)panel + (size_t)b * KQ_PB;
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, sizeof(bt_block_q6_K), 2, &dof, &vof);
        const uint8_t *v = (const uint8_t *)group + vof;
        for (int g = 0; g < 64; g++)
            for (int hf = 0; hf < 2; hf++)
                _mm256_storeu_si256((__m256i *)(pb + 64 * g + 32 * hf), q6_rp_values_avx2(v, g % 16, g / 16, hf));
        for (int r = 0; r < 16; r++) {
            bt_block_q6_K w;
            for (int s = 0; s < 16; s++) w.scales[s] = (int8_t)v[64 * (48 + s / 4) + 4 * r + s % 4];
            memcpy(&w.d, (const uint8_t *)group + dof + 2 * r, sizeof w.d);
            struct kq_block o;
            kq_unpack_scales(KQ6, &w, &o);
            o.dmin = 0.0f;
            for (int wd = 0; wd < 14; wd++) memcpy(pb + 4096 + 64 * wd + 4 * r, (const uint8_t *)o.sc + 4 * wd, 4);
        }
    }
}

/* The K-quant GEMMs' entry points (qtypes.h's pack and gemm) for each type
 * of the panel: qpack_NAME through pack_block, qgemm_NAME in column tiles
 * (COL_TILES: BT_CPU_COL_TILES or BT_CPU_COL_TILES4) of TILE(RN, j), which
 * sees kind_, k, panel, acts, dcols, row0 and nrows */
#define KQ_GEMM_FNS(name, kind, pack_block, COL_TILES, TILE)                                       \
    static void qpack_##name(int64_t k, const void *const *rows, void *panel) {                   \
        kq_pack(kind, k, rows, panel, pack_block);                                                \
    }                                                                                             \
    static void qgemm_##name(int64_t k, const void *panel, const void *const *acts, int64_t ncols, \
                             float *const *dcols, int64_t row0, int nrows) {                      \
        const int kind_ = kind;                                                                   \
        COL_TILES(ncols, TILE);                                                                   \
    }
#define KQ_GEMMS(pack_block, COL_TILES, TILE)                 \
    KQ_GEMM_FNS(q2_K, KQ2, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(q3_K, KQ3, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(q4_K, KQ4, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(q5_K, KQ5, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(q6_K, KQ6, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(iq4_xs, KQI4, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(iq2_xxs, KQI2XXS, pack_block, COL_TILES, TILE)   \
    KQ_GEMM_FNS(iq2_xs, KQI2XS, pack_block, COL_TILES, TILE)     \
    KQ_GEMM_FNS(iq2_s, KQI2S, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(iq3_xxs, KQI3XXS, pack_block, COL_TILES, TILE)   \
    KQ_GEMM_FNS(iq3_s, KQI3S, pack_block, COL_TILES, TILE)       \
    KQ_GEMM_FNS(iq1_s, KQI1S, pack_block, COL_TILES, TILE)
#define KQ_GEMM_MIN_COLS 16
#define K_GEMM(name) KQ_GEMM_MIN_COLS, kq_panel_size, qpack_##name, qgemm_##name
#endif

#ifdef HAVE_QDOT_AVX512

/* fp16 -> fp32 with F16C (exact, as bt_fp16_to_fp32, for every finite value) */
static inline float h2f_fast(bt_fp16_t h) { return _cvtsh_ss(h); }

#define UPPER16 ((__mmask32)0xFFFF0000u) /* the upper 256 bits, in 16-bit lanes */
#define LOWER16 ((__mmask32)0x0000FFFFu) /* the lower 256 bits, in 16-bit lanes */
#define UPPER8 ((__mmask64)0xFFFFFFFF00000000ull) /* the same, in bytes */

/* 32 bytes broadcast to both halves of a 512-bit vector */
static inline __m512i bcast32(const uint8_t *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
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

/* One block's float step (kq_step) for n dots at once: dot i has the
 * integers I = the sum of iv[i]'s 16 int32 lanes, M = the sum of mv[i]'s 8
 * (exact, so how the lanes are grouped does not matter: four dots at a time
 * through a transpose of unpacks and adds, three fewer shuffles a dot than
 * horizontal adds), the scales da[i], dw[i], dm[i] and the accumulator
 * acc[i]; the same float operations as kq_step, 4 lanes wide. */
static inline __attribute__((always_inline)) void kq_step_n(const int n, const bool has_min, const __m512i *iv,
                                                            const __m256i *mv, const float *da, const float *dw,
                                                            const float *dm, float *acc) {
    _Pragma("GCC unroll 4")
    for (int i0 = 0; i0 < n; i0 += 4) {
        __m512i f[4];
        __m256i m[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < 4; j++) {
            const int i = i0 + j < n ? i0 + j : i0;
            f[j] = iv[i];
            m[j] = mv[i];
        }
        /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3], [c.., d..], then [a, b, c, d] */
        const __m512i f01 = _mm512_add_epi32(_mm512_unpacklo_epi32(f[0], f[1]), _mm512_unpackhi_epi32(f[0], f[1]));
        const __m512i f23 = _mm512_add_epi32(_mm512_unpacklo_epi32(f[2], f[3]), _mm512_unpackhi_epi32(f[2], f[3]));
        const __m512i fl = _mm512_add_epi32(_mm512_unpacklo_epi64(f01, f23), _mm512_unpackhi_epi64(f01, f23));
        const __m256i fh = _mm256_add_epi32(_mm512_castsi512_si256(fl), _mm512_extracti64x4_epi64(fl, 1));
        const __m256i m01 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[0], m[1]), _mm256_unpackhi_epi32(m[0], m[1]));
        const __m256i m23 = _mm256_add_epi32(_mm256_unpacklo_epi32(m[2], m[3]), _mm256_unpackhi_epi32(m[2], m[3]));
        const __m256i ma = _mm256_add_epi32(_mm256_unpacklo_epi64(m01, m23), _mm256_unpackhi_epi64(m01, m23));
        const __m128i I = _mm_add_epi32(_mm256_castsi256_si128(fh), _mm256_extracti128_si256(fh, 1));
        const __m128i M = _mm_add_epi32(_mm256_castsi256_si128(ma), _mm256_extracti128_si256(ma, 1));
        const int nn = n - i0 < 4 ? n - i0 : 4;
        const __mmask8 lm = (__mmask8)((1u << nn) - 1u);
        const __m128 a = _mm_maskz_loadu_ps(lm, da + i0);
        __m128 x = _mm_maskz_loadu_ps(lm, acc + i0);
        if (has_min) {
            x = _mm_fmadd_ps(_mm_cvtepi32_ps(I), _mm_mul_ps(a, _mm_maskz_loadu_ps(lm, dw + i0)), x);
            x = _mm_fnmadd_ps(_mm_cvtepi32_ps(M), _mm_mul_ps(a, _mm_maskz_loadu_ps(lm, dm + i0)), x);
        } else {
            x = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_sub_epi32(I, M)), _mm_mul_ps(a, _mm_maskz_loadu_ps(lm, dw + i0)), x);
        }
        _mm_mask_storeu_ps(acc + i0, lm, x);
    }
}

/* The float scales of an RM x RN tile's block b for kq_step_n (dot (r, c)
 * at c RM + r): the columns' da, the rows' dw and dm (0 without mins).  Four
 * rows' fp16 scales convert together (kq_d4) and go out in 4-lane stores,
 * which kq_step_n's 4-lane loads take from the store buffer; from four
 * scalar stores each they could not, and waited (the Q2_K decode row 1.13x
 * faster, 1 thread, from the cache). */
static inline __attribute__((always_inline)) void kq_tile_scales(const int kind, const int RM, const int RN,
                                                                 const void *const *w_rows, int64_t b,
                                                                 const bt_block_q8_K *const *ab, float *da,
                                                                 float *dw, float *dm) {
    const size_t off = (size_t)b * kq_block_bytes(kind);
    if (RM == 4) {
        __m128 d4, m4;
        kq_d4(kind, w_rows, off, &d4, &m4);
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            _mm_storeu_ps(da + 4 * c, _mm_set1_ps(ab[c]->d));
            _mm_storeu_ps(dw + 4 * c, d4);
            _mm_storeu_ps(dm + 4 * c, m4);
        }
        return;
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            const bt_fp16_t *h = (const bt_fp16_t *)((const char *)w_rows[r] + off + kq_d_at(kind));
            da[c * RM + r] = ab[c]->d;
            dw[c * RM + r] = h2f_fast(h[0]);
            dm[c * RM + r] = kq_has_min(kind) ? h2f_fast(h[1]) : 0.0f;
        }
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
};

/* An RM x RN tile of Q4_K (qh false) or Q5_K rows against Q8_K columns: the
 * block's I and M of dot_kq_ref in 16 int32 lanes (scales applied per int16
 * pair by vpdpwssd), reduced per block, then kq_step. */
static inline __attribute__((always_inline)) void q45_K_tile(int64_t k, const void *const *w_rows,
                                                             const void *const *acts, const void *const *next, float *out,
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
    float acc[16] = {0}; /* dot (r, c) at c * RM + r */
    const size_t bs = q5 ? sizeof(bt_block_q5_K) : sizeof(bt_block_q4_K);
    const int block = bt_cpu_tile_block_kind(w_rows, next, k / BT_QK_K, bs, RM);
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        bt_cpu_tile_prefetch(w_rows, next, block, b, k / BT_QK_K, bs, RM);
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
        __m512i iv[16];
        __m256i mv[16];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)ab[c]->bsums);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < RM; r++) {
                iv[c * RM + r] = isum[r][c];
                mv[c * RM + r] = _mm256_madd_epi16(kr[r].mins, bsums);
            }
        }
        float da[16], dw[16], dm[16];
        kq_tile_scales(q5 ? KQ5 : KQ4, RM, RN, w_rows, b, ab, da, dw, dm);
        kq_step_n(RM * RN, true, iv, mv, da, dw, dm, acc);
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = acc[c * RM + r];
}

/* An RM x RN tile of Q2_K, Q3_K or Q6_K rows (16-element sub-blocks) against
 * Q8_K columns, computing dot_kq_ref's integers as q45_K_tile does. */
static inline __attribute__((always_inline)) void q236_K_tile(int64_t k, const void *const *w_rows,
                                                              const void *const *acts, const void *const *next, float *out,
                                                              const int RM, const int RN, const int kind) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(3);
    /* int16 lane i of chunk g covers elements 64g + 2i, +1: sub-block 4g + i / 8 */
    const __m512i eighth = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11,
                         10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        3);
    float acc[16] = {0}; /* dot (r, c) at c * RM + r */
    const int block = bt_cpu_tile_block_kind(w_rows, next, k / BT_QK_K, kq_block_bytes(kind), RM);
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        bt_cpu_tile_prefetch(w_rows, next, block, b, k / BT_QK_K, kq_block_bytes(kind), RM);
        const bt_block_q8_K *ab[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) ab[c] = (const bt_block_q8_K *)acts[c] + b;
        const bt_block_q6_K *wb[4];
        const bt_block_q3_K *w3[4];
        const bt_block_q2_K *w2[4];
        __m512i table[4];
        __m256i sc16[4], mn16[4];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            if (kind == KQ6) {
                wb[r] = (const bt_block_q6_K *)w_rows[r] + b;
                sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)wb[r]->scales));
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
            } else {
                w2[r] = (const bt_block_q2_K *)w_rows[r] + b;
                const __m128i raw = _mm_loadu_si128((const __m128i *)w2[r]->scales);
                sc16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0F)));
                mn16[r] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
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
        __m512i iv[16];
        __m256i mv[16];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)ab[c]->bsums);
            _Pragma("GCC unroll 4")
            for (int r = 0; r < RM; r++) {
                iv[c * RM + r] = isum[r][c];
                if (kind == KQ2) {
                    mv[c * RM + r] = _mm256_madd_epi16(mn16[r], bsums);
                } else { /* the offset (32, Q3_K's 4) times sc[s] bsums[s] */
                    const __m256i sb = _mm256_madd_epi16(sc16[r], bsums);
                    mv[c * RM + r] = kind == KQ6 ? _mm256_slli_epi32(sb, 5) : _mm256_slli_epi32(sb, 2);
                }
            }
        }
        float da[16], dd[16], dm[16];
        kq_tile_scales(kind, RM, RN, w_rows, b, ab, da, dd, dm);
        kq_step_n(RM * RN, kind == KQ2, iv, mv, da, dd, dm, acc);
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = acc[c * RM + r];
}

#if defined(__AVX512VBMI__)
/* Q3_K's 16 6-bit scales less 32 (bt_q3_K_scales) as int16 lanes: sub-block
 * s has its low 4 bits in byte s % 8 at bit 4 (s / 8), its high 2 in byte
 * 8 + s % 4 at bit 2 (s / 4).  vpermb puts those two bytes in lane s;
 * gf2p8affineqb moves, in each byte of the quadword of sub-blocks 4t ..
 * 4t + 3, bits 4 (t / 2) .. +3 to bits 0..3 and bits 2t, 2t + 1 to bits 4, 5
 * (byte 7 - i of a quadword's matrix selects output bit i); the low byte's
 * bits 0..3 and the high byte's 4, 5 are the scale.  The masked load reads
 * the 12 bytes only. */
static inline __m256i q3_K_scales16(const uint8_t *scales) {
    const __m256i raw = _mm256_zextsi128_si256(_mm_maskz_loadu_epi8(0x0FFF, scales));
    const __m256i idx = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 8, 5, 9, 6, 10, 7, 11, 0, 8, 1, 9, 2, 10, 3, 11,
                                         4, 8, 5, 9, 6, 10, 7, 11);
#define Q3_SC_MAT(t)                                                                                    \
    (0x01ull << (56 + 4 * ((t) / 2)) | 0x02ull << (48 + 4 * ((t) / 2)) | 0x04ull << (40 + 4 * ((t) / 2)) | \
     0x08ull << (32 + 4 * ((t) / 2)) | 0x01ull << (24 + 2 * (t)) | 0x02ull << (16 + 2 * (t)))
    const __m256i mat = _mm256_setr_epi64x((long long)Q3_SC_MAT(0), (long long)Q3_SC_MAT(1), (long long)Q3_SC_MAT(2),
                                           (long long)Q3_SC_MAT(3));
#undef Q3_SC_MAT
    const __m256i v = _mm256_gf2p8affine_epi64_epi8(_mm256_permutexvar_epi8(idx, raw), mat, 0);
    /* bits 0..3 from v's low byte, the rest from its high byte's result */
    const __m256i sc = _mm256_ternarylogic_epi32(v, _mm256_srli_epi16(v, 8), _mm256_set1_epi16(0x0F), 0xE4);
    return _mm256_sub_epi16(sc, _mm256_set1_epi16(32));
}

/* gf2p8affineqb's matrix taking input bits a, b (and c) of each byte to
 * output bits 0, 1 (and 2), the others 0 (byte 7 - i of the quadword selects
 * output bit i) */
#define BIT_MAT2(a, b) ((long long)(1ull << (56 + (a)) | 1ull << (48 + (b))))
#define BIT_MAT(a, b, c) (BIT_MAT2(a, b) | (long long)(1ull << (40 + (c))))

/* Q2_K: chunk j's 2-bit fields (bits 2j, 2j + 1 of each byte of q) at bits
 * 0, 1, and j at bits 2, 3: the index of a weight's product in vpshufb's
 * table of its 128-bit lane.  The constant is an immediate, hence the cases. */
static inline __attribute__((always_inline)) __m512i q2_field(__m512i q, const int j) {
    switch (j) {
    case 0: return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(BIT_MAT2(0, 1)), 0);
    case 1: return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(BIT_MAT2(2, 3)), 4);
    case 2: return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(BIT_MAT2(4, 5)), 8);
    default: return _mm512_gf2p8affine_epi64_epi8(q, _mm512_set1_epi64(BIT_MAT2(6, 7)), 12);
    }
}

/* Q3_K: chunk j's weights less their offset, 0..7 (the 2-bit field plus 4
 * where the high bit is set), from q23_K_tile's v1 (j < 2: fields at bits
 * 2j, 2j + 1, high bits at 4 + j) or v2 (fields at 2j, 2j + 1, high bits at j) */
static inline __attribute__((always_inline)) __m512i q3_field(__m512i v, const int j) {
    const long long m = j == 0 ? BIT_MAT(0, 1, 4) : j == 1 ? BIT_MAT(2, 3, 5) : j == 2 ? BIT_MAT(4, 5, 2)
                                                                                   : BIT_MAT(6, 7, 3);
    return _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(m), 0);
}

/* An RM x RN tile of Q2_K or Q3_K rows against Q8_K columns, their 64 quant
 * bytes in one vector: byte L holds, in bits 2j .. 2j+1, element
 * 128 (L / 32) + 32 j + L % 32, so chunk j's activations are the two
 * 32-byte runs from 32 j and 128 + 32 j, and each 128-bit lane of a chunk
 * lies in one sub-block (q23_unpack loaded both halves' bytes, and Q3_K's
 * hmask, again per chunk).
 * Q2_K: a weight's 2-bit q times its sub-block's 4-bit scale is at most
 * 45, a byte.  A row's block gets, in each 128-bit lane, a table of the
 * four chunks' sc q at 4 j + q; vpshufb looks each weight's product up by
 * the index q | 4 j (one gf2p8affineqb, q2_field) and vpdpbusd multiplies
 * it by the activations: three instructions per 64 weights, where
 * q236_K_tile's vpmaddubsw and vpdpwssd with the scales in int16 lanes took
 * six or seven.
 * Q3_K: its scales' products do not fit a byte.  Once a block the high bits
 * (bit 4 (L / 32) + j of hmask byte L % 32) are merged into two copies of
 * the quant bytes, beside chunks 0 and 1's fields and beside 2 and 3's;
 * a chunk's 3-bit values are then one gf2p8affineqb (q3_field), its scales
 * one vpshufb of the block's (q3_K_scales16), then vpmaddubsw and vpdpwssd.
 * I and M are dot_kq_ref's (exact sums, in any order), then kq_step: the
 * same bits. */
static inline __attribute__((always_inline)) void q23_K_tile(int64_t k, const void *const *w_rows,
                                                             const void *const *acts, const void *const *next,
                                                             float *out, const int RM, const int RN, const int kind) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), hi4 = _mm512_set1_epi8((char)0xF0);
    /* Q2_K, table byte 16 t + 4 j + v: the sub-block of chunk j in 128-bit lane t, 8 (t / 2) + 2 j + t % 2 */
#define B4(x) ((x) * 0x01010101)
    const __m512i q2_sub = _mm512_setr_epi32(B4(0), B4(2), B4(4), B4(6), B4(1), B4(3), B4(5), B4(7), B4(8), B4(10),
                                             B4(12), B4(14), B4(9), B4(11), B4(13), B4(15));
#undef B4
    const __mmask64 q_odd = 0xAAAAAAAAAAAAAAAAull, q_two = 0xCCCCCCCCCCCCCCCCull;
    /* Q3_K, int16 word 8 t + j (j < 4): sub-block 8 (t / 2) + 2 j + t % 2 */
    const __m512i q3_sub = _mm512_setr_epi64(0x0006000400020000, 0, 0x0007000500030001, 0, 0x000E000C000A0008, 0,
                                             0x000F000D000B0009, 0);
    float acc[16] = {0}; /* dot (r, c) at c * RM + r */
    const size_t bs = kq_block_bytes(kind);
    const int block = bt_cpu_tile_block_kind(w_rows, next, k / BT_QK_K, bs, RM);
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        bt_cpu_tile_prefetch(w_rows, next, block, b, k / BT_QK_K, bs, RM);
        const bt_block_q8_K *ab[4];
        __m512i av[4][4]; /* column c, chunk j */
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                const __m256i lo = _mm256_loadu_si256((const __m256i *)(ab[c]->qs + 32 * j));
                const __m256i hi = _mm256_loadu_si256((const __m256i *)(ab[c]->qs + 128 + 32 * j));
                av[c][j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            }
        }
        __m512i iv[16];
        __m256i mv[16];
        float da[16], dd[16], dm[16];
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            const uint8_t *w = (const uint8_t *)w_rows[r] + (size_t)b * bs;
            const bt_block_q2_K *w2 = (const bt_block_q2_K *)w;
            const bt_block_q3_K *w3 = (const bt_block_q3_K *)w;
            __m512i table, v1 = _mm512_setzero_si512(), v2 = _mm512_setzero_si512();
            __m256i m16; /* Q2_K: the mins; Q3_K: the scales (the offset 4 times sc[s] bsums[s]) */
            const __m512i q = _mm512_loadu_si512(kind == KQ2 ? w2->qs : w3->qs);
            if (kind == KQ2) {
                const __m128i raw = _mm_loadu_si128((const __m128i *)w2->scales);
                const __m512i sc = _mm512_and_si512(_mm512_permutexvar_epi8(q2_sub, _mm512_castsi128_si512(raw)), m4);
                table = _mm512_maskz_mov_epi8(q_odd, sc);
                table = _mm512_mask_add_epi8(table, q_two, table, _mm512_add_epi8(sc, sc));
                m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
            } else {
                m16 = q3_K_scales16(w3->scales);
                /* int16 word j of 128-bit lane t: the scale of chunk j's sub-block there, 8 (t / 2) + 2 j + t % 2 */
                table = _mm512_permutexvar_epi16(q3_sub, _mm512_zextsi256_si512(m16));
                /* the high bits of byte L's four elements, hmask bits 4 (L / 32) .. +3: at bits 4..7 of v1, below
                 * chunks 0 and 1's fields, and at bits 0..3 of v2, below chunks 2 and 3's */
                const __m512i hm = bcast32(w3->hmask);
                v1 = _mm512_ternarylogic_epi32(q, _mm512_mask_slli_epi16(hm, LOWER16, hm, 4), m4, 0xE4);
                v2 = _mm512_ternarylogic_epi32(q, _mm512_mask_srli_epi16(hm, UPPER16, hm, 4), hi4, 0xE4);
            }
            __m512i isum[4];
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) isum[c] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int j = 0; j < 4; j++) {
                if (kind == KQ2) {
                    const __m512i prod = _mm512_shuffle_epi8(table, q2_field(q, j));
                    _Pragma("GCC unroll 4")
                    for (int c = 0; c < RN; c++) isum[c] = _mm512_dpbusd_epi32(isum[c], prod, av[c][j]);
                } else {
                    const __m512i x3 = q3_field(j < 2 ? v1 : v2, j);
                    const __m512i scv =
                        _mm512_shuffle_epi8(table, _mm512_set1_epi16((short)(2 * j | (2 * j + 1) << 8)));
                    _Pragma("GCC unroll 4")
                    for (int c = 0; c < RN; c++)
                        isum[c] = _mm512_dpwssd_epi32(isum[c], _mm512_maddubs_epi16(x3, av[c][j]), scv);
                }
            }
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) {
                iv[c * RM + r] = isum[c];
                const __m256i mb = _mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)ab[c]->bsums));
                mv[c * RM + r] = kind == KQ2 ? mb : _mm256_slli_epi32(mb, 2);
            }
        }
        kq_tile_scales(kind, RM, RN, w_rows, b, ab, da, dd, dm);
        kq_step_n(RM * RN, kind == KQ2, iv, mv, da, dd, dm, acc);
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = acc[c * RM + r];
}
#define CALL_Q3_K(RM, RN) q23_K_tile(k, w, a, next, out, RM, RN, KQ3)
#define CALL_Q2_K(RM, RN) q23_K_tile(k, w, a, next, out, RM, RN, KQ2)
#else
#define CALL_Q3_K(RM, RN) q236_K_tile(k, w, a, next, out, RM, RN, KQ3)
#define CALL_Q2_K(RM, RN) q236_K_tile(k, w, a, next, out, RM, RN, KQ2)
#endif

#define K_TILES(name, call)                                                                          \
    static void qtile_##name##_4x1(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        call(4, 1);                                                                                  \
    }                                                                                                \
    static void qtile_##name##_4x2(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        call(4, 2);                                                                                  \
    }                                                                                                \
    static void qtile_##name##_2x4(int64_t k, const void *const *w, const void *const *a,            \
                                   const void *const *next, float *out) {                            \
        call(2, 4);                                                                                  \
    }                                                                                                \
    static void dot_##name##_avx512(int64_t k, float *s, const void *vw, const void *va) {           \
        const void *const *w = &vw, *const *a = &va, *const *next = NULL;                            \
        float *out = s;                                                                              \
        call(1, 1);                                                                                  \
    }
#define CALL_Q4_K(RM, RN) q45_K_tile(k, w, a, next, out, RM, RN, false)
#define CALL_Q5_K(RM, RN) q45_K_tile(k, w, a, next, out, RM, RN, true)
#define CALL_Q6_K(RM, RN) q236_K_tile(k, w, a, next, out, RM, RN, KQ6)
K_TILES(q4_K, CALL_Q4_K)
K_TILES(q5_K, CALL_Q5_K)
K_TILES(q6_K, CALL_Q6_K)
K_TILES(q3_K, CALL_Q3_K)
K_TILES(q2_K, CALL_Q2_K)
#define K_TILE_LIST(name) {{4, 1, qtile_##name##_4x1}, {4, 2, qtile_##name##_4x2}, {2, 4, qtile_##name##_2x4}, {0, 0, NULL}}

/* ---- Q4_K repacked (qtypes.h's layout, rp_q4_K) ------------------------------- *
 * A block's scale is its d and dmin (4 bytes), its 35 payload dwords the 12
 * scale bytes (vectors 0..2) and the 128 quant bytes (vectors 3..34).  Per
 * block, for the group's 16 rows at once (a lane per row): the 8 scales and
 * mins unpacked from vectors 0..2 with q4_K_scales16's arithmetic; per
 * sub-block pair g the low (sub-block 2g) and high (2g+1) nibbles of
 * vectors 3+8g .. 3+8g+7 against the activation's 4 bytes broadcast
 * (vpdpbusd), each sub-block's sum times its scale (vpmulld) into I; M from
 * the mins as int16 pairs against pairs of the activation's sums of 32
 * (vpdpwssd); then kq_step in float lanes.  The integers of dot_kq_ref, so
 * the same bits as the plain rows. */


static inline __attribute__((always_inline)) void rp_k4_tile(const int RN, int64_t k, const uint8_t *g,
                                                             const uint8_t *next, const void *const *acts,
                                                             float *const *dcols, int64_t row0) {
    const int64_t nblk = k / BT_QK_K;
    const size_t gsize = (size_t)nblk * 16 * sizeof(bt_block_q4_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x3F), m2 = _mm512_set1_epi8(0x03);
    const __m512i lo16 = _mm512_set1_epi32(0x00FF00FF), lo16w = _mm512_set1_epi32(0xFFFF), ff = _mm512_set1_epi32(0xFF);
    __m512 acc[8];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, sizeof(bt_block_q4_K), 4, &dof, &vof);
        const uint8_t *v = g + vof;
        const __m512i dd = _mm512_load_si512(g + dof);
        const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(dd, lo16w)));
        const __m512 dm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        const __m512i u0 = _mm512_load_si512(v), u1 = _mm512_load_si512(v + 64), u2 = _mm512_load_si512(v + 128);
        /* bytes: sc0..3, sc4..7, m0..3, m4..7 (q4_K_scales16) */
        const __m512i s03 = _mm512_and_si512(u0, m6);
        const __m512i s47 = _mm512_or_si512(_mm512_and_si512(u2, m4),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), m2), 4));
        const __m512i n03 = _mm512_and_si512(u1, m6);
        const __m512i n47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), m2), 4));
        /* mins as int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) */
        const __m512i mp[4] = {_mm512_and_si512(n03, lo16), _mm512_and_si512(_mm512_srli_epi32(n03, 8), lo16),
                               _mm512_and_si512(n47, lo16), _mm512_and_si512(_mm512_srli_epi32(n47, 8), lo16)};
        const bt_block_q8_K *ab[8];
        __m512i I[8], M[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            uint32_t sp[4];
            k4_sum_pairs(ab[c], sp);
            M[c] = _mm512_setzero_si512();
            _Pragma("GCC unroll 4")
            for (int i = 0; i < 4; i++) M[c] = _mm512_dpwssd_epi32(M[c], mp[i], _mm512_set1_epi32((int)sp[i]));
            I[c] = _mm512_setzero_si512();
        }
        if (RN <= 4) { /* a pair of sub-blocks from each load: both nibbles */
            _Pragma("GCC unroll 4")
            for (int gq = 0; gq < 4; gq++) {
                if (RN <= 2) rpk4_prefetch(g, next, b, gsize, gq, 4);
                const __m512i sw = gq < 2 ? s03 : s47; /* sub-blocks 2gq, 2gq+1: bytes 2(gq%2), +1 */
                const __m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(sw, 16 * (gq % 2)), ff);
                const __m512i sc_hi = _mm512_and_si512(_mm512_srli_epi32(sw, 16 * (gq % 2) + 8), ff);
                __m512i plo[4], phi[4];
                _Pragma("GCC unroll 4")
                for (int c = 0; c < RN; c++) plo[c] = phi[c] = _mm512_setzero_si512();
                _Pragma("GCC unroll 8")
                for (int i = 0; i < 8; i++) {
                    const __m512i q = _mm512_load_si512(v + (size_t)(3 + 8 * gq + i) * 64);
                    const __m512i ql = _mm512_and_si512(q, m4), qh = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    _Pragma("GCC unroll 4")
                    for (int c = 0; c < RN; c++) {
                        const int8_t *aq = ab[c]->qs + 64 * gq + 4 * i;
                        plo[c] = _mm512_dpbusd_epi32(plo[c], ql, _mm512_set1_epi32(bt_cpu_load_i32(aq)));
                        phi[c] = _mm512_dpbusd_epi32(phi[c], qh, _mm512_set1_epi32(bt_cpu_load_i32(aq + 32)));
                    }
                }
                _Pragma("GCC unroll 4")
                for (int c = 0; c < RN; c++)
                    I[c] = _mm512_add_epi32(I[c], _mm512_add_epi32(_mm512_mullo_epi32(plo[c], sc_lo),
                                                                   _mm512_mullo_epi32(phi[c], sc_hi)));
            }
        } else { /* many columns (prompt): a sub-block at a time, registers for 8 */
            _Pragma("GCC unroll 8")
            for (int sb = 0; sb < 8; sb++) {
                const int gq = sb / 2, h = sb % 2;
                const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(sb < 4 ? s03 : s47, 8 * (sb % 4)), ff);
                __m512i p[8];
                _Pragma("GCC unroll 8")
                for (int c = 0; c < RN; c++) p[c] = _mm512_setzero_si512();
                _Pragma("GCC unroll 8")
                for (int i = 0; i < 8; i++) {
                    const __m512i q = _mm512_load_si512(v + (size_t)(3 + 8 * gq + i) * 64);
                    const __m512i qn = _mm512_and_si512(h ? _mm512_srli_epi16(q, 4) : q, m4);
                    _Pragma("GCC unroll 8")
                    for (int c = 0; c < RN; c++)
                        p[c] = _mm512_dpbusd_epi32(
                            p[c], qn, _mm512_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 64 * gq + 32 * h + 4 * i)));
                }
                _Pragma("GCC unroll 8")
                for (int c = 0; c < RN; c++) I[c] = _mm512_add_epi32(I[c], _mm512_mullo_epi32(p[c], sc));
            }
        }
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) {
            const __m512 da = _mm512_set1_ps(ab[c]->d);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[c]), _mm512_mul_ps(da, dw), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M[c]), _mm512_mul_ps(da, dm), acc[c]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) _mm512_storeu_ps(dcols[c] + row0, acc[c]);
}

static void rgemm_q4_K(int64_t k, const void *group, const void *next, const void *const *acts, int64_t ncols,
                       float *const *dcols, int64_t row0) {
    const uint8_t *g = group, *nx = next;
#define RP_K4_TILE(RN, j) rp_k4_tile(RN, k, g, nx, acts + (j), dcols + (j), row0)
    BT_CPU_COL_TILES(ncols, RP_K4_TILE);
#undef RP_K4_TILE
}

/* ---- Q6_K repacked (qtypes.h's layout, rp_q6_K) ------------------------------- *
 * A block's scale is its d (2 bytes), its 52 payload dwords q6_rp_enc's
 * bytes: vector 3j + p (j < 16, p < 3) holds per row the 4 elements
 * 64p + 4j .. 64p + 4j + 3 (bits 0..5, unsigned) and a third of elements
 * 192 + 4j .. (bits 6, 7), vectors 48..51 the 16 int8 scales (48 + w:
 * scales 4w .. 4w + 3).  Sub-block s = 4p + u (16 elements: 64p + 16u ..)
 * is the 4 vectors j = 4u .. 4u + 3 of quarter p: its values by an AND
 * (p < 3) or by gathering bits 6, 7 of the three vectors of j (p = 3),
 * against the activation's 4 bytes broadcast (vpdpbusd), started at
 * -32 bsums[s] (the offset); each sub-block's sum times its scale
 * (vpmulld) into I.  I is then I - M of dot_kq_ref exactly (int32 sums, the
 * same integers), and the float step is kq_step's: acc += (float)I *
 * (d_act * d).  So the same bits as the plain rows. */
/* quarter 3's values from the three vectors of a j: bits 6, 7 of x0, x1, x2
 * to bits 0..1, 2..3, 4..5 (16-bit shifts: what a byte's neighbour shifts
 * in is masked off) */
static inline __attribute__((always_inline)) __m512i q6_rp_fourth(__m512i x0, __m512i x1, __m512i x2) {
    const __m512i t = _mm512_ternarylogic_epi32(_mm512_srli_epi16(x0, 6), _mm512_srli_epi16(x1, 4),
                                                _mm512_set1_epi8(0x03), 0xE4); /* C ? A : B */
    return _mm512_ternarylogic_epi32(_mm512_and_si512(t, _mm512_set1_epi8(0x0F)), _mm512_srli_epi16(x2, 2),
                                     _mm512_set1_epi8(0x30), 0xF8); /* A | (B & C) */
}
static inline __attribute__((always_inline)) void rp_k6_tile(const int RN, int64_t k, const uint8_t *g,
                                                             const uint8_t *next, const void *const *acts,
                                                             float *const *dcols, int64_t row0) {
    const int64_t nblk = k / BT_QK_K;
    const size_t bs = sizeof(bt_block_q6_K), gsize = (size_t)nblk * 16 * bs;
    const __m512i m6 = _mm512_set1_epi8(0x3F);
    __m512 acc[8];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, sizeof(bt_block_q6_K), 2, &dof, &vof);
        const uint8_t *v = g + vof;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + dof)));
        const bt_block_q8_K *ab[8];
        __m512i I[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            I[c] = _mm512_setzero_si512();
        }
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) {
            _Pragma("GCC unroll 4")
            for (int p = 0; p < 4; p++) {
                const int s = 4 * p + u;
                rp6_prefetch(g, next, vof, gsize, 4 * u + p, 16);
                /* quarter 3 loads its vectors again (from L1) rather than
                 * keeping quarters 0..2's 12 in registers: MUL_MAT_ID at
                 * 32 tokens (1-4 columns an expert) ran 0.95x with them kept */
                const uint8_t *w = v;
                if (p == 3) __asm__("" : "+r"(w));
                __m512i P[8];
                _Pragma("GCC unroll 8")
                for (int c = 0; c < RN; c++) P[c] = _mm512_set1_epi32(-32 * ab[c]->bsums[s]);
                _Pragma("GCC unroll 4")
                for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * u + jj;
                    __m512i q;
                    if (p < 3) q = _mm512_and_si512(_mm512_loadu_si512(w + 64 * (3 * j + p)), m6);
                    else
                        q = q6_rp_fourth(_mm512_loadu_si512(w + 64 * (3 * j)), _mm512_loadu_si512(w + 64 * (3 * j + 1)),
                                         _mm512_loadu_si512(w + 64 * (3 * j + 2)));
                    _Pragma("GCC unroll 8")
                    for (int c = 0; c < RN; c++)
                        P[c] = _mm512_dpbusd_epi32(P[c], q,
                                                   _mm512_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 64 * p + 4 * j)));
                }
                const __m512i sw = _mm512_loadu_si512(v + 64 * (48 + p));
                const __m512i scv = _mm512_srai_epi32(_mm512_slli_epi32(sw, 24 - 8 * u), 24);
                _Pragma("GCC unroll 8")
                for (int c = 0; c < RN; c++) I[c] = _mm512_add_epi32(I[c], _mm512_mullo_epi32(P[c], scv));
            }
        }
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[c]), _mm512_mul_ps(_mm512_set1_ps(ab[c]->d), dw), acc[c]);
    }
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) _mm512_storeu_ps(dcols[c] + row0, acc[c]);
}

static void rgemm_q6_K(int64_t k, const void *group, const void *next, const void *const *acts, int64_t ncols,
                       float *const *dcols, int64_t row0) {
    const uint8_t *g = group, *nx = next;
#define RP_K6_TILE(RN, j) rp_k6_tile(RN, k, g, nx, acts + (j), dcols + (j), row0)
    BT_CPU_COL_TILES(ncols, RP_K6_TILE);
#undef RP_K6_TILE
}

/* one block of a panel (at pb) from the 16 rows' plain blocks blks[r] */
static void kq_pack_block(const int kind, const void *const *blks, uint8_t *pb) {
    _Alignas(64) uint8_t q[16][BT_QK_K];
    __m512 meta[16];
    for (int r = 0; r < 16; r++) {
        struct kq_block o;
        kq_unpack_block(kind, blks[r], &o, q[r]);
        meta[r] = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(0x3FFF, o.sc));
    }
    bt_cpu_transpose16(meta); /* bit moves only */
    for (int w = 0; w < 14; w++) _mm512_store_si512(pb + 4096 + 64 * w, _mm512_castps_si512(meta[w]));
    for (int c = 0; c < 4; c++) {
        __m512 v[16];
        for (int r = 0; r < 16; r++) v[r] = _mm512_castsi512_ps(_mm512_load_si512(q[r] + 64 * c));
        bt_cpu_transpose16(v); /* bit moves only */
        for (int g = 0; g < 16; g++) _mm512_store_si512(pb + 64 * (16 * c + g), _mm512_castps_si512(v[g]));
    }
}

/* rows row0 .. row0+nrows of columns dcols[0 .. RN) from a packed panel */
static inline __attribute__((always_inline)) void kq_gemm_tile(const int kind, const int RN, int64_t k,
                                                               const uint8_t *panel, const void *const *acts,
                                                               float *const *dcols, int64_t row0, int nrows) {
    const int SL = kq_sub_len(kind);
    __m512 acc[8];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const uint8_t *pb = panel + (size_t)b * KQ_PB;
        const bt_block_q8_K *ab[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) ab[c] = (const bt_block_q8_K *)acts[c] + b;
        __m512i I[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) I[c] = _mm512_setzero_si512();
        for (int sb = 0; sb < BT_QK_K / SL; sb++) {
            __m512i P[8];
            _Pragma("GCC unroll 8")
            for (int c = 0; c < RN; c++) P[c] = _mm512_setzero_si512();
            _Pragma("GCC unroll 8")
            for (int t = 0; t < SL / 4; t++) {
                const int g = sb * (SL / 4) + t;
                const __m512i w = _mm512_load_si512(pb + 64 * g);
                _Pragma("GCC unroll 8")
                for (int c = 0; c < RN; c++)
                    P[c] = _mm512_dpbusd_epi32(P[c], w, _mm512_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 4 * g)));
            }
            const int s16 = sb * SL / 16; /* the first 16-element sub-block */
            const __m512i sw = _mm512_load_si512(pb + 4096 + 64 * (s16 / 4));
            const __m512i scv = _mm512_srai_epi32(_mm512_slli_epi32(sw, 24 - 8 * (s16 % 4)), 24);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < RN; c++) I[c] = _mm512_add_epi32(I[c], _mm512_mullo_epi32(P[c], scv));
        }
        const __m512 dw = _mm512_load_ps((const float *)(pb + 4864));
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) {
            __m512i M = _mm512_setzero_si512();
            _Pragma("GCC unroll 8")
            for (int j = 0; j < 8; j++)
                M = _mm512_dpwssd_epi32(M, _mm512_load_si512(pb + 4352 + 64 * j),
                                        _mm512_set1_epi32(bt_cpu_load_i32(&ab[c]->bsums[2 * j])));
            const __m512 da = _mm512_set1_ps(ab[c]->d);
            if (kind == KQ2 || kind == KQ4 || kind == KQ5) {
                const __m512 dm = _mm512_load_ps((const float *)(pb + 4928));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[c]), _mm512_mul_ps(da, dw), acc[c]);
                acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(M), _mm512_mul_ps(da, dm), acc[c]);
            } else {
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(I[c], M)), _mm512_mul_ps(da, dw), acc[c]);
            }
        }
    }
    const __mmask16 mask = (__mmask16)(nrows >= 16 ? 0xFFFF : (1u << nrows) - 1u);
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) _mm512_mask_storeu_ps(dcols[c] + row0, mask, acc[c]);
}

/* (inside KQ_GEMMS's qgemm: kind_, k, panel, acts, dcols, row0, nrows) */
#define KQ_GEMM_TILE(RN, j) kq_gemm_tile(kind_, RN, k, panel, acts + (j), dcols + (j), row0, nrows)
KQ_GEMMS(kq_pack_block, BT_CPU_COL_TILES, KQ_GEMM_TILE)

#define FAST(name) dot_##name##_avx512

#elif defined(HAVE_QDOT_AVX2)
/* ---- AVX2 (FMA, F16C) -------------------------------------------------------- *
 * The integers of the plain C dots in 8 int32 lanes: weights unpacked to
 * unsigned bytes, 32 elements a vector, multiplied with the signed
 * activation bytes pairwise (vpmaddubsw: at most 2 * 63 * 127 < 32768), the
 * int16 pairs weighted by their sub-block's scale into int32 lanes
 * (vpmaddwd).  Exact, so any grouping gives dot_kq_ref's I and M; the float
 * steps are the plain C ones: kq_step per block (in scalar, or four rows'
 * steps as one 4-lane vector in the decode tile). */

static inline float h2f_fast(bt_fp16_t h) { return _cvtsh_ss(h); }


/* v >> n in every 16-bit lane (n need not be a constant) */
static inline __m256i srl16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }

/* A K-quant block's sub-block scales and "mins" (kq_unpack_scales) as
 * int16 lanes, and its float scales.  sc is laid out for kq_chunk_scale:
 * Q4_K and Q5_K's 8 scales in both 128-bit lanes; the other types' 16
 * (a 16-element sub-block each) the even ones in the low lane, the odd ones
 * in the high.  mn is in sub-block order (16 lanes, Q4_K and Q5_K's each
 * twice), against the activation's 16 bsums. */
struct kq_scales {
    __m256i sc, mn;
    float d, dmin;
};
/* 16 int8 scales s0..s15 as int16 (s0, s2, .., s14 | s1, s3, .., s15) */
static inline __m256i kq_scales_eo(__m128i s8, const bool is_signed) {
    const __m128i eo = _mm_shuffle_epi8(s8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    return is_signed ? _mm256_cvtepi8_epi16(eo) : _mm256_cvtepu8_epi16(eo);
}
/* the int16 scales of chunk ch (elements 32ch .. 32ch+31) in every lane of its
 * 16-element halves: int16 ch of each 128-bit lane of sc (one vpshufb) */
static inline __m256i kq_chunk_scale(__m256i sc, const int ch) {
    return _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)(0x0100 + 0x0202 * ch)));
}
static inline __attribute__((always_inline)) struct kq_scales kq_scales_avx2(const int kind, const void *blk) {
    struct kq_scales o;
    o.dmin = 0.0f;
    if (kind == KQ4 || kind == KQ5) {
        const bt_block_q4_K *w = blk; /* d, dmin, scales: the same in Q5_K */
        uint32_t u[4];
        memcpy(u, w->scales, 12);
        u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
        const uint32_t mins_lo = u[1] & 0x3f3f3f3f;
        u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
        u[2] = mins_lo;
        u[0] &= 0x3f3f3f3f;
        /* bytes 0..7: the 8 scales, 8..15: the 8 mins (each min on its two halves) */
        const __m128i x = _mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]);
        o.sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(x));
        o.mn = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(x, x));
        o.d = h2f_fast(w->d);
        o.dmin = h2f_fast(w->dmin);
    } else if (kind == KQ6) {
        const bt_block_q6_K *w = blk;
        const __m128i s8 = _mm_loadu_si128((const __m128i *)w->scales);
        o.sc = kq_scales_eo(s8, true);
        o.mn = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
        o.d = h2f_fast(w->d);
    } else if (kind == KQ3) {
        const bt_block_q3_K *w = blk;
        /* the 16 6-bit scales (offset 32), as bt_q3_K_scales */
        uint32_t aux[3];
        memcpy(aux, w->scales, 12);
        const uint32_t m2 = 0x0f0f0f0f, m1 = 0x03030303;
        const __m128i s8 = _mm_sub_epi8(_mm_set_epi32((int)(((aux[1] >> 4) & m2) | (((aux[2] >> 6) & m1) << 4)),
                                                      (int)(((aux[0] >> 4) & m2) | (((aux[2] >> 4) & m1) << 4)),
                                                      (int)((aux[1] & m2) | (((aux[2] >> 2) & m1) << 4)),
                                                      (int)((aux[0] & m2) | ((aux[2] & m1) << 4))),
                                        _mm_set1_epi8(32));
        o.sc = kq_scales_eo(s8, true);
        o.mn = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 2);
        o.d = h2f_fast(w->d);
    } else {
        const bt_block_q2_K *w = blk;
        const __m128i raw = _mm_loadu_si128((const __m128i *)w->scales);
        o.sc = kq_scales_eo(_mm_and_si128(raw, _mm_set1_epi8(0x0F)), false);
        o.mn = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
        o.d = h2f_fast(w->d);
        o.dmin = h2f_fast(w->dmin);
    }
    return o;
}

/* Q6_K's 6-bit values of sub-block field sb (0..3) as bytes: bits 0..3 the low
 * (sb < 2) or high nibbles of lo, bits 4..5 hi's 2-bit field sb, moved there
 * by one shift (none for sb 2) and masked; bits 6..7 zero */
static inline __attribute__((always_inline)) __m256i q6_bytes_avx2(__m256i lo, __m256i hi, const int sb) {
    if (sb >> 1) lo = _mm256_srli_epi16(lo, 4);
    if (sb < 2) hi = _mm256_slli_epi16(hi, 4 - 2 * sb);
    else if (sb == 3) hi = _mm256_srli_epi16(hi, 2);
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi8(0x0F)), _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}

/* elements 32c .. 32c+31 (c < 8) of a K-quant block as unsigned bytes: kq_unpack_q_ref's q */
static inline __attribute__((always_inline)) __m256i kq_chunk_avx2(const int kind, const void *blk, const int c) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    if (kind == KQ4 || kind == KQ5) {
        /* sub-block pair c / 2: the low nibbles, then the high ones */
        const uint8_t *qs = kind == KQ4 ? ((const bt_block_q4_K *)blk)->qs : ((const bt_block_q5_K *)blk)->qs;
        __m256i q = _mm256_and_si256(srl16(_mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 2))), 4 * (c % 2)), m4);
        if (kind == KQ5) {
            const __m256i hb = _mm256_loadu_si256((const __m256i *)((const bt_block_q5_K *)blk)->qh);
            q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(srl16(hb, c), m1), 4));
        }
        return q;
    }
    if (kind == KQ6) {
        const bt_block_q6_K *w = blk;
        const int h = c / 4, sb = c % 4;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(w->ql + 64 * h + 32 * (sb & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(w->qh + 32 * h));
        return q6_bytes_avx2(ql, qh, sb);
    }
    /* Q2_K, Q3_K: 2-bit field c % 4 of half c / 4, Q3_K plus 4 for bit c of
     * hmask.  With few vector shifts: field 0 is taken without one, and
     * hmask's bit c (1 << c where set) becomes 4 by a byte minimum (c >= 2)
     * or an add (c == 1): 7 shifts a block and row instead of 22, the Q3_K
     * decode row 1.06x on a Zen 3 */
    const uint8_t *qs = kind == KQ3 ? ((const bt_block_q3_K *)blk)->qs : ((const bt_block_q2_K *)blk)->qs;
    const __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 4)));
    __m256i q = _mm256_and_si256(c % 4 ? srl16(qv, 2 * (c % 4)) : qv, m3);
    if (kind == KQ3) {
        const __m256i hm = _mm256_loadu_si256((const __m256i *)((const bt_block_q3_K *)blk)->hmask);
        const __m256i bit = _mm256_and_si256(hm, _mm256_set1_epi8((char)(1 << c)));
        const __m256i four = c >= 2  ? _mm256_min_epu8(bit, _mm256_set1_epi8(4))
                             : c == 1 ? _mm256_add_epi8(bit, bit)
                                      : _mm256_slli_epi16(bit, 2);
        q = _mm256_or_si256(q, four);
    }
    return q;
}

/* the sums of the 8 int32 lanes of a, b, c and d, in that order */
static inline __m128i hsum4_i32x8(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

/* One K-quant row against RN <= 4 Q8_K columns (out[c]): per block, I in 8
 * int32 lanes (chunk c's int16 lanes 0..7 sub-block 2c, 8..15 sub-block
 * 2c+1, each weighted by its scale), M from the mins and the activation's
 * sums, both summed across lanes for two columns at a time, then kq_step. */
static inline __attribute__((always_inline)) void kq_tile_avx2(const int kind, const int RN, int64_t k,
                                                               const void *w_row, const void *const *acts,
                                                               float *out) {
    const size_t bs = kq_block_bytes(kind);
    float acc[4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) acc[c] = 0.0f;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const bt_block_q8_K *ab[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) ab[c] = (const bt_block_q8_K *)acts[c] + b;
        __m256i iv[4], mv[4];
        const void *blk = (const char *)w_row + (size_t)b * bs;
        const struct kq_scales o = kq_scales_avx2(kind, blk);
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) iv[c] = _mm256_setzero_si256();
        _Pragma("GCC unroll 8")
        for (int ch = 0; ch < 8; ch++) {
            const __m256i q = kq_chunk_avx2(kind, blk, ch);
            const __m256i scv = kq_chunk_scale(o.sc, ch);
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) {
                const __m256i av = _mm256_loadu_si256((const __m256i *)(ab[c]->qs + 32 * ch));
                iv[c] = _mm256_add_epi32(iv[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), scv));
            }
        }
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++)
            mv[c] = _mm256_madd_epi16(o.mn, _mm256_loadu_si256((const __m256i *)ab[c]->bsums));
        if (RN == 1) {
            acc[0] = kq_step(kq_has_min(kind), acc[0], bt_cpu_hsum_i32x8(iv[0]), bt_cpu_hsum_i32x8(mv[0]), ab[0]->d,
                             o.d, o.dmin);
        } else {
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c += 2) {
                int32_t s4[4];
                _mm_storeu_si128((__m128i *)s4, hsum4_i32x8(iv[c], mv[c], iv[c + 1], mv[c + 1]));
                _Pragma("GCC unroll 2")
                for (int j = 0; j < 2; j++)
                    acc[c + j] = kq_step(kq_has_min(kind), acc[c + j], s4[2 * j], s4[2 * j + 1], ab[c + j]->d, o.d,
                                         o.dmin);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) out[c] = acc[c];
}

/* 4 rows against RN = 1 or 2 columns (out[4 c + r]): the decode rows, and a
 * MoE expert's one or two tokens (matmul repeats the last row for a shorter
 * tail); each chunk is unpacked once for both columns, where two 4 x 1 tiles
 * unpacked it twice (the 32-token MoE rows of Q3_K, Q4_K, Q6_K 1.18-1.28x
 * on a Zen 3).  kq_tile_avx2's I and M per row and block.
 * A 2-row tile reduced each row's lanes apart and took the float steps one
 * by one, a serial chain per block; here the four rows' lanes are reduced in
 * one tree and their steps taken as one 4-lane vector (1.2x on plain AVX2's
 * Q2_K .. Q6_K decode rows).  Per lane the operations of kq_step (da dw,
 * then one fma; -M's fma as fnmadd; without mins I - M subtracted as
 * integers before the sum), so the same bits. */
static inline __attribute__((always_inline)) void kq_rows_avx2(const int kind, const int RN, int64_t k,
                                                               const void *const *w_rows, const void *const *next,
                                                               const void *const *acts, float *out) {
    const size_t bs = kq_block_bytes(kind);
    __m128 acc[2];
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) acc[c] = _mm_setzero_ps();
    /* the rows ahead, as the AVX-512 tiles prefetch them */
    const int block = bt_cpu_tile_block_kind(w_rows, next, k / BT_QK_K, bs, 4);
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        bt_cpu_tile_prefetch(w_rows, next, block, b, k / BT_QK_K, bs, 4);
        const bt_block_q8_K *a[2];
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) a[c] = (const bt_block_q8_K *)acts[c] + b;
        __m256i iv[2][4], mv[2][4];
        __m128 d, dmin;
        kq_d4(kind, w_rows, (size_t)b * bs, &d, &dmin);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) {
            const void *blk = (const char *)w_rows[r] + (size_t)b * bs;
            const struct kq_scales o = kq_scales_avx2(kind, blk); /* its d, dmin unused: d, dmin above */
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) iv[c][r] = _mm256_setzero_si256();
            _Pragma("GCC unroll 8")
            for (int ch = 0; ch < 8; ch++) {
                /* the chunk unpacked once for every column */
                const __m256i q = kq_chunk_avx2(kind, blk, ch), sc = kq_chunk_scale(o.sc, ch);
                _Pragma("GCC unroll 2")
                for (int c = 0; c < RN; c++) {
                    const __m256i av = _mm256_loadu_si256((const __m256i *)(a[c]->qs + 32 * ch));
                    const __m256i p = _mm256_maddubs_epi16(q, av);
#if defined(__AVXVNNI__)
                    iv[c][r] = _mm256_dpwssd_avx_epi32(iv[c][r], p, sc);
#else
                    iv[c][r] = _mm256_add_epi32(iv[c][r], _mm256_madd_epi16(p, sc));
                    /* one running sum: left to itself GCC regroups the 32 adds
                     * into trees whose live products spill */
                    __asm__("" : "+x"(iv[c][r]));
#endif
                }
            }
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++)
                mv[c][r] = _mm256_madd_epi16(o.mn, _mm256_loadu_si256((const __m256i *)a[c]->bsums));
        }
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) {
            const __m128 da = _mm_set1_ps(a[c]->d);
            if (kq_has_min(kind)) {
                const __m128i I = hsum4_i32x8(iv[c][0], iv[c][1], iv[c][2], iv[c][3]);
                const __m128i M = hsum4_i32x8(mv[c][0], mv[c][1], mv[c][2], mv[c][3]);
                acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(I), _mm_mul_ps(da, d), acc[c]);
                acc[c] = _mm_fnmadd_ps(_mm_cvtepi32_ps(M), _mm_mul_ps(da, dmin), acc[c]);
            } else {
                _Pragma("GCC unroll 4")
                for (int r = 0; r < 4; r++) iv[c][r] = _mm256_sub_epi32(iv[c][r], mv[c][r]);
                const __m128i IM = hsum4_i32x8(iv[c][0], iv[c][1], iv[c][2], iv[c][3]);
                acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(IM), _mm_mul_ps(da, d), acc[c]);
            }
        }
    }
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) _mm_storeu_ps(out + 4 * c, acc[c]);
}

#define KQ_AVX2_DEFS(name, kind)                                                                        \
    static void dot_##name##_avx2(int64_t k, float *s, const void *vw, const void *va) {               \
        kq_tile_avx2(kind, 1, k, vw, &va, s);                                                          \
    }                                                                                                  \
    static void qtile_##name##_1x4(int64_t k, const void *const *w, const void *const *a,               \
                                   const void *const *next, float *out) {                              \
        (void)next;                                                                                    \
        kq_tile_avx2(kind, 4, k, w[0], a, out);                                                        \
    }
#define KQ_AVX2_ROWS(name, kind)                                                                        \
    static void qtile_##name##_4x1(int64_t k, const void *const *w, const void *const *a,               \
                                   const void *const *next, float *out) {                              \
        kq_rows_avx2(kind, 1, k, w, next, a, out);                                                     \
    }                                                                                                  \
    static void qtile_##name##_4x2(int64_t k, const void *const *w, const void *const *a,               \
                                   const void *const *next, float *out) {                              \
        kq_rows_avx2(kind, 2, k, w, next, a, out);                                                     \
    }
KQ_AVX2_DEFS(q2_K, KQ2)
KQ_AVX2_DEFS(q3_K, KQ3)
KQ_AVX2_DEFS(q4_K, KQ4)
KQ_AVX2_DEFS(q5_K, KQ5)
KQ_AVX2_DEFS(q6_K, KQ6)
/* The 4-row decode tile for every K-quant.  A Zen 4 running this AVX2 code
 * had Q3_K and Q6_K faster a row at a time (1.1-1.7x), but the CPUs it is
 * for do not: on a Zen 3 the tile runs Q6_K's decode row 1.4x and Q3_K's
 * 1.12x the row at a time, and on a Xeon 1.2x for every type
 * (docs/benchmarks.md) */
KQ_AVX2_ROWS(q2_K, KQ2)
KQ_AVX2_ROWS(q3_K, KQ3)
KQ_AVX2_ROWS(q4_K, KQ4)
KQ_AVX2_ROWS(q5_K, KQ5)
KQ_AVX2_ROWS(q6_K, KQ6)
#define K_ROWS_TILE_q2_K {4, 1, qtile_q2_K_4x1}, {4, 2, qtile_q2_K_4x2},
#define K_ROWS_TILE_q3_K {4, 1, qtile_q3_K_4x1}, {4, 2, qtile_q3_K_4x2},
#define K_ROWS_TILE_q4_K {4, 1, qtile_q4_K_4x1}, {4, 2, qtile_q4_K_4x2},
#define K_ROWS_TILE_q5_K {4, 1, qtile_q5_K_4x1}, {4, 2, qtile_q5_K_4x2},
#define K_ROWS_TILE_q6_K {4, 1, qtile_q6_K_4x1}, {4, 2, qtile_q6_K_4x2},
#define K_TILE_LIST(name) {K_ROWS_TILE_##name {1, 4, qtile_##name##_1x4}, {0, 0, NULL}}

/* The AVX2 K-quant sums of the repacked kernels below: a sub-block's
 * q * a per row lane, then times the sub-block's scale into int32.  Without
 * AVX-VNNI, vpmaddubsw's pairs are added as int16 (the callers add at most
 * 16 products of |q a| <= 15 * 128, or 4 of 63 * 128: below 2^15, so no
 * saturation) and the scale is one vpmaddwd with it in both int16 halves of
 * each dword; with AVX-VNNI, vpdpbusd into int32 and vpmulld.  Either way
 * the same integers as the AVX-512 kernels.  (Against a vpmaddwd by ones
 * per vector and a vpmulld per sub-block, q4_K prompt 83-108 -> 133-150
 * GFLOP per CPU-second: docs/benchmarks.md.) */
#if defined(__AVXVNNI__)
#define KQ_ACC(p, u, s) _mm256_dpbusd_avx_epi32((p), (u), (s))
#define KQ_SCALE(I, p, sc) _mm256_add_epi32((I), _mm256_mullo_epi32((p), (sc)))
/* byte j of each dword, unsigned or signed, as KQ_SCALE's scale */
static inline __m256i kq_scale_u8(__m256i x, const int j) {
    return _mm256_and_si256(_mm256_srli_epi32(x, 8 * j), _mm256_set1_epi32(0xFF));
}
static inline __m256i kq_scale_s8(__m256i x, const int j) {
    return _mm256_srai_epi32(_mm256_slli_epi32(x, 24 - 8 * j), 24);
}
#else
#define KQ_ACC(p, u, s) _mm256_add_epi16((p), _mm256_maddubs_epi16((u), (s)))
#define KQ_SCALE(I, p, sc) _mm256_add_epi32((I), _mm256_madd_epi16((p), (sc)))
/* vpshufb's pattern putting byte j of each dword into both int16 halves:
 * their low bytes (hi 0) or their high bytes (hi 1), the other bytes zero */
static inline __m256i kq_pick(const int j, const int hi) {
    const unsigned u = hi ? 0x00800080u : 0x80008000u, m = hi ? 0x01000100u : 0x00010001u;
    const int d0 = (int)(u + (unsigned)j * m), d1 = (int)(u + (unsigned)(4 + j) * m);
    const int d2 = (int)(u + (unsigned)(8 + j) * m), d3 = (int)(u + (unsigned)(12 + j) * m);
    return _mm256_setr_epi32(d0, d1, d2, d3, d0, d1, d2, d3);
}
static inline __m256i kq_scale_u8(__m256i x, const int j) { return _mm256_shuffle_epi8(x, kq_pick(j, 0)); }
static inline __m256i kq_scale_s8(__m256i x, const int j) {
    return _mm256_srai_epi16(_mm256_shuffle_epi8(x, kq_pick(j, 1)), 8);
}
#endif

/* The K-quants' packed GEMM on AVX2: the AVX-512 kernel's panel (KQ_PB
 * bytes a block, packed here with plain moves) and arithmetic for the 16
 * rows as two halves of 8 (bytes 32h .. 32h + 31 of each vector): KQ_ACC
 * for vpdpbusd, KQ_SCALE for the scale's vpmulld, vpmaddwd for vpdpwssd.
 * Without AVX-VNNI the int16 sums take at most kq_gemm_run(kind) vectors
 * before the scale: a vpmaddubsw lane is 2 products of q <= qmax and
 * |a| <= 128, so n vectors sum 2n of them, below 2^15 for Q6_K (qmax 63)
 * at 2, Q5_K (31) at 4, Q4_K (15) at 8, Q3_K (7) and Q2_K (3) at a whole
 * 16-element sub-block (4).  The IQ types' panel bytes (v + 128, up to
 * 241 for IQ4_XS) would saturate vpmaddubsw: they go back to the signed
 * values, whose magnitudes multiply the activation bytes with the values'
 * signs (as the repacked Q8_0 does), so |v| <= vmax against |a| <= 127:
 * IQ4_XS (127) one vector a run, IQ3_XXS (62) and the IQ2 types (43) 2,
 * IQ3_S (15) and IQ1_S (9) a whole 32-element sub-block (8); I is then
 * I - M of the AVX-512 kernel.  The same integers and float steps, so the
 * same bits. */
static inline int kq_gemm_run(const int kind) {
#if defined(__AVXVNNI__)
    return kq_sub_len(kind) / 4; /* a sub-block: int32 sums */
#else
    switch (kind) {
    case KQI4: return 1;
    case KQ6: case KQI2XXS: case KQI2XS: case KQI2S: case KQI3XXS: return 2;
    case KQ4: case KQI3S: case KQI1S: return 8;
    default: return 4; /* Q5_K; Q2_K, Q3_K: a 16-element sub-block */
    }
#endif
}

static void kq_pack_block_avx2(const int kind, const void *const *blks, uint8_t *pb) {
    _Alignas(32) uint8_t q[BT_QK_K];
    for (int r = 0; r < 16; r++) {
        struct kq_block o;
        kq_unpack_block(kind, blks[r], &o, q);
        for (int g = 0; g < BT_QK_K / 4; g++) memcpy(pb + 64 * g + 4 * r, q + 4 * g, 4);
        for (int w = 0; w < 14; w++) memcpy(pb + 4096 + 64 * w + 4 * r, (const uint8_t *)o.sc + 4 * w, 4);
    }
}

/* rows row0 + 8h .. of columns dcols[0 .. RN) (RN <= 4) from a packed panel, nrows of the 16 valid */
static inline __attribute__((always_inline)) void kq_gemm_half_avx2(const int kind, const int RN, int64_t k,
                                                                    const uint8_t *panel, const void *const *acts,
                                                                    float *const *dcols, int64_t row0, int nrows,
                                                                    const int h) {
    const int SL = kq_sub_len(kind);
    const int RUN = kq_gemm_run(kind);
    __m256 acc[4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const uint8_t *pb = panel + (size_t)b * KQ_PB + 32 * h;
        const bt_block_q8_K *ab[4];
        __m256i I[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            I[c] = _mm256_setzero_si256();
        }
        for (int sb = 0; sb < BT_QK_K / SL; sb++) {
            const int s16 = sb * SL / 16; /* the first 16-element sub-block */
            const __m256i scv = kq_scale_s8(_mm256_load_si256((const __m256i *)(pb + 4096 + 64 * (s16 / 4))), s16 % 4);
            for (int g0 = sb * (SL / 4); g0 < (sb + 1) * (SL / 4); g0 += RUN) {
                __m256i P[4];
                _Pragma("GCC unroll 4")
                for (int c = 0; c < RN; c++) P[c] = _mm256_setzero_si256();
                _Pragma("GCC unroll 8")
                for (int g = g0; g < g0 + RUN; g++) {
                    const __m256i w = _mm256_load_si256((const __m256i *)(pb + 64 * g));
                    if (kq_signed(kind)) { /* |v| against the activation with v's sign */
                        const __m256i lv = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)), u = _mm256_abs_epi8(lv);
                        _Pragma("GCC unroll 4")
                        for (int c = 0; c < RN; c++)
                            P[c] = KQ_ACC(P[c], u, _mm256_sign_epi8(_mm256_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 4 * g)), lv));
                    } else {
                        _Pragma("GCC unroll 4")
                        for (int c = 0; c < RN; c++)
                            P[c] = KQ_ACC(P[c], w, _mm256_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 4 * g)));
                    }
                }
                _Pragma("GCC unroll 4")
                for (int c = 0; c < RN; c++) I[c] = KQ_SCALE(I[c], P[c], scv);
            }
        }
        const __m256 dw = _mm256_load_ps((const float *)(pb + 4864));
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            __m256i M = _mm256_setzero_si256(); /* IQ types: I is already the signed values' sum */
            if (!kq_signed(kind)) {
                _Pragma("GCC unroll 8")
                for (int j = 0; j < 8; j++)
                    M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(pb + 4352 + 64 * j)),
                                                              _mm256_set1_epi32(bt_cpu_load_i32(&ab[c]->bsums[2 * j]))));
            }
            const __m256 da = _mm256_set1_ps(ab[c]->d);
            if (kq_has_min(kind)) {
                const __m256 dm = _mm256_load_ps((const float *)(pb + 4928));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[c]), _mm256_mul_ps(da, dw), acc[c]);
                acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(da, dm), acc[c]);
            } else {
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(I[c], M)), _mm256_mul_ps(da, dw), acc[c]);
            }
        }
    }
    const int n = nrows - 8 * h;
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) {
        if (n >= 8) {
            _mm256_storeu_ps(dcols[c] + row0 + 8 * h, acc[c]);
        } else if (n > 0) {
            float t[8];
            _mm256_storeu_ps(t, acc[c]);
            memcpy(dcols[c] + row0 + 8 * h, t, (size_t)n * sizeof(float));
        }
    }
}

/* (inside KQ_GEMMS's qgemm: kind_, k, panel, acts, dcols, row0, nrows) */
#define KQ_GEMM_TILE_AVX2(RN, j)                                                                       \
    do {                                                                                               \
        kq_gemm_half_avx2(kind_, RN, k, panel, acts + (j), dcols + (j), row0, nrows, 0);               \
        if (nrows > 8) kq_gemm_half_avx2(kind_, RN, k, panel, acts + (j), dcols + (j), row0, nrows, 1); \
    } while (0)
KQ_GEMMS(kq_pack_block_avx2, BT_CPU_COL_TILES4, KQ_GEMM_TILE_AVX2)

/* Q4_K repacked on AVX2: the AVX-512 kernel's arithmetic (rp_k4_tile) for
 * the group's 16 rows as two halves of 8 (a half: bytes 32h .. 32h + 31 of
 * each 64-byte vector), vpdpbusd as KQ_ACC, the scale as KQ_SCALE (nibbles
 * against int8: 8 pairs a sub-block, below 2^15), vpdpwssd as vpmaddwd;
 * the same integers and float steps, so the same bits.  Both halves of a
 * block at once, so that an activation's broadcast serves 16 rows and the
 * group's bytes pass through L1 once per tile; tiles of at most 2 columns
 * (AVX2's 16 registers).  (Against halves of 8 rows one after the other in
 * tiles of 4 columns: q4_K decode 51-61 -> 89-99 GFLOP per CPU-second, the
 * prompt as fast: docs/benchmarks.md.) */
static inline __attribute__((always_inline)) void rp_k4_tile_avx2(const int RN, int64_t k, const uint8_t *g,
                                                                  const uint8_t *next, const void *const *acts,
                                                                  float *const *dcols, int64_t row0) {
    const int64_t nblk = k / BT_QK_K;
    const size_t gsize = (size_t)nblk * 16 * sizeof(bt_block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m6 = _mm256_set1_epi8(0x3F), m2 = _mm256_set1_epi8(0x03);
    const __m256i lo16 = _mm256_set1_epi32(0x00FF00FF), lo16w = _mm256_set1_epi32(0xFFFF);
    __m256 acc[2][2];
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, sizeof(bt_block_q4_K), 4, &dof, &vof);
        const uint8_t *v = g + vof;
        __m256i scs[2][8]; /* the sub-blocks' scales, per half */
        _Pragma("GCC unroll 2")
        for (int hf = 0; hf < 2; hf++) {
            const __m256i u0 = _mm256_load_si256((const __m256i *)(v + 32 * hf));
            const __m256i u2 = _mm256_load_si256((const __m256i *)(v + 128 + 32 * hf));
            const __m256i s03 = _mm256_and_si256(u0, m6);
            const __m256i s47 = _mm256_or_si256(_mm256_and_si256(u2, m4),
                                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m2), 4));
            _Pragma("GCC unroll 8")
            for (int sb = 0; sb < 8; sb++) scs[hf][sb] = kq_scale_u8(sb < 4 ? s03 : s47, sb % 4);
        }
        const bt_block_q8_K *ab[2];
        __m256i I[2][2];
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            I[0][c] = I[1][c] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 8")
        for (int sb = 0; sb < 8; sb++) {
            rpk4_prefetch(g, next, b, gsize, sb, 8);
            const int gq = sb / 2, h = sb % 2;
            __m256i p[2][2];
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) p[0][c] = p[1][c] = _mm256_setzero_si256();
            _Pragma("GCC unroll 8")
            for (int i = 0; i < 8; i++) {
                __m256i qn[2];
                _Pragma("GCC unroll 2")
                for (int hf = 0; hf < 2; hf++) {
                    const __m256i q = _mm256_load_si256((const __m256i *)(v + (size_t)(3 + 8 * gq + i) * 64 + 32 * hf));
                    qn[hf] = _mm256_and_si256(h ? _mm256_srli_epi16(q, 4) : q, m4);
                }
                _Pragma("GCC unroll 2")
                for (int c = 0; c < RN; c++) {
                    const __m256i av = _mm256_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 64 * gq + 32 * h + 4 * i));
                    p[0][c] = KQ_ACC(p[0][c], qn[0], av);
                    p[1][c] = KQ_ACC(p[1][c], qn[1], av);
                }
            }
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) {
                I[0][c] = KQ_SCALE(I[0][c], p[0][c], scs[0][sb]);
                I[1][c] = KQ_SCALE(I[1][c], p[1][c], scs[1][sb]);
            }
        }
        _Pragma("GCC unroll 2")
        for (int hf = 0; hf < 2; hf++) {
            /* the mins as int16 pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7), and d, dmin */
            const __m256i u1 = _mm256_load_si256((const __m256i *)(v + 64 + 32 * hf));
            const __m256i u2 = _mm256_load_si256((const __m256i *)(v + 128 + 32 * hf));
            const __m256i n03 = _mm256_and_si256(u1, m6);
            const __m256i n47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                                                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m2), 4));
            const __m256i mp[4] = {_mm256_and_si256(n03, lo16), _mm256_and_si256(_mm256_srli_epi32(n03, 8), lo16),
                                   _mm256_and_si256(n47, lo16), _mm256_and_si256(_mm256_srli_epi32(n47, 8), lo16)};
            const __m256i dd = _mm256_loadu_si256((const __m256i *)(g + dof + 32 * hf));
            /* the 8 rows' d and dmin (fp16 in a dword each) as 8 floats each */
            const __m256i dl = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_and_si256(dd, lo16w), dd), 0x08);
            const __m256i dh = _mm256_permute4x64_epi64(_mm256_packus_epi32(_mm256_srli_epi32(dd, 16), dd), 0x08);
            const __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dl));
            const __m256 dm = _mm256_cvtph_ps(_mm256_castsi256_si128(dh));
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) {
                uint32_t sp[4];
                k4_sum_pairs(ab[c], sp);
                __m256i M = _mm256_setzero_si256();
                _Pragma("GCC unroll 4")
                for (int i = 0; i < 4; i++)
                    M = _mm256_add_epi32(M, _mm256_madd_epi16(mp[i], _mm256_set1_epi32((int)sp[i])));
                const __m256 da = _mm256_set1_ps(ab[c]->d);
                acc[hf][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[hf][c]), _mm256_mul_ps(da, dw), acc[hf][c]);
                acc[hf][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(da, dm), acc[hf][c]);
            }
        }
    }
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) {
        _mm256_storeu_ps(dcols[c] + row0, acc[0][c]);
        _mm256_storeu_ps(dcols[c] + row0 + 8, acc[1][c]);
    }
}

static void rgemm_q4_K(int64_t k, const void *group, const void *next, const void *const *acts, int64_t ncols,
                       float *const *dcols, int64_t row0) {
    const uint8_t *g = group, *nx = next;
    int64_t j = 0;
    for (; j + 2 <= ncols; j += 2) rp_k4_tile_avx2(2, k, g, nx, acts + j, dcols + j, row0);
    if (j < ncols) rp_k4_tile_avx2(1, k, g, nx, acts + j, dcols + j, row0);
}

/* Q6_K's offset on AVX2 (below): the 8 rows' 16 int8 scales (v: the half's
 * bytes of the block) as int16 pairs (sc[4w], sc[4w+1]) and (sc[4w+2],
 * sc[4w+3]), then per column the sum over s of sc[s] bsums[s] */
static inline __attribute__((always_inline)) void k6_scale_pairs(const uint8_t *v, __m256i sp[8]) {
    _Pragma("GCC unroll 4")
    for (int w = 0; w < 4; w++) {
        const __m256i x = _mm256_load_si256((const __m256i *)(v + 64 * (48 + w)));
        const __m256i e = _mm256_srai_epi16(_mm256_slli_epi16(x, 8), 8), o = _mm256_srai_epi16(x, 8);
        sp[2 * w] = _mm256_blend_epi16(e, _mm256_slli_epi32(o, 16), 0xAA);
        sp[2 * w + 1] = _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA);
    }
}
static inline __attribute__((always_inline)) __m256i k6_scale_bsums(const __m256i sp[8], const bt_block_q8_K *a) {
    __m256i M = _mm256_setzero_si256();
    _Pragma("GCC unroll 8")
    for (int j = 0; j < 8; j++)
        M = _mm256_add_epi32(M, _mm256_madd_epi16(sp[j], _mm256_set1_epi32(bt_cpu_load_i32(&a->bsums[2 * j]))));
    return M;
}

/* Q6_K repacked on AVX2: rp_k6_tile's arithmetic on two halves of 8 rows,
 * as rp_k4_tile_avx2 (6-bit values against int8: two pairs of groups
 * before each KQ_SCALE, below 2^15), but the offset: rp_k6_tile starts a
 * sub-block's sum at -32 bsums[s], which int16 sums cannot hold, so here
 * the block's -32 sum over s of sc[s] bsums[s] (vpmaddwd of the scales'
 * pairs with the bsums' pairs) is taken off I at the end: the same
 * integer. */
static inline __attribute__((always_inline)) void rp_k6_tile_avx2(const int RN, int64_t k, const uint8_t *g,
                                                                  const uint8_t *next, const void *const *acts,
                                                                  float *const *dcols, int64_t row0) {
    const int64_t nblk = k / BT_QK_K;
    const size_t bs = sizeof(bt_block_q6_K), gsize = (size_t)nblk * 16 * bs;
    __m256 acc[2][2];
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, sizeof(bt_block_q6_K), 2, &dof, &vof);
        const uint8_t *v = g + vof;
        const bt_block_q8_K *ab[2];
        __m256i I[2][2];
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            I[0][c] = I[1][c] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) {
            _Pragma("GCC unroll 4")
            for (int p = 0; p < 4; p++) {
                rp6_prefetch(g, next, vof, gsize, 4 * u + p, 16);
                __m256i P[2][2];
                _Pragma("GCC unroll 4")
                for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * u + jj;
                    __m256i q[2];
                    _Pragma("GCC unroll 2")
                    for (int hf = 0; hf < 2; hf++) q[hf] = q6_rp_values_avx2(v, j, p, hf);
                    _Pragma("GCC unroll 2")
                    for (int c = 0; c < RN; c++) {
                        const __m256i av = _mm256_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 64 * p + 4 * j));
                        _Pragma("GCC unroll 2")
                        for (int hf = 0; hf < 2; hf++)
                            P[hf][c] = KQ_ACC(jj % 2 == 0 ? _mm256_setzero_si256() : P[hf][c], q[hf], av);
                    }
                    if (jj % 2 == 1)
                        _Pragma("GCC unroll 2")
                        for (int hf = 0; hf < 2; hf++) {
                            const __m256i sc =
                                kq_scale_s8(_mm256_load_si256((const __m256i *)(v + 64 * (48 + p) + 32 * hf)), u);
                            _Pragma("GCC unroll 2")
                            for (int c = 0; c < RN; c++) I[hf][c] = KQ_SCALE(I[hf][c], P[hf][c], sc);
                        }
                }
            }
        }
        _Pragma("GCC unroll 2")
        for (int hf = 0; hf < 2; hf++) {
            __m256i sp[8];
            k6_scale_pairs(v + 32 * hf, sp);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + dof + 16 * hf)));
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) {
                const __m256i Ic = _mm256_sub_epi32(I[hf][c], _mm256_slli_epi32(k6_scale_bsums(sp, ab[c]), 5));
                acc[hf][c] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(Ic), _mm256_mul_ps(_mm256_set1_ps(ab[c]->d), dw), acc[hf][c]);
            }
        }
    }
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) {
        _mm256_storeu_ps(dcols[c] + row0, acc[0][c]);
        _mm256_storeu_ps(dcols[c] + row0 + 8, acc[1][c]);
    }
}

/* the same sums for one half of the group (8 rows), in tiles of up to 4
 * columns: for a prompt's many columns, where the 6-bit values' unpacking
 * is shared by 4 columns instead of 2 */
static inline __attribute__((always_inline)) void rp_k6_half_avx2(const int RN, int64_t k, const uint8_t *g,
                                                                  const uint8_t *next, const void *const *acts,
                                                                  float *const *dcols, int64_t row0, const int half) {
    const int64_t nblk = k / BT_QK_K;
    const size_t bs = sizeof(bt_block_q6_K), gsize = (size_t)nblk * 16 * bs;
    __m256 acc[4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, sizeof(bt_block_q6_K), 2, &dof, &vof);
        if (half == 0) rp6_prefetch(g, next, vof, gsize, 0, 1); /* the second half reads them from cache */
        const uint8_t *v = g + vof;
        const bt_block_q8_K *ab[4];
        __m256i I[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            ab[c] = (const bt_block_q8_K *)acts[c] + b;
            I[c] = _mm256_setzero_si256();
        }
        _Pragma("GCC unroll 4")
        for (int u = 0; u < 4; u++) {
            _Pragma("GCC unroll 4")
            for (int p = 0; p < 4; p++) {
                const __m256i sc =
                    kq_scale_s8(_mm256_load_si256((const __m256i *)(v + 64 * (48 + p) + 32 * half)), u);
                __m256i P[4];
                _Pragma("GCC unroll 4")
                for (int jj = 0; jj < 4; jj++) {
                    const int j = 4 * u + jj;
                    const __m256i q = q6_rp_values_avx2(v, j, p, half);
                    _Pragma("GCC unroll 4")
                    for (int c = 0; c < RN; c++) {
                        if (jj % 2 == 0) P[c] = _mm256_setzero_si256();
                        P[c] = KQ_ACC(P[c], q, _mm256_set1_epi32(bt_cpu_load_i32(ab[c]->qs + 64 * p + 4 * j)));
                    }
                    if (jj % 2 == 1)
                        _Pragma("GCC unroll 4")
                        for (int c = 0; c < RN; c++) I[c] = KQ_SCALE(I[c], P[c], sc);
                }
            }
        }
        __m256i sp[8];
        k6_scale_pairs(v + 32 * half, sp);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + dof + 16 * half)));
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const __m256i Ic = _mm256_sub_epi32(I[c], _mm256_slli_epi32(k6_scale_bsums(sp, ab[c]), 5));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Ic), _mm256_mul_ps(_mm256_set1_ps(ab[c]->d), dw), acc[c]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) _mm256_storeu_ps(dcols[c] + row0 + 8 * half, acc[c]);
}

static void rgemm_q6_K(int64_t k, const void *group, const void *next, const void *const *acts, int64_t ncols,
                       float *const *dcols, int64_t row0) {
    const uint8_t *g = group, *nx = next;
    int64_t j = 0;
    for (; j + 4 <= ncols; j += 4) {
        rp_k6_half_avx2(4, k, g, nx, acts + j, dcols + j, row0, 0);
        rp_k6_half_avx2(4, k, g, nx, acts + j, dcols + j, row0, 1);
    }
    for (; j + 2 <= ncols; j += 2) rp_k6_tile_avx2(2, k, g, nx, acts + j, dcols + j, row0);
    if (j < ncols) rp_k6_tile_avx2(1, k, g, nx, acts + j, dcols + j, row0);
}

#define FAST(name) dot_##name##_avx2
#elif defined(HAVE_QDOT_NEON)
/* ---- NEON (aarch64; sdot with dotprod) ------------------------------------------ *
 * The K-quants' dot: a block's 256 q unpacked 32 at a time in registers
 * (kq_unpack_q_ref's values), each 16-element sub-block's sum of q a.qs
 * (q <= 63, so the bytes are read as signed) in 4 int32 lanes (sdot, or
 * smull/smull2 and sadalp), the 16 sums gathered into 4 vectors and weighted
 * by sc, M from mn and the bsums by smull/smlal: dot_kq_ref's exact I and
 * M, then kq_step in scalar. */

/* 32 values of a block: q[32 c .. 32 c + 31] (kq_unpack_q_ref), c < 8 */
static inline __attribute__((always_inline)) uint8x16x2_t kq_q32_neon(const int kind, const void *blk, const int c) {
    uint8x16x2_t v;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(3), one = vdupq_n_u8(1);
    for (int i = 0; i < 2; i++) {
        const int l = 16 * i;
        uint8x16_t x;
        if (kind == KQ4 || kind == KQ5) {
            const uint8_t *qs = kind == KQ4 ? ((const bt_block_q4_K *)blk)->qs : ((const bt_block_q5_K *)blk)->qs;
            x = vld1q_u8(qs + 32 * (c / 2) + l);
            x = c & 1 ? vshrq_n_u8(x, 4) : vandq_u8(x, m4);
            if (kind == KQ5) {
                const uint8x16_t h = vld1q_u8(((const bt_block_q5_K *)blk)->qh + l);
                x = vorrq_u8(x, vshlq_n_u8(vandq_u8(vshlq_u8(h, vdupq_n_s8((int8_t)-c)), one), 4));
            }
        } else if (kind == KQ6) {
            const bt_block_q6_K *w = blk;
            const int h = c / 4, sb = c % 4;
            const uint8x16_t lo = vld1q_u8(w->ql + 64 * h + 32 * (sb & 1) + l);
            const uint8x16_t hi = vld1q_u8(w->qh + 32 * h + l);
            x = vorrq_u8(sb >> 1 ? vshrq_n_u8(lo, 4) : vandq_u8(lo, m4),
                         vshlq_n_u8(vandq_u8(vshlq_u8(hi, vdupq_n_s8((int8_t)(-2 * sb))), m3), 4));
        } else {
            /* Q2_K and Q3_K: 2 bits of qs[32 h + l], Q3_K and its hmask bit as 4 */
            const uint8_t *qs = kind == KQ3 ? ((const bt_block_q3_K *)blk)->qs : ((const bt_block_q2_K *)blk)->qs;
            const int h = c / 4, sb = c % 4;
            x = vandq_u8(vshlq_u8(vld1q_u8(qs + 32 * h + l), vdupq_n_s8((int8_t)(-2 * sb))), m3);
            if (kind == KQ3) {
                const uint8x16_t hm = vld1q_u8(((const bt_block_q3_K *)blk)->hmask + l);
                x = vorrq_u8(x, vshlq_n_u8(vandq_u8(vshlq_u8(hm, vdupq_n_s8((int8_t)-c)), one), 2));
            }
        }
        v.val[i] = x;
    }
    return v;
}

/* the sum of 16 products of q and a, in 4 int32 lanes */
static inline int32x4_t kq_dot16_neon(uint8x16_t q, int8x16_t a) {
    const int8x16_t w = vreinterpretq_s8_u8(q);
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), w, a);
#else
    return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a))), vmull_high_s8(w, a));
#endif
}

static inline __attribute__((always_inline)) void dot_kq_neon(const int kind, int64_t k, float *s, const void *vw,
                                                              const void *va) {
    const bt_block_q8_K *a = va;
    const size_t bs = kq_block_bytes(kind);
    float acc = 0.0f;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        struct kq_block o;
        const void *blk = (const char *)vw + (size_t)b * bs;
        kq_unpack_scales(kind, blk, &o);
        int32x4_t iv = vdupq_n_s32(0);
        for (int g = 0; g < 4; g++) { /* sub-blocks 4g .. 4g + 3: q[64 g .. 64 g + 63] */
            int32x4_t d[4];
            for (int h = 0; h < 2; h++) {
                const uint8x16x2_t q = kq_q32_neon(kind, blk, 2 * g + h);
                d[2 * h] = kq_dot16_neon(q.val[0], vld1q_s8(a[b].qs + 64 * g + 32 * h));
                d[2 * h + 1] = kq_dot16_neon(q.val[1], vld1q_s8(a[b].qs + 64 * g + 32 * h + 16));
            }
            const int32x4_t p = vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3]));
            const int32x4_t sc = vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8(o.sc + 4 * g))));
            iv = vmlaq_s32(iv, sc, p);
        }
        const int32_t I = vaddvq_s32(iv);
        int32x4_t mv = vmull_s16(vld1_s16(o.mn), vld1_s16(a[b].bsums));
        mv = vmlal_s16(mv, vld1_s16(o.mn + 4), vld1_s16(a[b].bsums + 4));
        mv = vmlal_s16(mv, vld1_s16(o.mn + 8), vld1_s16(a[b].bsums + 8));
        mv = vmlal_s16(mv, vld1_s16(o.mn + 12), vld1_s16(a[b].bsums + 12));
        acc = kq_step(kq_has_min(kind), acc, I, vaddvq_s32(mv), a[b].d, o.d, o.dmin);
    }
    *s = acc;
}
static void dot_q2_K_neon(int64_t k, float *s, const void *vw, const void *va) { dot_kq_neon(KQ2, k, s, vw, va); }
static void dot_q3_K_neon(int64_t k, float *s, const void *vw, const void *va) { dot_kq_neon(KQ3, k, s, vw, va); }
static void dot_q4_K_neon(int64_t k, float *s, const void *vw, const void *va) { dot_kq_neon(KQ4, k, s, vw, va); }
static void dot_q5_K_neon(int64_t k, float *s, const void *vw, const void *va) { dot_kq_neon(KQ5, k, s, vw, va); }
static void dot_q6_K_neon(int64_t k, float *s, const void *vw, const void *va) { dot_kq_neon(KQ6, k, s, vw, va); }
#define FAST(name) dot_##name##_neon
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
    ENTRY(BT_TYPE_Q2_K, q2_K, BT_TYPE_Q8_K, q8_K), ENTRY(BT_TYPE_Q3_K, q3_K, BT_TYPE_Q8_K, q8_K),
    ENTRY(BT_TYPE_Q4_K, q4_K, BT_TYPE_Q8_K, q8_K), ENTRY(BT_TYPE_Q5_K, q5_K, BT_TYPE_Q8_K, q8_K),
    ENTRY(BT_TYPE_Q6_K, q6_K, BT_TYPE_Q8_K, q8_K),
};

const struct bt_quant_dot *bt_quant_dot_of(enum bt_type t) {
    if ((int)t < 0 || t >= BT_TYPE_COUNT || !quant_dots[t].vec_dot) return NULL;
    return &quant_dots[t];
}

/* ---- qtypes.h entries: matmul.c's table of quantised weight types ---------- */

/* an activation column: k / 256 Q8_K blocks */
static size_t act_size_q8_K(int64_t k) { return (size_t)(k / BT_QK_K) * sizeof(bt_block_q8_K); }

#define QTYPE(name, act, tiles, gemm, rp)                                 \
    const struct bt_cpu_qtype bt_cpu_qtype_##name = {                     \
        /* .act_name     = */ #act " (ggml's block_" #act ")",            \
        /* .act_size     = */ act_size_##act,                             \
        /* .quantize_act = */ bt_##act##_from_f32,                        \
        /* .vec_dot      = */ FAST(name),                                 \
        /* .tiles        = */ tiles,                                      \
        /* .gemm_min_cols, .panel_size, .pack, .gemm = */ gemm,           \
        /* .rp, .rgemm, .rpack, .rpack_min_cols = */ rp,                  \
        /* .quantize_act_ref = */ bt_##act##_from_f32,                    \
        /* .vec_dot_ref  = */ dot_##name##_ref,                           \
    }
#define NO_TILES {{0, 0, NULL}}
#if !defined(HAVE_QDOT_AVX512) && !defined(HAVE_QDOT_AVX2)
#define K_TILE_LIST(name) NO_TILES
#define K_GEMM(name) 0, NULL, NULL, NULL
#endif
#ifdef BT_CPU_IQ_GEMM
size_t bt_cpu_iq_panel_size(int64_t k) { return kq_panel_size(k); }
#define IQ_GEMM_EXPORT(name)                                                                                     \
    void bt_cpu_##name##_pack(int64_t k, const void *const *rows, void *panel) { qpack_##name(k, rows, panel); } \
    void bt_cpu_##name##_gemm(int64_t k, const void *panel, const void *const *acts, int64_t ncols,              \
                              float *const *dcols, int64_t row0, int nrows) {                                    \
        qgemm_##name(k, panel, acts, ncols, dcols, row0, nrows);                                                 \
    }
IQ_GEMM_EXPORT(iq4_xs)
IQ_GEMM_EXPORT(iq2_xxs)
IQ_GEMM_EXPORT(iq2_xs)
IQ_GEMM_EXPORT(iq2_s)
IQ_GEMM_EXPORT(iq3_xxs)
IQ_GEMM_EXPORT(iq3_s)
IQ_GEMM_EXPORT(iq1_s)
#endif
#define NO_REPACK NULL, NULL, NULL, 0
/* Q4_K's repacked layout (qtypes.h): d and dmin as the block's 4-byte scale,
 * then the 12 scale bytes and the 128 quant bytes as 35 dwords */
static const struct bt_cpu_rp_layout rp_q4_K = {0, 4, 35, 0u, 4, false, 0, NULL, NULL};
/* Q6_K's: d as the block's 2-byte scale (byte 208), then its 208 bytes of
 * ql, qh and scales rearranged (q6_rp_enc) as 52 dwords */
static const struct bt_cpu_rp_layout rp_q6_K = {208, 0, 52, 0u, 2, false, 0, q6_rp_enc, q6_rp_dec};
#ifdef HAVE_QDOT_AVX512
/* Repacked Q6_K from 128 columns on through the GEMM's panel (rpack_q6_K):
 * bench ops --repacked, 1 thread, GFLOP per CPU-second, three alternating
 * rounds: n 512 229.5-240.0 (rgemm) against 272.1-284.5; but MUL_MAT_ID
 * at 512 tokens (about 32 columns an expert) 212.7-224.2 against
 * 147.4-151.6, so the packing pays from about 106 columns (a fit of the
 * two).  Q4_K's rgemm unpacks less: n 512 gained 2-15%, 32 columns lost
 * 35%; it keeps rgemm. */
#define K4_REPACK &rp_q4_K, rgemm_q4_K, NULL, 0
#define K6_REPACK &rp_q6_K, rgemm_q6_K, rpack_q6_K, 128
#elif defined(HAVE_QDOT_AVX2)
/* Repacked Q6_K through the AVX2 GEMM's panel, from 16 columns on.  With
 * the old layout (the panel from 16 plain blocks unpacked): bench ops
 * --repacked, 1 thread, GF/cpu-s, three alternating rounds on an AVX-512
 * Xeon with the variant forced: n 512, rgemm 66-83
 * against 74-86 (avx2), 64-72 against 102-131 (avx2vnni); MUL_MAT_ID at 512
 * tokens (32 columns an expert) 57-75 against 52-60 (avx2), 55-71 against
 * 69-76 (avx2vnni).  Q4_K's rgemm is as fast at n 512 and faster at 32
 * columns: it keeps rgemm.  Since the panel copies the rearranged values
 * as they stand (rpack_q6_K), plain AVX2 takes it from 16 columns too:
 * MUL_MAT_ID at 512 tokens 93.6-97.2 (rgemm) against 104.2-106.4, three
 * alternating rounds on an AVX-512 Xeon with avx2 forced; AVX-512 was level
 * there (166.7-168.0 against 166.2-171.9) and keeps 128. */
#define K4_REPACK &rp_q4_K, rgemm_q4_K, NULL, 0
#define K6_REPACK &rp_q6_K, rgemm_q6_K, rpack_q6_K, 16
#else
#define K4_REPACK &rp_q4_K, NULL, NULL, 0 /* the layout, no kernels: not used */
#define K6_REPACK &rp_q6_K, NULL, NULL, 0
#endif
QTYPE(q2_K, q8_K, K_TILE_LIST(q2_K), K_GEMM(q2_K), NO_REPACK);
QTYPE(q3_K, q8_K, K_TILE_LIST(q3_K), K_GEMM(q3_K), NO_REPACK);
QTYPE(q4_K, q8_K, K_TILE_LIST(q4_K), K_GEMM(q4_K), K4_REPACK);
QTYPE(q5_K, q8_K, K_TILE_LIST(q5_K), K_GEMM(q5_K), NO_REPACK);
QTYPE(q6_K, q8_K, K_TILE_LIST(q6_K), K_GEMM(q6_K), K6_REPACK);
