/* engine.h - a llama-family GGUF model (src/model/arch.h) spread over the
 * ranks of a job and run as a pipeline of ubatches.  `generate`, `bench
 * model` and `serve` drive a model only through this header.
 *
 * Bring-up (bt_engine_open, collective):
 *   - every rank opens the file itself (the same path on every host, or the
 *     one the topology's pipeline section names) and rank 0 checks that every
 *     rank found the same file (size and bt_gguf_header_checksum): a rank
 *     that cannot open it or finds another file stops every rank with one
 *     message naming the rank, host and path;
 *   - rank 0 places the layers (contiguous ranges, rank 0 first) from the
 *     file's real tensor sizes and the ranks' speeds and memory, or from a
 *     fixed partition; every rank reads only the weights its splits hold
 *     (copied, repacked on a CPU rank; with mmap used in place in the file's
 *     mapping);
 *   - every rank keeps the KV cache of its own layers.
 *   Every check (file, hyperparameters, tensors, context size against
 *   memory) is done before any rank allocates.
 *
 * The model runs on the distributed runtime (model_dist.h): the whole
 * model's graph of each ubatch shape, split over the ranks by the master
 * splitter with the layers placed as above, x and every other cross-rank
 * input as MPI or NCCL transfers, up to max_inflight ubatches in flight (the
 * runtime's n_copies ring), so P ranks work on P different ubatches at once.
 * Rank 0 checks and places each ubatch in its cache, then sends every other
 * rank a small message (the tokens' ids, positions, sequences, the rows that
 * need logits) and every rank makes the same runtime calls in that order:
 * every rank's cache is in step, each builds its own mask, and the rows of
 * logits asked for come back to rank 0.  With one rank everything is local.
 *
 * Rank 0 drives: submit ubatches, collect their logits in submission order,
 * remove sequences.  The other ranks call bt_engine_serve, which returns when
 * rank 0 closes the engine (or a ubatch fails on every rank, as a new
 * shape's plan that does not fit in some rank's memory does: then every rank
 * returns an error naming that rank, with its status).  A failure in the
 * middle of the runtime's pipeline (a compute error, a transfer) ends every
 * rank with its message.
 *
 * Results: a token's logits do not depend on the number of ranks, the thread
 * count, the other tokens of its ubatch, the other sequences in the cache, or
 * whether its context came in one ubatch or token by token (bitwise).
 *
 * Errors: open writes one message into err; on an open engine a failed call
 * returns a status and bt_engine_error(e) says why; a failed ubatch is fatal
 * to the engine (every later call fails the same way).
 */
#ifndef BATON_ENGINE_H
#define BATON_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "../model/arch.h"
#include "bringup.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_engine_params {
    const char *model;    /* GGUF path; NULL: the topology's pipeline section's */
    int64_t n_ctx;        /* KV cells; each sequence may use n_ctx / n_seq_max of them */
    int n_seq_max;        /* sequence ids 0 .. n_seq_max-1 */
    int64_t n_ubatch;     /* most tokens in one ubatch */
    enum bt_type kv_type; /* F16 (default), F32 or Q8_0 */
    int max_inflight;     /* ubatches in flight; 0: ranks x the rank's copies */
    bool mmap;            /* CPU weights used in place in the file's mapping, not copied onto huge pages */
};
/* n_ctx 4096, n_seq_max 1, n_ubatch 512, F16, max_inflight 0 */
void bt_engine_default_params(struct bt_engine_params *p);

struct bt_engine;

/* Rank 0's placement, as a pure function: each of P ranks' layers
 * [ranges[2r], ranges[2r + 1]) of the file's model under p, from the ranks'
 * descriptions (backend, memory, speed) by the cost model, or from fixed
 * counts (layer_counts, NULL: placed); each rank's weights and its cache of
 * p->n_ctx cells within its memory; an expert group's layers on its first
 * rank, with the group's memory (plan.h: bt_expert_group).  BT_OK, or an
 * error and one message in msg (a model or a cache that does not fit, naming
 * the rank).  bt_engine_open runs it on rank 0 with the ranks' own
 * descriptions; `baton plan -m` with a topology's. */
struct bt_rank_desc;
struct bt_expert_group;
enum bt_status bt_engine_place(struct bt_gguf *g, const struct bt_hparams *h, const struct bt_engine_params *p,
                               const struct bt_rank_desc *descs, int P, const int *layer_counts,
                               const struct bt_expert_group *groups, int n_groups, int32_t *ranges, char *msg,
                               size_t n_msg);

/* Collective over every rank of r (after bt_rank_init).  BT_OK and *out on
 * every rank, or the same status on every rank and one message in err. */
enum bt_status bt_engine_open(struct bt_rank *r, const struct bt_engine_params *p, struct bt_engine **out, char *err,
                              size_t n_err);
/* Every rank: frees its stage (rank 0 stops the others first when
 * bt_engine_stop was not called).  Safe on NULL. */
void bt_engine_close(struct bt_engine *e);
const char *bt_engine_error(const struct bt_engine *e);

const struct bt_hparams *bt_engine_hparams(const struct bt_engine *e);
const struct bt_arch *bt_engine_arch(const struct bt_engine *e);
const struct bt_engine_params *bt_engine_params(const struct bt_engine *e);
/* The model file, open on every rank (vocabulary, chat template, metadata). */
struct bt_gguf *bt_engine_gguf(const struct bt_engine *e);
/* The plan the runtime runs for a full ubatch (its first shape), on every
 * rank: what `baton plan -m` prints for the same placement and parameters. */
const struct bt_plan *bt_engine_plan(const struct bt_engine *e);
/* This rank's layers [*il0, *il1), and every rank's (rank 0: all P ranges). */
void bt_engine_range(const struct bt_engine *e, int rank, int *il0, int *il1);
int bt_engine_n_ranks(const struct bt_engine *e);
/* Rank 0: rank `rank`'s backend as it described itself for placement
 * ("CPU(avx2)@host": a CPU rank names the variant of its kernels, so a job
 * whose ranks run on different CPUs shows which ran where); elsewhere "". */
const char *bt_engine_rank_backend(const struct bt_engine *e, int rank);

/* Every rank that wants to watch its nodes: the scheduler's eval callback
 * (bt_sched.h) on the graphs of this rank's layers, for every ubatch from
 * now on (NULL: none).  It runs on the rank that computes the node; a rank
 * without layers computes nothing and never calls it.  Returning false
 * after a node fails that ubatch on this rank, as a compute error would. */
void bt_engine_set_eval_callback(struct bt_engine *e, bt_sched_eval_callback cb, void *user);
/* The id of the ubatch this rank computes now (inside the eval callback),
 * else of the last one it computed. */
uint64_t bt_engine_computing(const struct bt_engine *e);

/* ---- rank 0 ---- */

/* One ubatch: 1 <= n_tokens <= n_ubatch tokens (token, pos, seq; logits[i]
 * != 0 asks for token i's row; logits NULL: the last token's row only; with
 * out_kind BT_LLM_OUT_EMBD a row is the token's hidden state after the
 * output norm, n_embd floats, instead of its logits).  The
 * tokens are checked and placed in the cache at once; a bad token id,
 * sequence or position, or a sequence whose share of the cache is full, is an
 * error and nothing is submitted.  Blocks while max_inflight ubatches are
 * still in the pipeline (until the oldest one's logits are back on rank 0;
 * logits that are back wait for collect, however many).  Rank 0 computes its
 * own layers of the ubatch inside this call.  *id: the ubatch's number, 0, 1,
 * ... */
enum bt_status bt_engine_submit(struct bt_engine *e, const struct bt_llm_batch *ub, uint64_t *id);
/* Ubatches submitted and not yet collected. */
int bt_engine_n_inflight(const struct bt_engine *e);
/* Wait for the oldest ubatch in flight: its id, and its n_out rows of logits
 * (n_vocab floats each, in token order; n_embd for a BT_LLM_OUT_EMBD ubatch)
 * copied into logits (room for the rows that ubatch asked for at submit).  BT_ERR_INVALID when none is in
 * flight. */
enum bt_status bt_engine_collect(struct bt_engine *e, uint64_t *id, float *logits, int64_t *n_out);
/* Free sequence seq's cells on every rank, after the ubatches submitted
 * before this call. */
enum bt_status bt_engine_seq_rm(struct bt_engine *e, int32_t seq);
/* Free sequence seq's cells at positions >= p0 on every rank (p0 0: all,
 * as seq_rm), after the ubatches submitted before: its positions below p0
 * stay, and its next token lands where it would have had the sequence never
 * gone further (prefix reuse). */
enum bt_status bt_engine_seq_trim(struct bt_engine *e, int32_t seq, int32_t p0);
/* Whether seq's first n positions can be kept for new tokens from position
 * n on with every result bitwise that of a run that stopped at n - 1
 * (bt_kv_seq_reusable: they are all held, and a sliding window's ring has
 * not overwritten what position n sees). */
bool bt_engine_seq_reusable(const struct bt_engine *e, int32_t seq, int32_t n);
/* Copy src's positions 0 .. n - 1 (cells and every layer's K/V rows) into
 * dst's region on every rank, after the ubatches submitted before (each rank
 * finishes its work on them first: the pipeline drains); dst must hold no
 * cells and src those positions (bt_engine_seq_reusable).  dst's tokens from
 * position n on then get the results they would have had dst computed the n
 * tokens itself (the prompt of n > 1 choices, processed once). */
enum bt_status bt_engine_seq_cp(struct bt_engine *e, int32_t src, int32_t dst, int32_t n);
/* Collect what is in flight and tell the other ranks to stop (their
 * bt_engine_serve returns BT_OK). */
enum bt_status bt_engine_stop(struct bt_engine *e);
/* Position of seq's last token in the cache, -1 when it has none. */
int32_t bt_engine_seq_pos_max(const struct bt_engine *e, int32_t seq);

/* ---- ranks 1 .. P-1 ---- */

/* Run this rank's stage until rank 0 closes the engine (BT_OK) or a rank
 * fails (an error naming it). */
enum bt_status bt_engine_serve(struct bt_engine *e);

/* ---- statistics ---- */
struct bt_engine_stats {
    uint64_t ubatches, tokens;   /* processed by this rank */
    double compute_s;            /* in graph compute */
    double wait_s;               /* waiting for input */
    uint64_t bytes_sent, bytes_received;
    uint64_t bytes_direct;       /* of bytes_sent: x over the device transport (NCCL), stage memory to stage memory */
    size_t weight_bytes, kv_bytes, compute_bytes;
    size_t mapped_bytes;         /* of weight_bytes: used in place in the file's mapping */
    size_t repacked_bytes;       /* of weight_bytes: repacked for the CPU's matmul (bt_llm_load_gguf) */
    size_t peak_rss;             /* bytes, from getrusage */
    size_t buffer_bytes;         /* the engine's own message buffers: sends, answers, the stage's input */
    double expert_s;             /* of compute_s: an expert group's chains (its experts' rows) */
    uint64_t expert_bytes_read;  /* expert weight bytes those chains read */
    uint64_t bytes_group;        /* of bytes_sent: an expert group's ids and rows */
    uint64_t expert_pairs;       /* routed (token, expert) pairs those chains computed */
};
/* Rank 0, while the engine runs: each rank's seconds in graph compute so
 * far into compute_s[0..P), as the answers of the ubatches collected (or
 * done) last reported them (every ubatch carries the compute time of each
 * stage it went through; no extra message); rank 0's own is current, a rank
 * without layers 0.  Elsewhere: all 0. */
void bt_engine_compute_seconds(const struct bt_engine *e, double *compute_s);
/* This rank's. */
void bt_engine_stats(const struct bt_engine *e, struct bt_engine_stats *s);
/* Collective, after bt_engine_stop (rank 0) / bt_engine_serve (the others):
 * every rank's into all[0..P) on rank 0 (all may be NULL elsewhere). */
enum bt_status bt_engine_gather_stats(struct bt_engine *e, struct bt_engine_stats *all);

#ifdef __cplusplus
}
#endif
#endif
