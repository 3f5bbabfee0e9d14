/* baton.h - the public API of libbaton: the one header a user includes.
 *
 *   tensor.h  types, tensors, contexts (arenas), status codes
 *   ops.h     op constructors (shape rules; nothing computed)
 *   graph.h   the static graph: nodes/leafs by post-order DFS, views, hash
 *   cpu.h     the CPU executor (thread pool, kernels)
 */
#ifndef BATON_H
#define BATON_H

#include "tensor.h"
#include "ops.h"
#include "graph.h"
#include "cpu.h"
#include "backend.h"

#define BATON_VERSION "0.1.0"

#endif
