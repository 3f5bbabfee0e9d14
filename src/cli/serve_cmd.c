/* serve_cmd.c - `baton serve`: a GGUF model over the ranks of the job, served on
 * rank 0 as an OpenAI-compatible HTTP API (src/serve/).  Rank 0 runs the
 * batcher on its main thread and HTTP on libmicrohttpd's threads; the other
 * ranks run their stage (bt_engine_serve) until rank 0 stops them.
 *
 * SIGTERM, SIGINT or SIGHUP to rank 0's process, or SIGUSR1 to every rank
 * (mpirun forwards it; launch/baton-run sends it on ^C or SIGTERM), drains:
 * no new requests (503), the running and queued ones finish, then every rank
 * stops and the job exits 0.  A second signal ends rank 0 at once.  A rank that dies ends the job through
 * mpirun (with its message), never a hang. */
#define _GNU_SOURCE
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agree.h"
#include "cli.h"
#include "common.h"
#include "gguf.h"
#include "run/batcher.h"
#include "run/bringup.h"
#include "run/engine.h"
#include "serve/serve.h"
#include "signals.h"
#include "text/chat.h"
#include "text/vocab_gguf.h"

enum {
    OPT_HOST = 2000,
    OPT_PORT,
    OPT_PARALLEL,
    OPT_API_KEY,
    OPT_MAX_QUEUE,
    OPT_MAX_BODY,
    OPT_MAX_CONN,
    OPT_UBATCH,
    OPT_ALIAS,
    OPT_CHAT_TEMPLATE,
    OPT_CORS,
    OPT_MAX_CLIENT_CONN,
    OPT_TIMEOUT,
    OPT_POOLING,
};

struct serve_opts {
    const char *model, *host, *api_key, *alias, *chat_template, *cors;
    int port, parallel, max_queue, max_conn, max_client_conn, timeout;
    enum bt_pooling pooling;
    long ctx, ubatch;
    long max_body;
    struct bt_cli_engine_opts eng;
};

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: mpirun -np P baton serve -m FILE [options]   (or launch/baton-run -t TOPOLOGY -- baton serve ...)\n"
            "\n"
            "An OpenAI-compatible HTTP server on rank 0: POST /v1/completions, POST /v1/chat/completions\n"
            "(streamed or not), GET /v1/models, GET /v1/models/ID, GET /health, GET /metrics (Prometheus),\n"
            "POST /v1/embeddings, and llama-server's POST /tokenize and POST /detokenize; HEAD on every GET\n"
            "route.  Requests run together (continuous batching) through the pipeline of the P ranks.\n"
            "\n"
            "  -m, --model FILE        the GGUF model (every rank opens it)\n"
            "      --host ADDR         address to listen on (default 127.0.0.1: this machine only)\n"
            "      --port N            TCP port, 0 = any free one (default 8080)\n"
            "      --parallel N        requests generating at once, each with its own sequence (default 4)\n"
            "  -c, --ctx-size N        KV cache cells in all; each request gets N / parallel (default 4096)\n"
            "      --api-key KEY       ask every caller for 'Authorization: Bearer KEY' (else 401);\n"
            "                          also read from $BATON_API_KEY\n"
            "      --alias NAME        the model's name in the API (default: the file's name)\n"
            "      --cors ORIGIN       let web pages of ORIGIN (scheme://host[:port], or * for any) call the\n"
            "                          server: CORS headers on every answer, OPTIONS preflights answered\n"
            "                          (204, no key asked); default: no CORS headers, OPTIONS is a 405\n"
            "      --chat-template NAME|FILE  how chats are written: a file holding a Jinja chat template,\n"
            "                          or a built-in format (chatml, llama3, ...); default: the model's own\n"
            "                          template (tokenizer.chat_template), else chatml\n"
            "      --max-queue N       requests that may wait for a slot; past that 503 (default 4 x parallel)\n"
            "      --max-body BYTES    largest request body (default 1048576)\n"
            "      --max-connections N open connections at once (default 256); past it, 2 spare ones\n"
            "                          answer /health only (others get 503) and close\n"
            "      --max-client-connections N  open connections from one client address (default 128,\n"
            "                          at most --max-connections); past it, 2 spare ones as above (429)\n"
            "      --timeout SECONDS   close a connection idle this long (default 120; a spare one: 1)\n"
            "      --ubatch N          most tokens in one ubatch (default 512, at most --ctx-size)\n"
            "      --pooling mean|last /v1/embeddings: the mean of the input's hidden states (after the\n"
            "                          output norm) or its last token's, scaled to unit length (default mean)\n");
    bt_cli_engine_help(f, 26);
    fprintf(f,
            "  -h, --help              this text\n"
            "\n"
            "Stop it with ^C or SIGTERM to launch/baton-run, SIGUSR1 to mpirun, or SIGTERM or SIGINT to\n"
            "rank 0 (its pid is printed): running and queued requests finish first, then every rank stops.\n");
}

/* --cors: "*", or an origin as a browser writes it in its Origin header
 * (http://host or https://host:port; a path or a trailing slash would match
 * no browser's origin, so is refused here rather than failing in silence) */
static bool cors_origin_ok(const char *s) {
    if (!strcmp(s, "*")) return true;
    const char *host = !strncmp(s, "http://", 7) ? s + 7 : !strncmp(s, "https://", 8) ? s + 8 : NULL;
    if (!host || !*host || strlen(s) > 256) return false;
    for (const char *c = host; *c; c++)
        if (*c <= ' ' || *c >= 0x7f || strchr("/?#\"\\,", *c)) return false;
    return true;
}

/* -1: go on; 0: --help; 2: a usage error in err */
static int parse_serve(int argc, char **argv, struct serve_opts *o, char *err, size_t n) {
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},          {"host", required_argument, 0, OPT_HOST},
        {"port", required_argument, 0, OPT_PORT},       {"parallel", required_argument, 0, OPT_PARALLEL},
        {"ctx-size", required_argument, 0, 'c'},    {"api-key", required_argument, 0, OPT_API_KEY},
        {"max-queue", required_argument, 0, OPT_MAX_QUEUE}, {"max-body", required_argument, 0, OPT_MAX_BODY},
        {"max-connections", required_argument, 0, OPT_MAX_CONN}, {"ubatch", required_argument, 0, OPT_UBATCH},
        {"alias", required_argument, 0, OPT_ALIAS},     {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
        {"cors", required_argument, 0, OPT_CORS},
        {"max-client-connections", required_argument, 0, OPT_MAX_CLIENT_CONN},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"pooling", required_argument, 0, OPT_POOLING},
        BT_CLI_ENGINE_LONGOPTS,
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    if (!bt_cli_llama_start(argc, argv, ":m:c:t:h", longs, "serve", err, n)) return 2;
    int code;
    long v;
    while ((code = bt_cli_next_engine_opt(argc, argv, ":m:c:t:h", longs, &o->eng, err, n)) != -1) {
        switch (code) {
        case 0: break;
        case 'm':
            bt_cli_file_arg("-m", optarg, &o->model, err, n);
            break;
        case OPT_HOST: bt_cli_text_arg("--host", "address", optarg, &o->host, err, n); break;
        case OPT_ALIAS:
            if (!*optarg || strlen(optarg) > 128 || strpbrk(optarg, "\"\\\n"))
                snprintf(err, n, "--alias: '%s' is not a name (1 to 128 bytes, no quotes or backslashes)", optarg);
            else o->alias = optarg;
            break;
        case OPT_CORS:
            if (!cors_origin_ok(optarg))
                snprintf(err, n, "--cors: '%s' is not an origin: give * or scheme://host[:port] (no path, no "
                                 "trailing slash), as a browser sends it in Origin", optarg);
            else o->cors = optarg;
            break;
        case OPT_POOLING:
            if (!strcmp(optarg, "mean")) o->pooling = BT_POOLING_MEAN;
            else if (!strcmp(optarg, "last")) o->pooling = BT_POOLING_LAST;
            else snprintf(err, n, "--pooling: '%s' is not a pooling: give mean or last", optarg);
            break;
        case OPT_CHAT_TEMPLATE: bt_cli_text_arg("--chat-template", "name", optarg, &o->chat_template, err, n); break;
        case OPT_API_KEY: bt_cli_text_arg("--api-key", "key", optarg, &o->api_key, err, n); break;
#define INT_OPT(CODE, NAME, LO, HI, DST)                                                                        \
    case CODE:                                                                                                \
        if (!bt_cli_parse_int(optarg, LO, HI, &v))                                                            \
            snprintf(err, n, "%s: '%s' is not an integer in [%ld, %ld]", NAME, optarg, (long)(LO), (long)(HI)); \
        else DST = v;                                                                                         \
        break;
        INT_OPT(OPT_PORT, "--port", 0, 65535, o->port)
        INT_OPT(OPT_PARALLEL, "--parallel", 1, 256, o->parallel)
        INT_OPT('c', "--ctx-size", 16, 1L << 24, o->ctx)
        INT_OPT(OPT_MAX_QUEUE, "--max-queue", 0, 100000, o->max_queue)
        INT_OPT(OPT_MAX_BODY, "--max-body", 1024, 1L << 30, o->max_body)
        INT_OPT(OPT_MAX_CONN, "--max-connections", 1, 65536, o->max_conn)
        INT_OPT(OPT_MAX_CLIENT_CONN, "--max-client-connections", 1, 65536, o->max_client_conn)
        INT_OPT(OPT_TIMEOUT, "--timeout", 1, 86400, o->timeout)
        INT_OPT(OPT_UBATCH, "--ubatch", 1, 1L << 16, o->ubatch)
#undef INT_OPT
        case 'h': return 0;
        case ':':
        case '?': bt_cli_getopt_error(code, argv, err, n); break;
        }
        if (bt_cli_try_help("serve", err, n)) return 2;
    }
    if (bt_cli_extra_arg(argc, argv, "serve", err, n)) return 2;
    if (!o->model) {
        snprintf(err, n, "no model: give -m FILE (try: baton serve --help)");
        return 2;
    }
    if (o->ctx / o->parallel < 2) {
        snprintf(err, n, "--ctx-size %ld over --parallel %d leaves %ld cells per request: at least 2", o->ctx,
                 o->parallel, o->ctx / o->parallel);
        return 2;
    }
    return -1;
}

static volatile sig_atomic_t g_stop; /* the drain: the number of the signal that asked for it */

/* --chat-template, else the model's tokenizer.chat_template, else chatml (as llama.cpp) */
static enum bt_status chat_template_of(const struct serve_opts *o, struct bt_gguf *g, const bt_tokenizer *tok,
                                       bt_chat_template **out, char *err, size_t errlen) {
    char note[768];
    enum bt_status st = bt_cli_chat_template(o->chat_template, g, tok, "chatml", out, note, sizeof note, err, errlen);
    if (st == BT_OK && note[0]) fprintf(stderr, "baton serve: %s\n", note);
    return st;
}

/* rank 0, the engine open: tokenizer, batcher, HTTP, the loop */
static int serve_rank0(struct bt_engine *e, const struct serve_opts *o, int P) {
    char err[1024] = "";
    int rc = 1;
    bt_tokenizer *tok = NULL;
    struct bt_batcher *b = NULL;
    bt_chat_template *tmpl = NULL;
    struct bt_server srv;
    bool started = false;
    if (bt_tokenizer_from_gguf(bt_engine_gguf(e), &tok, err, sizeof err) != BT_OK) goto out;
    if (chat_template_of(o, bt_engine_gguf(e), tok, &tmpl, err, sizeof err) != BT_OK) goto out;
    struct bt_batcher_params bp;
    bt_batcher_default_params(&bp);
    if (bt_batcher_new(e, tok, &bp, &b, err, sizeof err) != BT_OK) goto out;

    char model_buf[PATH_MAX];
    snprintf(model_buf, sizeof model_buf, "%s", o->model);
    const char *model_id = o->alias ? o->alias : basename(model_buf);
    const struct bt_engine_params *ep = bt_engine_params(e);
    struct bt_serve_config cfg = {
        .host = o->host,
        .port = o->port,
        .api_key = o->api_key,
        .max_body = (size_t)o->max_body,
        .max_connections = o->max_conn,
        .max_client_connections = o->max_client_conn < o->max_conn ? o->max_client_conn : o->max_conn,
        .timeout_s = o->timeout,
        .max_queue = o->max_queue,
        .n_slots = o->parallel,
        .n_ctx_seq = ep->n_ctx / ep->n_seq_max,
        .model_id = model_id,
        .cors = o->cors,
        .pooling = o->pooling,
    };
    if (bt_server_start(&srv, &cfg, tok, tmpl, err, sizeof err) != BT_OK) goto out;
    started = true;
    bt_cli_signals_finish_on_stop(0, &g_stop, "baton serve: stop requested: draining (a second signal stops at once)");
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-answer is the socket's error, not the process's end */
    printf("baton serve: listening on http://%s%s%s:%d (model %s, %d rank%s, %d parallel requests of up to %lld "
           "tokens, %s; pid %d)\n",
           strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", srv.port, model_id, P,
           P == 1 ? "" : "s", o->parallel, (long long)cfg.n_ctx_seq, o->api_key ? "API key required" : "no API key",
           (int)getpid());
    fflush(stdout);
    enum bt_status st = bt_server_run(&srv, b, e, &g_stop, err, sizeof err);
    bt_server_stop(&srv);
    started = false;
    if (st == BT_OK) {
        rc = 0;
        printf("baton serve: stopped\n");
    }
out:
    if (started) {
        bt_jobs_close(&srv.jobs, "the server is stopping");
        bt_server_stop(&srv);
    }
    if (rc) fprintf(stderr, "baton serve: %s\n", err);
    bt_batcher_free(b);
    if (rc == 0 && bt_engine_stop(e) != BT_OK) {
        fprintf(stderr, "baton serve: stopping the ranks: %s\n", bt_engine_error(e));
        rc = 1;
    }
    bt_tokenizer_free(tok);
    bt_chat_template_free(tmpl);
    return rc;
}

int bt_cli_serve(int argc, char **argv) {
    struct serve_opts o = {.host = "127.0.0.1", .port = 8080, .parallel = 4, .ctx = 4096, .max_queue = -1,
                           .max_conn = 256, .max_client_conn = 128, .timeout = 120, .pooling = BT_POOLING_MEAN, .ubatch = 0,
                           .max_body = 1 << 20};
    const int env_rank = bt_cli_start("baton serve");
    char perr[1024] = "";
    int prc = parse_serve(argc, argv, &o, perr, sizeof perr);
    if (prc == 0) return bt_cli_help(env_rank, serve_usage);
    if (prc < 0) prc = 0;
    if (o.max_queue < 0) o.max_queue = 4 * o.parallel;
    if (!o.api_key && getenv("BATON_API_KEY") && *getenv("BATON_API_KEY")) o.api_key = getenv("BATON_API_KEY");
    if (!bt_cli_engine_finish(&o.eng, prc ? NULL : perr, sizeof perr) && !prc) prc = 2;

    const struct bt_rank_config rcfg = bt_cli_engine_rank_config("baton serve", &o.eng, 50);
    struct bt_rank R;
    if (!bt_cli_rank_start(&R, &rcfg, env_rank, &prc, perr, sizeof perr, &argc, &argv)) return prc;
    const int rank = R.rank, P = R.size;
    struct bt_cli_agree_item items[8];
    int n_items = 0;
    bt_cli_agree_add_where(items, &n_items, o.eng.topology, o.eng.backend);
    bt_cli_agree_add(items, &n_items, "--partition", o.eng.partition != NULL, "%s",
                     o.eng.partition ? o.eng.partition : "");
    bt_cli_agree_add(items, &n_items, "--model", true, "%s", o.model ? o.model : "");
    bt_cli_agree_add(items, &n_items, "--parallel", true, "%d", o.parallel);
    bt_cli_agree_add(items, &n_items, "--ctx-size", true, "%ld", o.ctx);
    bt_cli_agree_add(items, &n_items, "--ubatch", true, "%ld", o.ubatch);
    char err[1024] = "";
    int rc = bt_cli_rank_agree(&R, &rcfg, prc, perr, sizeof perr, items, n_items, err, sizeof err);
    if (rc != 0) {
        if (rank == 0 && err[0]) fprintf(stderr, "baton serve: %s\n", err);
        bt_cli_rank_end(&R, rc);
        return rc;
    }
    struct bt_engine_params ep;
    bt_engine_default_params(&ep);
    ep.model = o.model;
    ep.n_ctx = o.ctx;
    ep.mmap = o.eng.mmap;
    ep.n_seq_max = o.parallel;
    ep.n_ubatch = o.ubatch ? o.ubatch : (o.ctx < 512 ? o.ctx : 512);
    struct bt_engine *e = NULL;
    if (bt_engine_open(&R, &ep, &e, err, sizeof err) != BT_OK) {
        if (rank == 0) fprintf(stderr, "baton serve: %s\n", err);
        bt_cli_rank_end(&R, 1);
        return 1;
    }
    if (rank == 0) {
        bt_cli_ctx_warn("baton serve", e, o.ctx, o.parallel);
        rc = serve_rank0(e, &o, P);
    } else {
        /* this rank's stage until rank 0 stops (a failed rank: an error naming it) */
        bt_cli_signals_finish_on_stop(rank, &g_stop, "");
        if (bt_engine_serve(e) != BT_OK) {
            fprintf(stderr, "baton serve: rank %d: %s\n", rank, bt_engine_error(e));
            rc = 1;
        }
    }
    bt_engine_close(e);
    bt_cli_rank_end(&R, rc);
    return rc;
}
