/* cuda_impl.h - internal interface of the CUDA backend, shared by the
 * backend glue (cuda_backend.c, plain C), the op support rules (supports.c),
 * the element-wise / row kernels (ops.cu), the fused attention (attn.cu) and
 * the matrix products through cuBLAS (matmul.cu).  Not part of the public API. */
#ifndef BATON_CUDA_IMPL_H
#define BATON_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "baton/ops.h"
#include "backend-impl.h"
#include "bt_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scratch regions of one backend, each grown on demand (device memory,
 * reused in stream order from op to op). */
enum bt_cuda_scratch_slot {
    BT_CUDA_SCRATCH_A = 0, /* dequantised weights (F16) */
    BT_CUDA_SCRATCH_B,     /* activations converted to the weight type */
    BT_CUDA_SCRATCH_ID,    /* MUL_MAT_ID: gathered columns, results, pair list */
    BT_CUDA_SCRATCH_COUNT,
};

#define BT_CUDA_ERRBUF 256
#define BT_CUDA_CUBLAS_WORKSPACE ((size_t)32 << 20) /* cuBLAS's workspace (cuBLAS suggests 32 MiB on Hopper) */

/* One backend: a device, its stream, its cuBLAS handle and scratch. */
struct bt_cuda_ctx {
    int device;
    cudaStream_t stream;
    cublasHandle_t cublas;
    cudaEvent_t copy_event; /* orders cross-device copies between streams */

    void *scratch[BT_CUDA_SCRATCH_COUNT];
    size_t scratch_size[BT_CUDA_SCRATCH_COUNT];
    void *host_stage; /* pageable: MUL_MAT_ID ids and pairs */
    void *cublas_ws;  /* cuBLAS's workspace, BT_CUDA_CUBLAS_WORKSPACE bytes */
    size_t host_stage_size;

    /* run-time errors found by kernels (a row or expert id out of range):
     * d_err[0] = index of the failing node + 1 (first one wins), d_err[1] =
     * the bad id; h_err is its pinned host copy */
    int *d_err;
    int *h_err;
    bool ids_checked; /* a kernel that checks ids ran since the last check */

    char name[16];
    char error[BT_CUDA_ERRBUF];
};

/* Record a failure (first message kept until the next graph) and return s. */
enum bt_status bt_cuda_fail(struct bt_cuda_ctx *c, enum bt_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* BT_OK, or BT_ERR_INVALID with "what: <cuda message>" recorded. */
enum bt_status bt_cuda_check(struct bt_cuda_ctx *c, cudaError_t e, const char *what);

/* A scratch region of at least `bytes` (grown in stream order);
 * NULL with BT_ERR_NOMEM recorded when the device has no room. */
void *bt_cuda_scratch(struct bt_cuda_ctx *c, enum bt_cuda_scratch_slot slot, size_t bytes);
/* Host staging (pageable) of at least `bytes`; the stream must be idle (the
 * caller synchronised).  NULL with BT_ERR_NOMEM recorded on failure. */
void *bt_cuda_host_stage(struct bt_cuda_ctx *c, size_t bytes);

/* The table types' tables (quants.c's) into the current device's copies,
 * one per .cu file that reads blocks (cuda_common.cuh). */
cudaError_t bt_cuda_tables_upload_matmul(void);
cudaError_t bt_cuda_tables_upload_ops(void);
cudaError_t bt_cuda_tables_upload_attn(void);

/* support rules (supports.c) */
bool bt_cuda_op_supported(const struct bt_tensor *node);
#define BT_CUDA_ARGSORT_MAX 4096 /* longest row ARGSORT sorts (shared memory) */
#define BT_CUDA_ATTN_MAX_D 512    /* largest FLASH_ATTN head size (q/k and v rows held in registers) */

/* ops.cu: every op except MUL_MAT / MUL_MAT_ID, enqueued on c->stream;
 * node_index identifies the node in run-time error reports. */
enum bt_status bt_cuda_compute_op(struct bt_cuda_ctx *c, struct bt_tensor *node, int node_index);

/* attn.cu: FLASH_ATTN, one warp per (q head, query row) */
enum bt_status bt_cuda_flash_attn(struct bt_cuda_ctx *c, struct bt_tensor *dst);

/* matmul.cu */
enum bt_status bt_cuda_mul_mat(struct bt_cuda_ctx *c, struct bt_tensor *dst);
enum bt_status bt_cuda_mul_mat_id(struct bt_cuda_ctx *c, struct bt_tensor *dst);

#ifdef __cplusplus
}
#endif
#endif
