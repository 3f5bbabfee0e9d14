/* model_plan.c - the plan of a GGUF model over ranks (see model_plan.h). */
#include "model_plan.h"
#include "../mem.h"

#include <stdlib.h>
#include <string.h>

#include "baton/backend-reg.h"
#include "../place.h"

void bt_model_plan_free(struct bt_model_plan *mp) {
    bt_plan_free(&mp->plan);
    if (mp->ctx) bt_free(mp->ctx);
    bt_kv_free(mp->kv);
    bt_llm_free(mp->m);
    BT_FREE_ALL(mp->ranges, mp->kv_bytes, mp->compute_bytes, mp->slot_bytes);
    memset(mp, 0, sizeof *mp);
}

enum bt_status bt_model_plan_make(struct bt_gguf *g, const struct bt_engine_params *p,
                                  const struct bt_rank_desc *descs, int P, const struct bt_model_plan_layout *lay,
                                  struct bt_model_plan *out, char *err, size_t n_err) {
    static const struct bt_model_plan_layout none;
    if (!lay) lay = &none;
    struct bt_model_plan *mp = out;
    memset(mp, 0, sizeof *mp);
    mp->groups = lay->groups;
    mp->n_groups = lay->n_groups;
    mp->P = P;
    mp->params = *p;
    snprintf(mp->path, sizeof mp->path, "%s", bt_gguf_path(g));
    enum bt_status st = bt_llm_check_gguf(g, &mp->arch, &mp->hp, err, n_err);
    if (st != BT_OK) return st;
    const struct bt_hparams *h = &mp->hp;
    if (p->n_ubatch < 1 || p->n_ubatch > p->n_ctx)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "ubatch size %lld out of [1, context size %lld]",
                               (long long)p->n_ubatch, (long long)p->n_ctx);
    mp->ranges = calloc((size_t)(2 * P), sizeof *mp->ranges);
    mp->kv_bytes = calloc((size_t)P, sizeof *mp->kv_bytes);
    mp->compute_bytes = calloc((size_t)P, sizeof *mp->compute_bytes);
    mp->slot_bytes = calloc((size_t)P, sizeof *mp->slot_bytes);
    int *counts = calloc((size_t)P, sizeof *counts);
    if (!mp->ranges || !mp->kv_bytes || !mp->compute_bytes || !mp->slot_bytes || !counts) {
        st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory planning %d ranks", P);
        goto done;
    }
    st = bt_engine_place(g, h, p, descs, P, lay->layer_counts, lay->groups, lay->n_groups, mp->ranges, err, n_err);
    if (st != BT_OK) goto done;
    /* the graph: the whole model, its cache and one ubatch, without memory */
    st = bt_llm_describe_gguf(g, &mp->m, err, n_err);
    if (st != BT_OK) goto done;
    struct bt_kv_config kc;
    bt_llm_kv_config(mp->m, p->n_ctx, p->n_seq_max, p->n_ubatch, p->kv_type, &kc);
    kc.no_memory = true;
    st = bt_kv_new(&kc, &mp->kv, err, n_err);
    if (st != BT_OK) goto done;
    /* the cache's layers are held like weights, as the runtime holds them */
    for (int il = 0; il < h->n_layer; il++) {
        bt_set_weight(bt_kv_k(mp->kv, il));
        if (bt_kv_v(mp->kv, il)) bt_set_weight(bt_kv_v(mp->kv, il));
    }
    mp->ctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(mp->m), NULL, true});
    if (!mp->ctx) {
        st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory (graph)");
        goto done;
    }
    st = bt_llm_build_graph(mp->m, mp->kv, mp->ctx, p->n_ubatch, p->n_ctx, 1, &mp->g);
    if (st != BT_OK) {
        st = bt_error_printf(err, n_err, st, "building the graph: %s", bt_context_error(mp->ctx));
        goto done;
    }
    const double kv_row = (double)bt_kv_config_row_bytes(&kc);
    for (int r = 0; r < P; r++) {
        counts[r] = mp->ranges[2 * r + 1] - mp->ranges[2 * r];
        double b = 0.0; /* a sliding layer's ring is smaller (kv.h) */
        for (int il = mp->ranges[2 * r]; il < mp->ranges[2 * r + 1]; il++)
            b += kv_row * (double)bt_kv_config_layer_cells(&kc, il);
        mp->kv_bytes[r] = (int64_t)b;
    }
    struct bt_plan_options opt;
    memset(&opt, 0, sizeof opt);
    opt.layers_per_rank = counts;
    /* the engine's micro-batches in flight (max_inflight 0: its caller's default, 2 here) */
    opt.n_copies = p->max_inflight <= 0 ? 2 : p->max_inflight < BT_SCHED_MAX_COPIES ? p->max_inflight : BT_SCHED_MAX_COPIES;
    opt.device_edges = lay->device_edges; /* x between two device ranks: the engine's rule and the plan's agree */
    opt.ends_with_layers = true; /* the embedding on the first stage, the head on the last */
    opt.pins = lay->pins;        /* a topology's, as the live run follows them */
    opt.n_pins = lay->n_pins;
    opt.groups = lay->groups;
    opt.n_groups = lay->n_groups;
    st = bt_plan_make(&mp->plan, mp->g.graph, descs, P, NULL, &opt);
    if (st != BT_OK) {
        bt_error_printf(err, n_err, st, "%s: the plan: %s", mp->path, mp->plan.error);
        goto done;
    }
    /* each rank's compute buffer and slots, as the runtime sizes them */
    bt_backend_t cpu = bt_backend_init_by_name("cpu", 1, NULL, 0);
    if (!cpu) st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory (a CPU backend)");
    for (int r = 0; r < P && st == BT_OK; r++) {
        struct bt_dist_stats ms;
        char why[512];
        st = bt_dist_measure(mp->g.graph, &mp->plan, mp->groups, mp->n_groups, r, cpu, &ms, why, sizeof why);
        if (st != BT_OK) bt_error_printf(err, n_err, st, "%s: rank %d's memory: %s", mp->path, r, why);
        mp->compute_bytes[r] = ms.compute_bytes;
        mp->slot_bytes[r] = ms.slot_bytes;
    }
    bt_backend_free(cpu);
done:
    free(counts);
    if (st != BT_OK) bt_model_plan_free(mp);
    return st;
}

/* The name of a transfer's tensor. */
static const char *xfer_name(const struct bt_model_plan *mp, const struct bt_plan_transfer *x) {
    const struct bt_tensor *t = bt_plan_tensor(mp->g.graph, x->tensor);
    return t ? t->name : "?";
}

/* A transfer of expert weights that only MUL_MAT_IDs on dst read, with one
 * ids tensor computed there: the runtime sends only the experts the routing
 * chooses (dist.c's routed transfers).  The most a ubatch moves then. */
static bool routed_max(const struct bt_model_plan *mp, const struct bt_plan_transfer *x, double *max_bytes) {
    const struct bt_graph *g = mp->g.graph;
    const struct bt_tensor *w = bt_plan_tensor(g, x->tensor);
    if (!w || x->producer >= 0 || x->consumer < 0 || x->direct || !bt_tensor_is_weight(w) || w->ne[2] < 2)
        return false;
    const struct bt_tensor *ids = NULL;
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = 0; j < BT_MAX_SRC; j++) {
            const struct bt_tensor *n = g->nodes[i];
            if (n->src[j] != w) continue;
            if (n->op != BT_OP_MUL_MAT_ID || j != 0 || (ids && ids != n->src[2])) return false;
            ids = n->src[2];
        }
    if (!ids) return false;
    const struct bt_tensor *base = ids->view_src ? ids->view_src : ids;
    int owner = -1;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i] == base || g->nodes[i] == ids) owner = mp->plan.node_owner[i];
    if (owner != x->dst) return false;
    const int64_t E = w->ne[2], chosen = ids->ne[0] * ids->ne[1];
    *max_bytes = (double)x->bytes * (double)(chosen < E ? chosen : E) / (double)E;
    return true;
}

/* Whether leaf w is a weight of experts that MUL_MAT_IDs read. */
static bool is_experts(const struct bt_graph *g, const struct bt_tensor *w) {
    if (!bt_tensor_is_weight(w) || w->ne[2] < 2) return false;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == BT_OP_MUL_MAT_ID && g->nodes[i]->src[0] == w) return true;
    return false;
}

/* The bytes of leaf i that rank r holds: all of it where it is the owner,
 * or of an expert group's experts (and with dense, its dense weights' rows),
 * the share of each of the group's ranks (the first rank owns them in the
 * plan). */
static double held_bytes(const struct bt_model_plan *mp, int i, int r) {
    const struct bt_graph *g = mp->g.graph;
    const struct bt_tensor *w = g->leafs[i];
    const int owner = mp->plan.leaf_owner[i];
    int member = -1;
    const int gi = bt_expert_group_of(mp->groups, mp->n_groups, owner, &member);
    const bool rows = gi >= 0 && member == 0 && mp->groups[gi].dense &&
                      bt_row_divisible(g, w, mp->groups[gi].n_ranks);
    const bool heads = gi >= 0 && member == 0 && !rows && bt_head_divisible(&mp->plan, &mp->groups[gi], g, w);
    const bool bias = gi >= 0 && member == 0 && bt_expert_bias(g, w); /* held whole by every rank of the group */
    if (gi < 0 || member != 0 || (!rows && !heads && !bias && !is_experts(g, w)))
        return owner == r ? (double)bt_nbytes(w) : 0.0;
    int mine = -1;
    if (bt_expert_group_of(mp->groups, mp->n_groups, r, &mine) != gi) return 0.0;
    if (bias) return (double)bt_nbytes(w);
    int64_t lo, hi;
    if (rows && mp->groups[gi].tokens) return (double)bt_nbytes(w); /* whole on every rank */
    if (rows) {
        bt_row_share(w->ne[1], mp->groups[gi].n_ranks, mine, &lo, &hi);
        return (double)(hi - lo) * (double)w->nb[1];
    }
    bt_expert_hold(w->ne[2], mp->groups[gi].n_ranks, mine, mp->groups[gi].overlap, &lo, &hi);
    return (double)(hi - lo) * (double)w->nb[2];
}

/* The model's weights rank r holds (its cache, also held like a weight, is
 * counted apart). */
static double weight_bytes(const struct bt_model_plan *mp, int r) {
    const struct bt_graph *g = mp->g.graph;
    double b = 0;
    for (int i = 0; i < g->n_leafs; i++)
        if (bt_tensor_is_weight(g->leafs[i])) b += held_bytes(mp, i, r);
    for (int il = 0; il < mp->hp.n_layer; il++)
        for (int kv = 0; kv < 2; kv++) {
            const struct bt_tensor *c = kv ? bt_kv_v(mp->kv, il) : bt_kv_k(mp->kv, il);
            for (int i = 0; i < g->n_leafs && c; i++)
                if (g->leafs[i] == c && mp->plan.leaf_owner[i] == r) b -= (double)bt_nbytes(c);
        }
    return b;
}

/* A group's dense weights divided by rows or by tokens (or with heads, its
 * per-head products divided by heads), and each rank's share (held_bytes);
 * the per-head line only where there are some. */
static void print_divided(const struct bt_model_plan *mp, const struct bt_expert_group *grp, bool heads, FILE *f) {
    const struct bt_graph *g = mp->g.graph;
    const double mib = 1048576.0;
    const int home = grp->ranks[0];
    int n_w = 0;
    double all = 0, per[BT_EXPERT_GROUP_MAX] = {0};
    for (int i = 0; i < g->n_leafs; i++) {
        const struct bt_tensor *w = g->leafs[i];
        const bool divided = heads ? bt_head_divisible(&mp->plan, grp, g, w) : bt_row_divisible(g, w, grp->n_ranks);
        if (mp->plan.leaf_owner[i] != home || !divided) continue;
        n_w++;
        all += (double)bt_nbytes(w);
        for (int m = 0; m < grp->n_ranks; m++) per[m] += held_bytes(mp, i, grp->ranks[m]);
    }
    if (heads && n_w == 0) return;
    const bool tokens = !heads && grp->tokens;
    if (tokens)
        fprintf(f, "    dense products divided by tokens (ubatches of fewer than %d tokens: by rows)", BT_TOKENS_MIN);
    else
        fprintf(f, "    %s", heads ? "per-head products divided by heads" : "dense products divided by rows");
    fprintf(f, ": %d weights (%.1f MiB);", n_w, all / mib);
    for (int m = 0; m < grp->n_ranks; m++)
        fprintf(f, "%s rank %d holds %.1f MiB", m ? "," : "", grp->ranks[m], per[m] / mib);
    fprintf(f, "; per product, rank %d sends each member %s\n", home,
            heads    ? "its heads of the input and takes back theirs of the result"
            : tokens ? "its tokens of the input and takes back those tokens of the result"
                     : "its input and takes back the member's rows");
}

/* Each expert group: its ranks and the experts each holds (the same share
 * of every layer the group runs), and per token the expert bytes each reads
 * at most and the rows that cross the group. */
static void print_groups(const struct bt_model_plan *mp, FILE *f) {
    const struct bt_hparams *h = &mp->hp;
    const double mib = 1048576.0;
    for (int gi = 0; gi < mp->n_groups; gi++) {
        const struct bt_expert_group *grp = &mp->groups[gi];
        const int home = grp->ranks[0];
        const int a = mp->ranges[2 * home], b = mp->ranges[2 * home + 1];
        fprintf(f, "  expert group %d: ranks", gi);
        for (int i = 0; i < grp->n_ranks; i++) fprintf(f, "%s%d", i ? ", " : " ", grp->ranks[i]);
        if (b > a) fprintf(f, "; layers %d-%d on rank %d, their routed experts divided:\n", a, b - 1, home);
        else fprintf(f, "; no layers\n");
        /* the bytes of one expert of every expert weight of the group's
         * layers (all: n_moe layers; a leading dense layer has none) and of
         * one such layer */
        double all = 0;
        int n_moe = 0, last = -1;
        const struct bt_graph *g = mp->g.graph;
        for (int i = 0; i < g->n_leafs; i++) {
            const struct bt_tensor *w = g->leafs[i];
            const int l = bt_dist_name_layer(w->name);
            if (l < a || l >= b || !is_experts(g, w)) continue;
            all += (double)w->nb[2];
            if (l != last) n_moe++;
            last = l;
        }
        const double one = n_moe > 0 ? all / n_moe : 0.0;
        for (int i = 0; i < grp->n_ranks && b > a; i++) {
            int64_t lo, hi;
            bt_expert_hold(h->n_expert, grp->n_ranks, i, grp->overlap, &lo, &hi);
            const int64_t used = h->n_expert_used < hi - lo ? h->n_expert_used : hi - lo;
            fprintf(f,
                    "    rank %d: experts %lld-%lld of %lld (%.1f MiB a layer, %.1f MiB in all); a token reads at most "
                    "%lld of them a layer (%.1f MiB for its %d layers)\n",
                    grp->ranks[i], (long long)lo, (long long)hi - 1, (long long)h->n_expert, (double)(hi - lo) * one / mib,
                    (double)(hi - lo) * all / mib, (long long)used, (double)used * all / mib, n_moe);
        }
        if (b > a) {
            const double ids = 4.0 * (double)h->n_expert_used, row = 4.0 * (double)h->n_embd;
            fprintf(f,
                    "    per token and layer: rank %d sends each member the ids (%.0f B) and, where it chose one of "
                    "the member's experts, the token's row (%.1f KiB); the member sends back a row (%.1f KiB) per "
                    "chosen expert it holds\n",
                    home, ids, row / 1024.0, row / 1024.0);
            if (grp->overlap > 0)
                fprintf(f,
                        "    expert_overlap %d: the ranges overlap; per ubatch and layer rank %d sets the boundaries "
                        "within them so that each rank computes about as many of the routed (token, expert) pairs\n",
                        grp->overlap, home);
        }
        if (b > a && grp->dense) {
            print_divided(mp, grp, false, f);
            print_divided(mp, grp, true, f);
        }
    }
}

void bt_model_plan_print(const struct bt_model_plan *mp, FILE *f) {
    const struct bt_hparams *h = &mp->hp;
    const struct bt_plan *p = &mp->plan;
    const double mib = 1048576.0;
    fprintf(f, "model %s: %s, %d layers, d_model %lld, vocabulary %lld", mp->path, mp->arch->name, h->n_layer,
            (long long)h->n_embd, (long long)h->n_vocab);
    if (h->n_expert > 0) fprintf(f, ", %lld experts (%lld used)", (long long)h->n_expert, (long long)h->n_expert_used);
    fprintf(f, "\nubatch %lld tokens, context %lld cells (%s cache), %d sequences\n", (long long)mp->params.n_ubatch,
            (long long)mp->params.n_ctx, bt_type_name(mp->params.kv_type), mp->params.n_seq_max);
    fprintf(f, "%d ranks, %d splits, %d transfers per ubatch\n", mp->P, p->n_splits, p->n_transfers);
    for (int r = 0; r < mp->P; r++) {
        const int a = mp->ranges[2 * r], b = mp->ranges[2 * r + 1];
        int n_splits = 0, n_nodes = 0;
        for (int s = 0; s < p->n_splits; s++) n_splits += p->splits[s].rank == r;
        for (int i = 0; i < mp->g.graph->n_nodes; i++)
            n_nodes += p->node_owner[i] == r && !bt_op_is_view(mp->g.graph->nodes[i]->op);
        fprintf(f, "  rank %d (%s): layers ", r, p->ranks[r].backend);
        if (b > a) fprintf(f, "%d-%d", a, b - 1);
        else fprintf(f, "none");
        fprintf(f,
                ", %d split%s, %d nodes, weights %.1f MiB, cache %.1f MiB, compute %.1f MiB, slots %.1f MiB, predicted "
                "stage %.3f ms\n",
                n_splits, n_splits == 1 ? "" : "s", n_nodes, weight_bytes(mp, r) / mib, (double)mp->kv_bytes[r] / mib,
                (double)mp->compute_bytes[r] / mib, (double)mp->slot_bytes[r] / mib, p->predicted_s[r] * 1e3);
    }
    print_groups(mp, f);
    for (int x = 0; x < p->n_transfers; x++) {
        const struct bt_plan_transfer *t = &p->transfers[x];
        double most = 0;
        if (routed_max(mp, t, &most))
            fprintf(f, "  transfer: %s, rank %d -> rank %d, the experts the routing chooses: at most %.1f of %.1f KiB "
                       "per ubatch, MPI\n",
                    xfer_name(mp, t), t->src, t->dst, most / 1024.0, (double)t->bytes / 1024.0);
        else
            fprintf(f, "  transfer: %s, rank %d -> rank %d, %.1f KiB per ubatch, %s%s\n", xfer_name(mp, t), t->src,
                    t->dst, (double)t->bytes / 1024.0, t->direct ? "NCCL" : "MPI", t->consumer < 0 ? " (an output)" : "");
    }
}

/* A JSON string (names are the file's: escape what JSON needs). */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void bt_model_plan_json(const struct bt_model_plan *mp, FILE *f) {
    const struct bt_plan *p = &mp->plan;
    fprintf(f, "{\"model\": ");
    json_str(f, mp->path);
    fprintf(f, ", \"architecture\": ");
    json_str(f, mp->arch->name);
    fprintf(f, ", \"n_layer\": %d, \"n_ubatch\": %lld, \"n_ctx\": %lld, \"ranks\": [", mp->hp.n_layer,
            (long long)mp->params.n_ubatch, (long long)mp->params.n_ctx);
    for (int r = 0; r < mp->P; r++) {
        int n_splits = 0;
        for (int s = 0; s < p->n_splits; s++) n_splits += p->splits[s].rank == r;
        fprintf(f, "%s{\"rank\": %d, \"backend\": ", r ? ", " : "", r);
        json_str(f, p->ranks[r].backend);
        fprintf(f, ", \"layers\": [%d, %d], \"splits\": %d, \"weight_bytes\": %.0f, \"kv_bytes\": %lld, "
                   "\"compute_bytes\": %lld, \"slot_bytes\": %lld, \"predicted_s\": %.6g}",
                mp->ranges[2 * r], mp->ranges[2 * r + 1], n_splits, weight_bytes(mp, r), (long long)mp->kv_bytes[r],
                (long long)mp->compute_bytes[r], (long long)mp->slot_bytes[r], p->predicted_s[r]);
    }
    fprintf(f, "], \"transfers\": [");
    for (int x = 0; x < p->n_transfers; x++) {
        const struct bt_plan_transfer *t = &p->transfers[x];
        fprintf(f, "%s{\"tensor\": ", x ? ", " : "");
        json_str(f, xfer_name(mp, t));
        double most = (double)t->bytes;
        const bool routed = routed_max(mp, t, &most);
        fprintf(f, ", \"src\": %d, \"dst\": %d, \"bytes\": %lld, \"transport\": \"%s\", \"output\": %s, "
                   "\"routed\": %s, \"bytes_max\": %.0f}",
                t->src, t->dst, (long long)t->bytes, t->direct ? "nccl" : "mpi", t->consumer < 0 ? "true" : "false",
                routed ? "true" : "false", most);
    }
    /* the expert groups: their ranks (the first runs the layers), and whether they divide the dense products */
    fprintf(f, "], \"groups\": [");
    for (int g = 0; g < mp->n_groups; g++) {
        fprintf(f, "%s{\"ranks\": [", g ? ", " : "");
        for (int i = 0; i < mp->groups[g].n_ranks; i++) fprintf(f, "%s%d", i ? ", " : "", mp->groups[g].ranks[i]);
        fprintf(f, "], \"divide\": \"%s\"}",
                mp->groups[g].tokens ? "tokens" : mp->groups[g].dense ? "all" : "experts");
    }
    fprintf(f, "]}\n");
}
