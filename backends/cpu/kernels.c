/* kernels.c - this variant's table of the CPU kernels (cpu_variant.h): one
 * entry per external function of the kernel files, for variant.c to choose
 * among.  Built once per variant (BT_CPU_VARIANT names it), or once in a
 * build with one variant, which it names from the instruction sets the
 * compiler was given. */
#include "cpu_variant.h"

#include "baton/cpu.h"

#define BT_KSTR2(x) #x
#define BT_KSTR(x) BT_KSTR2(x)

#if defined(BT_CPU_VARIANT)
#define KERNELS_NAME BT_KSTR(BT_CPU_VARIANT)
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512BF16__)
#define KERNELS_NAME "avx512bf16"
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define KERNELS_NAME "avx512"
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KERNELS_NAME "avx512f"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVXVNNI__)
#define KERNELS_NAME "avx2vnni"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KERNELS_NAME "avx2"
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_MATMUL_INT8) && \
    defined(__ARM_FEATURE_DOTPROD)
#define KERNELS_NAME "i8mm"
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define KERNELS_NAME "dotprod"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define KERNELS_NAME "neon"
#else
#define KERNELS_NAME "c"
#endif

/* attention's kernels (attn.c, chosen at run time on their own) go up to
 * this variant's instruction set; in a build of one variant, as wide as the
 * CPU has */
#if defined(__aarch64__) && defined(__ARM_NEON)
#define KERNELS_ATTN BT_CPU_ATTN_NEON
#elif !defined(BT_CPU_VARIANT) || defined(__AVX512F__)
#define KERNELS_ATTN BT_CPU_ATTN_AVX512
#elif defined(__AVX2__)
#define KERNELS_ATTN BT_CPU_ATTN_AVX2
#else
#define KERNELS_ATTN BT_CPU_ATTN_C
#endif

const struct bt_cpu_kernels bt_cpu_kernels_table = {
    /* .name                    = */ KERNELS_NAME,
    /* .attn                    = */ KERNELS_ATTN,
    /* .mul_mat                 = */ bt_cpu_mul_mat,
    /* .mul_mat_id              = */ bt_cpu_mul_mat_id,
    /* .mul_mat_supported       = */ bt_cpu_mul_mat_supported,
    /* .mul_mat_work_size       = */ bt_cpu_mul_mat_work_size,
    /* .qtype_of                = */ bt_cpu_qtype_of,
    /* .quant_dot_of            = */ bt_quant_dot_of,
    /* .rp_unpack_row           = */ bt_cpu_rp_unpack_row,
    /* .weight_repackable       = */ bt_cpu_weight_repackable,
    /* .weight_repack_available = */ bt_cpu_weight_repack_available,
    /* .weight_repack           = */ bt_cpu_weight_repack,
    /* .weight_unpack           = */ bt_cpu_weight_unpack,
    /* .weight_is_repacked      = */ bt_cpu_weight_is_repacked,
    /* .measure_read_bw         = */ bt_cpu_measure_read_bw,
    /* .measure_fma_peak        = */ bt_cpu_measure_fma_peak,
};
