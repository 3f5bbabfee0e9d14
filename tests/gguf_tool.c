/* gguf_tool.c - a helper of tests/gguf_interop.py, which compares baton's
 * GGUF reader and writer with the `gguf` Python package.
 *
 *   gguf_tool dump FILE    every key (full values, nested arrays included) and
 *                          every tensor (type, shape, offset, size, FNV-1a 64
 *                          of its bytes) in one canonical text form, which the
 *                          Python side builds independently from its own data
 *   gguf_tool write FILE   a file with every metadata type the writer sets and
 *                          tensors of several types, half of them streamed
 *
 * Canonical values: integers in decimal, floats as the hex of their bits,
 * bool 0/1, strings as "s:" + hex of their bytes, arrays as
 * "[TYPE:N:v,v,...]".
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static void put_value(const struct bt_gguf *g, const struct bt_gguf_value *v) {
    const uint8_t *b = bt_gguf_bytes(g) + v->off;
    switch (v->type) {
    case BT_GGUF_TYPE_FLOAT32: {
        uint32_t u;
        memcpy(&u, b, 4);
        printf("%08" PRIx32, u);
        break;
    }
    case BT_GGUF_TYPE_FLOAT64: {
        uint64_t u;
        memcpy(&u, b, 8);
        printf("%016" PRIx64, u);
        break;
    }
    case BT_GGUF_TYPE_UINT64: printf("%" PRIu64, bt_gguf_value_u64(g, v)); break;
    case BT_GGUF_TYPE_STRING:
        printf("s:");
        for (uint64_t i = 0; i < v->n; i++) printf("%02x", b[i]);
        break;
    case BT_GGUF_TYPE_ARRAY:
        printf("[%s:%" PRIu64 ":", bt_gguf_type_name(v->elem_type), v->n);
        for (uint64_t i = 0; i < v->n; i++) {
            struct bt_gguf_value e = bt_gguf_arr_elem(g, v, i);
            if (i) printf(",");
            put_value(g, &e);
        }
        printf("]");
        break;
    default: printf("%" PRId64, bt_gguf_value_i64(g, v)); break;
    }
}

static int dump(const char *path) {
    struct bt_gguf *g;
    char err[1024];
    if (bt_gguf_open(path, &g, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("version %" PRIu32 "\nalignment %" PRIu32 "\n", bt_gguf_version(g), bt_gguf_alignment(g));
    for (int64_t i = 0; i < bt_gguf_n_kv(g); i++) {
        const struct bt_gguf_value *v = bt_gguf_kv_value(g, i);
        printf("kv %s %s ", bt_gguf_kv_key(g, i), bt_gguf_type_name(v->type));
        put_value(g, v);
        printf("\n");
    }
    for (int64_t i = 0; i < bt_gguf_n_tensors(g); i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        const uint8_t *d = bt_gguf_tensor_data(g, t);
        uint64_t h = 1469598103934665603ull;
        for (uint64_t k = 0; k < t->size; k++) h = (h ^ d[k]) * 1099511628211ull;
        printf("tensor %s %" PRIu32 " %d ", t->name, t->ggml_type, t->n_dims);
        for (int k = 0; k < t->n_dims; k++) printf("%s%" PRId64, k ? "," : "", t->ne[k]);
        printf(" %" PRIu64 " %" PRIu64 " %016" PRIx64 "\n", t->file_offset, t->size, h);
    }
    bt_gguf_close(g);
    return 0;
}

#define CHECK(x)                                                              \
    do {                                                                      \
        if ((x) != BT_OK) {                                                   \
            fprintf(stderr, "gguf_tool: %s\n", bt_gguf_writer_error(w));      \
            bt_gguf_writer_close(w);                                          \
            return 1;                                                         \
        }                                                                     \
    } while (0)

static int write_file(const char *path) {
    struct bt_gguf_writer *w;
    char err[1024];
    if (bt_gguf_writer_open(path, &w, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    CHECK(bt_gguf_writer_set_str(w, "general.architecture", "llama"));
    CHECK(bt_gguf_writer_set_u32(w, "general.alignment", 64));
    CHECK(bt_gguf_writer_set_u8(w, "t.u8", 200));
    CHECK(bt_gguf_writer_set_i8(w, "t.i8", -100));
    CHECK(bt_gguf_writer_set_u16(w, "t.u16", 60000));
    CHECK(bt_gguf_writer_set_i16(w, "t.i16", -30000));
    CHECK(bt_gguf_writer_set_u32(w, "t.u32", 4000000000u));
    CHECK(bt_gguf_writer_set_i32(w, "t.i32", -2000000000));
    CHECK(bt_gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull));
    CHECK(bt_gguf_writer_set_i64(w, "t.i64", -9000000000000000000ll));
    CHECK(bt_gguf_writer_set_f32(w, "t.f32", -0.1f));
    CHECK(bt_gguf_writer_set_f64(w, "t.f64", 1e-300));
    CHECK(bt_gguf_writer_set_bool(w, "t.bool_t", true));
    CHECK(bt_gguf_writer_set_bool(w, "t.bool_f", false));
    CHECK(bt_gguf_writer_set_str(w, "t.str_utf8", "h\xc3\xa9llo \xe2\x96\x81w\xc3\xb6rld"));
    CHECK(bt_gguf_writer_set_str(w, "t.str_empty", ""));
    uint8_t au8[3] = {0, 1, 255};
    int8_t ai8[3] = {-128, 0, 127};
    uint16_t au16[2] = {0, 65535};
    int16_t ai16[2] = {-32768, 32767};
    uint32_t au32[2] = {0, 4294967295u};
    int32_t ai32[4] = {-1, 2, -3, 2147483647};
    uint64_t au64[2] = {0, UINT64_MAX};
    int64_t ai64[2] = {INT64_MIN, INT64_MAX};
    float af32[3] = {0.5f, -1e-30f, 3e38f};
    double af64[2] = {-0.0, 2.5};
    uint8_t abool[3] = {1, 0, 1};
    CHECK(bt_gguf_writer_set_arr(w, "a.u8", BT_GGUF_TYPE_UINT8, au8, 3));
    CHECK(bt_gguf_writer_set_arr(w, "a.i8", BT_GGUF_TYPE_INT8, ai8, 3));
    CHECK(bt_gguf_writer_set_arr(w, "a.u16", BT_GGUF_TYPE_UINT16, au16, 2));
    CHECK(bt_gguf_writer_set_arr(w, "a.i16", BT_GGUF_TYPE_INT16, ai16, 2));
    CHECK(bt_gguf_writer_set_arr(w, "a.u32", BT_GGUF_TYPE_UINT32, au32, 2));
    CHECK(bt_gguf_writer_set_arr(w, "a.i32", BT_GGUF_TYPE_INT32, ai32, 4));
    CHECK(bt_gguf_writer_set_arr(w, "a.u64", BT_GGUF_TYPE_UINT64, au64, 2));
    CHECK(bt_gguf_writer_set_arr(w, "a.i64", BT_GGUF_TYPE_INT64, ai64, 2));
    CHECK(bt_gguf_writer_set_arr(w, "a.f32", BT_GGUF_TYPE_FLOAT32, af32, 3));
    CHECK(bt_gguf_writer_set_arr(w, "a.f64", BT_GGUF_TYPE_FLOAT64, af64, 2));
    CHECK(bt_gguf_writer_set_arr(w, "a.bool", BT_GGUF_TYPE_BOOL, abool, 3));
    const char *strs[4] = {"<unk>", "", "\xe2\x96\x81the", "a b"};
    CHECK(bt_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, 4));

    /* tensors: f32 [8,3], f16 [16], bf16 [4,2], q8_0 [64,2], q4_0 [32,1,2], q6_k [256,2],
     * q4_k [512], i32 [5]; data bytes from a counter */
    static const struct {
        const char *name;
        uint32_t type;
        int nd;
        int64_t ne[4];
    } ts[] = {
        {"token_embd.weight", 0, 2, {8, 3}},       {"blk.0.attn_norm.weight", 1, 1, {16}},
        {"blk.0.attn_q.weight", 30, 2, {4, 2}},    {"blk.0.ffn_up.weight", 8, 2, {64, 2}},
        {"blk.1.ffn_down.weight", 2, 3, {32, 1, 2}}, {"blk.1.ffn_gate.weight", 14, 2, {256, 2}},
        {"output.weight", 12, 1, {512}},           {"ids", 26, 1, {5}},
    };
    enum { NT = sizeof ts / sizeof ts[0] };
    uint8_t *data[NT];
    uint64_t size[NT];
    for (int i = 0; i < NT; i++) {
        const struct bt_ggml_type_info *info = bt_ggml_type_info(ts[i].type);
        int64_t ne = 1;
        for (int d = 0; d < ts[i].nd; d++) ne *= ts[i].ne[d];
        size[i] = (uint64_t)(ne / info->blck_size) * info->type_size;
        data[i] = malloc(size[i]);
        for (uint64_t k = 0; k < size[i]; k++) data[i][k] = (uint8_t)(k * 31 + (uint64_t)i * 7 + 3);
        /* the first half streamed, the rest given here and written by finish */
        CHECK(bt_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].nd, ts[i].ne, i < NT / 2 ? NULL : data[i]));
    }
    for (int i = 0; i < NT / 2; i++) CHECK(bt_gguf_writer_write_data(w, data[i], size[i]));
    enum bt_status st = bt_gguf_writer_finish(w, err, sizeof err);
    for (int i = 0; i < NT; i++) free(data[i]);
    if (st != BT_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}

/* small files for the fuzzer to start from: several shapes of header */
static int write_seeds(const char *dir) {
    char path[4096], err[1024];
    struct bt_gguf_writer *w;
    float f[64];
    for (int i = 0; i < 64; i++) f[i] = (float)i;
    uint8_t blocks[4 * 210];
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (uint8_t)i;

    snprintf(path, sizeof path, "%s/full.gguf", dir);
    if (write_file(path)) return 1;

    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    if (bt_gguf_writer_open(path, &w, err, sizeof err) != BT_OK) return 1;
    if (bt_gguf_writer_finish(w, err, sizeof err) != BT_OK) return 1;

    snprintf(path, sizeof path, "%s/layers.gguf", dir);
    if (bt_gguf_writer_open(path, &w, err, sizeof err) != BT_OK) return 1;
    const char *toks[6] = {"a", "b", "cd", "<s>", "", "xyz"};
    CHECK(bt_gguf_writer_set_str(w, "general.architecture", "llama"));
    CHECK(bt_gguf_writer_set_u32(w, "llama.block_count", 2));
    CHECK(bt_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f));
    CHECK(bt_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 6));
    CHECK(bt_gguf_writer_set_arr(w, "tokenizer.ggml.scores", BT_GGUF_TYPE_FLOAT32, f, 6));
    CHECK(bt_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", 0, 2, (int64_t[]){8, 2}, f));
    CHECK(bt_gguf_writer_add_tensor(w, "blk.1.attn_q.weight", 8, 1, (int64_t[]){32}, blocks));
    CHECK(bt_gguf_writer_add_tensor(w, "output.weight", 2, 1, (int64_t[]){64}, blocks));
    if (bt_gguf_writer_finish(w, err, sizeof err) != BT_OK) return 1;

    snprintf(path, sizeof path, "%s/kquant.gguf", dir);
    if (bt_gguf_writer_open(path, &w, err, sizeof err) != BT_OK) return 1;
    CHECK(bt_gguf_writer_set_u32(w, "general.alignment", 8));
    CHECK(bt_gguf_writer_add_tensor(w, "blk.0.ffn_down.weight", 14, 2, (int64_t[]){256, 2}, blocks));
    CHECK(bt_gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", 10, 1, (int64_t[]){256}, blocks));
    CHECK(bt_gguf_writer_add_tensor(w, "blk.3.x", 24, 3, (int64_t[]){2, 3, 4}, blocks));
    if (bt_gguf_writer_finish(w, err, sizeof err) != BT_OK) return 1;

    /* nested arrays, copied through a reader from hand-made bytes */
    static const uint8_t src[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        1, 0, 0, 0, 0, 0, 0, 0, 'n', 9, 0, 0, 0,
        9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
        5, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0,
        8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 'h', 'i'};
    struct bt_gguf *g;
    if (bt_gguf_open_memory(src, sizeof src, "src", &g, err, sizeof err) != BT_OK) return 1;
    snprintf(path, sizeof path, "%s/nested.gguf", dir);
    if (bt_gguf_writer_open(path, &w, err, sizeof err) != BT_OK) return 1;
    if (bt_gguf_writer_set_value(w, "n", g, bt_gguf_kv_value(g, 0)) != BT_OK) return 1;
    CHECK(bt_gguf_writer_add_tensor(w, "t", 1, 1, (int64_t[]){4}, f));
    bt_gguf_close(g);
    if (bt_gguf_writer_finish(w, err, sizeof err) != BT_OK) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "seeds")) return write_seeds(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "dump")) return dump(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "write")) return write_file(argv[2]);
    fprintf(stderr, "usage: gguf_tool dump|write FILE, gguf_tool seeds DIR\n");
    return 2;
}
