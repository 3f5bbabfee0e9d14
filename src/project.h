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

struct bt_cluster {
    int nodes, devices_per_node;
    char device[96];
    double device_gflops; /* effective: peak x efficiency */
    int64_t device_mem;   /* bytes for weights */
    struct bt_link_class intra, inter;
    int micro_batches;
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
/* A table row per stage (every stage when P <= 16, else the first, those on
 * a node boundary and the slowest) and the summary lines. */
void bt_projection_print(const struct bt_projection *p, const struct bt_cluster *c, FILE *f);
/* One summary line: P, stage time, bubble, tokens/s, bottleneck. */
void bt_projection_print_line(const struct bt_projection *p, const struct bt_cluster *c, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
