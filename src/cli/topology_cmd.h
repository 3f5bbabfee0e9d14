/* topology_cmd.h - `baton launch-files`: a topology file -> the files mpirun
 * needs (hostfile, rankfile, env, mpirun-args).  Used by launch/baton-run. */
#ifndef BATON_CLI_TOPOLOGY_CMD_H
#define BATON_CLI_TOPOLOGY_CMD_H

/* argv[0] is the command name ("launch-files"); the options follow:
 *   -t, --topology FILE   the topology file (required)
 *   -o, --out DIR         where to write the files (required; created if missing)
 * Prints the number of ranks on stdout.  Exit code: 0 done, 1 a bad topology
 * or an I/O error (one message on stderr, nothing written), 2 a usage error. */
int bt_cli_launch_files(int argc, char **argv);

#endif
