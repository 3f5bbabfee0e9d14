/* serve.h - `baton serve` on rank 0: the HTTP server (http.c) and the loop
 * that runs the batcher on the engine's thread (loop.c), joined by the job
 * queue (jobs.h).
 *
 *   HTTP thread (one per connection, libmicrohttpd): route, authenticate,
 *   bound the body, parse and check the request (api.c), apply the chat
 *   template and tokenize, check the prompt against a sequence's share of
 *   the context, submit a job (503 with Retry-After past the queue), then
 *   wait for its text: one JSON answer, or server-sent events as it comes.
 *   A client that goes away cancels its job.
 *
 *   Engine's thread (the program's main thread): takes queued jobs into free
 *   sequence slots (bt_batcher_add), forwards cancels, steps the batcher,
 *   hands each job its text and end, publishes the metrics; on SIGTERM it
 *   stops taking requests, finishes those in flight, and returns. */
#ifndef BATON_SERVE_SERVE_H
#define BATON_SERVE_SERVE_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../run/batcher.h"
#include "../text/tokenizer.h"
#include "api.h"
#include "jobs.h"
#include "metrics.h"

struct bt_serve_config {
    const char *host;    /* address to bind; default 127.0.0.1 */
    int port;            /* 0: any free port (printed) */
    const char *api_key; /* NULL: no key asked */
    size_t max_body;     /* bytes of a request body */
    int max_connections; /* open connections at once (and BT_SERVE_SPARE_CONNECTIONS for /health) */
    int max_client_connections; /* open connections from one address (and the spare ones) */
    int timeout_s;       /* an idle connection is closed after this long */
    int max_queue;       /* requests waiting beyond the sequence slots */
    int n_slots;         /* sequence slots (--parallel) */
    int64_t n_ctx_seq;   /* cells of one sequence: prompt + generated tokens */
    const char *model_id;
    const char *cors;    /* NULL: no CORS headers; else Access-Control-Allow-Origin's value ("*" or an origin) */
    enum bt_pooling pooling; /* /v1/embeddings: mean or last */
};

/* connections past --max-connections, or past --max-client-connections for
 * their address, that are still taken: each answers /health only (others get
 * 503 or 429 naming the limit), then closes, and is closed after
 * SPARE_TIMEOUT_S idle; past these, libmicrohttpd closes a new connection
 * unanswered */
#ifndef BT_SERVE_SPARE_CONNECTIONS
#define BT_SERVE_SPARE_CONNECTIONS 2
#endif

/* open connections: in all and per client address (under mu) */
struct bt_conn_count {
    pthread_mutex_t mu;
    int open;
    struct bt_conn_client *clients; /* one per address with connections open */
    int n_clients;
    size_t cap_clients;
};

struct bt_server {
    struct bt_serve_config cfg;
    const bt_tokenizer *tok;
    const bt_chat_template *chat_template; /* the model's (Jinja) or a built-in format */
    struct bt_api_limits lim;
    struct bt_jobs jobs;
    struct bt_metrics metrics;
    struct bt_conn_count conns;
    int64_t created;   /* Unix seconds at start */
    uint64_t next_id;  /* request numbers (under jobs.mu) */
    struct bt_batcher *batcher; /* while bt_server_run runs */
    int n_answering;            /* submitted jobs whose answer is not yet sent (under jobs.mu) */
    struct MHD_Daemon *daemon;
    int port;          /* bound */
    /* while MHD_start_daemon runs, its log's first line is kept here, not
     * printed: a failed start is then one message with MHD's reason */
    atomic_bool starting;
    atomic_bool refused_logged; /* MHD's "reached connection limit" shown once */
    char start_log[256];
};

/* Start listening (HTTP threads run from here on).  BT_ERR_IO with a message
 * naming the address when it cannot bind.  tok and chat_template must
 * outlive the server. */
enum bt_status bt_server_start(struct bt_server *s, const struct bt_serve_config *cfg, const bt_tokenizer *tok,
                               const bt_chat_template *chat_template, char *err, size_t n_err);
/* Let every submitted request's answer go out (at most 30 s), then stop
 * listening and wait for the HTTP threads. */
void bt_server_stop(struct bt_server *s);

/* The engine's thread: run until *stop is set (then drain: refuse new
 * requests, finish the running ones) or the batcher fails.  BT_OK after a
 * drain; the batcher's status and message in err after a failure. */
enum bt_status bt_server_run(struct bt_server *s, struct bt_batcher *b, struct bt_engine *e,
                             volatile sig_atomic_t *stop, char *err, size_t n_err);

#endif
