/* metrics.h - what `baton serve` counts, and GET /metrics as Prometheus text
 * (exposition format 0.0.4): requests by endpoint and status, tokens in and
 * out, generation speed, queue and running requests, KV cache use, and the
 * busy fraction of every rank (time in graph compute, as the ubatches' answers
 * report it: bt_engine_compute_seconds) and of the engine loop.  HTTP threads count
 * requests; the engine's thread publishes a snapshot after each step; one
 * mutex guards both. */
#ifndef BATON_SERVE_METRICS_H
#define BATON_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum bt_metrics_endpoint {
    BT_EP_COMPLETIONS = 0,
    BT_EP_CHAT,
    BT_EP_MODELS,
    BT_EP_HEALTH,
    BT_EP_METRICS,
    BT_EP_MODEL,      /* GET /v1/models/{id} */
    BT_EP_TOKENIZE,   /* POST /tokenize */
    BT_EP_DETOKENIZE, /* POST /detokenize */
    BT_EP_EMBEDDINGS, /* POST /v1/embeddings */
    BT_EP_OTHER,
    BT_EP_COUNT
};

/* the status codes the server answers with, one counter each */
#define BT_METRICS_N_CODES 11

/* What the engine's thread publishes. */
struct bt_metrics_engine {
    uint64_t prompt_tokens, gen_tokens; /* totals */
    uint64_t cached_tokens;             /* prompt tokens whose cells were reused (not in prompt_tokens) */
    double busy_s;                      /* the engine loop with work to do */
    const double *rank_compute_s;       /* [n_ranks]: each rank's time in graph compute (copied) */
    int n_ranks;
    int64_t kv_used, kv_cells;          /* cells holding tokens, and all */
};

struct bt_metrics {
    pthread_mutex_t mu;
    double t_start; /* monotonic seconds */
    uint64_t requests[BT_EP_COUNT][BT_METRICS_N_CODES];
    uint64_t rejected_full; /* 503 because the queue was full */
    uint64_t cancelled;     /* clients that went away */
    double ttft_sum_s, latency_sum_s;
    uint64_t n_timed;
    struct bt_metrics_engine eng; /* eng.rank_compute_s points to rank_compute_s */
    double *rank_compute_s;
    int n_ranks_cap;
};

void bt_metrics_init(struct bt_metrics *m);
void bt_metrics_destroy(struct bt_metrics *m);
void bt_metrics_request(struct bt_metrics *m, enum bt_metrics_endpoint ep, int status);
/* A finished generation: time to first text and whole latency (seconds). */
void bt_metrics_timing(struct bt_metrics *m, double ttft_s, double latency_s);
void bt_metrics_cancelled(struct bt_metrics *m);
void bt_metrics_rejected(struct bt_metrics *m);
void bt_metrics_publish(struct bt_metrics *m, const struct bt_metrics_engine *e);
/* The Prometheus text (malloc'd; NULL when out of memory). */
char *bt_metrics_text(struct bt_metrics *m, int queued, int running, int slots, const char *model);

#endif
