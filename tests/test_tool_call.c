/* test_tool_call.c - the tool-call formats beyond Hermes (Llama 3, Mistral's
 * JSON list, [ARGS] and [CALL_ID]): which one a real chat template shows,
 * the texts each format's grammar takes and refuses, a reply parsed back
 * into calls (a malformed one is all content), and a reply read call by
 * call as a stream grows: a call comes out once it is whole, the content
 * before it at once but for a tail that may open a call; what a stream
 * sends of a reply (content, each call's head and arguments); a mark that
 * is a control token of the vocabulary, shown (its text in the output,
 * taken by a grammar) only where asked. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "text/constrain.h"
#include "text/grammar.h"
#include "text/stop.h"
#include "text/tokenizer.h"
#include "text/tool_call.h"
#include "text/vocab_gguf.h"

static const struct bt_tool tools[2] = {
    {"get_weather", "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}"},
    {"now", NULL},
};

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert(s && fread(s, 1, (size_t)n, f) == (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

START_TEST(test_detect) {
    static const struct {
        const char *file;
        enum bt_tool_format f;
    } cases[] = {
        {"chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", BT_TOOL_FORMAT_HERMES},
        {"chat_templates/Qwen-Qwen3-0.6B.jinja", BT_TOOL_FORMAT_HERMES},
        {"chat_templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", BT_TOOL_FORMAT_MISTRAL},
        {"chat_templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja", BT_TOOL_FORMAT_MISTRAL_ARGS},
        {"chat_templates/Mistral-Small-3.2-24B-Instruct-2506.jinja", BT_TOOL_FORMAT_MISTRAL_CALL_ID},
        {"chat_templates/microsoft-Phi-3.5-mini-instruct.jinja", BT_TOOL_FORMAT_NONE},
        {"chat/llama3_tools.jinja", BT_TOOL_FORMAT_LLAMA3},
    };
    char path[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", BATON_TEST_DATA, cases[i].file);
        char *t = read_text(path);
        ck_assert_msg(bt_tool_format_detect(t) == cases[i].f, "%s: %s", cases[i].file,
                      bt_tool_format_name(bt_tool_format_detect(t)));
        free(t);
    }
    /* Llama 3.1's own marks; Hermes first where a template has both (Hermes-3 on Llama 3.1) */
    ck_assert_int_eq(bt_tool_format_detect("{{ '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}"),
                     BT_TOOL_FORMAT_LLAMA3);
    ck_assert_int_eq(bt_tool_format_detect("<|start_header_id|>ipython<|end_header_id|> <tool_call>"),
                     BT_TOOL_FORMAT_HERMES);
    /* other formats inside <tool_call> (Qwen3-Coder, Qwen3.5; GLM-4.5 .. 4.7): none baton reads */
    ck_assert_int_eq(bt_tool_format_detect("<tool_call>\n<function={{ tc.name }}>\n<parameter="),
                     BT_TOOL_FORMAT_NONE);
    ck_assert_int_eq(bt_tool_format_detect("<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key>"), BT_TOOL_FORMAT_NONE);
    ck_assert_int_eq(bt_tool_format_detect("<|start_header_id|>ipython<|end_header_id|> <function="),
                     BT_TOOL_FORMAT_NONE);
    ck_assert_str_eq(bt_tool_format_name(BT_TOOL_FORMAT_MISTRAL_ARGS), "mistral-args");
    ck_assert_str_eq(bt_tool_format_trigger(BT_TOOL_FORMAT_LLAMA3), "{\"name\"");
    ck_assert_str_eq(bt_tool_format_trigger(BT_TOOL_FORMAT_MISTRAL), "[TOOL_CALLS]");
}
END_TEST

/* each format: texts its grammar (both tools, up to 2 calls) takes, and refuses */
static const struct grammar_case {
    enum bt_tool_format f;
    const char *text;
    bool ok;
} grammar_cases[] = {
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", true},
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\":\"now\",\"parameters\":{\"tz\":1}}", true},
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\":\"now\",\"arguments\":{}}", false},
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\":\"get_weather\",\"parameters\":{}}", false},
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\":\"now\",\"parameters\":{}} {\"name\":\"now\",\"parameters\":{}}", false},
    {BT_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"a1B2c3D4e\"}]", true},
    {BT_TOOL_FORMAT_MISTRAL,
     "[TOOL_CALLS][{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"},\"id\":\"000000000\"}, "
     "{\"name\":\"now\",\"arguments\":{},\"id\":\"zzzzzzzzz\"}]",
     true},
    {BT_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"name\":\"now\",\"arguments\":{},\"id\":\"short\"}]", false},
    {BT_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"name\":\"now\",\"arguments\":{},\"id\":\"a-b-c-d-e\"}]", false},
    {BT_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"name\":\"now\",\"arguments\":{}}]", false},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}", true},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]now[ARGS]{\"a\":[1]}", true},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]other[ARGS]{}", false},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]now[CALL_ID]a1B2c3D4e[ARGS]{}", false},
    {BT_TOOL_FORMAT_MISTRAL_CALL_ID, "[TOOL_CALLS]now[CALL_ID]a1B2c3D4e[ARGS]{}", true},
    {BT_TOOL_FORMAT_MISTRAL_CALL_ID, "[TOOL_CALLS]now[ARGS]{}", false},
    {BT_TOOL_FORMAT_MISTRAL_CALL_ID, "[TOOL_CALLS]now[CALL_ID]a1B2c3D4ef[ARGS]{}", false},
};

START_TEST(test_grammars) {
    char where[256], err[256];
    int bad_tool;
    for (size_t i = 0; i < sizeof grammar_cases / sizeof grammar_cases[0]; i++) {
        const struct grammar_case *c = &grammar_cases[i];
        bt_grammar *g;
        ck_assert_int_eq(bt_tool_grammar_build(c->f, tools, 2, -1, 2, &g, &bad_tool, where, sizeof where, err,
                                               sizeof err),
                         BT_OK);
        ck_assert_msg(bt_grammar_match(g, c->text, strlen(c->text)) == c->ok, "%s: %s", bt_tool_format_name(c->f),
                      c->text);
        /* what the grammar takes parses back into calls */
        struct bt_tool_call *calls;
        char *content;
        const int n = bt_tool_calls_parse(c->f, c->text, strlen(c->text), &calls, &content);
        if (c->ok) ck_assert_msg(n >= 1 && !content, "%s: %d calls", c->text, n);
        bt_tool_calls_free(calls, n);
        free(content);
        bt_grammar_free(g);
    }
    /* a named function: only its calls; the trigger is where each grammar's text begins */
    static const char *const named[] = {
        [BT_TOOL_FORMAT_LLAMA3] = "{\"name\": \"now\", \"parameters\": {}}",
        [BT_TOOL_FORMAT_MISTRAL] = "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"abcdefghi\"}]",
        [BT_TOOL_FORMAT_MISTRAL_ARGS] = "[TOOL_CALLS]now[ARGS]{}",
        [BT_TOOL_FORMAT_MISTRAL_CALL_ID] = "[TOOL_CALLS]now[CALL_ID]abcdefghi[ARGS]{}",
    };
    for (int f = BT_TOOL_FORMAT_LLAMA3; f <= BT_TOOL_FORMAT_MISTRAL_CALL_ID; f++) {
        bt_grammar *g;
        ck_assert_int_eq(bt_tool_grammar_build(f, tools, 2, 1, 1, &g, &bad_tool, where, sizeof where, err, sizeof err),
                         BT_OK);
        ck_assert(bt_grammar_match(g, named[f], strlen(named[f])));
        const char *trig = bt_tool_format_trigger(f);
        ck_assert(!strncmp(named[f], trig, strlen(trig)));
        bt_grammar_free(g);
    }
}
END_TEST

/* each format: a reply, the calls in it (name, arguments, id or NULL) and the content left */
static const struct parse_case {
    enum bt_tool_format f;
    const char *reply;
    int n;
    const char *name[2], *args[2], *id[2];
    const char *content;
} parse_cases[] = {
    {BT_TOOL_FORMAT_LLAMA3,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
     1,
     {"get_weather"},
     {"{\"city\":\"Oslo\"}"},
     {NULL},
     NULL},
    {BT_TOOL_FORMAT_LLAMA3,
     "Sure.\n<|python_tag|>{\"type\": \"function\", \"name\": \"now\", \"parameters\": \"{\\\"tz\\\": 1}\"}",
     1,
     {"now"},
     {"{\"tz\":1}"},
     {NULL},
     "Sure."},
    {BT_TOOL_FORMAT_MISTRAL,
     "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": \"a1B2c3D4e\"},"
     "{\"id\": \"zzzzzzzzz\", \"arguments\": {}, \"name\": \"now\"}]",
     2,
     {"get_weather", "now"},
     {"{\"city\":\"Oslo\"}", "{}"},
     {"a1B2c3D4e", "zzzzzzzzz"},
     NULL},
    {BT_TOOL_FORMAT_MISTRAL,
     "Let me see. [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"a1B2c3D4e\"}] ",
     1,
     {"now"},
     {"{}"},
     {"a1B2c3D4e"},
     "Let me see."},
    {BT_TOOL_FORMAT_MISTRAL_ARGS,
     "I will check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]now[ARGS]{}",
     2,
     {"get_weather", "now"},
     {"{\"city\":\"Oslo\"}", "{}"},
     {NULL, NULL},
     "I will check."},
    {BT_TOOL_FORMAT_MISTRAL_CALL_ID,
     "[TOOL_CALLS] now [CALL_ID]a1B2c3D4e[ARGS]{\"tz\": 2}",
     1,
     {"now"},
     {"{\"tz\":2}"},
     {"a1B2c3D4e"},
     NULL},
    /* not well formed: no call, all of the reply is content (trimmed), as Hermes */
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\": \"Bob\", \"age\": 3}", 0, {NULL}, {NULL}, {NULL},
     "{\"name\": \"Bob\", \"age\": 3}"},
    {BT_TOOL_FORMAT_LLAMA3, "{\"name\": \"now\", \"parameters\": {", 0, {NULL}, {NULL}, {NULL},
     "{\"name\": \"now\", \"parameters\": {"},
    {BT_TOOL_FORMAT_MISTRAL, " [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}} ", 0, {NULL}, {NULL}, {NULL},
     "[TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}}"},
    {BT_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS]{\"name\": \"now\"}", 0, {NULL}, {NULL}, {NULL},
     "[TOOL_CALLS]{\"name\": \"now\"}"},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]now[ARGS]{\"a\": }", 0, {NULL}, {NULL}, {NULL},
     "[TOOL_CALLS]now[ARGS]{\"a\": }"},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]now[ARGS]\"x\"", 0, {NULL}, {NULL}, {NULL},
     "[TOOL_CALLS]now[ARGS]\"x\""},
    {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS][ARGS]{}", 0, {NULL}, {NULL}, {NULL}, "[TOOL_CALLS][ARGS]{}"},
    {BT_TOOL_FORMAT_MISTRAL_CALL_ID, "[TOOL_CALLS]now[ARGS]{}", 0, {NULL}, {NULL}, {NULL}, "[TOOL_CALLS]now[ARGS]{}"},
    /* no call at all */
    {BT_TOOL_FORMAT_MISTRAL, "Hello [TOOL", 0, {NULL}, {NULL}, {NULL}, "Hello [TOOL"},
};

START_TEST(test_parse) {
    for (size_t i = 0; i < sizeof parse_cases / sizeof parse_cases[0]; i++) {
        const struct parse_case *c = &parse_cases[i];
        struct bt_tool_call *calls;
        char *content;
        const int n = bt_tool_calls_parse(c->f, c->reply, strlen(c->reply), &calls, &content);
        ck_assert_msg(n == c->n, "%s: %d calls", c->reply, n);
        for (int k = 0; k < n; k++) {
            ck_assert_str_eq(calls[k].name, c->name[k]);
            ck_assert_str_eq(calls[k].arguments, c->args[k]);
            if (c->id[k])
                ck_assert_str_eq(calls[k].id, c->id[k]);
            else
                ck_assert_ptr_null(calls[k].id);
        }
        if (c->content)
            ck_assert_str_eq(content, c->content);
        else
            ck_assert_ptr_null(content);
        bt_tool_calls_free(calls, n);
        free(content);
    }
}
END_TEST

/* A reply fed one byte at a time as a stream sees it: content shown before
 * a call's mark (never a byte of the mark), each call returned once, as
 * soon as its text is whole, and nothing left over at the end. */
static void stream_reply(enum bt_tool_format f, const char *reply, const char *content, int n_calls,
                         const size_t *whole_at) {
    const size_t len = strlen(reply);
    struct bt_tool_scan s = {0};
    int got = 0;
    size_t shown = 0;
    for (size_t l = 1; l <= len; l++) {
        const bool ended = l == len;
        const size_t p = bt_tool_calls_plain_len(f, reply, l);
        ck_assert_uint_ge(p, shown);
        shown = p;
        struct bt_tool_call c;
        bool oom;
        int r;
        while ((r = bt_tool_scan_next(f, &s, reply, l, ended, &c, &oom)) == 1) {
            ck_assert_int_lt(got, n_calls);
            ck_assert_msg(l == whole_at[got], "%s: call %d whole at %zu, not %zu", reply, got, whole_at[got], l);
            got++;
            bt_tool_call_clear(&c);
        }
        ck_assert_int_eq(r, 0);
    }
    ck_assert_int_eq(got, n_calls);
    ck_assert_uint_eq(shown, strlen(content));
    ck_assert(!strncmp(reply, content, shown));
}

START_TEST(test_stream) {
    const char *r1 = "Let me see: {\"name\": \"now\", \"parameters\": {}}";
    const size_t w1[] = {strlen(r1)};
    stream_reply(BT_TOOL_FORMAT_LLAMA3, r1, "Let me see: ", 1, w1);
    const char *r2 = "ok [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"abcdefghi\"}, "
                     "{\"name\": \"now\", \"arguments\": {\"a\": 1}, \"id\": \"abcdefghj\"}]";
    const size_t w2[] = {strlen("ok [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"abcdefghi\"}"),
                         strlen(r2) - 1};
    stream_reply(BT_TOOL_FORMAT_MISTRAL, r2, "ok ", 2, w2);
    const char *r3 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]now[ARGS]{}";
    const size_t w3[] = {strlen("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}"), strlen(r3)};
    stream_reply(BT_TOOL_FORMAT_MISTRAL_ARGS, r3, "", 2, w3);
    const char *r4 = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    const size_t w4[] = {strlen(r4)};
    stream_reply(BT_TOOL_FORMAT_HERMES, r4, "", 1, w4);
    /* a tail that may open a call is held back, and shown once it cannot */
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_LLAMA3, "a { \"na", 7), 2);
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_LLAMA3, "a { \"x\"", 7), 7);
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_LLAMA3, "a <|python", 10), 2);
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_MISTRAL_ARGS, "a [TOOL_C", 9), 2);
    ck_assert_uint_eq(bt_tool_calls_plain_len(BT_TOOL_FORMAT_MISTRAL_ARGS, "a [TOOLS]", 9), 9);
    /* a malformed call: none while the text grows, -1 at its end */
    const char *bad = "[TOOL_CALLS]now[ARGS]{\"a\" 1}";
    struct bt_tool_scan s = {0};
    struct bt_tool_call c;
    bool oom;
    ck_assert_int_eq(bt_tool_scan_next(BT_TOOL_FORMAT_MISTRAL_ARGS, &s, bad, strlen(bad), false, &c, &oom), 0);
    ck_assert_int_eq(bt_tool_scan_next(BT_TOOL_FORMAT_MISTRAL_ARGS, &s, bad, strlen(bad), true, &c, &oom), -1);
    ck_assert_uint_eq(s.pos, 0);
}
END_TEST

/* What a stream sends of a reply fed one byte at a time, as a transcript:
 * content as it is, "<H name>" and "<A arguments>" for a call's head and
 * arguments. */
static void stream_transcript(enum bt_tool_format f, const char *reply, char *out, size_t cap) {
    struct bt_tool_stream s = {0};
    const size_t len = strlen(reply);
    size_t seen = 0, n = 0;
    out[0] = '\0';
    for (size_t l = 1; l <= len; l++) {
        for (;;) {
            bool call;
            const size_t to = bt_tool_stream_news(f, &s, reply, l, l == len, &seen, &call);
            ck_assert_uint_le(to, l);
            if (call) {
                n += (size_t)snprintf(out + n, cap - n, s.head_sent ? "<A %s>" : "<H %s>",
                                      s.head_sent ? s.call.arguments : s.call.name);
                bt_tool_stream_call_sent(&s, &seen);
            } else if (to > seen) {
                n += (size_t)snprintf(out + n, cap - n, "%.*s", (int)(to - seen), reply + seen);
                seen = to;
            } else {
                break;
            }
            ck_assert_uint_lt(n, cap);
        }
    }
    ck_assert_uint_eq(seen, len);
    bt_tool_stream_free(&s);
}

START_TEST(test_stream_events) {
    static const struct {
        enum bt_tool_format f;
        const char *reply, *sent;
    } cases[] = {
        {BT_TOOL_FORMAT_HERMES,
         "Let me look.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n"
         "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call>\n",
         "Let me look.\n<H now><A {}><H get_weather><A {\"city\":\"Oslo\"}>"},
        /* text after the calls, at the end */
        {BT_TOOL_FORMAT_HERMES, "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call> Done.",
         "<H now><A {}> Done."},
        /* a call not well formed after one that is: the rest is content */
        {BT_TOOL_FORMAT_HERMES,
         "<tool_call>{\"name\":\"now\",\"arguments\":{}}</tool_call><tool_call>{\"name\": 3}</tool_call>",
         "<H now><A {}><tool_call>{\"name\": 3}</tool_call>"},
        /* Mistral's list: its "," and "]" are no content */
        {BT_TOOL_FORMAT_MISTRAL,
         "ok [TOOL_CALLS][{\"name\": \"now\", \"arguments\": {}, \"id\": \"abcdefghi\"}, "
         "{\"name\": \"now\", \"arguments\": {\"a\": 1}, \"id\": \"abcdefghj\"}]",
         "ok <H now><A {}><H now><A {\"a\":1}>"},
        {BT_TOOL_FORMAT_LLAMA3, "Let me see: {\"name\": \"now\", \"parameters\": {}}",
         "Let me see: <H now><A {}>"},
        /* a "{" held back until it cannot open a call */
        {BT_TOOL_FORMAT_LLAMA3, "Hello { world {\"a\": 1}", "Hello { world {\"a\": 1}"},
        /* max_tokens cut a mark */
        {BT_TOOL_FORMAT_MISTRAL_ARGS, "[TOOL_CALLS]now[ARGS]{}[TOOL_C", "<H now><A {}>[TOOL_C"},
        {BT_TOOL_FORMAT_MISTRAL_CALL_ID, "Hi.[TOOL_CALLS]now[CALL_ID]abcdefghi[ARGS]{\"x\": [1, 2]}",
         "Hi.<H now><A {\"x\":[1,2]}>"},
    };
    char got[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stream_transcript(cases[i].f, cases[i].reply, got, sizeof got);
        ck_assert_str_eq(got, cases[i].sent);
    }
}
END_TEST

/* Qwen2's control token <|im_start|> standing for a mark such as Mistral's
 * [TOOL_CALLS] (a control token in Mistral's vocabulary): shown, a grammar
 * that begins with its text takes it and the stopper gives its text; not
 * shown, neither. */
START_TEST(test_shown_control) {
    char path[512], err[256];
    bt_tokenizer *tok;
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-qwen2.gguf", BATON_TEST_DATA);
    ck_assert_msg(bt_tokenizer_load(path, &tok, NULL, err, sizeof err) == BT_OK, "%s", err);
    const char *mark = "<|im_start|>";
    const int32_t id = bt_tokenizer_find(tok, mark, strlen(mark));
    size_t len;
    ck_assert_int_ge(id, 0);
    bt_tokenizer_piece(tok, id, 0, &len);
    ck_assert_uint_eq(len, 0); /* a control token: no text of its own */
    bt_grammar *g = bt_grammar_new();
    int32_t r = bt_grammar_add_rule(g);
    bt_grammar_add_alt(g, r);
    bt_grammar_add_lit(g, r, "<|im_start|>ok", strlen("<|im_start|>ok"));
    ck_assert_int_eq(bt_grammar_finish(g, r, err, sizeof err), BT_OK);
    bt_token_trie *trie;
    ck_assert_int_eq(bt_token_trie_new(tok, &trie, err, sizeof err), BT_OK);
    uint8_t *mask = malloc(bt_tokenizer_n_tokens(tok));
    for (int shown = 0; shown < 2; shown++) {
        bt_constraint *c = bt_constraint_new(g, trie);
        if (shown) bt_constraint_show_token(c, id);
        bt_constraint_mask(c, false, mask);
        ck_assert_int_eq(mask[id], shown);
        ck_assert_int_eq(bt_constraint_allows(c, id, false), shown);
        if (shown) {
            ck_assert(bt_constraint_accept(c, id));
            const int32_t ok = bt_tokenizer_find(tok, "ok", 2);
            ck_assert(bt_constraint_allows(c, ok, false));
            ck_assert(bt_constraint_accept(c, ok));
            ck_assert(bt_constraint_complete(c));
        }
        bt_constraint_free(c);
        /* the output's text */
        bt_stopper *st;
        ck_assert_int_eq(bt_stopper_create(NULL, 0, 2, &st, err, sizeof err), BT_OK);
        if (shown) bt_stopper_show_token(st, id);
        const char *text;
        ck_assert_int_eq(bt_stopper_push(st, tok, id, &text, &len), BT_STOP_NONE);
        char got[64];
        snprintf(got, sizeof got, "%.*s", (int)len, text);
        ck_assert_str_eq(got, shown ? mark : "");
        bt_stopper_free(st);
    }
    free(mask);
    bt_token_trie_free(trie);
    bt_grammar_free(g);
    bt_tokenizer_free(tok);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("tool_call");
    TCase *tc = tcase_create("tool_call");
    tcase_add_test(tc, test_detect);
    tcase_add_test(tc, test_grammars);
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_stream);
    tcase_add_test(tc, test_stream_events);
    tcase_add_test(tc, test_shown_control);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
