/* constrain.h - a grammar (grammar.h) applied to a vocabulary's tokens:
 * which tokens may come next so that the text stays inside the grammar,
 * and the state after the token sampled.
 *
 * A token's text is its piece (bt_tokenizer_piece without control text).
 * A token whose piece is empty (a control token) is never allowed; an
 * end-of-generation token is allowed only where the caller says the end
 * may come (the grammar complete).  The whole vocabulary's mask walks a
 * byte trie of the pieces with the grammar state, dropping every subtree
 * whose prefix the grammar refuses: a shared prefix is matched once; the
 * last masks are kept by the state they were made in (inside a string
 * without a bound the state repeats token after token). */
#ifndef BATON_TEXT_CONSTRAIN_H
#define BATON_TEXT_CONSTRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar.h"
#include "tokenizer.h"

#ifndef BT_TRIE_MAX_PIECE
#define BT_TRIE_MAX_PIECE 256 /* bytes; a longer token is never allowed under a grammar */
#endif

/* The pieces of a vocabulary as a byte trie (tok must outlive it). */
typedef struct bt_token_trie bt_token_trie;
enum bt_status bt_token_trie_new(const bt_tokenizer *tok, bt_token_trie **out, char *err, size_t errlen);
void bt_token_trie_free(bt_token_trie *t);

/* One output's grammar state over the trie's tokens (g and t must outlive it). */
typedef struct bt_constraint bt_constraint;
bt_constraint *bt_constraint_new(const bt_grammar *g, const bt_token_trie *t); /* NULL: out of memory */
void bt_constraint_free(bt_constraint *c);
/* Control token id (-1: none) counts with its text, which it otherwise
 * lacks (a tool-call mark such as Mistral's "[TOOL_CALLS]"): allowed where
 * the grammar takes that text, which accepting it feeds. */
void bt_constraint_show_token(bt_constraint *c, int32_t id);
/* Whether token id may come next; an end-of-generation token: end_ok. */
bool bt_constraint_allows(bt_constraint *c, int32_t id, bool end_ok);
/* allowed[0..n_vocab) = whether each token may come next. */
void bt_constraint_mask(bt_constraint *c, bool end_ok, uint8_t *allowed);
/* The text goes on with token id's piece (an end-of-generation token: no
 * change).  False when the grammar refuses it (the state is then empty). */
bool bt_constraint_accept(bt_constraint *c, int32_t id);
/* The text goes on with one byte (what a trigger and the bytes after it
 * in a token feed).  False when refused (the state is then empty). */
bool bt_constraint_accept_byte(bt_constraint *c, uint8_t byte);
/* The text so far is a whole sentence of the grammar. */
bool bt_constraint_complete(const bt_constraint *c);
/* No byte can follow: only the end may come. */
bool bt_constraint_closed(const bt_constraint *c);

#endif
