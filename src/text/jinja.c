/* jinja.c - a Jinja interpreter for chat templates (see jinja.h): a lexer
 * that applies jinja2's whitespace rules as transformers configures them, a
 * recursive-descent parser to a tree, and a tree walker over Python-like
 * values.
 *
 * Differences from jinja2, on purpose:
 *  - values are Python's as JSON gives them (None, bool, int, float, str,
 *    list, dict) plus tuples, namespaces, macros and bound methods; ints are
 *    64-bit (an overflow is an error, not a big number);
 *  - upper, lower, title, capitalize and the is-tests on case change ASCII
 *    letters only; length, indexing and slicing count code points as Python;
 *  - the sandbox is the immutable one: a method that changes a list or a dict
 *    (append, pop, update, ...) is an error when called, as jinja2's
 *    SecurityError;
 *  - what chat templates do not use is refused with its line and column: at
 *    parse time the statements include, extends, import, block, call, raw,
 *    with, recursive loops, *args and **kwargs; when run, the filters jinja2
 *    has that are not in k_filters (batch, format, groupby, ...), str.format
 *    with format specs, printf-style %, the globals lipsum, cycler and
 *    joiner, and a macro's caller, varargs and kwargs (they read
 *    as undefined);
 *  - an unknown filter or test is refused as jinja2 3.1 refuses it: when the
 *    template is compiled, unless it sits directly in an if or an inline if,
 *    where it fails only when run.
 *
 * Memory: everything a parse or a render makes lives in one arena freed at
 * the end, so an error anywhere is a longjmp to the entry point, which frees
 * the arena and returns the message. */
#define _POSIX_C_SOURCE 200809L /* localtime_r */
#include "jinja.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef BT_JINJA_MAX_NEST
#define BT_JINJA_MAX_NEST 256 /* nesting of expressions and statements in the parser */
#endif
#ifndef BT_JINJA_MAX_DEPTH
#define BT_JINJA_MAX_DEPTH 2000 /* nested evaluations (expressions, statements, macro calls) in a render */
#endif
#ifndef BT_JINJA_MAX_JSON_DEPTH
#define BT_JINJA_MAX_JSON_DEPTH 256
#endif

/* ---- arena and errors ---- */

typedef struct chunk {
    struct chunk *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
} chunk;

typedef struct fail {
    jmp_buf jb;
    enum bt_status st;
    char *err;
    size_t errlen;
    const char *src; /* for LINE:COLUMN */
    chunk *head;
    size_t bytes, limit;
} fail;

static void fail_at(fail *f, enum bt_status st, size_t off, const char *fmt, ...) {
    size_t o = 0;
    if (f->src && off != (size_t)-1 && f->errlen) {
        int line = 1, col = 1;
        for (size_t i = 0; i < off && f->src[i]; i++) {
            if (f->src[i] == '\n') line++, col = 1;
            else if (((unsigned char)f->src[i] & 0xc0) != 0x80) col++;
        }
        int k = snprintf(f->err, f->errlen, "%d:%d: ", line, col);
        o = k < 0 ? 0 : (size_t)k < f->errlen ? (size_t)k : f->errlen - 1;
    }
    if (f->errlen > o) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->err + o, f->errlen - o, fmt, ap);
        va_end(ap);
    }
    f->st = st;
    longjmp(f->jb, 1);
}

static void *falloc(fail *f, size_t n) {
    if (n > f->limit) fail_at(f, BT_ERR_NOMEM, (size_t)-1, "the template used more than %zu MiB", f->limit >> 20);
    n = (n + 15) & ~(size_t)15;
    if (!f->head || f->head->cap - f->head->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (f->bytes + cap > f->limit) fail_at(f, BT_ERR_NOMEM, (size_t)-1, "the template used more than %zu MiB", f->limit >> 20);
        chunk *c = malloc(sizeof *c + cap);
        if (!c) fail_at(f, BT_ERR_NOMEM, (size_t)-1, "out of memory");
        c->next = f->head, c->cap = cap, c->used = 0;
        f->head = c;
        f->bytes += cap;
    }
    void *p = f->head->data + f->head->used;
    f->head->used += n;
    return p;
}

static void arena_free(chunk *c) {
    while (c) {
        chunk *n = c->next;
        free(c);
        c = n;
    }
}

/* ---- values ---- */

enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC };

typedef struct jstr {
    size_t n;
    char p[];
} jstr;

typedef struct value {
    int t;
    int safe; /* V_STR: jinja2's Markup (safe, escape): what + joins to it is HTML-escaped */
    union {
        int64_t i; /* V_BOOL, V_INT */
        double f;
        jstr *s;
        struct jlist *l;
        struct jdict *d; /* V_DICT, V_NS */
        struct jfunc *fn;
        const char *u; /* V_UNDEF: why ("'x' is undefined"), NULL: a plain undefined */
    };
} value;

typedef struct jlist {
    size_t n, cap;
    value *v;
    int tuple;
    /* NULL: a list.  Else what jinja2 gives lazily, by its Python type:
     * "generator" (select, map, ...: no len, truthy, read once),
     * "list_reverseiterator" (the same), "dict_items", "dict_keys",
     * "dict_values" (views: a len, read again).  None is subscriptable or
     * JSON serializable. */
    const char *gen;
    int used; /* a generator already read */
} jlist;

typedef struct jdict {
    size_t n, cap;
    value *k, *v;
} jdict;

static const value k_undef = {.t = V_UNDEF};
static const value k_none = {.t = V_NONE};

static value mk_bool(int b) { return (value){.t = V_BOOL, .i = !!b}; }
static value mk_int(int64_t i) { return (value){.t = V_INT, .i = i}; }
static value mk_float(double f) { return (value){.t = V_FLOAT, .f = f}; }

static jstr *str_new(fail *f, const char *p, size_t n) {
    jstr *s = falloc(f, sizeof *s + n + 1);
    s->n = n;
    if (n) memcpy(s->p, p, n);
    s->p[n] = 0;
    return s;
}
static value mk_str(fail *f, const char *p, size_t n) { return (value){.t = V_STR, .s = str_new(f, p, n)}; }
static value mk_cstr(fail *f, const char *p) { return mk_str(f, p, strlen(p)); }

static jlist *list_new(fail *f, size_t cap) {
    jlist *l = falloc(f, sizeof *l);
    l->n = 0, l->cap = cap, l->tuple = 0, l->gen = NULL, l->used = 0;
    l->v = cap ? falloc(f, cap * sizeof *l->v) : NULL;
    return l;
}
static void list_push(fail *f, jlist *l, value v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        value *nv = falloc(f, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv, l->cap = cap;
    }
    l->v[l->n++] = v;
}
static value mk_list(jlist *l) { return (value){.t = V_LIST, .l = l}; }
static value mk_gen(jlist *l, const char *kind) {
    l->gen = kind;
    return mk_list(l);
}
static int is_view(const jlist *l) { return l->gen && !strncmp(l->gen, "dict_", 5); }
static int is_iter(const jlist *l) { return l->gen && !is_view(l); }

static jdict *dict_new(fail *f) {
    jdict *d = falloc(f, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

/* ---- a string builder in the arena (a grown copy leaves the old one behind:
 * at most twice the final size) ---- */

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_put(fail *f, sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 4) fail_at(f, BT_ERR_NOMEM, (size_t)-1, "out of memory");
            cap *= 2;
        }
        char *p = falloc(f, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_puts(fail *f, sb *b, const char *s) { sb_put(f, b, s, strlen(s)); }
static void sb_printf(fail *f, sb *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sb_put(f, b, tmp, k < 0 ? 0 : (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}
static value sb_value(fail *f, sb *b) { return mk_str(f, b->p ? b->p : "", b->n); }

/* ---- UTF-8: Python counts code points ---- */

static size_t u8_len(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xc0) != 0x80;
    return k;
}
/* byte offset of code point i (i <= count) */
static size_t u8_off(const char *p, size_t n, size_t i) {
    size_t o = 0;
    while (o < n && i) {
        o++;
        while (o < n && ((unsigned char)p[o] & 0xc0) == 0x80) o++;
        i--;
    }
    return o;
}
static void u8_put(fail *f, sb *b, uint32_t c) {
    char t[4];
    size_t n;
    if (c < 0x80) t[0] = (char)c, n = 1;
    else if (c < 0x800) t[0] = (char)(0xc0 | c >> 6), t[1] = (char)(0x80 | (c & 63)), n = 2;
    else if (c < 0x10000) t[0] = (char)(0xe0 | c >> 12), t[1] = (char)(0x80 | (c >> 6 & 63)), t[2] = (char)(0x80 | (c & 63)), n = 3;
    else t[0] = (char)(0xf0 | c >> 18), t[1] = (char)(0x80 | (c >> 12 & 63)), t[2] = (char)(0x80 | (c >> 6 & 63)),
    t[3] = (char)(0x80 | (c & 63)), n = 4;
    sb_put(f, b, t, n);
}
/* decode one code point at p[*i], advancing *i; a bad byte is itself */
static uint32_t u8_next(const char *p, size_t n, size_t *i) {
    unsigned char c = (unsigned char)p[*i];
    size_t k = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    if (*i + k >= n + (k ? 0 : 1) || c >= 0xf8 || (c >= 0x80 && c < 0xc0)) {
        (*i)++;
        return c;
    }
    uint32_t v = k == 0 ? c : k == 1 ? c & 0x1f : k == 2 ? c & 0x0f : c & 0x07;
    for (size_t j = 1; j <= k; j++) v = v << 6 | ((unsigned char)p[*i + j] & 0x3f);
    *i += k + 1;
    return v;
}

/* Python's str.isspace for the characters chat templates meet */
static int py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

/* ---- the tree ---- */

enum nk {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_BODY,
    /* expressions */
    E_LIT, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NEG, E_POS,
    E_NOT, E_AND, E_OR, E_COND, E_CMP, E_CONCAT, E_BLOCKVAL, E_NSREF,
};

enum op { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node node;
typedef struct nlist {
    node **v;
    size_t n, cap;
} nlist;

struct node {
    int k, flag;
    size_t off; /* where it starts in the source */
    node *a, *b, *c;
    nlist x, y;        /* body / else; call args / macro defaults; list items / dict keys (x) and values (y) */
    const char *s;     /* name, attribute, filter or test */
    const char **kw;   /* parallel to x: a keyword argument's or a macro parameter's name, or NULL */
    int *ops;          /* E_CMP: the operator before each of x */
    value lit;
};

struct bt_jinja {
    fail mem;      /* the arena that holds the tree */
    char *src;     /* the source with newlines made \n and one trailing newline dropped, as jinja2 */
    size_t n;
    nlist body;
};

/* ---- lexer: jinja2's, with trim_blocks and lstrip_blocks ---- */

enum tt { T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_INT, T_FLOAT, T_STR, T_OP, T_EOF };

typedef struct tok {
    int t;
    size_t off, n; /* the token's text (T_DATA: the kept text) */
    value v;       /* T_INT, T_FLOAT, T_STR, T_DATA */
} tok;

typedef struct lexer {
    fail *f;
    const char *s;
    size_t n;
    tok *t;
    size_t nt, cap;
} lexer;

static void emit(lexer *L, int t, size_t off, size_t n, value v) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 256;
        tok *nt = falloc(L->f, cap * sizeof *nt);
        if (L->nt) memcpy(nt, L->t, L->nt * sizeof *nt);
        L->t = nt, L->cap = cap;
    }
    L->t[L->nt++] = (tok){t, off, n, v};
}

static int starts(const lexer *L, size_t i, const char *w) {
    size_t k = strlen(w);
    return i + k <= L->n && !memcmp(L->s + i, w, k);
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* a string literal at i (the quote), with Python's unicode-escape rules */
static size_t lex_string(lexer *L, size_t i) {
    char q = L->s[i];
    size_t j = i + 1;
    sb b = {0};
    sb_put(L->f, &b, "", 0);
    for (;;) {
        if (j >= L->n) fail_at(L->f, BT_ERR_INVALID, i, "unterminated string");
        char c = L->s[j];
        if (c == q) break;
        if (c != '\\') {
            sb_put(L->f, &b, &c, 1), j++;
            continue;
        }
        if (j + 1 >= L->n) fail_at(L->f, BT_ERR_INVALID, i, "unterminated string");
        char e = L->s[j + 1];
        j += 2;
        const char *simple = NULL;
        switch (e) {
        case '\n': simple = ""; break;
        case '\\': simple = "\\"; break;
        case '\'': simple = "'"; break;
        case '"': simple = "\""; break;
        case 'a': simple = "\a"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'n': simple = "\n"; break;
        case 'r': simple = "\r"; break;
        case 't': simple = "\t"; break;
        case 'v': simple = "\v"; break;
        }
        if (simple) {
            sb_puts(L->f, &b, simple);
            continue;
        }
        if (e >= '0' && e <= '7') {
            uint32_t v = (uint32_t)(e - '0');
            for (int k = 0; k < 2 && j < L->n && L->s[j] >= '0' && L->s[j] <= '7'; k++) v = v * 8 + (uint32_t)(L->s[j++] - '0');
            u8_put(L->f, &b, v);
            continue;
        }
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                int h = j < L->n ? hexval(L->s[j]) : -1;
                if (h < 0) fail_at(L->f, BT_ERR_INVALID, j, "truncated \\%c escape in a string", e);
                v = v * 16 + (uint32_t)h, j++;
            }
            if (v > 0x10ffff) fail_at(L->f, BT_ERR_INVALID, j, "illegal Unicode character in a string");
            u8_put(L->f, &b, v);
            continue;
        }
        if (e == 'N') fail_at(L->f, BT_ERR_INVALID, j - 2, "\\N{...} escapes are not supported");
        sb_put(L->f, &b, "\\", 1), sb_put(L->f, &b, &e, 1); /* Python keeps an unknown escape */
    }
    emit(L, T_STR, i, j + 1 - i, sb_value(L->f, &b));
    return j + 1;
}

static size_t lex_number(lexer *L, size_t i) {
    const char *s = L->s;
    size_t j = i;
    int is_float = 0;
#define DIGITS(k) while (k < L->n && ((s[k] >= '0' && s[k] <= '9') || (s[k] == '_' && k + 1 < L->n && s[k + 1] >= '0' && s[k + 1] <= '9'))) k++
    DIGITS(j);
    if (j + 1 < L->n && s[j] == '.' && s[j + 1] >= '0' && s[j + 1] <= '9') {
        j++;
        DIGITS(j);
        is_float = 1;
    }
    if (j < L->n && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < L->n && (s[k] == '+' || s[k] == '-')) k++;
        if (k < L->n && s[k] >= '0' && s[k] <= '9') {
            DIGITS(k);
            j = k, is_float = 1;
        }
    }
#undef DIGITS
    char buf[128];
    size_t m = 0;
    for (size_t k = i; k < j && m < sizeof buf - 1; k++)
        if (s[k] != '_') buf[m++] = s[k];
    buf[m] = 0;
    errno = 0;
    if (is_float) {
        emit(L, T_FLOAT, i, j - i, mk_float(strtod(buf, NULL)));
    } else {
        long long v = strtoll(buf, NULL, 10);
        if (errno == ERANGE) fail_at(L->f, BT_ERR_INVALID, i, "integer literal too large");
        emit(L, T_INT, i, j - i, mk_int(v));
    }
    return j;
}

static const char *const k_ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                    ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";", NULL};

/* the tokens of a {% %} or {{ }} tag opened at st, whose inside starts at
 * q; returns where the text after it starts; *ls: that text starts a line */
static size_t lex_tag(lexer *L, size_t st, size_t q, int kind, int *ls) {
    const char *s = L->s;
    int depth = 0;
    char open[BT_JINJA_MAX_NEST];
    for (;;) {
        if (q >= L->n) fail_at(L->f, BT_ERR_INVALID, st, "unexpected end of template: the tag is not closed");
        if (!depth) {
            size_t end = 0;
            if (kind == '%') {
                if (s[q] == '+' && starts(L, q + 1, "%}")) end = q + 3;
                else if (s[q] == '-' && starts(L, q + 1, "%}")) {
                    end = q + 3;
                    while (end < L->n && py_space((unsigned char)s[end])) end++;
                } else if (starts(L, q, "%}")) {
                    end = q + 2;
                    if (end < L->n && s[end] == '\n') end++; /* trim_blocks */
                }
            } else {
                if (s[q] == '-' && starts(L, q + 1, "}}")) {
                    end = q + 3;
                    while (end < L->n && py_space((unsigned char)s[end])) end++;
                } else if (starts(L, q, "}}")) end = q + 2;
            }
            if (end) {
                emit(L, kind == '%' ? T_BEND : T_VEND, q, end - q, k_undef);
                *ls = s[end - 1] == '\n';
                return end;
            }
        }
        unsigned char c = (unsigned char)s[q];
        if (py_space(c)) {
            q++;
        } else if (c == '\'' || c == '"') {
            q = lex_string(L, q);
        } else if (c >= '0' && c <= '9') {
            q = lex_number(L, q);
        } else if (c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z')) {
            size_t j = q;
            while (j < L->n && (s[j] == '_' || ((s[j] | 32) >= 'a' && (s[j] | 32) <= 'z') || (s[j] >= '0' && s[j] <= '9'))) j++;
            emit(L, T_NAME, q, j - q, k_undef);
            q = j;
        } else {
            const char *op = NULL;
            for (int k = 0; k_ops[k]; k++)
                if (starts(L, q, k_ops[k])) {
                    op = k_ops[k];
                    break;
                }
            if (!op) fail_at(L->f, BT_ERR_INVALID, q, "unexpected character '%c'", c);
            if (strchr("([{", op[0]) && op[1] == 0) {
                if (depth == BT_JINJA_MAX_NEST) fail_at(L->f, BT_ERR_INVALID, q, "brackets nested too deep");
                open[depth++] = op[0];
            } else if (strchr(")]}", op[0]) && op[1] == 0) {
                char want = op[0] == ')' ? '(' : op[0] == ']' ? '[' : '{';
                if (!depth || open[depth - 1] != want) fail_at(L->f, BT_ERR_INVALID, q, "unexpected '%c'", op[0]);
                depth--;
            }
            emit(L, T_OP, q, strlen(op), k_undef);
            q += strlen(op);
        }
    }
}

static void lex(lexer *L) {
    const char *s = L->s;
    size_t pos = 0;
    int ls = 1; /* the text at pos starts a line (lstrip_blocks strips before a tag there) */
    while (pos < L->n) {
        size_t st = pos;
        int kind = 0;
        for (; st + 1 < L->n; st++)
            if (s[st] == '{' && (s[st + 1] == '{' || s[st + 1] == '%' || s[st + 1] == '#')) {
                kind = s[st + 1];
                break;
            }
        if (!kind) {
            emit(L, T_DATA, pos, L->n - pos, mk_str(L->f, s + pos, L->n - pos));
            break;
        }
        size_t te = st;
        char sign = st + 2 < L->n && (s[st + 2] == '-' || s[st + 2] == '+') ? s[st + 2] : 0;
        if (sign == '-') {
            while (te > pos && py_space((unsigned char)s[te - 1])) te--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t lp = te;
            while (lp > pos && s[lp - 1] != '\n') lp--;
            if ((lp > pos || ls) && lp < te) {
                size_t k = lp;
                while (k < te && py_space((unsigned char)s[k])) k++;
                if (k == te) te = lp;
            }
        }
        if (te > pos) emit(L, T_DATA, pos, te - pos, mk_str(L->f, s + pos, te - pos));
        size_t q = st + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t end = 0;
            for (size_t i = q; i + 1 < L->n && !end; i++) {
                if ((s[i] == '+' || s[i] == '-') && starts(L, i + 1, "#}")) {
                    end = i + 3;
                    if (s[i] == '-')
                        while (end < L->n && py_space((unsigned char)s[end])) end++;
                } else if (starts(L, i, "#}")) {
                    end = i + 2;
                    if (end < L->n && s[end] == '\n') end++;
                }
            }
            if (!end) fail_at(L->f, BT_ERR_INVALID, st, "missing end of comment tag");
            ls = s[end - 1] == '\n';
            pos = end;
            continue;
        }
        emit(L, kind == '%' ? T_BBEGIN : T_VBEGIN, st, q - st, k_undef);
        pos = lex_tag(L, st, q, kind, &ls);
    }
    emit(L, T_EOF, L->n, 0, k_undef);
}

/* ---- parser ---- */

typedef struct parser {
    fail *f;
    const char *s;
    tok *t;
    size_t i, nt;
    int nest;
} parser;

static tok *cur(parser *P) { return &P->t[P->i]; }
static tok *peek(parser *P, size_t k) { return P->i + k < P->nt ? &P->t[P->i + k] : &P->t[P->nt - 1]; }
static int tok_is(parser *P, const tok *t, int type, const char *text) {
    return t->t == type && (!text || (t->n == strlen(text) && !memcmp(P->s + t->off, text, t->n)));
}
static int is_op(parser *P, const char *op) { return tok_is(P, cur(P), T_OP, op); }
static int is_name(parser *P, const char *w) { return tok_is(P, cur(P), T_NAME, w); }

static const char *tok_desc(parser *P, const tok *t, char *buf, size_t n) {
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_BEND: return "end of statement block";
    case T_VEND: return "end of print statement";
    case T_BBEGIN: return "begin of statement block";
    case T_VBEGIN: return "begin of print statement";
    case T_DATA: return "template data";
    case T_STR: return "string";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), P->s + t->off); return buf;
    }
}

static void perr(parser *P, const tok *t, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_at(P->f, BT_ERR_INVALID, t->off, "%s", msg);
}

static void unexpected(parser *P, const char *wanted) {
    char b[64];
    if (wanted) perr(P, cur(P), "expected %s, got %s", wanted, tok_desc(P, cur(P), b, sizeof b));
    perr(P, cur(P), "unexpected %s", tok_desc(P, cur(P), b, sizeof b));
}

static void expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
    P->i++;
}

static const char *expect_name(parser *P) {
    if (cur(P)->t != T_NAME) unexpected(P, "a name");
    tok *t = &P->t[P->i++];
    return str_new(P->f, P->s + t->off, t->n)->p;
}

static node *mk(parser *P, int k, size_t off) {
    node *n = falloc(P->f, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k, n->off = off;
    return n;
}

static void nl_push(fail *f, nlist *l, node *n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        node **v = falloc(f, cap * sizeof *v);
        if (l->n) memcpy(v, l->v, l->n * sizeof *v);
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = n;
}
/* x and its parallel kw names */
static void arg_push(parser *P, node *n, node *a, const char *kw) {
    size_t cap = n->x.cap;
    nl_push(P->f, &n->x, a);
    if (!n->kw || n->x.cap != cap) {
        const char **k = falloc(P->f, n->x.cap * sizeof *k);
        if (n->kw) memcpy(k, n->kw, (n->x.n - 1) * sizeof *k);
        n->kw = k;
    }
    n->kw[n->x.n - 1] = kw;
}

static const char *const k_filters[] = {
    "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "forceescape", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title",
    "tojson", "trim", "unique", "upper", "wordcount", NULL};
static const char *const k_jinja_filters_missing[] = {
    "batch", "filesizeformat", "format", "groupby", "pprint", "random", "slice", "striptags", "truncate", "urlencode",
    "urlize", "wordwrap", "xmlattr", NULL};
static const char *const k_jinja_tests_missing[] = {"filter", "test", NULL};
static const char *const k_tests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "float", "ge",
    ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt", "lessthan", "<", "mapping",
    "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper", NULL};

static int in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (!strcmp(*l, s)) return 1;
    return 0;
}

static node *parse_expr(parser *P);
static node *parse_or(parser *P);
static node *parse_unary(parser *P, int with_filter);
static node *parse_primary(parser *P);
static node *parse_postfix(parser *P, node *n);

static void enter(parser *P) {
    if (++P->nest > BT_JINJA_MAX_NEST) perr(P, cur(P), "nested too deep (more than %d levels)", BT_JINJA_MAX_NEST);
}

/* (args) after a callee, a filter or a test; n->x and n->kw receive them */
static void parse_call_args(parser *P, node *n) {
    expect_op(P, "(");
    int kw_seen = 0;
    while (!is_op(P, ")")) {
        if (n->x.n) {
            expect_op(P, ",");
            if (is_op(P, ")")) break;
        }
        if (is_op(P, "*") || is_op(P, "**")) perr(P, cur(P), "*args and **kwargs in calls are not supported");
        if (cur(P)->t == T_NAME && tok_is(P, peek(P, 1), T_OP, "=")) {
            const char *k = expect_name(P);
            P->i++;
            arg_push(P, n, parse_expr(P), k);
            kw_seen = 1;
        } else {
            if (kw_seen) perr(P, cur(P), "invalid syntax for function call expression");
            arg_push(P, n, parse_expr(P), NULL);
        }
    }
    P->i++;
}

static node *parse_tuple(parser *P, int with_condexpr, int explicit_parens, const char *extra_end) {
    size_t off = cur(P)->off;
    node *t = mk(P, E_TUPLE, off);
    int is_tuple = 0;
    for (;;) {
        if (t->x.n) expect_op(P, ",");
        tok *c = cur(P);
        if (c->t == T_VEND || c->t == T_BEND || tok_is(P, c, T_OP, ")") || (extra_end && tok_is(P, c, T_NAME, extra_end)))
            break;
        nl_push(P->f, &t->x, with_condexpr ? parse_expr(P) : parse_or(P));
        if (is_op(P, ",")) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (t->x.n) return t->x.v[0];
        if (!explicit_parens) unexpected(P, "an expression");
    }
    return t;
}

/* before an item of a [..] or {..} literal: the comma after the one before
 * (a trailing comma allowed); 0 at the closing bracket */
static int next_item(parser *P, const node *n, const char *close) {
    if (is_op(P, close)) return 0;
    if (n->x.n) {
        expect_op(P, ",");
        if (is_op(P, close)) return 0;
    }
    return 1;
}

static node *parse_primary(parser *P) {
    enter(P);
    tok *t = cur(P);
    node *n;
    if (t->t == T_NAME) {
        const char *w = expect_name(P);
        n = mk(P, E_LIT, t->off);
        if (!strcmp(w, "true") || !strcmp(w, "True")) n->lit = mk_bool(1);
        else if (!strcmp(w, "false") || !strcmp(w, "False")) n->lit = mk_bool(0);
        else if (!strcmp(w, "none") || !strcmp(w, "None")) n->lit = k_none;
        else n->k = E_NAME, n->s = w;
    } else if (t->t == T_STR) {
        n = mk(P, E_LIT, t->off);
        n->lit = t->v;
        P->i++;
        if (cur(P)->t == T_STR) { /* adjacent literals join */
            sb b = {0};
            sb_put(P->f, &b, t->v.s->p, t->v.s->n);
            while (cur(P)->t == T_STR) sb_put(P->f, &b, cur(P)->v.s->p, cur(P)->v.s->n), P->i++;
            n->lit = sb_value(P->f, &b);
        }
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        n = mk(P, E_LIT, t->off);
        n->lit = t->v;
        P->i++;
    } else if (is_op(P, "(")) {
        P->i++;
        n = parse_tuple(P, 1, 1, NULL);
        expect_op(P, ")");
    } else if (is_op(P, "[")) {
        n = mk(P, E_LIST, t->off);
        P->i++;
        while (next_item(P, n, "]")) nl_push(P->f, &n->x, parse_expr(P));
        P->i++;
    } else if (is_op(P, "{")) {
        n = mk(P, E_DICT, t->off);
        P->i++;
        while (next_item(P, n, "}")) {
            nl_push(P->f, &n->x, parse_expr(P));
            expect_op(P, ":");
            nl_push(P->f, &n->y, parse_expr(P));
        }
        P->i++;
    } else {
        unexpected(P, NULL);
        return NULL;
    }
    P->nest--;
    return n;
}

static node *parse_subscribed(parser *P) {
    size_t off = cur(P)->off;
    node *a = NULL, *b = NULL, *c = NULL;
    if (!is_op(P, ":")) {
        a = parse_expr(P);
        if (!is_op(P, ":")) return a;
    }
    P->i++;
    node *s = mk(P, E_SLICE, off);
    if (!is_op(P, "]") && !is_op(P, ",") && !is_op(P, ":")) b = parse_expr(P);
    if (is_op(P, ":")) {
        P->i++;
        if (!is_op(P, "]") && !is_op(P, ",")) c = parse_expr(P);
    }
    s->a = a, s->b = b, s->c = c;
    return s;
}

/* a call of n at the current "(" */
static node *parse_call(parser *P, node *n, size_t off) {
    node *c = mk(P, E_CALL, off);
    c->a = n;
    parse_call_args(P, c);
    return c;
}

static node *parse_postfix(parser *P, node *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(P, ".")) {
            P->i++;
            if (cur(P)->t == T_NAME) {
                node *a = mk(P, E_ATTR, t->off);
                a->a = n, a->s = expect_name(P);
                n = a;
            } else if (cur(P)->t == T_INT) {
                node *a = mk(P, E_ITEM, t->off);
                a->a = n, a->b = mk(P, E_LIT, cur(P)->off), a->b->lit = cur(P)->v;
                P->i++;
                n = a;
            } else unexpected(P, "a name or a number");
        } else if (is_op(P, "[")) {
            P->i++;
            node *a = mk(P, E_ITEM, t->off);
            a->a = n, a->b = parse_subscribed(P);
            if (is_op(P, ",")) perr(P, cur(P), "a tuple index is not supported");
            expect_op(P, "]");
            n = a;
        } else if (is_op(P, "(")) n = parse_call(P, n, t->off);
        else return n;
    }
}

/* one filter over n at the current "|": | name, | name(args) */
static node *parse_filter(parser *P, node *n) {
    P->i++;
    node *f = mk(P, E_FILTER, cur(P)->off);
    f->a = n, f->s = expect_name(P);
    if (is_op(P, "(")) parse_call_args(P, f);
    return f;
}

static node *parse_filter_expr(parser *P, node *n) {
    for (;;) {
        tok *t = cur(P);
        if (is_op(P, "|")) n = parse_filter(P, n);
        else if (is_name(P, "is")) {
            P->i++;
            node *te = mk(P, E_TEST, t->off);
            if (is_name(P, "not")) P->i++, te->flag = 1;
            tok *nt = cur(P);
            if (nt->t == T_NAME) te->s = expect_name(P);
            else if (nt->t == T_OP && in_list(k_tests, str_new(P->f, P->s + nt->off, nt->n)->p))
                te->s = str_new(P->f, P->s + nt->off, nt->n)->p, P->i++;
            else unexpected(P, "a test name");
            if (is_op(P, ".")) perr(P, cur(P), "dotted test names are not supported");
            te->a = n;
            tok *c = cur(P);
            if (is_op(P, "(")) parse_call_args(P, te);
            else if ((c->t == T_NAME || c->t == T_STR || c->t == T_INT || c->t == T_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
                     !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                if (is_name(P, "is")) perr(P, c, "You cannot chain multiple tests with is");
                arg_push(P, te, parse_postfix(P, parse_primary(P)), NULL);
            }
            n = te;
        } else if (is_op(P, "(")) n = parse_call(P, n, t->off);
        else return n;
    }
}

static node *parse_unary(parser *P, int with_filter) {
    enter(P);
    tok *t = cur(P);
    node *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        P->i++;
        n = mk(P, P->s[t->off] == '-' ? E_NEG : E_POS, t->off);
        n->a = parse_unary(P, 0);
    } else n = parse_primary(P);
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    P->nest--;
    return n;
}

static node *bin(parser *P, int op, node *a, node *b, size_t off) {
    node *n = mk(P, E_BIN, off);
    n->flag = op, n->a = a, n->b = b;
    return n;
}

static node *parse_pow(parser *P) {
    node *n = parse_unary(P, 1);
    while (is_op(P, "**")) {
        size_t off = cur(P)->off;
        P->i++;
        n = bin(P, OP_POW, n, parse_unary(P, 1), off);
    }
    return n;
}

static node *parse_math2(parser *P) {
    node *n = parse_pow(P);
    for (;;) {
        size_t off = cur(P)->off;
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV : is_op(P, "%") ? OP_MOD : -1;
        if (op < 0) return n;
        P->i++;
        n = bin(P, op, n, parse_pow(P), off);
    }
}

static node *parse_concat(parser *P) {
    node *n = parse_math2(P);
    if (!is_op(P, "~")) return n;
    node *c = mk(P, E_CONCAT, n->off);
    nl_push(P->f, &c->x, n);
    while (is_op(P, "~")) {
        P->i++;
        nl_push(P->f, &c->x, parse_math2(P));
    }
    return c;
}

static node *parse_math1(parser *P) {
    node *n = parse_concat(P);
    for (;;) {
        size_t off = cur(P)->off;
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : -1;
        if (op < 0) return n;
        P->i++;
        n = bin(P, op, n, parse_concat(P), off);
    }
}

static node *parse_compare(parser *P) {
    node *n = parse_math1(P);
    node *c = NULL;
    size_t cap = 0;
    for (;;) {
        int op = is_op(P, "==") ? OP_EQ : is_op(P, "!=") ? OP_NE : is_op(P, "<") ? OP_LT : is_op(P, "<=") ? OP_LE
               : is_op(P, ">") ? OP_GT : is_op(P, ">=") ? OP_GE : is_name(P, "in") ? OP_IN : -1;
        if (op < 0 && is_name(P, "not") && tok_is(P, peek(P, 1), T_NAME, "in")) op = OP_NOTIN, P->i++;
        if (op < 0) return c ? c : n;
        P->i++;
        if (!c) c = mk(P, E_CMP, n->off), c->a = n;
        nl_push(P->f, &c->x, parse_math1(P));
        if (c->x.n > cap) {
            int *o = falloc(P->f, c->x.cap * sizeof *o);
            if (c->ops) memcpy(o, c->ops, (c->x.n - 1) * sizeof *o);
            c->ops = o, cap = c->x.cap;
        }
        c->ops[c->x.n - 1] = op;
    }
}

static node *parse_not(parser *P) {
    if (is_name(P, "not")) {
        enter(P);
        node *n = mk(P, E_NOT, cur(P)->off);
        P->i++;
        n->a = parse_not(P);
        P->nest--;
        return n;
    }
    return parse_compare(P);
}

/* operands of next joined left to right by the keyword word into kind nodes */
static node *parse_keyword_chain(parser *P, const char *word, int kind, node *(*next)(parser *)) {
    node *n = next(P);
    while (is_name(P, word)) {
        node *a = mk(P, kind, cur(P)->off);
        P->i++;
        a->a = n, a->b = next(P);
        n = a;
    }
    return n;
}

static node *parse_and(parser *P) { return parse_keyword_chain(P, "and", E_AND, parse_not); }

static node *parse_or(parser *P) { return parse_keyword_chain(P, "or", E_OR, parse_and); }

static node *parse_expr(parser *P) {
    enter(P);
    node *n = parse_or(P);
    while (is_name(P, "if")) {
        node *c = mk(P, E_COND, cur(P)->off);
        P->i++;
        c->b = n, c->a = parse_or(P);
        if (is_name(P, "else")) P->i++, c->c = parse_expr(P);
        n = c;
    }
    P->nest--;
    return n;
}

/* a set or for target: a name, names separated by commas, or (set only) ns.attr */
static node *parse_target(parser *P, int with_ns, const char *extra_end) {
    tok *t = cur(P);
    if (with_ns && t->t == T_NAME && tok_is(P, peek(P, 1), T_OP, ".") && peek(P, 2)->t == T_NAME) {
        node *n = mk(P, E_NSREF, t->off);
        n->s = expect_name(P);
        P->i++;
        n->b = mk(P, E_LIT, cur(P)->off);
        n->b->lit = mk_cstr(P->f, expect_name(P));
        return n;
    }
    node *n = mk(P, E_TUPLE, t->off);
    int tuple = 0;
    for (;;) {
        if (n->x.n) expect_op(P, ",");
        if (cur(P)->t == T_BEND || is_op(P, "=") || is_op(P, "|") || (extra_end && is_name(P, extra_end))) break;
        if (is_op(P, "(")) perr(P, cur(P), "parenthesised targets are not supported");
        node *nm = mk(P, E_NAME, cur(P)->off);
        nm->s = expect_name(P);
        nl_push(P->f, &n->x, nm);
        if (is_op(P, ",")) tuple = 1;
        else break;
    }
    if (!n->x.n) unexpected(P, "a name");
    return tuple ? n : n->x.v[0];
}

static void expect_bend(parser *P) {
    if (cur(P)->t != T_BEND) unexpected(P, "end of statement block");
    P->i++;
}

/* the statements up to a {% NAME %} with NAME in ends (left unread) */
static nlist parse_body(parser *P, const char *const *ends);

/* {% name %} at the current block begin: 1 when it is one of ends */
static int at_end(parser *P, const char *const *ends) {
    if (cur(P)->t != T_BBEGIN || peek(P, 1)->t != T_NAME) return 0;
    for (; ends && *ends; ends++)
        if (tok_is(P, peek(P, 1), T_NAME, *ends)) return 1;
    return 0;
}

/* a chain of filters (| f(args)) over an E_BLOCKVAL */
static node *parse_block_filters(parser *P, size_t off) {
    node *n = mk(P, E_BLOCKVAL, off);
    while (is_op(P, "|")) n = parse_filter(P, n);
    return n;
}

/* A block's body, from its opening tag's %} up to its {% END (consumed up to
 * what follows END). */
static nlist parse_block(parser *P, const char *end) {
    expect_bend(P);
    const char *const ends[] = {end, NULL};
    nlist body = parse_body(P, ends);
    P->i += 2;
    return body;
}

static node *parse_stmt(parser *P) {
    tok *bt = cur(P);
    P->i++; /* {% */
    tok *nt = cur(P);
    if (nt->t != T_NAME) unexpected(P, "a statement name");
    const char *w = expect_name(P);
    node *n;
    enter(P);
    if (!strcmp(w, "if")) {
        n = mk(P, N_IF, bt->off);
        n->a = parse_expr(P);
        expect_bend(P);
        static const char *const e1[] = {"elif", "else", "endif", NULL};
        n->x = parse_body(P, e1);
        node *last = n;
        for (;;) {
            P->i++;
            const char *e = expect_name(P);
            if (!strcmp(e, "elif")) {
                node *m = mk(P, N_IF, P->t[P->i - 2].off);
                m->a = parse_expr(P);
                expect_bend(P);
                m->x = parse_body(P, e1);
                nl_push(P->f, &last->y, m);
                last = m;
            } else if (!strcmp(e, "else")) {
                expect_bend(P);
                static const char *const e2[] = {"endif", NULL};
                last->y = parse_body(P, e2);
            } else {
                expect_bend(P);
                break;
            }
        }
    } else if (!strcmp(w, "for")) {
        n = mk(P, N_FOR, bt->off);
        n->b = parse_target(P, 0, "in");
        if (!is_name(P, "in")) unexpected(P, "'in'");
        P->i++;
        n->a = parse_tuple(P, 0, 0, "recursive");
        if (is_name(P, "if")) P->i++, n->c = parse_expr(P);
        if (is_name(P, "recursive")) perr(P, cur(P), "recursive loops are not supported");
        expect_bend(P);
        static const char *const e1[] = {"else", "endfor", NULL};
        n->x = parse_body(P, e1);
        P->i++;
        if (!strcmp(expect_name(P), "else")) n->y = parse_block(P, "endfor");
        expect_bend(P);
    } else if (!strcmp(w, "set")) {
        node *target = parse_target(P, 1, NULL);
        if (is_op(P, "=")) {
            P->i++;
            n = mk(P, N_SET, bt->off);
            n->b = target;
            n->a = parse_tuple(P, 1, 0, NULL);
            expect_bend(P);
        } else {
            n = mk(P, N_SETBLOCK, bt->off);
            n->b = target;
            n->a = parse_block_filters(P, cur(P)->off);
            n->x = parse_block(P, "endset");
            expect_bend(P);
        }
    } else if (!strcmp(w, "macro")) {
        n = mk(P, N_MACRO, bt->off);
        n->s = expect_name(P);
        expect_op(P, "(");
        while (!is_op(P, ")")) {
            if (n->x.n) {
                expect_op(P, ",");
                if (is_op(P, ")")) break;
            }
            const char *pn = expect_name(P);
            node *def = NULL;
            if (is_op(P, "=")) P->i++, def = parse_expr(P);
            else if (n->x.n && n->x.v[n->x.n - 1]) perr(P, cur(P), "non-default argument follows default argument");
            arg_push(P, n, def, pn);
        }
        P->i++;
        n->y = parse_block(P, "endmacro");
        if (cur(P)->t == T_NAME) P->i++; /* {% endmacro name %} */
        expect_bend(P);
    } else if (!strcmp(w, "filter")) {
        n = mk(P, N_FILTERBLOCK, bt->off);
        node *blk = mk(P, E_BLOCKVAL, cur(P)->off);
        node *f = mk(P, E_FILTER, cur(P)->off);
        tok *ft = cur(P);
        f->a = blk, f->s = expect_name(P);
        (void)ft;
        if (is_op(P, "(")) parse_call_args(P, f);
        node *chain = f;
        while (is_op(P, "|")) {
            P->i++;
            node *g = mk(P, E_FILTER, cur(P)->off);
            tok *gt = cur(P);
            g->a = chain, g->s = expect_name(P);
            (void)gt;
            if (is_op(P, "(")) parse_call_args(P, g);
            chain = g;
        }
        n->a = chain;
        n->x = parse_block(P, "endfilter");
        expect_bend(P);
    } else if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        n = mk(P, w[0] == 'b' ? N_BREAK : N_CONTINUE, bt->off);
        expect_bend(P);
    } else if (!strcmp(w, "generation")) { /* transformers' marker of the assistant's text: renders its body */
        n = mk(P, N_BODY, bt->off);
        n->x = parse_block(P, "endgeneration");
        expect_bend(P);
    } else {
        static const char *const known[] = {"include", "extends", "import", "from", "block", "call", "raw", "with",
                                            "autoescape", "do", "print", "trans", NULL};
        if (in_list(known, w)) perr(P, nt, "the statement '%s' is not supported", w);
        if (!strncmp(w, "end", 3) || !strcmp(w, "else") || !strcmp(w, "elif"))
            perr(P, nt, "unexpected '%s'", w);
        perr(P, nt, "encountered unknown tag '%s'", w);
        return NULL;
    }
    P->nest--;
    return n;
}

static nlist parse_body(parser *P, const char *const *ends) {
    nlist body = {0};
    for (;;) {
        tok *t = cur(P);
        if (t->t == T_EOF) {
            if (ends) { /* the last of ends closes the block */
                const char *const *e = ends;
                while (e[1]) e++;
                perr(P, t, "unexpected end of template: missing {%% %s %%}", *e);
            }
            return body;
        }
        if (t->t == T_DATA) {
            node *n = mk(P, N_TEXT, t->off);
            n->lit = t->v;
            nl_push(P->f, &body, n);
            P->i++;
        } else if (t->t == T_VBEGIN) {
            node *n = mk(P, N_OUT, t->off);
            P->i++;
            n->a = parse_tuple(P, 1, 0, NULL);
            if (cur(P)->t != T_VEND) unexpected(P, "end of print statement");
            P->i++;
            nl_push(P->f, &body, n);
        } else if (t->t == T_BBEGIN) {
            if (at_end(P, ends)) return body;
            nl_push(P->f, &body, parse_stmt(P));
        } else unexpected(P, NULL);
    }
}

/* ---- rendering: state, frames ---- */

typedef struct frame {
    struct frame *up;
    jdict *vars;
} frame;

enum fnk { FN_GLOBAL, FN_METHOD, FN_MACRO, FN_UNSAFE, FN_MISSING, FN_CYCLE };

typedef struct jfunc {
    int kind;
    const char *name;
    value self;    /* FN_METHOD, FN_UNSAFE, FN_MISSING: the object */
    const node *m; /* FN_MACRO */
    frame *scope;  /* FN_MACRO: where it was defined */
} jfunc;

typedef struct R {
    fail *f;
    frame *fr;
    sb *out;
    size_t steps, max_steps;
    int depth;
    int ctl; /* 1: a break, 2: a continue is under way */
    value blockval;
    int64_t now;
    size_t off; /* the node being evaluated, for messages */
} R;

#define RFAIL(r, ...) fail_at((r)->f, BT_ERR_INVALID, (r)->off, __VA_ARGS__)

static const char *type_name(value v) {
    switch (v.t) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return v.l->gen ? v.l->gen : v.l->tuple ? "tuple" : "list";
    case V_DICT: return "dict";
    case V_NS: return "Namespace";
    default: return v.fn->kind == FN_MACRO ? "Macro" : "function";
    }
}

static void fail_undef(R *r, value v) {
    if (v.u) RFAIL(r, "%s", v.u);
    RFAIL(r, "an undefined value was used");
}

static value undef_msg(R *r, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    return (value){.t = V_UNDEF, .u = str_new(r->f, tmp, strlen(tmp))->p};
}

static int is_num(value v) { return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT; }
static double num_f(value v) { return v.t == V_FLOAT ? v.f : (double)v.i; }

/* Python's ==.  A container is equal to itself at once, as Python's
 * comparisons of the elements take it; other containers nested deeper than
 * BT_JINJA_MAX_JSON_DEPTH, or met after BT_JINJA_MAX_COMPARE comparisons of
 * one ==, are equal only when they are the same one (two lists of 98
 * references to one list of 98 ..., built apart, would take 98^depth) */
#ifndef BT_JINJA_MAX_COMPARE
#define BT_JINJA_MAX_COMPARE ((size_t)1 << 20)
#endif
static int veq_(value a, value b, int depth, size_t *left) {
    if (*left) --*left;
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return a.i == b.i;
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a.s->n == b.s->n && !memcmp(a.s->p, b.s->p, a.s->n);
    case V_LIST:
        if (a.l == b.l) return 1;
        if (a.l->gen || b.l->gen || depth > BT_JINJA_MAX_JSON_DEPTH || !*left) return 0;
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!veq_(a.l->v[i], b.l->v[i], depth + 1, left)) return 0;
        return 1;
    case V_DICT:
        if (a.d == b.d) return 1;
        if (depth > BT_JINJA_MAX_JSON_DEPTH || !*left || a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            size_t j = 0;
            while (j < b.d->n && *left && !veq_(a.d->k[i], b.d->k[j], depth + 1, left)) j++;
            if (j == b.d->n || !*left || !veq_(a.d->v[i], b.d->v[j], depth + 1, left)) return 0;
        }
        return 1;
    case V_NS: return a.d == b.d;
    default: return a.fn == b.fn;
    }
}
static int veq(value a, value b) {
    size_t left = BT_JINJA_MAX_COMPARE;
    return veq_(a, b, 0, &left);
}

static value *dict_find(jdict *d, value k) {
    if (k.t == V_STR) {
        for (size_t i = 0; i < d->n; i++)
            if (d->k[i].t == V_STR && d->k[i].s->n == k.s->n && !memcmp(d->k[i].s->p, k.s->p, k.s->n)) return &d->v[i];
        return NULL;
    }
    for (size_t i = 0; i < d->n; i++)
        if (veq(d->k[i], k)) return &d->v[i];
    return NULL;
}
static value *dict_find_s(jdict *d, const char *k) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == V_STR && d->k[i].s->n == n && !memcmp(d->k[i].s->p, k, n)) return &d->v[i];
    return NULL;
}
static void dict_set(fail *f, jdict *d, value k, value v) {
    value *p = dict_find(d, k);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        value *nk = falloc(f, cap * sizeof *nk), *nv = falloc(f, cap * sizeof *nv);
        if (d->n) memcpy(nk, d->k, d->n * sizeof *nk), memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k, d->v[d->n] = v, d->n++;
}
static void dict_set_s(fail *f, jdict *d, const char *k, value v) {
    value *p = dict_find_s(d, k); /* a loop's assignments reuse the key */
    if (p) *p = v;
    else dict_set(f, d, mk_cstr(f, k), v);
}

static int vtrue(value v) {
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL:
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s->n != 0;
    case V_LIST: return is_iter(v.l) || v.l->n != 0;
    case V_DICT: return v.d->n != 0;
    default: return 1;
    }
}

static int vcmp_(R *r, value a, value b, const char *op, int depth) {
    if (depth > BT_JINJA_MAX_JSON_DEPTH) RFAIL(r, "values nested too deep to compare");
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT) return a.i < b.i ? -1 : a.i > b.i;
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.s->n < b.s->n ? a.s->n : b.s->n;
        int c = memcmp(a.s->p, b.s->p, n);
        return c ? (c < 0 ? -1 : 1) : a.s->n < b.s->n ? -1 : a.s->n > b.s->n;
    }
    if (a.t == V_LIST && b.t == V_LIST && a.l->tuple == b.l->tuple && !a.l->gen && !b.l->gen) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (veq(a.l->v[i], b.l->v[i])) continue;
            return vcmp_(r, a.l->v[i], b.l->v[i], op, depth + 1);
        }
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    }
    if (a.t == V_UNDEF) fail_undef(r, a);
    if (b.t == V_UNDEF) fail_undef(r, b);
    RFAIL(r, "'%s' not supported between instances of '%s' and '%s'", op, type_name(a), type_name(b));
    return 0;
}
static int vcmp(R *r, value a, value b, const char *op) { return vcmp_(r, a, b, op, 0); }

/* ---- printing: Python's str() and repr(), json.dumps ---- */

static void put_float(fail *f, sb *b, double d) {
    if (isnan(d)) {
        sb_puts(f, b, "nan");
        return;
    }
    if (isinf(d)) {
        sb_puts(f, b, d < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) { /* the shortest digits that read back as d, as Python's repr */
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d) break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = buf;
    if (*p == '-') sb_put(f, b, "-", 1), p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) sb_put(f, b, i < (int)nd ? &digits[i] : "0", 1);
            sb_put(f, b, ".", 1);
            if ((int)nd > e + 1) sb_put(f, b, digits + e + 1, nd - (size_t)e - 1);
            else sb_put(f, b, "0", 1);
        } else {
            sb_puts(f, b, "0.");
            for (int i = 0; i < -e - 1; i++) sb_put(f, b, "0", 1);
            sb_put(f, b, digits, nd);
        }
    } else {
        sb_put(f, b, digits, 1);
        if (nd > 1) sb_put(f, b, ".", 1), sb_put(f, b, digits + 1, nd - 1);
        sb_printf(f, b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

static void put_repr(R *r, sb *b, value v, int depth);

static void put_str(R *r, sb *b, value v) {
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: sb_puts(r->f, b, "None"); break;
    case V_BOOL: sb_puts(r->f, b, v.i ? "True" : "False"); break;
    case V_INT: sb_printf(r->f, b, "%lld", (long long)v.i); break;
    case V_FLOAT: put_float(r->f, b, v.f); break;
    case V_STR: sb_put(r->f, b, v.s->p, v.s->n); break;
    default: put_repr(r, b, v, 0);
    }
}

static void put_repr(R *r, sb *b, value v, int depth) {
    if (depth > BT_JINJA_MAX_JSON_DEPTH) RFAIL(r, "a value nested too deep to print");
    fail *f = r->f;
    switch (v.t) {
    case V_UNDEF: sb_puts(f, b, "Undefined"); break;
    case V_STR: {
        int dq = memchr(v.s->p, '\'', v.s->n) && !memchr(v.s->p, '"', v.s->n);
        char q = dq ? '"' : '\'';
        sb_put(f, b, &q, 1);
        for (size_t i = 0; i < v.s->n; i++) {
            unsigned char c = (unsigned char)v.s->p[i];
            if (c == '\\' || c == (unsigned char)q) sb_put(f, b, "\\", 1), sb_put(f, b, (char *)&c, 1);
            else if (c == '\n') sb_puts(f, b, "\\n");
            else if (c == '\r') sb_puts(f, b, "\\r");
            else if (c == '\t') sb_puts(f, b, "\\t");
            else if (c < 0x20 || c == 0x7f) sb_printf(f, b, "\\x%02x", c);
            else sb_put(f, b, (char *)&c, 1);
        }
        sb_put(f, b, &q, 1);
        break;
    }
    case V_LIST:
        if (is_iter(v.l)) RFAIL(r, "printing a %s is not supported", v.l->gen);
        if (v.l->gen) sb_puts(f, b, v.l->gen), sb_puts(f, b, "(");
        sb_puts(f, b, v.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) sb_puts(f, b, ", ");
            put_repr(r, b, v.l->v[i], depth + 1);
        }
        sb_puts(f, b, v.l->tuple ? (v.l->n == 1 ? ",)" : ")") : "]");
        if (v.l->gen) sb_puts(f, b, ")");
        break;
    case V_DICT:
    case V_NS:
        sb_puts(f, b, v.t == V_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) sb_puts(f, b, ", ");
            put_repr(r, b, v.d->k[i], depth + 1);
            sb_puts(f, b, ": ");
            put_repr(r, b, v.d->v[i], depth + 1);
        }
        sb_puts(f, b, v.t == V_NS ? "}>" : "}");
        break;
    case V_FUNC: sb_printf(f, b, "<%s %s>", type_name(v), v.fn->name); break;
    default: put_str(r, b, v);
    }
}

static jstr *to_s(R *r, value v) {
    if (v.t == V_STR) return v.s;
    sb b = {0};
    sb_put(r->f, &b, "", 0);
    put_str(r, &b, v);
    return str_new(r->f, b.p, b.n);
}

typedef struct json_fmt {
    const char *indent; /* NULL: one line */
    const char *item_sep, *key_sep;
    int ensure_ascii, sort_keys;
} json_fmt;

static void json_string(R *r, sb *b, const char *p, size_t n, int ensure_ascii) {
    fail *f = r->f;
    sb_put(f, b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"') sb_puts(f, b, "\\\""), i++;
        else if (c == '\\') sb_puts(f, b, "\\\\"), i++;
        else if (c == '\n') sb_puts(f, b, "\\n"), i++;
        else if (c == '\r') sb_puts(f, b, "\\r"), i++;
        else if (c == '\t') sb_puts(f, b, "\\t"), i++;
        else if (c == '\b') sb_puts(f, b, "\\b"), i++;
        else if (c == '\f') sb_puts(f, b, "\\f"), i++;
        else if (c < 0x20 || (ensure_ascii && c == 0x7f)) sb_printf(f, b, "\\u%04x", c), i++;
        else if (c >= 0x80 && ensure_ascii) {
            uint32_t u = u8_next(p, n, &i);
            if (u >= 0x10000) {
                u -= 0x10000;
                sb_printf(f, b, "\\u%04x\\u%04x", 0xd800 + (u >> 10), 0xdc00 + (u & 0x3ff));
            } else sb_printf(f, b, "\\u%04x", u);
        } else sb_put(f, b, (const char *)&c, 1), i++;
    }
    sb_put(f, b, "\"", 1);
}

static void json_newline(R *r, sb *b, const json_fmt *j, int level) {
    sb_put(r->f, b, "\n", 1);
    for (int i = 0; i < level; i++) sb_puts(r->f, b, j->indent);
}

static void put_json(R *r, sb *b, value v, const json_fmt *j, int level) {
    fail *f = r->f;
    if (level > BT_JINJA_MAX_JSON_DEPTH) RFAIL(r, "a value nested too deep for tojson");
    switch (v.t) {
    case V_NONE: sb_puts(f, b, "null"); break;
    case V_BOOL: sb_puts(f, b, v.i ? "true" : "false"); break;
    case V_INT: sb_printf(f, b, "%lld", (long long)v.i); break;
    case V_FLOAT:
        if (isnan(v.f)) sb_puts(f, b, "NaN");
        else if (isinf(v.f)) sb_puts(f, b, v.f < 0 ? "-Infinity" : "Infinity");
        else put_float(f, b, v.f);
        break;
    case V_STR: json_string(r, b, v.s->p, v.s->n, j->ensure_ascii); break;
    case V_LIST:
        if (v.l->gen) RFAIL(r, "Object of type %s is not JSON serializable", v.l->gen);
        if (!v.l->n) {
            sb_puts(f, b, "[]");
            break;
        }
        sb_put(f, b, "[", 1);
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) sb_puts(f, b, j->item_sep);
            if (j->indent) json_newline(r, b, j, level + 1);
            put_json(r, b, v.l->v[i], j, level + 1);
        }
        if (j->indent) json_newline(r, b, j, level);
        sb_put(f, b, "]", 1);
        break;
    case V_DICT: {
        if (!v.d->n) {
            sb_puts(f, b, "{}");
            break;
        }
        size_t *ord = falloc(f, v.d->n * sizeof *ord);
        for (size_t i = 0; i < v.d->n; i++) ord[i] = i;
        if (j->sort_keys) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < v.d->n; i++)
                for (size_t k = i; k > 0 && vcmp(r, v.d->k[ord[k - 1]], v.d->k[ord[k]], "<") > 0; k--) {
                    size_t t = ord[k];
                    ord[k] = ord[k - 1], ord[k - 1] = t;
                }
        sb_put(f, b, "{", 1);
        for (size_t i = 0; i < v.d->n; i++) {
            value k = v.d->k[ord[i]];
            if (i) sb_puts(f, b, j->item_sep);
            if (j->indent) json_newline(r, b, j, level + 1);
            if (k.t == V_STR) json_string(r, b, k.s->p, k.s->n, j->ensure_ascii);
            else if (k.t == V_NONE || k.t == V_BOOL || k.t == V_INT || k.t == V_FLOAT) {
                sb kb = {0};
                put_json(r, &kb, k, j, level + 1);
                sb_put(f, b, "\"", 1), sb_put(f, b, kb.p, kb.n), sb_put(f, b, "\"", 1);
            } else RFAIL(r, "keys must be str, int, float, bool or None, not %s", type_name(k));
            sb_puts(f, b, j->key_sep);
            put_json(r, b, v.d->v[ord[i]], j, level + 1);
        }
        if (j->indent) json_newline(r, b, j, level);
        sb_put(f, b, "}", 1);
        break;
    }
    default: RFAIL(r, "Object of type %s is not JSON serializable", type_name(v));
    }
}

/* ---- reading the context: JSON to values ---- */

typedef struct jp {
    fail *f;
    const char *s;
    size_t i, n;
} jp;

static void jp_fail(jp *p, const char *what) {
    fail_at(p->f, BT_ERR_INVALID, (size_t)-1, "the context is not valid JSON: %s at byte %zu", what, p->i);
}
static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}
static int jp_lit(jp *p, const char *w) {
    size_t k = strlen(w);
    if (p->i + k <= p->n && !memcmp(p->s + p->i, w, k)) return p->i += k, 1;
    return 0;
}
static unsigned jp_hex4(jp *p) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
        if (h < 0) jp_fail(p, "a bad \\u escape");
        v = v * 16 + (unsigned)h, p->i++;
    }
    return v;
}
static value jp_string(jp *p) {
    sb b = {0};
    sb_put(p->f, &b, "", 0);
    p->i++;
    for (;;) {
        if (p->i >= p->n) jp_fail(p, "an unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') break;
        if (c < 0x20) jp_fail(p, "a control character in a string");
        if (c != '\\') {
            size_t st = p->i;
            while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && (unsigned char)p->s[p->i] >= 0x20) p->i++;
            sb_put(p->f, &b, p->s + st, p->i - st);
            continue;
        }
        if (++p->i >= p->n) jp_fail(p, "an unterminated string");
        char e = p->s[p->i++];
        switch (e) {
        case '"': sb_put(p->f, &b, "\"", 1); break;
        case '\\': sb_put(p->f, &b, "\\", 1); break;
        case '/': sb_put(p->f, &b, "/", 1); break;
        case 'b': sb_put(p->f, &b, "\b", 1); break;
        case 'f': sb_put(p->f, &b, "\f", 1); break;
        case 'n': sb_put(p->f, &b, "\n", 1); break;
        case 'r': sb_put(p->f, &b, "\r", 1); break;
        case 't': sb_put(p->f, &b, "\t", 1); break;
        case 'u': {
            uint32_t u = jp_hex4(p);
            if (u >= 0xd800 && u < 0xdc00 && p->i + 1 < p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                p->i += 2;
                uint32_t lo = jp_hex4(p);
                if (lo >= 0xdc00 && lo < 0xe000) u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                else p->i = save;
            }
            u8_put(p->f, &b, u);
            break;
        }
        default: jp_fail(p, "a bad escape");
        }
    }
    p->i++;
    return sb_value(p->f, &b);
}
static value jp_value(jp *p, int depth) {
    if (depth > BT_JINJA_MAX_JSON_DEPTH) jp_fail(p, "nesting too deep");
    jp_ws(p);
    if (p->i >= p->n) jp_fail(p, "an unexpected end");
    char c = p->s[p->i];
    if (c == '"') return jp_string(p);
    if (c == '{') {
        jdict *d = dict_new(p->f);
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') return p->i++, (value){.t = V_DICT, .d = d};
        for (;;) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') jp_fail(p, "a missing key");
            value k = jp_string(p);
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') jp_fail(p, "a missing ':'");
            p->i++;
            dict_set(p->f, d, k, jp_value(p, depth + 1));
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') return p->i++, (value){.t = V_DICT, .d = d};
            jp_fail(p, "a missing ',' or '}'");
        }
    }
    if (c == '[') {
        jlist *l = list_new(p->f, 0);
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') return p->i++, mk_list(l);
        for (;;) {
            list_push(p->f, l, jp_value(p, depth + 1));
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') return p->i++, mk_list(l);
            jp_fail(p, "a missing ',' or ']'");
        }
    }
    if (jp_lit(p, "true")) return mk_bool(1);
    if (jp_lit(p, "false")) return mk_bool(0);
    if (jp_lit(p, "null")) return k_none;
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t st = p->i;
        int fl = 0;
        if (p->s[p->i] == '-') p->i++;
        while (p->i < p->n && ((p->s[p->i] >= '0' && p->s[p->i] <= '9') || strchr(".eE+-", p->s[p->i]))) {
            if (strchr(".eE", p->s[p->i])) fl = 1;
            p->i++;
        }
        char buf[64];
        if (p->i - st >= sizeof buf) jp_fail(p, "a number too long");
        memcpy(buf, p->s + st, p->i - st);
        buf[p->i - st] = 0;
        char *end;
        errno = 0;
        if (!fl) {
            long long v = strtoll(buf, &end, 10);
            if (*end || end == buf) jp_fail(p, "a bad number");
            if (errno != ERANGE) return mk_int(v);
        }
        double d = strtod(buf, &end);
        if (*end || end == buf) jp_fail(p, "a bad number");
        return mk_float(d);
    }
    jp_fail(p, "an unexpected character");
    return k_none;
}

/* ---- iteration, attributes, items ---- */

static value mk_fn(R *r, int kind, const char *name, value self) {
    jfunc *fn = falloc(r->f, sizeof *fn);
    memset(fn, 0, sizeof *fn);
    fn->kind = kind, fn->name = name, fn->self = self;
    return (value){.t = V_FUNC, .fn = fn};
}

/* the items a for loop or list() gives: a list's, a dict's keys, a string's characters */
static jlist *iterate(R *r, value v) {
    switch (v.t) {
    case V_UNDEF: return list_new(r->f, 0);
    case V_LIST:
        if (is_iter(v.l)) {
            if (v.l->used) return list_new(r->f, 0);
            v.l->used = 1;
        }
        return v.l;
    case V_DICT: {
        jlist *l = list_new(r->f, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) list_push(r->f, l, v.d->k[i]);
        return l;
    }
    case V_STR: {
        jlist *l = list_new(r->f, 0);
        for (size_t i = 0; i < v.s->n;) {
            size_t st = i;
            u8_next(v.s->p, v.s->n, &i);
            list_push(r->f, l, mk_str(r->f, v.s->p + st, i - st));
        }
        return l;
    }
    default: RFAIL(r, "'%s' object is not iterable", type_name(v));
    }
    return NULL;
}

static const char *const k_str_methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper", "lower", "title",
    "capitalize", "swapcase", "find", "rfind", "count", "join", "format", "isdigit", "isalpha", "isalnum", "isspace",
    "islower", "isupper", "isnumeric", "isdecimal", "splitlines", NULL};
static const char *const k_str_missing[] = {
    "casefold", "center", "encode", "expandtabs", "format_map", "index", "isascii", "isidentifier", "isprintable",
    "istitle", "ljust", "maketrans", "partition", "removeprefix", "removesuffix", "rindex", "rjust", "rpartition",
    "translate", "zfill", NULL};
static const char *const k_dict_methods[] = {"items", "keys", "values", "get", NULL};
static const char *const k_dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const k_dict_missing[] = {"copy", "fromkeys", NULL};
static const char *const k_list_methods[] = {"index", "count", NULL};
static const char *const k_list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", NULL};
static const char *const k_list_missing[] = {"copy", NULL};

/* the attribute of v named a Python method, or an undefined */
static value method_of(R *r, value v, const char *name) {
    const char *const *ok = NULL, *const *unsafe = NULL, *const *missing = NULL;
    if (v.t == V_STR) ok = k_str_methods, missing = k_str_missing;
    else if (v.t == V_DICT) ok = k_dict_methods, unsafe = k_dict_unsafe, missing = k_dict_missing;
    else if (v.t == V_LIST && !v.l->gen) ok = k_list_methods, unsafe = k_list_unsafe, missing = k_list_missing;
    if (ok && in_list(ok, name)) return mk_fn(r, FN_METHOD, name, v);
    if (unsafe && in_list(unsafe, name)) return mk_fn(r, FN_UNSAFE, name, v);
    if (missing && in_list(missing, name)) return mk_fn(r, FN_MISSING, name, v);
    if (v.t == V_NONE) return undef_msg(r, "'None' has no attribute '%s'", name);
    return undef_msg(r, "'%s object' has no attribute '%s'", type_name(v), name);
}

static value get_attr(R *r, value v, const char *name) {
    if (v.t == V_UNDEF) fail_undef(r, v);
    if (v.t == V_DICT) {
        value m = method_of(r, v, name);
        if (m.t == V_FUNC) return m;
        value *p = dict_find_s(v.d, name);
        return p ? *p : m;
    }
    if (v.t == V_NS) {
        value *p = dict_find_s(v.d, name);
        return p ? *p : undef_msg(r, "'Namespace object' has no attribute '%s'", name);
    }
    return method_of(r, v, name);
}

static int64_t as_index(R *r, value v) {
    if (v.t == V_INT || v.t == V_BOOL) return v.i;
    if (v.t == V_UNDEF) fail_undef(r, v);
    RFAIL(r, "indices must be integers, not %s", type_name(v));
    return 0;
}

/* repr(v), cut at 64 bytes, for messages */
static const char *repr_s(R *r, value v) {
    sb b = {0};
    sb_put(r->f, &b, "", 0);
    put_repr(r, &b, v, 0);
    if (b.n > 64) b.p[64] = 0;
    return b.p;
}

static value get_item(R *r, value v, value k) {
    if (v.t == V_UNDEF) fail_undef(r, v);
    if (v.t == V_DICT || v.t == V_NS) {
        value *p = dict_find(v.d, k);
        if (p) return *p;
        if (k.t == V_STR && v.t == V_DICT) {
            value m = method_of(r, v, k.s->p);
            if (m.t == V_FUNC) return m;
        }
        if (k.t == V_STR) return undef_msg(r, "'%s object' has no attribute '%s'", type_name(v), k.s->p);
        return undef_msg(r, "'%s object' has no element %s", type_name(v), repr_s(r, k));
    }
    if (v.t == V_LIST && v.l->gen) RFAIL(r, "'%s' object is not subscriptable", v.l->gen);
    if ((v.t == V_LIST || v.t == V_STR) && (k.t == V_INT || k.t == V_BOOL)) {
        int64_t n = v.t == V_LIST ? (int64_t)v.l->n : (int64_t)u8_len(v.s->p, v.s->n), i = k.i < 0 ? k.i + n : k.i;
        if (i < 0 || i >= n) return undef_msg(r, "'%s object' has no element %lld", type_name(v), (long long)k.i);
        if (v.t == V_LIST) return v.l->v[i];
        size_t a = u8_off(v.s->p, v.s->n, (size_t)i), e = a;
        u8_next(v.s->p, v.s->n, &e);
        return mk_str(r->f, v.s->p + a, e - a);
    }
    if (k.t == V_STR) return method_of(r, v, k.s->p);
    if (v.t == V_NONE) return undef_msg(r, "None has no element %s", repr_s(r, k));
    return undef_msg(r, "'%s object' has no element %s", type_name(v), repr_s(r, k));
}

static value do_slice(R *r, value v, value a, value b, value c) {
    int64_t step = 1;
    if (c.t != V_NONE) step = as_index(r, c);
    if (!step) RFAIL(r, "slice step cannot be zero");
    if (v.t == V_UNDEF) fail_undef(r, v);
    if ((v.t != V_LIST && v.t != V_STR) || (v.t == V_LIST && v.l->gen)) RFAIL(r, "'%s' object is not subscriptable", type_name(v));
    int64_t n = v.t == V_LIST ? (int64_t)v.l->n : (int64_t)u8_len(v.s->p, v.s->n);
    int64_t lo, hi;
    if (step > 0) {
        lo = a.t == V_NONE ? 0 : as_index(r, a), hi = b.t == V_NONE ? n : as_index(r, b);
        if (lo < 0 && (lo += n) < 0) lo = 0;
        if (lo > n) lo = n;
        if (hi < 0 && (hi += n) < 0) hi = 0;
        if (hi > n) hi = n;
    } else {
        lo = a.t == V_NONE ? n - 1 : as_index(r, a), hi = b.t == V_NONE ? -1 : as_index(r, b);
        if (a.t != V_NONE) {
            if (lo < 0 && (lo += n) < 0) lo = -1;
            if (lo >= n) lo = n - 1;
        }
        if (b.t != V_NONE) {
            if (hi < 0 && (hi += n) < 0) hi = -1;
            if (hi >= n) hi = n - 1;
        }
    }
    if (v.t == V_LIST) {
        jlist *l = list_new(r->f, 0);
        l->tuple = v.l->tuple;
        for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
            list_push(r->f, l, v.l->v[i]);
            if (__builtin_add_overflow(i, step, &i)) break;
        }
        return mk_list(l);
    }
    size_t *off = falloc(r->f, ((size_t)n + 1) * sizeof *off);
    for (size_t i = 0, k = 0; k <= (size_t)n; k++) {
        off[k] = i;
        if (i < v.s->n) u8_next(v.s->p, v.s->n, &i);
    }
    sb s = {0};
    sb_put(r->f, &s, "", 0);
    for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
        sb_put(r->f, &s, v.s->p + off[i], off[i + 1] - off[i]);
        if (__builtin_add_overflow(i, step, &i)) break;
    }
    return sb_value(r->f, &s);
}

/* ---- arguments ---- */

typedef struct args {
    size_t np, nk;
    value *pos, *kv;
    const char **kn;
} args;

static value *arg(args *a, size_t i, const char *name) {
    if (i < a->np) return &a->pos[i];
    for (size_t k = 0; k < a->nk; k++)
        if (name && !strcmp(a->kn[k], name)) return &a->kv[k];
    return NULL;
}

/* names: the parameters in order; more positional arguments than names or a
 * keyword not among them is an error as Python's */
static void arg_check(R *r, args *a, const char *fname, const char *const *names) {
    size_t nn = 0;
    while (names && names[nn]) nn++;
    if (a->np > nn) RFAIL(r, "%s() takes at most %zu positional argument%s (%zu given)", fname, nn, nn == 1 ? "" : "s", a->np);
    for (size_t k = 0; k < a->nk; k++) {
        size_t i = 0;
        while (i < nn && strcmp(names[i], a->kn[k])) i++;
        if (i == nn) RFAIL(r, "%s() got an unexpected keyword argument '%s'", fname, a->kn[k]);
        if (i < a->np) RFAIL(r, "%s() got multiple values for argument '%s'", fname, a->kn[k]);
    }
}

static value ev(R *r, const node *e);

static args eval_args(R *r, const node *e) {
    args a = {0};
    for (size_t i = 0; i < e->x.n; i++) {
        if (e->kw && e->kw[i]) a.nk++;
        else a.np++;
    }
    a.pos = falloc(r->f, (a.np + 1) * sizeof *a.pos);
    a.kv = falloc(r->f, (a.nk + 1) * sizeof *a.kv);
    a.kn = falloc(r->f, (a.nk + 1) * sizeof *a.kn);
    size_t p = 0, k = 0;
    for (size_t i = 0; i < e->x.n; i++) {
        value v = ev(r, e->x.v[i]);
        if (e->kw && e->kw[i]) a.kn[k] = e->kw[i], a.kv[k++] = v;
        else a.pos[p++] = v;
    }
    return a;
}

static args shift_args(args a, size_t k) {
    a.pos += k < a.np ? k : a.np;
    a.np -= k < a.np ? k : a.np;
    return a;
}

static const char *str_arg(R *r, value *v, const char *what) {
    if (!v || v->t != V_STR) RFAIL(r, "%s must be a string", what);
    return v->s->p;
}

/* ---- string methods ---- */

static int in_chars(const char *chars, size_t nc, const char *p, size_t n) {
    if (!chars) return n == 1 && py_space((unsigned char)p[0]);
    for (size_t i = 0; i < nc;) {
        size_t st = i;
        u8_next(chars, nc, &i);
        if (i - st == n && !memcmp(chars + st, p, n)) return 1;
    }
    return 0;
}

/* s without leading (how & 1) and trailing (how & 2) characters of chars (NULL: white space) */
static value strip(R *r, jstr *s, const char *chars, size_t nc, int how) {
    size_t a = 0, e = s->n;
    if (how & 1)
        while (a < e) {
            size_t i = a;
            u8_next(s->p, e, &i);
            if (!in_chars(chars, nc, s->p + a, i - a)) break;
            a = i;
        }
    if (how & 2)
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)s->p[st] & 0xc0) == 0x80) st--;
            if (!in_chars(chars, nc, s->p + st, e - st)) break;
            e = st;
        }
    return mk_str(r->f, s->p + a, e - a);
}

static const char *find_n(const char *h, size_t hn, const char *nd, size_t nn) {
    if (!nn) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

static value str_split(R *r, jstr *s, value *sep, value *maxsplit, int from_right) {
    int64_t max = maxsplit && maxsplit->t != V_NONE ? as_index(r, *maxsplit) : -1;
    jlist *l = list_new(r->f, 0);
    if (!sep || sep->t == V_NONE) { /* runs of white space, none empty */
        jlist *parts = list_new(r->f, 0);
        size_t i = 0;
        while (i < s->n) {
            while (i < s->n && py_space((unsigned char)s->p[i])) i++;
            if (i >= s->n) break;
            size_t st = i;
            while (i < s->n && !py_space((unsigned char)s->p[i])) i++;
            list_push(r->f, parts, mk_str(r->f, s->p + st, i - st));
        }
        if (max < 0 || (int64_t)parts->n <= max + 1) return mk_list(parts);
        /* the last max+1 (rsplit) or first max+1 (split) fields, the rest kept whole */
        if (!from_right) {
            for (int64_t k = 0; k < max; k++) list_push(r->f, l, parts->v[k]);
            size_t pos = 0;
            for (int64_t k = 0; k < max; k++) {
                while (py_space((unsigned char)s->p[pos])) pos++;
                while (pos < s->n && !py_space((unsigned char)s->p[pos])) pos++;
            }
            while (pos < s->n && py_space((unsigned char)s->p[pos])) pos++;
            size_t e = s->n;
            while (e > pos && py_space((unsigned char)s->p[e - 1])) e--;
            list_push(r->f, l, mk_str(r->f, s->p + pos, e - pos));
            return mk_list(l);
        }
        size_t pos = s->n;
        for (int64_t k = 0; k < max; k++) {
            while (py_space((unsigned char)s->p[pos - 1])) pos--;
            while (pos > 0 && !py_space((unsigned char)s->p[pos - 1])) pos--;
        }
        while (pos > 0 && py_space((unsigned char)s->p[pos - 1])) pos--;
        size_t a = 0;
        while (a < pos && py_space((unsigned char)s->p[a])) a++;
        list_push(r->f, l, mk_str(r->f, s->p + a, pos - a));
        for (size_t k = parts->n - (size_t)max; k < parts->n; k++) list_push(r->f, l, parts->v[k]);
        return mk_list(l);
    }
    if (sep->t != V_STR) RFAIL(r, "must be str or None, not %s", type_name(*sep));
    if (!sep->s->n) RFAIL(r, "empty separator");
    const char *p = s->p, *e = s->p + s->n;
    if (!from_right) {
        for (int64_t k = 0; max < 0 || k < max; k++) {
            const char *q = find_n(p, (size_t)(e - p), sep->s->p, sep->s->n);
            if (!q) break;
            list_push(r->f, l, mk_str(r->f, p, (size_t)(q - p)));
            p = q + sep->s->n;
        }
        list_push(r->f, l, mk_str(r->f, p, (size_t)(e - p)));
        return mk_list(l);
    }
    jlist *rev = list_new(r->f, 0);
    for (int64_t k = 0; max < 0 || k < max; k++) {
        const char *q = NULL;
        for (const char *c = e - sep->s->n; c >= p && !q; c--)
            if (!memcmp(c, sep->s->p, sep->s->n)) q = c;
        if (!q) break;
        list_push(r->f, rev, mk_str(r->f, q + sep->s->n, (size_t)(e - q - sep->s->n)));
        e = q;
    }
    list_push(r->f, l, mk_str(r->f, p, (size_t)(e - p)));
    for (size_t k = rev->n; k-- > 0;) list_push(r->f, l, rev->v[k]);
    return mk_list(l);
}

static value str_replace(R *r, jstr *s, jstr *old, jstr *new, int64_t count) {
    sb b = {0};
    sb_put(r->f, &b, "", 0);
    const char *p = s->p, *e = s->p + s->n;
    if (!old->n) { /* Python inserts new between every character */
        int64_t k = 0;
        for (size_t i = 0; i <= s->n;) {
            if (count < 0 || k < count) sb_put(r->f, &b, new->p, new->n), k++;
            if (i == s->n) break;
            size_t st = i;
            u8_next(s->p, s->n, &i);
            sb_put(r->f, &b, s->p + st, i - st);
        }
        return sb_value(r->f, &b);
    }
    for (int64_t k = 0; count < 0 || k < count; k++) {
        const char *q = find_n(p, (size_t)(e - p), old->p, old->n);
        if (!q) break;
        sb_put(r->f, &b, p, (size_t)(q - p));
        sb_put(r->f, &b, new->p, new->n);
        p = q + old->n;
    }
    sb_put(r->f, &b, p, (size_t)(e - p));
    return sb_value(r->f, &b);
}

static int is_alpha(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }

/* how: 'u' upper, 'l' lower, 't' Python's title, 'c' capitalize, 's' swapcase */
static value str_case(R *r, jstr *s, char how) {
    jstr *o = str_new(r->f, s->p, s->n);
    int prev_cased = 0;
    for (size_t i = 0; i < o->n; i++) {
        unsigned char c = (unsigned char)o->p[i];
        int up = how == 'u' || (how == 't' && !prev_cased) || (how == 'c' && i == 0) || (how == 's' && c >= 'a' && c <= 'z');
        if (is_alpha(c)) o->p[i] = (char)(up ? (c & ~32) : (c | 32));
        prev_cased = is_alpha(c) || (c >= 0x80 && prev_cased);
    }
    return (value){.t = V_STR, .s = o};
}

static int affix(R *r, jstr *s, value *a, int end) {
    if (!a) RFAIL(r, "%s() takes at least 1 argument", end ? "endswith" : "startswith");
    if (a->t == V_LIST && a->l->tuple) {
        for (size_t i = 0; i < a->l->n; i++)
            if (affix(r, s, &a->l->v[i], end)) return 1;
        return 0;
    }
    if (a->t != V_STR) RFAIL(r, "%s first arg must be str or a tuple of str, not %s", end ? "endswith" : "startswith", type_name(*a));
    if (a->s->n > s->n) return 0;
    return !memcmp(s->p + (end ? s->n - a->s->n : 0), a->s->p, a->s->n);
}

/* str.format: {} {0} {name} {{ }}, without conversions or format specs */
static value str_format(R *r, jstr *s, args *a) {
    sb b = {0};
    sb_put(r->f, &b, "", 0);
    size_t auto_i = 0;
    for (size_t i = 0; i < s->n; i++) {
        char c = s->p[i];
        if (c == '}' ) {
            if (i + 1 < s->n && s->p[i + 1] == '}') i++;
            else RFAIL(r, "Single '}' encountered in format string");
            sb_put(r->f, &b, "}", 1);
            continue;
        }
        if (c != '{') {
            sb_put(r->f, &b, &c, 1);
            continue;
        }
        if (i + 1 < s->n && s->p[i + 1] == '{') {
            sb_put(r->f, &b, "{", 1), i++;
            continue;
        }
        size_t e = i + 1;
        while (e < s->n && s->p[e] != '}') e++;
        if (e >= s->n) RFAIL(r, "Single '{' encountered in format string");
        const char *f = s->p + i + 1;
        size_t fn = e - i - 1;
        if (memchr(f, ':', fn) || memchr(f, '!', fn) || memchr(f, '.', fn) || memchr(f, '[', fn))
            RFAIL(r, "format specs and conversions in str.format are not supported");
        value v;
        if (!fn || (f[0] >= '0' && f[0] <= '9')) {
            size_t k = fn ? (size_t)strtoul(f, NULL, 10) : auto_i++;
            if (k >= a->np) RFAIL(r, "Replacement index %zu out of range for positional args tuple", k);
            v = a->pos[k];
        } else {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)fn, f);
            value *p = NULL;
            for (size_t k = 0; k < a->nk && !p; k++)
                if (!strcmp(a->kn[k], name)) p = &a->kv[k];
            if (!p) RFAIL(r, "KeyError: '%s'", name);
            v = *p;
        }
        put_str(r, &b, v);
        i = e;
    }
    return sb_value(r->f, &b);
}

static value call_str_method(R *r, jstr *s, const char *m, args *a) {
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        static const char *const p[] = {"chars", NULL};
        arg_check(r, a, m, p);
        value *c = arg(a, 0, "chars");
        const char *chars = c && c->t != V_NONE ? str_arg(r, c, "the characters to strip") : NULL;
        return strip(r, s, chars, chars ? c->s->n : 0, m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        static const char *const p[] = {"sep", "maxsplit", NULL};
        arg_check(r, a, m, p);
        return str_split(r, s, arg(a, 0, "sep"), arg(a, 1, "maxsplit"), m[0] == 'r');
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) return mk_bool(affix(r, s, arg(a, 0, NULL), m[0] == 'e'));
    if (!strcmp(m, "replace")) {
        static const char *const p[] = {"old", "new", "count", NULL};
        arg_check(r, a, m, p);
        value *o = arg(a, 0, "old"), *n = arg(a, 1, "new"), *c = arg(a, 2, "count");
        str_arg(r, o, "replace's old"), str_arg(r, n, "replace's new");
        return str_replace(r, s, o->s, n->s, c ? as_index(r, *c) : -1);
    }
    if (!strcmp(m, "upper")) return str_case(r, s, 'u');
    if (!strcmp(m, "lower")) return str_case(r, s, 'l');
    if (!strcmp(m, "title")) return str_case(r, s, 't');
    if (!strcmp(m, "capitalize")) {
        value v = str_case(r, s, 'l');
        if (v.s->n && is_alpha((unsigned char)v.s->p[0])) v.s->p[0] = (char)(v.s->p[0] & ~32);
        return v;
    }
    if (!strcmp(m, "swapcase")) return str_case(r, s, 's');
    if (!strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "count")) {
        jstr *nd = str_new(r->f, str_arg(r, arg(a, 0, NULL), "the substring"), a->pos[0].s->n);
        int64_t found = -1, count = 0;
        for (size_t i = 0; i + nd->n <= s->n;) {
            if (!memcmp(s->p + i, nd->p, nd->n)) {
                if (found < 0 || m[0] == 'r') found = (int64_t)u8_len(s->p, i);
                count++;
                i += nd->n ? nd->n : 1;
                if (m[0] == 'f') break;
            } else i++;
        }
        if (m[0] == 'c') return mk_int(nd->n ? count : (int64_t)u8_len(s->p, s->n) + 1);
        return mk_int(found);
    }
    if (!strcmp(m, "join")) {
        value *it = arg(a, 0, NULL);
        if (!it) RFAIL(r, "join() takes exactly one argument");
        jlist *l = iterate(r, *it);
        sb b = {0};
        sb_put(r->f, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != V_STR) RFAIL(r, "sequence item %zu: expected str instance, %s found", i, type_name(l->v[i]));
            if (i) sb_put(r->f, &b, s->p, s->n);
            sb_put(r->f, &b, l->v[i].s->p, l->v[i].s->n);
        }
        return sb_value(r->f, &b);
    }
    if (!strcmp(m, "format")) return str_format(r, s, a);
    if (!strcmp(m, "splitlines")) {
        jlist *l = list_new(r->f, 0);
        size_t st = 0;
        for (size_t i = 0; i < s->n; i++) {
            unsigned char c = (unsigned char)s->p[i];
            if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
                list_push(r->f, l, mk_str(r->f, s->p + st, i - st));
                if (c == '\r' && i + 1 < s->n && s->p[i + 1] == '\n') i++;
                st = i + 1;
            }
        }
        if (st < s->n) list_push(r->f, l, mk_str(r->f, s->p + st, s->n - st));
        return mk_list(l);
    }
    /* the is* predicates */
    int any = 0, all = s->n > 0, cased = 0;
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->p[i];
        int ok = !strcmp(m, "isspace") ? py_space(c)
               : !strcmp(m, "isalpha") ? is_alpha(c)
               : !strcmp(m, "isalnum") ? is_alpha(c) || (c >= '0' && c <= '9')
               : !strcmp(m, "islower") ? !(c >= 'A' && c <= 'Z')
               : !strcmp(m, "isupper") ? !(c >= 'a' && c <= 'z')
                                       : c >= '0' && c <= '9';
        if (is_alpha(c)) cased = 1;
        any |= ok;
        all &= ok;
    }
    (void)any;
    if (!strcmp(m, "islower") || !strcmp(m, "isupper")) return mk_bool(all && cased);
    return mk_bool(all);
}

static value html_escape(R *r, jstr *s);

static value call_method(R *r, jfunc *fn, args *a) {
    value self = fn->self;
    const char *m = fn->name;
    if (self.t == V_STR && !self.safe) return call_str_method(r, self.s, m, a);
    if (self.t == V_STR) { /* Markup's methods: string arguments escaped, a Markup back */
        static const char *const esc[] = {"replace", "join", "format", "strip", "lstrip", "rstrip", NULL};
        static const char *const keep[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize",
                                           "swapcase", "replace", "join", "format", "split", "rsplit", "splitlines", NULL};
        if (in_list(esc, m)) {
            for (size_t i = 0; i < a->np; i++)
                if (a->pos[i].t == V_STR && !a->pos[i].safe) a->pos[i] = html_escape(r, a->pos[i].s);
            for (size_t i = 0; i < a->nk; i++)
                if (a->kv[i].t == V_STR && !a->kv[i].safe) a->kv[i] = html_escape(r, a->kv[i].s);
            if (!strcmp(m, "join") && a->np && a->pos[0].t == V_LIST) {
                jlist *l = iterate(r, a->pos[0]), *e = list_new(r->f, l->n);
                for (size_t i = 0; i < l->n; i++)
                    list_push(r->f, e, l->v[i].t == V_STR && !l->v[i].safe ? html_escape(r, l->v[i].s) : l->v[i]);
                a->pos[0] = mk_list(e);
            }
        }
        value v = call_str_method(r, self.s, m, a);
        if (in_list(keep, m)) {
            if (v.t == V_STR) v.safe = 1;
            else if (v.t == V_LIST)
                for (size_t i = 0; i < v.l->n; i++) v.l->v[i].safe = 1;
        }
        return v;
    }
    if (self.t == V_DICT) {
        if (!strcmp(m, "get")) {
            static const char *const p[] = {"key", "default", NULL};
            arg_check(r, a, "get", p);
            value *k = arg(a, 0, NULL), *d = arg(a, 1, NULL);
            if (!k) RFAIL(r, "get expected at least 1 argument, got 0");
            value *v = dict_find(self.d, *k);
            return v ? *v : d ? *d : k_none;
        }
        jlist *l = list_new(r->f, self.d->n);
        for (size_t i = 0; i < self.d->n; i++) {
            if (m[0] == 'k') list_push(r->f, l, self.d->k[i]);
            else if (m[0] == 'v') list_push(r->f, l, self.d->v[i]);
            else {
                jlist *t = list_new(r->f, 2);
                t->tuple = 1;
                list_push(r->f, t, self.d->k[i]), list_push(r->f, t, self.d->v[i]);
                list_push(r->f, l, mk_list(t));
            }
        }
        return mk_gen(l, m[0] == 'k' ? "dict_keys" : m[0] == 'v' ? "dict_values" : "dict_items");
    }
    /* list: index, count */
    value *x = arg(a, 0, NULL);
    if (!x) RFAIL(r, "%s() takes exactly one argument", m);
    int64_t c = 0;
    for (size_t i = 0; i < self.l->n; i++)
        if (veq(self.l->v[i], *x)) {
            if (m[0] == 'i') return mk_int((int64_t)i);
            c++;
        }
    if (m[0] == 'i') RFAIL(r, "value is not in list");
    return mk_int(c);
}

/* ---- filters and tests ---- */

static value attr_path(R *r, value v, const char *path) {
    const char *p = path;
    for (;;) {
        const char *d = strchr(p, '.');
        size_t n = d ? (size_t)(d - p) : strlen(p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++) digits &= p[i] >= '0' && p[i] <= '9';
        value k = digits ? mk_int(strtoll(p, NULL, 10)) : mk_str(r->f, p, n);
        v = get_item(r, v, k);
        if (!d) return v;
        if (v.t == V_UNDEF) fail_undef(r, v);
        p = d + 1;
    }
}

static value lower_if(R *r, value v, int case_sensitive) {
    return !case_sensitive && v.t == V_STR ? str_case(r, v.s, 'l') : v;
}

/* a stable merge sort of v[0..n) by keys k[0..n) */
static void sort_by(R *r, value *v, value *k, size_t n, int reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_by(r, v, k, h, reverse), sort_by(r, v + h, k + h, n - h, reverse);
    value *tv = falloc(r->f, n * sizeof *tv), *tk = falloc(r->f, n * sizeof *tk);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        int take_right = i == h || (j < n && (reverse ? vcmp(r, k[j], k[i], "<") > 0 : vcmp(r, k[j], k[i], "<") < 0));
        size_t s = take_right ? j++ : i++;
        tv[o] = v[s], tk[o++] = k[s];
    }
    memcpy(v, tv, n * sizeof *v), memcpy(k, tk, n * sizeof *k);
}

static int apply_test(R *r, const char *name, value v, args *a);
static value apply_filter(R *r, const char *name, value in, args *a);

static int opt_bool(value *v, int def) { return v ? vtrue(*v) : def; }

static value html_escape(R *r, jstr *s) {
    sb b = {0};
    sb_put(r->f, &b, "", 0);
    for (size_t i = 0; i < s->n; i++) {
        char c = s->p[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        if (e) sb_puts(r->f, &b, e);
        else sb_put(r->f, &b, &c, 1);
    }
    return sb_value(r->f, &b);
}

/* select, reject, selectattr, rejectattr */
static value select_items(R *r, value in, args *a, int by_attr, int keep) {
    jlist *o = list_new(r->f, 0);
    if (!vtrue(in)) return mk_gen(o, "generator");
    jlist *l = iterate(r, in);
    const char *attr = by_attr ? str_arg(r, arg(a, 0, NULL), "the attribute") : NULL;
    args rest = shift_args(*a, by_attr ? 1 : 0);
    const char *test = rest.np ? str_arg(r, &rest.pos[0], "the test name") : NULL;
    if (test && !in_list(k_tests, test)) RFAIL(r, "No test named '%s' found.", test);
    rest = shift_args(rest, 1);
    for (size_t i = 0; i < l->n; i++) {
        value x = attr ? attr_path(r, l->v[i], attr) : l->v[i];
        int ok = test ? apply_test(r, test, x, &rest) : vtrue(x);
        if (ok == keep) list_push(r->f, o, l->v[i]);
    }
    return mk_gen(o, "generator");
}

static value apply_filter_(R *r, const char *f, value in, args *a);

/* jinja2's filters that keep a Markup a Markup (they call the str method on it) */
static value apply_filter(R *r, const char *f, value in, args *a) {
    value v = apply_filter_(r, f, in, a);
    static const char *const keep[] = {"trim", "upper", "lower", "capitalize", "indent", "center", NULL};
    if (in.t == V_STR && in.safe && v.t == V_STR && in_list(keep, f)) v.safe = 1;
    return v;
}

/* The filters, in three families; apply_filter_ picks the family by name. */
#define P(...)                                                                                                     \
    const char *const p_[] = {__VA_ARGS__, NULL};                                                                      \
    arg_check(r, a, f, p_)
#define P0() arg_check(r, a, f, NULL)
static const char *const k_text_filters[] = {"default", "d", "length", "count", "tojson", "string", "safe",
                                             "trim", "upper", "lower", "capitalize", "title", "replace",
                                             "join", NULL};
static const char *const k_seq_filters[] = {"items", "dictsort", "list", "first", "last", "reverse", "map",
                                            "select", "reject", "selectattr", "rejectattr", "unique", "sort",
                                            "min", "max", "sum", NULL};

/* default, length, tojson and the string filters */
static value filter_text(R *r, const char *f, value in, args *a) {
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        P("default_value", "boolean");
        value *d = arg(a, 0, "default_value");
        if (in.t == V_UNDEF || (opt_bool(arg(a, 1, "boolean"), 0) && !vtrue(in))) return d ? *d : mk_cstr(r->f, "");
        return in;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        P0();
        switch (in.t) {
        case V_UNDEF: return mk_int(0);
        case V_STR: return mk_int((int64_t)u8_len(in.s->p, in.s->n));
        case V_LIST:
            if (is_iter(in.l)) RFAIL(r, "object of type '%s' has no len()", in.l->gen);
            return mk_int((int64_t)in.l->n);
        case V_DICT: return mk_int((int64_t)in.d->n);
        default: RFAIL(r, "object of type '%s' has no len()", type_name(in));
        }
    }
    if (!strcmp(f, "tojson")) {
        P("ensure_ascii", "indent", "separators", "sort_keys");
        json_fmt j = {NULL, ", ", ": ", opt_bool(arg(a, 0, "ensure_ascii"), 0), opt_bool(arg(a, 3, "sort_keys"), 0)};
        value *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators");
        if (ind && ind->t != V_NONE) {
            if (ind->t == V_STR) j.indent = ind->s->p;
            else {
                int64_t n = as_index(r, *ind);
                char *sp = falloc(r->f, (size_t)(n > 0 ? n : 0) + 1);
                memset(sp, ' ', (size_t)(n > 0 ? n : 0));
                sp[n > 0 ? n : 0] = 0;
                j.indent = sp;
            }
            j.item_sep = ",";
        }
        if (sep && sep->t != V_NONE) {
            if (sep->t != V_LIST || sep->l->n != 2 || sep->l->v[0].t != V_STR || sep->l->v[1].t != V_STR)
                RFAIL(r, "tojson: separators must be a pair of strings");
            j.item_sep = sep->l->v[0].s->p, j.key_sep = sep->l->v[1].s->p;
        }
        sb b = {0};
        sb_put(r->f, &b, "", 0);
        put_json(r, &b, in, &j, 0);
        return sb_value(r->f, &b);
    }
    if (!strcmp(f, "string")) {
        P0();
        return (value){.t = V_STR, .safe = in.t == V_STR && in.safe, .s = to_s(r, in)};
    }
    if (!strcmp(f, "safe")) {
        P0();
        return (value){.t = V_STR, .safe = 1, .s = to_s(r, in)};
    }
    if (!strcmp(f, "trim")) {
        P("chars");
        value *c = arg(a, 0, "chars");
        const char *chars = c && c->t != V_NONE ? str_arg(r, c, "trim's characters") : NULL;
        return strip(r, to_s(r, in), chars, chars ? c->s->n : 0, 3);
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize")) {
        P0();
        args none = {0};
        return call_str_method(r, to_s(r, in), f, &none);
    }
    if (!strcmp(f, "title")) { /* jinja2's: words split at white space and - ( { [ <, each capitalised */
        P0();
        jstr *s = to_s(r, in), *o = str_new(r->f, s->p, s->n);
        int start = 1;
        for (size_t i = 0; i < o->n; i++) {
            unsigned char c = (unsigned char)o->p[i];
            if (py_space(c) || strchr("-({[<", c)) {
                start = 1;
                continue;
            }
            if (is_alpha(c)) o->p[i] = (char)(start ? c & ~32 : c | 32);
            start = 0;
        }
        return (value){.t = V_STR, .s = o};
    }
    if (!strcmp(f, "replace")) {
        P("old", "new", "count");
        value *o = arg(a, 0, "old"), *n = arg(a, 1, "new"), *c = arg(a, 2, "count");
        if (!o || !n) RFAIL(r, "replace() needs old and new");
        return str_replace(r, to_s(r, in), to_s(r, *o), to_s(r, *n), c && c->t != V_NONE ? as_index(r, *c) : -1);
    }
    if (!strcmp(f, "join")) {
        P("d", "attribute");
        value *d = arg(a, 0, "d"), *at = arg(a, 1, "attribute");
        jlist *l = iterate(r, in);
        sb b = {0};
        sb_put(r->f, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i && d) put_str(r, &b, *d);
            put_str(r, &b, at && at->t != V_NONE ? attr_path(r, l->v[i], to_s(r, *at)->p) : l->v[i]);
        }
        return sb_value(r->f, &b);
    }
    RFAIL(r, "No filter named '%s' found.", f);
    return k_undef;
}

/* the filters over sequences and mappings */
static value filter_seq(R *r, const char *f, value in, args *a) {
    if (!strcmp(f, "items")) {
        P0();
        if (in.t == V_UNDEF) return mk_gen(list_new(r->f, 0), "generator");
        if (in.t != V_DICT) RFAIL(r, "Can only get item pairs from a mapping.");
        args none = {0};
        jfunc fn = {.kind = FN_METHOD, .name = "items", .self = in};
        value v = call_method(r, &fn, &none);
        v.l->gen = "generator";
        return v;
    }
    if (!strcmp(f, "dictsort")) {
        P("case_sensitive", "by", "reverse");
        if (in.t != V_DICT) RFAIL(r, "dictsort: the value is not a mapping");
        int cs = opt_bool(arg(a, 0, "case_sensitive"), 0), rev = opt_bool(arg(a, 2, "reverse"), 0);
        value *by = arg(a, 1, "by");
        int by_value = by && by->t == V_STR && !strcmp(by->s->p, "value");
        args none = {0};
        jfunc fn = {.kind = FN_METHOD, .name = "items", .self = in};
        jlist *l = call_method(r, &fn, &none).l;
        l->gen = NULL;
        value *k = falloc(r->f, (l->n + 1) * sizeof *k);
        for (size_t i = 0; i < l->n; i++) k[i] = lower_if(r, l->v[i].l->v[by_value], cs);
        sort_by(r, l->v, k, l->n, rev);
        return mk_list(l);
    }
    if (!strcmp(f, "list")) {
        P0();
        jlist *l = iterate(r, in), *o = list_new(r->f, l->n);
        for (size_t i = 0; i < l->n; i++) list_push(r->f, o, l->v[i]);
        return mk_list(o);
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        P0();
        if (f[0] == 'l' && in.t == V_LIST && is_iter(in.l)) RFAIL(r, "'%s' object is not reversible", in.l->gen);
        jlist *l = iterate(r, in);
        if (!l->n) return undef_msg(r, "No %s item, sequence was empty.", f);
        return l->v[f[0] == 'f' ? 0 : l->n - 1];
    }
    if (!strcmp(f, "reverse")) {
        P0();
        if (in.t == V_STR) {
            jlist *l = iterate(r, in);
            sb b = {0};
            sb_put(r->f, &b, "", 0);
            for (size_t i = l->n; i-- > 0;) sb_put(r->f, &b, l->v[i].s->p, l->v[i].s->n);
            return sb_value(r->f, &b);
        }
        int iter = in.t == V_LIST && is_iter(in.l); /* reversed() fails on an iterator: jinja2 makes a list */
        jlist *l = iterate(r, in), *o = list_new(r->f, l->n);
        for (size_t i = l->n; i-- > 0;) list_push(r->f, o, l->v[i]);
        return iter ? mk_list(o) : mk_gen(o, in.t == V_DICT ? "dict_reversekeyiterator" : "list_reverseiterator");
    }
    if (!strcmp(f, "map")) {
        value *at = NULL;
        for (size_t k = 0; k < a->nk; k++)
            if (!strcmp(a->kn[k], "attribute")) at = &a->kv[k];
        jlist *o = list_new(r->f, 0);
        if (!vtrue(in)) return mk_gen(o, "generator");
        jlist *l = iterate(r, in);
        if (at) {
            value *d = NULL;
            for (size_t k = 0; k < a->nk; k++) {
                if (!strcmp(a->kn[k], "default")) d = &a->kv[k];
                else if (strcmp(a->kn[k], "attribute")) RFAIL(r, "map() got an unexpected keyword argument '%s'", a->kn[k]);
            }
            const char *path = to_s(r, *at)->p;
            for (size_t i = 0; i < l->n; i++) {
                value x = attr_path(r, l->v[i], path);
                list_push(r->f, o, x.t == V_UNDEF && d ? *d : x);
            }
            return mk_gen(o, "generator");
        }
        const char *name = str_arg(r, arg(a, 0, NULL), "map's filter name");
        if (!in_list(k_filters, name)) RFAIL(r, "No filter named '%s' found.", name);
        args rest = shift_args(*a, 1);
        for (size_t i = 0; i < l->n; i++) list_push(r->f, o, apply_filter(r, name, l->v[i], &rest));
        return mk_gen(o, "generator");
    }
    if (!strcmp(f, "select")) return select_items(r, in, a, 0, 1);
    if (!strcmp(f, "reject")) return select_items(r, in, a, 0, 0);
    if (!strcmp(f, "selectattr")) return select_items(r, in, a, 1, 1);
    if (!strcmp(f, "rejectattr")) return select_items(r, in, a, 1, 0);
    if (!strcmp(f, "unique") || !strcmp(f, "sort") || !strcmp(f, "min") || !strcmp(f, "max")) {
        int is_sort = f[0] == 's';
        P(is_sort ? "reverse" : "case_sensitive", is_sort ? "case_sensitive" : "attribute", is_sort ? "attribute" : "");
        int cs = opt_bool(arg(a, is_sort ? 1 : 0, "case_sensitive"), 0), rev = is_sort && opt_bool(arg(a, 0, "reverse"), 0);
        value *at = arg(a, is_sort ? 2 : 1, "attribute");
        jlist *l = iterate(r, in), *o = list_new(r->f, l->n);
        value *keys = falloc(r->f, (l->n + 1) * sizeof *keys);
        size_t nk = 0;
        for (size_t i = 0; i < l->n; i++) {
            value k = lower_if(r, at && at->t != V_NONE ? attr_path(r, l->v[i], to_s(r, *at)->p) : l->v[i], cs);
            if (f[0] == 'u') {
                size_t j = 0;
                while (j < nk && !veq(keys[j], k)) j++;
                if (j < nk) continue;
            }
            keys[nk++] = k;
            list_push(r->f, o, l->v[i]);
        }
        if (f[0] == 'u') return mk_gen(o, "generator");
        sort_by(r, o->v, keys, o->n, rev);
        if (is_sort) return mk_list(o);
        if (!o->n) return undef_msg(r, "No aggregated item, sequence was empty.");
        return f[1] == 'i' ? o->v[0] : o->v[o->n - 1];
    }
    if (!strcmp(f, "sum")) {
        P("attribute", "start");
        value *at = arg(a, 0, "attribute"), *st = arg(a, 1, "start");
        value acc = st ? *st : mk_int(0);
        jlist *l = iterate(r, in);
        for (size_t i = 0; i < l->n; i++) {
            value x = at && at->t != V_NONE ? attr_path(r, l->v[i], to_s(r, *at)->p) : l->v[i];
            if (!is_num(acc) || !is_num(x)) RFAIL(r, "unsupported operand type(s) for +: '%s' and '%s'", type_name(acc), type_name(x));
            if (acc.t == V_FLOAT || x.t == V_FLOAT) acc = mk_float(num_f(acc) + num_f(x));
            else if (__builtin_add_overflow(acc.i, x.i, &acc.i)) RFAIL(r, "integer overflow");
            else acc.t = V_INT;
        }
        return acc;
    }
    RFAIL(r, "No filter named '%s' found.", f);
    return k_undef;
}

/* numbers, layout, attributes, escaping; an unknown name fails here */
static value filter_other(R *r, const char *f, value in, args *a) {
    if (!strcmp(f, "int")) {
        P("default", "base");
        value *d = arg(a, 0, "default"), *b = arg(a, 1, "base");
        value def = d ? *d : mk_int(0);
        if (in.t == V_INT || in.t == V_BOOL) return mk_int(in.i);
        if (in.t == V_FLOAT) return isfinite(in.f) && fabs(in.f) < 9.2e18 ? mk_int((int64_t)in.f) : def;
        if (in.t == V_STR) {
            jstr *s = strip(r, in.s, NULL, 0, 3).s;
            char *end;
            errno = 0;
            long long v = strtoll(s->p, &end, b ? (int)as_index(r, *b) : 10);
            if (s->n && !*end && errno != ERANGE) return mk_int(v);
            double x = strtod(s->p, &end);
            if (s->n && !*end && isfinite(x) && fabs(x) < 9.2e18) return mk_int((int64_t)x);
        }
        return def;
    }
    if (!strcmp(f, "float")) {
        P("default");
        value *d = arg(a, 0, "default");
        if (is_num(in)) return mk_float(num_f(in));
        if (in.t == V_STR) {
            jstr *s = strip(r, in.s, NULL, 0, 3).s;
            char *end;
            double x = strtod(s->p, &end);
            if (s->n && !*end) return mk_float(x);
        }
        return d ? *d : mk_float(0);
    }
    if (!strcmp(f, "abs")) {
        P0();
        if (in.t == V_FLOAT) return mk_float(fabs(in.f));
        if (in.t == V_INT || in.t == V_BOOL) {
            if (in.i == INT64_MIN) RFAIL(r, "integer overflow");
            return mk_int(in.i < 0 ? -in.i : in.i);
        }
        RFAIL(r, "bad operand type for abs(): '%s'", type_name(in));
    }
    if (!strcmp(f, "round")) {
        P("precision", "method");
        value *pr = arg(a, 0, "precision"), *m = arg(a, 1, "method");
        int64_t p = pr ? as_index(r, *pr) : 0;
        const char *meth = m ? str_arg(r, m, "round's method") : "common";
        if (!is_num(in)) RFAIL(r, "round: the value is not a number");
        double x = num_f(in), sc = pow(10, (double)p);
        if (!strcmp(meth, "common")) x = round(x * sc) / sc;
        else if (!strcmp(meth, "floor")) x = floor(x * sc) / sc;
        else if (!strcmp(meth, "ceil")) x = ceil(x * sc) / sc;
        else RFAIL(r, "method must be common, ceil or floor");
        return mk_float(x);
    }
    if (!strcmp(f, "indent")) {
        P("width", "first", "blank");
        value *w = arg(a, 0, "width");
        const char *ind;
        if (w && w->t == V_STR) ind = w->s->p;
        else {
            int64_t n = w ? as_index(r, *w) : 4;
            char *sp = falloc(r->f, (size_t)(n > 0 ? n : 0) + 1);
            memset(sp, ' ', (size_t)(n > 0 ? n : 0));
            sp[n > 0 ? n : 0] = 0;
            ind = sp;
        }
        int first = opt_bool(arg(a, 1, "first"), 0), blank = opt_bool(arg(a, 2, "blank"), 0);
        jstr *s = to_s(r, in);
        sb t = {0};
        sb_put(r->f, &t, s->p, s->n), sb_put(r->f, &t, "\n", 1);
        args none = {0};
        jlist *lines = call_str_method(r, str_new(r->f, t.p, t.n), "splitlines", &none).l;
        sb b = {0};
        sb_put(r->f, &b, "", 0);
        if (first) sb_puts(r->f, &b, ind);
        for (size_t i = 0; i < lines->n; i++) {
            jstr *ln = lines->v[i].s;
            if (i) {
                sb_put(r->f, &b, "\n", 1);
                if (blank || ln->n) sb_puts(r->f, &b, ind);
            }
            sb_put(r->f, &b, ln->p, ln->n);
        }
        return sb_value(r->f, &b);
    }
    if (!strcmp(f, "center")) {
        P("width");
        value *w = arg(a, 0, "width");
        int64_t width = w ? as_index(r, *w) : 80;
        jstr *s = to_s(r, in);
        int64_t n = (int64_t)u8_len(s->p, s->n);
        if (width <= n || width > (1 << 20)) return (value){.t = V_STR, .s = s};
        int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
        sb b = {0};
        for (int64_t i = 0; i < left; i++) sb_put(r->f, &b, " ", 1);
        sb_put(r->f, &b, s->p, s->n);
        for (int64_t i = 0; i < pad - left; i++) sb_put(r->f, &b, " ", 1);
        return sb_value(r->f, &b);
    }
    if (!strcmp(f, "wordcount")) {
        P0();
        return mk_int((int64_t)str_split(r, to_s(r, in), NULL, NULL, 0).l->n);
    }
    if (!strcmp(f, "attr")) {
        P("name");
        const char *name = str_arg(r, arg(a, 0, "name"), "attr's name");
        if (in.t == V_NS) return get_attr(r, in, name);
        if (in.t == V_UNDEF) fail_undef(r, in);
        return method_of(r, in, name);
    }
    if (!strcmp(f, "escape") || !strcmp(f, "e") || !strcmp(f, "forceescape")) {
        P0();
        if (in.t == V_STR && in.safe && f[0] != 'f') return in;
        value v = html_escape(r, to_s(r, in));
        v.safe = 1;
        return v;
    }
    if (in_list(k_jinja_filters_missing, f)) RFAIL(r, "the filter '%s' is not supported", f);
    RFAIL(r, "No filter named '%s' found.", f);
    return k_undef;
}
#undef P
#undef P0

static value apply_filter_(R *r, const char *f, value in, args *a) {
    if (in_list(k_text_filters, f)) return filter_text(r, f, in, a);
    if (in_list(k_seq_filters, f)) return filter_seq(r, f, in, a);
    return filter_other(r, f, in, a);
}

static int apply_test(R *r, const char *t, value v, args *a) {
    value *x = arg(a, 0, NULL);
#define NEED_ARG                                                                                                       \
    if (!x) RFAIL(r, "the test '%s' needs an argument", t)
    if (!strcmp(t, "defined")) return v.t != V_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == V_UNDEF;
    if (!strcmp(t, "none")) return v.t == V_NONE;
    if (!strcmp(t, "boolean")) return v.t == V_BOOL;
    if (!strcmp(t, "true")) return v.t == V_BOOL && v.i;
    if (!strcmp(t, "false")) return v.t == V_BOOL && !v.i;
    if (!strcmp(t, "integer")) return v.t == V_INT;
    if (!strcmp(t, "float")) return v.t == V_FLOAT;
    if (!strcmp(t, "number")) return is_num(v);
    if (!strcmp(t, "string")) return v.t == V_STR;
    if (!strcmp(t, "mapping")) return v.t == V_DICT;
    if (!strcmp(t, "iterable")) return v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF;
    if (!strcmp(t, "sequence")) return v.t == V_STR || (v.t == V_LIST && !v.l->gen) || v.t == V_DICT || v.t == V_UNDEF;
    if (!strcmp(t, "callable")) return v.t == V_FUNC;
    if (!strcmp(t, "escaped")) return 0;
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != V_STR) return 0;
        args none = {0};
        return vtrue(call_str_method(r, v.s, t[0] == 'l' ? "islower" : "isupper", &none));
    }
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v.t == V_UNDEF) fail_undef(r, v);
        int64_t n = as_index(r, v), d = t[0] == 'd' ? (x ? as_index(r, *x) : 0) : 2;
        if (t[0] == 'd' && !x) RFAIL(r, "divisibleby needs an argument");
        if (!d) RFAIL(r, "integer division or modulo by zero");
        int64_t m = n % d;
        return t[0] == 'o' ? m != 0 : m == 0;
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) { NEED_ARG; return veq(v, *x); }
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) { NEED_ARG; return !veq(v, *x); }
    if (!strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<")) { NEED_ARG; return vcmp(r, v, *x, "<") < 0; }
    if (!strcmp(t, "le") || !strcmp(t, "<=")) { NEED_ARG; return vcmp(r, v, *x, "<=") <= 0; }
    if (!strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">")) { NEED_ARG; return vcmp(r, v, *x, ">") > 0; }
    if (!strcmp(t, "ge") || !strcmp(t, ">=")) { NEED_ARG; return vcmp(r, v, *x, ">=") >= 0; }
    if (!strcmp(t, "sameas")) {
        NEED_ARG;
        if (v.t != x->t) return 0;
        if (v.t == V_LIST || v.t == V_DICT || v.t == V_NS || v.t == V_FUNC || v.t == V_STR) return v.l == x->l;
        return veq(v, *x);
    }
    if (!strcmp(t, "in")) {
        NEED_ARG;
        value seq = *x;
        if (seq.t == V_STR) {
            if (v.t != V_STR) RFAIL(r, "'in <string>' requires string as left operand, not %s", type_name(v));
            return find_n(seq.s->p, seq.s->n, v.s->p, v.s->n) != NULL;
        }
        if (seq.t == V_DICT) return dict_find(seq.d, v) != NULL;
        jlist *l = iterate(r, seq);
        for (size_t i = 0; i < l->n; i++)
            if (veq(l->v[i], v)) return 1;
        return 0;
    }
#undef NEED_ARG
    if (in_list(k_jinja_tests_missing, t)) RFAIL(r, "the test '%s' is not supported", t);
    RFAIL(r, "No test named '%s' found.", t);
    return 0;
}

/* ---- operators ---- */

static value binop(R *r, int op, value a, value b) {
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.t == V_UNDEF) fail_undef(r, a);
    if (b.t == V_UNDEF) fail_undef(r, b);
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT && op != OP_DIV) {
            int64_t x = a.i, y = b.i, z = 0;
            int ovf = 0;
            switch (op) {
            case OP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
            case OP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
            case OP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
            case OP_FLOORDIV:
            case OP_MOD:
                if (!y) RFAIL(r, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) ovf = 1;
                else {
                    int64_t q = x / y, m = x % y;
                    if (m && ((m < 0) != (y < 0))) q--, m += y;
                    z = op == OP_MOD ? m : q;
                }
                break;
            case OP_POW:
                if (y < 0) return mk_float(pow((double)x, (double)y));
                z = 1;
                for (int64_t i = 0; i < y && !ovf; i++) {
                    ovf = __builtin_mul_overflow(z, x, &z);
                    if (z == 0 || z == 1 || (z == -1 && x == -1)) {
                        if (x == -1) z = (y & 1) ? -1 : 1;
                        break;
                    }
                }
                break;
            }
            if (ovf) RFAIL(r, "integer overflow in %s", sym[op]);
            return mk_int(z);
        }
        double x = num_f(a), y = num_f(b);
        switch (op) {
        case OP_ADD: return mk_float(x + y);
        case OP_SUB: return mk_float(x - y);
        case OP_MUL: return mk_float(x * y);
        case OP_DIV:
            if (y == 0) RFAIL(r, "division by zero");
            return mk_float(x / y);
        case OP_FLOORDIV:
            if (y == 0) RFAIL(r, "float floor division by zero");
            return mk_float(floor(x / y));
        case OP_MOD: {
            if (y == 0) RFAIL(r, "float modulo");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return mk_float(m);
        }
        default: return mk_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        int safe = a.safe || b.safe; /* Markup + str escapes the str */
        if (safe && !a.safe) a = html_escape(r, a.s);
        if (safe && !b.safe) b = html_escape(r, b.s);
        sb s = {0};
        sb_put(r->f, &s, a.s->p, a.s->n), sb_put(r->f, &s, b.s->p, b.s->n);
        value v = sb_value(r->f, &s);
        v.safe = safe;
        return v;
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST && a.l->tuple == b.l->tuple && !a.l->gen && !b.l->gen) {
        jlist *l = list_new(r->f, a.l->n + b.l->n);
        l->tuple = a.l->tuple;
        for (size_t i = 0; i < a.l->n; i++) list_push(r->f, l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) list_push(r->f, l, b.l->v[i]);
        return mk_list(l);
    }
    if (op == OP_MUL && (a.t == V_STR || (a.t == V_LIST && !a.l->gen)) && (b.t == V_INT || b.t == V_BOOL)) {
        size_t unit = a.t == V_STR ? a.s->n : a.l->n;
        int64_t n = b.i < 0 || !unit ? 0 : b.i; /* nothing repeated is nothing, at once */
        if (unit && (uint64_t)n > (r->f->limit / (unit * 16 + 1))) RFAIL(r, "the repeated value is too large");
        if (a.t == V_STR) {
            sb s = {0};
            sb_put(r->f, &s, "", 0);
            for (int64_t i = 0; i < n; i++) sb_put(r->f, &s, a.s->p, a.s->n);
            return sb_value(r->f, &s);
        }
        jlist *l = list_new(r->f, 0);
        l->tuple = a.l->tuple;
        for (int64_t i = 0; i < n; i++)
            for (size_t k = 0; k < a.l->n; k++) list_push(r->f, l, a.l->v[k]);
        return mk_list(l);
    }
    if (op == OP_MUL && (b.t == V_STR || (b.t == V_LIST && !b.l->gen)) && (a.t == V_INT || a.t == V_BOOL)) return binop(r, op, b, a);
    if (op == OP_MOD && a.t == V_STR) RFAIL(r, "printf-style formatting with %% is not supported");
    if (op == OP_ADD && (a.t == V_STR || (a.t == V_LIST && !a.l->gen)))
        RFAIL(r, "can only concatenate %s (not \"%s\") to %s", type_name(a), type_name(b), type_name(a));
    RFAIL(r, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a), type_name(b));
    return k_undef;
}

static int contains(R *r, value seq, value x) {
    if (seq.t == V_UNDEF) return 0;
    if (seq.t == V_STR) {
        if (x.t == V_UNDEF) fail_undef(r, x);
        if (x.t != V_STR) RFAIL(r, "'in <string>' requires string as left operand, not %s", type_name(x));
        return find_n(seq.s->p, seq.s->n, x.s->p, x.s->n) != NULL;
    }
    if (seq.t == V_DICT) return dict_find(seq.d, x) != NULL;
    if (seq.t == V_LIST) {
        jlist *l = iterate(r, seq);
        for (size_t i = 0; i < l->n; i++)
            if (veq(l->v[i], x)) return 1;
        return 0;
    }
    RFAIL(r, "argument of type '%s' is not iterable", type_name(seq));
    return 0;
}

/* ---- names, calls ---- */

static value lookup(R *r, const char *name) {
    for (frame *f = r->fr; f; f = f->up) {
        value *v = dict_find_s(f->vars, name);
        if (v) return *v;
    }
    return undef_msg(r, "'%s' is undefined", name);
}

static frame *frame_new(R *r, frame *up) {
    frame *f = falloc(r->f, sizeof *f);
    f->up = up, f->vars = dict_new(r->f);
    return f;
}

static void exec_body(R *r, const nlist *b);

static void step(R *r) {
    if (++r->steps > r->max_steps)
        RFAIL(r, "the template ran more than %zu steps (loop iterations and macro calls)", r->max_steps);
}

static value call_macro(R *r, jfunc *fn, args *a) {
    const node *m = fn->m;
    if (a->np > m->x.n) RFAIL(r, "macro '%s' takes not more than %zu argument(s)", m->s, m->x.n);
    for (size_t k = 0; k < a->nk; k++) {
        size_t i = 0;
        while (i < m->x.n && strcmp(m->kw[i], a->kn[k])) i++;
        if (i == m->x.n) RFAIL(r, "macro '%s' takes no keyword argument '%s'", m->s, a->kn[k]);
        if (i < a->np) RFAIL(r, "macro '%s' got multiple values for argument '%s'", m->s, a->kn[k]);
    }
    step(r);
    frame *saved = r->fr;
    sb *saved_out = r->out;
    frame *f = frame_new(r, fn->scope);
    r->fr = f;
    for (size_t i = 0; i < m->x.n; i++) {
        value *v = arg(a, i, m->kw[i]);
        value x = v ? *v : m->x.v[i] ? ev(r, m->x.v[i]) : undef_msg(r, "parameter '%s' was not provided", m->kw[i]);
        dict_set_s(r->f, f->vars, m->kw[i], x);
    }
    sb out = {0};
    sb_put(r->f, &out, "", 0);
    r->out = &out;
    exec_body(r, &m->y);
    r->ctl = 0;
    r->fr = saved, r->out = saved_out;
    return sb_value(r->f, &out);
}

static value call_global(R *r, const char *name, args *a) {
    if (!strcmp(name, "raise_exception")) {
        value *m = arg(a, 0, "message");
        if (!m) RFAIL(r, "raise_exception() missing 1 required positional argument: 'message'");
        jstr *s = to_s(r, *m);
        fail_at(r->f, BT_ERR_ABORTED, (size_t)-1, "%s",
                s->n ? s->p : "the template raised an exception without a message");
    }
    if (!strcmp(name, "strftime_now")) {
        static const char *const p[] = {"format", NULL};
        arg_check(r, a, name, p);
        const char *fmt = str_arg(r, arg(a, 0, "format"), "strftime_now's format");
        time_t t = r->now ? (time_t)r->now : time(NULL);
        struct tm tm;
        if (!localtime_r(&t, &tm)) RFAIL(r, "strftime_now: the time cannot be converted");
        char buf[512];
        size_t n = *fmt ? strftime(buf, sizeof buf, fmt, &tm) : 0;
        if (!n && *fmt) RFAIL(r, "strftime_now: the formatted date is too long");
        return mk_str(r->f, buf, n);
    }
    if (!strcmp(name, "range")) {
        if (a->nk) RFAIL(r, "range() takes no keyword arguments");
        if (!a->np || a->np > 3) RFAIL(r, "range expected 1 to 3 arguments, got %zu", a->np);
        int64_t lo = 0, hi, st = 1;
        if (a->np == 1) hi = as_index(r, a->pos[0]);
        else lo = as_index(r, a->pos[0]), hi = as_index(r, a->pos[1]);
        if (a->np == 3) st = as_index(r, a->pos[2]);
        if (!st) RFAIL(r, "range() arg 3 must not be zero");
        jlist *l = list_new(r->f, 0);
        for (int64_t i = lo; st > 0 ? i < hi : i > hi;) {
            if (l->n >= 100000) RFAIL(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            list_push(r->f, l, mk_int(i));
            if (__builtin_add_overflow(i, st, &i)) break;
        }
        return mk_list(l);
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        jdict *d = dict_new(r->f);
        if (a->np > 1) RFAIL(r, "%s expected at most 1 argument, got %zu", name, a->np);
        if (a->np) {
            if (a->pos[0].t != V_DICT) RFAIL(r, "%s: the argument must be a mapping", name);
            for (size_t i = 0; i < a->pos[0].d->n; i++) dict_set(r->f, d, a->pos[0].d->k[i], a->pos[0].d->v[i]);
        }
        for (size_t k = 0; k < a->nk; k++) dict_set_s(r->f, d, a->kn[k], a->kv[k]);
        return (value){.t = name[0] == 'n' ? V_NS : V_DICT, .d = d};
    }
    RFAIL(r, "the global function '%s' is not supported", name);
    return k_undef;
}

static value call_value(R *r, value fn, args *a) {
    if (fn.t == V_UNDEF) fail_undef(r, fn);
    if (fn.t != V_FUNC) RFAIL(r, "'%s' object is not callable", type_name(fn));
    switch (fn.fn->kind) {
    case FN_GLOBAL: return call_global(r, fn.fn->name, a);
    case FN_MACRO: return call_macro(r, fn.fn, a);
    case FN_METHOD: return call_method(r, fn.fn, a);
    case FN_CYCLE: { /* loop.cycle(a, b, ...): the argument at loop.index0 modulo their number */
        if (!a->np) RFAIL(r, "no items for cycling given");
        int64_t i = fn.fn->self.d->v[1].i;
        return a->pos[(size_t)i % a->np];
    }
    case FN_UNSAFE:
        RFAIL(r, "access to attribute '%s' of '%s' object is unsafe.", fn.fn->name, type_name(fn.fn->self));
        break;
    default: RFAIL(r, "the %s method '%s' is not supported", type_name(fn.fn->self), fn.fn->name);
    }
    return k_undef;
}

/* ---- evaluation ---- */

static value ev(R *r, const node *e) {
    if (++r->depth > BT_JINJA_MAX_DEPTH) RFAIL(r, "nested too deep (more than %d levels of calls)", BT_JINJA_MAX_DEPTH);
    r->off = e->off;
    value v = k_undef;
    switch (e->k) {
    case E_LIT: v = e->lit; break;
    case E_NAME: v = lookup(r, e->s); break;
    case E_LIST:
    case E_TUPLE: {
        jlist *l = list_new(r->f, e->x.n);
        l->tuple = e->k == E_TUPLE;
        for (size_t i = 0; i < e->x.n; i++) list_push(r->f, l, ev(r, e->x.v[i]));
        v = mk_list(l);
        break;
    }
    case E_DICT: {
        jdict *d = dict_new(r->f);
        for (size_t i = 0; i < e->x.n; i++) {
            value k = ev(r, e->x.v[i]);
            if (k.t == V_LIST && !k.l->tuple) RFAIL(r, "unhashable type: 'list'");
            if (k.t == V_DICT || k.t == V_NS) RFAIL(r, "unhashable type: '%s'", type_name(k));
            dict_set(r->f, d, k, ev(r, e->y.v[i]));
        }
        v = (value){.t = V_DICT, .d = d};
        break;
    }
    case E_ATTR: {
        value o = ev(r, e->a);
        r->off = e->off;
        v = get_attr(r, o, e->s);
        break;
    }
    case E_ITEM: {
        value o = ev(r, e->a);
        if (e->b->k == E_SLICE) {
            const node *s = e->b;
            value a = s->a ? ev(r, s->a) : k_none, b = s->b ? ev(r, s->b) : k_none, c = s->c ? ev(r, s->c) : k_none;
            r->off = e->off;
            v = do_slice(r, o, a, b, c);
        } else {
            value k = ev(r, e->b);
            r->off = e->off;
            v = get_item(r, o, k);
        }
        break;
    }
    case E_CALL: {
        value fn = ev(r, e->a);
        args a = eval_args(r, e);
        r->off = e->off;
        v = call_value(r, fn, &a);
        break;
    }
    case E_FILTER: {
        value in = ev(r, e->a);
        args a = eval_args(r, e);
        r->off = e->off;
        v = apply_filter(r, e->s, in, &a);
        break;
    }
    case E_TEST: {
        value in = ev(r, e->a);
        args a = eval_args(r, e);
        r->off = e->off;
        v = mk_bool(apply_test(r, e->s, in, &a) != e->flag);
        break;
    }
    case E_BIN: {
        value a = ev(r, e->a), b = ev(r, e->b);
        r->off = e->off;
        v = binop(r, e->flag, a, b);
        break;
    }
    case E_NEG:
    case E_POS: {
        value a = ev(r, e->a);
        r->off = e->off;
        if (a.t == V_UNDEF) fail_undef(r, a);
        if (!is_num(a)) RFAIL(r, "bad operand type for unary %c: '%s'", e->k == E_NEG ? '-' : '+', type_name(a));
        if (e->k == E_POS) v = a.t == V_BOOL ? mk_int(a.i) : a;
        else if (a.t == V_FLOAT) v = mk_float(-a.f);
        else if (a.i == INT64_MIN) RFAIL(r, "integer overflow");
        else v = mk_int(-a.i);
        break;
    }
    case E_NOT: v = mk_bool(!vtrue(ev(r, e->a))); break;
    case E_AND: v = ev(r, e->a), v = vtrue(v) ? ev(r, e->b) : v; break;
    case E_OR: v = ev(r, e->a), v = vtrue(v) ? v : ev(r, e->b); break;
    case E_COND:
        if (vtrue(ev(r, e->a))) v = ev(r, e->b);
        else v = e->c ? ev(r, e->c) : undef_msg(r, "the inline if expression evaluated to false and no else section was defined.");
        break;
    case E_CMP: {
        value left = ev(r, e->a);
        v = mk_bool(1);
        for (size_t i = 0; i < e->x.n; i++) {
            value right = ev(r, e->x.v[i]);
            r->off = e->off;
            int ok;
            switch (e->ops[i]) {
            case OP_EQ: ok = veq(left, right); break;
            case OP_NE: ok = !veq(left, right); break;
            case OP_LT: ok = vcmp(r, left, right, "<") < 0; break;
            case OP_LE: ok = vcmp(r, left, right, "<=") <= 0; break;
            case OP_GT: ok = vcmp(r, left, right, ">") > 0; break;
            case OP_GE: ok = vcmp(r, left, right, ">=") >= 0; break;
            case OP_IN: ok = contains(r, right, left); break;
            default: ok = !contains(r, right, left); break;
            }
            if (!ok) {
                v = mk_bool(0);
                break;
            }
            left = right;
        }
        break;
    }
    case E_CONCAT: {
        sb b = {0};
        sb_put(r->f, &b, "", 0);
        for (size_t i = 0; i < e->x.n; i++) put_str(r, &b, ev(r, e->x.v[i]));
        v = sb_value(r->f, &b);
        break;
    }
    case E_BLOCKVAL: v = r->blockval; break;
    default: RFAIL(r, "this expression cannot be evaluated here");
    }
    r->depth--;
    return v;
}

/* ---- statements ---- */

static void assign(R *r, const node *t, value v) {
    if (t->k == E_NAME) {
        dict_set_s(r->f, r->fr->vars, t->s, v);
    } else if (t->k == E_NSREF) {
        value ns = lookup(r, t->s);
        if (ns.t != V_NS) RFAIL(r, "cannot assign attribute on non-namespace object");
        dict_set(r->f, ns.d, t->b->lit, v);
    } else {
        jlist *l = iterate(r, v);
        if (l->n < t->x.n) RFAIL(r, "not enough values to unpack (expected %zu, got %zu)", t->x.n, l->n);
        if (l->n > t->x.n) RFAIL(r, "too many values to unpack (expected %zu)", t->x.n);
        for (size_t i = 0; i < t->x.n; i++) assign(r, t->x.v[i], l->v[i]);
    }
}

static void exec_for(R *r, const node *n) {
    jlist *items = iterate(r, ev(r, n->a));
    frame *saved = r->fr;
    r->fr = frame_new(r, saved);
    if (n->c) { /* {% for x in xs if cond %}: the loop runs over the items that pass */
        jlist *kept = list_new(r->f, 0);
        for (size_t i = 0; i < items->n; i++) {
            step(r);
            assign(r, n->b, items->v[i]);
            if (vtrue(ev(r, n->c))) list_push(r->f, kept, items->v[i]);
        }
        items = kept;
    }
    jdict *loop = dict_new(r->f);
    static const char *const keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                       "previtem", "nextitem", "depth", "depth0"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) dict_set_s(r->f, loop, keys[k], k_undef);
    dict_set_s(r->f, loop, "cycle", mk_fn(r, FN_CYCLE, "cycle", (value){.t = V_DICT, .d = loop}));
    dict_set_s(r->f, r->fr->vars, "loop", (value){.t = V_DICT, .d = loop});
    int64_t len = (int64_t)items->n;
    for (size_t i = 0; i < items->n; i++) {
        step(r);
        int64_t k = (int64_t)i;
        value *lv = loop->v;
        lv[0] = mk_int(k + 1), lv[1] = mk_int(k), lv[2] = mk_int(len - k), lv[3] = mk_int(len - k - 1);
        lv[4] = mk_bool(i == 0), lv[5] = mk_bool(k == len - 1), lv[6] = mk_int(len);
        lv[7] = i ? items->v[i - 1] : undef_msg(r, "there is no previous item");
        lv[8] = k + 1 < len ? items->v[i + 1] : undef_msg(r, "there is no next item");
        lv[9] = mk_int(1), lv[10] = mk_int(0);
        assign(r, n->b, items->v[i]);
        exec_body(r, &n->x);
        if (r->ctl == 1) {
            r->ctl = 0;
            break;
        }
        r->ctl = 0;
    }
    r->fr = saved;
    if (!items->n) exec_body(r, &n->y);
}

static jstr *render_body(R *r, const nlist *b) {
    sb *saved = r->out;
    sb out = {0};
    sb_put(r->f, &out, "", 0);
    r->out = &out;
    exec_body(r, b);
    r->out = saved;
    return str_new(r->f, out.p, out.n);
}

static void exec(R *r, const node *n) {
    if (++r->depth > BT_JINJA_MAX_DEPTH) RFAIL(r, "nested too deep (more than %d levels of calls)", BT_JINJA_MAX_DEPTH);
    r->off = n->off;
    switch (n->k) {
    case N_TEXT: sb_put(r->f, r->out, n->lit.s->p, n->lit.s->n); break;
    case N_OUT: put_str(r, r->out, ev(r, n->a)); break;
    case N_IF: exec_body(r, vtrue(ev(r, n->a)) ? &n->x : &n->y); break;
    case N_FOR: exec_for(r, n); break;
    case N_SET: assign(r, n->b, ev(r, n->a)); break;
    case N_SETBLOCK:
    case N_FILTERBLOCK: {
        r->blockval = (value){.t = V_STR, .s = render_body(r, &n->x)};
        value v = ev(r, n->a);
        if (n->k == N_SETBLOCK) assign(r, n->b, v);
        else put_str(r, r->out, v);
        break;
    }
    case N_MACRO: {
        value fn = mk_fn(r, FN_MACRO, n->s, k_none);
        fn.fn->m = n, fn.fn->scope = r->fr;
        dict_set_s(r->f, r->fr->vars, n->s, fn);
        break;
    }
    case N_BREAK: r->ctl = 1; break;
    case N_CONTINUE: r->ctl = 2; break;
    case N_BODY: exec_body(r, &n->x); break;
    default: RFAIL(r, "this statement cannot be run here");
    }
    r->depth--;
}

static void exec_body(R *r, const nlist *b) {
    for (size_t i = 0; i < b->n && !r->ctl; i++) exec(r, b->v[i]);
}

/* ---- names of filters and tests ----
 * jinja2 refuses a filter or test it does not know when it compiles the
 * template, unless the use is in an if statement or an inline if (directly:
 * a loop or a macro inside one counts again); there it fails only when run.
 * A filter jinja2 has and baton lacks fails when run. */

static void check_names(parser *P, const node *n, int soft, int depth);

static void check_list(parser *P, const nlist *l, int soft, int depth) {
    for (size_t i = 0; i < l->n; i++) check_names(P, l->v[i], soft, depth);
}

/* also bounds the tree's depth (a.b.c... and 1+1+... build it in loops):
 * what passes here can be walked by the renderer within its own bound */
static void check_names(parser *P, const node *n, int soft, int depth) {
    if (!n) return;
    if (depth > BT_JINJA_MAX_DEPTH)
        fail_at(P->f, BT_ERR_INVALID, n->off, "nested too deep (more than %d levels)", BT_JINJA_MAX_DEPTH);
    depth++;
    if (n->k == E_FILTER && !soft && !in_list(k_filters, n->s) && !in_list(k_jinja_filters_missing, n->s))
        fail_at(P->f, BT_ERR_INVALID, n->off, "No filter named '%s'.", n->s);
    if (n->k == E_TEST && !soft && !in_list(k_tests, n->s) && !in_list(k_jinja_tests_missing, n->s))
        fail_at(P->f, BT_ERR_INVALID, n->off, "No test named '%s'.", n->s);
    int inner = soft;
    if (n->k == N_IF || n->k == E_COND) inner = soft = 1;
    if (n->k == N_FOR) {
        check_names(P, n->a, soft, depth);
        check_names(P, n->b, 0, depth), check_names(P, n->c, 0, depth);
        check_list(P, &n->x, 0, depth), check_list(P, &n->y, 0, depth);
        return;
    }
    if (n->k == N_MACRO || n->k == N_SETBLOCK || n->k == N_FILTERBLOCK) inner = 0;
    check_names(P, n->a, inner, depth), check_names(P, n->b, inner, depth), check_names(P, n->c, inner, depth);
    if (n->k == N_MACRO) {
        for (size_t i = 0; i < n->x.n; i++) check_names(P, n->x.v[i], 0, depth);
    } else check_list(P, &n->x, inner, depth);
    check_list(P, &n->y, inner, depth);
}

/* ---- entry points ---- */

static void set_err(char *err, size_t errlen, const char *msg) {
    if (errlen) snprintf(err, errlen, "%s", msg);
}

enum bt_status bt_jinja_parse(const char *src, size_t n, bt_jinja **out, char *err, size_t errlen) {
    *out = NULL;
    bt_jinja *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    t->src = malloc(n + 1);
    if (!t->src) {
        free(t);
        set_err(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    /* jinja2 reads \r\n and \r as \n, and drops one newline at the end */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            t->src[m++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n') i++;
        } else t->src[m++] = src[i];
    }
    if (m && t->src[m - 1] == '\n') m--;
    t->src[m] = 0;
    t->n = m;
    fail *f = &t->mem;
    f->err = err, f->errlen = errlen, f->src = t->src, f->limit = (size_t)1 << 30;
    if (setjmp(f->jb)) {
        enum bt_status st = f->st;
        bt_jinja_free(t);
        return st;
    }
    lexer L = {f, t->src, m, NULL, 0, 0};
    lex(&L);
    parser P = {f, t->src, L.t, 0, L.nt, 0};
    t->body = parse_body(&P, NULL);
    check_list(&P, &t->body, 0, 0);
    f->err = NULL, f->errlen = 0;
    *out = t;
    return BT_OK;
}

void bt_jinja_free(bt_jinja *t) {
    if (!t) return;
    arena_free(t->mem.head);
    free(t->src);
    free(t);
}

enum bt_status bt_jinja_render(const bt_jinja *t, const char *context_json, const bt_jinja_opts *opts, char **out,
                               size_t *out_n, char *err, size_t errlen) {
    *out = NULL;
    if (out_n) *out_n = 0;
    bt_jinja_opts o = opts ? *opts : (bt_jinja_opts){0};
    fail f = {.err = err, .errlen = errlen, .src = t->src, .limit = o.max_bytes ? o.max_bytes : (size_t)256 << 20};
    R r = {.f = &f, .max_steps = o.max_steps ? o.max_steps : 1000000, .now = o.now};
    if (setjmp(f.jb)) {
        arena_free(f.head);
        return f.st;
    }
    frame *root = frame_new(&r, NULL);
    static const char *const globals[] = {"raise_exception", "strftime_now", "range", "namespace", "dict", "lipsum",
                                          "cycler", "joiner", NULL};
    for (size_t i = 0; globals[i]; i++) dict_set_s(&f, root->vars, globals[i], mk_fn(&r, FN_GLOBAL, globals[i], k_none));
    if (context_json) {
        const char *src = f.src;
        f.src = NULL; /* JSON errors name a byte of the context, not a place in the template */
        jp p = {&f, context_json, 0, strlen(context_json)};
        value ctx = jp_value(&p, 0);
        jp_ws(&p);
        if (p.i != p.n) jp_fail(&p, "text after the value");
        if (ctx.t != V_DICT) jp_fail(&p, "the context is not an object");
        for (size_t i = 0; i < ctx.d->n; i++) dict_set(&f, root->vars, ctx.d->k[i], ctx.d->v[i]);
        f.src = src;
    }
    r.fr = root;
    sb res = {0};
    sb_put(&f, &res, "", 0);
    r.out = &res;
    exec_body(&r, &t->body);
    char *s = malloc(res.n + 1);
    if (!s) fail_at(&f, BT_ERR_NOMEM, (size_t)-1, "out of memory");
    memcpy(s, res.p, res.n + 1);
    *out = s;
    if (out_n) *out_n = res.n;
    arena_free(f.head);
    return BT_OK;
}
