/* bench_model.c - `baton bench model -m FILE [-p N] [-n N] [-r N]`: prompt
 * processing and generation speed of a GGUF model through the engine
 * (src/run/engine.h), in llama-bench's table (model, size, params, backend,
 * ranks, threads, test, t/s +- sd) or as JSON.  Runs on one process or under
 * mpirun like `baton generate` (the same bring-up: topology or plain mpirun).
 *
 * What is timed, as llama-bench does it (random token ids, no sampling):
 *   ppN  per repetition, S sequences (--seqs) of N prompt tokens each, split
 *        into ubatches of --ubatch tokens, submitted with up to the engine's
 *        ubatches in flight (P ranks work on P ubatches at once), only each
 *        prompt's last row of logits asked for and collected (as
 *        llama-bench's llama_batch_get_one: the other ubatches skip the
 *        output projection); t/s = S N / seconds;
 *   tgN  per repetition, N steps of one token per sequence (S ubatches of one
 *        token in flight, all collected before the next step), from an empty
 *        cache; t/s = S N / seconds.
 * One warm-up repetition of each test runs first and is not counted; the
 * cache is emptied between repetitions.  --json adds, per test, the timed
 * repetitions' wall seconds and each rank's seconds in graph compute in them
 * (bt_engine_compute_seconds: the stages' own figures, carried back with the
 * answers), so that a pipeline's imbalance shows without a profiler.
 *
 * --profile: where rank 0's time went in the timed tgN steps (the ppN
 * ubatches when -n is 0), per op and weight type (the CPU executor's
 * profile, backends/cpu/cpu.h), printed after the results: a step's
 * accounting without a profiler. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "baton/backend.h"
#include "baton/cpu.h"
#include "../mem.h"
#include "cli.h"
#include "common.h"
#include "gguf.h"
#include "run/engine.h"
#include "signals.h"

#define BM_PROG "baton bench model"

struct bm_opts {
    const char *model;
    long n_prompt, n_gen, reps, n_ubatch, seqs, inflight;
    struct bt_cli_engine_opts eng;
    bool json, profile, per_rank;
};

enum { OPT_BM_UBATCH = 2000, OPT_BM_SEQS, OPT_BM_INFLIGHT, OPT_BM_JSON, OPT_BM_PROFILE, OPT_BM_PER_RANK };

static void bm_usage(FILE *f) {
    fprintf(f,
            "usage: baton bench model -m FILE [options]      (also under mpirun / launch/baton-run)\n"
            "\n"
            "Prompt processing (ppN) and generation (tgN) tokens per second of a GGUF model,\n"
            "as llama-bench measures them (random tokens, no sampling), in its table form.\n"
            "\n"
            "  -m, --model FILE        the GGUF model (required)\n"
            "  -p, --n-prompt N        prompt tokens per sequence, 0: no pp test (default 512)\n"
            "  -n, --n-gen N           generated tokens per sequence, 0: no tg test (default 128)\n"
            "  -r, --repetitions N     timed repetitions of each test (default 5)\n"
            "      --ubatch N          most tokens in one ubatch (default 512)\n"
            "      --seqs S            sequences processed together (default 1)\n"
            "      --inflight N        ubatches in flight through the ranks (default: ranks x copies)\n"
            "      --json              one JSON object per test instead of the table\n"
            "      --per-rank          then each rank's time per token over the run (compute, of it\n"
            "                          an expert group's experts, waits) and bytes sent, received\n"
            "                          and of experts read\n"
            "      --profile           then rank 0's time in the tg steps (with -n 0: the pp\n"
            "                          ubatches) per op and weight type\n"
            "                          (CPU backend): ms per step, barrier waits, weight GB/s\n");
    bt_cli_engine_help(f, 26);
    fprintf(f, "  -h, --help              this text\n");
}

/* 0: help; 2 and a message: a bad option; 1: go */
static int bm_parse(int argc, char **argv, struct bm_opts *o, char *err, size_t errn) {
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},        {"n-prompt", required_argument, 0, 'p'},
        {"n-gen", required_argument, 0, 'n'},        {"repetitions", required_argument, 0, 'r'},
        {"ubatch", required_argument, 0, OPT_BM_UBATCH},
        {"seqs", required_argument, 0, OPT_BM_SEQS}, {"inflight", required_argument, 0, OPT_BM_INFLIGHT},
        {"json", no_argument, 0, OPT_BM_JSON},       {"profile", no_argument, 0, OPT_BM_PROFILE},
        {"per-rank", no_argument, 0, OPT_BM_PER_RANK},
        BT_CLI_ENGINE_LONGOPTS,
        {"help", no_argument, 0, 'h'},               {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    long v;
#define NUM(FLAG, LO, HI, DST)                                                                               \
    do {                                                                                                     \
        if (!bt_cli_parse_int(optarg, (LO), (HI), &v))                                                       \
            snprintf(err, errn, "%s: '%s' is not an integer in [%ld, %ld]", (FLAG), optarg, (long)(LO), (long)(HI)); \
        else                                                                                                 \
            (DST) = v;                                                                                       \
    } while (0)
    while ((code = bt_cli_next_engine_opt(argc, argv, ":m:p:n:r:t:h", longs, &o->eng, err, errn)) != -1) {
        switch (code) {
        case 0: break;
        case 'm':
            if (!*optarg) snprintf(err, errn, "-m: the file name is empty (try: " BM_PROG " --help)");
            else o->model = optarg;
            break;
        case 'p': NUM("-p", 0, 1L << 20, o->n_prompt); break;
        case 'n': NUM("-n", 0, 1L << 20, o->n_gen); break;
        case 'r': NUM("-r", 1, 1000, o->reps); break;
        case OPT_BM_UBATCH: NUM("--ubatch", 1, 65536, o->n_ubatch); break;
        case OPT_BM_SEQS: NUM("--seqs", 1, 1024, o->seqs); break;
        case OPT_BM_INFLIGHT: NUM("--inflight", 1, 1024, o->inflight); break;
        case OPT_BM_JSON: o->json = true; break;
        case OPT_BM_PROFILE: o->profile = true; break;
        case OPT_BM_PER_RANK: o->per_rank = true; break;
        case 'h': return 0;
        case ':': snprintf(err, errn, "%s needs a value", argv[optind - 1]); break;
        default: snprintf(err, errn, "unknown option '%s' (try: " BM_PROG " --help)", argv[optind - 1]); break;
        }
        if (err[0]) return 2;
    }
#undef NUM
    if (optind < argc) {
        snprintf(err, errn, "unexpected argument '%s' (try: " BM_PROG " --help)", argv[optind]);
        return 2;
    }
    if (!o->model) {
        snprintf(err, errn, "-m FILE: the model is required (try: " BM_PROG " --help)");
        return 2;
    }
    if (o->n_prompt == 0 && o->n_gen == 0) {
        snprintf(err, errn, "-p 0 and -n 0: nothing to measure");
        return 2;
    }
    return 1;
}

/* The model's column of the table: architecture and the weight type holding
 * the most bytes ("mix" when other quantised types are there too); size in
 * bytes and parameters. */
struct bm_model {
    char desc[96];
    uint64_t bytes, params;
};

static void bm_describe(struct bt_gguf *g, const char *arch, struct bm_model *m) {
    uint64_t by_type[BT_TYPE_COUNT + 1] = {0};
    m->bytes = m->params = 0;
    for (int64_t i = 0; i < bt_gguf_n_tensors(g); i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        uint64_t n = 1;
        for (int d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
        m->params += n;
        m->bytes += t->size;
        by_type[t->type <= BT_TYPE_COUNT ? t->type : BT_TYPE_COUNT] += t->size;
    }
    int top = BT_TYPE_F32, quantised = 0;
    for (int ty = 0; ty < BT_TYPE_COUNT; ty++) {
        if (by_type[ty] > by_type[top]) top = ty;
        if (by_type[ty] && bt_blck_size((enum bt_type)ty) > 1) quantised++;
    }
    const bool mix = quantised > 1 || (quantised == 1 && bt_blck_size((enum bt_type)top) == 1);
    const char *params_unit = m->params >= 1000000000ull ? "B" : "M";
    const double params_v = (double)m->params / (m->params >= 1000000000ull ? 1e9 : 1e6);
    snprintf(m->desc, sizeof m->desc, "%s %.2f%s %s%s", arch, params_v, params_unit, bt_type_name((enum bt_type)top),
             mix ? " mix" : "");
}

/* One test's results (t/s of each repetition). */
struct bm_result {
    char test[32];
    int64_t n_prompt, n_gen;
    double *ts;
    int n;
    double wall_s;  /* of the timed repetitions */
    double *rank_s; /* [P]: each rank's seconds in graph compute in them */
};

/* Per rank over the run: compute (of it an expert group's chains), waits,
 * bytes sent (of them a group's rows) and received, expert bytes read; per
 * token of rank 0 (the tokens the model processed). */
static void bm_print_ranks(const struct bt_engine *e, const struct bt_engine_stats *all, int P) {
    const double tok = all[0].tokens > 0 ? (double)all[0].tokens : 1.0;
    printf("\nper rank over the run (%llu tokens; per token: ms, KiB and pairs):\n", (unsigned long long)all[0].tokens);
    printf("%4s  %10s  %10s  %10s  %10s  %10s  %10s  %12s  %12s  %s\n", "rank", "compute", "experts", "other", "wait",
           "sent", "received", "experts_KiB", "expert_pairs", "backend");
    for (int r = 0; r < P; r++) {
        const struct bt_engine_stats *s = &all[r];
        printf("%4d  %10.3f  %10.3f  %10.3f  %10.3f  %10.1f  %10.1f  %12.1f  %12.2f  %s\n", r, 1e3 * s->compute_s / tok,
               1e3 * s->expert_s / tok, 1e3 * (s->compute_s - s->expert_s) / tok, 1e3 * s->wait_s / tok,
               (double)s->bytes_sent / tok / 1024.0, (double)s->bytes_received / tok / 1024.0,
               (double)s->expert_bytes_read / tok / 1024.0, (double)s->expert_pairs / tok,
               bt_engine_rank_backend(e, r));
    }
}

static void bm_stats(const struct bm_result *r, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < r->n; i++) s += r->ts[i];
    *mean = s / r->n;
    for (int i = 0; i < r->n; i++) s2 += (r->ts[i] - *mean) * (r->ts[i] - *mean);
    *sd = r->n > 1 ? sqrt(s2 / (r->n - 1)) : 0.0;
}

struct bm_run {
    struct bt_engine *e;
    const struct bm_opts *o;
    int64_t n_vocab;
    float *logits;
    int32_t *tok, *pos, *seq;
    int8_t *want; /* the rows asked for */
    uint64_t rng;
    int limit; /* ubatches submitted and not collected, at most */
};

static int32_t bm_token(struct bm_run *b) {
    b->rng = b->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((b->rng >> 33) % (uint64_t)b->n_vocab);
}

static enum bt_status bm_collect(struct bm_run *b) {
    uint64_t id;
    int64_t n_out;
    return bt_engine_collect(b->e, &id, b->logits, &n_out);
}

/* n tokens of sequence seq from position pos0; rows: whether the last one
 * asks for its logits (no row of the others does) */
static enum bt_status bm_submit(struct bm_run *b, int64_t n, int32_t seq, int32_t pos0, bool rows) {
    while (bt_engine_n_inflight(b->e) >= b->limit) {
        const enum bt_status st = bm_collect(b);
        if (st != BT_OK) return st;
    }
    for (int64_t i = 0; i < n; i++) {
        b->tok[i] = bm_token(b);
        b->pos[i] = pos0 + (int32_t)i;
        b->seq[i] = seq;
        b->want[i] = rows && i == n - 1;
    }
    const struct bt_llm_batch ub = {.n_tokens = n, .token = b->tok, .pos = b->pos, .seq = b->seq, .logits = b->want};
    uint64_t id;
    return bt_engine_submit(b->e, &ub, &id);
}

static enum bt_status bm_drain(struct bm_run *b) {
    while (bt_engine_n_inflight(b->e) > 0) {
        const enum bt_status st = bm_collect(b);
        if (st != BT_OK) return st;
    }
    return BT_OK;
}

/* One repetition of a test; *tps its tokens/s. */
static enum bt_status bm_rep(struct bm_run *b, bool pp, double *tps) {
    const struct bm_opts *o = b->o;
    enum bt_status st = BT_OK;
    const double t0 = bt_now_s();
    if (pp) {
        /* as llama-bench: the logits of each prompt's last token only */
        for (int32_t s = 0; s < o->seqs && st == BT_OK; s++)
            for (int64_t p = 0; p < o->n_prompt && st == BT_OK; p += o->n_ubatch)
                st = bm_submit(b, o->n_prompt - p < o->n_ubatch ? o->n_prompt - p : o->n_ubatch, s, (int32_t)p,
                               p + o->n_ubatch >= o->n_prompt);
    } else {
        for (int64_t i = 0; i < o->n_gen && st == BT_OK; i++) {
            for (int32_t s = 0; s < o->seqs && st == BT_OK; s++) st = bm_submit(b, 1, s, (int32_t)i, true);
            if (st == BT_OK) st = bm_drain(b);
        }
    }
    if (st == BT_OK) st = bm_drain(b);
    const double dt = bt_now_s() - t0;
    for (int32_t s = 0; s < o->seqs && st == BT_OK; s++) st = bt_engine_seq_rm(b->e, s);
    *tps = (double)o->seqs * (double)(pp ? o->n_prompt : o->n_gen) / (dt > 0 ? dt : 1e-9);
    return st;
}

static void bm_print(const struct bm_opts *o, const struct bm_model *m, const char *backend, int P, int threads,
                     const struct bm_result *res, int n_res) {
    if (o->json) {
        for (int i = 0; i < n_res; i++) {
            double mean, sd;
            bm_stats(&res[i], &mean, &sd);
            printf("{\"model\": ");
            bt_cli_json_str(stdout, m->desc, strlen(m->desc));
            printf(", \"model_file\": ");
            bt_cli_json_str(stdout, o->model, strlen(o->model));
            printf(", \"size\": %llu, \"params\": %llu, \"backend\": \"%s\", \"ranks\": %d, \"threads\": %d, "
                   "\"n_ubatch\": %ld, \"seqs\": %ld, \"test\": \"%s\", \"n_prompt\": %lld, \"n_gen\": %lld, "
                   "\"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"samples_ts\": [",
                   (unsigned long long)m->bytes, (unsigned long long)m->params, backend, P, threads, o->n_ubatch,
                   o->seqs, res[i].test, (long long)res[i].n_prompt, (long long)res[i].n_gen, mean, sd);
            for (int j = 0; j < res[i].n; j++) printf("%s%.6f", j ? ", " : "", res[i].ts[j]);
            printf("], \"wall_s\": %.6f, \"rank_compute_s\": [", res[i].wall_s);
            for (int r = 0; r < P; r++) printf("%s%.6f", r ? ", " : "", res[i].rank_s[r]);
            printf("]}\n");
        }
        return;
    }
    printf("| %-28s | %10s | %8s | %-7s | %5s | %7s | %12s | %20s |\n", "model", "size", "params", "backend", "ranks",
           "threads", "test", "t/s");
    /* llama-bench's alignment row: ':' at the right of right-aligned columns */
    static const int width[8] = {28, 10, 8, 7, 5, 7, 12, 20};
    static const bool right[8] = {false, true, true, false, true, true, true, true};
    for (int c = 0; c < 8; c++) {
        printf("| ");
        for (int i = 0; i < width[c] - (right[c] ? 1 : 0); i++) putchar('-');
        printf(right[c] ? ": " : " ");
    }
    printf("|\n");
    for (int i = 0; i < n_res; i++) {
        double mean, sd;
        bm_stats(&res[i], &mean, &sd);
        char size[32], params[32], ts[48];
        snprintf(size, sizeof size, "%.2f GiB", (double)m->bytes / (1024.0 * 1024.0 * 1024.0));
        if (m->params >= 1000000000ull) snprintf(params, sizeof params, "%.2f B", (double)m->params / 1e9);
        else snprintf(params, sizeof params, "%.2f M", (double)m->params / 1e6);
        snprintf(ts, sizeof ts, "%.2f ± %.2f", mean, sd);
        printf("| %-28s | %10s | %8s | %-7s | %5d | %7d | %12s | %20s |\n", m->desc, size, params, backend, P, threads,
               res[i].test, ts);
    }
}

/* The profile's rows, most compute first, per step (graph). */
static int bm_prof_cmp(const void *x, const void *y) {
    const double a = ((const struct bt_cpu_op_profile *)x)->compute_s, b = ((const struct bt_cpu_op_profile *)y)->compute_s;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Per step (tg) or ubatch (pp): units of them timed, in n_graphs graph
 * runs of graph_s seconds in all (a rank that waits for a group's members
 * runs several a step). */
static void bm_print_profile(const struct bm_opts *o, struct bt_cpu_op_profile *rows, int n, uint64_t n_graphs,
                             uint64_t units, double graph_s) {
    if (n_graphs == 0 || units == 0) {
        printf(o->json ? "{\"profile\": null, \"why\": \"rank 0 computed no graph\"}\n"
                       : "\nprofile: rank 0 computed no graph (it holds no layer)\n");
        return;
    }
    qsort(rows, (size_t)n, sizeof *rows, bm_prof_cmp);
    const double g = (double)units, step_ms = 1e3 * graph_s / g;
    const char *unit = o->n_gen ? "step" : "ubatch", *plural = o->n_gen ? "steps" : "ubatches";
    double sum_c = 0, sum_w = 0, sum_b = 0;
    if (!o->json) {
        char runs[64] = "";
        if (n_graphs != units) snprintf(runs, sizeof runs, " (%llu graph runs)", (unsigned long long)n_graphs);
        printf("\nprofile of rank 0's %s%ld %s: %llu %s%s, %.3f ms a %s; per %s, thread 0's time:\n",
               o->n_gen ? "tg" : "pp", o->n_gen ? o->n_gen : o->n_prompt, plural, (unsigned long long)units,
               units == 1 ? unit : plural, runs, step_ms, unit, unit);
        printf("| %-12s | %-6s | %6s | %10s | %6s | %8s | %10s | %7s |\n", "op", "type", "nodes", "compute ms", "%",
               "wait ms", "weights MB", "GB/s");
        printf("| ------------ | ------ | -----: | ---------: | -----: | -------: | ---------: | ------: |\n");
    }
    for (int i = 0; i < n; i++) {
        const struct bt_cpu_op_profile *r = &rows[i];
        const double c = 1e3 * r->compute_s / g, w = 1e3 * r->wait_s / g, mb = r->weight_bytes / g / 1e6;
        const double gbs = r->compute_s > 0 && r->weight_bytes > 0 ? r->weight_bytes / r->compute_s / 1e9 : 0.0;
        sum_c += c;
        sum_w += w;
        sum_b += mb;
        if (o->json)
            printf("{\"profile\": {\"test\": \"%s%ld\", \"op\": \"%s\", \"type\": \"%s\", \"nodes\": %.3f, "
                   "\"compute_ms\": %.6f, \"wait_ms\": %.6f, \"weight_mb\": %.6f, \"step_ms\": %.6f}}\n",
                   o->n_gen ? "tg" : "pp", o->n_gen ? o->n_gen : o->n_prompt, bt_op_name(r->op),
                   bt_type_name(r->type), (double)r->count / g, c, w, mb, step_ms);
        else if (mb > 0)
            printf("| %-12s | %-6s | %6.1f | %10.3f | %6.1f | %8.3f | %10.1f | %7.1f |\n", bt_op_name(r->op),
                   bt_type_name(r->type), (double)r->count / g, c, 100.0 * c / step_ms, w, mb, gbs);
        else
            printf("| %-12s | %-6s | %6.1f | %10.3f | %6.1f | %8.3f | %10s | %7s |\n", bt_op_name(r->op),
                   bt_type_name(r->type), (double)r->count / g, c, 100.0 * c / step_ms, w, "", "");
    }
    if (!o->json)
        printf("| %-12s | %-6s | %6s | %10.3f | %6.1f | %8.3f | %10.1f | %7s |\n", "all", "", "", sum_c,
               100.0 * sum_c / step_ms, sum_w, sum_b, "");
}

#define BM_AGREE_ITEMS 10
static int bm_agree_items(const struct bm_opts *o, struct bt_cli_agree_item *it) {
    int n = 0;
    bt_cli_agree_add_where(it, &n, o->eng.topology, o->eng.backend);
    bt_cli_agree_add(it, &n, "-m", true, "%s", o->model ? o->model : "");
    bt_cli_agree_add(it, &n, "-p", true, "%ld", o->n_prompt);
    bt_cli_agree_add(it, &n, "-n", true, "%ld", o->n_gen);
    bt_cli_agree_add(it, &n, "-r", true, "%ld", o->reps);
    bt_cli_agree_add(it, &n, "--ubatch", true, "%ld", o->n_ubatch);
    bt_cli_agree_add(it, &n, "--seqs", true, "%ld", o->seqs);
    bt_cli_agree_add(it, &n, "--inflight", o->inflight > 0, "%ld", o->inflight);
    bt_cli_agree_add(it, &n, "--partition", o->eng.partition != NULL, "%s", o->eng.partition ? o->eng.partition : "");
    return n;
}

/* --profile: rank 0's rows (at most one per op and type) */
struct bm_profile {
    struct bt_cpu_op_profile *rows;
    int n;
    uint64_t graphs; /* the backend's graph runs (several a step where rank 0 waits for a group) */
    uint64_t units;  /* the timed steps (tg) or ubatches (pp) */
    double s;
};

/* rank 0: the prompt test, then the generation test, each a warm-up and o->reps timed repetitions;
 * c0 holds every rank's compute seconds before the timed ones; 0 or 1 (err said) */
static int bm_run_tests(struct bm_run *b, const struct bm_opts *o, bt_backend_t backend, int n_ranks,
                        struct bm_result *res, int *n_res, struct bm_profile *prof, double *c0, char *err,
                        size_t err_size) {
    int rc = 0;
    for (int pp = 1; pp >= 0 && !rc; pp--) {
        if ((pp ? o->n_prompt : o->n_gen) == 0) continue;
        struct bm_result *r = &res[(*n_res)++];
        snprintf(r->test, sizeof r->test, "%s%ld", pp ? "pp" : "tg", pp ? o->n_prompt : o->n_gen);
        r->n_prompt = pp ? o->n_prompt : 0;
        r->n_gen = pp ? 0 : o->n_gen;
        double warm;
        if (bm_rep(b, pp, &warm) != BT_OK) {
            snprintf(err, err_size, "%s", bt_engine_error(b->e));
            rc = 1;
        }
        const bool profiled = o->profile && !rc && (pp ? o->n_gen == 0 : true); /* tg, else pp */
        if (profiled) bt_backend_cpu_set_profile(backend, true);
        bt_engine_compute_seconds(b->e, c0);
        const double w0 = bt_now_s();
        for (r->n = 0; r->n < o->reps && !rc; r->n++)
            if (bm_rep(b, pp, &r->ts[r->n]) != BT_OK) {
                snprintf(err, err_size, "%s", bt_engine_error(b->e));
                rc = 1;
            }
        r->wall_s = bt_now_s() - w0;
        bt_engine_compute_seconds(b->e, r->rank_s); /* every answer is in: the last rep drained */
        for (int k = 0; k < n_ranks; k++) r->rank_s[k] -= c0[k];
        if (profiled) {
            prof->n = bt_backend_cpu_get_profile(backend, prof->rows, BT_OP_COUNT * BT_TYPE_COUNT, &prof->graphs,
                                                 &prof->s);
            prof->units = (uint64_t)r->n * (uint64_t)(pp ? o->seqs * ((o->n_prompt + o->n_ubatch - 1) / o->n_ubatch)
                                                         : o->n_gen);
            bt_backend_cpu_set_profile(backend, false);
        }
    }
    return rc;
}

int bt_cli_bench_model(int argc, char **argv) {
    struct bm_opts o = {.n_prompt = 512, .n_gen = 128, .reps = 5, .n_ubatch = 512, .seqs = 1};
    const int env_rank = bt_cli_start(BM_PROG);
    char perr[1024] = "";
    int prc = bm_parse(argc, argv, &o, perr, sizeof perr);
    if (prc == 0) return bt_cli_help(env_rank, bm_usage);
    if (prc == 1) prc = 0;
    if (!bt_cli_engine_finish(&o.eng, prc ? NULL : perr, sizeof perr) && !prc) prc = 2;
    const struct bt_rank_config rcfg = bt_cli_engine_rank_config(BM_PROG, &o.eng, 0);
    struct bt_rank R;
    if (!bt_cli_rank_start(&R, &rcfg, env_rank, &prc, perr, sizeof perr, &argc, &argv)) return prc;
    bt_transport *t = R.t;
    const int P = R.size, rank = R.rank;
    int rc = 0;
    char err[1024] = "";
    struct bt_engine *e = NULL;
    struct bm_run b = {0};
    struct bm_result res[2];
    double *c0 = NULL; /* rank_compute_s before the timed repetitions */
    memset(res, 0, sizeof res);
    int n_res = 0;
    struct bm_profile prof = {0};

    struct bt_cli_agree_item items[BM_AGREE_ITEMS];
    BT_ASSERT(bm_agree_items(&o, items) == BM_AGREE_ITEMS);
    rc = bt_cli_rank_agree(&R, &rcfg, prc, perr, sizeof perr, items, BM_AGREE_ITEMS, err, sizeof err);
    if (rc != 0) goto out;

    struct bt_engine_params ep;
    bt_engine_default_params(&ep);
    ep.model = o.model;
    ep.n_seq_max = (int)o.seqs;
    const long per_seq = o.n_prompt > o.n_gen ? o.n_prompt : o.n_gen;
    ep.n_ctx = o.seqs * per_seq;
    ep.n_ubatch = o.n_ubatch < per_seq ? o.n_ubatch : per_seq;
    ep.max_inflight = (int)o.inflight;
    ep.mmap = o.eng.mmap;
    if (bt_engine_open(&R, &ep, &e, err, sizeof err) != BT_OK) {
        rc = 1;
        goto out;
    }
    if (rank == 0) {
        b.e = e;
        b.o = &o;
        b.n_vocab = bt_engine_hparams(e)->n_vocab;
        b.rng = 0x5eed;
        b.limit = 4 * P + 16 + (int)o.inflight;
        b.logits = malloc((size_t)ep.n_ubatch * (size_t)b.n_vocab * sizeof(float));
        b.tok = malloc((size_t)ep.n_ubatch * sizeof(int32_t));
        b.pos = malloc((size_t)ep.n_ubatch * sizeof(int32_t));
        b.seq = malloc((size_t)ep.n_ubatch * sizeof(int32_t));
        b.want = malloc((size_t)ep.n_ubatch);
        for (int i = 0; i < 2; i++) {
            res[i].ts = calloc((size_t)o.reps, sizeof(double));
            res[i].rank_s = calloc((size_t)P, sizeof(double));
        }
        c0 = calloc((size_t)P, sizeof(double));
        if (o.profile) prof.rows = calloc((size_t)BT_OP_COUNT * BT_TYPE_COUNT, sizeof *prof.rows);
        if (!b.logits || !b.tok || !b.pos || !b.seq || !b.want || !res[0].ts || !res[1].ts || !res[0].rank_s ||
            !res[1].rank_s || !c0 || (o.profile && !prof.rows)) {
            snprintf(err, sizeof err, "out of memory for %lld rows of logits", (long long)ep.n_ubatch);
            rc = 1;
        }
        if (!rc && o.profile && !bt_backend_is_cpu(R.backend)) {
            snprintf(err, sizeof err, "--profile: rank 0 runs on %s; only the CPU backend is profiled",
                     bt_backend_name(R.backend));
            rc = 1;
        }
        if (!rc) rc = bm_run_tests(&b, &o, R.backend, P, res, &n_res, &prof, c0, err, sizeof err);
        if (bt_engine_stop(e) != BT_OK && !rc) {
            snprintf(err, sizeof err, "%s", bt_engine_error(e));
            rc = 1;
        }
        if (!rc) {
            struct bm_model m;
            bm_describe(bt_engine_gguf(e), bt_engine_arch(e)->name, &m);
            bm_print(&o, &m, bt_backend_name(R.backend), P, R.threads, res, n_res);
            if (o.profile) bm_print_profile(&o, prof.rows, prof.n, prof.graphs, prof.units, prof.s);
            if (fflush(stdout) != 0) {
                snprintf(err, sizeof err, "writing the output: %s", strerror(errno));
                rc = 1;
            }
        }
    } else if (bt_engine_serve(e) != BT_OK) {
        snprintf(err, sizeof err, "%s", bt_engine_error(e));
        rc = 1;
    }
    /* --per-rank: where each rank's time went over the whole run (the
     * warm-up repetitions too), per token of rank 0 */
    if (o.per_rank && !o.json) {
        struct bt_engine_stats *all = rank == 0 ? calloc((size_t)P, sizeof *all) : NULL;
        if (bt_engine_gather_stats(e, all) == BT_OK && all && !rc) bm_print_ranks(e, all, P);
        free(all);
    }
    int64_t rcv = rc;
    t->iface.allreduce_max(t, &rcv, 1);
    rc = (int)rcv;

out:
    if (err[0] && rank == 0) fprintf(stderr, BM_PROG ": %s\n", err);
    BT_FREE_ALL(b.logits, b.tok, b.pos, b.seq, b.want, res[0].ts, res[1].ts, res[0].rank_s, res[1].rank_s, c0,
                prof.rows);
    bt_engine_close(e);
    bt_cli_rank_end(&R, rc);
    return rc;
}
