/* attn.cu - FLASH_ATTN on the GPU: softmax(s * q k^T + mask) v with an online
 * softmax, one pass over the cells, the semantics of src/ops.h and of the CPU
 * kernel (backends/cpu/attn.c):
 *
 *   q    F32 [D, H, T]        k [D, Hk, N], v [Dv, Hk, N] (F32, F16, Q8_0)
 *   mask F32/F16 [N, >= T]    out F32 [Dv, H, T] contiguous
 *   sinks F32 [H] or none: after the last cell, the sink's logit as one
 *   more step of the update below that adds no v (the CPU kernel's order)
 *
 * Launch: one warp per output row (q head h, query row t), ATTN_WARPS warps
 * per block; q head h reads kv head h / (H / Hk).  Lane l holds q[i] and the
 * accumulator acc[i] for i = l, l + 32, ... (D, Dv <= BT_CUDA_ATTN_MAX_D, see
 * supports.c), in registers.
 *
 * Determinism: a row's result depends only on its own q row and on the
 * sequence of cells it sees (the unmasked cells in increasing cell order,
 * their k, v and mask values).  Per cell: a -inf mask skips the cell before
 * anything is computed from it; the dot product is each lane's partial sum
 * over its own elements in increasing i, then a butterfly (xor shuffle)
 * tree over the 32 lanes, which leaves the same bits in every lane (float
 * addition is commutative); then the same update as the CPU kernel
 *     s > M:  r = exp(M - s); M = s;  acc = acc*r + v;   S = S*r + 1
 *     else:   e = exp(s - M);         acc = acc + v*e;   S = S + e
 * element-wise.  No atomics, no reduction across warps: the result does not
 * depend on T, on the other rows of the batch, on n_kv beyond the cells the
 * row sees, nor on the launch shape.  It differs from the CPU's in the last
 * bits (another summation order of the dot product, the device's expf). */
#include <math.h>

#include "cuda_common.cuh"

BT_CUDA_TABLES_UPLOAD(bt_cuda_tables_upload_attn)

#define ATTN_WARPS 4
#define ATTN_PER_LANE (BT_CUDA_ATTN_MAX_D / 32)

/* element i of a packed row of F32, F16 or Q8_0 (nb[0] is the type size,
 * for Q8_0 the size of a block of BT_QK elements) */
__device__ __forceinline__ float attn_elem(int type, const char *row, int64_t nb0, int i) {
    if (type == BT_TYPE_Q8_0) return d_q8_0_get(row + (i / BT_QK) * nb0, i % BT_QK);
    return load_f32(type, row + (int64_t)i * nb0, i);
}

__global__ void k_flash_attn(t4 d, t4 q, t4 k, t4 v, t4 m, int has_mask, const float *sinks, float scale,
                             int64_t n_rows) {
    const int lane = (int)(threadIdx.x & 31);
    const int64_t row = (int64_t)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5);
    if (row >= n_rows) return; /* the whole warp leaves together */
    const int64_t H = q.ne[1], t = row / H, h = row - t * H;
    const int64_t hk = h / (H / k.ne[1]);
    const int D = (int)q.ne[0], Dv = (int)v.ne[0];
    const int64_t N = k.ne[2];

    const char *qr = q.data + h * q.nb[1] + t * q.nb[2];
    float qv[ATTN_PER_LANE], acc[ATTN_PER_LANE];
#pragma unroll
    for (int r = 0; r < ATTN_PER_LANE; r++) {
        const int i = lane + 32 * r;
        qv[r] = i < D ? *(const float *)(qr + (int64_t)i * q.nb[0]) : 0.0f;
        acc[r] = 0.0f;
    }
    float M = -INFINITY, S = 0.0f;
    for (int64_t j = 0; j < N; j++) {
        float mv = 0.0f;
        if (has_mask) {
            const char *pm = m.data + j * m.nb[0] + t * m.nb[1];
            mv = m.type == BT_TYPE_F16 ? d_fp16_to_f32(*(const uint16_t *)pm) : *(const float *)pm;
            if (mv == -INFINITY) continue;
        }
        const char *kr = k.data + hk * k.nb[1] + j * k.nb[2];
        float part = 0.0f;
#pragma unroll
        for (int r = 0; r < ATTN_PER_LANE; r++) {
            const int i = lane + 32 * r;
            if (i < D) part = __fadd_rn(part, __fmul_rn(qv[r], attn_elem(k.type, kr, k.nb[0], i)));
        }
        for (int o = 16; o > 0; o >>= 1) part = __fadd_rn(part, __shfl_xor_sync(0xffffffffu, part, o));
        const float s = __fadd_rn(__fmul_rn(part, scale), mv);
        if (s == -INFINITY) continue;
        const char *vr = v.data + hk * v.nb[1] + j * v.nb[2];
        if (s > M) {
            const float rs = expf(M - s); /* 0 for the first cell (M = -inf) */
            M = s;
#pragma unroll
            for (int r = 0; r < ATTN_PER_LANE; r++) {
                const int i = lane + 32 * r;
                if (i < Dv) acc[r] = __fadd_rn(__fmul_rn(acc[r], rs), attn_elem(v.type, vr, v.nb[0], i));
            }
            S = __fadd_rn(__fmul_rn(S, rs), 1.0f);
        } else {
            const float e = expf(s - M);
#pragma unroll
            for (int r = 0; r < ATTN_PER_LANE; r++) {
                const int i = lane + 32 * r;
                if (i < Dv) acc[r] = __fadd_rn(acc[r], __fmul_rn(attn_elem(v.type, vr, v.nb[0], i), e));
            }
            S = __fadd_rn(S, e);
        }
    }
    if (sinks) {
        const float sk = sinks[h];
        if (sk > M) {
            const float rs = expf(M - sk);
#pragma unroll
            for (int r = 0; r < ATTN_PER_LANE; r++) acc[r] = __fmul_rn(acc[r], rs);
            S = __fadd_rn(__fmul_rn(S, rs), 1.0f);
        } else {
            S = __fadd_rn(S, expf(sk - M));
        }
    }
    const float inv = S > 0.0f ? 1.0f / S : 0.0f;
    char *out = d.data + h * d.nb[1] + t * d.nb[2];
#pragma unroll
    for (int r = 0; r < ATTN_PER_LANE; r++) {
        const int i = lane + 32 * r;
        if (i < Dv) *(float *)(out + (int64_t)i * d.nb[0]) = __fmul_rn(acc[r], inv);
    }
}

extern "C" enum bt_status bt_cuda_flash_attn(struct bt_cuda_ctx *c, struct bt_tensor *dst) {
    const struct bt_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const int64_t n_rows = q->ne[1] * q->ne[2];
    if (n_rows == 0) return BT_OK;
    const int64_t blocks = (n_rows + ATTN_WARPS - 1) / ATTN_WARPS;
    k_flash_attn<<<(unsigned)blocks, 32 * ATTN_WARPS, 0, c->stream>>>(
        t4_of(dst), t4_of(q), t4_of(k), t4_of(v), mask ? t4_of(mask) : t4_of(dst), mask != NULL,
        dst->src[4] ? (const float *)dst->src[4]->data : NULL, bt_get_op_param_f32(dst, 0), n_rows);
    return bt_cuda_check(c, cudaGetLastError(), "FLASH_ATTN");
}
