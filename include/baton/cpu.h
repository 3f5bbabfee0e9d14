/* cpu.h - the CPU backend's public header (as ggml-cpu.h): the backend
 * (bt_backend_cpu_init and the calls only a CPU backend answers), and under
 * it the CPU executor: a persistent thread pool; every node of a graph
 * is computed by all threads together, each taking its share by (ith, nth),
 * or by thread 0 alone when it is tiny, with a barrier wherever a node needs
 * what earlier ones wrote (ggml's ggml_graph_compute has one after every
 * node; cpu_plan.c says where).
 *
 * Results never depend on the thread count: no output element's reduction is
 * split across threads, so 1, 2, 3 or 4 threads give bitwise equal results.
 */
#ifndef BATON_CPU_H
#define BATON_CPU_H

#include "backend.h"
#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the CPU backend (cpu_backend.c) ---------------------------------------- */

/* n_threads <= 0: every online core.  NULL when threads cannot start. */
BT_API bt_backend_t bt_backend_cpu_init(int n_threads);
BT_API bool bt_backend_is_cpu(bt_backend_t backend);
/* Per-op time of the graphs the backend computes while on (bt_cpu_set_profile,
 * bt_cpu_get_profile: the rows' meaning); on starts from zero. */
struct bt_cpu_op_profile;
BT_API void bt_backend_cpu_set_profile(bt_backend_t backend, bool on);
BT_API int bt_backend_cpu_get_profile(bt_backend_t backend, struct bt_cpu_op_profile *rows, int cap, uint64_t *n_graphs,
                               double *graph_s);

/* ---- the executor (cpu.c) ----------------------------------------------------- */

typedef struct bt_cpu bt_cpu;

/* n_threads <= 0: the number of online cores.  NULL when threads cannot be
 * started. */
BT_API bt_cpu *bt_cpu_new(int n_threads);
BT_API void bt_cpu_free(bt_cpu *cpu);
BT_API int bt_cpu_n_threads(const bt_cpu *cpu);

/* Use the plain reference kernels (no SIMD, no blocking) for mul_mat and
 * mul_mat_id: kept for tests and for comparison in benchmarks. */
BT_API void bt_cpu_set_reference(bt_cpu *cpu, bool reference);

/* A barrier after every node, every node on every thread (ggml's way): for
 * tests, which compare it with the plan (cpu_plan.c); off by default. */
BT_API void bt_cpu_set_barrier_every_node(bt_cpu *cpu, bool on);

/* How bt_cpu_graph_compute runs a graph (cpu_plan.c): one step per computed
 * node (views skip), in graph order. */
struct bt_cpu_step {
    int node;      /* index into g->nodes */
    bool solo;     /* thread 0 computes it alone; the other threads skip it */
    bool barrier;  /* every thread waits for all after it */
    size_t wofs;   /* its part of the work buffer: [wofs, wofs + wsize) */
    size_t wsize;
};
/* The plan for nth threads into steps (room for g->n_nodes); returns the
 * number of steps; *wsize: the work buffer it needs.  barrier_every_node:
 * a barrier after each step and no solo steps.  Nodes must have data. */
BT_API int bt_cpu_plan(const struct bt_graph *g, int nth, bool barrier_every_node, struct bt_cpu_step *steps,
                size_t *wsize);
/* What the plan of g depends on, as words into key (room for
 * bt_cpu_plan_key_words(g->n_nodes)); returns the count.  Two graphs with
 * equal keys have the same plan.  Nodes must have data. */
BT_API size_t bt_cpu_plan_key(const struct bt_graph *g, int nth, bool barrier_every_node, uint64_t *key);
BT_API size_t bt_cpu_plan_key_words(int n_nodes);
/* Plans made so far (bt_cpu_graph_compute keeps the last graph's plan while
 * its key stays the same). */
BT_API uint64_t bt_cpu_n_plans(const bt_cpu *cpu);

/* Can the CPU compute this node (op, types, layout)? */
BT_API bool bt_cpu_supports_op(const struct bt_tensor *node);

/* Compute nodes [0, n_nodes) in order.  Every tensor must have host data.
 * A run-time error (an expert id out of range, an unsupported op) stops the
 * run with a status and a message in bt_cpu_error(cpu). */
BT_API enum bt_status bt_cpu_graph_compute(bt_cpu *cpu, struct bt_graph *g);
BT_API const char *bt_cpu_error(const bt_cpu *cpu);

/* Called on the calling thread (thread 0 of the pool) after it has done its
 * share of each computed node (before the barrier that follows it, if
 * any): a place for short work that must not wait for the whole graph, such
 * as driving a transport's progress between ops, without a thread of its
 * own competing for the cores.  It must not touch the graph.  NULL: none
 * (the default). */
typedef void (*bt_cpu_node_hook)(void *user);
BT_API void bt_cpu_set_node_hook(bt_cpu *cpu, bt_cpu_node_hook fn, void *user);

/* Where a graph's time goes, per op and type (the type of the node's first
 * source, e.g. a matmul's weights; the node's own when it has none), as the
 * calling thread (thread 0) sees it: count of nodes, seconds computing its
 * share (all of a solo node), seconds waiting at the barrier after the
 * node, and for MUL_MAT / MUL_MAT_ID the weight bytes the node reads (a
 * MUL_MAT_ID: only the experts its ids choose).  graph_s: wall seconds of
 * the runs, n_graphs: their number.  bt_cpu_set_profile(cpu, true) starts
 * from zero; off by default (then nothing is timed). */
struct bt_cpu_op_profile {
    enum bt_op op;
    enum bt_type type;
    uint64_t count;
    double compute_s, wait_s, weight_bytes;
};
BT_API void bt_cpu_set_profile(bt_cpu *cpu, bool on);
/* Up to cap rows with a count (in op, then type order) into rows; returns
 * how many there are in all. */
BT_API int bt_cpu_get_profile(const bt_cpu *cpu, struct bt_cpu_op_profile *rows, int cap, uint64_t *n_graphs,
                       double *graph_s);

/* Repacked weights (repack.c).  A quantised weight matrix whose type has a
 * repacked layout (qtypes.h: Q8_0, Q4_0, MXFP4, Q4_K, Q6_K where the running kernels have
 * their AVX-512 VNNI or AVX2 versions; BF16 with rows of whole 16-element blocks on the
 * AVX2 kernels without AVX-512) and whose rows come in groups of 16 can hold its bytes
 * rearranged, 16 rows at a time, for the CPU's matmul (the decode then reads
 * 16 rows' bytes per vector with no transposition; the results are the same
 * bits as from the plain rows).  The size and every offset of the tensor stay
 * as they were.  Such a tensor carries BT_TENSOR_FLAG_REPACKED; only the CPU
 * backend's MUL_MAT / MUL_MAT_ID (as their weights) and GET_ROWS (as its
 * table, unpacking each row it takes) read it, as src[0] and whole: the
 * weights placed in the repack buffer type (below) are those that nothing
 * else reads and that no other backend computes with (bt_llm_load_gguf,
 * and the distributed runtime's weight_buft: a weight it sends stays
 * plain), and the core and the CPU executor assert that nothing else
 * touches it. */
BT_API bool bt_cpu_weight_repackable(const struct bt_tensor *t);
/* The repack buffer type (the CPU backend's weight buffer type,
 * bt_backend_get_weight_buffer_type): host memory in which a repackable
 * weight is repacked as its bytes are set (whole, or whole matrices of a 3-d
 * one); everything else is plain. */
BT_API bt_buffer_type_t bt_cpu_repack_buffer_type(void);
/* does this build repack weights of type t at all (its kernels built in)? */
BT_API bool bt_cpu_weight_repack_available(enum bt_type t);
/* t (repackable, with host data) <- the plain bytes of its type at plain
 * (bt_nbytes(t) of them, not overlapping t's), repacked; flags t. */
BT_API void bt_cpu_weight_repack(struct bt_tensor *t, const void *plain);
/* the plain bytes of a repacked t (bt_nbytes(t)) into plain */
BT_API void bt_cpu_weight_unpack(const struct bt_tensor *t, void *plain);
/* t, or the tensor it views, is repacked */
BT_API bool bt_cpu_weight_is_repacked(const struct bt_tensor *t);

/* The variant of the CPU kernels in use ("c", "avx2", "avx512",
 * "avx512bf16"): in a build of several (BATON_CPU_VARIANTS), the widest this
 * CPU runs, or the one the environment variable BATON_CPU names; every
 * variant gives the same bits. */
BT_API const char *bt_cpu_variant_name(void);
/* The variants this build holds, narrowest first: how many, the name of
 * variant i, and whether this CPU runs it. */
BT_API int bt_cpu_n_variants(void);
BT_API const char *bt_cpu_variant_name_at(int i);
BT_API bool bt_cpu_variant_runs(int i);

/* Measured machine figures for benchmarks: streaming-read bandwidth in
 * bytes/s over `bytes` (>= 1 GiB recommended) with n_threads; FMA peak in
 * FLOP/s of n_threads cores (independent FMA chains). */
BT_API double bt_cpu_measure_read_bw(size_t bytes, int n_threads);
BT_API double bt_cpu_measure_fma_peak(int n_threads);

#ifdef __cplusplus
}
#endif
#endif
