/* place.c - weight placement (see place.h): layer costs from the graph and
 * the layer ranges per rank, by dynamic programming over contiguous
 * partitions (minimise the slowest stage; a rank's weights must fit its
 * memory). */
#include "place.h"
#include "mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int bt_dist_name_layer(const char *name) {
    const char *p = strstr(name, "blk.");
    if (!p || (p != name && p[-1] != '.' && p[-1] != '#' && p[-1] != ' ')) return -1;
    p += 4;
    if (*p < '0' || *p > '9') return -1;
    long v = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        if (v > 1000000) return -1;
        p++;
    }
    return *p == '.' ? (int)v : -1;
}

static double node_flops(const struct bt_tensor *n) {
    if (n->op == BT_OP_MUL_MAT) return 2.0 * (double)n->src[0]->ne[0] * (double)bt_nelements(n);
    if (n->op == BT_OP_MUL_MAT_ID) return 2.0 * (double)n->src[0]->ne[0] * (double)bt_nelements(n);
    if (bt_op_is_view(n->op) || n->op == BT_OP_NONE) return 0.0;
    return (double)bt_nelements(n);
}

/* Layers of nodes: from names; a node without a layer name takes the layer of
 * the last named node before it (-1 before any).  Leafs: from names; an
 * unnamed weight takes the layer of its first consumer. */
enum bt_status bt_layer_costs_make(const struct bt_graph *g, struct bt_layer_costs *lc, char *err, size_t errlen) {
    memset(lc, 0, sizeof *lc);
    int *node_layer = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    lc->weight_layer = malloc(sizeof(int) * (size_t)(g->n_leafs + 1));
    if (!node_layer || !lc->weight_layer) {
        free(node_layer);
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    int L = 0, cur = -1;
    for (int i = 0; i < g->n_leafs; i++) {
        const int l = bt_dist_name_layer(g->leafs[i]->name);
        if (l + 1 > L) L = l + 1;
    }
    bool any_named_node = false;
    int last_named = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const int l = bt_dist_name_layer(g->nodes[i]->name);
        if (l >= 0) {
            cur = l;
            any_named_node = true;
            last_named = i;
            if (l + 1 > L) L = l + 1;
        }
        node_layer[i] = cur;
    }
    /* nodes after the last layer's (the output head) come after it */
    for (int i = last_named + 1; any_named_node && i < g->n_nodes; i++) node_layer[i] = L;
    if (!any_named_node) {
        /* a graph without layer names: 64 pseudo-layers by position */
        L = g->n_nodes < 64 ? g->n_nodes : 64;
        if (L < 1) L = 1;
        for (int i = 0; i < g->n_nodes; i++) node_layer[i] = (int)((int64_t)i * L / (g->n_nodes ? g->n_nodes : 1));
    }
    lc->L = L;
    lc->flops = calloc((size_t)L + 2, sizeof(double));
    lc->wbytes = calloc((size_t)L + 2, sizeof(double));
    lc->cut_bytes = calloc((size_t)L + 1, sizeof(double));
    if (!lc->flops || !lc->wbytes || !lc->cut_bytes) {
        free(node_layer);
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    /* first consumer layer of each leaf, last consumer layer of each tensor */
    struct bt_hash_set hs = {bt_hash_size((size_t)(g->n_nodes + g->n_leafs) * 2 + 8), NULL};
    hs.keys = calloc(hs.size, sizeof(struct bt_tensor *));
    int *first_c = malloc(hs.size * sizeof(int));
    int *last_c = malloc(hs.size * sizeof(int));
    int *own = malloc(hs.size * sizeof(int));
    if (!hs.keys || !first_c || !last_c || !own) {
        BT_FREE_ALL(hs.keys, first_c, last_c, own, node_layer);
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    for (size_t i = 0; i < hs.size; i++) {
        first_c[i] = INT32_MAX;
        last_c[i] = INT32_MIN;
        own[i] = -1;
    }
    for (int i = 0; i < g->n_nodes; i++) own[bt_hash_insert(&hs, g->nodes[i])] = node_layer[i];
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *n = g->nodes[i];
        for (int j = 0; j < BT_MAX_SRC; j++) {
            const struct bt_tensor *s = n->src[j];
            if (!s) continue;
            if (s->view_src) s = s->view_src;
            const size_t h = bt_hash_insert(&hs, (struct bt_tensor *)s);
            if (node_layer[i] < first_c[h]) first_c[h] = node_layer[i];
            if (node_layer[i] > last_c[h]) last_c[h] = node_layer[i];
        }
    }
    for (int i = 0; i < g->n_leafs; i++) {
        const struct bt_tensor *t = g->leafs[i];
        if (!bt_tensor_is_weight(t)) {
            lc->weight_layer[i] = INT32_MIN;
            continue;
        }
        int l = any_named_node ? bt_dist_name_layer(t->name) : -1;
        if (l < 0) {
            /* no layer in its name: it lives with its first consumer (a
             * pre-layer node: -1, a layer, or the output head: L) */
            const size_t h = bt_hash_find(&hs, t);
            const int fc = (h != BT_HASHSET_FULL && hs.keys[h] == t) ? first_c[h] : INT32_MAX;
            l = fc == INT32_MAX ? -1 : fc;
        }
        lc->weight_layer[i] = l;
        lc->wbytes[l + 1] += (double)bt_nbytes(t);
    }
    for (int i = 0; i < g->n_nodes; i++) lc->flops[node_layer[i] + 1] += node_flops(g->nodes[i]);
    /* activations crossing cuts: a tensor made in layer a and last used in
     * layer b crosses the cuts before layers a+1..b */
    for (size_t h = 0; h < hs.size; h++) {
        const struct bt_tensor *t = hs.keys[h];
        /* weights stay; graph inputs are set on every rank that reads them */
        if (!t || last_c[h] == INT32_MIN || bt_tensor_is_weight(t) || (t->flags & BT_TENSOR_FLAG_INPUT)) continue;
        const int a = own[h] < 0 ? 0 : own[h] + 1;
        for (int c = a; c <= last_c[h] && c <= L; c++)
            if (c >= 0) lc->cut_bytes[c] += (double)bt_nbytes(t);
    }
    BT_FREE_ALL(hs.keys, first_c, last_c, own, node_layer);
    return BT_OK;
}

void bt_layer_costs_free(struct bt_layer_costs *lc) {
    BT_FREE_ALL(lc->flops, lc->wbytes, lc->cut_bytes, lc->weight_layer);
}

static double stage_time(const struct bt_layer_costs *lc, const struct bt_rank_desc *desc, int r, int P, int a, int b,
                         double bw) {
    double fl = 0;
    for (int l = a; l < b; l++) fl += lc->flops[l + 1];
    if (r == 0) fl += lc->flops[0];
    if (r == P - 1) fl += lc->flops[lc->L + 1];
    const double gf = desc->gflops > 0 ? desc->gflops : 1.0;
    double t = fl / (gf * 1e9);
    if (r > 0 && a < lc->L) t += lc->cut_bytes[a] / bw;
    return t;
}

static double stage_bytes(const struct bt_layer_costs *lc, int r, int P, int a, int b) {
    double by = 0;
    for (int l = a; l < b; l++) by += lc->wbytes[l + 1];
    if (r == 0) by += lc->wbytes[0];
    if (r == P - 1) by += lc->wbytes[lc->L + 1];
    return by;
}

static enum bt_status place_stages(const struct bt_layer_costs *lc, const struct bt_rank_desc *descs, int P,
                                   const struct bt_plan_options *opt, int *first, int *last, double *pred, char *err,
                                   size_t errlen);

/* Contiguous layer ranges per rank minimising the slowest stage, within each
 * rank's memory; or the fixed counts.  first[r]..last[r] inclusive (-1 none).
 * An expert group is one stage: its first rank runs the layers, with the
 * memory of the whole group (its experts are divided among the group); the
 * other members run none. */
enum bt_status bt_place_layers(const struct bt_layer_costs *lc, const struct bt_rank_desc *descs, int P,
                               const struct bt_plan_options *opt, int *first, int *last, double *pred, char *err,
                               size_t errlen) {
    if (opt->n_groups <= 0) return place_stages(lc, descs, P, opt, first, last, pred, err, errlen);
    int *stage = malloc(sizeof(int) * (size_t)(P + 1)), *counts = malloc(sizeof(int) * (size_t)(P + 1));
    int *sf = malloc(sizeof(int) * (size_t)(P + 1)), *sl = malloc(sizeof(int) * (size_t)(P + 1));
    double *sp = malloc(sizeof(double) * (size_t)(P + 1));
    struct bt_rank_desc *sd = malloc(sizeof *sd * (size_t)(P + 1));
    enum bt_status st = stage && counts && sf && sl && sp && sd ? BT_OK : BT_ERR_NOMEM;
    int S = 0; /* stages: ranks that run layers, in rank order */
    for (int r = 0; st == BT_OK && r < P; r++) {
        int member = -1;
        const int g = bt_expert_group_of(opt->groups, opt->n_groups, r, &member);
        if (member > 0) {
            if (opt->layers_per_rank && opt->layers_per_rank[r] != 0) {
                snprintf(err, errlen,
                         "rank %d is a member of expert group %d, whose layers rank %d runs: its layer count must be "
                         "0, not %d",
                         r, g, opt->groups[g].ranks[0], opt->layers_per_rank[r]);
                st = BT_ERR_INVALID;
            }
            stage[r] = -1;
            continue;
        }
        stage[r] = S;
        sd[S] = descs[r];
        if (g >= 0) /* the group's memory: its experts are divided among its ranks */
            for (int i = 1; i < opt->groups[g].n_ranks; i++) sd[S].mem_bytes += descs[opt->groups[g].ranks[i]].mem_bytes;
        if (opt->layers_per_rank) counts[S] = opt->layers_per_rank[r];
        S++;
    }
    if (st == BT_OK) {
        struct bt_plan_options so = *opt;
        so.groups = NULL;
        so.n_groups = 0;
        so.layers_per_rank = opt->layers_per_rank ? counts : NULL;
        st = place_stages(lc, sd, S, &so, sf, sl, sp, err, errlen);
    }
    for (int r = 0; st == BT_OK && r < P; r++) {
        first[r] = stage[r] >= 0 ? sf[stage[r]] : -1;
        last[r] = stage[r] >= 0 ? sl[stage[r]] : -1;
        pred[r] = stage[r] >= 0 ? sp[stage[r]] : 0.0;
    }
    if (st == BT_ERR_NOMEM && !(stage && counts && sf && sl && sp && sd)) snprintf(err, errlen, "out of memory");
    BT_FREE_ALL(stage, counts, sf, sl, sp, sd);
    return st;
}

static enum bt_status place_stages(const struct bt_layer_costs *lc, const struct bt_rank_desc *descs, int P,
                                   const struct bt_plan_options *opt, int *first, int *last, double *pred, char *err,
                                   size_t errlen) {
    const int L = lc->L;
    const double bw = (opt->link_gbps > 0 ? opt->link_gbps : 5.0) * 1e9;
    if (P < 1 || L < 0) {
        snprintf(err, errlen, "%d ranks, %d layers: nothing to place", P, L);
        return BT_ERR_INVALID;
    }
    int *start = malloc(sizeof(int) * (size_t)(P + 1));
    if (!start) return BT_ERR_NOMEM;
    if (opt->layers_per_rank) {
        int sum = 0;
        for (int r = 0; r < P; r++) {
            if (opt->layers_per_rank[r] < 0) {
                snprintf(err, errlen, "layer count of rank %d is negative (%d)", r, opt->layers_per_rank[r]);
                free(start);
                return BT_ERR_INVALID;
            }
            start[r] = sum;
            sum += opt->layers_per_rank[r];
        }
        if (sum != L) {
            snprintf(err, errlen, "the layer counts per rank add up to %d, but the model has %d layers", sum, L);
            free(start);
            return BT_ERR_INVALID;
        }
        start[P] = L;
    } else {
        /* dp[r][b]: best slowest-stage time with layers [0,b) on ranks [0,r] */
        const size_t W = (size_t)L + 1;
        double *dp = calloc((size_t)P * W, sizeof(double));
        int *arg = calloc((size_t)P * W, sizeof(int));
        if (!dp || !arg) {
            free(dp);
            free(arg);
            free(start);
            return BT_ERR_NOMEM;
        }
        for (int r = 0; r < P; r++) {
            for (int b = 0; b <= L; b++) {
                double best = INFINITY;
                int besta = -1;
                /* rank 0 starts at layer 0; rank r continues where r-1 ended */
                const int a_hi = r == 0 ? 0 : b;
                for (int a = 0; a <= a_hi; a++) {
                    /* every rank gets a layer when there are enough */
                    if (L >= P && b - a < 1) continue;
                    const double prev = r == 0 ? 0.0 : dp[(size_t)(r - 1) * W + (size_t)a];
                    if (!isfinite(prev)) continue;
                    if (stage_bytes(lc, r, P, a, b) > (double)descs[r].mem_bytes) continue;
                    const double st = stage_time(lc, &descs[r], r, P, a, b, bw);
                    const double v = prev > st ? prev : st;
                    if (v < best) {
                        best = v;
                        besta = a;
                    }
                }
                dp[(size_t)r * W + (size_t)b] = best;
                arg[(size_t)r * W + (size_t)b] = besta;
            }
        }
        if (!isfinite(dp[(size_t)(P - 1) * W + (size_t)L])) {
            double total = 0, maxmem = 0, min_layer = INFINITY;
            for (int l = 0; l < L + 2; l++) total += lc->wbytes[l];
            for (int l = 1; l <= L; l++) min_layer = lc->wbytes[l] < min_layer ? lc->wbytes[l] : min_layer;
            for (int r = 0; r < P; r++) maxmem += (double)descs[r].mem_bytes;
            /* a rank that cannot hold even its smallest share is the one to name */
            int small = -1;
            double small_need = 0;
            for (int r = 0; r < P && small < 0; r++) {
                double need = (r == 0 ? lc->wbytes[0] : 0) + (r == P - 1 ? lc->wbytes[L + 1] : 0);
                if (L >= P && L > 0) need += min_layer; /* every rank gets a layer */
                if (need > (double)descs[r].mem_bytes) {
                    small = r;
                    small_need = need;
                }
            }
            if (small >= 0)
                snprintf(err, errlen,
                         "rank %d (%s) has %.1f MiB of memory, less than the %.1f MiB of weights its smallest share "
                         "of %d layers on %d ranks needs",
                         small, descs[small].backend, (double)descs[small].mem_bytes / 1048576.0,
                         small_need / 1048576.0, L, P);
            else
                snprintf(err, errlen,
                         "the model's %.1f MiB of weights do not fit in the ranks' memory (%.1f MiB in all) in any "
                         "placement of %d layers on %d ranks",
                         total / 1048576.0, maxmem / 1048576.0, L, P);
            free(dp);
            free(arg);
            free(start);
            return BT_ERR_NOMEM;
        }
        start[P] = L;
        int b = L;
        for (int r = P - 1; r >= 0; r--) {
            const int a = arg[(size_t)r * W + (size_t)b];
            start[r] = a;
            b = a;
        }
        free(dp);
        free(arg);
    }
    for (int r = 0; r < P; r++) {
        first[r] = start[r] < start[r + 1] ? start[r] : -1;
        last[r] = start[r] < start[r + 1] ? start[r + 1] - 1 : -1;
        pred[r] = stage_time(lc, &descs[r], r, P, start[r], start[r + 1], bw);
    }
    free(start);
    return BT_OK;
}

int bt_place_rank_of_layer(int l, const int *first, const int *last, int P) {
    if (l < 0) return 0;
    for (int r = 0; r < P; r++)
        if (first[r] >= 0 && l >= first[r] && l <= last[r]) return r;
    return P - 1;
}

