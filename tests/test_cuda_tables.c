/* test_cuda_tables.c - the CUDA kernels' element reads of the table types
 * (backends/cuda/table_get.h: MXFP4, IQ4_NL, IQ4_XS and the 1-3-bit
 * lattice types), compiled here for the CPU with quants.c's tables: every
 * element of random blocks bit for bit what quants.c's dequantisation gives.
 * It needs no device, so it runs in every build; the kernels include the
 * same header with the device's copies of the tables. */
#include <string.h>

#include "quants.h"
#include "baton/tensor.h"
#include "testutil.h"

#define BT_TG_FN static inline
#define BT_TG_MUL(a, b) ((a) * (b))
#define BT_TG_ADD(a, b) ((a) + (b))
#define BT_TG_H2F(h) bt_fp16_to_fp32(h)
#define BT_TG_TAB(name) bt_##name
static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#define BT_TG_U2F(u) u2f(u)
#include "../backends/cuda/table_get.h"

enum { N_BLOCKS = 64 };

/* blocks of type t: quantised from random values where baton quantises to
 * t, random bytes with a sane scale otherwise, and in every case some
 * blocks of raw random bytes (any scale: subnormal, huge, NaN) */
static void random_blocks(enum bt_type t, uint8_t *q, int64_t n, tu_rng *r) {
    const size_t bytes = (size_t)(n / bt_type_traits(t)->blck_size) * bt_type_traits(t)->type_size;
    if (bt_type_can_quantize(t)) {
        static float x[N_BLOCKS * 256];
        for (int64_t i = 0; i < n; i++) x[i] = tu_rng_f32(r, -2.0f, 2.0f) * (float)(1 + i % 7);
        bt_row_from_f32(t, x, q, n);
    } else {
        uint64_t s = (uint64_t)tu_rng_int(r, 1 << 30) * 2654435761u + 7;
        bt_row_random_blocks(t, q, n, 0.02f, &s);
    }
    /* the last quarter raw */
    for (size_t i = bytes - bytes / 4; i < bytes; i++) q[i] = (uint8_t)tu_rng_int(r, 256);
}

START_TEST(test_every_element) {
    static const enum bt_type types[] = {BT_TYPE_MXFP4,   BT_TYPE_IQ4_NL, BT_TYPE_IQ4_XS,  BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS,
                                         BT_TYPE_IQ2_S,   BT_TYPE_IQ3_XXS, BT_TYPE_IQ3_S, BT_TYPE_IQ1_S};
    static uint8_t q[N_BLOCKS * 256];
    static float want[N_BLOCKS * 256];
    tu_rng r;
    tu_rng_init(&r, 20261202);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum bt_type t = types[ti];
        const struct bt_type_traits *tr = bt_type_traits(t);
        ck_assert_int_eq(bt_tg_blck(t), (int)tr->blck_size);
        ck_assert_int_eq(bt_tg_block_bytes(t), (int)tr->type_size);
        for (int trial = 0; trial < 4; trial++) {
            const int64_t n = (int64_t)N_BLOCKS * tr->blck_size;
            random_blocks(t, q, n, &r);
            tr->to_float(q, want, n);
            for (int64_t i = 0; i < n; i++) {
                const float got = bt_tg_get(t, (const char *)q + (i / tr->blck_size) * tr->type_size,
                                            (int)(i % tr->blck_size));
                ck_assert_msg(memcmp(&got, &want[i], 4) == 0, "%s element %lld: %a, quants.c %a", bt_type_name(t),
                              (long long)i, (double)got, (double)want[i]);
            }
        }
    }
    /* not a table type: nothing */
    ck_assert_int_eq(bt_tg_blck(BT_TYPE_Q4_K), 0);
    ck_assert_int_eq(bt_tg_block_bytes(BT_TYPE_F16), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cuda_tables");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_every_element);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
