/* sampler.h - the next token from a row of logits: penalties on the tokens
 * already seen (repetition, frequency, presence), then top-k, top-p, min-p,
 * temperature, and a draw from what is left; temperature 0 is greedy.  A
 * seed makes a run repeatable: each sampler owns its random stream (no
 * global state), so two samplers with one seed draw the same tokens.
 *
 * The order and the rules are llama.cpp's (common/sampling.cpp's default
 * chain: penalties, top_k, top_p, min_p, temperature, dist). */
#ifndef BATON_TEXT_SAMPLER_H
#define BATON_TEXT_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "baton/tensor.h" /* enum bt_status */


typedef struct bt_sampler_params {
    float temp;              /* <= 0: greedy (the largest logit after the penalties); default 0.8 */
    int32_t top_k;           /* keep the k largest; 0: all; default 40 */
    float top_p;             /* keep the smallest head whose probability reaches p; 1: all; default 0.95 */
    float min_p;             /* drop tokens below min_p x the top probability; 0: none; default 0.05 */
    float repeat_penalty;    /* seen tokens: positive logits / penalty, negative x penalty; 1: off */
    float frequency_penalty; /* seen tokens: logit - penalty x count; 0: off */
    float presence_penalty;  /* seen tokens: logit - penalty; 0: off */
    int32_t penalty_last_n;  /* how many of the last tokens count as seen; 0: none, -1: all; default 64 */
    uint64_t seed;           /* default 0 */
} bt_sampler_params;

void bt_sampler_params_default(bt_sampler_params *p);
/* The model's whole distribution (OpenAI's defaults): temperature 1, no
 * top-k, top-p or min-p cut, no penalties; the rest as the defaults. */
void bt_sampler_params_whole(bt_sampler_params *p);
/* A value a user gave out of range: BT_ERR_INVALID and one message naming
 * the option as llama.cpp's flags do (--temp, --top-k, ...). */
enum bt_status bt_sampler_params_check(const bt_sampler_params *p, char *err, size_t errlen);

typedef struct bt_sampler bt_sampler;

enum bt_status bt_sampler_create(const bt_sampler_params *p, int32_t n_vocab, bt_sampler **out, char *err,
                                 size_t errlen);
void bt_sampler_free(bt_sampler *s);
/* Record a token of the context (prompt or generated) for the penalties. */
void bt_sampler_accept(bt_sampler *s, int32_t id);
/* The next token for logits[0..n_vocab).  Deterministic for a seed and a
 * sequence of calls.  Does not accept the token (call bt_sampler_accept). */
int32_t bt_sampler_sample(bt_sampler *s, const float *logits);
/* ---- constrained sampling (a grammar decides which tokens may come) ----
 *
 * The result is always that of masking first: the chain run over the
 * allowed tokens only (those whose logit after logit_bias and the penalties
 * is above -inf).  bt_sampler_sample_checked finds it by asking about a few
 * candidates (greedy: the best; top-k: the best in order until k are
 * allowed); when that does not settle it, bt_sampler_sample_masked does,
 * with the whole vocabulary's mask.  Neither draws from the random stream
 * unless it returns a token. */

#ifndef BT_SAMPLER_CHECK_MAX
#define BT_SAMPLER_CHECK_MAX 64 /* candidates the fast path asks about before giving up */
#endif

/* whether token id may come next */
typedef bool (*bt_sampler_allow_fn)(void *user, int32_t id);
/* The masked choice, or -1 when the candidates asked do not settle it
 * (top-k 0 at a temperature, or more than BT_SAMPLER_CHECK_MAX refused). */
int32_t bt_sampler_sample_checked(bt_sampler *s, const float *logits, bt_sampler_allow_fn allow, void *user);
/* The next token among those with allowed[id] != 0; -1 when none is
 * allowed. */
int32_t bt_sampler_sample_masked(bt_sampler *s, const float *logits, const uint8_t *allowed);
/* logit_bias: bias[i] added to token ids[i]'s logit before the penalties and
 * every filter (-INFINITY: never sampled), for every later sample; copied; n
 * 0 removes it.  BT_ERR_INVALID naming an id out of the vocabulary or a NaN. */
enum bt_status bt_sampler_set_bias(bt_sampler *s, const int32_t *ids, const float *bias, int32_t n, char *err,
                                   size_t errlen);
/* Forget the context and restart the random stream from the seed. */
void bt_sampler_reset(bt_sampler *s);

/* ---- log-probabilities (the OpenAI API's logprobs) ---- */

#ifndef BT_MAX_TOP_LOGPROBS
#define BT_MAX_TOP_LOGPROBS 20 /* the most alternatives asked per token (OpenAI's top_logprobs limit) */
#endif

/* A sampled token's log-probability and those of the n_top most likely
 * tokens, in the model's distribution: the log-softmax of the raw logits,
 * before logit_bias, penalties, temperature and every filter (what the model
 * says, not what the sampler drew from).  Most likely first; equal logits:
 * the smaller id first (the greedy sampler's choice is then top_id[0]). */
typedef struct bt_logprobs {
    int32_t id;
    float logprob;
    int32_t n_top;
    int32_t top_id[BT_MAX_TOP_LOGPROBS];
    float top_logprob[BT_MAX_TOP_LOGPROBS];
} bt_logprobs;

/* lp for token id from logits[0..n_vocab), n_top in [0, BT_MAX_TOP_LOGPROBS].
 * The sum runs in double in token order, so the values depend on the logits'
 * bits alone.  Logits of -inf give -inf; when the largest logit is not finite
 * the tokens that hold it share the probability (the others: -inf). */
void bt_logprobs_compute(const float *logits, int32_t n_vocab, int32_t id, int32_t n_top, bt_logprobs *lp);


#endif
