/* bench_dist.c - benchmarks that need several ranks (run under mpirun):
 *   baton bench transport   baton's tensor transfer next to a raw MPI
 *                           ping-pong of the same sizes, in the same run
 *   baton bench pipeline    pipeline throughput for the launched P and
 *                           M = 1, 2, 4, 8, 16 micro-batches, next to one
 *                           process on the same cores, in the same run
 * They print figures; they do not pass or fail. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_OR */
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/alloc.h"
#include "baton/baton.h"
#include "../mem.h"
#include "cli.h"
#include "common.h"
#include "run/bringup.h"
#include "run/model_dist.h"
#include "transport.h"

/* ---- transport ---------------------------------------------------------------- */

static int iters_for(size_t bytes) {
    size_t it = ((size_t)256 << 20) / bytes;
    if (it < 10) it = 10;
    if (it > 2000) it = 2000;
    return (int)it;
}

/* one-way time per message: half a round trip */
static double raw_pingpong(void *buf, size_t bytes, int rank, int iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = 0;
    for (int i = -3; i < iters; i++) {
        if (i == 0) t0 = bt_now_s();
        if (rank == 0) {
            MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
        }
    }
    return (bt_now_s() - t0) / (2.0 * iters);
}

/* baton's path for a computed tensor, as in bt_dist_submit: the sender posts
 * a non-blocking send from the tensor's own memory, the receiver's slot is
 * posted ahead, and both wait politely (test + yield, then naps). */
static double baton_pingpong(bt_transport *t, struct bt_tensor *tensor, struct bt_tensor *slot, size_t bytes, int iters) {
    const int peer = 1 - t->rank;
    bt_treq sreq, rreq;
    memset(&sreq, 0, sizeof sreq);
    memset(&rreq, 0, sizeof rreq);
    t->iface.barrier(t);
    double t0 = 0;
    for (int i = -3; i < iters; i++) {
        if (i == 0) t0 = bt_now_s();
        if (t->rank == 0) {
            bt_transport_irecv(t, slot->data, bytes, peer, 9, &rreq);
            bt_transport_isend(t, tensor->data, bytes, peer, 8, &sreq);
            bt_transport_wait_polite(t, &rreq);
            bt_transport_wait_polite(t, &sreq);
        } else {
            bt_transport_irecv(t, slot->data, bytes, peer, 8, &rreq);
            bt_transport_wait_polite(t, &rreq);
            bt_transport_isend(t, tensor->data, bytes, peer, 9, &sreq);
            bt_transport_wait_polite(t, &sreq);
        }
    }
    return (bt_now_s() - t0) / (2.0 * iters);
}

int bt_cli_bench_transport(int argc, char **argv) {
    long max_bytes = 64L << 20, progress_us = 50;
    for (int i = 1; i < argc; i++) {
        long v;
        if (!strcmp(argv[i], "--max") && i + 1 < argc && bt_cli_parse_int(argv[i + 1], 4096, 1L << 30, &v)) {
            max_bytes = v;
            i++;
        } else if (!strcmp(argv[i], "--progress-us") && i + 1 < argc && bt_cli_parse_int(argv[i + 1], 0, 1000000, &v)) {
            progress_us = v;
            i++;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: mpirun -np 2 baton bench transport [--max BYTES] [--progress-us N]\n"
                   "Transfers of 4 KiB .. BYTES (default 64 MiB) between two ranks: a raw MPI\n"
                   "ping-pong and baton's tensor path (non-blocking send from the tensor,\n"
                   "receive into a slot posted ahead, polite wait).\n");
            return 0;
        } else {
            if (bt_cli_env_rank() == 0) fprintf(stderr, "baton bench transport: bad option '%s' (try --help)\n", argv[i]);
            return 2;
        }
    }
    bt_transport *t = NULL;
    char terr[256];
    if (bt_transport_mpi_init(&argc, &argv, (int)progress_us, &t, terr, sizeof terr) != BT_OK) {
        if (bt_cli_env_rank() == 0) fprintf(stderr, "baton bench transport: %s\n", terr);
        return 1;
    }
    if (t->size != 2) {
        if (t->rank == 0) fprintf(stderr, "baton bench transport: run it with 2 ranks (mpirun -np 2), not %d\n", t->size);
        bt_transport_mpi_finalize(t);
        return 2;
    }
    bt_context *ctx = bt_init((struct bt_init_params){2 * (size_t)max_bytes + 8192, NULL, false});
    struct bt_tensor *tensor = ctx ? bt_new_tensor_1d(ctx, BT_TYPE_F32, max_bytes / 4) : NULL;
    struct bt_tensor *slot = ctx ? bt_new_tensor_1d(ctx, BT_TYPE_F32, max_bytes / 4) : NULL;
    void *raw = NULL;
    if (!tensor || !slot || posix_memalign(&raw, 64, (size_t)max_bytes)) {
        fprintf(stderr, "baton bench transport: out of memory\n");
        t->iface.abort(t, 1);
    }
    max_bytes = (long)bt_nbytes(tensor); /* whole f32 elements */
    memset(tensor->data, 1, (size_t)max_bytes);
    memset(raw, 1, (size_t)max_bytes);
    if (t->rank == 0) {
        printf("transport: 2 ranks, one-way time = half a round trip\n");
        printf("%10s  %11s %10s  %11s %10s  %9s %10s\n", "bytes", "raw_us", "raw_GB/s", "baton_us", "baton_GB/s",
               "baton/raw", "added_us");
    }
    for (size_t bytes = 4096; bytes <= (size_t)max_bytes; bytes *= 4) {
        const int iters = iters_for(bytes);
        const double r = raw_pingpong(raw, bytes, t->rank, iters);
        const double b = baton_pingpong(t, tensor, slot, bytes, iters);
        if (t->rank == 0)
            printf("%10zu  %11.2f %10.3f  %11.2f %10.3f  %8.1f%% %10.2f\n", bytes, r * 1e6, (double)bytes / r / 1e9,
                   b * 1e6, (double)bytes / b / 1e9, 100.0 * r / b, (b - r) * 1e6);
    }
    free(raw);
    bt_free(ctx);
    bt_transport_mpi_finalize(t);
    return 0;
}

/* ---- pipeline ---------------------------------------------------------------------- */

/* The cores the ranks may run on (mpirun --bind-to core gives each one), as
 * rank 0 learns them: collective; rank 0 gets the union in *all. */
static void gather_cores(bt_transport *t, cpu_set_t *all) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_ZERO(&mine);
    cpu_set_t *sets = t->rank == 0 ? calloc((size_t)t->size, sizeof *sets) : NULL;
    if (t->rank == 0 && !sets) t->iface.abort(t, 1);
    if (t->iface.gather(t, &mine, sizeof mine, sets, 0) != BT_OK) t->iface.abort(t, 1);
    if (t->rank == 0) {
        CPU_ZERO(all);
        for (int r = 0; r < t->size; r++) CPU_OR(all, all, &sets[r]);
    }
    free(sets);
}

/* The calling thread onto `cores` (true when it moved; *own: where it was),
 * and back: rank 0 widens its cores to the ranks' union while it creates the
 * one-process run's threads and while it computes (the calling thread is
 * thread 0). */
static bool cores_widen(const cpu_set_t *cores, cpu_set_t *own) {
    const bool widen = sched_getaffinity(0, sizeof *own, own) == 0 && CPU_COUNT(cores) > 0;
    if (widen) sched_setaffinity(0, sizeof *cores, cores);
    return widen;
}
static void cores_restore(bool widened, const cpu_set_t *own) {
    if (widened) sched_setaffinity(0, sizeof *own, own);
}

/* Ranks other than 0 while rank 0 measures alone: wait for its word,
 * sleeping 1 ms between tests so that they take no core from it. */
static void wait_for_rank0(bt_transport *t) {
    int word = 0;
    bt_treq r;
    memset(&r, 0, sizeof r);
    if (t->iface.irecv(t, &word, sizeof word, 0, BT_TRANSPORT_MAX_USER_TAG, &r) != BT_OK) t->iface.abort(t, 1);
    for (;;) {
        bool done = false;
        if (bt_transport_test(t, &r, &done) != BT_OK) t->iface.abort(t, 1);
        if (done) return;
        const struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

static void release_others(bt_transport *t) {
    static const int word = 1;
    for (int r = 1; r < t->size; r++) {
        bt_treq q;
        memset(&q, 0, sizeof q);
        if (t->iface.isend(t, &word, sizeof word, r, BT_TRANSPORT_MAX_USER_TAG, &q) != BT_OK ||
            bt_transport_wait(t, &q) != BT_OK)
            t->iface.abort(t, 1);
    }
}

/* Every rank, after rank 0 measured the one-process run alone (s seconds, or
 * -1 with why): rank 0 stops the job on a failure, else lets the other
 * ranks go on; they wait for its word. */
static void rank0_measured(bt_transport *t, double s, const char *why) {
    if (t->rank != 0) {
        wait_for_rank0(t);
        return;
    }
    if (s < 0) {
        fprintf(stderr, "baton bench pipeline: one-process run: %s\n", why);
        t->iface.abort(t, 1);
    }
    release_others(t);
}

static const char *progress_name(enum bt_dist_progress p) {
    switch (p) {
    case BT_DIST_PROGRESS_COMPUTE: return "compute";
    case BT_DIST_PROGRESS_THREAD: return "thread";
    case BT_DIST_PROGRESS_NONE: return "none";
    default: return "auto";
    }
}

/* Rank 0: one row of the table, M micro-batches of `tokens` tokens each in
 * the ranks' statistics against one_s seconds in one process; bitwise: the
 * column's text, NULL for none. */
static void print_row(int P, int M, enum bt_dist_progress mode, double tokens, double one_s,
                      const struct bt_dist_stats *all, const char *bitwise) {
    double wall = 0, compute = 0;
    for (int r = 0; r < P; r++) {
        wall = all[r].wall_s > wall ? all[r].wall_s : wall;
        compute += all[r].compute_s;
    }
    const double E = compute / (P * wall), ideal = (double)M / (M + P - 1);
    const double tps = (double)M * tokens / wall, one_tps = (double)M * tokens / one_s;
    printf("%4d %4d %-8s %10.1f %10.1f %8.3f %7.3f %8.3f %7.3f %8.3f ", P, M, progress_name(mode), tps, one_tps,
           tps / one_tps, ideal, tps / one_tps / ideal, E, E / ideal);
    if (bitwise) printf("%7s  ", bitwise);
    else printf(" ");
    for (int r = 0; r < P; r++) printf(" | %.3f / %.3f / %.3f", all[r].compute_s, all[r].wait_s, all[r].wall_s);
    printf("\n");
    fflush(stdout);
}

/* ---- a GGUF model through the pipeline ---- */

/* Seconds for prompts 0..M-1, with the calling thread on `cores` for the
 * while; -1 on an error (in err). */
static double one_llm_run(struct bt_cli_prompts *o, int M, const cpu_set_t *cores, char *err, size_t n_err) {
    cpu_set_t own;
    const bool widen = cores_widen(cores, &own);
    double s = bt_now_s();
    for (int k = 0; k < M && s >= 0; k++)
        if (bt_cli_prompts_run(o, k, err, n_err) != BT_OK) s = -1;
    if (s >= 0) s = bt_now_s() - s;
    cores_restore(widen, &own);
    return s;
}

/* Every rank: M prompts through the pipeline; rank 0 keeps the last one's
 * logits in last (n_vocab floats).  Errors end the job (the runtime's rule
 * in the middle of the pipeline). */
static void model_dist_run(bt_transport *t, struct bt_model_dist *md, int64_t n, int M, int32_t *tok, float *last) {
    const int64_t V = bt_model_dist_hparams(md)->n_vocab;
    for (int k = 0; k < M; k++) {
        bt_cli_prompt_tokens(k, n, V, tok);
        if (bt_model_dist_prompt(md, n, tok, 1) != BT_OK) {
            fprintf(stderr, "baton bench pipeline: rank %d: %s\n", t->rank, bt_model_dist_error(md));
            t->iface.abort(t, 1);
        }
    }
    if (t->rank == 0 && bt_model_dist_logits(md, bt_model_dist_n_submitted(md) - 1, last) != BT_OK) {
        fprintf(stderr, "baton bench pipeline: %s\n", bt_model_dist_error(md));
        t->iface.abort(t, 1);
    }
    bt_model_dist_synchronize(md);
}


/* The token fed at decode step j (the same everywhere; no sampling). */
static int32_t decode_token(int64_t j, int64_t n_vocab) { return (int32_t)((j * 31 + 5) % n_vocab); }

/* Rank 0: seconds for a prompt of n tokens then `steps` tokens one at a
 * time in one process, each step's logits read before the next; the last
 * step's logits in o->logits.  -1 on an error. */
static double one_llm_decode(struct bt_cli_prompts *o, int64_t steps, const cpu_set_t *cores, char *err,
                             size_t n_err) {
    cpu_set_t own;
    const bool widen = cores_widen(cores, &own);
    const int64_t V = bt_llm_hparams(o->m)->n_vocab;
    double s = bt_cli_prompts_run(o, 0, err, n_err) == BT_OK ? bt_now_s() : -1;
    for (int64_t j = 0; j < steps && s >= 0; j++) {
        const int32_t tk = decode_token(j, V), ps = (int32_t)(o->n + j), sq = 0;
        const int8_t w = 1;
        const struct bt_llm_batch b = {1, &tk, &ps, &sq, &w, BT_LLM_OUT_LOGITS};
        if (bt_llm_decode(o->c, &b, o->logits, err, n_err) != BT_OK) s = -1;
    }
    if (s >= 0) s = bt_now_s() - s;
    cores_restore(widen, &own);
    return s;
}

/* Every rank: the same on the runtime; rank 0 reads each step's logits
 * before the next (as sampling would) and returns the seconds, the last
 * logits in last. */
static double model_dist_decode(bt_transport *t, struct bt_model_dist *md, int64_t n, int64_t steps, int32_t *tok,
                                float *last) {
    const int64_t V = bt_model_dist_hparams(md)->n_vocab;
    bt_cli_prompt_tokens(0, n, V, tok);
    bool ok = bt_model_dist_prompt(md, n, tok, 1) == BT_OK;
    if (ok && t->rank == 0) ok = bt_model_dist_logits(md, bt_model_dist_n_submitted(md) - 1, last) == BT_OK;
    const double t0 = bt_now_s();
    for (int64_t j = 0; j < steps && ok; j++) {
        const int32_t tk = decode_token(j, V), ps = (int32_t)(n + j), sq = 0, row = 0;
        const struct bt_model_dist_ubatch ub = {1, &tk, &ps, &sq, 1, &row, BT_LLM_OUT_LOGITS};
        ok = bt_model_dist_decode(md, &ub) == BT_OK;
        if (ok && t->rank == 0) ok = bt_model_dist_logits(md, bt_model_dist_n_submitted(md) - 1, last) == BT_OK;
    }
    const double s = bt_now_s() - t0;
    if (!ok) {
        fprintf(stderr, "baton bench pipeline: rank %d: %s\n", t->rank, bt_model_dist_error(md));
        t->iface.abort(t, 1);
    }
    bt_model_dist_synchronize(md);
    return s;
}

/* The model's prompts of n tokens through the runtime, next to one process,
 * for each M and progress mode (and a decode after a prompt).  what: the
 * model in words. */
static int bench_pipeline_model(bt_transport *t, struct bt_gguf *g, const char *what, int64_t n, int64_t decode,
                                int copies, int threads, const int *mbs, int n_mbs,
                                const enum bt_dist_progress *modes, int n_modes, int progress_us, bool ordered) {
    const int P = t->size;
    char err[1024] = "";
    bt_backend_t backend = bt_backend_cpu_init(threads);
    bt_transport *device_t = ordered ? bt_transport_ordered_new(t) : NULL;
    if (!backend || (ordered && !device_t)) {
        fprintf(stderr, "baton bench pipeline: rank %d: out of memory\n", t->rank);
        t->iface.abort(t, 1);
    }
    /* the one-process run gets every core of the ranks (see below) */
    struct bt_cli_prompts one;
    memset(&one, 0, sizeof one);
    cpu_set_t all_cores, own_cores;
    gather_cores(t, &all_cores);
    if (t->rank == 0) {
        const bool widen = cores_widen(&all_cores, &own_cores);
        const bool ok = bt_cli_prompts_init(&one, g, n, n + decode, P * threads, err, sizeof err);
        cores_restore(widen, &own_cores);
        if (!ok) {
            fprintf(stderr, "baton bench pipeline: the one-process run: %s\n", err);
            t->iface.abort(t, 1);
        }
    }
    /* equal stages: an even layer split when it divides (the model's layers:
     * not glm4moe's prediction layers, which the file holds too) */
    const struct bt_arch *arch = NULL;
    struct bt_hparams hp;
    const int n_layer = bt_llm_check_gguf(g, &arch, &hp, err, sizeof err) == BT_OK ? hp.n_layer : 0;
    int *counts = n_layer > 0 && n_layer % P == 0 ? malloc(sizeof(int) * (size_t)P) : NULL;
    for (int r = 0; counts && r < P; r++) counts[r] = n_layer / P;
    struct bt_model_dist_params mp;
    bt_model_dist_default_params(&mp);
    mp.n_ctx = n + decode;
    mp.n_ubatch = n;
    mp.dist.n_copies = copies;
    mp.dist.layers_per_rank = counts;
    mp.dist.device_transport = device_t;
    struct bt_model_dist *md = NULL;
    if (bt_model_dist_open(t, backend, g, &mp, &md, err, sizeof err) != BT_OK) {
        if (t->rank == 0) fprintf(stderr, "baton bench pipeline: %s\n", err);
        if (t->rank == 0) bt_cli_prompts_free(&one);
        free(counts);
        if (device_t) device_t->iface.free(device_t);
        bt_backend_free(backend);
        return 1;
    }
    const struct bt_hparams *h = bt_model_dist_hparams(md);
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    float *last = malloc((size_t)h->n_vocab * sizeof *last);
    struct bt_dist_stats *all = calloc((size_t)P, sizeof *all);
    if (!tok || !last || !all) t->iface.abort(t, 1);
    /* warm-up, both */
    model_dist_run(t, md, n, 2, tok, last);
    rank0_measured(t, t->rank == 0 ? one_llm_run(&one, 1, &all_cores, err, sizeof err) : 0, err);
    if (t->rank == 0) {
        const struct bt_plan *plan = bt_dist_get_plan(bt_model_dist_runtime(md));
        printf("pipeline: P = %d ranks x %d thread(s), %s (%s, %d layers, d_model %lld), prompts of %lld tokens, "
               "n_copies %d, %d splits, x over %s\n",
               P, threads, what, h->n_expert > 0 ? "MoE" : "dense", h->n_layer, (long long)h->n_embd, (long long)n,
               copies, plan->n_splits, ordered ? "the ordered transport" : "MPI (tags)");
        printf("one process: bt_llm_decode of the same prompts on rank 0 alone with %d threads on the ranks' %d cores\n",
               P * threads, CPU_COUNT(&all_cores));
        printf("%4s %4s %-8s %10s %10s %8s %7s %8s %7s %8s %7s   per rank: compute_s / wait_s / wall_s\n", "P", "M",
               "progress", "tokens/s", "1-proc", "vs_1proc", "ideal", "vs/ideal", "E", "E/ideal", "bitwise");
    }
    for (int i = 0; i < n_mbs; i++) {
        const int M = mbs[i];
        t->iface.barrier(t);
        const double one_s = t->rank == 0 ? one_llm_run(&one, M, &all_cores, err, sizeof err) : 0;
        rank0_measured(t, one_s, err);
        for (int mi = 0; mi < n_modes; mi++) {
            bt_dist_set_progress(bt_model_dist_runtime(md), modes[mi], progress_us);
            t->iface.barrier(t);
            bt_model_dist_reset_stats(md);
            model_dist_run(t, md, n, M, tok, last);
            bt_model_dist_gather_stats(md, all);
            if (t->rank == 0) {
                /* the last prompt's logits against one process's */
                const bool same = memcmp(last, one.logits, (size_t)h->n_vocab * sizeof *last) == 0;
                print_row(P, M, modes[mi], (double)n, one_s, all, same ? "yes" : "NO");
            }
        }
    }
    if (decode > 0) {
        /* one sequence token by token: the shapes it needs are planned as
         * they come (the cells read grow by 32 at a time) */
        int plans0 = 0, plans1 = 0;
        const double plan0 = bt_model_dist_plan_seconds(md, &plans0);
        t->iface.barrier(t);
        const double one_s = t->rank == 0 ? one_llm_decode(&one, decode, &all_cores, err, sizeof err) : 0;
        rank0_measured(t, one_s, err);
        t->iface.barrier(t);
        const double s = model_dist_decode(t, md, n, decode, tok, last);
        const double plan_s = bt_model_dist_plan_seconds(md, &plans1) - plan0;
        if (t->rank == 0) {
            const bool same = memcmp(last, one.logits, (size_t)h->n_vocab * sizeof *last) == 0;
            printf("decode: %lld tokens one at a time after the prompt: %.2f tokens/s, one process %.2f tokens/s "
                   "(%.3f); bitwise %s; %d shape%s planned on the way, %.1f ms (%.2f%% of the decode time)\n",
                   (long long)decode, (double)decode / s, (double)decode / one_s, one_s / s, same ? "yes" : "NO",
                   plans1 - plans0, plans1 - plans0 == 1 ? "" : "s", plan_s * 1e3, 100 * plan_s / s);
        }
    }
    BT_FREE_ALL(all, tok, last, counts);
    bt_model_dist_free(md);
    if (device_t) device_t->iface.free(device_t);
    if (t->rank == 0) bt_cli_prompts_free(&one);
    bt_backend_free(backend);
    return 0;
}

static void bp_usage(const struct bt_random_model *cfg) {
    printf("usage: mpirun -np P baton bench pipeline [options]\n"
           "Throughput of the pipeline over the launched P ranks for each M, next to\n"
           "the same model in one process on rank 0 alone with P x threads threads\n"
           "(the same cores), measured in the same run.\n"
           "      --micro-batches LIST  M values (default 1,2,4,8,16)\n"
           "      --copies N            micro-batches in flight (default 2)\n"
           "  -t, --threads N           CPU threads per rank (default 1)\n"
           "      --progress LIST       how transfers move while a rank computes, each\n"
           "                            measured in turn (default compute,thread):\n"
           "                            compute: the compute thread between ops;\n"
           "                            thread: MPI progress thread; none: only waits\n"
           "      --progress-us N       period of either (default 50; 0 = no thread)\n"
           "      --device none|ordered activations between ranks over MPI with tags\n"
           "                            (none, the default) or over the ordered\n"
           "                            transport: the NCCL path's rules (matching by\n"
           "                            posting order) on the CPU\n"
           "      --tokens N            a prompt's tokens (default 128)\n"
           "  -m, --model FILE.gguf     run this model (its whole graph split over the\n"
           "                            ranks) instead of the built-in one below\n"
           "      --decode N            then N tokens one at a time after a prompt, each\n"
           "                            step's logits read before the next\n"
           "The last prompt's logits are compared with one process's (bitwise).\n\n");
    bt_cli_model_help(stdout, cfg, false);
}

/* bench pipeline's options */
struct bp_opts {
    struct bt_random_model cfg;
    long tokens, decode;
    int copies, threads, progress_us;
    bool ordered;           /* --device ordered: activations over the ordered transport */
    const char *model_path; /* --model: a GGUF file instead of the built-in model */
    int mbs[16], n_mbs;
    /* after (progress from the compute thread) and before (a progress thread) */
    enum bt_dist_progress modes[4];
    int n_modes;
};

/* the command line: -1 to run, else the exit code (0 after --help) */
static int bp_parse(int argc, char **argv, struct bp_opts *o, bool quiet) {
    bool model_opt = false; /* a built-in model's option given */
    static const struct option longs[] = {
        {"copies", required_argument, 0, 'C'},
        {"threads", required_argument, 0, 't'},
        {"micro-batches", required_argument, 0, 'M'},
        {"progress-us", required_argument, 0, 'p'},
        {"progress", required_argument, 0, 'P'},
        {"device", required_argument, 0, 'D'},
        {"model", required_argument, 0, 'm'},
        {"decode", required_argument, 0, 'E'},
        {"tokens", required_argument, 0, 'K'},
        {"help", no_argument, 0, 'h'},
        BT_CLI_BUILTIN_MODEL_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    long v;
    char err[256];
    while ((code = bt_cli_next_opt(argc, argv, ":hm:c:t:", longs, err)) != -1) {
        if (code == 'c') {
            bt_cli_short_flag_elsewhere('c', "bench pipeline's micro-batches in flight are --copies N", err, sizeof err);
        } else if (code == 'C') {
            if (!bt_cli_parse_int(optarg, 1, BT_SCHED_MAX_COPIES, &v)) snprintf(err, sizeof err, "--copies: bad value '%s'", optarg);
            else o->copies = (int)v;
        } else if (code == 't') {
            if (!bt_cli_parse_int(optarg, 1, 4096, &v)) snprintf(err, sizeof err, "--threads: bad value '%s'", optarg);
            else if (bt_cli_threads_check(v, "--threads", err, sizeof err)) o->threads = (int)v;
        } else if (code == 'p') {
            if (!bt_cli_parse_int(optarg, 0, 1000000, &v)) snprintf(err, sizeof err, "--progress-us: bad value '%s'", optarg);
            else o->progress_us = (int)v;
        } else if (code == 'P') {
            o->n_modes = 0;
            char list[64];
            snprintf(list, sizeof list, "%s", optarg);
            for (char *save = NULL, *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
                enum bt_dist_progress p;
                if (!strcmp(w, "compute")) p = BT_DIST_PROGRESS_COMPUTE;
                else if (!strcmp(w, "thread")) p = BT_DIST_PROGRESS_THREAD;
                else if (!strcmp(w, "none")) p = BT_DIST_PROGRESS_NONE;
                else {
                    snprintf(err, sizeof err, "--progress: '%s' is not a list of compute, thread, none", optarg);
                    break;
                }
                if (o->n_modes == 4) {
                    snprintf(err, sizeof err, "--progress: '%s': at most 4 modes", optarg);
                    break;
                }
                o->modes[o->n_modes++] = p;
            }
            if (!err[0] && o->n_modes == 0) snprintf(err, sizeof err, "--progress: '%s' names no mode", optarg);
        } else if (code == 'E') {
            if (!bt_cli_parse_int(optarg, 0, 100000, &o->decode))
                snprintf(err, sizeof err, "--decode: '%s' is not an integer in [0, 100000]", optarg);
        } else if (code == 'K') {
            if (!bt_cli_parse_int(optarg, 1, 65536, &o->tokens))
                snprintf(err, sizeof err, "--tokens: '%s' is not an integer in [1, 65536]", optarg);
        } else if (code == 'm') {
            bt_cli_file_arg("--model", optarg, &o->model_path, err, sizeof err);
        } else if (code == 'D') {
            if (strcmp(optarg, "ordered") == 0 || strcmp(optarg, "none") == 0) o->ordered = strcmp(optarg, "ordered") == 0;
            else snprintf(err, sizeof err, "--device: '%s' is not none or ordered", optarg);
        } else if (code == 'M') {
            o->n_mbs = 0;
            char *s = optarg, *end;
            while (*s && o->n_mbs < 16) {
                const long m = strtol(s, &end, 10);
                if (end == s || m < 1 || m > 100000 || (*end && *end != ',')) {
                    snprintf(err, sizeof err, "--micro-batches: '%s' is not a list like 1,2,4,8,16", optarg);
                    break;
                }
                o->mbs[o->n_mbs++] = (int)m;
                s = *end ? end + 1 : end;
            }
        } else if (code == 'h') {
            if (!quiet) bp_usage(&o->cfg);
            return 0;
        } else if (code == ':' || code == '?') {
            snprintf(err, sizeof err, "bad option %s", argv[optind - 1]);
        } else if (code >= OPT_ARCH && code < OPT_MODEL_LAST) {
            bt_cli_model_option(&o->cfg, code, optarg, err, sizeof err);
            model_opt = true;
        }
        if (err[0]) {
            if (!quiet) fprintf(stderr, "baton bench pipeline: %s (try --help)\n", err);
            return 2;
        }
    }
    if (o->model_path && model_opt) {
        if (!quiet) fprintf(stderr, "baton bench pipeline: --arch, --layers, --embd and the like describe the built-in "
                            "model; --model's file has its own (try --help)\n");
        return 2;
    }
    return -1;
}

int bt_cli_bench_pipeline(int argc, char **argv) {
    /* a dense llama of 8 layers 1024 wide: compute-bound micro-batches */
    struct bp_opts o = {.tokens = 128, .copies = 2, .threads = 1, .progress_us = 50,
                         .mbs = {1, 2, 4, 8, 16}, .n_mbs = 5,
                         .modes = {BT_DIST_PROGRESS_COMPUTE, BT_DIST_PROGRESS_THREAD}, .n_modes = 2};
    struct bt_random_model *cfg = &o.cfg;
    bt_cli_model_shape(cfg, "llama", &(struct bt_cli_model_dims){8, 1024, 16, 16, 64, 2048, 256});
    const bool quiet = bt_cli_env_rank() != 0;
    const int prc = bp_parse(argc, argv, &o, quiet);
    if (prc >= 0) return prc;
    char err[256];
    if (bt_random_model_check(cfg, err, sizeof err) != BT_OK) {
        if (!quiet) fprintf(stderr, "baton bench pipeline: %s (try --help)\n", err);
        return 2;
    }
    bt_transport *t = NULL;
    if (bt_transport_mpi_init(&argc, &argv, o.progress_us, &t, err, sizeof err) != BT_OK) {
        if (!quiet && bt_cli_env_rank() == 0) fprintf(stderr, "baton bench pipeline: %s\n", err);
        return 1;
    }
    /* the file (the lowest failing rank's message, printed once), or the
     * built-in model, which every rank makes the same */
    char gerr[1024] = "", what[1100];
    struct bt_gguf *g = NULL;
    void *bytes = NULL;
    const enum bt_status st = o.model_path ? bt_rank_agree(t, bt_gguf_open(o.model_path, &g, gerr, sizeof gerr),
                                                           NULL, gerr, sizeof gerr)
                                           : bt_cli_model_open(cfg, t, &g, &bytes, gerr, sizeof gerr);
    int rc = 1;
    if (st != BT_OK) {
        if (t->rank == 0) fprintf(stderr, "baton bench pipeline: %s\n", gerr);
    } else {
        if (o.model_path) snprintf(what, sizeof what, "%s", o.model_path);
        else snprintf(what, sizeof what, "the built-in %s model, %s weights", cfg->arch, bt_type_name(cfg->type));
        rc = bench_pipeline_model(t, g, what, o.tokens, o.decode, o.copies, o.threads, o.mbs, o.n_mbs, o.modes,
                                  o.n_modes, o.progress_us, o.ordered);
    }
    bt_gguf_close(g);
    free(bytes);
    bt_transport_mpi_finalize(t);
    return rc;
}
