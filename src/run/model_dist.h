/* model_dist.h - a GGUF model on the distributed runtime (dist.h): the whole
 * model's graph of each ubatch shape, split by the master splitter over the
 * ranks, its split inputs moved as transfers (MPI, or NCCL between CUDA
 * ranks), micro-batches driven through the ranks by the n_copies ring, over
 * a KV cache that each rank keeps for its layers.
 *
 * A ubatch is n tokens of one or more sequences, each at its position; it
 * asks for the logits of some of its tokens.  Every rank places it in the
 * cache's cells the same way (the cache's bookkeeping is the same on every
 * rank) and builds the inputs it reads itself (positions, cells, the mask):
 * only x and the other split inputs travel, and the rows of logits asked for
 * come back to rank 0.  Each ubatch shape (tokens, cache cells read, rows)
 * has its own graph and plan, made once and kept while it repeats (the
 * cells read are bucketed by 32, so decoding replans once per 32 tokens of
 * context, not per token); every plan keeps the first one's layer placement,
 * so the weights, read from the file once, and the cache stay where they
 * are.  The logits are bitwise those of one process (bt_llm_decode of the
 * same ubatches), on any number of ranks and copies.
 *
 * Every rank makes the same calls in the same order (SPMD), as with
 * bt_dist:
 *
 *     bt_model_dist_open(t, backend, gguf, &params, &md, err, n)     collective
 *     bt_model_dist_decode(md, &ubatch)        collective; micro-batch k = the number of earlier ones
 *     rank 0: bt_model_dist_logits(md, k, out) (one of its shape's last n_copies)
 *     bt_model_dist_seq_rm(md, seq)            every rank, between ubatches (and seq_trim)
 *     bt_model_dist_seq_cp(md, src, dst, n)    collective, between ubatches
 *     bt_model_dist_synchronize(md)            collective
 *     bt_model_dist_free(md)                   collective
 *
 * With a device transport (NCCL between CUDA ranks) the shapes' runtimes
 * share it: each posts a micro-batch's device receives as the micro-batch
 * starts, so both ends of an edge keep the micro-batches' order.
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
    int64_t n_ctx;          /* the cache's cells */
    int n_seq_max;          /* sequences (each gets n_ctx / n_seq_max cells) */
    int64_t n_ubatch;       /* tokens of a ubatch, at most */
    enum bt_type kv_type;   /* the cache's type (F16 as generate's default) */
    bool in_place;          /* CPU weights used in place in the file's mapping, not copied (nor repacked) */
    /* the runtime's options (n_copies, layers_per_rank, pins, device
     * transport, planning speed...); ends_with_layers and tag_base are set */
    struct bt_dist_options dist;
};
void bt_model_dist_default_params(struct bt_model_dist_params *p);

/* A ubatch: n tokens, each with its position and sequence; rows[0..n_out-1]
 * are the tokens (indices into the ubatch, ascending) whose logits (or with
 * BT_LLM_OUT_EMBD their hidden states after the output norm) come back. */
struct bt_model_dist_ubatch {
    int64_t n;
    const int32_t *token, *pos, *seq;
    int64_t n_out;
    const int32_t *rows;
    enum bt_llm_out out_kind;
};

struct bt_model_dist;

/* Collective: check the file (every rank the same way), build and plan the
 * graph of a full ubatch over the whole cache, allocate each rank's weights
 * (read from the file) and cache.  On error every rank returns the same
 * status; err says why. */
enum bt_status bt_model_dist_open(bt_transport *t, bt_backend_t backend, struct bt_gguf *g,
                                  const struct bt_model_dist_params *p, struct bt_model_dist **out, char *err,
                                  size_t n_err);
/* Collective: waits for what was submitted, frees everything. */
void bt_model_dist_free(struct bt_model_dist *md);

/* Collective: place the ubatch in the cache and submit it as the next
 * micro-batch.  A bad ubatch (a token outside the vocabulary, a sequence or
 * position out of range, a full cache, rows out of order) fails on every
 * rank alike, nothing submitted; a new shape's plan is collective too. */
enum bt_status bt_model_dist_decode(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub);
/* bt_model_dist_decode in two steps, for a driver that must know the
 * ubatch fits before it tells the other ranks about it: place checks it
 * and places it in the cache's cells (every rank, nothing placed on an
 * error), run submits it (collective). */
enum bt_status bt_model_dist_place(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub);
enum bt_status bt_model_dist_run(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub);
/* A prompt of n tokens as a sequence of its own (the cache is emptied
 * first), asking for its last n_out tokens' logits. */
enum bt_status bt_model_dist_prompt(struct bt_model_dist *md, int64_t n, const int32_t *tokens, int64_t n_out);
/* Every rank: forget a sequence's cells (between ubatches, in the same order
 * on every rank).  The cells freed. */
int64_t bt_model_dist_seq_rm(struct bt_model_dist *md, int32_t seq);
/* Every rank: forget seq's cells at positions >= p0 (bt_kv_seq_trim), in
 * the same order between ubatches. */
int64_t bt_model_dist_seq_trim(struct bt_model_dist *md, int32_t seq, int32_t p0);
/* Whether seq's first n positions can be kept exactly (bt_kv_seq_reusable). */
bool bt_model_dist_seq_reusable(const struct bt_model_dist *md, int32_t seq, int32_t n);
/* Collective, between ubatches: copy src's positions 0 .. n - 1 into dst
 * (bt_kv_seq_cp) once this rank's work on every micro-batch submitted so far
 * is done (bt_model_dist_synchronize first: the K/V rows are final). */
enum bt_status bt_model_dist_seq_cp(struct bt_model_dist *md, int32_t src, int32_t dst, int32_t n);
/* Position of seq's last token in the cache, -1 when it has none. */
int32_t bt_model_dist_seq_pos_max(const struct bt_model_dist *md, int32_t seq);
/* Collective: wait until every submitted micro-batch is done everywhere. */
enum bt_status bt_model_dist_synchronize(struct bt_model_dist *md);

/* Called for the nodes of this rank's splits of every shape from now on
 * (bt_dist_set_eval_callback); while a micro-batch computes,
 * bt_model_dist_n_submitted is its number. */
void bt_model_dist_set_eval_callback(struct bt_model_dist *md, bt_sched_eval_callback cb, void *user);
/* Micro-batches submitted so far (the next one's number). */
int64_t bt_model_dist_n_submitted(const struct bt_model_dist *md);
/* Rank 0: the logits of micro-batch k, n_vocab floats per row asked for
 * (n_embd for a BT_LLM_OUT_EMBD ubatch).  Available until its shape has run
 * n_copies more micro-batches. */
enum bt_status bt_model_dist_logits(struct bt_model_dist *md, int64_t k, float *out);

const struct bt_hparams *bt_model_dist_hparams(const struct bt_model_dist *md);
const char *bt_model_dist_arch_name(const struct bt_model_dist *md); /* general.architecture */
/* The runtime of the first shape: it holds the weights and the cache; its
 * plan's placement is every shape's (statistics, traces, the plan). */
bt_dist *bt_model_dist_runtime(struct bt_model_dist *md);
/* Statistics of every shape's runtime on this rank, added up (bytes, times,
 * micro-batches; memory and placement from the first). */
struct bt_dist_stats bt_model_dist_local_stats(struct bt_model_dist *md);
/* Collective: every rank's bt_model_dist_local_stats to rank 0 (size entries). */
enum bt_status bt_model_dist_gather_stats(struct bt_model_dist *md, struct bt_dist_stats *out);
void bt_model_dist_reset_stats(struct bt_model_dist *md);
/* This rank's memory: its weights (of them: used in place in the file's
 * mapping, repacked for the CPU's matmul) and its cache, in bytes. */
void bt_model_dist_memory(const struct bt_model_dist *md, size_t *weights, size_t *mapped, size_t *repacked,
                          size_t *kv);
/* Shapes kept now. */
int bt_model_dist_n_shapes(const struct bt_model_dist *md);
/* Seconds spent planning shapes (building, planning and allocating their
 * graphs, the first included), and how many plans that was. */
double bt_model_dist_plan_seconds(const struct bt_model_dist *md, int *n_plans);
/* The first shape's graph (the same on every rank). */
const struct bt_llm_graph *bt_model_dist_graph(const struct bt_model_dist *md);
const char *bt_model_dist_error(const struct bt_model_dist *md);

#ifdef __cplusplus
}
#endif
#endif
