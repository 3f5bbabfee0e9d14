/* ops.cu - CUDA kernels for every op of ops.h except MUL_MAT / MUL_MAT_ID
 * (matmul.cu) and FLASH_ATTN (attn.cu), and the dispatch of all of them,
 * with the semantics of the CPU kernels (backends/cpu/ops_cpu.c):
 * sources are read through their nb[] strides, dst is written through its
 * own (CPY's and SET_ROWS' dst is a view into another tensor), reductions
 * accumulate in double, conversions round as tensor.c does.
 *
 * Launch shapes: element-wise ops and MOE_SUM use one thread per element in a
 * grid-stride loop; row ops (norms, soft_max, sum_rows, argsort, set_rows)
 * one block per row.  A bad row id in GET_ROWS / SET_ROWS is reported through
 * the backend's device error word (cuda_backend.c reads it at the end of the
 * graph); the row with the bad id is skipped. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "cuda_common.cuh"
#include "baton/ops.h"

BT_CUDA_TABLES_UPLOAD(bt_cuda_tables_upload_ops)

/* ---- binary element-wise with broadcast of b ---------------------------- */

__global__ void k_binary(int op, t4 d, t4 a, t4 b, int64_t n) {
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, d.ne, i);
        const float x = *(const float *)elem_addr(a, i[0], i[1], i[2], i[3]);
        const float y = *(const float *)elem_addr(b, i[0] % b.ne[0], i[1] % b.ne[1], i[2] % b.ne[2], i[3] % b.ne[3]);
        float z;
        switch (op) {
            case BT_OP_ADD: z = x + y; break;
            case BT_OP_SUB: z = x - y; break;
            case BT_OP_MUL: z = x * y; break;
            default: z = x / y; break;
        }
        *(float *)elem_addr(d, i[0], i[1], i[2], i[3]) = z;
    }
}

/* ---- unary element-wise --------------------------------------------------- */

#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535587989211986876f

__device__ __forceinline__ float d_silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void k_unary(int op, float s, t4 d, t4 a, int64_t n) {
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, d.ne, i);
        const float x = *(const float *)elem_addr(a, i[0], i[1], i[2], i[3]);
        float z;
        switch (op) {
            case BT_OP_SCALE: z = x * s; break;
            case BT_OP_SQR: z = x * x; break;
            case BT_OP_SQRT: z = sqrtf(x); break;
            case BT_OP_SILU: z = d_silu(x); break;
            case BT_OP_GELU: z = 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x))); break;
            case BT_OP_RELU: z = x > 0.0f ? x : 0.0f; break;
            default: z = 1.0f / (1.0f + expf(-x)); break; /* SIGMOID */
        }
        *(float *)elem_addr(d, i[0], i[1], i[2], i[3]) = z;
    }
}

/* SWIGLU: silu(a) * b; SWIGLU_OAI (oai != 0): gpt-oss's clamped form (ops.h) */
__global__ void k_swiglu(t4 d, t4 a, t4 b, int64_t n, int oai, float alpha, float limit) {
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, d.ne, i);
        float x = *(const float *)elem_addr(a, i[0], i[1], i[2], i[3]);
        float y = *(const float *)elem_addr(b, i[0], i[1], i[2], i[3]);
        float z;
        if (oai) {
            x = fminf(x, limit);
            y = fminf(fmaxf(y, -limit), limit);
            z = x / (1.0f + expf(-alpha * x)) * (y + 1.0f);
        } else {
            z = d_silu(x) * y;
        }
        *(float *)elem_addr(d, i[0], i[1], i[2], i[3]) = z;
    }
}

/* MOE_SUM: out[i,t] = a[i,0,t]*w[0,t] + a[i,1,t]*w[1,t] + .. in slot order,
 * each product rounded before it is added (__fmul_rn / __fadd_rn: nvcc
 * would contract them into FMAs), the bits of the CPU's MUL and ADDs */
__global__ void k_moe_sum(t4 d, t4 a, t4 w, int64_t n) {
    GRID_STRIDE(e, n) {
        const int64_t i = e % d.ne[0], t = e / d.ne[0];
        float z = 0.0f;
        for (int64_t k = 0; k < a.ne[1]; k++) {
            const float x = *(const float *)elem_addr(a, i, k, t, 0), y = *(const float *)elem_addr(w, 0, k, t, 0);
            const float p = __fmul_rn(x, y);
            z = k == 0 ? p : __fadd_rn(z, p);
        }
        *(float *)elem_addr(d, i, t, 0, 0) = z;
    }
}

/* ---- row ops: one block per row ---------------------------------------------- */

#define ROW_THREADS 256

/* row index (blockIdx.x) -> (i1, i2, i3) over t's ne */
__device__ __forceinline__ void row_of(const t4 &t, int64_t r, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t.ne[1];
    r /= t.ne[1];
    *i2 = r % t.ne[2];
    *i3 = r / t.ne[2];
}

__device__ __forceinline__ float rowf(const t4 &t, const char *row, int64_t i) { return *(const float *)(row + i * t.nb[0]); }

__global__ void k_sum_rows(int op, t4 d, t4 a) {
    __shared__ double sh[32];
    int64_t i1, i2, i3;
    row_of(d, blockIdx.x, &i1, &i2, &i3);
    const char *ra = elem_addr(a, 0, i1, i2, i3);
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < a.ne[0]; i += blockDim.x) s += (double)rowf(a, ra, i);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        float v = (float)s;
        if (op == BT_OP_MEAN) v = (float)(s / (double)a.ne[0]);
        *(float *)elem_addr(d, 0, i1, i2, i3) = v;
    }
}

__global__ void k_norm(int op, float eps, t4 d, t4 a) {
    __shared__ double sh[32];
    int64_t i1, i2, i3;
    row_of(d, blockIdx.x, &i1, &i2, &i3);
    const char *ra = elem_addr(a, 0, i1, i2, i3);
    char *rd = elem_addr(d, 0, i1, i2, i3);
    const int64_t n0 = a.ne[0];
    if (op == BT_OP_RMS_NORM) {
        double s = 0.0;
        for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) {
            const float x = rowf(a, ra, i);
            s += (double)(x * x);
        }
        s = block_sum(s, sh);
        const float mean = (float)(s / (double)n0);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) *(float *)(rd + i * d.nb[0]) = rowf(a, ra, i) * scale;
        return;
    }
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) s += (double)rowf(a, ra, i);
    s = block_sum(s, sh);
    const float mean = (float)(s / (double)n0);
    double s2 = 0.0;
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) {
        const float y = rowf(a, ra, i) - mean;
        s2 += (double)(y * y);
    }
    s2 = block_sum(s2, sh);
    const float var = (float)(s2 / (double)n0);
    const float scale = 1.0f / sqrtf(var + eps);
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x)
        *(float *)(rd + i * d.nb[0]) = (rowf(a, ra, i) - mean) * scale;
}

/* softmax(a*scale + mask) along dim 0; an all -inf row gives zeros */
__global__ void k_soft_max(float scale, t4 d, t4 a, t4 m, int has_mask) {
    __shared__ double sh[32];
    __shared__ float shf[32];
    int64_t i1, i2, i3;
    row_of(d, blockIdx.x, &i1, &i2, &i3);
    const char *ra = elem_addr(a, 0, i1, i2, i3);
    const char *rm = has_mask ? elem_addr(m, 0, i1, i2 % m.ne[2], i3 % m.ne[3]) : NULL;
    char *rd = elem_addr(d, 0, i1, i2, i3);
    const int64_t n0 = a.ne[0];
#define SM_VAL(i) (rowf(a, ra, i) * scale + (rm ? rowf(m, rm, i) : 0.0f))
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) mx = fmaxf(mx, SM_VAL(i));
    mx = block_max(mx, shf);
    if (mx == -INFINITY) {
        for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) *(float *)(rd + i * d.nb[0]) = 0.0f;
        return;
    }
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) s += (double)expf(SM_VAL(i) - mx);
    s = block_sum(s, sh);
    const float inv = (float)(1.0 / s);
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) *(float *)(rd + i * d.nb[0]) = expf(SM_VAL(i) - mx) * inv;
#undef SM_VAL
}

/* ---- ROPE: one thread per (row, rotated pair or passed-through element) --- */

struct rope_yarn_args {
    float ext_factor, attn_factor, corr[2];
};

__global__ void k_rope(t4 d, t4 a, t4 pos, int n_dims, int neox, float freq_base, float freq_scale,
                       rope_yarn_args y, int64_t n) {
    const int half = n_dims / 2;
    const int64_t per_row = half + (a.ne[0] - n_dims);
    GRID_STRIDE(e, n) {
        const int64_t r = e / per_row, j = e % per_row;
        int64_t i1, i2, i3;
        row_of(d, r, &i1, &i2, &i3);
        const char *ra = elem_addr(a, 0, i1, i2, i3);
        char *rd = elem_addr(d, 0, i1, i2, i3);
        if (j >= half) {
            const int64_t i = n_dims + (j - half);
            *(float *)(rd + i * d.nb[0]) = rowf(a, ra, i);
            continue;
        }
        const int i = (int)j;
        const int32_t ps = *(const int32_t *)(pos.data + i2 * pos.nb[0]);
        float c, s;
        if (y.ext_factor == 0.0f) {
            const float theta = (float)ps * freq_scale * powf(freq_base, -2.0f * (float)i / (float)n_dims);
            c = cosf(theta) * y.attn_factor;
            s = sinf(theta) * y.attn_factor;
        } else {
            bt_rope_yarn_angle(ps, i, n_dims, freq_base, freq_scale, y.ext_factor, y.attn_factor, y.corr, &c, &s);
        }
        const int64_t j0 = neox ? i : 2 * i;
        const int64_t j1 = neox ? i + half : 2 * i + 1;
        const float x0 = rowf(a, ra, j0), x1 = rowf(a, ra, j1);
        *(float *)(rd + j0 * d.nb[0]) = x0 * c - x1 * s;
        *(float *)(rd + j1 * d.nb[0]) = x0 * s + x1 * c;
    }
}

/* ---- ARGSORT: one block per row; the position of element i is the number
 * of elements that precede it (strictly before in the order, or equal with
 * a lower index), so ties keep the lower index first as the CPU's stable
 * merge sort does. ---------------------------------------------------------- */

__global__ void k_argsort(t4 d, t4 a, int desc) {
    extern __shared__ float vals[];
    int64_t i1, i2, i3;
    row_of(d, blockIdx.x, &i1, &i2, &i3);
    const char *ra = elem_addr(a, 0, i1, i2, i3);
    char *rd = elem_addr(d, 0, i1, i2, i3);
    const int n = (int)a.ne[0];
    for (int i = threadIdx.x; i < n; i += blockDim.x) vals[i] = rowf(a, ra, i);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float vi = vals[i];
        const bool ni = isnan(vi);
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const float vj = vals[j];
            const bool nj = isnan(vj);
            /* NaNs after every number (in either order), so that the ranks
             * are a permutation: with NaN unordered, ranks would collide and
             * leave some output entries unwritten */
            const bool before = (ni || nj) ? (ni && !nj) : (desc ? vj > vi : vj < vi);
            const bool tie = (ni || nj) ? (ni && nj) : vj == vi;
            rank += (before || (tie && j < i)) ? 1 : 0;
        }
        *(int32_t *)(rd + (int64_t)rank * d.nb[0]) = i;
    }
}

/* ---- CONCAT: one thread per element (per block for block types) ---------- */

__global__ void k_concat(t4 d, t4 a, t4 b, int dim, int64_t ts, int64_t n) {
    const int64_t bl = d_blck(d.type);
    int64_t une[4] = {d.ne[0] / bl, d.ne[1], d.ne[2], d.ne[3]};
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, une, i);
        char *pd = d.data + i[0] * d.nb[0] + i[1] * d.nb[1] + i[2] * d.nb[2] + i[3] * d.nb[3];
        const t4 *s = &a;
        const int64_t na = dim == 0 ? a.ne[0] / bl : a.ne[dim];
        if (i[dim] >= na) {
            s = &b;
            i[dim] -= na;
        }
        const char *ps = s->data + i[0] * s->nb[0] + i[1] * s->nb[1] + i[2] * s->nb[2] + i[3] * s->nb[3];
        for (int64_t k = 0; k < ts; k++) pd[k] = ps[k];
    }
}

/* ---- GET_ROWS: one thread per dst element --------------------------------- */

__global__ void k_get_rows(t4 d, t4 a, t4 ids, int *err, int tag, int64_t n) {
    GRID_STRIDE(e, n) {
        int64_t i[4];
        unravel(e, d.ne, i);
        const int32_t id = *(const int32_t *)(ids.data + i[1] * ids.nb[0] + i[2] * ids.nb[1] + i[3] * ids.nb[2]);
        if (id < 0 || id >= a.ne[1]) {
            report_bad_id(err, tag, id);
            continue;
        }
        const char *ps = elem_addr(a, i[0], id, i[2], i[3]);
        char *pd = elem_addr(d, i[0], i[1], i[2], i[3]);
        if (a.type == BT_TYPE_I32 && d.type == BT_TYPE_I32)
            *(int32_t *)pd = *(const int32_t *)ps;
        else
            store_f32(d.type, pd, load_f32(a.type, ps, i[0]));
    }
}

/* ---- SET_ROWS: one block per source row; when a later source row of the
 * same plane has the same id, this one is skipped (the last one wins, as on
 * the CPU). ------------------------------------------------------------------ */

__global__ void k_set_rows(t4 d, t4 b, t4 ids, int *err, int tag) {
    int64_t i1, i2, i3;
    row_of(b, blockIdx.x, &i1, &i2, &i3);
    const int32_t id = *(const int32_t *)(ids.data + i1 * ids.nb[0] + i2 * ids.nb[1] + i3 * ids.nb[2]);
    if (id < 0 || id >= d.ne[1]) {
        if (threadIdx.x == 0) report_bad_id(err, tag, id);
        return;
    }
    int later = 0;
    for (int64_t j = i1 + 1 + threadIdx.x; j < b.ne[1]; j += blockDim.x)
        if (*(const int32_t *)(ids.data + j * ids.nb[0] + i2 * ids.nb[1] + i3 * ids.nb[2]) == id) later = 1;
    if (__syncthreads_or(later)) return;

    const char *rb = elem_addr(b, 0, i1, i2, i3);
    const int64_t n0 = b.ne[0];
    if (d_is_quant(d.type)) {
        for (int64_t blk = threadIdx.x; blk < n0 / BT_QK; blk += blockDim.x) {
            float x[BT_QK];
            for (int j = 0; j < BT_QK; j++) x[j] = rowf(b, rb, blk * BT_QK + j);
            quantize_block(d.type, x, elem_addr(d, blk * BT_QK, id, i2, i3));
        }
        return;
    }
    for (int64_t i = threadIdx.x; i < n0; i += blockDim.x) store_f32(d.type, elem_addr(d, i, id, i2, i3), rowf(b, rb, i));
}

/* ---- CPY / CONT: one thread per group of g elements in logical order (g =
 * 32 when either side has a block type, so a group is one whole block of
 * it; the support rules guarantee the alignment). ---------------------------- */

__global__ void k_cpy(t4 d, t4 s, int64_t g, int64_t ts_s, int64_t n_groups) {
    GRID_STRIDE(gi, n_groups) {
        const int64_t e0 = gi * g;
        int64_t si[4], di[4];
        if (s.type == d.type) {
            /* same type: bytes move unchanged (a whole block for block types) */
            unravel(e0, s.ne, si);
            unravel(e0, d.ne, di);
            const char *ps = elem_addr(s, si[0], si[1], si[2], si[3]);
            char *pd = elem_addr(d, di[0], di[1], di[2], di[3]);
            for (int64_t k = 0; k < ts_s; k++) pd[k] = ps[k];
            continue;
        }
        float x[BT_QK];
        if (d_is_quant(s.type)) {
            unravel(e0, s.ne, si);
            const char *ps = elem_addr(s, si[0], si[1], si[2], si[3]);
            for (int j = 0; j < BT_QK; j++) x[j] = load_f32(s.type, ps, j);
        } else {
            for (int64_t j = 0; j < g; j++) {
                unravel(e0 + j, s.ne, si);
                x[j] = load_f32(s.type, elem_addr(s, si[0], si[1], si[2], si[3]), si[0]);
            }
        }
        if (d_is_quant(d.type)) {
            unravel(e0, d.ne, di);
            quantize_block(d.type, x, elem_addr(d, di[0], di[1], di[2], di[3]));
        } else {
            for (int64_t j = 0; j < g; j++) {
                unravel(e0 + j, d.ne, di);
                store_f32(d.type, elem_addr(d, di[0], di[1], di[2], di[3]), x[j]);
            }
        }
    }
}

/* ---- dispatch ------------------------------------------------------------- */

static bool host_is_quant(enum bt_type t) { return t == BT_TYPE_Q8_0 || t == BT_TYPE_Q4_0; }

static int row_threads(int64_t n0) {
    int t = 32;
    while (t < ROW_THREADS && t < n0) t *= 2;
    return t;
}

extern "C" enum bt_status bt_cuda_compute_op(struct bt_cuda_ctx *c, struct bt_tensor *node, int node_index) {
    cudaStream_t st = c->stream;
    const int64_t n = bt_nelements(node);
    if (n == 0) return BT_OK;
    const int64_t nrows = bt_nrows(node);
    const t4 d = t4_of(node);
    const struct bt_tensor *a = node->src[0], *b = node->src[1], *x = node->src[2];
    const int tag = node_index + 1;
    switch (bt_op_elementwise(node->op)) {
        case BT_ELEMENTWISE_BINARY:
            k_binary<<<grid_for(n), CUDA_THREADS, 0, st>>>((int)node->op, d, t4_of(a), t4_of(b), n);
            return bt_cuda_check(c, cudaGetLastError(), bt_op_name(node->op));
        case BT_ELEMENTWISE_UNARY: {
            const float s = node->op == BT_OP_SCALE ? bt_get_op_param_f32(node, 0) : 0.0f;
            k_unary<<<grid_for(n), CUDA_THREADS, 0, st>>>((int)node->op, s, d, t4_of(a), n);
            return bt_cuda_check(c, cudaGetLastError(), bt_op_name(node->op));
        }
        case BT_ELEMENTWISE_GLU:
        {
            const int oai = node->op == BT_OP_SWIGLU_OAI;
            k_swiglu<<<grid_for(n), CUDA_THREADS, 0, st>>>(d, t4_of(a), t4_of(b), n, oai,
                                                         oai ? bt_get_op_param_f32(node, 0) : 0.0f,
                                                         oai ? bt_get_op_param_f32(node, 1) : 0.0f);
        }
            return bt_cuda_check(c, cudaGetLastError(), bt_op_name(node->op));
        case BT_ELEMENTWISE_NONE: break;
    }
    switch (node->op) {
        case BT_OP_SUM_ROWS:
        case BT_OP_MEAN:
            k_sum_rows<<<(unsigned)nrows, row_threads(a->ne[0]), 0, st>>>((int)node->op, d, t4_of(a));
            break;
        case BT_OP_RMS_NORM:
        case BT_OP_NORM:
            k_norm<<<(unsigned)nrows, row_threads(a->ne[0]), 0, st>>>((int)node->op, bt_get_op_param_f32(node, 0), d,
                                                                   t4_of(a));
            break;
        case BT_OP_SOFT_MAX:
            k_soft_max<<<(unsigned)nrows, row_threads(a->ne[0]), 0, st>>>(bt_get_op_param_f32(node, 0), d, t4_of(a),
                                                                       b ? t4_of(b) : d, b != NULL);
            break;
        case BT_OP_ROPE: {
            const int n_dims = bt_get_op_param_i32(node, 0);
            const int64_t items = nrows * (n_dims / 2 + (a->ne[0] - n_dims));
            rope_yarn_args y = {bt_get_op_param_f32(node, 4), bt_get_op_param_f32(node, 5), {0.0f, 0.0f}};
            if (y.ext_factor != 0.0f)
                bt_rope_yarn_corr_dims(n_dims, bt_get_op_param_i32(node, 8), bt_get_op_param_f32(node, 2),
                                       bt_get_op_param_f32(node, 6), bt_get_op_param_f32(node, 7), y.corr);
            k_rope<<<grid_for(items), CUDA_THREADS, 0, st>>>(d, t4_of(a), t4_of(b), n_dims,
                                                             bt_get_op_param_i32(node, 1) == BT_ROPE_NEOX,
                                                             bt_get_op_param_f32(node, 2),
                                                             bt_get_op_param_f32(node, 3), y, items);
            break;
        }
        case BT_OP_ARGSORT: {
            const int threads = a->ne[0] >= 1024 ? 1024 : (int)((a->ne[0] + 31) / 32 * 32);
            k_argsort<<<(unsigned)nrows, threads, (size_t)a->ne[0] * sizeof(float), st>>>(
                d, t4_of(a), bt_get_op_param_i32(node, 0) == BT_SORT_DESC);
            break;
        }
        case BT_OP_CONCAT: {
            const int64_t bl = bt_blck_size(node->type);
            k_concat<<<grid_for(n / bl), CUDA_THREADS, 0, st>>>(d, t4_of(a), t4_of(b), bt_get_op_param_i32(node, 0),
                                                                (int64_t)bt_type_size(node->type), n / bl);
            break;
        }
        case BT_OP_GET_ROWS:
            c->ids_checked = true;
            k_get_rows<<<grid_for(n), CUDA_THREADS, 0, st>>>(d, t4_of(a), t4_of(b), c->d_err, tag, n);
            break;
        case BT_OP_SET_ROWS:
            c->ids_checked = true;
            if (bt_nrows(b) > 0)
                k_set_rows<<<(unsigned)bt_nrows(b), ROW_THREADS, 0, st>>>(d, t4_of(b), t4_of(x), c->d_err,
                                                                                   tag);
            break;
        case BT_OP_CPY:
        case BT_OP_CONT: {
            const int64_t g = host_is_quant(a->type) || host_is_quant(node->type) ? BT_QK : 1;
            const int64_t ts = a->type == node->type ? (int64_t)bt_type_size(a->type) : 0;
            k_cpy<<<grid_for(n / g), CUDA_THREADS, 0, st>>>(d, t4_of(a), g, ts, n / g);
            break;
        }
        case BT_OP_MOE_SUM:
            k_moe_sum<<<grid_for(n), CUDA_THREADS, 0, st>>>(d, t4_of(a), t4_of(b), n);
            break;
        case BT_OP_FLASH_ATTN: return bt_cuda_flash_attn(c, node);
        case BT_OP_MUL_MAT: return bt_cuda_mul_mat(c, node);
        case BT_OP_MUL_MAT_ID: return bt_cuda_mul_mat_id(c, node);
        default:
            return bt_cuda_fail(c, BT_ERR_UNSUPPORTED, "node '%s': op %s has no CUDA kernel", node->name,
                                bt_op_name(node->op));
    }
    return bt_cuda_check(c, cudaGetLastError(), bt_op_name(node->op));
}
