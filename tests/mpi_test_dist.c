/* mpi_test_dist.c - the distributed pipeline under mpiexec (1 to 4 ranks):
 * bitwise equality with a one-process run for every FFN kind, n_copies and
 * micro-batch count; ownership of nodes and weights; graph mismatch. */
#include <check.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_limited.h"
#include "baton/baton.h"
#include "dist.h"
#include "synth_model.h"
#include "transport.h"

#include "mpi_testutil.h"

/* ---- the one-process reference ---------------------------------------------- */

struct reference {
    struct bt_model *m;
    bt_backend_t cpu;
    bt_buffer_t wbuf;
    bt_context *ctx;
    struct bt_model_graph g;
};

static void reference_init(struct reference *r, const struct bt_model_config *cfg) {
    memset(r, 0, sizeof *r);
    char err[256];
    ck_assert_msg(bt_model_new(cfg, &r->m, err, sizeof err) == BT_OK, "%s", err);
    r->cpu = bt_backend_cpu_init(1);
    ck_assert_ptr_nonnull(r->cpu);
    r->wbuf = bt_alloc_ctx_tensors(bt_model_context(r->m), r->cpu);
    ck_assert_ptr_nonnull(r->wbuf);
    bt_model_init_weights(r->m);
    /* a context with data: the graph's tensors are computed in place */
    const size_t graph_bytes = 64u << 20;
    r->ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(cfg) + graph_bytes, NULL, false});
    ck_assert_ptr_nonnull(r->ctx);
    ck_assert_int_eq(bt_model_build_graph(r->m, r->ctx, &r->g), BT_OK);
}

static void reference_run(struct reference *r, int k, float *logits) {
    bt_model_set_inputs(r->m, &r->g, k);
    ck_assert_int_eq(bt_backend_graph_compute(r->cpu, r->g.graph), BT_OK);
    bt_tensor_get(r->g.logits, logits, 0, bt_nbytes(r->g.logits));
}

static void reference_free(struct reference *r) {
    bt_free(r->ctx);
    bt_buffer_free(r->wbuf);
    bt_backend_free(r->cpu);
    bt_model_free(r->m);
}

/* ---- the distributed run ----------------------------------------------------------- */

struct distributed {
    struct bt_model *m;
    bt_backend_t cpu;
    bt_context *ctx;
    struct bt_model_graph g;
    bt_dist *d;
};

static void init_weight(struct bt_tensor *w, void *user) { bt_model_init_weight(user, w); }

/* The model on this rank's backend (x owns it) under opt, planned: the
 * plan's status. */
static enum bt_status distributed_init_on(struct distributed *x, const struct bt_model_config *cfg, bt_backend_t backend,
                                          const struct bt_dist_options *opt) {
    memset(x, 0, sizeof *x);
    char merr[256];
    ck_assert_msg(bt_model_new(cfg, &x->m, merr, sizeof merr) == BT_OK, "%s", merr);
    x->cpu = backend;
    ck_assert_ptr_nonnull(x->cpu);
    x->ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(cfg), NULL, true});
    ck_assert_ptr_nonnull(x->ctx);
    ck_assert_int_eq(bt_model_build_graph(x->m, x->ctx, &x->g), BT_OK);
    x->d = bt_dist_new(T, x->cpu, opt);
    ck_assert_ptr_nonnull(x->d);
    return bt_dist_plan(x->d, x->g.graph, init_weight, x->m);
}

static enum bt_status distributed_init(struct distributed *x, const struct bt_model_config *cfg, int n_copies) {
    const struct bt_dist_options opt = {.n_copies = n_copies};
    return distributed_init_on(x, cfg, bt_backend_cpu_init(1), &opt);
}

static void distributed_free(struct distributed *x) {
    bt_dist_free(x->d);
    bt_free(x->ctx);
    bt_backend_free(x->cpu);
    bt_model_free(x->m);
}

/* inputs of micro-batch k, as the model writes them; every rank sets the
 * ones it reads */
static void set_inputs(struct distributed *x, const struct bt_model_config *cfg, int k) {
    (void)cfg;
    ck_assert_msg(bt_model_set_inputs_with(x->m, &x->g, k, bt_dist_set_input_fn, x->d) == BT_OK, "%s",
                  bt_dist_error(x->d));
}

/* M micro-batches through x's pipeline; outputs read n_copies-1 behind, as a
 * streaming user would, the rest after a synchronise; every output bitwise
 * equal to the reference (rank 0 checks). */
static void stream_and_check(struct distributed *x, struct reference *ref, const struct bt_model_config *cfg,
                             int n_copies, int M, const char *what) {
    const size_t n_logits = (size_t)cfg->n_vocab * (size_t)cfg->n_tokens;
    float *want = malloc(n_logits * sizeof(float)), *got = malloc(n_logits * sizeof(float));
    int checked = 0;
    for (int k = 0; k < M; k++) {
        set_inputs(x, cfg, k);
        ck_assert_int_eq(bt_dist_submit(x->d), BT_OK);
        const int ready = k - (n_copies - 1);
        if (ready >= 0 && T->rank == 0) {
            reference_run(ref, ready, want);
            ck_assert_msg(bt_dist_get_output(x->d, ready, x->g.logits, got, n_logits * sizeof(float)) == BT_OK, "%s",
                          bt_dist_error(x->d));
            ck_assert_msg(memcmp(want, got, n_logits * sizeof(float)) == 0,
                          "%s, n_copies %d: micro-batch %d differs from the one-process run", what, n_copies, ready);
            checked++;
        }
    }
    ck_assert_int_eq(bt_dist_synchronize(x->d), BT_OK);
    if (T->rank == 0) {
        for (int k = M - n_copies + 1 > 0 ? M - n_copies + 1 : 0; k < M; k++) {
            reference_run(ref, k, want);
            ck_assert_int_eq(bt_dist_get_output(x->d, k, x->g.logits, got, n_logits * sizeof(float)), BT_OK);
            ck_assert_msg(memcmp(want, got, n_logits * sizeof(float)) == 0, "%s, n_copies %d: micro-batch %d differs",
                          what, n_copies, k);
            checked++;
        }
        ck_assert_int_eq(checked, M);
        /* distinct inputs give distinct outputs: the check can fail */
        if (M > 1) {
            reference_run(ref, 0, want);
            ck_assert_int_ne(memcmp(want, got, n_logits * sizeof(float)), 0);
        }
    }
    free(want);
    free(got);
}

static void check_pipeline(enum bt_ffn_kind kind, int n_copies, int M) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.ffn = kind;
    cfg.n_layers = 4;
    struct reference ref;
    reference_init(&ref, &cfg);
    struct distributed x;
    ck_assert_msg(distributed_init(&x, &cfg, n_copies) == BT_OK, "plan: %s", bt_dist_error(x.d));
    stream_and_check(&x, &ref, &cfg, n_copies, M, bt_ffn_kind_name(kind));
    distributed_free(&x);
    reference_free(&ref);
}

START_TEST(test_pipeline_kinds) {
    const enum bt_ffn_kind kinds[] = {BT_FFN_MLP, BT_FFN_MOE_DENSE, BT_FFN_MOE_TOPK, BT_FFN_MOE_SHARED};
    const int copies[] = {1, 2, 4};
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 3; c++) check_pipeline(kinds[i], copies[c], 8);
}
END_TEST

START_TEST(test_pipeline_micro_batch_counts) {
    for (int M = 1; M <= 8; M++) check_pipeline(BT_FFN_MOE_SHARED, 2, M);
    check_pipeline(BT_FFN_MOE_TOPK, 4, 3); /* fewer micro-batches than slots */
}
END_TEST

/* Each way of moving transfers while a rank computes gives the same bits;
 * only progress from the compute thread calls back between ops (every op
 * with period 0), and a backend that is not the CPU's has no such calls. */
START_TEST(test_progress_modes) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.ffn = BT_FFN_MOE_SHARED;
    cfg.n_layers = T->size > 4 ? T->size : 4; /* a layer for every rank: every rank computes */
    struct reference ref;
    reference_init(&ref, &cfg);
    const enum bt_dist_progress modes[] = {BT_DIST_PROGRESS_AUTO, BT_DIST_PROGRESS_COMPUTE, BT_DIST_PROGRESS_THREAD,
                                           BT_DIST_PROGRESS_NONE};
    const char *names[] = {"auto", "compute", "thread", "none"};
    for (int i = 0; i < 4; i++) {
        for (int period = 0; period <= 50; period += 50) {
            struct distributed x;
            ck_assert_msg(distributed_init(&x, &cfg, 2) == BT_OK, "plan: %s", bt_dist_error(x.d));
            bt_dist_set_progress(x.d, modes[i], period);
            char what[64];
            snprintf(what, sizeof what, "progress %s every %d us", names[i], period);
            stream_and_check(&x, &ref, &cfg, 2, 6, what);
            const int64_t calls = bt_dist_local_stats(x.d).progress_calls;
            const bool between_ops = modes[i] == BT_DIST_PROGRESS_AUTO || modes[i] == BT_DIST_PROGRESS_COMPUTE;
            if (between_ops && period == 0)
                ck_assert_msg(calls > 0, "rank %d, %s: no progress between ops", T->rank, what);
            if (!between_ops) ck_assert_msg(calls == 0, "rank %d, %s: %lld calls between ops", T->rank, what, (long long)calls);
            distributed_free(&x);
        }
    }
    /* on the test backend (not the CPU's), compute falls back to the thread */
    struct distributed x;
    const struct bt_dist_options opt = {.n_copies = 2};
    ck_assert_int_eq(distributed_init_on(&x, &cfg, bt_backend_limited_init("LIMITED0", 1, NULL, 0), &opt), BT_OK);
    bt_dist_set_progress(x.d, BT_DIST_PROGRESS_COMPUTE, 0);
    stream_and_check(&x, &ref, &cfg, 2, 4, "progress compute on the test backend");
    ck_assert_int_eq(bt_dist_local_stats(x.d).progress_calls, 0);
    distributed_free(&x);
    reference_free(&ref);
}
END_TEST

/* A rank whose backend has memory of its own (a GPU's)
 * places and checks with the device's free memory, not its share of the
 * host's; a limit given (the topology's memory) still wins. */
START_TEST(test_device_memory) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    bt_backend_t dev = bt_backend_limited_init("LIMITED0", 1, NULL, 0);
    bt_backend_limited_set_memory(dev, (size_t)64 << 10, (size_t)2 << 20);
    const char *what = NULL;
    ck_assert_int_eq(bt_backend_plan_memory(dev, 0, 2, &what), (int64_t)64 << 10);
    ck_assert_str_eq(what, "its device's free memory");
    ck_assert_int_eq(bt_backend_plan_memory(dev, 5 << 20, 2, &what), (int64_t)5 << 20);
    ck_assert_str_eq(what, "its memory limit");
    struct distributed x;
    const struct bt_dist_options opt = {.n_copies = 2};
    ck_assert_int_eq(distributed_init_on(&x, &cfg, dev, &opt), BT_ERR_NOMEM);
    /* 64 KiB per rank: one rank named, or all of them counted */
    char all[64];
    snprintf(all, sizeof all, "memory (%.1f MiB in all)", T->size * 64.0 / 1024.0);
    ck_assert_msg(strstr(bt_dist_error(x.d), "has 0.1 MiB of memory") || strstr(bt_dist_error(x.d), all), "%s",
                  bt_dist_error(x.d));
    distributed_free(&x);
    /* the host's share without a device */
    bt_backend_t cpu = bt_backend_cpu_init(1);
    ck_assert_int_gt(bt_backend_plan_memory(cpu, 0, 2, &what), (int64_t)1 << 20);
    ck_assert_str_eq(what, "its share of this machine's memory");
    bt_backend_free(cpu);
}
END_TEST

/* Every node on exactly one rank; each rank holds exactly its own weights. */
START_TEST(test_ownership) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.n_layers = 5;
    struct distributed x;
    ck_assert_msg(distributed_init(&x, &cfg, 2) == BT_OK, "%s", bt_dist_error(x.d));
    const struct bt_graph *g = x.g.graph;
    int64_t mine = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const int o = bt_dist_owner(x.d, g->nodes[i]);
        ck_assert_msg(o >= 0 && o < T->size, "node %s has owner %d", g->nodes[i]->name, o);
    }
    for (int i = 0; i < g->n_leafs; i++) {
        const struct bt_tensor *l = g->leafs[i];
        if (!(l->flags & BT_TENSOR_FLAG_WEIGHT)) continue;
        const int o = bt_dist_owner(x.d, l);
        ck_assert(o >= 0 && o < T->size);
        if (o == T->rank) {
            ck_assert_msg(l->data != NULL, "own weight %s has no data", l->name);
            mine += (int64_t)bt_nbytes(l);
        } else {
            ck_assert_msg(l->data == NULL, "rank %d holds %s of rank %d", T->rank, l->name, o);
        }
    }
    const struct bt_dist_stats s = bt_dist_local_stats(x.d);
    /* the weight buffer is the weights, each rounded up to the alignment */
    ck_assert_int_ge(s.weight_bytes, mine);
    ck_assert_int_lt(s.weight_bytes, mine + 64 * (int64_t)(s.n_weights + 1));
    /* all ranks together hold every weight once */
    int64_t total_bytes = 0;
    struct bt_dist_stats *all = calloc((size_t)T->size, sizeof *all);
    ck_assert_int_eq(bt_dist_gather_stats(x.d, all), BT_OK);
    if (T->rank == 0) {
        int64_t want = 0;
        for (int i = 0; i < g->n_leafs; i++)
            if (g->leafs[i]->flags & BT_TENSOR_FLAG_WEIGHT) want += (int64_t)bt_nbytes(g->leafs[i]);
        int nodes = 0;
        for (int r = 0; r < T->size; r++) {
            total_bytes += all[r].weight_bytes;
            nodes += all[r].n_nodes;
            if (T->size <= cfg.n_layers) ck_assert_msg(all[r].first_layer >= 0, "rank %d holds no layer", r);
        }
        ck_assert_int_ge(total_bytes, want);
        ck_assert_int_lt(total_bytes, want + 64 * 200);
        int want_nodes = 0;
        for (int i = 0; i < g->n_nodes; i++)
            if (!bt_op_is_view(g->nodes[i]->op)) want_nodes++;
        ck_assert_int_eq(nodes, want_nodes);
    }
    free(all);
    distributed_free(&x);
}
END_TEST

/* The same graph planned again (another n_copies) by the same runtime and by
 * a new one: the graph is left as the user built it, so ranks still agree. */
START_TEST(test_replan) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    struct distributed x;
    ck_assert_msg(distributed_init(&x, &cfg, 2) == BT_OK, "%s", bt_dist_error(x.d));
    /* the hash of the graph as built, from an identical graph never planned */
    bt_context *ctx2 = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
    struct bt_model_graph g2;
    ck_assert_int_eq(bt_model_build_graph(x.m, ctx2, &g2), BT_OK);
    const uint64_t h = bt_graph_hash(g2.graph);
    bt_free(ctx2);
    ck_assert_msg(bt_dist_plan(x.d, x.g.graph, init_weight, x.m) == BT_OK, "replan: %s", bt_dist_error(x.d));
    bt_dist_free(x.d);
    ck_assert(bt_graph_hash(x.g.graph) == h);
    struct bt_dist_options opt = {.n_copies = 3};
    x.d = bt_dist_new(T, x.cpu, &opt);
    ck_assert_msg(bt_dist_plan(x.d, x.g.graph, init_weight, x.m) == BT_OK, "new runtime: %s", bt_dist_error(x.d));
    for (int k = 0; k < 3; k++) {
        set_inputs(&x, &cfg, k);
        ck_assert_int_eq(bt_dist_submit(x.d), BT_OK);
    }
    ck_assert_int_eq(bt_dist_synchronize(x.d), BT_OK);
    distributed_free(&x);
}
END_TEST

/* Ranks whose backend memory is not host memory (as a GPU's): tensors leave
 * and arrive through host slots (the staged path CUDA ranks use), and the
 * result is still bitwise the one-process run. */
START_TEST(test_staged_device_path) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.ffn = BT_FFN_MOE_SHARED;
    struct reference ref;
    reference_init(&ref, &cfg);
    bt_backend_t dev = bt_backend_limited_init("DEVICE", 1, NULL, 0);
    ck_assert_ptr_nonnull(dev);
    bt_backend_limited_set_async(dev, 200); /* as a GPU: copies and computes run later */
    ck_assert(!bt_buft_is_host(bt_backend_get_default_buffer_type(dev)));
    struct distributed x;
    const struct bt_dist_options opt = {.n_copies = 2};
    ck_assert_msg(distributed_init_on(&x, &cfg, dev, &opt) == BT_OK, "%s", bt_dist_error(x.d));
    stream_and_check(&x, &ref, &cfg, opt.n_copies, 5, "staged path");
    /* the transfers really went through the backend's asynchronous copies:
     * downloads into send slots everywhere, uploads where activations arrive */
    const struct bt_plan *plan = bt_dist_get_plan(x.d);
    ck_assert_ptr_nonnull(plan);
    bool sends = false, receives = false;
    for (int i = 0; i < plan->n_transfers; i++) {
        sends |= plan->transfers[i].src == T->rank;
        receives |= plan->transfers[i].dst == T->rank && plan->transfers[i].consumer >= 0;
    }
    /* with more ranks than layers, some ranks hold nothing */
    if (T->size > 1) ck_assert(sends || plan->layer_first[T->rank] < 0);
    if (sends) ck_assert_uint_gt(bt_backend_limited_stats(x.cpu).get_async_calls, 0);
    if (receives) ck_assert_uint_gt(bt_backend_limited_stats(x.cpu).set_async_calls, 0);
    if (T->size > 1 && T->rank > 0 && plan->layer_first[T->rank] >= 0) ck_assert(receives);
    distributed_free(&x);
    reference_free(&ref);
}
END_TEST

/* ---- the device transport path, over the ordered transport (NCCL's rules) ---- */

/* The ordered transport itself: data matches in posting order whatever the
 * tags; a transfer needs an opened edge; edge lists that differ between the
 * two ends are an error naming both. */
START_TEST(test_ordered_transport) {
    bt_transport *o = bt_transport_ordered_new(T);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(o->iface.name(o), "ordered");
    const int P = T->size, r = T->rank;
    bt_treq a, b;
    int32_t v[2] = {0, 0};
    if (P >= 2) {
        /* no edge yet */
        if (r == 0) {
            ck_assert_int_eq(bt_transport_isend(o, v, sizeof v, 1, 0, &a), BT_ERR_INVALID);
            ck_assert_ptr_nonnull(strstr(o->error, "no open channel from rank 0 to rank 1"));
        }
        const int src[1] = {0}, dst[1] = {1};
        ck_assert_int_eq(bt_transport_connect(o, src, dst, 1), BT_OK);
        if (r == 0) {
            int32_t x = 11, y = 22;
            ck_assert_int_eq(bt_transport_isend(o, &x, sizeof x, 1, 5, &a), BT_OK);
            ck_assert_int_eq(bt_transport_isend(o, &y, sizeof y, 1, 3, &b), BT_OK);
            ck_assert_int_eq(bt_transport_wait(o, &a), BT_OK);
            ck_assert_int_eq(bt_transport_wait(o, &b), BT_OK);
            /* only 0 -> 1 is open */
            ck_assert_int_eq(bt_transport_irecv(o, v, sizeof v, 1, 0, &a), BT_ERR_INVALID);
        } else if (r == 1) {
            /* posted with the tags swapped: the order decides, as with NCCL */
            ck_assert_int_eq(bt_transport_irecv(o, &v[0], sizeof v[0], 0, 3, &a), BT_OK);
            ck_assert_int_eq(bt_transport_irecv(o, &v[1], sizeof v[1], 0, 5, &b), BT_OK);
            ck_assert_int_eq(bt_transport_wait(o, &a), BT_OK);
            ck_assert_int_eq(bt_transport_wait(o, &b), BT_OK);
            ck_assert_int_eq(v[0], 11);
            ck_assert_int_eq(v[1], 22);
        }
        /* rank 1 lists the edges in another order than rank 0 */
        const int s2[2] = {0, 1}, d2[2] = {1, 0}, s3[2] = {1, 0}, d3[2] = {0, 1};
        if (r <= 1) {
            const enum bt_status st = r == 0 ? bt_transport_connect(o, s2, d2, 2) : bt_transport_connect(o, s3, d3, 2);
            ck_assert_int_eq(st, BT_ERR_MISMATCH);
            ck_assert_msg(strstr(o->error, "entry 0 of this rank's edge list is") != NULL &&
                              strstr(o->error, "same edges in the same order") != NULL,
                          "%s", o->error);
        }
    }
    const int self[1] = {r};
    ck_assert_int_eq(bt_transport_connect(o, self, self, 1), BT_ERR_INVALID);
    ck_assert_int_eq(o->iface.barrier(o), BT_OK);
    o->iface.free(o);
}
END_TEST

/* The pipeline with a device transport: rank 0 on the CPU, the others on a
 * backend whose memory is not the host's (as a GPU's), some ranks holding an
 * ordered transport.  The results are bitwise those of one process, tensors
 * between two member ranks went over the ordered transport, and the rest
 * (inputs, outputs, edges with a non-member) over MPI through the backend's
 * host memory.  `refuse` makes the device ranks refuse an op, so the graph
 * goes back and forth between ranks and one edge carries several tensors
 * from different splits. */
static void check_device_transport(bool rank0_member, enum bt_op refuse, const uint8_t *edges, int n_copies, int M) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.ffn = BT_FFN_MOE_TOPK;
    cfg.n_layers = T->size > 4 ? T->size : 4; /* a layer for every rank */
    struct reference ref;
    reference_init(&ref, &cfg);
    bt_backend_t backend = T->rank == 0 ? bt_backend_cpu_init(1)
                                        : bt_backend_limited_init("DEVICE", 1, &refuse, refuse == BT_OP_NONE ? 0 : 1);
    ck_assert_ptr_nonnull(backend);
    if (T->rank > 0) bt_backend_limited_set_async(backend, 200); /* as a GPU */
    bt_transport *o = T->rank > 0 || rank0_member ? bt_transport_ordered_new(T) : NULL;
    const struct bt_dist_options opt = {.n_copies = n_copies, .device_transport = o, .device_edges = edges};
    struct distributed x;
    ck_assert_msg(distributed_init_on(&x, &cfg, backend, &opt) == BT_OK, "%s", bt_dist_error(x.d));
    char what[96];
    snprintf(what, sizeof what, "device transport (rank 0 %s)", rank0_member ? "a member" : "not a member");
    stream_and_check(&x, &ref, &cfg, n_copies, M, what);
    struct bt_dist_stats *all = calloc((size_t)T->size, sizeof *all);
    ck_assert_int_eq(bt_dist_gather_stats(x.d, all), BT_OK);
    if (T->rank == 0) {
        int64_t direct = 0, sent = 0;
        for (int r = 0; r < T->size; r++) {
            direct += all[r].bytes_direct;
            sent += all[r].bytes_sent;
        }
        /* two device ranks next to each other exchange activations directly
         * (unless the only edge between them is ruled out); rank 0 does not
         * when it is not a member */
        const bool expect = T->size >= 3 || (T->size == 2 && rank0_member);
        if (!edges && expect) ck_assert_int_gt(direct, 0);
        if (!rank0_member) ck_assert_int_eq(all[0].bytes_direct, 0);
        if (edges && T->size == 2) ck_assert_int_eq(direct, 0); /* the only edges are ruled out */
        ck_assert_int_le(direct, sent);
    }
    /* the device ranks staged their host transfers through their own host
     * memory, with asynchronous copies */
    const struct bt_plan *plan = bt_dist_get_plan(x.d);
    bool staged = false;
    for (int i = 0; i < plan->n_transfers; i++)
        staged |= !plan->transfers[i].direct && (plan->transfers[i].src == T->rank || plan->transfers[i].dst == T->rank);
    if (T->rank > 0 && staged) ck_assert_uint_gt(bt_backend_limited_stats(x.cpu).host_allocs, 0);
    free(all);
    distributed_free(&x); /* sends what the receives posted ahead wait for */
    if (o) o->iface.free(o);
    reference_free(&ref);
}

/* A receive that fails (a message longer than its buffer) ends its request:
 * the handle is inactive afterwards, so the caller may post into it again
 * (the engine's serve loop does) or cancel it, and no receive is left
 * posted into the caller's buffer to take a later message.  The MPI
 * transport once left such a request active, through MPI_Test and MPI_Wait
 * alike: the next post overwrote a live handle, and cancelling it later
 * passed MPI a freed request. */
START_TEST(test_failed_receive_ends_request) {
    if (T->size < 2) return;
    enum { TAG = 11 };
    if (T->rank == 1) {
        const int64_t big[2] = {1, 2};
        const int32_t small = 77;
        bt_treq a, b, c;
        ck_assert_int_eq(bt_transport_isend(T, big, sizeof big, 0, TAG, &a), BT_OK);
        ck_assert_int_eq(bt_transport_isend(T, big, sizeof big, 0, TAG, &b), BT_OK);
        ck_assert_int_eq(bt_transport_isend(T, &small, sizeof small, 0, TAG, &c), BT_OK);
        /* a truncated message may fail its send too; it must end all the same */
        bt_transport_wait(T, &a);
        bt_transport_wait(T, &b);
        ck_assert_int_eq(bt_transport_wait(T, &c), BT_OK);
        ck_assert(!a.active && !b.active);
    } else if (T->rank == 0) {
        int32_t v = 0;
        bt_treq r;
        memset(&r, 0, sizeof r);
        /* through test (wait_polite), then through wait */
        ck_assert_int_eq(bt_transport_irecv(T, &v, sizeof v, 1, TAG, &r), BT_OK);
        ck_assert_int_ne(bt_transport_wait_polite(T, &r), BT_OK);
        ck_assert_msg(!r.active, "a failed test left its request active");
        ck_assert_int_eq(bt_transport_irecv(T, &v, sizeof v, 1, TAG, &r), BT_OK);
        ck_assert_int_ne(bt_transport_wait(T, &r), BT_OK);
        ck_assert_msg(!r.active, "a failed wait left its request active");
        if (T->iface.cancel) T->iface.cancel(T, &r); /* nothing to cancel: a no-op */
        /* the handle again: the next message, whole */
        ck_assert_int_eq(bt_transport_irecv(T, &v, sizeof v, 1, TAG, &r), BT_OK);
        ck_assert_int_eq(bt_transport_wait(T, &r), BT_OK);
        ck_assert_int_eq(v, 77);
    }
    ck_assert_int_eq(T->iface.barrier(T), BT_OK);
}
END_TEST

START_TEST(test_device_transport) {
    for (int n_copies = 1; n_copies <= 3; n_copies++) check_device_transport(true, BT_OP_NONE, NULL, n_copies, 5);
    check_device_transport(false, BT_OP_NONE, NULL, 2, 4);
}
END_TEST

START_TEST(test_device_transport_back_and_forth) {
    check_device_transport(true, BT_OP_SOFT_MAX, NULL, 2, 5);
    check_device_transport(true, BT_OP_ARGSORT, NULL, 3, 4);
    check_device_transport(false, BT_OP_SOFT_MAX, NULL, 2, 3);
}
END_TEST

/* Receives posted ahead on the device transport cannot be cancelled: a
 * runtime freed before any submit, and one planned again after one submit,
 * drain them (their senders send), and the next run is still exact. */
START_TEST(test_device_transport_drain) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.ffn = BT_FFN_MOE_TOPK;
    struct reference ref;
    reference_init(&ref, &cfg);
    const enum bt_op refuse = BT_OP_SOFT_MAX;
    bt_transport *o = bt_transport_ordered_new(T);
    const struct bt_dist_options opt = {.n_copies = 3, .device_transport = o};
    struct distributed x;
    ck_assert_msg(distributed_init_on(&x, &cfg,
                                      T->rank == 0 ? bt_backend_cpu_init(1)
                                                   : bt_backend_limited_init("DEVICE", 1, &refuse, 1),
                                      &opt) == BT_OK,
                  "%s", bt_dist_error(x.d));
    bt_dist_free(x.d); /* nothing submitted: all n_copies receives drained */
    x.d = bt_dist_new(T, x.cpu, &opt);
    ck_assert_msg(bt_dist_plan(x.d, x.g.graph, init_weight, x.m) == BT_OK, "%s", bt_dist_error(x.d));
    set_inputs(&x, &cfg, 0);
    ck_assert_int_eq(bt_dist_submit(x.d), BT_OK);
    ck_assert_msg(bt_dist_plan(x.d, x.g.graph, init_weight, x.m) == BT_OK, "replan: %s", bt_dist_error(x.d));
    stream_and_check(&x, &ref, &cfg, opt.n_copies, 4, "after a replan");
    distributed_free(&x);
    o->iface.free(o);
    reference_free(&ref);
}
END_TEST

/* A tensor this rank computes and sends from its own memory (a host
 * backend, or the device transport) is still in flight while the next
 * micro-batch runs this rank's earlier ops: no other tensor of this rank may
 * share its memory (it did: an 8-rank run read the next micro-batch's
 * activations on the receiving side, now and then, under load). */
static void check_sent_memory_alone(struct distributed *x) {
    const struct bt_plan *p = bt_dist_get_plan(x->d);
    ck_assert_ptr_nonnull(p);
    const struct bt_graph *g = x->g.graph;
    const bool host = bt_buft_is_host(bt_backend_get_default_buffer_type(x->cpu));
    int checked = 0;
    for (int k = 0; k < p->n_transfers; k++) {
        const struct bt_plan_transfer *pt = &p->transfers[k];
        if (pt->src != T->rank || pt->producer < 0 || !(host || pt->direct)) continue;
        const struct bt_tensor *sent = bt_plan_tensor(g, pt->tensor);
        const struct bt_tensor *base = sent->view_src ? sent->view_src : sent;
        ck_assert_ptr_nonnull(base->data);
        const uint8_t *a0 = base->data, *a1 = a0 + bt_nbytes(base);
        for (int i = 0; i < g->n_nodes; i++) {
            const struct bt_tensor *t = g->nodes[i];
            if (t == base || t->view_src == base || !t->data || bt_dist_owner(x->d, t) != T->rank) continue;
            const uint8_t *b0 = t->data, *b1 = b0 + bt_nbytes(t);
            ck_assert_msg(b1 <= a0 || a1 <= b0, "rank %d: '%s', sent from its own memory to rank %d, shares it with '%s'",
                          T->rank, sent->name, pt->dst, t->name);
        }
        checked++;
    }
    int64_t n = checked; /* some rank sends in place: the check can fail */
    T->iface.allreduce_max(T, &n, 1);
    if (T->size > 1) ck_assert_int_gt(n, 0);
}

START_TEST(test_sent_memory_alone) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.ffn = BT_FFN_MOE_TOPK;
    struct distributed x;
    ck_assert_int_eq(distributed_init(&x, &cfg, 3), BT_OK); /* CPU ranks: every computed tensor sent in place */
    check_sent_memory_alone(&x);
    distributed_free(&x);
    const enum bt_op refuse = BT_OP_SOFT_MAX; /* the device transport: rank 0 and the others back and forth */
    bt_transport *o = bt_transport_ordered_new(T);
    const struct bt_dist_options opt = {.n_copies = 3, .device_transport = o};
    ck_assert_int_eq(distributed_init_on(&x, &cfg,
                                         T->rank == 0 ? bt_backend_cpu_init(1)
                                                      : bt_backend_limited_init("DEVICE", 1, &refuse, 1),
                                         &opt),
                     BT_OK);
    check_sent_memory_alone(&x);
    distributed_free(&x);
    o->iface.free(o);
}
END_TEST

/* An edge the device transport refuses to open (as NCCL refuses two ranks
 * on one GPU): the plan fails on every rank with one message naming it, and
 * the ends of later edges are not left waiting. */
START_TEST(test_device_transport_refused) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    if (T->size > cfg.n_layers) cfg.n_layers = T->size; /* rank 0 sends to rank 1 */
    bt_transport *o = bt_transport_ordered_new(T);
    bt_transport_ordered_refuse(o, 0, 1);
    const struct bt_dist_options opt = {.n_copies = 2, .device_transport = o};
    struct distributed x;
    const enum bt_status st = distributed_init_on(&x, &cfg, bt_backend_limited_init("DEVICE", 1, NULL, 0), &opt);
    if (T->size == 1) {
        ck_assert_int_eq(st, BT_OK);
    } else {
        ck_assert_int_eq(st, BT_ERR_COMM);
        ck_assert_msg(strstr(bt_dist_error(x.d), "channel 0 -> 1 refused") != NULL, "%s", bt_dist_error(x.d));
    }
    distributed_free(&x);
    o->iface.free(o);
}
END_TEST

/* Edges ruled out by device_edges go over MPI (here: every edge touching the
 * last rank). */
START_TEST(test_device_transport_edges) {
    const int P = T->size;
    uint8_t *edges = malloc((size_t)P * (size_t)P);
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) edges[a * P + b] = a != P - 1 && b != P - 1;
    check_device_transport(true, BT_OP_SOFT_MAX, edges, 2, 4);
    free(edges);
}
END_TEST

/* An expert group that cannot divide a layer's experts says so at plan
 * time, before any rank allocates, with the same message on every rank:
 * here the experts' first product is also a graph output, which a member's
 * share would leave incomplete on the group's first rank.  The same graph
 * without the flag plans. */
START_TEST(test_group_chain_refused) {
    if (T->size < 2) return;
    for (int flagged = 1; flagged >= 0; flagged--) {
        struct bt_model_config cfg;
        bt_model_config_default(&cfg);
        cfg.ffn = BT_FFN_MOE_TOPK;
        cfg.n_layers = 2;
        struct bt_expert_group grp = {.n_ranks = T->size};
        for (int r = 0; r < T->size; r++) grp.ranks[r] = r;
        const struct bt_dist_options opt = {.n_copies = 2, .groups = &grp, .n_groups = 1};
        struct distributed x;
        memset(&x, 0, sizeof x);
        char merr[256];
        ck_assert_msg(bt_model_new(&cfg, &x.m, merr, sizeof merr) == BT_OK, "%s", merr);
        x.cpu = bt_backend_cpu_init(1);
        ck_assert_ptr_nonnull(x.cpu);
        x.ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
        ck_assert_ptr_nonnull(x.ctx);
        ck_assert_int_eq(bt_model_build_graph(x.m, x.ctx, &x.g), BT_OK);
        struct bt_tensor *gate = NULL;
        for (int i = 0; i < x.g.graph->n_nodes; i++)
            if (strcmp(x.g.graph->nodes[i]->name, "blk.1.ffn_moe_gate") == 0) gate = x.g.graph->nodes[i];
        ck_assert_ptr_nonnull(gate);
        ck_assert_int_eq(gate->op, BT_OP_MUL_MAT_ID);
        if (flagged) gate->flags |= BT_TENSOR_FLAG_OUTPUT;
        x.d = bt_dist_new(T, x.cpu, &opt);
        ck_assert_ptr_nonnull(x.d);
        /* no values: the synthetic filler writes whole weights, a member holds a share */
        const enum bt_status st = bt_dist_plan(x.d, x.g.graph, NULL, NULL);
        if (flagged) {
            ck_assert_int_eq(st, BT_ERR_UNSUPPORTED);
            ck_assert_msg(strstr(bt_dist_error(x.d), "the experts of 'blk.1.ffn_gate_exps' cannot be divided: a "
                                                     "tensor inside it is a graph output") != NULL,
                          "message: %s", bt_dist_error(x.d));
            ck_assert_msg(strstr(bt_dist_error(x.d), "expert group 0") != NULL, "message: %s", bt_dist_error(x.d));
        } else {
            ck_assert_msg(st == BT_OK, "plan: %s", bt_dist_error(x.d));
        }
        distributed_free(&x);
    }
}
END_TEST

/* Ranks that build different graphs: one clear error on every rank. */
START_TEST(test_graph_mismatch) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    if (T->rank == T->size - 1 && T->size > 1) cfg.d_ff *= 2;
    struct distributed x;
    const enum bt_status st = distributed_init(&x, &cfg, 2);
    if (T->size > 1) {
        ck_assert_int_eq(st, BT_ERR_MISMATCH);
        ck_assert_msg(strstr(bt_dist_error(x.d), "different graph") != NULL, "message: %s", bt_dist_error(x.d));
        char want[32];
        snprintf(want, sizeof want, "rank %d ", T->size - 1);
        ck_assert_msg(strstr(bt_dist_error(x.d), want) != NULL, "message names the rank: %s", bt_dist_error(x.d));
    } else {
        ck_assert_int_eq(st, BT_OK);
    }
    distributed_free(&x);
}
END_TEST

/* Outputs outside the kept window and inputs of the wrong size are errors. */
START_TEST(test_api_errors) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    struct distributed x;
    ck_assert_int_eq(distributed_init(&x, &cfg, 2), BT_OK);
    if (T->rank == 0) {
        int32_t tok[2] = {0, 0}; /* the model has more tokens */
        ck_assert_int_eq(bt_dist_set_input(x.d, x.g.tokens, tok, sizeof tok), BT_ERR_INVALID);
        ck_assert_ptr_nonnull(strstr(bt_dist_error(x.d), "bytes"));
        float f;
        ck_assert_int_eq(bt_dist_get_output(x.d, 0, x.g.logits, &f, sizeof f), BT_ERR_INVALID);
    }
    for (int k = 0; k < 4; k++) {
        set_inputs(&x, &cfg, k);
        ck_assert_int_eq(bt_dist_submit(x.d), BT_OK);
    }
    ck_assert_int_eq(bt_dist_synchronize(x.d), BT_OK);
    if (T->rank == 0) {
        const size_t n = (size_t)cfg.n_vocab * (size_t)cfg.n_tokens * sizeof(float);
        float *buf = malloc(n);
        ck_assert_int_eq(bt_dist_get_output(x.d, 1, x.g.logits, buf, n), BT_ERR_INVALID); /* overwritten */
        ck_assert_int_eq(bt_dist_get_output(x.d, 3, x.g.logits, buf, n), BT_OK);
        free(buf);
    }
    distributed_free(&x);
}
END_TEST

/* An allocation that fails on one rank anywhere in
 * planning ends the plan on every rank with that rank's message; no rank is
 * left waiting in a collective, none crashes.  Each allocation bt_dist_plan
 * makes on the victim rank fails in turn, until one plan runs through with
 * no allocation left to fail. */
/* The model's own weight initialisation is the caller's code, not the
 * library's: no allocation fails in it. */
static void init_weight_no_fault(struct bt_tensor *w, void *user) {
    const long keep = atomic_exchange(&fault_countdown, 0);
    bt_model_init_weight(user, w);
    atomic_store(&fault_countdown, keep);
}

static void plan_with_failing_allocations(int victim) {
    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    cfg.n_layers = 2;
    int n_failed = 0;
    for (long n = 1;; n++) {
        ck_assert_msg(n < 100000, "planning makes more allocations than expected");
        struct distributed x;
        memset(&x, 0, sizeof x);
        const enum bt_status mst = bt_model_new(&cfg, &x.m, NULL, 0);
        ck_assert_int_eq(mst, BT_OK);
        x.cpu = bt_backend_cpu_init(1);
        x.ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
        ck_assert(x.m && x.cpu && x.ctx);
        ck_assert_int_eq(bt_model_build_graph(x.m, x.ctx, &x.g), BT_OK);
        const struct bt_dist_options opt = {.n_copies = 2};
        x.d = bt_dist_new(T, x.cpu, &opt);
        ck_assert_ptr_nonnull(x.d);
        atomic_store(&fault_hit, 0);
        if (T->rank == victim) atomic_store(&fault_countdown, n);
        const enum bt_status st = bt_dist_plan(x.d, x.g.graph, init_weight_no_fault, x.m);
        atomic_store(&fault_countdown, 0);
        int64_t v[2] = {atomic_load(&fault_hit), st != BT_OK};
        ck_assert_int_eq(T->iface.allreduce_max(T, v, 2), BT_OK);
        /* every rank the same verdict and the same message */
        int64_t mine = st, lo = -(int64_t)st;
        ck_assert_int_eq(T->iface.allreduce_max(T, &mine, 1), BT_OK);
        ck_assert_int_eq(T->iface.allreduce_max(T, &lo, 1), BT_OK);
        ck_assert_msg(mine == -lo, "ranks disagree on the plan's status after allocation %ld failed on rank %d", n,
                      victim);
        char msg[512], msg0[512];
        snprintf(msg, sizeof msg, "%s", st != BT_OK ? bt_dist_error(x.d) : "");
        memcpy(msg0, msg, sizeof msg);
        ck_assert_int_eq(T->iface.bcast(T, msg0, sizeof msg0, 0), BT_OK);
        ck_assert_msg(strcmp(msg, msg0) == 0, "rank %d: '%s', rank 0: '%s'", T->rank, msg, msg0);
        if (st != BT_OK) {
            ck_assert_msg(msg[0] != '\0', "a failed plan without a message");
            n_failed++;
        }
        distributed_free(&x);
        if (!v[0]) break; /* no allocation left to fail */
    }
    ck_assert_int_gt(n_failed, 0);
}

START_TEST(test_plan_allocation_failures) {
    alarm(300); /* a rank left waiting is a failure, not ctest's timeout */
    plan_with_failing_allocations(T->size - 1);
    if (T->size > 1) plan_with_failing_allocations(0);
    alarm(0);
}
END_TEST

/* Only with BATON_TEST_FAIL_FAST=1 (tests/fail_fast_test.sh): the last
 * rank's assertion fails while the others wait in a collective. */
START_TEST(test_fail_fast) {
    ck_assert_msg(T->rank != T->size - 1, "deliberate failure on the last rank");
    T->iface.barrier(T);
}
END_TEST

int main(int argc, char **argv) {
    char err[256];
    if (bt_transport_mpi_init(&argc, &argv, 50, &T, err, sizeof err) != BT_OK) {
        fprintf(stderr, "mpi_test_dist: %s\n", err);
        return 1;
    }
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 600);
    const char *ff = getenv("BATON_TEST_FAIL_FAST");
    if (ff && strcmp(ff, "1") == 0) tcase_add_test(tc, test_fail_fast);
    tcase_add_test(tc, test_graph_mismatch);
    tcase_add_test(tc, test_plan_allocation_failures);
    tcase_add_test(tc, test_ownership);
    tcase_add_test(tc, test_device_memory);
    tcase_add_test(tc, test_api_errors);
    tcase_add_test(tc, test_replan);
    tcase_add_test(tc, test_staged_device_path);
    tcase_add_test(tc, test_ordered_transport);
    tcase_add_test(tc, test_failed_receive_ends_request);
    tcase_add_test(tc, test_device_transport);
    tcase_add_test(tc, test_device_transport_back_and_forth);
    tcase_add_test(tc, test_device_transport_edges);
    tcase_add_test(tc, test_device_transport_drain);
    tcase_add_test(tc, test_sent_memory_alone);
    tcase_add_test(tc, test_device_transport_refused);
    tcase_add_test(tc, test_group_chain_refused);
    tcase_add_test(tc, test_pipeline_kinds);
    tcase_add_test(tc, test_pipeline_micro_batch_counts);
    tcase_add_test(tc, test_progress_modes);
    suite_add_tcase(s, tc);
    const int f = mtu_run_suite(s);
    bt_transport_mpi_finalize(T);
    return f == 0 ? 0 : 1;
}
