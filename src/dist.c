/* dist.c - the distributed runtime (see dist.h): graph agreement, rank
 * descriptions, weight placement, the splitter with one backend per rank,
 * per-rank allocation, and the micro-batch pipeline over a transport. */
#include "dist.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "baton/alloc.h"
#include "backend-impl.h"
#include "baton/ops.h"
#include "plan.h"
#include "staging.h"

#define MAXC BT_SCHED_MAX_COPIES

/* ---- small helpers ---------------------------------------------------------- */

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
    /* routed: expert weights [.., .., n_expert] that dst reads only as the
     * experts of MUL_MAT_IDs sharing one ids tensor it computes itself: only
     * the experts the ids select travel, packed in ascending order (the
     * seed's used-experts copy, across ranks).  dst reads the ids after node
     * ids_at of split ids_split, sends src the set (n_expert bytes), posts
     * the receive of exactly those experts, and waits for them before node
     * use_at of the consumer split, where it puts each in its place */
    bool routed;
    struct bt_tensor *ids;
    int ids_split, ids_at, use_at;
    int64_t n_expert;
    size_t expert_bytes;
    size_t routed_bytes[MAXC]; /* the bytes of slot c's experts */
    uint8_t *used[MAXC];       /* slot c's set */
    bt_treq used_req[MAXC];    /* dst: the set's send; src: its receive */
    bool serve[MAXC];          /* src: slot c's set is awaited, its experts not yet sent */
    int64_t asked_k[MAXC], taken_k[MAXC]; /* dst: the micro-batch slot c last asked for, took */
};

/* A graph input this rank reads but does not own (plan.h: bt_plan_input):
 * its caller sets it into the slot of the micro-batch it is for. */
struct local_input {
    struct bt_tensor *tensor;
    struct bt_tensor *copies[MAXC];
    int64_t set_k[MAXC]; /* the micro-batch each slot was last set for */
};

/* An output computed on rank 0 itself, copied to a ring after its split. */
struct local_output {
    struct bt_tensor *tensor;
    int split;
    size_t bytes;
    void *ring[MAXC];
};

/* An expert group's share of one layer (plan.h: bt_expert_group): the chain
 * of a split of the group's first rank (home) from the MUL_MAT_ID that first
 * reads the routed input x to the last MUL_MAT_ID (gate, up, the activation,
 * down), whose result `out` is the only chain tensor read after it.  Every
 * rank of the group computes the chain over the experts it holds (the
 * weights' expert_lo/hi).  Before the chain, home sends each member the ids
 * (always: a header that says what follows) and the rows of x of the tokens
 * that chose one of its experts, then computes its own experts' rows; each
 * member computes its rows on inputs of its own (x_in, ids_in) and sends
 * them back, and home puts them in place in `out`: the ids' order, each row
 * computed once, by the kernel one process uses. */
#define GCHAIN_MAX_NODES 24
struct gslot {
    int32_t *ids;  /* the ids of the micro-batch, packed [K * T] */
    int64_t n_o;   /* home: the rows of out the member sends in this slot */
    int32_t divide; /* an attention's: whether this micro-batch divides it (attn_tell) */
    bt_treq ids_req; /* (an attention's: of divide) */
};
/* The rows of one member (home: one per member; a member: its own), shared
 * by every chain: a rank runs one chain at a time, and each waits for the
 * last use of the rows before it writes them. */
struct gbuf {
    float *x;      /* home: the rows of x for the member; member: the rows it was sent */
    float *o;      /* home: the member's rows of out; member: its rows, to send */
    bt_treq x_req, o_req;
    /* a member: o_req sends from the memory of its chain results (a chain's
     * columns, row_serve), which no chain computes into before it is done */
    bool o_out;
};
struct gchain {
    int group, home, split;
    /* a dense product divided by rows (plan.h: bt_expert_group dense): one
     * MUL_MAT node; lo/hi are each rank's rows of its weight, T the columns
     * of x, and home sends every member all of x */
    bool rows;
    /* a dense product of a group whose ranks hold the dense weights whole
     * (whole; plan.h: bt_expert_group tokens), and with cols divided by
     * tokens (a ubatch of at least BT_TOKENS_MIN): lo/hi are each rank's
     * columns of x and of out, home sends each member its columns of x
     * and takes them back into out in place; without cols, by rows, each
     * rank computing its rows of the whole weight (rows_of_whole) */
    bool whole, cols;
    /* products divided by tokens around a SwiGLU (gate and up, then down
     * of the SwiGLU's result, glu: its x is that SwiGLU): each rank computes
     * the SwiGLU of its own columns of gate's and up's results (local on
     * those two: they stay on the rank; with an eval callback home computes
     * them whole itself), so that neither they nor down's input cross;
     * apart: a member's result with memory of its own (read after the next
     * chain's is computed) */
    bool glu, local, apart;
    /* an attention divided by q heads (a group's prompt attention, with rows
     * set: out is [Dv, H, T] and lo/hi count its floats per token, a
     * whole number of heads); home sends each member its heads of q, the kv
     * heads they read, the mask and the sinks, packed (attn_pack) */
    bool attn;
    /* a per-head product divided by heads (plan.h: bt_head_divisible; with
     * rows set: one MUL_MAT node, out [n, T, H]; lo/hi are each rank's
     * heads, d_x and d_out a token's floats over all heads); home sends each
     * member its heads of x and takes back those of out */
    bool heads;
    /* a dense product of the x of the chain before it (the group's previous
     * chain, a dense product too, in the same split, with rows on every
     * member: Q's, K's and V's of one norm): home sends x once, for the
     * first, and each member keeps it in its input, so that it goes on to
     * this product's rows at once (home then takes them, computed while it
     * ran the nodes between, a RoPE or a cache write) */
    bool x_kept;
    /* an attention's heads kept where they are computed: the chain after it
     * is a per-head product of them (MLA's attn_v_b) with the same heads on
     * every rank, and nothing else reads them.  A member's product reads its
     * heads of out in place (its x_in is out with dimensions 1 and 2
     * swapped, out has memory of its own: member_outs) and it sends them
     * home only when home asks (its eval callback may want them whole);
     * home sends the product no x (keeps on the attention, x_from_attn on
     * the product; both only in micro-batches whose attention is divided,
     * divided_k) */
    bool keeps, x_from_attn;
    int64_t divided_k[MAXC]; /* an attention's: the micro-batch whose slot c last divided it */
    /* a per-head product's heads kept where they are computed for the
     * attention chain q_to (its index; -1: none; MLA's attn_k_b, whose
     * result is the first part of each row of the attention's q): a member
     * computes its heads of out into that part of its copy of q (its out is
     * that part of the copy, dimensions 1 and 2 swapped: alias_member_outs) and
     * sends them home only when home asks; home then sends the attention only the
     * rest of each row of q (q_kept on the attention: the floats of each
     * row that are the product's, 0: none).  Home tells a member
     * whether the attention is divided (its word) at this chain, before it
     * (told_k on the attention), and keeps them only in micro-batches that
     * divide it. */
    int q_to;
    int64_t q_kept;
    int64_t told_k[MAXC];
    struct bt_tensor *ins[BT_MAX_SRC]; /* a member: its copies of the sources */
    int first, last; /* nodes [first, last] of the split's graph */
    int n_ranks, me; /* me: this rank's place in the group (0: home) */
    int ranks[BT_EXPERT_GROUP_MAX];
    int64_t lo[BT_EXPERT_GROUP_MAX], hi[BT_EXPERT_GROUP_MAX];
    /* an expert chain's: the experts each rank holds (lo/hi: those it
     * computes for the micro-batch at hand, within them: chain_bounds) */
    int64_t hold_lo[BT_EXPERT_GROUP_MAX], hold_hi[BT_EXPERT_GROUP_MAX];
    /* with overlap, where ranks m - 1 and m share expert lo[m] (= hi[m - 1]
     * - 1) between them: its pairs before packed index cut[m] are m - 1's,
     * the rest m's; -1: they share none (hi[m - 1] = lo[m]) */
    int64_t cut[BT_EXPERT_GROUP_MAX];
    int overlap;     /* the group's (plan.h: bt_expert_group) */
    int64_t *counts; /* home, with overlap: the slots that chose each expert */
    struct bt_tensor *x, *ids, *out;
    struct bt_tensor *nodes[GCHAIN_MAX_NODES];
    int n_nodes;
    struct bt_tensor *w[GCHAIN_MAX_NODES]; /* its expert weights */
    int n_w;
    struct bt_tensor *rep[GCHAIN_MAX_NODES]; /* its experts' biases, held whole by every rank */
    int n_rep;
    int64_t n_expert, K, T, d_x, d_out;
    size_t expert_bytes; /* one expert of every weight */
    int tag0;            /* slot c: tag0 + 3c: ids (an attention: home's word), + 1: rows of x, + 2: rows of out */
    struct gslot *slots; /* [n_copies * n_ranks]: slot c, member m (member: m 0) */
    int64_t done_k[MAXC]; /* home: the micro-batch whose chain slot c last ran */
    /* member: its inputs, and the chain's sources as they were */
    struct bt_tensor *x_in, *ids_in;
    struct bt_tensor *was[GCHAIN_MAX_NODES][BT_MAX_SRC];
};

/* An expert chain's header, home to each member: the ids [K * T], then
 * where each rank's experts begin for this micro-batch (lo[0..n-1]; rank
 * m's end where m + 1's begin, the last's at n_expert, or one past that
 * where they share it), then cut[0..n-1]. */
static size_t ids_bytes(const struct gchain *ch) { return sizeof(int32_t) * (size_t)(ch->K * ch->T + 2 * ch->n_ranks); }

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
    struct bt_plan plan;            /* rank 0's plan, on every rank */
    bt_plan_splitter *splitter;     /* its splits on this rank's graph */
    bt_sched_t sched;               /* the splitter's scheduler: split views, copy slots */

    /* this rank's execution */
    bt_buffer_t weight_buf;     /* the backend's default buffer type */
    bt_buffer_t weight_buf_own; /* opt.weight_buft: the weights no other rank reads */
    bt_gallocr_t galloc;
    struct bt_graph local;
    struct xfer *xfers;
    int n_xfers;
    struct local_output *louts;
    int n_louts;
    struct local_input *lins;
    int n_lins;
    bt_buffer_t host_buf;  /* send slots, receive staging, output rings: the backend's host memory */
    uint8_t *routed_mem;   /* the routed transfers' sets, and the ids read on dst */
    void *ids_host;
    int n_routed_src;      /* routed transfers this rank sends */
    int n_routed_dst;      /* routed transfers this rank receives */
    int n_serving;         /* their sets awaited (src: xf->serve[c] set) */
    struct gchain *chains; /* expert groups' chains this rank takes part in */
    int n_chains;
    int n_chain_home;      /* of them, those this rank runs the layer of */
    bt_context *gctx;      /* the members' chain inputs */
    struct bt_tensor **ranged; /* weights whose held experts this runtime set (put back at release) */
    int n_ranged;
    int64_t chain_bytes;   /* the chains' slots and rows (host memory) */
    double paused_s;       /* time a split spent paused in its transfers (not compute) */
    struct gbuf *gbufs;    /* [n_gbufs]: the chains' rows */
    struct mask_seen {     /* attn_worth's counts of the micro-batch: a mask, how many pairs it lets through */
        const struct bt_tensor *mask;
        int64_t k, seen;
    } seen[2];
    int n_gbufs;
    bt_buffer_t gout_buf;  /* a member: the results of all its chains (member_outs) */
    int64_t mem_bytes;     /* the memory this rank may use (bt_backend_plan_memory) */
    const char *mem_what;  /* which memory that is, for a message */
    int64_t k_next;
    bool planned;
    bool measure_only; /* bt_dist_measure: size this rank's memory, allocate nothing */

    struct bt_dist_stats stats;
    double wall_start;

    /* graph tensors whose flags this rank's plan changed, to put back */
    struct flag_change {
        struct bt_tensor *t;
        int32_t flags;
    } *flag_changes;
    int n_flag_changes;

    bt_sched_eval_callback eval_cb; /* bt_dist_set_eval_callback */
    void *eval_user;

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

const char *bt_dist_error(const bt_dist *d) { return d->err; }

/* The transport a transfer travels on. */
static bt_transport *xfer_transport(const bt_dist *d, const struct xfer *xf) {
    return xf->direct ? d->opt.device_transport : d->t;
}

static void release_chains(bt_dist *d);

static void member_outs(bt_dist *d, bt_buffer_t b, void *data);
static bool in_host_memory(const struct bt_tensor *x);
static void release_plan(bt_dist *d) {
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        bt_transport *t = xfer_transport(d, xf);
        for (int c = 0; c < d->n_copies; c++) {
            /* outputs of submitted micro-batches will arrive: take them, or
             * their senders would wait forever; receives posted ahead for
             * micro-batches never submitted are cancelled (the device
             * transport's are never posted ahead: see bt_dist_submit) */
            if (xf->recv[c].active && xf->recv_k[c] < d->k_next) bt_transport_wait_polite(t, &xf->recv[c]);
            if (xf->recv[c].active && t->iface.cancel) t->iface.cancel(t, &xf->recv[c]);
            if (xf->send[c].active) bt_transport_wait(t, &xf->send[c]);
            /* a routed set: its send completes (src took it), its receive ahead is cancelled */
            if (xf->used_req[c].active && xf->dst == d->rank) bt_transport_wait(t, &xf->used_req[c]);
            if (xf->used_req[c].active && t->iface.cancel) t->iface.cancel(t, &xf->used_req[c]);
        }
    }
    free(d->xfers);
    d->xfers = NULL;
    d->n_xfers = 0;
    free(d->routed_mem);
    d->routed_mem = NULL;
    d->ids_host = NULL;
    d->n_routed_src = 0;
    d->n_routed_dst = 0;
    bt_buffer_free(d->host_buf);
    d->host_buf = NULL;
    free(d->louts);
    d->louts = NULL;
    d->n_louts = 0;
    free(d->lins);
    d->lins = NULL;
    d->n_lins = 0;
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
    member_outs(d, NULL, NULL);
    bt_buffer_free(d->gout_buf);
    d->gout_buf = NULL;
    /* the user's graph as it was: flags (this rank's plan marked the tensors
     * it sends), then sources (the splitter's copies) */
    for (int i = d->n_flag_changes - 1; i >= 0; i--) d->flag_changes[i].t->flags = d->flag_changes[i].flags;
    free(d->flag_changes);
    d->flag_changes = NULL;
    d->n_flag_changes = 0;
    release_chains(d);                  /* a member's chains' sources */
    bt_plan_splitter_free(d->splitter); /* restores the graph's sources */
    d->splitter = NULL;
    d->sched = NULL;
    /* weights and compute tensors of this rank lose their memory */
    if (d->graph) {
        for (int i = 0; i < d->graph->n_leafs; i++) {
            struct bt_tensor *l = d->graph->leafs[i];
            if (l->buffer && (l->buffer == d->weight_buf || l->buffer == d->weight_buf_own)) {
                l->buffer = NULL;
                l->data = NULL;
                l->flags &= ~BT_TENSOR_FLAG_REPACKED; /* a layout of that buffer's */
            }
        }
    }
    bt_buffer_free(d->weight_buf);
    bt_buffer_free(d->weight_buf_own);
    d->weight_buf = NULL;
    d->weight_buf_own = NULL;
    free(d->local.nodes);
    free(d->local.leafs);
    memset(&d->local, 0, sizeof d->local);
    bt_plan_free(&d->plan);
    d->planned = false;
    d->k_next = 0;
}

void bt_dist_free(bt_dist *d) {
    if (!d) return;
    release_plan(d);
    free(d->trace);
    free(d);
}

/* ---- tracing (the JSON writer is trace.c) ------------------------------------------ */

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
    d->trace_t0 = bt_now_s();
    return BT_OK;
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
    if (st == BT_OK && d->rank == 0)
        st = bt_trace_write_json(all, per, d->size, path, d->err, sizeof d->err);
    free(mine);
    free(all);
    return agree(d, st);
}

/* ---- the plan: owners from rank 0, this rank's transfers ---------------------------- */

static int owner_of(const bt_dist *d, const struct bt_tensor *t) {
    const int i = bt_plan_splitter_index(d->splitter, t);
    if (i == INT32_MIN) return -1;
    return i >= 0 ? d->plan.node_owner[i] : d->plan.leaf_owner[-i - 1];
}

int bt_dist_owner(const bt_dist *d, const struct bt_tensor *t) {
    if (!d->planned) return -1;
    return owner_of(d, t);
}

/* Is t the weight xf carries, or one of its slots' copies? */
static bool is_xfer_copy(const struct xfer *xf, const struct bt_tensor *t, int n_copies) {
    if (t == xf->tensor) return true;
    for (int c = 0; c < n_copies; c++)
        if (t == xf->copies[c]) return true;
    return false;
}

/* Node index of t in a split's graph, or -1. */
static int split_node(const struct bt_sched_split *sp, const struct bt_tensor *t) {
    for (int n = 0; n < sp->graph.n_nodes; n++)
        if (sp->graph.nodes[n] == t) return n;
    return -1;
}

/* Whether xf can be routed (see struct xfer), and where dst's pauses are.
 * Every rank decides the same from the same graph and splits. */
static bool routable(bt_dist *d, struct xfer *xf) {
    const struct bt_tensor *w = xf->tensor;
    if (xf->producer >= 0 || xf->consumer < 0 || xf->direct || !bt_tensor_is_weight(w) || w->view_src ||
        w->ne[2] < 2 || w->ne[3] != 1 || !bt_is_contiguous(w))
        return false;
    const int n_splits = bt_sched_get_n_splits(d->sched);
    struct bt_tensor *ids = NULL;
    int use_at = -1;
    for (int s = 0; s < n_splits; s++) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        for (int n = 0; n < sp->graph.n_nodes; n++) {
            const struct bt_tensor *node = sp->graph.nodes[n];
            for (int j = 0; j < BT_MAX_SRC; j++) {
                if (!node->src[j] || !is_xfer_copy(xf, node->src[j], d->n_copies)) continue;
                /* only as the experts of MUL_MAT_IDs of the consumer split, one ids tensor */
                if (s != xf->consumer || node->op != BT_OP_MUL_MAT_ID || j != 0) return false;
                if (ids && ids != node->src[2]) return false;
                ids = node->src[2];
                if (use_at < 0) use_at = n;
            }
        }
    }
    if (!ids || ids->type != BT_TYPE_I32) return false;
    /* the ids computed on dst, in the consumer split (before the first use) or an earlier one */
    for (int s = xf->consumer; s >= 0; s--) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        if (sp->backend_id != xf->dst) continue;
        int at = split_node(sp, ids);
        if (at < 0 && ids->view_src) at = split_node(sp, ids->view_src);
        if (at < 0 || (s == xf->consumer && at >= use_at)) continue;
        xf->ids = ids;
        xf->ids_split = s;
        xf->ids_at = at;
        xf->use_at = use_at;
        xf->n_expert = w->ne[2];
        xf->expert_bytes = w->nb[2];
        return true;
    }
    return false;
}

/* The routed transfers among this rank's, and the memory their sets take. */
static enum bt_status find_routed(bt_dist *d) {
    size_t sets = 0, ids_bytes = 0;
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        xf->routed = routable(d, xf);
        if (!xf->routed || (xf->src != d->rank && xf->dst != d->rank)) continue;
        sets += (size_t)d->n_copies * (size_t)xf->n_expert;
        if (xf->dst == d->rank && bt_nbytes(xf->ids) > ids_bytes) ids_bytes = bt_nbytes(xf->ids);
        d->n_routed_src += xf->src == d->rank;
        d->n_routed_dst += xf->dst == d->rank;
    }
    if (sets == 0) return BT_OK;
    d->routed_mem = malloc(sets + ids_bytes + 1);
    if (!d->routed_mem) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    uint8_t *p = d->routed_mem;
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (!xf->routed || (xf->src != d->rank && xf->dst != d->rank)) continue;
        for (int c = 0; c < d->n_copies; c++, p += xf->n_expert) {
            xf->used[c] = p;
            xf->asked_k[c] = xf->taken_k[c] = -1;
        }
    }
    d->ids_host = p;
    return BT_OK;
}

/* ---- expert groups (struct gchain): finding the chains ---------------------------- */

static bool is_experts(const struct bt_tensor *w) {
    return w && bt_tensor_is_weight(w) && !w->view_src && w->ne[2] >= 2 && w->ne[3] == 1 && bt_is_contiguous(w);
}

static bool in_chain(const struct gchain *ch, const struct bt_tensor *t) {
    for (int i = 0; i < ch->n_nodes; i++)
        if (ch->nodes[i] == t) return true;
    return false;
}

/* Whether t is a source a chain's node may read besides the chain's own
 * results: the chain's ids (a member's own copy of them), or a weight of
 * the experts' biases, which every rank of the group holds whole (plan.h:
 * bt_expert_bias; gpt-oss's, taken per slot by GET_ROWS with the ids). */
static bool chain_source(const bt_dist *d, const struct gchain *ch, const struct bt_tensor *t) {
    return in_chain(ch, t) || t == ch->ids || bt_expert_bias(d->graph, t);
}

/* Whether node nd reads tensor t. */
static bool reads(const struct bt_tensor *nd, const struct bt_tensor *t) {
    for (int k = 0; k < BT_MAX_SRC; k++)
        if (nd->src[k] == t) return true;
    return false;
}

/* The chain that starts at node j of a split (a MUL_MAT_ID of experts): the
 * nodes that continue it (of its results, its ids and its experts' biases:
 * chain_source; views of its results), up to the last MUL_MAT_ID among them
 * or past it the nodes of one row per slot that go on from its result (a
 * bias added). */
static void chain_at(const bt_dist *d, struct gchain *ch, const struct bt_graph *v, int j) {
    const struct bt_tensor *n0 = v->nodes[j];
    ch->x = n0->src[1];
    ch->ids = n0->src[2];
    ch->n_expert = n0->src[0]->ne[2];
    ch->first = ch->last = j;
    ch->n_nodes = 0;
    int kept = 0;
    for (int i = j; i < v->n_nodes && ch->n_nodes < GCHAIN_MAX_NODES; i++) {
        struct bt_tensor *nd = v->nodes[i];
        bool ok;
        if (nd->op == BT_OP_MUL_MAT_ID) {
            ok = is_experts(nd->src[0]) && nd->src[0]->ne[2] == ch->n_expert && nd->src[2] == ch->ids &&
                 (nd->src[1] == ch->x || in_chain(ch, nd->src[1]));
        } else if (bt_op_is_view(nd->op)) {
            ok = nd->src[0] && in_chain(ch, nd->src[0]);
        } else {
            ok = nd->src[0] != NULL;
            for (int k = 0; ok && k < BT_MAX_SRC; k++)
                if (nd->src[k] && !chain_source(d, ch, nd->src[k])) ok = false;
        }
        if (!ok) break;
        ch->nodes[ch->n_nodes++] = nd;
        const bool goes_on = kept > 0 && !bt_op_is_view(nd->op) && reads(nd, ch->nodes[kept - 1]) &&
                             nd->type == BT_TYPE_F32 && nd->ne[1] == ch->ids->ne[0] && nd->ne[2] == ch->ids->ne[1];
        if (nd->op == BT_OP_MUL_MAT_ID || goes_on) {
            ch->last = i;
            kept = ch->n_nodes;
        }
    }
    ch->n_nodes = kept;
    ch->out = ch->nodes[kept - 1];
    ch->n_w = ch->n_rep = 0;
    for (int i = 0; i < ch->n_nodes; i++) {
        struct bt_tensor *w = ch->nodes[i]->src[0];
        const bool bias = ch->nodes[i]->op == BT_OP_GET_ROWS && bt_expert_bias(d->graph, w);
        if (ch->nodes[i]->op != BT_OP_MUL_MAT_ID && !bias) continue;
        struct bt_tensor **list = bias ? ch->rep : ch->w;
        int *n = bias ? &ch->n_rep : &ch->n_w;
        bool seen = false;
        for (int k = 0; k < *n; k++) seen |= list[k] == w;
        if (!seen) list[(*n)++] = w;
    }
}

static bool weight_sent(const bt_dist *d, const struct bt_tensor *t);
static bool my_weight(const bt_dist *d, int i);

/* Whether node nd (of a group's home split) is a dense product the group's
 * n ranks divide by rows (plan.h: bt_row_divisible), of a weight of home's
 * that no transfer sends. */
static bool row_divisible(const bt_dist *d, const struct bt_tensor *nd, int n) {
    return nd->op == BT_OP_MUL_MAT && bt_row_divisible(d->graph, nd->src[0], n) && !weight_sent(d, nd->src[0]);
}

/* A chain of one node j of a split (of rows, heads or an attention), its
 * input x; returns the node. */
static struct bt_tensor *one_node_chain(struct gchain *ch, const struct bt_graph *v, int j, struct bt_tensor *x) {
    struct bt_tensor *nd = v->nodes[j];
    ch->rows = true;
    ch->x = x;
    ch->out = nd;
    ch->first = ch->last = j;
    ch->nodes[0] = nd;
    ch->n_nodes = 1;
    ch->w[0] = nd->op == BT_OP_MUL_MAT ? nd->src[0] : NULL;
    ch->n_w = nd->op == BT_OP_MUL_MAT;
    ch->K = 1;
    return nd;
}

/* A dense product's chain: the one node j of a split. */
static void row_chain_at(struct gchain *ch, const struct bt_graph *v, int j, bool tokens) {
    struct bt_tensor *nd = one_node_chain(ch, v, j, v->nodes[j]->src[1]);
    ch->T = bt_nelements(ch->x) / ch->x->ne[0];
    ch->d_x = ch->x->ne[0];
    ch->d_out = nd->ne[0];
    ch->whole = tokens;
    ch->cols = tokens && ch->T >= BT_TOKENS_MIN && ch->x->ne[1] == ch->T && nd->ne[1] == ch->T &&
               bt_is_contiguous(ch->x) && bt_is_contiguous(nd);
    for (int m = 0; m < ch->n_ranks; m++) {
        if (ch->cols) ch->lo[m] = ch->T * m / ch->n_ranks, ch->hi[m] = ch->T * (m + 1) / ch->n_ranks;
        else bt_row_share(ch->d_out, ch->n_ranks, m, &ch->lo[m], &ch->hi[m]);
    }
}

/* A dense product's rows of a weight held whole (whole without cols): the
 * weight's rows this rank computes while on, all of them (as held) after. */
static void rows_of_whole(const struct gchain *ch, bool on) {
    if (!ch->whole || ch->cols) return;
    ch->w[0]->row_lo = on ? (int32_t)ch->lo[ch->me] : 0;
    ch->w[0]->row_hi = on ? (int32_t)ch->hi[ch->me] : (int32_t)ch->w[0]->ne[1];
}

/* The prompt attention of a group that divides every product: its q heads
 * divided among the ranks (in whole groups of the q heads that share a kv
 * head, or one by one where every head reads the one kv head), each rank
 * computing its heads over the kv cache home sends it.  Only for ubatches
 * of at least ATTN_CHAIN_MIN_T tokens (a decode step's attention is small
 * beside sending the cache) and only on CPU ranks (their attention computes
 * a share of the heads: tensor.h's row_lo/hi of the node). */
#define ATTN_CHAIN_MIN_T 16
static bool attn_divisible(const bt_dist *d, const struct bt_tensor *nd, const struct bt_expert_group *grp) {
    if (nd->op != BT_OP_FLASH_ATTN || nd->src[0]->ne[2] < ATTN_CHAIN_MIN_T) return false;
    const int64_t H = nd->src[0]->ne[1], Hk = nd->src[1]->ne[1];
    return (Hk > 1 ? Hk : H) >= grp->n_ranks && bt_is_contiguous(nd) && bt_group_on_cpu(&d->plan, grp);
}

/* A per-head product's chain: the one node j of a split, its weight's
 * matrices (heads) divided as experts are. */
static void heads_chain_at(struct gchain *ch, const struct bt_graph *v, int j) {
    struct bt_tensor *nd = one_node_chain(ch, v, j, v->nodes[j]->src[1]);
    ch->heads = true;
    ch->T = nd->ne[1];
    ch->d_x = ch->x->ne[0] * ch->x->ne[2];
    ch->d_out = nd->ne[0] * nd->ne[2];
    for (int m = 0; m < ch->n_ranks; m++) bt_expert_share(nd->src[0]->ne[2], ch->n_ranks, m, &ch->lo[m], &ch->hi[m]);
}

/* Whether a chain is a dense product's (not an attention's or a per-head
 * product's): every member is sent all of x. */
static bool plain_rows(const struct gchain *ch) { return ch->rows && !ch->attn && !ch->heads; }

static void attn_chain_at(struct gchain *ch, const struct bt_graph *v, int j) {
    struct bt_tensor *nd = one_node_chain(ch, v, j, v->nodes[j]->src[0]);
    ch->attn = true;
    ch->T = nd->ne[2];
    ch->d_out = nd->ne[0] * nd->ne[1];
    const int64_t H = nd->src[0]->ne[1], Hk = nd->src[1]->ne[1], unit = Hk > 1 ? H / Hk : 1;
    for (int m = 0; m < ch->n_ranks; m++) {
        bt_expert_share(H / unit, ch->n_ranks, m, &ch->lo[m], &ch->hi[m]);
        ch->lo[m] *= unit * nd->ne[0];
        ch->hi[m] *= unit * nd->ne[0];
    }
}

/* Member m's part of source k of an attention chain: the range [*lo, *hi)
 * of its dimension 1 (q: its heads; k and v: the kv heads they read; the
 * mask and the sinks whole). */
static void attn_src_range(const struct gchain *ch, int m, int k, int64_t *lo, int64_t *hi) {
    const struct bt_tensor *nd = ch->out, *src = nd->src[k];
    const int64_t Dv = nd->ne[0], group = nd->src[0]->ne[1] / nd->src[1]->ne[1];
    *lo = 0;
    *hi = src->ne[1];
    if (k == 0) {
        *lo = ch->lo[m] / Dv;
        *hi = ch->hi[m] / Dv;
    } else if ((k == 1 || k == 2) && nd->src[1]->ne[1] > 1) {
        *lo = ch->lo[m] / Dv / group;
        *hi = ch->hi[m] / Dv / group;
    }
}

/* Member m's parts of the sources of an attention chain, to buf (pack) or
 * from it into the sources (a member's own copies): the rows of each in
 * order (of q, with q_kept, the part of each row after the kept heads');
 * returns the bytes (buf NULL: only counts). */
static size_t attn_pack(const struct gchain *ch, int m, uint8_t *buf, bool unpack) {
    size_t n = 0;
    for (int k = 0; k < BT_MAX_SRC; k++) {
        struct bt_tensor *src = ch->out->src[k];
        if (!src) continue;
        int64_t lo, hi;
        attn_src_range(ch, m, k, &lo, &hi);
        const size_t skip = k == 0 ? bt_row_size(src->type, ch->q_kept) : 0;
        const size_t row = bt_row_size(src->type, src->ne[0]) - skip;
        if (!buf) {
            n += row * (size_t)((hi - lo) * src->ne[2] * src->ne[3]);
            continue;
        }
        for (int64_t i3 = 0; i3 < src->ne[3]; i3++)
            for (int64_t i2 = 0; i2 < src->ne[2]; i2++)
                for (int64_t i1 = lo; i1 < hi; i1++, n += row) {
                    uint8_t *at = (uint8_t *)src->data + i1 * src->nb[1] + i2 * src->nb[2] + i3 * src->nb[3] + skip;
                    if (unpack) memcpy(at, buf + n, row);
                    else memcpy(buf + n, at, row);
                }
    }
    return n;
}

/* Whether the chain can run in a group: rows of x and of out are whole
 * tokens' and slots', and nothing after it reads a tensor of it but out. */
static enum bt_status chain_check(bt_dist *d, struct gchain *ch) {
    const struct bt_tensor *x = ch->x, *ids = ch->ids, *out = ch->out;
    const char *why = NULL;
    if (x->type != BT_TYPE_F32 || x->ne[1] != 1 || x->ne[3] != 1 || x->nb[0] != sizeof(float))
        why = "its input is not one F32 row per token";
    else if (ids->type != BT_TYPE_I32 || ids->nb[0] != sizeof(int32_t) || ids->ne[1] != x->ne[2] || ids->ne[2] != 1)
        why = "its ids are not one row of I32 per token";
    else if (out->type != BT_TYPE_F32 || !bt_is_contiguous(out) || out->ne[1] != ids->ne[0] || out->ne[2] != ids->ne[1])
        why = "its result is not one F32 row per slot and token";
    else if (ch->n_expert < ch->n_ranks)
        why = "it has fewer experts than the group has ranks";
    for (int i = 0; !why && i < d->graph->n_nodes; i++) {
        const struct bt_tensor *nd = d->graph->nodes[i];
        if (in_chain(ch, nd)) {
            if (nd != out && (nd->flags & BT_TENSOR_FLAG_OUTPUT)) why = "a tensor inside it is a graph output";
            continue;
        }
        for (int k = 0; k < BT_MAX_SRC && !why; k++)
            if (nd->src[k] && nd->src[k] != out && in_chain(ch, nd->src[k])) why = "a tensor inside it is read after it";
    }
    if (!why) return BT_OK;
    return fail(d, BT_ERR_UNSUPPORTED, "expert group %d: the experts of '%s' cannot be divided: %s", ch->group,
                ch->w[0]->name, why);
}

/* A member's copies of attention chain i's sources (contiguous, each
 * shared with the earlier chains' of its type and shape: a member computes
 * one chain at a time and sets its inputs just before), in place of them. */
static enum bt_status attn_inputs(bt_dist *d, int i) {
    struct gchain *ch = &d->chains[i];
    struct bt_tensor *nd = ch->out;
    for (int k = 0; k < BT_MAX_SRC; k++) {
        struct bt_tensor *src = nd->src[k];
        ch->was[0][k] = src;
        if (!src) continue;
        for (int j = 0; j < i && !ch->ins[k]; j++) {
            const struct bt_tensor *o = d->chains[j].ins[k];
            if (d->chains[j].attn && o && o->type == src->type && !memcmp(o->ne, src->ne, sizeof src->ne))
                ch->ins[k] = d->chains[j].ins[k];
        }
        if (!ch->ins[k]) {
            ch->ins[k] = bt_new_tensor(d->gctx, src->type, 4, src->ne);
            if (!ch->ins[k]) return fail(d, BT_ERR_NOMEM, "rank %d: %s", d->rank, bt_context_error(d->gctx));
            bt_format_name(ch->ins[k], "%s (group)", src->name);
            ch->ins[k]->flags |= BT_TENSOR_FLAG_INPUT;
        }
        nd->src[k] = ch->ins[k];
    }
    ch->x_in = ch->ins[0]; /* (x_in set: release puts the sources back) */
    return BT_OK;
}

/* Whether x is all of o, F32, with its dimensions 1 and 2 swapped
 * ([n, T, H] over [n, H, T], or the other way). */
static bool swapped_12(const struct bt_tensor *x, const struct bt_tensor *o) {
    return x->view_src == o && x->view_offs == 0 && x->type == BT_TYPE_F32 && o->type == BT_TYPE_F32 &&
           x->ne[0] == o->ne[0] && x->ne[1] == o->ne[2] && x->ne[2] == o->ne[1] && x->nb[1] == o->nb[2] &&
           x->nb[2] == o->nb[1];
}

/* Whether attention chain a and per-head product chain p compute the same
 * heads on every rank (a's lo/hi count floats per token). */
static bool same_heads(const struct gchain *a, const struct gchain *p) {
    for (int m = 0; m < a->n_ranks; m++)
        if (a->lo[m] != p->lo[m] * a->out->ne[0] || a->hi[m] != p->hi[m] * a->out->ne[0]) return false;
    return true;
}

/* Whether nothing but node r (and views) reads t or a view of it, and
 * neither is a graph output. */
static bool read_only_by(const bt_dist *d, const struct bt_tensor *t, const struct bt_tensor *r) {
    for (int i = 0; i < d->graph->n_nodes; i++) {
        const struct bt_tensor *nd = d->graph->nodes[i];
        if ((nd == t || nd->view_src == t) && (nd->flags & BT_TENSOR_FLAG_OUTPUT)) return false;
        if (nd == r || bt_op_is_view(nd->op)) continue;
        for (int k = 0; k < BT_MAX_SRC; k++)
            if (nd->src[k] && (nd->src[k] == t || nd->src[k]->view_src == t)) return false;
    }
    return true;
}

/* Whether attention chain a's heads can stay where they are computed for
 * chain ch, the per-head product after it: ch's x is a's out with its
 * dimensions 1 and 2 swapped, every rank computes the same heads of both,
 * and nothing else reads a's out. */
static bool heads_kept(const bt_dist *d, const struct gchain *a, const struct gchain *ch) {
    return a->attn && ch->heads && swapped_12(ch->x, a->out) && same_heads(a, ch) && read_only_by(d, a->out, ch->out);
}

/* Whether per-head product hc's heads can stay where they are computed for
 * attention chain a after it: a's q is a CONCAT along dimension 0 of hc's
 * out with dimensions 1 and 2 swapped and of another tensor, every rank
 * computes the same heads of both, only the CONCAT reads hc's out and only
 * the attention q, and no chain between them takes an input of q's shape
 * (a member's input of that shape may be its copy of q). */
static bool q_kept_from(const bt_dist *d, const struct gchain *hc, const struct gchain *a) {
    const struct bt_tensor *q = a->out->src[0];
    if (!hc->heads || q->op != BT_OP_CONCAT || q->op_params[0] != 0 || q->type != BT_TYPE_F32 ||
        !bt_is_contiguous(q) || !swapped_12(q->src[0], hc->out) || !same_heads(a, hc))
        return false;
    for (const struct gchain *b = hc + 1; b < a; b++)
        if (!memcmp(b->x->ne, q->ne, sizeof q->ne)) return false;
    return read_only_by(d, hc->out, q) && read_only_by(d, q, a->out);
}

/* Whether chains g and u (in a split's order) are products divided by
 * tokens whose results only a SwiGLU reads, and chain dn the product
 * divided by tokens of that SwiGLU's result, which nothing else reads: the
 * SwiGLU of its own columns on every rank (gchain glu). */
static bool glu_between(const bt_dist *d, const struct gchain *g, const struct gchain *u, const struct gchain *dn) {
    const struct bt_tensor *n = dn->x;
    if (!g->cols || !u->cols || !dn->cols || g->split != dn->split || u->split != dn->split ||
        (n->op != BT_OP_SWIGLU && n->op != BT_OP_SWIGLU_OAI) || !bt_is_contiguous(n) || n->ne[1] != dn->T ||
        !((n->src[0] == g->out && n->src[1] == u->out) || (n->src[0] == u->out && n->src[1] == g->out)))
        return false;
    /* (the three divide the same T tokens alike: the SwiGLU's sources have its shape) */
    return read_only_by(d, g->out, n) && read_only_by(d, u->out, n) && read_only_by(d, n, dn->out);
}

/* What chain i, just found, takes from the chains before it in its split:
 * the x of the dense product before (x_kept), the heads of the attention
 * before (x_from_attn), or, an attention, the heads of a per-head product
 * before (q_kept). */
static void chain_links(bt_dist *d, int i) {
    struct gchain *ch = &d->chains[i], *pc = i > 0 && d->chains[i - 1].split == ch->split ? ch - 1 : NULL;
    ch->x_kept = pc && plain_rows(ch) && plain_rows(pc) && pc->x == ch->x;
    for (int m = 1; ch->x_kept && m < ch->n_ranks; m++) ch->x_kept = pc->hi[m] > pc->lo[m] && ch->hi[m] > ch->lo[m];
    ch->x_from_attn = pc && heads_kept(d, pc, ch);
    if (ch->x_from_attn) pc->keeps = pc->apart = true;
    if (pc && i > 1 && glu_between(d, ch - 2, pc, ch)) {
        ch->glu = true;
        ch[-2].local = pc->local = ch[-2].apart = true;
    }
    ch->q_to = -1;
    for (int h = i - 1; ch->attn && h >= 0 && d->chains[h].split == ch->split; h--)
        if (q_kept_from(d, &d->chains[h], ch)) {
            d->chains[h].q_to = i;
            ch->q_kept = ch->out->src[0]->src[0]->ne[0];
            break;
        }
}

/* The share of its result a node of the chains computes on this rank (put
 * back at release): an attention's heads (row_lo/hi), a member's columns
 * of a product divided by tokens (col_lo/hi; home's are set while it
 * computes them, compute_split; so are home's heads of the q whose other
 * heads the members keep, q_heads). */
static enum bt_status range_outs(bt_dist *d, int me) {
    for (int i = 0; i < d->n_chains; i++) {
        struct gchain *ch = &d->chains[i];
        if (!ch->attn && !(ch->cols && me > 0) && !ch->glu) continue;
        struct bt_tensor **nr = realloc(d->ranged, sizeof *nr * (size_t)(d->n_ranged + 3));
        if (!nr) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
        d->ranged = nr;
        if (ch->q_kept && me == 0) d->ranged[d->n_ranged++] = ch->out->src[0]; /* (q_heads) */
        if (ch->glu) { /* (home's: while it computes only its own columns, compute_split) */
            d->ranged[d->n_ranged++] = ch->x;
            ch->x->col_lo = me > 0 ? (int32_t)ch->lo[me] : 0;
            ch->x->col_hi = me > 0 ? (int32_t)ch->hi[me] : 0;
            if (me == 0) continue;
        }
        d->ranged[d->n_ranged++] = ch->out;
        if (ch->cols) {
            ch->out->col_lo = (int32_t)ch->lo[me];
            ch->out->col_hi = (int32_t)ch->hi[me];
            continue;
        }
        ch->out->row_lo = (int32_t)(ch->lo[me] / ch->out->ne[0]);
        ch->out->row_hi = (int32_t)(ch->hi[me] / ch->out->ne[0]);
    }
    return BT_OK;
}

/* The chains of the groups this rank is in, in the splits of each group's
 * first rank (every rank of a group finds the same, in the same order), their
 * tags after the transfers', and their slots; a member's inputs of its own. */
static enum bt_status find_chains(bt_dist *d) {
    int me = -1;
    const int g = bt_expert_group_of(d->opt.groups, d->opt.n_groups, d->rank, &me);
    if (g < 0) return BT_OK;
    const struct bt_expert_group *grp = &d->opt.groups[g];
    if (grp->tokens && !bt_group_on_cpu(&d->plan, grp)) /* (the CPU's MUL_MAT honours a node's columns) */
        return fail(d, BT_ERR_UNSUPPORTED, "expert group %d: divide: tokens needs every rank on the CPU", g);
    const int n_splits = bt_sched_get_n_splits(d->sched);
    int tag = d->opt.tag_base + d->plan.n_transfers * d->n_copies;
    for (int s = 0; s < n_splits; s++) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        if (sp->backend_id != grp->ranks[0]) continue;
        for (int j = 0; j < sp->graph.n_nodes; j++) {
            const struct bt_tensor *nd = sp->graph.nodes[j];
            const bool rows = grp->dense && row_divisible(d, nd, grp->n_ranks);
            const bool attn = grp->dense && attn_divisible(d, nd, grp);
            const bool heads = nd->op == BT_OP_MUL_MAT && bt_head_divisible(&d->plan, grp, d->graph, nd->src[0]) &&
                               !weight_sent(d, nd->src[0]);
            if (!rows && !attn && !heads && (nd->op != BT_OP_MUL_MAT_ID || !is_experts(nd->src[0]))) continue;
            struct gchain *nc = realloc(d->chains, sizeof *nc * (size_t)(d->n_chains + 1));
            if (!nc) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
            d->chains = nc;
            struct gchain *ch = &d->chains[d->n_chains++];
            memset(ch, 0, sizeof *ch);
            ch->group = g;
            ch->home = grp->ranks[0];
            ch->split = s;
            ch->n_ranks = grp->n_ranks;
            ch->me = me;
            memcpy(ch->ranks, grp->ranks, sizeof ch->ranks);
            if (attn) {
                attn_chain_at(ch, &sp->graph, j);
            } else if (heads) {
                heads_chain_at(ch, &sp->graph, j);
            } else if (rows) {
                row_chain_at(ch, &sp->graph, j, grp->tokens);
            } else {
                chain_at(d, ch, &sp->graph, j);
                enum bt_status st = chain_check(d, ch);
                if (st != BT_OK) return st;
                ch->K = ch->ids->ne[0];
                ch->T = ch->ids->ne[1];
                ch->d_x = ch->x->ne[0];
                ch->d_out = ch->out->ne[0];
                ch->overlap = grp->overlap;
                for (int m = 0; m < ch->n_ranks; m++) {
                    bt_expert_share(ch->n_expert, ch->n_ranks, m, &ch->lo[m], &ch->hi[m]);
                    bt_expert_hold(ch->n_expert, ch->n_ranks, m, ch->overlap, &ch->hold_lo[m], &ch->hold_hi[m]);
                }
                if (me == 0 && ch->overlap > 0 && !(ch->counts = calloc((size_t)ch->n_expert + 1, sizeof *ch->counts)))
                    return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
                for (int k = 0; k < ch->n_w; k++) ch->expert_bytes += ch->w[k]->nb[2];
            }
            for (int c = 0; c < MAXC; c++) ch->done_k[c] = ch->divided_k[c] = ch->told_k[c] = -1;
            chain_links(d, d->n_chains - 1);
            ch->tag0 = tag;
            tag += 3 * d->n_copies;
            if (tag - 1 > BT_TRANSPORT_MAX_USER_TAG)
                return fail(d, BT_ERR_CAPACITY, "the expert groups' transfers need tags past the transport's %d",
                            BT_TRANSPORT_MAX_USER_TAG + 1);
            d->n_chain_home += me == 0;
            j = ch->last;
        }
    }
    /* the ids of each chain and slot; the rows, one set for all chains:
     * home's per member, a member's own (sized only, to measure) */
    size_t xb = 0, ob = 0;
    for (int i = 0; i < d->n_chains; i++) {
        struct gchain *ch = &d->chains[i];
        ch->slots = calloc((size_t)(d->n_copies * ch->n_ranks), sizeof *ch->slots);
        if (!ch->slots) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
        const size_t ib = ch->rows ? 0 : ids_bytes(ch);
        if (sizeof(float) * (size_t)(ch->T * ch->d_x) > xb) xb = sizeof(float) * (size_t)(ch->T * ch->d_x);
        for (int m = 1; ch->attn && m < ch->n_ranks; m++) {
            const size_t pb = attn_pack(ch, m, NULL, false);
            if (pb > xb) xb = pb;
        }
        if (sizeof(float) * (size_t)(ch->K * ch->T * ch->d_out) > ob) ob = sizeof(float) * (size_t)(ch->K * ch->T * ch->d_out);
        for (int c = 0; c < d->n_copies && ib > 0; c++) {
            d->chain_bytes += (int64_t)ib;
            if (d->measure_only) continue;
            ch->slots[c * ch->n_ranks].ids = malloc(ib);
            if (!ch->slots[c * ch->n_ranks].ids) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
        }
    }
    if (d->n_chains == 0) return BT_OK;
    enum bt_status st = range_outs(d, me);
    if (st != BT_OK) return st;
    d->n_gbufs = me == 0 ? grp->n_ranks : 1;
    d->chain_bytes += (int64_t)(me == 0 ? grp->n_ranks - 1 : 1) * (int64_t)(xb + ob);
    d->gbufs = calloc((size_t)d->n_gbufs, sizeof *d->gbufs);
    if (!d->gbufs) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    for (int m = me == 0 ? 1 : 0; m < d->n_gbufs && !d->measure_only; m++) {
        d->gbufs[m].x = malloc(xb);
        d->gbufs[m].o = malloc(ob);
        if (!d->gbufs[m].x || !d->gbufs[m].o) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    }
    if (me == 0) return BT_OK;
    d->gctx = bt_init((struct bt_init_params){(size_t)((BT_MAX_SRC + 2) * d->n_chains + 1) * bt_tensor_overhead() + 1024,
                                              NULL, true});
    if (!d->gctx) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    for (int i = 0; i < d->n_chains; i++) {
        struct gchain *ch = &d->chains[i];
        if (ch->attn) {
            if ((st = attn_inputs(d, i)) != BT_OK) return st;
            continue;
        }
        /* a dense product's input as home's (any shape, contiguous): one
         * tensor for all the products of that shape (a member computes one
         * product at a time, and its input is set just before); the heads
         * of the attention before (x_from_attn): a tensor of its own, which
         * member_outs makes that attention's result with dimensions 1 and 2
         * swapped */
        ch->x_in = NULL;
        for (int j = 0; j < i && ch->rows && !ch->x_from_attn; j++)
            if (d->chains[j].rows && !d->chains[j].x_from_attn &&
                !memcmp(d->chains[j].x_in->ne, ch->x->ne, sizeof ch->x->ne))
                ch->x_in = d->chains[j].x_in;
        if (!ch->x_in) {
            ch->x_in = ch->rows ? bt_new_tensor(d->gctx, BT_TYPE_F32, 4, ch->x->ne)
                                : bt_new_tensor_3d(d->gctx, BT_TYPE_F32, ch->d_x, 1, ch->T);
            if (ch->x_in) bt_format_name(ch->x_in, "%s (group)", ch->x->name);
        }
        ch->ids_in = ch->rows ? NULL : bt_new_tensor_2d(d->gctx, BT_TYPE_I32, ch->K, ch->T);
        if (!ch->x_in || (!ch->rows && !ch->ids_in))
            return fail(d, BT_ERR_NOMEM, "rank %d: %s", d->rank, bt_context_error(d->gctx));
        ch->x_in->flags |= BT_TENSOR_FLAG_INPUT;
        if (ch->ids_in) {
            bt_format_name(ch->ids_in, "%s (group)", ch->ids->name);
            ch->ids_in->flags |= BT_TENSOR_FLAG_INPUT;
        }
        for (int n = 0; n < ch->n_nodes; n++)
            for (int k = 0; k < BT_MAX_SRC; k++) {
                struct bt_tensor *src = ch->nodes[n]->src[k];
                ch->was[n][k] = src;
                if (src == ch->x) ch->nodes[n]->src[k] = ch->x_in;
                if (src == ch->ids && ch->ids_in) ch->nodes[n]->src[k] = ch->ids_in;
            }
    }
    return BT_OK;
}

/* Whether weight t is divided in a chain this rank takes part in, and the
 * share this rank holds: experts [lo, hi), or with *rows rows [lo, hi). */
static bool held_share(const bt_dist *d, const struct bt_tensor *t, int64_t *lo, int64_t *hi, bool *rows) {
    for (int i = 0; i < d->n_chains; i++) {
        const struct gchain *ch = &d->chains[i];
        for (int k = 0; k < ch->n_w; k++)
            if (ch->w[k] == t) {
                *lo = ch->whole ? 0 : ch->rows ? ch->lo[ch->me] : ch->hold_lo[ch->me];
                *hi = ch->whole ? t->ne[1] : ch->rows ? ch->hi[ch->me] : ch->hold_hi[ch->me];
                *rows = ch->rows && !ch->heads; /* a per-head product's: matrices, as experts */
                return true;
            }
        for (int k = 0; k < ch->n_rep; k++)
            if (ch->rep[k] == t) { /* the experts' biases: whole, [n, E] as one matrix */
                *lo = 0;
                *hi = t->ne[2];
                *rows = false;
                return true;
            }
    }
    return false;
}

/* Whether node i of the graph is in a chain this rank computes as a member. */
static bool member_node(const bt_dist *d, const struct bt_tensor *t) {
    for (int i = 0; i < d->n_chains; i++)
        if (d->chains[i].me > 0 && in_chain(&d->chains[i], t)) return true;
    return false;
}

/* The memory of a member's chain results: the largest of those with memory
 * apart (gchain apart), or of the others. */
static size_t member_out_part(const bt_dist *d, bt_buffer_type_t buft, bool apart) {
    size_t n = 0;
    for (int i = 0; i < d->n_chains; i++) {
        const size_t b = d->chains[i].me > 0 && d->chains[i].apart == apart
                             ? bt_buft_get_alloc_size(buft, d->chains[i].out) : 0;
        if (b > n) n = b;
    }
    return n;
}

/* Where the results with memory apart begin in member_outs' memory: after
 * the others', aligned. */
static size_t member_apart_at(const bt_dist *d, bt_buffer_type_t buft) {
    const size_t a = bt_buft_get_alignment(buft);
    return (member_out_part(d, buft, false) + a - 1) / a * a;
}

static size_t member_out_bytes(const bt_dist *d, bt_buffer_type_t buft) {
    return member_apart_at(d, buft) + member_out_part(d, buft, true);
}

/* Contiguous strides for t's shape and type. */
static void contiguous_strides(struct bt_tensor *t) {
    t->nb[1] = bt_row_size(t->type, t->ne[0]);
    for (int i = 2; i < BT_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

/* A member's chain results share one piece of memory: it computes one chain
 * at a time and sends its rows before the next (left to the graph
 * allocator, results that nothing on the member reads would each keep
 * their own).  The results read after the next chain's is computed (apart:
 * an attention's that keeps its heads, whose product's input x_in is that
 * result with dimensions 1 and 2 swapped; the first of the two products
 * before a SwiGLU on every rank) share a second piece after it.  Each
 * result gets data (in buffer b, of member_out_bytes; NULL, NULL: none, and
 * what alias_member_outs changed put back). */
static void member_outs(bt_dist *d, bt_buffer_t b, void *data) {
    uint8_t *apart = b ? (uint8_t *)data + member_apart_at(d, bt_buffer_get_type(b)) : (uint8_t *)data;
    for (int i = 0; i < d->n_chains; i++) {
        struct gchain *ch = &d->chains[i];
        struct bt_tensor *out = ch->out;
        if (ch->me <= 0) continue;
        out->buffer = NULL;
        out->data = data;
        if (!data && ch->q_to >= 0) contiguous_strides(out);
        if (!data && ch->glu) ch->x->buffer = NULL, ch->x->data = NULL; /* (alias_member_outs) */
        if (b) {
            out->data = NULL;
            bt_tensor_alloc(b, out, ch->apart ? apart : data);
        }
        if (!ch->keeps) continue;
        struct bt_tensor *x = ch[1].x_in; /* (a member's own tensor: find_chains) */
        x->buffer = out->buffer;
        x->data = out->data;
        x->nb[1] = out->nb[2];
        x->nb[2] = out->nb[1];
    }
}

/* A member's per-head products whose heads an attention after it keeps
 * (q_to): each computes them in place into the first part of each row of
 * the member's copy of that attention's q (its out that part with
 * dimensions 1 and 2 swapped), once that copy has memory; and the SwiGLU
 * a member computes its columns of (glu) into the input of the product
 * after it. */
static void alias_member_outs(bt_dist *d) {
    for (int i = 0; i < d->n_chains; i++) {
        struct gchain *ch = &d->chains[i];
        if (ch->me > 0 && ch->glu) ch->x->buffer = ch->x_in->buffer, ch->x->data = ch->x_in->data;
        if (ch->me <= 0 || ch->q_to < 0) continue;
        const struct bt_tensor *q = d->chains[ch->q_to].ins[0];
        if (!in_host_memory(q)) continue;
        ch->out->buffer = q->buffer;
        ch->out->data = q->data;
        ch->out->nb[1] = q->nb[2];
        ch->out->nb[2] = q->nb[1];
    }
}

static void release_chains(bt_dist *d) {
    bt_transport *t = d->t;
    for (int i = 0; i < d->n_chains; i++) {
        struct gchain *ch = &d->chains[i];
        for (int c = 0; ch->slots && c < d->n_copies; c++)
            for (int m = 0; m < ch->n_ranks; m++) {
                struct gslot *sl = &ch->slots[c * ch->n_ranks + m];
                /* a member's receive of the ids ahead is cancelled; sends complete */
                if (sl->ids_req.active && ch->me > 0 && t->iface.cancel) t->iface.cancel(t, &sl->ids_req);
                if (sl->ids_req.active) bt_transport_wait(t, &sl->ids_req);
                free(sl->ids);
            }
        free(ch->slots);
        free(ch->counts);
        if (ch->x_in)
            for (int n = 0; n < ch->n_nodes; n++)
                for (int k = 0; k < BT_MAX_SRC; k++) ch->nodes[n]->src[k] = ch->was[n][k];
    }
    for (int m = 0; m < d->n_gbufs; m++) {
        struct gbuf *b = &d->gbufs[m];
        if (b->x_req.active) bt_transport_wait(t, &b->x_req);
        if (b->o_req.active) bt_transport_wait(t, &b->o_req);
        free(b->x);
        free(b->o);
    }
    free(d->gbufs);
    d->gbufs = NULL;
    d->n_gbufs = 0;
    free(d->chains);
    d->chains = NULL;
    d->n_chains = d->n_chain_home = 0;
    for (int i = 0; i < d->n_ranged; i++) {
        struct bt_tensor *t = d->ranged[i];
        t->expert_lo = t->expert_hi = t->row_lo = t->row_hi = t->col_lo = t->col_hi = 0;
    }
    free(d->ranged);
    d->ranged = NULL;
    d->n_ranged = 0;
    d->chain_bytes = 0;
    if (d->gctx) bt_free(d->gctx);
    d->gctx = NULL;
}

/* The plan's transfers on this rank's graph (where each slot lands), and
 * rank 0's outputs computed on rank 0 itself. */
static enum bt_status take_transfers(bt_dist *d) {
    const struct bt_plan *p = &d->plan;
    if (p->n_transfers > 0 &&
        ((int64_t)d->opt.tag_base + (int64_t)p->n_transfers * d->n_copies - 1 > BT_TRANSPORT_MAX_USER_TAG))
        return fail(d, BT_ERR_CAPACITY, "%d transfers x %d slots from tag %d exceed the transport's %d tags",
                    p->n_transfers, d->n_copies, d->opt.tag_base, BT_TRANSPORT_MAX_USER_TAG + 1);
    d->xfers = calloc((size_t)p->n_transfers + 1, sizeof *d->xfers);
    if (!d->xfers) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    for (int x = 0; x < p->n_transfers; x++) {
        const struct bt_plan_transfer *pt = &p->transfers[x];
        struct xfer *xf = &d->xfers[x];
        xf->tensor = bt_plan_tensor(d->graph, pt->tensor);
        xf->src = pt->src;
        xf->dst = pt->dst;
        xf->producer = pt->producer;
        xf->consumer = pt->consumer;
        xf->bytes = (size_t)pt->bytes;
        xf->tag0 = d->opt.tag_base + pt->tag0;
        xf->direct = pt->direct != 0;
        if (xf->bytes != bt_nbytes(xf->tensor))
            return fail(d, BT_ERR_MISMATCH, "rank %d: tensor '%s' has %zu bytes, the plan %zu", d->rank,
                        xf->tensor->name, bt_nbytes(xf->tensor), xf->bytes);
        if (xf->consumer >= 0)
            for (int c = 0; c < d->n_copies; c++) {
                xf->copies[c] = bt_sched_get_tensor_copy(d->sched, xf->tensor, xf->dst, c);
                if (!xf->copies[c])
                    return fail(d, BT_ERR_MISMATCH, "rank %d: no copy of '%s' for rank %d: not the plan's graph",
                                d->rank, xf->tensor->name, xf->dst);
            }
    }
    d->n_xfers = p->n_transfers;
    d->lins = calloc((size_t)p->n_inputs + 1, sizeof *d->lins);
    if (!d->lins) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    for (int i = 0; i < p->n_inputs; i++) {
        if (p->inputs[i].rank != d->rank) continue;
        struct local_input *li = &d->lins[d->n_lins++];
        li->tensor = bt_plan_tensor(d->graph, p->inputs[i].tensor);
        for (int c = 0; c < d->n_copies; c++) {
            li->copies[c] = bt_sched_get_tensor_copy(d->sched, li->tensor, d->rank, c);
            li->set_k[c] = -1;
            if (!li->copies[c])
                return fail(d, BT_ERR_MISMATCH, "rank %d: no copy of input '%s': not the plan's graph", d->rank,
                            li->tensor->name);
        }
    }
    for (int i = 0; d->rank == 0 && i < d->graph->n_nodes; i++) {
        struct bt_tensor *t = d->graph->nodes[i];
        if (!(t->flags & BT_TENSOR_FLAG_OUTPUT) || p->node_owner[i] != 0) continue;
        struct local_output *nl = realloc(d->louts, sizeof *nl * (size_t)(d->n_louts + 1));
        if (!nl) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
        d->louts = nl;
        int split = -1;
        for (int s = 0; s < p->n_splits; s++)
            if (i >= p->splits[s].i_start && i < p->splits[s].i_end) split = s;
        d->louts[d->n_louts++] = (struct local_output){t, split, bt_nbytes(t), {0}};
    }
    const enum bt_status st = find_routed(d);
    return st == BT_OK ? find_chains(d) : st;
}

/* The device transport's edges, from the plan (every rank that has one opens
 * them all, in one order). */
static enum bt_status open_device_edges(bt_dist *d) {
    bt_transport *dt = d->opt.device_transport;
    if (!dt) return BT_OK;
    int *esrc = malloc(sizeof(int) * (size_t)(d->n_xfers + 1)), *edst = malloc(sizeof(int) * (size_t)(d->n_xfers + 1));
    enum bt_status st = esrc && edst ? BT_OK : fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    int n_edges = 0;
    for (int x = 0; st == BT_OK && x < d->n_xfers; x++) {
        const struct xfer *xf = &d->xfers[x];
        if (!xf->direct) continue;
        bool seen = false;
        for (int e = 0; e < n_edges && !seen; e++) seen = esrc[e] == xf->src && edst[e] == xf->dst;
        if (!seen) {
            esrc[n_edges] = xf->src;
            edst[n_edges++] = xf->dst;
        }
    }
    if (st == BT_OK && bt_transport_connect(dt, esrc, edst, n_edges) != BT_OK)
        st = fail(d, BT_ERR_COMM, "rank %d: %s transport: %s", d->rank, dt->iface.name(dt), dt->error);
    free(esrc);
    free(edst);
    return st;
}

/* A tensor this rank computes and sends from its own memory: on a host
 * backend, or over the device transport (backend memory to backend memory). */
static bool sent_in_place(const struct xfer *xf, int rank, bool host_backend) {
    return xf->src == rank && xf->producer >= 0 && (host_backend || xf->direct);
}

/* The next slot of n bytes at *off in a host buffer at base (NULL while
 * sizing: then only *off moves). */
static void *take_slot(uint8_t *base, size_t *off, size_t n, size_t align) {
    void *p = base ? base + *off : NULL;
    *off += ((n ? n : 1) + align - 1) / align * align;
    return p;
}

/* ---- this rank's memory: every allocation of the plan is sized first and
 * checked against the rank's memory (check_memory) before any is made ---- */

/* The slots of one buffer of host memory (base NULL: only count): send slots,
 * receive staging and output rings.  A computed tensor in host memory, or one
 * that goes over the device transport, is sent from where it lies (its
 * producer waits for the send before computing it again); leafs, which the
 * user rewrites between submits, and device tensors for a host transport go
 * through send slots.  A device backend receives a host transport's data into
 * staging slots and uploads it after the wait.  Returns the buffer's bytes;
 * *stat_bytes: the slot bytes the statistics report. */
static size_t layout_slots(bt_dist *d, uint8_t *base, size_t halign, int64_t *stat_bytes) {
    const bool host_backend = bt_buft_is_host(bt_backend_get_default_buffer_type(d->backend));
    size_t off = 0;
    int64_t slot_bytes = 0;
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        xf->zero_copy = sent_in_place(xf, d->rank, host_backend);
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
    *stat_bytes = slot_bytes;
    return off;
}

/* A buffer type that only counts: the compute buffer is measured with it
 * (bt_gallocr_reserve sizes its buffer and places nothing), so that its size
 * is known before any memory is taken. */
struct measure_buft {
    struct bt_buffer_type buft;
    bt_buffer_type_t real;
};
static void measure_free(bt_buffer_t b) { free(b); }
static void *measure_base(bt_buffer_t b) {
    (void)b;
    return NULL;
}
static const char *measure_name(bt_buffer_type_t t) { return bt_buft_name(((struct measure_buft *)t->context)->real); }
static bt_buffer_t measure_alloc(bt_buffer_type_t t, size_t size) {
    bt_buffer_t b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->iface = (struct bt_buffer_i){
        /* .free_buffer   = */ measure_free,
        /* .get_base      = */ measure_base,
        /* .init_tensor   = */ NULL,
        /* .memset_tensor = */ NULL,
        /* .set_tensor    = */ NULL,
        /* .get_tensor    = */ NULL,
        /* .cpy_tensor    = */ NULL,
        /* .clear         = */ NULL,
    };
    b->buft = t;
    b->size = size;
    return b;
}
static size_t measure_alignment(bt_buffer_type_t t) { return bt_buft_get_alignment(((struct measure_buft *)t->context)->real); }
static size_t measure_max_size(bt_buffer_type_t t) { return bt_buft_get_max_size(((struct measure_buft *)t->context)->real); }
static size_t measure_alloc_size(bt_buffer_type_t t, const struct bt_tensor *x) {
    return bt_buft_get_alloc_size(((struct measure_buft *)t->context)->real, x);
}
static bool measure_is_host(bt_buffer_type_t t) { return bt_buft_is_host(((struct measure_buft *)t->context)->real); }

/* The compute buffer d->local needs, before the weights have memory: while
 * measuring, this rank's weights are marked as having data (the allocator
 * leaves such tensors alone, as it will once they are allocated). */
static enum bt_status measure_compute(bt_dist *d, bt_buffer_type_t buft, size_t *bytes) {
    static uint8_t mark; /* never read or written through */
    struct bt_graph *g = d->graph;
    struct measure_buft m = {.real = buft};
    m.buft.iface = (struct bt_buffer_type_i){
        /* .get_name       = */ measure_name,
        /* .alloc_buffer   = */ measure_alloc,
        /* .get_alignment  = */ measure_alignment,
        /* .get_max_size   = */ measure_max_size,
        /* .get_alloc_size = */ measure_alloc_size,
        /* .is_host        = */ measure_is_host,
    };
    m.buft.context = &m;
    for (int i = 0; i < g->n_leafs; i++)
        if (my_weight(d, i)) g->leafs[i]->data = &mark;
    member_outs(d, NULL, &mark); /* apart (allocate_local) */
    bt_gallocr_t meas = bt_gallocr_new(&m.buft);
    enum bt_status st = BT_OK;
    if (!meas) st = fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    else if (!bt_gallocr_reserve(meas, &d->local)) st = fail(d, BT_ERR_NOMEM, "rank %d: %s", d->rank, bt_gallocr_error(meas));
    else *bytes = bt_gallocr_get_buffer_size(meas, 0);
    bt_gallocr_free(meas);
    for (int i = 0; i < g->n_leafs; i++)
        if (g->leafs[i]->data == &mark) g->leafs[i]->data = NULL;
    member_outs(d, NULL, NULL);
    return st;
}

/* Everything the plan will allocate on this rank against its memory. */
static enum bt_status check_memory(bt_dist *d, size_t weights, size_t compute, size_t slots) {
    const double need = (double)weights + (double)compute + (double)slots, mib = 1048576.0;
    if (d->mem_bytes <= 0 || need <= (double)d->mem_bytes) return BT_OK;
    return fail(d, BT_ERR_NOMEM,
                "rank %d (%s): the plan needs %.1f MiB (weights %.1f, compute %.1f, transfer slots %.1f) but the rank "
                "has %.1f MiB (%s)",
                d->rank, bt_backend_name(d->backend), need / mib, (double)weights / mib, (double)compute / mib,
                (double)slots / mib, (double)d->mem_bytes / mib,
                d->mem_what);
}

/* The bytes a weight takes on this rank: all of it, or of a group's, the
 * experts or rows held (and the buffer type's padding). */
static size_t held_bytes(bt_buffer_type_t buft, const struct bt_tensor *t) {
    const size_t all = bt_buft_get_alloc_size(buft, t);
    if (t->row_hi > 0) return (size_t)(t->row_hi - t->row_lo) * t->nb[1] + (all - bt_nbytes(t));
    if (t->expert_hi == 0) return all;
    return (size_t)(t->expert_hi - t->expert_lo) * t->nb[2] + (all - bt_nbytes(t));
}

/* the local graph: my splits' nodes, my leafs but weights, my receive slots */
static enum bt_status build_local_graph(bt_dist *d) {
    struct bt_graph *g = d->graph;
    for (int i = 0; i < d->n_lins; i++)
        for (int c = 0; c < d->n_copies; c++) d->lins[i].copies[c]->flags |= BT_TENSOR_FLAG_INPUT | BT_TENSOR_FLAG_OUTPUT;
    const int cap = g->n_nodes + g->n_leafs + (d->n_xfers + d->n_lins) * d->n_copies + (BT_MAX_SRC + 2) * d->n_chains + 8;
    d->local.nodes = malloc(sizeof(struct bt_tensor *) * (size_t)cap);
    d->local.leafs = malloc(sizeof(struct bt_tensor *) * (size_t)cap);
    if (!d->local.nodes || !d->local.leafs) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    d->local.size = cap;
    d->local.ctx = g->ctx;
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst != d->rank || xf->consumer < 0) continue;
        for (int c = 0; c < d->n_copies; c++) d->local.leafs[d->local.n_leafs++] = xf->copies[c];
    }
    for (int i = 0; i < d->n_lins; i++)
        for (int c = 0; c < d->n_copies; c++) d->local.leafs[d->local.n_leafs++] = d->lins[i].copies[c];
    for (int i = 0; i < g->n_leafs; i++)
        if (d->plan.leaf_owner[i] == d->rank && !g->leafs[i]->data && !bt_tensor_is_weight(g->leafs[i]))
            d->local.leafs[d->local.n_leafs++] = g->leafs[i];
    /* a member's chains: their inputs, and their nodes where they fall */
    for (int i = 0; i < d->n_chains; i++) {
        const struct gchain *ch = &d->chains[i];
        if (!ch->x_in) continue;
        bool seen = false; /* a shared input, once */
        for (int j = 0; j < i; j++) seen |= d->chains[j].x_in == ch->x_in;
        if (!seen) d->local.leafs[d->local.n_leafs++] = ch->x_in;
        if (ch->ids_in) d->local.leafs[d->local.n_leafs++] = ch->ids_in;
        for (int k = 1; k < BT_MAX_SRC; k++) {
            seen = !ch->ins[k];
            for (int j = 0; j < i && !seen; j++) seen = d->chains[j].ins[k] == ch->ins[k];
            if (!seen) d->local.leafs[d->local.n_leafs++] = ch->ins[k];
        }
    }
    int n_mine = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (d->plan.node_owner[i] != d->rank && !(d->n_chains > 0 && member_node(d, g->nodes[i]))) continue;
        d->local.nodes[d->local.n_nodes++] = g->nodes[i];
        if (!bt_op_is_view(g->nodes[i]->op)) n_mine++;
    }
    d->stats.n_nodes = n_mine;
    return BT_OK;
}

/* Does a transfer send weight t (or a view of it) from this rank?  Such a
 * weight keeps the layout every backend reads (the default buffer type). */
static bool weight_sent(const bt_dist *d, const struct bt_tensor *t) {
    for (int x = 0; x < d->n_xfers; x++) {
        const struct xfer *xf = &d->xfers[x];
        if (xf->src == d->rank && (xf->tensor == t || xf->tensor->view_src == t)) return true;
    }
    return false;
}

/* Which buffer type this rank's weight t goes into: opt.weight_buft for a
 * weight no other rank reads, else the backend's default (buft). */
static bt_buffer_type_t weight_buft_of(const bt_dist *d, bt_buffer_type_t buft, const struct bt_tensor *t) {
    return d->opt.weight_buft && !weight_sent(d, t) ? d->opt.weight_buft : buft;
}

/* this rank's weights for the split into buffers: whether leaf i is one */
static bool my_weight(const bt_dist *d, int i) {
    const struct bt_tensor *t = d->graph->leafs[i];
    int64_t lo, hi;
    bool rows;
    return (d->plan.leaf_owner[i] == d->rank || held_share(d, t, &lo, &hi, &rows)) && !t->data &&
           bt_tensor_is_weight(t);
}

/* the weights' buffer of wbytes of buft (own: of opt.weight_buft), each of
 * its weights placed (of an expert group's, the experts held) and filled by
 * init */
static enum bt_status alloc_weights(bt_dist *d, bt_buffer_type_t buft, bool own, size_t wbytes,
                                   bt_dist_weight_init_fn init, void *user) {
    struct bt_graph *g = d->graph;
    const bt_buffer_type_t def = bt_backend_get_default_buffer_type(d->backend);
    const size_t align = bt_buft_get_alignment(buft);
    if (wbytes > 0) {
        bt_buffer_t b = bt_buft_alloc_buffer(buft, wbytes);
        if (!b)
            return fail(d, BT_ERR_NOMEM, "rank %d: cannot allocate %.1f MiB for its weights on %s", d->rank,
                        (double)wbytes / 1048576.0, bt_backend_name(d->backend));
        *(own ? &d->weight_buf_own : &d->weight_buf) = b;
        bt_buffer_set_usage(b, BT_BUFFER_USAGE_WEIGHTS);
        uint8_t *p = bt_buffer_get_base(b);
        for (int i = 0; i < g->n_leafs; i++) {
            struct bt_tensor *t = g->leafs[i];
            int64_t lo, hi;
            bool rows = false;
            const bool share = held_share(d, t, &lo, &hi, &rows);
            if (!my_weight(d, i) || (weight_buft_of(d, def, t) != def) != own) continue;
            if (share) {
                /* data addresses expert 0 (row 0); only [lo, hi) is there */
                t->buffer = b;
                t->data = p - (size_t)lo * t->nb[rows ? 1 : 2];
            } else {
                bt_tensor_alloc(b, t, p);
            }
            p += (held_bytes(buft, t) + align - 1) / align * align;
            if (init) init(t, user);
        }
    }
    return BT_OK;
}

static enum bt_status allocate_local(bt_dist *d, bt_dist_weight_init_fn init, void *user) {
    struct bt_graph *g = d->graph;
    bt_buffer_type_t buft = bt_backend_get_default_buffer_type(d->backend);
    /* weights: sized here, allocated after the check; of an expert group's
     * weights, the experts this rank holds */
    size_t wbytes_def = 0, wbytes_own = 0;
    int n_w = 0;
    for (int i = 0; i < g->n_leafs; i++) {
        struct bt_tensor *t = g->leafs[i];
        int64_t lo = 0, hi = 0;
        bool rows = false;
        const bool share = held_share(d, t, &lo, &hi, &rows);
        int32_t *rlo = rows ? &t->row_lo : &t->expert_lo, *rhi = rows ? &t->row_hi : &t->expert_hi;
        if (share && *rhi == 0) {
            struct bt_tensor **nr = realloc(d->ranged, sizeof *nr * (size_t)(d->n_ranged + 1));
            if (!nr) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
            d->ranged = nr;
            d->ranged[d->n_ranged++] = t;
            *rlo = (int32_t)lo;
            *rhi = (int32_t)hi;
        } else if (share && (*rlo != lo || *rhi != hi)) {
            return fail(d, BT_ERR_MISMATCH, "rank %d: '%s' holds %s [%d, %d), this plan's group gives it [%lld, %lld)",
                        d->rank, t->name, rows ? "rows" : "experts", *rlo, *rhi, (long long)lo, (long long)hi);
        }
        if ((d->plan.leaf_owner[i] != d->rank && !share) || t->data || !bt_tensor_is_weight(t)) continue;
        const bt_buffer_type_t wb = weight_buft_of(d, buft, t);
        const size_t wa = bt_buft_get_alignment(wb);
        *(wb == buft ? &wbytes_def : &wbytes_own) += (held_bytes(wb, t) + wa - 1) / wa * wa;
        n_w++;
    }

    /* slots keep their memory; tensors sent away are not reused before sent.
     * A tensor sent from its own memory (zero copy) may still be in flight
     * while the next micro-batch computes this rank's earlier ops: it must
     * share its memory with no other tensor (INPUT as well as OUTPUT: the
     * allocator places it before any node, and never frees it), or those ops
     * overwrite what its receiver has not yet taken. */
    const bool host_backend = bt_buft_is_host(buft);
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst == d->rank && xf->consumer >= 0)
            for (int c = 0; c < d->n_copies; c++) xf->copies[c]->flags |= BT_TENSOR_FLAG_INPUT | BT_TENSOR_FLAG_OUTPUT;
        if (xf->src == d->rank && !bt_tensor_is_weight(xf->tensor->view_src ? xf->tensor->view_src : xf->tensor)) {
            /* (a weight has memory of its own, which nothing computed reuses) */
            struct bt_tensor *base = xf->tensor->view_src ? xf->tensor->view_src : xf->tensor;
            const int32_t want = BT_TENSOR_FLAG_OUTPUT | (sent_in_place(xf, d->rank, host_backend) ? BT_TENSOR_FLAG_INPUT : 0);
            if ((base->flags & want) != want) {
                struct flag_change *nf =
                    realloc(d->flag_changes, sizeof *nf * (size_t)(d->n_flag_changes + 1));
                if (!nf) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
                d->flag_changes = nf;
                d->flag_changes[d->n_flag_changes++] = (struct flag_change){base, base->flags};
                base->flags |= want;
            }
        }
    }

    const size_t wbytes = wbytes_def + wbytes_own;
    enum bt_status st = build_local_graph(d);
    if (st != BT_OK) return st;

    /* the sizes of the compute buffer and of the slots, then the check */
    bt_buffer_type_t hbuft = bt_backend_get_host_buffer_type(d->backend);
    size_t halign = bt_buft_get_alignment(hbuft);
    if (halign < BT_MEM_ALIGN) halign = BT_MEM_ALIGN;
    int64_t slot_bytes = 0;
    const size_t host_bytes = layout_slots(d, NULL, halign, &slot_bytes);
    size_t compute_bytes = 0;
    st = measure_compute(d, buft, &compute_bytes);
    const size_t gout_bytes = member_out_bytes(d, buft);
    compute_bytes += gout_bytes;
    if (st == BT_OK && d->measure_only) {
        d->stats.weight_bytes = (int64_t)wbytes;
        d->stats.compute_bytes = (int64_t)compute_bytes;
        d->stats.slot_bytes = (int64_t)host_bytes + d->chain_bytes;
        d->stats.peak_bytes = d->stats.weight_bytes + d->stats.compute_bytes + d->stats.slot_bytes;
        return BT_OK;
    }
    if (st == BT_OK) st = check_memory(d, wbytes, compute_bytes, host_bytes + (size_t)d->chain_bytes);
    if (st != BT_OK) return st;

    if ((st = alloc_weights(d, buft, false, wbytes_def, init, user)) != BT_OK) return st;
    if (wbytes_own > 0 && (st = alloc_weights(d, d->opt.weight_buft, true, wbytes_own, init, user)) != BT_OK)
        return st;
    d->stats.weight_bytes = (int64_t)wbytes;
    d->stats.n_weights = n_w;

    /* compute: a member's chain results, then the rest */
    if (gout_bytes > 0) {
        d->gout_buf = bt_buft_alloc_buffer(buft, gout_bytes);
        if (!d->gout_buf)
            return fail(d, BT_ERR_NOMEM, "rank %d: cannot allocate %.1f MiB for its groups' results on %s", d->rank,
                        (double)gout_bytes / 1048576.0, bt_backend_name(d->backend));
        member_outs(d, d->gout_buf, bt_buffer_get_base(d->gout_buf));
    }
    d->galloc = bt_gallocr_new(buft);
    if (!d->galloc) return fail(d, BT_ERR_NOMEM, "rank %d: out of memory", d->rank);
    if (!bt_gallocr_reserve(d->galloc, &d->local) || !bt_gallocr_alloc_graph(d->galloc, &d->local))
        return fail(d, BT_ERR_NOMEM, "rank %d: %s", d->rank, bt_gallocr_error(d->galloc));
    alias_member_outs(d);
    d->stats.compute_bytes = (int64_t)(bt_gallocr_get_buffer_size(d->galloc, 0) + gout_bytes);

    /* slots: one buffer of the backend's host memory (pinned for a GPU, so
     * its copies are fast) */
    if (host_bytes > 0) {
        d->host_buf = bt_buft_alloc_buffer(hbuft, host_bytes);
        if (!d->host_buf)
            return fail(d, BT_ERR_NOMEM, "rank %d: cannot allocate %.1f MiB of %s memory for transfer slots", d->rank,
                        (double)host_bytes / 1048576.0, bt_buft_name(hbuft));
        layout_slots(d, bt_buffer_get_base(d->host_buf), halign, &slot_bytes);
    }
    d->stats.slot_bytes = slot_bytes + d->chain_bytes;
    d->stats.peak_bytes = d->stats.weight_bytes + d->stats.compute_bytes + d->stats.slot_bytes;
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

/* Every rank's description and supported nodes to rank 0 (descs and support
 * allocated there, freed by the caller).  Every rank learns of a failure
 * before the gathers, so none is left waiting in them. */
static enum bt_status describe_and_gather(bt_dist *d, struct bt_rank_desc **descs, uint8_t **support) {
    const int P = d->size, N = d->graph->n_nodes;
    struct bt_rank_desc mine;
    memset(&mine, 0, sizeof mine);
    snprintf(mine.backend, sizeof mine.backend, "%s", bt_backend_name(d->backend));
    mine.device = d->opt.device_transport != NULL;
    mine.mem_bytes = bt_backend_plan_memory(d->backend, d->opt.mem_limit, d->t->local_size, &d->mem_what);
    d->mem_bytes = mine.mem_bytes;
    mine.gflops = d->opt.gflops > 0 ? d->opt.gflops : bt_backend_measure_gflops(d->backend);
    enum bt_status st = BT_OK;
    uint8_t *sup = malloc((size_t)N + 1);
    if (!sup) st = fail(d, BT_ERR_NOMEM, "rank %d: out of memory describing itself", d->rank);
    for (int i = 0; sup && i < N; i++) sup[i] = bt_backend_supports_op(d->backend, d->graph->nodes[i]) ? 1 : 0;
    if (st == BT_OK && d->rank == 0) {
        *descs = calloc((size_t)P, sizeof **descs);
        *support = malloc((size_t)P * (size_t)N + 1);
        if (!*descs || !*support) st = fail(d, BT_ERR_NOMEM, "rank 0: out of memory for %d rank descriptions", P);
    }
    st = agree(d, st);
    if (st == BT_OK && (d->t->iface.gather(d->t, &mine, sizeof mine, *descs, 0) != BT_OK ||
                        (N > 0 && d->t->iface.gather(d->t, sup, (size_t)N, *support, 0) != BT_OK)))
        st = fail(d, BT_ERR_COMM, "%s", d->t->error);
    free(sup);
    return st;
}

/* Rank 0's plan to every rank: its size, then its bytes.  Each step's local
 * failure (planning, memory, a plan that does not fit this rank's graph) is
 * agreed on before the next collective. */
static enum bt_status broadcast_plan(bt_dist *d, enum bt_status st) {
    void *buf = NULL;
    size_t size = 0;
    if (st == BT_OK && d->rank == 0 && bt_plan_pack(&d->plan, &buf, &size) != BT_OK)
        st = fail(d, BT_ERR_NOMEM, "rank 0: out of memory packing the plan");
    st = agree(d, st);
    int64_t n = (int64_t)size;
    if (st == BT_OK && d->t->iface.bcast(d->t, &n, sizeof n, 0) != BT_OK) st = fail(d, BT_ERR_COMM, "%s", d->t->error);
    if (st == BT_OK && d->rank != 0) {
        buf = n > 0 && (uint64_t)n < ((uint64_t)1 << 40) ? malloc((size_t)n) : NULL;
        if (!buf) st = fail(d, BT_ERR_NOMEM, "rank %d: cannot take a plan of %lld bytes", d->rank, (long long)n);
    }
    st = agree(d, st);
    if (st == BT_OK && d->t->iface.bcast(d->t, buf, (size_t)n, 0) != BT_OK) st = fail(d, BT_ERR_COMM, "%s", d->t->error);
    if (st == BT_OK && d->rank != 0 && bt_plan_unpack(&d->plan, buf, (size_t)n, d->graph) != BT_OK)
        st = fail(d, BT_ERR_MISMATCH, "rank %d: %s", d->rank, d->plan.error);
    free(buf);
    return agree(d, st);
}

enum bt_status bt_dist_measure(struct bt_graph *graph, const struct bt_plan *plan, const struct bt_expert_group *groups,
                               int n_groups, int rank, bt_backend_t backend,
                               struct bt_dist_stats *out, char *err, size_t n_err) {
    memset(out, 0, sizeof *out);
    bt_dist *d = calloc(1, sizeof *d);
    if (!d) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    d->backend = backend;
    d->rank = rank;
    d->size = plan->n_ranks;
    d->n_copies = plan->n_copies;
    d->graph = graph;
    d->measure_only = true;
    d->opt.groups = groups;
    d->opt.n_groups = n_groups;
    /* a copy of the plan, which release_plan frees */
    void *buf = NULL;
    size_t size = 0;
    enum bt_status st = bt_plan_pack(plan, &buf, &size);
    if (st == BT_OK && (st = bt_plan_unpack(&d->plan, buf, size, graph)) != BT_OK)
        fail(d, st, "%s", d->plan.error);
    else if (st != BT_OK)
        fail(d, st, "out of memory");
    free(buf);
    if (st == BT_OK) {
        d->splitter = bt_plan_splitter_new(&d->plan, graph, d->err, sizeof d->err);
        if (!d->splitter) st = BT_ERR_MISMATCH;
    }
    if (st == BT_OK) {
        d->sched = bt_plan_splitter_sched(d->splitter);
        st = take_transfers(d);
    }
    if (st == BT_OK) st = allocate_local(d, NULL, NULL);
    if (st == BT_OK) *out = d->stats;
    else snprintf(err, n_err, "%s", d->err);
    release_plan(d);
    free(d);
    return st;
}

enum bt_status bt_dist_plan(bt_dist *d, struct bt_graph *graph, bt_dist_weight_init_fn init, void *user) {
    if (d->planned) release_plan(d);
    d->graph = graph;
    d->err[0] = '\0';
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
    else if (graph->visited.size == 0)
        st = fail(d, BT_ERR_INVALID, "bt_dist_plan needs a full graph, not a view");
    st = agree(d, st);
    if (st != BT_OK) return st;

    /* 2. descriptions to rank 0; 3. rank 0 plans, every rank gets the plan */
    struct bt_rank_desc *descs = NULL;
    uint8_t *support = NULL;
    st = describe_and_gather(d, &descs, &support); /* agreed: the same on every rank */
    const bool described = st == BT_OK;
    if (described && d->rank == 0) {
        const struct bt_plan_options popt = {
            .n_copies = d->n_copies,
            .layers_per_rank = d->opt.layers_per_rank,
            .ends_with_layers = d->opt.ends_with_layers,
            .pins = d->opt.pins,
            .n_pins = d->opt.n_pins,
            .link_gbps = d->opt.link_gbps,
            .device_edges = d->opt.device_edges,
            /* a group's members run no layer of their own (placed without counts too) */
            .groups = d->opt.groups,
            .n_groups = d->opt.n_groups,
        };
        st = bt_plan_make(&d->plan, graph, descs, d->size, support, &popt);
        if (st != BT_OK) fail(d, st, "%s", d->plan.error);
    }
    free(descs);
    free(support);
    if (described) st = broadcast_plan(d, st); /* rank 0's planning failure is agreed on there */
    if (st != BT_OK) {
        release_plan(d);
        return st;
    }
    d->n_copies = d->plan.n_copies; /* rank 0's */

    /* 4. every rank: the plan's splits on its own graph, its transfers, the
     * device transport's edges, its memory */
    char err[512];
    d->splitter = bt_plan_splitter_new(&d->plan, graph, err, sizeof err);
    if (!d->splitter) st = fail(d, BT_ERR_MISMATCH, "rank %d: %s", d->rank, err);
    if (st == BT_OK) {
        d->sched = bt_plan_splitter_sched(d->splitter);
        st = take_transfers(d);
    }
    st = agree(d, st);
    if (st == BT_OK) st = agree(d, open_device_edges(d));
    if (st == BT_OK) st = allocate_local(d, init, user);
    if (st == BT_OK) {
        int n = 0;
        for (int s = 0; s < d->plan.n_splits; s++) n += d->plan.splits[s].rank == d->rank;
        d->stats.n_splits = n;
        d->stats.first_layer = d->plan.layer_first[d->rank];
        d->stats.last_layer = d->plan.layer_last[d->rank];
    }
    st = agree(d, st);
    if (st != BT_OK) {
        release_plan(d);
        return st;
    }
    /* 5. the first n_copies receives of every incoming transfer over the
     * main transport, micro-batch by micro-batch (the order submit keeps) */
    for (int c = 0; c < d->n_copies && st == BT_OK; c++) {
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->dst == d->rank && xf->consumer >= 0 && !xf->direct && !xf->routed) st = post_recv(d, xf, c, c);
        }
        /* a member: the ids of each chain */
        for (int i = 0; i < d->n_chains && st == BT_OK; i++) {
            struct gchain *ch = &d->chains[i];
            if (ch->me <= 0 || ch->rows) continue;
            struct gslot *sl = &ch->slots[c * ch->n_ranks];
            if (bt_transport_irecv(d->t, sl->ids, ids_bytes(ch), ch->home, ch->tag0 + 3 * c, &sl->ids_req) != BT_OK)
                st = fail(d, BT_ERR_COMM, "%s", d->t->error);
        }
    }
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

/* ---- routed transfers (struct xfer): only the experts the routing selected ---- */

/* src: slot c's set, if it came: the experts it names, packed in ascending
 * order, each run of consecutive ones read at once, to dst. */
static enum bt_status routed_serve(bt_dist *d, struct xfer *xf, int c) {
    if (!xf->serve[c]) return BT_OK;
    bt_transport *t = d->t;
    bool done = false;
    enum bt_status st = bt_transport_test(t, &xf->used_req[c], &done);
    if (st != BT_OK) return fail(d, st, "%s", t->error);
    if (!done) return BT_OK;
    xf->serve[c] = false;
    d->n_serving--;
    const double t0 = bt_now_s();
    if (xf->send[c].active && (st = bt_transport_wait(t, &xf->send[c])) != BT_OK) return fail(d, st, "%s", t->error);
    uint8_t *out = xf->stage[c];
    size_t n = 0;
    for (int64_t e = 0; e < xf->n_expert;) {
        if (!xf->used[c][e]) {
            e++;
            continue;
        }
        int64_t last = e;
        while (last + 1 < xf->n_expert && xf->used[c][last + 1]) last++;
        const size_t run = (size_t)(last - e + 1) * xf->expert_bytes;
        bt_tensor_get(xf->tensor, out + n, (size_t)e * xf->expert_bytes, run);
        n += run;
        e = last + 1;
    }
    if ((st = bt_transport_isend(t, out, n, xf->dst, xf->tag0 + c, &xf->send[c])) != BT_OK)
        return fail(d, st, "%s", t->error);
    d->stats.bytes_sent += (int64_t)n;
    d->stats.bytes_routed += (int64_t)n;
    d->stats.bytes_routed_whole += (int64_t)xf->bytes;
    d->stats.send_s += bt_now_s() - t0;
    if (d->trace) trace_add(d, BT_TRACE_SEND, t0, bt_now_s(), d->k_next, -1, xf->dst, (int64_t)n);
    return BT_OK;
}

/* src: every set that came; block: until none is awaited (each as it comes:
 * dst asks for one layer's experts only after the previous layer's came). */
static enum bt_status serve_routed(bt_dist *d, bool block) {
    while (d->n_serving > 0) {
        for (int x = 0; x < d->n_xfers; x++) {
            struct xfer *xf = &d->xfers[x];
            if (!xf->routed || xf->src != d->rank) continue;
            for (int c = 0; c < d->n_copies; c++) {
                const enum bt_status st = routed_serve(d, xf, c);
                if (st != BT_OK) return st;
            }
        }
        if (!block || d->n_serving == 0) return BT_OK;
        sched_yield();
    }
    return BT_OK;
}

/* src, as micro-batch k starts: the receive of its sets. */
static enum bt_status routed_expect(bt_dist *d, int c) {
    for (int x = 0; x < d->n_xfers; x++) {
        struct xfer *xf = &d->xfers[x];
        if (!xf->routed || xf->src != d->rank) continue;
        BT_ASSERT(!xf->serve[c]); /* each submit serves its own before it returns */
        const enum bt_status st =
            bt_transport_irecv(d->t, xf->used[c], (size_t)xf->n_expert, xf->dst, xf->tag0 + c, &xf->used_req[c]);
        if (st != BT_OK) return fail(d, st, "%s", d->t->error);
        xf->serve[c] = true;
        d->n_serving++;
    }
    return BT_OK;
}

/* Wait for a transfer; a rank that serves routed transfers serves them
 * meanwhile (the peer it waits for may be waiting for its experts). */
static enum bt_status wait_on(bt_dist *d, bt_transport *t, bt_treq *r) {
    if (d->n_serving == 0) {
        enum bt_status st = bt_transport_wait_polite(t, r);
        return st == BT_OK ? BT_OK : fail(d, st, "%s", t->error);
    }
    for (;;) {
        bool done = false;
        enum bt_status st = bt_transport_test(t, r, &done);
        if (st != BT_OK) return fail(d, st, "%s", t->error);
        if (done) return BT_OK;
        if ((st = serve_routed(d, false)) != BT_OK) return st;
        sched_yield();
    }
}

static enum bt_status wait_req(bt_dist *d, const struct xfer *xf, bt_treq *r) {
    return wait_on(d, xfer_transport(d, xf), r);
}

static size_t slot_offset(const bt_dist *d, const void *slot);

/* The memory a transfer's slot c lands in on dst (host memory). */
static uint8_t *landing(const struct xfer *xf, int c) {
    return xf->ring[c] ? (uint8_t *)xf->ring[c] : (uint8_t *)xf->copies[c]->data;
}

/* dst, once the ids are computed: the set of experts they select to src,
 * and the receive of exactly those experts. */
static enum bt_status routed_ask(bt_dist *d, struct xfer *xf, int c, int64_t k) {
    bt_transport *t = d->t;
    enum bt_status st = BT_OK;
    if (xf->used_req[c].active && (st = bt_transport_wait(t, &xf->used_req[c])) != BT_OK)
        return fail(d, st, "%s", t->error);
    bt_tensor_get(xf->ids, d->ids_host, 0, bt_nbytes(xf->ids));
    char why[160];
    if ((st = bt_moe_used_experts(xf->ids, d->ids_host, xf->n_expert, xf->used[c], why, sizeof why)) != BT_OK)
        return fail(d, st, "rank %d: the experts of '%s': %s", d->rank, xf->tensor->name, why);
    size_t n = 0;
    for (int64_t e = 0; e < xf->n_expert; e++) n += xf->used[c][e] ? xf->expert_bytes : 0;
    xf->routed_bytes[c] = n;
    if ((st = bt_transport_irecv(t, landing(xf, c), n, xf->src, xf->tag0 + c, &xf->recv[c])) != BT_OK ||
        (st = bt_transport_isend(t, xf->used[c], (size_t)xf->n_expert, xf->src, xf->tag0 + c, &xf->used_req[c])) !=
            BT_OK)
        return fail(d, st, "%s", t->error);
    xf->recv_k[c] = k;
    xf->asked_k[c] = k;
    return BT_OK;
}

/* dst, before the first node that reads them: the experts, each moved from
 * its packed place to its own (from the last down: a place is never below
 * its packed one), uploaded for a device backend. */
static enum bt_status routed_take(bt_dist *d, struct xfer *xf, int c, int64_t k, int s) {
    const double w0 = bt_now_s();
    enum bt_status st = wait_req(d, xf, &xf->recv[c]);
    if (st != BT_OK) return st;
    xf->taken_k[c] = k;
    d->stats.wait_s += bt_now_s() - w0;
    d->stats.bytes_recv += (int64_t)xf->routed_bytes[c];
    if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, s, xf->src, (int64_t)xf->routed_bytes[c]);
    uint8_t *buf = landing(xf, c);
    size_t off = xf->routed_bytes[c];
    for (int64_t e = xf->n_expert - 1; e >= 0; e--) {
        if (!xf->used[c][e]) continue;
        off -= xf->expert_bytes;
        if (off != (size_t)e * xf->expert_bytes) memmove(buf + (size_t)e * xf->expert_bytes, buf + off, xf->expert_bytes);
    }
    if (xf->ring[c])
        st = bt_staging_from_host(d->backend, xf->copies[c], d->host_buf, slot_offset(d, xf->ring[c]), d->err,
                                  sizeof d->err);
    return st;
}

/* ---- expert groups (struct gchain): running the chains ------------------------------ */

/* Wait for one of a chain's transfers (on the main transport). */
static enum bt_status chain_wait(bt_dist *d, bt_treq *r) { return r->active ? wait_on(d, d->t, r) : BT_OK; }

/* A member, before it computes a chain into the memory of its results: the
 * send of a chain's columns from there is done (gbuf o_out). */
static enum bt_status outs_free(bt_dist *d, struct gbuf *gb) {
    if (!gb->o_out) return BT_OK;
    gb->o_out = false;
    return chain_wait(d, &gb->o_req);
}

/* Whether rank m computes the pair of packed index i (slot i % K of token
 * i / K), of expert e, for the micro-batch at hand: e among its experts,
 * and of an expert it shares with a neighbour, on its side of the cut. */
static bool owns(const struct gchain *ch, int m, int64_t i, int32_t e) {
    if (e < ch->lo[m] || e >= ch->hi[m]) return false;
    if (m + 1 < ch->n_ranks && ch->cut[m + 1] >= 0 && e == ch->lo[m + 1] && i >= ch->cut[m + 1]) return false;
    return !(m > 0 && ch->cut[m] >= 0 && e == ch->lo[m] && i < ch->cut[m]);
}

/* The id rank m's MUL_MAT_ID reads for pair i of expert e: e where m owns
 * the pair or m does not compute e at all, else an expert m does not
 * compute (the pairs of a shared expert on the other side of the cut):
 * the pair is then skipped, and any node reading the ids still reads an
 * expert. */
static int32_t masked_id(const struct gchain *ch, int m, int64_t i, int32_t e) {
    if (e < ch->lo[m] || e >= ch->hi[m] || owns(ch, m, i, e)) return e;
    return ch->lo[m] > 0 ? (int32_t)ch->lo[m] - 1 : (int32_t)ch->hi[m];
}

/* home, before the chain: the experts each rank computes for these ids.
 * Without overlap, each its share.  With it, the boundary between ranks
 * m - 1 and m moves within [share - overlap, share + overlap] (both hold
 * those experts) to where the pairs before it make an even part of the
 * rest, each rank keeping at least one expert and none on three ranks.
 * Where that point falls inside an expert of CUT_MIN_PAIRS pairs or more
 * (a prompt's: a decode step's few pairs would cost the expert's weights
 * read twice) and cut is set (the ids are in host memory, so that home can
 * mask them: chain_mask_ids), both compute that expert, each its side of
 * the cut in the order of the ids; else the boundary goes to the nearer
 * expert start.  The ranks then compute as many (token, expert) pairs, to
 * one, however the routing favours some experts (by whole experts alone a
 * part of an expert's pairs was left between them).  Which rank computes
 * a row changes no bit of it.  Whether a boundary moved off the shares. */
#define CUT_MIN_PAIRS 16 /* an expert of fewer pairs is not divided: its weights read twice cost more */
static bool chain_bounds(struct gchain *ch, const int32_t *ids, bool cut) {
    const int n = ch->n_ranks;
    const int64_t E = ch->n_expert, P = ch->K * ch->T;
    bool moved = false;
    for (int m = 0; m < n; m++) {
        bt_expert_share(E, n, m, &ch->lo[m], &ch->hi[m]);
        ch->cut[m] = -1;
    }
    if (ch->overlap <= 0) return false;
    int64_t *cum = ch->counts; /* cum[e]: the pairs that chose an expert below e */
    memset(cum, 0, sizeof *cum * (size_t)(E + 1));
    for (int64_t i = 0; i < P; i++) cum[ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) cum[e + 1] += cum[e];
    int64_t from = 0; /* the pairs of the ranks before m - 1 */
    for (int m = 1; m < n; m++) {
        const int64_t share = ch->lo[m], first = ch->lo[m - 1] + 1; /* no expert on three ranks */
        const int64_t lo = share - ch->overlap > first ? share - ch->overlap : first;
        const int64_t hi = share + ch->overlap < E - (n - m) ? share + ch->overlap : E - (n - m);
        /* an even part of the pairs from m - 1's own on, over the n - m + 1 ranks left */
        const int64_t want = from + (cum[E] - from) / (n - m + 1);
        int64_t b = lo;
        while (b < hi && cum[b + 1] <= want) b++;
        /* within expert b, and both hold it: m - 1's want - cum[b] of its pairs */
        if (cut && cum[b] < want && b < hi && cum[b + 1] - cum[b] >= CUT_MIN_PAIRS) {
            int64_t r = want - cum[b], i = 0;
            for (; i < P && r > 0; i++) r -= ids[i] == b;
            ch->lo[m] = b;
            ch->hi[m - 1] = b + 1;
            ch->cut[m] = i;
            from = want;
            moved = true;
            continue;
        }
        if (b < hi && want - cum[b] > cum[b + 1] - want) b++; /* the nearer start */
        moved |= b != share;
        ch->lo[m] = b;
        ch->hi[m - 1] = b;
        from = cum[b];
    }
    return moved;
}

/* A member: the experts each rank computes, from the header home sent
 * (ids_bytes); whether this rank's lie within those it holds. */
static bool chain_bounds_read(struct gchain *ch, const int32_t *header) {
    const int n = ch->n_ranks;
    const int32_t *lo = header + ch->K * ch->T, *cut = lo + n;
    for (int m = 0; m < n; m++) {
        ch->lo[m] = lo[m];
        ch->cut[m] = cut[m];
        ch->hi[m] = m + 1 < n ? lo[m + 1] + (cut[m + 1] >= 0) : ch->n_expert;
    }
    return ch->lo[ch->me] >= ch->hold_lo[ch->me] && ch->hi[ch->me] <= ch->hold_hi[ch->me] &&
           ch->lo[ch->me] < ch->hi[ch->me];
}

/* The expert weights of a chain computing experts [lo, hi) (MUL_MAT_ID
 * computes the held experts: bt_tensor expert_lo/hi), or back to all this
 * rank holds. */
static void chain_compute_experts(const struct gchain *ch, int64_t lo, int64_t hi) {
    for (int k = 0; k < ch->n_w; k++) {
        ch->w[k]->expert_lo = (int32_t)lo;
        ch->w[k]->expert_hi = (int32_t)hi;
    }
}

/* home, around its part of the chain of slot c: the pairs of the expert it
 * shares with rank 1 that are rank 1's, in the graph's ids, as another
 * expert (masked_id); on false: back to the ids as they were (kept packed
 * in the slot, and read again after the chain). */
static void chain_mask_ids(const struct gchain *ch, int c, bool on) {
    if (ch->n_ranks < 2 || ch->cut[1] < 0) return;
    const int32_t *ids = ch->slots[c * ch->n_ranks].ids;
    for (int64_t i = 0; i < ch->K * ch->T; i++) {
        const int32_t v = masked_id(ch, 0, i, ids[i]);
        const size_t at = (size_t)(i / ch->K) * ch->ids->nb[1] + (size_t)(i % ch->K) * ch->ids->nb[0];
        if (v != ids[i]) bt_tensor_set(ch->ids, on ? &v : &ids[i], at, sizeof v);
    }
}

/* The chain's GLU nodes of a row per slot compute only the rows of experts
 * [lo, hi) (tensor.h: held_ids), while this rank computes them; on: back to
 * every row. */
static void chain_glu_rows(const struct gchain *ch, int64_t lo, int64_t hi, bool on) {
    const struct bt_tensor *ids = ch->ids_in ? ch->ids_in : ch->ids;
    for (int i = 0; i < ch->n_nodes; i++) {
        struct bt_tensor *nd = ch->nodes[i];
        if ((nd->op != BT_OP_SWIGLU && nd->op != BT_OP_SWIGLU_OAI) || nd->ne[1] != ch->K || nd->ne[2] != ch->T ||
            nd->ne[3] != 1)
            continue;
        nd->held_ids = on ? ids : NULL;
        nd->expert_lo = on ? (int32_t)lo : 0;
        nd->expert_hi = on ? (int32_t)hi : 0;
    }
}

/* Whether token tok chose one of member m's experts; adds to *slots how many
 * of its slots did (the rows of out m computes for it). */
static bool token_held(const struct gchain *ch, int m, const int32_t *ids, int64_t tok, int64_t *slots) {
    int64_t n = 0;
    for (int64_t e = 0; e < ch->K; e++) n += owns(ch, m, tok * ch->K + e, ids[tok * ch->K + e]);
    *slots += n;
    return n > 0;
}

/* Where the row of out of packed slot i (slot i % K of token i / K) lies. */
static size_t out_offset(const struct gchain *ch, int64_t i) {
    return (size_t)(i % ch->K) * ch->out->nb[1] + (size_t)(i / ch->K) * ch->out->nb[2];
}

/* The expert weight bytes a chain reads for the ids of slot c: each expert
 * of member m's that a slot chose, once. */
static int64_t chain_expert_bytes(const struct gchain *ch, const int32_t *ids, int m) {
    uint8_t seen[4096];
    const int64_t E = ch->n_expert;
    if (E > (int64_t)sizeof seen) return (ch->hi[m] - ch->lo[m]) * (int64_t)ch->expert_bytes;
    memset(seen, 0, (size_t)E);
    int64_t n = 0;
    for (int64_t i = 0; i < ch->K * ch->T; i++)
        if (owns(ch, m, i, ids[i]) && !seen[ids[i]]) {
            seen[ids[i]] = 1;
            n++;
        }
    return n * (int64_t)ch->expert_bytes;
}

/* home, before the chain of micro-batch k: the ids to every member, and to
 * each the rows of x of the tokens that chose one of its experts; the
 * receive of exactly the rows of out its experts make. */
static enum bt_status chain_send(bt_dist *d, struct gchain *ch, int c) {
    bt_transport *t = d->t;
    const double t0 = bt_now_s();
    const int n = ch->n_ranks;
    enum bt_status st = BT_OK;
    for (int m = 1; m < n && st == BT_OK; m++) {
        st = chain_wait(d, &ch->slots[c * n + m].ids_req);
        if (st == BT_OK) st = chain_wait(d, &d->gbufs[m].x_req);
    }
    if (st != BT_OK) return st;
    int32_t *ids = ch->slots[c * n].ids;
    for (int64_t i = 0; i < ch->T; i++)
        bt_tensor_get(ch->ids, ids + i * ch->K, (size_t)i * ch->ids->nb[1], sizeof(int32_t) * (size_t)ch->K);
    char why[160];
    for (int64_t i = 0; i < ch->K * ch->T; i++)
        if (ids[i] < 0 || ids[i] >= ch->n_expert) {
            snprintf(why, sizeof why, "rank %d: expert id %d of '%s' out of range [0, %lld)", d->rank, ids[i],
                     ch->ids->name, (long long)ch->n_expert);
            return fail(d, BT_ERR_INVALID, "%s", why);
        }
    d->stats.experts_moved += chain_bounds(ch, ids, in_host_memory(ch->ids));
    for (int m = 0; m < n; m++) {
        d->stats.experts_cut += ch->cut[m] >= 0;
        ids[ch->K * ch->T + m] = (int32_t)ch->lo[m];
        ids[ch->K * ch->T + n + m] = (int32_t)ch->cut[m];
    }
    const size_t xrow = sizeof(float) * (size_t)ch->d_x, orow = sizeof(float) * (size_t)ch->d_out;
    for (int m = 1; m < n; m++) {
        struct gslot *sl = &ch->slots[c * n + m];
        struct gbuf *gb = &d->gbufs[m];
        const int peer = ch->ranks[m];
        int64_t nx = 0, no = 0;
        for (int64_t tok = 0; tok < ch->T; tok++)
            if (token_held(ch, m, ids, tok, &no))
                bt_tensor_get(ch->x, (uint8_t *)gb->x + (size_t)(nx++) * xrow, (size_t)tok * ch->x->nb[2], xrow);
        const size_t ib = ids_bytes(ch);
        sl->n_o = no;
        if ((st = bt_transport_isend(t, ids, ib, peer, ch->tag0 + 3 * c, &sl->ids_req)) != BT_OK ||
            (nx > 0 && (st = bt_transport_isend(t, gb->x, (size_t)nx * xrow, peer, ch->tag0 + 3 * c + 1, &gb->x_req)) !=
                           BT_OK) ||
            (no > 0 && (st = bt_transport_irecv(t, gb->o, (size_t)no * orow, peer, ch->tag0 + 3 * c + 2, &gb->o_req)) !=
                           BT_OK))
            return fail(d, st, "%s", t->error);
        const int64_t b = (int64_t)ib + nx * (int64_t)xrow;
        d->stats.bytes_sent += b;
        d->stats.bytes_group += b;
        if (d->trace) trace_add(d, BT_TRACE_SEND, t0, bt_now_s(), d->k_next, ch->split, peer, b);
    }
    d->stats.expert_bytes_read += chain_expert_bytes(ch, ids, 0);
    for (int64_t i = 0; i < ch->K * ch->T; i++) d->stats.expert_pairs += owns(ch, 0, i, ids[i]);
    d->stats.send_s += bt_now_s() - t0;
    return BT_OK;
}

/* home, after its own rows of the chain: each member's rows of out, put in
 * place in the order of the ids. */
static enum bt_status chain_take(bt_dist *d, struct gchain *ch, int c, int64_t k) {
    const int n = ch->n_ranks;
    const int32_t *ids = ch->slots[c * n].ids;
    const size_t orow = sizeof(float) * (size_t)ch->d_out;
    for (int m = 1; m < n; m++) {
        struct gslot *sl = &ch->slots[c * n + m];
        if (sl->n_o == 0) continue;
        const double w0 = bt_now_s();
        const enum bt_status st = chain_wait(d, &d->gbufs[m].o_req);
        if (st != BT_OK) return st;
        d->stats.wait_s += bt_now_s() - w0;
        d->stats.bytes_recv += sl->n_o * (int64_t)orow;
        if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, ch->split, ch->ranks[m], sl->n_o * (int64_t)orow);
        int64_t r = 0;
        for (int64_t i = 0; i < ch->K * ch->T; i++)
            if (owns(ch, m, i, ids[i]))
                bt_tensor_set(ch->out, (const uint8_t *)d->gbufs[m].o + (size_t)(r++) * orow, out_offset(ch, i), orow);
    }
    ch->done_k[c] = k;
    return BT_OK;
}

/* A member, at the chain of micro-batch k (in the order of the graph): the
 * ids; when a slot chose one of its experts, the rows of x, its rows of the
 * chain, and those rows of out back to home.  Then the receive of the ids
 * of micro-batch k + n_copies. */
static enum bt_status compute_nodes(bt_dist *d, struct bt_graph *view);
static enum bt_status chain_serve(bt_dist *d, struct gchain *ch, int c, int64_t k) {
    bt_transport *t = d->t;
    struct gslot *sl = &ch->slots[c * ch->n_ranks];
    struct gbuf *gb = &d->gbufs[0];
    const int home = ch->home, me = ch->me;
    const double w0 = bt_now_s();
    enum bt_status st = chain_wait(d, &sl->ids_req);
    if (st != BT_OK) return st;
    const size_t ib = ids_bytes(ch);
    if (!chain_bounds_read(ch, sl->ids))
        return fail(d, BT_ERR_MISMATCH,
                    "rank %d: rank %d gave it experts [%lld, %lld) of '%s', past the [%lld, %lld) it holds", d->rank,
                    home, (long long)ch->lo[me], (long long)ch->hi[me], ch->w[0]->name, (long long)ch->hold_lo[me],
                    (long long)ch->hold_hi[me]);
    /* the pairs of its shared experts that are not its own: another
     * expert's (ids_in, and what follows reads them so) */
    for (int64_t i = 0; i < ch->K * ch->T; i++) sl->ids[i] = masked_id(ch, me, i, sl->ids[i]);
    const size_t xrow = sizeof(float) * (size_t)ch->d_x, orow = sizeof(float) * (size_t)ch->d_out;
    d->stats.bytes_recv += (int64_t)ib;
    int64_t nx = 0, no = 0;
    for (int64_t tok = 0; tok < ch->T; tok++) nx += token_held(ch, me, sl->ids, tok, &no);
    if (nx > 0) {
        if ((st = bt_transport_irecv(t, gb->x, (size_t)nx * xrow, home, ch->tag0 + 3 * c + 1, &gb->x_req)) != BT_OK)
            return fail(d, st, "%s", t->error);
        if ((st = chain_wait(d, &gb->x_req)) != BT_OK) return st;
        d->stats.bytes_recv += nx * (int64_t)xrow;
    }
    d->stats.wait_s += bt_now_s() - w0;
    if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, ch->split, home, (int64_t)ib + nx * (int64_t)xrow);
    if (no > 0) {
        bt_tensor_set(ch->ids_in, sl->ids, 0, sizeof(int32_t) * (size_t)(ch->K * ch->T));
        int64_t r = 0, slots = 0;
        for (int64_t tok = 0; tok < ch->T; tok++)
            if (token_held(ch, me, sl->ids, tok, &slots))
                bt_tensor_set(ch->x_in, (const uint8_t *)gb->x + (size_t)(r++) * xrow, (size_t)tok * ch->x_in->nb[2], xrow);
        const double t1 = bt_now_s();
        struct bt_graph cg = {.size = ch->n_nodes, .n_nodes = ch->n_nodes, .nodes = ch->nodes, .ctx = d->graph->ctx};
        if ((st = outs_free(d, gb)) != BT_OK) return st;
        chain_compute_experts(ch, ch->lo[me], ch->hi[me]);
        chain_glu_rows(ch, ch->lo[me], ch->hi[me], true);
        st = compute_nodes(d, &cg);
        chain_compute_experts(ch, ch->hold_lo[me], ch->hold_hi[me]);
        chain_glu_rows(ch, 0, 0, false);
        if (st != BT_OK) return st;
        const double t2 = bt_now_s();
        d->stats.compute_s += t2 - t1;
        d->stats.expert_s += t2 - t1;
        d->stats.expert_bytes_read += chain_expert_bytes(ch, sl->ids, me);
        d->stats.expert_pairs += no;
        if (d->trace) trace_add(d, BT_TRACE_COMPUTE, t1, t2, k, ch->split, -1, 0);
        if ((st = chain_wait(d, &gb->o_req)) != BT_OK) return st;
        r = 0;
        for (int64_t i = 0; i < ch->K * ch->T; i++)
            if (owns(ch, me, i, sl->ids[i]))
                bt_tensor_get(ch->out, (uint8_t *)gb->o + (size_t)(r++) * orow, out_offset(ch, i), orow);
        if ((st = bt_transport_isend(t, gb->o, (size_t)no * orow, home, ch->tag0 + 3 * c + 2, &gb->o_req)) != BT_OK)
            return fail(d, st, "%s", t->error);
        d->stats.bytes_sent += no * (int64_t)orow;
        d->stats.bytes_group += no * (int64_t)orow;
    }
    if ((st = bt_transport_irecv(t, sl->ids, ib, home, ch->tag0 + 3 * c, &sl->ids_req)) != BT_OK)
        return fail(d, st, "%s", t->error);
    return BT_OK;
}

/* ---- groups' dense products (struct gchain, rows) ------------------------------- */

/* The (token, cell) pairs of micro-batch k that mask lets through, of T
 * tokens over N cells (counted once a micro-batch per mask: the full
 * layers' and the sliding layers'). */
static int64_t mask_seen(bt_dist *d, const struct bt_tensor *mask, int64_t T, int64_t N, int64_t k) {
    for (int i = 0; i < 2; i++)
        if (d->seen[i].mask == mask && d->seen[i].k == k) return d->seen[i].seen;
    int64_t n = 0;
    for (int64_t t = 0; t < T; t++) {
        const uint8_t *row = (const uint8_t *)mask->data + t * mask->nb[1];
        for (int64_t j = 0; j < N; j++) {
            const uint8_t *at = row + j * mask->nb[0];
            n += mask->type == BT_TYPE_F16 ? *(const uint16_t *)at != 0xfc00u : *(const float *)at != -INFINITY;
        }
    }
    d->seen[1] = d->seen[0];
    d->seen[0] = (struct mask_seen){mask, k, n};
    return n;
}

/* Whether dividing an attention by heads is worth its transfer: a member
 * is sent every cell of its kv heads and spares home its heads' work on the
 * cells each token sees.  Divided when the pairs the mask lets through,
 * times the q heads per kv head, reach ATTN_WORTH times the cells: a prompt's
 * tokens over its cells do; a ubatch of many sequences' decode steps, each
 * token over its own sequence's cells, does not.  Either way each head's
 * rows are the same bits. */
#define ATTN_WORTH 16
static bool attn_worth(bt_dist *d, const struct gchain *ch, int64_t k) {
    const struct bt_tensor *q = ch->out->src[0], *kc = ch->out->src[1], *mask = ch->out->src[3];
    const int64_t T = q->ne[2], N = kc->ne[2], group = q->ne[1] / kc->ne[1];
    const int64_t seen = mask ? mask_seen(d, mask, T, N, k) : T * N;
    return seen * group >= ATTN_WORTH * N;
}

/* An attention's word to a member: divided this time (else home computes
 * it whole); the member's heads of out sent back (else they stay on the
 * member, keeps); its heads of the per-head product before it (q_to) sent
 * back. */
#define ATTN_DIVIDE 1
#define ATTN_ROWS_BACK 2
#define ATTN_Q_BACK 4
/* home: whether the members send back their rows of chain ch in
 * micro-batch k (slot c): all but those they keep (a divided attention's
 * heads for the product after it, a product's heads for a divided attention
 * after it), which come back too where the eval callback may want the
 * results whole */
static bool rows_back(const bt_dist *d, const struct gchain *ch, int c, int64_t k) {
    if (ch->local) return false; /* (with an eval callback home computes them whole) */
    if (d->eval_cb) return true;
    if (ch->attn) return !ch->keeps; /* (asked only of a divided attention) */
    return ch->q_to < 0 || d->chains[ch->q_to].divided_k[c] != k;
}

/* Whether each member already holds chain ch's x in micro-batch k (slot c):
 * kept from the dense product before it, or its heads of the attention
 * before it, divided in this micro-batch. */
static bool x_held(const struct gchain *ch, int c, int64_t k) {
    return ch->x_kept || ch->glu || (ch->x_from_attn && ch[-1].divided_k[c] == k);
}

/* home, before an attention chain of micro-batch k: whether it is divided
 * this time, told to every member that holds heads (a word on the chain's
 * first tag; the member then waits for its sources, or computes nothing);
 * *alone: home computes every head. */
static enum bt_status attn_tell(bt_dist *d, struct gchain *ch, int c, int64_t k, bool *alone) {
    *alone = !attn_worth(d, ch, k);
    ch->told_k[c] = k;
    if (!*alone) ch->divided_k[c] = k;
    for (int m = 1; m < ch->n_ranks; m++) {
        if (ch->hi[m] == ch->lo[m]) continue;
        struct gslot *sl = &ch->slots[c * ch->n_ranks + m];
        enum bt_status st = chain_wait(d, &sl->ids_req);
        if (st != BT_OK) return st;
        sl->divide = *alone ? 0 : ATTN_DIVIDE | (d->eval_cb ? ATTN_Q_BACK : 0);
        if (!*alone && rows_back(d, ch, c, k)) sl->divide |= ATTN_ROWS_BACK;
        st = bt_transport_isend(d->t, &sl->divide, sizeof sl->divide, ch->ranks[m], ch->tag0 + 3 * c, &sl->ids_req);
        if (st != BT_OK) return fail(d, st, "%s", d->t->error);
    }
    return BT_OK;
}

/* Whether tensor x lives in host memory (a transfer may read or write it in place). */
static bool in_host_memory(const struct bt_tensor *x) {
    const bt_buffer_t b = x->view_src ? x->view_src->buffer : x->buffer;
    return b && bt_buft_is_host(bt_buffer_get_type(b));
}

/* Heads [lo, hi) of x, a per-head product's input or result ([n, T, H],
 * any strides, host memory), to buf or from it (unpack), in the order of a
 * contiguous x: each head's tokens in turn; returns the bytes (buf NULL:
 * only counts). */
static size_t heads_copy(struct bt_tensor *x, int64_t lo, int64_t hi, uint8_t *buf, bool unpack) {
    const size_t row = sizeof(float) * (size_t)x->ne[0];
    size_t n = 0;
    for (int64_t h = lo; h < hi; h++)
        for (int64_t t = 0; t < x->ne[1]; t++, n += row) {
            uint8_t *at = (uint8_t *)x->data + h * x->nb[2] + t * x->nb[1];
            if (buf && unpack) memcpy(at, buf + n, row);
            else if (buf) memcpy(buf + n, at, row);
        }
    return n;
}

/* The bytes of out that member m computes: its rows of every column, its
 * columns, or its heads. */
static size_t row_out_bytes(const struct gchain *ch, int m) {
    const int64_t n = ch->hi[m] - ch->lo[m];
    if (ch->heads) return (size_t)(n * ch->out->ne[1]) * bt_row_size(ch->out->type, ch->out->ne[0]);
    return sizeof(float) * (size_t)(n * (ch->cols ? ch->d_out : ch->T));
}

/* home, before the product of micro-batch k: all of x to every member that
 * holds rows (from x itself in host memory: row_take waits for the sends
 * before anything can overwrite it), or its heads of x, or its part of an
 * attention's sources; and the receive of exactly what it computes of out. */
static enum bt_status row_send(bt_dist *d, struct gchain *ch, int c, int64_t k) {
    bt_transport *t = d->t;
    const double t0 = bt_now_s();
    size_t xb = sizeof(float) * (size_t)(ch->T * ch->d_x);
    const bool in_place = in_host_memory(ch->x) && !ch->attn && !ch->heads;
    for (int m = 1; m < ch->n_ranks; m++) {
        struct gbuf *gb = &d->gbufs[m];
        if (ch->hi[m] == ch->lo[m]) continue;
        const size_t ob = row_out_bytes(ch, m);
        enum bt_status st = BT_OK;
        /* a member's columns of out: into out itself where it is host memory */
        void *o = gb->o;
        if (ch->cols && in_host_memory(ch->out)) o = (uint8_t *)ch->out->data + ch->lo[m] * ch->out->nb[1];
        if (rows_back(d, ch, c, k)) st = bt_transport_irecv(t, o, ob, ch->ranks[m], ch->tag0 + 3 * c + 2, &gb->o_req);
        if (st != BT_OK) return fail(d, st, "%s", t->error);
        if (x_held(ch, c, k)) { /* the member has it (a send of nothing in the trace, chain by chain) */
            if (d->trace) trace_add(d, BT_TRACE_SEND, t0, bt_now_s(), k, ch->split, ch->ranks[m], 0);
            continue;
        }
        if ((st = chain_wait(d, &gb->x_req)) != BT_OK) return st;
        const void *x = ch->x->data;
        if (ch->attn || ch->heads) {
            xb = ch->attn ? attn_pack(ch, m, (uint8_t *)gb->x, false)
                          : heads_copy(ch->x, ch->lo[m], ch->hi[m], (uint8_t *)gb->x, false);
            x = gb->x;
        } else if (ch->cols) { /* its columns */
            const size_t at = (size_t)ch->lo[m] * ch->x->nb[1];
            xb = sizeof(float) * (size_t)((ch->hi[m] - ch->lo[m]) * ch->d_x);
            if (in_place) x = (const uint8_t *)ch->x->data + at;
            else bt_tensor_get(ch->x, gb->x, at, xb), x = gb->x;
        } else if (!in_place) {
            bt_tensor_get(ch->x, gb->x, 0, xb);
            x = gb->x;
        }
        if ((st = bt_transport_isend(t, x, xb, ch->ranks[m], ch->tag0 + 3 * c + 1, &gb->x_req)) != BT_OK)
            return fail(d, st, "%s", t->error);
        d->stats.bytes_sent += (int64_t)xb;
        d->stats.bytes_group += (int64_t)xb;
        if (d->trace) trace_add(d, BT_TRACE_SEND, t0, bt_now_s(), k, ch->split, ch->ranks[m], (int64_t)xb);
    }
    d->stats.send_s += bt_now_s() - t0;
    return BT_OK;
}

/* home, after its own rows: each member's rows of every column (or its
 * heads), in place. */
static enum bt_status row_take(bt_dist *d, struct gchain *ch, int c, int64_t k) {
    for (int m = 1; m < ch->n_ranks; m++) {
        const int64_t rows = ch->hi[m] - ch->lo[m];
        if (rows == 0) continue;
        const double w0 = bt_now_s();
        if (!rows_back(d, ch, c, k)) { /* kept on the member (a wait for nothing in the trace) */
            if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, w0, k, ch->split, ch->ranks[m], 0);
            continue;
        }
        enum bt_status st = chain_wait(d, &d->gbufs[m].o_req);
        if (st == BT_OK) st = chain_wait(d, &d->gbufs[m].x_req); /* x may be sent from itself */
        if (st != BT_OK) return st;
        const size_t rb = sizeof(float) * (size_t)rows, ob = row_out_bytes(ch, m);
        d->stats.wait_s += bt_now_s() - w0;
        d->stats.bytes_recv += (int64_t)ob;
        if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, ch->split, ch->ranks[m], (int64_t)ob);
        if (ch->heads) {
            bt_tensor_set(ch->out, d->gbufs[m].o, (size_t)ch->lo[m] * ch->out->nb[2], ob);
            continue;
        }
        if (ch->cols) { /* (in place: row_send) */
            if (!in_host_memory(ch->out))
                bt_tensor_set(ch->out, d->gbufs[m].o, (size_t)ch->lo[m] * ch->out->nb[1], ob);
            continue;
        }
        for (int64_t j = 0; j < ch->T; j++)
            bt_tensor_set(ch->out, (const uint8_t *)d->gbufs[m].o + (size_t)j * rb,
                          sizeof(float) * (size_t)(j * ch->d_out + ch->lo[m]), rb);
    }
    ch->done_k[c] = k;
    return BT_OK;
}

/* A member: home's word of attention chain a in micro-batch k (slot c). */
static enum bt_status attn_hear(bt_dist *d, struct gchain *a, int c, int64_t k) {
    struct gslot *sl = &a->slots[c * a->n_ranks];
    enum bt_status st =
        bt_transport_irecv(d->t, &sl->divide, sizeof sl->divide, a->home, a->tag0 + 3 * c, &sl->ids_req);
    if (st != BT_OK) return fail(d, st, "%s", d->t->error);
    if ((st = chain_wait(d, &sl->ids_req)) != BT_OK) return st;
    a->told_k[c] = k;
    if (sl->divide & ATTN_DIVIDE) a->divided_k[c] = k;
    return BT_OK;
}

/* A member, at the product of micro-batch k (in the order of the graph):
 * x, its rows of the product, and those rows back to home. */
static enum bt_status row_serve(bt_dist *d, struct gchain *ch, int c, int64_t k) {
    bt_transport *t = d->t;
    struct gbuf *gb = &d->gbufs[0];
    const int64_t rows = ch->hi[ch->me] - ch->lo[ch->me];
    if (rows == 0) return BT_OK;
    const double w0 = bt_now_s();
    enum bt_status st;
    /* home's word of the attention (this one, or the one after that keeps
     * this product's heads): divided this time, or computed whole at home */
    struct gchain *a = ch->attn ? ch : ch->q_to >= 0 ? &d->chains[ch->q_to] : NULL;
    if (a && a->told_k[c] != k && (st = attn_hear(d, a, c, k)) != BT_OK) return st;
    if (ch->attn && ch->divided_k[c] != k) {
        d->stats.wait_s += bt_now_s() - w0;
        return BT_OK;
    }
    const int32_t word = a ? a->slots[c * a->n_ranks].divide : 0;
    const bool q_keep = !ch->attn && (word & ATTN_DIVIDE);
    const size_t xb = ch->attn    ? attn_pack(ch, ch->me, NULL, false)
                      : ch->heads ? heads_copy(ch->x, ch->lo[ch->me], ch->hi[ch->me], NULL, false)
                      : ch->cols  ? sizeof(float) * (size_t)(rows * ch->d_x)
                                  : sizeof(float) * (size_t)(ch->T * ch->d_x);
    const size_t rb = sizeof(float) * (size_t)rows, ob = row_out_bytes(ch, ch->me);
    /* a per-head product's heads of x where they lie in x_in */
    const size_t x_at = ch->heads  ? (size_t)ch->lo[ch->me] * ch->x_in->nb[2]
                        : ch->cols ? (size_t)ch->lo[ch->me] * ch->x_in->nb[1]
                                   : 0;
    /* into x_in itself where it is host memory and contiguous (an
     * attention's packed sources into the buffer, then into its own copies
     * of them, at which its node points again: the scheduler points it at
     * its slots' copies; the heads of the attention before, x_from_attn,
     * into that attention's result, where x_in reads them) */
    for (int k = 0; k < BT_MAX_SRC && ch->attn; k++) ch->out->src[k] = ch->ins[k];
    const bool in_place = in_host_memory(ch->x_in) && !ch->attn && !ch->x_from_attn;
    void *x = in_place ? (void *)((uint8_t *)ch->x_in->data + x_at) : gb->x;
    if (!x_held(ch, c, k)) { /* else x_in holds it, from the chain before */
        st = bt_transport_irecv(t, x, xb, ch->home, ch->tag0 + 3 * c + 1, &gb->x_req);
        if (st != BT_OK) return fail(d, st, "%s", t->error);
        if ((st = chain_wait(d, &gb->x_req)) != BT_OK) return st;
        d->stats.bytes_recv += (int64_t)xb;
        d->stats.wait_s += bt_now_s() - w0;
        if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, ch->split, ch->home, (int64_t)xb);
        if (ch->attn) attn_pack(ch, ch->me, (uint8_t *)gb->x, true);
        else if (ch->x_from_attn) heads_copy(ch->x_in, ch->lo[ch->me], ch->hi[ch->me], (uint8_t *)gb->x, true);
        else if (!in_place) bt_tensor_set(ch->x_in, gb->x, x_at, xb);
    } else if (d->trace) {
        trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, ch->split, ch->home, 0);
    }
    const double t1 = bt_now_s();
    struct bt_graph cg = {.size = 1, .n_nodes = 1, .nodes = ch->nodes, .ctx = d->graph->ctx};
    if ((st = outs_free(d, gb)) != BT_OK) return st;
    struct bt_graph gg = {.size = 1, .n_nodes = 1, .nodes = &ch->x, .ctx = d->graph->ctx};
    if (ch->glu && (st = compute_nodes(d, &gg)) != BT_OK) return st; /* its columns of x */
    rows_of_whole(ch, true);
    st = compute_nodes(d, &cg);
    rows_of_whole(ch, false);
    if (st != BT_OK) return st;
    const double t2 = bt_now_s();
    d->stats.compute_s += t2 - t1;
    d->stats.attn_divided += ch->attn;
    if (d->trace) trace_add(d, BT_TRACE_COMPUTE, t1, t2, k, ch->split, -1, 0);
    if ((ch->attn && !(word & ATTN_ROWS_BACK)) || (q_keep && !(word & ATTN_Q_BACK)) || ch->local) return BT_OK;
    if ((st = chain_wait(d, &gb->o_req)) != BT_OK) return st;
    const void *o = gb->o;
    if (ch->cols && in_host_memory(ch->out)) /* its columns, one piece: from out itself */
        o = (const uint8_t *)ch->out->data + (size_t)ch->lo[ch->me] * ch->out->nb[1], gb->o_out = true;
    else if (ch->cols)
        bt_tensor_get(ch->out, gb->o, (size_t)ch->lo[ch->me] * ch->out->nb[1], ob);
    else if (ch->heads && in_host_memory(ch->out)) /* (its out may be q's first part: alias_member_outs) */
        heads_copy(ch->out, ch->lo[ch->me], ch->hi[ch->me], (uint8_t *)gb->o, false);
    else if (ch->heads)
        bt_tensor_get(ch->out, gb->o, (size_t)ch->lo[ch->me] * ch->out->nb[2], ob);
    else
        for (int64_t j = 0; j < ch->T; j++)
            bt_tensor_get(ch->out, (uint8_t *)gb->o + (size_t)j * rb,
                          sizeof(float) * (size_t)(j * ch->d_out + ch->lo[ch->me]), rb);
    if ((st = bt_transport_isend(t, o, ob, ch->home, ch->tag0 + 3 * c + 2, &gb->o_req)) != BT_OK)
        return fail(d, st, "%s", t->error);
    d->stats.bytes_sent += (int64_t)ob;
    d->stats.bytes_group += (int64_t)ob;
    return BT_OK;
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
    const double t0 = bt_now_s();
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
    const double t1 = bt_now_s();
    d->stats.send_s += t1 - t0;
    if (d->trace) trace_add(d, BT_TRACE_SEND, t0, t1, d->k_next, xf->producer, xf->dst, (int64_t)xf->bytes);
    return BT_OK;
}

enum bt_status bt_dist_set_input(bt_dist *d, struct bt_tensor *input, const void *data, size_t size) {
    if (!d->planned) return fail(d, BT_ERR_INVALID, "set_input before bt_dist_plan");
    if (!(input->flags & BT_TENSOR_FLAG_INPUT) || bt_tensor_is_weight(input) || owner_of(d, input) < 0)
        return fail(d, BT_ERR_INVALID, "tensor '%s' is not a graph input", input->name);
    if (size != bt_nbytes(input))
        return fail(d, BT_ERR_INVALID, "input '%s' takes %zu bytes, got %zu", input->name, bt_nbytes(input), size);
    if (owner_of(d, input) == d->rank) bt_tensor_set(input, data, 0, size);
    const int c = (int)(d->k_next % d->n_copies); /* its previous micro-batch's splits have run */
    for (int i = 0; i < d->n_lins; i++) {
        if (d->lins[i].tensor != input) continue;
        bt_tensor_set(d->lins[i].copies[c], data, 0, size);
        d->lins[i].set_k[c] = d->k_next;
    }
    return BT_OK;
}

enum bt_status bt_dist_set_input_fn(void *d, struct bt_tensor *input, const void *data, size_t size) {
    return bt_dist_set_input(d, input, data, size);
}

/* Between two ops of a split (the CPU backend's node hook, on the compute
 * thread): at most once per period, test this rank's sends in flight, up to
 * the first that is not done.  One test drives the transport's progress
 * engine, which moves every transfer in flight (receives included): more
 * calls would only cost the compute thread time.  A completed send is
 * simply inactive later.  No send in flight: no call at all. */
static void progress_between_ops(void *user) {
    bt_dist *d = user;
    const double t = bt_now_s();
    if (t < d->next_progress_s || d->progress_status != BT_OK) return;
    d->next_progress_s = t + d->progress_period_s;
    d->stats.progress_calls++;
    if (d->n_serving > 0) {
        const enum bt_status st = serve_routed(d, false);
        if (st != BT_OK) {
            d->progress_status = st;
            return;
        }
    }
    /* an expert group's rows to its members, while home computes its own */
    for (int m = 1; d->n_chain_home > 0 && m < d->n_gbufs; m++) {
        if (!d->gbufs[m].x_req.active) continue;
        bool done = false;
        const enum bt_status st = bt_transport_test(d->t, &d->gbufs[m].x_req, &done);
        if (st != BT_OK) {
            d->progress_status = st;
            fail(d, st, "%s", d->t->error);
            return;
        }
        if (!done) return;
    }
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
            if (!done) return;
        }
    }
}

/* Nodes of a split on this rank's backend, with the transfers in flight
 * kept moving as bt_dist_set_progress chose. */
static enum bt_status compute_nodes(bt_dist *d, struct bt_graph *view) {
    enum bt_dist_progress mode = d->progress;
    /* the compute thread drives the transfers where the backend calls a
     * hook between ops (the CPU's); else a progress thread does */
    const bool hook = mode != BT_DIST_PROGRESS_THREAD && mode != BT_DIST_PROGRESS_NONE &&
                      bt_backend_set_node_hook(d->backend, progress_between_ops, d);
    if (mode == BT_DIST_PROGRESS_AUTO || (mode == BT_DIST_PROGRESS_COMPUTE && !hook))
        mode = hook ? BT_DIST_PROGRESS_COMPUTE : BT_DIST_PROGRESS_THREAD;
    enum bt_status st;
    if (mode == BT_DIST_PROGRESS_COMPUTE) {
        d->next_progress_s = bt_now_s() + d->progress_period_s;
        d->progress_status = BT_OK; /* this split's own */
        st = bt_backend_graph_compute(d->backend, view);
        bt_backend_set_node_hook(d->backend, NULL, NULL);
        if (st == BT_OK && d->progress_status != BT_OK) return d->progress_status; /* d->err says why */
    } else {
        if (mode == BT_DIST_PROGRESS_THREAD) bt_transport_set_busy(d->t, true);
        st = bt_backend_graph_compute(d->backend, view);
        if (mode == BT_DIST_PROGRESS_THREAD) bt_transport_set_busy(d->t, false);
    }
    if (st != BT_OK) fail(d, st, "%s", bt_backend_error(d->backend));
    return st;
}

/* Nodes of a split: at once, or with an eval callback in ranges of nodes up
 * to each node the callback wants to see, as the scheduler runs one. */
static enum bt_status compute_range(bt_dist *d, struct bt_graph *view) {
    if (view->n_nodes == 0) return BT_OK;
    if (!d->eval_cb) return compute_nodes(d, view);
    for (int j0 = 0; j0 < view->n_nodes; j0++) {
        struct bt_tensor *t = view->nodes[j0];
        bool need = d->eval_cb(t, true, d->eval_user);
        int j1 = j0;
        while (!need && j1 < view->n_nodes - 1) {
            t = view->nodes[++j1];
            need = d->eval_cb(t, true, d->eval_user);
        }
        struct bt_graph gv = bt_graph_view(view, j0, j1 + 1);
        const enum bt_status st = compute_nodes(d, &gv);
        if (st != BT_OK) return st;
        if (need && !d->eval_cb(t, false, d->eval_user))
            return fail(d, BT_ERR_ABORTED, "stopped by the eval callback after node '%s'", t->name);
        j0 = j1;
    }
    return BT_OK;
}

/* Home, where the members keep their heads of attention a's q (q_kept):
 * only its own heads of q's CONCAT (the others' first parts are theirs),
 * while on; every head after the attention (or where home computes it
 * whole: the members send theirs). */
static void q_heads(const struct gchain *a, bool on) {
    struct bt_tensor *q = a->out->src[0];
    int64_t lo = 0, hi = 0;
    if (on) attn_src_range(a, 0, 0, &lo, &hi);
    q->row_lo = hi > lo ? (int32_t)lo : 0;
    q->row_hi = hi > lo ? (int32_t)hi : 0;
}

/* Split s of micro-batch k (slot c), paused where a routed transfer needs
 * this rank: after the node that makes its ids (ask), before the first node
 * that reads its experts (take). */
static enum bt_status compute_split(bt_dist *d, struct bt_graph *view, int s, int c, int64_t k) {
    if (d->n_routed_dst == 0 && d->n_chain_home == 0) return compute_range(d, view);
    for (int i = 0; i < d->n_chains; i++) { /* home's columns of a SwiGLU between products (all: the callback) */
        const struct gchain *ch = &d->chains[i];
        if (ch->me != 0 || ch->split != s || !ch->glu) continue;
        ch->x->col_lo = d->eval_cb ? 0 : (int32_t)ch->lo[0];
        ch->x->col_hi = d->eval_cb ? 0 : (int32_t)ch->hi[0];
    }
    int j = 0;
    for (;;) {
        /* the next pause: the smallest position; at one position, asks first */
        struct xfer *next = NULL;
        int at = view->n_nodes + 1;
        bool ask = false;
        for (int x = 0; x < d->n_xfers; x++) {
            struct xfer *xf = &d->xfers[x];
            if (!xf->routed || xf->dst != d->rank) continue;
            if (xf->ids_split == s && xf->asked_k[c] != k && (xf->ids_at + 1 < at || (xf->ids_at + 1 == at && !ask)))
                next = xf, at = xf->ids_at + 1, ask = true;
            if (xf->consumer == s && xf->asked_k[c] == k && xf->taken_k[c] != k && xf->use_at < at)
                next = xf, at = xf->use_at, ask = false;
        }
        /* or an expert group's chain, run whole: sent out, this rank's rows, taken back */
        struct gchain *chain = NULL;
        for (int i = 0; i < d->n_chains; i++) {
            struct gchain *ch = &d->chains[i];
            if (ch->me == 0 && ch->split == s && ch->done_k[c] != k && ch->first < at) chain = ch, at = ch->first;
        }
        if (!next && !chain) break;
        struct bt_graph part = bt_graph_view(view, j, at);
        enum bt_status st = compute_range(d, &part);
        const double p0 = bt_now_s();
        if (st == BT_OK && chain) {
            bool alone = false; /* an attention home computes whole this time (attn_tell) */
            if (chain->attn && chain->told_k[c] == k) alone = chain->divided_k[c] != k;
            else if (chain->attn) st = attn_tell(d, chain, c, k, &alone);
            if (st == BT_OK && chain->q_to >= 0) { /* the attention that keeps its heads, told now */
                bool a_alone;
                st = attn_tell(d, &d->chains[chain->q_to], c, k, &a_alone);
                q_heads(&d->chains[chain->q_to], !a_alone && !d->eval_cb);
            }
            if (st == BT_OK && !alone) st = chain->rows ? row_send(d, chain, c, k) : chain_send(d, chain, c);
            const double t1 = bt_now_s();
            struct bt_graph rows = bt_graph_view(view, chain->first, chain->last + 1);
            const int32_t head_lo = chain->out->row_lo, head_hi = chain->out->row_hi;
            if (alone) chain->out->row_lo = chain->out->row_hi = 0;
            if (chain->cols && !(chain->local && d->eval_cb)) /* (its columns; local: all for the callback) */
                chain->out->col_lo = (int32_t)chain->lo[0], chain->out->col_hi = (int32_t)chain->hi[0];
            if (!chain->rows) chain_compute_experts(chain, chain->lo[0], chain->hi[0]);
            if (!chain->rows) chain_glu_rows(chain, chain->lo[0], chain->hi[0], true);
            if (!chain->rows) chain_mask_ids(chain, c, true);
            rows_of_whole(chain, true);
            if (st == BT_OK) st = compute_nodes(d, &rows);
            rows_of_whole(chain, false);
            if (!chain->rows) chain_mask_ids(chain, c, false);
            if (!chain->rows) chain_compute_experts(chain, chain->hold_lo[0], chain->hold_hi[0]);
            if (!chain->rows) chain_glu_rows(chain, 0, 0, false);
            chain->out->row_lo = head_lo;
            chain->out->row_hi = head_hi;
            chain->out->col_lo = chain->out->col_hi = 0;
            const double t2 = bt_now_s();
            if (!chain->rows) d->stats.expert_s += t2 - t1;
            d->stats.attn_divided += chain->attn && !alone;
            if (chain->q_kept) q_heads(chain, false);
            if (st == BT_OK && alone) chain->done_k[c] = k;
            else if (st == BT_OK) st = chain->rows ? row_take(d, chain, c, k) : chain_take(d, chain, c, k);
            d->paused_s += (t1 - p0) + (bt_now_s() - t2);
            /* the eval callback sees the chain's result whole */
            if (st == BT_OK && d->eval_cb && d->eval_cb(chain->out, true, d->eval_user) &&
                !d->eval_cb(chain->out, false, d->eval_user))
                st = fail(d, BT_ERR_ABORTED, "stopped by the eval callback after node '%s'", chain->out->name);
            if (st != BT_OK) return st;
            j = chain->last + 1;
            continue;
        }
        if (st == BT_OK) st = ask ? routed_ask(d, next, c, k) : routed_take(d, next, c, k, s);
        d->paused_s += bt_now_s() - p0;
        if (st != BT_OK) return st;
        j = at;
    }
    struct bt_graph rest = bt_graph_view(view, j, view->n_nodes);
    return compute_range(d, &rest);
}

void bt_dist_set_eval_callback(bt_dist *d, bt_sched_eval_callback cb, void *user) {
    d->eval_cb = cb;
    d->eval_user = user;
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
    if (k == 0) d->wall_start = bt_now_s();
    bt_sched_set_cur_copy(d->sched, c);
    enum bt_status st = BT_OK;
    for (int i = 0; i < d->n_lins && st == BT_OK; i++)
        if (d->lins[i].set_k[c] != k)
            st = fail(d, BT_ERR_INVALID,
                      "rank %d reads graph input '%s' but it was not set for micro-batch %lld: every rank sets every "
                      "input (bt_dist_set_input) before each submit",
                      d->rank, d->lins[i].tensor->name, (long long)k);

    /* the device transport's receives of micro-batch k, now and in transfer
     * order: it matches by posting order alone, and posting each
     * micro-batch's as it starts keeps both ends of every edge in the order
     * of the micro-batches, whichever runtimes over the transport submit
     * them (a model's shapes each have one) */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->direct && xf->dst == d->rank && xf->consumer >= 0) st = post_recv(d, xf, c, k);
    }
    /* rank 0: the outputs of micro-batch k land in slot c */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst != d->rank || xf->consumer >= 0) continue;
        if (xf->recv[c].active) st = wait_req(d, xf, &xf->recv[c]);
        if (st == BT_OK) st = post_recv(d, xf, c, k);
    }
    /* leafs other ranks read (a weight pinned away from its readers; graph
     * inputs never travel); routed ones once their reader says which experts */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->src == d->rank && xf->producer < 0 && !xf->routed) st = send_xfer(d, xf, c);
    }
    if (st == BT_OK && d->n_routed_src > 0) st = routed_expect(d, c);
    const int n_splits = bt_sched_get_n_splits(d->sched);
    for (int s = 0; s < n_splits && st == BT_OK; s++) {
        const struct bt_sched_split *sp = bt_sched_get_split(d->sched, s);
        /* a member's part of an expert group's chains in this split, in order */
        for (int i = 0; i < d->n_chains && st == BT_OK; i++)
            if (d->chains[i].me > 0 && d->chains[i].split == s)
                st = d->chains[i].rows ? row_serve(d, &d->chains[i], c, k) : chain_serve(d, &d->chains[i], c, k);
        if (sp->backend_id != d->rank || st != BT_OK) continue;
        const double t0 = bt_now_s();
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->dst == d->rank && xf->consumer == s && !xf->routed) {
                const double w0 = bt_now_s();
                st = wait_req(d, xf, &xf->recv[c]);
                if (st == BT_OK) d->stats.bytes_recv += (int64_t)xf->bytes;
                /* the upload runs in the backend's stream, before the split;
                 * the split's compute (synchronous) finishes it before the
                 * slot takes its next receive */
                if (st == BT_OK && xf->ring[c])
                    st = bt_staging_from_host(d->backend, xf->copies[c], d->host_buf, slot_offset(d, xf->ring[c]),
                                              d->err, sizeof d->err);
                if (d->trace) trace_add(d, BT_TRACE_WAIT, w0, bt_now_s(), k, s, xf->src, (int64_t)xf->bytes);
            }
        }
        /* tensors this split makes and sends from their own memory: the
         * previous micro-batch's sends must be done before they are rewritten */
        const double ts = bt_now_s();
        for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
            struct xfer *xf = &d->xfers[x];
            if (xf->src != d->rank || xf->producer != s || !xf->zero_copy) continue;
            for (int cc = 0; cc < d->n_copies && st == BT_OK; cc++)
                if (xf->send[cc].active) st = wait_req(d, xf, &xf->send[cc]);
        }
        const double t1 = bt_now_s();
        d->stats.wait_s += ts - t0;
        d->stats.send_s += t1 - ts;
        if (st != BT_OK) break;
        struct bt_graph view = sp->graph;
        const double paused = d->paused_s;
        st = compute_split(d, &view, s, c, k);
        const double t2 = bt_now_s();
        d->stats.compute_s += t2 - t1 - (d->paused_s - paused); /* its pauses are waits and sends */
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
    /* the experts asked for in micro-batch k, before it ends here: the rank
     * that asks may wait for them while this one would wait for its caller */
    if (st == BT_OK && d->n_serving > 0) st = serve_routed(d, true);
    /* slot c is free again (its splits have run, uploads included): post
     * the receives of micro-batch k + n_copies */
    for (int x = 0; x < d->n_xfers && st == BT_OK; x++) {
        struct xfer *xf = &d->xfers[x];
        if (xf->dst == d->rank && xf->consumer >= 0 && !xf->direct && !xf->routed)
            st = post_recv(d, xf, c, k + d->n_copies);
    }
    if (st != BT_OK) die(d, st);
    d->k_next++;
    d->stats.micro_batches++;
    return BT_OK;
}

int64_t bt_dist_n_submitted(const bt_dist *d) { return d->k_next; }

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
            const double t0 = bt_now_s();
            enum bt_status st = wait_req(d, xf, &xf->recv[c]);
            d->stats.wait_s += bt_now_s() - t0;
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
            if (st == BT_OK && xf->dst == d->rank && xf->used_req[c].active &&
                bt_transport_wait(d->t, &xf->used_req[c]) != BT_OK)
                st = fail(d, BT_ERR_COMM, "%s", d->t->error);
            if (st == BT_OK && xf->dst == d->rank && xf->consumer < 0 && xf->recv[c].active) {
                const double t0 = bt_now_s();
                st = wait_req(d, xf, &xf->recv[c]);
                d->stats.wait_s += bt_now_s() - t0;
                if (st == BT_OK) d->stats.bytes_recv += (int64_t)xf->bytes;
            }
        }
    }
    for (int i = 0; i < d->n_chains && st == BT_OK; i++)
        for (int q = 0; d->chains[i].me == 0 && q < d->n_copies * d->chains[i].n_ranks && st == BT_OK; q++)
            st = chain_wait(d, &d->chains[i].slots[q].ids_req);
    for (int m = 0; m < d->n_gbufs && st == BT_OK; m++) {
        st = chain_wait(d, &d->gbufs[m].x_req);
        if (st == BT_OK && d->n_chain_home == 0) st = chain_wait(d, &d->gbufs[m].o_req);
    }
    bt_backend_synchronize(d->backend);
    if (d->wall_start > 0) d->stats.wall_s = bt_now_s() - d->wall_start;
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
    d->wall_start = bt_now_s();
}

enum bt_status bt_dist_gather_stats(bt_dist *d, struct bt_dist_stats *out) {
    struct bt_dist_stats s = bt_dist_local_stats(d);
    enum bt_status st = d->t->iface.gather(d->t, &s, sizeof s, out, 0);
    return st == BT_OK ? BT_OK : fail(d, st, "%s", d->t->error);
}

const struct bt_plan *bt_dist_get_plan(const bt_dist *d) { return d->planned ? &d->plan : NULL; }

void bt_dist_print_plan(const bt_dist *d, FILE *f) {
    if (d->planned) bt_plan_print(&d->plan, d->graph, f);
}
