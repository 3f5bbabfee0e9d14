/* test_place.c - weight placement: layer names, layer costs, balanced
 * stages, faster ranks taking more layers, memory limits, fixed counts. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "synth_model.h"
#include "place.h"
#include "testutil.h"

struct fixture {
    struct bt_model *m;
    bt_context *ctx;
    struct bt_model_graph g;
    struct bt_layer_costs lc;
};

static void fixture_init(struct fixture *f, int n_layers) {
    struct bt_model_config c;
    bt_model_config_default(&c);
    c.n_layers = n_layers;
    char merr[256];
    ck_assert_msg(bt_model_new(&c, &f->m, merr, sizeof merr) == BT_OK, "%s", merr);
    f->ctx = bt_init((struct bt_init_params){bt_model_graph_ctx_size(&c), NULL, true});
    ck_assert_int_eq(bt_model_build_graph(f->m, f->ctx, &f->g), BT_OK);
    char err[256];
    ck_assert_int_eq(bt_layer_costs_make(f->g.graph, &f->lc, err, sizeof err), BT_OK);
}

static void fixture_free(struct fixture *f) {
    bt_layer_costs_free(&f->lc);
    bt_free(f->ctx);
    bt_model_free(f->m);
}

static void descs_init(struct bt_rank_desc *d, int P, double gflops, int64_t mem) {
    for (int r = 0; r < P; r++) {
        memset(&d[r], 0, sizeof d[r]);
        snprintf(d[r].backend, sizeof d[r].backend, "CPU");
        d[r].gflops = gflops;
        d[r].mem_bytes = mem;
    }
}

START_TEST(test_name_layer) {
    ck_assert_int_eq(bt_dist_name_layer("blk.0.attn_q"), 0);
    ck_assert_int_eq(bt_dist_name_layer("blk.17.ffn_down_exps"), 17);
    ck_assert_int_eq(bt_dist_name_layer("CPU#blk.3.x#1"), 3);
    ck_assert_int_eq(bt_dist_name_layer("token_embd"), -1);
    ck_assert_int_eq(bt_dist_name_layer("blk.x.attn"), -1);
    ck_assert_int_eq(bt_dist_name_layer("blk.3"), -1);
    ck_assert_int_eq(bt_dist_name_layer("myblk.3.a"), -1);
    ck_assert_int_eq(bt_dist_name_layer("blk.99999999.a"), -1);
}
END_TEST

START_TEST(test_costs) {
    struct fixture f;
    fixture_init(&f, 6);
    ck_assert_int_eq(f.lc.L, 6);
    /* identical layers: equal FLOPs and weight bytes */
    for (int l = 1; l < 6; l++) {
        ck_assert(fabs(f.lc.flops[l + 1] - f.lc.flops[1]) < 1e-6 * f.lc.flops[1]);
        ck_assert(fabs(f.lc.wbytes[l + 1] - f.lc.wbytes[1]) < 0.5);
    }
    const struct bt_model_config *c = bt_model_get_config(f.m);
    ck_assert_int_eq((int64_t)f.lc.wbytes[1], (int64_t)bt_model_layer_weight_bytes(c));
    /* token_embd before layer 0, output after the last */
    ck_assert(f.lc.wbytes[0] > 0 && f.lc.wbytes[7] > 0);
    /* between two layers the residual stream crosses (and the inputs pos, mask) */
    const double x = (double)c->d_model * c->n_tokens * 4;
    ck_assert_msg(f.lc.cut_bytes[3] >= x, "cut %.0f < residual %.0f", f.lc.cut_bytes[3], x);
    fixture_free(&f);
}
END_TEST

START_TEST(test_balanced) {
    struct fixture f;
    fixture_init(&f, 8);
    struct bt_rank_desc d[4];
    descs_init(d, 4, 10.0, (int64_t)1 << 40);
    int first[4], last[4];
    double pred[4];
    char err[256];
    struct bt_plan_options opt = {0};
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 4, &opt, first, last, pred, err, sizeof err), BT_OK);
    int covered = 0;
    for (int r = 0; r < 4; r++) {
        ck_assert_int_ge(last[r] - first[r] + 1, 1);
        ck_assert_int_le(last[r] - first[r] + 1, 3);
        if (r > 0) ck_assert_int_eq(first[r], last[r - 1] + 1);
        covered += last[r] - first[r] + 1;
    }
    ck_assert_int_eq(first[0], 0);
    ck_assert_int_eq(covered, 8);
    fixture_free(&f);
}
END_TEST

START_TEST(test_faster_rank_more_layers) {
    struct fixture f;
    fixture_init(&f, 12);
    struct bt_rank_desc d[2];
    descs_init(d, 2, 10.0, (int64_t)1 << 40);
    d[1].gflops = 30.0; /* three times faster */
    int first[2], last[2];
    double pred[2];
    char err[256];
    struct bt_plan_options opt = {0};
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &opt, first, last, pred, err, sizeof err), BT_OK);
    const int n0 = last[0] - first[0] + 1, n1 = last[1] - first[1] + 1;
    ck_assert_msg(n1 >= 2 * n0, "rank 1 (3x faster) got %d layers, rank 0 %d", n1, n0);
    /* the slowest predicted stage is no slower than an even split's */
    struct bt_plan_options even = {.layers_per_rank = (const int[]){6, 6}};
    double pred_even[2];
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &even, first, last, pred_even, err, sizeof err), BT_OK);
    ck_assert(fmax(pred[0], pred[1]) <= fmax(pred_even[0], pred_even[1]));
    fixture_free(&f);
}
END_TEST

START_TEST(test_memory_limits) {
    struct fixture f;
    fixture_init(&f, 8);
    const double layer = f.lc.wbytes[1];
    struct bt_rank_desc d[2];
    descs_init(d, 2, 10.0, (int64_t)1 << 40);
    /* rank 0 fits its embeddings and two layers only */
    d[0].mem_bytes = (int64_t)(f.lc.wbytes[0] + 2.5 * layer);
    int first[2], last[2];
    double pred[2];
    char err[256];
    struct bt_plan_options opt = {0};
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &opt, first, last, pred, err, sizeof err), BT_OK);
    ck_assert_int_le(last[0] - first[0] + 1, 2);
    /* nowhere near enough memory: one message naming the rank that cannot
     * hold even its smallest share (rank 0: its embeddings and one layer) */
    descs_init(d, 2, 10.0, (int64_t)layer);
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &opt, first, last, pred, err, sizeof err), BT_ERR_NOMEM);
    ck_assert_msg(strncmp(err, "rank 0 (", 8) == 0 && strstr(err, "its smallest share of 8 layers on 2 ranks needs"),
                  "%s", err);
    /* each rank holds its smallest share, but not the model between them */
    descs_init(d, 2, 10.0, (int64_t)(f.lc.wbytes[0] + f.lc.wbytes[9] + 1.5 * layer));
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &opt, first, last, pred, err, sizeof err), BT_ERR_NOMEM);
    ck_assert_msg(strstr(err, "do not fit in the ranks' memory") != NULL, "%s", err);
    fixture_free(&f);
}
END_TEST

START_TEST(test_fixed_counts) {
    struct fixture f;
    fixture_init(&f, 5);
    struct bt_rank_desc d[2];
    descs_init(d, 2, 10.0, (int64_t)1 << 40);
    int first[2], last[2];
    double pred[2];
    char err[256];
    struct bt_plan_options opt = {.layers_per_rank = (const int[]){1, 4}};
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &opt, first, last, pred, err, sizeof err), BT_OK);
    ck_assert_int_eq(first[0], 0);
    ck_assert_int_eq(last[0], 0);
    ck_assert_int_eq(first[1], 1);
    ck_assert_int_eq(last[1], 4);
    opt.layers_per_rank = (const int[]){2, 2};
    ck_assert_int_eq(bt_place_layers(&f.lc, d, 2, &opt, first, last, pred, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "the layer counts per rank add up to 4, but the model has 5 layers");
    ck_assert_int_eq(bt_place_rank_of_layer(-1, (int[]){0, 1}, (int[]){0, 4}, 2), 0);
    ck_assert_int_eq(bt_place_rank_of_layer(3, (int[]){0, 1}, (int[]){0, 4}, 2), 1);
    ck_assert_int_eq(bt_place_rank_of_layer(5, (int[]){0, 1}, (int[]){0, 4}, 2), 1);
    fixture_free(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("place");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_name_layer);
    tcase_add_test(tc, test_costs);
    tcase_add_test(tc, test_balanced);
    tcase_add_test(tc, test_faster_rank_more_layers);
    tcase_add_test(tc, test_memory_limits);
    tcase_add_test(tc, test_fixed_counts);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
