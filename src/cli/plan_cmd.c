/* plan_cmd.c - `baton plan [-m MODEL.gguf] [--topology FILE]`: the plan `baton
 * generate` runs for a GGUF model (src/run/model_plan.h: the engine's
 * placement and the splitter on the model's graph, from the file's metadata
 * alone), for a topology's declared ranks or one CPU rank on this machine.
 * Without -m, the built-in random-weight model of the model options (its
 * file header alone: a model of any size is planned without its weights).
 * CPU ranks are costed at this machine's measured single-thread mul_mat
 * speed times their threads; CUDA ranks at an assumed 400 TFLOP/s (an
 * H200-class GPU on these shapes) unless BATON_PLAN_GPU_GFLOPS says
 * otherwise.
 *
 * `baton plan --project FILE [model options]`: the throughput of the model
 * on a cluster described by FILE (src/cli/project_file.c), on paper
 * (src/project.c): per stage compute and input times, bubble, tokens/s and the
 * bottleneck for every power-of-two number of devices up to the cluster's. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/baton.h"
#include "../mem.h"
#include "cli.h"
#include "common.h"
#include "project_file.h"
#include "run/bringup.h"
#include "run/model_plan.h"

static void plan_usage(FILE *f, const struct bt_random_model *m) {
    fprintf(f,
            "usage: baton plan [-m MODEL.gguf | model options] [--topology FILE] [options]\n"
            "       baton plan --project CLUSTER.yaml [model options]\n"
            "\n"
            "The plan `baton generate` runs for the model on the topology's ranks (without\n"
            "-t: one CPU rank on this machine), from the file's metadata alone: per rank\n"
            "its layers, splits, nodes, weights, KV cache and predicted time per ubatch,\n"
            "and every transfer with its bytes per ubatch and transport.  Without -m, the\n"
            "built-in model of the options below (demo's; planned without its weights,\n"
            "so a model of any size can be).\n"
            "\n"
            "  -m, --model FILE      the GGUF model\n"
            "      --topology FILE   the ranks (default: one CPU rank of this machine)\n"
            "      --ubatch N        tokens in one ubatch (default 512)\n"
            "  -c, --ctx-size N      KV cache cells (default 4096)\n"
            "      --parallel N      sequences (default 1)\n"
            "      --partition P     auto, or layer counts per rank: 12,12 (default: the\n"
            "                        topology's)\n"
            "      --json            the plan as one JSON object\n"
            "      --dump-plan FILE  also write the plan as text (owners, splits, transfers),\n"
            "                        to compare with a live run's (generate --dump-plan)\n"
            "      --project FILE    instead: project throughput on the cluster FILE\n"
            "                        describes (configs/projection/eight-nodes-64gpu.yaml), up to\n"
            "                        4096 devices; its model section, then the options\n"
            "  -h, --help            this text\n"
            "\n");
    bt_cli_model_help(f, m, false);
}

/* --project with a decode section: for each number of hosts and of
 * sequences, a pipeline of one host a stage against expert groups of every
 * size that divides the hosts (src/project.c: bt_project_decode). */
static int project_decode(const char *path, const struct bt_cluster *c, const struct bt_random_model *cfg,
                          const struct bt_graph *graph) {
    struct bt_moe_costs mc;
    char err[512];
    if (bt_moe_costs_make(graph, c->decode.weight_bits, &mc, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        return 1;
    }
    double total = 0;
    for (int l = 0; l < mc.L + 2; l++) total += mc.dense_bytes[l];
    double experts = 0;
    for (int l = 0; l < mc.L; l++) experts += mc.expert_bytes[l] * (double)mc.n_expert;
    const double gib = 1073741824.0;
    printf("cluster %s: hosts of %s (%.1f TFLOP/s effective, %.0f GB/s memory, %.0f GiB), linked by %s (%.1f GB/s, "
           "%.1f us)\n",
           path, c->device, c->device_gflops / 1e3, c->decode.gbytes_s, (double)c->device_mem / gib, c->inter.name,
           c->inter.gbytes_s, c->inter.latency_us);
    printf("model: %d layers, %s, d_model %lld, %lld routed experts (%lld a token); weights %.1f GiB (%.1f GiB routed "
           "experts)%s\n",
           cfg->n_layer, cfg->arch, (long long)cfg->n_embd, (long long)mc.n_expert, (long long)mc.n_used,
           (total - mc.dense_bytes[0] + experts) / gib, experts / gib, c->decode.weight_bits > 0 ? "" : "");
    if (c->decode.weight_bits > 0) printf("  (every matrix at %.2f bits a weight)\n", c->decode.weight_bits);
    printf("\n%5s  %-28s %5s %11s %10s  %9s %9s %9s  %9s\n", "hosts", "layout", "seqs", "tokens/s", "step",
           "dense", "experts", "links", "host_GiB");
    int rc = 0;
    for (int hi = 0; hi < c->decode.n_hosts && !rc; hi++) {
        const int H = c->decode.hosts[hi];
        for (int si = 0; si < c->decode.n_seqs && !rc; si++) {
            const int S = c->decode.seqs[si];
            for (int group = 1; group <= H && !rc; group++) {
                if (H % group != 0 || H / group > mc.L) continue;
                struct bt_decode_projection d;
                if (bt_project_decode(&mc, c, H, group, S, &d, err, sizeof err) != BT_OK) {
                    fprintf(stderr, "baton plan: %s\n", err);
                    rc = 1;
                    break;
                }
                char lay[64];
                if (group == 1) snprintf(lay, sizeof lay, "pipeline of %d", d.stages);
                else if (d.stages == 1) snprintf(lay, sizeof lay, "one group of %d", group);
                else snprintf(lay, sizeof lay, "%d stages, groups of %d", d.stages, group);
                printf("%5d  %-28s %5d %11.2f %8.1f ms  %6.1f ms %6.1f ms %6.1f ms  %9.1f%s\n", H, lay, S, d.tokens_s,
                       d.step_s * 1e3, d.dense_s * 1e3, d.experts_s * 1e3, d.comm_s * 1e3, d.host_bytes / gib,
                       d.host_bytes > (double)c->device_mem ? "  (does not fit)" : "");
            }
        }
    }
    printf("\n(dense, experts, links: one micro-batch's pass through every stage; step: all of them, "
           "sum(stage) + (M - 1) max(stage))\n");
    bt_moe_costs_free(&mc);
    return rc;
}

/* --project: the cluster file's model, then the command line's options. */
static int plan_project(const char *path, const int *codes, const char *const *vals, int n) {
    struct bt_random_model cfg;
    bt_cli_model_defaults(&cfg);
    long tokens = 512;
    bt_backend_t probe = bt_backend_cpu_init(1);
    const double cpu_gflops = probe ? bt_backend_measure_gflops(probe) : 10.0;
    bt_backend_free(probe);
    struct bt_cluster c;
    char err[1024];
    enum bt_status st = bt_cli_cluster_load(path, cpu_gflops, &c, &cfg, &tokens, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int i = 0; i < n; i++) bt_cli_model_option(&cfg, codes[i], vals[i], err, sizeof err); /* checked before */
    if (bt_random_model_check(&cfg, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s: model: %s\n", path, err);
        return 1;
    }
    /* the model's graph of one micro-batch, from its header alone, on one
     * rank that holds it all: each layer's cost */
    struct bt_gguf *g = NULL;
    void *header = NULL;
    struct bt_model_plan mp;
    memset(&mp, 0, sizeof mp);
    struct bt_layer_costs lc;
    memset(&lc, 0, sizeof lc);
    struct bt_engine_params ep;
    bt_engine_default_params(&ep);
    ep.n_ubatch = tokens;
    ep.n_ctx = tokens;
    struct bt_rank_desc one = {.threads = 1, .gflops = c.device_gflops, .mem_bytes = INT64_MAX};
    snprintf(one.backend, sizeof one.backend, "%s", "device");
    int rc = 1;
    if (bt_random_model_describe(&cfg, &g, &header, err, sizeof err) != BT_OK ||
        bt_model_plan_make(g, &ep, &one, 1, NULL, &mp, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        goto out;
    }
    /* (a layer's cache is held like a weight, with its layer) */
    if (bt_layer_costs_make(mp.g.graph, &lc, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        goto out;
    }
    rc = 0;
    if (c.decode.given) {
        rc = project_decode(path, &c, &cfg, mp.g.graph);
        goto out;
    }
    const int total = c.nodes * c.devices_per_node;
    printf("cluster %s: %d nodes x %d %s (%.1f TFLOP/s effective, %.0f GiB)\n", path, c.nodes, c.devices_per_node,
           c.device, c.device_gflops / 1e3, (double)c.device_mem / 1073741824.0);
    printf("  in a node:     %s, %.1f GB/s, %.1f us\n", c.intra.name, c.intra.gbytes_s, c.intra.latency_us);
    printf("  between nodes: %s, %.1f GB/s, %.1f us\n", c.inter.name, c.inter.gbytes_s, c.inter.latency_us);
    printf("model: %d layers, %s, d_model %lld, %s weights (%.1f GiB), %ld tokens a micro-batch, %d micro-batches\n",
           cfg.n_layer, cfg.arch, (long long)cfg.n_embd, bt_type_name(cfg.type),
           (double)bt_gguf_file_size(g) / 1073741824.0, tokens, c.micro_batches);
    struct bt_projection pr;
    const int P = total < lc.L ? total : lc.L;
    if (bt_project(&lc, &c, P, (int)tokens, &pr, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        rc = 1;
        goto out;
    }
    printf("\n%d stages, one a device:\n", P);
    bt_projection_print(&pr, &c, stdout);
    bt_projection_free(&pr);
    printf("\n%5s %6s %12s %8s %12s  %s\n", "P", "nodes", "stage", "bubble", "tokens/s", "bottleneck");
    /* P = 1, 2, 4, ... and the whole cluster */
    for (int k = 1; k <= P; k = k * 2 < P ? k * 2 : (k == P ? P + 1 : P)) {
        if (bt_project(&lc, &c, k, (int)tokens, &pr, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton plan: P = %d: %s\n", k, err);
            rc = 1;
            break;
        }
        bt_projection_print_line(&pr, &c, stdout);
        bt_projection_free(&pr);
    }
out:
    bt_layer_costs_free(&lc);
    bt_model_plan_free(&mp);
    bt_gguf_close(g);
    free(header);
    return rc;
}

/* The plan of a GGUF model (a file, or the built-in model's header) for a
 * topology's ranks (NULL: one CPU rank of this machine's cores). */
static int plan_model(struct bt_gguf *g, const char *topo_path, const struct bt_engine_params *ep,
                      const char *partition, bool json, const char *dump_path) {
    char err[1024];
    struct bt_topology topo;
    bool have_topo = false;
    struct bt_rank_desc *descs = NULL;
    uint8_t *edges = NULL; /* the topology's nccl edges (NULL: every edge may) */
    int *counts = NULL, P = 1, rc = 1;
    struct bt_model_plan mp;
    memset(&mp, 0, sizeof mp);
    struct bt_dist_pin *pins = NULL; /* the topology's, followed as generate follows them */
    int n_pins = 0;
    struct bt_expert_group *groups = NULL; /* the topology's expert groups */
    int n_groups = 0;
    bt_backend_t probe = bt_backend_cpu_init(1);
    const double cpu_gflops = probe ? bt_backend_measure_gflops(probe) : 10.0;
    bt_backend_free(probe);
    if (topo_path) {
        if (bt_topology_load(topo_path, &topo, err, sizeof err) != BT_OK) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        have_topo = true;
        P = topo.n_ranks;
        const char *gpu_env = getenv("BATON_PLAN_GPU_GFLOPS");
        if (bt_topology_rank_descs(&topo, cpu_gflops, gpu_env ? atof(gpu_env) : 400000.0, &descs, err, sizeof err) !=
            BT_OK) {
            fprintf(stderr, "baton plan: %s\n", err);
            goto out;
        }
        struct bt_plan_options popt;
        int *tcounts = NULL;
        const enum bt_status pst = bt_topology_plan_options(&topo, &popt, &tcounts, &pins, &groups, &edges);
        n_pins = popt.n_pins;
        n_groups = popt.n_groups;
        free(tcounts);
        if (pst != BT_OK) {
            fprintf(stderr, "baton plan: out of memory\n");
            goto out;
        }
    } else {
        descs = calloc(1, sizeof *descs);
        if (!descs) {
            fprintf(stderr, "baton plan: out of memory\n");
            goto out;
        }
        const long cores = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES),
                   page = sysconf(_SC_PAGE_SIZE);
        char host[64] = "?";
        gethostname(host, sizeof host - 1);
        descs[0].threads = cores > 0 ? (int)cores : 1;
        snprintf(descs[0].backend, sizeof descs[0].backend, "CPUx%d@%s", descs[0].threads, host);
        descs[0].gflops = cpu_gflops * descs[0].threads;
        descs[0].mem_bytes = pages > 0 && page > 0 ? (int64_t)pages * page : (int64_t)8 << 30;
    }
    if (partition && strcmp(partition, "auto") != 0) {
        if (!(counts = calloc((size_t)P, sizeof *counts))) {
            fprintf(stderr, "baton plan: out of memory\n");
            goto out;
        }
        if (!bt_partition_parse(partition, counts, P, err, sizeof err)) {
            fprintf(stderr, "baton plan: %s (try: baton plan --help)\n", err);
            rc = 2;
            goto out;
        }
    } else if (!partition && have_topo && !topo.pipeline.partition_auto) {
        counts = calloc((size_t)P, sizeof *counts);
        if (!counts) {
            fprintf(stderr, "baton plan: out of memory\n");
            goto out;
        }
        memcpy(counts, topo.pipeline.layers, sizeof *counts * (size_t)P);
    }
    /* as the engine runs it: ranks x the topology's micro-batches in flight (2 without one) */
    struct bt_engine_params epp = *ep;
    if (epp.max_inflight == 0) epp.max_inflight = P * (have_topo ? topo.pipeline.micro_batches : 2);
    const struct bt_model_plan_layout lay = {counts, edges, pins, n_pins, groups, n_groups};
    if (bt_model_plan_make(g, &epp, descs, P, &lay, &mp, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        goto out;
    }
    if (json) bt_model_plan_json(&mp, stdout);
    else bt_model_plan_print(&mp, stdout);
    rc = dump_path && bt_cli_dump_plan(&mp.plan, dump_path, "baton plan") != 0 ? 1 : 0;
    rc = bt_cli_stdout_finish("baton plan", rc);
out:
    bt_model_plan_free(&mp);
    BT_FREE_ALL(edges, pins, groups, counts, descs);
    if (have_topo) bt_topology_free(&topo);
    return rc;
}

int bt_cli_plan(int argc, char **argv) {
    struct bt_random_model cfg;
    bt_cli_model_defaults(&cfg);
    const char *path = NULL, *dump_path = NULL, *project_path = NULL;
    /* the model options given, re-applied over a cluster file's model */
    int opt_codes[64];
    const char *opt_vals[64];
    int n_opts = 0;
    enum { OPT_P_UBATCH = 2000, OPT_P_PARALLEL, OPT_P_PARTITION, OPT_P_JSON };
    const char *model_path = NULL, *partition = NULL;
    bool json = false;
    struct bt_engine_params ep;
    bt_engine_default_params(&ep);
    long v;
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},
        {"ubatch", required_argument, 0, OPT_P_UBATCH},
        {"ctx-size", required_argument, 0, 'c'},
        {"parallel", required_argument, 0, OPT_P_PARALLEL},
        {"partition", required_argument, 0, OPT_P_PARTITION},
        {"json", no_argument, 0, OPT_P_JSON},
        {"topology", required_argument, 0, 'T'},
        {"dump-plan", required_argument, 0, 'D'},
        {"project", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},
        BT_CLI_BUILTIN_MODEL_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    char err[1024];
    while ((code = bt_cli_next_opt(argc, argv, ":t:m:c:h", longs, err)) != -1) {
        if ((code == 'T' || code == 'D' || code == 'P' || code == 'm') && !*optarg)
            snprintf(err, sizeof err, "%s: the file name is empty",
                     code == 'T' ? "--topology" : code == 'D' ? "--dump-plan" : code == 'm' ? "--model" : "--project");
        else if (code == 'm') model_path = optarg;
        else if (code == OPT_P_UBATCH) {
            if (!bt_cli_parse_int(optarg, 1, 65536, &v)) snprintf(err, sizeof err, "--ubatch: '%s' is not an integer in [1, 65536]", optarg);
            ep.n_ubatch = v;
        } else if (code == 'c') {
            if (!bt_cli_parse_int(optarg, 1, 1L << 24, &v)) snprintf(err, sizeof err, "--ctx-size: '%s' is not an integer in [1, %ld]", optarg, 1L << 24);
            ep.n_ctx = v;
        } else if (code == OPT_P_PARALLEL) {
            if (!bt_cli_parse_int(optarg, 1, 1024, &v)) snprintf(err, sizeof err, "--parallel: '%s' is not an integer in [1, 1024]", optarg);
            ep.n_seq_max = (int)v;
        } else if (code == OPT_P_PARTITION) partition = optarg;
        else if (code == OPT_P_JSON) json = true;
        else if (code == 'T') path = optarg;
        else if (code == 't') bt_cli_short_flag_elsewhere('t', "plan reads its ranks from --topology FILE", err, sizeof err);
        else if (code == 'D') dump_path = optarg;
        else if (code == 'P') project_path = optarg;
        else if (code == 'h') {
            plan_usage(stdout, &cfg);
            return 0;
        } else if (code == ':') snprintf(err, sizeof err, "%s needs a value", argv[optind - 1]);
        else if (code == '?') snprintf(err, sizeof err, "unknown option %s", argv[optind - 1]);
        else if (code >= OPT_ARCH && code < OPT_MODEL_LAST) {
            bt_cli_model_option(&cfg, code, optarg, err, sizeof err);
            if (n_opts < 64) {
                opt_codes[n_opts] = code;
                opt_vals[n_opts++] = optarg;
            } else
                snprintf(err, sizeof err, "more than 64 model options");
        }
        if (err[0]) {
            fprintf(stderr, "baton plan: %s (try: baton plan --help)\n", err);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton plan: unexpected argument '%s' (try: baton plan --help)\n", argv[optind]);
        return 2;
    }
    if (model_path && (project_path || n_opts > 0)) {
        fprintf(stderr, "baton plan: -m plans the model in the file: it goes without --project and the built-in "
                        "model's options (try: baton plan --help)\n");
        return 2;
    }
    if (project_path) {
        if (path || dump_path || partition || json) {
            fprintf(stderr, "baton plan: --project goes without -t, --dump-plan, --partition and --json (try: baton "
                            "plan --help)\n");
            return 2;
        }
        return plan_project(project_path, opt_codes, opt_vals, n_opts);
    }
    if (ep.n_ubatch > ep.n_ctx) {
        fprintf(stderr, "baton plan: --ubatch %lld is more than --ctx-size %lld (try: baton plan --help)\n",
                (long long)ep.n_ubatch, (long long)ep.n_ctx);
        return 2;
    }
    if (!model_path && bt_random_model_check(&cfg, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s (try: baton plan --help)\n", err);
        return 2;
    }
    struct bt_gguf *g = NULL;
    void *header = NULL;
    const enum bt_status st = model_path ? bt_gguf_open(model_path, &g, err, sizeof err)
                                         : bt_random_model_describe(&cfg, &g, &header, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        return 1;
    }
    const int rc = plan_model(g, path, &ep, partition, json, dump_path);
    bt_gguf_close(g);
    free(header);
    return rc;
}
