/* mpi_testutil.h - shared by the multi-rank suites (tests/mpi_test_*.c, linked
 * with -Wl,--wrap=_ck_assert_failed,--wrap=malloc,--wrap=calloc,--wrap=realloc):
 *   - fail fast: a failed ck_assert on any rank prints "rank R: file:line:
 *     message" and aborts the job through T (set T once MPI is up), instead of
 *     leaving the other ranks in a collective until ctest's timeout;
 *   - fault injection: fault_countdown > 0 makes the n-th allocation from now
 *     fail (fault_hit says one did);
 *   - running a suite on every rank with one verdict. */
#ifndef BATON_MPI_TESTUTIL_H
#define BATON_MPI_TESTUTIL_H

#include <check.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "transport.h"

extern bt_transport *T;
extern atomic_long fault_countdown;
extern atomic_int fault_hit;

/* Run the suite on every rank (no fork: MPI), rank 0 printing; 0 when no
 * rank had a failure, else 1 (on every rank). */
int mtu_run_suite(Suite *s);

#endif
