/* json_schema.c - a JSON schema (read with jansson) walked into rules of a
 * byte grammar (json_schema.h).
 *
 * The shapes, with ws the optional whitespace (bt_json_ws_rule):
 *   object  "{" ws [ kv ("," ws kv)* ] "}"      kv: "key" ws ":" ws value ws
 *   array   "[" ws [ item ws ("," ws item ws)* ] "]"
 *   string  '"' char* '"'  (char: printable ASCII but '"' and '\', an escape,
 *           or a whole UTF-8 sequence, byte by byte)
 * No whitespace before the first token or after the last, so the end of a
 * value is where the grammar is complete.
 *
 * An object's properties p_0..p_{n-1} in order, each required or not:
 *   S_i ::= kv_i T_{i+1} | S_{i+1} (the second only when p_i is optional)
 *   T_i ::= "," ws kv_i T_{i+1} | T_{i+1} (likewise)
 * S: nothing written yet (no comma), T: something written; S_n and T_n take
 * the additional properties, if any. */
#include "json_schema.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_pattern.h"

/* the largest integer of 16 digits, integer_rule's bound */
#define INT16_DIGITS_MAX 9999999999999999LL

struct ref { /* a $ref already compiled: its rule */
    char *ptr;
    int32_t rule;
};

struct ctx {
    bt_json_rules *j;
    bt_grammar *g;
    json_t *doc;
    struct ref *refs;
    int n_refs, cap_refs;
    int depth, nodes;
    char path[512];
    size_t plen;
    char *where, *err;
    size_t wherelen, errlen;
    bool failed;
};

void bt_json_rules_init(bt_json_rules *j, bt_grammar *g) { *j = (bt_json_rules){g, -1, -1, -1, -1, -1, -1, -1}; }

/* ---- the rules every schema shares ---- */

int32_t bt_json_ws_rule(bt_json_rules *j) {
    if (j->ws >= 0) return j->ws;
    bt_grammar *g = j->g;
    int32_t ind = bt_grammar_add_rule(g);
    if (ind < 0) return -1;
    static const uint8_t lo[2] = {' ', '\t'}, hi[2] = {' ', '\t'};
    bt_grammar_add_alt(g, ind);
    bt_grammar_add_class(g, ind, lo, hi, 2, false);
    int32_t indent = bt_grammar_repeat(g, ind, 0, 20);
    int32_t ws = bt_grammar_add_rule(g);
    if (indent < 0 || ws < 0) return -1;
    bt_grammar_add_alt(g, ws); /* nothing */
    bt_grammar_add_alt(g, ws);
    bt_grammar_add_lit(g, ws, " ", 1);
    bt_grammar_add_alt(g, ws);
    bt_grammar_add_lit(g, ws, "\n", 1);
    bt_grammar_add_ref(g, ws, indent);
    return j->ws = ws;
}

/* one character of a JSON string */
static int32_t char_rule(bt_json_rules *j) {
    if (j->chr >= 0) return j->chr;
    bt_grammar *g = j->g;
    int32_t c = bt_grammar_add_rule(g);
    if (c < 0) return -1;
    static const uint8_t lo[3] = {0x20, 0x23, 0x5D}, hi[3] = {0x21, 0x5B, 0x7F};
    bt_grammar_add_alt(g, c);
    bt_grammar_add_class(g, c, lo, hi, 3, false);
    static const uint8_t elo[8] = {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'};
    bt_grammar_add_alt(g, c);
    bt_grammar_add_lit(g, c, "\\", 1);
    bt_grammar_add_class(g, c, elo, elo, 8, false);
    static const uint8_t xlo[3] = {'0', 'a', 'A'}, xhi[3] = {'9', 'f', 'F'};
    bt_grammar_add_alt(g, c);
    bt_grammar_add_lit(g, c, "\\u", 2);
    for (int i = 0; i < 4; i++) bt_grammar_add_class(g, c, xlo, xhi, 3, false);
    /* UTF-8 (RFC 3629's table): no overlongs, no surrogates, at most U+10FFFF */
    static const uint8_t seq[][8] = {
        {0xC2, 0xDF, 0x80, 0xBF, 0, 0, 0, 0},
        {0xE0, 0xE0, 0xA0, 0xBF, 0x80, 0xBF, 0, 0},
        {0xE1, 0xEC, 0x80, 0xBF, 0x80, 0xBF, 0, 0},
        {0xED, 0xED, 0x80, 0x9F, 0x80, 0xBF, 0, 0},
        {0xEE, 0xEF, 0x80, 0xBF, 0x80, 0xBF, 0, 0},
        {0xF0, 0xF0, 0x90, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF1, 0xF3, 0x80, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {0xF4, 0xF4, 0x80, 0x8F, 0x80, 0xBF, 0x80, 0xBF},
    };
    for (size_t s = 0; s < sizeof seq / sizeof seq[0]; s++) {
        bt_grammar_add_alt(g, c);
        for (int k = 0; k < 8 && seq[s][k]; k += 2) bt_grammar_add_range(g, c, seq[s][k], seq[s][k + 1]);
    }
    return j->chr = c;
}

/* '"' char{min,max} '"' (max < 0: no bound) */
static int32_t string_rule(bt_json_rules *j, int64_t min, int64_t max) {
    if (min == 0 && max < 0 && j->str >= 0) return j->str;
    bt_grammar *g = j->g;
    int32_t c = char_rule(j);
    int32_t body = c < 0 ? -1 : bt_grammar_repeat(g, c, min, max);
    int32_t s = bt_grammar_add_rule(g);
    if (body < 0 || s < 0) return -1;
    bt_grammar_add_alt(g, s);
    bt_grammar_add_lit(g, s, "\"", 1);
    bt_grammar_add_ref(g, s, body);
    bt_grammar_add_lit(g, s, "\"", 1);
    if (min == 0 && max < 0) j->str = s;
    return s;
}

/* a rule of one digit class repeated min..max times */
static int32_t digits(bt_grammar *g, uint8_t lo, int64_t min, int64_t max) {
    int32_t d = bt_grammar_add_rule(g);
    if (d < 0) return -1;
    bt_grammar_add_alt(g, d);
    bt_grammar_add_range(g, d, lo, '9');
    return bt_grammar_repeat(g, d, min, max);
}

/* -? (0 | [1-9][0-9]{0,15}) */
static int32_t integer_rule(bt_json_rules *j) {
    if (j->integer >= 0) return j->integer;
    bt_grammar *g = j->g;
    int32_t rest = digits(g, '0', 0, 15), sign = bt_grammar_add_rule(g), r = bt_grammar_add_rule(g);
    if (rest < 0 || sign < 0 || r < 0) return -1;
    bt_grammar_add_alt(g, sign);
    bt_grammar_add_alt(g, sign);
    bt_grammar_add_lit(g, sign, "-", 1);
    bt_grammar_add_alt(g, r);
    bt_grammar_add_ref(g, r, sign);
    bt_grammar_add_lit(g, r, "0", 1);
    bt_grammar_add_alt(g, r);
    bt_grammar_add_ref(g, r, sign);
    bt_grammar_add_range(g, r, '1', '9');
    bt_grammar_add_ref(g, r, rest);
    return j->integer = r;
}

/* The n-digit strings from a to b (a <= b, both n digits).  After their
 * common prefix p and first differing digits x < y, with k digits left:
 *   p x (a's rest .. 9{k}) | p [x+1 .. y-1] [0-9]{k} | p y (0{k} .. b's rest)
 * where a rest of zeros joins x to the middle and a rest of nines y. */
static int32_t digits_between(bt_grammar *g, const char *a, const char *b, int n) {
    int i = 0;
    while (i < n && a[i] == b[i]) i++;
    int32_t r = bt_grammar_add_rule(g);
    if (r < 0) return -1;
    if (i >= n - 1) {
        bt_grammar_add_alt(g, r);
        bt_grammar_add_lit(g, r, a, (size_t)i);
        if (i < n) bt_grammar_add_range(g, r, (uint8_t)a[i], (uint8_t)b[i]);
        return r;
    }
    int k = n - i - 1;
    char zeros[24], nines[24];
    memset(zeros, '0', (size_t)k);
    memset(nines, '9', (size_t)k);
    bool a_low = !memcmp(a + i + 1, zeros, (size_t)k), b_high = !memcmp(b + i + 1, nines, (size_t)k);
    char lo = (char)(a_low ? a[i] : a[i] + 1), hi = (char)(b_high ? b[i] : b[i] - 1);
    /* each side: its first digit and the range of its rest */
    const char *const side[2][3] = {{a_low ? NULL : a, a + i + 1, nines}, {b_high ? NULL : b, zeros, b + i + 1}};
    for (int q = 0; q < 2; q++) {
        if (!side[q][0]) continue;
        int32_t rest = digits_between(g, side[q][1], side[q][2], k);
        if (rest < 0) return -1;
        bt_grammar_add_alt(g, r);
        bt_grammar_add_lit(g, r, a, (size_t)i);
        bt_grammar_add_lit(g, r, side[q][0] + i, 1);
        bt_grammar_add_ref(g, r, rest);
    }
    if (lo <= hi) {
        int32_t any = digits(g, '0', k, k);
        if (any < 0) return -1;
        bt_grammar_add_alt(g, r);
        bt_grammar_add_lit(g, r, a, (size_t)i);
        bt_grammar_add_range(g, r, (uint8_t)lo, (uint8_t)hi);
        bt_grammar_add_ref(g, r, any);
    }
    return r;
}

/* the integers lo..hi written without sign (0 <= lo <= hi <= INT16_DIGITS_MAX):
 * one alternative per count of digits */
static int32_t naturals_between(bt_grammar *g, int64_t lo, int64_t hi) {
    int32_t r = bt_grammar_add_rule(g);
    if (r < 0) return -1;
    int64_t p = 1; /* 10^(d-1) */
    for (int d = 1; d <= 16; d++, p *= 10) {
        int64_t first = d == 1 ? 0 : p, a = lo > first ? lo : first, b = hi < 10 * p - 1 ? hi : 10 * p - 1;
        if (a > b) continue;
        char sa[24], sb[24];
        snprintf(sa, sizeof sa, "%lld", (long long)a);
        snprintf(sb, sizeof sb, "%lld", (long long)b);
        int32_t x = digits_between(g, sa, sb, d);
        if (x < 0) return -1;
        bt_grammar_add_alt(g, r);
        bt_grammar_add_ref(g, r, x);
    }
    return r;
}

/* the integers lo..hi (|lo|, |hi| <= INT16_DIGITS_MAX): "-" (-hi .. -lo) | (lo .. hi), each side where it has one */
static int32_t integer_between(bt_grammar *g, int64_t lo, int64_t hi) {
    int32_t r = bt_grammar_add_rule(g);
    if (r < 0) return -1;
    if (lo < 0) {
        int32_t neg = naturals_between(g, hi < 0 ? -hi : 1, -lo);
        if (neg < 0) return -1;
        bt_grammar_add_alt(g, r);
        bt_grammar_add_lit(g, r, "-", 1);
        bt_grammar_add_ref(g, r, neg);
    }
    if (hi >= 0) {
        int32_t pos = naturals_between(g, lo > 0 ? lo : 0, hi);
        if (pos < 0) return -1;
        bt_grammar_add_alt(g, r);
        bt_grammar_add_ref(g, r, pos);
    }
    return r;
}

/* integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? */
static int32_t number_rule(bt_json_rules *j) {
    if (j->num >= 0) return j->num;
    bt_grammar *g = j->g;
    int32_t in = integer_rule(j), fd = digits(g, '0', 1, 16), ed = digits(g, '0', 1, 3);
    int32_t frac = bt_grammar_add_rule(g), ex = bt_grammar_add_rule(g), r = bt_grammar_add_rule(g);
    if (in < 0 || fd < 0 || ed < 0 || frac < 0 || ex < 0 || r < 0) return -1;
    bt_grammar_add_alt(g, frac);
    bt_grammar_add_alt(g, frac);
    bt_grammar_add_lit(g, frac, ".", 1);
    bt_grammar_add_ref(g, frac, fd);
    static const uint8_t e[2] = {'e', 'E'}, s[2] = {'-', '+'};
    bt_grammar_add_alt(g, ex);
    bt_grammar_add_alt(g, ex);
    bt_grammar_add_class(g, ex, e, e, 2, false);
    bt_grammar_add_ref(g, ex, ed);
    bt_grammar_add_alt(g, ex);
    bt_grammar_add_class(g, ex, e, e, 2, false);
    bt_grammar_add_class(g, ex, s, s, 2, false);
    bt_grammar_add_ref(g, ex, ed);
    bt_grammar_add_alt(g, r);
    bt_grammar_add_ref(g, r, in);
    bt_grammar_add_ref(g, r, frac);
    bt_grammar_add_ref(g, r, ex);
    return j->num = r;
}

/* open ws [ item ws ("," ws item ws){min-1,max-1} ] close; item < 0 is an error */
static int32_t list_rule(bt_json_rules *j, const char *open, const char *close, int32_t item, int64_t min,
                         int64_t max) {
    bt_grammar *g = j->g;
    int32_t ws = bt_json_ws_rule(j);
    if (ws < 0 || item < 0) return -1;
    int32_t r = bt_grammar_add_rule(g);
    if (r < 0) return -1;
    if (min == 0) {
        bt_grammar_add_alt(g, r);
        bt_grammar_add_lit(g, r, open, 1);
        bt_grammar_add_ref(g, r, ws);
        bt_grammar_add_lit(g, r, close, 1);
    }
    if (max == 0) return r;
    int32_t more = bt_grammar_add_rule(g);
    if (more < 0) return -1;
    bt_grammar_add_alt(g, more);
    bt_grammar_add_lit(g, more, ",", 1);
    bt_grammar_add_ref(g, more, ws);
    bt_grammar_add_ref(g, more, item);
    bt_grammar_add_ref(g, more, ws);
    int64_t lo = min > 0 ? min - 1 : 0;
    int32_t rest = bt_grammar_repeat(g, more, lo, max < 0 ? -1 : max - 1);
    if (rest < 0) return -1;
    bt_grammar_add_alt(g, r);
    bt_grammar_add_lit(g, r, open, 1);
    bt_grammar_add_ref(g, r, ws);
    bt_grammar_add_ref(g, r, item);
    bt_grammar_add_ref(g, r, ws);
    bt_grammar_add_ref(g, r, rest);
    bt_grammar_add_lit(g, r, close, 1);
    return r;
}

/* key ws ":" ws value ws, key a rule (a literal or any string) */
static int32_t kv_rule(bt_json_rules *j, int32_t key, int32_t value) {
    bt_grammar *g = j->g;
    int32_t ws = bt_json_ws_rule(j), r = bt_grammar_add_rule(g);
    if (ws < 0 || r < 0 || key < 0 || value < 0) return -1;
    bt_grammar_add_alt(g, r);
    bt_grammar_add_ref(g, r, key);
    bt_grammar_add_ref(g, r, ws);
    bt_grammar_add_lit(g, r, ":", 1);
    bt_grammar_add_ref(g, r, ws);
    bt_grammar_add_ref(g, r, value);
    bt_grammar_add_ref(g, r, ws);
    return r;
}

int32_t bt_json_value_rule(bt_json_rules *j) {
    if (j->value >= 0) return j->value;
    bt_grammar *g = j->g;
    int32_t v = bt_grammar_add_rule(g);
    if (v < 0) return -1;
    j->value = v; /* before its parts, which refer to it */
    int32_t obj = bt_json_object_rule(j), str = string_rule(j, 0, -1), num = number_rule(j);
    int32_t arr = list_rule(j, "[", "]", v, 0, -1);
    if (obj < 0 || str < 0 || num < 0 || arr < 0) return -1;
    const int32_t parts[4] = {obj, arr, str, num};
    for (int i = 0; i < 4; i++) {
        bt_grammar_add_alt(g, v);
        bt_grammar_add_ref(g, v, parts[i]);
    }
    static const char *const lits[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        bt_grammar_add_alt(g, v);
        bt_grammar_add_lit(g, v, lits[i], strlen(lits[i]));
    }
    return v;
}

int32_t bt_json_object_rule(bt_json_rules *j) {
    if (j->object >= 0) return j->object;
    int32_t v = bt_json_value_rule(j);
    if (j->object >= 0) return j->object; /* made by the value rule */
    int32_t kv = kv_rule(j, string_rule(j, 0, -1), v);
    return j->object = list_rule(j, "{", "}", kv, 0, -1);
}

/* ---- schemas ---- */

static int32_t bad(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int32_t bad(struct ctx *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = true;
    snprintf(c->where, c->wherelen, "%s", c->path);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* the grammar's own failure (a bound, out of memory) as the schema's */
static int32_t grammar_bad(struct ctx *c) {
    return bad(c, "the schema is too large: %s", bt_grammar_error(c->g)[0] ? bt_grammar_error(c->g) : "a bound");
}

/* path += fmt (undone by restoring c->plen) */
static void path_push(struct ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void path_push(struct ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->path + c->plen, sizeof c->path - c->plen, fmt, ap);
    va_end(ap);
    if (n > 0) c->plen += (size_t)n < sizeof c->path - c->plen ? (size_t)n : sizeof c->path - c->plen - 1;
}

static int32_t visit(struct ctx *c, json_t *s);

/* visit s under path segment ".key" or "[idx]" */
static int32_t visit_key(struct ctx *c, json_t *s, const char *key) {
    size_t keep = c->plen;
    path_push(c, "%s%s", c->plen ? "." : "", key);
    int32_t r = visit(c, s);
    if (!c->failed) c->path[c->plen = keep] = '\0';
    return r;
}

static int32_t visit_index(struct ctx *c, json_t *s, size_t idx) {
    size_t keep = c->plen;
    path_push(c, "[%zu]", idx);
    int32_t r = visit(c, s);
    if (!c->failed) c->path[c->plen = keep] = '\0';
    return r;
}

/* a literal rule for the JSON text of v */
static int32_t literal(struct ctx *c, json_t *v) {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return bad(c, "out of memory");
    int32_t r = bt_grammar_add_rule(c->g);
    if (r >= 0) {
        bt_grammar_add_alt(c->g, r);
        bt_grammar_add_lit(c->g, r, t, strlen(t));
    }
    free(t);
    return r < 0 ? grammar_bad(c) : r;
}

static bool count_of(struct ctx *c, json_t *s, const char *key, int64_t *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > BT_JSON_SCHEMA_MAX_COUNT) {
        size_t keep = c->plen;
        path_push(c, "%s%s", c->plen ? "." : "", key);
        bad(c, "'%s' must be an integer from 0 to %d", key, BT_JSON_SCHEMA_MAX_COUNT);
        c->plen = keep;
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

/* a rule with one alternative per member of the array `key` of s */
static int32_t alternatives(struct ctx *c, json_t *s, const char *key, bool schemas) {
    json_t *a = json_object_get(s, key);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > BT_JSON_SCHEMA_MAX_COUNT) {
        path_push(c, "%s%s", c->plen ? "." : "", key);
        return bad(c, "'%s' must be an array of 1 to %d entries", key, BT_JSON_SCHEMA_MAX_COUNT);
    }
    int32_t r = bt_grammar_add_rule(c->g);
    if (r < 0) return grammar_bad(c);
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *m = json_array_get(a, i);
        int32_t x;
        if (schemas) {
            size_t keep = c->plen;
            path_push(c, "%s%s", c->plen ? "." : "", key);
            x = visit_index(c, m, i);
            if (!c->failed) c->path[c->plen = keep] = '\0';
        } else {
            x = literal(c, m);
        }
        if (x < 0) return -1;
        bt_grammar_add_alt(c->g, r);
        bt_grammar_add_ref(c->g, r, x);
    }
    return r;
}

static int32_t object_schema(struct ctx *c, json_t *s) {
    bt_grammar *g = c->g;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return bad(c, "'properties' must be an object");
    if (req && !json_is_array(req)) return bad(c, "'required' must be an array of property names");
    size_t n = props ? json_object_size(props) : 0;
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *k = json_array_get(req, i);
        if (!json_is_string(k)) return bad(c, "'required[%zu]' is not a string", i);
        if (!props || !json_object_get(props, json_string_value(k)))
            return bad(c, "'required' names '%s', which is not in 'properties'", json_string_value(k));
    }
    /* extra: key-value pairs of other keys, or -1 */
    int32_t extra = -1;
    if (addl && !(json_is_false(addl) || json_is_null(addl))) {
        int32_t v = json_is_true(addl) ? bt_json_value_rule(c->j) : visit_key(c, addl, "additionalProperties");
        if (v < 0) return c->failed ? -1 : grammar_bad(c);
        if ((extra = kv_rule(c->j, string_rule(c->j, 0, -1), v)) < 0) return grammar_bad(c);
    } else if (!props) { /* {"type": "object"} alone: any object */
        int32_t o = bt_json_object_rule(c->j);
        return o < 0 ? grammar_bad(c) : o;
    }
    int32_t ws = bt_json_ws_rule(c->j);
    int32_t comma_extra = -1, sn = bt_grammar_add_rule(g), tn = bt_grammar_add_rule(g);
    if (ws < 0 || sn < 0 || tn < 0) return grammar_bad(c);
    /* S_n, T_n: the additional properties, comma-separated */
    bt_grammar_add_alt(g, sn);
    bt_grammar_add_alt(g, tn);
    if (extra >= 0) {
        if ((comma_extra = bt_grammar_add_rule(g)) < 0) return grammar_bad(c);
        bt_grammar_add_alt(g, comma_extra);
        bt_grammar_add_lit(g, comma_extra, ",", 1);
        bt_grammar_add_ref(g, comma_extra, ws);
        bt_grammar_add_ref(g, comma_extra, extra);
        int32_t more = bt_grammar_repeat(g, comma_extra, 0, -1);
        if (more < 0) return grammar_bad(c);
        bt_grammar_add_ref(g, tn, more);
        bt_grammar_add_alt(g, sn);
        bt_grammar_add_ref(g, sn, extra);
        bt_grammar_add_ref(g, sn, more);
    }
    /* S_i, T_i from the last property back */
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    json_t **vals = malloc((n ? n : 1) * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return bad(c, "out of memory");
    }
    size_t i = 0;
    const char *key;
    json_t *val;
    json_object_foreach(props, key, val) {
        keys[i] = key;
        vals[i++] = val;
    }
    int32_t s_next = sn, t_next = tn, r = -1;
    for (size_t k = n; k-- > 0;) {
        bool required = false;
        for (size_t q = 0; req && q < json_array_size(req); q++)
            if (!strcmp(json_string_value(json_array_get(req, q)), keys[k])) required = true;
        size_t keep = c->plen;
        path_push(c, "%sproperties", c->plen ? "." : "");
        int32_t v = visit_key(c, vals[k], keys[k]);
        if (v < 0) goto out;
        c->path[c->plen = keep] = '\0';
        json_t *kj = json_string(keys[k]);
        int32_t kl = kj ? literal(c, kj) : bad(c, "out of memory");
        json_decref(kj);
        int32_t kv = kl < 0 ? -1 : kv_rule(c->j, kl, v);
        int32_t si = bt_grammar_add_rule(g), ti = bt_grammar_add_rule(g);
        if (kv < 0 || si < 0 || ti < 0) {
            if (!c->failed) grammar_bad(c);
            goto out;
        }
        bt_grammar_add_alt(g, si);
        bt_grammar_add_ref(g, si, kv);
        bt_grammar_add_ref(g, si, t_next);
        bt_grammar_add_alt(g, ti);
        bt_grammar_add_lit(g, ti, ",", 1);
        bt_grammar_add_ref(g, ti, ws);
        bt_grammar_add_ref(g, ti, kv);
        bt_grammar_add_ref(g, ti, t_next);
        if (!required) {
            bt_grammar_add_alt(g, si);
            bt_grammar_add_ref(g, si, s_next);
            bt_grammar_add_alt(g, ti);
            bt_grammar_add_ref(g, ti, t_next);
        }
        s_next = si;
        t_next = ti;
    }
    if ((r = bt_grammar_add_rule(g)) < 0) {
        grammar_bad(c);
        goto out;
    }
    bt_grammar_add_alt(g, r);
    bt_grammar_add_lit(g, r, "{", 1);
    bt_grammar_add_ref(g, r, ws);
    bt_grammar_add_ref(g, r, s_next);
    bt_grammar_add_lit(g, r, "}", 1);
out:
    free(keys);
    free(vals);
    return c->failed ? -1 : r;
}

/* keyword other of a schema refused beside keyword by: a 400 at other's path */
static int32_t refuse_beside(struct ctx *c, const char *other, const char *by, const char *why) {
    path_push(c, "%s%s", c->plen ? "." : "", other);
    return bad(c, "'%s' beside '%s'%s is not supported", other, by, why);
}

/* "[" ws item_0 ws ("," ws item_i ws)* "]": exactly the schemas of the array s[key], as llama.cpp */
static int32_t tuple_schema(struct ctx *c, json_t *s, const char *key) {
    json_t *a = json_object_get(s, key), *items = json_object_get(s, "items");
    const char *other = strcmp(key, "items") && items && !json_is_false(items) ? "items"
                        : json_object_get(s, "minItems")                       ? "minItems"
                        : json_object_get(s, "maxItems")                       ? "maxItems"
                                                                               : NULL;
    if (other) return refuse_beside(c, other, key, " (a tuple of exactly its schemas)");
    if (json_array_size(a) > BT_JSON_SCHEMA_MAX_COUNT) {
        path_push(c, "%s%s", c->plen ? "." : "", key);
        return bad(c, "'%s' must be an array of at most %d schemas", key, BT_JSON_SCHEMA_MAX_COUNT);
    }
    int32_t ws = bt_json_ws_rule(c->j), r = bt_grammar_add_rule(c->g);
    if (ws < 0 || r < 0) return grammar_bad(c);
    bt_grammar_add_alt(c->g, r);
    bt_grammar_add_lit(c->g, r, "[", 1);
    bt_grammar_add_ref(c->g, r, ws);
    for (size_t i = 0; i < json_array_size(a); i++) {
        size_t keep = c->plen;
        path_push(c, "%s%s", c->plen ? "." : "", key);
        int32_t x = visit_index(c, json_array_get(a, i), i);
        if (x < 0) return -1;
        c->path[c->plen = keep] = '\0';
        if (i) {
            bt_grammar_add_lit(c->g, r, ",", 1);
            bt_grammar_add_ref(c->g, r, ws);
        }
        bt_grammar_add_ref(c->g, r, x);
        bt_grammar_add_ref(c->g, r, ws);
    }
    bt_grammar_add_lit(c->g, r, "]", 1);
    return bt_grammar_error(c->g)[0] ? grammar_bad(c) : r;
}

static int32_t array_schema(struct ctx *c, json_t *s) {
    json_t *u = json_object_get(s, "uniqueItems"), *items = json_object_get(s, "items");
    if (u && !json_is_false(u)) {
        path_push(c, "%suniqueItems", c->plen ? "." : "");
        return bad(c, json_is_true(u) ? "'uniqueItems' true is not supported" : "'uniqueItems' must be a boolean");
    }
    json_t *pre = json_object_get(s, "prefixItems");
    if (pre && !json_is_array(pre)) {
        path_push(c, "%sprefixItems", c->plen ? "." : "");
        return bad(c, "'prefixItems' must be an array of schemas");
    }
    if (pre || json_is_array(items)) return tuple_schema(c, s, pre ? "prefixItems" : "items");
    int64_t min = 0, max = -1;
    if (!count_of(c, s, "minItems", &min) || !count_of(c, s, "maxItems", &max)) return -1;
    if (max >= 0 && max < min)
        return bad(c, "'maxItems' %lld is below 'minItems' %lld", (long long)max, (long long)min);
    int32_t item = items ? visit_key(c, items, "items") : bt_json_value_rule(c->j);
    if (item < 0) return c->failed ? -1 : grammar_bad(c);
    int32_t r = list_rule(c->j, "[", "]", item, min, max);
    return r < 0 ? grammar_bad(c) : r;
}

/* The pattern of a string format llama.cpp's converter knows (uuid1 to
 * uuid5 are uuid), or NULL: a format not known is only an annotation. */
#define FORMAT_DATE "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
#define FORMAT_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{3})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
static const char *format_pattern(json_t *format) {
    static const char *const known[][2] = {
        {"date", "^" FORMAT_DATE "$"},
        {"time", "^" FORMAT_TIME "$"},
        {"date-time", "^" FORMAT_DATE "T" FORMAT_TIME "$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    };
    const char *f = json_string_value(format);
    if (!f) return NULL;
    if (!strncmp(f, "uuid", 4) && f[4] >= '1' && f[4] <= '5' && !f[5]) f = "uuid";
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(f, known[i][0])) return known[i][1];
    return NULL;
}

/* '"' body '"' with the body what pattern[0..len) matches; key: where it came from */
static int32_t pattern_string(struct ctx *c, const char *pattern, size_t len, const char *key) {
    int32_t ch = char_rule(c->j);
    if (ch < 0) return grammar_bad(c);
    char msg[256];
    size_t at;
    int32_t body = bt_json_pattern_rule(c->g, ch, pattern, len, &at, msg, sizeof msg);
    if (body < 0 && msg[0]) {
        path_push(c, "%s%s", c->plen ? "." : "", key);
        return bad(c, "'%s' at offset %zu: %s", key, at, msg);
    }
    int32_t r = body < 0 ? -1 : bt_grammar_add_rule(c->g);
    if (r < 0) return grammar_bad(c);
    bt_grammar_add_alt(c->g, r);
    bt_grammar_add_lit(c->g, r, "\"", 1);
    bt_grammar_add_ref(c->g, r, body);
    bt_grammar_add_lit(c->g, r, "\"", 1);
    return r;
}

/* a string: by its pattern, or its known format, or its length; one of them only */
static int32_t string_schema(struct ctx *c, json_t *s) {
    int64_t min = 0, max = -1;
    if (!count_of(c, s, "minLength", &min) || !count_of(c, s, "maxLength", &max)) return -1;
    if (max >= 0 && max < min)
        return bad(c, "'maxLength' %lld is below 'minLength' %lld", (long long)max, (long long)min);
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    const char *wrong = pat && !json_is_string(pat) ? "pattern" : fmt && !json_is_string(fmt) ? "format" : NULL;
    if (wrong) {
        path_push(c, "%s%s", c->plen ? "." : "", wrong);
        return bad(c, "'%s' must be a string", wrong);
    }
    const char *fp = format_pattern(fmt), *by = pat ? "pattern" : fp ? "format" : NULL;
    if (by) {
        const char *other = pat && fp                           ? "format"
                            : json_object_get(s, "minLength") ? "minLength"
                            : json_object_get(s, "maxLength") ? "maxLength"
                                                              : NULL;
        if (other) return refuse_beside(c, other, by, "");
        return pat ? pattern_string(c, json_string_value(pat), json_string_length(pat), "pattern")
                   : pattern_string(c, fp, strlen(fp), "format");
    }
    int32_t r = string_rule(c->j, min, max);
    return r < 0 ? grammar_bad(c) : r;
}

/* The integer bound s[key] rounded inwards (up: to the next integer up)
 * and clamped to +-(INT16_DIGITS_MAX + 1) into *v: 1; 0 when absent; -1 when it is not a number. */
static int int_bound(struct ctx *c, json_t *s, const char *key, bool up, int64_t *v) {
    json_t *x = json_object_get(s, key);
    if (!x) return 0;
    if (!json_is_number(x)) {
        path_push(c, "%s%s", c->plen ? "." : "", key);
        bad(c, "'%s' must be a number", key);
        return -1;
    }
    const int64_t lim = INT16_DIGITS_MAX + 1;
    if (json_is_integer(x)) {
        json_int_t i = json_integer_value(x);
        *v = i > lim ? lim : i < -lim ? -lim : (int64_t)i;
    } else {
        double d = up ? ceil(json_real_value(x)) : floor(json_real_value(x));
        *v = d > (double)lim ? lim : d < -(double)lim ? -lim : (int64_t)d;
    }
    return 1;
}

/* an integer within minimum, exclusiveMinimum, maximum, exclusiveMaximum (every one given) */
static int32_t integer_schema(struct ctx *c, json_t *s) {
    static const struct {
        const char *key;
        bool up, low;
        int add;
    } b[4] = {{"minimum", true, true, 0},
              {"exclusiveMinimum", false, true, 1},
              {"maximum", false, false, 0},
              {"exclusiveMaximum", true, false, -1}};
    int64_t lo = -INT16_DIGITS_MAX, hi = INT16_DIGITS_MAX, v;
    bool bounded = false;
    for (int i = 0; i < 4; i++) {
        int got = int_bound(c, s, b[i].key, b[i].up, &v);
        if (got < 0) return -1;
        if (!got) continue;
        bounded = true;
        v += b[i].add;
        if (b[i].low && v > lo) lo = v;
        if (!b[i].low && v < hi) hi = v;
    }
    if (lo > hi)
        return bad(c, "no integer of at most 16 digits is within the bounds (from %lld to %lld)", (long long)lo,
                   (long long)hi);
    int32_t r = bounded ? integer_between(c->g, lo, hi) : integer_rule(c->j);
    return r < 0 ? grammar_bad(c) : r;
}

/* one type name's rule */
static int32_t typed(struct ctx *c, json_t *s, const char *t) {
    if (!strcmp(t, "object")) return object_schema(c, s);
    if (!strcmp(t, "array")) return array_schema(c, s);
    if (!strcmp(t, "string")) return string_schema(c, s);
    int32_t r = -1;
    if (!strcmp(t, "number"))
        r = number_rule(c->j);
    else if (!strcmp(t, "integer"))
        return integer_schema(c, s);
    else if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        r = bt_grammar_add_rule(c->g);
        if (r >= 0) {
            bool b = !strcmp(t, "boolean");
            bt_grammar_add_alt(c->g, r);
            bt_grammar_add_lit(c->g, r, b ? "true" : "null", 4);
            if (b) {
                bt_grammar_add_alt(c->g, r);
                bt_grammar_add_lit(c->g, r, "false", 5);
            }
        }
    } else {
        path_push(c, "%stype", c->plen ? "." : "");
        return bad(c, "unknown type '%s' (object, array, string, number, integer, boolean, null)", t);
    }
    return r < 0 ? grammar_bad(c) : r;
}

static const char *const k_known[] = {
    /* compiled */
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "prefixItems", "uniqueItems",
    /* annotations, ignored */
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs", "definitions", "deprecated",
    "readOnly", "writeOnly", NULL};

/* the JSON pointer ref ("#", "#/a/b") inside the document, or NULL */
static json_t *resolve(json_t *doc, const char *ref, char *path, size_t pathlen) {
    if (ref[0] != '#') return NULL;
    json_t *v = doc;
    const char *p = ref + 1;
    size_t pl = 0;
    path[0] = '\0';
    while (*p == '/') {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof seg; p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else {
                seg[n++] = *p;
            }
        }
        seg[n] = '\0';
        if (*p && *p != '/') return NULL; /* a segment too long */
        if (json_is_object(v))
            v = json_object_get(v, seg);
        else if (json_is_array(v))
            v = json_array_get(v, (size_t)strtoul(seg, NULL, 10));
        else
            return NULL;
        if (!v) return NULL;
        int k = snprintf(path + pl, pathlen - pl, "%s%s", pl ? "." : "", seg);
        if (k > 0) pl += (size_t)k < pathlen - pl ? (size_t)k : pathlen - pl - 1;
    }
    return *p ? NULL : v;
}

static int32_t visit_ref(struct ctx *c, const char *ref) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ptr, ref)) return c->refs[i].rule;
    char tpath[512];
    json_t *t = resolve(c->doc, ref, tpath, sizeof tpath);
    if (!t) return bad(c, "'$ref' '%s' does not name a schema of this document (\"#/$defs/Name\")", ref);
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? 2 * c->cap_refs : 8;
        struct ref *p = realloc(c->refs, (size_t)cap * sizeof *p);
        if (!p) return bad(c, "out of memory");
        c->refs = p;
        c->cap_refs = cap;
    }
    /* the rule first, so a schema that refers to itself finds it */
    int32_t r = bt_grammar_add_rule(c->g);
    char *dup = strdup(ref);
    if (r < 0 || !dup) {
        free(dup);
        return r < 0 ? grammar_bad(c) : bad(c, "out of memory");
    }
    c->refs[c->n_refs++] = (struct ref){dup, r};
    /* errors inside name the target's path */
    char keep[sizeof c->path];
    size_t keep_len = c->plen;
    memcpy(keep, c->path, sizeof keep);
    snprintf(c->path, sizeof c->path, "%s", tpath);
    c->plen = strlen(c->path);
    int32_t body = visit(c, t);
    if (body < 0) return -1;
    memcpy(c->path, keep, sizeof keep);
    c->plen = keep_len;
    bt_grammar_add_alt(c->g, r);
    bt_grammar_add_ref(c->g, r, body);
    return r;
}

static int32_t visit_object(struct ctx *c, json_t *s) {
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        int k = 0;
        while (k_known[k] && strcmp(k_known[k], key)) k++;
        if (!k_known[k]) {
            path_push(c, "%s%s", c->plen ? "." : "", key);
            return bad(c, "the schema keyword '%s' is not supported", key);
        }
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return bad(c, "'$ref' must be a string");
        return visit_ref(c, json_string_value(ref));
    }
    if (json_object_get(s, "const")) return literal(c, json_object_get(s, "const"));
    if (json_object_get(s, "enum")) return alternatives(c, s, "enum", false);
    if (json_object_get(s, "anyOf")) return alternatives(c, s, "anyOf", true);
    if (json_object_get(s, "oneOf")) return alternatives(c, s, "oneOf", true);
    json_t *all = json_object_get(s, "allOf");
    if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1)
            return bad(c, "'allOf' is supported with one schema only");
        size_t keep = c->plen;
        path_push(c, "%sallOf", c->plen ? "." : "");
        int32_t r = visit_index(c, json_array_get(all, 0), 0);
        if (!c->failed) c->path[c->plen = keep] = '\0';
        return r;
    }
    json_t *type = json_object_get(s, "type");
    if (!type) { /* the type from the keywords present, else any value */
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties"))
            return typed(c, s, "object");
        if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) return typed(c, s, "array");
        if (json_object_get(s, "pattern") || json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
            format_pattern(json_object_get(s, "format")))
            return typed(c, s, "string");
        int32_t r = bt_json_value_rule(c->j);
        return r < 0 ? grammar_bad(c) : r;
    }
    if (json_is_string(type)) return typed(c, s, json_string_value(type));
    if (!json_is_array(type) || json_array_size(type) == 0)
        return bad(c, "'type' must be a type name or a non-empty array of them");
    int32_t r = bt_grammar_add_rule(c->g);
    if (r < 0) return grammar_bad(c);
    for (size_t i = 0; i < json_array_size(type); i++) {
        json_t *t = json_array_get(type, i);
        if (!json_is_string(t)) return bad(c, "'type[%zu]' is not a type name", i);
        int32_t x = typed(c, s, json_string_value(t));
        if (x < 0) return -1;
        bt_grammar_add_alt(c->g, r);
        bt_grammar_add_ref(c->g, r, x);
    }
    return r;
}

static int32_t visit(struct ctx *c, json_t *s) {
    if (c->failed) return -1;
    if (c->depth >= BT_JSON_SCHEMA_MAX_DEPTH) return bad(c, "schemas nested deeper than %d", BT_JSON_SCHEMA_MAX_DEPTH);
    if (++c->nodes > BT_JSON_SCHEMA_MAX_NODES) return bad(c, "more than %d schemas", BT_JSON_SCHEMA_MAX_NODES);
    if (json_is_true(s)) {
        int32_t r = bt_json_value_rule(c->j);
        return r < 0 ? grammar_bad(c) : r;
    }
    if (json_is_false(s)) return bad(c, "the schema 'false' allows no value");
    if (!json_is_object(s)) return bad(c, "a schema must be an object or a boolean");
    c->depth++;
    int32_t r = visit_object(c, s);
    c->depth--;
    return r;
}

int32_t bt_json_schema_compile(bt_json_rules *j, const char *schema, size_t len, char *where, size_t wherelen,
                               char *err, size_t errlen) {
    struct ctx c = {.j = j, .g = j->g, .where = where, .err = err, .wherelen = wherelen, .errlen = errlen};
    where[0] = '\0';
    json_error_t je;
    c.doc = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!c.doc) {
        snprintf(err, errlen, "the schema is not valid JSON: line %d, column %d: %s", je.line, je.column, je.text);
        return -1;
    }
    int32_t r = visit(&c, c.doc);
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ptr);
    free(c.refs);
    json_decref(c.doc);
    return r;
}
