/* engine.c - a GGUF model over the ranks of a job (see engine.h): the
 * collective open (the same file everywhere, placement of the layers, each
 * rank's range, cache and stage), rank 0's driver (submit, collect, remove
 * sequences, stop) and the other ranks' stage loop.
 *
 * The stages are the ranks that hold layers, in rank order (a rank that gets
 * no layer only waits for the stop).  Messages go one way along the chain:
 * rank 0 -> stage 0 -> stage 1 -> ... -> last stage -> rank 0 (logits); rank
 * 0 is itself stage 0 when it holds layers.  Each message is a fixed head
 * (tag HEAD: what it is, the ubatch's id and sizes, or an error's text) and,
 * for a ubatch, a body (tag BODY: token ids, positions, sequences, rows asked
 * for, then x [n_embd, T] or the logits rows).  MPI keeps the messages of one
 * sender, receiver and tag in order, and every stage handles them in that
 * order, so every rank's cache sees the same placements and removals.
 *
 * Rank 0 places a ubatch and computes its own stage inside submit, sends x
 * on and returns: while the later stages work on it, the next submit computes
 * the next ubatch.  Up to max_inflight ubatches are in the chain; logits that
 * came back wait in their slot until collected.
 */
#include "engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cpu.h"
#include "place.h"

enum { TAG_HEAD = 7001, TAG_BODY = 7002 };
enum { MSG_UBATCH = 1, MSG_SEQ_RM = 2, MSG_STOP = 3, MSG_ERROR = 4 };

#define MSG_TEXT 400

/* The head of every message. */
struct msg_head {
    int32_t kind;
    int32_t n_tokens, n_out;
    int32_t arg;   /* MSG_SEQ_RM: the sequence; MSG_ERROR: the failed rank */
    int32_t status, pad_; /* MSG_ERROR, MSG_STOP with a text: the failure's bt_status */
    uint64_t id;   /* MSG_UBATCH: the ubatch's number */
    uint64_t body; /* bytes of the body that follows (MSG_UBATCH) */
    char text[MSG_TEXT]; /* MSG_ERROR */
};

/* A failure's status as a message gives it: one of bt_status's errors, else
 * (a broken message) BT_ERR_COMM. */
static enum bt_status wire_status(int32_t s) {
    return s <= BT_ERR_INVALID && s >= BT_ERR_MISMATCH ? (enum bt_status)s : BT_ERR_COMM;
}

/* A message being sent: head and body stay alive until both are done. */
struct out_msg {
    struct msg_head head;
    void *body;
    size_t cap;
    bt_treq rh, rb;
};

/* A ubatch rank 0 submitted and nobody collected yet. */
struct slot {
    uint64_t id;
    int64_t n_out;
    bool done, body_posted;
    struct msg_head head; /* the last stage's answer */
    void *body;           /* out_ids [n_out] then logits [n_vocab, n_out] */
    size_t cap;
    bt_treq rh, rb;
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
    int *stages, n_stages, my_stage;
    struct bt_llm *m;
    struct bt_kv *kv; /* rank 0 without layers: bookkeeping only */
    struct bt_llm_stage *stage;
    /* scratch: one ubatch's cells; a stage writes its output (x [n_embd, T],
     * or on the last stage the logits of the rows asked for) straight into
     * the message that carries it on, so no rank holds a ubatch-wide buffer
     * of the vocabulary's width */
    int32_t *cells;
    /* ranks 1..P-1 with layers: a ubatch's body as it comes in, sized at
     * open for the largest (serve never allocates for what it receives, so
     * it never leaves a message it could not take on the wire) */
    void *in;
    size_t in_cap;
    /* sends, a ring */
    struct out_msg *outs;
    int n_outs, next_out;
    /* rank 0: the queue of ubatches not yet collected */
    struct slot **q; /* a ring of slots, each allocated once (receives point into them) */
    int q_cap, q_head, q_len;
    int n_pending; /* of the queue, not done yet */
    uint64_t next_id;
    bool stopped;
    enum bt_status fatal;
    char err[1024];
    struct bt_engine_stats stats;
    double *stage_compute_s; /* rank 0: each stage's compute seconds, as its last answer said */
    uint64_t computing; /* the ubatch this rank's stage computes now, or last did */
    /* x between two consecutive stages that both have a device transport
     * (NCCL between CUDA ranks) goes over it, from the sender's stage memory
     * into the receiver's; the message then carries no floats */
    bt_transport *dt;     /* this rank's device transport, or NULL */
    uint8_t *has_dt;      /* [P]: the ranks that have one */
    bool direct_in, direct_out;
    bt_treq dsend;        /* the last x sent over it */
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
    if (e->stage) bt_llm_stage_set_eval_callback(e->stage, cb, user);
}

uint64_t bt_engine_computing(const struct bt_engine *e) { return e->computing; }

bool bt_engine_has_device_transport(const struct bt_engine *e, int rank) {
    return e->has_dt && rank >= 0 && rank < e->P && e->has_dt[rank];
}

void bt_engine_default_params(struct bt_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->n_ctx = 4096;
    p->n_seq_max = 1;
    p->n_ubatch = 512;
    p->kv_type = BT_TYPE_F16;
    p->max_inflight = 0;
}

/* ---- messages --------------------------------------------------------------------- */

/* Body layout of a ubatch: token, pos, seq [T], out_ids [n_out], then the
 * floats (x or logits), 8-byte aligned, then one double per stage: the
 * seconds each stage the ubatch went through had spent in graph compute when
 * it sent it on (0 for the stages still ahead), so that rank 0 learns every
 * stage's busy time from the answers, with no extra message. */
static size_t body_ints(int64_t T, int64_t n_out) { return ((size_t)(3 * T + n_out) + 1) / 2 * 2; }
static size_t busy_offset(int64_t T, int64_t n_out, int64_t n_floats) {
    return (body_ints(T, n_out) * sizeof(int32_t) + (size_t)n_floats * sizeof(float) + 7) / 8 * 8;
}
static size_t body_bytes(const struct bt_engine *e, int64_t T, int64_t n_out, int64_t n_floats) {
    return busy_offset(T, n_out, n_floats) + (size_t)e->n_stages * sizeof(double);
}
static double *body_busy(void *body, int64_t T, int64_t n_out, int64_t n_floats) {
    return (double *)((char *)body + busy_offset(T, n_out, n_floats));
}

/* A free entry of the send ring in *out (waits for its last sends), with
 * room for a body of that many bytes: BT_OK, else BT_ERR_COMM or
 * BT_ERR_NOMEM with the message in e->err. */
static enum bt_status out_get(struct bt_engine *e, size_t body, struct out_msg **out) {
    struct out_msg *o = &e->outs[e->next_out];
    e->next_out = (e->next_out + 1) % e->n_outs;
    *out = NULL;
    if (bt_transport_wait_polite(e->t, &o->rh) != BT_OK || bt_transport_wait_polite(e->t, &o->rb) != BT_OK)
        return efail(e, BT_ERR_COMM, "rank %d: %s", e->t->rank, e->t->error);
    if (body > o->cap) {
        void *b = realloc(o->body, body);
        if (!b) return efail(e, BT_ERR_NOMEM, "rank %d: out of memory (a message of %zu bytes)", e->t->rank, body);
        o->body = b;
        o->cap = body;
    }
    memset(&o->head, 0, sizeof o->head);
    o->head.body = body;
    *out = o;
    return BT_OK;
}

static enum bt_status out_send(struct bt_engine *e, struct out_msg *o, int peer) {
    enum bt_status st = bt_transport_isend(e->t, &o->head, sizeof o->head, peer, TAG_HEAD, &o->rh);
    if (st == BT_OK && o->head.body > 0) st = bt_transport_isend(e->t, o->body, o->head.body, peer, TAG_BODY, &o->rb);
    if (st != BT_OK) return efail(e, BT_ERR_COMM, "rank %d: sending to rank %d: %s", e->t->rank, peer, e->t->error);
    e->stats.bytes_sent += sizeof o->head + o->head.body;
    return BT_OK;
}

static enum bt_status drain_sends(struct bt_engine *e) {
    for (int i = 0; i < e->n_outs; i++)
        if (bt_transport_wait_polite(e->t, &e->outs[i].rh) != BT_OK ||
            bt_transport_wait_polite(e->t, &e->outs[i].rb) != BT_OK)
            return efail(e, BT_ERR_COMM, "rank %d: %s", e->t->rank, e->t->error);
    if (e->dsend.active && bt_transport_wait(e->dt, &e->dsend) != BT_OK)
        return efail(e, BT_ERR_COMM, "rank %d: %s transport: %s", e->t->rank, e->dt->iface.name(e->dt), e->dt->error);
    return BT_OK;
}

/* A transfer over the device transport that cannot finish cannot be taken
 * back either (NCCL cannot cancel, and its peer waits for it): print why and
 * end every rank, as the distributed runtime does in the middle of its
 * pipeline. */
static void direct_die(struct bt_engine *e) {
    fprintf(stderr, "baton: %s\n", e->err);
    e->t->iface.abort(e->t, 1);
}

/* The rank after this one in the chain (-1: none; rank 0 gets the logits). */
static int next_rank(const struct bt_engine *e, int stage) {
    return stage + 1 < e->n_stages ? e->stages[stage + 1] : -1;
}

/* ---- one ubatch through this rank's stage ------------------------------------------ */

static enum bt_status stage_compute(struct bt_engine *e, uint64_t id, int64_t T, int64_t n_out, const int32_t *ints,
                                    const float *x_in, const double *busy_in, float *logits);

/* Place the tokens, compute, and send x on (or the logits to rank 0).  ints:
 * the body's arrays; x_in: the activations from the previous stage; busy_in:
 * the earlier stages' compute seconds (NULL on rank 0); logits: where rank 0,
 * when it is the only stage, wants the logits [n_vocab, n_out]. */
static enum bt_status stage_step(struct bt_engine *e, uint64_t id, int64_t T, int64_t n_out, const int32_t *ints,
                                 const float *x_in, const double *busy_in, float *logits) {
    const int32_t *pos = ints + T, *seq = ints + 2 * T;
    char msg[512];
    enum bt_status st = bt_kv_place(e->kv, T, seq, pos, e->cells, msg, sizeof msg);
    if (st != BT_OK) /* nothing placed: a bad ubatch on rank 0, a broken message elsewhere */
        return e->t->rank == 0 ? efail(e, st, "%s", msg)
                               : efail(e, st, "rank %d: ubatch %llu: %s", e->t->rank, (unsigned long long)id, msg);
    /* from here on a failure leaves this cache out of step with the others' */
    st = stage_compute(e, id, T, n_out, ints, x_in, busy_in, logits);
    if (st != BT_OK) e->fatal = st;
    return st;
}

static enum bt_status stage_compute(struct bt_engine *e, uint64_t id, int64_t T, int64_t n_out, const int32_t *ints,
                                    const float *x_in, const double *busy_in, float *logits) {
    const int32_t *token = ints, *pos = ints + T, *seq = ints + 2 * T, *out_ids = ints + 3 * T;
    char msg[512];
    enum bt_status st;
    const int nxt = next_rank(e, e->my_stage);
    const bool last = nxt < 0, direct = !last && e->direct_out;
    const int64_t n_floats = last ? n_out * e->hp.n_vocab : direct ? 0 : T * e->hp.n_embd;
    /* x that comes over the device transport lands in the stage's own input */
    if (e->direct_in) {
        struct bt_tensor *xin = NULL;
        bt_treq rq;
        memset(&rq, 0, sizeof rq);
        st = bt_llm_stage_input(e->stage, T, n_out, &xin, msg, sizeof msg);
        if (st != BT_OK) {
            efail(e, st, "rank %d: ubatch %llu: %s", e->t->rank, (unsigned long long)id, msg);
            direct_die(e); /* its sender's x is on its way */
        }
        const double w0 = bt_now_s();
        if (bt_transport_irecv(e->dt, xin->data, bt_nbytes(xin), e->stages[e->my_stage - 1], 0, &rq) != BT_OK ||
            bt_transport_wait(e->dt, &rq) != BT_OK) {
            efail(e, BT_ERR_COMM, "rank %d: x of ubatch %llu from rank %d: %s", e->t->rank, (unsigned long long)id,
                  e->stages[e->my_stage - 1], e->dt->error);
            direct_die(e);
        }
        e->stats.wait_s += bt_now_s() - w0;
        e->stats.bytes_received += bt_nbytes(xin);
        x_in = NULL;
    }
    /* the output goes straight into its message (rank 0 alone: the caller's;
     * x over the device transport: nowhere, it stays in the stage) */
    struct out_msg *o = NULL;
    float *out = logits;
    if (!(last && e->t->rank == 0)) {
        if ((st = out_get(e, body_bytes(e, T, n_out, n_floats), &o)) != BT_OK) return st;
        out = direct ? NULL : (float *)((int32_t *)o->body + body_ints(T, n_out));
    }
    /* the last x sent from the stage's memory must be gone before it is rewritten */
    if (direct && e->dsend.active && bt_transport_wait(e->dt, &e->dsend) != BT_OK) {
        efail(e, BT_ERR_COMM, "rank %d: x to rank %d: %s", e->t->rank, nxt, e->dt->error);
        direct_die(e);
    }
    const double t0 = bt_now_s();
    e->computing = id;
    bt_transport_set_busy(e->t, true); /* a progress thread, if any, moves the transfers meanwhile */
    st = bt_llm_stage_run(e->stage, T, token, x_in, pos, seq, e->cells, n_out, out_ids, out, msg, sizeof msg);
    bt_transport_set_busy(e->t, false);
    e->stats.compute_s += bt_now_s() - t0;
    if (st != BT_OK) return efail(e, st, "rank %d: ubatch %llu: %s", e->t->rank, (unsigned long long)id, msg);
    e->stats.ubatches++;
    e->stats.tokens += (uint64_t)T;
    if (!o) return BT_OK;
    double *busy = body_busy(o->body, T, n_out, n_floats);
    for (int k = 0; k < e->n_stages; k++) busy[k] = busy_in ? busy_in[k] : 0.0;
    busy[e->my_stage] = e->stats.compute_s;
    o->head.kind = MSG_UBATCH;
    o->head.n_tokens = (int32_t)T;
    o->head.n_out = (int32_t)n_out;
    o->head.id = id;
    memcpy(o->body, ints, (size_t)(3 * T + n_out) * sizeof(int32_t));
    st = out_send(e, o, last ? 0 : nxt);
    if (st == BT_OK && direct) {
        const struct bt_tensor *x = bt_llm_stage_output(e->stage);
        if (bt_transport_isend(e->dt, x->data, bt_nbytes(x), nxt, 0, &e->dsend) != BT_OK) {
            efail(e, BT_ERR_COMM, "rank %d: x of ubatch %llu to rank %d: %s", e->t->rank, (unsigned long long)id, nxt,
                  e->dt->error);
            direct_die(e);
        }
        e->stats.bytes_sent += bt_nbytes(x);
        e->stats.bytes_direct += bt_nbytes(x);
    }
    return st;
}

/* ---- open ---------------------------------------------------------------------------- */

static void host_name(char *buf, size_t n) {
    if (gethostname(buf, n) != 0) snprintf(buf, n, "?");
    buf[n - 1] = '\0';
}

/* KV bytes one layer's cache takes. */
static double kv_layer_bytes(const struct bt_hparams *h, const struct bt_engine_params *p) {
    return (double)p->n_ctx * (double)(bt_row_size(p->kv_type, h->head_dim * h->n_head_kv) +
                                       bt_row_size(p->kv_type, h->head_dim_v * h->n_head_kv));
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
        if (t->ne[2] > 1 && h->n_expert > 0) el *= (double)h->n_expert_used / (double)h->n_expert; /* experts */
        f += 2.0 * el;
    }
    return f;
}

/* The layer ranges (first[r]..last[r], -1: none).  with_kv: count the
 * cache in each rank's memory. */
static enum bt_status place_layers(struct bt_gguf *g, const struct bt_hparams *h, const struct bt_engine_params *p,
                                   const struct bt_rank_desc *descs, int P, const int *layer_counts, bool with_kv,
                                   int *first, int *last, char *msg, size_t n_msg) {
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
        if (with_kv && l >= 0 && l < L) lc.wbytes[l + 1] += kv_layer_bytes(h, p);
    }
    for (int l = 0; st == BT_OK && l <= L; l++) lc.cut_bytes[l] = (double)(h->n_embd * p->n_ubatch) * 4.0;
    struct bt_plan_options opt;
    memset(&opt, 0, sizeof opt);
    opt.layers_per_rank = layer_counts;
    if (st == BT_OK) st = bt_place_layers(&lc, descs, P, &opt, first, last, pred, msg, n_msg);
    /* a fixed partition is not placed by memory: check it */
    for (int r = 0; st == BT_OK && r < P; r++) {
        const int a = first[r] >= 0 ? first[r] : 0, b = first[r] >= 0 ? last[r] + 1 : 0;
        double by = 0;
        for (int l = a; l < b; l++) by += lc.wbytes[l + 1];
        if (r == 0) by += lc.wbytes[0];
        if (r == P - 1) by += lc.wbytes[L + 1];
        if (by > (double)descs[r].mem_bytes) {
            snprintf(msg, n_msg, "rank %d (%s) gets layers [%d, %d), %.1f MiB, more than its %.1f MiB of memory", r,
                     descs[r].backend, a, b, by / 1048576.0, (double)descs[r].mem_bytes / 1048576.0);
            st = BT_ERR_NOMEM;
        }
    }
    free(lc.flops);
    free(lc.wbytes);
    free(lc.cut_bytes);
    free(pred);
    return st;
}

enum bt_status bt_engine_place(struct bt_gguf *g, const struct bt_hparams *h, const struct bt_engine_params *p,
                               const struct bt_rank_desc *descs, int P, const int *layer_counts, int32_t *ranges,
                               char *msg, size_t n_msg) {
    int *first = calloc((size_t)P, sizeof(int)), *last = calloc((size_t)P, sizeof(int));
    const char *path = bt_gguf_path(g);
    char perr[512];
    enum bt_status st = BT_OK;
    if (!first || !last) st = BT_ERR_NOMEM, msgf(msg, n_msg, "rank 0: out of memory");
    if (st == BT_OK) st = place_layers(g, h, p, descs, P, layer_counts, true, first, last, perr, sizeof perr);
    if (st != BT_OK && st != BT_ERR_NOMEM) {
        msgf(msg, n_msg, "%s: placement: %s", path, perr);
    } else if (st == BT_ERR_NOMEM && first && last) {
        /* the weights alone would fit: the cache is what does not */
        char perr2[512];
        if (place_layers(g, h, p, descs, P, layer_counts, false, first, last, perr2, sizeof perr2) == BT_OK)
            msgf(msg, n_msg,
                 "%s: a context of %lld cells needs %.1f MiB of KV cache (%s) beside the weights, more than the "
                 "ranks' memory holds: %s",
                 path, (long long)p->n_ctx, kv_layer_bytes(h, p) * h->n_layer / 1048576.0, bt_type_name(p->kv_type),
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
        e->my_stage = -1;
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
            kc.head_dim_k = e->hp.head_dim;
            kc.head_dim_v = e->hp.head_dim_v;
            kc.n_embd_k = e->hp.head_dim * e->hp.n_head_kv;
            kc.n_embd_v = e->hp.head_dim_v * e->hp.n_head_kv;
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
        /* a CPU rank names its kernels' variant (cpu.h): ranks on different CPUs give the same bits */
        if (bt_backend_is_cpu(r->backend))
            msgf(d.backend, sizeof d.backend, "%s(%s)@%s", bt_backend_name(r->backend), bt_cpu_variant_name(), host);
        else
            msgf(d.backend, sizeof d.backend, "%s@%s", bt_backend_name(r->backend), host);
        d.mem_bytes = bt_backend_plan_memory(r->backend, r->dist.mem_limit, t->local_size, NULL);
        d.gflops = r->layer_counts ? 1.0 : bt_backend_measure_gflops(r->backend);
        descs = t->rank == 0 ? calloc((size_t)P, sizeof *descs) : NULL;
        ranges = calloc((size_t)(2 * P), sizeof(int32_t));
        e->il0s = calloc((size_t)P, sizeof(int));
        e->il1s = calloc((size_t)P, sizeof(int));
        e->stages = calloc((size_t)P, sizeof(int));
        if ((t->rank == 0 && !descs) || !ranges || !e->il0s || !e->il1s || !e->stages)
            st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        AGREE(); /* before the gather: a rank that failed does not take part */
        if (t->iface.gather(t, &d, sizeof d, descs, 0) != BT_OK)
            st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
        if (st == BT_OK && t->rank == 0)
            st = bt_engine_place(e->g, &e->hp, &e->p, descs, P, r->layer_counts, ranges, msg, sizeof msg);
        free(descs);
        descs = NULL;
        AGREE();
        if (t->iface.bcast(t, ranges, sizeof(int32_t) * (size_t)(2 * P), 0) != BT_OK)
            st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
        for (int i = 0; st == BT_OK && i < P; i++) {
            e->il0s[i] = ranges[2 * i];
            e->il1s[i] = ranges[2 * i + 1];
            if (e->il1s[i] > e->il0s[i]) {
                if (i == t->rank) e->my_stage = e->n_stages;
                e->stages[e->n_stages++] = i;
            }
        }
        free(ranges);
        ranges = NULL;
        AGREE();
    }

    /* 4. this rank's layers, cache and stage */
    {
        const int il0 = e->il0s[t->rank], il1 = e->il1s[t->rank];
        char lerr[900];
        if (il1 > il0) {
            bt_buffer_type_t buft = bt_backend_get_default_buffer_type(r->backend);
            /* repacked for the CPU's matmul where the CPU computes (the rank's
             * one backend), the same results */
            st = bt_llm_load_gguf(e->g, il0, il1, buft, q->mmap, bt_backend_is_cpu(r->backend), &e->m, lerr,
                                  sizeof lerr);
            if (st != BT_OK) msgf(msg, sizeof msg, "rank %d (host %s): %s", t->rank, host, lerr);
        }
        struct bt_kv_config kc;
        memset(&kc, 0, sizeof kc);
        kc.n_ctx = q->n_ctx;
        kc.n_seq_max = q->n_seq_max;
        kc.type = q->kv_type;
        kc.il0 = il0;
        kc.il1 = il1;
        kc.head_dim_k = e->hp.head_dim;
        kc.head_dim_v = e->hp.head_dim_v;
        kc.n_embd_k = e->hp.head_dim * e->hp.n_head_kv;
        kc.n_embd_v = e->hp.head_dim_v * e->hp.n_head_kv;
        kc.buft = il1 > il0 ? bt_backend_get_default_buffer_type(r->backend) : NULL;
        if (st == BT_OK && (il1 > il0 || t->rank == 0)) {
            st = bt_kv_new(&kc, &e->kv, lerr, sizeof lerr);
            if (st != BT_OK) msgf(msg, sizeof msg, "rank %d (host %s): %s", t->rank, host, lerr);
        }
        if (st == BT_OK && il1 > il0) {
            st = bt_llm_stage_new(e->m, e->kv, r->backend, q->n_ubatch, &e->stage, lerr, sizeof lerr);
            if (st != BT_OK) msgf(msg, sizeof msg, "rank %d (host %s): %s", t->rank, host, lerr);
        }
        /* the value in use, which bt_engine_params reports */
        e->p.max_inflight = q->max_inflight > 0 ? q->max_inflight : e->n_stages * (r->copies > 0 ? r->copies : 1);
        if (e->p.max_inflight < 1) e->p.max_inflight = 1;
        e->n_outs = e->p.max_inflight + 2;
        e->stage_compute_s = calloc((size_t)(e->n_stages > 0 ? e->n_stages : 1), sizeof(double));
        e->cells = malloc((size_t)q->n_ubatch * sizeof *e->cells);
        e->outs = calloc((size_t)e->n_outs, sizeof *e->outs);
        if (t->rank != 0 && il1 > il0) {
            e->in_cap = body_bytes(e, q->n_ubatch, q->n_ubatch, e->my_stage == 0 ? 0 : q->n_ubatch * e->hp.n_embd);
            e->in = malloc(e->in_cap);
        }
        if (st == BT_OK && (!e->cells || !e->outs || !e->stage_compute_s || (e->in_cap && !e->in)))
            st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        if (e->m) e->stats.weight_bytes = bt_llm_weight_bytes(e->m);
        if (e->m) e->stats.mapped_bytes = bt_llm_mapped_bytes(e->m);
        if (e->m) e->stats.repacked_bytes = bt_llm_repacked_bytes(e->m);
        if (e->kv) e->stats.kv_bytes = bt_kv_bytes(e->kv);
    }
    AGREE();

    /* 5. the device transport's edges: x between consecutive stages that
     * both have one (and that the topology's nccl edges allow) */
    {
        const int P = e->P;
        int64_t *has = calloc((size_t)P, sizeof *has);
        int *esrc = calloc((size_t)P + 1, sizeof *esrc), *edst = calloc((size_t)P + 1, sizeof *edst);
        int n_edges = 0;
        if (!has || !esrc || !edst) st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        else has[t->rank] = r->device_t != NULL;
        /* agreed on here, not with AGREE: these three are freed below on every path */
        if (st == BT_OK) msg[0] = '\0';
        st = bt_rank_agree(t, st, NULL, msg, sizeof msg);
        if (st == BT_OK && t->iface.allreduce_max(t, has, P) != BT_OK)
            st = BT_ERR_COMM, msgf(msg, sizeof msg, "rank %d: %s", t->rank, t->error);
        if (st == BT_OK && !(e->has_dt = calloc((size_t)P, 1)))
            st = BT_ERR_NOMEM, msgf(msg, sizeof msg, "rank %d: out of memory", t->rank);
        for (int k = 0; st == BT_OK && k < P; k++) e->has_dt[k] = has[k] != 0;
        for (int s = 0; st == BT_OK && s + 1 < e->n_stages; s++) {
            const int a = e->stages[s], b = e->stages[s + 1];
            if (!has[a] || !has[b] || (r->device_edges && !r->device_edges[(size_t)a * (size_t)P + (size_t)b])) continue;
            esrc[n_edges] = a;
            edst[n_edges++] = b;
            if (a == t->rank) e->direct_out = true;
            if (b == t->rank) e->direct_in = true;
        }
        if (st == BT_OK && r->device_t && n_edges > 0) {
            e->dt = r->device_t;
            if (bt_transport_connect(e->dt, esrc, edst, n_edges) != BT_OK)
                st = BT_ERR_COMM,
                msgf(msg, sizeof msg, "rank %d: %s transport: %s", t->rank, e->dt->iface.name(e->dt), e->dt->error);
        }
        free(has);
        free(esrc);
        free(edst);
        AGREE();
    }
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
    for (int i = 0; e->outs && i < e->n_outs; i++) {
        if (e->outs[i].rh.active && e->t->iface.cancel) e->t->iface.cancel(e->t, &e->outs[i].rh);
        if (e->outs[i].rb.active && e->t->iface.cancel) e->t->iface.cancel(e->t, &e->outs[i].rb);
        free(e->outs[i].body);
    }
    for (int i = 0; i < e->q_cap; i++) {
        struct slot *s = e->q[i];
        if (!s) continue;
        if (s->rh.active && e->t->iface.cancel) e->t->iface.cancel(e->t, &s->rh);
        if (s->rb.active && e->t->iface.cancel) e->t->iface.cancel(e->t, &s->rb);
        free(s->body);
        free(s);
    }
    free(e->q);
    free(e->outs);
    bt_llm_stage_free(e->stage);
    bt_kv_free(e->kv);
    bt_llm_free(e->m);
    bt_gguf_close(e->g);
    free(e->cells);
    free(e->in);
    free(e->il0s);
    free(e->il1s);
    free(e->stages);
    free(e->stage_compute_s);
    free(e->has_dt);
    free(e);
}

const char *bt_engine_error(const struct bt_engine *e) { return e->err; }
const struct bt_hparams *bt_engine_hparams(const struct bt_engine *e) { return &e->hp; }
const struct bt_arch *bt_engine_arch(const struct bt_engine *e) { return e->arch; }
const struct bt_engine_params *bt_engine_params(const struct bt_engine *e) { return &e->p; }
struct bt_gguf *bt_engine_gguf(const struct bt_engine *e) { return e->g; }
int bt_engine_n_ranks(const struct bt_engine *e) { return e->P; }
void bt_engine_range(const struct bt_engine *e, int rank, int *il0, int *il1) {
    BT_ASSERT(rank >= 0 && rank < e->P);
    *il0 = e->il0s[rank];
    *il1 = e->il1s[rank];
}

/* ---- rank 0 ------------------------------------------------------------------------------ */

static struct slot *q_at(struct bt_engine *e, int i) { return e->q[(e->q_head + i) % e->q_cap]; }

static enum bt_status q_push(struct bt_engine *e, struct slot **out) {
    if (e->q_len == e->q_cap) {
        const int cap = e->q_cap ? 2 * e->q_cap : 8;
        struct slot **nq = calloc((size_t)cap, sizeof *nq);
        if (!nq) return efail(e, BT_ERR_NOMEM, "rank 0: out of memory (%d ubatches waiting)", e->q_len);
        for (int i = 0; i < e->q_cap; i++) nq[i] = e->q[(e->q_head + i) % e->q_cap];
        free(e->q);
        e->q = nq;
        e->q_head = 0;
        e->q_cap = cap;
    }
    const int k = (e->q_head + e->q_len) % e->q_cap;
    if (!e->q[k] && !(e->q[k] = calloc(1, sizeof **e->q)))
        return efail(e, BT_ERR_NOMEM, "rank 0: out of memory (%d ubatches waiting)", e->q_len);
    struct slot *s = e->q[k];
    void *body = s->body;
    const size_t cap = s->cap;
    memset(s, 0, sizeof *s);
    s->body = body;
    s->cap = cap;
    e->q_len++;
    *out = s;
    return BT_OK;
}

/* Drive slot s: true once its answer is here (or the engine failed). */
static bool slot_poll(struct bt_engine *e, struct slot *s) {
    if (s->done || e->fatal != BT_OK) return true;
    bool done = false;
    if (!s->body_posted) {
        if (bt_transport_test(e->t, &s->rh, &done) != BT_OK) {
            e->fatal = efail(e, BT_ERR_COMM, "rank 0: receiving from rank %d: %s", e->stages[e->n_stages - 1],
                             e->t->error);
            return true;
        }
        if (!done) return false;
        e->stats.bytes_received += sizeof s->head;
        s->head.text[MSG_TEXT - 1] = '\0';
        if (s->head.kind == MSG_ERROR) {
            e->fatal = efail(e, wire_status(s->head.status), "%s", s->head.text);
            return true;
        }
        const size_t want = body_bytes(e, s->head.n_tokens, s->n_out, s->n_out * e->hp.n_vocab);
        if (s->head.kind != MSG_UBATCH || s->head.id != s->id || s->head.n_out != s->n_out || s->head.body != want) {
            e->fatal = efail(e, BT_ERR_COMM,
                             "rank 0: rank %d answered ubatch %llu with message %d for ubatch %llu (%lld bytes)",
                             e->stages[e->n_stages - 1], (unsigned long long)s->id, s->head.kind,
                             (unsigned long long)s->head.id, (long long)s->head.body);
            return true;
        }
        if (want > s->cap) {
            void *b = realloc(s->body, want);
            if (!b) {
                e->fatal = efail(e, BT_ERR_NOMEM, "rank 0: out of memory (%zu bytes of logits)", want);
                return true;
            }
            s->body = b;
            s->cap = want;
        }
        if (bt_transport_irecv(e->t, s->body, want, e->stages[e->n_stages - 1], TAG_BODY, &s->rb) != BT_OK) {
            e->fatal = efail(e, BT_ERR_COMM, "rank 0: %s", e->t->error);
            return true;
        }
        s->body_posted = true;
    }
    if (bt_transport_test(e->t, &s->rb, &done) != BT_OK) {
        e->fatal = efail(e, BT_ERR_COMM, "rank 0: receiving from rank %d: %s", e->stages[e->n_stages - 1], e->t->error);
        return true;
    }
    if (done) {
        e->stats.bytes_received += s->head.body;
        const double *busy = body_busy(s->body, s->head.n_tokens, s->n_out, s->n_out * e->hp.n_vocab);
        for (int k = 0; k < e->n_stages; k++)
            if (busy[k] > e->stage_compute_s[k]) e->stage_compute_s[k] = busy[k];
        s->done = true;
        e->n_pending--;
    }
    return done;
}

/* Wait until slot s is done (or the engine failed). */
static void slot_wait(struct bt_engine *e, struct slot *s) {
    const double t0 = bt_now_s();
    unsigned spins = 0;
    while (!slot_poll(e, s)) {
        if (++spins < 256) {
            sched_yield();
        } else {
            const struct timespec d = {0, 20000};
            nanosleep(&d, NULL);
        }
    }
    e->stats.wait_s += bt_now_s() - t0;
}

static enum bt_status check_usable(struct bt_engine *e) {
    if (e->t->rank != 0) return efail(e, BT_ERR_INVALID, "rank %d: only rank 0 drives the engine", e->t->rank);
    if (e->fatal != BT_OK) return e->fatal;
    if (e->stopped) return efail(e, BT_ERR_INVALID, "the engine is stopped");
    return BT_OK;
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
    /* the pipeline's depth: wait for the oldest ubatch still in the chain */
    while (e->n_pending >= e->p.max_inflight) {
        for (int i = 0; i < e->q_len; i++) {
            struct slot *s = q_at(e, i);
            if (!s->done) {
                slot_wait(e, s);
                break;
            }
        }
        if (e->fatal != BT_OK) return e->fatal;
    }
    /* the message: ids, positions, sequences, rows asked for */
    const int nxt = e->my_stage == 0 ? next_rank(e, 0) : e->stages[0];
    int64_t n_out = 0;
    for (int64_t i = 0; i < T; i++) n_out += ub->logits ? ub->logits[i] != 0 : i == T - 1;
    int32_t *ints = malloc((size_t)(3 * T + n_out) * sizeof(int32_t));
    if (!ints) return efail(e, BT_ERR_NOMEM, "rank 0: out of memory");
    memcpy(ints, ub->token, (size_t)T * sizeof(int32_t));
    memcpy(ints + T, ub->pos, (size_t)T * sizeof(int32_t));
    memcpy(ints + 2 * T, ub->seq, (size_t)T * sizeof(int32_t));
    for (int64_t i = 0, k = 0; i < T; i++)
        if (ub->logits ? ub->logits[i] != 0 : i == T - 1) ints[3 * T + k++] = (int32_t)i;
    struct slot *s = NULL;
    st = q_push(e, &s);
    if (st != BT_OK) {
        free(ints);
        return st;
    }
    const uint64_t my_id = e->next_id;
    s->id = my_id;
    s->n_out = n_out;
    if (e->my_stage == 0) {
        /* one stage: the logits go straight into the slot (room made first:
         * nothing placed yet when there is none) */
        float *logits = NULL;
        if (nxt < 0) {
            const size_t want = body_bytes(e, T, n_out, n_out * e->hp.n_vocab);
            if (want > s->cap) {
                void *b = realloc(s->body, want);
                if (!b) st = efail(e, BT_ERR_NOMEM, "rank 0: out of memory (%zu bytes of logits)", want);
                else s->body = b, s->cap = want;
            }
            if (st == BT_OK) logits = (float *)((int32_t *)s->body + body_ints(T, n_out));
        }
        /* rank 0's own layers first: checks and places the tokens */
        if (st == BT_OK) st = stage_step(e, my_id, T, n_out, ints, NULL, NULL, logits);
        if (st == BT_OK && nxt < 0) {
            s->head.n_tokens = (int32_t)T;
            s->done = true;
        }
    } else {
        /* rank 0 holds no layers: its cache keeps the books, stage 0 computes */
        char msg[512];
        st = bt_kv_place(e->kv, T, ub->seq, ub->pos, e->cells, msg, sizeof msg);
        if (st != BT_OK) efail(e, st, "%s", msg);
        struct out_msg *o = NULL;
        if (st == BT_OK && (st = out_get(e, body_bytes(e, T, n_out, 0), &o)) != BT_OK) e->fatal = st;
        if (st == BT_OK) {
            o->head.kind = MSG_UBATCH;
            o->head.n_tokens = (int32_t)T;
            o->head.n_out = (int32_t)n_out;
            o->head.id = my_id;
            memcpy(o->body, ints, (size_t)(3 * T + n_out) * sizeof(int32_t));
            memset(body_busy(o->body, T, n_out, 0), 0, (size_t)e->n_stages * sizeof(double));
            st = out_send(e, o, nxt);
            if (st != BT_OK) e->fatal = st;
        }
    }
    free(ints);
    if (st == BT_OK && !s->done) {
        e->n_pending++;
        if (bt_transport_irecv(e->t, &s->head, sizeof s->head, e->stages[e->n_stages - 1], TAG_HEAD, &s->rh) != BT_OK)
            st = e->fatal = efail(e, BT_ERR_COMM, "rank 0: %s", e->t->error);
    }
    if (st != BT_OK) {
        e->q_len--; /* the slot was the last one pushed */
        return st;
    }
    e->next_id++;
    if (id) *id = my_id;
    return BT_OK;
}

int bt_engine_n_inflight(const struct bt_engine *e) { return e->q_len; }

enum bt_status bt_engine_collect(struct bt_engine *e, uint64_t *id, float *logits, int64_t *n_out) {
    if (e->t->rank != 0) return efail(e, BT_ERR_INVALID, "rank %d: only rank 0 drives the engine", e->t->rank);
    if (e->fatal != BT_OK) return e->fatal;
    if (e->q_len == 0) return efail(e, BT_ERR_INVALID, "collect: no ubatch in flight");
    struct slot *s = q_at(e, 0);
    slot_wait(e, s);
    if (e->fatal != BT_OK) return e->fatal;
    if (id) *id = s->id;
    if (n_out) *n_out = s->n_out;
    if (logits && s->n_out > 0)
        memcpy(logits, (int32_t *)s->body + body_ints(s->head.n_tokens, s->n_out),
               (size_t)(s->n_out * e->hp.n_vocab) * sizeof(float));
    e->q_head = (e->q_head + 1) % e->q_cap;
    e->q_len--;
    /* the slot keeps its buffer for reuse */
    return BT_OK;
}

/* A head-only message (MSG_SEQ_RM, MSG_STOP) to rank peer; text: a failure
 * the stop carries to every rank, with its status why (NULL: none). */
static enum bt_status send_control(struct bt_engine *e, int peer, int kind, int32_t arg, const char *text,
                                   enum bt_status why) {
    struct out_msg *o;
    const enum bt_status st = out_get(e, 0, &o);
    if (st != BT_OK) return e->fatal = st;
    o->head.kind = kind;
    o->head.arg = arg;
    if (text) {
        msgf(o->head.text, sizeof o->head.text, "%s", text);
        o->head.status = why;
    }
    return out_send(e, o, peer);
}

enum bt_status bt_engine_seq_rm(struct bt_engine *e, int32_t seq) {
    enum bt_status st = check_usable(e);
    if (st != BT_OK) return st;
    if (seq < 0 || seq >= e->p.n_seq_max)
        return efail(e, BT_ERR_INVALID, "seq_rm: sequence id %d out of [0, %d)", seq, e->p.n_seq_max);
    bt_kv_seq_rm(e->kv, seq);
    const int nxt = e->my_stage == 0 ? next_rank(e, 0) : e->stages[0];
    if (nxt >= 0 && (st = send_control(e, nxt, MSG_SEQ_RM, seq, NULL, BT_OK)) != BT_OK) e->fatal = st;
    return st;
}

int32_t bt_engine_seq_pos_max(const struct bt_engine *e, int32_t seq) {
    if (!e->kv || seq < 0 || seq >= e->p.n_seq_max) return -1;
    return bt_kv_seq_pos_max(e->kv, seq);
}

enum bt_status bt_engine_stop(struct bt_engine *e) {
    if (e->t->rank != 0) return efail(e, BT_ERR_INVALID, "rank %d: only rank 0 stops the engine", e->t->rank);
    if (e->stopped) return e->fatal;
    e->stopped = true;
    /* what is in flight comes back first (its answers are dropped) */
    for (int i = 0; i < e->q_len && e->fatal == BT_OK; i++) slot_wait(e, q_at(e, i));
    e->q_len = 0;
    /* then the stop goes down the chain and to every rank without layers */
    enum bt_status st = BT_OK;
    const int nxt = e->my_stage == 0 ? next_rank(e, 0) : e->stages[0];
    const char *why = e->fatal != BT_OK ? e->err : NULL; /* every rank learns of a failure */
    if (nxt >= 0) st = send_control(e, nxt, MSG_STOP, 0, why, e->fatal);
    for (int r = 1; r < e->P && st == BT_OK; r++)
        if (e->il1s[r] <= e->il0s[r]) st = send_control(e, r, MSG_STOP, 0, why, e->fatal);
    const enum bt_status st2 = drain_sends(e);
    if (e->fatal != BT_OK) return e->fatal;
    return st != BT_OK ? st : st2;
}

/* ---- ranks 1 .. P-1 ------------------------------------------------------------------ */

/* This rank's failure (status st, message e->err) down the chain to rank 0,
 * once. */
static void report_failure(struct bt_engine *e, int nxt, enum bt_status st) {
    struct out_msg *o;
    if (out_get(e, 0, &o) != BT_OK) return;
    o->head.kind = MSG_ERROR;
    o->head.arg = e->t->rank;
    o->head.status = st;
    msgf(o->head.text, sizeof o->head.text, "%s", e->err);
    out_send(e, o, nxt >= 0 ? nxt : 0);
}

/* After a failure (this rank's or an earlier stage's) a stage drops the
 * ubatches that still come and waits for the stop, so that rank 0, which
 * learns of the failure through the chain, is never left waiting. */
enum bt_status bt_engine_serve(struct bt_engine *e) {
    bt_transport *t = e->t;
    if (t->rank == 0) return efail(e, BT_ERR_INVALID, "rank 0 drives the engine; the other ranks serve");
    const int prev = e->my_stage < 0 ? 0 : e->my_stage == 0 ? 0 : e->stages[e->my_stage - 1];
    const int nxt = e->my_stage < 0 ? -1 : next_rank(e, e->my_stage);
    enum bt_status failed = BT_OK; /* this rank's or an earlier one's failure */
    struct msg_head head;
    void *body = e->in;
    bt_treq rh;
    memset(&rh, 0, sizeof rh);
    for (;;) {
        const double t0 = bt_now_s();
        if (bt_transport_irecv(t, &head, sizeof head, prev, TAG_HEAD, &rh) != BT_OK ||
            bt_transport_wait_polite(t, &rh) != BT_OK) {
            /* the transport is broken: nothing more can come or go */
            failed = efail(e, BT_ERR_COMM, "rank %d: receiving from rank %d: %s", t->rank, prev, t->error);
            break;
        }
        e->stats.bytes_received += sizeof head;
        head.text[MSG_TEXT - 1] = '\0';
        if (head.kind == MSG_STOP) {
            e->stats.wait_s += bt_now_s() - t0;
            /* a failure rank 0 learned of ends this rank with its message too */
            if (head.text[0] && failed == BT_OK) failed = efail(e, wire_status(head.status), "%s", head.text);
            if (nxt >= 0 &&
                send_control(e, nxt, MSG_STOP, 0, head.text[0] ? head.text : NULL, wire_status(head.status)) != BT_OK &&
                failed == BT_OK)
                failed = BT_ERR_COMM;
            break;
        }
        if (head.kind == MSG_SEQ_RM) {
            if (e->kv) bt_kv_seq_rm(e->kv, head.arg);
            if (nxt >= 0 && send_control(e, nxt, MSG_SEQ_RM, head.arg, NULL, BT_OK) != BT_OK && failed == BT_OK) failed = BT_ERR_COMM;
            continue;
        }
        if (head.kind == MSG_ERROR) {
            /* an earlier stage failed: pass it on, then wait for the stop */
            if (failed == BT_OK) {
                failed = efail(e, wire_status(head.status), "%s", head.text);
                report_failure(e, nxt, failed);
            }
            continue;
        }
        const int64_t T = head.n_tokens, n_out = head.n_out;
        /* stage 0 gets the tokens from rank 0, the others x as well */
        const int64_t n_floats_in = e->my_stage == 0 || e->direct_in ? 0 : T * e->hp.n_embd;
        const size_t want = body_bytes(e, T, n_out, n_floats_in);
        enum bt_status st = BT_OK;
        if (head.kind != MSG_UBATCH || e->my_stage < 0 || T < 1 || T > e->p.n_ubatch || n_out < 0 || n_out > T ||
            head.body != want) {
            st = efail(e, BT_ERR_COMM, "rank %d: a message from rank %d it cannot use (kind %d, %lld tokens, %lld bytes)",
                       t->rank, prev, head.kind, (long long)T, (long long)head.body);
            if (e->my_stage < 0) { /* a rank outside the chain has nobody to tell but rank 0 */
                failed = st;
                break;
            }
        }
        if (st == BT_OK) {
            BT_ASSERT(want <= e->in_cap); /* T <= n_ubatch, n_out <= T: sized at open */
            if (bt_transport_irecv(t, body, want, prev, TAG_BODY, &rh) != BT_OK ||
                bt_transport_wait_polite(t, &rh) != BT_OK) {
                /* the chain learns of it and this rank waits for the stop:
                 * leaving now would leave the ranks after it (and rank 0)
                 * waiting for ever; a transport that is really broken fails
                 * the next receive, which ends the loop.  The failed
                 * receive ended its request (transport.h), so rh is posted
                 * into again, never waited on twice, and no receive is left
                 * pointing into the body buffer */
                if (failed == BT_OK) {
                    failed = efail(e, BT_ERR_COMM, "rank %d: receiving from rank %d: %s", t->rank, prev, t->error);
                    report_failure(e, nxt, failed);
                }
                continue;
            }
            e->stats.bytes_received += want;
            e->stats.wait_s += bt_now_s() - t0;
        }
        if (failed != BT_OK) continue; /* after a failure: drop the work, wait for the stop */
        const int32_t *ints = body;
        /* the rows asked for were checked on rank 0; others mean a broken message */
        for (int64_t i = 0; st == BT_OK && i < n_out; i++)
            if (ints[3 * T + i] < 0 || ints[3 * T + i] >= T)
                st = efail(e, BT_ERR_COMM, "rank %d: ubatch %llu asks for rows outside its tokens", t->rank,
                           (unsigned long long)head.id);
        if (st == BT_OK)
            st = stage_step(e, head.id, T, n_out, ints,
                            e->my_stage == 0 || e->direct_in ? NULL : (const float *)(ints + body_ints(T, n_out)),
                            body_busy(body, T, n_out, n_floats_in), NULL);
        if (st != BT_OK) {
            failed = st;
            report_failure(e, nxt, failed);
        }
    }
    const enum bt_status st = drain_sends(e);
    if (failed != BT_OK) return failed;
    return st;
}

/* ---- statistics ----------------------------------------------------------------------- */

void bt_engine_compute_seconds(const struct bt_engine *e, double *compute_s) {
    for (int r = 0; r < e->P; r++) compute_s[r] = 0.0;
    if (e->t->rank != 0) return;
    for (int k = 0; k < e->n_stages; k++) compute_s[e->stages[k]] = e->stage_compute_s[k];
    compute_s[0] = e->stats.compute_s; /* rank 0's own, now */
}

void bt_engine_stats(const struct bt_engine *e, struct bt_engine_stats *s) {
    *s = e->stats;
    if (e->stage) s->compute_bytes = bt_llm_stage_compute_bytes(e->stage);
    s->buffer_bytes = e->in_cap;
    for (int i = 0; e->outs && i < e->n_outs; i++) s->buffer_bytes += e->outs[i].cap;
    for (int i = 0; i < e->q_cap; i++)
        if (e->q[i]) s->buffer_bytes += e->q[i]->cap;
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
