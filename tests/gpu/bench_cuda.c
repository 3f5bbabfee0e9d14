/* bench_cuda.c - MUL_MAT on the GPU at a decode shape (m=4096, n=1,
 * k=14336: reading the weights dominates) and a prompt shape (m=4096, n=512,
 * k=4096: arithmetic dominates), for each weight type; prints time, TFLOP/s
 * and GB/s next to the H200's peaks (989 dense BF16 TFLOP/s, 4.8 TB/s).  A
 * benchmark: it prints figures and does not pass or fail on them.
 *
 *   bench_cuda [iterations]      (exit 77 without a device) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/backend.h"
#include "bt_cuda.h"
#include "baton/ops.h"

#define PEAK_TFLOPS 989.0 /* H200 dense BF16 */
#define PEAK_GBS 4800.0   /* H200 HBM3e */

/* a weight matrix of random values in [-1/64, 1/64), converted row by row
 * on the host */
static void fill_weight(struct bt_tensor *w, uint64_t seed) {
    const int64_t k = w->ne[0], m = w->ne[1];
    const size_t row = bt_row_size(w->type, k);
    float *f = malloc((size_t)k * sizeof(float));
    char *rows = malloc(row * 256);
    if (!f || !rows) abort();
    uint64_t s = seed;
    for (int64_t r0 = 0; r0 < m; r0 += 256) {
        const int64_t nr = m - r0 < 256 ? m - r0 : 256;
        for (int64_t r = 0; r < nr; r++) {
            for (int64_t i = 0; i < k; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                f[i] = ((float)(s >> 40) / (float)(1u << 24) - 0.5f) * 2.0f / 64.0f;
            }
            bt_row_from_f32(w->type, f, rows + (size_t)r * row, k);
        }
        bt_tensor_set(w, rows, (size_t)r0 * row, (size_t)nr * row);
    }
    free(f);
    free(rows);
}

static void bench(bt_backend_t gpu, enum bt_type type, int64_t m, int64_t n, int64_t k, int iters, const char *what) {
    bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
    struct bt_tensor *a = bt_new_tensor_2d(ctx, type, k, m);
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, k, n);
    struct bt_tensor *out = bt_mul_mat(ctx, a, b);
    struct bt_graph *g = bt_graph_new(ctx, 8);
    if (!out || !g || bt_graph_build_forward_expand(g, out) != BT_OK) abort();
    bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, gpu);
    if (!buf) {
        printf("%-7s %-5s  cannot allocate: %s\n", what, bt_type_name(type), bt_context_error(ctx));
        bt_free(ctx);
        return;
    }
    fill_weight(a, 1234);
    float *bh = malloc((size_t)(k * n) * sizeof(float));
    for (int64_t i = 0; i < k * n; i++) bh[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    bt_tensor_set(b, bh, 0, (size_t)(k * n) * sizeof(float));
    free(bh);
    for (int i = 0; i < 3; i++) /* warm up: cuBLAS heuristics, scratch */
        if (bt_backend_graph_compute(gpu, g) != BT_OK) {
            printf("%-7s %-5s  failed: %s\n", what, bt_type_name(type), bt_backend_error(gpu));
            goto done;
        }
    const double t0 = bt_now_s();
    for (int i = 0; i < iters; i++)
        if (bt_backend_graph_compute_async(gpu, g) != BT_OK) {
            printf("%-7s %-5s  failed: %s\n", what, bt_type_name(type), bt_backend_error(gpu));
            bt_backend_synchronize(gpu);
            goto done;
        }
    bt_backend_synchronize(gpu);
    const double t = (bt_now_s() - t0) / iters;
    const double flops = 2.0 * (double)m * (double)n * (double)k;
    const double bytes = (double)bt_nbytes(a) + (double)bt_nbytes(b) + (double)bt_nbytes(out);
    printf("%-7s %-5s m=%-5lld n=%-4lld k=%-6lld %9.1f us  %8.2f TFLOP/s (%5.1f%% of %.0f)  %7.0f GB/s (%5.1f%% of %.0f)\n",
           what, bt_type_name(type), (long long)m, (long long)n, (long long)k, t * 1e6, flops / t * 1e-12,
           100.0 * flops / t * 1e-12 / PEAK_TFLOPS, PEAK_TFLOPS, bytes / t * 1e-9, 100.0 * bytes / t * 1e-9 / PEAK_GBS,
           PEAK_GBS);
done:
    bt_buffer_free(buf);
    bt_free(ctx);
}

int main(int argc, char **argv) {
    if (bt_cuda_device_count() == 0) {
        printf("bench_cuda: skipped: no CUDA device\n");
        return 77;
    }
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    bt_backend_t gpu = NULL;
    char err[256];
    if (bt_backend_cuda_init(0, &gpu, err, sizeof err) != BT_OK) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        return 1;
    }
    const enum bt_type types[] = {BT_TYPE_BF16, BT_TYPE_F16, BT_TYPE_F32, BT_TYPE_Q8_0,
                                  BT_TYPE_Q4_0, BT_TYPE_Q4_K, BT_TYPE_Q6_K};
    const int n_types = (int)(sizeof types / sizeof types[0]);
    printf("mul_mat on %s, %d iterations each (peaks: H200 dense BF16 %.0f TFLOP/s, HBM %.1f TB/s)\n",
           bt_backend_name(gpu), iters, PEAK_TFLOPS, PEAK_GBS / 1000);
    for (int i = 0; i < n_types; i++) bench(gpu, types[i], 4096, 1, 14336, iters, "decode");
    for (int i = 0; i < n_types; i++) bench(gpu, types[i], 4096, 512, 4096, iters, "prompt");
    bt_backend_free(gpu);
    return 0;
}
