/* tool_call.c - tool-call formats: detection in a template's text, the
 * grammar of a reply of calls, and the parse of a reply (tool_call.h).
 *
 * The Hermes grammar, with ws json_schema.h's optional whitespace (which
 * takes the newlines the templates show around the JSON):
 *   reply ::= call (ws call){0,max-1}
 *   call  ::= "<tool_call>" ws "{" ws "\"name\"" ws ":" ws fn "}" ws "</tool_call>"
 *   fn    ::= "\"NAME_i\"" ws "," ws "\"arguments\"" ws ":" ws args_i ws | ...
 * args_i: tool i's parameters schema (json_schema.c), or any object. */
#define _GNU_SOURCE /* memmem */
#include "tool_call.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"

enum bt_tool_format bt_tool_format_detect(const char *t) {
    if (t && strstr(t, HERMES_OPEN)) return BT_TOOL_FORMAT_HERMES;
    return BT_TOOL_FORMAT_NONE;
}

const char *bt_tool_format_name(enum bt_tool_format f) { return f == BT_TOOL_FORMAT_HERMES ? "hermes" : "none"; }

const char *bt_tool_format_trigger(enum bt_tool_format f) { return f == BT_TOOL_FORMAT_HERMES ? HERMES_OPEN : NULL; }

/* the literal text, then optional white space (rule ws) */
static void lit_ws(bt_grammar *g, int32_t rule, const char *text, int32_t ws) {
    bt_grammar_add_lit(g, rule, text, strlen(text));
    bt_grammar_add_ref(g, rule, ws);
}

/* "\"NAME\"" ws "," ws "\"arguments\"" ws ":" ws args ws as a new alternative of fn */
static bool add_function(bt_json_rules *j, int32_t fn, const struct bt_tool *t, int32_t ws, char *where,
                         size_t wherelen, char *err, size_t errlen) {
    bt_grammar *g = j->g;
    int32_t args = t->params ? bt_json_schema_compile(j, t->params, strlen(t->params), where, wherelen, err, errlen)
                             : bt_json_object_rule(j);
    if (args < 0) {
        if (!t->params) snprintf(err, errlen, "%s", bt_grammar_error(g));
        return false;
    }
    json_t *name = json_string(t->name);
    char *lit = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    if (!lit) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    bt_grammar_add_alt(g, fn);
    lit_ws(g, fn, lit, ws);
    free(lit);
    lit_ws(g, fn, ",", ws);
    lit_ws(g, fn, "\"arguments\"", ws);
    lit_ws(g, fn, ":", ws);
    bt_grammar_add_ref(g, fn, args);
    bt_grammar_add_ref(g, fn, ws);
    return true;
}

enum bt_status bt_tool_grammar_build(enum bt_tool_format f, const struct bt_tool *tools, size_t n, int only,
                                     int max_calls, bt_grammar **out, int *bad_tool, char *where, size_t wherelen,
                                     char *err, size_t errlen) {
    BT_ASSERT(f == BT_TOOL_FORMAT_HERMES && n > 0 && only < (int)n && max_calls >= 1);
    *out = NULL;
    *bad_tool = -1;
    where[0] = '\0';
    bt_grammar *g = bt_grammar_new();
    if (!g) return bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory for a grammar");
    bt_json_rules j;
    bt_json_rules_init(&j, g);
    int32_t ws = bt_json_ws_rule(&j), fn = bt_grammar_add_rule(g);
    for (size_t i = 0; ws >= 0 && fn >= 0 && i < n; i++) {
        if (only >= 0 && (size_t)only != i) continue;
        if (!add_function(&j, fn, &tools[i], ws, where, wherelen, err, errlen)) {
            *bad_tool = (int)i;
            bt_grammar_free(g);
            return BT_ERR_INVALID;
        }
    }
    int32_t call = bt_grammar_add_rule(g), sep = bt_grammar_add_rule(g);
    if (call >= 0 && sep >= 0 && ws >= 0 && fn >= 0) {
        bt_grammar_add_alt(g, call);
        lit_ws(g, call, HERMES_OPEN, ws);
        lit_ws(g, call, "{", ws);
        lit_ws(g, call, "\"name\"", ws);
        lit_ws(g, call, ":", ws);
        bt_grammar_add_ref(g, call, fn);
        lit_ws(g, call, "}", ws);
        bt_grammar_add_lit(g, call, HERMES_CLOSE, strlen(HERMES_CLOSE));
        bt_grammar_add_alt(g, sep);
        bt_grammar_add_ref(g, sep, ws);
        bt_grammar_add_ref(g, sep, call);
    }
    int32_t more = sep >= 0 ? bt_grammar_repeat(g, sep, 0, max_calls - 1) : -1;
    int32_t reply = bt_grammar_add_rule(g);
    if (more >= 0 && reply >= 0) {
        bt_grammar_add_alt(g, reply);
        bt_grammar_add_ref(g, reply, call);
        bt_grammar_add_ref(g, reply, more);
    }
    enum bt_status st = bt_grammar_finish(g, reply, err, errlen);
    if (st != BT_OK) {
        bt_grammar_free(g);
        return st;
    }
    *out = g;
    return BT_OK;
}

void bt_tool_calls_free(struct bt_tool_call *calls, int n) {
    for (int i = 0; calls && i < n; i++) {
        free(calls[i].name);
        free(calls[i].arguments);
    }
    free(calls);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* a malloc'd copy of s[0..n) trimmed; NULL when nothing is left (*oom when out of memory) */
static char *trimmed(const char *s, size_t n, bool *oom) {
    while (n && is_space(*s)) s++, n--;
    while (n && is_space(s[n - 1])) n--;
    if (!n) return NULL;
    char *t = malloc(n + 1);
    if (!t) {
        *oom = true;
        return NULL;
    }
    memcpy(t, s, n);
    t[n] = '\0';
    return t;
}

/* one call's JSON text into *c; false when it is not {"name": string, "arguments": object or JSON text} */
static bool parse_one(const char *s, size_t n, struct bt_tool_call *c, bool *oom) {
    json_t *o = json_loadb(s, n, 0, NULL);
    json_t *name = json_is_object(o) ? json_object_get(o, "name") : NULL;
    json_t *args = json_is_object(o) ? json_object_get(o, "arguments") : NULL;
    bool ok = false;
    if (json_is_string(name) && args) {
        json_t *a = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : json_incref(args);
        if (json_is_object(a)) {
            c->name = strdup(json_string_value(name));
            c->arguments = json_dumps(a, JSON_COMPACT);
            ok = c->name && c->arguments;
            if (!ok) *oom = true;
        }
        json_decref(a);
    }
    json_decref(o);
    return ok;
}

int bt_tool_calls_parse(enum bt_tool_format f, const char *text, size_t len, struct bt_tool_call **calls,
                        char **content) {
    *calls = NULL;
    *content = NULL;
    bool oom = false;
    if (f != BT_TOOL_FORMAT_HERMES) goto plain;
    const size_t lo = strlen(HERMES_OPEN), lc = strlen(HERMES_CLOSE);
    char *outside = malloc(len + 1);
    struct bt_tool_call *c = calloc(BT_TOOL_MAX_CALLS, sizeof *c);
    if (!outside || !c) {
        free(outside);
        free(c);
        return -1;
    }
    size_t n_out = 0, i = 0;
    int n = 0;
    while (i < len) {
        const char *open = memmem(text + i, len - i, HERMES_OPEN, lo);
        if (!open) {
            memcpy(outside + n_out, text + i, len - i);
            n_out += len - i;
            break;
        }
        size_t at = (size_t)(open - text);
        memcpy(outside + n_out, text + i, at - i);
        n_out += at - i;
        const char *close = memmem(open + lo, len - at - lo, HERMES_CLOSE, lc);
        if (!close || n == BT_TOOL_MAX_CALLS || !parse_one(open + lo, (size_t)(close - open) - lo, &c[n], &oom)) {
            bt_tool_calls_free(c, n);
            free(outside);
            if (oom) return -1;
            goto plain;
        }
        n++;
        i = (size_t)(close - text) + lc;
    }
    if (n == 0) {
        free(c);
        free(outside);
        goto plain;
    }
    *content = trimmed(outside, n_out, &oom);
    free(outside);
    if (oom) {
        bt_tool_calls_free(c, n);
        return -1;
    }
    *calls = c;
    return n;
plain:
    *content = trimmed(text, len, &oom);
    return oom ? -1 : 0;
}

size_t bt_tool_calls_plain_len(enum bt_tool_format f, const char *text, size_t len) {
    if (f != BT_TOOL_FORMAT_HERMES) return len;
    const size_t lo = strlen(HERMES_OPEN);
    const char *open = memmem(text, len, HERMES_OPEN, lo);
    if (open) return (size_t)(open - text);
    /* the longest tail that is a start of the mark */
    for (size_t k = lo - 1; k > 0; k--)
        if (k <= len && !memcmp(text + len - k, HERMES_OPEN, k)) return len - k;
    return len;
}
