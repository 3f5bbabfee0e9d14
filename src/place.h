/* place.h - weight placement for the distributed runtime: the cost of each
 * layer (FLOPs, weight bytes, activation bytes crossing each cut) read off a
 * graph, and the contiguous layer ranges per rank that make the slowest stage
 * as fast as possible within each rank's memory.  Internal to plan.c; layers come from tensor names "blk.N.". */
#ifndef BATON_PLACE_H
#define BATON_PLACE_H

#include "plan.h"

struct bt_layer_costs {
    int L;             /* layers 0..L-1 */
    double *flops;     /* [L + 2]: index 0 = before layer 0, L+1 = after the last */
    double *wbytes;    /* [L + 2] */
    double *cut_bytes; /* [L + 1]: bytes crossing the cut before layer l (l = 0..L) */
    int *weight_layer; /* per leaf: layer, -1 before, L after; INT32_MIN: not a weight */
};

/* The layer a tensor name belongs to ("blk.N." -> N), -1 when none. */
int bt_dist_name_layer(const char *name);
enum bt_status bt_layer_costs_make(const struct bt_graph *g, struct bt_layer_costs *lc, char *err, size_t errlen);
void bt_layer_costs_free(struct bt_layer_costs *lc);
/* first[r]..last[r] (inclusive, -1 when none) and the predicted stage time
 * of every rank; fixed counts from opt->layers_per_rank when given. */
enum bt_status bt_place_layers(const struct bt_layer_costs *lc, const struct bt_rank_desc *descs, int P,
                               const struct bt_plan_options *opt, int *first, int *last, double *pred, char *err,
                               size_t errlen);
/* The rank holding layer l (-1: rank 0; past the last: the last rank). */
int bt_place_rank_of_layer(int l, const int *first, const int *last, int P);

#endif
