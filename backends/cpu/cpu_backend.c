/* cpu_backend.c - the CPU as a baton backend: host-memory buffers and the
 * thread-pool executor (cpu.c) behind the backend vtable.  The CPU computes
 * synchronously, so it needs no events: the scheduler synchronises instead. */
#include "backend-impl.h"
#include "baton/cpu.h"
#include "qtypes.h"

#include <stdio.h>
#include <string.h>

/* The CPU's buffers are the core's plain host memory (bt_cpu_buffer_type,
 * backend.c), and for the weights only it reads, the repack buffer type. */

/* ---- the repack buffer type (as ggml's CPU_REPACK) ---------------------------- */

/* Host memory as bt_cpu_buffer_type's, but a weight matrix the CPU's matmul
 * reads faster repacked (bt_cpu_weight_repackable) is repacked as its bytes
 * are set: set whole, or whole groups of its rows (the experts of a 3-d
 * weight or the rows of a 2-d one that a rank holds); any other tensor is
 * copied as it is.  The same bytes, the same sizes and offsets, the same
 * results' bits (repack.c). */
static void repack_set_tensor(bt_buffer_t buffer, struct bt_tensor *t, const void *data, size_t offset,
                              size_t size) {
    (void)buffer;
    if (!bt_cpu_weight_repackable(t)) {
        memcpy((uint8_t *)t->data + offset, data, size);
        return;
    }
    if (offset == 0 && size == bt_nbytes(t)) {
        bt_cpu_weight_repack(t, data);
        return;
    }
    /* whole groups of rows only (the experts or the rows a rank holds) */
    const size_t gb = (size_t)BT_CPU_PANEL_ROWS * t->nb[1];
    BT_ASSERT(offset % gb == 0 && size % gb == 0);
    struct bt_tensor part = *t; /* those rows as a matrix of their own */
    part.ne[1] = (int64_t)(size / t->nb[1]);
    part.ne[2] = part.ne[3] = 1;
    part.nb[2] = part.nb[3] = size;
    part.data = (uint8_t *)t->data + offset;
    bt_cpu_weight_repack(&part, data);
    t->flags |= BT_TENSOR_FLAG_REPACKED;
}

static const char *repack_buft_name(bt_buffer_type_t buft) {
    (void)buft;
    return "CPU_REPACK";
}

static bt_buffer_t repack_buft_alloc(bt_buffer_type_t buft, size_t size) {
    void *p = bt_host_alloc(size);
    bt_buffer_t b = p ? bt_host_buffer_new(buft, p, size, true) : NULL;
    if (!b) {
        free(p);
        return NULL;
    }
    b->iface.set_tensor = repack_set_tensor;
    b->iface.cpy_tensor = NULL; /* a copy into it is a set (bt_tensor_copy) */
    return b;
}

static size_t repack_buft_alignment(bt_buffer_type_t buft) {
    (void)buft;
    return bt_buft_get_alignment(bt_cpu_buffer_type());
}

static bool repack_buft_is_host(bt_buffer_type_t buft) {
    (void)buft;
    return true;
}

static struct bt_buffer_type repack_buft = {
    .iface =
        {
            /* .get_name       = */ repack_buft_name,
            /* .alloc_buffer   = */ repack_buft_alloc,
            /* .get_alignment  = */ repack_buft_alignment,
            /* .get_max_size   = */ NULL,
            /* .get_alloc_size = */ NULL,
            /* .is_host        = */ repack_buft_is_host,
        },
    .context = NULL,
};

bt_buffer_type_t bt_cpu_repack_buffer_type(void) { return &repack_buft; }

/* ---- backend --------------------------------------------------------------- */

struct cpu_backend {
    bt_cpu *cpu;
    char name[32];
};

static const char *cpu_get_name(bt_backend_t backend) {
    return ((struct cpu_backend *)backend->context)->name;
}

static void cpu_free(bt_backend_t backend) {
    struct cpu_backend *cb = backend->context;
    bt_cpu_free(cb->cpu);
    free(cb);
    free(backend);
}

static bt_buffer_type_t cpu_get_default_buffer_type(bt_backend_t backend) {
    (void)backend;
    return bt_cpu_buffer_type();
}

static enum bt_status cpu_graph_compute(bt_backend_t backend, struct bt_graph *graph) {
    return bt_cpu_graph_compute(((struct cpu_backend *)backend->context)->cpu, graph);
}

static bool cpu_supports_op(bt_backend_t backend, const struct bt_tensor *op) {
    (void)backend;
    return bt_cpu_supports_op(op);
}

/* Any host memory the CPU can read directly (its own, pinned host memory). */
static bool cpu_supports_buft(bt_backend_t backend, bt_buffer_type_t buft) {
    (void)backend;
    return bt_buft_is_host(buft);
}

static const char *cpu_get_error(bt_backend_t backend) {
    return bt_cpu_error(((struct cpu_backend *)backend->context)->cpu);
}

static bt_buffer_type_t cpu_get_weight_buffer_type(bt_backend_t backend) {
    (void)backend;
    return bt_cpu_repack_buffer_type();
}

static void cpu_set_node_hook(bt_backend_t backend, void (*fn)(void *user), void *user) {
    bt_cpu_set_node_hook(((struct cpu_backend *)backend->context)->cpu, fn, user);
}

/* "CPU(avx512)": the variant of the kernels, so that ranks on different
 * CPUs say which ran (every variant gives the same bits) */
static void cpu_describe(bt_backend_t backend, char *buf, size_t n) {
    snprintf(buf, n, "%s(%s)", cpu_get_name(backend), bt_cpu_variant_name());
}

static const struct bt_backend_i cpu_backend_i = {
    /* .get_name                = */ cpu_get_name,
    /* .free                    = */ cpu_free,
    /* .get_default_buffer_type = */ cpu_get_default_buffer_type,
    /* .set_tensor_async        = */ NULL,
    /* .get_tensor_async        = */ NULL,
    /* .cpy_tensor_async        = */ NULL,
    /* .synchronize             = */ NULL,
    /* .graph_compute           = */ cpu_graph_compute,
    /* .supports_op             = */ cpu_supports_op,
    /* .supports_buft           = */ cpu_supports_buft,
    /* .offload_op              = */ NULL,
    /* .event_new               = */ NULL,
    /* .event_free              = */ NULL,
    /* .event_record            = */ NULL,
    /* .event_wait              = */ NULL,
    /* .event_synchronize       = */ NULL,
    /* .get_error               = */ cpu_get_error,
    /* .get_host_buffer_type    = */ NULL,
    /* .get_memory              = */ NULL,
    /* .set_node_hook           = */ cpu_set_node_hook,
    /* .describe                = */ cpu_describe,
    /* .get_weight_buffer_type  = */ cpu_get_weight_buffer_type,
};

bt_backend_t bt_backend_cpu_init(int n_threads) {
    bt_backend_t backend = calloc(1, sizeof *backend);
    struct cpu_backend *cb = calloc(1, sizeof *cb);
    bt_cpu *cpu = (backend && cb) ? bt_cpu_new(n_threads) : NULL;
    if (!cpu) {
        free(backend);
        free(cb);
        return NULL;
    }
    cb->cpu = cpu;
    snprintf(cb->name, sizeof cb->name, "CPU");
    backend->iface = cpu_backend_i;
    backend->context = cb;
    return backend;
}

bool bt_backend_is_cpu(bt_backend_t backend) { return backend && backend->iface.get_name == cpu_get_name; }

void bt_backend_cpu_set_profile(bt_backend_t backend, bool on) {
    BT_ASSERT(bt_backend_is_cpu(backend));
    bt_cpu_set_profile(((struct cpu_backend *)backend->context)->cpu, on);
}

int bt_backend_cpu_get_profile(bt_backend_t backend, struct bt_cpu_op_profile *rows, int cap, uint64_t *n_graphs,
                               double *graph_s) {
    BT_ASSERT(bt_backend_is_cpu(backend));
    return bt_cpu_get_profile(((struct cpu_backend *)backend->context)->cpu, rows, cap, n_graphs, graph_s);
}
