/* nccl.c - the NCCL transport (see bt_nccl.h).  Between two ranks each
 * direction is a communicator of its own (an edge, opened by connect) with
 * a CUDA stream of its own, so receives posted ahead on one edge block
 * nothing but that edge, and each edge carries its transfers in posting
 * order.  A post first makes its edge's stream wait for what is queued on
 * the backend's stream (a send goes after the compute that made its data, a
 * receive after the compute that read its slot last); a cudaEvent recorded
 * after the call tells its completion.  A rank's transfers to itself use a
 * one-rank communicator.  Every collective of the control plane is the MPI
 * transport's. */
#include "bt_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct edge {
    int peer;
    bool out; /* this rank -> peer (else peer -> this rank) */
    ncclComm_t comm;
    cudaStream_t stream;
};

struct pending {
    bt_treq *req;
    cudaStream_t stream;
};

struct nccl_ctx {
    cudaStream_t backend_stream; /* where the data is made and used */
    cudaEvent_t dep;             /* "what is queued on backend_stream so far" */
    void *warm;                  /* a device byte for each edge's first transfer */
    ncclComm_t self;             /* one rank: transfers to itself */
    cudaStream_t self_stream;
    uint8_t member[BT_TRANSPORT_MAX_RANKS_NCCL];
    struct edge *edges;
    int n_edges;
    int group_depth;
    struct pending pending[BT_NCCL_MAX_GROUP];
    int n_pending;
};

_Static_assert(sizeof(cudaEvent_t) <= sizeof(((bt_treq *)0)->opaque), "cudaEvent_t must fit in bt_treq");

static cudaEvent_t *req_event(bt_treq *r) { return (cudaEvent_t *)(void *)r->opaque; }

static enum bt_status nccl_fail(bt_transport *t, const char *what, ncclResult_t r, int peer) {
    snprintf(t->error, sizeof t->error, "rank %d: %s (peer %d): %s", t->rank, what, peer, ncclGetErrorString(r));
    return BT_ERR_COMM;
}

static enum bt_status cuda_fail(bt_transport *t, const char *what, cudaError_t e, int peer) {
    snprintf(t->error, sizeof t->error, "rank %d: %s (peer %d): %s", t->rank, what, peer, cudaGetErrorString(e));
    return BT_ERR_COMM;
}

static const char *nccl_name(bt_transport *t) {
    (void)t;
    return "nccl";
}

static struct edge *find_edge(struct nccl_ctx *c, int peer, bool out) {
    for (int i = 0; i < c->n_edges; i++)
        if (c->edges[i].peer == peer && c->edges[i].out == out) return &c->edges[i];
    return NULL;
}

/* Record the completion event of req on stream. */
static enum bt_status record(bt_transport *t, bt_treq *req, cudaStream_t stream) {
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, stream);
    if (e != cudaSuccess) {
        if (ev) cudaEventDestroy(ev);
        req->active = false;
        return cuda_fail(t, "cudaEventRecord", e, req->peer);
    }
    *req_event(req) = ev;
    return BT_OK;
}

static enum bt_status post(bt_transport *t, bool is_recv, void *buf, size_t bytes, int peer, int tag,
                           bt_treq *req) {
    struct nccl_ctx *c = t->context;
    if (peer < 0 || peer >= t->size || !c->member[peer]) {
        snprintf(t->error, sizeof t->error, "rank %d: rank %d is not a CUDA rank of the NCCL transport", t->rank,
                 peer);
        return BT_ERR_INVALID;
    }
    ncclComm_t comm = c->self;
    cudaStream_t stream = c->self_stream;
    int np = 0; /* the peer's rank in comm */
    if (peer != t->rank) {
        const struct edge *e = find_edge(c, peer, !is_recv);
        if (!e) {
            snprintf(t->error, sizeof t->error, "rank %d: no NCCL channel from rank %d to rank %d (connect it first)",
                     t->rank, is_recv ? peer : t->rank, is_recv ? t->rank : peer);
            return BT_ERR_INVALID;
        }
        comm = e->comm;
        stream = e->stream;
        np = is_recv ? 0 : 1; /* an edge's sender is its rank 0 */
    }
    if (c->group_depth > 0 && c->n_pending >= BT_NCCL_MAX_GROUP) {
        snprintf(t->error, sizeof t->error, "rank %d: more than %d transfers in one NCCL group", t->rank,
                 BT_NCCL_MAX_GROUP);
        return BT_ERR_CAPACITY;
    }
    memset(req, 0, sizeof *req);
    req->is_recv = is_recv;
    req->bytes = bytes;
    req->peer = peer;
    req->tag = tag;
    /* after everything queued on the backend's stream so far */
    cudaError_t ce = cudaEventRecord(c->dep, c->backend_stream);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(stream, c->dep, 0);
    if (ce != cudaSuccess) return cuda_fail(t, "ordering after the backend's stream", ce, peer);
    ncclResult_t r = ncclSuccess;
    if (c->group_depth == 0) r = ncclGroupStart();
    if (r == ncclSuccess)
        r = is_recv ? ncclRecv(buf, bytes, ncclChar, np, comm, stream) : ncclSend(buf, bytes, ncclChar, np, comm, stream);
    if (c->group_depth == 0) {
        const ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess) r = r2;
    }
    if (r != ncclSuccess) return nccl_fail(t, is_recv ? "ncclRecv" : "ncclSend", r, peer);
    req->active = true;
    if (c->group_depth > 0) {
        c->pending[c->n_pending++] = (struct pending){req, stream}; /* its event is recorded at group end */
        return BT_OK;
    }
    return record(t, req, stream);
}

static enum bt_status nccl_isend(bt_transport *t, const void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    return post(t, false, (void *)buf, bytes, peer, tag, req);
}

static enum bt_status nccl_irecv(bt_transport *t, void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    return post(t, true, buf, bytes, peer, tag, req);
}

enum bt_status bt_transport_nccl_group_begin(bt_transport *t) {
    struct nccl_ctx *c = t->context;
    if (c->group_depth++ == 0) {
        c->n_pending = 0;
        const ncclResult_t r = ncclGroupStart();
        if (r != ncclSuccess) {
            c->group_depth--;
            return nccl_fail(t, "ncclGroupStart", r, -1);
        }
    }
    return BT_OK;
}

enum bt_status bt_transport_nccl_group_end(bt_transport *t) {
    struct nccl_ctx *c = t->context;
    BT_ASSERT(c->group_depth > 0);
    if (--c->group_depth > 0) return BT_OK;
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess) {
        for (int i = 0; i < c->n_pending; i++) c->pending[i].req->active = false;
        c->n_pending = 0;
        return nccl_fail(t, "ncclGroupEnd", r, -1);
    }
    enum bt_status s = BT_OK;
    for (int i = 0; i < c->n_pending; i++) {
        const enum bt_status si = record(t, c->pending[i].req, c->pending[i].stream);
        if (s == BT_OK) s = si;
    }
    c->n_pending = 0;
    return s;
}

static void finish(bt_treq *req) {
    cudaEventDestroy(*req_event(req));
    *req_event(req) = NULL;
    req->active = false;
}

/* A communicator error (a peer died) is reported rather than waited on. */
static enum bt_status comm_error(bt_transport *t, bt_treq *req) {
    struct nccl_ctx *c = t->context;
    ncclComm_t comm = c->self;
    if (req->peer != t->rank) {
        const struct edge *e = find_edge(c, req->peer, !req->is_recv);
        if (!e) return BT_OK;
        comm = e->comm;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) return nccl_fail(t, "NCCL communicator", async, req->peer);
    return BT_OK;
}

static enum bt_status nccl_test(bt_transport *t, bt_treq *req, bool *done) {
    const cudaError_t e = cudaEventQuery(*req_event(req));
    if (e == cudaSuccess) {
        finish(req);
        *done = true;
        return BT_OK;
    }
    *done = false;
    if (e != cudaErrorNotReady) {
        finish(req);
        return cuda_fail(t, "cudaEventQuery", e, req->peer);
    }
    /* a dead communicator ends the request too (transport.h): nothing on
     * its edge completes any more */
    const enum bt_status s = comm_error(t, req);
    if (s != BT_OK) finish(req);
    return s;
}

/* Polls (the event, and the communicator for a dead peer) rather than
 * blocking in cudaEventSynchronize, which would never return if the peer
 * died. */
static enum bt_status nccl_wait(bt_transport *t, bt_treq *req) {
    for (;;) {
        bool done = false;
        const enum bt_status s = nccl_test(t, req, &done);
        if (s != BT_OK || done) return s;
        sched_yield();
    }
}

/* What the two ends of an edge tell each other before opening it. */
struct connect_msg {
    struct bt_edge_id id;
    int32_t ok;          /* this end can open it */
    ncclUniqueId unique; /* the sender's */
};

/* The first transfer on a new edge, both ends present: NCCL sets up the link
 * between two ranks at the first operation and blocks until the peer makes
 * its own, which would otherwise be a receive posted ahead at plan time
 * waiting for a send the peer makes only in its first micro-batch. */
static enum bt_status first_transfer(bt_transport *t, const struct edge *e) {
    struct nccl_ctx *c = t->context;
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess)
        r = e->out ? ncclSend(c->warm, 1, ncclChar, 1, e->comm, e->stream)
                   : ncclRecv(c->warm, 1, ncclChar, 0, e->comm, e->stream);
    const ncclResult_t r2 = ncclGroupEnd();
    if (r == ncclSuccess) r = r2;
    if (r != ncclSuccess) return nccl_fail(t, "first transfer", r, e->peer);
    const cudaError_t ce = cudaStreamSynchronize(e->stream);
    return ce == cudaSuccess ? BT_OK : cuda_fail(t, "first transfer", ce, e->peer);
}

/* Open this rank's edges in list order.  For each, the two ends exchange the
 * edge, whether they can open it and the sender's unique id over MPI; then
 * both create the communicator (a blocking rendezvous), tell each other
 * whether that worked, and make the first transfer.  A list that differs
 * between the ends is an error at once; a failed edge is reported after
 * every later edge has had its exchange, so no peer is left waiting. */
static enum bt_status nccl_connect(bt_transport *t, const int *src, const int *dst, int n_edges) {
    struct nccl_ctx *c = t->context;
    bt_transport *mpi = t->control;
    enum bt_status first = BT_OK;
    for (int i = 0; i < n_edges; i++) {
        enum bt_status s = bt_transport_edge_check(t, i, src[i], dst[i]);
        if (s != BT_OK) return s;
        if (src[i] != t->rank && dst[i] != t->rank) continue;
        const bool out = src[i] == t->rank;
        const int peer = out ? dst[i] : src[i];
        if (!c->member[peer]) {
            snprintf(t->error, sizeof t->error, "rank %d: connect: rank %d is not a CUDA rank of the NCCL transport",
                     t->rank, peer);
            return BT_ERR_INVALID;
        }
        if (find_edge(c, peer, out)) continue; /* opened by an earlier plan (so on both ends) */
        struct connect_msg mine, theirs;
        memset(&mine, 0, sizeof mine);
        memset(&theirs, 0, sizeof theirs);
        mine.id = (struct bt_edge_id){i, src[i], dst[i]};
        mine.ok = 1;
        struct edge *ne = realloc(c->edges, sizeof *ne * (size_t)(c->n_edges + 1));
        if (ne) c->edges = ne;
        ncclResult_t r = ncclSuccess;
        if (!ne) {
            mine.ok = 0;
        } else if (out && (r = ncclGetUniqueId(&mine.unique)) != ncclSuccess) {
            mine.ok = 0;
        }
        s = bt_transport_exchange(mpi, peer, BT_TRANSPORT_TAG_CONNECT, &mine, &theirs, sizeof mine);
        if (s != BT_OK) {
            snprintf(t->error, sizeof t->error, "rank %d: connect %d -> %d: %.400s", t->rank, src[i], dst[i], mpi->error);
            return s;
        }
        s = bt_transport_edge_agree(t, mine.id, theirs.id, peer);
        if (s != BT_OK) return s;
        if (!mine.ok || !theirs.ok) {
            if (first == BT_OK)
                snprintf(t->error, sizeof t->error, "rank %d: NCCL channel %d -> %d: %s", t->rank, src[i], dst[i],
                         !ne ? "out of memory"
                         : r != ncclSuccess ? ncclGetErrorString(r)
                                            : "the other end could not open it");
            first = BT_ERR_COMM;
            continue;
        }
        struct edge e = {peer, out, NULL, NULL};
        const ncclUniqueId id = out ? mine.unique : theirs.unique;
        cudaError_t ce = cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking);
        r = ce == cudaSuccess ? ncclCommInitRank(&e.comm, 2, id, out ? 0 : 1) : ncclSuccess;
        int32_t ok = ce == cudaSuccess && r == ncclSuccess, peer_ok = 0;
        s = bt_transport_exchange(mpi, peer, BT_TRANSPORT_TAG_CONNECT, &ok, &peer_ok, sizeof ok);
        if (s == BT_OK && ok && peer_ok) {
            c->edges[c->n_edges++] = e;
            s = first_transfer(t, &c->edges[c->n_edges - 1]);
            if (s != BT_OK) return s;
            continue;
        }
        if (e.comm) ncclCommDestroy(e.comm);
        if (e.stream) cudaStreamDestroy(e.stream);
        if (s != BT_OK) {
            snprintf(t->error, sizeof t->error, "rank %d: connect %d -> %d: %.400s", t->rank, src[i], dst[i], mpi->error);
            return s;
        }
        if (first == BT_OK)
            snprintf(t->error, sizeof t->error, "rank %d: NCCL channel %d -> %d: ncclCommInitRank: %s%s", t->rank,
                     src[i], dst[i],
                     ce != cudaSuccess ? cudaGetErrorString(ce)
                     : r != ncclSuccess ? ncclGetErrorString(r)
                                        : "the other end could not open it",
                     r == ncclInvalidUsage ? " (two ranks on one GPU? NCCL refuses that: use the mpi device link)" : "");
        first = BT_ERR_COMM;
    }
    return first;
}

static void nccl_abort(bt_transport *t, int code) {
    struct nccl_ctx *c = t->context;
    for (int i = 0; i < c->n_edges; i++) ncclCommAbort(c->edges[i].comm);
    c->n_edges = 0;
    if (c->self) ncclCommAbort(c->self);
    c->self = NULL;
    t->control->iface.abort(t->control, code);
}

static void nccl_free(bt_transport *t) {
    struct nccl_ctx *c = t->context;
    for (int i = 0; i < c->n_edges; i++) {
        ncclCommDestroy(c->edges[i].comm);
        cudaStreamDestroy(c->edges[i].stream);
    }
    free(c->edges);
    if (c->self) ncclCommDestroy(c->self);
    if (c->self_stream) cudaStreamDestroy(c->self_stream);
    if (c->dep) cudaEventDestroy(c->dep);
    if (c->warm) cudaFree(c->warm);
    free(c);
    free(t);
}

static const struct bt_transport_i nccl_i = {
    /* .name          = */ nccl_name,
    /* .isend         = */ nccl_isend,
    /* .irecv         = */ nccl_irecv,
    /* .test          = */ nccl_test,
    /* .wait          = */ nccl_wait,
    /* .cancel        = */ NULL,
    /* .set_busy      = */ NULL,
    /* .bcast         = */ bt_transport_control_bcast,
    /* .gather        = */ bt_transport_control_gather,
    /* .allreduce_max = */ bt_transport_control_allreduce_max,
    /* .barrier       = */ bt_transport_control_barrier,
    /* .abort         = */ nccl_abort,
    /* .free          = */ nccl_free,
    /* .connect       = */ nccl_connect,
};

bt_transport *bt_transport_nccl_init_ranks(bt_transport *mpi, void *cuda_stream, const int *ranks, int n_ranks,
                                           char *err, size_t n) {
    if (err && n) err[0] = '\0';
    if (mpi->size > BT_TRANSPORT_MAX_RANKS_NCCL || n_ranks < 1 || n_ranks > mpi->size) {
        if (err && n) snprintf(err, n, "nccl: %d CUDA ranks of %d (at most %d ranks)", n_ranks, mpi->size,
                               BT_TRANSPORT_MAX_RANKS_NCCL);
        return NULL;
    }
    uint8_t member[BT_TRANSPORT_MAX_RANKS_NCCL] = {0};
    for (int i = 0; i < n_ranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= mpi->size || (i > 0 && ranks[i] <= ranks[i - 1])) {
            if (err && n) snprintf(err, n, "nccl: CUDA rank list entry %d (%d) is out of order or range", i, ranks[i]);
            return NULL;
        }
        member[ranks[i]] = 1;
    }
    if (!member[mpi->rank]) return NULL; /* not a CUDA rank */

    bt_transport *t = calloc(1, sizeof *t);
    struct nccl_ctx *c = calloc(1, sizeof *c);
    if (!t || !c) {
        free(t);
        free(c);
        if (err && n) snprintf(err, n, "nccl: out of memory");
        return NULL;
    }
    c->backend_stream = (cudaStream_t)cuda_stream;
    memcpy(c->member, member, sizeof member);
    bt_transport_init_over(t, &nccl_i, c, mpi);
    /* the one-rank communicator and the streams */
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess) r = ncclCommInitRank(&c->self, 1, id, 0);
    cudaError_t ce = cudaEventCreateWithFlags(&c->dep, cudaEventDisableTiming);
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&c->self_stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess) ce = cudaMalloc(&c->warm, 16);
    if (r != ncclSuccess || ce != cudaSuccess) {
        if (err && n)
            snprintf(err, n, "rank %d: nccl: %s", mpi->rank,
                     r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(ce));
        nccl_free(t);
        return NULL;
    }
    return t;
}

bt_transport *bt_transport_nccl_init(bt_transport *mpi, void *cuda_stream, char *err, size_t n) {
    int ranks[BT_TRANSPORT_MAX_RANKS_NCCL];
    if (mpi->size > BT_TRANSPORT_MAX_RANKS_NCCL) {
        if (err && n) snprintf(err, n, "nccl: %d ranks (at most %d)", mpi->size, BT_TRANSPORT_MAX_RANKS_NCCL);
        return NULL;
    }
    for (int i = 0; i < mpi->size; i++) ranks[i] = i;
    return bt_transport_nccl_init_ranks(mpi, cuda_stream, ranks, mpi->size, err, n);
}
