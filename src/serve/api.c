/* api.c - OpenAI request bodies parsed and checked (jansson), and the JSON
 * of responses, stream chunks, model lists and error objects (api.h).
 *
 * The checks are OpenAI's where it documents a range (temperature 0..2,
 * top_p 0..1, penalties -2..2, at most 4 stop strings, n 1 here) and
 * llama.cpp server's for the extensions (top_k, min_p, repeat_penalty).  An
 * argument OpenAI defines that baton does not implement (n > 1, best_of,
 * suffix, logprobs with echo) is a 400 naming it, never ignored in silence.
 *
 * response_format and tools become grammars (json_schema.h, tool_call.h):
 * a schema is compiled here, so a bad one is a 400 naming its path
 * ("response_format.json_schema.schema.properties.age.minimum") before
 * anything runs.
 *
 * logprobs are the model's: the log-softmax of the raw logits (before
 * logit_bias, penalties, temperature and the filters), as OpenAI reports
 * them; llama-server's n_probs reports the sampler's probabilities instead. */
#include "api.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../text/json_schema.h"
#include "../text/tokenizer.h" /* bt_utf8_check */

void bt_api_error_set(struct bt_api_error *e, int status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = NULL;
    if (param) {
        snprintf(e->param_buf, sizeof e->param_buf, "%s", param);
        e->param = e->param_buf;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

#define BAD(param, ...) bt_api_error_set(err, 400, "invalid_request_error", (param), NULL, __VA_ARGS__)

void bt_api_request_free(struct bt_api_request *r) {
    if (!r) return;
    free(r->prompt);
    free(r->prompt_ids);
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
        if (r->msg_json) free(r->msg_json[i]);
    }
    free(r->msgs);
    free(r->msg_json);
    for (size_t i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->bias_ids);
    free(r->bias);
    bt_grammar_free(r->grammar);
    for (size_t i = 0; i < r->n_tools; i++) {
        free((char *)r->tools[i].name);
        free((char *)r->tools[i].params);
    }
    free(r->tools);
    free(r->tools_json);
    memset(r, 0, sizeof *r);
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

/* A number in [lo, hi] (JSON integers count); absent or null keeps *out. */
static bool get_number(json_t *o, const char *key, double lo, double hi, float *out, struct bt_api_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        BAD(key, "'%s' must be a number, not %s", key, json_kind(v));
        return false;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        BAD(key, "'%s' is %g: it must be between %g and %g", key, x, lo, hi);
        return false;
    }
    *out = (float)x;
    return true;
}

/* An integer in [lo, hi]; absent or null: false in *given. */
static bool get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, bool *given,
                    struct bt_api_error *err) {
    json_t *v = json_object_get(o, key);
    if (given) *given = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) {
        BAD(key, "'%s' must be an integer, not %s", key, json_kind(v));
        return false;
    }
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        BAD(key, "'%s' is %lld: it must be between %lld and %lld", key, (long long)x, (long long)lo, (long long)hi);
        return false;
    }
    *out = (int64_t)x;
    if (given) *given = true;
    return true;
}

static bool get_bool(json_t *o, const char *key, bool *out, struct bt_api_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        BAD(key, "'%s' must be a boolean, not %s", key, json_kind(v));
        return false;
    }
    *out = json_is_true(v);
    return true;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* v, the value of param, as a JSON array of n >= 1 entries; else false and
 * "'PARAM' must be KIND, not ..." or "'PARAM' is empty" + EMPTY_MORE. */
static bool nonempty_array(const json_t *v, const char *param, const char *kind, const char *empty_more, size_t *n,
                           struct bt_api_error *err) {
    if (!json_is_array(v)) {
        BAD(param, "'%s' must be %s, not %s", param, kind, json_kind(v));
        return false;
    }
    *n = json_array_size(v);
    if (*n == 0) {
        BAD(param, "'%s' is empty%s", param, empty_more);
        return false;
    }
    return true;
}

static bool nomem(struct bt_api_error *err) {
    bt_api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return false;
}

/* Arguments that are not known to this server are ignored, as llama.cpp's
 * server and vLLM ignore them (clients send their own: `store`, `metadata`,
 * `service_tier`, ...); the known ones are checked below, and one that asks
 * for what this server does not do is refused in words that say so. */

/* Arguments baton does not implement: allowed only when they ask for nothing. */
static bool check_unsupported(enum bt_api_kind kind, json_t *o, struct bt_api_error *err) {
    json_t *v;
    if (kind == BT_API_COMPLETION) {
        if ((v = json_object_get(o, "suffix")) && !json_is_null(v)) {
            BAD("suffix", "'suffix' is not supported by this server");
            return false;
        }
        if ((v = json_object_get(o, "best_of")) && !json_is_null(v) &&
            !(json_is_integer(v) && json_integer_value(v) == 1)) {
            BAD("best_of", "'best_of' must be 1 on this server");
            return false;
        }
    }
    if ((v = json_object_get(o, "user")) && !json_is_null(v) && !json_is_string(v)) {
        BAD("user", "'user' must be a string, not %s", json_kind(v));
        return false;
    }
    return true;
}

/* The token ids of the array a (key: its name in messages), each below
 * lim->n_vocab, into *out (malloc'd; NULL when a is empty). */
static bool parse_ids(json_t *a, const char *key, const struct bt_api_limits *lim, int32_t **out,
                      struct bt_api_error *err) {
    size_t n = json_array_size(a);
    *out = NULL;
    if (n == 0) return true;
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        char param[48];
        snprintf(param, sizeof param, "%s[%zu]", key, i);
        if (!json_is_integer(t)) {
            BAD(param, "'%s' must be a token id (an integer), not %s", param, json_kind(t));
            free(ids);
            return false;
        }
        json_int_t id = json_integer_value(t);
        if (id < 0 || id >= (json_int_t)lim->n_vocab) {
            BAD(param, "'%s' is token id %lld: the vocabulary has ids 0 to %u", param, (long long)id,
                lim->n_vocab - 1);
            free(ids);
            return false;
        }
        ids[i] = (int32_t)id;
    }
    *out = ids;
    return true;
}

static bool parse_prompt(json_t *o, const struct bt_api_limits *lim, struct bt_api_request *r,
                         struct bt_api_error *err) {
    json_t *p = json_object_get(o, "prompt");
    if (!p || json_is_null(p)) {
        BAD("prompt", "you must provide a 'prompt'");
        return false;
    }
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0); /* ["text"]: one prompt */
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) {
            BAD("prompt", "'prompt' is empty");
            return false;
        }
        if (!(r->prompt = dup_n(json_string_value(p), json_string_length(p)))) return nomem(err);
        return true;
    }
    size_t n;
    if (!nonempty_array(p, "prompt", "a string or an array of token ids", "", &n, err)) return false;
    if (!json_is_integer(json_array_get(p, 0))) {
        BAD("prompt", "'prompt' as an array holds one string or token ids; several prompts in one request are "
                      "not supported");
        return false;
    }
    if (!parse_ids(p, "prompt", lim, &r->prompt_ids, err)) return false;
    r->n_prompt_ids = n;
    return true;
}

/* content: a string, or an array of {"type": "text", "text": "..."} parts */
static bool parse_content(json_t *c, size_t i, char **out, struct bt_api_error *err) {
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (json_is_string(c)) {
        if (!(*out = dup_n(json_string_value(c), json_string_length(c)))) return nomem(err);
        return true;
    }
    if (!json_is_array(c)) {
        BAD(param, "'%s' must be a string or an array of text parts, not %s", param, json_kind(c));
        return false;
    }
    size_t total = 0;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k), *type = json_object_get(part, "type"), *text;
        if (!json_is_object(part) || !json_is_string(type)) {
            BAD(param, "'%s[%zu]' must be an object with a 'type'", param, k);
            return false;
        }
        if (strcmp(json_string_value(type), "text")) {
            BAD(param, "'%s[%zu]' is of type '%s': only 'text' parts are supported", param, k,
                json_string_value(type));
            return false;
        }
        if (!json_is_string(text = json_object_get(part, "text"))) {
            BAD(param, "'%s[%zu].text' must be a string", param, k);
            return false;
        }
        total += json_string_length(text);
    }
    char *s = malloc(total + 1);
    if (!s) return nomem(err);
    size_t at = 0;
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *text = json_object_get(json_array_get(c, k), "text");
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    s[at] = 0;
    *out = s;
    return true;
}

/* msg as a Jinja chat template is given it: role as baton reads it
 * (developer is system), content as the text (an
 * assistant turn that only calls tools: "", as llama.cpp gives templates
 * that add content to a string), each tool call's arguments as an object
 * when they are a JSON object's text, as transformers' templates expect.
 * NULL when out of memory. */
static char *template_json(json_t *msg, const char *role, const char *content) {
    json_t *m = json_deep_copy(msg);
    if (!m || json_object_set_new(m, "role", json_string(role)) || json_object_set_new(m, "content", json_string(content))) {
        json_decref(m);
        return NULL;
    }
    json_t *calls = json_object_get(m, "tool_calls"), *call;
    size_t k;
    json_array_foreach(calls, k, call) {
        json_t *fn = json_object_get(call, "function"), *args = json_object_get(fn, "arguments");
        if (!json_is_string(args)) continue;
        json_t *obj = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
        if (json_is_object(obj)) json_object_set(fn, "arguments", obj);
        json_decref(obj);
    }
    char *s = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(m);
    return s;
}

static bool parse_messages(json_t *o, struct bt_api_request *r, struct bt_api_error *err) {
    json_t *m = json_object_get(o, "messages");
    if (!m || json_is_null(m)) {
        BAD("messages", "you must provide 'messages'");
        return false;
    }
    size_t n;
    if (!nonempty_array(m, "messages", "an array", ": give at least one message", &n, err)) return false;
    if (n > BT_API_MAX_MESSAGES) {
        BAD("messages", "'messages' has %zu messages: at most %d", n, BT_API_MAX_MESSAGES);
        return false;
    }
    if (!(r->msgs = calloc(n, sizeof *r->msgs)) || !(r->msg_json = calloc(n, sizeof *r->msg_json))) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i);
        char param[48];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(msg)) {
            BAD(param, "'%s' must be an object, not %s", param, json_kind(msg));
            return false;
        }
        /* role, content and name are read; other fields are ignored
         * (tool_call_id, refusal, ...), tool_calls below */
        json_t *role = json_object_get(msg, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role) {
            BAD(param, "'%s' is missing", param);
            return false;
        }
        if (!json_is_string(role)) {
            BAD(param, "'%s' must be a string, not %s", param, json_kind(role));
            return false;
        }
        const char *rs = json_string_value(role);
        if (!strcmp(rs, "developer")) rs = "system"; /* OpenAI's newer name for system */
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool")) {
            BAD(param, "'%s' is '%s': it must be 'system', 'developer', 'user', 'assistant' or 'tool'", param, rs);
            return false;
        }
        if (!(r->msgs[i].role = dup_n(rs, strlen(rs)))) return nomem(err);
        r->n_msgs = i + 1; /* owned from here on */
        json_t *c = json_object_get(msg, "content");
        json_t *calls = json_object_get(msg, "tool_calls");
        snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
        if (calls && !json_is_null(calls) && (strcmp(rs, "assistant") || !json_is_array(calls))) {
            BAD(param, strcmp(rs, "assistant") ? "'%s' is only allowed on an assistant message"
                                               : "'%s' must be an array, not %s",
                param, json_kind(calls));
            return false;
        }
        snprintf(param, sizeof param, "messages[%zu].content", i);
        if ((!c || json_is_null(c)) && calls && json_array_size(calls) > 0) {
            /* an assistant turn that only called tools: the built-in chat
             * formats have no way to show the calls, so it reads as empty */
            if (!(r->msgs[i].content = dup_n("", 0))) return nomem(err);
            if (!(r->msg_json[i] = template_json(msg, rs, ""))) return nomem(err);
            continue;
        }
        if (!c || json_is_null(c)) {
            BAD(param, "'%s' is missing", param);
            return false;
        }
        char *content = NULL;
        if (!parse_content(c, i, &content, err)) return false;
        r->msgs[i].content = content;
        if (!(r->msg_json[i] = template_json(msg, rs, content))) return nomem(err);
    }
    return true;
}

static bool parse_stop(json_t *o, struct bt_api_request *r, struct bt_api_error *err) {
    json_t *s = json_object_get(o, "stop");
    if (!s || json_is_null(s)) return true;
    json_t *one[1] = {s};
    json_t **list = one;
    size_t n = 1;
    if (json_is_array(s)) {
        n = json_array_size(s);
        if (n > BT_API_MAX_STOPS) {
            BAD("stop", "'stop' has %zu strings: at most %d", n, BT_API_MAX_STOPS);
            return false;
        }
        list = NULL;
    } else if (!json_is_string(s)) {
        BAD("stop", "'stop' must be a string or an array of strings, not %s", json_kind(s));
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = list ? list[i] : json_array_get(s, i);
        if (!json_is_string(v)) {
            BAD("stop", "'stop[%zu]' must be a string, not %s", i, json_kind(v));
            return false;
        }
        size_t len = json_string_length(v);
        if (len == 0 || len > BT_API_MAX_STOP_LEN) {
            BAD("stop", "'stop[%zu]' has %zu bytes: a stop string has 1 to %d", i, len, BT_API_MAX_STOP_LEN);
            return false;
        }
        if (!(r->stops[i] = dup_n(json_string_value(v), len))) return nomem(err);
        r->n_stops = i + 1;
    }
    return true;
}

/* logit_bias: {"token id": bias in [-100, 100], ...} (OpenAI's; -100 in
 * effect bans a token, 100 all but forces it). */
static bool parse_logit_bias(json_t *o, const struct bt_api_limits *lim, struct bt_api_request *r,
                             struct bt_api_error *err) {
    json_t *lb = json_object_get(o, "logit_bias");
    if (!lb || json_is_null(lb)) return true;
    if (!json_is_object(lb)) {
        BAD("logit_bias", "'logit_bias' must be an object of token ids to biases, not %s", json_kind(lb));
        return false;
    }
    const size_t n = json_object_size(lb);
    if (n > BT_API_MAX_BIAS) {
        BAD("logit_bias", "'logit_bias' has %zu tokens: at most %d", n, BT_API_MAX_BIAS);
        return false;
    }
    if (n == 0) return true;
    if (!(r->bias_ids = malloc(n * sizeof *r->bias_ids)) || !(r->bias = malloc(n * sizeof *r->bias)))
        return nomem(err);
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end = NULL;
        const long long id = strtoll(k, &end, 10);
        if (!*k || *end || id < 0 || id >= (long long)lim->n_vocab) {
            BAD("logit_bias", "'logit_bias' key '%.64s' is not a token id: the vocabulary has ids 0 to %u", k,
                lim->n_vocab - 1);
            return false;
        }
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100)) {
            BAD("logit_bias", "'logit_bias' of token %lld must be a number between -100 and 100", id);
            return false;
        }
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias[r->n_bias++] = (float)json_number_value(v);
    }
    return true;
}

/* chat: logprobs (a boolean) and top_logprobs (0 to 20, only with logprobs
 * true; 0 asks for nothing and is taken alone, as OpenAI takes it);
 * completions: logprobs N (0 to 20: OpenAI takes up to 5, llama-server 20;
 * false or null: none).  Read after echo. */
static bool parse_logprobs(enum bt_api_kind kind, json_t *o, struct bt_api_request *r, struct bt_api_error *err) {
    json_t *v = json_object_get(o, "logprobs");
    int64_t n = 0;
    bool given = false;
    if (kind == BT_API_CHAT) {
        if (!get_bool(o, "logprobs", &r->logprobs, err)) return false;
        if (!get_int(o, "top_logprobs", 0, BT_MAX_TOP_LOGPROBS, &n, &given, err)) return false;
        if (given && n > 0 && !r->logprobs) {
            BAD("top_logprobs", "'top_logprobs' is %lld: it needs 'logprobs': true", (long long)n);
            return false;
        }
        r->top_logprobs = (int32_t)n;
        return true;
    }
    if (!v || json_is_null(v) || json_is_false(v)) return true;
    if (!json_is_integer(v)) {
        BAD("logprobs", "'logprobs' must be an integer (the alternatives per token, 0 to %d), not %s",
            BT_MAX_TOP_LOGPROBS, json_kind(v));
        return false;
    }
    if (!get_int(o, "logprobs", 0, BT_MAX_TOP_LOGPROBS, &n, &given, err)) return false;
    if (r->echo) {
        BAD("logprobs", "'logprobs' with 'echo' is not supported by this server: the prompt's tokens have no "
                        "log-probabilities here");
        return false;
    }
    r->logprobs = true;
    r->top_logprobs = (int32_t)n;
    return true;
}

/* ---- response_format and tools ---- */

/* schema (a JSON value) compiled into rule *rule of g; a bad one is a 400
 * whose param is `param` and the path inside the schema */
static bool compile_schema(bt_json_rules *j, json_t *schema, const char *param, int32_t *rule,
                           struct bt_api_error *err) {
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return nomem(err);
    char where[256], msg[400], full[512];
    *rule = bt_json_schema_compile(j, text, strlen(text), where, sizeof where, msg, sizeof msg);
    free(text);
    if (*rule >= 0) return true;
    snprintf(full, sizeof full, "%s%s%s", param, where[0] && where[0] != '[' ? "." : "", where);
    BAD(full, "'%s' is not a schema baton can follow: %s", full, msg);
    return false;
}

/* g finished with root rule; its failure as a 400 on param */
static bool finish_grammar(bt_grammar *g, int32_t root, const char *param, struct bt_api_error *err) {
    char msg[300];
    if (bt_grammar_finish(g, root, msg, sizeof msg) == BT_OK) return true;
    BAD(param, "'%s' cannot be followed: %s", param, msg);
    return false;
}

/* response_format: "text", "json_object" (any object, or llama.cpp's
 * {"type": "json_object", "schema": {...}}) or "json_schema"
 * ({"json_schema": {"name", "schema", "strict"}}) */
static bool parse_response_format(json_t *o, struct bt_api_request *r, struct bt_api_error *err) {
    json_t *v = json_object_get(o, "response_format");
    if (!v || json_is_null(v)) return true;
    if (!json_is_object(v)) {
        BAD("response_format", "'response_format' must be an object, not %s", json_kind(v));
        return false;
    }
    json_t *t = json_object_get(v, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : "";
    json_t *schema = NULL;
    const char *param = NULL;
    if (!strcmp(type, "text")) return true;
    if (!strcmp(type, "json_object")) {
        schema = json_object_get(v, "schema");
        param = "response_format.schema";
    } else if (!strcmp(type, "json_schema")) {
        json_t *js = json_object_get(v, "json_schema");
        if (!json_is_object(js)) {
            BAD("response_format.json_schema", "'response_format.json_schema' must be an object with a 'schema'");
            return false;
        }
        json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
        if (name && !json_is_string(name)) {
            BAD("response_format.json_schema.name", "'response_format.json_schema.name' must be a string");
            return false;
        }
        if (strict && !json_is_boolean(strict) && !json_is_null(strict)) {
            BAD("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
            return false;
        }
        param = "response_format.json_schema.schema";
        if (!(schema = json_object_get(js, "schema"))) {
            BAD(param, "'%s' is required", param);
            return false;
        }
    } else {
        BAD("response_format.type", "'response_format.type' must be 'text', 'json_object' or 'json_schema'");
        return false;
    }
    if (!(r->grammar = bt_grammar_new())) return nomem(err);
    bt_json_rules j;
    bt_json_rules_init(&j, r->grammar);
    int32_t root;
    if (schema) {
        if (!compile_schema(&j, schema, param, &root, err)) return false;
    } else if ((root = bt_json_object_rule(&j)) < 0) {
        return nomem(err);
    }
    return finish_grammar(r->grammar, root, schema ? param : "response_format", err);
}

/* tools[i]: {"type": "function", "function": {"name", "description", "parameters", "strict"}} */
static bool parse_tool(json_t *t, size_t i, bt_json_rules *j, struct bt_tool *out, struct bt_api_error *err) {
    char p[96];
    snprintf(p, sizeof p, "tools[%zu]", i);
    json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
    if (!json_is_object(t) || (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function")))) {
        BAD(p, "'%s' must be an object of type 'function'", p);
        return false;
    }
    json_t *f = json_object_get(t, "function");
    snprintf(p, sizeof p, "tools[%zu].function", i);
    if (!json_is_object(f)) {
        BAD(p, "'%s' must be an object with a 'name'", p);
        return false;
    }
    json_t *name = json_object_get(f, "name"), *params = json_object_get(f, "parameters");
    snprintf(p, sizeof p, "tools[%zu].function.name", i);
    const char *n = json_is_string(name) ? json_string_value(name) : "";
    size_t len = strlen(n);
    bool ok = len > 0 && len <= 64;
    for (size_t k = 0; k < len; k++)
        if (!(n[k] == '_' || n[k] == '-' || (n[k] >= 'a' && n[k] <= 'z') || (n[k] >= 'A' && n[k] <= 'Z') ||
              (n[k] >= '0' && n[k] <= '9')))
            ok = false;
    if (!ok) {
        BAD(p, "'%s' must be a function name of 1 to 64 letters, digits, '_' or '-'", p);
        return false;
    }
    if (!(out->name = strdup(n))) return nomem(err);
    if (!params || json_is_null(params)) return true;
    snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
    int32_t rule;
    if (!compile_schema(j, params, p, &rule, err)) return false;
    if (!(out->params = json_dumps(params, JSON_COMPACT | JSON_ENCODE_ANY))) return nomem(err);
    return true;
}

/* tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name"}} */
static bool parse_tool_choice(json_t *o, struct bt_api_request *r, struct bt_api_error *err) {
    json_t *v = json_object_get(o, "tool_choice");
    r->tool_choice = r->n_tools ? BT_API_TOOLS_AUTO : BT_API_TOOLS_NONE;
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        const char *c = json_string_value(v);
        if (!strcmp(c, "none"))
            r->tool_choice = BT_API_TOOLS_NONE;
        else if (!strcmp(c, "auto"))
            r->tool_choice = r->n_tools ? BT_API_TOOLS_AUTO : BT_API_TOOLS_NONE;
        else if (!strcmp(c, "required"))
            r->tool_choice = BT_API_TOOLS_REQUIRED;
        else {
            BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function, not '%.64s'", c);
            return false;
        }
    } else {
        json_t *f = json_is_object(v) ? json_object_get(v, "function") : NULL;
        json_t *name = json_is_object(f) ? json_object_get(f, "name") : NULL;
        if (!json_is_string(name)) {
            BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            return false;
        }
        r->tool_choice = BT_API_TOOLS_NAMED;
        r->tool_named = -1;
        for (size_t i = 0; i < r->n_tools; i++)
            if (!strcmp(r->tools[i].name, json_string_value(name))) r->tool_named = (int)i;
        if (r->tool_named < 0 && r->n_tools) {
            BAD("tool_choice.function.name", "'tool_choice.function.name' is '%.64s', which is not in 'tools'",
                json_string_value(name));
            return false;
        }
    }
    if (r->tool_choice >= BT_API_TOOLS_REQUIRED && !r->n_tools) {
        BAD("tool_choice", "'tool_choice' asks for a call, but the request has no 'tools'");
        return false;
    }
    return true;
}

static bool parse_tools(json_t *o, struct bt_api_request *r, struct bt_api_error *err) {
    json_t *v = json_object_get(o, "tools");
    r->parallel_tool_calls = true;
    if (!get_bool(o, "parallel_tool_calls", &r->parallel_tool_calls, err)) return false;
    if (v && !json_is_null(v)) {
        if (!json_is_array(v) || json_array_size(v) > BT_API_MAX_TOOLS) {
            BAD("tools", "'tools' must be an array of at most %d functions", BT_API_MAX_TOOLS);
            return false;
        }
        size_t n = json_array_size(v);
        if (n && !(r->tools = calloc(n, sizeof *r->tools))) return nomem(err);
        bt_grammar *scratch = bt_grammar_new(); /* each schema compiled once, to check it */
        if (!scratch) return nomem(err);
        bt_json_rules j;
        bt_json_rules_init(&j, scratch);
        bool ok = true;
        for (size_t i = 0; ok && i < n; i++) {
            ok = parse_tool(json_array_get(v, i), i, &j, &r->tools[i], err);
            r->n_tools = i + 1;
            for (size_t k = 0; ok && k < i; k++)
                if (!strcmp(r->tools[k].name, r->tools[i].name)) {
                    char p[64];
                    snprintf(p, sizeof p, "tools[%zu].function.name", i);
                    BAD(p, "'%s' is '%s', the name of tools[%zu] too", p, r->tools[i].name, k);
                    ok = false;
                }
        }
        bt_grammar_free(scratch);
        if (!ok) return false;
    }
    if (!parse_tool_choice(o, r, err)) return false;
    if (r->tool_choice != BT_API_TOOLS_NONE && !(r->tools_json = json_dumps(v, JSON_COMPACT))) return nomem(err);
    if (r->tool_choice >= BT_API_TOOLS_REQUIRED && r->grammar) {
        BAD("tool_choice", "'tool_choice' asks for a call, and 'response_format' for JSON: give one of them");
        return false;
    }
    return true;
}

/* The body's "model": present, a string, this server's. */
static bool check_model(json_t *o, const struct bt_api_limits *lim, struct bt_api_error *err) {
    json_t *model = json_object_get(o, "model");
    if (!model || json_is_null(model)) {
        BAD("model", "you must provide a 'model' (this server has '%s')", lim->model_id);
        return false;
    }
    if (!json_is_string(model)) {
        BAD("model", "'model' must be a string, not %s", json_kind(model));
        return false;
    }
    return bt_api_model_check(json_string_value(model), lim->model_id, err);
}

static bool parse_object(enum bt_api_kind kind, json_t *o, const struct bt_api_limits *lim, uint64_t default_seed,
                         struct bt_api_request *r, struct bt_api_error *err) {
    if (!check_unsupported(kind, o, err)) return false;

    if (!check_model(o, lim, err)) return false;

    if (kind == BT_API_COMPLETION) {
        if (!parse_prompt(o, lim, r, err)) return false;
        if (!get_bool(o, "echo", &r->echo, err)) return false;
    } else if (!parse_messages(o, r, err)) {
        return false;
    }

    if (!get_bool(o, "stream", &r->stream, err)) return false;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!r->stream) {
            BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
            return false;
        }
        if (!json_is_object(so)) {
            BAD("stream_options", "'stream_options' must be an object, not %s", json_kind(so));
            return false;
        }
        if (!get_bool(so, "include_usage", &r->include_usage, err)) return false;
    }

    r->cache_prompt = true;
    if (!get_bool(o, "cache_prompt", &r->cache_prompt, err)) return false;

    int64_t n = 1;
    if (!get_int(o, "n", 1, 128, &n, NULL, err)) return false;
    if (n > 1 && lim->n_slots > 0 && n > lim->n_slots) {
        BAD("n", "'n' is %lld: this server runs %d sequences at once (--parallel), one per choice", (long long)n,
            lim->n_slots);
        return false;
    }
    r->n = (int)n;

    r->max_tokens = -1;
    bool given = false;
    const char *mt_key = "max_tokens";
    if (kind == BT_API_CHAT && json_object_get(o, "max_completion_tokens")) mt_key = "max_completion_tokens";
    if (!get_int(o, mt_key, 1, lim->max_tokens, &r->max_tokens, &given, err)) return false;
    if (!given) r->max_tokens = -1;
    /* vLLM's: no end of generation before min_tokens; ignore_eos: none ends it */
    if (!get_int(o, "min_tokens", 0, lim->max_tokens, &r->min_tokens, NULL, err)) return false;
    if (r->max_tokens > 0 && r->min_tokens > r->max_tokens) {
        BAD("min_tokens", "'min_tokens' is %lld, more than 'max_tokens' %lld", (long long)r->min_tokens,
            (long long)r->max_tokens);
        return false;
    }
    if (!get_bool(o, "ignore_eos", &r->ignore_eos, err)) return false;
    if (!parse_logprobs(kind, o, r, err)) return false;
    if (!parse_logit_bias(o, lim, r, err)) return false;
    if (!parse_response_format(o, r, err)) return false;
    if (kind == BT_API_CHAT && !parse_tools(o, r, err)) return false;
    if (r->n > 1 && r->tool_choice != BT_API_TOOLS_NONE) {
        BAD("n", "'n' is %d: a request with 'tools' gives one choice on this server", r->n);
        return false;
    }

    /* OpenAI's defaults: the model's whole distribution */
    bt_sampler_params *sp = &r->sampling;
    bt_sampler_params_whole(sp);
    if (!get_number(o, "temperature", 0.0, 2.0, &sp->temp, err)) return false;
    if (!get_number(o, "top_p", 0.0, 1.0, &sp->top_p, err)) return false;
    if (sp->top_p <= 0.0f) {
        BAD("top_p", "'top_p' is 0: it must be above 0 and at most 1");
        return false;
    }
    if (!get_number(o, "min_p", 0.0, 1.0, &sp->min_p, err)) return false;
    if (!get_number(o, "presence_penalty", -2.0, 2.0, &sp->presence_penalty, err)) return false;
    if (!get_number(o, "frequency_penalty", -2.0, 2.0, &sp->frequency_penalty, err)) return false;
    if (!get_number(o, "repeat_penalty", 0.0, 10.0, &sp->repeat_penalty, err)) return false;
    if (sp->repeat_penalty <= 0.0f) {
        BAD("repeat_penalty", "'repeat_penalty' is 0: it must be above 0 (1 is off)");
        return false;
    }
    int64_t top_k = 0;
    if (!get_int(o, "top_k", 0, INT32_MAX, &top_k, NULL, err)) return false;
    sp->top_k = (int32_t)top_k;
    int64_t seed = 0;
    if (!get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, &r->seed_given, err)) return false;
    sp->seed = r->seed_given ? (uint64_t)seed : default_seed;
    char msg[256];
    if (bt_sampler_params_check(sp, msg, sizeof msg) != BT_OK) {
        BAD(NULL, "bad sampling parameters: %s", msg);
        return false;
    }
    return parse_stop(o, r, err);
}

/* body[0..len) as a JSON object (json_decref it), or NULL with *err */
static json_t *load_object(const char *body, size_t len, struct bt_api_error *err) {
    if (len == 0) {
        BAD(NULL, "the request body is empty: send a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        BAD(NULL, "the request body is not valid JSON: line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        BAD(NULL, "the request body must be a JSON object, not %s", json_kind(o));
        json_decref(o);
        return NULL;
    }
    return o;
}

bool bt_api_model_check(const char *id, const char *model, struct bt_api_error *err) {
    if (!strcmp(id, model)) return true;
    bt_api_error_set(err, 404, "invalid_request_error", "model", "model_not_found",
                     "The model '%.200s' does not exist (this server has '%s')", id, model);
    return false;
}

bool bt_api_parse(enum bt_api_kind kind, const char *body, size_t len, const struct bt_api_limits *lim,
                  uint64_t default_seed, struct bt_api_request *out, struct bt_api_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    json_t *o = load_object(body, len, err);
    if (!o) return false;
    bool ok = parse_object(kind, o, lim, default_seed, out, err);
    json_decref(o);
    if (!ok) {
        bt_api_request_free(out);
        out->kind = kind;
    }
    return ok;
}

/* ---- llama-server's /tokenize and /detokenize ---- */

void bt_api_tokenize_free(struct bt_api_tokenize *t) {
    if (!t) return;
    free(t->content);
    memset(t, 0, sizeof *t);
}

bool bt_api_parse_tokenize(const char *body, size_t len, struct bt_api_tokenize *out, struct bt_api_error *err) {
    memset(out, 0, sizeof *out);
    out->parse_special = true; /* llama-server's default */
    json_t *o = load_object(body, len, err);
    if (!o) return false;
    bool ok = false;
    json_t *c = json_object_get(o, "content");
    if (!c || json_is_null(c)) {
        BAD("content", "you must provide 'content' (the text to tokenize)");
    } else if (!json_is_string(c)) {
        BAD("content", "'content' must be a string, not %s", json_kind(c));
    } else if (get_bool(o, "add_special", &out->add_special, err) &&
               get_bool(o, "parse_special", &out->parse_special, err) &&
               get_bool(o, "with_pieces", &out->with_pieces, err)) {
        out->len = json_string_length(c);
        ok = (out->content = dup_n(json_string_value(c), out->len)) != NULL || nomem(err);
    }
    json_decref(o);
    if (!ok) bt_api_tokenize_free(out);
    return ok;
}

bool bt_api_parse_detokenize(const char *body, size_t len, const struct bt_api_limits *lim, int32_t **ids,
                             size_t *n, struct bt_api_error *err) {
    *ids = NULL;
    *n = 0;
    json_t *o = load_object(body, len, err);
    if (!o) return false;
    bool ok = false;
    json_t *t = json_object_get(o, "tokens");
    if (!t || json_is_null(t))
        BAD("tokens", "you must provide 'tokens' (an array of token ids)");
    else if (!json_is_array(t))
        BAD("tokens", "'tokens' must be an array of token ids, not %s", json_kind(t));
    else if ((ok = parse_ids(t, "tokens", lim, ids, err)))
        *n = json_array_size(t);
    json_decref(o);
    return ok;
}

/* ---- output ---- */

/* numbers (log-probabilities, floats) with 9 digits: a float's own digits,
 * so equal floats print equal and the printed value reads back as it */
static char *dump(json_t *o) {
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(o);
    return s;
}

/* text as a JSON string; bytes that are not UTF-8 become U+FFFD */
static json_t *text_value(const char *text, size_t len) {
    if (bt_utf8_check(text, len) < 0) return json_stringn(text, len);
    char *fixed = malloc(len * 3 + 1);
    if (!fixed) return NULL;
    size_t at = 0, i = 0;
    while (i < len) {
        int64_t bad = bt_utf8_check(text + i, len - i);
        size_t good = bad < 0 ? len - i : (size_t)bad;
        memcpy(fixed + at, text + i, good);
        at += good;
        i += good;
        if (bad >= 0) {
            memcpy(fixed + at, "\xEF\xBF\xBD", 3);
            at += 3;
            i++;
        }
    }
    json_t *v = json_stringn(fixed, at);
    free(fixed);
    return v;
}

/* ---- log-probabilities ---- */

/* a log-probability as JSON: -inf (a token the model rules out) is
 * -9999.0, OpenAI's floor, since JSON has no infinity */
static json_t *logprob_value(float x) { return json_real(x >= -9999.0f ? (double)x : -9999.0); }

static json_t *bytes_value(const struct bt_api_piece *p) {
    json_t *a = json_array();
    for (size_t i = 0; a && i < p->len; i++)
        if (json_array_append_new(a, json_integer((unsigned char)p->text[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* chat's {"token", "logprob", "bytes"} */
static json_t *chat_entry(const struct bt_api_piece *p, float logprob) {
    return json_pack("{s:o, s:o, s:o}", "token", text_value(p->text, p->len), "logprob", logprob_value(logprob),
                     "bytes", bytes_value(p));
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]} */
static json_t *chat_logprobs(const struct bt_api_logprobs *lp) {
    json_t *content = json_array();
    for (size_t i = 0; content && i < lp->n; i++) {
        json_t *e = chat_entry(&lp->piece[i], lp->lp[i].logprob), *top = json_array();
        for (int32_t k = 0; top && k < lp->lp[i].n_top; k++)
            if (json_array_append_new(top, chat_entry(&lp->top[i][k], lp->lp[i].top_logprob[k]))) {
                json_decref(top);
                top = NULL;
            }
        if (!e || !top) {
            json_decref(e);
            json_decref(top);
            goto fail;
        }
        if (json_object_set_new(e, "top_logprobs", top)) {
            json_decref(e);
            goto fail;
        }
        if (json_array_append_new(content, e)) goto fail;
    }
    return json_pack("{s:o}", "content", content);
fail:
    json_decref(content);
    return NULL;
}

/* the characters of text[0..len): its UTF-8 lead bytes (a character split
 * over two tokens counts once, at the token that starts it) */
static int64_t n_chars(const char *text, size_t len) {
    int64_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)text[i] & 0xC0) != 0x80;
    return n;
}

/* completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
 * "text_offset"}; two alternatives with one text: the more likely's */
static json_t *completion_logprobs(const struct bt_api_logprobs *lp) {
    json_t *o = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
    if (!o) return NULL;
    json_t *tokens = json_object_get(o, "tokens"), *lps = json_object_get(o, "token_logprobs"),
           *tops = json_object_get(o, "top_logprobs"), *offs = json_object_get(o, "text_offset");
    int64_t at = lp->text_offset;
    for (size_t i = 0; i < lp->n; i++) {
        json_t *top = json_object();
        for (int32_t k = 0; top && k < lp->lp[i].n_top; k++) {
            json_t *t = text_value(lp->top[i][k].text, lp->top[i][k].len);
            const char *key = t ? json_string_value(t) : NULL;
            if (!key || (!json_object_get(top, key) &&
                         json_object_set_new(top, key, logprob_value(lp->lp[i].top_logprob[k])))) {
                json_decref(top);
                top = NULL;
            }
            json_decref(t);
        }
        if (!top || json_array_append_new(tokens, text_value(lp->piece[i].text, lp->piece[i].len)) ||
            json_array_append_new(lps, logprob_value(lp->lp[i].logprob)) || json_array_append_new(tops, top) ||
            json_array_append_new(offs, json_integer((json_int_t)at))) {
            json_decref(o);
            return NULL;
        }
        at += n_chars(lp->piece[i].text, lp->piece[i].len);
    }
    return o;
}

/* the choice's "logprobs": null when not asked */
static json_t *logprobs_value(const struct bt_api_request *r, const struct bt_api_logprobs *lp) {
    if (!lp) return json_null();
    return r->kind == BT_API_CHAT ? chat_logprobs(lp) : completion_logprobs(lp);
}

int64_t bt_api_logprobs_chars(const struct bt_api_logprobs *lp) {
    int64_t n = 0;
    for (size_t i = 0; i < lp->n; i++) n += n_chars(lp->piece[i].text, lp->piece[i].len);
    return n;
}

char *bt_api_error_json(const struct bt_api_error *e) {
    return dump(json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type", e->type, "param",
                          e->param, "code", e->code));
}

static json_t *usage(const struct bt_api_usage *u) {
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->n_prompt, "completion_tokens",
                     (json_int_t)u->n_gen, "total_tokens", (json_int_t)(u->n_prompt + u->n_gen),
                     "prompt_tokens_details", "cached_tokens", (json_int_t)u->n_cached);
}

static json_t *envelope(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                        bool chunk) {
    const char *object = r->kind == BT_API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", id, "object", object, "created", (json_int_t)created, "model",
                     model, "system_fingerprint", "baton");
}

char *bt_api_response_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                           const char *text, size_t len, const char *finish, const struct bt_api_usage *u,
                           const struct bt_api_logprobs *lp) {
    const struct bt_api_choice c = {text, len, finish, lp};
    return bt_api_response_n_json(r, id, created, model, &c, 1, u);
}

char *bt_api_response_n_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                             const struct bt_api_choice *ch, size_t n, const struct bt_api_usage *u) {
    json_t *o = envelope(r, id, created, model, false), *arr = json_array();
    if (!o || !arr || json_object_set_new(o, "choices", arr)) {
        json_decref(o);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = text_value(ch[i].text, ch[i].len), *l = logprobs_value(r, ch[i].lp), *choice = NULL;
        if (t && l && r->kind == BT_API_CHAT)
            choice = json_pack("{s:I, s:{s:s, s:o}, s:o, s:s}", "index", (json_int_t)i, "message", "role", "assistant",
                               "content", t, "logprobs", l, "finish_reason", ch[i].finish);
        else if (t && l)
            choice = json_pack("{s:I, s:o, s:o, s:s}", "index", (json_int_t)i, "text", t, "logprobs", l,
                               "finish_reason", ch[i].finish);
        else {
            json_decref(t);
            json_decref(l);
        }
        if (!choice || json_array_append_new(arr, choice)) {
            json_decref(o);
            return NULL;
        }
    }
    if (json_object_set_new(o, "usage", usage(u))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

/* Call i's id in a format whose model writes ids (Mistral): 9 letters or
 * digits, as its template wants them back, made from the answer's id
 * (FNV-1a) and i; not the model's own, which may repeat within a reply. */
static void short_call_id(const char *id, int i, char out[10]) {
    static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    uint64_t h = 1469598103934665603ull;
    for (const char *p = id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    for (int k = 0; k < 7; k++, h /= 62) out[k] = digits[h % 62];
    out[7] = digits[i / 62 % 62];
    out[8] = digits[i % 62];
    out[9] = '\0';
}

/* call i as OpenAI's tool_calls entry: whole (part BT_API_CALL_WHOLE), or
 * as a stream sends it, with its index: the head (id, type, name, arguments
 * "") then the arguments alone.  Its id: short_call_id where the model
 * wrote one, else "call_" + the answer's id + "_" + i. */
static json_t *tool_call_value(const char *id, const struct bt_tool_call *c, int i, enum bt_api_call_part part) {
    if (part == BT_API_CALL_ARGS) return json_pack("{s:i, s:{s:s}}", "index", i, "function", "arguments", c->arguments);
    char cid[96];
    if (c->id)
        short_call_id(id, i, cid);
    else
        snprintf(cid, sizeof cid, "call_%s_%d", id, i);
    json_t *v = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", cid, "type", "function", "function", "name", c->name,
                          "arguments", part == BT_API_CALL_HEAD ? "" : c->arguments);
    if (v && part == BT_API_CALL_HEAD && json_object_set_new(v, "index", json_integer(i))) {
        json_decref(v);
        return NULL;
    }
    return v;
}

/* calls[0..n) whole as OpenAI's tool_calls array */
static json_t *tool_calls_value(const char *id, const struct bt_tool_call *calls, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        json_t *c = tool_call_value(id, &calls[i], i, BT_API_CALL_WHOLE);
        if (!c || json_array_append_new(a, c)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

char *bt_api_tool_response_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                                const char *content, const struct bt_tool_call *calls, int n,
                                const struct bt_api_usage *u, const struct bt_api_logprobs *lp) {
    json_t *o = envelope(r, id, created, model, false), *l = logprobs_value(r, lp);
    json_t *tc = tool_calls_value(id, calls, n);
    json_t *t = content ? text_value(content, strlen(content)) : json_null();
    if (!o || !l || !tc || !t) {
        json_decref(o);
        json_decref(l);
        json_decref(tc);
        json_decref(t);
        return NULL;
    }
    json_t *choice = json_pack("{s:i, s:{s:s, s:o, s:o}, s:o, s:s}", "index", 0, "message", "role", "assistant",
                               "content", t, "tool_calls", tc, "logprobs", l, "finish_reason", "tool_calls");
    if (json_object_set_new(o, "choices", json_pack("[o]", choice)) ||
        json_object_set_new(o, "usage", usage(u))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *bt_api_tool_chunk_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                             const struct bt_tool_call *call, int index, enum bt_api_call_part part) {
    json_t *o = envelope(r, id, created, model, true), *c = tool_call_value(id, call, index, part);
    json_t *tc = c ? json_pack("[o]", c) : NULL;
    if (!o || !tc) {
        json_decref(o);
        json_decref(tc);
        return NULL;
    }
    json_t *choice =
        json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta", "tool_calls", tc, "logprobs", "finish_reason");
    if (json_object_set_new(o, "choices", json_pack("[o]", choice))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *bt_api_chunk_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                        const char *text, size_t len, const struct bt_api_logprobs *lp, const char *finish,
                        bool first) {
    return bt_api_chunk_index_json(r, id, created, model, 0, text, len, lp, finish, first);
}

char *bt_api_chunk_index_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                              int index, const char *text, size_t len, const struct bt_api_logprobs *lp,
                              const char *finish, bool first) {
    json_t *o = envelope(r, id, created, model, true), *t = text_value(text, len), *l = logprobs_value(r, lp);
    if (!o || !t || !l) {
        json_decref(o);
        json_decref(t);
        json_decref(l);
        return NULL;
    }
    json_t *choice;
    if (r->kind == BT_API_CHAT) {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (finish && len == 0)
            json_decref(t); /* the last chunk's delta is empty, as OpenAI's */
        else
            json_object_set_new(delta, "content", t);
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "delta", delta, "logprobs", l, "finish_reason",
                           finish);
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "text", t, "logprobs", l, "finish_reason", finish);
    }
    if (json_object_set_new(o, "choices", json_pack("[o]", choice))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *bt_api_usage_chunk_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                              const struct bt_api_usage *u) {
    json_t *o = envelope(r, id, created, model, true);
    if (!o || json_object_set_new(o, "choices", json_array()) || json_object_set_new(o, "usage", usage(u))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

/* OpenAI's model object */
static json_t *model_object(const char *model, int64_t created) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", model, "object", "model", "created", (json_int_t)created,
                     "owned_by", "baton");
}

char *bt_api_models_json(const char *model, int64_t created) {
    return dump(json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(model, created)));
}

char *bt_api_model_json(const char *model, int64_t created) { return dump(model_object(model, created)); }

char *bt_api_tokenize_json(const int32_t *ids, size_t n, const struct bt_api_piece *piece) {
    json_t *tokens = json_array();
    for (size_t i = 0; tokens && i < n; i++) {
        json_t *v;
        if (!piece)
            v = json_integer(ids[i]);
        else if (bt_utf8_check(piece[i].text, piece[i].len) < 0)
            v = json_pack("{s:i, s:s%}", "id", (int)ids[i], "piece", piece[i].text, piece[i].len);
        else /* a part of a character: its bytes, as llama-server gives them */
            v = json_pack("{s:i, s:o}", "id", (int)ids[i], "piece", bytes_value(&piece[i]));
        if (json_array_append_new(tokens, v)) {
            json_decref(tokens);
            return NULL;
        }
    }
    return dump(json_pack("{s:o}", "tokens", tokens));
}

char *bt_api_detokenize_json(const char *text, size_t len) {
    return dump(json_pack("{s:o}", "content", text_value(text, len)));
}

/* ---- POST /v1/embeddings ---- */

void bt_api_embeddings_free(struct bt_api_embeddings *e) {
    if (!e) return;
    for (size_t i = 0; e->in && i < e->n; i++) {
        free(e->in[i].text);
        free(e->in[i].ids);
    }
    free(e->in);
    memset(e, 0, sizeof *e);
}

/* input i (param names it): a non-empty string or array of token ids */
static bool parse_embd_input(json_t *v, const char *param, const struct bt_api_limits *lim,
                             struct bt_api_embd_input *in, struct bt_api_error *err) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) {
            BAD(param, "'%s' is empty", param);
            return false;
        }
        in->len = json_string_length(v);
        return (in->text = dup_n(json_string_value(v), in->len)) != NULL || nomem(err);
    }
    size_t n;
    if (!nonempty_array(v, param, "a string or an array of token ids", "", &n, err)) return false;
    if (!parse_ids(v, param, lim, &in->ids, err)) return false;
    in->n_ids = n;
    return true;
}

static bool parse_embeddings(json_t *o, const struct bt_api_limits *lim, struct bt_api_embeddings *out,
                             struct bt_api_error *err) {
    if (!check_model(o, lim, err)) return false;
    json_t *d = json_object_get(o, "dimensions");
    if (d && !json_is_null(d)) {
        BAD("dimensions", "'dimensions' is not supported by this server: a vector has the model's width");
        return false;
    }
    json_t *f = json_object_get(o, "encoding_format");
    if (f && !json_is_null(f)) {
        if (!json_is_string(f)) {
            BAD("encoding_format", "'encoding_format' must be a string, not %s", json_kind(f));
            return false;
        }
        if (!strcmp(json_string_value(f), "base64")) {
            out->base64 = true;
        } else if (strcmp(json_string_value(f), "float")) {
            BAD("encoding_format", "'encoding_format' is '%.40s': give float or base64", json_string_value(f));
            return false;
        }
    }
    json_t *v = json_object_get(o, "input");
    if (!v || json_is_null(v)) {
        BAD("input", "you must provide 'input' (a string, an array of strings, token ids or arrays of token ids)");
        return false;
    }
    if (!json_is_string(v) && !json_is_array(v)) {
        BAD("input", "'input' must be a string, an array of strings, token ids or arrays of token ids, not %s",
            json_kind(v));
        return false;
    }
    if (json_is_string(v) || (json_array_size(v) > 0 && json_is_integer(json_array_get(v, 0)))) {
        /* one input: a string or token ids */
        if (!(out->in = calloc(1, sizeof *out->in))) return nomem(err);
        out->n = 1;
        return parse_embd_input(v, "input", lim, &out->in[0], err);
    }
    const size_t n = json_array_size(v);
    if (n == 0) {
        BAD("input", "'input' is empty");
        return false;
    }
    if (n > BT_API_MAX_EMBD_INPUTS) {
        BAD("input", "'input' has %zu inputs: at most %d", n, BT_API_MAX_EMBD_INPUTS);
        return false;
    }
    if (!(out->in = calloc(n, sizeof *out->in))) return nomem(err);
    out->n = n;
    for (size_t i = 0; i < n; i++) {
        char param[48];
        snprintf(param, sizeof param, "input[%zu]", i);
        if (!parse_embd_input(json_array_get(v, i), param, lim, &out->in[i], err)) return false;
    }
    return true;
}

bool bt_api_parse_embeddings(const char *body, size_t len, const struct bt_api_limits *lim,
                             struct bt_api_embeddings *out, struct bt_api_error *err) {
    memset(out, 0, sizeof *out);
    json_t *o = load_object(body, len, err);
    if (!o) return false;
    const bool ok = parse_embeddings(o, lim, out, err);
    json_decref(o);
    if (!ok) bt_api_embeddings_free(out);
    return ok;
}

/* the base64 (RFC 4648, padded) of vec's little-endian float32 bytes */
static char *base64_floats(const float *vec, int64_t n) {
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t nb = (size_t)n * 4;
    unsigned char *b = malloc(nb ? nb : 1);
    char *s = malloc(4 * ((nb + 2) / 3) + 1);
    if (!b || !s) {
        free(b);
        free(s);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &vec[i], 4);
        for (int k4 = 0; k4 < 4; k4++) b[4 * i + k4] = (unsigned char)(u >> (8 * k4));
    }
    size_t o = 0;
    for (size_t i = 0; i < nb; i += 3) {
        const uint32_t w = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) |
                           (i + 2 < nb ? (uint32_t)b[i + 2] : 0);
        s[o++] = k[w >> 18 & 63];
        s[o++] = k[w >> 12 & 63];
        s[o++] = i + 1 < nb ? k[w >> 6 & 63] : '=';
        s[o++] = i + 2 < nb ? k[w & 63] : '=';
    }
    s[o] = 0;
    free(b);
    return s;
}

char *bt_api_embeddings_json(const char *model, const float *const *vec, size_t n, int64_t n_embd, bool base64,
                             int64_t n_prompt) {
    json_t *data = json_array();
    for (size_t i = 0; data && i < n; i++) {
        json_t *e = NULL;
        if (base64) {
            char *s = base64_floats(vec[i], n_embd);
            e = s ? json_string(s) : NULL;
            free(s);
        } else if ((e = json_array())) {
            for (int64_t j = 0; j < n_embd; j++)
                if (json_array_append_new(e, json_real((double)vec[i][j]))) {
                    json_decref(e);
                    e = NULL;
                    break;
                }
        }
        json_t *obj = e ? json_pack("{s:s, s:I, s:o}", "object", "embedding", "index", (json_int_t)i, "embedding", e)
                        : NULL;
        if (!obj || json_array_append_new(data, obj)) {
            json_decref(data);
            data = NULL;
        }
    }
    if (!data) return NULL;
    return dump(json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model", model, "usage",
                          "prompt_tokens", (json_int_t)n_prompt, "total_tokens", (json_int_t)n_prompt));
}
