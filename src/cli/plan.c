/* plan.c - `baton plan -t TOPOLOGY [model options]`: the placement and the
 * splits for a topology, without MPI and without running anything.  CPU ranks
 * are costed at this machine's measured single-thread mul_mat speed times
 * their threads; CUDA ranks at an assumed 400 TFLOP/s (an H200-class GPU on
 * these shapes) unless BATON_PLAN_GPU_GFLOPS says otherwise.
 *
 * `baton plan --project FILE [model options]`: the throughput of the model
 * on a cluster described by FILE (src/cli/project_file.c), on paper
 * (src/project.c): per stage compute and input times, bubble, tokens/s and the
 * bottleneck for every power-of-two number of devices up to the cluster's. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton.h"
#include "cli.h"
#include "common.h"
#include "project_file.h"
#include "run/bringup.h"

static void plan_usage(FILE *f, const struct bt_model_config *c) {
    fprintf(f,
            "usage: baton plan -t TOPOLOGY [options]\n"
            "\n"
            "Prints the plan baton would run for the topology: per rank its layers, nodes,\n"
            "weight bytes, transfers per micro-batch and predicted stage time.\n"
            "\n"
            "  -t, --topology FILE   topology file (required, unless --project)\n"
            "      --project FILE    instead: project throughput on the cluster FILE\n"
            "                        describes (configs/projection/eight-nodes-64gpu.yaml), up to\n"
            "                        4096 devices; its model section, then the options\n"
            "      --dump-plan FILE  also write the plan as text (owners, splits, transfers),\n"
            "                        to compare with a live run's (baton demo --dump-plan)\n"
            "  -h, --help            this text\n"
            "\n");
    bt_cli_model_help(f, c);
}

/* --project: the cluster file's model, then the command line's options. */
static int plan_project(const char *path, const int *codes, const char *const *vals, int n) {
    struct bt_model_config cfg;
    bt_cli_model_defaults(&cfg);
    bt_backend_t probe = bt_backend_cpu_init(1);
    const double cpu_gflops = probe ? bt_backend_measure_gflops(probe) : 10.0;
    bt_backend_free(probe);
    struct bt_cluster c;
    char err[1024];
    enum bt_status st = bt_cli_cluster_load(path, cpu_gflops, &c, &cfg, err, sizeof err);
    if (st != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int i = 0; i < n; i++) bt_cli_model_option(&cfg, codes[i], vals[i], err, sizeof err); /* checked before */
    struct bt_model *m = NULL;
    if (bt_model_new(&cfg, &m, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: model: %s\n", err);
        return 1;
    }
    bt_context *ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
    struct bt_model_graph g;
    struct bt_layer_costs lc;
    memset(&lc, 0, sizeof lc);
    int rc = 0;
    if (!ctx || bt_model_build_graph(m, ctx, &g) != BT_OK) {
        fprintf(stderr, "baton plan: cannot build the model%s%s\n", ctx ? ": " : "", ctx ? bt_context_error(ctx) : "");
        rc = 1;
    } else if (bt_layer_costs_make(g.graph, &lc, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        rc = 1;
    }
    const int total = c.nodes * c.devices_per_node;
    if (rc == 0) {
        printf("cluster %s: %d nodes x %d %s (%.1f TFLOP/s effective, %.0f GiB)\n", path, c.nodes,
               c.devices_per_node, c.device, c.device_gflops / 1e3, (double)c.device_mem / 1073741824.0);
        printf("  in a node:     %s, %.1f GB/s, %.1f us\n", c.intra.name, c.intra.gbytes_s, c.intra.latency_us);
        printf("  between nodes: %s, %.1f GB/s, %.1f us\n", c.inter.name, c.inter.gbytes_s, c.inter.latency_us);
        printf("model: %d layers, %s, d_model %d, d_ff %d, %s weights (%.1f GiB), %d tokens a micro-batch, %d "
               "micro-batches\n",
               cfg.n_layers, bt_ffn_kind_name(cfg.ffn), cfg.d_model, cfg.d_ff, bt_type_name(cfg.wtype),
               (double)bt_model_weight_bytes(&cfg) / 1073741824.0, cfg.n_tokens, c.micro_batches);
        struct bt_projection pr;
        const int P = total < lc.L ? total : lc.L;
        if (bt_project(&lc, &c, P, cfg.n_tokens, &pr, err, sizeof err) != BT_OK) {
            fprintf(stderr, "baton plan: %s\n", err);
            rc = 1;
        } else {
            printf("\n%d stages, one a device:\n", P);
            bt_projection_print(&pr, &c, stdout);
            bt_projection_free(&pr);
        }
        if (rc == 0) {
            printf("\n%5s %6s %12s %8s %12s  %s\n", "P", "nodes", "stage", "bubble", "tokens/s", "bottleneck");
            /* P = 1, 2, 4, ... and the whole cluster */
            for (int k = 1; k <= P; k = k * 2 < P ? k * 2 : (k == P ? P + 1 : P)) {
                if (bt_project(&lc, &c, k, cfg.n_tokens, &pr, err, sizeof err) != BT_OK) {
                    fprintf(stderr, "baton plan: P = %d: %s\n", k, err);
                    rc = 1;
                    break;
                }
                bt_projection_print_line(&pr, &c, stdout);
                bt_projection_free(&pr);
            }
        }
    }
    bt_layer_costs_free(&lc);
    bt_free(ctx);
    bt_model_free(m);
    return rc;
}

int bt_cli_plan(int argc, char **argv) {
    struct bt_model_config cfg;
    bt_cli_model_defaults(&cfg);
    const char *path = NULL, *dump_path = NULL, *project_path = NULL;
    /* the model options given, re-applied over a cluster file's model */
    int opt_codes[64];
    const char *opt_vals[64];
    int n_opts = 0;
    static const struct option longs[] = {
        {"topology", required_argument, 0, 't'},
        {"dump-plan", required_argument, 0, 'D'},
        {"project", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},
        BT_CLI_MODEL_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    opterr = 0;
    optind = 1;
    int code;
    char err[1024];
    while ((code = getopt_long(argc, argv, ":t:h", longs, NULL)) != -1) {
        err[0] = '\0';
        if ((code == 't' || code == 'D' || code == 'P') && !*optarg)
            snprintf(err, sizeof err, "%s: the file name is empty",
                     code == 't' ? "--topology" : code == 'D' ? "--dump-plan" : "--project");
        else if (code == 't') path = optarg;
        else if (code == 'D') dump_path = optarg;
        else if (code == 'P') project_path = optarg;
        else if (code == 'h') {
            plan_usage(stdout, &cfg);
            return 0;
        } else if (code == ':') snprintf(err, sizeof err, "%s needs a value", argv[optind - 1]);
        else if (code == '?') snprintf(err, sizeof err, "unknown option %s", argv[optind - 1]);
        else if (code >= OPT_LAYERS && code < OPT_MODEL_LAST) {
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
    if (project_path) {
        if (path || dump_path) {
            fprintf(stderr, "baton plan: --project goes without -t and --dump-plan (try: baton plan --help)\n");
            return 2;
        }
        return plan_project(project_path, opt_codes, opt_vals, n_opts);
    }
    if (!path) {
        fprintf(stderr, "baton plan: missing -t TOPOLOGY (try: baton plan --help)\n");
        return 2;
    }
    if (bt_model_config_check(&cfg, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: model: %s\n", err);
        return 2;
    }
    struct bt_topology topo;
    if (bt_topology_load(path, &topo, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const int P = topo.n_ranks;
    if (!topo.pipeline.partition_auto && bt_topology_check_layers(&topo, cfg.n_layers, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        bt_topology_free(&topo);
        return 1;
    }

    /* rank descriptions and options from the file (the bring-up library's
     * reading of a topology, as a live run on it would give) */
    bt_backend_t probe = bt_backend_cpu_init(1);
    const double cpu_gflops = probe ? bt_backend_measure_gflops(probe) : 10.0;
    bt_backend_free(probe);
    const char *gpu_env = getenv("BATON_PLAN_GPU_GFLOPS");
    const double gpu_gflops = gpu_env ? atof(gpu_env) : 400000.0;
    struct bt_rank_desc *descs = NULL;
    if (bt_topology_rank_descs(&topo, cpu_gflops, gpu_gflops, &descs, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton plan: %s\n", err);
        bt_topology_free(&topo);
        return 1;
    }
    struct bt_plan_options opt;
    int *counts = NULL;
    struct bt_dist_pin *pins = NULL;
    uint8_t *nccl_edges = NULL;
    if (bt_topology_plan_options(&topo, &opt, &counts, &pins, &nccl_edges) != BT_OK) {
        fprintf(stderr, "baton plan: out of memory\n");
        free(descs);
        free(counts);
        free(pins);
        free(nccl_edges);
        bt_topology_free(&topo);
        return 1;
    }
    struct bt_model *m = NULL;
    const enum bt_status mst = bt_model_new(&cfg, &m, err, sizeof err);
    bt_context *ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
    struct bt_model_graph g;
    int rc = 0;
    if (mst != BT_OK) {
        fprintf(stderr, "baton plan: model: %s\n", err);
        rc = 1;
    } else if (!ctx || bt_model_build_graph(m, ctx, &g) != BT_OK) {
        fprintf(stderr, "baton plan: cannot build the model%s%s\n", ctx ? ": " : "", ctx ? bt_context_error(ctx) : "");
        rc = 1;
    } else {
        printf("topology %s: %d ranks on %d hosts; model: %d layers, %s, d_model %d, %s weights, %.1f MiB\n", path, P,
               topo.n_hosts, cfg.n_layers, bt_ffn_kind_name(cfg.ffn), cfg.d_model, bt_type_name(cfg.wtype),
               (double)bt_model_weight_bytes(&cfg) / 1048576.0);
        struct bt_plan plan;
        if (bt_plan_make(&plan, g.graph, descs, P, NULL, &opt) != BT_OK) {
            fprintf(stderr, "baton plan: %s\n", plan.error);
            rc = 1;
        } else {
            bt_plan_print(&plan, g.graph, stdout);
            printf("planned in %.3f s\n", plan.seconds);
            if (dump_path && bt_cli_dump_plan(&plan, dump_path, "baton plan") != 0) rc = 1;
        }
        bt_plan_free(&plan);
    }
    bt_free(ctx);
    bt_model_free(m);
    free(counts);
    free(pins);
    free(nccl_edges);
    free(descs);
    bt_topology_free(&topo);
    return rc;
}
