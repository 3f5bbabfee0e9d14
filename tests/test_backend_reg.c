/* test_backend_reg.c - backends by name (backend-reg.h, backends/registry.c)
 * and the backend-neutral calls that replaced the CPU's own in the core:
 * the node hook (bt_backend_set_node_hook) and the description of a log
 * line (bt_backend_describe), on the CPU backend and on a backend without
 * them (the test backend "cpu-limited"). */
#include <string.h>

#include "baton/backend-reg.h"
#include "backend_limited.h"
#include "baton/cpu.h"
#include "testutil.h"

START_TEST(test_list) {
    const int n = bt_backend_reg_count();
    ck_assert_int_ge(n, 1);
    ck_assert_str_eq(bt_backend_reg_name(0), "cpu");
    ck_assert_ptr_null(bt_backend_reg_name(n));
    ck_assert_ptr_null(bt_backend_reg_name(-1));
    bool cuda = false;
    for (int i = 0; i < n; i++) cuda |= strcmp(bt_backend_reg_name(i), "cuda") == 0;
#ifdef BATON_HAVE_CUDA
    ck_assert(cuda);
    ck_assert_int_ge(bt_backend_reg_device_count("cuda"), 0);
#else
    ck_assert(!cuda);
    ck_assert_int_eq(bt_backend_reg_device_count("cuda"), -1);
    ck_assert_int_eq(bt_backend_reg_select_device("cuda", 0), -1);
#endif
    ck_assert_int_eq(bt_backend_reg_device_count("cpu"), 1);
    ck_assert_int_eq(bt_backend_reg_device_count("tpu"), -1);
    ck_assert_int_eq(bt_backend_reg_select_device("cpu", 0), -1);
}
END_TEST

START_TEST(test_cpu_by_name) {
    char err[256] = "";
    bt_backend_t b = bt_backend_init_by_name("cpu", 2, err, sizeof err);
    ck_assert_msg(b != NULL, "%s", err);
    ck_assert(bt_backend_is_cpu(b));
    ck_assert(bt_backend_is(b, "cpu"));
    ck_assert(!bt_backend_is(b, "cuda"));
    ck_assert(!bt_backend_is(b, "tpu"));
    ck_assert_str_eq(bt_backend_name(b), "CPU");
    uint8_t uuid[16];
    ck_assert(!bt_backend_device_uuid(b, uuid));
    ck_assert_ptr_null(bt_backend_stream(b));
    bt_backend_free(b);
}
END_TEST

/* every name a user may get wrong, with its message */
START_TEST(test_bad_names) {
    char err[256] = "";
    ck_assert_ptr_null(bt_backend_init_by_name("tpu", 1, err, sizeof err));
#ifdef BATON_HAVE_CUDA
    ck_assert_str_eq(err, "unknown backend \"tpu\" (this build has: cpu, cuda)");
#else
    ck_assert_str_eq(err, "unknown backend \"tpu\" (this build has: cpu)");
#endif
    ck_assert_ptr_null(bt_backend_init_by_name("cpux", 1, err, sizeof err));
    ck_assert(strncmp(err, "unknown backend \"cpux\"", 22) == 0);
    ck_assert_ptr_null(bt_backend_init_by_name("cpu:0", 1, err, sizeof err));
    ck_assert_str_eq(err, "backend \"cpu:0\": this backend has no devices to choose");
    ck_assert_ptr_null(bt_backend_init_by_name(NULL, 1, err, sizeof err));
    ck_assert_str_eq(strstr(err, "unknown backend \"\"") == err ? "ok" : err, "ok");
    ck_assert_ptr_null(bt_backend_init_by_name("tpu", 1, NULL, 0)); /* no room for a message: none written */
#ifdef BATON_HAVE_CUDA
    ck_assert_ptr_null(bt_backend_init_by_name("cuda:x", 1, err, sizeof err));
    ck_assert_str_eq(err, "backend \"cuda:x\": the device is not a number");
    ck_assert_ptr_null(bt_backend_init_by_name("cuda:-1", 1, err, sizeof err));
    ck_assert_str_eq(err, "backend \"cuda:-1\": the device is not a number");
    if (bt_backend_reg_device_count("cuda") == 0) {
        /* no GPU here: CUDA's own reason */
        err[0] = '\0';
        ck_assert_ptr_null(bt_backend_init_by_name("cuda", 1, err, sizeof err));
        ck_assert(err[0] != '\0');
    }
#endif
}
END_TEST

static void count_node(void *user) { ++*(int *)user; }

/* y = relu(x * 2) + x: 3 computed nodes, each followed by the hook once on
 * the calling thread */
static int hooked_nodes(bt_backend_t b, bool hook) {
    bt_context *ctx = bt_init((struct bt_init_params){16 * bt_tensor_overhead() + bt_graph_overhead(16), NULL, true});
    struct bt_tensor *x = bt_new_tensor_1d(ctx, BT_TYPE_F32, 64);
    struct bt_tensor *y = bt_add(ctx, bt_relu(ctx, bt_scale(ctx, x, 2.0f)), x);
    struct bt_graph *g = bt_graph_new(ctx, 16);
    ck_assert_int_eq(bt_graph_build_forward_expand(g, y), BT_OK);
    bt_buffer_t buf = bt_alloc_ctx_tensors(ctx, b);
    ck_assert_ptr_nonnull(buf);
    float xs[64];
    for (int i = 0; i < 64; i++) xs[i] = (float)i - 32.0f;
    bt_tensor_set(x, xs, 0, sizeof xs);
    int calls = 0;
    if (hook) ck_assert(bt_backend_set_node_hook(b, count_node, &calls));
    ck_assert_int_eq(bt_backend_graph_compute(b, g), BT_OK);
    bt_backend_set_node_hook(b, NULL, NULL);
    ck_assert_int_eq(bt_backend_graph_compute(b, g), BT_OK); /* cleared: no more calls */
    float ys[64];
    bt_tensor_get(y, ys, 0, sizeof ys);
    for (int i = 0; i < 64; i++) ck_assert_float_eq(ys[i], (xs[i] > 0 ? 2 * xs[i] : 0) + xs[i]);
    bt_buffer_free(buf);
    bt_free(ctx);
    return calls;
}

START_TEST(test_node_hook) {
    for (int nt = 1; nt <= 3; nt++) {
        bt_backend_t cpu = bt_backend_init_by_name("cpu", nt, NULL, 0);
        ck_assert_int_eq(hooked_nodes(cpu, true), 3);
        bt_backend_free(cpu);
    }
    /* a backend without a hook says so and sets nothing */
    bt_backend_t lim = bt_backend_limited_init("LIMITED0", 1, NULL, 0);
    int calls = 0;
    ck_assert(!bt_backend_set_node_hook(lim, count_node, &calls));
    ck_assert_int_eq(hooked_nodes(lim, false), 0);
    ck_assert_int_eq(calls, 0);
    bt_backend_free(lim);
}
END_TEST

START_TEST(test_describe) {
    char want[64], got[64];
    bt_backend_t cpu = bt_backend_init_by_name("cpu", 1, NULL, 0);
    snprintf(want, sizeof want, "CPU(%s)", bt_cpu_variant_name());
    ck_assert_str_eq(bt_backend_describe(cpu, got, sizeof got), want);
    ck_assert_str_eq(bt_backend_describe(cpu, got, 4), "CPU"); /* cut to fit */
    bt_backend_free(cpu);
    bt_backend_t lim = bt_backend_limited_init("LIMITED0", 1, NULL, 0);
    ck_assert_str_eq(bt_backend_describe(lim, got, sizeof got), "LIMITED0");
    bt_backend_free(lim);
}
END_TEST

int main(void) {
    Suite *s = suite_create("backend_reg");
    TCase *tc = tcase_create("registry");
    tcase_add_test(tc, test_list);
    tcase_add_test(tc, test_cpu_by_name);
    tcase_add_test(tc, test_bad_names);
    tcase_add_test(tc, test_node_hook);
    tcase_add_test(tc, test_describe);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
