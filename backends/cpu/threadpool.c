/* threadpool.c - the CPU executor's persistent thread pool.
 *
 * The caller is thread 0; n_threads - 1 workers live as long as the pool.
 * A run publishes (fn, arg) and bumps `generation`; each worker notices the
 * new generation, calls fn(arg, ith, nth), and counts itself done.  Idle
 * workers spin briefly on the generation counter, then sleep on a condition
 * variable, so a pool between runs holds no core (several ranks may share
 * few cores).  The caller waits for the workers the same way: spin, then
 * sleep (it yielded in between until the 2026-12-01 02:40 UTC build: see the barrier below).
 *
 * bt_threadpool_barrier is a sense-reversing barrier (a phase counter) among
 * the nth threads of the current run; waiters spin with a pause, then sleep.
 * How long they spin adapts (barrier_spin): a decode step is a hundred or
 * more small nodes, each ending in a barrier, and a waiter that yields its
 * core while a background process is runnable loses the core for a time
 * slice, far longer than the wait it yielded for; but when the thread it
 * waits for is not running (more threads than cores: ranks sharing cores),
 * spinning only delays it.  So waiters spin up to a time budget, the budget
 * halves each time a wait outlasts it and doubles back each time a wait ends
 * inside it, and a pool with more threads than the cores it may run on
 * spins only briefly (BT_BARRIER_SPIN pauses).
 *
 * After the spin the waiter sleeps on the phase (a futex, on Linux; the last
 * to arrive wakes the sleepers).  It used to call sched_yield in a loop: with
 * another process runnable on its core, each yield hands that process a
 * whole time slice, milliseconds, at every barrier of a decode step, while
 * the scheduler runs a woken task that slept ahead of one that kept running
 * (generation next to a busy process, 2 cores: Q4_K_M 1.0-1.25x the
 * yielding version's tokens/s, up to 2x with more load; Q4_0 unchanged).
 * On an idle core a sleep and its wake-up cost a few microseconds (a futex
 * round trip between two threads here: 4-6 us, against 2-3 us yielding), so
 * the budget's floor (BT_BARRIER_SPIN_NS >> BT_BARRIER_SHIFT_MAX, 12.5 us) is
 * above a decode step's usual waits.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "cpu_impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BT_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define BT_CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define BT_CPU_RELAX() ((void)0)
#endif

#ifndef BT_POOL_SPIN
#define BT_POOL_SPIN 4096 /* pause iterations before an idle worker sleeps */
#endif
#ifndef BT_BARRIER_SPIN
/* pause iterations before a barrier waiter may sleep: short, because
 * with more threads than free cores the thread being waited for may need
 * this core */
#define BT_BARRIER_SPIN 256
#endif
#ifndef BT_BARRIER_SPIN_NS
/* the most a barrier waiter spins (ns) when the pool has a core per thread:
 * longer than a node's usual imbalance, short next to a time slice */
#define BT_BARRIER_SPIN_NS 100000
#endif
#define BT_BARRIER_SHIFT_MAX 3 /* the budget's floor: BT_BARRIER_SPIN_NS >> 3 (12.5 us) */

struct bt_worker {
    bt_threadpool *pool;
    int ith;
};

struct bt_threadpool {
    int n_threads;
    pthread_t *threads;        /* [n_threads - 1] */
    struct bt_worker *workers; /* [n_threads - 1] */

    pthread_mutex_t mutex;
    pthread_cond_t cond_work; /* workers sleep here for a new generation */
    pthread_cond_t cond_done; /* the caller sleeps here for n_done */

    /* the current run; fn/arg are written before generation is bumped */
    bt_task_fn fn;
    void *arg;
    atomic_int generation;
    atomic_int n_done; /* workers finished with the current generation */
    atomic_bool stop;
    atomic_bool running;

    /* barrier */
    atomic_int bar_count;
    atomic_int bar_phase;
    atomic_int bar_sleepers; /* waiters asleep on bar_phase, or about to be */
    int64_t spin_ns;        /* the spin budget's ceiling; 0: more threads than cores */
    atomic_int spin_shift;  /* the budget is spin_ns >> spin_shift */
};

/* CPUs this process may run on (its affinity mask), else the online CPUs. */
static int usable_cpus(void) {
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void *worker_main(void *p) {
    struct bt_worker *w = p;
    bt_threadpool *pool = w->pool;
    /* generation is 0 when the pool starts its threads; reading it here
     * instead could miss a run published before this thread got going */
    int seen = 0;

    for (;;) {
        /* wait for a new generation (or stop): spin, then sleep */
        int gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        for (int i = 0; gen == seen && i < BT_POOL_SPIN; i++) {
            if (atomic_load_explicit(&pool->stop, memory_order_relaxed)) break;
            BT_CPU_RELAX();
            gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        }
        if (gen == seen) {
            pthread_mutex_lock(&pool->mutex);
            while ((gen = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cond_work, &pool->mutex);
            pthread_mutex_unlock(&pool->mutex);
        }
        if (atomic_load(&pool->stop)) break;
        seen = gen;

        pool->fn(pool->arg, w->ith, pool->n_threads);

        if (atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_acq_rel) + 1 ==
            pool->n_threads - 1) {
            /* the last worker: wake the caller if it went to sleep */
            pthread_mutex_lock(&pool->mutex);
            pthread_cond_signal(&pool->cond_done);
            pthread_mutex_unlock(&pool->mutex);
        }
    }
    return NULL;
}

bt_threadpool *bt_threadpool_new(int n_threads) {
    BT_ASSERT(n_threads >= 1);
    bt_threadpool *pool = calloc(1, sizeof(*pool));
    if (!pool) return NULL;
    pool->n_threads = n_threads;
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->n_done, 0);
    atomic_init(&pool->stop, false);
    atomic_init(&pool->running, false);
    atomic_init(&pool->bar_count, 0);
    atomic_init(&pool->bar_phase, 0);
    atomic_init(&pool->bar_sleepers, 0);
    atomic_init(&pool->spin_shift, 0);
    pool->spin_ns = n_threads <= usable_cpus() ? BT_BARRIER_SPIN_NS : 0;
    if (n_threads == 1) return pool;

    if (pthread_mutex_init(&pool->mutex, NULL) != 0) goto fail_mutex;
    if (pthread_cond_init(&pool->cond_work, NULL) != 0) goto fail_cw;
    if (pthread_cond_init(&pool->cond_done, NULL) != 0) goto fail_cd;
    pool->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
    pool->workers = calloc((size_t)n_threads - 1, sizeof(struct bt_worker));
    if (!pool->threads || !pool->workers) goto fail_alloc;

    int started = 0;
    for (; started < n_threads - 1; started++) {
        pool->workers[started].pool = pool;
        pool->workers[started].ith = started + 1;
        if (pthread_create(&pool->threads[started], NULL, worker_main, &pool->workers[started]) != 0)
            break;
    }
    if (started == n_threads - 1) return pool;

    /* could not start every thread: stop those that did */
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stop, true);
    pthread_cond_broadcast(&pool->cond_work);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 0; i < started; i++) pthread_join(pool->threads[i], NULL);
fail_alloc:
    free(pool->threads);
    free(pool->workers);
    pthread_cond_destroy(&pool->cond_done);
fail_cd:
    pthread_cond_destroy(&pool->cond_work);
fail_cw:
    pthread_mutex_destroy(&pool->mutex);
fail_mutex:
    free(pool);
    return NULL;
}

void bt_threadpool_free(bt_threadpool *pool) {
    if (!pool) return;
    if (pool->n_threads > 1) {
        BT_ASSERT(!atomic_load(&pool->running));
        pthread_mutex_lock(&pool->mutex);
        atomic_store(&pool->stop, true);
        pthread_cond_broadcast(&pool->cond_work);
        pthread_mutex_unlock(&pool->mutex);
        for (int i = 0; i < pool->n_threads - 1; i++) pthread_join(pool->threads[i], NULL);
        free(pool->threads);
        free(pool->workers);
        pthread_cond_destroy(&pool->cond_done);
        pthread_cond_destroy(&pool->cond_work);
        pthread_mutex_destroy(&pool->mutex);
    }
    free(pool);
}

int bt_threadpool_n_threads(const bt_threadpool *pool) { return pool->n_threads; }

void bt_threadpool_run(bt_threadpool *pool, bt_task_fn fn, void *arg) {
    const int nth = pool->n_threads;
    if (nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* one run at a time: the pool is not reentrant */
    BT_ASSERT(!atomic_exchange(&pool->running, true));

    pool->fn = fn;
    pool->arg = arg;
    atomic_store(&pool->n_done, 0);
    atomic_store(&pool->bar_count, 0);
    /* publish under the mutex so a worker between its check and its wait
     * cannot miss the wake-up */
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cond_work);
    pthread_mutex_unlock(&pool->mutex);

    fn(arg, 0, nth);

    /* wait for the workers: spin, then sleep */
    const int want = nth - 1;
    for (int i = 0; atomic_load_explicit(&pool->n_done, memory_order_acquire) != want; i++) {
        if (i < BT_POOL_SPIN) {
            BT_CPU_RELAX();
            continue;
        }
        pthread_mutex_lock(&pool->mutex);
        while (atomic_load(&pool->n_done) != want) pthread_cond_wait(&pool->cond_done, &pool->mutex);
        pthread_mutex_unlock(&pool->mutex);
        break;
    }
    atomic_store(&pool->running, false);
}

/* Wait for the barrier's phase to leave `phase` by spinning: at least
 * BT_BARRIER_SPIN pauses, then until the pool's budget has passed.  true:
 * it left; false: the budget ran out (the caller waits on otherwise).
 * Each outcome moves the budget (one relaxed store, only when it changes). */
static bool barrier_spin(bt_threadpool *pool, int phase) {
    const int shift = atomic_load_explicit(&pool->spin_shift, memory_order_relaxed);
    const int64_t budget = pool->spin_ns >> shift;
    double t0 = 0.0;
    for (int i = 0;; i++) {
        if (atomic_load(&pool->bar_phase) != phase) {
            if (shift > 0 && pool->spin_ns > 0)
                atomic_store_explicit(&pool->spin_shift, shift - 1, memory_order_relaxed);
            return true;
        }
        BT_CPU_RELAX();
        if (i < BT_BARRIER_SPIN || (i & 15) != 0) continue;
        if (budget <= 0) break;
        const double t = bt_now_s();
        if (t0 == 0.0) t0 = t;
        else if (t - t0 > 1e-9 * (double)budget) break;
    }
    if (shift < BT_BARRIER_SHIFT_MAX && pool->spin_ns > 0)
        atomic_store_explicit(&pool->spin_shift, shift + 1, memory_order_relaxed);
    return false;
}

/* Sleep until the barrier's phase leaves `phase`.  The sleeper counts
 * itself before it checks the phase (in the kernel, atomically with going to
 * sleep), and the last to arrive moves the phase before it reads the count:
 * one of the two sees the other's write (all sequentially consistent), so no
 * wake-up is lost. */
static void barrier_sleep(bt_threadpool *pool, int phase) {
#ifdef __linux__
    atomic_fetch_add(&pool->bar_sleepers, 1);
    while (atomic_load(&pool->bar_phase) == phase)
        syscall(SYS_futex, (int *)&pool->bar_phase, FUTEX_WAIT_PRIVATE, phase, NULL, NULL, 0);
    atomic_fetch_sub(&pool->bar_sleepers, 1);
#else
    while (atomic_load(&pool->bar_phase) == phase) sched_yield();
#endif
}

void bt_threadpool_barrier(bt_threadpool *pool) {
    const int nth = pool->n_threads;
    if (nth == 1) return;
    /* The phase cannot move on before this thread arrives, so reading it
     * first is safe; the last to arrive resets the count, then flips it. */
    const int phase = atomic_load(&pool->bar_phase);
    if (atomic_fetch_add(&pool->bar_count, 1) == nth - 1) {
        atomic_store(&pool->bar_count, 0);
        atomic_fetch_add(&pool->bar_phase, 1);
#ifdef __linux__
        if (atomic_load(&pool->bar_sleepers) > 0)
            syscall(SYS_futex, (int *)&pool->bar_phase, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#endif
        return;
    }
    if (barrier_spin(pool, phase)) return;
    barrier_sleep(pool, phase);
}
