/* ops_cpu.c - CPU kernels for every op except MUL_MAT / MUL_MAT_ID.
 *
 * Each kernel is called by all nth threads of a run with the same node; a
 * thread takes a contiguous range of rows (thread_range).  One output
 * element is always computed entirely by one thread, in a fixed order, so
 * the result is bitwise the same for any thread count.
 *
 * Every kernel reads its sources through their nb[] strides (views,
 * permutations) and writes dst through dst->nb[] (CPY's and SET_ROWS' dst is
 * a view into another tensor).  Semantics are those documented in ops.h.
 *
 * Scratch: each thread owns op_scratch_bytes(node) bytes of the work buffer
 * at wdata + ith * op_scratch_bytes(node).
 */
#include "cpu_impl.h"
#include "cpu_variant.h"
#include "qtypes.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------ */

static inline void thread_range(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1) {
    const int64_t dr = (n + nth - 1) / nth;
    int64_t a = dr * ith;
    int64_t b = a + dr;
    if (a > n) a = n;
    if (b > n) b = n;
    *r0 = a;
    *r1 = b;
}

/* row index ir (over ne1*ne2*ne3 of t) -> (i1, i2, i3) */
static inline void row_index(const struct bt_tensor *t, int64_t ir, int64_t *i1, int64_t *i2,
                             int64_t *i3) {
    const int64_t n1 = t->ne[1], n2 = t->ne[2];
    *i3 = ir / (n1 * n2);
    ir -= *i3 * n1 * n2;
    *i2 = ir / n1;
    *i1 = ir - *i2 * n1;
}

static inline char *row_ptr(const struct bt_tensor *t, int64_t i1, int64_t i2, int64_t i3) {
    return (char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

static inline bool is_quant(enum bt_type t) { return bt_type_traits(t)->is_quantized; }

/* Elements along dim 0 are packed (for block types: blocks are packed). */
static inline bool row_packed(const struct bt_tensor *t) { return t->nb[0] == bt_type_size(t->type); }

/* A row of n elements at `row` (stride nb0) as F32 into out[n]. */
static void load_row_f32(const struct bt_tensor *t, const char *row, float *out, int64_t n) {
    if (row_packed(t)) {
        bt_row_to_f32(t->type, row, out, n);
        return;
    }
    const size_t nb0 = t->nb[0];
    if (t->type == BT_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) out[i] = *(const float *)(row + i * nb0);
    } else {
        BT_ASSERT(!is_quant(t->type));
        for (int64_t i = 0; i < n; i++) bt_row_to_f32(t->type, row + i * nb0, out + i, 1);
    }
}

/* in[n] F32 into a row of t at `row` (stride nb0), converted to t's type. */
static void store_row_f32(const struct bt_tensor *t, char *row, const float *in, int64_t n) {
    if (row_packed(t)) {
        bt_row_from_f32(t->type, in, row, n);
        return;
    }
    const size_t nb0 = t->nb[0];
    if (t->type == BT_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) *(float *)(row + i * nb0) = in[i];
    } else {
        BT_ASSERT(!is_quant(t->type));
        for (int64_t i = 0; i < n; i++) bt_row_from_f32(t->type, in + i, row + i * nb0, 1);
    }
}

static inline float f32_at(const char *row, size_t nb0, int64_t i) {
    return *(const float *)(row + i * nb0);
}
static inline float *f32_ptr(char *row, size_t nb0, int64_t i) { return (float *)(row + i * nb0); }

/* ---- scratch ------------------------------------------------------------ */

static int64_t max_ne0(const struct bt_tensor *node) {
    int64_t m = node->ne[0];
    for (int s = 0; s < BT_MAX_SRC; s++)
        if (node->src[s] && node->src[s]->ne[0] > m) m = node->src[s]->ne[0];
    return m;
}

#define CPY_CHUNK 1024 /* elements per chunk of a flat conversion (multiple of BT_QK) */

static size_t op_scratch_bytes(const struct bt_tensor *node) {
    int64_t n = 0; /* floats per thread */
    switch (node->op) {
        case BT_OP_GET_ROWS: /* a row as floats, and a repacked row's plain bytes (< 4 per element) */
            n = 2 * max_ne0(node);
            break;
        case BT_OP_SET_ROWS:
        case BT_OP_SOFT_MAX:
            n = max_ne0(node);
            break;
        case BT_OP_ROPE: /* a token's cos and sin, and the frequencies */
            n = 2 * max_ne0(node);
            break;
        case BT_OP_CPY:
        case BT_OP_CONT:
            n = max_ne0(node);
            if (n < CPY_CHUNK) n = CPY_CHUNK;
            break;
        case BT_OP_ARGSORT:
            n = 3 * max_ne0(node); /* values, indices, merge buffer */
            break;
        default:
            return 0;
    }
    return ((size_t)n * sizeof(float) + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN;
}

size_t bt_cpu_op_work_size(const struct bt_tensor *node, int nth) {
    return op_scratch_bytes(node) * (size_t)(nth > 0 ? nth : 1);
}

static void *scratch(const struct bt_cpu_params *p, const struct bt_tensor *node) {
    const size_t per = op_scratch_bytes(node);
    BT_ASSERT(p->wdata && p->wsize >= per * (size_t)p->nth);
    return (char *)p->wdata + per * (size_t)p->ith;
}

/* ---- binary element-wise: ADD SUB MUL DIV (b broadcast) ----------------- */

static void compute_binary(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t n0 = dst->ne[0], nb_0 = b->ne[0];
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    const enum bt_op op = dst->op;
    const bool fast = a->nb[0] == 4 && b->nb[0] == 4 && dst->nb[0] == 4 && nb_0 == n0;
    /* b one value a row (a MoE's expert weights over its rows): the same
     * element operations, without an index division per element */
    const bool scalar = a->nb[0] == 4 && dst->nb[0] == 4 && nb_0 == 1;

    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const char *ra = row_ptr(a, i1, i2, i3);
        const char *rb = row_ptr(b, i1 % b->ne[1], i2 % b->ne[2], i3 % b->ne[3]);
        char *rd = row_ptr(dst, i1, i2, i3);
        if (fast) {
            const float *x = (const float *)ra, *y = (const float *)rb;
            float *z = (float *)rd;
            switch (op) {
                case BT_OP_ADD: for (int64_t i = 0; i < n0; i++) z[i] = x[i] + y[i]; break;
                case BT_OP_SUB: for (int64_t i = 0; i < n0; i++) z[i] = x[i] - y[i]; break;
                case BT_OP_MUL: for (int64_t i = 0; i < n0; i++) z[i] = x[i] * y[i]; break;
                case BT_OP_DIV: for (int64_t i = 0; i < n0; i++) z[i] = x[i] / y[i]; break;
                default: BT_ASSERT(false);
            }
            continue;
        }
        if (scalar) {
            const float *x = (const float *)ra, y = f32_at(rb, b->nb[0], 0);
            float *z = (float *)rd;
            switch (op) {
                case BT_OP_ADD: for (int64_t i = 0; i < n0; i++) z[i] = x[i] + y; break;
                case BT_OP_SUB: for (int64_t i = 0; i < n0; i++) z[i] = x[i] - y; break;
                case BT_OP_MUL: for (int64_t i = 0; i < n0; i++) z[i] = x[i] * y; break;
                case BT_OP_DIV: for (int64_t i = 0; i < n0; i++) z[i] = x[i] / y; break;
                default: BT_ASSERT(false);
            }
            continue;
        }
        for (int64_t i = 0, ib = 0; i < n0; i++, ib = ib + 1 == nb_0 ? 0 : ib + 1) {
            const float x = f32_at(ra, a->nb[0], i);
            const float y = f32_at(rb, b->nb[0], ib);
            float z;
            switch (op) {
                case BT_OP_ADD: z = x + y; break;
                case BT_OP_SUB: z = x - y; break;
                case BT_OP_MUL: z = x * y; break;
                case BT_OP_DIV: z = x / y; break;
                default: BT_ASSERT(false); z = 0;
            }
            *f32_ptr(rd, dst->nb[0], i) = z;
        }
    }
}

/* ---- unary element-wise ------------------------------------------------- */

#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535587989211986876f

/* silu(x) = x / (1 + e^-x), e^-x by one fixed sequence of IEEE operations
 * (Cephes' expf: n = rint(y log2 e), r = y - n ln 2 by two fma's, a degree-6
 * polynomial by fma's, times 2^n made from its bits), with y = -x clamped to
 * [-87, 88] so that every step stays a normal float (past the clamp 1 + e^y
 * is 1, or silu is 0 to within 6e-37; a NaN x gives NaN).  silu_f32,
 * silu_v8 (AVX2, 8 lanes) and silu_v16 (AVX-512, 16 lanes) take the same
 * steps, as do swiglu_oai_f32 and its _v8 and _v16 (gpt-oss's clamped
 * SwiGLU, e^-(alpha x) the same way), so they give the same bits for every x (test_ops checks under
 * each kernel variant), and whether an element is in a vector or in a
 * row's tail never shows.  glibc's expf, one element at a time, had made
 * SWIGLU about 2.5% of a decode step, and the plain C steps (a call to
 * libm's fmaf each where the file is built for the x86-64 baseline) about
 * 9% of a prompt's time in the portable build.  e^-x is within about 2
 * ulp. */
#define SILU_Y_MIN -87.0f
#define SILU_Y_MAX 88.0f
#define SILU_LOG2E 1.44269504088896341f
#define SILU_LN2_HI 0.693359375f
#define SILU_LN2_LO -2.12194440e-4f
#define SILU_P0 1.9875691500e-4f
#define SILU_P1 1.3981999507e-3f
#define SILU_P2 8.3334519073e-3f
#define SILU_P3 4.1665795894e-2f
#define SILU_P4 1.6666665459e-1f
#define SILU_P5 5.0000001201e-1f

/* e^y for y clamped to [SILU_Y_MIN, SILU_Y_MAX], silu's steps */
static inline float exp_clamped(float y) {
    y = y > SILU_Y_MIN ? y : SILU_Y_MIN; /* as vmaxps: a NaN becomes the bound */
    y = y < SILU_Y_MAX ? y : SILU_Y_MAX;
    const float n = rintf(y * SILU_LOG2E);
    float r = fmaf(-n, SILU_LN2_HI, y);
    r = fmaf(-n, SILU_LN2_LO, r);
    float q = fmaf(SILU_P0, r, SILU_P1);
    q = fmaf(q, r, SILU_P2);
    q = fmaf(q, r, SILU_P3);
    q = fmaf(q, r, SILU_P4);
    q = fmaf(q, r, SILU_P5);
    q = fmaf(q, r * r, r) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return q * scale;
}

static inline float silu_f32(float x) {
    return x / (1.0f + exp_clamped(0.0f - x)); /* as the vector code: vsubps from zero */
}

/* gpt-oss's clamped SwiGLU (ops.h): the same steps for every element, so
 * the same bits alone or in any batch */
static inline float swiglu_oai_f32(float a, float b, float alpha, float limit) {
    const float x = a < limit ? a : limit;
    const float y = b < -limit ? -limit : b > limit ? limit : b;
    return x / (1.0f + exp_clamped(0.0f - alpha * x)) * (y + 1.0f);
}

/* gpt-oss's clamped SwiGLU's two parameters (ops.h: bt_swiglu_oai) */
struct oai_params {
    float alpha, limit;
};

/* The vector versions, for the portable build too: compiled for AVX2 and
 * AVX-512 whatever the file's -march, run up to the kernel variant's
 * instruction set where the CPU has it (attention's rule, attn.c), plain C
 * under p->reference.  Every lane of both takes silu_f32's steps, so
 * every choice gives the same bits. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SILU_X86 1
/* e = exp_clamped(0 - z), the same steps lane by lane */
#define EXPNEG_V_STEPS(V, P, SET1, SUB, MAX, MIN, ROUND, FNMADD, FMADD, ADD, MUL, CVTI, ADDI, SLLI, CASTF)      \
    V y = SUB(P##_setzero_ps(), z);                                                                      \
    y = MAX(y, SET1(SILU_Y_MIN));                                                                        \
    y = MIN(y, SET1(SILU_Y_MAX));                                                                        \
    const V n = ROUND(MUL(y, SET1(SILU_LOG2E)));                                                         \
    V r = FNMADD(n, SET1(SILU_LN2_HI), y);                                                               \
    r = FNMADD(n, SET1(SILU_LN2_LO), r);                                                                 \
    V q = FMADD(SET1(SILU_P0), r, SET1(SILU_P1));                                                        \
    q = FMADD(q, r, SET1(SILU_P2));                                                                      \
    q = FMADD(q, r, SET1(SILU_P3));                                                                      \
    q = FMADD(q, r, SET1(SILU_P4));                                                                      \
    q = FMADD(q, r, SET1(SILU_P5));                                                                      \
    q = ADD(FMADD(q, MUL(r, r), r), SET1(1.0f));                                                         \
    const V scale = CASTF(SLLI(ADDI(CVTI(n), P##_set1_epi32(127)), 23));                                 \
    return MUL(q, scale)
#define SILU_ROUND8(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SILU_ROUND16(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

__attribute__((target("avx2,fma"))) static inline __m256 expneg_v8(__m256 z) {
    EXPNEG_V_STEPS(__m256, _mm256, _mm256_set1_ps, _mm256_sub_ps, _mm256_max_ps, _mm256_min_ps, SILU_ROUND8,
                   _mm256_fnmadd_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_mul_ps, _mm256_cvtps_epi32,
                   _mm256_add_epi32, _mm256_slli_epi32, _mm256_castsi256_ps);
}
__attribute__((target("avx512f,fma"))) static inline __m512 expneg_v16(__m512 z) {
    EXPNEG_V_STEPS(__m512, _mm512, _mm512_set1_ps, _mm512_sub_ps, _mm512_max_ps, _mm512_min_ps, SILU_ROUND16,
                   _mm512_fnmadd_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_mul_ps, _mm512_cvtps_epi32,
                   _mm512_add_epi32, _mm512_slli_epi32, _mm512_castsi512_ps);
}
__attribute__((target("avx2,fma"))) static inline __m256 silu_v8(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), expneg_v8(x)));
}
__attribute__((target("avx512f,fma"))) static inline __m512 silu_v16(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), expneg_v16(x)));
}
/* swiglu_oai_f32's steps: min and max return their second operand where
 * the first is NaN or the two are equal, as the C ternaries do */
__attribute__((target("avx2,fma"))) static inline __m256 swiglu_oai_v8(__m256 a, __m256 b, float alpha, float limit) {
    const __m256 x = _mm256_min_ps(a, _mm256_set1_ps(limit));
    const __m256 y = _mm256_max_ps(_mm256_set1_ps(-limit), _mm256_min_ps(_mm256_set1_ps(limit), b));
    const __m256 e = expneg_v8(_mm256_mul_ps(_mm256_set1_ps(alpha), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                         _mm256_add_ps(y, _mm256_set1_ps(1.0f)));
}
__attribute__((target("avx512f,fma"))) static inline __m512 swiglu_oai_v16(__m512 a, __m512 b, float alpha,
                                                                          float limit) {
    const __m512 x = _mm512_min_ps(a, _mm512_set1_ps(limit));
    const __m512 y = _mm512_max_ps(_mm512_set1_ps(-limit), _mm512_min_ps(_mm512_set1_ps(limit), b));
    const __m512 e = expneg_v16(_mm512_mul_ps(_mm512_set1_ps(alpha), x));
    return _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                         _mm512_add_ps(y, _mm512_set1_ps(1.0f)));
}

/* d[i] = silu(a[i]) (b NULL), silu(a[i]) * b[i], or with oai swiglu_oai(a[i],
 * b[i]), i < n: 8 lanes, the tail masked */
__attribute__((target("avx2,fma"))) static void silu_row_avx2(int64_t n, const float *a, const float *b, float *d,
                                                              const struct oai_params *oai) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t i = 0; i < n; i += 8) {
        const int left = n - i >= 8 ? 8 : (int)(n - i);
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), lane);
        const __m256 x = _mm256_maskload_ps(a + i, m);
        __m256 v;
        if (oai)
            v = swiglu_oai_v8(x, _mm256_maskload_ps(b + i, m), oai->alpha, oai->limit);
        else if (b)
            v = _mm256_mul_ps(silu_v8(x), _mm256_maskload_ps(b + i, m));
        else
            v = silu_v8(x);
        _mm256_maskstore_ps(d + i, m, v);
    }
}
__attribute__((target("avx512f,fma"))) static void silu_row_avx512(int64_t n, const float *a, const float *b,
                                                                   float *d, const struct oai_params *oai) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 x = _mm512_maskz_loadu_ps(m, a + i);
        __m512 v;
        if (oai)
            v = swiglu_oai_v16(x, _mm512_maskz_loadu_ps(m, b + i), oai->alpha, oai->limit);
        else if (b)
            v = _mm512_mul_ps(silu_v16(x), _mm512_maskz_loadu_ps(m, b + i));
        else
            v = silu_v16(x);
        _mm512_mask_storeu_ps(d + i, m, v);
    }
}
#endif

/* the widest vector set for the elementwise rows: attention's choice */
static enum bt_cpu_attn_isa vec_isa(const struct bt_cpu_params *p) {
    if (!p->reference)
        for (int i = (int)bt_cpu_kernels()->attn; i > BT_CPU_ATTN_C; i--)
            if (bt_cpu_attn_isa_available((enum bt_cpu_attn_isa)i)) return (enum bt_cpu_attn_isa)i;
    return BT_CPU_ATTN_C;
}

/* silu_row_avx2's rows (packed) on the widest vector set isa allows */
static void silu_row(enum bt_cpu_attn_isa isa, int64_t n, const float *a, const float *b, float *d,
                     const struct oai_params *oai) {
#if defined(SILU_X86)
    if (isa == BT_CPU_ATTN_AVX512) {
        silu_row_avx512(n, a, b, d, oai);
        return;
    }
    if (isa == BT_CPU_ATTN_AVX2) {
        silu_row_avx2(n, a, b, d, oai);
        return;
    }
#endif
    (void)isa;
    for (int64_t i = 0; i < n; i++)
        d[i] = oai ? swiglu_oai_f32(a[i], b[i], oai->alpha, oai->limit) : b ? silu_f32(a[i]) * b[i] : silu_f32(a[i]);
}

/* ---- MOE_SUM: the slots' results weighted and summed ------------------------ */

/* z[i] = x[i] * y (first) or z[i] + x[i] * y: a product rounded, then added
 * (no FMA), the same steps in every lane of the vector forms */
static void moe_row_c(int64_t n, float *z, const float *x, float y, bool first) {
    if (first)
        for (int64_t i = 0; i < n; i++) z[i] = x[i] * y;
    else
        for (int64_t i = 0; i < n; i++) z[i] = z[i] + x[i] * y;
}
#if defined(SILU_X86)
__attribute__((target("avx2"))) static void moe_row_avx2(int64_t n, float *z, const float *x, float y, bool first) {
    const __m256 vy = _mm256_set1_ps(y);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vy);
        _mm256_storeu_ps(z + i, first ? v : _mm256_add_ps(_mm256_loadu_ps(z + i), v));
    }
    moe_row_c(n - i, z + i, x + i, y, first);
}
__attribute__((target("avx512f"))) static void moe_row_avx512(int64_t n, float *z, const float *x, float y,
                                                              bool first) {
    const __m512 vy = _mm512_set1_ps(y);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vy);
        _mm512_mask_storeu_ps(z + i, m, first ? v : _mm512_add_ps(_mm512_maskz_loadu_ps(m, z + i), v));
    }
}
#endif

/* A thread's share is a run of the result's rows, each written once and
 * summed in place while it stays in the L1 cache (a token's K slot rows are
 * read one after the other: one stream); with fewer rows than threads (a
 * decode step) the rows are divided into pieces of MOE_SUM_PIECE elements.
 * Every element: the product of slot 0, then each later slot's product
 * added, in slot order (MUL then ADDs; -ffp-contract=off keeps them apart). */
#define MOE_SUM_PIECE 512
static void compute_moe_sum(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *w = dst->src[1];
    const int64_t n0 = dst->ne[0], K = a->ne[1];
    const int64_t piece = dst->ne[1] >= p->nth ? n0 : MOE_SUM_PIECE, per_row = (n0 + piece - 1) / piece;
#if defined(SILU_X86)
    const enum bt_cpu_attn_isa isa = vec_isa(p);
#endif
    int64_t u0, u1;
    thread_range(per_row * dst->ne[1], p->ith, p->nth, &u0, &u1);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t t = u / per_row, i0 = (u % per_row) * piece;
        const int64_t n = n0 - i0 < piece ? n0 - i0 : piece;
        float *z = (float *)row_ptr(dst, t, 0, 0) + i0;
        for (int64_t k = 0; k < K; k++) {
            const float *x = (const float *)row_ptr(a, k, t, 0) + i0;
            const float y = *(const float *)row_ptr(w, k, t, 0);
#if defined(SILU_X86)
            if (isa == BT_CPU_ATTN_AVX512) {
                moe_row_avx512(n, z, x, y, k == 0);
                continue;
            }
            if (isa == BT_CPU_ATTN_AVX2) {
                moe_row_avx2(n, z, x, y, k == 0);
                continue;
            }
#endif
            moe_row_c(n, z, x, y, k == 0);
        }
    }
}

static inline float op_silu(float x) { return silu_f32(x); }
static inline float op_gelu(float x) {
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

#if defined(__GNUC__)
#define BT_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define BT_ALWAYS_INLINE inline
#endif

/* One row; inlined with constant strides 4 for packed rows so the compiler
 * can vectorise (same IEEE results either way: no reassociation). */
static BT_ALWAYS_INLINE void unary_row(enum bt_op op, int64_t n0, const char *ra, size_t sa,
                                       char *rd, size_t sd, float s) {
    switch (op) {
        case BT_OP_SCALE:
            for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, sd, i) = f32_at(ra, sa, i) * s;
            break;
        case BT_OP_SQR:
            for (int64_t i = 0; i < n0; i++) {
                const float x = f32_at(ra, sa, i);
                *f32_ptr(rd, sd, i) = x * x;
            }
            break;
        case BT_OP_SQRT:
            for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, sd, i) = sqrtf(f32_at(ra, sa, i));
            break;
        case BT_OP_SILU:
            for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, sd, i) = op_silu(f32_at(ra, sa, i));
            break;
        case BT_OP_GELU:
            for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, sd, i) = op_gelu(f32_at(ra, sa, i));
            break;
        case BT_OP_RELU:
            for (int64_t i = 0; i < n0; i++) {
                const float x = f32_at(ra, sa, i);
                *f32_ptr(rd, sd, i) = x > 0.0f ? x : 0.0f;
            }
            break;
        case BT_OP_SIGMOID:
            for (int64_t i = 0; i < n0; i++)
                *f32_ptr(rd, sd, i) = 1.0f / (1.0f + expf(-f32_at(ra, sa, i)));
            break;
        default: BT_ASSERT(false);
    }
}

static void compute_unary(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0];
    const int64_t n0 = dst->ne[0];
    const float s = dst->op == BT_OP_SCALE ? bt_get_op_param_f32(dst, 0) : 0.0f;
    const size_t sa = a->nb[0], sd = dst->nb[0];
    const bool packed = sa == sizeof(float) && sd == sizeof(float);
    const enum bt_cpu_attn_isa isa = vec_isa(p);
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const char *ra = row_ptr(a, i1, i2, i3);
        char *rd = row_ptr(dst, i1, i2, i3);
        if (packed && dst->op == BT_OP_SILU)
            silu_row(isa, n0, (const float *)ra, NULL, (float *)rd, NULL);
        else if (packed)
            unary_row(dst->op, n0, ra, sizeof(float), rd, sizeof(float), s);
        else
            unary_row(dst->op, n0, ra, sa, rd, sd, s);
    }
}

static void compute_swiglu(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *b = dst->src[1];
    const int64_t n0 = dst->ne[0];
    const bool oai = dst->op == BT_OP_SWIGLU_OAI;
    const struct oai_params oaip = {oai ? bt_get_op_param_f32(dst, 0) : 0.0f, oai ? bt_get_op_param_f32(dst, 1) : 0.0f};
    const bool packed = a->nb[0] == sizeof(float) && b->nb[0] == sizeof(float) && dst->nb[0] == sizeof(float);
    const enum bt_cpu_attn_isa isa = vec_isa(p);
    const struct bt_tensor *ids = dst->held_ids; /* only the rows of held experts (tensor.h) */
    /* a group's share of the tokens (tensor.h col_lo/hi): those rows alone */
    const int64_t lo = dst->col_hi > 0 ? dst->col_lo : 0, hi = dst->col_hi > 0 ? dst->col_hi : bt_nrows(dst);
    BT_ASSERT(dst->col_hi == 0 || (dst->ne[2] == 1 && dst->ne[3] == 1 && hi <= dst->ne[1]));
    int64_t r0, r1;
    thread_range(hi - lo, p->ith, p->nth, &r0, &r1);
    r0 += lo;
    r1 += lo;
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        if (ids) {
            const int32_t e = *(const int32_t *)((const char *)ids->data + i1 * ids->nb[0] + i2 * ids->nb[1]);
            if (e < dst->expert_lo || e >= dst->expert_hi) continue;
        }
        const char *ra = row_ptr(a, i1, i2, i3), *rb = row_ptr(b, i1, i2, i3);
        char *rd = row_ptr(dst, i1, i2, i3);
        if (packed)
            silu_row(isa, n0, (const float *)ra, (const float *)rb, (float *)rd, oai ? &oaip : NULL);
        else if (oai)
            for (int64_t i = 0; i < n0; i++)
                *f32_ptr(rd, dst->nb[0], i) =
                    swiglu_oai_f32(f32_at(ra, a->nb[0], i), f32_at(rb, b->nb[0], i), oaip.alpha, oaip.limit);
        else
            for (int64_t i = 0; i < n0; i++)
                *f32_ptr(rd, dst->nb[0], i) = op_silu(f32_at(ra, a->nb[0], i)) * f32_at(rb, b->nb[0], i);
    }
}

/* ---- row reductions: SUM_ROWS MEAN RMS_NORM NORM ------------------------ */

static void compute_sum_rows(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0];
    const int64_t n0 = a->ne[0];
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const char *ra = row_ptr(a, i1, i2, i3);
        double sum = 0.0;
        for (int64_t i = 0; i < n0; i++) sum += (double)f32_at(ra, a->nb[0], i);
        float v = (float)sum;
        if (dst->op == BT_OP_MEAN) v = (float)(sum / (double)n0);
        *(float *)row_ptr(dst, i1, i2, i3) = v;
    }
}

/* RMS_NORM's factor from a row's sum of squares (in double, element by element) */
static inline float rms_scale(double sum, int64_t n0, float eps) {
    const float mean = (float)(sum / (double)n0);
    return 1.0f / sqrtf(mean + eps);
}

static BT_ALWAYS_INLINE void norm_row(bool rms, int64_t n0, const char *ra, size_t sa, char *rd,
                                      size_t sd, float eps) {
    if (rms) {
        /* x / sqrt(mean(x^2) + eps) */
        double sum = 0.0;
        for (int64_t i = 0; i < n0; i++) {
            const float x = f32_at(ra, sa, i);
            sum += (double)(x * x);
        }
        const float scale = rms_scale(sum, n0, eps);
        for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, sd, i) = f32_at(ra, sa, i) * scale;
    } else {
        /* (x - mean) / sqrt(var + eps) */
        double sum = 0.0;
        for (int64_t i = 0; i < n0; i++) sum += (double)f32_at(ra, sa, i);
        const float mean = (float)(sum / (double)n0);
        double sum2 = 0.0;
        for (int64_t i = 0; i < n0; i++) {
            const float y = f32_at(ra, sa, i) - mean;
            sum2 += (double)(y * y);
        }
        const float var = (float)(sum2 / (double)n0);
        const float scale = 1.0f / sqrtf(var + eps);
        for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, sd, i) = (f32_at(ra, sa, i) - mean) * scale;
    }
}

/* RMS_NORM of NORM_ROWS packed rows at once: each row's sum of squares in
 * norm_row's order (element by element, in double), the rows' chains side
 * by side so that their additions overlap (one row's chain waits on the
 * latency of each addition); the same bits as norm_row. */
#define NORM_ROWS 8
static void rms_rows(int64_t n0, const float *const *a, float *const *d, float eps) {
    double sum[NORM_ROWS] = {0};
    for (int64_t i = 0; i < n0; i++)
        for (int r = 0; r < NORM_ROWS; r++) sum[r] += (double)(a[r][i] * a[r][i]);
    for (int r = 0; r < NORM_ROWS; r++) {
        const float scale = rms_scale(sum[r], n0, eps);
        for (int64_t i = 0; i < n0; i++) d[r][i] = a[r][i] * scale;
    }
}

#if defined(SILU_X86)
/* The same for 2 * NORM_ROWS rows with AVX-512 (AVX2), a lane a row: eight
 * (four) elements of each of eight (four) rows squared in float, widened to
 * double and transposed, so that one vector holds element i of its rows and
 * the rows' sums take element after element, each in its own lane, in
 * norm_row's order; two (four) such groups side by side.  The scaling pass
 * runs along the rows. */
__attribute__((target("avx512f"))) static inline void rms_t8(__m512d v[8]) {
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    __m512d s[8], x[8];
    for (int r = 0; r < 8; r += 2) {
        s[r] = _mm512_unpacklo_pd(v[r], v[r + 1]); /* elements 0 2 4 6 of rows r, r+1 */
        s[r + 1] = _mm512_unpackhi_pd(v[r], v[r + 1]);
    }
    for (int h = 0; h < 2; h++) /* rows 0-3, then 4-7 */
        for (int o = 0; o < 2; o++) {
            x[4 * h + 2 * o] = _mm512_permutex2var_pd(s[4 * h + o], lo, s[4 * h + 2 + o]);     /* e0|e4, e1|e5 */
            x[4 * h + 2 * o + 1] = _mm512_permutex2var_pd(s[4 * h + o], hi, s[4 * h + 2 + o]); /* e2|e6, e3|e7 */
        }
    /* x[0] e0|e4, x[1] e2|e6, x[2] e1|e5, x[3] e3|e7 of rows 0-3; x[4..7] of rows 4-7 */
    static const int at[4] = {0, 2, 1, 3}; /* elements j and j + 4: x[at[j]] */
    for (int j = 0; j < 4; j++) {
        v[j] = _mm512_shuffle_f64x2(x[at[j]], x[4 + at[j]], 0x44); /* the low halves: e0 .. e3 */
        v[j + 4] = _mm512_shuffle_f64x2(x[at[j]], x[4 + at[j]], 0xee);
    }
}
__attribute__((target("avx512f"))) static void rms_rows_avx512(int64_t n0, const float *const *a, float *const *d,
                                                               float eps) {
    __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
    int64_t i = 0;
    for (; i + 8 <= n0; i += 8)
        for (int g = 0; g < 2; g++) {
            __m512d v[8];
            for (int r = 0; r < 8; r++) {
                const __m256 x = _mm256_loadu_ps(a[8 * g + r] + i);
                v[r] = _mm512_cvtps_pd(_mm256_mul_ps(x, x));
            }
            rms_t8(v);
            for (int j = 0; j < 8; j++) acc[g] = _mm512_add_pd(acc[g], v[j]);
        }
    double sum[2 * NORM_ROWS];
    _mm512_storeu_pd(sum, acc[0]);
    _mm512_storeu_pd(sum + 8, acc[1]);
    for (; i < n0; i++)
        for (int r = 0; r < 2 * NORM_ROWS; r++) sum[r] += (double)(a[r][i] * a[r][i]);
    for (int r = 0; r < 2 * NORM_ROWS; r++) {
        const __m512 scale = _mm512_set1_ps(rms_scale(sum[r], n0, eps));
        for (int64_t k = 0; k < n0; k += 16) {
            const __mmask16 m = n0 - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n0 - k)) - 1);
            _mm512_mask_storeu_ps(d[r] + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a[r] + k), scale));
        }
    }
}
__attribute__((target("avx2"))) static void rms_rows_avx2(int64_t n0, const float *const *a, float *const *d,
                                                          float eps) {
    __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 4 <= n0; i += 4)
        for (int g = 0; g < 4; g++) {
            __m256d v[4];
            for (int r = 0; r < 4; r++) {
                const __m128 x = _mm_loadu_ps(a[4 * g + r] + i);
                v[r] = _mm256_cvtps_pd(_mm_mul_ps(x, x));
            }
            const __m256d t0 = _mm256_unpacklo_pd(v[0], v[1]), t1 = _mm256_unpackhi_pd(v[0], v[1]); /* e0 e2, e1 e3 */
            const __m256d t2 = _mm256_unpacklo_pd(v[2], v[3]), t3 = _mm256_unpackhi_pd(v[2], v[3]);
            acc[g] = _mm256_add_pd(acc[g], _mm256_permute2f128_pd(t0, t2, 0x20));
            acc[g] = _mm256_add_pd(acc[g], _mm256_permute2f128_pd(t1, t3, 0x20));
            acc[g] = _mm256_add_pd(acc[g], _mm256_permute2f128_pd(t0, t2, 0x31));
            acc[g] = _mm256_add_pd(acc[g], _mm256_permute2f128_pd(t1, t3, 0x31));
        }
    double sum[2 * NORM_ROWS];
    for (int g = 0; g < 4; g++) _mm256_storeu_pd(sum + 4 * g, acc[g]);
    for (; i < n0; i++)
        for (int r = 0; r < 2 * NORM_ROWS; r++) sum[r] += (double)(a[r][i] * a[r][i]);
    for (int r = 0; r < 2 * NORM_ROWS; r++) {
        const __m256 scale = _mm256_set1_ps(rms_scale(sum[r], n0, eps));
        int64_t k = 0;
        for (; k + 8 <= n0; k += 8) _mm256_storeu_ps(d[r] + k, _mm256_mul_ps(_mm256_loadu_ps(a[r] + k), scale));
        for (; k < n0; k++) d[r][k] = a[r][k] * _mm256_cvtss_f32(scale);
    }
}
#endif

static void compute_norm(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0];
    const int64_t n0 = a->ne[0];
    const float eps = bt_get_op_param_f32(dst, 0);
    const bool rms = dst->op == BT_OP_RMS_NORM;
    const size_t sa = a->nb[0], sd = dst->nb[0];
    const bool packed = sa == sizeof(float) && sd == sizeof(float);
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
#if defined(SILU_X86)
    const enum bt_cpu_attn_isa isa = vec_isa(p);
    for (; rms && packed && isa != BT_CPU_ATTN_C && r1 - r0 >= 2 * NORM_ROWS; r0 += 2 * NORM_ROWS) {
        const float *ra[2 * NORM_ROWS];
        float *rd[2 * NORM_ROWS];
        for (int r = 0; r < 2 * NORM_ROWS; r++) {
            int64_t i1, i2, i3;
            row_index(dst, r0 + r, &i1, &i2, &i3);
            ra[r] = (const float *)row_ptr(a, i1, i2, i3);
            rd[r] = (float *)row_ptr(dst, i1, i2, i3);
        }
        if (isa == BT_CPU_ATTN_AVX512)
            rms_rows_avx512(n0, ra, rd, eps);
        else
            rms_rows_avx2(n0, ra, rd, eps);
    }
#endif
    for (; rms && packed && r1 - r0 >= NORM_ROWS; r0 += NORM_ROWS) {
        const float *ra[NORM_ROWS];
        float *rd[NORM_ROWS];
        for (int r = 0; r < NORM_ROWS; r++) {
            int64_t i1, i2, i3;
            row_index(dst, r0 + r, &i1, &i2, &i3);
            ra[r] = (const float *)row_ptr(a, i1, i2, i3);
            rd[r] = (float *)row_ptr(dst, i1, i2, i3);
        }
        rms_rows(n0, ra, rd, eps);
    }
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const char *ra = row_ptr(a, i1, i2, i3);
        char *rd = row_ptr(dst, i1, i2, i3);
        if (packed)
            norm_row(rms, n0, ra, sizeof(float), rd, sizeof(float), eps);
        else
            norm_row(rms, n0, ra, sa, rd, sd, eps);
    }
}

/* ---- SOFT_MAX ----------------------------------------------------------- */

static void compute_soft_max(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *mask = dst->src[1];
    const int64_t n0 = a->ne[0];
    const float scale = bt_get_op_param_f32(dst, 0);
    float *w = scratch(p, dst);
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const char *ra = row_ptr(a, i1, i2, i3);
        const char *rm =
            mask ? row_ptr(mask, i1, i2 % mask->ne[2], i3 % mask->ne[3]) : NULL;
        /* w = a*scale + mask; subtract the row max for stability */
        float max = -INFINITY;
        for (int64_t i = 0; i < n0; i++) {
            float v = f32_at(ra, a->nb[0], i) * scale;
            if (rm) v += f32_at(rm, mask->nb[0], i);
            w[i] = v;
            if (v > max) max = v;
        }
        char *rd = row_ptr(dst, i1, i2, i3);
        if (max == -INFINITY) {
            /* every entry masked out: an all-zero row rather than NaN */
            for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, dst->nb[0], i) = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < n0; i++) {
            const float e = expf(w[i] - max);
            w[i] = e;
            sum += (double)e;
        }
        const float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < n0; i++) *f32_ptr(rd, dst->nb[0], i) = w[i] * inv;
    }
}

/* ---- ROPE --------------------------------------------------------------- */

static void compute_rope(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *pos = dst->src[1];
    const int64_t d = a->ne[0];
    const int n_dims = bt_get_op_param_i32(dst, 0);
    const int mode = bt_get_op_param_i32(dst, 1);
    const float freq_base = bt_get_op_param_f32(dst, 2);
    const float freq_scale = bt_get_op_param_f32(dst, 3);
    const float ext_factor = bt_get_op_param_f32(dst, 4), attn_factor = bt_get_op_param_f32(dst, 5);
    float corr[2] = {0.0f, 0.0f};
    if (ext_factor != 0.0f)
        bt_rope_yarn_corr_dims(n_dims, bt_get_op_param_i32(dst, 8), freq_base, bt_get_op_param_f32(dst, 6),
                               bt_get_op_param_f32(dst, 7), corr);
    const int half = n_dims / 2;
    /* cache[2i], cache[2i+1] = cos, sin of theta_i for the token cached_i2;
     * freq[i] the power of freq_base in theta_i, and with YaRN mix[i] its
     * ramp's mix, once a call (powf as costly as cosf and sinf, for every
     * head and token) */
    float *cache = scratch(p, dst), *freq = cache + d, *mix = freq + half;
    for (int i = 0; i < half; i++) {
        freq[i] = bt_rope_yarn_freq(i, n_dims, freq_base);
        if (ext_factor != 0.0f) mix[i] = bt_rope_yarn_mix(i, ext_factor, corr);
    }
    const float mscale = bt_rope_yarn_mscale(freq_scale, attn_factor);
    int64_t cached = -1;
    const size_t sa = a->nb[0], sd = dst->nb[0];

    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        if (i2 != cached) {
            const int32_t ps = *(const int32_t *)((const char *)pos->data + i2 * pos->nb[0]);
            for (int i = 0; i < half; i++) {
                if (ext_factor == 0.0f) {
                    const float theta = (float)ps * freq_scale * freq[i];
                    cache[2 * i] = cosf(theta) * attn_factor;
                    cache[2 * i + 1] = sinf(theta) * attn_factor;
                } else {
                    bt_rope_yarn_cs(ps, freq[i], freq_scale, mix[i], mscale, &cache[2 * i], &cache[2 * i + 1]);
                }
            }
            cached = i2;
        }
        const char *ra = row_ptr(a, i1, i2, i3);
        char *rd = row_ptr(dst, i1, i2, i3);
        for (int i = 0; i < half; i++) {
            const int64_t j0 = mode == BT_ROPE_NEOX ? i : 2 * i;
            const int64_t j1 = mode == BT_ROPE_NEOX ? i + half : 2 * i + 1;
            const float c = cache[2 * i], s = cache[2 * i + 1];
            const float x0 = f32_at(ra, sa, j0), x1 = f32_at(ra, sa, j1);
            *f32_ptr(rd, sd, j0) = x0 * c - x1 * s;
            *f32_ptr(rd, sd, j1) = x0 * s + x1 * c;
        }
        for (int64_t i = n_dims; i < d; i++) *f32_ptr(rd, sd, i) = f32_at(ra, sa, i);
    }
}

/* ---- ARGSORT (stable merge sort of indices) ----------------------------- */

static void compute_argsort(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0];
    const int64_t n = a->ne[0];
    const bool desc = bt_get_op_param_i32(dst, 0) == BT_SORT_DESC;
    float *val = scratch(p, dst);
    int32_t *idx = (int32_t *)(val + n);
    int32_t *tmp = idx + n;
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const char *ra = row_ptr(a, i1, i2, i3);
        for (int64_t i = 0; i < n; i++) {
            val[i] = f32_at(ra, a->nb[0], i);
            idx[i] = (int32_t)i;
        }
        /* bottom-up merge sort: take from the left run unless the right
         * element strictly precedes it, so ties keep the lower index first */
        int32_t *src = idx, *out = tmp;
        for (int64_t width = 1; width < n; width *= 2) {
            for (int64_t lo = 0; lo < n; lo += 2 * width) {
                int64_t mid = lo + width < n ? lo + width : n;
                int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
                int64_t i = lo, j = mid, k = lo;
                while (i < mid && j < hi) {
                    const float vi = val[src[i]], vj = val[src[j]];
                    const bool right_first = desc ? vj > vi : vj < vi;
                    out[k++] = right_first ? src[j++] : src[i++];
                }
                while (i < mid) out[k++] = src[i++];
                while (j < hi) out[k++] = src[j++];
            }
            int32_t *t = src;
            src = out;
            out = t;
        }
        char *rd = row_ptr(dst, i1, i2, i3);
        for (int64_t i = 0; i < n; i++) *(int32_t *)(rd + i * dst->nb[0]) = src[i];
    }
}

/* ---- CONCAT ------------------------------------------------------------- */

static void compute_concat(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *b = dst->src[1];
    const int dim = bt_get_op_param_i32(dst, 0);
    const size_t ts = bt_type_size(dst->type);
    const int64_t n0 = dst->ne[0];
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i[4];
        row_index(dst, ir, &i[1], &i[2], &i[3]);
        char *rd = row_ptr(dst, i[1], i[2], i[3]);
        if (dim != 0) {
            /* the whole row comes from one source */
            const struct bt_tensor *s = a;
            int64_t j[4] = {0, i[1], i[2], i[3]};
            if (i[dim] >= a->ne[dim]) {
                s = b;
                j[dim] -= a->ne[dim];
            }
            const char *rs = row_ptr(s, j[1], j[2], j[3]);
            if (row_packed(s) && row_packed(dst)) {
                memcpy(rd, rs, bt_row_size(dst->type, n0));
            } else {
                for (int64_t k = 0; k < n0; k++) memcpy(rd + k * dst->nb[0], rs + k * s->nb[0], ts);
            }
            continue;
        }
        const char *ra = row_ptr(a, i[1], i[2], i[3]);
        const char *rb = row_ptr(b, i[1], i[2], i[3]);
        const int64_t na = a->ne[0];
        /* a group's share of dimension 1 (bt_tensor row_lo/hi): outside it,
         * the first source's part is left as it was */
        const int64_t k0 = dst->row_hi > 0 && (i[1] < dst->row_lo || i[1] >= dst->row_hi) ? na : 0;
        if (row_packed(a) && row_packed(b) && row_packed(dst)) { /* the two pieces whole */
            if (k0 == 0) memcpy(rd, ra, bt_row_size(dst->type, na));
            memcpy(rd + bt_row_size(dst->type, na), rb, bt_row_size(dst->type, n0 - na));
            continue;
        }
        for (int64_t k = k0; k < n0; k++) {
            const char *e = k < na ? ra + k * a->nb[0] : rb + (k - na) * b->nb[0];
            memcpy(rd + k * dst->nb[0], e, ts);
        }
    }
}

/* ---- GET_ROWS / SET_ROWS ------------------------------------------------ */

static inline int32_t ids_at(const struct bt_tensor *ids, int64_t i0, int64_t i1, int64_t i2) {
    return *(const int32_t *)((const char *)ids->data + i0 * ids->nb[0] + i1 * ids->nb[1] +
                              i2 * ids->nb[2]);
}

/* Every thread scans all ids (cheap) so a bad id is reported once, by
 * thread 0, always the first one in order, and nothing is written. */
static bool check_ids(const struct bt_cpu_params *p, const struct bt_tensor *node,
                      const struct bt_tensor *ids, int64_t n_rows) {
    for (int64_t i2 = 0; i2 < ids->ne[2]; i2++)
        for (int64_t i1 = 0; i1 < ids->ne[1]; i1++)
            for (int64_t i0 = 0; i0 < ids->ne[0]; i0++) {
                const int32_t id = ids_at(ids, i0, i1, i2);
                if (id < 0 || id >= n_rows) {
                    if (p->ith == 0)
                        bt_cpu_fail(p, BT_ERR_INVALID,
                                    "node '%s' (%s): row id %d at [%lld,%lld,%lld] out of range "
                                    "[0, %lld)",
                                    node->name, bt_op_name(node->op), (int)id, (long long)i0,
                                    (long long)i1, (long long)i2, (long long)n_rows);
                    return false;
                }
            }
    return true;
}

static void compute_get_rows(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *a = dst->src[0], *ids = dst->src[1];
    if (!check_ids(p, dst, ids, a->ne[1])) return;
    const int64_t n0 = a->ne[0];
    float *w = scratch(p, dst);
    /* a repacked table (cpu.h; a tied output's token_embd): the row
     * unpacked from its group of 16 first */
    const bool rp = bt_cpu_weight_is_repacked(a);
    BT_ASSERT(!rp || !a->view_src);
    int64_t r0, r1;
    thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(dst, ir, &i1, &i2, &i3);
        const int64_t id = ids_at(ids, i1, i2, i3);
        const char *rs = row_ptr(a, id, i2, i3);
        if (rp) {
            bt_cpu_rp_row(a->type, n0, row_ptr(a, 0, i2, i3), a->nb[1], id, w + n0);
            rs = (const char *)(w + n0);
        }
        char *rd = row_ptr(dst, i1, i2, i3);
        if (a->type == dst->type && row_packed(a) && row_packed(dst)) {
            memcpy(rd, rs, bt_row_size(a->type, n0));
        } else if (a->type == BT_TYPE_I32 && dst->type == BT_TYPE_I32) {
            for (int64_t k = 0; k < n0; k++)
                *(int32_t *)(rd + k * dst->nb[0]) = *(const int32_t *)(rs + k * a->nb[0]);
        } else if (dst->nb[0] == sizeof(float)) {
            load_row_f32(a, rs, (float *)rd, n0);
        } else {
            load_row_f32(a, rs, w, n0);
            store_row_f32(dst, rd, w, n0);
        }
    }
}

/* A packed F32 row into a packed F16 row: F16C's conversion (round to
 * nearest even, as bt_fp32_to_fp16) eight at a time where the CPU's vector
 * set has it; eight that hold a NaN, and the tail, element by element
 * (bt_fp32_to_fp16 quietens a NaN and drops its payload, F16C keeps it) */
#if defined(SILU_X86)
__attribute__((target("avx2,f16c"))) static void f16_row_store_avx2(const float *x, bt_fp16_t *h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) == 0) {
            _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
            continue;
        }
        for (int64_t j = i; j < i + 8; j++) h[j] = bt_fp32_to_fp16(x[j]);
    }
    for (; i < n; i++) h[i] = bt_fp32_to_fp16(x[i]);
}
#endif

static void compute_set_rows(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *b = dst->src[1], *ids = dst->src[2];
    if (!check_ids(p, dst, ids, dst->ne[1])) return;
    const int64_t n0 = b->ne[0];
    float *w = scratch(p, dst);
#if defined(SILU_X86) /* (an F16 cache: a prompt's K and V rows) */
    const bool f16c = dst->type == BT_TYPE_F16 && row_packed(dst) && vec_isa(p) != BT_CPU_ATTN_C;
#endif
    /* Split by destination row (id % nth), not by source row: two source
     * rows with the same id go to one thread, in order, so the last one
     * wins whatever the thread count. */
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < b->ne[1]; i1++) {
                const int64_t id = ids_at(ids, i1, i2, i3);
                if (id % p->nth != p->ith) continue;
                const char *rb = row_ptr(b, i1, i2, i3);
                char *rd = row_ptr(dst, id, i2, i3);
#if defined(SILU_X86)
                if (f16c && b->nb[0] == sizeof(float)) {
                    f16_row_store_avx2((const float *)rb, (bt_fp16_t *)rd, n0);
                    continue;
                }
#endif
                if (b->nb[0] == sizeof(float)) {
                    store_row_f32(dst, rd, (const float *)rb, n0);
                } else {
                    load_row_f32(b, rb, w, n0);
                    store_row_f32(dst, rd, w, n0);
                }
            }
}

/* ---- CPY / CONT --------------------------------------------------------- */

/* flat logical index e (i0 fastest) of t -> (i0..i3), and the next one */
static void logical_index(const struct bt_tensor *t, int64_t e, int64_t i[4]) {
    for (int k = 0; k < 4; k++) {
        i[k] = e % t->ne[k];
        e /= t->ne[k];
    }
}
static inline void logical_next(const struct bt_tensor *t, int64_t i[4]) {
    for (int k = 0; k < 4 && ++i[k] == t->ne[k]; k++) i[k] = 0;
}

/* n elements of row `rs` (tensor s) into row `rd` (tensor d), converting. */
static void convert_row(const struct bt_tensor *s, const char *rs, const struct bt_tensor *d,
                        char *rd, int64_t n, float *w) {
    if (s->type == d->type) {
        if (row_packed(s) && row_packed(d)) {
            memcpy(rd, rs, bt_row_size(s->type, n));
        } else {
            const size_t ts = bt_type_size(s->type);
            for (int64_t k = 0; k < n; k++) memcpy(rd + k * d->nb[0], rs + k * s->nb[0], ts);
        }
        return;
    }
    if (d->type == BT_TYPE_F32 && d->nb[0] == sizeof(float)) {
        load_row_f32(s, rs, (float *)rd, n);
        return;
    }
    if (s->type == BT_TYPE_F32 && s->nb[0] == sizeof(float)) {
        store_row_f32(d, rd, (const float *)rs, n);
        return;
    }
    load_row_f32(s, rs, w, n);
    store_row_f32(d, rd, w, n);
}

static void compute_cpy(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *s = dst->src[0];
    float *w = scratch(p, dst);

    if (s->ne[0] == dst->ne[0]) {
        /* rows map one to one in logical order */
        const int64_t n0 = dst->ne[0];
        int64_t r0, r1;
        thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
        for (int64_t ir = r0; ir < r1; ir++) {
            int64_t i1, i2, i3, j1, j2, j3;
            row_index(dst, ir, &i1, &i2, &i3);
            row_index(s, ir, &j1, &j2, &j3);
            convert_row(s, row_ptr(s, j1, j2, j3), dst, row_ptr(dst, i1, i2, i3), n0, w);
        }
        return;
    }

    const int64_t n = bt_nelements(dst);
    if (bt_is_contiguous(s) && bt_is_contiguous(dst)) {
        /* flat: chunks of CPY_CHUNK elements (whole blocks) */
        const int64_t n_chunks = (n + CPY_CHUNK - 1) / CPY_CHUNK;
        int64_t c0, c1;
        thread_range(n_chunks, p->ith, p->nth, &c0, &c1);
        const int64_t bs = bt_blck_size(s->type), bd = bt_blck_size(dst->type);
        for (int64_t c = c0; c < c1; c++) {
            const int64_t e0 = c * CPY_CHUNK;
            const int64_t m = n - e0 < CPY_CHUNK ? n - e0 : CPY_CHUNK;
            const char *ps = (const char *)s->data + (size_t)(e0 / bs) * bt_type_size(s->type);
            char *pd = (char *)dst->data + (size_t)(e0 / bd) * bt_type_size(dst->type);
            if (s->type == dst->type) {
                memcpy(pd, ps, bt_row_size(s->type, m));
            } else {
                bt_row_to_f32(s->type, ps, w, m);
                bt_row_from_f32(dst->type, w, pd, m);
            }
        }
        return;
    }

    if (!is_quant(s->type)) {
        /* gather: each dst row takes the next dst->ne[0] source elements in
         * logical order (works for any dst type, block types included) */
        const int64_t n0 = dst->ne[0];
        const bool same = s->type == dst->type;
        const size_t ts = bt_type_size(s->type);
        int64_t r0, r1;
        thread_range(bt_nrows(dst), p->ith, p->nth, &r0, &r1);
        if (r0 >= r1) return;
        int64_t si[4];
        logical_index(s, r0 * n0, si);
        for (int64_t ir = r0; ir < r1; ir++) {
            int64_t i1, i2, i3;
            row_index(dst, ir, &i1, &i2, &i3);
            char *rd = row_ptr(dst, i1, i2, i3);
            for (int64_t k = 0; k < n0; k++) {
                const char *ps = (const char *)s->data + si[0] * s->nb[0] + si[1] * s->nb[1] +
                                 si[2] * s->nb[2] + si[3] * s->nb[3];
                if (same) /* bytes, so I32 and the like copy exactly */
                    memcpy(rd + k * dst->nb[0], ps, ts);
                else
                    bt_row_to_f32(s->type, ps, &w[k], 1);
                logical_next(s, si);
            }
            if (!same) store_row_f32(dst, rd, w, n0);
        }
        return;
    }

    /* scatter: a block-type source, row by row, into the next s->ne[0]
     * destination elements in logical order (dst of a plain type) */
    BT_ASSERT(!is_quant(dst->type));
    const int64_t n0 = s->ne[0];
    int64_t r0, r1;
    thread_range(bt_nrows(s), p->ith, p->nth, &r0, &r1);
    if (r0 >= r1) return;
    int64_t di[4];
    logical_index(dst, r0 * n0, di);
    for (int64_t ir = r0; ir < r1; ir++) {
        int64_t i1, i2, i3;
        row_index(s, ir, &i1, &i2, &i3);
        load_row_f32(s, row_ptr(s, i1, i2, i3), w, n0);
        for (int64_t k = 0; k < n0; k++) {
            char *pd = (char *)dst->data + di[0] * dst->nb[0] + di[1] * dst->nb[1] +
                       di[2] * dst->nb[2] + di[3] * dst->nb[3];
            bt_row_from_f32(dst->type, &w[k], pd, 1);
            logical_next(dst, di);
        }
    }
}

/* ---- dispatch ----------------------------------------------------------- */

void bt_cpu_compute_op(const struct bt_cpu_params *p, struct bt_tensor *node) {
    switch (bt_op_elementwise(node->op)) {
        case BT_ELEMENTWISE_BINARY: compute_binary(p, node); return;
        case BT_ELEMENTWISE_UNARY: compute_unary(p, node); return;
        case BT_ELEMENTWISE_GLU: compute_swiglu(p, node); return;
        case BT_ELEMENTWISE_NONE: break;
    }
    if (node->op == BT_OP_NONE || bt_op_is_view(node->op)) return; /* no data of their own to compute */
    switch (node->op) {
        case BT_OP_SUM_ROWS:
        case BT_OP_MEAN:
            compute_sum_rows(p, node);
            return;
        case BT_OP_RMS_NORM:
        case BT_OP_NORM:
            compute_norm(p, node);
            return;
        case BT_OP_SOFT_MAX: compute_soft_max(p, node); return;
        case BT_OP_MOE_SUM: compute_moe_sum(p, node); return;
        case BT_OP_ROPE: compute_rope(p, node); return;
        case BT_OP_ARGSORT: compute_argsort(p, node); return;
        case BT_OP_CONCAT: compute_concat(p, node); return;
        case BT_OP_GET_ROWS: compute_get_rows(p, node); return;
        case BT_OP_SET_ROWS: compute_set_rows(p, node); return;
        case BT_OP_CPY:
        case BT_OP_CONT:
            compute_cpy(p, node);
            return;
        default:
            bt_cpu_fail(p, BT_ERR_UNSUPPORTED, "node '%s': op %s has no CPU kernel", node->name,
                        bt_op_name(node->op));
            return;
    }
}

/* ---- support ------------------------------------------------------------ */

/* One of the three CPY paths can take s -> d (bt_op_is_well_formed has
 * checked element counts and block layouts). */
static bool cpy_path_exists(const struct bt_tensor *s, const struct bt_tensor *d) {
    if (s->ne[0] == d->ne[0]) return true; /* row path */
    if (bt_is_contiguous(s) && bt_is_contiguous(d)) {
        /* flat path: chunks must start on block boundaries */
        return CPY_CHUNK % bt_blck_size(s->type) == 0 && CPY_CHUNK % bt_blck_size(d->type) == 0;
    }
    /* gather path (plain source, any destination) or scatter path (block
     * source, plain destination) */
    return !is_quant(s->type) || !is_quant(d->type);
}

bool bt_cpu_op_supported(const struct bt_tensor *node) {
    if (!bt_op_is_well_formed(node)) return false;
    switch (node->op) {
        case BT_OP_CPY:
        case BT_OP_CONT:
            return cpy_path_exists(node->src[0], node);
        case BT_OP_MUL_MAT:
        case BT_OP_MUL_MAT_ID:
            return false; /* matmul.c's bt_cpu_mul_mat_supported decides */
        default:
            return true;
    }
}
