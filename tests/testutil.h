/* testutil.h - helpers shared by the Check tests: a deterministic RNG,
 * filling and reading tensors of any type and layout in logical order
 * (i0 fastest), NMSE, and building + computing a graph on the CPU backend.
 *
 * Everything here reads and writes tensor data through its own stride
 * arithmetic (data + i0*nb0 + i1*nb1 + ...), not through the element
 * accessors under test, so a wrong stride in baton shows up as a wrong value.
 */
#ifndef BATON_TESTUTIL_H
#define BATON_TESTUTIL_H

#include <check.h>
#include <stdint.h>

#include "baton/cpu.h"
#include "baton/graph.h"
#include "baton/ops.h"
#include "baton/tensor.h"

/* ---- RNG: splitmix64, one stream per test (seed it with a test-specific
 * constant so a failure reproduces) ---- */
typedef struct {
    uint64_t s;
} tu_rng;

void tu_rng_init(tu_rng *r, uint64_t seed);
uint64_t tu_rng_u64(tu_rng *r);
float tu_rng_f32(tu_rng *r, float lo, float hi); /* uniform in [lo, hi) */
int64_t tu_rng_int(tu_rng *r, int64_t n);         /* uniform in [0, n) */

/* ---- tensor data ---- */
/* Host address of t's data (a view's data resolved through view_src when the
 * constructor left data NULL). */
void *tu_data(const struct bt_tensor *t);
/* Byte offset of logical element (i0..i3). */
size_t tu_offset(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);

/* Fill t with uniform values in [lo, hi) honouring its strides and type.
 * Block types: rows are quantised from uniform values (nb[0] == block bytes
 * required).  I32: uniform integers in [lo, hi). */
void tu_fill_uniform(struct bt_tensor *t, tu_rng *r, float lo, float hi);
static inline void tu_fill(struct bt_tensor *t, tu_rng *r) { tu_fill_uniform(t, r, -1.0f, 1.0f); }
/* I32 ids uniform in [0, n). */
void tu_fill_ids(struct bt_tensor *t, tu_rng *r, int32_t n);
/* Write nelements(t) values (logical order) into t, converting to its type. */
void tu_write_f32(struct bt_tensor *t, const float *v);
/* Read t into a malloc'd dense float array in logical order (block types are
 * dequantised a row at a time with bt_row_to_f32; I32 converted by value). */
float *tu_read_f32(const struct bt_tensor *t);
/* Read an I32 tensor into a malloc'd dense array in logical order. */
int32_t *tu_read_i32(const struct bt_tensor *t);

/* sum (a-ref)^2 / sum ref^2 (0 when both are all zero); NaN anywhere gives
 * INFINITY so a bound check fails. */
double tu_nmse(const float *a, const float *ref, int64_t n);
/* NMSE between tensor t (read as above) and a dense reference. */
double tu_nmse_tensor(const struct bt_tensor *t, const float *ref);

/* ---- contexts, graphs, compute ---- */
bt_context *tu_ctx(size_t mem_mb);
/* A CPU executor with n threads, created once per process and kept. */
bt_cpu *tu_cpu(int n_threads);
/* A graph in ctx holding outs[0..n) (asserts the build succeeded). */
struct bt_graph *tu_graph(bt_context *ctx, struct bt_tensor **outs, int n);
/* stderr into a temporary file from tu_stderr_begin until tu_stderr_end,
 * which puts it back and returns the bytes written meanwhile ("nothing
 * printed" checks). */
struct tu_stderr {
    char path[64];
    int fd, saved;
};
void tu_stderr_begin(struct tu_stderr *c);
long tu_stderr_end(struct tu_stderr *c);

/* Run a suite (Check's default fork mode) and return the process exit code. */
int tu_run_suite(Suite *s);

/* Compute g with n threads; returns the status (message: tu_cpu(n) error). */
enum bt_status tu_run(struct bt_graph *g, int n_threads);
/* Build a graph for one output and compute it, asserting BT_OK. */
void tu_compute(bt_context *ctx, struct bt_tensor *out, int n_threads);

/* Assert a constructor result is non-NULL, printing the context error. */
#define TU_OK(ctx, t)                                                                     \
    ck_assert_msg((t) != NULL, "%s returned NULL: %s", #t, bt_context_error(ctx))

#endif
