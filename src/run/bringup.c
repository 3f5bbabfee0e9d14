/* bringup.c - one rank's bring-up (see bringup.h): topology, MPI, backend,
 * device transport, dist options; and what a topology says about its ranks
 * for the offline plan. */
#include "bringup.h"
#include "../mem.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/backend-reg.h"
#ifdef BATON_HAVE_NCCL
#include "bt_nccl.h"
#endif

static enum bt_status rfail(struct bt_rank *r, enum bt_status st, int exit_code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static enum bt_status rfail(struct bt_rank *r, enum bt_status st, int exit_code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    r->exit_code = exit_code;
    return st;
}

enum bt_status bt_rank_agree(bt_transport *t, enum bt_status st, int *exit_code, char *msg, size_t n_msg) {
    int64_t v = st != BT_OK ? (int64_t)(t->size - t->rank) : 0;
    if (t->iface.allreduce_max(t, &v, 1) != BT_OK) {
        snprintf(msg, n_msg, "%s", t->error);
        return BT_ERR_COMM;
    }
    if (v == 0) return BT_OK;
    const int root = t->size - (int)v;
    int32_t code[2] = {(int32_t)st, exit_code ? *exit_code : 1};
    if (t->iface.bcast(t, code, sizeof code, root) != BT_OK || t->iface.bcast(t, msg, n_msg, root) != BT_OK) {
        snprintf(msg, n_msg, "%s", t->error);
        return BT_ERR_COMM;
    }
    msg[n_msg - 1] = '\0';
    if (exit_code) *exit_code = code[1];
    return (enum bt_status)code[0];
}

/* Every rank learns whether any failed; all return the lowest failing rank's
 * status, exit code and message. */
static enum bt_status agree(struct bt_rank *r, enum bt_status st) {
    const enum bt_status s = bt_rank_agree(r->t, st, &r->exit_code, r->error, sizeof r->error);
    if (s == BT_ERR_COMM && st != BT_ERR_COMM) r->exit_code = 1;
    return s;
}

/* ---- what a topology says ------------------------------------------------------ */

enum bt_status bt_topology_plan_options(const struct bt_topology *t, struct bt_plan_options *opt, int **counts,
                                        struct bt_dist_pin **pins, struct bt_expert_group **groups, uint8_t **edges) {
    memset(opt, 0, sizeof *opt);
    *counts = NULL;
    *pins = NULL;
    *groups = NULL;
    *edges = NULL;
    if (t->pipeline.n_groups > 0) {
        *groups = calloc((size_t)t->pipeline.n_groups, sizeof **groups);
        if (!*groups) return BT_ERR_NOMEM;
        for (int g = 0; g < t->pipeline.n_groups; g++) {
            (*groups)[g].n_ranks = t->pipeline.groups[g].n_ranks;
            (*groups)[g].dense = t->pipeline.divide_dense;
            (*groups)[g].tokens = t->pipeline.divide_tokens;
            (*groups)[g].overlap = t->pipeline.expert_overlap;
            for (int i = 0; i < t->pipeline.groups[g].n_ranks; i++) (*groups)[g].ranks[i] = t->pipeline.groups[g].ranks[i];
        }
        opt->groups = *groups;
        opt->n_groups = t->pipeline.n_groups;
    }
    const int P = t->n_ranks;
    opt->n_copies = t->pipeline.micro_batches < BT_SCHED_MAX_COPIES ? t->pipeline.micro_batches : BT_SCHED_MAX_COPIES;
    if (!t->pipeline.partition_auto) {
        *counts = calloc((size_t)P, sizeof(int));
        if (!*counts) return BT_ERR_NOMEM;
        for (int r = 0; r < P; r++) (*counts)[r] = t->pipeline.layers[r];
    }
    if (t->pipeline.n_pins > 0) {
        *pins = calloc((size_t)t->pipeline.n_pins, sizeof **pins);
        if (!*pins) return BT_ERR_NOMEM;
        for (int i = 0; i < t->pipeline.n_pins; i++) {
            snprintf((*pins)[i].pattern, sizeof (*pins)[i].pattern, "%s", t->pipeline.pins[i].pattern);
            (*pins)[i].rank = t->pipeline.pins[i].rank;
            (*pins)[i].compute_at_layer = t->pipeline.pins[i].compute_at_layer;
        }
    }
    int n_edges = 0;
    uint8_t *m = calloc((size_t)P * (size_t)P, 1);
    if (!m) return BT_ERR_NOMEM;
    for (int a = 0; a < P; a++)
        for (int b = 0; b < P; b++) {
            m[(size_t)a * (size_t)P + (size_t)b] = a != b && bt_topology_edge_link(t, a, b) == BT_TOPO_LINK_NCCL;
            n_edges += m[(size_t)a * (size_t)P + (size_t)b];
        }
    if (n_edges > 0) *edges = m;
    else free(m);
    opt->layers_per_rank = *counts;
    opt->pins = *pins;
    opt->n_pins = *pins ? t->pipeline.n_pins : 0;
    opt->device_edges = *edges;
    return BT_OK;
}

enum bt_status bt_topology_rank_descs(const struct bt_topology *t, double cpu_gflops, double gpu_gflops,
                                      struct bt_rank_desc **out, char *err, size_t errlen) {
    const int P = t->n_ranks;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const int64_t host_mem = pages > 0 && page > 0 ? (int64_t)pages * page : (int64_t)8 << 30;
    *out = NULL;
    struct bt_rank_desc *descs = calloc((size_t)P, sizeof *descs);
    if (!descs) {
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    for (int r = 0; r < P; r++) {
        const struct bt_topo_rank *tr = bt_topology_rank(t, r);
        const int on_host = bt_topology_host_ranks(t, tr->host);
        const struct bt_topo_host *h = bt_topology_host(t, tr->host);
        const int64_t mem = (int64_t)bt_topology_rank_memory(t, r);
        if (tr->backend == BT_TOPO_BACKEND_CUDA) {
            if (mem == 0) {
                snprintf(err, errlen,
                         "%s:%d:%d: rank %d (cuda:%d on %s): the plan needs its device's memory: give the rank a "
                         "memory: or its host a gpu_memory: (a live run uses the device's free memory)",
                         t->path ? t->path : "topology", tr->pos.line, tr->pos.col, r, tr->device, h->name);
                free(descs);
                return BT_ERR_INVALID;
            }
            snprintf(descs[r].backend, sizeof descs[r].backend, "CUDA%d@%s", tr->device, h->name);
            descs[r].gflops = gpu_gflops;
            descs[r].mem_bytes = mem;
            descs[r].device = 1; /* CUDA ranks open NCCL for the topology's nccl edges */
        } else {
            snprintf(descs[r].backend, sizeof descs[r].backend, "CPUx%d@%s", tr->threads, h->name);
            descs[r].threads = tr->threads;
            descs[r].gflops = cpu_gflops * tr->threads;
            descs[r].mem_bytes = mem ? mem : host_mem / (on_host > 0 ? on_host : 1);
        }
    }
    *out = descs;
    return BT_OK;
}

/* ---- bring-up ---------------------------------------------------------------------- */

bool bt_partition_parse(const char *s, int *counts, int n, char *err, size_t n_err) {
    int i = 0;
    const char *p = s;
    while (*p) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 100000 || (*end && *end != ','))
            return snprintf(err, n_err, "--partition: '%s' is not 'auto' or a list of positive layer counts like 4,4",
                            s),
                   false;
        if (i >= n) return snprintf(err, n_err, "--partition: %s lists more than %d counts (one per rank)", s, n), false;
        counts[i++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (i != n) return snprintf(err, n_err, "--partition: %s lists %d counts for %d ranks", s, i, n), false;
    return true;
}

/* The node-local rank the launcher put in the environment (before MPI is
 * up), -1 when none did. */
static int env_local_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return -1;
}

static int env_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

/* This rank's backend: the topology's CUDA device, a GPU for every rank with
 * --backend cuda (node-local rank mod GPUs), else the CPU. */
static enum bt_status start_backend(struct bt_rank *r, const struct bt_rank_config *c, bool all_cuda) {
    const bool on_cuda = all_cuda || (r->have_topo && bt_topology_rank(&r->topo, r->rank)->backend == BT_TOPO_BACKEND_CUDA);
    if (on_cuda) {
        const int dev = r->have_topo ? bt_topology_rank(&r->topo, r->rank)->device
                                     : (env_local_rank() >= 0 ? env_local_rank() : r->t->local_rank);
        const int n_dev = bt_backend_reg_device_count("cuda");
        if (n_dev < 0) {
            if (r->have_topo)
                return rfail(r, BT_ERR_UNSUPPORTED, 1,
                             "%s: rank %d: backend cuda:%d: this build of baton has no CUDA backend", c->topology,
                             r->rank, dev);
            return rfail(r, BT_ERR_UNSUPPORTED, 1, "--backend cuda: rank %d: this build of baton has no CUDA backend",
                         r->rank);
        }
        if (r->have_topo && dev >= n_dev)
            return rfail(r, BT_ERR_UNSUPPORTED, 1, "%s: rank %d: backend cuda:%d: this process sees %d CUDA devices",
                         c->topology, r->rank, dev, n_dev);
        if (!r->have_topo && n_dev == 0)
            return rfail(r, BT_ERR_UNSUPPORTED, 1, "--backend cuda: rank %d: this process sees no CUDA device", r->rank);
        const int use = r->have_topo ? dev : dev % n_dev;
        char name[32], cerr[256];
        snprintf(name, sizeof name, "cuda:%d", use);
        r->backend = bt_backend_init_by_name(name, 0, cerr, sizeof cerr);
        if (!r->backend)
            return rfail(r, BT_ERR_UNSUPPORTED, 1, "rank %d: cannot start CUDA device %d: %s", r->rank, use, cerr);
        return BT_OK;
    }
    r->backend = bt_backend_init_by_name("cpu", r->threads, NULL, 0);
    if (!r->backend)
        return rfail(r, BT_ERR_NOMEM, 1, "rank %d: cannot start a CPU backend with %d threads", r->rank, r->threads);
    return BT_OK;
}

/* NCCL between CUDA ranks: with a topology, on its edges between two CUDA
 * ranks that ask for nccl; with --backend cuda, on every edge when no two
 * ranks of a node share a GPU (NCCL refuses that).  Edges without NCCL go
 * over MPI, staged through pinned host memory; rank 0's note says why when
 * NCCL was asked for or expected. */
static enum bt_status open_device_transport(struct bt_rank *r, bool all_cuda) {
    const int P = r->size;
    if (P < 2 || (!r->have_topo && !all_cuda)) return BT_OK;
    if (r->have_topo && !r->device_edges) return BT_OK;
#ifdef BATON_HAVE_NCCL
    bt_transport *t = r->t;
    if (!r->have_topo) {
        /* two ranks on one GPU (its UUID is the same in every process) */
        uint8_t mine[16] = {0}, *all = r->rank == 0 ? calloc((size_t)P, 16) : NULL;
        bt_backend_device_uuid(r->backend, mine);
        if (t->iface.gather(t, mine, 16, all, 0) != BT_OK) return rfail(r, BT_ERR_COMM, 1, "%s", t->error);
        int64_t shared = r->rank == 0 && !all;
        for (int a = 0; all && a < P && !shared; a++)
            for (int b = a + 1; b < P && !shared; b++) shared = memcmp(all + 16 * a, all + 16 * b, 16) == 0;
        free(all);
        if (t->iface.allreduce_max(t, &shared, 1) != BT_OK) return rfail(r, BT_ERR_COMM, 1, "%s", t->error);
        if (shared) {
            if (r->rank == 0)
                snprintf(r->note, sizeof r->note, "ranks share GPUs on a node (NCCL refuses that): GPU-to-GPU "
                                                  "transfers go over MPI, staged through pinned host memory");
            return BT_OK;
        }
    }
    int *cuda_ranks = malloc(sizeof(int) * (size_t)P), n_cuda = 0;
    char err[512] = "";
    enum bt_status st = cuda_ranks ? BT_OK : rfail(r, BT_ERR_NOMEM, 1, "rank %d: out of memory", r->rank);
    for (int a = 0; st == BT_OK && a < P; a++)
        if (!r->have_topo || bt_topology_rank(&r->topo, a)->backend == BT_TOPO_BACKEND_CUDA) cuda_ranks[n_cuda++] = a;
    if (st == BT_OK && (!r->have_topo || bt_topology_rank(&r->topo, r->rank)->backend == BT_TOPO_BACKEND_CUDA)) {
        r->device_t = bt_transport_nccl_init_ranks(t, bt_backend_stream(r->backend), cuda_ranks, n_cuda, err,
                                                   sizeof err);
        if (!r->device_t) st = rfail(r, BT_ERR_COMM, 1, "rank %d: NCCL: %s", r->rank, err);
    }
    free(cuda_ranks);
    return agree(r, st);
#else
    if (r->rank == 0)
        snprintf(r->note, sizeof r->note, "this build of baton has no NCCL: GPU-to-GPU transfers%s go over MPI, staged "
                                          "through host memory", r->have_topo ? " the topology asks NCCL for" : "");
    return BT_OK;
#endif
}

bool bt_rank_backend_topology_check(const char *backend, const char *topology, char *err, size_t n) {
    if (!backend || !topology || !*topology) return true;
    const char *env = getenv("BATON_TOPOLOGY");
    snprintf(err, n, "--backend %s and the topology %s%s: the topology names each rank's backend; give one or the other",
             backend, topology, env && topology == env ? " (from $BATON_TOPOLOGY)" : "");
    return false;
}

enum bt_status bt_rank_start(struct bt_rank *r, const struct bt_rank_config *c, bool failed, bool start_mpi_on_error,
                             int *argc, char ***argv) {
    char why[768];
    memset(r, 0, sizeof *r);
    r->exit_code = 1;
    const bool all_cuda = c->backend && strcmp(c->backend, "cuda") == 0;
    enum bt_status st = BT_OK;
    if (!failed && c->backend && strcmp(c->backend, "cpu") != 0 && !all_cuda)
        st = rfail(r, BT_ERR_INVALID, 2, "%s: --backend: '%s' is not cpu or cuda", c->prog, c->backend);
    else if (!failed && !bt_rank_backend_topology_check(c->backend, c->topology, why, sizeof why))
        st = rfail(r, BT_ERR_INVALID, 2, "%s: %s", c->prog, why);
    /* the topology before MPI: a bad file stops every rank at once */
    else if (!failed && c->topology && *c->topology) {
        if (bt_topology_load(c->topology, &r->topo, r->error, sizeof r->error) != BT_OK) {
            /* a file the command line does not show: say where its name came from */
            const char *env = getenv("BATON_TOPOLOGY");
            if (env && c->topology == env)
                strncat(r->error, " (from $BATON_TOPOLOGY)", sizeof r->error - strlen(r->error) - 1);
            st = BT_ERR_INVALID;
        } else {
            r->have_topo = true;
        }
    }
    if ((failed || st != BT_OK) && !start_mpi_on_error) return st;
    /* a CUDA rank's device is current before MPI starts (MPI may touch CUDA,
     * and would make a context on device 0 for every rank) */
    const int er = env_rank();
    if (r->have_topo && er < r->topo.n_ranks && bt_topology_rank(&r->topo, er)->backend == BT_TOPO_BACKEND_CUDA)
        bt_backend_reg_select_device("cuda", bt_topology_rank(&r->topo, er)->device);
    if (all_cuda && !failed) bt_backend_reg_select_device("cuda", env_local_rank());
    char terr[256];
    const enum bt_status tst = bt_transport_mpi_init(argc, argv, c->progress_us, &r->t, terr, sizeof terr);
    if (tst != BT_OK) return rfail(r, tst, 1, "%s: %s", c->prog, terr);
    r->rank = r->t->rank;
    r->size = r->t->size;
    return st;
}

enum bt_status bt_rank_setup(struct bt_rank *r, const struct bt_rank_config *c) {
    const bool all_cuda = c->backend && strcmp(c->backend, "cuda") == 0;
    r->exit_code = 1;
    /* everything up to the backend reads the same inputs on every rank: the
     * same verdict everywhere */
    if (r->have_topo && bt_topology_check_world(&r->topo, r->size, r->error, sizeof r->error) != BT_OK)
        return BT_ERR_INVALID;
    r->copies = c->copies > 0 ? c->copies : r->have_topo ? r->topo.pipeline.micro_batches : 2;
    if (r->copies > BT_SCHED_MAX_COPIES) r->copies = BT_SCHED_MAX_COPIES;
    r->threads = c->threads;
    if (r->threads == 0 && r->have_topo) r->threads = bt_topology_rank(&r->topo, r->rank)->threads;
    if (r->threads == 0) {
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        r->threads = (int)(cores / (r->t->local_size > 0 ? r->t->local_size : 1));
        if (r->threads < 1) r->threads = 1;
    }
    if (r->have_topo) {
        struct bt_plan_options popt;
        if (bt_topology_plan_options(&r->topo, &popt, &r->layer_counts, &r->pins, &r->groups, &r->device_edges) !=
            BT_OK)
            return rfail(r, BT_ERR_NOMEM, 1, "out of memory");
    }
    if (c->partition) { /* the command line overrides the topology's partition */
        free(r->layer_counts);
        r->layer_counts = NULL;
        if (strcmp(c->partition, "auto") != 0) {
            r->layer_counts = calloc((size_t)r->size, sizeof(int));
            if (!r->layer_counts) return rfail(r, BT_ERR_NOMEM, 1, "out of memory");
            char perr[300];
            if (!bt_partition_parse(c->partition, r->layer_counts, r->size, perr, sizeof perr))
                return rfail(r, BT_ERR_INVALID, 2, "%s", perr);
        }
    } else if (r->have_topo && !r->topo.pipeline.partition_auto && c->n_layers > 0 &&
               bt_topology_check_layers(&r->topo, c->n_layers, r->error, sizeof r->error) != BT_OK) {
        return BT_ERR_INVALID;
    }

    /* per rank from here: agreed on before the next collective */
    enum bt_status st = agree(r, start_backend(r, c, all_cuda));
    if (st == BT_OK) st = open_device_transport(r, all_cuda);
    if (st != BT_OK) return st;
    r->dist = (struct bt_dist_options){
        .n_copies = r->copies,
        .layers_per_rank = r->layer_counts,
        .pins = r->pins,
        .n_pins = r->have_topo && r->pins ? r->topo.pipeline.n_pins : 0,
        .groups = r->groups,
        .n_groups = r->groups ? r->topo.pipeline.n_groups : 0,
        .mem_limit = r->have_topo ? (int64_t)bt_topology_rank_memory(&r->topo, r->rank) : 0,
        .device_transport = r->device_t,
        .device_edges = r->device_edges,
    };
    r->exit_code = 0;
    return BT_OK;
}

enum bt_status bt_rank_init(struct bt_rank *r, const struct bt_rank_config *c, int *argc, char ***argv) {
    enum bt_status st = bt_rank_start(r, c, false, false, argc, argv);
    return st == BT_OK ? bt_rank_setup(r, c) : st;
}

void bt_rank_free(struct bt_rank *r) {
    if (r->device_t) r->device_t->iface.free(r->device_t);
    bt_backend_free(r->backend);
    BT_FREE_ALL(r->layer_counts, r->pins, r->groups, r->device_edges);
    if (r->have_topo) bt_topology_free(&r->topo);
    if (r->t) bt_transport_mpi_finalize(r->t);
    memset(r, 0, sizeof *r);
}
