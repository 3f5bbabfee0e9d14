/* engine.c - a GGUF model over the ranks of a job (see engine.h): the
 * collective open (the same file everywhere, placement of the layers, the
 * model on the distributed runtime), rank 0's driver (submit, collect,
 * remove sequences, stop) and the other ranks' loop.
 *
 * The model runs on the distributed runtime (model_dist.h: the whole model's
 * graph per ubatch shape, split over the ranks by the master splitter, x and
 * every other cross-rank input as MPI or NCCL transfers, the n_copies ring).
 * The runtime is SPMD: every rank makes the same calls in the same order.
 * The engine gives rank 0 the driver's seat: for each ubatch and each
 * sequence removal rank 0 sends every other rank a message (tag HEAD: what
 * it is, the ubatch's id and sizes, or a failure's text; tag BODY: token
 * ids, positions, sequences, rows asked for), and each rank makes the call
 * that message says, in the order rank 0 made it.  MPI keeps the messages of
 * one sender, receiver and tag in order, so every rank's cache sees the same
 * placements and removals.
 *
 * Rank 0 checks and places a ubatch first (nothing is sent for a ubatch that
 * does not fit), then tells the others and submits it: while the ranks after
 * it work on it, the next submit goes on.  The runtime keeps the logits of
 * its last n_copies micro-batches; rank 0 takes them into their slot before
 * the ring would need it again, so up to n_copies ubatches are in flight
 * and logits that came back wait in their slot until collected.  After each
 * ubatch every other rank sends rank 0 its compute seconds so far (tag
 * STATS, a few bytes), which bt_engine_compute_seconds reports.
 */
#include "engine.h"
#include "../mem.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "model_dist.h"
#include "place.h"

enum { TAG_HEAD = 7001, TAG_BODY = 7002, TAG_STATS = 7003 };
enum { MSG_UBATCH = 1, MSG_SEQ_RM = 2, MSG_STOP = 3, MSG_SEQ_CP = 4 };

#define MSG_TEXT 400

/* The head of every message. */
struct msg_head {
    int32_t kind;
    int32_t n_tokens, n_out;
    int32_t arg;   /* MSG_SEQ_RM: the sequence; MSG_SEQ_CP: the source; MSG_UBATCH: the rows' kind (enum bt_llm_out) */
    int32_t status; /* MSG_STOP with a text: the failure's bt_status */
    int32_t arg2;  /* MSG_SEQ_RM: the first position removed (0: all); MSG_SEQ_CP: the destination */
    uint64_t id;   /* MSG_UBATCH: the ubatch's number */
    uint64_t body; /* bytes of the body that follows (MSG_UBATCH) */
    char text[MSG_TEXT]; /* MSG_STOP: a failure every rank ends with */
};

/* A failure's status as a message gives it: one of bt_status's errors, else
 * (a broken message) BT_ERR_COMM. */
static enum bt_status wire_status(int32_t s) {
    return s <= BT_ERR_INVALID && s >= BT_ERR_MISMATCH ? (enum bt_status)s : BT_ERR_COMM;
}

/* A message rank 0 sends to every other rank: head and body stay alive until
 * every send is done. */
struct out_msg {
    struct msg_head head;
    void *body;
    size_t cap;
    bt_treq *rh, *rb; /* [P] */
};

/* A ubatch rank 0 submitted and nobody collected yet. */
struct slot {
    uint64_t id;
    int64_t k;      /* its micro-batch number on the runtime */
    int64_t n_out;
    int64_t width;  /* floats per row: n_vocab, or n_embd (hidden states) */
    bool fetched;   /* its logits taken from the runtime */
    float *logits;  /* [width, n_out] */
    size_t cap;
};

/* A rank's compute seconds so far, to rank 0 (last: the rank stops). */
struct stats_msg {
    double compute_s;
    int64_t last;
};

struct bt_engine {
    struct bt_rank *r;
    bt_transport *t;
    struct bt_engine_params p;
    char path[1024];
    struct bt_gguf *g;
    const struct bt_arch *arch;
    struct bt_hparams hp;
    int P;
    int *il0s, *il1s; /* every rank's range ([0, 0): none) */
    char (*backends)[32]; /* rank 0: every rank's backend as placed ("CPU(avx2)@host") */
    struct bt_model_dist *md;
    int32_t *rows;    /* one ubatch's rows asked for */
    int32_t *in;      /* ranks 1..P-1: a ubatch's body as it comes, sized at open for the largest */
    /* rank 0: messages to the others, a ring */
    struct out_msg *outs;
    int n_outs, next_out;
    /* rank 0: the queue of ubatches not yet collected */
    struct slot *q;
    int q_cap, q_head, q_len;
    uint64_t next_id;
    bool stopped;
    enum bt_status fatal;
    char err[1024];
    struct bt_engine_stats stats;
    /* statistics to rank 0: the others' sends (a ring), rank 0's receives */
    struct stats_msg stats_out[4];
    bt_treq stats_req[4];
    int stats_next;
    struct stats_msg *stats_in; /* rank 0: [P] */
    bt_treq *stats_rq;          /* rank 0: [P], one posted per rank */
    double *rank_compute_s;     /* rank 0: [P], as the last stats said */
};

static enum bt_status efail(struct bt_engine *e, enum bt_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static enum bt_status efail(struct bt_engine *e, enum bt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof e->err, fmt, ap);
    va_end(ap);
    return st;
}

/* snprintf without the compiler's truncation warnings: messages are cut at
 * their buffer's size on purpose */
static void msgf(char *buf, size_t n, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void msgf(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

void bt_engine_set_eval_callback(struct bt_engine *e, bt_sched_eval_callback cb, void *user) {
    if (e->md) bt_model_dist_set_eval_callback(e->md, cb, user);
}

uint64_t bt_engine_computing(const struct bt_engine *e) {
    return e->md ? (uint64_t)bt_model_dist_n_submitted(e->md) : 0;
}

void bt_engine_default_params(struct bt_engine_params *p) {
    *p = (struct bt_engine_params){.n_ctx = 4096, .n_seq_max = 1, .n_ubatch = 512, .kv_type = BT_TYPE_F16};
}

/* ---- messages --------------------------------------------------------------------- */

/* Body of a ubatch: token, pos, seq [T], then the rows asked for [n_out]. */
static size_t body_bytes(int64_t T, int64_t n_out) { return (size_t)(3 * T + n_out) * sizeof(int32_t); }

/* A free entry of the send ring in *out (waits for its last sends), with
 * room for a body of that many bytes. */
static enum bt_status out_get(struct bt_engine *e, size_t body, struct out_msg **out) {
    struct out_msg *o = &e->outs[e->next_out];
    e->next_out = (e->next_out + 1) % e->n_outs;
    *out = NULL;
    for (int r = 1; r < e->P; r++)
        if (bt_transport_wait_polite(e->t, &o->rh[r]) != BT_OK || bt_transport_wait_polite(e->t, &o->rb[r]) != BT_OK)
            return efail(e, BT_ERR_COMM, "rank 0: sending to rank %d: %s", r, e->t->error);
    if (body > o->cap) {
        void *b = realloc(o->body, body);
        if (!b) return efail(e, BT_ERR_NOMEM, "rank 0: out of memory (a message of %zu bytes)", body);
        o->body = b;
        o->cap = body;
    }
    memset(&o->head, 0, sizeof o->head);
    o->head.body = body;
    *out = o;
    return BT_OK;
}

/* The message to every other rank. */
static enum bt_status out_send(struct bt_engine *e, struct out_msg *o) {
    for (int r = 1; r < e->P; r++) {
        enum bt_status st = bt_transport_isend(e->t, &o->head, sizeof o->head, r, TAG_HEAD, &o->rh[r]);
        if (st == BT_OK && o->head.body > 0) st = bt_transport_isend(e->t, o->body, o->head.body, r, TAG_BODY, &o->rb[r]);
        if (st != BT_OK) return efail(e, BT_ERR_COMM, "rank 0: sending to rank %d: %s", r, e->t->error);
        e->stats.bytes_sent += sizeof o->head + o->head.body;
    }
    return BT_OK;
}

/* A head-only message (MSG_SEQ_RM, MSG_SEQ_CP, MSG_STOP) to every other
 * rank (MSG_SEQ_CP: n positions in n_tokens); text: a failure the stop
 * carries to every rank, with its status why. */
static enum bt_status send_control(struct bt_engine *e, int kind, int32_t arg, int32_t arg2, int32_t n,
                                   const char *text, enum bt_status why) {
    struct out_msg *o;
    const enum bt_status st = out_get(e, 0, &o);
    if (st != BT_OK) return st;
    o->head.kind = kind;
    o->head.arg = arg;
    o->head.arg2 = arg2;
    o->head.n_tokens = n;
    if (text) {
        msgf(o->head.text, sizeof o->head.text, "%s", text);
        o->head.status = why;
    }
    return out_send(e, o);
}

static enum bt_status drain_sends(struct bt_engine *e) {
    for (int i = 0; e->outs && i < e->n_outs; i++)
        for (int r = 1; r < e->P; r++)
            if (bt_transport_wait_polite(e->t, &e->outs[i].rh[r]) != BT_OK ||
                bt_transport_wait_polite(e->t, &e->outs[i].rb[r]) != BT_OK)
                return efail(e, BT_ERR_COMM, "rank 0: sending to rank %d: %s", r, e->t->error);
    for (int i = 0; i < 4; i++)
        if (bt_transport_wait_polite(e->t, &e->stats_req[i]) != BT_OK)
            return efail(e, BT_ERR_COMM, "rank %d: %s", e->t->rank, e->t->error);
    return BT_OK;
}

/* A rank other than 0, after a ubatch (or as it stops: last): its compute
 * seconds to rank 0 (0 on a rank the plan gives no split: a pin can give
 * work to a rank without layers). */
static void send_stats(struct bt_engine *e, bool last) {
    const int i = e->stats_next;
    e->stats_next = (i + 1) % 4;
    if (bt_transport_wait_polite(e->t, &e->stats_req[i]) != BT_OK) return; /* the next receive fails too */
    e->stats_out[i] = (struct stats_msg){bt_model_dist_local_stats(e->md).compute_s, last};
    bt_transport_isend(e->t, &e->stats_out[i], sizeof e->stats_out[i], 0, TAG_STATS, &e->stats_req[i]);
}

/* Rank 0: take the statistics that came (wait: until every rank sent its
 * last). */
static void poll_stats(struct bt_engine *e, bool wait) {
    for (int r = 1; r < e->P; r++) {
        while (e->stats_rq && e->stats_rq[r].active) {
            bool done = false;
            if (wait) done = bt_transport_wait_polite(e->t, &e->stats_rq[r]) == BT_OK;
            else if (bt_transport_test(e->t, &e->stats_rq[r], &done) != BT_OK) done = false;
            if (!done) break;
            e->rank_compute_s[r] = e->stats_in[r].compute_s;
            if (e->stats_in[r].last) break; /* the rank stops: nothing more comes */
            if (bt_transport_irecv(e->t, &e->stats_in[r], sizeof e->stats_in[r], r, TAG_STATS, &e->stats_rq[r]) !=
                BT_OK)
                break;
        }
    }
}

/* ---- open ---------------------------------------------------------------------------- */

static void host_name(char *buf, size_t n) {
    if (gethostname(buf, n) != 0) snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

/* KV bytes layer l's cache takes (a sliding layer's ring: kv.h). */
static double kv_layer_bytes(const struct bt_hparams *h, const struct bt_engine_params *p, int l) {
    struct bt_kv_config kc;
    bt_hparams_kv_config(h, 0, h->n_layer, p->n_ctx, p->n_seq_max, p->n_ubatch, p->kv_type, &kc);
    return (double)bt_kv_config_layer_cells(&kc, l) * (double)bt_kv_config_row_bytes(&kc);
}

static double kv_bytes(const struct bt_hparams *h, const struct bt_engine_params *p) {
    double b = 0.0;
    for (int l = 0; l < h->n_layer; l++) b += kv_layer_bytes(h, p, l);
    return b;
}

/* The FLOPs of one token through layer l (part l as bt_llm_part_bytes). */
static double part_flops(struct bt_gguf *g, const struct bt_hparams *h, int l) {
    if (l < 0) return 0.0;
    if (l >= h->n_layer) return 2.0 * (double)h->n_embd * (double)h->n_vocab;
    double f = 0.0;
    const int64_t *idx = NULL;
    const int64_t n = bt_gguf_layer_tensors(g, l, &idx);
    for (int64_t i = 0; i < n; i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, idx[i]);
        double el = (double)t->ne[0] * (double)t->ne[1] * (double)t->ne[2] * (double)t->ne[3];
        /* routed experts (not deepseek2's per-head attn_k_b / attn_v_b, 3-d too) */
        if (t->ne[2] > 1 && h->n_expert > 0 && strstr(t->name, "_exps."))
            el *= (double)h->n_expert_used / (double)h->n_expert;
        f += 2.0 * el;
    }
    return f;
}

/* The layer ranges (first[r]..last[r], -1: none).  with_kv: count the
 * cache in each rank's memory. */
static enum bt_status place_layers(struct bt_gguf *g, const struct bt_hparams *h, const struct bt_engine_params *p,
                                   const struct bt_rank_desc *descs, int P, const int *layer_counts,
                                   const struct bt_expert_group *groups, int n_groups, bool with_kv, int *first,
                                   int *last, char *msg, size_t n_msg) {
    const int L = h->n_layer;
    struct bt_layer_costs lc;
    memset(&lc, 0, sizeof lc);
    lc.L = L;
    lc.flops = calloc((size_t)L + 2, sizeof(double));
    lc.wbytes = calloc((size_t)L + 2, sizeof(double));
    lc.cut_bytes = calloc((size_t)L + 1, sizeof(double));
    double *pred = calloc((size_t)P, sizeof(double));
    enum bt_status st = BT_OK;
    if (!lc.flops || !lc.wbytes || !lc.cut_bytes || !pred) {
        snprintf(msg, n_msg, "rank 0: out of memory placing %d layers", L);
        st = BT_ERR_NOMEM;
    }
    for (int l = -1; st == BT_OK && l <= L; l++) {
        lc.flops[l + 1] = part_flops(g, h, l) * (double)p->n_ubatch;
        lc.wbytes[l + 1] = (double)bt_llm_part_bytes(g, h, l);
        if (with_kv && l >= 0 && l < L) lc.wbytes[l + 1] += kv_layer_bytes(h, p, l);
    }
    for (int l = 0; st == BT_OK && l <= L; l++) lc.cut_bytes[l] = (double)(h->n_embd * p->n_ubatch) * 4.0;
    struct bt_plan_options opt;
    memset(&opt, 0, sizeof opt);
    opt.layers_per_rank = layer_counts;
    opt.groups = groups;
    opt.n_groups = n_groups;
    if (st == BT_OK) st = bt_place_layers(&lc, descs, P, &opt, first, last, pred, msg, n_msg);
    /* a fixed partition is not placed by memory: check it (an expert group's
     * first rank with the whole group's memory: the experts are divided) */
    for (int r = 0; st == BT_OK && r < P; r++) {
        const int a = first[r] >= 0 ? first[r] : 0, b = first[r] >= 0 ? last[r] + 1 : 0;
        double by = 0, mem = (double)descs[r].mem_bytes;
        int member = -1;
        const int gi = bt_expert_group_of(groups, n_groups, r, &member);
        if (member > 0) continue;
        for (int i = 1; gi >= 0 && i < groups[gi].n_ranks; i++) mem += (double)descs[groups[gi].ranks[i]].mem_bytes;
        for (int l = a; l < b; l++) by += lc.wbytes[l + 1];
        if (r == 0) by += lc.wbytes[0];
        if (r == P - 1) by += lc.wbytes[L + 1];
        if (by > mem) {
            snprintf(msg, n_msg, "rank %d (%s) gets layers [%d, %d), %.1f MiB, more than its %.1f MiB of memory", r,
                     descs[r].backend, a, b, by / 1048576.0, (double)descs[r].mem_bytes / 1048576.0);
            st = BT_ERR_NOMEM;
        }
    }
    BT_FREE_ALL(lc.flops, lc.wbytes, lc.cut_bytes, pred);
    return st;
}

enum bt_status bt_engine_place(struct bt_gguf *g, const struct bt_hparams *h, const struct bt_engine_params *p,
                               const struct bt_rank_desc *descs, int P, const int *layer_counts,
                               const struct bt_expert_group *groups, int n_groups, int32_t *ranges, char *msg,
                               size_t n_msg) {
    int *first = calloc((size_t)P, sizeof(int)), *last = calloc((size_t)P, sizeof(int));
    const char *path = bt_gguf_path(g);
    char perr[512];
    enum bt_status st = BT_OK;
    if (!first || !last) st = BT_ERR_NOMEM, msgf(msg, n_msg, "rank 0: out of memory");
    if (st == BT_OK) st = place_layers(g, h, p, descs, P, layer_counts, groups, n_groups, true, first, last, perr, sizeof perr);
    if (st != BT_OK && st != BT_ERR_NOMEM) {
        msgf(msg, n_msg, "%s: placement: %s", path, perr);
    } else if (st == BT_ERR_NOMEM && first && last) {
        /* the weights alone would fit: the cache is what does not */
        char perr2[512];
        if (place_layers(g, h, p, descs, P, layer_counts, groups, n_groups, false, first, last, perr2, sizeof perr2) == BT_OK)
            msgf(msg, n_msg,
                 "%s: a context of %lld cells needs %.1f MiB of KV cache (%s) beside the weights, more than the "
                 "ranks' memory holds: %s",
                 path, (long long)p->n_ctx, kv_bytes(h, p) / 1048576.0, bt_type_name(p->kv_type),
                 perr);
        else
            msgf(msg, n_msg, "%s: %s", path, perr2);
    }
    for (int i = 0; st == BT_OK && i < P; i++) {
        ranges[2 * i] = first[i] >= 0 ? first[i] : 0;
        ranges[2 * i + 1] = first[i] >= 0 ? last[i] + 1 : 0;
    }
    free(first);
    free(last);
    return st;
}

/* The parameters every rank must agree on, as rank 0 has them. */
struct wire_params {
    int64_t n_ctx, n_ubatch;
    int32_t n_seq_max, kv_type, max_inflight, pad_;
};

enum bt_status bt_engine_open(struct bt_rank *r, const struct bt_engine_params *p, struct bt_engine **out, char *err,
                              size_t n_err) {
    *out = NULL;
    bt_transport *t = r->t;
    struct bt_engine *e = calloc(1, sizeof *e);
    char msg[1024] = "", host[128];
    host_name(host, sizeof host);
    enum bt_status st = BT_OK;
    int32_t *ranges = NULL;              /* every rank's layer range, from rank 0 */
    struct bt_rank_desc *descs = NULL;   /* rank 0: every rank's description */
#define AGREE()                                                                                \
    do {                                                                                       \
        if (st == BT_OK) msg[0] = '\0';                                                        \
        st = bt_rank_agree(t, st, NULL, msg, sizeof msg);                                      \
        if (st != BT_OK) goto fail;                                                            \
    } while (0)
    if (!e) {
        msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        st = BT_ERR_NOMEM;
    } else {
        e->r = r;
        e->t = t;
        e->p = *p;
        e->P = t->size;
    }
    AGREE();

    /* 1. the parameters: valid, and the same on every rank */
    const struct bt_engine_params *q = &e->p;
    if (q->n_ctx <= 0 || q->n_ctx > (1 << 24))
        st = BT_ERR_INVALID, msgf(msg, sizeof msg, "context size %lld out of [1, %d]", (long long)q->n_ctx, 1 << 24);
    else if (q->n_seq_max < 1 || q->n_seq_max > q->n_ctx)
        st = BT_ERR_INVALID,
        msgf(msg, sizeof msg, "%d sequences do not fit a context of %lld cells", q->n_seq_max, (long long)q->n_ctx);
    else if (q->n_ubatch < 1 || q->n_ubatch > q->n_ctx)
        st = BT_ERR_INVALID, msgf(msg, sizeof msg, "ubatch size %lld out of [1, context size %lld]",
                                      (long long)q->n_ubatch, (long long)q->n_ctx);
    else if (q->kv_type != BT_TYPE_F16 && q->kv_type != BT_TYPE_F32 && q->kv_type != BT_TYPE_Q8_0)
        st = BT_ERR_UNSUPPORTED, msgf(msg, sizeof msg, "cache type %d is not f16, f32 or q8_0", (int)q->kv_type);
    else if (q->max_inflight < 0 || q->max_inflight > 1024)
        st = BT_ERR_INVALID, msgf(msg, sizeof msg, "max_inflight %d out of [0, 1024]", q->max_inflight);
    AGREE();
    struct wire_params mine = {q->n_ctx, q->n_ubatch, q->n_seq_max, (int32_t)q->kv_type, q->max_inflight, 0}, root = mine;
    if (t->iface.bcast(t, &root, sizeof root, 0) != BT_OK)
        st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
    else if (memcmp(&mine, &root, sizeof mine) != 0)
        st = BT_ERR_MISMATCH, msgf(msg, sizeof msg,
                                       "rank %d opens the model with other parameters than rank 0 (context %lld, "
                                       "sequences %d, ubatch %lld; rank 0: %lld, %d, %lld)",
                                       t->rank, (long long)mine.n_ctx, mine.n_seq_max, (long long)mine.n_ubatch,
                                       (long long)root.n_ctx, root.n_seq_max, (long long)root.n_ubatch);
    AGREE();

    /* 2. the file, the same on every rank */
    /* the caller's path, else this rank's host's in the topology, else the pipeline's */
    const char *path = p->model;
    if ((!path || !*path) && r->have_topo) {
        const struct bt_topo_rank *tr = bt_topology_rank(&r->topo, t->rank);
        const struct bt_topo_host *th = tr ? bt_topology_host(&r->topo, tr->host) : NULL;
        path = th && th->model ? th->model : r->topo.pipeline.model;
    }
    if (!path || !*path)
        st = BT_ERR_INVALID,
        msgf(msg, sizeof msg, "rank %d: no model file: give one, or the topology's pipeline.model (or its host's model)", t->rank);
    else
        snprintf(e->path, sizeof e->path, "%s", path);
    AGREE();
    {
        char gerr[900];
        st = bt_gguf_open(e->path, &e->g, gerr, sizeof gerr);
        if (st != BT_OK) msgf(msg, sizeof msg, "rank %d (host %s): %s", t->rank, host, gerr);
    }
    AGREE();
    uint64_t id_mine[2] = {bt_gguf_file_size(e->g), bt_gguf_header_checksum(e->g)}, id_root[2] = {id_mine[0], id_mine[1]};
    if (t->iface.bcast(t, id_root, sizeof id_root, 0) != BT_OK)
        st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
    else if (id_mine[0] != id_root[0] || id_mine[1] != id_root[1])
        st = BT_ERR_MISMATCH,
        msgf(msg, sizeof msg,
                 "rank %d (host %s): %s is not the file rank 0 opened (%llu bytes, header checksum %016llx; rank 0's: "
                 "%llu bytes, %016llx): every rank needs the same model file",
                 t->rank, host, e->path, (unsigned long long)id_mine[0], (unsigned long long)id_mine[1],
                 (unsigned long long)id_root[0], (unsigned long long)id_root[1]);
    AGREE();
    {
        char gerr[900];
        st = bt_llm_check_gguf(e->g, &e->arch, &e->hp, gerr, sizeof gerr);
        if (st != BT_OK) msgf(msg, sizeof msg, "rank %d (host %s): %s", t->rank, host, gerr);
        else {
            struct bt_kv_config kc;
            memset(&kc, 0, sizeof kc);
            kc.n_ctx = q->n_ctx;
            kc.n_seq_max = q->n_seq_max;
            kc.type = q->kv_type;
            bt_hparams_kv_config(&e->hp, 0, e->hp.n_layer, q->n_ctx, q->n_seq_max, 0, q->kv_type, &kc);
            st = bt_kv_check_config(&kc, gerr, sizeof gerr);
            if (st != BT_OK) msgf(msg, sizeof msg, "%s: %s", e->path, gerr);
        }
    }
    AGREE();

    /* 3. placement on rank 0 from every rank's description */
    {
        const int P = e->P;
        struct bt_rank_desc d;
        memset(&d, 0, sizeof d);
        /* a CPU rank names its kernels' variant: ranks on different CPUs give the same bits */
        char what[64];
        msgf(d.backend, sizeof d.backend, "%s@%s", bt_backend_describe(r->backend, what, sizeof what), host);
        d.mem_bytes = bt_backend_plan_memory(r->backend, r->dist.mem_limit, t->local_size, NULL);
        d.gflops = r->layer_counts ? 1.0 : bt_backend_measure_gflops(r->backend);
        descs = t->rank == 0 ? calloc((size_t)P, sizeof *descs) : NULL;
        ranges = calloc((size_t)(2 * P), sizeof(int32_t));
        e->il0s = calloc((size_t)P, sizeof(int));
        e->il1s = calloc((size_t)P, sizeof(int));
        if ((t->rank == 0 && !descs) || !ranges || !e->il0s || !e->il1s)
            st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        AGREE(); /* before the gather: a rank that failed does not take part */
        if (t->iface.gather(t, &d, sizeof d, descs, 0) != BT_OK)
            st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
        if (st == BT_OK && t->rank == 0)
            st = bt_engine_place(e->g, &e->hp, &e->p, descs, P, r->layer_counts, r->dist.groups, r->dist.n_groups,
                                 ranges, msg, sizeof msg);
        if (st == BT_OK && t->rank == 0) {
            e->backends = calloc((size_t)P, sizeof *e->backends);
            if (!e->backends) st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank 0: out of memory");
            for (int i = 0; e->backends && i < P; i++) msgf(e->backends[i], sizeof e->backends[i], "%s", descs[i].backend);
        }
        free(descs);
        descs = NULL;
        AGREE();
        if (t->iface.bcast(t, ranges, sizeof(int32_t) * (size_t)(2 * P), 0) != BT_OK)
            st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
        for (int i = 0; st == BT_OK && i < P; i++) {
            e->il0s[i] = ranges[2 * i];
            e->il1s[i] = ranges[2 * i + 1];
        }
        free(ranges);
        ranges = NULL;
        AGREE();
    }

    /* 4. the model on the runtime: every rank's layers as placed above, the
     * weights each rank holds read from the file, its cache */
    {
        const int P = e->P;
        int *counts = calloc((size_t)P, sizeof *counts);
        e->rows = malloc((size_t)q->n_ubatch * sizeof *e->rows);
        e->in = t->rank != 0 ? malloc(body_bytes(q->n_ubatch, q->n_ubatch)) : NULL;
        if (!counts || !e->rows || (t->rank != 0 && !e->in)) st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        /* the value in use, which bt_engine_params reports: the runtime's
         * ring holds that many micro-batches */
        int inflight = q->max_inflight > 0 ? q->max_inflight : P * (r->copies > 0 ? r->copies : 1);
        if (inflight > BT_SCHED_MAX_COPIES) inflight = BT_SCHED_MAX_COPIES;
        e->p.max_inflight = inflight;
        if (st == BT_OK) {
            for (int i = 0; i < P; i++) counts[i] = e->il1s[i] - e->il0s[i];
        }
        if (st == BT_OK) msg[0] = '\0';
        st = bt_rank_agree(t, st, NULL, msg, sizeof msg); /* counts is freed below on every path */
        if (st == BT_OK) {
            struct bt_model_dist_params mp;
            bt_model_dist_default_params(&mp);
            mp.n_ctx = q->n_ctx;
            mp.n_seq_max = q->n_seq_max;
            mp.n_ubatch = q->n_ubatch;
            mp.kv_type = q->kv_type;
            mp.in_place = q->mmap;
            mp.dist = r->dist;
            mp.dist.n_copies = inflight;
            mp.dist.device_transport = r->device_t; /* x between two ranks that both have one */
            mp.dist.device_edges = r->device_edges;
            mp.dist.layers_per_rank = counts;
            if (r->layer_counts) mp.dist.gflops = 1.0; /* fixed counts: speeds are not needed */
            char derr[1024];
            st = bt_model_dist_open(t, r->backend, e->g, &mp, &e->md, derr, sizeof derr); /* collective, agreed */
            if (st != BT_OK) msgf(msg, sizeof msg, "%s", derr);
        }
        free(counts);
        if (st == BT_OK) {
            bt_model_dist_memory(e->md, &e->stats.weight_bytes, &e->stats.mapped_bytes, &e->stats.repacked_bytes,
                                 &e->stats.kv_bytes);
            e->n_outs = inflight + 2;
            e->q_cap = inflight + 1;
            e->outs = t->rank == 0 ? calloc((size_t)e->n_outs, sizeof *e->outs) : NULL;
            e->q = t->rank == 0 ? calloc((size_t)e->q_cap, sizeof *e->q) : NULL;
            if (t->rank == 0) {
                e->stats_in = calloc((size_t)P, sizeof *e->stats_in);
                e->stats_rq = calloc((size_t)P, sizeof *e->stats_rq);
                e->rank_compute_s = calloc((size_t)P, sizeof *e->rank_compute_s);
            }
            bool ok = t->rank != 0 || (e->outs && e->q && e->stats_in && e->stats_rq && e->rank_compute_s);
            for (int i = 0; ok && t->rank == 0 && i < e->n_outs; i++) {
                e->outs[i].rh = calloc((size_t)P, sizeof(bt_treq));
                e->outs[i].rb = calloc((size_t)P, sizeof(bt_treq));
                ok = e->outs[i].rh && e->outs[i].rb;
            }
            if (!ok) st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        }
    }
    AGREE();
    /* rank 0 takes every computing rank's statistics as they come */
    for (int k = 1; t->rank == 0 && k < e->P; k++) {
        if (bt_transport_irecv(t, &e->stats_in[k], sizeof e->stats_in[k], k, TAG_STATS, &e->stats_rq[k]) != BT_OK)
            st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank 0: %s", t->error);
    }
    AGREE();
#undef AGREE
    *out = e;
    return BT_OK;
fail:
    free(ranges);
    free(descs);
    msgf(err, n_err, "%s", msg);
    if (e) e->stopped = true; /* nobody to stop: every rank fails here */
    bt_engine_close(e);
    return st;
}

void bt_engine_close(struct bt_engine *e) {
    if (!e) return;
    if (e->t && e->t->rank == 0 && !e->stopped) bt_engine_stop(e);
    /* receives still posted (a rank 0 whose engine failed before the others
     * said their last) are taken back */
    for (int k = 0; e->stats_rq && k < e->P; k++)
        if (e->stats_rq[k].active && e->t->iface.cancel) e->t->iface.cancel(e->t, &e->stats_rq[k]);
    for (int i = 0; e->outs && i < e->n_outs; i++) {
        for (int k = 0; k < e->P; k++) {
            if (e->outs[i].rh && e->outs[i].rh[k].active && e->t->iface.cancel) e->t->iface.cancel(e->t, &e->outs[i].rh[k]);
            if (e->outs[i].rb && e->outs[i].rb[k].active && e->t->iface.cancel) e->t->iface.cancel(e->t, &e->outs[i].rb[k]);
        }
        free(e->outs[i].rh);
        free(e->outs[i].rb);
        free(e->outs[i].body);
    }
    for (int i = 0; i < 4; i++)
        if (e->stats_req[i].active && e->t->iface.cancel) e->t->iface.cancel(e->t, &e->stats_req[i]);
    for (int i = 0; e->q && i < e->q_cap; i++) free(e->q[i].logits);
    free(e->q);
    free(e->outs);
    bt_model_dist_free(e->md); /* collective: every rank closes */
    bt_gguf_close(e->g);
    BT_FREE_ALL(e->rows, e->in, e->il0s, e->il1s, e->backends, e->stats_in, e->stats_rq, e->rank_compute_s, e);
}

const char *bt_engine_error(const struct bt_engine *e) { return e->err; }
const struct bt_hparams *bt_engine_hparams(const struct bt_engine *e) { return &e->hp; }
const struct bt_arch *bt_engine_arch(const struct bt_engine *e) { return e->arch; }
const struct bt_engine_params *bt_engine_params(const struct bt_engine *e) { return &e->p; }
struct bt_gguf *bt_engine_gguf(const struct bt_engine *e) { return e->g; }
const struct bt_plan *bt_engine_plan(const struct bt_engine *e) { return bt_dist_get_plan(bt_model_dist_runtime(e->md)); }
int bt_engine_n_ranks(const struct bt_engine *e) { return e->P; }
const char *bt_engine_rank_backend(const struct bt_engine *e, int rank) {
    BT_ASSERT(rank >= 0 && rank < e->P);
    return e->backends ? e->backends[rank] : "";
}
void bt_engine_range(const struct bt_engine *e, int rank, int *il0, int *il1) {
    BT_ASSERT(rank >= 0 && rank < e->P);
    *il0 = e->il0s[rank];
    *il1 = e->il1s[rank];
}

/* ---- rank 0 ------------------------------------------------------------------------------ */

static struct slot *q_at(struct bt_engine *e, int i) { return &e->q[(e->q_head + i) % e->q_cap]; }

/* The logits of slot s from the runtime into the slot (waits for them). */
static enum bt_status fetch(struct bt_engine *e, struct slot *s) {
    if (s->fetched) return BT_OK;
    const size_t want = (size_t)(s->n_out * s->width) * sizeof(float);
    if (want > s->cap) {
        float *b = realloc(s->logits, want);
        if (!b) return e->fatal = efail(e, BT_ERR_NOMEM, "rank 0: out of memory (%zu bytes of logits)", want);
        s->logits = b;
        s->cap = want;
    }
    const double t0 = bt_now_s();
    const enum bt_status st = bt_model_dist_logits(e->md, s->k, s->logits);
    e->stats.wait_s += bt_now_s() - t0;
    if (st != BT_OK) return e->fatal = efail(e, st, "rank 0: %s", bt_model_dist_error(e->md));
    e->stats.bytes_received += want;
    s->fetched = true;
    return BT_OK;
}

static enum bt_status check_usable(struct bt_engine *e) {
    if (e->t->rank != 0) return efail(e, BT_ERR_INVALID, "rank %d: only rank 0 drives the engine", e->t->rank);
    if (e->fatal != BT_OK) return e->fatal;
    if (e->stopped) return efail(e, BT_ERR_INVALID, "the engine is stopped");
    return BT_OK;
}

/* The ubatch in the runtime's form (rows into e->rows). */
static struct bt_model_dist_ubatch to_ubatch(struct bt_engine *e, const struct bt_llm_batch *ub) {
    int64_t n_out = 0;
    for (int64_t i = 0; i < ub->n_tokens; i++)
        if (ub->logits ? ub->logits[i] != 0 : i == ub->n_tokens - 1) e->rows[n_out++] = (int32_t)i;
    return (struct bt_model_dist_ubatch){ub->n_tokens, ub->token, ub->pos, ub->seq, n_out, e->rows, ub->out_kind};
}

enum bt_status bt_engine_submit(struct bt_engine *e, const struct bt_llm_batch *ub, uint64_t *id) {
    enum bt_status st = check_usable(e);
    if (st != BT_OK) return st;
    const int64_t T = ub->n_tokens;
    if (T < 1 || T > e->p.n_ubatch)
        return efail(e, BT_ERR_INVALID, "ubatch of %lld tokens: out of [1, n_ubatch %lld]", (long long)T,
                     (long long)e->p.n_ubatch);
    if (!ub->token || !ub->pos || !ub->seq) return efail(e, BT_ERR_INVALID, "ubatch without token ids, positions or sequences");
    for (int64_t i = 0; i < T; i++)
        if (ub->token[i] < 0 || ub->token[i] >= e->hp.n_vocab)
            return efail(e, BT_ERR_INVALID, "token %lld: id %d out of the vocabulary [0, %lld)", (long long)i,
                         ub->token[i], (long long)e->hp.n_vocab);
    /* the runtime keeps the logits of its last max_inflight micro-batches:
     * the oldest not taken yet comes into its slot before this one could
     * take its place (the pipeline's depth) */
    const int64_t k = bt_model_dist_n_submitted(e->md);
    for (int i = 0; i < e->q_len; i++) {
        struct slot *s = q_at(e, i);
        if (!s->fetched && s->k <= k - e->p.max_inflight && (st = fetch(e, s)) != BT_OK) return st;
    }
    if (e->q_len == e->q_cap) {
        const int cap = 2 * e->q_cap;
        struct slot *nq = calloc((size_t)cap, sizeof *nq);
        if (!nq) return efail(e, BT_ERR_NOMEM, "rank 0: out of memory (%d ubatches waiting)", e->q_len);
        for (int i = 0; i < e->q_len; i++) nq[i] = *q_at(e, i);
        for (int i = e->q_len; i < e->q_cap; i++) free(q_at(e, i)->logits);
        free(e->q);
        e->q = nq;
        e->q_head = 0;
        e->q_cap = cap;
    }
    /* checked and placed here first: the others hear only of a ubatch that fits */
    const struct bt_model_dist_ubatch mb = to_ubatch(e, ub);
    st = bt_model_dist_place(e->md, &mb);
    if (st != BT_OK) return efail(e, st, "%s", bt_model_dist_error(e->md));
    struct out_msg *o = NULL;
    if (e->P > 1) {
        if ((st = out_get(e, body_bytes(T, mb.n_out), &o)) != BT_OK) return e->fatal = st;
        o->head.kind = MSG_UBATCH;
        o->head.n_tokens = (int32_t)T;
        o->head.n_out = (int32_t)mb.n_out;
        o->head.arg = (int32_t)mb.out_kind;
        o->head.id = e->next_id;
        int32_t *b = o->body;
        memcpy(b, ub->token, (size_t)T * sizeof(int32_t));
        memcpy(b + T, ub->pos, (size_t)T * sizeof(int32_t));
        memcpy(b + 2 * T, ub->seq, (size_t)T * sizeof(int32_t));
        memcpy(b + 3 * T, mb.rows, (size_t)mb.n_out * sizeof(int32_t));
        if ((st = out_send(e, o)) != BT_OK) return e->fatal = st;
    }
    st = bt_model_dist_run(e->md, &mb); /* collective; a new shape's plan is agreed on */
    if (st != BT_OK) return e->fatal = efail(e, st, "%s", bt_model_dist_error(e->md));
    e->stats.ubatches++;
    e->stats.tokens += (uint64_t)T;
    struct slot *s = q_at(e, e->q_len);
    s->id = e->next_id;
    s->k = k;
    s->n_out = mb.n_out;
    s->width = mb.out_kind == BT_LLM_OUT_EMBD ? e->hp.n_embd : e->hp.n_vocab;
    s->fetched = mb.n_out == 0;
    e->q_len++;
    if (id) *id = e->next_id;
    e->next_id++;
    poll_stats(e, false);
    return BT_OK;
}

int bt_engine_n_inflight(const struct bt_engine *e) { return e->q_len; }

enum bt_status bt_engine_collect(struct bt_engine *e, uint64_t *id, float *logits, int64_t *n_out) {
    if (e->t->rank != 0) return efail(e, BT_ERR_INVALID, "rank %d: only rank 0 drives the engine", e->t->rank);
    if (e->fatal != BT_OK) return e->fatal;
    if (e->q_len == 0) return efail(e, BT_ERR_INVALID, "collect: no ubatch in flight");
    struct slot *s = q_at(e, 0);
    const enum bt_status st = fetch(e, s);
    if (st != BT_OK) return st;
    if (id) *id = s->id;
    if (n_out) *n_out = s->n_out;
    if (logits && s->n_out > 0) memcpy(logits, s->logits, (size_t)(s->n_out * s->width) * sizeof(float));
    e->q_head = (e->q_head + 1) % e->q_cap;
    e->q_len--;
    poll_stats(e, false);
    return BT_OK;
}

enum bt_status bt_engine_seq_rm(struct bt_engine *e, int32_t seq) { return bt_engine_seq_trim(e, seq, 0); }

enum bt_status bt_engine_seq_trim(struct bt_engine *e, int32_t seq, int32_t p0) {
    enum bt_status st = check_usable(e);
    if (st != BT_OK) return st;
    if (seq < 0 || seq >= e->p.n_seq_max)
        return efail(e, BT_ERR_INVALID, "seq_rm: sequence id %d out of [0, %d)", seq, e->p.n_seq_max);
    if (p0 < 0) return efail(e, BT_ERR_INVALID, "seq_rm: sequence %d from position %d: negative", seq, p0);
    bt_model_dist_seq_trim(e->md, seq, p0);
    if (e->P > 1 && (st = send_control(e, MSG_SEQ_RM, seq, p0, 0, NULL, BT_OK)) != BT_OK) e->fatal = st;
    return st;
}

bool bt_engine_seq_reusable(const struct bt_engine *e, int32_t seq, int32_t n) {
    return e->md && seq >= 0 && seq < e->p.n_seq_max && bt_model_dist_seq_reusable(e->md, seq, n);
}

enum bt_status bt_engine_seq_cp(struct bt_engine *e, int32_t src, int32_t dst, int32_t n) {
    enum bt_status st = check_usable(e);
    if (st != BT_OK) return st;
    const int64_t per = e->p.n_ctx / e->p.n_seq_max;
    if (src < 0 || dst < 0 || src >= e->p.n_seq_max || dst >= e->p.n_seq_max || src == dst || n < 1 || n > per)
        return efail(e, BT_ERR_INVALID, "seq_cp: sequence %d into %d, %d positions: ids out of [0, %d) or "
                     "positions out of [1, %lld]", src, dst, n, e->p.n_seq_max, (long long)per);
    if (bt_model_dist_seq_pos_max(e->md, dst) >= 0 || !bt_model_dist_seq_reusable(e->md, src, n))
        return efail(e, BT_ERR_INVALID, "seq_cp: sequence %d into %d: %d holds cells or %d lacks positions 0 to %d",
                     src, dst, dst, src, n - 1);
    /* checked here as every rank will find it: the others copy on the message, in its order */
    if (e->P > 1 && (st = send_control(e, MSG_SEQ_CP, src, dst, n, NULL, BT_OK)) != BT_OK) return e->fatal = st;
    st = bt_model_dist_seq_cp(e->md, src, dst, n);
    if (st != BT_OK) return e->fatal = efail(e, st, "rank 0: %s", bt_model_dist_error(e->md));
    return BT_OK;
}

int32_t bt_engine_seq_pos_max(const struct bt_engine *e, int32_t seq) {
    if (!e->md || seq < 0 || seq >= e->p.n_seq_max) return -1;
    return bt_model_dist_seq_pos_max(e->md, seq);
}

enum bt_status bt_engine_stop(struct bt_engine *e) {
    if (e->t->rank != 0) return efail(e, BT_ERR_INVALID, "rank %d: only rank 0 stops the engine", e->t->rank);
    if (e->stopped) return e->fatal;
    e->stopped = true;
    e->q_len = 0; /* the answers in flight are dropped; the runtime finishes them below */
    /* every rank learns of a failure */
    const char *why = e->fatal != BT_OK ? e->err : NULL;
    enum bt_status st = e->P > 1 ? send_control(e, MSG_STOP, 0, 0, 0, why, e->fatal) : BT_OK;
    if (st == BT_OK && e->md) {
        st = bt_model_dist_synchronize(e->md); /* collective: the others do it on the stop */
        if (st != BT_OK) efail(e, st, "rank 0: %s", bt_model_dist_error(e->md));
    }
    poll_stats(e, true); /* every rank says its last */
    const enum bt_status st2 = drain_sends(e);
    if (e->fatal != BT_OK) return e->fatal;
    return st != BT_OK ? st : st2;
}

/* ---- ranks 1 .. P-1 ------------------------------------------------------------------ */

/* Every message rank 0 sends, in its order, until the stop.  A ubatch's
 * failure in the runtime's calls is every rank's (a new shape's plan is
 * agreed on), so rank 0 fails it too and stops the engine; this rank then
 * drops what still comes.  A failure this rank would have alone (a message
 * it cannot use, a placement rank 0's did not have) would leave the ranks
 * out of step in collective calls: it ends the job, as a failure in the
 * middle of the runtime's pipeline does. */
enum bt_status bt_engine_serve(struct bt_engine *e) {
    bt_transport *t = e->t;
    if (t->rank == 0) return efail(e, BT_ERR_INVALID, "rank 0 drives the engine; the other ranks serve");
    enum bt_status failed = BT_OK; /* a failure every rank had (agreed), or rank 0's */
    struct msg_head head;
    int32_t *body = e->in; /* sized at open: nothing allocated here, which only this rank could fail */
    bt_treq rh;
    memset(&rh, 0, sizeof rh);
    for (;;) {
        const double t0 = bt_now_s();
        if (bt_transport_irecv(t, &head, sizeof head, 0, TAG_HEAD, &rh) != BT_OK ||
            bt_transport_wait_polite(t, &rh) != BT_OK) {
            /* the transport is broken: nothing more can come or go */
            failed = efail(e, BT_ERR_COMM, "rank %d: receiving from rank 0: %s", t->rank, t->error);
            break;
        }
        e->stats.wait_s += bt_now_s() - t0;
        e->stats.bytes_received += sizeof head;
        head.text[MSG_TEXT - 1] = '\0';
        if (head.kind == MSG_STOP) {
            /* a failure rank 0 learned of ends this rank with its message too */
            if (head.text[0] && failed == BT_OK) failed = efail(e, wire_status(head.status), "%s", head.text);
            const enum bt_status st = bt_model_dist_synchronize(e->md); /* collective, with rank 0's stop */
            if (st != BT_OK && failed == BT_OK) failed = efail(e, st, "rank %d: %s", t->rank, bt_model_dist_error(e->md));
            break;
        }
        if (head.kind == MSG_SEQ_RM) {
            bt_model_dist_seq_trim(e->md, head.arg, head.arg2);
            continue;
        }
        if (head.kind == MSG_SEQ_CP) {
            if (failed != BT_OK) continue;
            const enum bt_status st = bt_model_dist_seq_cp(e->md, head.arg, head.arg2, head.n_tokens);
            if (st != BT_OK) {
                /* rank 0 checked it against the same bookkeeping: a cache out of step, or no memory */
                efail(e, st, "rank %d: copying sequence %d into %d: %s", t->rank, head.arg, head.arg2,
                      bt_model_dist_error(e->md));
                fprintf(stderr, "baton: %s\n", e->err);
                t->iface.abort(t, 1);
            }
            continue;
        }
        const int64_t T = head.n_tokens, n_out = head.n_out;
        if (head.kind != MSG_UBATCH || T < 1 || T > e->p.n_ubatch || n_out < 0 || n_out > T ||
            head.body != body_bytes(T, n_out)) {
            /* not a message rank 0 sends: the ranks cannot go on in step */
            efail(e, BT_ERR_COMM, "rank %d: a message from rank 0 it cannot use (kind %d, %lld tokens, %lld bytes)",
                  t->rank, head.kind, (long long)T, (long long)head.body);
            fprintf(stderr, "baton: %s\n", e->err);
            t->iface.abort(t, 1);
        }
        const double t1 = bt_now_s();
        if (bt_transport_irecv(t, body, head.body, 0, TAG_BODY, &rh) != BT_OK ||
            bt_transport_wait_polite(t, &rh) != BT_OK) {
            failed = efail(e, BT_ERR_COMM, "rank %d: receiving from rank 0: %s", t->rank, t->error);
            break;
        }
        e->stats.wait_s += bt_now_s() - t1;
        e->stats.bytes_received += head.body;
        if (failed != BT_OK) continue; /* the ubatches after an agreed failure were not submitted anywhere */
        const struct bt_model_dist_ubatch mb = {T, body, body + T, body + 2 * T, n_out, body + 3 * T,
                                                (enum bt_llm_out)head.arg};
        enum bt_status st = bt_model_dist_place(e->md, &mb);
        if (st != BT_OK) {
            /* rank 0 placed it: a cache out of step with rank 0's */
            efail(e, st, "rank %d: ubatch %llu: %s", t->rank, (unsigned long long)head.id, bt_model_dist_error(e->md));
            fprintf(stderr, "baton: %s\n", e->err);
            t->iface.abort(t, 1);
        }
        st = bt_model_dist_run(e->md, &mb); /* collective, with rank 0's submit */
        if (st != BT_OK) {
            failed = efail(e, st, "%s", bt_model_dist_error(e->md));
            continue; /* every rank failed it alike: rank 0 stops the engine */
        }
        e->stats.ubatches++;
        e->stats.tokens += (uint64_t)T;
        send_stats(e, false);
    }
    send_stats(e, true);
    const enum bt_status st = drain_sends(e);
    if (failed != BT_OK) return failed;
    return st;
}

/* ---- statistics ----------------------------------------------------------------------- */

void bt_engine_compute_seconds(const struct bt_engine *e, double *compute_s) {
    for (int r = 0; r < e->P; r++) compute_s[r] = 0.0;
    if (e->t->rank != 0) return;
    poll_stats((struct bt_engine *)e, false);
    for (int r = 1; r < e->P; r++) compute_s[r] = e->rank_compute_s[r];
    compute_s[0] = e->md ? bt_model_dist_local_stats(e->md).compute_s : 0.0; /* rank 0's own, now */
}

void bt_engine_stats(const struct bt_engine *e, struct bt_engine_stats *s) {
    *s = e->stats;
    if (e->md) {
        const struct bt_dist_stats d = bt_model_dist_local_stats(e->md);
        s->compute_s = d.compute_s;
        s->wait_s += d.wait_s;
        s->bytes_sent += (uint64_t)d.bytes_sent;
        s->bytes_received += (uint64_t)d.bytes_recv;
        s->bytes_direct = (uint64_t)d.bytes_direct;
        s->compute_bytes = (size_t)d.compute_bytes;
        s->buffer_bytes = (size_t)d.slot_bytes;
        s->expert_s = d.expert_s;
        s->expert_bytes_read = (uint64_t)d.expert_bytes_read;
        s->bytes_group = (uint64_t)d.bytes_group;
        s->expert_pairs = (uint64_t)d.expert_pairs;
    }
    for (int i = 0; e->outs && i < e->n_outs; i++) s->buffer_bytes += e->outs[i].cap;
    for (int i = 0; e->q && i < e->q_cap; i++) s->buffer_bytes += e->q[i].cap;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) s->peak_rss = (size_t)ru.ru_maxrss * 1024;
}

enum bt_status bt_engine_gather_stats(struct bt_engine *e, struct bt_engine_stats *all) {
    struct bt_engine_stats mine;
    bt_engine_stats(e, &mine);
    struct bt_engine_stats *buf = e->t->rank == 0 ? all : NULL;
    if (e->t->iface.gather(e->t, &mine, sizeof mine, buf, 0) != BT_OK)
        return efail(e, BT_ERR_COMM, "rank %d: %s", e->t->rank, e->t->error);
    return BT_OK;
}
