/* signals.c - a rank stopped by a signal says so.  mpirun ends a job by
 * sending its ranks SIGTERM (after a SIGINT or SIGTERM of its own, or when
 * another rank failed), and then exits 1 without a word: the rank's line is
 * what tells the user that the run was stopped from outside and not by a
 * failure of its own. */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const int caught[] = {SIGINT, SIGTERM, SIGHUP};
#define N_CAUGHT (sizeof caught / sizeof caught[0])
static char messages[N_CAUGHT][192]; /* written before the handlers go in */

static void on_signal(int sig) {
    for (size_t i = 0; i < N_CAUGHT; i++) {
        if (caught[i] != sig) continue;
        /* write(2) is async-signal-safe; stdio is not */
        ssize_t k = write(STDERR_FILENO, messages[i], strlen(messages[i]));
        (void)k;
    }
    /* then end as the signal would have: the exit status still says which */
    signal(sig, SIG_DFL);
    raise(sig);
}

void bt_cli_signals_install(const char *prog, int rank) {
    static const char *names[] = {"SIGINT", "SIGTERM", "SIGHUP"};
    for (size_t i = 0; i < N_CAUGHT; i++)
        snprintf(messages[i], sizeof messages[i], "%s: rank %d: stopped by %s: the job was ended (interrupted, or another rank failed)\n", prog,
                 rank, names[i]);
    for (size_t i = 0; i < N_CAUGHT; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(caught[i], &sa, NULL);
    }
}
