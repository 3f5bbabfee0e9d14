/* test_project.c - throughput on paper (src/project.c): stage times from a
 * device's speed and the link each cut crosses (in a node, between nodes),
 * the pipeline's step time and bubble, the slowest stage, memory, and the
 * clusters it refuses. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "project.h"
#include "testutil.h"

/* 8 layers of 1 GFLOP and 1 GiB each; 1 MB crosses every cut */
static double flops[10], wbytes[10], cut[9];
static struct bt_layer_costs costs(void) {
    for (int i = 0; i < 10; i++) {
        flops[i] = i >= 1 && i <= 8 ? 1e9 : 0;
        wbytes[i] = i >= 1 && i <= 8 ? 1073741824.0 : 0;
    }
    for (int i = 0; i < 9; i++) cut[i] = 1e6;
    return (struct bt_layer_costs){.L = 8, .flops = flops, .wbytes = wbytes, .cut_bytes = cut};
}

/* 2 nodes x 2 devices of 1 GFLOP/s and 1.5 GiB; 1 GB/s + 10 us in a node,
 * 0.1 GB/s + 100 us between nodes; 4 micro-batches */
static struct bt_cluster cluster(void) {
    struct bt_cluster c;
    memset(&c, 0, sizeof c);
    c.nodes = 2;
    c.devices_per_node = 2;
    c.device_gflops = 1;
    c.device_mem = 1610612736;
    c.intra = (struct bt_link_class){"in", 1, 10};
    c.inter = (struct bt_link_class){"between", 0.1, 100};
    c.micro_batches = 4;
    return c;
}

START_TEST(test_four_stages) {
    struct bt_layer_costs lc = costs();
    struct bt_cluster c = cluster();
    struct bt_projection p;
    char err[256];
    ck_assert_int_eq(bt_project(&lc, &c, 4, 10, &p, err, sizeof err), BT_OK);
    const double in = 10e-6 + 1e6 / 1e9, between = 100e-6 + 1e6 / 1e8;
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(p.stage[r].first, 2 * r);
        ck_assert_int_eq(p.stage[r].last, 2 * r + 1);
        ck_assert_double_eq_tol(p.stage[r].compute_s, 2.0, 1e-12);
        ck_assert(p.stage[r].cross_node == (r == 2));
        ck_assert_double_eq_tol(p.stage[r].recv_s, r == 0 ? 0 : r == 2 ? between : in, 1e-12);
    }
    ck_assert_int_eq(p.slowest, 2);
    const double sum = 8 + 2 * in + between, step = sum + 3 * (2 + between);
    ck_assert_double_eq_tol(p.pass_s, sum, 1e-12);
    ck_assert_double_eq_tol(p.step_s, step, 1e-12);
    ck_assert_double_eq_tol(p.tokens_s, 40 / step, 1e-9);
    ck_assert_double_eq_tol(p.bubble, 1 - 4 * sum / (4 * step), 1e-12);
    ck_assert(!p.fits); /* 2 GiB a stage on 1.5 GiB devices */
    bt_projection_free(&p);
}
END_TEST

START_TEST(test_one_stage_and_scaling) {
    struct bt_layer_costs lc = costs();
    struct bt_cluster c = cluster();
    c.device_mem = (int64_t)16 << 30;
    struct bt_projection p1, p2;
    char err[256];
    ck_assert_int_eq(bt_project(&lc, &c, 1, 10, &p1, err, sizeof err), BT_OK);
    ck_assert_double_eq_tol(p1.step_s, 4 * 8.0, 1e-12); /* no bubble, no transfer */
    ck_assert_double_eq_tol(p1.bubble, 0, 1e-12);
    ck_assert(p1.fits);
    ck_assert_int_eq(bt_project(&lc, &c, 2, 10, &p2, err, sizeof err), BT_OK);
    ck_assert(p2.tokens_s > p1.tokens_s && p2.tokens_s < 2 * p1.tokens_s);
    bt_projection_free(&p1);
    bt_projection_free(&p2);
}
END_TEST

START_TEST(test_refused) {
    struct bt_layer_costs lc = costs();
    struct bt_cluster c = cluster();
    struct bt_projection p;
    char err[256];
    ck_assert_int_eq(bt_project(&lc, &c, 5, 10, &p, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "5 stages on a cluster of 4 devices");
    c.nodes = 8;
    c.devices_per_node = 2;
    ck_assert_int_eq(bt_project(&lc, &c, 9, 10, &p, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "9 stages but the model has 8 layers: at most one stage a layer");
    c = cluster();
    c.inter.gbytes_s = 0;
    ck_assert_int_eq(bt_project(&lc, &c, 2, 10, &p, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "device speed, link bandwidths, micro-batches and tokens must be > 0");
    c = cluster();
    c.nodes = 0;
    ck_assert_int_eq(bt_project(&lc, &c, 1, 10, &p, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "a cluster of 0 nodes x 2 devices: want 1..4096 devices in all");
}
END_TEST

int main(void) {
    Suite *s = suite_create("project");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_four_stages);
    tcase_add_test(tc, test_one_stage_and_scaling);
    tcase_add_test(tc, test_refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
