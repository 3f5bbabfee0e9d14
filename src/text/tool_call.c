/* tool_call.c - tool-call formats: detection in a template's text, the
 * grammar of a reply of calls, and the parse of a reply (tool_call.h).
 *
 * The grammars, with ws json_schema.h's optional whitespace (which takes
 * the newlines the templates show around the JSON), args_i tool i's
 * parameters schema (json_schema.c) or any object, id ::= [0-9A-Za-z]{9}:
 *   Hermes:    reply ::= call (ws call){0,max-1}
 *              call  ::= "<tool_call>" ws "{" ws "\"name\"" ws ":" ws fn "}" ws "</tool_call>"
 *              fn    ::= "\"NAME_i\"" ws "," ws "\"arguments\"" ws ":" ws args_i ws | ...
 *   Llama 3:   reply ::= "{" ws "\"name\"" ws ":" ws fn "}"   (fn's key "parameters")
 *   Mistral:   reply ::= "[TOOL_CALLS][" ws call (ws "," ws call){0,max-1} ws "]"
 *              call  ::= "{" ws "\"name\"" ws ":" ws fn "," ws "\"id\"" ws ":" ws "\"" id "\"" ws "}"
 *   [ARGS]:    reply ::= call{1,max};  call ::= "[TOOL_CALLS]" fn;  fn ::= "NAME_i[ARGS]" args_i | ...
 *   [CALL_ID]: as [ARGS] with fn ::= "NAME_i[CALL_ID]" id "[ARGS]" args_i | ...
 *
 * A reply is read back more loosely than the grammar writes it (what a
 * model writes without one, tool_choice "auto" before its mark): any
 * whitespace, the members of a JSON call in any order, arguments as an
 * object or as a string holding one. */
#define _GNU_SOURCE /* memmem */
#include "tool_call.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define LLAMA3_OPEN "{\"name\""
#define LLAMA3_HEADER "<|start_header_id|>ipython<|end_header_id|>"
#define PYTHON_TAG "<|python_tag|>"
#define MISTRAL_OPEN "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"
#define MISTRAL_CALL_ID "[CALL_ID]"
#define CALL_ID_LEN 9

struct format {
    const char *name;
    const char *open; /* the mark a reply's calls begin with: the trigger */
    const char *key;  /* the member that holds the arguments; NULL: the name is raw text, then "[ARGS]" */
};
static const struct format formats[] = {
    [BT_TOOL_FORMAT_NONE] = {"none", NULL, NULL},
    [BT_TOOL_FORMAT_HERMES] = {"hermes", HERMES_OPEN, "arguments"},
    [BT_TOOL_FORMAT_LLAMA3] = {"llama3", LLAMA3_OPEN, "parameters"},
    [BT_TOOL_FORMAT_MISTRAL] = {"mistral", MISTRAL_OPEN, "arguments"},
    [BT_TOOL_FORMAT_MISTRAL_ARGS] = {"mistral-args", MISTRAL_OPEN, NULL},
    [BT_TOOL_FORMAT_MISTRAL_CALL_ID] = {"mistral-call-id", MISTRAL_OPEN, NULL},
};

enum bt_tool_format bt_tool_format_detect(const char *t) {
    if (!t) return BT_TOOL_FORMAT_NONE;
    /* Qwen3-Coder's and Qwen3.5's <tool_call><function=NAME><parameter=...>, GLM's
     * <tool_call>NAME<arg_key>...: other formats inside Hermes' mark, not read here */
    if (strstr(t, HERMES_OPEN))
        return strstr(t, "<function=") || strstr(t, "<arg_key>") ? BT_TOOL_FORMAT_NONE : BT_TOOL_FORMAT_HERMES;
    /* functionary v3.1, on Llama 3.1's template, writes <function=NAME>{...}</function> instead */
    if (strstr(t, LLAMA3_HEADER)) return strstr(t, "<function=") ? BT_TOOL_FORMAT_NONE : BT_TOOL_FORMAT_LLAMA3;
    if (!strstr(t, MISTRAL_OPEN)) return BT_TOOL_FORMAT_NONE;
    if (!strstr(t, MISTRAL_ARGS)) return BT_TOOL_FORMAT_MISTRAL;
    return strstr(t, MISTRAL_CALL_ID) ? BT_TOOL_FORMAT_MISTRAL_CALL_ID : BT_TOOL_FORMAT_MISTRAL_ARGS;
}

const char *bt_tool_format_name(enum bt_tool_format f) { return formats[f].name; }

const char *bt_tool_format_trigger(enum bt_tool_format f) { return formats[f].open; }

/* ---- grammars ---- */

/* the literal text, then optional white space (rule ws) */
static void lit_ws(bt_grammar *g, int32_t rule, const char *text, int32_t ws) {
    bt_grammar_add_lit(g, rule, text, strlen(text));
    if (ws >= 0) bt_grammar_add_ref(g, rule, ws);
}

/* tool t as a new alternative of fn: "\"NAME\"" ws "," ws "\"KEY\"" ws ":" ws args ws (a JSON format),
 * "NAME[ARGS]" args or "NAME[CALL_ID]" id "[ARGS]" args (Mistral's raw names) */
static bool add_function(bt_json_rules *j, enum bt_tool_format f, int32_t fn, const struct bt_tool *t, int32_t ws,
                         int32_t id, char *where, size_t wherelen, char *err, size_t errlen) {
    bt_grammar *g = j->g;
    int32_t args = t->params ? bt_json_schema_compile(j, t->params, strlen(t->params), where, wherelen, err, errlen)
                             : bt_json_object_rule(j);
    if (args < 0) {
        if (!t->params) snprintf(err, errlen, "%s", bt_grammar_error(g));
        return false;
    }
    bt_grammar_add_alt(g, fn);
    if (!formats[f].key) {
        lit_ws(g, fn, t->name, -1);
        if (f == BT_TOOL_FORMAT_MISTRAL_CALL_ID) {
            lit_ws(g, fn, MISTRAL_CALL_ID, -1);
            bt_grammar_add_ref(g, fn, id);
        }
        lit_ws(g, fn, MISTRAL_ARGS, -1);
        bt_grammar_add_ref(g, fn, args);
        return true;
    }
    json_t *name = json_string(t->name);
    char *lit = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
    json_decref(name);
    if (!lit) {
        snprintf(err, errlen, "out of memory");
        return false;
    }
    char key[32];
    snprintf(key, sizeof key, "\"%s\"", formats[f].key);
    lit_ws(g, fn, lit, ws);
    free(lit);
    lit_ws(g, fn, ",", ws);
    lit_ws(g, fn, key, ws);
    lit_ws(g, fn, ":", ws);
    bt_grammar_add_ref(g, fn, args);
    bt_grammar_add_ref(g, fn, ws);
    return true;
}

/* id ::= [0-9A-Za-z]{9} (-1: a bound or out of memory) */
static int32_t id_rule(bt_grammar *g) {
    static const uint8_t lo[3] = {'0', 'A', 'a'}, hi[3] = {'9', 'Z', 'z'};
    int32_t c = bt_grammar_add_rule(g);
    if (c < 0) return -1;
    bt_grammar_add_alt(g, c);
    bt_grammar_add_class(g, c, lo, hi, 3, false);
    return bt_grammar_repeat(g, c, CALL_ID_LEN, CALL_ID_LEN);
}

/* one call of format f as rule call's alternative (the header's grammars) */
static void add_call(bt_grammar *g, enum bt_tool_format f, int32_t call, int32_t fn, int32_t ws, int32_t id) {
    bt_grammar_add_alt(g, call);
    if (!formats[f].key) {
        lit_ws(g, call, MISTRAL_OPEN, -1);
        bt_grammar_add_ref(g, call, fn);
        return;
    }
    if (f == BT_TOOL_FORMAT_HERMES) lit_ws(g, call, HERMES_OPEN, ws);
    lit_ws(g, call, "{", ws);
    lit_ws(g, call, "\"name\"", ws);
    lit_ws(g, call, ":", ws);
    bt_grammar_add_ref(g, call, fn);
    if (f == BT_TOOL_FORMAT_MISTRAL) {
        lit_ws(g, call, ",", ws);
        lit_ws(g, call, "\"id\"", ws);
        lit_ws(g, call, ":", ws);
        lit_ws(g, call, "\"", -1);
        bt_grammar_add_ref(g, call, id);
        lit_ws(g, call, "\"", ws);
    }
    lit_ws(g, call, "}", f == BT_TOOL_FORMAT_HERMES ? ws : -1);
    if (f == BT_TOOL_FORMAT_HERMES) lit_ws(g, call, HERMES_CLOSE, -1);
}

/* reply ::= call (sep call){0,max-1}, inside Mistral's list */
static int32_t add_reply(bt_grammar *g, enum bt_tool_format f, int32_t call, int32_t ws, int max_calls) {
    int32_t sep = bt_grammar_add_rule(g);
    if (sep < 0) return -1;
    bt_grammar_add_alt(g, sep);
    if (formats[f].key) bt_grammar_add_ref(g, sep, ws);
    if (f == BT_TOOL_FORMAT_MISTRAL) lit_ws(g, sep, ",", ws);
    bt_grammar_add_ref(g, sep, call);
    int32_t more = bt_grammar_repeat(g, sep, 0, max_calls - 1), reply = bt_grammar_add_rule(g);
    if (more < 0 || reply < 0) return -1;
    bt_grammar_add_alt(g, reply);
    if (f == BT_TOOL_FORMAT_MISTRAL) lit_ws(g, reply, MISTRAL_OPEN "[", ws);
    bt_grammar_add_ref(g, reply, call);
    bt_grammar_add_ref(g, reply, more);
    if (f == BT_TOOL_FORMAT_MISTRAL) {
        bt_grammar_add_ref(g, reply, ws);
        lit_ws(g, reply, "]", -1);
    }
    return reply;
}

enum bt_status bt_tool_grammar_build(enum bt_tool_format f, const struct bt_tool *tools, size_t n, int only,
                                     int max_calls, bt_grammar **out, int *bad_tool, char *where, size_t wherelen,
                                     char *err, size_t errlen) {
    BT_ASSERT(f > BT_TOOL_FORMAT_NONE && f <= BT_TOOL_FORMAT_MISTRAL_CALL_ID && n > 0 && only < (int)n &&
              max_calls >= 1);
    if (f == BT_TOOL_FORMAT_LLAMA3) max_calls = 1; /* the template allows one call */
    *out = NULL;
    *bad_tool = -1;
    where[0] = '\0';
    bt_grammar *g = bt_grammar_new();
    if (!g) return bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory for a grammar");
    bt_json_rules j;
    bt_json_rules_init(&j, g);
    int32_t ws = bt_json_ws_rule(&j), fn = bt_grammar_add_rule(g), id = id_rule(g);
    for (size_t i = 0; ws >= 0 && fn >= 0 && id >= 0 && i < n; i++) {
        if (only >= 0 && (size_t)only != i) continue;
        if (!add_function(&j, f, fn, &tools[i], ws, id, where, wherelen, err, errlen)) {
            *bad_tool = (int)i;
            bt_grammar_free(g);
            return BT_ERR_INVALID;
        }
    }
    int32_t call = bt_grammar_add_rule(g), reply = -1;
    if (call >= 0 && ws >= 0 && fn >= 0 && id >= 0) {
        add_call(g, f, call, fn, ws, id);
        reply = add_reply(g, f, call, ws, max_calls);
    }
    enum bt_status st = bt_grammar_finish(g, reply, err, errlen);
    if (st != BT_OK) {
        bt_grammar_free(g);
        return st;
    }
    *out = g;
    return BT_OK;
}

/* ---- reading a reply ---- */

void bt_tool_call_clear(struct bt_tool_call *c) {
    free(c->name);
    free(c->arguments);
    free(c->id);
    memset(c, 0, sizeof *c);
}

void bt_tool_calls_free(struct bt_tool_call *calls, int n) {
    for (int i = 0; calls && i < n; i++) bt_tool_call_clear(&calls[i]);
    free(calls);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *t, size_t len, size_t p) {
    while (p < len && is_space(t[p])) p++;
    return p;
}

/* s[0..n) against lit: 1 it starts with lit, 2 it is a shorter start of lit, 0 neither */
static int match_lit(const char *s, size_t n, const char *lit) {
    const size_t l = strlen(lit);
    if (n >= l) return memcmp(s, lit, l) ? 0 : 1;
    return memcmp(s, lit, n) ? 0 : 2;
}

/* Llama 3's mark: ["<|python_tag|>" ws] "{" ws ("\"name\"" | "\"type\""); *skip: the bytes before the "{" */
static int match_llama3(const char *s, size_t n, size_t *skip) {
    size_t p = 0;
    int m = match_lit(s, n, PYTHON_TAG);
    if (m == 2) return 2;
    if (m == 1 && (p = skip_ws(s, n, strlen(PYTHON_TAG))) == n) return 2;
    *skip = p;
    if (s[p] != '{') return 0;
    const size_t q = skip_ws(s, n, p + 1);
    if (q == n) return 2;
    const int a = match_lit(s + q, n - q, "\"name\""), b = match_lit(s + q, n - q, "\"type\"");
    return a == 1 || b == 1 ? 1 : a == 2 || b == 2 ? 2 : 0;
}

/* Whether s[0..n) (n > 0) begins with f's opening mark: 1 (*skip: its
 * bytes before the call's own text), 2 it may still grow into one, 0 not */
static int match_open(enum bt_tool_format f, const char *s, size_t n, size_t *skip) {
    if (f == BT_TOOL_FORMAT_LLAMA3) return match_llama3(s, n, skip);
    *skip = strlen(formats[f].open);
    return match_lit(s, n, formats[f].open);
}

/* The first opening mark in text[from..len): its offset (*found), or the
 * offset of a tail that may still become one (not ended), or len. */
static size_t find_open(enum bt_tool_format f, const char *text, size_t len, size_t from, bool ended, bool *found,
                        size_t *skip) {
    *found = false;
    for (size_t i = from; i < len; i++) {
        const int m = match_open(f, text + i, len - i, skip);
        if (m == 1) {
            *found = true;
            return i;
        }
        if (m == 2 && !ended) return i;
    }
    return len;
}

size_t bt_tool_calls_plain_len(enum bt_tool_format f, const char *text, size_t len) {
    bool found;
    size_t skip;
    return f == BT_TOOL_FORMAT_NONE ? len : find_open(f, text, len, 0, false, &found, &skip);
}

/* *c from a name, arguments (an object, or a string holding one's JSON
 * text) and an id (NULL: none): 1, or -1 when the arguments are no object
 * or out of memory (*oom) */
static int make_call(struct bt_tool_call *c, const char *name, size_t name_len, json_t *args, const char *id,
                     size_t id_len, bool *oom) {
    json_t *a = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : json_incref(args);
    int r = -1;
    if (json_is_object(a) && name_len) {
        c->name = strndup(name, name_len);
        c->arguments = json_dumps(a, JSON_COMPACT);
        c->id = id ? strndup(id, id_len) : NULL;
        r = c->name && c->arguments && (c->id || !id) ? 1 : -1;
        if (r < 0) {
            *oom = true;
            bt_tool_call_clear(c);
        }
    }
    json_decref(a);
    return r;
}

/* o = {"name": string, key: arguments, ["id": string]} into *c (Llama 3's
 * "parameters" may be "arguments" too): 1, or -1 */
static int call_from_object(json_t *o, const char *key, struct bt_tool_call *c, bool *oom) {
    json_t *name = json_object_get(o, "name"), *id = json_object_get(o, "id");
    json_t *args = json_object_get(o, key);
    if (!args && !strcmp(key, "parameters")) args = json_object_get(o, "arguments");
    if (!json_is_string(name) || !args || (id && !json_is_string(id))) return -1;
    return make_call(c, json_string_value(name), json_string_length(name), args, id ? json_string_value(id) : NULL,
                     id ? json_string_length(id) : 0, oom);
}

/* the JSON object at text[p..len), its end in *end; NULL when none is whole there */
static json_t *object_at(const char *t, size_t len, size_t p, size_t *end) {
    json_error_t e;
    json_t *v = json_loadb(t + p, len - p, JSON_DISABLE_EOF_CHECK, &e);
    if (v && !json_is_object(v)) {
        json_decref(v);
        return NULL;
    }
    if (v) *end = p + (size_t)e.position;
    return v;
}

/* A raw-name call's text at t[p..len): NAME ["[CALL_ID]" ID] "[ARGS]" {...} (whitespace around NAME taken) */
static int raw_call(enum bt_tool_format f, const char *t, size_t len, size_t p, size_t *end, struct bt_tool_call *c,
                    bool *oom) {
    p = skip_ws(t, len, p);
    const char *name = t + p, *id = NULL, *br = memchr(name, '[', len - p);
    if (!br) return 0;
    size_t name_len = (size_t)(br - name);
    while (name_len && is_space(name[name_len - 1])) name_len--;
    size_t q = (size_t)(br - t), id_len = 0;
    int m;
    if (f == BT_TOOL_FORMAT_MISTRAL_CALL_ID) {
        if ((m = match_lit(t + q, len - q, MISTRAL_CALL_ID)) != 1) return m == 2 ? 0 : -1;
        id = t + q + strlen(MISTRAL_CALL_ID);
        const char *idb = memchr(id, '[', len - (size_t)(id - t));
        if (!idb) return 0;
        id_len = (size_t)(idb - id);
        q = (size_t)(idb - t);
    }
    if ((m = match_lit(t + q, len - q, MISTRAL_ARGS)) != 1) return m == 2 ? 0 : -1;
    json_t *args = object_at(t, len, q + strlen(MISTRAL_ARGS), end);
    if (!args) return 0;
    m = make_call(c, name, name_len, args, id, id_len, oom);
    json_decref(args);
    return m;
}

/* Format f's call whose own text starts at t[p..len) into *c: 1 (its end in
 * *end), 0 not whole yet (or never: the caller knows when the text ended),
 * -1 never well formed */
static int call_at(enum bt_tool_format f, const char *t, size_t len, size_t p, size_t *end, struct bt_tool_call *c,
                   bool *oom) {
    if (!formats[f].key) return raw_call(f, t, len, p, end, c, oom);
    json_t *o;
    if (f == BT_TOOL_FORMAT_HERMES) {
        const char *close = memmem(t + p, len - p, HERMES_CLOSE, strlen(HERMES_CLOSE));
        if (!close) return 0;
        *end = (size_t)(close - t) + strlen(HERMES_CLOSE);
        o = json_loadb(t + p, (size_t)(close - t) - p, 0, NULL);
        if (!o) return -1;
    } else if (!(o = object_at(t, len, p, end))) {
        return 0;
    }
    int r = json_is_object(o) ? call_from_object(o, formats[f].key, c, oom) : -1;
    json_decref(o);
    return r;
}

int bt_tool_scan_next(enum bt_tool_format f, struct bt_tool_scan *s, const char *t, size_t len, bool ended,
                      struct bt_tool_call *c, bool *oom) {
    memset(c, 0, sizeof *c);
    *oom = false;
    if (f == BT_TOOL_FORMAT_NONE) return 0;
    struct bt_tool_scan n = *s;
    size_t p, end = 0;
    for (;;) {
        const bool listed = n.inside; /* a call after another in Mistral's list: nothing outside it between them */
        if (!n.inside) {
            bool found;
            size_t skip;
            n.from = n.pos;
            n.open = find_open(f, t, len, n.pos, true, &found, &skip);
            if (!found) return 0;
            p = n.open + skip;
            if (f != BT_TOOL_FORMAT_MISTRAL) break;
            /* Mistral: the list's "[" */
            if ((p = skip_ws(t, len, p)) == len) goto unfinished;
            if (t[p] != '[') return -1;
            n.inside = true;
            n.pos = p + 1;
        }
        /* inside Mistral's list: a call (after a "," when one came before), or its "]" */
        p = skip_ws(t, len, n.pos);
        if (p < len && t[p] == ',') p = skip_ws(t, len, p + 1);
        if (p == len) goto unfinished;
        if (t[p] != ']') {
            if (listed) n.from = n.open = p;
            break;
        }
        n.inside = false;
        n.pos = p + 1;
        *s = n;
    }
    const int r = call_at(f, t, len, p, &end, c, oom);
    if (r > 0) {
        n.pos = end;
        *s = n;
        return 1;
    }
    if (r < 0) return -1;
unfinished:
    return ended ? -1 : 0;
}

/* ---- a reply streamed ---- */

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space(s[i])) return false;
    return true;
}

size_t bt_tool_stream_news(enum bt_tool_format f, struct bt_tool_stream *s, const char *t, size_t len, bool ended,
                           size_t *seen, bool *call) {
    *call = false;
    if (s->call.name) {
        /* the content before it (not blank) first; the text between two calls of one list is none */
        if (!s->head_sent && s->scan.from > *seen) *seen = s->scan.from;
        if (!s->head_sent && s->scan.open > *seen && !blank(t + *seen, s->scan.open - *seen)) return s->scan.open;
        if (!s->head_sent) *seen = s->scan.open;
        *call = true;
        return *seen;
    }
    if (!s->broken) {
        bool oom;
        const int got = bt_tool_scan_next(f, &s->scan, t, len, ended, &s->call, &oom);
        if (got > 0) return bt_tool_stream_news(f, s, t, len, ended, seen, call);
        s->broken = ended && got < 0;
        if (!ended) return s->n_sent > 0 ? *seen : *seen + bt_tool_calls_plain_len(f, t + *seen, len - *seen);
    }
    /* the end: the rest, past the last call's text, is content unless blank after calls */
    if (!s->broken && s->scan.pos > *seen) *seen = s->scan.pos;
    if (s->n_sent > 0 && blank(t + *seen, len - *seen)) *seen = len;
    return len;
}

void bt_tool_stream_call_sent(struct bt_tool_stream *s, size_t *seen) {
    if (s->head_sent) {
        bt_tool_call_clear(&s->call);
        s->n_sent++;
        *seen = s->scan.pos;
    }
    s->head_sent = !s->head_sent;
}

void bt_tool_stream_free(struct bt_tool_stream *s) { bt_tool_call_clear(&s->call); }

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

int bt_tool_calls_parse(enum bt_tool_format f, const char *text, size_t len, struct bt_tool_call **calls,
                        char **content) {
    *calls = NULL;
    *content = NULL;
    bool oom = false;
    char *outside = malloc(len + 1);
    struct bt_tool_call *c = calloc(BT_TOOL_MAX_CALLS, sizeof *c), one;
    if (!outside || !c) {
        free(outside);
        free(c);
        return -1;
    }
    struct bt_tool_scan s = {0};
    size_t n_out = 0;
    int n = 0, r;
    while ((r = bt_tool_scan_next(f, &s, text, len, true, &one, &oom)) == 1) {
        if (n == BT_TOOL_MAX_CALLS) {
            bt_tool_call_clear(&one);
            r = -1;
            break;
        }
        memcpy(outside + n_out, text + s.from, s.open - s.from);
        n_out += s.open - s.from;
        c[n++] = one;
    }
    if (r == 0 && n > 0) {
        memcpy(outside + n_out, text + s.pos, len - s.pos);
        *content = trimmed(outside, n_out + len - s.pos, &oom);
    }
    free(outside);
    if (r == 0 && n > 0 && !oom) {
        *calls = c;
        return n;
    }
    bt_tool_calls_free(c, n);
    if (oom) return -1;
    *content = trimmed(text, len, &oom);
    return oom ? -1 : 0;
}
