/* cpu_impl.h - internal interface between the CPU executor (cpu.c), the
 * thread pool (threadpool.c), the element-wise / row kernels (ops_cpu.c) and
 * the matrix kernels (matmul.c) and fused attention (attn.c).  Not part of the public API. */
#ifndef BATON_CPU_IMPL_H
#define BATON_CPU_IMPL_H

#include "cpu.h"
#include "ops.h"

/* ---- thread pool ---- */
typedef struct bt_threadpool bt_threadpool;
typedef void (*bt_task_fn)(void *arg, int ith, int nth);
/* n_threads workers in all, the caller being thread 0. */
bt_threadpool *bt_threadpool_new(int n_threads);
void bt_threadpool_free(bt_threadpool *pool);
int bt_threadpool_n_threads(const bt_threadpool *pool);
/* Run fn(arg, ith, nth) on every thread (the caller is ith 0); returns when
 * all have finished.  Idle workers spin briefly, then sleep. */
void bt_threadpool_run(bt_threadpool *pool, bt_task_fn fn, void *arg);
/* Barrier among the threads of the current run (for ops with phases). */
void bt_threadpool_barrier(bt_threadpool *pool);

/* ---- what one thread sees while computing one node ---- */
struct bt_cpu_params {
    int ith, nth;
    void *wdata;         /* work buffer shared by all threads, 64-byte aligned */
    size_t wsize;        /* its size: bt_cpu_work_size(node, nth) */
    bool reference;      /* use plain reference kernels */
    bt_threadpool *pool; /* for bt_threadpool_barrier */
    /* first run-time error of this node; any thread may set it */
    volatile int *status;
    char *errbuf;        /* message for *status, BT_CPU_ERRBUF bytes */
};
#define BT_CPU_ERRBUF 256

/* Report a run-time error from a kernel (first one wins; thread-safe). */
void bt_cpu_fail(const struct bt_cpu_params *p, enum bt_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ops_cpu.c: every op except MUL_MAT / MUL_MAT_ID */
void bt_cpu_compute_op(const struct bt_cpu_params *p, struct bt_tensor *node);
bool bt_cpu_op_supported(const struct bt_tensor *node);
size_t bt_cpu_op_work_size(const struct bt_tensor *node, int nth);

/* matmul.c */
void bt_cpu_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *dst);
void bt_cpu_mul_mat_id(const struct bt_cpu_params *p, struct bt_tensor *dst);
bool bt_cpu_mul_mat_supported(const struct bt_tensor *node);
size_t bt_cpu_mul_mat_work_size(const struct bt_tensor *node, int nth);

/* attn.c: FLASH_ATTN */
void bt_cpu_flash_attn(const struct bt_cpu_params *p, struct bt_tensor *dst);
bool bt_cpu_flash_attn_supported(const struct bt_tensor *node);
size_t bt_cpu_flash_attn_work_size(const struct bt_tensor *node, int nth);

/* Work buffer bytes for node with nth threads (dispatches to the above). */
size_t bt_cpu_work_size(const struct bt_tensor *node, int nth);

#endif
