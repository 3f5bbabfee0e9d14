/* random_model.h - a model of one of the supported architectures (arch.h)
 * with random weights from a seed, as a GGUF file: written to disk
 * (`baton make-model`) or made in memory (the model `baton demo`,
 * `bench pipeline` and `baton plan` run when given none).  It computes
 * nonsense through every path a real model takes: the loader's checks, the
 * layers, MoE routing, the KV cache, the splitter and the pipeline.
 *
 * The seed's three MoE variants are architectures here: top-K routing with
 * the K weights renormalised (qwen3moe, llama with experts: Mixtral), a
 * shared expert gated by a sigmoid beside the routed ones (qwen2moe), and the
 * dense MoE, every expert used (experts_used = experts).
 *
 * deepseek2 takes DeepSeek-V3's proportions from head_dim (hd; V3's 128):
 * the latent attention's rope part hd/2, kv rank 4 hd, q rank 12 hd, value
 * heads of hd, one latent KV head (n_head_kv is not used); with experts the
 * first layer dense (n_ff), then sigmoid routing renormalised and times 2.5
 * and one shared expert of n_ff_exp.  glm4moe takes GLM-4.5's form: the
 * rope over half of each head, q/k/v biases, the first layer dense, the
 * same routing and shared expert, no prediction layer.  minimax-m2 takes
 * MiniMax-M2's: the rope over half of each head, q/k norms over the whole of
 * q and k, every layer MoE with sigmoid routing (a selection bias,
 * renormalised, unscaled), no shared expert, an output projection of its
 * own.
 *
 * The same options give the same bytes, on every machine: every rank of a
 * job makes the same model itself. */
#ifndef BATON_RANDOM_MODEL_H
#define BATON_RANDOM_MODEL_H

#include "../gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_random_model {
    const char *arch; /* general.architecture: one of bt_arch_names() */
    int n_layer;
    int64_t n_embd, n_head, n_head_kv, head_dim;
    int64_t n_ff;                         /* dense feed-forward (and a shared expert's) length */
    int64_t n_expert, n_expert_used, n_ff_exp; /* n_expert 0: dense (llama only) */
    int64_t n_swa;                        /* sliding window (gemma3: attention.sliding_window; 0: none) */
    int swa_pattern;                      /* gemma3: every swa_pattern-th layer global */
    int64_t n_ctx;                        /* <arch>.context_length */
    int64_t n_vocab;                      /* without a vocabulary file: the token count */
    enum bt_type type;                    /* the matrices' type (bt_type_can_quantize) */
    uint64_t seed;
};

/* qwen3moe, 4 layers, 128 wide, 4 heads (2 for K/V) of 32, ff 256, 8
 * experts of 64 with 2 used, (gemma3: a window of 32, every 6th layer
 * global), context 4096, 256 tokens, F32, seed 42. */
void bt_random_model_default(struct bt_random_model *m);

/* BT_OK, or BT_ERR_INVALID with one message naming the option
 * (`--heads-kv`, as the command line spells it) that does not fit the
 * others; the ranges of each number are the command line's. */
enum bt_status bt_random_model_check(const struct bt_random_model *m, char *err, size_t n_err);

/* The keys and tensors into w, the tensors' data streamed one at a time.
 * vocab: a GGUF file whose tokenizer.* keys are copied (its token count
 * replaces n_vocab), or NULL (no tokenizer: the model takes token ids).
 * The model must pass the check.  BT_OK, or the writer's error in err. */
enum bt_status bt_random_model_write(const struct bt_random_model *m, struct bt_gguf *vocab,
                                     struct bt_gguf_writer *w, char *err, size_t n_err);

/* The model made in memory and opened: *g reads *bytes (free them after
 * bt_gguf_close(*g)).  max_bytes > 0: a model whose file would be larger is
 * refused (BT_ERR_NOMEM, the sizes in err) before any of it is made. */
enum bt_status bt_random_model_open(const struct bt_random_model *m, int64_t max_bytes, struct bt_gguf **g,
                                    void **bytes, char *err, size_t n_err);

/* The model's file header alone (keys and tensor table, bt_gguf_open_header),
 * for a plan of a model too large to make: *g reads *header (free it after
 * bt_gguf_close(*g)). */
enum bt_status bt_random_model_describe(const struct bt_random_model *m, struct bt_gguf **g, void **header,
                                        char *err, size_t n_err);

#ifdef __cplusplus
}
#endif
#endif
