/* supports.c - which nodes the CUDA backend computes: the well-formed ones
 * (bt_op_is_well_formed, src/ops.c) within the GPU's own limits: one block
 * per row (grid x <= INT_MAX), ARGSORT rows in shared memory, FLASH_ATTN's
 * head size (BT_CUDA_ATTN_MAX_D), cuBLAS's int
 * sizes, the CPY kernel's copy paths, and the types its kernels know. */
#include <limits.h>

#include "cuda_impl.h"

static bool is_quant(enum bt_type t) { return t == BT_TYPE_Q8_0 || t == BT_TYPE_Q4_0; }

/* The kernel copies groups of 32 elements when a block type is involved: the
 * row and flat paths keep them aligned; element-by-element takes plain types
 * only (the CPU also scatters from or gathers into a block type). */
static bool cpy_path_exists(const struct bt_tensor *s, const struct bt_tensor *d) {
    if (s->ne[0] == d->ne[0]) return true;
    if (bt_is_contiguous(s) && bt_is_contiguous(d)) return true;
    return !is_quant(s->type) && !is_quant(d->type);
}

/* cuBLAS takes int sizes and leading dimensions, counted in elements, so
 * row strides must be whole elements. */
static bool cublas_sizes_ok(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0], *b = node->src[1];
    const size_t ta = bt_type_size(a->type);
    if (a->nb[1] % ta != 0 || b->nb[1] % sizeof(float) != 0 || node->nb[1] % sizeof(float) != 0)
        return false;
    if (a->ne[0] > INT_MAX || a->ne[1] > INT_MAX || b->ne[1] > INT_MAX) return false;
    return a->nb[1] / ta <= INT_MAX && b->nb[1] / 4 <= INT_MAX && node->nb[1] / 4 <= INT_MAX;
}

/* The block types the kernels only read (cuda_common.cuh's d_block_get, as
 * quants.c dequantises): weights, as MUL_MAT's / MUL_MAT_ID's matrix or
 * GET_ROWS' table, nothing else.  Q8_K (activations of the CPU's K-quant dot
 * products) has no CUDA kernel at all. */
static bool read_only_block(enum bt_type t) {
    return bt_type_traits(t)->is_quantized && !is_quant(t) && t != BT_TYPE_Q8_K;
}

static bool read_only_use_ok(const struct bt_tensor *node, int src) {
    if (node->op == BT_OP_NONE || bt_op_is_view(node->op)) return true;
    return src == 0 && (node->op == BT_OP_MUL_MAT || node->op == BT_OP_MUL_MAT_ID || node->op == BT_OP_GET_ROWS);
}

/* The CUDA kernels know F32, F16, BF16, I32, the block types Q8_0 and Q4_0
 * everywhere, and the read-only block types as above. */
bool bt_cuda_op_supported(const struct bt_tensor *node) {
    if (!bt_op_is_well_formed(node)) return false;
    if (node->type == BT_TYPE_Q8_K || (read_only_block(node->type) && !read_only_use_ok(node, -1))) return false;
    for (int i = 0; i < BT_MAX_SRC; i++) {
        const struct bt_tensor *s = node->src[i];
        if (s && (s->type == BT_TYPE_Q8_K || (read_only_block(s->type) && !read_only_use_ok(node, i)))) return false;
    }
    const struct bt_tensor *a = node->src[0], *b = node->src[1];
    switch (node->op) {
        case BT_OP_SUM_ROWS:
        case BT_OP_MEAN:
        case BT_OP_RMS_NORM:
        case BT_OP_NORM:
        case BT_OP_SOFT_MAX:
            return bt_nrows(node) <= INT_MAX;
        case BT_OP_ARGSORT:
            return a->ne[0] <= BT_CUDA_ARGSORT_MAX && bt_nrows(node) <= INT_MAX;
        case BT_OP_SET_ROWS:
            return bt_nrows(b) <= INT_MAX;
        case BT_OP_CPY:
        case BT_OP_CONT:
            return cpy_path_exists(a, node);
        case BT_OP_MUL_MAT:
        case BT_OP_MUL_MAT_ID:
            return cublas_sizes_ok(node);
        case BT_OP_FLASH_ATTN:
            /* attn.cu: head sizes within the registers of a warp, one warp
             * per (head, query row) in a grid of int blocks */
            return a->ne[0] <= BT_CUDA_ATTN_MAX_D && node->ne[0] <= BT_CUDA_ATTN_MAX_D &&
                   bt_nrows(node) / 4 < INT_MAX;
        default:
            return true;
    }
}
