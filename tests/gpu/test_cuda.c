/* test_cuda.c - the CUDA backend against the CPU backend (label gpu).
 *
 * Every op of ops.h is built twice, once in CPU memory and once in device
 * memory, on the same input bytes; both are computed and the GPU's result
 * must agree within NMSE 1e-7 (5e-4 for MUL_MAT / MUL_MAT_ID; one
 * quantisation step for results stored as Q8_0 / Q4_0; exactly for I32 and
 * for rows dequantised from Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K).
 * Then: run-time id errors, events and asynchronous copies, pinned host
 * memory, the scheduler's seed split example on [CUDA, CPU], and NCCL with a
 * single rank sending to itself.
 *
 * Without a device the program prints "skipped: no CUDA device" and exits 77
 * (ctest shows the test as skipped). */
#include <math.h>
#include <string.h>

#include "baton/backend.h"
#include "baton/sched.h"
#include "bt_cuda.h"
#include "testutil.h"
#ifdef BATON_HAVE_NCCL
#include "../../transport/bt_nccl.h"
#endif

#define TOL_ELEM 1e-7
#define TOL_MATMUL 5e-4

static bt_backend_t g_cpu, g_gpu;

static void setup(void) {
    g_cpu = bt_backend_cpu_init(2);
    char err[256];
    ck_assert_msg(bt_backend_cuda_init(0, &g_gpu, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_ptr_nonnull(g_cpu);
    ck_assert_ptr_nonnull(g_gpu);
}
static void teardown(void) {
    bt_backend_free(g_gpu);
    bt_backend_free(g_cpu);
}

/* ---- one op on both backends -------------------------------------------------- */

enum kind {
    K_BINARY, K_UNARY, K_SWIGLU, K_SUM_ROWS, K_NORM, K_SOFT_MAX, K_ROPE, K_GET_ROWS, K_SET_ROWS,
    K_CPY, K_CPY_FLAT, K_CONT, K_ARGSORT, K_CONCAT, K_MUL_MAT, K_MUL_MAT_ID, K_FLASH_ATTN, K_MOE_SUM,
};

struct spec {
    enum kind kind;
    enum bt_op op;       /* for the families */
    enum bt_type type;   /* weight / source / destination type */
    int64_t n, m, k;     /* sizes, per kind */
    int variant;         /* layout or mode */
};

static const char *spec_name(const struct spec *s, char *buf, size_t n) {
    snprintf(buf, n, "kind %d op %s type %s n %lld m %lld k %lld variant %d", (int)s->kind, bt_op_name(s->op),
             bt_type_name(s->type), (long long)s->n, (long long)s->m, (long long)s->k, s->variant);
    return buf;
}

/* an F32 input [ne0, ne1, ne2, ne3]: contiguous (variant 0), a transposed
 * view (1), a view with padded rows (2), dims 1 and 2 swapped (3) */
static struct bt_tensor *input(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3,
                               int variant) {
    switch (variant) {
        case 1: return bt_transpose(ctx, bt_new_tensor_4d(ctx, type, ne1, ne0, ne2, ne3));
        case 2: {
            struct bt_tensor *b = bt_new_tensor_4d(ctx, type, ne0 + (bt_blck_size(type) > 1 ? 32 : 3), ne1 + 1, ne2, ne3);
            return bt_view_4d(ctx, b, ne0, ne1, ne2, ne3, b->nb[1], b->nb[2], b->nb[3], b->nb[1]);
        }
        case 3: return bt_permute(ctx, bt_new_tensor_4d(ctx, type, ne0, ne2, ne1, ne3), 0, 2, 1, 3);
        default: return bt_new_tensor_4d(ctx, type, ne0, ne1, ne2, ne3);
    }
}

/* I32 leaves named "ids<N>" are filled with values in [0, N) */
static struct bt_tensor *ids(bt_context *ctx, int64_t n0, int64_t n1, int64_t n2, int32_t range) {
    return bt_format_name(bt_new_tensor_3d(ctx, BT_TYPE_I32, n0, n1, n2), "ids%d", (int)range);
}

static struct bt_tensor *build(bt_context *ctx, const struct spec *s) {
    const int64_t n = s->n, m = s->m, k = s->k;
    struct bt_tensor *a, *b;
    switch (s->kind) {
        case K_BINARY:
            a = input(ctx, BT_TYPE_F32, n, m, 3, 2, s->variant);
            b = input(ctx, BT_TYPE_F32, n, 1, 3, 1, 0);
            switch (s->op) {
                case BT_OP_ADD: return bt_add(ctx, a, b);
                case BT_OP_SUB: return bt_sub(ctx, a, b);
                case BT_OP_MUL: return bt_mul(ctx, a, b);
                default: return bt_div(ctx, a, bt_add(ctx, bt_sqr(ctx, b), b)); /* b^2 + b: rarely near 0 */
            }
        case K_UNARY:
            a = input(ctx, BT_TYPE_F32, n, m, 2, 1, s->variant);
            switch (s->op) {
                case BT_OP_SCALE: return bt_scale(ctx, a, 0.37f);
                case BT_OP_SQR: return bt_sqr(ctx, a);
                case BT_OP_SQRT: return bt_sqrt(ctx, bt_sqr(ctx, a));
                case BT_OP_SILU: return bt_silu(ctx, a);
                case BT_OP_GELU: return bt_gelu(ctx, a);
                case BT_OP_RELU: return bt_relu(ctx, a);
                default: return bt_sigmoid(ctx, a);
            }
        case K_SWIGLU: /* SWIGLU or SWIGLU_OAI (inputs scaled past its limit of 7) */
            a = input(ctx, BT_TYPE_F32, n, m, 2, 1, s->variant);
            b = input(ctx, BT_TYPE_F32, n, m, 2, 1, 0);
            if (s->op == BT_OP_SWIGLU) return bt_swiglu(ctx, a, b);
            return bt_swiglu_oai(ctx, bt_scale(ctx, a, 12.0f), bt_scale(ctx, b, 12.0f), 1.702f, 7.0f);
        case K_MOE_SUM: /* m slots of 5 tokens; its results' rows packed (no variant 1) */
            return bt_moe_sum(ctx, input(ctx, BT_TYPE_F32, n, m, 5, 1, s->variant),
                              input(ctx, BT_TYPE_F32, 1, m, 5, 1, 0));
        case K_SUM_ROWS:
            a = input(ctx, BT_TYPE_F32, n, m, 3, 1, s->variant);
            return s->op == BT_OP_MEAN ? bt_mean(ctx, a) : bt_sum_rows(ctx, a);
        case K_NORM:
            a = input(ctx, BT_TYPE_F32, n, m, 3, 1, s->variant);
            return s->op == BT_OP_NORM ? bt_norm(ctx, a, 1e-5f) : bt_rms_norm(ctx, a, 1e-6f);
        case K_SOFT_MAX:
            a = input(ctx, BT_TYPE_F32, n, m, 4, 1, s->variant);
            return s->op == BT_OP_NONE ? bt_soft_max(ctx, a)
                                       : bt_soft_max_ext(ctx, a, bt_new_tensor_2d(ctx, BT_TYPE_F32, n, m + 2), 0.125f);
        case K_ROPE:
            a = input(ctx, BT_TYPE_F32, n, 4, m, 1, s->variant);
            /* variants 2 and 3: YaRN over a ramp of pairs, scaled cos and sin */
            return bt_rope_ext(ctx, a, ids(ctx, m, 1, 1, 4096), (int)k, s->variant % 2 ? BT_ROPE_NEOX : BT_ROPE_NORMAL,
                               10000.0f, s->variant >= 2 ? 0.025f : 1.0f,
                               s->variant >= 2 ? &(struct bt_rope_yarn){1.0f, 0.9f, 32.0f, 1.0f, 4096} : NULL);
        case K_GET_ROWS:
            a = bt_new_tensor_4d(ctx, s->type, n, m, 2, 1);
            return bt_get_rows(ctx, a, ids(ctx, k, 2, 1, (int32_t)m));
        case K_SET_ROWS:
            a = bt_new_tensor_4d(ctx, s->type, n, m, 2, 1);
            return bt_set_rows(ctx, a, input(ctx, BT_TYPE_F32, n, k, 2, 1, s->variant == 1 ? 2 : 0),
                               ids(ctx, k, 2, 1, (int32_t)m));
        case K_CPY:
            a = input(ctx, BT_TYPE_F32, n, m, 2, 1, s->variant);
            b = bt_new_tensor_4d(ctx, s->type, n, m, 2, 1);
            return bt_cpy(ctx, a, b);
        case K_CPY_FLAT: /* same element count, other shape, a quantised side */
            a = bt_new_tensor_2d(ctx, s->variant ? s->type : BT_TYPE_F32, 96, 4);
            b = bt_new_tensor_2d(ctx, s->variant ? BT_TYPE_F32 : s->type, 64, 6);
            return bt_cpy(ctx, a, b);
        case K_CONT:
            return bt_cont(ctx, input(ctx, s->type, n, m, 3, 1, s->variant));
        case K_ARGSORT:
            a = input(ctx, BT_TYPE_F32, n, m, 2, 1, 0);
            return bt_argsort(ctx, a, s->variant ? BT_SORT_DESC : BT_SORT_ASC);
        case K_CONCAT: {
            const int dim = s->variant;
            int64_t nb_[4] = {n, m, 3, 2};
            nb_[dim] = 5;
            a = input(ctx, s->type, n, m, 3, 2, 0);
            b = bt_new_tensor_4d(ctx, s->type, nb_[0], nb_[1], nb_[2], nb_[3]);
            return bt_concat(ctx, a, b, dim);
        }
        case K_MUL_MAT: /* variant 1: b with padded rows; 2: a's rows overlap (row stride half a row) */
            a = bt_new_tensor_4d(ctx, s->type, k, m, 2, 1);
            if (s->variant == 2) a = bt_view_4d(ctx, a, k, m, 2, 1, a->nb[1] / 2, a->nb[2], a->nb[3], 0);
            b = input(ctx, BT_TYPE_F32, k, n, 4, 3, s->variant == 1 ? 2 : 0);
            return bt_mul_mat(ctx, a, b);
        case K_MUL_MAT_ID: {
            const int n_expert = 8, n_used = 3;
            a = bt_new_tensor_3d(ctx, s->type, k, m, n_expert);
            b = bt_new_tensor_3d(ctx, BT_TYPE_F32, k, s->variant ? 1 : n_used, n);
            return bt_mul_mat_id(ctx, a, b, ids(ctx, n_used, n, 1, n_expert));
        }
        case K_FLASH_ATTN: { /* n = head size, m = query rows, k = cells; variant: bit 0 k/v are
                              * views of a larger cache (padded rows, as the engine's cache view),
                              * bit 1 an F16 mask, bit 2 no mask, bits 3-6 q heads per kv head - 1,
                              * bit 7 sinks (gpt-oss) */
            const int64_t Hk = 2, H = Hk * (1 + ((s->variant >> 3) & 15)), Dv = n == 64 ? 32 : n;
            struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, n, H, m);
            struct bt_tensor *kk = input(ctx, s->type, n, Hk, k, 1, s->variant & 1 ? 2 : 0);
            struct bt_tensor *vv = input(ctx, s->type, Dv, Hk, k, 1, s->variant & 1 ? 2 : 0);
            struct bt_tensor *mask = NULL;
            if (!(s->variant & 4))
                mask = bt_set_name(bt_new_tensor_2d(ctx, s->variant & 2 ? BT_TYPE_F16 : BT_TYPE_F32, k, m + 3), "mask");
            struct bt_tensor *sinks = s->variant & 128 ? bt_new_tensor_1d(ctx, BT_TYPE_F32, H) : NULL;
            return bt_flash_attn_ext(ctx, q, kk, vv, mask, sinks, 0.125f);
        }
    }
    return NULL;
}

/* FLASH_ATTN's mask [N, rows]: -inf for the cells after a causal diagonal
 * (row t sees cells j <= N - rows + t), for every fifth cell, and for the
 * whole of row 1 (a row that sees no cell is 0); the other values stay as
 * filled (small, like an ALiBi bias). */
static void attn_mask_cells(struct bt_tensor *mask) {
    float *mv = tu_read_f32(mask);
    const int64_t N = mask->ne[0], rows = mask->ne[1];
    for (int64_t t = 0; t < rows; t++)
        for (int64_t j = 0; j < N; j++)
            if (j > N - rows + t || j % 5 == 3 || t == 1) mv[t * N + j] = -INFINITY;
    tu_write_f32(mask, mv);
    free(mv);
}

struct side {
    bt_context *ctx;
    struct bt_tensor *out;
    struct bt_graph *g;
    bt_buffer_t buf;
};

static void side_build(struct side *x, const struct spec *s, bt_backend_t backend) {
    x->ctx = bt_init((struct bt_init_params){16u << 20, NULL, true});
    ck_assert_ptr_nonnull(x->ctx);
    x->out = build(x->ctx, s);
    TU_OK(x->ctx, x->out);
    x->g = bt_graph_new(x->ctx, 64);
    ck_assert_ptr_nonnull(x->g);
    ck_assert_int_eq(bt_graph_build_forward_expand(x->g, x->out), BT_OK);
    x->buf = bt_alloc_ctx_tensors(x->ctx, backend);
    ck_assert_msg(x->buf != NULL, "%s", bt_context_error(x->ctx));
}

static void side_free(struct side *x) {
    bt_buffer_free(x->buf);
    bt_free(x->ctx);
}

static bool owns_data(const struct bt_tensor *t) { return t->view_src == NULL && t->data != NULL; }

static bool is_q(enum bt_type t) { return t == BT_TYPE_Q8_0 || t == BT_TYPE_Q4_0; }

static void check_case(const struct spec *s, double tol) {
    char name[256];
    spec_name(s, name, sizeof name);
    struct side c, d;
    side_build(&c, s, g_cpu);
    side_build(&d, s, g_gpu);
    ck_assert_int_eq(bt_context_n_tensors(c.ctx), bt_context_n_tensors(d.ctx));
    /* inputs: filled on the CPU side, the same bytes copied to the device */
    tu_rng r;
    tu_rng_init(&r, 4242 + (uint64_t)s->kind * 131 + (uint64_t)s->variant);
    for (int i = 0; i < bt_context_n_tensors(c.ctx); i++) {
        struct bt_tensor *t = bt_context_tensor(c.ctx, i);
        if (!owns_data(t)) continue;
        int range = 0;
        if (t->type == BT_TYPE_I32 && sscanf(t->name, "ids%d", &range) == 1)
            tu_fill_ids(t, &r, range);
        else if (s->kind == K_ARGSORT)
            tu_fill_uniform(t, &r, -4.0f, 4.0f);
        else
            tu_fill(t, &r);
        if (s->kind == K_ARGSORT) /* many ties */
            for (int64_t j = 0; j < bt_nelements(t); j++) ((float *)t->data)[j] = floorf(((float *)t->data)[j]);
        if (strcmp(t->name, "mask") == 0) attn_mask_cells(t);
        bt_tensor_set(bt_context_tensor(d.ctx, i), t->data, 0, bt_nbytes(t));
    }
    ck_assert_msg(bt_backend_graph_compute(g_cpu, c.g) == BT_OK, "%s: cpu: %s", name, bt_backend_error(g_cpu));
    ck_assert_msg(bt_backend_supports_op(g_gpu, d.out), "%s: the CUDA backend refuses it", name);
    ck_assert_msg(bt_backend_graph_compute(g_gpu, d.g) == BT_OK, "%s: cuda: %s", name, bt_backend_error(g_gpu));

    const bool i32 = c.out->type == BT_TYPE_I32;
    float *ref = i32 ? NULL : tu_read_f32(c.out);
    int32_t *ref_i = i32 ? tu_read_i32(c.out) : NULL;
    /* the device's results (every tensor with data of its own) into the CPU side */
    for (int i = 0; i < bt_context_n_tensors(c.ctx); i++) {
        struct bt_tensor *t = bt_context_tensor(c.ctx, i);
        if (owns_data(t)) bt_tensor_get(bt_context_tensor(d.ctx, i), t->data, 0, bt_nbytes(t));
    }
    const int64_t nel = bt_nelements(c.out);
    if (i32) {
        int32_t *got = tu_read_i32(c.out);
        for (int64_t j = 0; j < nel; j++) ck_assert_msg(got[j] == ref_i[j], "%s: [%lld] %d != %d", name, (long long)j, got[j], ref_i[j]);
        free(got);
    } else if (is_q(c.out->type)) {
        float *got = tu_read_f32(c.out);
        double amax = 0, dmax = 0;
        for (int64_t j = 0; j < nel; j++) {
            amax = fmax(amax, fabs(ref[j]));
            dmax = fmax(dmax, fabs(got[j] - ref[j]));
        }
        const double step = amax / (c.out->type == BT_TYPE_Q8_0 ? 127.0 : 7.0);
        ck_assert_msg(dmax <= step * 1.01 + 1e-6, "%s: max diff %g > one step %g", name, dmax, step);
        free(got);
    } else {
        const double e = tu_nmse_tensor(c.out, ref);
        ck_assert_msg(e <= tol, "%s: NMSE %g > %g", name, e, tol);
    }
    free(ref);
    free(ref_i);
    side_free(&c);
    side_free(&d);
}

/* ---- the ops ---------------------------------------------------------------------- */

START_TEST(test_elementwise) {
    const enum bt_op bin[] = {BT_OP_ADD, BT_OP_SUB, BT_OP_MUL, BT_OP_DIV};
    for (int v = 0; v < 4; v++)
        for (int i = 0; i < 4; i++) check_case(&(struct spec){K_BINARY, bin[i], BT_TYPE_F32, 37, 5, 0, v}, TOL_ELEM);
    const enum bt_op un[] = {BT_OP_SCALE, BT_OP_SQR, BT_OP_SQRT, BT_OP_SILU, BT_OP_GELU, BT_OP_RELU, BT_OP_SIGMOID};
    for (int v = 0; v < 4; v++)
        for (int i = 0; i < 7; i++) check_case(&(struct spec){K_UNARY, un[i], BT_TYPE_F32, 33, 7, 0, v}, TOL_ELEM);
    for (int v = 0; v < 4; v++) check_case(&(struct spec){K_SWIGLU, BT_OP_SWIGLU, BT_TYPE_F32, 29, 6, 0, v}, TOL_ELEM);
    for (int v = 0; v < 4; v++)
        check_case(&(struct spec){K_SWIGLU, BT_OP_SWIGLU_OAI, BT_TYPE_F32, 29, 6, 0, v}, TOL_ELEM);
    for (int v = 0; v < 4; v += 1 + (v == 0))
        check_case(&(struct spec){K_MOE_SUM, BT_OP_MOE_SUM, BT_TYPE_F32, 37, 6, 0, v}, TOL_ELEM);
}
END_TEST

START_TEST(test_rows) {
    for (int v = 0; v < 4; v++) {
        check_case(&(struct spec){K_SUM_ROWS, BT_OP_SUM_ROWS, BT_TYPE_F32, 1000, 5, 0, v}, TOL_ELEM);
        check_case(&(struct spec){K_SUM_ROWS, BT_OP_MEAN, BT_TYPE_F32, 77, 5, 0, v}, TOL_ELEM);
        check_case(&(struct spec){K_NORM, BT_OP_RMS_NORM, BT_TYPE_F32, 4096, 3, 0, v}, TOL_ELEM);
        check_case(&(struct spec){K_NORM, BT_OP_NORM, BT_TYPE_F32, 61, 3, 0, v}, TOL_ELEM);
        check_case(&(struct spec){K_SOFT_MAX, BT_OP_NONE, BT_TYPE_F32, 300, 6, 0, v}, TOL_ELEM);
        check_case(&(struct spec){K_SOFT_MAX, BT_OP_SOFT_MAX, BT_TYPE_F32, 45, 6, 0, v}, TOL_ELEM);
    }
    for (int v = 0; v < 4; v++) {
        check_case(&(struct spec){K_ROPE, BT_OP_ROPE, BT_TYPE_F32, 64, 9, 64, v}, TOL_ELEM);
        check_case(&(struct spec){K_ROPE, BT_OP_ROPE, BT_TYPE_F32, 80, 5, 48, v}, TOL_ELEM); /* partial rotation */
    }
    for (int v = 0; v < 2; v++) {
        check_case(&(struct spec){K_ARGSORT, BT_OP_ARGSORT, BT_TYPE_F32, 300, 7, 0, v}, 0);
        check_case(&(struct spec){K_ARGSORT, BT_OP_ARGSORT, BT_TYPE_F32, 2000, 2, 0, v}, 0);
    }
}
END_TEST

START_TEST(test_rows_and_copies) {
    const enum bt_type types[] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16, BT_TYPE_Q8_0, BT_TYPE_Q4_0, BT_TYPE_I32};
    for (int i = 0; i < 6; i++) check_case(&(struct spec){K_GET_ROWS, BT_OP_GET_ROWS, types[i], 64, 10, 7, 0}, TOL_ELEM);
    for (int i = 0; i < 5; i++)
        for (int v = 0; v < 2; v++)
            check_case(&(struct spec){K_SET_ROWS, BT_OP_SET_ROWS, types[i], 64, 12, 9, v}, TOL_ELEM);
    for (int i = 0; i < 5; i++)
        for (int v = 0; v < 4; v++) check_case(&(struct spec){K_CPY, BT_OP_CPY, types[i], 64, 6, 0, v}, TOL_ELEM);
    for (int i = 1; i < 5; i++)
        for (int v = 0; v < 2; v++) check_case(&(struct spec){K_CPY_FLAT, BT_OP_CPY, types[i], 0, 0, 0, v}, TOL_ELEM);
    for (int i = 0; i < 3; i++)
        for (int v = 0; v < 4; v++) check_case(&(struct spec){K_CONT, BT_OP_CONT, types[i], 35, 6, 0, v}, TOL_ELEM);
    for (int dim = 0; dim < 4; dim++) {
        check_case(&(struct spec){K_CONCAT, BT_OP_CONCAT, BT_TYPE_F32, 7, 4, 0, dim}, TOL_ELEM);
        check_case(&(struct spec){K_CONCAT, BT_OP_CONCAT, BT_TYPE_F16, 7, 4, 0, dim}, TOL_ELEM);
    }
}
END_TEST

START_TEST(test_mul_mat) {
    const enum bt_type types[] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16, BT_TYPE_Q8_0, BT_TYPE_Q4_0};
    const int64_t cols[] = {1, 5, 37};
    for (int i = 0; i < 5; i++)
        for (int c = 0; c < 3; c++)
            for (int v = 0; v < 3; v++)
                check_case(&(struct spec){K_MUL_MAT, BT_OP_MUL_MAT, types[i], cols[c], 70, 256, v}, TOL_MATMUL);
    const int64_t tokens[] = {2, 40};
    for (int i = 0; i < 5; i++)
        for (int t = 0; t < 2; t++)
            for (int v = 0; v < 2; v++)
                check_case(&(struct spec){K_MUL_MAT_ID, BT_OP_MUL_MAT_ID, types[i], tokens[t], 48, 128, v},
                           TOL_MATMUL);
}
END_TEST

START_TEST(test_flash_attn) {
    /* head sizes 64 (v rows of 32), 128, 32; k/v F32, F16, Q8_0; decode (1
     * row) and prompt rows; packed or cache-view k/v; F32, F16 or no mask;
     * 1, 2 and 4 q heads per kv head; sinks */
    const enum bt_type types[] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_Q8_0};
    const int64_t heads[] = {64, 128, 32};
    const int variants[] = {0, 1, 2, 4, 8 | 1, 24 | 2, 128 | 8, 128 | 4};
    for (int i = 0; i < 3; i++)
        for (int h = 0; h < 3; h++)
            for (int v = 0; v < 8; v++) {
                check_case(&(struct spec){K_FLASH_ATTN, BT_OP_FLASH_ATTN, types[i], heads[h], 7, 45, variants[v]},
                           TOL_ELEM);
                check_case(&(struct spec){K_FLASH_ATTN, BT_OP_FLASH_ATTN, types[i], heads[h], 1, 300, variants[v]},
                           TOL_ELEM);
            }
}
END_TEST

/* Device tensors are filled and read through host twins (bt_tensor_set /
 * get): testutil's fill and read helpers write t->data itself, which for a
 * tensor in GPU memory is a device address. */
static void dev_fill(bt_context *hctx, struct bt_tensor *t, tu_rng *r, bool attn_mask) {
    struct bt_tensor *h = bt_new_tensor_4d(hctx, t->type, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    ck_assert_ptr_nonnull(h);
    tu_fill(h, r);
    if (attn_mask) attn_mask_cells(h);
    bt_tensor_set(t, h->data, 0, bt_nbytes(h));
}

static float *dev_read_f32(const struct bt_tensor *t) {
    ck_assert(t->type == BT_TYPE_F32 && bt_is_contiguous(t));
    float *v = malloc(bt_nbytes(t));
    ck_assert_ptr_nonnull(v);
    bt_tensor_get(t, v, 0, bt_nbytes(t));
    return v;
}

/* The promise on the GPU: a query row's result is bitwise the same computed
 * with its whole batch over every cell, alone over every cell, and alone
 * over only the cells up to the last one it sees. */
START_TEST(test_flash_attn_rows_alone) {
    const enum bt_type types[] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_Q8_0};
    for (int ti = 0; ti < 3; ti++) {
        const int64_t D = 128, H = 8, Hk = 2, T = 9, N = 70;
        bt_context *ctx = bt_init((struct bt_init_params){4u << 20, NULL, true});
        struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, D, H, T);
        struct bt_tensor *k = bt_new_tensor_3d(ctx, types[ti], D, Hk, N);
        struct bt_tensor *v = bt_new_tensor_3d(ctx, types[ti], D, Hk, N);
        struct bt_tensor *mask = bt_new_tensor_2d(ctx, BT_TYPE_F32, N, T);
        struct bt_tensor *outs[1 + 2 * T];
        outs[0] = bt_flash_attn(ctx, q, k, v, mask, 0.09f);
        for (int64_t t = 0; t < T; t++) {
            const int64_t n_seen = N - T + t + 1; /* the causal pattern of attn_mask_cells */
            struct bt_tensor *qt = bt_view_3d(ctx, q, D, H, 1, q->nb[1], q->nb[2], (size_t)t * q->nb[2]);
            struct bt_tensor *mt = bt_view_2d(ctx, mask, N, 1, mask->nb[1], (size_t)t * mask->nb[1]);
            struct bt_tensor *mt2 = bt_view_2d(ctx, mask, n_seen, 1, mask->nb[1], (size_t)t * mask->nb[1]);
            struct bt_tensor *k2 = bt_view_3d(ctx, k, D, Hk, n_seen, k->nb[1], k->nb[2], 0);
            struct bt_tensor *v2 = bt_view_3d(ctx, v, D, Hk, n_seen, v->nb[1], v->nb[2], 0);
            outs[1 + 2 * t] = bt_flash_attn(ctx, qt, k, v, mt, 0.09f);
            outs[2 + 2 * t] = bt_flash_attn(ctx, qt, k2, v2, mt2, 0.09f);
        }
        struct bt_graph *g = bt_graph_new(ctx, 256);
        for (int i = 0; i < 1 + 2 * T; i++) {
            TU_OK(ctx, outs[i]);
            bt_graph_build_forward_expand(g, outs[i]);
        }
        bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, g_gpu);
        ck_assert_ptr_nonnull(buf);
        tu_rng r;
        tu_rng_init(&r, 77 + (uint64_t)ti);
        bt_context *hctx = bt_init((struct bt_init_params){4u << 20, NULL, false});
        ck_assert_ptr_nonnull(hctx);
        dev_fill(hctx, q, &r, false);
        dev_fill(hctx, k, &r, false);
        dev_fill(hctx, v, &r, false);
        dev_fill(hctx, mask, &r, true);
        bt_free(hctx);
        ck_assert_msg(bt_backend_graph_compute(g_gpu, g) == BT_OK, "%s", bt_backend_error(g_gpu));
        float *all = dev_read_f32(outs[0]);
        for (int64_t t = 0; t < T; t++)
            for (int w = 1; w <= 2; w++) {
                float *one = dev_read_f32(outs[w + 2 * t]);
                ck_assert_msg(memcmp(one, all + t * D * H, (size_t)(D * H) * sizeof(float)) == 0,
                              "%s: row %lld computed alone (%s) differs from the batch's", bt_type_name(types[ti]),
                              (long long)t, w == 1 ? "every cell" : "only the cells it sees");
                free(one);
            }
        free(all);
        bt_buffer_free(buf);
        bt_free(ctx);
    }
}
END_TEST

/* The block types the GPU only reads (Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K, MXFP4 and
 * the IQ types, whose element reads tests/test_cuda_tables.c also checks on the CPU): GET_ROWS
 * dequantises bit for bit as quants.c does on the CPU (tolerance 0), MUL_MAT
 * and MUL_MAT_ID within the matmul tolerance (decode columns through the
 * direct kernel, prompt columns through F16 and cuBLAS); the support rules
 * refuse them anywhere else (as a copy's destination). */
START_TEST(test_read_only_quants) {
    const enum bt_type types[] = {BT_TYPE_Q4_1,   BT_TYPE_Q5_0,   BT_TYPE_Q5_1,    BT_TYPE_Q2_K,    BT_TYPE_Q3_K,
                                  BT_TYPE_Q4_K,   BT_TYPE_Q5_K,   BT_TYPE_Q6_K,    BT_TYPE_MXFP4,   BT_TYPE_IQ4_NL,
                                  BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS, BT_TYPE_IQ2_XS, BT_TYPE_IQ2_S,   BT_TYPE_IQ3_XXS,
                                  BT_TYPE_IQ3_S,  BT_TYPE_IQ1_S};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        check_case(&(struct spec){K_GET_ROWS, BT_OP_GET_ROWS, types[i], 512, 10, 7, 0}, 0);
        for (int c = 0; c < 2; c++)
            check_case(&(struct spec){K_MUL_MAT, BT_OP_MUL_MAT, types[i], c ? 37 : 3, 70, 512, 0}, TOL_MATMUL);
        check_case(&(struct spec){K_MUL_MAT_ID, BT_OP_MUL_MAT_ID, types[i], 40, 48, 256, 0}, TOL_MATMUL);
        bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
        struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 256, 2);
        struct bt_tensor *y = bt_cpy(ctx, x, bt_new_tensor_2d(ctx, types[i], 256, 2));
        TU_OK(ctx, y);
        ck_assert_msg(!bt_backend_supports_op(g_gpu, y), "%s: a copy into it is accepted", bt_type_name(types[i]));
        bt_free(ctx);
    }
}
END_TEST

/* ---- run-time errors: a bad id is a status and a message, as on the CPU ---- */

START_TEST(test_bad_ids) {
    bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, 8, 4);
    struct bt_tensor *i = bt_new_tensor_1d(ctx, BT_TYPE_I32, 3);
    struct bt_tensor *out = bt_set_name(bt_get_rows(ctx, a, i), "gathered");
    struct bt_tensor *as = bt_new_tensor_3d(ctx, BT_TYPE_F32, 8, 4, 2);
    struct bt_tensor *b = bt_new_tensor_3d(ctx, BT_TYPE_F32, 8, 1, 1);
    struct bt_tensor *e = bt_new_tensor_2d(ctx, BT_TYPE_I32, 1, 1);
    struct bt_tensor *mm = bt_set_name(bt_mul_mat_id(ctx, as, b, e), "experts");
    TU_OK(ctx, mm);
    struct bt_graph *g1 = bt_graph_new(ctx, 16), *g2 = bt_graph_new(ctx, 16);
    bt_graph_build_forward_expand(g1, out);
    bt_graph_build_forward_expand(g2, mm);
    bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, g_gpu);
    ck_assert_ptr_nonnull(buf);
    bt_buffer_clear(buf, 0);
    const int32_t bad[3] = {1, 4, 0};
    bt_tensor_set(i, bad, 0, sizeof bad);
    ck_assert_int_eq(bt_backend_graph_compute(g_gpu, g1), BT_ERR_INVALID);
    ck_assert_msg(strstr(bt_backend_error(g_gpu), "'gathered'") && strstr(bt_backend_error(g_gpu), "row id 4"), "%s",
                  bt_backend_error(g_gpu));
    const int32_t good[3] = {1, 3, 0};
    bt_tensor_set(i, good, 0, sizeof good);
    ck_assert_msg(bt_backend_graph_compute(g_gpu, g1) == BT_OK, "the error is cleared: %s", bt_backend_error(g_gpu));
    const int32_t bad_e = 2;
    bt_tensor_set(e, &bad_e, 0, sizeof bad_e);
    ck_assert_int_eq(bt_backend_graph_compute(g_gpu, g2), BT_ERR_INVALID);
    ck_assert_msg(strstr(bt_backend_error(g_gpu), "expert id 2 out of range [0, 2)"), "%s", bt_backend_error(g_gpu));
    bt_buffer_free(buf);
    bt_free(ctx);
}
END_TEST

/* ---- memory, events, asynchronous copies ----------------------------------------------- */

START_TEST(test_buffers_events) {
    ck_assert(bt_buft_is_host(bt_cuda_host_buffer_type()));
    ck_assert(!bt_buft_is_host(bt_cuda_buffer_type(0)));
    ck_assert_ptr_null(bt_cuda_buffer_type(bt_cuda_device_count()));
    bt_backend_t gpu2 = NULL; /* a second stream on the same device */
    char err[256];
    ck_assert_msg(bt_backend_cuda_init(0, &gpu2, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_ptr_nonnull(gpu2);
    /* a device that is not there: the status and the message, nothing printed */
    bt_backend_t none = gpu2;
    ck_assert_int_eq(bt_backend_cuda_init(bt_cuda_device_count(), &none, err, sizeof err), BT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(none);
    ck_assert_msg(strstr(err, "device(s) present") != NULL, "%s", err);
    bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
    struct bt_tensor *x = bt_new_tensor_1d(ctx, BT_TYPE_F32, 1000), *y = bt_new_tensor_1d(ctx, BT_TYPE_F32, 1000);
    bt_buffer_t dev = bt_alloc_ctx_tensors(ctx, g_gpu);
    ck_assert_ptr_nonnull(dev);
    ck_assert(bt_buffer_is_cuda(dev));
    bt_buffer_t pin = bt_buft_alloc_buffer(bt_cuda_host_buffer_type(), 8000);
    ck_assert_ptr_nonnull(pin);
    float *h = bt_buffer_get_base(pin);
    for (int j = 0; j < 1000; j++) h[j] = (float)j * 0.5f;
    bt_backend_tensor_set_async(g_gpu, x, h, 0, 4000);
    bt_event_t ev = bt_event_new(g_gpu);
    ck_assert_ptr_nonnull(ev);
    bt_event_record(ev, g_gpu);
    bt_backend_event_wait(gpu2, ev);
    bt_backend_tensor_copy_async(gpu2, g_gpu, x, y); /* on gpu2's stream after the event */
    bt_backend_synchronize(gpu2);
    bt_backend_synchronize(g_gpu);
    bt_backend_tensor_get_async(g_gpu, y, h + 1000, 0, 4000);
    bt_event_record(ev, g_gpu);
    bt_event_synchronize(ev);
    for (int j = 0; j < 1000; j++) ck_assert_float_eq(h[1000 + j], (float)j * 0.5f);
    bt_tensor_memset(y, 0, 0, 4000);
    float z = 1;
    bt_tensor_get(y, &z, 400, 4);
    ck_assert_float_eq(z, 0.0f);
    bt_tensor_copy(x, y); /* device to device through the buffer's cpy_tensor */
    bt_tensor_get(y, &z, 400, 4);
    ck_assert_float_eq(z, 50.0f);
    bt_event_free(ev);
    bt_buffer_free(pin);
    bt_buffer_free(dev);
    bt_free(ctx);
    bt_backend_free(gpu2);
}
END_TEST

/* ---- the scheduler's seed example on [CUDA, CPU] --------------------------------------- */

START_TEST(test_sched_split) {
    /* A = W x, B = A/2, C = B^2 on CUDA; D = sqrt C pinned to the CPU; E = 2D,
     * F = E + D pinned back to CUDA: three splits, results as on the CPU alone */
    float ref[64], got[64];
    for (int pass = 0; pass < 2; pass++) {
        const bool on_gpu = pass == 1;
        bt_context *wctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
        struct bt_tensor *W = bt_set_name(bt_new_tensor_2d(wctx, BT_TYPE_F32, 32, 16), "W");
        bt_buffer_t wbuf = bt_alloc_ctx_tensors(wctx, on_gpu ? g_gpu : g_cpu);
        bt_buffer_set_usage(wbuf, BT_BUFFER_USAGE_WEIGHTS);
        float w[512], xv[128];
        tu_rng r;
        tu_rng_init(&r, 11);
        for (int j = 0; j < 512; j++) w[j] = tu_rng_f32(&r, -1, 1);
        for (int j = 0; j < 128; j++) xv[j] = tu_rng_f32(&r, -1, 1);
        bt_tensor_set(W, w, 0, sizeof w);
        bt_context *ctx = bt_init((struct bt_init_params){4 << 20, NULL, true});
        struct bt_tensor *x = bt_set_name(bt_new_tensor_2d(ctx, BT_TYPE_F32, 32, 4), "x");
        bt_set_input(x);
        struct bt_tensor *A = bt_mul_mat(ctx, W, x), *B = bt_scale(ctx, A, 0.5f), *C = bt_sqr(ctx, B);
        struct bt_tensor *D = bt_sqrt(ctx, C), *E = bt_scale(ctx, D, 2.0f), *F = bt_add(ctx, E, D);
        bt_set_output(F);
        struct bt_graph *g = bt_graph_new(ctx, 64);
        bt_graph_build_forward_expand(g, F);
        if (!on_gpu) {
            ck_assert_ptr_nonnull(bt_alloc_ctx_tensors(ctx, g_cpu));
            bt_tensor_set(x, xv, 0, sizeof xv);
            ck_assert_int_eq(bt_backend_graph_compute(g_cpu, g), BT_OK);
            bt_tensor_get(F, ref, 0, sizeof ref);
        } else {
            bt_backend_t backends[2] = {g_gpu, g_cpu};
            bt_sched_t s = NULL;
            ck_assert_int_eq(bt_sched_new(backends, NULL, 2, 64, 2, &s, NULL, 0), BT_OK);
            bt_sched_set_tensor_backend(s, D, g_cpu);
            bt_sched_set_tensor_backend(s, F, g_gpu); /* else E and F follow D (test_sched's test_two_pins) */
            ck_assert_msg(bt_sched_alloc_graph(s, g) == BT_OK, "%s", bt_sched_error(s));
            ck_assert_int_eq(bt_sched_get_n_splits(s), 3);
            ck_assert_ptr_eq(bt_sched_get_tensor_backend(s, A), g_gpu);
            ck_assert_ptr_eq(bt_sched_get_tensor_backend(s, D), g_cpu);
            ck_assert_ptr_eq(bt_sched_get_tensor_backend(s, F), g_gpu);
            bt_tensor_set(x, xv, 0, sizeof xv);
            ck_assert_msg(bt_sched_graph_compute(s, g) == BT_OK, "%s", bt_sched_error(s));
            bt_sched_synchronize(s);
            bt_tensor_get(F, got, 0, sizeof got);
            bt_sched_free(s);
        }
        bt_free(ctx);
        bt_buffer_free(wbuf);
        bt_free(wctx);
    }
    ck_assert_double_le(tu_nmse(got, ref, 64), TOL_MATMUL);
}
END_TEST

/* ---- NCCL with one rank: a send to itself and the matching receive ------------------- */

#ifdef BATON_HAVE_NCCL
static enum bt_status one_bcast(bt_transport *t, void *buf, size_t bytes, int root) {
    (void)t, (void)buf, (void)bytes, (void)root;
    return BT_OK; /* one rank: the root's data is already there */
}
static const char *one_name(bt_transport *t) {
    (void)t;
    return "one";
}

START_TEST(test_nccl_self) {
    struct bt_transport_i oi;
    memset(&oi, 0, sizeof oi);
    oi.name = one_name;
    oi.bcast = one_bcast;
    bt_transport one = {.iface = oi, .rank = 0, .size = 1, .local_rank = 0, .local_size = 1};
    char err[256] = "";
    bt_transport *t = bt_transport_nccl_init(&one, bt_backend_cuda_stream(g_gpu), err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
    struct bt_tensor *x = bt_new_tensor_1d(ctx, BT_TYPE_F32, 4099), *y = bt_new_tensor_1d(ctx, BT_TYPE_F32, 4099);
    bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, g_gpu);
    float *h = malloc(4099 * 4), *o = malloc(4099 * 4);
    for (int j = 0; j < 4099; j++) h[j] = (float)j - 7.25f;
    bt_tensor_set(x, h, 0, 4099 * 4);
    bt_tensor_memset(y, 0, 0, 4099 * 4);
    bt_treq rs, rr;
    memset(&rs, 0, sizeof rs);
    memset(&rr, 0, sizeof rr);
    ck_assert_int_eq(bt_transport_nccl_group_begin(t), BT_OK);
    ck_assert_msg(bt_transport_irecv(t, y->data, 4099 * 4, 0, 3, &rr) == BT_OK, "%s", t->error);
    ck_assert_msg(bt_transport_isend(t, x->data, 4099 * 4, 0, 3, &rs) == BT_OK, "%s", t->error);
    ck_assert_msg(bt_transport_nccl_group_end(t) == BT_OK, "%s", t->error);
    ck_assert_msg(bt_transport_wait(t, &rr) == BT_OK, "%s", t->error);
    bool done = false;
    ck_assert_int_eq(bt_transport_test(t, &rs, &done), BT_OK);
    if (!done) ck_assert_int_eq(bt_transport_wait(t, &rs), BT_OK);
    bt_tensor_get(y, o, 0, 4099 * 4);
    ck_assert_int_eq(memcmp(h, o, 4099 * 4), 0);
    /* a peer outside the communicator is the caller's error */
    ck_assert_int_eq(bt_transport_isend(t, x->data, 4, 1, 0, &rs), BT_ERR_INVALID);
    free(h);
    free(o);
    bt_buffer_free(buf);
    bt_free(ctx);
    t->iface.free(t);
}
END_TEST
#endif

int main(void) {
    const int n = bt_cuda_device_count();
    if (n == 0) {
        printf("test_cuda: skipped: no CUDA device (cudaGetDeviceCount reports none)\n");
        return 77;
    }
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 300);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_rows);
    tcase_add_test(tc, test_rows_and_copies);
    tcase_add_test(tc, test_mul_mat);
    tcase_add_test(tc, test_flash_attn);
    tcase_add_test(tc, test_flash_attn_rows_alone);
    tcase_add_test(tc, test_read_only_quants);
    tcase_add_test(tc, test_bad_ids);
    tcase_add_test(tc, test_buffers_events);
    tcase_add_test(tc, test_sched_split);
    suite_add_tcase(s, tc);
#ifdef BATON_HAVE_NCCL
    TCase *tn = tcase_create("nccl"); /* CK_RUN_CASE=nccl runs it alone */
    tcase_set_timeout(tn, 120);
    tcase_add_checked_fixture(tn, setup, teardown);
    tcase_add_test(tn, test_nccl_self);
    suite_add_tcase(s, tn);
#endif
    SRunner *sr = srunner_create(s);
    /* CUDA contexts do not survive fork(): run the tests in this process */
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
