/* batcher.c - continuous batching over an engine on rank 0 (batcher.h): the
 * request slots, the inbox other threads write into, the ubatches formed from
 * the sequences that are ready, and the sampling of the rows that come back.
 *
 * A slot's life: FREE -> PROMPT (prompt tokens left to submit; chunks follow
 * each other without waiting) -> WAIT (the ubatch holding its last token is in
 * flight) -> READY (a sampled token to submit) -> WAIT ... -> FREE (stop,
 * limit, cancel).  A ubatch remembers, for each row of logits it asked for,
 * the slot and the request id: a row whose request has ended in the meantime
 * (cancelled) is dropped, so a slot can be reused at once (the engine removes
 * the old sequence's cells before the new one's tokens land, in submission
 * order).
 *
 * An embedding request (pooling) is only a prompt: its chunks go in ubatches
 * of their own that ask for hidden states (BT_LLM_OUT_EMBD: the engine's
 * graph stops before the output projection), formed when no generation
 * work is ready; its rows are pooled as they come back, in token order. */
#define _GNU_SOURCE /* clock_gettime, pthread_cond_timedwait */
#include "batcher.h"
#include "../mem.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../text/stop.h"

#ifndef BT_BATCHER_MAX_TRIGGER
#define BT_BATCHER_MAX_TRIGGER 64 /* bytes of a grammar's trigger */
#endif

/* the shortest prompt chunk cut for the pipeline's sake (n_ubatch still bounds every ubatch) */
#ifndef BT_BATCHER_MIN_CHUNK
#define BT_BATCHER_MIN_CHUNK 32
#endif

/* SLOT_FOLLOW: a choice past the first of an n > 1 request, waiting for
 * the first choice's prompt (its cells are copied in once it is submitted) */
enum slot_state { SLOT_FREE = 0, SLOT_PROMPT, SLOT_WAIT, SLOT_READY, SLOT_FOLLOW };

struct slot {
    enum slot_state state;
    uint64_t id;
    struct bt_gen_request req; /* callbacks, user, sampling (prompt / stops: the copies below) */
    int32_t *prompt;
    size_t n_prompt, n_sub;    /* prompt tokens, and how many are submitted */
    bt_sampler *smp;
    bt_stopper *stop;
    bt_constraint *con;        /* a request with a grammar: its state (made at its first constrained sample) */
    int32_t shown;             /* req.shown_control's token (-1: none) */
    bool waiting;              /* a grammar with a trigger not seen yet: the output is free */
    /* waiting: the output's last bytes, where the trigger may be ending */
    char win[BT_BATCHER_MAX_TRIGGER];
    size_t n_win;
    int32_t next;              /* READY: the token to submit */
    int32_t pos;               /* the position of the next token submitted */
    int64_t n_gen;
    int64_t n_cached;          /* prompt tokens whose cells were kept from the slot's last request */
    double t_sub, t_first, t_last;
    double *acc;               /* embedding: the rows' sum so far [n_embd] */
    int64_t n_acc;             /* embedding: rows taken */
    /* kept while the slot is free: the tokens its cells hold, by position
     * (0 .. n_cells - 1: every token submitted), and when it was last taken */
    int32_t *cell_tok;         /* [share] */
    int64_t n_cells;
    uint64_t last_use;
    int leader;                /* a later choice: the slot of its request's first choice (-1: none) */
    bool first_row;            /* a later choice in WAIT: its first token comes from the leader's row */
};

/* an add waiting in the inbox: the request and its own copies */
struct pending_add {
    uint64_t id;
    int choice;      /* its index among its request's choices (the first: 0) */
    struct bt_gen_request req;
    int32_t *prompt;
    bt_sampler *smp;
    bt_stopper *stop;
    int32_t shown; /* req.shown_control's token (-1: none) */
    double *acc;
};

/* a ubatch in flight: its tokens (kept until collected) and, per row of
 * logits, which request it belongs to */
struct flight {
    uint64_t engine_id;
    enum bt_llm_out kind; /* rows of logits, or of hidden states (embedding requests) */
    int64_t n_tokens, n_rows, n_decode;
    int32_t *token, *pos, *seq;
    int8_t *logits;
    int *row_slot;
    uint64_t *row_req;
};

struct bt_batcher {
    struct bt_engine *e;
    const bt_tokenizer *tok;
    int n_seq;
    int64_t n_ubatch, n_vocab, share; /* share: cells of one sequence */
    int64_t n_embd;
    int max_inflight;
    int n_stages;      /* ranks that hold layers: ubatches the pipeline works on at once */
    struct slot *slots;

    struct flight *fl; /* ring of max_inflight */
    int fl_head, fl_n;
    float *logits;     /* n_ubatch x n_vocab */
    float *hidden;     /* n_ubatch x n_embd: an embedding ubatch's rows */
    float *vec;        /* n_embd: a pooled embedding */
    int32_t *eog;      /* the vocabulary's end-of-generation ids (min_tokens bans them) */
    float *eog_raw;    /* their logits in a row before the ban (the log-probabilities are the model's) */
    float *row_keep, *row_tmp; /* n_vocab each: a leader's row for its later choices */
    int32_t n_eog;
    bt_token_trie *trie; /* the vocabulary's pieces, made for the first request with a grammar */
    uint8_t *allowed;    /* n_vocab: the tokens a grammar allows now */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu: */
    struct pending_add *adds, *adds_taken; /* adds_taken: drain_inbox's copy */
    int n_adds;
    uint64_t *cancels;
    int n_cancels, cap_cancels;
    int n_taken;       /* slots not FREE */
    uint64_t next_id;
    bool failed;
    uint64_t clock;    /* slots taken so far (least recently used) */

    struct bt_batcher_stats stats;
    char error[1024];
};

const char *bt_finish_name(enum bt_finish f) {
    switch (f) {
    case BT_FINISH_STOP: return "stop";
    case BT_FINISH_LENGTH: return "length";
    case BT_FINISH_CANCELLED: return "cancelled";
    case BT_FINISH_ERROR: return "error";
    }
    return "?";
}

void bt_batcher_default_params(struct bt_batcher_params *p) {
    p->n_ubatch = 0;
    p->max_inflight = 0;
}

static void flight_free(struct flight *f) {
    BT_FREE_ALL(f->token, f->pos, f->seq, f->logits, f->row_slot, f->row_req);
}

void bt_batcher_free(struct bt_batcher *b) {
    if (!b) return;
    /* what is in flight is collected and dropped: the engine is left with
     * nothing of this batcher's in flight */
    while (!b->failed && b->fl_n > 0) {
        uint64_t got;
        int64_t n_out;
        float *into = b->fl[b->fl_head].kind == BT_LLM_OUT_EMBD ? b->hidden : b->logits;
        if (bt_engine_collect(b->e, &got, into, &n_out) != BT_OK) b->failed = true;
        b->fl_head = (b->fl_head + 1) % b->max_inflight;
        b->fl_n--;
    }
    for (int s = 0; s < b->n_seq; s++) {
        struct slot *sl = &b->slots[s];
        if (sl->state == SLOT_FREE) continue;
        if (!b->failed) bt_engine_seq_rm(b->e, s);
        struct bt_gen_result r = {sl->id, BT_FINISH_CANCELLED, (int64_t)sl->n_prompt, sl->n_gen, 0, 0, sl->n_cached};
        if (sl->req.on_done) sl->req.on_done(sl->req.user, &r);
        free(sl->prompt);
        free(sl->acc);
        bt_sampler_free(sl->smp);
        bt_stopper_free(sl->stop);
        bt_constraint_free(sl->con);
    }
    for (int i = 0; i < b->n_adds; i++) {
        struct pending_add *a = &b->adds[i];
        struct bt_gen_result r = {a->id, BT_FINISH_CANCELLED, (int64_t)a->req.n_prompt, 0, 0, 0, 0};
        if (a->req.on_done) a->req.on_done(a->req.user, &r);
        free(a->prompt);
        free(a->acc);
        bt_sampler_free(a->smp);
        bt_stopper_free(a->stop);
    }
    /* the cells free slots kept for reuse go too: the engine is left empty of this batcher's */
    for (int s = 0; !b->failed && b->slots && s < b->n_seq; s++)
        if (b->slots[s].state == SLOT_FREE && b->slots[s].n_cells > 0 && bt_engine_seq_rm(b->e, s) != BT_OK)
            b->failed = true;
    for (int i = 0; i < b->max_inflight && b->fl; i++) flight_free(&b->fl[i]);
    for (int s = 0; s < b->n_seq && b->slots; s++) free(b->slots[s].cell_tok);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    bt_token_trie_free(b->trie);
    BT_FREE_ALL(b->fl, b->slots, b->adds, b->adds_taken, b->cancels, b->logits, b->hidden, b->vec, b->eog, b->eog_raw,
                b->row_keep, b->row_tmp, b->allowed, b);
}

enum bt_status bt_batcher_new(struct bt_engine *e, const bt_tokenizer *tok, const struct bt_batcher_params *p,
                              struct bt_batcher **out, char *err, size_t n_err) {
    *out = NULL;
    const struct bt_engine_params *ep = bt_engine_params(e);
    const struct bt_hparams *hp = bt_engine_hparams(e);
    if (p->n_ubatch < 0 || p->max_inflight < 0) {
        snprintf(err, n_err, "batcher: n_ubatch %lld and max_inflight %d must not be negative", (long long)p->n_ubatch,
                 p->max_inflight);
        return BT_ERR_INVALID;
    }
    if ((int64_t)bt_tokenizer_n_tokens(tok) > hp->n_vocab) {
        snprintf(err, n_err, "the vocabulary has %u tokens but the model's output has %lld rows",
                 bt_tokenizer_n_tokens(tok), (long long)hp->n_vocab);
        return BT_ERR_INVALID;
    }
    struct bt_batcher *b = calloc(1, sizeof *b);
    if (!b) goto nomem;
    b->e = e;
    b->tok = tok;
    b->n_seq = ep->n_seq_max;
    b->n_vocab = hp->n_vocab;
    b->n_embd = hp->n_embd;
    b->share = ep->n_ctx / ep->n_seq_max;
    b->n_ubatch = p->n_ubatch > 0 && p->n_ubatch < ep->n_ubatch ? p->n_ubatch : ep->n_ubatch;
    b->max_inflight = p->max_inflight > 0   ? p->max_inflight
                      : ep->max_inflight > 0 ? ep->max_inflight
                                             : 2 * bt_engine_n_ranks(e);
    b->n_stages = 0;
    for (int r = 0; r < bt_engine_n_ranks(e); r++) {
        int il0 = 0, il1 = 0;
        bt_engine_range(e, r, &il0, &il1);
        b->n_stages += il1 > il0;
    }
    if (b->n_stages < 1) b->n_stages = 1;
    b->next_id = 1;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->slots = calloc((size_t)b->n_seq, sizeof *b->slots);
    b->adds = calloc((size_t)b->n_seq, sizeof *b->adds);
    b->adds_taken = calloc((size_t)b->n_seq, sizeof *b->adds_taken);
    b->fl = calloc((size_t)b->max_inflight, sizeof *b->fl);
    /* collect writes the rows a ubatch asked for: at most one per sequence
     * (a decode token, or a prompt's last token), so not n_ubatch rows of a
     * vocabulary that may be 150k wide */
    const int64_t max_rows = b->n_seq < b->n_ubatch ? b->n_seq : b->n_ubatch;
    b->logits = malloc((size_t)max_rows * (size_t)b->n_vocab * sizeof(float));
    b->hidden = malloc((size_t)b->n_ubatch * (size_t)b->n_embd * sizeof(float));
    b->vec = malloc((size_t)b->n_embd * sizeof(float));
    b->row_keep = malloc((size_t)b->n_vocab * sizeof(float));
    b->row_tmp = malloc((size_t)b->n_vocab * sizeof(float));
    if (!b->row_keep || !b->row_tmp) goto nomem;
    if (!b->slots || !b->adds || !b->adds_taken || !b->fl || !b->logits || !b->hidden || !b->vec) goto nomem;
    for (int s = 0; s < b->n_seq; s++)
        if (!(b->slots[s].cell_tok = malloc((size_t)b->share * sizeof *b->slots[s].cell_tok))) goto nomem;
    for (int pass = 0; pass < 2; pass++) { /* count, then list */
        for (uint32_t id = 0; id < bt_tokenizer_n_tokens(tok); id++)
            if (bt_tokenizer_is_eog(tok, (int32_t)id)) {
                if (pass) b->eog[b->n_eog] = (int32_t)id;
                b->n_eog++;
            }
        if (pass == 0 && (!(b->eog = malloc(((size_t)b->n_eog + 1) * sizeof *b->eog)) ||
                          !(b->eog_raw = malloc(((size_t)b->n_eog + 1) * sizeof *b->eog_raw))))
            goto nomem;
        if (pass == 0) b->n_eog = 0;
    }
    for (int i = 0; i < b->max_inflight; i++) {
        struct flight *f = &b->fl[i];
        const size_t n = (size_t)b->n_ubatch;
        f->token = malloc(n * sizeof *f->token);
        f->pos = malloc(n * sizeof *f->pos);
        f->seq = malloc(n * sizeof *f->seq);
        f->logits = malloc(n);
        f->row_slot = malloc(n * sizeof *f->row_slot);
        f->row_req = malloc(n * sizeof *f->row_req);
        if (!f->token || !f->pos || !f->seq || !f->logits || !f->row_slot || !f->row_req) goto nomem;
    }
    *out = b;
    return BT_OK;
nomem:
    bt_batcher_free(b);
    snprintf(err, n_err, "batcher: out of memory");
    return BT_ERR_NOMEM;
}

/* ---- any thread ---- */

/* Queue a[0..n) (one request's choices, one slot each) as the next adds,
 * with one id (into *id); on a refusal none is taken. */
static enum bt_status queue_add(struct bt_batcher *b, struct pending_add *a, int n, uint64_t *id, char *err,
                                size_t n_err) {
    enum bt_status st = BT_OK;
    pthread_mutex_lock(&b->mu);
    if (b->failed) {
        snprintf(err, n_err, "the engine has failed: %s", b->error);
        st = BT_ERR_COMM;
    } else if (b->n_taken + b->n_adds + n > b->n_seq) {
        if (n == 1)
            snprintf(err, n_err, "all %d sequences are busy", b->n_seq);
        else
            snprintf(err, n_err, "%d of %d sequences are busy: %d choices do not fit", b->n_taken + b->n_adds,
                     b->n_seq, n);
        st = BT_ERR_CAPACITY;
    } else {
        *id = b->next_id++;
        for (int i = 0; i < n; i++) {
            a[i].id = *id;
            b->adds[b->n_adds++] = a[i];
        }
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return st;
}

/* bt_batcher_add of an embedding request (checked by the caller but for pooling) */
static enum bt_status add_embedding(struct bt_batcher *b, const struct bt_gen_request *req, uint64_t *id, char *err,
                                    size_t n_err) {
    struct pending_add a = {0};
    a.shown = -1;
    a.req = *req;
    a.req.prompt = NULL;
    a.req.stops = NULL;
    a.req.n_stops = 0;
    a.req.bias_ids = NULL;
    a.req.bias = NULL;
    a.req.n_bias = 0;
    a.prompt = malloc(req->n_prompt * sizeof *a.prompt);
    a.acc = calloc((size_t)b->n_embd, sizeof *a.acc);
    if (!a.prompt || !a.acc) {
        free(a.prompt);
        free(a.acc);
        snprintf(err, n_err, "out of memory for a prompt of %zu tokens", req->n_prompt);
        return BT_ERR_NOMEM;
    }
    memcpy(a.prompt, req->prompt, req->n_prompt * sizeof *a.prompt);
    const enum bt_status st = queue_add(b, &a, 1, id, err, n_err);
    if (st != BT_OK) {
        free(a.prompt);
        free(a.acc);
    }
    return st;
}

/* The control token whose text is text (NULL, or none such: -1) */
static int32_t shown_control(const bt_tokenizer *tok, const char *text) {
    const int32_t id = text ? bt_tokenizer_find(tok, text, strlen(text)) : BT_TOKEN_NONE;
    size_t len;
    if (id < 0) return -1;
    bt_tokenizer_piece(tok, id, 0, &len);
    return len == 0 ? id : -1;
}

/* Choice i of a checked generation request: its own copy of the prompt,
 * stopper and sampler (seed + i), and its user. */
static enum bt_status make_choice(struct bt_batcher *b, const struct bt_gen_request *req, int i, struct pending_add *a,
                                  char *err, size_t n_err) {
    /* the sequence's cells: the prompt, then every sampled token but the last */
    const int64_t room = b->share - (int64_t)req->n_prompt + 1;
    const int64_t max_tokens = req->max_tokens < 0 || req->max_tokens > room ? room : req->max_tokens;
    a->req = *req;
    a->choice = i;
    if (req->n_choices > 1) a->req.user = req->choice_users[i];
    a->req.sampling.seed = req->sampling.seed + (uint64_t)i;
    a->prompt = malloc(req->n_prompt * sizeof *a->prompt);
    if (!a->prompt) {
        snprintf(err, n_err, "out of memory for a prompt of %zu tokens", req->n_prompt);
        return BT_ERR_NOMEM;
    }
    memcpy(a->prompt, req->prompt, req->n_prompt * sizeof *a->prompt);
    enum bt_status st = bt_stopper_create(req->stops, req->n_stops, max_tokens, &a->stop, err, n_err);
    if (st == BT_OK) st = bt_sampler_create(&a->req.sampling, (int32_t)b->n_vocab, &a->smp, err, n_err);
    if (st == BT_OK && req->n_bias > 0)
        st = bt_sampler_set_bias(a->smp, req->bias_ids, req->bias, (int32_t)req->n_bias, err, n_err);
    if (st == BT_OK) {
        a->shown = shown_control(b->tok, req->shown_control);
        bt_stopper_show_token(a->stop, a->shown);
        bt_stopper_set_ignore_eog(a->stop, req->ignore_eos);
        for (size_t k = 0; k < req->n_prompt; k++) bt_sampler_accept(a->smp, a->prompt[k]);
    }
    a->req.prompt = NULL;
    a->req.stops = NULL;
    a->req.n_stops = 0;
    a->req.bias_ids = NULL;
    a->req.bias = NULL;
    a->req.n_bias = 0;
    a->req.choice_users = NULL;
    return st;
}

enum bt_status bt_batcher_add(struct bt_batcher *b, const struct bt_gen_request *req, uint64_t *id, char *err,
                              size_t n_err) {
    if (!req->prompt || req->n_prompt == 0) {
        snprintf(err, n_err, "the prompt is empty");
        return BT_ERR_INVALID;
    }
    if ((int64_t)req->n_prompt > b->share) {
        snprintf(err, n_err,
                 "the prompt has %zu tokens but a sequence holds at most %lld (the context of %lld tokens shared by "
                 "%d sequences)",
                 req->n_prompt, (long long)b->share, (long long)bt_engine_params(b->e)->n_ctx, b->n_seq);
        return BT_ERR_INVALID;
    }
    for (size_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= (int32_t)b->n_vocab) {
            snprintf(err, n_err, "prompt token %zu: id %d is not in the vocabulary [0, %lld)", i,
                     (int)req->prompt[i], (long long)b->n_vocab);
            return BT_ERR_INVALID;
        }
    if (req->pooling != BT_POOLING_NONE) {
        if (req->n_choices > 1) {
            snprintf(err, n_err, "an embedding has one choice, not %d", req->n_choices);
            return BT_ERR_INVALID;
        }
        if (req->pooling != BT_POOLING_MEAN && req->pooling != BT_POOLING_LAST) {
            snprintf(err, n_err, "pooling %d: not mean (1) or last (2)", (int)req->pooling);
            return BT_ERR_INVALID;
        }
        return add_embedding(b, req, id, err, n_err);
    }
    if (bt_sampler_params_check(&req->sampling, err, n_err) != BT_OK) return BT_ERR_INVALID;
    if (req->min_tokens < 0) {
        snprintf(err, n_err, "min_tokens %lld: must not be negative", (long long)req->min_tokens);
        return BT_ERR_INVALID;
    }
    if (req->logprobs && (req->top_logprobs < 0 || req->top_logprobs > BT_MAX_TOP_LOGPROBS)) {
        snprintf(err, n_err, "top_logprobs %d: must be between 0 and %d", (int)req->top_logprobs,
                 BT_MAX_TOP_LOGPROBS);
        return BT_ERR_INVALID;
    }
    if (req->logprobs && (req->top_logprobs < 0 || req->top_logprobs > BT_MAX_TOP_LOGPROBS)) {
        snprintf(err, n_err, "top_logprobs %d: must be between 0 and %d", (int)req->top_logprobs,
                 BT_MAX_TOP_LOGPROBS);
        return BT_ERR_INVALID;
    }
    if (req->grammar_trigger &&
        (!req->grammar || !req->grammar_trigger[0] || strlen(req->grammar_trigger) > BT_BATCHER_MAX_TRIGGER)) {
        snprintf(err, n_err, "a grammar's trigger must be 1 to %d bytes, with a grammar", BT_BATCHER_MAX_TRIGGER);
        return BT_ERR_INVALID;
    }
    if (req->grammar && req->ignore_eos) {
        snprintf(err, n_err, "ignore_eos with a grammar: the output could not end where the grammar is complete");
        return BT_ERR_INVALID;
    }
    if (req->max_tokens == 0 || req->max_tokens < -1) {
        snprintf(err, n_err, "max_tokens %lld: the number of tokens to generate must be positive (or -1: no limit)",
                 (long long)req->max_tokens);
        return BT_ERR_INVALID;
    }
    const int n = req->n_choices > 1 ? req->n_choices : 1;
    if (req->n_choices < 0 || n > b->n_seq || (n > 1 && !req->choice_users)) {
        snprintf(err, n_err, "%d choices: between 1 and the %d sequence slots, each with its user", req->n_choices,
                 b->n_seq);
        return BT_ERR_INVALID;
    }
    struct pending_add *a = calloc((size_t)n, sizeof *a);
    if (!a) {
        snprintf(err, n_err, "out of memory for %d choices", n);
        return BT_ERR_NOMEM;
    }
    enum bt_status st = BT_OK;
    for (int i = 0; i < n && st == BT_OK; i++) st = make_choice(b, req, i, &a[i], err, n_err);
    if (st == BT_OK) st = queue_add(b, a, n, id, err, n_err);
    if (st != BT_OK)
        for (int i = 0; i < n; i++) {
            free(a[i].prompt);
            bt_sampler_free(a[i].smp);
            bt_stopper_free(a[i].stop);
        }
    free(a); /* queued: copied into the inbox */
    return st;
}

void bt_batcher_cancel(struct bt_batcher *b, uint64_t id) {
    pthread_mutex_lock(&b->mu);
    if (b->n_cancels == b->cap_cancels) {
        const int c = b->cap_cancels ? 2 * b->cap_cancels : 16;
        uint64_t *p = realloc(b->cancels, (size_t)c * sizeof *p);
        if (!p) { /* cannot record it: the request runs to its end instead */
            pthread_mutex_unlock(&b->mu);
            return;
        }
        b->cancels = p;
        b->cap_cancels = c;
    }
    b->cancels[b->n_cancels++] = id;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

int bt_batcher_n_free(struct bt_batcher *b) {
    pthread_mutex_lock(&b->mu);
    const int n = b->failed ? 0 : b->n_seq - b->n_taken - b->n_adds;
    pthread_mutex_unlock(&b->mu);
    return n;
}

void bt_batcher_wait(struct bt_batcher *b, int timeout_ms) {
    pthread_mutex_lock(&b->mu);
    if (timeout_ms < 0) {
        while (b->n_adds == 0 && b->n_cancels == 0) pthread_cond_wait(&b->cv, &b->mu);
    } else {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (b->n_adds == 0 && b->n_cancels == 0)
            if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&b->mu);
}

/* ---- the step thread ---- */

/* End slot s's request: its cells go, on_done, the slot is free. */
static void finish(struct bt_batcher *b, int s, enum bt_finish why) {
    struct slot *sl = &b->slots[s];
    BT_ASSERT(sl->state != SLOT_FREE);
    /* a generation's cells stay for the next request to reuse (its tokens up
     * to the last one submitted); an embedding's and a failed one's go */
    const bool keep = why != BT_FINISH_ERROR && sl->req.pooling == BT_POOLING_NONE;
    if (why != BT_FINISH_ERROR && !keep && bt_engine_seq_rm(b->e, s) != BT_OK) {
        /* the engine is broken: this request and then every other ends */
        snprintf(b->error, sizeof b->error, "%s", bt_engine_error(b->e));
        pthread_mutex_lock(&b->mu);
        b->failed = true;
        pthread_mutex_unlock(&b->mu);
        why = BT_FINISH_ERROR;
    }
    struct bt_gen_result r = {
        .id = sl->id,
        .finish = why,
        .n_prompt = (int64_t)sl->n_prompt,
        .n_cached = sl->n_cached,
        .n_gen = sl->n_gen,
        .t_prompt_s = sl->n_gen > 0 ? sl->t_first - sl->t_sub : 0,
        .t_gen_s = sl->n_gen > 0 ? sl->t_last - sl->t_first : 0,
    };
    const struct bt_gen_request req = sl->req;
    free(sl->prompt);
    free(sl->acc);
    bt_sampler_free(sl->smp);
    bt_stopper_free(sl->stop);
    bt_constraint_free(sl->con);
    int32_t *cell_tok = sl->cell_tok;
    const int64_t n_cells = keep ? (int64_t)sl->pos : 0;
    const uint64_t last_use = sl->last_use;
    memset(sl, 0, sizeof *sl);
    sl->cell_tok = cell_tok;
    sl->n_cells = n_cells;
    sl->last_use = last_use;
    pthread_mutex_lock(&b->mu);
    b->n_taken--;
    pthread_mutex_unlock(&b->mu);
    if (req.on_done) req.on_done(req.user, &r);
}

/* The engine failed: every request ends with BT_FINISH_ERROR. */
static enum bt_status fail(struct bt_batcher *b, enum bt_status st) {
    if (!b->failed) snprintf(b->error, sizeof b->error, "%s", bt_engine_error(b->e));
    pthread_mutex_lock(&b->mu);
    b->failed = true;
    pthread_mutex_unlock(&b->mu);
    for (int s = 0; s < b->n_seq; s++)
        if (b->slots[s].state != SLOT_FREE) finish(b, s, BT_FINISH_ERROR);
    b->fl_n = 0;
    return st == BT_OK ? BT_ERR_COMM : st;
}

/* The free slot for a request with prompt[0..n): with reuse, the one whose
 * cells share the longest prefix with the prompt (at most n - 1 tokens: the
 * last prompt token is computed again for its logits; none where the engine
 * could not keep them bitwise, bt_engine_seq_reusable); when none shares
 * any, an empty one, else the least recently used.  *keep: the prompt
 * tokens whose cells it keeps. */
static int pick_slot(struct bt_batcher *b, const int32_t *prompt, size_t n, bool reuse, int64_t *keep) {
    int best = -1;
    int64_t best_k = -1;
    for (int s = 0; s < b->n_seq; s++) {
        const struct slot *sl = &b->slots[s];
        if (sl->state != SLOT_FREE) continue;
        int64_t k = 0;
        while (reuse && k < sl->n_cells && k + 1 < (int64_t)n && sl->cell_tok[k] == prompt[k]) k++;
        if (k > 0 && !bt_engine_seq_reusable(b->e, s, (int32_t)k)) k = 0;
        bool better = k > best_k;
        if (k == best_k && k == 0) { /* nothing shared: an empty slot, else the oldest */
            const struct slot *o = &b->slots[best];
            better = (sl->n_cells == 0) != (o->n_cells == 0) ? sl->n_cells == 0 : sl->last_use < o->last_use;
        } else if (k == best_k) { /* as much shared: the one that loses fewer cells, else the oldest */
            const struct slot *o = &b->slots[best];
            better = sl->n_cells != o->n_cells ? sl->n_cells < o->n_cells : sl->last_use < o->last_use;
        }
        if (better) {
            best = s;
            best_k = k;
        }
    }
    *keep = best_k;
    return best;
}

/* Take the inbox: new requests into free slots, cancels. */
static void drain_inbox(struct bt_batcher *b) {
    pthread_mutex_lock(&b->mu);
    int n_adds = b->n_adds, n_cancels = b->n_cancels;
    struct pending_add *adds = b->adds_taken;
    memcpy(adds, b->adds, (size_t)n_adds * sizeof *adds);
    b->n_adds = 0;
    uint64_t *cancels = b->cancels;
    b->cancels = NULL;
    b->n_cancels = b->cap_cancels = 0;
    b->n_taken += n_adds; /* add counted them against the slots already */
    pthread_mutex_unlock(&b->mu);

    int lead = -1;
    for (int i = 0; i < n_adds; i++) {
        const struct bt_gen_request *rq = &adds[i].req;
        int64_t keep = 0;
        /* a later choice takes an empty (or the oldest) slot: the first's prompt cells are copied in */
        const bool reuse = !rq->no_reuse && rq->pooling == BT_POOLING_NONE && adds[i].choice == 0;
        const int s = pick_slot(b, adds[i].prompt, rq->n_prompt, reuse, &keep);
        BT_ASSERT(s >= 0); /* a free one exists: add checked */
        struct slot *sl = &b->slots[s];
        /* the cells past the shared part go, on every rank, before this request's tokens */
        if (sl->n_cells > keep && bt_engine_seq_trim(b->e, s, (int32_t)keep) != BT_OK) {
            snprintf(b->error, sizeof b->error, "%s", bt_engine_error(b->e));
            pthread_mutex_lock(&b->mu);
            b->failed = true;
            pthread_mutex_unlock(&b->mu);
        }
        sl->n_cells = keep;
        sl->n_cached = keep;
        sl->n_sub = (size_t)keep;
        sl->pos = (int32_t)keep;
        sl->last_use = ++b->clock;
        b->stats.cached_tokens += (uint64_t)keep;
        sl->state = SLOT_PROMPT;
        sl->leader = -1;
        if (adds[i].choice == 0) {
            lead = s;
        } else {
            BT_ASSERT(lead >= 0 && b->slots[lead].id == adds[i].id);
            sl->state = SLOT_FOLLOW;
            sl->leader = lead;
        }
        sl->id = adds[i].id;
        sl->req = adds[i].req;
        sl->prompt = adds[i].prompt;
        sl->n_prompt = adds[i].req.n_prompt;
        sl->smp = adds[i].smp;
        sl->stop = adds[i].stop;
        sl->shown = adds[i].shown;
        sl->acc = adds[i].acc;
        sl->waiting = sl->req.grammar && sl->req.grammar_trigger;
    }
    for (int i = 0; i < n_cancels; i++)
        for (int s = 0; s < b->n_seq; s++)
            if (b->slots[s].state != SLOT_FREE && b->slots[s].id == cancels[i]) finish(b, s, BT_FINISH_CANCELLED);
    free(cancels);
}

/* Fill f with what is ready: one decode token per READY slot (at most
 * max_decode of them), then prompt chunks (at most max_prompt tokens);
 * false when nothing is.  kind EMBD: the prompt chunks of embedding
 * requests only (a row for each token with mean pooling, for the last with
 * last pooling); LOGITS: the others'. */
static bool form_ubatch(struct bt_batcher *b, struct flight *f, enum bt_llm_out kind, int64_t max_decode,
                        int64_t max_prompt, double t) {
    f->n_tokens = f->n_rows = 0;
    f->kind = kind;
    int64_t n_decode = 0;
    if (kind == BT_LLM_OUT_EMBD) max_decode = 0;
    for (int s = 0; s < b->n_seq && f->n_tokens < b->n_ubatch && n_decode < max_decode; s++) {
        struct slot *sl = &b->slots[s];
        if (sl->state != SLOT_READY) continue;
        const int64_t i = f->n_tokens++;
        f->token[i] = sl->next;
        sl->cell_tok[sl->pos] = sl->next;
        f->pos[i] = sl->pos++;
        f->seq[i] = s;
        f->logits[i] = 1;
        f->row_slot[f->n_rows] = s;
        f->row_req[f->n_rows++] = sl->id;
        sl->state = SLOT_WAIT;
        n_decode++;
    }
    f->n_decode = n_decode;
    const int64_t end = f->n_tokens + max_prompt < b->n_ubatch ? f->n_tokens + max_prompt : b->n_ubatch;
    for (int s = 0; s < b->n_seq && f->n_tokens < end; s++) {
        struct slot *sl = &b->slots[s];
        if (sl->state != SLOT_PROMPT || (sl->req.pooling != BT_POOLING_NONE) != (kind == BT_LLM_OUT_EMBD)) continue;
        if (sl->t_sub == 0) sl->t_sub = t;
        size_t n = sl->n_prompt - sl->n_sub;
        if ((int64_t)n > end - f->n_tokens) n = (size_t)(end - f->n_tokens);
        for (size_t k = 0; k < n; k++) {
            const int64_t i = f->n_tokens++;
            f->token[i] = sl->prompt[sl->n_sub];
            sl->cell_tok[sl->pos] = f->token[i];
            f->pos[i] = sl->pos++;
            f->seq[i] = s;
            f->logits[i] = 0;
            sl->n_sub++;
            if (sl->req.pooling == BT_POOLING_MEAN || (sl->req.pooling == BT_POOLING_LAST && sl->n_sub == sl->n_prompt)) {
                f->logits[i] = 1;
                f->row_slot[f->n_rows] = s;
                f->row_req[f->n_rows++] = sl->id;
            }
        }
        if (sl->req.pooling != BT_POOLING_NONE) {
            if (sl->n_sub == sl->n_prompt) sl->state = SLOT_WAIT;
            continue;
        }
        b->stats.prompt_tokens += n;
        if (sl->n_sub == sl->n_prompt) { /* the prompt's last token gives the first logits */
            f->logits[f->n_tokens - 1] = 1;
            f->row_slot[f->n_rows] = s;
            f->row_req[f->n_rows++] = sl->id;
            sl->state = SLOT_WAIT;
        }
    }
    return f->n_tokens > 0;
}

/* what bt_sampler_sample_checked asks: may this token come next */
struct allow_ctx {
    bt_constraint *con;
    bool end_ok;
};
static bool allow_token(void *user, int32_t id) {
    struct allow_ctx *a = user;
    return bt_constraint_allows(a->con, id, a->end_ok);
}

/* sl's grammar state, before any byte (and the batcher's trie and mask);
 * false with b->error when out of memory */
static bool start_constraint(struct bt_batcher *b, struct slot *sl) {
    if (!b->trie && bt_token_trie_new(b->tok, &b->trie, b->error, sizeof b->error) != BT_OK) return false;
    if ((!b->allowed && !(b->allowed = malloc((size_t)b->n_vocab))) ||
        !(sl->con = bt_constraint_new(sl->req.grammar, b->trie))) {
        snprintf(b->error, sizeof b->error, "out of memory for a grammar's state");
        return false;
    }
    bt_constraint_show_token(sl->con, sl->shown);
    return true;
}

/* A waiting slot's free token: when the output now ends with the trigger,
 * the grammar starts, fed the trigger and what the token holds after it.
 * Those bytes refused, or no memory for the state: the output stays free. */
static void watch_trigger(struct bt_batcher *b, struct slot *sl, int32_t id) {
    const char *trig = sl->req.grammar_trigger;
    const size_t tn = strlen(trig);
    size_t len;
    const char *p = bt_tokenizer_piece(b->tok, id, id == sl->shown, &len);
    for (size_t i = 0; i < len; i++) {
        if (sl->n_win == BT_BATCHER_MAX_TRIGGER) memmove(sl->win, sl->win + 1, --sl->n_win);
        sl->win[sl->n_win++] = p[i];
        if (sl->n_win < tn || memcmp(sl->win + sl->n_win - tn, trig, tn)) continue;
        sl->waiting = false;
        if (!start_constraint(b, sl)) return;
        bool ok = true;
        for (size_t k = 0; k < tn && ok; k++) ok = bt_constraint_accept_byte(sl->con, (uint8_t)trig[k]);
        for (size_t k = i + 1; k < len && ok; k++) ok = bt_constraint_accept_byte(sl->con, (uint8_t)p[k]);
        if (!ok) {
            bt_constraint_free(sl->con);
            sl->con = NULL;
            sl->req.grammar = NULL; /* free text to the end */
        }
        return;
    }
}

/* Slot s's next token under its grammar, the same as sampling over the
 * allowed tokens only: the sampled choice checked first, the whole
 * vocabulary's mask when that does not settle it.  The end may come where
 * the grammar is complete, after min_tokens, or at once where nothing else
 * can follow.  -1: the request has ended (no token continues the grammar,
 * or out of memory; b->error says which). */
static int32_t sample_constrained(struct bt_batcher *b, int s, const float *row) {
    struct slot *sl = &b->slots[s];
    if (!sl->con && !start_constraint(b, sl)) goto end;
    const bool end_ok =
        bt_constraint_complete(sl->con) && (sl->n_gen >= sl->req.min_tokens || bt_constraint_closed(sl->con));
    struct allow_ctx a = {sl->con, end_ok};
    int32_t id = bt_sampler_sample_checked(sl->smp, row, allow_token, &a);
    if (id < 0) {
        bt_constraint_mask(sl->con, end_ok, b->allowed);
        id = bt_sampler_sample_masked(sl->smp, row, b->allowed);
    }
    /* an allowed token is taken: only memory for the state can fail here */
    if (id >= 0 && bt_constraint_accept(sl->con, id)) return id;
    if (id >= 0)
        snprintf(b->error, sizeof b->error, "out of memory for a grammar's state");
    else
        snprintf(b->error, sizeof b->error,
                 "no token of the vocabulary continues the output inside its grammar (after %lld generated tokens)",
                 (long long)sl->n_gen);
end:
    if (bt_engine_seq_rm(b->e, s) != BT_OK) {
        fail(b, BT_ERR_COMM);
        return -1;
    }
    finish(b, s, BT_FINISH_ERROR);
    return -1;
}

/* One row of logits for slot s: sample, call back, go on or finish.  A row
 * with a NaN (a damaged weight, an overflow) has no token to sample: the
 * request ends with BT_FINISH_ERROR and why in b->error (the others go on),
 * rather than a token that the sampler would take from garbage. */
static void take_row(struct bt_batcher *b, int s, float *row, double t) {
    struct slot *sl = &b->slots[s];
    for (int64_t v = 0; v < b->n_vocab; v++) {
        if (!isnan(row[v])) continue;
        if (bt_engine_seq_rm(b->e, s) != BT_OK) {
            fail(b, BT_ERR_COMM);
            return;
        }
        snprintf(b->error, sizeof b->error,
                 "the model's logits hold NaN (token id %lld, after %lld generated tokens): the weights or the "
                 "activations are not finite numbers",
                 (long long)v, (long long)sl->n_gen);
        finish(b, s, BT_FINISH_ERROR);
        return;
    }
    /* min_tokens: no end of generation yet (the row is this batcher's own;
     * the banned logits come back for the log-probabilities); a grammar
     * decides the end itself */
    const bool constrained = sl->req.grammar && !sl->waiting;
    const bool ban = sl->n_gen < sl->req.min_tokens && !constrained;
    for (int32_t i = 0; ban && i < b->n_eog; i++) {
        b->eog_raw[i] = row[b->eog[i]];
        row[b->eog[i]] = -INFINITY;
    }
    const int32_t id = constrained ? sample_constrained(b, s, row) : bt_sampler_sample(sl->smp, row);
    if (id < 0) return; /* ended */
    if (sl->waiting) watch_trigger(b, sl, id);
    for (int32_t i = 0; ban && i < b->n_eog; i++) row[b->eog[i]] = b->eog_raw[i];
    bt_logprobs lp;
    if (sl->req.logprobs) bt_logprobs_compute(row, (int32_t)b->n_vocab, id, sl->req.top_logprobs, &lp);
    bt_sampler_accept(sl->smp, id);
    if (sl->n_gen == 0) sl->t_first = t;
    sl->t_last = t;
    sl->n_gen++;
    b->stats.gen_tokens++;
    const char *text;
    size_t len;
    const enum bt_stop_reason why = bt_stopper_push(sl->stop, b->tok, id, &text, &len);
    if (sl->req.on_token) sl->req.on_token(sl->req.user, id, text, len, sl->req.logprobs ? &lp : NULL);
    if (why == BT_STOP_NONE) {
        BT_ASSERT(sl->pos < b->share); /* the stopper's limit keeps the sequence inside its share */
        sl->next = id;
        sl->state = SLOT_READY;
        return;
    }
    finish(b, s, why == BT_STOP_LIMIT ? BT_FINISH_LENGTH : BT_FINISH_STOP);
}

/* One row of hidden states for embedding slot s: add it up; after the
 * prompt's last, pool, normalise, call back and finish. */
static void take_hidden(struct bt_batcher *b, int s, const float *row) {
    struct slot *sl = &b->slots[s];
    const int64_t d = b->n_embd;
    for (int64_t i = 0; i < d; i++) sl->acc[i] += row[i];
    sl->n_acc++;
    const int64_t want = sl->req.pooling == BT_POOLING_MEAN ? (int64_t)sl->n_prompt : 1;
    if (sl->n_acc < want) return;
    /* llama.cpp's common_embd_normalize with embd_norm 2 (Euclidean) */
    double sum = 0.0;
    for (int64_t i = 0; i < d; i++) {
        b->vec[i] = (float)(sl->acc[i] / (double)want);
        sum += b->vec[i] * b->vec[i];
    }
    sum = sqrt(sum);
    const float norm = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    for (int64_t i = 0; i < d; i++) b->vec[i] *= norm;
    if (sl->req.on_embd) sl->req.on_embd(sl->req.user, b->vec, d);
    finish(b, s, BT_FINISH_STOP);
}

/* After a submit: each later choice whose first choice's prompt is all
 * submitted now gets the prompt's cells, copied on every rank after that
 * ubatch, and waits for the first choice's row. */
static enum bt_status copy_prompts(struct bt_batcher *b) {
    for (int s = 0; s < b->n_seq; s++) {
        struct slot *sl = &b->slots[s];
        if (sl->state != SLOT_FOLLOW) continue;
        const struct slot *l = &b->slots[sl->leader];
        BT_ASSERT(l->state != SLOT_FREE && l->id == sl->id); /* a cancel ends every choice of the request */
        if (l->n_sub < l->n_prompt) continue;
        const enum bt_status st = bt_engine_seq_cp(b->e, sl->leader, s, (int32_t)l->n_prompt);
        if (st != BT_OK) return st;
        memcpy(sl->cell_tok, l->cell_tok, l->n_prompt * sizeof *sl->cell_tok);
        sl->n_sub = l->n_prompt;
        sl->pos = (int32_t)l->n_prompt;
        sl->n_cached = l->n_cached;
        sl->t_sub = l->t_sub;
        sl->state = SLOT_WAIT;
        sl->first_row = true;
    }
    return BT_OK;
}

/* A row of logits for slot s and the later choices whose first token it gives. */
static void take_rows(struct bt_batcher *b, int s, float *row, double t) {
    const uint64_t id = b->slots[s].id;
    bool follow = false;
    for (int f = 0; f < b->n_seq && !follow; f++)
        follow = b->slots[f].state == SLOT_WAIT && b->slots[f].first_row && b->slots[f].leader == s &&
                 b->slots[f].id == id;
    if (follow) memcpy(b->row_keep, row, (size_t)b->n_vocab * sizeof *row);
    take_row(b, s, row, t);
    for (int f = 0; follow && !b->failed && f < b->n_seq; f++) {
        struct slot *sl = &b->slots[f];
        if (sl->state != SLOT_WAIT || !sl->first_row || sl->leader != s || sl->id != id) continue;
        sl->first_row = false;
        memcpy(b->row_tmp, b->row_keep, (size_t)b->n_vocab * sizeof *row);
        take_row(b, f, b->row_tmp, t);
    }
}

enum bt_status bt_batcher_step(struct bt_batcher *b) {
    if (b->failed) return BT_ERR_COMM;
    drain_inbox(b);
    if (b->failed) return fail(b, BT_ERR_COMM); /* a cancel's seq_rm failed */
    int n_active = 0;
    for (int s = 0; s < b->n_seq; s++) n_active += b->slots[s].state != SLOT_FREE;
    if (n_active == 0 && b->fl_n == 0) return BT_OK;

    /* decode tokens spread over as many ubatches as the pipeline has stages,
     * so that every stage has one to work on; more, smaller ubatches only add
     * each ubatch's fixed cost (on 2 ranks, 8 sequences: 1.05x to 1.9x the
     * tokens/s of spreading them over every ubatch in flight) */
    const int spread = b->n_stages < b->max_inflight ? b->n_stages : b->max_inflight;
    const int64_t max_decode = (n_active + spread - 1) / spread;
    /* prompt tokens likewise, so that a long prompt's chunks overlap in the
     * stages; chunks of at least BT_BATCHER_MIN_CHUNK tokens */
    int64_t pending = 0;
    for (int s = 0; s < b->n_seq; s++)
        if (b->slots[s].state == SLOT_PROMPT) pending += (int64_t)(b->slots[s].n_prompt - b->slots[s].n_sub);
    int64_t max_prompt = (pending + spread - 1) / spread;
    if (max_prompt < BT_BATCHER_MIN_CHUNK) max_prompt = BT_BATCHER_MIN_CHUNK;
    const double t = bt_now_s();
    while (b->fl_n < b->max_inflight) {
        struct flight *f = &b->fl[(b->fl_head + b->fl_n) % b->max_inflight];
        /* generation first; embedding prompts when no generation work is ready */
        if (!form_ubatch(b, f, BT_LLM_OUT_LOGITS, max_decode, max_prompt, t) &&
            !form_ubatch(b, f, BT_LLM_OUT_EMBD, 0, max_prompt, t))
            break;
        const struct bt_llm_batch ub = {f->n_tokens, f->token, f->pos, f->seq, f->logits, f->kind};
        enum bt_status st = bt_engine_submit(b->e, &ub, &f->engine_id);
        if (st == BT_OK) st = copy_prompts(b);
        if (st != BT_OK) return fail(b, st);
        b->fl_n++;
        b->stats.ubatches++;
        b->stats.decode_tokens += (uint64_t)f->n_decode;
    }
    if (b->fl_n == 0) return BT_OK;

    struct flight *f = &b->fl[b->fl_head];
    uint64_t got;
    int64_t n_out = 0;
    const bool hidden = f->kind == BT_LLM_OUT_EMBD;
    const enum bt_status st = bt_engine_collect(b->e, &got, hidden ? b->hidden : b->logits, &n_out);
    if (st != BT_OK) return fail(b, st);
    BT_ASSERT(got == f->engine_id && n_out == f->n_rows);
    b->fl_head = (b->fl_head + 1) % b->max_inflight;
    b->fl_n--;
    const double tc = bt_now_s();
    for (int64_t r = 0; r < f->n_rows; r++) {
        const int s = f->row_slot[r];
        if (hidden) {
            if (b->slots[s].state == SLOT_FREE || b->slots[s].id != f->row_req[r]) continue; /* cancelled */
            take_hidden(b, s, b->hidden + (size_t)r * (size_t)b->n_embd);
            if (b->failed) return fail(b, BT_ERR_COMM);
            continue;
        }
        if (b->slots[s].state != SLOT_WAIT || b->slots[s].id != f->row_req[r]) continue; /* cancelled */
        take_rows(b, s, b->logits + (size_t)r * (size_t)b->n_vocab, tc);
        if (b->failed) return fail(b, BT_ERR_COMM); /* a finished request's seq_rm failed */
    }
    return BT_OK;
}

bool bt_batcher_idle(struct bt_batcher *b) {
    if (b->fl_n > 0) return false;
    pthread_mutex_lock(&b->mu);
    const bool idle = b->n_taken == 0 && b->n_adds == 0;
    pthread_mutex_unlock(&b->mu);
    return idle;
}

const char *bt_batcher_error(const struct bt_batcher *b) { return b->error; }

void bt_batcher_stats(const struct bt_batcher *b, struct bt_batcher_stats *s) { *s = b->stats; }
