/* cli.h - subcommands of the baton program.  Each returns the process exit
 * code: 0 success, 1 a run-time failure, 2 a usage error (bad flag or value). */
#ifndef BATON_CLI_H
#define BATON_CLI_H

int bt_cli_bench(int argc, char **argv); /* bench.c: argv[0] is the benchmark name */

#endif
