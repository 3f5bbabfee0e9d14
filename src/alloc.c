/* alloc.c - the graph allocator (see alloc.h): a best-fit offset allocator
 * per buffer ("dyn"), the planning pass over a graph (reserve) with its
 * liveness counts and in-place reuse, and the placement of a graph's tensors
 * at the planned offsets (alloc_graph). */
#include "baton/alloc.h"
#include "mem.h"

#include <stdarg.h>
#include <string.h>

#include "baton/ops.h"

#define ALLOC_ERR_LEN 512

static const char *tname(const struct bt_tensor *t) { return t->name[0] ? t->name : "(unnamed)"; }

/* ---- dyn: offsets inside one buffer ------------------------------------------
 *
 * Everything at or above `top` is free.  Below it, free blocks are kept
 * sorted by offset, never adjacent to each other (they merge) and never
 * ending at top (such a block is folded into the tail).  Offsets and block
 * sizes are multiples of the alignment, so every offset is aligned. */

struct dyn_block {
    size_t offset, size;
};

struct dyn {
    size_t align;
    size_t top;  /* [top, inf) is free */
    size_t peak; /* highest top so far: the buffer size the plan needs */
    int n_free, cap;
    struct dyn_block *free; /* cap entries: reserved before a pass, never grown in it */
};

static void dyn_reset(struct dyn *d) {
    d->top = 0;
    d->peak = 0;
    d->n_free = 0;
}

/* Room for n free blocks (there are never more free blocks than blocks). */
static bool dyn_reserve(struct dyn *d, size_t n) {
    if (n > (size_t)d->cap) {
        if (n > (size_t)1 << 30) return false;
        struct dyn_block *nf = realloc(d->free, n * sizeof *nf);
        if (!nf) return false;
        d->free = nf;
        d->cap = (int)n;
    }
    return true;
}

static void dyn_remove(struct dyn *d, int i) {
    memmove(&d->free[i], &d->free[i + 1], (size_t)(d->n_free - i - 1) * sizeof d->free[0]);
    d->n_free--;
}

/* A block of at least size bytes: the smallest free block that fits (the
 * lowest such on ties), else the tail.  false when the offsets would overflow. */
static bool dyn_alloc(struct dyn *d, size_t size, size_t *offset, size_t *block) {
    if (size > SIZE_MAX - d->align) return false;
    size_t need = (size + d->align - 1) / d->align * d->align;
    if (need == 0) need = d->align; /* every tensor gets its own address */
    int best = -1;
    for (int i = 0; i < d->n_free; i++) {
        if (d->free[i].size >= need && (best < 0 || d->free[i].size < d->free[best].size)) best = i;
    }
    if (best >= 0) {
        *offset = d->free[best].offset;
        d->free[best].offset += need;
        d->free[best].size -= need;
        if (d->free[best].size == 0) dyn_remove(d, best);
    } else {
        if (need > SIZE_MAX - d->top) return false;
        *offset = d->top;
        d->top += need;
        if (d->top > d->peak) d->peak = d->top;
    }
    *block = need;
    return true;
}

static void dyn_free(struct dyn *d, size_t offset, size_t size) {
    BT_ASSERT(size > 0 && offset % d->align == 0 && size % d->align == 0);
    BT_ASSERT(offset + size <= d->top);
    int i = 0; /* first free block above offset */
    while (i < d->n_free && d->free[i].offset < offset) i++;
    /* not already free (a double free would overlap a neighbour) */
    BT_ASSERT(i == 0 || d->free[i - 1].offset + d->free[i - 1].size <= offset);
    BT_ASSERT(i == d->n_free || offset + size <= d->free[i].offset);

    if (offset + size == d->top) { /* back into the tail, with a free block below it */
        d->top = offset;
        if (i > 0 && d->free[i - 1].offset + d->free[i - 1].size == d->top) {
            d->top = d->free[i - 1].offset;
            dyn_remove(d, i - 1);
        }
        return;
    }
    const bool prev = i > 0 && d->free[i - 1].offset + d->free[i - 1].size == offset;
    const bool next = i < d->n_free && offset + size == d->free[i].offset;
    if (prev && next) {
        d->free[i - 1].size += size + d->free[i].size;
        dyn_remove(d, i);
    } else if (prev) {
        d->free[i - 1].size += size;
    } else if (next) {
        d->free[i].offset = offset;
        d->free[i].size += size;
    } else {
        BT_ASSERT(d->n_free < d->cap);
        memmove(&d->free[i + 1], &d->free[i], (size_t)(d->n_free - i) * sizeof d->free[0]);
        d->free[i] = (struct dyn_block){offset, size};
        d->n_free++;
    }
}

/* ---- the allocator -------------------------------------------------------------- */

/* What the planning pass knows of one tensor (values of the hash set). */
struct tensor_info {
    int n_children; /* consumers that have not run yet */
    int n_views;    /* views of it (as view_src) that still hold it */
    int buffer_id;  /* -1 until placed */
    size_t offset;  /* the block, when placed */
    size_t size;    /* aligned bytes of the block */
    bool placed;    /* given a block by this plan (not pre-allocated, not a view) */
    bool live;      /* holds its block now: false once freed or handed to a consumer in place */
    int ref;        /* node i: i; leaf i: n_nodes + i; not in the graph: REF_OUTSIDE */
};

#define REF_NULL (-1)
#define REF_OUTSIDE (-2)

/* Where one tensor goes; buffer_id -1: not placed by us (had data, or a view). */
struct tensor_plan {
    int buffer_id;
    size_t offset;
    size_t size_max; /* bytes of its block: a later tensor must fit */
};

struct node_plan {
    struct tensor_plan dst;
    struct tensor_plan src[BT_MAX_SRC];
    /* the structure the plan depends on, checked by alloc_graph */
    enum bt_op op;
    int32_t flags; /* INPUT | OUTPUT */
    int src_ref[BT_MAX_SRC];
    int view_ref;
    int inplace_src; /* the source slot whose block the node took, or -1 */
};

struct leaf_plan {
    struct tensor_plan t;
    int32_t flags;
};

struct bt_gallocr {
    int n_bufs;
    bt_buffer_type_t *bufts; /* per id */
    int *owner;              /* per id: the first id of the same buffer type */
    bt_buffer_t *buffers;    /* per owner id */
    struct dyn *dyns;        /* per owner id */

    struct bt_hash_set set;     /* tensors of the graph being planned */
    struct tensor_info *infos;  /* parallel to set.keys */
    size_t set_cap;             /* slots allocated (set.size may be less) */

    /* the plan of the last successful reserve */
    bool planned;
    int n_nodes, n_leafs;
    struct node_plan *nodes;
    struct leaf_plan *leafs;
    int nodes_cap, leafs_cap;

    char err[ALLOC_ERR_LEN];
};

/* The allocator's last error (bt_gallocr_error). */
#define set_error(g, ...) (void)bt_error_printf((g)->err, sizeof (g)->err, BT_ERR_INVALID, __VA_ARGS__)

bt_gallocr_t bt_gallocr_new_n(bt_buffer_type_t *bufts, int n_bufs) {
    if (!bufts || n_bufs < 1) return NULL;
    for (int i = 0; i < n_bufs; i++)
        if (!bufts[i]) return NULL;
    bt_gallocr_t g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->n_bufs = n_bufs;
    g->bufts = calloc((size_t)n_bufs, sizeof *g->bufts);
    g->owner = calloc((size_t)n_bufs, sizeof *g->owner);
    g->buffers = calloc((size_t)n_bufs, sizeof *g->buffers);
    g->dyns = calloc((size_t)n_bufs, sizeof *g->dyns);
    if (!g->bufts || !g->owner || !g->buffers || !g->dyns) {
        bt_gallocr_free(g);
        return NULL;
    }
    for (int i = 0; i < n_bufs; i++) {
        g->bufts[i] = bufts[i];
        g->owner[i] = i;
        for (int j = 0; j < i; j++) {
            if (bufts[j] == bufts[i]) {
                g->owner[i] = j;
                break;
            }
        }
        g->dyns[i].align = bt_buft_get_alignment(bufts[i]);
        if (g->dyns[i].align == 0) g->dyns[i].align = 1;
    }
    return g;
}

bt_gallocr_t bt_gallocr_new(bt_buffer_type_t buft) { return bt_gallocr_new_n(&buft, 1); }

void bt_gallocr_free(bt_gallocr_t g) {
    if (!g) return;
    for (int i = 0; g->buffers && i < g->n_bufs; i++) bt_buffer_free(g->buffers[i]);
    for (int i = 0; g->dyns && i < g->n_bufs; i++) free(g->dyns[i].free);
    BT_FREE_ALL(g->bufts, g->owner, g->buffers, g->dyns, g->set.keys, g->infos, g->nodes, g->leafs, g);
}

const char *bt_gallocr_error(bt_gallocr_t g) { return g->err; }

size_t bt_gallocr_get_buffer_size(bt_gallocr_t g, int id) {
    if (id < 0 || id >= g->n_bufs || g->owner[id] != id || !g->buffers[id]) return 0;
    return bt_buffer_get_size(g->buffers[id]);
}

bt_buffer_t bt_gallocr_get_buffer(bt_gallocr_t g, int id) {
    if (id < 0 || id >= g->n_bufs) return NULL;
    return g->buffers[g->owner[id]];
}

/* ---- the hash set of tensors ------------------------------------------------------ */

/* An empty set with room for n tensors at a load of at most 2/3. */
static bool table_init(bt_gallocr_t g, size_t n) {
    const size_t want = bt_hash_size(n + n / 2 + 1);
    if (want > g->set_cap) {
        struct bt_tensor **keys = malloc(want * sizeof *keys);
        struct tensor_info *infos = malloc(want * sizeof *infos);
        if (!keys || !infos) {
            free(keys);
            free(infos);
            return false;
        }
        free(g->set.keys);
        free(g->infos);
        g->set.keys = keys;
        g->infos = infos;
        g->set_cap = want;
    }
    g->set.size = want;
    memset(g->set.keys, 0, want * sizeof *g->set.keys);
    return true;
}

static struct tensor_info *info_get(bt_gallocr_t g, struct bt_tensor *t) {
    const size_t i = bt_hash_find(&g->set, t);
    BT_ASSERT(i != BT_HASHSET_FULL); /* the set is sized for every tensor a graph can name */
    if (g->set.keys[i] == NULL) {
        g->set.keys[i] = t;
        g->infos[i] = (struct tensor_info){.buffer_id = -1, .ref = REF_OUTSIDE};
    }
    return &g->infos[i];
}

/* node i: i; leaf i: n_nodes + i (as recorded by info_get); NULL: REF_NULL */
static int ref_of(bt_gallocr_t g, struct bt_tensor *t) {
    if (!t) return REF_NULL;
    const size_t i = bt_hash_find(&g->set, t);
    if (i == BT_HASHSET_FULL || g->set.keys[i] != t) return REF_OUTSIDE;
    return g->infos[i].ref;
}

/* ---- planning --------------------------------------------------------------------- */

/* Element-wise ops: their kernels read element i before writing element i. */
static bool op_can_inplace(enum bt_op op) { return bt_op_elementwise(op) != BT_ELEMENTWISE_NONE; }

static bool same_layout(const struct bt_tensor *a, const struct bt_tensor *b) {
    if (a->type != b->type) return false;
    for (int i = 0; i < BT_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i]) return false;
    return true;
}

#define PINNED (BT_TENSOR_FLAG_INPUT | BT_TENSOR_FLAG_OUTPUT)

/* Can node take src slot j's block?  Only when node is the last consumer of
 * that memory, the layouts match and the block is ours in the same buffer. */
static bool try_inplace(bt_gallocr_t g, struct bt_tensor *node, struct tensor_info *ni, int id,
                        int *slot) {
    if (!op_can_inplace(node->op)) return false;
    for (int j = 0; j < BT_MAX_SRC; j++) {
        struct bt_tensor *p = node->src[j];
        if (!p) continue;
        struct tensor_info *pi = info_get(g, p);
        if (pi->n_children != 1 || pi->n_views != 0) continue; /* someone else still reads it */
        if ((p->flags & PINNED) || !same_layout(p, node)) continue;
        struct tensor_info *oi = pi; /* the block's holder */
        if (p->view_src) {
            struct bt_tensor *vs = p->view_src;
            oi = info_get(g, vs);
            /* the view must be the whole of its source, and its only holder */
            if (p->view_offs != 0 || !same_layout(vs, p) || (vs->flags & PINNED)) continue;
            if (oi->n_views != 1 || oi->n_children != 0) continue;
        }
        if (!oi->live || g->owner[oi->buffer_id] != g->owner[id]) continue;
        ni->buffer_id = id;
        ni->offset = oi->offset;
        ni->size = oi->size;
        oi->live = false; /* the node frees the block now */
        *slot = j;
        return true;
    }
    return false;
}

/* Give t a block in buffer id unless it has data, is a view or already has
 * one.  may_inplace: t is the node being computed (it may take a source's
 * block; *slot says which). */
static bool plan_tensor(bt_gallocr_t g, struct bt_tensor *t, int id, bool may_inplace, int *slot) {
    if (t->data) return true;
    if (t->view_src) {
        struct bt_tensor *vs = t->view_src;
        if (!vs->data && !info_get(g, vs)->placed) {
            set_error(g, "reserve: view '%s': its source '%s' has no data and is not placed before it in the graph",
                      tname(t), tname(vs));
            return false;
        }
        return true;
    }
    struct tensor_info *ti = info_get(g, t);
    if (ti->placed) return true;
    ti->placed = ti->live = true;
    if (may_inplace && try_inplace(g, t, ti, id, slot)) return true;
    const size_t size = bt_buft_get_alloc_size(g->bufts[id], t);
    size_t offset, block;
    if (!dyn_alloc(&g->dyns[g->owner[id]], size, &offset, &block)) {
        set_error(g, "reserve: buffer %d (%s): tensor '%s' of %zu bytes overflows the address space",
                  id, bt_buft_name(g->bufts[id]), tname(t), size);
        return false;
    }
    ti->buffer_id = id;
    ti->offset = offset;
    ti->size = block;
    return true;
}

/* Return t's block to its buffer, unless it is pinned or not ours. */
static void free_tensor(bt_gallocr_t g, struct bt_tensor *t, const struct bt_tensor *last) {
    struct tensor_info *ti = info_get(g, t);
    if (!ti->live || (t->flags & PINNED) || t == last) return;
    dyn_free(&g->dyns[g->owner[ti->buffer_id]], ti->offset, ti->size);
    ti->live = false;
}

/* One consumer of t has run: free t (or, for a view, release its hold on
 * view_src) once nothing reads it any more. */
static void release(bt_gallocr_t g, struct bt_tensor *t, const struct bt_tensor *last) {
    struct tensor_info *ti = info_get(g, t);
    BT_ASSERT(ti->n_children > 0);
    if (--ti->n_children > 0 || ti->n_views > 0) return;
    if (t->view_src) {
        if (t->flags & PINNED) return; /* a pinned view keeps its source */
        struct tensor_info *vi = info_get(g, t->view_src);
        BT_ASSERT(vi->n_views > 0);
        if (--vi->n_views == 0 && vi->n_children == 0) free_tensor(g, t->view_src, last);
    } else {
        free_tensor(g, t, last);
    }
}

static struct tensor_plan plan_of(bt_gallocr_t g, struct bt_tensor *t) {
    if (!t || t->data || t->view_src) return (struct tensor_plan){.buffer_id = -1};
    const struct tensor_info *ti = info_get(g, t);
    BT_ASSERT(ti->placed);
    return (struct tensor_plan){ti->buffer_id, ti->offset, ti->size};
}

static bool grow_plan_arrays(bt_gallocr_t g, int n_nodes, int n_leafs) {
    if (n_nodes > g->nodes_cap) {
        struct node_plan *p = realloc(g->nodes, (size_t)n_nodes * sizeof *p);
        if (!p) return false;
        g->nodes = p;
        g->nodes_cap = n_nodes;
    }
    if (n_leafs > g->leafs_cap) {
        struct leaf_plan *p = realloc(g->leafs, (size_t)n_leafs * sizeof *p);
        if (!p) return false;
        g->leafs = p;
        g->leafs_cap = n_leafs;
    }
    return true;
}

/* The planning pass proper: fills the hash set and the dyns. */
static bool plan_graph(bt_gallocr_t g, struct bt_graph *graph, const int *node_ids,
                       const int *leaf_ids, int *inplace) {
    const int n_nodes = graph->n_nodes, n_leafs = graph->n_leafs;
    struct bt_tensor *last = n_nodes > 0 ? graph->nodes[n_nodes - 1] : NULL;

    for (int i = 0; i < n_nodes; i++) info_get(g, graph->nodes[i])->ref = i;
    for (int i = 0; i < n_leafs; i++) info_get(g, graph->leafs[i])->ref = n_nodes + i;

    /* consumers and views of every tensor */
    for (int i = 0; i < n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        if (node->view_src) info_get(g, node->view_src)->n_views++;
        for (int j = 0; j < BT_MAX_SRC; j++)
            if (node->src[j]) info_get(g, node->src[j])->n_children++;
    }

    /* leafs, then inputs: nothing computed may overwrite them before use */
    for (int i = 0; i < n_leafs; i++)
        if (!plan_tensor(g, graph->leafs[i], leaf_ids ? leaf_ids[i] : 0, false, NULL)) return false;
    for (int i = 0; i < n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        if ((node->flags & BT_TENSOR_FLAG_INPUT) &&
            !plan_tensor(g, node, node_ids ? node_ids[i] : 0, false, NULL))
            return false;
    }

    for (int i = 0; i < n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        const int id = node_ids ? node_ids[i] : 0;
        for (int j = 0; j < BT_MAX_SRC; j++) /* sources from outside the graph */
            if (node->src[j] && !plan_tensor(g, node->src[j], id, false, NULL)) return false;
        inplace[i] = -1;
        if (!plan_tensor(g, node, id, true, &inplace[i])) return false;
        for (int j = 0; j < BT_MAX_SRC; j++)
            if (node->src[j]) release(g, node->src[j], last);
    }
    return true;
}

/* Grow buffer `o` (an owner id) to its dyn's peak. */
static bool grow_buffer(bt_gallocr_t g, int o) {
    const size_t need = g->dyns[o].peak;
    const size_t max = bt_buft_get_max_size(g->bufts[o]);
    if (need > max) {
        set_error(g, "reserve: buffer %d (%s): the graph needs %zu bytes, more than the largest buffer of this type (%zu bytes)",
                  o, bt_buft_name(g->bufts[o]), need, max);
        return false;
    }
    if (need == 0 || (g->buffers[o] && bt_buffer_get_size(g->buffers[o]) >= need)) return true;
    bt_buffer_free(g->buffers[o]); /* before allocating the larger one: lower peak memory */
    g->buffers[o] = bt_buft_alloc_buffer(g->bufts[o], need);
    if (!g->buffers[o]) {
        set_error(g, "reserve: buffer %d (%s): cannot allocate %zu bytes", o, bt_buft_name(g->bufts[o]),
                  need);
        return false;
    }
    bt_buffer_set_usage(g->buffers[o], BT_BUFFER_USAGE_COMPUTE);
    return true;
}

bool bt_gallocr_reserve_n(bt_gallocr_t g, struct bt_graph *graph, const int *node_ids,
                          const int *leaf_ids) {
    g->err[0] = '\0';
    g->planned = false;
    const int n_nodes = graph->n_nodes, n_leafs = graph->n_leafs;
    for (int i = 0; node_ids && i < n_nodes; i++) {
        if (node_ids[i] < 0 || node_ids[i] >= g->n_bufs) {
            set_error(g, "reserve: node %d ('%s'): buffer id %d is not in [0, %d)", i,
                      tname(graph->nodes[i]), node_ids[i], g->n_bufs);
            return false;
        }
    }
    for (int i = 0; leaf_ids && i < n_leafs; i++) {
        if (leaf_ids[i] < 0 || leaf_ids[i] >= g->n_bufs) {
            set_error(g, "reserve: leaf %d ('%s'): buffer id %d is not in [0, %d)", i,
                      tname(graph->leafs[i]), leaf_ids[i], g->n_bufs);
            return false;
        }
    }

    /* every tensor the graph can name: nodes and leafs, plus sources and view
     * sources from outside it */
    const size_t n_tensors = 2 * (size_t)n_leafs + (size_t)n_nodes * (2 + BT_MAX_SRC);
    int *inplace = malloc(((size_t)n_nodes + 1) * sizeof *inplace);
    bool ok = inplace && table_init(g, n_tensors) && grow_plan_arrays(g, n_nodes, n_leafs);
    for (int o = 0; ok && o < g->n_bufs; o++) {
        dyn_reset(&g->dyns[o]);
        ok = dyn_reserve(&g->dyns[o], n_tensors + 1);
    }
    if (!ok) {
        free(inplace);
        set_error(g, "reserve: out of host memory planning a graph of %d nodes and %d leafs", n_nodes,
                  n_leafs);
        return false;
    }

    if (!plan_graph(g, graph, node_ids, leaf_ids, inplace)) {
        free(inplace);
        return false;
    }

    /* record the plan, with the structure it depends on */
    for (int i = 0; i < n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        struct node_plan *np = &g->nodes[i];
        np->dst = plan_of(g, node);
        for (int j = 0; j < BT_MAX_SRC; j++) {
            np->src[j] = plan_of(g, node->src[j]);
            np->src_ref[j] = ref_of(g, node->src[j]);
        }
        np->op = node->op;
        np->flags = node->flags & PINNED;
        np->view_ref = ref_of(g, node->view_src);
        np->inplace_src = inplace[i];
    }
    for (int i = 0; i < n_leafs; i++) {
        g->leafs[i].t = plan_of(g, graph->leafs[i]);
        g->leafs[i].flags = graph->leafs[i]->flags & PINNED;
    }
    free(inplace);
    g->n_nodes = n_nodes;
    g->n_leafs = n_leafs;

    for (int o = 0; o < g->n_bufs; o++)
        if (g->owner[o] == o && !grow_buffer(g, o)) return false;
    g->planned = true;
    return true;
}

bool bt_gallocr_reserve(bt_gallocr_t g, struct bt_graph *graph) {
    return bt_gallocr_reserve_n(g, graph, NULL, NULL);
}

/* ---- placement ---------------------------------------------------------------------- */

/* Does t (of the graph being placed) fit its planned block?  why: the reason when not. */
static bool tensor_fits(bt_gallocr_t g, const struct bt_tensor *t, const struct tensor_plan *p,
                        char *why, size_t n_why) {
    if (!t || t->data || t->view_src) return true;
    if (p->buffer_id < 0) {
        snprintf(why, n_why, "tensor '%s' had data or was a view when the graph was reserved", tname(t));
        return false;
    }
    const size_t size = bt_buft_get_alloc_size(g->bufts[p->buffer_id], t);
    if (size > p->size_max) {
        snprintf(why, n_why, "tensor '%s' needs %zu bytes, more than its planned %zu", tname(t), size,
                 p->size_max);
        return false;
    }
    return true;
}

/* Does graph have the structure of the planned one, and does every tensor fit? */
static bool plan_matches(bt_gallocr_t g, struct bt_graph *graph, char *why, size_t n_why) {
    if (!g->planned) {
        snprintf(why, n_why, "no graph has been reserved");
        return false;
    }
    if (graph->n_nodes != g->n_nodes || graph->n_leafs != g->n_leafs) {
        snprintf(why, n_why, "the graph has %d nodes and %d leafs, the reserved one %d and %d",
                 graph->n_nodes, graph->n_leafs, g->n_nodes, g->n_leafs);
        return false;
    }
    /* the set was sized for this many nodes and leafs at reserve */
    if (!table_init(g, (size_t)graph->n_nodes + (size_t)graph->n_leafs)) {
        snprintf(why, n_why, "out of host memory");
        return false;
    }
    for (int i = 0; i < graph->n_nodes; i++) info_get(g, graph->nodes[i])->ref = i;
    for (int i = 0; i < graph->n_leafs; i++) info_get(g, graph->leafs[i])->ref = graph->n_nodes + i;

    for (int i = 0; i < graph->n_leafs; i++) {
        const struct bt_tensor *leaf = graph->leafs[i];
        if ((leaf->flags & PINNED) != g->leafs[i].flags) {
            snprintf(why, n_why, "leaf %d ('%s') has other INPUT/OUTPUT flags", i, tname(leaf));
            return false;
        }
        if (!tensor_fits(g, leaf, &g->leafs[i].t, why, n_why)) return false;
    }
    for (int i = 0; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        const struct node_plan *np = &g->nodes[i];
        bool same = node->op == np->op && (node->flags & PINNED) == np->flags &&
                    ref_of(g, node->view_src) == np->view_ref;
        for (int j = 0; same && j < BT_MAX_SRC; j++) same = ref_of(g, node->src[j]) == np->src_ref[j];
        if (np->inplace_src >= 0 && same) {
            const struct bt_tensor *p = node->src[np->inplace_src];
            same = same_layout(p, node) &&
                   (!p->view_src || (p->view_offs == 0 && same_layout(p->view_src, p)));
        }
        if (!same) {
            snprintf(why, n_why, "node %d ('%s', %s) differs from the reserved graph", i, tname(node),
                     bt_op_name(node->op));
            return false;
        }
        if (!tensor_fits(g, node, &np->dst, why, n_why)) return false;
        for (int j = 0; j < BT_MAX_SRC; j++)
            if (!tensor_fits(g, node->src[j], &np->src[j], why, n_why)) return false;
    }
    return true;
}

static bool place(bt_gallocr_t g, struct bt_tensor *t, const struct tensor_plan *p) {
    if (!t || t->data) return true;
    if (t->view_src) {
        if (!t->view_src->data) {
            set_error(g, "alloc_graph: view '%s': its source '%s' has no data", tname(t),
                      tname(t->view_src));
            return false;
        }
        if (bt_view_init(t) != BT_OK) {
            set_error(g, "alloc_graph: view '%s': the buffer cannot initialise it", tname(t));
            return false;
        }
        return true;
    }
    BT_ASSERT(p->buffer_id >= 0); /* plan_matches checked it */
    bt_buffer_t buf = g->buffers[g->owner[p->buffer_id]];
    BT_ASSERT(buf != NULL && p->offset + p->size_max <= bt_buffer_get_size(buf));
    if (bt_tensor_alloc(buf, t, (uint8_t *)bt_buffer_get_base(buf) + p->offset) != BT_OK) {
        set_error(g, "alloc_graph: buffer %d (%s): cannot initialise tensor '%s'", p->buffer_id,
                  bt_buft_name(g->bufts[p->buffer_id]), tname(t));
        return false;
    }
    return true;
}

bool bt_gallocr_alloc_graph(bt_gallocr_t g, struct bt_graph *graph) {
    g->err[0] = '\0';
    char why[256];
    if (!plan_matches(g, graph, why, sizeof why)) {
        if (g->n_bufs > 1) {
            set_error(g, "alloc_graph: %s; with %d buffers the graph must be reserved again (reserve_n)",
                      why, g->n_bufs);
            return false;
        }
        if (!bt_gallocr_reserve(g, graph)) return false;
    }
    for (int i = 0; i < graph->n_leafs; i++)
        if (!place(g, graph->leafs[i], &g->leafs[i].t)) return false;
    for (int i = 0; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        for (int j = 0; j < BT_MAX_SRC; j++)
            if (!place(g, node->src[j], &g->nodes[i].src[j])) return false;
        if (!place(g, node, &g->nodes[i].dst)) return false;
    }
    return true;
}
