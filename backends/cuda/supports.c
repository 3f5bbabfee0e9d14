/* supports.c - which nodes the CUDA backend computes: the CPU's rules
 * (backends/cpu/ops_cpu.c, matmul.c) for types, shapes and layouts, plus the
 * GPU's own limits (ARGSORT rows in shared memory, cuBLAS's int sizes). */
#include <limits.h>

#include "cuda_impl.h"

static bool is_quant(enum bt_type t) { return t == BT_TYPE_Q8_0 || t == BT_TYPE_Q4_0; }
static bool is_f32(const struct bt_tensor *t) { return t && t->type == BT_TYPE_F32; }
static bool is_i32(const struct bt_tensor *t) { return t && t->type == BT_TYPE_I32; }

/* A tensor of a block type must have packed whole blocks along dim 0. */
static bool layout_ok(const struct bt_tensor *t) {
    if (!t || (int)t->type < 0 || t->type >= BT_TYPE_COUNT) return false;
    if (is_quant(t->type)) return t->nb[0] == bt_type_size(t->type) && t->ne[0] % BT_QK == 0;
    return true;
}

static bool same_shape(const struct bt_tensor *a, const struct bt_tensor *b) {
    for (int i = 0; i < BT_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

/* The CPU's three CPY paths (rows, flat, element by element); the GPU kernel
 * copies groups of 32 elements when a block type is involved, which the row
 * and flat paths keep aligned (CPY_CHUNK on the CPU is 1024). */
static bool cpy_supported(const struct bt_tensor *s, const struct bt_tensor *d) {
    if (!layout_ok(s) || !layout_ok(d)) return false;
    if (bt_nelements(s) != bt_nelements(d)) return false;
    if (s->ne[0] == d->ne[0]) return true;
    if (bt_is_contiguous(s) && bt_is_contiguous(d)) return true;
    return !is_quant(s->type) && !is_quant(d->type);
}

static bool mul_mat_supported(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0], *b = node->src[1];
    if (!a || !b || node->type != BT_TYPE_F32 || node->nb[0] != sizeof(float)) return false;
    if (node->nb[1] % sizeof(float) != 0) return false;
    switch (a->type) {
        case BT_TYPE_F32:
        case BT_TYPE_F16:
        case BT_TYPE_BF16:
        case BT_TYPE_Q8_0:
        case BT_TYPE_Q4_0:
            break;
        default:
            return false;
    }
    if (a->nb[0] != bt_type_size(a->type) || a->nb[1] % bt_type_size(a->type) != 0) return false;
    if (b->type != BT_TYPE_F32 || b->nb[0] != sizeof(float) || b->nb[1] % sizeof(float) != 0) return false;
    if (a->ne[0] != b->ne[0] || a->ne[0] % bt_blck_size(a->type) != 0) return false;
    /* cuBLAS takes int sizes and leading dimensions */
    if (a->ne[0] > INT_MAX || a->ne[1] > INT_MAX || b->ne[1] > INT_MAX) return false;
    if (a->nb[1] / bt_type_size(a->type) > INT_MAX || b->nb[1] / 4 > INT_MAX || node->nb[1] / 4 > INT_MAX)
        return false;
    if (node->op == BT_OP_MUL_MAT) {
        return a->ne[2] > 0 && a->ne[3] > 0 && b->ne[2] % a->ne[2] == 0 && b->ne[3] % a->ne[3] == 0 &&
               node->ne[0] == a->ne[1] && node->ne[1] == b->ne[1] && node->ne[2] == b->ne[2] &&
               node->ne[3] == b->ne[3];
    }
    const struct bt_tensor *ids = node->src[2];
    if (!ids || ids->type != BT_TYPE_I32) return false;
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];
    return a->ne[3] == 1 && b->ne[3] == 1 && b->ne[2] == n_tokens && (b->ne[1] == 1 || b->ne[1] == n_used) &&
           node->ne[0] == a->ne[1] && node->ne[1] == n_used && node->ne[2] == n_tokens &&
           n_used * n_tokens < INT32_MAX && a->ne[2] < INT32_MAX;
}

bool bt_cuda_op_supported(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0], *b = node->src[1], *c = node->src[2];
    switch (node->op) {
        case BT_OP_NONE:
        case BT_OP_VIEW:
        case BT_OP_RESHAPE:
        case BT_OP_PERMUTE:
        case BT_OP_TRANSPOSE:
            return true;
        case BT_OP_ADD:
        case BT_OP_SUB:
        case BT_OP_MUL:
        case BT_OP_DIV:
            if (!is_f32(node) || !is_f32(a) || !is_f32(b) || !same_shape(node, a)) return false;
            for (int i = 0; i < BT_MAX_DIMS; i++)
                if (b->ne[i] <= 0 || a->ne[i] % b->ne[i] != 0) return false;
            return true;
        case BT_OP_SCALE:
        case BT_OP_SQR:
        case BT_OP_SQRT:
        case BT_OP_SILU:
        case BT_OP_GELU:
        case BT_OP_RELU:
        case BT_OP_SIGMOID:
        case BT_OP_RMS_NORM:
        case BT_OP_NORM:
            return is_f32(node) && is_f32(a) && same_shape(node, a);
        case BT_OP_SWIGLU:
            return is_f32(node) && is_f32(a) && is_f32(b) && same_shape(node, a) && same_shape(a, b);
        case BT_OP_SUM_ROWS:
        case BT_OP_MEAN:
            return is_f32(node) && is_f32(a) && node->ne[0] == 1 && node->ne[1] == a->ne[1] &&
                   node->ne[2] == a->ne[2] && node->ne[3] == a->ne[3] && bt_nrows(node) <= INT_MAX;
        case BT_OP_SOFT_MAX:
            if (!is_f32(node) || !is_f32(a) || !same_shape(node, a) || bt_nrows(node) > INT_MAX) return false;
            if (b) {
                if (!is_f32(b) || b->ne[0] != a->ne[0] || b->ne[1] < a->ne[1]) return false;
                if (b->ne[2] <= 0 || b->ne[3] <= 0 || a->ne[2] % b->ne[2] || a->ne[3] % b->ne[3]) return false;
            }
            return true;
        case BT_OP_ROPE: {
            const int n_dims = bt_get_op_param_i32(node, 0);
            const int mode = bt_get_op_param_i32(node, 1);
            return is_f32(node) && is_f32(a) && is_i32(b) && same_shape(node, a) && b->ne[0] >= a->ne[2] &&
                   n_dims > 0 && n_dims % 2 == 0 && n_dims <= a->ne[0] &&
                   (mode == BT_ROPE_NORMAL || mode == BT_ROPE_NEOX);
        }
        case BT_OP_ARGSORT:
            return is_i32(node) && is_f32(a) && same_shape(node, a) && a->ne[0] <= BT_CUDA_ARGSORT_MAX &&
                   bt_nrows(node) <= INT_MAX;
        case BT_OP_CONCAT: {
            const int dim = bt_get_op_param_i32(node, 0);
            if (!a || !b || dim < 0 || dim >= BT_MAX_DIMS) return false;
            if (a->type != node->type || b->type != node->type || !layout_ok(a) || !layout_ok(b) ||
                !layout_ok(node))
                return false;
            if (is_quant(node->type) && dim == 0) return false;
            for (int i = 0; i < BT_MAX_DIMS; i++) {
                if (i == dim) {
                    if (node->ne[i] != a->ne[i] + b->ne[i]) return false;
                } else if (a->ne[i] != node->ne[i] || b->ne[i] != node->ne[i]) {
                    return false;
                }
            }
            return true;
        }
        case BT_OP_GET_ROWS:
            if (!layout_ok(a) || !is_i32(b)) return false;
            if (node->type != (a->type == BT_TYPE_I32 ? BT_TYPE_I32 : BT_TYPE_F32)) return false;
            return node->ne[0] == a->ne[0] && node->ne[1] == b->ne[0] && node->ne[2] == b->ne[1] &&
                   node->ne[3] == b->ne[2] && a->ne[2] == node->ne[2] && a->ne[3] == node->ne[3];
        case BT_OP_SET_ROWS:
            if (!a || !is_f32(b) || !is_i32(c) || !layout_ok(node)) return false;
            switch (node->type) {
                case BT_TYPE_F32:
                case BT_TYPE_F16:
                case BT_TYPE_BF16:
                case BT_TYPE_Q8_0:
                case BT_TYPE_Q4_0:
                    break;
                default:
                    return false;
            }
            return b->ne[0] == node->ne[0] && c->ne[0] == b->ne[1] && c->ne[1] == b->ne[2] &&
                   c->ne[2] == b->ne[3] && b->ne[2] == node->ne[2] && b->ne[3] == node->ne[3] &&
                   bt_nrows(b) <= INT_MAX;
        case BT_OP_CPY:
            return a && cpy_supported(a, node);
        case BT_OP_CONT:
            return a && a->type == node->type && cpy_supported(a, node);
        case BT_OP_MUL_MAT:
        case BT_OP_MUL_MAT_ID:
            return mul_mat_supported(node);
        default:
            return false;
    }
}
