/* cli.h - subcommands of the baton program.  Each returns the process exit
 * code: 0 success, 1 a run-time failure, 2 a usage error (bad flag or value). */
#ifndef BATON_CLI_H
#define BATON_CLI_H

int bt_cli_bench(int argc, char **argv); /* bench.c: argv[0] is the benchmark name ("ops") */
int bt_cli_demo(int argc, char **argv);  /* demo.c: the built-in main job */
int bt_cli_plan(int argc, char **argv);  /* plan_cmd.c: the plan of a model over ranks, without running it */
int bt_cli_bench_pipeline(int argc, char **argv);  /* bench_dist.c */
int bt_cli_bench_transport(int argc, char **argv); /* bench_dist.c */
int bt_cli_bench_model(int argc, char **argv);     /* bench_model.c: a GGUF model's tokens/s */
int bt_cli_tokenize(int argc, char **argv);        /* tokenize.c: text -> token ids under a GGUF vocabulary */
int bt_cli_gguf(int argc, char **argv);            /* gguf_cmd.c: what a GGUF file holds */
int bt_cli_quantize(int argc, char **argv);        /* quantize.c: baton quantize IN OUT TYPE */
int bt_cli_serve(int argc, char **argv);           /* serve_cmd.c: the OpenAI-compatible HTTP server (src/serve/) */
int bt_cli_make_model(int argc, char **argv);      /* make_model.c: a random-weight model with a real vocabulary */
int bt_cli_generate(int argc, char **argv);        /* generate.c: text from a GGUF model over the ranks */

#endif
