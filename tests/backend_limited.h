/* backend_limited.h - "cpu-limited", a backend for tests only: CPU kernels
 * behind its own buffer type (which the CPU backend treats as incompatible,
 * as it would a GPU's) and a supports_op that refuses a chosen set of ops.
 * With it, graphs really split and inputs are really copied, without a GPU.
 * It can run asynchronously, as a GPU does (bt_backend_limited_set_async).
 * It counts its asynchronous uploads so tests can check what was copied, and
 * has a host buffer type of its own (as a GPU's pinned memory) whose
 * allocations it counts. */
#ifndef BATON_TEST_BACKEND_LIMITED_H
#define BATON_TEST_BACKEND_LIMITED_H

#include "baton/backend.h"

struct bt_limited_stats {
    uint64_t set_async_calls; /* bt_backend_tensor_set_async into this backend */
    uint64_t set_async_bytes;
    uint64_t buffer_sets;     /* synchronous sets into its buffers */
    uint64_t buffer_set_bytes;
    uint64_t graph_computes;
    uint64_t nodes_computed;
    uint64_t events_recorded;
    uint64_t get_async_calls; /* bt_backend_tensor_get_async from this backend */
    uint64_t host_allocs;     /* buffers of its host buffer type */
    uint64_t host_alloc_bytes;
};

/* name: shown in plans ("LIMITED0"); refused: ops it will not run. */
bt_backend_t bt_backend_limited_init(const char *name, int n_threads, const enum bt_op *refused, int n_refused);
void bt_backend_limited_refuse(bt_backend_t backend, enum bt_op op, bool refuse);
struct bt_limited_stats bt_backend_limited_stats(bt_backend_t backend);
/* Make the backend asynchronous, as a GPU is: graph_compute, the
 * asynchronous copies and event records go on a queue that a worker thread
 * runs in order (each compute after delay_us, so that a caller who does not
 * wait for it reads stale data); synchronize, event_synchronize and the
 * buffers' synchronous calls wait for the queue, and event_wait makes the
 * queue wait.  Call it right after init. */
void bt_backend_limited_set_async(bt_backend_t backend, int delay_us);
void bt_backend_limited_reset_stats(bt_backend_t backend);
/* Give the backend memory of its own, as a GPU has (bt_backend_get_memory
 * reports free_bytes of total_bytes); without it, it computes in host memory. */
void bt_backend_limited_set_memory(bt_backend_t backend, size_t free_bytes, size_t total_bytes);

#endif
