/* dist.c - the distributed runtime (see dist.h): graph agreement, rank
 * descriptions, weight placement, the splitter with one backend per rank,
 * per-rank allocation, and the micro-batch pipeline over a transport. */
#include "dist.h"

#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "alloc.h"
#include "ops.h"
#include "place.h"
#include "staging.h"

#define MAXC BT_SCHED_MAX_COPIES

/* ---- small helpers ---------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* A transfer: `tensor` (on src) is needed by split `consumer` (on dst) every
 * micro-batch, or is a graph output going back to rank 0 (consumer -1). */
struct xfer {
    struct bt_tensor *tensor;
    int src, dst;
    int producer; /* split that computes it, -1: a leaf, available at submit */
    int consumer;
    size_t bytes;
    int tag0; /* tag of slot c: tag0 + c */
    struct bt_tensor *copies[MAXC]; /* dst: where each slot lands (consumer >= 0) */
    void *ring[MAXC];               /* host slots: outputs on rank 0 (consumer -1), or receives
                                       staged through host memory for a device backend */
    bt_treq recv[MAXC];
    int64_t recv_k[MAXC]; /* micro-batch the slot's receive is for */
    void *stage[MAXC];    /* src: send slots (leafs and device tensors only) */
    bool zero_copy;       /* src: sent straight from the tensor's memory */
    bool direct;          /* over the device transport, backend memory to backend memory */
    bt_treq send[MAXC];
};

/* An output computed on rank 0 itself, copied to a ring after its split. */
struct local_output {
    struct bt_tensor *tensor;
    int split;
    size_t bytes;
    void *ring[MAXC];
};

struct proxy {
    bt_dist *d;
    int rank;
    char name[24];
};

struct bt_dist {
    bt_transport *t;
    bt_backend_t backend;
    struct bt_dist_options opt;
    int rank, size, n_copies;

    /* progress of transfers in flight while computing (bt_dist_set_progress) */
    enum bt_dist_progress progress;
    double progress_period_s, next_progress_s;
    enum bt_status progress_status; /* a failed test between ops, reported after the split */

    struct bt_graph *graph;
    int *node_owner, *leaf_owner;
    int64_t *slot_index; /* visited-set slot -> node index (>= 0) or -(leaf index + 1); for lookups */

    /* planning: one proxy backend (and buffer type) per rank */
    struct bt_backend *proxies;
    struct bt_buffer_type *proxy_bufts;
    struct proxy *proxy_ctx;
    uint8_t *support; /* [size][n_nodes]: rank r can run node i */
    bt_sched_t sched;
    struct bt_rank_desc *descs;
    int *layer_first, *layer_last;
    double *predicted_s;
    int n_layers;

    /* this rank's execution */
    bt_buffer_t weight_buf;
    bt_gallocr_t galloc;
    struct bt_graph local;
    struct xfer *xfers;
    int n_xfers;
    struct local_output *louts;
    int n_louts;
    bt_buffer_t host_buf;  /* send slots, receive staging, output rings: the backend's host memory */
    int64_t k_next;
    bool planned;

    struct bt_dist_stats stats;
    double wall_start;

    /* graph tensors whose flags this rank's plan changed, to put back */
    struct flag_change {
        struct bt_tensor *t;
        int32_t flags;
    } *flag_changes;
    int n_flag_changes;

    struct bt_trace_event *trace;
    int trace_n, trace_cap;
    double trace_t0;
    char err[512];
};

static void trace_add(bt_dist *d, int kind, double t0, double t1, int64_t k, int split, int peer, int64_t bytes) {
    if (d->trace_n >= d->trace_cap) return;
    d->trace[d->trace_n++] = (struct bt_trace_event){(t0 - d->trace_t0) * 1e6, (t1 - t0) * 1e6, kind, (int32_t)k,
                                                    split, peer, bytes};
}

static enum bt_status fail(bt_dist *d, enum bt_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static enum bt_status fail(bt_dist *d, enum bt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof d->err, fmt, ap);
    va_end(ap);
    return st;
}

static void die(bt_dist *d, enum bt_status st);

/* Every rank learns whether any rank failed; all return the first failing
 * rank's status and message. */
static enum bt_status agree(bt_dist *d, enum bt_status st) {
    int64_t v[2] = {st != BT_OK ? (int64_t)(d->size - d->rank) : 0, 0};
    if (d->t->iface.allreduce_max(d->t, v, 1) != BT_OK) return fail(d, BT_ERR_COMM, "%s", d->t->error);
    if (v[0] == 0) return BT_OK;
    const int root = d->size - (int)v[0]; /* the lowest failing rank */
    int32_t code = (int32_t)st;
    char msg[sizeof d->err];
    memcpy(msg, d->err, sizeof msg);
    if (d->t->iface.bcast(d->t, &code, sizeof code, root) != BT_OK ||
        d->t->iface.bcast(d->t, msg, sizeof msg, root) != BT_OK)
        return fail(d, BT_ERR_COMM, "%s", d->t->error);
    memcpy(d->err, msg, sizeof msg);
    d->err[sizeof d->err - 1] = '\0';
    return (enum bt_status)code;
}

/* ---- proxy backends: the splitter's view of the ranks ------------------------ */

static int node_index(const bt_dist *d, const struct bt_tensor *t) {
    const struct bt_hash_set *hs = &d->graph->visited;
    const size_t i = bt_hash_find(hs, t);
    if (i == BT_HASHSET_FULL || hs->keys[i] != t) return INT32_MIN;
    const int64_t v = d->slot_index[i];
    return (int)v;
}

static const char *proxy_name(bt_backend_t b) { return ((struct proxy *)b->context)->name; }
static void proxy_free(bt_backend_t b) { (void)b; }
static bt_buffer_type_t proxy_buft(bt_backend_t b) {
    struct proxy *p = b->context;
    return &p->d->proxy_bufts[p->rank];
}
static enum bt_status proxy_compute(bt_backend_t b, struct bt_graph *g) {
    (void)b;
    (void)g;
    return BT_ERR_UNSUPPORTED; /* planning only */
}
static bool proxy_supports_op(bt_backend_t b, const struct bt_tensor *op) {
    struct proxy *p = b->context;
    const int i = node_index(p->d, op);
    if (i < 0 || !p->d->support) return true; /* leafs, the splitter's own tensors; pinned plans */
    return p->d->support[(size_t)p->rank * (size_t)p->d->graph->n_nodes + (size_t)i] != 0;
}
static bool proxy_supports_buft(bt_backend_t b, bt_buffer_type_t buft) { return buft == proxy_buft(b); }

static const char *proxy_buft_name(bt_buffer_type_t buft) {
    return ((struct proxy *)buft->context)->name;
}
static bt_buffer_t proxy_buft_alloc(bt_buffer_type_t buft, size_t size) {
    (void)buft;
    (void)size;
    return NULL;
}
static size_t proxy_buft_align(bt_buffer_type_t buft) {
    (void)buft;
    return BT_MEM_ALIGN;
}

static const struct bt_backend_i proxy_i = {
    /* .get_name                = */ proxy_name,
    /* .free                    = */ proxy_free,
    /* .get_default_buffer_type = */ proxy_buft,
    /* .set_tensor_async        = */ NULL,
    /* .get_tensor_async        = */ NULL,
    /* .cpy_tensor_async        = */ NULL,
    /* .synchronize             = */ NULL,
    /* .graph_compute           = */ proxy_compute,
    /* .supports_op             = */ proxy_supports_op,
    /* .supports_buft           = */ proxy_supports_buft,
    /* .offload_op              = */ NULL,
    /* .event_new               = */ NULL,
    /* .event_free              = */ NULL,
    /* .event_record            = */ NULL,
    /* .event_wait              = */ NULL,
    /* .event_synchronize       = */ NULL,
    /* .get_error               = */ NULL,
    /* .get_host_buffer_type    = */ NULL,
};

/* ---- creation ------------------------------------------------------------------ */

bt_dist *bt_dist_new(bt_transport *t, bt_backend_t backend, const struct bt_dist_options *opt) {
    bt_dist *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->backend = backend;
    if (opt) d->opt = *opt;
    d->rank = t->rank;
    d->size = t->size;
    d->n_copies = d->opt.n_copies > 0 ? d->opt.n_copies : 2;
    if (d->n_copies > MAXC) d->n_copies = MAXC;
    d->stats.rank = d->rank;
    d->progress = BT_DIST_PROGRESS_AUTO;
    d->progress_period_s = 50e-6;
    if (getenv("BATON_DIST_DEBUG")) d->opt.verbose = true;
    return d;
}

void bt_dist_set_progress(bt_dist *d, enum bt_dist_progress mode, int period_us) {
    d->progress = mode;
    d->progress_period_s = period_us > 0 ? 1e-6 * period_us : 0.0;
}

int bt_dist_rank(const bt_dist *d) { return d->rank; }
int bt_dist_size(const bt_dist *d) { return d->size; }
const char *bt_dist_error(const bt_dist *d) { return d->err; }

/* The transport a transfer travels on. */
static bt_transport *xfer_transport(const bt_dist *d, const struct xfer *xf) {
    return xf->direct ? d->opt.device_transport : d->t;
}

/* The device transport cannot cancel the receives posted ahead for
 * micro-batches never submitted (k_next .. k_next + n_copies - 1, posted in
 * that order): their senders send them, whatever the tensors hold, in the
 * same order, so that both ends finish. */
static void drain_direct(bt_dist *d) {
    if (!d->planned) return;
    for (int64_t k = d->k_next; k < d->k_next + d->n_copies; k++) {
        const int c = (int)(k % d->n_copies);
        for (int x = 0; x < d->n_xfers; x++) {
            struct xfer *xf = &d->xfers[x];
            if (!xf->direct || xf->src != d->rank) continue;
            bt_transport *t = xfer_transport(d, xf);
            enum bt_status st = bt_transport_wait(t, &xf->send[c]);
            if (st == BT_OK) st = bt_transport_isend(t, xf->tensor->data, xf->bytes, xf->dst, xf->tag0 + c, &xf->send[c]);
            if (st != BT_OK) { /* its receiver would wait forever */
                fail(d, st, "draining the device transport: %s", t->error);
                die(d, st);
            }
        }
    }
}

static void release_plan(bt_dist *d) {
    drain_direct(d);
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        bt_transport *t = xfer_transport(d, xf);
        for (int c = 0; c < d->n_copies; c++) {
            /* outputs of submitted micro-batches will arrive: take them, or
             * their senders would wait forever; receives posted ahead for
             * micro-batches never submitted are cancelled (or drained) */
            if (xf->recv[c].active && (xf->recv_k[c] < d->k_next || (xf->direct && d->planned)))
                bt_transport_wait_polite(t, &xf->recv[c]);
            if (xf->recv[c].active && t->iface.cancel) t->iface.cancel(t, &xf->recv[c]);
            if (xf->send[c].active) bt_transport_wait(t, &xf->send[c]);
        }
    }
    free(d->xfers);
    d->xfers = NULL;
    d->n_xfers = 0;
    bt_buffer_free(d->host_buf);
    d->host_buf = NULL;
    free(d->louts);
    d->louts = NULL;
    d->n_louts = 0;
    if (d->galloc) {
        /* this rank's compute tensors lose the memory the plan gave them */
        bt_buffer_t cbuf = bt_gallocr_get_buffer(d->galloc, 0);
        for (int pass = 0; pass < 2 && cbuf; pass++) {
            const int n = pass ? d->local.n_leafs : d->local.n_nodes;
            struct bt_tensor **list = pass ? d->local.leafs : d->local.nodes;
            for (int i = 0; i < n; i++) {
                if (list[i]->buffer == cbuf) {
                    list[i]->buffer = NULL;
                    list[i]->data = NULL;
                }
            }
        }
        bt_gallocr_free(d->galloc);
    }
    d->galloc = NULL;
    /* the user's graph as it was: flags (this rank's plan marked the tensors
     * it sends), then sources (the splitter's copies) */
    for (int i = d->n_flag_changes - 1; i >= 0; i--) d->flag_changes[i].t->flags = d->flag_changes[i].flags;
    free(d->flag_changes);
    d->flag_changes = NULL;
    d->n_flag_changes = 0;
    if (d->sched) bt_sched_free(d->sched); /* restores the graph's sources */
    d->sched = NULL;
    /* weights and compute tensors of this rank lose their memory */
    if (d->graph) {
        for (int i = 0; i < d->graph->n_leafs; i++) {
            struct bt_tensor *l = d->graph->leafs[i];
            if (d->weight_buf && l->buffer == d->weight_buf) {
                l->buffer = NULL;
                l->data = NULL;
            }
        }
    }
    bt_buffer_free(d->weight_buf);
    d->weight_buf = NULL;
    free(d->local.nodes);
    free(d->local.leafs);
    memset(&d->local, 0, sizeof d->local);
    free(d->node_owner);
    free(d->leaf_owner);
    free(d->slot_index);
    free(d->support);
    free(d->proxies);
    free(d->proxy_bufts);
    free(d->proxy_ctx);
    free(d->descs);
    free(d->layer_first);
    free(d->layer_last);
    free(d->predicted_s);
    d->node_owner = d->leaf_owner = NULL;
    d->slot_index = NULL;
    d->support = NULL;
    d->proxies = NULL;
    d->proxy_bufts = NULL;
    d->proxy_ctx = NULL;
    d->descs = NULL;
    d->layer_first = d->layer_last = NULL;
    d->predicted_s = NULL;
    d->planned = false;
    d->k_next = 0;
}

void bt_dist_free(bt_dist *d) {
    if (!d) return;
    release_plan(d);
    free(d->trace);
    free(d);
}

enum bt_status bt_dist_enable_trace(bt_dist *d, int capacity) {
    free(d->trace);
    d->trace = NULL;
    d->trace_n = d->trace_cap = 0;
    if (capacity <= 0) return BT_OK;
    d->trace = calloc((size_t)capacity, sizeof *d->trace);
    if (!d->trace) return fail(d, BT_ERR_NOMEM, "out of memory for %d trace events", capacity);
    d->trace_cap = capacity;
    /* a common zero for all ranks: a barrier, then each rank's clock */
    if (d->t->iface.barrier(d->t) != BT_OK) return fail(d, BT_ERR_COMM, "%s", d->t->error);
    d->trace_t0 = now_s();
    return BT_OK;
}

static const char *trace_kind_name(int kind) {
    return kind == BT_TRACE_COMPUTE ? "compute" : kind == BT_TRACE_WAIT ? "wait" : "send";
}

enum bt_status bt_dist_write_trace(bt_dist *d, const char *path) {
    int64_t n = d->trace_n;
    if (d->t->iface.allreduce_max(d->t, &n, 1) != BT_OK) return fail(d, BT_ERR_COMM, "%s", d->t->error);
    const size_t per = (size_t)n + 1; /* slot 0 carries the count */
    struct bt_trace_event *mine = calloc(per, sizeof *mine);
    struct bt_trace_event *all = d->rank == 0 ? calloc(per * (size_t)d->size, sizeof *all) : NULL;
    enum bt_status st = (!mine || (d->rank == 0 && !all)) ? BT_ERR_NOMEM : BT_OK;
    if (mine) {
        mine[0].k = d->trace_n;
        if (d->trace_n) memcpy(mine + 1, d->trace, sizeof *mine * (size_t)d->trace_n);
    }
    st = agree(d, st == BT_OK ? BT_OK : fail(d, st, "out of memory for the trace"));
    if (st == BT_OK && d->t->iface.gather(d->t, mine, per * sizeof *mine, all, 0) != BT_OK)
        st = fail(d, BT_ERR_COMM, "%s", d->t->error);
    if (st == BT_OK && d->rank == 0) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
        FILE *f = fopen(tmp, "w");
        if (!f) {
            st = fail(d, BT_ERR_IO, "%s: cannot write the trace", path);
        } else {
            fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
            bool first = true;
            for (int r = 0; r < d->size; r++) {
                fprintf(f, "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}",
                        first ? "" : ",\n", r, r);
                first = false;
                const struct bt_trace_event *ev = all + per * (size_t)r;
                for (int i = 1; i <= ev[0].k; i++) {
                    const struct bt_trace_event *e = &ev[i];
                    char name[64];
                    if (e->kind == BT_TRACE_COMPUTE) snprintf(name, sizeof name, "split %d mb %d", e->split, e->k);
                    else if (e->kind == BT_TRACE_WAIT) snprintf(name, sizeof name, "wait rank %d mb %d", e->peer, e->k);
                    else snprintf(name, sizeof name, "send rank %d mb %d", e->peer, e->k);
                    fprintf(f,
                            ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
                            "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"micro_batch\": %d, \"split\": %d, "
                            "\"peer\": %d, \"bytes\": %lld}}",
                            name, trace_kind_name(e->kind), r, 0, e->ts_us, e->dur_us, e->k, e->split, e->peer,
                            (long long)e->bytes);
                }
            }
            fprintf(f, "\n]}\n");
            const bool ok = fflush(f) == 0 && !ferror(f);
            fclose(f);
            if (!ok || rename(tmp, path) != 0) {
                remove(tmp);
                st = fail(d, BT_ERR_IO, "%s: cannot write the trace", path);
            }
        }
    }
    free(mine);
    free(all);
    return agree(d, st);
}

/* ---- the plan ---------------------------------------------------------------------- */

static enum bt_status make_proxies(bt_dist *d) {
    const int P = d->size;
    d->proxies = calloc((size_t)P, sizeof *d->proxies);
    d->proxy_bufts = calloc((size_t)P, sizeof *d->proxy_bufts);
    d->proxy_ctx = calloc((size_t)P, sizeof *d->proxy_ctx);
    if (!d->proxies || !d->proxy_bufts || !d->proxy_ctx) return fail(d, BT_ERR_NOMEM, "out of memory");
    for (int r = 0; r < P; r++) {
        d->proxy_ctx[r] = (struct proxy){d, r, ""};
        snprintf(d->proxy_ctx[r].name, sizeof d->proxy_ctx[r].name, "rank%d", r);
        d->proxy_bufts[r].iface = (struct bt_buffer_type_i){
            /* .get_name       = */ proxy_buft_name,
            /* .alloc_buffer   = */ proxy_buft_alloc,
            /* .get_alignment  = */ proxy_buft_align,
            /* .get_max_size   = */ NULL,
            /* .get_alloc_size = */ NULL,
            /* .is_host        = */ NULL,
        };
        d->proxy_bufts[r].context = &d->proxy_ctx[r];
        d->proxies[r].iface = proxy_i;
        d->proxies[r].context = &d->proxy_ctx[r];
    }
    return BT_OK;
}

static enum bt_status make_sched(bt_dist *d) {
    bt_backend_t list[BT_SCHED_MAX_BACKENDS];
    if (d->size > BT_SCHED_MAX_BACKENDS)
        return fail(d, BT_ERR_CAPACITY, "%d ranks: at most %d are supported (BT_SCHED_MAX_BACKENDS)", d->size,
                    BT_SCHED_MAX_BACKENDS);
    for (int r = 0; r < d->size; r++) list[r] = &d->proxies[r];
    d->sched = bt_sched_new(list, NULL, d->size, (size_t)(d->graph->n_nodes + d->graph->n_leafs) + 64, d->n_copies);
    if (!d->sched) return fail(d, BT_ERR_NOMEM, "cannot create the splitter");
    return BT_OK;
}

/* Split with every node and leaf pinned to its owner: every rank derives the
 * same splits from the broadcast owners. */
static enum bt_status split_pinned(bt_dist *d) {
    struct bt_graph *g = d->graph;
    for (int i = 0; i < g->n_leafs; i++) bt_sched_set_tensor_backend(d->sched, g->leafs[i], &d->proxies[d->leaf_owner[i]]);
    for (int i = 0; i < g->n_nodes; i++) bt_sched_set_tensor_backend(d->sched, g->nodes[i], &d->proxies[d->node_owner[i]]);
    enum bt_status st = bt_sched_split_graph(d->sched, g);
    if (st != BT_OK) return fail(d, st, "%s", bt_sched_error(d->sched));
    return BT_OK;
}

static int split_of_node(bt_dist *d, int i) {
    const int n = bt_sched_get_n_splits(d->sched);
    for (int s = 0; s < n; s++) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        if (i >= sp->i_start && i < sp->i_end) return s;
    }
    return -1;
}

/* The split that computes t's data on its owner (-1: a leaf). */
static int producer_split(bt_dist *d, const struct bt_tensor *t) {
    const struct bt_tensor *base = t->view_src ? t->view_src : t;
    const int i = node_index(d, base);
    if (i < 0) return -1;
    return split_of_node(d, i);
}

static int owner_of(const bt_dist *d, const struct bt_tensor *t) {
    const int i = node_index(d, t);
    if (i == INT32_MIN) return -1;
    return i >= 0 ? d->node_owner[i] : d->leaf_owner[-i - 1];
}

int bt_dist_owner(const bt_dist *d, const struct bt_tensor *t) {
    if (!d->planned) return -1;
    return owner_of(d, t);
}

static enum bt_status add_xfer(bt_dist *d, struct bt_tensor *t, int src, int dst, int consumer) {
    struct xfer *nx = realloc(d->xfers, sizeof *nx * (size_t)(d->n_xfers + 1));
    if (!nx) return fail(d, BT_ERR_NOMEM, "out of memory");
    d->xfers = nx;
    struct xfer *x = &d->xfers[d->n_xfers];
    memset(x, 0, sizeof *x);
    x->tensor = t;
    x->src = src;
    x->dst = dst;
    x->producer = producer_split(d, t);
    x->consumer = consumer;
    x->bytes = bt_nbytes(t);
    if (x->bytes > (size_t)INT32_MAX)
        return fail(d, BT_ERR_CAPACITY, "tensor '%s' (%zu bytes) needs a transfer from rank %d to rank %d larger than 2 GiB: use smaller micro-batches",
                    t->name, x->bytes, src, dst);
    if ((d->n_xfers + 1) * d->n_copies - 1 > BT_TRANSPORT_MAX_USER_TAG)
        return fail(d, BT_ERR_CAPACITY, "%d transfers x %d slots exceed the transport's %d tags", d->n_xfers + 1,
                    d->n_copies, BT_TRANSPORT_MAX_USER_TAG + 1);
    if (consumer >= 0)
        for (int c = 0; c < d->n_copies; c++) x->copies[c] = bt_sched_get_tensor_copy(d->sched, t, dst, c);
    d->n_xfers++;
    return BT_OK;
}

/* Transfers in the order their data is made: by producing split (leafs,
 * -1, first), then as found.  A rank sends in split order and posts its
 * receives in transfer order, so on every edge both ends post in the same
 * order, which a transport without tags (NCCL) needs.  Tags follow. */
static int cmp_xfer(const void *a, const void *b) {
    const struct xfer *x = a, *y = b;
    if (x->producer != y->producer) return x->producer < y->producer ? -1 : 1;
    return x->tag0 < y->tag0 ? -1 : x->tag0 > y->tag0;
}

static void order_transfers(bt_dist *d) {
    for (int x = 0; x < d->n_xfers; x++) d->xfers[x].tag0 = x; /* found order, the tie-break */
    if (d->n_xfers > 1) qsort(d->xfers, (size_t)d->n_xfers, sizeof *d->xfers, cmp_xfer); /* xfers is NULL with none */
    for (int x = 0; x < d->n_xfers; x++) d->xfers[x].tag0 = x * d->n_copies;
}

/* A tensor one split computes for another split (not an input or output). */
static bool may_go_direct(const struct xfer *xf) { return xf->producer >= 0 && xf->consumer >= 0; }

/* Which transfers go over the device transport: computed tensors from one
 * split to another between two ranks that both have one, on an edge that
 * rank 0's options allow.  Every rank that has one then opens those edges
 * (its own among them) in one order. */
static enum bt_status choose_links(bt_dist *d) {
    const int P = d->size;
    int64_t *member = calloc((size_t)P, sizeof *member);
    uint8_t *allow = malloc((size_t)P * (size_t)P);
    int *esrc = malloc(sizeof(int) * (size_t)(d->n_xfers + 1)), *edst = malloc(sizeof(int) * (size_t)(d->n_xfers + 1));
    enum bt_status st = member && allow && esrc && edst ? BT_OK : fail(d, BT_ERR_NOMEM, "out of memory");
    st = agree(d, st);
    if (st == BT_OK) {
        member[d->rank] = d->opt.device_transport != NULL;
        for (size_t i = 0; i < (size_t)P * (size_t)P; i++)
            allow[i] = d->opt.device_edges ? d->opt.device_edges[i] != 0 : 1;
        if (d->t->iface.allreduce_max(d->t, member, P) != BT_OK ||
            d->t->iface.bcast(d->t, allow, (size_t)P * (size_t)P, 0) != BT_OK)
            st = fail(d, BT_ERR_COMM, "%s", d->t->error);
    }
    int n_edges = 0;
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        xf->direct = may_go_direct(xf) && member[xf->src] && member[xf->dst] &&
                     allow[(size_t)xf->src * (size_t)P + (size_t)xf->dst];
        if (!xf->direct) continue;
        bool seen = false;
        for (int e = 0; e < n_edges && !seen; e++) seen = esrc[e] == xf->src && edst[e] == xf->dst;
        if (!seen) {
            esrc[n_edges] = xf->src;
            edst[n_edges++] = xf->dst;
        }
    }
    bt_transport *dt = d->opt.device_transport;
    if (st == BT_OK && dt && bt_transport_connect(dt, esrc, edst, n_edges) != BT_OK)
        st = fail(d, BT_ERR_COMM, "rank %d: %s transport: %s", d->rank, dt->iface.name(dt), dt->error);
    free(member);
    free(allow);
    free(esrc);
    free(edst);
    return st;
}

static enum bt_status find_transfers(bt_dist *d) {
    const int n = bt_sched_get_n_splits(d->sched);
    for (int s = 0; s < n; s++) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        for (int j = 0; j < sp->n_inputs; j++) {
            struct bt_tensor *in = sp->inputs[j];
            enum bt_status st = add_xfer(d, in, owner_of(d, in), sp->backend_id, s);
            if (st != BT_OK) return st;
        }
    }
    for (int i = 0; i < d->graph->n_nodes; i++) {
        struct bt_tensor *t = d->graph->nodes[i];
        if (!(t->flags & BT_TENSOR_FLAG_OUTPUT)) continue;
        const int owner = d->node_owner[i];
        if (owner != 0) {
            enum bt_status st = add_xfer(d, t, owner, 0, -1);
            if (st != BT_OK) return st;
        } else if (d->rank == 0) {
            struct local_output *nl = realloc(d->louts, sizeof *nl * (size_t)(d->n_louts + 1));
            if (!nl) return fail(d, BT_ERR_NOMEM, "out of memory");
            d->louts = nl;
            d->louts[d->n_louts++] = (struct local_output){t, producer_split(d, t), bt_nbytes(t), {0}};
        }
    }
    order_transfers(d);
    return BT_OK;
}

static size_t physical_memory(void) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)8 << 30;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Ranks on the same kind of backend measure slightly different speeds from
 * run to run (other processes, turbo); a plan should not change with that
 * noise.  Speeds within 25% of the median of their backend kind become that
 * median; a rank really faster or slower keeps its own figure. */
static void smooth_speeds(struct bt_rank_desc *descs, int P) {
    double *v = malloc(sizeof(double) * (size_t)P);
    if (!v) return;
    for (int r = 0; r < P; r++) {
        int n = 0;
        for (int q = 0; q < P; q++)
            if (!strcmp(descs[q].backend, descs[r].backend)) v[n++] = descs[q].gflops;
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        const double med = v[n / 2];
        if (descs[r].gflops > 0.8 * med && descs[r].gflops < 1.25 * med) descs[r].gflops = med;
    }
    free(v);
}

/* Rank 0: placement, then owners for every node and leaf. */
static enum bt_status master_plan(bt_dist *d) {
    struct bt_graph *g = d->graph;
    struct bt_layer_costs lc;
    char err[256] = "";
    enum bt_status st = bt_layer_costs_make(g, &lc, err, sizeof err);
    if (st != BT_OK) {
        bt_layer_costs_free(&lc);
        return fail(d, st, "planning: %s", err);
    }
    d->n_layers = lc.L;
    smooth_speeds(d->descs, d->size);
    st = bt_place_layers(&lc, d->descs, d->size, &d->opt, d->layer_first, d->layer_last, d->predicted_s, err, sizeof err);
    if (st != BT_OK) {
        bt_layer_costs_free(&lc);
        return fail(d, st, "placement: %s", err);
    }
    /* weights by layer (or pin), inputs on rank 0 */
    for (int i = 0; i < g->n_leafs; i++) {
        struct bt_tensor *t = g->leafs[i];
        int owner = -1;
        if (lc.weight_layer[i] != INT32_MIN) {
            owner = bt_place_rank_of_layer(lc.weight_layer[i] >= lc.L ? lc.L : lc.weight_layer[i], d->layer_first,
                                  d->layer_last, d->size);
            if (lc.weight_layer[i] >= lc.L) owner = d->size - 1;
            for (int p = 0; p < d->opt.n_pins; p++)
                if (fnmatch(d->opt.pins[p].pattern, t->name, 0) == 0) owner = d->opt.pins[p].rank;
        } else if (t->flags & BT_TENSOR_FLAG_INPUT) {
            owner = 0;
        }
        if (owner >= 0) bt_sched_set_tensor_backend(d->sched, t, &d->proxies[owner]);
    }
    bt_layer_costs_free(&lc);
    st = bt_sched_split_graph(d->sched, g);
    if (st != BT_OK) return fail(d, st, "splitter: %s", bt_sched_error(d->sched));
    for (int i = 0; i < g->n_leafs; i++) d->leaf_owner[i] = bt_sched_get_backend_id(d->sched, g->leafs[i]);
    for (int i = 0; i < g->n_nodes; i++) d->node_owner[i] = bt_sched_get_backend_id(d->sched, g->nodes[i]);
    for (int i = 0; i < g->n_leafs; i++)
        if (d->leaf_owner[i] < 0) d->leaf_owner[i] = 0; /* unused leaf */
    return BT_OK;
}

/* The next slot of n bytes at *off in a host buffer at base (NULL while
 * sizing: then only *off moves). */
static void *take_slot(uint8_t *base, size_t *off, size_t n, size_t align) {
    void *p = base ? base + *off : NULL;
    *off += ((n ? n : 1) + align - 1) / align * align;
    return p;
}

/* This rank's memory: its weights, then its compute graph. */
static enum bt_status allocate_local(bt_dist *d, bt_dist_weight_init_fn init, void *user) {
    struct bt_graph *g = d->graph;
    bt_buffer_type_t buft = bt_backend_get_default_buffer_type(d->backend);
    const size_t align = bt_buft_get_alignment(buft);
    /* weights */
    size_t wbytes = 0;
    int n_w = 0;
    for (int i = 0; i < g->n_leafs; i++) {
        struct bt_tensor *t = g->leafs[i];
        if (d->leaf_owner[i] != d->rank || t->data || !(t->flags & BT_TENSOR_FLAG_WEIGHT)) continue;
        wbytes += (bt_buft_get_alloc_size(buft, t) + align - 1) / align * align;
        n_w++;
    }
    if (wbytes > 0) {
        d->weight_buf = bt_buft_alloc_buffer(buft, wbytes);
        if (!d->weight_buf)
            return fail(d, BT_ERR_NOMEM, "rank %d: cannot allocate %.1f MiB for its weights on %s", d->rank,
                        (double)wbytes / 1048576.0, bt_backend_name(d->backend));
        bt_buffer_set_usage(d->weight_buf, BT_BUFFER_USAGE_WEIGHTS);
        uint8_t *p = bt_buffer_get_base(d->weight_buf);
        for (int i = 0; i < g->n_leafs; i++) {
            struct bt_tensor *t = g->leafs[i];
            if (d->leaf_owner[i] != d->rank || t->data || !(t->flags & BT_TENSOR_FLAG_WEIGHT)) continue;
            bt_tensor_alloc(d->weight_buf, t, p);
            p += (bt_buft_get_alloc_size(buft, t) + align - 1) / align * align;
            if (init) init(t, user);
        }
    }
    d->stats.weight_bytes = (int64_t)wbytes;
    d->stats.n_weights = n_w;

    /* slots keep their memory; tensors sent away are not reused before sent */
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst == d->rank && xf->consumer >= 0)
            for (int c = 0; c < d->n_copies; c++) xf->copies[c]->flags |= BT_TENSOR_FLAG_INPUT | BT_TENSOR_FLAG_OUTPUT;
        if (xf->src == d->rank) {
            struct bt_tensor *base = xf->tensor->view_src ? xf->tensor->view_src : xf->tensor;
            if (!(base->flags & BT_TENSOR_FLAG_OUTPUT)) {
                struct flag_change *nf =
                    realloc(d->flag_changes, sizeof *nf * (size_t)(d->n_flag_changes + 1));
                if (!nf) return fail(d, BT_ERR_NOMEM, "out of memory");
                d->flag_changes = nf;
                d->flag_changes[d->n_flag_changes++] = (struct flag_change){base, base->flags};
                base->flags |= BT_TENSOR_FLAG_OUTPUT;
            }
        }
    }

    /* the local graph: my splits' nodes, my leafs, my receive slots */
    const int cap = g->n_nodes + g->n_leafs + d->n_xfers * d->n_copies + 8;
    d->local.nodes = malloc(sizeof(struct bt_tensor *) * (size_t)cap);
    d->local.leafs = malloc(sizeof(struct bt_tensor *) * (size_t)cap);
    if (!d->local.nodes || !d->local.leafs) return fail(d, BT_ERR_NOMEM, "out of memory");
    d->local.size = cap;
    d->local.ctx = g->ctx;
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst != d->rank || xf->consumer < 0) continue;
        for (int c = 0; c < d->n_copies; c++) d->local.leafs[d->local.n_leafs++] = xf->copies[c];
    }
    for (int i = 0; i < g->n_leafs; i++)
        if (d->leaf_owner[i] == d->rank && !g->leafs[i]->data) d->local.leafs[d->local.n_leafs++] = g->leafs[i];
    int n_mine = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (d->node_owner[i] != d->rank) continue;
        d->local.nodes[d->local.n_nodes++] = g->nodes[i];
        if (!bt_op_is_view(g->nodes[i]->op)) n_mine++;
    }
    d->stats.n_nodes = n_mine;
    d->galloc = bt_gallocr_new(buft);
    if (!d->galloc) return fail(d, BT_ERR_NOMEM, "out of memory");
    if (!bt_gallocr_reserve(d->galloc, &d->local) || !bt_gallocr_alloc_graph(d->galloc, &d->local))
        return fail(d, BT_ERR_NOMEM, "rank %d: %s", d->rank, bt_gallocr_error(d->galloc));
    d->stats.compute_bytes = (int64_t)bt_gallocr_get_buffer_size(d->galloc, 0);

    /* send slots, receive staging and output rings: one buffer of the
     * backend's host memory (pinned for a GPU, so its copies are fast).  A
     * computed tensor in host memory, or one that goes over the device
     * transport, is sent from where it lies (its producer waits for the send
     * before computing it again); leafs, which the user rewrites between
     * submits, and device tensors for a host transport go through send
     * slots.  A device backend receives a host transport's data into
     * staging slots and uploads it after the wait. */
    const bool host_backend = bt_buft_is_host(buft);
    bt_buffer_type_t hbuft = bt_backend_get_host_buffer_type(d->backend);
    size_t halign = bt_buft_get_alignment(hbuft);
    if (halign < BT_MEM_ALIGN) halign = BT_MEM_ALIGN;
    int64_t slot_bytes = 0;
    uint8_t *base = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        slot_bytes = 0;
        for (int x = 0; x < d->n_xfers; x++) {
            struct xfer *xf = &d->xfers[x];
            xf->zero_copy = xf->src == d->rank && xf->producer >= 0 && (host_backend || xf->direct);
            for (int c = 0; c < d->n_copies; c++) {
                const bool stage = xf->src == d->rank && !xf->zero_copy;
                const bool output = xf->dst == d->rank && xf->consumer < 0;
                const bool staging = xf->dst == d->rank && xf->consumer >= 0 && !host_backend && !xf->direct;
                if (xf->dst == d->rank && xf->consumer >= 0) slot_bytes += (int64_t)xf->bytes; /* the copy */
                if (stage) xf->stage[c] = take_slot(base, &off, xf->bytes, halign);
                if (output || staging) xf->ring[c] = take_slot(base, &off, xf->bytes, halign);
                if (stage || output || staging) slot_bytes += (int64_t)xf->bytes;
            }
        }
        for (int i = 0; i < d->n_louts; i++) {
            for (int c = 0; c < d->n_copies; c++) {
                d->louts[i].ring[c] = take_slot(base, &off, d->louts[i].bytes, halign);
                slot_bytes += (int64_t)d->louts[i].bytes;
            }
        }
        if (pass == 0 && off > 0) {
            d->host_buf = bt_buft_alloc_buffer(hbuft, off);
            if (!d->host_buf)
                return fail(d, BT_ERR_NOMEM, "rank %d: cannot allocate %.1f MiB of %s memory for transfer slots",
                            d->rank, (double)off / 1048576.0, bt_buft_name(hbuft));
            base = bt_buffer_get_base(d->host_buf);
        }
    }
    d->stats.slot_bytes = slot_bytes;
    d->stats.peak_bytes = d->stats.weight_bytes + d->stats.compute_bytes + slot_bytes;
    return BT_OK;
}

static enum bt_status post_recv(bt_dist *d, struct xfer *xf, int c, int64_t k) {
    void *buf = xf->ring[c] ? xf->ring[c] : xf->copies[c]->data;
    bt_transport *t = xfer_transport(d, xf);
    enum bt_status st = bt_transport_irecv(t, buf, xf->bytes, xf->src, xf->tag0 + c, &xf->recv[c]);
    if (st != BT_OK) return fail(d, st, "%s", t->error);
    xf->recv_k[c] = k;
    return BT_OK;
}

static enum bt_status describe_and_gather(bt_dist *d) {
    const int P = d->size, N = d->graph->n_nodes;
    struct bt_rank_desc mine;
    memset(&mine, 0, sizeof mine);
    snprintf(mine.backend, sizeof mine.backend, "%s", bt_backend_name(d->backend));
    mine.mem_bytes = d->opt.mem_limit > 0 ? d->opt.mem_limit
                                          : (int64_t)(physical_memory() / (size_t)(d->t->local_size > 0 ? d->t->local_size : 1));
    mine.gflops = bt_backend_measure_gflops(d->backend);
    uint8_t *sup = malloc((size_t)N + 1);
    if (!sup) return fail(d, BT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < N; i++) sup[i] = bt_backend_supports_op(d->backend, d->graph->nodes[i]) ? 1 : 0;
    if (d->rank == 0) {
        d->descs = calloc((size_t)P, sizeof *d->descs);
        d->support = malloc((size_t)P * (size_t)N + 1);
        if (!d->descs || !d->support) {
            free(sup);
            return fail(d, BT_ERR_NOMEM, "out of memory");
        }
    }
    enum bt_status st = d->t->iface.gather(d->t, &mine, sizeof mine, d->descs, 0);
    if (st == BT_OK && N > 0) st = d->t->iface.gather(d->t, sup, (size_t)N, d->support, 0);
    free(sup);
    if (st != BT_OK) return fail(d, st, "%s", d->t->error);
    return BT_OK;
}

/* The plan's per-graph tables (owners, layer ranges, lookups from the graph's
 * visited set) and the proxy backends, for d->graph on d->size ranks. */
static enum bt_status plan_arrays(bt_dist *d) {
    const struct bt_graph *graph = d->graph;
    const int P = d->size;
    d->slot_index = malloc(sizeof(int64_t) * graph->visited.size);
    d->node_owner = malloc(sizeof(int) * (size_t)(graph->n_nodes + 1));
    d->leaf_owner = malloc(sizeof(int) * (size_t)(graph->n_leafs + 1));
    d->layer_first = malloc(sizeof(int) * (size_t)P);
    d->layer_last = malloc(sizeof(int) * (size_t)P);
    d->predicted_s = calloc((size_t)P, sizeof(double));
    if (!d->slot_index || !d->node_owner || !d->leaf_owner || !d->layer_first || !d->layer_last || !d->predicted_s)
        return fail(d, BT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < graph->n_nodes; i++) d->slot_index[bt_hash_find(&graph->visited, graph->nodes[i])] = i;
    for (int i = 0; i < graph->n_leafs; i++)
        d->slot_index[bt_hash_find(&graph->visited, graph->leafs[i])] = -(int64_t)i - 1;
    return make_proxies(d);
}

enum bt_status bt_dist_plan(bt_dist *d, struct bt_graph *graph, bt_dist_weight_init_fn init, void *user) {
    if (d->planned) release_plan(d);
    d->graph = graph;
    d->err[0] = '\0';
    const int P = d->size;
    enum bt_status st = BT_OK;

    /* 1. every rank must have built the same graph */
    int64_t h[3] = {(int64_t)bt_graph_hash(graph), graph->n_nodes, graph->n_leafs};
    int64_t h0[3] = {h[0], h[1], h[2]};
    if (d->t->iface.bcast(d->t, h0, sizeof h0, 0) != BT_OK) return fail(d, BT_ERR_COMM, "%s", d->t->error);
    if (memcmp(h, h0, sizeof h) != 0)
        st = fail(d, BT_ERR_MISMATCH,
                  "rank %d built a different graph than rank 0 (hash %016llx, %lld nodes, %lld leafs; rank 0: "
                  "%016llx, %lld nodes, %lld leafs): every rank must build the same model with the same options",
                  d->rank, (unsigned long long)h[0], (long long)h[1], (long long)h[2], (unsigned long long)h0[0],
                  (long long)h0[1], (long long)h0[2]);
    st = agree(d, st);
    if (st != BT_OK) return st;

    /* lookups from the graph's visited set */
    if (graph->visited.size == 0) return fail(d, BT_ERR_INVALID, "bt_dist_plan needs a full graph, not a view");
    st = plan_arrays(d);
    st = agree(d, st);
    if (st != BT_OK) {
        release_plan(d);
        return st;
    }

    /* 2. descriptions to rank 0; 3. rank 0 plans */
    st = describe_and_gather(d);
    if (st == BT_OK && d->rank == 0) {
        st = make_sched(d);
        if (st == BT_OK) st = master_plan(d);
        if (st == BT_OK) {
            bt_sched_free(d->sched); /* re-derived below like every other rank */
            d->sched = NULL;
        }
    }
    st = agree(d, st);
    if (st != BT_OK) {
        release_plan(d);
        return st;
    }
    if (d->t->iface.bcast(d->t, d->node_owner, sizeof(int) * (size_t)graph->n_nodes, 0) != BT_OK ||
        d->t->iface.bcast(d->t, d->leaf_owner, sizeof(int) * (size_t)graph->n_leafs, 0) != BT_OK ||
        d->t->iface.bcast(d->t, d->layer_first, sizeof(int) * (size_t)P, 0) != BT_OK ||
        d->t->iface.bcast(d->t, d->layer_last, sizeof(int) * (size_t)P, 0) != BT_OK) {
        release_plan(d);
        return fail(d, BT_ERR_COMM, "%s", d->t->error);
    }

    /* 4. every rank: the same splits from the owners; transfers; memory.
     * Every node is pinned to its owner now: no support table is needed */
    free(d->support);
    d->support = NULL;
    if (st == BT_OK) st = make_sched(d);
    if (st == BT_OK) st = split_pinned(d);
    if (st == BT_OK) st = find_transfers(d);
    st = agree(d, st);
    if (st == BT_OK) st = choose_links(d);
    if (st == BT_OK) st = allocate_local(d, init, user);
    if (st == BT_OK) {
        int n = 0;
        for (int s = 0; s < bt_sched_get_n_splits(d->sched); s++)
            if (bt_sched_get_split(d->sched, s)->backend_id == d->rank) n++;
        d->stats.n_splits = n;
        d->stats.first_layer = d->layer_first[d->rank];
        d->stats.last_layer = d->layer_last[d->rank];
    }
    st = agree(d, st);
    if (st != BT_OK) {
        release_plan(d);
        return st;
    }
    /* 5. the first n_copies receives of every incoming transfer, micro-batch
     * by micro-batch (the order submit keeps) */
    bool posted_direct = false;
    for (int c = 0; c < d->n_copies && st == BT_OK; c++) {
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->dst == d->rank && xf->consumer >= 0) st = post_recv(d, xf, c, c);
            posted_direct = posted_direct || (st == BT_OK && xf->direct && xf->dst == d->rank && xf->consumer >= 0);
        }
    }
    if (st != BT_OK && posted_direct) die(d, st); /* a device receive cannot be taken back */
    st = agree(d, st);
    if (st != BT_OK) {
        release_plan(d);
        return st;
    }
    d->planned = true;
    d->k_next = 0;
    if (d->opt.verbose && d->rank == 0) bt_dist_print_plan(d, stderr);
    return BT_OK;
}

/* ---- the pipeline --------------------------------------------------------------------- */

static enum bt_status wait_req(bt_dist *d, const struct xfer *xf, bt_treq *r) {
    bt_transport *t = xfer_transport(d, xf);
    enum bt_status st = bt_transport_wait_polite(t, r);
    return st == BT_OK ? BT_OK : fail(d, st, "%s", t->error);
}

/* Where a slot lies in the host buffer (the staging calls take offsets). */
static size_t slot_offset(const bt_dist *d, const void *slot) {
    return (size_t)((const uint8_t *)slot - (const uint8_t *)bt_buffer_get_base(d->host_buf));
}

/* A tensor of this rank into host memory (a slot): staged through the backend's
 * stream when it lives in the backend's memory, else a plain read. */
static enum bt_status download(bt_dist *d, const struct bt_tensor *x, void *host) {
    const bt_buffer_t b = x->view_src ? x->view_src->buffer : x->buffer;
    if (b && bt_backend_supports_buft(d->backend, bt_buffer_get_type(b)))
        return bt_staging_to_host(d->backend, x, d->host_buf, slot_offset(d, host), d->err, sizeof d->err);
    bt_tensor_get(x, host, 0, bt_nbytes(x));
    return BT_OK;
}

static enum bt_status send_xfer(bt_dist *d, struct xfer *xf, int c) {
    const double t0 = now_s();
    if (xf->send[c].active) {
        enum bt_status st = wait_req(d, xf, &xf->send[c]);
        if (st != BT_OK) return st;
    }
    const void *buf = xf->tensor->data;
    if (!xf->zero_copy) {
        enum bt_status st = download(d, xf->tensor, xf->stage[c]);
        if (st != BT_OK) return st;
        buf = xf->stage[c];
    }
    bt_transport *t = xfer_transport(d, xf);
    enum bt_status st = bt_transport_isend(t, buf, xf->bytes, xf->dst, xf->tag0 + c, &xf->send[c]);
    if (st != BT_OK) return fail(d, st, "%s", t->error);
    d->stats.bytes_sent += (int64_t)xf->bytes;
    if (xf->direct) d->stats.bytes_direct += (int64_t)xf->bytes;
    const double t1 = now_s();
    d->stats.send_s += t1 - t0;
    if (d->trace) trace_add(d, BT_TRACE_SEND, t0, t1, d->k_next, xf->producer, xf->dst, (int64_t)xf->bytes);
    return BT_OK;
}

enum bt_status bt_dist_set_input(bt_dist *d, struct bt_tensor *input, const void *data, size_t size) {
    if (!d->planned) return fail(d, BT_ERR_INVALID, "set_input before bt_dist_plan");
    if (d->rank != 0) return BT_OK; /* inputs live on rank 0 */
    if (!(input->flags & BT_TENSOR_FLAG_INPUT) || owner_of(d, input) != 0)
        return fail(d, BT_ERR_INVALID, "tensor '%s' is not a graph input", input->name);
    if (size != bt_nbytes(input))
        return fail(d, BT_ERR_INVALID, "input '%s' takes %zu bytes, got %zu", input->name, bt_nbytes(input), size);
    bt_tensor_set(input, data, 0, size);
    return BT_OK;
}

/* Between two ops of a split (the CPU backend's node hook, on the compute
 * thread): at most once per period, test this rank's sends in flight.  A
 * test drives the transport's progress engine, which moves every transfer in
 * flight, receives included; a completed send is simply inactive later. */
static void progress_between_ops(void *user) {
    bt_dist *d = user;
    const double t = now_s();
    if (t < d->next_progress_s || d->progress_status != BT_OK) return;
    d->next_progress_s = t + d->progress_period_s;
    d->stats.progress_calls++;
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->src != d->rank) continue;
        for (int c = 0; c < d->n_copies; c++) {
            if (!xf->send[c].active) continue;
            bool done = false;
            bt_transport *tr = xfer_transport(d, xf);
            const enum bt_status st = bt_transport_test(tr, &xf->send[c], &done);
            if (st != BT_OK) {
                d->progress_status = st;
                fail(d, st, "%s", tr->error);
                return;
            }
        }
    }
}

/* One split on this rank's backend, with the transfers in flight kept
 * moving as bt_dist_set_progress chose. */
static enum bt_status compute_split(bt_dist *d, struct bt_graph *view) {
    enum bt_dist_progress mode = d->progress;
    const bool cpu = bt_backend_is_cpu(d->backend);
    if (mode == BT_DIST_PROGRESS_AUTO || (mode == BT_DIST_PROGRESS_COMPUTE && !cpu))
        mode = cpu ? BT_DIST_PROGRESS_COMPUTE : BT_DIST_PROGRESS_THREAD;
    enum bt_status st;
    if (mode == BT_DIST_PROGRESS_COMPUTE) {
        d->next_progress_s = now_s() + d->progress_period_s;
        bt_backend_cpu_set_node_hook(d->backend, progress_between_ops, d);
        st = bt_backend_graph_compute(d->backend, view);
        bt_backend_cpu_set_node_hook(d->backend, NULL, NULL);
        if (st == BT_OK && d->progress_status != BT_OK) return d->progress_status; /* d->err says why */
    } else {
        if (mode == BT_DIST_PROGRESS_THREAD) bt_transport_set_busy(d->t, true);
        st = bt_backend_graph_compute(d->backend, view);
        if (mode == BT_DIST_PROGRESS_THREAD) bt_transport_set_busy(d->t, false);
    }
    if (st != BT_OK) fail(d, st, "%s", bt_backend_error(d->backend));
    return st;
}

/* A run-time failure in the middle of the pipeline cannot be agreed on (the
 * other ranks are blocked in transfers): print it and stop every rank. */
static void die(bt_dist *d, enum bt_status st) {
    fprintf(stderr, "baton: rank %d: %s (%s)\n", d->rank, d->err, bt_status_str(st));
    d->t->iface.abort(d->t, 1);
}

enum bt_status bt_dist_submit(bt_dist *d) {
    if (!d->planned) return fail(d, BT_ERR_INVALID, "submit before bt_dist_plan");
    const int64_t k = d->k_next;
    const int c = (int)(k % d->n_copies);
    if (k == 0) d->wall_start = now_s();
    bt_sched_set_cur_copy(d->sched, c);
    enum bt_status st = BT_OK;

    /* rank 0: the outputs of micro-batch k land in slot c */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst != d->rank || xf->consumer >= 0) continue;
        if (xf->recv[c].active) st = wait_req(d, xf, &xf->recv[c]);
        if (st == BT_OK) st = post_recv(d, xf, c, k);
    }
    /* leafs other ranks need (inputs on rank 0) */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->src == d->rank && xf->producer < 0) st = send_xfer(d, xf, c);
    }
    const int n_splits = bt_sched_get_n_splits(d->sched);
    for (int s = 0; s < n_splits && st == BT_OK; s++) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        if (sp->backend_id != d->rank) continue;
        const double t0 = now_s();
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->dst == d->rank && xf->consumer == s) {
                const double w0 = now_s();
                st = wait_req(d, xf, &xf->recv[c]);
                if (st == BT_OK) d->stats.bytes_recv += (int64_t)xf->bytes;
                /* the upload runs in the backend's stream, before the split;
                 * the split's compute (synchronous) finishes it before the
                 * slot takes its next receive */
                if (st == BT_OK && xf->ring[c])
                    st = bt_staging_from_host(d->backend, xf->copies[c], d->host_buf, slot_offset(d, xf->ring[c]),
                                              d->err, sizeof d->err);
                if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, now_s(), k, s, xf->src, (int64_t)xf->bytes);
            }
        }
        /* tensors this split makes and sends from their own memory: the
         * previous micro-batch's sends must be done before they are rewritten */
        const double ts = now_s();
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->src != d->rank || xf->producer != s || !xf->zero_copy) continue;
            for (int cc = 0; cc < d->n_copies && st == BT_OK; cc++)
                if (xf->send[cc].active) st = wait_req(d, xf, &xf->send[cc]);
        }
        const double t1 = now_s();
        d->stats.wait_s += ts - t0;
        d->stats.send_s += t1 - ts;
        if (st != BT_OK) break;
        struct bt_graph view = sp->graph;
        st = compute_split(d, &view);
        const double t2 = now_s();
        d->stats.compute_s += t2 - t1;
        if (d->trace) trace_add(d, BT_TRACE_COMPUTE, t1, t2, k, s, -1, 0);
        if (st != BT_OK) {
            char why[sizeof d->err];
            snprintf(why, sizeof why, "%s", d->err);
            fail(d, st, "split %d: %s", s, why);
            break;
        }
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->src == d->rank && xf->producer == s) st = send_xfer(d, xf, c);
        }
        for (int i = 0; i < d->n_louts && st == BT_OK; i++)
            if (d->louts[i].split == s) st = download(d, d->louts[i].tensor, d->louts[i].ring[c]);
    }
    /* slot c is free again (its splits have run, uploads included): post
     * the receives of micro-batch k + n_copies */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst == d->rank && xf->consumer >= 0) st = post_recv(d, xf, c, k + d->n_copies);
    }
    if (st != BT_OK) die(d, st);
    d->k_next++;
    d->stats.micro_batches++;
    return BT_OK;
}

enum bt_status bt_dist_get_output(bt_dist *d, int k, const struct bt_tensor *output, void *dst, size_t size) {
    if (!d->planned) return fail(d, BT_ERR_INVALID, "get_output before bt_dist_plan");
    if (d->rank != 0) return fail(d, BT_ERR_INVALID, "outputs are read on rank 0");
    if (k < 0 || k >= d->k_next || k < d->k_next - d->n_copies)
        return fail(d, BT_ERR_INVALID, "output of micro-batch %d is not available (submitted %lld, %d kept)", k,
                    (long long)d->k_next, d->n_copies);
    const int c = k % d->n_copies;
    for (int i = 0; i < d->n_louts; i++) {
        if (d->louts[i].tensor != output) continue;
        if (size != d->louts[i].bytes) return fail(d, BT_ERR_INVALID, "output '%s' has %zu bytes", output->name, d->louts[i].bytes);
        memcpy(dst, d->louts[i].ring[c], size);
        return BT_OK;
    }
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->tensor != output || xf->consumer >= 0) continue;
        if (size != xf->bytes) return fail(d, BT_ERR_INVALID, "output '%s' has %zu bytes", output->name, xf->bytes);
        if (xf->recv_k[c] != k) return fail(d, BT_ERR_INVALID, "output of micro-batch %d was overwritten", k);
        if (xf->recv[c].active) {
            const double t0 = now_s();
            enum bt_status st = wait_req(d, xf, &xf->recv[c]);
            d->stats.wait_s += now_s() - t0;
            if (st != BT_OK) return st;
            d->stats.bytes_recv += (int64_t)xf->bytes;
        }
        memcpy(dst, xf->ring[c], size);
        return BT_OK;
    }
    return fail(d, BT_ERR_INVALID, "tensor '%s' is not a graph output", output->name);
}

enum bt_status bt_dist_synchronize(bt_dist *d) {
    if (!d->planned) return fail(d, BT_ERR_INVALID, "synchronize before bt_dist_plan");
    enum bt_status st = BT_OK;
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        for (int c = 0; c < d->n_copies && st == BT_OK; c++) {
            if (xf->src == d->rank && xf->send[c].active) st = wait_req(d, xf, &xf->send[c]);
            if (st == BT_OK && xf->dst == d->rank && xf->consumer < 0 && xf->recv[c].active) {
                const double t0 = now_s();
                st = wait_req(d, xf, &xf->recv[c]);
                d->stats.wait_s += now_s() - t0;
                if (st == BT_OK) d->stats.bytes_recv += (int64_t)xf->bytes;
            }
        }
    }
    bt_backend_synchronize(d->backend);
    if (d->wall_start > 0) d->stats.wall_s = now_s() - d->wall_start;
    return st;
}

/* ---- statistics and the plan in words ------------------------------------------ */

struct bt_dist_stats bt_dist_local_stats(const bt_dist *d) {
    struct bt_dist_stats s = d->stats;
    s.bubble = s.wall_s > 0 ? 1.0 - s.compute_s / s.wall_s : 0.0;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) s.rss_bytes = (int64_t)ru.ru_maxrss * 1024; /* KiB on Linux */
    return s;
}

void bt_dist_reset_stats(bt_dist *d) {
    const struct bt_dist_stats keep = d->stats;
    memset(&d->stats, 0, sizeof d->stats);
    d->stats.rank = keep.rank;
    d->stats.n_splits = keep.n_splits;
    d->stats.weight_bytes = keep.weight_bytes;
    d->stats.compute_bytes = keep.compute_bytes;
    d->stats.slot_bytes = keep.slot_bytes;
    d->stats.peak_bytes = keep.peak_bytes;
    d->stats.n_nodes = keep.n_nodes;
    d->stats.n_weights = keep.n_weights;
    d->stats.first_layer = keep.first_layer;
    d->stats.last_layer = keep.last_layer;
    d->wall_start = now_s();
}

enum bt_status bt_dist_gather_stats(bt_dist *d, struct bt_dist_stats *out) {
    struct bt_dist_stats s = bt_dist_local_stats(d);
    enum bt_status st = d->t->iface.gather(d->t, &s, sizeof s, out, 0);
    return st == BT_OK ? BT_OK : fail(d, st, "%s", d->t->error);
}

const struct bt_rank_desc *bt_dist_rank_desc(const bt_dist *d, int rank) {
    return d->descs && rank >= 0 && rank < d->size ? &d->descs[rank] : NULL;
}

void bt_dist_rank_layers(const bt_dist *d, int rank, int *first, int *last) {
    *first = d->layer_first ? d->layer_first[rank] : -1;
    *last = d->layer_last ? d->layer_last[rank] : -1;
}

void bt_dist_print_plan(const bt_dist *d, FILE *f) {
    if (!d->planned && !d->sched) return;
    const int P = d->size;
    int n_direct = 0;
    for (int x = 0; x < d->n_xfers; x++) n_direct += d->xfers[x].direct;
    fprintf(f, "plan: %d ranks, %d splits, %d transfers per micro-batch", P, bt_sched_get_n_splits(d->sched),
            d->n_xfers);
    if (n_direct > 0) fprintf(f, " (%d device to device)", n_direct);
    fprintf(f, ", %d micro-batches in flight\n", d->n_copies);
    for (int r = 0; r < P; r++) {
        int nodes = 0, splits = 0;
        double wbytes = 0, in_bytes = 0;
        for (int i = 0; i < d->graph->n_nodes; i++)
            if (d->node_owner[i] == r && !bt_op_is_view(d->graph->nodes[i]->op)) nodes++;
        for (int i = 0; i < d->graph->n_leafs; i++)
            if (d->leaf_owner[i] == r && (d->graph->leafs[i]->flags & BT_TENSOR_FLAG_WEIGHT))
                wbytes += (double)bt_nbytes(d->graph->leafs[i]);
        for (int s = 0; s < bt_sched_get_n_splits(d->sched); s++)
            if (bt_sched_get_split(d->sched, s)->backend_id == r) splits++;
        for (int x = 0; x < d->n_xfers; x++)
            if (d->xfers[x].dst == r) in_bytes += (double)d->xfers[x].bytes;
        fprintf(f, "  rank %d (%s, %.1f GFLOP/s): layers ", r, d->descs ? d->descs[r].backend : "?",
                d->descs ? d->descs[r].gflops : 0.0);
        if (d->layer_first[r] >= 0) fprintf(f, "%d-%d", d->layer_first[r], d->layer_last[r]);
        else fprintf(f, "none");
        fprintf(f, ", %d splits, %d nodes, weights %.2f MiB, receives %.1f KiB per micro-batch", splits, nodes,
                wbytes / 1048576.0, in_bytes / 1024.0);
        if (d->predicted_s) fprintf(f, ", predicted stage %.3f ms", d->predicted_s[r] * 1e3);
        fprintf(f, "\n");
    }
}

/* ---- measuring a backend ------------------------------------------------------------ */

double bt_backend_measure_gflops(bt_backend_t backend) {
    const int64_t K = 512, M = 512, N = 64;
    bt_context *ctx = bt_init((struct bt_init_params){bt_tensor_overhead() * 8 + bt_graph_overhead(8), NULL, true});
    if (!ctx) return 1.0;
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, K, M);
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, K, N);
    struct bt_tensor *c = bt_mul_mat(ctx, a, b);
    struct bt_graph *g = bt_graph_new(ctx, 8);
    double best = 1e30;
    if (c && g && bt_graph_build_forward_expand(g, c) == BT_OK) {
        bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, backend);
        if (buf) {
            float *tmp = calloc((size_t)(K * M), sizeof(float));
            if (tmp) {
                for (int64_t i = 0; i < K * M; i++) tmp[i] = (float)((i * 7) % 13) * 0.01f;
                bt_tensor_set(a, tmp, 0, bt_nbytes(a));
                bt_tensor_set(b, tmp, 0, bt_nbytes(b));
                free(tmp);
            }
            for (int it = 0; it < 6; it++) {
                const double t0 = now_s();
                if (bt_backend_graph_compute(backend, g) != BT_OK) break;
                const double dt = now_s() - t0;
                if (it > 0 && dt < best) best = dt;
            }
            bt_buffer_free(buf);
        }
    }
    bt_free(ctx);
    if (best >= 1e30 || best <= 0) return 1.0;
    return 2.0 * (double)(K * M * N) / best / 1e9;
}

/* ---- the plan without running it ------------------------------------------------------ */

enum bt_status bt_dist_plan_offline(struct bt_graph *graph, const struct bt_rank_desc *ranks, int n_ranks,
                                    const struct bt_dist_options *opt, FILE *out, char *err, size_t errlen) {
    /* a stand-in transport of n_ranks that is never used to talk */
    bt_transport fake;
    memset(&fake, 0, sizeof fake);
    fake.rank = 0;
    fake.size = n_ranks;
    if (graph->visited.size == 0) {
        snprintf(err, errlen, "the plan needs a full graph, not a view");
        return BT_ERR_INVALID;
    }
    bt_dist *d = bt_dist_new(&fake, NULL, opt);
    if (!d) return BT_ERR_NOMEM;
    d->graph = graph;
    const int P = n_ranks;
    enum bt_status st = BT_OK;
    d->descs = malloc(sizeof *d->descs * (size_t)P);
    st = d->descs ? plan_arrays(d) : fail(d, BT_ERR_NOMEM, "out of memory");
    if (st == BT_OK) {
        memcpy(d->descs, ranks, sizeof *d->descs * (size_t)P); /* no support table: every rank runs every op */
        st = make_sched(d);
        if (st == BT_OK) st = master_plan(d);
        if (st == BT_OK) {
            /* transfers, as every rank would derive them */
            bt_sched_free(d->sched);
            d->sched = NULL;
            st = make_sched(d);
            if (st == BT_OK) st = split_pinned(d);
            if (st == BT_OK) st = find_transfers(d);
        }
        /* the device transport where the topology asks for it */
        for (int x = 0; st == BT_OK && opt && opt->device_edges && x < d->n_xfers; x++) {
            struct xfer *xf = &d->xfers[x];
            xf->direct = may_go_direct(xf) && opt->device_edges[(size_t)xf->src * (size_t)P + (size_t)xf->dst];
        }
        if (st == BT_OK) {
            d->planned = true;
            bt_dist_print_plan(d, out);
        }
    }
    if (st != BT_OK) snprintf(err, errlen, "%s", d->err);
    d->planned = false;
    release_plan(d);
    free(d);
    return st;
}
