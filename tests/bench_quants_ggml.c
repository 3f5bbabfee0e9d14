/* bench_quants_ggml.c - baton's quantisers against ggml's (llama.cpp's
 * libggml-base) on the same real-shaped random tensor: bytes identical or
 * not, and each side's NMSE (sum (x - deq(q(x)))^2 / sum x^2).  A measuring
 * tool, not a test (it needs a llama.cpp build); build and run:
 *
 *   cc -O2 -march=native -Isrc -ILLAMA/src/ggml/include tests/bench_quants_ggml.c \
 *      build/libbaton.a -LLLAMA/build/bin -lggml-base -lm -lpthread \
 *      -Wl,-rpath,LLAMA/build/bin -o build/bench_quants_ggml
 *   build/bench_quants_ggml [ROWS COLS]     (default 4096 x 4096)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "quants.h"
#include "baton/tensor.h"

static uint64_t s = 88172645463325252ull;
static float rnd_normal(void) {
    float u[2];
    for (int i = 0; i < 2; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        u[i] = ((float)(s >> 40) + 0.5f) / 16777216.0f;
    }
    return sqrtf(-2.0f * logf(u[0])) * cosf(6.2831853f * u[1]);
}

static double nmse(const float *x, const float *y, size_t n) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        r += (double)x[i] * x[i];
    }
    return e / r;
}

int main(int argc, char **argv) {
    const int64_t rows = argc > 2 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 4096;
    const size_t n = (size_t)(rows * cols);
    float *x = malloc(n * 4), *y = malloc(n * 4);
    /* a weight-like tensor: normal, per-row scale varying 0.5x..2x, rare outliers */
    for (int64_t r = 0; r < rows; r++) {
        const float rs = 0.02f * (0.5f + 1.5f * (float)((r * 7919) % rows) / (float)rows);
        for (int64_t c = 0; c < cols; c++) {
            float v = rnd_normal() * rs;
            if ((r * cols + c) % 997 == 0) v *= 8.0f;
            x[r * cols + c] = v;
        }
    }
    static const struct { enum bt_type bt; enum ggml_type gt; } types[] = {
        {BT_TYPE_Q4_0, GGML_TYPE_Q4_0}, {BT_TYPE_Q4_1, GGML_TYPE_Q4_1}, {BT_TYPE_Q5_0, GGML_TYPE_Q5_0},
        {BT_TYPE_Q5_1, GGML_TYPE_Q5_1}, {BT_TYPE_Q8_0, GGML_TYPE_Q8_0}, {BT_TYPE_Q2_K, GGML_TYPE_Q2_K},
        {BT_TYPE_Q3_K, GGML_TYPE_Q3_K}, {BT_TYPE_Q4_K, GGML_TYPE_Q4_K}, {BT_TYPE_Q5_K, GGML_TYPE_Q5_K},
        {BT_TYPE_Q6_K, GGML_TYPE_Q6_K},
    };
    printf("tensor %lld x %lld\n%-6s %12s %12s %s\n", (long long)rows, (long long)cols, "type", "nmse baton",
           "nmse ggml", "bytes");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const size_t nb = bt_row_size(types[t].bt, cols) * (size_t)rows;
        if (nb != ggml_row_size(types[t].gt, cols) * (size_t)rows) {
            printf("%s: row sizes differ\n", bt_type_name(types[t].bt));
            return 1;
        }
        uint8_t *qb = malloc(nb), *qg = malloc(nb);
        for (int64_t r = 0; r < rows; r++)
            bt_row_from_f32(types[t].bt, x + r * cols, qb + r * (nb / rows), cols);
        ggml_quantize_chunk(types[t].gt, x, qg, 0, rows, cols, NULL);
        bt_row_to_f32(types[t].bt, qb, y, (int64_t)n);
        const double eb = nmse(x, y, n);
        ggml_get_type_traits(types[t].gt)->to_float(qg, y, (int64_t)n);
        const double eg = nmse(x, y, n);
        size_t diff = 0;
        for (size_t i = 0; i < nb; i++) diff += qb[i] != qg[i];
        printf("%-6s %12.4e %12.4e %s (%zu of %zu differ)\n", bt_type_name(types[t].bt), eb, eg,
               diff ? "differ" : "identical", diff, nb);
        free(qb);
        free(qg);
    }
    free(x);
    free(y);
    return 0;
}
