/* model_dist.c - a GGUF model on the distributed runtime (see model_dist.h). */
#include "model_dist.h"
#include "../mem.h"

#include <stdlib.h>
#include <string.h>

#include "bringup.h"

#define MAX_SHAPES 8
/* transport tags per shape's runtime: each shape has its own range, so the
 * receives every runtime posts ahead never take another's messages */
#define TAG_SPAN ((BT_TRANSPORT_MAX_USER_TAG + 1) / MAX_SHAPES)
/* micro-batches whose shape and number are remembered for logits */
#define RING 64

/* One ubatch shape: its graph and its runtime. */
struct shape {
    int64_t n_tokens, n_kv, n_out;
    enum bt_llm_out out_kind;
    bt_context *ctx;
    struct bt_llm_graph g;
    bt_dist *d;
    uint64_t last_use;
    int plan; /* its plan's number (bt_model_dist_plan_seconds' count): the order they were made in */
};

/* A submitted micro-batch: which shape ran it, as its runtime's how-many-th. */
struct submitted {
    int64_t k;
    int shape;
    int64_t local_k, n_out;
    int64_t width; /* floats per row */
};

struct bt_model_dist {
    bt_transport *t;
    bt_backend_t backend;
    struct bt_gguf *g;
    struct bt_model_dist_params p;
    const struct bt_arch *arch;
    struct bt_llm *m; /* every tensor of the file, without memory: bt_dist gives each rank its own */
    struct bt_kv *kv; /* the cache: its bookkeeping, and tensors the first plan places with their layers */
    struct shape shapes[MAX_SHAPES];
    uint64_t clock;
    int *counts; /* the first plan's layers per rank: every later plan's */
    struct submitted ring[RING];
    int64_t n_submitted;
    int64_t placed; /* tokens of the ubatch placed and not yet run */
    struct bt_dist_stats stats_base; /* of runtimes freed since the last reset */
    double plan_s;  /* time spent planning shapes, all of them */
    size_t weight_bytes, mapped_bytes, repacked_bytes, kv_bytes; /* this rank's, from the first plan */
    bt_sched_eval_callback eval_cb;
    void *eval_user;
    int n_plans;
    /* one ubatch's inputs */
    int32_t *cells, *rows;
    float *mask, *mask_swa; /* mask_swa: with sliding layers */
    char err[1024];
};

void bt_model_dist_default_params(struct bt_model_dist_params *p) {
    *p = (struct bt_model_dist_params){
        .n_ctx = 512, .n_seq_max = 1, .n_ubatch = 32, .kv_type = BT_TYPE_F16, .dist = {.n_copies = 2}};
}

const struct bt_hparams *bt_model_dist_hparams(const struct bt_model_dist *md) { return bt_llm_hparams(md->m); }
const char *bt_model_dist_arch_name(const struct bt_model_dist *md) { return md->arch->name; }
bt_dist *bt_model_dist_runtime(struct bt_model_dist *md) { return md->shapes[0].d; }
const struct bt_llm_graph *bt_model_dist_graph(const struct bt_model_dist *md) { return &md->shapes[0].g; }
const char *bt_model_dist_error(const struct bt_model_dist *md) { return md->err; }
int64_t bt_model_dist_n_submitted(const struct bt_model_dist *md) { return md->n_submitted; }
int bt_model_dist_n_shapes(const struct bt_model_dist *md) {
    int n = 0;
    for (int i = 0; i < MAX_SHAPES; i++) n += md->shapes[i].d != NULL;
    return n;
}

static bool is_cache(const struct bt_tensor *w) { return strncmp(w->name, "cache_", 6) == 0; }

/* bt_dist's callback for each tensor a rank holds: a weight's bytes from the
 * file (a described tied output projection has the embedding's name, and so
 * its bytes); the cache's layers zeroed. */
static void read_weight(struct bt_tensor *w, void *user) {
    struct bt_model_dist *md = user;
    if (is_cache(w)) {
        bt_tensor_memset(w, 0, 0, bt_nbytes(w)); /* cells never written are read masked: zeros, not NaN */
        return;
    }
    const int64_t i = bt_gguf_find_tensor(md->g, w->name);
    BT_ASSERT(i >= 0); /* described from this file */
    const struct bt_gguf_tensor *ft = bt_gguf_tensor(md->g, i);
    BT_ASSERT(ft->size == bt_nbytes(w));
    /* a group's weight: the experts or the rows this rank holds (bt_tensor) */
    size_t off = 0, size = ft->size;
    if (w->expert_hi > 0) {
        off = (size_t)w->expert_lo * w->nb[2];
        size = (size_t)(w->expert_hi - w->expert_lo) * w->nb[2];
    } else if (w->row_hi > 0) {
        off = (size_t)w->row_lo * w->nb[1];
        size = (size_t)(w->row_hi - w->row_lo) * w->nb[1];
    }
    const uint8_t *src = (const uint8_t *)bt_gguf_tensor_data(md->g, ft) + off;
    /* in the backend's weight buffer type (a weight no other rank reads, on a
     * CPU rank: the repack buffer type) the matrices are repacked as set */
    bt_tensor_set(w, src, off, size);
    if (w->flags & BT_TENSOR_FLAG_REPACKED) md->repacked_bytes += size;
    bt_gguf_tensor_release(md->g, ft);
}

/* in_place: every weight of the file points into its mapping (read only,
 * where its alignment allows and the backend computes in host memory), so
 * that the runtime allocates none; only the pages of the weights this rank
 * computes with are ever read. */
static void bind_in_place(struct bt_model_dist *md, struct bt_graph *gr) {
    if (bt_backend_get_default_buffer_type(md->backend) != bt_cpu_buffer_type()) return;
    for (int l = 0; l < gr->n_leafs; l++) {
        struct bt_tensor *w = gr->leafs[l];
        if (!bt_tensor_is_weight(w) || is_cache(w) || w->data) continue;
        const int64_t i = bt_gguf_find_tensor(md->g, w->name);
        if (i < 0) continue;
        const struct bt_gguf_tensor *ft = bt_gguf_tensor(md->g, i);
        const void *p = bt_gguf_tensor_data(md->g, ft);
        if ((uintptr_t)p % 32 != 0 || ft->size != bt_nbytes(w)) continue;
        w->data = (void *)p;
        w->buffer = NULL;
    }
}

void bt_model_dist_memory(const struct bt_model_dist *md, size_t *weights, size_t *mapped, size_t *repacked,
                          size_t *kv) {
    *weights = md->weight_bytes;
    *mapped = md->mapped_bytes;
    *repacked = md->repacked_bytes;
    *kv = md->kv_bytes;
}

static void shape_free(struct shape *sh) {
    if (sh->d) bt_dist_free(sh->d); /* collective; before the graph's context */
    if (sh->ctx) bt_free(sh->ctx);
    memset(sh, 0, sizeof *sh);
}

/* Add b's counters to a (the first runtime's memory and placement stay). */
static void stats_add(struct bt_dist_stats *a, const struct bt_dist_stats *b) {
    a->micro_batches += b->micro_batches;
    a->compute_s += b->compute_s;
    a->wait_s += b->wait_s;
    a->send_s += b->send_s;
    if (b->wall_s > a->wall_s) a->wall_s = b->wall_s; /* the shapes' runs overlap in time */
    a->bytes_sent += b->bytes_sent;
    a->bytes_recv += b->bytes_recv;
    a->bytes_direct += b->bytes_direct;
    a->bytes_routed += b->bytes_routed;
    a->bytes_routed_whole += b->bytes_routed_whole;
    a->bytes_group += b->bytes_group;
    a->expert_bytes_read += b->expert_bytes_read;
    a->expert_s += b->expert_s;
    a->progress_calls += b->progress_calls;
    a->attn_divided += b->attn_divided;
    a->expert_pairs += b->expert_pairs;
    a->experts_moved += b->experts_moved;
    a->experts_cut += b->experts_cut;
    if (b->n_splits > a->n_splits) a->n_splits = b->n_splits;
    if (b->compute_bytes > a->compute_bytes) a->compute_bytes = b->compute_bytes;
    a->slot_bytes += b->slot_bytes;
    if (b->rss_bytes > a->rss_bytes) a->rss_bytes = b->rss_bytes;
}

/* Build and plan a shape's graph in slot `i` (collective).  The first keeps
 * the runtime's own placement (and gives it to every later one) and
 * allocates the weights and the cache; a later one must find every tensor it
 * holds where the first put it. */
static enum bt_status shape_plan(struct bt_model_dist *md, int i, int64_t T, int64_t n_kv, int64_t n_out,
                                 enum bt_llm_out kind) {
    struct shape *sh = &md->shapes[i];
    enum bt_status st = BT_OK;
    const double t0 = bt_now_s();
    sh->n_tokens = T;
    sh->n_kv = n_kv;
    sh->n_out = n_out;
    sh->out_kind = kind;
    sh->ctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(md->m), NULL, true});
    if (!sh->ctx)
        st = bt_error_printf(md->err, sizeof md->err, BT_ERR_NOMEM, "rank %d: out of memory (a graph of %lld tokens)",
                             md->t->rank, (long long)T);
    if (st == BT_OK) {
        st = bt_llm_build_graph_out(md->m, md->kv, sh->ctx, T, n_kv, n_out, kind, &sh->g);
        if (st != BT_OK)
            bt_error_printf(md->err, sizeof md->err, st, "rank %d: building the graph: %s", md->t->rank,
                            bt_context_error(sh->ctx));
    }
    struct bt_dist_options opt = md->p.dist;
    opt.ends_with_layers = true;
    opt.tag_base = i * TAG_SPAN;
    opt.weight_buft = bt_backend_get_weight_buffer_type(md->backend);
    if (i > 0) {
        const struct bt_plan *first = bt_dist_get_plan(md->shapes[0].d);
        opt.layers_per_rank = md->counts;
        opt.gflops = first->ranks[md->t->rank].gflops; /* measured once */
        opt.verbose = false;
    }
    if (st == BT_OK) {
        sh->d = bt_dist_new(md->t, md->backend, &opt);
        if (!sh->d) st = bt_error_printf(md->err, sizeof md->err, BT_ERR_NOMEM, "rank %d: out of memory", md->t->rank);
    }
    st = bt_rank_agree(md->t, st, NULL, md->err, sizeof md->err);
    if (st == BT_OK && i == 0 && md->p.in_place) bind_in_place(md, sh->g.graph);
    if (st == BT_OK) {
        bt_dist_set_eval_callback(sh->d, md->eval_cb, md->eval_user);
        st = bt_dist_plan(sh->d, sh->g.graph, read_weight, md); /* collective, agreed */
        if (st != BT_OK) snprintf(md->err, sizeof md->err, "%s", bt_dist_error(sh->d));
    }
    if (st == BT_OK && i == 0) {
        const struct bt_plan *p = bt_dist_get_plan(sh->d);
        for (int r = 0; r < md->t->size; r++)
            md->counts[r] = p->layer_first[r] >= 0 ? p->layer_last[r] - p->layer_first[r] + 1 : 0;
        const struct bt_graph *gr = sh->g.graph;
        for (int l = 0; l < gr->n_leafs; l++) {
            const struct bt_tensor *w = gr->leafs[l];
            /* a group's weights: the experts or rows held here */
            if (!bt_tensor_is_weight(w) || (bt_dist_owner(sh->d, w) != md->t->rank && w->expert_hi == 0 && w->row_hi == 0))
                continue;
            if (is_cache(w)) {
                md->kv_bytes += bt_nbytes(w);
                continue;
            }
            const size_t held = w->expert_hi > 0 ? (size_t)(w->expert_hi - w->expert_lo) * w->nb[2]
                                : w->row_hi > 0  ? (size_t)(w->row_hi - w->row_lo) * w->nb[1]
                                                 : bt_nbytes(w);
            md->weight_bytes += held;
            if (!w->buffer && w->data) md->mapped_bytes += held;
        }
    }
    if (st == BT_OK && i > 0) {
        /* the same plan on every rank: the same verdict */
        const struct bt_graph *gr = sh->g.graph;
        for (int l = 0; l < gr->n_leafs && st == BT_OK; l++) {
            const struct bt_tensor *w = gr->leafs[l];
            if (!bt_tensor_is_weight(w)) continue;
            const int now = bt_dist_owner(sh->d, w), then = bt_dist_owner(md->shapes[0].d, w);
            if (now != then)
                st = bt_error_printf(md->err, sizeof md->err, BT_ERR_MISMATCH,
                                     "the plan of %lld tokens puts '%s' on rank %d, the first plan on rank %d",
                                     (long long)T, w->name, now, then);
        }
    }
    if (st != BT_OK) {
        shape_free(sh);
        return st;
    }
    sh->plan = ++md->n_plans;
    md->plan_s += bt_now_s() - t0;
    return BT_OK;
}

double bt_model_dist_plan_seconds(const struct bt_model_dist *md, int *n_plans) {
    if (n_plans) *n_plans = md->n_plans;
    return md->plan_s;
}

static enum bt_status build(struct bt_model_dist *md, char *err, size_t n_err) {
    const struct bt_model_dist_params *p = &md->p;
    struct bt_hparams hp;
    enum bt_status st = bt_llm_check_gguf(md->g, &md->arch, &hp, err, n_err);
    if (st == BT_OK) st = bt_llm_describe_gguf(md->g, &md->m, err, n_err);
    if (st != BT_OK) return st;
    if (p->n_ubatch < 1 || p->n_ubatch > p->n_ctx)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "ubatch size %lld out of [1, context size %lld]",
                               (long long)p->n_ubatch, (long long)p->n_ctx);
    struct bt_kv_config kc;
    bt_llm_kv_config(md->m, p->n_ctx, p->n_seq_max, p->n_ubatch, p->kv_type, &kc);
    kc.no_memory = true;
    st = bt_kv_new(&kc, &md->kv, err, n_err);
    if (st != BT_OK) return st;
    /* the cache's layers are held like weights: with their layer, allocated
     * once, kept across micro-batches and shapes */
    for (int il = 0; il < hp.n_layer; il++) {
        bt_set_weight(bt_kv_k(md->kv, il));
        if (bt_kv_v(md->kv, il)) bt_set_weight(bt_kv_v(md->kv, il));
    }
    const int64_t U = p->n_ubatch, C = bt_kv_get_config(md->kv)->n_ctx;
    md->cells = malloc((size_t)U * sizeof *md->cells);
    md->rows = malloc((size_t)U * sizeof *md->rows);
    md->mask = malloc((size_t)(U * C) * sizeof *md->mask);
    if (bt_kv_has_swa(md->kv)) md->mask_swa = malloc((size_t)(U * C) * sizeof *md->mask_swa);
    md->counts = calloc((size_t)md->t->size, sizeof *md->counts);
    if (!md->cells || !md->rows || !md->mask || !md->counts || (bt_kv_has_swa(md->kv) && !md->mask_swa))
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "rank %d: out of memory (the inputs of %lld tokens)",
                               md->t->rank, (long long)U);
    for (int i = 0; i < RING; i++) md->ring[i].k = -1;
    return BT_OK;
}

enum bt_status bt_model_dist_open(bt_transport *t, bt_backend_t backend, struct bt_gguf *g,
                                  const struct bt_model_dist_params *p, struct bt_model_dist **out, char *err,
                                  size_t n_err) {
    *out = NULL;
    struct bt_model_dist *md = calloc(1, sizeof *md);
    enum bt_status st = md ? BT_OK : bt_error_printf(err, n_err, BT_ERR_NOMEM, "rank %d: out of memory", t->rank);
    if (md) {
        md->t = t;
        md->backend = backend;
        md->g = g;
        md->p = *p;
        st = build(md, err, n_err);
    }
    st = bt_rank_agree(t, st, NULL, err, n_err); /* the same file everywhere: the same answer, but never a hang */
    if (st == BT_OK) {
        /* the first shape: a full ubatch over the whole cache, one row */
        st = shape_plan(md, 0, p->n_ubatch, bt_kv_get_config(md->kv)->n_ctx, 1, BT_LLM_OUT_LOGITS);
        if (st != BT_OK) snprintf(err, n_err, "%s", md->err);
    }
    if (st == BT_OK) *out = md;
    else bt_model_dist_free(md);
    return st;
}

void bt_model_dist_free(struct bt_model_dist *md) {
    if (!md) return;
    /* the later shapes first, the newest first: the first holds the weights
     * and the cache */
    for (;;) {
        int last = -1;
        for (int i = 1; i < MAX_SHAPES; i++)
            if (md->shapes[i].d && (last < 0 || md->shapes[i].plan > md->shapes[last].plan)) last = i;
        if (last < 0) break;
        shape_free(&md->shapes[last]);
    }
    shape_free(&md->shapes[0]);
    bt_kv_free(md->kv);
    bt_llm_free(md->m);
    BT_FREE_ALL(md->cells, md->rows, md->mask, md->mask_swa, md->counts, md);
}

/* The slot of a shape: found, or planned (collective) in a free slot or in
 * the least recently used one but the first. */
static enum bt_status shape_get(struct bt_model_dist *md, int64_t T, int64_t n_kv, int64_t n_out,
                                enum bt_llm_out kind, int *out) {
    md->clock++;
    int free_slot = -1, lru = -1;
    for (int i = 0; i < MAX_SHAPES; i++) {
        struct shape *sh = &md->shapes[i];
        if (!sh->d) {
            if (free_slot < 0) free_slot = i;
            continue;
        }
        if (sh->n_tokens == T && sh->n_kv == n_kv && sh->n_out == n_out && sh->out_kind == kind) {
            sh->last_use = md->clock;
            *out = i;
            return BT_OK;
        }
        if (i > 0 && (lru < 0 || sh->last_use < md->shapes[lru].last_use)) lru = i;
    }
    int i = free_slot;
    if (i < 0) {
        i = lru;
        struct bt_dist_stats s = bt_dist_local_stats(md->shapes[i].d);
        stats_add(&md->stats_base, &s);
        shape_free(&md->shapes[i]); /* collective: every rank evicts the same one */
    }
    const enum bt_status st = shape_plan(md, i, T, n_kv, n_out, kind);
    if (st != BT_OK) return st;
    md->shapes[i].last_use = md->clock;
    *out = i;
    return BT_OK;
}

/* The checks every rank makes alike (the ubatch is the same everywhere). */
static enum bt_status check_ubatch(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub) {
    const int64_t V = bt_llm_hparams(md->m)->n_vocab;
    if (ub->n < 1 || ub->n > md->p.n_ubatch)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID, "a ubatch of %lld tokens: 1 to %lld",
                               (long long)ub->n, (long long)md->p.n_ubatch);
    if (ub->out_kind != BT_LLM_OUT_LOGITS && ub->out_kind != BT_LLM_OUT_EMBD)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID, "a ubatch asks for rows of kind %d",
                               (int)ub->out_kind);
    if (ub->n_out < 0 || ub->n_out > ub->n)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID, "%lld rows of logits from %lld tokens",
                               (long long)ub->n_out, (long long)ub->n);
    for (int64_t i = 0; i < ub->n; i++)
        if (ub->token[i] < 0 || ub->token[i] >= V)
            return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID,
                                   "token %lld of the ubatch is %d, outside the vocabulary [0, %lld)", (long long)i,
                                   ub->token[i], (long long)V);
    for (int64_t j = 0; j < ub->n_out; j++)
        if (ub->rows[j] < 0 || ub->rows[j] >= ub->n || (j > 0 && ub->rows[j] <= ub->rows[j - 1]))
            return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID,
                                   "row %lld of the logits asked for is token %d: rows are ascending tokens of the "
                                   "ubatch", (long long)j, ub->rows[j]);
    return BT_OK;
}

enum bt_status bt_model_dist_place(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub) {
    enum bt_status st = check_ubatch(md, ub);
    if (st == BT_OK) st = bt_kv_place(md->kv, ub->n, ub->seq, ub->pos, md->cells, md->err, sizeof md->err);
    md->placed = st == BT_OK ? ub->n : 0;
    return st;
}

enum bt_status bt_model_dist_run(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub) {
    if (md->placed != ub->n)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID, "a ubatch run before it was placed");
    md->placed = 0;
    const int64_t T = ub->n;
    enum bt_status st;
    const int64_t n_kv = bt_kv_n_active(md->kv);
    int i = -1;
    st = shape_get(md, T, n_kv, ub->n_out, ub->out_kind, &i);
    if (st != BT_OK) return st;
    struct shape *sh = &md->shapes[i];
    const struct bt_llm_graph *gr = &sh->g;
    bt_kv_mask(md->kv, n_kv, T, ub->seq, ub->pos, md->mask);
    if (gr->mask_swa) bt_kv_mask_swa(md->kv, gr->n_kv_swa, T, ub->seq, ub->pos, md->mask_swa);
    struct {
        struct bt_tensor *t;
        const void *data;
        size_t bytes;
    } in[] = {
        {gr->tokens, ub->token, (size_t)T * sizeof(int32_t)},
        {gr->pos, ub->pos, (size_t)T * sizeof(int32_t)},
        {gr->cells, md->cells, (size_t)T * sizeof(int32_t)},
        {gr->mask, md->mask, (size_t)(n_kv * T) * sizeof(float)},
        {gr->cells_swa, bt_kv_swa_cells(md->kv), (size_t)T * sizeof(int32_t)},
        {gr->mask_swa, md->mask_swa, (size_t)(gr->n_kv_swa * T) * sizeof(float)},
        {gr->out_ids, ub->rows, (size_t)ub->n_out * sizeof(int32_t)},
    };
    for (size_t j = 0; j < sizeof in / sizeof in[0]; j++) {
        /* no rows asked for: no out_ids; no sliding layers: no swa inputs;
         * every layer sliding: no full layers' cells and mask */
        if (!in[j].t) continue;
        st = bt_dist_set_input(sh->d, in[j].t, in[j].data, in[j].bytes);
        if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(sh->d));
    }
    st = bt_dist_submit(sh->d); /* a failure here ends every rank (the runtime's rule mid-pipeline) */
    if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(sh->d));
    const struct bt_hparams *h = bt_llm_hparams(md->m);
    md->ring[md->n_submitted % RING] = (struct submitted){md->n_submitted, i, bt_dist_n_submitted(sh->d) - 1, ub->n_out,
                                                          ub->out_kind == BT_LLM_OUT_EMBD ? h->n_embd : h->n_vocab};
    md->n_submitted++;
    return BT_OK;
}

enum bt_status bt_model_dist_decode(struct bt_model_dist *md, const struct bt_model_dist_ubatch *ub) {
    const enum bt_status st = bt_model_dist_place(md, ub);
    return st == BT_OK ? bt_model_dist_run(md, ub) : st;
}

enum bt_status bt_model_dist_prompt(struct bt_model_dist *md, int64_t n, const int32_t *tokens, int64_t n_out) {
    if (n < 1 || n > md->p.n_ubatch || n_out < 0 || n_out > n)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID,
                               "a prompt of %lld tokens with %lld rows: 1 to %lld tokens, at most one row each",
                               (long long)n, (long long)n_out, (long long)md->p.n_ubatch);
    for (int64_t i = 0; i < n; i++) md->rows[i] = (int32_t)i; /* positions, and the rows from n - n_out */
    int32_t *seq = calloc((size_t)n, sizeof *seq);
    if (!seq) return bt_error_printf(md->err, sizeof md->err, BT_ERR_NOMEM, "out of memory");
    bt_kv_clear(md->kv);
    const struct bt_model_dist_ubatch ub = {n, tokens, md->rows, seq, n_out, md->rows + (n - n_out), BT_LLM_OUT_LOGITS};
    const enum bt_status st = bt_model_dist_decode(md, &ub);
    free(seq);
    return st;
}

int64_t bt_model_dist_seq_rm(struct bt_model_dist *md, int32_t seq) { return bt_kv_seq_rm(md->kv, seq); }
int64_t bt_model_dist_seq_trim(struct bt_model_dist *md, int32_t seq, int32_t p0) {
    return bt_kv_seq_trim(md->kv, seq, p0);
}
bool bt_model_dist_seq_reusable(const struct bt_model_dist *md, int32_t seq, int32_t n) {
    return bt_kv_seq_reusable(md->kv, seq, n);
}
enum bt_status bt_model_dist_seq_cp(struct bt_model_dist *md, int32_t src, int32_t dst, int32_t n) {
    const enum bt_status st = bt_model_dist_synchronize(md);
    if (st != BT_OK) return st;
    return bt_kv_seq_cp(md->kv, src, dst, n, md->err, sizeof md->err);
}
int32_t bt_model_dist_seq_pos_max(const struct bt_model_dist *md, int32_t seq) { return bt_kv_seq_pos_max(md->kv, seq); }

enum bt_status bt_model_dist_synchronize(struct bt_model_dist *md) {
    for (int i = 0; i < MAX_SHAPES; i++) {
        if (!md->shapes[i].d) continue;
        const enum bt_status st = bt_dist_synchronize(md->shapes[i].d);
        if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(md->shapes[i].d));
    }
    return BT_OK;
}

enum bt_status bt_model_dist_logits(struct bt_model_dist *md, int64_t k, float *out) {
    const struct submitted *s = k >= 0 ? &md->ring[k % RING] : NULL;
    if (!s || s->k != k || !md->shapes[s->shape].d)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_INVALID,
                               "the logits of micro-batch %lld are not available (%lld submitted)", (long long)k,
                               (long long)md->n_submitted);
    struct shape *sh = &md->shapes[s->shape];
    const size_t bytes = (size_t)(s->n_out * s->width) * sizeof(float);
    if (bytes == 0) return BT_OK;
    const enum bt_status st = bt_dist_get_output(sh->d, (int)s->local_k, sh->g.out, out, bytes);
    if (st != BT_OK) return bt_error_printf(md->err, sizeof md->err, st, "%s", bt_dist_error(sh->d));
    return BT_OK;
}

struct bt_dist_stats bt_model_dist_local_stats(struct bt_model_dist *md) {
    struct bt_dist_stats s = bt_dist_local_stats(md->shapes[0].d);
    stats_add(&s, &md->stats_base);
    for (int i = 1; i < MAX_SHAPES; i++) {
        if (!md->shapes[i].d) continue;
        const struct bt_dist_stats b = bt_dist_local_stats(md->shapes[i].d);
        stats_add(&s, &b);
    }
    s.bubble = s.wall_s > 0 ? 1 - s.compute_s / s.wall_s : 0;
    return s;
}

void bt_model_dist_reset_stats(struct bt_model_dist *md) {
    memset(&md->stats_base, 0, sizeof md->stats_base);
    for (int i = 0; i < MAX_SHAPES; i++)
        if (md->shapes[i].d) bt_dist_reset_stats(md->shapes[i].d);
}

enum bt_status bt_model_dist_gather_stats(struct bt_model_dist *md, struct bt_dist_stats *out) {
    const struct bt_dist_stats mine = bt_model_dist_local_stats(md);
    if (md->t->iface.gather(md->t, &mine, sizeof mine, out, 0) != BT_OK)
        return bt_error_printf(md->err, sizeof md->err, BT_ERR_COMM, "%s", md->t->error);
    return BT_OK;
}

void bt_model_dist_set_eval_callback(struct bt_model_dist *md, bt_sched_eval_callback cb, void *user) {
    md->eval_cb = cb;
    md->eval_user = user;
    for (int i = 0; i < MAX_SHAPES; i++)
        if (md->shapes[i].d) bt_dist_set_eval_callback(md->shapes[i].d, cb, user);
}
