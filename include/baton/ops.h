/* ops.h - op constructors: each builds a result tensor with its shape, type,
 * sources and op_params; nothing is computed here (backends compute).
 *
 * A shape or type error a caller can make returns NULL and leaves a message in
 * bt_context_error(ctx).  Given a NULL source, a constructor returns NULL and
 * keeps the earlier message.
 *
 * Semantics (a backend implements exactly these; "F32" means the type of the
 * data the kernels read and write):
 *
 *  ADD/SUB/MUL/DIV(a, b)  a F32, b F32; b->ne[i] == a->ne[i] or 1 (broadcast);
 *                         result F32 contiguous, shape of a.  Any strides.
 *  SCALE(a, s)            a*s; op_params f32[0] = s.
 *  SQR, SQRT              element-wise, shape of a.
 *  SUM_ROWS(a)            [n0,n1,n2,n3] -> [1,n1,n2,n3], sum over dim 0.
 *  MEAN(a)                as SUM_ROWS divided by n0.
 *  MUL_MAT(a, b)          a [k,m,a2,a3] of any type with contiguous rows,
 *                         b F32 [k,n,b2,b3] with nb[0] == 4, b2 % a2 == 0,
 *                         b3 % a3 == 0 -> F32 [m,n,b2,b3];
 *                         out[i,j,i2,i3] = dot(a row i of (i2/(b2/a2), i3/(b3/a3)),
 *                                             b column j of (i2,i3)).
 *  MUL_MAT_ID(as, b, ids) as [k,m,n_expert] (contiguous rows), b F32
 *                         [k,n_b,n_tokens] with n_b 1 or n_used, ids I32
 *                         [n_used,n_tokens] -> F32 [m,n_used,n_tokens];
 *                         out[:,e,t] = as[:,:,ids[e,t]] x b[:, e % n_b, t].
 *                         An id outside [0,n_expert) is a run-time error.
 *  GET_ROWS(a, ids)       a [n0,n1,n2,n3] any type, ids I32 [nr,n2,n3]
 *                         -> [n0,nr,n2,n3] F32 (I32 when a is I32);
 *                         out[:,i,i2,i3] = a[:, ids[i,i2,i3], i2, i3].
 *  SET_ROWS(a, b, ids)    a [n0,n1,n2,n3] destination (F32, F16, BF16, Q8_0,
 *                         Q4_0), b F32 [n0,nr,n2,n3], ids I32 [nr,n2,n3];
 *                         a[:, ids[i,i2,i3], i2, i3] = b[:,i,i2,i3] converted.
 *                         The result is a view of a (writes into a).
 *  CPY(a, b)              copy a into b with type conversion; same element
 *                         count; elements in logical (i0 fastest) order; any
 *                         strides.  Result: a view of b.
 *  CONT(a)                contiguous copy of a (same type and shape).
 *  VIEW                   op_params: none; ne/nb/view_offs describe it.
 *  RESHAPE, PERMUTE,      views; PERMUTE op_params i32[0..3] = axes (result
 *  TRANSPOSE              dim axis[i] is a's dim i).
 *  RMS_NORM(a, eps)       along dim 0: x / sqrt(mean(x^2) + eps); f32[0] = eps.
 *  NORM(a, eps)           along dim 0: (x - mean) / sqrt(var + eps).
 *  SOFT_MAX(a, mask, s)   along dim 0: softmax(a*s + mask); mask optional, F32
 *                         [n0, >=n1] broadcast over dims 2 and 3 (mask row i1
 *                         used for a's row i1); f32[0] = s.
 *  ROPE(a, pos, ...)      a F32 [d, n_head, n_tokens, 1], pos I32 [n_tokens];
 *                         i32[0] = n_dims (even, <= d), i32[1] = mode,
 *                         f32[2] = freq_base, f32[3] = freq_scale.
 *                         theta_i = pos*freq_scale*base^(-2i/n_dims), i < n_dims/2;
 *                         with YaRN (bt_rope_ext, ggml's rope_yarn): f32[4]
 *                         ext_factor, f32[5] attn_factor, f32[6] beta_fast,
 *                         f32[7] beta_slow, i32[8] n_ctx_orig; theta_i mixes
 *                         the interpolated (pos*freq_scale*b_i) and the
 *                         extrapolated (pos*b_i) angle by ext_factor times a
 *                         ramp over the dims between the correction dims,
 *                         and cos/sin are scaled by attn_factor (times
 *                         1 + 0.1 ln(1/freq_scale) when ext_factor != 0);
 *                         NORMAL rotates pairs (2i, 2i+1), NEOX pairs
 *                         (i, i + n_dims/2); dims >= n_dims pass through.
 *  SILU, GELU (tanh form), RELU, SIGMOID   element-wise.
 *  SWIGLU(a, b)           silu(a) * b, same shapes.
 *  ARGSORT(a, order)      along dim 0 -> I32 of a's shape; i32[0] = order;
 *                         ties keep the lower index first (stable).
 *  TOP_K(a, k)            view [k, n1, n2, n3] of ARGSORT(a, DESC).
 *  CONCAT(a, b, dim)      same type; shapes equal except along dim;
 *                         i32[0] = dim.
 *  FLASH_ATTN(q, k, v, mask, s)
 *                         fused attention (ggml's flash_attn_ext):
 *                         q F32 [D, H, T, 1] (nb[0] == 4), k [D, Hk, N, 1] and
 *                         v [Dv, Hk, N, 1] of type F32, F16 or Q8_0 with packed
 *                         rows (nb[0] == type size; block types: D, Dv
 *                         multiples of the block), H % Hk == 0 (grouped-query
 *                         heads: q head h reads k/v head h / (H/Hk)), mask
 *                         F32 or F16 [N, >= T] or NULL; result F32
 *                         [Dv, H, T, 1] contiguous;
 *                         out[:,h,t] = sum_j p_j v[:,h',j] with
 *                         p = softmax_j(s * q[:,h,t].k[:,h',j] + mask[j,t]).
 *                         f32[0] = s.  A cell whose mask is -inf takes no part
 *                         at all (not even in the running maximum); a row
 *                         with every cell masked is 0.  The softmax is online
 *                         (one pass over the cells, no [N, T] scores held).
 *                         src[4] = sinks (bt_flash_attn_ext), F32 [H]
 *                         contiguous or NULL: head h's softmax has one more
 *                         logit, sinks[h] (not scaled, not masked), that
 *                         takes its share of the probability and adds no v:
 *                         p_j = e^(z_j) / (e^(sinks[h]) + sum_j' e^(z_j'))
 *                         (gpt-oss's attention sinks; ggml's
 *                         flash_attn_ext_add_sinks).  A row with every cell
 *                         masked is still 0.
 *  SWIGLU_OAI(a, b, alpha, limit)
 *                         gpt-oss's clamped SwiGLU (ggml's swiglu_oai), same
 *                         shapes, f32[0] = alpha, f32[1] = limit:
 *                         x = min(a, limit), y = clamp(b, -limit, limit),
 *                         out = x * sigmoid(alpha * x) * (y + 1).
 *  MOE_SUM(a, w)          a MoE layer's expert results weighted and summed:
 *                         a F32 [n, K, T, 1] (nb[0] == 4), w F32 [1, K, T, 1]
 *                         -> F32 [n, T, 1, 1] contiguous;
 *                         out[:,t] = (..((a[:,0,t]*w[0,t]) + a[:,1,t]*w[1,t])
 *                         + ..) + a[:,K-1,t]*w[K-1,t], each product rounded
 *                         to F32 before it is added: the bits of MUL(a, w)
 *                         followed by ADDs of its K slots in slot order, in
 *                         one pass over a.
 */
#ifndef BATON_OPS_H
#define BATON_OPS_H

#include <math.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum bt_rope_mode {
    BT_ROPE_NORMAL = 0,
    BT_ROPE_NEOX = 2,
};

enum bt_sort_order {
    BT_SORT_ASC = 0,
    BT_SORT_DESC = 1,
};

BT_API struct bt_tensor *bt_add(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_sub(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_mul(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_div(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_scale(bt_context *ctx, struct bt_tensor *a, float s);
BT_API struct bt_tensor *bt_sqr(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_sqrt(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_sum_rows(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_mean(bt_context *ctx, struct bt_tensor *a);

BT_API struct bt_tensor *bt_mul_mat(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_mul_mat_id(bt_context *ctx, struct bt_tensor *as, struct bt_tensor *b,
                                struct bt_tensor *ids);

BT_API struct bt_tensor *bt_get_rows(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *ids);
BT_API struct bt_tensor *bt_set_rows(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b,
                              struct bt_tensor *ids);
BT_API struct bt_tensor *bt_cpy(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_cont(bt_context *ctx, struct bt_tensor *a);

BT_API struct bt_tensor *bt_view_1d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, size_t offset);
BT_API struct bt_tensor *bt_view_2d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                             size_t nb1, size_t offset);
BT_API struct bt_tensor *bt_view_3d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, size_t nb1, size_t nb2, size_t offset);
BT_API struct bt_tensor *bt_view_4d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                             int64_t ne2, int64_t ne3, size_t nb1, size_t nb2, size_t nb3,
                             size_t offset);
/* A view of the whole of a (same shape and strides). */
BT_API struct bt_tensor *bt_view_tensor(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_reshape_1d(bt_context *ctx, struct bt_tensor *a, int64_t ne0);
BT_API struct bt_tensor *bt_reshape_2d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1);
BT_API struct bt_tensor *bt_reshape_3d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2);
BT_API struct bt_tensor *bt_reshape_4d(bt_context *ctx, struct bt_tensor *a, int64_t ne0, int64_t ne1,
                                int64_t ne2, int64_t ne3);
BT_API struct bt_tensor *bt_permute(bt_context *ctx, struct bt_tensor *a, int axis0, int axis1, int axis2,
                             int axis3);
BT_API struct bt_tensor *bt_transpose(bt_context *ctx, struct bt_tensor *a);

BT_API struct bt_tensor *bt_rms_norm(bt_context *ctx, struct bt_tensor *a, float eps);
BT_API struct bt_tensor *bt_norm(bt_context *ctx, struct bt_tensor *a, float eps);
BT_API struct bt_tensor *bt_soft_max(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_soft_max_ext(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *mask,
                                  float scale);
BT_API struct bt_tensor *bt_rope(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *pos, int n_dims,
                          int mode, float freq_base, float freq_scale);
/* YaRN's context extension (ggml_rope_ext's last five parameters) */
struct bt_rope_yarn {
    float ext_factor;  /* 0: no ramp (plain scaled rope) */
    float attn_factor; /* cos/sin scale (mscale); 1: none */
    float beta_fast, beta_slow;
    int n_ctx_orig; /* the training context the correction dims are computed for */
};
/* ROPE with YaRN; yarn NULL is bt_rope (the same bits). */
BT_API struct bt_tensor *bt_rope_ext(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *pos, int n_dims,
                              int mode, float freq_base, float freq_scale, const struct bt_rope_yarn *yarn);
#ifdef __CUDACC__
#define BT_ROPE_FN static inline __host__ __device__
#else
#define BT_ROPE_FN static inline
#endif
/* YaRN (ggml's rope_yarn) in parts: pair i's frequency, the mix of its
 * extrapolated angle by the ramp over the correction dims, and the cos/sin
 * scale depend on no position (a caller may compute them once a call);
 * bt_rope_yarn_cs then gives cos and sin of pair i at position ps.  One
 * definition for every backend. */
BT_ROPE_FN float bt_rope_yarn_freq(int i, int n_dims, float freq_base) {
    return powf(freq_base, -2.0f * (float)i / (float)n_dims);
}
BT_ROPE_FN float bt_rope_yarn_mix(int i, float ext_factor, const float corr[2]) {
    float y = ((float)i - corr[0]) / fmaxf(0.001f, corr[1] - corr[0]);
    y = fminf(1.0f, fmaxf(0.0f, y));
    return (1.0f - y) * ext_factor;
}
BT_ROPE_FN float bt_rope_yarn_mscale(float freq_scale, float attn_factor) {
    return attn_factor * (1.0f + 0.1f * logf(1.0f / freq_scale));
}
BT_ROPE_FN void bt_rope_yarn_cs(int32_t ps, float freq, float freq_scale, float mix, float mscale, float *c,
                                float *s) {
    const float theta_extrap = (float)ps * freq;
    const float theta_interp = freq_scale * theta_extrap;
    const float theta = theta_interp * (1.0f - mix) + theta_extrap * mix;
    *c = cosf(theta) * mscale;
    *s = sinf(theta) * mscale;
}
/* cos and sin of pair i at position ps with YaRN: the parts above at once */
BT_ROPE_FN void bt_rope_yarn_angle(int32_t ps, int i, int n_dims, float freq_base, float freq_scale,
                                   float ext_factor, float attn_factor, const float corr[2], float *c, float *s) {
    bt_rope_yarn_cs(ps, bt_rope_yarn_freq(i, n_dims, freq_base), freq_scale, bt_rope_yarn_mix(i, ext_factor, corr),
                    bt_rope_yarn_mscale(freq_scale, attn_factor), c, s);
}
#undef BT_ROPE_FN
/* ggml_rope_yarn_corr_dims: the first and last rotated pair the ramp spans */
BT_API void bt_rope_yarn_corr_dims(int n_dims, int n_ctx_orig, float freq_base, float beta_fast, float beta_slow,
                            float dims[2]);

BT_API struct bt_tensor *bt_silu(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_gelu(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_relu(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_sigmoid(bt_context *ctx, struct bt_tensor *a);
BT_API struct bt_tensor *bt_swiglu(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b);
BT_API struct bt_tensor *bt_swiglu_oai(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b, float alpha,
                                float limit);

/* MOE_SUM as documented above: a [n, K, T], w [1, K, T] -> [n, T] */
BT_API struct bt_tensor *bt_moe_sum(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *w);

BT_API struct bt_tensor *bt_argsort(bt_context *ctx, struct bt_tensor *a, enum bt_sort_order order);
BT_API struct bt_tensor *bt_top_k(bt_context *ctx, struct bt_tensor *a, int k);
BT_API struct bt_tensor *bt_concat(bt_context *ctx, struct bt_tensor *a, struct bt_tensor *b, int dim);
/* FLASH_ATTN as documented above; mask may be NULL. */
BT_API struct bt_tensor *bt_flash_attn(bt_context *ctx, struct bt_tensor *q, struct bt_tensor *k,
                                struct bt_tensor *v, struct bt_tensor *mask, float scale);
/* The same with attention sinks (F32 [H], one per q head; NULL: none). */
BT_API struct bt_tensor *bt_flash_attn_ext(bt_context *ctx, struct bt_tensor *q, struct bt_tensor *k,
                                    struct bt_tensor *v, struct bt_tensor *mask, struct bt_tensor *sinks,
                                    float scale);

/* Is node a well-formed instance of its op as documented above (types,
 * shapes, op params)?  Backends add their own limits on top. */
BT_API bool bt_op_is_well_formed(const struct bt_tensor *node);

/* The element-wise ops: element i of the result depends only on element i
 * of each source (a binary op's second source broadcast), so a kernel reads
 * element i before it writes it and the result may take a source's memory.
 * The one list: op checks, the allocator's in-place rule and the backends'
 * dispatch all ask here. */
enum bt_elementwise {
    BT_ELEMENTWISE_NONE = 0, /* not element-wise */
    BT_ELEMENTWISE_UNARY,    /* f(a[i]) (SCALE with its op param) */
    BT_ELEMENTWISE_BINARY,   /* a[i] op b[i mod b's shape] */
    BT_ELEMENTWISE_GLU,      /* f(a[i]) * b[i], a and b the same shape */
};
BT_API enum bt_elementwise bt_op_elementwise(enum bt_op op);

#ifdef __cplusplus
}
#endif
#endif
