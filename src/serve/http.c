/* http.c - the HTTP side of `baton serve` (serve.h): libmicrohttpd with one
 * thread per connection (a request's thread may block on its job), routing,
 * the Bearer key, the body limit, prompts (chat template, tokenizer, length
 * against a sequence's share of the context), job submission, and answers as
 * one JSON object or as server-sent events.  A chat with tools gets the
 * template's call format and the calls' grammar here, and its reply parsed
 * back into tool_calls.  Besides OpenAI's routes:
 * llama-server's /tokenize and /detokenize (the tokenizer alone, no job),
 * /v1/embeddings (a job per input: its prompt's hidden states pooled by the
 * batcher, --pooling),
 * HEAD on every GET route (libmicrohttpd sends the headers without the body),
 * and with --cors the CORS headers and OPTIONS preflights (which need no key:
 * a browser sends them without one).
 *
 * A thread waiting for its job wakes at least every WAIT_MS to look at its
 * socket: a client that closed it cancels the job at once (its sequence is
 * freed at the batcher's next step), streamed or not.
 *
 * Two answers are written to the socket here, not through libmicrohttpd,
 * which (0.9.75) cannot give them:
 *   - a chunked body (no Content-Length) that passes --max-body: MHD queues
 *     no response before the whole body is in, so the 413 goes out at once,
 *     the rest of the body is read and dropped (up to DRAIN_FACTOR times the
 *     limit), and the connection is closed;
 *   - a Content-Length that is no byte count (negative, "5x") or past 2^64:
 *     MHD refuses it before any handler runs, and its answer went out twice
 *     (parse_connection_headers queues it, then the state machine builds the
 *     headers again).  Its log line about the header is the only hook: the
 *     JSON error is written there and the socket shut for writing, so MHD's
 *     own copy goes nowhere. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve.h"
#include "../mem.h"

#define WAIT_MS 50
#define RETRY_AFTER_S "1"
#define CORS_MAX_AGE_S "86400" /* how long a browser may keep a preflight's answer */
#define DRAIN_FACTOR 16 /* an over-long chunked body is read and dropped up to this many times --max-body */
#define RAW_SEND_MS 2000 /* the most a raw answer waits for room in the socket */
#define SPARE_TIMEOUT_S 1u /* a spare connection (serve.h) idle this long is closed */

enum route {
    R_COMPLETIONS = BT_EP_COMPLETIONS,
    R_CHAT = BT_EP_CHAT,
    R_MODELS = BT_EP_MODELS,
    R_HEALTH = BT_EP_HEALTH,
    R_METRICS = BT_EP_METRICS,
    R_MODEL = BT_EP_MODEL, /* /v1/models/{id} */
    R_TOKENIZE = BT_EP_TOKENIZE,
    R_DETOKENIZE = BT_EP_DETOKENIZE,
    R_EMBEDDINGS = BT_EP_EMBEDDINGS,
    R_NONE = BT_EP_OTHER,
};

#define MODELS_PREFIX "/v1/models/"

/* what a route takes; the others take GET (and HEAD) */
static bool route_is_post(enum route rt) {
    return rt == R_COMPLETIONS || rt == R_CHAT || rt == R_TOKENIZE || rt == R_DETOKENIZE || rt == R_EMBEDDINGS;
}

/* one request's state, from its first call to MHD's "completed" */
struct req {
    struct bt_server *s;
    struct MHD_Connection *conn;
    enum route route;
    char *body;
    size_t len, cap;
    bool answered;
    bool raw;       /* answered on the socket (send_raw): MHD must send nothing more */
    bool spare;     /* on a spare connection: /health only, then close */
    struct bt_job *job;
    struct bt_job **embd_jobs; /* /v1/embeddings: one job per input */
    size_t n_embd_jobs;
    /* streaming */
    int phase;       /* 0 first chunks, 1 text, 2 usage, 3 [DONE], 4 end */
    int next;        /* phase 0: the choice whose first chunk is next; 1: the choice to look at first */
    char *out;       /* the SSE bytes being sent */
    size_t out_len, out_pos;
    bool timed;
    bool gone;      /* the client went away before the end of its answer */
    bool submitted; /* counted in s->n_answering */
    /* a chat with tools (job->tools): the calls parsed from the whole answer */
    struct bt_tool_call *calls;
    int n_calls;
    struct bt_tool_stream ts; /* ... or streamed: the reply read call by call */
};

static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return true;
    if (p.revents & POLLIN) {
        char ch;
        return recv(ci->connect_fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    return false;
}

/* libmicrohttpd runs each connection on a thread of its own
 * (MHD_USE_THREAD_PER_CONNECTION): the thread names the connection whose
 * request line it read last, for the log hook (on_mhd_log) */
struct conn_tls {
    struct MHD_Connection *conn;
    enum route route;
    bool quiet; /* answered on the socket: MHD's lines about closing it are noise */
};
static _Thread_local struct conn_tls tls;

/* an error as a whole HTTP/1.1 answer written to the socket, then
 * "Connection: close"; false when the socket takes none of it in time */
static bool send_raw(struct bt_server *s, struct MHD_Connection *c, enum route rt, const struct bt_api_error *e) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char *js = bt_api_error_json(e);
    if (!ci || !js) {
        free(js);
        return false;
    }
    const char *reason = MHD_get_reason_phrase_for((unsigned)e->status);
    char cors[320] = "";
    if (s->cfg.cors) snprintf(cors, sizeof cors, "Access-Control-Allow-Origin: %s\r\n", s->cfg.cors);
    char *msg = NULL;
    int n = asprintf(&msg,
                     "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\n%s"
                     "Content-Length: %zu\r\n\r\n%s",
                     e->status, reason && *reason ? reason : "Error", cors, strlen(js), js);
    free(js);
    if (n < 0) return false;
    size_t off = 0;
    while (off < (size_t)n) {
        ssize_t k = send(ci->connect_fd, msg + off, (size_t)n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            off += (size_t)k;
            continue;
        }
        struct pollfd p = {.fd = ci->connect_fd, .events = POLLOUT};
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) && poll(&p, 1, RAW_SEND_MS) > 0)
            continue;
        break;
    }
    free(msg);
    bt_metrics_request(&s->metrics, (enum bt_metrics_endpoint)rt, e->status);
    tls.quiet = true;
    return off == (size_t)n;
}

/* --cors: every answer says which origin may read it; a spare connection
 * (serve.h) is closed after its answer */
static void add_cors(struct req *r, struct MHD_Response *resp) {
    if (r->s->cfg.cors) MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_ORIGIN, r->s->cfg.cors);
    if (r->spare) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* ---- open connections: per client address, and the spare ones ---- */

/* a client address: the family and its bytes (IPv4 4, IPv6 16) */
struct bt_conn_client {
    int family;
    uint8_t addr[16];
    int open;
};

/* a connection's record (its MHD socket context) */
struct conn_info {
    struct bt_conn_client who; /* .open unused */
    int spare;                 /* 0: within the limits; 503: past --max-connections; 429: past its address's */
};

static void client_of(struct MHD_Connection *c, struct bt_conn_client *who) {
    memset(who, 0, sizeof *who);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (!sa) return;
    who->family = sa->sa_family;
    if (sa->sa_family == AF_INET) memcpy(who->addr, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    else if (sa->sa_family == AF_INET6)
        memcpy(who->addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
}

/* the address's entry (added with open 0); NULL when out of memory (under mu) */
static struct bt_conn_client *client_entry(struct bt_conn_count *cc, const struct bt_conn_client *who) {
    for (int i = 0; i < cc->n_clients; i++)
        if (cc->clients[i].family == who->family && !memcmp(cc->clients[i].addr, who->addr, sizeof who->addr))
            return &cc->clients[i];
    struct bt_conn_client *t = bt_grow(cc->clients, &cc->cap_clients, (size_t)cc->n_clients + 1, sizeof *t, 16);
    if (!t) return NULL;
    cc->clients = t;
    struct bt_conn_client *e = &cc->clients[cc->n_clients++];
    *e = *who;
    e->open = 0;
    return e;
}

/* MHD's accept thread (STARTED) and the connection's (CLOSED): count the
 * connection, in all and for its address; past a limit it is a spare one */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct bt_server *s = cls;
    struct bt_conn_count *cc = &s->conns;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct conn_info *ci = calloc(1, sizeof *ci);
        if (!ci) return; /* not counted: served as within the limits */
        client_of(conn, &ci->who);
        pthread_mutex_lock(&cc->mu);
        struct bt_conn_client *e = client_entry(cc, &ci->who);
        if (!e) {
            pthread_mutex_unlock(&cc->mu);
            free(ci);
            return;
        }
        cc->open++;
        e->open++;
        ci->spare = cc->open > s->cfg.max_connections ? 503 : e->open > s->cfg.max_client_connections ? 429 : 0;
        pthread_mutex_unlock(&cc->mu);
        if (ci->spare) MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, SPARE_TIMEOUT_S);
        *socket_context = ci;
        return;
    }
    struct conn_info *ci = *socket_context;
    if (!ci) return;
    pthread_mutex_lock(&cc->mu);
    struct bt_conn_client *e = client_entry(cc, &ci->who); /* there: counted at the start */
    cc->open--;
    if (e && --e->open <= 0) *e = cc->clients[--cc->n_clients];
    pthread_mutex_unlock(&cc->mu);
    free(ci);
    *socket_context = NULL;
}

/* text (owned; NULL: no body) with its type (NULL: none) */
static enum MHD_Result send_text(struct req *r, int status, const char *type, char *text,
                                 const char *extra_name, const char *extra_value) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text ? text : (char *)"",
                                        text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(text);
        return MHD_NO;
    }
    if (type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (extra_name) MHD_add_response_header(resp, extra_name, extra_value);
    add_cors(r, resp);
    enum MHD_Result ok = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    bt_metrics_request(&r->s->metrics, (enum bt_metrics_endpoint)r->route, status);
    r->answered = true;
    return ok;
}

static enum MHD_Result send_error(struct req *r, const struct bt_api_error *e, const char *extra_name,
                                  const char *extra_value) {
    char *js = bt_api_error_json(e);
    if (!js) return MHD_NO;
    return send_text(r, e->status, "application/json", js, extra_name, extra_value);
}

static enum MHD_Result fail(struct req *r, int status, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result fail(struct req *r, int status, const char *type, const char *code, const char *fmt, ...) {
    struct bt_api_error e;
    bt_api_error_set(&e, status, type, NULL, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    return send_error(r, &e, NULL, NULL);
}

static enum route route_of(const char *url) {
    if (!strcmp(url, "/v1/completions")) return R_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return R_CHAT;
    if (!strcmp(url, "/v1/models")) return R_MODELS;
    if (!strcmp(url, "/health")) return R_HEALTH;
    if (!strcmp(url, "/metrics")) return R_METRICS;
    if (!strncmp(url, MODELS_PREFIX, strlen(MODELS_PREFIX))) return R_MODEL;
    if (!strcmp(url, "/tokenize")) return R_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return R_DETOKENIZE;
    if (!strcmp(url, "/v1/embeddings")) return R_EMBEDDINGS;
    return R_NONE;
}

static bool key_ok(struct bt_server *s, struct MHD_Connection *c, struct bt_api_error *e) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) {
        bt_api_error_set(e, 401, "authentication_error", NULL, "invalid_api_key",
                         "You didn't provide an API key: send the header 'Authorization: Bearer KEY'");
        return false;
    }
    const char *k = strncmp(h, "Bearer ", 7) ? NULL : h + 7;
    /* the same time whatever the first differing byte (no early exit) */
    size_t n = strlen(s->cfg.api_key), m = k ? strlen(k) : 0;
    unsigned diff = (unsigned)(n != m) | (unsigned)(k == NULL);
    for (size_t i = 0; k && i < n && i < m; i++) diff |= (unsigned char)(k[i] ^ s->cfg.api_key[i]);
    if (diff) {
        bt_api_error_set(e, 401, "authentication_error", NULL, "invalid_api_key", "Incorrect API key provided");
        return false;
    }
    return true;
}

/* ---- prompts ---- */

/* A chat with tools: the template's call format into j, and the grammar
 * of the calls: from the start for tool_choice required or named; for
 * "auto" from the format's opening mark on (unless response_format asks
 * for JSON: that grammar stays). */
static bool tool_setup(struct bt_server *s, struct bt_job *j, struct bt_api_error *e) {
    struct bt_api_request *q = &j->req;
    if (q->tool_choice == BT_API_TOOLS_NONE) return true;
    j->tools = bt_chat_template_tools(s->chat_template);
    if (j->tools == BT_TOOL_FORMAT_NONE) {
        bt_api_error_set(e, 400, "invalid_request_error", "tools", NULL,
                         "'tools' cannot be used with this model: its chat template (%s) shows no tool-call format "
                         "baton knows (Hermes <tool_call> as Qwen2.5 and Qwen3 write it, Llama 3.1's JSON call, "
                         "Mistral's [TOOL_CALLS]); give one with --chat-template FILE",
                         bt_chat_template_kind(s->chat_template));
        return false;
    }
    j->mark = bt_tool_format_trigger(j->tools);
    if (q->tool_choice == BT_API_TOOLS_AUTO) {
        if (q->grammar) return true;
        j->trigger = j->mark;
    }
    char where[256], msg[400];
    int bad_tool;
    const int only = q->tool_choice == BT_API_TOOLS_NAMED ? q->tool_named : -1;
    enum bt_status st = bt_tool_grammar_build(j->tools, q->tools, q->n_tools, only,
                                              q->parallel_tool_calls && only < 0 ? BT_TOOL_MAX_CALLS : 1, &q->grammar,
                                              &bad_tool, where, sizeof where, msg, sizeof msg);
    if (st == BT_OK) return true;
    char param[300];
    if (bad_tool >= 0)
        snprintf(param, sizeof param, "tools[%d].function.parameters%s%s", bad_tool, where[0] ? "." : "", where);
    else
        snprintf(param, sizeof param, "tools");
    bt_api_error_set(e, st == BT_ERR_NOMEM ? 500 : 400, st == BT_ERR_NOMEM ? "server_error" : "invalid_request_error",
                     param, NULL, "'%s' cannot be followed: %s", param, msg);
    return false;
}

/* The prompt's tokens into j (the request already checked). */
static bool make_prompt(struct bt_server *s, struct bt_job *j, struct bt_api_error *e) {
    struct bt_api_request *q = &j->req;
    char msg[512] = "";
    if (q->prompt_ids) {
        j->prompt = malloc(q->n_prompt_ids * sizeof *j->prompt);
        if (!j->prompt) goto oom;
        memcpy(j->prompt, q->prompt_ids, q->n_prompt_ids * sizeof *j->prompt);
        j->n_prompt = q->n_prompt_ids;
        if (q->echo) {
            size_t len;
            j->echo = bt_tokenizer_detokenize(s->tok, j->prompt, j->n_prompt, 0, 0, &len);
            if (!j->echo) goto oom;
        }
    } else {
        char *text = q->prompt;
        char *owned = NULL;
        if (q->kind == BT_API_CHAT) {
            if (!tool_setup(s, j, e)) return false;
            enum bt_status cst = bt_chat_template_apply(s->chat_template, q->msgs, (const char *const *)q->msg_json,
                                                        q->n_msgs, q->tools_json, 1, &owned, msg, sizeof msg);
            if (cst == BT_ERR_ABORTED) { /* the template's own refusal (roles must alternate, ...): the client's */
                bt_api_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s", msg);
                return false;
            }
            if (cst != BT_OK) {
                bt_api_error_set(e, 500, "server_error", NULL, NULL, "%s", msg);
                return false;
            }
            text = owned;
        } else if (q->echo && !(j->echo = strdup(q->prompt))) {
            goto oom;
        }
        bt_tokens t = {0};
        enum bt_status st = bt_tokenizer_tokenize(s->tok, text, strlen(text), 1, 1, &t, msg, sizeof msg);
        free(owned);
        if (st != BT_OK) {
            bt_tokens_free(&t);
            bt_api_error_set(e, 400, "invalid_request_error", q->kind == BT_API_CHAT ? "messages" : "prompt", NULL,
                             "the prompt cannot be tokenized: %s", msg);
            return false;
        }
        /* a template that writes the BOS text itself, and a vocabulary that adds one */
        int32_t bos = bt_tokenizer_bos(s->tok);
        if (t.n >= 2 && bos != BT_TOKEN_NONE && t.ids[0] == bos && t.ids[1] == bos) {
            memmove(t.ids, t.ids + 1, (t.n - 1) * sizeof *t.ids);
            t.n--;
        }
        j->prompt = t.ids;
        j->n_prompt = t.n;
    }
    if (j->n_prompt == 0) {
        bt_api_error_set(e, 400, "invalid_request_error", "prompt", NULL, "the prompt has no tokens");
        return false;
    }
    /* as llama-server: a max_tokens past what the request's share of the
     * context leaves is not refused; the completion ends when the share is
     * full, with finish_reason "length".  Only a prompt that fills it is. */
    const int64_t share = s->cfg.n_ctx_seq, n = (int64_t)j->n_prompt;
    if (n >= share) {
        bt_api_error_set(e, 400, "invalid_request_error", q->kind == BT_API_CHAT ? "messages" : "prompt",
                         "context_length_exceeded",
                         "This model's maximum context length is %lld tokens per request. However, your %s has %lld "
                         "tokens, which leaves no room for the completion.",
                         (long long)share, q->kind == BT_API_CHAT ? "messages" : "prompt", (long long)n);
        return false;
    }
    return true;
oom:
    bt_api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* ---- answers ---- */

/* lp[0..n) with each token's text, for the JSON writers (free with
 * logprobs_free); false when out of memory */
static bool logprobs_view(const bt_tokenizer *tok, const bt_logprobs *lp, size_t n, int64_t text_offset,
                          struct bt_api_logprobs *v) {
    struct bt_api_piece *piece = malloc((n ? n : 1) * sizeof *piece);
    struct bt_api_piece(*top)[BT_MAX_TOP_LOGPROBS] = malloc((n ? n : 1) * sizeof *top);
    if (!piece || !top) {
        free(piece);
        free(top);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        piece[i].text = bt_tokenizer_piece(tok, lp[i].id, 0, &piece[i].len);
        for (int32_t k = 0; k < lp[i].n_top; k++)
            top[i][k].text = bt_tokenizer_piece(tok, lp[i].top_id[k], 0, &top[i][k].len);
    }
    *v = (struct bt_api_logprobs){.lp = lp, .piece = piece, .top = top, .n = n, .text_offset = text_offset};
    return true;
}

static void logprobs_free(struct bt_api_logprobs *v) {
    free((void *)v->piece);
    free((void *)v->top);
}

static void count_timing(struct req *r) {
    if (r->timed) return;
    r->timed = true;
    struct bt_job *j = r->job;
    double now = bt_now_s();
    bt_metrics_timing(&r->s->metrics, j->t_first - j->t_submit, now - j->t_submit);
}

/* A finished job's failure: its own or a choice's (NULL: none). */
static const struct bt_job *failed_choice(struct bt_job *j) {
    for (int i = 0; i < j->n_choices; i++) {
        const struct bt_job *c = bt_job_choice(j, i);
        if (c->res.finish == BT_FINISH_ERROR || c->res.finish == BT_FINISH_CANCELLED || c->error[0]) return c;
    }
    return NULL;
}

/* The usage of a finished job: its prompt once, every choice's tokens. */
static struct bt_api_usage job_usage(struct bt_job *j) {
    struct bt_api_usage u = {j->res.n_prompt, j->res.n_cached, 0};
    for (int i = 0; i < j->n_choices; i++) u.n_gen += bt_job_choice(j, i)->res.n_gen;
    return u;
}

/* The answer of a finished job's choices; NULL when out of memory. */
static char *whole_json(struct req *r) {
    struct bt_server *s = r->s;
    struct bt_job *j = r->job;
    const int n = j->n_choices;
    const size_t elen = j->echo ? strlen(j->echo) : 0;
    struct bt_api_choice *ch = calloc((size_t)n, sizeof *ch);
    struct bt_api_logprobs *lp = calloc((size_t)n, sizeof *lp);
    char **text = calloc((size_t)n, sizeof *text);
    bool ok = ch && lp && text;
    int n_lp = 0;
    for (int i = 0; ok && i < n; i++) {
        const struct bt_job *c = bt_job_choice(j, i);
        if (!(text[i] = malloc(elen + c->len + 1))) {
            ok = false;
            break;
        }
        if (elen) memcpy(text[i], j->echo, elen);
        if (c->len) memcpy(text[i] + elen, c->text, c->len);
        if (j->req.logprobs && !(ok = logprobs_view(s->tok, c->lp, c->n_lp, 0, &lp[i]))) break;
        n_lp += j->req.logprobs;
        ch[i] = (struct bt_api_choice){text[i], elen + c->len, bt_finish_name(c->res.finish),
                                       j->req.logprobs ? &lp[i] : NULL};
    }
    const struct bt_api_usage u = job_usage(j);
    char *js = ok ? bt_api_response_n_json(&j->req, j->id, j->created, s->cfg.model_id, ch, (size_t)n, &u) : NULL;
    for (int i = 0; text && i < n; i++) free(text[i]);
    for (int i = 0; i < n_lp; i++) logprobs_free(&lp[i]);
    free(text);
    free(lp);
    free(ch);
    return js;
}

/* A chat answer with tools (one choice) whose text holds calls: the
 * tool_calls answer.  *plain: it holds none (or there are no tools), the
 * plain answer follows; NULL without *plain: out of memory. */
static char *tool_answer_json(struct req *r, bool *plain) {
    struct bt_server *s = r->s;
    struct bt_job *j = r->job;
    *plain = true;
    if (j->tools == BT_TOOL_FORMAT_NONE) return NULL;
    char *content = NULL;
    const int n_calls = bt_tool_calls_parse(j->tools, j->text, j->len, &r->calls, &content);
    if (n_calls == 0) return NULL;
    *plain = false;
    struct bt_api_logprobs lp;
    if (n_calls < 0 || (j->req.logprobs && !logprobs_view(s->tok, j->lp, j->n_lp, 0, &lp))) {
        free(content);
        return NULL;
    }
    r->n_calls = n_calls;
    const struct bt_api_usage u = job_usage(j);
    char *js = bt_api_tool_response_json(&j->req, j->id, j->created, s->cfg.model_id, content, r->calls, n_calls, &u,
                                         j->req.logprobs ? &lp : NULL);
    free(content);
    if (j->req.logprobs) logprobs_free(&lp);
    return js;
}

static enum MHD_Result answer_whole(struct req *r) {
    struct bt_server *s = r->s;
    struct bt_job *j = r->job;
    pthread_mutex_lock(&s->jobs.mu);
    while (j->state != BT_JOB_DONE) {
        bt_job_wait_locked(&s->jobs, j, (size_t)-1, WAIT_MS);
        if (j->state != BT_JOB_DONE && client_gone(r->conn)) {
            pthread_mutex_unlock(&s->jobs.mu);
            r->gone = true; /* on_completed cancels the job */
            return MHD_NO;  /* nobody to answer: close */
        }
    }
    pthread_mutex_unlock(&s->jobs.mu);
    /* DONE: the engine's thread writes nothing more */
    if (j->bad_request) return fail(r, 400, "invalid_request_error", NULL, "%s", j->error);
    const struct bt_job *bad = failed_choice(j);
    if (bad)
        return fail(r, 500, "server_error", NULL, "the request failed: %s",
                    bad->error[0] ? bad->error : "it was cancelled");
    count_timing(r);
    bool plain = true;
    char *js = tool_answer_json(r, &plain);
    if (plain) js = whole_json(r);
    if (!js) return fail(r, 500, "server_error", NULL, "out of memory");
    return send_text(r, 200, "application/json", js, NULL, NULL);
}

/* a stream chunk of choice c (index i): text and (when the request asked)
 * lp[0..n_lp); NULL when out of memory */
static char *chunk_with_logprobs(struct req *r, int i, const char *text, size_t len, const bt_logprobs *lp,
                                 size_t n_lp, const char *finish) {
    struct bt_job *j = r->job, *c = bt_job_choice(j, i);
    struct bt_api_logprobs v;
    if (!j->req.logprobs)
        return bt_api_chunk_index_json(&j->req, j->id, j->created, r->s->cfg.model_id, i, text, len, NULL, finish,
                                       false);
    if (!logprobs_view(r->s->tok, lp, n_lp, c->lp_offset, &v)) return NULL;
    char *js = bt_api_chunk_index_json(&j->req, j->id, j->created, r->s->cfg.model_id, i, text, len, &v, finish,
                                       false);
    c->lp_offset += bt_api_logprobs_chars(&v);
    logprobs_free(&v);
    return js;
}

/* How much of choice c's text a stream may show now (s->jobs.mu held): all
 * of it, but in a chat with tools (one choice) what bt_tool_stream_news
 * says (*call: a call's part to send). */
static size_t shown_len(struct req *r, struct bt_job *c, bool *call) {
    *call = false;
    if (c->tools == BT_TOOL_FORMAT_NONE) return c->len;
    return bt_tool_stream_news(c->tools, &r->ts, c->text, c->len, c->ended, &c->text_seen, call);
}

/* Streaming, with the queue's mutex held: the next choice with news, from
 * r->next on (text not sent yet, or its end), -1 when none has; *all: every
 * choice's last chunk is sent. */
static int next_news(struct req *r, bool *all) {
    struct bt_job *j = r->job;
    *all = true;
    for (int k = 0; k < j->n_choices; k++) {
        const int i = (r->next + k) % j->n_choices;
        struct bt_job *c = bt_job_choice(j, i);
        *all = *all && c->final_sent;
        bool call;
        if (shown_len(r, c, &call) > c->text_seen || call) return i;
        if (c->ended && !c->final_sent && c->res.finish != BT_FINISH_ERROR && c->res.finish != BT_FINISH_CANCELLED &&
            !c->error[0])
            return i;
    }
    return -1;
}

/* Streaming, phase 1: the next chunk of text or a choice's last, or the
 * error that ends the stream; NULL at the end of phase 1 or when out of
 * memory (*gone: the client went away). */
static char *next_text_event(struct req *r, bool *gone, bool *none) {
    struct bt_server *s = r->s;
    struct bt_job *j = r->job;
    bool all = false;
    int i;
    *none = false;
    pthread_mutex_lock(&s->jobs.mu);
    while ((i = next_news(r, &all)) < 0 && !all && j->state != BT_JOB_DONE) {
        bt_job_wait_any_locked(&s->jobs, j, WAIT_MS);
        if ((i = next_news(r, &all)) < 0 && !all && j->state != BT_JOB_DONE && client_gone(r->conn)) {
            pthread_mutex_unlock(&s->jobs.mu);
            *gone = true;
            return NULL;
        }
    }
    if (i < 0) {
        pthread_mutex_unlock(&s->jobs.mu);
        /* DONE: the engine's thread writes nothing more */
        const struct bt_job *bad = failed_choice(j);
        if (bad || j->bad_request) {
            struct bt_api_error e;
            if (j->bad_request)
                bt_api_error_set(&e, 400, "invalid_request_error", NULL, NULL, "%s", j->error);
            else
                bt_api_error_set(&e, 500, "server_error", NULL, NULL, "the request failed: %s",
                                 bad->error[0] ? bad->error : "it was cancelled");
            r->phase = 3; /* then [DONE] */
            return bt_api_error_json(&e);
        }
        count_timing(r);
        r->phase = j->req.include_usage ? 2 : 3;
        *none = true;
        return NULL;
    }
    r->next = (i + 1) % j->n_choices;
    struct bt_job *c = bt_job_choice(j, i);
    /* the text and the log-probabilities of the tokens that came since the last chunk; at its end, the entries
     * of tokens that showed no text */
    bool call;
    const size_t avail = shown_len(r, c, &call);
    const bool last = avail <= c->text_seen && !call;
    if (call) {
        /* a call's head, then its arguments */
        const enum bt_api_call_part part = r->ts.head_sent ? BT_API_CALL_ARGS : BT_API_CALL_HEAD;
        char *js = bt_api_tool_chunk_json(&j->req, j->id, j->created, s->cfg.model_id, &r->ts.call, r->ts.n_sent, part);
        bt_tool_stream_call_sent(&r->ts, &c->text_seen);
        pthread_mutex_unlock(&s->jobs.mu);
        return js;
    }
    const size_t from = c->text_seen, n = avail > from ? avail - from : 0, n_lp = c->n_lp - c->lp_seen;
    char *piece = malloc(n ? n : 1);
    bt_logprobs *lps = malloc((n_lp ? n_lp : 1) * sizeof *lps);
    if (piece) memcpy(piece, c->text + from, n);
    if (lps && n_lp) memcpy(lps, c->lp + c->lp_seen, n_lp * sizeof *lps);
    c->text_seen = last ? c->len : avail;
    c->lp_seen = c->n_lp;
    if (last) c->final_sent = true;
    pthread_mutex_unlock(&s->jobs.mu);
    const char *finish = !last ? NULL : r->ts.n_sent > 0 ? "tool_calls" : bt_finish_name(c->res.finish);
    char *js = piece && lps ? chunk_with_logprobs(r, i, piece, n, lps, n_lp, finish) : NULL;
    free(piece);
    free(lps);
    return js;
}

/* the next SSE event of a streamed answer into r->out; false at the end or
 * when the client went away (*gone) */
static bool next_event(struct req *r, bool *gone) {
    struct bt_server *s = r->s;
    struct bt_job *j = r->job;
    const char *model = s->cfg.model_id;
    char *js = NULL;
    free(r->out);
    r->out = NULL;
    r->out_len = r->out_pos = 0;
    if (r->phase == 0) {
        /* each choice's first chunk: the assistant's role (chat), the echoed prompt (completions) */
        if (r->next >= j->n_choices || (j->req.kind != BT_API_CHAT && !j->echo)) {
            r->phase = 1;
            r->next = 0;
            return next_event(r, gone);
        }
        const int i = r->next++;
        if (j->req.kind == BT_API_CHAT)
            js = bt_api_chunk_index_json(&j->req, j->id, j->created, model, i, "", 0, NULL, NULL, true);
        else
            js = bt_api_chunk_index_json(&j->req, j->id, j->created, model, i, j->echo, strlen(j->echo), NULL, NULL,
                                         false);
    } else if (r->phase == 1) {
        bool none = false;
        js = next_text_event(r, gone, &none);
        if (*gone) return false;
        if (none) return next_event(r, gone);
    } else if (r->phase == 2) {
        const struct bt_api_usage u = job_usage(j);
        js = bt_api_usage_chunk_json(&j->req, j->id, j->created, model, &u);
        r->phase = 3;
    } else if (r->phase == 3) {
        r->phase = 4;
        if (!(r->out = strdup("data: [DONE]\n\n"))) return false;
        r->out_len = strlen(r->out);
        return true;
    } else {
        return false;
    }
    if (!js) return false;
    size_t n = strlen(js);
    r->out = malloc(n + 9);
    if (!r->out) {
        free(js);
        return false;
    }
    memcpy(r->out, "data: ", 6);
    memcpy(r->out + 6, js, n);
    memcpy(r->out + 6 + n, "\n\n", 3);
    r->out_len = n + 8;
    free(js);
    return true;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    struct req *r = cls;
    if (r->out_pos == r->out_len) {
        bool gone = false;
        if (!next_event(r, &gone)) {
            if (gone || r->phase != 4) {
                r->gone = true; /* on_completed cancels the job */
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
    }
    size_t n = r->out_len - r->out_pos;
    if (n > max) n = max;
    memcpy(buf, r->out + r->out_pos, n);
    r->out_pos += n;
    return (ssize_t)n;
}

static enum MHD_Result answer_stream(struct req *r) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(r, resp);
    enum MHD_Result ok = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    bt_metrics_request(&r->s->metrics, (enum bt_metrics_endpoint)r->route, 200);
    r->answered = true;
    return ok;
}

static enum MHD_Result handle_generate(struct req *r) {
    struct bt_server *s = r->s;
    struct bt_api_error e;
    struct bt_job *j = bt_job_new();
    if (!j) return fail(r, 500, "server_error", NULL, "out of memory");
    r->job = j;
    pthread_mutex_lock(&s->jobs.mu);
    uint64_t n = ++s->next_id;
    pthread_mutex_unlock(&s->jobs.mu);
    /* a request without a seed: a different stream each time */
    uint64_t seed = (uint64_t)s->created * 0x9E3779B97F4A7C15ull + n;
    enum bt_api_kind kind = r->route == R_CHAT ? BT_API_CHAT : BT_API_COMPLETION;
    if (!bt_api_parse(kind, r->body ? r->body : "", r->len, &s->lim, seed, &j->req, &e)) return send_error(r, &e, NULL, NULL);
    if (j->req.n > 1 && bt_job_set_choices(j, j->req.n) != BT_OK)
        return fail(r, 500, "server_error", NULL, "out of memory");
    if (!make_prompt(s, j, &e)) return send_error(r, &e, NULL, NULL);
    snprintf(j->id, sizeof j->id, "%s-%llx%06llu", kind == BT_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)s->created, (unsigned long long)n);
    j->created = (int64_t)time(NULL);
    switch (bt_jobs_submit(&s->jobs, j)) {
    case BT_OK:
        pthread_mutex_lock(&s->jobs.mu);
        s->n_answering++;
        r->submitted = true;
        pthread_mutex_unlock(&s->jobs.mu);
        break;
    case BT_ERR_CAPACITY:
        bt_metrics_rejected(&s->metrics);
        bt_api_error_set(&e, 503, "server_error", NULL, "server_overloaded",
                         "The server is busy: all %d sequence slots are taken and %d requests are waiting; retry "
                         "later",
                         s->cfg.n_slots, s->cfg.max_queue);
        return send_error(r, &e, MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_S);
    case BT_ERR_ABORTED:
        bt_api_error_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down");
        return send_error(r, &e, NULL, NULL);
    default:
        pthread_mutex_lock(&s->jobs.mu);
        bt_api_error_set(&e, 500, "server_error", NULL, NULL, "the engine has failed: %s", s->jobs.fail_msg);
        pthread_mutex_unlock(&s->jobs.mu);
        return send_error(r, &e, NULL, NULL);
    }
    return j->req.stream ? answer_stream(r) : answer_whole(r);
}

/* POST /tokenize: the text's ids, and with_pieces each id's text (special
 * tokens' too, as llama-server shows them) */
static enum MHD_Result handle_tokenize(struct req *r) {
    struct bt_server *s = r->s;
    struct bt_api_error e;
    struct bt_api_tokenize q;
    if (!bt_api_parse_tokenize(r->body ? r->body : "", r->len, &q, &e)) return send_error(r, &e, NULL, NULL);
    bt_tokens t = {0};
    char msg[512];
    enum bt_status st = bt_tokenizer_tokenize(s->tok, q.content, q.len, q.add_special, q.parse_special, &t, msg,
                                              sizeof msg);
    const bool with_pieces = q.with_pieces;
    bt_api_tokenize_free(&q);
    if (st != BT_OK) {
        bt_tokens_free(&t);
        bt_api_error_set(&e, 400, "invalid_request_error", "content", NULL, "'content' cannot be tokenized: %s",
                         msg);
        return send_error(r, &e, NULL, NULL);
    }
    struct bt_api_piece *piece = NULL;
    char *js = NULL;
    if (!with_pieces || (piece = malloc((t.n ? t.n : 1) * sizeof *piece))) {
        for (size_t i = 0; piece && i < t.n; i++) piece[i].text = bt_tokenizer_piece(s->tok, t.ids[i], 1, &piece[i].len);
        js = bt_api_tokenize_json(t.ids, t.n, piece);
    }
    free(piece);
    bt_tokens_free(&t);
    if (!js) return fail(r, 500, "server_error", NULL, "out of memory");
    return send_text(r, 200, "application/json", js, NULL, NULL);
}

/* POST /detokenize: the ids' text, control tokens shown (as llama-server),
 * less the leading space a "llama" vocabulary adds (unlike llama-server, so
 * text tokenized without control tokens comes back as it was) */
static enum MHD_Result handle_detokenize(struct req *r) {
    struct bt_server *s = r->s;
    struct bt_api_error e;
    int32_t *ids;
    size_t n;
    if (!bt_api_parse_detokenize(r->body ? r->body : "", r->len, &s->lim, &ids, &n, &e))
        return send_error(r, &e, NULL, NULL);
    size_t len = 0;
    char *text = bt_tokenizer_detokenize(s->tok, ids, n, 0, 1, &len);
    free(ids);
    char *js = text ? bt_api_detokenize_json(text, len) : NULL;
    free(text);
    if (!js) return fail(r, 500, "server_error", NULL, "out of memory");
    return send_text(r, 200, "application/json", js, NULL, NULL);
}

/* POST /v1/embeddings: each input tokenized (text with BOS, as
 * llama-server) and checked against a sequence's share, then a job each;
 * the answer once every vector is in */
static enum MHD_Result handle_embeddings(struct req *r) {
    struct bt_server *s = r->s;
    struct bt_api_error e;
    struct bt_api_embeddings q;
    if (!bt_api_parse_embeddings(r->body ? r->body : "", r->len, &s->lim, &q, &e))
        return send_error(r, &e, NULL, NULL);
    const bool base64 = q.base64;
    enum MHD_Result ret = MHD_NO;
    if (!(r->embd_jobs = calloc(q.n, sizeof *r->embd_jobs))) {
        bt_api_embeddings_free(&q);
        return fail(r, 500, "server_error", NULL, "out of memory");
    }
    /* the prompts first: a bad input refuses the request before any job runs */
    for (size_t i = 0; i < q.n; i++) {
        struct bt_job *j = bt_job_new();
        if (!j) {
            ret = fail(r, 500, "server_error", NULL, "out of memory");
            goto out;
        }
        r->embd_jobs[r->n_embd_jobs++] = j;
        j->pooling = s->cfg.pooling;
        struct bt_api_embd_input *in = &q.in[i];
        if (in->ids) {
            j->prompt = in->ids;
            j->n_prompt = in->n_ids;
            in->ids = NULL;
        } else {
            bt_tokens t = {0};
            char msg[512];
            if (bt_tokenizer_tokenize(s->tok, in->text, in->len, true, true, &t, msg, sizeof msg) != BT_OK) {
                bt_tokens_free(&t);
                ret = fail(r, 400, "invalid_request_error", NULL, "'input[%zu]' cannot be tokenized: %s", i, msg);
                goto out;
            }
            j->prompt = t.ids;
            j->n_prompt = t.n;
        }
        if (j->n_prompt == 0) {
            ret = fail(r, 400, "invalid_request_error", NULL, "'input[%zu]' has no tokens", i);
            goto out;
        }
        if ((int64_t)j->n_prompt > s->cfg.n_ctx_seq) {
            bt_api_error_set(&e, 400, "invalid_request_error", "input", "context_length_exceeded",
                             "'input[%zu]' has %zu tokens: the maximum context length is %lld tokens per request", i,
                             j->n_prompt, (long long)s->cfg.n_ctx_seq);
            ret = send_error(r, &e, NULL, NULL);
            goto out;
        }
        j->created = (int64_t)time(NULL);
    }
    for (size_t i = 0; i < r->n_embd_jobs; i++) {
        enum bt_status st = bt_jobs_submit(&s->jobs, r->embd_jobs[i]);
        if (st == BT_OK && i == 0) {
            pthread_mutex_lock(&s->jobs.mu);
            s->n_answering++;
            r->submitted = true;
            pthread_mutex_unlock(&s->jobs.mu);
        }
        if (st == BT_OK) continue;
        /* the jobs submitted are cancelled in on_completed */
        if (st == BT_ERR_CAPACITY) {
            bt_metrics_rejected(&s->metrics);
            bt_api_error_set(&e, 503, "server_error", NULL, "server_overloaded",
                             "The server is busy: all %d sequence slots are taken and %d requests are waiting; retry "
                             "later",
                             s->cfg.n_slots, s->cfg.max_queue);
            ret = send_error(r, &e, MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_S);
        } else if (st == BT_ERR_ABORTED) {
            ret = fail(r, 503, "server_error", "shutting_down", "The server is shutting down");
        } else {
            ret = fail(r, 500, "server_error", NULL, "the engine has failed");
        }
        goto out;
    }
    /* every vector, or the client gone */
    int64_t n_prompt = 0;
    pthread_mutex_lock(&s->jobs.mu);
    for (size_t i = 0; i < r->n_embd_jobs; i++) {
        struct bt_job *j = r->embd_jobs[i];
        while (j->state != BT_JOB_DONE) {
            bt_job_wait_locked(&s->jobs, j, (size_t)-1, WAIT_MS);
            if (j->state != BT_JOB_DONE && client_gone(r->conn)) {
                pthread_mutex_unlock(&s->jobs.mu);
                r->gone = true;
                goto out; /* nobody to answer: close (on_completed cancels the jobs) */
            }
        }
        n_prompt += (int64_t)j->n_prompt;
    }
    pthread_mutex_unlock(&s->jobs.mu);
    /* DONE: the engine's thread writes nothing more */
    const float **vec = calloc(r->n_embd_jobs, sizeof *vec);
    if (!vec) {
        ret = fail(r, 500, "server_error", NULL, "out of memory");
        goto out;
    }
    int64_t n_embd = 0;
    for (size_t i = 0; i < r->n_embd_jobs; i++) {
        struct bt_job *j = r->embd_jobs[i];
        if (j->bad_request) {
            free(vec);
            ret = fail(r, 400, "invalid_request_error", NULL, "'input[%zu]': %s", i, j->error);
            goto out;
        }
        if (!j->embd || j->res.finish != BT_FINISH_STOP) {
            free(vec);
            ret = fail(r, 500, "server_error", NULL, "the request failed: %s",
                       j->error[0] ? j->error : "it was cancelled");
            goto out;
        }
        vec[i] = j->embd;
        n_embd = j->n_embd;
    }
    char *js = bt_api_embeddings_json(s->cfg.model_id, vec, r->n_embd_jobs, n_embd, base64, n_prompt);
    free(vec);
    ret = js ? send_text(r, 200, "application/json", js, NULL, NULL)
             : fail(r, 500, "server_error", NULL, "out of memory");
out:
    bt_api_embeddings_free(&q);
    return ret;
}

/* OPTIONS with --cors: a browser's preflight, answered before any key is asked */
static enum MHD_Result send_preflight(struct req *r) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_cors(r, resp);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_METHODS, "GET, POST, OPTIONS");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_ALLOW_HEADERS, "Authorization, Content-Type");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCESS_CONTROL_MAX_AGE, CORS_MAX_AGE_S);
    enum MHD_Result ok = MHD_queue_response(r->conn, MHD_HTTP_NO_CONTENT, resp);
    MHD_destroy_response(resp);
    bt_metrics_request(&r->s->metrics, (enum bt_metrics_endpoint)r->route, 204);
    r->answered = true;
    return ok;
}

static enum MHD_Result handle_get(struct req *r, const char *url) {
    struct bt_server *s = r->s;
    if (r->route == R_HEALTH) {
        pthread_mutex_lock(&s->jobs.mu);
        bool failed = s->jobs.failed, draining = s->jobs.draining;
        pthread_mutex_unlock(&s->jobs.mu);
        if (failed) return fail(r, 503, "server_error", NULL, "the engine has failed");
        if (draining) return fail(r, 503, "server_error", "shutting_down", "The server is shutting down");
        return send_text(r, 200, "application/json", strdup("{\"status\":\"ok\"}"), NULL, NULL);
    }
    if (r->route == R_MODELS || r->route == R_MODEL) {
        struct bt_api_error e;
        if (r->route == R_MODEL && !bt_api_model_check(url + strlen(MODELS_PREFIX), s->cfg.model_id, &e))
            return send_error(r, &e, NULL, NULL);
        char *js = r->route == R_MODELS ? bt_api_models_json(s->cfg.model_id, s->created)
                                        : bt_api_model_json(s->cfg.model_id, s->created);
        if (!js) return fail(r, 500, "server_error", NULL, "out of memory");
        return send_text(r, 200, "application/json", js, NULL, NULL);
    }
    int queued, running;
    bt_jobs_counts(&s->jobs, &queued, &running);
    char *txt = bt_metrics_text(&s->metrics, queued, running, s->cfg.n_slots, s->cfg.model_id);
    if (!txt) return fail(r, 500, "server_error", NULL, "out of memory");
    return send_text(r, 200, "text/plain; version=0.0.4", txt, NULL, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    struct bt_server *s = cls;
    struct req *r = *con_cls;
    if (!r) {
        /* the headers: route, method, key, declared size */
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        r->s = s;
        r->conn = conn;
        r->route = route_of(url);
        *con_cls = r;
        struct bt_api_error e;
        const bool post = route_is_post(r->route);
        const union MHD_ConnectionInfo *sc = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        const struct conn_info *ci = sc ? sc->socket_context : NULL;
        if (ci && ci->spare) {
            r->spare = true;
            if (ci->spare == 503 && r->route != R_HEALTH) {
                bt_api_error_set(&e, 503, "server_error", NULL, "too_many_connections",
                                 "the server has %d connections open, the most it takes (--max-connections %d): "
                                 "only /health is answered on another",
                                 s->cfg.max_connections, s->cfg.max_connections);
                return send_error(r, &e, MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_S);
            }
            if (ci->spare == 429 && r->route != R_HEALTH) {
                char who[INET6_ADDRSTRLEN] = "this client";
                if (ci->who.family == AF_INET || ci->who.family == AF_INET6)
                    inet_ntop(ci->who.family, ci->who.addr, who, sizeof who);
                bt_api_error_set(&e, 429, "rate_limit_error", NULL, "too_many_connections",
                                 "%s has %d connections open, the most one client may have "
                                 "(--max-client-connections %d): only /health is answered on another",
                                 who, s->cfg.max_client_connections, s->cfg.max_client_connections);
                return send_error(r, &e, MHD_HTTP_HEADER_RETRY_AFTER, RETRY_AFTER_S);
            }
        }
        if (r->route == R_NONE)
            return fail(r, 404, "invalid_request_error", "unknown_url", "Unknown request URL: %.16s %.200s", method,
                        url);
        if (s->cfg.cors && !strcmp(method, MHD_HTTP_METHOD_OPTIONS)) return send_preflight(r);
        if (post ? strcmp(method, MHD_HTTP_METHOD_POST)
                 : strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
            bt_api_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                             "%.200s takes %s, not %.16s", url, post ? "POST" : "GET", method);
            const char *allow = post ? (s->cfg.cors ? "POST, OPTIONS" : "POST")
                                     : (s->cfg.cors ? "GET, HEAD, OPTIONS" : "GET, HEAD");
            return send_error(r, &e, MHD_HTTP_HEADER_ALLOW, allow);
        }
        if (r->route != R_HEALTH && !key_ok(s, conn, &e)) return send_error(r, &e, "WWW-Authenticate", "Bearer");
        if (!post) return handle_get(r, url);
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || *end || v > s->cfg.max_body) {
                bt_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                                 "the request body has %.40s bytes: this server takes at most %zu", cl,
                                 s->cfg.max_body);
                return send_error(r, &e, NULL, NULL);
            }
        }
        return MHD_YES;
    }
    if (r->raw) {
        /* the 413 is out: drop the rest of the body while the client may
         * still be reading it, then close (MHD must not answer again) */
        r->len += *upload_size;
        if (*upload_size == 0 || r->len > DRAIN_FACTOR * s->cfg.max_body) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->answered) {
        *upload_size = 0; /* an early answer: what comes is dropped */
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (r->len + n > s->cfg.max_body) {
            /* a chunked body (a declared one was checked above) past the
             * limit: the 413 now, not after the whole body */
            struct bt_api_error e;
            bt_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                             "the request body is over %zu bytes, the most this server takes", s->cfg.max_body);
            r->len += n;
            r->answered = r->raw = true;
            return send_raw(s, conn, r->route, &e) ? MHD_YES : MHD_NO;
        }
        char *b = bt_grow(r->body, &r->cap, r->len + n + 1, 1, 4096);
        if (!b) return MHD_NO;
        r->body = b;
        memcpy(r->body + r->len, upload, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->route == R_TOKENIZE) return handle_tokenize(r);
    if (r->route == R_DETOKENIZE) return handle_detokenize(r);
    if (r->route == R_EMBEDDINGS) return handle_embeddings(r);
    return handle_generate(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)conn;
    (void)toe;
    struct bt_server *s = cls;
    struct req *r = *con_cls;
    if (!r) return;
    if (r->job) {
        /* an answer cut short: the client went away (seen while waiting, or
         * as a failed write of a stream) */
        pthread_mutex_lock(&s->jobs.mu);
        bool open = r->job->state == BT_JOB_QUEUED || r->job->state == BT_JOB_RUNNING;
        pthread_mutex_unlock(&s->jobs.mu);
        if (open || r->gone) {
            bt_jobs_cancel(&s->jobs, r->job);
            bt_metrics_cancelled(&s->metrics);
        }
        bt_job_release(&s->jobs, r->job);
    }
    for (size_t i = 0; i < r->n_embd_jobs; i++) {
        struct bt_job *j = r->embd_jobs[i];
        pthread_mutex_lock(&s->jobs.mu);
        bool open = j->state == BT_JOB_QUEUED || j->state == BT_JOB_RUNNING;
        pthread_mutex_unlock(&s->jobs.mu);
        if (open) bt_jobs_cancel(&s->jobs, j); /* the client went away, or another input failed */
        bt_job_release(&s->jobs, j);
    }
    free(r->embd_jobs);
    if (r->submitted) {
        pthread_mutex_lock(&s->jobs.mu);
        s->n_answering--;
        pthread_mutex_unlock(&s->jobs.mu);
    }
    bt_tool_calls_free(r->calls, r->n_calls);
    bt_tool_stream_free(&r->ts);
    free(r->body);
    free(r->out);
    free(r);
    *con_cls = NULL;
}

/* MHD has read a request line: the connection this thread serves from now on */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)cls;
    tls.conn = conn;
    tls.route = route_of(uri);
    tls.quiet = false;
    return NULL; /* on_request's state starts on its first call */
}

/* MHD's line about a Content-Length it refuses (see the file's header):
 * answer with the JSON error here, and shut the socket for writing so MHD's
 * answer (sent twice by 0.9.75) goes nowhere */
static bool answer_bad_length(struct bt_server *s, const char *fmt) {
    if (!tls.conn || tls.quiet || !strstr(fmt, "Content-Length' header")) return false;
    const char *cl = MHD_lookup_connection_value(tls.conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl) cl = "";
    struct bt_api_error e;
    if (*cl >= '0' && *cl <= '9' && strspn(cl, "0123456789") == strlen(cl))
        bt_api_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                         "the request body has %.40s bytes: this server takes at most %zu", cl, s->cfg.max_body);
    else
        bt_api_error_set(&e, 400, "invalid_request_error", NULL, NULL,
                         "the request's Content-Length '%.40s' is not a byte count", cl);
    send_raw(s, tls.conn, tls.route, &e);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(tls.conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) shutdown(ci->connect_fd, SHUT_WR);
    return true;
}

/* libmicrohttpd's own messages (a socket error, a client gone mid-stream),
 * one line each under the program's name */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    struct bt_server *s = cls;
    if (tls.quiet || answer_bad_length(s, fmt)) return;
    /* a flood of connections past the limits: its first refusal only */
    if (strstr(fmt, "reached connection limit") && atomic_exchange(&s->refused_logged, true)) return;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n') line[--n] = 0;
    if (atomic_load(&s->starting)) {
        if (!s->start_log[0]) snprintf(s->start_log, sizeof s->start_log, "%s", line);
        return;
    }
    fprintf(stderr, "baton serve: http: %s\n", line);
}

enum bt_status bt_server_start(struct bt_server *s, const struct bt_serve_config *cfg, const bt_tokenizer *tok,
                               const bt_chat_template *chat_template, char *err, size_t n_err) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->tok = tok;
    s->chat_template = chat_template;
    s->lim.model_id = cfg->model_id;
    s->lim.max_tokens = BT_API_MAX_TOKENS;
    s->lim.n_vocab = bt_tokenizer_n_tokens(tok);
    s->lim.n_slots = cfg->n_slots;
    s->created = (int64_t)time(NULL);
    bt_jobs_init(&s->jobs, cfg->n_slots, cfg->max_queue);
    bt_metrics_init(&s->metrics);
    pthread_mutex_init(&s->conns.mu, NULL);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, n_err, "--host %s: %s", cfg->host, gai_strerror(gai));
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    atomic_store(&s->starting, true);
    s->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                                 on_mhd_log, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_connections + BT_SERVE_SPARE_CONNECTIONS),
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                 (unsigned)(cfg->max_client_connections + BT_SERVE_SPARE_CONNECTIONS),
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)cfg->timeout_s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    atomic_store(&s->starting, false);
    if (!s->daemon) {
        /* MHD's "Failed to bind to port P: REASON": the reason */
        const char *why = strrchr(s->start_log, ':');
        why = why && why[1] == ' ' ? why + 2 : s->start_log[0] ? s->start_log : NULL;
        if (why)
            snprintf(err, n_err, "cannot listen on %s port %d: %s", cfg->host, cfg->port, why);
        else
            snprintf(err, n_err, "cannot listen on %s port %d (in use, or not an address of this host)", cfg->host,
                     cfg->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return BT_OK;
fail:
    bt_metrics_destroy(&s->metrics);
    bt_jobs_destroy(&s->jobs);
    pthread_mutex_destroy(&s->conns.mu);
    return BT_ERR_IO;
}

void bt_server_stop(struct bt_server *s) {
    if (!s->daemon) return;
    /* the last chunks of a drained request may still be on their way */
    for (int i = 0; i < 3000; i++) {
        pthread_mutex_lock(&s->jobs.mu);
        int n = s->n_answering;
        pthread_mutex_unlock(&s->jobs.mu);
        if (n == 0) break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    bt_metrics_destroy(&s->metrics);
    bt_jobs_destroy(&s->jobs);
    free(s->conns.clients);
    pthread_mutex_destroy(&s->conns.mu);
}
