/* nccl.h - the NCCL transport: point-to-point transfers of device memory
 * between CUDA ranks (ncclSend / ncclRecv on the backend's CUDA stream),
 * with the control-plane collectives delegated to an MPI transport.
 *
 * Ranks and peers are MPI_COMM_WORLD ranks, as with the MPI transport.  The
 * communicator spans the CUDA ranks given at init (rank 0 of them creates the
 * ncclUniqueId and broadcasts it over MPI).
 *
 * Differences from MPI a caller must know:
 *  - NCCL has no tags: between two ranks, sends and receives match in the
 *    order they are posted.  The tag is recorded but not used for matching.
 *  - A transfer runs in stream order: a send posted after a graph_compute on
 *    the same stream sends the result, without a host synchronise.
 *  - A send and a receive that must proceed together (a rank sending to
 *    itself, or two ranks exchanging) must be posted inside one
 *    bt_transport_nccl_group_begin / _end pair, or the stream deadlocks.
 *  - A completed request is known by a cudaEvent recorded after the call:
 *    test = cudaEventQuery, wait = cudaEventSynchronize.  No cancel.
 */
#ifndef BATON_BT_NCCL_H
#define BATON_BT_NCCL_H

#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every rank of `mpi` calls this (it is collective over MPI): the NCCL
 * communicator spans all ranks, each on its current CUDA device, enqueuing
 * on cuda_stream (a cudaStream_t, e.g. bt_backend_cuda_stream(backend)).
 * NULL with a message in err on failure.  `mpi` is not owned. */
bt_transport *bt_transport_nccl_init(bt_transport *mpi, void *cuda_stream, char *err, size_t n);

/* As above over a subset: ranks[0..n_ranks) lists the CUDA ranks (world
 * ranks, ascending).  Every rank of `mpi` calls it; a rank not listed gets
 * NULL and err "" (not a member). */
bt_transport *bt_transport_nccl_init_ranks(bt_transport *mpi, void *cuda_stream, const int *ranks, int n_ranks,
                                           char *err, size_t n);

/* Post the sends and receives between these calls as one NCCL group.  The
 * bt_treq objects passed in between must stay valid until _end (each gets
 * its completion event there).  At most BT_NCCL_MAX_GROUP requests. */
#ifndef BT_TRANSPORT_MAX_RANKS_NCCL
#define BT_TRANSPORT_MAX_RANKS_NCCL 256
#endif
#ifndef BT_NCCL_MAX_GROUP
#define BT_NCCL_MAX_GROUP 256
#endif
enum bt_status bt_transport_nccl_group_begin(bt_transport *t);
enum bt_status bt_transport_nccl_group_end(bt_transport *t);

#ifdef __cplusplus
}
#endif
#endif
