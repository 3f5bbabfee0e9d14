/* signals.c - a rank stopped by a signal says so; a program that can finish
 * its work takes a stop as a request (bt_cli_signals_finish_on_stop).  mpirun ends a job by
 * sending its ranks SIGTERM (after a SIGINT or SIGTERM of its own, or when
 * another rank failed), and then exits 1 without a word: the rank's line is
 * what tells the user that the run was stopped from outside and not by a
 * failure of its own.
 *
 * Among several ranks, a rank lingers after its line instead of ending at
 * once.  Open MPI (odls, 4.1) sends SIGTERM to every rank, then sleeps
 * odls_base_sigkill_timeout (1 s) before SIGKILL; but the first rank's death
 * (SIGCHLD) cuts that sleep short, and SIGKILL follows within milliseconds.
 * A rank that the machine had not scheduled yet (a loaded machine) died by
 * SIGKILL without its line.  Lingering LINGER_S keeps every rank alive for
 * mpirun's whole grace period, so each gets it to write its line; mpirun's
 * SIGKILL then ends them (or, with a longer timeout, the rank ends itself
 * by the signal after LINGER_S).  A one-process run ends at once. */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include "agree.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const int caught[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
#define N_CAUGHT (sizeof caught / sizeof caught[0])
static char messages[N_CAUGHT][192]; /* written before the handlers go in */
static int linger;                    /* several ranks: wait before ending */
static volatile sig_atomic_t ending;  /* bt_cli_signals_ending: no line */
#define LINGER_S 3 /* longer than mpirun's default 1 s grace period */

/* every caught signal to fn (sigaction is async-signal-safe) */
static void handle_all(void (*fn)(int), int flags) {
    for (size_t i = 0; i < N_CAUGHT; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = fn;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = flags;
        sigaction(caught[i], &sa, NULL);
    }
}

static void on_signal(int sig) {
    /* one line per rank: any further signal ends it at once (a second ^C
     * while it lingers) */
    handle_all(SIG_DFL, 0);
    for (size_t i = 0; i < N_CAUGHT && !ending; i++) {
        if (caught[i] != sig) continue;
        /* write(2) is async-signal-safe; stdio is not */
        ssize_t k = write(STDERR_FILENO, messages[i], strlen(messages[i]));
        (void)k;
    }
    if (linger && !ending) {
        /* nanosleep is async-signal-safe */
        struct timespec left = {LINGER_S, 0};
        int saved = errno;
        nanosleep(&left, &left);
        errno = saved;
    }
    /* then end as the signal would have: the exit status still says which */
    raise(sig);
}

void bt_cli_signals_install(const char *prog, int rank) {
    static const char *names[] = {"SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1"};
    for (size_t i = 0; i < N_CAUGHT; i++)
        snprintf(messages[i], sizeof messages[i], "%s: rank %d: stopped by %s: the job was ended (interrupted, or another rank failed)\n", prog,
                 rank, names[i]);
    linger = bt_cli_env_many_ranks();
    handle_all(on_signal, SA_RESETHAND);
}

void bt_cli_signals_ending(void) { ending = 1; }

/* ---- a stop as a request to finish ---- */

static volatile sig_atomic_t *finish_flag;
static int finish_rank;
static char finish_notice[256];

static void on_finish_signal(int sig) {
    if (sig == SIGUSR1 && (finish_rank != 0 || *finish_flag)) return; /* rank 0 ends the others */
    if (*finish_flag) {
        on_signal(sig); /* the second INT, TERM or HUP: at once, with the rank's line */
        return;
    }
    *finish_flag = sig;
    if (finish_rank == 0) {
        ssize_t k = write(STDERR_FILENO, finish_notice, strlen(finish_notice));
        (void)k;
    }
}

void bt_cli_signals_finish_on_stop(int rank, volatile sig_atomic_t *stop, const char *notice) {
    finish_flag = stop;
    finish_rank = rank;
    snprintf(finish_notice, sizeof finish_notice, "%s\n", notice);
    /* no SA_RESTART: a read of stdin (generate's conversation) returns
     * EINTR, and the program sees the request at once */
    handle_all(on_finish_signal, 0);
}
