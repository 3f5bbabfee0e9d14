/* backend_limited.c - the "cpu-limited" test backend (see backend_limited.h). */
#include "backend_limited.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "backend-impl.h"
#include "baton/cpu.h"

/* One piece of work on the asynchronous backend's queue (its "stream"). */
enum cmd_kind { CMD_COMPUTE, CMD_COPY, CMD_MARK, CMD_WAIT };
struct cmd {
    enum cmd_kind kind;
    struct bt_graph graph;    /* COMPUTE: a copy of the caller's graph view */
    struct bt_tensor **nodes; /* its own node list, over... */
    struct bt_tensor *frozen; /* ...copies of the nodes as they were when queued */
    void *dst;                /* COPY */
    const void *src;
    size_t n;
    struct limited *other; /* WAIT: until other has completed `seq` */
    uint64_t seq;
    enum bt_status status; /* COMPUTE: how it went */
};

struct limited {
    bt_cpu *cpu;
    char name[32];
    bool refused[BT_OP_COUNT];
    struct bt_limited_stats stats;
    struct bt_buffer_type buft;
    struct bt_buffer_type host_buft; /* its "pinned" host memory */
    struct bt_backend *self;
    size_t mem_free, mem_total; /* bt_backend_limited_set_memory */

    /* asynchronous mode: a worker thread runs the queue in order */
    bool async;
    int delay_us;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* queue changed / progress made */
    struct cmd *q;
    int q_cap, q_head, q_len;
    uint64_t submitted, completed;
    bool stop;
    enum bt_status async_status; /* the first failure of queued work */
};

/* ---- the queue (asynchronous mode) ---- */

static void *worker_main(void *arg) {
    struct limited *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (l->q_len == 0 && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
        if (l->q_len == 0 && l->stop) break;
        struct cmd c = l->q[l->q_head];
        pthread_mutex_unlock(&l->mu);
        if (c.kind == CMD_COMPUTE) {
            /* late, so that whoever does not wait for it reads stale data */
            const struct timespec d = {0, (long)l->delay_us * 1000L};
            nanosleep(&d, NULL);
            c.status = bt_cpu_graph_compute(l->cpu, &c.graph);
            free(c.nodes);
            free(c.frozen);
        } else if (c.kind == CMD_COPY) {
            memcpy(c.dst, c.src, c.n);
        } else if (c.kind == CMD_WAIT) {
            pthread_mutex_lock(&c.other->mu);
            while (c.other->completed < c.seq) pthread_cond_wait(&c.other->cv, &c.other->mu);
            pthread_mutex_unlock(&c.other->mu);
        }
        pthread_mutex_lock(&l->mu);
        if (c.kind == CMD_COMPUTE && c.status != BT_OK && l->async_status == BT_OK) l->async_status = c.status;
        l->q_head = (l->q_head + 1) % l->q_cap;
        l->q_len--;
        l->completed++;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Queue c; returns its sequence number (completed >= it: done). */
static uint64_t enqueue(struct limited *l, struct cmd c) {
    pthread_mutex_lock(&l->mu);
    if (l->q_len == l->q_cap) {
        const int cap = l->q_cap ? 2 * l->q_cap : 64;
        struct cmd *q = malloc(sizeof *q * (size_t)cap);
        BT_ASSERT(q != NULL);
        for (int i = 0; i < l->q_len; i++) q[i] = l->q[(l->q_head + i) % l->q_cap];
        free(l->q);
        l->q = q;
        l->q_cap = cap;
        l->q_head = 0;
    }
    l->q[(l->q_head + l->q_len) % l->q_cap] = c;
    l->q_len++;
    const uint64_t seq = ++l->submitted;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return seq;
}

static void wait_done(struct limited *l, uint64_t seq) {
    if (!l->async) return;
    pthread_mutex_lock(&l->mu);
    while (l->completed < seq) pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

/* Everything queued so far is done (the synchronous buffer calls wait for
 * the queue first, as cudaMemcpy waits for a blocking stream). */
static void drain(struct limited *l) {
    if (!l->async) return;
    pthread_mutex_lock(&l->mu);
    const uint64_t seq = l->submitted;
    pthread_mutex_unlock(&l->mu);
    wait_done(l, seq);
}

/* ---- buffer type: host memory that only this backend claims ---- */

static const char *lim_buft_name(bt_buffer_type_t buft) { return ((struct limited *)buft->context)->name; }

static void lim_buffer_set(bt_buffer_t buffer, struct bt_tensor *tensor, const void *data, size_t offset,
                           size_t size) {
    struct limited *l = buffer->buft->context;
    drain(l);
    l->stats.buffer_sets++;
    l->stats.buffer_set_bytes += size;
    memcpy((uint8_t *)tensor->data + offset, data, size);
}

static void lim_buffer_get(bt_buffer_t buffer, const struct bt_tensor *tensor, void *data, size_t offset,
                           size_t size) {
    drain(buffer->buft->context);
    memcpy(data, (const uint8_t *)tensor->data + offset, size);
}

static void lim_buffer_memset(bt_buffer_t buffer, struct bt_tensor *tensor, uint8_t value, size_t offset,
                              size_t size) {
    drain(buffer->buft->context);
    memset((uint8_t *)tensor->data + offset, value, size);
}

static bool lim_buffer_cpy(bt_buffer_t buffer, const struct bt_tensor *src, struct bt_tensor *dst) {
    struct limited *l = buffer->buft->context;
    const bt_buffer_t sb = src->view_src ? src->view_src->buffer : src->buffer;
    if (!sb || sb->buft != buffer->buft) return false; /* only within this backend's memory */
    drain(l);
    memcpy(dst->data, src->data, bt_nbytes(src));
    return true;
}

static void lim_buffer_clear(bt_buffer_t buffer, uint8_t value) {
    drain(buffer->buft->context);
    memset(bt_buffer_get_base(buffer), value, bt_buffer_get_size(buffer));
}

/* A buffer of aligned host memory reported as buft's (both buffer types
 * here are host memory underneath). */
static bt_buffer_t aligned_buffer(bt_buffer_type_t buft, size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, BT_MEM_ALIGN, size ? size : BT_MEM_ALIGN) != 0) return NULL;
    bt_buffer_t b = bt_host_buffer_new(buft, p, size, true);
    if (!b) free(p);
    return b;
}

static bt_buffer_t lim_buft_alloc(bt_buffer_type_t buft, size_t size) {
    bt_buffer_t b = aligned_buffer(buft, size);
    if (!b) return NULL;
    b->iface.set_tensor = lim_buffer_set;
    b->iface.get_tensor = lim_buffer_get;
    b->iface.memset_tensor = lim_buffer_memset;
    b->iface.cpy_tensor = lim_buffer_cpy;
    b->iface.clear = lim_buffer_clear;
    return b;
}

/* host memory, counted (stands for a GPU's pinned memory) */
static const char *lim_host_buft_name(bt_buffer_type_t buft) {
    (void)buft;
    return "LIMITED_Host";
}

static bt_buffer_t lim_host_buft_alloc(bt_buffer_type_t buft, size_t size) {
    struct limited *l = buft->context;
    bt_buffer_t b = aligned_buffer(buft, size);
    if (!b) return NULL;
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
    if (l->async) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->worker, NULL);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
        free(l->q);
    }
    bt_cpu_free(l->cpu);
    free(l);
    free(b);
}

static bt_buffer_type_t lim_default_buft(bt_backend_t b) { return &((struct limited *)b->context)->buft; }

/* Asynchronous copies read and write the host memory when their turn comes,
 * as a GPU's copies from pinned memory do: the caller keeps it alive and
 * untouched until it synchronises. */
static void copy_in_order(struct limited *l, void *dst, const void *src, size_t n) {
    if (l->async)
        enqueue(l, (struct cmd){.kind = CMD_COPY, .dst = dst, .src = src, .n = n});
    else
        memcpy(dst, src, n);
}

static void lim_set_async(bt_backend_t b, struct bt_tensor *t, const void *data, size_t offset, size_t size) {
    struct limited *l = b->context;
    l->stats.set_async_calls++;
    l->stats.set_async_bytes += size;
    copy_in_order(l, (uint8_t *)t->data + offset, data, size);
}

static void lim_get_async(bt_backend_t b, const struct bt_tensor *t, void *data, size_t offset, size_t size) {
    struct limited *l = b->context;
    l->stats.get_async_calls++;
    copy_in_order(l, data, (const uint8_t *)t->data + offset, size);
}

static enum bt_status lim_compute(bt_backend_t b, struct bt_graph *g) {
    struct limited *l = b->context;
    l->stats.graph_computes++;
    l->stats.nodes_computed += (uint64_t)g->n_nodes;
    if (!l->async) return bt_cpu_graph_compute(l->cpu, g);
    pthread_mutex_lock(&l->mu);
    const enum bt_status failed = l->async_status;
    pthread_mutex_unlock(&l->mu);
    if (failed != BT_OK) return failed; /* sticky, as a GPU's errors are */
    /* a GPU's kernels take their operands' addresses when launched: freeze
     * the nodes (sources, parameters) as they are now, since the caller may
     * re-point them (the scheduler's copy slots) before the queue gets here */
    struct cmd c = {.kind = CMD_COMPUTE, .graph = *g};
    c.nodes = malloc(sizeof *c.nodes * (size_t)(g->n_nodes + 1));
    c.frozen = malloc(sizeof *c.frozen * (size_t)(g->n_nodes + 1));
    if (!c.nodes || !c.frozen) {
        free(c.nodes);
        free(c.frozen);
        return BT_ERR_NOMEM;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        c.frozen[i] = *g->nodes[i];
        c.nodes[i] = &c.frozen[i];
    }
    c.graph.nodes = c.nodes;
    enqueue(l, c);
    return BT_OK; /* before the work is done */
}

static void lim_synchronize(bt_backend_t b) { drain(b->context); }

static bool lim_supports_op(bt_backend_t b, const struct bt_tensor *op) {
    struct limited *l = b->context;
    return !l->refused[op->op] && bt_cpu_supports_op(op);
}

static bool lim_supports_buft(bt_backend_t b, bt_buffer_type_t buft) {
    return buft == &((struct limited *)b->context)->buft;
}

/* Events: a point in the backend's queue (its sequence number).  A
 * synchronous backend's events are complete once recorded; they exist to
 * exercise the scheduler's event path. */
static bt_event_t lim_event_new(bt_backend_t b) {
    bt_event_t e = calloc(1, sizeof *e);
    if (e) e->backend = b;
    return e;
}
static void lim_event_free(bt_event_t e) { free(e); }
static void lim_event_record(bt_event_t e, bt_backend_t b) {
    struct limited *l = b->context;
    l->stats.events_recorded++;
    e->backend = b;
    e->context = (void *)(uintptr_t)(l->async ? enqueue(l, (struct cmd){.kind = CMD_MARK}) : 0);
}
/* b's queue waits for e (recorded on any limited backend) */
static void lim_event_wait(bt_backend_t b, bt_event_t e) {
    struct limited *l = b->context, *owner = e->backend->context;
    const uint64_t seq = (uint64_t)(uintptr_t)e->context;
    if (!owner->async || seq == 0) return;
    if (l->async && owner != l)
        enqueue(l, (struct cmd){.kind = CMD_WAIT, .other = owner, .seq = seq});
    else if (!l->async)
        wait_done(owner, seq);
    /* the same queue: already in order */
}
static void lim_event_sync(bt_event_t e) {
    struct limited *owner = e->backend->context;
    wait_done(owner, (uint64_t)(uintptr_t)e->context);
}

static const char *lim_error(bt_backend_t b) { return bt_cpu_error(((struct limited *)b->context)->cpu); }

static bt_buffer_type_t lim_host_buft(bt_backend_t b) { return &((struct limited *)b->context)->host_buft; }

static void lim_get_memory(bt_backend_t b, size_t *free_bytes, size_t *total_bytes) {
    const struct limited *l = b->context;
    *free_bytes = l->mem_free;
    *total_bytes = l->mem_total;
}

void bt_backend_limited_set_memory(bt_backend_t b, size_t free_bytes, size_t total_bytes) {
    struct limited *l = b->context;
    l->mem_free = free_bytes;
    l->mem_total = total_bytes;
    b->iface.get_memory = lim_get_memory;
}

static const struct bt_backend_i lim_i = {
    /* .get_name                = */ lim_name,
    /* .free                    = */ lim_free,
    /* .get_default_buffer_type = */ lim_default_buft,
    /* .set_tensor_async        = */ lim_set_async,
    /* .get_tensor_async        = */ lim_get_async,
    /* .cpy_tensor_async        = */ NULL,
    /* .synchronize             = */ lim_synchronize,
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
    /* .get_memory              = */ NULL,
    /* .set_node_hook           = */ NULL,
    /* .describe                = */ NULL,
    /* .get_weight_buffer_type  = */ NULL,
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


void bt_backend_limited_refuse(bt_backend_t b, enum bt_op op, bool refuse) {
    ((struct limited *)b->context)->refused[op] = refuse;
}

struct bt_limited_stats bt_backend_limited_stats(bt_backend_t b) { return ((struct limited *)b->context)->stats; }

void bt_backend_limited_reset_stats(bt_backend_t b) {
    memset(&((struct limited *)b->context)->stats, 0, sizeof(struct bt_limited_stats));
}

void bt_backend_limited_set_async(bt_backend_t b, int delay_us) {
    struct limited *l = b->context;
    BT_ASSERT(!l->async);
    l->delay_us = delay_us;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->async = pthread_create(&l->worker, NULL, worker_main, l) == 0;
    BT_ASSERT(l->async);
}
