/* attn.c - FLASH_ATTN on the CPU: softmax(s * q k^T + mask) v with an online
 * softmax, one pass over the cells, no [N, T] score matrix.
 *
 *   q    F32 [D, H, T]        k [D, Hk, N], v [Dv, Hk, N] (F32, F16, Q8_0)
 *   mask F32/F16 [N, >= T]    out F32 [Dv, H, T] contiguous
 *
 * Threads split the (query row t, kv head) units; a unit computes the whole
 * output rows of the q heads that share that kv head (each row with its own
 * arithmetic; the group only shares the conversion of k/v rows to F32), so
 * there is no reduction across threads.
 *
 * Determinism: a row's result depends only on its own q row and on the
 * sequence of cells it sees (the unmasked cells, in increasing cell order,
 * with their k, v and mask values).  A cell whose mask is -inf is skipped
 * before anything is computed from it, so masked cells (another sequence's,
 * future positions, empty cells) leave no trace in the running maximum or
 * the sums.  Every per-cell step is the same code for every row: the dot
 * product over D has one fixed order (8 strided partial sums combined in a
 * fixed tree), the update
 *     s > M:  r = exp(M - s); M = s;  acc = acc*r + v;   S = S*r + 1
 *     else:   e = exp(s - M);         acc = acc + v*e;   S = S + e
 * is element-wise.  So the result is bitwise the same for any thread count,
 * any number of other rows in the batch, any row position, and any placement
 * of the cells in the cache that keeps their relative order.
 *
 * Scratch per thread: see per_thread_bytes.
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

/* Scratch per thread for one unit (query row t, kv head hk) and its `group`
 * q heads: their q rows, one k and one v row as F32, their accumulators and
 * running maximum / sum. */
static size_t per_thread_bytes(const struct bt_tensor *node) {
    const int64_t D = node->src[0]->ne[0], Dv = node->src[2]->ne[0];
    const int64_t group = node->src[0]->ne[1] / node->src[1]->ne[1];
    const size_t n = (size_t)(group * (D + Dv + 2) + D + Dv) * sizeof(float);
    return (n + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN;
}

size_t bt_cpu_flash_attn_work_size(const struct bt_tensor *node, int nth) {
    return per_thread_bytes(node) * (size_t)(nth > 0 ? nth : 1);
}

bool bt_cpu_flash_attn_supported(const struct bt_tensor *node) {
    return bt_op_is_well_formed(node);
}

/* One fixed order of summation, whatever the caller. */
static float dot_fixed(const float *a, const float *b, int64_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) s[l] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static inline float mask_at(const struct bt_tensor *mask, int64_t j, int64_t t) {
    const char *p = (const char *)mask->data + j * mask->nb[0] + t * mask->nb[1];
    if (mask->type == BT_TYPE_F16) return bt_fp16_to_fp32(*(const bt_fp16_t *)p);
    return *(const float *)p;
}

/* F16 -> F32 is exact, so the hardware conversion gives the same bits as
 * bt_fp16_to_fp32. */
static void f16_to_f32(const bt_fp16_t *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = bt_fp16_to_fp32(x[i]);
}

/* Row j of a head of k or v as F32: the data itself for F32, else converted
 * into buf. */
static inline const float *row_f32(const struct bt_tensor *t, int64_t h, int64_t j, float *buf) {
    const char *p = (const char *)t->data + h * t->nb[1] + j * t->nb[2];
    if (t->type == BT_TYPE_F32) return (const float *)p;
    if (t->type == BT_TYPE_F16)
        f16_to_f32((const bt_fp16_t *)p, buf, t->ne[0]);
    else
        bt_row_to_f32(t->type, p, buf, t->ne[0]);
    return buf;
}

void bt_cpu_flash_attn(const struct bt_cpu_params *p, struct bt_tensor *dst) {
    const struct bt_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3];
    const int64_t D = q->ne[0], H = q->ne[1], T = q->ne[2];
    const int64_t Hk = k->ne[1], N = k->ne[2], Dv = v->ne[0];
    const int64_t group = H / Hk;
    const float scale = bt_get_op_param_f32(dst, 0);

    const size_t per = per_thread_bytes(dst);
    BT_ASSERT(p->wdata && p->wsize >= per * (size_t)p->nth);
    float *qf = (float *)((char *)p->wdata + per * (size_t)p->ith); /* [group][D] */
    float *acc = qf + group * D;                                     /* [group][Dv] */
    float *M = acc + group * Dv, *S = M + group;                     /* [group] */
    float *kf = S + group, *vf = kf + D;

    /* units u = t*Hk + hk: query row t with the q heads hk*group .. +group-1
     * that read kv head hk (each head's arithmetic is its own: grouping only
     * shares the conversion of k and v rows) */
    const int64_t n_units = Hk * T;
    const int64_t du = (n_units + p->nth - 1) / p->nth;
    const int64_t u0 = du * p->ith < n_units ? du * p->ith : n_units;
    const int64_t u1 = u0 + du < n_units ? u0 + du : n_units;

    for (int64_t u = u0; u < u1; u++) {
        const int64_t t = u / Hk, hk = u - t * Hk, h0 = hk * group;
        for (int64_t g = 0; g < group; g++) {
            memcpy(qf + g * D, (const char *)q->data + (h0 + g) * q->nb[1] + t * q->nb[2], (size_t)D * sizeof(float));
            for (int64_t i = 0; i < Dv; i++) acc[g * Dv + i] = 0.0f;
            M[g] = -INFINITY;
            S[g] = 0.0f;
        }
        for (int64_t j = 0; j < N; j++) {
            float mv = 0.0f;
            if (mask) {
                mv = mask_at(mask, j, t);
                if (mv == -INFINITY) continue;
            }
            const float *kr = row_f32(k, hk, j, kf);
            const float *vr = NULL;
            for (int64_t g = 0; g < group; g++) {
                const float s = dot_fixed(qf + g * D, kr, D) * scale + mv;
                if (s == -INFINITY) continue;
                if (!vr) vr = row_f32(v, hk, j, vf);
                float *a = acc + g * Dv;
                if (s > M[g]) {
                    const float rs = expf(M[g] - s); /* 0 for the first cell (M = -inf) */
                    M[g] = s;
                    for (int64_t i = 0; i < Dv; i++) a[i] = a[i] * rs + vr[i];
                    S[g] = S[g] * rs + 1.0f;
                } else {
                    const float e = expf(s - M[g]);
                    for (int64_t i = 0; i < Dv; i++) a[i] = a[i] + vr[i] * e;
                    S[g] = S[g] + e;
                }
            }
        }
        for (int64_t g = 0; g < group; g++) {
            float *out = (float *)((char *)dst->data + (h0 + g) * dst->nb[1] + t * dst->nb[2]);
            const float inv = S[g] > 0.0f ? 1.0f / S[g] : 0.0f;
            for (int64_t i = 0; i < Dv; i++) out[i] = acc[g * Dv + i] * inv;
        }
    }
}
