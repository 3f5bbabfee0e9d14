/* variant.c - which variant of the CPU kernels runs (cpu_variant.h says what
 * a variant is): the widest one the CPU runs, or the one the environment
 * variable BATON_CPU names; and, in a build of several variants
 * (BT_CPU_MULTI), the kernel files' plain external names, each forwarding
 * to the chosen variant.
 *
 * On aarch64 the variants are c, neon, dotprod and i8mm, told apart by the
 * kernel's hwcaps (getauxval), as x86-64's by cpuid.
 *
 * The choice is made once per process, at the first call, and never
 * changes: a process-wide constant, like the CPU it describes. */
#include "cpu_variant.h"

#include "baton/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#if defined(BT_CPU_MULTI) && defined(__aarch64__)
#include <sys/auxv.h>
extern const struct bt_cpu_kernels bt_cpu_c_kernels_table, bt_cpu_neon_kernels_table, bt_cpu_dotprod_kernels_table,
    bt_cpu_i8mm_kernels_table;
/* narrowest first: the widest the CPU runs is chosen */
static const struct bt_cpu_kernels *const variants[] = {&bt_cpu_c_kernels_table, &bt_cpu_neon_kernels_table,
                                                        &bt_cpu_dotprod_kernels_table, &bt_cpu_i8mm_kernels_table};
#elif defined(BT_CPU_MULTI)
extern const struct bt_cpu_kernels bt_cpu_c_kernels_table, bt_cpu_avx2_kernels_table, bt_cpu_avx2vnni_kernels_table,
    bt_cpu_avx512f_kernels_table, bt_cpu_avx512_kernels_table, bt_cpu_avx512bf16_kernels_table;
/* narrowest first: the widest the CPU runs is chosen */
static const struct bt_cpu_kernels *const variants[] = {
    &bt_cpu_c_kernels_table,       &bt_cpu_avx2_kernels_table,   &bt_cpu_avx2vnni_kernels_table,
    &bt_cpu_avx512f_kernels_table, &bt_cpu_avx512_kernels_table, &bt_cpu_avx512bf16_kernels_table};
#else
extern const struct bt_cpu_kernels bt_cpu_kernels_table;
static const struct bt_cpu_kernels *const variants[] = {&bt_cpu_kernels_table};
#endif
#define N_VARIANTS ((int)(sizeof variants / sizeof variants[0]))

int bt_cpu_n_variants(void) { return N_VARIANTS; }

const struct bt_cpu_kernels *bt_cpu_variant_at(int i) {
    BT_ASSERT(i >= 0 && i < N_VARIANTS);
    return variants[i];
}

#if defined(BT_CPU_MULTI) && defined(__aarch64__)
/* the kernel's hardware capabilities (getauxval; the bits of the Linux
 * uapi's asm/hwcap.h, which older headers may lack) */
#define BT_HWCAP_ASIMD (1ul << 1)
#define BT_HWCAP_ASIMDDP (1ul << 20)
#define BT_HWCAP2_I8MM (1ul << 13)

/* does the CPU run the instructions variant `name` was built with
 * (CMakeLists.txt)? */
static bool cpu_runs(const char *name) {
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    const bool neon = (hw & BT_HWCAP_ASIMD) != 0;
    const bool dotprod = neon && (hw & BT_HWCAP_ASIMDDP) != 0;
    if (strcmp(name, "c") == 0) return true;
    if (strcmp(name, "neon") == 0) return neon;
    if (strcmp(name, "dotprod") == 0) return dotprod;
    if (strcmp(name, "i8mm") == 0) return dotprod && (hw2 & BT_HWCAP2_I8MM) != 0;
    return false;
}
#elif defined(BT_CPU_MULTI)
/* F16C: cpuid leaf 1, ecx bit 29 (not among GCC 12's __builtin_cpu_supports names) */
static bool has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}

/* does the CPU (and the OS, which __builtin_cpu_supports asks too) run the
 * instruction sets variant `name` was built with (CMakeLists.txt)? */
static bool cpu_runs(const char *name) {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    const bool avx512f = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512cd");
    const bool avx512 = avx512f && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
                        __builtin_cpu_supports("gfni") && __builtin_cpu_supports("bmi2");
    if (strcmp(name, "c") == 0) return true;
    if (strcmp(name, "avx2") == 0) return avx2;
    if (strcmp(name, "avx2vnni") == 0) return avx2 && __builtin_cpu_supports("avxvnni");
    if (strcmp(name, "avx512f") == 0) return avx512f;
    if (strcmp(name, "avx512") == 0) return avx512;
    if (strcmp(name, "avx512bf16") == 0) return avx512 && __builtin_cpu_supports("avx512bf16");
    return false;
}
#else
/* a build of one variant runs on the CPUs it was built for */
static bool cpu_runs(const char *name) {
    (void)name;
    return true;
}
#endif

bool bt_cpu_variant_runs(int i) { return cpu_runs(bt_cpu_variant_at(i)->name); }
const char *bt_cpu_variant_name_at(int i) { return bt_cpu_variant_at(i)->name; }

static const struct bt_cpu_kernels *chosen;
static pthread_once_t chosen_once = PTHREAD_ONCE_INIT;

/* the widest variant the CPU runs; BATON_CPU=name takes that one instead
 * where the CPU runs it (a name it does not run, or that the build lacks,
 * is said on stderr once and left) */
static void choose(void) {
    int best = 0;
    for (int i = 0; i < N_VARIANTS; i++)
        if (bt_cpu_variant_runs(i)) best = i;
    const char *want = getenv("BATON_CPU");
    if (want && *want) {
        int w = -1;
        for (int i = 0; i < N_VARIANTS; i++)
            if (strcmp(variants[i]->name, want) == 0) w = i;
        if (w >= 0 && bt_cpu_variant_runs(w)) {
            best = w;
        } else {
            char names[128] = "";
            for (int i = 0; i < N_VARIANTS; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", variants[i]->name);
            fprintf(stderr, "baton: BATON_CPU=%s: %s (this build's CPU kernels: %s); running %s\n", want,
                    w < 0 ? "no such variant" : "this CPU does not run it", names, variants[best]->name);
        }
    }
    chosen = variants[best];
}

const struct bt_cpu_kernels *bt_cpu_kernels(void) {
    pthread_once(&chosen_once, choose);
    return chosen;
}

const char *bt_cpu_variant_name(void) { return bt_cpu_kernels()->name; }

#ifdef BT_CPU_MULTI
/* ---- the kernel files' plain names, forwarded to the chosen variant ---------- */

void bt_cpu_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *dst) { bt_cpu_kernels()->mul_mat(p, dst); }
void bt_cpu_mul_mat_id(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    bt_cpu_kernels()->mul_mat_id(p, dst);
}
bool bt_cpu_mul_mat_supported(const struct bt_tensor *node) { return bt_cpu_kernels()->mul_mat_supported(node); }
size_t bt_cpu_mul_mat_work_size(const struct bt_tensor *node, int nth) {
    return bt_cpu_kernels()->mul_mat_work_size(node, nth);
}
const struct bt_cpu_qtype *bt_cpu_qtype_of(enum bt_type weight_type) {
    return bt_cpu_kernels()->qtype_of(weight_type);
}
const struct bt_quant_dot *bt_quant_dot_of(enum bt_type t) { return bt_cpu_kernels()->quant_dot_of(t); }
void bt_cpu_rp_unpack_row(enum bt_type t, int64_t k, const void *group, int r, void *row) {
    bt_cpu_kernels()->rp_unpack_row(t, k, group, r, row);
}
bool bt_cpu_weight_repackable(const struct bt_tensor *t) { return bt_cpu_kernels()->weight_repackable(t); }
bool bt_cpu_weight_repack_available(enum bt_type t) { return bt_cpu_kernels()->weight_repack_available(t); }
void bt_cpu_weight_repack(struct bt_tensor *t, const void *plain) { bt_cpu_kernels()->weight_repack(t, plain); }
void bt_cpu_weight_unpack(const struct bt_tensor *t, void *plain) { bt_cpu_kernels()->weight_unpack(t, plain); }
bool bt_cpu_weight_is_repacked(const struct bt_tensor *t) { return bt_cpu_kernels()->weight_is_repacked(t); }
double bt_cpu_measure_read_bw(size_t bytes, int n_threads) {
    return bt_cpu_kernels()->measure_read_bw(bytes, n_threads);
}
double bt_cpu_measure_fma_peak(int n_threads) { return bt_cpu_kernels()->measure_fma_peak(n_threads); }
#endif
