/* loop.c - the engine's thread of `baton serve` (serve.h): queued jobs into
 * free sequence slots, cancels into the batcher, batcher steps, each job's
 * text and end back to its HTTP thread, the metrics' snapshot; and the drain
 * on SIGTERM. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "serve.h"

#define IDLE_WAIT_MS 100   /* how often an idle loop looks at the stop flag */
#define PUBLISH_EVERY_S 0.05

static struct bt_server *server_of(struct bt_jobs *q) {
    return (struct bt_server *)(void *)((char *)q - offsetof(struct bt_server, jobs));
}

static void on_token(void *user, int32_t id, const char *text, size_t len, const bt_logprobs *lp) {
    struct bt_job *j = user; /* a choice: its request is its job's */
    const struct bt_api_request *rq = j->parent ? &j->parent->req : &j->req;
    /* the end-of-generation token that ends the answer shows nothing and is
     * not listed (the stopper's rule: any such token, unless ignore_eos) */
    if (lp && !rq->ignore_eos && bt_tokenizer_is_eog(server_of(j->queue)->tok, id)) lp = NULL;
    bt_job_emit(j->queue, j, text, len, lp);
}

static void on_embd(void *user, const float *embd, int64_t n) {
    struct bt_job *j = user;
    bt_job_set_embd(j->queue, j, embd, n);
}

static void on_done(void *user, const struct bt_gen_result *r) {
    struct bt_job *j = user;
    const char *why = NULL;
    if (r->finish == BT_FINISH_ERROR) why = bt_batcher_error(server_of(j->queue)->batcher);
    bt_job_finish(j->queue, j, r, why);
}

static void publish(struct bt_server *s, struct bt_batcher *b, struct bt_engine *e, double busy_s, double *rank_s) {
    struct bt_batcher_stats bs;
    bt_batcher_stats(b, &bs);
    if (rank_s) bt_engine_compute_seconds(e, rank_s);
    struct bt_metrics_engine m = {
        .prompt_tokens = bs.prompt_tokens,
        .cached_tokens = bs.cached_tokens,
        .gen_tokens = bs.gen_tokens,
        .busy_s = busy_s,
        .rank_compute_s = rank_s,
        .n_ranks = rank_s ? bt_engine_n_ranks(e) : 0,
        .kv_cells = bt_engine_params(e)->n_ctx,
    };
    for (int q = 0; q < s->cfg.n_slots; q++) {
        int32_t p = bt_engine_seq_pos_max(e, q);
        if (p >= 0) m.kv_used += (int64_t)p + 1;
    }
    bt_metrics_publish(&s->metrics, &m);
}

/* queued jobs into the batcher while it has free slots */
static void admit(struct bt_server *s, struct bt_batcher *b) {
    while (bt_batcher_n_free(b) > 0) {
        struct bt_job *j = bt_jobs_take(&s->jobs);
        if (!j) return;
        struct bt_gen_request g = {
            .prompt = j->prompt,
            .n_prompt = j->n_prompt,
            .sampling = j->req.sampling,
            .max_tokens = j->req.max_tokens,
            .stops = (const char *const *)j->req.stops,
            .n_stops = j->req.n_stops,
            .bias_ids = j->req.bias_ids,
            .bias = j->req.bias,
            .n_bias = j->req.n_bias,
            .min_tokens = j->req.min_tokens,
            .ignore_eos = j->req.ignore_eos,
            .logprobs = j->req.logprobs,
            .top_logprobs = j->req.top_logprobs,
            .on_token = on_token,
            .on_done = on_done,
            .user = j,
            .pooling = j->pooling,
            .on_embd = on_embd,
            .no_reuse = !j->req.cache_prompt,
            .n_choices = j->n_choices,
            .choice_users = j->users,
            .grammar = j->req.grammar,
            .grammar_trigger = j->trigger,
            .shown_control = j->mark,
        };
        uint64_t id = 0;
        char msg[512] = "";
        enum bt_status st = bt_batcher_add(b, &g, &id, msg, sizeof msg);
        if (st == BT_OK) {
            pthread_mutex_lock(&s->jobs.mu);
            j->batch_id = id;
            pthread_mutex_unlock(&s->jobs.mu);
            continue;
        }
        if (st == BT_ERR_CAPACITY) {
            bt_jobs_untake(&s->jobs, j);
            return;
        }
        /* refused: a request the batcher finds invalid, or a failed engine */
        struct bt_gen_result r;
        memset(&r, 0, sizeof r);
        r.finish = BT_FINISH_ERROR;
        r.n_prompt = (int64_t)j->n_prompt;
        j->bad_request = st == BT_ERR_INVALID;
        bt_job_finish(&s->jobs, j, &r, msg[0] ? msg : bt_status_str(st));
    }
}

enum bt_status bt_server_run(struct bt_server *s, struct bt_batcher *b, struct bt_engine *e,
                             volatile sig_atomic_t *stop, char *err, size_t n_err) {
    s->batcher = b;
    bool draining = false;
    double last_publish = 0, busy_s = 0; /* time in steps with work to do */
    /* each rank's compute seconds (NULL when out of memory: no per-rank figures) */
    double *rank_s = calloc((size_t)bt_engine_n_ranks(e), sizeof *rank_s);
    enum bt_status ret = BT_OK;
    for (;;) {
        if (*stop && !draining) {
            draining = true;
            bt_jobs_close(&s->jobs, NULL);
            int queued, running;
            bt_jobs_counts(&s->jobs, &queued, &running);
            fprintf(stderr, "baton serve: stopping: finishing %d running and %d queued requests, refusing new ones\n",
                    running, queued);
        }
        uint64_t ids[64];
        int n;
        while ((n = bt_jobs_cancels(&s->jobs, ids, 64)) > 0)
            for (int i = 0; i < n; i++) bt_batcher_cancel(b, ids[i]);
        admit(s, b);
        if (bt_batcher_idle(b)) {
            publish(s, b, e, busy_s, rank_s);
            if (draining && bt_jobs_active(&s->jobs) == 0) break;
            bt_jobs_wait_work(&s->jobs, IDLE_WAIT_MS);
            continue;
        }
        double t0 = bt_now_s();
        enum bt_status st = bt_batcher_step(b);
        double now = bt_now_s();
        busy_s += now - t0;
        if (st != BT_OK) {
            snprintf(err, n_err, "%s", bt_batcher_error(b));
            bt_jobs_close(&s->jobs, err);
            publish(s, b, e, busy_s, rank_s);
            ret = st;
            break;
        }
        if (now - last_publish > PUBLISH_EVERY_S) {
            publish(s, b, e, busy_s, rank_s);
            last_publish = now;
        }
    }
    free(rank_s);
    return ret;
}
