/* run_test_batcher.c - the sequence batcher (src/run/batcher.h) over a
 * one-rank engine and a random-weight MoE model with a real vocabulary
 * (written by `baton make-model`): a request's tokens are bitwise the same
 * alone and among others (greedy and seeded), and so are their
 * log-probabilities, cancel frees the slot at once,
 * the slots' capacity, the token and context limits, the errors of bad
 * requests, requests added from another thread while the loop steps, and
 * the reuse of a prompt prefix's cells (the same bits as a cold run), and
 * n > 1 choices of one prompt (each choice bitwise a request with its seed);
 * requests with a grammar (a JSON schema): the text inside it, the same
 * tokens alone and among others (greedy, seeded with and without top-k),
 * a grammar that starts at a trigger. */
#define _GNU_SOURCE
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/batcher.h"
#include "run/bringup.h"
#include "run/engine.h"
#include "text/json_schema.h"
#include "text/vocab_gguf.h"

#define N_SEQ 4
#define N_CTX 256
#define MAX_GEN 64
#define TOP_LOGPROBS 3

static struct bt_rank R;
static struct bt_engine *E;
static bt_tokenizer *TOK;
static char MODEL[512];

struct out {
    int32_t tok[MAX_GEN];
    int n;
    char text[4096];
    size_t n_text;
    bt_logprobs lp[MAX_GEN]; /* each token's, with TOP_LOGPROBS alternatives */
    bool done;
    struct bt_gen_result res;
};

static void on_token(void *user, int32_t id, const char *text, size_t len, const bt_logprobs *lp) {
    struct out *o = user;
    ck_assert_int_lt(o->n, MAX_GEN);
    ck_assert(lp != NULL && lp->id == id && lp->n_top == TOP_LOGPROBS);
    o->lp[o->n] = *lp;
    o->tok[o->n++] = id;
    ck_assert_uint_lt(o->n_text + len, sizeof o->text);
    memcpy(o->text + o->n_text, text, len);
    o->n_text += len;
}

static void on_done(void *user, const struct bt_gen_result *r) {
    struct out *o = user;
    ck_assert(!o->done);
    o->done = true;
    o->res = *r;
}

static bt_tokens tokenize(const char *s) {
    bt_tokens t = {0};
    char err[256];
    ck_assert_int_eq(bt_tokenizer_tokenize(TOK, s, strlen(s), 1, 1, &t, err, sizeof err), BT_OK);
    return t;
}

static struct bt_gen_request request(const bt_tokens *p, struct out *o, float temp, uint64_t seed, int64_t max) {
    struct bt_gen_request r;
    memset(&r, 0, sizeof r);
    r.prompt = p->ids;
    r.n_prompt = p->n;
    bt_sampler_params_default(&r.sampling);
    r.sampling.temp = temp;
    r.sampling.seed = seed;
    r.max_tokens = max;
    r.logprobs = true;
    r.top_logprobs = TOP_LOGPROBS;
    r.on_token = on_token;
    r.on_done = on_done;
    r.user = o;
    return r;
}

/* o cleared, its request added (it must be accepted); its id */
static uint64_t add_ok(struct bt_batcher *b, const bt_tokens *p, struct out *o, float temp, uint64_t seed,
                       int64_t max) {
    memset(o, 0, sizeof *o);
    const struct bt_gen_request r = request(p, o, temp, seed, max);
    uint64_t id;
    char err[256];
    ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
    return id;
}

static struct bt_batcher *batcher(int max_inflight, int64_t n_ubatch) {
    struct bt_batcher_params p;
    bt_batcher_default_params(&p);
    p.max_inflight = max_inflight;
    p.n_ubatch = n_ubatch;
    struct bt_batcher *b = NULL;
    char err[256];
    ck_assert_msg(bt_batcher_new(E, TOK, &p, &b, err, sizeof err) == BT_OK, "%s", err);
    return b;
}

static void run_until_idle(struct bt_batcher *b) {
    for (int guard = 0; !bt_batcher_idle(b); guard++) {
        ck_assert_int_lt(guard, 100000);
        ck_assert_msg(bt_batcher_step(b) == BT_OK, "%s", bt_batcher_error(b));
    }
}

static const char *PROMPTS[] = {
    "Hello world", "Once upon a time, in a land far away, there lived", "1 2 3", "The capital of France is",
    "a", "import numpy as np\nimport sys",
};
#define N_PROMPTS 6

/* Each prompt alone, then all of them through N_SEQ slots (more prompts
 * than slots: the rest wait for a free one), with several ubatch sizes and
 * pipeline depths: the same tokens and text, bitwise. */
static void same_alone_and_together(float temp) {
    bt_tokens p[N_PROMPTS];
    struct out alone[N_PROMPTS], together[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) p[i] = tokenize(PROMPTS[i]);
    struct bt_batcher *b = batcher(1, 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        add_ok(b, &p[i], &alone[i], temp, 100 + i, 12);
        run_until_idle(b);
        ck_assert(alone[i].done);
        ck_assert_int_eq(alone[i].res.finish, BT_FINISH_LENGTH);
        ck_assert_int_eq(alone[i].n, 12);
        ck_assert_int_eq(alone[i].res.n_gen, 12);
        ck_assert_int_eq(alone[i].res.n_prompt, (int64_t)p[i].n);
        for (int t = 0; t < alone[i].n; t++) {
            const bt_logprobs *x = &alone[i].lp[t];
            ck_assert(x->logprob <= 0 && x->top_logprob[0] >= x->logprob);
            for (int k = 1; k < TOP_LOGPROBS; k++) ck_assert(x->top_logprob[k] <= x->top_logprob[k - 1]);
            /* greedy: the token drawn is the most likely, its log-probability the first */
            if (temp == 0.0f) ck_assert(x->top_id[0] == x->id && x->top_logprob[0] == x->logprob);
        }
    }
    bt_batcher_free(b);
    const int inflight[] = {1, 2, 4};
    const int64_t ubatch[] = {0, 3, 7};
    for (int c = 0; c < 3; c++) {
        b = batcher(inflight[c], ubatch[c]);
        int next = 0;
        while (next < N_PROMPTS || !bt_batcher_idle(b)) {
            while (next < N_PROMPTS && bt_batcher_n_free(b) > 0) {
                add_ok(b, &p[next], &together[next], temp, 100 + next, 12);
                next++;
            }
            ck_assert_msg(bt_batcher_step(b) == BT_OK, "%s", bt_batcher_error(b));
        }
        bt_batcher_free(b);
        for (int i = 0; i < N_PROMPTS; i++) {
            ck_assert(together[i].done);
            ck_assert_int_eq(together[i].n, alone[i].n);
            ck_assert_msg(memcmp(together[i].tok, alone[i].tok, sizeof(int32_t) * (size_t)alone[i].n) == 0,
                          "prompt %d: tokens differ with %d in flight, ubatch %lld", i, inflight[c],
                          (long long)ubatch[c]);
            ck_assert_uint_eq(together[i].n_text, alone[i].n_text);
            ck_assert(memcmp(together[i].text, alone[i].text, alone[i].n_text) == 0);
            for (int t = 0; t < alone[i].n; t++) {
                const bt_logprobs *x = &together[i].lp[t], *y = &alone[i].lp[t];
                ck_assert_msg(memcmp(&x->logprob, &y->logprob, sizeof(float)) == 0 &&
                                  memcmp(x->top_id, y->top_id, sizeof x->top_id[0] * TOP_LOGPROBS) == 0 &&
                                  memcmp(x->top_logprob, y->top_logprob, sizeof(float) * TOP_LOGPROBS) == 0,
                              "prompt %d token %d: log-probabilities differ with %d in flight, ubatch %lld", i, t,
                              inflight[c], (long long)ubatch[c]);
            }
        }
    }
    for (int i = 0; i < N_PROMPTS; i++) bt_tokens_free(&p[i]);
}

START_TEST(test_greedy_alone_equals_together) { same_alone_and_together(0.0f); }
END_TEST

START_TEST(test_seeded_alone_equals_together) { same_alone_and_together(0.9f); }
END_TEST

/* Prefix reuse: a request whose prompt shares a prefix with a free slot's
 * cells computes only the rest (at least its last token) and gives the
 * tokens and log-probabilities of a cold run (no_reuse), bitwise; a prompt
 * that diverges mid-way reuses the shared part only; at several ubatch
 * sizes, greedy and seeded. */
static void expect_same(const struct out *a, const struct out *b, const char *what) {
    ck_assert(a->done && b->done);
    ck_assert_int_eq(a->n, b->n);
    ck_assert_msg(memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)a->n) == 0, "%s: tokens differ", what);
    for (int t = 0; t < a->n; t++)
        ck_assert_msg(memcmp(&a->lp[t].logprob, &b->lp[t].logprob, sizeof(float)) == 0 &&
                          memcmp(a->lp[t].top_logprob, b->lp[t].top_logprob, sizeof(float) * TOP_LOGPROBS) == 0,
                      "%s: token %d's log-probabilities differ", what, t);
}

START_TEST(test_prefix_reuse) {
    const char *sys = "You are a careful assistant. Answer in one short sentence, and never repeat the question. ";
    char ta[512], tb[512];
    snprintf(ta, sizeof ta, "%s%s", sys, "What is the colour of the sky on a clear day?");
    snprintf(tb, sizeof tb, "%s%s", sys, "Name three rivers of Europe.");
    bt_tokens pa = tokenize(ta), pb = tokenize(tb);
    int64_t shared = 0;
    while (shared < (int64_t)pa.n && shared < (int64_t)pb.n && pa.ids[shared] == pb.ids[shared]) shared++;
    ck_assert_int_gt(shared, 10);
    const int64_t ubatch[] = {0, 5};
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 2; k++) {
            const float temp = k ? 0.9f : 0.0f;
            /* cold runs, in a batcher of their own (freed: no cells left) */
            struct bt_batcher *b = batcher(2, ubatch[c]);
            struct out cold_a, cold_b, first_a, warm_a, warm_b;
            memset(&cold_a, 0, sizeof cold_a);
            struct bt_gen_request r = request(&pa, &cold_a, temp, 7, 10);
            r.no_reuse = true;
            uint64_t id;
            char err[256];
            ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
            run_until_idle(b);
            ck_assert_int_eq(cold_a.res.n_cached, 0);
            memset(&cold_b, 0, sizeof cold_b);
            r = request(&pb, &cold_b, temp, 7, 10);
            r.no_reuse = true;
            ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
            run_until_idle(b);
            ck_assert_int_eq(cold_b.res.n_cached, 0);
            bt_batcher_free(b);
            b = batcher(2, ubatch[c]);
            add_ok(b, &pa, &first_a, temp, 7, 10); /* nothing to reuse yet */
            run_until_idle(b);
            ck_assert_int_eq(first_a.res.n_cached, 0);
            expect_same(&first_a, &cold_a, "the first prompt");
            /* the same prompt again: every token but the last reused */
            add_ok(b, &pa, &warm_a, temp, 7, 10);
            run_until_idle(b);
            ck_assert_int_eq(warm_a.res.n_cached, (int64_t)pa.n - 1);
            expect_same(&warm_a, &cold_a, "the same prompt again");
            /* B diverges from A's cells after the shared part */
            add_ok(b, &pb, &warm_b, temp, 7, 10);
            run_until_idle(b);
            ck_assert_int_eq(warm_b.res.n_cached, shared);
            expect_same(&warm_b, &cold_b, "a prompt that diverges");
            struct bt_batcher_stats st;
            bt_batcher_stats(b, &st);
            ck_assert_uint_eq(st.cached_tokens, (uint64_t)(pa.n - 1 + (size_t)shared));
            bt_batcher_free(b);
            /* the batcher gone, the engine holds no cells */
            for (int s = 0; s < N_SEQ; s++) ck_assert_int_eq(bt_engine_seq_pos_max(E, s), -1);
        }
    bt_tokens_free(&pa);
    bt_tokens_free(&pb);
}
END_TEST

/* n > 1 choices: the prompt computed once, its cells copied into the other
 * choices' slots; choice i's tokens and log-probabilities are bitwise those
 * of a request of one choice with seed + i; more choices than slots is
 * invalid, more than are free waits (BT_ERR_CAPACITY). */
START_TEST(test_choices) {
    bt_tokens p = tokenize("Once upon a time, in a land far away, there lived a king who had three sons.");
    const int64_t ubatch[] = {0, 5};
    for (int c = 0; c < 2; c++) {
        struct bt_batcher *b = batcher(2, ubatch[c]);
        struct out single[3], multi[3];
        for (int i = 0; i < 3; i++) {
            struct bt_gen_request r = request(&p, &single[i], 0.9f, 50 + (uint64_t)i, 10);
            memset(&single[i], 0, sizeof single[i]);
            r.no_reuse = true;
            uint64_t id;
            char err[256];
            ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
            run_until_idle(b);
        }
        bt_batcher_free(b);
        b = batcher(2, ubatch[c]);
        memset(multi, 0, sizeof multi);
        void *users[3] = {&multi[0], &multi[1], &multi[2]};
        struct bt_gen_request r = request(&p, NULL, 0.9f, 50, 10);
        r.n_choices = 3;
        r.choice_users = users;
        uint64_t id;
        char err[256];
        ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
        struct bt_batcher_stats st0;
        bt_batcher_stats(b, &st0);
        run_until_idle(b);
        struct bt_batcher_stats st;
        bt_batcher_stats(b, &st);
        ck_assert_uint_eq(st.prompt_tokens - st0.prompt_tokens, p.n); /* computed once */
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(multi[i].res.n_prompt, (int64_t)p.n);
            expect_same(&multi[i], &single[i], "choice i against one choice with seed + i");
        }
        ck_assert_msg(memcmp(multi[0].tok, multi[1].tok, sizeof(int32_t) * 10) != 0 ||
                          memcmp(multi[0].tok, multi[2].tok, sizeof(int32_t) * 10) != 0,
                      "three seeds gave one answer");
        /* more choices than slots: invalid; more than are free: wait */
        r.n_choices = N_SEQ + 1;
        void *many[N_SEQ + 1] = {0};
        r.choice_users = many;
        ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
        ck_assert_str_eq(err, "5 choices: between 1 and the 4 sequence slots, each with its user");
        struct out one;
        add_ok(b, &p, &one, 0.0f, 1, 4);
        r.n_choices = N_SEQ;
        ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_CAPACITY);
        ck_assert_str_eq(err, "1 of 4 sequences are busy: 4 choices do not fit");
        run_until_idle(b);
        bt_batcher_free(b);
    }
    bt_tokens_free(&p);
}
END_TEST

START_TEST(test_cancel_frees_at_once) {
    bt_tokens p = tokenize("Hello world");
    struct out a, b2, c;
    struct bt_batcher *b = batcher(0, 0);
    const uint64_t ida = add_ok(b, &p, &a, 0, 0, 20);
    add_ok(b, &p, &b2, 0, 0, 20);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(bt_batcher_step(b), BT_OK);
    bt_batcher_cancel(b, ida);
    bt_batcher_cancel(b, 999999); /* unknown: ignored */
    ck_assert_int_eq(bt_batcher_step(b), BT_OK);
    ck_assert(a.done);
    ck_assert_int_eq(a.res.finish, BT_FINISH_CANCELLED);
    ck_assert_str_eq(bt_finish_name(a.res.finish), "cancelled");
    ck_assert_int_eq(bt_batcher_n_free(b), N_SEQ - 1);
    /* the freed slot takes a new request whose tokens are those of one alone */
    add_ok(b, &p, &c, 0, 0, 20);
    run_until_idle(b);
    ck_assert(b2.done && c.done);
    ck_assert_int_eq(b2.n, 20);
    ck_assert_int_eq(c.n, 20);
    ck_assert(memcmp(b2.tok, c.tok, sizeof(int32_t) * 20) == 0);
    bt_batcher_free(b);
    bt_tokens_free(&p);
}
END_TEST

/* A batcher freed with ubatches in flight leaves the engine clean: the next
 * batcher's request gives the tokens of one alone. */
START_TEST(test_free_with_ubatches_in_flight) {
    bt_tokens p = tokenize("Hello world");
    struct out a, b2, alone;
    struct bt_batcher *b = batcher(2, 0);
    add_ok(b, &p, &a, 0, 0, 10);
    add_ok(b, &p, &b2, 0, 0, 10);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(bt_batcher_step(b), BT_OK);
    ck_assert(!bt_batcher_idle(b));
    bt_batcher_free(b);
    ck_assert(a.done && b2.done);
    ck_assert_int_eq(a.res.finish, BT_FINISH_CANCELLED);
    ck_assert_int_eq(bt_engine_n_inflight(E), 0);
    b = batcher(0, 0);
    add_ok(b, &p, &alone, 0, 0, 10);
    run_until_idle(b);
    ck_assert_int_eq(alone.n, 10);
    ck_assert(memcmp(alone.tok, a.tok, sizeof(int32_t) * (size_t)a.n) == 0);
    bt_batcher_free(b);
    bt_tokens_free(&p);
}
END_TEST

START_TEST(test_capacity_and_bad_requests) {
    bt_tokens p = tokenize("Hello world");
    struct out o[N_SEQ + 1];
    memset(o, 0, sizeof o);
    struct bt_batcher *b = batcher(0, 0);
    uint64_t id;
    char err[512];
    for (int i = 0; i < N_SEQ; i++) {
        const struct bt_gen_request r = request(&p, &o[i], 0, 0, 2);
        ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_OK);
    }
    struct bt_gen_request r = request(&p, &o[N_SEQ], 0, 0, 2);
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_CAPACITY);
    ck_assert_str_eq(err, "all 4 sequences are busy");
    ck_assert_int_eq(bt_batcher_n_free(b), 0);
    run_until_idle(b);
    ck_assert_int_eq(bt_batcher_n_free(b), N_SEQ);
    ck_assert(!o[N_SEQ].done); /* refused: no callback */

    r.n_prompt = 0;
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "the prompt is empty");
    int32_t big[N_CTX / N_SEQ + 1];
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) big[i] = p.ids[0];
    r.prompt = big;
    r.n_prompt = sizeof big / sizeof big[0];
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "the prompt has 65 tokens but a sequence holds at most 64 (the context of 256 tokens "
                          "shared by 4 sequences)");
    int32_t bad[2] = {p.ids[0], 1 << 30};
    r.prompt = bad;
    r.n_prompt = 2;
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "prompt token 1: id 1073741824 is not in the vocabulary [0, 50257)");
    r = request(&p, &o[0], 0, 0, 0);
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "max_tokens 0: the number of tokens to generate must be positive (or -1: no limit)");
    r = request(&p, &o[0], -1.0f, 0, 4);
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "--temp -1: the temperature must be 0 (greedy) or positive");
    const char *stops[] = {""};
    r = request(&p, &o[0], 0, 0, 4);
    r.stops = stops;
    r.n_stops = 1;
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "stop string 1 is empty");
    r = request(&p, &o[0], 0, 0, 4);
    r.top_logprobs = BT_MAX_TOP_LOGPROBS + 1;
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "top_logprobs 21: must be between 0 and 20");
    ck_assert(bt_batcher_idle(b));
    bt_batcher_free(b);
    bt_tokens_free(&p);
}
END_TEST

/* -1: until the sequence's share of the context is full: the prompt's cells
 * and one for every token but the last */
START_TEST(test_context_share_limit) {
    bt_tokens p = tokenize("Hello world");
    struct out o;
    struct bt_batcher *b = batcher(0, 0);
    add_ok(b, &p, &o, 0, 0, -1);
    run_until_idle(b);
    ck_assert(o.done);
    /* greedy on random weights rarely meets gpt-2's end token; when it does, it stops */
    if (o.res.finish == BT_FINISH_LENGTH) ck_assert_int_eq(o.n, N_CTX / N_SEQ - (int)p.n + 1);
    else ck_assert_int_eq(o.res.finish, BT_FINISH_STOP);
    ck_assert_int_eq(bt_batcher_n_free(b), N_SEQ);
    bt_batcher_free(b);
    bt_tokens_free(&p);
}
END_TEST

struct adder {
    struct bt_batcher *b;
    bt_tokens *p;
    struct out *o;
    int n;
};

static void *add_from_thread(void *arg) {
    struct adder *a = arg;
    for (int i = 0; i < a->n; i++) {
        const struct bt_gen_request r = request(a->p, &a->o[i], 0, 0, 8);
        uint64_t id;
        char err[256];
        while (bt_batcher_add(a->b, &r, &id, err, sizeof err) == BT_ERR_CAPACITY) usleep(1000);
    }
    return NULL;
}

START_TEST(test_add_from_another_thread) {
    bt_tokens p = tokenize("The capital of France is");
    struct out alone, o[8];
    memset(o, 0, sizeof o);
    struct bt_batcher *b = batcher(0, 0);
    add_ok(b, &p, &alone, 0, 0, 8);
    run_until_idle(b);
    struct adder a = {b, &p, o, 8};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, add_from_thread, &a), 0);
    int done = 0;
    while (done < 8) {
        if (bt_batcher_idle(b)) bt_batcher_wait(b, 50);
        ck_assert_int_eq(bt_batcher_step(b), BT_OK);
        done = 0;
        for (int i = 0; i < 8; i++) done += o[i].done;
    }
    pthread_join(th, NULL);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(o[i].n, 8);
        ck_assert(memcmp(o[i].tok, alone.tok, sizeof(int32_t) * 8) == 0);
    }
    bt_batcher_free(b);
    bt_tokens_free(&p);
}
END_TEST

/* A JSON schema's grammar on requests: greedy and seeded (top-k 0: the
 * whole mask; top-k 8: the checked path), each alone and then among free
 * requests; the same tokens both ways, and a text the grammar takes (whole
 * when it stopped, a prefix when max_tokens cut it). */
START_TEST(test_grammar_requests) {
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[\"x\",\"yy\"]},"
                         "\"b\":{\"type\":\"boolean\"},\"c\":{\"type\":\"string\",\"maxLength\":4}},"
                         "\"required\":[\"a\",\"b\"]}";
    char where[256], err[256];
    bt_grammar *g = bt_grammar_new();
    bt_json_rules j;
    bt_json_rules_init(&j, g);
    int32_t root = bt_json_schema_compile(&j, schema, strlen(schema), where, sizeof where, err, sizeof err);
    ck_assert_msg(root >= 0 && bt_grammar_finish(g, root, err, sizeof err) == BT_OK, "%s", err);
    const float temps[3] = {0.0f, 0.8f, 0.8f};
    const int32_t top_k[3] = {0, 0, 8};
    bt_tokens p = tokenize("Answer in JSON:"), q = tokenize("Once upon a time");
    struct out alone[3], together[3], free_run;
    struct bt_batcher *b = batcher(2, 0);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 3; i++) {
            struct out *o = pass ? &together[i] : &alone[i];
            memset(o, 0, sizeof *o);
            struct bt_gen_request r = request(&p, o, temps[i], 40 + (uint64_t)i, MAX_GEN - 4);
            r.sampling.top_k = top_k[i];
            r.grammar = g;
            uint64_t id;
            ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
            if (pass && i == 0) add_ok(b, &q, &free_run, 0.7f, 9, 10); /* N_SEQ: 3 + 1 */
            if (!pass) run_until_idle(b);
        }
        run_until_idle(b);
    }
    ck_assert(free_run.done && free_run.n == 10);
    for (int i = 0; i < 3; i++) {
        ck_assert(alone[i].done && together[i].done);
        ck_assert_int_eq(alone[i].n, together[i].n);
        ck_assert(memcmp(alone[i].tok, together[i].tok, (size_t)alone[i].n * sizeof(int32_t)) == 0);
        const struct out *o = &alone[i];
        ck_assert_msg(o->res.finish == BT_FINISH_STOP || o->res.finish == BT_FINISH_LENGTH, "finish %d",
                      (int)o->res.finish);
        bt_grammar_state *st = bt_grammar_state_new(g), *tmp = bt_grammar_state_new(g);
        ck_assert_msg(bt_grammar_state_bytes(st, o->text, o->n_text, tmp), "%.*s", (int)o->n_text, o->text);
        if (o->res.finish == BT_FINISH_STOP)
            ck_assert_msg(bt_grammar_state_complete(st), "%.*s", (int)o->n_text, o->text);
        bt_grammar_state_free(st);
        bt_grammar_state_free(tmp);
        ck_assert(o->n_text > 0 && o->text[0] == '{');
    }
    /* a trigger: free until the output holds it, then the grammar from it.
     * "{" pushed up by logit_bias comes first and starts the grammar; a
     * trigger that never comes leaves the output as without a grammar */
    bt_tokens brace = tokenize("{");
    ck_assert_uint_eq(brace.n, 1);
    const float up = 100.0f;
    struct out trig, never, plain;
    for (int k = 0; k < 3; k++) {
        struct out *o = k == 0 ? &trig : k == 1 ? &never : &plain;
        memset(o, 0, sizeof *o);
        struct bt_gen_request r = request(&p, o, 0.0f, 1, MAX_GEN - 4);
        r.grammar = k < 2 ? g : NULL;
        r.grammar_trigger = k == 0 ? "{" : k == 1 ? "\x01\x02\x03" : NULL;
        if (k == 0) r.bias_ids = brace.ids, r.bias = &up, r.n_bias = 1;
        uint64_t id;
        ck_assert_msg(bt_batcher_add(b, &r, &id, err, sizeof err) == BT_OK, "%s", err);
    }
    run_until_idle(b);
    ck_assert(trig.n_text > 0 && trig.text[0] == '{');
    bt_grammar_state *st = bt_grammar_state_new(g), *tmp = bt_grammar_state_new(g);
    ck_assert_msg(bt_grammar_state_bytes(st, trig.text, trig.n_text, tmp), "%.*s", (int)trig.n_text, trig.text);
    ck_assert(trig.res.finish != BT_FINISH_STOP || bt_grammar_state_complete(st));
    bt_grammar_state_free(st);
    bt_grammar_state_free(tmp);
    ck_assert_int_eq(never.n, plain.n);
    ck_assert(memcmp(never.tok, plain.tok, (size_t)plain.n * sizeof(int32_t)) == 0);
    bt_tokens_free(&brace);
    /* ignore_eos could never end a grammar's output: refused */
    struct out o;
    memset(&o, 0, sizeof o);
    struct bt_gen_request r = request(&p, &o, 0.0f, 1, 8);
    r.grammar = g;
    r.ignore_eos = true;
    uint64_t id;
    ck_assert_int_eq(bt_batcher_add(b, &r, &id, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "ignore_eos with a grammar: the output could not end where the grammar is complete");
    bt_batcher_free(b);
    bt_grammar_free(g);
    bt_tokens_free(&p);
    bt_tokens_free(&q);
}
END_TEST

int main(int argc, char **argv) {
    char dir[] = "/tmp/bt_batcher.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    snprintf(MODEL, sizeof MODEL, "%s/moe.gguf", dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s make-model %s --vocab %s/vocab/ggml-vocab-gpt-2.gguf --embd 64 --head-dim 16 --ff 128 --ff-exp 32",
             BATON_CLI, MODEL, BATON_TEST_DATA);
    if (system(cmd) != 0) {
        fprintf(stderr, "run_test_batcher: %s failed\n", cmd);
        return 1;
    }
    const struct bt_rank_config rc = {.prog = "run_test_batcher", .threads = 1};
    if (bt_rank_init(&R, &rc, &argc, &argv) != BT_OK) {
        fprintf(stderr, "run_test_batcher: %s\n", R.error);
        return 1;
    }
    struct bt_engine_params ep;
    bt_engine_default_params(&ep);
    ep.model = MODEL;
    ep.n_ctx = N_CTX;
    ep.n_seq_max = N_SEQ;
    ep.n_ubatch = 16;
    char err[1024];
    if (bt_engine_open(&R, &ep, &E, err, sizeof err) != BT_OK ||
        bt_tokenizer_from_gguf(bt_engine_gguf(E), &TOK, err, sizeof err) != BT_OK) {
        fprintf(stderr, "run_test_batcher: %s\n", err);
        return 1;
    }
    Suite *s = suite_create("batcher");
    TCase *tc = tcase_create("batcher");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_greedy_alone_equals_together);
    tcase_add_test(tc, test_seeded_alone_equals_together);
    tcase_add_test(tc, test_cancel_frees_at_once);
    tcase_add_test(tc, test_free_with_ubatches_in_flight);
    tcase_add_test(tc, test_capacity_and_bad_requests);
    tcase_add_test(tc, test_context_share_limit);
    tcase_add_test(tc, test_add_from_another_thread);
    tcase_add_test(tc, test_prefix_reuse);
    tcase_add_test(tc, test_choices);
    tcase_add_test(tc, test_grammar_requests);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* one MPI process, one engine */
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    bt_tokenizer_free(TOK);
    bt_engine_stop(E);
    bt_engine_close(E);
    bt_rank_free(&R);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "run_test_batcher: could not remove %s\n", dir);
    return failed ? 1 : 0;
}
