/* mpi_testutil.c - what the multi-rank suites (tests/mpi_test_*.c) share:
 * a failed assertion on one rank ends every rank at once, and allocations
 * that fail on purpose.  See mpi_testutil.h. */
#include "mpi_testutil.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

bt_transport *T;

/* ---- fail fast: a failed assertion on one rank ends every rank ----------------
 * The other ranks would wait in a collective for ever (ctest's 600 s).  The
 * suite is linked with -Wl,--wrap=_ck_assert_failed: every failed ck_assert
 * lands here, prints the rank and the message, and aborts the job. */
void __wrap__ck_assert_failed(const char *file, int line, const char *expr, const char *msg, ...);
void __wrap__ck_assert_failed(const char *file, int line, const char *expr, const char *msg, ...) {
    char text[1024] = "";
    if (msg) {
        va_list ap;
        va_start(ap, msg);
        vsnprintf(text, sizeof text, msg, ap);
        va_end(ap);
    }
    fprintf(stderr, "rank %d: %s:%d: %s%s%s\n", T ? T->rank : -1, file, line, expr, text[0] ? ": " : "", text);
    fflush(stderr);
    if (T) T->iface.abort(T, 1);
    _exit(1);
}

/* ---- allocation failures on purpose (linked with --wrap=malloc,calloc,realloc) ---- */
atomic_long fault_countdown; /* > 0: the n-th allocation from now fails */
atomic_int fault_hit;
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
static bool fault_now(void) {
    if (atomic_load(&fault_countdown) <= 0) return false;
    if (atomic_fetch_sub(&fault_countdown, 1) != 1) return false;
    atomic_store(&fault_hit, 1);
    return true;
}
void *__wrap_malloc(size_t n) { return fault_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { return fault_now() ? NULL : __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { return fault_now() ? NULL : __real_realloc(p, n); }


int mtu_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* MPI and fork() do not mix */
    srunner_run_all(sr, T->rank == 0 ? CK_NORMAL : CK_SILENT);
    int64_t f = srunner_ntests_failed(sr);
    srunner_free(sr);
    /* every rank's verdict decides the exit code */
    if (T->iface.allreduce_max(T, &f, 1) != BT_OK) return 1;
    return f == 0 ? 0 : 1;
}
