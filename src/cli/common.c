/* common.c - model options, number parsers and the progress display shared
 * by the baton program's subcommands. */
#include "common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void bt_cli_model_defaults(struct bt_model_config *c) {
    bt_model_config_default(c);
    c->n_layers = 8;
    c->d_model = 256;
    c->n_heads = 8;
    c->d_ff = 512;
    c->n_experts = 8;
    c->top_k = 2;
    c->n_shared = 1;
    c->shared_gate = 1;
    c->norm_topk = 0; /* with the gated shared expert: Qwen2-MoE */
    c->ffn = BT_FFN_MOE_SHARED;
    c->n_vocab = 1024;
    c->n_tokens = 64;
    c->wtype = BT_TYPE_F32;
}

void bt_cli_model_help(FILE *f, const struct bt_model_config *c) {
    fprintf(f, BT_CLI_MODEL_HELP, c->n_layers, c->d_model, c->n_heads, c->d_ff, bt_ffn_kind_name(c->ffn),
            c->n_experts, c->top_k, c->n_shared, c->shared_gate, c->norm_topk, c->n_vocab, c->n_tokens, bt_type_name(c->wtype),
            (unsigned long long)c->seed);
}

bool bt_cli_parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool bt_cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || *s == '-') return false;
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

static bool parse_type(const char *s, enum bt_type *t) {
    const enum bt_type ok[] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_BF16, BT_TYPE_Q8_0, BT_TYPE_Q4_0};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (!strcmp(s, bt_type_name(ok[i]))) {
            *t = ok[i];
            return true;
        }
    }
    return false;
}

bool bt_cli_model_option(struct bt_model_config *c, int code, const char *value, char *err, size_t n) {
    long v = 0;
    const long big = 1L << 20;
    switch (code) {
#define INT_OPT(CODE, NAME, FIELD, LO, HI)                                                                 \
    case CODE:                                                                                             \
        if (!bt_cli_parse_int(value, LO, HI, &v)) {                                                        \
            snprintf(err, n, "--%s: '%s' is not an integer in [%ld, %ld]", NAME, value, (long)(LO), (long)(HI)); \
            return false;                                                                                  \
        }                                                                                                  \
        c->FIELD = (int)v;                                                                                 \
        return true;
        INT_OPT(OPT_LAYERS, "layers", n_layers, 1, 10000)
        INT_OPT(OPT_D_MODEL, "d-model", d_model, 1, big)
        INT_OPT(OPT_HEADS, "heads", n_heads, 1, 4096)
        INT_OPT(OPT_D_FF, "d-ff", d_ff, 1, big)
        INT_OPT(OPT_EXPERTS, "experts", n_experts, 1, 4096)
        INT_OPT(OPT_TOP_K, "top-k", top_k, 1, 4096)
        INT_OPT(OPT_SHARED, "shared", n_shared, 0, 64)
        INT_OPT(OPT_SHARED_GATE, "shared-gate", shared_gate, 0, 1)
        INT_OPT(OPT_NORM_TOPK, "norm-topk", norm_topk, 0, 1)
        INT_OPT(OPT_VOCAB, "vocab", n_vocab, 1, big)
        INT_OPT(OPT_TOKENS, "tokens", n_tokens, 1, 1 << 16)
#undef INT_OPT
    case OPT_FFN: {
        enum bt_ffn_kind k;
        if (bt_ffn_kind_from_name(value, &k) != BT_OK) {
            snprintf(err, n, "--ffn: '%s' is not one of mlp, moe-dense, moe-topk, moe-shared", value);
            return false;
        }
        c->ffn = k;
        return true;
    }
    case OPT_TYPE:
        if (!parse_type(value, &c->wtype)) {
            snprintf(err, n, "--type: '%s' is not one of f32, f16, bf16, q8_0, q4_0", value);
            return false;
        }
        return true;
    case OPT_SEED:
        if (!bt_cli_parse_u64(value, &c->seed)) {
            snprintf(err, n, "--seed: '%s' is not a non-negative integer", value);
            return false;
        }
        return true;
    }
    snprintf(err, n, "unknown model option");
    return false;
}

bool bt_cli_pipeline_from_topology(const struct bt_topology *t, struct bt_cli_pipeline *p) {
    memset(p, 0, sizeof *p);
    if (!t->pipeline.partition_auto) {
        p->counts = calloc((size_t)t->n_ranks, sizeof(int));
        if (!p->counts) return false;
        for (int r = 0; r < t->n_ranks; r++) p->counts[r] = t->pipeline.layers[r];
    }
    if (t->pipeline.n_pins > 0) {
        p->pins = calloc((size_t)t->pipeline.n_pins, sizeof *p->pins);
        if (!p->pins) {
            bt_cli_pipeline_free(p);
            return false;
        }
        for (int i = 0; i < t->pipeline.n_pins; i++) {
            snprintf(p->pins[i].pattern, sizeof p->pins[i].pattern, "%s", t->pipeline.pins[i].pattern);
            p->pins[i].rank = t->pipeline.pins[i].rank;
        }
        p->n_pins = t->pipeline.n_pins;
    }
    return true;
}

void bt_cli_pipeline_free(struct bt_cli_pipeline *p) {
    free(p->counts);
    free(p->pins);
    memset(p, 0, sizeof *p);
}

int bt_cli_env_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

uint8_t *bt_cli_nccl_edges(const struct bt_topology *t, int *n_edges) {
    const int P = t->n_ranks;
    uint8_t *m = calloc((size_t)P * (size_t)P, 1);
    *n_edges = m ? 0 : -1;
    for (int a = 0; m && a < P; a++)
        for (int b = 0; b < P; b++) {
            m[a * P + b] = a != b && bt_topology_edge_link(t, a, b) == BT_TOPO_LINK_NCCL;
            *n_edges += m[a * P + b];
        }
    if (*n_edges > 0) return m;
    free(m);
    return NULL;
}

int bt_cli_env_local_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return -1;
}

void bt_progress_begin(struct bt_progress *p, bool rank0, const char *label) {
    /* under mpirun stderr is a pipe: the launcher sets BATON_PROGRESS=1 when
     * its own stderr is a terminal */
    const char *env = getenv("BATON_PROGRESS");
    p->on = rank0 && (env ? strcmp(env, "1") == 0 : isatty(STDERR_FILENO));
    p->label = label;
    p->last_pct = -1;
    if (p->on) {
        fprintf(stderr, "\r%s ...", label);
        fflush(stderr);
    }
}

void bt_progress_update(struct bt_progress *p, int64_t done, int64_t total) {
    if (!p->on || total <= 0) return;
    const int pct = (int)(100 * done / total);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    fprintf(stderr, "\r%s %3d%%", p->label, pct);
    fflush(stderr);
}

void bt_progress_end(struct bt_progress *p) {
    if (!p->on) return;
    fprintf(stderr, "\r%s done\x1b[K\n", p->label);
    fflush(stderr);
}
