/* signals.h - a rank stopped by SIGINT, SIGTERM or SIGHUP prints one line
 * naming itself and the signal, then ends as the signal would (signals.c). */
#ifndef BATON_CLI_SIGNALS_H
#define BATON_CLI_SIGNALS_H

/* Once the rank is known (after MPI starts: MPI may install handlers). */
void bt_cli_signals_install(const char *prog, int rank);

#endif
