/* project.c - a pipeline's throughput on a cluster, on paper (see project.h):
 * placement by bt_place_layers, then per stage compute and receive times
 * from the device's speed and the link each cut crosses. */
#include "project.h"
#include "mem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool link_ok(const struct bt_link_class *l) {
    return isfinite(l->gbytes_s) && l->gbytes_s > 0 && isfinite(l->latency_us) && l->latency_us >= 0;
}

enum bt_status bt_project(const struct bt_layer_costs *lc, const struct bt_cluster *c, int P, int tokens,
                          struct bt_projection *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const int64_t most = (int64_t)c->nodes * c->devices_per_node;
    if (c->nodes < 1 || c->devices_per_node < 1 || most > BT_PROJECT_MAX_STAGES) {
        snprintf(err, errlen, "a cluster of %d nodes x %d devices: want 1..%d devices in all", c->nodes,
                 c->devices_per_node, BT_PROJECT_MAX_STAGES);
        return BT_ERR_INVALID;
    }
    if (P < 1 || P > most) {
        snprintf(err, errlen, "%d stages on a cluster of %lld devices", P, (long long)most);
        return BT_ERR_INVALID;
    }
    if (P > lc->L) {
        snprintf(err, errlen, "%d stages but the model has %d layers: at most one stage a layer", P, lc->L);
        return BT_ERR_INVALID;
    }
    if (!(isfinite(c->device_gflops) && c->device_gflops > 0) || !link_ok(&c->intra) || !link_ok(&c->inter) ||
        c->micro_batches < 1 || tokens < 1) {
        snprintf(err, errlen, "device speed, link bandwidths, micro-batches and tokens must be > 0");
        return BT_ERR_INVALID;
    }
    struct bt_rank_desc *descs = calloc((size_t)P, sizeof *descs);
    int *first = malloc(sizeof(int) * (size_t)P), *last = malloc(sizeof(int) * (size_t)P);
    double *pred = malloc(sizeof(double) * (size_t)P);
    out->stage = calloc((size_t)P, sizeof *out->stage);
    if (!descs || !first || !last || !pred || !out->stage) {
        BT_FREE_ALL(descs, first, last, pred);
        bt_projection_free(out);
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    for (int r = 0; r < P; r++) {
        descs[r].gflops = c->device_gflops;
        descs[r].mem_bytes = INT64_MAX;
    }
    /* placed against the slower link: a cut's cost is the same for every
     * candidate range, so this only breaks ties */
    const double slow = c->inter.gbytes_s < c->intra.gbytes_s ? c->inter.gbytes_s : c->intra.gbytes_s;
    const struct bt_plan_options opt = {.n_copies = c->micro_batches, .link_gbps = slow};
    enum bt_status st = bt_place_layers(lc, descs, P, &opt, first, last, pred, err, errlen);
    if (st == BT_OK) {
        out->P = P;
        out->M = c->micro_batches;
        out->tokens = tokens;
        out->fits = true;
        double sum = 0, worst = -1, heaviest = -1;
        for (int r = 0; r < P; r++) {
            struct bt_project_stage *s = &out->stage[r];
            s->first = first[r];
            s->last = last[r];
            double fl = 0, wb = 0;
            if (first[r] >= 0)
                for (int l = first[r]; l <= last[r]; l++) {
                    fl += lc->flops[l + 1];
                    wb += lc->wbytes[l + 1];
                }
            if (r == 0) {
                fl += lc->flops[0];
                wb += lc->wbytes[0];
            }
            if (r == P - 1) {
                fl += lc->flops[lc->L + 1];
                wb += lc->wbytes[lc->L + 1];
            }
            s->compute_s = fl / (c->device_gflops * 1e9);
            s->weight_bytes = wb;
            if (r > 0 && first[r] >= 0) {
                s->cross_node = (r - 1) / c->devices_per_node != r / c->devices_per_node;
                const struct bt_link_class *l = s->cross_node ? &c->inter : &c->intra;
                s->recv_s = l->latency_us * 1e-6 + lc->cut_bytes[first[r]] / (l->gbytes_s * 1e9);
            }
            s->stage_s = s->compute_s + s->recv_s;
            sum += s->stage_s;
            if (s->stage_s > worst) {
                worst = s->stage_s;
                out->slowest = r;
            }
            if (wb > heaviest) {
                heaviest = wb;
                out->worst_mem = r;
            }
            if (wb > (double)c->device_mem) out->fits = false;
        }
        out->pass_s = sum;
        out->step_s = sum + (double)(out->M - 1) * worst;
        out->tokens_s = (double)out->M * tokens / out->step_s;
        out->bubble = 1.0 - (double)out->M * sum / ((double)P * out->step_s);
    } else {
        bt_projection_free(out);
    }
    BT_FREE_ALL(descs, first, last, pred);
    return st;
}

void bt_projection_free(struct bt_projection *p) {
    free(p->stage);
    p->stage = NULL;
}

static void fmt_time(char *buf, size_t n, double s) {
    if (s >= 1.0)
        snprintf(buf, n, "%.2f s", s);
    else if (s >= 1e-3)
        snprintf(buf, n, "%.3f ms", s * 1e3);
    else
        snprintf(buf, n, "%.1f us", s * 1e6);
}

static void print_bottleneck(const struct bt_projection *p, const struct bt_cluster *c, FILE *f) {
    const struct bt_project_stage *s = &p->stage[p->slowest];
    const double link_share = s->stage_s > 0 ? s->recv_s / s->stage_s : 0;
    if (link_share >= 0.5)
        fprintf(f, "stage %d's input over %s (%.0f%% of its stage)", p->slowest,
                s->cross_node ? c->inter.name : c->intra.name, 100 * link_share);
    else
        fprintf(f, "stage %d's compute (%.0f%%; input over %s %.0f%%)", p->slowest, 100 * (1 - link_share),
                s->cross_node ? "the node link" : "the in-node link", 100 * link_share);
    /* layers do not split: a stage with more of them than the average holds
     * up the rest */
    int layers = 0;
    for (int r = 0; r < p->P; r++)
        if (p->stage[r].first >= 0) layers += p->stage[r].last - p->stage[r].first + 1;
    const int mine = s->first >= 0 ? s->last - s->first + 1 : 0;
    if (p->P > 1 && mine * p->P > layers) fprintf(f, ", %d layers where the average is %.2f", mine, (double)layers / p->P);
}

void bt_projection_print_line(const struct bt_projection *p, const struct bt_cluster *c, FILE *f) {
    char st[32];
    fmt_time(st, sizeof st, p->stage[p->slowest].stage_s);
    fprintf(f, "%5d %6d %12s %7.1f%% %12.1f  ", p->P, (p->P + c->devices_per_node - 1) / c->devices_per_node, st,
            100 * p->bubble, p->tokens_s);
    print_bottleneck(p, c, f);
    if (!p->fits) fprintf(f, "; stage %d's weights do not fit (%.1f GiB)", p->worst_mem,
                          p->stage[p->worst_mem].weight_bytes / 1073741824.0);
    fprintf(f, "\n");
}

void bt_projection_print(const struct bt_projection *p, const struct bt_cluster *c, FILE *f) {
    fprintf(f, "%5s %5s %-10s %12s %12s %12s %10s\n", "stage", "node", "layers", "compute", "input", "stage",
            "weights");
    for (int r = 0; r < p->P; r++) {
        const struct bt_project_stage *s = &p->stage[r];
        const bool boundary = r > 0 && s->cross_node;
        if (p->P > 16 && r != 0 && !boundary && r != p->slowest && r != p->P - 1) continue;
        char lay[32], a[32], b[32], t[32];
        if (s->first >= 0)
            snprintf(lay, sizeof lay, "%d-%d", s->first, s->last);
        else
            snprintf(lay, sizeof lay, "none");
        fmt_time(a, sizeof a, s->compute_s);
        fmt_time(b, sizeof b, s->recv_s);
        fmt_time(t, sizeof t, s->stage_s);
        fprintf(f, "%5d %5d %-10s %12s %12s %12s %7.2f GiB%s%s\n", r, r / c->devices_per_node, lay, a, b, t,
                s->weight_bytes / 1073741824.0, boundary ? "  <- over the node link" : "",
                r == p->slowest ? "  (slowest)" : "");
    }
    char one[32], all[32];
    fmt_time(one, sizeof one, p->pass_s);
    fmt_time(all, sizeof all, p->step_s);
    fprintf(f, "%d micro-batches of %d tokens: one passes the pipeline in %s, all in %s; bubble %.1f%%; %.1f tokens/s\n",
            p->M, p->tokens, one, all, 100 * p->bubble, p->tokens_s);
    fprintf(f, "bottleneck: ");
    print_bottleneck(p, c, f);
    fprintf(f, "\n");
    if (!p->fits)
        fprintf(f, "memory: stage %d's weights (%.1f GiB) do not fit its device (%.1f GiB)\n", p->worst_mem,
                p->stage[p->worst_mem].weight_bytes / 1073741824.0, (double)c->device_mem / 1073741824.0);
}

/* ---- decode: pipeline stages against expert groups ----------------------------------- */

static bool read_by(const struct bt_graph *g, const struct bt_tensor *w, enum bt_op op) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == op && g->nodes[i]->src[0] == w) return true;
    return false;
}

enum bt_status bt_moe_costs_make(const struct bt_graph *g, double weight_bits, struct bt_moe_costs *mc, char *err,
                                 size_t errlen) {
    memset(mc, 0, sizeof *mc);
    int L = 0;
    for (int i = 0; i < g->n_leafs; i++) {
        const int l = bt_dist_name_layer(g->leafs[i]->name);
        if (l + 1 > L) L = l + 1;
    }
    mc->L = L;
    mc->dense_bytes = calloc((size_t)L + 2, sizeof(double));
    mc->dense_flops = calloc((size_t)L + 2, sizeof(double));
    mc->expert_bytes = calloc((size_t)L + 1, sizeof(double));
    mc->expert_flops = calloc((size_t)L + 1, sizeof(double));
    if (!mc->dense_bytes || !mc->dense_flops || !mc->expert_bytes || !mc->expert_flops) {
        bt_moe_costs_free(mc);
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const struct bt_tensor *n = g->nodes[i];
        if (n->op != BT_OP_MUL_MAT_ID) continue;
        mc->n_expert = n->src[0]->ne[2];
        mc->n_used = n->src[2]->ne[0];
        mc->d_model = n->src[1]->ne[0];
    }
    for (int i = 0; i < g->n_leafs; i++) {
        const struct bt_tensor *w = g->leafs[i];
        if (!bt_tensor_is_weight(w) || strncmp(w->name, "cache_", 6) == 0) continue;
        const int l = bt_dist_name_layer(w->name);
        const int at = l < 0 ? (read_by(g, w, BT_OP_GET_ROWS) ? 0 : L + 1) : l + 1;
        const double params = (double)w->ne[0] * (double)w->ne[1] * (double)w->ne[2] * (double)w->ne[3];
        const bool matrix = w->ne[1] > 1;
        const double bytes = matrix && weight_bits > 0 ? params * weight_bits / 8.0 : (double)bt_nbytes(w);
        if (l >= 0 && w->ne[2] > 1 && read_by(g, w, BT_OP_MUL_MAT_ID)) {
            mc->expert_bytes[l] += bytes / (double)w->ne[2];
            mc->expert_flops[l] += 2.0 * params / (double)w->ne[2];
        } else if (read_by(g, w, BT_OP_GET_ROWS) && !read_by(g, w, BT_OP_MUL_MAT)) {
            mc->dense_bytes[at] += bytes / (double)(w->ne[1] > 0 ? w->ne[1] : 1); /* a row a token */
        } else {
            mc->dense_bytes[at] += bytes;
            mc->dense_flops[at] += matrix ? 2.0 * params : 0.0;
        }
    }
    return BT_OK;
}

void bt_moe_costs_free(struct bt_moe_costs *mc) {
    BT_FREE_ALL(mc->dense_bytes, mc->dense_flops, mc->expert_bytes, mc->expert_flops);
    memset(mc, 0, sizeof *mc);
}

/* Distinct experts b tokens choose, k of E each. */
static double distinct(double E, double k, double b) { return E > 0 ? E * (1.0 - pow(1.0 - k / E, b)) : 0.0; }

enum bt_status bt_project_decode(const struct bt_moe_costs *mc, const struct bt_cluster *c, int hosts, int group,
                                 int seqs, struct bt_decode_projection *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (hosts < 1 || group < 1 || hosts % group != 0 || seqs < 1) {
        snprintf(err, errlen, "%d hosts in groups of %d, %d sequences: the groups must divide the hosts", hosts, group,
                 seqs);
        return BT_ERR_INVALID;
    }
    const int P = hosts / group;
    if (P > mc->L) {
        snprintf(err, errlen, "%d stages but the model has %d layers", P, mc->L);
        return BT_ERR_INVALID;
    }
    const double bw = c->decode.gbytes_s * 1e9, gf = c->device_gflops * 1e9;
    const double lat = c->inter.latency_us * 1e-6, link = c->inter.gbytes_s * 1e9;
    if (!(bw > 0) || !(gf > 0) || !(link > 0)) {
        snprintf(err, errlen, "the host's bandwidth and speed and the link's bandwidth must be > 0");
        return BT_ERR_INVALID;
    }
    const int M = seqs < P ? seqs : P;
    const double b = (double)seqs / M, n = group, E = (double)mc->n_expert, k = (double)mc->n_used;
    const double row = 4.0 * (double)mc->d_model;
    double sum = 0, worst = 0;
    for (int s = 0; s < P; s++) {
        const int a = mc->L * s / P, z = mc->L * (s + 1) / P; /* layers [a, z) */
        double dense_b = 0, dense_f = 0, st = 0, held = 0;
        for (int l = a; l < z; l++) {
            dense_b += mc->dense_bytes[l + 1];
            dense_f += mc->dense_flops[l + 1];
        }
        if (s == 0) dense_b += mc->dense_bytes[0], dense_f += mc->dense_flops[0];
        if (s == P - 1) dense_b += mc->dense_bytes[mc->L + 1], dense_f += mc->dense_flops[mc->L + 1];
        const double td = fmax(dense_b / bw, b * dense_f / gf);
        out->dense_s += td;
        st += td;
        for (int l = a; l < z; l++) {
            if (mc->expert_bytes[l] <= 0) continue;
            held += E / n * mc->expert_bytes[l];
            const double te = fmax(distinct(E, k, b) / n * mc->expert_bytes[l] / bw, b * k / n * mc->expert_flops[l] / gf);
            out->experts_s += te;
            st += te;
            if (group > 1) {
                const double send = (n - 1) * b * (4.0 * k + (1.0 - pow(1.0 - 1.0 / n, k)) * row);
                const double back = b * k * (n - 1) / n * row;
                const double tc = 2 * lat + (send + back) / link;
                out->comm_s += tc;
                st += tc;
            }
        }
        if (s > 0) {
            const double tb = lat + b * row / link;
            out->comm_s += tb;
            st += tb;
        }
        held += dense_b;
        if (held > out->host_bytes) out->host_bytes = held;
        sum += st;
        if (st > worst) worst = st;
    }
    out->hosts = hosts;
    out->group = group;
    out->stages = P;
    out->seqs = seqs;
    out->micro_batches = M;
    out->step_s = sum + (M - 1) * worst;
    out->tokens_s = seqs / out->step_s;
    return BT_OK;
}
