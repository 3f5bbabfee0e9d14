/* test_serve_api.c - the OpenAI request checks of `baton serve` (src/serve/
 * api.c) without a model or a socket: each bad body gets its status, the
 * parameter at fault and the words of its message; good bodies give the
 * values asked for, OpenAI's defaults otherwise; responses, chunks and error
 * objects are JSON of OpenAI's shape (read back with jansson). */
#include <check.h>
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "serve/api.h"
#include "serve/jobs.h"
#include "testutil.h"

static const struct bt_api_limits k_lim = {.model_id = "tiny", .max_tokens = 256, .n_vocab = 1000, .n_slots = 4};

struct bad_case {
    enum bt_api_kind kind;
    const char *body;
    int status;
    const char *param; /* NULL: none */
    const char *words; /* a part of the message */
};

#define C BT_API_COMPLETION
#define H BT_API_CHAT
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOL_F "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"

static const struct bad_case k_bad[] = {
    {C, "", 400, NULL, "body is empty"},
    {C, "{\"model\":\"tiny\",", 400, NULL, "not valid JSON: line 1"},
    {C, "[1,2]", 400, NULL, "must be a JSON object, not an array"},
    {C, "{\"model\":\"tiny\",\"model\":\"tiny\",\"prompt\":\"a\"}", 400, NULL, "duplicate"},
    {C, "{\"prompt\":\"a\"}", 400, "model", "must provide a 'model'"},
    {C, "{\"model\":7,\"prompt\":\"a\"}", 400, "model", "'model' must be a string, not an integer"},
    {C, "{\"model\":\"gpt-4\",\"prompt\":\"a\"}", 404, "model", "'gpt-4' does not exist"},
    {C, "{\"model\":\"tiny\"}", 400, "prompt", "must provide a 'prompt'"},
    {C, "{\"model\":\"tiny\",\"prompt\":{}}", 400, "prompt", "not an object"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"\"}", 400, "prompt", "'prompt' is empty"},
    {C, "{\"model\":\"tiny\",\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "several prompts"},
    {C, "{\"model\":\"tiny\",\"prompt\":[1,5000]}", 400, "prompt[1]", "token id 5000"},
    {C, "{\"model\":\"tiny\",\"prompt\":[1,\"x\"]}", 400, "prompt[1]", "must be a token id"},
    {H, "{\"model\":\"tiny\"}", 400, "messages", "must provide 'messages'"},
    {H, "{\"model\":\"tiny\",\"messages\":\"hi\"}", 400, "messages", "must be an array, not a string"},
    {H, "{\"model\":\"tiny\",\"messages\":[]}", 400, "messages", "'messages' is empty"},
    {H, "{\"model\":\"tiny\",\"messages\":[3]}", 400, "messages[0]", "must be an object"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role", "is missing"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role",
     "is 'wizard'"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content", "is missing"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content",
     "must be a string or an array of text parts"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
     "messages[0].content", "only 'text' parts"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400,
     "messages[0].tool_calls", "only allowed on an assistant message"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":{}}]}", 400,
     "messages[0].tool_calls", "must be an array, not an object"},
    {H, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}]}", 400,
     "messages[0].content", "is missing"},
    {H, "{\"model\":\"tiny\"," MSG ",\"max_tokens\":\"5\"}", 400, "max_tokens", "must be an integer, not a string"},
    {H, "{\"model\":\"tiny\"," MSG ",\"max_tokens\":0}", 400, "max_tokens", "between 1 and 256"},
    {H, "{\"model\":\"tiny\"," MSG ",\"max_tokens\":257}", 400, "max_tokens", "is 257"},
    {H, "{\"model\":\"tiny\"," MSG ",\"max_completion_tokens\":-1}", 400, "max_completion_tokens", "is -1"},
    {H, "{\"model\":\"tiny\"," MSG ",\"max_tokens\":2.5}", 400, "max_tokens", "not a number"},
    {H, "{\"model\":\"tiny\"," MSG ",\"temperature\":3}", 400, "temperature", "between 0 and 2"},
    {H, "{\"model\":\"tiny\"," MSG ",\"temperature\":\"hot\"}", 400, "temperature", "must be a number"},
    {H, "{\"model\":\"tiny\"," MSG ",\"top_p\":1.5}", 400, "top_p", "between 0 and 1"},
    {H, "{\"model\":\"tiny\"," MSG ",\"top_p\":0}", 400, "top_p", "above 0"},
    {H, "{\"model\":\"tiny\"," MSG ",\"presence_penalty\":-3}", 400, "presence_penalty", "between -2 and 2"},
    {H, "{\"model\":\"tiny\"," MSG ",\"frequency_penalty\":2.5}", 400, "frequency_penalty", "between -2 and 2"},
    {H, "{\"model\":\"tiny\"," MSG ",\"top_k\":-1}", 400, "top_k", "between 0 and"},
    {H, "{\"model\":\"tiny\"," MSG ",\"stream\":\"yes\"}", 400, "stream", "must be a boolean, not a string"},
    {H, "{\"model\":\"tiny\"," MSG ",\"cache_prompt\":1}", 400, "cache_prompt", "must be a boolean, not an integer"},
    {H, "{\"model\":\"tiny\"," MSG ",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
     "only allowed when 'stream' is true"},
    {H, "{\"model\":\"tiny\"," MSG ",\"stop\":7}", 400, "stop", "must be a string or an array"},
    {H, "{\"model\":\"tiny\"," MSG ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", "at most 4"},
    {H, "{\"model\":\"tiny\"," MSG ",\"stop\":[\"\"]}", 400, "stop", "1 to 256"},
    {H, "{\"model\":\"tiny\"," MSG ",\"stop\":[\"a\",null]}", 400, "stop", "'stop[1]' must be a string"},
    {H, "{\"model\":\"tiny\"," MSG ",\"n\":5}", 400, "n", "'n' is 5: this server runs 4 sequences at once"},
    {H, "{\"model\":\"tiny\"," MSG ",\"n\":0}", 400, "n", "'n'"},
    {H, "{\"model\":\"tiny\"," MSG ",\"seed\":1.5}", 400, "seed", "must be an integer"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logprobs\":1}", 400, "logprobs", "must be a boolean, not an integer"},
    {H, "{\"model\":\"tiny\"," MSG ",\"top_logprobs\":3}", 400, "top_logprobs", "needs 'logprobs': true"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logprobs\":false,\"top_logprobs\":1}", 400, "top_logprobs",
     "'top_logprobs' is 1: it needs 'logprobs': true"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs",
     "'top_logprobs' is 21: it must be between 0 and 20"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logprobs\":true,\"top_logprobs\":-1}", 400, "top_logprobs", "between 0 and 20"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logprobs\":true,\"top_logprobs\":\"2\"}", 400, "top_logprobs",
     "must be an integer, not a string"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"logprobs\":21}", 400, "logprobs",
     "'logprobs' is 21: it must be between 0 and 20"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"logprobs\":-1}", 400, "logprobs", "between 0 and 20"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs",
     "must be an integer (the alternatives per token, 0 to 20), not a boolean"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"logprobs\":2.5}", 400, "logprobs", "must be an integer"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"logprobs\":2,\"echo\":true}", 400, "logprobs",
     "'logprobs' with 'echo' is not supported"},
    {H, "{\"model\":\"tiny\"," MSG ",\"tools\":[{\"type\":\"function\"}]}", 400, "tools[0].function",
     "must be an object with a 'name'"},
    {H, "{\"model\":\"tiny\"," MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", 400,
     "tools[0].function.name", "1 to 64 letters"},
    {H, "{\"model\":\"tiny\"," MSG ",\"tools\":[" TOOL_F "],\"n\":2}", 400, "n",
     "'n' is 2: a request with 'tools' gives one choice on this server"},
    {H, "{\"model\":\"tiny\"," MSG ",\"tools\":[" TOOL_F "," TOOL_F "]}", 400, "tools[1].function.name",
     "the name of tools[0] too"},
    {H,
     "{\"model\":\"tiny\"," MSG ",\"tools\":[" TOOL_F "],\"tool_choice\":{\"type\":\"function\","
     "\"function\":{\"name\":\"g\"}}}",
     400, "tool_choice.function.name", "'g', which is not in 'tools'"},
    {H, "{\"model\":\"tiny\"," MSG ",\"tool_choice\":\"required\"}", 400, "tool_choice", "has no 'tools'"},
    {H,
     "{\"model\":\"tiny\"," MSG ",\"tools\":[" TOOL_F "],\"tool_choice\":\"required\","
     "\"response_format\":{\"type\":\"json_object\"}}",
     400, "tool_choice", "give one of them"},
    {H,
     "{\"model\":\"tiny\"," MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
     "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\",\"multipleOf\":1}}}}}]}",
     400, "tools[0].function.parameters.properties.x.multipleOf", "the schema keyword 'multipleOf' is not supported"},
    {H, "{\"model\":\"tiny\"," MSG ",\"response_format\":{\"type\":\"xml\"}}", 400, "response_format.type",
     "must be 'text', 'json_object' or 'json_schema'"},
    {H, "{\"model\":\"tiny\"," MSG ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}",
     400, "response_format.json_schema.schema", "is required"},
    {C,
     "{\"model\":\"tiny\",\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"schema\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/no\"}}}}}",
     400, "response_format.json_schema.schema.items", "'$ref' '#/$defs/no' does not name a schema"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logit_bias\":{\"x\":1}}", 400, "logit_bias", "key 'x' is not a token id"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logit_bias\":{\"1000\":1}}", 400, "logit_bias", "ids 0 to 999"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", "between -100 and 100"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logit_bias\":{\"5\":\"1\"}}", 400, "logit_bias", "must be a number"},
    {H, "{\"model\":\"tiny\"," MSG ",\"logit_bias\":[1]}", 400, "logit_bias", "must be an object"},
    {H, "{\"model\":\"tiny\"," MSG ",\"min_tokens\":-1}", 400, "min_tokens", "between 0 and 256"},
    {H, "{\"model\":\"tiny\"," MSG ",\"min_tokens\":9,\"max_tokens\":8}", 400, "min_tokens", "more than 'max_tokens'"},
    {H, "{\"model\":\"tiny\"," MSG ",\"ignore_eos\":1}", 400, "ignore_eos", "must be a boolean"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix", "not supported"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"a\",\"echo\":1}", 400, "echo", "must be a boolean"},
    {C, "{\"model\":\"tiny\",\"prompt\":\"\xff\"}", 400, NULL, "not valid JSON"},
};

START_TEST(test_bad_requests) {
    const struct bad_case *c = &k_bad[_i];
    struct bt_api_request r;
    struct bt_api_error e;
    memset(&e, 0, sizeof e);
    bool ok = bt_api_parse(c->kind, c->body, strlen(c->body), &k_lim, 1, &r, &e);
    ck_assert_msg(!ok, "case %d accepted: %s", _i, c->body);
    ck_assert_msg(e.status == c->status, "case %d: status %d, expected %d (%s)", _i, e.status, c->status, e.message);
    if (c->param)
        ck_assert_msg(e.param && !strcmp(e.param, c->param), "case %d: param '%s', expected '%s' (%s)", _i,
                      e.param ? e.param : "(null)", c->param, e.message);
    else
        ck_assert_msg(!e.param, "case %d: param '%s', expected none", _i, e.param);
    ck_assert_msg(strstr(e.message, c->words), "case %d: message '%s' lacks '%s'", _i, e.message, c->words);
    ck_assert_str_eq(e.type, "invalid_request_error");
    /* nothing was left for the caller to free */
    ck_assert_ptr_null(r.prompt);
    ck_assert_ptr_null(r.msgs);
    ck_assert_uint_eq(r.n_stops, 0);
    /* the error object is OpenAI's */
    char *js = bt_api_error_json(&e);
    ck_assert_ptr_nonnull(js);
    json_error_t je;
    json_t *o = json_loads(js, 0, &je);
    ck_assert_ptr_nonnull(o);
    json_t *eo = json_object_get(o, "error");
    ck_assert_str_eq(json_string_value(json_object_get(eo, "message")), e.message);
    ck_assert_str_eq(json_string_value(json_object_get(eo, "type")), "invalid_request_error");
    if (c->param)
        ck_assert_str_eq(json_string_value(json_object_get(eo, "param")), c->param);
    else
        ck_assert(json_is_null(json_object_get(eo, "param")));
    ck_assert_ptr_nonnull(json_object_get(eo, "code"));
    json_decref(o);
    free(js);
}
END_TEST

/* What clients send besides the arguments baton reads: unknown arguments and
 * message fields are ignored (OpenAI's `store`, vLLM's extensions, an
 * assistant turn that called tools), `top_logprobs: 0` asks for nothing, and
 * logit_bias, min_tokens and ignore_eos are read. */
START_TEST(test_client_fields) {
    const char *b = "{\"model\":\"tiny\",\"store\":false,\"metadata\":{\"a\":\"b\"},\"frobnicate\":1,"
                    "\"logprobs\":false,\"top_logprobs\":0,\"min_tokens\":3,\"ignore_eos\":true,"
                    "\"logit_bias\":{\"5\":100,\"7\":-100,\"0\":2.5},\"stream_options\":null,"
                    "\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"x_extra\":1},"
                    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
                    "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"},"
                    "{\"role\":\"user\",\"content\":\"and?\",\"name\":\"u\"}]}";
    struct bt_api_request r;
    struct bt_api_error e;
    ck_assert_msg(bt_api_parse(BT_API_CHAT, b, strlen(b), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert_uint_eq(r.n_msgs, 4);
    ck_assert_str_eq(r.msgs[1].role, "assistant");
    ck_assert_str_eq(r.msgs[1].content, "");
    /* what a Jinja template gets: every field, content as text, the arguments as an object */
    ck_assert_str_eq(r.msg_json[0], "{\"role\":\"user\",\"content\":\"hi\",\"x_extra\":1}");
    ck_assert_str_eq(r.msg_json[1], "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\","
                                    "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{}}}]}");
    ck_assert_str_eq(r.msg_json[2], "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}");
    ck_assert_str_eq(r.msg_json[3], "{\"role\":\"user\",\"content\":\"and?\",\"name\":\"u\"}");
    ck_assert_int_eq(r.min_tokens, 3);
    ck_assert(r.ignore_eos);
    ck_assert(!r.logprobs);
    ck_assert_uint_eq(r.n_bias, 3);
    int seen = 0;
    for (size_t i = 0; i < r.n_bias; i++) {
        if (r.bias_ids[i] == 5 && r.bias[i] == 100.0f) seen |= 1;
        if (r.bias_ids[i] == 7 && r.bias[i] == -100.0f) seen |= 2;
        if (r.bias_ids[i] == 0 && r.bias[i] == 2.5f) seen |= 4;
    }
    ck_assert_int_eq(seen, 7);
    bt_api_request_free(&r);
    /* a completion ignores the chat's arguments, and the reverse */
    const char *c = "{\"model\":\"tiny\",\"prompt\":\"a\",\"messages\":[],\"logit_bias\":{}}";
    ck_assert_msg(bt_api_parse(BT_API_COMPLETION, c, strlen(c), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert_uint_eq(r.n_bias, 0);
    ck_assert_int_eq(r.min_tokens, 0);
    ck_assert(!r.ignore_eos);
    bt_api_request_free(&r);
}
END_TEST

START_TEST(test_good_completion) {
    const char *b = "{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":16,\"temperature\":0,"
                    "\"stop\":[\"\\n\",\"END\"],\"seed\":-3,\"stream\":true,"
                    "\"stream_options\":{\"include_usage\":true},\"top_k\":5,\"user\":\"u\",\"logprobs\":null}";
    struct bt_api_request r;
    struct bt_api_error e;
    ck_assert_msg(bt_api_parse(BT_API_COMPLETION, b, strlen(b), &k_lim, 99, &r, &e), "%s", e.message);
    ck_assert_str_eq(r.prompt, "Hello");
    ck_assert_int_eq(r.max_tokens, 16);
    ck_assert(r.sampling.temp == 0.0f);
    ck_assert_int_eq(r.sampling.top_k, 5);
    ck_assert(r.seed_given);
    ck_assert_uint_eq(r.sampling.seed, (uint64_t)-3);
    ck_assert(r.stream && r.include_usage);
    ck_assert_uint_eq(r.n_stops, 2);
    ck_assert_str_eq(r.stops[0], "\n");
    ck_assert_str_eq(r.stops[1], "END");
    bt_api_request_free(&r);

    /* defaults: OpenAI's; no seed: the server's; token ids; one-string array */
    b = "{\"model\":\"tiny\",\"prompt\":[1,2,999]}";
    ck_assert(bt_api_parse(BT_API_COMPLETION, b, strlen(b), &k_lim, 99, &r, &e));
    ck_assert_ptr_null(r.prompt);
    ck_assert_uint_eq(r.n_prompt_ids, 3);
    ck_assert_int_eq(r.prompt_ids[2], 999);
    ck_assert_int_eq(r.max_tokens, -1);
    ck_assert(r.sampling.temp == 1.0f && r.sampling.top_p == 1.0f && r.sampling.top_k == 0);
    ck_assert(r.sampling.min_p == 0.0f && r.sampling.repeat_penalty == 1.0f);
    ck_assert(!r.seed_given && r.sampling.seed == 99);
    ck_assert(!r.stream);
    ck_assert(r.cache_prompt); /* llama-server's default */
    ck_assert_int_eq(r.n, 1);
    bt_api_request_free(&r);
    b = "{\"model\":\"tiny\",\"prompt\":[\"one\"],\"stop\":\"x\",\"cache_prompt\":false,\"n\":4}";
    ck_assert(bt_api_parse(BT_API_COMPLETION, b, strlen(b), &k_lim, 99, &r, &e));
    ck_assert(!r.cache_prompt);
    ck_assert_int_eq(r.n, 4);
    ck_assert_str_eq(r.prompt, "one");
    ck_assert_uint_eq(r.n_stops, 1);
    bt_api_request_free(&r);
}
END_TEST

START_TEST(test_good_chat) {
    const char *b = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                    "{\"role\":\"user\",\"name\":\"ann\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
                    "{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\",\"content\":\"Yes?\"}],"
                    "\"max_completion_tokens\":256,\"tool_choice\":\"none\",\"response_format\":{\"type\":\"text\"}}";
    struct bt_api_request r;
    struct bt_api_error e;
    ck_assert_msg(bt_api_parse(BT_API_CHAT, b, strlen(b), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert_uint_eq(r.n_msgs, 3);
    ck_assert_str_eq(r.msgs[0].role, "system");
    ck_assert_str_eq(r.msgs[0].content, "Be brief.");
    ck_assert_str_eq(r.msgs[1].content, "Hi there");
    ck_assert_str_eq(r.msgs[2].role, "assistant");
    /* a template sees developer as system and text parts as one text */
    ck_assert_str_eq(r.msg_json[0], "{\"role\":\"system\",\"content\":\"Be brief.\"}");
    ck_assert_str_eq(r.msg_json[1], "{\"role\":\"user\",\"name\":\"ann\",\"content\":\"Hi there\"}");
    ck_assert_int_eq(r.max_tokens, 256);
    bt_api_request_free(&r);
}
END_TEST

static json_t *load(char *s);

/* response_format and tools: the grammar of the answer, the tools for the template */
START_TEST(test_good_constrained) {
    const char *b = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":true,"
                    "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                    "\"required\":[\"a\"]}}}}";
    struct bt_api_request r;
    struct bt_api_error e;
    ck_assert_msg(bt_api_parse(BT_API_CHAT, b, strlen(b), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert_ptr_nonnull(r.grammar);
    ck_assert(bt_grammar_match(r.grammar, "{\"a\": 12}", 9));
    ck_assert(!bt_grammar_match(r.grammar, "{}", 2));
    ck_assert_int_eq(r.tool_choice, BT_API_TOOLS_NONE);
    bt_api_request_free(&r);
    b = "{\"model\":\"tiny\",\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\"}}";
    ck_assert_msg(bt_api_parse(BT_API_COMPLETION, b, strlen(b), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert(bt_grammar_match(r.grammar, "{\"k\":[1,{}]}", 12));
    ck_assert(!bt_grammar_match(r.grammar, "[1]", 3));
    bt_api_request_free(&r);
    b = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" TOOL_F ","
        "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}},\"parallel_tool_calls\":false}";
    ck_assert_msg(bt_api_parse(BT_API_CHAT, b, strlen(b), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert_uint_eq(r.n_tools, 2);
    ck_assert_str_eq(r.tools[1].name, "g");
    ck_assert_str_eq(r.tools[1].params, "{\"type\":\"object\"}");
    ck_assert_ptr_null(r.tools[0].params);
    ck_assert_int_eq(r.tool_choice, BT_API_TOOLS_NAMED);
    ck_assert_int_eq(r.tool_named, 1);
    ck_assert(!r.parallel_tool_calls);
    ck_assert_ptr_nonnull(r.tools_json);
    ck_assert_ptr_null(r.grammar); /* the call grammar needs the template's format: the server makes it */
    bt_api_request_free(&r);
    /* tool_choice "none": the tools are not given to the template */
    b = "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[" TOOL_F "],"
        "\"tool_choice\":\"none\"}";
    ck_assert_msg(bt_api_parse(BT_API_CHAT, b, strlen(b), &k_lim, 1, &r, &e), "%s", e.message);
    ck_assert_int_eq(r.tool_choice, BT_API_TOOLS_NONE);
    ck_assert_ptr_null(r.tools_json);
    bt_api_request_free(&r);
}
END_TEST

/* the answers that carry tool calls */
START_TEST(test_tool_output) {
    struct bt_api_request r;
    memset(&r, 0, sizeof r);
    r.kind = BT_API_CHAT;
    struct bt_tool_call calls[2] = {{(char *)"f", (char *)"{\"a\":1}", NULL}, {(char *)"g", (char *)"{}", NULL}};
    const struct bt_api_usage u = {3, 0, 4};
    json_t *o = load(bt_api_tool_response_json(&r, "chatcmpl-1", 5, "tiny", NULL, calls, 2, &u, NULL));
    json_t *c = json_array_get(json_object_get(o, "choices"), 0), *m = json_object_get(c, "message");
    ck_assert_str_eq(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    ck_assert(json_is_null(json_object_get(m, "content")));
    json_t *tc = json_array_get(json_object_get(m, "tool_calls"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(tc, "id")), "call_chatcmpl-1_1");
    ck_assert_str_eq(json_string_value(json_object_get(tc, "type")), "function");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(tc, "function"), "name")), "g");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{}");
    json_decref(o);
    /* a stream: each call's head, then its arguments */
    o = load(bt_api_tool_chunk_json(&r, "chatcmpl-1", 5, "tiny", &calls[0], 0, BT_API_CALL_HEAD));
    c = json_array_get(json_object_get(o, "choices"), 0);
    tc = json_array_get(json_object_get(json_object_get(c, "delta"), "tool_calls"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(tc, "index")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(tc, "id")), "call_chatcmpl-1_0");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(tc, "function"), "name")), "f");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "");
    ck_assert(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(o);
    o = load(bt_api_tool_chunk_json(&r, "chatcmpl-1", 5, "tiny", &calls[1], 1, BT_API_CALL_ARGS));
    c = json_array_get(json_object_get(o, "choices"), 0);
    tc = json_array_get(json_object_get(json_object_get(c, "delta"), "tool_calls"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(tc, "index")), 1);
    ck_assert_ptr_null(json_object_get(tc, "id"));
    ck_assert_ptr_null(json_object_get(json_object_get(tc, "function"), "name"));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")), "{}");
    json_decref(o);
    /* where the model writes ids (Mistral, which may repeat them): 9 letters or digits, one a call */
    calls[0].id = calls[1].id = (char *)"a1B2c3D4e";
    o = load(bt_api_tool_response_json(&r, "chatcmpl-1", 5, "tiny", "x", calls, 2, &u, NULL));
    c = json_array_get(json_object_get(o, "choices"), 0);
    const char *id0 = json_string_value(
        json_object_get(json_array_get(json_object_get(json_object_get(c, "message"), "tool_calls"), 0), "id"));
    tc = json_array_get(json_object_get(json_object_get(c, "message"), "tool_calls"), 1);
    const char *id1 = json_string_value(json_object_get(tc, "id"));
    ck_assert_uint_eq(strlen(id0), 9);
    ck_assert_uint_eq(strlen(id1), 9);
    ck_assert_str_ne(id0, id1);
    for (int k = 0; k < 9; k++) ck_assert(isalnum((unsigned char)id0[k]) && isalnum((unsigned char)id1[k]));
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(c, "message"), "content")), "x");
    json_decref(o);
}
END_TEST

static json_t *load(char *s) {
    ck_assert_ptr_nonnull(s);
    json_error_t je;
    json_t *o = json_loads(s, 0, &je);
    ck_assert_msg(o != NULL, "not JSON: %s", s);
    free(s);
    return o;
}

static const struct bt_api_usage U52 = {5, 4, 2}, U13 = {1, 0, 3}, U46 = {4, 3, 6}, U12 = {1, 0, 2};

START_TEST(test_output) {
    struct bt_api_request chat = {.kind = BT_API_CHAT}, cmpl = {.kind = BT_API_COMPLETION};
    json_t *o = load(bt_api_response_json(&chat, "chatcmpl-1", 1700000000, "tiny", "ok\xff", 3, "stop", &U52, NULL));
    ck_assert_str_eq(json_string_value(json_object_get(o, "object")), "chat.completion");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "message"), "content")), "ok\xEF\xBF\xBD");
    ck_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "usage"), "total_tokens")), 7);
    /* the prompt tokens reused from the cache, as OpenAI reports them */
    ck_assert_int_eq(json_integer_value(json_object_get(
                         json_object_get(json_object_get(o, "usage"), "prompt_tokens_details"), "cached_tokens")),
                     4);
    json_decref(o);

    o = load(bt_api_response_json(&cmpl, "cmpl-2", 1, "tiny", "abc", 3, "length", &U13, NULL));
    ck_assert_str_eq(json_string_value(json_object_get(o, "object")), "text_completion");
    ch = json_array_get(json_object_get(o, "choices"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(ch, "text")), "abc");
    ck_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "length");
    ck_assert(json_is_null(json_object_get(ch, "logprobs"))); /* not asked */
    json_decref(o);

    o = load(bt_api_chunk_json(&chat, "chatcmpl-1", 1, "tiny", "", 0, NULL, NULL, true));
    ck_assert_str_eq(json_string_value(json_object_get(o, "object")), "chat.completion.chunk");
    ch = json_array_get(json_object_get(o, "choices"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "delta"), "role")), "assistant");
    ck_assert(json_is_null(json_object_get(ch, "finish_reason")));
    json_decref(o);
    o = load(bt_api_chunk_json(&chat, "chatcmpl-1", 1, "tiny", "", 0, NULL, "stop", false));
    ch = json_array_get(json_object_get(o, "choices"), 0);
    ck_assert_uint_eq(json_object_size(json_object_get(ch, "delta")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(o);
    o = load(bt_api_usage_chunk_json(&chat, "chatcmpl-1", 1, "tiny", &U46));
    ck_assert_uint_eq(json_array_size(json_object_get(o, "choices")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens")), 6);
    ck_assert_int_eq(json_integer_value(json_object_get(
                         json_object_get(json_object_get(o, "usage"), "prompt_tokens_details"), "cached_tokens")),
                     3);
    json_decref(o);
    /* n choices: each at its index, one usage */
    const struct bt_api_choice two[2] = {{"a", 1, "stop", NULL}, {"bc", 2, "length", NULL}};
    o = load(bt_api_response_n_json(&chat, "chatcmpl-3", 1, "tiny", two, 2, &U46));
    ch = json_object_get(o, "choices");
    ck_assert_uint_eq(json_array_size(ch), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(ch, 1), "index")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(json_array_get(ch, 1), "message"), "content")),
                     "bc");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ch, 1), "finish_reason")), "length");
    json_decref(o);
    o = load(bt_api_chunk_index_json(&cmpl, "cmpl-3", 1, "tiny", 2, "x", 1, NULL, NULL, false));
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "index")), 2);
    json_decref(o);
    o = load(bt_api_models_json("tiny", 5));
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(o, "data"), 0), "id")), "tiny");
    json_decref(o);
}
END_TEST

/* logprobs asked: chat's logprobs true and top_logprobs N, completions'
 * logprobs N (0: the tokens' own, no alternatives; false or null: none) */
START_TEST(test_good_logprobs) {
    struct {
        enum bt_api_kind kind;
        const char *args;
        bool logprobs;
        int top;
    } k[] = {
        {H, "\"logprobs\":true,\"top_logprobs\":3", true, 3}, {H, "\"logprobs\":true", true, 0},
        {H, "\"logprobs\":true,\"top_logprobs\":20", true, 20}, {H, "\"logprobs\":false,\"top_logprobs\":0", false, 0},
        {H, "\"logprobs\":null,\"top_logprobs\":null", false, 0}, {C, "\"logprobs\":2", true, 2},
        {C, "\"logprobs\":0", true, 0}, {C, "\"logprobs\":20", true, 20}, {C, "\"logprobs\":false", false, 0},
        {C, "\"logprobs\":null,\"echo\":true", false, 0},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char b[256];
        snprintf(b, sizeof b, "{\"model\":\"tiny\",%s,%s}", k[i].kind == H ? MSG : "\"prompt\":\"a\"", k[i].args);
        struct bt_api_request r;
        struct bt_api_error e;
        ck_assert_msg(bt_api_parse(k[i].kind, b, strlen(b), &k_lim, 1, &r, &e), "%s: %s", b, e.message);
        ck_assert_msg(r.logprobs == k[i].logprobs && r.top_logprobs == k[i].top, "%s: logprobs %d, top %d", b,
                      (int)r.logprobs, (int)r.top_logprobs);
        bt_api_request_free(&r);
    }
}
END_TEST

/* the logprobs objects: chat's content list with bytes and top_logprobs,
 * completions' four lists; floats with a float's 9 digits, -inf as -9999 */
START_TEST(test_logprobs_output) {
    struct bt_api_request chat = {.kind = BT_API_CHAT, .logprobs = true, .top_logprobs = 2},
                          cmpl = {.kind = BT_API_COMPLETION, .logprobs = true, .top_logprobs = 2};
    const bt_logprobs lp[2] = {
        {.id = 7, .logprob = -0.1f, .n_top = 2, .top_id = {7, 9}, .top_logprob = {-0.1f, -2.5f}},
        {.id = 8, .logprob = -INFINITY, .n_top = 2, .top_id = {3, 5}, .top_logprob = {-1.0f, -1.0f}},
    };
    const struct bt_api_piece piece[2] = {{"H\xc3", 2}, {"\xa9 x", 3}}; /* "Hé x" split inside the é */
    const struct bt_api_piece top[2][BT_MAX_TOP_LOGPROBS] = {{{"H\xc3", 2}, {"Hi", 2}}, {{"a", 1}, {"a", 1}}};
    const struct bt_api_logprobs v = {.lp = lp, .piece = piece, .top = top, .n = 2, .text_offset = 0};
    char *js = bt_api_response_json(&chat, "c", 1, "tiny", "H\xc3\xa9 x", 5, "stop", &U12, &v);
    ck_assert_ptr_nonnull(js);
    ck_assert_msg(strstr(js, "\"logprob\":-0.100000001,") != NULL, "%s", js); /* (double)-0.1f to 9 digits */
    json_t *o = load(js);
    json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs"),
                                      "content");
    ck_assert_uint_eq(json_array_size(content), 2);
    json_t *e0 = json_array_get(content, 0), *e1 = json_array_get(content, 1);
    ck_assert_str_eq(json_string_value(json_object_get(e0, "token")), "H\xEF\xBF\xBD"); /* a part character */
    json_t *bytes = json_object_get(e0, "bytes");
    ck_assert_uint_eq(json_array_size(bytes), 2);
    ck_assert_int_eq(json_integer_value(json_array_get(bytes, 1)), 0xc3);
    ck_assert((float)json_real_value(json_object_get(e0, "logprob")) == -0.1f);
    json_t *t0 = json_object_get(e0, "top_logprobs");
    ck_assert_uint_eq(json_array_size(t0), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(t0, 1), "token")), "Hi");
    ck_assert(json_real_value(json_object_get(json_array_get(t0, 1), "logprob")) == -2.5);
    ck_assert_uint_eq(json_array_size(json_object_get(json_array_get(t0, 1), "bytes")), 2);
    ck_assert(json_real_value(json_object_get(e1, "logprob")) == -9999.0);
    json_decref(o);

    o = load(bt_api_response_json(&cmpl, "c", 1, "tiny", "H\xc3\xa9 x", 5, "stop", &U12, &v));
    json_t *l = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(l, "tokens"), 1)), "\xEF\xBF\xBD x");
    ck_assert((float)json_real_value(json_array_get(json_object_get(l, "token_logprobs"), 0)) == -0.1f);
    ck_assert(json_real_value(json_array_get(json_object_get(l, "token_logprobs"), 1)) == -9999.0);
    json_t *tl = json_object_get(l, "top_logprobs");
    ck_assert_uint_eq(json_object_size(json_array_get(tl, 0)), 2);
    ck_assert(json_real_value(json_object_get(json_array_get(tl, 0), "Hi")) == -2.5);
    ck_assert_uint_eq(json_object_size(json_array_get(tl, 1)), 1); /* two tokens "a": the first kept */
    /* character offsets: the \xc3\xa9 counts in the first token, which holds its lead byte */
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 0)), 0);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 1)), 2);
    ck_assert_int_eq(bt_api_logprobs_chars(&v), 4);
    json_decref(o);

    /* a chunk carries its tokens' entries; one without tokens an empty list, one not asked null */
    o = load(bt_api_chunk_json(&chat, "c", 1, "tiny", "H", 1, &v, NULL, false));
    ck_assert_uint_eq(json_array_size(json_object_get(
                          json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs"), "content")),
                      2);
    json_decref(o);
    const struct bt_api_logprobs none = {.n = 0, .text_offset = 4};
    o = load(bt_api_chunk_json(&cmpl, "c", 1, "tiny", "", 0, &none, "stop", false));
    l = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    ck_assert_uint_eq(json_array_size(json_object_get(l, "tokens")), 0);
    json_decref(o);
    o = load(bt_api_chunk_json(&chat, "c", 1, "tiny", "", 0, NULL, NULL, true));
    ck_assert(json_is_null(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs")));
    json_decref(o);
}
END_TEST

/* llama-server's /tokenize and /detokenize bodies: each bad one a 400 naming
 * the field (T: /tokenize, D: /detokenize) */
static const struct tok_bad_case {
    bool detok;
    const char *body;
    const char *param; /* NULL: none */
    const char *words;
} k_tok_bad[] = {
    {false, "", NULL, "body is empty"},
    {false, "{\"content\":", NULL, "not valid JSON: line 1"},
    {false, "[\"a\"]", NULL, "must be a JSON object, not an array"},
    {false, "{}", "content", "you must provide 'content'"},
    {false, "{\"content\":null}", "content", "you must provide 'content'"},
    {false, "{\"content\":5}", "content", "'content' must be a string, not an integer"},
    {false, "{\"content\":[\"a\"]}", "content", "'content' must be a string, not an array"},
    {false, "{\"content\":\"a\",\"add_special\":1}", "add_special", "'add_special' must be a boolean, not an integer"},
    {false, "{\"content\":\"a\",\"with_pieces\":\"yes\"}", "with_pieces", "'with_pieces' must be a boolean, not a string"},
    {false, "{\"content\":\"a\",\"parse_special\":{}}", "parse_special", "must be a boolean, not an object"},
    {true, "", NULL, "body is empty"},
    {true, "[1]", NULL, "must be a JSON object, not an array"},
    {true, "{}", "tokens", "you must provide 'tokens'"},
    {true, "{\"tokens\":\"1 2\"}", "tokens", "'tokens' must be an array of token ids, not a string"},
    {true, "{\"tokens\":[1,\"2\"]}", "tokens[1]", "'tokens[1]' must be a token id (an integer), not a string"},
    {true, "{\"tokens\":[1,2.5]}", "tokens[1]", "must be a token id (an integer), not a number"},
    {true, "{\"tokens\":[0,1000]}", "tokens[1]", "'tokens[1]' is token id 1000: the vocabulary has ids 0 to 999"},
    {true, "{\"tokens\":[-1]}", "tokens[0]", "'tokens[0]' is token id -1"},
};

START_TEST(test_tokenize_bad) {
    const struct tok_bad_case *c = &k_tok_bad[_i];
    struct bt_api_error e;
    memset(&e, 0, sizeof e);
    bool ok;
    if (c->detok) {
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        ok = bt_api_parse_detokenize(c->body, strlen(c->body), &k_lim, &ids, &n, &e);
        ck_assert_ptr_null(ids); /* nothing left to free */
        ck_assert_uint_eq(n, 0);
    } else {
        struct bt_api_tokenize t;
        ok = bt_api_parse_tokenize(c->body, strlen(c->body), &t, &e);
        ck_assert_ptr_null(t.content);
    }
    ck_assert_msg(!ok, "case %d accepted: %s", _i, c->body);
    ck_assert_int_eq(e.status, 400);
    ck_assert_str_eq(e.type, "invalid_request_error");
    if (c->param)
        ck_assert_msg(e.param && !strcmp(e.param, c->param), "case %d: param '%s', expected '%s'", _i,
                      e.param ? e.param : "(null)", c->param);
    else
        ck_assert_msg(!e.param, "case %d: param '%s', expected none", _i, e.param);
    ck_assert_msg(strstr(e.message, c->words), "case %d: message '%s' lacks '%s'", _i, e.message, c->words);
}
END_TEST

START_TEST(test_tokenize_good) {
    struct bt_api_tokenize t;
    struct bt_api_error e;
    /* llama-server's defaults: no BOS/EOS, control-token text parsed, ids only */
    const char *b = "{\"content\":\"Hi <|end|>\\u00e9\"}";
    ck_assert_msg(bt_api_parse_tokenize(b, strlen(b), &t, &e), "%s", e.message);
    ck_assert_str_eq(t.content, "Hi <|end|>\xc3\xa9");
    ck_assert_uint_eq(t.len, 12);
    ck_assert(!t.add_special && t.parse_special && !t.with_pieces);
    bt_api_tokenize_free(&t);
    b = "{\"content\":\"\",\"add_special\":true,\"parse_special\":false,\"with_pieces\":true,\"x\":1}";
    ck_assert_msg(bt_api_parse_tokenize(b, strlen(b), &t, &e), "%s", e.message);
    ck_assert_uint_eq(t.len, 0);
    ck_assert_str_eq(t.content, "");
    ck_assert(t.add_special && !t.parse_special && t.with_pieces);
    bt_api_tokenize_free(&t);

    int32_t *ids;
    size_t n;
    b = "{\"tokens\":[0,5,999]}";
    ck_assert_msg(bt_api_parse_detokenize(b, strlen(b), &k_lim, &ids, &n, &e), "%s", e.message);
    ck_assert_uint_eq(n, 3);
    ck_assert(ids[0] == 0 && ids[1] == 5 && ids[2] == 999);
    free(ids);
    b = "{\"tokens\":[]}";
    ck_assert_msg(bt_api_parse_detokenize(b, strlen(b), &k_lim, &ids, &n, &e), "%s", e.message);
    ck_assert_uint_eq(n, 0);
    ck_assert_ptr_null(ids);

    /* the answers: ids; pieces as text, a part of a character as its bytes */
    const int32_t tid[3] = {1, 42, 7};
    json_t *o = load(bt_api_tokenize_json(tid, 3, NULL));
    json_t *a = json_object_get(o, "tokens");
    ck_assert_uint_eq(json_array_size(a), 3);
    ck_assert_int_eq(json_integer_value(json_array_get(a, 1)), 42);
    json_decref(o);
    const struct bt_api_piece piece[3] = {{"<s>", 3}, {" H\xc3", 3}, {"\xa9", 1}};
    o = load(bt_api_tokenize_json(tid, 3, piece));
    a = json_object_get(o, "tokens");
    ck_assert_uint_eq(json_array_size(a), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(a, 0), "id")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(a, 0), "piece")), "<s>");
    json_t *bytes = json_object_get(json_array_get(a, 1), "piece");
    ck_assert(json_is_array(bytes));
    ck_assert_uint_eq(json_array_size(bytes), 3);
    ck_assert_int_eq(json_integer_value(json_array_get(bytes, 0)), ' ');
    ck_assert_int_eq(json_integer_value(json_array_get(bytes, 2)), 0xc3);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(json_array_get(a, 2), "piece"), 0)), 0xa9);
    json_decref(o);
    o = load(bt_api_tokenize_json(NULL, 0, NULL));
    ck_assert_uint_eq(json_array_size(json_object_get(o, "tokens")), 0);
    json_decref(o);
    o = load(bt_api_detokenize_json("Hi \xc3\xa9\xff", 6));
    ck_assert_str_eq(json_string_value(json_object_get(o, "content")), "Hi \xc3\xa9\xEF\xBF\xBD");
    json_decref(o);
}
END_TEST

/* GET /v1/models/{id}: the object /v1/models lists; another id a 404 */
START_TEST(test_model_get) {
    json_t *list = load(bt_api_models_json("tiny", 5)), *one = load(bt_api_model_json("tiny", 5));
    ck_assert(json_equal(json_array_get(json_object_get(list, "data"), 0), one));
    ck_assert_str_eq(json_string_value(json_object_get(one, "object")), "model");
    ck_assert_int_eq(json_integer_value(json_object_get(one, "created")), 5);
    json_decref(list);
    json_decref(one);
    struct bt_api_error e;
    ck_assert(bt_api_model_check("tiny", "tiny", &e));
    ck_assert(!bt_api_model_check("gpt-4", "tiny", &e));
    ck_assert_int_eq(e.status, 404);
    ck_assert_str_eq(e.code, "model_not_found");
    ck_assert_str_eq(e.param, "model");
    ck_assert_str_eq(e.message, "The model 'gpt-4' does not exist (this server has 'tiny')");
    ck_assert(!bt_api_model_check("", "tiny", &e));
    ck_assert(!bt_api_model_check("tin", "tiny", &e));
}
END_TEST

/* the hand-over between HTTP threads and the engine's thread (jobs.c) */
START_TEST(test_jobs) {
    struct bt_jobs q;
    bt_jobs_init(&q, 2, 1); /* 2 slots, 1 waiting */
    struct bt_job *j[4];
    for (int i = 0; i < 4; i++) ck_assert_ptr_nonnull(j[i] = bt_job_new());
    ck_assert_int_eq(bt_jobs_submit(&q, j[0]), BT_OK);
    ck_assert_int_eq(bt_jobs_submit(&q, j[1]), BT_OK);
    ck_assert_int_eq(bt_jobs_submit(&q, j[2]), BT_OK);
    ck_assert_int_eq(bt_jobs_submit(&q, j[3]), BT_ERR_CAPACITY); /* 2 slots + 1 queued */
    ck_assert_int_eq(bt_jobs_active(&q), 3);
    /* oldest first; untake puts it back in front */
    ck_assert_ptr_eq(bt_jobs_take(&q), j[0]);
    ck_assert_ptr_eq(bt_jobs_take(&q), j[1]);
    bt_jobs_untake(&q, j[1]);
    ck_assert_ptr_eq(bt_jobs_take(&q), j[1]);
    int queued, running;
    bt_jobs_counts(&q, &queued, &running);
    ck_assert_int_eq(queued, 1);
    ck_assert_int_eq(running, 2);
    /* a queued job cancelled ends at once; a running one waits for the engine */
    bt_jobs_cancel(&q, j[2]);
    ck_assert_int_eq(j[2]->state, BT_JOB_DONE);
    ck_assert_int_eq(j[2]->res.finish, BT_FINISH_CANCELLED);
    ck_assert_ptr_null(bt_jobs_take(&q));
    j[1]->batch_id = 77;
    bt_jobs_cancel(&q, j[1]);
    uint64_t ids[4];
    ck_assert_int_eq(bt_jobs_cancels(&q, ids, 4), 1);
    ck_assert_uint_eq(ids[0], 77);
    ck_assert_int_eq(bt_jobs_cancels(&q, ids, 4), 0); /* once */
    /* text, then the end */
    const bt_logprobs lp = {.id = 4, .logprob = -0.5f};
    bt_job_emit(&q, j[0], "ab", 2, &lp);
    bt_job_emit(&q, j[0], "", 0, &lp); /* a token with nothing to show yet */
    bt_job_emit(&q, j[0], "c", 1, NULL); /* one not listed (an end-of-generation token) */
    ck_assert_uint_eq(j[0]->n_lp, 2);
    ck_assert(j[0]->lp[1].id == 4 && j[0]->lp[1].logprob == -0.5f);
    ck_assert_uint_eq(j[0]->len, 3);
    ck_assert_str_eq(j[0]->text, "abc");
    ck_assert_int_eq(j[0]->n_tokens, 3);
    struct bt_gen_result r = {.finish = BT_FINISH_LENGTH, .n_gen = 3};
    bt_job_finish(&q, j[0], &r, NULL);
    r.finish = BT_FINISH_CANCELLED;
    bt_job_finish(&q, j[1], &r, NULL);
    ck_assert_int_eq(j[0]->state, BT_JOB_DONE);
    ck_assert_int_eq(bt_jobs_active(&q), 0);
    /* closed: draining refuses, a failure says why and ends what waits */
    ck_assert_int_eq(bt_jobs_submit(&q, j[3]), BT_OK);
    bt_jobs_close(&q, "rank 1 died");
    ck_assert_int_eq(j[3]->state, BT_JOB_DONE);
    ck_assert_int_eq(j[3]->res.finish, BT_FINISH_ERROR);
    ck_assert_str_eq(j[3]->error, "rank 1 died");
    struct bt_job *late = bt_job_new();
    ck_assert_int_eq(bt_jobs_submit(&q, late), BT_ERR_COMM);
    bt_job_release(&q, late);
    for (int i = 0; i < 4; i++) bt_job_release(&q, j[i]);
    bt_jobs_destroy(&q);

    bt_jobs_init(&q, 1, 0);
    struct bt_job *d = bt_job_new();
    bt_jobs_close(&q, NULL);
    ck_assert_int_eq(bt_jobs_submit(&q, d), BT_ERR_ABORTED);
    bt_job_release(&q, d);
    bt_jobs_destroy(&q);
}
END_TEST

/* POST /v1/embeddings: each bad body a 400 (404 for the model) naming the parameter */
static const struct embd_bad_case {
    int status;
    const char *param, *words, *body;
} k_embd_bad[] = {
    {400, "input", "you must provide 'input'", "{\"model\":\"tiny\"}"},
    {400, "input", "'input' is empty", "{\"model\":\"tiny\",\"input\":\"\"}"},
    {400, "input", "'input' is empty", "{\"model\":\"tiny\",\"input\":[]}"},
    {400, "input[1]", "'input[1]' is empty", "{\"model\":\"tiny\",\"input\":[\"a\",\"\"]}"},
    {400, "input[1]", "'input[1]' is empty", "{\"model\":\"tiny\",\"input\":[[1],[]]}"},
    {400, "input", "'input' must be a string, an array of strings, token ids or arrays of token ids, not an object",
     "{\"model\":\"tiny\",\"input\":{}}"},
    {400, "input[1]", "'input[1]' must be a string or an array of token ids, not a number",
     "{\"model\":\"tiny\",\"input\":[\"a\",1.5]}"},
    {400, "input[1]", "'input[1]' must be a token id (an integer), not a string",
     "{\"model\":\"tiny\",\"input\":[1,\"a\"]}"},
    {400, "input[0][1]", "'input[0][1]' is token id 1000: the vocabulary has ids 0 to 999",
     "{\"model\":\"tiny\",\"input\":[[1,1000]]}"},
    {400, "encoding_format", "'encoding_format' is 'int8': give float or base64",
     "{\"model\":\"tiny\",\"input\":\"a\",\"encoding_format\":\"int8\"}"},
    {400, "encoding_format", "'encoding_format' must be a string, not an integer",
     "{\"model\":\"tiny\",\"input\":\"a\",\"encoding_format\":1}"},
    {400, "dimensions", "'dimensions' is not supported by this server",
     "{\"model\":\"tiny\",\"input\":\"a\",\"dimensions\":8}"},
    {400, "model", "you must provide a 'model'", "{\"input\":\"a\"}"},
    {404, "model", "The model 'gpt-4' does not exist", "{\"model\":\"gpt-4\",\"input\":\"a\"}"},
    {400, NULL, "not valid JSON", "{\"model\":"},
};

START_TEST(test_embeddings_bad) {
    const struct embd_bad_case *c = &k_embd_bad[_i];
    struct bt_api_embeddings q;
    struct bt_api_error e;
    ck_assert_msg(!bt_api_parse_embeddings(c->body, strlen(c->body), &k_lim, &q, &e), "case %d accepted: %s", _i,
                  c->body);
    ck_assert_ptr_null(q.in); /* nothing left to free */
    ck_assert_int_eq(e.status, c->status);
    if (c->param)
        ck_assert_msg(e.param && !strcmp(e.param, c->param), "case %d: param '%s', expected '%s'", _i,
                      e.param ? e.param : "(null)", c->param);
    ck_assert_msg(strstr(e.message, c->words), "case %d: message '%s' lacks '%s'", _i, e.message, c->words);
}
END_TEST

START_TEST(test_embeddings_good) {
    struct bt_api_embeddings q;
    struct bt_api_error e;
    /* the four shapes of input */
    const char *b = "{\"model\":\"tiny\",\"input\":\"hi\",\"user\":\"u\",\"frob\":1}";
    ck_assert_msg(bt_api_parse_embeddings(b, strlen(b), &k_lim, &q, &e), "%s", e.message);
    ck_assert(q.n == 1 && q.in[0].len == 2 && !strcmp(q.in[0].text, "hi") && !q.in[0].ids && !q.base64);
    bt_api_embeddings_free(&q);
    b = "{\"model\":\"tiny\",\"input\":[3,4,5],\"encoding_format\":\"base64\"}";
    ck_assert_msg(bt_api_parse_embeddings(b, strlen(b), &k_lim, &q, &e), "%s", e.message);
    ck_assert(q.n == 1 && q.in[0].n_ids == 3 && q.in[0].ids[2] == 5 && !q.in[0].text && q.base64);
    bt_api_embeddings_free(&q);
    b = "{\"model\":\"tiny\",\"input\":[\"a\",[7,8],\"bc\"],\"encoding_format\":\"float\"}";
    ck_assert_msg(bt_api_parse_embeddings(b, strlen(b), &k_lim, &q, &e), "%s", e.message);
    ck_assert(q.n == 3 && !strcmp(q.in[0].text, "a") && q.in[1].n_ids == 2 && q.in[1].ids[0] == 7 &&
              !strcmp(q.in[2].text, "bc"));
    bt_api_embeddings_free(&q);

    /* the answer: OpenAI's list; base64 of the little-endian float32 bytes */
    const float v0[2] = {1.0f, -0.5f}, v1[2] = {0.25f, 0.0f};
    const float *vec[2] = {v0, v1};
    json_t *o = load(bt_api_embeddings_json("tiny", vec, 2, 2, false, 7));
    ck_assert_str_eq(json_string_value(json_object_get(o, "object")), "list");
    ck_assert_str_eq(json_string_value(json_object_get(o, "model")), "tiny");
    json_t *d = json_object_get(o, "data");
    ck_assert_uint_eq(json_array_size(d), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(d, 1), "index")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 1), "object")), "embedding");
    ck_assert(json_real_value(json_array_get(json_object_get(json_array_get(d, 0), "embedding"), 1)) == -0.5);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "usage"), "prompt_tokens")), 7);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "usage"), "total_tokens")), 7);
    json_decref(o);
    o = load(bt_api_embeddings_json("tiny", vec, 2, 2, true, 7));
    d = json_object_get(o, "data");
    /* 1.0f = 00 00 80 3f, -0.5f = 00 00 00 bf */
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(d, 0), "embedding")), "AACAPwAAAL8=");
    json_decref(o);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("serve_api");
    TCase *tc = tcase_create("requests");
    tcase_add_loop_test(tc, test_bad_requests, 0, (int)(sizeof k_bad / sizeof k_bad[0]));
    tcase_add_test(tc, test_good_completion);
    tcase_add_test(tc, test_client_fields);
    tcase_add_test(tc, test_good_chat);
    tcase_add_test(tc, test_good_constrained);
    tcase_add_test(tc, test_tool_output);
    tcase_add_test(tc, test_output);
    tcase_add_test(tc, test_good_logprobs);
    tcase_add_test(tc, test_logprobs_output);
    tcase_add_test(tc, test_jobs);
    tcase_add_loop_test(tc, test_tokenize_bad, 0, (int)(sizeof k_tok_bad / sizeof k_tok_bad[0]));
    tcase_add_test(tc, test_tokenize_good);
    tcase_add_test(tc, test_model_get);
    tcase_add_loop_test(tc, test_embeddings_bad, 0, (int)(sizeof k_embd_bad / sizeof k_embd_bad[0]));
    tcase_add_test(tc, test_embeddings_good);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
