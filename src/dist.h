/* dist.h - the distributed runtime: one backend per rank, a master splitter
 * on rank 0, cross-rank split inputs as transfers, and the n_copies ring
 * driving micro-batches through the ranks as a pipeline.
 *
 * Every rank runs the same program (SPMD) and makes the same calls:
 *
 *     bt_dist *d = bt_dist_new(transport, backend, &opt);
 *     bt_dist_plan(d, graph, init_weight, model);   collective
 *     for k in 0..M-1:
 *         bt_dist_set_input(d, tokens, ...)         (inputs of micro-batch k, every rank)
 *         bt_dist_submit(d);                          collective, asynchronous
 *         rank 0: bt_dist_get_output(d, k - lag, ...) (any of the last n_copies)
 *     bt_dist_synchronize(d);                         collective
 *
 * Planning: every rank hashes its graph and compares with rank 0 (a mismatch
 * stops all ranks with one message); rank 0 gathers each rank's description
 * (backend, memory, supported nodes, measured mul_mat speed), computes the
 * plan (plan.h: a value, the same function `baton plan` uses) and broadcasts
 * it; every rank derives the plan's splits on its own graph, allocates only
 * its own weights, compute memory, n_copies receive slots per incoming
 * transfer and n_copies send slots per outgoing one, n_copies slots per
 * graph input it reads but does not own, opens the device transport's
 * edges, and posts its first receives.
 *
 * Errors: every call returns a status, and bt_dist_error(d) gives the
 * message.  A collective call that fails on one rank fails on every rank with
 * that rank's message.  A failure in the middle of the pipeline (submit, a
 * transfer, draining the device transport at free) cannot be agreed on, as
 * the other ranks are blocked in transfers: it prints the rank's message and
 * ends every rank (the transport's abort) - the only aborts in the library.
 */
#ifndef BATON_DIST_H
#define BATON_DIST_H

#include "baton/backend.h"
#include "baton/sched.h"
#include "plan.h"
#include "trace.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_dist_options {
    int n_copies;                /* micro-batches in flight, 1..BT_SCHED_MAX_COPIES */
    const int *layers_per_rank;  /* NULL: placed by the cost model; else one count per rank */
    /* the nodes before the first layer and after the last go to the first and
     * the last rank that holds a layer (a model's stages: the embedding with
     * the first layers, the output head with the last), not to rank 0 and
     * the last rank */
    bool ends_with_layers;
    /* the transport tags of this runtime's transfers start here (several
     * runtimes over one transport, each with transfers posted ahead, keep
     * apart by giving each its own range) */
    int tag_base;
    const struct bt_dist_pin *pins;
    int n_pins;
    int64_t mem_limit;           /* bytes this rank may use (0: the machine's) */
    double link_gbps;            /* assumed rank-to-rank bandwidth for planning (0: 5 GB/s) */
    double gflops;               /* this rank's speed for planning (0: measured; measurements vary
                                    from run to run, a given figure makes the plan reproducible) */
    bool verbose;                /* print the plan on rank 0 */
    /* This rank's transport for backend memory to backend memory (NCCL
     * between CUDA ranks), NULL on ranks that have none; not owned.  A tensor
     * one rank's split computes for another rank's split goes over it when
     * both ranks have one and device_edges allows the edge; inputs, outputs
     * and every other edge go over the main transport, staged through the
     * backend's host memory (pinned for a GPU) when its memory is not the
     * host's.  It may match by posting order alone (no tags) and need not
     * cancel: baton opens its edges at plan time (connect), and posts both
     * ends of an edge in the order of the micro-batches, a receive as its
     * micro-batch starts (never ahead), so several runtimes over one
     * device transport keep their transfers apart. */
    bt_transport *device_transport;
    /* size x size, [src * size + dst] != 0: this edge may use the device
     * transport (rank 0's governs); NULL: every edge may */
    const uint8_t *device_edges;
    /* expert groups (plan.h: bt_expert_group): every rank must be given the
     * same; rank 0's plan places the layers on their first ranks */
    const struct bt_expert_group *groups;
    int n_groups;
    /* the weights this rank holds and no transfer sends go into this buffer
     * type, one the backend computes from (bt_backend_get_weight_buffer_type:
     * the CPU's repacks a matrix as its bytes are set); those a transfer
     * sends, and every weight when NULL, into the backend's default */
    bt_buffer_type_t weight_buft;
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
    int64_t bytes_routed;     /* of bytes_sent: the experts the routing chose (routed weights) */
    int64_t bytes_routed_whole; /* what those weights would have been, sent whole */
    int64_t bytes_group;      /* of bytes_sent: an expert group's ids and activation rows */
    int64_t expert_bytes_read; /* expert weight bytes an expert group's chains read here */
    double expert_s;          /* time computing an expert group's chains (its experts' rows) */
    int64_t weight_bytes;     /* weights held by this rank */
    int64_t compute_bytes;    /* compute buffer */
    int64_t slot_bytes;       /* receive + send + output slots */
    int64_t peak_bytes;       /* weights + compute + slots */
    int64_t rss_bytes;        /* the process's peak resident memory (getrusage) */
    int32_t n_nodes, n_weights, first_layer, last_layer;
    double bubble;            /* 1 - compute / wall */
    int64_t progress_calls;   /* BT_DIST_PROGRESS_COMPUTE: times the compute thread drove the transfers */
    int64_t attn_divided;     /* prompt attentions whose q heads this rank computed a share of (a group's) */
    int64_t expert_pairs;     /* routed (token, expert) pairs an expert group's chains computed here */
    int64_t experts_moved;    /* home: chains whose ranks' experts moved off the even shares (expert_overlap) */
    int64_t experts_cut;      /* home: of them, boundaries that fell inside an expert two ranks then shared */
};

/* How this rank's transfers in flight move while it computes: an MPI message
 * moves only while some thread of each end calls into MPI. */
enum bt_dist_progress {
    /* COMPUTE on a backend that calls a hook between ops
     * (bt_backend_set_node_hook: the CPU's, whose threads hold the cores: a
     * progress thread would take time from them), THREAD on any other (a
     * GPU rank's host thread is free while the device computes) */
    BT_DIST_PROGRESS_AUTO = 0,
    /* the compute thread tests the sends in flight between ops (a backend
     * with a node hook only; others fall back to THREAD), at most once per
     * period */
    BT_DIST_PROGRESS_COMPUTE,
    /* the transport's progress thread (bt_transport_mpi_init's progress_us)
     * runs while this rank computes */
    BT_DIST_PROGRESS_THREAD,
    /* only the waits between splits */
    BT_DIST_PROGRESS_NONE,
};

typedef struct bt_dist bt_dist;

/* Called on the owning rank for each of its weights, once allocated.  A
 * weight an expert group divides holds only this rank's share: the
 * matrices [expert_lo, expert_hi) of dimension 2, or the rows [row_lo,
 * row_hi) (expert_hi or row_hi > 0); data addresses matrix 0 (row 0), and
 * the callback writes only the share. */
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

/* Every rank, before each submit: the data of a graph input for the next
 * micro-batch (the same on every rank: inputs are known to every rank).  A
 * rank keeps it where the plan reads it (its owner, and every other rank
 * that reads it, into a slot of the micro-batch: inputs never travel), and
 * ignores it elsewhere.  A rank that reads an input not set for the
 * micro-batch fails its submit. */
enum bt_status bt_dist_set_input(bt_dist *d, struct bt_tensor *input, const void *data, size_t size);
/* bt_dist_set_input with the bt_dist as a void pointer (a callback's shape:
 * a callback that sets several inputs). */
enum bt_status bt_dist_set_input_fn(void *d, struct bt_tensor *input, const void *data, size_t size);
/* Collective: run the next micro-batch k = number of earlier submits. */
enum bt_status bt_dist_submit(bt_dist *d);
/* Micro-batches submitted since the plan (the next one's number). */
int64_t bt_dist_n_submitted(const bt_dist *d);
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

/* Called for the nodes of this rank's splits from now on, as the
 * scheduler's eval callback is (baton/sched.h: asked first, then shown each
 * node it wanted once computed); NULL: none.  A callback that answers false
 * after a node stops the pipeline, which ends every rank. */
void bt_dist_set_eval_callback(bt_dist *d, bt_sched_eval_callback cb, void *user);
/* The rank that computes a node / holds a leaf (-1 if not in the plan). */
int bt_dist_owner(const bt_dist *d, const struct bt_tensor *t);
/* The plan this rank carries out (the same on every rank); NULL before
 * bt_dist_plan. */
const struct bt_plan *bt_dist_get_plan(const bt_dist *d);
/* Without a transport, nothing allocated: what rank `rank` of the plan would
 * hold on backend (its type of memory; another of the same kind gives the
 * same sizes) when it runs the plan on graph: weight_bytes, compute_bytes
 * (the compute buffer), slot_bytes (transfer slots) and peak_bytes in *out
 * (the rest zero), with the expert groups the runtime is given.  What
 * `baton plan -m` prints per rank. */
enum bt_status bt_dist_measure(struct bt_graph *graph, const struct bt_plan *plan, const struct bt_expert_group *groups,
                               int n_groups, int rank, bt_backend_t backend,
                               struct bt_dist_stats *out, char *err, size_t n_err);
/* The plan in words (bt_plan_print). */
void bt_dist_print_plan(const bt_dist *d, FILE *f);
const char *bt_dist_error(const bt_dist *d);

/* ---- tracing: a Chrome trace (chrome://tracing, Perfetto) of every split's
 * compute, every send and every wait, per rank and micro-batch ---- */
/* Keep up to `capacity` events on this rank (0: stop tracing). */
enum bt_status bt_dist_enable_trace(bt_dist *d, int capacity);
/* Collective: rank 0 writes every rank's events to path as one JSON file
 * (written to a temporary name, then renamed: never half-written). */
enum bt_status bt_dist_write_trace(bt_dist *d, const char *path);

#ifdef __cplusplus
}
#endif
#endif
