/* backend_limited.c - the "cpu-limited" test backend (see backend_limited.h). */
#include "backend_limited.h"

#include <string.h>

#include "cpu.h"

struct limited {
    bt_cpu *cpu;
    char name[32];
    bool refused[BT_OP_COUNT];
    struct bt_limited_stats stats;
    struct bt_buffer_type buft;
    struct bt_buffer_type host_buft; /* its "pinned" host memory */
    struct bt_backend *self;
};

/* ---- buffer type: host memory that only this backend claims ---- */

static const char *lim_buft_name(bt_buffer_type_t buft) { return ((struct limited *)buft->context)->name; }

static void lim_buffer_set(bt_buffer_t buffer, struct bt_tensor *tensor, const void *data, size_t offset,
                           size_t size) {
    struct limited *l = buffer->buft->context;
    l->stats.buffer_sets++;
    l->stats.buffer_set_bytes += size;
    memcpy((uint8_t *)tensor->data + offset, data, size);
}

static bt_buffer_t lim_buft_alloc(bt_buffer_type_t buft, size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, BT_MEM_ALIGN, size ? size : BT_MEM_ALIGN) != 0) return NULL;
    bt_buffer_t b = bt_host_buffer_new(buft, p, size, true);
    if (!b) {
        free(p);
        return NULL;
    }
    b->iface.set_tensor = lim_buffer_set;
    return b;
}

/* host memory, counted (stands for a GPU's pinned memory) */
static const char *lim_host_buft_name(bt_buffer_type_t buft) {
    (void)buft;
    return "LIMITED_Host";
}

static bt_buffer_t lim_host_buft_alloc(bt_buffer_type_t buft, size_t size) {
    struct limited *l = buft->context;
    void *p = NULL;
    if (posix_memalign(&p, BT_MEM_ALIGN, size ? size : BT_MEM_ALIGN) != 0) return NULL;
    bt_buffer_t b = bt_host_buffer_new(buft, p, size, true);
    if (!b) {
        free(p);
        return NULL;
    }
    l->stats.host_allocs++;
    l->stats.host_alloc_bytes += size;
    return b;
}

static bool lim_host_buft_is_host(bt_buffer_type_t buft) {
    (void)buft;
    return true;
}

static size_t lim_buft_alignment(bt_buffer_type_t buft) {
    (void)buft;
    return BT_MEM_ALIGN;
}

/* not host: the CPU backend must not read it directly (as with device memory) */
static bool lim_buft_is_host(bt_buffer_type_t buft) {
    (void)buft;
    return false;
}

/* ---- backend ---- */

static const char *lim_name(bt_backend_t b) { return ((struct limited *)b->context)->name; }

static void lim_free(bt_backend_t b) {
    struct limited *l = b->context;
    bt_cpu_free(l->cpu);
    free(l);
    free(b);
}

static bt_buffer_type_t lim_default_buft(bt_backend_t b) { return &((struct limited *)b->context)->buft; }

static void lim_set_async(bt_backend_t b, struct bt_tensor *t, const void *data, size_t offset, size_t size) {
    struct limited *l = b->context;
    l->stats.set_async_calls++;
    l->stats.set_async_bytes += size;
    memcpy((uint8_t *)t->data + offset, data, size);
}

static void lim_get_async(bt_backend_t b, const struct bt_tensor *t, void *data, size_t offset, size_t size) {
    ((struct limited *)b->context)->stats.get_async_calls++;
    memcpy(data, (const uint8_t *)t->data + offset, size);
}

static enum bt_status lim_compute(bt_backend_t b, struct bt_graph *g) {
    struct limited *l = b->context;
    l->stats.graph_computes++;
    l->stats.nodes_computed += (uint64_t)g->n_nodes;
    return bt_cpu_graph_compute(l->cpu, g);
}

static bool lim_supports_op(bt_backend_t b, const struct bt_tensor *op) {
    struct limited *l = b->context;
    return !l->refused[op->op] && bt_cpu_supports_op(op);
}

static bool lim_supports_buft(bt_backend_t b, bt_buffer_type_t buft) {
    return buft == &((struct limited *)b->context)->buft;
}

/* events: the backend computes synchronously, so an event is complete once
 * recorded; they exist to exercise the scheduler's event path */
static bt_event_t lim_event_new(bt_backend_t b) {
    bt_event_t e = calloc(1, sizeof *e);
    if (e) e->backend = b;
    return e;
}
static void lim_event_free(bt_event_t e) { free(e); }
static void lim_event_record(bt_event_t e, bt_backend_t b) {
    (void)e;
    ((struct limited *)b->context)->stats.events_recorded++;
}
static void lim_event_wait(bt_backend_t b, bt_event_t e) {
    (void)b;
    (void)e;
}
static void lim_event_sync(bt_event_t e) { (void)e; }

static const char *lim_error(bt_backend_t b) { return bt_cpu_error(((struct limited *)b->context)->cpu); }

static bt_buffer_type_t lim_host_buft(bt_backend_t b) { return &((struct limited *)b->context)->host_buft; }

static const struct bt_backend_i lim_i = {
    /* .get_name                = */ lim_name,
    /* .free                    = */ lim_free,
    /* .get_default_buffer_type = */ lim_default_buft,
    /* .set_tensor_async        = */ lim_set_async,
    /* .get_tensor_async        = */ lim_get_async,
    /* .cpy_tensor_async        = */ NULL,
    /* .synchronize             = */ NULL,
    /* .graph_compute           = */ lim_compute,
    /* .supports_op             = */ lim_supports_op,
    /* .supports_buft           = */ lim_supports_buft,
    /* .offload_op              = */ NULL,
    /* .event_new               = */ lim_event_new,
    /* .event_free              = */ lim_event_free,
    /* .event_record            = */ lim_event_record,
    /* .event_wait              = */ lim_event_wait,
    /* .event_synchronize       = */ lim_event_sync,
    /* .get_error               = */ lim_error,
    /* .get_host_buffer_type    = */ lim_host_buft,
};

bt_backend_t bt_backend_limited_init(const char *name, int n_threads, const enum bt_op *refused, int n_refused) {
    bt_backend_t b = calloc(1, sizeof *b);
    struct limited *l = calloc(1, sizeof *l);
    bt_cpu *cpu = (b && l) ? bt_cpu_new(n_threads) : NULL;
    if (!cpu) {
        free(b);
        free(l);
        return NULL;
    }
    l->cpu = cpu;
    snprintf(l->name, sizeof l->name, "%s", name ? name : "LIMITED");
    for (int i = 0; i < n_refused; i++) l->refused[refused[i]] = true;
    l->buft.iface = (struct bt_buffer_type_i){
        /* .get_name       = */ lim_buft_name,
        /* .alloc_buffer   = */ lim_buft_alloc,
        /* .get_alignment  = */ lim_buft_alignment,
        /* .get_max_size   = */ NULL,
        /* .get_alloc_size = */ NULL,
        /* .is_host        = */ lim_buft_is_host,
    };
    l->buft.context = l;
    l->host_buft.iface = (struct bt_buffer_type_i){
        /* .get_name       = */ lim_host_buft_name,
        /* .alloc_buffer   = */ lim_host_buft_alloc,
        /* .get_alignment  = */ lim_buft_alignment,
        /* .get_max_size   = */ NULL,
        /* .get_alloc_size = */ NULL,
        /* .is_host        = */ lim_host_buft_is_host,
    };
    l->host_buft.context = l;
    l->self = b;
    b->iface = lim_i;
    b->context = l;
    return b;
}

bool bt_backend_is_limited(bt_backend_t b) { return b && b->iface.get_name == lim_name; }

void bt_backend_limited_refuse(bt_backend_t b, enum bt_op op, bool refuse) {
    ((struct limited *)b->context)->refused[op] = refuse;
}

struct bt_limited_stats bt_backend_limited_stats(bt_backend_t b) { return ((struct limited *)b->context)->stats; }

void bt_backend_limited_reset_stats(bt_backend_t b) {
    memset(&((struct limited *)b->context)->stats, 0, sizeof(struct bt_limited_stats));
}
