/* cuda_common.cuh - device-side helpers shared by ops.cu, attn.cu and
 * matmul.cu: a tensor passed to a kernel by value (data, ne, nb, type),
 * element loads and stores of every type converted through F32 exactly as
 * tensor.c converts on the CPU (element reads of every block type as
 * quants.c dequantises), Q8_0 / Q4_0 block quantisation, launch sizes and
 * reductions. */
#ifndef BATON_CUDA_COMMON_CUH
#define BATON_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_impl.h"
#include "quants.h"

/* A tensor as a kernel sees it. */
struct t4 {
    char *data;
    int64_t ne[4];
    int64_t nb[4];
    int type;
};

static inline t4 t4_of(const struct bt_tensor *t) {
    t4 r;
    r.data = (char *)t->data;
    for (int i = 0; i < 4; i++) {
        r.ne[i] = t->ne[i];
        r.nb[i] = (int64_t)t->nb[i];
    }
    r.type = (int)t->type;
    return r;
}

#define CUDA_THREADS 256

/* Blocks for a grid-stride loop over n items. */
static inline unsigned grid_for(int64_t n) {
    int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    if (b < 1) b = 1;
    if (b > (1 << 20)) b = 1 << 20;
    return (unsigned)b;
}

#define GRID_STRIDE(e, n) \
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < (n); e += (int64_t)gridDim.x * blockDim.x)

/* ---- the table types (MXFP4, IQ4_NL, IQ4_XS, the lattice types) ----------
 * Their element reads are table_get.h's, shared with a CPU test
 * (tests/test_cuda_tables.c).  The tables live on the device: each .cu that
 * includes this header has its own copies (no relocatable device code),
 * filled from quants.c's by the function BT_CUDA_TABLES_UPLOAD defines in it,
 * which the backend calls for its device when it starts. */
static __device__ int8_t d_tab_mxfp4_values[16], d_tab_iq4nl_values[16];
static __device__ uint8_t d_tab_iq2_signs[128];
static __device__ uint64_t d_tab_iq2xxs_grid[256], d_tab_iq2xs_grid[512], d_tab_iq2s_grid[1024], d_tab_iq1s_grid[2048];
static __device__ uint32_t d_tab_iq3xxs_grid[256], d_tab_iq3s_grid[512];

#define BT_CUDA_TABLE_COPY(name)                                                          \
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(d_tab_##name, bt_##name, sizeof d_tab_##name)
#define BT_CUDA_TABLES_UPLOAD(fn)                                                        \
    extern "C" cudaError_t fn(void) {                                                     \
        cudaError_t e = cudaSuccess;                                                      \
        BT_CUDA_TABLE_COPY(mxfp4_values);                                                 \
        BT_CUDA_TABLE_COPY(iq4nl_values);                                                 \
        BT_CUDA_TABLE_COPY(iq2_signs);                                                    \
        BT_CUDA_TABLE_COPY(iq2xxs_grid);                                                  \
        BT_CUDA_TABLE_COPY(iq2xs_grid);                                                   \
        BT_CUDA_TABLE_COPY(iq2s_grid);                                                    \
        BT_CUDA_TABLE_COPY(iq3xxs_grid);                                                  \
        BT_CUDA_TABLE_COPY(iq3s_grid);                                                    \
        BT_CUDA_TABLE_COPY(iq1s_grid);                                                    \
        return e;                                                                         \
    }

#define BT_TG_FN __device__ __forceinline__
#define BT_TG_MUL(a, b) __fmul_rn(a, b)
#define BT_TG_ADD(a, b) __fadd_rn(a, b)
#define BT_TG_H2F(h) __half2float(__ushort_as_half(h))
#define BT_TG_U2F(u) __uint_as_float(u)
#define BT_TG_TAB(name) d_tab_##name
#include "table_get.h"

/* the block types the kernels also write (quantize_block) */
__device__ __forceinline__ bool d_is_quant(int type) { return type == BT_TYPE_Q8_0 || type == BT_TYPE_Q4_0; }
/* elements per block: 32, 256 for the K-quants, 1 for the plain types */
__device__ __forceinline__ int64_t d_blck(int type) {
    switch (type) {
        case BT_TYPE_Q8_0:
        case BT_TYPE_Q4_0:
        case BT_TYPE_Q4_1:
        case BT_TYPE_Q5_0:
        case BT_TYPE_Q5_1: return BT_QK;
        case BT_TYPE_Q2_K:
        case BT_TYPE_Q3_K:
        case BT_TYPE_Q4_K:
        case BT_TYPE_Q5_K:
        case BT_TYPE_Q6_K: return BT_QK_K;
        default: return bt_tg_blck(type) ? bt_tg_blck(type) : 1;
    }
}
/* bytes per block of a block type */
__device__ __forceinline__ int64_t d_block_bytes(int type) {
    switch (type) {
        case BT_TYPE_Q8_0: return sizeof(bt_block_q8_0);
        case BT_TYPE_Q4_0: return sizeof(bt_block_q4_0);
        case BT_TYPE_Q4_1: return sizeof(bt_block_q4_1);
        case BT_TYPE_Q5_0: return sizeof(bt_block_q5_0);
        case BT_TYPE_Q5_1: return sizeof(bt_block_q5_1);
        case BT_TYPE_Q2_K: return sizeof(bt_block_q2_K);
        case BT_TYPE_Q3_K: return sizeof(bt_block_q3_K);
        case BT_TYPE_Q4_K: return sizeof(bt_block_q4_K);
        case BT_TYPE_Q5_K: return sizeof(bt_block_q5_K);
        case BT_TYPE_Q6_K: return sizeof(bt_block_q6_K);
        default: return bt_tg_block_bytes(type) ? bt_tg_block_bytes(type) : 1;
    }
}

/* linear logical index e (i0 fastest) -> (i0, i1, i2, i3) over ne */
__device__ __forceinline__ void unravel(int64_t e, const int64_t ne[4], int64_t i[4]) {
    i[0] = e % ne[0];
    e /= ne[0];
    i[1] = e % ne[1];
    e /= ne[1];
    i[2] = e % ne[2];
    i[3] = e / ne[2];
}

/* byte address of element (i0..i3); for block types the block holding i0 */
__device__ __forceinline__ char *elem_addr(const t4 &t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return t.data + (i0 / d_blck(t.type)) * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
}

__device__ __forceinline__ float d_fp16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t d_f32_to_fp16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float d_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* round to nearest even, NaN quietened: bit for bit bt_fp32_to_bf16 */
__device__ __forceinline__ uint16_t d_f32_to_bf16(float f) {
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* element j (0..31) of a Q8_0 / Q4_0 block */
__device__ __forceinline__ float d_q8_0_get(const char *blk, int j) {
    const bt_block_q8_0 *b = (const bt_block_q8_0 *)blk;
    return (float)b->qs[j] * d_fp16_to_f32(b->d);
}
__device__ __forceinline__ float d_q4_0_get(const char *blk, int j) {
    const bt_block_q4_0 *b = (const bt_block_q4_0 *)blk;
    const uint8_t q = j < BT_QK / 2 ? (b->qs[j] & 0x0f) : (b->qs[j - BT_QK / 2] >> 4);
    return (float)((int)q - 8) * d_fp16_to_f32(b->d);
}

/* Element j of a block of the types only read (Q4_1, Q5_0, Q5_1, Q2_K ..
 * Q6_K, and the table types through table_get.h): the arithmetic of src/quants.c's bt_*_to_f32, each product and sum
 * rounded on its own (quants.c is built with -ffp-contract=off; nvcc would
 * fuse a * b + c), so the values are bit for bit the CPU's. */
__device__ __forceinline__ float d_block_get(int type, const char *blk, int j) {
    switch (type) {
        case BT_TYPE_Q8_0: return d_q8_0_get(blk, j);
        case BT_TYPE_Q4_0: return d_q4_0_get(blk, j);
        case BT_TYPE_Q4_1: {
            const bt_block_q4_1 *b = (const bt_block_q4_1 *)blk;
            const int q = j < BT_QK / 2 ? (b->qs[j] & 0x0f) : (b->qs[j - BT_QK / 2] >> 4);
            return __fadd_rn(__fmul_rn((float)q, d_fp16_to_f32(b->d)), d_fp16_to_f32(b->m));
        }
        case BT_TYPE_Q5_0:
        case BT_TYPE_Q5_1: {
            const bool one = type == BT_TYPE_Q5_1;
            const uint8_t *qh8 = one ? ((const bt_block_q5_1 *)blk)->qh : ((const bt_block_q5_0 *)blk)->qh;
            const uint8_t *qs = one ? ((const bt_block_q5_1 *)blk)->qs : ((const bt_block_q5_0 *)blk)->qs;
            const uint32_t qh = (uint32_t)qh8[0] | (uint32_t)qh8[1] << 8 | (uint32_t)qh8[2] << 16 | (uint32_t)qh8[3] << 24;
            const int lo = j < BT_QK / 2 ? (qs[j] & 0x0f) : (qs[j - BT_QK / 2] >> 4);
            const int q = lo | (int)(((qh >> j) & 1) << 4);
            if (!one) return __fmul_rn((float)(q - 16), d_fp16_to_f32(((const bt_block_q5_0 *)blk)->d));
            const bt_block_q5_1 *b = (const bt_block_q5_1 *)blk;
            return __fadd_rn(__fmul_rn((float)q, d_fp16_to_f32(b->d)), d_fp16_to_f32(b->m));
        }
        case BT_TYPE_Q2_K: {
            const bt_block_q2_K *b = (const bt_block_q2_K *)blk;
            const int half = j / 128, s = (j % 128) / 32, l = j % 32;
            const int q = (b->qs[32 * half + l] >> (2 * s)) & 3;
            const uint8_t sc = b->scales[j / 16];
            const float dl = __fmul_rn(d_fp16_to_f32(b->d), (float)(sc & 0xF));
            const float ml = __fmul_rn(d_fp16_to_f32(b->dmin), (float)(sc >> 4));
            return __fsub_rn(__fmul_rn(dl, (float)q), ml);
        }
        case BT_TYPE_Q3_K: {
            const bt_block_q3_K *b = (const bt_block_q3_K *)blk;
            const int half = j / 128, s = (j % 128) / 32, l = j % 32, is = j / 16;
            const int lo = (b->qs[32 * half + l] >> (2 * s)) & 3;
            const int hi = (b->hmask[l] >> (j / 32)) & 1;
            /* bt_q3_K_scales for scale is */
            const int slo = is < 8 ? b->scales[is] & 0xF : b->scales[is - 8] >> 4;
            const int shi = (b->scales[8 + is % 4] >> (2 * (is / 4))) & 3;
            const int sc = (int)(int8_t)((slo | (shi << 4)) - 32);
            const float dl = __fmul_rn(d_fp16_to_f32(b->d), (float)sc);
            return __fmul_rn(dl, (float)(lo - (hi ? 0 : 4)));
        }
        case BT_TYPE_Q4_K:
        case BT_TYPE_Q5_K: {
            const bool five = type == BT_TYPE_Q5_K;
            const uint16_t dh = five ? ((const bt_block_q5_K *)blk)->d : ((const bt_block_q4_K *)blk)->d;
            const uint16_t mh = five ? ((const bt_block_q5_K *)blk)->dmin : ((const bt_block_q4_K *)blk)->dmin;
            const uint8_t *sc8 = five ? ((const bt_block_q5_K *)blk)->scales : ((const bt_block_q4_K *)blk)->scales;
            const uint8_t *qs = five ? ((const bt_block_q5_K *)blk)->qs : ((const bt_block_q4_K *)blk)->qs;
            const int sub = j / 32, l = j % 32;
            /* bt_q4_K_scales_mins (quants.h), sub-block sub alone */
            uint8_t sc, m;
            if (sub < 4) {
                sc = sc8[sub] & 63;
                m = sc8[sub + 4] & 63;
            } else {
                sc = (uint8_t)((sc8[sub + 4] & 0xF) | ((sc8[sub - 4] >> 6) << 4));
                m = (uint8_t)((sc8[sub + 4] >> 4) | ((sc8[sub] >> 6) << 4));
            }
            const float d1 = __fmul_rn(d_fp16_to_f32(dh), (float)sc), m1 = __fmul_rn(d_fp16_to_f32(mh), (float)m);
            int v = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 0xF;
            if (five) v |= ((((const bt_block_q5_K *)blk)->qh[l] >> sub) & 1) << 4;
            return __fsub_rn(__fmul_rn(d1, (float)v), m1);
        }
        case BT_TYPE_Q6_K: {
            const bt_block_q6_K *b = (const bt_block_q6_K *)blk;
            const int h = j / 128, s = (j % 128) / 32, l = j % 32;
            const int lo = (b->ql[64 * h + l + 32 * (s & 1)] >> (4 * (s >> 1))) & 0xF;
            const int hi = (b->qh[32 * h + l] >> (2 * s)) & 3;
            const float dl = __fmul_rn(d_fp16_to_f32(b->d), (float)b->scales[j / 16]);
            return __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
        }
        default: return bt_tg_get(type, blk, j); /* the table types */
    }
}

/* element kk of a packed row of any block type */
__device__ __forceinline__ float d_row_block_get(int type, const char *row, int64_t kk) {
    const int64_t bl = d_blck(type);
    return d_block_get(type, row + (kk / bl) * d_block_bytes(type), (int)(kk % bl));
}

/* value at p (an element, or the block holding element i0) as F32 */
__device__ __forceinline__ float load_f32(int type, const char *p, int64_t i0) {
    switch (type) {
        case BT_TYPE_F32: return *(const float *)p;
        case BT_TYPE_F16: return d_fp16_to_f32(*(const uint16_t *)p);
        case BT_TYPE_BF16: return d_bf16_to_f32(*(const uint16_t *)p);
        case BT_TYPE_I32: return (float)*(const int32_t *)p;
        default: return d_block_get(type, p, (int)(i0 % d_blck(type)));
    }
}

/* store v at p converted to a plain (non-block) type */
__device__ __forceinline__ void store_f32(int type, char *p, float v) {
    switch (type) {
        case BT_TYPE_F32: *(float *)p = v; break;
        case BT_TYPE_F16: *(uint16_t *)p = d_f32_to_fp16(v); break;
        case BT_TYPE_BF16: *(uint16_t *)p = d_f32_to_bf16(v); break;
        case BT_TYPE_I32: *(int32_t *)p = (int32_t)v; break;
        default: break;
    }
}

/* Quantise 32 values into the block at p, as tensor.c's q8_0_from_f32 /
 * q4_0_from_f32 (the same float operations in the same order). */
__device__ __forceinline__ void quantize_block(int type, const float *x, char *p) {
    if (type == BT_TYPE_Q8_0) {
        bt_block_q8_0 *y = (bt_block_q8_0 *)p;
        float amax = 0.0f;
        for (int j = 0; j < BT_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = d_f32_to_fp16(d);
        for (int j = 0; j < BT_QK; j++) y->qs[j] = (int8_t)roundf(__fmul_rn(x[j], id));
    } else if (type == BT_TYPE_Q4_0) {
        bt_block_q4_0 *y = (bt_block_q4_0 *)p;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < BT_QK; j++) {
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y->d = d_f32_to_fp16(d);
        for (int j = 0; j < BT_QK / 2; j++) {
            const float x0 = __fadd_rn(__fmul_rn(x[j], id), 8.5f);
            const float x1 = __fadd_rn(__fmul_rn(x[j + BT_QK / 2], id), 8.5f);
            const uint8_t q0 = (uint8_t)(x0 < 0 ? 0 : x0 > 15 ? 15 : (int)x0);
            const uint8_t q1 = (uint8_t)(x1 < 0 ? 0 : x1 > 15 ? 15 : (int)x1);
            y->qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

/* Record a bad id found by a kernel: the first failing node wins. */
__device__ __forceinline__ void report_bad_id(int *err, int node_tag, int id) {
    if (atomicCAS(&err[0], 0, node_tag) == 0) err[1] = id;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the total.  sh: 32 doubles of shared memory. */
__device__ __forceinline__ double block_sum(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    const int nw = (int)(blockDim.x >> 5);
    double t = 0.0;
    for (int w = 0; w < nw; w++) t += sh[w]; /* fixed order: deterministic */
    return t;
}

__device__ __forceinline__ float block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    const int nw = (int)(blockDim.x >> 5);
    float t = -INFINITY;
    for (int w = 0; w < nw; w++) t = fmaxf(t, sh[w]);
    return t;
}

#endif
