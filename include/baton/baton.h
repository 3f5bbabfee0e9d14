/* baton.h - the public API of libbaton: the one header a user includes, as
 * <baton/baton.h> (pkg-config and find_package(baton) put the folder that
 * holds baton/ on the include path).
 *
 *   tensor.h    types, tensors, contexts (arenas), status codes
 *   ops.h       op constructors (shape rules; nothing computed)
 *   graph.h     the static graph: nodes/leafs by post-order DFS, views, hash
 *   backend.h   backends, buffer types, buffers, events (opaque handles: their
 *               vtables are internal, backend-impl.h)
 *   backend-reg.h  backends by name ("cpu", "cuda", "cuda:N") and the list of
 *               those this build holds
 *   alloc.h     the graph allocator
 *   sched.h     the scheduler over several backends (splits, copies, ring)
 *   cpu.h       the CPU backend's own header (backends/cpu/: bt_backend_cpu_init,
 *               its profile, the executor, repacked weights), offered here
 *               for a user's convenience as ggml's umbrella header offers
 *               ggml-cpu.h; the core does not include it
 *
 * Errors, one convention: a call on an object that can fail on a user's
 * input returns an enum bt_status (or NULL) and leaves its message in that
 * object (bt_context_error, bt_sched_error, bt_backend_error,
 * bt_gallocr_error, bt_dist_error); a constructor, which has no object yet
 * to hold it, returns the status and writes the message into the caller's
 * buffer (err, n_err: bt_sched_new, bt_model_new, bt_transport_mpi_init,
 * bt_backend_cuda_init; bt_error_printf writes it), and the caller prints
 * it once.  Errors are not printed.  The one exception is a warning, not an
 * error: bt_transport_mpi_init says on rank 0's stderr when the run goes on
 * without the watchdog or the progress thread (no MPI_THREAD_MULTIPLE, or
 * the watchdog thread did not start), which
 * the user must see (transport.h).  A device's failure inside a call that
 * returns nothing (a copy whose cudaMemcpy fails) is kept on the device and
 * returned by its next graph computation (cuda_backend.c).  Two aborts only,
 * each after writing its reason to stderr: BT_ASSERT on a broken invariant
 * inside baton, and a failure in the middle of the distributed pipeline,
 * which must stop every rank (dist.h says which; the engine's ranks out of
 * step with rank 0, and the watchdog's peer silent past its limit, are such
 * failures).
 *
 * The core library (libbaton) needs neither MPI nor libyaml; the
 * distributed runtime's transports and topology files are libbaton_mpi and
 * libbaton_topology.
 */
#ifndef BATON_H
#define BATON_H

#include "tensor.h"
#include "ops.h"
#include "graph.h"
#include "backend.h"
#include "backend-reg.h"
#include "alloc.h"
#include "sched.h"
#include "cpu.h"

#define BATON_VERSION "0.1.0"

#endif
