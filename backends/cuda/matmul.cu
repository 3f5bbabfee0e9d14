/* matmul.cu - MUL_MAT and MUL_MAT_ID on the GPU.
 *
 * One 2-D product D[m, n] = A[k, m]^T x B[k, n] (A a weight matrix of any
 * type with contiguous rows, B and D F32 columns) is the unit:
 *   n <= MMV_MAX_COLS (decode): a direct kernel, one warp per row of A,
 *     reading the weight row once for all n columns (any weight type,
 *     dequantised on the fly, F32 accumulation); each lane takes 8
 *     consecutive weights a step, with 16-byte loads of the weights (F32,
 *     F16, BF16) and of the columns when the rows are 16-byte aligned (else
 *     one weight a lane a step); Q8_0, Q4_0 and Q4_K instead with int8 dot
 *     products against the columns quantised to Q8_0's blocks (as the CPU
 *     does); also, MMV_MAX_COLS columns at a time, any
 *     product whose row strides cuBLAS cannot take;
 *   otherwise cuBLAS (cublasGemmEx, F32 accumulation): F32 weights as they
 *     are; F16 / BF16 weights with B converted to the weight type in scratch;
 *     block-type weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K)
 *     dequantised to F16 in scratch (each value as quants.c gives it, then
 *     rounded to F16; 8 weights a thread where weights8 can read them), B
 *     converted to F16.
 * MUL_MAT runs the unit for each (i2, i3) of b, with a's matrix
 * (i2 / (b2/a2), i3 / (b3/a3)) (broadcast over dims 2 and 3).
 * MUL_MAT_ID copies ids to the host (after a stream synchronise), checks
 * them, groups the (slot, token) pairs by expert, gathers each expert's
 * columns of b into one contiguous block, runs the unit once per used
 * expert and scatters the results back. */
#include <stdio.h>

#include "cuda_common.cuh"

BT_CUDA_TABLES_UPLOAD(bt_cuda_tables_upload_matmul)

#define MMV_MAX_COLS 8
#define MMV_WARPS 4

/* element kk of a weight row */
__device__ __forceinline__ float weight_at(int type, const char *row, int64_t kk) {
    switch (type) {
        case BT_TYPE_F32: return ((const float *)row)[kk];
        case BT_TYPE_F16: return d_fp16_to_f32(((const uint16_t *)row)[kk]);
        case BT_TYPE_BF16: return d_bf16_to_f32(((const uint16_t *)row)[kk]);
        default: return d_row_block_get(type, row, kk); /* the block types */
    }
}

/* the end of a direct kernel: each column's sum over the warp's lanes,
 * written by lane 0 */
__device__ __forceinline__ void mmv_store(float acc[MMV_MAX_COLS], int ncols, int lane, float *D, int64_t ldd,
                                          int64_t row) {
#pragma unroll
    for (int c = 0; c < MMV_MAX_COLS; c++) {
        if (c >= ncols) break;
        float v = acc[c];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) D[c * ldd + row] = v;
    }
}

/* the 4-bit sub-block scale and min of a Q4_K block (bt_q4_K_scales_mins, quants.h) */
__device__ __forceinline__ void q4_K_scale_min(const uint8_t *sc8, int sub, uint8_t *sc, uint8_t *mn) {
    if (sub < 4) {
        *sc = sc8[sub] & 63;
        *mn = sc8[sub + 4] & 63;
    } else {
        *sc = (uint8_t)((sc8[sub + 4] & 0xF) | ((sc8[sub - 4] >> 6) << 4));
        *mn = (uint8_t)((sc8[sub + 4] >> 4) | ((sc8[sub] >> 6) << 4));
    }
}

/* weights kk .. kk + 7 of a row (kk a multiple of 8; 16-byte aligned for
 * F32 / F16 / BF16; inside one block for the block types, whose block
 * sizes are multiples of 8), each the value d_block_get gives: Q4_0, Q4_K
 * and Q6_K read their scales once for the 8.  Measured on an H200 (m 4096,
 * k 14336, us): Q4_0 48.7 -> 41.8, Q4_K 106.9 -> 48.9, Q6_K 71.6 -> 62.9;
 * Q8_0 read as 2-byte words was slower (41.3 -> 57.3), so it stays with
 * d_block_get */
template <int TYPE>
__device__ __forceinline__ void weights8(const char *row, int64_t kk, float w[8]) {
    if (TYPE == BT_TYPE_F32) {
        const float4 a = ((const float4 *)(row + kk * 4))[0], b = ((const float4 *)(row + kk * 4))[1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else if (TYPE == BT_TYPE_F16 || TYPE == BT_TYPE_BF16) {
        const uint4 v = *(const uint4 *)(row + kk * 2);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint16_t lo = (uint16_t)(u[i] & 0xffffu), hi = (uint16_t)(u[i] >> 16);
            w[2 * i] = TYPE == BT_TYPE_F16 ? d_fp16_to_f32(lo) : d_bf16_to_f32(lo);
            w[2 * i + 1] = TYPE == BT_TYPE_F16 ? d_fp16_to_f32(hi) : d_bf16_to_f32(hi);
        }
    } else if (TYPE == BT_TYPE_Q4_0) {
        /* one scale; the 8 bytes whose low or high halves are the 8 quants
         * as 2-byte words (blocks of 18 bytes are 2-byte aligned) */
        const char *blk = row + (kk / BT_QK) * (int64_t)sizeof(bt_block_q4_0);
        const int j0 = (int)(kk % BT_QK), sh = j0 < BT_QK / 2 ? 0 : 4;
        const float d = d_fp16_to_f32(*(const uint16_t *)blk);
        const uint16_t *q = (const uint16_t *)(blk + 2 + j0 % (BT_QK / 2));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint16_t u = q[i];
            w[2 * i] = (float)((int)((u >> sh) & 15) - 8) * d;
            w[2 * i + 1] = (float)((int)((u >> (8 + sh)) & 15) - 8) * d;
        }
    } else if (TYPE == BT_TYPE_Q4_K) {
        /* d_block_get's arithmetic, the sub-block's scale and min once for
         * the 8 (they share one sub-block of 32) */
        const bt_block_q4_K *b = (const bt_block_q4_K *)(row + (kk / BT_QK_K) * (int64_t)sizeof(bt_block_q4_K));
        const int j0 = (int)(kk % BT_QK_K), sub = j0 / 32, l = j0 % 32;
        uint8_t sc, mn;
        q4_K_scale_min(b->scales, sub, &sc, &mn);
        const float d1 = __fmul_rn(d_fp16_to_f32(b->d), (float)sc), m1 = __fmul_rn(d_fp16_to_f32(b->dmin), (float)mn);
        const uint2 v = *(const uint2 *)(b->qs + 32 * (sub / 2) + l); /* 8-byte aligned: blocks of 144 */
        const int sh = 4 * (sub % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t word = i < 4 ? v.x : v.y;
            const int q = (int)((word >> (8 * (i % 4) + sh)) & 0xF);
            w[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
    } else if (TYPE == BT_TYPE_Q6_K) {
        const bt_block_q6_K *b = (const bt_block_q6_K *)(row + (kk / BT_QK_K) * (int64_t)sizeof(bt_block_q6_K));
        const int j0 = (int)(kk % BT_QK_K), h = j0 / 128, sq = (j0 % 128) / 32, l = j0 % 32;
        const float dl = __fmul_rn(d_fp16_to_f32(b->d), (float)b->scales[j0 / 16]);
        const uint8_t *ql = b->ql + 64 * h + l + 32 * (sq & 1), *qh = b->qh + 32 * h + l;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int lo = (ql[i] >> (4 * (sq >> 1))) & 0xF, hi = (qh[i] >> (2 * sq)) & 3;
            w[i] = __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
        }
    } else {
        const int64_t bl = d_blck(TYPE);
        const char *blk = row + (kk / bl) * d_block_bytes(TYPE);
        const int j0 = (int)(kk % bl);
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = d_block_get(TYPE, blk, j0 + i);
    }
}

/* D[:, c] = A^T B[:, c] for c < ncols; one warp per row of A.  WIDE: 8
 * weights a lane a step (B's columns 16-byte aligned, B and ldb, and for
 * F32 / F16 / BF16 / Q4_K A's rows as weights8 reads them), the last k % 8
 * one a lane; else every weight one a lane a step. */
template <int TYPE, bool WIDE>
__global__ void k_mmv(const char *A, int64_t a_nb1, int64_t k, int64_t m, const float *B, int64_t ldb, int ncols,
                      float *D, int64_t ldd) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (row >= m) return;
    const char *ar = A + row * a_nb1;
    float acc[MMV_MAX_COLS];
#pragma unroll
    for (int c = 0; c < MMV_MAX_COLS; c++) acc[c] = 0.0f;
    const int64_t k8 = WIDE ? k / 8 * 8 : 0;
#pragma unroll 2
    for (int64_t kk = (int64_t)lane * 8; kk < k8; kk += 256) {
        float w[8];
        weights8<TYPE>(ar, kk, w);
#pragma unroll
        for (int c = 0; c < MMV_MAX_COLS; c++) {
            if (c >= ncols) break;
            const float4 *bp = (const float4 *)(B + c * ldb + kk);
            const float4 x0 = bp[0], x1 = bp[1];
            float a = acc[c];
            a += w[0] * x0.x; a += w[1] * x0.y; a += w[2] * x0.z; a += w[3] * x0.w;
            a += w[4] * x1.x; a += w[5] * x1.y; a += w[6] * x1.z; a += w[7] * x1.w;
            acc[c] = a;
        }
    }
    for (int64_t kk = k8 + lane; kk < k; kk += 32) {
        const float w = weight_at(TYPE, ar, kk);
#pragma unroll
        for (int c = 0; c < MMV_MAX_COLS; c++)
            if (c < ncols) acc[c] += w * B[c * ldb + kk];
    }
    mmv_store(acc, ncols, lane, D, ldd, row);
}

/* Q8_0 / Q4_0 / Q4_K decode with int8 dot products (__dp4a), as the
 * CPU's dot products work (here against Q8_0's blocks of 32 for every
 * type): the columns are quantised first (src/quants.c's bt_q8_0_from_f32:
 * d = max|x| / 127 rounded to F16, q = round(x / d)), then each lane takes
 * 8 weights a step as k_mmv does, two dp4a against the column's quants,
 * times the weights' scale and the column block's (Q4_K: less its min times
 * the sum of the column's quants).  H200, m 4096, k 14336: Q8_0 41.2 -> 34.0
 * us, Q4_0 41.7 -> 22.2, Q4_K 49.2 -> 28.5 against k_mmv; Q6_K, its quants
 * put together byte by byte, gained nothing (63.1 -> 64.2) and stays there. */
__global__ void k_quant_cols_q8(const float *B, int64_t ldb, int64_t k, int64_t n_blocks, int8_t *qb, float *db) {
    const int lane = threadIdx.x & 31;
    const int64_t blk = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (blk >= n_blocks) return;
    const int64_t nb = k / BT_QK, c = blk / nb, b = blk % nb;
    const float x = B[c * ldb + b * BT_QK + lane];
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    qb[c * k + b * BT_QK + lane] = (int8_t)roundf(x * id);
    if (lane == 0) db[c * nb + b] = d_fp16_to_f32(d_f32_to_fp16(d));
}

template <int TYPE>
__global__ void k_mmv_dp4a(const char *A, int64_t a_nb1, int64_t k, int64_t m, const int8_t *qb, const float *db,
                           int ncols, float *D, int64_t ldd) {
    const int lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * MMV_WARPS + (threadIdx.x >> 5);
    if (row >= m) return;
    const char *ar = A + row * a_nb1;
    const int64_t nb = k / BT_QK;
    float acc[MMV_MAX_COLS];
#pragma unroll
    for (int c = 0; c < MMV_MAX_COLS; c++) acc[c] = 0.0f;
#pragma unroll 2
    for (int64_t kk = (int64_t)lane * 8; kk < k; kk += 256) {
        const int64_t ib = kk / BT_QK; /* the columns' block */
        /* the 8 quants as two words of 4 bytes, the scale of their sum (and
         * for Q4_K the min, times the sum of the columns' quants) */
        uint32_t w0, w1;
        float dw, mw = 0.0f;
        if (TYPE == BT_TYPE_Q8_0 || TYPE == BT_TYPE_Q4_0) {
            const int64_t bb = TYPE == BT_TYPE_Q8_0 ? (int64_t)sizeof(bt_block_q8_0) : (int64_t)sizeof(bt_block_q4_0);
            const int j0 = (int)(kk % BT_QK);
            const char *blk = ar + ib * bb;
            dw = d_fp16_to_f32(*(const uint16_t *)blk);
            /* blocks of 34 and 18 bytes: 2-byte words */
            const uint16_t *q = (const uint16_t *)(blk + 2 + (TYPE == BT_TYPE_Q8_0 ? j0 : j0 % (BT_QK / 2)));
            w0 = (uint32_t)q[0] | (uint32_t)q[1] << 16;
            w1 = (uint32_t)q[2] | (uint32_t)q[3] << 16;
            if (TYPE == BT_TYPE_Q4_0) {
                const int sh = j0 < BT_QK / 2 ? 0 : 4;
                w0 = __vsub4((w0 >> sh) & 0x0F0F0F0Fu, 0x08080808u);
                w1 = __vsub4((w1 >> sh) & 0x0F0F0F0Fu, 0x08080808u);
            }
        } else { /* Q4_K: w = d sc q - dmin mn, the quants 0..15, the min apart */
            const bt_block_q4_K *b = (const bt_block_q4_K *)(ar + (kk / BT_QK_K) * (int64_t)sizeof(bt_block_q4_K));
            const int j0 = (int)(kk % BT_QK_K), sub = j0 / 32, sh = 4 * (sub % 2);
            uint8_t sc, mn;
            q4_K_scale_min(b->scales, sub, &sc, &mn);
            dw = d_fp16_to_f32(b->d) * (float)sc;
            mw = d_fp16_to_f32(b->dmin) * (float)mn;
            const uint2 v = *(const uint2 *)(b->qs + 32 * (sub / 2) + j0 % 32); /* 8-byte aligned: blocks of 144 */
            w0 = (v.x >> sh) & 0x0F0F0F0Fu;
            w1 = (v.y >> sh) & 0x0F0F0F0Fu;
        }
#pragma unroll
        for (int c = 0; c < MMV_MAX_COLS; c++) {
            if (c >= ncols) break;
            const int2 vb = *(const int2 *)(qb + c * k + kk);
            const int sum = __dp4a((int)w1, vb.y, __dp4a((int)w0, vb.x, 0));
            float t = dw * (float)sum;
            if (TYPE == BT_TYPE_Q4_K) t -= mw * (float)__dp4a(0x01010101, vb.y, __dp4a(0x01010101, vb.x, 0));
            acc[c] += t * db[c * nb + ib];
        }
    }
    mmv_store(acc, ncols, lane, D, ldd, row);
}

/* dst[k, n] (type F16 or BF16, contiguous) = src columns (F32, ld floats) */
__global__ void k_convert_cols(int type, const float *src, int64_t ld, int64_t k, void *dst, int64_t n_items) {
    GRID_STRIDE(e, n_items) {
        const float v = src[(e / k) * ld + e % k];
        ((uint16_t *)dst)[e] = type == BT_TYPE_BF16 ? d_f32_to_bf16(v) : d_f32_to_fp16(v);
    }
}

/* dst[k, m] F16 contiguous = dequantised rows of A (block type, a_nb1) */
__global__ void k_dequant_f16(int type, const char *A, int64_t a_nb1, int64_t k, uint16_t *dst, int64_t n_items) {
    GRID_STRIDE(e, n_items) {
        const int64_t row = e / k, kk = e % k;
        dst[e] = d_f32_to_fp16(weight_at(type, A + row * a_nb1, kk));
    }
}

/* the same, 8 weights a thread (weights8: the same values) and one 16-byte
 * store; k a multiple of 8, A's rows aligned as weights8 reads them, dst 16
 * bytes aligned.  (H200, 4096 x 4096 Q8_0: the prompt product took 148 us,
 * 36 of them cuBLAS's.) */
template <int TYPE>
__global__ void k_dequant8_f16(const char *A, int64_t a_nb1, int64_t k, uint16_t *dst, int64_t n_items) {
    GRID_STRIDE(e, n_items) {
        const int64_t row = e / (k / 8), kk = (e % (k / 8)) * 8;
        float w[8];
        weights8<TYPE>(A + row * a_nb1, kk, w);
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; i++) u[i] = (uint32_t)d_f32_to_fp16(w[2 * i]) | (uint32_t)d_f32_to_fp16(w[2 * i + 1]) << 16;
        *(uint4 *)(dst + e * 8) = make_uint4(u[0], u[1], u[2], u[3]);
    }
}

/* every weight type the products read, for the kernels' switches */
#define BT_CUDA_WEIGHT_TYPES(X)                                                                         \
    X(BT_TYPE_F32) X(BT_TYPE_F16) X(BT_TYPE_BF16) X(BT_TYPE_Q8_0) X(BT_TYPE_Q4_0) X(BT_TYPE_Q4_1)        \
    X(BT_TYPE_Q5_0) X(BT_TYPE_Q5_1) X(BT_TYPE_Q2_K) X(BT_TYPE_Q3_K) X(BT_TYPE_Q4_K) X(BT_TYPE_Q5_K) \
    X(BT_TYPE_Q6_K) X(BT_TYPE_MXFP4) X(BT_TYPE_IQ4_NL) X(BT_TYPE_IQ4_XS) X(BT_TYPE_IQ2_XXS) X(BT_TYPE_IQ2_XS)    \
    X(BT_TYPE_IQ2_S) X(BT_TYPE_IQ3_XXS) X(BT_TYPE_IQ3_S) X(BT_TYPE_IQ1_S)

/* A's rows for weights8: 16-byte loads (F32, F16, BF16), 8 (Q4_K), else 2 */
static bool weights8_aligned(enum bt_type type, const char *A, int64_t a_nb1) {
    const bool a16 = type == BT_TYPE_F32 || type == BT_TYPE_F16 || type == BT_TYPE_BF16 || type == BT_TYPE_Q4_K;
    const int64_t a_align = a16 ? 16 : 2;
    return (uintptr_t)A % a_align == 0 && a_nb1 % a_align == 0;
}

/* the direct kernel for weight type TYPE: 8 weights a lane a step when the
 * rows are aligned (wide), else one.  (A Q8_0 / Q4_0 kernel that gave each
 * lane whole blocks was slower on an H200: 77.9 and 69.1 us against 41.3
 * and 48.7 us at m 4096, k 14336.) */
template <int TYPE>
static void launch_mmv(bool wide, unsigned blocks, cudaStream_t st, const char *A, int64_t a_nb1, int64_t k, int64_t m,
                       const float *B, int64_t ldb, int nc, float *D, int64_t ldd) {
    if (wide) k_mmv<TYPE, true><<<blocks, 32 * MMV_WARPS, 0, st>>>(A, a_nb1, k, m, B, ldb, nc, D, ldd);
    else k_mmv<TYPE, false><<<blocks, 32 * MMV_WARPS, 0, st>>>(A, a_nb1, k, m, B, ldb, nc, D, ldd);
}

/* Q8_0 / Q4_0 / Q4_K decode through k_quant_cols_q8 and k_mmv_dp4a, MMV_MAX_COLS
 * columns at a time (the columns' quants in scratch B) */
static enum bt_status mmv_dp4a(struct bt_cuda_ctx *c, enum bt_type type, const char *A, int64_t a_nb1, int64_t k,
                               int64_t m, const float *B, int64_t ldb, int64_t n, float *D, int64_t ldd) {
    const int64_t nb = k / BT_QK, cols = n < MMV_MAX_COLS ? n : MMV_MAX_COLS;
    const size_t q_bytes = ((size_t)(cols * k) + 255) / 256 * 256;
    char *scr = (char *)bt_cuda_scratch(c, BT_CUDA_SCRATCH_B, q_bytes + (size_t)(cols * nb) * sizeof(float));
    if (!scr) return BT_ERR_NOMEM;
    int8_t *qb = (int8_t *)scr;
    float *db = (float *)(scr + q_bytes);
    const unsigned blocks = (unsigned)((m + MMV_WARPS - 1) / MMV_WARPS);
    for (int64_t c0 = 0; c0 < n; c0 += MMV_MAX_COLS) {
        const int nc = (int)(n - c0 < MMV_MAX_COLS ? n - c0 : MMV_MAX_COLS);
        const int64_t n_blocks = nc * nb;
        k_quant_cols_q8<<<(unsigned)((n_blocks + 7) / 8), 256, 0, c->stream>>>(B + c0 * ldb, ldb, k, n_blocks, qb, db);
        switch (type) {
#define DP4A_CASE(T) \
    case T: k_mmv_dp4a<T><<<blocks, 32 * MMV_WARPS, 0, c->stream>>>(A, a_nb1, k, m, qb, db, nc, D + c0 * ldd, ldd); break;
            DP4A_CASE(BT_TYPE_Q8_0)
            DP4A_CASE(BT_TYPE_Q4_0)
            DP4A_CASE(BT_TYPE_Q4_K)
#undef DP4A_CASE
            default: return bt_cuda_fail(c, BT_ERR_UNSUPPORTED, "mul_mat (dp4a): weight type %s", bt_type_name(type));
        }
        const enum bt_status s = bt_cuda_check(c, cudaGetLastError(), "mul_mat (dp4a)");
        if (s != BT_OK) return s;
    }
    return BT_OK;
}

static cudaDataType_t cuda_type(enum bt_type t) {
    switch (t) {
        case BT_TYPE_F16: return CUDA_R_16F;
        case BT_TYPE_BF16: return CUDA_R_16BF;
        default: return CUDA_R_32F;
    }
}

static enum bt_status cublas_check(struct bt_cuda_ctx *c, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return BT_OK;
    return bt_cuda_fail(c, BT_ERR_INVALID, "%s: cuBLAS status %d", what, (int)s);
}

/* D[m, n] (ldd floats) = A[k, m]^T (type, a_nb1 bytes per row) x B[k, n] (ldb floats) */
static enum bt_status mm_2d(struct bt_cuda_ctx *c, enum bt_type type, const char *A, int64_t a_nb1, int64_t k,
                            int64_t m, const float *B, int64_t ldb, int64_t n, float *D, int64_t ldd) {
    if (m == 0 || n == 0) return BT_OK;
    cudaStream_t st = c->stream;
    const bool quant = bt_type_traits(type)->is_quantized;
    /* cuBLAS wants lda, ldb >= max(1, k) and ldd >= max(1, m); the CPU takes
     * any row strides (overlapping views, k == 0), so anything else goes
     * through the direct kernel, MMV_MAX_COLS columns at a time */
    const bool gemm_ok = k > 0 && ldd >= m && (quant || a_nb1 / (int64_t)bt_type_size(type) >= k) &&
                         (type != BT_TYPE_F32 || ldb >= k);
    if (n <= MMV_MAX_COLS || !gemm_ok) {
        const unsigned blocks = (unsigned)((m + MMV_WARPS - 1) / MMV_WARPS);
        const bool wide = (uintptr_t)B % 16 == 0 && ldb % 4 == 0 && weights8_aligned(type, A, a_nb1);
        if ((type == BT_TYPE_Q8_0 || type == BT_TYPE_Q4_0 || type == BT_TYPE_Q4_K) &&
            weights8_aligned(type, A, a_nb1) && k % BT_QK == 0)
            return mmv_dp4a(c, type, A, a_nb1, k, m, B, ldb, n, D, ldd);
        for (int64_t c0 = 0; c0 < n; c0 += MMV_MAX_COLS) {
            const int nc = (int)(n - c0 < MMV_MAX_COLS ? n - c0 : MMV_MAX_COLS);
            const float *Bc = B + c0 * ldb;
            float *Dc = D + c0 * ldd;
            switch (type) {
#define MMV_CASE(T) \
    case T: launch_mmv<T>(wide, blocks, st, A, a_nb1, k, m, Bc, ldb, nc, Dc, ldd); break;
                BT_CUDA_WEIGHT_TYPES(MMV_CASE)
#undef MMV_CASE
                default: return bt_cuda_fail(c, BT_ERR_UNSUPPORTED, "mul_mat: weight type %s", bt_type_name(type));
            }
            const enum bt_status s = bt_cuda_check(c, cudaGetLastError(), "mul_mat (mmv)");
            if (s != BT_OK) return s;
        }
        return BT_OK;
    }

    const float one = 1.0f, zero = 0.0f;
    const void *a_ptr = A, *b_ptr = B;
    int64_t lda = 0, ldb_g = ldb;
    enum bt_type gemm_type = type;
    if (quant) {
        uint16_t *aw = (uint16_t *)bt_cuda_scratch(c, BT_CUDA_SCRATCH_A, (size_t)(k * m) * sizeof(uint16_t));
        if (!aw) return BT_ERR_NOMEM;
        if (k % 8 == 0 && (uintptr_t)aw % 16 == 0 && weights8_aligned(type, A, a_nb1)) {
            switch (type) {
#define DEQ_CASE(T) \
    case T: k_dequant8_f16<T><<<grid_for(k / 8 * m), CUDA_THREADS, 0, st>>>(A, a_nb1, k, aw, k / 8 * m); break;
                BT_CUDA_WEIGHT_TYPES(DEQ_CASE)
#undef DEQ_CASE
                default: return bt_cuda_fail(c, BT_ERR_UNSUPPORTED, "mul_mat: weight type %s", bt_type_name(type));
            }
        } else {
            k_dequant_f16<<<grid_for(k * m), CUDA_THREADS, 0, st>>>((int)type, A, a_nb1, k, aw, k * m);
        }
        const enum bt_status s = bt_cuda_check(c, cudaGetLastError(), "mul_mat (dequantise)");
        if (s != BT_OK) return s;
        a_ptr = aw;
        lda = k;
        gemm_type = BT_TYPE_F16;
    } else {
        lda = a_nb1 / (int64_t)bt_type_size(type);
    }
    if (gemm_type != BT_TYPE_F32) {
        void *bw = bt_cuda_scratch(c, BT_CUDA_SCRATCH_B, (size_t)(k * n) * sizeof(uint16_t));
        if (!bw) return BT_ERR_NOMEM;
        k_convert_cols<<<grid_for(k * n), CUDA_THREADS, 0, st>>>((int)gemm_type, B, ldb, k, bw, k * n);
        b_ptr = bw;
        ldb_g = k;
    }
    enum bt_status s = bt_cuda_check(c, cudaGetLastError(), "mul_mat (convert)");
    if (s != BT_OK) return s;
    const cudaDataType_t ct = cuda_type(gemm_type);
    /* column-major view: D (m x n) = A' (k x m)^T  B' (k x n) */
    return cublas_check(c,
                        cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, a_ptr, ct,
                                     (int)lda, b_ptr, ct, (int)ldb_g, &zero, D, CUDA_R_32F, (int)ldd,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "cublasGemmEx");
}

extern "C" enum bt_status bt_cuda_mul_mat(struct bt_cuda_ctx *c, struct bt_tensor *d) {
    const struct bt_tensor *a = d->src[0], *b = d->src[1];
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    /* a group's share of the rows (bt_tensor row_lo/hi): only those rows */
    const int64_t lo = a->row_hi > 0 ? a->row_lo : 0, hi = a->row_hi > 0 ? a->row_hi : a->ne[1];
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const char *A = (const char *)a->data + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3] + lo * a->nb[1];
            const float *B = (const float *)((const char *)b->data + i2 * b->nb[2] + i3 * b->nb[3]);
            float *D = (float *)((char *)d->data + i2 * d->nb[2] + i3 * d->nb[3]) + lo;
            const enum bt_status s = mm_2d(c, a->type, A, (int64_t)a->nb[1], a->ne[0], hi - lo, B,
                                           (int64_t)(b->nb[1] / sizeof(float)), b->ne[1], D,
                                           (int64_t)(d->nb[1] / sizeof(float)));
            if (s != BT_OK) return s;
        }
    return BT_OK;
}

/* ---- MUL_MAT_ID --------------------------------------------------------------- */

/* bg[:, p] = b[:, e % n_b, t] for pair p = e + n_used * t */
__global__ void k_gather(t4 b, const int32_t *pairs, int64_t n_used, int64_t k, float *bg, int64_t n_items) {
    GRID_STRIDE(x, n_items) {
        const int64_t p = x / k, kk = x % k;
        const int64_t pair = pairs[p], e = pair % n_used, t = pair / n_used;
        bg[x] = *(const float *)elem_addr(b, kk, e % b.ne[1], t, 0);
    }
}

/* dst[:, e, t] = dg[:, p] */
__global__ void k_scatter(t4 d, const int32_t *pairs, int64_t n_used, int64_t m, const float *dg, int64_t n_items) {
    GRID_STRIDE(x, n_items) {
        const int64_t p = x / m, i = x % m;
        const int64_t pair = pairs[p], e = pair % n_used, t = pair / n_used;
        *(float *)elem_addr(d, i, e, t, 0) = dg[x];
    }
}

extern "C" enum bt_status bt_cuda_mul_mat_id(struct bt_cuda_ctx *c, struct bt_tensor *d) {
    const struct bt_tensor *as = d->src[0], *b = d->src[1], *ids = d->src[2];
    const int64_t n_expert = as->ne[2], n_used = ids->ne[0], n_tokens = ids->ne[1];
    const int64_t k = as->ne[0], m = as->ne[1], total = n_used * n_tokens;
    /* the experts held here (an expert group's share: bt_tensor); the pairs of
     * the others are left as they were */
    const int64_t lo = as->expert_hi > 0 ? as->expert_lo : 0, hi = as->expert_hi > 0 ? as->expert_hi : n_expert;
    if (total == 0 || m == 0) return BT_OK;
    const size_t ids_bytes = bt_nbytes(ids);
    const size_t ids_span = (ids_bytes + 63) / 64 * 64;
    /* host: ids, then pairs (total), then offs (n_expert + 1) */
    enum bt_status s = bt_cuda_check(c, cudaStreamSynchronize(c->stream), "mul_mat_id: synchronize");
    if (s != BT_OK) return s;
    char *stage = (char *)bt_cuda_host_stage(c, ids_span + (size_t)total * 4 + (size_t)(n_expert + 1) * 4);
    if (!stage) return BT_ERR_NOMEM;
    s = bt_cuda_check(c, cudaMemcpyAsync(stage, ids->data, ids_bytes, cudaMemcpyDeviceToHost, c->stream),
                      "mul_mat_id: ids to host");
    if (s != BT_OK) return s;
    s = bt_cuda_check(c, cudaStreamSynchronize(c->stream), "mul_mat_id: synchronize");
    if (s != BT_OK) return s;

    int32_t *pairs = (int32_t *)(stage + ids_span);
    int32_t *offs = pairs + total;
    for (int64_t x = 0; x <= n_expert; x++) offs[x] = 0;
#define ID_AT(e, t) (*(const int32_t *)(stage + (size_t)(e) * ids->nb[0] + (size_t)(t) * ids->nb[1]))
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) {
            const int32_t id = ID_AT(e, t);
            if (id < 0 || id >= n_expert)
                return bt_cuda_fail(c, BT_ERR_INVALID, "node '%s': expert id %d out of range [0, %lld)", d->name,
                                    id, (long long)n_expert);
            if (id >= lo && id < hi) offs[id + 1]++;
        }
    for (int64_t x = 0; x < n_expert; x++) offs[x + 1] += offs[x];
    const int64_t held = offs[n_expert]; /* the pairs computed here */
    if (held == 0) return BT_OK;
    /* counting sort, stable in (token, slot) order; offs[x] ends at x's end */
    for (int64_t t = 0; t < n_tokens; t++)
        for (int64_t e = 0; e < n_used; e++) {
            const int32_t id = ID_AT(e, t);
            if (id >= lo && id < hi) pairs[offs[id]++] = (int32_t)(e + n_used * t);
        }
#undef ID_AT
    for (int64_t x = n_expert; x > 0; x--) offs[x] = offs[x - 1];
    offs[0] = 0;

    /* device: gathered columns bg [k, total], results dg [m, total], pairs */
    const size_t bg_bytes = ((size_t)(k * held) * 4 + 255) / 256 * 256;
    const size_t dg_bytes = ((size_t)(m * held) * 4 + 255) / 256 * 256;
    char *scr = (char *)bt_cuda_scratch(c, BT_CUDA_SCRATCH_ID, bg_bytes + dg_bytes + (size_t)held * 4);
    if (!scr) return BT_ERR_NOMEM;
    float *bg = (float *)scr, *dg = (float *)(scr + bg_bytes);
    int32_t *dpairs = (int32_t *)(scr + bg_bytes + dg_bytes);
    s = bt_cuda_check(c, cudaMemcpyAsync(dpairs, pairs, (size_t)held * 4, cudaMemcpyHostToDevice, c->stream),
                      "mul_mat_id: pairs to device");
    if (s != BT_OK) return s;
    k_gather<<<grid_for(k * held), CUDA_THREADS, 0, c->stream>>>(t4_of(b), dpairs, n_used, k, bg, k * held);
    s = bt_cuda_check(c, cudaGetLastError(), "mul_mat_id (gather)");
    if (s != BT_OK) return s;
    for (int64_t x = 0; x < n_expert; x++) {
        const int64_t cnt = offs[x + 1] - offs[x];
        if (cnt == 0) continue;
        s = mm_2d(c, as->type, (const char *)as->data + x * as->nb[2], (int64_t)as->nb[1], k, m, bg + offs[x] * k, k,
                  cnt, dg + offs[x] * m, m);
        if (s != BT_OK) return s;
    }
    k_scatter<<<grid_for(m * held), CUDA_THREADS, 0, c->stream>>>(t4_of(d), dpairs, n_used, m, dg, m * held);
    return bt_cuda_check(c, cudaGetLastError(), "mul_mat_id (scatter)");
}
