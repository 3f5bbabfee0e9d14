/* testutil.c - see testutil.h. */
#include <stdlib.h>
#include "testutil.h"

#include "quants.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- RNG ---- */

void tu_rng_init(tu_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull; }

uint64_t tu_rng_u64(tu_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float tu_rng_f32(tu_rng *r, float lo, float hi) {
    double u = (double)(tu_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); /* [0,1) */
    float v = (float)(lo + (hi - lo) * u);
    return v < hi ? v : lo;
}

int64_t tu_rng_int(tu_rng *r, int64_t n) { return (int64_t)(tu_rng_u64(r) % (uint64_t)n); }

/* ---- tensor data ---- */

void *tu_data(const struct bt_tensor *t) {
    if (t->data) return t->data;
    if (t->view_src && tu_data(t->view_src)) return (char *)tu_data(t->view_src) + t->view_offs;
    return NULL;
}

size_t tu_offset(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return (size_t)i0 * t->nb[0] + (size_t)i1 * t->nb[1] + (size_t)i2 * t->nb[2] +
           (size_t)i3 * t->nb[3];
}

static int64_t nel(const struct bt_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

/* Write one logical row (ne0 values) of t at (i1,i2,i3). */
static void write_row(struct bt_tensor *t, int64_t i1, int64_t i2, int64_t i3, const float *v) {
    char *base = (char *)tu_data(t);
    ck_assert_msg(base != NULL, "tensor %s has no data", t->name);
    if (bt_blck_size(t->type) > 1) {
        ck_assert_msg(t->nb[0] == bt_type_size(t->type), "block tensor without contiguous rows");
        bt_row_from_f32(t->type, v, base + tu_offset(t, 0, i1, i2, i3), t->ne[0]);
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
        char *p = base + tu_offset(t, i0, i1, i2, i3);
        switch (t->type) {
        case BT_TYPE_F32: *(float *)p = v[i0]; break;
        case BT_TYPE_F16: *(bt_fp16_t *)p = bt_fp32_to_fp16(v[i0]); break;
        case BT_TYPE_BF16: *(bt_bf16_t *)p = bt_fp32_to_bf16(v[i0]); break;
        case BT_TYPE_I32: *(int32_t *)p = (int32_t)v[i0]; break;
        default: ck_abort_msg("write_row: type %d", (int)t->type);
        }
    }
}

static void read_row(const struct bt_tensor *t, int64_t i1, int64_t i2, int64_t i3, float *v) {
    const char *base = (const char *)tu_data(t);
    ck_assert_msg(base != NULL, "tensor %s has no data", t->name);
    if (bt_blck_size(t->type) > 1) {
        ck_assert_msg(t->nb[0] == bt_type_size(t->type), "block tensor without contiguous rows");
        bt_row_to_f32(t->type, base + tu_offset(t, 0, i1, i2, i3), v, t->ne[0]);
        return;
    }
    for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
        const char *p = base + tu_offset(t, i0, i1, i2, i3);
        switch (t->type) {
        case BT_TYPE_F32: v[i0] = *(const float *)p; break;
        case BT_TYPE_F16: v[i0] = bt_fp16_to_fp32(*(const bt_fp16_t *)p); break;
        case BT_TYPE_BF16: v[i0] = bt_bf16_to_fp32(*(const bt_bf16_t *)p); break;
        case BT_TYPE_I32: v[i0] = (float)*(const int32_t *)p; break;
        default: ck_abort_msg("read_row: type %d", (int)t->type);
        }
    }
}

void tu_write_f32(struct bt_tensor *t, const float *v) {
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++, k += t->ne[0]) write_row(t, i1, i2, i3, v + k);
}

float *tu_read_f32(const struct bt_tensor *t) {
    float *v = malloc(sizeof(float) * (size_t)(nel(t) > 0 ? nel(t) : 1));
    ck_assert(v != NULL);
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++, k += t->ne[0]) read_row(t, i1, i2, i3, v + k);
    return v;
}

int32_t *tu_read_i32(const struct bt_tensor *t) {
    ck_assert_int_eq(t->type, BT_TYPE_I32);
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(nel(t) > 0 ? nel(t) : 1));
    ck_assert(v != NULL);
    const char *base = (const char *)tu_data(t);
    ck_assert(base != NULL);
    int64_t k = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++)
                    v[k++] = *(const int32_t *)(base + tu_offset(t, i0, i1, i2, i3));
    return v;
}

void tu_fill_uniform(struct bt_tensor *t, tu_rng *r, float lo, float hi) {
    int64_t n = nel(t);
    if (!bt_type_can_quantize(t->type)) {
        /* the lattice types: random blocks, values about as large as hi - lo,
         * row by row (each row's blocks are packed) */
        ck_assert(t->nb[0] == bt_type_size(t->type));
        uint64_t s = (uint64_t)tu_rng_int(r, 1 << 30) * 2654435761u + 1;
        for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
                for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                    bt_row_random_blocks(t->type, (char *)t->data + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3],
                                         t->ne[0], (hi - lo) / 100.0f, &s);
        return;
    }
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    ck_assert(v != NULL);
    for (int64_t i = 0; i < n; i++) {
        if (t->type == BT_TYPE_I32)
            v[i] = (float)((int64_t)lo + tu_rng_int(r, (int64_t)hi - (int64_t)lo));
        else
            v[i] = tu_rng_f32(r, lo, hi);
    }
    tu_write_f32(t, v);
    free(v);
}

void tu_fill_ids(struct bt_tensor *t, tu_rng *r, int32_t n) { tu_fill_uniform(t, r, 0.0f, (float)n); }

double tu_nmse(const float *a, const float *ref, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(ref[i])) return INFINITY;
        if (isinf(a[i]) || isinf(ref[i])) {
            if (a[i] != ref[i]) return INFINITY;
            continue;
        }
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return num / den;
}

double tu_nmse_tensor(const struct bt_tensor *t, const float *ref) {
    float *v = tu_read_f32(t);
    double e = tu_nmse(v, ref, nel(t));
    free(v);
    return e;
}

/* ---- contexts, graphs, compute ---- */

bt_context *tu_ctx(size_t mem_mb) {
    struct bt_init_params p = {mem_mb * 1024 * 1024, NULL, false};
    bt_context *ctx = bt_init(p);
    ck_assert_msg(ctx != NULL, "bt_init(%zu MiB) failed", mem_mb);
    return ctx;
}

#define TU_MAX_THREADS 8
static bt_cpu *g_cpus[TU_MAX_THREADS + 1]; /* per process (Check forks per test) */

bt_cpu *tu_cpu(int n_threads) {
    ck_assert(n_threads >= 1 && n_threads <= TU_MAX_THREADS);
    if (!g_cpus[n_threads]) {
        g_cpus[n_threads] = bt_cpu_new(n_threads);
        ck_assert_msg(g_cpus[n_threads] != NULL, "bt_cpu_new(%d) failed", n_threads);
        ck_assert_int_eq(bt_cpu_n_threads(g_cpus[n_threads]), n_threads);
    }
    bt_cpu_set_reference(g_cpus[n_threads], false);
    return g_cpus[n_threads];
}

struct bt_graph *tu_graph(bt_context *ctx, struct bt_tensor **outs, int n) {
    struct bt_graph *g = bt_graph_new(ctx, BT_DEFAULT_GRAPH_SIZE);
    ck_assert_msg(g != NULL, "bt_graph_new: %s", bt_context_error(ctx));
    for (int i = 0; i < n; i++) {
        ck_assert_msg(outs[i] != NULL, "output %d is NULL: %s", i, bt_context_error(ctx));
        enum bt_status s = bt_graph_build_forward_expand(g, outs[i]);
        ck_assert_msg(s == BT_OK, "build_forward_expand: %s: %s", bt_status_str(s),
                      bt_context_error(ctx));
    }
    return g;
}

enum bt_status tu_run(struct bt_graph *g, int n_threads) {
    return bt_cpu_graph_compute(tu_cpu(n_threads), g);
}

void tu_compute(bt_context *ctx, struct bt_tensor *out, int n_threads) {
    struct bt_graph *g = tu_graph(ctx, &out, 1);
    enum bt_status s = tu_run(g, n_threads);
    ck_assert_msg(s == BT_OK, "compute (%d threads): %s: %s", n_threads, bt_status_str(s),
                  bt_cpu_error(tu_cpu(n_threads)));
}

void tu_stderr_begin(struct tu_stderr *c) {
    snprintf(c->path, sizeof c->path, "/tmp/bt-stderr-XXXXXX");
    c->fd = mkstemp(c->path);
    ck_assert_int_ge(c->fd, 0);
    fflush(stderr);
    c->saved = dup(2);
    ck_assert_int_ge(c->saved, 0);
    ck_assert_int_ge(dup2(c->fd, 2), 0);
}

long tu_stderr_end(struct tu_stderr *c) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    struct stat sb;
    ck_assert_int_eq(fstat(c->fd, &sb), 0);
    close(c->fd);
    unlink(c->path);
    return (long)sb.st_size;
}

int tu_run_suite(Suite *s) {
    /* BATON_CPU naming a variant of the CPU kernels that is not the one
     * running (this CPU does not run it, or the build lacks it): skipped
     * (CTest's SKIP_RETURN_CODE), not passed on another variant */
    const char *want = getenv("BATON_CPU");
    if (want && *want && strcmp(want, bt_cpu_variant_name()) != 0) {
        printf("skipped: BATON_CPU=%s, but the CPU kernels running are %s\n", want, bt_cpu_variant_name());
        srunner_free(srunner_create(s));
        return 77;
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
