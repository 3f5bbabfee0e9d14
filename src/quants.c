/* quants.c - row conversions of the block types (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q2_K .. Q6_K, Q8_K) to and from F32; the layouts are in quants.h.
 *
 * Built with -ffp-contract=off (CMakeLists.txt): dequantisation must round
 * d * q and then - m separately, as ggml and the gguf Python package do, to
 * be bit-exact with them; the quantisers' searches then also take the same
 * float steps as ggml's reference quantisers they follow.
 */
#include "quants.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define QMIN(a, b) ((a) < (b) ? (a) : (b))
#define QMAX(a, b) ((a) > (b) ? (a) : (b))

/* below this a group is "all zero" (ggml's GROUP_MAX_EPS) */
#define GROUP_MAX_EPS 1e-15f

static inline float h2f(bt_fp16_t h) { return bt_fp16_to_fp32(h); }
static inline bt_fp16_t f2h(float f) { return bt_fp32_to_fp16(f); }

/* the element of largest magnitude of x[0..n): returns it, *amax its
 * magnitude (amax NULL: not wanted) */
static float signed_max(const float *x, int n, float *amax) {
    float max = 0, a = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > a) {
            a = ax;
            max = x[i];
        }
    }
    if (amax) *amax = a;
    return max;
}

/* A block's d = m / q, stored as f16 in *dh; returns 1 / d (0 when d is 0). */
static float block_scale(float m, float q, bt_fp16_t *dh) {
    const float d = m / q;
    *dh = f2h(d);
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* A row of n elements (a multiple of QKN) quantised block by block:
 * name##_block(x, y) writes block y from QKN floats x. */
#define ROW_FROM_F32(name, QKN)                                                       \
    void bt_##name##_from_f32(const float *src, void *dst, int64_t n) {               \
        bt_block_##name *y = dst;                                                     \
        for (int64_t b = 0; b < n / (QKN); b++) name##_block(src + b * (QKN), &y[b]); \
    }

/* ---- Q8_0: d = max|x| / 127, q = round(x / d) ----------------------------- */

/* roundf(v) (to nearest, ties away from zero) for |v| <= 1024, checked for
 * every float there, without roundf's libm call: the largest float below
 * 0.5 added with v's sign, then truncated */
static inline int round_away(float v) { return (int)(v + copysignf(0x1.fffffep-2f, v)); }

void bt_q8_0_from_f32(const float *src, void *dst, int64_t n) {
    bt_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float *x = src + b * BT_QK;
        float amax = 0.0f;
        for (int j = 0; j < BT_QK; j++) {
            const float a = fabsf(x[j]);
            amax = a > amax ? a : amax; /* fmaxf(amax, a), NaN ignored too, without its call */
        }
        const float id = block_scale(amax, 127.0f, &y[b].d);
        for (int j = 0; j < BT_QK; j++) y[b].qs[j] = (int8_t)round_away(x[j] * id); /* |x id| <= 127 */
    }
}
void bt_q8_0_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q8_0 *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < BT_QK; j++) dst[b * BT_QK + j] = (float)x[b].qs[j] * d;
    }
}

/* ---- Q4_0 (as ggml): the element of largest magnitude maps to -8,
 * d = max / -8, q = clamp(x/d + 8.5, 0, 15) -------------------------------- */

static void q4_0_block(const float *x, bt_block_q4_0 *y) {
    const float id = block_scale(signed_max(x, BT_QK, NULL), -8.0f, &y->d);
    for (int j = 0; j < BT_QK / 2; j++) {
        const float x0 = x[j] * id + 8.5f;
        const float x1 = x[j + BT_QK / 2] * id + 8.5f;
        const uint8_t q0 = (uint8_t)(x0 < 0 ? 0 : x0 > 15 ? 15 : (int)x0);
        const uint8_t q1 = (uint8_t)(x1 < 0 ? 0 : x1 > 15 ? 15 : (int)x1);
        y->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

void bt_q4_0_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q4_0 *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < BT_QK / 2; j++) {
            dst[b * BT_QK + j] = (float)((x[b].qs[j] & 0x0f) - 8) * d;
            dst[b * BT_QK + j + BT_QK / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ---- Q4_1 / Q5_1: min and max of the block, d = (max - min) / (2^bits - 1),
 * q = trunc((x - min) / d + 0.5) --------------------------------------------- */

static void block_min_max(const float *x, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < BT_QK; j++) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

/* A block's d = (max - min) / levels and m = min (stored as f16); returns
 * 1 / d (0 when d is 0), *min the block's minimum. */
static float block_min_scale(const float *x, float levels, bt_fp16_t *dh, bt_fp16_t *mh, float *min) {
    float max;
    block_min_max(x, min, &max);
    const float d = (max - *min) / levels;
    *dh = f2h(d);
    *mh = f2h(*min);
    return d != 0.0f ? 1.0f / d : 0.0f;
}

static void q4_1_block(const float *x, bt_block_q4_1 *y) {
    float min;
    const float id = block_min_scale(x, 15.0f, &y->d, &y->m, &min);
    for (int j = 0; j < BT_QK / 2; j++) {
        const float x0 = (x[j] - min) * id;
        const float x1 = (x[j + BT_QK / 2] - min) * id;
        const int q0 = QMIN(15, (int)(x0 + 0.5f));
        const int q1 = QMIN(15, (int)(x1 + 0.5f));
        y->qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

void bt_q4_1_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q4_1 *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float d = h2f(x[b].d), m = h2f(x[b].m);
        for (int j = 0; j < BT_QK / 2; j++) {
            dst[b * BT_QK + j] = (float)(x[b].qs[j] & 0x0f) * d + m;
            dst[b * BT_QK + j + BT_QK / 2] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void store_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Q5_0 / Q5_1's 32 quants of 5 bits: the low 4 in qs's nibbles as Q4_0's
 * (element j low, j + 16 high), the fifth bit j of qh (little-endian). */
static void q5_pack(const int q[BT_QK], uint8_t *qs, uint8_t *qh) {
    uint32_t h = 0;
    for (int j = 0; j < BT_QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + BT_QK / 2] & 0x0f) << 4));
        h |= (uint32_t)(q[j] >> 4) << j;
        h |= (uint32_t)(q[j + BT_QK / 2] >> 4) << (j + BT_QK / 2);
    }
    store_u32(qh, h);
}
static void q5_unpack(const uint8_t *qs, const uint8_t *qh, int q[BT_QK]) {
    const uint32_t h = load_u32(qh);
    for (int j = 0; j < BT_QK / 2; j++) {
        q[j] = (qs[j] & 0x0f) | (int)(((h >> j) & 1) << 4);
        q[j + BT_QK / 2] = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
    }
}

/* Q5_0: the element of largest magnitude maps to -16, d = max / -16. */
static void q5_0_block(const float *x, bt_block_q5_0 *y) {
    const float id = block_scale(signed_max(x, BT_QK, NULL), -16.0f, &y->d);
    int q[BT_QK];
    for (int j = 0; j < BT_QK; j++) q[j] = QMIN(31, (int)(x[j] * id + 16.5f));
    q5_pack(q, y->qs, y->qh);
}

void bt_q5_0_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q5_0 *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float d = h2f(x[b].d);
        int q[BT_QK];
        q5_unpack(x[b].qs, x[b].qh, q);
        for (int j = 0; j < BT_QK; j++) dst[b * BT_QK + j] = (float)(q[j] - 16) * d;
    }
}

static void q5_1_block(const float *x, bt_block_q5_1 *y) {
    float min;
    const float id = block_min_scale(x, 31.0f, &y->d, &y->m, &min);
    int q[BT_QK];
    for (int j = 0; j < BT_QK; j++) q[j] = QMIN(31, (int)((x[j] - min) * id + 0.5f));
    q5_pack(q, y->qs, y->qh);
}

void bt_q5_1_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q5_1 *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float d = h2f(x[b].d), m = h2f(x[b].m);
        int q[BT_QK];
        q5_unpack(x[b].qs, x[b].qh, q);
        for (int j = 0; j < BT_QK; j++) dst[b * BT_QK + j] = (float)q[j] * d + m;
    }
}

/* ---- K-quant scale searches ------------------------------------------------ */

/* Scale and min for n values x with weights w, q = L[i] in 0..nmax:
 * x ~ scale * L - the_min.  Starts from the range's own grid, then tries
 * nstep+1 grids of (nmax + rmin + rdelta*is) steps across the range and keeps
 * the weighted least-squares fit (a closed-form scale and min per grid) of
 * smallest weighted error (absolute if use_mad, squared otherwise). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = bt_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)QMAX(0, QMIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += w[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = bt_nearest_int(iscale * (x[i] - min));
            l = QMAX(0, QMIN(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* x on the grid of iscale, q = clamp(round(iscale x), -nmax, nmax-1) stored
 * as L[i] = q + off; the x^2-weighted sums of x q and q^2 */
static void fit_grid(const float *x, int n, int nmax, float iscale, int off, int8_t *L, float *sumlx, float *suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = bt_nearest_int(iscale * x[i]);
        l = QMAX(-nmax, QMIN(nmax - 1, l));
        L[i] = (int8_t)(l + off);
        const float w = x[i] * x[i];
        *sumlx += w * x[i] * l;
        *suml2 += w * l * l;
    }
}

/* The element of largest magnitude of a group of n in *max; false, with L
 * zeroed, for a group of (near) zeros. */
static bool group_max(const float *x, int n, int8_t *L, float *max) {
    float amax;
    *max = signed_max(x, n, &amax);
    if (amax >= GROUP_MAX_EPS) return true;
    for (int i = 0; i < n; i++) L[i] = 0;
    return false;
}

/* Symmetric scale for n values, L[i] = q + nmax with q in -nmax..nmax-1:
 * starts from the grid through the element of largest magnitude, then moves
 * single quants while the x^2-weighted fit improves (up to 5 sweeps). */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max;
    if (!group_max(x, n, L, &max)) return 0.f;
    float sumlx, suml2;
    fit_grid(x, n, nmax, -nmax / max, 0, L, &sumlx, &suml2);
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = bt_nearest_int(x[i] * sl2 / slx);
                new_l = QMAX(-nmax, QMIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Symmetric scale for n values, L[i] = q + nmax, q in -nmax..nmax-1, weights
 * x^2: the x^2-weighted least-squares scale over 19 grids around the one
 * through the element of largest magnitude (ggml's make_qx_quants with
 * rmse_type 1 and no importance weights). */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max;
    if (!group_max(x, n, L, &max)) return 0.f;
    float iscale = -nmax / max;
    float sumlx, suml2;
    fit_grid(x, n, nmax, iscale, nmax, L, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = bt_nearest_int(iscale * x[i]);
            l = QMAX(-nmax, QMIN(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = bt_nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + QMAX(-nmax, QMIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Four 2-bit values per byte: element j + 32s (s 0..3) of each 128 at bits 2s
 * of byte j of that 128's 32 bytes (Q2_K and Q3_K's low bits). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < BT_QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                      (L[j + l + 96] << 6));
}

/* ---- Q2_K ------------------------------------------------------------------ */

void bt_q2_K_from_f32(const float *src, void *dst, int64_t n) {
    bt_block_q2_K *y = dst;
    uint8_t L[BT_QK_K], Laux[16];
    float w[16], mins[16], scales[16];
    const float q4scale = 15.f;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float *x = src + b * BT_QK_K;
        float max_scale = 0, max_min = 0; /* the min is subtracted: scales are >= 0 */
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], Laux, -0.5f,
                                         0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < 16; j++) y[b].scales[j] = (uint8_t)bt_nearest_int(iscale * scales[j]);
            y[b].d = f2h(max_scale / q4scale);
        } else {
            for (int j = 0; j < 16; j++) y[b].scales[j] = 0;
            y[b].d = f2h(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < 16; j++)
                y[b].scales[j] |= (uint8_t)(bt_nearest_int(iscale * mins[j]) << 4);
            y[b].dmin = f2h(max_min / q4scale);
        } else {
            y[b].dmin = f2h(0.f);
        }
        /* requantise against the stored (rounded) scales and mins */
        for (int j = 0; j < 16; j++) {
            const float d = h2f(y[b].d) * (y[b].scales[j] & 0xF);
            if (!d) continue;
            const float dm = h2f(y[b].dmin) * (y[b].scales[j] >> 4);
            for (int i = 0; i < 16; i++) {
                const int l = bt_nearest_int((x[16 * j + i] + dm) / d);
                L[16 * j + i] = (uint8_t)QMAX(0, QMIN(3, l));
            }
        }
        pack_2bit(L, y[b].qs);
    }
}

void bt_q2_K_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q2_K *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d), dmin = h2f(x[b].dmin);
        float *y = dst + b * BT_QK_K;
        for (int j = 0; j < BT_QK_K; j++) {
            const int half = j / 128, s = (j % 128) / 32, l = j % 32;
            const int q = (x[b].qs[32 * half + l] >> (2 * s)) & 3;
            const uint8_t sc = x[b].scales[j / 16];
            const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            y[j] = dl * (float)q - ml;
        }
    }
}

/* ---- Q3_K ------------------------------------------------------------------ */

/* The 16 sub-blocks' scales of a 256-element block (make: make_q3_quants or
 * make_qx_quants with nmax); returns the scale of largest magnitude, *amax
 * that magnitude. */
static float sub_scales_16(const float *x, int8_t *L, float scales[16],
                           float (*make)(int, int, const float *, int8_t *), int nmax, float *amax) {
    for (int j = 0; j < 16; j++) scales[j] = make(16, nmax, x + 16 * j, L + 16 * j);
    return signed_max(scales, 16, amax);
}

/* Each sub-block's values again on the block's stored scale d0 * sc[j]:
 * L = clamp(round(x / d), lo, hi) - lo (a sub-block of scale 0 keeps L). */
static void requant_16(const float *x, float d0, const int8_t sc[16], int lo, int hi, int8_t *L) {
    for (int j = 0; j < 16; j++) {
        const float d = d0 * sc[j];
        if (!d) continue;
        for (int i = 0; i < 16; i++) {
            const int l = bt_nearest_int(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)(QMAX(lo, QMIN(hi, l)) - lo);
        }
    }
}

static void q3_K_block(const float *x, bt_block_q3_K *y) {
    int8_t L[BT_QK_K];
    float scales[16];
    float amax;
    const float max_scale = sub_scales_16(x, L, scales, make_q3_quants, 4, &amax);
    memset(y->scales, 0, 12);
    if (max_scale) {
        const float iscale = -32.f / max_scale;
        for (int j = 0; j < 16; j++) {
            int l = bt_nearest_int(iscale * scales[j]);
            l = QMAX(-32, QMIN(31, l)) + 32; /* 0..63 */
            if (j < 8)
                y->scales[j] = (uint8_t)(l & 0xF);
            else
                y->scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            y->scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        y->d = f2h(1 / iscale);
    } else {
        y->d = f2h(0.f);
    }
    int8_t sc[16];
    bt_q3_K_scales(y->scales, sc);
    requant_16(x, h2f(y->d), sc, -4, 3, L);
    /* high bit of element j into bit j/32 of hmask[j%32]; low 2 bits packed */
    uint8_t lo[BT_QK_K];
    memset(y->hmask, 0, sizeof y->hmask);
    for (int j = 0; j < BT_QK_K; j++) {
        int l = L[j];
        if (l > 3) {
            y->hmask[j % 32] |= (uint8_t)(1 << (j / 32));
            l -= 4;
        }
        lo[j] = (uint8_t)l;
    }
    pack_2bit(lo, y->qs);
}

void bt_q3_K_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q3_K *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        int8_t sc[16];
        bt_q3_K_scales(x[b].scales, sc);
        float *y = dst + b * BT_QK_K;
        for (int j = 0; j < BT_QK_K; j++) {
            const int half = j / 128, s = (j % 128) / 32, l = j % 32;
            const int lo = (x[b].qs[32 * half + l] >> (2 * s)) & 3;
            const int hi = (x[b].hmask[l] >> (j / 32)) & 1;
            const float dl = d * (float)sc[j / 16];
            y[j] = dl * (float)(lo - (hi ? 0 : 4));
        }
    }
}

/* ---- Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins ------------- */

/* Scales and mins of the 8 sub-blocks of x (L gets their quants, 0..nmax),
 * quantised to 6 bits into the 12 packed bytes, then every element requantised
 * against the stored (rounded) values. */
static void qk_scales_mins(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                           uint8_t packed[12], bt_fp16_t *dh, bt_fp16_t *dminh) {
    float w[32], mins[8], scales[8];
    uint8_t Laux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                     nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; j++) {
        const uint8_t ls = (uint8_t)QMIN(63, (uint8_t)bt_nearest_int(inv_scale * scales[j]));
        const uint8_t lm = (uint8_t)QMIN(63, (uint8_t)bt_nearest_int(inv_min * mins[j]));
        if (j < 4) {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *dh = f2h(max_scale / 63.f);
    *dminh = f2h(max_min / 63.f);
    uint8_t scs[8], ms[8];
    bt_q4_K_scales_mins(packed, scs, ms);
    for (int j = 0; j < 8; j++) {
        const float d = h2f(*dh) * scs[j];
        if (!d) continue;
        const float dm = h2f(*dminh) * ms[j];
        for (int i = 0; i < 32; i++) {
            const int l = bt_nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)QMAX(0, QMIN(nmax, l));
        }
    }
}

static void q4_K_block(const float *x, bt_block_q4_K *y) {
    uint8_t L[BT_QK_K];
    qk_scales_mins(x, 15, -1.f, 20, L, y->scales, &y->d, &y->dmin);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * g + l] = (uint8_t)(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
}

/* One Q4_K or Q5_K block (qh NULL: Q4_K): eight sub-blocks of 32, each
 * d * scale * q - dmin * min, q's low 4 bits in qs and Q5_K's fifth in qh. */
static void q45_K_block_to_f32(const uint8_t *scales, float d, float dmin, const uint8_t *qs, const uint8_t *qh,
                               float *y) {
    uint8_t sc[8], m[8];
    bt_q4_K_scales_mins(scales, sc, m);
    for (int j = 0; j < 8; j++) {
        const float d1 = d * sc[j], m1 = dmin * m[j];
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> shift) & 0xF) | (qh ? ((qh[l] >> j) & 1) << 4 : 0);
            y[32 * j + l] = d1 * (float)v - m1;
        }
    }
}

void bt_q4_K_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q4_K *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++)
        q45_K_block_to_f32(x[b].scales, h2f(x[b].d), h2f(x[b].dmin), x[b].qs, NULL, dst + b * BT_QK_K);
}

static void q5_K_block(const float *x, bt_block_q5_K *y) {
    uint8_t L[BT_QK_K];
    qk_scales_mins(x, 31, -0.5f, 15, L, y->scales, &y->d, &y->dmin);
    memset(y->qh, 0, sizeof y->qh);
    for (int g = 0; g < 4; g++) {
        for (int l = 0; l < 32; l++) {
            int l1 = L[64 * g + l], l2 = L[64 * g + 32 + l];
            if (l1 > 15) {
                l1 -= 16;
                y->qh[l] |= (uint8_t)(1 << (2 * g));
            }
            if (l2 > 15) {
                l2 -= 16;
                y->qh[l] |= (uint8_t)(2 << (2 * g));
            }
            y->qs[32 * g + l] = (uint8_t)(l1 | (l2 << 4));
        }
    }
}

void bt_q5_K_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q5_K *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++)
        q45_K_block_to_f32(x[b].scales, h2f(x[b].d), h2f(x[b].dmin), x[b].qs, x[b].qh, dst + b * BT_QK_K);
}

/* ---- Q6_K ------------------------------------------------------------------ */

static void q6_K_block(const float *x, bt_block_q6_K *y) {
    int8_t L[BT_QK_K];
    float scales[16];
    float max_abs_scale;
    const float max_scale = sub_scales_16(x, L, scales, make_qx_quants, 32, &max_abs_scale);
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -128.f / max_scale;
    y->d = f2h(1 / iscale);
    for (int j = 0; j < 16; j++) y->scales[j] = (int8_t)QMIN(127, bt_nearest_int(iscale * scales[j]));
    requant_16(x, h2f(y->d), y->scales, -32, 31, L);
    bt_q6_K_pack((const uint8_t *)L, y->ql, y->qh);
}

void bt_q6_K_pack(const uint8_t *v, uint8_t *ql, uint8_t *qh) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *vh = v + 128 * h;
        uint8_t *l0 = ql + 64 * h, *h0 = qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            l0[l] = (uint8_t)((vh[l] & 0xF) | ((vh[l + 64] & 0xF) << 4));
            l0[l + 32] = (uint8_t)((vh[l + 32] & 0xF) | ((vh[l + 96] & 0xF) << 4));
            h0[l] = (uint8_t)((vh[l] >> 4) | ((vh[l + 32] >> 4) << 2) | ((vh[l + 64] >> 4) << 4) |
                              ((vh[l + 96] >> 4) << 6));
        }
    }
}

/* element 128 h + 32 s + l: the loops run over the 16 elements of one
 * scale with l innermost, so that the compiler can vectorise them (a
 * prompt's GET_ROWS of 512 rows of a Q6_K token_embd of 2048: 3.8-4.0 ms
 * a value at a time, 2.9-3.1 ms so, on an AVX-512 Xeon) */
void bt_q6_K_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q6_K *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        float *y = dst + b * BT_QK_K;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int l0 = 0; l0 < 32; l0 += 16) {
                    const int j0 = 128 * h + 32 * s + l0;
                    const float dl = d * (float)x[b].scales[j0 / 16];
                    const uint8_t *ql = x[b].ql + 64 * h + 32 * (s & 1) + l0, *qh = x[b].qh + 32 * h + l0;
                    for (int l = 0; l < 16; l++) {
                        const int lo = (ql[l] >> (4 * (s >> 1))) & 0xF, hi = (qh[l] >> (2 * s)) & 3;
                        y[j0 + l] = dl * (float)((lo | (hi << 4)) - 32);
                    }
                }
    }
}

/* The rows of the block quantisers above (quants.h). */
ROW_FROM_F32(q4_0, BT_QK)
ROW_FROM_F32(q4_1, BT_QK)
ROW_FROM_F32(q5_0, BT_QK)
ROW_FROM_F32(q5_1, BT_QK)
ROW_FROM_F32(q3_K, BT_QK_K)
ROW_FROM_F32(q4_K, BT_QK_K)
ROW_FROM_F32(q5_K, BT_QK_K)
ROW_FROM_F32(q6_K, BT_QK_K)

/* ---- Q8_K: d = max / -127 (the element of largest magnitude maps to -127) -- */

void bt_q8_K_from_f32(const float *src, void *dst, int64_t n) {
    bt_block_q8_K *y = dst;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float *x = src + b * BT_QK_K;
        float amax;
        const float max = signed_max(x, BT_QK_K, &amax);
        if (!amax) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < BT_QK_K; j++) y[b].qs[j] = (int8_t)QMIN(127, bt_nearest_int(iscale * x[j]));
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * j + i];
            y[b].bsums[j] = (int16_t)sum;
        }
        y[b].d = 1 / iscale;
    }
}

void bt_q8_K_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_q8_K *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++)
        for (int j = 0; j < BT_QK_K; j++) dst[b * BT_QK_K + j] = x[b].d * (float)x[b].qs[j];
}

/* ---- the table types: MXFP4, IQ4_NL, IQ4_XS ------------------------------- */

const int8_t bt_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t bt_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 32 nibbles (Q4_0's order: element j low nibble of qs[j], j+16 high) of the
 * table values tab, times d */
static void nibbles_to_f32(const uint8_t *qs, const int8_t *tab, float d, float *y) {
    for (int j = 0; j < BT_QK / 2; j++) {
        y[j] = d * (float)tab[qs[j] & 0xF];
        y[j + BT_QK / 2] = d * (float)tab[qs[j] >> 4];
    }
}

/* MXFP4 (ggml's quantize_row_mxfp4_ref): e = floor(log2 max|x|) - 2 + 127, so
 * that the largest magnitude lands in 4..8 times 2^(e-127), then each element
 * the nearest of the 16 values (the first on a tie).  Blocks whose exponent
 * would fall below 0 (max|x| < 2^-125) take e = 0, where ggml's cast is
 * undefined. */
void bt_mxfp4_from_f32(const float *src, void *dst, int64_t n) {
    bt_block_mxfp4 *y = dst;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float *x = src + b * BT_QK;
        float amax = 0.0f;
        for (int j = 0; j < BT_QK; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        const float fe = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        const uint8_t e = (uint8_t)(fe < 0.0f ? 0.0f : fe > 255.0f ? 255.0f : fe);
        const float d = bt_e8m0_half(e);
        y[b].e = e;
        for (int j = 0; j < BT_QK; j++) {
            int best = 0;
            float best_err = fabsf((float)bt_mxfp4_values[0] * d - x[j]);
            for (int i = 1; i < 16; i++) {
                const float err = fabsf((float)bt_mxfp4_values[i] * d - x[j]);
                if (err < best_err) {
                    best = i;
                    best_err = err;
                }
            }
            if (j < BT_QK / 2)
                y[b].qs[j] = (uint8_t)best;
            else
                y[b].qs[j - BT_QK / 2] |= (uint8_t)(best << 4);
        }
    }
}
void bt_mxfp4_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_mxfp4 *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) nibbles_to_f32(x[b].qs, bt_mxfp4_values, bt_e8m0_half(x[b].e), dst + b * BT_QK);
}

/* index of the level of bt_iq4nl_values nearest x (ggml's best_index_int8:
 * a bisection, the lower level on a tie) */
static int iq4_best_index(float x) {
    const int8_t *v = bt_iq4nl_values;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < v[mav]) mu = mav;
        else ml = mav;
    }
    return x - v[mu - 1] < v[mu] - x ? mu - 1 : mu;
}

#define IQ4_NTRY 7 /* scales tried each side of the first guess (ggml's ntry) */

/* The scale of 32 values x against the 16 levels, weights x^2 (ggml's
 * quantize_row_iq4_nl_impl without an importance matrix): the weighted
 * least-squares scale of the levels chosen by max|x| / 127, then of those
 * chosen by 2 IQ4_NTRY + 1 other guesses (-127 + t) / max, keeping the best
 * fit; L gets the levels of the first guess.  0 for a block of (near) zeros,
 * L then untouched. */
static float iq4_block_scale(const float *x, uint8_t *L) {
    const int8_t *v = bt_iq4nl_values;
    float amax;
    const float max = signed_max(x, 32, &amax);
    if (amax < GROUP_MAX_EPS) return 0.0f;
    float d = -max / v[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; j++) {
        const int l = iq4_best_index(id * x[j]);
        L[j] = (uint8_t)l;
        const float q = v[l], w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -IQ4_NTRY; itry <= IQ4_NTRY; itry++) {
        id = (itry + v[0]) / max;
        sumqx = sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float q = v[iq4_best_index(id * x[j])], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 levels -> 16 bytes, Q4_0's nibble order */
static void pack_nibbles(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

void bt_iq4_nl_from_f32(const float *src, void *dst, int64_t n) {
    bt_block_iq4_nl *y = dst;
    for (int64_t b = 0; b < n / BT_QK; b++) {
        const float *x = src + b * BT_QK;
        uint8_t L[32];
        const float d = iq4_block_scale(x, L);
        y[b].d = f2h(d);
        /* levels against the unrounded scale, as ggml */
        const float id = d ? 1 / d : 0;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_best_index(id * x[j]);
        pack_nibbles(L, y[b].qs);
    }
}
void bt_iq4_nl_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq4_nl *x = src;
    for (int64_t b = 0; b < n / BT_QK; b++) nibbles_to_f32(x[b].qs, bt_iq4nl_values, h2f(x[b].d), dst + b * BT_QK);
}

/* IQ4_XS: each sub-block's scale as IQ4_NL's, then d = -(the one of largest
 * magnitude) / 32, the scales rounded to d * (-32..31) and the levels
 * chosen again against them (ggml's quantize_iq4_xs without an importance
 * matrix). */
void bt_iq4_xs_from_f32(const float *src, void *dst, int64_t n) {
    bt_block_iq4_xs *y = dst;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float *x = src + b * BT_QK_K;
        uint8_t L[BT_QK_K];
        float scales[8], max_scale = 0, amax_scale = 0;
        for (int ib = 0; ib < 8; ib++) {
            scales[ib] = iq4_block_scale(x + 32 * ib, L + 32 * ib);
            if (fabsf(scales[ib]) > amax_scale) {
                amax_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        const float d = -max_scale / 32;
        y[b].d = f2h(d);
        y[b].scales_h = 0;
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < 8; ib++) {
            int l = bt_nearest_int(id * scales[ib]);
            l = QMAX(-32, QMIN(31, l));
            const float dl = d * l;
            const float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[32 * ib + j] = (uint8_t)iq4_best_index(idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0) y[b].scales_l[ib / 2] = (uint8_t)(l & 0xF);
            else y[b].scales_l[ib / 2] |= (uint8_t)((l & 0xF) << 4);
            y[b].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < 8; ib++) pack_nibbles(L + 32 * ib, y[b].qs + 16 * ib);
    }
}
void bt_iq4_xs_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq4_xs *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        for (int ib = 0; ib < 8; ib++) {
            const float dl = d * (float)(bt_iq4_xs_scale(&x[b], ib) - 32);
            nibbles_to_f32(x[b].qs + 16 * ib, bt_iq4nl_values, dl, dst + b * BT_QK_K + 32 * ib);
        }
    }
}

/* ---- the lattice types: dequantisation ------------------------------------ *
 * Each group of 8 (IQ2, IQ1) or 4 (IQ3) elements is a lattice point; the
 * sub-block scale db is formed in float as the gguf package forms it, then
 * x = (db * grid) * sign (the sign exact). */

static inline int8_t grid_elem(uint64_t entry, int j) { return (int8_t)(uint8_t)(entry >> (8 * j)); }

/* 8 elements from a grid entry, signs (bit j: element j negative) */
static void grid8(float db, uint64_t entry, uint8_t signs, float *y) {
    for (int j = 0; j < 8; j++) {
        const float v = db * (float)grid_elem(entry, j);
        y[j] = (signs >> j) & 1 ? -v : v;
    }
}
static void grid4(float db, uint32_t entry, uint8_t signs, float *y) {
    for (int j = 0; j < 4; j++) {
        const float v = db * (float)(int8_t)(uint8_t)(entry >> (8 * j));
        y[j] = (signs >> j) & 1 ? -v : v;
    }
}
static inline uint32_t u32_at(const uint16_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 16; }

void bt_iq2_xxs_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq2_xxs *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t idx = u32_at(x[b].qs + 4 * ib), sg = u32_at(x[b].qs + 4 * ib + 2);
            const float db = d * (0.5f + (float)(sg >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++)
                grid8(db, bt_iq2xxs_grid[(idx >> (8 * l)) & 0xFF], bt_iq2_signs[(sg >> (7 * l)) & 127],
                      dst + b * BT_QK_K + 32 * ib + 8 * l);
        }
    }
}

/* IQ2_XS / IQ2_S: group g's scale, d (0.5 + ls) / 4 with the block's d and
 * ls 4 bits a group of 16 */
static float iq2_db(bt_fp16_t d, const uint8_t *scales, int g) {
    const int ls = (scales[g / 4] >> (4 * ((g / 2) % 2))) & 0xF;
    return h2f(d) * (0.5f + (float)ls) * 0.25f;
}

void bt_iq2_xs_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq2_xs *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        for (int g = 0; g < 32; g++) {
            const float db = iq2_db(x[b].d, x[b].scales, g);
            grid8(db, bt_iq2xs_grid[x[b].qs[g] & 511], bt_iq2_signs[x[b].qs[g] >> 9], dst + b * BT_QK_K + 8 * g);
        }
    }
}

void bt_iq2_s_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq2_s *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        for (int g = 0; g < 32; g++) {
            const float db = iq2_db(x[b].d, x[b].scales, g);
            const int idx = x[b].qs[g] | (((x[b].qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
            grid8(db, bt_iq2s_grid[idx], x[b].signs[g], dst + b * BT_QK_K + 8 * g);
        }
    }
}

void bt_iq3_xxs_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq3_xxs *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        const uint8_t *sas = x[b].qs + BT_QK_K / 4;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t sg;
            memcpy(&sg, sas + 4 * ib, 4);
            const float db = d * (0.5f + (float)(sg >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                const uint8_t s = bt_iq2_signs[(sg >> (7 * l)) & 127];
                float *y = dst + b * BT_QK_K + 32 * ib + 8 * l;
                grid4(db, bt_iq3xxs_grid[x[b].qs[8 * ib + 2 * l]], s & 0xF, y);
                grid4(db, bt_iq3xxs_grid[x[b].qs[8 * ib + 2 * l + 1]], s >> 4, y + 4);
            }
        }
    }
}

void bt_iq3_s_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq3_s *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        for (int q = 0; q < 64; q++) {
            const int sb = q / 8; /* 32-element sub-block */
            const int ls = (x[b].scales[sb / 2] >> (4 * (sb % 2))) & 0xF;
            const float db = d * (float)(1 + 2 * ls);
            const int idx = x[b].qs[q] | (((x[b].qh[q / 8] >> (q % 8)) & 1) << 8);
            const uint8_t s = (uint8_t)(x[b].signs[q / 2] >> (4 * (q % 2)));
            grid4(db, bt_iq3s_grid[idx], s & 0xF, dst + b * BT_QK_K + 4 * q);
        }
    }
}

void bt_iq1_s_to_f32(const void *src, float *dst, int64_t n) {
    const bt_block_iq1_s *x = src;
    for (int64_t b = 0; b < n / BT_QK_K; b++) {
        const float d = h2f(x[b].d);
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = x[b].qh[ib];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -BT_IQ1S_DELTA : BT_IQ1S_DELTA;
            for (int l = 0; l < 4; l++) {
                const uint64_t e = bt_iq1s_grid[x[b].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
                float *y = dst + b * BT_QK_K + 32 * ib + 8 * l;
                for (int j = 0; j < 8; j++) y[j] = dl * ((float)grid_elem(e, j) + delta);
            }
        }
    }
}

/* ---- random blocks -------------------------------------------------------- */

void bt_row_random_blocks(enum bt_type t, void *dst, int64_t n, float scale, uint64_t *state) {
    BT_ASSERT(t == BT_TYPE_IQ2_XXS || t == BT_TYPE_IQ2_XS || t == BT_TYPE_IQ2_S || t == BT_TYPE_IQ3_XXS ||
              t == BT_TYPE_IQ3_S || t == BT_TYPE_IQ1_S);
    const size_t ts = bt_type_size(t), nb = bt_row_size(t, n);
    uint8_t *p = dst;
    uint64_t s = *state | 1;
    for (size_t i = 0; i < nb; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (uint8_t)(s >> 32);
    }
    for (size_t b = 0; b < nb / ts; b++) {
        /* d (the block's first two bytes) in [scale / 2, scale) */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        const bt_fp16_t d = f2h(scale * (0.5f + (float)(s >> 41) * 0x1p-24f));
        memcpy(p + b * ts, &d, 2);
    }
    *state = s;
}
