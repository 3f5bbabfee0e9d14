/* backend.h - the backend interface (as ggml-backend.h): buffer types,
 * buffers, backends and events as opaque handles and the calls on them.  What
 * each handle holds (a vtable plus a context pointer) is in backend-impl.h,
 * which only backends and the code that implements one include (as
 * ggml-backend-impl.h); it is not installed.  The scheduler, the allocator
 * and a user program see only this header.
 *
 *   buffer type  where memory comes from (host, device, pinned host)
 *   buffer       one allocation of a buffer type; tensors are placed in it
 *   backend      a device plus a stream: computes graphs, copies tensors
 *   event        a point in a backend's stream that others can wait for
 */
#ifndef BATON_BACKEND_H
#define BATON_BACKEND_H

#include "graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bt_buffer_type *bt_buffer_type_t;
typedef struct bt_buffer *bt_buffer_t;
typedef struct bt_backend *bt_backend_t;
typedef struct bt_event *bt_event_t;

enum bt_buffer_usage {
    BT_BUFFER_USAGE_ANY = 0,
    BT_BUFFER_USAGE_WEIGHTS = 1,
    BT_BUFFER_USAGE_COMPUTE = 2,
};

/* ---- helpers (backend.c) ----------------------------------------------------- */

BT_API const char *bt_buft_name(bt_buffer_type_t buft);
BT_API bt_buffer_t bt_buft_alloc_buffer(bt_buffer_type_t buft, size_t size);
BT_API size_t bt_buft_get_alignment(bt_buffer_type_t buft);
BT_API size_t bt_buft_get_max_size(bt_buffer_type_t buft);
BT_API size_t bt_buft_get_alloc_size(bt_buffer_type_t buft, const struct bt_tensor *tensor);
BT_API bool bt_buft_is_host(bt_buffer_type_t buft);

BT_API void bt_buffer_free(bt_buffer_t buffer);
BT_API void *bt_buffer_get_base(bt_buffer_t buffer);
BT_API size_t bt_buffer_get_size(bt_buffer_t buffer);
BT_API bt_buffer_type_t bt_buffer_get_type(bt_buffer_t buffer);
BT_API void bt_buffer_clear(bt_buffer_t buffer, uint8_t value);
BT_API bool bt_buffer_is_host(bt_buffer_t buffer);
BT_API void bt_buffer_set_usage(bt_buffer_t buffer, enum bt_buffer_usage usage);
BT_API enum bt_buffer_usage bt_buffer_get_usage(bt_buffer_t buffer);
/* The one rule for what counts as a weight (the scheduler, placement and the
 * distributed runtime all use it): a tensor in memory is a weight when its
 * buffer (its view source's) is used for weights; a tensor without memory
 * yet (a plan made for other processes) when it is flagged
 * BT_TENSOR_FLAG_WEIGHT. */
BT_API bool bt_tensor_is_weight(const struct bt_tensor *t);

/* Place tensor at addr inside buffer (and init it). */
BT_API enum bt_status bt_tensor_alloc(bt_buffer_t buffer, struct bt_tensor *tensor, void *addr);
/* Give a view the data of its view_src (which must be placed). */
BT_API enum bt_status bt_view_init(struct bt_tensor *tensor);

/* Synchronous data movement between a tensor (in any buffer) and host memory. */
BT_API void bt_tensor_set(struct bt_tensor *tensor, const void *data, size_t offset, size_t size);
BT_API void bt_tensor_get(const struct bt_tensor *tensor, void *data, size_t offset, size_t size);
BT_API void bt_tensor_memset(struct bt_tensor *tensor, uint8_t value, size_t offset, size_t size);
/* Copy src into dst (same byte size), across any two buffers. */
BT_API void bt_tensor_copy(const struct bt_tensor *src, struct bt_tensor *dst);

BT_API const char *bt_backend_name(bt_backend_t backend);
BT_API void bt_backend_free(bt_backend_t backend);
BT_API bt_buffer_type_t bt_backend_get_default_buffer_type(bt_backend_t backend);
BT_API bt_buffer_t bt_backend_alloc_buffer(bt_backend_t backend, size_t size);
/* Memory for weights that only this backend reads: a buffer type that lays
 * a weight out for the backend's kernels as its bytes are set (the CPU's
 * repacks the matrices its matmul reads fastest repacked: the same results'
 * bits, the same bytes), else the default buffer type.  A weight in it is
 * read by this backend's ops alone and set whole (or whole matrices of it),
 * never read back (bt_tensor_get asserts on a repacked one). */
BT_API bt_buffer_type_t bt_backend_get_weight_buffer_type(bt_backend_t backend);
/* Host memory for staging this backend's tensors (is_host): the backend's
 * own (pinned for a GPU) or else the CPU's. */
BT_API bt_buffer_type_t bt_backend_get_host_buffer_type(bt_backend_t backend);
BT_API void bt_backend_tensor_set_async(bt_backend_t backend, struct bt_tensor *tensor, const void *data,
                                 size_t offset, size_t size);
BT_API void bt_backend_tensor_get_async(bt_backend_t backend, const struct bt_tensor *tensor, void *data,
                                 size_t offset, size_t size);
/* true when the pair copied asynchronously (in stream order); false, with
 * nothing done, when it cannot. */
BT_API bool bt_backend_tensor_try_copy_async(bt_backend_t backend_src, bt_backend_t backend_dst,
                                      const struct bt_tensor *src, struct bt_tensor *dst);
/* Asynchronous when the pair allows it, else synchronous. */
BT_API void bt_backend_tensor_copy_async(bt_backend_t backend_src, bt_backend_t backend_dst,
                                  const struct bt_tensor *src, struct bt_tensor *dst);
BT_API void bt_backend_synchronize(bt_backend_t backend);
BT_API enum bt_status bt_backend_graph_compute_async(bt_backend_t backend, struct bt_graph *graph);
BT_API enum bt_status bt_backend_graph_compute(bt_backend_t backend, struct bt_graph *graph);
BT_API bool bt_backend_supports_op(bt_backend_t backend, const struct bt_tensor *op);
BT_API bool bt_backend_supports_buft(bt_backend_t backend, bt_buffer_type_t buft);
BT_API bool bt_backend_offload_op(bt_backend_t backend, const struct bt_tensor *op);
/* The backend's own memory (a GPU's): true with its free and total bytes;
 * false for a backend that computes in host memory. */
BT_API bool bt_backend_get_memory(bt_backend_t backend, size_t *free, size_t *total);
/* The memory a rank on this backend places weights in and checks its
 * allocations against: limit when > 0; else a backend with memory of its
 * own its free memory now; else this machine's physical memory shared by
 * ranks_on_host ranks.  *what (may be NULL) says which of the three, for a
 * message. */
BT_API int64_t bt_backend_plan_memory(bt_backend_t backend, int64_t limit, int ranks_on_host, const char **what);
BT_API const char *bt_backend_error(bt_backend_t backend);

/* NULL when the backend has no events. */
BT_API bt_event_t bt_event_new(bt_backend_t backend);
BT_API void bt_event_free(bt_event_t event);
BT_API void bt_event_record(bt_event_t event, bt_backend_t backend);
BT_API void bt_event_synchronize(bt_event_t event);
BT_API void bt_backend_event_wait(bt_backend_t backend, bt_event_t event);

/* Allocate every tensor of ctx that has no data yet in one buffer of buft
 * (views get their source's data).  NULL and a message in ctx on failure. */
BT_API bt_buffer_t bt_alloc_ctx_tensors_from_buft(bt_context *ctx, bt_buffer_type_t buft);
BT_API bt_buffer_t bt_alloc_ctx_tensors(bt_context *ctx, bt_backend_t backend);

/* fn(user) on the calling thread after it has done its share of each node
 * of the graphs the backend computes from now on (before the barrier that
 * follows the node, if any): a place for short work between ops, such as a
 * transport's progress, without a thread of its own competing for the
 * cores; it must not touch the graph.  fn NULL: none.  false, with nothing
 * set, when the backend has no such hook (a GPU's, whose host thread is
 * free while the device computes). */
BT_API bool bt_backend_set_node_hook(bt_backend_t backend, void (*fn)(void *user), void *user);
/* A description of the backend for a log line into buf (n bytes, cut to
 * fit): its name and what it runs where it says more (the CPU: the variant
 * of its kernels, "CPU(avx512)"), else its name.  Returns buf. */
BT_API const char *bt_backend_describe(bt_backend_t backend, char *buf, size_t n);

/* ---- host memory -------------------------------------------------------------- */

/* The host buffer type: 64-byte aligned plain host memory (a singleton in
 * the core, backend.c, as ggml keeps its CPU buffer type; the CPU backend's
 * default, and the staging memory of a backend without its own). */
BT_API bt_buffer_type_t bt_cpu_buffer_type(void);

/* The backend's mul_mat speed in GFLOP/s (a ~50 ms probe on a 512 x 512 x 64
 * f32 product; 1.0 when it cannot run). */
BT_API double bt_backend_measure_gflops(bt_backend_t backend);

#ifdef __cplusplus
}
#endif
#endif
