/* test_chat.c - chat templates: each of llama.cpp's test-chat-template cases
 * (tests/data/chat/llama_cpp_cases.h: a model's Jinja template and the text
 * llama.cpp's built-in formatter writes) is detected and written exactly the
 * same; the formats baton does not write are reported, by name, as unknown;
 * a NAME override; the templates inside the vocabulary files; the error
 * that lists the names. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/vocab_gguf.h"
#include "testutil.h"

#include "../tests/data/chat/llama_cpp_cases.h"

static const bt_chat_msg k_conv[] = {
    {"system", "You are a helpful assistant"}, {"user", "Hello"},       {"assistant", "Hi there"},
    {"user", "Who are you"},                   {"assistant", "   I am an assistant   "}, {"user", "Another question"},
};
#define N_CONV (sizeof k_conv / sizeof k_conv[0])

/* the cases whose format llama.cpp detects but baton does not write */
static const char *const k_not_written[] = {"ibm-granite/granite-3.0-8b-instruct", "ai-sage/GigaChat-20B-A3B-instruct",
                                            "Infinigence/Megrez-3B-Instruct", "yandex/YandexGPT-5-Lite-8B-instruct",
                                            NULL};

static int not_written(const char *name) {
    for (int i = 0; k_not_written[i]; i++)
        if (!strcmp(k_not_written[i], name)) return 1;
    return 0;
}

START_TEST(test_llama_cpp_case) {
    const char *name = k_llama_cpp_cases[_i].name;
    char *out = NULL, err[1024];
    enum bt_status st = bt_chat_apply(k_llama_cpp_cases[_i].tmpl, k_conv, N_CONV, 1, &out, err, sizeof err);
    if (not_written(name)) {
        ck_assert_msg(st == BT_ERR_UNSUPPORTED, "%s: expected 'not known', got status %d", name, st);
        ck_assert_ptr_null(out);
        ck_assert_msg(strstr(err, "the chat template is not one baton knows (names: chatml ") == err, "%s", err);
        return;
    }
    ck_assert_msg(st == BT_OK, "%s: %s", name, err);
    ck_assert_msg(!strcmp(out, k_llama_cpp_cases[_i].expected), "%s (detected %s):\nexpected:\n%s\ngot:\n%s", name,
                  bt_chat_template_detect(k_llama_cpp_cases[_i].tmpl), k_llama_cpp_cases[_i].expected, out);
    /* the detected name, given as the template, writes the same */
    const char *det = bt_chat_template_detect(k_llama_cpp_cases[_i].tmpl);
    ck_assert_ptr_nonnull(det);
    char *out2 = NULL;
    ck_assert_int_eq(bt_chat_apply(det, k_conv, N_CONV, 1, &out2, err, sizeof err), BT_OK);
    ck_assert_str_eq(out2, out);
    free(out2);
    free(out);
}
END_TEST

/* the formats the issue names are among the detected ones */
START_TEST(test_formats_covered) {
    static const char *const needed[] = {"chatml", "llama3", "llama2", "mistral-v7", "gemma", "phi3",
                                         "deepseek", "deepseek2", NULL};
    for (int k = 0; needed[k]; k++) {
        int seen = 0;
        for (size_t i = 0; i < sizeof k_llama_cpp_cases / sizeof k_llama_cpp_cases[0]; i++) {
            const char *d = bt_chat_template_detect(k_llama_cpp_cases[i].tmpl);
            if (d && !strcmp(d, needed[k])) seen = 1;
        }
        ck_assert_msg(seen, "no llama.cpp case is detected as %s", needed[k]);
    }
}
END_TEST

START_TEST(test_names_and_errors) {
    char *out = NULL, err[1024];
    /* every name applies */
    for (const char *const *n = bt_chat_template_names(); *n; n++) {
        ck_assert_str_eq(bt_chat_template_detect(*n), *n);
        ck_assert_msg(bt_chat_apply(*n, k_conv, N_CONV, 1, &out, err, sizeof err) == BT_OK, "%s: %s", *n, err);
        ck_assert(strstr(out, "Another question") != NULL);
        free(out);
    }
    /* a name override with a user-visible result */
    const bt_chat_msg one[] = {{"user", " hi "}};
    ck_assert_int_eq(bt_chat_apply("llama3", one, 1, 1, &out, err, sizeof err), BT_OK);
    ck_assert_str_eq(out, "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    /* DeepSeek-V3 (no llama.cpp case): as llama.cpp's formatter writes it */
    const bt_chat_msg two[] = {{"system", "Be brief."}, {"user", "hi"}, {"assistant", "hello"}, {"user", "bye"}};
    ck_assert_str_eq(bt_chat_template_detect("{{'<\xef\xbd\x9cUser\xef\xbd\x9c>'}}{{'<\xef\xbd\x9c"
                                             "Assistant\xef\xbd\x9c>'}}<\xef\xbd\x9c"
                                             "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"),
                     "deepseek3");
    ck_assert_int_eq(bt_chat_apply("deepseek3", two, 4, 1, &out, err, sizeof err), BT_OK);
    ck_assert_str_eq(out, "Be brief.\n\n<\xef\xbd\x9cUser\xef\xbd\x9c>hi<\xef\xbd\x9c"
                          "Assistant\xef\xbd\x9c>hello<\xef\xbd\x9c"
                          "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>bye"
                          "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
    free(out);
    ck_assert_int_eq(bt_chat_apply("chatml", one, 1, 0, &out, err, sizeof err), BT_OK);
    ck_assert_str_eq(out, "<|im_start|>user\n hi <|im_end|>\n");
    free(out);
    /* unknown: the names are listed */
    out = (char *)1;
    ck_assert_int_eq(bt_chat_apply("chatmll", one, 1, 1, &out, err, sizeof err), BT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(out);
    ck_assert_str_eq(err, "unknown chat template 'chatmll' (names: chatml llama2 llama2-sys llama2-sys-bos "
                          "llama2-sys-strip mistral-v1 mistral-v3 mistral-v3-tekken mistral-v7 mistral-v7-tekken phi3 "
                          "phi4 falcon3 zephyr monarch gemma orion openchat vicuna vicuna-orca deepseek deepseek2 "
                          "deepseek3 command-r llama3 chatglm3 chatglm4 glmedge minicpm)");
    ck_assert_int_eq(bt_chat_apply("{{ messages }}", one, 1, 1, &out, err, sizeof err), BT_ERR_UNSUPPORTED);
    ck_assert(strstr(err, "the chat template is not one baton knows (names: ") == err);
    const bt_chat_msg bad[] = {{"user", NULL}};
    ck_assert_int_eq(bt_chat_apply("chatml", bad, 1, 1, &out, err, sizeof err), BT_ERR_INVALID);
    ck_assert_str_eq(err, "chat message 0 has no content");
}
END_TEST

/* the templates stored in the vocabulary files */
START_TEST(test_file_templates) {
    static const struct {
        const char *vocab, *expect;
    } files[] = {{"qwen2", "chatml"}, {"phi-3", "phi3"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[512], err[512];
        snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", BATON_TEST_DATA, files[i].vocab);
        bt_tokenizer *tok;
        char *tmpl = NULL;
        ck_assert_msg(bt_tokenizer_load(path, &tok, &tmpl, err, sizeof err) == BT_OK, "%s", err);
        ck_assert_ptr_nonnull(tmpl);
        ck_assert_str_eq(bt_chat_template_detect(tmpl), files[i].expect);
        free(tmpl);
        bt_tokenizer_free(tok);
    }
    /* a file without one */
    char path[512], err[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-gpt-2.gguf", BATON_TEST_DATA);
    bt_tokenizer *tok;
    char *tmpl = (char *)1;
    ck_assert_int_eq(bt_tokenizer_load(path, &tok, &tmpl, err, sizeof err), BT_OK);
    ck_assert_ptr_null(tmpl);
    bt_tokenizer_free(tok);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("chat");
    TCase *tc = tcase_create("chat");
    tcase_add_loop_test(tc, test_llama_cpp_case, 0, (int)(sizeof k_llama_cpp_cases / sizeof k_llama_cpp_cases[0]));
    tcase_add_test(tc, test_formats_covered);
    tcase_add_test(tc, test_names_and_errors);
    tcase_add_test(tc, test_file_templates);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
