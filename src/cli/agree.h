/* agree.h - the ranks of one run agree on their options before any work.
 *
 * mpirun may start ranks with different command lines (`-np 1 baton demo -m 4
 * : -np 1 baton demo -m 8`), and every rank parses its own.  Options that
 * change no graph (micro-batches, copies, the seed, the partition) would
 * otherwise make ranks wait for each other forever or compute something else
 * in silence, and an error that only rank 1 found would end the job with no
 * message (only rank 0 prints).  So, right after MPI starts, every rank sends
 * rank 0 its own verdict on its command line (an exit code and a message)
 * and the value of every option that must be the same everywhere; rank 0
 * prints one message naming the first rank and option at fault, and every rank
 * returns the same exit code.
 */
#ifndef BATON_CLI_AGREE_H
#define BATON_CLI_AGREE_H

#include <stdbool.h>
#include <stddef.h>

#include "transport.h"

#define BT_CLI_AGREE_VALUE 96 /* longer values are compared by their first 95 bytes */

/* One option every rank must give the same value, as the user would write it
 * ("--micro-batches", "8"); given false: the rank was started without it. */
struct bt_cli_agree_item {
    const char *option;
    char value[BT_CLI_AGREE_VALUE];
    bool given;
};

/* items[*n] = option, given, the value as printf formats it; then *n + 1. */
void bt_cli_agree_add(struct bt_cli_agree_item *items, int *n, const char *option, bool given, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* The two items of where the ranks run: --topology (given when non-empty)
 * and --backend (given when not NULL). */
void bt_cli_agree_add_where(struct bt_cli_agree_item *items, int *n, const char *topology, const char *backend);

/* Before MPI: true when the launcher's environment says this process is one of
 * several ranks (then an error found before MPI starts must go through
 * bt_cli_agree so that the job ends with its message). */
bool bt_cli_env_many_ranks(void);

struct bt_rank;
struct bt_rank_config;
/* bt_rank_start for a subcommand whose own checks of its command line so far
 * gave *prc (0, or an exit code with its message in perr[n]).  True when MPI
 * is up (R->t), c->prog's signal handlers installed again for the world rank
 * (signals.h): a failure of the start or of the topology file is then in *prc
 * and perr, for bt_cli_agree to report once.  False when it is not: the one
 * message was printed (by the launcher's rank env_rank 0; a topology's own
 * message, FILE:LINE:COLUMN: ..., without the program's prefix), R freed, and
 * the program exits with *prc. */
bool bt_cli_rank_start(struct bt_rank *R, const struct bt_rank_config *c, int env_rank, int *prc, char *perr,
                       size_t n, int *argc, char ***argv);

/* Collective, after bt_cli_rank_start: the topology checked against the
 * number of ranks (a mismatch becomes prc 1 and its message in perr), every
 * rank's verdict and items compared (bt_cli_agree, which prints), then
 * bt_rank_setup.  0 when all went through; else the exit code, with
 * bt_rank_setup's message in err[n_err] (for rank 0 to print) or err empty
 * (bt_cli_agree printed it). */
/* The end of a subcommand that started ranks: bt_rank_free (MPI finalised),
 * after bt_cli_signals_ending when rc says the run failed. */
void bt_cli_rank_end(struct bt_rank *R, int rc);

int bt_cli_rank_agree(struct bt_rank *R, const struct bt_rank_config *c, int prc, char *perr, size_t n_perr,
                      const struct bt_cli_agree_item *items, int n_items, char *err, size_t n_err);

/* Collective, on every rank with the same n and option names.  rc, err: this
 * rank's verdict so far (0 and "" when its command line is fine; else the
 * exit code and its message).  Returns 0 when every rank is fine and every
 * item agrees with rank 0's; else, on every rank, the exit code of the first
 * rank at fault (2 for a mismatch), and rank 0 has printed
 *   "PROG: MESSAGE"                    (rank 0's own error)
 *   "PROG: rank R: MESSAGE"            (another rank's)
 *   "PROG: rank R was started with --m 8 but rank 0 with --m 4; every rank
 *    needs the same --m"
 * A transport failure ends the job (the transport aborts). */
int bt_cli_agree(bt_transport *t, const char *prog, int rc, const char *err, const struct bt_cli_agree_item *items,
                 int n);

#endif
