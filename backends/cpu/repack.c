/* repack.c - the CPU's repacked weights (cpu.h): which tensors can be
 * repacked, the repack at load and its inverse, group by group in the one
 * layout of qtypes.h (each type's entry says where its scale and payload
 * sit: quant_i8.c for the 32-element types, quant_dot.c for Q4_K and
 * Q6_K; BF16's is here).  matmul.c reads them (rgemm); cpu.c and the
 * core assert that nothing else does. */
#include "baton/cpu.h"
#include "qtypes.h"

#include <string.h>

#if BT_CPU_BF16_REPACK
static const struct bt_cpu_rp_layout rp_bf16 = {0, 0, BT_CPU_BF16_RP_BLK / 2, 0u, 0, false, BT_CPU_BF16_RP_BLK, NULL, NULL};
#endif

/* the layout of type t where this build has the kernels that read it */
const struct bt_cpu_rp_layout *bt_cpu_rp_layout_of(enum bt_type t) {
#if BT_CPU_BF16_REPACK
    if (t == BT_TYPE_BF16) return &rp_bf16;
#endif
    const struct bt_cpu_qtype *qt = bt_cpu_qtype_of(t);
    return qt && qt->rgemm ? qt->rp : NULL;
}

/* 16 consecutive plain rows (k elements each) -> one group */
static void rp_repack_group(enum bt_type t, int64_t k, const void *rows, void *group) {
    const struct bt_cpu_rp_layout *L = bt_cpu_rp_layout_of(t);
    const int64_t blk = bt_cpu_rp_blk(L, t), nblk = k / blk;
    const size_t bs = bt_row_size(t, blk), rb = bt_row_size(t, k);
    BT_ASSERT(bs == (size_t)L->ds + 4 * (size_t)L->n_dw && 4 * L->n_dw <= BT_CPU_RP_PAYLOAD_MAX);
    for (int64_t b = 0; b < nblk; b++) {
        size_t dof, vof;
        bt_cpu_rp_offsets(nblk, b, bs, (size_t)L->ds, &dof, &vof);
        for (int r = 0; r < BT_CPU_PANEL_ROWS; r++) {
            const uint8_t *src = (const uint8_t *)rows + (size_t)r * rb + (size_t)b * bs;
            memcpy((uint8_t *)group + dof + (size_t)L->ds * (size_t)r, src + L->d_pos, (size_t)L->ds);
            uint8_t pay[BT_CPU_RP_PAYLOAD_MAX];
            const uint8_t *q = src + L->q_pos;
            if (L->enc) {
                L->enc(q, pay);
                q = pay;
            }
            for (int u = 0; u < L->n_dw; u++) {
                uint32_t x;
                memcpy(&x, q + 4 * u, 4);
                x ^= L->xr;
                if (u == 0 && L->qh0) x = bt_cpu_qh_order(x);
                memcpy((uint8_t *)group + vof + (size_t)u * 64 + (size_t)r * 4, &x, 4);
            }
        }
    }
}

void bt_cpu_rp_unpack_row(enum bt_type t, int64_t k, const void *group, int r, void *row) {
    const struct bt_cpu_rp_layout *L = bt_cpu_rp_layout_of(t);
    const int64_t blk = bt_cpu_rp_blk(L, t), nblk = k / blk;
    const size_t bs = bt_row_size(t, blk);
    for (int64_t b = 0; b < nblk; b++) bt_cpu_rp_unpack_block(L, nblk, b, bs, group, r, (uint8_t *)row + (size_t)b * bs);
}

bool bt_cpu_weight_repack_available(enum bt_type t) { return bt_cpu_rp_layout_of(t) != NULL; }

bool bt_cpu_weight_repackable(const struct bt_tensor *t) {
    const struct bt_cpu_rp_layout *L = bt_cpu_rp_layout_of(t->type);
    return L && !t->view_src && t->ne[1] > 0 && t->ne[1] % BT_CPU_PANEL_ROWS == 0 &&
           t->ne[0] % bt_cpu_rp_blk(L, t->type) == 0 && bt_is_contiguous(t);
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
    int64_t ng;
    const size_t gb = group_bytes(t, &ng);
    for (int64_t g = 0; g < ng; g++)
        rp_repack_group(t->type, t->ne[0], (const char *)plain + (size_t)g * gb, (char *)t->data + (size_t)g * gb);
    t->flags |= BT_TENSOR_FLAG_REPACKED;
}

void bt_cpu_weight_unpack(const struct bt_tensor *t, void *plain) {
    BT_ASSERT((t->flags & BT_TENSOR_FLAG_REPACKED) && t->data);
    int64_t ng;
    const size_t gb = group_bytes(t, &ng);
    for (int64_t g = 0; g < ng; g++)
        for (int r = 0; r < BT_CPU_PANEL_ROWS; r++)
            bt_cpu_rp_unpack_row(t->type, t->ne[0], (const char *)t->data + (size_t)g * gb,
                           r, (char *)plain + (size_t)g * gb + (size_t)r * t->nb[1]);
}
