/* cuda_backend.c - the CUDA backend behind the vtables of backend.h: device
 * buffers (cudaMalloc), pinned host buffers (cudaMallocHost), one stream and
 * one cuBLAS handle per backend, events (cudaEvent), asynchronous copies,
 * and graph_compute, which enqueues one kernel per node on the stream (view
 * ops compute nothing) and returns before the GPU finishes, unless the graph
 * checks row / expert ids: then it waits at its end to report a bad id as a
 * status (MUL_MAT_ID always waits, to group tokens by expert on the host).
 *
 * Failures of the world inside a void vtable slot (a set_tensor whose
 * cudaMemcpy fails: a kernel's fault surfacing, a lost device) mark the
 * device failed (device_fail): that call and every later copy on the device
 * do nothing, and the next graph computation on it returns BT_ERR_IO with the
 * CUDA message, so the program stops with a status and never aborts (such an
 * error leaves the device's context unusable anyway).  Failures a caller can
 * act on (no device, out of memory, a bad id) are statuses at once. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cuda_impl.h"

/* ---- a failed device ---------------------------------------------------------- */

static struct {
    atomic_int failed;
    pthread_mutex_t lock;
    char msg[320]; /* the first failure, kept */
} g_dev[BT_CUDA_MAX_DEVICES] = {[0 ... BT_CUDA_MAX_DEVICES - 1] = {0, PTHREAD_MUTEX_INITIALIZER, ""}};

static bool device_failed(int dev) { return dev >= 0 && dev < BT_CUDA_MAX_DEVICES && atomic_load(&g_dev[dev].failed); }

/* e == cudaSuccess: true; else the device is marked failed with "CUDAdev: what: message" */
static bool device_ok(int dev, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    if (dev < 0 || dev >= BT_CUDA_MAX_DEVICES) dev = 0;
    pthread_mutex_lock(&g_dev[dev].lock);
    if (!atomic_load(&g_dev[dev].failed))
        snprintf(g_dev[dev].msg, sizeof g_dev[dev].msg, "CUDA%d: %s: %s (the device is unusable from here on)", dev,
                 what, cudaGetErrorString(e));
    atomic_store(&g_dev[dev].failed, 1);
    pthread_mutex_unlock(&g_dev[dev].lock);
    return false;
}

/* In a void (or bool) slot: nothing once the device has failed; a failing
 * call marks it failed and ends the slot (returning the rest, if any). */
#define CUDA_OR_FAIL(dev, call, ...)                                                  \
    do {                                                                              \
        if (device_failed(dev) || !device_ok((dev), (call), #call)) return __VA_ARGS__; \
    } while (0)

/* ---- errors ---------------------------------------------------------------- */

enum bt_status bt_cuda_fail(struct bt_cuda_ctx *c, enum bt_status s, const char *fmt, ...) {
    if (c->error[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->error, sizeof c->error, fmt, ap);
        va_end(ap);
    }
    return s;
}

enum bt_status bt_cuda_check(struct bt_cuda_ctx *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return BT_OK;
    return bt_cuda_fail(c, e == cudaErrorMemoryAllocation ? BT_ERR_NOMEM : BT_ERR_INVALID, "%s: %s: %s", c->name,
                        what, cudaGetErrorString(e));
}

/* ---- devices ------------------------------------------------------------------ */

int bt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: clear it */
        return 0;
    }
    return n < 0 ? 0 : n;
}

int bt_cuda_select_device_from_local_rank(int local_rank) {
    const int n = bt_cuda_device_count();
    if (n <= 0 || local_rank < 0) return -1;
    const int dev = local_rank % n;
    if (cudaSetDevice(dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return dev;
}

bool bt_cuda_device_uuid(int device, uint8_t uuid[16]) {
    struct cudaDeviceProp prop;
    if (device < 0 || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    memcpy(uuid, prop.uuid.bytes, 16);
    return true;
}

/* ---- device buffers --------------------------------------------------------------- */

struct cuda_buffer {
    int device;
    void *base;
};

static const struct bt_buffer_i cuda_buffer_i;

static struct cuda_buffer *cbuf(bt_buffer_t b) { return (struct cuda_buffer *)b->context; }

static void cuda_buffer_free(bt_buffer_t buffer) {
    struct cuda_buffer *cb = cbuf(buffer);
    cudaSetDevice(cb->device);
    cudaFree(cb->base);
    free(cb);
    free(buffer);
}

static void *cuda_buffer_get_base(bt_buffer_t buffer) { return cbuf(buffer)->base; }

static void cuda_buffer_memset_tensor(bt_buffer_t buffer, struct bt_tensor *tensor, uint8_t value, size_t offset,
                                      size_t size) {
    const int dev = cbuf(buffer)->device;
    CUDA_OR_FAIL(dev, cudaSetDevice(dev));
    CUDA_OR_FAIL(dev, cudaMemset((char *)tensor->data + offset, value, size));
}

static void cuda_buffer_set_tensor(bt_buffer_t buffer, struct bt_tensor *tensor, const void *data, size_t offset,
                                   size_t size) {
    const int dev = cbuf(buffer)->device;
    CUDA_OR_FAIL(dev, cudaSetDevice(dev));
    CUDA_OR_FAIL(dev, cudaMemcpy((char *)tensor->data + offset, data, size, cudaMemcpyHostToDevice));
}

static void cuda_buffer_get_tensor(bt_buffer_t buffer, const struct bt_tensor *tensor, void *data, size_t offset,
                                   size_t size) {
    const int dev = cbuf(buffer)->device;
    CUDA_OR_FAIL(dev, cudaSetDevice(dev));
    CUDA_OR_FAIL(dev, cudaMemcpy(data, (const char *)tensor->data + offset, size, cudaMemcpyDeviceToHost));
}

static bt_buffer_t tensor_buffer(const struct bt_tensor *t) { return t->view_src ? t->view_src->buffer : t->buffer; }

bool bt_buffer_is_cuda(bt_buffer_t buffer) { return buffer && buffer->iface.get_base == cuda_buffer_get_base; }

/* dst lives in this device buffer: copy from another device buffer (any
 * device) or from host memory */
static bool cuda_buffer_cpy_tensor(bt_buffer_t buffer, const struct bt_tensor *src, struct bt_tensor *dst) {
    bt_buffer_t sb = tensor_buffer(src);
    const size_t n = bt_nbytes(src);
    const int ddev = cbuf(buffer)->device;
    if (bt_buffer_is_cuda(sb)) {
        const int sdev = cbuf(sb)->device;
        if (sdev == ddev) {
            CUDA_OR_FAIL(ddev, cudaSetDevice(ddev), true);
            CUDA_OR_FAIL(ddev, cudaMemcpy(dst->data, src->data, n, cudaMemcpyDeviceToDevice), true);
        } else {
            CUDA_OR_FAIL(ddev, cudaMemcpyPeer(dst->data, ddev, src->data, sdev, n), true);
        }
        return true;
    }
    if (!sb || bt_buffer_is_host(sb)) {
        CUDA_OR_FAIL(ddev, cudaSetDevice(ddev), true);
        CUDA_OR_FAIL(ddev, cudaMemcpy(dst->data, src->data, n, cudaMemcpyHostToDevice), true);
        return true;
    }
    return false;
}

static void cuda_buffer_clear(bt_buffer_t buffer, uint8_t value) {
    const int dev = cbuf(buffer)->device;
    CUDA_OR_FAIL(dev, cudaSetDevice(dev));
    CUDA_OR_FAIL(dev, cudaMemset(cbuf(buffer)->base, value, buffer->size));
}

static const struct bt_buffer_i cuda_buffer_i = {
    /* .free_buffer   = */ cuda_buffer_free,
    /* .get_base      = */ cuda_buffer_get_base,
    /* .init_tensor   = */ NULL,
    /* .memset_tensor = */ cuda_buffer_memset_tensor,
    /* .set_tensor    = */ cuda_buffer_set_tensor,
    /* .get_tensor    = */ cuda_buffer_get_tensor,
    /* .cpy_tensor    = */ cuda_buffer_cpy_tensor,
    /* .clear         = */ cuda_buffer_clear,
};

/* ---- device buffer types: one per device ----------------------------------------- */

struct cuda_buft_ctx {
    int device;
    char name[16];
};

static struct cuda_buft_ctx cuda_buft_ctxs[BT_CUDA_MAX_DEVICES];
static struct bt_buffer_type cuda_bufts[BT_CUDA_MAX_DEVICES];

static const char *cuda_buft_name(bt_buffer_type_t buft) { return ((struct cuda_buft_ctx *)buft->context)->name; }

static bt_buffer_t cuda_buft_alloc(bt_buffer_type_t buft, size_t size) {
    const int dev = ((struct cuda_buft_ctx *)buft->context)->device;
    if (cudaSetDevice(dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    void *p = NULL;
    if (cudaMalloc(&p, size ? size : 256) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    bt_buffer_t b = calloc(1, sizeof *b);
    struct cuda_buffer *cb = calloc(1, sizeof *cb);
    if (!b || !cb) {
        free(b);
        free(cb);
        cudaFree(p);
        return NULL;
    }
    cb->device = dev;
    cb->base = p;
    *b = (struct bt_buffer){
        .iface = cuda_buffer_i, .buft = buft, .context = cb, .size = size, .usage = BT_BUFFER_USAGE_ANY};
    return b;
}

static size_t cuda_buft_alignment(bt_buffer_type_t buft) {
    (void)buft;
    return 256; /* cudaMalloc's alignment; keeps cuBLAS operands aligned */
}

static const struct bt_buffer_type_i cuda_buft_i = {
    /* .get_name       = */ cuda_buft_name,
    /* .alloc_buffer   = */ cuda_buft_alloc,
    /* .get_alignment  = */ cuda_buft_alignment,
    /* .get_max_size   = */ NULL,
    /* .get_alloc_size = */ NULL,
    /* .is_host        = */ NULL,
};

bt_buffer_type_t bt_cuda_buffer_type(int device) {
    if (device < 0 || device >= BT_CUDA_MAX_DEVICES || device >= bt_cuda_device_count()) return NULL;
    /* the same values on every call: safe to (re)write without a lock */
    cuda_buft_ctxs[device].device = device;
    snprintf(cuda_buft_ctxs[device].name, sizeof cuda_buft_ctxs[device].name, "CUDA%d", device);
    cuda_bufts[device].iface = cuda_buft_i;
    cuda_bufts[device].context = &cuda_buft_ctxs[device];
    return &cuda_bufts[device];
}

/* ---- pinned host buffers ------------------------------------------------------------ */

static void pinned_free(bt_buffer_t buffer) {
    cudaFreeHost(buffer->context);
    free(buffer);
}
static void *pinned_get_base(bt_buffer_t buffer) { return buffer->context; }
static void pinned_memset_tensor(bt_buffer_t buffer, struct bt_tensor *tensor, uint8_t value, size_t offset,
                                 size_t size) {
    (void)buffer;
    memset((char *)tensor->data + offset, value, size);
}
static void pinned_set_tensor(bt_buffer_t buffer, struct bt_tensor *tensor, const void *data, size_t offset,
                              size_t size) {
    (void)buffer;
    memcpy((char *)tensor->data + offset, data, size);
}
static void pinned_get_tensor(bt_buffer_t buffer, const struct bt_tensor *tensor, void *data, size_t offset,
                              size_t size) {
    (void)buffer;
    memcpy(data, (const char *)tensor->data + offset, size);
}
static bool pinned_cpy_tensor(bt_buffer_t buffer, const struct bt_tensor *src, struct bt_tensor *dst) {
    (void)buffer;
    bt_buffer_t sb = tensor_buffer(src);
    if (bt_buffer_is_cuda(sb)) {
        const int dev = cbuf(sb)->device;
        CUDA_OR_FAIL(dev, cudaSetDevice(dev), true);
        CUDA_OR_FAIL(dev, cudaMemcpy(dst->data, src->data, bt_nbytes(src), cudaMemcpyDeviceToHost), true);
        return true;
    }
    if (sb && !bt_buffer_is_host(sb)) return false;
    memcpy(dst->data, src->data, bt_nbytes(src));
    return true;
}
static void pinned_clear(bt_buffer_t buffer, uint8_t value) { memset(buffer->context, value, buffer->size); }

static const struct bt_buffer_i pinned_buffer_i = {
    /* .free_buffer   = */ pinned_free,
    /* .get_base      = */ pinned_get_base,
    /* .init_tensor   = */ NULL,
    /* .memset_tensor = */ pinned_memset_tensor,
    /* .set_tensor    = */ pinned_set_tensor,
    /* .get_tensor    = */ pinned_get_tensor,
    /* .cpy_tensor    = */ pinned_cpy_tensor,
    /* .clear         = */ pinned_clear,
};

static const char *pinned_buft_name(bt_buffer_type_t buft) {
    (void)buft;
    return "CUDA_Host";
}

static bt_buffer_t pinned_buft_alloc(bt_buffer_type_t buft, size_t size) {
    void *p = NULL;
    if (cudaMallocHost(&p, size ? size : 64) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    bt_buffer_t b = calloc(1, sizeof *b);
    if (!b) {
        cudaFreeHost(p);
        return NULL;
    }
    *b = (struct bt_buffer){
        .iface = pinned_buffer_i, .buft = buft, .context = p, .size = size, .usage = BT_BUFFER_USAGE_ANY};
    return b;
}

static size_t pinned_buft_alignment(bt_buffer_type_t buft) {
    (void)buft;
    return BT_MEM_ALIGN;
}

static bool pinned_buft_is_host(bt_buffer_type_t buft) {
    (void)buft;
    return true;
}

static struct bt_buffer_type pinned_buft = {
    .iface =
        {
            /* .get_name       = */ pinned_buft_name,
            /* .alloc_buffer   = */ pinned_buft_alloc,
            /* .get_alignment  = */ pinned_buft_alignment,
            /* .get_max_size   = */ NULL,
            /* .get_alloc_size = */ NULL,
            /* .is_host        = */ pinned_buft_is_host,
        },
    .context = NULL,
};

bt_buffer_type_t bt_cuda_host_buffer_type(void) { return &pinned_buft; }

/* ---- scratch --------------------------------------------------------------------------- */

/* Scratch grows in stream order (cudaFreeAsync / cudaMallocAsync on the
 * backend's stream): the old region is freed after the work queued that
 * reads it, and nothing waits for the whole device.  cudaMalloc and cudaFree
 * may: with NCCL receives posted ahead on other streams, a device-wide wait
 * in the middle of a micro-batch could wait for data that this very rank
 * has still to send. */
void *bt_cuda_scratch(struct bt_cuda_ctx *c, enum bt_cuda_scratch_slot slot, size_t bytes) {
    if (bytes == 0) bytes = 1; /* a region, never NULL (NULL means out of memory) */
    if (bytes <= c->scratch_size[slot]) return c->scratch[slot];
    if (c->scratch[slot] && bt_cuda_check(c, cudaFreeAsync(c->scratch[slot], c->stream), "scratch: cudaFreeAsync") != BT_OK)
        return NULL;
    c->scratch[slot] = NULL;
    c->scratch_size[slot] = 0;
    const size_t want = bytes + bytes / 4; /* some headroom for the next, larger op */
    if (bt_cuda_check(c, cudaMallocAsync(&c->scratch[slot], want, c->stream), "scratch: cudaMallocAsync") != BT_OK) {
        c->scratch[slot] = NULL;
        return NULL;
    }
    c->scratch_size[slot] = want;
    return c->scratch[slot];
}

/* Pageable host memory: MUL_MAT_ID synchronises its stream around the copies
 * anyway, and allocating pinned memory (cudaMallocHost) mid-run is a
 * device-wide synchronisation point (see bt_cuda_scratch). */
void *bt_cuda_host_stage(struct bt_cuda_ctx *c, size_t bytes) {
    if (bytes <= c->host_stage_size) return c->host_stage;
    const size_t want = bytes + bytes / 4;
    void *p = realloc(c->host_stage, want);
    if (!p) {
        bt_cuda_fail(c, BT_ERR_NOMEM, "host stage: out of memory (%zu bytes)", want);
        return NULL;
    }
    c->host_stage = p;
    c->host_stage_size = want;
    return c->host_stage;
}

/* ---- backend ------------------------------------------------------------------------------ */

static struct bt_cuda_ctx *bctx(bt_backend_t backend) { return (struct bt_cuda_ctx *)backend->context; }

static const char *cuda_get_name(bt_backend_t backend) { return bctx(backend)->name; }

static void ctx_destroy(struct bt_cuda_ctx *c) {
    cudaSetDevice(c->device);
    for (int i = 0; i < BT_CUDA_SCRATCH_COUNT; i++) /* after the work queued that reads them */
        if (c->scratch[i]) cudaFreeAsync(c->scratch[i], c->stream);
    if (c->stream) cudaStreamSynchronize(c->stream);
    free(c->host_stage);
    cudaFree(c->cublas_ws);
    cudaFree(c->d_err);
    cudaFreeHost(c->h_err);
    if (c->copy_event) cudaEventDestroy(c->copy_event);
    if (c->cublas) cublasDestroy(c->cublas);
    if (c->stream) cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    free(c);
}

static void cuda_free(bt_backend_t backend) {
    ctx_destroy(bctx(backend));
    free(backend);
}

static bt_buffer_type_t cuda_get_default_buffer_type(bt_backend_t backend) {
    return bt_cuda_buffer_type(bctx(backend)->device);
}

static bt_buffer_type_t cuda_get_host_buffer_type(bt_backend_t backend) {
    (void)backend;
    return bt_cuda_host_buffer_type();
}

static void cuda_set_tensor_async(bt_backend_t backend, struct bt_tensor *tensor, const void *data, size_t offset,
                                  size_t size) {
    struct bt_cuda_ctx *c = bctx(backend);
    CUDA_OR_FAIL(c->device, cudaSetDevice(c->device));
    CUDA_OR_FAIL(c->device,
                 cudaMemcpyAsync((char *)tensor->data + offset, data, size, cudaMemcpyHostToDevice, c->stream));
}

static void cuda_get_tensor_async(bt_backend_t backend, const struct bt_tensor *tensor, void *data, size_t offset,
                                  size_t size) {
    struct bt_cuda_ctx *c = bctx(backend);
    CUDA_OR_FAIL(c->device, cudaSetDevice(c->device));
    CUDA_OR_FAIL(c->device,
                 cudaMemcpyAsync(data, (const char *)tensor->data + offset, size, cudaMemcpyDeviceToHost, c->stream));
}

/* Between two CUDA backends (device buffers on both sides): the copy runs on
 * the source's stream after what it computed; the destination's stream waits
 * for it with an event. */
static bool cuda_cpy_tensor_async(bt_backend_t backend_src, bt_backend_t backend_dst, const struct bt_tensor *src,
                                  struct bt_tensor *dst) {
    if (!bt_backend_is_cuda(backend_src) || !bt_backend_is_cuda(backend_dst)) return false;
    if (!bt_buffer_is_cuda(tensor_buffer(src)) || !bt_buffer_is_cuda(tensor_buffer(dst))) return false;
    struct bt_cuda_ctx *cs = bctx(backend_src), *cd = bctx(backend_dst);
    const size_t n = bt_nbytes(src);
    /* (a failure marks the device whose call failed; true: the copy is this backend's, failed or not) */
    CUDA_OR_FAIL(cs->device, cudaSetDevice(cs->device), true);
    if (backend_src != backend_dst) {
        /* the destination may still be reading dst from the last micro-batch */
        CUDA_OR_FAIL(cd->device, cudaSetDevice(cd->device), true);
        CUDA_OR_FAIL(cd->device, cudaEventRecord(cd->copy_event, cd->stream), true);
        CUDA_OR_FAIL(cs->device, cudaSetDevice(cs->device), true);
        CUDA_OR_FAIL(cs->device, cudaStreamWaitEvent(cs->stream, cd->copy_event, 0), true);
    }
    if (cs->device == cd->device)
        CUDA_OR_FAIL(cs->device, cudaMemcpyAsync(dst->data, src->data, n, cudaMemcpyDeviceToDevice, cs->stream), true);
    else
        CUDA_OR_FAIL(cs->device, cudaMemcpyPeerAsync(dst->data, cd->device, src->data, cs->device, n, cs->stream),
                     true);
    if (backend_src != backend_dst) {
        CUDA_OR_FAIL(cs->device, cudaEventRecord(cs->copy_event, cs->stream), true);
        CUDA_OR_FAIL(cd->device, cudaSetDevice(cd->device), true);
        CUDA_OR_FAIL(cd->device, cudaStreamWaitEvent(cd->stream, cs->copy_event, 0), true);
    }
    return true;
}

static void cuda_synchronize(bt_backend_t backend) {
    struct bt_cuda_ctx *c = bctx(backend);
    CUDA_OR_FAIL(c->device, cudaSetDevice(c->device));
    CUDA_OR_FAIL(c->device, cudaStreamSynchronize(c->stream));
}

/* Read the device error word (after the graph's kernels) and turn a bad id
 * into a status and message. */
static enum bt_status check_ids(struct bt_cuda_ctx *c, const struct bt_graph *graph) {
    enum bt_status s = bt_cuda_check(
        c, cudaMemcpyAsync(c->h_err, c->d_err, 2 * sizeof(int), cudaMemcpyDeviceToHost, c->stream), "error word");
    if (s == BT_OK) s = bt_cuda_check(c, cudaStreamSynchronize(c->stream), "synchronize");
    if (s != BT_OK) return s;
    c->ids_checked = false;
    if (c->h_err[0] == 0) return BT_OK;
    const int i = c->h_err[0] - 1, id = c->h_err[1];
    s = bt_cuda_check(c, cudaMemsetAsync(c->d_err, 0, 2 * sizeof(int), c->stream), "clearing the error word");
    if (s != BT_OK) return s;
    if (i < 0 || i >= graph->n_nodes) return bt_cuda_fail(c, BT_ERR_INVALID, "a row id %d out of range", id);
    const struct bt_tensor *node = graph->nodes[i];
    const int64_t n_rows = node->op == BT_OP_GET_ROWS ? node->src[0]->ne[1] : node->ne[1];
    return bt_cuda_fail(c, BT_ERR_INVALID, "node '%s' (%s): row id %d out of range [0, %lld)", node->name,
                        bt_op_name(node->op), id, (long long)n_rows);
}

static enum bt_status cuda_graph_compute(bt_backend_t backend, struct bt_graph *graph) {
    struct bt_cuda_ctx *c = bctx(backend);
    c->error[0] = '\0';
    if (device_failed(c->device)) { /* an earlier copy failed (device_fail) */
        pthread_mutex_lock(&g_dev[c->device].lock);
        bt_cuda_fail(c, BT_ERR_IO, "%s", g_dev[c->device].msg);
        pthread_mutex_unlock(&g_dev[c->device].lock);
        return BT_ERR_IO;
    }
    enum bt_status s = bt_cuda_check(c, cudaSetDevice(c->device), "cudaSetDevice");
    if (s != BT_OK) return s;
    c->ids_checked = false;
    for (int i = 0; i < graph->n_nodes; i++) {
        struct bt_tensor *node = graph->nodes[i];
        if (node->op == BT_OP_NONE || bt_op_is_view(node->op)) continue;
        if (bt_nelements(node) == 0) continue;
        s = bt_cuda_compute_op(c, node, i);
        if (s != BT_OK) {
            if (c->ids_checked) check_ids(c, graph); /* clear the error word */
            return s;
        }
    }
    return c->ids_checked ? check_ids(c, graph) : BT_OK;
}

static bool cuda_supports_op(bt_backend_t backend, const struct bt_tensor *op) {
    (void)backend;
    return bt_cuda_op_supported(op);
}

/* Only its own device memory: the scheduler copies anything else in. */
static bool cuda_supports_buft(bt_backend_t backend, bt_buffer_type_t buft) {
    return buft == bt_cuda_buffer_type(bctx(backend)->device);
}

/* ---- events ------------------------------------------------------------------------------- */

static bt_event_t cuda_event_new(bt_backend_t backend) {
    struct bt_cuda_ctx *c = bctx(backend);
    if (cudaSetDevice(c->device) != cudaSuccess) return NULL;
    cudaEvent_t ev = NULL;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    bt_event_t e = calloc(1, sizeof *e);
    if (!e) {
        cudaEventDestroy(ev);
        return NULL;
    }
    e->backend = backend;
    e->context = ev;
    return e;
}

static void cuda_event_free(bt_event_t event) {
    cudaEventDestroy((cudaEvent_t)event->context);
    free(event);
}

static void cuda_event_record(bt_event_t event, bt_backend_t backend) {
    struct bt_cuda_ctx *c = bctx(backend);
    CUDA_OR_FAIL(c->device, cudaSetDevice(c->device));
    CUDA_OR_FAIL(c->device, cudaEventRecord((cudaEvent_t)event->context, c->stream));
}

/* The backend's stream waits for an event of a CUDA backend (any device);
 * an event of another kind of backend is waited for on the host. */
static void cuda_event_wait(bt_backend_t backend, bt_event_t event) {
    struct bt_cuda_ctx *c = bctx(backend);
    if (bt_backend_is_cuda(event->backend)) {
        CUDA_OR_FAIL(c->device, cudaSetDevice(c->device));
        CUDA_OR_FAIL(c->device, cudaStreamWaitEvent(c->stream, (cudaEvent_t)event->context, 0));
    } else {
        bt_event_synchronize(event);
    }
}

static void cuda_event_synchronize(bt_event_t event) {
    CUDA_OR_FAIL(bt_backend_is_cuda(event->backend) ? bctx(event->backend)->device : 0,
                 cudaEventSynchronize((cudaEvent_t)event->context));
}

static const char *cuda_get_error(bt_backend_t backend) { return bctx(backend)->error; }

/* The device's free and total memory (cudaMemGetInfo); 0 and 0 when the
 * driver cannot tell (the error is cleared). */
static void cuda_get_memory(bt_backend_t backend, size_t *free, size_t *total) {
    *free = *total = 0;
    if (cudaSetDevice(bctx(backend)->device) != cudaSuccess || cudaMemGetInfo(free, total) != cudaSuccess) {
        (void)cudaGetLastError();
        *free = *total = 0;
    }
}

static const struct bt_backend_i cuda_backend_i = {
    /* .get_name                = */ cuda_get_name,
    /* .free                    = */ cuda_free,
    /* .get_default_buffer_type = */ cuda_get_default_buffer_type,
    /* .set_tensor_async        = */ cuda_set_tensor_async,
    /* .get_tensor_async        = */ cuda_get_tensor_async,
    /* .cpy_tensor_async        = */ cuda_cpy_tensor_async,
    /* .synchronize             = */ cuda_synchronize,
    /* .graph_compute           = */ cuda_graph_compute,
    /* .supports_op             = */ cuda_supports_op,
    /* .supports_buft           = */ cuda_supports_buft,
    /* .offload_op              = */ NULL,
    /* .event_new               = */ cuda_event_new,
    /* .event_free              = */ cuda_event_free,
    /* .event_record            = */ cuda_event_record,
    /* .event_wait              = */ cuda_event_wait,
    /* .event_synchronize       = */ cuda_event_synchronize,
    /* .get_error               = */ cuda_get_error,
    /* .get_host_buffer_type    = */ cuda_get_host_buffer_type,
    /* .get_memory              = */ cuda_get_memory,
    /* .set_node_hook           = */ NULL,
    /* .describe                = */ NULL,
    /* .get_weight_buffer_type  = */ NULL,
};

enum bt_status bt_backend_cuda_init(int device, bt_backend_t *out, char *err, size_t n_err) {
    BT_ASSERT(out);
    *out = NULL;
    if (err && n_err > 0) err[0] = '\0';
    const int n = bt_cuda_device_count();
    if (device < 0 || device >= n || device >= BT_CUDA_MAX_DEVICES)
        return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED, "CUDA device %d: %d device(s) present", device, n);
    struct bt_cuda_ctx *c = calloc(1, sizeof *c);
    bt_backend_t backend = calloc(1, sizeof *backend);
    if (!c || !backend) {
        free(c);
        free(backend);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "CUDA%d: out of memory", device);
    }
    c->device = device;
    snprintf(c->name, sizeof c->name, "CUDA%d", device);
    const char *what = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) what = "cudaSetDevice";
    if (!what && (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamDefault)) != cudaSuccess) what = "stream";
    if (!what && (e = cudaEventCreateWithFlags(&c->copy_event, cudaEventDisableTiming)) != cudaSuccess)
        what = "event";
    if (!what && (e = cudaMalloc((void **)&c->d_err, 2 * sizeof(int))) != cudaSuccess) what = "error word";
    if (!what && (e = cudaMemset(c->d_err, 0, 2 * sizeof(int))) != cudaSuccess) what = "error word";
    if (!what && (e = cudaMallocHost((void **)&c->h_err, 2 * sizeof(int))) != cudaSuccess) what = "error word";
    if (!what && ((e = bt_cuda_tables_upload_matmul()) != cudaSuccess || (e = bt_cuda_tables_upload_ops()) != cudaSuccess ||
                  (e = bt_cuda_tables_upload_attn()) != cudaSuccess))
        what = "the tables of the IQ and MXFP4 types";
    if (what) {
        const enum bt_status st =
            bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED, "CUDA%d: %s: %s", device, what, cudaGetErrorString(e));
        ctx_destroy(c);
        free(backend);
        return st;
    }
    cublasStatus_t cs = cublasCreate(&c->cublas);
    if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetStream(c->cublas, c->stream);
    /* plain F32 arithmetic for F32 products (no TF32 unless the user asks
     * through NVIDIA_TF32_OVERRIDE) */
    if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetMathMode(c->cublas, CUBLAS_DEFAULT_MATH);
    /* a workspace of its own, so cuBLAS never allocates in the middle of a
     * run (see bt_cuda_scratch) */
    if (cs == CUBLAS_STATUS_SUCCESS && cudaMalloc(&c->cublas_ws, BT_CUDA_CUBLAS_WORKSPACE) != cudaSuccess) {
        (void)cudaGetLastError();
        cs = CUBLAS_STATUS_ALLOC_FAILED;
    }
    if (cs == CUBLAS_STATUS_SUCCESS) cs = cublasSetWorkspace(c->cublas, c->cublas_ws, BT_CUDA_CUBLAS_WORKSPACE);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        ctx_destroy(c);
        free(backend);
        return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED, "CUDA%d: cuBLAS initialisation failed (status %d)", device,
                               (int)cs);
    }
    backend->iface = cuda_backend_i;
    backend->context = c;
    *out = backend;
    return BT_OK;
}

bool bt_backend_is_cuda(bt_backend_t backend) { return backend && backend->iface.get_name == cuda_get_name; }

int bt_backend_cuda_device(bt_backend_t backend) {
    BT_ASSERT(bt_backend_is_cuda(backend));
    return bctx(backend)->device;
}

void *bt_backend_cuda_stream(bt_backend_t backend) {
    BT_ASSERT(bt_backend_is_cuda(backend));
    return (void *)bctx(backend)->stream;
}
