/* test_gguf.c - the GGUF reader and writer.
 *
 * - the writer's files read back exactly (every metadata type, arrays of
 *   strings, tensors of several types and shapes, streamed data, alignment),
 *   and a failed or abandoned write leaves no file behind;
 * - typed getters and their type-mismatch / missing-key messages; a type
 *   baton cannot compute is an error when used, not when listed; layers;
 * - malformed files: a good file is built byte by byte here (independently
 *   of the writer) with the offset of every field recorded, then damaged one
 *   way per case; each case asserts the exact message (file, offset, key or
 *   tensor, what is wrong).  The damaged bytes are an exact-size heap copy so
 *   AddressSanitizer sees any read past them.
 */
#include <check.h>
#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "testutil.h"

static char g_dir[PATH_MAX];
static char g_path[PATH_MAX + 32];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/baton-gguf-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/m.gguf", g_dir);
}

/* removes every file in the folder (a leftover temporary file fails the
 * test that checks for none before this runs) */
static void teardown(void) {
    DIR *d = opendir(g_dir);
    if (d) {
        struct dirent *e;
        char p[PATH_MAX + 300];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(g_dir);
}

static int files_in_dir(void) {
    DIR *d = opendir(g_dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* ---- the writer's files read back ---- */

static const char *const k_strs[] = {"", "a", "héllo wörld", "tab\there", "x\x01y"};

/* test_roundtrip's keys read back: every scalar type, arrays of numbers, bools and strings */
static void check_roundtrip_keys(struct bt_gguf *g, const int32_t ai[5], const uint8_t ab[4]) {
    struct bt_gguf_str s;
    ck_assert_int_eq(bt_gguf_get_str(g, "general.architecture", &s), BT_OK);
    ck_assert_int_eq(s.n, 5);
    ck_assert(!memcmp(s.data, "llama", 5));
    uint8_t u8;
    int8_t i8;
    uint16_t u16;
    int16_t i16;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    bool b;
    ck_assert(bt_gguf_get_u8(g, "t.u8", &u8) == BT_OK && u8 == 250);
    ck_assert(bt_gguf_get_i8(g, "t.i8", &i8) == BT_OK && i8 == -120);
    ck_assert(bt_gguf_get_u16(g, "t.u16", &u16) == BT_OK && u16 == 65000);
    ck_assert(bt_gguf_get_i16(g, "t.i16", &i16) == BT_OK && i16 == -32000);
    ck_assert(bt_gguf_get_u32(g, "t.u32", &u32) == BT_OK && u32 == 4000000000u);
    ck_assert(bt_gguf_get_i32(g, "t.i32", &i32) == BT_OK && i32 == -2000000000);
    ck_assert(bt_gguf_get_u64(g, "t.u64", &u64) == BT_OK && u64 == 18000000000000000000ull);
    ck_assert(bt_gguf_get_i64(g, "t.i64", &i64) == BT_OK && i64 == -9000000000000000000ll);
    ck_assert(bt_gguf_get_f32(g, "t.f32", &f) == BT_OK && f == 1.5e-3f);
    ck_assert(bt_gguf_get_f64(g, "t.f64", &d) == BT_OK && d == -2.25e300);
    ck_assert(bt_gguf_get_bool(g, "t.bool", &b) == BT_OK && b);

    const struct bt_gguf_value *a;
    ck_assert_int_eq(bt_gguf_get_arr(g, "t.arr_i32", BT_GGUF_TYPE_INT32, &a), BT_OK);
    ck_assert_int_eq(a->n, 5);
    int32_t ri[5];
    bt_gguf_arr_copy(g, a, 0, 5, ri);
    ck_assert(!memcmp(ri, ai, 5 * sizeof *ai));
    struct bt_gguf_value e = bt_gguf_arr_elem(g, a, 3);
    ck_assert_int_eq(bt_gguf_value_i64(g, &e), -4);
    ck_assert_int_eq(bt_gguf_get_arr(g, "t.arr_f32", BT_GGUF_TYPE_FLOAT32, &a), BT_OK);
    e = bt_gguf_arr_elem(g, a, 2);
    ck_assert(bt_gguf_value_f64(g, &e) == 3.25);
    /* a float read as an integer: truncated, clamped, NaN 0 (found by the fuzzer: a plain cast was undefined) */
    ck_assert_int_eq(bt_gguf_get_arr(g, "t.arr_f32x", BT_GGUF_TYPE_FLOAT32, &a), BT_OK);
    struct bt_gguf_value fe[4];
    for (int i = 0; i < 4; i++) fe[i] = bt_gguf_arr_elem(g, a, (uint64_t)i);
    ck_assert_int_eq(bt_gguf_value_i64(g, &fe[0]), INT64_MAX);
    ck_assert_int_eq(bt_gguf_value_i64(g, &fe[1]), INT64_MIN);
    ck_assert_int_eq(bt_gguf_value_i64(g, &fe[2]), 0);
    ck_assert_int_eq(bt_gguf_value_i64(g, &fe[3]), -2);
    ck_assert_int_eq(bt_gguf_get_arr(g, "t.arr_bool", BT_GGUF_TYPE_BOOL, &a), BT_OK);
    uint8_t rb[4];
    bt_gguf_arr_copy(g, a, 0, 4, rb);
    ck_assert(!memcmp(rb, ab, 4));
    ck_assert_int_eq(bt_gguf_get_arr(g, "t.arr_empty", BT_GGUF_TYPE_UINT64, &a), BT_OK);
    ck_assert_int_eq(a->n, 0);
    ck_assert_int_eq(bt_gguf_get_arr(g, "t.arr_str", BT_GGUF_TYPE_STRING, &a), BT_OK);
    ck_assert_int_eq(a->n, 5);
    for (int i = 0; i < 5; i++) {
        struct bt_gguf_str x = bt_gguf_arr_str(g, a, (uint64_t)i);
        ck_assert_int_eq(x.n, strlen(k_strs[i]));
        ck_assert(!memcmp(x.data, k_strs[i], x.n));
    }
}

START_TEST(test_roundtrip) {
    struct bt_gguf_writer *w;
    char err[BT_GGUF_ERR_LEN];
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_str(w, "general.architecture", "llama"), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u8(w, "t.u8", 250), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_i8(w, "t.i8", -120), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u16(w, "t.u16", 65000), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_i16(w, "t.i16", -32000), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u32(w, "t.u32", 4000000000u), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_i32(w, "t.i32", -2000000000), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_i64(w, "t.i64", -9000000000000000000ll), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_f32(w, "t.f32", 1.5e-3f), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_f64(w, "t.f64", -2.25e300), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_bool(w, "t.bool", true), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u32(w, "general.alignment", 64), BT_OK);
    int32_t ai[5] = {1, -2, 3, -4, 5};
    float af[3] = {0.5f, -1.0f, 3.25f};
    uint8_t ab[4] = {1, 0, 0, 1};
    ck_assert_int_eq(bt_gguf_writer_set_arr(w, "t.arr_i32", BT_GGUF_TYPE_INT32, ai, 5), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_arr(w, "t.arr_f32", BT_GGUF_TYPE_FLOAT32, af, 3), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_arr(w, "t.arr_bool", BT_GGUF_TYPE_BOOL, ab, 4), BT_OK);
    float afx[4] = {3e38f, -3e38f, NAN, -2.75f};
    ck_assert_int_eq(bt_gguf_writer_set_arr(w, "t.arr_f32x", BT_GGUF_TYPE_FLOAT32, afx, 4), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_arr(w, "t.arr_empty", BT_GGUF_TYPE_UINT64, NULL, 0), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_arr_str(w, "t.arr_str", k_strs, 5), BT_OK);

    /* tensors: f32 [32,3], f16 [64], q8_0 [64,2,2], q4_k (no baton kernels) [256,1,1,2] */
    float f32[96];
    for (int i = 0; i < 96; i++) f32[i] = (float)i * 0.25f - 7.0f;
    uint16_t f16[64];
    for (int i = 0; i < 64; i++) f16[i] = bt_fp32_to_fp16((float)i);
    uint8_t q8[4 * 2 * 34], q4k[2 * 144];
    for (size_t i = 0; i < sizeof q8; i++) q8[i] = (uint8_t)(i * 7);
    for (size_t i = 0; i < sizeof q4k; i++) q4k[i] = (uint8_t)(i * 13 + 1);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "token_embd.weight", 0, 2, (int64_t[]){32, 3}, f32), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", 1, 1, (int64_t[]){64}, f16), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "blk.1.ffn_up.weight", 8, 3, (int64_t[]){64, 2, 2}, q8), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "blk.0.ffn_down.weight", 12, 4, (int64_t[]){256, 1, 1, 2}, q4k),
                     BT_OK);
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
    ck_assert_int_eq(files_in_dir(), 1);

    struct bt_gguf *g;
    ck_assert_msg(bt_gguf_open(g_path, &g, err, sizeof err) == BT_OK, "%s", err);
    ck_assert_int_eq(bt_gguf_version(g), 3);
    ck_assert_int_eq(bt_gguf_alignment(g), 64);
    ck_assert_int_eq(bt_gguf_n_kv(g), 19);
    ck_assert_int_eq(bt_gguf_data_offset(g) % 64, 0);
    check_roundtrip_keys(g, ai, ab);

    ck_assert_int_eq(bt_gguf_n_tensors(g), 4);
    const struct bt_gguf_tensor *t = bt_gguf_tensor(g, 0);
    ck_assert_str_eq(t->name, "token_embd.weight");
    ck_assert_int_eq(t->type, BT_TYPE_F32);
    ck_assert_int_eq(t->n_dims, 2);
    ck_assert(t->ne[0] == 32 && t->ne[1] == 3 && t->ne[2] == 1 && t->ne[3] == 1);
    ck_assert_int_eq(t->size, sizeof f32);
    ck_assert_int_eq(t->layer, -1);
    ck_assert(!memcmp(bt_gguf_tensor_data(g, t), f32, sizeof f32));
    t = bt_gguf_tensor(g, bt_gguf_find_tensor(g, "blk.0.attn_norm.weight"));
    ck_assert_int_eq(t->type, BT_TYPE_F16);
    ck_assert_int_eq(t->layer, 0);
    ck_assert(!memcmp(bt_gguf_tensor_data(g, t), f16, sizeof f16));
    t = bt_gguf_tensor(g, 2);
    ck_assert_int_eq(t->type, BT_TYPE_Q8_0);
    ck_assert_int_eq(t->size, sizeof q8);
    ck_assert_int_eq(t->layer, 1);
    ck_assert(!memcmp(bt_gguf_tensor_data(g, t), q8, sizeof q8));
    t = bt_gguf_tensor(g, 3);
    ck_assert_int_eq(t->ggml_type, 12);
    ck_assert_int_eq(t->n_dims, 4);
    ck_assert_int_eq(t->size, sizeof q4k);
    ck_assert(!memcmp(bt_gguf_tensor_data(g, t), q4k, sizeof q4k));
    for (int i = 0; i < 4; i++) {
        t = bt_gguf_tensor(g, i);
        ck_assert_int_eq(t->offset % 64, 0);
        ck_assert_int_eq(((uintptr_t)bt_gguf_tensor_data(g, t)) % 64, 0);
    }
    ck_assert_int_eq(bt_gguf_find_tensor(g, "nope"), -1);

    /* layers: 0 holds attn_norm and ffn_down (file order), 1 holds ffn_up */
    ck_assert_int_eq(bt_gguf_n_layers(g), 2);
    const int64_t *idx;
    ck_assert_int_eq(bt_gguf_layer_tensors(g, 0, &idx), 2);
    ck_assert(idx[0] == 1 && idx[1] == 3);
    ck_assert_int_eq(bt_gguf_layer_tensors(g, 1, &idx), 1);
    ck_assert_int_eq(idx[0], 2);
    ck_assert_int_eq(bt_gguf_layer_tensors(g, -1, &idx), 1);
    ck_assert_int_eq(idx[0], 0);
    ck_assert_int_eq(bt_gguf_layer_tensors(g, 7, &idx), 0);
    ck_assert_int_eq(bt_gguf_layer_bytes(g, 0), sizeof f16 + sizeof q4k);
    bt_gguf_close(g);
}
END_TEST

/* the getters' messages: a missing key, another type, an array of another type */
START_TEST(test_getter_errors) {
    struct bt_gguf_writer *w;
    char err[BT_GGUF_ERR_LEN];
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_i32(w, "llama.block_count", 4), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_arr(w, "tokenizer.ggml.scores", BT_GGUF_TYPE_FLOAT32, (float[]){1}, 1),
                     BT_OK);
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
    struct bt_gguf *g;
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_OK);
    uint32_t u;
    char want[PATH_MAX + 200];
    ck_assert_int_eq(bt_gguf_get_u32(g, "llama.block_count", &u), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: offset 24: key \"llama.block_count\" is int32, not uint32", g_path);
    ck_assert_str_eq(bt_gguf_error(g), want);
    ck_assert_int_eq(bt_gguf_get_u32(g, "llama.context_length", &u), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: key \"llama.context_length\" not found", g_path);
    ck_assert_str_eq(bt_gguf_error(g), want);
    struct bt_gguf_str s;
    ck_assert_int_eq(bt_gguf_get_str(g, "tokenizer.ggml.scores", &s), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: offset 57: key \"tokenizer.ggml.scores\" is an array of float32, not string",
             g_path);
    ck_assert_str_eq(bt_gguf_error(g), want);
    const struct bt_gguf_value *a;
    ck_assert_int_eq(bt_gguf_get_arr(g, "tokenizer.ggml.scores", BT_GGUF_TYPE_STRING, &a), BT_ERR_INVALID);
    snprintf(want, sizeof want,
             "%s: offset 57: key \"tokenizer.ggml.scores\" is an array of float32, not of string", g_path);
    ck_assert_str_eq(bt_gguf_error(g), want);
    ck_assert_int_eq(bt_gguf_get_arr(g, "tokenizer.ggml.scores", BT_GGUF_TYPE_COUNT, &a), BT_OK);
    bt_gguf_close(g);
}
END_TEST

/* A type baton has no kernels for is listed; asking for baton's type names it. */
START_TEST(test_unsupported_type) {
    struct bt_gguf_writer *w;
    char err[BT_GGUF_ERR_LEN];
    uint8_t q6k[210] = {0};
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "blk.3.attn_q.weight", 29 /* IQ1_M */, 1, (int64_t[]){256}, q6k),
                     BT_OK);
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
    struct bt_gguf *g;
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_OK);
    const struct bt_gguf_tensor *t = bt_gguf_tensor(g, 0);
    ck_assert_int_eq(t->size, 56);
    enum bt_type bt;
    ck_assert_int_eq(bt_gguf_tensor_bt_type(g, t, &bt), BT_ERR_UNSUPPORTED);
    char want[PATH_MAX + 200];
    snprintf(want, sizeof want, "%s: offset 24: tensor \"blk.3.attn_q.weight\": type IQ1_M is not supported by baton (",
             g_path);
    ck_assert_msg(!strncmp(bt_gguf_error(g), want, strlen(want)), "%s", bt_gguf_error(g));
    bt_gguf_close(g);
}
END_TEST

/* The type table: every baton type maps to its GGUF number and back, and the
 * block sizes are ggml's. */
START_TEST(test_type_table) {
    for (int t = 0; t < BT_TYPE_COUNT; t++) {
        uint32_t id = bt_ggml_type_from_bt((enum bt_type)t);
        ck_assert_int_eq(bt_ggml_type_to_bt(id), t);
        const struct bt_ggml_type_info *info = bt_ggml_type_info(id);
        ck_assert_int_eq(info->blck_size, bt_blck_size((enum bt_type)t));
        ck_assert_int_eq(info->type_size, bt_type_size((enum bt_type)t));
    }
    ck_assert_int_eq(bt_ggml_type_from_bt(BT_TYPE_F32), 0);
    ck_assert_int_eq(bt_ggml_type_from_bt(BT_TYPE_F16), 1);
    ck_assert_int_eq(bt_ggml_type_from_bt(BT_TYPE_Q4_0), 2);
    ck_assert_int_eq(bt_ggml_type_from_bt(BT_TYPE_Q8_0), 8);
    ck_assert_int_eq(bt_ggml_type_from_bt(BT_TYPE_I32), 26);
    ck_assert_int_eq(bt_ggml_type_from_bt(BT_TYPE_BF16), 30);
    ck_assert_ptr_null(bt_ggml_type_info(4));
    ck_assert_ptr_null(bt_ggml_type_info(31));
    ck_assert_int_eq(bt_ggml_type_info(14)->type_size, 210);
    ck_assert_int_eq(bt_ggml_type_info(10)->type_size, 84);
    ck_assert_int_eq(bt_ggml_type_info(3)->type_size, 20);
    ck_assert_int_eq(bt_ggml_type_info(15)->type_size, 292);
}
END_TEST

/* Streaming: headers first, then each tensor's data in order. */
START_TEST(test_stream) {
    struct bt_gguf_writer *w;
    char err[BT_GGUF_ERR_LEN];
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "a", 0, 1, (int64_t[]){3}, NULL), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "b", 0, 1, (int64_t[]){5}, NULL), BT_OK);
    float x[5] = {1, 2, 3, 4, 5};
    ck_assert_int_eq(bt_gguf_writer_write_data(w, x, 12), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_write_data(w, x, 12), BT_ERR_INVALID);
    char want[PATH_MAX + 200];
    snprintf(want, sizeof want, "%s: tensor \"b\": 12 bytes of data given, it holds 20", g_path);
    ck_assert_str_eq(bt_gguf_writer_error(w), want);
    ck_assert_int_eq(bt_gguf_writer_write_data(w, x, 20), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
    struct bt_gguf *g;
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_tensor(g, 1)->offset, 32);
    ck_assert(!memcmp(bt_gguf_tensor_data(g, bt_gguf_tensor(g, 1)), x, 20));
    bt_gguf_close(g);
}
END_TEST

/* A write that fails or is abandoned leaves nothing behind; a file already
 * there stays as it was. */
START_TEST(test_no_half_file) {
    struct bt_gguf_writer *w;
    char err[BT_GGUF_ERR_LEN], want[PATH_MAX + 200];
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "a", 0, 1, (int64_t[]){3}, NULL), BT_OK);
    ck_assert_int_eq(files_in_dir(), 1); /* the temporary file */
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: tensor \"a\" has no data (neither given to add_tensor nor written)", g_path);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(files_in_dir(), 0);

    FILE *f = fopen(g_path, "wb");
    fputs("old", f);
    fclose(f);
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u32(w, "x", 1), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_u32(w, "x", 2), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: key \"x\" set twice", g_path);
    ck_assert_str_eq(bt_gguf_writer_error(w), want);
    ck_assert_int_eq(bt_gguf_writer_set_u32(w, "general.alignment", 48), BT_ERR_INVALID);
    ck_assert_int_eq(bt_gguf_writer_set_i32(w, "general.alignment", 64), BT_ERR_INVALID);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "q", 8, 1, (int64_t[]){33}, NULL), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: tensor \"q\": dimension 0 (33) is not a multiple of Q8_0's block size 32", g_path);
    ck_assert_str_eq(bt_gguf_writer_error(w), want);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "q", 4, 1, (int64_t[]){32}, NULL), BT_ERR_INVALID);
    ck_assert_int_eq(bt_gguf_writer_add_tensor(w, "q", 0, 1, (int64_t[]){0}, NULL), BT_ERR_INVALID);
    bt_gguf_writer_close(w);
    ck_assert_int_eq(files_in_dir(), 1);
    f = fopen(g_path, "rb");
    char buf[8] = {0};
    ck_assert_int_eq(fread(buf, 1, 8, f), 3);
    fclose(f);
    ck_assert_str_eq(buf, "old");

    /* a folder that does not exist */
    char bad[PATH_MAX + 64];
    snprintf(bad, sizeof bad, "%s/no/such/m.gguf", g_dir);
    ck_assert_int_eq(bt_gguf_writer_open(bad, &w, err, sizeof err), BT_ERR_IO);
    snprintf(want, sizeof want, "%s: cannot create a temporary file beside it: No such file or directory", bad);
    ck_assert_str_eq(err, want);
}
END_TEST

/* A reader copies a value of any type (nested arrays too) into a writer. */
START_TEST(test_copy_values) {
    /* source: built by hand with a nested array (the writer has no nested setter) */
    static const uint8_t src[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        /* key "n" */ 1, 0, 0, 0, 0, 0, 0, 0, 'n', 9, 0, 0, 0,
        /* array of 2 arrays */ 9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
        /* [int32 7] */ 5, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0,
        /* ["hi"] */ 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 'h', 'i'};
    struct bt_gguf *g, *h;
    char err[BT_GGUF_ERR_LEN];
    ck_assert_msg(bt_gguf_open_memory(src, sizeof src, "src", &g, err, sizeof err) == BT_OK, "%s", err);
    const struct bt_gguf_value *v = bt_gguf_kv_value(g, 0);
    ck_assert_int_eq(v->type, BT_GGUF_TYPE_ARRAY);
    ck_assert_int_eq(v->elem_type, BT_GGUF_TYPE_ARRAY);
    ck_assert_int_eq(v->n, 2);
    struct bt_gguf_value e0 = bt_gguf_arr_elem(g, v, 0), e1 = bt_gguf_arr_elem(g, v, 1);
    ck_assert_int_eq(e0.elem_type, BT_GGUF_TYPE_INT32);
    struct bt_gguf_value x = bt_gguf_arr_elem(g, &e0, 0);
    ck_assert_int_eq(bt_gguf_value_i64(g, &x), 7);
    struct bt_gguf_str s = bt_gguf_arr_str(g, &e1, 0);
    ck_assert(s.n == 2 && !memcmp(s.data, "hi", 2));

    struct bt_gguf_writer *w;
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_value(w, "n", g, v), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
    ck_assert_int_eq(bt_gguf_open(g_path, &h, err, sizeof err), BT_OK);
    /* the writer pads to 32 bytes; the header and value are the same bytes */
    ck_assert_int_eq(bt_gguf_file_size(h), 96);
    ck_assert(!memcmp(bt_gguf_bytes(h), src, sizeof src));
    bt_gguf_close(h);
    bt_gguf_close(g);
}
END_TEST

/* ---- malformed files ---- */

struct fb {
    uint8_t *b;
    size_t n, cap;
};
static void put(struct fb *f, const void *p, size_t n) {
    if (f->n + n > f->cap) {
        f->cap = (f->n + n) * 2 + 64;
        f->b = realloc(f->b, f->cap);
        ck_assert_ptr_nonnull(f->b);
    }
    memcpy(f->b + f->n, p, n);
    f->n += n;
}
static void pu32(struct fb *f, uint32_t v) { put(f, &v, 4); }
static void pu64(struct fb *f, uint64_t v) { put(f, &v, 8); }
static void pstr(struct fb *f, const char *s) {
    pu64(f, strlen(s));
    put(f, s, strlen(s));
}
static void set32(struct fb *f, size_t at, uint32_t v) { memcpy(f->b + at, &v, 4); }
static void set64(struct fb *f, size_t at, uint64_t v) { memcpy(f->b + at, &v, 8); }

/* The base file: v3, 8 key-values, 3 tensors, alignment 32.  Offsets of
 * every field a case damages. */
enum { NKV = 8, NT = 3 };
struct marks {
    size_t kv[NKV], kv_type[NKV], kv_val[NKV];
    size_t str_elem1;                 /* tokens: element 1's length field */
    size_t bools_elem2;               /* test.bools: element 2 */
    size_t ti[NT], ti_nd[NT], ti_ne[NT][4], ti_type[NT], ti_off[NT];
    size_t table_end, data;
};
static const char *const k_names[NT] = {"blk.0.attn_q", "blk.1.attn_q", "output"};

static struct fb base_file(struct marks *m) {
    struct fb f = {0};
    put(&f, "GGUF", 4);
    pu32(&f, 3);
    pu64(&f, NT);
    pu64(&f, NKV);
    /* 0 */ m->kv[0] = f.n;
    pstr(&f, "general.architecture");
    m->kv_type[0] = f.n;
    pu32(&f, BT_GGUF_TYPE_STRING);
    m->kv_val[0] = f.n;
    pstr(&f, "llama");
    /* 1 */ m->kv[1] = f.n;
    pstr(&f, "llama.block_count");
    m->kv_type[1] = f.n;
    pu32(&f, BT_GGUF_TYPE_UINT32);
    m->kv_val[1] = f.n;
    pu32(&f, 2);
    /* 2 */ m->kv[2] = f.n;
    pstr(&f, "general.alignment");
    m->kv_type[2] = f.n;
    pu32(&f, BT_GGUF_TYPE_UINT32);
    m->kv_val[2] = f.n;
    pu32(&f, 32);
    /* 3 */ m->kv[3] = f.n;
    pstr(&f, "tokenizer.ggml.tokens");
    m->kv_type[3] = f.n;
    pu32(&f, BT_GGUF_TYPE_ARRAY);
    m->kv_val[3] = f.n;
    pu32(&f, BT_GGUF_TYPE_STRING);
    pu64(&f, 3);
    pstr(&f, "a");
    m->str_elem1 = f.n;
    pstr(&f, "bc");
    pstr(&f, "def");
    /* 4 */ m->kv[4] = f.n;
    pstr(&f, "tokenizer.ggml.scores");
    m->kv_type[4] = f.n;
    pu32(&f, BT_GGUF_TYPE_ARRAY);
    m->kv_val[4] = f.n;
    pu32(&f, BT_GGUF_TYPE_FLOAT32);
    pu64(&f, 3);
    for (int i = 0; i < 3; i++) pu32(&f, 0x3f800000u);
    /* 5 */ m->kv[5] = f.n;
    pstr(&f, "test.bool");
    m->kv_type[5] = f.n;
    pu32(&f, BT_GGUF_TYPE_BOOL);
    m->kv_val[5] = f.n;
    put(&f, "\x01", 1);
    /* 6 */ m->kv[6] = f.n;
    pstr(&f, "test.bools");
    m->kv_type[6] = f.n;
    pu32(&f, BT_GGUF_TYPE_ARRAY);
    m->kv_val[6] = f.n;
    pu32(&f, BT_GGUF_TYPE_BOOL);
    pu64(&f, 3);
    m->bools_elem2 = f.n + 2;
    put(&f, "\x01\x00\x01", 3);
    /* 7 */ m->kv[7] = f.n;
    pstr(&f, "test.dupy");
    m->kv_type[7] = f.n;
    pu32(&f, BT_GGUF_TYPE_INT32);
    m->kv_val[7] = f.n;
    pu32(&f, 5);
    /* tensors: f32 [32,2] at 0 (256 B), q8_0 [32,2] at 256 (68 B), f16 [64] at 352 (128 B) */
    static const uint32_t types[NT] = {0, 8, 1};
    static const uint64_t ne[NT][2] = {{32, 2}, {32, 2}, {64, 1}};
    static const uint32_t nd[NT] = {2, 2, 1};
    static const uint64_t off[NT] = {0, 256, 352};
    for (int i = 0; i < NT; i++) {
        m->ti[i] = f.n;
        pstr(&f, k_names[i]);
        m->ti_nd[i] = f.n;
        pu32(&f, nd[i]);
        for (uint32_t d = 0; d < nd[i]; d++) {
            m->ti_ne[i][d] = f.n;
            pu64(&f, ne[i][d]);
        }
        m->ti_type[i] = f.n;
        pu32(&f, types[i]);
        m->ti_off[i] = f.n;
        pu64(&f, off[i]);
    }
    m->table_end = f.n;
    while (f.n % 32) put(&f, "", 1);
    m->data = f.n;
    for (int i = 0; i < 480; i++) put(&f, "\x3c", 1);
    return f;
}

/* open an exact-size heap copy of f's first n bytes under the name "m.gguf";
 * returns the status, the message in err */
static enum bt_status open_bytes(const struct fb *f, size_t n, char *err, size_t n_err) {
    uint8_t *copy = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, f->b, n);
    struct bt_gguf *g = NULL;
    err[0] = 0;
    enum bt_status st = bt_gguf_open_memory(copy, n, "m.gguf", &g, err, n_err);
    if (st == BT_OK) bt_gguf_close(g);
    else ck_assert_ptr_null(g);
    free(copy);
    return st;
}

#define EXPECT(f, n, ...)                                                                          \
    do {                                                                                           \
        char err_[1024], want_[1024];                                                              \
        snprintf(want_, sizeof want_, __VA_ARGS__);                                               \
        enum bt_status st_ = open_bytes(f, n, err_, sizeof err_);                                  \
        ck_assert_msg(st_ == BT_ERR_INVALID, "case at line %d: status %d, err \"%s\"", __LINE__, st_, err_); \
        ck_assert_msg(!strcmp(err_, want_), "case at line %d:\n got  %s\n want %s", __LINE__, err_, want_); \
        n_cases++;                                                                                 \
    } while (0)

/* each case starts from a fresh copy of the base file */
#define CASE(stmt, ...)                                                                            \
    do {                                                                                           \
        struct fb f = base_file(&m);                                                               \
        size_t n = f.n;                                                                            \
        stmt;                                                                                      \
        EXPECT(&f, n, __VA_ARGS__);                                                                \
        free(f.b);                                                                                 \
    } while (0)

START_TEST(test_malformed) {
    struct marks m;
    int n_cases = 0;
    {
        struct fb f = base_file(&m);
        char err[1024];
        ck_assert_msg(open_bytes(&f, f.n, err, sizeof err) == BT_OK, "base file: %s", err);
        free(f.b);
    }
    /* header */
    CASE(n = 0, "m.gguf: offset 0: file is 0 bytes, too short for a GGUF header");
    CASE(n = 3, "m.gguf: offset 0: file is 3 bytes, too short for a GGUF header");
    CASE(f.b[3] = 'G', "m.gguf: offset 0: not a GGUF file (magic \"GGUG\", expected \"GGUF\")");
    CASE(memcpy(f.b, "\x7f" "ELF", 4), "m.gguf: offset 0: not a GGUF file (magic \"\\x7fELF\", expected \"GGUF\")");
    CASE(n = 6, "m.gguf: offset 4: version truncated: 4 bytes needed, 2 left in the file");
    CASE(set32(&f, 4, 1), "m.gguf: offset 4: GGUF version 1 is not supported (versions 2 and 3 are)");
    CASE(set32(&f, 4, 0), "m.gguf: offset 4: unsupported GGUF version 0 (versions 2 and 3 are)");
    CASE(set32(&f, 4, 4), "m.gguf: offset 4: unsupported GGUF version 4 (versions 2 and 3 are)");
    CASE(set32(&f, 4, 0x03000000u),
         "m.gguf: offset 4: big-endian GGUF file (version 3 byte-swapped); only little-endian files are read");
    CASE(n = 12, "m.gguf: offset 8: tensor count truncated: 8 bytes needed, 4 left in the file");
    CASE(n = 20, "m.gguf: offset 16: key-value count truncated: 8 bytes needed, 4 left in the file");
    CASE(set64(&f, 8, 1ull << 40),
         "m.gguf: offset 8: tensor count 1099511627776 cannot fit in the %zu bytes after the header", n - 24);
    CASE(set64(&f, 16, UINT64_MAX),
         "m.gguf: offset 16: key-value count 18446744073709551615 cannot fit in the %zu bytes after the header", n - 24);
    /* keys */
    CASE(n = m.kv[0] + 3, "m.gguf: offset 8: tensor count 3 cannot fit in the 3 bytes after the header");
    CASE(n = m.kv[1] + 3; set64(&f, 8, 0); set64(&f, 16, 2),
         "m.gguf: offset %zu: key 1 length truncated: 8 bytes needed, 3 left in the file", m.kv[1]);
    CASE(set64(&f, m.kv[0], UINT64_MAX),
         "m.gguf: offset 24: key 0 of 18446744073709551615 bytes runs past the end of the file (%zu bytes left)",
         n - 32);
    CASE(set64(&f, m.kv[1], 0), "m.gguf: offset %zu: key 1 is empty", m.kv[1]);
    CASE(f.b[m.kv[1] + 8 + 5] = 0, "m.gguf: offset %zu: key \"llama\\x00block_count\": key contains a NUL byte",
         m.kv[1]);
    CASE(memcpy(f.b + m.kv[7] + 8, "llama.bl", 8); set64(&f, m.kv[7], 8),
         "m.gguf: offset %zu: key \"llama.bl\": unknown value type 1401", m.kv[7] + 16); /* 'y' 5 0 0 */
    CASE(memcpy(f.b + m.kv[5] + 8, "test.dupy", 9),
         "m.gguf: offset %zu: key \"test.dupy\": key appears twice (first at offset %zu)", m.kv[7], m.kv[5]);
    CASE(memcpy(f.b + m.kv[7] + 8, "test.bool", 9),
         "m.gguf: offset %zu: key \"test.bool\": key appears twice (first at offset %zu)", m.kv[7], m.kv[5]);
    CASE(set32(&f, m.kv_type[1], 13), "m.gguf: offset %zu: key \"llama.block_count\": unknown value type 13",
         m.kv_type[1]);
    CASE(n = m.kv_type[1] + 2; set64(&f, 8, 0); set64(&f, 16, 2),
         "m.gguf: offset %zu: key \"llama.block_count\": value type truncated: 4 bytes needed, 2 left in the file",
         m.kv_type[1]);
    CASE(n = m.kv_val[1] + 1; set64(&f, 8, 0); set64(&f, 16, 2),
         "m.gguf: offset %zu: key \"llama.block_count\": uint32 truncated: 4 bytes needed, 1 left in the file",
         m.kv_val[1]);
    /* strings */
    CASE(set64(&f, m.kv_val[0], 1ull << 62),
         "m.gguf: offset %zu: key \"general.architecture\": string of 4611686018427387904 bytes runs past the end of "
         "the file (%zu bytes left)",
         m.kv_val[0], n - m.kv_val[0] - 8);
    CASE(n = m.kv_val[0] + 10; set64(&f, 8, 0); set64(&f, 16, 1),
         "m.gguf: offset %zu: key \"general.architecture\": string of 5 bytes runs past the end of the file (2 bytes "
         "left)",
         m.kv_val[0]);
    ck_assert_msg(n_cases >= 26, "%d cases", n_cases);
}
END_TEST

/* the damaged files' arrays, alignment, tensor table and data section */
START_TEST(test_malformed_tables) {
    struct marks m;
    int n_cases = 0;
    {
        struct fb f = base_file(&m);
        char err[1024];
        ck_assert_msg(open_bytes(&f, f.n, err, sizeof err) == BT_OK, "base file: %s", err);
        free(f.b);
    }
    /* arrays */
    CASE(set32(&f, m.kv_val[4], 99), "m.gguf: offset %zu: key \"tokenizer.ggml.scores\": unknown array element type 99",
         m.kv_val[4]);
    CASE(set64(&f, m.kv_val[4] + 4, 1ull << 61),
         "m.gguf: offset %zu: key \"tokenizer.ggml.scores\": array of 2305843009213693952 float32 elements needs at "
         "least 2305843009213693952x4 bytes, %zu left in the file",
         m.kv_val[4] + 4, n - m.kv_val[4] - 12);
    CASE(n = m.kv_val[4] + 12 + 5; set64(&f, 8, 0); set64(&f, 16, 5),
         "m.gguf: offset %zu: key \"tokenizer.ggml.scores\": array of 3 float32 elements needs at least 3x4 bytes, "
         "5 left in the file",
         m.kv_val[4] + 4);
    CASE(set64(&f, m.kv_val[3] + 4, UINT64_MAX / 2),
         "m.gguf: offset %zu: key \"tokenizer.ggml.tokens\": array of 9223372036854775807 string elements needs at "
         "least 9223372036854775807x8 bytes, %zu left in the file",
         m.kv_val[3] + 4, n - m.kv_val[3] - 12);
    CASE(set64(&f, m.str_elem1, 1000),
         "m.gguf: offset %zu: key \"tokenizer.ggml.tokens\": string of 1000 bytes runs past the end of the file (%zu "
         "bytes left)",
         m.str_elem1, n - m.str_elem1 - 8);
    CASE(n = m.kv_val[3] + 7,
         "m.gguf: offset %zu: key \"tokenizer.ggml.tokens\": array length truncated: 8 bytes needed, 3 left in the file",
         m.kv_val[3] + 4);
    CASE(f.b[m.kv_val[5]] = 2, "m.gguf: offset %zu: key \"test.bool\": bool value is 2, not 0 or 1", m.kv_val[5]);
    CASE(f.b[m.bools_elem2] = 0xff,
         "m.gguf: offset %zu: key \"test.bools\": bool array element 2 is 255, not 0 or 1", m.bools_elem2);
    /* general.alignment */
    CASE(set32(&f, m.kv_type[2], BT_GGUF_TYPE_INT32),
         "m.gguf: offset %zu: key \"general.alignment\": is int32, must be uint32", m.kv_val[2]);
    CASE(set32(&f, m.kv_val[2], 0),
         "m.gguf: offset %zu: key \"general.alignment\": alignment 0 is not a power of two", m.kv_val[2]);
    CASE(set32(&f, m.kv_val[2], 48),
         "m.gguf: offset %zu: key \"general.alignment\": alignment 48 is not a power of two", m.kv_val[2]);
    CASE(set32(&f, m.kv_val[2], 64),
         "m.gguf: offset %zu: tensor \"output\": data offset 352 is not a multiple of the alignment 64", m.ti_off[2]);
    /* tensor table */
    CASE(n = m.ti[0] + 4, "m.gguf: offset %zu: tensor 0 name length truncated: 8 bytes needed, 4 left in the file",
         m.ti[0]);
    CASE(set64(&f, m.ti[1], 1ull << 50),
         "m.gguf: offset %zu: tensor 1 name of 1125899906842624 bytes runs past the end of the file (%zu bytes left)",
         m.ti[1], n - m.ti[1] - 8);
    CASE(set64(&f, m.ti[1], 0), "m.gguf: offset %zu: tensor 1 has an empty name", m.ti[1]);
    CASE(f.b[m.ti[2] + 8 + 2] = 0, "m.gguf: offset %zu: tensor \"ou\\x00put\": name contains a NUL byte", m.ti[2]);
    CASE(f.b[m.ti[1] + 8 + 4] = '0',
         "m.gguf: offset %zu: tensor \"blk.0.attn_q\": name appears twice (first at offset %zu)", m.ti[1], m.ti[0]);
    CASE(set32(&f, m.ti_nd[1], 5), "m.gguf: offset %zu: tensor \"blk.1.attn_q\": 5 dimensions (at most 4)",
         m.ti_nd[1]);
    CASE(set32(&f, m.ti_nd[1], UINT32_MAX),
         "m.gguf: offset %zu: tensor \"blk.1.attn_q\": 4294967295 dimensions (at most 4)", m.ti_nd[1]);
    CASE(set64(&f, m.ti_ne[1][0], 0), "m.gguf: offset %zu: tensor \"blk.1.attn_q\": dimension 0 is 0",
         m.ti_ne[1][0]);
    CASE(set64(&f, m.ti_ne[0][1], 0), "m.gguf: offset %zu: tensor \"blk.0.attn_q\": dimension 1 is 0",
         m.ti_ne[0][1]);
    CASE(set64(&f, m.ti_ne[0][1], UINT64_MAX),
         "m.gguf: offset %zu: tensor \"blk.0.attn_q\": dimension 1 is negative (-1)", m.ti_ne[0][1]);
    CASE(n = m.ti_ne[0][1] + 5,
         "m.gguf: offset %zu: tensor \"blk.0.attn_q\": dimension 1 truncated: 8 bytes needed, 5 left in the file",
         m.ti_ne[0][1]);
    CASE(set32(&f, m.ti_type[2], 99), "m.gguf: offset %zu: tensor \"output\": unknown tensor type 99", m.ti_type[2]);
    CASE(set32(&f, m.ti_type[2], 4), "m.gguf: offset %zu: tensor \"output\": unknown tensor type 4", m.ti_type[2]);
    CASE(n = m.ti_type[2] + 1,
         "m.gguf: offset %zu: tensor \"output\": type truncated: 4 bytes needed, 1 left in the file", m.ti_type[2]);
    CASE(set64(&f, m.ti_ne[1][0], 33),
         "m.gguf: offset %zu: tensor \"blk.1.attn_q\": dimension 0 (33) is not a multiple of Q8_0's block size 32",
         m.ti_nd[1]);
    CASE(set64(&f, m.ti_ne[0][0], 1ull << 32); set64(&f, m.ti_ne[0][1], 1ull << 32),
         "m.gguf: offset %zu: tensor \"blk.0.attn_q\": 4294967296x4294967296x1x1 elements overflow 64 bits",
         m.ti_nd[0]);
    CASE(set64(&f, m.ti_ne[0][1], 1ull << 40),
         "m.gguf: offset %zu: tensor \"blk.0.attn_q\": 35184372088832 elements of F32 (35184372088832 blocks of 4 "
         "bytes) cannot fit in a file of %zu bytes",
         m.ti_nd[0], n);
    CASE(n = m.ti_off[2] + 7,
         "m.gguf: offset %zu: tensor \"output\": data offset truncated: 8 bytes needed, 7 left in the file",
         m.ti_off[2]);
    /* data section */
    CASE(set64(&f, m.ti_off[1], 260),
         "m.gguf: offset %zu: tensor \"blk.1.attn_q\": data offset 260 is not a multiple of the alignment 32",
         m.ti_off[1]);
    CASE(set64(&f, m.ti_off[2], 480),
         "m.gguf: offset %zu: tensor \"output\": data [480, 608) of the data section runs past the end of the file "
         "(the data section holds 480 bytes)",
         m.ti_off[2]);
    CASE(set64(&f, m.ti_off[2], UINT64_MAX - 31),
         "m.gguf: offset %zu: tensor \"output\": data [18446744073709551584, 18446744073709551615) of the data "
         "section runs past the end of the file (the data section holds 480 bytes)",
         m.ti_off[2]);
    CASE(n -= 1,
         "m.gguf: offset %zu: tensor \"output\": data [352, 480) of the data section runs past the end of the file "
         "(the data section holds 479 bytes)",
         m.ti_off[2]);
    CASE(n = m.table_end,
         "m.gguf: offset %zu: data section would start at offset %zu (aligned to 32), past the end of the file (%zu "
         "bytes)",
         m.table_end, m.data, m.table_end);
    CASE(set64(&f, m.ti_off[1], 224),
         "m.gguf: offset %zu: tensor \"blk.1.attn_q\": data [224, 292) overlaps tensor \"blk.0.attn_q\" [0, 256)",
         m.ti[1]);
    CASE(set64(&f, m.ti_off[0], 320),
         "m.gguf: offset %zu: tensor \"blk.0.attn_q\": data [320, 576) of the data section runs past the end of the "
         "file (the data section holds 480 bytes)",
         m.ti_off[0]);
    CASE(set64(&f, m.ti_off[2], 256),
         "m.gguf: offset %zu: tensor \"output\": data [256, 384) overlaps tensor \"blk.1.attn_q\" [256, 324)",
         m.ti[2]);
    ck_assert_msg(n_cases >= 38, "%d cases", n_cases);
}
END_TEST

/* arrays nested deeper than BT_GGUF_MAX_DEPTH, and a version 2 file */
START_TEST(test_nesting_and_v2) {
    for (int depth = BT_GGUF_MAX_DEPTH; depth <= BT_GGUF_MAX_DEPTH + 1; depth++) {
        struct fb f = {0};
        put(&f, "GGUF", 4);
        pu32(&f, 2);
        pu64(&f, 0);
        pu64(&f, 1);
        pstr(&f, "deep");
        pu32(&f, BT_GGUF_TYPE_ARRAY);
        size_t len_at[BT_GGUF_MAX_DEPTH + 1];
        for (int i = 0; i < depth; i++) {
            pu32(&f, i + 1 < depth ? BT_GGUF_TYPE_ARRAY : BT_GGUF_TYPE_UINT8);
            len_at[i] = f.n;
            pu64(&f, 1);
        }
        put(&f, "\x2a", 1);
        char err[1024];
        int n_cases = 0;
        if (depth <= BT_GGUF_MAX_DEPTH) {
            struct bt_gguf *g;
            ck_assert_msg(bt_gguf_open_memory(f.b, f.n, "d", &g, err, sizeof err) == BT_OK, "%s", err);
            ck_assert_int_eq(bt_gguf_version(g), 2);
            struct bt_gguf_value v = *bt_gguf_kv_value(g, 0);
            for (int i = 0; i + 1 < depth; i++) v = bt_gguf_arr_elem(g, &v, 0);
            struct bt_gguf_value x = bt_gguf_arr_elem(g, &v, 0);
            ck_assert_int_eq(bt_gguf_value_i64(g, &x), 42);
            bt_gguf_close(g);
        } else {
            EXPECT(&f, f.n, "m.gguf: offset %zu: key \"deep\": arrays nested more than %d deep", len_at[BT_GGUF_MAX_DEPTH - 1],
                   BT_GGUF_MAX_DEPTH);
        }
        free(f.b);
    }
}
END_TEST

/* open's own errors: missing file, a folder, an empty file */
START_TEST(test_open_errors) {
    struct bt_gguf *g;
    char err[1024], want[PATH_MAX + 200];
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_ERR_IO);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", g_path);
    ck_assert_str_eq(err, want);
    ck_assert_int_eq(bt_gguf_open(g_dir, &g, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: not a regular file", g_dir);
    ck_assert_str_eq(err, want);
    fclose(fopen(g_path, "wb"));
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: offset 0: file is 0 bytes, too short for a GGUF header", g_path);
    ck_assert_str_eq(err, want);
}
END_TEST

/* kB of a /proc/self/status field ("VmHWM", "RssFile") */
static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') kb = atol(line + n + 1);
    fclose(f);
    ck_assert_int_ge(kb, 0);
    return kb;
}

/* A count the header claims is not what the reader allocates: a 256 MiB
 * (sparse) file claiming 11 million tensors, of which only the first is
 * there, fails at the second with next to no memory. */
START_TEST(test_claimed_counts_not_allocated) {
    FILE *f = fopen(g_path, "wb");
    ck_assert_ptr_nonnull(f);
    uint64_t size = 256ull << 20, nt = (size - 24) / 24, zero = 0, one = 1;
    uint32_t v = 3, u1 = 1, f32 = 0;
    fwrite("GGUF", 1, 4, f);
    fwrite(&v, 4, 1, f);
    fwrite(&nt, 8, 1, f);
    fwrite(&zero, 8, 1, f);
    fwrite(&one, 8, 1, f); /* tensor 0: "a", 1 dimension of 1, F32, offset 0 */
    fwrite("a", 1, 1, f);
    fwrite(&u1, 4, 1, f);
    fwrite(&one, 8, 1, f);
    fwrite(&f32, 4, 1, f);
    fwrite(&zero, 8, 1, f);
    ck_assert_int_eq(ftruncate(fileno(f), (off_t)size), 0);
    fclose(f);
    long before = status_kb("VmHWM");
    struct bt_gguf *g;
    char err[1024], want[PATH_MAX + 100];
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_ERR_INVALID);
    snprintf(want, sizeof want, "%s: offset 57: tensor 1 has an empty name", g_path);
    ck_assert_str_eq(err, want);
    long grown = status_kb("VmHWM") - before;
    ck_assert_msg(grown < 8 * 1024, "peak memory grew by %ld kB", grown);
}
END_TEST

/* Reading one layer's tensors pages in that layer's bytes of the mapping,
 * not the others' (the file's resident pages, counted by RssFile). */
START_TEST(test_layer_touches_only_its_data) {
    enum { L = 4, N = 1 << 20 }; /* 4 layers of one 4 MiB F32 tensor */
    float *x = malloc((size_t)N * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (int i = 0; i < N; i++) x[i] = (float)(i % 1000);
    struct bt_gguf_writer *w;
    char err[BT_GGUF_ERR_LEN];
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    for (int l = 0; l < L; l++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
        ck_assert_int_eq(bt_gguf_writer_add_tensor(w, name, 0, 1, (int64_t[]){N}, x), BT_OK);
    }
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
    free(x);
    struct bt_gguf *g;
    ck_assert_int_eq(bt_gguf_open(g_path, &g, err, sizeof err), BT_OK);
    long base = status_kb("RssFile");
    const int64_t *idx;
    ck_assert_int_eq(bt_gguf_layer_tensors(g, 2, &idx), 1);
    const struct bt_gguf_tensor *t = bt_gguf_tensor(g, idx[0]);
    const volatile uint8_t *d = bt_gguf_tensor_data(g, t);
    unsigned sum = 0;
    for (uint64_t i = 0; i < t->size; i += 64) sum += d[i];
    long one = status_kb("RssFile") - base;
    for (int l = 0; l < L; l++) {
        bt_gguf_layer_tensors(g, l, &idx);
        t = bt_gguf_tensor(g, idx[0]);
        d = bt_gguf_tensor_data(g, t);
        for (uint64_t i = 0; i < t->size; i += 64) sum += d[i];
    }
    long all = status_kb("RssFile") - base;
    bt_gguf_close(g);
    /* 4096 kB for the layer, a little more for read-ahead around it */
    ck_assert_msg(one >= 4000 && one <= 4096 + 1024, "one layer: %ld kB resident (sum %u)", one, sum);
    ck_assert_msg(all >= 4 * 4000, "all layers: %ld kB resident", all);
}
END_TEST

/* The header checksum: the same for the same header, different when a header
 * byte differs, blind to the data (ranks compare it without reading weights). */
START_TEST(test_header_checksum) {
    struct marks m;
    struct fb f = base_file(&m);
    struct bt_gguf *g;
    char err[1024];
    uint64_t sum[4];
    for (int k = 0; k < 4; k++) {
        if (k == 1) f.b[f.n - 1] ^= 0xff;        /* data: the same checksum */
        if (k == 2) f.b[m.kv_val[1]] ^= 1;       /* llama.block_count 2 -> 3 */
        if (k == 3) f.b[m.ti_ne[0][0]] = 16;      /* a dimension: 32 -> 16 */
        ck_assert_msg(bt_gguf_open_memory(f.b, f.n, "m.gguf", &g, err, sizeof err) == BT_OK, "%d: %s", k, err);
        sum[k] = bt_gguf_header_checksum(g);
        bt_gguf_close(g);
    }
    ck_assert(sum[0] == sum[1]);
    ck_assert(sum[1] != sum[2] && sum[2] != sum[3] && sum[1] != sum[3]);
    /* FNV-1a 64 of the bytes before the data section, computed here */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < m.data; i++) h = (h ^ f.b[i]) * 1099511628211ull;
    ck_assert(h == sum[3]);
    free(f.b);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip);
    tcase_add_test(tc, test_getter_errors);
    tcase_add_test(tc, test_unsupported_type);
    tcase_add_test(tc, test_type_table);
    tcase_add_test(tc, test_stream);
    tcase_add_test(tc, test_no_half_file);
    tcase_add_test(tc, test_copy_values);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_malformed_tables);
    tcase_add_test(tc, test_nesting_and_v2);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_claimed_counts_not_allocated);
    tcase_add_test(tc, test_layer_touches_only_its_data);
    tcase_add_test(tc, test_header_checksum);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
