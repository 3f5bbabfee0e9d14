/* mpi_cuda_pipeline.c - the distributed pipeline with a CUDA backend on every
 * rank (device from the node-local rank; several ranks may share one GPU),
 * transfers staged through host memory over MPI.  Rank 0 writes the logits
 * of every micro-batch to a file, so that a run under `mpiexec -n 2` can be
 * compared byte for byte with `mpiexec -n 1` (tests/gpu/run.sh does).
 *
 *   mpi_cuda_pipeline OUT.bin [ffn-kind] [micro-batches] [n_copies] [nccl]
 * With "nccl", activations between ranks go over the NCCL transport (each
 * rank needs a GPU of its own: NCCL refuses two ranks on one, and the plan
 * then fails with that message on every rank).
 * Exit 77 (every rank) when a rank has no CUDA device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bt_cuda.h"
#ifdef BATON_HAVE_NCCL
#include "bt_nccl.h"
#endif
#include "dist.h"
#include "synth_model.h"
#include "transport.h"

static void init_weight(struct bt_tensor *w, void *user) { bt_model_init_weight(user, w); }

int main(int argc, char **argv) {
    /* the device first, before any other CUDA call (and before MPI, which
     * may touch CUDA): from the launcher's node-local rank */
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    const int dev_early = bt_cuda_select_device_from_local_rank(lr ? atoi(lr) : 0);
    bt_transport *T = NULL;
    char terr[256];
    if (bt_transport_mpi_init(&argc, &argv, 50, &T, terr, sizeof terr) != BT_OK) {
        fprintf(stderr, "mpi_cuda_pipeline: %s\n", terr);
        return 1;
    }
    if (argc < 2) {
        if (T->rank == 0) fprintf(stderr, "usage: %s OUT.bin [ffn-kind] [micro-batches] [n_copies] [nccl]\n", argv[0]);
        bt_transport_mpi_finalize(T);
        return 2;
    }
    int64_t no_dev = dev_early < 0;
    T->iface.allreduce_max(T, &no_dev, 1);
    if (no_dev) {
        if (T->rank == 0) printf("mpi_cuda_pipeline: skipped: no CUDA device\n");
        bt_transport_mpi_finalize(T);
        return 77;
    }
    const int dev = bt_cuda_select_device_from_local_rank(T->local_rank);
    bt_backend_t gpu = NULL;
    if (bt_backend_cuda_init(dev, &gpu, terr, sizeof terr) != BT_OK) {
        fprintf(stderr, "mpi_cuda_pipeline: rank %d: %s\n", T->rank, terr);
        T->iface.abort(T, 1);
    }

    struct bt_model_config cfg;
    bt_model_config_default(&cfg);
    if (argc > 2 && bt_ffn_kind_from_name(argv[2], &cfg.ffn) != BT_OK) {
        if (T->rank == 0) fprintf(stderr, "unknown ffn kind '%s'\n", argv[2]);
        T->iface.abort(T, 2);
    }
    const int M = argc > 3 ? atoi(argv[3]) : 6;
    struct bt_dist_options opt = {.n_copies = argc > 4 ? atoi(argv[4]) : 2};
    bt_transport *nccl = NULL;
    if (argc > 5 && strcmp(argv[5], "nccl") == 0) {
#ifdef BATON_HAVE_NCCL
        char err[512];
        nccl = bt_transport_nccl_init(T, bt_backend_cuda_stream(gpu), err, sizeof err);
        if (!nccl) {
            fprintf(stderr, "rank %d: %s\n", T->rank, err);
            T->iface.abort(T, 1);
        }
        opt.device_transport = nccl;
#else
        if (T->rank == 0) fprintf(stderr, "this build has no NCCL\n");
        T->iface.abort(T, 1);
#endif
    }
    struct bt_model *m = NULL;
    char merr[256];
    if (bt_model_new(&cfg, &m, merr, sizeof merr) != BT_OK) {
        fprintf(stderr, "mpi_cuda_pipeline: rank %d: model: %s\n", T->rank, merr);
        T->iface.abort(T, 1);
    }
    bt_context *ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&cfg), NULL, true});
    struct bt_model_graph g;
    if (!m || !ctx || bt_model_build_graph(m, ctx, &g) != BT_OK) T->iface.abort(T, 1);
    bt_dist *d = bt_dist_new(T, gpu, &opt);
    if (bt_dist_plan(d, g.graph, init_weight, m) != BT_OK) {
        if (T->rank == 0) fprintf(stderr, "plan: %s\n", bt_dist_error(d));
        bt_dist_free(d);
        if (nccl) nccl->iface.free(nccl);
        bt_transport_mpi_finalize(T);
        return 1;
    }
    if (T->rank == 0) bt_dist_print_plan(d, stdout);

    const size_t n_logits = (size_t)cfg.n_vocab * (size_t)cfg.n_tokens;
    float *all = calloc((size_t)M * n_logits, sizeof(float));
    int status = 0;
    for (int k = 0; k < M && status == 0; k++) {
        if (bt_model_set_inputs_with(m, &g, k, bt_dist_set_input_fn, d) != BT_OK) status = 1;
        if (bt_dist_submit(d) != BT_OK) status = 1;
        const int ready = k - (opt.n_copies - 1);
        if (status == 0 && ready >= 0 && T->rank == 0 &&
            bt_dist_get_output(d, ready, g.logits, all + (size_t)ready * n_logits, n_logits * sizeof(float)) != BT_OK)
            status = 1;
    }
    if (status == 0 && bt_dist_synchronize(d) != BT_OK) status = 1;
    if (status == 0 && T->rank == 0)
        for (int k = M - opt.n_copies + 1 > 0 ? M - opt.n_copies + 1 : 0; k < M; k++)
            if (bt_dist_get_output(d, k, g.logits, all + (size_t)k * n_logits, n_logits * sizeof(float)) != BT_OK)
                status = 1;
    if (status != 0) {
        fprintf(stderr, "rank %d: %s\n", T->rank, bt_dist_error(d));
        T->iface.abort(T, 1);
    }
    if (T->rank == 0) {
        FILE *f = fopen(argv[1], "wb");
        if (!f || fwrite(all, sizeof(float), (size_t)M * n_logits, f) != (size_t)M * n_logits || fclose(f) != 0) {
            fprintf(stderr, "cannot write %s\n", argv[1]);
            status = 1;
        } else {
            printf("mpi_cuda_pipeline: %d ranks, %s, %d micro-batches, n_copies %d: logits in %s\n", T->size,
                   bt_ffn_kind_name(cfg.ffn), M, opt.n_copies, argv[1]);
        }
    }
    free(all);
    bt_dist_free(d);
    if (nccl) nccl->iface.free(nccl);
    bt_free(ctx);
    bt_model_free(m);
    bt_backend_free(gpu);
    bt_transport_mpi_finalize(T);
    return status;
}
