/* bench.c - `baton bench ops`: times MUL_MAT and MUL_MAT_ID on the CPU backend
 * for each weight type and thread count, next to the machine's measured
 * streaming-read bandwidth and FMA peak.  Prints figures; never fails on time.
 *
 * Shapes (weights a [k, m], activations b [k, n]):
 *   decode  mul_mat     m=4096 n=1   k=14336   (weight-bandwidth bound)
 *   prompt  mul_mat     m=4096 n=512 k=4096    (FMA bound)
 *   moe     mul_mat_id  128 experts, 8 used, m=768 k=2048, tokens 1, 32, 512
 *   a Mixtral-shaped model's decode step (d_model 2048, 8 experts of 5632,
 *           top-2, vocabulary 32000: the llama-bench comparison's files), one
 *           token, a barrier after each product as in the model:
 *           mul_mat m=2048, 512 and 32000 at k=2048 (attention q/o, k/v, the
 *           output), mul_mat_id 2 of 8 experts m=5632 k=2048 (gate, up) and
 *           m=2048 k=5632 (down)
 *   attention flash_attn  head size 64, 32 q heads over 8 kv heads, F16 cache
 *           (the test models' shape), causal: a prompt of T = 512 over
 *           n_kv = 512 and 4096 cells, a decode step (T = 1) over 512 and 4096
 *           (with f16 among --types)
 * Weight GB/s counts the weight bytes a call must read: the whole matrix for
 * mul_mat, only the experts the ids select for mul_mat_id.  Decode-shaped
 * mul_mats rotate over copies of the weights so they stream from memory; the
 * MoE experts (113-805 MB in all, a few MB selected per call) may partly stay
 * in the last-level cache, so their %bw can exceed 100%.  The MoE rows at 1
 * token time a graph of MOE_COPIES_1TOK copies of the product with a barrier
 * after each (per product: the time divided by the copies), as a model's
 * step runs its products and as test-backend-ops times an op.
 * The weights are plain rows, as test-backend-ops and --mmap have them; with
 * --repacked the decode, prompt and moe rows' weights are laid out as a CPU
 * rank loads a model's (bt_cpu_weight_repack), their shape marked "rp".
 */
#include "baton/baton.h"
#include "cli.h"
#include "common.h"
#include "baton/cpu.h"
#include "quants.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define BENCH_MAX_THREADS 16
#define MOE_EXPERTS 128
#define MOE_USED 8
/* mul_mat_id at 1 token takes 0.2-1 ms: its graph holds this many copies of
 * the product, a barrier after each (as a model's step has, and as
 * test-backend-ops times a graph holding the op many times), so that waking
 * the pool and checking the plan once per graph are spread as in a step */
#define MOE_COPIES_1TOK 8
#define BENCH_STREAM_BYTES ((size_t)768 << 20) /* weights one mul_mat run touches, at least */
#define BENCH_MAX_COPIES 32

struct bench_opts {
    int threads[BENCH_MAX_THREADS];
    int n_threads;
    bool types[BT_TYPE_COUNT];
    int reps; /* 0: per-shape default */
    bool quick;
    bool cached; /* --cached: decode rows reuse one copy of the weights */
    bool repacked; /* decode, prompt and moe weights laid out as a CPU rank loads them */
    unsigned shapes; /* SHAPE_* bits: the rows --shapes selects */
};

/* the row groups of --shapes */
enum {
    SHAPE_DECODE = 1u << 0, /* mul_mat m=4096 n=1 k=14336 */
    SHAPE_PROMPT = 1u << 1, /* mul_mat m=4096 n=512 k=14336 */
    SHAPE_MOE1 = 1u << 2,   /* mul_mat_id, 1 token */
    SHAPE_MOE32 = 1u << 3,  /* mul_mat_id, 32 tokens */
    SHAPE_MOE512 = 1u << 4, /* mul_mat_id, 512 tokens */
    SHAPE_MODEL = 1u << 5,  /* a Mixtral-shaped model's decode products */
    SHAPE_ATTN = 1u << 6,   /* flash_attn (with f16 among the types) */
    SHAPE_ALL = (1u << 7) - 1u,
};
static const struct {
    const char *name;
    unsigned bits;
} shape_names[] = {{"all", SHAPE_ALL},       {"decode", SHAPE_DECODE}, {"prompt", SHAPE_PROMPT},
                   {"moe", SHAPE_MOE1 | SHAPE_MOE32 | SHAPE_MOE512},
                   {"moe1", SHAPE_MOE1},     {"moe32", SHAPE_MOE32},   {"moe512", SHAPE_MOE512},
                   {"model", SHAPE_MODEL},   {"attn", SHAPE_ATTN}};

struct machine {
    double read_bw[BENCH_MAX_THREADS]; /* bytes/s, per entry of opts.threads */
    double fma_peak[BENCH_MAX_THREADS];
};

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static float rng_float(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* dst <- the n bytes at src rotated left by shift bytes */
static void rotate_copy(void *dst, const void *src, size_t n, size_t shift) {
    memcpy(dst, (const char *)src + shift, n - shift);
    memcpy((char *)dst + (n - shift), src, shift);
}

/* Fill t (contiguous) with random numbers: its first matrix (ne[0] x ne[1])
 * row by row from the generator, converted to t's type; each further one
 * (a 3-d t's experts) the first's bytes rotated by its index in blocks.  No
 * 4 KiB page repeats: a rotation by j blocks lines up with the pages only
 * for j a multiple of 4096 / gcd(block bytes, 4096), at least 256 for every
 * type.  So neither a cache nor a machine that merges identical pages can
 * hold the weights in less than their size, as with a real model's and
 * test-backend-ops' random ones.  (An earlier fill repeated 61 rows; on this
 * VM its decode rows then read at times at 1.5-1.8x the memory's bandwidth,
 * while llama.cpp's beside them did not.) */
static bool fill_random(struct bt_tensor *t, uint64_t seed) {
    const int64_t n0 = t->ne[0], rows = t->ne[1];
    float *tmp = malloc(sizeof(float) * (size_t)n0);
    if (!tmp) return false;
    uint64_t s = seed | 1;
    for (int64_t r = 0; r < rows; r++) {
        char *row = (char *)t->data + (size_t)r * t->nb[1];
        if (!bt_type_can_quantize(t->type)) { /* the lattice types: random blocks */
            bt_row_random_blocks(t->type, row, n0, 0.01f, &s);
            continue;
        }
        for (int64_t i = 0; i < n0; i++) tmp[i] = rng_float(&s);
        bt_row_from_f32(t->type, tmp, row, n0);
    }
    free(tmp);
    const size_t mat = (size_t)rows * t->nb[1];
    const int64_t n_mat = bt_nrows(t) / rows;
    for (int64_t j = 1; j < n_mat; j++)
        rotate_copy((char *)t->data + (size_t)j * mat, t->data, mat, (size_t)j * bt_type_size(t->type) % mat);
    return true;
}

/* --repacked: each of the n weight tensors ts (filled, plain, one type and
 * shape) rearranged from its own bytes as bt_llm_load_gguf does on a CPU
 * rank.  1: repacked; 0: not (no --repacked, or this build does not repack
 * that type and shape); -1: out of memory, with a message. */
static int repack_weights(const struct bench_opts *o, struct bt_tensor *const *ts, int n) {
    if (!o->repacked || !bt_cpu_weight_repackable(ts[0])) return 0;
    const size_t bytes = bt_nbytes(ts[0]);
    void *plain = malloc(bytes);
    if (!plain) {
        fprintf(stderr, "baton bench: cannot allocate %zu MiB to repack %s weights\n", bytes >> 20,
                bt_type_name(ts[0]->type));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        memcpy(plain, ts[i]->data, bytes);
        bt_cpu_weight_repack(ts[i], plain);
    }
    free(plain);
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double cpu_s(void) { /* CPU time of the whole process (all its threads) */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Median seconds per bt_cpu_graph_compute of g over reps runs (after one
 * warm-up run), and in *cpu the median CPU seconds the process used per run;
 * < 0 on a compute error (message printed). */
static double time_graph(bt_cpu *cpu, struct bt_graph *g, int reps, double *cpu_sec) {
    double *t = malloc(sizeof(double) * 2 * (size_t)reps);
    if (!t) return -1.0;
    double med = -1.0;
    enum bt_status s = bt_cpu_graph_compute(cpu, g);
    for (int r = 0; r < reps && s == BT_OK; r++) {
        const double t0 = bt_now_s(), c0 = cpu_s();
        s = bt_cpu_graph_compute(cpu, g);
        t[reps + r] = cpu_s() - c0;
        t[r] = bt_now_s() - t0;
    }
    if (s != BT_OK) {
        fprintf(stderr, "baton bench: compute failed: %s\n", bt_cpu_error(cpu));
    } else {
        med = median(t, reps);
        *cpu_sec = median(t + reps, reps);
    }
    free(t);
    return med;
}

static void print_row(const char *op, enum bt_type type, const char *shape, int nth, double sec,
                      double csec, double flop, double wbytes, double bw, double peak) {
    printf("%-10s %-7s %-28s %3d %10.3f %9.1f %9.2f %7.1f%% %7.1f%% %9.1f\n", op, bt_type_name(type),
           shape, nth, sec * 1e3, flop / sec * 1e-9, wbytes / sec * 1e-9,
           bw > 0 ? 100.0 * wbytes / sec / bw : 0.0, peak > 0 ? 100.0 * flop / sec / peak : 0.0,
           csec > 0 ? flop / csec * 1e-9 : 0.0);
    fflush(stdout);
}

/* g timed and printed as one row per thread count of o (times divided by
 * n_copies, the independent copies of the op g holds; with `each`, a barrier
 * after every node, as a model's step has after each product, so that every
 * copy pays its own start and end-of-op tail).  Returns 0, or 1 when threads
 * cannot start or the compute fails. */
static int time_rows(const struct bench_opts *o, const struct machine *mc, struct bt_graph *g, int reps,
                     int n_copies, bool each, const char *op, enum bt_type type, const char *shape,
                     double flop, double wbytes) {
    for (int ti = 0; ti < o->n_threads; ti++) {
        bt_cpu *cpu = bt_cpu_new(o->threads[ti]);
        if (!cpu) {
            fprintf(stderr, "baton bench: cannot start %d threads\n", o->threads[ti]);
            return 1;
        }
        bt_cpu_set_barrier_every_node(cpu, each);
        double csec = 0.0;
        const double sec = time_graph(cpu, g, reps, &csec);
        bt_cpu_free(cpu);
        if (sec < 0) return 1;
        print_row(op, type, shape, o->threads[ti], sec / n_copies, csec / n_copies, flop, wbytes,
                  mc->read_bw[ti], mc->fma_peak[ti]);
    }
    return 0;
}

/* One mul_mat shape for one type, every thread count.  The graph holds
 * n_copies independent mul_mats, each with its own copy of the weights, so
 * that one run touches more than BENCH_STREAM_BYTES of weights and they are
 * read from memory, not from a last-level cache that could hold one copy
 * (32 MiB on a Zen 4 CCD, 260 MiB on some Xeons; BENCH_STREAM_BYTES is above
 * both).  With --cached one copy, read again by every call, as
 * test-backend-ops times an op: from the cache where it fits.
 * Returns 0, or 1 on an allocation / compute failure. */
static int bench_mul_mat(const struct bench_opts *o, const struct machine *mc, enum bt_type type,
                         int64_t m, int64_t n, int64_t k, int reps, bool each) {
    const size_t wsize = bt_row_size(type, k) * (size_t)m;
    /* only shapes bound by weight bandwidth (few columns) need the copies */
    int n_copies = n <= 4 && !o->cached ? (int)((BENCH_STREAM_BYTES + wsize - 1) / wsize) : 1;
    if (n_copies < 1) n_copies = 1;
    if (n_copies > BENCH_MAX_COPIES) n_copies = BENCH_MAX_COPIES;
    const size_t bytes = (wsize + sizeof(float) * (size_t)(m * n) + 4 * BT_MEM_ALIGN) * (size_t)n_copies +
                         sizeof(float) * (size_t)(k * n) +
                         (size_t)(4 * n_copies + 16) * bt_tensor_overhead() +
                         bt_graph_overhead(2 * n_copies + 8) + (1 << 20);
    bt_context *ctx = bt_init((struct bt_init_params){bytes, NULL, false});
    if (!ctx) {
        fprintf(stderr, "baton bench: cannot allocate %zu MiB for mul_mat %s\n", bytes >> 20,
                bt_type_name(type));
        return 1;
    }
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, k, n);
    struct bt_graph *g = bt_graph_new(ctx, 2 * n_copies + 8);
    bool ok = b && g && fill_random(b, 99);
    struct bt_tensor *as[BENCH_MAX_COPIES];
    for (int i = 0; i < n_copies && ok; i++) {
        struct bt_tensor *a = as[i] = bt_new_tensor_2d(ctx, type, k, m);
        struct bt_tensor *c = bt_mul_mat(ctx, a, b);
        ok = c && bt_graph_build_forward_expand(g, c) == BT_OK;
        if (!ok) break;
        /* the copies: the first one's bytes rotated by i blocks (fill_random) */
        if (i == 0) ok = fill_random(a, 1234 + (uint64_t)type);
        else rotate_copy(a->data, as[0]->data, wsize, (size_t)i * bt_type_size(type) % wsize);
    }
    const int rp = ok && !each ? repack_weights(o, as, n_copies) : 0;
    if (rp < 0) {
        bt_free(ctx);
        return 1;
    }
    if (!ok) {
        fprintf(stderr, "baton bench: cannot build mul_mat %s: %s\n", bt_type_name(type),
                bt_context_error(ctx));
        bt_free(ctx);
        return 1;
    }
    char shape[64];
    snprintf(shape, sizeof(shape), "m=%lld n=%lld k=%lld%s%s", (long long)m, (long long)n, (long long)k, rp > 0 ? " rp" : "",
             n <= 4 && o->cached ? " cached" : "");
    const double flop = 2.0 * (double)m * (double)n * (double)k;
    const double wbytes = (double)wsize;
    const int rc = time_rows(o, mc, g, reps, n_copies, each, "mul_mat", type, shape, flop, wbytes);
    bt_free(ctx);
    return rc;
}

/* The MoE shapes for one type: experts built once, every token count and
 * thread count. */
static int bench_mul_mat_id(const struct bench_opts *o, const struct machine *mc, enum bt_type type,
                            int64_t m, int64_t k, const int64_t *tokens, int n_tok, const int *reps) {
    int64_t max_tok = 0;
    for (int i = 0; i < n_tok; i++)
        if (tokens[i] > max_tok) max_tok = tokens[i];
    const size_t expert_bytes = bt_row_size(type, k) * (size_t)m;
    const size_t bytes = expert_bytes * MOE_EXPERTS +
                         sizeof(float) * (size_t)(k * max_tok + m * MOE_USED * max_tok) +
                         sizeof(int32_t) * (size_t)(MOE_USED * max_tok) +
                         (sizeof(float) * (size_t)(m * MOE_USED) + BT_MEM_ALIGN) * MOE_COPIES_1TOK +
                         (size_t)n_tok * ((16 + MOE_COPIES_1TOK) * bt_tensor_overhead() +
                                          bt_graph_overhead(8 + MOE_COPIES_1TOK)) +
                         (4 << 20);
    bt_context *ctx = bt_init((struct bt_init_params){bytes, NULL, false});
    if (!ctx) {
        fprintf(stderr, "baton bench: cannot allocate %zu MiB for mul_mat_id %s\n", bytes >> 20,
                bt_type_name(type));
        return 1;
    }
    struct bt_tensor *as = bt_new_tensor_3d(ctx, type, k, m, MOE_EXPERTS);
    if (!as || !fill_random(as, 4321 + (uint64_t)type)) {
        fprintf(stderr, "baton bench: cannot build experts: %s\n", bt_context_error(ctx));
        bt_free(ctx);
        return 1;
    }
    const int rp = repack_weights(o, &as, 1);
    if (rp < 0) {
        bt_free(ctx);
        return 1;
    }
    int rc = 0;
    for (int si = 0; si < n_tok && rc == 0; si++) {
        const int64_t nt = tokens[si];
        /* activations broadcast over the used slots (n_b = 1), as for an FFN's gate/up */
        struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, 1, nt);
        struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, MOE_USED, nt);
        const int n_copies = nt == 1 ? MOE_COPIES_1TOK : 1;
        struct bt_graph *g = bt_graph_new(ctx, 8 + MOE_COPIES_1TOK);
        bool built = g && b && ids;
        for (int cp = 0; built && cp < n_copies; cp++) {
            struct bt_tensor *c = bt_mul_mat_id(ctx, as, b, ids);
            built = c && bt_graph_build_forward_expand(g, c) == BT_OK;
        }
        if (!built || !fill_random(b, 77)) {
            fprintf(stderr, "baton bench: cannot build mul_mat_id: %s\n", bt_context_error(ctx));
            rc = 1;
            break;
        }
        /* random but deterministic routing: MOE_USED distinct experts per token */
        bool used[MOE_EXPERTS] = {false};
        uint64_t s = 0x9e3779b97f4a7c15ull + (uint64_t)nt;
        for (int64_t t = 0; t < nt; t++) {
            bool pick[MOE_EXPERTS] = {false};
            for (int e = 0; e < MOE_USED; e++) {
                int id;
                do {
                    id = (int)(rng_next(&s) % MOE_EXPERTS);
                } while (pick[id]);
                pick[id] = used[id] = true;
                ((int32_t *)ids->data)[t * MOE_USED + e] = id;
            }
        }
        int n_sel = 0;
        for (int x = 0; x < MOE_EXPERTS; x++) n_sel += used[x];

        char shape[64];
        snprintf(shape, sizeof(shape), "m=%lld k=%lld tok=%lld E%d/%d%s", (long long)m, (long long)k,
                 (long long)nt, MOE_USED, MOE_EXPERTS, rp > 0 ? " rp" : "");
        const double flop = 2.0 * (double)m * (double)k * (double)MOE_USED * (double)nt;
        const double wbytes = (double)expert_bytes * n_sel;
        rc = time_rows(o, mc, g, reps[si], n_copies, n_copies > 1, "mul_mat_id", type, shape, flop, wbytes);
    }
    bt_free(ctx);
    return rc;
}

/* A decode step's MUL_MAT_ID (1 token, n_used of n_expert experts of m x k):
 * n_copies products, each over its own n_expert experts, so that one run
 * reads at least BENCH_STREAM_BYTES of selected experts from memory.  The
 * copies' experts are views into one pool: copy c sees experts n_used * c ..
 * n_used * c + n_expert - 1 and selects its first n_used, so the selected
 * experts of all copies are distinct and the pool holds little else.  n_b:
 * the activation columns (1: broadcast to every slot, as gate and up; n_used:
 * one per slot, as down).  A barrier after every product, as in the model. */
static int bench_moe_decode(const struct bench_opts *o, const struct machine *mc, enum bt_type type, int64_t m,
                            int64_t k, int n_expert, int n_used, int64_t n_b, int reps) {
    const size_t expert_bytes = bt_row_size(type, k) * (size_t)m, sel_bytes = expert_bytes * (size_t)n_used;
    int n_copies = (int)((BENCH_STREAM_BYTES + sel_bytes - 1) / sel_bytes);
    if (n_copies > BENCH_MAX_COPIES) n_copies = BENCH_MAX_COPIES;
    const int64_t n_pool = (int64_t)n_used * n_copies + n_expert - n_used;
    const size_t bytes = expert_bytes * (size_t)n_pool + sizeof(float) * (size_t)(k * n_b) +
                         (sizeof(float) * (size_t)(m * n_used) + sizeof(int32_t) * (size_t)n_used + 4 * BT_MEM_ALIGN) *
                             (size_t)n_copies +
                         (size_t)(4 * n_copies + 16) * bt_tensor_overhead() + bt_graph_overhead(4 * n_copies + 8) +
                         (1 << 20);
    bt_context *ctx = bt_init((struct bt_init_params){bytes, NULL, false});
    if (!ctx) {
        fprintf(stderr, "baton bench: cannot allocate %zu MiB for mul_mat_id %s\n", bytes >> 20, bt_type_name(type));
        return 1;
    }
    struct bt_tensor *pool = bt_new_tensor_3d(ctx, type, k, m, n_pool);
    struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, n_b, 1);
    struct bt_graph *g = bt_graph_new(ctx, 4 * n_copies + 8);
    bool ok = pool && b && g && fill_random(pool, 4321 + (uint64_t)type) && fill_random(b, 77);
    for (int c = 0; c < n_copies && ok; c++) {
        struct bt_tensor *as = bt_view_3d(ctx, pool, k, m, n_expert, pool->nb[1], pool->nb[2],
                                          (size_t)n_used * (size_t)c * pool->nb[2]);
        struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, n_used, 1);
        struct bt_tensor *d = as && ids ? bt_mul_mat_id(ctx, as, b, ids) : NULL;
        ok = d && bt_graph_build_forward_expand(g, d) == BT_OK;
        for (int e = 0; ok && e < n_used; e++) ((int32_t *)ids->data)[e] = e;
    }
    if (!ok) {
        fprintf(stderr, "baton bench: cannot build mul_mat_id %s: %s\n", bt_type_name(type), bt_context_error(ctx));
        bt_free(ctx);
        return 1;
    }
    char shape[64];
    /* nbN: N activation columns, one per slot */
    int len = snprintf(shape, sizeof(shape), "m=%lld k=%lld tok=1 E%d/%d", (long long)m, (long long)k, n_used, n_expert);
    if (n_b > 1 && len > 0 && (size_t)len < sizeof(shape))
        snprintf(shape + len, sizeof(shape) - (size_t)len, " nb%lld", (long long)n_b);
    const double flop = 2.0 * (double)m * (double)k * n_used;
    const int rc = time_rows(o, mc, g, reps, n_copies, true, "mul_mat_id", type, shape, flop, (double)sel_bytes);
    bt_free(ctx);
    return rc;
}

/* FLASH_ATTN of T query rows at the end of n_kv cells (row t sees cells
 * 0 .. n_kv - T + t), every thread count.  FLOPs count the cells each row
 * sees (2 D for q.k, 2 Dv for the sum of v); bytes: the k and v of the cache. */
static int bench_flash_attn(const struct bench_opts *o, const struct machine *mc, int64_t T, int64_t n_kv,
                            int reps) {
    const int64_t D = 64, H = 32, Hk = 8;
    const size_t kv_bytes = 2 * bt_row_size(BT_TYPE_F16, D) * (size_t)(Hk * n_kv);
    const size_t bytes = kv_bytes + sizeof(float) * (size_t)(2 * D * H * T + n_kv * T) +
                         16 * bt_tensor_overhead() + bt_graph_overhead(8) + (1 << 20);
    bt_context *ctx = bt_init((struct bt_init_params){bytes, NULL, false});
    if (!ctx) {
        fprintf(stderr, "baton bench: cannot allocate %zu MiB for flash_attn\n", bytes >> 20);
        return 1;
    }
    struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, D, H, T);
    struct bt_tensor *k = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, n_kv);
    struct bt_tensor *v = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, n_kv);
    struct bt_tensor *m = bt_new_tensor_2d(ctx, BT_TYPE_F32, n_kv, T);
    struct bt_tensor *a = bt_flash_attn(ctx, q, k, v, m, 0.125f);
    struct bt_graph *g = a ? bt_graph_new(ctx, 8) : NULL;
    if (!g || bt_graph_build_forward_expand(g, a) != BT_OK || !fill_random(q, 5) || !fill_random(k, 6) ||
        !fill_random(v, 7)) {
        fprintf(stderr, "baton bench: cannot build flash_attn: %s\n", bt_context_error(ctx));
        bt_free(ctx);
        return 1;
    }
    double seen = 0.0;
    for (int64_t t = 0; t < T; t++) {
        float *row = (float *)m->data + t * n_kv;
        for (int64_t j = 0; j < n_kv; j++) row[j] = j <= n_kv - T + t ? 0.0f : -INFINITY;
        seen += (double)(n_kv - T + t + 1);
    }
    char shape[64];
    snprintf(shape, sizeof(shape), "T=%lld n_kv=%lld D=%lld H=%lld/%lld", (long long)T, (long long)n_kv,
             (long long)D, (long long)H, (long long)Hk);
    const double flop = seen * (double)H * 4.0 * (double)D;
    const int rc = time_rows(o, mc, g, reps, 1, false, "flash_attn", BT_TYPE_F16, shape, flop, (double)kv_bytes);
    bt_free(ctx);
    return rc;
}

/* ---- flags ---- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: baton bench ops [--threads LIST] [--types LIST] [--reps N] [--quick] [--shapes LIST]\n"
            "                       [--repacked] [--cached]\n"
            "  --threads LIST  thread counts, e.g. 1,2 (default 1,2)\n"
            "  --types LIST    weight types among f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,\n"
            "                  q2_K,q3_K,q4_K,q5_K,q6_K,mxfp4,iq4_nl,iq4_xs,iq2_xxs,\n"
            "                  iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s (default all; the\n"
            "                  1-3-bit IQ types with random blocks); f16 adds the\n"
            "                  flash_attn rows (F16 cache)\n"
            "  --reps N        timed calls per row; the median is printed (default 20 for small\n"
            "                  shapes, 5 for large ones)\n"
            "  --quick         fewer calls and a smaller bandwidth buffer (under a minute)\n"
            "  --shapes LIST   rows among all (default), decode (mul_mat m=4096 n=1 k=14336),\n"
            "                  prompt (the same at n=512), moe (mul_mat_id, 128 experts, 8 used,\n"
            "                  m=768 k=2048, at 1, 32 and 512 tokens; or one of moe1, moe32,\n"
            "                  moe512), model (a Mixtral-shaped model's decode products: d 2048,\n"
            "                  8 experts of 5632, top-2, vocabulary 32000), attn (flash_attn,\n"
            "                  with f16 among --types)\n"
            "  --repacked      the decode, prompt and moe rows' weights laid out as a CPU rank\n"
            "                  loads a model's (q8_0, q4_0, q5_0, mxfp4, q4_K, q6_K in groups\n"
            "                  of 16 rows; shape marked rp); default: plain rows, as --mmap and\n"
            "                  llama.cpp's test-backend-ops have them\n"
            "  --cached        the decode rows reuse one copy of the weights, as test-backend-ops\n"
            "                  does (default: they rotate over copies that stream from memory); a\n"
            "                  matrix the last-level cache holds is then read from there\n");
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* "1,2" -> threads; false with a message on a bad list. */
/* Each item of the comma-separated list arg (given to `flag`) to item(tok, o),
 * which prints its own message when it refuses one; false with a message
 * on a list too long or empty, or when an item is refused. */
static bool parse_list(const char *flag, const char *arg, struct bench_opts *o,
                       bool (*item)(const char *tok, struct bench_opts *o)) {
    char buf[256];
    if (strlen(arg) >= sizeof(buf)) {
        fprintf(stderr, "baton bench: %s: list too long\n", flag);
        return false;
    }
    strcpy(buf, arg);
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), n++)
        if (!item(tok, o)) return false;
    if (n == 0) {
        fprintf(stderr, "baton bench: %s: empty list\n", flag);
        return false;
    }
    return true;
}

static bool thread_item(const char *tok, struct bench_opts *o) {
    long v;
    char err[160];
    if (!parse_int(tok, 1, 1024, &v)) {
        fprintf(stderr, "baton bench: --threads: '%s' is not a thread count (1..1024)\n", tok);
        return false;
    }
    if (!bt_cli_threads_check(v, "--threads", err, sizeof err)) {
        fprintf(stderr, "baton bench: %s\n", err);
        return false;
    }
    if (o->n_threads == BENCH_MAX_THREADS) {
        fprintf(stderr, "baton bench: --threads: at most %d entries\n", BENCH_MAX_THREADS);
        return false;
    }
    o->threads[o->n_threads++] = (int)v;
    return true;
}

static bool shape_item(const char *tok, struct bench_opts *o) {
    for (size_t i = 0; i < sizeof(shape_names) / sizeof(shape_names[0]); i++)
        if (strcmp(tok, shape_names[i].name) == 0) {
            o->shapes |= shape_names[i].bits;
            return true;
        }
    fprintf(stderr, "baton bench: --shapes: '%s' is not a row group (all decode prompt moe moe1 moe32 moe512 model attn)\n",
            tok);
    return false;
}

static bool type_item(const char *tok, struct bench_opts *o) {
    for (int t = 0; t < BT_TYPE_COUNT; t++)
        if (t != BT_TYPE_I32 && t != BT_TYPE_Q8_K && !strcasecmp(tok, bt_type_name((enum bt_type)t))) {
            o->types[t] = true;
            return true;
        }
    fprintf(stderr,
            "baton bench: --types: unknown weight type '%s' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K q3_K q4_K "
            "q5_K q6_K mxfp4 iq4_nl iq4_xs iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s)\n",
            tok);
    return false;
}

/* "1,2" -> o->threads; "decode,moe1" -> o->shapes; "f16,q8_0" -> o->types */
static bool parse_threads(const char *arg, struct bench_opts *o) {
    o->n_threads = 0;
    return parse_list("--threads", arg, o, thread_item);
}

static bool parse_shapes(const char *arg, struct bench_opts *o) {
    o->shapes = 0;
    return parse_list("--shapes", arg, o, shape_item);
}

static bool parse_types(const char *arg, struct bench_opts *o) {
    memset(o->types, 0, sizeof(o->types));
    return parse_list("--types", arg, o, type_item);
}

int bt_cli_bench(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "ops") != 0) {
        fprintf(stderr, "baton bench: unknown benchmark '%s' (try: baton bench --help)\n",
                argc >= 1 ? argv[0] : "");
        return 2;
    }
    struct bench_opts o = {.threads = {1, 2}, .n_threads = 2, .reps = 0, .quick = false, .shapes = SHAPE_ALL};
    for (int t = 0; t < BT_TYPE_COUNT; t++) o.types[t] = t != BT_TYPE_I32;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--quick")) {
            o.quick = true;
        } else if (!strcmp(f, "--repacked")) {
            o.repacked = true;
        } else if (!strcmp(f, "--cached")) {
            o.cached = true;
        } else if (!strcmp(f, "--threads") || !strcmp(f, "--types") || !strcmp(f, "--reps") ||
                   !strcmp(f, "--shapes")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "baton bench: %s needs a value\n", f);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(f, "--threads")) {
                if (!parse_threads(v, &o)) return 2;
            } else if (!strcmp(f, "--types")) {
                if (!parse_types(v, &o)) return 2;
            } else if (!strcmp(f, "--shapes")) {
                if (!parse_shapes(v, &o)) return 2;
            } else {
                long r;
                if (!parse_int(v, 1, 100000, &r)) {
                    fprintf(stderr, "baton bench: --reps: '%s' is not a count (1..100000)\n", v);
                    return 2;
                }
                o.reps = (int)r;
            }
        } else {
            fprintf(stderr, "baton bench: unknown flag '%s' (try: baton bench ops --help)\n", f);
            return 2;
        }
    }

    const int reps_small = o.reps ? o.reps : o.quick ? 5 : 20;
    const int reps_large = o.reps ? o.reps : o.quick ? 2 : 5;
    const size_t bw_bytes = o.quick ? (size_t)512 << 20 : (size_t)2 << 30;

    struct machine mc;
    printf("cpu kernels: %s\n", bt_cpu_variant_name());
    for (int ti = 0; ti < o.n_threads; ti++) {
        mc.read_bw[ti] = bt_cpu_measure_read_bw(bw_bytes, o.threads[ti]);
        mc.fma_peak[ti] = bt_cpu_measure_fma_peak(o.threads[ti]);
        printf("machine: %d thread%s: streaming read %.2f GB/s (%zu MiB buffer), FMA peak %.1f GFLOP/s\n",
               o.threads[ti], o.threads[ti] == 1 ? " " : "s", mc.read_bw[ti] * 1e-9, bw_bytes >> 20,
               mc.fma_peak[ti] * 1e-9);
    }
    printf("time: median of %d calls (large shapes %d); weight GB/s: weight bytes read / time;\n"
           "%%bw: of the streaming read bandwidth, %%fma: of the FMA peak, same thread count;\n"
           "GF/cpu-s: FLOPs per second of CPU time the process used (all threads): on a machine\n"
           "shared with other work, compare kernels by this figure at 1 thread\n\n",
           reps_small, reps_large);
    printf("%-10s %-7s %-28s %3s %10s %9s %9s %8s %8s %9s\n", "op", "type", "shape", "thr", "time ms",
           "GFLOP/s", "wGB/s", "%bw", "%fma", "GF/cpu-s");

    static const enum bt_type order[] = {BT_TYPE_F32,  BT_TYPE_F16,  BT_TYPE_BF16, BT_TYPE_Q8_0,
                                         BT_TYPE_Q4_0, BT_TYPE_Q4_1, BT_TYPE_Q5_0, BT_TYPE_Q5_1,
                                         BT_TYPE_Q2_K, BT_TYPE_Q3_K, BT_TYPE_Q4_K, BT_TYPE_Q5_K,
                                         BT_TYPE_Q6_K, BT_TYPE_MXFP4, BT_TYPE_IQ4_NL, BT_TYPE_IQ4_XS,
                                         BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS, BT_TYPE_IQ2_S, BT_TYPE_IQ3_XXS,
                                         BT_TYPE_IQ3_S, BT_TYPE_IQ1_S};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        const enum bt_type t = order[i];
        if (!o.types[t]) continue;
        /* test-backend-ops' MUL_MAT perf shapes: decode and prompt (n 512), both k 14336 */
        if ((o.shapes & SHAPE_DECODE) && bench_mul_mat(&o, &mc, t, 4096, 1, 14336, reps_small, false)) return 1;
        if ((o.shapes & SHAPE_PROMPT) && bench_mul_mat(&o, &mc, t, 4096, 512, 14336, reps_large, false)) return 1;
    }
    static const int64_t all_tokens[] = {1, 32, 512};
    static const unsigned tok_shape[] = {SHAPE_MOE1, SHAPE_MOE32, SHAPE_MOE512};
    int64_t tokens[3];
    int reps_id[3], n_tok = 0;
    for (int i = 0; i < 3; i++)
        if (o.shapes & tok_shape[i]) {
            tokens[n_tok] = all_tokens[i];
            reps_id[n_tok++] = all_tokens[i] < 512 ? reps_small : reps_large;
        }
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]) && n_tok > 0; i++) {
        const enum bt_type t = order[i];
        if (!o.types[t]) continue;
        if (bench_mul_mat_id(&o, &mc, t, 768, 2048, tokens, n_tok, reps_id)) return 1;
    }
    /* a decode step's products in a Mixtral-shaped model (d_model 2048, 32/8
     * heads of 64, 8 experts of 5632, top-2, vocabulary 32000: the
     * llama-bench comparison's files), one barrier after each */
    if (o.shapes & SHAPE_MODEL)
        printf("\ndecode products of a Mixtral-shaped model (d 2048, 8 experts of 5632, top-2, vocab 32000),\n"
               "a barrier after each, as in its decode step:\n");
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]) && (o.shapes & SHAPE_MODEL); i++) {
        const enum bt_type t = order[i];
        if (!o.types[t]) continue;
        if (bench_mul_mat(&o, &mc, t, 2048, 1, 2048, reps_small, true)) return 1;  /* attn_q, attn_output */
        if (bench_mul_mat(&o, &mc, t, 512, 1, 2048, reps_small, true)) return 1;   /* attn_k, attn_v */
        if (bench_moe_decode(&o, &mc, t, 5632, 2048, 8, 2, 1, reps_small)) return 1; /* ffn_gate, ffn_up */
        if (bench_moe_decode(&o, &mc, t, 2048, 5632, 8, 2, 2, reps_small)) return 1; /* ffn_down */
        if (bench_mul_mat(&o, &mc, t, 32000, 1, 2048, reps_small, true)) return 1; /* output */
    }
    if (o.types[BT_TYPE_F16] && (o.shapes & SHAPE_ATTN)) {
        static const int64_t attn_shapes[][2] = {{512, 512}, {512, 4096}, {1, 512}, {1, 4096}};
        for (size_t i = 0; i < sizeof(attn_shapes) / sizeof(attn_shapes[0]); i++)
            if (bench_flash_attn(&o, &mc, attn_shapes[i][0], attn_shapes[i][1],
                                 attn_shapes[i][0] > 1 ? reps_large : reps_small))
                return 1;
    }
    return 0;
}
