/* ffn.c - the feed-forward blocks (ffn.h). */
#include "ffn.h"

#include <stdio.h>

struct bt_tensor *bt_layer_name(struct bt_tensor *t, int il, const char *what) {
    if (t) {
        if (il >= 0)
            bt_format_name(t, "blk.%d.%s", il, what);
        else
            bt_set_name(t, what);
    }
    return t;
}
#define nm bt_layer_name

struct bt_tensor *bt_layer_rms_norm(bt_context *ctx, struct bt_tensor *x, struct bt_tensor *w, float eps, int il,
                                    const char *what) {
    char n[48];
    snprintf(n, sizeof n, "%s_rms", what);
    struct bt_tensor *r = nm(bt_rms_norm(ctx, x, eps), il, n);
    snprintf(n, sizeof n, "%s_norm", what);
    return nm(bt_mul(ctx, r, w), il, n);
}

/* gate, up, the activation (silu(g) * u, or gelu(g) * u with its gelu node
 * of its own), down: [d, T] */
static struct bt_tensor *mlp(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate, struct bt_tensor *up,
                             struct bt_tensor *down, int il, const char *what, bool gelu) {
    if (!cur) return NULL;
    char n[48];
    snprintf(n, sizeof n, "%s_gate", what);
    struct bt_tensor *g = nm(bt_mul_mat(ctx, gate, cur), il, n); /* [ff, T] */
    snprintf(n, sizeof n, "%s_up", what);
    struct bt_tensor *u = nm(bt_mul_mat(ctx, up, cur), il, n); /* [ff, T] */
    struct bt_tensor *a;
    if (gelu) {
        snprintf(n, sizeof n, "%s_gelu", what);
        a = nm(bt_gelu(ctx, g), il, n);
        snprintf(n, sizeof n, "%s_act", what);
        a = nm(bt_mul(ctx, a, u), il, n); /* gelu(g) * u */
    } else {
        snprintf(n, sizeof n, "%s_act", what);
        a = nm(bt_swiglu(ctx, g, u), il, n); /* silu(g) * u */
    }
    snprintf(n, sizeof n, "%s_down", what);
    return nm(bt_mul_mat(ctx, down, a), il, n); /* [d, T] */
}

struct bt_tensor *bt_ffn_mlp(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate, struct bt_tensor *up,
                             struct bt_tensor *down, int il, const char *what) {
    return mlp(ctx, cur, gate, up, down, il, what, false);
}

struct bt_tensor *bt_ffn_mlp_gelu(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate,
                                  struct bt_tensor *up, struct bt_tensor *down, int il, const char *what) {
    return mlp(ctx, cur, gate, up, down, il, what, true);
}

struct bt_tensor *bt_ffn_moe_experts(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate_exps,
                                     struct bt_tensor *up_exps, struct bt_tensor *down_exps, struct bt_tensor *ids,
                                     struct bt_tensor *weights, int il) {
    if (!cur || !ids || !weights) return NULL;
    const int64_t d = cur->ne[0], T = cur->ne[1];
    struct bt_tensor *x3 = nm(bt_reshape_3d(ctx, cur, d, 1, T), il, "ffn_moe_in");           /* [d, 1, T] */
    struct bt_tensor *g = nm(bt_mul_mat_id(ctx, gate_exps, x3, ids), il, "ffn_moe_gate");    /* [ff, K, T] */
    struct bt_tensor *u = nm(bt_mul_mat_id(ctx, up_exps, x3, ids), il, "ffn_moe_up");
    struct bt_tensor *a = nm(bt_swiglu(ctx, g, u), il, "ffn_moe_act");
    struct bt_tensor *dn = nm(bt_mul_mat_id(ctx, down_exps, a, ids), il, "ffn_moe_down");   /* [d, K, T] */
    /* weighted and summed over the slots in slot order (batch-invariant) */
    return nm(bt_moe_sum(ctx, dn, weights), il, "ffn_moe_out"); /* [d, T] */
}
