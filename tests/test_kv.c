/* test_kv.c - the KV cache's bookkeeping (src/kv.h): placement of a ubatch
 * (lowest free cell, a sequence's cells kept in position order when sequences
 * share the cache, the fallback when nothing is free above), the mask built from the cells, the active
 * span, removing a sequence or its positions from one on, copying one into
 * another's region, the errors a caller sees, the sliding layers'
 * ring, and a cache of each type written through SET_ROWS and read back. */
#include <math.h>
#include <string.h>

#include "baton/backend.h"
#include "kv.h"
#include "testutil.h"

static struct bt_kv *new_kv(int64_t n_ctx, int n_seq, enum bt_type type) {
    struct bt_kv_config c = {n_ctx, n_seq, type, 0, 2, 64, 64, 32, 32, NULL, false, 0, 0, 0, false};
    struct bt_kv *kv = NULL;
    char err[256];
    ck_assert_msg(bt_kv_new(&c, &kv, err, sizeof err) == BT_OK, "%s", err);
    return kv;
}

static void place(struct bt_kv *kv, int n, const int32_t *seq, const int32_t *pos, int32_t *cells) {
    char err[256];
    ck_assert_msg(bt_kv_place(kv, n, seq, pos, cells, err, sizeof err) == BT_OK, "%s", err);
}

START_TEST(test_placement_and_mask) {
    struct bt_kv *kv = new_kv(40, 3, BT_TYPE_F16); /* regions of 13 cells: 0-12, 13-25, 26-38 */
    ck_assert_int_eq(bt_kv_seq_cells(kv), 13);
    ck_assert_int_eq(bt_kv_n_active(kv), 0);
    int32_t cells[16];
    /* two sequences interleaved: each in its own region, in token order */
    const int32_t s1[4] = {0, 1, 0, 1}, p1[4] = {0, 0, 1, 1};
    place(kv, 4, s1, p1, cells);
    ck_assert_int_eq(cells[0], 0);
    ck_assert_int_eq(cells[1], 13);
    ck_assert_int_eq(cells[2], 1);
    ck_assert_int_eq(cells[3], 14);
    ck_assert_int_eq(bt_kv_n_used(kv), 4);
    ck_assert_int_eq(bt_kv_n_active(kv), 32); /* 15 padded to BT_KV_PAD */
    /* sequence 0 removed: its cells are free; sequence 1 goes on above its
     * last cell, sequence 2 starts its own region */
    ck_assert_int_eq(bt_kv_seq_rm(kv, 0), 2);
    const int32_t s2[2] = {1, 2}, p2[2] = {2, 0};
    place(kv, 2, s2, p2, cells);
    ck_assert_int_eq(cells[0], 15);
    ck_assert_int_eq(cells[1], 26);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 1), 2);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 0), -1);

    /* mask: token of seq 1 at position 1 sees cells 13 and 14 (positions 0,
     * 1), token of seq 2 at position 5 sees cell 26 */
    const int32_t ms[2] = {1, 2}, mp[2] = {1, 5};
    float mask[2 * 32];
    ck_assert_int_eq(bt_kv_n_active(kv), 32);
    bt_kv_mask(kv, 32, 2, ms, mp, mask);
    for (int j = 0; j < 32; j++) {
        const bool see0 = j == 13 || j == 14;
        const bool see1 = j == 26;
        ck_assert_msg(mask[j] == (see0 ? 0.0f : -INFINITY), "cell %d row 0", j);
        ck_assert_msg(mask[32 + j] == (see1 ? 0.0f : -INFINITY), "cell %d row 1", j);
    }
    /* a sequence fills its region and no more, though other cells are free */
    int32_t s3[13], p3[13], c3[13];
    for (int i = 0; i < 13; i++) {
        s3[i] = 2;
        p3[i] = 1 + i;
    }
    place(kv, 12, s3, p3, c3);
    ck_assert_int_eq(c3[0], 27);
    ck_assert_int_eq(c3[11], 38);
    ck_assert_int_eq(bt_kv_n_active(kv), 40); /* 39 padded to 64, capped at n_ctx */
    char err[256];
    const int64_t used = bt_kv_n_used(kv);
    ck_assert_int_eq(bt_kv_place(kv, 1, s3 + 12, p3 + 12, c3, err, sizeof err), BT_ERR_CAPACITY);
    ck_assert_str_eq(err, "token 0: sequence 2 has used its share of the KV cache (13 of 40 cells for 3 sequences)");
    ck_assert_int_eq(bt_kv_n_used(kv), used);
    /* a batch that overflows a region half way places nothing */
    const int32_t s4[3] = {0, 2, 0}, p4[3] = {0, 99, 1};
    ck_assert_int_eq(bt_kv_place(kv, 3, s4, p4, c3, err, sizeof err), BT_ERR_CAPACITY);
    ck_assert_int_eq(bt_kv_n_used(kv), used);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 0), -1);
    bt_kv_clear(kv);
    ck_assert_int_eq(bt_kv_n_used(kv), 0);
    bt_kv_free(kv);
}
END_TEST

/* A sequence's cells do not depend on what else used the cache before: A
 * alone, and A after B was placed and removed and C took B's old cells. */
START_TEST(test_cells_independent_of_history) {
    const int32_t sa[5] = {0, 0, 0, 0, 0}, pa[5] = {0, 1, 2, 3, 4};
    const int32_t sb[6] = {1, 1, 1, 1, 1, 1}, sc[6] = {2, 2, 2, 2, 2, 2}, pb[6] = {0, 1, 2, 3, 4, 5};
    int32_t alone[5], after[5], tmp[6];
    struct bt_kv *kv = new_kv(48, 3, BT_TYPE_F16);
    place(kv, 5, sa, pa, alone);
    bt_kv_free(kv);
    kv = new_kv(48, 3, BT_TYPE_F16);
    place(kv, 6, sb, pb, tmp);
    ck_assert_int_eq(bt_kv_seq_rm(kv, 1), 6);
    place(kv, 6, sc, pb, tmp);
    place(kv, 5, sa, pa, after);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(after[i], alone[i]);
    bt_kv_free(kv);
}
END_TEST

START_TEST(test_errors) {
    struct bt_kv *kv = new_kv(4, 2, BT_TYPE_F16);
    char err[256];
    int32_t cells[4];
    const int32_t seq_bad[1] = {2}, pos0[1] = {0};
    ck_assert_int_eq(bt_kv_place(kv, 1, seq_bad, pos0, cells, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "token 0: sequence id 2 out of [0, 2)");
    const int32_t s0[1] = {0}, neg[1] = {-1};
    ck_assert_int_eq(bt_kv_place(kv, 1, s0, neg, cells, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "token 0: negative position -1");
    const int32_t sd[2] = {1, 1}, pd[2] = {3, 3};
    ck_assert_int_eq(bt_kv_place(kv, 2, sd, pd, cells, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "tokens 0 and 1: both sequence 1 position 3");
    ck_assert_int_eq(bt_kv_n_used(kv), 0); /* nothing placed by a failed call */
    const int32_t s5[5] = {0, 0, 0, 0, 0}, p5[5] = {0, 1, 2, 3, 4};
    int32_t c5[5];
    ck_assert_int_eq(bt_kv_place(kv, 5, s5, p5, c5, err, sizeof err), BT_ERR_CAPACITY);
    ck_assert_str_eq(err, "KV cache full: 5 tokens, 4 of 4 cells free");
    bt_kv_free(kv);

    struct bt_kv_config c = {16, 1, BT_TYPE_Q8_0, 0, 1, 32, 32, 16, 16, NULL, false, 0, 0, 0, false};
    struct bt_kv *k2 = NULL;
    ck_assert_int_eq(bt_kv_new(&c, &k2, err, sizeof err), BT_ERR_UNSUPPORTED);
    ck_assert_str_eq(err, "KV cache: type q8_0 needs head sizes that are multiples of 32, got 16 and 16");
    ck_assert_ptr_null(k2);
    c.type = BT_TYPE_BF16;
    ck_assert_int_eq(bt_kv_new(&c, &k2, err, sizeof err), BT_ERR_UNSUPPORTED);
    ck_assert_str_eq(err, "KV cache: type bf16 not supported (f16, f32, q8_0)");
    c.type = BT_TYPE_F16;
    c.n_seq_max = 17;
    ck_assert_int_eq(bt_kv_new(&c, &k2, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: 17 sequences do not fit 16 cells");
    c.n_seq_max = 1;
    c.n_ctx = 0;
    ck_assert_int_eq(bt_kv_new(&c, &k2, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: context size 0 out of [1, 16777216]");
}
END_TEST

/* V inside K (deepseek2's latent): one K tensor a layer, no V, a cell's
 * bytes K's alone; two heads, or V longer than K, refused. */
START_TEST(test_v_in_k) {
    struct bt_kv_config c = {64, 1, BT_TYPE_F16, 0, 2, 96, 64, 96, 64, NULL, false, 0, 0, 0, true};
    char err[256];
    struct bt_kv *kv = NULL;
    ck_assert_msg(bt_kv_new(&c, &kv, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_int_eq(bt_kv_k(kv, 1)->ne[0], 96);
    ck_assert_ptr_null(bt_kv_v(kv, 0));
    ck_assert_ptr_null(bt_kv_v(kv, 1));
    ck_assert_uint_eq(bt_kv_config_row_bytes(&c), 192);
    c.v_in_k = false;
    ck_assert_uint_eq(bt_kv_config_row_bytes(&c), 320);
    bt_kv_free(kv);
    struct bt_kv_config two = {64, 1, BT_TYPE_F16, 0, 2, 64, 64, 32, 32, NULL, false, 0, 0, 0, true};
    ck_assert_int_eq(bt_kv_new(&two, &kv, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: V inside K needs one head and V rows no longer than K's (64, 64)");
    struct bt_kv_config longer = {64, 1, BT_TYPE_F16, 0, 2, 64, 96, 64, 96, NULL, false, 0, 0, 0, true};
    ck_assert_int_eq(bt_kv_new(&longer, &kv, err, sizeof err), BT_ERR_INVALID);
    /* a sequence's cells copied into another's (n > 1 choices): K's rows alone */
    struct bt_kv_config two_seq = {64, 2, BT_TYPE_F32, 0, 2, 96, 64, 96, 64, NULL, false, 0, 0, 0, true};
    ck_assert_msg(bt_kv_new(&two_seq, &kv, err, sizeof err) == BT_OK, "%s", err);
    int32_t cells[3];
    place(kv, 3, (const int32_t[]){0, 0, 0}, (const int32_t[]){0, 1, 2}, cells);
    for (int il = 0; il < 2; il++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 96; i++)
                ((float *)((char *)bt_kv_k(kv, il)->data + cells[j] * bt_kv_k(kv, il)->nb[1]))[i] =
                    (float)(1000 * il + 100 * j + i);
    ck_assert_msg(bt_kv_seq_cp(kv, 0, 1, 3, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 1), 2);
    for (int il = 0; il < 2; il++)
        for (int j = 0; j < 3; j++)
            ck_assert_float_eq(((const float *)((char *)bt_kv_k(kv, il)->data +
                                                (32 + j) * bt_kv_k(kv, il)->nb[1]))[95],
                               (float)(1000 * il + 100 * j + 95));
    bt_kv_free(kv);
}
END_TEST

/* Sliding-window layers: layers 0 and 2 of 3 slide (pattern 2), window 3,
 * ubatches of 4: a ring of 32 cells per sequence in their tensors while a
 * sequence's region (80 of 160 cells) is larger, position p at cell
 * s*32 + p % 32; the mask sees the last 3 positions; a position too far
 * behind is refused with nothing placed; without a ring (regions of 32) the
 * sliding cells are the others'. */
START_TEST(test_sliding_window) {
    struct bt_kv_config c = {160, 2, BT_TYPE_F16, 0, 3, 64, 64, 32, 32, NULL, false, 3, 2, 4, false};
    ck_assert(bt_kv_swa_layer(3, 2, 0) && !bt_kv_swa_layer(3, 2, 1) && bt_kv_swa_layer(3, 2, 2));
    ck_assert(!bt_kv_swa_layer(0, 2, 0) && bt_kv_swa_layer(3, 0, 1) && !bt_kv_swa_layer(3, 1, 0));
    ck_assert_int_eq(bt_kv_config_layer_cells(&c, 0), 64);
    ck_assert_int_eq(bt_kv_config_layer_cells(&c, 1), 160);
    struct bt_kv *kv = NULL;
    char err[300];
    ck_assert_msg(bt_kv_new(&c, &kv, err, sizeof err) == BT_OK, "%s", err);
    ck_assert(bt_kv_has_swa(kv));
    ck_assert_int_eq(bt_kv_k(kv, 0)->ne[1], 64);
    ck_assert_int_eq(bt_kv_v(kv, 2)->ne[1], 64);
    ck_assert_int_eq(bt_kv_k(kv, 1)->ne[1], 160);
    ck_assert_uint_eq(bt_kv_bytes(kv), (64 + 160 + 64) * 2 * 128);
    ck_assert_int_eq(bt_kv_swa_n_kv(kv, 32), 64); /* the whole ring, whatever the others read */
    int32_t cells[4];
    for (int32_t p0 = 0; p0 < 40; p0 += 4) { /* sequence 1, positions 0..39 */
        const int32_t seq[4] = {1, 1, 1, 1}, pos[4] = {p0, p0 + 1, p0 + 2, p0 + 3};
        place(kv, 4, seq, pos, cells);
        for (int i = 0; i < 4; i++) {
            ck_assert_int_eq(cells[i], 80 + pos[i]);
            ck_assert_int_eq(bt_kv_swa_cells(kv)[i], 32 + pos[i] % 32);
        }
    }
    /* position 39 sees 37, 38, 39 (cells 32+5 .. 32+7); 36 is masked, and
     * 4..7 were overwritten by 36..39 */
    const int32_t ms[1] = {1}, mp[1] = {39};
    float mask[64];
    bt_kv_mask_swa(kv, 64, 1, ms, mp, mask);
    for (int j = 0; j < 64; j++)
        ck_assert_msg(mask[j] == (j >= 37 && j <= 39 ? 0.0f : -INFINITY), "cell %d", j);
    /* 100 is fine; 60 is more than 32 - 3 behind 100 */
    const int32_t s2[2] = {1, 1}, p2[2] = {100, 60};
    ck_assert_int_eq(bt_kv_place(kv, 2, s2, p2, cells, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "token 1: sequence 1 position 60 is more than 29 behind its position 100: the sliding "
                          "window's ring of 32 cells no longer holds what it would see");
    ck_assert_int_eq(bt_kv_n_used(kv), 40);
    ck_assert_int_eq(bt_kv_seq_rm(kv, 1), 40);
    bt_kv_mask_swa(kv, 64, 1, ms, mp, mask);
    for (int j = 0; j < 64; j++) ck_assert(mask[j] == -INFINITY);
    bt_kv_free(kv);

    c.n_ctx = 64; /* regions of 32: no ring */
    ck_assert_int_eq(bt_kv_config_layer_cells(&c, 0), 64);
    ck_assert_msg(bt_kv_new(&c, &kv, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_int_eq(bt_kv_swa_n_kv(kv, 32), 32);
    const int32_t s3[3] = {1, 0, 1}, p3[3] = {0, 0, 1};
    place(kv, 3, s3, p3, cells);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(bt_kv_swa_cells(kv)[i], cells[i]);
    bt_kv_free(kv);
}
END_TEST

/* SET_ROWS into the cache tensors of each type and FLASH_ATTN reading them
 * back through a view agree with the same attention over F32 rows. */
START_TEST(test_cache_types_roundtrip) {
    const enum bt_type types[3] = {BT_TYPE_F32, BT_TYPE_F16, BT_TYPE_Q8_0};
    for (int ti = 0; ti < 3; ti++) {
        struct bt_kv *kv = new_kv(8, 1, types[ti]);
        struct bt_tensor *ck = bt_kv_k(kv, 1);
        ck_assert_int_eq(ck->type, types[ti]);
        ck_assert_int_eq(ck->ne[0], 64);
        ck_assert_int_eq(ck->ne[1], 8);
        bt_context *ctx = tu_ctx(8);
        tu_rng r;
        tu_rng_init(&r, 9 + (uint64_t)ti);
        struct bt_tensor *rows = bt_new_tensor_2d(ctx, BT_TYPE_F32, 64, 3);
        struct bt_tensor *ids = bt_new_tensor_1d(ctx, BT_TYPE_I32, 3);
        tu_fill(rows, &r);
        const int32_t cells[3] = {5, 1, 6};
        memcpy(ids->data, cells, sizeof cells);
        struct bt_tensor *w = bt_set_rows(ctx, ck, rows, ids);
        TU_OK(ctx, w);
        tu_compute(ctx, w, 2);
        float *rv = tu_read_f32(rows);
        float back[64];
        const double tol = types[ti] == BT_TYPE_F32 ? 0 : (types[ti] == BT_TYPE_F16 ? 1e-6 : 1e-4);
        for (int i = 0; i < 3; i++) {
            bt_row_to_f32(ck->type, (char *)ck->data + cells[i] * ck->nb[1], back, 64);
            ck_assert_double_le(tu_nmse(back, rv + 64 * i, 64), tol);
        }
        free(rv);
        bt_free(ctx);
        bt_kv_free(kv);
    }
}
END_TEST

/* A sequence trimmed to its first positions keeps them in their cells, and
 * the next token lands where a run that never went further would put it;
 * a copy puts a sequence's first positions (bookkeeping and every layer's
 * K/V rows) at the same offsets of another's region. */
START_TEST(test_trim_and_copy) {
    struct bt_kv *kv = new_kv(40, 3, BT_TYPE_F32); /* regions of 13 cells: 0-12, 13-25, 26-38 */
    int32_t cells[8];
    const int32_t s1[6] = {1, 1, 1, 1, 1, 0}, p1[6] = {0, 1, 2, 3, 4, 0};
    place(kv, 6, s1, p1, cells);
    /* K/V rows of sequence 1's cells: a value of the cell and the layer */
    for (int il = 0; il < 2; il++)
        for (int j = 13; j < 18; j++) {
            float row[64];
            for (int i = 0; i < 64; i++) row[i] = (float)(1000 * il + 10 * j + i);
            memcpy((char *)bt_kv_k(kv, il)->data + j * bt_kv_k(kv, il)->nb[1], row, sizeof row);
            for (int i = 0; i < 64; i++) row[i] = -row[i];
            memcpy((char *)bt_kv_v(kv, il)->data + j * bt_kv_v(kv, il)->nb[1], row, sizeof row);
        }
    ck_assert(bt_kv_seq_reusable(kv, 1, 3) && bt_kv_seq_reusable(kv, 1, 5));
    ck_assert_int_eq(bt_kv_seq_trim(kv, 1, 3), 2); /* positions 3 and 4 go */
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 1), 2);
    ck_assert_int_eq(bt_kv_n_used(kv), 4);
    const int32_t s2[1] = {1}, p2[1] = {3};
    place(kv, 1, s2, p2, cells);
    ck_assert_int_eq(cells[0], 16); /* where a cold run's position 3 goes */
    ck_assert_int_eq(bt_kv_seq_trim(kv, 1, 0), 4);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 1), -1);
    place(kv, 4, (const int32_t[]){1, 1, 1, 1}, (const int32_t[]){0, 1, 2, 3}, cells);
    ck_assert_int_eq(cells[0], 13);

    /* copy positions 0..2 of sequence 1 into sequence 2 */
    char err[256];
    ck_assert_msg(bt_kv_seq_cp(kv, 1, 2, 3, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 2), 2);
    ck_assert_int_eq(bt_kv_n_used(kv), 8);
    for (int il = 0; il < 2; il++)
        for (int j = 0; j < 3; j++) {
            const float *k = (const float *)((char *)bt_kv_k(kv, il)->data + (26 + j) * bt_kv_k(kv, il)->nb[1]);
            const float *v = (const float *)((char *)bt_kv_v(kv, il)->data + (26 + j) * bt_kv_v(kv, il)->nb[1]);
            for (int i = 0; i < 64; i++) {
                ck_assert_float_eq(k[i], (float)(1000 * il + 10 * (13 + j) + i));
                ck_assert_float_eq(v[i], -(float)(1000 * il + 10 * (13 + j) + i));
            }
        }
    /* the copy's mask is the source's, in its own region */
    float m1[40], m2[40];
    bt_kv_mask(kv, 40, 1, (const int32_t[]){1}, (const int32_t[]){2}, m1);
    bt_kv_mask(kv, 40, 1, (const int32_t[]){2}, (const int32_t[]){2}, m2);
    for (int j = 0; j < 13; j++) {
        ck_assert(m1[13 + j] == m2[26 + j]);
        ck_assert(m2[13 + j] == -INFINITY && m1[26 + j] == -INFINITY);
    }
    ck_assert(m2[26] == 0.0f && m2[28] == 0.0f && m2[29] == -INFINITY);
    place(kv, 1, (const int32_t[]){2}, (const int32_t[]){3}, cells);
    ck_assert_int_eq(cells[0], 29);
    /* errors: a destination that holds cells, a source without the positions, ids out of range */
    ck_assert_int_eq(bt_kv_seq_cp(kv, 1, 2, 3, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: copy of sequence 1 into 2: sequence 2 holds 4 cells");
    ck_assert_int_eq(bt_kv_seq_cp(kv, 0, 1, 0, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: copy of sequence 0 into 1: 0 positions, out of [1, 13]");
    bt_kv_seq_rm(kv, 2);
    ck_assert_int_eq(bt_kv_seq_cp(kv, 0, 2, 3, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: copy of sequence 0 into 2: sequence 0 does not hold positions 0 to 2");
    ck_assert_int_eq(bt_kv_seq_cp(kv, 0, 3, 1, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "KV cache: copy of sequence 0 into 3: a sequence id out of [0, 3)");
    bt_kv_free(kv);
}
END_TEST

/* The sliding layers' ring: a sequence trimmed back to n keeps exactly what
 * a run that stopped at n - 1 held only while the positions n's window sees
 * are not overwritten (W 32, window 3: up to 29 positions past n - 1). */
START_TEST(test_trim_ring) {
    struct bt_kv_config c = {160, 2, BT_TYPE_F32, 0, 3, 64, 64, 32, 32, NULL, false, 3, 2, 4, false};
    struct bt_kv *kv = NULL;
    char err[300];
    ck_assert_msg(bt_kv_new(&c, &kv, err, sizeof err) == BT_OK, "%s", err);
    int32_t cells[4];
    for (int32_t p0 = 0; p0 < 40; p0 += 4) {
        const int32_t seq[4] = {1, 1, 1, 1}, pos[4] = {p0, p0 + 1, p0 + 2, p0 + 3};
        place(kv, 4, seq, pos, cells);
    }
    /* top 39: position q was overwritten when q + 32 <= 39 (q <= 7); n's
     * window needs n - 2 .. n - 1 */
    ck_assert(bt_kv_seq_reusable(kv, 1, 39) && bt_kv_seq_reusable(kv, 1, 10) && bt_kv_seq_reusable(kv, 1, 40));
    ck_assert(!bt_kv_seq_reusable(kv, 1, 9) && !bt_kv_seq_reusable(kv, 1, 5) && !bt_kv_seq_reusable(kv, 1, 41));
    ck_assert(!bt_kv_seq_reusable(kv, 0, 1) && bt_kv_seq_reusable(kv, 0, 0));
    ck_assert_int_eq(bt_kv_seq_trim(kv, 1, 20), 20);
    /* position 20 sees 18, 19, 20 as a cold run's would: ring cells 32 + 18, 32 + 19 */
    place(kv, 1, (const int32_t[]){1}, (const int32_t[]){20}, cells);
    ck_assert_int_eq(cells[0], 80 + 20);
    ck_assert_int_eq(bt_kv_swa_cells(kv)[0], 32 + 20);
    float mask[64];
    bt_kv_mask_swa(kv, 64, 1, (const int32_t[]){1}, (const int32_t[]){20}, mask);
    for (int j = 0; j < 64; j++) ck_assert_msg(mask[j] == (j >= 50 && j <= 52 ? 0.0f : -INFINITY), "cell %d", j);
    /* a copy of positions 0..20 into sequence 0: the ring's cells too */
    ck_assert_msg(bt_kv_seq_cp(kv, 1, 0, 21, err, sizeof err) == BT_OK, "%s", err);
    bt_kv_mask_swa(kv, 64, 1, (const int32_t[]){0}, (const int32_t[]){21}, mask);
    for (int j = 0; j < 64; j++) ck_assert_msg(mask[j] == (j >= 19 && j <= 20 ? 0.0f : -INFINITY), "cell %d", j);
    ck_assert_int_eq(bt_kv_seq_pos_max(kv, 0), 20);
    ck_assert_int_eq(bt_kv_seq_cp(kv, 1, 0, 21, err, sizeof err), BT_ERR_INVALID);
    bt_kv_free(kv);
}
END_TEST

int main(void) {
    Suite *s = suite_create("kv");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_placement_and_mask);
    tcase_add_test(tc, test_cells_independent_of_history);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_sliding_window);
    tcase_add_test(tc, test_v_in_k);
    tcase_add_test(tc, test_cache_types_roundtrip);
    tcase_add_test(tc, test_trim_and_copy);
    tcase_add_test(tc, test_trim_ring);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
