/* quant_i8.c - the 32-element weight types on the CPU (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, MXFP4): their activation format, dot product, decode
 * tiles, packed GEMM and repacked kernels, and their seven entries in
 * matmul.c's table of quantised weight types (qtypes.h).
 *
 * Activation column (act_size(k) bytes, 64-byte multiple), nblk = k / 32:
 *   q [nblk][32] int8   element order; q = roundf(x / d)
 *   d [nblk]     float  d = max|x| / 127 of the block (kept in float; for
 *                       all but Q8_0 and Q4_0 rounded to fp16 after q is
 *                       made, as ggml's Q8_0 columns keep it)
 *   s [nblk]     int32  the sum of the block's 32 q
 *
 * One accumulation order per output element, on every path (plain C, the
 * AVX-512 dot and tiles, the GEMM): per block b the exact integer
 *   I_b = sum_i w_i q_i      (Q8_0: w = qs; Q4_0: w = nibble - 8)
 * (Q5_0: w = (nibble | bit i of qh << 4) - 16; MXFP4: w =
 * bt_mxfp4_values[nibble]; IQ4_NL: w = bt_iq4nl_values[nibble]; Q4_1: w =
 * nibble; Q5_1: w = nibble | bit i of qh << 4; element i's nibble the low
 * one of byte i for i < 16, the high one of byte i - 16 after) then, blocks
 * in increasing order from acc = +0,
 *   acc = fma((float)I_b, dw_b * d_b, acc)
 * and for Q4_1 and Q5_1, whose value is dw w + mw, then
 *   acc = fma((float)s_b, mw_b * d_b, acc)
 * (dw_b the block's fp16 scale as float, MXFP4's bt_e8m0_half(e), mw_b its
 * fp16 min; |I_b| < 2^21, so (float)I_b is exact).  The integers are exact
 * however a path groups them, so a path only has to produce I_b and take
 * the same float steps:
 *   - dot_ref: plain C, one block at a time;
 *   - decode tiles (AVX-512 VNNI, 16 rows x 1, 2 or 4 columns): two
 *     blocks' unsigned weight bytes per row (Q8_0 w + 128, Q4_0 the nibble),
 *     rows interleaved in pairs by dword once (shared by the columns), per
 *     column two vpdpbusd per row pair against the activation's dwords
 *     spread to match, then the partial sums added across 16 rows at once
 *     (blends, a few shuffles, adds) to a lane per row, the offset taken off
 *     through s; the rows' scales picked out of the same loads (a masked
 *     word permute per row, no transpose); then the float step for 16 rows
 *     in one vector;
 *   - GEMM (AVX-512 VNNI, BT_I8_GEMM_MIN_COLS columns and more): 16 rows packed
 *     once per call, a lane per row (4 bytes of a block per lane, 8 vectors
 *     per block, the rows' scales beside them); vpdpbusd with 4 activation
 *     bytes broadcast, 8 per block, into I, then the float step;
 *   - repacked weights (AVX-512 VNNI; bt_cpu_weight_repack, at load): the
 *     GEMM's panel order kept in the weights themselves, so the decode and
 *     the prompt both run the GEMM's loop on them with no packing (below);
 *   - NEON (aarch64): section "NEON" below;
 *   - AVX2 (FMA, F16C; builds without AVX-512 VNNI): each block's I_b through
 *     vpmaddubsw / vpmaddwd (vpdpbusd with AVX-VNNI); the dot takes
 *     dot_ref's fma in scalar, the tiles (8 rows x 1, 2 or 4 columns) gather
 *     the 8 rows' I_b into one vector and take the 8 rows' fma at once,
 *     the repacked weights a row per lane (section "AVX2" below).  The
 *     types but Q8_0 and Q4_0 run these 256-bit kernels on every x86
 *     build, AVX-512 ones too.
 *
 * The file is built with -ffp-contract=off: no fusing beyond the fma above.
 */
#include "qtypes.h"
#include "quants.h"

#include "cpu_impl.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define HAVE_I8_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_I8_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define HAVE_I8_NEON 1
#endif

#define I8_QK 32

/* the weight types of the kernels below that are written once for all seven */
enum i8_kind { I8_Q8, I8_Q4, I8_MX, I8_Q5, I8_Q41, I8_Q51, I8_NL };
static inline size_t i8_block_bytes(const int kind) {
    return kind == I8_Q8    ? sizeof(bt_block_q8_0)
           : kind == I8_Q4  ? sizeof(bt_block_q4_0)
           : kind == I8_NL  ? sizeof(bt_block_iq4_nl)
           : kind == I8_Q5  ? sizeof(bt_block_q5_0)
           : kind == I8_Q41 ? sizeof(bt_block_q4_1)
           : kind == I8_Q51 ? sizeof(bt_block_q5_1)
                            : sizeof(bt_block_mxfp4);
}
/* Q4_1 and Q5_1: a min beside the scale (the second fp16 of the block) */
static inline bool i8_has_min(const int kind) { return kind == I8_Q41 || kind == I8_Q51; }
/* Q5_0 and Q5_1: fifth bits (qh, before the nibbles) */
static inline bool i8_has_qh(const int kind) { return kind == I8_Q5 || kind == I8_Q51; }
/* bytes of a block's scale in the repacked layout: MXFP4's E8M0 byte, an
 * fp16, or Q4_1's and Q5_1's fp16 scale and min */
static inline size_t i8_rp_ds(const int kind) { return kind == I8_MX ? 1 : i8_has_min(kind) ? 4 : 2; }

/* ---- the activation column ---------------------------------------------------- */

static size_t i8_act_size(int64_t k) {
    const size_t nblk = (size_t)(k / I8_QK);
    return (nblk * (I8_QK + 2 * sizeof(float)) + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN;
}

struct i8col {
    const int8_t *q;
    const float *d;
    const int32_t *s;
};

static inline struct i8col i8col_at(const void *act, int64_t k) {
    const size_t nblk = (size_t)(k / I8_QK);
    const char *p = act;
    return (struct i8col){(const int8_t *)p, (const float *)(p + nblk * I8_QK),
                          (const int32_t *)(p + nblk * (I8_QK + sizeof(float)))};
}

/* the bytes after s up to act_size(k): zero, so that a column's bytes are
 * all defined */
static void i8_zero_tail(void *y, int64_t k) {
    const size_t used = (size_t)(k / I8_QK) * (I8_QK + 2 * sizeof(float));
    memset((char *)y + used, 0, i8_act_size(k) - used);
}

static void i8_quantize_ref(const float *x, void *y, int64_t k) {
    const int64_t nblk = k / I8_QK;
    i8_zero_tail(y, k);
    int8_t *q = y;
    float *d = (float *)((char *)y + (size_t)nblk * I8_QK);
    int32_t *s = (int32_t *)(d + nblk);
    for (int64_t b = 0; b < nblk; b++) {
        float amax = 0.0f;
        for (int i = 0; i < I8_QK; i++) amax = fmaxf(amax, fabsf(x[b * I8_QK + i]));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < I8_QK; i++) {
            const int8_t v = (int8_t)roundf(x[b * I8_QK + i] * id);
            q[b * I8_QK + i] = v;
            sum += v;
        }
        d[b] = dd;
        s[b] = sum;
    }
}

/* ---- plain C: the order spelled out -------------------------------------------- */

static void i8_dot_ref(enum bt_type type, int64_t k, float *out, const void *w_row, const void *act) {
    const int64_t nblk = k / I8_QK;
    const struct i8col a = i8col_at(act, k);
    float acc = 0.0f;
    for (int64_t b = 0; b < nblk; b++) {
        int32_t isum = 0;
        float dw, mw = 0.0f;
        bool min = false;
        const int8_t *qa = a.q + b * I8_QK;
        if (type == BT_TYPE_Q8_0) {
            const bt_block_q8_0 *w = (const bt_block_q8_0 *)w_row + b;
            for (int i = 0; i < I8_QK; i++) isum += (int32_t)w->qs[i] * qa[i];
            dw = bt_fp16_to_fp32(w->d);
        } else if (type == BT_TYPE_Q4_0) {
            const bt_block_q4_0 *w = (const bt_block_q4_0 *)w_row + b;
            for (int i = 0; i < I8_QK / 2; i++)
                isum += ((int32_t)(w->qs[i] & 15) - 8) * qa[i] + ((int32_t)(w->qs[i] >> 4) - 8) * qa[i + I8_QK / 2];
            dw = bt_fp16_to_fp32(w->d);
        } else if (type == BT_TYPE_Q5_0) {
            const bt_block_q5_0 *w = (const bt_block_q5_0 *)w_row + b;
            uint32_t qh;
            memcpy(&qh, w->qh, sizeof qh);
            for (int i = 0; i < I8_QK / 2; i++)
                isum += ((int32_t)((w->qs[i] & 15) | (qh >> i & 1) << 4) - 16) * qa[i] +
                        ((int32_t)((w->qs[i] >> 4) | (qh >> (i + 16) & 1) << 4) - 16) * qa[i + I8_QK / 2];
            dw = bt_fp16_to_fp32(w->d);
        } else if (type == BT_TYPE_IQ4_NL) {
            const bt_block_iq4_nl *w = (const bt_block_iq4_nl *)w_row + b;
            for (int i = 0; i < I8_QK / 2; i++)
                isum += (int32_t)bt_iq4nl_values[w->qs[i] & 15] * qa[i] +
                        (int32_t)bt_iq4nl_values[w->qs[i] >> 4] * qa[i + I8_QK / 2];
            dw = bt_fp16_to_fp32(w->d);
        } else if (type == BT_TYPE_Q4_1) {
            const bt_block_q4_1 *w = (const bt_block_q4_1 *)w_row + b;
            for (int i = 0; i < I8_QK / 2; i++)
                isum += (int32_t)(w->qs[i] & 15) * qa[i] + (int32_t)(w->qs[i] >> 4) * qa[i + I8_QK / 2];
            dw = bt_fp16_to_fp32(w->d);
            mw = bt_fp16_to_fp32(w->m);
            min = true;
        } else if (type == BT_TYPE_Q5_1) {
            const bt_block_q5_1 *w = (const bt_block_q5_1 *)w_row + b;
            uint32_t qh;
            memcpy(&qh, w->qh, sizeof qh);
            for (int i = 0; i < I8_QK / 2; i++)
                isum += (int32_t)((w->qs[i] & 15) | (qh >> i & 1) << 4) * qa[i] +
                        (int32_t)((w->qs[i] >> 4) | (qh >> (i + 16) & 1) << 4) * qa[i + I8_QK / 2];
            dw = bt_fp16_to_fp32(w->d);
            mw = bt_fp16_to_fp32(w->m);
            min = true;
        } else {
            const bt_block_mxfp4 *w = (const bt_block_mxfp4 *)w_row + b;
            for (int i = 0; i < I8_QK / 2; i++)
                isum += (int32_t)bt_mxfp4_values[w->qs[i] & 15] * qa[i] +
                        (int32_t)bt_mxfp4_values[w->qs[i] >> 4] * qa[i + I8_QK / 2];
            dw = bt_e8m0_half(w->e);
        }
        acc = fmaf((float)isum, dw * a.d[b], acc);
        if (min) acc = fmaf((float)a.s[b], mw * a.d[b], acc);
    }
    *out = acc;
}
static void dot_q8_0_ref(int64_t k, float *s, const void *w, const void *a) { i8_dot_ref(BT_TYPE_Q8_0, k, s, w, a); }
static void dot_q4_0_ref(int64_t k, float *s, const void *w, const void *a) { i8_dot_ref(BT_TYPE_Q4_0, k, s, w, a); }
static void dot_q4_1_ref(int64_t k, float *s, const void *w, const void *a) { i8_dot_ref(BT_TYPE_Q4_1, k, s, w, a); }
static void dot_q5_0_ref(int64_t k, float *s, const void *w, const void *a) { i8_dot_ref(BT_TYPE_Q5_0, k, s, w, a); }
static void dot_q5_1_ref(int64_t k, float *s, const void *w, const void *a) { i8_dot_ref(BT_TYPE_Q5_1, k, s, w, a); }
static void dot_iq4_nl_ref(int64_t k, float *s, const void *w, const void *a) {
    i8_dot_ref(BT_TYPE_IQ4_NL, k, s, w, a);
}
static void dot_mxfp4_ref(int64_t k, float *s, const void *w, const void *a) { i8_dot_ref(BT_TYPE_MXFP4, k, s, w, a); }

/* the repacked layout (qtypes.h): payload = the quants, Q8_0 as unsigned
 * bytes (w + 128), Q4_0, Q4_1, IQ4_NL and MXFP4 as they are (a lane's low
 * nibbles elements 4v .. 4v+3, its high nibbles 16+4v ..), Q5_0 and Q5_1
 * their fifth bits reordered (bt_cpu_qh_order) then their nibbles as Q4_0's;
 * MXFP4's scale the E8M0 byte, Q4_1's and Q5_1's the fp16 scale and min */
#define RP_ROWS 16
static const struct bt_cpu_rp_layout rp_q8_0 = {0, 2, 8, 0x80808080u, 2, false, 0, NULL, NULL};
static const struct bt_cpu_rp_layout rp_q4_0 = {0, 2, 4, 0u, 2, false, 0, NULL, NULL};
static const struct bt_cpu_rp_layout rp_q5_0 = {0, 2, 5, 0u, 2, true, 0, NULL, NULL};
static const struct bt_cpu_rp_layout rp_q4_1 = {0, 4, 4, 0u, 4, false, 0, NULL, NULL};
static const struct bt_cpu_rp_layout rp_q5_1 = {0, 4, 5, 0u, 4, true, 0, NULL, NULL};
static const struct bt_cpu_rp_layout rp_iq4_nl = {0, 2, 4, 0u, 2, false, 0, NULL, NULL};
static const struct bt_cpu_rp_layout rp_mxfp4 = {0, 1, 4, 0u, 1, false, 0, NULL, NULL};

/* a block's scale dw as float (MXFP4's E8M0, else the block's first fp16) */
static inline float i8_block_scale(const int kind, const char *blk) {
    if (kind == I8_MX) return bt_e8m0_half(((const bt_block_mxfp4 *)blk)->e);
    bt_fp16_t d;
    memcpy(&d, blk, sizeof d);
    return bt_fp16_to_fp32(d);
}
/* Q4_1's and Q5_1's min mw as float (the fp16 after d) */
static inline float i8_block_min(const char *blk) {
    bt_fp16_t m;
    memcpy(&m, blk + sizeof m, sizeof m);
    return bt_fp16_to_fp32(m);
}

#ifdef HAVE_I8_AVX512
/* ---- AVX-512 VNNI --------------------------------------------------------------- */

/* roundf (half away from zero) of integer-range values, exactly */
static inline __m512 round_away(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(v, t); /* exact */
    const __mmask16 up = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __mmask16 dn = _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ);
    t = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0f));
    return _mm512_mask_sub_ps(t, dn, t, _mm512_set1_ps(1.0f));
}

/* i8_quantize_ref's values, 16 at a time */
static void i8_quantize(const float *x, void *y, int64_t k) {
    const int64_t nblk = k / I8_QK;
    i8_zero_tail(y, k);
    int8_t *q = y;
    float *d = (float *)((char *)y + (size_t)nblk * I8_QK);
    int32_t *s = (int32_t *)(d + nblk);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nblk; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * I8_QK), v1 = _mm512_loadu_ps(x + b * I8_QK + 16);
        const float amax =
            _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i i0 = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(v0, vid)));
        const __m512i i1 = _mm512_cvtps_epi32(round_away(_mm512_mul_ps(v1, vid)));
        _mm_storeu_si128((__m128i *)(q + b * I8_QK), _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + b * I8_QK + 16), _mm512_cvtepi32_epi8(i1));
        d[b] = dd;
        s[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

/* Q4_0 quants laid out as 128-bit lanes qs_b, qs_b, qs_b1, qs_b1 -> the
 * low nibbles of the first copy of each and the high nibbles of the second:
 * per qword, the low nibble of each byte or the high one moved down (with
 * GFNI as one GF(2) affine map) */
static inline __attribute__((always_inline)) __m512i q4_nibbles(__m512i x) {
#if defined(__GFNI__)
    const __m512i nib = _mm512_setr_epi64(0x0102040800000000LL, 0x0102040800000000LL, 0x1020408000000000LL,
                                          0x1020408000000000LL, 0x0102040800000000LL, 0x0102040800000000LL,
                                          0x1020408000000000LL, 0x1020408000000000LL);
    return _mm512_gf2p8affine_epi64_epi8(x, nib, 0);
#else
    const __m512i sh = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    return _mm512_and_si512(_mm512_srlv_epi64(x, sh), _mm512_set1_epi8(0x0f));
#endif
}

/* Blocks b and b+1 of a weight row (b+1 only when two; else b again) as 64
 * unsigned bytes in element order: dwords 0..7 block b, 8..15 block b+1;
 * Q8_0 as w + 128, Q4_0 as the nibble (w + 8). */
static inline __m512i load_pair(const bool q8, const char *row, int64_t b, bool two) {
    if (q8) {
        const bt_block_q8_0 *w = (const bt_block_q8_0 *)row + b;
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)w[0].qs);
        const __m256i x1 = two ? _mm256_loadu_si256((const __m256i *)w[1].qs) : x0;
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1), _mm512_set1_epi8((char)0x80));
    }
    const bt_block_q4_0 *w = (const bt_block_q4_0 *)row + b;
    const __m128i x0 = _mm_loadu_si128((const __m128i *)w[0].qs);
    const __m128i x1 = two ? _mm_loadu_si128((const __m128i *)w[1].qs) : x0;
    /* 128-bit lanes: qs_b, qs_b, qs_b1, qs_b1; then low, high, low, high nibbles */
    const __m512i x = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(x0)), _mm256_broadcastsi128_si256(x1), 1);
    return q4_nibbles(x);
}

/* load_pair's bytes for the decode tiles, from the pair's own bytes (one or
 * two masked 64-byte loads, nothing read past block b or b+1) with one byte
 * permute; beside them, the pair's fp16 scales d_b, d_b+1 put into words
 * 2r, 2r+1 of *ds (row r of the tile; a masked word permute, merged into *ds
 * for r >= 2, the first two rows start it), so that the scales of 16 rows
 * need no transpose. */
static inline __attribute__((always_inline)) __m512i load_pair_d(const bool q8, const char *row, int64_t b, bool two,
                                                                 int r, __m512i *ds) {
    const int bs = q8 ? (int)sizeof(bt_block_q8_0) : (int)sizeof(bt_block_q4_0);
    const char *p = row + (size_t)b * (size_t)bs;
    const __mmask64 m1 = q8 ? (two ? ~(__mmask64)0 : (((__mmask64)1 << 34) - 1))
                            : (((__mmask64)1 << (two ? 36 : 18)) - 1);
    const __m512i x = _mm512_maskz_loadu_epi8(m1, p);
    /* words 2r, 2r+1 <- the u16 at bytes 0 and bs of the pair */
    const __m512i didx = _mm512_set1_epi32((int)((uint32_t)(bs / 2) << 16));
    const __mmask32 dm = (__mmask32)(3u << (2 * r));
    *ds = r < 2 ? _mm512_maskz_permutexvar_epi16(dm, didx, x) : _mm512_mask_permutexvar_epi16(*ds, dm, didx, x);
    if (q8) {
        /* qs_b: bytes 2..33; qs_b+1: bytes 36..63 and 64..67 (the second load) */
        const __m512i y = _mm512_maskz_loadu_epi8(two ? (__mmask64)0xf : 0, p + 64);
        const __m512i idx = _mm512_setr_epi64(0x0908070605040302LL, 0x11100f0e0d0c0b0aLL, 0x1918171615141312LL,
                                              0x21201f1e1d1c1b1aLL, 0x2b2a292827262524LL, 0x333231302f2e2d2cLL,
                                              0x3b3a393837363534LL, 0x434241403f3e3d3cLL);
        return _mm512_xor_si512(_mm512_permutex2var_epi8(x, idx, y), _mm512_set1_epi8((char)0x80));
    }
    /* 128-bit lanes: qs_b (bytes 2..17) twice, qs_b+1 (20..35) twice */
    const __m512i idx = _mm512_setr_epi64(0x0908070605040302LL, 0x11100f0e0d0c0b0aLL, 0x0908070605040302LL,
                                          0x11100f0e0d0c0b0aLL, 0x1b1a191817161514LL, 0x232221201f1e1d1cLL,
                                          0x1b1a191817161514LL, 0x232221201f1e1d1cLL);
    return q4_nibbles(_mm512_permutexvar_epi8(idx, x));
}

/* load_pair_d's *ds of 16 rows -> the rows' scales of block b, b+1 as floats */
static inline void pair_scales(const __m512i ds[2], __m512 *dw0, __m512 *dw1) {
    const __m512i d = _mm512_or_si512(ds[0], ds[1]); /* dword r: row r's d_b, d_b+1 */
    *dw0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
    *dw1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16)));
}

/* The 16 rows' pair dots, with the exact sums per row and block taken in
 * three steps (a block's 32 bytes span two 128-bit lanes of a row's vector
 * w[r]: dwords 0..7 block b, 8..15 block b+1):
 *  1. i8_interleave: rows 2p, 2p+1 merged, per 128-bit lane
 *     lo[p] = (a0 b0 a1 b1), hi[p] = (a2 b2 a3 b3) (a: row 2p's dwords of the
 *     lane, b: row 2p+1's); once per pair, shared by the columns;
 *  2. per column: vpdpbusd of lo[p] with the activation's dwords (x0 x0 x1 x1)
 *     then of hi[p] with (x2 x2 x3 x3): per lane (a0+a2, b0+b2, a1+a3, b1+b3);
 *  3. i8_reduce: qword pairs added (blend + alignr) -> per 128-bit lane the
 *     sums of rows 4m .. 4m+3, then lane pairs (blend + vpermt2q) and a pick
 *     of halves in row order -> *r0, *r1: lane r the sum of row r's block b,
 *     b+1.
 * Integer sums are exact in any grouping, so the result is the same I_b. */
static inline __attribute__((always_inline)) void i8_interleave(const __m512i w[16], __m512i lo[8], __m512i hi[8]) {
    for (int p = 0; p < 8; p++) {
        lo[p] = _mm512_unpacklo_epi32(w[2 * p], w[2 * p + 1]);
        hi[p] = _mm512_unpackhi_epi32(w[2 * p], w[2 * p + 1]);
    }
}
static inline __attribute__((always_inline)) void i8_reduce(const __m512i lo[8], const __m512i hi[8], __m512i av,
                                                            __m512i *r0, __m512i *r1) {
    const __m512i alo = _mm512_shuffle_epi32(av, _MM_PERM_BBAA), ahi = _mm512_shuffle_epi32(av, _MM_PERM_DDCC);
    __m512i x[4];
    for (int m = 0; m < 4; m++) {
        const __m512i a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[2 * m], alo),
                                              hi[2 * m], ahi);
        const __m512i b = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[2 * m + 1], alo),
                                              hi[2 * m + 1], ahi);
        /* per 128-bit lane: a's high qword beside b's low */
        x[m] = _mm512_add_epi32(_mm512_mask_blend_epi64((__mmask8)0xAA, a, b), _mm512_alignr_epi8(b, a, 8));
    }
    const __m512i pidx = _mm512_setr_epi64(2, 3, 8, 9, 6, 7, 12, 13);
    __m512i y[2];
    for (int n = 0; n < 2; n++) {
        const __m512i a = x[2 * n], b = x[2 * n + 1];
        /* 128-bit lanes: a1, b0, a3, b2 beside a0, b1, a2, b3 */
        y[n] = _mm512_add_epi32(_mm512_mask_blend_epi64((__mmask8)0xCC, a, b), _mm512_permutex2var_epi64(a, pidx, b));
    }
    /* y[n] 128-bit lanes: rows 8n..8n+3 and 8n+4..8n+7 for block b, then for b+1 */
    *r0 = _mm512_shuffle_i32x4(y[0], y[1], _MM_SHUFFLE(1, 0, 1, 0));
    *r1 = _mm512_shuffle_i32x4(y[0], y[1], _MM_SHUFFLE(3, 2, 3, 2));
}

#ifndef BT_I8_PREFETCH
#define BT_I8_PREFETCH 1536 /* decode tiles: prefetch distance in bytes of a row */
#endif
#define I8_CHUNK 16 /* blocks per prefetch step of the decode tiles */
#ifndef BT_I8_BLOCK_ROW
#define BT_I8_BLOCK_ROW 2048 /* decode tiles: rows up to this many bytes prefetch the next tile as a block */
#endif

/* i8_tile16's prefetch, part `part` of I8_CHUNK / 2 for the chunk of blocks
 * from c0: about BT_I8_PREFETCH bytes ahead in two of the 16 rows (near a
 * row's end, the next tile's rows: rows shorter than the distance wrap
 * round, so that the next tile does not begin by waiting on memory), or a
 * share of the next tile's rows when they are one block (block).  All 16
 * rows' lines at once, at the chunk's start (136 prefetches for Q8_0), left
 * the loads waiting for fill buffers, as in the repacked tiles
 * (bt_cpu_group_prefetch_part). */
static inline __attribute__((always_inline)) void i8_tile16_prefetch(const char *const *rows, const char *const *next,
                                                                     bool block, size_t rb, int bs, int64_t nblk,
                                                                     int64_t c0, int part) {
    const int parts = I8_CHUNK / 2;
    if (block) {
        const int64_t nsteps = (nblk + I8_CHUNK - 1) / I8_CHUNK;
        bt_cpu_prefetch_share(next[0], 0, 16 * rb, c0 / I8_CHUNK * parts + part, 1, nsteps * parts);
        return;
    }
    const int64_t pf_chunks = (BT_I8_PREFETCH / (I8_CHUNK * bs) + 1) * I8_CHUNK; /* in blocks */
    const int64_t pos = c0 + pf_chunks;
    const int64_t npos = (pos - nblk) % nblk / I8_CHUNK * I8_CHUNK;
    for (int r = 16 / parts * part; r < 16 / parts * (part + 1); r++) {
        const char *pa = pos + I8_CHUNK <= nblk               ? rows[r] + (size_t)pos * (size_t)bs
                         : next && npos + I8_CHUNK <= nblk ? next[r] + (size_t)npos * (size_t)bs
                                                              : NULL;
        if (pa)
            for (int o = 0; o < I8_CHUNK * bs; o += 64) _mm_prefetch(pa + o, _MM_HINT_T1);
    }
}

/* A 16-row x RN-column decode tile (out[c * 16 + r]); rows may repeat. */
static inline __attribute__((always_inline)) void i8_tile16(const bool q8, const int RN, int64_t k,
                                                            const char *const *rows, const char *const *next,
                                                            const void *const *acts, float *out) {
    const int bs = q8 ? (int)sizeof(bt_block_q8_0) : (int)sizeof(bt_block_q4_0);
    const int off = q8 ? 128 : 8;
    const int64_t nblk = k / I8_QK;
    /* rows up to BT_I8_BLOCK_ROW bytes: the next tile's block of rows, in
     * order (bt_cpu_prefetch_share) */
    const size_t rb = (size_t)nblk * (size_t)bs;
    const bool block = rb <= BT_I8_BLOCK_ROW && bt_cpu_rows_block((const void *const *)next, 16, rb);
    struct i8col a[4];
    __m512 acc[4];
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        acc[c] = _mm512_setzero_ps();
    }
    for (int64_t c0 = 0; c0 < nblk; c0 += I8_CHUNK) {
        const int nc = (int)(nblk - c0 < I8_CHUNK ? nblk - c0 : I8_CHUNK);
        for (int i = 0; i < nc; i += 2) {
            i8_tile16_prefetch(rows, next, block, rb, bs, nblk, c0, i / 2);
            const int64_t b = c0 + i;
            const bool two = i + 1 < nc;
            __m512i av[4];
            for (int c = 0; c < RN; c++)
                av[c] = _mm512_maskz_loadu_epi8(two ? ~(__mmask64)0 : (__mmask64)0xffffffffu, a[c].q + b * I8_QK);
            __m512i w[16], lo[8], hi[8], ds[2];
            for (int r = 0; r < 16; r++) w[r] = load_pair_d(q8, rows[r], b, two, r, &ds[r & 1]);
            i8_interleave(w, lo, hi);
            __m512 dw0, dw1;
            pair_scales(ds, &dw0, &dw1);
            for (int c = 0; c < RN; c++) {
                __m512i i0, i1;
                i8_reduce(lo, hi, av[c], &i0, &i1);
                i0 = _mm512_sub_epi32(i0, _mm512_set1_epi32(off * a[c].s[b]));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0),
                                         _mm512_mul_ps(dw0, _mm512_set1_ps(a[c].d[b])), acc[c]);
                if (two) {
                    i1 = _mm512_sub_epi32(i1, _mm512_set1_epi32(off * a[c].s[b + 1]));
                    acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1),
                                             _mm512_mul_ps(dw1, _mm512_set1_ps(a[c].d[b + 1])),
                                             acc[c]);
                }
            }
        }
    }
    for (int c = 0; c < RN; c++) _mm512_storeu_ps(out + c * 16, acc[c]);
}

/* One row, one column: the tile's order for a single row, without the
 * 16-row reduction (vec_dot; matmul.c's edges). */
static inline void i8_dot1(const bool q8, int64_t k, float *out, const char *row, const void *act) {
    const int off = q8 ? 128 : 8;
    const int64_t nblk = k / I8_QK;
    const struct i8col a = i8col_at(act, k);
    float acc = 0.0f;
    for (int64_t b = 0; b < nblk; b += 2) {
        const bool two = b + 1 < nblk;
        const __m512i av = _mm512_maskz_loadu_epi8(two ? ~(__mmask64)0 : (__mmask64)0xffffffffu, a.q + b * I8_QK);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), load_pair(q8, row, b, two), av);
        const int32_t i0 = _mm512_mask_reduce_add_epi32(0x00ff, p) - off * a.s[b];
        float dw;
        if (q8) dw = _cvtsh_ss(((const bt_block_q8_0 *)row)[b].d);
        else dw = _cvtsh_ss(((const bt_block_q4_0 *)row)[b].d);
        acc = fmaf((float)i0, dw * a.d[b], acc);
        if (two) {
            const int32_t i1 = _mm512_mask_reduce_add_epi32(0xff00, p) - off * a.s[b + 1];
            if (q8) dw = _cvtsh_ss(((const bt_block_q8_0 *)row)[b + 1].d);
            else dw = _cvtsh_ss(((const bt_block_q4_0 *)row)[b + 1].d);
            acc = fmaf((float)i1, dw * a.d[b + 1], acc);
        }
    }
    *out = acc;
}

/* ---- packed GEMM ------------------------------------------------------------------ *
 * A 16-row panel, per block (I8_PB bytes): 8 vectors of the 16 rows' unsigned
 * weight bytes (vector u, lane r: elements 4u .. 4u+3 of row r), then the
 * 16 rows' scales as float. */
#define I8_PB (8 * 64 + 64)

static size_t i8_panel_size(int64_t k) { return (size_t)(k / I8_QK) * I8_PB; }

static inline __attribute__((always_inline)) void i8_pack(const bool q8, int64_t k, const void *const *rows,
                                                          void *panel) {
    const int64_t nblk = k / I8_QK;
    uint8_t *pn = panel;
    for (int64_t b = 0; b < nblk; b += 2) {
        const bool two = b + 1 < nblk;
        __m512 v[16];
        __m512i ds[2];
        for (int r = 0; r < 16; r++) v[r] = _mm512_castsi512_ps(load_pair_d(q8, rows[r], b, two, r, &ds[r & 1]));
        __m512 dw0, dw1;
        pair_scales(ds, &dw0, &dw1);
        _mm512_store_ps(pn + (size_t)b * I8_PB + 512, dw0);
        if (two) _mm512_store_ps(pn + (size_t)(b + 1) * I8_PB + 512, dw1);
        bt_cpu_transpose16(v); /* v[u]: dword u of every row */
        uint8_t *pb = pn + (size_t)b * I8_PB;
        for (int u = 0; u < 8; u++) _mm512_store_ps(pb + 64 * u, v[u]);
        if (two)
            for (int u = 0; u < 8; u++) _mm512_store_ps(pb + I8_PB + 64 * u, v[8 + u]);
    }
}

/* I[c] += a block of 16 rows (vectors at w, a lane per row: the GEMM's
 * panel and the repacked weights) dotted with column c's block b, for RN
 * columns, each weight vector loaded once for all of them: 8 vectors of
 * unsigned bytes (q8: Q8_0 and every panel), or Q4_0's 4 of nibbles */
static inline __attribute__((always_inline)) void i8_block_cols(const bool q8, const int RN, __m512i *I,
                                                                const uint8_t *w, const struct i8col *a, int64_t b) {
    if (q8) {
        _Pragma("GCC unroll 8")
        for (int u = 0; u < 8; u++) {
            const __m512i x = _mm512_loadu_si512(w + 64 * u);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < RN; c++)
                I[c] = _mm512_dpbusd_epi32(I[c], x, _mm512_set1_epi32(bt_cpu_load_i32(a[c].q + b * I8_QK + 4 * u)));
        }
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    _Pragma("GCC unroll 4")
    for (int v = 0; v < 4; v++) {
        const __m512i x = _mm512_loadu_si512(w + 64 * v);
        const __m512i lo = _mm512_and_si512(x, m4), hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) {
            I[c] = _mm512_dpbusd_epi32(I[c], lo, _mm512_set1_epi32(bt_cpu_load_i32(a[c].q + b * I8_QK + 4 * v)));
            I[c] = _mm512_dpbusd_epi32(I[c], hi, _mm512_set1_epi32(bt_cpu_load_i32(a[c].q + b * I8_QK + 16 + 4 * v)));
        }
    }
}

/* the RN columns' parts, and their accumulators at +0 (GEMM and repacked tiles) */
static inline __attribute__((always_inline)) void i8_cols_start(const int RN, int64_t k, const void *const *acts,
                                                                struct i8col *a, __m512 *acc) {
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        acc[c] = _mm512_setzero_ps();
    }
}

/* rows row0 .. row0+nrows of columns dcols[0 .. RN) from a packed panel */
static inline __attribute__((always_inline)) void i8_gemm_tile(const bool q8, const int RN, int64_t k,
                                                               const uint8_t *panel, const void *const *acts,
                                                               float *const *dcols, int64_t row0, int nrows) {
    const int off = q8 ? 128 : 8;
    struct i8col a[8];
    __m512 acc[8];
    i8_cols_start(RN, k, acts, a, acc);
    for (int64_t b = 0; b < k / I8_QK; b++) {
        const uint8_t *pb = panel + (size_t)b * I8_PB;
        __m512i I[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) I[c] = _mm512_set1_epi32(-off * a[c].s[b]);
        i8_block_cols(true, RN, I, pb, a, b);
        const __m512 dw = _mm512_load_ps(pb + 512);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[c]), _mm512_mul_ps(dw, _mm512_set1_ps(a[c].d[b])), acc[c]);
    }
    const __mmask16 mask = (__mmask16)(nrows >= 16 ? 0xFFFF : (1u << nrows) - 1u);
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) _mm512_mask_storeu_ps(dcols[c] + row0, mask, acc[c]);
}

/* ---- repacked weights: the GEMM's loop straight on the weights -------------- *
 * Per block and column: I = -off * s, then V vectors of the 16 rows' bytes
 * each against its 4 activation bytes broadcast (Q4_0: the low nibbles
 * against elements 4v.., the high ones against 16+4v..), then the float step;
 * for one or two columns the two blocks of a pair in separate chains (the
 * decode: latency), for more a block at a time (the prompt: registers). */
#ifndef BT_RP_PREFETCH
/* repacked decode tiles (one or two columns): software prefetch distance in
 * bytes, 0: none.  A group is one contiguous run of bytes, which the
 * hardware prefetchers stream on their own, though not fast enough: with
 * the lines 2048 bytes ahead, half of a pair's at each of its two blocks
 * (bt_cpu_group_prefetch_part), Q8_0's decode row from memory read 86-89%
 * -> 96-98% of the streaming bandwidth, Q4_0's 3-16% faster (Q5_0's and
 * IQ4_NL's 3-10%, Q4_1's and Q5_1's level), and tg64 of the Mixtral-shaped
 * Q8_0 file ran 1.17x.  (A pair's lines at once, 1024 bytes ahead, had run
 * 6-16% slower in tg64.) */
#define BT_RP_PREFETCH 2048
#endif

/* 16 rows (group g) x RN columns into dcols[c][row0 .. row0+16) */
static inline __attribute__((always_inline)) void rp_tile(const bool q8, const int RN, int64_t k, const uint8_t *g,
                                                          const uint8_t *next, const void *const *acts,
                                                          float *const *dcols, int64_t row0) {
    const int off = q8 ? 128 : 8;
    const int64_t nblk = k / I8_QK;
    const size_t bs = q8 ? sizeof(bt_block_q8_0) : sizeof(bt_block_q4_0), vb = (q8 ? 8 : 4) * 64;
    const size_t pair = 2 * RP_ROWS * bs, gsize = (size_t)nblk * RP_ROWS * bs;
    struct i8col a[8];
    __m512 acc[8];
    i8_cols_start(RN, k, acts, a, acc);
    int64_t b = 0;
    /* one or two columns (decode): a pair of blocks at a time, two chains;
     * more (prompt): a block at a time (registers for 8 columns) */
    for (; RN <= 2 && b + 1 < nblk; b += 2) {
        const uint8_t *p = g + (size_t)(b / 2) * pair;
        if (BT_RP_PREFETCH > 0)
            bt_cpu_group_prefetch_part(g, gsize, next, (size_t)(p - g) + BT_RP_PREFETCH, pair, 0, 2);
        const __m512i ds = _mm512_loadu_si512(p);
        const __m512 dw0 = _mm512_cvtph_ps(_mm512_castsi512_si256(ds));
        const __m512 dw1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(ds, 1));
        __m512i I0[2], I1[2];
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) {
            I0[c] = _mm512_set1_epi32(-off * a[c].s[b]);
            I1[c] = _mm512_set1_epi32(-off * a[c].s[b + 1]);
        }
        i8_block_cols(q8, RN, I0, p + 64, a, b);
        if (BT_RP_PREFETCH > 0)
            bt_cpu_group_prefetch_part(g, gsize, next, (size_t)(p - g) + BT_RP_PREFETCH, pair, 1, 2);
        i8_block_cols(q8, RN, I1, p + 64 + vb, a, b + 1);
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) {
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I0[c]), _mm512_mul_ps(dw0, _mm512_set1_ps(a[c].d[b])), acc[c]);
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I1[c]), _mm512_mul_ps(dw1, _mm512_set1_ps(a[c].d[b + 1])),
                                     acc[c]);
        }
    }
    for (; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, bs, 2, &dof, &vof);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(g + dof)));
        __m512i I[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) I[c] = _mm512_set1_epi32(-off * a[c].s[b]);
        i8_block_cols(q8, RN, I, g + vof, a, b);
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++)
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[c]), _mm512_mul_ps(dw, _mm512_set1_ps(a[c].d[b])), acc[c]);
    }
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) _mm512_storeu_ps(dcols[c] + row0, acc[c]);
}

/* (inside I8_DEFS' qgemm and rgemm: q8_ and the functions' parameters) */
#define I8_GEMM_TILE(RN, j) i8_gemm_tile(q8_, RN, k, panel, acts + (j), dcols + (j), row0, nrows)
#define RP_TILE(RN, j) rp_tile(q8_, RN, k, g, nx, acts + (j), dcols + (j), row0)
#define I8_DEFS(name, q8)                                                                                        \
    static void dot_##name##_avx512(int64_t k, float *s, const void *w, const void *a) {                          \
        i8_dot1(q8, k, s, w, a);                                                                                   \
    }                                                                                                              \
    static void qtile_##name##_16x1(int64_t k, const void *const *w, const void *const *a, const void *const *n, \
                                    float *out) {                                                                  \
        i8_tile16(q8, 1, k, (const char *const *)w, (const char *const *)n, a, out);                              \
    }                                                                                                              \
    static void qtile_##name##_16x2(int64_t k, const void *const *w, const void *const *a, const void *const *n, \
                                    float *out) {                                                                  \
        i8_tile16(q8, 2, k, (const char *const *)w, (const char *const *)n, a, out);                              \
    }                                                                                                              \
    static void qtile_##name##_16x4(int64_t k, const void *const *w, const void *const *a, const void *const *n, \
                                    float *out) {                                                                  \
        i8_tile16(q8, 4, k, (const char *const *)w, (const char *const *)n, a, out);                              \
    }                                                                                                              \
    static void qpack_##name(int64_t k, const void *const *rows, void *panel) { i8_pack(q8, k, rows, panel); }   \
    static void qgemm_##name(int64_t k, const void *panel, const void *const *acts, int64_t ncols,                \
                             float *const *dcols, int64_t row0, int nrows) {                                      \
        const bool q8_ = q8;                                                                                       \
        BT_CPU_COL_TILES(ncols, I8_GEMM_TILE);                                                                     \
    }                                                                                                              \
    static void rgemm_##name(int64_t k, const void *group, const void *next, const void *const *acts,            \
                             int64_t ncols, float *const *dcols, int64_t row0) {                                  \
        const uint8_t *g = group, *nx = next;                                                                      \
        const bool q8_ = q8;                                                                                       \
        BT_CPU_COL_TILES(ncols, RP_TILE);                                                                          \
    }
I8_DEFS(q8_0, true)
I8_DEFS(q4_0, false)

#ifndef BT_I8_GEMM_MIN_COLS
#define BT_I8_GEMM_MIN_COLS 3 /* jobs with at least this many columns take the packed GEMM */
#endif
#define I8_TILES(name) {{16, 1, qtile_##name##_16x1}, {16, 2, qtile_##name##_16x2}, {16, 4, qtile_##name##_16x4}, {0, 0, NULL}}
#define I8_GEMM(name) BT_I8_GEMM_MIN_COLS, i8_panel_size, qpack_##name, qgemm_##name
#define I8_QUANTIZE i8_quantize
#define FAST(name) dot_##name##_avx512
#define I8_REPACK(name) &rp_##name, rgemm_##name, NULL, 0 /* rgemm is the GEMM's own loop */
#endif

#if defined(HAVE_I8_AVX512) || defined(HAVE_I8_AVX2)
/* ---- AVX2 (FMA, F16C) ------------------------------------------------------------ *
 * dot_ref's I_b and float step per output element, the products of a block
 * summed in 8 int32 lanes: vpmaddubsw (unsigned x signed bytes, pairs to
 * int16) then vpmaddwd by ones (pairs of pairs to int32), or vpdpbusd
 * where the build has AVX-VNNI.  Q8_0's signed weights go in as |w|
 * against a with w's sign (vpsignb; |w| <= 128, so a pair is at most
 * 2 * 128 * 127 < 32768 and never saturates), Q4_0's as the nibble (w + 8)
 * with 8 s_b taken off after, Q5_0's as nibble | fifth bit << 4 (w + 16,
 * 0 .. 31) and MXFP4's as its table value + 16 (4 .. 28), both with 16 s_b
 * taken off, Q4_1's and Q5_1's as they are (w), IQ4_NL's as Q8_0's (|w|
 * against a with w's sign: |w| <= 127).  The lanes' sum is exact, and the
 * fmas are dot_ref's, in scalar (the dot), or 8 rows' at once (tiles of 8
 * rows, each row's block unpacked once for the tile's columns).  Builds
 * with AVX-512 VNNI run the section's kernels but Q8_0's and Q4_0's. */

/* the offset the unsigned weight bytes carry, taken off through s (Q8_0's
 * signs go onto the activation instead) */
static inline int i8_off(const int kind) {
    return kind == I8_Q4 ? 8 : kind == I8_Q5 || kind == I8_MX ? 16 : 0;
}

/* Q8_0 and IQ4_NL: signed weight bytes, |w| against the activation with
 * w's sign (|w| <= 128, IQ4_NL's <= 127: a pair of products at most
 * 2 * 128 * 127 < 2^15) */
static inline bool i8_signed(const int kind) { return kind == I8_Q8 || kind == I8_NL; }

/* the table types' values in both 128-bit lanes, for vpshufb: MXFP4's + 16,
 * IQ4_NL's as they are */
static inline __m256i i8_lut(const int kind) {
    if (kind == I8_NL) return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt_iq4nl_values));
    return _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bt_mxfp4_values)),
                           _mm256_set1_epi8(16));
}

/* 32 nibbles (bytes 0..15 the low ones, elements 0..15) as the kind's
 * weight bytes: Q4_0 the nibble, MXFP4 its table value + 16, IQ4_NL its
 * (signed) table value */
static inline __m256i i8_nib_u8(const int kind, __m256i n, __m256i lut) {
    return kind == I8_MX || kind == I8_NL ? _mm256_shuffle_epi8(lut, n) : n;
}

/* bt_e8m0_half of 8 E8M0 bytes at e, as floats */
static inline __m256 mx_scales8(const uint8_t *e) {
    const __m256i z = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(z, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), z);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), z)));
}

/* its 32 weights for bt_cpu_dot4_avx2: *u the unsigned bytes, *w the
 * signed ones whose signs go onto the activation (Q8_0, IQ4_NL) */
static inline __attribute__((always_inline)) void i8_block_u8(const int kind, const char *blk, __m256i lut,
                                                              __m256i *u, __m256i *w) {
    if (kind == I8_Q8) {
        *w = _mm256_loadu_si256((const __m256i *)((const bt_block_q8_0 *)blk)->qs);
        *u = _mm256_abs_epi8(*w);
        return;
    }
    if (kind == I8_Q5) {
        const bt_block_q5_0 *q = (const bt_block_q5_0 *)blk;
        *u = *w = _mm256_or_si256(bt_cpu_nibbles32_avx2(q->qs), bt_cpu_q5_bits_avx2(q->qh));
        return;
    }
    if (kind == I8_Q51) {
        const bt_block_q5_1 *q = (const bt_block_q5_1 *)blk;
        *u = *w = _mm256_or_si256(bt_cpu_nibbles32_avx2(q->qs), bt_cpu_q5_bits_avx2(q->qh));
        return;
    }
    const uint8_t *qs = kind == I8_Q4    ? ((const bt_block_q4_0 *)blk)->qs
                        : kind == I8_Q41 ? ((const bt_block_q4_1 *)blk)->qs
                        : kind == I8_NL  ? ((const bt_block_iq4_nl *)blk)->qs
                                         : ((const bt_block_mxfp4 *)blk)->qs;
    *u = *w = i8_nib_u8(kind, bt_cpu_nibbles32_avx2(qs), lut);
    if (kind == I8_NL) *u = _mm256_abs_epi8(*w);
}

/* out[c * RM + r] = dot(rows[r], acts[c]) for r < RM, c < RN, one element at a time */
static inline __attribute__((always_inline)) void i8_tile_avx2(const int kind, const int RM, const int RN, int64_t k,
                                                               const void *const *rows, const void *const *acts,
                                                               float *out) {
    const int off = i8_off(kind);
    const size_t bs = i8_block_bytes(kind);
    const int64_t nblk = k / I8_QK;
    const __m256i lut = i8_lut(kind);
    struct i8col a[4];
    float acc[4][4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) acc[r][c] = 0.0f;
    }
    for (int64_t b = 0; b < nblk; b++) {
        __m256i av[4];
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) av[c] = _mm256_loadu_si256((const __m256i *)(a[c].q + b * I8_QK));
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) {
            const char *blk = (const char *)rows[r] + (size_t)b * bs;
            __m256i w, u;
            i8_block_u8(kind, blk, lut, &u, &w);
            const float dw = i8_block_scale(kind, blk), mw = i8_has_min(kind) ? i8_block_min(blk) : 0.0f;
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) {
                const __m256i s = i8_signed(kind) ? _mm256_sign_epi8(av[c], w) : av[c];
                const __m256i p = bt_cpu_dot4_avx2(u, s);
                const int32_t isum = bt_cpu_hsum_i32x8(p) - off * a[c].s[b];
                acc[r][c] = fmaf((float)isum, dw * a[c].d[b], acc[r][c]);
                if (i8_has_min(kind)) acc[r][c] = fmaf((float)a[c].s[b], mw * a[c].d[b], acc[r][c]);
            }
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++)
        _Pragma("GCC unroll 4")
        for (int r = 0; r < RM; r++) out[c * RM + r] = acc[r][c];
}

/* lane r = the sum of p[r]'s 8 lanes, r < 8 (exact: integers) */
static inline __m256i hsum8x8_i32(const __m256i p[8]) {
    const __m256i h01 = _mm256_hadd_epi32(p[0], p[1]), h23 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i h45 = _mm256_hadd_epi32(p[4], p[5]), h67 = _mm256_hadd_epi32(p[6], p[7]);
    /* per 128-bit lane: the four rows' sums of that lane's 4 dwords */
    const __m256i h0123 = _mm256_hadd_epi32(h01, h23), h4567 = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                            _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

/* i8_tile8_avx2 prefetches as the K-quants' decode tiles do
 * (bt_cpu_tile_prefetch_n), every I8_TILE8_PF blocks for that many: without
 * it the plain rows of Q4_1, Q5_0, Q5_1, MXFP4 and IQ4_NL from memory read
 * 70-80% of the streaming bandwidth, with it 84-100% (AVX-512 Xeon) */
#define I8_TILE8_PF 4
/* An 8-row x RN-column tile (out[c * 8 + r]): i8_tile_avx2's integers, the
 * 8 rows' sums of a block gathered into one vector (a lane per row), then
 * the fma of the 8 rows in one instruction; the same operations per element
 * as the scalar fma. */
static inline __attribute__((always_inline)) void i8_tile8_avx2(const int kind, const int RN, int64_t k,
                                                                const void *const *rows, const void *const *next,
                                                                const void *const *acts, float *out) {
    const size_t bs = i8_block_bytes(kind);
    const int64_t nblk = k / I8_QK;
    const __m256i lut = i8_lut(kind);
    struct i8col a[4];
    __m256 acc[4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        acc[c] = _mm256_setzero_ps();
    }
    const int block = bt_cpu_tile_block_kind(rows, next, nblk, bs, 8);
    for (int64_t b = 0; b < nblk; b++) {
        if (b % I8_TILE8_PF == 0) bt_cpu_tile_prefetch_n(rows, next, block, b, I8_TILE8_PF, nblk, bs, 8);
        uint16_t d[8], m[8]; /* the rows' fp16 scales (first in the blocks but MXFP4's), Q4_1's and Q5_1's mins */
        uint8_t e[8];        /* or MXFP4's E8M0 scales */
        __m256i w[8], u[8];
        _Pragma("GCC unroll 8")
        for (int r = 0; r < 8; r++) {
            const char *blk = (const char *)rows[r] + (size_t)b * bs;
            if (kind == I8_MX) e[r] = (uint8_t)blk[0];
            else memcpy(&d[r], blk, sizeof d[r]);
            if (i8_has_min(kind)) memcpy(&m[r], blk + sizeof d[r], sizeof m[r]);
            i8_block_u8(kind, blk, lut, &u[r], &w[r]);
        }
        const __m256 dw = kind == I8_MX ? mx_scales8(e) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)d));
        const __m256 mw = i8_has_min(kind) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)m)) : _mm256_setzero_ps();
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            const __m256i av = _mm256_loadu_si256((const __m256i *)(a[c].q + b * I8_QK));
            __m256i p[8];
            _Pragma("GCC unroll 8")
            for (int r = 0; r < 8; r++)
                p[r] = bt_cpu_dot4_avx2(u[r], i8_signed(kind) ? _mm256_sign_epi8(av, w[r]) : av);
            __m256i isum = hsum8x8_i32(p);
            if (i8_off(kind)) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(i8_off(kind) * a[c].s[b]));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(a[c].d[b])), acc[c]);
            if (i8_has_min(kind))
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps((float)a[c].s[b]), _mm256_mul_ps(mw, _mm256_set1_ps(a[c].d[b])),
                                         acc[c]);
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) _mm256_storeu_ps(out + c * 8, acc[c]);
}

#define I8_AVX2_TILE(name, kind, RN)                                                                            \
    static void qtile_##name##_8x##RN(int64_t k, const void *const *w, const void *const *a,                   \
                                      const void *const *n, float *out) {                                      \
        i8_tile8_avx2(kind, RN, k, w, n, a, out);                                                              \
    }
#define I8_AVX2_DEFS(name, kind)                                                                                \
    static void dot_##name##_avx2(int64_t k, float *s, const void *w, const void *a) {                         \
        i8_tile_avx2(kind, 1, 1, k, &w, &a, s);                                                                \
    }                                                                                                          \
    I8_AVX2_TILE(name, kind, 1)                                                                                \
    I8_AVX2_TILE(name, kind, 2)                                                                                \
    I8_AVX2_TILE(name, kind, 4)

/* the scales of rows 8 h .. 8 h + 7 of a repacked block whose 16 rows'
 * scales are at sc; Q4_1's and Q5_1's mins in *mw (their 4-byte scales: d
 * then m a row) */
static inline __m256 rp_scales8(const int kind, const uint8_t *sc, const int h, __m256 *mw) {
    if (kind == I8_MX) return mx_scales8(sc + 8 * h);
    if (i8_has_min(kind)) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(sc + 32 * h));
        const __m256i lo = _mm256_and_si256(x, _mm256_set1_epi32(0xffff)), hi = _mm256_srli_epi32(x, 16);
        /* per 128-bit lane: 4 rows' d, then their m; then the d of 8 rows, their m */
        const __m256i dm = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), _MM_SHUFFLE(3, 1, 2, 0));
        *mw = _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1));
        return _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 16 * h)));
}

/* the unsigned weight bytes of 8 rows' step v (0 .. 3) of a repacked block
 * from its vector of nibbles x: *lo elements 4v .. 4v+3 of each row, *hi
 * 16+4v ..; Q5_0's and Q5_1's fifth bits from P, their vector of them
 * (bt_cpu_qh_order) */
static inline __attribute__((always_inline)) void rp_nib_u8(const int kind, __m256i x, __m256i P, const int v,
                                                            __m256i lut, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    *lo = _mm256_and_si256(x, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m4);
    if (i8_has_qh(kind)) {
        const __m256i m10 = _mm256_set1_epi8(0x10);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi32(P, 4 - v), m10));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srli_epi32(P, v), m10));
    } else {
        *lo = i8_nib_u8(kind, *lo, lut);
        *hi = i8_nib_u8(kind, *hi, lut);
    }
}

/* bt_cpu_dot4_avx2 of a repacked step's weight bytes w against activation
 * bytes a; IQ4_NL's signed w as |w| against a with w's sign */
static inline __m256i rp_dot4(const int kind, __m256i w, __m256i a) {
    if (kind == I8_NL) return bt_cpu_dot4_avx2(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
    return bt_cpu_dot4_avx2(w, a);
}

/* The repacked types on AVX2: rp_tile's arithmetic (a block at a time) on
 * two halves of the group's 16 rows (bytes 32h .. 32h + 31 of each vector:
 * 8 rows' 4 bytes).  The nibble types: vpdpbusd as bt_cpu_dot4_avx2 (the
 * nibbles, Q5_0's and Q5_1's with their fifth bits, or MXFP4's table + 16,
 * against int8: exact), from -off s; IQ4_NL's table values as Q8_0's
 * weights, |w| against the activation with w's sign.
 * Q8_0: the repacked bytes w + 128 (up to
 * 255 against int8 could saturate vpmaddubsw) back to w, then |w| against
 * the activation with w's sign (pairs at most 2 * 128 * 127), from 0: the
 * integer rp_tile forms as -128 s + sum (w + 128) a.  The same integers and
 * float steps, so the same bits. */
static inline __attribute__((always_inline)) void rp_i8_half_avx2(const int kind, const int RN, int64_t k,
                                                                  const uint8_t *g, const void *const *acts,
                                                                  float *const *dcols, int64_t row0, const int half) {
    const bool q8 = kind == I8_Q8;
    const int64_t nblk = k / I8_QK;
    const size_t bs = i8_block_bytes(kind);
    const __m256i x80 = _mm256_set1_epi8((char)0x80), lut = i8_lut(kind);
    struct i8col a[8];
    __m256 acc[8];
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, bs, i8_rp_ds(kind), &dof, &vof);
        __m256 mw = _mm256_setzero_ps();
        const __m256 dw = rp_scales8(kind, g + dof, half, &mw);
        const uint8_t *w = g + vof + 32 * half;
        __m256i I[8];
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) I[c] = _mm256_set1_epi32(-i8_off(kind) * a[c].s[b]);
        _Pragma("GCC unroll 8")
        for (int u = 0; q8 && u < 8; u++) {
            const __m256i x = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 64 * u)), x80);
            const __m256i ax = _mm256_abs_epi8(x);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < RN; c++) {
                const __m256i av = _mm256_set1_epi32(bt_cpu_load_i32(a[c].q + b * I8_QK + 4 * u));
                I[c] = _mm256_add_epi32(I[c], bt_cpu_dot4_avx2(ax, _mm256_sign_epi8(av, x)));
            }
        }
        const int v0 = i8_has_qh(kind); /* Q5_0's and Q5_1's nibbles after their fifth bits */
        const __m256i P = i8_has_qh(kind) ? _mm256_loadu_si256((const __m256i *)w) : _mm256_setzero_si256();
        _Pragma("GCC unroll 4")
        for (int v = 0; !q8 && v < 4; v++) {
            __m256i lo, hi;
            rp_nib_u8(kind, _mm256_loadu_si256((const __m256i *)(w + 64 * (v0 + v))), P, v, lut, &lo, &hi);
            _Pragma("GCC unroll 8")
            for (int c = 0; c < RN; c++) {
                const int8_t *aq = a[c].q + b * I8_QK + 4 * v;
                I[c] = _mm256_add_epi32(I[c], rp_dot4(kind, lo, _mm256_set1_epi32(bt_cpu_load_i32(aq))));
                I[c] = _mm256_add_epi32(I[c], rp_dot4(kind, hi, _mm256_set1_epi32(bt_cpu_load_i32(aq + 16))));
            }
        }
        _Pragma("GCC unroll 8")
        for (int c = 0; c < RN; c++) {
            const __m256 da = _mm256_set1_ps(a[c].d[b]);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[c]), _mm256_mul_ps(dw, da), acc[c]);
            if (i8_has_min(kind))
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps((float)a[c].s[b]), _mm256_mul_ps(mw, da), acc[c]);
        }
    }
    _Pragma("GCC unroll 8")
    for (int c = 0; c < RN; c++) _mm256_storeu_ps(dcols[c] + row0 + 8 * half, acc[c]);
}

/* The decode tile prefetches, at each block, a block's worth of the bytes
 * BT_RP_AVX2_PREFETCH ahead in the group (past its end, the next one's) into
 * L1.  Unlike the AVX-512 tile's (BT_RP_PREFETCH), whose 512-bit loads keep
 * the hardware prefetchers ahead, the 256-bit one left the memory idle:
 * 2 threads from memory, Q4_0 64-67% of the streaming bandwidth, Q8_0
 * 79-85%, MXFP4 54-63%, IQ4_NL 54-64%; with 2048 bytes ahead 87-97%,
 * 91-97%, 80-90%, 75-92% (1024 about the same, 4096 72-86%; an AVX-512
 * Xeon, its avx2, avx2vnni and avx512f variants). */
#ifndef BT_RP_AVX2_PREFETCH
#define BT_RP_AVX2_PREFETCH 2048
#endif

/* The same sums for both halves of a block at once, in tiles of at most 2
 * columns: for few columns (decode), where a broadcast then serves 16 rows
 * and the group's bytes pass through L1 once; the pairs of the nibble types
 * summed as int16 first, then vpmaddwd by ones: Q4_0's and Q4_1's 8 pairs
 * of nibbles against int8 a row lane (8 * 2 * 15 * 127 < 2^15), MXFP4's,
 * Q5_0's and Q5_1's 4 (their bytes reach 28 and 31: 4 * 2 * 31 * 127 <
 * 2^15).  The same integers. */
static inline __attribute__((always_inline)) void rp_i8_tile16_avx2(const int kind, const int RN, int64_t k,
                                                                    const uint8_t *g, const uint8_t *next,
                                                                    const void *const *acts,
                                                                    float *const *dcols, int64_t row0) {
    const bool q8 = kind == I8_Q8;
    const int64_t nblk = k / I8_QK;
    const size_t bs = i8_block_bytes(kind);
    const __m256i x80 = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1), lut = i8_lut(kind);
    struct i8col a[2];
    __m256 acc[2][2];
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    }
    const size_t gsize = (size_t)nblk * RP_ROWS * bs;
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, bs, i8_rp_ds(kind), &dof, &vof);
        const uint8_t *w = g + vof;
        if (BT_RP_AVX2_PREFETCH > 0)
            bt_cpu_group_prefetch(g, gsize, next, (size_t)b * RP_ROWS * bs + BT_RP_AVX2_PREFETCH, RP_ROWS * bs);
        __m256i I[2][2];
        _Pragma("GCC unroll 2")
        for (int c = 0; c < RN; c++) I[0][c] = I[1][c] = _mm256_set1_epi32(-i8_off(kind) * a[c].s[b]);
        _Pragma("GCC unroll 8")
        for (int u = 0; q8 && u < 8; u++) {
            __m256i x[2], ax[2];
            _Pragma("GCC unroll 2")
            for (int hf = 0; hf < 2; hf++) {
                x[hf] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 64 * u + 32 * hf)), x80);
                ax[hf] = _mm256_abs_epi8(x[hf]);
            }
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) {
                const __m256i av = _mm256_set1_epi32(bt_cpu_load_i32(a[c].q + b * I8_QK + 4 * u));
                _Pragma("GCC unroll 2")
                for (int hf = 0; hf < 2; hf++)
                    I[hf][c] = _mm256_add_epi32(I[hf][c], bt_cpu_dot4_avx2(ax[hf], _mm256_sign_epi8(av, x[hf])));
            }
        }
        _Pragma("GCC unroll 4")
        for (int v = 0; kind == I8_NL && v < 4; v++) { /* |w| against a with w's sign, a vpmaddwd each */
            __m256i lo[2], hi[2];
            _Pragma("GCC unroll 2")
            for (int hf = 0; hf < 2; hf++)
                rp_nib_u8(kind, _mm256_loadu_si256((const __m256i *)(w + 64 * v + 32 * hf)), _mm256_setzero_si256(), v,
                          lut, &lo[hf], &hi[hf]);
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) {
                const int8_t *aq = a[c].q + b * I8_QK + 4 * v;
                const __m256i al = _mm256_set1_epi32(bt_cpu_load_i32(aq));
                const __m256i ah = _mm256_set1_epi32(bt_cpu_load_i32(aq + 16));
                _Pragma("GCC unroll 2")
                for (int hf = 0; hf < 2; hf++) {
                    I[hf][c] = _mm256_add_epi32(I[hf][c], rp_dot4(kind, lo[hf], al));
                    I[hf][c] = _mm256_add_epi32(I[hf][c], rp_dot4(kind, hi[hf], ah));
                }
            }
        }
        if (!q8 && kind != I8_NL) {
            const int run = kind == I8_Q4 || kind == I8_Q41 ? 4 : 2; /* v steps summed as int16 */
            const int v0 = i8_has_qh(kind); /* Q5_0's and Q5_1's nibbles after their fifth bits */
            __m256i P[2];
            _Pragma("GCC unroll 2")
            for (int hf = 0; hf < 2; hf++)
                P[hf] = v0 ? _mm256_loadu_si256((const __m256i *)(w + 32 * hf)) : _mm256_setzero_si256();
            __m256i p[2][2];
            _Pragma("GCC unroll 4")
            for (int v = 0; v < 4; v++) {
                if (v % run == 0) {
                    _Pragma("GCC unroll 2")
                    for (int c = 0; c < RN; c++) p[0][c] = p[1][c] = _mm256_setzero_si256();
                }
                __m256i lo[2], hi[2];
                _Pragma("GCC unroll 2")
                for (int hf = 0; hf < 2; hf++)
                    rp_nib_u8(kind, _mm256_loadu_si256((const __m256i *)(w + 64 * (v0 + v) + 32 * hf)), P[hf], v, lut,
                              &lo[hf], &hi[hf]);
                _Pragma("GCC unroll 2")
                for (int c = 0; c < RN; c++) {
                    const int8_t *aq = a[c].q + b * I8_QK + 4 * v;
                    const __m256i al = _mm256_set1_epi32(bt_cpu_load_i32(aq)), ah = _mm256_set1_epi32(bt_cpu_load_i32(aq + 16));
                    _Pragma("GCC unroll 2")
                    for (int hf = 0; hf < 2; hf++)
                        p[hf][c] = _mm256_add_epi16(p[hf][c], _mm256_add_epi16(_mm256_maddubs_epi16(lo[hf], al),
                                                                               _mm256_maddubs_epi16(hi[hf], ah)));
                }
                if (v % run == run - 1) {
                    _Pragma("GCC unroll 2")
                    for (int c = 0; c < RN; c++)
                        _Pragma("GCC unroll 2")
                        for (int hf = 0; hf < 2; hf++)
                            I[hf][c] = _mm256_add_epi32(I[hf][c], _mm256_madd_epi16(p[hf][c], ones));
                }
            }
        }
        _Pragma("GCC unroll 2")
        for (int hf = 0; hf < 2; hf++) {
            __m256 mw = _mm256_setzero_ps();
            const __m256 dw = rp_scales8(kind, g + dof, hf, &mw);
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c++) {
                const __m256 da = _mm256_set1_ps(a[c].d[b]);
                acc[hf][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I[hf][c]), _mm256_mul_ps(dw, da), acc[hf][c]);
                if (i8_has_min(kind))
                    acc[hf][c] = _mm256_fmadd_ps(_mm256_set1_ps((float)a[c].s[b]), _mm256_mul_ps(mw, da), acc[hf][c]);
            }
        }
    }
    _Pragma("GCC unroll 2")
    for (int c = 0; c < RN; c++) {
        _mm256_storeu_ps(dcols[c] + row0, acc[0][c]);
        _mm256_storeu_ps(dcols[c] + row0 + 8, acc[1][c]);
    }
}

#define RP_I8_TILE(RN, j)                                                     \
    do {                                                                      \
        rp_i8_half_avx2(kind_, RN, k, g, acts + (j), dcols + (j), row0, 0);   \
        rp_i8_half_avx2(kind_, RN, k, g, acts + (j), dcols + (j), row0, 1);   \
    } while (0)
#define RP_I8_AVX2(name, kind)                                                                                \
    static void rgemm_##name(int64_t k, const void *group, const void *next, const void *const *acts,         \
                             int64_t ncols, float *const *dcols, int64_t row0) {                               \
        const uint8_t *g = group, *nx = next;                                                                   \
        const int kind_ = kind;                                                                                 \
        if (ncols < 4) {                                                                                        \
            int64_t j = 0;                                                                                      \
            for (; j + 2 <= ncols; j += 2) rp_i8_tile16_avx2(kind_, 2, k, g, nx, acts + j, dcols + j, row0);    \
            if (j < ncols) rp_i8_tile16_avx2(kind_, 1, k, g, nx, acts + j, dcols + j, row0);                    \
            return;                                                                                             \
        }                                                                                                       \
        BT_CPU_COL_TILES(ncols, RP_I8_TILE);                                                                    \
    }
#define I8_AVX2_TILES(name) {{8, 1, qtile_##name##_8x1}, {8, 2, qtile_##name##_8x2}, {8, 4, qtile_##name##_8x4}, {0, 0, NULL}}
#ifdef HAVE_I8_AVX2
I8_AVX2_DEFS(q8_0, I8_Q8)
I8_AVX2_DEFS(q4_0, I8_Q4)
RP_I8_AVX2(q8_0, I8_Q8)
RP_I8_AVX2(q4_0, I8_Q4)
#define I8_TILES(name) I8_AVX2_TILES(name)
#define I8_GEMM(name) 0, NULL, NULL, NULL
#define I8_QUANTIZE i8_quantize_ref
#define FAST(name) dot_##name##_avx2
#define I8_REPACK(name) &rp_##name, rgemm_##name, NULL, 0
#endif
I8_AVX2_DEFS(q4_1, I8_Q41)
RP_I8_AVX2(q4_1, I8_Q41)
I8_AVX2_DEFS(q5_0, I8_Q5)
RP_I8_AVX2(q5_0, I8_Q5)
I8_AVX2_DEFS(q5_1, I8_Q51)
RP_I8_AVX2(q5_1, I8_Q51)
I8_AVX2_DEFS(iq4_nl, I8_NL)
RP_I8_AVX2(iq4_nl, I8_NL)
I8_AVX2_DEFS(mxfp4, I8_MX)
RP_I8_AVX2(mxfp4, I8_MX)
/* the other types' kernels on every x86 build (W: a type's name) */
#define W_TILES(name) I8_AVX2_TILES(name)
#define W_GEMM(name) 0, NULL, NULL, NULL
#define W_FAST(name) dot_##name##_avx2
#define W_REPACK(name) &rp_##name, rgemm_##name, NULL, 0
#elif defined(HAVE_I8_NEON)
/* ---- NEON (aarch64; sdot with dotprod, smmla with i8mm) --------------------------- *
 * dot_ref's I_b and float step per output element.  A block's weights are
 * 32 signed bytes in element order (Q4_0: the nibble - 8, in [-8, 7];
 * Q5_0: its 5-bit value - 16; Q4_1, Q5_1: the value; MXFP4: its table
 * value, by tbl), its
 * activation's 32 q; the products summed in 4 int32 lanes: sdot where the
 * build has dotprod, else smull / smull2 to int16 (no overflow: one
 * product at most 128 * 128) and sadalp into int32.  With i8mm, the tiles'
 * pairs of columns take smmla instead: two rows' 8 bytes against two
 * columns' 8 bytes, four sums at once, four steps a block.  The sums are
 * exact in any grouping; the tiles (4 rows x 1, 2 or 4 columns) gather the
 * 4 rows' I_b into one vector and take the 4 rows' fma at once (fmla: the
 * scalar fmaf's rounding), the dot takes dot_ref's fma in scalar. */

/* block b of a weight row: 32 signed bytes (*w0 elements 0..15, *w1 16..31) */
static inline __attribute__((always_inline)) void i8_block_neon(const int kind, const char *blk, int8x16_t *w0,
                                                                int8x16_t *w1) {
    if (kind == I8_Q8) {
        const bt_block_q8_0 *q = (const bt_block_q8_0 *)blk;
        *w0 = vld1q_s8(q->qs);
        *w1 = vld1q_s8(q->qs + 16);
    } else if (kind == I8_Q4) {
        const uint8x16_t x = vld1q_u8(((const bt_block_q4_0 *)blk)->qs);
        *w0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
        *w1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 4)), vdupq_n_s8(8));
    } else if (kind == I8_Q41) {
        const uint8x16_t x = vld1q_u8(((const bt_block_q4_1 *)blk)->qs);
        *w0 = vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0f)));
        *w1 = vreinterpretq_s8_u8(vshrq_n_u8(x, 4));
    } else if (kind == I8_Q5 || kind == I8_Q51) {
        const uint8_t *qs = kind == I8_Q5 ? ((const bt_block_q5_0 *)blk)->qs : ((const bt_block_q5_1 *)blk)->qs;
        const uint8x16_t x = vld1q_u8(qs);
        uint32_t qh;
        memcpy(&qh, kind == I8_Q5 ? ((const bt_block_q5_0 *)blk)->qh : ((const bt_block_q5_1 *)blk)->qh, sizeof qh);
        /* byte j of h0 (h1): bit j (16 + j) of qh tested, 16 where set */
        const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
        const uint8x16_t h0 = vcombine_u8(vdup_n_u8((uint8_t)qh), vdup_n_u8((uint8_t)(qh >> 8)));
        const uint8x16_t h1 = vcombine_u8(vdup_n_u8((uint8_t)(qh >> 16)), vdup_n_u8((uint8_t)(qh >> 24)));
        const uint8x16_t s16 = vdupq_n_u8(16);
        /* the 5-bit values, Q5_0's less 16 */
        const int8x16_t off = vdupq_n_s8(kind == I8_Q5 ? 16 : 0);
        const uint8x16_t v0 = vorrq_u8(vandq_u8(x, vdupq_n_u8(0x0f)), vandq_u8(vtstq_u8(h0, bit), s16));
        const uint8x16_t v1 = vorrq_u8(vshrq_n_u8(x, 4), vandq_u8(vtstq_u8(h1, bit), s16));
        *w0 = vsubq_s8(vreinterpretq_s8_u8(v0), off);
        *w1 = vsubq_s8(vreinterpretq_s8_u8(v1), off);
    } else {
        const int8x16_t tab = vld1q_s8(kind == I8_NL ? bt_iq4nl_values : bt_mxfp4_values);
        const uint8_t *qs = kind == I8_NL ? ((const bt_block_iq4_nl *)blk)->qs : ((const bt_block_mxfp4 *)blk)->qs;
        const uint8x16_t x = vld1q_u8(qs);
        *w0 = vqtbl1q_s8(tab, vandq_u8(x, vdupq_n_u8(0x0f)));
        *w1 = vqtbl1q_s8(tab, vshrq_n_u8(x, 4));
    }
}

/* the 32 products of a block, summed into 4 int32 lanes */
static inline int32x4_t i8_dot32_neon(int8x16_t w0, int8x16_t w1, int8x16_t a0, int8x16_t a1) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, a0), w1, a1);
#else
    int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(a0)));
    s = vpadalq_s16(s, vmull_high_s8(w0, a0));
    s = vpadalq_s16(s, vmull_s8(vget_low_s8(w1), vget_low_s8(a1)));
    return vpadalq_s16(s, vmull_high_s8(w1, a1));
#endif
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
/* 8-byte halves of x and y side by side: (x lo, y lo) or (x hi, y hi) */
static inline int8x16_t zip_lo64(int8x16_t x, int8x16_t y) {
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)));
}
static inline int8x16_t zip_hi64(int8x16_t x, int8x16_t y) {
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(x), vreinterpretq_s64_s8(y)));
}
/* rows x, y (each a block: 32 bytes) against columns c, d: lanes
 * (x.c, x.d, y.c, y.d) of the block's sums */
static inline int32x4_t i8_mmla_block(const int8x16_t p[4], const int8x16_t q[4]) {
    int32x4_t m = vdupq_n_s32(0);
    for (int g = 0; g < 4; g++) m = vmmlaq_s32(m, p[g], q[g]);
    return m;
}
/* a pair's four 8-byte groups interleaved (smmla's operand order) */
static inline void i8_pair_groups(int8x16_t x0, int8x16_t x1, int8x16_t y0, int8x16_t y1, int8x16_t p[4]) {
    p[0] = zip_lo64(x0, y0);
    p[1] = zip_hi64(x0, y0);
    p[2] = zip_lo64(x1, y1);
    p[3] = zip_hi64(x1, y1);
}
#endif

/* A 4-row x RN-column tile (out[c * 4 + r]): each element dot_ref's
 * integers and float steps, the 4 rows' in one vector */
static inline __attribute__((always_inline)) void i8_tile4_neon(const int kind, const int RN, int64_t k,
                                                                const void *const *rows, const void *const *acts,
                                                                float *out) {
    const size_t bs = i8_block_bytes(kind);
    const int64_t nblk = k / I8_QK;
    struct i8col a[4];
    float32x4_t acc[4];
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) {
        a[c] = i8col_at(acts[c], k);
        acc[c] = vdupq_n_f32(0.0f);
    }
    for (int64_t b = 0; b < nblk; b++) {
        int8x16_t w0[4], w1[4];
        uint16_t d[4], m[4]; /* the rows' fp16 scales (first in the blocks but MXFP4's), Q4_1's and Q5_1's mins */
        float dm[4];         /* or MXFP4's scales */
        _Pragma("GCC unroll 4")
        for (int r = 0; r < 4; r++) {
            const char *blk = (const char *)rows[r] + (size_t)b * bs;
            if (kind == I8_MX) dm[r] = i8_block_scale(kind, blk);
            else memcpy(&d[r], blk, sizeof d[r]);
            if (i8_has_min(kind)) memcpy(&m[r], blk + sizeof d[r], sizeof m[r]);
            i8_block_neon(kind, blk, &w0[r], &w1[r]);
        }
        const float32x4_t dw = kind == I8_MX ? vld1q_f32(dm) : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(d)));
        const float32x4_t mw = i8_has_min(kind) ? vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(m))) : vdupq_n_f32(0.0f);
        int32x4_t isum[4];
#if defined(__ARM_FEATURE_MATMUL_INT8)
        if (RN % 2 == 0) {
            int8x16_t p01[4], p23[4];
            i8_pair_groups(w0[0], w1[0], w0[1], w1[1], p01);
            i8_pair_groups(w0[2], w1[2], w0[3], w1[3], p23);
            _Pragma("GCC unroll 2")
            for (int c = 0; c < RN; c += 2) {
                const int8_t *qc = a[c].q + b * I8_QK, *qd = a[c + 1].q + b * I8_QK;
                int8x16_t q[4];
                i8_pair_groups(vld1q_s8(qc), vld1q_s8(qc + 16), vld1q_s8(qd), vld1q_s8(qd + 16), q);
                const int32x4_t m01 = i8_mmla_block(p01, q), m23 = i8_mmla_block(p23, q);
                isum[c] = vuzp1q_s32(m01, m23);
                isum[c + 1] = vuzp2q_s32(m01, m23);
            }
        } else
#endif
        {
            _Pragma("GCC unroll 4")
            for (int c = 0; c < RN; c++) {
                const int8_t *q = a[c].q + b * I8_QK;
                const int8x16_t a0 = vld1q_s8(q), a1 = vld1q_s8(q + 16);
                int32x4_t p[4];
                _Pragma("GCC unroll 4")
                for (int r = 0; r < 4; r++) p[r] = i8_dot32_neon(w0[r], w1[r], a0, a1);
                isum[c] = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
            }
        }
        _Pragma("GCC unroll 4")
        for (int c = 0; c < RN; c++) {
            acc[c] = vfmaq_f32(acc[c], vcvtq_f32_s32(isum[c]), vmulq_n_f32(dw, a[c].d[b]));
            if (i8_has_min(kind)) acc[c] = vfmaq_f32(acc[c], vdupq_n_f32((float)a[c].s[b]), vmulq_n_f32(mw, a[c].d[b]));
        }
    }
    _Pragma("GCC unroll 4")
    for (int c = 0; c < RN; c++) vst1q_f32(out + c * 4, acc[c]);
}

/* one row, one column: dot_ref with the block's integers in registers */
static inline __attribute__((always_inline)) void i8_dot_neon(const int kind, int64_t k, float *out,
                                                              const void *w_row, const void *act) {
    const size_t bs = i8_block_bytes(kind);
    const int64_t nblk = k / I8_QK;
    const struct i8col a = i8col_at(act, k);
    float acc = 0.0f;
    for (int64_t b = 0; b < nblk; b++) {
        const char *blk = (const char *)w_row + (size_t)b * bs;
        int8x16_t w0, w1;
        i8_block_neon(kind, blk, &w0, &w1);
        const int8_t *q = a.q + b * I8_QK;
        const int32_t isum = vaddvq_s32(i8_dot32_neon(w0, w1, vld1q_s8(q), vld1q_s8(q + 16)));
        acc = fmaf((float)isum, i8_block_scale(kind, blk) * a.d[b], acc);
        if (i8_has_min(kind)) acc = fmaf((float)a.s[b], i8_block_min(blk) * a.d[b], acc);
    }
    *out = acc;
}

#define I8_NEON_TILE(name, kind, RN)                                                                            \
    static void qtile_##name##_4x##RN(int64_t k, const void *const *w, const void *const *a,                   \
                                      const void *const *n, float *out) {                                      \
        (void)n;                                                                                               \
        i8_tile4_neon(kind, RN, k, w, a, out);                                                                 \
    }
#define I8_NEON_DEFS(name, kind)                                                                                \
    static void dot_##name##_neon(int64_t k, float *s, const void *w, const void *a) {                         \
        i8_dot_neon(kind, k, s, w, a);                                                                         \
    }                                                                                                          \
    I8_NEON_TILE(name, kind, 1)                                                                                \
    I8_NEON_TILE(name, kind, 2)                                                                                \
    I8_NEON_TILE(name, kind, 4)
I8_NEON_DEFS(q8_0, I8_Q8)
I8_NEON_DEFS(q4_0, I8_Q4)
I8_NEON_DEFS(q4_1, I8_Q41)
I8_NEON_DEFS(q5_0, I8_Q5)
I8_NEON_DEFS(q5_1, I8_Q51)
I8_NEON_DEFS(iq4_nl, I8_NL)
I8_NEON_DEFS(mxfp4, I8_MX)

#define I8_TILES(name) {{4, 1, qtile_##name##_4x1}, {4, 2, qtile_##name##_4x2}, {4, 4, qtile_##name##_4x4}, {0, 0, NULL}}
#define I8_GEMM(name) 0, NULL, NULL, NULL
#define I8_QUANTIZE i8_quantize_ref
#define FAST(name) dot_##name##_neon
#define I8_REPACK(name) &rp_##name, NULL, NULL, 0 /* the layout, no kernels: not used */
#else
#define I8_TILES(name) {{0, 0, NULL}}
#define I8_GEMM(name) 0, NULL, NULL, NULL
#define I8_QUANTIZE i8_quantize_ref
#define FAST(name) dot_##name##_ref
#define I8_REPACK(name) &rp_##name, NULL, NULL, 0 /* the layout, no kernels: not used */
#endif
#ifndef W_TILES /* the other types as Q8_0 and Q4_0 (x86 has their kernels above) */
#define W_TILES(name) I8_TILES(name)
#define W_GEMM(name) I8_GEMM(name)
#define W_FAST(name) FAST(name)
#define W_REPACK(name) I8_REPACK(name)
#endif

/* the activation columns of the types but Q8_0 and Q4_0: the same q and s,
 * d rounded to fp16 as ggml's block_q8_0 keeps it, so that the products are
 * llama.cpp's (whose dots of these types take Q8_0 or Q8_1 columns, the
 * same q and d) to the float order */
static void i8_round_d16(void *y, int64_t k) {
    float *d = (float *)((char *)y + (size_t)(k / I8_QK) * I8_QK);
    for (int64_t b = 0; b < k / I8_QK; b++) d[b] = bt_fp16_to_fp32(bt_fp32_to_fp16(d[b]));
}
static void d16_quantize_ref(const float *x, void *y, int64_t k) {
    i8_quantize_ref(x, y, k);
    i8_round_d16(y, k);
}
static void d16_quantize(const float *x, void *y, int64_t k) {
    I8_QUANTIZE(x, y, k);
    i8_round_d16(y, k);
}

/* ---- qtypes.h entries ------------------------------------------------------------- */

#define I8_QTYPE(name, act_name, quant, quant_ref, fast, tiles, gemm, rp)         \
    const struct bt_cpu_qtype bt_cpu_qtype_##name = {                             \
        /* .act_name         = */ act_name,                                       \
        /* .act_size         = */ i8_act_size,                                    \
        /* .quantize_act     = */ quant,                                          \
        /* .vec_dot          = */ fast,                                           \
        /* .tiles            = */ tiles,                                          \
        /* .gemm_min_cols, .panel_size, .pack, .gemm = */ gemm,                   \
        /* .rp, .rgemm, .rpack, .rpack_min_cols = */ rp,                          \
        /* .quantize_act_ref = */ quant_ref,                                      \
        /* .vec_dot_ref      = */ dot_##name##_ref,                               \
    }
#define I8_ACT "int8 blocks of 32, float scale, block sums"
I8_QTYPE(q8_0, I8_ACT, I8_QUANTIZE, i8_quantize_ref, FAST(q8_0), I8_TILES(q8_0), I8_GEMM(q8_0), I8_REPACK(q8_0));
I8_QTYPE(q4_0, I8_ACT, I8_QUANTIZE, i8_quantize_ref, FAST(q4_0), I8_TILES(q4_0), I8_GEMM(q4_0), I8_REPACK(q4_0));
#define D16_ACT "int8 blocks of 32, fp16-valued float scale, block sums"
I8_QTYPE(q4_1, D16_ACT, d16_quantize, d16_quantize_ref, W_FAST(q4_1), W_TILES(q4_1), W_GEMM(q4_1), W_REPACK(q4_1));
I8_QTYPE(q5_0, D16_ACT, d16_quantize, d16_quantize_ref, W_FAST(q5_0), W_TILES(q5_0), W_GEMM(q5_0), W_REPACK(q5_0));
I8_QTYPE(q5_1, D16_ACT, d16_quantize, d16_quantize_ref, W_FAST(q5_1), W_TILES(q5_1), W_GEMM(q5_1), W_REPACK(q5_1));
I8_QTYPE(iq4_nl, D16_ACT, d16_quantize, d16_quantize_ref, W_FAST(iq4_nl), W_TILES(iq4_nl), W_GEMM(iq4_nl),
         W_REPACK(iq4_nl));
I8_QTYPE(mxfp4, D16_ACT, d16_quantize, d16_quantize_ref, W_FAST(mxfp4), W_TILES(mxfp4), W_GEMM(mxfp4),
         W_REPACK(mxfp4));
