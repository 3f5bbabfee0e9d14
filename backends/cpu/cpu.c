/* cpu.c - the CPU executor: runs a graph's nodes in order on a thread pool.
 *
 * The whole graph is computed inside ONE bt_threadpool_run: every thread
 * walks the plan's steps (cpu_plan.c: the computed nodes, views skipped) and
 * computes its (ith, nth) share of each, or skips a solo step (thread 0
 * computes it alone), with a barrier after the steps the plan marks (where a
 * later node needs what earlier ones wrote; ggml_graph_compute_thread puts
 * one after every node).
 *
 * The plan, and the checks below, are kept for the next graph with the same
 * key (cpu_plan.c: every value of the graph they read): the scheduler
 * computes a decode step's graph again each token.
 *
 * Errors: before anything runs, every node is checked (has data, is
 * supported), so a bad graph fails with nothing computed.  A run-time error
 * (an id out of range) is reported by a kernel through bt_cpu_fail; after the
 * next barrier every thread sees it and stops.  The nodes between the s-th
 * and the (s+1)-th barrier report into status slot s % 2: a fast thread that
 * has passed barrier s can only reach nodes before barrier s + 1 (slot
 * (s+1) % 2) while a slow one still reads slot s % 2, so all threads agree
 * on where to stop.
 *
 * Work counters: a kernel may hand out its work in chunks from a counter
 * shared by the node's threads (bt_cpu_next_chunk), so that a thread slowed
 * by the OS does not hold the others at the barrier.  Each step has its own
 * counter (a cache line apart), zeroed before the run.
 *
 * Profile (bt_cpu_set_profile): thread 0 reads the clock around each step's
 * share and each barrier and adds the times to a table by (op, type); the
 * other threads do nothing more.  Off, it costs one test per step.
 */
#include "cpu_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct bt_cpu {
    int n_threads;
    bool reference;
    bool barrier_every_node; /* the plan off: a barrier after every node */
    bt_threadpool *pool;
    void *wdata; /* work buffer, BT_MEM_ALIGN aligned, kept between runs */
    size_t wsize;
    struct bt_cpu_step *steps; /* the current graph's plan */
    int64_t *counters;         /* one work counter per step, BT_CPU_COUNTER_STRIDE apart */
    int steps_cap;
    /* the plan in steps is kept for the next graph with the same key
     * (bt_cpu_plan_key): key [key_len] words, and what bt_cpu_plan returned */
    uint64_t *key, *key_new;
    size_t key_len, key_cap;
    int plan_steps; /* -1: no plan kept */
    uint64_t n_plans;
    bt_cpu_node_hook hook; /* thread 0, after its share of each node */
    void *hook_user;
    /* the profile: [BT_OP_COUNT][BT_TYPE_COUNT] rows; NULL: off */
    struct bt_cpu_op_profile *prof;
    uint64_t prof_graphs;
    double prof_graph_s;
    char err[BT_CPU_ERRBUF];
};

#define BT_CPU_COUNTER_STRIDE 8 /* int64_t: a cache line per counter */

bt_cpu *bt_cpu_new(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    bt_cpu *cpu = calloc(1, sizeof(*cpu));
    if (!cpu) return NULL;
    cpu->n_threads = n_threads;
    cpu->plan_steps = -1;
    cpu->pool = bt_threadpool_new(n_threads);
    if (!cpu->pool) {
        free(cpu);
        return NULL;
    }
    return cpu;
}

void bt_cpu_free(bt_cpu *cpu) {
    if (!cpu) return;
    bt_threadpool_free(cpu->pool);
    free(cpu->wdata);
    free(cpu->steps);
    free(cpu->counters);
    free(cpu->key);
    free(cpu->key_new);
    free(cpu->prof);
    free(cpu);
}

int bt_cpu_n_threads(const bt_cpu *cpu) { return cpu->n_threads; }
void bt_cpu_set_reference(bt_cpu *cpu, bool reference) { cpu->reference = reference; }
void bt_cpu_set_barrier_every_node(bt_cpu *cpu, bool on) { cpu->barrier_every_node = on; }
const char *bt_cpu_error(const bt_cpu *cpu) { return cpu->err; }
uint64_t bt_cpu_n_plans(const bt_cpu *cpu) { return cpu->n_plans; }

void bt_cpu_fail(const struct bt_cpu_params *p, enum bt_status s, const char *fmt, ...) {
    BT_ASSERT(s != BT_OK);
    int expected = BT_OK;
    /* first one wins; only the winner writes the message */
    if (!__atomic_compare_exchange_n((int *)p->status, &expected, (int)s, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    if (p->fail_node) *p->fail_node = p->node;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->errbuf, BT_CPU_ERRBUF, fmt, ap);
    va_end(ap);
}

static bool is_mul_mat(enum bt_op op) { return op == BT_OP_MUL_MAT || op == BT_OP_MUL_MAT_ID; }

/* ---- the profile ---- */

void bt_cpu_set_profile(bt_cpu *cpu, bool on) {
    free(cpu->prof);
    cpu->prof = on ? calloc((size_t)BT_OP_COUNT * BT_TYPE_COUNT, sizeof *cpu->prof) : NULL;
    cpu->prof_graphs = 0;
    cpu->prof_graph_s = 0.0;
}

int bt_cpu_get_profile(const bt_cpu *cpu, struct bt_cpu_op_profile *rows, int cap, uint64_t *n_graphs,
                       double *graph_s) {
    *n_graphs = cpu->prof_graphs;
    *graph_s = cpu->prof_graph_s;
    int n = 0;
    for (int i = 0; cpu->prof && i < BT_OP_COUNT * BT_TYPE_COUNT; i++) {
        if (cpu->prof[i].count == 0) continue;
        if (n < cap) {
            rows[n] = cpu->prof[i];
            rows[n].op = (enum bt_op)(i / BT_TYPE_COUNT);
            rows[n].type = (enum bt_type)(i % BT_TYPE_COUNT);
        }
        n++;
    }
    return n;
}

/* The weight bytes a matmul node reads: all of src0 (MUL_MAT), or the
 * experts its ids choose that are held here (MUL_MAT_ID; all of them past
 * 4096 experts). */
static double weight_bytes(const struct bt_tensor *node) {
    const struct bt_tensor *a = node->src[0];
    if (node->op == BT_OP_MUL_MAT)
        return a->row_hi > 0      ? (double)(a->row_hi - a->row_lo) * (double)a->nb[1]
               : a->expert_hi > 0 ? (double)(a->expert_hi - a->expert_lo) * (double)a->nb[2]
                                  : (double)bt_nbytes(a);
    const struct bt_tensor *ids = node->src[2];
    uint64_t seen[64] = {0};
    if (a->ne[2] > 64 * 64) return (double)bt_nbytes(a);
    int64_t n = 0;
    for (int64_t t = 0; t < ids->ne[1]; t++)
        for (int64_t e = 0; e < ids->ne[0]; e++) {
            const int32_t id = *(const int32_t *)((const char *)ids->data + (size_t)e * ids->nb[0] + (size_t)t * ids->nb[1]);
            if (id < 0 || id >= a->ne[2] || (seen[id / 64] >> (id % 64) & 1)) continue;
            if (a->expert_hi > 0 && (id < a->expert_lo || id >= a->expert_hi)) continue; /* not held here */
            seen[id / 64] |= 1ull << (id % 64);
            n++;
        }
    return (double)n * (double)a->nb[2];
}

static struct bt_cpu_op_profile *prof_row(bt_cpu *cpu, const struct bt_tensor *node) {
    const enum bt_type t = node->src[0] ? node->src[0]->type : node->type;
    return &cpu->prof[(size_t)node->op * BT_TYPE_COUNT + (size_t)t];
}

bool bt_cpu_supports_op(const struct bt_tensor *node) {
    if (!node || (int)node->op < 0 || node->op >= BT_OP_COUNT) return false;
    if ((int)node->type < 0 || node->type >= BT_TYPE_COUNT) return false;
    if (is_mul_mat(node->op)) return bt_cpu_mul_mat_supported(node);
    if (node->op == BT_OP_FLASH_ATTN) return bt_cpu_flash_attn_supported(node);
    return bt_cpu_op_supported(node);
}

size_t bt_cpu_work_size(const struct bt_tensor *node, int nth) {
    if (bt_op_is_view(node->op) || node->op == BT_OP_NONE) return 0;
    if (is_mul_mat(node->op)) return bt_cpu_mul_mat_work_size(node, nth);
    if (node->op == BT_OP_FLASH_ATTN) return bt_cpu_flash_attn_work_size(node, nth);
    return bt_cpu_op_work_size(node, nth);
}

/* ---- one run ---- */

struct compute_state {
    bt_cpu *cpu;
    struct bt_graph *g;
    int n_steps;
    /* the nodes after the s-th barrier report into slot s & 1 */
    volatile int status[2];
    volatile int fail_node[2]; /* the node that set status[k] */
};

static void compute_thread(void *arg, int ith, int nth) {
    struct compute_state *st = arg;
    bt_cpu *cpu = st->cpu;
    struct bt_graph *g = st->g;

    struct bt_cpu_params p = {
        /* .ith       = */ ith,
        /* .nth       = */ nth,
        /* .wdata     = */ NULL,
        /* .wsize     = */ 0,
        /* .reference = */ cpu->reference,
        /* .pool      = */ cpu->pool,
        /* .status    = */ NULL,
        /* .errbuf    = */ cpu->err,
        /* .chunk     = */ NULL,
        /* .node      = */ -1,
        /* .fail_node = */ NULL,
    };
    int sb = 0; /* barriers passed */
    const bool prof = ith == 0 && cpu->prof;
    double t0 = prof ? bt_now_s() : 0.0;
    for (int k = 0; k < st->n_steps; k++) {
        const struct bt_cpu_step *step = &cpu->steps[k];
        struct bt_tensor *node = g->nodes[step->node];
        if (!step->solo || ith == 0) {
            p.ith = step->solo ? 0 : ith;
            p.nth = step->solo ? 1 : nth;
            p.wdata = cpu->wdata ? (char *)cpu->wdata + step->wofs : NULL;
            p.wsize = step->wsize;
            p.status = &st->status[sb & 1];
            p.fail_node = (int *)&st->fail_node[sb & 1];
            p.chunk = &cpu->counters[(size_t)k * BT_CPU_COUNTER_STRIDE];
            p.node = step->node;
            if (is_mul_mat(node->op)) {
                if (node->op == BT_OP_MUL_MAT)
                    bt_cpu_mul_mat(&p, node);
                else
                    bt_cpu_mul_mat_id(&p, node);
            } else if (node->op == BT_OP_FLASH_ATTN) {
                bt_cpu_flash_attn(&p, node);
            } else {
                bt_cpu_compute_op(&p, node);
            }
        }
        if (ith == 0 && cpu->hook) cpu->hook(cpu->hook_user);
        struct bt_cpu_op_profile *row = NULL;
        if (prof) {
            const double t1 = bt_now_s();
            row = prof_row(cpu, node);
            row->count++;
            row->compute_s += t1 - t0;
            if (is_mul_mat(node->op)) row->weight_bytes += weight_bytes(node);
            t0 = t1;
        }
        if (!step->barrier) continue;
        bt_threadpool_barrier(cpu->pool);
        if (prof) {
            const double t1 = bt_now_s();
            row->wait_s += t1 - t0;
            t0 = t1;
        }
        if (__atomic_load_n((int *)&st->status[sb & 1], __ATOMIC_ACQUIRE) != BT_OK) break;
        sb++;
    }
}

/* Every computed node supported, with data, and its sources with data:
 * BT_OK, else the status and cpu->err. */
static enum bt_status check_nodes(bt_cpu *cpu, const struct bt_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        struct bt_tensor *node = g->nodes[i];
        if (bt_op_is_view(node->op) || node->op == BT_OP_NONE) continue;
        if (!bt_cpu_supports_op(node)) {
            snprintf(cpu->err, sizeof(cpu->err),
                     "node %d '%s': op %s (type %s) not supported by the CPU backend", i, node->name,
                     ((int)node->op >= 0 && node->op < BT_OP_COUNT) ? bt_op_name(node->op) : "?",
                     ((int)node->type >= 0 && node->type < BT_TYPE_COUNT) ? bt_type_name(node->type)
                                                                          : "?");
            return BT_ERR_UNSUPPORTED;
        }
        if (!node->data) {
            snprintf(cpu->err, sizeof(cpu->err), "node %d '%s' (%s) has no data", i, node->name,
                     bt_op_name(node->op));
            return BT_ERR_INVALID;
        }
        for (int s = 0; s < BT_MAX_SRC; s++) {
            const struct bt_tensor *src = node->src[s];
            /* repacked weights (cpu.h): only the matmul (as its weights) and
             * GET_ROWS (as its table) read them, whole (a view would
             * address plain rows) */
            if (src && bt_cpu_weight_is_repacked(src))
                BT_ASSERT((is_mul_mat(node->op) || node->op == BT_OP_GET_ROWS) && s == 0 && !src->view_src);
            if (src && !src->data) {
                snprintf(cpu->err, sizeof(cpu->err), "node %d '%s' (%s): source %d '%s' has no data",
                         i, node->name, bt_op_name(node->op), s, src->name);
                return BT_ERR_INVALID;
            }
        }
    }
    return BT_OK;
}

/* Room for the plan and the key of a graph of n nodes.  Growing drops the
 * kept plan (a larger graph than its own has another key anyway). */
static enum bt_status reserve(bt_cpu *cpu, int n) {
    const size_t kw = bt_cpu_plan_key_words(n);
    if (n <= cpu->steps_cap && kw <= cpu->key_cap) return BT_OK;
    struct bt_cpu_step *steps = malloc((size_t)n * sizeof *steps);
    int64_t *counters = malloc((size_t)n * BT_CPU_COUNTER_STRIDE * sizeof *counters);
    uint64_t *key = malloc(kw * sizeof *key), *key_new = malloc(kw * sizeof *key_new);
    if (!steps || !counters || !key || !key_new) {
        free(steps);
        free(counters);
        free(key);
        free(key_new);
        snprintf(cpu->err, sizeof(cpu->err), "out of memory (the plan of %d nodes)", n);
        return BT_ERR_NOMEM;
    }
    free(cpu->steps);
    free(cpu->counters);
    free(cpu->key);
    free(cpu->key_new);
    cpu->steps = steps;
    cpu->counters = counters;
    cpu->key = key;
    cpu->key_new = key_new;
    cpu->steps_cap = n;
    cpu->key_cap = kw;
    cpu->plan_steps = -1;
    cpu->key_len = 0;
    return BT_OK;
}

/* Check the graph, plan the run, grow the work buffer; or, when the graph's
 * key (bt_cpu_plan_key) is the kept plan's, take that plan as it is: the
 * key holds everything the checks, the plan and the work sizes read (op,
 * op_params, type, shape, strides and data of each computed node and of its
 * sources), so they would all come out the same.  A decode step computes
 * the same graph every token. */
static enum bt_status prepare(bt_cpu *cpu, struct bt_graph *g, int *n_steps) {
    for (int i = 0; i < g->n_nodes; i++) {
        if (!g->nodes[i]) {
            snprintf(cpu->err, sizeof(cpu->err), "node %d is NULL", i);
            return BT_ERR_INVALID;
        }
    }
    enum bt_status s = reserve(cpu, g->n_nodes);
    if (s != BT_OK) return s;
    const size_t len = bt_cpu_plan_key(g, cpu->n_threads, cpu->barrier_every_node, cpu->key_new);
    if (cpu->plan_steps >= 0 && len == cpu->key_len && memcmp(cpu->key_new, cpu->key, len * sizeof *cpu->key) == 0) {
        *n_steps = cpu->plan_steps;
        return BT_OK;
    }
    cpu->plan_steps = -1; /* steps is overwritten below */
    if ((s = check_nodes(cpu, g)) != BT_OK) return s;
    size_t wsize = 0;
    *n_steps = bt_cpu_plan(g, cpu->n_threads, cpu->barrier_every_node, cpu->steps, &wsize);
    cpu->n_plans++;
    if (wsize > cpu->wsize) {
        /* round up so the aligned allocation's size is a multiple of the alignment */
        size_t sz = (wsize + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN;
        void *w = NULL;
        if (posix_memalign(&w, BT_MEM_ALIGN, sz) != 0 || !w) {
            snprintf(cpu->err, sizeof(cpu->err), "cannot allocate a work buffer of %zu bytes", sz);
            return BT_ERR_NOMEM;
        }
        free(cpu->wdata);
        cpu->wdata = w;
        cpu->wsize = sz;
    }
    /* kept only now: the plan's work buffer is there */
    uint64_t *t = cpu->key;
    cpu->key = cpu->key_new;
    cpu->key_new = t;
    cpu->key_len = len;
    cpu->plan_steps = *n_steps;
    return BT_OK;
}

void bt_cpu_set_node_hook(bt_cpu *cpu, bt_cpu_node_hook fn, void *user) {
    cpu->hook = fn;
    cpu->hook_user = user;
}

enum bt_status bt_cpu_graph_compute(bt_cpu *cpu, struct bt_graph *g) {
    BT_ASSERT(cpu && g);
    cpu->err[0] = '\0';
    int n_steps = 0;
    enum bt_status s = prepare(cpu, g, &n_steps);
    if (s != BT_OK) return s;
    memset(cpu->counters, 0, (size_t)n_steps * BT_CPU_COUNTER_STRIDE * sizeof *cpu->counters);

    struct compute_state st = {
        /* .cpu       = */ cpu,
        /* .g         = */ g,
        /* .n_steps   = */ n_steps,
        /* .status    = */ {BT_OK, BT_OK},
        /* .fail_node = */ {-1, -1},
    };
    const double t0 = cpu->prof ? bt_now_s() : 0.0;
    bt_threadpool_run(cpu->pool, compute_thread, &st);
    if (cpu->prof) {
        cpu->prof_graphs++;
        cpu->prof_graph_s += bt_now_s() - t0;
    }

    for (int k = 0; k < 2; k++) {
        if (st.status[k] == BT_OK) continue;
        s = (enum bt_status)st.status[k];
        if (cpu->err[0] == '\0')
            snprintf(cpu->err, sizeof(cpu->err), "node %d '%s': %s", st.fail_node[k], g->nodes[st.fail_node[k]]->name,
                     bt_status_str(s));
        return s;
    }
    return BT_OK;
}
