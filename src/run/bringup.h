/* bringup.h - one rank's bring-up, the same for every subcommand that runs a
 * graph over MPI ranks (demo today; generate, bench model, serve): a topology
 * file (or plain mpirun) -> MPI, this rank's backend (CPU threads or a CUDA
 * device), the device transport (NCCL between CUDA ranks) and the options for
 * bt_dist_new.  Also the rank descriptions a topology implies, which
 * `baton plan` hands to the same planner the live run uses.
 *
 * Errors: a status and r->error; every rank returns the same status and the
 * message of the lowest failing rank once MPI is up (before it, each rank
 * reads the same file and fails the same way).  r->exit_code says how the
 * program should exit: 1 for a bad file or a failed start, 2 for a bad
 * option value. */
#ifndef BATON_BRINGUP_H
#define BATON_BRINGUP_H

#include <stdbool.h>

#include "dist.h"
#include "topology.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_rank_config {
    const char *prog;      /* the start of every message: "baton demo" */
    const char *topology;  /* a topology file; NULL or "": none (every rank on `backend`) */
    const char *backend;   /* without a topology: "cpu" (also NULL) or "cuda" */
    int threads;           /* CPU threads; 0: the topology's, else cores / ranks on the node */
    int copies;            /* micro-batches in flight; 0: the topology's, else 2 */
    const char *partition; /* NULL: the topology's; "auto" or layer counts "4,4" */
    int n_layers;          /* the model's layers, to check a fixed partition against */
    int progress_us;       /* the MPI progress thread's period (0: none) */
};

struct bt_rank {
    bt_transport *t;          /* MPI, every rank */
    bt_transport *device_t;   /* NCCL between CUDA ranks, or NULL */
    bt_backend_t backend;
    struct bt_topology topo;
    bool have_topo;
    int rank, size, threads, copies;
    struct bt_dist_options dist; /* for bt_dist_new; points into this struct */
    int exit_code;
    char error[1024];
    /* rank 0: what the user should know of how the run goes on (GPU-to-GPU
     * transfers over MPI instead of NCCL, and why), empty when nothing; the
     * program prints it (the library prints nothing) */
    char note[256];
    /* owned by the struct, read through `dist` */
    int *layer_counts;
    struct bt_dist_pin *pins;
    struct bt_expert_group *groups; /* the topology's expert groups (NULL: none) */
    uint8_t *device_edges;
};

/* Bring this rank up in one call (MPI_Init included: argc/argv as main's):
 * bt_rank_start, then bt_rank_setup.  On failure r->t may be NULL (before
 * MPI) or not; bt_rank_free is right either way. */
enum bt_status bt_rank_init(struct bt_rank *r, const struct bt_rank_config *c, int *argc, char ***argv);

/* The same in two steps, for a program whose ranks first agree on their
 * command lines (src/cli/agree.h) once MPI is up:
 * bt_rank_start reads the topology file and starts MPI (a CUDA rank's device
 * made current first).  `failed`: the program has already found an error
 * (the file is then not read).  After a failure (the program's or the
 * file's: the status returned) MPI starts only when start_mpi_on_error (the
 * process is one of several ranks, which then agree on the failure so that
 * the job ends with one message); r->t is NULL otherwise. */
enum bt_status bt_rank_start(struct bt_rank *r, const struct bt_rank_config *c, bool failed, bool start_mpi_on_error,
                             int *argc, char ***argv);
/* --partition's layer counts "4,4", one per rank, into counts[0..n): false
 * and one message in err (not a list of positive counts, or not n of them). */
bool bt_partition_parse(const char *s, int *counts, int n, char *err, size_t n_err);

/* --backend and a topology (its path; $BATON_TOPOLOGY's when topology is
 * getenv's pointer) do not go together: the topology names each rank's
 * backend.  False, with "--backend B and the topology F: ..." in err, when
 * both are given (bt_rank_start refuses them too). */
bool bt_rank_backend_topology_check(const char *backend, const char *topology, char *err, size_t n);
/* Collective: the topology against the world, copies, threads, partition,
 * this rank's backend, the device transport, r->dist. */
enum bt_status bt_rank_setup(struct bt_rank *r, const struct bt_rank_config *c);
/* Device transport, backend, topology, then MPI_Finalize. */
void bt_rank_free(struct bt_rank *r);

/* Collective over t: every rank learns whether any failed (st != BT_OK) and
 * returns the lowest failing rank's status, with its message in msg (n_msg
 * bytes, the same size on every rank) and its exit code in *exit_code (may be
 * NULL); BT_ERR_COMM with the transport's message when that fails. */
enum bt_status bt_rank_agree(bt_transport *t, enum bt_status st, int *exit_code, char *msg, size_t n_msg);

/* A topology's pipeline as planning options: layer counts per rank (NULL for
 * `partition: auto`), pins, expert groups, micro-batches in flight (at most
 * the scheduler's ring), and the edges between two CUDA ranks that ask for
 * nccl as a ranks x ranks matrix (NULL when none).  Arrays into *counts,
 * *pins, *groups, *edges (the caller frees them).  BT_ERR_NOMEM when out of
 * memory. */
enum bt_status bt_topology_plan_options(const struct bt_topology *t, struct bt_plan_options *opt, int **counts,
                                        struct bt_dist_pin **pins, struct bt_expert_group **groups, uint8_t **edges);
/* The description each rank of a topology gives rank 0, as far as the file
 * says: CPU ranks at cpu_gflops per thread, CUDA ranks at gpu_gflops with a
 * device transport; memory as bt_topology_rank_memory gives it (what a live
 * run on the file plans with), else for a CPU rank this machine's memory
 * divided among the host's ranks.  A CUDA rank without memory in the file is
 * BT_ERR_INVALID naming it (a live run would use its device's free memory,
 * which only that device can tell); out of memory BT_ERR_NOMEM.  *out is
 * malloc'd (the caller frees it). */
enum bt_status bt_topology_rank_descs(const struct bt_topology *t, double cpu_gflops, double gpu_gflops,
                                      struct bt_rank_desc **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
