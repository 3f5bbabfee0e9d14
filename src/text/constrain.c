/* constrain.c - the vocabulary's byte trie and a grammar state walked over
 * it (constrain.h).
 *
 * Trie: node 0 is the root; each node has its first child and next sibling
 * (a list: the root has up to 256 children, deeper nodes few) and the list
 * of tokens whose piece ends there (tok_next links tokens of one node).
 *
 * The mask's walk meets few distinct grammar states among many trie nodes
 * (inside a string, every node at one depth has the same state), so the
 * states are interned with their transitions by byte: a transition is
 * computed once and then looked up.  The table lives as long as the output
 * and is emptied when full, at the start of a mask. */
#include "constrain.h"
#include "../mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX
/* masks kept per output, by the state they were made in: inside a string
 * without a bound the state repeats token after token */
#define N_CACHED 4
/* distinct states a mask's walk names (each with its 256 transitions; a
 * power of two), and the size of their hash index */
#ifndef BT_CONSTRAIN_MAX_STATES
#define BT_CONSTRAIN_MAX_STATES 2048
#endif
#define MAX_STATES BT_CONSTRAIN_MAX_STATES
#define INDEX_SIZE (2 * MAX_STATES)
_Static_assert((MAX_STATES & (MAX_STATES - 1)) == 0, "BT_CONSTRAIN_MAX_STATES must be a power of two");

struct node {
    uint32_t child, sibling, tok; /* tok: the first token ending here (NONE: none) */
    uint8_t byte;
};

struct bt_token_trie {
    const bt_tokenizer *tok;
    uint32_t n_vocab;
    struct node *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *tok_next; /* [n_vocab] */
    uint8_t *eog;       /* [n_vocab] end-of-generation tokens */
    uint32_t *eog_ids;  /* [n_eog] the same as a list */
    uint32_t n_eog;
    int max_len; /* the longest piece in the trie */
};

struct bt_constraint {
    const bt_grammar *g;
    const bt_token_trie *t;
    bt_grammar_state *cur, *tmp;
    bt_grammar_state *depth[BT_TRIE_MAX_PIECE + 1]; /* the mask's states by depth (made as needed) */
    uint8_t *allowed;                               /* the mask being written */
    struct {
        bt_grammar_state *st; /* NULL: empty entry */
        uint8_t *mask;        /* n_vocab, end-of-generation tokens 0 */
    } cache[N_CACHED];
    int next_slot; /* the entry the next miss replaces */
    /* interned states: st[i] with next[i][byte] (-1 not known yet, -2
     * refused, else the state's index) */
    bt_grammar_state **st;
    int32_t (*next)[256];
    uint32_t *hash;
    int32_t n_st;
    int32_t *index; /* INDEX_SIZE: a state's index + 1, by hash (0: empty) */
    bt_grammar_state *scratch;
    int32_t shown; /* a control token that counts with its text (-1: none); never in the trie */
};

static uint32_t new_node(bt_token_trie *t, uint8_t byte) {
    if (t->n_nodes == t->cap_nodes) {
        uint32_t c = t->cap_nodes ? 2 * t->cap_nodes : 4096;
        struct node *p = realloc(t->nodes, (size_t)c * sizeof *p);
        if (!p) return NONE;
        t->nodes = p;
        t->cap_nodes = c;
    }
    t->nodes[t->n_nodes] = (struct node){NONE, NONE, NONE, byte};
    return t->n_nodes++;
}

enum bt_status bt_token_trie_new(const bt_tokenizer *tok, bt_token_trie **out, char *err, size_t errlen) {
    *out = NULL;
    bt_token_trie *t = calloc(1, sizeof *t);
    if (!t) return bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory for the vocabulary's trie");
    t->tok = tok;
    t->n_vocab = bt_tokenizer_n_tokens(tok);
    t->tok_next = malloc((t->n_vocab ? t->n_vocab : 1) * sizeof *t->tok_next);
    t->eog = calloc(t->n_vocab ? t->n_vocab : 1, 1);
    if (!t->tok_next || !t->eog || new_node(t, 0) == NONE) goto nomem;
    for (uint32_t id = 0; id < t->n_vocab; id++) {
        t->tok_next[id] = NONE;
        t->eog[id] = bt_tokenizer_is_eog(tok, (int32_t)id) != 0;
        t->n_eog += t->eog[id];
        size_t len;
        const char *p = bt_tokenizer_piece(tok, (int32_t)id, 0, &len);
        if (len == 0 || len > BT_TRIE_MAX_PIECE) continue;
        if ((int)len > t->max_len) t->max_len = (int)len;
        uint32_t at = 0;
        for (size_t i = 0; i < len; i++) {
            uint8_t b = (uint8_t)p[i];
            uint32_t c = t->nodes[at].child;
            while (c != NONE && t->nodes[c].byte != b) c = t->nodes[c].sibling;
            if (c == NONE) {
                if ((c = new_node(t, b)) == NONE) goto nomem;
                t->nodes[c].sibling = t->nodes[at].child;
                t->nodes[at].child = c;
            }
            at = c;
        }
        t->tok_next[id] = t->nodes[at].tok;
        t->nodes[at].tok = id;
    }
    if (!(t->eog_ids = malloc((t->n_eog ? t->n_eog : 1) * sizeof *t->eog_ids))) goto nomem;
    for (uint32_t id = 0, k = 0; id < t->n_vocab; id++)
        if (t->eog[id]) t->eog_ids[k++] = id;
    *out = t;
    return BT_OK;
nomem:
    bt_token_trie_free(t);
    return bt_error_printf(err, errlen, BT_ERR_NOMEM, "out of memory for the vocabulary's trie");
}

void bt_token_trie_free(bt_token_trie *t) {
    if (!t) return;
    BT_FREE_ALL(t->nodes, t->tok_next, t->eog, t->eog_ids, t);
}

bt_constraint *bt_constraint_new(const bt_grammar *g, const bt_token_trie *t) {
    bt_constraint *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->g = g;
    c->t = t;
    c->shown = -1;
    c->cur = bt_grammar_state_new(g);
    c->tmp = bt_grammar_state_new(g);
    if (!c->cur || !c->tmp) {
        bt_constraint_free(c);
        return NULL;
    }
    return c;
}

void bt_constraint_free(bt_constraint *c) {
    if (!c) return;
    bt_grammar_state_free(c->cur);
    bt_grammar_state_free(c->tmp);
    for (int i = 0; i <= BT_TRIE_MAX_PIECE; i++) bt_grammar_state_free(c->depth[i]);
    for (int i = 0; i < N_CACHED; i++) {
        bt_grammar_state_free(c->cache[i].st);
        free(c->cache[i].mask);
    }
    for (int32_t i = 0; c->st && i < MAX_STATES; i++) bt_grammar_state_free(c->st[i]);
    BT_FREE_ALL(c->st, c->next, c->hash, c->index);
    bt_grammar_state_free(c->scratch);
    free(c);
}

bool bt_constraint_complete(const bt_constraint *c) { return bt_grammar_state_complete(c->cur); }
bool bt_constraint_closed(const bt_constraint *c) { return bt_grammar_state_closed(c->cur); }

void bt_constraint_show_token(bt_constraint *c, int32_t id) { c->shown = id; }

bool bt_constraint_allows(bt_constraint *c, int32_t id, bool end_ok) {
    const bt_token_trie *t = c->t;
    if (id < 0 || (uint32_t)id >= t->n_vocab) return false;
    if (t->eog[id]) return end_ok;
    size_t len;
    const char *p = bt_tokenizer_piece(t->tok, id, id == c->shown, &len);
    if (len == 0 || len > BT_TRIE_MAX_PIECE) return false;
    /* byte by byte between two scratch states, the current one untouched */
    bt_grammar_state *a = c->depth[0], *b = c->depth[1];
    if (!a && !(a = c->depth[0] = bt_grammar_state_new(c->g))) return false;
    if (!b && !(b = c->depth[1] = bt_grammar_state_new(c->g))) return false;
    if (!bt_grammar_state_byte(c->cur, (uint8_t)p[0], a)) return false;
    for (size_t i = 1; i < len; i++) {
        if (!bt_grammar_state_byte(a, (uint8_t)p[i], b)) return false;
        bt_grammar_state *x = a;
        a = b;
        b = x;
    }
    return true;
}

/* the subtree under node at, whose prefix left the grammar in c->depth[d] */
static void mask_walk(bt_constraint *c, uint32_t at, int d) {
    const bt_token_trie *t = c->t;
    if (!c->depth[d + 1] && !(c->depth[d + 1] = bt_grammar_state_new(c->g))) return; /* out of memory: refused */
    for (uint32_t ch = t->nodes[at].child; ch != NONE; ch = t->nodes[ch].sibling) {
        if (!bt_grammar_state_byte(c->depth[d], t->nodes[ch].byte, c->depth[d + 1])) continue;
        for (uint32_t id = t->nodes[ch].tok; id != NONE; id = t->tok_next[id]) c->allowed[id] = 1;
        if (t->nodes[ch].child != NONE && d + 1 < BT_TRIE_MAX_PIECE) mask_walk(c, ch, d + 1);
    }
}

/* s's index among the interned states, interned now if new; -1 when the
 * table is full or out of memory */
static int32_t intern(bt_constraint *c, const bt_grammar_state *s) {
    const uint32_t h = bt_grammar_state_hash(s);
    uint32_t k = h & (INDEX_SIZE - 1);
    for (; c->index[k]; k = (k + 1) & (INDEX_SIZE - 1)) {
        int32_t i = c->index[k] - 1;
        if (c->hash[i] == h && bt_grammar_state_equal(c->st[i], s)) return i;
    }
    if (c->n_st == MAX_STATES) return -1;
    int32_t i = c->n_st;
    if (!c->st[i] && !(c->st[i] = bt_grammar_state_new(c->g))) return -1;
    bt_grammar_state_copy(c->st[i], s);
    c->hash[i] = h;
    for (int b = 0; b < 256; b++) c->next[i][b] = -1;
    c->index[k] = i + 1;
    c->n_st++;
    return i;
}

/* the interned states' table, made or emptied (false: out of memory) */
static bool intern_reset(bt_constraint *c) {
    if (!c->st) {
        c->st = calloc(MAX_STATES, sizeof *c->st);
        c->next = malloc(MAX_STATES * sizeof *c->next);
        c->hash = malloc(MAX_STATES * sizeof *c->hash);
        c->index = calloc(INDEX_SIZE, sizeof *c->index);
        c->scratch = bt_grammar_state_new(c->g);
        if (!c->st || !c->next || !c->hash || !c->index || !c->scratch) return false;
    } else if (c->n_st > MAX_STATES / 2) {
        memset(c->index, 0, INDEX_SIZE * sizeof *c->index);
        c->n_st = 0;
    }
    return true;
}

/* the subtree under node at, whose prefix left the grammar in interned
 * state i; a state the full table cannot name continues by the plain walk */
static void mask_walk_interned(bt_constraint *c, uint32_t at, int32_t i, int d) {
    const bt_token_trie *t = c->t;
    for (uint32_t ch = t->nodes[at].child; ch != NONE; ch = t->nodes[ch].sibling) {
        const uint8_t b = t->nodes[ch].byte;
        int32_t nx = c->next[i][b];
        if (nx == -1) {
            if (!bt_grammar_state_byte(c->st[i], b, c->scratch)) {
                nx = c->next[i][b] = -2;
            } else if ((nx = intern(c, c->scratch)) >= 0) {
                c->next[i][b] = nx;
            } else { /* no room: this subtree the plain way, from the state just made */
                if (!c->depth[d + 1] && !(c->depth[d + 1] = bt_grammar_state_new(c->g))) continue;
                bt_grammar_state_copy(c->depth[d + 1], c->scratch);
                for (uint32_t id = t->nodes[ch].tok; id != NONE; id = t->tok_next[id]) c->allowed[id] = 1;
                if (t->nodes[ch].child != NONE && d + 1 < BT_TRIE_MAX_PIECE) mask_walk(c, ch, d + 1);
                continue;
            }
        }
        if (nx < 0) continue;
        for (uint32_t id = t->nodes[ch].tok; id != NONE; id = t->tok_next[id]) c->allowed[id] = 1;
        if (t->nodes[ch].child != NONE && d + 1 < BT_TRIE_MAX_PIECE) mask_walk_interned(c, ch, nx, d + 1);
    }
}

/* the bytes of a mask made in state c->cur, kept for when that state comes again (out of memory: not kept) */
static void cache_put(bt_constraint *c, const uint8_t *allowed) {
    const bt_token_trie *t = c->t;
    int k = c->next_slot;
    c->next_slot = (k + 1) % N_CACHED;
    if (!c->cache[k].st && !(c->cache[k].st = bt_grammar_state_new(c->g))) return;
    if (!c->cache[k].mask && !(c->cache[k].mask = malloc(t->n_vocab ? t->n_vocab : 1))) return;
    bt_grammar_state_copy(c->cache[k].st, c->cur);
    memcpy(c->cache[k].mask, allowed, t->n_vocab);
}

void bt_constraint_mask(bt_constraint *c, bool end_ok, uint8_t *allowed) {
    const bt_token_trie *t = c->t;
    int hit = -1;
    for (int k = 0; k < N_CACHED && hit < 0; k++)
        if (c->cache[k].st && c->cache[k].mask && bt_grammar_state_equal(c->cache[k].st, c->cur)) hit = k;
    if (hit >= 0) {
        memcpy(allowed, c->cache[hit].mask, t->n_vocab);
    } else {
        memset(allowed, 0, t->n_vocab);
        c->allowed = allowed;
        int32_t root = intern_reset(c) ? intern(c, c->cur) : -1;
        if (root >= 0) {
            mask_walk_interned(c, 0, root, 0);
        } else { /* out of memory for the table: the plain walk */
            if (!c->depth[0] && !(c->depth[0] = bt_grammar_state_new(c->g))) return;
            bt_grammar_state_copy(c->depth[0], c->cur);
            mask_walk(c, 0, 0);
        }
        c->allowed = NULL;
        /* an end-of-generation token whose piece shows text is still only an end */
        for (uint32_t k = 0; k < t->n_eog; k++) allowed[t->eog_ids[k]] = 0;
        cache_put(c, allowed);
    }
    for (uint32_t k = 0; k < t->n_eog; k++) allowed[t->eog_ids[k]] = end_ok;
    if (c->shown >= 0) allowed[c->shown] = bt_constraint_allows(c, c->shown, end_ok);
}

bool bt_constraint_accept(bt_constraint *c, int32_t id) {
    const bt_token_trie *t = c->t;
    if (id < 0 || (uint32_t)id >= t->n_vocab) return false;
    if (t->eog[id]) return true;
    size_t len;
    const char *p = bt_tokenizer_piece(t->tok, id, id == c->shown, &len);
    return bt_grammar_state_bytes(c->cur, p, len, c->tmp);
}

bool bt_constraint_accept_byte(bt_constraint *c, uint8_t byte) {
    const char b = (char)byte;
    return bt_grammar_state_bytes(c->cur, &b, 1, c->tmp);
}
