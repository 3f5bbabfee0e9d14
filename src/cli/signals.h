/* signals.h - a rank stopped by SIGINT, SIGTERM or SIGHUP prints one line
 * naming itself and the signal, then ends as the signal would (signals.c). */
#ifndef BATON_CLI_SIGNALS_H
#define BATON_CLI_SIGNALS_H

/* As early as possible (with the rank from mpirun's environment), and again
 * once MPI has started (MPI may install handlers of its own). */
void bt_cli_signals_install(const char *prog, int rank);

/* The rank is on its way out after an error it or rank 0 has reported: a
 * signal from here on ends it without the line (mpirun sends SIGTERM to the
 * ranks still in their teardown once the first one exits non-zero, and
 * "stopped by SIGTERM" would be a second, false, explanation). */
void bt_cli_signals_ending(void);

#endif
