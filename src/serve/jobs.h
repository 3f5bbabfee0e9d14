/* jobs.h - the hand-over between `baton serve`'s HTTP threads and the
 * engine's thread on rank 0.
 *
 * An HTTP thread makes a job (a checked request and its prompt tokens) and
 * submits it: the job waits in a bounded queue until the engine's thread
 * takes it into a sequence slot.  The engine's thread appends the job's text
 * as tokens come and finishes it once; the HTTP thread waits on the job's
 * condition variable for text or the end.  A client that goes away cancels
 * its job: a queued job ends at once, a running one is handed to the engine's
 * thread to cancel in the batcher (its sequence is freed at the next step).
 *
 * One mutex guards every job and the queue; each job has its own condition
 * variable (the HTTP thread waiting on it) and the queue one for the engine's
 * thread.  A job is freed when both sides have let it go (two references
 * while submitted). */
#ifndef BATON_SERVE_JOBS_H
#define BATON_SERVE_JOBS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../run/batcher.h"
#include "api.h"

enum bt_job_state {
    BT_JOB_NEW = 0,     /* made, not submitted */
    BT_JOB_QUEUED = 1,  /* waiting for a sequence slot */
    BT_JOB_RUNNING = 2, /* taken by the engine's thread */
    BT_JOB_DONE = 3,    /* finished: result (and error) set */
};

struct bt_job {
    /* set before submit, read-only afterwards */
    struct bt_api_request req;
    int32_t *prompt; /* token ids */
    size_t n_prompt;
    char *echo;      /* completions with echo: the prompt's text, shown first */
    enum bt_pooling pooling; /* an embedding job (not NONE): no text, a vector */
    enum bt_tool_format tools; /* a chat with tools: the format its calls are parsed from (NONE: text) */
    const char *trigger;       /* tool_choice "auto": the text after which req.grammar applies (NULL: from the start) */
    const char *mark;          /* a chat with tools: its format's mark, shown where it is a control token */
    char id[48];     /* "cmpl-..." / "chatcmpl-..." */
    int64_t created; /* Unix seconds */
    double t_submit; /* monotonic seconds */
    /* under the queue's mutex */
    enum bt_job_state state;
    char *text; /* generated text so far */
    size_t len, cap;
    int64_t n_tokens;  /* tokens sampled so far */
    bt_logprobs *lp;   /* a request that asked for logprobs: those of each token shown (every token but the
                        * end-of-generation token that ends it), in order */
    size_t n_lp, cap_lp;
    double t_first;    /* monotonic time of the first text (0: none yet) */
    bool cancel;       /* the client went away: cancel it in the batcher */
    bool cancel_sent;  /* the engine's thread has done so */
    uint64_t batch_id; /* bt_batcher_add's id, while running */
    struct bt_gen_result res;
    char error[512];   /* the reason of BT_FINISH_ERROR */
    int bad_request;   /* the batcher refused the request as invalid: answer 400 with `error` */
    float *embd;       /* an embedding job's vector (n_embd floats), once set */
    int64_t n_embd;
    int refs;
    /* n > 1 choices: the job is choice 0 and holds the others (jobs of
     * their own that are never queued, freed with it); each choice's text,
     * log-probabilities, result and error are its own.  The engine's thread
     * emits into and finishes each choice; the job is done once all are. */
    int n_choices;          /* 1 unless the request asked for more */
    struct bt_job **more;   /* choices 1 .. n_choices - 1 */
    void **users;           /* [n_choices]: the job and its choices (the batcher's choice_users) */
    struct bt_job *parent;  /* a choice past the first: the job it belongs to */
    int open;               /* choice 0: choices not finished yet (under the mutex) */
    bool ended;             /* this choice has finished (DONE, for choice 0, only once all have) */
    /* the HTTP thread's stream of this choice */
    size_t text_seen, lp_seen; /* bytes of text and entries of lp sent */
    int64_t lp_offset;         /* completions: the text_offset of the next entry */
    bool final_sent;           /* its last chunk (finish_reason) */
    struct bt_jobs *queue; /* set by submit */
    struct bt_job *next; /* in the queue or the running list */
    pthread_cond_t cv;
};

struct bt_jobs {
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* the engine's thread waits here for work */
    struct bt_job *head, *tail; /* queued, oldest first */
    struct bt_job *running;     /* taken by the engine's thread */
    int n_queued, n_running;
    int n_slots;   /* sequence slots (--parallel) */
    int max_queue; /* jobs that may wait beyond the slots */
    bool draining; /* no new jobs (SIGTERM) */
    bool failed;   /* the engine failed: no new jobs, fail_msg says why */
    char fail_msg[512];
};

void bt_jobs_init(struct bt_jobs *q, int n_slots, int max_queue);
void bt_jobs_destroy(struct bt_jobs *q);

/* A new job owned by the caller (free it with bt_job_release if it is never
 * submitted).  NULL when out of memory. */
struct bt_job *bt_job_new(void);
/* Before submit: give j n > 1 choices (BT_ERR_NOMEM when out of memory). */
enum bt_status bt_job_set_choices(struct bt_job *j, int n);
/* Choice i of j (0: j itself). */
struct bt_job *bt_job_choice(struct bt_job *j, int i);

/* HTTP thread.  BT_OK: the job is queued (the queue holds a reference).
 * BT_ERR_CAPACITY: the slots and the queue are full (503, Retry-After);
 * BT_ERR_ABORTED: the server is draining; BT_ERR_COMM: the engine failed. */
enum bt_status bt_jobs_submit(struct bt_jobs *q, struct bt_job *j);
/* HTTP thread: the client went away.  A queued job ends now; a running one
 * is cancelled by the engine's thread at its next turn. */
void bt_jobs_cancel(struct bt_jobs *q, struct bt_job *j);
/* Either side lets go of the job; the last one frees it. */
void bt_job_release(struct bt_jobs *q, struct bt_job *j);

/* ---- the engine's thread ---- */

/* The oldest queued job, now running (NULL when none). */
struct bt_job *bt_jobs_take(struct bt_jobs *q);
/* Put a taken job back at the front (the batcher had no slot after all). */
void bt_jobs_untake(struct bt_jobs *q, struct bt_job *j);
/* Running jobs whose clients went away and are not yet cancelled: up to max
 * batcher ids into ids; returns how many. */
int bt_jobs_cancels(struct bt_jobs *q, uint64_t *ids, int max);
/* Append generated text and the token's log-probabilities (lp: NULL when
 * none are kept for it), and count one token. */
void bt_job_emit(struct bt_jobs *q, struct bt_job *j, const char *text, size_t len, const bt_logprobs *lp);
/* An embedding job's vector (copied; out of memory: the job's error). */
void bt_job_set_embd(struct bt_jobs *q, struct bt_job *j, const float *embd, int64_t n);
/* A choice of a job ended (error: the reason of BT_FINISH_ERROR, or NULL);
 * once every choice has, the job is done and the engine's reference is
 * dropped.  A job the batcher refused ends at once, whatever its choices. */
void bt_job_finish(struct bt_jobs *q, struct bt_job *j, const struct bt_gen_result *r, const char *error);
/* Wait until a job is queued, a cancel is asked, the server drains, or
 * timeout_ms passed. */
void bt_jobs_wait_work(struct bt_jobs *q, int timeout_ms);
/* Refuse new jobs from now on (draining, or failed with msg). */
void bt_jobs_close(struct bt_jobs *q, const char *fail_msg);
/* Jobs queued or running. */
int bt_jobs_active(struct bt_jobs *q);
void bt_jobs_counts(struct bt_jobs *q, int *queued, int *running);

/* ---- the HTTP thread, waiting for its job ---- */

/* Wait until the job has more than `seen` bytes of text or is done, or
 * timeout_ms passed.  Call with q->mu held (pthread_cond_timedwait). */
void bt_job_wait_locked(struct bt_jobs *q, struct bt_job *j, size_t seen, int timeout_ms);
/* Wait until any choice of the job has news (text, an end) or timeout_ms
 * passed; the caller has looked under the same hold of q->mu. */
void bt_job_wait_any_locked(struct bt_jobs *q, struct bt_job *j, int timeout_ms);


#endif
