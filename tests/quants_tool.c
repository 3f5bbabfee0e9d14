/* quants_tool.c - byte-level cases for tests/quants_gguf.py, which checks
 * baton's block types against the gguf Python package.
 *
 *   quants_tool TYPE quantize SEED NBLOCKS OUTDIR
 *       NBLOCKS blocks' worth of random floats (several scales, a few rows of
 *       zeros and constants) -> OUTDIR/x.f32 (the input), OUTDIR/q.bin
 *       (bt_row_from_f32's bytes), OUTDIR/y.f32 (bt_row_to_f32 of those bytes)
 *       (types baton quantises to only)
 *   quants_tool TYPE dequantize SEED NBLOCKS OUTDIR
 *       NBLOCKS blocks of random bytes (fp16 fields kept finite) -> OUTDIR/q.bin
 *       and OUTDIR/y.f32 (bt_row_to_f32 of them)
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quants.h"
#include "baton/tensor.h"

static uint64_t rng_state;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rng_uniform(void) { return (float)(rng_u32() >> 8) * (1.0f / 16777216.0f); }
static float rng_normal(void) {
    const float u1 = rng_uniform() + 1e-7f, u2 = rng_uniform();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "quants_tool: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

/* The byte offsets of a block's fp16 fields (kept finite in random blocks). */
static int fp16_fields(enum bt_type t, int *off) {
    switch (t) {
    case BT_TYPE_Q8_0: case BT_TYPE_Q4_0: case BT_TYPE_Q5_0: off[0] = 0; return 1;
    case BT_TYPE_Q4_1: case BT_TYPE_Q5_1: off[0] = 0; off[1] = 2; return 2;
    case BT_TYPE_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case BT_TYPE_Q3_K: off[0] = 108; return 1;
    case BT_TYPE_Q4_K: case BT_TYPE_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case BT_TYPE_Q6_K: off[0] = 208; return 1;
    case BT_TYPE_IQ4_NL: case BT_TYPE_IQ4_XS: case BT_TYPE_IQ2_XXS: case BT_TYPE_IQ2_XS: case BT_TYPE_IQ2_S:
    case BT_TYPE_IQ3_XXS: case BT_TYPE_IQ3_S: case BT_TYPE_IQ1_S: off[0] = 0; return 1;
    default: return 0;
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: quants_tool TYPE quantize|dequantize SEED NBLOCKS OUTDIR\n");
        return 2;
    }
    enum bt_type t = BT_TYPE_COUNT;
    for (int i = 0; i < BT_TYPE_COUNT; i++)
        if (strcmp(argv[1], bt_type_name((enum bt_type)i)) == 0) t = (enum bt_type)i;
    if (t == BT_TYPE_COUNT || !bt_type_traits(t)->is_quantized) {
        fprintf(stderr, "quants_tool: %s is not a block type\n", argv[1]);
        return 2;
    }
    const bool quantize = strcmp(argv[2], "quantize") == 0;
    if (!quantize && strcmp(argv[2], "dequantize") != 0) {
        fprintf(stderr, "quants_tool: mode must be quantize or dequantize, not %s\n", argv[2]);
        return 2;
    }
    if (quantize && !bt_type_can_quantize(t)) {
        fprintf(stderr, "quants_tool: baton does not quantise to %s\n", argv[1]);
        return 2;
    }
    rng_state = strtoull(argv[3], NULL, 10) * 2654435761u + 1;
    const long nblocks = strtol(argv[4], NULL, 10);
    if (nblocks <= 0 || nblocks > 1 << 20) {
        fprintf(stderr, "quants_tool: NBLOCKS must be 1 to 2^20, not %s\n", argv[4]);
        return 2;
    }
    const int64_t blck = bt_blck_size(t), n = nblocks * blck;
    const size_t nbytes = bt_row_size(t, n);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint8_t *q = malloc(nbytes);
    if (!x || !y || !q) return 1;
    if (quantize) {
        for (int64_t b = 0; b < nblocks; b++) {
            float *xb = x + b * blck;
            const int kind = (int)(b % 8);
            const float scale = powf(10.0f, (float)((int)(rng_u32() % 7) - 4)); /* 1e-4 .. 1e2 */
            for (int64_t j = 0; j < blck; j++) {
                float v = rng_normal() * scale;
                if (kind == 5) v = 0.0f;                  /* all zero */
                if (kind == 6) v = scale;                 /* constant */
                if (kind == 7) v = fabsf(v) + scale;      /* all positive (min > 0) */
                if (kind == 4 && j % 16 == 3) v *= 20.0f; /* outliers */
                xb[j] = v;
            }
        }
        bt_row_from_f32(t, x, q, n);
        if (write_file(argv[5], "x.f32", x, (size_t)n * sizeof *x)) return 1;
    } else {
        for (size_t i = 0; i < nbytes; i++) q[i] = (uint8_t)rng_u32();
        int off[2];
        const int nf = fp16_fields(t, off);
        const size_t ts = bt_type_size(t);
        for (long b = 0; b < nblocks; b++)
            for (int f = 0; f < nf; f++) {
                uint8_t *h = q + (size_t)b * ts + off[f];
                if ((h[1] & 0x7c) == 0x7c) h[1] &= 0xbf; /* exponent 31 (inf / nan) -> 15 */
            }
    }
    bt_row_to_f32(t, q, y, n);
    if (write_file(argv[5], "q.bin", q, nbytes) || write_file(argv[5], "y.f32", y, (size_t)n * sizeof *y))
        return 1;
    free(x);
    free(y);
    free(q);
    return 0;
}
