/* json_pattern.c - regular expressions (a subset of ECMAScript's) compiled
 * by recursive descent into grammar rules over JSON-encoded characters
 * (json_pattern.h).
 *
 *   alt  ::= seq ("|" seq)*        each seq of the top level: "^"? ... "$"?
 *   seq  ::= (atom quantifier?)*
 *   atom ::= char | escape | "." | class | "(" ("?:")? alt ")"
 *
 * A character, an escape, "." and a class are all a set of code points
 * (ranges), written as one rule: the printable ASCII members as one byte
 * class, the members that JSON escapes after one "\" byte, the others as
 * UTF-8 byte ranges (a code point range split where its encoding changes
 * length and where a lower byte wraps, as regex engines build UTF-8
 * automata). */
#include "json_pattern.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h" /* BT_JSON_SCHEMA_MAX_COUNT, BT_JSON_SCHEMA_MAX_DEPTH */

#define MAX_RANGES 128 /* code point ranges of one class */
#define MAX_CP 0x10FFFFu

typedef struct {
    uint32_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n;
} cp_set;

struct pat {
    bt_grammar *g;
    const char *s;
    size_t n, i;
    int32_t any_star; /* any_char*, made when first needed (-1) */
    int32_t any_char;
    int depth;
    char *err;
    size_t errlen, *at;
    bool failed;
};

/* what a parse step gives: its rule and whether it may match nothing */
struct piece {
    int32_t rule;
    bool nullable;
};

static const struct piece k_fail = {-1, false};

static struct piece fail_at(struct pat *p, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static struct piece fail_at(struct pat *p, size_t at, const char *fmt, ...) {
    if (p->failed) return k_fail;
    p->failed = true;
    *p->at = at;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, p->errlen, fmt, ap);
    va_end(ap);
    return k_fail;
}

/* the grammar passed a bound: err stays "" (the caller reads bt_grammar_error) */
static struct piece grammar_fail(struct pat *p) {
    p->failed = true;
    return k_fail;
}

/* ---- code point sets ---- */

static bool set_add(struct pat *p, cp_set *s, uint32_t lo, uint32_t hi) {
    if (s->n == MAX_RANGES) {
        fail_at(p, p->i, "a character class of more than %d ranges", MAX_RANGES);
        return false;
    }
    s->lo[s->n] = lo;
    s->hi[s->n++] = hi;
    return true;
}

/* sorted by lo, overlapping and adjacent ranges merged */
static void set_normalize(cp_set *s) {
    for (int a = 1; a < s->n; a++)
        for (int b = a; b > 0 && s->lo[b - 1] > s->lo[b]; b--) {
            uint32_t l = s->lo[b], h = s->hi[b];
            s->lo[b] = s->lo[b - 1], s->hi[b] = s->hi[b - 1];
            s->lo[b - 1] = l, s->hi[b - 1] = h;
        }
    int m = 0;
    for (int k = 0; k < s->n; k++) {
        if (m && s->lo[k] <= s->hi[m - 1] + 1) {
            if (s->hi[k] > s->hi[m - 1]) s->hi[m - 1] = s->hi[k];
        } else {
            s->lo[m] = s->lo[k], s->hi[m++] = s->hi[k];
        }
    }
    s->n = m;
}

/* every code point not in s (s normalized; the result has at most n + 1 ranges) */
static bool set_negate(struct pat *p, cp_set *s) {
    cp_set t = {.n = 0};
    uint32_t next = 0;
    for (int k = 0; k < s->n; k++) {
        if (s->lo[k] > next && !set_add(p, &t, next, s->lo[k] - 1)) return false;
        next = s->hi[k] + 1;
    }
    if (next <= MAX_CP && !set_add(p, &t, next, MAX_CP)) return false;
    *s = t;
    return true;
}

static bool set_has(const cp_set *s, uint32_t c) {
    for (int k = 0; k < s->n; k++)
        if (s->lo[k] <= c && c <= s->hi[k]) return true;
    return false;
}

/* ---- a set as a rule ---- */

static int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

static void utf8_encode(uint32_t c, uint8_t *b) {
    int n = utf8_len(c);
    static const uint8_t lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    for (int k = n - 1; k > 0; k--, c >>= 6) b[k] = (uint8_t)(0x80 | (c & 0x3F));
    b[0] = (uint8_t)(lead[n] | c);
}

/* alternatives of r for lo..hi, whose code points encode to the same length */
static void utf8_ranges(bt_grammar *g, int32_t r, uint32_t lo, uint32_t hi) {
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) == (hi & ~m)) continue;
        if (lo & m) {
            utf8_ranges(g, r, lo, lo | m);
            utf8_ranges(g, r, (lo | m) + 1, hi);
            return;
        }
        if ((hi & m) != m) {
            utf8_ranges(g, r, lo, (hi & ~m) - 1);
            utf8_ranges(g, r, hi & ~m, hi);
            return;
        }
    }
    uint8_t a[4], b[4];
    utf8_encode(lo, a);
    utf8_encode(hi, b);
    bt_grammar_add_alt(g, r);
    for (int k = 0; k < n; k++) bt_grammar_add_range(g, r, a[k], b[k]);
}

/* lo..hi (at least 0x80) without the surrogates, split where the encoding's length changes */
static void non_ascii(bt_grammar *g, int32_t r, uint32_t lo, uint32_t hi) {
    static const uint32_t cut[4][2] = {{0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, MAX_CP}};
    for (int k = 0; k < 4; k++) {
        uint32_t a = lo > cut[k][0] ? lo : cut[k][0], b = hi < cut[k][1] ? hi : cut[k][1];
        if (a <= b) utf8_ranges(g, r, a, b);
    }
}

/* an alternative of esc: what follows "\" in JSON for control character
 * or quote c (u00xx with the hex letters in either case) */
static void json_escape(bt_grammar *g, int32_t esc, uint32_t c) {
    static const char *const short_esc = "\"\"\\\\\bb\ff\nn\rr\tt";
    bt_grammar_add_alt(g, esc);
    for (const char *e = short_esc; *e; e += 2)
        if ((uint32_t)(uint8_t)e[0] == c) {
            bt_grammar_add_lit(g, esc, e + 1, 1);
            return;
        }
    static const char hex[] = "0123456789abcdef";
    bt_grammar_add_lit(g, esc, "u00", 3);
    for (int k = 1; k >= 0; k--) {
        uint8_t d = (uint8_t)hex[(c >> (4 * k)) & 15], lo[2] = {d, (uint8_t)(d & ~0x20)};
        bt_grammar_add_class(g, esc, lo, lo, d > '9' ? 2 : 1, false);
    }
}

/* one JSON-encoded character of s */
static struct piece set_rule(struct pat *p, const cp_set *s) {
    bt_grammar *g = p->g;
    int32_t r = bt_grammar_add_rule(g), esc = -1;
    if (r < 0) return grammar_fail(p);
    uint8_t lo[64], hi[64];
    int n = 0;
    for (uint32_t c = 0x20; c < 0x80; c++) { /* printable ASCII but '"' and '\' */
        if (c == '"' || c == '\\' || !set_has(s, c)) continue;
        if (n && hi[n - 1] == c - 1)
            hi[n - 1] = (uint8_t)c;
        else
            lo[n] = hi[n] = (uint8_t)c, n++;
    }
    if (n) {
        bt_grammar_add_alt(g, r);
        bt_grammar_add_class(g, r, lo, hi, n, false);
    }
    for (uint32_t c = 0; c < 0x5D; c = c == 0x1F ? '"' : c == '"' ? '\\' : c + 1) {
        if (!set_has(s, c)) continue;
        if (esc < 0 && (esc = bt_grammar_add_rule(g)) < 0) return grammar_fail(p);
        json_escape(g, esc, c);
    }
    if (esc >= 0) {
        bt_grammar_add_alt(g, r);
        bt_grammar_add_lit(g, r, "\\", 1);
        bt_grammar_add_ref(g, r, esc);
    }
    for (int k = 0; k < s->n; k++)
        if (s->hi[k] >= 0x80) non_ascii(g, r, s->lo[k] < 0x80 ? 0x80 : s->lo[k], s->hi[k]);
    if (!n && esc < 0 && !(s->n && s->hi[s->n - 1] >= 0x80)) return fail_at(p, p->i, "a class that matches nothing");
    return bt_grammar_error(g)[0] ? grammar_fail(p) : (struct piece){r, false};
}

/* ---- parsing ---- */

static bool at_end(const struct pat *p) { return p->i >= p->n; }

/* the UTF-8 character at p->i (jansson has checked the encoding), moved past */
static uint32_t next_cp(struct pat *p) {
    const uint8_t *b = (const uint8_t *)p->s + p->i;
    int n = b[0] < 0x80 ? 1 : b[0] < 0xE0 ? 2 : b[0] < 0xF0 ? 3 : 4;
    if (p->i + (size_t)n > p->n) n = 1;
    uint32_t c = n == 1 ? b[0] : (uint32_t)(b[0] & (0x7F >> n));
    for (int k = 1; k < n; k++) c = c << 6 | (b[k] & 0x3F);
    p->i += (size_t)n;
    return c;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* k hex digits at p->i, moved past; -1 when they are not there */
static long hex_at(struct pat *p, int k) {
    long v = 0;
    for (int q = 0; q < k; q++) {
        int d = p->i + (size_t)q < p->n ? hex_digit(p->s[p->i + (size_t)q]) : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    p->i += (size_t)k;
    return v;
}

/* \uHHHH, and a low surrogate's \uHHHH after a high one: one code point */
static bool unicode_escape(struct pat *p, size_t at, uint32_t *c) {
    long v = hex_at(p, 4);
    if (v < 0) return (void)fail_at(p, at, "'\\u' needs 4 hex digits"), false;
    if (v >= 0xD800 && v <= 0xDBFF && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
        size_t keep = p->i;
        p->i += 2;
        long w = hex_at(p, 4);
        if (w >= 0xDC00 && w <= 0xDFFF) {
            *c = 0x10000 + (((uint32_t)v - 0xD800) << 10) + ((uint32_t)w - 0xDC00);
            return true;
        }
        p->i = keep;
    }
    if (v >= 0xD800 && v <= 0xDFFF) return (void)fail_at(p, at, "a lone surrogate '\\u%04lX'", v), false;
    *c = (uint32_t)v;
    return true;
}

/* \d \w \s and their negations into s; false when e is none of them */
static bool class_escape(struct pat *p, char e, cp_set *s, bool *ok) {
    static const uint32_t digit[] = {'0', '9'}, word[] = {'0', '9', 'A', 'Z', '_', '_', 'a', 'z'};
    static const uint32_t space[] = {'\t', '\r', ' ', ' ', 0xA0, 0xA0, 0x1680, 0x1680, 0x2000, 0x200A, 0x2028,
                                     0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};
    const uint32_t *r;
    int n;
    switch (e | 0x20) {
    case 'd': r = digit, n = 1; break;
    case 'w': r = word, n = 4; break;
    case 's': r = space, n = 10; break;
    default: return false;
    }
    cp_set t = {.n = 0};
    *ok = true;
    for (int k = 0; k < n && *ok; k++) *ok = set_add(p, &t, r[2 * k], r[2 * k + 1]);
    set_normalize(&t);
    if (*ok && e < 'a') *ok = set_negate(p, &t);
    for (int k = 0; k < t.n && *ok; k++) *ok = set_add(p, s, t.lo[k], t.hi[k]);
    return true;
}

/* The escape after a "\" at p->i - 1 into s; *single: one character, *c.
 * in_class: inside [...], where \b is a backspace. */
static bool escape(struct pat *p, cp_set *s, bool in_class, bool *single, uint32_t *c) {
    size_t at = p->i - 1;
    if (at_end(p)) return (void)fail_at(p, at, "a '\\' ends the pattern"), false;
    char e = p->s[p->i];
    bool ok;
    *single = false;
    p->i++;
    if (class_escape(p, e, s, &ok)) return ok;
    *single = true;
    static const char *const simple = "t\tn\nr\rf\fv\v";
    for (const char *q = simple; *q; q += 2)
        if (e == q[0]) return *c = (uint8_t)q[1], set_add(p, s, *c, *c);
    if (e == 'b' && in_class) return *c = '\b', set_add(p, s, *c, *c);
    if (e == '0' && (at_end(p) || p->s[p->i] < '0' || p->s[p->i] > '9')) return *c = 0, set_add(p, s, 0, 0);
    if (e == 'x') {
        long v = hex_at(p, 2);
        if (v < 0) return (void)fail_at(p, at, "'\\x' needs 2 hex digits"), false;
        return *c = (uint32_t)v, set_add(p, s, *c, *c);
    }
    if (e == 'u') return unicode_escape(p, at, c) && set_add(p, s, *c, *c);
    if (e == 'b' || e == 'B') return (void)fail_at(p, at, "'\\%c' (a word boundary) is not supported", e), false;
    if ((e >= '0' && e <= '9') || e == 'k')
        return (void)fail_at(p, at, "'\\%c' (a backreference) is not supported", e), false;
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
        return (void)fail_at(p, at, "the escape '\\%c' is not supported", e), false;
    p->i--;
    *c = next_cp(p); /* escaped punctuation (or any other character): itself */
    return set_add(p, s, *c, *c);
}

/* one member of a class at p->i into s; *single and *c as escape() */
static bool class_member(struct pat *p, cp_set *s, bool *single, uint32_t *c) {
    if (p->s[p->i] == '\\') {
        p->i++;
        return escape(p, s, true, single, c);
    }
    *single = true;
    *c = next_cp(p);
    return set_add(p, s, *c, *c);
}

/* [...] from the "[" at p->i */
static struct piece char_class(struct pat *p) {
    size_t open = p->i++;
    cp_set s = {.n = 0};
    bool negate = !at_end(p) && p->s[p->i] == '^';
    p->i += negate;
    if (!at_end(p) && p->s[p->i] == ']' && !negate) return fail_at(p, open, "'[]' matches no character");
    while (!at_end(p) && p->s[p->i] != ']') {
        size_t at = p->i;
        bool single, single_hi;
        uint32_t lo = 0, hi = 0;
        if (!class_member(p, &s, &single, &lo)) return k_fail;
        if (p->i + 1 >= p->n || p->s[p->i] != '-' || p->s[p->i + 1] == ']') continue;
        p->i++; /* a range lo-hi: lo is in s already */
        if (!class_member(p, &s, &single_hi, &hi)) return k_fail;
        if (!single || !single_hi) return fail_at(p, at, "a range with a class escape (\\d, \\w, \\s) as an end");
        if (lo > hi) return fail_at(p, at, "the range's start is after its end");
        if (!set_add(p, &s, lo, hi)) return k_fail;
    }
    if (at_end(p)) return fail_at(p, open, "'[' is not closed");
    p->i++;
    set_normalize(&s);
    if (negate && !set_negate(p, &s)) return k_fail;
    return set_rule(p, &s);
}

static struct piece alternation(struct pat *p, bool top);

/* (...) from the "(" at p->i */
static struct piece group(struct pat *p) {
    size_t open = p->i++;
    if (!at_end(p) && p->s[p->i] == '?') {
        if (p->i + 1 < p->n && p->s[p->i + 1] == ':')
            p->i += 2;
        else
            return fail_at(p, open, "a group '(?' other than '(?:' (a lookaround, a named group) is not supported");
    }
    if (p->depth >= BT_JSON_SCHEMA_MAX_DEPTH)
        return fail_at(p, open, "groups nested deeper than %d", BT_JSON_SCHEMA_MAX_DEPTH);
    p->depth++;
    struct piece r = alternation(p, false);
    p->depth--;
    if (r.rule < 0) return k_fail;
    if (at_end(p)) return fail_at(p, open, "'(' is not closed");
    p->i++;
    return r;
}

/* a decimal count at p->i (moved past); -1 when there is none */
static int64_t count_at(struct pat *p) {
    int64_t v = -1;
    while (!at_end(p) && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (p->s[p->i++] - '0');
        if (v > 1000000000) v = 1000000000;
    }
    return v;
}

/* {m}, {m,}, {m,n} at p->i into *min, *max (-1: no bound); false (p->i kept) when it is not one */
static bool braces(struct pat *p, int64_t *min, int64_t *max) {
    size_t keep = p->i++;
    *min = count_at(p);
    *max = *min;
    if (!at_end(p) && p->s[p->i] == ',') {
        p->i++;
        *max = count_at(p);
    }
    if (*min < 0 || at_end(p) || p->s[p->i] != '}') {
        p->i = keep;
        return false;
    }
    p->i++;
    return true;
}

static struct piece atom(struct pat *p) {
    char ch = p->s[p->i];
    if (ch == '(') return group(p);
    if (ch == '[') return char_class(p);
    cp_set s = {.n = 0};
    int64_t min, max;
    size_t at = p->i;
    if (ch == '*' || ch == '+' || ch == '?' || (ch == '{' && braces(p, &min, &max)))
        return fail_at(p, at, "'%c' has nothing to repeat", ch);
    if (ch == '.') { /* anything but a line terminator */
        static const uint32_t nl[] = {'\n', '\n', '\r', '\r', 0x2028, 0x2029};
        for (int k = 0; k < 3; k++) set_add(p, &s, nl[2 * k], nl[2 * k + 1]);
        set_negate(p, &s);
        p->i++;
        return set_rule(p, &s);
    }
    bool single;
    uint32_t c;
    if (ch == '\\') {
        p->i++;
        if (!escape(p, &s, false, &single, &c)) return k_fail;
    } else {
        c = next_cp(p);
        set_add(p, &s, c, c);
    }
    set_normalize(&s);
    return set_rule(p, &s);
}

/* the quantifier after item, if any */
static struct piece quantified(struct pat *p, struct piece item) {
    if (at_end(p)) return item;
    size_t at = p->i;
    char q = p->s[p->i];
    int64_t min, max;
    if (q == '*' || q == '+' || q == '?') {
        min = q == '+', max = q == '?' ? 1 : -1;
        p->i++;
    } else if (q != '{' || !braces(p, &min, &max)) {
        return item;
    }
    if (!at_end(p) && p->s[p->i] == '?') p->i++; /* lazy: the same strings */
    if (max >= 0 && max < min) return fail_at(p, at, "the count's maximum %lld is below its minimum %lld", (long long)max, (long long)min);
    if ((max < 0 ? min : max) > BT_JSON_SCHEMA_MAX_COUNT)
        return fail_at(p, at, "a count past %d", BT_JSON_SCHEMA_MAX_COUNT);
    if (max < 0 && item.nullable)
        return fail_at(p, at, "an unbounded repetition of what may be empty (as '(a*)*') is not supported");
    int32_t r = bt_grammar_repeat(p->g, item.rule, min, max);
    return r < 0 ? grammar_fail(p) : (struct piece){r, min == 0 || item.nullable};
}

/* a sequence up to "|", ")" or the end; top: "^" may open it and "$" close it */
static struct piece sequence(struct pat *p, bool top) {
    bool start = top && !at_end(p) && p->s[p->i] == '^', end = false;
    p->i += start;
    int32_t *items = NULL;
    size_t n = 0, cap = 0;
    struct piece r = {-1, true};
    while (!at_end(p) && p->s[p->i] != '|' && p->s[p->i] != ')') {
        char ch = p->s[p->i];
        if (ch == '$' && top && (p->i + 1 == p->n || p->s[p->i + 1] == '|')) {
            end = true;
            p->i++;
            break;
        }
        if (ch == '^' || ch == '$') {
            r = fail_at(p, p->i, "'%c' is supported only at the start ('^') or end ('$') of the pattern or of a top-level alternative", ch);
            goto out;
        }
        struct piece a = atom(p);
        if (a.rule >= 0) a = quantified(p, a);
        if (a.rule < 0) goto out;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 16;
            int32_t *t = realloc(items, c * sizeof *t);
            if (!t) {
                r = fail_at(p, p->i, "out of memory");
                goto out;
            }
            items = t, cap = c;
        }
        items[n++] = a.rule;
        r.nullable = r.nullable && a.nullable;
    }
    if (top && (!start || !end) && p->any_star < 0 && (p->any_star = bt_grammar_repeat(p->g, p->any_char, 0, -1)) < 0) {
        r = grammar_fail(p);
        goto out;
    }
    if ((r.rule = bt_grammar_add_rule(p->g)) < 0) {
        r = grammar_fail(p);
        goto out;
    }
    bt_grammar_add_alt(p->g, r.rule);
    if (top && !start) bt_grammar_add_ref(p->g, r.rule, p->any_star);
    for (size_t k = 0; k < n; k++) bt_grammar_add_ref(p->g, r.rule, items[k]);
    if (top && !end) bt_grammar_add_ref(p->g, r.rule, p->any_star);
out:
    free(items);
    return r;
}

static struct piece alternation(struct pat *p, bool top) {
    int32_t r = bt_grammar_add_rule(p->g);
    if (r < 0) return grammar_fail(p);
    bool nullable = false;
    for (;;) {
        struct piece s = sequence(p, top);
        if (s.rule < 0) return k_fail;
        nullable = nullable || s.nullable;
        bt_grammar_add_alt(p->g, r);
        bt_grammar_add_ref(p->g, r, s.rule);
        if (at_end(p) || p->s[p->i] != '|') break;
        p->i++;
    }
    return (struct piece){r, nullable};
}

int32_t bt_json_pattern_rule(bt_grammar *g, int32_t any_char, const char *pattern, size_t len, size_t *at, char *err,
                             size_t errlen) {
    struct pat p = {.g = g, .s = pattern, .n = len, .any_star = -1, .any_char = any_char, .err = err,
                    .errlen = errlen, .at = at};
    err[0] = '\0';
    *at = 0;
    struct piece r = alternation(&p, true);
    if (r.rule >= 0 && !at_end(&p)) r = fail_at(&p, p.i, "')' without its '('");
    if (r.rule >= 0 && bt_grammar_error(g)[0]) r = grammar_fail(&p);
    return r.rule;
}
