/* cpu_variant.h - the CPU kernels of one instruction set (a variant) as a
 * table, and the choice among the variants a build holds.  Internal to
 * backends/cpu.
 *
 * The kernel files (matmul.c, fdot.c, quant_dot.c, quant_i8.c, qtypes.c,
 * repack.c, measure.c, kernels.c) are built once per variant in an x86-64
 * or aarch64 build with BATON_CPU_VARIANTS (CMakeLists.txt), as ggml's
 * GGML_CPU_ALL_VARIANTS builds its CPU backend:
 *   c           the x86-64 baseline (plain C kernels)
 *   avx2        AVX2, FMA, F16C (Haswell and later, Zen 1-3)
 *   avx2vnni    the same and AVX-VNNI, the 256-bit vpdpbusd (Alder Lake, Zen 5)
 *   avx512f     AVX-512 F, BW, VL, DQ, CD without VNNI (Skylake-SP): its
 *               integer dots are the AVX2 ones, the rest AVX-512
 *   avx512      AVX-512 F, BW, VL, DQ, CD, VNNI, VBMI, GFNI and BMI2 (Ice Lake and later)
 *   avx512bf16  the same and AVX512-BF16 (Sapphire Rapids, Zen 4 and later)
 * and in an aarch64 build (cmake/aarch64-linux-gnu.cmake):
 *   c           no Advanced SIMD (the plain C kernels)
 *   neon        ARMv8.0 Advanced SIMD, which every aarch64 CPU has
 *   dotprod     the same and sdot (ARMv8.2+: Neoverse N1, Apple M1)
 *   i8mm        the same and smmla (ARMv8.6+: Neoverse V1/N2, Apple M2)
 * each compile renaming the files' external names to bt_cpu_<variant>_...
 * (variant_names.h, included first by the compiler), so that all link into
 * one binary.  variant.c picks, once, the widest variant the CPU runs, or
 * the one the environment variable BATON_CPU names (a lower one, for tests
 * and benchmarks), and defines the plain names, each forwarding to the
 * chosen variant.  Every variant gives the same bits (each kernel file's
 * header gives its order; tests/test_quants.c and test_determinism.c check
 * each variant the CPU runs), so ranks on different CPUs agree.
 *
 * A build with BATON_NATIVE (or any other build without variants) holds one
 * variant, whose table variant.c returns; BATON_CPU then only names it.
 */
#ifndef BATON_CPU_VARIANT_H
#define BATON_CPU_VARIANT_H

#include <stdbool.h>

#include "baton/cpu.h"
#include "cpu_impl.h"
#include "qtypes.h"
#include "quant_dot.h"

/* one variant's kernels: the external functions of the kernel files */
struct bt_cpu_kernels {
    const char *name;             /* "c", "avx2", ... "avx512bf16"; "neon", "dotprod", "i8mm" */
    enum bt_cpu_attn_isa attn;    /* the widest attention kernels (attn.c) that go with it */
    void (*mul_mat)(const struct bt_cpu_params *p, struct bt_tensor *dst);
    void (*mul_mat_id)(const struct bt_cpu_params *p, struct bt_tensor *dst);
    bool (*mul_mat_supported)(const struct bt_tensor *node);
    size_t (*mul_mat_work_size)(const struct bt_tensor *node, int nth);
    const struct bt_cpu_qtype *(*qtype_of)(enum bt_type weight_type);
    const struct bt_quant_dot *(*quant_dot_of)(enum bt_type t);
    void (*rp_unpack_row)(enum bt_type t, int64_t k, const void *group, int r, void *row);
    bool (*weight_repackable)(const struct bt_tensor *t);
    bool (*weight_repack_available)(enum bt_type t);
    void (*weight_repack)(struct bt_tensor *t, const void *plain);
    void (*weight_unpack)(const struct bt_tensor *t, void *plain);
    bool (*weight_is_repacked)(const struct bt_tensor *t);
    double (*measure_read_bw)(size_t bytes, int n_threads);
    double (*measure_fma_peak)(int n_threads);
};

/* variant i of this build (i < bt_cpu_n_variants(): cpu.h) */
const struct bt_cpu_kernels *bt_cpu_variant_at(int i);

/* The variant in use: chosen at the first call (thread-safe) from the CPU
 * and BATON_CPU. */
const struct bt_cpu_kernels *bt_cpu_kernels(void);

#endif
