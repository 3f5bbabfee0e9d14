/* backend.c - dispatch helpers over the backend vtables, tensor placement,
 * synchronous data movement, and the host buffer type (plain host memory)
 * that the CPU backend, test backends and staging use. */
#include "backend-impl.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "baton/ops.h"

/* ---- buffer type ---------------------------------------------------------- */

const char *bt_buft_name(bt_buffer_type_t buft) { return buft->iface.get_name(buft); }

bt_buffer_t bt_buft_alloc_buffer(bt_buffer_type_t buft, size_t size) {
    return buft->iface.alloc_buffer(buft, size);
}

size_t bt_buft_get_alignment(bt_buffer_type_t buft) { return buft->iface.get_alignment(buft); }

size_t bt_buft_get_max_size(bt_buffer_type_t buft) {
    return buft->iface.get_max_size ? buft->iface.get_max_size(buft) : SIZE_MAX;
}

size_t bt_buft_get_alloc_size(bt_buffer_type_t buft, const struct bt_tensor *tensor) {
    return buft->iface.get_alloc_size ? buft->iface.get_alloc_size(buft, tensor) : bt_nbytes(tensor);
}

bool bt_buft_is_host(bt_buffer_type_t buft) { return buft->iface.is_host ? buft->iface.is_host(buft) : false; }

/* ---- buffer --------------------------------------------------------------- */

void bt_buffer_free(bt_buffer_t buffer) {
    if (buffer) buffer->iface.free_buffer(buffer);
}
void *bt_buffer_get_base(bt_buffer_t buffer) { return buffer->iface.get_base(buffer); }
size_t bt_buffer_get_size(bt_buffer_t buffer) { return buffer->size; }
bt_buffer_type_t bt_buffer_get_type(bt_buffer_t buffer) { return buffer->buft; }
void bt_buffer_clear(bt_buffer_t buffer, uint8_t value) { buffer->iface.clear(buffer, value); }
bool bt_buffer_is_host(bt_buffer_t buffer) { return bt_buft_is_host(buffer->buft); }
void bt_buffer_set_usage(bt_buffer_t buffer, enum bt_buffer_usage usage) { buffer->usage = usage; }
enum bt_buffer_usage bt_buffer_get_usage(bt_buffer_t buffer) { return buffer->usage; }

bool bt_tensor_is_weight(const struct bt_tensor *t) {
    const bt_buffer_t buf = t->view_src ? t->view_src->buffer : t->buffer;
    if (buf) return buf->usage == BT_BUFFER_USAGE_WEIGHTS;
    return (t->flags & BT_TENSOR_FLAG_WEIGHT) != 0;
}

enum bt_status bt_tensor_alloc(bt_buffer_t buffer, struct bt_tensor *tensor, void *addr) {
    BT_ASSERT(tensor->buffer == NULL && tensor->data == NULL && tensor->view_src == NULL);
    const uint8_t *base = bt_buffer_get_base(buffer);
    BT_ASSERT((const uint8_t *)addr >= base);
    BT_ASSERT((const uint8_t *)addr + bt_buft_get_alloc_size(buffer->buft, tensor) <= base + buffer->size);
    tensor->buffer = buffer;
    tensor->data = addr;
    return buffer->iface.init_tensor ? buffer->iface.init_tensor(buffer, tensor) : BT_OK;
}

enum bt_status bt_view_init(struct bt_tensor *tensor) {
    BT_ASSERT(tensor->view_src != NULL && tensor->view_src->data != NULL);
    tensor->buffer = tensor->view_src->buffer;
    tensor->data = (uint8_t *)tensor->view_src->data + tensor->view_offs;
    if (tensor->buffer && tensor->buffer->iface.init_tensor)
        return tensor->buffer->iface.init_tensor(tensor->buffer, tensor);
    return BT_OK;
}

/* A tensor's buffer: its own, or its view source's. */
static bt_buffer_t tensor_buffer(const struct bt_tensor *t) {
    return t->view_src ? t->view_src->buffer : t->buffer;
}

/* the buffer of a tensor whose bytes [offset, offset + size) are read or
 * written in its own layout */
static bt_buffer_t io_buffer(const struct bt_tensor *tensor, size_t offset, size_t size) {
    BT_ASSERT(!(tensor->flags & BT_TENSOR_FLAG_REPACKED)); /* the CPU matmul's own layout */
    BT_ASSERT(tensor->data != NULL);
    BT_ASSERT(offset + size <= bt_nbytes(tensor));
    return tensor_buffer(tensor);
}

void bt_tensor_set(struct bt_tensor *tensor, const void *data, size_t offset, size_t size) {
    if (size == 0) return;
    bt_buffer_t buf = io_buffer(tensor, offset, size);
    if (buf) {
        buf->iface.set_tensor(buf, tensor, data, offset, size);
    } else {
        memcpy((uint8_t *)tensor->data + offset, data, size); /* a context-allocated tensor */
    }
}

void bt_tensor_get(const struct bt_tensor *tensor, void *data, size_t offset, size_t size) {
    if (size == 0) return;
    bt_buffer_t buf = io_buffer(tensor, offset, size);
    if (buf) {
        buf->iface.get_tensor(buf, tensor, data, offset, size);
    } else {
        memcpy(data, (const uint8_t *)tensor->data + offset, size);
    }
}

void bt_tensor_memset(struct bt_tensor *tensor, uint8_t value, size_t offset, size_t size) {
    if (size == 0) return;
    BT_ASSERT(!(tensor->flags & BT_TENSOR_FLAG_REPACKED)); /* the CPU matmul's own layout */
    BT_ASSERT(tensor->data != NULL);
    BT_ASSERT(offset + size <= bt_nbytes(tensor));
    bt_buffer_t buf = tensor_buffer(tensor);
    if (buf) {
        buf->iface.memset_tensor(buf, tensor, value, offset, size);
    } else {
        memset((uint8_t *)tensor->data + offset, value, size);
    }
}

void bt_tensor_copy(const struct bt_tensor *src, struct bt_tensor *dst) {
    BT_ASSERT(!((src->flags | dst->flags) & BT_TENSOR_FLAG_REPACKED)); /* the CPU matmul's own layout */
    const size_t n = bt_nbytes(src);
    BT_ASSERT(n == bt_nbytes(dst));
    if (src == dst || n == 0) return;
    bt_buffer_t sb = tensor_buffer(src), db = tensor_buffer(dst);
    if (!sb || bt_buffer_is_host(sb)) {
        bt_tensor_set(dst, src->data, 0, n);
    } else if (!db || bt_buffer_is_host(db)) {
        bt_tensor_get(src, dst->data, 0, n);
    } else if (!db->iface.cpy_tensor || !db->iface.cpy_tensor(db, src, dst)) {
        /* two device buffers that cannot copy directly: stage through the host */
        void *tmp = malloc(n);
        BT_ASSERT(tmp != NULL);
        bt_tensor_get(src, tmp, 0, n);
        bt_tensor_set(dst, tmp, 0, n);
        free(tmp);
    }
}

/* ---- backend ---------------------------------------------------------------- */

const char *bt_backend_name(bt_backend_t backend) { return backend->iface.get_name(backend); }

void bt_backend_free(bt_backend_t backend) {
    if (backend) backend->iface.free(backend);
}

bt_buffer_type_t bt_backend_get_default_buffer_type(bt_backend_t backend) {
    return backend->iface.get_default_buffer_type(backend);
}

bt_buffer_t bt_backend_alloc_buffer(bt_backend_t backend, size_t size) {
    return bt_buft_alloc_buffer(bt_backend_get_default_buffer_type(backend), size);
}

bt_buffer_type_t bt_backend_get_host_buffer_type(bt_backend_t backend) {
    bt_buffer_type_t h = backend->iface.get_host_buffer_type ? backend->iface.get_host_buffer_type(backend) : NULL;
    return h ? h : bt_cpu_buffer_type();
}

/* An asynchronous copy of size bytes at offset goes through the backend's
 * own slot where it has one (true: checked against the tensor), else it is a
 * synchronous one. */
static bool async_slot(bool has_slot, const struct bt_tensor *tensor, size_t offset, size_t size) {
    if (has_slot) BT_ASSERT(tensor->data != NULL && offset + size <= bt_nbytes(tensor));
    return has_slot;
}

void bt_backend_tensor_set_async(bt_backend_t backend, struct bt_tensor *tensor, const void *data,
                                 size_t offset, size_t size) {
    if (async_slot(backend->iface.set_tensor_async != NULL, tensor, offset, size))
        backend->iface.set_tensor_async(backend, tensor, data, offset, size);
    else
        bt_tensor_set(tensor, data, offset, size);
}

void bt_backend_tensor_get_async(bt_backend_t backend, const struct bt_tensor *tensor, void *data,
                                 size_t offset, size_t size) {
    if (async_slot(backend->iface.get_tensor_async != NULL, tensor, offset, size))
        backend->iface.get_tensor_async(backend, tensor, data, offset, size);
    else
        bt_tensor_get(tensor, data, offset, size);
}

bool bt_backend_tensor_try_copy_async(bt_backend_t backend_src, bt_backend_t backend_dst,
                                      const struct bt_tensor *src, struct bt_tensor *dst) {
    return backend_dst->iface.cpy_tensor_async && backend_dst->iface.cpy_tensor_async(backend_src, backend_dst, src, dst);
}

void bt_backend_tensor_copy_async(bt_backend_t backend_src, bt_backend_t backend_dst,
                                  const struct bt_tensor *src, struct bt_tensor *dst) {
    if (bt_backend_tensor_try_copy_async(backend_src, backend_dst, src, dst)) return;
    bt_backend_synchronize(backend_src);
    bt_backend_synchronize(backend_dst);
    bt_tensor_copy(src, dst);
}

void bt_backend_synchronize(bt_backend_t backend) {
    if (backend->iface.synchronize) backend->iface.synchronize(backend);
}

enum bt_status bt_backend_graph_compute_async(bt_backend_t backend, struct bt_graph *graph) {
    return backend->iface.graph_compute(backend, graph);
}

enum bt_status bt_backend_graph_compute(bt_backend_t backend, struct bt_graph *graph) {
    const enum bt_status st = bt_backend_graph_compute_async(backend, graph);
    bt_backend_synchronize(backend);
    return st;
}

bool bt_backend_supports_op(bt_backend_t backend, const struct bt_tensor *op) {
    return backend->iface.supports_op(backend, op);
}

bool bt_backend_supports_buft(bt_backend_t backend, bt_buffer_type_t buft) {
    return backend->iface.supports_buft(backend, buft);
}

bool bt_backend_offload_op(bt_backend_t backend, const struct bt_tensor *op) {
    return backend->iface.offload_op ? backend->iface.offload_op(backend, op) : false;
}

int64_t bt_backend_plan_memory(bt_backend_t backend, int64_t limit, int ranks_on_host, const char **what) {
    const char *w = "its memory limit";
    int64_t m = limit;
    size_t dev_free = 0, dev_total = 0;
    if (limit <= 0 && bt_backend_get_memory(backend, &dev_free, &dev_total)) {
        w = "its device's free memory";
        m = (int64_t)dev_free;
    } else if (limit <= 0) {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        const int64_t phys = pages > 0 && page > 0 ? (int64_t)pages * page : (int64_t)8 << 30;
        w = "its share of this machine's memory";
        m = phys / (ranks_on_host > 0 ? ranks_on_host : 1);
    }
    if (what) *what = w;
    return m;
}

bool bt_backend_get_memory(bt_backend_t backend, size_t *free, size_t *total) {
    *free = *total = 0;
    if (!backend->iface.get_memory) return false;
    backend->iface.get_memory(backend, free, total);
    return true;
}

bool bt_backend_set_node_hook(bt_backend_t backend, void (*fn)(void *user), void *user) {
    if (!backend->iface.set_node_hook) return false;
    backend->iface.set_node_hook(backend, fn, user);
    return true;
}

const char *bt_backend_describe(bt_backend_t backend, char *buf, size_t n) {
    if (n == 0) return buf;
    if (backend->iface.describe)
        backend->iface.describe(backend, buf, n);
    else
        snprintf(buf, n, "%s", bt_backend_name(backend));
    return buf;
}

bt_buffer_type_t bt_backend_get_weight_buffer_type(bt_backend_t backend) {
    if (backend->iface.get_weight_buffer_type) return backend->iface.get_weight_buffer_type(backend);
    return bt_backend_get_default_buffer_type(backend);
}

const char *bt_backend_error(bt_backend_t backend) {
    return backend->iface.get_error ? backend->iface.get_error(backend) : "";
}

bt_event_t bt_event_new(bt_backend_t backend) {
    return backend->iface.event_new ? backend->iface.event_new(backend) : NULL;
}

void bt_event_free(bt_event_t event) {
    if (event) event->backend->iface.event_free(event);
}

void bt_event_record(bt_event_t event, bt_backend_t backend) {
    BT_ASSERT(backend->iface.event_record != NULL);
    backend->iface.event_record(event, backend);
}

void bt_event_synchronize(bt_event_t event) { event->backend->iface.event_synchronize(event); }

void bt_backend_event_wait(bt_backend_t backend, bt_event_t event) {
    BT_ASSERT(backend->iface.event_wait != NULL);
    backend->iface.event_wait(backend, event);
}

/* ---- allocate a whole context in one buffer ------------------------------------ */

bt_buffer_t bt_alloc_ctx_tensors_from_buft(bt_context *ctx, bt_buffer_type_t buft) {
    const size_t align = bt_buft_get_alignment(buft);
    size_t total = 0;
    const int n = bt_context_n_tensors(ctx);
    for (int i = 0; i < n; i++) {
        const struct bt_tensor *t = bt_context_tensor(ctx, i);
        if (t->data || t->view_src) continue;
        total += (bt_buft_get_alloc_size(buft, t) + align - 1) / align * align;
    }
    if (total == 0) total = align; /* an empty buffer is still a buffer */
    if (total > bt_buft_get_max_size(buft)) {
        bt_context_set_error(ctx, "%zu bytes of tensors exceed %s's largest buffer (%zu bytes)", total,
                             bt_buft_name(buft), bt_buft_get_max_size(buft));
        return NULL;
    }
    bt_buffer_t buf = bt_buft_alloc_buffer(buft, total);
    if (!buf) {
        bt_context_set_error(ctx, "%s: cannot allocate %zu bytes", bt_buft_name(buft), total);
        return NULL;
    }
    uint8_t *p = bt_buffer_get_base(buf);
    for (int i = 0; i < n; i++) {
        struct bt_tensor *t = bt_context_tensor(ctx, i);
        if (t->data || t->view_src) continue;
        if (bt_tensor_alloc(buf, t, p) != BT_OK) {
            bt_context_set_error(ctx, "%s: cannot initialise tensor '%s'", bt_buft_name(buft), t->name);
            bt_buffer_free(buf);
            return NULL;
        }
        p += (bt_buft_get_alloc_size(buft, t) + align - 1) / align * align;
    }
    for (int i = 0; i < n; i++) {
        struct bt_tensor *t = bt_context_tensor(ctx, i);
        if (t->view_src && !t->data && t->view_src->data) bt_view_init(t);
    }
    return buf;
}

bt_buffer_t bt_alloc_ctx_tensors(bt_context *ctx, bt_backend_t backend) {
    return bt_alloc_ctx_tensors_from_buft(ctx, bt_backend_get_default_buffer_type(backend));
}

/* ---- plain host-memory buffers --------------------------------------------------- */

struct host_buffer {
    void *base;
    bool owned;
};

static void host_free_buffer(bt_buffer_t buffer) {
    struct host_buffer *hb = buffer->context;
    if (hb->owned) free(hb->base);
    free(hb);
    free(buffer);
}
static void *host_get_base(bt_buffer_t buffer) { return ((struct host_buffer *)buffer->context)->base; }
static void host_memset_tensor(bt_buffer_t buffer, struct bt_tensor *tensor, uint8_t value,
                               size_t offset, size_t size) {
    (void)buffer;
    memset((uint8_t *)tensor->data + offset, value, size);
}
static void host_set_tensor(bt_buffer_t buffer, struct bt_tensor *tensor, const void *data,
                            size_t offset, size_t size) {
    (void)buffer;
    memcpy((uint8_t *)tensor->data + offset, data, size);
}
static void host_get_tensor(bt_buffer_t buffer, const struct bt_tensor *tensor, void *data,
                            size_t offset, size_t size) {
    (void)buffer;
    memcpy(data, (const uint8_t *)tensor->data + offset, size);
}
static bool host_cpy_tensor(bt_buffer_t buffer, const struct bt_tensor *src, struct bt_tensor *dst) {
    (void)buffer;
    bt_buffer_t sb = src->view_src ? src->view_src->buffer : src->buffer;
    if (sb && !bt_buffer_is_host(sb)) return false;
    memcpy(dst->data, src->data, bt_nbytes(src));
    return true;
}
static void host_clear(bt_buffer_t buffer, uint8_t value) {
    memset(host_get_base(buffer), value, buffer->size);
}

static const struct bt_buffer_i host_buffer_i = {
    /* .free_buffer   = */ host_free_buffer,
    /* .get_base      = */ host_get_base,
    /* .init_tensor   = */ NULL,
    /* .memset_tensor = */ host_memset_tensor,
    /* .set_tensor    = */ host_set_tensor,
    /* .get_tensor    = */ host_get_tensor,
    /* .cpy_tensor    = */ host_cpy_tensor,
    /* .clear         = */ host_clear,
};

bt_buffer_t bt_host_buffer_new(bt_buffer_type_t buft, void *base, size_t size, bool owned) {
    bt_buffer_t buffer = calloc(1, sizeof *buffer);
    struct host_buffer *hb = calloc(1, sizeof *hb);
    if (!buffer || !hb) {
        free(buffer);
        free(hb);
        return NULL;
    }
    hb->base = base;
    hb->owned = owned;
    *buffer = (struct bt_buffer){
        .iface = host_buffer_i,
        .buft = buft,
        .context = hb,
        .size = size,
        .usage = BT_BUFFER_USAGE_ANY,
    };
    return buffer;
}

/* ---- the host buffer type: 64-byte aligned host memory (the CPU backend's,
 * and every backend's staging memory without one of its own) ---- */

static const char *cpu_buft_name(bt_buffer_type_t buft) {
    (void)buft;
    return "CPU";
}

static bt_buffer_t cpu_buft_alloc(bt_buffer_type_t buft, size_t size) {
    void *p = bt_host_alloc(size);
    if (!p) return NULL;
    bt_buffer_t b = bt_host_buffer_new(buft, p, size, true);
    if (!b) free(p);
    return b;
}

static size_t cpu_buft_alignment(bt_buffer_type_t buft) {
    (void)buft;
    return BT_MEM_ALIGN;
}

static bool cpu_buft_is_host(bt_buffer_type_t buft) {
    (void)buft;
    return true;
}

static struct bt_buffer_type cpu_buft = {
    .iface =
        {
            /* .get_name       = */ cpu_buft_name,
            /* .alloc_buffer   = */ cpu_buft_alloc,
            /* .get_alignment  = */ cpu_buft_alignment,
            /* .get_max_size   = */ NULL,
            /* .get_alloc_size = */ NULL,
            /* .is_host        = */ cpu_buft_is_host,
        },
    .context = NULL,
};

bt_buffer_type_t bt_cpu_buffer_type(void) { return &cpu_buft; }



/* ---- measuring a backend -------------------------------------------------- */

double bt_backend_measure_gflops(bt_backend_t backend) {
    const int64_t K = 512, M = 512, N = 64;
    bt_context *ctx = bt_init((struct bt_init_params){bt_tensor_overhead() * 8 + bt_graph_overhead(8), NULL, true});
    if (!ctx) return 1.0;
    struct bt_tensor *a = bt_new_tensor_2d(ctx, BT_TYPE_F32, K, M);
    struct bt_tensor *b = bt_new_tensor_2d(ctx, BT_TYPE_F32, K, N);
    struct bt_tensor *c = bt_mul_mat(ctx, a, b);
    struct bt_graph *g = bt_graph_new(ctx, 8);
    double best = 1e30;
    if (c && g && bt_graph_build_forward_expand(g, c) == BT_OK) {
        bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, backend);
        if (buf) {
            float *tmp = calloc((size_t)(K * M), sizeof(float));
            if (tmp) {
                for (int64_t i = 0; i < K * M; i++) tmp[i] = (float)((i * 7) % 13) * 0.01f;
                bt_tensor_set(a, tmp, 0, bt_nbytes(a));
                bt_tensor_set(b, tmp, 0, bt_nbytes(b));
                free(tmp);
            }
            for (int it = 0; it < 6; it++) {
                const double t0 = bt_now_s();
                if (bt_backend_graph_compute(backend, g) != BT_OK) break;
                const double dt = bt_now_s() - t0;
                if (it > 0 && dt < best) best = dt;
            }
            bt_buffer_free(buf);
        }
    }
    bt_free(ctx);
    if (best >= 1e30 || best <= 0) return 1.0;
    return 2.0 * (double)(K * M * N) / best / 1e9;
}

