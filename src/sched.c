/* sched.c - the multi-backend scheduler: the splitter's five passes (as in
 * ggml_backend_sched_split_graph), the graph copy with split inputs, and the
 * local executor (ggml_backend_sched_compute_splits) with the n_copies ring,
 * events, the eval callback and the MoE "copy only the used experts" path.
 *
 * Differences from ggml, on purpose:
 *  - the plan is kept while the same graph is submitted again: a micro-batch
 *    only advances the copy slot and re-points the rewritten sources, so
 *    planning and allocation happen once per graph, not once per micro-batch;
 *  - user inputs keep one fixed address (ggml rotates them through the ring
 *    too); the executor synchronises before a user input is copied, as ggml;
 *  - an op that no backend supports is an error returned to the caller, not
 *    an abort;
 *  - the MoE partial copy applies when every consumer of the expert weights
 *    in the split is a MUL_MAT_ID with the same ids (ggml looks only at the
 *    split's first node); a later split of the same backend whose MUL_MAT_ID
 *    reads that copy copies its own experts again (ggml reuses the copy);
 *  - the user's graph holds rewritten sources only while compute queues the
 *    splits (ggml leaves them rewritten): a new plan never writes into an
 *    earlier graph, which the user may have freed;
 *  - a weight is recognised by its buffer's usage or, without a buffer, by
 *    BT_TENSOR_FLAG_WEIGHT with an assigned backend, so that rank 0 can plan
 *    for weights that live in other processes.
 */
#include "baton/sched.h"
#include "mem.h"

#include <string.h>

#include "baton/alloc.h"
#include "baton/ops.h"

struct rewrite {
    struct bt_tensor *node;
    int src_index;
    struct bt_tensor *orig; /* the source before rewriting */
    int backend_id;         /* the split backend whose copy replaces it */
};

struct split_extra {
    bool recopy[BT_SCHED_MAX_SPLIT_INPUTS];
};

struct bt_sched {
    int n_backends;
    bt_backend_t *backends;   /* [n_backends] */
    bt_buffer_type_t *bufts;  /* [n_backends] */
    bt_gallocr_t galloc;

    /* per graph tensor (hashed): backend id, cause, and the index of its
     * block of copies ([n_backends][n_copies] in `copies`, -1: none).  Only
     * split inputs have copies: a block per tensor that has any keeps the
     * memory in proportion to the inputs, not to tensors x backends (a plan
     * for 256 ranks would otherwise take hundreds of MiB). */
    struct bt_hash_set hash_set;
    int *hv_backend_ids;
    uint8_t *hv_user; /* 1: the user's assignment, kept across plans */
    const char **hv_cause;
    int32_t *hv_copy_block;
    struct bt_tensor **copies;
    int n_copy_blocks, copy_blocks_capacity;

    /* the graph copy: split inputs and nodes, with per-entry backend ids */
    struct bt_graph graph;
    int *node_backend_ids;
    int *leaf_backend_ids;
    int graph_capacity;

    struct bt_sched_split *splits;
    int n_splits, splits_capacity;

    struct rewrite *rewrites;
    int n_rewrites, rewrites_capacity;
    /* the planned graph's sources point at copies now (between a
     * bt_sched_split_graph or bt_sched_set_cur_copy and the next call that
     * puts them back); every other call leaves the user's sources in place */
    bool rewritten;

    /* per split: inputs copied again (an expert tensor an earlier split of
     * the same backend copied with only its own experts) */
    struct split_extra *split_extra;

    int n_copies;
    int cur_copy;
    bool first_alloc; /* the next alloc_graph uses slot 0 */
    bt_event_t *events; /* [n_backends * n_copies]: backend b, slot c at b * n_copies + c */

    bt_context *ctx; /* copies and dependency views (metadata only) */
    size_t ctx_size;

    struct bt_graph *planned; /* the graph the plan is for */
    uint64_t planned_hash;
    struct bt_tensor **planned_tensors; /* its nodes, then its leafs, as planned */
    int planned_n_nodes, planned_n_leafs;
    size_t planned_capacity;
    int n_placed; /* of those, placed by the allocator (BT_TENSOR_FLAG_SCHED) */
    bool is_allocated; /* memory placed for the plan */
    bool slot_ready;   /* alloc_graph done for the next compute */

    bt_sched_eval_callback callback_eval;
    void *callback_eval_user_data;

    struct bt_sched_stats stats;
    int debug;
    char err[512];
};

#define SET_CAUSE(t, c) (sched->hv_cause[hash_id(sched, (t))] = (c))

/* The scheduler's last error (bt_sched_error). */
#define set_error(sched, ...) (void)bt_error_printf((sched)->err, sizeof (sched)->err, BT_ERR_INVALID, __VA_ARGS__)

static size_t hash_id(bt_sched_t sched, const struct bt_tensor *t) {
    const size_t i = bt_hash_insert(&sched->hash_set, (struct bt_tensor *)t);
    BT_ASSERT(i != BT_HASHSET_FULL); /* sized for graph_size tensors at creation */
    return i;
}

static int *tensor_backend_id_ptr(bt_sched_t sched, const struct bt_tensor *t) {
    return &sched->hv_backend_ids[hash_id(sched, t)];
}
#define tensor_backend_id(t) (*tensor_backend_id_ptr(sched, (t)))

/* The copy of tensor `id` for backend_id in slot c (NULL when none). */
static struct bt_tensor *copy_get(bt_sched_t sched, size_t id, int backend_id, int c) {
    const int32_t blk = sched->hv_copy_block[id];
    if (blk < 0) return NULL;
    return sched->copies[((size_t)blk * (size_t)sched->n_backends + (size_t)backend_id) * (size_t)sched->n_copies +
                         (size_t)c];
}

/* Record a copy; false when out of memory for a new block. */
static bool copy_set(bt_sched_t sched, size_t id, int backend_id, int c, struct bt_tensor *cpy) {
    const size_t per = (size_t)sched->n_backends * (size_t)sched->n_copies;
    if (sched->hv_copy_block[id] < 0) {
        if (sched->n_copy_blocks == sched->copy_blocks_capacity) {
            const int cap = sched->copy_blocks_capacity ? 2 * sched->copy_blocks_capacity : 64;
            struct bt_tensor **nc = realloc(sched->copies, sizeof *nc * per * (size_t)cap);
            if (!nc) return false;
            sched->copies = nc;
            sched->copy_blocks_capacity = cap;
        }
        memset(sched->copies + per * (size_t)sched->n_copy_blocks, 0, sizeof *sched->copies * per);
        sched->hv_copy_block[id] = sched->n_copy_blocks++;
    }
    sched->copies[(size_t)sched->hv_copy_block[id] * per + (size_t)backend_id * (size_t)sched->n_copies + (size_t)c] =
        cpy;
    return true;
}

static bt_event_t *event_slot(bt_sched_t sched, int b, int c) { return &sched->events[b * sched->n_copies + c]; }

/* ---- creation ------------------------------------------------------------ */

enum bt_status bt_sched_new(bt_backend_t *backends, bt_buffer_type_t *bufts, int n_backends, size_t graph_size,
                            int n_copies, bt_sched_t *out, char *err, size_t n_err) {
    *out = NULL;
    if (n_backends < 1 || n_backends > BT_SCHED_MAX_BACKENDS)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "scheduler: %d backends (1 to %d allowed)", n_backends,
                        BT_SCHED_MAX_BACKENDS);
    if (n_copies < 1 || n_copies > BT_SCHED_MAX_COPIES)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "scheduler: n_copies = %d (1 to %d allowed)", n_copies,
                        BT_SCHED_MAX_COPIES);
    if (graph_size < 1 || graph_size > (1u << 26))
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "scheduler: graph size %zu (1 to %u allowed)", graph_size, 1u << 26);
    bt_sched_t sched = calloc(1, sizeof *sched);
    if (!sched) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "scheduler: out of memory");
    sched->n_backends = n_backends;
    sched->n_copies = n_copies;
    sched->backends = calloc((size_t)n_backends, sizeof *sched->backends);
    sched->bufts = calloc((size_t)n_backends, sizeof *sched->bufts);
    sched->events = calloc((size_t)n_backends * (size_t)n_copies, sizeof *sched->events);
    if (!sched->backends || !sched->bufts || !sched->events) {
        bt_sched_free(sched);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "scheduler: out of memory for %d backends", n_backends);
    }
    for (int b = 0; b < n_backends; b++) {
        sched->backends[b] = backends[b];
        sched->bufts[b] = bufts && bufts[b] ? bufts[b] : bt_backend_get_default_buffer_type(backends[b]);
        if (!bt_backend_supports_buft(backends[b], sched->bufts[b])) {
            const enum bt_status st = bt_error_printf(err, n_err, BT_ERR_INVALID,
                                               "scheduler: backend %s does not support buffer type %s",
                                               bt_backend_name(backends[b]), bt_buft_name(sched->bufts[b]));
            bt_sched_free(sched);
            return st;
        }
    }
    /* graph tensors: up to graph_size nodes and graph_size leafs, plus views */
    sched->hash_set.size = bt_hash_size(graph_size * 4 + 64);
    sched->hash_set.keys = calloc(sched->hash_set.size, sizeof(struct bt_tensor *));
    sched->hv_backend_ids = malloc(sched->hash_set.size * sizeof(int));
    sched->hv_cause = calloc(sched->hash_set.size, sizeof(char *));
    sched->hv_user = calloc(sched->hash_set.size, 1);
    sched->hv_copy_block = malloc(sched->hash_set.size * sizeof(int32_t));
    sched->splits_capacity = 16;
    sched->splits = calloc((size_t)sched->splits_capacity, sizeof *sched->splits);
    sched->split_extra = calloc((size_t)sched->splits_capacity, sizeof *sched->split_extra);
    sched->galloc = bt_gallocr_new_n(sched->bufts, n_backends);
    sched->ctx_size = bt_tensor_overhead() * (graph_size * (size_t)(n_copies + 2) + 1024);
    if (!sched->hash_set.keys || !sched->hv_backend_ids || !sched->hv_cause || !sched->hv_user || !sched->hv_copy_block ||
        !sched->splits || !sched->split_extra || !sched->galloc) {
        bt_sched_free(sched);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "scheduler: out of memory for a graph of %zu nodes", graph_size);
    }
    memset(sched->hv_backend_ids, -1, sched->hash_set.size * sizeof(int));
    memset(sched->hv_copy_block, -1, sched->hash_set.size * sizeof(int32_t));
    for (int b = 0; b < n_backends; b++)
        for (int c = 0; c < n_copies; c++) *event_slot(sched, b, c) = bt_event_new(backends[b]);
    sched->first_alloc = true;
    const char *dbg = getenv("BATON_SCHED_DEBUG");
    sched->debug = dbg ? atoi(dbg) : 0;
    *out = sched;
    return BT_OK;
}

/* Put the user's sources back where the planned graph holds rewritten ones.
 * Only then is the planned graph written to: after bt_sched_alloc_graph,
 * bt_sched_graph_compute and bt_sched_reserve the sources are the user's, so
 * a plan never writes into a graph the user may have freed since. */
static void restore_sources(bt_sched_t sched) {
    if (!sched->rewritten) return;
    for (int i = sched->n_rewrites - 1; i >= 0; i--) {
        struct rewrite *r = &sched->rewrites[i];
        r->node->src[r->src_index] = r->orig;
    }
    sched->rewritten = false;
}

/* The graph about to be planned (the user's, alive) gets back the tensors an
 * earlier plan placed in the allocator's memory: a new plan starts from the
 * user's placements only.  Done here rather than when the earlier plan is
 * dropped, since by then its graph may be freed. */
static void take_back_memory(struct bt_graph *graph) {
    for (int pass = 0; pass < 2; pass++) {
        const int n = pass == 0 ? graph->n_nodes : graph->n_leafs;
        struct bt_tensor **list = pass == 0 ? graph->nodes : graph->leafs;
        for (int i = 0; i < n; i++) {
            struct bt_tensor *t = list[i];
            if (!(t->flags & BT_TENSOR_FLAG_SCHED)) continue;
            t->buffer = NULL;
            t->data = NULL;
            t->flags &= ~BT_TENSOR_FLAG_SCHED;
        }
    }
}

/* Mark the planned graph's tensors that the allocator placed. */
static void mark_placed(bt_sched_t sched, struct bt_graph *graph) {
    sched->n_placed = 0;
    for (int pass = 0; pass < 2; pass++) {
        const int n = pass == 0 ? graph->n_nodes : graph->n_leafs;
        struct bt_tensor **list = pass == 0 ? graph->nodes : graph->leafs;
        for (int i = 0; i < n; i++) {
            struct bt_tensor *t = list[i];
            if (!t->buffer) continue;
            for (int b = 0; b < sched->n_backends; b++) {
                if (t->buffer == bt_gallocr_get_buffer(sched->galloc, b)) {
                    t->flags |= BT_TENSOR_FLAG_SCHED;
                    sched->n_placed++;
                    break;
                }
            }
        }
    }
}

/* Drop the plan (copies forgotten), keep user assignments unless `all`.  The
 * planned graph is not touched unless it holds rewritten sources. */
static void drop_plan(bt_sched_t sched, bool all) {
    restore_sources(sched);
    sched->n_rewrites = 0;
    if (all) {
        memset(sched->hash_set.keys, 0, sched->hash_set.size * sizeof(struct bt_tensor *));
        memset(sched->hv_backend_ids, -1, sched->hash_set.size * sizeof(int));
        memset(sched->hv_cause, 0, sched->hash_set.size * sizeof(char *));
        memset(sched->hv_user, 0, sched->hash_set.size);
    }
    if (sched->hv_copy_block) memset(sched->hv_copy_block, -1, sched->hash_set.size * sizeof(int32_t));
    sched->n_copy_blocks = 0;
    sched->n_splits = 0;
    sched->planned = NULL;
    sched->planned_n_nodes = sched->planned_n_leafs = 0;
    sched->n_placed = 0;
    sched->is_allocated = false;
    sched->slot_ready = false;
    sched->first_alloc = true;
    bt_free(sched->ctx);
    sched->ctx = NULL;
}

void bt_sched_free(bt_sched_t sched) {
    if (!sched) return;
    drop_plan(sched, false);
    for (int b = 0; sched->events && b < sched->n_backends; b++)
        for (int c = 0; c < sched->n_copies; c++) bt_event_free(*event_slot(sched, b, c));
    if (sched->galloc) bt_gallocr_free(sched->galloc);
    BT_FREE_ALL(sched->hash_set.keys, sched->hv_backend_ids, sched->hv_cause, sched->hv_user, sched->hv_copy_block,
                sched->copies, sched->backends, sched->bufts, sched->events, sched->graph.nodes, sched->graph.leafs,
                sched->node_backend_ids, sched->leaf_backend_ids, sched->splits, sched->split_extra,
                sched->planned_tensors, sched->rewrites, sched);
}

void bt_sched_reset(bt_sched_t sched) { drop_plan(sched, true); }

static int backend_index(bt_sched_t sched, bt_backend_t backend) {
    for (int b = 0; b < sched->n_backends; b++)
        if (sched->backends[b] == backend) return b;
    return -1;
}

void bt_sched_set_tensor_backend(bt_sched_t sched, struct bt_tensor *t, bt_backend_t backend) {
    const int b = backend_index(sched, backend);
    BT_ASSERT(b >= 0);
    const size_t id = hash_id(sched, t);
    sched->hv_backend_ids[id] = b;
    sched->hv_user[id] = 1;
    sched->hv_cause[id] = "usr";
    /* a new assignment invalidates a plan made without it */
    if (sched->planned) drop_plan(sched, false);
}

int bt_sched_get_backend_id(bt_sched_t sched, const struct bt_tensor *t) {
    if (!bt_hash_contains(&sched->hash_set, t)) return -1;
    return sched->hv_backend_ids[bt_hash_find(&sched->hash_set, t)];
}

bt_backend_t bt_sched_get_tensor_backend(bt_sched_t sched, struct bt_tensor *t) {
    const int b = bt_sched_get_backend_id(sched, t);
    return b >= 0 ? sched->backends[b] : NULL;
}

/* ---- the splitter ---------------------------------------------------------- */

static bt_buffer_t tensor_buffer(const struct bt_tensor *t) {
    return t->view_src ? t->view_src->buffer : t->buffer;
}

/* The highest-priority backend that can use the tensor's buffer and run op. */
static int backend_from_buffer(bt_sched_t sched, const struct bt_tensor *t, const struct bt_tensor *op) {
    bt_buffer_t buf = tensor_buffer(t);
    if (!buf) return -1;
    for (int b = 0; b < sched->n_backends; b++)
        if (bt_backend_supports_buft(sched->backends[b], bt_buffer_get_type(buf)) && bt_backend_supports_op(sched->backends[b], op))
            return b;
    return -1;
}

static int backend_id_from_cur(bt_sched_t sched, struct bt_tensor *t) {
    int b = backend_from_buffer(sched, t, t);
    if (b != -1) return b;
    if (tensor_buffer(t)) {
        /* allocated where no backend can both read it and run its op: leave
         * it to later passes, which will copy it */
        return -1;
    }
    if (t->flags & BT_TENSOR_FLAG_INPUT) return sched->n_backends - 1; /* user inputs: the CPU */
    /* an op with weights runs where its weights are (rope's small tables excepted) */
    for (int j = 0; j < BT_MAX_SRC; j++) {
        const struct bt_tensor *src = t->src[j];
        if (!src || t->op == BT_OP_ROPE || !bt_tensor_is_weight(src)) continue;
        int sb = tensor_buffer(src) ? backend_from_buffer(sched, src, t) : bt_sched_get_backend_id(sched, src);
        if (sb == -1) continue;
        /* a higher-priority backend may want host weights' ops anyway */
        if (sb == sched->n_backends - 1 && tensor_buffer(src) && bt_buffer_is_host(tensor_buffer(src))) {
            for (int o = 0; o < sb; o++)
                if (bt_backend_supports_op(sched->backends[o], t) && bt_backend_offload_op(sched->backends[o], t))
                    return o;
        }
        return sb;
    }
    return -1;
}

static void set_if_supported(bt_sched_t sched, struct bt_tensor *node, int b, int *node_backend_id) {
    if (bt_backend_supports_op(sched->backends[b], node)) *node_backend_id = b;
}

/* Can backend b read t where t lives (its buffer, or the buffer type of the
 * backend it is assigned to)? */
static bool buffer_supported(bt_sched_t sched, const struct bt_tensor *t, int b) {
    bt_buffer_t buf = tensor_buffer(t);
    bt_buffer_type_t buft = NULL;
    if (buf) {
        buft = bt_buffer_get_type(buf);
    } else {
        int tb = bt_sched_get_backend_id(sched, t);
        if (tb == -1 && t->view_src) tb = bt_sched_get_backend_id(sched, t->view_src);
        if (tb != -1) buft = sched->bufts[tb];
    }
    return buft != NULL && bt_backend_supports_buft(sched->backends[b], buft);
}

/* May a copy of t hold only some of its experts (compute_splits' partial
 * copy: expert weights in host memory)? */
static bool may_copy_partially(const struct bt_tensor *t) {
    bt_buffer_t buf = tensor_buffer(t);
    return buf && bt_buffer_get_usage(buf) == BT_BUFFER_USAGE_WEIGHTS && bt_buffer_is_host(buf);
}

static bool split_has_input(const struct bt_sched_split *split, const struct bt_tensor *t) {
    for (int k = 0; k < split->n_inputs; k++)
        if (split->inputs[k] == t) return true;
    return false;
}

/* Does node's source j, which cur_backend reads from a copy an earlier split
 * made, need copying again?  Yes for the expert weights of a MUL_MAT_ID: the
 * earlier split may have copied only the experts its own ids chose. */
static bool needs_recopy(const struct bt_sched_split *split, const struct bt_tensor *node, int j) {
    return node->op == BT_OP_MUL_MAT_ID && j == 0 && may_copy_partially(node->src[j]) &&
           !split_has_input(split, node->src[j]);
}

static bool grow_splits(bt_sched_t sched) {
    if (sched->n_splits < sched->splits_capacity) return true;
    const int cap = sched->splits_capacity * 2;
    struct bt_sched_split *s = realloc(sched->splits, (size_t)cap * sizeof *s);
    if (!s) return false;
    sched->splits = s;
    struct split_extra *e = realloc(sched->split_extra, (size_t)cap * sizeof *e);
    if (!e) return false;
    sched->split_extra = e;
    sched->splits_capacity = cap;
    return true;
}

static bool add_rewrite(bt_sched_t sched, struct bt_tensor *node, int j, struct bt_tensor *orig, int b) {
    if (sched->n_rewrites == sched->rewrites_capacity) {
        const int cap = sched->rewrites_capacity ? 2 * sched->rewrites_capacity : 64;
        struct rewrite *r = realloc(sched->rewrites, (size_t)cap * sizeof *r);
        if (!r) return false;
        sched->rewrites = r;
        sched->rewrites_capacity = cap;
    }
    sched->rewrites[sched->n_rewrites++] = (struct rewrite){node, j, orig, b};
    return true;
}

/* Pass 5's copy of src for backend b: n_copies tensors with src's layout. */
static enum bt_status make_copies(bt_sched_t sched, struct bt_tensor *src, int b) {
    const size_t id = hash_id(sched, src);
    if (copy_get(sched, id, b, 0)) return BT_OK;
    for (int c = 0; c < sched->n_copies; c++) {
        struct bt_tensor *cpy = bt_dup_tensor_layout(sched->ctx, src);
        if (!cpy) {
            set_error(sched, "scheduler: %s", bt_context_error(sched->ctx));
            return BT_ERR_NOMEM;
        }
        bt_format_name(cpy, "%s#%s#%d", bt_backend_name(sched->backends[b]), src->name, c);
        if (sched->n_copies > 1) {
            /* each slot keeps its own memory: never reused by the allocator */
            bt_set_input(cpy);
            bt_set_output(cpy);
        }
        if (!copy_set(sched, id, b, c, cpy)) {
            set_error(sched, "scheduler: out of memory");
            return BT_ERR_NOMEM;
        }
    }
    return BT_OK;
}

static enum bt_status build_graph_copy(bt_sched_t sched, struct bt_graph *graph);

static enum bt_status split_graph(bt_sched_t sched, struct bt_graph *graph);

enum bt_status bt_sched_split_graph(bt_sched_t sched, struct bt_graph *graph) {
    const enum bt_status st = split_graph(sched, graph);
    if (st != BT_OK) {
        /* a failed plan leaves the user's graph as it was */
        restore_sources(sched);
        sched->n_rewrites = 0;
        sched->n_splits = 0;
        sched->planned = NULL;
    }
    return st;
}

/* A new plan starts from the user's assignments of this graph's tensors
 * only: the table is rebuilt, so tensors of earlier graphs (perhaps freed,
 * their addresses reused) neither fill it nor leave assignments behind. */
static enum bt_status keep_user_assignments(bt_sched_t sched, const struct bt_graph *graph) {
    const size_t n = sched->hash_set.size;
    struct bt_tensor **keep_t = malloc(sizeof *keep_t * n);
    int *keep_b = malloc(sizeof *keep_b * n);
    if (!keep_t || !keep_b) {
        free(keep_t);
        free(keep_b);
        set_error(sched, "scheduler: out of memory");
        return BT_ERR_NOMEM;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        struct bt_tensor *t = sched->hash_set.keys[i];
        if (!t || !sched->hv_user[i]) continue;
        const bool in_graph = graph->visited.size > 0 ? bt_hash_contains(&graph->visited, t)
                                                      : bt_graph_node_index(graph, t) >= 0;
        if (in_graph) {
            keep_t[kept] = t;
            keep_b[kept++] = sched->hv_backend_ids[i];
        }
    }
    memset(sched->hash_set.keys, 0, n * sizeof(struct bt_tensor *));
    memset(sched->hv_backend_ids, -1, n * sizeof(int));
    memset(sched->hv_cause, 0, n * sizeof(char *));
    memset(sched->hv_user, 0, n);
    for (size_t k = 0; k < kept; k++) {
        const size_t id = hash_id(sched, keep_t[k]);
        sched->hv_backend_ids[id] = keep_b[k];
        sched->hv_user[id] = 1;
        sched->hv_cause[id] = "usr";
    }
    free(keep_t);
    free(keep_b);
    return BT_OK;
}

/* pass 1: backends from pre-allocated tensors, inputs, and weights */
static void pass1_from_memory(bt_sched_t sched, struct bt_graph *graph) {
    for (int i = 0; i < graph->n_leafs; i++) {
        struct bt_tensor *leaf = graph->leafs[i];
        int *id = tensor_backend_id_ptr(sched, leaf);
        if (*id == -1) {
            *id = backend_id_from_cur(sched, leaf);
            if (*id != -1) SET_CAUSE(leaf, "1.leaf");
        }
    }
    for (int i = 0; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        int *id = tensor_backend_id_ptr(sched, node);
        if (*id == -1) {
            *id = backend_id_from_cur(sched, node);
            if (*id != -1) SET_CAUSE(node, "1.cur");
        }
    }
}

/* pass 2: expand assignments to neighbours, skipping views.
 * 2a/2b: non-CPU backends down then up (the CPU stops an expansion, so it
 * is used only where weights or unsupported ops put it); 2c/2d: the rest. */
static void pass2_expand(bt_sched_t sched, struct bt_graph *graph) {
    const int last = sched->n_backends - 1;
    for (int phase = 0; phase < 4; phase++) {
        const bool down = phase % 2 == 0;
        const bool gpu_only = phase < 2;
        int cur = -1;
        for (int k = 0; k < graph->n_nodes; k++) {
            const int i = down ? k : graph->n_nodes - 1 - k;
            struct bt_tensor *node = graph->nodes[i];
            if (bt_op_is_view(node->op)) continue;
            int *id = tensor_backend_id_ptr(sched, node);
            if (*id != -1) {
                cur = (gpu_only && *id == last) ? -1 : *id;
            } else if (cur != -1) {
                set_if_supported(sched, node, cur, id);
                if (*id != -1) SET_CAUSE(node, gpu_only ? (down ? "2.gpu.down" : "2.gpu.up") : (down ? "2.down" : "2.up"));
            }
        }
    }
}

/* pass 3: upgrade to a higher-priority backend with the same buffer type;
 * give unassigned nodes the backend that supports most of their inputs */
static void pass3_upgrade(bt_sched_t sched, struct bt_graph *graph) {
    for (int i = 0; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        if (bt_op_is_view(node->op)) continue;
        int *id = tensor_backend_id_ptr(sched, node);
        if (*id == -1) {
            int best = -1;
            for (int b = 0; b < sched->n_backends; b++) {
                if (!bt_backend_supports_op(sched->backends[b], node)) continue;
                int n_supported = 0;
                for (int j = 0; j < BT_MAX_SRC; j++) {
                    const struct bt_tensor *src = node->src[j];
                    if (!src) continue;
                    const bool assigned = bt_sched_get_backend_id(sched, src) != -1 ||
                                          (src->view_src && bt_sched_get_backend_id(sched, src->view_src) != -1);
                    if (assigned && buffer_supported(sched, src, b)) n_supported++;
                }
                if (n_supported > best) {
                    best = n_supported;
                    *id = b;
                    SET_CAUSE(node, "3.best");
                }
            }
        } else {
            for (int b = 0; b < *id; b++) {
                if (sched->bufts[b] != sched->bufts[*id] || !bt_backend_supports_op(sched->backends[b], node))
                    continue;
                bool ok = true;
                for (int j = 0; j < BT_MAX_SRC && ok; j++)
                    if (node->src[j] && !buffer_supported(sched, node->src[j], b)) ok = false;
                if (ok) {
                    *id = b;
                    SET_CAUSE(node, "3.upg");
                    break;
                }
            }
        }
    }
}

/* pass 4: sources and views follow their consumers and view sources */
static enum bt_status pass4_sources(bt_sched_t sched, struct bt_graph *graph) {
    for (int i = 0; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        int *cur = tensor_backend_id_ptr(sched, node);
        if (node->view_src && *cur == -1) {
            *cur = tensor_backend_id(node->view_src);
            SET_CAUSE(node, "4.vsrc");
        }
        for (int j = 0; j < BT_MAX_SRC; j++) {
            struct bt_tensor *src = node->src[j];
            if (!src) continue;
            int *sid = tensor_backend_id_ptr(sched, src);
            if (*sid == -1) {
                if (src->view_src) {
                    *sid = tensor_backend_id(src->view_src);
                    SET_CAUSE(src, "4.vsrc");
                } else {
                    *sid = *cur;
                    SET_CAUSE(src, "4.cur");
                }
            }
        }
        for (int b = 0; b < sched->n_backends && *cur == -1; b++) set_if_supported(sched, node, b, cur);
        if (*cur == -1) {
            set_error(sched, "node %d '%s' (%s %s [%lld, %lld, %lld, %lld]): no backend supports this op", i,
                      node->name, bt_op_name(node->op), bt_type_name(node->type), (long long)node->ne[0],
                      (long long)node->ne[1], (long long)node->ne[2], (long long)node->ne[3]);
            return BT_ERR_UNSUPPORTED;
        }
        /* a node the user allocated is written where it lies: the backend
         * that runs it must be able to use that memory (ggml aborts here) */
        if (!bt_op_is_view(node->op) && node->op != BT_OP_NONE && node->buffer &&
            !buffer_supported(sched, node, *cur)) {
            set_error(sched,
                      "node %d '%s' (%s) is allocated in a %s buffer, which %s, the backend that runs it, cannot "
                      "use, and no backend that can use it runs %s: leave the tensor to the scheduler or allocate "
                      "it where its op can run",
                      i, node->name, bt_op_name(node->op), bt_buft_name(bt_buffer_get_type(node->buffer)),
                      bt_backend_name(sched->backends[*cur]), bt_op_name(node->op));
            return BT_ERR_UNSUPPORTED;
        }
    }
    return BT_OK;
}

/* pass 5: cut splits; sources from incompatible backends become inputs */
static enum bt_status pass5_cut_splits(bt_sched_t sched, struct bt_graph *graph) {
    const int last = sched->n_backends - 1;
    sched->n_splits = 0;
    int i = 0;
    for (; i < graph->n_nodes && bt_op_is_view(graph->nodes[i]->op); i++) {
    }
    struct bt_sched_split *split = &sched->splits[0];
    *split = (struct bt_sched_split){.backend_id = i < graph->n_nodes ? tensor_backend_id(graph->nodes[i]) : last,
                                     .i_start = 0};
    memset(&sched->split_extra[0], 0, sizeof sched->split_extra[0]);
    sched->n_splits = 1;
    int cur_backend = split->backend_id;
    for (; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        if (bt_op_is_view(node->op)) continue;
        const int node_backend = tensor_backend_id(node);
        BT_ASSERT(node_backend != -1);

        bool need_new_split = false;
        if (node_backend == cur_backend && split->n_inputs > 0) {
            for (int j = 0; j < BT_MAX_SRC; j++) {
                const struct bt_tensor *src = node->src[j];
                if (!src) continue;
                /* a weight on an incompatible backend: a new split lets the
                 * memory of earlier copied weights be reused */
                if (bt_tensor_is_weight(src) && tensor_backend_id(src) != cur_backend &&
                    !buffer_supported(sched, src, cur_backend)) {
                    need_new_split = true;
                    break;
                }
            }
        }
        /* the sources this node would add as new inputs must fit the split */
        if (node_backend == cur_backend && !need_new_split) {
            int need = 0;
            for (int j = 0; j < BT_MAX_SRC; j++) {
                const struct bt_tensor *src = node->src[j];
                if (!src) continue;
                const size_t id = hash_id(sched, src);
                if (sched->hv_backend_ids[id] != cur_backend && !buffer_supported(sched, src, cur_backend) &&
                    (!copy_get(sched, id, cur_backend, 0) || needs_recopy(split, node, j)))
                    need++;
            }
            if (split->n_inputs + need > BT_SCHED_MAX_SPLIT_INPUTS) need_new_split = true;
        }
        if (node_backend != cur_backend || need_new_split) {
            split->i_end = i;
            if (!grow_splits(sched)) {
                set_error(sched, "scheduler: out of memory for splits");
                return BT_ERR_NOMEM;
            }
            memset(&sched->split_extra[sched->n_splits], 0, sizeof sched->split_extra[0]);
            split = &sched->splits[sched->n_splits++];
            *split = (struct bt_sched_split){.backend_id = node_backend, .i_start = i};
            cur_backend = node_backend;
        }

        for (int j = 0; j < BT_MAX_SRC; j++) {
            struct bt_tensor *src = node->src[j];
            if (!src) continue;
            const size_t src_id = hash_id(sched, src);
            const int src_backend = sched->hv_backend_ids[src_id];
            BT_ASSERT(src_backend != -1);
            if (src_backend == cur_backend || buffer_supported(sched, src, cur_backend)) continue;
            /* a source already copied to this backend (by this or an earlier
             * split) is read from that copy; expert weights are copied again
             * (the experts this split's ids choose) */
            const bool have_copy = copy_get(sched, src_id, cur_backend, 0) != NULL;
            const bool recopy = have_copy && needs_recopy(split, node, j);
            if (!have_copy || recopy) {
                if (!have_copy) {
                    enum bt_status st = make_copies(sched, src, cur_backend);
                    if (st != BT_OK) return st;
                }
                BT_ASSERT(split->n_inputs < BT_SCHED_MAX_SPLIT_INPUTS);
                sched->split_extra[sched->n_splits - 1].recopy[split->n_inputs] = recopy;
                split->inputs[split->n_inputs++] = src;
            }
            if (!add_rewrite(sched, node, j, src, cur_backend)) {
                set_error(sched, "scheduler: out of memory");
                return BT_ERR_NOMEM;
            }
            node->src[j] = copy_get(sched, src_id, cur_backend, sched->first_alloc ? 0 : sched->cur_copy);
            sched->rewritten = true;
        }
    }
    split->i_end = graph->n_nodes;
    for (int s = 0; s < sched->n_splits; s++)
        sched->splits[s].graph = bt_graph_view(graph, sched->splits[s].i_start, sched->splits[s].i_end);
    return BT_OK;
}

/* the graph's own tensors, to know it when it comes again */
static enum bt_status remember_plan(bt_sched_t sched, struct bt_graph *graph) {
    const size_t n_tensors = (size_t)graph->n_nodes + (size_t)graph->n_leafs;
    if (n_tensors > sched->planned_capacity) {
        struct bt_tensor **list = realloc(sched->planned_tensors, n_tensors * sizeof *list);
        if (!list) {
            set_error(sched, "scheduler: out of memory");
            return BT_ERR_NOMEM;
        }
        sched->planned_tensors = list;
        sched->planned_capacity = n_tensors;
    }
    if (graph->n_nodes) memcpy(sched->planned_tensors, graph->nodes, (size_t)graph->n_nodes * sizeof *graph->nodes);
    if (graph->n_leafs)
        memcpy(sched->planned_tensors + graph->n_nodes, graph->leafs, (size_t)graph->n_leafs * sizeof *graph->leafs);
    sched->planned_n_nodes = graph->n_nodes;
    sched->planned_n_leafs = graph->n_leafs;
    sched->planned = graph;
    if (sched->debug) bt_sched_print_plan(sched, stderr);
    return BT_OK;
}

static enum bt_status split_graph(bt_sched_t sched, struct bt_graph *graph) {
    drop_plan(sched, false);
    take_back_memory(graph);
    sched->err[0] = '\0';
    sched->ctx = bt_init((struct bt_init_params){sched->ctx_size, NULL, true});
    if (!sched->ctx) {
        set_error(sched, "scheduler: cannot allocate %zu bytes of metadata", sched->ctx_size);
        return BT_ERR_NOMEM;
    }
    if ((size_t)graph->n_nodes + (size_t)graph->n_leafs > sched->hash_set.size / 2) {
        set_error(sched, "scheduler: graph of %d nodes and %d leafs exceeds the scheduler's graph size",
                  graph->n_nodes, graph->n_leafs);
        return BT_ERR_CAPACITY;
    }
    sched->planned_hash = bt_graph_hash(graph); /* with the user's sources */
    enum bt_status st = keep_user_assignments(sched, graph);
    if (st != BT_OK) return st;
    pass1_from_memory(sched, graph);
    pass2_expand(sched, graph);
    pass3_upgrade(sched, graph);
    if ((st = pass4_sources(sched, graph)) != BT_OK) return st;
    if ((st = pass5_cut_splits(sched, graph)) != BT_OK) return st;
    if ((st = build_graph_copy(sched, graph)) != BT_OK) return st;
    return remember_plan(sched, graph);
}

/* The graph the allocator sees: for each split its input copies (with a
 * dependency that keeps each source alive until copied), then its nodes; the
 * slot copies and the original leafs as leafs. */
static enum bt_status build_graph_copy(bt_sched_t sched, struct bt_graph *graph) {
    const int cap = (graph->n_nodes > graph->n_leafs ? graph->n_nodes : graph->n_leafs) +
                    sched->n_splits * BT_SCHED_MAX_SPLIT_INPUTS * 2 * sched->n_copies + 16;
    if (cap > sched->graph_capacity) {
        struct bt_tensor **nodes = realloc(sched->graph.nodes, (size_t)cap * sizeof *nodes);
        if (nodes) sched->graph.nodes = nodes;
        struct bt_tensor **leafs = realloc(sched->graph.leafs, (size_t)cap * sizeof *leafs);
        if (leafs) sched->graph.leafs = leafs;
        int *nid = realloc(sched->node_backend_ids, (size_t)cap * sizeof *nid);
        if (nid) sched->node_backend_ids = nid;
        int *lid = realloc(sched->leaf_backend_ids, (size_t)cap * sizeof *lid);
        if (lid) sched->leaf_backend_ids = lid;
        if (!nodes || !leafs || !nid || !lid) {
            set_error(sched, "scheduler: out of memory for the graph copy");
            return BT_ERR_NOMEM;
        }
        sched->graph_capacity = cap;
    }
    struct bt_graph *gc = &sched->graph;
    gc->size = cap;
    gc->n_nodes = 0;
    gc->n_leafs = 0;
    gc->visited = (struct bt_hash_set){0, NULL};
    gc->ctx = sched->ctx;

    for (int s = 0; s < sched->n_splits; s++) {
        struct bt_sched_split *split = &sched->splits[s];
        for (int j = 0; j < split->n_inputs; j++) {
            struct bt_tensor *input = split->inputs[j];
            if (sched->split_extra[s].recopy[j]) continue; /* its copy is already in the graph */
            const size_t id = hash_id(sched, input);
            struct bt_tensor *dep = bt_view_tensor(sched->ctx, input);
            if (!dep) {
                set_error(sched, "scheduler: %s", bt_context_error(sched->ctx));
                return BT_ERR_NOMEM;
            }
            sched->node_backend_ids[gc->n_nodes] = sched->hv_backend_ids[id];
            gc->nodes[gc->n_nodes++] = dep;
            sched->node_backend_ids[gc->n_nodes] = split->backend_id;
            gc->nodes[gc->n_nodes++] = copy_get(sched, id, split->backend_id, 0);
        }
        for (int j = split->i_start; j < split->i_end; j++) {
            sched->node_backend_ids[gc->n_nodes] = tensor_backend_id(graph->nodes[j]);
            gc->nodes[gc->n_nodes++] = graph->nodes[j];
        }
    }
    if (sched->n_copies > 1) {
        for (int s = 0; s < sched->n_splits; s++) {
            const struct bt_sched_split *split = &sched->splits[s];
            for (int j = 0; j < split->n_inputs; j++) {
                if (sched->split_extra[s].recopy[j]) continue;
                const size_t id = hash_id(sched, split->inputs[j]);
                for (int c = 0; c < sched->n_copies; c++) {
                    sched->leaf_backend_ids[gc->n_leafs] = split->backend_id;
                    gc->leafs[gc->n_leafs++] = copy_get(sched, id, split->backend_id, c);
                }
            }
        }
    }
    for (int i = 0; i < graph->n_leafs; i++) {
        sched->leaf_backend_ids[gc->n_leafs] = tensor_backend_id(graph->leafs[i]);
        gc->leafs[gc->n_leafs++] = graph->leafs[i];
    }
    return BT_OK;
}

/* ---- allocation ------------------------------------------------------------- */

/* Is the plan for this graph?  The same graph object rebuilt differently
 * (or a new graph where a freed one lay) must be planned again: the same
 * tensors, the same hash (taken with the user's sources), and the tensors
 * the allocator placed still placed. */
static bool graph_is_planned(bt_sched_t sched, struct bt_graph *graph) {
    if (sched->planned != graph || graph->n_nodes != sched->planned_n_nodes ||
        graph->n_leafs != sched->planned_n_leafs)
        return false;
    if ((graph->n_nodes && memcmp(graph->nodes, sched->planned_tensors, (size_t)graph->n_nodes * sizeof *graph->nodes)) ||
        (graph->n_leafs && memcmp(graph->leafs, sched->planned_tensors + graph->n_nodes,
                                  (size_t)graph->n_leafs * sizeof *graph->leafs)))
        return false;
    restore_sources(sched); /* the tensors are the planned ones: alive */
    if (bt_graph_hash(graph) != sched->planned_hash) return false;
    if (sched->is_allocated) {
        int n_placed = 0;
        for (int i = 0; i < graph->n_nodes; i++) n_placed += (graph->nodes[i]->flags & BT_TENSOR_FLAG_SCHED) != 0;
        for (int i = 0; i < graph->n_leafs; i++) n_placed += (graph->leafs[i]->flags & BT_TENSOR_FLAG_SCHED) != 0;
        if (n_placed != sched->n_placed) return false;
    }
    return true;
}

/* Re-point rewritten sources to the copies of the current slot. */
static void point_sources_to_slot(bt_sched_t sched) {
    for (int i = 0; i < sched->n_rewrites; i++) {
        struct rewrite *r = &sched->rewrites[i];
        r->node->src[r->src_index] = copy_get(sched, hash_id(sched, r->orig), r->backend_id, sched->cur_copy);
    }
    sched->rewritten = sched->n_rewrites > 0;
}

/* Plan when needed; the sources then point at the current slot's copies. */
static enum bt_status plan_if_needed(bt_sched_t sched, struct bt_graph *graph) {
    if (graph_is_planned(sched, graph)) {
        point_sources_to_slot(sched);
        return BT_OK;
    }
    return bt_sched_split_graph(sched, graph);
}

enum bt_status bt_sched_reserve(bt_sched_t sched, struct bt_graph *measure_graph) {
    enum bt_status st = plan_if_needed(sched, measure_graph);
    if (st != BT_OK) return st;
    const bool ok =
        bt_gallocr_reserve_n(sched->galloc, &sched->graph, sched->node_backend_ids, sched->leaf_backend_ids);
    restore_sources(sched);
    if (!ok) {
        set_error(sched, "scheduler: %s", bt_gallocr_error(sched->galloc));
        return BT_ERR_NOMEM;
    }
    return BT_OK;
}

enum bt_status bt_sched_alloc_graph(bt_sched_t sched, struct bt_graph *graph) {
    enum bt_status st = plan_if_needed(sched, graph);
    if (st != BT_OK) return st;
    if (!sched->is_allocated) {
        if (!bt_gallocr_reserve_n(sched->galloc, &sched->graph, sched->node_backend_ids, sched->leaf_backend_ids) ||
            !bt_gallocr_alloc_graph(sched->galloc, &sched->graph)) {
            restore_sources(sched);
            set_error(sched, "scheduler: %s", bt_gallocr_error(sched->galloc));
            return BT_ERR_NOMEM;
        }
        sched->is_allocated = true;
        mark_placed(sched, graph);
    }
    /* the ring: micro-batch k uses slot k % n_copies */
    sched->cur_copy = sched->first_alloc ? 0 : (sched->cur_copy + 1) % sched->n_copies;
    sched->first_alloc = false;
    restore_sources(sched); /* compute points them at the slot while it runs */
    sched->slot_ready = true;
    return BT_OK;
}

/* ---- the executor ------------------------------------------------------------- */

static void wait_slot_free(bt_sched_t sched, int b) {
    bt_event_t ev = *event_slot(sched, b, sched->cur_copy);
    if (ev) {
        bt_backend_event_wait(sched->backends[b], ev);
    } else {
        bt_backend_synchronize(sched->backends[b]);
    }
}

static void sync_slot(bt_sched_t sched, int b) {
    bt_event_t ev = *event_slot(sched, b, sched->cur_copy);
    if (ev) {
        bt_event_synchronize(ev);
    } else {
        bt_backend_synchronize(sched->backends[b]);
    }
}

/* Is input_cpy used in this split only as the expert weights of MUL_MAT_IDs
 * that share one ids tensor, computed before the split starts?  Returns that
 * ids tensor, or NULL (then the whole tensor is copied). */
static struct bt_tensor *moe_ids_of(const struct bt_sched_split *split, const struct bt_tensor *input_cpy) {
    struct bt_tensor *ids = NULL;
    const struct bt_tensor *ids_base = NULL;
    for (int n = 0; n < split->graph.n_nodes; n++) {
        const struct bt_tensor *node = split->graph.nodes[n];
        for (int j = 0; j < BT_MAX_SRC; j++) {
            if (node->src[j] != input_cpy) continue;
            if (node->op != BT_OP_MUL_MAT_ID || j != 0) return NULL;
            if (ids && ids != node->src[2]) return NULL;
            ids = node->src[2];
        }
    }
    if (!ids) return NULL;
    /* ids made inside this split are not computed yet when inputs are copied */
    ids_base = ids->view_src ? ids->view_src : ids;
    for (int n = 0; n < split->graph.n_nodes; n++)
        if (split->graph.nodes[n] == ids || split->graph.nodes[n] == ids_base) return NULL;
    return ids;
}

enum bt_status bt_moe_used_experts(const struct bt_tensor *ids, const void *host, int64_t n_expert, uint8_t *used,
                                   char *err, size_t n_err) {
    memset(used, 0, (size_t)n_expert);
    for (int64_t i1 = 0; i1 < ids->ne[1]; i1++)
        for (int64_t i0 = 0; i0 < ids->ne[0]; i0++) {
            int32_t id;
            memcpy(&id, (const uint8_t *)host + i1 * (int64_t)ids->nb[1] + i0 * (int64_t)ids->nb[0], sizeof id);
            if (id < 0 || id >= n_expert)
                return bt_error_printf(err, n_err, BT_ERR_INVALID, "expert id %d out of range [0, %lld)", id,
                                       (long long)n_expert);
            used[id] = 1;
        }
    return BT_OK;
}

/* Copy only the experts that ids select, each run of consecutive experts as
 * one copy.  ids_backend holds ids (it may be another split's input not yet
 * copied, in which case the original is read). */
static enum bt_status copy_used_experts(bt_sched_t sched, const struct bt_sched_split *split, int input_index,
                                        struct bt_tensor *input, struct bt_tensor *input_cpy,
                                        struct bt_tensor *ids_tensor) {
    bt_backend_t split_backend = sched->backends[split->backend_id];
    const int64_t n_expert = input->ne[2];
    const size_t expert_size = input->nb[2];
    bt_backend_t ids_backend = split_backend;
    for (int k = input_index + 1; k < split->n_inputs; k++) {
        if (ids_tensor == bt_sched_get_tensor_copy(sched, split->inputs[k], split->backend_id, sched->cur_copy)) {
            ids_tensor = split->inputs[k];
            ids_backend = sched->backends[bt_sched_get_backend_id(sched, ids_tensor)];
            break;
        }
    }
    const size_t ids_bytes = bt_nbytes(ids_tensor);
    int32_t *ids = malloc(ids_bytes);
    uint8_t *used = calloc((size_t)n_expert, 1);
    if (!ids || !used) {
        free(ids);
        free(used);
        set_error(sched, "scheduler: out of memory reading expert ids");
        return BT_ERR_NOMEM;
    }
    bt_backend_tensor_get_async(ids_backend, ids_tensor, ids, 0, ids_bytes);
    bt_backend_synchronize(ids_backend);
    char why[160];
    if (bt_moe_used_experts(ids_tensor, ids, n_expert, used, why, sizeof why) != BT_OK) {
        set_error(sched, "node using '%s': %s", input->name, why);
        free(ids);
        free(used);
        return BT_ERR_INVALID;
    }
    for (int64_t first = 0; first < n_expert;) {
        if (!used[first]) {
            first++;
            continue;
        }
        int64_t last = first;
        while (last + 1 < n_expert && used[last + 1]) last++;
        const size_t offset = (size_t)first * expert_size;
        const size_t size = (size_t)(last - first + 1) * expert_size;
        bt_backend_tensor_set_async(split_backend, input_cpy, (const uint8_t *)input->data + offset, offset, size);
        sched->stats.copy_calls++;
        sched->stats.copy_bytes += size;
        sched->stats.moe_copies++;
        first = last + 1;
    }
    free(ids);
    free(used);
    return BT_OK;
}

static enum bt_status compute_splits(bt_sched_t sched) {
    for (int s = 0; s < sched->n_splits; s++) {
        struct bt_sched_split *split = &sched->splits[s];
        const int sb = split->backend_id;
        bt_backend_t split_backend = sched->backends[sb];

        for (int k = 0; k < split->n_inputs; k++) {
            struct bt_tensor *input = split->inputs[k];
            bt_backend_t input_backend = sched->backends[bt_sched_get_backend_id(sched, input)];
            struct bt_tensor *input_cpy = bt_sched_get_tensor_copy(sched, input, sb, sched->cur_copy);
            if (input->flags & BT_TENSOR_FLAG_INPUT) {
                /* the user may overwrite a user input as soon as we return:
                 * copy it now */
                sync_slot(sched, sb);
                bt_tensor_copy(input, input_cpy);
                sched->stats.copy_calls++;
                sched->stats.copy_bytes += bt_nbytes(input);
                continue;
            }
            /* the slot's last reader must be done before it is overwritten */
            wait_slot_free(sched, sb);
            bt_buffer_t ibuf = tensor_buffer(input);
            struct bt_tensor *ids = NULL;
            if (ibuf && bt_buffer_get_usage(ibuf) == BT_BUFFER_USAGE_WEIGHTS && bt_buffer_is_host(ibuf) &&
                (ids = moe_ids_of(split, input_cpy)) != NULL) {
                bt_backend_synchronize(input_backend);
                enum bt_status st = copy_used_experts(sched, split, k, input, input_cpy, ids);
                if (st != BT_OK) return st;
                continue;
            }
            if (!bt_backend_tensor_try_copy_async(input_backend, split_backend, input, input_cpy)) {
                bt_backend_synchronize(input_backend);
                sync_slot(sched, sb);
                bt_tensor_copy(input, input_cpy);
            }
            sched->stats.copy_calls++;
            sched->stats.copy_bytes += bt_nbytes(input);
        }

        if (!sched->callback_eval) {
            enum bt_status st = bt_backend_graph_compute_async(split_backend, &split->graph);
            if (st != BT_OK) {
                set_error(sched, "backend %s: %s", bt_backend_name(split_backend), bt_backend_error(split_backend));
                return st;
            }
        } else {
            /* run ranges of nodes up to each node the callback wants to see */
            for (int j0 = 0; j0 < split->graph.n_nodes; j0++) {
                struct bt_tensor *t = split->graph.nodes[j0];
                bool need = sched->callback_eval(t, true, sched->callback_eval_user_data);
                int j1 = j0;
                while (!need && j1 < split->graph.n_nodes - 1) {
                    t = split->graph.nodes[++j1];
                    need = sched->callback_eval(t, true, sched->callback_eval_user_data);
                }
                struct bt_graph gv = bt_graph_view(&split->graph, j0, j1 + 1);
                enum bt_status st = bt_backend_graph_compute_async(split_backend, &gv);
                if (st != BT_OK) {
                    set_error(sched, "backend %s: %s", bt_backend_name(split_backend),
                              bt_backend_error(split_backend));
                    return st;
                }
                bt_backend_synchronize(split_backend);
                if (need && !sched->callback_eval(t, false, sched->callback_eval_user_data)) {
                    set_error(sched, "stopped by the eval callback after node '%s'", t->name);
                    return BT_ERR_ABORTED;
                }
                j0 = j1;
            }
        }
        sched->stats.splits_run++;
        if (split->n_inputs > 0 && *event_slot(sched, sb, sched->cur_copy))
            bt_event_record(*event_slot(sched, sb, sched->cur_copy), split_backend);
    }
    return BT_OK;
}

enum bt_status bt_sched_graph_compute_async(bt_sched_t sched, struct bt_graph *graph) {
    if (!sched->slot_ready || sched->planned != graph) {
        enum bt_status st = bt_sched_alloc_graph(sched, graph);
        if (st != BT_OK) return st;
    }
    sched->slot_ready = false; /* the next compute takes the next slot */
    /* the splits read the slot's copies while they are queued (a backend
     * takes its operands when it queues the work, as a GPU launch does);
     * the user's sources are back when this returns */
    point_sources_to_slot(sched);
    const enum bt_status st = compute_splits(sched);
    restore_sources(sched);
    return st;
}

enum bt_status bt_sched_graph_compute(bt_sched_t sched, struct bt_graph *graph) {
    const enum bt_status st = bt_sched_graph_compute_async(sched, graph);
    bt_sched_synchronize(sched);
    return st;
}

void bt_sched_synchronize(bt_sched_t sched) {
    for (int b = 0; b < sched->n_backends; b++) bt_backend_synchronize(sched->backends[b]);
}

void bt_sched_set_cur_copy(bt_sched_t sched, int c) {
    BT_ASSERT(c >= 0 && c < sched->n_copies);
    sched->cur_copy = c;
    sched->first_alloc = false;
    point_sources_to_slot(sched);
}

void bt_sched_set_eval_callback(bt_sched_t sched, bt_sched_eval_callback cb, void *user_data) {
    sched->callback_eval = cb;
    sched->callback_eval_user_data = user_data;
}

/* ---- inspection ------------------------------------------------------------------ */

bt_backend_t bt_sched_get_backend(bt_sched_t sched, int i) {
    BT_ASSERT(i >= 0 && i < sched->n_backends);
    return sched->backends[i];
}
int bt_sched_get_n_copies(bt_sched_t sched) { return sched->n_copies; }
int bt_sched_get_cur_copy(bt_sched_t sched) { return sched->cur_copy; }
int bt_sched_get_n_splits(bt_sched_t sched) { return sched->n_splits; }
const struct bt_sched_split *bt_sched_get_split(bt_sched_t sched, int i) {
    BT_ASSERT(i >= 0 && i < sched->n_splits);
    return &sched->splits[i];
}

struct bt_tensor *bt_sched_get_tensor_copy(bt_sched_t sched, const struct bt_tensor *t, int backend_id, int c) {
    if (!bt_hash_contains(&sched->hash_set, t)) return NULL;
    return copy_get(sched, bt_hash_find(&sched->hash_set, t), backend_id, c);
}

size_t bt_sched_get_buffer_size(bt_sched_t sched, bt_backend_t backend) {
    const int b = backend_index(sched, backend);
    BT_ASSERT(b >= 0);
    return bt_gallocr_get_buffer_size(sched->galloc, b);
}

struct bt_sched_stats bt_sched_get_stats(bt_sched_t sched) { return sched->stats; }
const char *bt_sched_error(bt_sched_t sched) { return sched->err; }

void bt_sched_print_plan(bt_sched_t sched, FILE *f) {
    fprintf(f, "scheduler plan: %d splits, %d backends, n_copies %d\n", sched->n_splits, sched->n_backends,
            sched->n_copies);
    for (int s = 0; s < sched->n_splits; s++) {
        const struct bt_sched_split *split = &sched->splits[s];
        size_t in_bytes = 0;
        for (int j = 0; j < split->n_inputs; j++) in_bytes += bt_nbytes(split->inputs[j]);
        fprintf(f, "## split %d: backend %s, nodes %d..%d (%d), %d inputs (%zu bytes)\n", s,
                bt_backend_name(sched->backends[split->backend_id]), split->i_start, split->i_end - 1,
                split->i_end - split->i_start, split->n_inputs, in_bytes);
        for (int j = 0; j < split->n_inputs; j++) {
            const struct bt_tensor *in = split->inputs[j];
            const int ib = bt_sched_get_backend_id(sched, in);
            fprintf(f, "   input %-28s from %-10s %10zu bytes%s\n", in->name,
                    ib >= 0 ? bt_backend_name(sched->backends[ib]) : "?", bt_nbytes(in),
                    sched->split_extra[s].recopy[j] ? " (again: this split's experts)" : "");
        }
        for (int n = 0; n < split->graph.n_nodes; n++) {
            const struct bt_tensor *node = split->graph.nodes[n];
            fprintf(f, "   node  %-28s %-10s", node->name, bt_op_name(node->op));
            if (sched->debug > 1) {
                const size_t id = bt_hash_find(&sched->hash_set, node);
                const char *cause = id != BT_HASHSET_FULL ? sched->hv_cause[id] : NULL;
                fprintf(f, " [%s]", cause ? cause : "");
            }
            fprintf(f, " <-");
            for (int j = 0; j < BT_MAX_SRC; j++)
                if (node->src[j]) fprintf(f, " %s", node->src[j]->name);
            fprintf(f, "\n");
        }
    }
}
