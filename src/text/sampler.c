/* sampler.c - penalties, top-k, top-p, min-p, temperature and the draw, in
 * llama.cpp's default order, over a candidate list the sampler owns; its own
 * xoshiro256** stream seeded by the user's seed.
 *
 * Differences from llama.cpp, on purpose:
 *   - ties between equal logits are broken by the smaller token id (a stable
 *     order), so a run repeats exactly whatever the sort;
 *   - the draw compares a 53-bit uniform with cumulative double sums (no
 *     std::discrete_distribution, whose algorithm differs between C++
 *     libraries). */
#include "sampler.h"
#include "../mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameters ---- */

void bt_sampler_params_default(bt_sampler_params *p) {
    p->temp = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->frequency_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->penalty_last_n = 64;
    p->seed = 0;
}

void bt_sampler_params_whole(bt_sampler_params *p) {
    bt_sampler_params_default(p);
    p->temp = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
}

enum bt_status bt_sampler_params_check(const bt_sampler_params *p, char *err, size_t errlen) {
    if (!(p->temp >= 0) || !isfinite(p->temp)) {
        snprintf(err, errlen, "--temp %g: the temperature must be 0 (greedy) or positive", (double)p->temp);
        return BT_ERR_INVALID;
    }
    if (p->top_k < 0) {
        snprintf(err, errlen, "--top-k %d: must be 0 (off) or positive", p->top_k);
        return BT_ERR_INVALID;
    }
    if (!(p->top_p > 0 && p->top_p <= 1)) {
        snprintf(err, errlen, "--top-p %g: must be in (0, 1] (1 is off)", (double)p->top_p);
        return BT_ERR_INVALID;
    }
    if (!(p->min_p >= 0 && p->min_p <= 1)) {
        snprintf(err, errlen, "--min-p %g: must be in [0, 1] (0 is off)", (double)p->min_p);
        return BT_ERR_INVALID;
    }
    if (!(p->repeat_penalty > 0) || !isfinite(p->repeat_penalty)) {
        snprintf(err, errlen, "--repeat-penalty %g: must be positive (1 is off)", (double)p->repeat_penalty);
        return BT_ERR_INVALID;
    }
    if (!isfinite(p->frequency_penalty)) {
        snprintf(err, errlen, "--frequency-penalty %g: must be a finite number", (double)p->frequency_penalty);
        return BT_ERR_INVALID;
    }
    if (!isfinite(p->presence_penalty)) {
        snprintf(err, errlen, "--presence-penalty %g: must be a finite number", (double)p->presence_penalty);
        return BT_ERR_INVALID;
    }
    if (p->penalty_last_n < -1) {
        snprintf(err, errlen, "--repeat-last-n %d: must be -1 (all), 0 (off) or positive", p->penalty_last_n);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

/* ---- the sampler ---- */

typedef struct {
    int32_t id;
    float logit;
    double p;
} cand;

struct bt_sampler {
    bt_sampler_params par;
    int32_t n_vocab;
    bt_rng rng;
    cand *c;          /* [n_vocab] */
    int32_t *hist;    /* ring of the last tokens (penalty window) */
    int32_t n_hist_cap, n_hist, hist_head;
    int32_t *count;   /* [n_vocab] occurrences in the window */
    int32_t *bias_id; /* [n_bias]: logit_bias, added to the logits before everything else */
    float *bias;
    int32_t n_bias;
};

enum bt_status bt_sampler_create(const bt_sampler_params *p, int32_t n_vocab, bt_sampler **out, char *err,
                                 size_t errlen) {
    *out = NULL;
    enum bt_status st = bt_sampler_params_check(p, err, errlen);
    if (st != BT_OK) return st;
    if (n_vocab <= 0) {
        snprintf(err, errlen, "sampler: vocabulary of %d tokens", n_vocab);
        return BT_ERR_INVALID;
    }
    bt_sampler *s = calloc(1, sizeof *s);
    if (!s) goto nomem;
    s->par = *p;
    s->n_vocab = n_vocab;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    /* the window: last_n tokens, or a growing list for -1 */
    s->n_hist_cap = p->penalty_last_n > 0 ? p->penalty_last_n : p->penalty_last_n < 0 ? 1024 : 0;
    s->hist = s->n_hist_cap ? malloc((size_t)s->n_hist_cap * sizeof *s->hist) : NULL;
    if (!s->c || !s->count || (s->n_hist_cap && !s->hist)) goto nomem;
    bt_rng_seed(&s->rng, p->seed);
    *out = s;
    return BT_OK;
nomem:
    bt_sampler_free(s);
    snprintf(err, errlen, "out of memory for a sampler of %d tokens", n_vocab);
    return BT_ERR_NOMEM;
}

void bt_sampler_free(bt_sampler *s) {
    if (!s) return;
    BT_FREE_ALL(s->c, s->hist, s->count, s->bias_id, s->bias, s);
}

enum bt_status bt_sampler_set_bias(bt_sampler *s, const int32_t *ids, const float *bias, int32_t n, char *err,
                                   size_t errlen) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab || isnan(bias[i]))
            return bt_error_printf(err, errlen, BT_ERR_INVALID, "logit bias %d: token id %d out of [0, %d) or NaN",
                                   (int)i, (int)ids[i], (int)s->n_vocab);
    int32_t *ni = n ? malloc((size_t)n * sizeof *ni) : NULL;
    float *nb = n ? malloc((size_t)n * sizeof *nb) : NULL;
    if (n && (!ni || !nb)) {
        free(ni);
        free(nb);
        return bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory for %d logit biases", (int)n);
    }
    if (n) {
        memcpy(ni, ids, (size_t)n * sizeof *ni);
        memcpy(nb, bias, (size_t)n * sizeof *nb);
    }
    free(s->bias_id);
    free(s->bias);
    s->bias_id = ni;
    s->bias = nb;
    s->n_bias = n;
    return BT_OK;
}

void bt_sampler_reset(bt_sampler *s) {
    memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->n_hist = s->hist_head = 0;
    bt_rng_seed(&s->rng, s->par.seed);
}

void bt_sampler_accept(bt_sampler *s, int32_t id) {
    if (id < 0 || id >= s->n_vocab || s->par.penalty_last_n == 0) return;
    if (s->par.penalty_last_n < 0) { /* all tokens: a list that grows */
        if (s->n_hist == s->n_hist_cap) {
            int32_t *h = realloc(s->hist, (size_t)s->n_hist_cap * 2 * sizeof *h);
            if (!h) { /* keep counting without the list: only the window needs it */
                s->count[id]++;
                return;
            }
            s->hist = h;
            s->n_hist_cap *= 2;
        }
        s->hist[s->n_hist++] = id;
        s->count[id]++;
        return;
    }
    if (s->n_hist == s->n_hist_cap) { /* the oldest leaves the window */
        int32_t old = s->hist[s->hist_head];
        s->count[old]--;
        s->hist[s->hist_head] = id;
        s->hist_head = (s->hist_head + 1) % s->n_hist_cap;
    } else {
        s->hist[(s->hist_head + s->n_hist) % s->n_hist_cap] = id;
        s->n_hist++;
    }
    s->count[id]++;
}

/* larger logit first, then smaller id */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* c[0..k) becomes the k first of c[0..n) in cand_cmp's order (a total
 * order, so the set is the one a full sort would keep), unsorted: a heap
 * whose root is the last of the k kept, replaced by any later candidate that
 * comes before it. */
static void heap_down(cand *h, int32_t k, int32_t i) {
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < k && cand_cmp(&h[l], &h[w]) > 0) w = l;
        if (r < k && cand_cmp(&h[r], &h[w]) > 0) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static int32_t top_k_select(cand *c, int32_t n, int32_t k) {
    for (int32_t i = k / 2 - 1; i >= 0; i--) heap_down(c, k, i);
    for (int32_t i = k; i < n; i++)
        if (cand_cmp(&c[i], &c[0]) < 0) {
            c[0] = c[i];
            heap_down(c, k, 0);
        }
    return k;
}

/* softmax of c[0..n) (sorted: c[0] is the largest) into .p */
static void softmax(cand *c, int32_t n) {
    double sum = 0, mx = c[0].logit;
    for (int32_t i = 0; i < n; i++) sum += c[i].p = exp((double)c[i].logit - mx);
    for (int32_t i = 0; i < n; i++) c[i].p /= sum;
}

/* c[i] = token i with its logit after logit_bias and the penalties */
static void fill(bt_sampler *s, const float *logits) {
    const bt_sampler_params *par = &s->par;
    int32_t n = s->n_vocab;
    for (int32_t i = 0; i < n; i++) s->c[i] = (cand){i, logits[i], 0};
    /* logit_bias (a token listed twice gets both) */
    for (int32_t i = 0; i < s->n_bias; i++) s->c[s->bias_id[i]].logit += s->bias[i];
    /* penalties (llama.cpp's llama_sampler_penalties_apply) */
    if (par->repeat_penalty != 1.0f || par->frequency_penalty != 0.0f || par->presence_penalty != 0.0f) {
        for (int32_t i = 0; i < n; i++) {
            int32_t k = s->count[i];
            if (!k) continue;
            float l = s->c[i].logit;
            l = l <= 0 ? l * par->repeat_penalty : l / par->repeat_penalty;
            l -= (float)k * par->frequency_penalty + par->presence_penalty;
            s->c[i].logit = l;
        }
    }
}

/* c[0..n) sorted (c[0] the largest): top-p, min-p and temperature; how many
 * are left, with the probabilities drawn from */
static int32_t filter_sorted(bt_sampler *s, int32_t n) {
    const bt_sampler_params *par = &s->par;
    /* top-p on the probabilities at temperature 1 */
    softmax(s->c, n);
    if (par->top_p < 1.0f) {
        double cum = 0;
        for (int32_t i = 0; i < n; i++) {
            cum += s->c[i].p;
            if (cum >= par->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    /* min-p: logit >= max + log(min_p) */
    if (par->min_p > 0.0f) {
        float thr = s->c[0].logit + logf(par->min_p);
        int32_t k = 1;
        while (k < n && s->c[k].logit >= thr) k++;
        n = k;
    }
    /* temperature, then the probabilities drawn from */
    for (int32_t i = 0; i < n; i++) s->c[i].logit /= par->temp;
    softmax(s->c, n);
    return n;
}

/* the first of the largest of c[0..n): its index */
static int32_t argmax(const bt_sampler *s, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (s->c[i].logit > s->c[best].logit) best = i;
    return best;
}

/* the chain after fill over c[0..n); returns how many candidates are left
 * (sorted, with their probabilities), or 0 for greedy (then c[0] is the
 * choice) */
static int32_t filter(bt_sampler *s, int32_t n) {
    const bt_sampler_params *par = &s->par;
    if (par->temp <= 0) { /* greedy: the first of the largest */
        int32_t best = argmax(s, n);
        cand t = s->c[0];
        s->c[0] = s->c[best];
        s->c[best] = t;
        return 0;
    }
    /* top-k: the k first in the order (larger logit, then smaller id) kept
     * in a heap, then sorted; a full sort of 150k candidates took 30-70 ms a
     * token, more than a small model's forward pass */
    if (par->top_k > 0 && par->top_k < n) n = top_k_select(s->c, n, par->top_k);
    qsort(s->c, (size_t)n, sizeof *s->c, cand_cmp);
    return filter_sorted(s, n);
}

static int32_t draw(bt_sampler *s, int32_t n) {
    if (n == 0) return s->c[0].id;
    double u = bt_rng_uniform(&s->rng), cum = 0;
    for (int32_t i = 0; i < n; i++) {
        cum += s->c[i].p;
        if (u < cum) return s->c[i].id;
    }
    return s->c[n - 1].id; /* u within rounding of 1 */
}

int32_t bt_sampler_sample(bt_sampler *s, const float *logits) {
    fill(s, logits);
    return draw(s, filter(s, s->n_vocab));
}

int32_t bt_sampler_sample_masked(bt_sampler *s, const float *logits, const uint8_t *allowed) {
    fill(s, logits);
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (allowed[i] && s->c[i].logit > -INFINITY) s->c[n++] = s->c[i];
    if (n == 0) return -1;
    return draw(s, filter(s, n));
}

int32_t bt_sampler_sample_checked(bt_sampler *s, const float *logits, bt_sampler_allow_fn allow, void *user) {
    const bt_sampler_params *par = &s->par;
    fill(s, logits);
    int32_t n = s->n_vocab;
    if (par->temp <= 0) { /* the masked choice is the best, if it is allowed */
        const cand *b = &s->c[argmax(s, n)];
        return b->logit > -INFINITY && allow(user, b->id) ? b->id : -1;
    }
    if (par->top_k <= 0) return -1; /* every allowed token counts: only the mask tells them */
    /* the masked top-k is the first k allowed tokens in cand_cmp's order:
     * walk the best m in that order, asking, until k are found */
    int32_t m = par->top_k > BT_SAMPLER_CHECK_MAX ? par->top_k : BT_SAMPLER_CHECK_MAX;
    if (m < n) n = top_k_select(s->c, n, m);
    qsort(s->c, (size_t)n, sizeof *s->c, cand_cmp);
    int32_t found = 0, asked = 0, i = 0;
    for (; i < n && found < par->top_k; i++) {
        if (s->c[i].logit == -INFINITY) break; /* the rest are -inf too: no more candidates anywhere */
        if (++asked > BT_SAMPLER_CHECK_MAX) return -1;
        if (allow(user, s->c[i].id)) s->c[found++] = s->c[i];
    }
    /* undecided: fewer than k found while candidates outside the m remain */
    if (found < par->top_k && i == n && n < s->n_vocab) return -1;
    if (found == 0) return -1;
    return draw(s, filter_sorted(s, found));
}

/* ---- log-probabilities ---- */

/* log p of a logit x, given the largest mx and log(sum exp(x - mx)) + mx as
 * lse (n_max: how many tokens hold a non-finite mx, 0 when it is finite) */
static float logprob_of(float x, float mx, double lse, int32_t n_max) {
    if (n_max) return x == mx ? (float)-log((double)n_max) : -INFINITY;
    return (float)((double)x - lse);
}

void bt_logprobs_compute(const float *logits, int32_t n_vocab, int32_t id, int32_t n_top, bt_logprobs *lp) {
    BT_ASSERT(n_vocab > 0 && id >= 0 && id < n_vocab && n_top >= 0 && n_top <= BT_MAX_TOP_LOGPROBS);
    /* the n_top largest logits, kept sorted by insertion: ids come in
     * increasing order, so an equal logit never displaces an earlier one */
    float mx = logits[0];
    int32_t k = 0;
    for (int32_t v = 0; v < n_vocab; v++) {
        const float x = logits[v];
        if (x > mx) mx = x;
        if (n_top == 0 || (k == n_top && !(x > logits[lp->top_id[k - 1]]))) continue;
        int32_t at = k < n_top ? k++ : k - 1;
        for (; at > 0 && x > logits[lp->top_id[at - 1]]; at--) lp->top_id[at] = lp->top_id[at - 1];
        lp->top_id[at] = v;
    }
    /* log(sum exp(x - max)) in double, in token order */
    double lse = 0;
    int32_t n_max = 0;
    if (isfinite(mx)) {
        double sum = 0;
        for (int32_t v = 0; v < n_vocab; v++) sum += exp((double)logits[v] - (double)mx);
        lse = (double)mx + log(sum);
    } else {
        for (int32_t v = 0; v < n_vocab; v++) n_max += logits[v] == mx;
    }
    lp->id = id;
    lp->logprob = logprob_of(logits[id], mx, lse, n_max);
    lp->n_top = k;
    for (int32_t i = 0; i < k; i++) lp->top_logprob[i] = logprob_of(logits[lp->top_id[i]], mx, lse, n_max);
}
