/* test_blocks.c - transformer blocks built from bt_* ops, computed on the CPU
 * and checked against references written out with plain loops:
 *   - MLP: rms_norm -> gate/up -> swiglu -> down, residual add
 *   - attention: q/k/v projections, rope, permutes, causal soft_max, merge
 *     heads, output projection
 *   - MoE FFN: router -> soft_max -> top_k -> normalised weights, three
 *     mul_mat_id with swiglu, weighted sum over the experts, plus a shared
 *     expert gated by sigmoid of a scalar gate
 * Weights are in mixed types; the references use the dequantised weights
 * (bt_row_to_f32), so only summation order and activation rounding differ. */
#include <math.h>
#include <string.h>

#include "testutil.h"

#define TOL 5e-4

/* W [k, m] (dequantised, row-major: W + i*k is output row i) times x [k, n]
 * -> y [m, n] */
static void ref_matmul(const float *W, const float *x, float *y, int64_t k, int64_t m, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            double s = 0;
            for (int64_t kk = 0; kk < k; kk++) s += (double)W[i * k + kk] * x[j * k + kk];
            y[j * m + i] = (float)s;
        }
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

static struct bt_tensor *weight(bt_context *ctx, enum bt_type t, int64_t k, int64_t m, int64_t ne,
                                tu_rng *r, float amp) {
    struct bt_tensor *w = bt_new_tensor_3d(ctx, t, k, m, ne);
    TU_OK(ctx, w);
    tu_fill_uniform(w, r, -amp, amp);
    bt_set_weight(w);
    return w;
}

static void check(const struct bt_tensor *out, const float *ref, const char *what, int nt) {
    double e = tu_nmse_tensor(out, ref);
    ck_assert_msg(e <= TOL, "%s (%d threads): NMSE %g > %g", what, nt, e, TOL);
}

/* ---- MLP ---- */

START_TEST(test_mlp_block) {
    const int64_t d = 64, ff = 160, T = 7;
    const float eps = 1e-5f;
    bt_context *ctx = tu_ctx(16);
    tu_rng r;
    tu_rng_init(&r, 5001);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, d, T);
    tu_fill(x, &r);
    struct bt_tensor *gn = bt_new_tensor_1d(ctx, BT_TYPE_F32, d);
    tu_fill_uniform(gn, &r, 0.5f, 1.5f);
    struct bt_tensor *wg = weight(ctx, BT_TYPE_F16, d, ff, 1, &r, 0.2f);
    struct bt_tensor *wu = weight(ctx, BT_TYPE_Q8_0, d, ff, 1, &r, 0.2f);
    struct bt_tensor *wd = weight(ctx, BT_TYPE_Q4_0, ff, d, 1, &r, 0.2f);

    struct bt_tensor *h = bt_mul(ctx, bt_rms_norm(ctx, x, eps), gn);    /* [d, T] */
    struct bt_tensor *gate = bt_mul_mat(ctx, wg, h);                    /* [ff, T] */
    struct bt_tensor *up = bt_mul_mat(ctx, wu, h);                      /* [ff, T] */
    struct bt_tensor *down = bt_mul_mat(ctx, wd, bt_swiglu(ctx, gate, up)); /* [d, T] */
    struct bt_tensor *out = bt_add(ctx, x, down);
    TU_OK(ctx, out);
    struct bt_graph *g = tu_graph(ctx, &out, 1);

    float *X = tu_read_f32(x), *G = tu_read_f32(gn), *WG = tu_read_f32(wg), *WU = tu_read_f32(wu),
          *WD = tu_read_f32(wd);
    float *H = malloc(sizeof(float) * d * T), *A = malloc(sizeof(float) * ff * T),
          *U = malloc(sizeof(float) * ff * T), *D = malloc(sizeof(float) * d * T);
    for (int64_t t = 0; t < T; t++) {
        double s2 = 0;
        for (int64_t i = 0; i < d; i++) s2 += (double)X[t * d + i] * X[t * d + i];
        double sc = 1.0 / sqrt(s2 / d + eps);
        for (int64_t i = 0; i < d; i++) H[t * d + i] = (float)(X[t * d + i] * sc * G[i]);
    }
    ref_matmul(WG, H, A, d, ff, T);
    ref_matmul(WU, H, U, d, ff, T);
    for (int64_t i = 0; i < ff * T; i++) A[i] = (float)(silu(A[i]) * U[i]);
    ref_matmul(WD, A, D, ff, d, T);
    for (int64_t i = 0; i < d * T; i++) D[i] += X[i];

    for (int nt = 1; nt <= 4; nt += 1) {
        memset(out->data, 0xff, bt_nbytes(out));
        ck_assert_int_eq(tu_run(g, nt), BT_OK);
        check(out, D, "mlp", nt);
    }
    free(X), free(G), free(WG), free(WU), free(WD), free(H), free(A), free(U), free(D);
    bt_free(ctx);
}
END_TEST

/* ---- attention ---- */

static void ref_rope_neox(float *v, int64_t hd, int n_dims, int pos, float base) {
    for (int i = 0; i < n_dims / 2; i++) {
        double th = pos * pow(base, -2.0 * i / n_dims);
        double c = cos(th), s = sin(th);
        double a = v[i], b = v[i + n_dims / 2];
        v[i] = (float)(a * c - b * s);
        v[i + n_dims / 2] = (float)(a * s + b * c);
    }
    (void)hd;
}

START_TEST(test_attention_block) {
    const int64_t d = 64, nh = 4, hd = 16, T = 9;
    const int n_rot = 12; /* partial rotary: n_dims < head dim */
    const float base = 10000.0f, scale = 1.0f / sqrtf((float)hd);
    bt_context *ctx = tu_ctx(16);
    tu_rng r;
    tu_rng_init(&r, 5002);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, d, T);
    tu_fill(x, &r);
    struct bt_tensor *wq = weight(ctx, BT_TYPE_Q8_0, d, d, 1, &r, 0.5f);
    struct bt_tensor *wk = weight(ctx, BT_TYPE_F16, d, d, 1, &r, 0.5f);
    struct bt_tensor *wv = weight(ctx, BT_TYPE_BF16, d, d, 1, &r, 0.5f);
    struct bt_tensor *wo = weight(ctx, BT_TYPE_Q4_0, d, d, 1, &r, 0.5f);
    struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, T);
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t + 3;
    struct bt_tensor *mask = bt_new_tensor_2d(ctx, BT_TYPE_F32, T, T); /* [kv, q] */
    for (int64_t iq = 0; iq < T; iq++)
        for (int64_t ik = 0; ik < T; ik++) ((float *)mask->data)[iq * T + ik] = ik <= iq ? 0.0f : -INFINITY;

    struct bt_tensor *q = bt_reshape_3d(ctx, bt_mul_mat(ctx, wq, x), hd, nh, T);
    struct bt_tensor *k = bt_reshape_3d(ctx, bt_mul_mat(ctx, wk, x), hd, nh, T);
    struct bt_tensor *v = bt_reshape_3d(ctx, bt_mul_mat(ctx, wv, x), hd, nh, T);
    q = bt_rope(ctx, q, pos, n_rot, BT_ROPE_NEOX, base, 1.0f);
    k = bt_rope(ctx, k, pos, n_rot, BT_ROPE_NEOX, base, 1.0f);
    struct bt_tensor *Q = bt_permute(ctx, q, 0, 2, 1, 3);                /* [hd, T, nh] */
    struct bt_tensor *K = bt_permute(ctx, k, 0, 2, 1, 3);                /* [hd, T, nh] */
    struct bt_tensor *kq = bt_mul_mat(ctx, K, Q);                        /* [T_kv, T_q, nh] */
    kq = bt_soft_max_ext(ctx, kq, mask, scale);
    struct bt_tensor *V = bt_cont(ctx, bt_permute(ctx, v, 1, 2, 0, 3)); /* [T, hd, nh] */
    struct bt_tensor *kqv = bt_mul_mat(ctx, V, kq);                      /* [hd, T_q, nh] */
    struct bt_tensor *merged = bt_cont(ctx, bt_permute(ctx, kqv, 0, 2, 1, 3)); /* [hd, nh, T] */
    merged = bt_reshape_2d(ctx, merged, d, T);
    struct bt_tensor *out = bt_mul_mat(ctx, wo, merged); /* [d, T] */
    TU_OK(ctx, out);
    ck_assert_int_eq(kq->ne[0], T);
    ck_assert_int_eq(kq->ne[1], T);
    ck_assert_int_eq(kq->ne[2], nh);
    struct bt_graph *g = tu_graph(ctx, &out, 1);

    /* reference */
    float *X = tu_read_f32(x), *WQ = tu_read_f32(wq), *WK = tu_read_f32(wk), *WV = tu_read_f32(wv),
          *WO = tu_read_f32(wo);
    float *RQ = malloc(sizeof(float) * d * T), *RK = malloc(sizeof(float) * d * T),
          *RV = malloc(sizeof(float) * d * T), *M = malloc(sizeof(float) * d * T),
          *O = malloc(sizeof(float) * d * T);
    ref_matmul(WQ, X, RQ, d, d, T);
    ref_matmul(WK, X, RK, d, d, T);
    ref_matmul(WV, X, RV, d, d, T);
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < nh; h++) {
            ref_rope_neox(RQ + t * d + h * hd, hd, n_rot, (int)t + 3, base);
            ref_rope_neox(RK + t * d + h * hd, hd, n_rot, (int)t + 3, base);
        }
    for (int64_t h = 0; h < nh; h++)
        for (int64_t tq = 0; tq < T; tq++) {
            double p[64], mx = -INFINITY, sum = 0;
            for (int64_t tk = 0; tk <= tq; tk++) {
                double s = 0;
                for (int64_t i = 0; i < hd; i++)
                    s += (double)RQ[tq * d + h * hd + i] * RK[tk * d + h * hd + i];
                p[tk] = s * scale;
                if (p[tk] > mx) mx = p[tk];
            }
            for (int64_t tk = 0; tk <= tq; tk++) sum += (p[tk] = exp(p[tk] - mx));
            for (int64_t i = 0; i < hd; i++) {
                double o = 0;
                for (int64_t tk = 0; tk <= tq; tk++) o += p[tk] / sum * RV[tk * d + h * hd + i];
                M[tq * d + h * hd + i] = (float)o;
            }
        }
    ref_matmul(WO, M, O, d, d, T);

    for (int nt = 1; nt <= 4; nt++) {
        memset(out->data, 0xff, bt_nbytes(out));
        ck_assert_int_eq(tu_run(g, nt), BT_OK);
        check(out, O, "attention", nt);
        /* the merged heads alone, too */
        check(merged, M, "attention merged heads", nt);
    }
    free(X), free(WQ), free(WK), free(WV), free(WO);
    free(RQ), free(RK), free(RV), free(M), free(O);
    bt_free(ctx);
}
END_TEST

/* ---- MoE FFN ---- */

START_TEST(test_moe_block) {
    const int64_t d = 64, ff = 96, NE = 8, NU = 2, T = 5, sff = 64;
    bt_context *ctx = tu_ctx(32);
    tu_rng r;
    tu_rng_init(&r, 5003);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, d, T);
    tu_fill(x, &r);
    struct bt_tensor *wr = weight(ctx, BT_TYPE_F32, d, NE, 1, &r, 1.0f);
    struct bt_tensor *wg = weight(ctx, BT_TYPE_F16, d, ff, NE, &r, 0.3f);
    struct bt_tensor *wu = weight(ctx, BT_TYPE_Q8_0, d, ff, NE, &r, 0.3f);
    struct bt_tensor *wd = weight(ctx, BT_TYPE_Q4_0, ff, d, NE, &r, 0.3f);
    struct bt_tensor *sg = weight(ctx, BT_TYPE_BF16, d, sff, 1, &r, 0.3f);
    struct bt_tensor *su = weight(ctx, BT_TYPE_F32, d, sff, 1, &r, 0.3f);
    struct bt_tensor *sd = weight(ctx, BT_TYPE_Q8_0, sff, d, 1, &r, 0.3f);
    struct bt_tensor *wsg = weight(ctx, BT_TYPE_F32, d, 1, 1, &r, 0.3f);

    struct bt_tensor *logits = bt_mul_mat(ctx, wr, x);    /* [NE, T] */
    struct bt_tensor *probs = bt_soft_max(ctx, logits);   /* [NE, T] */
    struct bt_tensor *sel = bt_top_k(ctx, probs, (int)NU); /* [NU, T] I32 */
    struct bt_tensor *wts = bt_get_rows(ctx, bt_reshape_3d(ctx, probs, 1, NE, T), sel); /* [1,NU,T] */
    struct bt_tensor *w2 = bt_reshape_2d(ctx, wts, NU, T);
    w2 = bt_div(ctx, w2, bt_sum_rows(ctx, w2)); /* normalised over the selected */
    struct bt_tensor *xb = bt_reshape_3d(ctx, x, d, 1, T);
    struct bt_tensor *gate = bt_mul_mat_id(ctx, wg, xb, sel); /* [ff, NU, T] */
    struct bt_tensor *up = bt_mul_mat_id(ctx, wu, xb, sel);
    struct bt_tensor *act = bt_swiglu(ctx, gate, up);
    struct bt_tensor *down = bt_mul_mat_id(ctx, wd, act, sel); /* [d, NU, T] */
    struct bt_tensor *weighted = bt_mul(ctx, down, bt_reshape_3d(ctx, w2, 1, NU, T));
    TU_OK(ctx, weighted);
    struct bt_tensor *moe = bt_view_2d(ctx, weighted, d, T, weighted->nb[2], 0);
    for (int64_t e = 1; e < NU; e++)
        moe = bt_add(ctx, moe, bt_view_2d(ctx, weighted, d, T, weighted->nb[2], e * weighted->nb[1]));
    struct bt_tensor *shared =
        bt_mul_mat(ctx, sd, bt_swiglu(ctx, bt_mul_mat(ctx, sg, x), bt_mul_mat(ctx, su, x)));
    struct bt_tensor *sgate = bt_sigmoid(ctx, bt_mul_mat(ctx, wsg, x)); /* [1, T] */
    struct bt_tensor *out = bt_add(ctx, moe, bt_mul(ctx, shared, sgate));
    TU_OK(ctx, out);
    struct bt_tensor *outs[2] = {out, sel};
    struct bt_graph *g = tu_graph(ctx, outs, 2);

    /* reference */
    float *X = tu_read_f32(x), *WR = tu_read_f32(wr), *WG = tu_read_f32(wg), *WU = tu_read_f32(wu),
          *WD = tu_read_f32(wd), *SG = tu_read_f32(sg), *SU = tu_read_f32(su), *SD = tu_read_f32(sd),
          *WSG = tu_read_f32(wsg);
    float *ref = calloc((size_t)(d * T), sizeof(float));
    int32_t ref_sel[5][2];
    for (int64_t t = 0; t < T; t++) {
        const float *xt = X + t * d;
        double lg[8], mx = -INFINITY, sum = 0, p[8];
        for (int64_t e = 0; e < NE; e++) {
            double s = 0;
            for (int64_t i = 0; i < d; i++) s += (double)WR[e * d + i] * xt[i];
            lg[e] = s;
            if (s > mx) mx = s;
        }
        for (int64_t e = 0; e < NE; e++) sum += (p[e] = exp(lg[e] - mx));
        for (int64_t e = 0; e < NE; e++) p[e] /= sum;
        /* top-2, ties to the lower index */
        int b0 = 0;
        for (int e = 1; e < NE; e++)
            if (p[e] > p[b0]) b0 = e;
        int b1 = b0 == 0 ? 1 : 0;
        for (int e = 0; e < NE; e++)
            if (e != b0 && p[e] > p[b1]) b1 = e;
        ref_sel[t][0] = b0;
        ref_sel[t][1] = b1;
        double wsum = p[b0] + p[b1];
        for (int s = 0; s < NU; s++) {
            int e = ref_sel[t][s];
            float hbuf[96];
            for (int64_t j = 0; j < ff; j++) {
                double gg = 0, uu = 0;
                for (int64_t i = 0; i < d; i++) {
                    gg += (double)WG[(e * ff + j) * d + i] * xt[i];
                    uu += (double)WU[(e * ff + j) * d + i] * xt[i];
                }
                hbuf[j] = (float)(silu(gg) * uu);
            }
            for (int64_t i = 0; i < d; i++) {
                double o = 0;
                for (int64_t j = 0; j < ff; j++) o += (double)WD[(e * d + i) * ff + j] * hbuf[j];
                ref[t * d + i] += (float)(o * p[e] / wsum);
            }
        }
        /* shared expert gated by sigmoid(wsg . x) */
        double gs = 0;
        for (int64_t i = 0; i < d; i++) gs += (double)WSG[i] * xt[i];
        gs = 1.0 / (1.0 + exp(-gs));
        float sh[64];
        for (int64_t j = 0; j < sff; j++) {
            double gg = 0, uu = 0;
            for (int64_t i = 0; i < d; i++) {
                gg += (double)SG[j * d + i] * xt[i];
                uu += (double)SU[j * d + i] * xt[i];
            }
            sh[j] = (float)(silu(gg) * uu);
        }
        for (int64_t i = 0; i < d; i++) {
            double o = 0;
            for (int64_t j = 0; j < sff; j++) o += (double)SD[i * sff + j] * sh[j];
            ref[t * d + i] += (float)(o * gs);
        }
    }

    for (int nt = 1; nt <= 4; nt++) {
        memset(out->data, 0xff, bt_nbytes(out));
        ck_assert_int_eq(tu_run(g, nt), BT_OK);
        int32_t *S = tu_read_i32(sel);
        for (int64_t t = 0; t < T; t++)
            for (int s = 0; s < NU; s++)
                ck_assert_msg(S[t * NU + s] == ref_sel[t][s], "token %ld slot %d: expert %d want %d",
                              (long)t, s, S[t * NU + s], ref_sel[t][s]);
        free(S);
        check(out, ref, "moe", nt);
    }
    free(X), free(WR), free(WG), free(WU), free(WD), free(SG), free(SU), free(SD), free(WSG);
    free(ref);
    bt_free(ctx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("blocks");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mlp_block);
    tcase_add_test(tc, test_attention_block);
    tcase_add_test(tc, test_moe_block);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
