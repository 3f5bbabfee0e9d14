/* grammar.c - byte grammars built by code, sealed into one flat array of
 * elements, and parse states as sets of stacks (grammar.h).
 *
 * Layout after bt_grammar_finish: el[] holds every rule's alternatives one
 * after another, each alternative ended by ALT (another follows) or END (the
 * rule's last); a CLASS element names a 256-bit byte set, a REF element a
 * rule.  A stack is positions in el[], its top (the last) the next element
 * to match.  After a byte, the matched position moves on by one; a position
 * that reaches ALT/END is dropped (the alternative is done), so right
 * recursion (a list's tail) does not deepen the stack.
 *
 * Differences from llama.cpp's llama-grammar, on purpose:
 *   - bytes rather than code points (grammar.h says why);
 *   - a stack set is deduplicated as it is built, and every expansion is
 *     bounded (depth, stacks, work per byte); past a bound the branch is
 *     dropped, so a hostile grammar costs bounded time and the outcome is
 *     the same every run. */
#include "grammar.h"
#include "../mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the most rule expansions one byte (or the start) may cost */
#define MAX_WORK (1 << 14)

enum { E_END = 0, E_ALT = 1, E_CLASS = 2, E_REF = 3 };

typedef struct {
    uint32_t type;
    uint32_t arg; /* CLASS: class index; REF: rule id */
} elem;

struct rule_b { /* a rule while it is built */
    elem *el;
    size_t n, cap;
    int n_alt;
};

struct bt_grammar {
    /* building */
    struct rule_b *rb;
    int32_t n_rules, cap_rules;
    size_t n_elems;
    char err[256];
    /* byte classes: 4 x 64 bits each */
    uint64_t *cls;
    uint32_t n_cls, cap_cls;
    int32_t byte_cls[256]; /* the class of one byte, once made (-1: not yet) */
    /* sealed */
    bool done;
    elem *el;
    uint32_t *rule_off; /* [n_rules] first element of each rule */
    int32_t root;
};

struct bt_grammar_state {
    const bt_grammar *g;
    uint32_t n, cap; /* stacks */
    uint32_t *off, *len, *hash;
    uint32_t *pool; /* the stacks' positions, one after another */
    size_t used, cap_pool;
    bool complete; /* an empty stack: the text is a whole sentence */
    int work;
    uint32_t buf[BT_GRAMMAR_MAX_DEPTH + 1]; /* the stack being expanded */
};

static void fail(bt_grammar *g, const char *msg) {
    if (!g->err[0]) snprintf(g->err, sizeof g->err, "%s", msg);
}

static void fail_bound(bt_grammar *g, const char *what, long bound) {
    if (!g->err[0]) snprintf(g->err, sizeof g->err, "the grammar has more than %ld %s", bound, what);
}

bt_grammar *bt_grammar_new(void) {
    bt_grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    for (int i = 0; i < 256; i++) g->byte_cls[i] = -1;
    g->root = -1;
    return g;
}

void bt_grammar_free(bt_grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rules; i++) free(g->rb[i].el);
    BT_FREE_ALL(g->rb, g->cls, g->el, g->rule_off, g);
}

const char *bt_grammar_error(const bt_grammar *g) { return g->err; }
int32_t bt_grammar_n_rules(const bt_grammar *g) { return g->n_rules; }

int32_t bt_grammar_add_rule(bt_grammar *g) {
    BT_ASSERT(!g->done);
    if (g->err[0]) return -1;
    if (g->n_rules >= BT_GRAMMAR_MAX_RULES) {
        fail_bound(g, "rules", BT_GRAMMAR_MAX_RULES);
        return -1;
    }
    if (g->n_rules == g->cap_rules) {
        int32_t c = g->cap_rules ? 2 * g->cap_rules : 64;
        struct rule_b *p = realloc(g->rb, (size_t)c * sizeof *p);
        if (!p) {
            fail(g, "out of memory for the grammar");
            return -1;
        }
        g->rb = p;
        g->cap_rules = c;
    }
    memset(&g->rb[g->n_rules], 0, sizeof g->rb[0]);
    return g->n_rules++;
}

static void push(bt_grammar *g, int32_t r, uint32_t type, uint32_t arg) {
    if (g->err[0]) return;
    BT_ASSERT(r >= 0 && r < g->n_rules);
    struct rule_b *b = &g->rb[r];
    if (g->n_elems >= BT_GRAMMAR_MAX_ELEMS) {
        fail_bound(g, "elements", BT_GRAMMAR_MAX_ELEMS);
        return;
    }
    if (b->n == b->cap) {
        size_t c = b->cap ? 2 * b->cap : 8;
        elem *p = realloc(b->el, c * sizeof *p);
        if (!p) {
            fail(g, "out of memory for the grammar");
            return;
        }
        b->el = p;
        b->cap = c;
    }
    b->el[b->n++] = (elem){type, arg};
    g->n_elems++;
}

void bt_grammar_add_alt(bt_grammar *g, int32_t r) {
    if (g->err[0]) return;
    BT_ASSERT(r >= 0 && r < g->n_rules);
    if (g->rb[r].n_alt++ > 0) push(g, r, E_ALT, 0);
}

/* a class index for bitmap m[4] (a new one each time: classes of one byte are shared) */
static int32_t add_class(bt_grammar *g, const uint64_t m[4]) {
    if (g->err[0]) return -1;
    if (g->n_cls == g->cap_cls) {
        uint32_t c = g->cap_cls ? 2 * g->cap_cls : 64;
        if (c > BT_GRAMMAR_MAX_ELEMS) {
            fail(g, "the grammar has too many byte classes");
            return -1;
        }
        uint64_t *p = realloc(g->cls, (size_t)c * 4 * sizeof *p);
        if (!p) {
            fail(g, "out of memory for the grammar");
            return -1;
        }
        g->cls = p;
        g->cap_cls = c;
    }
    memcpy(g->cls + 4 * (size_t)g->n_cls, m, 4 * sizeof *m);
    return (int32_t)g->n_cls++;
}

static void add_byte(bt_grammar *g, int32_t r, uint8_t c) {
    if (g->byte_cls[c] < 0) {
        uint64_t m[4] = {0};
        m[c >> 6] |= 1ull << (c & 63);
        g->byte_cls[c] = add_class(g, m);
        if (g->byte_cls[c] < 0) return;
    }
    push(g, r, E_CLASS, (uint32_t)g->byte_cls[c]);
}

void bt_grammar_add_lit(bt_grammar *g, int32_t r, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) add_byte(g, r, (uint8_t)s[i]);
}

void bt_grammar_add_class(bt_grammar *g, int32_t r, const uint8_t *lo, const uint8_t *hi, int n, bool negate) {
    uint64_t m[4] = {0};
    for (int i = 0; i < n; i++)
        for (unsigned c = lo[i]; c <= hi[i]; c++) m[c >> 6] |= 1ull << (c & 63);
    if (negate)
        for (int k = 0; k < 4; k++) m[k] = ~m[k];
    int32_t k = add_class(g, m);
    if (k >= 0) push(g, r, E_CLASS, (uint32_t)k);
}

void bt_grammar_add_range(bt_grammar *g, int32_t r, uint8_t lo, uint8_t hi) {
    if (lo == hi)
        add_byte(g, r, lo);
    else
        bt_grammar_add_class(g, r, &lo, &hi, 1, false);
}

void bt_grammar_add_ref(bt_grammar *g, int32_t r, int32_t target) {
    if (g->err[0]) return;
    BT_ASSERT(target >= 0 && target < g->n_rules);
    push(g, r, E_REF, (uint32_t)target);
}

int32_t bt_grammar_repeat(bt_grammar *g, int32_t item, int64_t min, int64_t max) {
    BT_ASSERT(min >= 0 && (max < 0 || max >= min));
    if (min > BT_GRAMMAR_MAX_ELEMS || max > BT_GRAMMAR_MAX_ELEMS) {
        fail(g, "a repetition count past the grammar's size");
        return -1;
    }
    /* tail: item tail | empty (no bound), or item o_{k-1} | empty, k = max - min */
    int32_t tail = -1;
    if (max < 0) {
        tail = bt_grammar_add_rule(g);
        if (tail < 0) return -1;
        bt_grammar_add_alt(g, tail);
        bt_grammar_add_ref(g, tail, item);
        bt_grammar_add_ref(g, tail, tail);
        bt_grammar_add_alt(g, tail);
    } else {
        for (int64_t k = 0; k < max - min; k++) {
            int32_t o = bt_grammar_add_rule(g);
            if (o < 0) return -1;
            bt_grammar_add_alt(g, o);
            bt_grammar_add_ref(g, o, item);
            if (tail >= 0) bt_grammar_add_ref(g, o, tail);
            bt_grammar_add_alt(g, o);
            tail = o;
        }
    }
    int32_t r = bt_grammar_add_rule(g);
    if (r < 0) return -1;
    bt_grammar_add_alt(g, r);
    for (int64_t i = 0; i < min && !g->err[0]; i++) bt_grammar_add_ref(g, r, item);
    if (tail >= 0) bt_grammar_add_ref(g, r, tail);
    return g->err[0] ? -1 : r;
}

/* ---- sealing ---- */

static bool is_end(const elem *e) { return e->type == E_END || e->type == E_ALT; }

/* nullable[r]: rule r can match the empty text.  A worklist, linear in
 * the elements: each alternative counts its references not yet known
 * nullable (a byte class: never), and a rule found nullable lowers the
 * counts of the alternatives that refer to it. */
static bool find_nullable(const bt_grammar *g, bool *nullable) {
    const size_t n_el = g->rule_off[g->n_rules];
    /* alternatives: one per ALT/END element; alt_of[p]: the alternative of element p */
    size_t n_alt = 0, n_ref = 0;
    for (size_t p = 0; p < n_el; p++) n_alt += is_end(&g->el[p]), n_ref += g->el[p].type == E_REF;
    int32_t *left = malloc((n_alt + 1) * sizeof *left), *owner = malloc((n_alt + 1) * sizeof *owner);
    uint32_t *occ_off = calloc((size_t)g->n_rules + 2, sizeof *occ_off), *occ = malloc((n_ref + 1) * sizeof *occ);
    int32_t *queue = malloc(((size_t)g->n_rules + 1) * sizeof *queue);
    bool ok = left && owner && occ_off && occ && queue;
    if (ok) {
        size_t a = 0;
        int32_t r = 0;
        left[0] = 0;
        for (size_t p = 0; p < n_el; p++) { /* references per alternative, and per rule referred to */
            const elem *e = &g->el[p];
            if (e->type == E_REF)
                left[a] += left[a] >= 0, occ_off[e->arg + 1]++;
            else if (e->type == E_CLASS)
                left[a] = -1;
            else {
                owner[a++] = r;
                if (e->type == E_END) r++;
                left[a] = 0;
            }
        }
        for (int32_t k = 0; k < g->n_rules; k++) occ_off[k + 1] += occ_off[k];
        uint32_t *fill = calloc((size_t)g->n_rules + 1, sizeof *fill);
        ok = fill != NULL;
        a = 0;
        for (size_t p = 0; ok && p < n_el; p++) {
            const elem *e = &g->el[p];
            if (e->type == E_REF)
                occ[occ_off[e->arg] + fill[e->arg]++] = (uint32_t)a;
            else if (is_end(e))
                a++;
        }
        free(fill);
        int32_t head = 0, tail = 0;
        for (size_t k = 0; ok && k < n_alt; k++)
            if (left[k] == 0 && !nullable[owner[k]]) nullable[owner[k]] = true, queue[tail++] = owner[k];
        while (ok && head < tail) {
            int32_t t = queue[head++];
            for (uint32_t q = occ_off[t]; q < occ_off[t + 1]; q++) {
                uint32_t k = occ[q];
                if (left[k] > 0 && --left[k] == 0 && !nullable[owner[k]])
                    nullable[owner[k]] = true, queue[tail++] = owner[k];
            }
        }
    }
    BT_FREE_ALL(left, owner, occ_off, occ, queue);
    return ok;
}

/* A rule that reaches itself before matching a byte: an iterative
 * depth-first walk of the "can start with" edges (state 1: on the path,
 * 2: done).  Returns the rule on a cycle, or -1. */
static int32_t find_left_recursion(const bt_grammar *g, const bool *nullable, uint8_t *mark, uint32_t *stk,
                                   uint32_t *at) {
    for (int32_t s = 0; s < g->n_rules; s++) {
        if (mark[s]) continue;
        int32_t top = 0;
        stk[0] = (uint32_t)s;
        at[0] = g->rule_off[s];
        mark[s] = 1;
        while (top >= 0) {
            uint32_t r = stk[top];
            const elem *e = &g->el[at[top]];
            if (e->type == E_END) {
                mark[r] = 2;
                top--;
                continue;
            }
            at[top]++;
            if (e->type != E_REF) { /* a byte or the end of an alternative: skip to the next alternative */
                uint32_t p = at[top] - 1;
                while (!is_end(&g->el[p])) p++;
                at[top] = g->el[p].type == E_ALT ? p + 1 : p;
                continue;
            }
            if (!nullable[e->arg]) { /* what follows in this alternative cannot start it */
                uint32_t p = at[top];
                while (!is_end(&g->el[p])) p++;
                at[top] = g->el[p].type == E_ALT ? p + 1 : p;
            }
            if (mark[e->arg] == 1) return (int32_t)e->arg;
            if (mark[e->arg] == 0) {
                mark[e->arg] = 1;
                stk[++top] = e->arg;
                at[top] = g->rule_off[e->arg];
            }
        }
    }
    return -1;
}

enum bt_status bt_grammar_finish(bt_grammar *g, int32_t root, char *err, size_t errlen) {
    BT_ASSERT(!g->done);
    if (g->err[0]) return bt_error_printf(err, errlen, BT_ERR_INVALID, "%s", g->err);
    if (root < 0 || root >= g->n_rules)
        return bt_error_printf(err, errlen, BT_ERR_INVALID, "grammar: root rule %d of %d", (int)root, (int)g->n_rules);
    g->el = malloc((g->n_elems + (size_t)g->n_rules) * sizeof *g->el);
    g->rule_off = malloc(((size_t)g->n_rules + 1) * sizeof *g->rule_off);
    bool *nullable = calloc((size_t)g->n_rules + 1, sizeof *nullable);
    uint8_t *mark = calloc((size_t)g->n_rules + 1, 1);
    uint32_t *stk = malloc(((size_t)g->n_rules + 1) * sizeof *stk), *at = malloc(((size_t)g->n_rules + 1) * sizeof *at);
    enum bt_status st = BT_OK;
    if (!g->el || !g->rule_off || !nullable || !mark || !stk || !at) {
        st = bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory sealing a grammar of %zu elements", g->n_elems);
        goto out;
    }
    size_t n = 0;
    for (int32_t r = 0; r < g->n_rules; r++) {
        if (g->rb[r].n_alt == 0) {
            st = bt_error_printf(err, errlen, BT_ERR_INVALID, "grammar: rule %d has no alternative", (int)r);
            goto out;
        }
        g->rule_off[r] = (uint32_t)n;
        if (g->rb[r].n) memcpy(g->el + n, g->rb[r].el, g->rb[r].n * sizeof *g->el);
        n += g->rb[r].n;
        g->el[n++] = (elem){E_END, 0};
    }
    g->rule_off[g->n_rules] = (uint32_t)n;
    if (!find_nullable(g, nullable)) {
        st = bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory sealing a grammar of %zu elements", g->n_elems);
        goto out;
    }
    int32_t lr = find_left_recursion(g, nullable, mark, stk, at);
    if (lr >= 0) {
        st = bt_error_printf(err, errlen, BT_ERR_INVALID, "grammar: rule %d is left-recursive", (int)lr);
        goto out;
    }
    g->root = root;
    g->done = true;
out:
    BT_FREE_ALL(nullable, mark, stk, at);
    return st;
}

/* ---- parse states ---- */

static void advance(bt_grammar_state *s, uint32_t L, int depth);

bt_grammar_state *bt_grammar_state_new(const bt_grammar *g) {
    BT_ASSERT(g->done);
    bt_grammar_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->g = g;
    /* the start: each alternative of the root */
    s->work = 0;
    const elem *el = g->el;
    uint32_t p = g->rule_off[g->root];
    for (;;) {
        if (is_end(&el[p])) {
            s->complete = true;
        } else {
            s->buf[0] = p;
            advance(s, 1, 0);
        }
        while (!is_end(&el[p])) p++;
        if (el[p].type == E_END) break;
        p++;
    }
    return s;
}

void bt_grammar_state_free(bt_grammar_state *s) {
    if (!s) return;
    BT_FREE_ALL(s->off, s->len, s->hash, s->pool, s);
}

static bool reserve(bt_grammar_state *s, uint32_t n_stacks, size_t n_pool) {
    if (n_stacks > s->cap) {
        uint32_t c = s->cap ? s->cap : 8;
        while (c < n_stacks) c *= 2;
        uint32_t *o = realloc(s->off, c * sizeof *o);
        if (o) s->off = o;
        uint32_t *l = realloc(s->len, c * sizeof *l);
        if (l) s->len = l;
        uint32_t *h = realloc(s->hash, c * sizeof *h);
        if (h) s->hash = h;
        if (!o || !l || !h) return false;
        s->cap = c;
    }
    if (n_pool > s->cap_pool) {
        size_t c = s->cap_pool ? s->cap_pool : 64;
        while (c < n_pool) c *= 2;
        uint32_t *p = realloc(s->pool, c * sizeof *p);
        if (!p) return false;
        s->pool = p;
        s->cap_pool = c;
    }
    return true;
}

void bt_grammar_state_copy(bt_grammar_state *dst, const bt_grammar_state *src) {
    BT_ASSERT(dst->g == src->g);
    dst->n = dst->used = 0;
    dst->complete = src->complete;
    if (!reserve(dst, src->n, src->used)) return; /* out of memory: an empty state, which refuses every byte */
    if (!src->n) return;
    memcpy(dst->off, src->off, src->n * sizeof *dst->off);
    memcpy(dst->len, src->len, src->n * sizeof *dst->len);
    memcpy(dst->hash, src->hash, src->n * sizeof *dst->hash);
    memcpy(dst->pool, src->pool, src->used * sizeof *dst->pool);
    dst->n = src->n;
    dst->used = src->used;
}

/* stack buf[0..L) (top: a CLASS position) into s, unless it is there already */
static void add_stack(bt_grammar_state *s, uint32_t L) {
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < L; i++) h = (h ^ s->buf[i]) * 16777619u;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->hash[i] == h && s->len[i] == L && !memcmp(s->pool + s->off[i], s->buf, L * sizeof *s->buf)) return;
    if (s->n >= BT_GRAMMAR_MAX_STACKS || !reserve(s, s->n + 1, s->used + L)) return; /* dropped: a bound */
    s->off[s->n] = (uint32_t)s->used;
    s->len[s->n] = L;
    s->hash[s->n] = h;
    memcpy(s->pool + s->used, s->buf, L * sizeof *s->buf);
    s->used += L;
    s->n++;
}

/* Expand stack buf[0..L) until its top is a byte class (or it is empty),
 * into s.  Entries of buf below L-1 are not changed (callers reuse them);
 * buf[L-1] and above are. */
static void advance(bt_grammar_state *s, uint32_t L, int depth) {
    if (depth > 4 * BT_GRAMMAR_MAX_DEPTH || ++s->work > MAX_WORK) return;
    if (L == 0) {
        s->complete = true;
        return;
    }
    const elem *el = s->g->el;
    uint32_t pos = s->buf[L - 1];
    if (el[pos].type == E_CLASS) {
        add_stack(s, L);
        return;
    }
    BT_ASSERT(el[pos].type == E_REF);
    uint32_t L2 = L - 1;
    if (!is_end(&el[pos + 1])) s->buf[L2++] = pos + 1;
    uint32_t p = s->g->rule_off[el[pos].arg];
    for (;;) {
        if (is_end(&el[p])) { /* an empty alternative: what follows; it rewrites buf[L2 - 1], kept here */
            uint32_t keep = L2 ? s->buf[L2 - 1] : 0;
            advance(s, L2, depth + 1);
            if (L2) s->buf[L2 - 1] = keep;
        } else if (L2 < BT_GRAMMAR_MAX_DEPTH) {
            s->buf[L2] = p;
            advance(s, L2 + 1, depth + 1);
        }
        while (!is_end(&el[p])) p++;
        if (el[p].type == E_END) break;
        p++;
    }
}

bool bt_grammar_state_byte(const bt_grammar_state *in, uint8_t c, bt_grammar_state *out) {
    BT_ASSERT(in != out && in->g == out->g);
    const bt_grammar *g = in->g;
    out->n = 0;
    out->used = 0;
    out->complete = false;
    out->work = 0;
    for (uint32_t i = 0; i < in->n; i++) {
        const uint32_t *stk = in->pool + in->off[i];
        uint32_t L = in->len[i], top = stk[L - 1];
        const uint64_t *m = g->cls + 4 * (size_t)g->el[top].arg;
        if (!(m[c >> 6] >> (c & 63) & 1)) continue;
        memcpy(out->buf, stk, (L - 1) * sizeof *stk);
        L--;
        if (!is_end(&g->el[top + 1])) out->buf[L++] = top + 1;
        advance(out, L, 0);
    }
    return out->n > 0 || out->complete;
}

bool bt_grammar_state_bytes(bt_grammar_state *s, const char *bytes, size_t n, bt_grammar_state *tmp) {
    for (size_t i = 0; i < n; i++) {
        bool ok = bt_grammar_state_byte(s, (uint8_t)bytes[i], tmp);
        bt_grammar_state_copy(s, tmp);
        if (!ok) return false;
    }
    return true;
}

bool bt_grammar_state_complete(const bt_grammar_state *s) { return s->complete; }
bool bt_grammar_state_closed(const bt_grammar_state *s) { return s->n == 0; }
bool bt_grammar_state_empty(const bt_grammar_state *s) { return s->n == 0 && !s->complete; }

bool bt_grammar_state_equal(const bt_grammar_state *a, const bt_grammar_state *b) {
    if (a->g != b->g || a->n != b->n || a->complete != b->complete || a->used != b->used) return false;
    if (!a->n) return true;
    return !memcmp(a->len, b->len, a->n * sizeof *a->len) && !memcmp(a->pool, b->pool, a->used * sizeof *a->pool);
}

uint32_t bt_grammar_state_hash(const bt_grammar_state *s) {
    uint32_t h = 2166136261u ^ (s->complete ? 0x9e3779b9u : 0);
    for (uint32_t i = 0; i < s->n; i++) h = (h ^ s->hash[i]) * 16777619u;
    return h;
}

bool bt_grammar_match(const bt_grammar *g, const char *text, size_t n) {
    bt_grammar_state *s = bt_grammar_state_new(g), *t = bt_grammar_state_new(g);
    bool ok = s && t && bt_grammar_state_bytes(s, text, n, t) && bt_grammar_state_complete(s);
    bt_grammar_state_free(s);
    bt_grammar_state_free(t);
    return ok;
}
