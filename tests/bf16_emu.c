/* bf16_emu.c - backends/cpu/matmul.c compiled once more with fewer SIMD
 * extensions (CMakeLists.txt builds this file three times: without
 * AVX512-BF16, without AVX-512, without AVX), its entry points renamed with
 * the prefix BT_EMU_PREFIX, so that tests/test_bf16_emu.c can check that a
 * CPU without the BF16 dot instruction gives the same bits. */
#ifndef BT_EMU_PREFIX
#error "BT_EMU_PREFIX must name the copy (CMakeLists.txt)"
#endif
#define BT_EMU_CAT2(a, b) a##b
#define BT_EMU_CAT(a, b) BT_EMU_CAT2(a, b)
#define bt_cpu_mul_mat BT_EMU_CAT(BT_EMU_PREFIX, _mul_mat)
#define bt_cpu_mul_mat_id BT_EMU_CAT(BT_EMU_PREFIX, _mul_mat_id)
#define bt_cpu_mul_mat_supported BT_EMU_CAT(BT_EMU_PREFIX, _mul_mat_supported)
#define bt_cpu_mul_mat_work_size BT_EMU_CAT(BT_EMU_PREFIX, _mul_mat_work_size)
#define bt_cpu_qtype_q8_0 BT_EMU_CAT(BT_EMU_PREFIX, _qtype_q8_0)
#define bt_cpu_qtype_q4_0 BT_EMU_CAT(BT_EMU_PREFIX, _qtype_q4_0)
#include "matmul.c"
