/* batcher.h - continuous batching on rank 0: many requests (a prompt, sampling
 * parameters, a token limit, stop strings) run as sequences of one engine
 * (engine.h), their prompt chunks and decode tokens packed into shared
 * ubatches that stream through the ranks' pipeline.  `baton generate
 * --parallel` and `baton serve` drive their models through it.
 *
 * One request = one sequence slot (0 .. n_seq-1) for its whole life.  A
 * slot's cells outlive its request (the tokens they hold are remembered): a
 * new request takes the free slot whose cells share the longest prefix with
 * its prompt, the cells past that prefix are freed on every rank
 * (bt_engine_seq_trim), and only the rest of the prompt is computed (at
 * least its last token, whose logits are needed), as llama-server's
 * cache_prompt.  The tokens after the prefix land in the cells a cold run
 * would give them and read the same cells, so the results are bitwise a
 * cold run's; where a sliding window's ring no longer holds what they would
 * read (bt_engine_seq_reusable), the prompt runs cold.  Each
 * step forms ubatches from the ready sequences (first one decode token of each
 * sequence whose last token has been sampled, spread over as many ubatches as
 * the pipeline has stages, then prompt chunks; at most n_ubatch tokens),
 * submits while fewer than max_inflight ubatches are in
 * flight, then collects the oldest, samples the rows it brought back and hands
 * each request its new text.  A sequence's next decode token waits only for its
 * own previous token; its prompt chunks follow each other without waiting.
 *
 * A request may carry a grammar (constrain.h): rank 0 samples only tokens
 * that keep its text inside it, the same tokens as sampling over the
 * allowed ones alone.
 *
 * Results: the engine gives each sequence its own cells and its kernels do not
 * depend on the batch, so with greedy sampling (or a fixed seed) a request's
 * tokens are the same bits whether it runs alone or among many, on any number
 * of ranks.
 *
 * Threads: bt_batcher_add, bt_batcher_cancel, bt_batcher_wait and
 * bt_batcher_n_free may be called from any thread: they go through an inbox
 * under a mutex, which bt_batcher_step drains.  Everything else, and every
 * callback, runs on the one thread that calls bt_batcher_step (the engine's
 * thread); the callbacks are called without the inbox lock held, so they may
 * call add / cancel themselves.
 */
#ifndef BATON_BATCHER_H
#define BATON_BATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../text/constrain.h"
#include "../text/sampler.h"
#include "../text/tokenizer.h"
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why a request ended. */
enum bt_finish {
    BT_FINISH_STOP = 0,      /* an end-of-generation token or a stop string: "stop" */
    BT_FINISH_LENGTH = 1,    /* max_tokens, or the sequence's share of the context is full: "length" */
    BT_FINISH_CANCELLED = 2, /* bt_batcher_cancel: "cancelled" */
    BT_FINISH_ERROR = 3,     /* the engine failed, or this request's logits hold NaN (bt_batcher_error says
                                why, until the next step): "error" */
};
/* "stop", "length", "cancelled", "error" (OpenAI's finish_reason where it has one) */
const char *bt_finish_name(enum bt_finish f);

struct bt_gen_result {
    uint64_t id;             /* bt_batcher_add's */
    enum bt_finish finish;
    int64_t n_prompt;        /* prompt tokens */
    int64_t n_gen;           /* tokens sampled, the last one (an EOG token, ...) included */
    double t_prompt_s;       /* from the request's first submitted token to its first sampled token */
    double t_gen_s;          /* from its first sampled token to its last */
    int64_t n_cached;        /* of the prompt tokens: whose cells were reused from the slot's last request */
};

/* How an embedding request pools its prompt's hidden states (after the
 * output norm), as llama-server's --pooling: the mean over the prompt's
 * tokens, or the last token's.  NONE: a request that generates. */
enum bt_pooling { BT_POOLING_NONE = 0, BT_POOLING_MEAN = 1, BT_POOLING_LAST = 2 };

/* A request.  The batcher copies what it keeps (prompt, stop strings) in add;
 * user must stay valid until on_done has been called. */
struct bt_gen_request {
    const int32_t *prompt;   /* n_prompt >= 1 token ids (BOS, chat template: the caller's) */
    size_t n_prompt;
    bt_sampler_params sampling;
    int64_t max_tokens;      /* >= 1, or -1: until a stop or the context share is full */
    const char *const *stops; /* n_stops stop strings (non-empty, valid UTF-8), or NULL */
    size_t n_stops;
    /* logit_bias: bias[i] added to token bias_ids[i]'s logit at every sample
     * (bt_sampler_set_bias; copied), or NULL */
    const int32_t *bias_ids;
    const float *bias;
    size_t n_bias;
    int64_t min_tokens;      /* no end-of-generation token is sampled before this many tokens (0: none) */
    bool ignore_eos;         /* an end-of-generation token does not end the request */
    /* logprobs: each token's log-probability and its top_logprobs (0 to
     * BT_MAX_TOP_LOGPROBS) most likely alternatives, from the raw logits
     * (bt_logprobs_compute: before logit_bias, min_tokens, penalties and the
     * sampler's filters) */
    bool logprobs;
    int32_t top_logprobs;
    /* Each sampled token, in order: its id and the text that may be shown now
     * (len may be 0: a character or a possible stop string still pending; an
     * end-of-generation token and stop strings are never shown).  The text is
     * the pieces' bytes: whole characters, but bytes that cannot form one
     * (a model may sample a lead byte and then no continuation) pass through
     * as they are, so it is not always valid UTF-8 (JSON writers: escape or
     * replace them).  lp: the token's log-probabilities when the request
     * asked for them, else NULL (valid during the call).  May be NULL. */
    void (*on_token)(void *user, int32_t id, const char *text, size_t len, const bt_logprobs *lp);
    /* Once, at the end, whatever the reason (cancel included).  May be NULL. */
    void (*on_done)(void *user, const struct bt_gen_result *r);
    void *user;
    /* An embedding (pooling not NONE): nothing is generated.  The prompt's
     * hidden states are pooled (summed in token order in double, then
     * divided), scaled to unit Euclidean length as llama-server's default
     * (embd_normalize 2), and handed to on_embd (n_embd floats, valid during
     * the call) before on_done (BT_FINISH_STOP, n_gen 0).  Sampling, stops,
     * bias, max_tokens, min_tokens and logprobs are not used.  The vector is
     * the same bits alone or among other requests, on any number of ranks
     * (the engine's rows are). */
    enum bt_pooling pooling;
    void (*on_embd)(void *user, const float *embd, int64_t n_embd);
    /* No prefix reuse (llama-server's cache_prompt: false): the whole prompt
     * is computed, in a slot whose cells are all freed first.  Either way the
     * results are the same bits. */
    bool no_reuse;
    /* n_choices > 1 (0 or 1: one): as many completions of the prompt, one
     * sequence slot each, all under one id (a cancel ends them all).  The
     * prompt is computed once, in the first choice's slot; once it is
     * submitted its cells are copied into the others' (bt_engine_seq_cp, on
     * every rank), and every choice samples its first token from the same
     * row of logits.  Choice i samples with seed sampling.seed + i, so its
     * tokens are bitwise those of a request of one choice with that seed;
     * its callbacks get choice_users[i] (n_choices entries) in place of
     * user.  At most the batcher's slots; generation only. */
    int n_choices;
    void *const *choice_users;
    /* A grammar the output must follow (constrain.h: only tokens that keep
     * the text inside it are sampled, the result the same as sampling over
     * those tokens alone; the end of generation only where it is complete),
     * or NULL.  Not copied: it must outlive the request (until on_done). */
    const bt_grammar *grammar;
    /* With a grammar: NULL, or a text (1 to 64 bytes) that starts it.
     * Until the output holds the trigger it is free (sampled as without a
     * grammar); from there the grammar applies, its text beginning with the
     * trigger.  If the bytes after it are refused, the output stays free.
     * Not copied. */
    const char *grammar_trigger;
    /* NULL, or a text that, where it is a control token of the vocabulary
     * (a tool-call mark: Mistral's "[TOOL_CALLS]"), that token shows: its
     * text is in the output given to on_token, the trigger may be it, and
     * a grammar may take the token itself where it takes its text (else a
     * control token shows nothing and a grammar never takes it).  Not
     * copied. */
    const char *shown_control;
};

struct bt_batcher_params {
    int64_t n_ubatch;        /* most tokens in one ubatch; 0: the engine's */
    int max_inflight;        /* ubatches in flight; 0: the engine's */
};
void bt_batcher_default_params(struct bt_batcher_params *p);

struct bt_batcher;

/* A batcher over an open engine (rank 0) with the engine's n_seq_max slots;
 * tok detokenises and recognises end-of-generation tokens.  Both must outlive
 * the batcher.  BT_ERR_INVALID with a message for bad params. */
enum bt_status bt_batcher_new(struct bt_engine *e, const bt_tokenizer *tok, const struct bt_batcher_params *p,
                              struct bt_batcher **out, char *err, size_t n_err);
/* Frees the batcher: the ubatches in flight are collected and dropped,
 * requests still running end with BT_FINISH_CANCELLED (their on_done is
 * called) and their sequences are removed. */
void bt_batcher_free(struct bt_batcher *b);

/* Any thread.  Checks the request and queues it; *id names it for cancel.
 *   BT_ERR_CAPACITY: every sequence slot is taken (queue the request and try
 *                    again after a request ends);
 *   BT_ERR_INVALID:  a bad request (empty prompt, a token id outside the
 *                    vocabulary, a prompt longer than a sequence's share of
 *                    the context, bad sampling values, max_tokens 0, a bad
 *                    stop string, top_logprobs out of range, ignore_eos with a grammar) with one
 *                    message in err;
 *   BT_ERR_COMM:     the engine has failed.
 * Nothing is called back for a request that add refused. */
enum bt_status bt_batcher_add(struct bt_batcher *b, const struct bt_gen_request *req, uint64_t *id, char *err,
                              size_t n_err);
/* Any thread.  The request ends (on_done with BT_FINISH_CANCELLED, from the
 * step thread) and its sequence is freed at the next step.  Unknown or
 * finished ids are ignored. */
void bt_batcher_cancel(struct bt_batcher *b, uint64_t id);
/* Any thread: slots that an add would find free now. */
int bt_batcher_n_free(struct bt_batcher *b);
/* Any thread: block until the inbox holds something or timeout_ms passed
 * (-1: no limit).  For a loop that has nothing to step (bt_batcher_idle). */
void bt_batcher_wait(struct bt_batcher *b, int timeout_ms);

/* Step thread.  One round: take the inbox, submit what is ready while fewer
 * than max_inflight ubatches are in flight, collect the oldest ubatch in
 * flight (blocking for it), sample its rows and call back.  Returns at once
 * when there is nothing to do.  An engine failure ends every request with
 * BT_FINISH_ERROR and returns its status (then every later call fails). */
enum bt_status bt_batcher_step(struct bt_batcher *b);
/* Step thread: no request running, none queued, nothing in flight. */
bool bt_batcher_idle(struct bt_batcher *b);
const char *bt_batcher_error(const struct bt_batcher *b);

/* Step thread: totals since bt_batcher_new. */
struct bt_batcher_stats {
    uint64_t ubatches;       /* submitted */
    uint64_t prompt_tokens;  /* prompt tokens submitted */
    uint64_t gen_tokens;     /* tokens sampled */
    uint64_t decode_tokens;  /* sampled tokens submitted back (decode steps) */
    uint64_t cached_tokens;  /* prompt tokens whose cells were reused, not submitted */
};
void bt_batcher_stats(const struct bt_batcher *b, struct bt_batcher_stats *s);

#ifdef __cplusplus
}
#endif
#endif
