/* matmul.c - MUL_MAT and MUL_MAT_ID on the CPU.
 *
 *   a [k, m, a2, a3] weights (F32, F16, BF16, or a quantised type of
 *     qtypes.h; contiguous rows)
 *   b [k, n, b2, b3] F32 activations (nb[0] == 4, any other strides)
 *   d [m, n, b2, b3] F32:  d[i, j] = dot(a row i, b column j)
 *
 * Work is described as "jobs": one weight matrix (m rows) times a list of
 * columns of b, written to a list of columns of d.  MUL_MAT has one job per
 * batch (i2, i3); MUL_MAT_ID one job per used expert, whose columns are the
 * (slot, token) pairs that chose it, so an expert's weights are read once.
 *
 * Threads split the rows of the jobs (output elements), never a dot
 * product's k-reduction.  Each weight type has ONE accumulation order per
 * output element, used by every path, so an element's bits depend only on
 * its weight row and its activation column: never on the thread count, the
 * batch size, the column's position or neighbours, or how MUL_MAT_ID groups
 * the tokens by expert (tests/test_determinism.c checks all of these):
 *
 *  - float weights F32, F16: fdot.c, one order (16 lanes along k, a fixed
 *    tree per chunk, chunks in order) on its direct (decode) and blocked
 *    (prompt) paths.
 *  - BF16 weights: the pair order of vdpbf16ps (section below), on the GEMM
 *    and dot paths of AVX-512 and on the GEMM path (run_gemm) elsewhere.
 *  - quantised weights (what qtypes.h's table holds: the 32-element types
 *    in quant_i8.c, IQ4_XS and the IQ lattice types in quant_iq.c, the
 *    K-quants in quant_dot.c): every
 *    activation column is quantised once per node (all threads share the
 *    work, then a barrier) to the entry's activation format, on every path
 *    and batch size; each element is the entry's vec_dot or a tile that
 *    gives the same bits (exact integer block dots, float accumulation in a
 *    fixed block order); entries with a packed GEMM (Q8_0 and Q4_0 on
 *    AVX-512 VNNI, the K-quants, IQ4_XS, the lattice types) pack 16
 *    weight rows at a time into the thread's slice for jobs with many
 *    columns, with the same bits again; weights repacked at load (cpu.h,
 *    repack.c: the 32-element types, Q4_K, Q6_K) are already in that order, 16 rows a
 *    group, and every job of theirs runs the entry's rgemm on the groups
 *    as they stand (decode and prompt alike), with the same bits again;
 *    repacked BF16 (AVX2 without AVX-512) takes run_dot_rp_bf16 and, for
 *    prompts, the GEMM path with its panels packed from the groups.
 *  - reference path (p->reference): the plain triple loop.
 */
#include "cpu_impl.h"
#include "qtypes.h"

#include <float.h>
#include <math.h>
#include <string.h>


#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

/* ---- vectors: AVX-512, AVX2+FMA, NEON, or plain C (always correct) ---------- */

#if defined(__AVX512F__)
#define VL 16
#define MR 32 /* GEMM micro-kernel rows (2 vectors) */
#define NR 12 /* GEMM micro-kernel columns */
typedef __m512 vf;
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_load_n(const float *p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vf_store_n(float *p, vf v, int n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
}

#elif defined(__AVX2__) && defined(__FMA__)
#define VL 8
#define MR 16
#define NR 6
typedef __m256 vf;
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
/* one step of the BF16 pair order: an FMA, run with MXCSR's FTZ and DAZ set (bf16_fp_begin) */
static inline vf vf_fma_ftz(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline __m256i lane_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load_n(const float *p, int n) { return _mm256_maskload_ps(p, lane_mask(n)); }
static inline void vf_store_n(float *p, vf v, int n) { _mm256_maskstore_ps(p, lane_mask(n), v); }

#elif defined(__aarch64__) && defined(__ARM_NEON)
#define VL 4
#define MR 8
#define NR 8
typedef float32x4_t vf;
static inline vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf vf_load(const float *p) { return vld1q_f32(p); }
static inline void vf_store(float *p, vf v) { vst1q_f32(p, v); }
static inline vf vf_set1(float x) { return vdupq_n_f32(x); }
static inline float ftz_tiny(float a, float b, float c, float r);
/* c = fma(a, b, c) rounded once (vfmaq_f32, as fmaf), then flushed as x86's
 * FTZ does (ftz_tiny: lane by lane, for the rare lanes with 0 < |r| <= FLT_MIN) */
static inline vf vf_fma_ftz(vf a, vf b, vf c) {
    const vf x = vfmaq_f32(c, a, b);
    const uint32x4_t tiny = vandq_u32(vcleq_f32(vabsq_f32(x), vdupq_n_f32(FLT_MIN)), vmvnq_u32(vceqzq_f32(x)));
    if (vmaxvq_u32(tiny) == 0) return x;
    float av[4], bv[4], cv[4], xv[4];
    vst1q_f32(av, a);
    vst1q_f32(bv, b);
    vst1q_f32(cv, c);
    vst1q_f32(xv, x);
    for (int i = 0; i < 4; i++)
        if (xv[i] != 0.0f && fabsf(xv[i]) <= FLT_MIN) xv[i] = ftz_tiny(av[i], bv[i], cv[i], xv[i]);
    return vld1q_f32(xv);
}
static inline vf vf_load_n(const float *p, int n) {
    float t[VL] = {0};
    for (int i = 0; i < n; i++) t[i] = p[i];
    return vld1q_f32(t);
}
static inline void vf_store_n(float *p, vf v, int n) {
    float t[VL];
    vst1q_f32(t, v);
    for (int i = 0; i < n; i++) p[i] = t[i];
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
static inline float ftz_tiny(float a, float b, float c, float r);
/* c = fma(a, b, c) rounded once, then flushed as x86's FTZ does (ftz_tiny) */
static inline vf vf_fma_ftz(vf a, vf b, vf c) {
    for (int i = 0; i < VL; i++) {
        const float r = fmaf(a.v[i], b.v[i], c.v[i]);
        c.v[i] = r != 0.0f && fabsf(r) <= FLT_MIN ? ftz_tiny(a.v[i], b.v[i], c.v[i], r) : r;
    }
    return c;
}
static inline vf vf_load_n(const float *p, int n) {
    vf r = vf_zero();
    for (int i = 0; i < n; i++) r.v[i] = p[i];
    return r;
}
static inline void vf_store_n(float *p, vf v, int n) {
    for (int i = 0; i < n; i++) p[i] = v.v[i];
}
#endif


#ifndef BT_MM_KC
#define BT_MM_KC 256 /* k block of the GEMM path (even: whole BF16 pairs) */
#endif
#ifndef BT_MM_MC
#define BT_MM_MC 128 /* rows of weights packed at once (a multiple of MR) */
#endif
#ifndef BT_MM_NC
#define BT_MM_NC (64 * NR) /* columns of activations packed at once */
#endif
#ifndef BT_MM_BF16_KC
#define BT_MM_BF16_KC 1024 /* k block of the BF16 GEMM path (AVX-512; elements, even) */
#endif
#ifndef BT_MM_BF16_MC
#define BT_MM_BF16_MC 128 /* rows of BF16 weights packed at once */
#endif
#ifndef BT_MM_BF16_MR
#define BT_MM_BF16_MR 32 /* BF16 GEMM micro-kernel rows (a multiple of 16) */
#endif
#ifndef BT_MM_BF16_NR
#define BT_MM_BF16_NR 12 /* BF16 GEMM micro-kernel columns */
#endif
#ifndef BT_MM_GEMM_MIN_COLS
#define BT_MM_GEMM_MIN_COLS 8 /* jobs with at least this many columns take the GEMM path */
#endif
#define UNIT_ROWS 32 /* rows per unit of work handed to threads (a multiple of MR) */
#define DOT_RB 16    /* rows kept hot while the dot path walks column groups */

_Static_assert(BT_MM_KC % 2 == 0, "BT_MM_KC must be even");
_Static_assert(BT_MM_MC % MR == 0, "BT_MM_MC must be a multiple of MR");
_Static_assert(BT_MM_NC % NR == 0, "BT_MM_NC must be a multiple of NR");
_Static_assert(UNIT_ROWS % MR == 0, "UNIT_ROWS must be a multiple of MR");

#define ALIGN_UP(x) (((x) + (size_t)BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN)

/* ---- BF16 weights: the pair order of vdpbf16ps on every build --------------- *
 *
 * BF16 weights are computed as the AVX512-BF16 dot instruction does, as ggml
 * does for them: the activations are rounded to BF16 (once per column, the
 * same way on every path), and per output element, for the k pairs
 * q = 0, 1, ... in increasing order (an odd k padded with a zero half on
 * both sides):
 *
 *     acc = ftz(acc + w[2q+1] * b[2q+1]);  acc = ftz(acc + w[2q] * b[2q])
 *
 * each step rounded once to nearest even (a product of two BF16 values is
 * exact in F32, so each step is an FMA), BF16 inputs that are denormal read
 * as zero, and ftz replacing a tiny result by a zero of the same sign, where
 * tiny is x86's FTZ rule (tininess after rounding): the exact sum rounded to
 * 24 bits with an unbounded exponent is below FLT_MIN in magnitude (so
 * 2^-126 - 2^-150 flushes, though the denormal format would round it up to
 * FLT_MIN); the activations are rounded to nearest even, denormals to a zero
 * of the same sign, NaN quietened (vcvtne2ps2bf16).  That is vdpbf16ps
 * exactly (the Intel SDM's definition, and checked bit for bit against the
 * instruction on Zen 4, sums at FLT_MIN's edge included, by
 * tests/test_bf16_emu.c), so a CPU without the instruction gives the same
 * bits by emulating it:
 *  - x86 without the instruction: every BF16 path runs with MXCSR's FTZ and
 *    DAZ set (bf16_fp_begin), under which a plain F32 FMA is one step.
 *  - AVX-512 (F, BW, VL): the instruction where the build has AVX512-BF16,
 *    else dpbf16() below emulates it lane by lane; the GEMM path (packed
 *    pairs) and the dot path (16 x 16 pair blocks transposed in registers).
 *  - AVX2: a dot path for few columns (16 rows, 8 x 8 pair blocks transposed
 *    in registers) and the GEMM path below, its panels holding the weights
 *    and the rounded activations as F32, each pair's halves swapped (so the
 *    order above is the k order).
 *  - NEON / plain C: the same GEMM path on every batch size, FMA then ftz per
 *    step (ftz_tiny decides the rare results at or below FLT_MIN). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HAVE_BF16_DOT 1
#else
#define HAVE_BF16_DOT 0
#endif

/* x rounded to BF16 as vcvtneps2bf16 does */
static inline bt_bf16_t bf16_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bt_bf16_t)((u >> 16) | 0x40); /* quiet NaN */
    if ((u & 0x7f800000u) == 0) return (bt_bf16_t)((u >> 16) & 0x8000);      /* denormal: zero */
    u += 0x7fffu + ((u >> 16) & 1);
    return (bt_bf16_t)(u >> 16);
}

#if defined(__x86_64__) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))) && \
    !defined(__AVX512BF16__)
#define BF16_MXCSR 1
/* Sets MXCSR's FTZ (bit 15) and DAZ (bit 6) for the BF16 paths; returns the
 * value to restore (bf16_fp_end).  MXCSR is the thread's own. */
static inline unsigned bf16_fp_begin(void) {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    return csr;
}
static inline void bf16_fp_end(unsigned csr) { _mm_setcsr(csr); }
#else
#define BF16_MXCSR 0
#endif

#if !defined(__x86_64__) || !(defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
/* r = fma(a, b, c) rounded to the F32 format (denormals included), where
 * 0 < |r| <= FLT_MIN; a, b BF16 values or zero, c an earlier step's result:
 * the step flushed as x86's FTZ does.  |r| < FLT_MIN: the exact sum is below
 * FLT_MIN, and so is its rounding to 24 bits, a flush.  |r| == FLT_MIN: the
 * sum is recomputed scaled by 2^64 (the smaller factor and c scaled: exact,
 * and far from overflow, as a sum near 2^-126 of products with 16
 * significant bits cannot involve values above 2^64), where it is a normal
 * number rounded to 24 bits once. */
static inline float ftz_tiny(float a, float b, float c, float r) {
    if (fabsf(r) < FLT_MIN) return copysignf(0.0f, r);
    const float s = fabsf(a) <= fabsf(b) ? fmaf(a * 0x1p64f, b, c * 0x1p64f) : fmaf(a, b * 0x1p64f, c * 0x1p64f);
    return fabsf(s) < 0x1p-62f ? copysignf(0.0f, r) : r;
}
#endif

#if !HAVE_BF16_DOT
/* a BF16 value as F32, a denormal read as a zero of the same sign */
static inline float bf16_daz(bt_bf16_t h) {
    if ((h & 0x7f80) == 0) h &= 0x8000;
    return bt_bf16_to_fp32(h);
}

/* n elements of a BF16 row (w) or of F32 activations rounded to BF16 (x) as
 * F32 in the pair order: dst[2i] = element 2i+1, dst[2i+1] = element 2i; an
 * odd n's last pair has a zero first */
#if !BF16_MXCSR /* (x86: pack_a converts the rows in registers) */
static void bf16_row_pairs(const bt_bf16_t *w, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i += 2) {
        dst[i] = i + 1 < n ? bf16_daz(w[i + 1]) : 0.0f;
        dst[i + 1] = bf16_daz(w[i]);
    }
}
#endif
static void f32_col_pairs(const float *x, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i += 2) {
        dst[i] = i + 1 < n ? bf16_daz(bf16_round(x[i + 1])) : 0.0f;
        dst[i + 1] = bf16_daz(bf16_round(x[i]));
    }
}
#endif

/* ---- GEMM path -------------------------------------------------------------- */
#if !HAVE_BF16_DOT

/* d[row .. row+mr) of columns dcols[0 .. nr) (+)= A panel x B panel over kc.
 * ap: kc x MR (row index fastest), bp: kc x NR (column index fastest).
 * Each step flushes a denormal result to zero (BF16 pairs emulated). */
static inline __attribute__((always_inline)) void gemm_ukernel(int64_t kc, const float *restrict ap,
                                                               const float *restrict bp,
                                                               float *const *dcols, int64_t row,
                                                               int mr, int nr, bool first) {
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
            c0[j] = vf_fma_ftz(a0, b, c0[j]);
            c1[j] = vf_fma_ftz(a1, b, c1[j]);
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
#endif

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

    /* quantised weights: b's columns quantised, in b's column order */
    const struct bt_cpu_qtype *qt;
    bool repacked; /* a's bytes in qt's repacked layout (repack.c) */
    const char *qbuf;
    size_t qcb; /* bytes per column */

    /* BF16 dot path: the columns now in the thread's tmp as BF16 pairs
     * (run_dot_t_bf16), so that a node's chunks convert them once */
    struct mm_bf16_cols *bfc;
};

struct mm_bf16_cols {
    int64_t n;                              /* 0: none */
    const float *src[BT_MM_GEMM_MIN_COLS]; /* the columns converted */
};

/* The work buffer: a shared part (quantised activations), then one slice per
 * thread; offsets of a slice's parts. */
struct mm_slice {
    size_t shared;
    size_t ap, bp, tmp, bcols, dcols, offs, pairs, qact, need, size;
};

#ifndef BT_MM_QPRIVATE_COLS
/* quantised weights and at most this many activation columns (decode): each
 * thread quantises every column into its own slice, a few microseconds of
 * work, instead of sharing the work and then waiting for all at a barrier */
#define BT_MM_QPRIVATE_COLS 4
#endif

static int64_t b_ncols(const struct bt_tensor *b) { return b->ne[1] * b->ne[2] * b->ne[3]; }

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
    struct mm_slice s;
    const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(a->type);
    const bool qprivate = qt && b_ncols(node->src[1]) <= BT_MM_QPRIVATE_COLS;
    s.shared = qt && !qprivate ? ALIGN_UP((size_t)b_ncols(node->src[1]) * qt->act_size(k)) : 0;
    int64_t nc = ncols < BT_MM_NC ? (ncols + NR - 1) / NR * NR : BT_MM_NC;
    /* tmp: a converted A panel (GEMM), one converted row (reference) or the
     * dot path's columns as BF16 pairs */
    int64_t tmp = (int64_t)MR * BT_MM_KC;
    /* (reference path: a row as floats, and a repacked row's plain bytes) */
    if (k + (int64_t)(a->nb[1] / sizeof(float)) + 1 > tmp) tmp = k + (int64_t)(a->nb[1] / sizeof(float)) + 1;
    if (BT_MM_GEMM_MIN_COLS * ((k + 1) / 2) > tmp) tmp = BT_MM_GEMM_MIN_COLS * ((k + 1) / 2);
    /* (repacked BF16: the dot path's columns as pairs of floats) */
    if (BT_CPU_BF16_REPACK && a->type == BT_TYPE_BF16 && BT_MM_GEMM_MIN_COLS * k > tmp) tmp = BT_MM_GEMM_MIN_COLS * k;
    /* or an odd k's last block of BF16 rows as pairs (pack_a_bf16) */
    const int64_t bkp = ((k < BT_MM_BF16_KC ? k : BT_MM_BF16_KC) + 1) / 2;
    if (a->type == BT_TYPE_BF16 && BT_MM_BF16_MR * bkp > tmp) tmp = BT_MM_BF16_MR * bkp;
    /* or a packed panel of quantised weights */
    if (qt && qt->gemm && (int64_t)((qt->panel_size(k) + sizeof(float) - 1) / sizeof(float)) > tmp)
        tmp = (int64_t)((qt->panel_size(k) + sizeof(float) - 1) / sizeof(float));
    size_t off = 0;
    /* the packed panels (F32, or BF16 pairs: run_gemm_bf16) */
    const bool bf = a->type == BT_TYPE_BF16;
    const size_t apn = bf && BT_MM_BF16_MC * BT_MM_BF16_KC / 2 > BT_MM_MC * BT_MM_KC
                           ? (size_t)BT_MM_BF16_MC * BT_MM_BF16_KC / 2 : (size_t)BT_MM_MC * BT_MM_KC;
    const size_t bpk = bf && BT_MM_BF16_KC / 2 > BT_MM_KC ? BT_MM_BF16_KC / 2 : BT_MM_KC;
    /* or fdot.c's packed rows and columns */
    const size_t ap_bytes = apn * sizeof(float), fd_bytes = bt_cpu_fdot_buf_bytes(ncols);
    s.ap = off;
    off += qt ? 0 : ALIGN_UP(ap_bytes > fd_bytes ? ap_bytes : fd_bytes);
    s.bp = off;
    off += qt ? 0 : ALIGN_UP((size_t)nc * bpk * sizeof(float));
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
    s.qact = off;
    off += qprivate ? ALIGN_UP((size_t)b_ncols(node->src[1]) * qt->act_size(k)) : 0;
    s.need = off; /* MUL_MAT_ID: which columns its pairs read (quantize_acts) */
    off += qt && node->op == BT_OP_MUL_MAT_ID ? ALIGN_UP((size_t)b_ncols(node->src[1])) : 0;
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

/* b's column (i1, i2, i3): the F32 column, or its quantised copy when the
 * weights are quantised. */
static const void *b_col(const struct mm_plan *pl, int64_t i1, int64_t i2, int64_t i3) {
    const struct bt_tensor *b = pl->b;
    if (pl->qt) return pl->qbuf + (size_t)(i1 + b->ne[1] * (i2 + b->ne[2] * i3)) * pl->qcb;
    return (const char *)b->data + (size_t)i1 * b->nb[1] + (size_t)i2 * b->nb[2] +
           (size_t)i3 * b->nb[3];
}

/* Column pointers of job jb into b (or its quantised copy) and d. */
static void job_cols(const struct mm_plan *pl, int64_t jb, const void **bcols, float **dcols) {
    const struct bt_tensor *d = pl->d;
    if (pl->is_id) {
        const int32_t *pr = pl->pairs + pl->offs[jb];
        const int64_t n = pl->offs[jb + 1] - pl->offs[jb];
        for (int64_t j = 0; j < n; j++) {
            const int64_t e = pr[j] % pl->n_used, t = pr[j] / pl->n_used;
            bcols[j] = b_col(pl, e % pl->n_b, t, 0);
            dcols[j] = (float *)((char *)d->data + (size_t)e * d->nb[1] + (size_t)t * d->nb[2]);
        }
        return;
    }
    const int64_t i2 = jb % pl->b->ne[2], i3 = jb / pl->b->ne[2];
    char *d0 = (char *)d->data + (size_t)i2 * d->nb[2] + (size_t)i3 * d->nb[3];
    for (int64_t j = 0; j < pl->b->ne[1]; j++) {
        bcols[j] = b_col(pl, j, i2, i3);
        dcols[j] = (float *)(d0 + (size_t)j * d->nb[1]);
    }
}

/* Each thread quantises its share of b's columns for the table entry pl->qt
 * into the shared part of the work buffer; then all wait for all.  With at
 * most BT_MM_QPRIVATE_COLS columns in the node (slice_layout: no shared
 * part), each thread quantises them all into its own slice (priv) and nobody
 * waits (the same function: the same bits).  (A group's share of a node's
 * matrices may have fewer columns than the node: the node's layout decides.) */
static void quantize_acts(const struct bt_cpu_params *p, struct mm_plan *pl, const struct mm_slice *sl, char *shared,
                          char *priv, uint8_t *need) {
    const struct bt_tensor *b = pl->b;
    const int64_t n = b_ncols(b), ne1 = b->ne[1], ne2 = b->ne[2];
    const bool own = sl->shared == 0;
    pl->qcb = pl->qt->act_size(pl->k);
    pl->qbuf = own ? priv : shared;
    /* MUL_MAT_ID computing some experts only (an expert group's share:
     * fewer pairs than slots): the columns its pairs read, the others
     * (the slots of the experts other ranks compute) left as they are */
    const bool some = pl->is_id && pl->offs[pl->njobs] < pl->n_used * ne2;
    if (some) {
        memset(need, 0, (size_t)n);
        for (int32_t i = 0; i < pl->offs[pl->njobs]; i++) {
            const int32_t v = pl->pairs[i];
            need[(v % pl->n_used) % ne1 + ne1 * (v / pl->n_used)] = 1;
        }
    }
    const int64_t c0 = own ? 0 : n * p->ith / p->nth, c1 = own ? n : n * (p->ith + 1) / p->nth;
    for (int64_t c = c0; c < c1; c++) {
        if (some && !need[c]) continue;
        const float *x = (const float *)((const char *)b->data + (size_t)(c % ne1) * b->nb[1] +
                                         (size_t)((c / ne1) % ne2) * b->nb[2] +
                                         (size_t)(c / (ne1 * ne2)) * b->nb[3]);
        pl->qt->quantize_act(x, (char *)pl->qbuf + (size_t)c * pl->qcb, pl->k);
    }
    if (!own) bt_threadpool_barrier(p->pool);
}

#ifndef BT_MM_QNC
#define BT_MM_QNC 64 /* quantised path: activation columns kept hot while rows are walked */
#endif

/* A thread's next chunk of a node's rows (run_plan's chunks), claimed from
 * the node's counter while the thread runs the last tile of its current
 * chunk, so that the tile prefetches the rows the thread goes to next: a
 * chunk then no longer begins by waiting on memory (on a decode step's
 * 2048 x 2048 Q4_0 product at 2 threads, the 16 chunks per thread had cost
 * about a fifth against one share per thread).  Claimed that late, the chunk
 * is held for one tile only, so the threads still share the node's end. */
struct mm_claim {
    const struct bt_cpu_params *p;
    int64_t n_chunks;
    int64_t upj, units, cu, tail; /* the schedule (chunk_end) */
    int64_t c;                    /* the claimed chunk; -1: none claimed yet */
    int64_t wc, ws;               /* the walk over the chunks: chunk wc starts at unit ws */
    int64_t jb, active;           /* the walk over the active jobs (the job of the last chunk found) */
};

/* The node's work is `units` units of UNIT_ROWS rows, the active jobs' units
 * one after the other (upj a job); a chunk is at most cu units and never
 * crosses a job.  Near the end a chunk is a share of what is left
 * (1 / tail of it, at least one unit), so the threads finish the node
 * together: with chunks of cu units to the end, the last thread's last chunk
 * ran while the other threads waited at the barrier.  The end of the chunk
 * that starts at unit s: */
static int64_t chunk_end(const struct mm_claim *cl, int64_t s) {
    int64_t n = (cl->units - s + cl->tail - 1) / cl->tail;
    if (n > cl->cu) n = cl->cu;
    if (n < 1) n = 1;
    const int64_t job_end = (s / cl->upj + 1) * cl->upj;
    return s + n < job_end ? s + n : job_end;
}

/* Rows [*r0, *r1) of chunk c of job cl->jb, walking cl's chunks and jobs
 * forward (a thread's chunks come in increasing order). */
static void chunk_rows(const struct mm_plan *pl, struct mm_claim *cl, int64_t c, int64_t *r0, int64_t *r1) {
    BT_ASSERT(c >= cl->wc && c < cl->n_chunks);
    for (; cl->wc < c; cl->wc++) cl->ws = chunk_end(cl, cl->ws);
    const int64_t e = chunk_end(cl, cl->ws);
    while (cl->active < cl->ws / cl->upj) {
        cl->jb++;
        if (job_ncols(pl, cl->jb) > 0) cl->active++;
    }
    const int64_t u0 = cl->ws % cl->upj, u1 = u0 + (e - cl->ws);
    *r0 = u0 * UNIT_ROWS;
    *r1 = u1 * UNIT_ROWS < pl->m ? u1 * UNIT_ROWS : pl->m;
}

/* Claim the next chunk (once per chunk) and point next[0 .. RM) at its
 * first rows; false when the node has no chunk left. */
static bool claim_next(const struct mm_plan *pl, struct mm_claim *cl, int RM, const void **next) {
    if (!cl) return false;
    if (cl->c < 0) cl->c = bt_cpu_next_chunk(cl->p);
    if (cl->c >= cl->n_chunks) return false;
    struct mm_claim walk = *cl; /* run_plan walks to the chunk itself */
    int64_t r0, r1;
    chunk_rows(pl, &walk, cl->c, &r0, &r1);
    const char *a = job_a(pl, walk.jb);
    for (int i = 0; i < RM; i++) next[i] = a + (size_t)(r0 + i < r1 ? r0 + i : r1 - 1) * pl->a_nb1;
    return true;
}

/* claim_next as a struct bt_cpu_next (fdot.c's direct path) */
struct mm_after {
    const struct mm_plan *pl;
    struct mm_claim *cl;
};
static bool claim_after(void *ctx, int rm, const void **next) {
    const struct mm_after *c = ctx;
    return claim_next(c->pl, c->cl, rm, next);
}

/* Quantised weights over rows [r0, r1) of one job: tiles of the entry, else
 * its vec_dot (qtypes.h: every element the same bits either way).  cl: the
 * thread's chunk claims (NULL: none), whose next chunk the last tile
 * prefetches. */
static void run_q(const struct mm_plan *pl, const char *a, int64_t ncols, const void *const *acts,
                  float *const *dcols, int64_t r0, int64_t r1, void *panel, struct mm_claim *cl) {
    const struct bt_cpu_qtype *qt = pl->qt;
    const int64_t k = pl->k;
    if (pl->repacked) {
        /* groups of 16 rows (r0 a multiple of UNIT_ROWS, m of 16): every
         * column against each group as it stands, or (rpack, prompt sizes)
         * against the GEMM's panel packed from it */
        BT_ASSERT(r0 % BT_CPU_PANEL_ROWS == 0 && r1 % BT_CPU_PANEL_ROWS == 0);
        if (qt->rpack && ncols >= qt->rpack_min_cols) {
            for (int64_t r = r0; r < r1; r += BT_CPU_PANEL_ROWS) {
                qt->rpack(k, a + (size_t)r * pl->a_nb1, panel);
                qt->gemm(k, panel, acts, ncols, dcols, r, BT_CPU_PANEL_ROWS);
            }
            return;
        }
        for (int64_t r = r0; r < r1; r += BT_CPU_PANEL_ROWS) {
            const void *next = a + (size_t)(r + BT_CPU_PANEL_ROWS) * pl->a_nb1;
            if (r + BT_CPU_PANEL_ROWS >= r1 && !claim_next(pl, cl, 1, &next)) next = NULL;
            qt->rgemm(k, a + (size_t)r * pl->a_nb1, next, acts, ncols, dcols, r);
        }
        return;
    }
    if (qt->gemm && ncols >= qt->gemm_min_cols) {
        /* the entry's packed GEMM: a panel of rows packed once, every column against it */
        for (int64_t r = r0; r < r1; r += BT_CPU_PANEL_ROWS) {
            const int nr = (int)(r1 - r < BT_CPU_PANEL_ROWS ? r1 - r : BT_CPU_PANEL_ROWS);
            const void *rows[BT_CPU_PANEL_ROWS];
            for (int i = 0; i < BT_CPU_PANEL_ROWS; i++) rows[i] = a + (size_t)(r + (i < nr ? i : nr - 1)) * pl->a_nb1;
            qt->pack(k, rows, panel);
            qt->gemm(k, panel, acts, ncols, dcols, r, nr);
        }
        return;
    }
    for (int64_t jc = 0; jc < ncols; jc += BT_MM_QNC) {
        const int64_t jc1 = jc + BT_MM_QNC < ncols ? jc + BT_MM_QNC : ncols;
        for (int64_t rb = r0; rb < r1; rb += DOT_RB) {
            const int64_t rb1 = rb + DOT_RB < r1 ? rb + DOT_RB : r1;
            for (int64_t j0 = jc; j0 < jc1;) {
                const int64_t left = jc1 - j0;
                const struct bt_cpu_qtile *tile = NULL;
                for (int t = 0; t < BT_CPU_QTILES; t++) {
                    const struct bt_cpu_qtile *c = &qt->tiles[t];
                    if (!c->fn || c->rn > left) continue;
                    if (!tile || c->rn > tile->rn || (c->rn == tile->rn && c->rm > tile->rm)) tile = c;
                }
                if (!tile) {
                    for (int64_t r = rb; r < rb1; r++)
                        qt->vec_dot(k, &dcols[j0][r], a + (size_t)r * pl->a_nb1, acts[j0]);
                    j0++;
                    continue;
                }
                const int RM = tile->rm, RN = tile->rn;
                BT_ASSERT(RM >= 1 && RM <= BT_CPU_TILE_MAX && RN >= 1 && RN <= BT_CPU_TILE_MAX);
                for (int64_t r = rb; r < rb1; r += RM) {
                    const int nr = (int)(rb1 - r < RM ? rb1 - r : RM);
                    const void *rows[BT_CPU_TILE_MAX], *next[BT_CPU_TILE_MAX];
                    float out[BT_CPU_TILE_MAX * BT_CPU_TILE_MAX];
                    for (int i = 0; i < RM; i++) {
                        rows[i] = a + (size_t)(r + (i < nr ? i : nr - 1)) * pl->a_nb1;
                        /* the rows the next tile will likely read */
                        next[i] = a + (size_t)(r + RM + i < r1 ? r + RM + i : r1 - 1) * pl->a_nb1;
                    }
                    /* the range's last tile: the first rows of the thread's next chunk */
                    const bool last = r + RM >= r1 && j0 + RN >= jc1 && jc1 == ncols;
                    const bool has_next = r + RM < r1 || (last && claim_next(pl, cl, RM, next));
                    tile->fn(k, rows, acts + j0, has_next ? next : NULL, out);
                    for (int j = 0; j < RN; j++)
                        for (int i = 0; i < nr; i++) dcols[j0 + j][r + i] = out[j * RM + i];
                }
                j0 += RN;
            }
        }
    }
}

/* Interleave up to 16 source rows: dst[kk * ld + r] = src[r][kk] for r < nr,
 * kk < kc; rows r >= nr (or with src[r] NULL) are zero up to 16 (or ld).
 * The AVX-512 version transposes 16 x 16 tiles in registers. */
#if defined(__AVX512F__)
static void interleave(const float *const *src, int64_t kc, float *restrict dst, int ld) {
    const __mmask16 wmask = (__mmask16)(ld >= 16 ? 0xffff : (1u << ld) - 1u);
    for (int64_t kk = 0; kk < kc; kk += 16) {
        const int n = (int)(kc - kk < 16 ? kc - kk : 16);
        const __mmask16 lmask = (__mmask16)((1u << n) - 1u);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = src[i] ? _mm512_maskz_loadu_ps(lmask, src[i] + kk) : _mm512_setzero_ps();
        bt_cpu_transpose16(r);
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

/* pack_a, pack_b, run_gemm: the GEMM path of BF16 weights without AVX-512 (the
 * pair order emulated in F32); F32 and F16 weights take fdot.c. */
#if !HAVE_BF16_DOT
/* The k length of a packed panel of kc elements: kc rounded up to whole
 * pairs (bf16_row_pairs). */
static inline int64_t packed_k(int64_t kc) { return (kc + 1) / 2 * 2; }

#if BF16_MXCSR

/* Pack rows [r0, r0+mc) x k [pc, pc+kc) of a into MR-row panels: ap[p][kk][MR]
 * (kk < packed_k), as BF16 pairs: 8 rows x 8 pairs transposed in registers,
 * each pair's high half (element 2q+1) to kk = 2q and its low half to 2q+1;
 * denormals are left as they are (read as zero under DAZ). */
#if BT_CPU_BF16_REPACK
static void pack_a_rp(const struct mm_plan *pl, const char *a, int64_t r0, int64_t mc, int64_t pc, int64_t kc,
                      float *restrict ap);
#endif
static void pack_a(const struct mm_plan *pl, const char *a, int64_t r0, int64_t mc, int64_t pc,
                   int64_t kc, float *restrict ap, float *restrict tmp) {
    (void)tmp;
#if BT_CPU_BF16_REPACK
    if (pl->repacked) {
        pack_a_rp(pl, a, r0, mc, pc, kc, ap);
        return;
    }
#endif
    const int64_t kp = packed_k(kc), nq = kc / 2; /* whole pairs */
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t p0 = 0; p0 < mc; p0 += MR) {
        float *panel = ap + p0 * kp;
        for (int h = 0; h < MR; h += 8) {
            const uint16_t *src[8];
            for (int i = 0; i < 8; i++)
                src[i] = p0 + h + i < mc ? (const uint16_t *)(a + (size_t)(r0 + p0 + h + i) * pl->a_nb1) + pc : NULL;
            int64_t q = 0;
            for (; q + 8 <= nq; q += 8) {
                __m256 r[8];
                for (int i = 0; i < 8; i++)
                    r[i] = src[i] ? _mm256_loadu_ps((const float *)(src[i] + 2 * q)) : _mm256_setzero_ps();
                bt_cpu_transpose8(r);
                for (int t = 0; t < 8; t++) {
                    const __m256i v = _mm256_castps_si256(r[t]);
                    _mm256_storeu_ps(panel + (2 * (q + t)) * MR + h, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
                    _mm256_storeu_ps(panel + (2 * (q + t) + 1) * MR + h, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
                }
            }
            for (; 2 * q < kp; q++) /* the last pairs (an odd kc's last with a zero high half) */
                for (int i = 0; i < 8; i++) {
                    const uint16_t e0 = src[i] ? src[i][2 * q] : 0, e1 = src[i] && 2 * q + 1 < kc ? src[i][2 * q + 1] : 0;
                    panel[(2 * q) * MR + h + i] = bt_bf16_to_fp32(e1);
                    panel[(2 * q + 1) * MR + h + i] = bt_bf16_to_fp32(e0);
                }
        }
    }
}
#else
/* Pack rows [r0, r0+mc) x k [pc, pc+kc) of a into MR-row panels: ap[p][kk][MR]
 * (kk < packed_k), as BF16 pairs.  tmp: MR * packed_k floats for the pairs. */
static void pack_a(const struct mm_plan *pl, const char *a, int64_t r0, int64_t mc, int64_t pc,
                   int64_t kc, float *restrict ap, float *restrict tmp) {
    const int64_t kp = packed_k(kc);
    for (int64_t p0 = 0; p0 < mc; p0 += MR) {
        const float *src[MR > 16 ? MR : 16];
        for (int r = 0; r < MR; r++) {
            src[r] = NULL;
            if (p0 + r >= mc) continue;
            const char *row = a + (size_t)(r0 + p0 + r) * pl->a_nb1;
            bf16_row_pairs((const bt_bf16_t *)row + pc, kc, tmp + r * kp);
            src[r] = tmp + r * kp;
        }
        for (int h = 0; h < MR; h += INTERLEAVE_ROWS) interleave(src + h, kp, ap + p0 * kp + h, MR);
    }
}
#endif

/* Pack columns [j0, j0+nc) x k [pc, pc+kc) into NR-column panels: bp[p][kk][NR]
 * (kk < packed_k; the columns rounded to BF16 in the pair order). */
static void pack_b(const float *const *bcols, int64_t j0, int64_t nc, int64_t pc, int64_t kc,
                   float *restrict bp) {
    const int64_t kp = packed_k(kc);
    float cols[NR][BT_MM_KC];
    for (int64_t p0 = 0; p0 < nc; p0 += NR) {
        const float *src[NR > 16 ? NR : 16];
        for (int j = 0; j < (NR > 16 ? NR : 16); j++) {
            src[j] = j < NR && p0 + j < nc ? bcols[j0 + p0 + j] + pc : NULL;
            if (src[j]) {
                f32_col_pairs(src[j], kc, cols[j]);
                src[j] = cols[j];
            }
        }
        interleave(src, kp, bp + p0 * kp, NR);
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
            const int64_t kc = k - pc < BT_MM_KC ? k - pc : BT_MM_KC, kp = packed_k(kc);
            pack_b(bcols, jc, nc, pc, kc, bp);
            for (int64_t ic = r0; ic < r1; ic += BT_MM_MC) {
                const int64_t mc = r1 - ic < BT_MM_MC ? r1 - ic : BT_MM_MC;
                pack_a(pl, a, ic, mc, pc, kc, ap, tmp);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const int nr = (int)(nc - jr < NR ? nc - jr : NR);
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        const int mr = (int)(mc - ir < MR ? mc - ir : MR);
                        float *const *dc = (float *const *)dcols + jc + jr;
                        gemm_ukernel(kp, ap + ir * kp, bp + jr * kp, dc, ic + ir, mr, nr, pc == 0);
                    }
                }
            }
        }
    }
    if (k == 0)
        for (int64_t j = 0; j < ncols; j++)
            for (int64_t r = r0; r < r1; r++) dcols[j][r] = 0.0f;
}
#endif /* !HAVE_BF16_DOT */

#ifndef BT_MM_PREFETCH_T
#define BT_MM_PREFETCH_T 1024 /* BF16 dot path: prefetch distance in bytes of each row */
#endif
#ifndef BT_MM_PF_HINT
/* into L2 only: the dot path's 16 rows (multiples of 4 KiB) share one L1 set
 * of 8 ways, and prefetching them into L1 (T0) ran decode 1.5x slower */
#define BT_MM_PF_HINT _MM_HINT_T1
#endif

/* ---- BF16 weights on AVX-512: vdpbf16ps, or its emulation ------------------ *
 *
 * vdpbf16ps does acc = dpbf16(acc, pair q of the row, pair q of the column)
 * per lane in one instruction, twice the work of an F32 FMA; the order and
 * rounding are the section "BF16 weights: the pair order" above.  The GEMM
 * path (packed pairs, MR rows x NR columns) and the dot path (16 rows, 16 x
 * 16 pair blocks transposed in registers) both follow it, so they give the
 * same bits. */
#if HAVE_BF16_DOT
#if defined(__AVX512BF16__)
static inline __m512 dpbf16(__m512 acc, __m512 w, __m512 b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(w), (__m512bh)_mm512_castps_si512(b));
}
/* 16 + 16 floats -> 32 BF16 (lo first) */
static inline __m512i bf16_round32(__m512 lo, __m512 hi) {
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}
#else
/* Without AVX512-BF16: the same per lane, exactly (see above): two FMAs
 * under MXCSR's FTZ and DAZ (bf16_fp_begin). */
static inline __m512 dpbf16(__m512 acc, __m512 w, __m512 b) {
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i wi = _mm512_castps_si512(w), bi = _mm512_castps_si512(b);
    const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(wi, hi));
    const __m512 b1 = _mm512_castsi512_ps(_mm512_and_si512(bi, hi));
    const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(wi, 16));
    const __m512 b0 = _mm512_castsi512_ps(_mm512_slli_epi32(bi, 16));
    return _mm512_fmadd_ps(w0, b0, _mm512_fmadd_ps(w1, b1, acc));
}
/* 16 floats -> 16 BF16 in 32-bit lanes, as bf16_round */
static inline __m512i bf16_round16(__m512 x) {
    const __m512i u = _mm512_castps_si512(x), top = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(top, _mm512_set1_epi32(1)))),
        16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __mmask16 den = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, top, _mm512_set1_epi32(0x40));
    return _mm512_mask_and_epi32(r, den, top, _mm512_set1_epi32(0x8000));
}
static inline __m512i bf16_round32(__m512 lo, __m512 hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(bf16_round16(lo))),
                              _mm512_cvtepi32_epi16(bf16_round16(hi)), 1);
}
#endif

/* x[0 .. n) -> (n + 1) / 2 BF16 pairs (element 2q low, 2q+1 high; a missing
 * last high half is zero) */
static void f32_to_bf16_pairs(const float *x, int64_t n, uint32_t *dst) {
    for (int64_t i = 0; i < n; i += 32) {
        const int64_t rest = n - i;
        const __mmask16 m0 = (__mmask16)(rest >= 16 ? 0xffff : (1u << rest) - 1u);
        const __mmask16 m1 = (__mmask16)(rest >= 32 ? 0xffff : rest > 16 ? (1u << (rest - 16)) - 1u : 0u);
        const __m512 lo = _mm512_maskz_loadu_ps(m0, x + i), hi = _mm512_maskz_loadu_ps(m1, x + i + 16);
        const __m512i p = bf16_round32(lo, hi);
        const int64_t np = rest >= 32 ? 16 : (rest + 1) / 2;
        _mm512_mask_storeu_epi32(dst + i / 2, (__mmask16)(np >= 16 ? 0xffff : (1u << np) - 1u), p);
    }
}

#define BMR BT_MM_BF16_MR
#define BNR BT_MM_BF16_NR
#define BMV (BMR / 16)
#define BKC BT_MM_BF16_KC
#define BMC BT_MM_BF16_MC
_Static_assert(BMR % 16 == 0 && BMC % BMR == 0 && BNR <= 16 && BT_MM_NC % BNR == 0 && BKC % 2 == 0,
               "BF16 micro-kernel shape");

/* Pack pairs [pc/2, pc/2 + kp) of rows [r0, r0+mc) of a (BF16) into BMR-row
 * panels ap[p][q][BMR] (dwords).  tmp: BMR * kp dwords for an odd k's last
 * block (the last pair's high half zeroed). */
static void pack_a_bf16(const struct mm_plan *pl, const char *a, int64_t r0, int64_t mc, int64_t pc,
                        int64_t kc, uint32_t *restrict ap, uint32_t *restrict tmp) {
    const int64_t kp = (kc + 1) / 2;
    for (int64_t p0 = 0; p0 < mc; p0 += BMR) {
        const float *src[BMR];
        for (int r = 0; r < BMR; r++) {
            src[r] = NULL;
            if (p0 + r >= mc) continue;
            const char *row = a + (size_t)(r0 + p0 + r) * pl->a_nb1 + (size_t)pc * 2;
            if (kc % 2 == 0) {
                src[r] = (const float *)row;
            } else {
                uint32_t *t = tmp + (size_t)r * (size_t)kp;
                memcpy(t, row, (size_t)kc * 2);
                ((uint16_t *)t)[kc] = 0;
                src[r] = (const float *)t;
            }
        }
        for (int h = 0; h < BMR; h += 16) interleave(src + h, kp, (float *)ap + p0 * kp + h, BMR);
    }
}

/* Columns [j0, j0+nc) x elements [pc, pc+kc) as BF16 pairs in BNR-column
 * panels bp[p][q][BNR] (dwords). */
static void pack_b_bf16(const float *const *bcols, int64_t j0, int64_t nc, int64_t pc, int64_t kc,
                        uint32_t *restrict bp) {
    const int64_t kp = (kc + 1) / 2;
    uint32_t cols[BNR][BKC / 2];
    for (int64_t p0 = 0; p0 < nc; p0 += BNR) {
        const float *src[16];
        for (int j = 0; j < 16; j++) {
            src[j] = NULL;
            if (j < BNR && p0 + j < nc) {
                f32_to_bf16_pairs(bcols[j0 + p0 + j] + pc, kc, cols[j]);
                src[j] = (const float *)cols[j];
            }
        }
        interleave(src, kp, (float *)bp + p0 * kp, BNR);
    }
}

/* d[row .. row+mr) of columns dcols[0 .. nr) (+)= A panel x B panel over kp
 * pairs: BMV x BNR accumulators, a lane per row. */
static void gemm_ukernel_bf16(int64_t kp, const uint32_t *restrict ap, const uint32_t *restrict bp,
                              float *const *dcols, int64_t row, int mr, int nr, bool first) {
    __m512 c[BMV][BNR];
#pragma GCC unroll 16
    for (int j = 0; j < BNR; j++)
#pragma GCC unroll 8
        for (int v = 0; v < BMV; v++) {
            const int n = mr - 16 * v; /* rows of vector v */
            if (first || j >= nr || n <= 0) c[v][j] = _mm512_setzero_ps();
            else if (n >= 16) c[v][j] = _mm512_loadu_ps(dcols[j] + row + 16 * v);
            else c[v][j] = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), dcols[j] + row + 16 * v);
        }
#pragma GCC unroll 2
    for (int64_t q = 0; q < kp; q++) {
        __m512 av[BMV];
#pragma GCC unroll 8
        for (int v = 0; v < BMV; v++) av[v] = _mm512_loadu_ps((const float *)ap + 16 * v);
#pragma GCC unroll 16
        for (int j = 0; j < BNR; j++) {
            const __m512 b = _mm512_castsi512_ps(_mm512_set1_epi32((int)bp[j]));
#pragma GCC unroll 8
            for (int v = 0; v < BMV; v++) c[v][j] = dpbf16(c[v][j], av[v], b);
        }
        ap += BMR;
        bp += BNR;
    }
#pragma GCC unroll 16
    for (int j = 0; j < BNR; j++)
#pragma GCC unroll 8
        for (int v = 0; v < BMV; v++) {
            const int n = mr - 16 * v;
            if (j >= nr || n <= 0) continue;
            if (n >= 16) _mm512_storeu_ps(dcols[j] + row + 16 * v, c[v][j]);
            else _mm512_mask_storeu_ps(dcols[j] + row + 16 * v, (__mmask16)((1u << n) - 1u), c[v][j]);
        }
}

/* GEMM path for BF16 weights over rows [r0, r1) of one job. */
static void run_gemm_bf16(const struct mm_plan *pl, const char *a, int64_t ncols,
                          const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                          uint32_t *ap, uint32_t *bp, uint32_t *tmp) {
    const int64_t k = pl->k;
    for (int64_t jc = 0; jc < ncols; jc += BT_MM_NC) {
        const int64_t nc = ncols - jc < BT_MM_NC ? ncols - jc : BT_MM_NC;
        for (int64_t pc = 0; pc < k; pc += BKC) {
            const int64_t kc = k - pc < BKC ? k - pc : BKC, kp = (kc + 1) / 2;
            pack_b_bf16(bcols, jc, nc, pc, kc, bp);
            for (int64_t ic = r0; ic < r1; ic += BMC) {
                const int64_t mc = r1 - ic < BMC ? r1 - ic : BMC;
                pack_a_bf16(pl, a, ic, mc, pc, kc, ap, tmp);
                for (int64_t jr = 0; jr < nc; jr += BNR) {
                    const int nr = (int)(nc - jr < BNR ? nc - jr : BNR);
                    for (int64_t ir = 0; ir < mc; ir += BMR) {
                        const int mr = (int)(mc - ir < BMR ? mc - ir : BMR);
                        gemm_ukernel_bf16(kp, ap + ir * kp, bp + jr * kp,
                                          (float *const *)dcols + jc + jr, ic + ir, mr, nr, pc == 0);
                    }
                }
            }
        }
    }
    if (k == 0)
        for (int64_t j = 0; j < ncols; j++)
            for (int64_t r = r0; r < r1; r++) dcols[j][r] = 0.0f;
}

/* Dot path: rows[16] (the last real row repeated beyond nrows) x RN columns
 * given as BF16 pairs (pcols); 16 pairs of 16 rows transposed per step. */
static inline __attribute__((always_inline)) void dot_t_bf16_tile(const int RN, int64_t k,
                                                                   const char *const *rows,
                                                                   const char *const *next,
                                                                   const uint32_t *const *pcols,
                                                                   float *const *dcols,
                                                                   int64_t row0, int nrows) {
    const int64_t kp = (k + 1) / 2;
    __m512 acc[BT_MM_GEMM_MIN_COLS];
    for (int j = 0; j < RN; j++) acc[j] = _mm512_setzero_ps();
    int64_t q = 0;
    for (; q + 16 <= k / 2; q += 16) {
        __m512 r[16];
        const int64_t off = q * 4 + BT_MM_PREFETCH_T, row_bytes = k * 2; /* as dot_t_tile */
        if (off < row_bytes)
            for (int i = 0; i < 16; i++) _mm_prefetch(rows[i] + off, BT_MM_PF_HINT);
        else if (next && off - row_bytes < row_bytes)
            for (int i = 0; i < 16; i++) _mm_prefetch(next[i] + (off - row_bytes), BT_MM_PF_HINT);
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps((const float *)(rows[i] + q * 4));
        bt_cpu_transpose16(r);
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++)
            for (int j = 0; j < RN; j++)
                acc[j] = dpbf16(acc[j], r[t], _mm512_castsi512_ps(_mm512_set1_epi32((int)pcols[j][q + t])));
    }
    if (q < kp) {
        /* the last < 16 pairs: whole pairs, then (odd k) one half pair */
        const int n = (int)(kp - q), full = (int)(k / 2 - q);
        const __mmask16 mf = (__mmask16)((1u << full) - 1u);
        __m512 r[16];
        for (int i = 0; i < 16; i++) {
            __m512i v = _mm512_maskz_loadu_epi32(mf, rows[i] + q * 4);
            if (n > full) { /* element k-1 alone, high half zero */
                uint16_t last;
                memcpy(&last, rows[i] + (k - 1) * 2, 2);
                v = _mm512_mask_set1_epi32(v, (__mmask16)(1u << full), (int)last);
            }
            r[i] = _mm512_castsi512_ps(v);
        }
        bt_cpu_transpose16(r);
        for (int t = 0; t < n; t++)
            for (int j = 0; j < RN; j++)
                acc[j] = dpbf16(acc[j], r[t], _mm512_castsi512_ps(_mm512_set1_epi32((int)pcols[j][q + t])));
    }
    const __mmask16 sm = (__mmask16)(nrows >= 16 ? 0xffff : (1u << nrows) - 1u);
    for (int j = 0; j < RN; j++) _mm512_mask_storeu_ps(dcols[j] + row0, sm, acc[j]);
}

typedef void (*dot_t_bf16_fn)(int64_t k, const char *const *rows, const char *const *next,
                              const uint32_t *const *pcols, float *const *dcols, int64_t row0,
                              int nrows);
#define DEF_DOT_TB(RN)                                                                         \
    static void dot_t_bf16_##RN(int64_t k, const char *const *rows, const char *const *next,    \
                                const uint32_t *const *pcols, float *const *dcols, int64_t row0, \
                                int nrows) {                                                   \
        dot_t_bf16_tile(RN, k, rows, next, pcols, dcols, row0, nrows);                        \
    }
DEF_DOT_TB(1) DEF_DOT_TB(2) DEF_DOT_TB(3) DEF_DOT_TB(4) DEF_DOT_TB(5) DEF_DOT_TB(6) DEF_DOT_TB(7)

/* Dot path for BF16 weights over rows [r0, r1) of a job with 1..7 columns;
 * the columns are converted to BF16 pairs into tmp first. */
static void run_dot_t_bf16(const struct mm_plan *pl, const char *a, int64_t ncols,
                           const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                           uint32_t *tmp, struct mm_claim *cl) {
    static const dot_t_bf16_fn fns[8] = {NULL, dot_t_bf16_1, dot_t_bf16_2, dot_t_bf16_3,
                                         dot_t_bf16_4, dot_t_bf16_5, dot_t_bf16_6, dot_t_bf16_7};
    BT_ASSERT(ncols >= 1 && ncols < 8);
    const int64_t k = pl->k, kp = (k + 1) / 2;
    struct mm_bf16_cols *c = pl->bfc;
    bool same = c->n == ncols;
    for (int64_t j = 0; j < ncols && same; j++) same = c->src[j] == bcols[j];
    const uint32_t *pcols[8];
    for (int64_t j = 0; j < ncols; j++) {
        if (!same) {
            f32_to_bf16_pairs(bcols[j], k, tmp + j * kp);
            c->src[j] = bcols[j];
        }
        pcols[j] = tmp + j * kp;
    }
    c->n = ncols;
    for (int64_t r = r0; r < r1; r += 16) {
        const int n = (int)(r1 - r < 16 ? r1 - r : 16);
        const char *rows[16], *next[16];
        for (int i = 0; i < 16; i++) {
            rows[i] = a + (size_t)(r + (i < n ? i : n - 1)) * pl->a_nb1;
            next[i] = a + (size_t)(r + 16 + i < r1 ? r + 16 + i : r1 - 1) * pl->a_nb1;
        }
        /* the range's last tile: the first rows of the thread's next chunk */
        const bool has_next = r + 16 < r1 || claim_next(pl, cl, 16, (const void **)next);
        fns[ncols](k, rows, has_next ? next : NULL, pcols, dcols, r, n);
    }
}
#endif

/* ---- BF16 weights on AVX2: the dot path, vdpbf16ps emulated ---------------- *
 * Builds with AVX2 and FMA but not AVX-512 take the GEMM path above for 8
 * columns and more; fewer (decode, a MoE expert's tokens) take this dot
 * path, which reads the rows where they lie: 16 rows, as two vectors of 8
 * (a lane per row), 8 pairs of each row transposed 8 x 8 in registers per
 * step, and per pair the two steps of the pair order, each an FMA then ftz
 * (the section "BF16 weights: the pair order"); the same bits as the GEMM
 * path and as AVX-512. */
#if !HAVE_BF16_DOT && defined(__AVX2__) && defined(__FMA__)
#define HAVE_BF16_DOT_AVX2 1

/* x[0 .. n) -> (n + 1) / 2 BF16 pairs (element 2q low, 2q+1 high; a missing
 * last high half is zero), rounded as bf16_round */
static void f32_to_bf16_pairs_c(const float *x, int64_t n, uint32_t *dst) {
    for (int64_t i = 0; i < n; i += 2)
        dst[i / 2] = (uint32_t)bf16_round(x[i]) | (i + 1 < n ? (uint32_t)bf16_round(x[i + 1]) << 16 : 0u);
}


/* Rows rows[16] (the last real row repeated beyond nrows) x RN columns
 * given as BF16 pairs (pcols); acc[v][j]: rows 8v .. 8v+7 of column j.
 * Per pair, high half then low half: acc = fma(w, b, acc) under MXCSR's FTZ
 * and DAZ (the rows' denormal halves read as zero; the columns' halves come
 * from bf16_round, which gives no denormals). */
static inline __attribute__((always_inline)) void dot_t_bf16_avx2_pairs(const int RN, const int n, __m256 r[2][8],
                                                                        const uint32_t *const *pcols, int64_t q,
                                                                        __m256 acc[2][BT_MM_GEMM_MIN_COLS]) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 8
    for (int t = 0; t < n; t++) {
        __m256 w1[2], w0[2];
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) {
            const __m256i wi = _mm256_castps_si256(r[v][t]);
            w1[v] = _mm256_castsi256_ps(_mm256_and_si256(wi, hi));
            w0[v] = _mm256_castsi256_ps(_mm256_slli_epi32(wi, 16));
        }
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) {
            const __m256i bi = _mm256_set1_epi32((int)pcols[j][q + t]);
            const __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(bi, hi));
            const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(bi, 16));
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) acc[v][j] = _mm256_fmadd_ps(w0[v], b0, _mm256_fmadd_ps(w1[v], b1, acc[v][j]));
        }
    }
}

static inline __attribute__((always_inline)) void dot_t_bf16_avx2_tile(const int RN, int64_t k,
                                                                        const char *const *rows,
                                                                        const char *const *next,
                                                                        const uint32_t *const *pcols,
                                                                        float *const *dcols, int64_t row0,
                                                                        int nrows) {
    const int64_t kp = (k + 1) / 2;
    __m256 acc[2][BT_MM_GEMM_MIN_COLS];
    for (int v = 0; v < 2; v++)
        for (int j = 0; j < RN; j++) acc[v][j] = _mm256_setzero_ps();
    int64_t q = 0;
    for (; q + 8 <= k / 2; q += 8) {
        const int64_t off = q * 4 + BT_MM_PREFETCH_T, row_bytes = k * 2; /* as dot_t_bf16_tile */
        if ((q & 15) == 0) {
            if (off < row_bytes)
                for (int i = 0; i < 16; i++) _mm_prefetch(rows[i] + off, BT_MM_PF_HINT);
            else if (next && off - row_bytes < row_bytes)
                for (int i = 0; i < 16; i++) _mm_prefetch(next[i] + (off - row_bytes), BT_MM_PF_HINT);
        }
        __m256 r[2][8];
        for (int v = 0; v < 2; v++) {
            for (int i = 0; i < 8; i++) r[v][i] = _mm256_loadu_ps((const float *)(rows[8 * v + i] + q * 4));
            bt_cpu_transpose8(r[v]);
        }
        dot_t_bf16_avx2_pairs(RN, 8, r, pcols, q, acc);
    }
    if (q < kp) {
        /* the last < 8 pairs: whole pairs, then (odd k) element k-1 alone, its high half zero */
        const int n = (int)(kp - q);
        __m256 r[2][8];
        for (int v = 0; v < 2; v++) {
            for (int i = 0; i < 8; i++) {
                uint16_t h[16] = {0};
                memcpy(h, rows[8 * v + i] + q * 4, (size_t)(k - 2 * q) * 2);
                r[v][i] = _mm256_loadu_ps((const float *)h);
            }
            bt_cpu_transpose8(r[v]);
        }
        dot_t_bf16_avx2_pairs(RN, n, r, pcols, q, acc);
    }
    for (int v = 0; v < 2; v++) {
        const int n = nrows - 8 * v > 8 ? 8 : nrows - 8 * v;
        if (n <= 0) continue;
        for (int j = 0; j < RN; j++) vf_store_n(dcols[j] + row0 + 8 * v, acc[v][j], n);
    }
}

typedef void (*dot_t_bf16_fn)(int64_t k, const char *const *rows, const char *const *next,
                              const uint32_t *const *pcols, float *const *dcols, int64_t row0,
                              int nrows);
#define DEF_DOT_TB(RN)                                                                         \
    static void dot_t_bf16_##RN(int64_t k, const char *const *rows, const char *const *next,    \
                                const uint32_t *const *pcols, float *const *dcols, int64_t row0, \
                                int nrows) {                                                   \
        dot_t_bf16_avx2_tile(RN, k, rows, next, pcols, dcols, row0, nrows);                   \
    }
DEF_DOT_TB(1) DEF_DOT_TB(2) DEF_DOT_TB(3) DEF_DOT_TB(4) DEF_DOT_TB(5) DEF_DOT_TB(6) DEF_DOT_TB(7)

/* Dot path for BF16 weights over rows [r0, r1) of a job with 1..7 columns;
 * the columns are converted to BF16 pairs into tmp first (once a node, as
 * run_dot_t_bf16 on AVX-512). */
static void run_dot_t_bf16(const struct mm_plan *pl, const char *a, int64_t ncols,
                           const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                           uint32_t *tmp, struct mm_claim *cl) {
    static const dot_t_bf16_fn fns[8] = {NULL, dot_t_bf16_1, dot_t_bf16_2, dot_t_bf16_3,
                                         dot_t_bf16_4, dot_t_bf16_5, dot_t_bf16_6, dot_t_bf16_7};
    BT_ASSERT(ncols >= 1 && ncols < 8);
    const int64_t k = pl->k, kp = (k + 1) / 2;
    struct mm_bf16_cols *c = pl->bfc;
    bool same = c->n == ncols;
    for (int64_t j = 0; j < ncols && same; j++) same = c->src[j] == bcols[j];
    const uint32_t *pcols[8];
    for (int64_t j = 0; j < ncols; j++) {
        if (!same) {
            f32_to_bf16_pairs_c(bcols[j], k, tmp + j * kp);
            c->src[j] = bcols[j];
        }
        pcols[j] = tmp + j * kp;
    }
    c->n = ncols;
    for (int64_t r = r0; r < r1; r += 16) {
        const int n = (int)(r1 - r < 16 ? r1 - r : 16);
        const char *rows[16], *next[16];
        for (int i = 0; i < 16; i++) {
            rows[i] = a + (size_t)(r + (i < n ? i : n - 1)) * pl->a_nb1;
            next[i] = a + (size_t)(r + 16 + i < r1 ? r + 16 + i : r1 - 1) * pl->a_nb1;
        }
        /* the range's last tile: the first rows of the thread's next chunk */
        const bool has_next = r + 16 < r1 || claim_next(pl, cl, 16, (const void **)next);
        fns[ncols](k, rows, has_next ? next : NULL, pcols, dcols, r, n);
    }
}

#if BT_CPU_BF16_REPACK
/* Repacked BF16 weights (qtypes.h: pair q of row r of a group of 16 rows at
 * dword 16 q + r): 8 rows' pair q are one vector as they lie, so a step
 * needs no transposes and holds no rows in registers.  G groups (16 G rows)
 * x RN columns; each row in the pair order of dot_t_bf16_avx2_pairs (the
 * same bits), 2 G chains of dependent FMAs per column.  cf[j]: column j as
 * floats, cf[j][2q] its element 2q+1 rounded to BF16, cf[j][2q+1] element
 * 2q.  next: the group after these (a prefetch hint) or NULL. */
static inline __attribute__((always_inline)) void dot_rp_bf16_tile(const int G, const int RN, int64_t kp,
                                                                    const char *group, const char *next,
                                                                    const float *const *cf, float *const *dcols,
                                                                    int64_t row0) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const int64_t bytes = kp * 64; /* of a group (a repacked matrix is contiguous) */
    __m256 acc[4][BT_MM_GEMM_MIN_COLS];
    for (int v = 0; v < 2 * G; v++)
        for (int j = 0; j < RN; j++) acc[v][j] = _mm256_setzero_ps();
    for (int64_t q = 0; q < kp; q++) {
        const int64_t off = q * 64 + BT_MM_PREFETCH_T;
        for (int g = 0; g < G; g++) {
            if (off < bytes) _mm_prefetch(group + g * bytes + off, BT_MM_PF_HINT);
            else if (next && off - bytes < bytes) _mm_prefetch(next + g * bytes + (off - bytes), BT_MM_PF_HINT);
        }
        __m256 b1[BT_MM_GEMM_MIN_COLS], b0[BT_MM_GEMM_MIN_COLS];
#pragma GCC unroll 8
        for (int j = 0; j < RN; j++) {
            b1[j] = _mm256_broadcast_ss(cf[j] + 2 * q);
            b0[j] = _mm256_broadcast_ss(cf[j] + 2 * q + 1);
        }
#pragma GCC unroll 4
        for (int v = 0; v < 2 * G; v++) {
            const __m256i wi =
                _mm256_loadu_si256((const __m256i *)(group + (v / 2) * bytes + q * 64 + (v % 2) * 32));
            const __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(wi, hi));
            const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(wi, 16));
#pragma GCC unroll 8
            for (int j = 0; j < RN; j++) acc[v][j] = _mm256_fmadd_ps(w0, b0[j], _mm256_fmadd_ps(w1, b1[j], acc[v][j]));
        }
    }
    for (int v = 0; v < 2 * G; v++)
        for (int j = 0; j < RN; j++) _mm256_storeu_ps(dcols[j] + row0 + 8 * v, acc[v][j]);
}

typedef void (*dot_rp_bf16_fn)(int64_t kp, const char *group, const char *next, const float *const *cf,
                               float *const *dcols, int64_t row0);
#define DEF_DOT_RB(G, RN)                                                                             \
    static void dot_rp_bf16_##G##_##RN(int64_t kp, const char *group, const char *next,              \
                                       const float *const *cf, float *const *dcols, int64_t row0) { \
        dot_rp_bf16_tile(G, RN, kp, group, next, cf, dcols, row0);                                   \
    }
DEF_DOT_RB(2, 1) DEF_DOT_RB(2, 2)
DEF_DOT_RB(1, 1) DEF_DOT_RB(1, 2) DEF_DOT_RB(1, 3) DEF_DOT_RB(1, 4) DEF_DOT_RB(1, 5) DEF_DOT_RB(1, 6)
DEF_DOT_RB(1, 7)

/* The dot path for repacked BF16 weights over rows [r0, r1) (multiples of
 * 16) of a job with 1..7 columns: two groups at a time for one or two
 * columns (four or eight chains), else one; the columns converted into tmp
 * once a node (pl->bfc, as run_dot_t_bf16). */
static void run_dot_rp_bf16(const struct mm_plan *pl, const char *a, int64_t ncols, const float *const *bcols,
                            float *const *dcols, int64_t r0, int64_t r1, float *tmp, struct mm_claim *cl) {
    static const dot_rp_bf16_fn one[8] = {NULL, dot_rp_bf16_1_1, dot_rp_bf16_1_2, dot_rp_bf16_1_3,
                                          dot_rp_bf16_1_4, dot_rp_bf16_1_5, dot_rp_bf16_1_6, dot_rp_bf16_1_7};
    static const dot_rp_bf16_fn two[3] = {NULL, dot_rp_bf16_2_1, dot_rp_bf16_2_2};
    BT_ASSERT(ncols >= 1 && ncols < BT_MM_GEMM_MIN_COLS && pl->k % BT_CPU_BF16_RP_BLK == 0);
    BT_ASSERT(r0 % BT_CPU_PANEL_ROWS == 0 && r1 % BT_CPU_PANEL_ROWS == 0);
    const int64_t kp = pl->k / 2;
    struct mm_bf16_cols *c = pl->bfc;
    bool same = c->n == ncols;
    for (int64_t j = 0; j < ncols && same; j++) same = c->src[j] == bcols[j];
    const float *cf[BT_MM_GEMM_MIN_COLS];
    for (int64_t j = 0; j < ncols; j++) {
        float *dst = tmp + j * 2 * kp;
        if (!same) {
            for (int64_t q = 0; q < kp; q++) {
                dst[2 * q] = bt_bf16_to_fp32(bf16_round(bcols[j][2 * q + 1]));
                dst[2 * q + 1] = bt_bf16_to_fp32(bf16_round(bcols[j][2 * q]));
            }
            c->src[j] = bcols[j];
        }
        cf[j] = dst;
    }
    c->n = ncols;
    for (int64_t r = r0; r < r1;) {
        const int G = ncols <= 2 && r + 2 * BT_CPU_PANEL_ROWS <= r1 ? 2 : 1;
        const int64_t rn = r + G * BT_CPU_PANEL_ROWS;
        const void *next = a + (size_t)rn * pl->a_nb1;
        if (rn >= r1 && !claim_next(pl, cl, 1, &next)) next = NULL;
        (G == 2 ? two : one)[ncols](kp, a + (size_t)r * pl->a_nb1, next, cf, dcols, r);
        r = rn;
    }
}

/* Pack repacked rows [r0, r0+mc) (whole groups: MR is 16) x k [pc, pc+kc)
 * (whole pairs) into MR-row panels as pack_a does: each pair's two halves
 * straight from the group's vectors */
static void pack_a_rp(const struct mm_plan *pl, const char *a, int64_t r0, int64_t mc, int64_t pc, int64_t kc,
                      float *restrict ap) {
    _Static_assert(MR == BT_CPU_PANEL_ROWS, "a panel is a repacked group");
    BT_ASSERT(r0 % MR == 0 && mc % MR == 0 && pc % 2 == 0 && kc % 2 == 0);
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    const int64_t kp = packed_k(kc);
    for (int64_t p0 = 0; p0 < mc; p0 += MR) {
        const char *group = a + (size_t)(r0 + p0) * pl->a_nb1 + (size_t)(pc / 2) * 64;
        float *panel = ap + p0 * kp;
        for (int64_t q = 0; q < kc / 2; q++)
            for (int v = 0; v < 2; v++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(group + q * 64 + v * 32));
                _mm256_storeu_ps(panel + (2 * q) * MR + 8 * v, _mm256_castsi256_ps(_mm256_and_si256(w, hi)));
                _mm256_storeu_ps(panel + (2 * q + 1) * MR + 8 * v, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
            }
    }
}
#endif
#else
#define HAVE_BF16_DOT_AVX2 0
#endif

/* BF16 weights: rows [r0, r1) of a job (on x86 without vdpbf16ps, under
 * bf16_fp_begin) */
static void run_bf16(const struct mm_plan *pl, const char *a, int64_t ncols, const float *const *bcols,
                     float *const *dcols, int64_t r0, int64_t r1, char *slice, const struct mm_slice *sl,
                     struct mm_claim *cl) {
#if BT_CPU_BF16_REPACK
    if (pl->repacked && ncols < BT_MM_GEMM_MIN_COLS) {
        run_dot_rp_bf16(pl, a, ncols, bcols, dcols, r0, r1, (float *)(slice + sl->tmp), cl);
        return;
    }
#endif
#if HAVE_BF16_DOT || HAVE_BF16_DOT_AVX2
    if (ncols < BT_MM_GEMM_MIN_COLS) {
        run_dot_t_bf16(pl, a, ncols, bcols, dcols, r0, r1, (uint32_t *)(slice + sl->tmp), cl);
        return;
    }
    pl->bfc->n = 0; /* the GEMM path writes into tmp */
#else
    (void)cl;
#endif
#if HAVE_BF16_DOT
    run_gemm_bf16(pl, a, ncols, bcols, dcols, r0, r1, (uint32_t *)(slice + sl->ap), (uint32_t *)(slice + sl->bp),
                  (uint32_t *)(slice + sl->tmp));
#else
    run_gemm(pl, a, ncols, bcols, dcols, r0, r1, (float *)(slice + sl->ap), (float *)(slice + sl->bp),
             (float *)(slice + sl->tmp));
#endif
}

/* Rows [r0, r1) of job jb on this thread. */
static void run_job(const struct mm_plan *pl, int64_t jb, int64_t r0, int64_t r1, char *slice,
                    const struct mm_slice *sl, struct mm_claim *cl) {
    const int64_t ncols = job_ncols(pl, jb);
    const void **bcols = (const void **)(slice + sl->bcols);
    float **dcols = (float **)(slice + sl->dcols);
    job_cols(pl, jb, bcols, dcols);
    const char *a = job_a(pl, jb);
    if (pl->qt) {
        run_q(pl, a, ncols, bcols, dcols, r0, r1, slice + sl->tmp, cl);
        return;
    }
    if (pl->type == BT_TYPE_BF16) {
#if BF16_MXCSR
        const unsigned csr = bf16_fp_begin();
        run_bf16(pl, a, ncols, (const float *const *)bcols, dcols, r0, r1, slice, sl, cl);
        bf16_fp_end(csr);
#else
        run_bf16(pl, a, ncols, (const float *const *)bcols, dcols, r0, r1, slice, sl, cl);
#endif
        return;
    }
    struct mm_after c = {pl, cl};
    bt_cpu_fdot_rows(pl->type, a, pl->a_nb1, pl->k, ncols, (const float *const *)bcols, dcols, r0, r1,
                     (float *)(slice + sl->ap), (struct bt_cpu_next){claim_after, &c});
}


/* Split the jobs' rows, in units of UNIT_ROWS weighted by their column count,
 * into nth contiguous shares; run this thread's share. */
static void run_plan_static(const struct bt_cpu_params *p, const struct mm_plan *pl, char *slice,
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
        run_job(pl, jb, r0, r1, slice, sl, NULL);
    }
}

/* Hand the jobs' rows out in chunks of whole UNIT_ROWS units, job by job,
 * from the node's shared counter (bt_cpu_next_chunk): each thread takes the
 * next chunk when it is done with its last, so a thread that the OS slows
 * (preempted, or sharing its core with another rank) leaves its share to the
 * others instead of holding them at the barrier.  About BT_MM_CHUNKS chunks
 * per thread, smaller ones near the end (chunk_end).  Which thread computes a row never changes the
 * row's bits (see the top of this file).  Jobs of many columns (the GEMM
 * paths: prompts) keep one contiguous share per thread (run_plan_static):
 * their columns are packed once per share, which small chunks would repeat.
 * So do callers without a counter (p->chunk NULL: a test that runs each
 * thread's share in turn). */
#ifndef BT_MM_CHUNKS
#define BT_MM_CHUNKS 16
#endif
#ifndef BT_MM_TAIL
#define BT_MM_TAIL 4 /* near a node's end, a chunk is 1 / (nth BT_MM_TAIL) of what is left */
#endif
static void run_plan(const struct bt_cpu_params *p, const struct mm_plan *pl, char *slice,
                     const struct mm_slice *sl) {
    const int64_t units_per_job = (pl->m + UNIT_ROWS - 1) / UNIT_ROWS;
    int64_t n_active = 0, widest = 0;
    for (int64_t jb = 0; jb < pl->njobs; jb++) {
        const int64_t nc = job_ncols(pl, jb);
        if (nc > 0) n_active++;
        if (nc > widest) widest = nc;
    }
    if (n_active == 0) return;
    if (widest >= BT_MM_GEMM_MIN_COLS || p->nth == 1 || !p->chunk) {
        run_plan_static(p, pl, slice, sl);
        return;
    }
    /* at most cu units per chunk (chunk_end) */
    int64_t cu = units_per_job * n_active / ((int64_t)p->nth * BT_MM_CHUNKS);
    if (cu < 1) cu = 1;
    if (cu > units_per_job) cu = units_per_job;
    struct mm_claim cl = {.p = p, .upj = units_per_job, .units = units_per_job * n_active, .cu = cu,
                          .tail = (int64_t)p->nth * BT_MM_TAIL, .c = -1, .jb = -1, .active = -1};
    for (int64_t s = 0; s < cl.units; s = chunk_end(&cl, s)) cl.n_chunks++;
    /* a thread's chunks come in increasing order, so one walk over the
     * chunks and the jobs finds them all.  The last tile of a chunk may
     * claim the next (struct mm_claim). */
    for (int64_t c = bt_cpu_next_chunk(p); c < cl.n_chunks;) {
        int64_t r0, r1;
        chunk_rows(pl, &cl, c, &r0, &r1);
        cl.c = -1;
        run_job(pl, cl.jb, r0, r1, slice, sl, &cl);
        c = cl.c >= 0 ? cl.c : bt_cpu_next_chunk(p);
    }
}

/* ---- reference kernels --------------------------------------------------------- */

/* d[:, j] = a x b[:, j] for rows [r0, r1), converting each a row with
 * bt_row_to_f32 (row: k floats, then room for one row of a's bytes, where a
 * repacked row is unpacked first). */
static void ref_rows(enum bt_type type, bool repacked, const char *a, size_t a_nb1, int64_t k, const float *b,
                     float *d, int64_t r0, int64_t r1, float *row) {
    for (int64_t i = r0; i < r1; i++) {
        const char *ai = a + (size_t)i * a_nb1;
        if (repacked) {
            void *plain = row + k;
            bt_cpu_rp_row(type, k, a, a_nb1, i, plain);
            ai = plain;
        }
        bt_row_to_f32(type, ai, row, k);
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
                ref_rows(a->type, bt_cpu_weight_is_repacked(a), a0, a->nb[1], a->ne[0], bc, dc, r0, r1, row);
            }
}

/* ---- entry points --------------------------------------------------------------- */

/* Every well-formed product (src/ops.c) whose weights are F32, F16, BF16 or
 * a type of qtypes.h's table has a CPU kernel: the fast paths fall back to
 * portable code, so there is no other CPU-specific limit. */
bool bt_cpu_mul_mat_supported(const struct bt_tensor *node) {
    if (node->op != BT_OP_MUL_MAT && node->op != BT_OP_MUL_MAT_ID) return false;
    if (!bt_op_is_well_formed(node)) return false;
    const enum bt_type t = node->src[0]->type;
    return t == BT_TYPE_F32 || t == BT_TYPE_F16 || t == BT_TYPE_BF16 || bt_cpu_qtype_of(t) != NULL;
}

size_t bt_cpu_mul_mat_work_size(const struct bt_tensor *node, int nth) {
    const struct mm_slice sl = slice_layout(node);
    return sl.shared + sl.size * (size_t)(nth > 0 ? nth : 1);
}

static char *thread_slice(const struct bt_cpu_params *p, const struct mm_slice *sl) {
    BT_ASSERT(p->wdata && sl->shared + sl->size * (size_t)p->nth <= p->wsize);
    return (char *)p->wdata + sl->shared + sl->size * (size_t)p->ith;
}

void bt_cpu_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *d) {
    const struct bt_tensor *a = d->src[0], *b = d->src[1];
    const struct mm_slice sl = slice_layout(d);
    char *slice = thread_slice(p, &sl);
    /* a group's share of the columns (bt_tensor col_lo/hi of the node):
     * the product of those columns of b alone (each column's bits do not
     * depend on the others: qtypes.h) */
    struct bt_tensor b_cols, d_cols;
    if (d->col_hi > 0) {
        BT_ASSERT(b->ne[2] == 1 && b->ne[3] == 1 && d->col_lo >= 0 && d->col_hi <= b->ne[1]);
        b_cols = *b;
        b_cols.data = (char *)b->data + (size_t)d->col_lo * b->nb[1];
        b_cols.ne[1] = d->col_hi - d->col_lo;
        d_cols = *d;
        d_cols.data = (char *)d->data + (size_t)d->col_lo * d->nb[1];
        d_cols.ne[1] = b_cols.ne[1];
        d_cols.col_lo = d_cols.col_hi = 0;
        d_cols.src[1] = &b_cols;
        b = &b_cols;
        d = &d_cols;
    }
    /* a group's share of the rows (bt_tensor row_lo/hi): the product of
     * those rows alone, as tensors that begin at row_lo (a multiple of the
     * repacked groups' rows); each element the same bits as in the whole */
    struct bt_tensor a_rows, d_rows;
    if (a->row_hi > 0) {
        BT_ASSERT(a->ne[2] == 1 && a->ne[3] == 1 && a->row_lo % BT_CPU_PANEL_ROWS == 0 && a->row_hi <= a->ne[1]);
        a_rows = *a;
        a_rows.data = (char *)a->data + (size_t)a->row_lo * a->nb[1];
        a_rows.ne[1] = a->row_hi - a->row_lo;
        a_rows.row_lo = a_rows.row_hi = 0;
        d_rows = *d;
        d_rows.data = (char *)d->data + (size_t)a->row_lo * d->nb[0];
        d_rows.ne[0] = a_rows.ne[1];
        d_rows.src[0] = &a_rows;
        a = &a_rows;
        d = &d_rows;
    }
    /* a group's share of the matrices (bt_tensor expert_lo/hi: an
     * attention's per-head products): those matrices of the input and the
     * result alone, each element the same bits as in the whole */
    struct bt_tensor a_mats, b_mats, d_mats;
    if (a->expert_hi > 0) {
        const int64_t lo = a->expert_lo, n = a->expert_hi - a->expert_lo;
        BT_ASSERT(a->row_hi == 0 && a->ne[3] == 1 && b->ne[2] == a->ne[2] && b->ne[3] == 1 && a->expert_hi <= a->ne[2]);
        a_mats = *a;
        a_mats.data = (char *)a->data + (size_t)lo * a->nb[2];
        a_mats.ne[2] = n;
        a_mats.expert_lo = a_mats.expert_hi = 0;
        b_mats = *b;
        b_mats.data = (char *)b->data + (size_t)lo * b->nb[2];
        b_mats.ne[2] = n;
        d_mats = *d;
        d_mats.data = (char *)d->data + (size_t)lo * d->nb[2];
        d_mats.ne[2] = n;
        d_mats.src[0] = &a_mats;
        d_mats.src[1] = &b_mats;
        a = &a_mats;
        b = &b_mats;
        d = &d_mats;
    }
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
    pl.qt = bt_cpu_qtype_of(a->type);
    struct mm_bf16_cols bfc = {0};
    pl.bfc = &bfc;
    pl.repacked = bt_cpu_weight_is_repacked(a);
    BT_ASSERT(!pl.repacked || bt_cpu_rp_layout_of(pl.type)); /* the kernels that read it */
    if (pl.qt) quantize_acts(p, &pl, &sl, (char *)p->wdata, slice + sl.qact, NULL);
    run_plan(p, &pl, slice, &sl);
}

void bt_cpu_mul_mat_id(const struct bt_cpu_params *p, struct bt_tensor *d) {
    const struct bt_tensor *as = d->src[0], *b = d->src[1], *ids = d->src[2];
    const int64_t n_expert = as->ne[2], n_used = ids->ne[0], n_tokens = ids->ne[1];
    /* the experts held here (an expert group's share: bt_tensor) */
    const int64_t lo = as->expert_hi > 0 ? as->expert_lo : 0, hi = as->expert_hi > 0 ? as->expert_hi : n_expert;
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
            if (id >= lo && id < hi) offs[id + 1]++;
        }

    if (p->reference) {
        float *row = (float *)(slice + sl.tmp);
        const int64_t m = as->ne[1], r0 = m * p->ith / p->nth, r1 = m * (p->ith + 1) / p->nth;
        for (int64_t t = 0; t < n_tokens; t++)
            for (int64_t e = 0; e < n_used; e++) {
                const int32_t id = *(const int32_t *)((const char *)ids->data +
                                                      (size_t)e * ids->nb[0] + (size_t)t * ids->nb[1]);
                if (id < lo || id >= hi) continue;
                const float *bc = (const float *)((const char *)b->data +
                                                  (size_t)(e % b->ne[1]) * b->nb[1] +
                                                  (size_t)t * b->nb[2]);
                float *dc = (float *)((char *)d->data + (size_t)e * d->nb[1] + (size_t)t * d->nb[2]);
                ref_rows(as->type, bt_cpu_weight_is_repacked(as), (const char *)as->data + (size_t)id * as->nb[2], as->nb[1],
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
            if (id >= lo && id < hi) pairs[offs[id]++] = (int32_t)(e + n_used * t);
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
    pl.qt = bt_cpu_qtype_of(as->type);
    struct mm_bf16_cols bfc = {0};
    pl.bfc = &bfc;
    pl.repacked = bt_cpu_weight_is_repacked(as);
    BT_ASSERT(!pl.repacked || bt_cpu_rp_layout_of(pl.type)); /* the kernels that read it */
    if (pl.qt) quantize_acts(p, &pl, &sl, (char *)p->wdata, slice + sl.qact, (uint8_t *)(slice + sl.need));
    run_plan(p, &pl, slice, &sl);
}
