/* measure.c - machine figures for benchmarks: streaming-read bandwidth and
 * FMA peak, measured with n_threads pthreads (each thread its own share of
 * the work, started together at a barrier; the time is the slowest
 * thread's; best of several passes). */
#include "cpu_impl.h"

#include "baton/backend.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MEASURE_PASSES 5

/* A barrier whose thread count can be lowered before its first use (when a
 * thread could not be started), unlike pthread_barrier_t. */
struct mbar {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, count, gen;
};

static void mbar_wait(struct mbar *b) {
    pthread_mutex_lock(&b->mu);
    const int gen = b->gen;
    if (++b->count >= b->n) {
        b->count = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cv);
    } else {
        while (gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
    }
    pthread_mutex_unlock(&b->mu);
}

struct measure_thread {
    struct mbar *start, *stop;
    const char *data; /* this thread's share (read bandwidth) */
    size_t bytes;
    long iters; /* FMA loop iterations */
    int passes;
    double sink;
};

/* ---- streaming read ---- */

static double read_share(const char *p, size_t bytes) {
#if defined(__AVX512F__)
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 256 <= bytes; i += 256) {
        s0 = _mm512_add_epi64(s0, _mm512_load_si512((const void *)(p + i)));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512((const void *)(p + i + 64)));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512((const void *)(p + i + 128)));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
    return (double)_mm512_reduce_add_epi64(s0);
#elif defined(__AVX2__)
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 128 <= bytes; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    int64_t t[4];
    memcpy(t, &s0, sizeof(t));
    return (double)(t[0] + t[1] + t[2] + t[3]);
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const uint64_t *q = (const uint64_t *)p;
    for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
        s0 += q[i];
        s1 += q[i + 1];
        s2 += q[i + 2];
        s3 += q[i + 3];
    }
    return (double)(s0 + s1 + s2 + s3);
#endif
}

static void *read_main(void *arg) {
    struct measure_thread *t = arg;
    for (int pass = 0; pass < t->passes; pass++) {
        mbar_wait(t->start);
        t->sink += read_share(t->data, t->bytes);
        mbar_wait(t->stop);
    }
    return NULL;
}

/* ---- FMA chains ---- */

#define FMA_CHAINS 12
static double fma_loop(long iters) {
#if defined(__AVX512F__)
    typedef __m512 v;
#define V_SET1 _mm512_set1_ps
#define V_FMA _mm512_fmadd_ps
#define V_ADD _mm512_add_ps
#define V_SUM _mm512_reduce_add_ps
#elif defined(__AVX2__) && defined(__FMA__)
    typedef __m256 v;
#define V_SET1 _mm256_set1_ps
#define V_FMA _mm256_fmadd_ps
#define V_ADD _mm256_add_ps
#define V_SUM(x) ((x)[0] + (x)[1] + (x)[2] + (x)[3] + (x)[4] + (x)[5] + (x)[6] + (x)[7])
#endif
#if defined(V_FMA)
    /* 12 named chains (an array would be kept in memory by the compiler) */
    v c0 = V_SET1(1.00f), c1 = V_SET1(1.01f), c2 = V_SET1(1.02f), c3 = V_SET1(1.03f);
    v c4 = V_SET1(1.04f), c5 = V_SET1(1.05f), c6 = V_SET1(1.06f), c7 = V_SET1(1.07f);
    v c8 = V_SET1(1.08f), c9 = V_SET1(1.09f), c10 = V_SET1(1.10f), c11 = V_SET1(1.11f);
    /* acc = acc * 0.999999 + 1e-6: stays near 1, no denormals */
    const v m = V_SET1(0.999999f), a = V_SET1(1e-6f);
    for (long i = 0; i < iters; i++) {
        c0 = V_FMA(c0, m, a);
        c1 = V_FMA(c1, m, a);
        c2 = V_FMA(c2, m, a);
        c3 = V_FMA(c3, m, a);
        c4 = V_FMA(c4, m, a);
        c5 = V_FMA(c5, m, a);
        c6 = V_FMA(c6, m, a);
        c7 = V_FMA(c7, m, a);
        c8 = V_FMA(c8, m, a);
        c9 = V_FMA(c9, m, a);
        c10 = V_FMA(c10, m, a);
        c11 = V_FMA(c11, m, a);
        /* keep the chains in registers and alive (no instruction) */
        __asm__ __volatile__("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5));
        __asm__ __volatile__("" : "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
    }
    v s = V_ADD(V_ADD(V_ADD(c0, c1), V_ADD(c2, c3)), V_ADD(V_ADD(c4, c5), V_ADD(c6, c7)));
    s = V_ADD(s, V_ADD(V_ADD(c8, c9), V_ADD(c10, c11)));
    return (double)V_SUM(s);
#undef V_SET1
#undef V_FMA
#undef V_ADD
#undef V_SUM
#else
    float acc[FMA_CHAINS][8];
    for (int c = 0; c < FMA_CHAINS; c++)
        for (int l = 0; l < 8; l++) acc[c][l] = 1.0f;
    for (long i = 0; i < iters; i++)
        for (int c = 0; c < FMA_CHAINS; c++)
            for (int l = 0; l < 8; l++) acc[c][l] = acc[c][l] * 0.999999f + 1e-6f;
    double s = 0;
    for (int c = 0; c < FMA_CHAINS; c++)
        for (int l = 0; l < 8; l++) s += acc[c][l];
    return s;
#endif
}

static int fma_lanes(void) {
#if defined(__AVX512F__)
    return 16;
#else
    return 8;
#endif
}

static void *fma_main(void *arg) {
    struct measure_thread *t = arg;
    for (int pass = 0; pass < t->passes; pass++) {
        mbar_wait(t->start);
        t->sink += fma_loop(t->iters);
        mbar_wait(t->stop);
    }
    return NULL;
}

/* Run fn on n_threads threads (the caller is one of them) for `passes`
 * passes; returns the best wall time of a pass (start barrier to stop
 * barrier), or -1 when not every thread could be started. */
static double run_timed(void *(*fn)(void *), struct measure_thread *ts, int n_threads, int passes) {
    struct mbar start = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, n_threads, 0, 0};
    struct mbar stop = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, n_threads, 0, 0};
    pthread_t *th = calloc((size_t)n_threads, sizeof(*th));
    if (!th) return -1.0;
    for (int i = 0; i < n_threads; i++) {
        ts[i].start = &start;
        ts[i].stop = &stop;
        ts[i].passes = passes;
    }
    int started = 1;
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&th[i], NULL, fn, &ts[i]) != 0) break;
        started++;
    }
    if (started < n_threads) { /* run with the threads we have, report failure */
        pthread_mutex_lock(&start.mu);
        start.n = stop.n = started;
        pthread_mutex_unlock(&start.mu);
    }
    double best = -1.0;
    for (int pass = 0; pass < passes; pass++) {
        mbar_wait(&start);
        const double t0 = bt_now_s();
        if (fn == read_main)
            ts[0].sink += read_share(ts[0].data, ts[0].bytes);
        else
            ts[0].sink += fma_loop(ts[0].iters);
        mbar_wait(&stop);
        const double dt = bt_now_s() - t0;
        if (best < 0 || dt < best) best = dt;
    }
    for (int i = 1; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    return started == n_threads ? best : -1.0;
}

double bt_cpu_measure_read_bw(size_t bytes, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    bytes = bytes / (256 * (size_t)n_threads) * (256 * (size_t)n_threads);
    if (bytes == 0) return 0.0;
    void *buf = bt_host_alloc(bytes); /* the pages the kernels' weights get */
    if (!buf) return 0.0;
    memset(buf, 1, bytes); /* touch every page first */
    struct measure_thread *ts = calloc((size_t)n_threads, sizeof(*ts));
    if (!ts) {
        free(buf);
        return 0.0;
    }
    const size_t share = bytes / (size_t)n_threads;
    for (int i = 0; i < n_threads; i++) {
        ts[i].data = (const char *)buf + share * (size_t)i;
        ts[i].bytes = share;
    }
    const double best = run_timed(read_main, ts, n_threads, MEASURE_PASSES);
    volatile double sink = 0;
    for (int i = 0; i < n_threads; i++) sink += ts[i].sink;
    (void)sink;
    free(ts);
    free(buf);
    return best > 0 ? (double)bytes / best : 0.0;
}

double bt_cpu_measure_fma_peak(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    struct measure_thread *ts = calloc((size_t)n_threads, sizeof(*ts));
    if (!ts) return 0.0;
    const long iters = 20L * 1000 * 1000; /* ~0.1 s at 2.5 GHz with 2 FMA ports */
    for (int i = 0; i < n_threads; i++) ts[i].iters = iters;
    const double best = run_timed(fma_main, ts, n_threads, MEASURE_PASSES);
    volatile double sink = 0;
    for (int i = 0; i < n_threads; i++) sink += ts[i].sink;
    (void)sink;
    free(ts);
    /* 2 FLOP per lane per FMA */
    return best > 0 ? 2.0 * fma_lanes() * FMA_CHAINS * (double)iters * n_threads / best : 0.0;
}
