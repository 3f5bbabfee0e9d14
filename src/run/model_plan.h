/* model_plan.h - the plan of a GGUF model over the ranks of a job, as a value:
 * the engine's placement of the layers (bt_engine_place) and the distributed
 * splitter (bt_plan_make) on the graph of one ubatch of the whole model,
 * built from the file's metadata alone (no weight is read, nothing is
 * allocated for a tensor).  `baton plan -m` prints it for a topology's
 * declared ranks; `baton generate --dump-plan` writes the one the engine
 * runs, from the engine's own placement.
 *
 * The graph is one ubatch of n_ubatch tokens over a cache of n_ctx cells
 * that asks for one row of logits (a prompt's last ubatch).  Its splits and
 * transfers are the engine's: each rank's layers in one split, x [n_embd, T]
 * F32 from each stage to the next, the rows of logits asked for from the
 * last to rank 0; tokens, positions, the mask and the cache cells are set on
 * every rank that reads them (they never travel).  x between two stages
 * that both have a device transport (descs[r].device: NCCL between CUDA
 * ranks) goes over it where device_edges allows, as the engine sends it;
 * everything else over MPI. */
#ifndef BATON_MODEL_PLAN_H
#define BATON_MODEL_PLAN_H

#include <stdio.h>

#include "../model/arch.h"
#include "../plan.h"
#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

struct bt_model_plan {
    struct bt_plan plan;
    int P;
    int32_t *ranges;       /* [2P]: rank r holds layers [ranges[2r], ranges[2r + 1]) */
    int64_t *kv_bytes;     /* [P]: its cache of n_ctx cells */
    int64_t *compute_bytes; /* [P]: its compute buffer (measured as a CPU rank: bt_dist_measure) */
    int64_t *slot_bytes;    /* [P]: its transfer slots */
    struct bt_engine_params params;
    const struct bt_expert_group *groups; /* the layout's (not owned) */
    int n_groups;
    const struct bt_arch *arch;
    struct bt_hparams hp;
    char path[1024];
    /* the graph the plan is for */
    struct bt_llm *m;
    struct bt_kv *kv;
    bt_context *ctx;
    struct bt_llm_graph g;
};

/* How the layers are laid over the ranks, as a topology says (every field
 * may be NULL / 0): fixed layer counts (NULL: the cost model places them),
 * device_edges [P * P] (NULL: every edge may) as bt_plan_options', pins and
 * expert groups. */
struct bt_model_plan_layout {
    const int *layer_counts;
    const uint8_t *device_edges;
    const struct bt_dist_pin *pins;
    int n_pins;
    const struct bt_expert_group *groups;
    int n_groups;
};

/* The plan of the model in g under p on P ranks described by descs, laid
 * out as lay says (NULL: placed by the cost model).  BT_OK, or an error and
 * one message in err; *out holds nothing to free on error. */
enum bt_status bt_model_plan_make(struct bt_gguf *g, const struct bt_engine_params *p,
                                  const struct bt_rank_desc *descs, int P, const struct bt_model_plan_layout *lay,
                                  struct bt_model_plan *out, char *err, size_t n_err);
void bt_model_plan_free(struct bt_model_plan *mp);
/* The plan in words: the model, then per rank its backend, layers, splits,
 * nodes, weights, cache and predicted stage time, then every transfer. */
void bt_model_plan_print(const struct bt_model_plan *mp, FILE *f);
/* The same as one JSON object. */
void bt_model_plan_json(const struct bt_model_plan *mp, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
