/* test_staging.c - transport/staging.c on the CPU backend, where every step
 * is a plain copy: a tensor to a host staging buffer and back, a send and
 * receive through a one-rank loopback transport (bitwise equal), and the
 * errors a caller sees for a buffer that is not host memory or too small. */
#include <string.h>

#include "backend-impl.h"
#include "staging.h"
#include "testutil.h"

/* ---- a one-rank loopback transport: a send lands in the posted receive ---- */

struct loop {
    void *recv_buf;
    size_t recv_bytes;
    int recv_tag;
    bt_treq *recv_req;
};

static const char *loop_name(bt_transport *t) {
    (void)t;
    return "loop";
}
static enum bt_status loop_irecv(bt_transport *t, void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    struct loop *l = t->context;
    ck_assert_int_eq(peer, 0);
    l->recv_buf = buf;
    l->recv_bytes = bytes;
    l->recv_tag = tag;
    l->recv_req = req;
    *req = (bt_treq){.active = true, .is_recv = true, .bytes = bytes, .peer = peer, .tag = tag};
    return BT_OK;
}
static enum bt_status loop_isend(bt_transport *t, const void *buf, size_t bytes, int peer, int tag, bt_treq *req) {
    struct loop *l = t->context;
    ck_assert_int_eq(peer, 0);
    if (!l->recv_req || l->recv_tag != tag || l->recv_bytes != bytes) {
        snprintf(t->error, sizeof t->error, "no matching receive");
        return BT_ERR_COMM;
    }
    memcpy(l->recv_buf, buf, bytes);
    l->recv_req->active = false;
    l->recv_req = NULL;
    *req = (bt_treq){.active = false, .bytes = bytes, .peer = peer, .tag = tag};
    return BT_OK;
}
static enum bt_status loop_test(bt_transport *t, bt_treq *req, bool *done) {
    (void)t;
    *done = !req->active;
    return BT_OK;
}
static enum bt_status loop_wait(bt_transport *t, bt_treq *req) {
    (void)t;
    return req->active ? BT_ERR_COMM : BT_OK; /* never completes: a test bug */
}

static const struct bt_transport_i loop_i = {
    /* .name          = */ loop_name,
    /* .isend         = */ loop_isend,
    /* .irecv         = */ loop_irecv,
    /* .test          = */ loop_test,
    /* .wait          = */ loop_wait,
    /* .cancel        = */ NULL,
    /* .set_busy      = */ NULL,
    /* .bcast         = */ NULL,
    /* .gather        = */ NULL,
    /* .allreduce_max = */ NULL,
    /* .barrier       = */ NULL,
    /* .abort         = */ NULL,
    /* .free          = */ NULL,
    /* .connect       = */ NULL,
};

/* ---- fixtures ---- */

struct fx {
    bt_backend_t cpu;
    bt_context *ctx;
    bt_buffer_t buf, host;
    struct bt_tensor *x, *y, *xt;
};

static void fx_init(struct fx *f) {
    memset(f, 0, sizeof *f);
    f->cpu = bt_backend_cpu_init(1);
    ck_assert_ptr_nonnull(f->cpu);
    f->ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
    ck_assert_ptr_nonnull(f->ctx);
    f->x = bt_set_name(bt_new_tensor_2d(f->ctx, BT_TYPE_F32, 37, 5), "x");
    f->y = bt_set_name(bt_new_tensor_2d(f->ctx, BT_TYPE_F32, 37, 5), "y");
    f->xt = bt_set_name(bt_transpose(f->ctx, f->x), "xt"); /* a view, not contiguous */
    TU_OK(f->ctx, f->xt);
    f->buf = bt_alloc_ctx_tensors(f->ctx, f->cpu);
    ck_assert_ptr_nonnull(f->buf);
    f->host = bt_buft_alloc_buffer(bt_cpu_buffer_type(), 4096);
    ck_assert_ptr_nonnull(f->host);
    tu_rng r;
    tu_rng_init(&r, 77);
    tu_fill(f->x, &r);
    memset(f->y->data, 0, bt_nbytes(f->y));
}

static void fx_free(struct fx *f) {
    bt_buffer_free(f->host);
    bt_buffer_free(f->buf);
    bt_free(f->ctx);
    bt_backend_free(f->cpu);
}

START_TEST(test_round_trip) {
    struct fx f;
    fx_init(&f);
    char err[256] = "";
    const size_t off = 128, n = bt_nbytes(f.x);
    ck_assert_int_eq(bt_staging_to_host(f.cpu, f.x, f.host, off, err, sizeof err), BT_OK);
    ck_assert_int_eq(memcmp((char *)bt_buffer_get_base(f.host) + off, f.x->data, n), 0);
    ck_assert_int_eq(bt_staging_from_host(f.cpu, f.y, f.host, off, err, sizeof err), BT_OK);
    bt_backend_synchronize(f.cpu);
    ck_assert_int_eq(memcmp(f.y->data, f.x->data, n), 0);
    /* a view stages the span of its strides: the same bytes as its source */
    ck_assert_int_eq(bt_staging_to_host(f.cpu, f.xt, f.host, 0, err, sizeof err), BT_OK);
    ck_assert_int_eq(memcmp(bt_buffer_get_base(f.host), f.x->data, bt_nbytes(f.xt)), 0);
    fx_free(&f);
}
END_TEST

START_TEST(test_send_recv_loopback) {
    struct fx f;
    fx_init(&f);
    struct loop l = {0};
    bt_transport t = {.iface = loop_i, .context = &l, .rank = 0, .size = 1, .local_rank = 0, .local_size = 1};
    bt_buffer_t rhost = bt_buft_alloc_buffer(bt_cpu_buffer_type(), 4096);
    ck_assert_ptr_nonnull(rhost);
    bt_treq rr, sr;
    memset(&rr, 0, sizeof rr);
    memset(&sr, 0, sizeof sr);
    ck_assert_int_eq(bt_staging_recv_post(&t, f.y, rhost, 64, 0, 7, &rr), BT_OK);
    ck_assert(rr.active);
    ck_assert_int_eq(bt_staging_send(&t, f.cpu, f.x, f.host, 0, 0, 7, &sr), BT_OK);
    ck_assert_msg(bt_staging_recv_finish(&t, f.cpu, f.y, rhost, 64, &rr) == BT_OK, "%s", t.error);
    ck_assert_int_eq(bt_transport_wait(&t, &sr), BT_OK);
    bt_backend_synchronize(f.cpu);
    ck_assert_int_eq(memcmp(f.y->data, f.x->data, bt_nbytes(f.x)), 0); /* bitwise */
    bt_buffer_free(rhost);
    fx_free(&f);
}
END_TEST

/* a buffer type that is not host memory, over plain memory */
static const char *dev_name(bt_buffer_type_t b) {
    (void)b;
    return "FAKEDEV";
}
static size_t dev_align(bt_buffer_type_t b) {
    (void)b;
    return 64;
}
static struct bt_buffer_type fake_dev = {
    .iface = {dev_name, NULL, dev_align, NULL, NULL, NULL},
    .context = NULL,
};

START_TEST(test_errors) {
    struct fx f;
    fx_init(&f);
    char err[256] = "";
    const size_t n = bt_nbytes(f.x);
    /* too small: the message names the tensor and the sizes */
    ck_assert_int_eq(bt_staging_to_host(f.cpu, f.x, f.host, 4096 - n + 1, err, sizeof err), BT_ERR_INVALID);
    ck_assert_msg(strstr(err, "'x'") && strstr(err, "exceed") && strstr(err, "4096-byte"), "%s", err);
    ck_assert_int_eq(bt_staging_from_host(f.cpu, f.y, f.host, SIZE_MAX, err, sizeof err), BT_ERR_INVALID);
    /* not host memory */
    static char mem[4096];
    bt_buffer_t dev = bt_host_buffer_new(&fake_dev, mem, sizeof mem, false);
    ck_assert_ptr_nonnull(dev);
    err[0] = '\0';
    ck_assert_int_eq(bt_staging_to_host(f.cpu, f.x, dev, 0, err, sizeof err), BT_ERR_INVALID);
    ck_assert_msg(strstr(err, "not host memory") != NULL, "%s", err);
    /* through a transport: the message lands in t->error, nothing is posted */
    struct loop l = {0};
    bt_transport t = {.iface = loop_i, .context = &l, .size = 1, .local_size = 1};
    bt_treq rr;
    memset(&rr, 0, sizeof rr);
    ck_assert_int_eq(bt_staging_recv_post(&t, f.y, dev, 0, 0, 1, &rr), BT_ERR_INVALID);
    ck_assert(!rr.active);
    ck_assert_msg(strstr(t.error, "not host memory") != NULL, "%s", t.error);
    bt_buffer_free(dev);
    fx_free(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("staging");
    TCase *tc = tcase_create("cpu");
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_send_recv_loopback);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
