/* demo.c - `baton demo`: the built-in main job.  A model (a GGUF file, or a
 * random-weight MoE model made in memory) runs over the ranks the program was
 * launched with on the distributed runtime, M prompts as micro-batches
 * through the pipeline; rank 0 prints per-rank statistics, tokens per second,
 * the bubble fraction, and whether the logits equal a one-process run. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <limits.h>

#include "agree.h"
#include "baton/baton.h"
#include "cli.h"
#include "common.h"
#include "dump_tensors.h"
#include "outfile.h"
#include "signals.h"
#include "run/bringup.h"
#include "run/model_dist.h"
#include "transport.h"

struct demo_opts {
    struct bt_random_model model; /* the model made in memory when no --model */
    int tokens;                   /* --tokens: a prompt's (a micro-batch's) tokens */
    const char *topology;
    int micro_batches;
    int copies;   /* 0: the topology's, else 2 */
    int threads;  /* 0: the topology's, else cores / ranks on the node */
    int progress_us;
    int check;    /* -1: on small models, 0 no, 1 yes */
    const char *trace;
    const char *partition; /* "auto" or "a,b,c" */
    bool json;
    bool verbose;
    const char *backend; /* --backend: "cpu" or "cuda" (no topology), NULL: not given */
    const char *dump_plan; /* --dump-plan FILE: the plan as text (bt_plan_dump) */
    double rank_gflops;    /* --rank-gflops: every rank's speed for the plan (0: measured) */
    const char *model_path; /* --model FILE.gguf: its prompts instead of the built-in model */
    const char *dump_tensors; /* --dump-tensors PATTERN */
    bool model_opt;         /* a built-in model's option given */
};

static void demo_usage(FILE *f, const struct demo_opts *o) {
    fprintf(f,
            "usage: baton demo [options]\n"
            "       mpirun -np N baton demo [options]\n"
            "       launch/baton-run -t TOPOLOGY -- baton demo [options]\n"
            "\n"
            "Runs a model across the ranks it was launched with (one backend per rank):\n"
            "its whole graph split over the ranks, M prompts of --tokens tokens as\n"
            "micro-batches through the pipeline.  Prints per-rank statistics, tokens per\n"
            "second, the bubble fraction and whether the logits equal one process's.\n"
            "The model is --model's file, else one with random weights made in memory\n"
            "from the options below (every rank makes the same).\n"
            "\n"
            "run:\n"
            "      --topology FILE   topology file (default: $BATON_TOPOLOGY, else ranks on\n"
            "                        --backend)\n"
            "      --backend B       without a topology: cpu (default), or cuda: each rank\n"
            "                        on a GPU (node-local rank mod GPUs), NCCL between the\n"
            "                        GPUs when no two ranks share one, else MPI\n"
            "      --micro-batches M micro-batches (prompts) to run (default %d)\n"
            "      --tokens N        a prompt's tokens [1, 65536]     (default %d)\n"
            "      --copies N        micro-batches in flight (n_copies, 1-%d; default: the\n"
            "                        topology's, else 2)\n"
            "  -t, --threads N       CPU threads per rank (default: the topology's, else the\n"
            "                        node's cores divided among its ranks)\n"
            "      --partition P     auto, or layer counts per rank: 4,4 (default: topology's)\n"
            "      --check / --no-check  compare with a one-rank run (default: when the model\n"
            "                        has at most 512 MiB of weights)\n"
            "      --trace FILE      write a Chrome trace (open it in Perfetto)\n"
            "      --json            statistics as JSON on stdout\n"
            "      --progress-us N   MPI progress thread period, 0 = none (default %d)\n"
            "      --dump-plan FILE  write the plan as text (as `baton plan --dump-plan`)\n"
            "      --rank-gflops X   plan with this speed for every rank instead of measuring\n"
            "                        it (measurements vary between runs; this reproduces a plan)\n"
            "  -m, --model FILE.gguf run this model instead of the built-in one below\n"
            "      --dump-tensors PATTERN  each computed node whose name matches\n"
            "                        PATTERN (a glob, e.g. 'blk.*.out') on stderr, from the\n"
            "                        rank that computes it: shape, min, max, mean, hash\n"
            "  -v, --verbose         print the plan\n"
            "  -h, --help            this text\n"
            "\n",
            o->micro_batches, o->tokens, BT_SCHED_MAX_COPIES, o->progress_us);
    bt_cli_model_help(f, &o->model, false);
}

/* ---- option parsing ------------------------------------------------------------ */

enum {
    OPT_TOPOLOGY = OPT_MODEL_LAST + 1,
    OPT_MICRO_BATCHES,
    OPT_COPIES,
    OPT_PARTITION,
    OPT_CHECK,
    OPT_NO_CHECK,
    OPT_TRACE,
    OPT_JSON,
    OPT_PROGRESS,
    OPT_BACKEND,
    OPT_DUMP_PLAN,
    OPT_RANK_GFLOPS,
    OPT_DUMP_TENSORS,
    OPT_TOKENS
};

/* 0: --help; 2: a bad flag or value, the message in err; -1: go on. */
static int parse_demo(int argc, char **argv, struct demo_opts *o, char *err, size_t errlen) {
    static const struct option longs[] = {
        {"topology", required_argument, 0, OPT_TOPOLOGY},
        {"micro-batches", required_argument, 0, OPT_MICRO_BATCHES},
        {"copies", required_argument, 0, OPT_COPIES},
        {"threads", required_argument, 0, 't'},
        {"partition", required_argument, 0, OPT_PARTITION},
        {"check", no_argument, 0, OPT_CHECK},
        {"no-check", no_argument, 0, OPT_NO_CHECK},
        {"trace", required_argument, 0, OPT_TRACE},
        {"json", no_argument, 0, OPT_JSON},
        {"progress-us", required_argument, 0, OPT_PROGRESS},
        {"backend", required_argument, 0, OPT_BACKEND},
        {"dump-plan", required_argument, 0, OPT_DUMP_PLAN},
        {"rank-gflops", required_argument, 0, OPT_RANK_GFLOPS},
        {"model", required_argument, 0, 'm'},
        {"dump-tensors", required_argument, 0, OPT_DUMP_TENSORS},
        {"verbose", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {"tokens", required_argument, 0, OPT_TOKENS},
        BT_CLI_BUILTIN_MODEL_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    long v;
    const size_t errn = errlen;
    while ((code = bt_cli_next_opt(argc, argv, ":t:m:c:vh", longs, err)) != -1) {
        switch (code) {
        case OPT_TOPOLOGY:
            bt_cli_file_arg("--topology", optarg, &o->topology, err, errn);
            break;
        case OPT_MICRO_BATCHES:
            if (!bt_cli_parse_int(optarg, 1, 1000000, &v)) snprintf(err, errn, "--micro-batches: '%s' is not an integer in [1, 1000000]", optarg);
            else o->micro_batches = (int)v;
            break;
        case 'c': bt_cli_short_flag_elsewhere('c', "demo's micro-batches in flight are --copies N", err, errn); break;
        case OPT_COPIES:
            if (!bt_cli_parse_int(optarg, 1, BT_SCHED_MAX_COPIES, &v)) snprintf(err, errn, "--copies: '%s' is not an integer in [1, %d]", optarg, BT_SCHED_MAX_COPIES);
            else o->copies = (int)v;
            break;
        case 't':
            if (!bt_cli_parse_int(optarg, 1, 4096, &v)) snprintf(err, errn, "--threads: '%s' is not an integer in [1, 4096]", optarg);
            else if (bt_cli_threads_check(v, "--threads", err, errn)) o->threads = (int)v;
            break;
        case OPT_PARTITION: o->partition = optarg; break;
        case OPT_CHECK: o->check = 1; break;
        case OPT_NO_CHECK: o->check = 0; break;
        case OPT_TRACE:
            bt_cli_file_arg("--trace", optarg, &o->trace, err, errn);
            break;
        case OPT_JSON: o->json = true; break;
        case OPT_PROGRESS:
            if (!bt_cli_parse_int(optarg, 0, 1000000, &v)) snprintf(err, errn, "--progress-us: '%s' is not an integer in [0, 1000000]", optarg);
            else o->progress_us = (int)v;
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "cpu") == 0 || strcmp(optarg, "cuda") == 0) o->backend = optarg;
            else snprintf(err, errn, "--backend: '%s' is not cpu or cuda", optarg);
            break;
        case OPT_DUMP_PLAN:
            bt_cli_file_arg("--dump-plan", optarg, &o->dump_plan, err, errn);
            break;
        case OPT_RANK_GFLOPS: {
            char *end = NULL;
            const double g = strtod(optarg, &end);
            if (!*optarg || *end || !(g > 0 && g < 1e12))
                snprintf(err, errn, "--rank-gflops: '%s' is not a positive number", optarg);
            else o->rank_gflops = g;
            break;
        }
        case 'm':
            bt_cli_file_arg("--model", optarg, &o->model_path, err, errn);
            break;
        case OPT_DUMP_TENSORS: bt_cli_text_arg("--dump-tensors", "pattern", optarg, &o->dump_tensors, err, errn); break;
        case OPT_TOKENS:
            if (!bt_cli_parse_int(optarg, 1, 65536, &v)) snprintf(err, errn, "--tokens: '%s' is not an integer in [1, 65536]", optarg);
            else o->tokens = (int)v;
            break;
        case 'v': o->verbose = true; break;
        case 'h': return 0;
        case ':':
        case '?': bt_cli_getopt_error(code, argv, err, errn); break;
        default:
            if (code >= OPT_ARCH && code < OPT_MODEL_LAST) {
                bt_cli_model_option(&o->model, code, optarg, err, errn);
                o->model_opt = true;
            }
            break;
        }
        if (bt_cli_try_help("demo", err, errn)) return 2;
    }
    if (bt_cli_extra_arg(argc, argv, "demo", err, errn)) return 2;
    if (o->model_path && o->model_opt) {
        snprintf(err, errn, "--arch, --layers, --embd and the like describe the built-in model; --model's file has "
                            "its own (try: baton demo --help)");
        return 2;
    }
    if (bt_random_model_check(&o->model, err, errn) != BT_OK) {
        bt_cli_try_help("demo", err, errn);
        return 2;
    }
    return -1; /* go on */
}

/* --trace FILE and --dump-plan FILE: rank 0 writes them (after the run, after
 * planning) through a temporary file beside them; find out now, not then,
 * whether it can (with the OS's reason). */
static bool out_writable(const char *opt, const char *path, char *err, size_t n) {
    const int k = snprintf(err, n, "%s ", opt);
    BT_ASSERT(k > 0 && (size_t)k < n);
    if (bt_outfile_check(path, err + k, n - (size_t)k) == BT_OK) {
        err[0] = '\0';
        return true;
    }
    return false;
}

/* What every rank must have the same of: the options that change no graph
 * (the graph hash would not see them) and the model's, named as the user
 * wrote them (after the topology's defaults, so -c 2 and a topology's
 * micro_batches: 2 agree). */
static int agree_items(const struct demo_opts *o, struct bt_cli_agree_item *it) {
    int n = 0;
    bt_cli_agree_add_where(it, &n, o->topology, o->backend);
    bt_cli_agree_add(it, &n, "--micro-batches", true, "%d", o->micro_batches);
    bt_cli_agree_add(it, &n, "--copies", true, "%d", o->copies);
    bt_cli_agree_add(it, &n, "--partition", o->partition != NULL, "%s", o->partition ? o->partition : "");
    /* writing the trace is collective; rank 0 names the file */
    bt_cli_agree_add(it, &n, "--trace", o->trace != NULL, "%s", "");
    bt_cli_agree_add(it, &n, "--model", o->model_path != NULL, "%s", o->model_path ? o->model_path : "");
    bt_cli_agree_add(it, &n, "--dump-tensors", o->dump_tensors != NULL, "%s", o->dump_tensors ? o->dump_tensors : "");
    const struct bt_random_model *m = &o->model;
    bt_cli_agree_add(it, &n, "--tokens", true, "%d", o->tokens);
    bt_cli_agree_add(it, &n, "--arch", true, "%s", m->arch);
    bt_cli_agree_add(it, &n, "--layers", true, "%d", m->n_layer);
    bt_cli_agree_add(it, &n, "--embd", true, "%lld", (long long)m->n_embd);
    bt_cli_agree_add(it, &n, "--heads", true, "%lld", (long long)m->n_head);
    bt_cli_agree_add(it, &n, "--heads-kv", true, "%lld", (long long)m->n_head_kv);
    bt_cli_agree_add(it, &n, "--head-dim", true, "%lld", (long long)m->head_dim);
    bt_cli_agree_add(it, &n, "--ff", true, "%lld", (long long)m->n_ff);
    bt_cli_agree_add(it, &n, "--experts", true, "%lld", (long long)m->n_expert);
    bt_cli_agree_add(it, &n, "--experts-used", true, "%lld", (long long)m->n_expert_used);
    bt_cli_agree_add(it, &n, "--ff-exp", true, "%lld", (long long)m->n_ff_exp);
    bt_cli_agree_add(it, &n, "--swa", true, "%lld", (long long)m->n_swa);
    bt_cli_agree_add(it, &n, "--swa-pattern", true, "%d", m->swa_pattern);
    bt_cli_agree_add(it, &n, "--n-vocab", true, "%lld", (long long)m->n_vocab);
    bt_cli_agree_add(it, &n, "--type", true, "%s", bt_type_name(m->type));
    bt_cli_agree_add(it, &n, "--seed", true, "%llu", (unsigned long long)m->seed);
    return n;
}
#define DEMO_AGREE_ITEMS 24

/* ---- the run ------------------------------------------------------------------------ */

/* what: the model in words */
static void print_stats(const struct demo_opts *o, const char *what, const struct bt_dist_stats *all, int P, int M,
                        double wall, const char *check_result, int n_threads) {
    double compute = 0;
    for (int r = 0; r < P; r++) compute += all[r].compute_s;
    const double E = wall > 0 ? compute / ((double)P * wall) : 0;
    const double ideal = (double)M / (double)(M + P - 1);
    const double tokens = (double)M * o->tokens;
    if (o->json) {
        printf("{\"ranks\": %d, \"threads_per_rank\": %d, \"micro_batches\": %d, \"n_copies\": %d, ", P,
               n_threads, M, o->copies);
        printf("\"model\": ");
        if (o->model_path) bt_cli_json_str(stdout, o->model_path, strlen(o->model_path));
        else printf("null");
        printf(", \"what\": ");
        bt_cli_json_str(stdout, what, strlen(what));
        printf(", \"tokens_per_micro_batch\": %d, \"wall_s\": %.6f, \"tokens_per_s\": %.2f, "
               "\"pipeline_efficiency\": %.4f, \"ideal_efficiency\": %.4f, \"check\": ",
               o->tokens, wall, tokens / wall, E, ideal);
        bt_cli_json_str(stdout, check_result, strlen(check_result));
        printf(", \"per_rank\": [");
        for (int r = 0; r < P; r++) {
            const struct bt_dist_stats *s = &all[r];
            printf("%s{\"rank\": %d, \"first_layer\": %d, \"last_layer\": %d, \"nodes\": %d, \"compute_s\": %.6f, "
                   "\"wait_s\": %.6f, \"send_s\": %.6f, \"wall_s\": %.6f, \"bubble\": %.4f, \"bytes_sent\": %lld, "
                   "\"bytes_direct\": %lld, \"bytes_recv\": %lld, \"weight_bytes\": %lld, \"peak_bytes\": %lld, "
                   "\"rss_bytes\": %lld, \"attn_divided\": %lld}",
                   r ? ", " : "", s->rank, s->first_layer, s->last_layer, s->n_nodes, s->compute_s, s->wait_s,
                   s->send_s, s->wall_s, s->bubble, (long long)s->bytes_sent, (long long)s->bytes_direct,
                   (long long)s->bytes_recv,
                   (long long)s->weight_bytes, (long long)s->peak_bytes, (long long)s->rss_bytes,
                   (long long)s->attn_divided);
        }
        printf("]}\n");
        return;
    }
    printf("baton demo: %s\n", what);
    printf("%d ranks x %d threads, %d micro-batches, %d in flight\n\n", P, n_threads, M, o->copies);
    printf("rank  layers   nodes  compute_s   wait_s   send_s   wall_s  bubble   sent_MiB  recv_MiB  weights_MiB  peak_MiB\n");
    for (int r = 0; r < P; r++) {
        const struct bt_dist_stats *s = &all[r];
        char layers[32];
        if (s->first_layer >= 0) snprintf(layers, sizeof layers, "%d-%d", s->first_layer, s->last_layer);
        else snprintf(layers, sizeof layers, "-");
        printf("%4d  %-7s %6d  %9.3f  %7.3f  %7.3f  %7.3f  %5.1f%%  %9.2f  %8.2f  %11.2f  %8.2f\n", r, layers,
               s->n_nodes, s->compute_s, s->wait_s, s->send_s, s->wall_s, 100 * s->bubble, s->bytes_sent / 1048576.0,
               s->bytes_recv / 1048576.0, s->weight_bytes / 1048576.0, s->peak_bytes / 1048576.0);
    }
    int64_t direct = 0, sent = 0;
    for (int r = 0; r < P; r++) {
        direct += all[r].bytes_direct;
        sent += all[r].bytes_sent;
    }
    if (direct > 0)
        printf("\nGPU to GPU over NCCL: %.2f MiB of the %.2f MiB sent (the rest over MPI)\n", direct / 1048576.0,
               sent / 1048576.0);
    /* a group's prompt attention, each rank its heads: how often, per rank */
    char divided[512] = "";
    for (int r = 0, at = 0; r < P && at < (int)sizeof divided - 64; r++)
        if (all[r].attn_divided > 0)
            at += snprintf(divided + at, sizeof divided - (size_t)at, "%s rank %d %lld", at ? "," : "", r,
                           (long long)all[r].attn_divided);
    if (divided[0]) printf("\nattention divided by heads (runs):%s\n", divided);
    printf("\nthroughput: %.1f tokens/s (%.3f s for %d micro-batches)\n", tokens / wall, wall, M);
    printf("pipeline efficiency E = %.3f (ideal M/(M+P-1) = %.3f, %.0f%% of ideal); bubble %.1f%%\n", E, ideal,
           100 * E / ideal, 100 * (1 - E));
    printf("check: %s\n", check_result);
}

/* ---- a GGUF model (--model) ---------------------------------------------------------- */

/* Rank 0: the prompts in one process (bt_llm_decode, CPU), each against the
 * pipeline's logits (bitwise). */
static bool check_model_one_rank(struct bt_gguf *g, int64_t n, const float *outs, int M, int64_t n_vocab,
                                 char *result, size_t len) {
    struct bt_progress cp;
    bt_progress_begin(&cp, true, "checking against a one-rank run");
    char err[1024] = "";
    struct bt_cli_prompts one;
    bool ok = bt_cli_prompts_init(&one, g, n, n, 0, err, sizeof err);
    int bad = -1;
    for (int k = 0; ok && k < M && bad < 0; k++) {
        ok = bt_cli_prompts_run(&one, k, err, sizeof err) == BT_OK;
        if (ok && memcmp(one.logits, outs + (size_t)k * (size_t)n_vocab, (size_t)n_vocab * sizeof(float)) != 0) bad = k;
        bt_progress_update(&cp, k + 1, M);
    }
    bt_progress_end(&cp);
    if (!ok) snprintf(result, len, "could not run the one-rank reference%s%s", err[0] ? ": " : "", err);
    else if (bad >= 0) snprintf(result, len, "FAILED: micro-batch %d differs from a one-rank run", bad);
    else snprintf(result, len, "output equals a one-rank run (%d micro-batches, bitwise)", M);
    bt_cli_prompts_free(&one);
    return ok && bad < 0;
}

/* The micro-batch being computed (--dump-tensors' lines). */
static uint64_t dist_computing(const void *md) { return (uint64_t)bt_model_dist_n_submitted(md); }

/* Every rank: --model's prompts through the runtime, then the statistics and
 * the check on rank 0.  The exit code (agreed); err: a message for rank 0. */
static int run_model(struct demo_opts *o, struct bt_rank *R, struct bt_gguf *g, char *err, size_t n_err) {
    bt_transport *t = R->t;
    const int P = R->size, rank = R->rank;
    const int64_t n = o->tokens;
    struct bt_model_dist_params mp;
    bt_model_dist_default_params(&mp);
    mp.n_ctx = n;
    mp.n_ubatch = n;
    mp.dist = R->dist;
    mp.dist.verbose = o->verbose && !o->json;
    mp.dist.gflops = o->rank_gflops;
    struct bt_progress prog;
    bt_progress_begin(&prog, rank == 0, "planning and reading weights");
    struct bt_model_dist *md = NULL;
    const enum bt_status st = bt_model_dist_open(t, R->backend, g, &mp, &md, err, n_err);
    bt_progress_end(&prog);
    if (st != BT_OK) return 1; /* agreed, err says why */
    err[0] = '\0';
    struct bt_cli_dump dump = {.pattern = o->dump_tensors, .rank = rank, .ubatch = dist_computing, .ctx = md,
                               .f = stderr};
    if (o->dump_tensors) bt_model_dist_set_eval_callback(md, bt_cli_dump_eval, &dump);
    bt_dist *d = bt_model_dist_runtime(md);
    if (o->dump_plan && rank == 0 && bt_cli_dump_plan(bt_dist_get_plan(d), o->dump_plan, "baton demo") != 0)
        t->iface.abort(t, 1);
    if (o->trace && bt_dist_enable_trace(d, 64 + o->micro_batches * 64) != BT_OK) {
        fprintf(stderr, "baton demo: %s\n", bt_dist_error(d));
        t->iface.abort(t, 1);
    }
    const struct bt_hparams *h = bt_model_dist_hparams(md);
    const int M = o->micro_batches;
    if (o->check < 0) o->check = bt_gguf_file_size(g) <= ((uint64_t)512 << 20);
    float *outs = rank == 0 ? malloc((size_t)h->n_vocab * sizeof *outs * (size_t)(o->check ? M : 1)) : NULL;
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    if ((rank == 0 && !outs) || !tok) {
        fprintf(stderr, "baton demo: rank %d: out of memory\n", rank);
        t->iface.abort(t, 1);
    }
    bt_model_dist_reset_stats(md);
    for (int k = 0; k < M; k++) {
        bt_cli_prompt_tokens(k, n, h->n_vocab, tok);
        if (bt_model_dist_prompt(md, n, tok, 1) != BT_OK) { /* a bad token: every rank the same */
            fprintf(stderr, "baton demo: rank %d: %s\n", rank, bt_model_dist_error(md));
            t->iface.abort(t, 1);
        }
        const int ready = k - (R->copies - 1);
        if (ready >= 0 && rank == 0 &&
            bt_model_dist_logits(md, ready, outs + (o->check ? (size_t)ready * (size_t)h->n_vocab : 0)) != BT_OK) {
            fprintf(stderr, "baton demo: %s\n", bt_model_dist_error(md));
            t->iface.abort(t, 1);
        }
    }
    bt_model_dist_synchronize(md);
    for (int k = M - R->copies + 1 > 0 ? M - R->copies + 1 : 0; rank == 0 && k < M; k++)
        bt_model_dist_logits(md, k, outs + (o->check ? (size_t)k * (size_t)h->n_vocab : 0));
    int rc = 0;
    struct bt_dist_stats *all = calloc((size_t)P, sizeof *all);
    if (!all) t->iface.abort(t, 1);
    bt_model_dist_gather_stats(md, all);
    if (o->trace) {
        if (bt_dist_write_trace(d, o->trace) != BT_OK) {
            if (rank == 0) fprintf(stderr, "baton demo: %s\n", bt_dist_error(d));
            rc = 1;
        } else if (rank == 0 && !o->json) {
            fprintf(stderr, "trace written to %s (open it in https://ui.perfetto.dev or chrome://tracing)\n", o->trace);
        }
    }
    char check_result[1280] = "skipped (--no-check, or the model is large)";
    if (rank == 0 && o->check &&
        !check_model_one_rank(g, n, outs, M, h->n_vocab, check_result, sizeof check_result))
        rc = 1;
    if (rank == 0) {
        double wall = 0;
        for (int r = 0; r < P; r++) wall = all[r].wall_s > wall ? all[r].wall_s : wall;
        char what[1400], moe[96] = "";
        if (h->n_expert > 0)
            snprintf(moe, sizeof moe, ", %lld experts, %lld used", (long long)h->n_expert, (long long)h->n_expert_used);
        if (o->model_path)
            snprintf(what, sizeof what, "%s (%s, %d layers, d_model %lld%s), %lld tokens per micro-batch",
                     o->model_path, bt_model_dist_arch_name(md), h->n_layer, (long long)h->n_embd, moe, (long long)n);
        else
            snprintf(what, sizeof what, "built-in %s model, %d layers, d_model %lld%s, %s weights, %lld tokens per "
                     "micro-batch", bt_model_dist_arch_name(md), h->n_layer, (long long)h->n_embd, moe,
                     bt_type_name(o->model.type), (long long)n);
        print_stats(o, what, all, P, M, wall, check_result, R->threads);
    }
    int64_t rcv = rc;
    t->iface.allreduce_max(t, &rcv, 1);
    free(all);
    free(outs);
    free(tok);
    bt_model_dist_free(md);
    bt_cli_dump_free(&dump);
    return (int)rcv;
}

int bt_cli_demo(int argc, char **argv) {
    struct demo_opts o;
    memset(&o, 0, sizeof o);
    bt_cli_model_defaults(&o.model);
    o.tokens = 64;
    o.micro_batches = 16;
    o.check = -1;
    o.progress_us = 50;
    const int env_rank = bt_cli_start("baton demo");
    /* An error found before MPI starts (prc, perr) ends a one-process run at
     * once; among several ranks it waits for MPI, so that the job ends with
     * one message naming the rank even when only rank 1 found it. */
    char perr[1024] = "";
    int prc = parse_demo(argc, argv, &o, perr, sizeof perr);
    if (prc == 0) {
        if (env_rank == 0) demo_usage(stdout, &o);
        return 0;
    }
    if (prc < 0) prc = 0;
    if (!o.topology) o.topology = getenv("BATON_TOPOLOGY");
    if (!prc && !bt_rank_backend_topology_check(o.backend, o.topology, perr, sizeof perr)) prc = 2;
    if (!prc && o.trace && env_rank == 0 && !out_writable("--trace", o.trace, perr, sizeof perr)) prc = 2;
    if (!prc && o.dump_plan && env_rank == 0 && !out_writable("--dump-plan", o.dump_plan, perr, sizeof perr)) prc = 2;

    /* --model: the file checked (its layers for the partition) before MPI */
    struct bt_gguf *gguf = NULL;
    void *bytes = NULL; /* the built-in model's file in memory */
    int n_layers = o.model.n_layer;
    if (!prc && o.model_path) {
        const struct bt_arch *arch;
        struct bt_hparams hp;
        if (bt_gguf_open(o.model_path, &gguf, perr, sizeof perr) != BT_OK ||
            bt_llm_check_gguf(gguf, &arch, &hp, perr, sizeof perr) != BT_OK)
            prc = 1;
        else
            n_layers = hp.n_layer;
    }

    /* the rank, in two steps around the ranks' agreement on their command
     * lines: the topology (or plain mpirun) and MPI; then the backend, the
     * device transport and the dist options (src/run/bringup.c) */
    const struct bt_rank_config rcfg = {
        .prog = "baton demo",
        .topology = o.topology,
        .backend = o.backend,
        .threads = o.threads,
        .copies = o.copies,
        .partition = o.partition,
        .n_layers = n_layers,
        .progress_us = o.progress_us,
    };
    struct bt_rank R;
    if (!bt_cli_rank_start(&R, &rcfg, env_rank, &prc, perr, sizeof perr, &argc, &argv)) {
        bt_gguf_close(gguf);
        return prc;
    }
    const int P = R.size, rank = R.rank;
    /* every rank takes the same path through the checks below: a failure is
     * reported once (rank 0) and every rank leaves through `out` */
    char err[1024] = "";
    if (!prc && P > BT_TOPO_MAX_RANKS) {
        snprintf(perr, sizeof perr, "%d ranks: baton runs at most %d (BT_SCHED_MAX_BACKENDS)", P, BT_TOPO_MAX_RANKS);
        prc = 1;
    }
    if (o.copies == 0) o.copies = R.have_topo ? R.topo.pipeline.micro_batches : 2;
    if (o.copies > BT_SCHED_MAX_COPIES) o.copies = BT_SCHED_MAX_COPIES;
    struct bt_cli_agree_item items[DEMO_AGREE_ITEMS];
    const int n_items = agree_items(&o, items);
    BT_ASSERT(n_items == DEMO_AGREE_ITEMS);
    int rc = bt_cli_rank_agree(&R, &rcfg, prc, perr, sizeof perr, items, n_items, err, sizeof err);
    if (rc != 0) goto out;
    o.copies = R.copies;
    /* the built-in model: every rank makes the same bytes */
    if (!gguf && bt_cli_model_open(&o.model, R.t, &gguf, &bytes, err, sizeof err) != BT_OK) {
        rc = 1;
        goto out;
    }
    rc = run_model(&o, &R, gguf, err, sizeof err);
out:
    if (err[0] && rank == 0) fprintf(stderr, "baton demo: %s\n", err);
    bt_gguf_close(gguf);
    free(bytes);
    bt_cli_rank_end(&R, rc); /* device transport, backend, topology, MPI */
    return rc;
}
