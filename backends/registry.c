/* registry.c - the table of the backends this build holds (backend-reg.h):
 * the CPU always, CUDA where the build has it (BATON_HAVE_CUDA).  The one
 * file of baton that knows every backend, as ggml's ggml-backend-reg.cpp;
 * it goes into libbaton, and a CUDA build links libbaton_cuda after it. */
#include "baton/backend-reg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/cpu.h"
#ifdef BATON_HAVE_CUDA
#include "cuda/bt_cuda.h"
#endif

struct reg_entry {
    const char *name;
    int (*device_count)(void); /* NULL: one device, the host */
    int (*select_device)(int local_rank);     /* optional */
    bt_backend_t (*init)(int device, int n_threads, char *err, size_t n);
    bool (*is)(bt_backend_t backend);
    bool (*device_uuid)(bt_backend_t backend, uint8_t uuid[16]); /* optional */
    void *(*stream)(bt_backend_t backend);                      /* optional */
};

static void set_err(char *err, size_t n, const char *fmt, const char *a, const char *b) {
    if (err && n > 0) snprintf(err, n, fmt, a, b);
}

static bt_backend_t cpu_init(int device, int n_threads, char *err, size_t n) {
    (void)device;
    bt_backend_t b = bt_backend_cpu_init(n_threads);
    if (!b && err && n > 0) snprintf(err, n, "cannot start a CPU backend with %d threads", n_threads);
    return b;
}

#ifdef BATON_HAVE_CUDA
static bt_backend_t cuda_init(int device, int n_threads, char *err, size_t n) {
    (void)n_threads;
    char e[256] = "";
    bt_backend_t b = NULL;
    if (bt_backend_cuda_init(device, &b, e, sizeof e) != BT_OK) {
        if (err && n > 0) snprintf(err, n, "%s", e);
        return NULL;
    }
    return b;
}

static bool cuda_uuid(bt_backend_t backend, uint8_t uuid[16]) {
    return bt_cuda_device_uuid(bt_backend_cuda_device(backend), uuid);
}
#endif

static const struct reg_entry reg[] = {
    {
        /* .name          = */ "cpu",
        /* .device_count  = */ NULL,
        /* .select_device = */ NULL,
        /* .init          = */ cpu_init,
        /* .is            = */ bt_backend_is_cpu,
        /* .device_uuid   = */ NULL,
        /* .stream        = */ NULL,
    },
#ifdef BATON_HAVE_CUDA
    {
        /* .name          = */ "cuda",
        /* .device_count  = */ bt_cuda_device_count,
        /* .select_device = */ bt_cuda_select_device_from_local_rank,
        /* .init          = */ cuda_init,
        /* .is            = */ bt_backend_is_cuda,
        /* .device_uuid   = */ cuda_uuid,
        /* .stream        = */ bt_backend_cuda_stream,
    },
#endif
};
#define N_REG ((int)(sizeof reg / sizeof reg[0]))

/* the entry of "name" or "name:N" (*device N, else 0); NULL when none */
static const struct reg_entry *find(const char *name, int *device, bool *bad_device) {
    *device = 0;
    *bad_device = false;
    if (!name) return NULL;
    const char *colon = strchr(name, ':');
    const size_t len = colon ? (size_t)(colon - name) : strlen(name);
    for (int i = 0; i < N_REG; i++) {
        if (strlen(reg[i].name) != len || strncmp(reg[i].name, name, len) != 0) continue;
        if (colon) {
            char *end = NULL;
            const long d = strtol(colon + 1, &end, 10);
            *bad_device = !reg[i].device_count || end == colon + 1 || *end != '\0' || d < 0 || d > 1000000;
            *device = *bad_device ? 0 : (int)d;
        }
        return &reg[i];
    }
    return NULL;
}

int bt_backend_reg_count(void) { return N_REG; }

const char *bt_backend_reg_name(int i) { return i >= 0 && i < N_REG ? reg[i].name : NULL; }

int bt_backend_reg_device_count(const char *name) {
    int device;
    bool bad;
    const struct reg_entry *e = find(name, &device, &bad);
    if (!e) return -1;
    return e->device_count ? e->device_count() : 1;
}

int bt_backend_reg_select_device(const char *name, int local_rank) {
    int device;
    bool bad;
    const struct reg_entry *e = find(name, &device, &bad);
    return e && e->select_device ? e->select_device(local_rank) : -1;
}

bt_backend_t bt_backend_init_by_name(const char *name, int n_threads, char *err, size_t n) {
    int device;
    bool bad;
    const struct reg_entry *e = find(name, &device, &bad);
    if (!e) {
        char names[128] = "";
        for (int i = 0; i < N_REG; i++) {
            if (i > 0) strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, reg[i].name, sizeof names - strlen(names) - 1);
        }
        set_err(err, n, "unknown backend \"%s\" (this build has: %s)", name ? name : "", names);
        return NULL;
    }
    if (bad) {
        set_err(err, n, "backend \"%s\": %s", name,
                e->device_count ? "the device is not a number" : "this backend has no devices to choose");
        return NULL;
    }
    return e->init(device, n_threads, err, n);
}

bool bt_backend_is(bt_backend_t backend, const char *name) {
    int device;
    bool bad;
    const struct reg_entry *e = find(name, &device, &bad);
    return e && backend && e->is(backend);
}

static const struct reg_entry *entry_of(bt_backend_t backend) {
    for (int i = 0; backend && i < N_REG; i++)
        if (reg[i].is(backend)) return &reg[i];
    return NULL;
}

bool bt_backend_device_uuid(bt_backend_t backend, uint8_t uuid[16]) {
    const struct reg_entry *e = entry_of(backend);
    return e && e->device_uuid && e->device_uuid(backend, uuid);
}

void *bt_backend_stream(bt_backend_t backend) {
    const struct reg_entry *e = entry_of(backend);
    return e && e->stream ? e->stream(backend) : NULL;
}
