/* transport.h - point-to-point transfers between ranks, behind one interface
 * (a vtable), plus the few collectives the control plane needs.
 *
 * A request names a buffer, a byte count, a peer rank and a tag; baton makes
 * tags from (transfer index, copy slot) so that micro-batches in flight never
 * mix on a transport that matches by tag.  Implementations: MPI
 * (transport/mpi.c) for host memory; NCCL (transport/nccl.c) between CUDA
 * ranks, which matches by posting order only and needs its edges opened
 * (connect); the ordered transport (transport/ordered.c), NCCL's rules over
 * another transport, for testing without GPUs.  src/dist.c uses only this
 * header.
 */
#ifndef BATON_TRANSPORT_H
#define BATON_TRANSPORT_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bt_transport bt_transport;

/* One outstanding send or receive.  Opaque storage for the implementation's
 * handle (an MPI_Request, ...); `active` is true from post until completion. */
typedef struct {
    uint64_t opaque[4];
    bool active;
    bool is_recv;
    size_t bytes;
    int peer, tag;
} bt_treq;

struct bt_transport_i {
    const char *(*name)(bt_transport *t);
    enum bt_status (*isend)(bt_transport *t, const void *buf, size_t bytes, int peer, int tag, bt_treq *req);
    enum bt_status (*irecv)(bt_transport *t, void *buf, size_t bytes, int peer, int tag, bt_treq *req);
    /* *done = true once the request completed (it is then inactive).  A
     * test or wait that returns an error ends the request as well: it is
     * inactive, the caller may post into the handle again, and it is never
     * waited on or cancelled again.  MPI cancels a receive that had not
     * completed, so no later message lands in its buffer; NCCL fails only
     * when the edge's communicator is broken, and nothing on it completes
     * after that. */
    enum bt_status (*test)(bt_transport *t, bt_treq *req, bool *done);
    enum bt_status (*wait)(bt_transport *t, bt_treq *req);
    /* optional: cancel an outstanding receive */
    void (*cancel)(bt_transport *t, bt_treq *req);
    /* optional: the caller is about to compute (busy) or to wait on requests
     * itself; a transport may drive its transfers from another thread while
     * the caller is busy */
    void (*set_busy)(bt_transport *t, bool busy);

    /* control plane: collectives over all ranks */
    enum bt_status (*bcast)(bt_transport *t, void *buf, size_t bytes, int root);
    /* root receives size*bytes: rank i's bytes at offset i*bytes */
    enum bt_status (*gather)(bt_transport *t, const void *send, size_t bytes, void *recv, int root);
    /* element-wise max over ranks, result on every rank */
    enum bt_status (*allreduce_max)(bt_transport *t, int64_t *v, int n);
    enum bt_status (*barrier)(bt_transport *t);
    /* stop every rank (after a message has been printed) */
    void (*abort)(bt_transport *t, int code);
    void (*free)(bt_transport *t);

    /* optional: open the channels of these directed edges (src[i] -> dst[i]),
     * before any transfer on them.  Every rank that holds this transport
     * calls it with the same list in the same order and takes part in the
     * edges it is an end of (NCCL: one communicator per edge).  Without it a
     * transport reaches every peer. */
    enum bt_status (*connect)(bt_transport *t, const int *src, const int *dst, int n_edges);
};

struct bt_transport {
    struct bt_transport_i iface;
    void *context;
    int rank;
    int size;
    int local_rank; /* index among the ranks on this node */
    int local_size;
    char error[512]; /* message of the last failed call */
    bt_transport *control; /* a transport built over another (NCCL, ordered): that one, which
                              serves its collectives; NULL otherwise */
};

/* ---- a transport built over another ---------------------------------------- */

/* Set up t over base: the same ranks, base's collectives (control). */
static inline void bt_transport_init_over(bt_transport *t, const struct bt_transport_i *iface, void *context,
                                          bt_transport *base) {
    t->iface = *iface;
    t->context = context;
    t->rank = base->rank;
    t->size = base->size;
    t->local_rank = base->local_rank;
    t->local_size = base->local_size;
    t->control = base;
}

/* s, with the control transport's message in t->error when it failed. */
static inline enum bt_status bt_transport_control_status(bt_transport *t, enum bt_status s) {
    if (s != BT_OK) snprintf(t->error, sizeof t->error, "%s", t->control->error);
    return s;
}

/* The collectives of a transport built over another: the control's. */
static inline enum bt_status bt_transport_control_bcast(bt_transport *t, void *buf, size_t bytes, int root) {
    return bt_transport_control_status(t, t->control->iface.bcast(t->control, buf, bytes, root));
}
static inline enum bt_status bt_transport_control_gather(bt_transport *t, const void *send, size_t bytes, void *recv,
                                                         int root) {
    return bt_transport_control_status(t, t->control->iface.gather(t->control, send, bytes, recv, root));
}
static inline enum bt_status bt_transport_control_allreduce_max(bt_transport *t, int64_t *v, int n) {
    return bt_transport_control_status(t, t->control->iface.allreduce_max(t->control, v, n));
}
static inline enum bt_status bt_transport_control_barrier(bt_transport *t) {
    return bt_transport_control_status(t, t->control->iface.barrier(t->control));
}

static inline enum bt_status bt_transport_isend(bt_transport *t, const void *buf, size_t bytes, int peer, int tag,
                                                bt_treq *req) {
    return t->iface.isend(t, buf, bytes, peer, tag, req);
}
static inline enum bt_status bt_transport_irecv(bt_transport *t, void *buf, size_t bytes, int peer, int tag,
                                                bt_treq *req) {
    return t->iface.irecv(t, buf, bytes, peer, tag, req);
}
static inline enum bt_status bt_transport_test(bt_transport *t, bt_treq *req, bool *done) {
    if (!req->active) {
        *done = true;
        return BT_OK;
    }
    return t->iface.test(t, req, done);
}
static inline enum bt_status bt_transport_wait(bt_transport *t, bt_treq *req) {
    return req->active ? t->iface.wait(t, req) : BT_OK;
}

/* Wait for a request: test and yield (the waiter's MPI calls are what moves
 * a transfer in flight, and a yield lets a computing rank on the same core
 * run); after 50 ms of waiting (a pipeline bubble, not a transfer) test every
 * 20 us instead, so a long-idle rank does not hold a core. */
static inline enum bt_status bt_transport_wait_polite(bt_transport *t, bt_treq *req) {
    const double t0 = bt_now_s();
    bool napping = false;
    for (unsigned spins = 0;; spins++) {
        bool done = false;
        const enum bt_status st = bt_transport_test(t, req, &done);
        if (st != BT_OK || done) return st;
        if (!napping && (spins & 255) == 255) napping = bt_now_s() - t0 > 0.050;
        if (napping) {
            const struct timespec d = {0, 20000};
            nanosleep(&d, NULL);
        } else {
            sched_yield();
        }
    }
}

/* Send n bytes to peer and receive n bytes from it (tag), waiting for both:
 * a rendezvous of two ranks, as when they open a channel. */
static inline enum bt_status bt_transport_exchange(bt_transport *t, int peer, int tag, const void *mine,
                                                   void *theirs, size_t n) {
    bt_treq sr, rr;
    enum bt_status s = t->iface.isend(t, mine, n, peer, tag, &sr);
    if (s != BT_OK) return s;
    s = t->iface.irecv(t, theirs, n, peer, tag, &rr);
    if (s == BT_OK) s = bt_transport_wait(t, &rr);
    const enum bt_status s2 = bt_transport_wait(t, &sr);
    return s != BT_OK ? s : s2;
}

/* ---- connect: what a transport's edges have in common ------------------------ */

/* The first thing the two ends of an edge tell each other in connect: the
 * edge and its index in their lists. */
struct bt_edge_id {
    int32_t index, src, dst;
};

/* BT_OK when entry i (src -> dst) of an edge list joins two ranks of t, else
 * BT_ERR_INVALID with a message. */
static inline enum bt_status bt_transport_edge_check(bt_transport *t, int i, int src, int dst) {
    if (src >= 0 && src < t->size && dst >= 0 && dst < t->size && src != dst) return BT_OK;
    snprintf(t->error, sizeof t->error, "rank %d: connect: edge %d (%d -> %d) is not between two ranks of %d", t->rank,
             i, src, dst, t->size);
    return BT_ERR_INVALID;
}

/* BT_OK when both ends are at the same entry of the same list, else
 * BT_ERR_MISMATCH naming both. */
static inline enum bt_status bt_transport_edge_agree(bt_transport *t, struct bt_edge_id mine, struct bt_edge_id theirs,
                                                     int peer) {
    if (mine.index == theirs.index && mine.src == theirs.src && mine.dst == theirs.dst) return BT_OK;
    snprintf(t->error, sizeof t->error,
             "rank %d: connect: entry %d of this rank's edge list is %d -> %d, but rank %d is at entry %d, %d -> %d: "
             "every rank must list the same edges in the same order",
             t->rank, (int)mine.index, (int)mine.src, (int)mine.dst, peer, (int)theirs.index, (int)theirs.src,
             (int)theirs.dst);
    return BT_ERR_MISMATCH;
}

static inline void bt_transport_set_busy(bt_transport *t, bool busy) {
    if (t->iface.set_busy) t->iface.set_busy(t, busy);
}

/* Largest tag a transport accepts (MPI guarantees at least 32767).  The
 * top two are reserved: BT_TRANSPORT_TAG_CONNECT for setting up channels
 * (connect), BT_TRANSPORT_TAG_ORDERED for the ordered transport's data;
 * callers use tags 0..BT_TRANSPORT_MAX_USER_TAG. */
#define BT_TRANSPORT_MAX_TAG 32767
#define BT_TRANSPORT_TAG_CONNECT BT_TRANSPORT_MAX_TAG
#define BT_TRANSPORT_TAG_ORDERED (BT_TRANSPORT_MAX_TAG - 1)
#define BT_TRANSPORT_MAX_USER_TAG (BT_TRANSPORT_MAX_TAG - 2)

static inline enum bt_status bt_transport_connect(bt_transport *t, const int *src, const int *dst, int n_edges) {
    return t->iface.connect ? t->iface.connect(t, src, dst, n_edges) : BT_OK;
}

/* ---- MPI (transport/mpi.c) ---------------------------------------------- */

/* Initialise MPI (MPI_THREAD_MULTIPLE, so a progress thread may drive
 * transfers while the compute thread works) unless already initialised, and
 * put the transport over MPI_COMM_WORLD in *out: BT_OK; else *out NULL and
 * BT_ERR_INVALID (a bad BATON_WATCHDOG_S, the same on every rank),
 * BT_ERR_COMM (MPI_Init_thread failed) or BT_ERR_NOMEM, with the message in
 * err (n_err bytes; nothing printed: baton.h's error convention).  MPI is
 * not up then, so the caller cannot know its rank from the transport
 * (bt_cli_env_rank reads the launcher's).  Warnings, not errors, still go
 * to stderr, on rank 0 only (every rank would say the same): the run goes on
 * without the watchdog, or without the progress thread, when MPI gives no
 * MPI_THREAD_MULTIPLE or the watchdog thread cannot start; the user must see
 * that a dead rank may then hang the others, or that sends may progress
 * later.  progress_us > 0 starts a thread that drives MPI's
 * progress engine every progress_us microseconds while transfers are
 * outstanding and the caller is busy computing (set_busy): sends then
 * complete without their sender calling MPI.  While the caller waits on
 * requests itself the thread sleeps: two threads polling one MPI library
 * only contend for its lock. */
enum bt_status bt_transport_mpi_init(int *argc, char ***argv, int progress_us, bt_transport **out, char *err,
                                     size_t n_err);
/* MPI_Finalize when this transport initialised MPI. */
void bt_transport_mpi_finalize(bt_transport *t);
/* Count of outstanding requests (the progress thread runs while > 0). */
void bt_transport_mpi_hold_progress(bt_transport *t, int delta);

/* ---- ordered (transport/ordered.c) --------------------------------------- */

/* NCCL's rules for moving data, over another transport (`inner`, not owned,
 * which also serves the collectives): no tags (between two ranks, sends and
 * receives match in the order they are posted), a transfer only on an edge
 * opened by connect, which is a rendezvous of both ends as NCCL's
 * communicator set-up is (edge lists that differ between the two ends are
 * an error), a first transfer on an edge that blocks until the other end
 * makes its first one (NCCL connects lazily; connect does that first
 * exchange itself), and no cancel.  It lets the code that drives a device
 * transport run and be tested on machines without GPUs: a caller that posts
 * the two ends of an edge in different orders gets swapped data, a size
 * error or a hang here, as it would get wrong results or a hang from NCCL. */
bt_transport *bt_transport_ordered_new(bt_transport *inner);
/* Make this rank refuse to open the edge src -> dst in connect, as NCCL
 * refuses two ranks on one GPU: for tests of what a refused edge does. */
void bt_transport_ordered_refuse(bt_transport *t, int src, int dst);

#ifdef __cplusplus
}
#endif
#endif
