/* test_tokenizer.c - the tokenizer against llama.cpp's own test pairs
 * (tests/data/vocab/ggml-vocab-NAME.gguf with .inp/.out, copied from
 * llama.cpp's models/ folder: every pair must match exactly, with
 * add_special and parse_special off, as llama.cpp's test-tokenizer-0 runs
 * them), then special tokens, BOS/EOS, detokenisation (whole and streamed,
 * a multi-byte character split over tokens), and every bad input a user can
 * give, with the exact message. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "text/tokenizer.h"
#include "text/vocab_gguf.h"
#include "testutil.h"

#ifndef BATON_TEST_DATA
#error "BATON_TEST_DATA (the tests/data folder) must be defined by the build"
#endif

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = fread(b, 1, (size_t)l, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static bt_tokenizer *load(const char *name) {
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", BATON_TEST_DATA, name);
    bt_tokenizer *tok = NULL;
    enum bt_status st = bt_tokenizer_load(path, &tok, NULL, err, sizeof err);
    ck_assert_msg(st == BT_OK, "%s: %s", name, err);
    return tok;
}

static void tokenize(const bt_tokenizer *tok, const char *text, int add_special, int parse_special, bt_tokens *out) {
    char err[256];
    out->n = 0;
    enum bt_status st = bt_tokenizer_tokenize(tok, text, strlen(text), add_special, parse_special, out, err, sizeof err);
    ck_assert_msg(st == BT_OK, "%s", err);
}

/* ---- llama.cpp's pairs ---- */

static const char *const k_vocabs[] = {"llama-spm", "phi-3",          "gpt-2",  "llama-bpe", "qwen2",
                                       "mpt",       "deepseek-coder", "falcon", "starcoder", "deepseek-llm"};

/* one vocabulary: every pair of its .inp/.out; returns the number checked */
static int run_pairs(const char *name, int round_trip) {
    bt_tokenizer *tok = load(name);
    char path[512];
    size_t in_n, out_n;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.inp", BATON_TEST_DATA, name);
    char *inp = slurp(path, &in_n);
    ck_assert_msg(inp != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf.out", BATON_TEST_DATA, name);
    char *outp = slurp(path, &out_n);
    ck_assert_msg(outp != NULL, "cannot read %s", path);
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sl = strlen(sep);
    char *ip = inp, *op = outp;
    int checked = 0, failed = 0;
    bt_tokens got = {0};
    char err[256];
    while (ip < inp + in_n) {
        char *e = strstr(ip, sep);
        size_t len = e ? (size_t)(e - ip) : strlen(ip);
        char *oe = strchr(op, '\n');
        ck_assert_msg(oe != NULL || *op, "%s: fewer outputs than inputs", name);
        if (oe) *oe = 0;
        got.n = 0;
        ck_assert_msg(bt_tokenizer_tokenize(tok, ip, len, 0, 0, &got, err, sizeof err) == BT_OK, "%s", err);
        /* expected: ids separated by spaces */
        size_t k = 0;
        int ok = 1;
        for (char *s = op; *s;) {
            while (*s == ' ') s++;
            if (!*s) break;
            long v = strtol(s, &s, 10);
            if (k >= got.n || got.ids[k] != v) ok = 0;
            k++;
        }
        if (k != got.n) ok = 0;
        if (!ok) {
            failed++;
            fprintf(stderr, "%s: '%.*s'\n  expected:%s\n  got:     ", name, (int)len, ip, op);
            for (size_t i = 0; i < got.n; i++) fprintf(stderr, " %d", got.ids[i]);
            fprintf(stderr, "\n");
        }
        if (round_trip) {
            size_t dl;
            char *d = bt_tokenizer_detokenize(tok, got.ids, got.n, 0, 0, &dl);
            ck_assert_msg(dl == len && !memcmp(d, ip, len), "%s: '%.*s' detokenizes to '%s'", name, (int)len, ip, d);
            free(d);
        }
        checked++;
        op = oe ? oe + 1 : op + strlen(op);
        if (!e) break;
        ip = e + sl;
    }
    ck_assert_msg(failed == 0, "%s: %d of %d pairs differ", name, failed, checked);
    bt_tokens_free(&got);
    free(inp);
    free(outp);
    bt_tokenizer_free(tok);
    return checked;
}

START_TEST(test_pairs) {
    const char *name = k_vocabs[_i];
    /* byte-level vocabularies without clean-up give back the exact text */
    int rt = !strcmp(name, "qwen2") || !strcmp(name, "llama-spm") || !strcmp(name, "deepseek-coder");
    int n = run_pairs(name, rt);
    ck_assert_int_ge(n, 46); /* the files hold 46 pairs: all were read */
}
END_TEST

/* ---- special tokens, BOS / EOS ---- */

START_TEST(test_special_tokens) {
    bt_tokenizer *tok = load("qwen2");
    int32_t im_start = bt_tokenizer_find(tok, "<|im_start|>", 12), im_end = bt_tokenizer_find(tok, "<|im_end|>", 10);
    ck_assert_int_ge(im_start, 0);
    ck_assert_int_ge(im_end, 0);
    bt_tokens t = {0};
    const char *text = "<|im_start|>user\nhi<|im_end|>";
    tokenize(tok, text, 0, 1, &t);
    ck_assert_uint_ge(t.n, 4);
    ck_assert_int_eq(t.ids[0], im_start);
    ck_assert_int_eq(t.ids[t.n - 1], im_end);
    /* not parsed: the text is tokenized as text, no control token appears */
    tokenize(tok, text, 0, 0, &t);
    for (size_t i = 0; i < t.n; i++) {
        ck_assert_int_ne(t.ids[i], im_start);
        ck_assert_int_ne(t.ids[i], im_end);
    }
    size_t dl;
    char *d = bt_tokenizer_detokenize(tok, t.ids, t.n, 0, 0, &dl);
    ck_assert_str_eq(d, text);
    free(d);
    /* EOT found by its text, and it ends generation */
    ck_assert_int_eq(bt_tokenizer_eot(tok), im_end);
    ck_assert(bt_tokenizer_is_eog(tok, im_end));
    ck_assert(!bt_tokenizer_is_eog(tok, im_start));
    /* control pieces print only when asked */
    size_t pl;
    bt_tokenizer_piece(tok, im_end, 0, &pl);
    ck_assert_uint_eq(pl, 0);
    ck_assert_str_eq(bt_tokenizer_piece(tok, im_end, 1, &pl), "<|im_end|>");
    /* qwen2 adds no BOS */
    tokenize(tok, "hi", 1, 0, &t);
    ck_assert_uint_eq(t.n, 1);
    bt_tokens_free(&t);
    bt_tokenizer_free(tok);
}
END_TEST

START_TEST(test_bos_eos) {
    bt_tokens t = {0};
    bt_tokenizer *spm = load("llama-spm");
    tokenize(spm, "Hello", 1, 0, &t);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_int_eq(t.ids[0], 1); /* <s> */
    ck_assert_int_eq(t.ids[1], 15043); /* "▁Hello" */
    /* "<s>" in text is a control token only when parsed; then no space is added after it */
    tokenize(spm, "<s>Hello", 0, 1, &t);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_int_eq(t.ids[0], 1);
    ck_assert_int_eq(t.ids[1], 15043);
    /* remove_special drops the BOS and keeps the text's own leading space rule */
    size_t dl;
    tokenize(spm, "Hello world", 1, 0, &t);
    char *d = bt_tokenizer_detokenize(spm, t.ids, t.n, 1, 0, &dl);
    ck_assert_str_eq(d, " Hello world"); /* as llama.cpp: the BOS removed, the prefix space stays */
    free(d);
    d = bt_tokenizer_detokenize(spm, t.ids + 1, t.n - 1, 0, 0, &dl);
    ck_assert_str_eq(d, "Hello world");
    free(d);
    bt_tokenizer_free(spm);

    bt_tokenizer *l3 = load("llama-bpe");
    tokenize(l3, "Hello", 1, 0, &t);
    ck_assert_uint_eq(t.n, 2);
    ck_assert_int_eq(t.ids[0], 128000);
    ck_assert_int_eq(bt_tokenizer_bos(l3), 128000);
    ck_assert_int_eq(bt_tokenizer_eos(l3), 128001);
    bt_tokenizer_free(l3);

    bt_tokenizer *g2 = load("gpt-2");
    tokenize(g2, "Hello", 1, 0, &t); /* gpt-2: no BOS by default */
    ck_assert_uint_eq(t.n, 1);
    ck_assert_int_eq(t.ids[0], 15496);
    bt_tokenizer_free(g2);
    bt_tokens_free(&t);
}
END_TEST

/* ---- detokenisation that streams ---- */

START_TEST(test_stream_utf8) {
    bt_tokenizer *tok = load("llama-spm");
    bt_tokens t = {0};
    /* the llama emoji has no token: four byte tokens; nothing prints until the fourth */
    tokenize(tok, "a\xf0\x9f\xa6\x99" "b", 0, 0, &t);
    ck_assert_uint_eq(t.n, 6); /* "▁a" <0xF0> <0x9F> <0xA6> <0x99> "b" */
    bt_detok_stream s;
    bt_detok_stream_init(&s);
    char buf[64];
    long lens[6];
    char all[64];
    size_t n_all = 0;
    for (size_t i = 0; i < t.n; i++) {
        lens[i] = bt_detok_stream_push(&s, tok, t.ids[i], 0, buf, sizeof buf);
        ck_assert_int_ge(lens[i], 0);
        memcpy(all + n_all, buf, (size_t)lens[i]);
        n_all += (size_t)lens[i];
    }
    ck_assert_int_eq(lens[0], 2); /* " a" */
    ck_assert_int_eq(lens[1], 0);
    ck_assert_int_eq(lens[2], 0);
    ck_assert_int_eq(lens[3], 0);
    ck_assert_int_eq(lens[4], 4); /* the whole emoji at once */
    ck_assert_int_eq(lens[5], 1);
    ck_assert_uint_eq(n_all, 7);
    ck_assert(!memcmp(all, " a\xf0\x9f\xa6\x99" "b", 7));
    ck_assert_int_eq(bt_detok_stream_flush(&s, buf, sizeof buf), 0);
    /* a stream that ends inside a character: the flush shows U+FFFD per byte */
    ck_assert_int_eq(bt_detok_stream_push(&s, tok, t.ids[1], 0, buf, sizeof buf), 0);
    ck_assert_int_eq(bt_detok_stream_push(&s, tok, t.ids[2], 0, buf, sizeof buf), 0);
    ck_assert_int_eq(bt_detok_stream_flush(&s, buf, sizeof buf), 6);
    ck_assert(!memcmp(buf, "\xef\xbf\xbd\xef\xbf\xbd", 6));
    /* too small a buffer: the size needed, nothing consumed */
    ck_assert_int_eq(bt_detok_stream_push(&s, tok, t.ids[0], 0, buf, 1), -2);
    ck_assert_int_eq(bt_detok_stream_push(&s, tok, t.ids[0], 0, buf, sizeof buf), 2);
    bt_tokens_free(&t);
    bt_tokenizer_free(tok);
}
END_TEST

/* ---- bad input ---- */

START_TEST(test_invalid_utf8) {
    bt_tokenizer *tok = load("gpt-2");
    bt_tokens t = {0};
    char err[256];
    static const struct {
        const char *text;
        const char *msg;
    } cases[] = {
        {"abc\xff", "invalid UTF-8 at byte 3 (0xff)"},
        {"\xc3", "invalid UTF-8 at byte 0 (0xc3)"},                  /* truncated */
        {"ok \xc0\xaf", "invalid UTF-8 at byte 3 (0xc0)"},           /* overlong '/' */
        {"x\xed\xa0\x80", "invalid UTF-8 at byte 1 (0xed)"},          /* a surrogate */
        {"\xf4\x90\x80\x80", "invalid UTF-8 at byte 0 (0xf4)"},       /* above U+10FFFF */
        {"\x80", "invalid UTF-8 at byte 0 (0x80)"},                  /* a lone continuation byte */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        ck_assert_int_eq(bt_tokenizer_tokenize(tok, cases[i].text, strlen(cases[i].text), 0, 0, &t, err, sizeof err),
                         BT_ERR_INVALID);
        ck_assert_str_eq(err, cases[i].msg);
        ck_assert_uint_eq(t.n, 0);
    }
    bt_tokens_free(&t);
    bt_tokenizer_free(tok);
}
END_TEST

static char g_dir[512], g_path[600];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/baton-tok-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/v.gguf", g_dir);
}

static void teardown(void) {
    unlink(g_path);
    rmdir(g_dir);
}

/* a small vocabulary file: model, and optionally tokens / merges, and one
 * more array (arr_key: arr_n zeros of arr_type) */
static void write_vocab_arr(const char *model, int n_tokens, int with_merges, int32_t bos, const char *arr_key,
                            enum bt_gguf_type arr_type, int arr_n) {
    struct bt_gguf_writer *w;
    char err[256];
    ck_assert_int_eq(bt_gguf_writer_open(g_path, &w, err, sizeof err), BT_OK);
    if (model) ck_assert_int_eq(bt_gguf_writer_set_str(w, "tokenizer.ggml.model", model), BT_OK);
    static const char *const toks[] = {"a", "b", "ab", "\xc4\xa0", "c"};
    if (n_tokens) ck_assert_int_eq(bt_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)n_tokens), BT_OK);
    static const char *const merges[] = {"a b", "ab"};
    if (with_merges) ck_assert_int_eq(bt_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, (uint64_t)with_merges), BT_OK);
    if (bos >= 0) ck_assert_int_eq(bt_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2"), BT_OK);
    static const uint8_t zeros[64];
    if (arr_key) ck_assert_int_eq(bt_gguf_writer_set_arr(w, arr_key, arr_type, zeros, (uint64_t)arr_n), BT_OK);
    ck_assert_int_eq(bt_gguf_writer_finish(w, err, sizeof err), BT_OK);
}

static void write_vocab(const char *model, int n_tokens, int with_merges, int32_t bos) {
    write_vocab_arr(model, n_tokens, with_merges, bos, NULL, BT_GGUF_TYPE_INT32, 0);
}

static void expect_load_error(enum bt_status want, const char *tail) {
    bt_tokenizer *tok = (bt_tokenizer *)1;
    char err[512] = "", expect[1024];
    ck_assert_int_eq(bt_tokenizer_load(g_path, &tok, NULL, err, sizeof err), want);
    ck_assert_ptr_null(tok);
    snprintf(expect, sizeof expect, "%s: %s", g_path, tail);
    ck_assert_str_eq(err, expect);
}

START_TEST(test_bad_files) {
    /* not GGUF at all */
    FILE *f = fopen(g_path, "wb");
    fputs("this is not a model\n", f);
    fclose(f);
    bt_tokenizer *tok = (bt_tokenizer *)1;
    char err[512] = "";
    ck_assert_int_ne(bt_tokenizer_load(g_path, &tok, NULL, err, sizeof err), BT_OK);
    ck_assert_ptr_null(tok);
    ck_assert_msg(strstr(err, g_path) && strstr(err, "GGUF"), "message: %s", err);

    write_vocab(NULL, 0, 0, -1);
    expect_load_error(BT_ERR_INVALID, "no tokenizer.ggml.model: the file has no vocabulary");
    write_vocab("bert", 3, 0, -1);
    expect_load_error(BT_ERR_UNSUPPORTED, "tokenizer.ggml.model 'bert' is not supported (baton supports: llama, gpt2)");
    write_vocab("gpt2", 0, 0, -1);
    expect_load_error(BT_ERR_INVALID, "no tokenizer.ggml.tokens: the file has no vocabulary");
    write_vocab("gpt2", 4, 0, -1);
    expect_load_error(BT_ERR_INVALID, "no tokenizer.ggml.merges (a gpt2 vocabulary needs its merges)");
    write_vocab("gpt2", 4, 2, -1);
    expect_load_error(BT_ERR_INVALID, "tokenizer.ggml.merges[1] 'ab' is not two pieces separated by a space");
    write_vocab("gpt2", 4, 1, 7);
    expect_load_error(BT_ERR_INVALID, "tokenizer.ggml.bos_token_id = 7 is outside the vocabulary (4 tokens)");

    /* the optional per-token arrays: their type, and an entry for every token */
    write_vocab_arr("gpt2", 4, 1, -1, "tokenizer.ggml.scores", BT_GGUF_TYPE_UINT8, 4);
    expect_load_error(BT_ERR_INVALID, "tokenizer.ggml.scores is not an array of float32 or int32");
    write_vocab_arr("gpt2", 4, 1, -1, "tokenizer.ggml.scores", BT_GGUF_TYPE_FLOAT32, 3);
    expect_load_error(BT_ERR_INVALID, "tokenizer.ggml.scores has 3 entries, the vocabulary 4");
    write_vocab_arr("gpt2", 4, 1, -1, "tokenizer.ggml.token_type", BT_GGUF_TYPE_FLOAT32, 4);
    expect_load_error(BT_ERR_INVALID, "tokenizer.ggml.token_type is not an array of int32");
    write_vocab_arr("gpt2", 4, 1, -1, "tokenizer.ggml.token_type", BT_GGUF_TYPE_INT32, 2);
    expect_load_error(BT_ERR_INVALID, "tokenizer.ggml.token_type has 2 entries, the vocabulary 4");

    /* a small valid one: "ab" merges, the rest are single tokens */
    write_vocab("gpt2", 5, 1, -1);
    ck_assert_int_eq(bt_tokenizer_load(g_path, &tok, NULL, err, sizeof err), BT_OK);
    bt_tokens t = {0};
    tokenize(tok, "ab c", 0, 0, &t);
    ck_assert_uint_eq(t.n, 3);
    ck_assert_int_eq(t.ids[0], 2); /* "ab" */
    ck_assert_int_eq(t.ids[1], 3); /* "Ġ": ' c' has no merge, each byte its own token */
    ck_assert_int_eq(t.ids[2], 4); /* "c" */
    bt_tokens_free(&t);
    bt_tokenizer_free(tok);
}
END_TEST

START_TEST(test_unknown_pre) {
    bt_vocab_spec sp;
    bt_vocab_spec_init(&sp);
    const char *toks[] = {"a"};
    uint32_t lens[] = {1};
    const char *merges[] = {"a a"};
    uint32_t mlens[] = {3};
    sp.model = "gpt2";
    sp.pre = "no-such-pre";
    sp.n_tokens = 1, sp.token_text = toks, sp.token_len = lens;
    sp.n_merges = 1, sp.merge_text = merges, sp.merge_len = mlens;
    sp.add_bos = 0; /* llama3 adds a BOS by default: this vocabulary has none */
    bt_tokenizer *tok;
    char err[256];
    ck_assert_int_eq(bt_tokenizer_create(&sp, &tok, err, sizeof err), BT_ERR_UNSUPPORTED);
    ck_assert_str_eq(err, "tokenizer.ggml.pre 'no-such-pre' is not a pre-tokenizer baton knows (see baton tokenize --help)");
    /* a NaN score: no order to merge by (before: a heap out of order) */
    const float scores[] = {NAN};
    sp.model = "llama";
    sp.scores = scores;
    ck_assert_int_eq(bt_tokenizer_create(&sp, &tok, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "tokenizer.ggml.scores[0] is NaN");
    sp.model = "gpt2";
    sp.scores = NULL;
    /* every name baton lists builds */
    for (const char *const *n = bt_tokenizer_pre_names(); *n; n++) {
        sp.pre = *n;
        ck_assert_msg(bt_tokenizer_create(&sp, &tok, err, sizeof err) == BT_OK, "%s: %s", *n, err);
        bt_tokens t = {0};
        tokenize(tok, "a aa 12 \xe4\xb8\xad", 0, 0, &t);
        bt_tokens_free(&t);
        bt_tokenizer_free(tok);
    }
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("pairs");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_pairs, 0, (int)(sizeof k_vocabs / sizeof k_vocabs[0]));
    suite_add_tcase(s, tc);
    tc = tcase_create("behaviour");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_special_tokens);
    tcase_add_test(tc, test_bos_eos);
    tcase_add_test(tc, test_stream_utf8);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_unknown_pre);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
