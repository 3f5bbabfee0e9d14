/* grammar.h - context-free grammars over bytes, and the set of parse
 * positions a text reached: what constrained sampling asks of a grammar
 * (may this token come next, is the text complete).
 *
 * A grammar is rules; a rule is alternatives; an alternative is a sequence
 * of elements, each a byte class (a set of bytes) or a reference to a rule.
 * Grammars are built by code (json_schema.c, tool_call.c), not parsed from
 * text.  Bytes, not code points: a token is a byte string and may end in
 * the middle of a character, and a JSON grammar writes UTF-8's rules as byte
 * classes, so no partial-character state is needed.
 *
 * A parse state is a set of stacks, as llama.cpp's llama-grammar: each stack
 * the positions still to match, the top always a byte class; an empty stack
 * means the text so far is a whole sentence.  Everything is bounded (a
 * grammar from a request is untrusted): rules and elements per grammar,
 * stack depth, stacks per state; a byte that would pass a bound is refused,
 * the same way every time.
 *
 * Left recursion (a rule that reaches itself before any byte) is refused by
 * bt_grammar_finish. */
#ifndef BATON_TEXT_GRAMMAR_H
#define BATON_TEXT_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/tensor.h" /* enum bt_status */

#ifndef BT_GRAMMAR_MAX_RULES
#define BT_GRAMMAR_MAX_RULES 65536 /* rules of one grammar */
#endif
#ifndef BT_GRAMMAR_MAX_ELEMS
#define BT_GRAMMAR_MAX_ELEMS (1 << 21) /* elements of one grammar, all rules together */
#endif
#ifndef BT_GRAMMAR_MAX_DEPTH
#define BT_GRAMMAR_MAX_DEPTH 256 /* positions on one stack: how deep a text may nest */
#endif
#ifndef BT_GRAMMAR_MAX_STACKS
#define BT_GRAMMAR_MAX_STACKS 512 /* stacks of one state: how ambiguous a prefix may be */
#endif

typedef struct bt_grammar bt_grammar;

/* ---- building ---- */

bt_grammar *bt_grammar_new(void); /* NULL when out of memory */
void bt_grammar_free(bt_grammar *g);
/* A new rule without alternatives; its id (>= 0), or -1 past a bound or out
 * of memory (bt_grammar_error says which). */
int32_t bt_grammar_add_rule(bt_grammar *g);
/* Start a new alternative of rule r; the elements added to r next go into
 * it (rules are built side by side: each has its own last alternative). */
void bt_grammar_add_alt(bt_grammar *g, int32_t r);
/* Elements appended to rule r's last alternative: the bytes of s[0..n) in
 * order; one byte class [lo, hi]; a class of several ranges (lo[i]..hi[i]),
 * negated or not; a reference to rule target. */
void bt_grammar_add_lit(bt_grammar *g, int32_t r, const char *s, size_t n);
void bt_grammar_add_range(bt_grammar *g, int32_t r, uint8_t lo, uint8_t hi);
void bt_grammar_add_class(bt_grammar *g, int32_t r, const uint8_t *lo, const uint8_t *hi, int n, bool negate);
void bt_grammar_add_ref(bt_grammar *g, int32_t r, int32_t target);
/* A rule of one alternative: e, repeated min..max times (max < 0: no
 * bound), where e is rule `item`; a bounded count builds max - min nested
 * optional rules.  Returns the new rule, or -1 (a bound, out of memory). */
int32_t bt_grammar_repeat(bt_grammar *g, int32_t item, int64_t min, int64_t max);
/* Seal the grammar with root rule `root`: every rule has an alternative,
 * every reference names a rule, no rule is left-recursive, no bound was
 * passed while building.  BT_ERR_INVALID (or BT_ERR_NOMEM) with a message. */
enum bt_status bt_grammar_finish(bt_grammar *g, int32_t root, char *err, size_t errlen);
/* Why building failed ("" when it did not). */
const char *bt_grammar_error(const bt_grammar *g);
int32_t bt_grammar_n_rules(const bt_grammar *g);

/* ---- parsing ---- */

typedef struct bt_grammar_state bt_grammar_state;

/* The state before any byte (NULL when out of memory); g must be finished
 * and outlive it. */
bt_grammar_state *bt_grammar_state_new(const bt_grammar *g);
void bt_grammar_state_free(bt_grammar_state *s);
void bt_grammar_state_copy(bt_grammar_state *dst, const bt_grammar_state *src);
/* out = in after byte c (out != in); false when no stack takes c (out is
 * then empty: the text has left the grammar). */
bool bt_grammar_state_byte(const bt_grammar_state *in, uint8_t c, bt_grammar_state *out);
/* s after bytes[0..n), in place (tmp: scratch of the same grammar); false
 * when some byte was refused (s is then empty). */
bool bt_grammar_state_bytes(bt_grammar_state *s, const char *bytes, size_t n, bt_grammar_state *tmp);
/* The text so far is a whole sentence of the grammar. */
bool bt_grammar_state_complete(const bt_grammar_state *s);
/* No byte can follow (only the end may). */
bool bt_grammar_state_closed(const bt_grammar_state *s);
/* No stack is left: the text is outside the grammar. */
bool bt_grammar_state_empty(const bt_grammar_state *s);
/* a and b hold the same stacks in the same order (then every byte takes
 * them to equal states: what a cache of masks keys on). */
bool bt_grammar_state_equal(const bt_grammar_state *a, const bt_grammar_state *b);
/* A hash of the stacks, equal for equal states. */
uint32_t bt_grammar_state_hash(const bt_grammar_state *s);

/* Whether text[0..n) is a whole sentence of g (for tests and checks). */
bool bt_grammar_match(const bt_grammar *g, const char *text, size_t n);

#endif
