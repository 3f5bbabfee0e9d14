/* backend-reg.h - the backends this build holds, by name (as ggml's
 * backend registry): start one from a name ("cpu", "cuda", "cuda:N"), list
 * them, and the few calls on a backend that belong to its kind rather than
 * to the backend interface (a GPU's device and stream, made current before
 * MPI starts).  The table that knows each compiled-in backend lives with the
 * backends (backends/registry.c); the core reaches a backend only through
 * these calls and backend.h, and includes no backend's header. */
#ifndef BATON_BACKEND_REG_H
#define BATON_BACKEND_REG_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backends compiled in: how many, and the name of backend i ("cpu"
 * first; "cuda" in a CUDA build). */
BT_API int bt_backend_reg_count(void);
BT_API const char *bt_backend_reg_name(int i);
/* Devices of the named backend this process sees: the CPU 1, a GPU backend
 * its devices (0 without a device or a driver); -1 when the build has no
 * backend of that name. */
BT_API int bt_backend_reg_device_count(const char *name);
/* A GPU backend: make the device for node-local rank local_rank (its index
 * modulo the devices) current before anything else starts the GPU's
 * runtime; returns the device, or -1 (no device, or a backend without
 * devices). */
BT_API int bt_backend_reg_select_device(const char *name, int local_rank);

/* A backend from its name: "cpu" (n_threads: <= 0 every online core),
 * "cuda" (device 0) or "cuda:N" (device N).  NULL with the reason in err
 * (n bytes; err may be NULL): a name this build does not hold, a device
 * that is not there, memory or threads that cannot be had. */
BT_API bt_backend_t bt_backend_init_by_name(const char *name, int n_threads, char *err, size_t n);
/* Is backend one of the named backend's ("cpu", "cuda")? */
BT_API bool bt_backend_is(bt_backend_t backend, const char *name);
/* A GPU backend's device UUID (16 bytes, the same in every process that
 * sees the device): false for a backend without one. */
BT_API bool bt_backend_device_uuid(bt_backend_t backend, uint8_t uuid[16]);
/* A GPU backend's stream (cudaStream_t as void *) for a transport that
 * enqueues on it; NULL for a backend without one. */
BT_API void *bt_backend_stream(bt_backend_t backend);

#ifdef __cplusplus
}
#endif
#endif
