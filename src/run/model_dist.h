/* model_dist.h - a GGUF model's prompts on the distributed runtime (dist.h):
 * the whole model's graph of one ubatch, split by the master splitter over
 * the ranks, its split inputs moved as transfers (MPI, or NCCL between CUDA
 * ranks), micro-batches driven through the ranks by the n_copies ring.
 *
 * Every micro-batch is one prompt of n_tokens tokens, a sequence of its own
 * at positions 0..n_tokens-1; it asks for the logits of its last n_out
 * tokens.  Each rank reads from the file only the weights the plan gives it,
 * and its layers' cache lives in its compute memory for the micro-batch
 * (written, then read, by the same split).  The logits are bitwise those of
 * one process (bt_llm_decode of the same prompt), on any number of ranks and
 * copies.
 *
 * Every rank makes the same calls (SPMD), as with bt_dist:
 *
 *     bt_model_dist_open(t, backend, gguf, &params, &md, err, n)   collective
 *     for k in 0..M-1:
 *         bt_model_dist_submit(md, tokens_k)                      collective
 *         rank 0: bt_model_dist_logits(md, k - lag, out)          (one of the last n_copies)
 *     bt_dist_synchronize(bt_model_dist_runtime(md))              collective
 *     bt_model_dist_free(md)                                      collective
 */
#ifndef BATON_MODEL_DIST_H
#define BATON_MODEL_DIST_H

#include "../dist.h"
#include "../gguf.h"
#include "../model/arch.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_model_dist_params {
    int64_t n_tokens;       /* tokens of every micro-batch (1..) */
    int64_t n_out;          /* logit rows of every micro-batch: its last n_out tokens (1..n_tokens) */
    enum bt_type kv_type;   /* the cache's type (F16 as generate's default) */
    /* the runtime's options (n_copies, layers_per_rank, device transport,
     * planning speed...); ends_with_layers is set */
    struct bt_dist_options dist;
};
void bt_model_dist_default_params(struct bt_model_dist_params *p);

struct bt_model_dist;

/* Collective: check the file (every rank the same way), build the graph,
 * plan it, allocate and read each rank's weights.  On error every rank
 * returns the same status; err says why (rank 0's message). */
enum bt_status bt_model_dist_open(bt_transport *t, bt_backend_t backend, struct bt_gguf *g,
                                  const struct bt_model_dist_params *p, struct bt_model_dist **out, char *err,
                                  size_t n_err);
/* Collective: waits for what was submitted, frees everything. */
void bt_model_dist_free(struct bt_model_dist *md);

/* Collective: the next micro-batch, n_tokens token ids (the same on every
 * rank).  A token outside the vocabulary: BT_ERR_INVALID on every rank,
 * nothing submitted. */
enum bt_status bt_model_dist_submit(struct bt_model_dist *md, const int32_t *tokens);
/* Micro-batches submitted so far (the next one's number). */
int64_t bt_model_dist_n_submitted(const struct bt_model_dist *md);
/* Rank 0: the logits of micro-batch k (one of the last n_copies submitted),
 * n_vocab floats per row, n_out rows. */
enum bt_status bt_model_dist_logits(struct bt_model_dist *md, int64_t k, float *out);

const struct bt_hparams *bt_model_dist_hparams(const struct bt_model_dist *md);
const char *bt_model_dist_arch_name(const struct bt_model_dist *md); /* general.architecture */
/* The runtime (statistics, traces, the plan, synchronize). */
bt_dist *bt_model_dist_runtime(struct bt_model_dist *md);
/* The graph of one micro-batch (the same on every rank). */
const struct bt_llm_graph *bt_model_dist_graph(const struct bt_model_dist *md);
const char *bt_model_dist_error(const struct bt_model_dist *md);

#ifdef __cplusplus
}
#endif
#endif
