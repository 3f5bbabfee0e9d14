/* quant_dot.h - dot products of one row of quantised weights (Q4_1, Q5_0,
 * Q5_1, IQ4_NL, MXFP4, Q2_K .. Q6_K) with one activation column quantised to
 * int8 blocks (Q8_0 for the 32-element types, Q8_K for the K-quants).  Internal to the
 * CPU backend (matmul.c's table of quantised weight types).
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
    enum bt_type act_type; /* BT_TYPE_Q8_0 or BT_TYPE_Q8_K */
    void (*quantize_act)(const float *x, void *y, int64_t k);
    bt_quant_vec_dot_fn vec_dot;     /* the fastest this build has */
    bt_quant_vec_dot_fn vec_dot_ref; /* plain C, bitwise equal to vec_dot */
};

/* The entry for weight type t; NULL for types quant_dot.c does not handle. */
const struct bt_quant_dot *bt_quant_dot_of(enum bt_type t);

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)) || \
    (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
/* IQ4_XS's packed GEMM for quant_iq.c's entry (qtypes.h's panel_size, pack,
 * gemm): the K-quants' panel and kernel (AVX-512 VNNI or AVX2), each element
 * the bits of IQ4_XS's vec_dot (quant_dot.c, kind KQI4) */
#define BT_CPU_IQ4_XS_GEMM 1
size_t bt_cpu_iq4_xs_panel_size(int64_t k);
void bt_cpu_iq4_xs_pack(int64_t k, const void *const *rows, void *panel);
void bt_cpu_iq4_xs_gemm(int64_t k, const void *panel, const void *const *acts, int64_t ncols, float *const *dcols,
                        int64_t row0, int nrows);
#endif

#endif
