/* synth_model.h - the scheduler tests' model: an arbitrary graph of any size
 * (the library's models come from GGUF files, src/model/arch.h).  A
 * synthetic transformer with MoE feed-forward layers: its weights
 * (metadata, names, deterministic data), its forward graph for one
 * micro-batch, and the FFN variants (MLP, dense MoE, sparse top-K MoE, shared +
 * routed experts) as separate builders.
 *
 * Every process that builds a model from the same config gets the same
 * weights (names, shapes, types, order), the same graph (bt_graph_hash) and,
 * through bt_model_init_weight, the same bytes for any weight, whoever
 * generates it: the distributed runtime relies on this (each rank builds the
 * whole graph and creates data only for the weights it owns).
 *
 * Layer structure (pre-norm), x [d_model, n_tokens]:
 *   h   = x + attn(rms_norm(x) * attn_norm)
 *   out = h + ffn(rms_norm(h) * ffn_norm)
 * attention: causal multi-head self-attention, NEOX rope on q and k.
 *
 * FFN kinds (shapes for one micro-batch of T tokens, E experts, K used):
 *   MLP         down(swiglu(gate x, up x))
 *   MOE_DENSE   p = softmax(router x) [E,T]; every expert used, weight p_e
 *   MOE_TOPK    l = router x; S = top-K of l (ties: lower index first);
 *               norm_topk 1: weights = softmax over l restricted to S (the
 *               top-K probabilities renormalised to sum 1: the seed's
 *               SparseMoE, Mixtral, Qwen3-MoE; norm_topk_prob true);
 *               norm_topk 0: weights = softmax(l) at S, summing to less than 1
 *               (Qwen2-MoE, DeepSeek-V2; norm_topk_prob false)
 *   MOE_SHARED  MOE_TOPK + n_shared shared experts that every token uses,
 *               built as one MLP of width n_shared*d_ff (the sum of n_shared
 *               MLPs of width d_ff is exactly that MLP); with shared_gate its
 *               output is scaled per token by sigmoid(ffn_gate_inp_shexp . x)
 *               (Qwen2-MoE, with norm_topk 0); without it the shared part is
 *               always fully on (DeepSeek, as in the seed).
 * The routed experts' outputs [d_model, K, T] are multiplied by their weights
 * [1, K, T] and summed over K with K strided 2-d views (slot e: offset
 * e*nb[1], row stride nb[2]) and K-1 adds, so no permute + copy is needed.
 *
 * Names (GGUF / llama.cpp convention): "token_embd", "output_norm", "output",
 * "blk.N.attn_norm", "blk.N.attn_q|k|v|output", "blk.N.ffn_norm",
 * "blk.N.ffn_gate|up|down" (MLP), "blk.N.ffn_gate_inp" (router),
 * "blk.N.ffn_gate_exps|up_exps|down_exps", "blk.N.ffn_gate_shexp|up_shexp|
 * down_shexp", "blk.N.ffn_gate_inp_shexp".  Graph nodes created for layer N are
 * all named "blk.N.<what>"; nodes before layer 0 "inp_*", after the last layer
 * "result_*".
 *
 * Layer numbers (bt_model_tensor_layer): -1 = before the first layer (token
 * embeddings, graph inputs), 0..n_layers-1 = inside that layer, n_layers =
 * after the last layer (output_norm, output, result_*).
 */
#ifndef BATON_MODEL_H
#define BATON_MODEL_H

#include "baton/graph.h"
#include "baton/ops.h"
#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum bt_ffn_kind {
    BT_FFN_MLP = 0,
    BT_FFN_MOE_DENSE,
    BT_FFN_MOE_TOPK,
    BT_FFN_MOE_SHARED,
    BT_FFN_COUNT,
};
const char *bt_ffn_kind_name(enum bt_ffn_kind k); /* "mlp", "moe-dense", "moe-topk", "moe-shared" */
/* BT_OK and *k set, or BT_ERR_INVALID for an unknown name. */
int bt_ffn_kind_from_name(const char *name, enum bt_ffn_kind *k);

struct bt_model_config {
    int n_layers, d_model, n_heads, d_ff; /* head_dim = d_model / n_heads */
    int n_experts, top_k, n_shared;       /* MoE: experts, experts used per token, shared experts */
    enum bt_ffn_kind ffn;
    int shared_gate;     /* MOE_SHARED: 1 = shared output gated by a sigmoid, 0 = ungated */
    int norm_topk;       /* MOE_TOPK, MOE_SHARED: 1 = the K weights renormalised to sum 1, 0 = not */
    int n_vocab;         /* token embeddings + output projection */
    int n_tokens;        /* tokens per micro-batch */
    enum bt_type wtype;  /* type of the big matrices (F32 F16 BF16 Q8_0 Q4_0) */
    float rope_base, norm_eps;
    uint64_t seed;       /* weights and inputs */
};

/* Limits that keep every size of the model and its graph far from overflow
 * (element counts < 2^50, graph sizes < 2^31); n_heads <= d_model. */
#define BT_MODEL_MAX_LAYERS 4096
#define BT_MODEL_MAX_D_MODEL 65536
#define BT_MODEL_MAX_D_FF 262144
#define BT_MODEL_MAX_EXPERTS 1024
#define BT_MODEL_MAX_SHARED 64
#define BT_MODEL_MAX_VOCAB (1 << 22)
#define BT_MODEL_MAX_TOKENS 65536

/* Small and fast: 4 layers, d_model 64, 4 heads, d_ff 128, top-2 of 8
 * experts (MOE_TOPK, norm_topk 1), n_vocab 256, 16 tokens, F32. */
void bt_model_config_default(struct bt_model_config *c);
/* BT_OK, or BT_ERR_INVALID with one message naming the first bad field in
 * err (n bytes, may be NULL). */
int bt_model_config_check(const struct bt_model_config *c, char *err, size_t n);

/* The weights of one layer; NULL where the FFN kind has none. */
struct bt_model_layer_weights {
    struct bt_tensor *attn_norm;                        /* F32 [d_model] */
    struct bt_tensor *wq, *wk, *wv, *wo;                /* wtype [d_model, d_model] */
    struct bt_tensor *ffn_norm;                         /* F32 [d_model] */
    /* MLP */
    struct bt_tensor *ffn_gate, *ffn_up;                /* wtype [d_model, d_ff] */
    struct bt_tensor *ffn_down;                         /* wtype [d_ff, d_model] */
    /* MoE */
    struct bt_tensor *ffn_gate_inp;                     /* F32 [d_model, n_experts] (router) */
    struct bt_tensor *ffn_gate_exps, *ffn_up_exps;      /* wtype [d_model, d_ff, n_experts] */
    struct bt_tensor *ffn_down_exps;                    /* wtype [d_ff, d_model, n_experts] */
    /* shared experts (MOE_SHARED), one MLP of width n_shared*d_ff */
    struct bt_tensor *ffn_gate_shexp, *ffn_up_shexp;    /* wtype [d_model, n_shared*d_ff] */
    struct bt_tensor *ffn_down_shexp;                   /* wtype [n_shared*d_ff, d_model] */
    struct bt_tensor *ffn_gate_inp_shexp;               /* F32 [d_model, 1] (shared_gate only) */
};

/* Create layer il's weight tensors in ctx (no_alloc or not), named and
 * flagged BT_TENSOR_FLAG_WEIGHT, in a fixed order.  BT_OK, or an error with a
 * message in bt_context_error(ctx).  The config must pass the check. */
int bt_model_layer_weights_new(bt_context *ctx, const struct bt_model_config *c, int il,
                               struct bt_model_layer_weights *w);

struct bt_model;

/* Every weight's metadata in the model's own no_alloc context: token_embd,
 * then each layer's, then output_norm, output.  BT_OK and the model in *out;
 * else *out NULL, BT_ERR_INVALID (a bad config, bt_model_config_check's
 * message) or BT_ERR_NOMEM, with the message in err (n_err bytes; nothing
 * is printed: baton.h's error convention). */
enum bt_status bt_model_new(const struct bt_model_config *c, struct bt_model **out, char *err, size_t n_err);
void bt_model_free(struct bt_model *m);
const struct bt_model_config *bt_model_get_config(const struct bt_model *m);
/* The no_alloc context that holds the weights (to allocate them all at once
 * with bt_alloc_ctx_tensors, for example). */
bt_context *bt_model_context(const struct bt_model *m);
int bt_model_n_weights(const struct bt_model *m);
struct bt_tensor *bt_model_weight(const struct bt_model *m, int i);
/* NULL when no weight has that name. */
struct bt_tensor *bt_model_weight_by_name(const struct bt_model *m, const char *name);
const struct bt_model_layer_weights *bt_model_layer(const struct bt_model *m, int il);

/* Layer of a tensor from its name (see the convention at the top):
 * "blk.N." -> N; "output*", "result*" -> n_layers; anything else -> -1. */
int bt_model_name_layer(const char *name, int n_layers);
int bt_model_tensor_layer(const struct bt_model *m, const struct bt_tensor *t);

/* Deterministic data for weight w from (seed, w's name): element i (logical
 * order) is drawn from splitmix64(seed ^ fnv1a(name) ^ i*golden): uniform in
 * [-s, s) with s = 1/sqrt(ne0) (ne0 = fan in) for matrices, s = 1 for
 * token_embd, and in [0.875, 1.125) for norm weights ("*_norm"); generated in
 * F32 with exact arithmetic (the same bits on every machine), converted with
 * bt_row_from_f32 and written with bt_tensor_set (w must have data, in any
 * buffer). */
void bt_model_fill_weight(uint64_t seed, struct bt_tensor *w);
void bt_model_init_weight(const struct bt_model *m, struct bt_tensor *w);
/* Initialise every weight that has data (those another process owns are
 * skipped). */
void bt_model_init_weights(const struct bt_model *m);

/* ---- graph builders ---- */

/* cur [d_model, T] (already normalised) -> [d_model, T].  Nodes are named
 * "blk.<il>.ffn_*".  NULL with a message in bt_context_error(ctx) on failure. */
struct bt_tensor *bt_model_ffn(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *cur,
                               const struct bt_model_layer_weights *w, int il);
/* The routing of a MoE layer: cur [d_model, T] -> ids I32 [K, T] (experts
 * used per token, K = n_experts for MOE_DENSE) and weights F32 [1, K, T]. */
int bt_model_moe_route(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *cur,
                       const struct bt_model_layer_weights *w, int il, struct bt_tensor **ids,
                       struct bt_tensor **weights);
/* The routed experts: sum over k of weights[k,t] * expert_{ids[k,t]}(cur[:,t]). */
struct bt_tensor *bt_model_moe_experts(bt_context *ctx, struct bt_tensor *cur,
                                       const struct bt_model_layer_weights *w, struct bt_tensor *ids,
                                       struct bt_tensor *weights, int il);
/* x [d_model, T] -> x + attn(...) + ffn(...), every node "blk.<il>.*". */
struct bt_tensor *bt_model_layer_forward(bt_context *ctx, const struct bt_model_config *c, struct bt_tensor *x,
                                         const struct bt_model_layer_weights *w, int il,
                                         struct bt_tensor *pos, struct bt_tensor *mask);

struct bt_model_graph {
    struct bt_graph *graph;
    struct bt_tensor *tokens; /* I32 [n_tokens], input */
    struct bt_tensor *pos;    /* I32 [n_tokens], input */
    struct bt_tensor *mask;   /* F32 [n_tokens, n_tokens], 0 / -INFINITY (causal), input */
    struct bt_tensor *logits; /* F32 [n_vocab, n_tokens], output */
};

/* The forward graph of one micro-batch in ctx (no_alloc or not; when not, the
 * weights must have data already).  BT_OK, or an error (BT_ERR_NOMEM when ctx
 * is too small, ...) with a message in bt_context_error(ctx). */
int bt_model_build_graph(const struct bt_model *m, bt_context *ctx, struct bt_model_graph *out);
/* Nodes (and leafs) the graph can hold, and the bytes of metadata a no_alloc
 * context needs for bt_model_build_graph (an upper bound). */
int bt_model_graph_size(const struct bt_model_config *c);
size_t bt_model_graph_ctx_size(const struct bt_model_config *c);

/* Inputs of micro-batch k: tokens from (seed, k), positions 0..n-1, causal
 * mask; written with bt_tensor_set into the inputs that have data. */
void bt_model_set_inputs(const struct bt_model *m, const struct bt_model_graph *g, int k);
/* The same inputs through set(user, input, data, bytes) for each of them:
 * a distributed run passes bt_dist_set_input_fn and its bt_dist on every
 * rank (each rank sets the inputs it reads).  The first failing status. */
typedef enum bt_status (*bt_model_input_fn)(void *user, struct bt_tensor *input, const void *data, size_t size);
enum bt_status bt_model_set_inputs_with(const struct bt_model *m, const struct bt_model_graph *g, int k,
                                        bt_model_input_fn set, void *user);
/* Token i of micro-batch k (what bt_model_set_inputs writes). */
int32_t bt_model_input_token(const struct bt_model_config *c, int k, int i);

/* Matrix-product FLOPs (2 per multiply-add) of one layer for one micro-batch
 * (attention projections, kq, kqv, router and the experts a token uses;
 * element-wise ops not counted), and the bytes of one layer's weights. */
double bt_model_layer_flops(const struct bt_model_config *c);
size_t bt_model_layer_weight_bytes(const struct bt_model_config *c);
/* All weights: layers + token_embd + output_norm + output. */
size_t bt_model_weight_bytes(const struct bt_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
