/* plan.c - `baton plan -t TOPOLOGY [model options]`: the placement and the
 * splits for a topology, without MPI and without running anything.  CPU ranks
 * are costed at this machine's measured single-thread mul_mat speed times
 * their threads; CUDA ranks at an assumed 400 TFLOP/s (an H200-class GPU on
 * these shapes) unless BATON_PLAN_GPU_GFLOPS says otherwise. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton.h"
#include "cli.h"
#include "common.h"

static void plan_usage(FILE *f, const struct bt_model_config *c) {
    fprintf(f,
            "usage: baton plan -t TOPOLOGY [options]\n"
            "\n"
            "Prints the plan baton would run for the topology: per rank its layers, nodes,\n"
            "weight bytes, transfers per micro-batch and predicted stage time.\n"
            "\n"
            "  -t, --topology FILE   topology file (required)\n"
            "  -h, --help            this text\n"
            "\n");
    bt_cli_model_help(f, c);
}

int bt_cli_plan(int argc, char **argv) {
    struct bt_model_config cfg;
    bt_cli_model_defaults(&cfg);
    const char *path = NULL;
    static const struct option longs[] = {
        {"topology", required_argument, 0, 't'},
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
        if (code == 't') path = optarg;
        else if (code == 'h') {
            plan_usage(stdout, &cfg);
            return 0;
        } else if (code == ':') snprintf(err, sizeof err, "%s needs a value", argv[optind - 1]);
        else if (code == '?') snprintf(err, sizeof err, "unknown option %s", argv[optind - 1]);
        else if (code >= OPT_LAYERS && code < OPT_MODEL_LAST) bt_cli_model_option(&cfg, code, optarg, err, sizeof err);
        if (err[0]) {
            fprintf(stderr, "baton plan: %s (try: baton plan --help)\n", err);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton plan: unexpected argument '%s' (try: baton plan --help)\n", argv[optind]);
        return 2;
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

    /* rank descriptions from the file */
    bt_backend_t probe = bt_backend_cpu_init(1);
    const double cpu_gflops = probe ? bt_backend_measure_gflops(probe) : 10.0;
    bt_backend_free(probe);
    const char *gpu_env = getenv("BATON_PLAN_GPU_GFLOPS");
    const double gpu_gflops = gpu_env ? atof(gpu_env) : 400000.0;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const int64_t host_mem = pages > 0 && page > 0 ? (int64_t)pages * page : (int64_t)8 << 30;
    struct bt_rank_desc *descs = calloc((size_t)P, sizeof *descs);
    for (int r = 0; r < P; r++) {
        const struct bt_topo_rank *tr = bt_topology_rank(&topo, r);
        const int on_host = bt_topology_host_ranks(&topo, tr->host);
        if (tr->backend == BT_TOPO_BACKEND_CUDA) {
            snprintf(descs[r].backend, sizeof descs[r].backend, "CUDA%d@%s", tr->device,
                     bt_topology_host(&topo, tr->host)->name);
            descs[r].gflops = gpu_gflops;
            descs[r].mem_bytes = tr->memory ? (int64_t)tr->memory : (int64_t)80 << 30;
            descs[r].device = 1; /* CUDA ranks open the NCCL transport (for the topology's nccl edges) */
        } else {
            snprintf(descs[r].backend, sizeof descs[r].backend, "CPUx%d@%s", tr->threads,
                     bt_topology_host(&topo, tr->host)->name);
            descs[r].threads = tr->threads;
            descs[r].gflops = cpu_gflops * tr->threads;
            descs[r].mem_bytes = tr->memory ? (int64_t)tr->memory : host_mem / (on_host > 0 ? on_host : 1);
        }
    }
    struct bt_cli_pipeline pl;
    if (!bt_cli_pipeline_from_topology(&topo, &pl)) {
        fprintf(stderr, "baton plan: out of memory\n");
        free(descs);
        bt_topology_free(&topo);
        return 1;
    }
    int n_nccl = 0;
    uint8_t *nccl_edges = bt_cli_nccl_edges(&topo, &n_nccl);
    struct bt_plan_options opt = {
        /* as demo: micro-batches in flight, at most the scheduler's ring */
        .n_copies = topo.pipeline.micro_batches < BT_SCHED_MAX_COPIES ? topo.pipeline.micro_batches : BT_SCHED_MAX_COPIES,
        .layers_per_rank = pl.counts,
        .pins = pl.pins,
        .n_pins = pl.n_pins,
        .device_edges = nccl_edges,
    };
    struct bt_model *m = bt_model_new(&cfg);
    bt_context *ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
    struct bt_model_graph g;
    int rc = 0;
    if (!m || !ctx || bt_model_build_graph(m, ctx, &g) != BT_OK) {
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
        }
        bt_plan_free(&plan);
    }
    bt_free(ctx);
    bt_model_free(m);
    bt_cli_pipeline_free(&pl);
    free(nccl_edges);
    free(descs);
    bt_topology_free(&topo);
    return rc;
}
