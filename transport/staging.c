/* staging.c - a tensor between a backend and a host buffer for a host
 * transport (see staging.h).  Nothing here knows CUDA: the backend's
 * asynchronous get/set (cudaMemcpyAsync on its stream for the CUDA backend,
 * a plain copy for the CPU) does the device side. */
#include "staging.h"

#include <stdio.h>
#include <string.h>

static enum bt_status check_host(const struct bt_tensor *x, bt_buffer_t host, size_t offset, char *err,
                                 size_t errlen) {
    const size_t n = bt_nbytes(x);
    if (!host || !bt_buffer_is_host(host)) {
        if (err && errlen) snprintf(err, errlen, "staging '%s': the staging buffer is not host memory", x->name);
        return BT_ERR_INVALID;
    }
    if (offset > bt_buffer_get_size(host) || n > bt_buffer_get_size(host) - offset) {
        if (err && errlen)
            snprintf(err, errlen, "staging '%s': %zu bytes at offset %zu exceed the %zu-byte staging buffer", x->name,
                     n, offset, bt_buffer_get_size(host));
        return BT_ERR_INVALID;
    }
    if (x->data == NULL) {
        if (err && errlen) snprintf(err, errlen, "staging '%s': the tensor has no data", x->name);
        return BT_ERR_INVALID;
    }
    return BT_OK;
}

static char *host_ptr(bt_buffer_t host, size_t offset) { return (char *)bt_buffer_get_base(host) + offset; }

enum bt_status bt_staging_to_host(bt_backend_t backend, const struct bt_tensor *x, bt_buffer_t host, size_t offset,
                                  char *err, size_t errlen) {
    const enum bt_status s = check_host(x, host, offset, err, errlen);
    if (s != BT_OK) return s;
    const size_t n = bt_nbytes(x);
    if (n == 0) return BT_OK;
    bt_backend_tensor_get_async(backend, x, host_ptr(host, offset), 0, n);
    bt_backend_synchronize(backend); /* the transport reads host next */
    return BT_OK;
}

enum bt_status bt_staging_from_host(bt_backend_t backend, struct bt_tensor *x, bt_buffer_t host, size_t offset,
                                    char *err, size_t errlen) {
    const enum bt_status s = check_host(x, host, offset, err, errlen);
    if (s != BT_OK) return s;
    const size_t n = bt_nbytes(x);
    if (n == 0) return BT_OK;
    bt_backend_tensor_set_async(backend, x, host_ptr(host, offset), 0, n);
    return BT_OK;
}

enum bt_status bt_staging_send(bt_transport *t, bt_backend_t backend, const struct bt_tensor *x, bt_buffer_t host,
                               size_t offset, int peer, int tag, bt_treq *req) {
    enum bt_status s = bt_staging_to_host(backend, x, host, offset, t->error, sizeof t->error);
    if (s != BT_OK) return s;
    return bt_transport_isend(t, host_ptr(host, offset), bt_nbytes(x), peer, tag, req);
}

enum bt_status bt_staging_recv_post(bt_transport *t, const struct bt_tensor *x, bt_buffer_t host, size_t offset,
                                    int peer, int tag, bt_treq *req) {
    const enum bt_status s = check_host(x, host, offset, t->error, sizeof t->error);
    if (s != BT_OK) return s;
    return bt_transport_irecv(t, host_ptr(host, offset), bt_nbytes(x), peer, tag, req);
}

enum bt_status bt_staging_recv_finish(bt_transport *t, bt_backend_t backend, struct bt_tensor *x, bt_buffer_t host,
                                      size_t offset, bt_treq *req) {
    enum bt_status s = bt_transport_wait(t, req);
    if (s != BT_OK) return s;
    return bt_staging_from_host(backend, x, host, offset, t->error, sizeof t->error);
}
