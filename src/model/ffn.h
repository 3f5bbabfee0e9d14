/* ffn.h - the feed-forward blocks of a layer's graph, shared by the
 * architectures (llm.c) and the scheduler tests' model: a SwiGLU MLP, its
 * GELU-gated form, and the
 * routed experts of a MoE layer.  Nodes are named "blk.<il>.<what>_*" and
 * "blk.<il>.ffn_moe_*". */
#ifndef BATON_FFN_H
#define BATON_FFN_H

#include "baton/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* down(silu(gate cur) * up cur): cur [d, T] -> [d, T].  NULL when cur is
 * NULL or the context is full. */
struct bt_tensor *bt_ffn_mlp(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate, struct bt_tensor *up,
                             struct bt_tensor *down, int il, const char *what);

/* down(gelu(gate cur) * up cur), GELU's tanh form (Gemma): cur [d, T] ->
 * [d, T].  NULL when cur is NULL or the context is full. */
struct bt_tensor *bt_ffn_mlp_gelu(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate,
                                  struct bt_tensor *up, struct bt_tensor *down, int il, const char *what);

/* The routed experts: sum over k of weights[k,t] * expert_{ids[k,t]}(cur[:,t])
 * with expert e = down_e(silu(gate_e x) * up_e x); cur [d, T], ids I32 [K, T],
 * weights F32 [1, K, T], the expert matrices [d, ff, E] and [ff, d, E].  The
 * outputs [d, K, T] are weighted and summed over K in slot order by one
 * MOE_SUM node (the bits of a MUL and K-1 ADDs of the slots' views). */
struct bt_tensor *bt_ffn_moe_experts(bt_context *ctx, struct bt_tensor *cur, struct bt_tensor *gate_exps,
                                     struct bt_tensor *up_exps, struct bt_tensor *down_exps, struct bt_tensor *ids,
                                     struct bt_tensor *weights, int il);

/* rms_norm(x) * w, the two nodes named "blk.IL.WHAT_rms" and
 * "blk.IL.WHAT_norm" (il < 0: without "blk.IL."); x [d, T], w [d]. */
struct bt_tensor *bt_layer_rms_norm(bt_context *ctx, struct bt_tensor *x, struct bt_tensor *w, float eps, int il,
                                    const char *what);

/* Names t "blk.IL.WHAT" (il < 0: WHAT alone), as llama.cpp names a layer's
 * nodes; t may be NULL (a failed constructor): returned as given. */
struct bt_tensor *bt_layer_name(struct bt_tensor *t, int il, const char *what);

#ifdef __cplusplus
}
#endif
#endif
