/* project_file.c - the cluster file of `baton plan --project FILE`
 * (configs/projection/eight-nodes-64gpu.yaml shows every key): the cluster's shape, its
 * device, the link inside a node and the one between nodes, and the model,
 * read into a bt_cluster and a bt_random_model.  Errors are FILE:LINE:COLUMN:
 * what is wrong. */
#include "project_file.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common.h"

struct reader {
    const char *path;
    yaml_document_t *doc;
    char *err;
    size_t n;
};

static enum bt_status bad(struct reader *r, const yaml_node_t *v, const char *fmt, const char *a, const char *b) {
    char what[256];
    snprintf(what, sizeof what, fmt, a, b);
    snprintf(r->err, r->n, "%s:%zu:%zu: %s", r->path, v->start_mark.line + 1, v->start_mark.column + 1, what);
    return BT_ERR_INVALID;
}

static const char *scalar(const yaml_node_t *v) {
    return v->type == YAML_SCALAR_NODE ? (const char *)v->data.scalar.value : NULL;
}

static enum bt_status get_num(struct reader *r, const char *sec, const char *key, const yaml_node_t *v, double lo,
                              double hi, double *out) {
    const char *s = scalar(v);
    char *end = NULL;
    errno = 0;
    const double x = s && *s ? strtod(s, &end) : NAN;
    char where[128];
    snprintf(where, sizeof where, "%s.%s", sec, key);
    if (!s || !*s || errno || *end || !isfinite(x)) return bad(r, v, "%s: expected a number, got '%.40s'", where, s ? s : "(not a value)");
    if (x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "%g..%g", lo, hi);
        return bad(r, v, "%s: out of range (%s)", where, range);
    }
    *out = x;
    return BT_OK;
}

static enum bt_status get_name(struct reader *r, const char *sec, const yaml_node_t *v, char *out, size_t n) {
    const char *s = scalar(v);
    if (!s || !*s || strlen(s) >= n) return bad(r, v, "%s.name: expected a name of 1..95 characters%s", sec, "");
    snprintf(out, n, "%s", s);
    return BT_OK;
}

/* A link section: name, gbytes_per_s, latency_us. */
static enum bt_status get_link(struct reader *r, const char *sec, yaml_node_t *m, struct bt_link_class *l) {
    int seen = 0;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(r->doc, p->key), *v = yaml_document_get_node(r->doc, p->value);
        const char *key = scalar(k) ? scalar(k) : "";
        enum bt_status st;
        if (!strcmp(key, "name")) st = get_name(r, sec, v, l->name, sizeof l->name), seen |= 1;
        else if (!strcmp(key, "gbytes_per_s")) st = get_num(r, sec, key, v, 1e-6, 1e6, &l->gbytes_s), seen |= 2;
        else if (!strcmp(key, "latency_us")) st = get_num(r, sec, key, v, 0, 1e7, &l->latency_us), seen |= 4;
        else st = bad(r, k, "%s: unknown key '%.40s' (allowed: name, gbytes_per_s, latency_us)", sec, key);
        if (st != BT_OK) return st;
    }
    if (seen != 7) return bad(r, m, "%s: needs name, gbytes_per_s and latency_us%s", sec, "");
    return BT_OK;
}

static enum bt_status get_device(struct reader *r, yaml_node_t *m, struct bt_cluster *c, double measured_gflops) {
    double peak = 0, eff = 1, mem = 0, gflops = 0;
    bool have_peak = false, have_measured = false, have_mem = false;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(r->doc, p->key), *v = yaml_document_get_node(r->doc, p->value);
        const char *key = scalar(k) ? scalar(k) : "";
        enum bt_status st = BT_OK;
        if (!strcmp(key, "name")) st = get_name(r, "device", v, c->device, sizeof c->device);
        else if (!strcmp(key, "peak_tflops")) st = get_num(r, "device", key, v, 1e-6, 1e6, &peak), have_peak = true;
        else if (!strcmp(key, "efficiency")) st = get_num(r, "device", key, v, 1e-3, 1, &eff);
        else if (!strcmp(key, "memory_gib")) st = get_num(r, "device", key, v, 1e-3, 1e6, &mem), have_mem = true;
        else if (!strcmp(key, "speed")) {
            if (!scalar(v) || strcmp(scalar(v), "measured"))
                st = bad(r, v, "device.speed: only 'measured' (this machine's CPU, one thread)%s%s", "", "");
            have_measured = true;
        } else
            st = bad(r, k, "device: unknown key '%.40s' (allowed: name, peak_tflops, efficiency, speed, memory_gib)%s",
                     key, "");
        if (st != BT_OK) return st;
    }
    if (have_peak == have_measured)
        return bad(r, m, "device: give either peak_tflops (with efficiency) or speed: measured%s%s", "", "");
    if (!have_mem) return bad(r, m, "device: needs memory_gib%s%s", "", "");
    gflops = have_peak ? peak * 1e3 * eff : measured_gflops * eff;
    c->device_gflops = gflops;
    c->device_mem = (int64_t)(mem * 1073741824.0);
    return BT_OK;
}

static enum bt_status get_cluster(struct reader *r, yaml_node_t *m, struct bt_cluster *c) {
    int seen = 0;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(r->doc, p->key), *v = yaml_document_get_node(r->doc, p->value);
        const char *key = scalar(k) ? scalar(k) : "";
        double x = 0;
        enum bt_status st;
        if (!strcmp(key, "nodes")) st = get_num(r, "cluster", key, v, 1, 512, &x), c->nodes = (int)x, seen |= 1;
        else if (!strcmp(key, "devices_per_node"))
            st = get_num(r, "cluster", key, v, 1, 64, &x), c->devices_per_node = (int)x, seen |= 2;
        else if (!strcmp(key, "micro_batches"))
            st = get_num(r, "cluster", key, v, 1, 1 << 20, &x), c->micro_batches = (int)x, seen |= 4;
        else st = bad(r, k, "cluster: unknown key '%.40s' (allowed: nodes, devices_per_node, micro_batches)%s", key, "");
        if (st != BT_OK) return st;
        if (x != floor(x)) return bad(r, v, "cluster.%s: expected a whole number%s", key, "");
    }
    if (seen != 7) return bad(r, m, "cluster: needs nodes, devices_per_node and micro_batches%s%s", "", "");
    return BT_OK;
}

/* A list of 1..BT_DECODE_MAX_CASES whole numbers in [lo, hi]. */
static enum bt_status get_list(struct reader *r, const char *key, yaml_node_t *v, double lo, double hi, int *out,
                               int *n) {
    if (v->type != YAML_SEQUENCE_NODE || v->data.sequence.items.top == v->data.sequence.items.start ||
        v->data.sequence.items.top - v->data.sequence.items.start > BT_DECODE_MAX_CASES)
        return bad(r, v, "decode.%s: expected a list of 1 to 8 numbers%s", key, "");
    *n = 0;
    for (yaml_node_item_t *i = v->data.sequence.items.start; i < v->data.sequence.items.top; i++) {
        yaml_node_t *e = yaml_document_get_node(r->doc, *i);
        double x = 0;
        const enum bt_status st = get_num(r, "decode", key, e, lo, hi, &x);
        if (st != BT_OK) return st;
        if (x != floor(x)) return bad(r, e, "decode.%s: expected whole numbers%s", key, "");
        out[(*n)++] = (int)x;
    }
    return BT_OK;
}

/* decode: gbytes_per_s (a host's memory), weight_bits, hosts, sequences */
static enum bt_status get_decode(struct reader *r, yaml_node_t *m, struct bt_decode_options *d) {
    d->given = true;
    bool bw = false;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(r->doc, p->key), *v = yaml_document_get_node(r->doc, p->value);
        const char *key = scalar(k) ? scalar(k) : "";
        enum bt_status st;
        if (!strcmp(key, "gbytes_per_s")) st = get_num(r, "decode", key, v, 1e-3, 1e6, &d->gbytes_s), bw = true;
        else if (!strcmp(key, "weight_bits")) st = get_num(r, "decode", key, v, 1, 32, &d->weight_bits);
        else if (!strcmp(key, "hosts")) st = get_list(r, key, v, 1, 4096, d->hosts, &d->n_hosts);
        else if (!strcmp(key, "sequences")) st = get_list(r, key, v, 1, 65536, d->seqs, &d->n_seqs);
        else st = bad(r, k, "decode: unknown key '%.40s' (allowed: gbytes_per_s, weight_bits, hosts, sequences)%s", key, "");
        if (st != BT_OK) return st;
    }
    if (!bw || d->n_hosts == 0 || d->n_seqs == 0)
        return bad(r, m, "decode: needs gbytes_per_s, hosts and sequences%s%s", "", "");
    return BT_OK;
}

/* model: the model options of the baton program, by their long names, and
 * tokens (a micro-batch's) */
static enum bt_status get_model(struct reader *r, yaml_node_t *m, struct bt_random_model *cfg, long *tokens) {
    static const struct option longs[] = {BT_CLI_BUILTIN_MODEL_LONG_OPTIONS, {0, 0, 0, 0}};
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(r->doc, p->key), *v = yaml_document_get_node(r->doc, p->value);
        const char *key = scalar(k) ? scalar(k) : "";
        char e[256] = "";
        if (!strcmp(key, "tokens")) {
            if (!scalar(v) || !bt_cli_parse_int(scalar(v), 1, 65536, tokens))
                return bad(r, v, "model.tokens: expected an integer in [1, 65536]%s%s", "", "");
            continue;
        }
        int code = -1;
        for (int i = 0; longs[i].name; i++)
            if (!strcmp(longs[i].name, key)) code = longs[i].val;
        if (code < 0)
            return bad(r, k, "model: unknown key '%.40s' (tokens, or the model options of baton plan --help)%s", key,
                       "");
        if (!scalar(v) || !bt_cli_model_option(cfg, code, scalar(v), e, sizeof e))
            return bad(r, v, "model.%s: %s", key, e[0] ? e : "expected a value");
    }
    return BT_OK;
}

enum bt_status bt_cli_cluster_load(const char *path, double measured_gflops, struct bt_cluster *c,
                                   struct bt_random_model *model, long *tokens, char *err, size_t n) {
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, n, "%s: cannot open: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    enum bt_status st = BT_OK;
    if (!yaml_parser_load(&parser, &doc)) {
        snprintf(err, n, "%s:%zu:%zu: %s", path, parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                 parser.problem ? parser.problem : "not YAML");
        yaml_parser_delete(&parser);
        fclose(f);
        return BT_ERR_INVALID;
    }
    struct reader r = {path, &doc, err, n};
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    int seen = 0;
    if (!root || root->type != YAML_MAPPING_NODE) {
        snprintf(err, n, "%s: expected a mapping with cluster, device, intra_node, inter_node, model, decode", path);
        st = BT_ERR_INVALID;
    } else {
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; st == BT_OK && p < root->data.mapping.pairs.top;
             p++) {
            yaml_node_t *k = yaml_document_get_node(&doc, p->key), *v = yaml_document_get_node(&doc, p->value);
            const char *key = scalar(k) ? scalar(k) : "";
            if (v->type != YAML_MAPPING_NODE) {
                st = bad(&r, v, "%s: expected a mapping%s", key, "");
                break;
            }
            if (!strcmp(key, "cluster")) st = get_cluster(&r, v, c), seen |= 1;
            else if (!strcmp(key, "device")) st = get_device(&r, v, c, measured_gflops), seen |= 2;
            else if (!strcmp(key, "intra_node")) st = get_link(&r, "intra_node", v, &c->intra), seen |= 4;
            else if (!strcmp(key, "inter_node")) st = get_link(&r, "inter_node", v, &c->inter), seen |= 8;
            else if (!strcmp(key, "model")) st = get_model(&r, v, model, tokens);
            else if (!strcmp(key, "decode")) st = get_decode(&r, v, &c->decode);
            else st = bad(&r, k, "unknown section '%.40s' (allowed: cluster, device, intra_node, inter_node, model, decode)%s", key, "");
        }
        if (st == BT_OK && seen != 15) {
            snprintf(err, n, "%s: needs the sections cluster, device, intra_node and inter_node", path);
            st = BT_ERR_INVALID;
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}
