/* signals.h - a rank stopped by SIGINT, SIGTERM or SIGHUP prints one line
 * naming itself and the signal, then ends as the signal would (signals.c). */
#ifndef BATON_CLI_SIGNALS_H
#define BATON_CLI_SIGNALS_H

/* As early as possible (with the rank from mpirun's environment), and again
 * once MPI has started (MPI may install handlers of its own). */
void bt_cli_signals_install(const char *prog, int rank);

#endif
