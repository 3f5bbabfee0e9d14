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

/* Decode with expert groups (bt_project_decode): 4 layers, each 1 GB of dense
 * weights and 8 experts of 1 GB, 2 a token; d_model 1024; nothing before or
 * after the layers.  Hosts of 10 GB/s and 1000 GFLOP/s (the bytes bound),
 * linked at 1 GB/s and 10 us. */
static struct bt_moe_costs moe_costs(double *db, double *df, double *eb, double *ef) {
    for (int i = 0; i < 6; i++) {
        db[i] = i >= 1 && i <= 4 ? 1e9 : 0;
        df[i] = 0;
    }
    for (int i = 0; i < 4; i++) {
        eb[i] = 1e9;
        ef[i] = 0;
    }
    return (struct bt_moe_costs){.L = 4, .dense_bytes = db, .dense_flops = df, .expert_bytes = eb,
                                 .expert_flops = ef, .n_expert = 8, .n_used = 2, .d_model = 1024};
}

START_TEST(test_decode_groups) {
    double db[6], df[6], eb[4], ef[4];
    const struct bt_moe_costs mc = moe_costs(db, df, eb, ef);
    struct bt_cluster c = cluster();
    c.nodes = 4;
    c.devices_per_node = 1;
    c.device_gflops = 1000;
    c.inter = (struct bt_link_class){"link", 1, 10};
    c.decode.gbytes_s = 10;
    struct bt_decode_projection pipe, group, two;
    char err[256];
    /* one sequence, a pipeline of 4: each stage reads its layer's dense
     * weights and 2 experts: 3 GB at 10 GB/s, plus a row between stages */
    ck_assert_int_eq(bt_project_decode(&mc, &c, 4, 1, 1, &pipe, err, sizeof err), BT_OK);
    const double row = 4.0 * 1024 / 1e9;
    ck_assert(fabs(pipe.step_s - (4 * 0.3 + 3 * (10e-6 + row))) < 1e-9);
    ck_assert(fabs(pipe.experts_s - 0.8) < 1e-9);
    ck_assert_int_eq(pipe.stages, 4);
    ck_assert_int_eq(pipe.micro_batches, 1);
    /* one group of 4: the experts read a quarter each, at once; per layer two
     * latencies, the ids and rows out (each of 3 members gets the row of a
     * token with probability 1 - (3/4)^2) and 2 x 3/4 rows back */
    ck_assert_int_eq(bt_project_decode(&mc, &c, 4, 4, 1, &group, err, sizeof err), BT_OK);
    const double out = 3 * (8.0 + (1 - 0.75 * 0.75) * 4096.0), back = 2 * 0.75 * 4096.0;
    const double comm = 4 * (20e-6 + (out + back) / 1e9);
    ck_assert(fabs(group.experts_s - 0.2) < 1e-9);
    ck_assert(fabs(group.comm_s - comm) < 1e-12);
    ck_assert(fabs(group.step_s - (0.4 + 0.2 + comm)) < 1e-9);
    ck_assert(group.tokens_s > pipe.tokens_s);
    /* every host of the group holds a quarter of the experts, the first all
     * the dense weights */
    ck_assert(fabs(group.host_bytes - (4e9 + 4 * 2e9)) < 1);
    /* 8 sequences on 2 stages of 2: 2 micro-batches of 4 tokens, each stage
     * reading the distinct experts 4 tokens choose: 8 (1 - (3/4)^4) */
    ck_assert_int_eq(bt_project_decode(&mc, &c, 4, 2, 8, &two, err, sizeof err), BT_OK);
    ck_assert_int_eq(two.stages, 2);
    ck_assert_int_eq(two.micro_batches, 2);
    const double d4 = 8 * (1 - pow(0.75, 4));
    ck_assert(fabs(two.experts_s - 4 * d4 / 2 * 0.1) < 1e-9);
    /* refused: groups that do not divide the hosts, more stages than layers */
    ck_assert_int_eq(bt_project_decode(&mc, &c, 4, 3, 1, &two, err, sizeof err), BT_ERR_INVALID);
    ck_assert_int_eq(bt_project_decode(&mc, &c, 8, 1, 1, &two, err, sizeof err), BT_ERR_INVALID);
}
END_TEST

int main(void) {
    Suite *s = suite_create("project");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_four_stages);
    tcase_add_test(tc, test_one_stage_and_scaling);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_decode_groups);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
