/* test_sampler.c - each sampler's distribution on fixed logits: N draws are
 * counted and compared with the probabilities the test computes itself from
 * the definitions (softmax, top-k, top-p, min-p, temperature, penalties);
 * each count must be within 5 standard deviations of N p, a token the
 * sampler removes must never be drawn, and the same counts must fail against
 * a nearby wrong distribution (a temperature 10% off, one token more or
 * less, no penalty), so the bound cannot pass by accident.  Then greedy, the
 * seed, the penalty window, bad parameters; stop strings and the token
 * limit. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/sampler.h"
#include "text/stop.h"
#include "text/tokenizer.h"
#include "text/vocab_gguf.h"
#include "testutil.h"

#define NV 8
static const float k_logits[NV] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
#define N_DRAWS 100000

/* ---- expected distributions, from the definitions ---- */

/* softmax over the tokens in keep[], of logits l / temp */
static void softmax_keep(const double *l, const int *keep, double temp, double *p) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < NV; i++)
        if (keep[i] && l[i] / temp > mx) mx = l[i] / temp;
    for (int i = 0; i < NV; i++) sum += p[i] = keep[i] ? exp(l[i] / temp - mx) : 0.0;
    for (int i = 0; i < NV; i++) p[i] /= sum;
}

/* the chain on l (already penalised): top-k, top-p, min-p at temperature 1, then temp */
static void expected(const double *l, int top_k, double top_p, double min_p, double temp, double *p) {
    int order[NV], keep[NV];
    for (int i = 0; i < NV; i++) order[i] = i;
    for (int i = 0; i < NV; i++) /* sort by logit, descending (selection sort: 8 items) */
        for (int j = i + 1; j < NV; j++)
            if (l[order[j]] > l[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int n = top_k > 0 && top_k < NV ? top_k : NV;
    for (int i = 0; i < NV; i++) keep[i] = 0;
    for (int i = 0; i < n; i++) keep[order[i]] = 1;
    double q[NV];
    softmax_keep(l, keep, 1.0, q);
    if (top_p < 1) {
        double cum = 0;
        int m = n;
        for (int i = 0; i < n; i++) {
            cum += q[order[i]];
            if (cum >= top_p) {
                m = i + 1;
                break;
            }
        }
        for (int i = m; i < NV; i++) keep[order[i]] = 0;
        n = m;
    }
    if (min_p > 0) {
        double pmax = q[order[0]];
        for (int i = 1; i < n; i++)
            if (q[order[i]] < min_p * pmax) keep[order[i]] = 0;
    }
    softmax_keep(l, keep, temp, p);
}

/* counts of N_DRAWS draws */
static void draw(const bt_sampler_params *par, const int *history, int n_hist, long *count) {
    bt_sampler *s;
    char err[256];
    ck_assert_msg(bt_sampler_create(par, NV, &s, err, sizeof err) == BT_OK, "%s", err);
    for (int i = 0; i < n_hist; i++) bt_sampler_accept(s, history[i]);
    memset(count, 0, NV * sizeof *count);
    for (int k = 0; k < N_DRAWS; k++) {
        int32_t t = bt_sampler_sample(s, k_logits);
        ck_assert(t >= 0 && t < NV);
        count[t]++;
    }
    bt_sampler_free(s);
}

/* 1 when every count is within 5 sigma of N p (and zero where p is zero) */
static int fits(const long *count, const double *p, int verbose) {
    int ok = 1;
    for (int i = 0; i < NV; i++) {
        double mean = N_DRAWS * p[i], sd = sqrt(N_DRAWS * p[i] * (1 - p[i]));
        int good = p[i] == 0 ? count[i] == 0 : fabs((double)count[i] - mean) <= 5 * sd;
        if (!good && verbose)
            fprintf(stderr, "  token %d: %ld draws, expected %.1f +- %.1f (p = %.5f)\n", i, count[i], mean, sd, p[i]);
        ok &= good;
    }
    return ok;
}

static void check_dist(const char *what, const long *count, const double *p, const double *wrong) {
    ck_assert_msg(fits(count, p, 1), "%s: the counts do not fit the expected distribution", what);
    ck_assert_msg(!fits(count, wrong, 0), "%s: the counts also fit a wrong distribution: the test has no power", what);
}

static void base_logits(double *l) {
    for (int i = 0; i < NV; i++) l[i] = k_logits[i];
}

static bt_sampler_params plain(double temp) {
    bt_sampler_params p;
    bt_sampler_params_default(&p);
    p.temp = (float)temp, p.top_k = 0, p.top_p = 1, p.min_p = 0, p.seed = 1234;
    return p;
}

START_TEST(test_temperature) {
    static const double temps[] = {1.0, 0.5, 2.0};
    double l[NV], p[NV], w[NV];
    long c[NV];
    base_logits(l);
    for (int k = 0; k < 3; k++) {
        bt_sampler_params par = plain(temps[k]);
        draw(&par, NULL, 0, c);
        expected(l, 0, 1, 0, temps[k], p);
        expected(l, 0, 1, 0, temps[k] * 1.1, w);
        char what[64];
        snprintf(what, sizeof what, "temperature %g", temps[k]);
        check_dist(what, c, p, w);
    }
}
END_TEST

START_TEST(test_top_k) {
    double l[NV], p[NV], w[NV];
    long c[NV];
    base_logits(l);
    for (int k = 1; k <= 4; k++) {
        bt_sampler_params par = plain(1.0);
        par.top_k = k;
        draw(&par, NULL, 0, c);
        expected(l, k, 1, 0, 1.0, p);
        expected(l, k + 1, 1, 0, 1.0, w);
        char what[64];
        snprintf(what, sizeof what, "top-k %d", k);
        check_dist(what, c, p, w);
    }
}
END_TEST

START_TEST(test_top_p) {
    /* softmax(k_logits) ~ .38 .23 .14 .085 .05 .03 .019 .0025: p = 0.5 keeps 2, 0.7 keeps 3, 0.9 keeps 5 */
    static const double ps[] = {0.5, 0.7, 0.9};
    static const double wrong_ps[] = {0.7, 0.8, 0.95}; /* one more token kept */
    double l[NV], p[NV], w[NV];
    long c[NV];
    base_logits(l);
    for (int k = 0; k < 3; k++) {
        bt_sampler_params par = plain(1.0);
        par.top_p = (float)ps[k];
        draw(&par, NULL, 0, c);
        expected(l, 0, ps[k], 0, 1.0, p);
        expected(l, 0, wrong_ps[k], 0, 1.0, w);
        char what[64];
        snprintf(what, sizeof what, "top-p %g", ps[k]);
        check_dist(what, c, p, w);
    }
}
END_TEST

START_TEST(test_min_p) {
    /* p_i / p_max = exp(l_i - 2): 0.2 keeps l >= 2 + ln 0.2 = 0.39 (4 tokens), 0.05 keeps l >= -0.996 (7) */
    static const double mins[] = {0.2, 0.05};
    static const double wrong[] = {0.1, 0.01};
    double l[NV], p[NV], w[NV];
    long c[NV];
    base_logits(l);
    for (int k = 0; k < 2; k++) {
        bt_sampler_params par = plain(1.0);
        par.min_p = (float)mins[k];
        draw(&par, NULL, 0, c);
        expected(l, 0, 1, mins[k], 1.0, p);
        expected(l, 0, 1, wrong[k], 1.0, w);
        char what[64];
        snprintf(what, sizeof what, "min-p %g", mins[k]);
        check_dist(what, c, p, w);
    }
}
END_TEST

START_TEST(test_chain) {
    /* llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8 */
    double l[NV], p[NV], w[NV];
    long c[NV];
    base_logits(l);
    bt_sampler_params par;
    bt_sampler_params_default(&par);
    par.seed = 7;
    draw(&par, NULL, 0, c);
    expected(l, 40, 0.95, 0.05, 0.8, p);
    expected(l, 40, 0.95, 0.05, 1.0, w); /* temperature applied before the cuts would give this */
    check_dist("default chain", c, p, w);
    /* and temperature after top-k 3 */
    par = plain(0.7);
    par.top_k = 3;
    draw(&par, NULL, 0, c);
    expected(l, 3, 1, 0, 0.7, p);
    expected(l, 3, 1, 0, 0.8, w);
    check_dist("top-k 3, temperature 0.7", c, p, w);
}
END_TEST

START_TEST(test_penalties) {
    double l[NV], pl[NV], p[NV], w[NV];
    long c[NV];
    base_logits(l);
    /* repetition 1.5 on tokens 0 (positive: divided) and 5 (negative: multiplied) */
    static const int hist1[] = {0, 5, 0};
    bt_sampler_params par = plain(1.0);
    par.repeat_penalty = 1.5f;
    draw(&par, hist1, 3, c);
    memcpy(pl, l, sizeof pl);
    pl[0] = (double)(2.0f / 1.5f);
    pl[5] = (double)(-0.5f * 1.5f);
    expected(pl, 0, 1, 0, 1.0, p);
    expected(l, 0, 1, 0, 1.0, w);
    check_dist("repeat penalty 1.5", c, p, w);
    /* frequency 0.3 and presence 0.7: token 1 seen twice, token 2 once */
    static const int hist2[] = {1, 1, 2};
    par = plain(1.0);
    par.frequency_penalty = 0.3f;
    par.presence_penalty = 0.7f;
    draw(&par, hist2, 3, c);
    memcpy(pl, l, sizeof pl);
    pl[1] = 1.5 - 2 * 0.3 - 0.7;
    pl[2] = 1.0 - 1 * 0.3 - 0.7;
    expected(pl, 0, 1, 0, 1.0, p);
    pl[1] = 1.5 - 1 * 0.3 - 0.7; /* counting token 1 once */
    expected(pl, 0, 1, 0, 1.0, w);
    check_dist("frequency 0.3 + presence 0.7", c, p, w);
    /* the window: with last_n 2, only the two latest tokens (1, 2) count */
    static const int hist3[] = {0, 1, 2};
    par = plain(1.0);
    par.presence_penalty = 1.0f;
    par.penalty_last_n = 2;
    draw(&par, hist3, 3, c);
    memcpy(pl, l, sizeof pl);
    pl[1] -= 1.0, pl[2] -= 1.0;
    expected(pl, 0, 1, 0, 1.0, p);
    pl[0] -= 1.0;
    expected(pl, 0, 1, 0, 1.0, w);
    check_dist("presence 1 over the last 2", c, p, w);
}
END_TEST

START_TEST(test_greedy) {
    bt_sampler_params par = plain(0.0);
    bt_sampler *s;
    char err[256];
    ck_assert_int_eq(bt_sampler_create(&par, NV, &s, err, sizeof err), BT_OK);
    for (int k = 0; k < 100; k++) ck_assert_int_eq(bt_sampler_sample(s, k_logits), 0);
    bt_sampler_free(s);
    /* a repetition penalty moves the choice: 2/3 < 1.5 */
    par.repeat_penalty = 3.0f;
    ck_assert_int_eq(bt_sampler_create(&par, NV, &s, err, sizeof err), BT_OK);
    bt_sampler_accept(s, 0);
    ck_assert_int_eq(bt_sampler_sample(s, k_logits), 1);
    bt_sampler_free(s);
    /* equal logits: the smaller id */
    const float tie[4] = {0.5f, 1.0f, 1.0f, 0.0f};
    par = plain(0.0);
    ck_assert_int_eq(bt_sampler_create(&par, 4, &s, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_sampler_sample(s, tie), 1);
    bt_sampler_free(s);
}
END_TEST

/* log-probabilities: the log-softmax of the raw logits (no bias, penalty or
 * temperature), the n most likely first, equal logits by the smaller id; the
 * same bits however many are asked; -inf and +inf logits */
START_TEST(test_logprobs) {
    const float x[6] = {1.0f, 3.0f, 2.0f, 3.0f, -INFINITY, 0.0f};
    double sum = 0;
    for (int v = 0; v < 6; v++) sum += exp((double)x[v] - 3.0);
    const double lse = 3.0 + log(sum);
    bt_logprobs lp;
    bt_logprobs_compute(x, 6, 2, 4, &lp);
    ck_assert_int_eq(lp.id, 2);
    ck_assert(lp.logprob == (float)(2.0 - lse));
    ck_assert_int_eq(lp.n_top, 4);
    const int32_t want[4] = {1, 3, 2, 0};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(lp.top_id[i], want[i]);
        ck_assert(lp.top_logprob[i] == (float)((double)x[want[i]] - lse));
        ck_assert(lp.top_logprob[i] <= 0);
    }
    /* the probabilities add up to 1 */
    double p = 0;
    for (int v = 0; v < 6; v++) {
        bt_logprobs one;
        bt_logprobs_compute(x, 6, v, 0, &one);
        ck_assert_int_eq(one.n_top, 0);
        p += exp((double)one.logprob);
    }
    ck_assert(fabs(p - 1.0) < 1e-6);
    /* -inf: log p = -inf; all 6 asked: the banned one last */
    bt_logprobs_compute(x, 6, 4, 6, &lp);
    ck_assert(isinf(lp.logprob) && lp.logprob < 0);
    ck_assert_int_eq(lp.top_id[5], 4);
    ck_assert(lp.top_logprob[0] == (float)(3.0 - lse)); /* the same bits as with 4 asked */
    /* more asked than there are tokens: all of them */
    bt_logprobs_compute(x, 3, 0, 20, &lp);
    ck_assert_int_eq(lp.n_top, 3);
    ck_assert_int_eq(lp.top_id[0], 1);
    /* a largest logit of +inf: the tokens holding it share the probability */
    const float inf[3] = {INFINITY, 0.0f, INFINITY};
    bt_logprobs_compute(inf, 3, 2, 3, &lp);
    ck_assert(lp.logprob == (float)-log(2.0));
    ck_assert_int_eq(lp.top_id[0], 0);
    ck_assert_int_eq(lp.top_id[1], 2);
    ck_assert(isinf(lp.top_logprob[2]));
    /* a greedy sampler's choice is the first of the list, whatever the temperature asked */
    bt_sampler_params par = plain(0.0);
    bt_sampler *s;
    char err[256];
    ck_assert_int_eq(bt_sampler_create(&par, 6, &s, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_sampler_sample(s, x), 1);
    bt_sampler_free(s);
}
END_TEST

/* logit_bias: added before everything else, -INFINITY never sampled at any
 * temperature; an id out of the vocabulary or a NaN is refused, naming it. */
START_TEST(test_bias) {
    bt_sampler_params par = plain(0.0);
    bt_sampler *s;
    char err[256];
    ck_assert_int_eq(bt_sampler_create(&par, NV, &s, err, sizeof err), BT_OK);
    const int32_t ids[2] = {0, 3};
    const float up[2] = {-INFINITY, 100.0f};
    ck_assert_int_eq(bt_sampler_set_bias(s, ids, up, 2, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_sampler_sample(s, k_logits), 3);
    const int32_t bad[1] = {NV};
    ck_assert_int_eq(bt_sampler_set_bias(s, bad, up, 1, err, sizeof err), BT_ERR_INVALID);
    ck_assert_msg(strstr(err, "token id") != NULL, "%s", err);
    const float nan1[1] = {NAN};
    ck_assert_int_eq(bt_sampler_set_bias(s, ids, nan1, 1, err, sizeof err), BT_ERR_INVALID);
    ck_assert_int_eq(bt_sampler_sample(s, k_logits), 3); /* a refused bias leaves the last one */
    ck_assert_int_eq(bt_sampler_set_bias(s, NULL, NULL, 0, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_sampler_sample(s, k_logits), 0);
    bt_sampler_free(s);
    /* at temperature 1, token 0 banned: never drawn */
    par = plain(1.0);
    ck_assert_int_eq(bt_sampler_create(&par, NV, &s, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_sampler_set_bias(s, ids, up, 1, err, sizeof err), BT_OK);
    for (int k = 0; k < 2000; k++) ck_assert_int_ne(bt_sampler_sample(s, k_logits), 0);
    bt_sampler_free(s);
}
END_TEST

START_TEST(test_seed) {
    enum { NT = 32000, STEPS = 300 };
    float *logits = malloc(NT * sizeof *logits);
    bt_rng r;
    bt_rng_seed(&r, 99);
    for (int i = 0; i < NT; i++) logits[i] = (float)(bt_rng_uniform(&r) * 8.0);
    bt_sampler_params par;
    bt_sampler_params_default(&par);
    par.top_k = 0, par.top_p = 1, par.min_p = 0, par.temp = 1.5f; /* wide: many tokens possible */
    int32_t a[STEPS], b[STEPS], c[STEPS];
    char err[256];
    for (int run = 0; run < 3; run++) {
        bt_sampler *s;
        par.seed = run == 2 ? 43 : 42;
        ck_assert_int_eq(bt_sampler_create(&par, NT, &s, err, sizeof err), BT_OK);
        int32_t *out = run == 0 ? a : run == 1 ? b : c;
        for (int k = 0; k < STEPS; k++) out[k] = bt_sampler_sample(s, logits);
        if (run == 0) { /* reset restarts the stream */
            bt_sampler_reset(s);
            for (int k = 0; k < STEPS; k++) ck_assert_int_eq(bt_sampler_sample(s, logits), a[k]);
        }
        bt_sampler_free(s);
    }
    ck_assert(!memcmp(a, b, sizeof a));
    int differ = 0;
    for (int k = 0; k < STEPS; k++) differ += a[k] != c[k];
    ck_assert_int_gt(differ, STEPS / 2);
    /* the stream itself is fixed: these are xoshiro256** numbers of seed 42 through splitmix64 */
    bt_rng_seed(&r, 42);
    uint64_t x0 = bt_rng_next(&r), x1 = bt_rng_next(&r);
    bt_rng_seed(&r, 42);
    ck_assert_uint_eq(bt_rng_next(&r), x0);
    ck_assert_uint_eq(bt_rng_next(&r), x1);
    ck_assert_uint_ne(x0, x1);
    free(logits);
}
END_TEST

START_TEST(test_bad_params) {
    static const struct {
        const char *field;
        double value;
        const char *msg;
    } cases[] = {
        {"temp", -1, "--temp -1: the temperature must be 0 (greedy) or positive"},
        {"temp", NAN, "--temp nan: the temperature must be 0 (greedy) or positive"},
        {"top_k", -5, "--top-k -5: must be 0 (off) or positive"},
        {"top_p", 0, "--top-p 0: must be in (0, 1] (1 is off)"},
        {"top_p", 1.5, "--top-p 1.5: must be in (0, 1] (1 is off)"},
        {"min_p", -0.1, "--min-p -0.1: must be in [0, 1] (0 is off)"},
        {"repeat_penalty", 0, "--repeat-penalty 0: must be positive (1 is off)"},
        {"last_n", -2, "--repeat-last-n -2: must be -1 (all), 0 (off) or positive"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bt_sampler_params p;
        bt_sampler_params_default(&p);
        if (!strcmp(cases[i].field, "temp")) p.temp = (float)cases[i].value;
        else if (!strcmp(cases[i].field, "top_k")) p.top_k = (int32_t)cases[i].value;
        else if (!strcmp(cases[i].field, "top_p")) p.top_p = (float)cases[i].value;
        else if (!strcmp(cases[i].field, "min_p")) p.min_p = (float)cases[i].value;
        else if (!strcmp(cases[i].field, "repeat_penalty")) p.repeat_penalty = (float)cases[i].value;
        else p.penalty_last_n = (int32_t)cases[i].value;
        char err[256] = "";
        bt_sampler *s = (bt_sampler *)1;
        ck_assert_int_eq(bt_sampler_create(&p, 10, &s, err, sizeof err), BT_ERR_INVALID);
        ck_assert_ptr_null(s);
        ck_assert_str_eq(err, cases[i].msg);
    }
}
END_TEST

/* ---- stop strings and the token limit, on a real vocabulary ---- */

static bt_tokenizer *g_tok;

static void load_vocab(void) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-bpe.gguf", BATON_TEST_DATA);
    ck_assert_msg(bt_tokenizer_load(path, &g_tok, NULL, err, sizeof err) == BT_OK, "%s", err);
}

static void free_vocab(void) { bt_tokenizer_free(g_tok); }

/* run ids through a stopper; the shown text goes to out; returns the reason and the step it came at */
static enum bt_stop_reason run_stop(const char *const *stops, size_t n_stops, int64_t max, const int32_t *ids,
                                    size_t n, char *out, size_t *at) {
    bt_stopper *st;
    char err[256];
    ck_assert_msg(bt_stopper_create(stops, n_stops, max, &st, err, sizeof err) == BT_OK, "%s", err);
    size_t o = 0;
    enum bt_stop_reason r = BT_STOP_NONE;
    *at = n;
    for (size_t i = 0; i < n; i++) {
        const char *t;
        size_t l;
        r = bt_stopper_push(st, g_tok, ids[i], &t, &l);
        memcpy(out + o, t, l);
        o += l;
        if (r != BT_STOP_NONE) {
            *at = i;
            break;
        }
    }
    out[o] = 0;
    bt_stopper_free(st);
    return r;
}

static void ids_of(const char *text, bt_tokens *t) {
    char err[256];
    t->n = 0;
    ck_assert_msg(bt_tokenizer_tokenize(g_tok, text, strlen(text), 0, 0, t, err, sizeof err) == BT_OK, "%s", err);
}

START_TEST(test_stop_strings) {
    bt_tokens t = {0};
    char out[512];
    size_t at;
    ids_of("Hello world. The end is near.", &t);
    /* no stop: everything, then the limit at the last token */
    ck_assert_int_eq(run_stop(NULL, 0, (int64_t)t.n, t.ids, t.n, out, &at), BT_STOP_LIMIT);
    ck_assert_str_eq(out, "Hello world. The end is near.");
    ck_assert_uint_eq(at, t.n - 1);
    /* the limit cuts after max tokens */
    ck_assert_int_eq(run_stop(NULL, 0, 2, t.ids, t.n, out, &at), BT_STOP_LIMIT);
    ck_assert_str_eq(out, "Hello world");
    /* a stop string inside a token: the text ends before it and it is not shown */
    const char *stops[] = {"The e", "zzz"};
    ck_assert_int_eq(run_stop(stops, 2, -1, t.ids, t.n, out, &at), BT_STOP_STRING);
    ck_assert_str_eq(out, "Hello world. ");
    /* text that starts a stop string is held back until it cannot be one */
    bt_stopper *st;
    char err[256];
    const char *s2[] = {"world!"};
    ck_assert_int_eq(bt_stopper_create(s2, 1, -1, &st, err, sizeof err), BT_OK);
    const char *txt;
    size_t len;
    ck_assert_int_eq(bt_stopper_push(st, g_tok, t.ids[0], &txt, &len), BT_STOP_NONE); /* "Hello" */
    ck_assert_uint_eq(len, 5);
    ck_assert_int_eq(bt_stopper_push(st, g_tok, t.ids[1], &txt, &len), BT_STOP_NONE); /* " world": held */
    ck_assert_uint_eq(len, 1);                                                       /* only the space */
    ck_assert_int_eq(bt_stopper_push(st, g_tok, t.ids[2], &txt, &len), BT_STOP_NONE); /* "." : not "world!" */
    ck_assert_uint_eq(len, 6);
    ck_assert(!memcmp(txt, "world.", 6));
    bt_stopper_free(st);
    /* an end-of-generation token ends it and prints nothing */
    int32_t seq[3] = {t.ids[0], bt_tokenizer_eos(g_tok), t.ids[1]};
    ck_assert_int_eq(run_stop(NULL, 0, -1, seq, 3, out, &at), BT_STOP_EOG);
    ck_assert_str_eq(out, "Hello");
    ck_assert_uint_eq(at, 1);
    bt_tokens_free(&t);
}
END_TEST

START_TEST(test_stop_utf8_and_errors) {
    bt_tokens t = {0};
    char out[256];
    size_t at;
    /* the llama emoji is several byte-level tokens: nothing of it shows until it is whole */
    ids_of("a\xf0\x9f\xa6\x99", &t);
    ck_assert_uint_ge(t.n, 3);
    bt_stopper *st;
    char err[256];
    ck_assert_int_eq(bt_stopper_create(NULL, 0, -1, &st, err, sizeof err), BT_OK);
    size_t shown = 0;
    for (size_t i = 0; i < t.n; i++) {
        const char *txt;
        size_t len;
        ck_assert_int_eq(bt_stopper_push(st, g_tok, t.ids[i], &txt, &len), BT_STOP_NONE);
        ck_assert_int_eq(bt_utf8_check(txt, len), -1);
        shown += len;
        if (i + 1 < t.n) ck_assert_uint_le(shown, 1);
    }
    ck_assert_uint_eq(shown, 5);
    bt_stopper_free(st);
    /* cut by the limit inside the character: the rest shows as U+FFFD */
    ck_assert_int_eq(run_stop(NULL, 0, (int64_t)t.n - 1, t.ids, t.n, out, &at), BT_STOP_LIMIT);
    ck_assert(strncmp(out, "a\xef\xbf\xbd", 4) == 0);
    /* bad settings */
    ck_assert_int_eq(bt_stopper_create(NULL, 0, 0, &st, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "-n 0: the number of tokens to generate must be positive (or -1: no limit)");
    ck_assert_int_eq(bt_stopper_create(NULL, 0, -3, &st, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "-n -3: the number of tokens to generate must be positive (or -1: no limit)");
    const char *empty[] = {"ok", ""};
    ck_assert_int_eq(bt_stopper_create(empty, 2, 10, &st, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "stop string 2 is empty");
    const char *badu[] = {"a\xff"};
    ck_assert_int_eq(bt_stopper_create(badu, 1, 10, &st, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "stop string 1: invalid UTF-8 at byte 1");
    bt_tokens_free(&t);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("distributions");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_temperature);
    tcase_add_test(tc, test_top_k);
    tcase_add_test(tc, test_top_p);
    tcase_add_test(tc, test_min_p);
    tcase_add_test(tc, test_chain);
    tcase_add_test(tc, test_penalties);
    tcase_add_test(tc, test_greedy);
    tcase_add_test(tc, test_logprobs);
    tcase_add_test(tc, test_bias);
    tcase_add_test(tc, test_seed);
    tcase_add_test(tc, test_bad_params);
    suite_add_tcase(s, tc);
    tc = tcase_create("stop");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, load_vocab, free_vocab);
    tcase_add_test(tc, test_stop_strings);
    tcase_add_test(tc, test_stop_utf8_and_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
