/* matmul.c - MUL_MAT and MUL_MAT_ID on the CPU.
 *
 *   a [k, m, a2, a3] weights (F32, F16, BF16, Q8_0, Q4_0; contiguous rows)
 *   b [k, n, b2, b3] F32 activations (nb[0] == 4, any other strides)
 *   d [m, n, b2, b3] F32:  d[i, j] = dot(a row i, b column j)
 *
 * Work is described as "jobs": one weight matrix (m rows) times a list of
 * columns of b, written to a list of columns of d.  MUL_MAT has one job per
 * batch (i2, i3); MUL_MAT_ID one job per used expert, whose columns are the
 * (slot, token) pairs that chose it, so an expert's weights are read once.
 *
 * Threads split the rows of the jobs (output elements), never a dot
 * product's k-reduction.  Every output element's sum over k is accumulated in
 * an order that depends only on k and on the path the job takes (chosen from
 * its column count), never on (ith, nth) or on where the element sits in a
 * tile, so results are bitwise equal for any thread count:
 *
 *  - dot path (few columns: decode): vector lane l of two accumulators per
 *    element takes k = l, l+VL, ... in order (vectors alternate between the
 *    two), then acc0 + acc1 and a fixed horizontal sum.  Weights are
 *    dequantised in registers and FMA'd with the F32 activations.  Q8_0 and
 *    Q4_0 weights on AVX-512 VNNI or AVX2 instead take the int8 dot path (as
 *    ggml): the activation columns are quantised to int8 blocks once per job,
 *    each block's dot is an exact integer, and lane l of one accumulator takes
 *    float(int_l) * d_w * d_a block by block (see dot_tile_i8).
 *  - GEMM path (many columns: prompt): a register-blocked outer-product
 *    micro-kernel (MR rows x NR columns of accumulators); each element is a
 *    scalar FMA chain over k in increasing order.  k is blocked by KC, and a
 *    block continues from the value the previous block stored in d, which
 *    leaves that order unchanged.  Weight rows are converted to F32 into the
 *    thread's slice of the work buffer (a packed panel) once per k block and
 *    reused for all columns.
 *  - reference path (p->reference): the plain triple loop.
 */
#include "cpu_impl.h"

#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* ---- vectors: AVX-512, AVX2+FMA, or plain C (always correct) ---------------- */

#if defined(__AVX512F__)
#define VL 16
#define MR 32 /* GEMM micro-kernel rows (2 vectors) */
#define NR 12 /* GEMM micro-kernel columns */
typedef __m512 vf;
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline float vf_hsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline vf vf_load_n(const float *p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vf_store_n(float *p, vf v, int n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
}
static inline vf vf_load_f16(const bt_fp16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline vf vf_load_bf16(const bt_bf16_t *p) {
    __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
/* 16 int8 -> float */
static inline vf vf_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* 16 nibbles (low or high halves of 16 bytes) minus 8 -> float.  vpermps
 * reads only the low 4 bits of each index, so a table lookup of q - 8 needs
 * no mask, subtraction or int->float conversion. */
static inline vf vf_load_q4(const uint8_t *p, int hi) {
    const __m512 table = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f,
                                        0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
    __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    if (hi) x = _mm512_srli_epi32(x, 4);
    return _mm512_permutexvar_ps(x, table);
}
/* The fp16 scales of n (<= 16) consecutive blocks of bs bytes -> float. */
static inline void block_scales(const char *blk0, int bs, int n, float *out) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                             12, 13, 14, 15),
                                           _mm512_set1_epi32(bs));
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    /* 4 bytes at each block's start: d then the first quants; keep d */
    const __m512i w = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, blk0, 1);
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w)));
}
#define HAVE_BLOCK_SCALES 1
#if defined(__AVX512BW__)
/* The scales of 16 whole Q4_0 blocks (288 bytes from blk0): scale i is u16
 * number 9*i.  Two 128-byte windows, each holding 8 scales, are picked out
 * with vpermt2w; no load reaches past the 16 blocks.  Cheaper than a gather. */
static inline void q4_scales16(const char *blk0, float *out) {
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         63 - 0, 54, 45, 36, 27, 18, 9, 0, 63, 54, 45, 36, 27, 18, 9,
                                         0);
    /* window 1 starts at u16 72 (block 8), window 0 at u16 0 (block 0) */
    const __m512i w0 = _mm512_permutex2var_epi16(_mm512_loadu_si512(blk0), idx,
                                                 _mm512_loadu_si512(blk0 + 64));
    const __m512i w1 = _mm512_permutex2var_epi16(_mm512_loadu_si512(blk0 + 144), idx,
                                                 _mm512_loadu_si512(blk0 + 208));
    const __m512i both = _mm512_mask_mov_epi16(w0, (__mmask32)0xff00u, w1);
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm512_castsi512_si256(both)));
}
#define HAVE_Q4_SCALES16 1
/* The same for 16 whole Q8_0 blocks (544 bytes): scale i is u16 number 17*i;
 * four 128-byte windows of 4 scales each. */
static inline void q8_scales16(const char *blk0, float *out) {
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 51, 34,
                                         17, 0, 51, 34, 17, 0, 51, 34, 17, 0, 51, 34, 17, 0);
    __m512i res = _mm512_permutex2var_epi16(_mm512_loadu_si512(blk0), idx,
                                            _mm512_loadu_si512(blk0 + 64));
    for (int w = 1; w < 4; w++) {
        const char *p = blk0 + 136 * w; /* block 4w */
        const __m512i x = _mm512_permutex2var_epi16(_mm512_loadu_si512(p), idx,
                                                    _mm512_loadu_si512(p + 64));
        res = _mm512_mask_mov_epi16(res, (__mmask32)(0xfu << (4 * w)), x);
    }
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm512_castsi512_si256(res)));
}
#endif
#if defined(__F16C__)
static inline float fp16_scalar(bt_fp16_t h) { return _cvtsh_ss(h); }
#else
static inline float fp16_scalar(bt_fp16_t h) { return bt_fp16_to_fp32(h); }
#endif

#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
#define MR 16
#define NR 6
typedef __m256 vf;
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline float vf_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline __m256i lane_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load_n(const float *p, int n) { return _mm256_maskload_ps(p, lane_mask(n)); }
static inline void vf_store_n(float *p, vf v, int n) { _mm256_maskstore_ps(p, lane_mask(n), v); }
#if defined(__F16C__)
static inline vf vf_load_f16(const bt_fp16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline float fp16_scalar(bt_fp16_t h) { return _cvtsh_ss(h); }
#else
static inline vf vf_load_f16(const bt_fp16_t *p) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = bt_fp16_to_fp32(p[i]);
    return _mm256_loadu_ps(t);
}
static inline float fp16_scalar(bt_fp16_t h) { return bt_fp16_to_fp32(h); }
#endif
static inline vf vf_load_bf16(const bt_bf16_t *p) {
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}
static inline vf vf_load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline vf vf_load_q4(const uint8_t *p, int hi) {
    __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    if (hi) x = _mm256_srli_epi32(x, 4);
    x = _mm256_sub_epi32(_mm256_and_si256(x, _mm256_set1_epi32(15)), _mm256_set1_epi32(8));
    return _mm256_cvtepi32_ps(x);
}

#else /* plain C: a "vector" of 8 floats the compiler may vectorise */
#define VL 8
#define MR 16
#define NR 4
typedef struct {
    float v[VL];
} vf;
static inline vf vf_zero(void) {
    vf r;
    for (int i = 0; i < VL; i++) r.v[i] = 0.0f;
    return r;
}
static inline vf vf_load(const float *p) {
    vf r;
    memcpy(r.v, p, sizeof(r.v));
    return r;
}
static inline void vf_store(float *p, vf v) { memcpy(p, v.v, sizeof(v.v)); }
static inline vf vf_set1(float x) {
    vf r;
    for (int i = 0; i < VL; i++) r.v[i] = x;
    return r;
}
static inline vf vf_fma(vf a, vf b, vf c) {
    for (int i = 0; i < VL; i++) c.v[i] += a.v[i] * b.v[i];
    return c;
}
static inline vf vf_add(vf a, vf b) {
    for (int i = 0; i < VL; i++) a.v[i] += b.v[i];
    return a;
}
static inline vf vf_mul(vf a, vf b) {
    for (int i = 0; i < VL; i++) a.v[i] *= b.v[i];
    return a;
}
static inline float vf_hsum(vf v) {
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v.v[i];
    return s;
}
static inline vf vf_load_n(const float *p, int n) {
    vf r = vf_zero();
    for (int i = 0; i < n; i++) r.v[i] = p[i];
    return r;
}
static inline void vf_store_n(float *p, vf v, int n) {
    for (int i = 0; i < n; i++) p[i] = v.v[i];
}
static inline vf vf_load_f16(const bt_fp16_t *p) {
    vf r;
    for (int i = 0; i < VL; i++) r.v[i] = bt_fp16_to_fp32(p[i]);
    return r;
}
static inline vf vf_load_bf16(const bt_bf16_t *p) {
    vf r;
    for (int i = 0; i < VL; i++) r.v[i] = bt_bf16_to_fp32(p[i]);
    return r;
}
static inline vf vf_load_i8(const int8_t *p) {
    vf r;
    for (int i = 0; i < VL; i++) r.v[i] = (float)p[i];
    return r;
}
static inline vf vf_load_q4(const uint8_t *p, int hi) {
    vf r;
    for (int i = 0; i < VL; i++) r.v[i] = (float)(((hi ? p[i] >> 4 : p[i]) & 15) - 8);
    return r;
}
static inline float fp16_scalar(bt_fp16_t h) { return bt_fp16_to_fp32(h); }
#endif

#ifndef HAVE_BLOCK_SCALES
static inline void block_scales(const char *blk0, int bs, int n, float *out) {
    for (int i = 0; i < n; i++) {
        bt_fp16_t h;
        memcpy(&h, blk0 + (size_t)i * (size_t)bs, sizeof(h));
        out[i] = fp16_scalar(h);
    }
}
#endif

#define QB 32         /* elements per "block": a Q8_0 / Q4_0 block, 32 floats otherwise */
#define NV (QB / VL)  /* vectors per block */

#ifndef BT_MM_KC
#define BT_MM_KC 256 /* k block of the GEMM path (a multiple of QB) */
#endif
#ifndef BT_MM_MC
#define BT_MM_MC 128 /* rows of weights packed at once (a multiple of MR) */
#endif
#ifndef BT_MM_NC
#define BT_MM_NC (64 * NR) /* columns of activations packed at once */
#endif
#ifndef BT_MM_GEMM_MIN_COLS
#define BT_MM_GEMM_MIN_COLS 8 /* jobs with at least this many columns take the GEMM path */
#endif
#define UNIT_ROWS 32 /* rows per unit of work handed to threads (a multiple of MR) */
#define DOT_RB 16    /* rows kept hot while the dot path walks column groups */

_Static_assert(BT_MM_KC % QB == 0, "BT_MM_KC must be a multiple of 32");
_Static_assert(BT_MM_MC % MR == 0, "BT_MM_MC must be a multiple of MR");
_Static_assert(BT_MM_NC % NR == 0, "BT_MM_NC must be a multiple of NR");
_Static_assert(UNIT_ROWS % MR == 0, "UNIT_ROWS must be a multiple of MR");

#define ALIGN_UP(x) (((x) + (size_t)BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN)

/* One vector (elements [v*VL, v*VL+VL)) of block `blk` of a weight row,
 * dequantised exactly as bt_row_to_f32 does (x = d * q in float). */
static inline __attribute__((always_inline)) vf load_a(enum bt_type type, const char *row,
                                                        int64_t blk, int v) {
    switch (type) {
    case BT_TYPE_F32: return vf_load((const float *)row + blk * QB + v * VL);
    case BT_TYPE_F16: return vf_load_f16((const bt_fp16_t *)row + blk * QB + v * VL);
    case BT_TYPE_BF16: return vf_load_bf16((const bt_bf16_t *)row + blk * QB + v * VL);
    case BT_TYPE_Q8_0: {
        const bt_block_q8_0 *b = (const bt_block_q8_0 *)row + blk;
        return vf_mul(vf_load_i8(b->qs + v * VL), vf_set1(fp16_scalar(b->d)));
    }
    case BT_TYPE_Q4_0: {
        const bt_block_q4_0 *b = (const bt_block_q4_0 *)row + blk;
        return vf_mul(vf_load_q4(b->qs + (v * VL) % 16, (v * VL) / 16), vf_set1(fp16_scalar(b->d)));
    }
    default: BT_ASSERT(0 && "unsupported weight type"); return vf_zero();
    }
}

/* Convert elements [k0, k0+n) of a weight row to F32 (k0 a multiple of QB;
 * n a multiple of QB for block types). */
static void row_to_f32(enum bt_type type, const char *row, int64_t k0, int64_t n, float *dst) {
    if (type == BT_TYPE_F32) {
        memcpy(dst, (const float *)row + k0, (size_t)n * sizeof(float));
        return;
    }
    const int64_t nfull = n / QB;
    const int64_t b0 = k0 / QB;
    switch (type) {
#define CONV_CASE(T)                                                   \
    case T:                                                            \
        for (int64_t b = 0; b < nfull; b++)                            \
            for (int v = 0; v < NV; v++)                               \
                vf_store(dst + b * QB + v * VL, load_a(T, row, b0 + b, v)); \
        break;
        CONV_CASE(BT_TYPE_F16)
        CONV_CASE(BT_TYPE_BF16)
        CONV_CASE(BT_TYPE_Q8_0)
        CONV_CASE(BT_TYPE_Q4_0)
#undef CONV_CASE
    default: BT_ASSERT(0 && "unsupported weight type");
    }
    const int64_t rest = n - nfull * QB; /* F16 / BF16 tail */
    if (rest > 0) {
        const int64_t e0 = k0 + nfull * QB;
        float *out = dst + nfull * QB;
        for (int64_t i = 0; i < rest; i++)
            out[i] = type == BT_TYPE_F16 ? bt_fp16_to_fp32(((const bt_fp16_t *)row)[e0 + i])
                                         : bt_bf16_to_fp32(((const bt_bf16_t *)row)[e0 + i]);
    }
}

/* ---- dot path: RM weight rows x RN columns, whole k ------------------------- */

/* Raw quants of vector v of block blk as float: q (Q8_0) or q - 8 (Q4_0). */
#if defined(__AVX512F__)
/* Q4_0 on AVX-512: the block's 16 bytes are broadcast to the four 128-bit
 * lanes (a load, no shuffle), a per-lane shift brings byte 4*(j%4) + j/4 to
 * the bottom of lane j, and vpermps looks its low nibble up in a table of
 * d * (q - 8) (vpermps reads only the low 4 bits of an index).  So lane j
 * holds element q4_perm(j) (+16 for the high nibbles), dequantised exactly
 * as bt_row_to_f32 does; the dot path pairs it with activations permuted the
 * same way (run_dot). */
#define Q4_PERMUTED 1
static inline int q4_perm(int j) { return 4 * (j % 4) + j / 4; }
static inline vf q4_table(float d) {
    const __m512 q = _mm512_setr_ps(-8.0f, -7.0f, -6.0f, -5.0f, -4.0f, -3.0f, -2.0f, -1.0f, 0.0f,
                                    1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f);
    return _mm512_mul_ps(q, _mm512_set1_ps(d));
}
static inline vf load_q4_perm(const uint8_t *qs, int hi, vf table) {
    const __m512i sh = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
    const __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qs));
    const __m512i x = _mm512_srlv_epi32(w, hi ? _mm512_add_epi32(sh, _mm512_set1_epi32(4)) : sh);
    return _mm512_permutexvar_ps(x, table);
}
#else
#define Q4_PERMUTED 0
#endif

#define DOT_SCALES 16 /* block scales converted at once */
#ifndef BT_MM_PREFETCH
#define BT_MM_PREFETCH 2 /* dot path: prefetch distance in chunks of DOT_SCALES blocks */
#endif

/* out[j*RM + r] = dot(arows[r], bcols[j]) over k.  F32, F16, BF16 and Q4_0
 * are dequantised exactly (x = d * q as bt_row_to_f32), then per element: two
 * vector accumulators, block vector v into acc[v & 1] in block order, then
 * acc0 + acc1 and a fixed horizontal sum.  Q8_0 (one multiply fewer per
 * block): acc0 += d * (q_0 * b_0 + q_1 * b_1) per block.  The order depends
 * only on k. */
static inline __attribute__((always_inline)) void dot_tile(enum bt_type type, const int RM,
                                                            const int RN, int64_t k,
                                                            const char *const *arows,
                                                            const float *const *bcols, float *out) {
    const bool quant = type == BT_TYPE_Q8_0 || type == BT_TYPE_Q4_0;
    const int bs = type == BT_TYPE_Q8_0 ? (int)sizeof(bt_block_q8_0) : (int)sizeof(bt_block_q4_0);
    const int blk_bytes = quant ? bs : QB * (type == BT_TYPE_F32 ? 4 : 2); /* bytes per block of a row */
    const int64_t nblk = k / QB;
    vf acc[4][4][2];
    for (int r = 0; r < RM; r++)
        for (int j = 0; j < RN; j++) acc[r][j][0] = acc[r][j][1] = vf_zero();

    for (int64_t c0 = 0; c0 < nblk; c0 += DOT_SCALES) {
        const int nc = (int)(nblk - c0 < DOT_SCALES ? nblk - c0 : DOT_SCALES);
        float dq[4][DOT_SCALES];
#if defined(HAVE_Q4_SCALES16)
        if (type == BT_TYPE_Q4_0 && nc == DOT_SCALES)
            for (int r = 0; r < RM; r++) q4_scales16(arows[r] + (size_t)c0 * (size_t)bs, dq[r]);
        else if (type == BT_TYPE_Q8_0 && nc == DOT_SCALES)
            for (int r = 0; r < RM; r++) q8_scales16(arows[r] + (size_t)c0 * (size_t)bs, dq[r]);
        else
#endif
        if (quant)
            for (int r = 0; r < RM; r++) block_scales(arows[r] + (size_t)c0 * (size_t)bs, bs, nc, dq[r]);
#if defined(__AVX512F__) || defined(__AVX2__)
        /* the hardware prefetcher alone leaves these few row streams waiting
         * on memory: ask for the chunk BT_MM_PREFETCH chunks ahead */
        if (c0 + (BT_MM_PREFETCH + 1) * DOT_SCALES <= nblk)
            for (int r = 0; r < RM; r++)
                for (int o = 0; o < DOT_SCALES * blk_bytes; o += 64)
                    _mm_prefetch(arows[r] + (size_t)(c0 + BT_MM_PREFETCH * DOT_SCALES) * (size_t)blk_bytes + o,
                                 _MM_HINT_T0);
#else
        (void)blk_bytes;
#endif
        for (int i = 0; i < nc; i++) {
            const int64_t blk = c0 + i;
            vf a[4][NV];
            for (int r = 0; r < RM; r++) {
                if (type == BT_TYPE_Q8_0) { /* raw q; d is applied per block below */
                    const int8_t *qs = ((const bt_block_q8_0 *)arows[r])[blk].qs;
                    for (int v = 0; v < NV; v++) a[r][v] = vf_load_i8(qs + v * VL);
                } else if (type == BT_TYPE_Q4_0) {
                    const uint8_t *qs = ((const bt_block_q4_0 *)arows[r])[blk].qs;
#if Q4_PERMUTED
                    const vf table = q4_table(dq[r][i]);
                    for (int v = 0; v < NV; v++) a[r][v] = load_q4_perm(qs, v, table);
#else
                    const vf d = vf_set1(dq[r][i]);
                    for (int v = 0; v < NV; v++)
                        a[r][v] = vf_mul(vf_load_q4(qs + (v * VL) % 16, (v * VL) / 16), d);
#endif
                } else {
                    for (int v = 0; v < NV; v++) a[r][v] = load_a(type, arows[r], blk, v);
                }
            }
            if (type == BT_TYPE_Q8_0) {
                /* acc0 += d * sum_v q_v * b_v: one multiply by d per block
                 * instead of one per vector (acc1 stays zero) */
                for (int j = 0; j < RN; j++) {
                    vf bv[NV];
                    for (int v = 0; v < NV; v++) bv[v] = vf_load(bcols[j] + blk * QB + v * VL);
                    for (int r = 0; r < RM; r++) {
                        vf sum = vf_mul(a[r][0], bv[0]);
                        for (int v = 1; v < NV; v++) sum = vf_fma(a[r][v], bv[v], sum);
                        acc[r][j][0] = vf_fma(sum, vf_set1(dq[r][i]), acc[r][j][0]);
                    }
                }
                continue;
            }
            for (int j = 0; j < RN; j++) {
                for (int v = 0; v < NV; v++) {
                    const vf bv = vf_load(bcols[j] + blk * QB + v * VL);
                    for (int r = 0; r < RM; r++)
                        acc[r][j][v & 1] = vf_fma(a[r][v], bv, acc[r][j][v & 1]);
                }
            }
        }
    }
    const int rest = (int)(k - nblk * QB); /* float types only: a zero-padded last block */
    if (rest > 0) {
        float at[4][QB], bt[4][QB];
        for (int r = 0; r < RM; r++) {
            row_to_f32(type, arows[r], nblk * QB, rest, at[r]);
            memset(at[r] + rest, 0, sizeof(float) * (size_t)(QB - rest));
        }
        for (int j = 0; j < RN; j++) {
            memcpy(bt[j], bcols[j] + nblk * QB, sizeof(float) * (size_t)rest);
            memset(bt[j] + rest, 0, sizeof(float) * (size_t)(QB - rest));
        }
        for (int j = 0; j < RN; j++)
            for (int v = 0; v < NV; v++) {
                const vf bv = vf_load(bt[j] + v * VL);
                for (int r = 0; r < RM; r++)
                    acc[r][j][v & 1] = vf_fma(vf_load(at[r] + v * VL), bv, acc[r][j][v & 1]);
            }
    }
    for (int j = 0; j < RN; j++)
        for (int r = 0; r < RM; r++) out[j * RM + r] = vf_hsum(vf_add(acc[r][j][0], acc[r][j][1]));
}

typedef void (*dot_fn)(int64_t k, const char *const *arows, const float *const *bcols, float *out);

#define DEF_DOT(T, RM, RN)                                                                     \
    static void dot_##T##_##RM##x##RN(int64_t k, const char *const *arows,                    \
                                      const float *const *bcols, float *out) {                \
        dot_tile(BT_TYPE_##T, RM, RN, k, arows, bcols, out);                                   \
    }
#define DEF_DOTS(T) DEF_DOT(T, 4, 1) DEF_DOT(T, 4, 2) DEF_DOT(T, 2, 4)
DEF_DOTS(F32)
DEF_DOTS(F16)
DEF_DOTS(BF16)
DEF_DOTS(Q8_0)
DEF_DOTS(Q4_0)

/* tile shapes: [0] 4x1, [1] 4x2, [2] 2x4 */
static const int dot_rm[3] = {4, 4, 2};
static const int dot_rn[3] = {1, 2, 4};

static dot_fn dot_kernel(enum bt_type type, int shape) {
#define ROW(T) {dot_##T##_4x1, dot_##T##_4x2, dot_##T##_2x4}
    static const dot_fn table[BT_TYPE_COUNT][3] = {
        [BT_TYPE_F32] = ROW(F32),   [BT_TYPE_F16] = ROW(F16),   [BT_TYPE_BF16] = ROW(BF16),
        [BT_TYPE_Q8_0] = ROW(Q8_0), [BT_TYPE_Q4_0] = ROW(Q4_0),
    };
#undef ROW
    dot_fn f = table[type][shape];
    BT_ASSERT(f);
    return f;
}

/* ---- dot path, int8 variant for Q8_0 / Q4_0 weights (AVX-512 VNNI; AVX2) ---- *
 *
 * As ggml does: each activation column is quantised once per job to int8
 * blocks of 32 (d = max|x| / 127, q = roundf(x / d), exactly as
 * bt_row_from_f32(BT_TYPE_Q8_0) but with d kept in float), by every thread
 * that needs it, into its own slice, so the quantised values never depend on
 * the thread count.  A dot product is then, per block, an exact integer dot
 * (vpdpbusd: unsigned weight bytes x signed activation bytes; Q8_0 weights are
 * offset by 128 (xor 0x80), Q4_0 nibbles are 0..15, i.e. offset by 8; the
 * offset times the activations' sum is subtracted exactly in the integer
 * accumulator, which starts from a precomputed -offset * (sum of 4 bytes) per
 * lane).  Two blocks share a 512-bit vector; per pair and element, lane l
 * takes acc_l = fma(float(int_l), d_w * d_a, acc_l) in block order, then a
 * fixed horizontal sum: the order depends only on k.
 *
 * Activation column layout (pair p = blocks 2p, 2p+1; a missing last block
 * is zero):
 *   q   [npairs][64] int8   32-bit lane 2u + h: elements 4u .. 4u+3 of block
 *                           2p + h (u < 8), the lanes the weight loads below
 *                           produce; so lanes alternate between the two
 *                           blocks and the pair's scales are one 64-bit
 *                           broadcast
 *   nc  [npairs][16] int32  -offset * (sum of the lane's 4 q bytes)
 *   d   [nblk rounded up to 16] float, zero beyond nblk
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define HAVE_I8_DOT 1
#ifndef BT_MM_PREFETCH_I8
#define BT_MM_PREFETCH_I8 1536 /* int8 dot path: prefetch distance in bytes of a row */
#endif

struct qcol {
    const int8_t *q;
    const int32_t *nc;
    const float *d;
};

static size_t i8_col_bytes(int64_t k) {
    const int64_t nblk = k / QB, npairs = (nblk + 1) / 2, nd = (nblk + 15) / 16 * 16;
    return ALIGN_UP((size_t)npairs * 128 + (size_t)nd * sizeof(float));
}

/* roundf (half away from zero) of integer-range values, exactly */
static inline __m512 round_away(__m512 v) {
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(v, t); /* exact */
    const __mmask16 up = _mm512_cmp_ps_mask(f, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    const __mmask16 dn = _mm512_cmp_ps_mask(f, _mm512_set1_ps(-0.5f), _CMP_LE_OQ);
    t = _mm512_mask_add_ps(t, up, t, _mm512_set1_ps(1.0f));
    return _mm512_mask_sub_ps(t, dn, t, _mm512_set1_ps(1.0f));
}

static struct qcol quant_col(enum bt_type type, const float *x, int64_t k, char *buf) {
    const int64_t nblk = k / QB, npairs = (nblk + 1) / 2, nd = (nblk + 15) / 16 * 16;
    int8_t *q = (int8_t *)buf;
    int32_t *nc = (int32_t *)(buf + (size_t)npairs * 64);
    float *d = (float *)(buf + (size_t)npairs * 128);
    const bool q8 = type == BT_TYPE_Q8_0;
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nblk; b++) {
        const __m512 v0 = _mm512_loadu_ps(x + b * QB), v1 = _mm512_loadu_ps(x + b * QB + 16);
        const float amax = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_and_ps(v0, absmask), _mm512_and_ps(v1, absmask)));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        d[b] = dd;
        const __m512 vid = _mm512_set1_ps(id);
        const __m128i q0 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(round_away(_mm512_mul_ps(v0, vid))));
        const __m128i q1 = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(round_away(_mm512_mul_ps(v1, vid))));
        /* lanes 2u + h, u < 8: scatter the block's 8 dwords with stride 8 bytes */
        int32_t *dst = (int32_t *)(q + (b / 2) * 64) + (b % 2);
        int32_t tmp[8];
        _mm_storeu_si128((__m128i *)tmp, q0);
        _mm_storeu_si128((__m128i *)(tmp + 4), q1);
        for (int u = 0; u < 8; u++) dst[2 * u] = tmp[u];
    }
    if (nblk % 2) {
        int32_t *dst = (int32_t *)(q + (nblk / 2) * 64) + 1;
        for (int u = 0; u < 8; u++) dst[2 * u] = 0;
    }
    for (int64_t b = nblk; b < nd; b++) d[b] = 0.0f;
    const __m512i off = _mm512_set1_epi8(q8 ? (char)0x80 : 8);
    for (int64_t p = 0; p < npairs; p++) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), off,
                                              _mm512_loadu_si512(q + p * 64));
        _mm512_storeu_si512(nc + p * 16, _mm512_sub_epi32(_mm512_setzero_si512(), s));
    }
    return (struct qcol){q, nc, d};
}

static inline __attribute__((always_inline)) void dot_tile_i8(enum bt_type type, const int RM,
                                                               const int RN, int64_t k,
                                                               const char *const *arows,
                                                               const char *const *nrows,
                                                               const struct qcol *qc, float *out) {
    const bool q8 = type == BT_TYPE_Q8_0;
    const int bs = q8 ? (int)sizeof(bt_block_q8_0) : (int)sizeof(bt_block_q4_0);
    const int64_t nblk = k / QB;
    /* prefetch distance in blocks, a whole number of chunks */
    const int64_t pf_chunks = (BT_MM_PREFETCH_I8 / (DOT_SCALES * bs) + 1) * DOT_SCALES;
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    /* vpermt2d picks dword u of block 2p + h (h: second source) for lane 2u + h;
     * Q4_0: dwords 0..3 twice, the second time (qwords 4..7) for the high
     * nibbles */
    const __m512i pidx = q8 ? _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
                            : _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 0, 16, 1, 17, 2, 18, 3, 19);
#if defined(__GFNI__)
    /* per qword: the low nibble of each byte (qwords 0..3) or the high one
     * moved down (4..7), as one GF(2) affine map */
    const __m512i nib = _mm512_setr_epi64(0x0102040800000000LL, 0x0102040800000000LL,
                                          0x0102040800000000LL, 0x0102040800000000LL,
                                          0x1020408000000000LL, 0x1020408000000000LL,
                                          0x1020408000000000LL, 0x1020408000000000LL);
#else
    const __m512i m0f = _mm512_set1_epi8(0x0f);
    const __m512i sh = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
#endif
    __m512 acc[8][4];
    for (int r = 0; r < RM; r++)
        for (int j = 0; j < RN; j++) acc[r][j] = _mm512_setzero_ps();

    for (int64_t c0 = 0; c0 < nblk; c0 += DOT_SCALES) {
        const int nc = (int)(nblk - c0 < DOT_SCALES ? nblk - c0 : DOT_SCALES);
        float dq[8][DOT_SCALES];
        if (nc == DOT_SCALES) {
            if (q8)
                for (int r = 0; r < RM; r++) q8_scales16(arows[r] + (size_t)c0 * (size_t)bs, dq[r]);
            else
                for (int r = 0; r < RM; r++) q4_scales16(arows[r] + (size_t)c0 * (size_t)bs, dq[r]);
        } else {
            for (int r = 0; r < RM; r++) block_scales(arows[r] + (size_t)c0 * (size_t)bs, bs, nc, dq[r]);
        }
        /* prefetch about BT_MM_PREFETCH_I8 bytes ahead in each row (these
         * rows are short in bytes per block, so a distance in chunks as
         * dot_tile uses would leave too few lines in flight); near a row's
         * end, the start of the next tile's row (nrows, when there is one),
         * so that the next tile does not begin by waiting on memory */
        {
            const int64_t pos = c0 + pf_chunks;
            for (int r = 0; r < RM; r++) {
                const char *pa = pos + DOT_SCALES <= nblk ? arows[r] + (size_t)pos * (size_t)bs
                                 : nrows && pos - nblk + DOT_SCALES <= nblk
                                     ? nrows[r] + (size_t)(pos - nblk) * (size_t)bs
                                     : NULL;
                if (pa) /* to L2: measured a little faster here than to L1 */
                    for (int o = 0; o < DOT_SCALES * bs; o += 64) _mm_prefetch(pa + o, _MM_HINT_T1);
            }
        }
        /* d_w * d_a of the chunk's 16 blocks, read back a pair at a time */
        float sc[8][4][DOT_SCALES] __attribute__((aligned(64)));
        for (int r = 0; r < RM; r++) {
            const __m512 dw = _mm512_loadu_ps(dq[r]);
            for (int j = 0; j < RN; j++)
                _mm512_store_ps(sc[r][j], _mm512_mul_ps(dw, _mm512_loadu_ps(qc[j].d + c0)));
        }
        for (int i = 0; i < nc; i += 2) {
            const int64_t blk = c0 + i, pair = blk / 2;
            const bool two = i + 1 < nc;
            __m512i w[8];
            for (int r = 0; r < RM; r++) {
                if (q8) {
                    const int8_t *p0 = ((const bt_block_q8_0 *)arows[r])[blk].qs;
                    const __m512i x0 = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0));
                    const __m512i x1 =
                        two ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + bs))) : x0;
                    w[r] = _mm512_xor_si512(_mm512_permutex2var_epi32(x0, pidx, x1), x80);
                } else {
                    const uint8_t *p0 = ((const bt_block_q4_0 *)arows[r])[blk].qs;
                    const __m512i x0 = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p0));
                    const __m512i x1 =
                        two ? _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p0 + bs))) : x0;
                    const __m512i x = _mm512_permutex2var_epi32(x0, pidx, x1);
#if defined(__GFNI__)
                    w[r] = _mm512_gf2p8affine_epi64_epi8(x, nib, 0);
#else
                    w[r] = _mm512_and_si512(_mm512_srlv_epi64(x, sh), m0f);
#endif
                }
            }
            for (int j = 0; j < RN; j++) {
                const __m512i a = _mm512_loadu_si512(qc[j].q + pair * 64);
                const __m512i n = _mm512_loadu_si512(qc[j].nc + pair * 16);
                for (int r = 0; r < RM; r++) {
                    const __m512i dot = _mm512_dpbusd_epi32(n, w[r], a);
                    double s2;
                    memcpy(&s2, &sc[r][j][i], sizeof(s2));
                    const __m512 scale = _mm512_castpd_ps(_mm512_set1_pd(s2));
                    acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r][j]);
                }
            }
        }
    }
    for (int j = 0; j < RN; j++)
        for (int r = 0; r < RM; r++) out[j * RM + r] = _mm512_reduce_add_ps(acc[r][j]);
}

#elif defined(__AVX2__) && defined(__FMA__)
/* AVX2: one block per 256-bit vector, activations in natural order; the
 * integer dot takes ggml's sign trick: vpmaddubsw(|w|, a * sign(w)) (no
 * saturation: 2 * 128 * 127 < 32768), then vpmaddwd with ones; Q4_0 as
 * q - 8.  Per block acc = fma(float(int lanes), d_w * d_a, acc), in block
 * order, then a fixed horizontal sum. */
#define HAVE_I8_DOT 1

struct qcol {
    const int8_t *q;
    const float *d;
};

static size_t i8_col_bytes(int64_t k) {
    const int64_t nblk = k / QB;
    return ALIGN_UP((size_t)nblk * QB + (size_t)(nblk + 15) / 16 * 16 * sizeof(float));
}

static inline __m256 round_away(__m256 v) {
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(v, t); /* exact */
    const __m256 one = _mm256_set1_ps(1.0f);
    t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(0.5f), _CMP_GE_OQ), one));
    return _mm256_sub_ps(t, _mm256_and_ps(_mm256_cmp_ps(f, _mm256_set1_ps(-0.5f), _CMP_LE_OQ), one));
}

static struct qcol quant_col(enum bt_type type, const float *x, int64_t k, char *buf) {
    (void)type;
    const int64_t nblk = k / QB, nd = (nblk + 15) / 16 * 16;
    int8_t *q = (int8_t *)buf;
    float *d = (float *)(buf + (size_t)nblk * QB);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nblk; b++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + b * QB + 8 * i);
            m = _mm256_max_ps(m, _mm256_and_ps(v[i], absmask));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float dd = _mm_cvtss_f32(h) / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        d[b] = dd;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i qi[4];
        for (int i = 0; i < 4; i++) qi[i] = _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v[i], vid)));
        /* 32 int32 -> 32 int8 in order */
        const __m256i w01 = _mm256_packs_epi32(qi[0], qi[1]), w23 = _mm256_packs_epi32(qi[2], qi[3]);
        const __m256i bb = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23),
                                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + b * QB), bb);
    }
    for (int64_t b = nblk; b < nd; b++) d[b] = 0.0f;
    return (struct qcol){q, d};
}

static inline __attribute__((always_inline)) void dot_tile_i8(enum bt_type type, const int RM,
                                                               const int RN, int64_t k,
                                                               const char *const *arows,
                                                               const char *const *nrows,
                                                               const struct qcol *qc, float *out) {
    (void)nrows;
    const bool q8 = type == BT_TYPE_Q8_0;
    const int bs = q8 ? (int)sizeof(bt_block_q8_0) : (int)sizeof(bt_block_q4_0);
    const int64_t nblk = k / QB;
    const __m256i m0f = _mm256_set1_epi8(0x0f), c8 = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[8][4];
    for (int r = 0; r < RM; r++)
        for (int j = 0; j < RN; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < nblk; c0 += DOT_SCALES) {
        const int nc = (int)(nblk - c0 < DOT_SCALES ? nblk - c0 : DOT_SCALES);
        float dq[8][DOT_SCALES] = {{0}};
        for (int r = 0; r < RM; r++) block_scales(arows[r] + (size_t)c0 * (size_t)bs, bs, nc, dq[r]);
        if (c0 + (BT_MM_PREFETCH + 1) * DOT_SCALES <= nblk)
            for (int r = 0; r < RM; r++)
                for (int o = 0; o < DOT_SCALES * bs; o += 64)
                    _mm_prefetch(arows[r] + (size_t)(c0 + BT_MM_PREFETCH * DOT_SCALES) * (size_t)bs + o,
                                 _MM_HINT_T0);
        float sc[8][4][DOT_SCALES]; /* d_w * d_a */
        for (int r = 0; r < RM; r++)
            for (int j = 0; j < RN; j++)
                for (int h = 0; h < DOT_SCALES; h += 8)
                    _mm256_storeu_ps(sc[r][j] + h, _mm256_mul_ps(_mm256_loadu_ps(dq[r] + h),
                                                                 _mm256_loadu_ps(qc[j].d + c0 + h)));
        for (int i = 0; i < nc; i++) {
            const int64_t blk = c0 + i;
            __m256i aw[8], sw[8]; /* |w| and its sign source */
            for (int r = 0; r < RM; r++) {
                __m256i w;
                if (q8) {
                    w = _mm256_loadu_si256((const __m256i *)((const bt_block_q8_0 *)arows[r])[blk].qs);
                } else {
                    const __m128i x = _mm_loadu_si128((const __m128i *)((const bt_block_q4_0 *)arows[r])[blk].qs);
                    w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), m0f);
                    w = _mm256_sub_epi8(w, c8);
                }
                aw[r] = _mm256_sign_epi8(w, w);
                sw[r] = w;
            }
            for (int j = 0; j < RN; j++) {
                const __m256i a = _mm256_loadu_si256((const __m256i *)(qc[j].q + blk * QB));
                for (int r = 0; r < RM; r++) {
                    const __m256i p16 = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(a, sw[r]));
                    const __m256i dot = _mm256_madd_epi16(p16, ones);
                    acc[r][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(sc[r][j][i]),
                                                acc[r][j]);
                }
            }
        }
    }
    for (int j = 0; j < RN; j++)
        for (int r = 0; r < RM; r++) out[j * RM + r] = vf_hsum(acc[r][j]);
}
#else
#define HAVE_I8_DOT 0
#endif

#if HAVE_I8_DOT
typedef void (*dot_i8_fn)(int64_t k, const char *const *arows, const char *const *nrows,
                          const struct qcol *qc, float *out);

#define DEF_DOT_I8(T, RM, RN)                                                                  \
    static void dot_i8_##T##_##RM##x##RN(int64_t k, const char *const *arows,                \
                                         const char *const *nrows, const struct qcol *qc,    \
                                         float *out) {                                       \
        dot_tile_i8(BT_TYPE_##T, RM, RN, k, arows, nrows, qc, out);                            \
    }
DEF_DOT_I8(Q8_0, 4, 1) DEF_DOT_I8(Q8_0, 4, 2) DEF_DOT_I8(Q8_0, 2, 4) DEF_DOT_I8(Q8_0, 8, 1)
DEF_DOT_I8(Q4_0, 4, 1) DEF_DOT_I8(Q4_0, 4, 2) DEF_DOT_I8(Q4_0, 2, 4) DEF_DOT_I8(Q4_0, 8, 1)

static dot_i8_fn dot_i8_kernel(enum bt_type type, int shape) {
    static const dot_i8_fn q8[4] = {dot_i8_Q8_0_4x1, dot_i8_Q8_0_4x2, dot_i8_Q8_0_2x4,
                                    dot_i8_Q8_0_8x1};
    static const dot_i8_fn q4[4] = {dot_i8_Q4_0_4x1, dot_i8_Q4_0_4x2, dot_i8_Q4_0_2x4,
                                    dot_i8_Q4_0_8x1};
    return type == BT_TYPE_Q8_0 ? q8[shape] : q4[shape];
}
#endif

/* ---- GEMM path -------------------------------------------------------------- */

/* d[row .. row+mr) of columns dcols[0 .. nr) (+)= A panel x B panel over kc.
 * ap: kc x MR (row index fastest), bp: kc x NR (column index fastest). */
static void gemm_ukernel(int64_t kc, const float *restrict ap, const float *restrict bp,
                         float *const *dcols, int64_t row, int mr, int nr, bool first) {
    vf c0[NR], c1[NR];
    const int n0 = mr < VL ? mr : VL;
    const int n1 = mr > VL ? mr - VL : 0;
#pragma GCC unroll 16
    for (int j = 0; j < NR; j++) {
        if (first || j >= nr) {
            c0[j] = vf_zero();
            c1[j] = vf_zero();
        } else if (mr == MR) {
            c0[j] = vf_load(dcols[j] + row);
            c1[j] = vf_load(dcols[j] + row + VL);
        } else {
            c0[j] = vf_load_n(dcols[j] + row, n0);
            c1[j] = n1 > 0 ? vf_load_n(dcols[j] + row + VL, n1) : vf_zero();
        }
    }
#pragma GCC unroll 2
    for (int64_t kk = 0; kk < kc; kk++) {
        const vf a0 = vf_load(ap);
        const vf a1 = vf_load(ap + VL);
#pragma GCC unroll 16
        for (int j = 0; j < NR; j++) {
            const vf b = vf_set1(bp[j]);
            c0[j] = vf_fma(a0, b, c0[j]);
            c1[j] = vf_fma(a1, b, c1[j]);
        }
        ap += MR;
        bp += NR;
    }
    if (mr == MR) {
#pragma GCC unroll 16
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                vf_store(dcols[j] + row, c0[j]);
                vf_store(dcols[j] + row + VL, c1[j]);
            }
        }
    } else {
        for (int j = 0; j < nr; j++) {
            vf_store_n(dcols[j] + row, c0[j], n0);
            if (n1 > 0) vf_store_n(dcols[j] + row + VL, c1[j], n1);
        }
    }
}

/* ---- jobs and the per-thread work buffer ------------------------------------ */

struct mm_plan {
    enum bt_type type;
    int64_t k, m;
    size_t a_nb1;
    int64_t njobs;

    /* MUL_MAT */
    const struct bt_tensor *a, *b, *d;
    int64_t r2, r3; /* broadcast ratios b2/a2, b3/a3 */

    /* MUL_MAT_ID */
    bool is_id;
    int64_t n_used, n_b;
    const int32_t *offs; /* [n_expert + 1] start of each expert's pairs */
    const int32_t *pairs; /* slot + n_used * token, grouped by expert */
};

/* Bytes of one thread's slice and the offsets of its parts. */
struct mm_slice {
    size_t ap, bp, tmp, bcols, dcols, offs, pairs, size;
};

static struct mm_slice slice_layout(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0];
    const int64_t k = a->ne[0];
    int64_t ncols = node->src[1]->ne[1];
    int64_t n_expert = 0, npairs = 0;
    if (node->op == BT_OP_MUL_MAT_ID) {
        n_expert = a->ne[2];
        npairs = node->src[2]->ne[0] * node->src[2]->ne[1];
        ncols = npairs;
    }
    int64_t nc = ncols < BT_MM_NC ? (ncols + NR - 1) / NR * NR : BT_MM_NC;
    /* tmp: a converted A panel (GEMM), permuted activations (dot) or one
     * converted row (reference) */
    int64_t tmp = (int64_t)MR * BT_MM_KC;
    if (k * BT_MM_GEMM_MIN_COLS > tmp) tmp = k * BT_MM_GEMM_MIN_COLS;
#if HAVE_I8_DOT
    { /* int8 activation columns of the dot path */
        const int64_t q = (int64_t)(i8_col_bytes(k) * BT_MM_GEMM_MIN_COLS / sizeof(float));
        if (q > tmp) tmp = q;
    }
#endif
    struct mm_slice s;
    size_t off = 0;
    s.ap = off;
    off += ALIGN_UP((size_t)BT_MM_MC * BT_MM_KC * sizeof(float));
    s.bp = off;
    off += ALIGN_UP((size_t)nc * BT_MM_KC * sizeof(float));
    s.tmp = off;
    off += ALIGN_UP((size_t)tmp * sizeof(float));
    s.bcols = off;
    off += ALIGN_UP((size_t)ncols * sizeof(float *));
    s.dcols = off;
    off += ALIGN_UP((size_t)ncols * sizeof(float *));
    s.offs = off;
    off += ALIGN_UP((size_t)(n_expert + 1) * sizeof(int32_t));
    s.pairs = off;
    off += ALIGN_UP((size_t)npairs * sizeof(int32_t));
    s.size = off;
    return s;
}

static int64_t job_ncols(const struct mm_plan *pl, int64_t jb) {
    if (pl->is_id) return pl->offs[jb + 1] - pl->offs[jb];
    return pl->b->ne[1];
}

/* Weight matrix of job jb. */
static const char *job_a(const struct mm_plan *pl, int64_t jb) {
    if (pl->is_id) return (const char *)pl->a->data + (size_t)jb * pl->a->nb[2];
    const int64_t i2 = jb % pl->b->ne[2], i3 = jb / pl->b->ne[2];
    return (const char *)pl->a->data + (size_t)(i2 / pl->r2) * pl->a->nb[2] +
           (size_t)(i3 / pl->r3) * pl->a->nb[3];
}

/* Column pointers of job jb into b and d. */
static void job_cols(const struct mm_plan *pl, int64_t jb, const float **bcols, float **dcols) {
    const struct bt_tensor *b = pl->b, *d = pl->d;
    if (pl->is_id) {
        const int32_t *pr = pl->pairs + pl->offs[jb];
        const int64_t n = pl->offs[jb + 1] - pl->offs[jb];
        for (int64_t j = 0; j < n; j++) {
            const int64_t e = pr[j] % pl->n_used, t = pr[j] / pl->n_used;
            bcols[j] = (const float *)((const char *)b->data + (size_t)(e % pl->n_b) * b->nb[1] +
                                       (size_t)t * b->nb[2]);
            dcols[j] = (float *)((char *)d->data + (size_t)e * d->nb[1] + (size_t)t * d->nb[2]);
        }
        return;
    }
    const int64_t i2 = jb % b->ne[2], i3 = jb / b->ne[2];
    const char *b0 = (const char *)b->data + (size_t)i2 * b->nb[2] + (size_t)i3 * b->nb[3];
    char *d0 = (char *)d->data + (size_t)i2 * d->nb[2] + (size_t)i3 * d->nb[3];
    for (int64_t j = 0; j < b->ne[1]; j++) {
        bcols[j] = (const float *)(b0 + (size_t)j * b->nb[1]);
        dcols[j] = (float *)(d0 + (size_t)j * d->nb[1]);
    }
}

/* Dot path over rows [r0, r1) of one job. */
static void run_dot(const struct mm_plan *pl, const char *a, int64_t ncols, const float *const *bcols,
                    float *const *dcols, int64_t r0, int64_t r1, float *bperm) {
    const int64_t k = pl->k;
#if HAVE_I8_DOT
    if (pl->type == BT_TYPE_Q8_0 || pl->type == BT_TYPE_Q4_0) {
        /* int8 activations, quantised by this thread into its own slice */
        struct qcol qc[BT_MM_GEMM_MIN_COLS];
        BT_ASSERT(ncols <= BT_MM_GEMM_MIN_COLS);
        const size_t cb = i8_col_bytes(k);
        for (int64_t j = 0; j < ncols; j++)
            qc[j] = quant_col(pl->type, bcols[j], k, (char *)bperm + (size_t)j * cb);
        for (int64_t rb = r0; rb < r1; rb += DOT_RB) {
            const int64_t rb1 = rb + DOT_RB < r1 ? rb + DOT_RB : r1;
            for (int64_t j0 = 0; j0 < ncols;) {
                const int64_t left = ncols - j0;
                /* Q4_0, one column: 8-row tiles (shape 3): its rows are short
                 * in bytes, and more of them in flight read memory faster */
                const int shape = ncols == 1 && pl->type == BT_TYPE_Q4_0 ? 3
                                  : left >= 4                             ? 2
                                  : left >= 2                             ? 1
                                                                          : 0;
                const int RM = shape == 3 ? 8 : dot_rm[shape], RN = shape == 3 ? 1 : dot_rn[shape];
                const dot_i8_fn fn = dot_i8_kernel(pl->type, shape);
                for (int64_t r = rb; r < rb1; r += RM) {
                    const int nr = (int)(rb1 - r < RM ? rb1 - r : RM);
                    const char *rows[8], *next[8];
                    float out[16];
                    for (int i = 0; i < RM; i++) {
                        rows[i] = a + (size_t)(r + (i < nr ? i : nr - 1)) * pl->a_nb1;
                        /* the rows the next tile will likely read */
                        next[i] = a + (size_t)(r + RM + i < r1 ? r + RM + i : r1 - 1) * pl->a_nb1;
                    }
                    fn(k, rows, r + RM < r1 ? next : NULL, qc + j0, out);
                    for (int j = 0; j < RN; j++)
                        for (int i = 0; i < nr; i++) dcols[j0 + j][r + i] = out[j * RM + i];
                }
                j0 += RN;
            }
        }
        return;
    }
#endif
#if Q4_PERMUTED
    /* activations in the lane order load_q4_perm produces */
    const float *pcols[BT_MM_GEMM_MIN_COLS];
    if (pl->type == BT_TYPE_Q4_0) {
        BT_ASSERT(ncols <= BT_MM_GEMM_MIN_COLS);
        for (int64_t j = 0; j < ncols; j++) {
            float *dst = bperm + j * k;
            for (int64_t i = 0; i < k; i += 16)
                for (int l = 0; l < 16; l++) dst[i + l] = bcols[j][i + q4_perm(l)];
            pcols[j] = dst;
        }
        bcols = pcols;
    }
#else
    (void)bperm;
#endif
    for (int64_t rb = r0; rb < r1; rb += DOT_RB) {
        const int64_t rb1 = rb + DOT_RB < r1 ? rb + DOT_RB : r1;
        for (int64_t j0 = 0; j0 < ncols;) {
            const int64_t left = ncols - j0;
            const int shape = left >= 4 ? 2 : left >= 2 ? 1 : 0;
            const int RM = dot_rm[shape], RN = dot_rn[shape];
            const dot_fn fn = dot_kernel(pl->type, shape);
            for (int64_t r = rb; r < rb1; r += RM) {
                const int nr = (int)(rb1 - r < RM ? rb1 - r : RM);
                const char *rows[4];
                float out[16];
                for (int i = 0; i < RM; i++)
                    rows[i] = a + (size_t)(r + (i < nr ? i : nr - 1)) * pl->a_nb1;
                fn(k, rows, bcols + j0, out);
                for (int j = 0; j < RN; j++)
                    for (int i = 0; i < nr; i++) dcols[j0 + j][r + i] = out[j * RM + i];
            }
            j0 += RN;
        }
    }
}

/* Interleave up to 16 source rows: dst[kk * ld + r] = src[r][kk] for r < nr,
 * kk < kc; rows r >= nr (or with src[r] NULL) are zero up to 16 (or ld).
 * The AVX-512 version transposes 16 x 16 tiles in registers. */
#if defined(__AVX512F__)
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + j], 128-bit lane L: column 4L + j of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        r[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int j = 0; j < 4; j++) {
        const __m512 s0 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 s1 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512 s2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 s3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
        t[0 + j] = _mm512_shuffle_f32x4(s0, s2, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + j] = _mm512_shuffle_f32x4(s0, s2, _MM_SHUFFLE(3, 1, 3, 1));
        t[4 + j] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + j] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

static void interleave(const float *const *src, int64_t kc, float *restrict dst, int ld) {
    const __mmask16 wmask = (__mmask16)(ld >= 16 ? 0xffff : (1u << ld) - 1u);
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const int n = (int)(kc - kk < 16 ? kc - kk : 16);
        const __mmask16 lmask = (__mmask16)((1u << n) - 1u);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = src[i] ? _mm512_maskz_loadu_ps(lmask, src[i] + kk) : _mm512_setzero_ps();
        transpose16(r);
        for (int i = 0; i < n; i++) _mm512_mask_storeu_ps(dst + (kk + i) * ld, wmask, r[i]);
    }
}
#define INTERLEAVE_ROWS 16
#else
static void interleave(const float *const *src, int64_t kc, float *restrict dst, int ld) {
    for (int r = 0; r < ld; r++) {
        if (src[r])
            for (int64_t kk = 0; kk < kc; kk++) dst[kk * ld + r] = src[r][kk];
        else
            for (int64_t kk = 0; kk < kc; kk++) dst[kk * ld + r] = 0.0f;
    }
}
#define INTERLEAVE_ROWS MR /* one call covers a whole panel */
#endif

/* Pack rows [r0, r0+mc) x k [pc, pc+kc) of a into MR-row panels: ap[p][kk][MR].
 * tmp: MR * kc floats for converting non-F32 rows. */
static void pack_a(const struct mm_plan *pl, const char *a, int64_t r0, int64_t mc, int64_t pc,
                   int64_t kc, float *restrict ap, float *restrict tmp) {
    for (int64_t p0 = 0; p0 < mc; p0 += MR) {
        const float *src[MR > 16 ? MR : 16];
        for (int r = 0; r < MR; r++) {
            src[r] = NULL;
            if (p0 + r >= mc) continue;
            const char *row = a + (size_t)(r0 + p0 + r) * pl->a_nb1;
            if (pl->type == BT_TYPE_F32) {
                src[r] = (const float *)row + pc;
            } else {
                row_to_f32(pl->type, row, pc, kc, tmp + r * kc);
                src[r] = tmp + r * kc;
            }
        }
        for (int h = 0; h < MR; h += INTERLEAVE_ROWS) interleave(src + h, kc, ap + p0 * kc + h, MR);
    }
}

/* Pack columns [j0, j0+nc) x k [pc, pc+kc) into NR-column panels: bp[p][kk][NR]. */
static void pack_b(const float *const *bcols, int64_t j0, int64_t nc, int64_t pc, int64_t kc,
                   float *restrict bp) {
    for (int64_t p0 = 0; p0 < nc; p0 += NR) {
        const float *src[NR > 16 ? NR : 16];
        for (int j = 0; j < (NR > 16 ? NR : 16); j++)
            src[j] = j < NR && p0 + j < nc ? bcols[j0 + p0 + j] + pc : NULL;
        interleave(src, kc, bp + p0 * kc, NR);
    }
}

/* GEMM path over rows [r0, r1) of one job. */
static void run_gemm(const struct mm_plan *pl, const char *a, int64_t ncols,
                     const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                     float *ap, float *bp, float *tmp) {
    const int64_t k = pl->k;
    for (int64_t jc = 0; jc < ncols; jc += BT_MM_NC) {
        const int64_t nc = ncols - jc < BT_MM_NC ? ncols - jc : BT_MM_NC;
        for (int64_t pc = 0; pc < k; pc += BT_MM_KC) {
            const int64_t kc = k - pc < BT_MM_KC ? k - pc : BT_MM_KC;
            pack_b(bcols, jc, nc, pc, kc, bp);
            for (int64_t ic = r0; ic < r1; ic += BT_MM_MC) {
                const int64_t mc = r1 - ic < BT_MM_MC ? r1 - ic : BT_MM_MC;
                pack_a(pl, a, ic, mc, pc, kc, ap, tmp);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const int nr = (int)(nc - jr < NR ? nc - jr : NR);
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        const int mr = (int)(mc - ir < MR ? mc - ir : MR);
                        gemm_ukernel(kc, ap + ir * kc, bp + jr * kc, (float *const *)dcols + jc + jr,
                                     ic + ir, mr, nr, pc == 0);
                    }
                }
            }
        }
    }
    if (k == 0)
        for (int64_t j = 0; j < ncols; j++)
            for (int64_t r = r0; r < r1; r++) dcols[j][r] = 0.0f;
}

/* Rows [r0, r1) of job jb on this thread. */
static void run_job(const struct mm_plan *pl, int64_t jb, int64_t r0, int64_t r1, char *slice,
                    const struct mm_slice *sl) {
    const int64_t ncols = job_ncols(pl, jb);
    const float **bcols = (const float **)(slice + sl->bcols);
    float **dcols = (float **)(slice + sl->dcols);
    job_cols(pl, jb, bcols, dcols);
    const char *a = job_a(pl, jb);
    if (ncols >= BT_MM_GEMM_MIN_COLS)
        run_gemm(pl, a, ncols, bcols, dcols, r0, r1, (float *)(slice + sl->ap),
                 (float *)(slice + sl->bp), (float *)(slice + sl->tmp));
    else
        run_dot(pl, a, ncols, bcols, dcols, r0, r1, (float *)(slice + sl->tmp));
}

/* Split the jobs' rows, in units of UNIT_ROWS weighted by their column count,
 * into nth contiguous shares; run this thread's share. */
static void run_plan(const struct bt_cpu_params *p, const struct mm_plan *pl, char *slice,
                     const struct mm_slice *sl) {
    const int64_t units_per_job = (pl->m + UNIT_ROWS - 1) / UNIT_ROWS;
    double total = 0.0;
    for (int64_t jb = 0; jb < pl->njobs; jb++) {
        const int64_t nc = job_ncols(pl, jb);
        if (nc > 0) total += (double)units_per_job * (double)(nc + 4);
    }
    if (total <= 0.0) return;
    double before = 0.0;
    for (int64_t jb = 0; jb < pl->njobs; jb++) {
        const int64_t nc = job_ncols(pl, jb);
        if (nc == 0) continue;
        const double w = (double)(nc + 4);
        int64_t u0 = -1, u1 = -1; /* this thread's units of this job */
        for (int64_t u = 0; u < units_per_job; u++) {
            int owner = (int)((before + (double)u * w) * p->nth / total);
            if (owner >= p->nth) owner = p->nth - 1;
            if (owner == p->ith) {
                if (u0 < 0) u0 = u;
                u1 = u + 1;
            } else if (owner > p->ith) {
                break;
            }
        }
        before += (double)units_per_job * w;
        if (u0 < 0) continue;
        const int64_t r0 = u0 * UNIT_ROWS;
        const int64_t r1 = u1 * UNIT_ROWS < pl->m ? u1 * UNIT_ROWS : pl->m;
        run_job(pl, jb, r0, r1, slice, sl);
    }
}

/* ---- reference kernels --------------------------------------------------------- */

/* d[:, j] = a x b[:, j] for rows [r0, r1), converting each a row with bt_row_to_f32. */
static void ref_rows(enum bt_type type, const char *a, size_t a_nb1, int64_t k, const float *b,
                     float *d, int64_t r0, int64_t r1, float *row) {
    for (int64_t i = r0; i < r1; i++) {
        bt_row_to_f32(type, a + (size_t)i * a_nb1, row, k);
        float sum = 0.0f;
        for (int64_t kk = 0; kk < k; kk++) sum += row[kk] * b[kk];
        d[i] = sum;
    }
}

static void ref_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *d, float *row) {
    const struct bt_tensor *a = d->src[0], *b = d->src[1];
    const int64_t m = a->ne[1], r0 = m * p->ith / p->nth, r1 = m * (p->ith + 1) / p->nth;
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++)
            for (int64_t j = 0; j < b->ne[1]; j++) {
                const char *a0 = (const char *)a->data + (size_t)(i2 / r2) * a->nb[2] +
                                 (size_t)(i3 / r3) * a->nb[3];
                const float *bc = (const float *)((const char *)b->data + (size_t)j * b->nb[1] +
                                                  (size_t)i2 * b->nb[2] + (size_t)i3 * b->nb[3]);
                float *dc = (float *)((char *)d->data + (size_t)j * d->nb[1] +
                                      (size_t)i2 * d->nb[2] + (size_t)i3 * d->nb[3]);
                ref_rows(a->type, a0, a->nb[1], a->ne[0], bc, dc, r0, r1, row);
            }
}

/* ---- entry points --------------------------------------------------------------- */

/* Every well-formed product (src/ops.c) has a CPU kernel: the fast paths
 * fall back to portable code, so there is no CPU-specific limit. */
bool bt_cpu_mul_mat_supported(const struct bt_tensor *node) {
    return (node->op == BT_OP_MUL_MAT || node->op == BT_OP_MUL_MAT_ID) && bt_op_is_well_formed(node);
}

size_t bt_cpu_mul_mat_work_size(const struct bt_tensor *node, int nth) {
    return slice_layout(node).size * (size_t)(nth > 0 ? nth : 1);
}

static char *thread_slice(const struct bt_cpu_params *p, const struct mm_slice *sl) {
    BT_ASSERT(p->wdata && sl->size * (size_t)p->nth <= p->wsize);
    return (char *)p->wdata + sl->size * (size_t)p->ith;
}

void bt_cpu_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *d) {
    const struct bt_tensor *a = d->src[0], *b = d->src[1];
    const struct mm_slice sl = slice_layout(d);
    char *slice = thread_slice(p, &sl);
    if (p->reference) {
        ref_mul_mat(p, d, (float *)(slice + sl.tmp));
        return;
    }
    struct mm_plan pl = {0};
    pl.type = a->type;
    pl.k = a->ne[0];
    pl.m = a->ne[1];
    pl.a_nb1 = a->nb[1];
    pl.njobs = b->ne[2] * b->ne[3];
    pl.a = a;
    pl.b = b;
    pl.d = d;
    pl.r2 = b->ne[2] / a->ne[2];
    pl.r3 = b->ne[3] / a->ne[3];
    run_plan(p, &pl, slice, &sl);
}

void bt_cpu_mul_mat_id(const struct bt_cpu_params *p, struct bt_tensor *d) {
    const struct bt_tensor *as = d->src[0], *b = d->src[1], *ids = d->src[2];
    const int64_t n_expert = as->ne[2], n_used = ids->ne[0], n_tokens = ids->ne[1];
    const struct mm_slice sl = slice_layout(d);
    char *slice = thread_slice(p, &sl);

    /* every thread checks the ids and groups the (slot, token) pairs by expert
     * in its own slice (cheap), so no barrier is needed */
    int32_t *offs = (int32_t *)(slice + sl.offs);
    int32_t *pairs = (int32_t *)(slice + sl.pairs);
    memset(offs, 0, sizeof(int32_t) * (size_t)(n_expert + 1));
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) {
            const int32_t id = *(const int32_t *)((const char *)ids->data + (size_t)e * ids->nb[0] +
                                                  (size_t)t * ids->nb[1]);
            if (id < 0 || id >= n_expert) {
                bt_cpu_fail(p, BT_ERR_INVALID, "node '%s': expert id %d out of range [0, %lld)",
                            d->name, id, (long long)n_expert);
                return;
            }
            offs[id + 1]++;
        }

    if (p->reference) {
        float *row = (float *)(slice + sl.tmp);
        const int64_t m = as->ne[1], r0 = m * p->ith / p->nth, r1 = m * (p->ith + 1) / p->nth;
        for (int64_t t = 0; t < n_tokens; t++)
            for (int64_t e = 0; e < n_used; e++) {
                const int32_t id = *(const int32_t *)((const char *)ids->data +
                                                      (size_t)e * ids->nb[0] + (size_t)t * ids->nb[1]);
                const float *bc = (const float *)((const char *)b->data +
                                                  (size_t)(e % b->ne[1]) * b->nb[1] +
                                                  (size_t)t * b->nb[2]);
                float *dc = (float *)((char *)d->data + (size_t)e * d->nb[1] + (size_t)t * d->nb[2]);
                ref_rows(as->type, (const char *)as->data + (size_t)id * as->nb[2], as->nb[1],
                         as->ne[0], bc, dc, r0, r1, row);
            }
        return;
    }

    for (int64_t x = 0; x < n_expert; x++) offs[x + 1] += offs[x];
    /* counting sort, stable in (token, slot) order; offs[x] ends as x's end,
     * so shift back afterwards */
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) {
            const int32_t id = *(const int32_t *)((const char *)ids->data + (size_t)e * ids->nb[0] +
                                                  (size_t)t * ids->nb[1]);
            pairs[offs[id]++] = (int32_t)(e + n_used * t);
        }
    for (int64_t x = n_expert; x > 0; x--) offs[x] = offs[x - 1];
    offs[0] = 0;

    struct mm_plan pl = {0};
    pl.type = as->type;
    pl.k = as->ne[0];
    pl.m = as->ne[1];
    pl.a_nb1 = as->nb[1];
    pl.njobs = n_expert;
    pl.a = as;
    pl.b = b;
    pl.d = d;
    pl.is_id = true;
    pl.n_used = n_used;
    pl.n_b = b->ne[1];
    pl.offs = offs;
    pl.pairs = pairs;
    run_plan(p, &pl, slice, &sl);
}
