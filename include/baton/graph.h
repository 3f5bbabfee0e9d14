/* graph.h - the static graph: flat nodes[] / leafs[] arrays in topological
 * order, built by a post-order DFS from an output with a visited hash set
 * (open addressing on tensor pointers), as in ggml's ggml_cgraph.
 *
 *   leafs: tensors with op NONE (weights, inputs, constants)
 *   nodes: tensors with an op, every node after all of its sources
 */
#ifndef BATON_GRAPH_H
#define BATON_GRAPH_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef BT_DEFAULT_GRAPH_SIZE
#define BT_DEFAULT_GRAPH_SIZE 2048
#endif

#define BT_HASHSET_FULL ((size_t)-1)

/* Open-addressing set of tensor pointers (linear probing). */
struct bt_hash_set {
    size_t size; /* slots, a prime >= 2x the expected count */
    struct bt_tensor **keys;
};

BT_API size_t bt_hash_size(size_t min_size); /* smallest listed prime >= min_size */
/* The slot holding t, or the empty slot where t would go; BT_HASHSET_FULL
 * when neither exists. */
BT_API size_t bt_hash_find(const struct bt_hash_set *set, const struct bt_tensor *t);
BT_API bool bt_hash_contains(const struct bt_hash_set *set, const struct bt_tensor *t);
/* Slot index of t after insertion; BT_HASHSET_FULL when the set is full. */
BT_API size_t bt_hash_insert(struct bt_hash_set *set, struct bt_tensor *t);

struct bt_graph {
    int size;    /* capacity of nodes[] and of leafs[] */
    int n_nodes;
    int n_leafs;
    struct bt_tensor **nodes;
    struct bt_tensor **leafs;
    struct bt_hash_set visited; /* size 0 in a graph view */
    bt_context *ctx;            /* where errors are reported */
};

/* A graph with room for `size` nodes and `size` leafs, carved from ctx's
 * arena (the arena must have bt_graph_overhead(size) bytes left). */
BT_API struct bt_graph *bt_graph_new(bt_context *ctx, int size);
BT_API size_t bt_graph_overhead(int size);

/* Add t and everything it depends on (post-order DFS; a tensor reachable
 * twice is added once).  BT_ERR_CAPACITY with a message in the context when
 * the graph would exceed its size; BT_ERR_INVALID for a NULL tensor. */
BT_API enum bt_status bt_graph_build_forward_expand(struct bt_graph *g, struct bt_tensor *t);

/* Nodes [i0, i1) of g, no leafs, no hash set; shares g's arrays. */
BT_API struct bt_graph bt_graph_view(struct bt_graph *g, int i0, int i1);

/* i < 0 counts from the end (-1 is the last node). */
BT_API struct bt_tensor *bt_graph_node(const struct bt_graph *g, int i);
/* Index of t in nodes[] or -1. Linear in graph views; hashed otherwise. */
BT_API int bt_graph_node_index(const struct bt_graph *g, const struct bt_tensor *t);

/* A 64-bit hash of the graph's structure that two processes building the
 * same graph agree on: for every leaf and node in order its op, type, shape,
 * strides, view offset, flags, op params and the positions of its sources;
 * not data, not names, not addresses. */
BT_API uint64_t bt_graph_hash(const struct bt_graph *g);

/* One line per node and leaf on f (for debugging). */
BT_API void bt_graph_print(const struct bt_graph *g, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
