/* qtypes.c - the table of quantised weight types the CPU matmul dispatches
 * on (qtypes.h says what an entry must do).  One line per type. */
#include "qtypes.h"

static const struct bt_cpu_qtype *const qtype_table[BT_TYPE_COUNT] = {
    [BT_TYPE_Q8_0] = &bt_cpu_qtype_q8_0,
    [BT_TYPE_Q4_0] = &bt_cpu_qtype_q4_0,
    [BT_TYPE_Q4_1] = &bt_cpu_qtype_q4_1,
    [BT_TYPE_Q5_0] = &bt_cpu_qtype_q5_0,
    [BT_TYPE_Q5_1] = &bt_cpu_qtype_q5_1,
    [BT_TYPE_IQ4_NL] = &bt_cpu_qtype_iq4_nl,
    [BT_TYPE_MXFP4] = &bt_cpu_qtype_mxfp4,
    [BT_TYPE_Q2_K] = &bt_cpu_qtype_q2_K,
    [BT_TYPE_Q3_K] = &bt_cpu_qtype_q3_K,
    [BT_TYPE_Q4_K] = &bt_cpu_qtype_q4_K,
    [BT_TYPE_Q5_K] = &bt_cpu_qtype_q5_K,
    [BT_TYPE_Q6_K] = &bt_cpu_qtype_q6_K,
    [BT_TYPE_IQ4_XS] = &bt_cpu_qtype_iq4_xs,
    [BT_TYPE_IQ2_XXS] = &bt_cpu_qtype_iq2_xxs,
    [BT_TYPE_IQ2_XS] = &bt_cpu_qtype_iq2_xs,
    [BT_TYPE_IQ2_S] = &bt_cpu_qtype_iq2_s,
    [BT_TYPE_IQ3_XXS] = &bt_cpu_qtype_iq3_xxs,
    [BT_TYPE_IQ3_S] = &bt_cpu_qtype_iq3_s,
    [BT_TYPE_IQ1_S] = &bt_cpu_qtype_iq1_s,
};

const struct bt_cpu_qtype *bt_cpu_qtype_of(enum bt_type weight_type) {
    if ((int)weight_type < 0 || weight_type >= BT_TYPE_COUNT) return NULL;
    return qtype_table[weight_type];
}
