/* plan.c - the distributed plan as a value (see plan.h): placement of the
 * layers, the splitter over one stand-in backend per rank, the transfers and
 * their order, which transfers use the device transport, the plan in words,
 * and the plan as bytes for its broadcast. */
#include "plan.h"
#include "mem.h"

#include <fnmatch.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "backend-impl.h"
#include "baton/ops.h"
#include "place.h"

/* ---- stand-in backends: the splitter's view of the ranks ---------------------- */

struct proxy {
    struct bt_plan_splitter *s;
    int rank;
    char name[24];
};

struct bt_plan_splitter {
    struct bt_graph *graph;
    int n_ranks;
    int64_t *slot_index;    /* visited-set slot -> node index (>= 0) or -(leaf index + 1) */
    const uint8_t *support; /* [n_ranks][n_nodes] or NULL: every rank runs every op */
    struct bt_backend *proxies;
    struct bt_buffer_type *bufts;
    struct proxy *ctx;
    bt_sched_t sched;
};

static int node_index(const struct bt_plan_splitter *s, const struct bt_tensor *t) {
    const struct bt_hash_set *hs = &s->graph->visited;
    const size_t i = bt_hash_find(hs, t);
    if (i == BT_HASHSET_FULL || hs->keys[i] != t) return INT32_MIN;
    return (int)s->slot_index[i];
}

static const char *proxy_name(bt_backend_t b) { return ((struct proxy *)b->context)->name; }
static void proxy_free(bt_backend_t b) { (void)b; }
static bt_buffer_type_t proxy_buft(bt_backend_t b) {
    struct proxy *p = b->context;
    return &p->s->bufts[p->rank];
}
static enum bt_status proxy_compute(bt_backend_t b, struct bt_graph *g) {
    (void)b;
    (void)g;
    return BT_ERR_UNSUPPORTED; /* planning only */
}
static bool proxy_supports_op(bt_backend_t b, const struct bt_tensor *op) {
    struct proxy *p = b->context;
    const int i = node_index(p->s, op);
    if (i < 0 || !p->s->support) return true; /* leafs, the splitter's own tensors; pinned plans */
    return p->s->support[(size_t)p->rank * (size_t)p->s->graph->n_nodes + (size_t)i] != 0;
}
static bool proxy_supports_buft(bt_backend_t b, bt_buffer_type_t buft) { return buft == proxy_buft(b); }
static const char *proxy_buft_name(bt_buffer_type_t buft) { return ((struct proxy *)buft->context)->name; }
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
    /* .get_memory              = */ NULL,
    /* .set_node_hook           = */ NULL,
    /* .describe                = */ NULL,
    /* .get_weight_buffer_type  = */ NULL,
};

static const struct bt_buffer_type_i proxy_buft_i = {
    /* .get_name       = */ proxy_buft_name,
    /* .alloc_buffer   = */ proxy_buft_alloc,
    /* .get_alignment  = */ proxy_buft_align,
    /* .get_max_size   = */ NULL,
    /* .get_alloc_size = */ NULL,
    /* .is_host        = */ NULL,
};

void bt_plan_splitter_free(bt_plan_splitter *s) {
    if (!s) return;
    bt_sched_free(s->sched); /* restores the graph's sources */
    BT_FREE_ALL(s->slot_index, s->proxies, s->bufts, s->ctx, s);
}

/* The splitter for graph on n_ranks stand-ins (nothing pinned yet). */
static bt_plan_splitter *splitter_new(struct bt_graph *graph, int n_ranks, int n_copies, const uint8_t *support,
                                      char *err, size_t errlen) {
    bt_plan_splitter *s = calloc(1, sizeof *s);
    if (!s) {
        bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    s->graph = graph;
    s->n_ranks = n_ranks;
    s->support = support;
    s->slot_index = malloc(sizeof(int64_t) * (graph->visited.size ? graph->visited.size : 1));
    s->proxies = calloc((size_t)n_ranks, sizeof *s->proxies);
    s->bufts = calloc((size_t)n_ranks, sizeof *s->bufts);
    s->ctx = calloc((size_t)n_ranks, sizeof *s->ctx);
    bt_backend_t *list = malloc(sizeof *list * (size_t)n_ranks);
    if (!s->slot_index || !s->proxies || !s->bufts || !s->ctx || !list) {
        free(list);
        bt_plan_splitter_free(s);
        bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < graph->n_nodes; i++) s->slot_index[bt_hash_find(&graph->visited, graph->nodes[i])] = i;
    for (int i = 0; i < graph->n_leafs; i++)
        s->slot_index[bt_hash_find(&graph->visited, graph->leafs[i])] = -(int64_t)i - 1;
    for (int r = 0; r < n_ranks; r++) {
        s->ctx[r] = (struct proxy){s, r, ""};
        snprintf(s->ctx[r].name, sizeof s->ctx[r].name, "rank%d", r);
        s->bufts[r].iface = proxy_buft_i;
        s->bufts[r].context = &s->ctx[r];
        s->proxies[r].iface = proxy_i;
        s->proxies[r].context = &s->ctx[r];
        list[r] = &s->proxies[r];
    }
    char why[256];
    const enum bt_status st =
        bt_sched_new(list, NULL, n_ranks, (size_t)(graph->n_nodes + graph->n_leafs) + 64, n_copies, &s->sched, why,
                     sizeof why);
    free(list);
    if (st != BT_OK) {
        bt_plan_splitter_free(s);
        bt_error_printf(err, errlen, st, "the splitter for %d ranks: %s", n_ranks, why);
        return NULL;
    }
    return s;
}

/* The splitter over the stand-ins.  Where a tensor already lies (a weight or
 * a cache that a runtime allocated for an earlier plan, on its owner only:
 * the other ranks see no memory there) is the owners' business, not the
 * splitter's: it splits as if nothing were allocated, so that every rank
 * derives the same splits from the same graph. */
static enum bt_status split_unallocated(bt_plan_splitter *s, struct bt_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_leafs; i++) n += g->leafs[i]->buffer != NULL;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i]->buffer != NULL;
    struct bt_tensor **held = n ? malloc(sizeof *held * (size_t)n) : NULL;
    bt_buffer_t *bufs = n ? malloc(sizeof *bufs * (size_t)n) : NULL;
    if (n && (!held || !bufs)) {
        free(held);
        free(bufs);
        return BT_ERR_NOMEM;
    }
    int k = 0;
    for (int i = 0; i < g->n_leafs + g->n_nodes; i++) {
        struct bt_tensor *t = i < g->n_leafs ? g->leafs[i] : g->nodes[i - g->n_leafs];
        if (!t->buffer) continue;
        held[k] = t;
        bufs[k++] = t->buffer;
        t->buffer = NULL;
    }
    const enum bt_status st = bt_sched_split_graph(s->sched, g);
    for (int i = 0; i < k; i++) held[i]->buffer = bufs[i];
    free(held);
    free(bufs);
    return st;
}

/* Split with every node and leaf pinned to its owner: every rank derives the
 * same splits from the same owners. */
static enum bt_status split_pinned(bt_plan_splitter *s, const int32_t *node_owner, const int32_t *leaf_owner,
                                   char *err, size_t errlen) {
    struct bt_graph *g = s->graph;
    for (int i = 0; i < g->n_leafs; i++) bt_sched_set_tensor_backend(s->sched, g->leafs[i], &s->proxies[leaf_owner[i]]);
    for (int i = 0; i < g->n_nodes; i++) bt_sched_set_tensor_backend(s->sched, g->nodes[i], &s->proxies[node_owner[i]]);
    enum bt_status st = split_unallocated(s, g);
    if (st != BT_OK) return bt_error_printf(err, errlen, st, "splitter: %s", bt_sched_error(s->sched));
    return BT_OK;
}

bt_plan_splitter *bt_plan_splitter_new(const struct bt_plan *p, struct bt_graph *graph, char *err, size_t errlen) {
    if (graph->n_nodes != p->n_nodes || graph->n_leafs != p->n_leafs || graph->visited.size == 0) {
        bt_error_printf(err, errlen, BT_ERR_MISMATCH, "the plan is for %d nodes and %d leafs, the graph has %d and %d", p->n_nodes,
             p->n_leafs, graph->n_nodes, graph->n_leafs);
        return NULL;
    }
    bt_plan_splitter *s = splitter_new(graph, p->n_ranks, p->n_copies, NULL, err, errlen);
    if (!s) return NULL;
    if (split_pinned(s, p->node_owner, p->leaf_owner, err, errlen) != BT_OK) {
        bt_plan_splitter_free(s);
        return NULL;
    }
    /* the same owners give the same splits: anything else is a different graph */
    const int n = bt_sched_get_n_splits(s->sched);
    bool same = n == p->n_splits;
    for (int i = 0; same && i < n; i++) {
        const struct bt_sched_split *sp = bt_sched_get_split(s->sched, i);
        same = sp->backend_id == p->splits[i].rank && sp->i_start == p->splits[i].i_start &&
               sp->i_end == p->splits[i].i_end;
    }
    if (!same) {
        bt_error_printf(err, errlen, BT_ERR_MISMATCH, "the graph gives %d splits where the plan has %d: not the graph it was made for",
             n, p->n_splits);
        bt_plan_splitter_free(s);
        return NULL;
    }
    return s;
}

bt_sched_t bt_plan_splitter_sched(bt_plan_splitter *s) { return s->sched; }

int bt_plan_splitter_index(const bt_plan_splitter *s, const struct bt_tensor *t) { return node_index(s, t); }

struct bt_tensor *bt_plan_tensor(const struct bt_graph *graph, int32_t index) {
    return index >= 0 ? graph->nodes[index] : graph->leafs[-index - 1];
}

/* ---- the plan ------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Ranks on the same kind of backend measure slightly different speeds from
 * run to run (other processes, turbo); a plan should not change with that
 * noise.  Speeds within 25% of the median of their backend kind become that
 * median; a rank really faster or slower keeps its own figure. */
static enum bt_status smooth_speeds(struct bt_rank_desc *descs, int P) {
    double *v = malloc(sizeof(double) * (size_t)P);
    double *med = malloc(sizeof(double) * (size_t)P);
    if (!v || !med) {
        free(v);
        free(med);
        return BT_ERR_NOMEM;
    }
    for (int r = 0; r < P; r++) {
        int n = 0;
        for (int q = 0; q < P; q++)
            if (!strcmp(descs[q].backend, descs[r].backend)) v[n++] = descs[q].gflops;
        qsort(v, (size_t)n, sizeof *v, cmp_double);
        med[r] = v[n / 2];
    }
    for (int r = 0; r < P; r++)
        if (descs[r].gflops > 0.8 * med[r] && descs[r].gflops < 1.25 * med[r]) descs[r].gflops = med[r];
    free(v);
    free(med);
    return BT_OK;
}

/* Placement, then the owner of every node and leaf (the five passes with the
 * weights and inputs pinned). */
static enum bt_status place(struct bt_plan *p, struct bt_graph *g, const uint8_t *support,
                            const struct bt_plan_options *opt) {
    struct bt_layer_costs lc;
    char err[256] = "";
    enum bt_status st = bt_layer_costs_make(g, &lc, err, sizeof err);
    if (st != BT_OK) {
        bt_layer_costs_free(&lc);
        return bt_error_printf(p->error, sizeof p->error, st, "planning: %s", err);
    }
    p->n_layers = lc.L;
    int *first = malloc(sizeof(int) * (size_t)p->n_ranks), *last = malloc(sizeof(int) * (size_t)p->n_ranks);
    st = first && last ? smooth_speeds(p->ranks, p->n_ranks) : BT_ERR_NOMEM;
    if (st != BT_OK) bt_error_printf(p->error, sizeof p->error, st, "out of memory");
    if (st == BT_OK) {
        st = bt_place_layers(&lc, p->ranks, p->n_ranks, opt, first, last, p->predicted_s, err, sizeof err);
        if (st != BT_OK) bt_error_printf(p->error, sizeof p->error, st, "placement: %s", err);
    }
    for (int r = 0; st == BT_OK && r < p->n_ranks; r++) {
        p->layer_first[r] = first[r];
        p->layer_last[r] = last[r];
    }
    bt_plan_splitter *s = st == BT_OK ? splitter_new(g, p->n_ranks, p->n_copies, support, err, sizeof err) : NULL;
    if (st == BT_OK && !s) st = bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "%s", err);
    /* where the weights before the first layer and after the last go */
    int head_rank = p->n_ranks - 1, tail_rank = 0;
    if (st == BT_OK && opt->ends_with_layers) {
        for (int r = p->n_ranks - 1; r >= 0; r--)
            if (first[r] >= 0) tail_rank = r;
        for (int r = 0; r < p->n_ranks; r++)
            if (first[r] >= 0) head_rank = r;
    }
    /* weights by layer (or pin), inputs owned by rank 0; a pinned weight
     * whose ops run with it: its rank, in pinned_at (else -1) */
    int32_t *pinned_at = st == BT_OK ? malloc(sizeof(int32_t) * (size_t)(g->n_leafs + g->n_nodes + 1)) : NULL;
    if (st == BT_OK && !pinned_at) st = bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "out of memory");
    for (int i = 0; st == BT_OK && i < g->n_leafs; i++) {
        struct bt_tensor *t = g->leafs[i];
        int owner = -1;
        const int wl = lc.weight_layer[i];
        pinned_at[i] = -1;
        if (wl != INT32_MIN) {
            owner = wl >= lc.L ? head_rank : wl < 0 ? tail_rank : bt_place_rank_of_layer(wl, first, last, p->n_ranks);
            for (int k = 0; k < opt->n_pins; k++)
                if (fnmatch(opt->pins[k].pattern, t->name, 0) == 0) {
                    owner = opt->pins[k].rank;
                    pinned_at[i] = opt->pins[k].compute_at_layer ? -1 : owner;
                }
        } else if (t->flags & BT_TENSOR_FLAG_INPUT) {
            owner = 0;
        }
        if (owner >= 0) bt_sched_set_tensor_backend(s->sched, t, &s->proxies[owner]);
    }
    /* the ops that run with pinned weights: those that read one, and the
     * weightless ops between them (every source one of these, through
     * views): a layer's expert products and the activation between them
     * (gate, up, swiglu, down) stay on the experts' rank together; what
     * reads anything else (the routing weights, the residual) runs on the
     * layer's rank */
    int32_t *node_pinned = pinned_at ? pinned_at + g->n_leafs : NULL;
    for (int i = 0; st == BT_OK && i < g->n_nodes; i++) {
        const struct bt_tensor *t = g->nodes[i];
        int direct = -1, via = -1; /* a pinned weight read; a pinned op's result read */
        bool others = false;       /* another op's result, or an unpinned weight */
        for (int j = 0; j < BT_MAX_SRC; j++) {
            const struct bt_tensor *src = t->src[j];
            if (!src) continue; /* an optional source (FLASH_ATTN's mask) may come before another */
            while (src->view_src && bt_op_is_view(src->op)) src = src->view_src;
            const int k = node_index(s, src);
            if (k == INT32_MIN) continue;
            const int a = k >= 0 ? node_pinned[k] : pinned_at[-k - 1];
            if (k < 0 && a >= 0) direct = a;
            else if (k >= 0 && a >= 0) via = a;
            else if (k >= 0 || bt_tensor_is_weight(src)) others = true;
        }
        node_pinned[i] = direct >= 0 ? direct : via >= 0 && !others ? via : -1;
    }
    /* a node named for a layer runs on that layer's rank where the rank can
     * run it: the next layer's weightless first op (its rms_norm) does not
     * stay behind on the previous rank, so a boundary carries one activation
     * (views follow their sources in pass 4) */
    for (int i = 0; st == BT_OK && i < g->n_nodes; i++) {
        struct bt_tensor *t = g->nodes[i];
        const int l = bt_dist_name_layer(t->name);
        if (l < 0 || bt_op_is_view(t->op)) continue;
        const int owner = node_pinned[i] >= 0 ? node_pinned[i] : bt_place_rank_of_layer(l, first, last, p->n_ranks);
        if (!support || support[(size_t)owner * (size_t)g->n_nodes + (size_t)i])
            bt_sched_set_tensor_backend(s->sched, t, &s->proxies[owner]);
    }
    free(pinned_at);
    free(first);
    free(last);
    bt_layer_costs_free(&lc);
    if (st == BT_OK) {
        st = split_unallocated(s, g);
        if (st != BT_OK) bt_error_printf(p->error, sizeof p->error, st, "splitter: %s", bt_sched_error(s->sched));
    }
    for (int i = 0; st == BT_OK && i < g->n_leafs; i++) {
        const int o = bt_sched_get_backend_id(s->sched, g->leafs[i]);
        p->leaf_owner[i] = o < 0 ? 0 : o; /* an unused leaf: rank 0 */
    }
    for (int i = 0; st == BT_OK && i < g->n_nodes; i++) p->node_owner[i] = bt_sched_get_backend_id(s->sched, g->nodes[i]);
    bt_plan_splitter_free(s);
    return st;
}

static int owner_of(const struct bt_plan *p, const bt_plan_splitter *s, const struct bt_tensor *t, int32_t *index) {
    const int i = node_index(s, t);
    if (i == INT32_MIN) return -1;
    *index = i;
    return i >= 0 ? p->node_owner[i] : p->leaf_owner[-i - 1];
}

static int split_of_node(const struct bt_plan *p, int i) {
    for (int s = 0; s < p->n_splits; s++)
        if (i >= p->splits[s].i_start && i < p->splits[s].i_end) return s;
    return -1;
}

static enum bt_status add_transfer(struct bt_plan *p, const bt_plan_splitter *s, struct bt_tensor *t, int dst,
                                   int consumer, int *cap) {
    int32_t index = 0;
    const int src = owner_of(p, s, t, &index);
    if (src < 0)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "tensor '%s' is read across ranks but is not in the graph",
                    t->name);
    if (p->n_transfers == *cap) {
        const int nc = *cap ? 2 * *cap : 64;
        struct bt_plan_transfer *nx = realloc(p->transfers, sizeof *nx * (size_t)nc);
        if (!nx) return bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "out of memory");
        p->transfers = nx;
        *cap = nc;
    }
    const struct bt_tensor *base = t->view_src ? t->view_src : t;
    const int bi = node_index(s, base);
    const size_t bytes = bt_nbytes(t);
    if (bytes > (size_t)INT32_MAX)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_CAPACITY,
                    "tensor '%s' (%zu bytes) needs a transfer from rank %d to rank %d larger than 2 GiB: use smaller "
                    "micro-batches",
                    t->name, bytes, src, dst);
    p->transfers[p->n_transfers++] = (struct bt_plan_transfer){
        .tensor = index,
        .src = src,
        .dst = dst,
        .producer = bi >= 0 ? split_of_node(p, bi) : -1,
        .consumer = consumer,
        .tag0 = p->n_transfers, /* found order, the tie-break of the sort */
        .bytes = (int64_t)bytes,
    };
    return BT_OK;
}

/* A graph input (a leaf, not a weight): set on every rank that reads it,
 * never sent. */
static bool set_where_read(const bt_plan_splitter *s, const struct bt_tensor *t) {
    return (t->flags & BT_TENSOR_FLAG_INPUT) && !bt_tensor_is_weight(t) && node_index(s, t) < 0 &&
           node_index(s, t) != INT32_MIN;
}

static enum bt_status add_input(struct bt_plan *p, const bt_plan_splitter *s, struct bt_tensor *t, int rank,
                                int consumer, int *cap) {
    const int32_t index = node_index(s, t);
    for (int i = 0; i < p->n_inputs; i++)
        if (p->inputs[i].tensor == index && p->inputs[i].rank == rank) return BT_OK;
    if (p->n_inputs == *cap) {
        const int nc = *cap ? 2 * *cap : 16;
        struct bt_plan_input *ni = realloc(p->inputs, sizeof *ni * (size_t)nc);
        if (!ni) return bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "out of memory");
        p->inputs = ni;
        *cap = nc;
    }
    p->inputs[p->n_inputs++] =
        (struct bt_plan_input){.tensor = index, .rank = rank, .consumer = consumer, .bytes = (int64_t)bt_nbytes(t)};
    return BT_OK;
}

/* Transfers in the order their data is made: by producing split (leafs,
 * -1, first), then as found.  A rank sends in split order and posts its
 * receives in transfer order, so on every edge both ends post in the same
 * order, which a transport without tags (NCCL) needs.  Tags follow. */
static int cmp_transfer(const void *a, const void *b) {
    const struct bt_plan_transfer *x = a, *y = b;
    if (x->producer != y->producer) return x->producer < y->producer ? -1 : 1;
    return x->tag0 < y->tag0 ? -1 : x->tag0 > y->tag0;
}

/* The one rule for the device transport: a tensor one split computes for
 * another split (not an input or output), between two ranks that both have
 * a device transport, on an edge the options allow. */
static bool goes_direct(const struct bt_plan *p, const struct bt_plan_transfer *x, const uint8_t *edges) {
    return x->producer >= 0 && x->consumer >= 0 && p->ranks[x->src].device && p->ranks[x->dst].device &&
           (!edges || edges[(size_t)x->src * (size_t)p->n_ranks + (size_t)x->dst]);
}

static enum bt_status find_transfers(struct bt_plan *p, const bt_plan_splitter *s, const uint8_t *edges) {
    bt_sched_t sched = s->sched;
    struct bt_graph *g = s->graph;
    int cap = 0, icap = 0;
    for (int k = 0; k < p->n_splits; k++) {
        const struct bt_sched_split *sp = bt_sched_get_split(sched, k);
        for (int j = 0; j < sp->n_inputs; j++) {
            enum bt_status st = set_where_read(s, sp->inputs[j])
                                    ? add_input(p, s, sp->inputs[j], sp->backend_id, k, &icap)
                                    : add_transfer(p, s, sp->inputs[j], sp->backend_id, k, &cap);
            if (st != BT_OK) return st;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        if (!(g->nodes[i]->flags & BT_TENSOR_FLAG_OUTPUT) || p->node_owner[i] == 0) continue;
        enum bt_status st = add_transfer(p, s, g->nodes[i], 0, -1, &cap);
        if (st != BT_OK) return st;
    }
    if (p->n_transfers > 1) qsort(p->transfers, (size_t)p->n_transfers, sizeof *p->transfers, cmp_transfer); /* NULL with none */
    for (int x = 0; x < p->n_transfers; x++) {
        p->transfers[x].tag0 = x * p->n_copies;
        p->transfers[x].direct = goes_direct(p, &p->transfers[x], edges);
    }
    return BT_OK;
}

void bt_plan_free(struct bt_plan *p) {
    BT_FREE_ALL(p->ranks, p->node_owner, p->leaf_owner, p->layer_first, p->layer_last, p->predicted_s, p->splits,
                p->transfers, p->inputs);
    p->inputs = NULL;
    p->ranks = NULL;
    p->node_owner = p->leaf_owner = p->layer_first = p->layer_last = NULL;
    p->predicted_s = NULL;
    p->splits = NULL;
    p->transfers = NULL;
    p->n_splits = p->n_transfers = p->n_inputs = 0;
}

/* Arrays of a plan with the counts already set. */
static enum bt_status plan_alloc(struct bt_plan *p) {
    const size_t P = (size_t)p->n_ranks;
    p->ranks = calloc(P, sizeof *p->ranks);
    p->node_owner = malloc(sizeof(int32_t) * ((size_t)p->n_nodes + 1));
    p->leaf_owner = malloc(sizeof(int32_t) * ((size_t)p->n_leafs + 1));
    p->layer_first = malloc(sizeof(int32_t) * P);
    p->layer_last = malloc(sizeof(int32_t) * P);
    p->predicted_s = calloc(P, sizeof(double));
    p->splits = malloc(sizeof *p->splits * ((size_t)p->n_splits + 1));
    p->transfers = malloc(sizeof *p->transfers * ((size_t)p->n_transfers + 1));
    p->inputs = malloc(sizeof *p->inputs * ((size_t)p->n_inputs + 1));
    if (!p->ranks || !p->node_owner || !p->leaf_owner || !p->layer_first || !p->layer_last || !p->predicted_s ||
        !p->splits || !p->transfers || !p->inputs)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "out of memory for the plan");
    return BT_OK;
}

enum bt_status bt_plan_make(struct bt_plan *p, struct bt_graph *graph, const struct bt_rank_desc *ranks, int n_ranks,
                            const uint8_t *support, const struct bt_plan_options *opt) {
    const double t0 = bt_now_s();
    memset(p, 0, sizeof *p);
    static const struct bt_plan_options none;
    if (!opt) opt = &none;
    if (graph->visited.size == 0)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "the plan needs a full graph, not a view");
    if (n_ranks < 1 || n_ranks > BT_PLAN_MAX_RANKS)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_CAPACITY, "%d ranks: 1 to %d are supported (BT_PLAN_MAX_RANKS)",
                    n_ranks, BT_PLAN_MAX_RANKS);
    const int n_copies = opt->n_copies > 0 ? opt->n_copies : 2;
    if (n_copies > BT_SCHED_MAX_COPIES)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "n_copies %d: 1 to %d are supported", n_copies,
                    BT_SCHED_MAX_COPIES);
    if (opt->n_groups > 0) {
        char gerr[256];
        if (bt_expert_groups_check(opt->groups, opt->n_groups, n_ranks, gerr, sizeof gerr) != BT_OK)
            return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "%s", gerr);
    }
    for (int k = 0; k < opt->n_pins; k++)
        if (opt->pins[k].rank < 0 || opt->pins[k].rank >= n_ranks)
            return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "pin '%s' names rank %d of %d", opt->pins[k].pattern,
                        opt->pins[k].rank, n_ranks);
    p->n_ranks = n_ranks;
    p->n_copies = n_copies;
    p->n_nodes = graph->n_nodes;
    p->n_leafs = graph->n_leafs;
    p->graph_hash = bt_graph_hash(graph);
    enum bt_status st = plan_alloc(p);
    if (st != BT_OK) goto fail;
    memcpy(p->ranks, ranks, sizeof *p->ranks * (size_t)n_ranks);
    for (int r = 0; r < n_ranks; r++) p->ranks[r].backend[sizeof p->ranks[r].backend - 1] = '\0';

    st = place(p, graph, support, opt);
    if (st != BT_OK) goto fail;
    /* the splits every rank re-derives from the owners, and their transfers */
    char err[512];
    bt_plan_splitter *s = splitter_new(graph, n_ranks, n_copies, NULL, err, sizeof err);
    if (!s) {
        st = bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "%s", err);
        goto fail;
    }
    st = split_pinned(s, p->node_owner, p->leaf_owner, p->error, sizeof p->error);
    if (st == BT_OK) {
        const int n = bt_sched_get_n_splits(s->sched);
        struct bt_plan_split *ns = realloc(p->splits, sizeof *ns * ((size_t)n + 1));
        if (!ns) st = bt_error_printf(p->error, sizeof p->error, BT_ERR_NOMEM, "out of memory");
        else {
            p->splits = ns;
            p->n_splits = n;
            for (int i = 0; i < n; i++) {
                const struct bt_sched_split *sp = bt_sched_get_split(s->sched, i);
                p->splits[i] = (struct bt_plan_split){sp->backend_id, sp->i_start, sp->i_end};
            }
        }
    }
    if (st == BT_OK) st = find_transfers(p, s, opt->device_edges);
    bt_plan_splitter_free(s);
    if (st != BT_OK) goto fail;
    p->seconds = bt_now_s() - t0;
    return BT_OK;
fail:;
    char keep[sizeof p->error];
    memcpy(keep, p->error, sizeof keep);
    bt_plan_free(p);
    memcpy(p->error, keep, sizeof keep);
    return st;
}

/* ---- expert groups ------------------------------------------------------------------ */

void bt_expert_share(int64_t n_expert, int n, int i, int64_t *lo, int64_t *hi) {
    *lo = n_expert * i / n;
    *hi = n_expert * (i + 1) / n;
}

void bt_expert_hold(int64_t n_expert, int n, int i, int overlap, int64_t *lo, int64_t *hi) {
    bt_expert_share(n_expert, n, i, lo, hi);
    *lo = *lo > overlap ? *lo - overlap : 0;
    *hi = *hi + overlap < n_expert ? *hi + overlap : n_expert;
}

void bt_row_share(int64_t m, int n, int i, int64_t *lo, int64_t *hi) {
    const int64_t units = (m + BT_ROW_UNIT - 1) / BT_ROW_UNIT;
    *lo = units * i / n * BT_ROW_UNIT;
    *hi = units * (i + 1) / n * BT_ROW_UNIT;
    if (*lo > m) *lo = m;
    if (*hi > m) *hi = m;
}

/* Whether w is read in g, and only as the weight of MUL_MATs of an F32
 * input into a contiguous F32 result: the input contiguous, or with heads
 * an input of w's matrices with packed rows. */
static bool only_product_weight(const struct bt_graph *g, const struct bt_tensor *w, bool heads) {
    int readers = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *o = g->nodes[i];
        for (int k = 0; k < BT_MAX_SRC; k++) {
            if (o->src[k] != w) continue;
            const struct bt_tensor *x = o->src[1];
            const bool x_ok = heads ? x->nb[0] == sizeof(float) && x->ne[2] == w->ne[2] && x->ne[3] == 1
                                    : bt_is_contiguous(x);
            if (o->op != BT_OP_MUL_MAT || k != 0 || x->type != BT_TYPE_F32 || !x_ok || o->type != BT_TYPE_F32 ||
                !bt_is_contiguous(o))
                return false;
            readers++;
        }
    }
    return readers > 0;
}

bool bt_row_divisible(const struct bt_graph *g, const struct bt_tensor *w, int n) {
    if (!w || !bt_tensor_is_weight(w) || w->view_src || w->ne[2] != 1 || w->ne[3] != 1 || !bt_is_contiguous(w) ||
        w->ne[1] < (int64_t)BT_ROW_UNIT * n || w->ne[1] > INT32_MAX)
        return false;
    return only_product_weight(g, w, false);
}

bool bt_expert_bias(const struct bt_graph *g, const struct bt_tensor *w) {
    if (!w || !bt_tensor_is_weight(w) || w->view_src || w->ne[2] != 1 || w->ne[3] != 1 || !bt_is_contiguous(w))
        return false;
    int readers = 0;
    bool experts = false;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *o = g->nodes[i];
        experts |= o->op == BT_OP_MUL_MAT_ID && o->src[0]->ne[2] == w->ne[1];
        for (int k = 0; k < BT_MAX_SRC; k++) {
            if (o->src[k] != w) continue;
            if (o->op != BT_OP_GET_ROWS || k != 0) return false;
            readers++;
        }
    }
    return readers > 0 && experts;
}

bool bt_group_on_cpu(const struct bt_plan *p, const struct bt_expert_group *grp) {
    for (int m = 0; m < grp->n_ranks; m++)
        if (strncmp(p->ranks[grp->ranks[m]].backend, "CPU", 3) != 0) return false;
    return true;
}

bool bt_head_divisible(const struct bt_plan *p, const struct bt_expert_group *grp, const struct bt_graph *g,
                       const struct bt_tensor *w) {
    if (!grp->dense || !w || !bt_tensor_is_weight(w) || w->view_src || w->ne[2] < grp->n_ranks || w->ne[3] != 1 ||
        w->ne[2] > INT32_MAX || !bt_is_contiguous(w) || !bt_group_on_cpu(p, grp))
        return false;
    return only_product_weight(g, w, true);
}

int bt_expert_group_of(const struct bt_expert_group *groups, int n_groups, int r, int *member) {
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < groups[g].n_ranks; i++)
            if (groups[g].ranks[i] == r) {
                if (member) *member = i;
                return g;
            }
    if (member) *member = -1;
    return -1;
}

enum bt_status bt_expert_groups_check(const struct bt_expert_group *groups, int n_groups, int n_ranks, char *err,
                                      size_t errlen) {
    for (int g = 0; g < n_groups; g++) {
        const struct bt_expert_group *x = &groups[g];
        if (x->n_ranks < 2 || x->n_ranks > BT_EXPERT_GROUP_MAX)
            return bt_error_printf(err, errlen, BT_ERR_INVALID, "expert group %d has %d ranks: 2 to %d are supported",
                                   g, x->n_ranks, BT_EXPERT_GROUP_MAX);
        for (int i = 0; i < x->n_ranks; i++) {
            const int r = x->ranks[i];
            if (r < 0 || r >= n_ranks)
                return bt_error_printf(err, errlen, BT_ERR_INVALID, "expert group %d names rank %d of %d", g, r,
                                       n_ranks);
            int at = -1;
            const int first = bt_expert_group_of(groups, n_groups, r, &at);
            if (first != g || at != i)
                return bt_error_printf(err, errlen, BT_ERR_INVALID,
                                       "rank %d is in expert group %d and again in group %d: a rank is in one group",
                                       r, first, g);
            if (r == 0 && i > 0)
                return bt_error_printf(err, errlen, BT_ERR_INVALID,
                                       "expert group %d has rank 0 as a member, not first: rank 0 runs the model's first "
                                       "layers, so it must be the first rank of its group",
                                       g);
        }
    }
    return BT_OK;
}

/* ---- the plan in words ------------------------------------------------------------ */

/* Every boundary (src -> dst, in the order of its first transfer) with the
 * tensors and bytes it carries per micro-batch, then the inputs set where
 * they are read. */
static void print_boundaries(const struct bt_plan *p, const struct bt_graph *g, FILE *f) {
    fprintf(f, "  boundaries, per micro-batch:\n");
    for (int x = 0; x < p->n_transfers; x++) {
        const struct bt_plan_transfer *t = &p->transfers[x];
        bool first = true;
        for (int y = 0; y < x && first; y++) first = p->transfers[y].src != t->src || p->transfers[y].dst != t->dst;
        if (!first) continue;
        int n = 0;
        int64_t bytes = 0;
        for (int y = x; y < p->n_transfers; y++) {
            if (p->transfers[y].src != t->src || p->transfers[y].dst != t->dst) continue;
            n++;
            bytes += p->transfers[y].bytes;
        }
        fprintf(f, "    rank %d -> %d: %d tensor%s, %.1f KiB (", t->src, t->dst, n, n == 1 ? "" : "s",
                (double)bytes / 1024.0);
        int shown = 0;
        for (int y = x; y < p->n_transfers && shown < 3; y++)
            if (p->transfers[y].src == t->src && p->transfers[y].dst == t->dst)
                fprintf(f, "%s%s", shown++ ? ", " : "", bt_plan_tensor(g, p->transfers[y].tensor)->name);
        fprintf(f, "%s)%s\n", n > shown ? ", ..." : "", t->direct ? " device to device" : "");
    }
    if (p->n_inputs > 0) {
        int64_t bytes = 0;
        for (int i = 0; i < p->n_inputs; i++) bytes += p->inputs[i].bytes;
        fprintf(f, "  graph inputs a rank other than their owner reads, set there (not sent): %d, %.1f KiB\n",
                p->n_inputs, (double)bytes / 1024.0);
    }
}

void bt_plan_print(const struct bt_plan *p, const struct bt_graph *g, FILE *f) {
    const int P = p->n_ranks;
    int n_direct = 0;
    for (int x = 0; x < p->n_transfers; x++) n_direct += p->transfers[x].direct;
    fprintf(f, "plan: %d ranks, %d splits, %d transfers per micro-batch", P, p->n_splits, p->n_transfers);
    if (n_direct > 0) fprintf(f, " (%d device to device)", n_direct);
    fprintf(f, ", %d micro-batches in flight\n", p->n_copies);
    int *nodes = calloc((size_t)P, sizeof(int)), *splits = calloc((size_t)P, sizeof(int));
    double *wbytes = calloc((size_t)P, sizeof(double)), *in_bytes = calloc((size_t)P, sizeof(double));
    if (!nodes || !splits || !wbytes || !in_bytes) {
        fprintf(f, "  (out of memory for the per-rank table)\n");
    } else {
        for (int i = 0; i < g->n_nodes; i++)
            if (!bt_op_is_view(g->nodes[i]->op)) nodes[p->node_owner[i]]++;
        for (int i = 0; i < g->n_leafs; i++)
            if (bt_tensor_is_weight(g->leafs[i])) wbytes[p->leaf_owner[i]] += (double)bt_nbytes(g->leafs[i]);
        for (int s = 0; s < p->n_splits; s++) splits[p->splits[s].rank]++;
        for (int x = 0; x < p->n_transfers; x++) in_bytes[p->transfers[x].dst] += (double)p->transfers[x].bytes;
        for (int r = 0; r < P; r++) {
            fprintf(f, "  rank %d (%s, %.1f GFLOP/s): layers ", r, p->ranks[r].backend, p->ranks[r].gflops);
            if (p->layer_first[r] >= 0) fprintf(f, "%d-%d", p->layer_first[r], p->layer_last[r]);
            else fprintf(f, "none");
            fprintf(f, ", %d splits, %d nodes, weights %.2f MiB, receives %.1f KiB per micro-batch", splits[r], nodes[r],
                    wbytes[r] / 1048576.0, in_bytes[r] / 1024.0);
            fprintf(f, ", predicted stage %.3f ms\n", p->predicted_s[r] * 1e3);
        }
    }
    BT_FREE_ALL(nodes, splits, wbytes, in_bytes);
    print_boundaries(p, g, f);
}

void bt_plan_dump(const struct bt_plan *p, FILE *f) {
    fprintf(f, "plan ranks %d copies %d layers %d nodes %d leafs %d splits %d transfers %d inputs %d graph %016llx\n",
            p->n_ranks, p->n_copies, p->n_layers, p->n_nodes, p->n_leafs, p->n_splits, p->n_transfers, p->n_inputs,
            (unsigned long long)p->graph_hash);
    for (int r = 0; r < p->n_ranks; r++)
        fprintf(f, "rank %d layers %d %d\n", r, p->layer_first[r], p->layer_last[r]);
    for (int s = 0; s < p->n_splits; s++)
        fprintf(f, "split %d rank %d nodes %d %d\n", s, p->splits[s].rank, p->splits[s].i_start, p->splits[s].i_end);
    for (int x = 0; x < p->n_transfers; x++) {
        const struct bt_plan_transfer *t = &p->transfers[x];
        fprintf(f, "transfer %d tensor %d %d->%d producer %d consumer %d tag %d bytes %lld direct %d\n", x, t->tensor,
                t->src, t->dst, t->producer, t->consumer, t->tag0, (long long)t->bytes, t->direct);
    }
    for (int i = 0; i < p->n_inputs; i++)
        fprintf(f, "input %d tensor %d rank %d consumer %d bytes %lld\n", i, p->inputs[i].tensor, p->inputs[i].rank,
                p->inputs[i].consumer, (long long)p->inputs[i].bytes);
    fprintf(f, "leaf owners");
    for (int i = 0; i < p->n_leafs; i++) fprintf(f, " %d", p->leaf_owner[i]);
    fprintf(f, "\nnode owners");
    for (int i = 0; i < p->n_nodes; i++) fprintf(f, " %d", p->node_owner[i]);
    fprintf(f, "\n");
}

/* ---- the plan as bytes -------------------------------------------------------------- */

struct plan_header {
    int32_t n_ranks, n_copies, n_layers, n_nodes, n_leafs, n_splits, n_transfers, n_inputs;
    uint64_t graph_hash;
    double seconds;
};

static size_t packed_size(const struct plan_header *h) {
    const size_t P = (size_t)h->n_ranks;
    return sizeof *h + P * sizeof(struct bt_rank_desc) + sizeof(int32_t) * ((size_t)h->n_nodes + (size_t)h->n_leafs + 2 * P) +
           sizeof(double) * P + sizeof(struct bt_plan_split) * (size_t)h->n_splits +
           sizeof(struct bt_plan_transfer) * (size_t)h->n_transfers + sizeof(struct bt_plan_input) * (size_t)h->n_inputs;
}

#define PACK_ARRAYS(X)                                                                                  \
    X(p->ranks, sizeof(struct bt_rank_desc) * (size_t)h.n_ranks)                                       \
    X(p->node_owner, sizeof(int32_t) * (size_t)h.n_nodes)                                              \
    X(p->leaf_owner, sizeof(int32_t) * (size_t)h.n_leafs)                                              \
    X(p->layer_first, sizeof(int32_t) * (size_t)h.n_ranks)                                             \
    X(p->layer_last, sizeof(int32_t) * (size_t)h.n_ranks)                                              \
    X(p->predicted_s, sizeof(double) * (size_t)h.n_ranks)                                              \
    X(p->splits, sizeof(struct bt_plan_split) * (size_t)h.n_splits)                                    \
    X(p->transfers, sizeof(struct bt_plan_transfer) * (size_t)h.n_transfers)                          \
    X(p->inputs, sizeof(struct bt_plan_input) * (size_t)h.n_inputs)

enum bt_status bt_plan_pack(const struct bt_plan *p, void **buf, size_t *size) {
    const struct plan_header h = {p->n_ranks, p->n_copies, p->n_layers, p->n_nodes, p->n_leafs,
                                  p->n_splits, p->n_transfers, p->n_inputs, p->graph_hash, p->seconds};
    *size = packed_size(&h);
    uint8_t *b = malloc(*size);
    *buf = b;
    if (!b) return BT_ERR_NOMEM;
    memcpy(b, &h, sizeof h);
    b += sizeof h;
#define PUT(ptr, n)                   \
    if ((n) != 0) memcpy(b, (ptr), (n)); \
    b += (n);
    PACK_ARRAYS(PUT)
#undef PUT
    return BT_OK;
}

enum bt_status bt_plan_unpack(struct bt_plan *p, const void *buf, size_t size, const struct bt_graph *graph) {
    memset(p, 0, sizeof *p);
    struct plan_header h;
    if (size < sizeof h) return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "a plan of %zu bytes is truncated", size);
    memcpy(&h, buf, sizeof h);
    if (h.n_ranks < 1 || h.n_ranks > BT_PLAN_MAX_RANKS || h.n_copies < 1 || h.n_copies > BT_SCHED_MAX_COPIES ||
        h.n_nodes != graph->n_nodes || h.n_leafs != graph->n_leafs || h.n_splits < 0 || h.n_transfers < 0 ||
        h.n_splits > graph->n_nodes + 1 || h.n_transfers > INT32_MAX / 16 || h.n_inputs < 0 ||
        h.n_inputs > INT32_MAX / 16 || packed_size(&h) != size)
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID,
                    "the plan (%d ranks, %d nodes, %d leafs, %d splits, %d transfers, %zu bytes) does not fit this "
                    "graph (%d nodes, %d leafs)",
                    h.n_ranks, h.n_nodes, h.n_leafs, h.n_splits, h.n_transfers, size, graph->n_nodes, graph->n_leafs);
    p->n_ranks = h.n_ranks;
    p->n_copies = h.n_copies;
    p->n_layers = h.n_layers;
    p->n_nodes = h.n_nodes;
    p->n_leafs = h.n_leafs;
    p->n_splits = h.n_splits;
    p->n_transfers = h.n_transfers;
    p->n_inputs = h.n_inputs;
    p->graph_hash = h.graph_hash;
    p->seconds = h.seconds;
    enum bt_status st = plan_alloc(p);
    if (st != BT_OK) {
        bt_plan_free(p);
        return st;
    }
    const uint8_t *b = (const uint8_t *)buf + sizeof h;
#define GET(ptr, n)                  \
    if ((n) != 0) memcpy((ptr), b, (n)); \
    b += (n);
    PACK_ARRAYS(GET)
#undef GET
    /* every index is checked before the runtime uses it */
    bool ok = true;
    for (int i = 0; ok && i < p->n_nodes; i++) ok = p->node_owner[i] >= 0 && p->node_owner[i] < p->n_ranks;
    for (int i = 0; ok && i < p->n_leafs; i++) ok = p->leaf_owner[i] >= 0 && p->leaf_owner[i] < p->n_ranks;
    for (int s = 0; ok && s < p->n_splits; s++)
        ok = p->splits[s].rank >= 0 && p->splits[s].rank < p->n_ranks && p->splits[s].i_start >= 0 &&
             p->splits[s].i_start <= p->splits[s].i_end && p->splits[s].i_end <= p->n_nodes;
    for (int x = 0; ok && x < p->n_transfers; x++) {
        const struct bt_plan_transfer *t = &p->transfers[x];
        ok = t->tensor >= -p->n_leafs && t->tensor < p->n_nodes && t->src >= 0 && t->src < p->n_ranks && t->dst >= 0 &&
             t->dst < p->n_ranks && t->producer >= -1 && t->producer < p->n_splits && t->consumer >= -1 &&
             t->consumer < p->n_splits && t->bytes >= 0 && t->bytes <= INT32_MAX && t->tag0 >= 0;
    }
    for (int i = 0; ok && i < p->n_inputs; i++) {
        const struct bt_plan_input *in = &p->inputs[i];
        ok = in->tensor >= -p->n_leafs && in->tensor < 0 && in->rank >= 0 && in->rank < p->n_ranks &&
             in->consumer >= 0 && in->consumer < p->n_splits && in->bytes >= 0;
    }
    for (int r = 0; r < p->n_ranks; r++) p->ranks[r].backend[sizeof p->ranks[r].backend - 1] = '\0';
    if (!ok) {
        bt_plan_free(p);
        return bt_error_printf(p->error, sizeof p->error, BT_ERR_INVALID, "the plan holds an index out of range");
    }
    return BT_OK;
}
