/* cuda.h - the CUDA backend: one GPU, one stream, cuBLAS for matrix
 * products, a kernel per op of ops.h; device buffers (cudaMalloc) and pinned
 * host buffers (cudaMallocHost) behind the buffer-type interface of
 * backend.h.  Tensor data pointers in a device buffer are device pointers
 * (the buffer's base from cudaMalloc plus offsets), as the CPU's are host
 * pointers.
 *
 * Every function here is safe on a machine without a GPU or without a
 * driver: bt_cuda_device_count() is then 0 and bt_backend_cuda_init()
 * BT_ERR_UNSUPPORTED.
 */
#ifndef BATON_BT_CUDA_H
#define BATON_BT_CUDA_H

#include "baton/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef BT_CUDA_MAX_DEVICES
#define BT_CUDA_MAX_DEVICES 16
#endif

/* Number of usable CUDA devices; 0 when there is none or no driver (the
 * failure is cleared, nothing aborts). */
int bt_cuda_device_count(void);

/* The device for a rank from its node-local index (local_rank % count), made
 * current.  Call it before any other CUDA call of the process so that the
 * primary context is created on that device.  -1 when there is no device. */
int bt_cuda_select_device_from_local_rank(int local_rank);

/* A backend on `device` with its own stream and cuBLAS handle in *out: BT_OK;
 * else *out NULL and BT_ERR_UNSUPPORTED (the device does not exist or cannot
 * start: CUDA's or cuBLAS's reason) or BT_ERR_NOMEM, with the message in err
 * (n_err bytes; nothing printed: baton.h's error convention). */
enum bt_status bt_backend_cuda_init(int device, bt_backend_t *out, char *err, size_t n_err);
bool bt_backend_is_cuda(bt_backend_t backend);
/* The device of a CUDA backend. */
int bt_backend_cuda_device(bt_backend_t backend);
/* The backend's cudaStream_t (as void *, so C callers need no CUDA header):
 * for transports that enqueue on it (transport/nccl.c). */
void *bt_backend_cuda_stream(bt_backend_t backend);

/* The device's UUID (16 bytes, the same in every process that sees it):
 * false when the device does not exist. */
bool bt_cuda_device_uuid(int device, uint8_t uuid[16]);

/* Device memory of `device` (NULL for a device out of range). */
bt_buffer_type_t bt_cuda_buffer_type(int device);
/* Pinned (page-locked) host memory: is_host, so the CPU backend can compute
 * on it, and copies between it and a device run asynchronously. */
bt_buffer_type_t bt_cuda_host_buffer_type(void);
/* Is this buffer in device memory of some CUDA device? */
bool bt_buffer_is_cuda(bt_buffer_t buffer);

#ifdef __cplusplus
}
#endif
#endif
