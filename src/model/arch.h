/* arch.h - llama-family models from GGUF files: the architectures (one table
 * entry each), their hyperparameters, weights for a range of layers, and the
 * forward pass of a batch of tokens of several sequences over a KV cache.
 *
 * Architectures (general.architecture) and how their layer differs from the
 * shared pre-norm block  x += attn(rms(x)); x += ffn(rms(x)):
 *   llama     rope NORMAL (pairs 2i, 2i+1); dense SwiGLU, or Mixtral MoE when
 *             llama.expert_count > 0 (softmax over the experts, top-k,
 *             weights renormalised over the k)
 *   qwen2     rope NEOX (pairs i, i + d/2); q/k/v biases
 *   qwen3     rope NEOX; per-head RMSNorm of q and k (attn_q_norm [head_dim])
 *   qwen2moe  rope NEOX; q/k/v biases; MoE, top-k weights not renormalised,
 *             plus a shared expert scaled by sigmoid(ffn_gate_inp_shexp . x)
 *   qwen3moe  rope NEOX; per-head q/k RMSNorm; MoE renormalised
 *   olmoe     rope NEOX; RMSNorm of the whole q and k (attn_q_norm [n_embd]);
 *             MoE not renormalised
 *   gemma3    rope NEOX; embeddings times sqrt(n_embd); per-head q/k
 *             RMSNorm; the attention's and the FFN's outputs RMS-normed
 *             (post_attention_norm, post_ffw_norm [n_embd]) before their
 *             residual adds; FFN gelu(gate) * up (tanh GELU); sliding-window
 *             layers (gemma3.attention.sliding_window tokens; every layer but
 *             each sliding_window_pattern-th, default 6) with rope base
 *             rope.freq_base_swa (default 10000) unscaled, the others the
 *             file's base and scaling; attention scale 1/sqrt(head_dim)
 *             (1/sqrt(n_embd/n_head) for the 62-layer 27B, as llama.cpp);
 *             final_logit_softcapping refused.  The converter has already
 *             added Gemma's 1 to the norm weights: they are used as they are.
 *   deepseek2 DeepSeek-V2/V3 (and their lite forms): rope NORMAL on the
 *             rope part of each head only; multi-head latent attention
 *             (below); the first leading_dense_block_count layers dense
 *             SwiGLU, the others MoE with softmax or sigmoid gating
 *             (expert_gating_func 1, 2), a selection bias exp_probs_b added
 *             for choosing only, the weights renormalised when
 *             expert_weights_norm and times expert_weights_scale, plus
 *             expert_shared_count ungated shared experts
 *             (ffn_*_shexp, n_ff_exp * count wide); with
 *             expert_group_count G > 1 the experts are chosen among the
 *             expert_group_used_count groups (of E/G consecutive experts)
 *             whose two best selection scores add up highest (V3's routing,
 *             llama.cpp's for every such file); rope scaling none,
 *             linear or yarn (YaRN with DeepSeek's attention scale).
 *
 * Multi-head latent attention (deepseek2), llama.cpp's absorbed form: with
 * R = kv_lora_rank, r = rope.dimension_count, n = key_length_mla - r (the
 * unroped part of a head), dv = value_length_mla:
 *   q      = Wq cur, or Wq_b(rms(Wq_a cur) * q_a_norm) when q_lora_rank > 0:
 *            [n + r, H, T]
 *   c, kr  = Wkv_a cur split: c [R, T] (the latent), kr [r, T] (one rope
 *            key shared by the heads); c = rms(c) * kv_a_norm
 *   Q      = [Wk_b^T q_nope ; rope(q_rope)]  [R + r, H, T] (per head h:
 *            attn_k_b [n, R, H]'s slice h applied to q_nope)
 *   K      = [c ; rope(kr)] [R + r, 1, T],  V = c [R, 1, T]: one KV head,
 *            cached as such (attention.key_length R + r, value_length R,
 *            head_count_kv 1)
 *   a      = attn(Q, K, V) [R, H, T] with scale 1/sqrt(n + r); per head h
 *            o_h = attn_v_b[:, :, h] a_h  [dv], then Wo [H*dv -> d].
 * Files with the older attn_kv_b (no key_length_mla) are refused: the
 * converter of today splits it into attn_k_b and attn_v_b.
 *   gpt-oss   its own layer builder (gpt_oss.c): rope NEOX with YaRN; q/k/v
 *             and output biases; attention sinks (attn_sinks [H]); every
 *             sliding_window_pattern-th layer global (default 2: the even
 *             layers slide), the others see gpt-oss.attention.sliding_window
 *             tokens; post_attention_norm is the FFN's pre-norm; MoE with a
 *             router bias, top-k of the logits, softmax over the k, expert
 *             biases (ffn_*_exps.bias [n, E]) and the clamped SwiGLU
 *             (SWIGLU_OAI: alpha 1.702, limit 7).
 *   glm4moe   GLM-4.5 / 4.6, its keys and tensors in glm4moe.c, the shared
 *             layers: rope NEOX over the first rope.dimension_count of each
 *             head; q/k/v biases; per-head q/k RMSNorm where the file has
 *             attn_q_norm / attn_k_norm; post_attention_norm is the FFN's
 *             pre-norm; deepseek2's leading dense layers, routing (sigmoid
 *             when expert_gating_func is absent, exp_probs_b required) and
 *             ungated shared experts; block_count counts the
 *             nextn_predict_layers at the end, which are not the model's
 *             (their tensors stay in the file, unloaded).
 *   minimax-m2 MiniMax-M2 / M2.1, its keys and tensors in minimax_m2.c, the
 *             shared layers: rope NEOX over the first rope.dimension_count
 *             of each head; RMSNorm of the whole q and k (olmoe's
 *             attn_q_norm [H*hd], attn_k_norm [Hk*hd]); every layer MoE,
 *             gating by expert_gating_func (required; MiniMax's sigmoid), a
 *             selection bias exp_probs_b (required), the weights always
 *             renormalised and unscaled, no shared expert; the experts
 *             feed_forward_length wide (= expert_feed_forward_length);
 *             output.weight required.
 * q/k/v biases (attn_q.bias ...) are used by any architecture when present.
 * Tied output: output.weight absent -> token_embd is the output projection.
 *
 * Tensor names and shapes (llama.cpp's; ne[0] first): token_embd [n_embd,
 * n_vocab], output_norm [n_embd], output [n_embd, n_vocab], blk.N.attn_norm
 * [n_embd], attn_q [n_embd, H*hd], attn_k/attn_v [n_embd, Hkv*hd],
 * attn_output [H*hd, n_embd], ffn_norm [n_embd], ffn_gate/up [n_embd, n_ff],
 * ffn_down [n_ff, n_embd], ffn_gate_inp [n_embd, E], ffn_gate_exps/up_exps
 * [n_embd, n_ff_exp, E], ffn_down_exps [n_ff_exp, n_embd, E],
 * ffn_gate_shexp/up_shexp [n_embd, n_ff_sh], ffn_down_shexp [n_ff_sh, n_embd],
 * ffn_gate_inp_shexp [n_embd].  Vectors (norms, biases) must be F32.
 *
 * Layer ranges: a model is loaded for layers [il0, il1) of n_layer.  The
 * first range (il0 == 0) also holds token_embd and turns tokens into
 * embeddings; the last (il1 == n_layer) holds output_norm/output and makes
 * logits.  Every tensor of the file is checked (names, shapes, types) before
 * anything is allocated, whatever the range, so every rank of a distributed
 * run refuses a bad file the same way; only the range's tensors are read.
 */
#ifndef BATON_ARCH_H
#define BATON_ARCH_H

#include "baton/backend.h"
#include "baton/sched.h"
#include "../gguf.h"
#include "baton/graph.h"
#include "../kv.h"
#include "baton/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How one architecture's layer is built from the shared blocks. */
struct bt_arch {
    const char *name;    /* general.architecture */
    int rope_mode;       /* BT_ROPE_NORMAL or BT_ROPE_NEOX */
    bool qk_norm_head;   /* RMSNorm of each q/k head (attn_q_norm [head_dim]) */
    bool qk_norm_full;   /* RMSNorm of the whole q/k (attn_q_norm [n_embd]) */
    int moe;             /* 0 dense, 1 MoE required, 2 MoE when expert_count > 0 */
    bool moe_norm_w;     /* renormalise the top-k weights */
    bool shared_expert;  /* ffn_*_shexp gated by ffn_gate_inp_shexp */
    bool post_norm;      /* post_attention_norm, post_ffw_norm on the branches' outputs */
    bool embd_scale;     /* embeddings times sqrt(n_embd) */
    bool gelu;           /* FFN gelu(gate) * up, else silu(gate) * up */
    bool swa;            /* sliding-window layers when the file has attention.sliding_window */
    bool mla;            /* multi-head latent attention, leading dense layers, DeepSeek's routing */
};
/* NULL when baton does not know the architecture. */
const struct bt_arch *bt_arch_find(const char *name);
/* "llama, qwen2, ..." */
const char *bt_arch_names(void);

struct bt_hparams {
    int n_layer;
    int64_t n_embd, n_head, n_head_kv, head_dim, head_dim_v;
    int64_t n_ff, n_vocab;
    int64_t n_ctx_train; /* <arch>.context_length: the positions trained on; 0 when the file does not say */
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int n_rot;                       /* rope dimensions */
    float rope_base, rope_freq_scale; /* freq_scale = 1 / linear scaling factor */
    struct bt_rope_yarn rope_yarn;    /* YaRN (deepseek2, gpt-oss): ggml_rope_ext's parameters; ext_factor 0: none */
    float norm_eps;
    bool tied_output;
    float attn_scale;                 /* of q.k: 1/sqrt(head_dim) but where the architecture says */
    int64_t n_swa;                    /* sliding window in tokens; 0: none */
    int swa_pattern;                  /* which layers slide: bt_kv_swa_layer(n_swa, swa_pattern, il) */
    float rope_base_swa, rope_freq_scale_swa; /* the sliding layers' rope */
    bool moe_norm_w;                  /* renormalise the top-k weights */
    /* deepseek2 (mla): q_lora_rank (0: q = Wq cur), kv_lora_rank, a head's
     * query/key length (nope + rope) and value length before absorption */
    int64_t n_lora_q, n_lora_kv, head_dim_mla, head_dim_v_mla;
    int n_layer_dense_lead;           /* the first layers are dense, the rest MoE */
    int64_t n_expert_shared;          /* shared experts: ffn_*_shexp n_ff_exp * this wide */
    bool moe_sigmoid;                 /* gating sigmoid(logits), else softmax */
    bool kv_v_in_k;                   /* the cache's V is the head of K's rows (kv.h): MLA's latent */
    int64_t n_group, n_group_used;    /* experts chosen within the n_group_used best of n_group groups (1: all) */
    float moe_w_scale;                /* the routed weights times this (1: none) */
};
/* Is layer il a MoE layer (else dense)? */
bool bt_hparams_layer_moe(const struct bt_hparams *h, int il);

struct bt_llm_layer {
    struct bt_tensor *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *q_norm, *k_norm;
    struct bt_tensor *attn_post_norm, *ffn_post_norm;
    struct bt_tensor *ffn_norm, *ffn_gate, *ffn_up, *ffn_down;
    struct bt_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
    struct bt_tensor *ffn_gate_shexp, *ffn_up_shexp, *ffn_down_shexp, *ffn_gate_inp_shexp;
    /* deepseek2: MLA's projections and norms, the routing's selection bias */
    struct bt_tensor *wq_a, *q_a_norm, *wq_b, *wkv_a_mqa, *kv_a_norm, *wk_b, *wv_b;
    struct bt_tensor *ffn_exp_probs_b;
    /* gpt-oss: attention sinks [H], the output's bias [n_embd], the
     * router's [E] and the experts' ([n_ff_exp, E], [n_embd, E]) */
    struct bt_tensor *attn_sinks, *bo, *ffn_gate_inp_b, *ffn_gate_exps_b, *ffn_up_exps_b, *ffn_down_exps_b;
};

struct bt_llm;

/* Open path, check it (architecture, hyperparameters, every tensor) and load
 * the weights of layers [il0, il1) (il1 < 0: all) into host memory.  BT_OK
 * and *out, or an error with one message in err naming the file and the key
 * or tensor (with the expected shape). */
enum bt_status bt_llm_load(const char *path, int il0, int il1, struct bt_llm **out, char *err, size_t n_err);
/* The same from a file the caller opened (and keeps open while the model
 * lives).  The weights are copied into one buffer of buft (NULL: host memory,
 * on huge pages; a device's buffer type uploads them), and the file's pages
 * they came from leave the process's memory.  in_place: CPU weights whose
 * bytes in the mapping are aligned are used there in place, not copied (less
 * memory while loading, a faster start; a slower decode on 4 KiB pages).
 * buft a backend's weight buffer type (bt_backend_get_weight_buffer_type;
 * only for a model that backend alone computes with): the CPU's repacks the
 * weight matrices for its matmul where their type and shape allow (the same
 * results, a faster decode); every matrix of the architectures is read only
 * by matmuls and GET_ROWS, which read repacked weights. */
enum bt_status bt_llm_load_gguf(struct bt_gguf *g, int il0, int il1, bt_buffer_type_t buft, bool in_place,
                                struct bt_llm **out, char *err, size_t n_err);
/* The whole model (every layer) as tensors without memory: the graph a plan
 * is made for (bt_model_plan).  Checked as bt_llm_load checks; nothing is
 * read but the file's metadata. */
enum bt_status bt_llm_describe_gguf(struct bt_gguf *g, struct bt_llm **out, char *err, size_t n_err);
/* Every check bt_llm_load makes (architecture, hyperparameters, every
 * tensor's name, shape and type) without allocating any weight; the
 * architecture and hyperparameters into *arch, *h. */
enum bt_status bt_llm_check_gguf(struct bt_gguf *g, const struct bt_arch **arch, struct bt_hparams *h, char *err,
                                 size_t n_err);
/* Bytes of the file's weights of layer l: 0 .. n_layer-1 a layer's, -1 what
 * the first range holds besides its layers (token_embd), n_layer what the last
 * range holds (output_norm, output, or token_embd when tied). */
uint64_t bt_llm_part_bytes(struct bt_gguf *g, const struct bt_hparams *h, int l);
void bt_llm_free(struct bt_llm *m);
const struct bt_hparams *bt_llm_hparams(const struct bt_llm *m);
void bt_llm_range(const struct bt_llm *m, int *il0, int *il1);
const struct bt_llm_layer *bt_llm_layer(const struct bt_llm *m, int il);
/* Bytes of the weights held (copied or used in place in the file's mapping). */
size_t bt_llm_weight_bytes(const struct bt_llm *m);

/* KV cache config for this model's range, ubatches of at most n_ubatch
 * tokens (the sliding layers' ring: kv.h). */
void bt_llm_kv_config(const struct bt_llm *m, int64_t n_ctx, int n_seq_max, int64_t n_ubatch, enum bt_type type,
                      struct bt_kv_config *c);
/* The same from the hyperparameters, for layers [il0, il1). */
void bt_hparams_kv_config(const struct bt_hparams *h, int il0, int il1, int64_t n_ctx, int n_seq_max, int64_t n_ubatch,
                          enum bt_type type, struct bt_kv_config *c);

/* ---- one ubatch's graph (a static shape: T tokens, n_kv cells, n_out rows
 * of logits) ---- */
/* What the rows asked for of the last range are: logits (the output
 * projection's, n_vocab floats each), or the hidden state after the output
 * norm (n_embd floats each, for embeddings). */
enum bt_llm_out { BT_LLM_OUT_LOGITS = 0, BT_LLM_OUT_EMBD = 1 };

struct bt_llm_graph {
    struct bt_graph *graph;
    int64_t n_tokens, n_kv, n_out;
    enum bt_llm_out out_kind;
    /* inputs: tokens I32 [T] (first range) or x F32 [n_embd, T] (others) */
    struct bt_tensor *tokens, *inp_x;
    struct bt_tensor *pos;   /* I32 [T] */
    struct bt_tensor *cells; /* I32 [T]: the cache cells the new K/V go to */
    struct bt_tensor *mask;  /* F32 [n_kv, T] */
    /* sliding layers in the range: their cells I32 [T] and mask F32
     * [n_kv_swa, T] (bt_kv_swa_n_kv); NULL without */
    struct bt_tensor *cells_swa, *mask_swa;
    int64_t n_kv_swa;
    struct bt_tensor *out_ids; /* I32 [n_out] (last range, n_out > 0): rows that need logits */
    /* output: logits F32 [n_vocab, n_out] (last range, n_out > 0; with
     * BT_LLM_OUT_EMBD the normed hidden states F32 [n_embd, n_out]) or x F32
     * [n_embd, T] (others; the last range with n_out 0 has no output
     * projection, its x is not read) */
    struct bt_tensor *out;
};
/* Build the graph in ctx (no_alloc); BT_OK or an error with a message in
 * bt_context_error(ctx). */
enum bt_status bt_llm_build_graph(const struct bt_llm *m, struct bt_kv *kv, bt_context *ctx, int64_t n_tokens,
                                  int64_t n_kv, int64_t n_out, struct bt_llm_graph *out);
/* The same, with the rows' kind (bt_llm_build_graph: BT_LLM_OUT_LOGITS). */
enum bt_status bt_llm_build_graph_out(const struct bt_llm *m, struct bt_kv *kv, bt_context *ctx, int64_t n_tokens,
                                      int64_t n_kv, int64_t n_out, enum bt_llm_out kind, struct bt_llm_graph *out);
size_t bt_llm_graph_ctx_size(const struct bt_llm *m);

/* ---- one stage: a layer range's graphs (one per ubatch shape, reused while
 * the shape repeats) over its cache on one backend.  Each graph runs on the
 * scheduler (bt_sched.h), planned once per shape: its splitter puts every
 * node on the stage's backend, or, when a device backend cannot run some op
 * of the range, those nodes on a CPU backend the stage starts beside it,
 * their inputs copied across.  bt_llm_ctx runs its ubatches through it;
 * over ranks the model runs on the distributed runtime
 * (src/run/model_dist.h). ---- */
struct bt_llm_stage;
enum bt_status bt_llm_stage_new(const struct bt_llm *m, struct bt_kv *kv, bt_backend_t backend, int64_t n_ubatch,
                                struct bt_llm_stage **out, char *err, size_t n_err);
void bt_llm_stage_free(struct bt_llm_stage *s);
/* Graphs built so far. */
int bt_llm_stage_n_graphs(const struct bt_llm_stage *s);
/* One ubatch of T <= n_ubatch tokens already placed in the cache (cells[]; the
 * sliding layers' cells are the cache's last placement, bt_kv_swa_cells): the
 * first range takes token ids, the others x [n_embd, T] (F32); the masks
 * come from the cache.  out gets x [n_embd, T], or on the last range the
 * logits of the n_out rows out_ids[] ([n_vocab, n_out]; n_out 0: none). */
enum bt_status bt_llm_stage_run(struct bt_llm_stage *s, int64_t T, const int32_t *token, const float *x,
                                const int32_t *pos, const int32_t *seq, const int32_t *cells, int64_t n_out,
                                const int32_t *out_ids, float *out, char *err, size_t n_err);

/* ---- one process: the whole model, a KV cache, a CPU backend ---- */
struct bt_llm_ctx_params {
    int64_t n_ctx;      /* cells */
    int n_seq_max;
    int64_t n_ubatch;   /* tokens per graph */
    enum bt_type kv_type;
    int n_threads;
};
void bt_llm_ctx_default_params(struct bt_llm_ctx_params *p);

struct bt_llm_ctx;
enum bt_status bt_llm_ctx_new(struct bt_llm *m, const struct bt_llm_ctx_params *p, struct bt_llm_ctx **out,
                              char *err, size_t n_err);
void bt_llm_ctx_free(struct bt_llm_ctx *c);
struct bt_kv *bt_llm_ctx_kv(struct bt_llm_ctx *c);
/* Graphs built so far (one per ubatch shape; reused while the shape repeats). */
int bt_llm_ctx_n_graphs(const struct bt_llm_ctx *c);

/* A batch: n tokens, each with its position and sequence; logits[i] != 0
 * asks for token i's logits.  logits_out gets n_vocab floats per asked-for
 * token, in token order.  The batch is cut into ubatches of n_ubatch.
 * Errors (bad token id, sequence, position, full cache) leave a message. */
struct bt_llm_batch {
    int64_t n_tokens;
    const int32_t *token, *pos, *seq;
    const int8_t *logits;
    enum bt_llm_out out_kind; /* the rows asked for: logits, or (the engine only) normed hidden states */
};
enum bt_status bt_llm_decode(struct bt_llm_ctx *c, const struct bt_llm_batch *b, float *logits_out, char *err,
                             size_t n_err);

#ifdef __cplusplus
}
#endif
#endif
