/* graph.c - the static graph: visited hash set, post-order DFS that fills
 * nodes[] and leafs[], graph views and the structural graph hash. */
#include "baton/graph.h"

#include <string.h>

/* ---- hash set ---------------------------------------------------------- */

static const size_t primes[] = {
    2,        3,        5,        11,        17,        37,        67,        131,       257,
    521,      1031,     2053,     4099,      8209,      16411,     32771,     65537,     131101,
    262147,   524309,   1048583,  2097169,   4194319,   8388617,   16777259,  33554467,  67108879,
    134217757, 268435459, 536870923, 1073741827, 2147483659u,
};

size_t bt_hash_size(size_t min_size) {
    const size_t n = sizeof primes / sizeof primes[0];
    for (size_t i = 0; i < n; i++)
        if (primes[i] >= min_size) return primes[i];
    return min_size | 1;
}

static inline size_t hash_ptr(const struct bt_tensor *t) {
    /* tensors are at least 8-byte aligned: drop the low bits */
    return (size_t)((uintptr_t)t >> 4);
}

size_t bt_hash_find(const struct bt_hash_set *set, const struct bt_tensor *t) {
    const size_t h = hash_ptr(t) % set->size;
    size_t i = h;
    do {
        if (set->keys[i] == NULL || set->keys[i] == t) return i;
        i = (i + 1) % set->size;
    } while (i != h);
    return BT_HASHSET_FULL;
}

bool bt_hash_contains(const struct bt_hash_set *set, const struct bt_tensor *t) {
    if (set->size == 0) return false;
    const size_t i = bt_hash_find(set, t);
    return i != BT_HASHSET_FULL && set->keys[i] == t;
}

size_t bt_hash_insert(struct bt_hash_set *set, struct bt_tensor *t) {
    const size_t i = bt_hash_find(set, t);
    if (i == BT_HASHSET_FULL) return BT_HASHSET_FULL;
    set->keys[i] = t;
    return i;
}

/* ---- graph ------------------------------------------------------------- */

size_t bt_graph_overhead(int size) {
    const size_t hs = bt_hash_size((size_t)size * 2);
    return sizeof(struct bt_graph) + 2 * (size_t)size * sizeof(struct bt_tensor *) +
           hs * sizeof(struct bt_tensor *) + 4 * BT_MEM_ALIGN;
}

struct bt_graph *bt_graph_new(bt_context *ctx, int size) {
    if (size <= 0) {
        bt_context_set_error(ctx, "graph: size %d must be positive", size);
        return NULL;
    }
    const size_t hs = bt_hash_size((size_t)size * 2);
    struct bt_graph *g = bt_context_alloc(ctx, sizeof *g);
    struct bt_tensor **nodes = g ? bt_context_alloc(ctx, (size_t)size * sizeof *nodes) : NULL;
    struct bt_tensor **leafs = nodes ? bt_context_alloc(ctx, (size_t)size * sizeof *leafs) : NULL;
    struct bt_tensor **keys = leafs ? bt_context_alloc(ctx, hs * sizeof *keys) : NULL;
    if (!keys) return NULL; /* the arena reported it */
    memset(keys, 0, hs * sizeof *keys);
    *g = (struct bt_graph){
        .size = size,
        .nodes = nodes,
        .leafs = leafs,
        .visited = {.size = hs, .keys = keys},
        .ctx = ctx,
    };
    return g;
}

/* Post-order DFS (sources first).  Iterative, with an explicit stack, so that
 * a long chain cannot overflow the C stack.  Returns BT_OK or an error. */
enum bt_status bt_graph_build_forward_expand(struct bt_graph *g, struct bt_tensor *root) {
    if (!root) {
        bt_context_set_error(g->ctx, "graph: NULL output tensor (did an op constructor fail?)");
        return BT_ERR_INVALID;
    }
    if (g->visited.size == 0) {
        bt_context_set_error(g->ctx, "graph: cannot expand a graph view");
        return BT_ERR_INVALID;
    }
    struct frame {
        struct bt_tensor *t;
        int next_src;
    };
    size_t cap = 64, top = 0;
    struct frame *stack = malloc(cap * sizeof *stack);
    if (!stack) return BT_ERR_NOMEM;
    enum bt_status st = BT_OK;

    if (!bt_hash_contains(&g->visited, root)) stack[top++] = (struct frame){root, 0};
    while (top > 0) {
        struct frame *f = &stack[top - 1];
        if (f->next_src < BT_MAX_SRC) {
            struct bt_tensor *s = f->t->src[f->next_src++];
            if (s && !bt_hash_contains(&g->visited, s)) {
                /* a tensor already on the stack would be a cycle */
                for (size_t i = 0; i < top; i++) {
                    if (stack[i].t == s) {
                        bt_context_set_error(g->ctx, "graph: cycle through tensor '%s'", s->name);
                        st = BT_ERR_INVALID;
                        goto done;
                    }
                }
                if (top == cap) {
                    struct frame *ns = realloc(stack, 2 * cap * sizeof *stack);
                    if (!ns) {
                        st = BT_ERR_NOMEM;
                        goto done;
                    }
                    stack = ns;
                    cap *= 2;
                }
                stack[top++] = (struct frame){s, 0};
            }
            continue;
        }
        /* all sources done: classify the tensor */
        struct bt_tensor *t = f->t;
        top--;
        const bool leaf = t->op == BT_OP_NONE;
        const int n = leaf ? g->n_leafs : g->n_nodes;
        if (n >= g->size) {
            bt_context_set_error(g->ctx, "graph: more than %d %s (graph size %d); create the graph with a larger size",
                                 g->size, leaf ? "leafs" : "nodes", g->size);
            st = BT_ERR_CAPACITY;
            goto done;
        }
        if (bt_hash_insert(&g->visited, t) == BT_HASHSET_FULL) {
            bt_context_set_error(g->ctx, "graph: visited set full");
            st = BT_ERR_CAPACITY;
            goto done;
        }
        if (leaf) {
            g->leafs[g->n_leafs++] = t;
            if (t->name[0] == '\0') bt_format_name(t, "leaf_%d", n);
        } else {
            g->nodes[g->n_nodes++] = t;
            if (t->name[0] == '\0') bt_format_name(t, "node_%d", n);
        }
    }
done:
    free(stack);
    return st;
}

struct bt_graph bt_graph_view(struct bt_graph *g, int i0, int i1) {
    BT_ASSERT(0 <= i0 && i0 <= i1 && i1 <= g->n_nodes);
    return (struct bt_graph){
        .size = i1 - i0,
        .n_nodes = i1 - i0,
        .n_leafs = 0,
        .nodes = g->nodes + i0,
        .leafs = NULL,
        .visited = {0, NULL},
        .ctx = g->ctx,
    };
}

struct bt_tensor *bt_graph_node(const struct bt_graph *g, int i) {
    if (i < 0) i += g->n_nodes;
    BT_ASSERT(i >= 0 && i < g->n_nodes);
    return g->nodes[i];
}

int bt_graph_node_index(const struct bt_graph *g, const struct bt_tensor *t) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == t) return i;
    return -1;
}

/* ---- structural hash (FNV-1a, 64 bit) ---------------------------------- */

static inline uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
static inline uint64_t fnv_i64(uint64_t h, int64_t v) { return fnv(h, &v, sizeof v); }

/* Position of t among the graph's tensors: leafs are 1..n_leafs, nodes are
 * -(1..n_nodes), tensors outside the graph (a view's source that is itself
 * not reachable) 0.  Uses a side table indexed like the visited set. */
static int64_t tensor_pos(const struct bt_graph *g, const int64_t *pos, const struct bt_tensor *t) {
    if (!t) return INT64_MIN;
    if (!pos) {
        /* a view (no visited set: nodes only), or no memory for the side
         * table: the same positions by search */
        for (int i = 0; i < g->n_nodes; i++)
            if (g->nodes[i] == t) return -(int64_t)(i + 1);
        for (int i = 0; g->visited.size > 0 && i < g->n_leafs; i++)
            if (g->leafs[i] == t) return (int64_t)(i + 1);
        return 0;
    }
    const size_t i = bt_hash_find(&g->visited, t);
    if (i == BT_HASHSET_FULL || g->visited.keys[i] != t) return 0;
    return pos[i];
}

static uint64_t hash_tensor(uint64_t h, const struct bt_graph *g, const int64_t *pos,
                            const struct bt_tensor *t) {
    h = fnv_i64(h, t->op);
    h = fnv_i64(h, t->type);
    for (int d = 0; d < BT_MAX_DIMS; d++) {
        h = fnv_i64(h, t->ne[d]);
        h = fnv_i64(h, (int64_t)t->nb[d]);
    }
    h = fnv_i64(h, (int64_t)t->view_offs);
    h = fnv_i64(h, t->flags & ~(BT_TENSOR_FLAG_SCHED | BT_TENSOR_FLAG_REPACKED)); /* where a rank keeps it, how */
    h = fnv(h, t->op_params, sizeof t->op_params);
    for (int s = 0; s < BT_MAX_SRC; s++) h = fnv_i64(h, tensor_pos(g, pos, t->src[s]));
    h = fnv_i64(h, tensor_pos(g, pos, t->view_src));
    return h;
}

uint64_t bt_graph_hash(const struct bt_graph *g) {
    int64_t *pos = NULL;
    if (g->visited.size > 0) {
        pos = calloc(g->visited.size, sizeof *pos);
        for (int i = 0; pos && i < g->n_leafs; i++) pos[bt_hash_find(&g->visited, g->leafs[i])] = i + 1;
        for (int i = 0; pos && i < g->n_nodes; i++) pos[bt_hash_find(&g->visited, g->nodes[i])] = -(int64_t)(i + 1);
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv_i64(h, g->n_leafs);
    h = fnv_i64(h, g->n_nodes);
    for (int i = 0; i < g->n_leafs; i++) h = hash_tensor(h, g, pos, g->leafs[i]);
    for (int i = 0; i < g->n_nodes; i++) h = hash_tensor(h, g, pos, g->nodes[i]);
    free(pos);
    return h;
}

void bt_graph_print(const struct bt_graph *g, FILE *f) {
    fprintf(f, "graph: %d nodes, %d leafs\n", g->n_nodes, g->n_leafs);
    for (int i = 0; i < g->n_leafs; i++) {
        const struct bt_tensor *t = g->leafs[i];
        fprintf(f, "  leaf %3d %-24s %-5s [%lld, %lld, %lld, %lld]\n", i, t->name, bt_type_name(t->type),
                (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3]);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *t = g->nodes[i];
        fprintf(f, "  node %3d %-24s %-10s %-5s [%lld, %lld, %lld, %lld] <-", i, t->name, bt_op_name(t->op),
                bt_type_name(t->type), (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                (long long)t->ne[3]);
        for (int s = 0; s < BT_MAX_SRC; s++)
            if (t->src[s]) fprintf(f, " %s", t->src[s]->name);
        fprintf(f, "\n");
    }
}
