/* quant_dot.h - dot products of one row of K-quant weights (Q2_K .. Q6_K)
 * with one activation column quantised to int8 blocks (Q8_K).  Internal to
 * the CPU backend (matmul.c's table of quantised weight types).
 *
 * Accumulation order: fixed per type, the same on every path (quant_dot.c's
 * header), so any caller gets the same bits for a row and a column.
 */
#ifndef BATON_QUANT_DOT_H
#define BATON_QUANT_DOT_H

#include "quants.h"

/* s = dot(w_row, act) over k elements (k a multiple of the weight's block
 * size); act is the column quantised with the entry's quantize_act. */
typedef void (*bt_quant_vec_dot_fn)(int64_t k, float *s, const void *w_row, const void *act);

struct bt_quant_dot {
    enum bt_type act_type; /* BT_TYPE_Q8_K */
    void (*quantize_act)(const float *x, void *y, int64_t k);
    bt_quant_vec_dot_fn vec_dot;     /* the fastest this build has */
    bt_quant_vec_dot_fn vec_dot_ref; /* plain C, bitwise equal to vec_dot */
};

/* The entry for weight type t; NULL for types quant_dot.c does not handle. */
const struct bt_quant_dot *bt_quant_dot_of(enum bt_type t);

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)) || \
    (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
/* The IQ types' packed GEMMs for quant_iq.c's entries (qtypes.h's
 * panel_size, pack, gemm): the K-quants' panel and kernel (AVX-512 VNNI or
 * AVX2), each element the bits of the type's vec_dot (quant_dot.c, kinds
 * KQI4 .. KQI1S).  The lattice types' blocks are unpacked by quant_iq.c's
 * bt_cpu_iq_unpack. */
#define BT_CPU_IQ_GEMM 1
size_t bt_cpu_iq_panel_size(int64_t k);
#define BT_CPU_IQ_GEMM_DECL(name)                                                                              \
    void bt_cpu_##name##_pack(int64_t k, const void *const *rows, void *panel);                                 \
    void bt_cpu_##name##_gemm(int64_t k, const void *panel, const void *const *acts, int64_t ncols,             \
                              float *const *dcols, int64_t row0, int nrows);
BT_CPU_IQ_GEMM_DECL(iq4_xs)
BT_CPU_IQ_GEMM_DECL(iq2_xxs)
BT_CPU_IQ_GEMM_DECL(iq2_xs)
BT_CPU_IQ_GEMM_DECL(iq2_s)
BT_CPU_IQ_GEMM_DECL(iq3_xxs)
BT_CPU_IQ_GEMM_DECL(iq3_s)
BT_CPU_IQ_GEMM_DECL(iq1_s)
/* one block of a lattice IQ type (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S; quant_iq.c's header): its signed values v + 128 in element order
 * (q), its 16-element scales (sc) and d * mult (*dm) */
void bt_cpu_iq_unpack(enum bt_type t, const void *blk, uint8_t q[BT_QK_K], int8_t sc[16], float *dm);
#endif

#endif
