/* ggml-shapes.c - llama.cpp's CPU kernels (ggml, as llama.cpp builds it) on the decode products of
 * `baton bench ops --shapes model`: a Mixtral-shaped model's decode step (d 2048, 8 experts of
 * 5632, top-2, vocabulary 32000), one token.  test-backend-ops only runs its own list of shapes;
 * this runs these, through ggml's CPU backend with a persistent thread pool, as llama.cpp does.
 * Prints one line per product: the median time of REPS calls and the weight GB/s, in the columns
 * of baton's rows (weights random, activations random, experts 0 and 1 of 8 selected).
 * Built and run by bench/ggml-shapes.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "ggml-shapes: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void fill(struct ggml_tensor *t, uint64_t seed) {
    const int64_t n = ggml_nelements(t);
    float *f = xmalloc(sizeof(float) * (size_t)n);
    uint64_t s = seed | 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        f[i] = (float)((double)(s >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
    }
    if (t->type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(t, f, 0, ggml_nbytes(t));
    } else {
        const int64_t k = t->ne[0], rows = n / k;
        void *q = xmalloc(ggml_nbytes(t));
        ggml_quantize_chunk(t->type, f, q, 0, rows, k, NULL);
        ggml_backend_tensor_set(t, q, 0, ggml_nbytes(t));
        free(q);
    }
    free(f);
}

struct shape {
    const char *op;
    int64_t m, k;
    int id;     /* 0: mul_mat, else mul_mat_id with 8 experts, 2 used */
    int per_slot; /* mul_mat_id: one activation column per used slot (ffn_down) */
};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: ggml-shapes THREADS TYPE [REPS]\n");
        return 2;
    }
    const int nth = atoi(argv[1]);
    const int reps = argc > 3 ? atoi(argv[3]) : 20;
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++)
        if (ggml_type_name((enum ggml_type)t) && strcmp(ggml_type_name((enum ggml_type)t), argv[2]) == 0)
            type = (enum ggml_type)t;
    if (type == GGML_TYPE_COUNT || nth < 1 || reps < 1) {
        fprintf(stderr, "ggml-shapes: bad arguments\n");
        return 2;
    }
    const struct shape shapes[] = {
        {"mul_mat", 2048, 2048, 0, 0},   {"mul_mat", 512, 2048, 0, 0},   {"mul_mat_id", 5632, 2048, 1, 0},
        {"mul_mat_id", 2048, 5632, 1, 1}, {"mul_mat", 32000, 2048, 0, 0},
    };
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, nth);
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(nth);
    struct ggml_threadpool *tp = ggml_threadpool_new(&tpp);
    ggml_backend_cpu_set_threadpool(be, tp);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *sh = &shapes[si];
        /* as baton's rows: n_copies products in one graph, each over its own weights (mul_mat_id:
         * views into one pool of experts, copy c selecting experts 2c and 2c + 1), so that one run
         * reads at least 768 MiB of weights from memory, not from the last-level cache */
        const size_t wsize = ggml_row_size(type, sh->k) * (size_t)sh->m * (sh->id ? 2 : 1);
        int n_copies = (int)(((size_t)768 << 20) / wsize + 1);
        if (n_copies > 32) n_copies = 32;
        struct ggml_init_params ip = {ggml_tensor_overhead() * (size_t)(8 * n_copies + 16) +
                                          ggml_graph_overhead_custom((size_t)(8 * n_copies + 16), false),
                                      NULL, true};
        struct ggml_context *ctx = ggml_init(ip);
        struct ggml_tensor *pool, *b, *ids[32] = {NULL};
        struct ggml_cgraph *g = ggml_new_graph_custom(ctx, (size_t)(8 * n_copies + 16), false);
        if (!sh->id) {
            pool = ggml_new_tensor_3d(ctx, type, sh->k, sh->m, n_copies);
            b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, sh->k, 1);
        } else {
            pool = ggml_new_tensor_3d(ctx, type, sh->k, sh->m, 2 * n_copies + 6);
            b = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, sh->k, sh->per_slot ? 2 : 1, 1);
        }
        for (int c = 0; c < n_copies; c++) {
            struct ggml_tensor *out;
            if (!sh->id) {
                out = ggml_mul_mat(ctx, ggml_view_2d(ctx, pool, sh->k, sh->m, pool->nb[1], (size_t)c * pool->nb[2]), b);
            } else {
                struct ggml_tensor *as = ggml_view_3d(ctx, pool, sh->k, sh->m, 8, pool->nb[1], pool->nb[2],
                                                      (size_t)(2 * c) * pool->nb[2]);
                ids[c] = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, 1);
                out = ggml_mul_mat_id(ctx, as, b, ids[c]);
            }
            ggml_build_forward_expand(g, out);
        }
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        if (!buf) {
            fprintf(stderr, "ggml-shapes: cannot allocate the weights of %s m=%lld k=%lld\n", sh->op,
                    (long long)sh->m, (long long)sh->k);
            return 1;
        }
        fill(pool, 1234 + si);
        fill(b, 77);
        for (int c = 0; c < n_copies; c++)
            if (ids[c]) {
                const int32_t sel[2] = {0, 1};
                ggml_backend_tensor_set(ids[c], sel, 0, sizeof sel);
            }
        ggml_backend_graph_compute(be, g); /* warm-up */
        double *t = xmalloc(sizeof(double) * (size_t)reps);
        for (int r = 0; r < reps; r++) {
            const double t0 = now_s();
            ggml_backend_graph_compute(be, g);
            t[r] = (now_s() - t0) / n_copies;
        }
        qsort(t, (size_t)reps, sizeof(double), cmp_double);
        const double med = t[reps / 2];
        printf("%-10s %-5s m=%lld k=%lld%s  %d  %8.3f ms  %7.2f GB/s\n", sh->op, argv[2], (long long)sh->m,
               (long long)sh->k, sh->id ? " E2/8" : "", nth, med * 1e3, (double)wsize / med * 1e-9);
        free(t);
        ggml_backend_buffer_free(buf);
        ggml_free(ctx);
    }
    ggml_threadpool_free(tp);
    ggml_backend_free(be);
    return 0;
}
