/* alloc.h - the graph allocator (ggml's gallocr): plans where every
 * intermediate tensor of a graph lives inside one or more backend buffers,
 * reusing the memory of tensors whose last consumer has run, and places the
 * tensors there.
 *
 *   reserve      plan a (worst-case) graph and grow each buffer to the plan's
 *                peak; nothing is placed
 *   alloc_graph  place the tensors of a graph of the same structure (e.g. a
 *                smaller batch) at the planned offsets; no allocation unless
 *                the graph no longer fits the plan
 *
 * The plan, node by node in graph order:
 *   - tensors that already have data (weights in their own buffer, tensors of
 *     a context with data) are neither allocated nor freed;
 *   - views (view_src != NULL) get no memory: alloc_graph gives them their
 *     view_src's data (bt_view_init);
 *   - every data-less leaf first, then the nodes flagged INPUT, then each node
 *     in order: its data-less sources, the node itself, and then every source
 *     whose consumers (and whose views' consumers) have all run is freed,
 *     unless it is flagged INPUT or OUTPUT;
 *   - an element-wise node (ADD SUB MUL DIV SCALE SQR SQRT SILU GELU RELU
 *     SIGMOID SWIGLU) takes the block of a source it is the last consumer of
 *     when the two have the same type and layout (in place);
 *   - each buffer is a best-fit allocator over aligned offsets whose peak is
 *     the buffer's size.
 *
 * Every failure (a buffer that cannot be had or exceeds its type's largest
 * size, a buffer id out of range, a graph that does not match the plan with
 * several buffers) returns false with one message in bt_gallocr_error.
 */
#ifndef BATON_ALLOC_H
#define BATON_ALLOC_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bt_gallocr *bt_gallocr_t;

/* One buffer of buft.  NULL when out of host memory. */
BT_API bt_gallocr_t bt_gallocr_new(bt_buffer_type_t buft);
/* Buffers 0..n_bufs-1; a buffer type that appears several times gets one
 * buffer (and one allocator) shared by those ids.  NULL when out of host
 * memory or n_bufs < 1. */
BT_API bt_gallocr_t bt_gallocr_new_n(bt_buffer_type_t *bufts, int n_bufs);
/* Frees the allocator and its buffers (tensors placed in them dangle). */
BT_API void bt_gallocr_free(bt_gallocr_t galloc);

/* Measure pass: plan addresses for graph and grow each buffer to the plan's
 * peak (a buffer never shrinks).  node_buffer_ids[i] / leaf_buffer_ids[i]
 * choose the buffer of node i / leaf i (NULL: all buffer 0).  Places nothing.
 * false (and a message) when an id is out of range, a view's source has no
 * data and is not in the graph, or a buffer cannot be allocated or exceeds
 * its buffer type's largest size. */
BT_API bool bt_gallocr_reserve(bt_gallocr_t galloc, struct bt_graph *graph);
BT_API bool bt_gallocr_reserve_n(bt_gallocr_t galloc, struct bt_graph *graph, const int *node_buffer_ids,
                          const int *leaf_buffer_ids);

/* Place every tensor of graph that has no data yet at its planned offset
 * (views: bt_view_init).  The graph must have the structure of the last
 * reserved one (node/leaf counts, ops, sources, flags); each tensor's size
 * may be smaller.  When it does not match, or a tensor no longer fits its
 * block, the graph is re-reserved automatically with one buffer; with
 * several buffers the call returns false with a message (the caller must
 * reserve_n again). */
BT_API bool bt_gallocr_alloc_graph(bt_gallocr_t galloc, struct bt_graph *graph);

/* Bytes of buffer buffer_id (0 before the first reserve).  A buffer shared by
 * several ids is counted once: the first of those ids reports its size, the
 * others 0, so a sum over the ids is the memory used. */
BT_API size_t bt_gallocr_get_buffer_size(bt_gallocr_t galloc, int buffer_id);
/* The buffer behind buffer_id (shared ids return the same one); NULL before
 * the first reserve that needed memory in it. */
BT_API bt_buffer_t bt_gallocr_get_buffer(bt_gallocr_t galloc, int buffer_id);
/* The message of the last failed call; "" after a call that succeeded. */
BT_API const char *bt_gallocr_error(bt_gallocr_t galloc);

#ifdef __cplusplus
}
#endif
#endif
