/* quant_iq.c - the 256-element table weight types on the CPU: IQ4_XS and the
 * lattice types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, dotted with
 * Q8_K activation columns (as ggml pairs them), and their entries in
 * matmul.c's table (qtypes.h).
 *
 * Every one of these types is, per 256-element block, a signed integer
 * value v[e] per element, an integer scale sc[s] per 16-element sub-block
 * (the types with one scale per 32 elements repeat it) and one float
 * d * mult (mult a power of two):
 *   IQ4_XS   v = bt_iq4nl_values[q]            sc = ls - 32     mult 1
 *   IQ2_XXS  v = grid * sign  (grid 8, 25, 43) sc = 2 ls + 1    mult 1/8
 *   IQ2_XS, IQ2_S   as IQ2_XXS, a scale per 16 elements
 *   IQ3_XXS  v = grid * sign  (4 .. 62)        sc = 2 ls + 1    mult 1/4
 *   IQ3_S    v = grid * sign  (1 .. 15)        sc = 2 ls + 1    mult 1
 *   IQ1_S    v = 8 grid +- 1  (grid -1, 0, 1)  sc = 2 ls + 1    mult 1/8
 * (x = d * mult * sc * v is the dequantised value, quants.c, up to the
 * order of float rounding).  Against a Q8_K column a the block's dot is the
 * exact integer
 *   I = sum_s sc[s] sum_{e in s} v[e] a.qs[e]          (|I| < 2^28)
 * and one float step, blocks in increasing order from acc = +0:
 *   acc = fma((float)I, (d * mult) * a.d, acc).
 * dot_iq_ref spells it out in plain C; the AVX-512 path (one row, 1, 2 or 4
 * columns sharing the row's decoding; IQ4_XS 4 rows against 1, 2 or 4)
 * forms the same I: IQ4_XS by its levels + 128 against the activation bytes
 * (iq4_act_prep), the lattice types per 64 elements as the
 * bytes |v| (grid entries gathered) with the
 * signs moved onto the activation bytes (exact: Q8_K's are in -127..127),
 * vpmaddubsw (pairs, at most 2 * 127 * 127 < 2^15), vpdpwssd with each
 * pair's scale into 16 int32 lanes, then the lanes added; the AVX2 path
 * (builds without AVX-512) the same 32 elements at a time.
 * The packed GEMM (prompt sizes: the K-quants' in quant_dot.c, the lattice
 * types' blocks unpacked by bt_cpu_iq_unpack below) forms the same I with a
 * lane per weight row.  Integer sums are exact in any grouping, so every path
 * gives the same bits (tests/test_quants.c compares them).  Built with
 * -ffp-contract=off.
 */
#include "qtypes.h"

#include "cpu_impl.h"
#include "quant_dot.h"
#include "quants.h"

#include <math.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__) && \
    defined(__BMI2__)
#define HAVE_IQ_AVX512 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

enum iq_kind { IQ4XS, IQ2XXS, IQ2XS, IQ2S, IQ3XXS, IQ3S, IQ1S };

static size_t iq_block_bytes(int kind) {
    switch (kind) {
    case IQ4XS: return sizeof(bt_block_iq4_xs);
    case IQ2XXS: return sizeof(bt_block_iq2_xxs);
    case IQ2XS: return sizeof(bt_block_iq2_xs);
    case IQ2S: return sizeof(bt_block_iq2_s);
    case IQ3XXS: return sizeof(bt_block_iq3_xxs);
    case IQ3S: return sizeof(bt_block_iq3_s);
    default: return sizeof(bt_block_iq1_s);
    }
}

static float iq_mult(int kind) {
    switch (kind) {
    case IQ2XXS: case IQ2XS: case IQ2S: case IQ1S: return 0.125f;
    case IQ3XXS: return 0.25f;
    default: return 1.0f;
    }
}

static inline uint32_t rd32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- plain C ---------------------------------------------------------------- */

/* the 16-element scales of a block (sc16[j]: elements 16j .. 16j+15) */
static void iq_scales(int kind, const void *blk, int sc16[16]) {
    for (int j = 0; j < 16; j++) {
        const int s32 = j / 2; /* the 32-element sub-block */
        int sc;
        switch (kind) {
        case IQ4XS: sc = bt_iq4_xs_scale(blk, s32) - 32; break;
        case IQ2XXS: sc = 2 * (int)(rd32(((const bt_block_iq2_xxs *)blk)->qs + 4 * s32 + 2) >> 28) + 1; break;
        case IQ2XS: sc = 2 * ((((const bt_block_iq2_xs *)blk)->scales[j / 2] >> (4 * (j % 2))) & 0xF) + 1; break;
        case IQ2S: sc = 2 * ((((const bt_block_iq2_s *)blk)->scales[j / 2] >> (4 * (j % 2))) & 0xF) + 1; break;
        case IQ3XXS: sc = 2 * (int)(rd32(((const bt_block_iq3_xxs *)blk)->qs + 64 + 4 * s32) >> 28) + 1; break;
        case IQ3S: sc = 2 * ((((const bt_block_iq3_s *)blk)->scales[s32 / 2] >> (4 * (s32 % 2))) & 0xF) + 1; break;
        default: sc = 2 * ((((const bt_block_iq1_s *)blk)->qh[s32] >> 12) & 7) + 1; break;
        }
        sc16[j] = sc;
    }
}

static inline int sgn(uint8_t signs, int j, int v) { return (signs >> j) & 1 ? -v : v; }

/* group g (elements 8g .. 8g+7) of a lattice block: its 8 grid bytes *e
 * (IQ3_XXS and IQ3_S: two entries of 4) and its sign bits *s (bit j: element
 * j negative); IQ1_S: *s is 1 where its delta is -1 (element 8 e_j + delta) */
static inline __attribute__((always_inline)) void iq_group(const int kind, const void *blk, const int g, uint64_t *e,
                                                           unsigned *s) {
    const int s32 = g / 4, l = g % 4;
    switch (kind) {
    case IQ2XXS: {
        const bt_block_iq2_xxs *w = blk;
        const uint32_t idx = rd32(w->qs + 4 * s32), sg = rd32(w->qs + 4 * s32 + 2);
        *e = bt_iq2xxs_grid[(idx >> (8 * l)) & 0xFF];
        *s = bt_iq2_signs[(sg >> (7 * l)) & 127];
        return;
    }
    case IQ2XS: {
        const bt_block_iq2_xs *w = blk;
        *e = bt_iq2xs_grid[w->qs[g] & 511];
        *s = bt_iq2_signs[w->qs[g] >> 9];
        return;
    }
    case IQ2S: {
        const bt_block_iq2_s *w = blk;
        *e = bt_iq2s_grid[w->qs[g] | (((w->qh[g / 4] >> (2 * (g % 4))) & 3) << 8)];
        *s = w->signs[g];
        return;
    }
    case IQ3XXS: {
        const bt_block_iq3_xxs *w = blk;
        *e = bt_iq3xxs_grid[w->qs[2 * g]] | (uint64_t)bt_iq3xxs_grid[w->qs[2 * g + 1]] << 32;
        *s = bt_iq2_signs[(rd32(w->qs + 64 + 4 * s32) >> (7 * l)) & 127];
        return;
    }
    case IQ3S: {
        const bt_block_iq3_s *w = blk;
        const int q = 2 * g; /* groups of 4: q, q + 1 (the same byte of qh) */
        *e = bt_iq3s_grid[w->qs[q] | (((w->qh[q / 8] >> (q % 8)) & 1) << 8)] |
             (uint64_t)bt_iq3s_grid[w->qs[q + 1] | (((w->qh[q / 8] >> (q % 8 + 1)) & 1) << 8)] << 32;
        *s = w->signs[g];
        return;
    }
    default: {
        const bt_block_iq1_s *w = blk;
        const uint16_t qh = w->qh[s32];
        *e = bt_iq1s_grid[w->qs[g] | (((qh >> (3 * l)) & 7) << 8)];
        *s = qh >> 15;
        return;
    }
    }
}

/* the 256 signed values of a block */
static void iq_values(int kind, const void *blk, int8_t v[BT_QK_K]) {
    for (int g = 0; g < 32; g++) { /* groups of 8 */
        int8_t *o = v + 8 * g;
        if (kind == IQ4XS) {
            const bt_block_iq4_xs *w = blk;
            for (int j = 0; j < 8; j++) {
                const int e = 8 * (g % 4) + j; /* in the sub-block */
                const uint8_t q = w->qs[16 * (g / 4) + e % 16];
                o[j] = bt_iq4nl_values[e < 16 ? q & 0xF : q >> 4];
            }
            continue;
        }
        uint64_t e;
        unsigned s;
        iq_group(kind, blk, g, &e, &s);
        for (int j = 0; j < 8; j++)
            o[j] = kind == IQ1S ? (int8_t)(8 * (int8_t)(e >> (8 * j)) + (s ? -1 : 1))
                                : (int8_t)sgn((uint8_t)s, j, (int8_t)(e >> (8 * j)));
    }
}

static inline float iq_d(const void *blk) {
    bt_fp16_t d;
    memcpy(&d, blk, 2); /* every type's d is its first field */
#ifdef __F16C__
    return _cvtsh_ss(d); /* exact, as bt_fp16_to_fp32, for every finite value */
#else
    return bt_fp16_to_fp32(d);
#endif
}

static void dot_iq_ref(int kind, int64_t k, float *s, const void *vw, const void *va) {
    const bt_block_q8_K *a = va;
    const size_t bs = iq_block_bytes(kind);
    const float mult = iq_mult(kind);
    float acc = 0.0f;
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const void *blk = (const char *)vw + (size_t)b * bs;
        int8_t v[BT_QK_K];
        int sc[16];
        iq_values(kind, blk, v);
        iq_scales(kind, blk, sc);
        int32_t I = 0;
        for (int j = 0; j < 16; j++) {
            int32_t p = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) p += v[e] * a[b].qs[e];
            I += sc[j] * p;
        }
        acc = fmaf((float)I, (iq_d(blk) * mult) * a[b].d, acc);
    }
    *s = acc;
}

#define IQ_REF(name, kind) \
    static void dot_##name##_ref(int64_t k, float *s, const void *w, const void *a) { dot_iq_ref(kind, k, s, w, a); }
IQ_REF(iq4_xs, IQ4XS)
IQ_REF(iq2_xxs, IQ2XXS)
IQ_REF(iq2_xs, IQ2XS)
IQ_REF(iq2_s, IQ2S)
IQ_REF(iq3_xxs, IQ3XXS)
IQ_REF(iq3_s, IQ3S)
IQ_REF(iq1_s, IQ1S)

#ifdef HAVE_IQ_AVX512
/* ---- AVX-512 (BW, VL, VNNI; BMI2) ---------------------------------------------- */

/* One block of one row, decoded once for every column: chunk c (elements
 * 64c .. 64c+63) as the bytes |v| (u[c]) and the elements whose v is
 * negative (sm[c]: their activation bytes are negated, exact as Q8_K's are
 * in -127..127), and the scale of each int16 lane of vpmaddubsw's pair sums
 * (scv[c]).  |v| <= 127, so a pair sum is at most 2 * 127 * 127 < 2^15: no
 * saturation. */
struct iq_dec {
    __m512i u[4], scv[4];
    __mmask64 sm[4];
    float dm; /* d * mult */
};

/* IQ2's and IQ3_XXS's sign bytes from 8 7-bit sign indices, one a byte in
 * b: each index with its parity as bit 7 (bt_iq2_signs) */
static inline uint64_t with_parity(uint64_t b) {
    uint64_t p = b ^ (b >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return b | (p & 0x0101010101010101ull) << 7;
}
/* the same from 8 indices packed at bits 7j of x */
static inline uint64_t signs8(uint64_t x) { return with_parity(_pdep_u64(x, 0x7F7F7F7F7F7F7F7Full)); }

#if defined(__AVX512VBMI__) && defined(__GFNI__)
#define IQ_SIGNS_SIMD 1
/* with_parity on every byte (bit 7 ignored): one GF(2) affine map that keeps
 * bits 0..6 and makes bit 7 their parity */
static inline __m512i with_parity_v(__m512i x) {
    return _mm512_gf2p8affine_epi64_epi8(x, _mm512_set1_epi64(0x010204081020407Fll), 0);
}
#endif

/* 8 4-bit values in x (bits 4j) as bytes */
static inline uint64_t nibbles8(uint32_t x) { return _pdep_u64(x, 0x0F0F0F0F0F0F0F0Full); }

/* sc: the 16 scales as int8 (bytes 0..15) -> scv[c], lane i the scale of
 * elements 64c + 2i, 2i+1 (16-element group 4c + i/8) */
static inline void iq_lane_scales(__m128i sc, __m512i scv[4]) {
    const __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc));
    const __m512i base = _mm512_srli_epi16(
        _mm512_setr_epi64(0x0003000200010000ll, 0x0007000600050004ll, 0x000b000a00090008ll, 0x000f000e000d000cll,
                          0x0013001200110010ll, 0x0017001600150014ll, 0x001b001a00190018ll, 0x001f001e001d001cll),
        3); /* lane i: i / 8 */
    for (int c = 0; c < 4; c++)
        scv[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16((short)(4 * c))), s16);
}
/* 8 scales (one per 32 elements) in the bytes of x -> the 16 of iq_lane_scales */
static inline __m128i dup8(uint64_t x) {
    const __m128i v = _mm_cvtsi64_si128((long long)x);
    return _mm_unpacklo_epi8(v, v);
}
/* 2 ls + 1, bytewise (ls <= 15) */
static inline uint64_t odd8(uint64_t ls) { return ls * 2 + 0x0101010101010101ull; }

/* 8 grid entries (u64) at the indices idx (8 x int64) */
static inline __m512i gather8(const uint64_t *grid, __m512i idx) {
    return _mm512_i64gather_epi64(idx, (const long long *)grid, 8);
}
/* 16 grid entries (u32) at the indices idx (16 x int32) */
static inline __m512i gather16(const uint32_t *grid, __m512i idx) {
    return _mm512_i32gather_epi32(idx, (const int *)grid, 4);
}

static inline __attribute__((always_inline)) void iq_decode(const int kind, const void *blk, struct iq_dec *o) {
    o->dm = iq_d(blk) * iq_mult(kind);
    __m128i sc;
    BT_ASSERT(kind != IQ4XS); /* iq4_row_dec */
    if (kind == IQ2XXS) {
        const bt_block_iq2_xxs *w = blk;
        const uint8_t *p = (const uint8_t *)w->qs; /* qword ib: sub-block ib's 4 index bytes, then its sign/scale u32 */
        uint64_t ls, sm[4];
#ifdef IQ_SIGNS_SIMD
        const __m512i src = _mm512_loadu_si512(p);
        /* bytes 0..3 of qword ib: its sign indices (bits 32 + 7l, vpmultishiftqb), then
         * the sign bytes; the qwords' low dwords packed: chunk c's 8 as qword c */
        const __m512i sg = with_parity_v(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x35352E2720ll), src));
        _mm256_storeu_si256((__m256i *)sm, _mm512_castsi512_si256(_mm512_permutexvar_epi32(
                                               _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14), sg)));
        ls = (uint64_t)_mm_cvtsi128_si64(_mm512_cvtepi64_epi8(_mm512_srli_epi64(src, 60)));
#else
        ls = 0;
        for (int ib = 0; ib < 8; ib++) ls |= (uint64_t)(p[8 * ib + 7] >> 4) << (8 * ib);
        for (int c = 0; c < 4; c++)
            sm[c] = signs8((rd32(p + 16 * c + 4) & 0x0FFFFFFFu) | (uint64_t)(rd32(p + 16 * c + 12) & 0x0FFFFFFFu) << 28);
#endif
        sc = dup8(odd8(ls));
        for (int c = 0; c < 4; c++) {
            const uint8_t *q = p + 16 * c;
            const uint64_t idx = (uint64_t)rd32(q) | (uint64_t)rd32(q + 8) << 32;
            o->u[c] = gather8(bt_iq2xxs_grid, _mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)idx)));
            o->sm[c] = sm[c];
        }
    } else if (kind == IQ2XS || kind == IQ2S) {
        uint64_t s8;
        memcpy(&s8, kind == IQ2XS ? ((const bt_block_iq2_xs *)blk)->scales : ((const bt_block_iq2_s *)blk)->scales, 8);
        const __m128i v = _mm_cvtsi64_si128((long long)s8), m4 = _mm_set1_epi8(0x0F);
        const __m128i ls = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        sc = _mm_add_epi8(_mm_add_epi8(ls, ls), _mm_set1_epi8(1));
        if (kind == IQ2XS) {
            const bt_block_iq2_xs *w = blk;
            uint64_t sm[4];
#ifdef IQ_SIGNS_SIMD
            /* the 32 sign indices (bits 9..15 of each u16) as bytes, then the sign bytes */
            const __m256i si = _mm512_cvtepi16_epi8(_mm512_srli_epi16(_mm512_loadu_si512(w->qs), 9));
            _mm256_storeu_si256((__m256i *)sm, _mm512_castsi512_si256(with_parity_v(_mm512_castsi256_si512(si))));
#else
            for (int c = 0; c < 4; c++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(w->qs + 8 * c));
                sm[c] = with_parity((uint64_t)_mm_cvtsi128_si64(_mm_packus_epi16(_mm_srli_epi16(q, 9), _mm_setzero_si128())));
            }
#endif
            for (int c = 0; c < 4; c++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(w->qs + 8 * c));
                o->u[c] = gather8(bt_iq2xs_grid, _mm512_and_si512(_mm512_cvtepu16_epi64(q), _mm512_set1_epi64(511)));
                o->sm[c] = sm[c];
            }
        } else {
            const bt_block_iq2_s *w = blk;
            for (int c = 0; c < 4; c++) {
                /* the 2 high bits of groups 8c .. 8c+7 from qh[2c], qh[2c+1] */
                const uint32_t qh = (uint32_t)w->qh[2 * c] | (uint32_t)w->qh[2 * c + 1] << 8;
                const __m512i hi = _mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)_pdep_u64(qh, 0x0303030303030303ull)));
                const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(w->qs + 8 * c)));
                o->u[c] = gather8(bt_iq2s_grid, _mm512_or_si512(lo, _mm512_slli_epi64(hi, 8)));
                uint64_t m;
                memcpy(&m, w->signs + 8 * c, 8);
                o->sm[c] = m;
            }
        }
    } else if (kind == IQ3XXS) {
        const bt_block_iq3_xxs *w = blk;
        const uint8_t *sas = w->qs + 64; /* sub-block ib's sign/scale u32 at 4 ib */
        uint64_t ls, sm[4];
#ifdef IQ_SIGNS_SIMD
        /* qword c holds sub-blocks 2c, 2c+1: its 8 sign indices at bits 0, 7, 14, 21, 32, ..., 53 */
        const __m512i src = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)sas));
        const __m512i sg = with_parity_v(_mm512_multishift_epi64_epi8(_mm512_set1_epi64(0x352E2720150E0700ll), src));
        _mm256_storeu_si256((__m256i *)sm, _mm512_castsi512_si256(sg));
        ls = (uint64_t)_mm_cvtsi128_si64(_mm256_cvtepi32_epi8(_mm256_srli_epi32(_mm512_castsi512_si256(src), 28)));
#else
        ls = 0;
        for (int ib = 0; ib < 8; ib++) ls |= (uint64_t)(sas[4 * ib + 3] >> 4) << (8 * ib);
        for (int c = 0; c < 4; c++)
            sm[c] = signs8((rd32(sas + 8 * c) & 0x0FFFFFFFu) | (uint64_t)(rd32(sas + 8 * c + 4) & 0x0FFFFFFFu) << 28);
#endif
        sc = dup8(odd8(ls));
        for (int c = 0; c < 4; c++) {
            const __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->qs + 16 * c)));
            o->u[c] = gather16(bt_iq3xxs_grid, idx);
            o->sm[c] = sm[c];
        }
    } else if (kind == IQ3S) {
        const bt_block_iq3_s *w = blk;
        sc = dup8(odd8(nibbles8(rd32(w->scales))));
        for (int c = 0; c < 4; c++) {
            const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w->qs + 16 * c)));
            const __mmask16 h = (__mmask16)((uint32_t)w->qh[2 * c] | (uint32_t)w->qh[2 * c + 1] << 8);
            o->u[c] = gather16(bt_iq3s_grid, _mm512_mask_or_epi32(lo, h, lo, _mm512_set1_epi32(256)));
            uint64_t m;
            memcpy(&m, w->signs + 8 * c, 8);
            o->sm[c] = m;
        }
    } else {
        const bt_block_iq1_s *w = blk;
        const __m128i qh = _mm_loadu_si128((const __m128i *)w->qh);
        const __m128i ls = _mm_packus_epi16(_mm_and_si128(_mm_srli_epi16(qh, 12), _mm_set1_epi16(7)), _mm_setzero_si128());
        sc = _mm_unpacklo_epi8(_mm_add_epi8(_mm_add_epi8(ls, ls), _mm_set1_epi8(1)),
                               _mm_add_epi8(_mm_add_epi8(ls, ls), _mm_set1_epi8(1)));
        const __m512i lut8 = _mm512_broadcast_i32x4(_mm_setr_epi8(-8, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
        for (int c = 0; c < 4; c++) {
            const uint16_t qh0 = w->qh[2 * c], qh1 = w->qh[2 * c + 1];
            /* the 8 11-bit indices: qs bytes, 3 high bits each from qh */
            const uint64_t hi = _pdep_u64((uint64_t)(qh0 & 0x0FFF) | (uint64_t)(qh1 & 0x0FFF) << 12, 0x0707070707070707ull);
            uint64_t lo;
            memcpy(&lo, w->qs + 8 * c, 8);
            const __m512i idx = _mm512_or_si512(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)lo)),
                                                _mm512_slli_epi64(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)hi)), 8));
            const __m512i g = gather8(bt_iq1s_grid, idx); /* -1, 0, 1 */
            const __m512i g8 = _mm512_shuffle_epi8(lut8, _mm512_add_epi8(g, _mm512_set1_epi8(1)));
            const __m512i d = _mm512_mask_mov_epi8(_mm512_set1_epi8((char)(qh0 & 0x8000 ? -1 : 1)),
                                                   (__mmask64)0xFFFFFFFF00000000ull,
                                                   _mm512_set1_epi8((char)(qh1 & 0x8000 ? -1 : 1)));
            const __m512i v = _mm512_add_epi8(g8, d); /* 8 grid +- 1 */
            o->u[c] = _mm512_abs_epi8(v);
            o->sm[c] = _mm512_movepi8_mask(v);
        }
    }
    iq_lane_scales(sc, o->scv);
}

/* IQ4_XS by the offset: its levels v + 128 (1 .. 241) as vpdpbusd's unsigned
 * bytes against the activation bytes, the accumulator started at -128 times
 * the activations' sum over the same 4 bytes, so that each int32 lane holds
 * sum v a exactly (|lane| < 2^18).  The activation is laid out once per block
 * and column to match the nibbles as they lie: half h (elements 128 h ..)
 * as lo[h], whose 128-bit lane j holds elements 128 h + 32 j + 0..15 (the
 * low nibbles of qs[64 h + 16 j ..]), and hi[h] the next 16 of each (the
 * high nibbles); a lane's sum times its sub-block's scale (vpmulld) and the
 * lanes added is the block's I.  No sign masks and no weight shuffles: half
 * the instructions of iq_decode's path, and the same I. */
struct iq4_act {
    __m512i lo[2], hi[2], neg[2];
};
static inline __attribute__((always_inline)) void iq4_act_prep(const bt_block_q8_K *a, struct iq4_act *p) {
    const __m512i ilo = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), ihi = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
    const __m512i c128 = _mm512_set1_epi8((char)0x80);
    for (int h = 0; h < 2; h++) {
        const __m512i x0 = _mm512_loadu_si512(a->qs + 128 * h), x1 = _mm512_loadu_si512(a->qs + 128 * h + 64);
        p->lo[h] = _mm512_permutex2var_epi64(x0, ilo, x1);
        p->hi[h] = _mm512_permutex2var_epi64(x0, ihi, x1);
        const __m512i c = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, p->lo[h]), c128, p->hi[h]);
        p->neg[h] = _mm512_sub_epi32(_mm512_setzero_si512(), c);
    }
}
/* one IQ4_XS block of one row: the bytes v + 128 of each half's low and high
 * nibbles, and each int32 lane's scale */
struct iq4_row {
    __m512i lo[2], hi[2], scv[2];
    float dm;
};
static inline __attribute__((always_inline)) void iq4_row_dec(const bt_block_iq4_xs *w, struct iq4_row *o) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_xor_si128(_mm_loadu_si128((const __m128i *)bt_iq4nl_values),
                                                             _mm_set1_epi8((char)0x80)));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; h++) {
        const __m512i x = _mm512_loadu_si512(w->qs + 64 * h);
        o->lo[h] = _mm512_shuffle_epi8(lut, _mm512_and_si512(x, m4));
        o->hi[h] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
    }
    const uint64_t ls = nibbles8(rd32(w->scales_l)) | _pdep_u64(w->scales_h, 0x3030303030303030ull);
    const __m512i s32 = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ls)), _mm512_set1_epi32(32));
    o->scv[0] = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), s32);
    o->scv[1] = _mm512_permutexvar_epi32(_mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7), s32);
    o->dm = iq_d(w) * iq_mult(IQ4XS);
}
/* the block's 16 lanes whose sum is I */
static inline __attribute__((always_inline)) __m512i iq4_lanes(const struct iq4_row *o, const struct iq4_act *p) {
    __m512i P = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        const __m512i t = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p->neg[h], o->lo[h], p->lo[h]), o->hi[h], p->hi[h]);
        P = _mm512_add_epi32(P, _mm512_mullo_epi32(t, o->scv[h]));
    }
    return P;
}

/* one decoded block against one column: the exact I */
static inline __attribute__((always_inline)) int32_t iq_block_dot(const struct iq_dec *o, const bt_block_q8_K *a) {
    __m512i I = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i av = _mm512_loadu_si512(a->qs + 64 * c);
        av = _mm512_mask_sub_epi8(av, o->sm[c], _mm512_setzero_si512(), av);
        I = _mm512_dpwssd_epi32(I, _mm512_maddubs_epi16(o->u[c], av), o->scv[c]);
    }
    return _mm512_reduce_add_epi32(I);
}

/* one row against RN columns (out[c]) */
static inline __attribute__((always_inline)) void iq_row(const int kind, const int RN, int64_t k, const void *w_row,
                                                         const void *const *acts, float *out) {
    const size_t bs = iq_block_bytes(kind);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (kind == IQ4XS) {
        for (int64_t b = 0; b < k / BT_QK_K; b++) {
            struct iq4_row o;
            iq4_row_dec((const bt_block_iq4_xs *)w_row + b, &o);
            for (int c = 0; c < RN; c++) {
                const bt_block_q8_K *a = (const bt_block_q8_K *)acts[c] + b;
                struct iq4_act p;
                iq4_act_prep(a, &p);
                acc[c] = fmaf((float)_mm512_reduce_add_epi32(iq4_lanes(&o, &p)), o.dm * a->d, acc[c]);
            }
        }
        for (int c = 0; c < RN; c++) out[c] = acc[c];
        return;
    }
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const void *blk = (const char *)w_row + (size_t)b * bs;
        struct iq_dec o;
        iq_decode(kind, blk, &o);
        for (int c = 0; c < RN; c++) {
            const bt_block_q8_K *a = (const bt_block_q8_K *)acts[c] + b;
            acc[c] = fmaf((float)iq_block_dot(&o, a), o.dm * a->d, acc[c]);
        }
    }
    for (int c = 0; c < RN; c++) out[c] = acc[c];
}

/* 4 IQ4_XS rows against RN = 1, 2 or 4 columns (out[c * 4 + r]): the
 * decode rows (matmul repeats the last row for a shorter tail), and the few
 * columns of a batch's decode or an expert's share of a short prompt.
 * Each row is decoded once a block for every column and each column laid
 * out once a block for the 4 rows (the 1-row tiles lay it out again for
 * every row), and the rows' four reductions share one tree (one row at a
 * time left each block's lane sum and float step waiting on the last).  The
 * same I and float step per row, column and block. */
static inline __attribute__((always_inline)) void iq4_rows(const int RN, int64_t k, const void *const *w_rows,
                                                           const void *const *acts, const void *const *next,
                                                           float *out) {
    float acc[4][4] = {{0.0f}};
    const int64_t nblk = k / BT_QK_K;
    const int block = bt_cpu_tile_block_kind(w_rows, next, nblk, sizeof(bt_block_iq4_xs), 4);
    for (int64_t b = 0; b < nblk; b++) {
        bt_cpu_tile_prefetch(w_rows, next, block, b, nblk, sizeof(bt_block_iq4_xs), 4);
        const bt_block_q8_K *a[4];
        for (int c = 0; c < RN; c++) a[c] = (const bt_block_q8_K *)acts[c] + b;
        __m512i I[4][4];
        float dm[4];
        if (RN <= 2) {
            /* the columns laid out first, each row decoded and dotted with them (fewer
             * registers live: the 1-column tile is 1.1x faster so) */
            struct iq4_act p[2];
            for (int c = 0; c < RN; c++) iq4_act_prep(a[c], &p[c]);
            for (int r = 0; r < 4; r++) {
                struct iq4_row o;
                iq4_row_dec((const bt_block_iq4_xs *)w_rows[r] + b, &o);
                dm[r] = o.dm;
                for (int c = 0; c < RN; c++) I[c][r] = iq4_lanes(&o, &p[c]);
            }
        } else {
            /* the rows decoded first, each column laid out and dotted with them */
            struct iq4_row o[4];
            for (int r = 0; r < 4; r++) {
                iq4_row_dec((const bt_block_iq4_xs *)w_rows[r] + b, &o[r]);
                dm[r] = o[r].dm;
            }
            for (int c = 0; c < RN; c++) {
                struct iq4_act p;
                iq4_act_prep(a[c], &p);
                for (int r = 0; r < 4; r++) I[c][r] = iq4_lanes(&o[r], &p);
            }
        }
        for (int c = 0; c < RN; c++) {
            /* the four lane sums at once (exact integers, any order) */
            __m256i h[4];
            for (int r = 0; r < 4; r++)
                h[r] = _mm256_add_epi32(_mm512_castsi512_si256(I[c][r]), _mm512_extracti64x4_epi64(I[c][r], 1));
            const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
            _Alignas(16) int32_t s4[4];
            _mm_store_si128((__m128i *)s4, _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
            for (int r = 0; r < 4; r++) acc[c][r] = fmaf((float)s4[r], dm[r] * a[c]->d, acc[c][r]);
        }
    }
    for (int c = 0; c < RN; c++)
        for (int r = 0; r < 4; r++) out[c * 4 + r] = acc[c][r];
}
/* 4 rows against one column (out[r]) */
static inline __attribute__((always_inline)) void iq_rows(const int kind, int64_t k, const void *const *w_rows,
                                                          const void *act, const void *const *next, float *out) {
    BT_ASSERT(kind == IQ4XS);
    iq4_rows(1, k, w_rows, &act, next, out);
}
/* IQ4_XS's 4 x 2 and 4 x 4 tiles */
static void qtile_iq4_xs_4x2(int64_t k, const void *const *w, const void *const *a, const void *const *next,
                             float *out) {
    iq4_rows(2, k, w, a, next, out);
}
static void qtile_iq4_xs_4x4(int64_t k, const void *const *w, const void *const *a, const void *const *next,
                             float *out) {
    iq4_rows(4, k, w, a, next, out);
}
#define IQ4_XS_TILES_4XN 1

#define IQ_ROW iq_row
#define IQ_ROWS iq_rows

/* a lattice block's 256 values v + 128 (bt_cpu_iq_unpack) */
static inline __attribute__((always_inline)) void iq_unpack_values(const int kind, const void *blk, uint8_t *q) {
    struct iq_dec o;
    iq_decode(kind, blk, &o);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_mask_sub_epi8(o.u[c], o.sm[c], _mm512_setzero_si512(), o.u[c]);
        _mm512_storeu_si512(q + 64 * c, _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)));
    }
}
#elif defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
/* ---- AVX2 ------------------------------------------------------------------------ *
 * The AVX-512 path's arithmetic 32 elements (one sub-block) at a time: the
 * bytes |v| (IQ4_XS's levels by vpshufb, the grids' entries gathered), the
 * signs moved onto the activation bytes (vpsignb by +-1, or for IQ1_S by
 * its grid value -1, 0, 1: iq1s_delta adds the rest of v), vpmaddubsw
 * (pairs at most 2 * 127 * 127 < 2^15), vpmaddwd with each pair's 16-element scale, the
 * int32 lanes added: the same exact I per block and the same float step. */

/* a sign byte (bit i: element i) as 8 bytes of +-1 */
#define SIGN1(b, i) ((((b) >> (i)) & 1 ? 0xFFull : 0x01ull) << (8 * (i)))
#define SIGN8(b)                                                                                             \
    (SIGN1(b, 0) | SIGN1(b, 1) | SIGN1(b, 2) | SIGN1(b, 3) | SIGN1(b, 4) | SIGN1(b, 5) | SIGN1(b, 6) | SIGN1(b, 7))
/* the sign byte of a 7-bit index i as 8 bytes of +-1: i and its parity in
 * bit 7 (bt_iq2_signs[i]), in one table (1 KB) */
#define PARITY7(i) (((i) ^ (i) >> 1 ^ (i) >> 2 ^ (i) >> 3 ^ (i) >> 4 ^ (i) >> 5 ^ (i) >> 6) & 1)
#define EVEN8(i) SIGN8((i) | PARITY7(i) << 7)
#define EVEN8X4(b) EVEN8(b), EVEN8((b) + 1), EVEN8((b) + 2), EVEN8((b) + 3)
#define EVEN8X16(b) EVEN8X4(b), EVEN8X4((b) + 4), EVEN8X4((b) + 8), EVEN8X4((b) + 12)
#define EVEN8X64(b) EVEN8X16(b), EVEN8X16((b) + 16), EVEN8X16((b) + 32), EVEN8X16((b) + 48)
static const uint64_t sign_even_bytes[128] = {EVEN8X64(0), EVEN8X64(64)};
/* the signs of four 7-bit indices (IQ2_XXS, IQ3_XXS; byte l:
 * elements 8l .. 8l+7) as 32 bytes of +-1, four loads of the table: looked
 * up one by one, then packed for signs32_packed, they made a scalar chain
 * ahead of its vector one (their decode rows 1.1-1.7x) */
static inline __m256i signs32_even4(unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    return _mm256_setr_epi64x((long long)sign_even_bytes[i0], (long long)sign_even_bytes[i1],
                              (long long)sign_even_bytes[i2], (long long)sign_even_bytes[i3]);
}
/* 4 sign bytes packed in s (byte l: elements 8l .. 8l+7) as 32 bytes of
 * +-1, for bytes that lie packed in the block (IQ2_S, IQ3_S: 1.05-1.3x a
 * table of their 256 values) */
static inline __m256i signs32_packed(uint32_t s) {
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)s),
                                              _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                                 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(1));
}
/* IQ2's and IQ3_XXS's 4 sign bytes from four 7-bit indices at bits 7l of x */
static inline __m256i signs32_even(uint32_t x) {
    return signs32_even4(x & 127, (x >> 7) & 127, (x >> 14) & 127, (x >> 21) & 127);
}
/* 4 grid entries (u64: 8 elements each) at indices i0 .. i3, by scalar loads
 * (on a Zen 4 vpgatherdq and vpgatherdd made the lattice types' decode rows
 * 1.02-1.1x slower).  The indices come from the block's bytes in scalar
 * registers: made in a vector and stored for scalar loads, they cost a
 * store-to-load round trip a group */
static inline __m256i grid4(const uint64_t *grid, unsigned i0, unsigned i1, unsigned i2, unsigned i3) {
    return _mm256_setr_epi64x((long long)grid[i0], (long long)grid[i1], (long long)grid[i2], (long long)grid[i3]);
}
/* 8 grid entries (u32: 4 elements each) at the 8 indices i */
static inline __m256i grid8x4(const uint32_t *grid, const unsigned i[8]) {
    return _mm256_setr_epi32((int)grid[i[0]], (int)grid[i[1]], (int)grid[i[2]], (int)grid[i[3]], (int)grid[i[4]],
                             (int)grid[i[5]], (int)grid[i[6]], (int)grid[i[7]]);
}

/* what a block's sub-blocks share, made once a block in vectors (a
 * sub-block then takes its part with a shuffle or two instead of scalar
 * look-ups, shifts and inserts of its own).  IQ2_XS: its 32 sign bytes,
 * byte 2j the 7-bit index of group j with its parity in bit 7 (a byte
 * table look-up of 4 bits: the parity of i ^ i >> 4), and its 16 scales
 * 2 s + 1 as int16 (IQ2_S's too).  IQ3_S: its 64 grid indices.  IQ4_XS: its
 * 8 scales ls - 32, each in both int16 halves of int32 lane j. */
struct iq_blk_avx2 {
    __m256i sgn[2]; /* IQ2_XS: groups 0..15, 16..31; lane l: groups 8l .. 8l+7 of its 16 */
    __m256i sc;     /* IQ2_XS, IQ2_S: the scale 2 s + 1 of 16-element half 2i in int16 lane i of the low
                     * 128-bit lane, of half 2i + 1 in lane i of the high one */
    __m256i sc32;   /* IQ4_XS */
    _Alignas(32) uint16_t ix[64]; /* IQ3_S: the grid indices */
};
/* the indices stored and read back by scalar loads: left to itself GCC takes
 * each out of the vector register (vpextrw, two operations); the IQ3_S
 * decode row 1.25x a Zen 3's scalar shifts and masks, IQ2_S's four indices
 * a group 0.94x: it keeps them */
#define IX_IN_MEMORY(ix) __asm__("" : "+m"(ix))
static inline __attribute__((always_inline)) void iq_block_avx2(const int kind, const void *blk,
                                                                struct iq_blk_avx2 *p) {
    if (kind == IQ4XS) {
        const bt_block_iq4_xs *w = blk;
        uint32_t lo;
        memcpy(&lo, w->scales_l, 4);
        /* sub-block j: nibble j of scales_l, bits 2j, 2j+1 of scales_h */
        const __m256i j4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        const __m256i l = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)lo), j4), _mm256_set1_epi32(0xF));
        const __m256i h = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w->scales_h), _mm256_srli_epi32(j4, 1)),
                                           _mm256_set1_epi32(3));
        const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32(h, 4)), _mm256_set1_epi32(32));
        p->sc32 = _mm256_or_si256(_mm256_and_si256(ls, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(ls, 16));
        return;
    }
    if (kind == IQ3S) {
        /* entry g: qs[g] | bit g % 8 of qh[g / 8] at bit 8; 16 a step */
        const bt_block_iq3_s *w = blk;
        const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                              (short)-32768);
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w->qs + 16 * t)));
            const __m256i h = _mm256_set1_epi16((short)(w->qh[2 * t] | w->qh[2 * t + 1] << 8));
            const __m256i h9 =
                _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(h, bit), bit), _mm256_set1_epi16(0x100));
            _mm256_store_si256((__m256i *)(p->ix + 16 * t), _mm256_or_si256(q, h9));
        }
        IX_IN_MEMORY(p->ix);
        return;
    }
    if (kind != IQ2XS && kind != IQ2S) return;
    if (kind == IQ2XS) {
        const bt_block_iq2_xs *w = blk;
        /* 0x80 where the 4-bit index has odd parity */
        const __m256i odd = _mm256_broadcastsi128_si256(
            _mm_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0));
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w->qs + 16 * h));
            const __m256i s = _mm256_srli_epi16(q, 9); /* 7 bits in the low byte, 0 in the high */
            p->sgn[h] = _mm256_or_si256(s, _mm256_shuffle_epi8(odd, _mm256_xor_si256(s, _mm256_srli_epi16(q, 13))));
        }
    }
    const __m128i x = _mm_loadl_epi64(
        (const __m128i *)(kind == IQ2XS ? ((const bt_block_iq2_xs *)blk)->scales : ((const bt_block_iq2_s *)blk)->scales));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    /* the even halves' nibbles in bytes 0..7, the odd ones' in 8..15 */
    const __m128i nib = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    const __m256i n16 = _mm256_cvtepu8_epi16(nib);
    p->sc = _mm256_add_epi16(_mm256_add_epi16(n16, n16), _mm256_set1_epi16(1));
}

/* IQ2_XS and IQ2_S: the scales of halves 2c, 2c+1 (from sc of iq_block_avx2)
 * as the int16 lanes of the low and the high 128-bit lane: one shuffle */
static inline __m256i iq2_half_scales(__m256i sc, const int c) {
    const char b0 = (char)(2 * c), b1 = (char)(2 * c + 1);
    return _mm256_shuffle_epi8(sc, _mm256_setr_epi8(b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1,
                                                    b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1));
}

/* sub-block c (elements 32c .. 32c+31) of a block: |v| (*u), the signs to
 * put on the activation (*sg) and the scales (*scv); p from iq_block_avx2 */
static inline __attribute__((always_inline)) void iq_chunk_avx2(const int kind, const void *blk,
                                                                const struct iq_blk_avx2 *p, int c, __m256i *u,
                                                                __m256i *sg, __m256i *scv) {
    if (kind == IQ4XS) {
        const bt_block_iq4_xs *w = blk;
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt_iq4nl_values));
        /* elements 0..15: the low nibbles; 16..31: the high */
        const __m256i nib = bt_cpu_nibbles32_avx2(w->qs + 16 * c);
        const __m256i v = _mm256_shuffle_epi8(lut, nib);
        *u = _mm256_abs_epi8(v);
        *sg = v; /* no level is 0 */
        *scv = _mm256_permutevar8x32_epi32(p->sc32, _mm256_set1_epi32(c));
    } else if (kind == IQ2XXS) {
        const bt_block_iq2_xxs *w = blk;
        const uint8_t *q = (const uint8_t *)(w->qs + 4 * c);
        const uint32_t sgs = rd32(w->qs + 4 * c + 2);
        *u = grid4(bt_iq2xxs_grid, q[0], q[1], q[2], q[3]);
        *sg = signs32_even(sgs);
        const int sc = 2 * (int)(sgs >> 28) + 1;
        *scv = _mm256_set1_epi16((short)sc);
    } else if (kind == IQ2XS) {
        const bt_block_iq2_xs *w = blk;
        const uint16_t *q = w->qs + 4 * c;
        *u = grid4(bt_iq2xs_grid, q[0] & 511u, q[1] & 511u, q[2] & 511u, q[3] & 511u);
        /* groups 4c .. 4c+3: bytes o, o+2 of sgn's lane (c / 2) % 2 in the low lane, o+4, o+6 in the high */
        const __m256i g = (c / 2) % 2 ? _mm256_permute2x128_si256(p->sgn[c / 4], p->sgn[c / 4], 0x11)
                                      : _mm256_permute2x128_si256(p->sgn[c / 4], p->sgn[c / 4], 0x00);
        const char o = (char)(8 * (c % 2));
        const __m256i pick = _mm256_setr_epi8(o, o, o, o, o, o, o, o, (char)(o + 2), (char)(o + 2), (char)(o + 2),
                                              (char)(o + 2), (char)(o + 2), (char)(o + 2), (char)(o + 2), (char)(o + 2),
                                              (char)(o + 4), (char)(o + 4), (char)(o + 4), (char)(o + 4), (char)(o + 4),
                                              (char)(o + 4), (char)(o + 4), (char)(o + 4), (char)(o + 6), (char)(o + 6),
                                              (char)(o + 6), (char)(o + 6), (char)(o + 6), (char)(o + 6), (char)(o + 6),
                                              (char)(o + 6));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        *sg = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(g, pick), bit), bit),
                              _mm256_set1_epi8(1));
        *scv = iq2_half_scales(p->sc, c);
    } else if (kind == IQ2S) {
        const bt_block_iq2_s *w = blk;
        const uint8_t *q = w->qs + 4 * c;
        const unsigned h = w->qh[c]; /* group j: bits 2j, 2j+1 */
        *u = grid4(bt_iq2s_grid, q[0] | ((h << 8) & 0x300), q[1] | ((h << 6) & 0x300), q[2] | ((h << 4) & 0x300),
                   q[3] | ((h << 2) & 0x300));
        *sg = signs32_packed(rd32(w->signs + 4 * c));
        *scv = iq2_half_scales(p->sc, c);
    } else if (kind == IQ3XXS) {
        const bt_block_iq3_xxs *w = blk;
        const uint32_t sgs = rd32(w->qs + 64 + 4 * c);
        const uint8_t *q = w->qs + 8 * c;
        const unsigned i[8] = {q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]};
        *u = grid8x4(bt_iq3xxs_grid, i);
        *sg = signs32_even(sgs);
        const int sc = 2 * (int)(sgs >> 28) + 1;
        *scv = _mm256_set1_epi16((short)sc);
    } else if (kind == IQ3S) {
        const bt_block_iq3_s *w = blk;
        const uint16_t *ix = p->ix + 8 * c;
        const unsigned i[8] = {ix[0], ix[1], ix[2], ix[3], ix[4], ix[5], ix[6], ix[7]};
        *u = grid8x4(bt_iq3s_grid, i);
        *sg = signs32_packed(rd32(w->signs + 4 * c));
        const int sc = 2 * ((w->scales[c / 2] >> (4 * (c % 2))) & 0xF) + 1;
        *scv = _mm256_set1_epi16((short)sc);
    } else {
        const bt_block_iq1_s *w = blk;
        const uint32_t qh = w->qh[c];
        const uint8_t *q = w->qs + 4 * c; /* group j: bits 3j .. 3j+2 of qh */
        const __m256i g = grid4(bt_iq1s_grid, q[0] | ((qh << 8) & 0x700), q[1] | ((qh << 5) & 0x700),
                                q[2] | ((qh << 2) & 0x700), q[3] | ((qh >> 1) & 0x700)); /* -1, 0, 1 */
        /* the grid part 8 g only (iq1s_delta adds the +-1) */
        *u = _mm256_abs_epi8(g);
        *sg = g; /* where g is 0, so is |g| */
        const int sc = 8 * (2 * (int)((qh >> 12) & 7) + 1);
        *scv = _mm256_set1_epi16((short)sc);
    }
}

/* IQ1_S's v = 8 g + delta (delta +-1 per 32-element sub-block c), so
 * sum v a = 8 sum g a + delta (a.bsums[2c] + a.bsums[2c+1]): the chunks
 * dot 8 g (scale 8 sc), and this is the rest, sc delta times each
 * sub-block's activation sum, in int32 lanes (the same integer I; building
 * 8 g + delta per chunk cost six vector operations more) */
static inline __m256i iq1s_delta(const bt_block_iq1_s *w, const bt_block_q8_K *a) {
    const __m128i qh = _mm_loadu_si128((const __m128i *)w->qh);
    const __m128i sc = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(14)), _mm_set1_epi16(1));
    const __m128i sd = _mm_sign_epi16(sc, _mm_or_si128(_mm_srai_epi16(qh, 15), _mm_set1_epi16(1)));
    /* each sub-block's sc delta on its two 16-element halves' sums */
    const __m256i w2 = _mm256_set_m128i(_mm_unpackhi_epi16(sd, sd), _mm_unpacklo_epi16(sd, sd));
    return _mm256_madd_epi16(w2, _mm256_loadu_si256((const __m256i *)a->bsums));
}

/* the lane sums of I[0..3] into s4 at once (exact integers, any order) */
static inline void iq_hsum4(const __m256i I[4], int32_t s4[4]) {
    const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(I[0], I[1]), _mm256_hadd_epi32(I[2], I[3]));
    _mm_store_si128((__m128i *)s4, _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
}

/* block b of a row (blk) against RN columns: the int32 lanes of each one's I */
static inline __attribute__((always_inline)) void iq_block_dots_avx2(const int kind, const int RN, const void *blk,
                                                                     const void *const *acts, int64_t b,
                                                                     __m256i I[4]) {
    for (int c = 0; c < RN; c++) I[c] = _mm256_setzero_si256();
    struct iq_blk_avx2 p;
    iq_block_avx2(kind, blk, &p);
    /* unrolled, so that a sub-block's shuffle masks are constants: left rolled, GCC built them
     * byte by byte at run time (IQ2_XS's decode row at a third of its speed) */
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m256i u, sg, scv;
        iq_chunk_avx2(kind, blk, &p, s, &u, &sg, &scv);
        for (int c = 0; c < RN; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)(((const bt_block_q8_K *)acts[c] + b)->qs + 32 * s));
            I[c] = _mm256_add_epi32(I[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(av, sg)), scv));
        }
    }
    if (kind == IQ1S)
        for (int c = 0; c < RN; c++) I[c] = _mm256_add_epi32(I[c], iq1s_delta(blk, (const bt_block_q8_K *)acts[c] + b));
}

/* one row against RN columns (out[c]).  One column (decode) takes 4 blocks'
 * lanes before it adds them, in one reduction: each block's own (a chain of
 * shuffles, a conversion and the float step at the end of ~300 operations)
 * held the next block back (a Zen 3's lattice decode rows 1.03-1.07x) */
static inline __attribute__((always_inline)) void iq_row_avx2(const int kind, const int RN, int64_t k,
                                                              const void *w_row, const void *const *acts, float *out) {
    const size_t bs = iq_block_bytes(kind);
    const int64_t nblk = k / BT_QK_K;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t b = 0;
    if (RN == 1) {
        const bt_block_q8_K *a = acts[0];
        float acc0 = 0.0f;
        for (; b + 4 <= nblk; b += 4) {
            __m256i I[4];
#pragma GCC unroll 1
            for (int j = 0; j < 4; j++)
                iq_block_dots_avx2(kind, 1, (const char *)w_row + (size_t)(b + j) * bs, acts, b + j, &I[j]);
            _Alignas(16) int32_t s4[4];
            iq_hsum4(I, s4);
            for (int j = 0; j < 4; j++) {
                const void *blk = (const char *)w_row + (size_t)(b + j) * bs;
                acc0 = fmaf((float)s4[j], iq_d(blk) * iq_mult(kind) * a[b + j].d, acc0);
            }
        }
        acc[0] = acc0;
    }
    for (; b < nblk; b++) {
        const void *blk = (const char *)w_row + (size_t)b * bs;
        const float dm = iq_d(blk) * iq_mult(kind);
        __m256i I[4];
        iq_block_dots_avx2(kind, RN, blk, acts, b, I);
        for (int c = 0; c < RN; c++)
            acc[c] = fmaf((float)bt_cpu_hsum_i32x8(I[c]), dm * ((const bt_block_q8_K *)acts[c] + b)->d, acc[c]);
    }
    for (int c = 0; c < RN; c++) out[c] = acc[c];
}

/* IQ4_XS in iq_rows_avx2, two sub-blocks (32 weight bytes) a step: the low
 * nibbles of sub-blocks 2p and 2p + 1 in one vector, their high nibbles in
 * another, against the activation laid out once a block to match (each
 * sub-block's first 16 bytes paired with the next one's, then the last 16:
 * iq4_act_pairs), each 128-bit lane's pairs times its own sub-block's scale.
 * The same exact int32 sums as the chunks' in another grouping, so the same
 * I per block and the same float step; 15 vector operations for 64 weights
 * where the chunks take 22 (a Zen 3's decode row 1.46x: docs/benchmarks.md). */
static inline __attribute__((always_inline)) void iq4_act_pairs(const bt_block_q8_K *a, __m256i alo[4],
                                                                __m256i ahi[4]) {
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const __m256i a0 = _mm256_loadu_si256((const __m256i *)(a->qs + 64 * p));
        const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a->qs + 64 * p + 32));
        alo[p] = _mm256_permute2x128_si256(a0, a1, 0x20);
        ahi[p] = _mm256_permute2x128_si256(a0, a1, 0x31);
    }
}
static inline __attribute__((always_inline)) __m256i iq4_block_pairs(const bt_block_iq4_xs *w,
                                                                     const struct iq_blk_avx2 *pb,
                                                                     const __m256i alo[4], const __m256i ahi[4]) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt_iq4nl_values));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(w->qs + 32 * p));
        const __m256i vl = _mm256_shuffle_epi8(lut, _mm256_and_si256(x, m4));
        const __m256i vh = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
        const __m256i sc = _mm256_permutevar8x32_epi32(
            pb->sc32, _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1));
        /* no level is 0: v's sign is the activation's */
        const __m256i pl = _mm256_maddubs_epi16(_mm256_abs_epi8(vl), _mm256_sign_epi8(alo[p], vl));
        const __m256i ph = _mm256_maddubs_epi16(_mm256_abs_epi8(vh), _mm256_sign_epi8(ahi[p], vh));
        s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_madd_epi16(pl, sc), _mm256_madd_epi16(ph, sc)));
    }
    return s;
}

/* 4 rows against one column (out[r]): the AVX-512 iq_rows, 8 lanes */
static inline __attribute__((always_inline)) void iq_rows_avx2(const int kind, int64_t k, const void *const *w_rows,
                                                               const void *act, const void *const *next, float *out) {
    const size_t bs = iq_block_bytes(kind);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int64_t nblk = k / BT_QK_K;
    const int block = bt_cpu_tile_block_kind(w_rows, next, nblk, bs, 4);
    for (int64_t b = 0; b < nblk; b++) {
        bt_cpu_tile_prefetch(w_rows, next, block, b, nblk, bs, 4);
        const bt_block_q8_K *a = (const bt_block_q8_K *)act + b;
        __m256i I[4], alo[4], ahi[4];
        float dm[4];
        if (kind == IQ4XS) iq4_act_pairs(a, alo, ahi);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const void *blk = (const char *)w_rows[r] + (size_t)b * bs;
            dm[r] = iq_d(blk) * iq_mult(kind);
            if (kind == IQ4XS) {
                struct iq_blk_avx2 p;
                iq_block_avx2(kind, blk, &p);
                I[r] = iq4_block_pairs(blk, &p, alo, ahi);
            } else {
                iq_block_dots_avx2(kind, 1, blk, &act, b, &I[r]);
            }
        }
        _Alignas(16) int32_t s4[4];
        iq_hsum4(I, s4);
        for (int r = 0; r < 4; r++) acc[r] = fmaf((float)s4[r], dm[r] * a->d, acc[r]);
    }
    for (int r = 0; r < 4; r++) out[r] = acc[r];
}

#define IQ_ROW iq_row_avx2
#define IQ_ROWS iq_rows_avx2

/* a lattice block's 256 values v + 128 (bt_cpu_iq_unpack) */
static inline __attribute__((always_inline)) void iq_unpack_values(const int kind, const void *blk, uint8_t *q) {
    struct iq_blk_avx2 p;
    iq_block_avx2(kind, blk, &p);
    /* unrolled, as iq_block_dots_avx2's */
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m256i u, sg, scv;
        iq_chunk_avx2(kind, blk, &p, s, &u, &sg, &scv);
        __m256i v = _mm256_sign_epi8(u, sg);
        if (kind == IQ1S) { /* 8 g + delta */
            const __m256i v2 = _mm256_add_epi8(v, v), v4 = _mm256_add_epi8(v2, v2);
            v = _mm256_add_epi8(_mm256_add_epi8(v4, v4),
                                _mm256_set1_epi8((char)(((const bt_block_iq1_s *)blk)->qh[s] & 0x8000 ? -1 : 1)));
        }
        _mm256_storeu_si256((__m256i *)(q + 32 * s), _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
    }
}
#elif defined(__aarch64__) && defined(__ARM_NEON)
/* ---- NEON (plain, dotprod): the reference's integers, 16 elements at a time ---- */

/* 8 grid bytes e, element j negated where bit j of s is set */
static inline int8x8_t iq_signed8_neon(uint64_t e, unsigned s) {
    static const uint8_t bit[8] = {1, 2, 4, 8, 16, 32, 64, 128};
    const int8x8_t v = vreinterpret_s8_u64(vcreate_u64(e));
    return vbsl_s8(vtst_u8(vdup_n_u8((uint8_t)s), vld1_u8(bit)), vneg_s8(v), v);
}

/* group g (elements 8g .. 8g+7) of a lattice block: iq_values' bytes */
static inline __attribute__((always_inline)) int8x8_t iq_group_neon(const int kind, const void *blk, const int g) {
    uint64_t e;
    unsigned s;
    iq_group(kind, blk, g, &e, &s);
    if (kind == IQ1S) /* 8 g + delta */
        return vadd_s8(vshl_n_s8(vreinterpret_s8_u64(vcreate_u64(e)), 3), vdup_n_s8(s ? -1 : 1));
    return iq_signed8_neon(e, s);
}

/* the sum of 16 products (|v|, |a| <= 127), in 4 int32 lanes */
static inline int32x4_t iq_dot16_neon(int8x16_t v, int8x16_t a) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), v, a);
#else
    return vpadalq_s16(vpaddlq_s16(vmull_s8(vget_low_s8(v), vget_low_s8(a))), vmull_high_s8(v, a));
#endif
}

/* one row against RN columns (out[c]): per block I = sum of sc[j] times the
 * 16-element half j's products, exact integers in any order; then
 * dot_iq_ref's float step */
static inline __attribute__((always_inline)) void iq_row_neon(const int kind, const int RN, int64_t k,
                                                              const void *w_row, const void *const *acts, float *out) {
    const size_t bs = iq_block_bytes(kind);
    const int8x16_t lut = vld1q_s8(bt_iq4nl_values);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < k / BT_QK_K; b++) {
        const void *blk = (const char *)w_row + (size_t)b * bs;
        int sc[16];
        iq_scales(kind, blk, sc);
        int32x4_t I[4];
        for (int c = 0; c < RN; c++) I[c] = vdupq_n_s32(0);
        for (int j = 0; j < 16; j++) {
            int8x16_t v;
            if (kind == IQ4XS) { /* half j: the low (j even) or high nibbles of qs[16 (j / 2) ..] */
                const uint8x16_t x = vld1q_u8(((const bt_block_iq4_xs *)blk)->qs + 16 * (j / 2));
                v = vqtbl1q_s8(lut, j % 2 ? vshrq_n_u8(x, 4) : vandq_u8(x, vdupq_n_u8(0x0F)));
            } else {
                v = vcombine_s8(iq_group_neon(kind, blk, 2 * j), iq_group_neon(kind, blk, 2 * j + 1));
            }
            for (int c = 0; c < RN; c++) {
                const bt_block_q8_K *a = (const bt_block_q8_K *)acts[c] + b;
                I[c] = vmlaq_n_s32(I[c], iq_dot16_neon(v, vld1q_s8(a->qs + 16 * j)), sc[j]);
            }
        }
        const float dm = iq_d(blk) * iq_mult(kind);
        for (int c = 0; c < RN; c++)
            acc[c] = fmaf((float)vaddvq_s32(I[c]), dm * ((const bt_block_q8_K *)acts[c] + b)->d, acc[c]);
    }
    for (int c = 0; c < RN; c++) out[c] = acc[c];
}
#define IQ_ROW iq_row_neon
#else
#define FAST(name) dot_##name##_ref
#define TILES(name) {{0, 0, NULL}}
#endif
#ifdef IQ_ROW
#ifdef IQ_ROWS
/* 4 rows against one column (decode) */
#define IQ_ROWS_TILE(name, kind)                                                                            \
    static void qtile_##name##_4x1(int64_t k, const void *const *w, const void *const *a,                   \
                                   const void *const *next, float *out) {                                   \
        IQ_ROWS(kind, k, w, a[0], next, out);                                                               \
    }
#else
#define IQ_ROWS_TILE(name, kind)
#endif
/* the vector row (AVX-512, AVX2 or NEON) as the type's vec_dot and its 2- and 4-column tiles (unused
 * where IQ4_XS has 4-row ones) */
#define IQ_VEC(name, kind)                                                                                  \
    static void dot_##name##_vec(int64_t k, float *s, const void *w, const void *a) {                       \
        IQ_ROW(kind, 1, k, w, &a, s);                                                                       \
    }                                                                                                       \
    __attribute__((unused)) static void qtile_##name##_1x2(int64_t k, const void *const *w,                 \
                                                           const void *const *a, const void *const *next,   \
                                                           float *out) {                                    \
        (void)next;                                                                                         \
        IQ_ROW(kind, 2, k, w[0], a, out);                                                                   \
    }                                                                                                       \
    __attribute__((unused)) static void qtile_##name##_1x4(int64_t k, const void *const *w,                 \
                                                           const void *const *a, const void *const *next,   \
                                                           float *out) {                                    \
        (void)next;                                                                                         \
        IQ_ROW(kind, 4, k, w[0], a, out);                                                                   \
    }
IQ_VEC(iq4_xs, IQ4XS)
IQ_VEC(iq2_xxs, IQ2XXS)
IQ_VEC(iq2_xs, IQ2XS)
IQ_VEC(iq2_s, IQ2S)
IQ_VEC(iq3_xxs, IQ3XXS)
IQ_VEC(iq3_s, IQ3S)
IQ_VEC(iq1_s, IQ1S)
#define FAST(name) dot_##name##_vec
#define TILES(name) {{1, 2, qtile_##name##_1x2}, {1, 4, qtile_##name##_1x4}, {0, 0, NULL}}
#ifdef IQ_ROWS
/* IQ4_XS decodes 4 rows at a time (on AVX-512 against 1, 2 or 4 columns),
 * the rows' lines prefetched (AVX-512 on a Zen 4, 1 thread, m 4096 k 14336
 * from memory: 12.1 -> 24 GB/s with the offset form; the lattice types,
 * bound by their grid gathers, showed no clear change and keep one) */
IQ_ROWS_TILE(iq4_xs, IQ4XS)
#ifdef IQ4_XS_TILES_4XN
#define TILES_IQ4_XS {{4, 1, qtile_iq4_xs_4x1}, {4, 2, qtile_iq4_xs_4x2}, {4, 4, qtile_iq4_xs_4x4}, {0, 0, NULL}}
#else
#define TILES_IQ4_XS {{4, 1, qtile_iq4_xs_4x1}, {1, 2, qtile_iq4_xs_1x2}, {1, 4, qtile_iq4_xs_1x4}, {0, 0, NULL}}
#endif
#endif
#endif
#ifndef TILES_IQ4_XS
#define TILES_IQ4_XS TILES(iq4_xs)
#endif
/* The packed GEMM: the K-quants' (quant_dot.c), for jobs of 8 columns or
 * more (the tiles decode a row once per 4 columns) */
#ifdef BT_CPU_IQ_GEMM
#define GEMM(name) 8, bt_cpu_iq_panel_size, bt_cpu_##name##_pack, bt_cpu_##name##_gemm

void bt_cpu_iq_unpack(enum bt_type t, const void *blk, uint8_t q[BT_QK_K], int8_t sc[16], float *dm) {
    int kind;
    switch (t) {
#ifdef IQ_ROW
#define IQ_CASE(T, K)                \
    case T:                          \
        kind = K;                    \
        iq_unpack_values(K, blk, q); \
        break;
#else
#define IQ_CASE(T, K)                                                       \
    case T: {                                                               \
        int8_t v[BT_QK_K];                                                  \
        kind = K;                                                           \
        iq_values(K, blk, v);                                               \
        for (int e = 0; e < BT_QK_K; e++) q[e] = (uint8_t)(v[e] + 128);     \
        break;                                                              \
    }
#endif
        IQ_CASE(BT_TYPE_IQ2_XXS, IQ2XXS)
        IQ_CASE(BT_TYPE_IQ2_XS, IQ2XS)
        IQ_CASE(BT_TYPE_IQ2_S, IQ2S)
        IQ_CASE(BT_TYPE_IQ3_XXS, IQ3XXS)
        IQ_CASE(BT_TYPE_IQ3_S, IQ3S)
        IQ_CASE(BT_TYPE_IQ1_S, IQ1S)
#undef IQ_CASE
    default: BT_ASSERT(!"bt_cpu_iq_unpack: not a lattice IQ type"); return;
    }
    int s16[16];
    iq_scales(kind, blk, s16);
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)s16[j];
    *dm = iq_d(blk) * iq_mult(kind);
}
#else
#define GEMM(name) 0, NULL, NULL, NULL
#endif

/* ---- qtypes.h entries ------------------------------------------------------------ */

static size_t act_size_q8_K(int64_t k) { return (size_t)(k / BT_QK_K) * sizeof(bt_block_q8_K); }

#define IQTYPE(name) IQTYPE_T(name, TILES(name))
#define IQTYPE_T(name, tiles)                                             \
    const struct bt_cpu_qtype bt_cpu_qtype_##name = {                     \
        /* .act_name     = */ "q8_K (ggml's block_q8_K)",                 \
        /* .act_size     = */ act_size_q8_K,                              \
        /* .quantize_act = */ bt_q8_K_from_f32,                           \
        /* .vec_dot      = */ FAST(name),                                 \
        /* .tiles        = */ tiles,                                      \
        /* .gemm_min_cols, .panel_size, .pack, .gemm = */ GEMM(name),    \
        /* .rp, .rgemm, .rpack, .rpack_min_cols = */ NULL, NULL, NULL, 0, \
        /* .quantize_act_ref = */ bt_q8_K_from_f32,                       \
        /* .vec_dot_ref  = */ dot_##name##_ref,                           \
    }
IQTYPE_T(iq4_xs, TILES_IQ4_XS);
IQTYPE(iq2_xxs);
IQTYPE(iq2_xs);
IQTYPE(iq2_s);
IQTYPE(iq3_xxs);
IQTYPE(iq3_s);
IQTYPE(iq1_s);
