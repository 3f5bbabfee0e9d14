/* nccl.c - the NCCL transport (see bt_nccl.h): ncclSend / ncclRecv in a group on
 * one CUDA stream, a cudaEvent per request for completion, the communicator
 * bootstrapped over the MPI transport's broadcast, and every collective of
 * the control plane handed to that MPI transport. */
#include "bt_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

struct nccl_ctx {
    bt_transport *mpi;
    ncclComm_t comm;
    cudaStream_t stream;
    int world_to_nccl[BT_TRANSPORT_MAX_RANKS_NCCL]; /* -1: not a member */
    int n_world;
    int group_depth;
    bt_treq *pending[BT_NCCL_MAX_GROUP];
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

/* Record the completion event of req on the stream. */
static enum bt_status record(bt_transport *t, bt_treq *req) {
    struct nccl_ctx *c = t->context;
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, c->stream);
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
    if (peer < 0 || peer >= c->n_world || c->world_to_nccl[peer] < 0) {
        snprintf(t->error, sizeof t->error, "rank %d: rank %d is not a CUDA rank of the NCCL communicator", t->rank,
                 peer);
        return BT_ERR_INVALID;
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
    const int np = c->world_to_nccl[peer];
    ncclResult_t r = ncclSuccess;
    if (c->group_depth == 0) r = ncclGroupStart();
    if (r == ncclSuccess)
        r = is_recv ? ncclRecv(buf, bytes, ncclChar, np, c->comm, c->stream)
                    : ncclSend(buf, bytes, ncclChar, np, c->comm, c->stream);
    if (c->group_depth == 0) {
        const ncclResult_t r2 = ncclGroupEnd();
        if (r == ncclSuccess) r = r2;
    }
    if (r != ncclSuccess) return nccl_fail(t, is_recv ? "ncclRecv" : "ncclSend", r, peer);
    req->active = true;
    if (c->group_depth > 0) {
        c->pending[c->n_pending++] = req; /* its event is recorded at group end */
        return BT_OK;
    }
    return record(t, req);
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
        for (int i = 0; i < c->n_pending; i++) c->pending[i]->active = false;
        c->n_pending = 0;
        return nccl_fail(t, "ncclGroupEnd", r, -1);
    }
    enum bt_status s = BT_OK;
    for (int i = 0; i < c->n_pending; i++) {
        const enum bt_status si = record(t, c->pending[i]);
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
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(c->comm, &async);
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
    return comm_error(t, req);
}

static enum bt_status nccl_wait(bt_transport *t, bt_treq *req) {
    const enum bt_status s = comm_error(t, req);
    if (s != BT_OK) return s;
    const cudaError_t e = cudaEventSynchronize(*req_event(req));
    finish(req);
    return e == cudaSuccess ? BT_OK : cuda_fail(t, "cudaEventSynchronize", e, req->peer);
}

/* ---- the control plane: MPI's ---- */

static enum bt_status copy_error(bt_transport *t, enum bt_status s) {
    struct nccl_ctx *c = t->context;
    if (s != BT_OK) snprintf(t->error, sizeof t->error, "%s", c->mpi->error);
    return s;
}
static enum bt_status nccl_bcast(bt_transport *t, void *buf, size_t bytes, int root) {
    struct nccl_ctx *c = t->context;
    return copy_error(t, c->mpi->iface.bcast(c->mpi, buf, bytes, root));
}
static enum bt_status nccl_gather(bt_transport *t, const void *send, size_t bytes, void *recv, int root) {
    struct nccl_ctx *c = t->context;
    return copy_error(t, c->mpi->iface.gather(c->mpi, send, bytes, recv, root));
}
static enum bt_status nccl_allreduce_max(bt_transport *t, int64_t *v, int n) {
    struct nccl_ctx *c = t->context;
    return copy_error(t, c->mpi->iface.allreduce_max(c->mpi, v, n));
}
static enum bt_status nccl_barrier(bt_transport *t) {
    struct nccl_ctx *c = t->context;
    return copy_error(t, c->mpi->iface.barrier(c->mpi));
}
static void nccl_abort(bt_transport *t, int code) {
    struct nccl_ctx *c = t->context;
    ncclCommAbort(c->comm);
    c->comm = NULL;
    c->mpi->iface.abort(c->mpi, code);
}

static void nccl_free(bt_transport *t) {
    struct nccl_ctx *c = t->context;
    if (c->comm) ncclCommDestroy(c->comm);
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
    /* .bcast         = */ nccl_bcast,
    /* .gather        = */ nccl_gather,
    /* .allreduce_max = */ nccl_allreduce_max,
    /* .barrier       = */ nccl_barrier,
    /* .abort         = */ nccl_abort,
    /* .free          = */ nccl_free,
};

bt_transport *bt_transport_nccl_init_ranks(bt_transport *mpi, void *cuda_stream, const int *ranks, int n_ranks,
                                           char *err, size_t n) {
    if (err && n) err[0] = '\0';
    if (mpi->size > BT_TRANSPORT_MAX_RANKS_NCCL || n_ranks < 1 || n_ranks > mpi->size) {
        if (err && n) snprintf(err, n, "nccl: %d CUDA ranks of %d (at most %d ranks)", n_ranks, mpi->size,
                               BT_TRANSPORT_MAX_RANKS_NCCL);
        return NULL;
    }
    int map[BT_TRANSPORT_MAX_RANKS_NCCL];
    for (int i = 0; i < mpi->size; i++) map[i] = -1;
    for (int i = 0; i < n_ranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= mpi->size || (i > 0 && ranks[i] <= ranks[i - 1])) {
            if (err && n) snprintf(err, n, "nccl: CUDA rank list entry %d (%d) is out of order or range", i, ranks[i]);
            return NULL;
        }
        map[ranks[i]] = i;
    }
    /* the first CUDA rank makes the id; everyone hears it (collective) */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (mpi->rank == ranks[0]) r = ncclGetUniqueId(&id);
    int32_t ok = r == ncclSuccess;
    if (mpi->iface.bcast(mpi, &ok, sizeof ok, ranks[0]) != BT_OK ||
        mpi->iface.bcast(mpi, &id, sizeof id, ranks[0]) != BT_OK) {
        if (err && n) snprintf(err, n, "nccl: broadcast of the unique id: %s", mpi->error);
        return NULL;
    }
    if (!ok) {
        if (err && n) snprintf(err, n, "nccl: ncclGetUniqueId failed on rank %d", ranks[0]);
        return NULL;
    }
    if (map[mpi->rank] < 0) return NULL; /* not a CUDA rank */

    bt_transport *t = calloc(1, sizeof *t);
    struct nccl_ctx *c = calloc(1, sizeof *c);
    if (!t || !c) {
        free(t);
        free(c);
        if (err && n) snprintf(err, n, "nccl: out of memory");
        return NULL;
    }
    r = ncclCommInitRank(&c->comm, n_ranks, id, map[mpi->rank]);
    if (r != ncclSuccess) {
        if (err && n) snprintf(err, n, "rank %d: ncclCommInitRank: %s", mpi->rank, ncclGetErrorString(r));
        free(t);
        free(c);
        return NULL;
    }
    c->mpi = mpi;
    c->stream = (cudaStream_t)cuda_stream;
    c->n_world = mpi->size;
    memcpy(c->world_to_nccl, map, sizeof(int) * (size_t)mpi->size);
    t->iface = nccl_i;
    t->context = c;
    t->rank = mpi->rank;
    t->size = mpi->size;
    t->local_rank = mpi->local_rank;
    t->local_size = mpi->local_size;
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
