/* project.h - throughput of a pipeline on a cluster that baton cannot run
 * here, on paper: `baton plan --project FILE`.  A pure function turns the
 * layer costs of a model graph (place.h) and a cluster (nodes x devices, a
 * device's speed and memory, the link inside a node and the one between
 * nodes) into stage times, the pipeline bubble, tokens/s and the bottleneck.
 *
 * The model is baton's own cost model, carried to P stages of one device
 * each: a stage's time is its FLOPs over the device's effective speed plus
 * the time to receive its input (latency + bytes / bandwidth of the link it
 * crosses, inside a node or between nodes), as src/place.c costs a stage.
 * M micro-batches take  sum(stage) + (M - 1) * max(stage)  (the first one
 * fills the pipeline, then the slowest stage sets the pace). */
#ifndef BATON_PROJECT_H
#define BATON_PROJECT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "place.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_PROJECT_MAX_STAGES 4096

struct bt_link_class {
    char name[96];
    double gbytes_s;   /* GB/s (1e9 bytes) one way */
    double latency_us; /* one way, small message */
};

/* The decode section of a cluster file: one token per sequence a step,
 * each node one host (devices_per_node 1), pipeline stages against expert
 * groups (bt_project_decode). */
#define BT_DECODE_MAX_CASES 8
struct bt_decode_options {
    bool given;
    double gbytes_s;    /* a host's memory bandwidth, GB/s */
    double weight_bits; /* 0: the model's own types; else every matrix at this many bits a weight */
    int n_hosts, hosts[BT_DECODE_MAX_CASES];
    int n_seqs, seqs[BT_DECODE_MAX_CASES];
};

struct bt_cluster {
    int nodes, devices_per_node;
    char device[96];
    double device_gflops; /* effective: peak x efficiency */
    int64_t device_mem;   /* bytes for weights */
    struct bt_link_class intra, inter;
    int micro_batches;
    struct bt_decode_options decode;
};

struct bt_project_stage {
    int first, last;    /* layers, inclusive (-1: none) */
    bool cross_node;    /* its input comes over the link between nodes */
    double compute_s, recv_s, stage_s;
    double weight_bytes;
};

struct bt_projection {
    int P, M, tokens;
    struct bt_project_stage *stage; /* [P] */
    double pass_s;     /* one micro-batch through every stage */
    double step_s;     /* M micro-batches */
    double tokens_s;
    double bubble;     /* idle share of the devices' time over the step */
    int slowest;       /* the stage that sets the pace */
    bool fits;         /* every stage's weights fit its device */
    int worst_mem;     /* the stage with the most weight bytes */
};

/* The projection for the first P = nodes' devices (ranks r on node r /
 * devices_per_node), `tokens` tokens a micro-batch.  Layers are placed as
 * bt_place_layers places them for equal devices (the slowest stage as fast as
 * it can be, ignoring memory, which is reported: fits/worst_mem).
 * BT_ERR_INVALID with a message for a bad cluster (no nodes, more stages than
 * BT_PROJECT_MAX_STAGES or than layers, a speed or bandwidth <= 0). */
enum bt_status bt_project(const struct bt_layer_costs *lc, const struct bt_cluster *c, int P, int tokens,
                          struct bt_projection *out, char *err, size_t errlen);
void bt_projection_free(struct bt_projection *p);

/* ---- decode: pipeline stages against expert groups ---------------------------------

   Per token a sequence reads every weight it uses once: a layer's dense
   weights (attention, router, shared experts) and the routed experts its
   tokens chose.  A step decodes one token of each of S sequences; with P
   stages it runs as M = min(P, S) micro-batches of b = S / M tokens.  A stage
   of one host reads its dense weights and the D(b) = E (1 - (1 - k/E)^b)
   distinct experts b tokens choose (k of E each, uniform), at the host's
   memory bandwidth or its speed, whichever is slower.  A stage that is an
   expert group of n hosts reads its dense weights on its first host and
   D(b) / n experts on every host at once; per layer the first host sends the
   ids and each member the rows of the tokens that chose one of its experts
   (1 - (1 - 1/n)^k of them), and takes back k (n - 1) / n rows a token: two
   latencies and those bytes over the link, while its own share is read.
   Between stages: a latency and b rows.  The step takes
   sum(stage) + (M - 1) max(stage).  What this leaves out: attention over the
   context (short contexts), routing that is not uniform, the ranks'
   threads not reaching the bandwidth. */
struct bt_moe_costs {
    int L;
    double *dense_bytes, *dense_flops; /* [L + 2] per token: index 0 before layer 0, L + 1 after the last */
    double *expert_bytes, *expert_flops; /* [L]: one routed expert, every matrix of it (0: a dense layer) */
    int64_t n_expert, n_used, d_model;
};
/* From a model graph (one ubatch): each weight read by a MUL_MAT_ID is a
 * layer's routed experts, one read by GET_ROWS (the embedding) costs a row,
 * the rest is dense.  weight_bits > 0: every matrix at that many bits a
 * weight (a file's mix of types, e.g. Q4_K_M, on average). */
enum bt_status bt_moe_costs_make(const struct bt_graph *g, double weight_bits, struct bt_moe_costs *mc, char *err,
                                 size_t errlen);
void bt_moe_costs_free(struct bt_moe_costs *mc);

struct bt_decode_projection {
    int hosts, group, stages, seqs, micro_batches;
    double step_s, tokens_s;
    double dense_s, experts_s, comm_s; /* of one micro-batch through every stage */
    double host_bytes;                 /* the most weight bytes one host holds */
};
/* `hosts` hosts (the cluster's nodes, one device each, the inter_node link
 * between them) as hosts / group stages, each an expert group of `group`
 * hosts (1: a plain pipeline stage), decoding `seqs` sequences. */
enum bt_status bt_project_decode(const struct bt_moe_costs *mc, const struct bt_cluster *c, int hosts, int group,
                                 int seqs, struct bt_decode_projection *out, char *err, size_t errlen);
/* A table row per stage (every stage when P <= 16, else the first, those on
 * a node boundary and the slowest) and the summary lines. */
void bt_projection_print(const struct bt_projection *p, const struct bt_cluster *c, FILE *f);
/* One summary line: P, stage time, bubble, tokens/s, bottleneck. */
void bt_projection_print_line(const struct bt_projection *p, const struct bt_cluster *c, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
