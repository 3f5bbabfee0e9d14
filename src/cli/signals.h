/* signals.h - a rank stopped by SIGINT, SIGTERM, SIGHUP or SIGUSR1 prints one
 * line naming itself and the signal, then ends as the signal would; a program
 * that can finish its work (serve, generate) asks for the stop instead
 * (signals.c). */
#ifndef BATON_CLI_SIGNALS_H
#define BATON_CLI_SIGNALS_H

#include <signal.h>

/* As early as possible (with the rank from mpirun's environment), and again
 * once MPI has started (MPI may install handlers of its own). */
void bt_cli_signals_install(const char *prog, int rank);

/* The rank is on its way out after an error it or rank 0 has reported: a
 * signal from here on ends it without the line (mpirun sends SIGTERM to the
 * ranks still in their teardown once the first one exits non-zero, and
 * "stopped by SIGTERM" would be a second, false, explanation). */
void bt_cli_signals_ending(void);

/* From here on a stop is a request to finish, not an end (serve drains,
 * generate ends with what it has).  On rank 0 the first SIGINT, SIGTERM,
 * SIGHUP or SIGUSR1 writes NOTICE (one line) and sets *stop to the signal's
 * number; the program polls it.  A second INT, TERM or HUP ends rank 0 at
 * once.  The other ranks follow rank 0, which ends them through the engine:
 * SIGUSR1 is ignored, and a first INT, TERM or HUP only noted (a terminal's
 * ^C reaches every rank of a plain `mpirun`); a second one ends them.
 *
 * SIGUSR1 is the launcher's request: Open MPI's mpirun forwards SIGUSR1 to
 * every rank but ends the job on SIGINT and SIGTERM, so launch/baton-run
 * turns a ^C or SIGTERM of its own into SIGUSR1 for mpirun. */
void bt_cli_signals_finish_on_stop(int rank, volatile sig_atomic_t *stop, const char *notice);

#endif
