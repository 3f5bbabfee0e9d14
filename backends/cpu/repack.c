/* repack.c - the CPU's repacked weights (cpu.h): which tensors can be
 * repacked, the repack at load and its inverse, group by group with the
 * type's layout (qtypes.h's repack / unpack_row; quant_i8.c for Q8_0 and
 * Q4_0).  matmul.c reads them (rgemm); cpu.c and the core assert that
 * nothing else does. */
#include "cpu.h"
#include "qtypes.h"


bool bt_cpu_weight_repack_available(enum bt_type t) {
    const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(t);
    return qt && qt->repack && qt->rgemm;
}

bool bt_cpu_weight_repackable(const struct bt_tensor *t) {
    return bt_cpu_weight_repack_available(t->type) && !t->view_src && t->ne[1] > 0 && t->ne[1] % BT_CPU_PANEL_ROWS == 0 &&
           bt_is_contiguous(t);
}

bool bt_cpu_weight_is_repacked(const struct bt_tensor *t) {
    return (t->flags & BT_TENSOR_FLAG_REPACKED) || (t->view_src && (t->view_src->flags & BT_TENSOR_FLAG_REPACKED));
}

/* bytes of one group of 16 rows, and the number of groups */
static size_t group_bytes(const struct bt_tensor *t, int64_t *n_groups) {
    *n_groups = t->ne[1] / BT_CPU_PANEL_ROWS * t->ne[2] * t->ne[3];
    return (size_t)BT_CPU_PANEL_ROWS * t->nb[1];
}

void bt_cpu_weight_repack(struct bt_tensor *t, const void *plain) {
    BT_ASSERT(bt_cpu_weight_repackable(t) && t->data && !(t->flags & BT_TENSOR_FLAG_REPACKED));
    const size_t n = bt_nbytes(t);
    BT_ASSERT((const char *)plain + n <= (const char *)t->data || (const char *)t->data + n <= (const char *)plain);
    const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(t->type);
    int64_t ng;
    const size_t gb = group_bytes(t, &ng);
    for (int64_t g = 0; g < ng; g++)
        qt->repack(t->ne[0], (const char *)plain + (size_t)g * gb, (char *)t->data + (size_t)g * gb);
    t->flags |= BT_TENSOR_FLAG_REPACKED;
}

void bt_cpu_weight_unpack(const struct bt_tensor *t, void *plain) {
    BT_ASSERT((t->flags & BT_TENSOR_FLAG_REPACKED) && t->data);
    const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(t->type);
    int64_t ng;
    const size_t gb = group_bytes(t, &ng);
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < BT_CPU_PANEL_ROWS; r++)
            qt->unpack_row(t->ne[0], (const char *)t->data + (size_t)g * gb,
                           r, (char *)plain + (size_t)g * gb + (size_t)r * t->nb[1]);
}
