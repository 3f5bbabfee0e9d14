/* variant_names.h - included by the compiler (-include) ahead of each kernel
 * file in a build of one variant of the CPU kernels (cpu_variant.h): the
 * kernel files' external names become bt_cpu_<variant>_<name>, so that the
 * variants link side by side into one binary.  BT_CPU_VARIANT names the
 * variant (CMakeLists.txt defines it).  A new external name in a kernel file
 * goes here too (the link fails with a duplicate symbol otherwise). */
#ifndef BATON_VARIANT_NAMES_H
#define BATON_VARIANT_NAMES_H

#ifndef BT_CPU_VARIANT
#error "BT_CPU_VARIANT must name the variant being built (CMakeLists.txt)"
#endif
#define BT_CPU_VN2(v, n) bt_cpu_##v##_##n
#define BT_CPU_VN(v, n) BT_CPU_VN2(v, n)
/* a variant's copies of the public functions (bt_cpu_weight_repack's ...)
 * stay inside the library, which exports only the dispatching ones
 * (variant.c): no visibility attribute here, so the hidden default holds */
#define BT_API

/* kernels.c */
#define bt_cpu_kernels_table BT_CPU_VN(BT_CPU_VARIANT, kernels_table)
/* matmul.c */
#define bt_cpu_mul_mat BT_CPU_VN(BT_CPU_VARIANT, mul_mat)
#define bt_cpu_mul_mat_id BT_CPU_VN(BT_CPU_VARIANT, mul_mat_id)
#define bt_cpu_mul_mat_supported BT_CPU_VN(BT_CPU_VARIANT, mul_mat_supported)
#define bt_cpu_mul_mat_work_size BT_CPU_VN(BT_CPU_VARIANT, mul_mat_work_size)
/* fdot.c */
#define bt_cpu_fdot_rows BT_CPU_VN(BT_CPU_VARIANT, fdot_rows)
#define bt_cpu_fdot_buf_bytes BT_CPU_VN(BT_CPU_VARIANT, fdot_buf_bytes)
/* qtypes.c, quant_dot.c, quant_i8.c */
#define bt_cpu_qtype_of BT_CPU_VN(BT_CPU_VARIANT, qtype_of)
#define bt_quant_dot_of BT_CPU_VN(BT_CPU_VARIANT, quant_dot_of)
#define bt_cpu_qtype_q8_0 BT_CPU_VN(BT_CPU_VARIANT, qtype_q8_0)
#define bt_cpu_qtype_q4_0 BT_CPU_VN(BT_CPU_VARIANT, qtype_q4_0)
#define bt_cpu_qtype_q4_1 BT_CPU_VN(BT_CPU_VARIANT, qtype_q4_1)
#define bt_cpu_qtype_q5_0 BT_CPU_VN(BT_CPU_VARIANT, qtype_q5_0)
#define bt_cpu_qtype_q5_1 BT_CPU_VN(BT_CPU_VARIANT, qtype_q5_1)
#define bt_cpu_qtype_q2_K BT_CPU_VN(BT_CPU_VARIANT, qtype_q2_K)
#define bt_cpu_qtype_q3_K BT_CPU_VN(BT_CPU_VARIANT, qtype_q3_K)
#define bt_cpu_qtype_q4_K BT_CPU_VN(BT_CPU_VARIANT, qtype_q4_K)
#define bt_cpu_qtype_q5_K BT_CPU_VN(BT_CPU_VARIANT, qtype_q5_K)
#define bt_cpu_qtype_q6_K BT_CPU_VN(BT_CPU_VARIANT, qtype_q6_K)
#define bt_cpu_qtype_iq4_nl BT_CPU_VN(BT_CPU_VARIANT, qtype_iq4_nl)
#define bt_cpu_qtype_mxfp4 BT_CPU_VN(BT_CPU_VARIANT, qtype_mxfp4)
#define bt_cpu_iq_panel_size BT_CPU_VN(BT_CPU_VARIANT, iq_panel_size)
#define bt_cpu_iq4_xs_pack BT_CPU_VN(BT_CPU_VARIANT, iq4_xs_pack)
#define bt_cpu_iq4_xs_gemm BT_CPU_VN(BT_CPU_VARIANT, iq4_xs_gemm)
#define bt_cpu_iq2_xxs_pack BT_CPU_VN(BT_CPU_VARIANT, iq2_xxs_pack)
#define bt_cpu_iq2_xxs_gemm BT_CPU_VN(BT_CPU_VARIANT, iq2_xxs_gemm)
#define bt_cpu_iq2_xs_pack BT_CPU_VN(BT_CPU_VARIANT, iq2_xs_pack)
#define bt_cpu_iq2_xs_gemm BT_CPU_VN(BT_CPU_VARIANT, iq2_xs_gemm)
#define bt_cpu_iq2_s_pack BT_CPU_VN(BT_CPU_VARIANT, iq2_s_pack)
#define bt_cpu_iq2_s_gemm BT_CPU_VN(BT_CPU_VARIANT, iq2_s_gemm)
#define bt_cpu_iq3_xxs_pack BT_CPU_VN(BT_CPU_VARIANT, iq3_xxs_pack)
#define bt_cpu_iq3_xxs_gemm BT_CPU_VN(BT_CPU_VARIANT, iq3_xxs_gemm)
#define bt_cpu_iq3_s_pack BT_CPU_VN(BT_CPU_VARIANT, iq3_s_pack)
#define bt_cpu_iq3_s_gemm BT_CPU_VN(BT_CPU_VARIANT, iq3_s_gemm)
#define bt_cpu_iq1_s_pack BT_CPU_VN(BT_CPU_VARIANT, iq1_s_pack)
#define bt_cpu_iq1_s_gemm BT_CPU_VN(BT_CPU_VARIANT, iq1_s_gemm)
/* quant_iq.c */
#define bt_cpu_qtype_iq4_xs BT_CPU_VN(BT_CPU_VARIANT, qtype_iq4_xs)
#define bt_cpu_qtype_iq2_xxs BT_CPU_VN(BT_CPU_VARIANT, qtype_iq2_xxs)
#define bt_cpu_qtype_iq2_xs BT_CPU_VN(BT_CPU_VARIANT, qtype_iq2_xs)
#define bt_cpu_qtype_iq2_s BT_CPU_VN(BT_CPU_VARIANT, qtype_iq2_s)
#define bt_cpu_qtype_iq3_xxs BT_CPU_VN(BT_CPU_VARIANT, qtype_iq3_xxs)
#define bt_cpu_qtype_iq3_s BT_CPU_VN(BT_CPU_VARIANT, qtype_iq3_s)
#define bt_cpu_qtype_iq1_s BT_CPU_VN(BT_CPU_VARIANT, qtype_iq1_s)
#define bt_cpu_iq_unpack BT_CPU_VN(BT_CPU_VARIANT, iq_unpack)
/* repack.c */
#define bt_cpu_rp_unpack_row BT_CPU_VN(BT_CPU_VARIANT, rp_unpack_row)
#define bt_cpu_rp_layout_of BT_CPU_VN(BT_CPU_VARIANT, rp_layout_of)
#define bt_cpu_weight_repackable BT_CPU_VN(BT_CPU_VARIANT, weight_repackable)
#define bt_cpu_weight_repack_available BT_CPU_VN(BT_CPU_VARIANT, weight_repack_available)
#define bt_cpu_weight_repack BT_CPU_VN(BT_CPU_VARIANT, weight_repack)
#define bt_cpu_weight_unpack BT_CPU_VN(BT_CPU_VARIANT, weight_unpack)
#define bt_cpu_weight_is_repacked BT_CPU_VN(BT_CPU_VARIANT, weight_is_repacked)
/* measure.c */
#define bt_cpu_measure_read_bw BT_CPU_VN(BT_CPU_VARIANT, measure_read_bw)
#define bt_cpu_measure_fma_peak BT_CPU_VN(BT_CPU_VARIANT, measure_fma_peak)

#endif
