/* jobs.c - the bounded queue of requests between the HTTP threads and the
 * engine's thread, and each job's text and end (jobs.h). */
#define _POSIX_C_SOURCE 200809L
#include "jobs.h"
#include "../mem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void bt_jobs_init(struct bt_jobs *q, int n_slots, int max_queue) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&q->cv, &a);
    pthread_condattr_destroy(&a);
    q->n_slots = n_slots;
    q->max_queue = max_queue;
}

void bt_jobs_destroy(struct bt_jobs *q) {
    BT_ASSERT(q->n_queued == 0 && q->n_running == 0);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

struct bt_job *bt_job_new(void) {
    struct bt_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &a);
    pthread_condattr_destroy(&a);
    j->refs = 1;
    j->n_choices = 1;
    j->open = 1;
    return j;
}

static void job_free(struct bt_job *j);

enum bt_status bt_job_set_choices(struct bt_job *j, int n) {
    BT_ASSERT(j->state == BT_JOB_NEW && j->n_choices == 1 && n > 1);
    j->more = calloc((size_t)n - 1, sizeof *j->more);
    j->users = calloc((size_t)n, sizeof *j->users);
    if (!j->more || !j->users) return BT_ERR_NOMEM;
    j->users[0] = j;
    for (int i = 1; i < n; i++) {
        struct bt_job *c = bt_job_new();
        if (!c) return BT_ERR_NOMEM;
        c->parent = j;
        c->state = BT_JOB_RUNNING; /* never queued: running with its job */
        j->more[i - 1] = c;
        j->users[i] = c;
        j->n_choices = i + 1;
    }
    j->open = n;
    return BT_OK;
}

struct bt_job *bt_job_choice(struct bt_job *j, int i) {
    BT_ASSERT(i >= 0 && i < j->n_choices);
    return i == 0 ? j : j->more[i - 1];
}

static void job_free(struct bt_job *j) {
    for (int i = 1; i < j->n_choices; i++) job_free(j->more[i - 1]);
    free(j->more);
    free(j->users);
    bt_api_request_free(&j->req);
    BT_FREE_ALL(j->prompt, j->echo, j->text, j->lp, j->embd);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void bt_job_release(struct bt_jobs *q, struct bt_job *j) {
    if (!j) return;
    pthread_mutex_lock(&q->mu);
    BT_ASSERT(j->refs > 0);
    int left = --j->refs;
    pthread_mutex_unlock(&q->mu);
    if (left == 0) job_free(j);
}

enum bt_status bt_jobs_submit(struct bt_jobs *q, struct bt_job *j) {
    pthread_mutex_lock(&q->mu);
    enum bt_status st = BT_OK;
    if (q->failed)
        st = BT_ERR_COMM;
    else if (q->draining)
        st = BT_ERR_ABORTED;
    else if (q->n_queued + q->n_running >= q->n_slots + q->max_queue)
        st = BT_ERR_CAPACITY;
    if (st == BT_OK) {
        BT_ASSERT(j->state == BT_JOB_NEW);
        j->state = BT_JOB_QUEUED;
        j->t_submit = bt_now_s();
        j->refs++;
        j->queue = q;
        for (int i = 1; i < j->n_choices; i++) j->more[i - 1]->queue = q;
        j->next = NULL;
        if (q->tail)
            q->tail->next = j;
        else
            q->head = j;
        q->tail = j;
        q->n_queued++;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

/* unlink j from the queue (mu held) */
static void queue_remove(struct bt_jobs *q, struct bt_job *j) {
    struct bt_job *prev = NULL;
    for (struct bt_job *it = q->head; it; prev = it, it = it->next) {
        if (it != j) continue;
        if (prev)
            prev->next = j->next;
        else
            q->head = j->next;
        if (q->tail == j) q->tail = prev;
        q->n_queued--;
        j->next = NULL;
        return;
    }
    BT_ASSERT(!"job not in the queue");
}

static void running_remove(struct bt_jobs *q, struct bt_job *j) {
    for (struct bt_job **p = &q->running; *p; p = &(*p)->next) {
        if (*p != j) continue;
        *p = j->next;
        j->next = NULL;
        q->n_running--;
        return;
    }
    BT_ASSERT(!"job not running");
}

void bt_jobs_cancel(struct bt_jobs *q, struct bt_job *j) {
    pthread_mutex_lock(&q->mu);
    if (j->state == BT_JOB_QUEUED) {
        queue_remove(q, j);
        j->state = BT_JOB_DONE;
        j->res.finish = BT_FINISH_CANCELLED;
        j->refs--; /* the queue's */
        BT_ASSERT(j->refs > 0);
    } else if (j->state == BT_JOB_RUNNING && !j->cancel) {
        j->cancel = true;
        pthread_cond_signal(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
}

struct bt_job *bt_jobs_take(struct bt_jobs *q) {
    pthread_mutex_lock(&q->mu);
    struct bt_job *j = q->head;
    if (j) {
        queue_remove(q, j);
        j->state = BT_JOB_RUNNING;
        j->next = q->running;
        q->running = j;
        q->n_running++;
    }
    pthread_mutex_unlock(&q->mu);
    return j;
}

void bt_jobs_untake(struct bt_jobs *q, struct bt_job *j) {
    pthread_mutex_lock(&q->mu);
    running_remove(q, j);
    j->state = BT_JOB_QUEUED;
    j->next = q->head;
    q->head = j;
    if (!q->tail) q->tail = j;
    q->n_queued++;
    pthread_mutex_unlock(&q->mu);
}

int bt_jobs_cancels(struct bt_jobs *q, uint64_t *ids, int max) {
    int n = 0;
    pthread_mutex_lock(&q->mu);
    for (struct bt_job *j = q->running; j && n < max; j = j->next) {
        if (!j->cancel || j->cancel_sent) continue;
        j->cancel_sent = true;
        ids[n++] = j->batch_id;
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}

void bt_job_set_embd(struct bt_jobs *q, struct bt_job *j, const float *embd, int64_t n) {
    float *v = malloc((size_t)n * sizeof *v);
    pthread_mutex_lock(&q->mu);
    if (v) {
        memcpy(v, embd, (size_t)n * sizeof *v);
        free(j->embd);
        j->embd = v;
        j->n_embd = n;
    } else {
        snprintf(j->error, sizeof j->error, "out of memory for the embedding");
    }
    pthread_mutex_unlock(&q->mu);
}

/* The answer cannot be kept: the job (j, of parent job p) ends as failed
 * with error; unlocks q. */
static void emit_failed(struct bt_jobs *q, struct bt_job *j, struct bt_job *p, const char *error) {
    snprintf(j->error, sizeof j->error, "%s", error);
    p->cancel = true;
    pthread_mutex_unlock(&q->mu);
}

void bt_job_emit(struct bt_jobs *q, struct bt_job *j, const char *text, size_t len, const bt_logprobs *lp) {
    pthread_mutex_lock(&q->mu);
    struct bt_job *p = j->parent ? j->parent : j; /* its job: where cancels and waits are */
    j->n_tokens++;
    if (lp) {
        bt_logprobs *l = bt_grow(j->lp, &j->cap_lp, j->n_lp + 1, sizeof *l, 64);
        if (!l) {
            emit_failed(q, j, p, "out of memory for the answer's log-probabilities");
            return;
        }
        j->lp = l;
        j->lp[j->n_lp++] = *lp;
    }
    if (len > 0) {
        char *t = bt_grow(j->text, &j->cap, j->len + len + 1, 1, 256);
        if (!t) {
            emit_failed(q, j, p, "out of memory for the answer's text");
            return;
        }
        j->text = t;
        memcpy(j->text + j->len, text, len);
        j->len += len;
        j->text[j->len] = 0;
        if (j->t_first == 0) j->t_first = bt_now_s();
        if (p->t_first == 0) p->t_first = j->t_first;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&q->mu);
}

void bt_job_finish(struct bt_jobs *q, struct bt_job *j, const struct bt_gen_result *r, const char *error) {
    pthread_mutex_lock(&q->mu);
    struct bt_job *p = j->parent ? j->parent : j;
    BT_ASSERT(p->state == BT_JOB_RUNNING && !j->ended);
    j->ended = true;
    j->res = *r;
    if (error && !j->error[0]) snprintf(j->error, sizeof j->error, "%s", error);
    if (j->t_first == 0) j->t_first = bt_now_s();
    if (j != p) j->state = BT_JOB_DONE;
    /* refused by the batcher (no choice started): the job ends now */
    p->open = r->finish == BT_FINISH_ERROR && j == p && p->batch_id == 0 ? 0 : p->open - 1;
    if (p->open > 0) {
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&q->mu);
        return;
    }
    running_remove(q, p);
    p->state = BT_JOB_DONE;
    for (int i = 1; i < p->n_choices; i++) p->more[i - 1]->state = BT_JOB_DONE;
    pthread_cond_broadcast(&p->cv);
    BT_ASSERT(p->refs > 0);
    int left = --p->refs;
    pthread_mutex_unlock(&q->mu);
    if (left == 0) job_free(p);
}

static void deadline(struct timespec *ts, int timeout_ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

void bt_jobs_wait_work(struct bt_jobs *q, int timeout_ms) {
    pthread_mutex_lock(&q->mu);
    bool work = q->head != NULL || q->draining || q->failed;
    for (struct bt_job *j = q->running; j && !work; j = j->next) work = j->cancel && !j->cancel_sent;
    if (!work) {
        struct timespec ts;
        deadline(&ts, timeout_ms);
        int rc = pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        BT_ASSERT(rc == 0 || rc == ETIMEDOUT);
    }
    pthread_mutex_unlock(&q->mu);
}

void bt_job_wait_locked(struct bt_jobs *q, struct bt_job *j, size_t seen, int timeout_ms) {
    if (j->state == BT_JOB_DONE || j->len > seen) return;
    struct timespec ts;
    deadline(&ts, timeout_ms);
    int rc = pthread_cond_timedwait(&j->cv, &q->mu, &ts);
    BT_ASSERT(rc == 0 || rc == ETIMEDOUT);
}

void bt_job_wait_any_locked(struct bt_jobs *q, struct bt_job *j, int timeout_ms) {
    if (j->state == BT_JOB_DONE) return;
    struct timespec ts;
    deadline(&ts, timeout_ms);
    int rc = pthread_cond_timedwait(&j->cv, &q->mu, &ts);
    BT_ASSERT(rc == 0 || rc == ETIMEDOUT);
}

void bt_jobs_close(struct bt_jobs *q, const char *fail_msg) {
    pthread_mutex_lock(&q->mu);
    q->draining = true;
    if (fail_msg) {
        q->failed = true;
        snprintf(q->fail_msg, sizeof q->fail_msg, "%s", fail_msg);
        /* queued jobs will never run: end them with the engine's error */
        while (q->head) {
            struct bt_job *j = q->head;
            queue_remove(q, j);
            j->state = BT_JOB_DONE;
            j->res.finish = BT_FINISH_ERROR;
            snprintf(j->error, sizeof j->error, "%s", fail_msg);
            pthread_cond_broadcast(&j->cv);
            j->refs--;
            BT_ASSERT(j->refs > 0); /* the HTTP thread still holds it */
        }
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int bt_jobs_active(struct bt_jobs *q) {
    pthread_mutex_lock(&q->mu);
    int n = q->n_queued + q->n_running;
    pthread_mutex_unlock(&q->mu);
    return n;
}

void bt_jobs_counts(struct bt_jobs *q, int *queued, int *running) {
    pthread_mutex_lock(&q->mu);
    *queued = q->n_queued;
    *running = q->n_running;
    pthread_mutex_unlock(&q->mu);
}
