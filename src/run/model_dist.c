/* model_dist.c - a GGUF model's prompts on the distributed runtime (see
 * model_dist.h). */
#include "model_dist.h"

#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

struct bt_model_dist {
    bt_transport *t;
    struct bt_gguf *g;
    struct bt_model_dist_params p;
    struct bt_llm *m;   /* every tensor of the file, without memory: bt_dist gives each rank its own */
    const struct bt_arch *arch;
    struct bt_kv *kv;   /* the cache's tensors, without memory (a rank's are compute memory) */
    bt_context *ctx;
    struct bt_llm_graph graph;
    bt_dist *d;
    /* the inputs every micro-batch shares */
    int32_t *pos, *seq, *cells, *out_ids;
    float *mask;
    int64_t n_submitted;
    char err[1024];
};

void bt_model_dist_default_params(struct bt_model_dist_params *p) {
    memset(p, 0, sizeof *p);
    p->n_tokens = 32;
    p->n_out = 1;
    p->kv_type = BT_TYPE_F16;
    p->dist.n_copies = 2;
}

const struct bt_hparams *bt_model_dist_hparams(const struct bt_model_dist *md) { return bt_llm_hparams(md->m); }
bt_dist *bt_model_dist_runtime(struct bt_model_dist *md) { return md->d; }
const char *bt_model_dist_arch_name(const struct bt_model_dist *md) { return md->arch->name; }
const struct bt_llm_graph *bt_model_dist_graph(const struct bt_model_dist *md) { return &md->graph; }
const char *bt_model_dist_error(const struct bt_model_dist *md) { return md->err; }

/* Every rank learns whether any failed; all return the lowest failing
 * rank's status and message. */
static enum bt_status agree(bt_transport *t, enum bt_status st, char *err, size_t n_err) {
    int64_t v = st != BT_OK ? (int64_t)(t->size - t->rank) : 0;
    if (t->iface.allreduce_max(t, &v, 1) != BT_OK) return bt_error_printf(err, n_err, BT_ERR_COMM, "%s", t->error);
    if (v == 0) return BT_OK;
    const int root = t->size - (int)v;
    int32_t code = (int32_t)st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st != BT_OK ? err : "");
    if (t->iface.bcast(t, &code, sizeof code, root) != BT_OK || t->iface.bcast(t, msg, sizeof msg, root) != BT_OK)
        return bt_error_printf(err, n_err, BT_ERR_COMM, "%s", t->error);
    msg[sizeof msg - 1] = '\0';
    snprintf(err, n_err, "%s", msg);
    return (enum bt_status)code;
}

/* Whether a weight in this rank's memory is repacked for the CPU's matmul,
 * as the engine's CPU ranks do (bt_llm_load_gguf): a matrix in CPU memory
 * that no other rank reads (a pin with compute: layer sends its tensors, and
 * they must travel plain). */
static bool repack_here(const struct bt_model_dist *md, const struct bt_tensor *w) {
    if (!w->buffer || bt_buffer_get_type(w->buffer) != bt_cpu_buffer_type() || w->ne[1] <= 1 ||
        !bt_cpu_weight_repackable(w))
        return false;
    for (int k = 0; k < md->p.dist.n_pins; k++)
        if (md->p.dist.pins[k].compute_at_layer && fnmatch(md->p.dist.pins[k].pattern, w->name, 0) == 0) return false;
    return true;
}

/* bt_dist's weight callback: the tensor's bytes from the file (a described
 * tied output projection has the embedding's name, and so its bytes). */
static void read_weight(struct bt_tensor *w, void *user) {
    struct bt_model_dist *md = user;
    const int64_t i = bt_gguf_find_tensor(md->g, w->name);
    BT_ASSERT(i >= 0); /* described from this file */
    const struct bt_gguf_tensor *ft = bt_gguf_tensor(md->g, i);
    BT_ASSERT(ft->size == bt_nbytes(w));
    if (repack_here(md, w)) bt_cpu_weight_repack(w, bt_gguf_tensor_data(md->g, ft));
    else bt_tensor_set(w, bt_gguf_tensor_data(md->g, ft), 0, ft->size);
    bt_gguf_tensor_release(md->g, ft);
}

static enum bt_status build(struct bt_model_dist *md, char *err, size_t n_err) {
    const struct bt_model_dist_params *p = &md->p;
    struct bt_hparams hp;
    enum bt_status st = bt_llm_check_gguf(md->g, &md->arch, &hp, err, n_err);
    if (st == BT_OK) st = bt_llm_describe_gguf(md->g, &md->m, err, n_err);
    if (st != BT_OK) return st;
    const int64_t T = p->n_tokens;
    if (T < 1 || p->n_out < 1 || p->n_out > T)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "%lld tokens per micro-batch with %lld rows of logits: "
                               "need 1 <= rows <= tokens", (long long)T, (long long)p->n_out);
    struct bt_kv_config kc;
    bt_llm_kv_config(md->m, T, 1, p->kv_type, &kc);
    kc.no_memory = true;
    st = bt_kv_new(&kc, &md->kv, err, n_err);
    if (st != BT_OK) return st;
    md->ctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(md->m), NULL, true});
    md->pos = malloc((size_t)T * sizeof *md->pos);
    md->seq = calloc((size_t)T, sizeof *md->seq);
    md->cells = malloc((size_t)T * sizeof *md->cells);
    md->out_ids = malloc((size_t)p->n_out * sizeof *md->out_ids);
    md->mask = malloc((size_t)(T * T) * sizeof *md->mask);
    if (!md->ctx || !md->pos || !md->seq || !md->cells || !md->out_ids || !md->mask)
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory (a graph of %lld tokens)", (long long)T);
    /* the cache holds exactly the micro-batch: n_kv = T, every cell written
     * before it is read */
    st = bt_llm_build_graph(md->m, md->kv, md->ctx, T, T, p->n_out, &md->graph);
    if (st != BT_OK) return bt_error_printf(err, n_err, st, "building the graph: %s", bt_context_error(md->ctx));
    /* one sequence at positions 0..T-1, in the empty cache's cells 0..T-1;
     * its causal mask */
    for (int64_t i = 0; i < T; i++) md->pos[i] = (int32_t)i;
    for (int64_t i = 0; i < p->n_out; i++) md->out_ids[i] = (int32_t)(T - p->n_out + i);
    st = bt_kv_place(md->kv, T, md->seq, md->pos, md->cells, err, n_err);
    if (st == BT_OK) bt_kv_mask(md->kv, T, T, md->seq, md->pos, md->mask);
    return st;
}

enum bt_status bt_model_dist_open(bt_transport *t, bt_backend_t backend, struct bt_gguf *g,
                                  const struct bt_model_dist_params *p, struct bt_model_dist **out, char *err,
                                  size_t n_err) {
    *out = NULL;
    struct bt_model_dist *md = calloc(1, sizeof *md);
    enum bt_status st = md ? BT_OK : bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    if (md) {
        md->t = t;
        md->g = g;
        md->p = *p;
        md->p.dist.ends_with_layers = true;
        st = build(md, err, n_err);
    }
    st = agree(t, st, err, n_err); /* the same file everywhere: the same answer, but never a hang */
    if (st == BT_OK) {
        md->d = bt_dist_new(t, backend, &md->p.dist);
        if (!md->d) st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
        st = agree(t, st, err, n_err);
    }
    if (st == BT_OK) {
        st = bt_dist_plan(md->d, md->graph.graph, read_weight, md); /* collective, agreed */
        if (st != BT_OK) snprintf(err, n_err, "%s", bt_dist_error(md->d));
    }
    if (st != BT_OK) {
        bt_model_dist_free(md);
        return st;
    }
    *out = md;
    return BT_OK;
}

void bt_model_dist_free(struct bt_model_dist *md) {
    if (!md) return;
    if (md->d) bt_dist_free(md->d);
    if (md->ctx) bt_free(md->ctx);
    bt_kv_free(md->kv);
    bt_llm_free(md->m);
    free(md->pos);
    free(md->seq);
    free(md->cells);
    free(md->out_ids);
    free(md->mask);
    free(md);
}

enum bt_status bt_model_dist_submit(struct bt_model_dist *md, const int32_t *tokens) {
    const int64_t T = md->p.n_tokens, V = bt_llm_hparams(md->m)->n_vocab;
    for (int64_t i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID,
                                   "token %lld of the micro-batch is %d, outside the vocabulary [0, %lld)",
                                   (long long)i, tokens[i], (long long)V);
    const struct bt_llm_graph *gr = &md->graph;
    struct {
        struct bt_tensor *t;
        const void *data;
        size_t bytes;
    } in[] = {
        {gr->tokens, tokens, (size_t)T * sizeof(int32_t)},
        {gr->pos, md->pos, (size_t)T * sizeof(int32_t)},
        {gr->cells, md->cells, (size_t)T * sizeof(int32_t)},
        {gr->mask, md->mask, (size_t)(T * T) * sizeof(float)},
        {gr->out_ids, md->out_ids, (size_t)md->p.n_out * sizeof(int32_t)},
    };
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        const enum bt_status st = bt_dist_set_input(md->d, in[i].t, in[i].data, in[i].bytes);
        if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(md->d));
    }
    const enum bt_status st = bt_dist_submit(md->d);
    if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(md->d));
    md->n_submitted++;
    return BT_OK;
}

int64_t bt_model_dist_n_submitted(const struct bt_model_dist *md) { return md->n_submitted; }

enum bt_status bt_model_dist_logits(struct bt_model_dist *md, int64_t k, float *out) {
    const size_t bytes = (size_t)(md->p.n_out * bt_llm_hparams(md->m)->n_vocab) * sizeof(float);
    const enum bt_status st = bt_dist_get_output(md->d, (int)k, md->graph.out, out, bytes);
    if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(md->d));
    return BT_OK;
}
