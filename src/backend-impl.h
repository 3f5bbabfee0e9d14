/* backend-impl.h - what the handles of backend.h hold: the vtables of buffer
 * types, buffers, backends and events, each a table of functions plus a
 * context pointer, for the code that implements one (backends/cpu,
 * backends/cuda, the planner's stand-in ranks, the runtime's measuring
 * buffer type, the test backends).  Internal, as ggml-backend-impl.h: not
 * installed; a user program uses the calls of backend.h. */
#ifndef BATON_BACKEND_IMPL_H
#define BATON_BACKEND_IMPL_H

#include "baton/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- buffer type ---------------------------------------------------------- */

struct bt_buffer_type_i {
    const char *(*get_name)(bt_buffer_type_t buft);
    /* NULL when the memory cannot be had */
    bt_buffer_t (*alloc_buffer)(bt_buffer_type_t buft, size_t size);
    size_t (*get_alignment)(bt_buffer_type_t buft);
    size_t (*get_max_size)(bt_buffer_type_t buft);                                 /* optional: SIZE_MAX */
    size_t (*get_alloc_size)(bt_buffer_type_t buft, const struct bt_tensor *tensor); /* optional: bt_nbytes */
    bool (*is_host)(bt_buffer_type_t buft); /* optional: false; data readable by the CPU */
};

struct bt_buffer_type {
    struct bt_buffer_type_i iface;
    void *context;
};

/* ---- buffer --------------------------------------------------------------- */

struct bt_buffer_i {
    void (*free_buffer)(bt_buffer_t buffer);
    void *(*get_base)(bt_buffer_t buffer);
    /* optional: prepare a tensor just placed in this buffer */
    enum bt_status (*init_tensor)(bt_buffer_t buffer, struct bt_tensor *tensor);
    void (*memset_tensor)(bt_buffer_t buffer, struct bt_tensor *tensor, uint8_t value, size_t offset,
                          size_t size);
    void (*set_tensor)(bt_buffer_t buffer, struct bt_tensor *tensor, const void *data, size_t offset,
                       size_t size);
    void (*get_tensor)(bt_buffer_t buffer, const struct bt_tensor *tensor, void *data, size_t offset,
                       size_t size);
    /* optional: dst lives in this buffer; true when it did the copy */
    bool (*cpy_tensor)(bt_buffer_t buffer, const struct bt_tensor *src, struct bt_tensor *dst);
    void (*clear)(bt_buffer_t buffer, uint8_t value);
};

struct bt_buffer {
    struct bt_buffer_i iface;
    bt_buffer_type_t buft;
    void *context;
    size_t size;
    enum bt_buffer_usage usage;
};

/* ---- events ---------------------------------------------------------------- */

struct bt_event {
    bt_backend_t backend;
    void *context;
};

/* ---- backend ---------------------------------------------------------------- */

struct bt_backend_i {
    const char *(*get_name)(bt_backend_t backend);
    void (*free)(bt_backend_t backend);
    bt_buffer_type_t (*get_default_buffer_type)(bt_backend_t backend);

    /* optional asynchronous transfers (in the backend's stream order) */
    void (*set_tensor_async)(bt_backend_t backend, struct bt_tensor *tensor, const void *data,
                             size_t offset, size_t size);
    void (*get_tensor_async)(bt_backend_t backend, const struct bt_tensor *tensor, void *data,
                             size_t offset, size_t size);
    /* optional: copy src (on backend_src) into dst (on backend_dst); false when
     * this pair cannot copy asynchronously */
    bool (*cpy_tensor_async)(bt_backend_t backend_src, bt_backend_t backend_dst,
                             const struct bt_tensor *src, struct bt_tensor *dst);

    void (*synchronize)(bt_backend_t backend); /* optional: a synchronous backend */

    /* run the graph's nodes in order; may return before they finish */
    enum bt_status (*graph_compute)(bt_backend_t backend, struct bt_graph *graph);

    bool (*supports_op)(bt_backend_t backend, const struct bt_tensor *op);
    bool (*supports_buft)(bt_backend_t backend, bt_buffer_type_t buft);
    /* optional: worth running op here although its weights live elsewhere */
    bool (*offload_op)(bt_backend_t backend, const struct bt_tensor *op);

    /* optional events; a backend without them is synchronised instead */
    bt_event_t (*event_new)(bt_backend_t backend);
    void (*event_free)(bt_event_t event);
    void (*event_record)(bt_event_t event, bt_backend_t backend);
    void (*event_wait)(bt_backend_t backend, bt_event_t event);
    void (*event_synchronize)(bt_event_t event);

    /* optional: the message of the last failed graph_compute */
    const char *(*get_error)(bt_backend_t backend);

    /* optional: host memory this backend copies to and from fastest (pinned
     * memory for a GPU); without it, plain host memory */
    bt_buffer_type_t (*get_host_buffer_type)(bt_backend_t backend);

    /* optional: a backend with memory of its own (a GPU's): its free and
     * total bytes now; without it, the backend computes in host memory */
    void (*get_memory)(bt_backend_t backend, size_t *free, size_t *total);

    /* optional: fn(user) on the calling thread after its share of each
     * computed node (bt_backend_set_node_hook); without it, no hook */
    void (*set_node_hook)(bt_backend_t backend, void (*fn)(void *user), void *user);
    /* optional: a description for a log line into buf (bt_backend_describe);
     * without it, the backend's name */
    void (*describe)(bt_backend_t backend, char *buf, size_t n);
    /* optional: memory for weights only this backend reads, in the layout
     * its kernels read fastest, laid out as their bytes are set (the CPU's
     * repacked matrices); without it, the default buffer type */
    bt_buffer_type_t (*get_weight_buffer_type)(bt_backend_t backend);
};

struct bt_backend {
    struct bt_backend_i iface;
    void *context;
};

/* Plain host-memory buffer implementation for other backends that keep host
 * data (test backends, pinned memory): base and size, alignment, and the
 * buffer type to report. */
bt_buffer_t bt_host_buffer_new(bt_buffer_type_t buft, void *base, size_t size, bool owned);

#ifdef __cplusplus
}
#endif
#endif
