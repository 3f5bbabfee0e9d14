/* baton.h - the public API of libbaton: the one header a user includes, as
 * <baton/baton.h> (pkg-config and find_package(baton) put the folder that
 * holds baton/ on the include path).
 *
 *   tensor.h    types, tensors, contexts (arenas), status codes
 *   ops.h       op constructors (shape rules; nothing computed)
 *   graph.h     the static graph: nodes/leafs by post-order DFS, views, hash
 *   backend.h   backends, buffer types, buffers, events (opaque handles: their
 *               vtables are internal, backend-impl.h); the CPU backend
 *   alloc.h     the graph allocator
 *   bt_sched.h  the scheduler over several backends (splits, copies, ring)
 *   cpu.h       the CPU executor (thread pool, kernels)
 *
 * Errors: a call that can fail on a user's input returns an enum bt_status
 * (or NULL) and leaves its message in the object it was called on
 * (bt_context_error, bt_sched_error, bt_backend_error, bt_dist_error).
 * BT_ASSERT aborts only on a broken invariant inside baton.
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
#include "alloc.h"
#include "bt_sched.h"
#include "cpu.h"

#define BATON_VERSION "0.1.0"

#endif
