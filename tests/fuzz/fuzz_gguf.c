/* fuzz_gguf.c - libFuzzer harness for the GGUF reader (tests/fuzz/run.sh).
 *
 * Each input is opened from an exact-size heap copy (so AddressSanitizer sees
 * a read one byte past it); when it opens, every value is walked (nested
 * arrays, strings, scalars through every reader), every getter is called
 * with each key, and every tensor's first and last data bytes and its layer
 * are read: whatever the reader accepted must be safe to use.
 *
 * Linked with standalone.c it is a plain program that runs the same
 * function over files and folders given on the command line: ctest runs it
 * over tests/fuzz/crashes/ (every input that once crashed) under ASan.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static uint64_t g_sink;

static void walk(const struct bt_gguf *g, const struct bt_gguf_value *v, int depth) {
    BT_ASSERT(depth <= BT_GGUF_MAX_DEPTH);
    BT_ASSERT(v->raw_off + v->raw_size <= bt_gguf_file_size(g));
    switch (v->type) {
    case BT_GGUF_TYPE_STRING: {
        struct bt_gguf_str s = bt_gguf_value_str(g, v);
        if (s.n) g_sink += (uint8_t)s.data[0] + (uint8_t)s.data[s.n - 1];
        break;
    }
    case BT_GGUF_TYPE_ARRAY:
        for (uint64_t i = 0; i < v->n && i < 4096; i++) {
            struct bt_gguf_value e = bt_gguf_arr_elem(g, v, i);
            walk(g, &e, depth + 1);
        }
        if (v->n && bt_gguf_type_size(v->elem_type)) {
            uint8_t tmp[16];
            bt_gguf_arr_copy(g, v, v->n - 1, 1, tmp);
            g_sink += tmp[0];
        }
        if (v->n && v->elem_type == BT_GGUF_TYPE_STRING) g_sink += bt_gguf_arr_str(g, v, v->n - 1).n;
        break;
    default:
        g_sink += (uint64_t)bt_gguf_value_i64(g, v) + bt_gguf_value_u64(g, v) + (bt_gguf_value_f64(g, v) > 0);
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    struct bt_gguf *g;
    char err[BT_GGUF_ERR_LEN];
    if (bt_gguf_open_memory(copy, size, "fuzz.gguf", &g, err, sizeof err) != BT_OK) {
        BT_ASSERT(err[0] != 0 && g == NULL);
        free(copy);
        return 0;
    }
    for (int64_t i = 0; i < bt_gguf_n_kv(g); i++) {
        const char *key = bt_gguf_kv_key(g, i);
        BT_ASSERT(bt_gguf_find_key(g, key) == i);
        walk(g, bt_gguf_kv_value(g, i), 0);
        uint32_t u32;
        struct bt_gguf_str s;
        float f;
        bool b;
        const struct bt_gguf_value *a;
        g_sink += bt_gguf_get_u32(g, key, &u32) == BT_OK ? u32 : 0;
        g_sink += bt_gguf_get_str(g, key, &s) == BT_OK ? s.n : 0;
        g_sink += bt_gguf_get_f32(g, key, &f) == BT_OK ? (uint64_t)(f == f) : 0;
        g_sink += bt_gguf_get_bool(g, key, &b) == BT_OK ? b : 0;
        g_sink += bt_gguf_get_arr(g, key, BT_GGUF_TYPE_STRING, &a) == BT_OK ? a->n : 0;
    }
    uint64_t total = 0;
    for (int64_t i = 0; i < bt_gguf_n_tensors(g); i++) {
        const struct bt_gguf_tensor *t = bt_gguf_tensor(g, i);
        BT_ASSERT(bt_gguf_find_tensor(g, t->name) == i);
        BT_ASSERT(t->size > 0 && t->file_offset + t->size <= bt_gguf_file_size(g));
        BT_ASSERT(t->file_offset % bt_gguf_alignment(g) == 0);
        const uint8_t *d = bt_gguf_tensor_data(g, t);
        g_sink += d[0] + d[t->size - 1];
        enum bt_type bt;
        if (bt_gguf_tensor_bt_type(g, t, &bt) == BT_OK) BT_ASSERT(bt < BT_TYPE_COUNT);
        total += t->size;
    }
    int64_t counted = 0;
    for (int l = -1; l < bt_gguf_n_layers(g) && l < 4096; l++) {
        const int64_t *idx;
        int64_t n = bt_gguf_layer_tensors(g, l, &idx);
        for (int64_t k = 0; k < n; k++) BT_ASSERT(bt_gguf_tensor(g, idx[k])->layer == l);
        counted += n;
    }
    BT_ASSERT(bt_gguf_n_layers(g) >= 4096 || counted == bt_gguf_n_tensors(g));
    BT_ASSERT(total <= bt_gguf_file_size(g));
    bt_gguf_close(g);
    free(copy);
    return 0;
}
