/* ordered.c - NCCL's rules for moving data over another transport (see
 * transport.h): every transfer carries one tag, so MPI's non-overtaking rule
 * matches sends and receives between two ranks in posting order, as NCCL
 * does; a peer is reachable only over an edge that connect opened; the first
 * transfer on an edge waits for the other end's first one, as NCCL's lazy
 * connection does; nothing can be cancelled.  The collectives are the inner
 * transport's.  Its connect follows the steps of transport/nccl.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport.h"

struct ordered_ctx {
    uint8_t *to;      /* [peer]: an edge rank -> peer is open */
    uint8_t *from;    /* [peer]: an edge peer -> rank is open */
    uint8_t *live;    /* [2 * peer + (1: rank -> peer)]: the edge has carried a first transfer */
    uint8_t *refused; /* [src * size + dst]: connect refuses this edge */
};

static struct ordered_ctx *octx(bt_transport *t) { return t->context; }

static const char *ordered_name(bt_transport *t) {
    (void)t;
    return "ordered";
}

static enum bt_status no_edge(bt_transport *t, int from, int to) {
    snprintf(t->error, sizeof t->error, "rank %d: no open channel from rank %d to rank %d (connect it first)", t->rank,
             from, to);
    return BT_ERR_INVALID;
}

static bool peer_ok(bt_transport *t, int peer) { return peer >= 0 && peer < t->size; }

/* The first transfer on an edge: both ends meet (NCCL sets up the link
 * between two ranks at the first operation and blocks until the peer makes
 * its own). */
static enum bt_status first_contact(bt_transport *t, int peer, bool out) {
    struct ordered_ctx *c = octx(t);
    uint8_t *live = &c->live[2 * peer + (out ? 1 : 0)];
    if (*live) return BT_OK;
    int32_t mine = 1, theirs = 0;
    const enum bt_status s =
        bt_transport_exchange(t->control, peer, BT_TRANSPORT_TAG_CONNECT, &mine, &theirs, sizeof mine);
    if (s != BT_OK) return bt_transport_control_status(t, s);
    *live = 1;
    return BT_OK;
}

static enum bt_status ordered_isend(bt_transport *t, const void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    if (!peer_ok(t, peer) || !octx(t)->to[peer]) return no_edge(t, t->rank, peer);
    bt_transport *in = t->control;
    enum bt_status s = first_contact(t, peer, true);
    if (s != BT_OK) return s;
    s = bt_transport_control_status(t, in->iface.isend(in, buf, bytes, peer, BT_TRANSPORT_TAG_ORDERED, req));
    req->tag = tag;
    return s;
}

static enum bt_status ordered_irecv(bt_transport *t, void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    if (!peer_ok(t, peer) || !octx(t)->from[peer]) return no_edge(t, peer, t->rank);
    bt_transport *in = t->control;
    enum bt_status s = first_contact(t, peer, false);
    if (s != BT_OK) return s;
    s = bt_transport_control_status(t, in->iface.irecv(in, buf, bytes, peer, BT_TRANSPORT_TAG_ORDERED, req));
    req->tag = tag;
    return s;
}

static enum bt_status ordered_test(bt_transport *t, bt_treq *req, bool *done) {
    bt_transport *in = t->control;
    return bt_transport_control_status(t, in->iface.test(in, req, done));
}

static enum bt_status ordered_wait(bt_transport *t, bt_treq *req) {
    bt_transport *in = t->control;
    return bt_transport_control_status(t, in->iface.wait(in, req));
}

static void ordered_set_busy(bt_transport *t, bool busy) { bt_transport_set_busy(t->control, busy); }

static void ordered_abort(bt_transport *t, int code) { t->control->iface.abort(t->control, code); }

static void ordered_free(bt_transport *t) {
    free(octx(t)->to);
    free(octx(t)->from);
    free(octx(t)->live);
    free(octx(t)->refused);
    free(t->context);
    free(t);
}

/* Each edge in list order is a rendezvous of its two ends, which exchange
 * the edge, its index in their lists and whether they can open it (a list
 * that differs between the ends is an error at once; a refused edge is
 * reported after every later edge has had its rendezvous, so no peer is left
 * waiting); then the first transfer, so that later ones never wait for the
 * other end to arrive. */
static enum bt_status ordered_connect(bt_transport *t, const int *src, const int *dst, int n_edges) {
    struct ordered_ctx *c = octx(t);
    bt_transport *in = t->control;
    enum bt_status first = BT_OK;
    for (int e = 0; e < n_edges; e++) {
        enum bt_status s = bt_transport_edge_check(t, e, src[e], dst[e]);
        if (s != BT_OK) return s;
        if (src[e] != t->rank && dst[e] != t->rank) continue;
        const bool out = src[e] == t->rank;
        const int peer = out ? dst[e] : src[e];
        struct {
            struct bt_edge_id id;
            int32_t ok; /* this end can open it */
        } mine = {{e, src[e], dst[e]}, !c->refused[(size_t)src[e] * (size_t)t->size + (size_t)dst[e]]}, theirs;
        memset(&theirs, 0, sizeof theirs);
        s = bt_transport_exchange(in, peer, BT_TRANSPORT_TAG_CONNECT, &mine, &theirs, sizeof mine);
        if (s != BT_OK) return bt_transport_control_status(t, s);
        s = bt_transport_edge_agree(t, mine.id, theirs.id, peer);
        if (s != BT_OK) return s;
        if (!mine.ok || !theirs.ok) {
            if (first == BT_OK)
                snprintf(t->error, sizeof t->error, "rank %d: channel %d -> %d refused by rank %d", t->rank, src[e],
                         dst[e], mine.ok ? peer : t->rank);
            first = BT_ERR_COMM;
            continue;
        }
        if (out)
            c->to[peer] = 1;
        else
            c->from[peer] = 1;
        s = first_contact(t, peer, out);
        if (s != BT_OK) return s;
    }
    return first;
}

void bt_transport_ordered_refuse(bt_transport *t, int src, int dst) {
    if (peer_ok(t, src) && peer_ok(t, dst)) octx(t)->refused[(size_t)src * (size_t)t->size + (size_t)dst] = 1;
}

static const struct bt_transport_i ordered_i = {
    /* .name          = */ ordered_name,
    /* .isend         = */ ordered_isend,
    /* .irecv         = */ ordered_irecv,
    /* .test          = */ ordered_test,
    /* .wait          = */ ordered_wait,
    /* .cancel        = */ NULL,
    /* .set_busy      = */ ordered_set_busy,
    /* .bcast         = */ bt_transport_control_bcast,
    /* .gather        = */ bt_transport_control_gather,
    /* .allreduce_max = */ bt_transport_control_allreduce_max,
    /* .barrier       = */ bt_transport_control_barrier,
    /* .abort         = */ ordered_abort,
    /* .free          = */ ordered_free,
    /* .connect       = */ ordered_connect,
};

bt_transport *bt_transport_ordered_new(bt_transport *inner) {
    bt_transport *t = calloc(1, sizeof *t);
    struct ordered_ctx *c = calloc(1, sizeof *c);
    if (c) {
        c->to = calloc((size_t)inner->size, 1);
        c->from = calloc((size_t)inner->size, 1);
        c->live = calloc(2 * (size_t)inner->size, 1);
        c->refused = calloc((size_t)inner->size * (size_t)inner->size, 1);
    }
    if (!t || !c || !c->to || !c->from || !c->live || !c->refused) {
        if (c) {
            free(c->to);
            free(c->from);
            free(c->live);
            free(c->refused);
        }
        free(c);
        free(t);
        return NULL;
    }
    bt_transport_init_over(t, &ordered_i, c, inner);
    return t;
}
