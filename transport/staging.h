/* staging.h - moving a tensor between a backend's memory and a host buffer
 * that a host transport (MPI) can send from or receive into: the edge
 * between a CPU rank and a CUDA rank goes device -> pinned host -> MPI ->
 * (pinned) host -> device.  With a backend whose tensors are in host memory
 * (the CPU) each step is a plain copy.
 *
 * The host side is a region [offset, offset + bt_nbytes(tensor)) of a buffer
 * of a host buffer type (bt_cuda_host_buffer_type() for pinned memory, so the
 * GPU's copies run asynchronously; any is_host buffer works).
 *
 *   sender:   bt_staging_send(t, backend, x, host, off, peer, tag, &req)
 *             ... bt_transport_wait(t, &req) before host is reused
 *   receiver: bt_staging_recv_post(t, x, host, off, peer, tag, &req)
 *             ... bt_staging_recv_finish(t, backend, x, host, off, &req)
 *             ... bt_backend_synchronize(backend) (or an event) before the
 *                 host region is reused; computing on x in the backend's
 *                 stream is ordered after the copy already.
 */
#ifndef BATON_STAGING_H
#define BATON_STAGING_H

#include "baton/backend.h"
#include "transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copy x's bytes (bt_nbytes) into host at offset and wait until they are
 * there.  BT_ERR_INVALID with a message in err when host is not host memory
 * or too small. */
enum bt_status bt_staging_to_host(bt_backend_t backend, const struct bt_tensor *x, bt_buffer_t host, size_t offset,
                                  char *err, size_t errlen);
/* Copy host at offset into x, in the backend's stream order (asynchronous on
 * a backend with streams: synchronise before overwriting host). */
enum bt_status bt_staging_from_host(bt_backend_t backend, struct bt_tensor *x, bt_buffer_t host, size_t offset,
                                    char *err, size_t errlen);

/* Stage x to host, then post its send to peer; the transport's message is
 * in t->error on failure. */
enum bt_status bt_staging_send(bt_transport *t, bt_backend_t backend, const struct bt_tensor *x, bt_buffer_t host,
                               size_t offset, int peer, int tag, bt_treq *req);
/* Post the receive of x's bytes into host at offset. */
enum bt_status bt_staging_recv_post(bt_transport *t, const struct bt_tensor *x, bt_buffer_t host, size_t offset,
                                    int peer, int tag, bt_treq *req);
/* Wait for the receive, then copy host into x (asynchronously, in the
 * backend's stream order). */
enum bt_status bt_staging_recv_finish(bt_transport *t, bt_backend_t backend, struct bt_tensor *x, bt_buffer_t host,
                                      size_t offset, bt_treq *req);

#ifdef __cplusplus
}
#endif
#endif
