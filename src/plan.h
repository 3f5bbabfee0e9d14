/* plan.h - the distributed plan as a value.  A pure function (no MPI, no
 * backend, nothing allocated for tensors) turns a graph, one description per
 * rank and the options into a plan: the owner of every node and leaf, the
 * layer ranges and predicted stage time of every rank, the splits, and the
 * transfers between ranks with their tags, and which of them go over the
 * device transport.  Rank 0 computes it and bt_dist_plan broadcasts it;
 * `baton plan` computes it from a topology file and prints it; tests check it
 * without mpiexec.  The runtime (dist.c) only carries it out.
 *
 * Layers are read from tensor names "blk.N." (as baton's model builder and
 * GGUF files name them); tensors before the first layer belong to rank 0,
 * after the last to the last rank, and a node named for a layer runs on its
 * layer's rank (where that rank supports it), so a boundary between two
 * ranks carries one activation.  Graph inputs (BT_TENSOR_FLAG_INPUT) are
 * owned by rank 0 but never travel: a rank that reads one is given it by its
 * own caller (inputs are known to every rank), into a slot of its own.
 * Graph outputs (BT_TENSOR_FLAG_OUTPUT) travel back to rank 0. */
#ifndef BATON_PLAN_H
#define BATON_PLAN_H

#include <stdio.h>

#include "baton/sched.h"
#include "baton/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef BT_PLAN_MAX_RANKS
#define BT_PLAN_MAX_RANKS 4096
#endif

struct bt_dist_pin {
    char pattern[64]; /* fnmatch glob on weight names */
    int rank;
    /* where the ops that read these weights run: false (the default) on
     * `rank`, with the weights (their inputs move there, their results
     * back: for a layer's experts, the routed activations), true on their
     * layer's rank (the weights move there every micro-batch) */
    bool compute_at_layer;
};

#ifndef BT_EXPERT_GROUP_MAX
#define BT_EXPERT_GROUP_MAX 16
#endif

/* An expert group: ranks that divide among them the routed experts of the
 * layers its first rank runs (the others run no layer of their own).  Each
 * such layer's chain of MUL_MAT_IDs (gate, up, the activation, down) runs on
 * every rank of the group over the experts that rank holds: member i holds
 * bt_expert_share(n_expert, n_ranks, i).  The first rank sends each member
 * the routing ids and the rows of the tokens that chose one of its experts,
 * and takes back exactly the rows those experts computed (dist.c).
 *
 * With dense set, the group also divides the rows of every dense product
 * of those layers (a MUL_MAT of a 2-d weight that nothing but MUL_MATs
 * reads, of at least BT_ROW_UNIT rows per rank): member i holds
 * bt_row_share(rows, n_ranks, i) of the weight, the first rank sends each
 * member the product's input and takes back the member's rows of its
 * result; the per-head products of an attention by heads
 * (bt_head_divisible); and a prompt's attention by q heads (dist.c:
 * attn_divisible).  With tokens set too, every member holds those dense
 * weights whole, and a ubatch of at least BT_TOKENS_MIN tokens divides
 * each dense product by tokens instead: member i computes every row for
 * its columns of the input (a contiguous range of tokens), so the first
 * rank sends it only those columns and takes back the same columns of the
 * result, each a contiguous piece of memory.
 * Every rank of the group then computes a share of every layer. */
#define BT_TOKENS_MIN 64
struct bt_expert_group {
    int32_t n_ranks;
    int32_t ranks[BT_EXPERT_GROUP_MAX]; /* ranks[0] runs the layers */
    bool dense;
    /* with dense: every rank holds the dense weights whole, and a ubatch of
     * at least BT_TOKENS_MIN tokens has its dense products divided by
     * tokens (each rank computes every row for its columns), a smaller
     * one's by rows (the topology's divide: tokens; CPU ranks only) */
    bool tokens;
    /* experts each rank holds past its share on either side (the
     * topology's pipeline.expert_overlap): the first rank then moves each
     * layer's boundaries between the ranks within them per ubatch, so that
     * each computes as many of the routed (token, expert) pairs as it can */
    int32_t overlap;
};

/* The experts member i of an n-rank group computes when the routing is
 * even, of n_expert: [*lo, *hi), contiguous ranges in member order whose
 * sizes differ by at most one. */
void bt_expert_share(int64_t n_expert, int n, int i, int64_t *lo, int64_t *hi);

/* The experts member i holds: its share and up to overlap experts on either
 * side of it (bt_expert_group). */
void bt_expert_hold(int64_t n_expert, int n, int i, int overlap, int64_t *lo, int64_t *hi);

/* The rows member i of an n-rank group holds of a dense weight of m rows:
 * [*lo, *hi), contiguous in member order, in whole units of BT_ROW_UNIT rows
 * (the CPU's unit of matmul work, a multiple of its repacked groups) but the
 * last, whose counts of units differ by at most one.  Empty for some member
 * when m < BT_ROW_UNIT n: such a weight is not divided. */
#define BT_ROW_UNIT 32
void bt_row_share(int64_t m, int n, int i, int64_t *lo, int64_t *hi);
/* Whether an n-rank group divides weight w of graph g by rows: a 2-d
 * contiguous weight of at least BT_ROW_UNIT n rows that only MUL_MATs read,
 * as their weight, each of an F32 input into an F32 result (contiguous). */
bool bt_row_divisible(const struct bt_graph *g, const struct bt_tensor *w, int n);
/* The group rank r is in (its index in groups), and r's place in it; -1 and
 * -1 when none. */
int bt_expert_group_of(const struct bt_expert_group *groups, int n_groups, int r, int *member);
/* Groups that n_ranks ranks can form: 2..BT_EXPERT_GROUP_MAX ranks each, each
 * rank in at most one, and rank 0 (which runs the model's first nodes) first
 * in its group if in one.  BT_ERR_INVALID and a message naming the group. */
enum bt_status bt_expert_groups_check(const struct bt_expert_group *groups, int n_groups, int n_ranks, char *err,
                                      size_t errlen);

/* What a rank tells rank 0 about itself. */
struct bt_rank_desc {
    char backend[32];  /* "CPU" / "CUDA0" ... */
    int32_t threads;
    int32_t device;    /* 1: the rank has a device transport (NCCL) */
    int64_t mem_bytes; /* usable memory */
    double gflops;     /* mul_mat speed */
};

struct bt_plan_options {
    int n_copies;               /* micro-batches in flight, 1..BT_SCHED_MAX_COPIES (0: 2) */
    const int *layers_per_rank; /* NULL: placed by the cost model; else one count per rank */
    const struct bt_dist_pin *pins;
    int n_pins;
    double link_gbps;           /* assumed rank-to-rank bandwidth (0: 5 GB/s) */
    /* ranks x ranks, [src * n + dst] != 0: the edge may use the device
     * transport when both ranks have one; NULL: every such edge may */
    const uint8_t *device_edges;
    /* the weights before the first layer and after the last go to the first
     * and the last rank that holds a layer (the engine's stages), not to rank
     * 0 and the last rank */
    bool ends_with_layers;
    /* expert groups: their first ranks run the layers, the others none */
    const struct bt_expert_group *groups;
    int n_groups;
};

struct bt_plan_split {
    int32_t rank;
    int32_t i_start, i_end; /* nodes [i_start, i_end) of the graph */
};

/* `tensor` (on src) is needed by split `consumer` (on dst) every
 * micro-batch, or is a graph output going back to rank 0 (consumer -1). */
struct bt_plan_transfer {
    int32_t tensor;   /* node index >= 0, or -(leaf index + 1) */
    int32_t src, dst;
    int32_t producer; /* split computing it, -1: a leaf, available at submit */
    int32_t consumer;
    int32_t tag0;     /* slot c uses tag tag0 + c */
    int32_t direct;   /* 1: over the device transport, backend memory to backend memory */
    int32_t pad_;
    int64_t bytes;
};

/* Graph input `tensor` (a leaf) is read by split `consumer` on `rank`, not
 * its owner: that rank's caller sets it (bt_dist_set_input) into n_copies
 * slots of its own; nothing travels. */
struct bt_plan_input {
    int32_t tensor;   /* -(leaf index + 1) */
    int32_t rank;
    int32_t consumer; /* the first split on `rank` that reads it */
    int32_t pad_;
    int64_t bytes;
};

struct bt_plan {
    int32_t n_ranks, n_copies, n_layers;
    int32_t n_nodes, n_leafs;
    int32_t n_splits, n_transfers, n_inputs;
    uint64_t graph_hash;
    struct bt_rank_desc *ranks;   /* [n_ranks], speeds smoothed as placed */
    int32_t *node_owner;          /* [n_nodes] */
    int32_t *leaf_owner;          /* [n_leafs] */
    int32_t *layer_first, *layer_last; /* [n_ranks], -1 when none */
    double *predicted_s;          /* [n_ranks] */
    struct bt_plan_split *splits; /* [n_splits] */
    struct bt_plan_transfer *transfers; /* [n_transfers], in the order their data is made */
    struct bt_plan_input *inputs; /* [n_inputs], graph inputs set on the ranks that read them */
    double seconds;               /* time bt_plan_make took */
    char error[512];              /* the message of the last failure */
};

/* Whether an n-rank group of CPU ranks (plan p) divides weight w of graph g
 * by matrices: a 3-d contiguous weight of at least n matrices that only
 * MUL_MATs read, as their weight, each of an F32 input of as many matrices
 * (rows packed, any strides between rows and matrices) into a contiguous F32
 * result: the per-head products of an attention (MLA's attn_k_b, attn_v_b).
 * Member i holds bt_expert_share(matrices, n, i) of them (expert_lo/hi),
 * the first rank sends each member its matrices of the input and takes back
 * those of the result. */
bool bt_head_divisible(const struct bt_plan *p, const struct bt_expert_group *grp, const struct bt_graph *g,
                       const struct bt_tensor *w);
/* Whether weight w of graph g holds the biases of experts, [n, E] (E the
 * experts of a MUL_MAT_ID's weight in g), that only GET_ROWS read (as their
 * table, by a routing's ids: gpt-oss's ffn_*_exps.bias): an expert group's
 * chains take them in, and every rank of the group holds them whole. */
bool bt_expert_bias(const struct bt_graph *g, const struct bt_tensor *w);
/* Whether every rank of group grp runs on a CPU backend (plan p). */
bool bt_group_on_cpu(const struct bt_plan *p, const struct bt_expert_group *grp);

/* The plan of `graph` on n_ranks ranks.  support: NULL (every rank runs every
 * op) or [n_ranks][n_nodes], nonzero where rank r can run node i.  On error a
 * status and p->error; p holds nothing to free either way until
 * bt_plan_free (which is safe on a zeroed or failed plan). */
enum bt_status bt_plan_make(struct bt_plan *p, struct bt_graph *graph, const struct bt_rank_desc *ranks, int n_ranks,
                            const uint8_t *support, const struct bt_plan_options *opt);
void bt_plan_free(struct bt_plan *p);

/* The plan in words: per rank its backend, layers, splits, nodes, weight
 * bytes, bytes received per micro-batch, predicted stage time; then every
 * boundary (a pair of ranks) with the tensors and bytes it carries per
 * micro-batch, and the graph inputs each rank sets itself. */
void bt_plan_print(const struct bt_plan *p, const struct bt_graph *graph, FILE *f);
/* The plan as canonical text (owners, splits, transfers, layers): two plans
 * are the same plan when their dumps are equal.  Speeds and timings are left
 * out (a live run measures them). */
void bt_plan_dump(const struct bt_plan *p, FILE *f);

/* A flat copy of the plan for a broadcast: *size bytes at *buf (malloc'd,
 * the caller frees). */
enum bt_status bt_plan_pack(const struct bt_plan *p, void **buf, size_t *size);
/* Back from bytes; every count is checked against size and against the
 * graph it is for (n_nodes, n_leafs). */
enum bt_status bt_plan_unpack(struct bt_plan *p, const void *buf, size_t size, const struct bt_graph *graph);

/* The splitter over one stand-in backend per rank, every node and leaf
 * pinned to its owner in p: the splits of p on the graph's own tensors, for
 * the runtime to execute (their sources rewritten to the copies of the
 * current slot).  Freed with bt_plan_splitter_free before the graph. */
typedef struct bt_plan_splitter bt_plan_splitter;
bt_plan_splitter *bt_plan_splitter_new(const struct bt_plan *p, struct bt_graph *graph, char *err, size_t errlen);
bt_sched_t bt_plan_splitter_sched(bt_plan_splitter *s);
/* A tensor's index in the graph (node >= 0, leaf -(i + 1)); INT32_MIN when
 * it is not one of the graph's. */
int bt_plan_splitter_index(const bt_plan_splitter *s, const struct bt_tensor *t);
/* The tensor a transfer's index names. */
struct bt_tensor *bt_plan_tensor(const struct bt_graph *graph, int32_t index);
void bt_plan_splitter_free(bt_plan_splitter *s);

#ifdef __cplusplus
}
#endif
#endif
