/* test_ops.c - every op of ops.h computed on the CPU backend against a plain
 * reference written here (loops over logical indices, double accumulation),
 * on random data: odd shapes, broadcasting, non-contiguous inputs, 1 to 4
 * threads; plus the shape errors constructors report and the run-time errors
 * the executor reports. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "testutil.h"

#define TOL_ELEM 1e-7  /* NMSE bound for element-wise / row ops */
#define MAX_NT 4

/* NMSE bounds of mul_mat / mul_mat_id against the double-precision reference
 * on the dequantised weights (k <= 1024, values in [-1, 1)).  F32 and F16
 * weights are converted exactly and only F32 rounding of the sums remains
 * (measured about 4e-13).  BF16 weights may also round the activations to
 * BF16 (the AVX512-BF16 dot; measured up to 2e-6).  Quantised weights round
 * each activation to int8 blocks of 32 (measured up to 6e-5). */
static double tol_matmul(enum bt_type wt) {
    switch (wt) {
    case BT_TYPE_F32:
    case BT_TYPE_F16: return 1e-11;
    case BT_TYPE_BF16: return 1e-5;
    case BT_TYPE_Q8_0: return 2e-4;
    case BT_TYPE_Q4_0: return 2e-4;
    /* activations as blocks of 32 too: bounded like Q8_0 (until measured) */
    case BT_TYPE_Q4_1:
    case BT_TYPE_Q5_0:
    case BT_TYPE_Q5_1: return 2e-4;
    /* activations as Q8_K (one scale per 256): not measured yet, a coarser
     * scale allows more */
    case BT_TYPE_Q2_K:
    case BT_TYPE_Q3_K:
    case BT_TYPE_Q4_K:
    case BT_TYPE_Q5_K:
    case BT_TYPE_Q6_K: return 5e-4;
    /* the table types: activations as Q8_0 (MXFP4, IQ4_NL) or Q8_K; measured
     * up to 2.6e-4 (IQ4_NL) and 8.7e-4 (IQ3_XXS), on one-block dots */
    case BT_TYPE_MXFP4:
    case BT_TYPE_IQ4_NL:
    case BT_TYPE_IQ4_XS:
    case BT_TYPE_IQ2_XXS:
    case BT_TYPE_IQ2_XS:
    case BT_TYPE_IQ2_S:
    case BT_TYPE_IQ3_XXS:
    case BT_TYPE_IQ3_S:
    case BT_TYPE_IQ1_S: return 1.5e-3;
    default: ck_abort_msg("no matmul bound for type %s", bt_type_name(wt)); return 0.0;
    }
}
#define TOL_MATMUL_REF 1e-11 /* the plain reference kernels: dequantised F32 sums */

static char g_case[512]; /* what is being checked, for failure messages */

/* ---- inputs in various layouts ---- */

enum layout { L_CONT, L_TRANS, L_STRIDED, L_PERM, L_COUNT };
static const char *layout_name[L_COUNT] = {"cont", "transposed", "strided", "permuted"};

static bool is_block(enum bt_type t) { return bt_blck_size(t) > 1; }

/* A tensor of logical shape ne in the given layout, filled with uniform
 * values in [lo, hi).  The unused bytes around a view are NaN (0xff), so a
 * kernel that reads outside the view poisons its result.
 *   L_TRANS:   a transposed view (nb[0] is a row, not an element)
 *   L_STRIDED: a view into a larger tensor (padded rows and planes)
 *   L_PERM:    dims 1 and 2 swapped (rows stay contiguous) */
static struct bt_tensor *new_input(bt_context *ctx, enum bt_type type, const int64_t ne[4],
                                   enum layout lay, tu_rng *r, float lo, float hi) {
    struct bt_tensor *base = NULL, *t = NULL;
    switch (lay) {
    case L_CONT:
        t = base = bt_new_tensor_4d(ctx, type, ne[0], ne[1], ne[2], ne[3]);
        break;
    case L_TRANS:
        BT_ASSERT(!is_block(type));
        base = bt_new_tensor_4d(ctx, type, ne[1], ne[0], ne[2], ne[3]);
        t = bt_transpose(ctx, base);
        break;
    case L_STRIDED: {
        int64_t pad0 = is_block(type) ? bt_blck_size(type) : 3;
        base = bt_new_tensor_4d(ctx, type, ne[0] + pad0, ne[1] + 1, ne[2] + 1, ne[3]);
        size_t off = base->nb[1] + base->nb[2] + (is_block(type) ? 0 : base->nb[0]);
        t = bt_view_4d(ctx, base, ne[0], ne[1], ne[2], ne[3], base->nb[1], base->nb[2], base->nb[3],
                       off);
        break;
    }
    case L_PERM:
        base = bt_new_tensor_4d(ctx, type, ne[0], ne[2], ne[1], ne[3]);
        t = bt_permute(ctx, base, 0, 2, 1, 3);
        break;
    default: BT_ASSERT(0);
    }
    ck_assert_msg(t != NULL, "%s: new_input(%s): %s", g_case, layout_name[lay],
                  bt_context_error(ctx));
    for (int i = 0; i < 4; i++) ck_assert_int_eq(t->ne[i], ne[i]);
    if (base != t && type != BT_TYPE_I32) memset(tu_data(base), 0xff, bt_nbytes(base));
    tu_fill_uniform(t, r, lo, hi);
    return t;
}

static int64_t nel4(const int64_t ne[4]) { return ne[0] * ne[1] * ne[2] * ne[3]; }
static int64_t idx4(const int64_t ne[4], int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 + ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3));
}

/* Compute g with nt threads after poisoning out (unless out is a view). */
static void run_nt(struct bt_graph *g, struct bt_tensor *out, int nt) {
    if (out && !out->view_src) memset(tu_data(out), 0xff, bt_nbytes(out));
    enum bt_status s = tu_run(g, nt);
    ck_assert_msg(s == BT_OK, "%s: nt=%d: %s: %s", g_case, nt, bt_status_str(s),
                  bt_cpu_error(tu_cpu(nt)));
}

static void check_nmse(const struct bt_tensor *out, const float *ref, double tol, int nt) {
    double e = tu_nmse_tensor(out, ref);
    ck_assert_msg(e <= tol, "%s: nt=%d: NMSE %g > %g", g_case, nt, e, tol);
}

/* The CPU claims every well-formed case of every op, in any layout
 * (cpu.h), so no case may be skipped: one it declines fails here. */
static void require_supported(const struct bt_tensor *out) {
    ck_assert_msg(bt_cpu_supports_op(out), "%s: the CPU declares this case unsupported", g_case);
}

static struct bt_graph *graph1(bt_context *ctx, struct bt_tensor *out) {
    ck_assert_msg(out != NULL, "%s: constructor returned NULL: %s", g_case, bt_context_error(ctx));
    return tu_graph(ctx, &out, 1);
}

/* ---- binary element-wise ops with broadcasting ---- */

static const int64_t shapes[][4] = {
    {1, 1, 1, 1}, {3, 1, 1, 1}, {17, 3, 1, 1}, {33, 5, 2, 1}, {67, 3, 2, 3}, {5, 17, 3, 2},
};
#define N_SHAPES ((int)(sizeof(shapes) / sizeof(shapes[0])))

static float ref_bin(int op, float a, float b) {
    switch (op) {
    case BT_OP_ADD: return a + b;
    case BT_OP_SUB: return a - b;
    case BT_OP_MUL: return a * b;
    default: return a / b;
    }
}

START_TEST(test_binary) {
    const int ops[4] = {BT_OP_ADD, BT_OP_SUB, BT_OP_MUL, BT_OP_DIV};
    tu_rng r;
    tu_rng_init(&r, 100 + _i);
    int op = ops[_i];
    int case_no = 0;
    for (int si = 0; si < N_SHAPES; si++) {
        const int64_t *ne = shapes[si];
        for (int mask = 0; mask < 16; mask++) {
            int64_t neb[4];
            for (int d = 0; d < 4; d++) neb[d] = (mask >> d) & 1 ? 1 : ne[d];
            enum layout la = (enum layout)(case_no % L_COUNT);
            enum layout lb = (enum layout)((case_no / L_COUNT + mask) % L_COUNT);
            case_no++;
            snprintf(g_case, sizeof(g_case), "%s a[%ld,%ld,%ld,%ld] %s b[%ld,%ld,%ld,%ld] %s",
                     bt_op_name((enum bt_op)op), (long)ne[0], (long)ne[1], (long)ne[2],
                     (long)ne[3], layout_name[la], (long)neb[0], (long)neb[1], (long)neb[2],
                     (long)neb[3], layout_name[lb]);
            bt_context *ctx = tu_ctx(4);
            struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, ne, la, &r, -1, 1);
            struct bt_tensor *b = op == BT_OP_DIV ? new_input(ctx, BT_TYPE_F32, neb, lb, &r, 0.5f, 1.5f)
                                                  : new_input(ctx, BT_TYPE_F32, neb, lb, &r, -1, 1);
            struct bt_tensor *out = op == BT_OP_ADD   ? bt_add(ctx, a, b)
                                    : op == BT_OP_SUB ? bt_sub(ctx, a, b)
                                    : op == BT_OP_MUL ? bt_mul(ctx, a, b)
                                                      : bt_div(ctx, a, b);
            ck_assert_msg(out != NULL, "%s: NULL: %s", g_case, bt_context_error(ctx));
            ck_assert_int_eq(out->type, BT_TYPE_F32);
            ck_assert(bt_are_same_shape(out, a));
            ck_assert(bt_is_contiguous(out));
            struct bt_graph *g = graph1(ctx, out);
            float *A = tu_read_f32(a), *B = tu_read_f32(b);
            float *ref = malloc(sizeof(float) * nel4(ne));
            for (int64_t i3 = 0; i3 < ne[3]; i3++)
                for (int64_t i2 = 0; i2 < ne[2]; i2++)
                    for (int64_t i1 = 0; i1 < ne[1]; i1++)
                        for (int64_t i0 = 0; i0 < ne[0]; i0++)
                            ref[idx4(ne, i0, i1, i2, i3)] =
                                ref_bin(op, A[idx4(ne, i0, i1, i2, i3)],
                                        B[idx4(neb, i0 % neb[0], i1 % neb[1], i2 % neb[2],
                                               i3 % neb[3])]);
            require_supported(out);
            {
                for (int nt = 1; nt <= MAX_NT; nt++) {
                    run_nt(g, out, nt);
                    check_nmse(out, ref, TOL_ELEM, nt);
                }
            }
            free(A);
            free(B);
            free(ref);
            bt_free(ctx);
        }
    }
}
END_TEST

/* ---- unary ops ---- */

enum unary { U_SCALE, U_SQR, U_SQRT, U_SILU, U_GELU, U_RELU, U_SIGMOID, U_COUNT };
static const char *unary_name[U_COUNT] = {"scale", "sqr", "sqrt", "silu", "gelu", "relu", "sigmoid"};

static double ref_unary(int u, double x) {
    switch (u) {
    case U_SCALE: return x * 0.37f;
    case U_SQR: return x * x;
    case U_SQRT: return sqrt(x);
    case U_SILU: return x / (1.0 + exp(-x));
    case U_GELU: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case U_RELU: return x > 0 ? x : 0;
    default: return 1.0 / (1.0 + exp(-x));
    }
}

START_TEST(test_unary) {
    int u = _i;
    tu_rng r;
    tu_rng_init(&r, 200 + u);
    for (int si = 0; si < N_SHAPES; si++) {
        for (int lay = 0; lay < L_COUNT; lay++) {
            const int64_t *ne = shapes[si];
            snprintf(g_case, sizeof(g_case), "%s [%ld,%ld,%ld,%ld] %s", unary_name[u], (long)ne[0],
                     (long)ne[1], (long)ne[2], (long)ne[3], layout_name[lay]);
            bt_context *ctx = tu_ctx(4);
            float lo = u == U_SQRT ? 0.0f : -4.0f, hi = 4.0f;
            struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, ne, (enum layout)lay, &r, lo, hi);
            struct bt_tensor *out = NULL;
            switch (u) {
            case U_SCALE: out = bt_scale(ctx, a, 0.37f); break;
            case U_SQR: out = bt_sqr(ctx, a); break;
            case U_SQRT: out = bt_sqrt(ctx, a); break;
            case U_SILU: out = bt_silu(ctx, a); break;
            case U_GELU: out = bt_gelu(ctx, a); break;
            case U_RELU: out = bt_relu(ctx, a); break;
            default: out = bt_sigmoid(ctx, a); break;
            }
            struct bt_graph *g = graph1(ctx, out);
            ck_assert(bt_are_same_shape(out, a));
            ck_assert_int_eq(out->type, BT_TYPE_F32);
            if (u == U_SCALE) ck_assert_float_eq(bt_get_op_param_f32(out, 0), 0.37f);
            float *A = tu_read_f32(a);
            float *ref = malloc(sizeof(float) * nel4(ne));
            for (int64_t i = 0; i < nel4(ne); i++) ref[i] = (float)ref_unary(u, A[i]);
            require_supported(out);
            {
                for (int nt = 1; nt <= MAX_NT; nt++) {
                    run_nt(g, out, nt);
                    check_nmse(out, ref, TOL_ELEM, nt);
                }
            }
            free(A);
            free(ref);
            bt_free(ctx);
        }
    }
}
END_TEST

/* SILU, SWIGLU and SWIGLU_OAI over packed rows (8 or 16 lanes at a time as
 * the kernel variant has them, then a masked tail)
 * and over strided ones (an element at a time) give the same bits for every
 * value: a sweep over [-100, 100], the clamp's edges, zeros, denormals,
 * infinities and NaN, in rows whose lengths leave every tail length
 * (SWIGLU_OAI's b over [-10, 10] and the specials: both sides of its limit). */
START_TEST(test_silu_bitwise) {
    enum { N = 4099 };
    static float v[N];
    const float special[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 87.0f, -87.0f, 88.0f, -88.0f, 87.5f, -88.5f, 1e30f,
                             -1e30f, INFINITY, -INFINITY, NAN, FLT_MIN, -FLT_MIN, 1.0f, -1.0f};
    const int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) v[i] = i < ns ? special[i] : -100.0f + 200.0f * (float)(i - ns) / (float)(N - ns);
    for (int len = N - 16; len <= N; len++) {
        bt_context *ctx = tu_ctx(4);
        struct bt_tensor *a = bt_new_tensor_1d(ctx, BT_TYPE_F32, len), *b = bt_new_tensor_1d(ctx, BT_TYPE_F32, len);
        /* the same values as column 0 of [2, len]: transposed, element stride 8 bytes */
        struct bt_tensor *a2 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 2, len), *b2 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 2, len);
        TU_OK(ctx, a);
        TU_OK(ctx, b);
        TU_OK(ctx, a2);
        TU_OK(ctx, b2);
        for (int i = 0; i < len; i++) {
            const float x = v[(i * 7 + len) % N], y = v[(i * 13 + 5) % N] * 0.01f;
            ((float *)a->data)[i] = x;
            ((float *)b->data)[i] = y;
            ((float *)a2->data)[2 * i] = ((float *)a2->data)[2 * i + 1] = x;
            ((float *)b2->data)[2 * i] = ((float *)b2->data)[2 * i + 1] = y;
        }
        struct bt_tensor *at = bt_transpose(ctx, a2), *bt = bt_transpose(ctx, b2);
        /* b for SWIGLU_OAI: the specials, then [-10, 10] */
        struct bt_tensor *c = bt_new_tensor_1d(ctx, BT_TYPE_F32, len), *c2 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 2, len);
        TU_OK(ctx, c);
        TU_OK(ctx, c2);
        for (int i = 0; i < len; i++) {
            const float y = i % 5 == 0 ? special[(i / 5) % ns] : v[(i * 11 + 3) % N] * 0.1f;
            ((float *)c->data)[i] = y;
            ((float *)c2->data)[2 * i] = ((float *)c2->data)[2 * i + 1] = y;
        }
        struct bt_tensor *ct = bt_transpose(ctx, c2);
        struct bt_tensor *outs[6] = {bt_silu(ctx, a),         bt_silu(ctx, at),
                                     bt_swiglu(ctx, a, b),    bt_swiglu(ctx, at, bt),
                                     bt_swiglu_oai(ctx, a, c, 1.702f, 7.0f), bt_swiglu_oai(ctx, at, ct, 1.702f, 7.0f)};
        static const char *name[3] = {"silu", "swiglu", "swiglu_oai"};
        for (int k = 0; k < 6; k++) TU_OK(ctx, outs[k]);
        ck_assert(at->nb[0] == 2 * sizeof(float));
        ck_assert_int_eq(tu_run(tu_graph(ctx, outs, 6), 2), BT_OK);
        for (int k = 0; k < 6; k += 2)
            for (int i = 0; i < len; i++) {
                const float p = ((const float *)outs[k]->data)[i], q = ((const float *)outs[k + 1]->data)[i];
                ck_assert_msg(memcmp(&p, &q, sizeof p) == 0 || (isnan(p) && isnan(q)),
                              "%s len %d, x[%d] = %g: packed %a, strided %a", name[k / 2], len, i,
                              (double)((const float *)a->data)[i], (double)p, (double)q);
            }
        bt_free(ctx);
    }
}
END_TEST

/* RMS_NORM's rows bitwise alike however they are computed: a batch of rows
 * (the AVX-512 form takes 16 rows at once, lanes as rows, the C form 8; 1
 * to 4 threads, so rows fall in and out of groups) against each row alone
 * and against the same rows read through a stride; lengths around the
 * vector widths, values over 2^-20 .. 2^20.  (A row's sum taken in another
 * order differs at the level of double rounding, which the float result
 * seldom shows: what this catches is a row's lanes mixed with another's or
 * elements left out.) */
START_TEST(test_rms_norm_bitwise) {
    static const int64_t lens[] = {1, 7, 8, 9, 16, 63, 1027, 2048};
    const int64_t R = 37;
    for (int li = 0; li < (int)(sizeof lens / sizeof lens[0]); li++) {
        const int64_t n0 = lens[li];
        tu_rng r;
        tu_rng_init(&r, 4100 + (uint64_t)li);
        bt_context *ctx = tu_ctx(8);
        struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, n0, R);
        struct bt_tensor *a2 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 2, n0, R); /* the values twice, side by side */
        TU_OK(ctx, a);
        TU_OK(ctx, a2);
        float *x = a->data;
        for (int64_t i = 0; i < n0 * R; i++) {
            x[i] = ldexpf(tu_rng_f32(&r, -1.0f, 1.0f), (int)tu_rng_f32(&r, -20.0f, 20.0f));
            ((float *)a2->data)[2 * i] = ((float *)a2->data)[2 * i + 1] = x[i];
        }
        struct bt_tensor *as = bt_permute(ctx, a2, 1, 0, 2, 3); /* [n0, 2, R], elements 8 bytes apart */
        TU_OK(ctx, as);
        struct bt_tensor *out = bt_rms_norm(ctx, a, 1e-6f), *outs = bt_rms_norm(ctx, as, 1e-6f);
        TU_OK(ctx, out);
        TU_OK(ctx, outs);
        struct bt_tensor *both[2] = {out, outs};
        struct bt_graph *g = tu_graph(ctx, both, 2);
        for (int nt = 1; nt <= MAX_NT; nt++) {
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            for (int64_t i = 0; i < n0 * R; i++) /* out [n0, R] against outs [n0, 2, R], both copies */
                for (int64_t c = 0; c < 2; c++) {
                    const float p = ((const float *)out->data)[i];
                    const float q = ((const float *)outs->data)[i % n0 + n0 * (c + 2 * (i / n0))];
                    ck_assert_msg(memcmp(&p, &q, sizeof p) == 0, "n0 %lld, nt %d: element %lld differs from strided",
                                  (long long)n0, nt, (long long)i);
                }
            for (int64_t row = 0; row < R; row += 6) {
                bt_context *c1 = tu_ctx(1);
                struct bt_tensor *a1 = bt_new_tensor_1d(c1, BT_TYPE_F32, n0);
                TU_OK(c1, a1);
                memcpy(a1->data, x + row * n0, (size_t)n0 * sizeof(float));
                struct bt_tensor *o1 = bt_rms_norm(c1, a1, 1e-6f);
                TU_OK(c1, o1);
                tu_compute(c1, o1, 1);
                ck_assert_msg(memcmp(o1->data, (float *)out->data + row * n0, (size_t)n0 * sizeof(float)) == 0,
                              "n0 %lld, nt %d: row %lld alone differs", (long long)n0, nt, (long long)row);
                bt_free(c1);
            }
        }
        bt_free(ctx);
    }
}
END_TEST

/* SWIGLU_OAI (gpt-oss's clamped SwiGLU): a [n, K, T] batch's rows bitwise
 * the same for 1-4 threads and when each token's rows are computed alone
 * (a batch of 1), over values on both sides of the limit and at it */
START_TEST(test_swiglu_oai_bitwise) {
    const int64_t n = 37, K = 3, T = 9;
    tu_rng r;
    tu_rng_init(&r, 2901);
    bt_context *ctx = tu_ctx(8);
    struct bt_tensor *a = bt_new_tensor_3d(ctx, BT_TYPE_F32, n, K, T), *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, n, K, T);
    tu_fill_uniform(a, &r, -12.0f, 12.0f);
    tu_fill_uniform(b, &r, -12.0f, 12.0f);
    ((float *)a->data)[0] = ((float *)b->data)[1] = 7.0f;
    ((float *)b->data)[2] = -7.0f;
    struct bt_tensor *out = bt_swiglu_oai(ctx, a, b, 1.702f, 7.0f);
    TU_OK(ctx, out);
    tu_compute(ctx, out, 1);
    float *base = tu_read_f32(out);
    for (int nth = 2; nth <= 4; nth++) {
        tu_compute(ctx, out, nth);
        ck_assert_msg(memcmp(out->data, base, bt_nbytes(out)) == 0, "%d threads differ from 1", nth);
    }
    const size_t tok = (size_t)(n * K) * sizeof(float);
    for (int64_t t = 0; t < T; t++) {
        bt_context *c1 = tu_ctx(4);
        struct bt_tensor *a1 = bt_new_tensor_3d(c1, BT_TYPE_F32, n, K, 1);
        struct bt_tensor *b1 = bt_new_tensor_3d(c1, BT_TYPE_F32, n, K, 1);
        memcpy(a1->data, (char *)a->data + t * a->nb[2], tok);
        memcpy(b1->data, (char *)b->data + t * b->nb[2], tok);
        struct bt_tensor *o1 = bt_swiglu_oai(c1, a1, b1, 1.702f, 7.0f);
        TU_OK(c1, o1);
        tu_compute(c1, o1, 2);
        ck_assert_msg(memcmp(o1->data, (char *)base + t * tok, tok) == 0, "token %lld alone differs", (long long)t);
        bt_free(c1);
    }
    free(base);
    bt_free(ctx);
}
END_TEST

/* SWIGLU and SWIGLU_OAI with held_ids (tensor.h: an expert group's rank
 * computing a share of a chain's experts): the rows (slot, token) whose id
 * lies in [expert_lo, expert_hi) are the bits of the whole op's, for 1 and
 * 3 threads, and the others are left as they were */
START_TEST(test_glu_held_rows) {
    const int64_t n = 29, K = 4, T = 7;
    tu_rng r;
    tu_rng_init(&r, 2903);
    bt_context *ctx = tu_ctx(8);
    struct bt_tensor *a = bt_new_tensor_3d(ctx, BT_TYPE_F32, n, K, T), *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, n, K, T);
    struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, K, T);
    tu_fill_uniform(a, &r, -9.0f, 9.0f);
    tu_fill_uniform(b, &r, -9.0f, 9.0f);
    for (int64_t i = 0; i < K * T; i++) ((int32_t *)ids->data)[i] = (int32_t)((i * 5 + i / 3) % 8);
    for (int v = 0; v < 2; v++) {
        struct bt_tensor *out = v ? bt_swiglu_oai(ctx, a, b, 1.702f, 7.0f) : bt_swiglu(ctx, a, b);
        TU_OK(ctx, out);
        tu_compute(ctx, out, 1);
        float *whole = tu_read_f32(out);
        out->held_ids = ids;
        out->expert_lo = 2;
        out->expert_hi = 5;
        for (int nth = 1; nth <= 3; nth += 2) {
            memset(out->data, 0x7f, bt_nbytes(out));
            tu_compute(ctx, out, nth);
            int held = 0;
            for (int64_t i = 0; i < K * T; i++) {
                const int32_t e = ((const int32_t *)ids->data)[i];
                const float *got = (const float *)out->data + i * n;
                if (e >= 2 && e < 5) {
                    held++;
                    ck_assert_msg(memcmp(got, whole + i * n, (size_t)n * sizeof(float)) == 0,
                                  "%s, %d threads: held row %lld differs from the whole op's",
                                  v ? "swiglu_oai" : "swiglu", nth, (long long)i);
                } else {
                    uint8_t was[sizeof(float)];
                    memset(was, 0x7f, sizeof was);
                    for (int64_t j = 0; j < n; j++)
                        ck_assert_msg(memcmp(got + j, was, sizeof was) == 0, "%s: row %lld of expert %d was written",
                                      v ? "swiglu_oai" : "swiglu", (long long)i, e);
                }
            }
            ck_assert_int_gt(held, 0);
            ck_assert_int_lt(held, K * T);
        }
        out->held_ids = NULL;
        out->expert_lo = out->expert_hi = 0;
        free(whole);
    }
    bt_free(ctx);
}
END_TEST

/* A share test's inputs: two float tensors of values in [-9, 9). */
static void fill_two(struct bt_tensor *a, struct bt_tensor *b, uint64_t seed) {
    tu_rng r;
    tu_rng_init(&r, seed);
    tu_fill_uniform(a, &r, -9.0f, 9.0f);
    tu_fill_uniform(b, &r, -9.0f, 9.0f);
}
/* A share test's two computes: the node whole (returned, malloc'd), then,
 * its share set, on nth threads into memory of 0x7f bytes, so that what the
 * share leaves alone shows. */
static float *compute_whole(bt_context *ctx, struct bt_tensor *out) {
    TU_OK(ctx, out);
    tu_compute(ctx, out, 1);
    return tu_read_f32(out);
}
static void compute_poisoned(bt_context *ctx, struct bt_tensor *out, int nth) {
    memset(out->data, 0x7f, bt_nbytes(out));
    tu_compute(ctx, out, nth);
}

/* SWIGLU and SWIGLU_OAI with a share of the tokens (tensor.h col_lo/hi: a
 * group's columns of a SwiGLU between products divided by tokens): the rows
 * [col_lo, col_hi) are the bits of the whole op's, for 1 and 3 threads, and
 * the others are left as they were */
START_TEST(test_glu_cols_share) {
    const int64_t n = 29, T = 11;
    bt_context *ctx = tu_ctx(8);
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, n, T), *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, n, T);
    fill_two(a, b, 2917);
    for (int v = 0; v < 2; v++) {
        struct bt_tensor *out = v ? bt_swiglu_oai(ctx, a, b, 1.702f, 7.0f) : bt_swiglu(ctx, a, b);
        float *whole = compute_whole(ctx, out);
        out->col_lo = 3;
        out->col_hi = 8;
        for (int nth = 1; nth <= 3; nth += 2) {
            compute_poisoned(ctx, out, nth);
            for (int64_t t = 0; t < T; t++) {
                const float *got = (const float *)out->data + t * n;
                uint8_t was[sizeof(float)];
                memset(was, 0x7f, sizeof was);
                if (t >= 3 && t < 8)
                    ck_assert_msg(memcmp(got, whole + t * n, (size_t)n * sizeof(float)) == 0,
                                  "%s, %d threads: token %lld differs from the whole op's", v ? "swiglu_oai" : "swiglu",
                                  nth, (long long)t);
                else
                    for (int64_t j = 0; j < n; j++)
                        ck_assert_msg(memcmp(got + j, was, sizeof was) == 0, "%s: token %lld was written",
                                      v ? "swiglu_oai" : "swiglu", (long long)t);
            }
        }
        out->col_lo = out->col_hi = 0;
        free(whole);
    }
    bt_free(ctx);
}
END_TEST

/* ---- swiglu, sum_rows, mean, rms_norm, norm ---- */

enum rowop { R_SWIGLU, R_SUM_ROWS, R_MEAN, R_RMS_NORM, R_NORM, R_SWIGLU_OAI, R_COUNT };
static const char *rowop_name[R_COUNT] = {"swiglu", "sum_rows", "mean", "rms_norm", "norm", "swiglu_oai"};

START_TEST(test_rowops) {
    int op = _i;
    tu_rng r;
    tu_rng_init(&r, 300 + op);
    static const int64_t rshapes[][4] = {{1, 3, 1, 1},  {3, 2, 1, 1},   {17, 5, 2, 1},
                                         {67, 3, 2, 2}, {256, 7, 1, 1}, {1000, 3, 1, 1},
                                         {33, 4, 1, 1}};
    for (int si = 0; si < 7; si++) {
        for (int lay = 0; lay < L_COUNT; lay++) {
            const int64_t *ne = rshapes[si];
            const float eps = si % 2 ? 1e-5f : 1e-6f;
            snprintf(g_case, sizeof(g_case), "%s [%ld,%ld,%ld,%ld] %s", rowop_name[op], (long)ne[0],
                     (long)ne[1], (long)ne[2], (long)ne[3], layout_name[lay]);
            bt_context *ctx = tu_ctx(4);
            /* a non-zero mean makes norm's mean subtraction matter; the last
             * shape has a variance near eps, so that eps matters too */
            /* swiglu_oai: values past its limit of 7 on both sides */
            const float sc = op == R_SWIGLU_OAI ? 10.0f : si == 6 ? 1e-3f : 1.0f;
            struct bt_tensor *a =
                new_input(ctx, BT_TYPE_F32, ne, (enum layout)lay, &r, -0.5f * sc, 1.5f * sc);
            struct bt_tensor *b = NULL, *out = NULL;
            switch (op) {
            case R_SWIGLU:
                b = new_input(ctx, BT_TYPE_F32, ne, (enum layout)((lay + 1) % L_COUNT), &r, -1, 1);
                out = bt_swiglu(ctx, a, b);
                break;
            case R_SWIGLU_OAI:
                b = new_input(ctx, BT_TYPE_F32, ne, (enum layout)((lay + 1) % L_COUNT), &r, -10, 10);
                out = bt_swiglu_oai(ctx, a, b, 1.702f, 7.0f);
                break;
            case R_SUM_ROWS: out = bt_sum_rows(ctx, a); break;
            case R_MEAN: out = bt_mean(ctx, a); break;
            case R_RMS_NORM: out = bt_rms_norm(ctx, a, eps); break;
            default: out = bt_norm(ctx, a, eps); break;
            }
            struct bt_graph *g = graph1(ctx, out);
            float *A = tu_read_f32(a), *B = b ? tu_read_f32(b) : NULL;
            float *ref = malloc(sizeof(float) * nel4(ne));
            int64_t n0 = ne[0], nrows = nel4(ne) / n0;
            if (op == R_SUM_ROWS || op == R_MEAN) {
                ck_assert_int_eq(out->ne[0], 1);
                for (int d = 1; d < 4; d++) ck_assert_int_eq(out->ne[d], ne[d]);
            } else {
                ck_assert(bt_are_same_shape(out, a));
            }
            if (op == R_RMS_NORM || op == R_NORM) ck_assert_float_eq(bt_get_op_param_f32(out, 0), eps);
            for (int64_t row = 0; row < nrows; row++) {
                const float *x = A + row * n0;
                double sum = 0, sum2 = 0;
                for (int64_t i = 0; i < n0; i++) {
                    sum += x[i];
                    sum2 += (double)x[i] * x[i];
                }
                double mean = sum / n0;
                for (int64_t i = 0; i < n0; i++) {
                    switch (op) {
                    case R_SWIGLU: {
                        double v = x[i];
                        ref[row * n0 + i] = (float)(v / (1.0 + exp(-v)) * B[row * n0 + i]);
                        break;
                    }
                    case R_SWIGLU_OAI: { /* gpt-oss: x = min(a, 7), y = clamp(b, -7, 7) */
                        const double v = x[i] < 7.0 ? x[i] : 7.0, bv = B[row * n0 + i];
                        const double y = bv < -7.0 ? -7.0 : bv > 7.0 ? 7.0 : bv;
                        ref[row * n0 + i] = (float)(v / (1.0 + exp(-1.702 * v)) * (y + 1.0));
                        break;
                    }
                    case R_SUM_ROWS: ref[row] = (float)sum; break;
                    case R_MEAN: ref[row] = (float)mean; break;
                    case R_RMS_NORM: ref[row * n0 + i] = (float)(x[i] / sqrt(sum2 / n0 + eps)); break;
                    default: {
                        double var = 0;
                        for (int64_t j = 0; j < n0; j++) var += (x[j] - mean) * (x[j] - mean);
                        var /= n0;
                        ref[row * n0 + i] = (float)((x[i] - mean) / sqrt(var + eps));
                    }
                    }
                }
            }
            require_supported(out);
            {
                for (int nt = 1; nt <= MAX_NT; nt++) {
                    run_nt(g, out, nt);
                    check_nmse(out, ref, TOL_ELEM, nt);
                }
            }
            free(A);
            free(B);
            free(ref);
            bt_free(ctx);
        }
    }
}
END_TEST

/* ---- soft_max ---- */

START_TEST(test_soft_max) {
    tu_rng r;
    tu_rng_init(&r, 400);
    static const int64_t sshapes[][4] = {{1, 1, 1, 1}, {3, 5, 1, 1}, {17, 4, 3, 1}, {67, 5, 3, 2},
                                         {200, 2, 1, 1}};
    for (int si = 0; si < 5; si++) {
        for (int variant = 0; variant < 4; variant++) { /* mask? x scale? */
            const int64_t *ne = sshapes[si];
            bool use_mask = variant & 1;
            float scale = variant & 2 ? 0.125f : 1.0f;
            enum layout lay = (enum layout)((si + variant) % L_COUNT);
            snprintf(g_case, sizeof(g_case), "soft_max [%ld,%ld,%ld,%ld] %s mask=%d scale=%g",
                     (long)ne[0], (long)ne[1], (long)ne[2], (long)ne[3], layout_name[lay], use_mask,
                     scale);
            bt_context *ctx = tu_ctx(4);
            struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, ne, lay, &r, -8, 8);
            struct bt_tensor *mask = NULL;
            int64_t nem[4] = {ne[0], ne[1] + 2, 1, 1};
            if (use_mask) {
                mask = bt_new_tensor_2d(ctx, BT_TYPE_F32, nem[0], nem[1]);
                tu_fill_uniform(mask, &r, -2, 2);
                /* -inf everywhere except column 0 in a few places (causal-like) */
                float *m = tu_data(mask);
                for (int64_t i1 = 0; i1 < nem[1]; i1++)
                    for (int64_t i0 = 1; i0 < nem[0]; i0++)
                        if ((i0 + i1) % 3 == 0) m[i1 * nem[0] + i0] = -INFINITY;
            }
            struct bt_tensor *out = (!use_mask && scale == 1.0f) ? bt_soft_max(ctx, a)
                                                                 : bt_soft_max_ext(ctx, a, mask, scale);
            struct bt_graph *g = graph1(ctx, out);
            ck_assert(bt_are_same_shape(out, a));
            float *A = tu_read_f32(a);
            float *M = mask ? tu_read_f32(mask) : NULL;
            float *ref = malloc(sizeof(float) * nel4(ne));
            double *tmp = malloc(sizeof(double) * ne[0]);
            for (int64_t i3 = 0; i3 < ne[3]; i3++)
                for (int64_t i2 = 0; i2 < ne[2]; i2++)
                    for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                        double mx = -INFINITY, sum = 0;
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) {
                            double v = (double)A[idx4(ne, i0, i1, i2, i3)] * scale;
                            if (M) v += M[i1 * nem[0] + i0];
                            tmp[i0] = v;
                            if (v > mx) mx = v;
                        }
                        for (int64_t i0 = 0; i0 < ne[0]; i0++) sum += (tmp[i0] = exp(tmp[i0] - mx));
                        for (int64_t i0 = 0; i0 < ne[0]; i0++)
                            ref[idx4(ne, i0, i1, i2, i3)] = (float)(tmp[i0] / sum);
                    }
            require_supported(out);
            {
                for (int nt = 1; nt <= MAX_NT; nt++) {
                    run_nt(g, out, nt);
                    check_nmse(out, ref, TOL_ELEM, nt);
                    /* masked entries are exactly 0 */
                    float *o = tu_read_f32(out);
                    for (int64_t i = 0; i < nel4(ne); i++)
                        if (ref[i] == 0.0f) ck_assert_msg(o[i] == 0.0f, "%s: masked %g", g_case, o[i]);
                    free(o);
                }
            }
            free(A);
            free(M);
            free(ref);
            free(tmp);
            bt_free(ctx);
        }
    }
}
END_TEST

/* ---- rope ---- */

START_TEST(test_rope) {
    tu_rng r;
    tu_rng_init(&r, 500);
    struct {
        int64_t d, nh, T;
        int n_dims;
    } cfg[] = {{64, 2, 5, 64}, {64, 3, 9, 32}, {6, 1, 1, 4}, {128, 2, 3, 96}, {16, 4, 17, 2}};
    const int modes[2] = {BT_ROPE_NORMAL, BT_ROPE_NEOX};
    for (int ci = 0; ci < 5; ci++)
        for (int mi = 0; mi < 2; mi++)
            for (int fi = 0; fi < 2; fi++) {
                int64_t ne[4] = {cfg[ci].d, cfg[ci].nh, cfg[ci].T, 1};
                int n_dims = cfg[ci].n_dims, mode = modes[mi];
                float base = fi ? 500000.0f : 10000.0f, fscale = fi ? 0.25f : 1.0f;
                enum layout lay = (ci + mi + fi) % 2 ? L_STRIDED : L_CONT;
                snprintf(g_case, sizeof(g_case), "rope [%ld,%ld,%ld] %s n_dims=%d mode=%d base=%g fs=%g",
                         (long)ne[0], (long)ne[1], (long)ne[2], layout_name[lay], n_dims, mode, base,
                         fscale);
                bt_context *ctx = tu_ctx(4);
                struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, ne, lay, &r, -1, 1);
                struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, ne[2]);
                tu_fill_ids(pos, &r, 200);
                struct bt_tensor *out = bt_rope(ctx, a, pos, n_dims, mode, base, fscale);
                struct bt_graph *g = graph1(ctx, out);
                ck_assert_int_eq(bt_get_op_param_i32(out, 0), n_dims);
                ck_assert_int_eq(bt_get_op_param_i32(out, 1), mode);
                ck_assert_float_eq(bt_get_op_param_f32(out, 2), base);
                ck_assert_float_eq(bt_get_op_param_f32(out, 3), fscale);
                float *A = tu_read_f32(a);
                int32_t *P = tu_read_i32(pos);
                float *ref = malloc(sizeof(float) * nel4(ne));
                memcpy(ref, A, sizeof(float) * nel4(ne)); /* dims >= n_dims pass through */
                for (int64_t t = 0; t < ne[2]; t++)
                    for (int64_t h = 0; h < ne[1]; h++) {
                        const float *x = A + idx4(ne, 0, h, t, 0);
                        float *y = ref + idx4(ne, 0, h, t, 0);
                        for (int i = 0; i < n_dims / 2; i++) {
                            double theta = P[t] * (double)fscale * pow(base, -2.0 * i / n_dims);
                            double c = cos(theta), s = sin(theta);
                            int j0 = mode == BT_ROPE_NEOX ? i : 2 * i;
                            int j1 = mode == BT_ROPE_NEOX ? i + n_dims / 2 : 2 * i + 1;
                            y[j0] = (float)(x[j0] * c - x[j1] * s);
                            y[j1] = (float)(x[j0] * s + x[j1] * c);
                        }
                    }
                require_supported(out);
                {
                    for (int nt = 1; nt <= MAX_NT; nt++) {
                        run_nt(g, out, nt);
                        check_nmse(out, ref, TOL_ELEM, nt);
                        /* pass-through dims are exact */
                        float *o = tu_read_f32(out);
                        for (int64_t row = 0; row < ne[1] * ne[2]; row++)
                            for (int64_t i = n_dims; i < ne[0]; i++)
                                ck_assert_float_eq(o[row * ne[0] + i], A[row * ne[0] + i]);
                        free(o);
                    }
                }
                free(A);
                free(P);
                free(ref);
                bt_free(ctx);
            }
}
END_TEST

/* YaRN (ggml's rope_yarn, written out here in double): the ramp mixes the
 * interpolated and the extrapolated angle between the correction dims; the
 * magnitude is attn_factor * (1 + 0.1 ln(1/freq_scale)); with ext_factor 0
 * only attn_factor scales. */
START_TEST(test_rope_yarn) {
    /* the corr dims of DeepSeek-V3's rope (64 dims, 4096 positions, base
     * 10000, betas 32 and 1), and one clamped below at 0 */
    float dims[2];
    bt_rope_yarn_corr_dims(64, 4096, 10000.0f, 32.0f, 1.0f, dims);
    ck_assert_float_eq(dims[0], 10.0f);
    ck_assert_float_eq(dims[1], 23.0f);
    bt_rope_yarn_corr_dims(32, 32, 10000.0f, 32.0f, 1.0f, dims);
    ck_assert_float_eq(dims[0], 0.0f);
    ck_assert_float_eq(dims[1], 3.0f);
    tu_rng r;
    tu_rng_init(&r, 501);
    const int64_t ne[4] = {64, 3, 7, 1};
    const int n_dims = 64;
    const float base = 10000.0f, fscale = 0.025f;
    const struct bt_rope_yarn cases[3] = {
        {1.0f, 1.0f, 32.0f, 1.0f, 4096}, {0.5f, 0.7f, 32.0f, 1.0f, 2048}, {0.0f, 1.3f, 0.0f, 0.0f, 0}};
    for (int ci = 0; ci < 3; ci++)
        for (int mode = 0; mode <= BT_ROPE_NEOX; mode += BT_ROPE_NEOX) {
            const struct bt_rope_yarn *y = &cases[ci];
            snprintf(g_case, sizeof(g_case), "rope yarn ext %g attn %g mode %d", (double)y->ext_factor,
                     (double)y->attn_factor, mode);
            bt_context *ctx = tu_ctx(4);
            struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, ne, L_CONT, &r, -1, 1);
            struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, ne[2]);
            tu_fill_ids(pos, &r, 3000);
            struct bt_tensor *out = bt_rope_ext(ctx, a, pos, n_dims, mode, base, fscale, y);
            ck_assert_ptr_nonnull(out);
            struct bt_graph *g = graph1(ctx, out);
            float *A = tu_read_f32(a);
            int32_t *P = tu_read_i32(pos);
            float *ref = malloc(sizeof(float) * nel4(ne));
            double lo = 0, hi = 0;
            if (y->ext_factor != 0.0f) {
                const double two_pi = 2.0 * 3.14159265358979323846;
                lo = floor(n_dims * log(y->n_ctx_orig / (y->beta_fast * two_pi)) / (2 * log(base)));
                hi = ceil(n_dims * log(y->n_ctx_orig / (y->beta_slow * two_pi)) / (2 * log(base)));
                lo = lo > 0 ? lo : 0;
                hi = hi < n_dims - 1 ? hi : n_dims - 1;
            }
            for (int64_t t = 0; t < ne[2]; t++)
                for (int64_t h = 0; h < ne[1]; h++) {
                    const float *x = A + idx4(ne, 0, h, t, 0);
                    float *o = ref + idx4(ne, 0, h, t, 0);
                    for (int i = 0; i < n_dims / 2; i++) {
                        const double ex = P[t] * pow(base, -2.0 * i / n_dims), in = fscale * ex;
                        double theta = in, m = y->attn_factor;
                        if (y->ext_factor != 0.0f) {
                            double ramp = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
                            ramp = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
                            const double mix = ramp * y->ext_factor;
                            theta = in * (1 - mix) + ex * mix;
                            m *= 1.0 + 0.1 * log(1.0 / fscale);
                        }
                        const double c = cos(theta) * m, s = sin(theta) * m;
                        const int j0 = mode == BT_ROPE_NEOX ? i : 2 * i;
                        const int j1 = mode == BT_ROPE_NEOX ? i + n_dims / 2 : 2 * i + 1;
                        o[j0] = (float)(x[j0] * c - x[j1] * s);
                        o[j1] = (float)(x[j0] * s + x[j1] * c);
                    }
                }
            require_supported(out);
            for (int nt = 1; nt <= MAX_NT; nt++) {
                run_nt(g, out, nt);
                check_nmse(out, ref, TOL_ELEM, nt);
            }
            free(A);
            free(P);
            free(ref);
            bt_free(ctx);
        }
    /* a ramp without the context it was trained on is refused */
    bt_context *ctx = tu_ctx(1);
    int64_t qe[4] = {8, 1, 2, 1};
    struct bt_tensor *q = bt_new_tensor(ctx, BT_TYPE_F32, 3, qe);
    struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, 2);
    const struct bt_rope_yarn bad = {1.0f, 1.0f, 32.0f, 1.0f, 0};
    ck_assert_ptr_null(bt_rope_ext(ctx, q, pos, 8, BT_ROPE_NEOX, 1e4f, 0.5f, &bad));
    ck_assert_ptr_nonnull(strstr(bt_context_error(ctx), "YaRN"));
    bt_free(ctx);
}
END_TEST

/* ---- mul_mat ---- */

static const enum bt_type wtypes[] = {BT_TYPE_F32,  BT_TYPE_F16,  BT_TYPE_BF16, BT_TYPE_Q8_0, BT_TYPE_Q4_0,
                                      /* quants.h's weight types */
                                      BT_TYPE_Q4_1, BT_TYPE_Q5_0, BT_TYPE_Q5_1, BT_TYPE_Q2_K, BT_TYPE_Q3_K,
                                      BT_TYPE_Q4_K, BT_TYPE_Q5_K, BT_TYPE_Q6_K, BT_TYPE_MXFP4, BT_TYPE_IQ4_NL,
                                      BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS, BT_TYPE_IQ2_S, BT_TYPE_IQ3_XXS,
                                      BT_TYPE_IQ3_S, BT_TYPE_IQ1_S};
#define N_WTYPES ((int)(sizeof wtypes / sizeof wtypes[0]))
/* k rounded up to whole blocks of the weight type */
static int64_t k_blocks(enum bt_type t, int64_t k) { return (k + bt_blck_size(t) - 1) / bt_blck_size(t) * bt_blck_size(t); }

static void run_matmul_modes(struct bt_graph *g, struct bt_tensor *out, const float *ref) {
    for (int nt = 1; nt <= MAX_NT; nt++) {
        run_nt(g, out, nt);
        check_nmse(out, ref, tol_matmul(out->src[0]->type), nt);
    }
    /* the plain reference kernels too */
    for (int nt = 1; nt <= 3; nt += 2) {
        bt_cpu *cpu = tu_cpu(nt);
        bt_cpu_set_reference(cpu, true);
        memset(tu_data(out), 0xff, bt_nbytes(out));
        enum bt_status s = bt_cpu_graph_compute(cpu, g);
        bt_cpu_set_reference(cpu, false);
        ck_assert_msg(s == BT_OK, "%s: reference nt=%d: %s", g_case, nt, bt_cpu_error(cpu));
        double e = tu_nmse_tensor(out, ref);
        ck_assert_msg(e <= TOL_MATMUL_REF, "%s: reference kernels nt=%d: NMSE %g", g_case, nt, e);
    }
}

START_TEST(test_mul_mat) {
    enum bt_type wt = wtypes[_i];
    tu_rng r;
    tu_rng_init(&r, 600 + _i);
    static const int64_t kmn[][3] = {{1, 1, 1},    {3, 3, 1},    {17, 5, 3},  {33, 17, 17},
                                     {67, 33, 5},  {128, 7, 33}, {256, 65, 9}, {1024, 64, 2}};
    static const int64_t bc[][4] = {/* a2, a3, b2, b3 */
                                    {1, 1, 1, 1}, {2, 3, 2, 3}, {1, 1, 4, 1}, {2, 1, 4, 3}, {2, 3, 4, 6}};
    int case_no = 0;
    for (int ki = 0; ki < 8; ki++)
        for (int bi = 0; bi < 5; bi++) {
            int64_t k = kmn[ki][0], m = kmn[ki][1], n = kmn[ki][2];
            if (is_block(wt)) k = k_blocks(wt, k);
            if (bi > 0 && k * m * n > 40000) continue; /* keep the broadcast cases small */
            enum layout la = case_no % 2 ? L_CONT : (is_block(wt) ? L_STRIDED : L_PERM);
            enum layout lb = (enum layout)((case_no / 2) % 3 == 0 ? L_CONT : (case_no / 2) % 3 == 1 ? L_STRIDED : L_PERM);
            case_no++;
            int64_t nea[4] = {k, m, bc[bi][0], bc[bi][1]}, neb[4] = {k, n, bc[bi][2], bc[bi][3]};
            snprintf(g_case, sizeof(g_case), "mul_mat %s a[%ld,%ld,%ld,%ld] %s b[%ld,%ld,%ld,%ld] %s",
                     bt_type_name(wt), (long)nea[0], (long)nea[1], (long)nea[2], (long)nea[3],
                     layout_name[la], (long)neb[0], (long)neb[1], (long)neb[2], (long)neb[3],
                     layout_name[lb]);
            bt_context *ctx = tu_ctx(16);
            struct bt_tensor *a = new_input(ctx, wt, nea, la, &r, -1, 1);
            struct bt_tensor *b = new_input(ctx, BT_TYPE_F32, neb, lb, &r, -1, 1);
            struct bt_tensor *out = bt_mul_mat(ctx, a, b);
            struct bt_graph *g = graph1(ctx, out);
            ck_assert_int_eq(out->type, BT_TYPE_F32);
            ck_assert_int_eq(out->ne[0], m);
            ck_assert_int_eq(out->ne[1], n);
            ck_assert_int_eq(out->ne[2], neb[2]);
            ck_assert_int_eq(out->ne[3], neb[3]);
            float *A = tu_read_f32(a), *B = tu_read_f32(b); /* A dequantised: bt_row_to_f32 */
            int64_t neo[4] = {m, n, neb[2], neb[3]};
            float *ref = malloc(sizeof(float) * nel4(neo));
            int64_t r2 = neb[2] / nea[2], r3 = neb[3] / nea[3];
            for (int64_t i3 = 0; i3 < neo[3]; i3++)
                for (int64_t i2 = 0; i2 < neo[2]; i2++)
                    for (int64_t j = 0; j < n; j++)
                        for (int64_t i = 0; i < m; i++) {
                            const float *ar = A + idx4(nea, 0, i, i2 / r2, i3 / r3);
                            const float *bcol = B + idx4(neb, 0, j, i2, i3);
                            double s = 0;
                            for (int64_t kk = 0; kk < k; kk++) s += (double)ar[kk] * bcol[kk];
                            ref[idx4(neo, i, j, i2, i3)] = (float)s;
                        }
            require_supported(out);
        run_matmul_modes(g, out, ref);
            free(A);
            free(B);
            free(ref);
            bt_free(ctx);
        }
}
END_TEST

/* Every weight type: the CPU either computes the product (to its bound) or
 * declines it up front with a clear error, never aborts.  F32, F16, BF16,
 * Q8_0 and Q4_0 must be computed; a type registered in qtypes.h later is
 * checked here without a change. */
START_TEST(test_mul_mat_every_type) {
    const enum bt_type wt = (enum bt_type)_i;
    if (wt == BT_TYPE_I32 || wt == BT_TYPE_Q8_K) return; /* not weight types */
    tu_rng r;
    tu_rng_init(&r, 650 + _i);
    const int64_t k = 512, m = 19, n = 11; /* n: both the dot and GEMM paths */
    for (int ncols = 1; ncols <= n; ncols += n - 1) {
        snprintf(g_case, sizeof(g_case), "mul_mat %s a[%ld,%ld] b[%ld,%d]", bt_type_name(wt),
                 (long)k, (long)m, (long)k, ncols);
        bt_context *ctx = tu_ctx(16);
        struct bt_tensor *a = bt_new_tensor_2d(ctx, wt, k, m);
        struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, k, ncols);
        ck_assert_msg(a && b, "%s: %s", g_case, bt_context_error(ctx));
        tu_fill(a, &r);
        tu_fill(b, &r);
        struct bt_tensor *out = bt_mul_mat(ctx, a, b);
        struct bt_graph *g = graph1(ctx, out);
        if (!bt_cpu_supports_op(out)) {
            ck_assert_msg(wt != BT_TYPE_F32 && wt != BT_TYPE_F16 && wt != BT_TYPE_BF16 &&
                              wt != BT_TYPE_Q8_0 && wt != BT_TYPE_Q4_0,
                          "%s: the CPU declines a type it must compute", g_case);
            ck_assert_int_eq(tu_run(g, 2), BT_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(bt_cpu_error(tu_cpu(2)), "not supported") != NULL, "%s: %s",
                          g_case, bt_cpu_error(tu_cpu(2)));
        } else {
            float *A = tu_read_f32(a), *B = tu_read_f32(b);
            float *ref = malloc(sizeof(float) * (size_t)(m * ncols));
            for (int64_t j = 0; j < ncols; j++)
                for (int64_t i = 0; i < m; i++) {
                    double s2 = 0;
                    for (int64_t kk = 0; kk < k; kk++) s2 += (double)A[i * k + kk] * B[j * k + kk];
                    ref[j * m + i] = (float)s2;
                }
            run_matmul_modes(g, out, ref);
            free(A);
            free(B);
            free(ref);
        }
        bt_free(ctx);
    }
}
END_TEST

/* ---- mul_mat_id ---- */

START_TEST(test_mul_mat_id) {
    enum bt_type wt = wtypes[_i];
    tu_rng r;
    tu_rng_init(&r, 700 + _i);
    struct {
        int64_t k, m, n_expert, n_used, T;
        bool bcast_b; /* n_b = 1 */
        int ids_mode; /* 0 random (repeats), 1 all the same expert, 2 strided ids view */
    } cfg[] = {
        {64, 17, 4, 2, 3, false, 0}, {64, 17, 4, 2, 3, true, 0},  {96, 33, 8, 4, 17, false, 0},
        {32, 5, 8, 1, 9, true, 1},   {64, 3, 8, 2, 17, false, 1}, {128, 40, 6, 3, 5, true, 2},
        {64, 67, 8, 2, 33, false, 2},
    };
    for (int ci = 0; ci < 7; ci++) {
        int64_t k = cfg[ci].k, m = cfg[ci].m, ne_ = cfg[ci].n_expert, nu = cfg[ci].n_used,
                T = cfg[ci].T;
        if (!is_block(wt)) k -= 1; /* odd k for the plain types */
        k = k_blocks(wt, k);
        int64_t nb_ = cfg[ci].bcast_b ? 1 : nu;
        enum layout lb = ci % 3 == 2 ? L_PERM : L_CONT;
        snprintf(g_case, sizeof(g_case),
                 "mul_mat_id %s as[%ld,%ld,%ld] b[%ld,%ld,%ld] %s ids[%ld,%ld] mode %d",
                 bt_type_name(wt), (long)k, (long)m, (long)ne_, (long)k, (long)nb_, (long)T,
                 layout_name[lb], (long)nu, (long)T, cfg[ci].ids_mode);
        bt_context *ctx = tu_ctx(16);
        int64_t nea[4] = {k, m, ne_, 1}, neb[4] = {k, nb_, T, 1};
        struct bt_tensor *as = new_input(ctx, wt, nea, L_CONT, &r, -1, 1);
        struct bt_tensor *b = new_input(ctx, BT_TYPE_F32, neb, lb, &r, -1, 1);
        struct bt_tensor *ids;
        if (cfg[ci].ids_mode == 2) {
            /* a view of the first n_used of n_used+3 ids per token (like top_k) */
            struct bt_tensor *all = bt_new_tensor_2d(ctx, BT_TYPE_I32, nu + 3, T);
            for (int64_t i = 0; i < (nu + 3) * T; i++) ((int32_t *)all->data)[i] = 1000000; /* poison */
            ids = bt_view_2d(ctx, all, nu, T, all->nb[1], 0);
            TU_OK(ctx, ids);
            tu_fill_ids(ids, &r, (int32_t)ne_);
        } else {
            ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, nu, T);
            if (cfg[ci].ids_mode == 1)
                tu_fill_uniform(ids, &r, (float)(ne_ - 1), (float)ne_);
            else
                tu_fill_ids(ids, &r, (int32_t)ne_);
        }
        struct bt_tensor *out = bt_mul_mat_id(ctx, as, b, ids);
        struct bt_graph *g = graph1(ctx, out);
        ck_assert_int_eq(out->type, BT_TYPE_F32);
        ck_assert_int_eq(out->ne[0], m);
        ck_assert_int_eq(out->ne[1], nu);
        ck_assert_int_eq(out->ne[2], T);
        float *A = tu_read_f32(as), *B = tu_read_f32(b);
        int32_t *I = tu_read_i32(ids);
        float *ref = malloc(sizeof(float) * m * nu * T);
        for (int64_t t = 0; t < T; t++)
            for (int64_t e = 0; e < nu; e++) {
                int32_t ex = I[e + nu * t];
                ck_assert(ex >= 0 && ex < ne_);
                const float *bcol = B + idx4(neb, 0, e % nb_, t, 0);
                for (int64_t i = 0; i < m; i++) {
                    const float *ar = A + idx4(nea, 0, i, ex, 0);
                    double s = 0;
                    for (int64_t kk = 0; kk < k; kk++) s += (double)ar[kk] * bcol[kk];
                    ref[i + m * (e + nu * t)] = (float)s;
                }
            }
        require_supported(out);
        run_matmul_modes(g, out, ref);
        free(A);
        free(B);
        free(I);
        free(ref);
        bt_free(ctx);
    }
}
END_TEST

/* An expert group's share (bt_tensor expert_lo/hi): MUL_MAT_ID computes only
 * the (slot, token) pairs whose expert is held, bitwise what the whole node
 * gives them, and leaves every other row of its result as it was; the two
 * shares of a split together give the whole result.  1 and 3 threads, a
 * decode column and a prompt's worth (the GEMM paths). */
START_TEST(test_mul_mat_id_share) {
    enum bt_type wt = wtypes[_i];
    tu_rng r;
    tu_rng_init(&r, 750 + _i);
    const int64_t E = 6, nu = 2, m = 33;
    const int64_t k = k_blocks(wt, is_block(wt) ? 64 : 63);
    for (int ti = 0; ti < 2; ti++) {
        const int64_t T = ti ? 40 : 1;
        bt_context *ctx = tu_ctx(16);
        int64_t nea[4] = {k, m, E, 1}, neb[4] = {k, 1, T, 1};
        struct bt_tensor *as = new_input(ctx, wt, nea, L_CONT, &r, -1, 1);
        struct bt_tensor *b = new_input(ctx, BT_TYPE_F32, neb, L_CONT, &r, -1, 1);
        struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, nu, T);
        tu_fill_ids(ids, &r, (int32_t)E);
        struct bt_tensor *out = bt_mul_mat_id(ctx, as, b, ids);
        struct bt_graph *g = graph1(ctx, out);
        require_supported(out);
        const size_t n = (size_t)(m * nu * T);
        float *whole = malloc(n * sizeof(float)), *both = malloc(n * sizeof(float));
        for (int nt = 1; nt <= 3; nt += 2) {
            as->expert_lo = as->expert_hi = 0;
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            memcpy(whole, out->data, n * sizeof(float));
            for (size_t i = 0; i < n; i++) both[i] = NAN;
            const int64_t cut[3] = {0, 2, E};
            for (int sh = 0; sh < 2; sh++) {
                as->expert_lo = (int32_t)cut[sh];
                as->expert_hi = (int32_t)cut[sh + 1];
                float *o = out->data;
                for (size_t i = 0; i < n; i++) o[i] = -7.0f; /* what was there */
                ck_assert_int_eq(tu_run(g, nt), BT_OK);
                const int32_t *I = ids->data;
                for (int64_t t = 0; t < T; t++)
                    for (int64_t e = 0; e < nu; e++) {
                        const bool held = I[e + nu * t] >= cut[sh] && I[e + nu * t] < cut[sh + 1];
                        for (int64_t i = 0; i < m; i++) {
                            const size_t at = (size_t)(i + m * (e + nu * t));
                            if (held) {
                                both[at] = o[at];
                            } else {
                                ck_assert_msg(o[at] == -7.0f, "%s T %lld: a row of an expert not held was written",
                                              bt_type_name(wt), (long long)T);
                            }
                        }
                    }
            }
            ck_assert_msg(memcmp(whole, both, n * sizeof(float)) == 0,
                          "%s T %lld threads %d: the shares differ from the whole node", bt_type_name(wt),
                          (long long)T, nt);
        }
        free(whole);
        free(both);
        bt_free(ctx);
    }
}
END_TEST

/* An attention's per-head product divided by heads (bt_tensor expert_lo/hi
 * of a 3-d weight: dist.c's heads chains): MUL_MAT computes only the held
 * heads' matrices of its result, bitwise the whole node's, over an input
 * with its heads and tokens swapped (MLA's q_nope_perm), leaving the other
 * matrices as they were; the shares together give the whole.  1 and 3
 * threads, one token and a prompt's worth. */
START_TEST(test_mul_mat_heads_share) {
    enum bt_type wt = wtypes[_i];
    tu_rng r;
    tu_rng_init(&r, 770 + _i);
    const int64_t H = 5, m = 33;
    const int64_t k = k_blocks(wt, is_block(wt) ? 64 : 63);
    for (int ti = 0; ti < 2; ti++) {
        const int64_t T = ti ? 40 : 1;
        snprintf(g_case, sizeof(g_case), "heads share %s T %lld", bt_type_name(wt), (long long)T);
        bt_context *ctx = tu_ctx(16);
        int64_t nea[4] = {k, m, H, 1}, neb[4] = {k, T, H, 1};
        struct bt_tensor *a = new_input(ctx, wt, nea, L_CONT, &r, -1, 1);
        struct bt_tensor *b = new_input(ctx, BT_TYPE_F32, neb, L_PERM, &r, -1, 1);
        struct bt_tensor *out = bt_mul_mat(ctx, a, b);
        struct bt_graph *g = graph1(ctx, out);
        require_supported(out);
        const size_t n = (size_t)(m * T * H), per = (size_t)(m * T);
        float *whole = malloc(n * sizeof(float)), *both = malloc(n * sizeof(float));
        for (int nt = 1; nt <= 3; nt += 2) {
            a->expert_lo = a->expert_hi = 0;
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            memcpy(whole, out->data, n * sizeof(float));
            const int64_t cut[3] = {0, 2, H};
            for (int sh = 0; sh < 2; sh++) {
                a->expert_lo = (int32_t)cut[sh];
                a->expert_hi = (int32_t)cut[sh + 1];
                float *o = out->data;
                for (size_t i = 0; i < n; i++) o[i] = -7.0f; /* what was there */
                ck_assert_int_eq(tu_run(g, nt), BT_OK);
                for (size_t i = 0; i < n; i++) {
                    const int64_t h = (int64_t)(i / per);
                    if (h >= cut[sh] && h < cut[sh + 1])
                        both[i] = o[i];
                    else
                        ck_assert_msg(o[i] == -7.0f, "%s: a matrix of a head not held was written", g_case);
                }
            }
            a->expert_lo = a->expert_hi = 0;
            ck_assert_msg(memcmp(whole, both, n * sizeof(float)) == 0, "%s threads %d: the shares differ from the whole",
                          g_case, nt);
        }
        free(whole);
        free(both);
        bt_free(ctx);
    }
}
END_TEST

/* A group's share of a prompt's tokens (bt_tensor col_lo/hi of the node:
 * dist.c's dense products divided by tokens): MUL_MAT computes only those
 * columns of its result, bitwise the whole node's, leaving the others as
 * they were; the shares together give the whole.  With the weight's
 * row_lo/hi as well (a share of rows inside the columns) only that block.
 * 1 and 3 threads, cuts below and above the GEMM's width. */
START_TEST(test_mul_mat_cols_share) {
    enum bt_type wt = wtypes[_i];
    tu_rng r;
    tu_rng_init(&r, 790 + _i);
    const int64_t m = 64, T = 70;
    const int64_t k = k_blocks(wt, is_block(wt) ? 64 : 63);
    snprintf(g_case, sizeof(g_case), "cols share %s", bt_type_name(wt));
    bt_context *ctx = tu_ctx(16);
    int64_t nea[4] = {k, m, 1, 1}, neb[4] = {k, T, 1, 1};
    struct bt_tensor *a = new_input(ctx, wt, nea, L_CONT, &r, -1, 1);
    struct bt_tensor *b = new_input(ctx, BT_TYPE_F32, neb, L_CONT, &r, -1, 1);
    struct bt_tensor *out = bt_mul_mat(ctx, a, b);
    struct bt_graph *g = graph1(ctx, out);
    require_supported(out);
    const size_t n = (size_t)(m * T);
    float *whole = malloc(n * sizeof(float)), *both = malloc(n * sizeof(float));
    for (int nt = 1; nt <= 3; nt += 2) {
        ck_assert_int_eq(tu_run(g, nt), BT_OK);
        memcpy(whole, out->data, n * sizeof(float));
        for (int rows = 0; rows < 2; rows++) {
            const int64_t cut[3] = {0, 3, T}, rlo = rows ? 32 : 0, rhi = m;
            for (size_t i = 0; i < n; i++) both[i] = NAN;
            for (int sh = 0; sh < 2; sh++) {
                out->col_lo = (int32_t)cut[sh];
                out->col_hi = (int32_t)cut[sh + 1];
                a->row_lo = (int32_t)rlo;
                a->row_hi = rows ? (int32_t)rhi : 0;
                float *o = out->data;
                for (size_t i = 0; i < n; i++) o[i] = -7.0f; /* what was there */
                ck_assert_int_eq(tu_run(g, nt), BT_OK);
                for (size_t i = 0; i < n; i++) {
                    const int64_t row = (int64_t)(i % (size_t)m), col = (int64_t)(i / (size_t)m);
                    if (col >= cut[sh] && col < cut[sh + 1] && row >= rlo && row < rhi)
                        both[i] = o[i];
                    else
                        ck_assert_msg(o[i] == -7.0f, "%s: element (%lld, %lld) outside the share was written", g_case,
                                      (long long)row, (long long)col);
                }
            }
            out->col_lo = out->col_hi = a->row_lo = a->row_hi = 0;
            for (size_t i = 0; i < n; i++)
                if ((int64_t)(i % (size_t)m) >= rlo)
                    ck_assert_msg(memcmp(&whole[i], &both[i], sizeof(float)) == 0,
                                  "%s threads %d rows %d: element %zu of the shares differs from the whole", g_case,
                                  nt, rows, i);
        }
    }
    free(whole);
    free(both);
    bt_free(ctx);
}
END_TEST

/* ---- get_rows ---- */

START_TEST(test_get_rows) {
    const enum bt_type types[9] = {BT_TYPE_F32,   BT_TYPE_F16,    BT_TYPE_BF16,  BT_TYPE_Q8_0,   BT_TYPE_Q4_0,
                                   BT_TYPE_I32,   BT_TYPE_MXFP4,  BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS};
    enum bt_type ty = types[_i];
    tu_rng r;
    tu_rng_init(&r, 800 + _i);
    static const int64_t gshapes[][5] = {/* n0, n1, n2, n3, nr */
                                         {7, 5, 1, 1, 1},  {33, 4, 2, 1, 11}, {64, 9, 3, 2, 4},
                                         {1, 3, 1, 1, 5},  {96, 1, 1, 1, 3}, {256, 17, 1, 1, 17}};
    for (int si = 0; si < 6; si++) {
        int64_t ne[4] = {gshapes[si][0], gshapes[si][1], gshapes[si][2], gshapes[si][3]};
        int64_t nr = gshapes[si][4];
        if (is_block(ty)) ne[0] = (ne[0] + bt_blck_size(ty) - 1) / bt_blck_size(ty) * bt_blck_size(ty);
        enum layout lay = si % 2 && !is_block(ty) ? L_PERM : L_CONT;
        if (si == 5) lay = L_STRIDED;
        snprintf(g_case, sizeof(g_case), "get_rows %s a[%ld,%ld,%ld,%ld] %s ids[%ld,%ld,%ld]",
                 bt_type_name(ty), (long)ne[0], (long)ne[1], (long)ne[2], (long)ne[3],
                 layout_name[lay], (long)nr, (long)ne[2], (long)ne[3]);
        bt_context *ctx = tu_ctx(4);
        struct bt_tensor *a = ty == BT_TYPE_I32 ? new_input(ctx, ty, ne, lay, &r, -100000, 100000)
                                                : new_input(ctx, ty, ne, lay, &r, -1, 1);
        struct bt_tensor *ids = bt_new_tensor_3d(ctx, BT_TYPE_I32, nr, ne[2], ne[3]);
        tu_fill_ids(ids, &r, (int32_t)ne[1]);
        struct bt_tensor *out = bt_get_rows(ctx, a, ids);
        struct bt_graph *g = graph1(ctx, out);
        ck_assert_int_eq(out->type, ty == BT_TYPE_I32 ? BT_TYPE_I32 : BT_TYPE_F32);
        int64_t neo[4] = {ne[0], nr, ne[2], ne[3]};
        for (int d = 0; d < 4; d++) ck_assert_int_eq(out->ne[d], neo[d]);
        float *A = tu_read_f32(a);
        int32_t *I = tu_read_i32(ids);
        float *ref = malloc(sizeof(float) * nel4(neo));
        for (int64_t i3 = 0; i3 < ne[3]; i3++)
            for (int64_t i2 = 0; i2 < ne[2]; i2++)
                for (int64_t i = 0; i < nr; i++) {
                    int32_t row = I[i + nr * (i2 + ne[2] * i3)];
                    memcpy(ref + idx4(neo, 0, i, i2, i3), A + idx4(ne, 0, row, i2, i3),
                           sizeof(float) * ne[0]);
                }
        require_supported(out);
        {
            for (int nt = 1; nt <= MAX_NT; nt++) {
                run_nt(g, out, nt);
                float *o = tu_read_f32(out); /* dequantised by the same function: exact */
                for (int64_t i = 0; i < nel4(neo); i++)
                    ck_assert_msg(o[i] == ref[i], "%s: nt=%d: elem %ld: %g want %g", g_case, nt,
                                  (long)i, o[i], ref[i]);
                free(o);
            }
        }
        free(A);
        free(I);
        free(ref);
        bt_free(ctx);
    }
}
END_TEST

/* ---- set_rows and cpy into every type ---- */

static const enum bt_type dtypes[5] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16, BT_TYPE_Q8_0,
                                       BT_TYPE_Q4_0};

/* got (row of n values read back from type ty) against the F32 source: exact
 * conversion for plain types, at most one quantisation step for blocks */
static void check_converted(enum bt_type ty, const float *src, const float *got, int64_t n,
                            const char *what) {
    if (!is_block(ty)) {
        for (int64_t i = 0; i < n; i++) {
            float want = src[i];
            if (ty == BT_TYPE_F16) want = bt_fp16_to_fp32(bt_fp32_to_fp16(src[i]));
            if (ty == BT_TYPE_BF16) want = bt_bf16_to_fp32(bt_fp32_to_bf16(src[i]));
            ck_assert_msg(got[i] == want, "%s: %s elem %ld: %.9g want %.9g", g_case, what, (long)i,
                          got[i], want);
        }
        return;
    }
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(src[b * 32 + j]));
        /* one step: Q8_0 amax/127, Q4_0 amax/8 (ggml) - allow amax/7 schemes */
        float step = (ty == BT_TYPE_Q8_0 ? amax / 127.0f : amax / 7.0f) * 1.002f + 1e-7f;
        for (int j = 0; j < 32; j++) {
            float err = fabsf(got[b * 32 + j] - src[b * 32 + j]);
            ck_assert_msg(err <= step, "%s: %s elem %ld: %.9g want %.9g (step %g)", g_case, what,
                          (long)(b * 32 + j), got[b * 32 + j], src[b * 32 + j], step);
        }
    }
}

/* SET_ROWS into an F16 table (a prompt's cache rows): every element the
 * bits of bt_fp32_to_fp16 (round to nearest even; NaNs quietened, their
 * payload dropped), whichever CPU kernel runs: float bit patterns spread
 * over all 2^32, NaNs with payloads, infinities, ties, the edges of the
 * subnormals and of overflow, in rows that leave a tail of 7 */
START_TEST(test_set_rows_f16_bitwise) {
    const int64_t n0 = 1031, nr = 1024;
    bt_context *ctx = tu_ctx(16);
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F16, n0, nr), *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, n0, nr);
    struct bt_tensor *ids = bt_new_tensor_1d(ctx, BT_TYPE_I32, nr);
    TU_OK(ctx, ids);
    static const uint32_t special[] = {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, 0x7fd55555u, 0x7f800000u,
                                       0xff800000u, 0x477fefffu, 0x477ff000u, 0x477fe000u, 0x33000000u, 0x33000001u,
                                       0x387fc000u, 0x38800000u, 0x3f801000u, 0x3f803000u, 0x80000000u, 0u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    uint32_t *bits = b->data;
    for (int64_t i = 0; i < n0 * nr; i++) bits[i] = i % 97 < ns ? special[i % 97] : (uint32_t)i * 0x9e3779b1u;
    for (int64_t i = 0; i < nr; i++) ((int32_t *)ids->data)[i] = (int32_t)((i * 389) % nr);
    struct bt_tensor *out = bt_set_rows(ctx, a, b, ids);
    struct bt_graph *g = graph1(ctx, out);
    for (int nt = 1; nt <= 3; nt += 2) {
        memset(a->data, 0, bt_nbytes(a));
        ck_assert_int_eq(tu_run(g, nt), BT_OK);
        for (int64_t r = 0; r < nr; r++)
            for (int64_t i = 0; i < n0; i++) {
                float x;
                memcpy(&x, bits + r * n0 + i, sizeof x);
                const bt_fp16_t got = ((const bt_fp16_t *)a->data)[((r * 389) % nr) * n0 + i];
                ck_assert_msg(got == bt_fp32_to_fp16(x), "nt %d: 0x%08x -> 0x%04x, not 0x%04x", nt,
                              (unsigned)bits[r * n0 + i], (unsigned)got, (unsigned)bt_fp32_to_fp16(x));
            }
    }
    bt_free(ctx);
}
END_TEST

START_TEST(test_set_rows) {
    enum bt_type ty = dtypes[_i];
    tu_rng r;
    tu_rng_init(&r, 900 + _i);
    static const int64_t sshapes[][5] = {{64, 10, 2, 2, 4}, {32, 1, 1, 1, 1}, {96, 33, 3, 1, 17}};
    for (int si = 0; si < 3; si++) {
        int64_t ne[4] = {sshapes[si][0], sshapes[si][1], sshapes[si][2], sshapes[si][3]};
        int64_t nr = sshapes[si][4];
        if (!is_block(ty)) ne[0] -= 1; /* odd rows for plain types */
        enum layout lb = (enum layout)(si % 2 == 0 ? L_CONT : L_TRANS);
        if (si == 2) lb = L_STRIDED;
        snprintf(g_case, sizeof(g_case), "set_rows %s a[%ld,%ld,%ld,%ld] b rows %ld %s",
                 bt_type_name(ty), (long)ne[0], (long)ne[1], (long)ne[2], (long)ne[3], (long)nr,
                 layout_name[lb]);
        bt_context *ctx = tu_ctx(8);
        struct bt_tensor *a = new_input(ctx, ty, ne, L_CONT, &r, -1, 1);
        int64_t neb[4] = {ne[0], nr, ne[2], ne[3]};
        struct bt_tensor *b = new_input(ctx, BT_TYPE_F32, neb, lb, &r, -2, 2);
        struct bt_tensor *ids = bt_new_tensor_3d(ctx, BT_TYPE_I32, nr, ne[2], ne[3]);
        /* distinct rows per (i2,i3): a shuffled prefix */
        int32_t *idv = ids->data;
        for (int64_t p = 0; p < ne[2] * ne[3]; p++) {
            int32_t *perm = malloc(sizeof(int32_t) * ne[1]);
            for (int64_t i = 0; i < ne[1]; i++) perm[i] = (int32_t)i;
            for (int64_t i = ne[1] - 1; i > 0; i--) {
                int64_t j = tu_rng_int(&r, i + 1);
                int32_t t = perm[i];
                perm[i] = perm[j];
                perm[j] = t;
            }
            memcpy(idv + p * nr, perm, sizeof(int32_t) * nr);
            free(perm);
        }
        struct bt_tensor *out = bt_set_rows(ctx, a, b, ids);
        struct bt_graph *g = graph1(ctx, out);
        ck_assert_ptr_eq(out->view_src, a);
        ck_assert(bt_are_same_shape(out, a));
        size_t abytes = bt_nbytes(a);
        void *saved = malloc(abytes);
        memcpy(saved, a->data, abytes);
        float *A0 = tu_read_f32(a), *B = tu_read_f32(b);
        require_supported(out);
        {
            for (int nt = 1; nt <= MAX_NT; nt++) {
                memcpy(a->data, saved, abytes);
                run_nt(g, out, nt);
                float *A1 = tu_read_f32(a);
                for (int64_t i3 = 0; i3 < ne[3]; i3++)
                    for (int64_t i2 = 0; i2 < ne[2]; i2++) {
                        const int32_t *rows = idv + nr * (i2 + ne[2] * i3);
                        for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                            int64_t w = -1;
                            for (int64_t i = 0; i < nr; i++)
                                if (rows[i] == i1) w = i;
                            const float *got = A1 + idx4(ne, 0, i1, i2, i3);
                            char what[128];
                            snprintf(what, sizeof(what), "nt=%d row (%ld,%ld,%ld)", nt, (long)i1,
                                     (long)i2, (long)i3);
                            if (w < 0) {
                                ck_assert_msg(memcmp(got, A0 + idx4(ne, 0, i1, i2, i3),
                                                     sizeof(float) * ne[0]) == 0,
                                              "%s: %s not in ids was changed", g_case, what);
                            } else {
                                check_converted(ty, B + idx4(neb, 0, w, i2, i3), got, ne[0], what);
                            }
                        }
                    }
                free(A1);
            }
        }
        free(saved);
        free(A0);
        free(B);
        bt_free(ctx);
    }
}
END_TEST

START_TEST(test_cpy) {
    tu_rng r;
    tu_rng_init(&r, 1000);
    /* F32 source of 32*6*2 elements in every layout into every type, with a
     * different destination shape (only the element count matters) */
    for (int di = 0; di < 5; di++)
        for (int lay = 0; lay < L_COUNT; lay++)
            for (int same = 0; same < 2; same++) { /* same shape (row path) or reshaped */
                enum bt_type ty = dtypes[di];
                int64_t nes[4] = {32, 6, 2, 1};
                snprintf(g_case, sizeof(g_case), "cpy f32 [32,6,2] %s -> %s %s", layout_name[lay],
                         bt_type_name(ty), same ? "[32,6,2]" : "[64,3,2]");
                bt_context *ctx = tu_ctx(4);
                struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, nes, (enum layout)lay, &r, -1, 1);
                struct bt_tensor *dst = same ? bt_new_tensor_3d(ctx, ty, 32, 6, 2)
                                             : bt_new_tensor_3d(ctx, ty, 64, 3, 2);
                struct bt_tensor *out = bt_cpy(ctx, a, dst);
                struct bt_graph *g = graph1(ctx, out);
                ck_assert_ptr_eq(out->view_src, dst);
                float *A = tu_read_f32(a);
                require_supported(out);
                {
                    for (int nt = 1; nt <= MAX_NT; nt++) {
                        memset(dst->data, 0xff, bt_nbytes(dst));
                        run_nt(g, out, nt);
                        float *D = tu_read_f32(dst);
                        char what[32];
                        snprintf(what, sizeof(what), "nt=%d", nt);
                        check_converted(ty, A, D, 64 * 3 * 2, what);
                        free(D);
                    }
                }
                free(A);
                bt_free(ctx);
            }
    /* from F16 / BF16 into F32 and same-type copies of transposed views */
    const enum bt_type st[2] = {BT_TYPE_F16, BT_TYPE_BF16};
    for (int si = 0; si < 2; si++)
        for (int same = 0; same < 2; same++) {
            int64_t nes[4] = {17, 5, 3, 1};
            enum bt_type dty = same ? st[si] : BT_TYPE_F32;
            snprintf(g_case, sizeof(g_case), "cpy %s [17,5,3] transposed -> %s [85,3]",
                     bt_type_name(st[si]), bt_type_name(dty));
            bt_context *ctx = tu_ctx(4);
            struct bt_tensor *a = new_input(ctx, st[si], nes, L_TRANS, &r, -1, 1);
            struct bt_tensor *dst = bt_new_tensor_2d(ctx, dty, 85, 3);
            struct bt_tensor *out = bt_cpy(ctx, a, dst);
            struct bt_graph *g = graph1(ctx, out);
            float *A = tu_read_f32(a);
            require_supported(out);
            {
                for (int nt = 1; nt <= MAX_NT; nt++) {
                    memset(dst->data, 0xff, bt_nbytes(dst));
                    run_nt(g, out, nt);
                    float *D = tu_read_f32(dst);
                    for (int64_t i = 0; i < 85 * 3; i++)
                        ck_assert_msg(D[i] == A[i], "%s: nt=%d elem %ld: %g want %g", g_case, nt,
                                      (long)i, D[i], A[i]);
                    free(D);
                }
            }
            free(A);
            bt_free(ctx);
        }
}
END_TEST

/* ---- cont and the view ops ---- */

START_TEST(test_cont_views) {
    tu_rng r;
    tu_rng_init(&r, 1100);
    const enum bt_type types[4] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16, BT_TYPE_I32};
    const int64_t ne[4] = {6, 5, 4, 3};
    for (int ti = 0; ti < 4; ti++) {
        enum bt_type ty = types[ti];
        bt_context *ctx = tu_ctx(8);
        snprintf(g_case, sizeof(g_case), "views %s", bt_type_name(ty));
        struct bt_tensor *base = new_input(ctx, ty, ne, L_CONT, &r, -100, 100);
        float *X = tu_read_f32(base);

        /* permute (result dim axis[i] is a's dim i) */
        const int axes[3][4] = {{1, 0, 2, 3}, {2, 0, 3, 1}, {3, 2, 1, 0}};
        for (int pi = 0; pi < 3; pi++) {
            const int *ax = axes[pi];
            struct bt_tensor *p = bt_permute(ctx, base, ax[0], ax[1], ax[2], ax[3]);
            struct bt_tensor *c = bt_cont(ctx, p);
            snprintf(g_case, sizeof(g_case), "cont(permute %d,%d,%d,%d) %s", ax[0], ax[1], ax[2],
                     ax[3], bt_type_name(ty));
            struct bt_graph *g = graph1(ctx, c);
            ck_assert(bt_is_contiguous(c));
            ck_assert_int_eq(c->type, ty);
            int64_t nep[4];
            for (int d = 0; d < 4; d++) nep[ax[d]] = ne[d];
            for (int d = 0; d < 4; d++) ck_assert_int_eq(c->ne[d], nep[d]);
            for (int nt = 1; nt <= MAX_NT; nt++) {
                run_nt(g, c, nt);
                float *C = tu_read_f32(c);
                int64_t i[4];
                for (i[3] = 0; i[3] < ne[3]; i[3]++)
                    for (i[2] = 0; i[2] < ne[2]; i[2]++)
                        for (i[1] = 0; i[1] < ne[1]; i[1]++)
                            for (i[0] = 0; i[0] < ne[0]; i[0]++) {
                                int64_t j[4];
                                for (int d = 0; d < 4; d++) j[ax[d]] = i[d];
                                ck_assert_msg(C[idx4(nep, j[0], j[1], j[2], j[3])] ==
                                                  X[idx4(ne, i[0], i[1], i[2], i[3])],
                                              "%s nt=%d", g_case, nt);
                            }
                free(C);
            }
        }
        /* transpose of a 2d reshape */
        struct bt_tensor *r2 = bt_reshape_2d(ctx, base, 30, 12);
        struct bt_tensor *tr = bt_cont(ctx, bt_transpose(ctx, r2));
        snprintf(g_case, sizeof(g_case), "cont(transpose(reshape_2d)) %s", bt_type_name(ty));
        struct bt_graph *g = graph1(ctx, tr);
        ck_assert_int_eq(tr->ne[0], 12);
        ck_assert_int_eq(tr->ne[1], 30);
        run_nt(g, tr, 3);
        float *T = tu_read_f32(tr);
        for (int64_t i1 = 0; i1 < 30; i1++)
            for (int64_t i0 = 0; i0 < 12; i0++) ck_assert(T[i0 + 12 * i1] == X[i1 + 30 * i0]);
        free(T);

        /* reshapes keep the element order */
        struct bt_tensor *rs[4] = {bt_reshape_1d(ctx, base, 360), bt_reshape_2d(ctx, base, 9, 40),
                                   bt_reshape_3d(ctx, base, 2, 60, 3),
                                   bt_reshape_4d(ctx, base, 3, 3, 5, 8)};
        for (int k = 0; k < 4; k++) {
            TU_OK(ctx, rs[k]);
            ck_assert_int_eq(bt_nelements(rs[k]), 360);
            ck_assert_ptr_eq(tu_data(rs[k]), base->data);
            float *R = tu_read_f32(rs[k]);
            ck_assert(memcmp(R, X, sizeof(float) * 360) == 0);
            free(R);
        }

        /* view_1d..4d with offsets */
        size_t es = bt_type_size(ty);
        struct bt_tensor *v1 = bt_view_1d(ctx, base, 4, 7 * es);
        struct bt_tensor *v2 = bt_view_2d(ctx, base, 3, 4, base->nb[1], base->nb[1] + 2 * es);
        struct bt_tensor *v3 = bt_view_3d(ctx, base, 2, 3, 2, base->nb[2], base->nb[1], es);
        struct bt_tensor *v4 = bt_view_4d(ctx, base, 2, 2, 2, 2, 2 * base->nb[1], base->nb[2],
                                          base->nb[3], base->nb[3] + es);
        struct bt_tensor *vs[4] = {v1, v2, v3, v4};
        for (int k = 0; k < 4; k++) {
            TU_OK(ctx, vs[k]);
            ck_assert_ptr_eq(vs[k]->view_src, base);
            struct bt_tensor *c = bt_cont(ctx, vs[k]);
            snprintf(g_case, sizeof(g_case), "cont(view_%dd) %s", k + 1, bt_type_name(ty));
            struct bt_graph *gv = graph1(ctx, c);
            run_nt(gv, c, 1 + k % 4);
            float *C = tu_read_f32(c);
            const struct bt_tensor *v = vs[k];
            int64_t n = 0;
            for (int64_t i3 = 0; i3 < v->ne[3]; i3++)
                for (int64_t i2 = 0; i2 < v->ne[2]; i2++)
                    for (int64_t i1 = 0; i1 < v->ne[1]; i1++)
                        for (int64_t i0 = 0; i0 < v->ne[0]; i0++, n++) {
                            size_t off = v->view_offs + tu_offset(v, i0, i1, i2, i3);
                            ck_assert_uint_eq(off % es, 0);
                            ck_assert_msg(C[n] == X[off / es], "%s elem %ld", g_case, (long)n);
                        }
            free(C);
        }
        free(X);
        bt_free(ctx);
    }
}
END_TEST

/* ---- argsort and top_k ---- */

static const float *g_sort_row;
static int g_sort_desc;
static int cmp_idx(const void *pa, const void *pb) {
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    float va = g_sort_row[a], vb = g_sort_row[b];
    if (va != vb) return (va < vb) == !g_sort_desc ? -1 : 1;
    return a < b ? -1 : 1; /* stable: lower index first */
}

START_TEST(test_argsort_top_k) {
    tu_rng r;
    tu_rng_init(&r, 1200);
    static const int64_t ashapes[][4] = {{1, 3, 1, 1}, {3, 4, 1, 1}, {17, 5, 2, 1},
                                         {67, 3, 2, 2}, {200, 2, 1, 1}, {1000, 3, 1, 1}};
    for (int si = 0; si < 6; si++)
        for (int order = 0; order < 2; order++) {
            const int64_t *ne = ashapes[si];
            enum layout lay = (enum layout)((si + order) % L_COUNT);
            snprintf(g_case, sizeof(g_case), "argsort [%ld,%ld,%ld,%ld] %s %s", (long)ne[0],
                     (long)ne[1], (long)ne[2], (long)ne[3], layout_name[lay], order ? "DESC" : "ASC");
            bt_context *ctx = tu_ctx(4);
            struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, ne, lay, &r, -1, 1);
            float *A = tu_read_f32(a);
            /* many ties: round half of the rows to 5 levels */
            for (int64_t i = 0; i < nel4(ne); i++)
                if ((i / ne[0]) % 2 == 0) A[i] = floorf(A[i] * 2.5f) / 2.5f;
            tu_write_f32(a, A);
            struct bt_tensor *out = bt_argsort(ctx, a, order ? BT_SORT_DESC : BT_SORT_ASC);
            int kk = (int)(ne[0] < 5 ? ne[0] : 5);
            struct bt_tensor *tk = bt_top_k(ctx, a, kk);
            ck_assert_msg(out && tk, "%s: %s", g_case, bt_context_error(ctx));
            ck_assert_int_eq(out->type, BT_TYPE_I32);
            ck_assert(bt_are_same_shape(out, a));
            ck_assert_int_eq(tk->type, BT_TYPE_I32);
            ck_assert_int_eq(tk->ne[0], kk);
            for (int d = 1; d < 4; d++) ck_assert_int_eq(tk->ne[d], ne[d]);
            struct bt_tensor *outs[2] = {out, tk};
            struct bt_graph *g = tu_graph(ctx, outs, 2);
            int32_t *ref = malloc(sizeof(int32_t) * nel4(ne));
            int32_t *refd = malloc(sizeof(int32_t) * nel4(ne));
            for (int64_t row = 0; row < nel4(ne) / ne[0]; row++) {
                for (int dsc = 0; dsc < 2; dsc++) {
                    int32_t *dst = (dsc ? refd : ref) + row * ne[0];
                    for (int64_t i = 0; i < ne[0]; i++) dst[i] = (int32_t)i;
                    g_sort_row = A + row * ne[0];
                    g_sort_desc = dsc;
                    qsort(dst, ne[0], sizeof(int32_t), cmp_idx);
                }
            }
            const int32_t *want = order ? refd : ref;
            require_supported(out);
            {
                for (int nt = 1; nt <= MAX_NT; nt++) {
                    run_nt(g, out, nt);
                    int32_t *O = tu_read_i32(out), *K = tu_read_i32(tk);
                    for (int64_t i = 0; i < nel4(ne); i++)
                        ck_assert_msg(O[i] == want[i], "%s: nt=%d: row %ld pos %ld: %d want %d",
                                      g_case, nt, (long)(i / ne[0]), (long)(i % ne[0]), O[i], want[i]);
                    for (int64_t row = 0; row < nel4(ne) / ne[0]; row++)
                        for (int j = 0; j < kk; j++)
                            ck_assert_msg(K[row * kk + j] == refd[row * ne[0] + j],
                                          "%s: top_k nt=%d row %ld pos %d: %d want %d", g_case, nt,
                                          (long)row, j, K[row * kk + j], refd[row * ne[0] + j]);
                    free(O);
                    free(K);
                }
            }
            free(A);
            free(ref);
            free(refd);
            bt_free(ctx);
        }
}
END_TEST

/* ---- concat ---- */

START_TEST(test_concat) {
    tu_rng r;
    tu_rng_init(&r, 1300);
    const int64_t ne[4] = {3, 4, 2, 2};
    const enum bt_type types[3] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_I32};
    for (int ti = 0; ti < 3; ti++)
        for (int dim = 0; dim < 4; dim++)
            for (int lay = 0; lay < 2; lay++) {
                enum bt_type ty = types[ti];
                int64_t neb[4] = {ne[0], ne[1], ne[2], ne[3]};
                neb[dim] = 5;
                enum layout la = lay ? L_TRANS : L_CONT;
                snprintf(g_case, sizeof(g_case), "concat %s dim %d a %s", bt_type_name(ty), dim,
                         layout_name[la]);
                bt_context *ctx = tu_ctx(4);
                struct bt_tensor *a = new_input(ctx, ty, ne, la, &r, -50, 50);
                struct bt_tensor *b = new_input(ctx, ty, neb, lay ? L_STRIDED : L_CONT, &r, -50, 50);
                struct bt_tensor *out = bt_concat(ctx, a, b, dim);
                struct bt_graph *g = graph1(ctx, out);
                ck_assert_int_eq(out->type, ty);
                int64_t neo[4] = {ne[0], ne[1], ne[2], ne[3]};
                neo[dim] += 5;
                for (int d = 0; d < 4; d++) ck_assert_int_eq(out->ne[d], neo[d]);
                ck_assert_int_eq(bt_get_op_param_i32(out, 0), dim);
                float *A = tu_read_f32(a), *B = tu_read_f32(b);
                float *ref = malloc(sizeof(float) * nel4(neo));
                int64_t i[4];
                for (i[3] = 0; i[3] < neo[3]; i[3]++)
                    for (i[2] = 0; i[2] < neo[2]; i[2]++)
                        for (i[1] = 0; i[1] < neo[1]; i[1]++)
                            for (i[0] = 0; i[0] < neo[0]; i[0]++) {
                                int64_t o = idx4(neo, i[0], i[1], i[2], i[3]);
                                if (i[dim] < ne[dim]) {
                                    ref[o] = A[idx4(ne, i[0], i[1], i[2], i[3])];
                                } else {
                                    int64_t j[4] = {i[0], i[1], i[2], i[3]};
                                    j[dim] -= ne[dim];
                                    ref[o] = B[idx4(neb, j[0], j[1], j[2], j[3])];
                                }
                            }
                require_supported(out);
                {
                    for (int nt = 1; nt <= MAX_NT; nt++) {
                        run_nt(g, out, nt);
                        float *O = tu_read_f32(out);
                        for (int64_t k = 0; k < nel4(neo); k++)
                            ck_assert_msg(O[k] == ref[k], "%s nt=%d elem %ld: %g want %g", g_case, nt,
                                          (long)k, O[k], ref[k]);
                        free(O);
                    }
                }
                free(A);
                free(B);
                free(ref);
                bt_free(ctx);
            }
}
END_TEST

/* A CONCAT along dimension 0 with a share of dimension 1 (row_lo/hi: the
 * q heads an expert group's home computes, the others' first parts being
 * theirs): inside it the whole op's rows, outside it the second source's
 * part written and the first's left as it was; 1 and 3 threads. */
START_TEST(test_concat_heads_share) {
    const int64_t na = 7, nb = 3, H = 5, T = 4;
    bt_context *ctx = tu_ctx(8);
    struct bt_tensor *a = bt_new_tensor_3d(ctx, BT_TYPE_F32, na, H, T), *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, nb, H, T);
    fill_two(a, b, 1301);
    struct bt_tensor *out = bt_concat(ctx, a, b, 0);
    float *whole = compute_whole(ctx, out);
    out->row_lo = 1;
    out->row_hi = 3;
    for (int nth = 1; nth <= 3; nth += 2) {
        compute_poisoned(ctx, out, nth);
        uint8_t was[sizeof(float)];
        memset(was, 0x7f, sizeof was);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < na + nb; j++) {
                    const int64_t at = (t * H + h) * (na + nb) + j;
                    const float *got = (const float *)out->data + at;
                    if ((h >= 1 && h < 3) || j >= na)
                        ck_assert_msg(memcmp(got, whole + at, sizeof(float)) == 0,
                                      "%d threads: token %lld head %lld element %lld differs from the whole op's", nth,
                                      (long long)t, (long long)h, (long long)j);
                    else
                        ck_assert_msg(memcmp(got, was, sizeof was) == 0,
                                      "%d threads: token %lld head %lld element %lld (the first source's) was written",
                                      nth, (long long)t, (long long)h, (long long)j);
                }
    }
    out->row_lo = out->row_hi = 0;
    free(whole);
    bt_free(ctx);
}
END_TEST

/* ---- shape errors: NULL and a message ---- */

#define EXPECT_SHAPE_ERROR(ctx, expr)                                                       \
    do {                                                                                    \
        bt_context_clear_error(ctx);                                                        \
        struct bt_tensor *_t = (expr);                                                      \
        ck_assert_msg(_t == NULL, "%s: expected NULL", #expr);                              \
        ck_assert_msg(bt_context_error(ctx)[0] != '\0', "%s: NULL without a message", #expr); \
    } while (0)

/* MOE_SUM against the graph it replaces (MUL by the weights, then the slots'
 * views added in slot order) and a plain loop of the same operations: the
 * same bits for 1 to 4 threads, rows longer and shorter than the kernel's
 * pieces, one token (a decode step's row divided between the threads), the
 * results strided or permuted (rows packed) and the weights strided */
START_TEST(test_moe_sum) {
    static const int64_t cases[][3] = {{37, 1, 5}, {1029, 6, 3}, {2048, 4, 1}, {513, 8, 9}, {5, 3, 17}};
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < n_cases; c++) {
        for (int lay = 0; lay < 3; lay++) {
            const int64_t n = cases[c][0], K = cases[c][1], T = cases[c][2];
            const enum layout la = lay == 0 ? L_CONT : lay == 1 ? L_STRIDED : L_PERM;
            snprintf(g_case, sizeof g_case, "moe_sum n %lld K %lld T %lld, results %s", (long long)n, (long long)K,
                     (long long)T, layout_name[la]);
            tu_rng r;
            tu_rng_init(&r, 3100 + 7 * (uint64_t)c + (uint64_t)lay);
            bt_context *ctx = tu_ctx(64);
            struct bt_tensor *a = new_input(ctx, BT_TYPE_F32, (int64_t[4]){n, K, T, 1}, la, &r, -3.0f, 3.0f);
            struct bt_tensor *w = new_input(ctx, BT_TYPE_F32, (int64_t[4]){1, K, T, 1}, lay ? L_STRIDED : L_CONT, &r,
                                            0.0f, 1.0f);
            struct bt_tensor *out = bt_moe_sum(ctx, a, w);
            ck_assert_msg(out != NULL, "%s: %s", g_case, bt_context_error(ctx));
            require_supported(out);
            /* the graph MOE_SUM replaces */
            struct bt_tensor *wd = bt_mul(ctx, a, w);
            struct bt_tensor *sum = bt_cont(ctx, bt_view_2d(ctx, wd, n, T, wd->nb[2], 0));
            for (int64_t k = 1; k < K; k++)
                sum = bt_add(ctx, sum, bt_view_2d(ctx, wd, n, T, wd->nb[2], (size_t)k * wd->nb[1]));
            TU_OK(ctx, sum);
            float *ref = malloc((size_t)(n * T) * sizeof(float)), *A = tu_read_f32(a), *W = tu_read_f32(w);
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < n; i++) {
                    float z = 0.0f;
                    for (int64_t k = 0; k < K; k++) {
                        const float p = A[i + n * (k + K * t)] * W[k + K * t];
                        z = k == 0 ? p : z + p;
                    }
                    ref[i + n * t] = z;
                }
            tu_compute(ctx, sum, 1);
            ck_assert_msg(memcmp(sum->data, ref, bt_nbytes(sum)) == 0, "%s: MUL and ADDs differ from the loop", g_case);
            struct bt_graph *g = graph1(ctx, out);
            for (int nt = 1; nt <= MAX_NT; nt++) {
                run_nt(g, out, nt);
                ck_assert_msg(memcmp(out->data, ref, bt_nbytes(out)) == 0, "%s: nt=%d: not the bits of MUL and ADDs",
                              g_case, nt);
            }
            free(ref);
            free(A);
            free(W);
            bt_free(ctx);
        }
    }
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *a = bt_new_tensor_3d(ctx, BT_TYPE_F32, 8, 3, 5);
    EXPECT_SHAPE_ERROR(ctx, bt_moe_sum(ctx, a, bt_new_tensor_3d(ctx, BT_TYPE_F32, 1, 2, 5))); /* K differs */
    EXPECT_SHAPE_ERROR(ctx, bt_moe_sum(ctx, a, bt_new_tensor_3d(ctx, BT_TYPE_F32, 2, 3, 5))); /* two weights a slot */
    EXPECT_SHAPE_ERROR(ctx, bt_moe_sum(ctx, bt_transpose(ctx, a), bt_new_tensor_3d(ctx, BT_TYPE_F32, 1, 8, 5)));
    EXPECT_SHAPE_ERROR(ctx, bt_moe_sum(ctx, a, bt_new_tensor_3d(ctx, BT_TYPE_I32, 1, 3, 5)));
    bt_free(ctx);
}
END_TEST

START_TEST(test_shape_errors) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *a34 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 3, 4);
    struct bt_tensor *a43 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 4, 3);
    struct bt_tensor *a32 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 3, 2);
    struct bt_tensor *w = bt_new_tensor_2d(ctx, BT_TYPE_F32, 32, 8);
    struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 33, 2);
    struct bt_tensor *x16 = bt_new_tensor_2d(ctx, BT_TYPE_F16, 32, 2);
    struct bt_tensor *as = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 8, 4);
    struct bt_tensor *bb = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 2, 5);
    struct bt_tensor *ids_f = bt_new_tensor_2d(ctx, BT_TYPE_F32, 2, 5);
    struct bt_tensor *ids_i = bt_new_tensor_2d(ctx, BT_TYPE_I32, 2, 5);
    struct bt_tensor *ten = bt_new_tensor_1d(ctx, BT_TYPE_F32, 10);
    TU_OK(ctx, ids_i);

    EXPECT_SHAPE_ERROR(ctx, bt_add(ctx, a34, a43));
    EXPECT_SHAPE_ERROR(ctx, bt_mul(ctx, a34, a32)); /* 4 % 2 == 0 but b must be 1 or equal */
    EXPECT_SHAPE_ERROR(ctx, bt_sub(ctx, a32, a34)); /* b larger than a */
    EXPECT_SHAPE_ERROR(ctx, bt_mul_mat(ctx, w, x));  /* k 32 vs 33 */
    EXPECT_SHAPE_ERROR(ctx, bt_mul_mat(ctx, w, x16)); /* b must be F32 */
    {
        struct bt_tensor *a3 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 8, 3);
        struct bt_tensor *b4 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 2, 4);
        EXPECT_SHAPE_ERROR(ctx, bt_mul_mat(ctx, a3, b4)); /* 4 % 3 != 0 */
    }
    EXPECT_SHAPE_ERROR(ctx, bt_mul_mat_id(ctx, as, bb, ids_f)); /* ids not I32 */
    {
        struct bt_tensor *b3 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 3, 5);
        EXPECT_SHAPE_ERROR(ctx, bt_mul_mat_id(ctx, as, b3, ids_i)); /* n_b 3, n_used 2 */
        struct bt_tensor *bk = bt_new_tensor_3d(ctx, BT_TYPE_F32, 16, 2, 5);
        EXPECT_SHAPE_ERROR(ctx, bt_mul_mat_id(ctx, as, bk, ids_i)); /* k differs */
        struct bt_tensor *bt6 = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 2, 6);
        EXPECT_SHAPE_ERROR(ctx, bt_mul_mat_id(ctx, as, bt6, ids_i)); /* n_tokens differs */
    }
    EXPECT_SHAPE_ERROR(ctx, bt_reshape_2d(ctx, a34, 5, 2));
    EXPECT_SHAPE_ERROR(ctx, bt_reshape_1d(ctx, bt_transpose(ctx, a34), 12)); /* not contiguous */
    EXPECT_SHAPE_ERROR(ctx, bt_view_1d(ctx, ten, 8, 3 * sizeof(float)));      /* past the end */
    EXPECT_SHAPE_ERROR(ctx, bt_view_2d(ctx, ten, 4, 3, 16, 0));               /* past the end */
    EXPECT_SHAPE_ERROR(ctx, bt_permute(ctx, a34, 0, 0, 1, 2));                /* not a permutation */
    EXPECT_SHAPE_ERROR(ctx, bt_get_rows(ctx, a34, ids_f));
    EXPECT_SHAPE_ERROR(ctx, bt_swiglu(ctx, a34, a43));
    EXPECT_SHAPE_ERROR(ctx, bt_swiglu_oai(ctx, a34, a43, 1.702f, 7.0f));
    EXPECT_SHAPE_ERROR(ctx, bt_swiglu_oai(ctx, a34, a34, 1.702f, 0.0f)); /* the limit must be positive */
    EXPECT_SHAPE_ERROR(ctx, bt_concat(ctx, a34, a43, 0));
    EXPECT_SHAPE_ERROR(ctx, bt_concat(ctx, a34, a34, 4));
    EXPECT_SHAPE_ERROR(ctx, bt_cpy(ctx, a34, a32)); /* element counts differ */
    {
        struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, 8, 2, 3);
        struct bt_tensor *pos = bt_new_tensor_1d(ctx, BT_TYPE_I32, 3);
        struct bt_tensor *posf = bt_new_tensor_1d(ctx, BT_TYPE_F32, 3);
        EXPECT_SHAPE_ERROR(ctx, bt_rope(ctx, q, pos, 3, BT_ROPE_NORMAL, 1e4f, 1.0f)); /* odd */
        EXPECT_SHAPE_ERROR(ctx, bt_rope(ctx, q, pos, 10, BT_ROPE_NORMAL, 1e4f, 1.0f)); /* > d */
        EXPECT_SHAPE_ERROR(ctx, bt_rope(ctx, q, posf, 8, BT_ROPE_NEOX, 1e4f, 1.0f));
        struct bt_tensor *mask = bt_new_tensor_2d(ctx, BT_TYPE_F32, 8, 1);
        EXPECT_SHAPE_ERROR(ctx, bt_soft_max_ext(ctx, q, mask, 1.0f)); /* mask rows < n1 */
        struct bt_tensor *mask7 = bt_new_tensor_2d(ctx, BT_TYPE_F32, 7, 2);
        EXPECT_SHAPE_ERROR(ctx, bt_soft_max_ext(ctx, q, mask7, 1.0f));
        EXPECT_SHAPE_ERROR(ctx, bt_top_k(ctx, q, 9)); /* k > n0 */
    }
    {
        struct bt_tensor *dstq = bt_new_tensor_2d(ctx, BT_TYPE_F32, 3, 4);
        struct bt_tensor *src_b = bt_new_tensor_2d(ctx, BT_TYPE_F32, 4, 2);
        struct bt_tensor *rid = bt_new_tensor_1d(ctx, BT_TYPE_I32, 2);
        EXPECT_SHAPE_ERROR(ctx, bt_set_rows(ctx, dstq, src_b, rid)); /* row length differs */
    }
    /* a NULL source propagates and keeps the first message */
    bt_context_clear_error(ctx);
    struct bt_tensor *bad = bt_add(ctx, a34, a43);
    ck_assert_ptr_null(bad);
    char first[256];
    snprintf(first, sizeof(first), "%s", bt_context_error(ctx));
    ck_assert_str_ne(first, "");
    struct bt_tensor *chain = bt_scale(ctx, bt_relu(ctx, bad), 2.0f);
    chain = bt_mul_mat(ctx, w, chain);
    ck_assert_ptr_null(chain);
    ck_assert_str_eq(bt_context_error(ctx), first);
    bt_free(ctx);
}
END_TEST

/* ---- run-time errors: a status and a message, no crash ---- */

START_TEST(test_runtime_errors) {
    for (int nt = 1; nt <= 3; nt += 2) {
        for (int bad = 0; bad < 2; bad++) {
            bt_context *ctx = tu_ctx(4);
            tu_rng r;
            tu_rng_init(&r, 1400);
            struct bt_tensor *as = bt_new_tensor_3d(ctx, BT_TYPE_Q8_0, 32, 8, 4);
            struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, 32, 2, 5);
            struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, 2, 5);
            tu_fill(as, &r);
            tu_fill(b, &r);
            tu_fill_ids(ids, &r, 4);
            ((int32_t *)ids->data)[7] = bad ? -1 : 4; /* n_expert is 4 */
            struct bt_tensor *out = bt_mul_mat_id(ctx, as, b, ids);
            struct bt_graph *g = tu_graph(ctx, &out, 1);
            enum bt_status s = tu_run(g, nt);
            ck_assert_msg(s != BT_OK, "mul_mat_id with expert id %d: BT_OK", bad ? -1 : 4);
            ck_assert_str_ne(bt_cpu_error(tu_cpu(nt)), "");
            /* the executor is still usable afterwards */
            ((int32_t *)ids->data)[7] = 1;
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            bt_free(ctx);

            ctx = tu_ctx(4);
            struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F16, 16, 5);
            struct bt_tensor *rid = bt_new_tensor_1d(ctx, BT_TYPE_I32, 3);
            tu_fill(a, &r);
            int32_t *rv = rid->data;
            rv[0] = 0;
            rv[1] = bad ? -1 : 5;
            rv[2] = 4;
            struct bt_tensor *gr = bt_get_rows(ctx, a, rid);
            g = tu_graph(ctx, &gr, 1);
            s = tu_run(g, nt);
            ck_assert_msg(s != BT_OK, "get_rows with row id %d of 5: BT_OK", rv[1]);
            ck_assert_str_ne(bt_cpu_error(tu_cpu(nt)), "");
            rv[1] = 3;
            ck_assert_int_eq(tu_run(g, nt), BT_OK);
            bt_free(ctx);
        }
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_binary, 0, 4);
    tcase_add_loop_test(tc, test_unary, 0, U_COUNT);
    tcase_add_test(tc, test_silu_bitwise);
    tcase_add_test(tc, test_swiglu_oai_bitwise);
    tcase_add_test(tc, test_rms_norm_bitwise);
    tcase_add_test(tc, test_glu_held_rows);
    tcase_add_test(tc, test_glu_cols_share);
    tcase_add_loop_test(tc, test_rowops, 0, R_COUNT);
    tcase_add_test(tc, test_soft_max);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_rope_yarn);
    tcase_add_loop_test(tc, test_mul_mat, 0, N_WTYPES);
    tcase_add_loop_test(tc, test_mul_mat_every_type, 0, BT_TYPE_COUNT);
    tcase_add_loop_test(tc, test_mul_mat_id, 0, N_WTYPES);
    tcase_add_loop_test(tc, test_mul_mat_id_share, 0, N_WTYPES);
    tcase_add_loop_test(tc, test_mul_mat_cols_share, 0, N_WTYPES);
    tcase_add_loop_test(tc, test_mul_mat_heads_share, 0, N_WTYPES);
    tcase_add_loop_test(tc, test_get_rows, 0, 9);
    tcase_add_loop_test(tc, test_set_rows, 0, 5);
    tcase_add_test(tc, test_set_rows_f16_bitwise);
    tcase_add_test(tc, test_cpy);
    tcase_add_test(tc, test_cont_views);
    tcase_add_test(tc, test_argsort_top_k);
    tcase_add_test(tc, test_concat);
    tcase_add_test(tc, test_concat_heads_share);
    tcase_add_test(tc, test_moe_sum);
    tcase_add_test(tc, test_shape_errors);
    tcase_add_test(tc, test_runtime_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
