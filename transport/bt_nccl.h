/* bt_nccl.h - the NCCL transport: point-to-point transfers of device memory
 * between CUDA ranks, with the control-plane collectives delegated to an MPI
 * transport.  Ranks and peers are MPI_COMM_WORLD ranks, as with MPI.
 *
 * Channels.  Each direction between two ranks is an edge of its own: a
 * two-rank NCCL communicator with its own CUDA stream, opened by connect
 * (bt_transport_connect), which every CUDA rank calls with the same edge list
 * in the same order (src/dist.c does, at plan time).  A transfer on an edge
 * never waits behind another edge's, so receives posted ahead (the n_copies
 * ring) block nothing else.  A rank's transfers to itself use a one-rank
 * communicator.  Two ranks on one GPU cannot share an edge: NCCL refuses it.
 *
 * Differences from MPI a caller must know:
 *  - No tags: on an edge, sends and receives match in the order they are
 *    posted.  The tag is recorded but not used for matching.
 *  - Stream order: a post is queued after everything already queued on the
 *    backend's stream (cuda_stream at init), so a send posted after a
 *    graph_compute sends its result and a receive into a slot waits for the
 *    compute that read the slot, without a host synchronise.
 *  - A send and a receive to itself must be posted inside one
 *    bt_transport_nccl_group_begin / _end pair.
 *  - Completion is a cudaEvent recorded after the call: test polls it (and
 *    the communicator, so a dead peer is an error, not a hang).  No cancel.
 */
#ifndef BATON_BT_NCCL_H
#define BATON_BT_NCCL_H

#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* This rank's NCCL transport, every rank of `mpi` being a CUDA rank; its
 * device is the current one, its posts ordered after cuda_stream (a
 * cudaStream_t, e.g. bt_backend_cuda_stream(backend)).  Not collective: it
 * opens only the one-rank communicator; connect opens the edges.  NULL with a
 * message in err on failure.  `mpi` is not owned and must outlive it. */
bt_transport *bt_transport_nccl_init(bt_transport *mpi, void *cuda_stream, char *err, size_t n);

/* As above where ranks[0..n_ranks) (world ranks, ascending) are the CUDA
 * ranks: a rank not listed gets NULL and err "" (not a member). */
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
