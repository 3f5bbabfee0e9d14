/* cpu.h - the CPU executor: a persistent thread pool; every node of a graph
 * is computed by all threads together, each taking its share by (ith, nth),
 * with a barrier between nodes (ggml's ggml_graph_compute).
 *
 * Results never depend on the thread count: no output element's reduction is
 * split across threads, so 1, 2, 3 or 4 threads give bitwise equal results.
 */
#ifndef BATON_CPU_H
#define BATON_CPU_H

#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bt_cpu bt_cpu;

/* n_threads <= 0: the number of online cores.  NULL when threads cannot be
 * started. */
bt_cpu *bt_cpu_new(int n_threads);
void bt_cpu_free(bt_cpu *cpu);
int bt_cpu_n_threads(const bt_cpu *cpu);

/* Use the plain reference kernels (no SIMD, no blocking) for mul_mat and
 * mul_mat_id: kept for tests and for comparison in benchmarks. */
void bt_cpu_set_reference(bt_cpu *cpu, bool reference);

/* Can the CPU compute this node (op, types, layout)? */
bool bt_cpu_supports_op(const struct bt_tensor *node);

/* Compute nodes [0, n_nodes) in order.  Every tensor must have host data.
 * A run-time error (an expert id out of range, an unsupported op) stops the
 * run with a status and a message in bt_cpu_error(cpu). */
enum bt_status bt_cpu_graph_compute(bt_cpu *cpu, struct bt_graph *g);
const char *bt_cpu_error(const bt_cpu *cpu);

/* Called on the calling thread (thread 0 of the pool) after it has done its
 * share of each computed node, before the node's barrier: a place for short
 * work that must not wait for the whole graph, such as driving a transport's
 * progress between ops, without a thread of its own competing for the
 * cores.  It must not touch the graph.  NULL: none (the default). */
typedef void (*bt_cpu_node_hook)(void *user);
void bt_cpu_set_node_hook(bt_cpu *cpu, bt_cpu_node_hook fn, void *user);

/* Measured machine figures for benchmarks: streaming-read bandwidth in
 * bytes/s over `bytes` (>= 1 GiB recommended) with n_threads; FMA peak in
 * FLOP/s of n_threads cores (independent FMA chains). */
double bt_cpu_measure_read_bw(size_t bytes, int n_threads);
double bt_cpu_measure_fma_peak(int n_threads);

#ifdef __cplusplus
}
#endif
#endif
