/* fdot.c - MUL_MAT / MUL_MAT_ID for F32 and F16 weights: the one summation
 * order of these types, on every path (BF16 weights have their own, the
 * pair order of vdpbf16ps: matmul.c).
 *
 *   a  [k, m] weight rows (F32 or F16, row stride a_nb1 bytes)
 *   b  columns bcols[j]: k F32 values each (contiguous)
 *   d  columns dcols[j]: d[j][r] = dot(a row r, b column j)
 *
 * THE ORDER (per output element, w a weight row and x a column, converted
 * exactly to F32):
 *   k is cut into chunks of BT_MM_FKC elements (the last may be shorter);
 *   in chunk c sixteen lanes start at 0 and, group by group (16 elements,
 *   in increasing order), lane l takes P[l] = fma(w[e], x[e], P[l]) for the
 *   group's element e with e % 16 == l (elements past k count as 0 * 0);
 *   the chunk's sum is s_c = R(P), the fixed tree
 *       u[l] = P[l] + P[l+8], v[l] = u[l] + u[l+4], t[l] = v[l] + v[l+2], s = t[0] + t[1];
 *   and d = s_0, then d = d + s_c for c = 1, 2, ... in order.
 * Sixteen lanes along k are what a 512-bit register holds: a weight row is
 * loaded as it lies in memory (F16 converted in registers), one FMA per 16
 * weights, no transposition; that is what makes 1-column decode and the
 * MoE experts run at the memory's speed (before this, an FMA chain along k
 * per element needed a 16 x 16 transposition per 256 weights at 1 column).
 *
 * Without AVX-512, the sixteen lanes are two vectors of 8 (AVX2 + FMA, F16
 * weights widened with F16C), four NEON vectors of 4 (aarch64, F16 widened
 * with fcvtl) or 16 floats in plain C.
 * Three ways through it, the same bits (tests/test_determinism.c checks
 * every element of MUL_MAT and MUL_MAT_ID, 1..131 columns, against a scalar
 * model of the order, bitwise):
 *   - direct (fewer than BT_MM_FGEMM_COLS columns: decode, MoE experts):
 *     tiles of RM rows x RN columns (8x1, 8x2, 4x3, 4x4; with 8-lane
 *     registers 4x1, 2x2, 2x3, 2x4) read the rows
 *     where they lie, a chunk at a time, the chunk sums kept in a register
 *     and stored once.  Rows of a multiple of 4 KiB (every model shape) all
 *     fall in one L1 set, of 8 ways: a 1-column tile of 16 rows and an L1
 *     prefetch 1 KiB ahead of each (as before) ran decode 1.3-1.5x slower
 *     than 8 rows prefetched into L2 only;
 *   - blocked, few columns (fewer than BT_MM_FLANE_COLS: a batch of sequences,
 *     an expert's share of a prompt): a chunk at a time, the columns and
 *     BT_MM_FMC rows (converted to F32) are packed into the thread's buffer
 *     with a padded stride; 4 x 6 tiles, a tile's columns kept in L1 while
 *     the rows pass by (the next tile's rows prefetched; a full tile
 *     addresses its 10 packed streams from two pointers, as ten pointers
 *     spill general registers in the inner loop).  With vectors of 8 lanes
 *     (AVX2, NEON) the tiles are 4 x 3 and take lanes 0-7 and 8-15 in two
 *     passes over the chunk (tile_chunk_h): 12 accumulators that stay in
 *     registers, where a 4 x 6 tile's 48 spilled every FMA;
 *   - lane passes (more columns: prompt): a chunk at a time, up to
 *     BT_MM_FNC columns and BT_MM_FMC rows are packed transposed, lane by
 *     lane, and each lane's FMA chains run as a GEMM vectorised along the
 *     rows (16 rows x 14 columns a tile, lanes l and l + 8 in one pass), so
 *     that R adds whole vectors (section "lane passes" below).  The
 *     transposition costs a 16 x 16 shuffle per 256 weights, repaid only
 *     over many columns; below BT_MM_FLANE_COLS the 4 x 6 (4 x 3) tiles are faster.
 * In both blocked paths a chunk's sums are added into d, which holds the
 * sum of the chunks before (the order above, since d = d + s_c).
 * The direct and 4 x 6 tiles reduce their accumulators 16 at a time: a
 * transposing tree of 30 shuffles and 15 additions that performs exactly
 * R's additions for each of the 16.
 */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define FDOT_NEON 1
#endif

#ifndef BT_MM_FMC
#define BT_MM_FMC 64 /* blocked paths: rows packed per chunk (a multiple of 16) */
#endif
#ifndef BT_MM_FNC
#define BT_MM_FNC 512 /* blocked paths: columns packed per chunk */
#endif
#ifndef BT_MM_FLANE_COLS
#define BT_MM_FLANE_COLS 64 /* jobs with at least this many columns take the lane passes */
#endif
#ifndef BT_MM_FGEMM_COLS
#define BT_MM_FGEMM_COLS 8 /* jobs with at least this many columns take the blocked path */
#endif
#ifndef BT_MM_FPREFETCH
/* direct path: prefetch distance in bytes of each row (0: none).  2 KiB
 * against 1 KiB, a Zen 4, 1 thread: MoE experts and decode rows held in its
 * L3 1.03-1.14x (AVX2 and AVX-512), rows from memory unchanged */
#define BT_MM_FPREFETCH 2048
#endif
#ifndef BT_MM_FPREFETCH_PACKED
#define BT_MM_FPREFETCH_PACKED 1024 /* blocked path: the same in the packed rows */
#endif
#ifndef BT_MM_FPREFETCH_L2
/* direct path: prefetch into L2 only (prefetcht1): rows of 4 KiB multiples
 * fall in one L1 set, which prefetching a tile's rows into L1 would thrash */
#define BT_MM_FPREFETCH_L2 1
#endif
/* direct path: rows of a 1-column tile and of 2-, 3- and 4-column tiles (divisors
 * of 16).  With 8-lane registers (AVX2, NEON's pairs of 4) a tile holds 2 RM RN
 * accumulators: 8 x 1 and 8 x 2 spilled every FMA, and on a Zen 3 (an AVX2-only
 * CPU) 4 x 1 and 2 x RN ran the F16 decode row 1.08x, its 1-token MoE row 1.2x
 * and its 32-token one 1.33x (docs/benchmarks.md); a Zen 4 forced to AVX2 had
 * preferred 8 x 1, but AVX-512 CPUs run the AVX-512 variant */
#ifndef BT_MM_FRM1
#if defined(__AVX512F__)
#define BT_MM_FRM1 8
#else
#define BT_MM_FRM1 4
#endif
#endif
#ifndef BT_MM_FRM2
#if defined(__AVX512F__)
#define BT_MM_FRM2 8
#else
#define BT_MM_FRM2 2
#endif
#endif
#ifndef BT_MM_FRMN
#if defined(__AVX512F__)
#define BT_MM_FRMN 4 /* 3 and 4 columns */
#else
#define BT_MM_FRMN 2
#endif
#endif
_Static_assert(BT_MM_FKC % 16 == 0 && BT_MM_FKC > 0, "BT_MM_FKC must be a multiple of 16");
_Static_assert(BT_MM_FMC % 16 == 0 && BT_MM_FMC > 0, "BT_MM_FMC must be a multiple of 16");

/* ---- 16 lanes: one AVX-512 register, or two of 8 (AVX2 / plain C) -------- */

#if defined(__AVX512F__)
typedef __m512 v16;
static inline v16 v16_zero(void) { return _mm512_setzero_ps(); }
static inline v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); }
static inline v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
static inline v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
static inline v16 v16_load_f16(const bt_fp16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void v16_store(float *p, v16 v) { _mm512_storeu_ps(p, v); }
/* keep v in a register: otherwise the compiler folds a value used by several
 * FMAs into each as a memory operand, and the loads, not the FMAs, bound a tile */
#define V16_PIN(v) __asm__("" : "+v"(v))

/* s[i] = R(v[i]) for i < 16, each by R's own additions: four rounds that
 * each fold two vectors' halves together (lane i of the result holds vector
 * 4 (i % 4) + i / 4 before the last permutation). */
static inline v16 v16_sum16(const v16 v[16]) {
    __m512 a[8], b[4], c[2];
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) /* [u of v[2i] | u of v[2i+1]] */
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) /* quarter q: the v-level of vector 4i + q */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 16
    for (int i = 0; i < 2; i++) { /* quarter q: t of vectors 8i + q, 8i + 4 + q */
        const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, s);
}

#else
#if defined(__AVX2__) && defined(__FMA__)
typedef __m256 v8;
static inline v8 v8_zero(void) { return _mm256_setzero_ps(); }
static inline v8 v8_fma(v8 a, v8 b, v8 c) { return _mm256_fmadd_ps(a, b, c); }
static inline v8 v8_add(v8 a, v8 b) { return _mm256_add_ps(a, b); }
static inline v8 v8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v8_store(float *p, v8 v) { _mm256_storeu_ps(p, v); }
#elif defined(FDOT_NEON)
/* two NEON registers; vfmaq_f32 rounds once, as fmaf */
typedef struct {
    float32x4_t a, b;
} v8;
static inline v8 v8_zero(void) { return (v8){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
static inline v8 v8_fma(v8 a, v8 b, v8 c) { return (v8){vfmaq_f32(c.a, a.a, b.a), vfmaq_f32(c.b, a.b, b.b)}; }
static inline v8 v8_add(v8 a, v8 b) { return (v8){vaddq_f32(a.a, b.a), vaddq_f32(a.b, b.b)}; }
static inline v8 v8_load(const float *p) { return (v8){vld1q_f32(p), vld1q_f32(p + 4)}; }
static inline void v8_store(float *p, v8 v) {
    vst1q_f32(p, v.a);
    vst1q_f32(p + 4, v.b);
}
#else /* plain C: 8 floats, each step fmaf (one rounding, the bits of the vector FMA) */
typedef struct {
    float f[8];
} v8;
static inline v8 v8_zero(void) {
    v8 r;
    for (int i = 0; i < 8; i++) r.f[i] = 0.0f;
    return r;
}
static inline v8 v8_fma(v8 a, v8 b, v8 c) {
    for (int i = 0; i < 8; i++) c.f[i] = fmaf(a.f[i], b.f[i], c.f[i]);
    return c;
}
static inline v8 v8_add(v8 a, v8 b) {
    for (int i = 0; i < 8; i++) a.f[i] += b.f[i];
    return a;
}
static inline v8 v8_load(const float *p) {
    v8 r;
    memcpy(r.f, p, sizeof(r.f));
    return r;
}
static inline void v8_store(float *p, v8 v) { memcpy(p, v.f, sizeof(v.f)); }
#endif
typedef struct {
    v8 lo, hi;
} v16;
#define V16_PIN(v) ((void)0)
static inline v16 v16_zero(void) { return (v16){v8_zero(), v8_zero()}; }
static inline v16 v16_fma(v16 a, v16 b, v16 c) {
    return (v16){v8_fma(a.lo, b.lo, c.lo), v8_fma(a.hi, b.hi, c.hi)};
}
static inline v16 v16_add(v16 a, v16 b) { return (v16){v8_add(a.lo, b.lo), v8_add(a.hi, b.hi)}; }
static inline v16 v16_load(const float *p) { return (v16){v8_load(p), v8_load(p + 8)}; }
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* widened in registers (vcvtph2ps: exact, as bt_fp16_to_fp32) */
static inline v16 v16_load_f16(const bt_fp16_t *p) {
    return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
#elif defined(FDOT_NEON)
/* widened in registers (fcvtl: exact, as bt_fp16_to_fp32) */
static inline v8 v8_load_f16(const bt_fp16_t *p) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(p));
    return (v8){vcvt_f32_f16(vget_low_f16(h)), vcvt_high_f32_f16(h)};
}
static inline v16 v16_load_f16(const bt_fp16_t *p) { return (v16){v8_load_f16(p), v8_load_f16(p + 8)}; }
#else
static inline v16 v16_load_f16(const bt_fp16_t *p) {
    float t[16];
    for (int i = 0; i < 16; i++) t[i] = bt_fp16_to_fp32(p[i]);
    return v16_load(t);
}
#endif
static inline void v16_store(float *p, v16 v) {
    v8_store(p, v.lo);
    v8_store(p + 8, v.hi);
}
#if defined(FDOT_NEON)
/* s[i] = R(v[i]) for i < 16, each by R's own additions: per vector the u
 * and v levels in registers (lanes 0-3 of u = P[l] + P[l+8] then
 * v[l] = u[l] + u[l+4]), then four vectors at a time t = v[l] + v[l+2]
 * beside each other and s = t[0] + t[1] by pairwise adds */
static inline v16 v16_sum16(const v16 v[16]) {
    float32x4_t s4[4];
    for (int q = 0; q < 4; q++) {
        float32x4_t w[4];
        for (int i = 0; i < 4; i++) {
            const v16 x = v[4 * q + i];
            w[i] = vaddq_f32(vaddq_f32(x.lo.a, x.hi.a), vaddq_f32(x.lo.b, x.hi.b));
        }
        /* [v0 v1 | w1's v0 v1] + [v2 v3 | w1's v2 v3]: t of vectors 0 and 1 */
        const float64x2_t a0 = vreinterpretq_f64_f32(w[0]), a1 = vreinterpretq_f64_f32(w[1]);
        const float64x2_t a2 = vreinterpretq_f64_f32(w[2]), a3 = vreinterpretq_f64_f32(w[3]);
        const float32x4_t t01 = vaddq_f32(vreinterpretq_f32_f64(vzip1q_f64(a0, a1)),
                                          vreinterpretq_f32_f64(vzip2q_f64(a0, a1)));
        const float32x4_t t23 = vaddq_f32(vreinterpretq_f32_f64(vzip1q_f64(a2, a3)),
                                          vreinterpretq_f32_f64(vzip2q_f64(a2, a3)));
        s4[q] = vpaddq_f32(t01, t23);
    }
    return (v16){(v8){s4[0], s4[1]}, (v8){s4[2], s4[3]}};
}
#elif defined(__AVX2__) && defined(__FMA__)
/* s[i] = R(v[i]) for i < 16, each by R's own additions, in registers: u =
 * lo + hi per vector; then three rounds that each fold two vectors' halves
 * together (a: 128-bit halves, v = u[l] + u[l+4]; b: pairs, t = v[l] +
 * v[l+2]; c: s = t[0] + t[1]), which leave lane j of c[r] holding vector
 * 8r + 2 (j % 4) + j / 4; a last permutation puts them in order. */
static inline v16 v16_sum16(const v16 v[16]) {
    __m256 u[16], a[8], b[4], c[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) u[i] = _mm256_add_ps(v[i].lo, v[i].hi);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* [v of u[2i] | v of u[2i+1]] */
        a[i] = _mm256_add_ps(_mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(u[2 * i], u[2 * i + 1], 0x31));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* [t of 4i, t of 4i + 2 | t of 4i + 1, t of 4i + 3] */
        b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        c[i] = _mm256_add_ps(_mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm256_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256i idx = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    return (v16){_mm256_permutevar8x32_ps(c[0], idx), _mm256_permutevar8x32_ps(c[1], idx)};
}
#else
static inline v16 v16_sum16(const v16 v[16]) {
    float s[16];
    for (int i = 0; i < 16; i++) {
        float p[16], u[8], w[4], t[2];
        v16_store(p, v[i]);
        for (int l = 0; l < 8; l++) u[l] = p[l] + p[l + 8];
        for (int l = 0; l < 4; l++) w[l] = u[l] + u[l + 4];
        for (int l = 0; l < 2; l++) t[l] = w[l] + w[l + 2];
        s[i] = t[0] + t[1];
    }
    return v16_load(s);
}
#endif
#endif

/* 16 weights from element e of a row (all 16 exist) */
static inline __attribute__((always_inline)) v16 load_w(enum bt_type type, const char *row,
                                                         int64_t e) {
    return type == BT_TYPE_F32 ? v16_load((const float *)row + e)
                               : v16_load_f16((const bt_fp16_t *)row + e);
}

/* the last n < 16 weights from element e, zero beyond */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
static inline __attribute__((always_inline)) v16 load_w_tail(enum bt_type type, const char *row,
                                                              int64_t e, int n) {
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    return type == BT_TYPE_F32
               ? _mm512_maskz_loadu_ps(m, (const float *)row + e)
               : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const bt_fp16_t *)row + e));
}

static inline __attribute__((always_inline)) v16 load_x_tail(const float *x, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), x);
}
#else
static v16 load_w_tail(enum bt_type type, const char *row, int64_t e, int n) {
    float t[16] = {0};
    if (type == BT_TYPE_F32)
        memcpy(t, (const float *)row + e, sizeof(float) * (size_t)n);
    else
        for (int i = 0; i < n; i++) t[i] = bt_fp16_to_fp32(((const bt_fp16_t *)row)[e + i]);
    return v16_load(t);
}

static v16 load_x_tail(const float *x, int n) {
    float t[16] = {0};
    memcpy(t, x, sizeof(float) * (size_t)n);
    return v16_load(t);
}
#endif

static size_t type_bytes(enum bt_type type) { return type == BT_TYPE_F32 ? 4 : 2; }

#define TILE_MAX 24 /* accumulators of a tile (RM * RN) */

static inline __attribute__((always_inline)) void prefetch(const char *p, const bool l2) {
    if (l2)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p, 0, 3);
}

/* At byte pos of the rows (once a cache line): prefetch PF bytes ahead in
 * each of the RM rows, or near a row's end into next[i] (when not NULL). */
static inline __attribute__((always_inline)) void tile_prefetch(const int RM, const int PF, const bool L2,
                                                                 const char *const *rows, const char *const *next,
                                                                 int64_t row_bytes, int64_t pos) {
    if ((pos & 63) != 0) return;
    const int64_t off = pos + PF;
    if (off < row_bytes)
#pragma GCC unroll 32
        for (int i = 0; i < RM; i++) prefetch(rows[i] + off, L2);
    else if (next && off - row_bytes < row_bytes)
#pragma GCC unroll 32
        for (int i = 0; i < RM; i++) prefetch(next[i] + (off - row_bytes), L2);
}

/* One chunk, elements [e0, e1) of RM weight rows x RN columns (RM * RN <=
 * TILE_MAX, RM a divisor of 16): lane a % 16 of s[a / 16], a = j * RM + i,
 * is the chunk sum s_c of row i, column j.  PF: prefetch PF bytes ahead in
 * each row (none when 0; into L2 only when L2) (rows of row_bytes bytes),
 * near a row's end into next[i] (when not NULL). */
static inline __attribute__((always_inline)) void tile_chunk_full(enum bt_type type, const int RM,
                                                              const int RN, const int PF,
                                                              const bool L2,
                                                              const char *const *rows,
                                                              const char *const *next,
                                                              int64_t row_bytes,
                                                              const float *const *x, int64_t e0,
                                                              int64_t e1, v16 *s) {
    const int64_t es = (int64_t)type_bytes(type);
    v16 acc[32]; /* [TILE_MAX] used, the rest zero for the second v16_sum16 */
#pragma GCC unroll 32
    for (int i = 0; i < 32; i++) acc[i] = v16_zero();
    int64_t e = e0;
    for (; e + 16 <= e1; e += 16) {
        if (PF > 0) tile_prefetch(RM, PF, L2, rows, next, row_bytes, e * es);
        if (RN == 1) { /* each weight used once: the FMA may read it from memory */
            v16 b = v16_load(x[0] + e);
            V16_PIN(b);
#pragma GCC unroll 32
            for (int i = 0; i < RM; i++) acc[i] = v16_fma(load_w(type, rows[i], e), b, acc[i]);
        } else {
            v16 w[8];
#pragma GCC unroll 32
            for (int i = 0; i < RM; i++) {
                w[i] = load_w(type, rows[i], e);
                V16_PIN(w[i]);
            }
#pragma GCC unroll 32
            for (int j = 0; j < RN; j++) {
                v16 b = v16_load(x[j] + e);
                V16_PIN(b);
#pragma GCC unroll 32
                for (int i = 0; i < RM; i++) acc[j * RM + i] = v16_fma(w[i], b, acc[j * RM + i]);
            }
        }
    }
    if (e < e1) {
        const int n = (int)(e1 - e);
#pragma GCC unroll 32
        for (int i = 0; i < RM; i++) {
            const v16 w = load_w_tail(type, rows[i], e, n);
#pragma GCC unroll 32
            for (int j = 0; j < RN; j++)
                acc[j * RM + i] = v16_fma(w, load_x_tail(x[j] + e, n), acc[j * RM + i]);
        }
    }
    s[0] = v16_sum16(acc);
    if (RM * RN > 16) s[1] = v16_sum16(acc + 16);
}

#if defined(__AVX512F__)
#define tile_chunk_few tile_chunk_full
#else
/* 8 weights from element e of a row (all 8 exist) */
static inline __attribute__((always_inline)) v8 load_w8(enum bt_type type, const char *row, int64_t e) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    return type == BT_TYPE_F32 ? v8_load((const float *)row + e)
                               : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const bt_fp16_t *)row + e)));
#elif defined(FDOT_NEON)
    return type == BT_TYPE_F32 ? v8_load((const float *)row + e) : v8_load_f16((const bt_fp16_t *)row + e);
#else
    if (type == BT_TYPE_F32) return v8_load((const float *)row + e);
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = bt_fp16_to_fp32(((const bt_fp16_t *)row)[e + i]);
    return v8_load(t);
#endif
}

/* tile_chunk_full's sums with registers of 8 lanes: lanes 0-7 of every
 * accumulator in one pass over the chunk, then lanes 8-15 in a second (the
 * rows are in cache by then; the first pass prefetches).  Each lane takes
 * the same FMAs in the same order, so the sums are the same bits; a tile
 * keeps RM * RN registers of accumulators instead of twice that (AVX2 has
 * 16: a 4 x 3 tile with its 3 columns and a weight, where tile_chunk_full
 * needs 24 for 4 x 3 and 48 for 4 x 6).  RM * RN <= 12, RN <= 4.  The direct path keeps
 * tile_chunk_full: there the second pass over rows read from memory cost
 * more than the spills (MoE products of 1 and 32 tokens 0.5-1.0x). */
static inline __attribute__((always_inline)) void tile_chunk_h(enum bt_type type, const int RM, const int RN,
                                                                const int PF, const bool L2,
                                                                const char *const *rows, const char *const *next,
                                                                int64_t row_bytes, const float *const *x, int64_t e0,
                                                                int64_t e1, v16 *s) {
    const int64_t es = (int64_t)type_bytes(type);
    v16 acc[16]; /* [RM * RN] used, the rest zero for v16_sum16 */
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = v16_zero();
#pragma GCC unroll 1
    for (int h = 0; h < 2; h++) {
        v8 a[12];
#pragma GCC unroll 12
        for (int i = 0; i < RM * RN; i++) a[i] = v8_zero();
        int64_t e = e0;
        for (; e + 16 <= e1; e += 16) {
            if (PF > 0 && h == 0) tile_prefetch(RM, PF, L2, rows, next, row_bytes, e * es);
            const int64_t eh = e + 8 * h;
            v8 b[4];
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) b[j] = v8_load(x[j] + eh);
#pragma GCC unroll 16
            for (int i = 0; i < RM; i++) {
                const v8 w = load_w8(type, rows[i], eh);
#pragma GCC unroll 4
                for (int j = 0; j < RN; j++) a[j * RM + i] = v8_fma(w, b[j], a[j * RM + i]);
            }
        }
        if (e < e1) { /* the last n < 16 elements: this pass's half of them, zero beyond */
            const int n = (int)(e1 - e);
            v8 b[4];
#pragma GCC unroll 4
            for (int j = 0; j < RN; j++) {
                const v16 bt = load_x_tail(x[j] + e, n);
                b[j] = h ? bt.hi : bt.lo;
            }
#pragma GCC unroll 16
            for (int i = 0; i < RM; i++) {
                const v16 w = load_w_tail(type, rows[i], e, n);
#pragma GCC unroll 4
                for (int j = 0; j < RN; j++) a[j * RM + i] = v8_fma(h ? w.hi : w.lo, b[j], a[j * RM + i]);
            }
        }
#pragma GCC unroll 12
        for (int i = 0; i < RM * RN; i++) {
            if (h)
                acc[i].hi = a[i];
            else
                acc[i].lo = a[i];
        }
    }
    s[0] = v16_sum16(acc);
}
#define tile_chunk_few tile_chunk_h
#endif

/* d[j][row0 + i] (+)= lane a % 16 of s[a / 16], a = j * RM + i, for j < RN,
 * i < nrows */
static inline __attribute__((always_inline)) void tile_store(const v16 *s, const int RM,
                                                              const int RN, float *const *dcols,
                                                              int64_t row0, int nrows, bool add) {
#if defined(__AVX512F__)
    const __mmask16 m = (__mmask16)((1u << nrows) - 1u);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma GCC unroll 32
    for (int j = 0; j < RN; j++) {
        const int a = j * RM;
        __m512 v = a % 16 == 0 ? s[a / 16]
                               : _mm512_permutexvar_ps(_mm512_add_epi32(iota, _mm512_set1_epi32(a % 16)),
                                                       s[a / 16]);
        float *d = dcols[j] + row0;
        if (add) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), v);
        _mm512_mask_storeu_ps(d, m, v);
    }
#else
    float t[32] = {0};
    v16_store(t, s[0]);
    if (RM * RN > 16) v16_store(t + 16, s[1]);
    for (int j = 0; j < RN; j++)
        for (int i = 0; i < RM && i < nrows; i++) {
            float *d = dcols[j] + row0 + i;
            *d = add ? *d + t[j * RM + i] : t[j * RM + i];
        }
#endif
}

/* ---- direct path: tiles over the rows where they lie ---------------------- */

typedef void (*direct_fn)(int64_t k, const char *const *rows, const char *const *next,
                          int64_t row_bytes, const float *const *x, float *const *dcols,
                          int64_t row0, int nrows);

/* All chunks of one tile; the chunk sums accumulate in a register. */
static inline __attribute__((always_inline)) void direct_tile(enum bt_type type, const int RM,
                                                               const int RN, int64_t k,
                                                               const char *const *rows,
                                                               const char *const *next,
                                                               int64_t row_bytes,
                                                               const float *const *x,
                                                               float *const *dcols, int64_t row0,
                                                               int nrows) {
    v16 tot[1], s[1];
    tile_chunk_full(type, RM, RN, BT_MM_FPREFETCH, BT_MM_FPREFETCH_L2, rows, next, row_bytes, x, 0,
                    k < BT_MM_FKC ? k : BT_MM_FKC, tot);
    for (int64_t e0 = BT_MM_FKC; e0 < k; e0 += BT_MM_FKC) {
        tile_chunk_full(type, RM, RN, BT_MM_FPREFETCH, BT_MM_FPREFETCH_L2, rows, next, row_bytes, x, e0,
                        k - e0 < BT_MM_FKC ? k : e0 + BT_MM_FKC, s);
        tot[0] = v16_add(tot[0], s[0]);
    }
    tile_store(tot, RM, RN, dcols, row0, nrows, false);
}

#define DEF_DIRECT(T, RM, RN)                                                                    \
    static void direct_##T##_##RN(int64_t k, const char *const *rows, const char *const *next,    \
                                  int64_t row_bytes, const float *const *x, float *const *dcols,  \
                                  int64_t row0, int nrows) {                                     \
        direct_tile(BT_TYPE_##T, RM, RN, k, rows, next, row_bytes, x, dcols, row0, nrows);       \
    }
#define DEF_DIRECTS(T) \
    DEF_DIRECT(T, BT_MM_FRM1, 1) DEF_DIRECT(T, BT_MM_FRM2, 2) DEF_DIRECT(T, BT_MM_FRMN, 3) DEF_DIRECT(T, BT_MM_FRMN, 4)
DEF_DIRECTS(F32)
DEF_DIRECTS(F16)

/* tile rows for 1..4 columns (w[8] above) */
static const int direct_rm[5] = {0, BT_MM_FRM1, BT_MM_FRM2, BT_MM_FRMN, BT_MM_FRMN};

static void run_direct(enum bt_type type, const char *a, size_t a_nb1, int64_t k, int64_t ncols,
                       const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                       struct bt_cpu_next after) {
#define ROW(T) {NULL, direct_##T##_1, direct_##T##_2, direct_##T##_3, direct_##T##_4}
    static const direct_fn table[2][5] = {ROW(F32), ROW(F16)};
#undef ROW
    const direct_fn *fns = table[type == BT_TYPE_F32 ? 0 : 1];
    const int64_t row_bytes = k * (int64_t)type_bytes(type);
    /* 16 rows at a time, every column group over them while they are hot */
    for (int64_t rb = r0; rb < r1; rb += 16) {
        const int64_t rb1 = rb + 16 < r1 ? rb + 16 : r1;
        for (int64_t j0 = 0; j0 < ncols;) {
            const int rn = (int)(ncols - j0 < 4 ? ncols - j0 : 4), rm = direct_rm[rn];
            for (int64_t r = rb; r < rb1; r += rm) {
                const int nr = (int)(rb1 - r < rm ? rb1 - r : rm);
                const char *rows[16], *next[16];
                for (int i = 0; i < rm; i++) {
                    rows[i] = a + (size_t)(r + (i < nr ? i : nr - 1)) * a_nb1;
                    next[i] = a + (size_t)(r + rm + i < r1 ? r + rm + i : r1 - 1) * a_nb1;
                }
                /* the range's last tile: the first rows of the thread's next range */
                const bool has_next = r + rm < r1 || (rb1 == r1 && j0 + rn == ncols && after.fn &&
                                                      after.fn(after.ctx, rm, (const void **)next));
                fns[rn](k, rows, has_next ? next : NULL, row_bytes, bcols + j0, dcols + j0, r, nr);
            }
            j0 += rn;
        }
    }
}

/* ---- blocked path, few columns: converted rows, 4 x 6 tiles (4 x 3) ------- */

typedef void (*chunk_fn)(const char *const *rows, const char *const *next, const float *const *x,
                         int64_t n, float *const *dcols, int64_t row0, int nrows, bool add);
/* rows: 4 packed F32 rows of n elements; next: the rows of the tile after
 * this one (prefetched while this one runs), or NULL */
#define DEF_CHUNK(RN)                                                                             \
    static void chunk_4x##RN(const char *const *rows, const char *const *next,                   \
                             const float *const *x, int64_t n, float *const *dcols, int64_t row0, \
                             int nrows, bool add) {                                              \
        v16 s[2];                                                                                \
        tile_chunk_few(BT_TYPE_F32, 4, RN, BT_MM_FPREFETCH_PACKED, false, rows, next, n * (int64_t)sizeof(float), x, 0, n, s); \
        tile_store(s, 4, RN, dcols, row0, nrows, add);                                           \
    }
#if defined(__AVX512F__)
DEF_CHUNK(1) DEF_CHUNK(2) DEF_CHUNK(3) DEF_CHUNK(4) DEF_CHUNK(5) DEF_CHUNK(6)
#define BLOCK_RN 6 /* columns of a blocked tile: 24 accumulators */
#else
DEF_CHUNK(1) DEF_CHUNK(2) DEF_CHUNK(3)
#define BLOCK_RN 3 /* 12 accumulators of 8 lanes (tile_chunk_h) */
#endif

/* Stride in floats of a packed row or column: a chunk plus a cache line, so
 * that a tile's 10 streams do not all fall in the same L1 sets (rows of 2^n
 * bytes would). */
#define PACK_LD (BT_MM_FKC + 16)

/* The full 4 x BLOCK_RN tile: 4 packed rows from r, BLOCK_RN packed columns
 * from c, each PACK_LD floats after the one before; the same work as
 * chunk_4x6 (chunk_4x3), but the streams are two registers and constant
 * offsets (ten pointers spill) */
static void chunk_4xB_packed(const float *r, const float *c, int64_t n, float *const *dcols,
                             int64_t row0, bool last, bool add) {
    const char *rows[4], *next[4];
    const float *x[BLOCK_RN];
    for (int i = 0; i < 4; i++) {
        rows[i] = (const char *)(r + i * PACK_LD);
        next[i] = (const char *)(r + (4 + i) * PACK_LD);
    }
    for (int j = 0; j < BLOCK_RN; j++) x[j] = c + j * PACK_LD;
    v16 s[2];
    tile_chunk_few(BT_TYPE_F32, 4, BLOCK_RN, BT_MM_FPREFETCH_PACKED, false, rows, last ? NULL : next,
               n * (int64_t)sizeof(float), x, 0, n, s);
    tile_store(s, 4, BLOCK_RN, dcols, row0, 4, add);
}

static void run_blocked_few(enum bt_type type, const char *a, size_t a_nb1, int64_t k, int64_t ncols,
                        const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                        float *buf) {
    static const chunk_fn fns[BLOCK_RN + 1] = {NULL, chunk_4x1, chunk_4x2, chunk_4x3,
#if BLOCK_RN == 6
                                               chunk_4x4, chunk_4x5, chunk_4x6
#endif
    };
    const size_t es = type_bytes(type);
    float *abuf = buf, *bbuf = buf + (size_t)BT_MM_FMC * PACK_LD;
    for (int64_t jc = 0; jc < ncols; jc += BT_MM_FNC) {
        const int64_t nc = ncols - jc < BT_MM_FNC ? ncols - jc : BT_MM_FNC;
        for (int64_t pc = 0; pc < k; pc += BT_MM_FKC) {
            const int64_t kc = k - pc < BT_MM_FKC ? k - pc : BT_MM_FKC;
            /* the block's columns of this chunk, packed */
            const float *x[BT_MM_FNC];
            for (int64_t j = 0; j < nc; j++) {
                float *dst = bbuf + j * PACK_LD;
                memcpy(dst, bcols[jc + j] + pc, sizeof(float) * (size_t)kc);
                x[j] = dst;
            }
            for (int64_t ic = r0; ic < r1; ic += BT_MM_FMC) {
                const int64_t mc = r1 - ic < BT_MM_FMC ? r1 - ic : BT_MM_FMC;
                /* the block's rows of this chunk as F32, packed */
                const char *src[BT_MM_FMC];
                for (int64_t i = 0; i < mc; i++) {
                    const char *row = a + (size_t)(ic + i) * a_nb1 + (size_t)pc * es;
                    float *dst = abuf + i * PACK_LD;
                    int64_t e = 0;
                    for (; e + 16 <= kc; e += 16) v16_store(dst + e, load_w(type, row, e));
                    for (; e < kc; e++)
                        dst[e] = type == BT_TYPE_F32 ? ((const float *)row)[e]
                                                     : bt_fp16_to_fp32(((const bt_fp16_t *)row)[e]);
                    src[i] = (const char *)dst;
                }
                /* a tile's columns stay in L1 while the block's rows pass by */
                for (int64_t jr = 0; jr < nc; jr += BLOCK_RN) {
                    const int rn = (int)(nc - jr < BLOCK_RN ? nc - jr : BLOCK_RN);
                    for (int64_t ir = 0; ir < mc; ir += 4) {
                        const int nr = (int)(mc - ir < 4 ? mc - ir : 4);
                        if (rn == BLOCK_RN && nr == 4) {
                            chunk_4xB_packed((const float *)src[ir], x[jr], kc, dcols + jc + jr,
                                             ic + ir, ir + 8 > mc, pc > 0);
                            continue;
                        }
                        const char *rows[4], *next[4];
                        for (int i = 0; i < 4; i++) {
                            rows[i] = src[ir + (i < nr ? i : nr - 1)];
                            next[i] = src[ir + 4 + i < mc ? ir + 4 + i : mc - 1];
                        }
                        fns[rn](rows, ir + 4 < mc ? next : NULL, x + jr, kc, dcols + jc + jr, ic + ir,
                                nr, pc > 0);
                    }
                }
            }
        }
    }
}

/* ---- lane passes: packed transposed, 16 x 14 tiles ------------------------- */

/* The order's lane l of a chunk is a plain product of its own: elements
 * e = 16 g + l, g = 0, 1, ... G - 1 (G = ceil(kc / 16)) in turn, one FMA
 * chain per output.  So a chunk is sixteen small GEMMs (P[l] of every
 * output), vectorised along the rows: a tile is 16 rows x NR columns, and
 * a step is one vector of 16 packed weights times one column element,
 * broadcast (AVX-512: from memory within the FMA).  R then adds whole
 * vectors, no shuffles.  A pass takes lanes l and l + 8 together (2 NR
 * accumulators), so that u = P[l] + P[l+8] is added in registers; passes in
 * the order l = 0, 4, 2, 6, 1, 5, 3, 7 make the rest of R a stack: after
 * pass pi pop and add as many times as pi has trailing one bits (v[l] =
 * u[l] + u[l+4], t, s), then push.  Packed, both operands are laid out
 * [l % 8][g][l / 8][16 rows or NR columns]: a pass reads one stream of
 * weights and one of columns, in order (1-3% faster than four).
 * Without AVX-512 (a vector of 16 is two registers of 8, or four of 4) a
 * pass takes one lane and twice the columns, 16 passes in the order
 * l = 0, 8, 4, 12, 2, 10, ... (bit-reversed), the same stack giving the same
 * additions (u = P[l] + P[l+8] once lane l + 8's pass ends): AVX2's sixteen
 * registers hold 12 accumulators, the 2 weight halves and a broadcast. */
#if defined(__AVX512F__)
#define GM_NR 14 /* columns of a full tile: 28 accumulators, 2 weight vectors */
#define GM_LANES 2 /* lanes a pass takes */
#else
#define GM_NR 6 /* two 8-float registers a vector: 12 accumulators, 2 weights */
#define GM_LANES 1
#endif

/* acc + w * (x[0] broadcast) */
#if defined(__AVX512F__)
#define V16_FMA_BCAST(acc, w, x) __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(x)))
#elif defined(__AVX2__) && defined(__FMA__)
#define V16_FMA_BCAST(acc, w, x) \
    ((acc) = v16_fma((w), (v16){_mm256_set1_ps(*(x)), _mm256_set1_ps(*(x))}, (acc)))
#elif defined(FDOT_NEON)
#define V16_FMA_BCAST(acc, w, x)                                     \
    do {                                                             \
        const float32x4_t b_ = vld1q_dup_f32(x);                     \
        (acc) = v16_fma((w), (v16){{b_, b_}, {b_, b_}}, (acc));      \
    } while (0)
#else
#define V16_FMA_BCAST(acc, w, x)                                  \
    do {                                                          \
        v8 b_;                                                    \
        for (int i_ = 0; i_ < 8; i_++) b_.f[i_] = *(x);           \
        (acc) = v16_fma((w), (v16){b_, b_}, (acc));               \
    } while (0)
#endif

/* d[0 .. n) (+)= s[0 .. n), n <= 16: the order's d = d + s_c, or d = s_0 */
static inline void store_rows(float *d, v16 s, int n, bool add) {
#if defined(__AVX512F__)
    const __mmask16 m = (__mmask16)((1u << n) - 1u);
    if (add) s = _mm512_add_ps(_mm512_maskz_loadu_ps(m, d), s);
    _mm512_mask_storeu_ps(d, m, s);
#else
    if (n == 16) { /* a full tile: whole vectors (the same additions) */
        if (add) s = v16_add(v16_load(d), s);
        v16_store(d, s);
        return;
    }
    float t[16];
    v16_store(t, s);
    for (int i = 0; i < n; i++) d[i] = add ? d[i] + t[i] : t[i];
#endif
}

/* One chunk of a tile, rows row0 .. row0 + nrows (nrows <= 16) x NR
 * columns.  ap: the tile's packed weights, [l % 8][g][l / 8][16]; bp: the
 * panel's packed columns, [l % 8][g][l / 8][NR]. */
#if GM_LANES == 2
static inline __attribute__((always_inline)) void gm_tile(const int NR, const float *ap,
                                                           const float *bp, int64_t G,
                                                           float *const *dcols, int64_t row0,
                                                           int nrows, bool add) {
    static const unsigned char order[8] = {0, 4, 2, 6, 1, 5, 3, 7};
    v16 stack[3][GM_NR]; /* R's pending partial sums: a u, a v, a t */
    v16 acc[2 * GM_NR];  /* [2j]: lane l of column j, [2j + 1]: lane l + 8 */
    int depth = 0;
    for (int pi = 0; pi < 8; pi++) {
        const int l = order[pi];
        /* lanes l and l + 8 interleaved: one stream of weights, one of columns */
        const float *a0 = ap + (int64_t)l * G * 32, *a1 = a0 + 16;
        const float *b0 = bp + (int64_t)l * G * 2 * NR, *b1 = b0 + NR;
#pragma GCC unroll 32
        for (int q = 0; q < 2 * NR; q++) acc[q] = v16_zero();
        for (int64_t g = 0; g < G; g++, a0 += 32, a1 += 32, b0 += 2 * NR, b1 += 2 * NR) {
            v16 w0 = v16_load(a0), w1 = v16_load(a1);
            V16_PIN(w0);
            V16_PIN(w1);
#pragma GCC unroll 32
            for (int j = 0; j < NR; j++) {
                V16_FMA_BCAST(acc[2 * j], w0, b0 + j);
                V16_FMA_BCAST(acc[2 * j + 1], w1, b1 + j);
            }
        }
#pragma GCC unroll 32
        for (int j = 0; j < NR; j++) acc[2 * j] = v16_add(acc[2 * j], acc[2 * j + 1]);
        for (int t = pi; t & 1; t >>= 1) {
            depth--;
#pragma GCC unroll 32
            for (int j = 0; j < NR; j++) acc[2 * j] = v16_add(stack[depth][j], acc[2 * j]);
        }
        if (pi < 7) {
#pragma GCC unroll 32
            for (int j = 0; j < NR; j++) stack[depth][j] = acc[2 * j];
            depth++;
        }
    }
#pragma GCC unroll 32
    for (int j = 0; j < NR; j++) store_rows(dcols[j] + row0, acc[2 * j], nrows, add);
}
#else
static inline __attribute__((always_inline)) void gm_tile(const int NR, const float *ap,
                                                           const float *bp, int64_t G,
                                                           float *const *dcols, int64_t row0,
                                                           int nrows, bool add) {
    static const unsigned char order[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    v16 stack[4][GM_NR]; /* R's pending partial sums: a P, a u, a v, a t */
    v16 acc[GM_NR];      /* lane l of column j */
    int depth = 0;
    for (int pi = 0; pi < 16; pi++) {
        const int l = order[pi];
        const float *a = ap + (int64_t)(l % 8) * G * 32 + (l / 8) * 16;
        const float *b = bp + (int64_t)(l % 8) * G * 2 * NR + (l / 8) * NR;
#pragma GCC unroll 16
        for (int j = 0; j < NR; j++) acc[j] = v16_zero();
        for (int64_t g = 0; g < G; g++, a += 32, b += 2 * NR) {
            v16 w = v16_load(a);
            V16_PIN(w);
#pragma GCC unroll 16
            for (int j = 0; j < NR; j++) V16_FMA_BCAST(acc[j], w, b + j);
        }
        for (int t = pi; t & 1; t >>= 1) {
            depth--;
#pragma GCC unroll 16
            for (int j = 0; j < NR; j++) acc[j] = v16_add(stack[depth][j], acc[j]);
        }
        if (pi < 15) {
#pragma GCC unroll 16
            for (int j = 0; j < NR; j++) stack[depth][j] = acc[j];
            depth++;
        }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NR; j++) store_rows(dcols[j] + row0, acc[j], nrows, add);
}
#endif

typedef void (*gm_fn)(const float *ap, const float *bp, int64_t G, float *const *dcols,
                      int64_t row0, int nrows, bool add);
#define DEF_GM(NR)                                                                                \
    static void gm_##NR(const float *ap, const float *bp, int64_t G, float *const *dcols,         \
                        int64_t row0, int nrows, bool add) {                                     \
        gm_tile(NR, ap, bp, G, dcols, row0, nrows, add);                                          \
    }
#if GM_NR == 14
DEF_GM(1) DEF_GM(2) DEF_GM(3) DEF_GM(4) DEF_GM(5) DEF_GM(6) DEF_GM(7)
DEF_GM(8) DEF_GM(9) DEF_GM(10) DEF_GM(11) DEF_GM(12) DEF_GM(13) DEF_GM(14)
static const gm_fn gm_fns[GM_NR + 1] = {NULL, gm_1, gm_2,  gm_3,  gm_4,  gm_5,  gm_6, gm_7,
                                        gm_8, gm_9, gm_10, gm_11, gm_12, gm_13, gm_14};
#else
DEF_GM(1) DEF_GM(2) DEF_GM(3) DEF_GM(4) DEF_GM(5) DEF_GM(6)
static const gm_fn gm_fns[GM_NR + 1] = {NULL, gm_1, gm_2, gm_3, gm_4, gm_5, gm_6};
#endif

#if defined(__AVX512F__)
/* r[i] lane l -> r[l] lane i (a 16 x 16 transposition) */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: rows 2i, 2i+1 of elements (0, 1), (2, 3) */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + e]: rows 4i .. 4i+3 of element 4 lane + e */
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 1]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    __m512 o[16];
    for (int e = 0; e < 4; e++) { /* the four 128-bit lanes of r[e], r[4+e], r[8+e], r[12+e] */
        const __m512 a = _mm512_shuffle_f32x4(r[e], r[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 b = _mm512_shuffle_f32x4(r[e], r[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512 c = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 d = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], _MM_SHUFFLE(3, 1, 3, 1));
        o[e] = _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(2, 0, 2, 0));
        o[8 + e] = _mm512_shuffle_f32x4(a, c, _MM_SHUFFLE(3, 1, 3, 1));
        o[4 + e] = _mm512_shuffle_f32x4(b, d, _MM_SHUFFLE(2, 0, 2, 0));
        o[12 + e] = _mm512_shuffle_f32x4(b, d, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++) r[i] = o[i];
}
#endif

/* A tile's weights for elements [pc, pc + kc) as F32, [l % 8][g][l / 8][16]:
 * ap[((l % 8) G + g) 32 + (l / 8) 16 + i] = row row0 + i's element
 * pc + 16 g + l, 0 past kc and for rows i >= nrows */
static void pack_rows(enum bt_type type, const char *a, size_t a_nb1, int64_t row0, int nrows,
                      int64_t pc, int64_t kc, int64_t G, float *ap) {
    const size_t es = type_bytes(type);
    const char *rows[16];
    for (int i = 0; i < 16; i++)
        rows[i] = i < nrows ? a + (size_t)(row0 + i) * a_nb1 + (size_t)pc * es : NULL;
#if defined(__AVX512F__)
    for (int64_t g = 0; g < G; g++) {
        const int64_t e = 16 * g;
        const int n = kc - e < 16 ? (int)(kc - e) : 16;
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = !rows[i] ? _mm512_setzero_ps()
                   : n == 16 ? load_w(type, rows[i], e)
                             : load_w_tail(type, rows[i], e, n);
        transpose16(r);
        for (int l = 0; l < 16; l++) _mm512_storeu_ps(ap + ((l % 8) * G + g) * 32 + l / 8 * 16, r[l]);
    }
#else
    int64_t g0 = 0;
#if defined(__AVX2__) && defined(__F16C__)
    /* whole groups: 8 rows x 8 elements transposed in registers */
    for (; g0 < kc / 16; g0++)
        for (int h = 0; h < 2; h++)
            for (int i0 = 0; i0 < 16; i0 += 8) {
                const int64_t e = 16 * g0 + 8 * h;
                __m256 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = !rows[i0 + i]              ? _mm256_setzero_ps()
                           : type == BT_TYPE_F32 ? _mm256_loadu_ps((const float *)rows[i0 + i] + e)
                                                 : _mm256_cvtph_ps(_mm_loadu_si128(
                                                       (const __m128i *)((const bt_fp16_t *)rows[i0 + i] + e)));
                bt_cpu_transpose8(r);
                for (int l = 0; l < 8; l++) _mm256_storeu_ps(ap + (l * G + g0) * 32 + h * 16 + i0, r[l]);
            }
#endif
    for (int i = 0; i < 16; i++)
        for (int64_t e = 16 * g0; e < 16 * G; e++) {
            float w = 0.0f;
            if (rows[i] && e < kc)
                w = type == BT_TYPE_F32 ? ((const float *)rows[i])[e]
                                        : bt_fp16_to_fp32(((const bt_fp16_t *)rows[i])[e]);
            ap[((e % 8) * G + e / 16) * 32 + e % 16 / 8 * 16 + i] = w;
        }
#endif
}

/* A panel of nr columns for elements [pc, pc + kc), [l % 8][g][l / 8][nr]:
 * bp[((l % 8) G + g) 2 nr + (l / 8) nr + j] = column j's element
 * pc + 16 g + l, 0 past kc */
static void pack_cols(const float *const *bcols, int nr, int64_t pc, int64_t kc, int64_t G,
                      float *bp) {
#if defined(__AVX512F__)
    const __mmask16 m = (__mmask16)((1u << nr) - 1u);
    for (int64_t g = 0; g < G; g++) {
        const int64_t e = pc + 16 * g;
        const int n = kc - 16 * g < 16 ? (int)(kc - 16 * g) : 16;
        __m512 r[16];
        for (int j = 0; j < 16; j++)
            r[j] = j >= nr    ? _mm512_setzero_ps()
                   : n == 16 ? v16_load(bcols[j] + e)
                             : load_x_tail(bcols[j] + e, n);
        transpose16(r);
        for (int l = 0; l < 16; l++)
            _mm512_mask_storeu_ps(bp + ((l % 8) * G + g) * 2 * nr + l / 8 * nr, m, r[l]);
    }
#else
    int64_t g0 = 0;
#if defined(__AVX2__)
    /* whole groups: the nr (<= 8) columns x 8 elements transposed in registers */
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (; g0 < kc / 16; g0++)
        for (int h = 0; h < 2; h++) {
            const int64_t e = pc + 16 * g0 + 8 * h;
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = j < nr ? _mm256_loadu_ps(bcols[j] + e) : _mm256_setzero_ps();
            bt_cpu_transpose8(r);
            for (int l = 0; l < 8; l++) _mm256_maskstore_ps(bp + (l * G + g0) * 2 * nr + h * nr, m, r[l]);
        }
#endif
    for (int j = 0; j < nr; j++) {
        const float *x = bcols[j] + pc;
        for (int64_t e = 16 * g0; e < 16 * G; e++)
            bp[((e % 8) * G + e / 16) * 2 * nr + e % 16 / 8 * nr + j] = e < kc ? x[e] : 0.0f;
    }
#endif
}

static void run_lanes(enum bt_type type, const char *a, size_t a_nb1, int64_t k, int64_t ncols,
                      const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                      float *buf) {
    float *abuf = buf, *bbuf = buf + (size_t)BT_MM_FMC * BT_MM_FKC;
    for (int64_t jc = 0; jc < ncols; jc += BT_MM_FNC) {
        const int64_t nc = ncols - jc < BT_MM_FNC ? ncols - jc : BT_MM_FNC;
        for (int64_t pc = 0; pc < k; pc += BT_MM_FKC) {
            const int64_t kc = k - pc < BT_MM_FKC ? k - pc : BT_MM_FKC, G = (kc + 15) / 16;
            /* the block's columns of this chunk, panels of GM_NR */
            for (int64_t jr = 0; jr < nc; jr += GM_NR) {
                const int nr = (int)(nc - jr < GM_NR ? nc - jr : GM_NR);
                pack_cols(bcols + jc + jr, nr, pc, kc, G, bbuf + jr * 16 * G);
            }
            for (int64_t ic = r0; ic < r1; ic += BT_MM_FMC) {
                const int64_t mc = r1 - ic < BT_MM_FMC ? r1 - ic : BT_MM_FMC;
                /* the block's rows of this chunk as F32, tiles of 16 */
                for (int64_t ir = 0; ir < mc; ir += 16)
                    pack_rows(type, a, a_nb1, ic + ir, (int)(mc - ir < 16 ? mc - ir : 16), pc, kc, G,
                              abuf + ir * 16 * G);
                /* a panel's columns are reused by the block's tiles */
                for (int64_t jr = 0; jr < nc; jr += GM_NR) {
                    const int nr = (int)(nc - jr < GM_NR ? nc - jr : GM_NR);
                    for (int64_t ir = 0; ir < mc; ir += 16)
                        gm_fns[nr](abuf + ir * 16 * G, bbuf + jr * 16 * G, G, dcols + jc + jr, ic + ir,
                                   (int)(mc - ir < 16 ? mc - ir : 16), pc > 0);
                }
            }
        }
    }
}

size_t bt_cpu_fdot_buf_bytes(int64_t ncols) {
    if (ncols < BT_MM_FGEMM_COLS) return 0; /* the direct path packs nothing */
    const int64_t nc = ncols < BT_MM_FNC ? ncols : BT_MM_FNC;
    /* both blocked paths (the lane passes need BT_MM_FKC of the PACK_LD a
     * row or column): the size grows with ncols, so that a buffer for a
     * plan's widest job holds every job */
    return (size_t)(BT_MM_FMC + nc) * PACK_LD * sizeof(float);
}

void bt_cpu_fdot_rows(enum bt_type type, const char *a, size_t a_nb1, int64_t k, int64_t ncols,
                      const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                      float *buf, struct bt_cpu_next after) {
    BT_ASSERT(type == BT_TYPE_F32 || type == BT_TYPE_F16);
    if (ncols <= 0 || r1 <= r0) return;
    if (k == 0) { /* no chunks: every sum is 0 */
        for (int64_t j = 0; j < ncols; j++)
            for (int64_t r = r0; r < r1; r++) dcols[j][r] = 0.0f;
        return;
    }
    if (ncols < BT_MM_FGEMM_COLS)
        run_direct(type, a, a_nb1, k, ncols, bcols, dcols, r0, r1, after);
    else if (ncols < BT_MM_FLANE_COLS)
        run_blocked_few(type, a, a_nb1, k, ncols, bcols, dcols, r0, r1, buf);
    else
        run_lanes(type, a, a_nb1, k, ncols, bcols, dcols, r0, r1, buf);
}
