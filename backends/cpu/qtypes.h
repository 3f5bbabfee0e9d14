/* qtypes.h - the CPU matmul's table of quantised weight types: for each, how
 * activation columns are quantised and how a weight row is dotted with one.
 * matmul.c runs every MUL_MAT / MUL_MAT_ID with quantised weights through
 * this table; qtypes.c holds the table itself.  Internal to backends/cpu.
 *
 * How matmul.c uses an entry (so a new type gets batch invariance and thread
 * invariance without doing anything for it):
 *
 *  1. Every activation column of b (each [k] column of every batch, for
 *     MUL_MAT_ID each (slot, token) column of b, shared by all the experts
 *     that read it) is quantised exactly once per node by quantize_act into
 *     act_size(k) bytes of the work buffer, on every path and for every batch
 *     size: a decode step and a 512-token prompt quantise a column the same
 *     way.  quantize_act must depend on x only (not on the column's
 *     neighbours, its position or the thread).
 *  2. Every output element d[i, j] is vec_dot(k, &d, weight row i, act
 *     column j), or the element (r, c) of a tile covering it.  A tile is an
 *     optimisation and must give, for each of its elements, the same bits as
 *     vec_dot on that row and column (the same per-element accumulation
 *     order; typically one template instantiated for 1x1 and the tile
 *     shapes).  matmul.c picks tiles by the number of columns left and may
 *     pass a row or a column twice to fill a tile (extra outputs discarded).
 *  3. Threads split output rows, never a dot's k reduction.
 *
 * So the result of a column never depends on the batch, on its position, on
 * the other columns, on the expert grouping or on the thread count.
 *
 * Adding a type: write quantize_act, act_size, vec_dot (and tiles if they
 * pay) in your own file (e.g. quant_dot.c), define a
 * `const struct bt_cpu_qtype bt_cpu_qtype_<name>` there, declare it below and
 * add one line to the table in qtypes.c.  Activation formats may be shared
 * between weight types (e.g. every K-quant dots against Q8_K columns: 256
 * values as int8 with one float scale and the sums of each 16 values, as
 * ggml's block_q8_K); the byte layout of an activation column is private to
 * the entry's functions: matmul.c only passes pointers to act_size(k) bytes
 * (aligned to BT_MEM_ALIGN).  k is always a multiple of the weight type's
 * block size (bt_blck_size). */
#ifndef BATON_CPU_QTYPES_H
#define BATON_CPU_QTYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "baton/tensor.h"

/* one activation column x[k] -> y (act_size(k) bytes) */
typedef void (*bt_cpu_quantize_act_fn)(const float *x, void *y, int64_t k);
/* *s = dot(weight row w_row, activation column act) over k */
typedef void (*bt_cpu_vec_dot_fn)(int64_t k, float *s, const void *w_row, const void *act);
/* out[c * rm + r] = dot(w_rows[r], acts[c]) for r < rm, c < rn (the tile's
 * shape); next_rows: the rm rows the next call will likely read, a prefetch
 * hint that may be NULL or ignored */
typedef void (*bt_cpu_tile_fn)(int64_t k, const void *const *w_rows, const void *const *acts,
                               const void *const *next_rows, float *out);

#define BT_CPU_QTILES 4 /* tile shapes an entry may offer */
#define BT_CPU_TILE_MAX 16 /* largest rm and rn a tile may have */

struct bt_cpu_qtile {
    int rm, rn; /* weight rows x activation columns; rm, rn <= BT_CPU_TILE_MAX */
    bt_cpu_tile_fn fn;
};

/* Optional packed GEMM for products with many columns (prompt): matmul.c
 * packs BT_CPU_PANEL_ROWS weight rows (the last repeated where fewer are
 * left) into panel_size(k) bytes of the thread's work buffer (64-byte
 * aligned) once, then calls gemm for all the job's columns; gemm writes
 * dcols[j][row0 + i] for i < nrows, j < ncols, each element the bits of
 * vec_dot on that row and column. */
#define BT_CPU_PANEL_ROWS 16
typedef void (*bt_cpu_qpack_fn)(int64_t k, const void *const *w_rows, void *panel);
typedef void (*bt_cpu_qgemm_fn)(int64_t k, const void *panel, const void *const *acts, int64_t ncols,
                                float *const *dcols, int64_t row0, int nrows);

/* Optional repacked weights (repack.c: bt_cpu_weight_repack, at load): a
 * group of BT_CPU_PANEL_ROWS consecutive rows rearranged in the bytes they
 * occupy (so offsets, sizes and expert slices do not change) for rgemm,
 * which computes the group's 16 rows for every column, each element the
 * bits of vec_dot on the plain row (next: the group the caller goes to
 * next, a prefetch hint, may be NULL).
 *
 * One layout for every type that has one.  A block of bs = ds + 4 n_dw
 * bytes is a scale of ds (2 or 4) bytes (its fp16 scales: Q8_0, Q4_0 d;
 * Q4_K d and dmin) at byte d_pos, and n_dw payload dwords (from byte
 * q_pos).  A group, per pair of blocks b, b+1 (b even), at
 * (b / 2) * 32 * bs:
 *   32 ds bytes       the 16 rows' scale of block b, then of block b+1
 *   n_dw * 64 bytes   block b: vector u, lane r (4 bytes) = payload dword u
 *                     of row r, xor xr
 *   n_dw * 64 bytes   block b+1, the same
 * and an odd nblk's last block: its 16 ds bytes of scales, then its
 * vectors.  With an even nblk (or ds 4) and a 64-byte aligned tensor every
 * vector is aligned (ds 1: at 32 bytes, a pair's 544 bytes).  The lanes
 * are what vpdpbusd takes, a row per lane: a decode reads the 16 rows with
 * no transposition.  Q5_0's and Q5_1's payload dword 0, the block's 32
 * fifth bits, is kept in the order bt_cpu_qh_order gives (a shift and a
 * mask put the bits of 4 elements in place), dwords 1..4 the nibbles as
 * Q4_0's.  Q6_K's payload is rearranged (enc, quant_dot.c): a byte holds
 * one whole 6-bit value and a third of another. */
struct bt_cpu_rp_layout {
    int d_pos, q_pos, n_dw;
    uint32_t xr; /* Q8_0: 0x80808080 (unsigned bytes), else 0 */
    int ds;      /* bytes of a block's scale: 0 (BF16), 1 (MXFP4's E8M0), 2 or 4 */
    bool qh0;    /* payload dword 0: Q5_0's or Q5_1's fifth bits, in bt_cpu_qh_order */
    int blk;     /* elements of a block: 0 for the type's own block; BF16: 16 (8 pairs) */
    /* optional: a row's payload (4 n_dw bytes from q_pos) rearranged before
     * it is cut into dwords (enc), and back (dec); NULL: as it lies */
    void (*enc)(const uint8_t *plain, uint8_t *payload);
    void (*dec)(const uint8_t *payload, uint8_t *plain);
};
#define BT_CPU_RP_PAYLOAD_MAX 256 /* bytes of the largest payload (Q6_K's 208) */

/* BF16 weights have a layout too where this build's BF16 kernels read it
 * (AVX2 without AVX-512: matmul.c's dot path otherwise transposes 8 rows x
 * 8 pairs in registers per step): blocks of 16 elements, no scale, the 8
 * payload dwords the element pairs, so that pair q of row r of a group sits
 * at dword 16 q + r.  Rows whose length is not a multiple of 16 stay plain. */
#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define BT_CPU_BF16_REPACK 1
#else
#define BT_CPU_BF16_REPACK 0
#endif
#define BT_CPU_BF16_RP_BLK 16

/* the layout of weight type t (NULL: none) and its block's elements */
const struct bt_cpu_rp_layout *bt_cpu_rp_layout_of(enum bt_type t);
static inline int64_t bt_cpu_rp_blk(const struct bt_cpu_rp_layout *L, enum bt_type t) {
    return L->blk ? L->blk : bt_blck_size(t);
}

/* a Q5 block's fifth bits qh (bit j: element j) reordered: byte i of the
 * result holds, in bits 0..3, the bits of elements i, 4 + i, 8 + i, 12 + i,
 * in bits 4..7 those of 16 + i, 20 + i, 24 + i, 28 + i; so that for the
 * 4-element groups 4v + i (v = 0..3) a left shift by 4 - v, and for
 * 16 + 4v + i a right shift by v, puts each element's bit at bit 4 of
 * byte i */
static inline uint32_t bt_cpu_qh_order(uint32_t qh) {
    uint32_t p = 0;
    for (int j = 0; j < 32; j++)
        if (qh >> j & 1) p |= 1u << (8 * (j & 3) + 4 * (j >> 4) + ((j & 15) >> 2));
    return p;
}
/* its inverse */
static inline uint32_t bt_cpu_qh_plain(uint32_t p) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; j++)
        if (p >> (8 * (j & 3) + 4 * (j >> 4) + ((j & 15) >> 2)) & 1) qh |= 1u << j;
    return qh;
}
typedef void (*bt_cpu_rgemm_fn)(int64_t k, const void *group, const void *next, const void *const *acts,
                                int64_t ncols, float *const *dcols, int64_t row0);

/* offsets in a group of block b's 16 scales and of its vectors (bs: the
 * block's bytes, ds: its scale's) */
static inline void bt_cpu_rp_offsets(int64_t nblk, int64_t b, size_t bs, size_t ds, size_t *d_off, size_t *v_off) {
    const size_t base = (size_t)(b / 2) * 2 * BT_CPU_PANEL_ROWS * bs, vb = BT_CPU_PANEL_ROWS * (bs - ds);
    const size_t dv = BT_CPU_PANEL_ROWS * ds; /* one block's scales */
    if (b % 2 == 1) {
        *d_off = base + dv;
        *v_off = base + 2 * dv + vb;
    } else {
        *d_off = base;
        *v_off = base + (b + 1 < nblk ? 2 * dv : dv);
    }
}
/* plain row r (< 16) of a group of weights of type t (the type's layout) */
void bt_cpu_rp_unpack_row(enum bt_type t, int64_t k, const void *group, int r, void *row);
/* the plain bytes of block b (of nblk, bs bytes each) of row r of a group in
 * layout L */
static inline void bt_cpu_rp_unpack_block(const struct bt_cpu_rp_layout *L, int64_t nblk, int64_t b, size_t bs,
                                          const void *group, int r, void *blk) {
    size_t dof, vof;
    bt_cpu_rp_offsets(nblk, b, bs, (size_t)L->ds, &dof, &vof);
    memcpy((uint8_t *)blk + L->d_pos, (const uint8_t *)group + dof + (size_t)L->ds * (size_t)r, (size_t)L->ds);
    uint8_t pay[BT_CPU_RP_PAYLOAD_MAX];
    uint8_t *q = L->dec ? pay : (uint8_t *)blk + L->q_pos;
    for (int u = 0; u < L->n_dw; u++) {
        uint32_t x;
        memcpy(&x, (const uint8_t *)group + vof + (size_t)u * 64 + (size_t)r * 4, 4);
        x ^= L->xr;
        if (u == 0 && L->qh0) x = bt_cpu_qh_plain(x);
        memcpy(q + 4 * u, &x, 4);
    }
    if (L->dec) L->dec(pay, (uint8_t *)blk + L->q_pos);
}
/* plain row i of a repacked matrix of type t whose rows (k elements, nb1
 * bytes apart) start at rows: the row unpacked from its group */
static inline void bt_cpu_rp_row(enum bt_type t, int64_t k, const char *rows, size_t nb1, int64_t i, void *row) {
    bt_cpu_rp_unpack_row(t, k, rows + (size_t)(i / BT_CPU_PANEL_ROWS * BT_CPU_PANEL_ROWS) * nb1,
                         (int)(i % BT_CPU_PANEL_ROWS), row);
}

struct bt_cpu_qtype {
    const char *act_name;                 /* the activation format, for messages */
    size_t (*act_size)(int64_t k);        /* bytes of one quantised column */
    bt_cpu_quantize_act_fn quantize_act;
    bt_cpu_vec_dot_fn vec_dot;
    /* optional tiles, unused entries {0}.  matmul.c takes, for each group of
     * columns, the tile with the most columns not above the columns left
     * (among those, the most rows), else vec_dot */
    struct bt_cpu_qtile tiles[BT_CPU_QTILES];
    /* optional packed GEMM (all NULL / 0 when the type has none): jobs with
     * at least gemm_min_cols columns take it */
    int gemm_min_cols;
    size_t (*panel_size)(int64_t k);
    bt_cpu_qpack_fn pack;
    bt_cpu_qgemm_fn gemm;
    /* optional repacked weights: rp where the type has the layout, rgemm
     * where this build has its kernels (weights are repacked only then);
     * NULL for none */
    const struct bt_cpu_rp_layout *rp;
    bt_cpu_rgemm_fn rgemm;
    /* optional: pack's panel straight from a repacked group of 16 rows
     * (Q6_K, whose rgemm rebuilds its 6-bit values for every 8 columns):
     * jobs of repacked weights with at least rpack_min_cols columns then run
     * gemm on it.  NULL: rgemm for every job */
    void (*rpack)(int64_t k, const void *group, void *panel);
    int rpack_min_cols;
    /* plain C versions, bitwise equal to quantize_act and vec_dot (the tests
     * compare them) */
    bt_cpu_quantize_act_fn quantize_act_ref;
    bt_cpu_vec_dot_fn vec_dot_ref;
};

/* The entry for a weight type, NULL for the float types (F32, F16, BF16,
 * which matmul.c computes itself). */
const struct bt_cpu_qtype *bt_cpu_qtype_of(enum bt_type weight_type);

/* entries (each defined in the file named) */
extern const struct bt_cpu_qtype bt_cpu_qtype_q8_0; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q4_0; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q4_1; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q5_0; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q5_1; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq4_nl; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_mxfp4; /* quant_i8.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q2_K; /* quant_dot.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q3_K; /* quant_dot.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q4_K; /* quant_dot.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q5_K; /* quant_dot.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_q6_K; /* quant_dot.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq4_xs; /* quant_iq.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq2_xxs; /* quant_iq.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq2_xs; /* quant_iq.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq2_s; /* quant_iq.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq3_xxs; /* quant_iq.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq3_s; /* quant_iq.c */
extern const struct bt_cpu_qtype bt_cpu_qtype_iq1_s; /* quant_iq.c */

#endif
