/* topology.h - topology files: which ranks run where, on which backend, and
 * how they talk.  Owns the YAML schema, its parser and every check the file
 * alone (or the file plus the MPI world size / the model's layer count) can make.
 *
 * A topology file (YAML, one document; configs/README.md is the guide):
 *
 *   hosts:                      # required, a list, at least one entry
 *     - name: gpu01             # required; letters, digits, '.', '_', '-'; unique
 *       slots: 64               # required, >= 1: process slots (cores) on the host
 *       gpus: 8                 # optional, >= 0 (default 0): CUDA devices on the host
 *       address: 10.0.0.11      # optional: what mpirun uses to reach the host
 *                               #   (hostfile/rankfile); default: name
 *       gpu_memory: 80GiB       # optional: memory of each of the host's GPUs, the
 *                               #   placement memory of its CUDA ranks that give
 *                               #   no memory: of their own (same units as memory)
 *       model: /data/m.gguf     # optional: the GGUF file's path on this host (overrides
 *                               #   pipeline.model for the ranks on it)
 *   ranks:                      # required, a list; ranks 0..N-1, each exactly once
 *     - rank: 0                 # required, the MPI rank this entry describes
 *       host: gpu01             # required, a name from hosts
 *       backend: cuda:0         # required: "cpu" or "cuda:N" (N: device index on host)
 *       threads: 8              # cpu ranks only, optional, >= 1 (default 1)
 *       memory: 70GiB           # optional limit, > 0 and < 2^63 bytes: B KiB MiB GiB
 *                               #   TiB KB MB GB TB, or a plain integer (bytes).
 *                               #   Placement plans with it; without it a live
 *                               #   run uses the device's free memory (CUDA) or
 *                               #   the host's memory / its ranks (CPU), and
 *                               #   `baton plan` the host's gpu_memory (CUDA: an
 *                               #   error when neither is given) or the memory
 *                               #   of the machine it runs on / the host's ranks
 *   pipeline:                   # optional
 *     micro_batches: 4          # 1..16 (default 1): micro-batches in flight (n_copies)
 *     partition: auto           # "auto" (default, cost model) or one layer count
 *                               #   per rank, e.g. [4, 4]; each >= 1
 *     pin:                      # optional: tensors whose name matches the glob
 *       - pattern: "blk.0.*"    #   (fnmatch) live on that rank, overriding
 *         rank: 0               #   the partition
 *         compute: pinned       #   optional: where the ops that read them run:
 *                               #   "pinned" (default: on that rank, their inputs
 *                               #   move there and their results back: for a
 *                               #   layer's experts, the routed activations) or
 *                               #   "layer" (on their layer's rank: the tensors
 *                               #   move there every micro-batch)
 *     model: /models/m.gguf     # optional: the GGUF file every rank opens (the same
 *                               #   path on every host), when the command names none
 *   transport:                  # optional
 *     host: mpi                 # host-memory edges: only "mpi" (default)
 *     device: nccl              # edges between two CUDA ranks: "nccl" or "mpi";
 *                               #   default nccl with >= 2 CUDA ranks, else mpi
 *     edges:                    # optional per-edge overrides
 *       - ranks: [0, 1]         #   two distinct ranks
 *         device: mpi           #   "nccl" or "mpi"
 *   mpi:                        # optional
 *     pml: ucx                  # "ucx" or "ob1"; absent: Open MPI chooses
 *     single_copy: cma          # "cma" or "none" (btl vader single-copy); absent:
 *                               #   Open MPI chooses
 *     extra_args: [--mca, btl_tcp_if_include, eth0]   # appended to mpirun's arguments
 *
 * Edges and NCCL.  An edge joins the rank that produces a tensor and a rank
 * that consumes it.  An edge with a CPU rank at either end always moves host
 * memory over MPI (a CUDA rank stages through pinned host memory); only an edge
 * between two CUDA ranks uses transport.device (or its entry in transport.edges).
 * So `device: nccl` is allowed in a file that mixes CPU and CUDA ranks, but it is
 * an error when the file has fewer than two CUDA ranks (nothing could use it),
 * and a transport.edges entry asking for nccl on an edge with a CPU rank is an
 * error.  Two ranks may not share one CUDA device of a host (NCCL refuses it).
 *
 * Errors.  Every mistake is one message "FILE:LINE:COLUMN: what is wrong"
 * (1-based, the key or value at fault, as libyaml marks it), written into the
 * caller's buffer; only a file that cannot be opened or read has no position
 * ("FILE: cannot open: No such file or directory").  On error *out is left
 * zeroed: nothing half-initialised, nothing to free.
 */
#ifndef BATON_TOPOLOGY_H
#define BATON_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/sched.h" /* BT_SCHED_MAX_BACKENDS */
#include "baton/tensor.h"   /* enum bt_status */

#ifdef __cplusplus
extern "C" {
#endif

/* The one rank limit: the runtime gives each rank one backend of the
 * splitter, which holds at most BT_SCHED_MAX_BACKENDS (a build may raise that).
 * A topology file, launch-files and `baton plan` refuse more ranks before
 * doing any work per rank; `baton demo` refuses a larger MPI world the same
 * way. */
#define BT_TOPO_MAX_RANKS BT_SCHED_MAX_BACKENDS
#ifndef BT_TOPO_MAX_HOSTS
#define BT_TOPO_MAX_HOSTS 4096 /* names are checked for duplicates pairwise */
#endif
#ifndef BT_TOPO_MAX_THREADS
#define BT_TOPO_MAX_THREADS 4096
#endif
#ifndef BT_TOPO_MAX_SLOTS
#define BT_TOPO_MAX_SLOTS 1048576
#endif
#ifndef BT_TOPO_MAX_GPUS
#define BT_TOPO_MAX_GPUS 1024
#endif
#define BT_TOPO_MAX_MICRO_BATCHES 16
#define BT_TOPO_MAX_EXPERT_OVERLAP 4096
/* Read before parsing: a topology is a few KiB; libyaml's parser is quadratic
 * in the nesting depth, so a deeply nested file is refused at the first level
 * past the limit (the schema needs 5). */
#ifndef BT_TOPO_MAX_FILE_BYTES
#define BT_TOPO_MAX_FILE_BYTES (1 << 20)
#endif
#ifndef BT_TOPO_MAX_DEPTH
#define BT_TOPO_MAX_DEPTH 16
#endif
/* memory: values are kept below 2^63 bytes (they become int64_t sizes) */
#define BT_TOPO_MAX_MEMORY ((uint64_t)INT64_MAX)

/* Where something was written: 1-based line and column; 0/0 when the file did
 * not write it (a default). */
struct bt_topo_pos {
    int line;
    int col;
};

enum bt_topo_backend {
    BT_TOPO_BACKEND_CPU = 0,
    BT_TOPO_BACKEND_CUDA,
};

enum bt_topo_link {
    BT_TOPO_LINK_MPI = 0,
    BT_TOPO_LINK_NCCL,
};

enum bt_topo_pml {
    BT_TOPO_PML_DEFAULT = 0, /* not given: Open MPI chooses */
    BT_TOPO_PML_UCX,
    BT_TOPO_PML_OB1,
};

enum bt_topo_single_copy {
    BT_TOPO_SINGLE_COPY_DEFAULT = 0, /* not given: Open MPI chooses */
    BT_TOPO_SINGLE_COPY_CMA,
    BT_TOPO_SINGLE_COPY_NONE,
};

struct bt_topo_host {
    char *name;
    char *address;          /* NULL when not given */
    int slots;              /* >= 1 */
    int gpus;               /* >= 0 */
    uint64_t gpu_memory;    /* bytes per GPU; 0 = not given */
    char *model;            /* the GGUF file's path on this host; NULL: pipeline.model */
    struct bt_topo_pos pos; /* the list entry */
    struct bt_topo_pos name_pos, slots_pos, gpus_pos, address_pos, gpu_memory_pos, model_pos;
};

struct bt_topo_rank {
    int rank; /* == its index in bt_topology.ranks */
    int host; /* index into bt_topology.hosts */
    enum bt_topo_backend backend;
    int threads;            /* cpu: >= 1; cuda: 1 */
    int device;             /* cuda: device index on the host; cpu: -1 */
    uint64_t memory;        /* bytes; 0 = no limit given */
    struct bt_topo_pos pos; /* the list entry */
    struct bt_topo_pos rank_pos, host_pos, backend_pos, threads_pos, memory_pos;
};

struct bt_topo_pin {
    char *pattern; /* fnmatch(3) glob on tensor names */
    int rank;
    bool compute_at_layer; /* compute: layer (the ops reading them run on their layer's rank) */
    struct bt_topo_pos pos, pattern_pos, rank_pos;
};

#define BT_TOPO_MAX_GROUP 16

/* pipeline.expert_groups: ranks that divide the routed experts of the layers
 * their first rank runs (plan.h: bt_expert_group) */
struct bt_topo_group {
    int n_ranks;
    int ranks[BT_TOPO_MAX_GROUP];
    struct bt_topo_pos pos;
};

struct bt_topo_edge {
    int a, b; /* a < b */
    enum bt_topo_link device;
    struct bt_topo_pos pos, ranks_pos, device_pos;
};

struct bt_topology {
    char *path; /* as given to bt_topology_load */
    struct bt_topo_pos root_pos;

    struct bt_topo_host *hosts;
    int n_hosts;
    struct bt_topo_pos hosts_pos; /* the "hosts" key */

    struct bt_topo_rank *ranks; /* ranks[r].rank == r */
    int n_ranks;
    struct bt_topo_pos ranks_pos; /* the "ranks" key */

    struct {
        int micro_batches;   /* n_copies, 1..16 */
        bool partition_auto; /* true: the cost model places layers */
        int *layers;         /* !partition_auto: n_ranks layer counts, each >= 1 (0 for a group's members) */
        int64_t layers_sum;
        struct bt_topo_pin *pins;
        int n_pins;
        struct bt_topo_group *groups;
        int n_groups;
        bool divide_dense; /* divide: all or tokens: the groups divide every dense product too */
        bool divide_tokens; /* divide: tokens: by a prompt's tokens, the dense weights whole on every rank */
        int expert_overlap; /* experts a group's rank holds past its even share on either side */
        char *model; /* NULL when the file names none */
        struct bt_topo_pos pos, micro_batches_pos, partition_pos, pin_pos, model_pos;
    } pipeline;

    struct {
        enum bt_topo_link host;   /* always MPI */
        enum bt_topo_link device; /* between two CUDA ranks (default resolved) */
        bool device_given;
        struct bt_topo_edge *edges;
        int n_edges;
        struct bt_topo_pos pos, host_pos, device_pos, edges_pos;
    } transport;

    struct {
        enum bt_topo_pml pml;
        enum bt_topo_single_copy single_copy;
        char **extra_args;
        int n_extra_args;
        struct bt_topo_pos pos, pml_pos, single_copy_pos, extra_args_pos;
    } mpi;
};

/* Parse and validate what the file alone can tell.  BT_OK, or BT_ERR_IO (cannot
 * open / read) or BT_ERR_INVALID (any mistake in the file) with the message in
 * err.  On error *out is zeroed. */
enum bt_status bt_topology_load(const char *path, struct bt_topology *out, char *err,
                                size_t errlen);

/* The file's rank count against the MPI world size. */
enum bt_status bt_topology_check_world(const struct bt_topology *t, int world_size, char *err,
                                       size_t errlen);

/* An explicit partition must add up to the model's layer count (auto: always fine). */
enum bt_status bt_topology_check_layers(const struct bt_topology *t, int n_layers, char *err,
                                        size_t errlen);

/* Free what load allocated and zero *t (a zeroed struct is fine to free). */
void bt_topology_free(struct bt_topology *t);

/* ---- helpers for the runtime and the launcher ---- */

/* Rank r's entry (NULL when r is out of range). */
const struct bt_topo_rank *bt_topology_rank(const struct bt_topology *t, int r);
/* Host h's entry (NULL when out of range). */
const struct bt_topo_host *bt_topology_host(const struct bt_topology *t, int h);
/* What mpirun calls host h: its address if given, else its name. */
const char *bt_topology_host_target(const struct bt_topology *t, int h);

/* Index of rank r among the ranks on its host, counted in rank order (this is
 * Open MPI's OMPI_COMM_WORLD_LOCAL_RANK under the launcher's rankfile); -1 when r
 * is out of range. */
int bt_topology_local_rank(const struct bt_topology *t, int r);
/* The memory rank r plans with, as the file gives it: its memory:, else
 * for a CUDA rank its host's gpu_memory:; 0 when none is given. */
uint64_t bt_topology_rank_memory(const struct bt_topology *t, int r);
/* Number of ranks placed on host h. */
int bt_topology_host_ranks(const struct bt_topology *t, int h);
/* Cores the ranks on host h want: the sum of cpu threads, plus 1 per cuda rank. */
int64_t bt_topology_host_threads(const struct bt_topology *t, int h);
/* True when host h's ranks outnumber its slots (mpirun needs --oversubscribe). */
bool bt_topology_host_oversubscribed(const struct bt_topology *t, int h);
bool bt_topology_any_oversubscribed(const struct bt_topology *t);
/* True when host h's ranks' threads outnumber its slots (ranks should yield). */
bool bt_topology_host_threads_exceed(const struct bt_topology *t, int h);
bool bt_topology_any_threads_exceed(const struct bt_topology *t);

int bt_topology_n_cuda(const struct bt_topology *t);
bool bt_topology_has_cuda(const struct bt_topology *t);

/* The transport for an edge between ranks a and b (a != b): MPI when either is a
 * cpu rank; else the edge's override in transport.edges, else transport.device. */
enum bt_topo_link bt_topology_edge_link(const struct bt_topology *t, int a, int b);

#ifdef __cplusplus
}
#endif

#endif
