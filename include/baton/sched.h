/* sched.h - the multi-backend scheduler (ggml's ggml_backend_sched): the
 * splitter assigns every node to a backend in five passes and cuts the graph
 * into splits; the executor copies each split's inputs to its backend (through
 * a ring of n_copies slots, with events) and runs the splits in order.
 *
 * Usage, one micro-batch at a time:
 *     bt_sched_new(backends, NULL, n, graph_size, n_copies, &s, err, sizeof err);
 *     bt_sched_reserve(s, worst_case_graph);    optional: size buffers once
 *     bt_sched_alloc_graph(s, g);               plan (first time) + next slot
 *     bt_tensor_set(input, ...);                user inputs
 *     bt_sched_graph_compute(s, g);             copy inputs, run the splits
 *
 * The plan is made once per graph and kept: a later call with the same graph
 * (the same tensors, unchanged) only advances the copy slot.  A new plan
 * (another graph, bt_sched_reset, a new user assignment) reuses the memory
 * the scheduler gave the previous graph's tensors: their data, outputs
 * included, is not readable until that graph is allocated again.
 *
 * The previous graph is never written to by a new plan, so the usual loop
 * (a new graph every step, the previous step's context freed) is safe:
 * bt_sched_alloc_graph, bt_sched_graph_compute[_async] and bt_sched_reserve
 * leave the graph's sources as the user built them when they return (the
 * splits read the copies only while compute queues them), and the memory the
 * allocator placed (marked BT_TENSOR_FLAG_SCHED) is taken back when that
 * graph is planned again.  Only bt_sched_split_graph and bt_sched_set_cur_copy,
 * for a caller that runs the splits itself, leave the sources pointing at the
 * copies: then the graph must live until the next plan, bt_sched_reset or
 * bt_sched_free, which put them back.
 *
 * Weights are recognised by their buffer's usage (BT_BUFFER_USAGE_WEIGHTS)
 * or, for tensors without a buffer (a plan made for other processes), by
 * BT_TENSOR_FLAG_WEIGHT and a user assignment.
 */
#ifndef BATON_BT_SCHED_H
#define BATON_BT_SCHED_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef BT_SCHED_MAX_BACKENDS
#define BT_SCHED_MAX_BACKENDS 4096 /* a bound on arguments; memory grows with the split inputs, not with it */
#endif
#ifndef BT_SCHED_MAX_SPLIT_INPUTS
#define BT_SCHED_MAX_SPLIT_INPUTS 32
#endif
#ifndef BT_SCHED_MAX_COPIES
#define BT_SCHED_MAX_COPIES 8
#endif

typedef struct bt_sched *bt_sched_t;

/* Called twice per node of interest: first with ask = true ("do you want to
 * see t?"); if the answer is true, again with ask = false once t is computed
 * (its data readable); returning false then stops the run (BT_ERR_ABORTED). */
typedef bool (*bt_sched_eval_callback)(struct bt_tensor *t, bool ask, void *user_data);

struct bt_sched_split {
    int backend_id;
    int i_start, i_end; /* nodes [i_start, i_end) of the user's graph */
    struct bt_tensor *inputs[BT_SCHED_MAX_SPLIT_INPUTS];
    int n_inputs;
    struct bt_graph graph; /* view of the split's nodes (sources rewritten to copies) */
};

struct bt_sched_stats {
    uint64_t copy_calls;  /* input copies issued (an MoE expert run counts once) */
    uint64_t copy_bytes;  /* bytes copied into split inputs */
    uint64_t moe_copies;  /* of those, partial copies of expert weights */
    uint64_t splits_run;
};

/* backends in priority order, the last one the CPU (the fallback); bufts NULL
 * for each backend's default buffer type.  BT_OK and the scheduler in *out;
 * else *out NULL, BT_ERR_INVALID (a count out of range, a buffer type its
 * backend cannot use) or BT_ERR_NOMEM, and the message in err (n_err bytes:
 * a constructor has no object yet to keep it).  Nothing is printed. */
BT_API enum bt_status bt_sched_new(bt_backend_t *backends, bt_buffer_type_t *bufts, int n_backends, size_t graph_size,
                            int n_copies, bt_sched_t *out, char *err, size_t n_err);
/* Puts back the sources of a graph that bt_sched_split_graph or
 * bt_sched_set_cur_copy left rewritten (touches no other graph).  Tensors the
 * scheduler placed keep pointers into its freed memory. */
BT_API void bt_sched_free(bt_sched_t sched);

/* Forget the plan and every user assignment. */
BT_API void bt_sched_reset(bt_sched_t sched);

/* Pin a node or leaf to a backend before planning (never overwritten). */
BT_API void bt_sched_set_tensor_backend(bt_sched_t sched, struct bt_tensor *t, bt_backend_t backend);
/* The backend a tensor was assigned (NULL when none). */
BT_API bt_backend_t bt_sched_get_tensor_backend(bt_sched_t sched, struct bt_tensor *t);
BT_API int bt_sched_get_backend_id(bt_sched_t sched, const struct bt_tensor *t); /* -1 when none */

/* Plan only: the five passes and the split inputs (no memory).  Rewrites the
 * graph's node sources to the copies of the current slot, for a caller that
 * runs the splits' graphs itself (keep the graph alive: see above). */
BT_API enum bt_status bt_sched_split_graph(bt_sched_t sched, struct bt_graph *graph);

/* Plan (when graph is new) and size the buffers for it. */
BT_API enum bt_status bt_sched_reserve(bt_sched_t sched, struct bt_graph *measure_graph);
/* Plan when needed, allocate, and advance to the next copy slot. */
BT_API enum bt_status bt_sched_alloc_graph(bt_sched_t sched, struct bt_graph *graph);
/* alloc (when not yet done for this micro-batch) + run; _async may return
 * before the backends finish: bt_sched_synchronize waits. */
BT_API enum bt_status bt_sched_graph_compute_async(bt_sched_t sched, struct bt_graph *graph);
BT_API enum bt_status bt_sched_graph_compute(bt_sched_t sched, struct bt_graph *graph);
BT_API void bt_sched_synchronize(bt_sched_t sched);

/* Use copy slot c for the next run and point the rewritten sources at its
 * copies: the distributed runtime drives the ring itself. */
BT_API void bt_sched_set_cur_copy(bt_sched_t sched, int c);

BT_API void bt_sched_set_eval_callback(bt_sched_t sched, bt_sched_eval_callback cb, void *user_data);

/* The experts a MUL_MAT_ID's ids [K, T] (I32, any strides) select: used[e]
 * = 1 for each id e, 0 for the others; host holds the bytes of ids as
 * bt_tensor_get gives them (bt_nbytes(ids) from its first element).  An id
 * outside [0, n_expert) is BT_ERR_INVALID, named in err.  The scheduler's
 * used-experts copy and the distributed runtime's both read ids this way. */
BT_API enum bt_status bt_moe_used_experts(const struct bt_tensor *ids, const void *host, int64_t n_expert, uint8_t *used,
                                   char *err, size_t n_err);

BT_API bt_backend_t bt_sched_get_backend(bt_sched_t sched, int i);
BT_API int bt_sched_get_n_copies(bt_sched_t sched);
BT_API int bt_sched_get_cur_copy(bt_sched_t sched);
BT_API int bt_sched_get_n_splits(bt_sched_t sched);
BT_API const struct bt_sched_split *bt_sched_get_split(bt_sched_t sched, int i);
/* The copy of a split input on backend_id in slot c (NULL if none). */
BT_API struct bt_tensor *bt_sched_get_tensor_copy(bt_sched_t sched, const struct bt_tensor *t, int backend_id,
                                           int c);
BT_API size_t bt_sched_get_buffer_size(bt_sched_t sched, bt_backend_t backend);
BT_API struct bt_sched_stats bt_sched_get_stats(bt_sched_t sched);
BT_API const char *bt_sched_error(bt_sched_t sched);

/* A readable plan: each split, its backend, its nodes, its inputs and their
 * bytes.  Printed to stderr after each planning when BATON_SCHED_DEBUG is set
 * (1: splits and inputs, 2: also every node's backend and why). */
BT_API void bt_sched_print_plan(bt_sched_t sched, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
