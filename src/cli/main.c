/* main.c - the baton program: dispatch to subcommands. */
#include <stdio.h>
#include <string.h>

#include "baton/baton.h"
#include "cli.h"
#include "common.h"
#include "baton/cpu.h"
#include "topology_cmd.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: baton <command> [options]\n"
            "\n"
            "commands:\n"
            "  demo          the runtime's own job: a model's prompts (a GGUF file's, or a\n"
            "                random-weight MoE model made in memory) as a pipeline over the\n"
            "                ranks it was launched with, checked against one process\n"
            "  plan          [-m FILE] [--topology FILE]: the plan generate runs for a model\n"
            "                (layers, memory and transfers per rank), without running it\n"
            "  bench model   -m FILE: a GGUF model's prompt and generation tokens/s, as\n"
            "                llama-bench prints them (baton bench model --help)\n"
            "  bench pipeline  pipeline efficiency for P ranks and M micro-batches (under mpirun)\n"
            "  bench transport baton's rank-to-rank transfers next to a raw MPI ping-pong (2 ranks)\n"
            "  bench ops     kernel benchmark: mul_mat and mul_mat_id for each weight type,\n"
            "                next to the machine's measured read bandwidth and FMA peak\n"
            "                (baton bench ops --help for its options)\n"
            "  generate      -m FILE -p TEXT: text from a GGUF model over the ranks it was\n"
            "                launched with (baton generate --help)\n"
            "  make-model    OUT.gguf --vocab FILE: a small random-weight model with a real\n"
            "                vocabulary (baton make-model --help)\n"
            "  tokenize      -m FILE -p TEXT: the token ids of a text under a GGUF file's\n"
            "                vocabulary (baton tokenize --help)\n"
            "  gguf FILE     what a GGUF model file holds: architecture, hyperparameters,\n"
            "                tensors by type, bytes per layer (--tensors, --json)\n"
            "  quantize      IN.gguf OUT.gguf TYPE: quantise a GGUF file's weights (Q8_0 Q4_0\n"
            "                Q6_K Q4_K_M Q5_K_M; baton quantize --help)\n"
            "  serve         -m FILE: an OpenAI-compatible HTTP server for a GGUF model over the\n"
            "                ranks (continuous batching; baton serve --help)\n"
            "  launch-files  --topology FILE --out DIR: write the hostfile, rankfile and environment\n"
            "                for mpirun (used by launch/baton-run)\n"
            "  version       print the version\n"
            "  help          this text\n");
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") && argc >= 3) { /* baton help CMD: as baton CMD --help */
        char *args[] = {argv[0], argv[2], (char *)"--help", NULL};
        return dispatch(3, args);
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") && argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        printf("usage: baton version\n\nPrints baton's version and the variant of the CPU kernels in use.\n");
        return 0;
    }
    if ((!strcmp(cmd, "version") || !strcmp(cmd, "--version")) && argc > 2) {
        fprintf(stderr, "baton version: unexpected argument '%s'\n", argv[2]);
        return 2;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("baton %s\n", BATON_VERSION);
        /* the CPU kernels in use, and those the build holds (cpu.h) */
        printf("cpu kernels: %s (built:", bt_cpu_variant_name());
        for (int i = 0; i < bt_cpu_n_variants(); i++)
            printf(" %s%s", bt_cpu_variant_name_at(i), bt_cpu_variant_runs(i) ? "" : " (not on this CPU)");
        printf(")\n");
        return 0;
    }
    if (!strcmp(cmd, "bench")) {
        if (argc < 3) {
            fprintf(stderr, "baton bench: missing benchmark name (try: baton bench --help)\n");
            return 2;
        }
        if (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h") || !strcmp(argv[2], "help")) {
            printf("usage: baton bench ops|model|transport|pipeline [options]\n"
                   "\n"
                   "  ops        kernel benchmark: mul_mat and mul_mat_id per weight type\n"
                   "  model      prompt and generation tokens/s of a GGUF model (llama-bench's\n"
                   "             table; also under mpirun)\n"
                   "  transport  baton's rank-to-rank transfers next to a raw MPI ping-pong\n"
                   "             (mpirun -np 2)\n"
                   "  pipeline   pipeline efficiency for P ranks and M micro-batches (mpirun -np P)\n"
                   "\n"
                   "baton bench NAME --help for the options of one.\n");
            return 0;
        }
        if (!strcmp(argv[2], "pipeline")) return bt_cli_bench_pipeline(argc - 2, argv + 2);
        if (!strcmp(argv[2], "model")) return bt_cli_bench_model(argc - 2, argv + 2);
        if (!strcmp(argv[2], "transport")) return bt_cli_bench_transport(argc - 2, argv + 2);
        return bt_cli_bench(argc - 2, argv + 2);
    }
    if (!strcmp(cmd, "demo")) return bt_cli_demo(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return bt_cli_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "make-model")) return bt_cli_make_model(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return bt_cli_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return bt_cli_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "gguf")) return bt_cli_gguf(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return bt_cli_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return bt_cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "launch-files")) return bt_cli_launch_files(argc - 1, argv + 1);
    fprintf(stderr, "baton: unknown command '%s' (try: baton help)\n", cmd);
    return 2;
}

/* Every command's stdout is checked at its end (bt_cli_stdout_finish): a
 * listing or completion redirected to a full disk is an error, not exit 0. */
int main(int argc, char **argv) {
    bt_cli_stdout_direct();
    const int rc = dispatch(argc, argv);
    char prog[64] = "baton";
    if (argc >= 2 && strlen(argv[1]) < 24) {
        if (!strcmp(argv[1], "bench") && argc >= 3 && strlen(argv[2]) < 24)
            snprintf(prog, sizeof prog, "baton bench %s", argv[2]);
        else snprintf(prog, sizeof prog, "baton %s", argv[1]);
    }
    return bt_cli_stdout_finish(prog, rc);
}
