/* ops.c - op constructors: shape rules, result types and op_params; and
 * bt_op_is_well_formed, which checks a built node against the same semantics
 * (every backend's supports_op starts there).  Nothing is computed here; see
 * ops.h for each op's semantics. */
#include "baton/ops.h"

#include <math.h>
#include <string.h>

#define FAIL(ctx, ...)                            \
    do {                                          \
        bt_context_set_error((ctx), __VA_ARGS__); \
        return NULL;                              \
    } while (0)

/* "f32 [4, 3, 1, 1]" for messages */
static const char *shape_str(const struct bt_tensor *t, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s [%lld, %lld, %lld, %lld]", t->name[0] ? "'" : "", t->name,
             t->name[0] ? "' " : "", (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
             (long long)t->ne[3]);
    return buf;
}
#define SHAPE(t) shape_str((t), (char[112]){0}, 112)

static struct bt_tensor *new_result(bt_context *ctx, enum bt_type type, const int64_t ne[4],
                                    enum bt_op op) {
    struct bt_tensor *t = bt_new_tensor(ctx, type, 4, ne);
    if (t) t->op = op;
    return t;
}

/* A new result of op over the sources src[0 .. n). */
static struct bt_tensor *result_over(bt_context *ctx, enum bt_type type, const int64_t ne[4], enum bt_op op, int n,
                                     struct bt_tensor *const *src) {
    struct bt_tensor *t = new_result(ctx, type, ne, op);
    for (int i = 0; t && i < n; i++) t->src[i] = src[i];
    return t;
}
#define RESULT_OVER(ctx, type, ne, op, ...)                                                                   \
    result_over(ctx, type, ne, op, (int)(sizeof((struct bt_tensor *[]){__VA_ARGS__}) / sizeof(struct bt_tensor *)), \
                (struct bt_tensor *[]){__VA_ARGS__})

/* A view tensor over a's data: metadata only, data = a's data + offs. */
static struct bt_tensor *new_view(bt_context *ctx, struct bt_tensor *a, enum bt_type type,
                                  const int64_t ne[4], const size_t nb[4], size_t offs,
                                  enum bt_op op) {
    struct bt_tensor *t = bt_context_new_tensor_struct(ctx);
    if (!t) return NULL;
    t->type = type;
    for (int i = 0; i < BT_MAX_DIMS; i++) {
        t->ne[i] = ne[i];
        t->nb[i] = nb[i];
    }
    t->op = op;
    t->src[0] = a;
    t->view_src = a->view_src ? a->view_src : a;
    t->view_offs = a->view_offs + offs;
    t->data = a->data ? (uint8_t *)a->data + offs : NULL;
    t->buffer = a->buffer;
    snprintf(t->name, sizeof t->name, "%.*s (view)", BT_MAX_NAME - 8, a->name);
    return t;
}

/* ---- element-wise binary ops ---------------------------------------------- */

static struct bt_tensor *binary(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b,
                                enum bt_op op) {
    if (!a || !b) return NULL;
    if (a->type != BT_TYPE_F32 || b->type != BT_TYPE_F32)
        FAIL(ctx, "%s: operands must be f32, got %s and %s", bt_op_name(op), bt_type_name(a->type),
             bt_type_name(b->type));
    for (int i = 0; i < BT_MAX_DIMS; i++) {
        if (b->ne[i] != a->ne[i] && b->ne[i] != 1)
            FAIL(ctx, "%s: %s cannot be broadcast to %s (dim %d)", bt_op_name(op), SHAPE(b),
                 SHAPE(a), i);
    }
    return RESULT_OVER(ctx, BT_TYPE_F32, a->ne, op, a, b);
}

struct bt_tensor *bt_add(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    return binary(ctx, a, b, BT_OP_ADD);
}
struct bt_tensor *bt_sub(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    return binary(ctx, a, b, BT_OP_SUB);
}
struct bt_tensor *bt_mul(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    return binary(ctx, a, b, BT_OP_MUL);
}
struct bt_tensor *bt_div(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    return binary(ctx, a, b, BT_OP_DIV);
}

/* ---- element-wise unary ops ------------------------------------------------ */

static struct bt_tensor *unary(bt_context *ctx, struct bt_tensor *a, enum bt_op op) {
    if (!a) return NULL;
    if (a->type != BT_TYPE_F32)
        FAIL(ctx, "%s: operand must be f32, got %s", bt_op_name(op), bt_type_name(a->type));
    struct bt_tensor *t = new_result(ctx, BT_TYPE_F32, a->ne, op);
    if (!t) return NULL;
    t->src[0] = a;
    return t;
}

struct bt_tensor *bt_scale(bt_context *ctx, struct bt_tensor *a, float s) {
    struct bt_tensor *t = unary(ctx, a, BT_OP_SCALE);
    if (t) bt_set_op_param_f32(t, 0, s);
    return t;
}
struct bt_tensor *bt_sqr(bt_context *ctx, struct bt_tensor *a) { return unary(ctx, a, BT_OP_SQR); }
struct bt_tensor *bt_sqrt(bt_context *ctx, struct bt_tensor *a) { return unary(ctx, a, BT_OP_SQRT); }
struct bt_tensor *bt_silu(bt_context *ctx, struct bt_tensor *a) { return unary(ctx, a, BT_OP_SILU); }
struct bt_tensor *bt_gelu(bt_context *ctx, struct bt_tensor *a) { return unary(ctx, a, BT_OP_GELU); }
struct bt_tensor *bt_relu(bt_context *ctx, struct bt_tensor *a) { return unary(ctx, a, BT_OP_RELU); }
struct bt_tensor *bt_sigmoid(bt_context *ctx, struct bt_tensor *a) {
    return unary(ctx, a, BT_OP_SIGMOID);
}

struct bt_tensor *bt_swiglu(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    if (!a || !b) return NULL;
    if (!bt_are_same_shape(a, b))
        FAIL(ctx, "SWIGLU: shapes differ: %s and %s", SHAPE(a), SHAPE(b));
    if (b->type != BT_TYPE_F32) FAIL(ctx, "SWIGLU: operands must be f32, got %s", bt_type_name(b->type));
    struct bt_tensor *t = unary(ctx, a, BT_OP_SWIGLU);
    if (t) t->src[1] = b;
    return t;
}

struct bt_tensor *bt_swiglu_oai(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b, float alpha,
                                float limit) {
    if (!a || !b) return NULL;
    if (!bt_are_same_shape(a, b))
        FAIL(ctx, "SWIGLU_OAI: shapes differ: %s and %s", SHAPE(a), SHAPE(b));
    if (b->type != BT_TYPE_F32) FAIL(ctx, "SWIGLU_OAI: operands must be f32, got %s", bt_type_name(b->type));
    if (!(limit > 0.0f)) FAIL(ctx, "SWIGLU_OAI: limit %g must be positive", (double)limit);
    struct bt_tensor *t = unary(ctx, a, BT_OP_SWIGLU_OAI);
    if (!t) return NULL;
    t->src[1] = b;
    bt_set_op_param_f32(t, 0, alpha);
    bt_set_op_param_f32(t, 1, limit);
    return t;
}

struct bt_tensor *bt_moe_sum(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *w) {
    if (!a || !w) return NULL;
    if (a->type != BT_TYPE_F32 || w->type != BT_TYPE_F32)
        FAIL(ctx, "MOE_SUM: operands must be f32, got %s and %s", bt_type_name(a->type), bt_type_name(w->type));
    if (a->ne[3] != 1 || a->nb[0] != sizeof(float))
        FAIL(ctx, "MOE_SUM: the results %s must be [n, K, T] with packed rows", SHAPE(a));
    if (w->ne[0] != 1 || w->ne[1] != a->ne[1] || w->ne[2] != a->ne[2] || w->ne[3] != 1)
        FAIL(ctx, "MOE_SUM: the weights %s must be [1, K, T] of the results %s", SHAPE(w), SHAPE(a));
    const int64_t ne[4] = {a->ne[0], a->ne[2], 1, 1};
    return RESULT_OVER(ctx, BT_TYPE_F32, ne, BT_OP_MOE_SUM, a, w);
}

static struct bt_tensor *row_reduce(bt_context *ctx, struct bt_tensor *a, enum bt_op op) {
    if (!a) return NULL;
    if (a->type != BT_TYPE_F32)
        FAIL(ctx, "%s: operand must be f32, got %s", bt_op_name(op), bt_type_name(a->type));
    const int64_t ne[4] = {1, a->ne[1], a->ne[2], a->ne[3]};
    struct bt_tensor *t = new_result(ctx, BT_TYPE_F32, ne, op);
    if (t) t->src[0] = a;
    return t;
}
struct bt_tensor *bt_sum_rows(bt_context *ctx, struct bt_tensor *a) {
    return row_reduce(ctx, a, BT_OP_SUM_ROWS);
}
struct bt_tensor *bt_mean(bt_context *ctx, struct bt_tensor *a) { return row_reduce(ctx, a, BT_OP_MEAN); }

/* ---- matrix products -------------------------------------------------------- */

struct bt_tensor *bt_mul_mat(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    if (!a || !b) return NULL;
    if (a->ne[0] != b->ne[0])
        FAIL(ctx, "MUL_MAT: inner dimensions differ: %s x %s", SHAPE(a), SHAPE(b));
    if (b->ne[2] % a->ne[2] != 0 || b->ne[3] % a->ne[3] != 0)
        FAIL(ctx, "MUL_MAT: %s cannot be broadcast over %s in dims 2 and 3", SHAPE(a), SHAPE(b));
    if (b->type != BT_TYPE_F32) FAIL(ctx, "MUL_MAT: activations must be f32, got %s", bt_type_name(b->type));
    if (a->type == BT_TYPE_I32) FAIL(ctx, "MUL_MAT: weights of type i32 are not supported");
    if (!bt_is_contiguous_rows(a))
        FAIL(ctx, "MUL_MAT: weight rows of %s must be contiguous", SHAPE(a));
    if (!bt_is_contiguous_rows(b))
        FAIL(ctx, "MUL_MAT: activation rows of %s must be contiguous", SHAPE(b));
    const int64_t ne[4] = {a->ne[1], b->ne[1], b->ne[2], b->ne[3]};
    return RESULT_OVER(ctx, BT_TYPE_F32, ne, BT_OP_MUL_MAT, a, b);
}

struct bt_tensor *bt_mul_mat_id(bt_context *ctx, struct bt_tensor *as, struct bt_tensor *b,
                                struct bt_tensor *ids) {
    if (!as || !b || !ids) return NULL;
    if (ids->type != BT_TYPE_I32) FAIL(ctx, "MUL_MAT_ID: ids must be i32, got %s", bt_type_name(ids->type));
    if (as->ne[3] != 1) FAIL(ctx, "MUL_MAT_ID: expert weights %s must be 3-d", SHAPE(as));
    if (ids->ne[2] != 1 || ids->ne[3] != 1) FAIL(ctx, "MUL_MAT_ID: ids %s must be 2-d", SHAPE(ids));
    if (as->ne[0] != b->ne[0])
        FAIL(ctx, "MUL_MAT_ID: inner dimensions differ: %s x %s", SHAPE(as), SHAPE(b));
    if (b->ne[2] != ids->ne[1])
        FAIL(ctx, "MUL_MAT_ID: %s has %lld tokens, ids %s has %lld", SHAPE(b), (long long)b->ne[2],
             SHAPE(ids), (long long)ids->ne[1]);
    if (b->ne[1] != 1 && b->ne[1] != ids->ne[0])
        FAIL(ctx, "MUL_MAT_ID: %s: ne[1] must be 1 or n_used = %lld", SHAPE(b), (long long)ids->ne[0]);
    if (b->ne[3] != 1) FAIL(ctx, "MUL_MAT_ID: activations %s must be 3-d", SHAPE(b));
    if (b->type != BT_TYPE_F32) FAIL(ctx, "MUL_MAT_ID: activations must be f32, got %s", bt_type_name(b->type));
    if (as->type == BT_TYPE_I32) FAIL(ctx, "MUL_MAT_ID: weights of type i32 are not supported");
    if (!bt_is_contiguous_rows(as) || !bt_is_contiguous_rows(b))
        FAIL(ctx, "MUL_MAT_ID: rows of %s and %s must be contiguous", SHAPE(as), SHAPE(b));
    const int64_t ne[4] = {as->ne[1], ids->ne[0], ids->ne[1], 1};
    return RESULT_OVER(ctx, BT_TYPE_F32, ne, BT_OP_MUL_MAT_ID, as, b, ids);
}

/* ---- rows and copies ------------------------------------------------------ */

struct bt_tensor *bt_get_rows(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *ids) {
    if (!a || !ids) return NULL;
    if (ids->type != BT_TYPE_I32) FAIL(ctx, "GET_ROWS: ids must be i32, got %s", bt_type_name(ids->type));
    if (ids->ne[1] != a->ne[2] || ids->ne[2] != a->ne[3] || ids->ne[3] != 1)
        FAIL(ctx, "GET_ROWS: ids %s do not match %s (need [nr, %lld, %lld])", SHAPE(ids), SHAPE(a),
             (long long)a->ne[2], (long long)a->ne[3]);
    const int64_t ne[4] = {a->ne[0], ids->ne[0], ids->ne[1], ids->ne[2]};
    return RESULT_OVER(ctx, a->type == BT_TYPE_I32 ? BT_TYPE_I32 : BT_TYPE_F32, ne, BT_OP_GET_ROWS, a, ids);
}

struct bt_tensor *bt_set_rows(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b,
                              struct bt_tensor *ids) {
    if (!a || !b || !ids) return NULL;
    if (ids->type != BT_TYPE_I32) FAIL(ctx, "SET_ROWS: ids must be i32, got %s", bt_type_name(ids->type));
    if (b->type != BT_TYPE_F32) FAIL(ctx, "SET_ROWS: rows must be f32, got %s", bt_type_name(b->type));
    if (a->type == BT_TYPE_I32) FAIL(ctx, "SET_ROWS: destination of type i32 is not supported");
    if (!bt_type_can_quantize(a->type))
        FAIL(ctx, "SET_ROWS: cannot write rows of %s (no conversion from f32)", bt_type_name(a->type));
    if (a->ne[0] != b->ne[0] || a->ne[2] != b->ne[2] || a->ne[3] != b->ne[3])
        FAIL(ctx, "SET_ROWS: rows %s do not fit destination %s", SHAPE(b), SHAPE(a));
    if (ids->ne[0] != b->ne[1] || ids->ne[1] != b->ne[2] || ids->ne[2] != b->ne[3])
        FAIL(ctx, "SET_ROWS: ids %s do not match rows %s", SHAPE(ids), SHAPE(b));
    struct bt_tensor *t = new_view(ctx, a, a->type, a->ne, a->nb, 0, BT_OP_SET_ROWS);
    if (!t) return NULL;
    t->src[1] = b;
    t->src[2] = ids;
    return t;
}

struct bt_tensor *bt_cpy(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b) {
    if (!a || !b) return NULL;
    if (bt_nelements(a) != bt_nelements(b))
        FAIL(ctx, "CPY: %s and %s have different element counts", SHAPE(a), SHAPE(b));
    /* to or from a block type, every row must hold whole blocks so that each
     * block covers consecutive elements of the other side */
    const int64_t blck = bt_blck_size(a->type) > bt_blck_size(b->type) ? bt_blck_size(a->type)
                                                                       : bt_blck_size(b->type);
    if (blck > 1 && (a->ne[0] % blck != 0 || b->ne[0] % blck != 0))
        FAIL(ctx, "CPY: copies to or from block types need rows of whole %lld-element blocks: %s and %s",
             (long long)blck, SHAPE(a), SHAPE(b));
    if ((a->type == BT_TYPE_I32) != (b->type == BT_TYPE_I32) && b->type != BT_TYPE_F32 &&
        a->type != BT_TYPE_F32)
        FAIL(ctx, "CPY: cannot convert %s to %s", bt_type_name(a->type), bt_type_name(b->type));
    if (a->type != b->type && !bt_type_can_quantize(b->type))
        FAIL(ctx, "CPY: cannot convert %s to %s (no conversion from f32)", bt_type_name(a->type), bt_type_name(b->type));
    struct bt_tensor *t = new_view(ctx, b, b->type, b->ne, b->nb, 0, BT_OP_CPY);
    if (!t) return NULL;
    t->src[0] = a;
    t->src[1] = b;
    return t;
}

struct bt_tensor *bt_cont(bt_context *ctx, struct bt_tensor *a) {
    if (!a) return NULL;
    struct bt_tensor *t = new_result(ctx, a->type, a->ne, BT_OP_CONT);
    if (!t) return NULL;
    t->src[0] = a;
    return t;
}

/* ---- views ---------------------------------------------------------------- */

static struct bt_tensor *view_checked(bt_context *ctx, struct bt_tensor *a, const int64_t ne[4],
                                      const size_t nb[4], size_t offset, enum bt_op op) {
    if (!a) return NULL;
    for (int i = 0; i < 4; i++)
        if (ne[i] <= 0) FAIL(ctx, "%s of %s: ne[%d] = %lld must be positive", bt_op_name(op), SHAPE(a), i, (long long)ne[i]);
    if (ne[0] % bt_blck_size(a->type) != 0)
        FAIL(ctx, "%s of %s: ne[0] = %lld is not a multiple of the block size", bt_op_name(op), SHAPE(a),
             (long long)ne[0]);
    struct bt_tensor probe = {.type = a->type};
    memcpy(probe.ne, ne, sizeof probe.ne);
    memcpy(probe.nb, nb, sizeof probe.nb);
    /* the view must lie inside the data of the tensor that owns it */
    const struct bt_tensor *owner = a->view_src ? a->view_src : a;
    const size_t owner_bytes = bt_nbytes(owner);
    const size_t start = a->view_offs + offset;
    if (start > owner_bytes || bt_nbytes(&probe) > owner_bytes - start)
        FAIL(ctx, "%s of %s: %zu bytes at offset %zu lie past the end of its %zu bytes",
             bt_op_name(op), SHAPE(a), bt_nbytes(&probe), start, owner_bytes);
    return new_view(ctx, a, a->type, ne, nb, offset, op);
}

struct bt_tensor *bt_view_4d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3,
                             size_t offset) {
    if (!a) return NULL;
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    const size_t nb[4] = {a->nb[0], nb1, nb2, nb3};
    return view_checked(ctx, a, ne, nb, offset, BT_OP_VIEW);
}
struct bt_tensor *bt_view_3d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, size_t nb1, size_t nb2, size_t offset) {
    return bt_view_4d(ctx, a, ne0, ne1, ne2, 1, nb1, nb2, nb2 * (size_t)ne2, offset);
}
struct bt_tensor *bt_view_2d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                             size_t nb1, size_t offset) {
    return bt_view_4d(ctx, a, ne0, ne1, 1, 1, nb1, nb1 * (size_t)ne1, nb1 * (size_t)ne1, offset);
}
struct bt_tensor *bt_view_1d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, size_t offset) {
    if (!a) return NULL;
    const size_t row = bt_row_size(a->type, ne0);
    return bt_view_4d(ctx, a, ne0, 1, 1, 1, row, row, row, offset);
}
struct bt_tensor *bt_view_tensor(bt_context *ctx, struct bt_tensor *a) {
    if (!a) return NULL;
    return view_checked(ctx, a, a->ne, a->nb, 0, BT_OP_VIEW);
}

struct bt_tensor *bt_reshape_4d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2, int64_t ne3) {
    if (!a) return NULL;
    if (!bt_is_contiguous(a)) FAIL(ctx, "RESHAPE of %s: the tensor must be contiguous", SHAPE(a));
    if (ne0 <= 0 || ne1 <= 0 || ne2 <= 0 || ne3 <= 0 || ne0 * ne1 * ne2 * ne3 != bt_nelements(a))
        FAIL(ctx, "RESHAPE of %s to [%lld, %lld, %lld, %lld]: element counts differ", SHAPE(a),
             (long long)ne0, (long long)ne1, (long long)ne2, (long long)ne3);
    if (ne0 % bt_blck_size(a->type) != 0)
        FAIL(ctx, "RESHAPE of %s: ne[0] = %lld is not a multiple of the block size", SHAPE(a), (long long)ne0);
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    size_t nb[4];
    nb[0] = bt_type_size(a->type);
    nb[1] = bt_row_size(a->type, ne0);
    nb[2] = nb[1] * (size_t)ne1;
    nb[3] = nb[2] * (size_t)ne2;
    return new_view(ctx, a, a->type, ne, nb, 0, BT_OP_RESHAPE);
}
struct bt_tensor *bt_reshape_3d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2) {
    return bt_reshape_4d(ctx, a, ne0, ne1, ne2, 1);
}
struct bt_tensor *bt_reshape_2d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1) {
    return bt_reshape_4d(ctx, a, ne0, ne1, 1, 1);
}
struct bt_tensor *bt_reshape_1d(bt_context *ctx, struct bt_tensor *a, int64_t ne0) {
    return bt_reshape_4d(ctx, a, ne0, 1, 1, 1);
}

static struct bt_tensor *permute_op(bt_context *ctx, struct bt_tensor *a, const int ax[4],
                                    enum bt_op op) {
    if (!a) return NULL;
    for (int i = 0; i < 4; i++) {
        if (ax[i] < 0 || ax[i] > 3) FAIL(ctx, "PERMUTE of %s: axis %d out of range", SHAPE(a), ax[i]);
        for (int j = 0; j < i; j++)
            if (ax[i] == ax[j]) FAIL(ctx, "PERMUTE of %s: axis %d repeated", SHAPE(a), ax[i]);
    }
    if (bt_type_traits(a->type)->is_quantized && ax[0] != 0)
        FAIL(ctx, "PERMUTE of %s: a block type cannot move dimension 0", SHAPE(a));
    int64_t ne[4];
    size_t nb[4];
    for (int i = 0; i < 4; i++) {
        ne[ax[i]] = a->ne[i];
        nb[ax[i]] = a->nb[i];
    }
    struct bt_tensor *t = new_view(ctx, a, a->type, ne, nb, 0, op);
    if (t)
        for (int i = 0; i < 4; i++) t->op_params[i] = ax[i];
    return t;
}

struct bt_tensor *bt_permute(bt_context *ctx, struct bt_tensor *a, int axis0, int axis1, int axis2,
                             int axis3) {
    const int ax[4] = {axis0, axis1, axis2, axis3};
    return permute_op(ctx, a, ax, BT_OP_PERMUTE);
}
struct bt_tensor *bt_transpose(bt_context *ctx, struct bt_tensor *a) {
    const int ax[4] = {1, 0, 2, 3};
    return permute_op(ctx, a, ax, BT_OP_TRANSPOSE);
}

/* ---- normalisation, attention --------------------------------------------- */

struct bt_tensor *bt_rms_norm(bt_context *ctx, struct bt_tensor *a, float eps) {
    if (a && !(eps >= 0)) FAIL(ctx, "RMS_NORM: eps must be >= 0");
    struct bt_tensor *t = unary(ctx, a, BT_OP_RMS_NORM);
    if (t) bt_set_op_param_f32(t, 0, eps);
    return t;
}
struct bt_tensor *bt_norm(bt_context *ctx, struct bt_tensor *a, float eps) {
    if (a && !(eps >= 0)) FAIL(ctx, "NORM: eps must be >= 0");
    struct bt_tensor *t = unary(ctx, a, BT_OP_NORM);
    if (t) bt_set_op_param_f32(t, 0, eps);
    return t;
}

struct bt_tensor *bt_soft_max_ext(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *mask,
                                  float scale) {
    if (!a) return NULL;
    if (mask) {
        if (mask->type != BT_TYPE_F32) FAIL(ctx, "SOFT_MAX: mask must be f32, got %s", bt_type_name(mask->type));
        if (mask->ne[0] != a->ne[0] || mask->ne[1] < a->ne[1] || mask->ne[2] != 1 || mask->ne[3] != 1)
            FAIL(ctx, "SOFT_MAX: mask %s does not fit %s (need [%lld, >= %lld])", SHAPE(mask), SHAPE(a),
                 (long long)a->ne[0], (long long)a->ne[1]);
    }
    struct bt_tensor *t = unary(ctx, a, BT_OP_SOFT_MAX);
    if (!t) return NULL;
    t->src[1] = mask;
    bt_set_op_param_f32(t, 0, scale);
    return t;
}
struct bt_tensor *bt_soft_max(bt_context *ctx, struct bt_tensor *a) {
    return bt_soft_max_ext(ctx, a, NULL, 1.0f);
}

struct bt_tensor *bt_rope(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *pos, int n_dims,
                          int mode, float freq_base, float freq_scale) {
    return bt_rope_ext(ctx, a, pos, n_dims, mode, freq_base, freq_scale, NULL);
}

static float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * 3.14159265358979323846f)) / (2.0f * logf(base));
}

void bt_rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                            float dims[2]) {
    const float start = floorf(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base));
    const float end = ceilf(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base));
    dims[0] = start > 0.0f ? start : 0.0f;
    dims[1] = end < (float)(n_dims - 1) ? end : (float)(n_dims - 1);
}

struct bt_tensor *bt_rope_ext(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *pos, int n_dims,
                              int mode, float freq_base, float freq_scale, const struct bt_rope_yarn *yarn) {
    if (!a || !pos) return NULL;
    if (pos->type != BT_TYPE_I32) FAIL(ctx, "ROPE: positions must be i32, got %s", bt_type_name(pos->type));
    if (a->ne[3] != 1 || pos->ne[0] != a->ne[2] || bt_nelements(pos) != pos->ne[0])
        FAIL(ctx, "ROPE: positions %s do not match %s (need [%lld])", SHAPE(pos), SHAPE(a),
             (long long)a->ne[2]);
    if (n_dims <= 0 || n_dims % 2 != 0 || n_dims > a->ne[0])
        FAIL(ctx, "ROPE: n_dims = %d must be even, positive and <= %lld", n_dims, (long long)a->ne[0]);
    if (mode != BT_ROPE_NORMAL && mode != BT_ROPE_NEOX) FAIL(ctx, "ROPE: unknown mode %d", mode);
    if (!(freq_base > 0) || !(freq_scale > 0)) FAIL(ctx, "ROPE: freq_base and freq_scale must be > 0");
    if (yarn && (!isfinite(yarn->ext_factor) || !isfinite(yarn->attn_factor) || !(yarn->attn_factor > 0) ||
                 (yarn->ext_factor != 0.0f && (yarn->n_ctx_orig <= 0 || !(yarn->beta_fast > 0) ||
                                               !(yarn->beta_slow > 0)))))
        FAIL(ctx, "ROPE: YaRN needs a finite ext_factor, attn_factor > 0 and, with ext_factor != 0, "
                  "n_ctx_orig, beta_fast and beta_slow > 0 (got %g, %g, %d, %g, %g)",
             (double)yarn->ext_factor, (double)yarn->attn_factor, yarn->n_ctx_orig, (double)yarn->beta_fast,
             (double)yarn->beta_slow);
    struct bt_tensor *t = unary(ctx, a, BT_OP_ROPE);
    if (!t) return NULL;
    t->src[1] = pos;
    t->op_params[0] = n_dims;
    t->op_params[1] = mode;
    bt_set_op_param_f32(t, 2, freq_base);
    bt_set_op_param_f32(t, 3, freq_scale);
    bt_set_op_param_f32(t, 4, yarn ? yarn->ext_factor : 0.0f);
    bt_set_op_param_f32(t, 5, yarn ? yarn->attn_factor : 1.0f);
    bt_set_op_param_f32(t, 6, yarn ? yarn->beta_fast : 0.0f);
    bt_set_op_param_f32(t, 7, yarn ? yarn->beta_slow : 0.0f);
    t->op_params[8] = yarn ? yarn->n_ctx_orig : 0;
    return t;
}

/* ---- sorting, concat -------------------------------------------------------- */

struct bt_tensor *bt_argsort(bt_context *ctx, struct bt_tensor *a, enum bt_sort_order order) {
    if (!a) return NULL;
    if (a->type != BT_TYPE_F32) FAIL(ctx, "ARGSORT: operand must be f32, got %s", bt_type_name(a->type));
    if (order != BT_SORT_ASC && order != BT_SORT_DESC) FAIL(ctx, "ARGSORT: unknown order %d", (int)order);
    struct bt_tensor *t = new_result(ctx, BT_TYPE_I32, a->ne, BT_OP_ARGSORT);
    if (!t) return NULL;
    t->src[0] = a;
    t->op_params[0] = order;
    return t;
}

struct bt_tensor *bt_top_k(bt_context *ctx, struct bt_tensor *a, int k) {
    if (!a) return NULL;
    if (k <= 0 || k > a->ne[0]) FAIL(ctx, "TOP_K: k = %d must be in [1, %lld]", k, (long long)a->ne[0]);
    struct bt_tensor *s = bt_argsort(ctx, a, BT_SORT_DESC);
    if (!s) return NULL;
    struct bt_tensor *t = bt_view_4d(ctx, s, k, s->ne[1], s->ne[2], s->ne[3], s->nb[1], s->nb[2], s->nb[3], 0);
    if (t) bt_format_name(t, "%.*s (top %d)", BT_MAX_NAME - 16, a->name, k);
    return t;
}

struct bt_tensor *bt_concat(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b, int dim) {
    if (!a || !b) return NULL;
    if (dim < 0 || dim > 3) FAIL(ctx, "CONCAT: dim %d out of range", dim);
    if (a->type != b->type)
        FAIL(ctx, "CONCAT: types differ: %s and %s", bt_type_name(a->type), bt_type_name(b->type));
    if (bt_type_traits(a->type)->is_quantized) FAIL(ctx, "CONCAT: block types are not supported");
    int64_t ne[4];
    for (int i = 0; i < 4; i++) {
        if (i != dim && a->ne[i] != b->ne[i])
            FAIL(ctx, "CONCAT along %d: %s and %s differ in dim %d", dim, SHAPE(a), SHAPE(b), i);
        ne[i] = i == dim ? a->ne[i] + b->ne[i] : a->ne[i];
    }
    struct bt_tensor *t = new_result(ctx, a->type, ne, BT_OP_CONCAT);
    if (!t) return NULL;
    t->src[0] = a;
    t->src[1] = b;
    t->op_params[0] = dim;
    return t;
}

/* ---- fused attention ---------------------------------------------------------- */

static bool attn_kv_type_ok(enum bt_type t) {
    return t == BT_TYPE_F32 || t == BT_TYPE_F16 || t == BT_TYPE_Q8_0;
}

struct bt_tensor *bt_flash_attn(bt_context *ctx, struct bt_tensor *q, struct bt_tensor *k,
                                struct bt_tensor *v, struct bt_tensor *mask, float scale) {
    return bt_flash_attn_ext(ctx, q, k, v, mask, NULL, scale);
}

/* sinks: F32 [H] with packed elements, one per q head */
static bool sinks_ok(const struct bt_tensor *sinks, const struct bt_tensor *q) {
    return sinks->type == BT_TYPE_F32 && sinks->nb[0] == sizeof(float) && sinks->ne[0] == q->ne[1] &&
           sinks->ne[1] == 1 && sinks->ne[2] == 1 && sinks->ne[3] == 1;
}

struct bt_tensor *bt_flash_attn_ext(bt_context *ctx, struct bt_tensor *q, struct bt_tensor *k,
                                    struct bt_tensor *v, struct bt_tensor *mask, struct bt_tensor *sinks,
                                    float scale) {
    if (!q || !k || !v) return NULL;
    if (sinks && !sinks_ok(sinks, q))
        FAIL(ctx, "FLASH_ATTN: sinks %s must be f32 [%lld] (one per q head of %s)", SHAPE(sinks),
             (long long)q->ne[1], SHAPE(q));
    if (q->type != BT_TYPE_F32 || q->nb[0] != sizeof(float))
        FAIL(ctx, "FLASH_ATTN: q %s must be f32 with packed rows", SHAPE(q));
    if (!attn_kv_type_ok(k->type) || !attn_kv_type_ok(v->type))
        FAIL(ctx, "FLASH_ATTN: k and v must be f32, f16 or q8_0, got %s and %s", bt_type_name(k->type),
             bt_type_name(v->type));
    if (k->nb[0] != bt_type_size(k->type) || v->nb[0] != bt_type_size(v->type) ||
        k->ne[0] % bt_blck_size(k->type) != 0 || v->ne[0] % bt_blck_size(v->type) != 0)
        FAIL(ctx, "FLASH_ATTN: k %s and v %s need packed rows of whole blocks", SHAPE(k), SHAPE(v));
    if (q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1)
        FAIL(ctx, "FLASH_ATTN: q %s, k %s, v %s must be 3-d", SHAPE(q), SHAPE(k), SHAPE(v));
    if (k->ne[0] != q->ne[0])
        FAIL(ctx, "FLASH_ATTN: head sizes of q %s and k %s differ", SHAPE(q), SHAPE(k));
    if (v->ne[1] != k->ne[1] || v->ne[2] != k->ne[2])
        FAIL(ctx, "FLASH_ATTN: k %s and v %s differ in heads or cells", SHAPE(k), SHAPE(v));
    if (k->ne[1] <= 0 || q->ne[1] % k->ne[1] != 0)
        FAIL(ctx, "FLASH_ATTN: q heads (%lld) must be a multiple of k heads (%lld)", (long long)q->ne[1],
             (long long)k->ne[1]);
    if (mask) {
        if (mask->type != BT_TYPE_F32 && mask->type != BT_TYPE_F16)
            FAIL(ctx, "FLASH_ATTN: mask must be f32 or f16, got %s", bt_type_name(mask->type));
        if (mask->ne[0] != k->ne[2] || mask->ne[1] < q->ne[2] || mask->ne[2] != 1 || mask->ne[3] != 1)
            FAIL(ctx, "FLASH_ATTN: mask %s does not fit k %s and q %s (need [%lld, >= %lld])", SHAPE(mask),
                 SHAPE(k), SHAPE(q), (long long)k->ne[2], (long long)q->ne[2]);
    }
    const int64_t ne[4] = {v->ne[0], q->ne[1], q->ne[2], 1};
    struct bt_tensor *t = RESULT_OVER(ctx, BT_TYPE_F32, ne, BT_OP_FLASH_ATTN, q, k, v, mask, sinks);
    if (!t) return NULL;
    bt_set_op_param_f32(t, 0, scale);
    return t;
}

/* ---- well-formedness -------------------------------------------------------- */
/* What a backend's supports_op checks first: the node is an instance of its op
 * as ops.h documents it.  Nodes not built by the constructors above (a
 * deserialized graph, a test's hand-made node) reach backends too, so every
 * source is checked for NULL. */

static bool is_quant(enum bt_type t) { return bt_type_traits(t)->is_quantized; }
static bool is_f32(const struct bt_tensor *t) { return t && t->type == BT_TYPE_F32; }
static bool is_i32(const struct bt_tensor *t) { return t && t->type == BT_TYPE_I32; }

/* A tensor of a block type must have packed whole blocks along dim 0. */
static bool layout_ok(const struct bt_tensor *t) {
    if (!t || (int)t->type < 0 || t->type >= BT_TYPE_COUNT) return false;
    if (is_quant(t->type)) return t->nb[0] == bt_type_size(t->type) && t->ne[0] % bt_blck_size(t->type) == 0;
    return true;
}

static bool same_shape(const struct bt_tensor *a, const struct bt_tensor *b) {
    for (int i = 0; i < BT_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

/* Types holding real numbers (all but I32): MUL_MAT's a, SET_ROWS' destination. */
static bool weight_type_ok(enum bt_type t) {
    /* every block type but Q8_K, which only activations take */
    return t == BT_TYPE_F32 || t == BT_TYPE_F16 || t == BT_TYPE_BF16 || (is_quant(t) && t != BT_TYPE_Q8_K);
}

static bool mul_mat_well_formed(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0], *b = node->src[1];
    if (!a || !b || node->type != BT_TYPE_F32 || node->nb[0] != sizeof(float)) return false;
    if (!weight_type_ok(a->type) || a->nb[0] != bt_type_size(a->type)) return false;
    if (b->type != BT_TYPE_F32 || b->nb[0] != sizeof(float)) return false;
    if (a->ne[0] != b->ne[0] || a->ne[0] % bt_blck_size(a->type) != 0) return false;
    if (node->op == BT_OP_MUL_MAT) {
        return a->ne[2] > 0 && a->ne[3] > 0 && b->ne[2] % a->ne[2] == 0 &&
               b->ne[3] % a->ne[3] == 0 && node->ne[0] == a->ne[1] && node->ne[1] == b->ne[1] &&
               node->ne[2] == b->ne[2] && node->ne[3] == b->ne[3];
    }
    const struct bt_tensor *ids = node->src[2];
    if (!is_i32(ids)) return false;
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];
    /* experts and (expert slot, token) pairs are counted in I32 */
    return a->ne[3] == 1 && b->ne[3] == 1 && b->ne[2] == n_tokens &&
           (b->ne[1] == 1 || b->ne[1] == n_used) && node->ne[0] == a->ne[1] &&
           node->ne[1] == n_used && node->ne[2] == n_tokens && n_used * n_tokens < INT32_MAX &&
           a->ne[2] < INT32_MAX;
}

/* CPY and CONT: element counts match; block types hold whole packed blocks. */
static bool cpy_well_formed(const struct bt_tensor *s, const struct bt_tensor *d) {
    return layout_ok(s) && layout_ok(d) && bt_nelements(s) == bt_nelements(d);
}

enum bt_elementwise bt_op_elementwise(enum bt_op op) {
    switch (op) {
        case BT_OP_ADD:
        case BT_OP_SUB:
        case BT_OP_MUL:
        case BT_OP_DIV: return BT_ELEMENTWISE_BINARY;
        case BT_OP_SCALE:
        case BT_OP_SQR:
        case BT_OP_SQRT:
        case BT_OP_SILU:
        case BT_OP_GELU:
        case BT_OP_RELU:
        case BT_OP_SIGMOID: return BT_ELEMENTWISE_UNARY;
        case BT_OP_SWIGLU:
        case BT_OP_SWIGLU_OAI: return BT_ELEMENTWISE_GLU;
        default: return BT_ELEMENTWISE_NONE;
    }
}

bool bt_op_is_well_formed(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0], *b = node->src[1], *c = node->src[2];
    switch (bt_op_elementwise(node->op)) {
        case BT_ELEMENTWISE_BINARY:
            if (!is_f32(node) || !is_f32(a) || !is_f32(b) || !same_shape(node, a)) return false;
            for (int i = 0; i < BT_MAX_DIMS; i++)
                if (b->ne[i] <= 0 || a->ne[i] % b->ne[i] != 0) return false;
            return true;
        case BT_ELEMENTWISE_UNARY: return is_f32(node) && is_f32(a) && same_shape(node, a);
        case BT_ELEMENTWISE_GLU:
            if (node->op == BT_OP_SWIGLU_OAI && !(bt_get_op_param_f32(node, 1) > 0.0f)) return false;
            return is_f32(node) && is_f32(a) && is_f32(b) && same_shape(node, a) && same_shape(a, b);
        case BT_ELEMENTWISE_NONE: break;
    }
    if (node->op == BT_OP_NONE || bt_op_is_view(node->op)) return true;
    switch (node->op) {
        case BT_OP_RMS_NORM:
        case BT_OP_NORM:
            return is_f32(node) && is_f32(a) && same_shape(node, a);
        case BT_OP_SUM_ROWS:
        case BT_OP_MEAN:
            return is_f32(node) && is_f32(a) && node->ne[0] == 1 && node->ne[1] == a->ne[1] &&
                   node->ne[2] == a->ne[2] && node->ne[3] == a->ne[3];
        case BT_OP_SOFT_MAX:
            if (!is_f32(node) || !is_f32(a) || !same_shape(node, a)) return false;
            if (b) { /* the optional mask */
                if (!is_f32(b) || b->ne[0] != a->ne[0] || b->ne[1] < a->ne[1]) return false;
                if (b->ne[2] <= 0 || b->ne[3] <= 0 || a->ne[2] % b->ne[2] || a->ne[3] % b->ne[3])
                    return false;
            }
            return true;
        case BT_OP_ROPE: {
            const int n_dims = bt_get_op_param_i32(node, 0);
            const int mode = bt_get_op_param_i32(node, 1);
            return is_f32(node) && is_f32(a) && is_i32(b) && same_shape(node, a) &&
                   b->ne[0] >= a->ne[2] && n_dims > 0 && n_dims % 2 == 0 && n_dims <= a->ne[0] &&
                   (mode == BT_ROPE_NORMAL || mode == BT_ROPE_NEOX);
        }
        case BT_OP_MOE_SUM:
            return is_f32(node) && bt_is_contiguous(node) && is_f32(a) && is_f32(b) && a->nb[0] == sizeof(float) &&
                   a->ne[3] == 1 && b->ne[0] == 1 && b->ne[1] == a->ne[1] && b->ne[2] == a->ne[2] && b->ne[3] == 1 &&
                   node->ne[0] == a->ne[0] && node->ne[1] == a->ne[2] && node->ne[2] == 1 && node->ne[3] == 1;
        case BT_OP_ARGSORT: /* indices along dim 0 are I32 */
            return is_i32(node) && is_f32(a) && same_shape(node, a) && a->ne[0] <= INT32_MAX;
        case BT_OP_CONCAT: {
            const int dim = bt_get_op_param_i32(node, 0);
            if (!a || !b || dim < 0 || dim >= BT_MAX_DIMS) return false;
            if (a->type != node->type || b->type != node->type || !layout_ok(a) ||
                !layout_ok(b) || !layout_ok(node))
                return false;
            if (is_quant(node->type) && dim == 0) return false; /* would split blocks */
            for (int i = 0; i < BT_MAX_DIMS; i++) {
                if (i == dim) {
                    if (node->ne[i] != a->ne[i] + b->ne[i]) return false;
                } else if (a->ne[i] != node->ne[i] || b->ne[i] != node->ne[i]) {
                    return false;
                }
            }
            return true;
        }
        case BT_OP_GET_ROWS:
            if (!layout_ok(a) || !is_i32(b)) return false;
            if (node->type != (a->type == BT_TYPE_I32 ? BT_TYPE_I32 : BT_TYPE_F32)) return false;
            return node->ne[0] == a->ne[0] && node->ne[1] == b->ne[0] && node->ne[2] == b->ne[1] &&
                   node->ne[3] == b->ne[2] && a->ne[2] == node->ne[2] && a->ne[3] == node->ne[3];
        case BT_OP_SET_ROWS:
            if (!a || !is_f32(b) || !is_i32(c) || !layout_ok(node)) return false;
            if (!weight_type_ok(node->type)) return false;
            return b->ne[0] == node->ne[0] && c->ne[0] == b->ne[1] && c->ne[1] == b->ne[2] &&
                   c->ne[2] == b->ne[3] && b->ne[2] == node->ne[2] && b->ne[3] == node->ne[3];
        case BT_OP_CPY:
            return cpy_well_formed(a, node);
        case BT_OP_CONT:
            return a && a->type == node->type && cpy_well_formed(a, node);
        case BT_OP_FLASH_ATTN: {
            const struct bt_tensor *v = node->src[2], *mask = node->src[3];
            if (!is_f32(node) || !bt_is_contiguous(node) || !is_f32(a) || a->nb[0] != sizeof(float)) return false;
            if (!b || !v || !attn_kv_type_ok(b->type) || !attn_kv_type_ok(v->type)) return false;
            if (!layout_ok(b) || !layout_ok(v) || b->nb[0] != bt_type_size(b->type) ||
                v->nb[0] != bt_type_size(v->type))
                return false;
            if (a->ne[3] != 1 || b->ne[3] != 1 || v->ne[3] != 1 || b->ne[0] != a->ne[0]) return false;
            if (v->ne[1] != b->ne[1] || v->ne[2] != b->ne[2] || b->ne[1] <= 0 || a->ne[1] % b->ne[1])
                return false;
            if (node->ne[0] != v->ne[0] || node->ne[1] != a->ne[1] || node->ne[2] != a->ne[2] ||
                node->ne[3] != 1)
                return false;
            if (mask && ((mask->type != BT_TYPE_F32 && mask->type != BT_TYPE_F16) ||
                         mask->ne[0] != b->ne[2] || mask->ne[1] < a->ne[2] || mask->ne[2] != 1 ||
                         mask->ne[3] != 1))
                return false;
            return !node->src[4] || sinks_ok(node->src[4], a);
        }
        case BT_OP_MUL_MAT:
        case BT_OP_MUL_MAT_ID:
            return mul_mat_well_formed(node);
        default:
            return false;
    }
}
