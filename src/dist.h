/* dist.h - the distributed runtime: one backend per rank, a master splitter
 * on rank 0, cross-rank split inputs as transfers, and the n_copies ring
 * driving micro-batches through the ranks as a pipeline.
 *
 * Every rank runs the same program (SPMD) and makes the same calls:
 *
 *     bt_dist *d = bt_dist_new(transport, backend, &opt);
 *     bt_dist_plan(d, graph, init_weight, model);   collective
 *     for k in 0..M-1:
 *         rank 0: bt_dist_set_input(d, tokens, ...)  (inputs of micro-batch k)
 *         bt_dist_submit(d);                          collective, asynchronous
 *         rank 0: bt_dist_get_output(d, k - lag, ...) (any of the last n_copies)
 *     bt_dist_synchronize(d);                         collective
 *
 * Planning: every rank hashes its graph and compares with rank 0 (a mismatch
 * stops all ranks with one message); rank 0 gathers each rank's description
 * (backend, memory, supported nodes, measured mul_mat speed), places the
 * weights layer by layer so that the slowest stage is as fast as possible
 * within each rank's memory (or as the options fix), runs the splitter with one
 * backend per rank and broadcasts the assignment; every rank re-derives the
 * same splits from it, allocates only its own weights, compute memory,
 * n_copies receive slots per incoming transfer and n_copies send slots per
 * outgoing one, opens the device transport's edges, and posts its first
 * receives.
 *
 * Layers are read from tensor names "blk.N." (as baton's model builder and
 * GGUF files name them); tensors before the first layer belong to rank 0,
 * after the last to the last rank.  Graph inputs (BT_TENSOR_FLAG_INPUT) live
 * on rank 0; graph outputs (BT_TENSOR_FLAG_OUTPUT) travel back to rank 0.
 */
#ifndef BATON_DIST_H
#define BATON_DIST_H

#include "../transport/transport.h"
#include "backend.h"
#include "bt_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef BT_DIST_MAX_RANKS
#define BT_DIST_MAX_RANKS 256
#endif

struct bt_dist_pin {
    char pattern[64]; /* fnmatch glob on weight names */
    int rank;
};

struct bt_dist_options {
    int n_copies;                /* micro-batches in flight, 1..BT_SCHED_MAX_COPIES */
    const int *layers_per_rank;  /* NULL: placed by the cost model; else one count per rank */
    const struct bt_dist_pin *pins;
    int n_pins;
    int64_t mem_limit;           /* bytes this rank may use (0: the machine's) */
    double link_gbps;            /* assumed rank-to-rank bandwidth for planning (0: 5 GB/s) */
    bool verbose;                /* print the plan on rank 0 */
    /* This rank's transport for backend memory to backend memory (NCCL
     * between CUDA ranks), NULL on ranks that have none; not owned.  A tensor
     * one rank's split computes for another rank's split goes over it when
     * both ranks have one and device_edges allows the edge; inputs, outputs
     * and every other edge go over the main transport, staged through the
     * backend's host memory (pinned for a GPU) when its memory is not the
     * host's.  It may match by posting order alone (no tags) and need not
     * cancel: baton opens its edges at plan time (connect), posts both ends
     * of an edge in the same order, and at free sends what receives were
     * posted ahead for. */
    bt_transport *device_transport;
    /* size x size, [src * size + dst] != 0: this edge may use the device
     * transport (rank 0's governs); NULL: every edge may */
    const uint8_t *device_edges;
};

struct bt_rank_desc {
    char backend[32];  /* "CPU" / "CUDA0" ... */
    int32_t threads;
    int64_t mem_bytes; /* usable memory */
    double gflops;     /* measured mul_mat speed */
};

struct bt_dist_stats {
    int32_t rank;
    int32_t n_splits;         /* splits this rank runs per micro-batch */
    int64_t micro_batches;
    double compute_s;         /* time in split computes */
    double wait_s;            /* time blocked on incoming transfers */
    double send_s;            /* time staging and posting sends (incl. waiting for a free send slot) */
    double wall_s;            /* first submit to the end of synchronize */
    int64_t bytes_sent, bytes_recv;
    int64_t bytes_direct;     /* of bytes_sent: over the device transport */
    int64_t weight_bytes;     /* weights held by this rank */
    int64_t compute_bytes;    /* compute buffer */
    int64_t slot_bytes;       /* receive + send + output slots */
    int64_t peak_bytes;       /* weights + compute + slots */
    int64_t rss_bytes;        /* the process's peak resident memory (getrusage) */
    int32_t n_nodes, n_weights, first_layer, last_layer;
    double bubble;            /* 1 - compute / wall */
    int64_t progress_calls;   /* BT_DIST_PROGRESS_COMPUTE: times the compute thread drove the transfers */
};

/* How this rank's transfers in flight move while it computes: an MPI message
 * moves only while some thread of each end calls into MPI. */
enum bt_dist_progress {
    /* COMPUTE on a CPU backend (its threads hold the cores: a progress
     * thread would take time from them), THREAD on any other (a GPU rank's
     * host thread is free while the device computes) */
    BT_DIST_PROGRESS_AUTO = 0,
    /* the compute thread tests the sends in flight between ops (CPU backend
     * only; others fall back to THREAD), at most once per period */
    BT_DIST_PROGRESS_COMPUTE,
    /* the transport's progress thread (bt_transport_mpi_init's progress_us)
     * runs while this rank computes */
    BT_DIST_PROGRESS_THREAD,
    /* only the waits between splits */
    BT_DIST_PROGRESS_NONE,
};

typedef struct bt_dist bt_dist;

/* Called on the owning rank for each of its weights, once allocated. */
typedef void (*bt_dist_weight_init_fn)(struct bt_tensor *weight, void *user);

/* The rank's one backend and its transport (neither owned). */
bt_dist *bt_dist_new(bt_transport *t, bt_backend_t backend, const struct bt_dist_options *opt);
/* Collective (every rank frees): waits for the outputs of submitted
 * micro-batches, cancels receives posted ahead, and gives the graph back as
 * built; free it before the context that holds the graph. */
void bt_dist_free(bt_dist *d);

/* Collective.  On error every rank returns the same status and rank 0's
 * message (bt_dist_error); nothing is left allocated half-way. */
enum bt_status bt_dist_plan(bt_dist *d, struct bt_graph *graph, bt_dist_weight_init_fn init, void *user);

/* Rank 0: data of a graph input for the next submit. */
enum bt_status bt_dist_set_input(bt_dist *d, struct bt_tensor *input, const void *data, size_t size);
/* Collective: run the next micro-batch k = number of earlier submits. */
enum bt_status bt_dist_submit(bt_dist *d);
/* Rank 0: an output of micro-batch k (one of the last n_copies submitted). */
enum bt_status bt_dist_get_output(bt_dist *d, int k, const struct bt_tensor *output, void *dst, size_t size);
/* Collective: wait until every submitted micro-batch has finished everywhere. */
enum bt_status bt_dist_synchronize(bt_dist *d);

/* Collective: every rank's statistics to rank 0 (out: size entries). */
enum bt_status bt_dist_gather_stats(bt_dist *d, struct bt_dist_stats *out);
struct bt_dist_stats bt_dist_local_stats(const bt_dist *d);
void bt_dist_reset_stats(bt_dist *d);
/* Choose how transfers move while this rank computes (default AUTO, every
 * 50 us); any time between submits. */
void bt_dist_set_progress(bt_dist *d, enum bt_dist_progress mode, int period_us);

/* The rank that computes a node / holds a leaf (-1 if not in the plan). */
int bt_dist_owner(const bt_dist *d, const struct bt_tensor *t);
int bt_dist_rank(const bt_dist *d);
int bt_dist_size(const bt_dist *d);
/* Rank 0 after planning: descriptions of all ranks and the layer ranges. */
const struct bt_rank_desc *bt_dist_rank_desc(const bt_dist *d, int rank);
/* Per rank: first and last layer (-1, -1 when it holds none). */
void bt_dist_rank_layers(const bt_dist *d, int rank, int *first, int *last);
/* Rank 0: the plan in words (per rank: layers, splits, nodes, weight bytes,
 * transfers per micro-batch, predicted stage time). */
void bt_dist_print_plan(const bt_dist *d, FILE *f);
const char *bt_dist_error(const bt_dist *d);

/* ---- tracing: a Chrome trace (chrome://tracing, Perfetto) of every split's
 * compute, every send and every wait, per rank and micro-batch ---- */
enum bt_trace_kind { BT_TRACE_COMPUTE = 0, BT_TRACE_WAIT = 1, BT_TRACE_SEND = 2 };
struct bt_trace_event {
    double ts_us, dur_us; /* from the common start (after a barrier) */
    int32_t kind, k, split, peer;
    int64_t bytes;
};
/* Keep up to `capacity` events on this rank (0: stop tracing). */
enum bt_status bt_dist_enable_trace(bt_dist *d, int capacity);
/* Collective: rank 0 writes every rank's events to path as one JSON file
 * (written to a temporary name, then renamed: never half-written). */
enum bt_status bt_dist_write_trace(bt_dist *d, const char *path);

/* The layer a tensor name belongs to ("blk.N." -> N), -1 when none. */
int bt_dist_name_layer(const char *name);

/* Measure a backend's mul_mat speed in GFLOP/s (a ~50 ms probe). */
double bt_backend_measure_gflops(bt_backend_t backend);

/* The plan without running it: rank descriptions given (one per rank), the
 * same placement and splitter as bt_dist_plan.  For `baton plan`. */
enum bt_status bt_dist_plan_offline(struct bt_graph *graph, const struct bt_rank_desc *ranks, int n_ranks,
                                    const struct bt_dist_options *opt, FILE *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
