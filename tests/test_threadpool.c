/* test_threadpool.c - the CPU executor's thread pool (backends/cpu/threadpool.c):
 * runs and barriers, with as many threads as cores and with more (where
 * waiters stop spinning early and sleep), and with a thread that arrives late
 * (the others' spin runs out, they sleep, and must be woken).  A lost wake-up
 * hangs a run: Check's timeout ends the test. */
#include <check.h>
#include <stdatomic.h>
#include <time.h>

#include "cpu_impl.h"

#define MAX_THREADS 8

struct phases {
    bt_threadpool *pool;
    int rounds;
    int late_every; /* thread nth - 1 sleeps this often (0: never), so the others sleep */
    atomic_int slot[MAX_THREADS];
    atomic_int bad; /* rounds in which a thread saw another's slot not yet written */
    atomic_int runs[MAX_THREADS];
};

static void nap_us(long us) {
    const struct timespec d = {0, us * 1000L};
    nanosleep(&d, NULL);
}

static void phases_task(void *arg, int ith, int nth) {
    struct phases *ph = arg;
    atomic_fetch_add(&ph->runs[ith], 1);
    for (int r = 1; r <= ph->rounds; r++) {
        if (ph->late_every > 0 && ith == nth - 1 && r % ph->late_every == 0) nap_us(300);
        atomic_store_explicit(&ph->slot[ith], r, memory_order_relaxed);
        bt_threadpool_barrier(ph->pool);
        for (int j = 0; j < nth; j++)
            if (atomic_load_explicit(&ph->slot[j], memory_order_relaxed) != r) atomic_fetch_add(&ph->bad, 1);
        bt_threadpool_barrier(ph->pool);
    }
}

static void run_phases(int nth, int rounds, int late_every, int runs) {
    struct phases ph = {.pool = bt_threadpool_new(nth), .rounds = rounds, .late_every = late_every};
    ck_assert_ptr_nonnull(ph.pool);
    ck_assert_int_eq(bt_threadpool_n_threads(ph.pool), nth);
    for (int i = 0; i < runs; i++) bt_threadpool_run(ph.pool, phases_task, &ph);
    bt_threadpool_free(ph.pool);
    ck_assert_msg(atomic_load(&ph.bad) == 0, "%d threads: a thread passed a barrier before another arrived (%d times)",
                  nth, atomic_load(&ph.bad));
    for (int i = 0; i < nth; i++) ck_assert_int_eq(atomic_load(&ph.runs[i]), runs);
}

START_TEST(test_barrier_orders_phases) {
    run_phases(1, 200, 0, 2);
    run_phases(2, 2000, 0, 3);
    run_phases(3, 1000, 0, 3);
}
END_TEST

/* A late thread: the others' spin budget runs out and they sleep; the last to
 * arrive must wake them, every time (and the budget comes back afterwards:
 * the rounds without a late thread keep passing). */
START_TEST(test_barrier_wakes_sleepers) {
    run_phases(2, 400, 7, 2);
    run_phases(4, 200, 5, 2);
}
END_TEST

/* More threads than cores: waiters spin briefly, then sleep, and the run
 * still completes (repeatedly: the pool's idle sleep between runs too). */
START_TEST(test_barrier_oversubscribed) {
    run_phases(MAX_THREADS, 300, 0, 5);
    run_phases(MAX_THREADS, 100, 9, 3);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("threadpool");
    TCase *tc = tcase_create("barrier");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_barrier_orders_phases);
    tcase_add_test(tc, test_barrier_wakes_sleepers);
    tcase_add_test(tc, test_barrier_oversubscribed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
