/* vocab_gguf.c - a tokenizer from a GGUF file's tokenizer.ggml.* keys: reads
 * the arrays through gguf.h into a bt_vocab_spec (pointers into the file's
 * mapping) and hands it to bt_tokenizer_create.  Every key of the wrong type
 * or count is an error naming the file and the key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "../mem.h"
#include "tokenizer.h"
#include "vocab_gguf.h"

/* the value of key if present; type must be an integer (else an error) */
static enum bt_status get_int(struct bt_gguf *g, const char *key, int64_t *out, char *err, size_t errlen) {
    int64_t i = bt_gguf_find_key(g, key);
    if (i < 0) return BT_OK;
    const struct bt_gguf_value *v = bt_gguf_kv_value(g, i);
    switch (v->type) {
    case BT_GGUF_TYPE_UINT8: case BT_GGUF_TYPE_INT8: case BT_GGUF_TYPE_UINT16: case BT_GGUF_TYPE_INT16:
    case BT_GGUF_TYPE_UINT32: case BT_GGUF_TYPE_INT32: case BT_GGUF_TYPE_UINT64: case BT_GGUF_TYPE_INT64: {
        int64_t x = bt_gguf_value_i64(g, v);
        if (x < 0) {
            snprintf(err, errlen, "%s: %s = %lld is not a token id", bt_gguf_path(g), key, (long long)x);
            return BT_ERR_INVALID;
        }
        *out = x;
        return BT_OK;
    }
    default:
        snprintf(err, errlen, "%s: %s is %s, not an integer", bt_gguf_path(g), key, bt_gguf_type_name(v->type));
        return BT_ERR_INVALID;
    }
}

/* The array key, when the file has it: of elem_type t0 or t1 (4 bytes each)
 * and at least n entries (else an error naming the file and key), its first
 * n copied into *out (malloc'd; NULL when the key is absent), its type in
 * *elem. */
static enum bt_status optional_array(struct bt_gguf *g, const char *path, const char *key, int t0, int t1,
                                     const char *want, uint32_t n, void **out, int *elem, char *err, size_t errlen) {
    *out = NULL;
    const int64_t ki = bt_gguf_find_key(g, key);
    if (ki < 0) return BT_OK;
    const struct bt_gguf_value *a = bt_gguf_kv_value(g, ki);
    if (a->type != BT_GGUF_TYPE_ARRAY || ((int)a->elem_type != t0 && (int)a->elem_type != t1)) {
        snprintf(err, errlen, "%s: %s is not %s", path, key, want);
        return BT_ERR_INVALID;
    }
    if (a->n < n) {
        snprintf(err, errlen, "%s: %s has %llu entries, the vocabulary %u", path, key, (unsigned long long)a->n, n);
        return BT_ERR_INVALID;
    }
    if (!(*out = malloc((size_t)(n ? n : 1) * 4))) {
        snprintf(err, errlen, "out of memory reading the vocabulary of %s", path);
        return BT_ERR_NOMEM;
    }
    bt_gguf_arr_copy(g, a, 0, n, *out);
    *elem = (int)a->elem_type;
    return BT_OK;
}

static enum bt_status get_flag(struct bt_gguf *g, const char *key, int *out, char *err, size_t errlen) {
    if (bt_gguf_find_key(g, key) < 0) return BT_OK;
    bool b;
    if (bt_gguf_get_bool(g, key, &b) != BT_OK) {
        snprintf(err, errlen, "%s", bt_gguf_error(g));
        return BT_ERR_INVALID;
    }
    *out = b;
    return BT_OK;
}

/* a string key into buf (NUL-terminated); absent: buf = "" and *present 0 */
static enum bt_status get_string(struct bt_gguf *g, const char *key, char *buf, size_t cap, int *present, char *err,
                                 size_t errlen) {
    buf[0] = 0;
    if (present) *present = 0;
    if (bt_gguf_find_key(g, key) < 0) return BT_OK;
    struct bt_gguf_str s;
    if (bt_gguf_get_str(g, key, &s) != BT_OK) {
        snprintf(err, errlen, "%s", bt_gguf_error(g));
        return BT_ERR_INVALID;
    }
    size_t n = s.n < cap - 1 ? (size_t)s.n : cap - 1;
    memcpy(buf, s.data, n);
    buf[n] = 0;
    if (memchr(buf, 0, n)) {
        snprintf(err, errlen, "%s: %s holds a NUL byte", bt_gguf_path(g), key);
        return BT_ERR_INVALID;
    }
    if (present) *present = 1;
    return BT_OK;
}

/* strings of an array key: pointers into the mapping */
static enum bt_status get_strings(struct bt_gguf *g, const char *key, uint32_t *n, const char ***text, uint32_t **len,
                                  char *err, size_t errlen) {
    const struct bt_gguf_value *a;
    if (bt_gguf_get_arr(g, key, BT_GGUF_TYPE_STRING, &a) != BT_OK) {
        snprintf(err, errlen, "%s", bt_gguf_error(g));
        return BT_ERR_INVALID;
    }
    if (a->n > (1u << 30)) {
        snprintf(err, errlen, "%s: %s has %llu entries (at most %u)", bt_gguf_path(g), key,
                 (unsigned long long)a->n, 1u << 30);
        return BT_ERR_INVALID;
    }
    *n = (uint32_t)a->n;
    *text = malloc((a->n ? a->n : 1) * sizeof **text);
    *len = malloc((a->n ? a->n : 1) * sizeof **len);
    if (!*text || !*len) {
        snprintf(err, errlen, "out of memory reading %s", key);
        return BT_ERR_NOMEM;
    }
    for (uint64_t i = 0; i < a->n; i++) {
        struct bt_gguf_str s = bt_gguf_arr_str(g, a, i);
        if (s.n > 65536) {
            snprintf(err, errlen, "%s: %s[%llu] is %llu bytes long (at most 65536)", bt_gguf_path(g), key,
                     (unsigned long long)i, (unsigned long long)s.n);
            return BT_ERR_INVALID;
        }
        (*text)[i] = s.data;
        (*len)[i] = (uint32_t)s.n;
    }
    return BT_OK;
}

enum bt_status bt_tokenizer_from_gguf(struct bt_gguf *g, bt_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    bt_vocab_spec sp;
    bt_vocab_spec_init(&sp);
    char model[64], pre[64], name[256];
    const char **tok_text = NULL, **merge_text = NULL;
    uint32_t *tok_len = NULL, *merge_len = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    enum bt_status st;
    int present;
    const char *path = bt_gguf_path(g);

    if ((st = get_string(g, "tokenizer.ggml.model", model, sizeof model, &present, err, errlen))) goto done;
    if (!present) {
        snprintf(err, errlen, "%s: no tokenizer.ggml.model: the file has no vocabulary", path);
        st = BT_ERR_INVALID;
        goto done;
    }
    if (strcmp(model, "llama") && strcmp(model, "gpt2")) {
        snprintf(err, errlen, "%s: tokenizer.ggml.model '%s' is not supported (baton supports: llama, gpt2)", path,
                 model);
        st = BT_ERR_UNSUPPORTED;
        goto done;
    }
    sp.model = model;
    if ((st = get_string(g, "tokenizer.ggml.pre", pre, sizeof pre, &present, err, errlen))) goto done;
    sp.pre = present ? pre : NULL;
    if ((st = get_string(g, "general.name", name, sizeof name, &present, err, errlen))) goto done;
    sp.name = present ? name : NULL;

    if (bt_gguf_find_key(g, "tokenizer.ggml.tokens") < 0) {
        snprintf(err, errlen, "%s: no tokenizer.ggml.tokens: the file has no vocabulary", path);
        st = BT_ERR_INVALID;
        goto done;
    }
    if ((st = get_strings(g, "tokenizer.ggml.tokens", &sp.n_tokens, &tok_text, &tok_len, err, errlen))) goto done;
    if (sp.n_tokens == 0) {
        snprintf(err, errlen, "%s: tokenizer.ggml.tokens is empty", path);
        st = BT_ERR_INVALID;
        goto done;
    }
    sp.token_text = tok_text;
    sp.token_len = tok_len;

    void *arr = NULL;
    int elem = 0;
    st = optional_array(g, path, "tokenizer.ggml.scores", BT_GGUF_TYPE_FLOAT32, BT_GGUF_TYPE_INT32,
                        "an array of float32 or int32", sp.n_tokens, &arr, &elem, err, errlen);
    if (st != BT_OK) goto done;
    if ((scores = arr) != NULL) {
        if (elem == BT_GGUF_TYPE_INT32)
            for (uint32_t i = 0; i < sp.n_tokens; i++) {
                int32_t v;
                memcpy(&v, &scores[i], sizeof v);
                scores[i] = (float)v;
            }
        sp.scores = scores;
    }
    st = optional_array(g, path, "tokenizer.ggml.token_type", BT_GGUF_TYPE_INT32, BT_GGUF_TYPE_INT32,
                        "an array of int32", sp.n_tokens, &arr, &elem, err, errlen);
    if (st != BT_OK) goto done;
    sp.types = types = arr;
    if (!strcmp(model, "gpt2")) {
        if (bt_gguf_find_key(g, "tokenizer.ggml.merges") < 0) {
            snprintf(err, errlen, "%s: no tokenizer.ggml.merges (a gpt2 vocabulary needs its merges)", path);
            st = BT_ERR_INVALID;
            goto done;
        }
        if ((st = get_strings(g, "tokenizer.ggml.merges", &sp.n_merges, &merge_text, &merge_len, err, errlen)))
            goto done;
        sp.merge_text = merge_text;
        sp.merge_len = merge_len;
    }

    if ((st = get_int(g, "tokenizer.ggml.bos_token_id", &sp.bos_id, err, errlen)) ||
        (st = get_int(g, "tokenizer.ggml.eos_token_id", &sp.eos_id, err, errlen)) ||
        (st = get_int(g, "tokenizer.ggml.eot_token_id", &sp.eot_id, err, errlen)) ||
        (st = get_int(g, "tokenizer.ggml.eom_token_id", &sp.eom_id, err, errlen)) ||
        (st = get_int(g, "tokenizer.ggml.unknown_token_id", &sp.unk_id, err, errlen)) ||
        (st = get_int(g, "tokenizer.ggml.seperator_token_id", &sp.sep_id, err, errlen)) ||
        (st = get_int(g, "tokenizer.ggml.padding_token_id", &sp.pad_id, err, errlen)) ||
        (st = get_flag(g, "tokenizer.ggml.add_bos_token", &sp.add_bos, err, errlen)) ||
        (st = get_flag(g, "tokenizer.ggml.add_eos_token", &sp.add_eos, err, errlen)) ||
        (st = get_flag(g, "tokenizer.ggml.add_space_prefix", &sp.add_space_prefix, err, errlen)))
        goto done;

    char inner[400];
    st = bt_tokenizer_create(&sp, out, inner, sizeof inner);
    if (st != BT_OK) snprintf(err, errlen, "%s: %s", path, inner);
done:
    BT_FREE_ALL(tok_text, tok_len, merge_text, merge_len, scores, types);
    return st;
}

enum bt_status bt_tokenizer_load(const char *path, bt_tokenizer **out, char **chat_template, char *err,
                                 size_t errlen) {
    struct bt_gguf *g;
    *out = NULL;
    if (chat_template) *chat_template = NULL;
    enum bt_status st = bt_gguf_open(path, &g, err, errlen);
    if (st != BT_OK) return st;
    st = bt_tokenizer_from_gguf(g, out, err, errlen);
    if (st == BT_OK && chat_template && bt_gguf_find_key(g, "tokenizer.chat_template") >= 0) {
        struct bt_gguf_str s;
        if (bt_gguf_get_str(g, "tokenizer.chat_template", &s) != BT_OK) {
            snprintf(err, errlen, "%s", bt_gguf_error(g));
            st = BT_ERR_INVALID;
        } else if (!(*chat_template = malloc(s.n + 1))) {
            snprintf(err, errlen, "out of memory reading tokenizer.chat_template");
            st = BT_ERR_NOMEM;
        } else {
            memcpy(*chat_template, s.data, s.n);
            (*chat_template)[s.n] = 0;
        }
        if (st != BT_OK) {
            bt_tokenizer_free(*out);
            *out = NULL;
        }
    }
    bt_gguf_close(g);
    return st;
}
