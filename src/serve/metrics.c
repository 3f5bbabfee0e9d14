/* metrics.c - counters of `baton serve` and their Prometheus text (metrics.h). */
#define _POSIX_C_SOURCE 200809L
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.h" /* bt_now_s */

static const int k_codes[BT_METRICS_N_CODES] = {200, 204, 400, 401, 404, 405, 413, 429, 500, 503, 0};
static const char *const k_endpoints[BT_EP_COUNT] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/v1/models/{id}",
    "/tokenize",       "/detokenize",          "/v1/embeddings", "other"};

void bt_metrics_init(struct bt_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->t_start = bt_now_s();
}

void bt_metrics_destroy(struct bt_metrics *m) {
    pthread_mutex_destroy(&m->mu);
    free(m->rank_compute_s);
    m->rank_compute_s = NULL;
}

void bt_metrics_request(struct bt_metrics *m, enum bt_metrics_endpoint ep, int status) {
    int c = BT_METRICS_N_CODES - 1; /* "other" */
    for (int i = 0; i < BT_METRICS_N_CODES - 1; i++)
        if (k_codes[i] == status) c = i;
    pthread_mutex_lock(&m->mu);
    m->requests[ep][c]++;
    pthread_mutex_unlock(&m->mu);
}

void bt_metrics_timing(struct bt_metrics *m, double ttft_s, double latency_s) {
    pthread_mutex_lock(&m->mu);
    m->ttft_sum_s += ttft_s;
    m->latency_sum_s += latency_s;
    m->n_timed++;
    pthread_mutex_unlock(&m->mu);
}

void bt_metrics_cancelled(struct bt_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void bt_metrics_rejected(struct bt_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->rejected_full++;
    pthread_mutex_unlock(&m->mu);
}

void bt_metrics_publish(struct bt_metrics *m, const struct bt_metrics_engine *e) {
    pthread_mutex_lock(&m->mu);
    m->eng = *e;
    if (e->n_ranks > m->n_ranks_cap) {
        double *r = realloc(m->rank_compute_s, (size_t)e->n_ranks * sizeof *r);
        if (r) m->rank_compute_s = r, m->n_ranks_cap = e->n_ranks;
    }
    m->eng.n_ranks = e->n_ranks <= m->n_ranks_cap ? e->n_ranks : 0; /* out of memory: none shown */
    if (m->eng.n_ranks > 0) memcpy(m->rank_compute_s, e->rank_compute_s, (size_t)m->eng.n_ranks * sizeof(double));
    m->eng.rank_compute_s = m->rank_compute_s;
    pthread_mutex_unlock(&m->mu);
}

struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
};

static void put(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
}

static void metric(struct sbuf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *bt_metrics_text(struct bt_metrics *m, int queued, int running, int slots, const char *model) {
    struct sbuf b = {malloc(4096), 0, 4096, 0};
    if (!b.s) return NULL;
    b.s[0] = 0;
    pthread_mutex_lock(&m->mu);
    struct bt_metrics copy = *m;
    double *rank_s = copy.eng.n_ranks > 0 ? malloc((size_t)copy.eng.n_ranks * sizeof *rank_s) : NULL;
    if (rank_s) memcpy(rank_s, m->rank_compute_s, (size_t)copy.eng.n_ranks * sizeof *rank_s);
    else copy.eng.n_ranks = 0;
    pthread_mutex_unlock(&m->mu);
    double up = bt_now_s() - copy.t_start;

    metric(&b, "baton_requests_total", "counter", "HTTP requests answered, by endpoint and status code.");
    for (int e = 0; e < BT_EP_COUNT; e++)
        for (int c = 0; c < BT_METRICS_N_CODES; c++) {
            if (!copy.requests[e][c]) continue;
            if (k_codes[c])
                put(&b, "baton_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n", k_endpoints[e], k_codes[c],
                    (unsigned long long)copy.requests[e][c]);
            else
                put(&b, "baton_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n", k_endpoints[e],
                    (unsigned long long)copy.requests[e][c]);
        }
    metric(&b, "baton_requests_rejected_total", "counter", "Requests refused with 503 because the queue was full.");
    put(&b, "baton_requests_rejected_total %llu\n", (unsigned long long)copy.rejected_full);
    metric(&b, "baton_requests_cancelled_total", "counter", "Requests whose client went away before the end.");
    put(&b, "baton_requests_cancelled_total %llu\n", (unsigned long long)copy.cancelled);
    metric(&b, "baton_prompt_tokens_total", "counter", "Prompt tokens processed.");
    put(&b, "baton_prompt_tokens_total %llu\n", (unsigned long long)copy.eng.prompt_tokens);
    metric(&b, "baton_prompt_tokens_cached_total", "counter",
           "Prompt tokens whose KV cells were reused from an earlier request (cache_prompt), not processed.");
    put(&b, "baton_prompt_tokens_cached_total %llu\n", (unsigned long long)copy.eng.cached_tokens);
    metric(&b, "baton_generated_tokens_total", "counter", "Tokens generated.");
    put(&b, "baton_generated_tokens_total %llu\n", (unsigned long long)copy.eng.gen_tokens);
    metric(&b, "baton_generated_tokens_per_second", "gauge",
           "Tokens generated per second of the engine loop's busy time.");
    put(&b, "baton_generated_tokens_per_second %.3f\n",
        copy.eng.busy_s > 0 ? (double)copy.eng.gen_tokens / copy.eng.busy_s : 0.0);
    metric(&b, "baton_time_to_first_token_seconds_avg", "gauge", "Mean time from submission to the first text.");
    put(&b, "baton_time_to_first_token_seconds_avg %.6f\n", copy.n_timed ? copy.ttft_sum_s / (double)copy.n_timed : 0);
    metric(&b, "baton_request_latency_seconds_avg", "gauge", "Mean time from submission to the last token.");
    put(&b, "baton_request_latency_seconds_avg %.6f\n", copy.n_timed ? copy.latency_sum_s / (double)copy.n_timed : 0);
    metric(&b, "baton_requests_queued", "gauge", "Requests waiting for a sequence slot.");
    put(&b, "baton_requests_queued %d\n", queued);
    metric(&b, "baton_requests_running", "gauge", "Requests holding a sequence slot.");
    put(&b, "baton_requests_running %d\n", running);
    metric(&b, "baton_sequence_slots", "gauge", "Sequence slots (--parallel).");
    put(&b, "baton_sequence_slots %d\n", slots);
    metric(&b, "baton_kv_cache_used_cells", "gauge", "KV cache cells holding a token.");
    put(&b, "baton_kv_cache_used_cells %lld\n", (long long)copy.eng.kv_used);
    metric(&b, "baton_kv_cache_cells", "gauge", "KV cache cells (--ctx-size).");
    put(&b, "baton_kv_cache_cells %lld\n", (long long)copy.eng.kv_cells);
    metric(&b, "baton_kv_cache_usage_ratio", "gauge", "Used KV cache cells over all cells.");
    put(&b, "baton_kv_cache_usage_ratio %.6f\n",
        copy.eng.kv_cells ? (double)copy.eng.kv_used / (double)copy.eng.kv_cells : 0.0);
    metric(&b, "baton_engine_busy_fraction", "gauge", "Fraction of the uptime the engine loop had work to do.");
    put(&b, "baton_engine_busy_fraction %.6f\n", up > 0 ? copy.eng.busy_s / up : 0.0);
    metric(&b, "baton_rank_busy_fraction", "gauge", "Fraction of the uptime a rank spent in graph compute.");
    for (int r = 0; r < copy.eng.n_ranks; r++)
        put(&b, "baton_rank_busy_fraction{rank=\"%d\"} %.6f\n", r, up > 0 ? rank_s[r] / up : 0.0);
    free(rank_s);
    metric(&b, "baton_uptime_seconds", "counter", "Seconds since the server started.");
    put(&b, "baton_uptime_seconds %.3f\n", up);
    metric(&b, "baton_model_info", "gauge", "The model served.");
    put(&b, "baton_model_info{model=\"");
    for (const char *c = model; *c; c++) { /* a label value escapes \\, " and newlines */
        if (*c == '\\' || *c == '"')
            put(&b, "\\%c", *c);
        else if (*c == '\n')
            put(&b, "\\n");
        else
            put(&b, "%c", *c);
    }
    put(&b, "\"} 1\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
