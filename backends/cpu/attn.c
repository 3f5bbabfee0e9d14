/* attn.c - FLASH_ATTN on the CPU: softmax(s * q k^T + mask) v with an online
 * softmax, one pass over the cells, no [N, T] score matrix.
 *
 *   q    F32 [D, H, T]        k [D, Hk, N], v [Dv, Hk, N] (F32, F16, Q8_0)
 *   mask F32/F16 [N, >= T]    out F32 [Dv, H, T] contiguous
 *   sinks F32 [H] or none (gpt-oss: one more logit per head in the softmax)
 *
 * Work: a unit is a block of up to R query rows and one kv head hk; its
 * "rows" are the R x group (query row, q head) pairs that read kv head hk.
 * Threads take the units from the node's shared counter (or, without one,
 * in turn: unit u to thread u % nth), so a causal prompt's long and short
 * rows spread evenly and a slowed thread takes fewer; nothing is reduced
 * across threads.  A unit walks the cells in tiles of 16: a tile that every row of
 * the block has masked is skipped whole; otherwise k's 16 rows are converted
 * to F32 once and transposed ([D][16]: a lane per cell) and v's converted
 * ([16][Dv]), and every row of the block is computed against them.
 *
 * Determinism: a row's result depends only on its own q row and on the
 * sequence of cells it sees (the cells whose mask is not -inf and whose score
 * is not -inf, in increasing cell order, with their k, v and mask values).
 * Each cell's step is one fixed sequence of IEEE operations, whatever the
 * tile, the block, the other rows or the thread:
 *     d = fma(q[D-1], k[D-1], ... fma(q[0], k[0], 0))      score: one FMA chain
 *     s = d * scale + mask
 *     M' = max(M, s)            (M: the running maximum before the cell)
 *     x  = exp_fixed(min(s, M) - max(s, M))
 *     s > M:  acc = acc * x + v        S = S * x + 1     (new maximum)
 *     else:   acc = fma(x, v, acc)     S = S + x
 * where exp_fixed is one polynomial (below) and the vector lanes of acc are
 * its elements.  A sink s (sinks[h]) is one more step after the last cell,
 * in plain C in every variant: s > M: x = exp_fixed(M - s), acc = acc * x,
 * S = S * x + 1; else S = S + exp_fixed(s - M) (no v: it only takes its
 * share of the probability, as ggml applies it after the cells).  A masked
 * cell takes no part in a row's maximum, sum or accumulator (a vector lane may compute its score, which is then dropped),
 * so other sequences' cells, future positions and empty cells leave no
 * trace.  The tile only decides which cells are handled together, never an
 * operation of a row, so the result is bitwise the same for any thread
 * count, any block (a decode step's single row or a prompt's block), any
 * number of other rows in the batch, and any placement of the cells in the
 * cache that keeps their relative order.
 *
 * Instruction sets: the kernels (k tile, scores, running maximum and exp,
 * accumulation; the sum S is plain C in all) come in
 * AVX-512, AVX2+FMA+F16C and plain C on x86-64, NEON and plain C on aarch64
 * (NEON's running maximum in scalar, its exp in vectors); bt_cpu_flash_attn
 * takes the widest the CPU has at run time (whatever -march the file was
 * built with), the plain C one under p->reference.  All do the same
 * operations lane by lane
 * (the plain C one with fmaf), so they give the same bits: test_attn.c runs
 * each variant the CPU has against the plain one.  This file is built with
 * -ffp-contract=off so that the compiler fuses nothing on its own.
 *
 * Scratch per thread: see scratch_layout.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "cpu_impl.h"
#include "cpu_variant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_X86 1
#include <cpuid.h>
#include <immintrin.h>
#define TARGET_AVX512 __attribute__((target("avx512f,fma,f16c")))
#define TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define ATTN_NEON 1
#include <arm_neon.h>
#endif

#define TILE 16      /* cells per tile: one AVX-512 vector of scores */

#define ROWS_MAX 32  /* rows (query row x q head) per unit, when group allows */
#define PF_DIST 32   /* decode: cells ahead whose k and v rows are prefetched */

/* ---- exp_fixed: exp(x) for x <= 0 (and -inf), one sequence of operations ---- *
 * Cephes' expf: n = round(x log2 e), r = x - n ln2 (in two parts), a degree-5
 * polynomial, times 2^n; below -87 the result is 0.  About 1 ulp. */
#define EXP_LO (-87.0f)
#define EXP_LOG2E 1.44269504088896341f
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

static float exp_fixed(float x) {
    if (!(x >= EXP_LO)) return x < EXP_LO ? 0.0f : x; /* -inf, tiny: 0; NaN stays */
    const float n = nearbyintf(x * EXP_LOG2E);
    float r = fmaf(n, -EXP_C1, x);
    r = fmaf(n, -EXP_C2, r);
    float p = EXP_P0;
    p = fmaf(p, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    float y = fmaf(p, r * r, r);
    y = y + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return y * two_n;
}

/* ---- the kernels of one instruction set ------------------------------------- */

/* kt [D][TILE] F32 from nj (<= TILE) F16 rows of D at base + c * stride
 * (cells c >= nj: 0); returns false when D does not suit the variant. */
typedef bool (*attn_k_tile_fn)(const char *base, size_t stride, int nj, int64_t D, float *kt);
/* n F16 -> F32 (exact, so every variant gives the same bits) */
typedef void (*attn_f16_row_fn)(const bt_fp16_t *x, float *y, int64_t n);
/* s[r][c] = chain(q_r, kt[:, c]) * scale + mt[r / group][c] for r < nr */
typedef void (*attn_scores_fn)(const float *kt, int64_t D, const float *const *qp, int nr, int group,
                               const float *mt, float scale, float *s);
/* One row's tile of scores s [TILE] with its mask values mr [TILE] and
 * running maximum *M: the cells it skips (mask or score -inf), the running
 * maximum before each cell mp[c] (exact, so however it is found), the cells
 * that raise it (s[c] > mp[c]), and in place of the scores
 *     x[c] = exp_fixed(min(s[c], mp[c]) - max(s[c], mp[c]));
 * *M becomes the maximum after the tile. */
typedef void (*attn_softmax_fn)(float *s, const float *mr, float *M, uint32_t *newb, uint32_t *skip);
/* acc [Dv] and the sum *S over the cells c < TILE not in skip: new-maximum
 * cells acc = acc * x[c] + v_c, S = S * x[c] + 1; others acc = fma(x[c], v_c,
 * acc), S = S + x[c] (v_c = v + c * vs) */
typedef void (*attn_accum_fn)(float *acc, float *S, int64_t Dv, const float *v, int64_t vs, const float *x,
                              uint32_t newb, uint32_t skip);
/* the same for two rows, every cell seen and none a new maximum */
typedef void (*attn_accum2_fn)(float *a0, float *a1, float *S0, float *S1, int64_t Dv, const float *v, int64_t vs,
                               const float *x0, const float *x1);

struct attn_isa {
    const char *name;
    bool (*available)(void);
    attn_k_tile_fn k_tile_f16;
    attn_f16_row_fn f16_row;
    attn_scores_fn scores;
    attn_softmax_fn softmax;
    attn_accum_fn accum;
    attn_accum2_fn accum2;
};

/* ---- plain C ---- */

static bool c_available(void) { return true; }

static bool c_k_tile_f16(const char *base, size_t stride, int nj, int64_t D, float *kt) {
    for (int c = 0; c < TILE; c++) {
        const bt_fp16_t *row = (const bt_fp16_t *)(base + (size_t)c * stride);
        for (int64_t i = 0; i < D; i++) kt[i * TILE + c] = c < nj ? bt_fp16_to_fp32(row[i]) : 0.0f;
    }
    return true;
}

static void c_f16_row(const bt_fp16_t *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = bt_fp16_to_fp32(x[i]);
}

static void c_scores(const float *kt, int64_t D, const float *const *qp, int nr, int group, const float *mt,
                     float scale, float *s) {
    for (int r = 0; r < nr; r++) {
        float d[TILE] = {0};
        for (int64_t i = 0; i < D; i++)
            for (int c = 0; c < TILE; c++) d[c] = fmaf(qp[r][i], kt[i * TILE + c], d[c]);
        const float *m = mt + (r / group) * TILE;
        for (int c = 0; c < TILE; c++) s[r * TILE + c] = d[c] * scale + m[c];
    }
}

/* the softmax's cells skipped and raising the maximum, and the maximum
 * before each cell mp[c], in scalar (c_softmax's and NEON's) */
static inline void softmax_marks(const float *s, const float *mr, float *M, uint32_t *newb, uint32_t *skip,
                                 float *mp) {
    float m = *M;
    uint32_t nb = 0, sk = 0;
    for (int c = 0; c < TILE; c++) {
        mp[c] = m;
        if (mr[c] == -INFINITY || s[c] == -INFINITY) {
            sk |= 1u << c;
        } else if (s[c] > m) {
            nb |= 1u << c;
            m = s[c];
        }
    }
    *M = m;
    *newb = nb;
    *skip = sk;
}

static void c_softmax(float *s, const float *mr, float *M, uint32_t *newb, uint32_t *skip) {
    float mp[TILE];
    softmax_marks(s, mr, M, newb, skip, mp);
    for (int c = 0; c < TILE; c++) {
        const float lo = s[c] < mp[c] ? s[c] : mp[c], hi = s[c] < mp[c] ? mp[c] : s[c];
        s[c] = exp_fixed(lo - hi);
    }
}

/* the running sum: the same scalar code in every variant (the accumulation
 * kernels start with it so that its chain of dependent adds overlaps their
 * vector work) */
static inline void sum_update(float *S, const float *x, uint32_t newb, uint32_t skip) {
    float sum = *S;
    for (int c = 0; c < TILE; c++) {
        if (skip >> c & 1) continue;
        sum = newb >> c & 1 ? sum * x[c] + 1.0f : sum + x[c];
    }
    *S = sum;
}

/* acc alone (no sum), plain C: the accumulation of c_accum and the tail of AVX2's */
static void c_accum_v(float *acc, int64_t Dv, const float *v, int64_t vs, const float *x, uint32_t newb,
                      uint32_t skip) {
    for (int c = 0; c < TILE; c++) {
        if (skip >> c & 1) continue;
        const float *vc = v + c * vs;
        if (newb >> c & 1)
            for (int64_t i = 0; i < Dv; i++) acc[i] = acc[i] * x[c] + vc[i];
        else
            for (int64_t i = 0; i < Dv; i++) acc[i] = fmaf(x[c], vc[i], acc[i]);
    }
}

static void c_accum(float *acc, float *S, int64_t Dv, const float *v, int64_t vs, const float *x, uint32_t newb,
                    uint32_t skip) {
    sum_update(S, x, newb, skip);
    c_accum_v(acc, Dv, v, vs, x, newb, skip);
}

static void c_accum2(float *a0, float *a1, float *S0, float *S1, int64_t Dv, const float *v, int64_t vs,
                     const float *x0, const float *x1) {
    c_accum(a0, S0, Dv, v, vs, x0, 0, 0);
    c_accum(a1, S1, Dv, v, vs, x1, 0, 0);
}

#ifdef ATTN_X86
/* ---- AVX-512 ---- */

/* F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know it) */
static bool has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static bool avx512_available(void) { return __builtin_cpu_supports("avx512f") && has_f16c(); }

TARGET_AVX512 static bool avx512_k_tile_f16(const char *base, size_t stride, int nj, int64_t D, float *kt) {
    if (D % 16) return false;
    for (int64_t i0 = 0; i0 < D; i0 += 16) {
        __m512 r[16];
        for (int c = 0; c < 16; c++)
            r[c] = c < nj ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(base + (size_t)c * stride) + i0 / 16))
                          : _mm512_setzero_ps();
        bt_cpu_transpose16(r);
        for (int i = 0; i < 16; i++) _mm512_storeu_ps(kt + (i0 + i) * TILE, r[i]);
    }
    return true;
}

TARGET_AVX512 static void avx512_f16_row(const bt_fp16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i))));
    for (; i < n; i++) y[i] = bt_fp16_to_fp32(x[i]);
}

/* NR rows at once (NR accumulators, one load of kt per i for all) */
#define AVX512_SCORES_N(NR)                                                                                 \
    TARGET_AVX512 static void avx512_scores_##NR(const float *kt, int64_t D, const float *const *qp,       \
                                                 int r0, int group, const float *mt, float scale, float *s) { \
        __m512 a[NR];                                                                                       \
        for (int r = 0; r < NR; r++) a[r] = _mm512_setzero_ps();                                            \
        for (int64_t i = 0; i < D; i++) {                                                                   \
            const __m512 kv = _mm512_loadu_ps(kt + i * TILE);                                               \
            for (int r = 0; r < NR; r++) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(qp[r0 + r][i]), kv, a[r]);   \
        }                                                                                                   \
        const __m512 sc = _mm512_set1_ps(scale);                                                            \
        for (int r = 0; r < NR; r++)                                                                        \
            _mm512_storeu_ps(s + (r0 + r) * TILE,                                                           \
                             _mm512_add_ps(_mm512_mul_ps(a[r], sc), _mm512_loadu_ps(mt + ((r0 + r) / group) * TILE))); \
    }
AVX512_SCORES_N(8)
AVX512_SCORES_N(4)
AVX512_SCORES_N(2)
AVX512_SCORES_N(1)

TARGET_AVX512 static void avx512_scores(const float *kt, int64_t D, const float *const *qp, int nr, int group,
                                        const float *mt, float scale, float *s) {
    int r = 0;
    /* each row's FMA chain is latency-bound alone: as many rows at once as there are */
    for (; r + 8 <= nr; r += 8) avx512_scores_8(kt, D, qp, r, group, mt, scale, s);
    if (r + 4 <= nr) avx512_scores_4(kt, D, qp, r, group, mt, scale, s), r += 4;
    if (r + 2 <= nr) avx512_scores_2(kt, D, qp, r, group, mt, scale, s), r += 2;
    if (r < nr) avx512_scores_1(kt, D, qp, r, group, mt, scale, s);
}

TARGET_AVX512 static __m512 avx512_exp_fixed(__m512 x) {
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_GE_OQ);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_C1), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-EXP_C2), r);
    __m512 p = _mm512_set1_ps(EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(ok, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

/* the running maximum by a log-step prefix max over the lanes of the cells
 * that count (seen, score not NaN) */
TARGET_AVX512 static void avx512_softmax(float *s, const float *mr, float *M, uint32_t *newb, uint32_t *skip) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY), a = _mm512_loadu_ps(s);
    const __mmask16 seen = _mm512_cmp_ps_mask(a, ninf, _CMP_NEQ_UQ) &
                           _mm512_cmp_ps_mask(_mm512_loadu_ps(mr), ninf, _CMP_NEQ_UQ);
    const __mmask16 counts = seen & _mm512_cmp_ps_mask(a, ninf, _CMP_GT_OQ);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 p = _mm512_mask_mov_ps(ninf, counts, a);
    for (int k = 1; k < 16; k *= 2)
        p = _mm512_max_ps(p, _mm512_mask_permutexvar_ps(ninf, (__mmask16)(0xFFFFu << k),
                                                        _mm512_sub_epi32(lane, _mm512_set1_epi32(k)), p));
    const __m512 m_in = _mm512_set1_ps(*M);
    const __m512 b = _mm512_max_ps(m_in, _mm512_mask_permutexvar_ps(ninf, (__mmask16)0xFFFEu,
                                                                    _mm512_sub_epi32(lane, _mm512_set1_epi32(1)), p));
    const float last = _mm512_cvtss_f32(_mm512_permutexvar_ps(_mm512_set1_epi32(15), p));
    if (last > *M) *M = last;
    *newb = counts & _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ);
    *skip = (uint16_t)~seen;
    const __mmask16 lt = _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
    const __m512 lo = _mm512_mask_blend_ps(lt, b, a), hi = _mm512_mask_blend_ps(lt, a, b);
    _mm512_storeu_ps(s, avx512_exp_fixed(_mm512_sub_ps(lo, hi)));
}

/* the Dv elements in chunks of up to 4 vectors kept in registers over the tile */
TARGET_AVX512 static void avx512_accum(float *acc, float *S, int64_t Dv, const float *v, int64_t vs, const float *x,
                                       uint32_t newb, uint32_t skip) {
    sum_update(S, x, newb, skip);
    for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
        __mmask16 m[4];
        __m512 a[4];
        for (int l = 0; l < 4; l++) {
            const int64_t left = Dv - d0 - 16 * l;
            m[l] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
            a[l] = _mm512_maskz_loadu_ps(m[l], acc + d0 + 16 * l);
        }
        for (int c = 0; c < TILE; c++) {
            if (skip >> c & 1) continue;
            const float *vc = v + c * vs + d0;
            const __m512 xc = _mm512_set1_ps(x[c]);
            if (newb >> c & 1)
                for (int l = 0; l < 4; l++)
                    a[l] = _mm512_add_ps(_mm512_mul_ps(a[l], xc), _mm512_maskz_loadu_ps(m[l], vc + 16 * l));
            else
                for (int l = 0; l < 4; l++) a[l] = _mm512_fmadd_ps(xc, _mm512_maskz_loadu_ps(m[l], vc + 16 * l), a[l]);
        }
        for (int l = 0; l < 4; l++) _mm512_mask_storeu_ps(acc + d0 + 16 * l, m[l], a[l]);
    }
}

TARGET_AVX512 static void avx512_accum2(float *a0, float *a1, float *S0, float *S1, int64_t Dv, const float *v,
                                        int64_t vs, const float *x0, const float *x1) {
    sum_update(S0, x0, 0, 0);
    sum_update(S1, x1, 0, 0);
    for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
        __mmask16 m[4];
        __m512 p[4], q[4];
        for (int l = 0; l < 4; l++) {
            const int64_t left = Dv - d0 - 16 * l;
            m[l] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
            p[l] = _mm512_maskz_loadu_ps(m[l], a0 + d0 + 16 * l);
            q[l] = _mm512_maskz_loadu_ps(m[l], a1 + d0 + 16 * l);
        }
        for (int c = 0; c < TILE; c++) {
            const float *vc = v + c * vs + d0;
            const __m512 y0 = _mm512_set1_ps(x0[c]), y1 = _mm512_set1_ps(x1[c]);
            for (int l = 0; l < 4; l++) {
                const __m512 vv = _mm512_maskz_loadu_ps(m[l], vc + 16 * l);
                p[l] = _mm512_fmadd_ps(y0, vv, p[l]);
                q[l] = _mm512_fmadd_ps(y1, vv, q[l]);
            }
        }
        for (int l = 0; l < 4; l++) {
            _mm512_mask_storeu_ps(a0 + d0 + 16 * l, m[l], p[l]);
            _mm512_mask_storeu_ps(a1 + d0 + 16 * l, m[l], q[l]);
        }
    }
}

/* ---- AVX2 + FMA + F16C ---- */

static bool avx2_available(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
}

TARGET_AVX2 static bool avx2_k_tile_f16(const char *base, size_t stride, int nj, int64_t D, float *kt) {
    if (D % 8) return false;
    for (int64_t i0 = 0; i0 < D; i0 += 8)
        for (int c0 = 0; c0 < TILE; c0 += 8) {
            __m256 r[8];
            for (int c = 0; c < 8; c++)
                r[c] = c0 + c < nj ? _mm256_cvtph_ps(_mm_loadu_si128(
                                         (const __m128i *)((const bt_fp16_t *)(base + (size_t)(c0 + c) * stride) + i0)))
                                   : _mm256_setzero_ps();
            bt_cpu_transpose8(r);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(kt + (i0 + i) * TILE + c0, r[i]);
        }
    return true;
}

TARGET_AVX2 static void avx2_f16_row(const bt_fp16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = bt_fp16_to_fp32(x[i]);
}

#define AVX2_SCORES_N(NR)                                                                                   \
    TARGET_AVX2 static void avx2_scores_##NR(const float *kt, int64_t D, const float *const *qp, int r0,    \
                                             int group, const float *mt, float scale, float *s) {           \
        __m256 a[NR][2];                                                                                    \
        for (int r = 0; r < NR; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();                               \
        for (int64_t i = 0; i < D; i++) {                                                                   \
            const __m256 k0 = _mm256_loadu_ps(kt + i * TILE), k1 = _mm256_loadu_ps(kt + i * TILE + 8);      \
            for (int r = 0; r < NR; r++) {                                                                  \
                const __m256 qv = _mm256_set1_ps(qp[r0 + r][i]);                                            \
                a[r][0] = _mm256_fmadd_ps(qv, k0, a[r][0]);                                                 \
                a[r][1] = _mm256_fmadd_ps(qv, k1, a[r][1]);                                                 \
            }                                                                                               \
        }                                                                                                   \
        const __m256 sc = _mm256_set1_ps(scale);                                                            \
        for (int r = 0; r < NR; r++)                                                                        \
            for (int h = 0; h < 2; h++)                                                                     \
                _mm256_storeu_ps(s + (r0 + r) * TILE + 8 * h,                                               \
                                 _mm256_add_ps(_mm256_mul_ps(a[r][h], sc),                                  \
                                               _mm256_loadu_ps(mt + ((r0 + r) / group) * TILE + 8 * h)));   \
    }
AVX2_SCORES_N(4)
AVX2_SCORES_N(2)
AVX2_SCORES_N(1)

TARGET_AVX2 static void avx2_scores(const float *kt, int64_t D, const float *const *qp, int nr, int group,
                                    const float *mt, float scale, float *s) {
    int r = 0;
    for (; r + 4 <= nr; r += 4) avx2_scores_4(kt, D, qp, r, group, mt, scale, s);
    if (r + 2 <= nr) avx2_scores_2(kt, D, qp, r, group, mt, scale, s), r += 2;
    if (r < nr) avx2_scores_1(kt, D, qp, r, group, mt, scale, s);
}

TARGET_AVX2 static __m256 avx2_exp_fixed(__m256 x) {
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C2), r);
    __m256 p = _mm256_set1_ps(EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    /* n is in [-126, 0] where ok; elsewhere the lane is cleared below */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(ok, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* as avx512_softmax, a half of 8 cells at a time, the maximum carried over */
TARGET_AVX2 static void avx2_softmax(float *s, const float *mr, float *M, uint32_t *newb, uint32_t *skip) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    float carry = *M;
    uint32_t nb = 0, sk = 0;
    for (int h = 0; h < TILE; h += 8) {
        const __m256 a = _mm256_loadu_ps(s + h);
        const __m256 seen = _mm256_and_ps(_mm256_cmp_ps(a, ninf, _CMP_NEQ_UQ),
                                          _mm256_cmp_ps(_mm256_loadu_ps(mr + h), ninf, _CMP_NEQ_UQ));
        const __m256 counts = _mm256_and_ps(seen, _mm256_cmp_ps(a, ninf, _CMP_GT_OQ));
        __m256 p = _mm256_blendv_ps(ninf, a, counts);
        p = _mm256_max_ps(p, _mm256_blend_ps(_mm256_permutevar8x32_ps(p, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6)),
                                             ninf, 0x01));
        p = _mm256_max_ps(p, _mm256_blend_ps(_mm256_permutevar8x32_ps(p, _mm256_setr_epi32(0, 0, 0, 1, 2, 3, 4, 5)),
                                             ninf, 0x03));
        p = _mm256_max_ps(p, _mm256_blend_ps(_mm256_permutevar8x32_ps(p, _mm256_setr_epi32(0, 0, 0, 0, 0, 1, 2, 3)),
                                             ninf, 0x0F));
        const __m256 m_in = _mm256_set1_ps(carry);
        const __m256 b = _mm256_max_ps(
            m_in, _mm256_blend_ps(_mm256_permutevar8x32_ps(p, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6)), ninf, 0x01));
        const float last = _mm256_cvtss_f32(_mm256_permutevar8x32_ps(p, _mm256_set1_epi32(7)));
        if (last > carry) carry = last;
        nb |= (uint32_t)_mm256_movemask_ps(_mm256_and_ps(counts, _mm256_cmp_ps(a, b, _CMP_GT_OQ))) << h;
        sk |= (uint32_t)(~_mm256_movemask_ps(seen) & 0xFF) << h;
        const __m256 lt = _mm256_cmp_ps(a, b, _CMP_LT_OQ);
        const __m256 lo = _mm256_blendv_ps(b, a, lt), hi = _mm256_blendv_ps(a, b, lt);
        _mm256_storeu_ps(s + h, avx2_exp_fixed(_mm256_sub_ps(lo, hi)));
    }
    *M = carry;
    *newb = nb;
    *skip = sk;
}

/* 8-element chunks; a tail of Dv % 8 elements in plain C (the same operations) */
TARGET_AVX2 static void avx2_accum(float *acc, float *S, int64_t Dv, const float *v, int64_t vs, const float *x,
                                   uint32_t newb, uint32_t skip) {
    sum_update(S, x, newb, skip);
    int64_t d0 = 0;
    for (; d0 + 32 <= Dv; d0 += 32) {
        __m256 a[4];
        for (int l = 0; l < 4; l++) a[l] = _mm256_loadu_ps(acc + d0 + 8 * l);
        for (int c = 0; c < TILE; c++) {
            if (skip >> c & 1) continue;
            const float *vc = v + c * vs + d0;
            const __m256 xc = _mm256_set1_ps(x[c]);
            if (newb >> c & 1)
                for (int l = 0; l < 4; l++) a[l] = _mm256_add_ps(_mm256_mul_ps(a[l], xc), _mm256_loadu_ps(vc + 8 * l));
            else
                for (int l = 0; l < 4; l++) a[l] = _mm256_fmadd_ps(xc, _mm256_loadu_ps(vc + 8 * l), a[l]);
        }
        for (int l = 0; l < 4; l++) _mm256_storeu_ps(acc + d0 + 8 * l, a[l]);
    }
    if (d0 < Dv) c_accum_v(acc + d0, Dv - d0, v + d0, vs, x, newb, skip);
}

TARGET_AVX2 static void avx2_accum2(float *a0, float *a1, float *S0, float *S1, int64_t Dv, const float *v,
                                    int64_t vs, const float *x0, const float *x1) {
    sum_update(S0, x0, 0, 0);
    sum_update(S1, x1, 0, 0);
    int64_t d0 = 0;
    for (; d0 + 32 <= Dv; d0 += 32) {
        __m256 p[4], q[4];
        for (int l = 0; l < 4; l++) {
            p[l] = _mm256_loadu_ps(a0 + d0 + 8 * l);
            q[l] = _mm256_loadu_ps(a1 + d0 + 8 * l);
        }
        for (int c = 0; c < TILE; c++) {
            const float *vc = v + c * vs + d0;
            const __m256 y0 = _mm256_set1_ps(x0[c]), y1 = _mm256_set1_ps(x1[c]);
            for (int l = 0; l < 4; l++) {
                const __m256 vv = _mm256_loadu_ps(vc + 8 * l);
                p[l] = _mm256_fmadd_ps(y0, vv, p[l]);
                q[l] = _mm256_fmadd_ps(y1, vv, q[l]);
            }
        }
        for (int l = 0; l < 4; l++) {
            _mm256_storeu_ps(a0 + d0 + 8 * l, p[l]);
            _mm256_storeu_ps(a1 + d0 + 8 * l, q[l]);
        }
    }
    if (d0 < Dv) {
        c_accum_v(a0 + d0, Dv - d0, v + d0, vs, x0, 0, 0);
        c_accum_v(a1 + d0, Dv - d0, v + d0, vs, x1, 0, 0);
    }
}
#endif /* ATTN_X86 */

#ifdef ATTN_NEON
/* ---- NEON (every aarch64 CPU): the plain C kernels' operations, 4 lanes ---- */

static bool neon_available(void) { return true; }

/* 4 x 4 blocks: four rows' D elements converted, then transposed */
static bool neon_k_tile_f16(const char *base, size_t stride, int nj, int64_t D, float *kt) {
    if (D % 4) return false;
    for (int64_t i0 = 0; i0 < D; i0 += 4)
        for (int c0 = 0; c0 < TILE; c0 += 4) {
            float32x4_t r[4];
            for (int c = 0; c < 4; c++)
                r[c] = c0 + c < nj ? vcvt_f32_f16(vreinterpret_f16_u16(
                                         vld1_u16((const uint16_t *)(base + (size_t)(c0 + c) * stride) + i0)))
                                   : vdupq_n_f32(0.0f);
            const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
            const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
            const float32x4_t o[4] = {
                vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))),
                vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3))),
                vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2))),
                vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)))};
            for (int i = 0; i < 4; i++) vst1q_f32(kt + (i0 + i) * TILE + c0, o[i]);
        }
    return true;
}

static void neon_f16_row(const bt_fp16_t *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)x + i))));
    for (; i < n; i++) y[i] = bt_fp16_to_fp32(x[i]);
}

/* c_scores per row: the 16 cells' chains in 4 vectors (vfmaq: one rounding) */
static void neon_scores(const float *kt, int64_t D, const float *const *qp, int nr, int group, const float *mt,
                        float scale, float *s) {
    for (int r = 0; r < nr; r++) {
        float32x4_t d[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (int64_t i = 0; i < D; i++) {
            const float32x4_t qv = vdupq_n_f32(qp[r][i]);
            for (int h = 0; h < 4; h++) d[h] = vfmaq_f32(d[h], qv, vld1q_f32(kt + i * TILE + 4 * h));
        }
        const float *m = mt + (r / group) * TILE;
        for (int h = 0; h < 4; h++)
            vst1q_f32(s + r * TILE + 4 * h, vaddq_f32(vmulq_f32(d[h], vdupq_n_f32(scale)), vld1q_f32(m + 4 * h)));
    }
}

/* exp_fixed in 4 lanes (a lane below EXP_LO, -inf or NaN gives 0, as AVX2's) */
static float32x4_t neon_exp_fixed(float32x4_t x) {
    const uint32x4_t ok = vcgeq_f32(x, vdupq_n_f32(EXP_LO));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(EXP_LOG2E)));
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-EXP_C1));
    r = vfmaq_f32(r, n, vdupq_n_f32(-EXP_C2));
    float32x4_t p = vdupq_n_f32(EXP_P0);
    p = vfmaq_f32(vdupq_n_f32(EXP_P1), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P5), p, r);
    float32x4_t y = vfmaq_f32(r, p, vmulq_f32(r, r));
    y = vaddq_f32(y, vdupq_n_f32(1.0f));
    /* n is in [-126, 0] where ok; elsewhere the lane is cleared below */
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vreinterpretq_f32_u32(vandq_u32(ok, vreinterpretq_u32_f32(vmulq_f32(y, vreinterpretq_f32_s32(e)))));
}

static void neon_softmax(float *s, const float *mr, float *M, uint32_t *newb, uint32_t *skip) {
    float mp[TILE];
    softmax_marks(s, mr, M, newb, skip, mp);
    for (int h = 0; h < TILE; h += 4) {
        const float32x4_t a = vld1q_f32(s + h), m = vld1q_f32(mp + h);
        const uint32x4_t lt = vcltq_f32(a, m);
        vst1q_f32(s + h, neon_exp_fixed(vsubq_f32(vbslq_f32(lt, a, m), vbslq_f32(lt, m, a))));
    }
}

/* 16-element chunks; a tail of Dv % 16 elements in plain C (the same operations) */
static void neon_accum(float *acc, float *S, int64_t Dv, const float *v, int64_t vs, const float *x, uint32_t newb,
                       uint32_t skip) {
    sum_update(S, x, newb, skip);
    int64_t d0 = 0;
    for (; d0 + 16 <= Dv; d0 += 16) {
        float32x4_t a[4];
        for (int l = 0; l < 4; l++) a[l] = vld1q_f32(acc + d0 + 4 * l);
        for (int c = 0; c < TILE; c++) {
            if (skip >> c & 1) continue;
            const float *vc = v + c * vs + d0;
            const float32x4_t xc = vdupq_n_f32(x[c]);
            if (newb >> c & 1)
                for (int l = 0; l < 4; l++) a[l] = vaddq_f32(vmulq_f32(a[l], xc), vld1q_f32(vc + 4 * l));
            else
                for (int l = 0; l < 4; l++) a[l] = vfmaq_f32(a[l], xc, vld1q_f32(vc + 4 * l));
        }
        for (int l = 0; l < 4; l++) vst1q_f32(acc + d0 + 4 * l, a[l]);
    }
    if (d0 < Dv) c_accum_v(acc + d0, Dv - d0, v + d0, vs, x, newb, skip);
}

static void neon_accum2(float *a0, float *a1, float *S0, float *S1, int64_t Dv, const float *v, int64_t vs,
                        const float *x0, const float *x1) {
    sum_update(S0, x0, 0, 0);
    sum_update(S1, x1, 0, 0);
    int64_t d0 = 0;
    for (; d0 + 16 <= Dv; d0 += 16) {
        float32x4_t p[4], q[4];
        for (int l = 0; l < 4; l++) {
            p[l] = vld1q_f32(a0 + d0 + 4 * l);
            q[l] = vld1q_f32(a1 + d0 + 4 * l);
        }
        for (int c = 0; c < TILE; c++) {
            const float *vc = v + c * vs + d0;
            const float32x4_t y0 = vdupq_n_f32(x0[c]), y1 = vdupq_n_f32(x1[c]);
            for (int l = 0; l < 4; l++) {
                const float32x4_t vv = vld1q_f32(vc + 4 * l);
                p[l] = vfmaq_f32(p[l], y0, vv);
                q[l] = vfmaq_f32(q[l], y1, vv);
            }
        }
        for (int l = 0; l < 4; l++) {
            vst1q_f32(a0 + d0 + 4 * l, p[l]);
            vst1q_f32(a1 + d0 + 4 * l, q[l]);
        }
    }
    if (d0 < Dv) {
        c_accum_v(a0 + d0, Dv - d0, v + d0, vs, x0, 0, 0);
        c_accum_v(a1 + d0, Dv - d0, v + d0, vs, x1, 0, 0);
    }
}
#endif /* ATTN_NEON */

static const struct attn_isa isas[BT_CPU_ATTN_ISA_COUNT] = {
    [BT_CPU_ATTN_C] = {
        /* .name       = */ "c",
        /* .available  = */ c_available,
        /* .k_tile_f16 = */ c_k_tile_f16,
        /* .f16_row    = */ c_f16_row,
        /* .scores     = */ c_scores,
        /* .softmax    = */ c_softmax,
        /* .accum      = */ c_accum,
        /* .accum2     = */ c_accum2,
    },
#ifdef ATTN_X86
    [BT_CPU_ATTN_AVX2] = {
        /* .name       = */ "avx2",
        /* .available  = */ avx2_available,
        /* .k_tile_f16 = */ avx2_k_tile_f16,
        /* .f16_row    = */ avx2_f16_row,
        /* .scores     = */ avx2_scores,
        /* .softmax    = */ avx2_softmax,
        /* .accum      = */ avx2_accum,
        /* .accum2     = */ avx2_accum2,
    },
    [BT_CPU_ATTN_AVX512] = {
        /* .name       = */ "avx512",
        /* .available  = */ avx512_available,
        /* .k_tile_f16 = */ avx512_k_tile_f16,
        /* .f16_row    = */ avx512_f16_row,
        /* .scores     = */ avx512_scores,
        /* .softmax    = */ avx512_softmax,
        /* .accum      = */ avx512_accum,
        /* .accum2     = */ avx512_accum2,
    },
#endif
#ifdef ATTN_NEON
    [BT_CPU_ATTN_NEON] = {
        /* .name       = */ "neon",
        /* .available  = */ neon_available,
        /* .k_tile_f16 = */ neon_k_tile_f16,
        /* .f16_row    = */ neon_f16_row,
        /* .scores     = */ neon_scores,
        /* .softmax    = */ neon_softmax,
        /* .accum      = */ neon_accum,
        /* .accum2     = */ neon_accum2,
    },
#endif
};

const char *bt_cpu_attn_isa_name(enum bt_cpu_attn_isa isa) {
    return (int)isa >= 0 && isa < BT_CPU_ATTN_ISA_COUNT && isas[isa].name ? isas[isa].name : NULL;
}

/* what the CPU has, asked once: cpuid traps to the hypervisor in a virtual
 * machine, and the op runs a few hundred times per token (bit i: isa i) */
static unsigned isa_mask(void) {
    static _Atomic unsigned cached; /* 0: not asked yet; bit 31 marks it asked */
    unsigned m = atomic_load_explicit(&cached, memory_order_relaxed);
    if (m == 0) {
        m = 1u << 31;
        for (int i = 0; i < BT_CPU_ATTN_ISA_COUNT; i++)
            if (isas[i].name && isas[i].available()) m |= 1u << i;
        atomic_store_explicit(&cached, m, memory_order_relaxed);
    }
    return m;
}

bool bt_cpu_attn_isa_available(enum bt_cpu_attn_isa isa) {
    return bt_cpu_attn_isa_name(isa) != NULL && (isa_mask() >> isa & 1u);
}

/* ---- the driver: units, tiles, masks, the running maximum and sum ----------- */

/* The sink logit s of a row after its cells (the header's step): acc [Dv],
 * the running maximum *M and sum *S.  A row whose cells were all masked
 * (M = -inf) gets acc * 0 and S = 1: its result stays 0. */
static void sink_step(float s, float *M, float *S, float *acc, int64_t Dv) {
    if (s > *M) {
        const float x = exp_fixed(*M - s);
        for (int64_t i = 0; i < Dv; i++) acc[i] = acc[i] * x;
        *S = *S * x + 1.0f;
        *M = s;
    } else {
        *S = *S + exp_fixed(s - *M);
    }
}

/* query rows per unit: ROWS_MAX rows (query row x q head) when the group
 * allows, fewer when the units would not keep nth threads busy (4 each) */
static int64_t block_rows(int64_t T, int64_t Hk, int64_t group, int nth) {
    int64_t R = ROWS_MAX / group > 1 ? ROWS_MAX / group : 1;
    while (R > 1 && (T + R - 1) / R * Hk < 4 * (int64_t)nth) R /= 2;
    return R < T ? R : T;
}

struct scratch_layout {
    size_t kt, vt, row, mt, s, acc, ms, bits, qp, total; /* byte offsets, total size */
    int64_t R; /* query rows per unit: block_rows */
};

/* per thread: kt [D][TILE], vt [TILE][Dv], row [max(D, Dv)] (one k row
 * converted), mt [R][TILE] mask values, s [nr][TILE] scores then exp
 * values, acc [nr][Dv], M and S [nr] each, the
 * new-maximum and skip bits [nr] each, the q row pointers [nr] */
static struct scratch_layout scratch_layout(const struct bt_tensor *node, int nth) {
    const int64_t D = node->src[0]->ne[0], H = node->src[0]->ne[1], T = node->src[0]->ne[2];
    const int64_t Hk = node->src[1]->ne[1], Dv = node->src[2]->ne[0], group = H / Hk;
    const int64_t R = block_rows(T, Hk, group, nth), nr = R * group;
    struct scratch_layout l;
    l.R = R;
    size_t at = 0;
#define TAKE(field, bytes) (l.field = at, at += ((size_t)(bytes) + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN)
    TAKE(kt, D * TILE * sizeof(float));
    TAKE(vt, TILE * Dv * sizeof(float));
    TAKE(row, (D > Dv ? D : Dv) * sizeof(float));
    TAKE(mt, R * TILE * sizeof(float));
    TAKE(s, nr * TILE * sizeof(float));
    TAKE(acc, nr * Dv * sizeof(float));
    TAKE(ms, 2 * nr * sizeof(float));
    TAKE(bits, 2 * nr * sizeof(uint32_t));
    TAKE(qp, nr * sizeof(const float *));
#undef TAKE
    l.total = at;
    return l;
}

/* A group's share of the q heads (the node's row_lo/hi, set by dist.c's
 * attention chains): the attention of heads [row_lo, row_hi) alone, as
 * tensors that begin there (q, the kv heads they read, the sinks, the
 * result).  With several kv heads the share is of whole kv heads' groups;
 * with one (MQA, MLA's latent) any range.  Each head's rows are computed by
 * the same operations as in the whole, so they get the same bits. */
struct head_share {
    struct bt_tensor q, k, v, sinks, dst;
};

static const struct bt_tensor *share_of(const struct bt_tensor *dst, struct head_share *hs) {
    if (dst->row_hi <= 0) return dst;
    const struct bt_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *sinks = dst->src[4];
    const int64_t H = q->ne[1], Hk = k->ne[1], group = H / Hk, lo = dst->row_lo, hi = dst->row_hi;
    BT_ASSERT(0 <= lo && lo < hi && hi <= H && (Hk == 1 || (lo % group == 0 && hi % group == 0)));
    hs->dst = *dst;
    hs->dst.row_lo = hs->dst.row_hi = 0;
    hs->dst.data = (char *)dst->data + (size_t)lo * dst->nb[1];
    hs->dst.ne[1] = hi - lo;
    hs->q = *q;
    hs->q.data = (char *)q->data + (size_t)lo * q->nb[1];
    hs->q.ne[1] = hi - lo;
    hs->dst.src[0] = &hs->q;
    if (Hk > 1) {
        hs->k = *k;
        hs->k.data = (char *)k->data + (size_t)(lo / group) * k->nb[1];
        hs->k.ne[1] = (hi - lo) / group;
        hs->v = *v;
        hs->v.data = (char *)v->data + (size_t)(lo / group) * v->nb[1];
        hs->v.ne[1] = (hi - lo) / group;
        hs->dst.src[1] = &hs->k;
        hs->dst.src[2] = &hs->v;
    }
    if (sinks) {
        hs->sinks = *sinks;
        hs->sinks.data = (float *)sinks->data + lo;
        hs->sinks.ne[0] = hi - lo;
        hs->dst.src[4] = &hs->sinks;
    }
    return &hs->dst;
}

size_t bt_cpu_flash_attn_work_size(const struct bt_tensor *node, int nth) {
    if (nth < 1) nth = 1;
    size_t n = scratch_layout(node, nth).total;
    struct head_share hs;
    const struct bt_tensor *share = share_of(node, &hs);
    if (share != node && scratch_layout(share, nth).total > n) n = scratch_layout(share, nth).total;
    return n * (size_t)nth;
}

bool bt_cpu_flash_attn_supported(const struct bt_tensor *node) {
    return bt_op_is_well_formed(node);
}

static inline float mask_at(const struct bt_tensor *mask, int64_t j, int64_t t) {
    const char *p = (const char *)mask->data + j * mask->nb[0] + t * mask->nb[1];
    if (mask->type == BT_TYPE_F16) return bt_fp16_to_fp32(*(const bt_fp16_t *)p);
    return *(const float *)p;
}

/* mt [nt][TILE]: the mask of query rows t0 .. t0+nt-1 at cells j0 ..
 * j0+TILE-1 (-inf past the nj cells there are; 0 without a mask); false
 * when every value is -inf (no row of the block sees a cell of the tile) */
static bool mask_tile(const struct bt_tensor *mask, int64_t j0, int nj, int64_t t0, int64_t nt, float *mt) {
    bool any = false;
    for (int64_t tr = 0; tr < nt; tr++) {
        float *m = mt + tr * TILE;
        if (!mask)
            for (int c = 0; c < nj; c++) m[c] = 0.0f;
        else if (mask->type == BT_TYPE_F32 && mask->nb[0] == sizeof(float)) {
            const float *src = (const float *)((const char *)mask->data + (t0 + tr) * mask->nb[1]) + j0;
            for (int c = 0; c < nj; c++) m[c] = src[c];
        } else
            for (int c = 0; c < nj; c++) m[c] = mask_at(mask, j0 + c, t0 + tr);
        for (int c = nj; c < TILE; c++) m[c] = -INFINITY;
        for (int c = 0; c < nj; c++) any |= m[c] != -INFINITY;
    }
    return any;
}

/* the k and v rows PF_DIST cells ahead on their way to the cache while this
 * tile is computed: for decode steps (one or two query rows), which stream a long
 * context; a prompt's block reuses the tiles from the cache.  kb, vb: the
 * bytes of one k row and one v row */
static void prefetch_tile(const struct bt_tensor *k, const struct bt_tensor *v, size_t kb, size_t vb, int64_t hk,
                          int64_t j0, int nj) {
    const char *kp = (const char *)k->data + hk * k->nb[1] + j0 * k->nb[2];
    const char *vp = (const char *)v->data + hk * v->nb[1] + j0 * v->nb[2];
    for (int c = 0; c < nj; c++) {
        for (size_t o = 0; o < kb; o += 64) __builtin_prefetch(kp + c * k->nb[2] + o);
        for (size_t o = 0; o < vb; o += 64) __builtin_prefetch(vp + c * v->nb[2] + o);
    }
}

/* kt [D][TILE] for cells j0 .. j0+nj-1 of kv head hk (0 beyond) */
static void k_tile(const struct attn_isa *isa, const struct bt_tensor *k, int64_t hk, int64_t j0, int nj,
                   float *kt, float *row) {
    const int64_t D = k->ne[0];
    const char *base = (const char *)k->data + hk * k->nb[1] + j0 * k->nb[2];
    if (k->type == BT_TYPE_F16 && isa->k_tile_f16(base, k->nb[2], nj, D, kt)) return;
    for (int c = 0; c < TILE; c++) {
        if (c < nj && k->type == BT_TYPE_F16)
            isa->f16_row((const bt_fp16_t *)(base + c * k->nb[2]), row, D);
        else if (c < nj)
            bt_row_to_f32(k->type, base + c * k->nb[2], row, D);
        for (int64_t i = 0; i < D; i++) kt[i * TILE + c] = c < nj ? row[i] : 0.0f;
    }
}

/* v rows of cells j0 .. j0+nj-1 as F32: the data itself for F32 (*vs its
 * row stride in floats), else converted into vt (*vs = Dv) */
static const float *v_tile(const struct attn_isa *isa, const struct bt_tensor *v, int64_t hk, int64_t j0, int nj,
                           float *vt, int64_t *vs) {
    const int64_t Dv = v->ne[0];
    const char *base = (const char *)v->data + hk * v->nb[1] + j0 * v->nb[2];
    if (v->type == BT_TYPE_F32 && v->nb[2] % sizeof(float) == 0) {
        *vs = (int64_t)(v->nb[2] / sizeof(float));
        return (const float *)base;
    }
    for (int c = 0; c < nj; c++) {
        if (v->type == BT_TYPE_F16)
            isa->f16_row((const bt_fp16_t *)(base + c * v->nb[2]), vt + c * Dv, Dv);
        else
            bt_row_to_f32(v->type, base + c * v->nb[2], vt + c * Dv, Dv);
    }
    *vs = Dv;
    return vt;
}

void bt_cpu_flash_attn_isa(const struct bt_cpu_params *p, struct bt_tensor *node, enum bt_cpu_attn_isa which) {
    BT_ASSERT(bt_cpu_attn_isa_available(which));
    struct head_share hs;
    const struct bt_tensor *dst = share_of(node, &hs);
    const struct attn_isa *isa = &isas[which];
    const struct bt_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const float *sinks = dst->src[4] ? (const float *)dst->src[4]->data : NULL; /* [H] */
    const int64_t D = q->ne[0], H = q->ne[1], T = q->ne[2];
    const int64_t Hk = k->ne[1], N = k->ne[2], Dv = v->ne[0];
    const int64_t group = H / Hk;
    const float scale = bt_get_op_param_f32(dst, 0);
    BT_ASSERT(q->nb[0] == sizeof(float));

    const struct scratch_layout l = scratch_layout(dst, p->nth);
    BT_ASSERT(p->wdata && p->wsize >= l.total * (size_t)p->nth);
    char *w = (char *)p->wdata + l.total * (size_t)p->ith;
    float *kt = (float *)(w + l.kt), *vt = (float *)(w + l.vt), *row = (float *)(w + l.row);
    float *mt = (float *)(w + l.mt), *s = (float *)(w + l.s);
    float *acc = (float *)(w + l.acc), *M = (float *)(w + l.ms);
    uint32_t *newbits = (uint32_t *)(w + l.bits);
    const float **qp = (const float **)(w + l.qp);

    const int64_t R = l.R;
    const size_t kb = bt_row_size(k->type, k->ne[0]), vb = bt_row_size(v->type, v->ne[0]);
    const int64_t n_blocks = (T + R - 1) / R, n_units = n_blocks * Hk;
    /* the units: handed out by the node's counter (a slowed thread takes
     * fewer), or in turn without one */
    for (int64_t u = p->chunk ? bt_cpu_next_chunk(p) : p->ith; u < n_units;
         u = p->chunk ? bt_cpu_next_chunk(p) : u + p->nth) {
        const int64_t b = u / Hk, hk = u - b * Hk, t0 = b * R, h0 = hk * group;
        const int64_t nt = T - t0 < R ? T - t0 : R;
        const int nr = (int)(nt * group);
        float *S = M + nr;
        uint32_t *skipbits = newbits + nr;
        for (int r = 0; r < nr; r++) {
            const int64_t tr = r / group, g = r - tr * group;
            qp[r] = (const float *)((const char *)q->data + (h0 + g) * q->nb[1] + (t0 + tr) * q->nb[2]);
            for (int64_t i = 0; i < Dv; i++) acc[r * Dv + i] = 0.0f;
            M[r] = -INFINITY;
            S[r] = 0.0f;
        }
        for (int64_t j0 = 0; j0 < N; j0 += TILE) {
            const int nj = N - j0 < TILE ? (int)(N - j0) : TILE;
            if (!mask_tile(mask, j0, nj, t0, nt, mt)) continue;
            if (nt <= 2 && j0 + PF_DIST < N)
                prefetch_tile(k, v, kb, vb, hk, j0 + PF_DIST, N - j0 - PF_DIST < TILE ? (int)(N - j0 - PF_DIST) : TILE);
            k_tile(isa, k, hk, j0, nj, kt, row);
            isa->scores(kt, D, qp, nr, (int)group, mt, scale, s);
            /* per row: the cells it sees, the new maxima, the scores become x */
            for (int r = 0; r < nr; r++)
                isa->softmax(s + r * TILE, mt + (r / group) * TILE, &M[r], &newbits[r], &skipbits[r]);
            int64_t vs = 0;
            const float *vr = v_tile(isa, v, hk, j0, nj, vt, &vs);
            int r = 0;
            for (; r + 2 <= nr; r += 2) {
                if ((newbits[r] | skipbits[r] | newbits[r + 1] | skipbits[r + 1]) == 0)
                    isa->accum2(acc + r * Dv, acc + (r + 1) * Dv, &S[r], &S[r + 1], Dv, vr, vs, s + r * TILE,
                                s + (r + 1) * TILE);
                else
                    for (int e = r; e < r + 2; e++)
                        if (skipbits[e] != (1u << TILE) - 1u)
                            isa->accum(acc + e * Dv, &S[e], Dv, vr, vs, s + e * TILE, newbits[e], skipbits[e]);
            }
            if (r < nr && skipbits[r] != (1u << TILE) - 1u)
                isa->accum(acc + r * Dv, &S[r], Dv, vr, vs, s + r * TILE, newbits[r], skipbits[r]);
        }
        for (int r = 0; r < nr; r++) {
            const int64_t tr = r / group, g = r - tr * group;
            float *out = (float *)((char *)dst->data + (h0 + g) * dst->nb[1] + (t0 + tr) * dst->nb[2]);
            if (sinks) sink_step(sinks[h0 + g], &M[r], &S[r], acc + r * Dv, Dv);
            const float inv = S[r] > 0.0f ? 1.0f / S[r] : 0.0f;
            for (int64_t i = 0; i < Dv; i++) out[i] = acc[r * Dv + i] * inv;
        }
    }
}

void bt_cpu_flash_attn(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    enum bt_cpu_attn_isa which = BT_CPU_ATTN_C;
    /* up to the instruction set of the kernel variant in use (cpu_variant.h) */
    if (!p->reference)
        for (int i = (int)bt_cpu_kernels()->attn; i > BT_CPU_ATTN_C; i--)
            if (bt_cpu_attn_isa_available((enum bt_cpu_attn_isa)i)) {
                which = (enum bt_cpu_attn_isa)i;
                break;
            }
    bt_cpu_flash_attn_isa(p, dst, which);
}
