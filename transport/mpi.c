/* mpi.c - the MPI transport: non-blocking point-to-point over
 * MPI_COMM_WORLD, collectives for the control plane, and a progress thread.
 *
 * Why a progress thread: with Open MPI's shared-memory copy-in/copy-out path
 * (and rendezvous for large messages in general) an MPI_Isend only moves data
 * while some thread of the sender calls into MPI.  A pipeline stage that posts
 * its sends and starts computing the next micro-batch would stall the next
 * stage for a whole compute.  The thread calls MPI_Iprobe on a private
 * communicator (which runs MPI's progress engine without touching baton's
 * requests) every `progress_us` microseconds while requests are outstanding,
 * and sleeps otherwise, so an idle rank holds no core.
 *
 * The watchdog: a peer that hangs (stopped, or its link cut) never fails an
 * MPI call; every rank waiting on it would wait for ever, in a point-to-point
 * wait or inside a collective alike.  A second thread sends each peer a small
 * heartbeat every period (a quarter of the limit, at most 1 s) on a private
 * communicator, independent of what the main thread is doing (a rank computing
 * for minutes still beats), and notes when it last heard from each peer.  A
 * peer silent for longer than the limit (BATON_WATCHDOG_S, seconds, default
 * 60; 0 turns it off; rank 0's value holds for all) is named on stderr ("no sign of life from rank 3 (host
 * gpu02) for 60.0 s") and the job is stopped (MPI_Abort; the process ends by
 * itself 5 s later if the abort cannot reach mpirun).  A rank that is done says
 * goodbye first, so its peers stop watching it. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transport.h"

struct mpi_ctx {
    MPI_Comm comm;       /* baton's traffic */
    MPI_Comm probe_comm; /* never carries a message: for the progress thread */
    bool we_initialised;
    int thread_level;

    pthread_t progress;
    bool progress_running;
    int progress_us;
    atomic_int outstanding;
    atomic_bool busy;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;

    struct watchdog *wd; /* NULL when off */
};

/* ---- the watchdog ---------------------------------------------------------- */

#define WD_TAG_BEAT 1
#define WD_TAG_BYE 2
#define WD_DEFAULT_S 60.0
#define WD_HOST_MAX 64

struct watchdog {
    MPI_Comm comm;   /* heartbeats only */
    double limit_s;  /* a peer silent this long is declared lost */
    double period_s; /* between two beats */
    int rank, size;
    double *heard;      /* [size]: when the last message from each peer came (monotonic s) */
    bool *gone;         /* [size]: the peer said goodbye */
    MPI_Request *recv;  /* [size]: the posted receive from each peer */
    MPI_Request *send;  /* [size]: the last beat to each peer */
    int32_t *in, *out;  /* [size]: receive buffers; what was sent */
    char (*host)[WD_HOST_MAX]; /* [size]: each rank's host name, for the message */
    pthread_t thread;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* BATON_WATCHDOG_S: seconds (> 0), 0 for off; unset: the default.  -1 and a
 * message on a bad value. */
static double watchdog_limit(char *err, size_t n) {
    const char *v = getenv("BATON_WATCHDOG_S");
    if (!v || !*v) return WD_DEFAULT_S;
    char *end = NULL;
    errno = 0;
    const double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < 0 || x > 86400) {
        snprintf(err, n, "BATON_WATCHDOG_S='%.40s': want seconds from 0 (off) to 86400", v);
        return -1;
    }
    return x;
}

/* Note every message that came in (a beat or a goodbye) and post the next
 * receive; start a beat to every peer whose last one went out. */
static void wd_poll(struct watchdog *w, bool beat) {
    const double now = bt_now_s();
    for (int p = 0; p < w->size; p++) {
        if (p == w->rank) continue;
        int flag = 0;
        MPI_Status st;
        while (!w->gone[p] && MPI_Test(&w->recv[p], &flag, &st) == MPI_SUCCESS && flag) {
            w->heard[p] = now;
            if (st.MPI_TAG == WD_TAG_BYE) {
                w->gone[p] = true;
                break;
            }
            MPI_Irecv(&w->in[p], 1, MPI_INT32_T, p, MPI_ANY_TAG, w->comm, &w->recv[p]);
        }
        if (!beat || w->gone[p]) continue;
        flag = 1;
        if (w->send[p] != MPI_REQUEST_NULL) MPI_Test(&w->send[p], &flag, MPI_STATUS_IGNORE);
        if (flag) MPI_Isend(&w->out[p], 1, MPI_INT32_T, p, WD_TAG_BEAT, w->comm, &w->send[p]);
    }
}

static void *wd_main(void *arg) {
    struct watchdog *w = arg;
    /* signals go to the main thread, as without the watchdog (a handler that
     * says why the rank stops, mpirun's SIGTERM) */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    double next_beat = 0;
    while (!atomic_load(&w->stop)) {
        const double now = bt_now_s();
        const bool beat = now >= next_beat;
        if (beat) next_beat = now + w->period_s;
        wd_poll(w, beat);
        for (int p = 0; p < w->size; p++) {
            if (p == w->rank || w->gone[p]) continue;
            const double silent = bt_now_s() - w->heard[p];
            if (silent <= w->limit_s) continue;
            /* a stuck abort must not keep this process: the default action of
             * SIGALRM ends it */
            signal(SIGALRM, SIG_DFL);
            alarm(5);
            fflush(stdout);
            fprintf(stderr,
                    "baton: rank %d (host %s): watchdog: no sign of life from rank %d (host %s) for %.1f s: it "
                    "hangs, or the link to it is down; stopping every rank (BATON_WATCHDOG_S=%g)\n",
                    w->rank, w->host[w->rank], p, w->host[p], silent, w->limit_s);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 1);
            _exit(1);
        }
        /* nap a tenth of a period (a stop request cuts it short) */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        const double nap = w->period_s / 10;
        until.tv_sec += (time_t)nap;
        until.tv_nsec += (long)((nap - floor(nap)) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&w->mu);
        if (!atomic_load(&w->stop)) pthread_cond_timedwait(&w->cv, &w->mu, &until);
        pthread_mutex_unlock(&w->mu);
    }
    return NULL;
}

static void wd_free(struct watchdog *w) {
    if (!w) return;
    free(w->heard);
    free(w->gone);
    free(w->recv);
    free(w->send);
    free(w->in);
    free(w->out);
    free(w->host);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* Start the watchdog over comm (collective).  Rank 0's limit holds for every
 * rank (a remote host's rank may not have this host's environment).  NULL
 * when the limit is 0 or MPI gives no MPI_THREAD_MULTIPLE (said on rank 0). */
static struct watchdog *wd_start(MPI_Comm world, int rank, int size, double limit_s, int thread_level) {
    if (size < 2) return NULL;
    if (thread_level < MPI_THREAD_MULTIPLE) {
        if (rank == 0) fprintf(stderr, "baton: MPI gives no MPI_THREAD_MULTIPLE; running without the watchdog\n");
        return NULL;
    }
    MPI_Bcast(&limit_s, 1, MPI_DOUBLE, 0, world);
    if (limit_s <= 0) return NULL;
    struct watchdog *w = calloc(1, sizeof *w);
    BT_ASSERT(w);
    const size_t n = (size_t)size;
    w->heard = calloc(n, sizeof *w->heard);
    w->gone = calloc(n, sizeof *w->gone);
    w->recv = calloc(n, sizeof *w->recv);
    w->send = calloc(n, sizeof *w->send);
    w->in = calloc(n, sizeof *w->in);
    w->out = calloc(n, sizeof *w->out);
    w->host = calloc(n, sizeof *w->host);
    BT_ASSERT(w->heard && w->gone && w->recv && w->send && w->in && w->out && w->host);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->rank = rank;
    w->size = size;
    w->limit_s = limit_s;
    w->period_s = limit_s / 4 < 1.0 ? limit_s / 4 : 1.0;
    char me[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    MPI_Get_processor_name(me, &len);
    snprintf(w->host[rank], WD_HOST_MAX, "%.*s", WD_HOST_MAX - 1, me); /* a longer name is cut */
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, w->host, WD_HOST_MAX, MPI_CHAR, world);
    MPI_Comm_dup(world, &w->comm);
    const double now = bt_now_s();
    for (int p = 0; p < size; p++) {
        w->heard[p] = now;
        w->send[p] = MPI_REQUEST_NULL;
        w->recv[p] = MPI_REQUEST_NULL;
        w->out[p] = rank;
        if (p != rank) MPI_Irecv(&w->in[p], 1, MPI_INT32_T, p, MPI_ANY_TAG, w->comm, &w->recv[p]);
    }
    if (pthread_create(&w->thread, NULL, wd_main, w) != 0) {
        for (int p = 0; p < size; p++)
            if (w->recv[p] != MPI_REQUEST_NULL) {
                MPI_Cancel(&w->recv[p]);
                MPI_Wait(&w->recv[p], MPI_STATUS_IGNORE);
            }
        MPI_Comm_free(&w->comm);
        wd_free(w);
        if (rank == 0) fprintf(stderr, "baton: cannot start the watchdog thread; running without it\n");
        return NULL;
    }
    return w;
}

/* Stop the thread, tell every peer this rank is done (it stops watching us),
 * and release the requests. */
static void wd_stop(struct watchdog *w) {
    if (!w) return;
    atomic_store(&w->stop, true);
    pthread_mutex_lock(&w->mu);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    for (int p = 0; p < w->size; p++) {
        if (p == w->rank) continue;
        if (w->send[p] != MPI_REQUEST_NULL) MPI_Request_free(&w->send[p]);
        MPI_Request bye;
        MPI_Isend(&w->out[p], 1, MPI_INT32_T, p, WD_TAG_BYE, w->comm, &bye);
        MPI_Request_free(&bye);
        if (!w->gone[p]) {
            MPI_Cancel(&w->recv[p]);
            MPI_Wait(&w->recv[p], MPI_STATUS_IGNORE);
        }
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&w->comm);
    wd_free(w);
}

_Static_assert(sizeof(MPI_Request) <= sizeof(((bt_treq *)0)->opaque), "MPI_Request must fit in bt_treq");

static MPI_Request *req_handle(bt_treq *r) { return (MPI_Request *)(void *)r->opaque; }

static enum bt_status mpi_fail(bt_transport *t, int rc, const char *what, int peer) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    snprintf(t->error, sizeof t->error, "rank %d: %s (peer %d): %.300s", t->rank, what, peer, msg);
    return BT_ERR_COMM;
}

static void *progress_main(void *arg) {
    bt_transport *t = arg;
    struct mpi_ctx *m = t->context;
    const struct timespec nap = {0, (long)m->progress_us * 1000L};
    while (!atomic_load(&m->stop)) {
        if (atomic_load(&m->outstanding) <= 0 || !atomic_load(&m->busy)) {
            pthread_mutex_lock(&m->mu);
            while ((atomic_load(&m->outstanding) <= 0 || !atomic_load(&m->busy)) && !atomic_load(&m->stop))
                pthread_cond_wait(&m->cv, &m->mu);
            pthread_mutex_unlock(&m->mu);
            continue;
        }
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, m->probe_comm, &flag, MPI_STATUS_IGNORE);
        nanosleep(&nap, NULL);
    }
    return NULL;
}

void bt_transport_mpi_hold_progress(bt_transport *t, int delta) {
    struct mpi_ctx *m = t->context;
    if (!m->progress_running) return;
    const int before = atomic_fetch_add(&m->outstanding, delta);
    if (before <= 0 && before + delta > 0 && atomic_load(&m->busy)) {
        pthread_mutex_lock(&m->mu);
        pthread_cond_signal(&m->cv);
        pthread_mutex_unlock(&m->mu);
    }
}

static void mpi_set_busy(bt_transport *t, bool busy) {
    struct mpi_ctx *m = t->context;
    if (!m->progress_running) return;
    const bool was = atomic_exchange(&m->busy, busy);
    if (busy && !was) {
        pthread_mutex_lock(&m->mu);
        pthread_cond_signal(&m->cv);
        pthread_mutex_unlock(&m->mu);
    }
}

static const char *mpi_name(bt_transport *t) {
    (void)t;
    return "mpi";
}

static enum bt_status check_count(bt_transport *t, size_t bytes, int peer, int tag) {
    if (bytes > (size_t)INT32_MAX) {
        snprintf(t->error, sizeof t->error, "rank %d: a transfer of %zu bytes to/from rank %d exceeds 2 GiB",
                 t->rank, bytes, peer);
        return BT_ERR_INVALID;
    }
    if (peer < 0 || peer >= t->size || tag < 0 || tag > BT_TRANSPORT_MAX_TAG) {
        snprintf(t->error, sizeof t->error, "rank %d: bad peer %d or tag %d", t->rank, peer, tag);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

static enum bt_status mpi_isend(bt_transport *t, const void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    struct mpi_ctx *m = t->context;
    enum bt_status st = check_count(t, bytes, peer, tag);
    if (st != BT_OK) return st;
    int rc = MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, req_handle(req));
    if (rc != MPI_SUCCESS) return mpi_fail(t, rc, "MPI_Isend", peer);
    req->active = true;
    req->is_recv = false;
    req->bytes = bytes;
    req->peer = peer;
    req->tag = tag;
    bt_transport_mpi_hold_progress(t, 1);
    return BT_OK;
}

static enum bt_status mpi_irecv(bt_transport *t, void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    struct mpi_ctx *m = t->context;
    enum bt_status st = check_count(t, bytes, peer, tag);
    if (st != BT_OK) return st;
    int rc = MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, m->comm, req_handle(req));
    if (rc != MPI_SUCCESS) return mpi_fail(t, rc, "MPI_Irecv", peer);
    req->active = true;
    req->is_recv = true;
    req->bytes = bytes;
    req->peer = peer;
    req->tag = tag;
    bt_transport_mpi_hold_progress(t, 1);
    return BT_OK;
}

static enum bt_status check_received(bt_transport *t, bt_treq *req, const MPI_Status *status) {
    if (!req->is_recv) return BT_OK;
    int count = 0;
    MPI_Get_count(status, MPI_BYTE, &count);
    if ((size_t)count != req->bytes) {
        snprintf(t->error, sizeof t->error, "rank %d: received %d bytes from rank %d (tag %d), expected %zu",
                 t->rank, count, req->peer, req->tag, req->bytes);
        return BT_ERR_COMM;
    }
    return BT_OK;
}

/* Cancel req and end it (MPI: a cancelled request's wait returns whatever
 * the peers do); MPI has already freed a request that completed. */
static void end_request(bt_transport *t, bt_treq *req) {
    if (*req_handle(req) != MPI_REQUEST_NULL) {
        MPI_Cancel(req_handle(req));
        MPI_Wait(req_handle(req), MPI_STATUS_IGNORE);
    }
    req->active = false;
    bt_transport_mpi_hold_progress(t, -1);
}

/* A test or wait that failed (rc): the request ends there (transport.h). */
static enum bt_status request_failed(bt_transport *t, bt_treq *req, int rc, const char *what) {
    const enum bt_status st = mpi_fail(t, rc, what, req->peer);
    end_request(t, req);
    return st;
}

static enum bt_status mpi_test(bt_transport *t, bt_treq *req, bool *done) {
    int flag = 0;
    MPI_Status status;
    memset(&status, 0, sizeof status);
    int rc = MPI_Test(req_handle(req), &flag, &status);
    if (rc != MPI_SUCCESS) return request_failed(t, req, rc, "MPI_Test");
    *done = flag != 0;
    if (flag) {
        req->active = false;
        bt_transport_mpi_hold_progress(t, -1);
        return check_received(t, req, &status);
    }
    return BT_OK;
}

static enum bt_status mpi_wait(bt_transport *t, bt_treq *req) {
    MPI_Status status;
    memset(&status, 0, sizeof status);
    int rc = MPI_Wait(req_handle(req), &status);
    if (rc != MPI_SUCCESS) return request_failed(t, req, rc, "MPI_Wait");
    req->active = false;
    bt_transport_mpi_hold_progress(t, -1);
    return check_received(t, req, &status);
}

static void mpi_cancel(bt_transport *t, bt_treq *req) {
    if (req->active) end_request(t, req);
}

static enum bt_status mpi_bcast(bt_transport *t, void *buf, size_t bytes, int root) {
    struct mpi_ctx *m = t->context;
    if (bytes > (size_t)INT32_MAX) return check_count(t, bytes, root, 0);
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, m->comm);
    return rc == MPI_SUCCESS ? BT_OK : mpi_fail(t, rc, "MPI_Bcast", root);
}

static enum bt_status mpi_gather(bt_transport *t, const void *send, size_t bytes, void *recv, int root) {
    struct mpi_ctx *m = t->context;
    if (bytes > (size_t)INT32_MAX) return check_count(t, bytes, root, 0);
    int rc = MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, m->comm);
    return rc == MPI_SUCCESS ? BT_OK : mpi_fail(t, rc, "MPI_Gather", root);
}

static enum bt_status mpi_allreduce_max(bt_transport *t, int64_t *v, int n) {
    struct mpi_ctx *m = t->context;
    int rc = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_MAX, m->comm);
    return rc == MPI_SUCCESS ? BT_OK : mpi_fail(t, rc, "MPI_Allreduce", -1);
}

static enum bt_status mpi_barrier(bt_transport *t) {
    struct mpi_ctx *m = t->context;
    int rc = MPI_Barrier(m->comm);
    return rc == MPI_SUCCESS ? BT_OK : mpi_fail(t, rc, "MPI_Barrier", -1);
}

static void mpi_abort(bt_transport *t, int code) {
    (void)t;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}

static void stop_progress(struct mpi_ctx *m) {
    if (!m->progress_running) return;
    atomic_store(&m->stop, true);
    pthread_mutex_lock(&m->mu);
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->progress, NULL);
    m->progress_running = false;
}

static void mpi_free(bt_transport *t) {
    struct mpi_ctx *m = t->context;
    wd_stop(m->wd);
    stop_progress(m);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        MPI_Comm_free(&m->probe_comm);
        MPI_Comm_free(&m->comm);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m);
    free(t);
}

static const struct bt_transport_i mpi_i = {
    /* .name          = */ mpi_name,
    /* .isend         = */ mpi_isend,
    /* .irecv         = */ mpi_irecv,
    /* .test          = */ mpi_test,
    /* .wait          = */ mpi_wait,
    /* .cancel        = */ mpi_cancel,
    /* .set_busy      = */ mpi_set_busy,
    /* .bcast         = */ mpi_bcast,
    /* .gather        = */ mpi_gather,
    /* .allreduce_max = */ mpi_allreduce_max,
    /* .barrier       = */ mpi_barrier,
    /* .abort         = */ mpi_abort,
    /* .free          = */ mpi_free,
    /* .connect       = */ NULL,
};

enum bt_status bt_transport_mpi_init(int *argc, char ***argv, int progress_us, bt_transport **out, char *err,
                                     size_t n_err) {
    BT_ASSERT(out);
    *out = NULL;
    if (err && n_err > 0) err[0] = '\0';
    char why[160];
    const double wd_limit = watchdog_limit(why, sizeof why);
    if (wd_limit < 0) return bt_error_printf(err, n_err, BT_ERR_INVALID, "%s", why);
    int initialised = 0, provided = 0;
    MPI_Initialized(&initialised);
    bool we = false;
    if (!initialised) {
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return bt_error_printf(err, n_err, BT_ERR_COMM, "MPI did not start (MPI_Init_thread failed)");
        we = true;
    } else {
        MPI_Query_thread(&provided);
    }
    bt_transport *t = calloc(1, sizeof *t);
    struct mpi_ctx *m = calloc(1, sizeof *m);
    if (!t || !m) {
        free(t);
        free(m);
        if (we) MPI_Finalize();
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    }
    m->we_initialised = we;
    m->thread_level = provided;
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &m->probe_comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &t->rank);
    MPI_Comm_size(m->comm, &t->size);
    MPI_Comm node;
    MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, t->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &t->local_rank);
    MPI_Comm_size(node, &t->local_size);
    MPI_Comm_free(&node);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    t->iface = mpi_i;
    t->context = m;
    m->wd = wd_start(m->comm, t->rank, t->size, wd_limit, provided);

    if (progress_us > 0) {
        if (provided < MPI_THREAD_MULTIPLE) {
            if (t->rank == 0)
                fprintf(stderr, "baton: MPI gives no MPI_THREAD_MULTIPLE; running without a progress thread\n");
        } else {
            m->progress_us = progress_us;
            if (pthread_create(&m->progress, NULL, progress_main, t) == 0) m->progress_running = true;
        }
    }
    *out = t;
    return BT_OK;
}

void bt_transport_mpi_finalize(bt_transport *t) {
    if (!t) return;
    struct mpi_ctx *m = t->context;
    const bool we = m->we_initialised;
    mpi_free(t);
    if (we) MPI_Finalize();
}
