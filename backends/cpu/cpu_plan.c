/* cpu_plan.c - how the CPU executor runs a graph: which computed nodes
 * share a stretch between two barriers, which are computed by thread 0
 * alone, and where each node's part of the work buffer lies.  A pure
 * function of the graph (its ops, shapes and data addresses) and the thread
 * count; cpu.c only carries the plan out.
 *
 * A decode step is a few hundred nodes, most of them tiny (a norm over 2048
 * floats, a rope over 32 heads, a softmax over 8 experts), and ggml's
 * executor, which cpu.c followed, ends every node with a barrier: on two
 * cores the barriers, and a thread that the OS holds up at any of them, cost
 * more than the tiny nodes.  So:
 *
 *  - solo nodes: an op other than MUL_MAT, MUL_MAT_ID and FLASH_ATTN whose
 *    work is at most BT_CPU_SOLO_ELEMS elements runs on thread 0 alone
 *    (ith 0, nth 1: the kernels' results do not depend on nth); the other
 *    threads skip it.
 *  - a barrier only where it is needed: the nodes since the last barrier
 *    form the open stretch; node B joins it unless B would read memory that
 *    a node of the stretch writes, or write memory that one reads or
 *    writes (by address ranges, so every alias and every reuse of a buffer
 *    by the allocator counts) - except that two solo nodes never conflict,
 *    thread 0 running them in order.  Otherwise a barrier closes the stretch
 *    before B.  The last node is always followed by a barrier.
 *  - the work buffer: each node of a stretch gets its own part (nodes of
 *    one stretch may run at the same time on different threads); a part is
 *    the node's bt_cpu_work_size for the threads that run it.
 *
 * Nothing here changes what a kernel computes: every element's bits are
 * those of a run with a barrier after every node (tests/test_cpu_plan.c).
 *
 * The plan's key (bt_cpu_plan_key): every value of the graph the plan, the
 * work sizes and cpu.c's checks of the nodes read (of each computed node and
 * of its sources; a new one that reads more must add it to the key), so that
 * cpu.c keeps a plan while the key stays the same: the scheduler computes
 * one graph per ubatch shape again and again, and a graph rebuilt in the
 * same place with another cache length or other buffers gets another key.
 */
#include "cpu_impl.h"

#include <string.h>

#ifndef BT_CPU_SOLO_ELEMS
#define BT_CPU_SOLO_ELEMS 4096 /* elements of work at most for thread 0 alone */
#endif
#ifndef BT_CPU_STRETCH_MAX
#define BT_CPU_STRETCH_MAX 32 /* nodes in one stretch at most (bounds the checks) */
#endif

/* The bytes [lo, hi) a tensor's elements lie in. */
struct span {
    uintptr_t lo, hi;
};

static struct span span_of(const struct bt_tensor *t) {
    const uintptr_t lo = (uintptr_t)t->data;
    return (struct span){lo, lo + bt_nbytes(t)};
}

static bool overlap(struct span a, struct span b) { return a.lo < b.hi && b.lo < a.hi && a.lo < a.hi && b.lo < b.hi; }

static bool computes_nothing(const struct bt_tensor *node) {
    return bt_op_is_view(node->op) || node->op == BT_OP_NONE;
}

/* Elements of work a node does, for the solo rule. */
static int64_t work_elems(const struct bt_tensor *node) {
    switch (node->op) {
    case BT_OP_SET_ROWS: return bt_nelements(node->src[1]); /* the rows written, not the destination */
    case BT_OP_SUM_ROWS:
    case BT_OP_MEAN:
    case BT_OP_MOE_SUM: return bt_nelements(node->src[0]);
    default: return bt_nelements(node);
    }
}

bool bt_cpu_node_solo(const struct bt_tensor *node, int nth) {
    if (nth <= 1) return false;
    if (node->op == BT_OP_MUL_MAT || node->op == BT_OP_MUL_MAT_ID || node->op == BT_OP_FLASH_ATTN) return false;
    return work_elems(node) <= BT_CPU_SOLO_ELEMS;
}

/* A node of the open stretch: what it writes, what it reads. */
struct entry {
    struct span w, r[BT_MAX_SRC];
    bool solo;
};

static bool conflicts(const struct entry *a, const struct entry *b) {
    if (a->solo && b->solo) return false;
    for (int s = 0; s < BT_MAX_SRC; s++) {
        if (overlap(b->r[s], a->w) || overlap(a->r[s], b->w)) return true;
    }
    return overlap(a->w, b->w);
}

/* Words of the key per node at most: index and op, then for the node and
 * each source: type, ne, nb, data (a missing source: one word). */
#define KEY_TENSOR_WORDS (2 + 2 * BT_MAX_DIMS)
#define KEY_NODE_WORDS (2 + BT_MAX_OP_PARAMS / sizeof(uint64_t) + (1 + BT_MAX_SRC) * KEY_TENSOR_WORDS)

size_t bt_cpu_plan_key_words(int n_nodes) { return 3 + (size_t)n_nodes * KEY_NODE_WORDS; }

static uint64_t *key_tensor(uint64_t *k, const struct bt_tensor *t) {
    *k++ = (uint64_t)t->type;
    for (int d = 0; d < BT_MAX_DIMS; d++) *k++ = (uint64_t)t->ne[d];
    for (int d = 0; d < BT_MAX_DIMS; d++) *k++ = (uint64_t)t->nb[d];
    *k++ = (uint64_t)(uintptr_t)t->data;
    return k;
}

size_t bt_cpu_plan_key(const struct bt_graph *g, int nth, bool barrier_every_node, uint64_t *key) {
    uint64_t *k = key;
    *k++ = (uint64_t)g->n_nodes;
    *k++ = (uint64_t)nth;
    *k++ = barrier_every_node;
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *node = g->nodes[i];
        if (computes_nothing(node)) continue;
        *k++ = (uint64_t)i;
        *k++ = (uint64_t)node->op;
        memcpy(k, node->op_params, BT_MAX_OP_PARAMS); /* the checks read some (ROPE's mode, CONCAT's dim) */
        k += BT_MAX_OP_PARAMS / sizeof(uint64_t);
        k = key_tensor(k, node);
        for (int s = 0; s < BT_MAX_SRC; s++) {
            if (node->src[s]) k = key_tensor(k, node->src[s]);
            else *k++ = UINT64_MAX;
        }
    }
    BT_ASSERT((size_t)(k - key) <= bt_cpu_plan_key_words(g->n_nodes));
    return (size_t)(k - key);
}

static size_t align_up(size_t n) { return (n + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN; }

int bt_cpu_plan(const struct bt_graph *g, int nth, bool barrier_every_node, struct bt_cpu_step *steps,
                size_t *wsize) {
    struct entry open[BT_CPU_STRETCH_MAX];
    int n_open = 0, n = 0;
    size_t wtop = 0, wmax = 0; /* work buffer used by the open stretch; the most any stretch uses */
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *node = g->nodes[i];
        if (computes_nothing(node)) continue;
        struct entry e;
        memset(&e, 0, sizeof e);
        e.w = span_of(node);
        for (int s = 0; s < BT_MAX_SRC; s++)
            if (node->src[s]) e.r[s] = span_of(node->src[s]);
        e.solo = !barrier_every_node && bt_cpu_node_solo(node, nth);
        bool join = !barrier_every_node && n > 0 && n_open < BT_CPU_STRETCH_MAX;
        for (int k = 0; join && k < n_open; k++)
            if (conflicts(&open[k], &e)) join = false;
        if (!join && n > 0) {
            steps[n - 1].barrier = true;
            n_open = 0;
            wtop = 0;
        }
        struct bt_cpu_step *st = &steps[n++];
        st->node = i;
        st->solo = e.solo;
        st->barrier = false;
        st->wsize = align_up(bt_cpu_work_size(node, e.solo ? 1 : nth));
        st->wofs = wtop;
        wtop += st->wsize;
        if (wtop > wmax) wmax = wtop;
        open[n_open++] = e;
    }
    if (n > 0) steps[n - 1].barrier = true;
    *wsize = wmax;
    return n;
}
