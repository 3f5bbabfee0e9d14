/* stop.h - when generation ends, and what of its text may be shown so far:
 * an end-of-generation token (EOS, EOT, ...), a stop string, or the token
 * limit.  Text streams out as tokens come: a character split over tokens
 * waits until it is whole, and text that could be the start of a stop string
 * waits until it is known not to be one (a stop string itself is never
 * shown). */
#ifndef BATON_TEXT_STOP_H
#define BATON_TEXT_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

enum bt_stop_reason {
    BT_STOP_NONE = 0,   /* go on */
    BT_STOP_EOG = 1,    /* an end-of-generation token (not shown) */
    BT_STOP_STRING = 2, /* a stop string appeared (the text ends before it) */
    BT_STOP_LIMIT = 3,  /* max_tokens tokens were generated */
};

typedef struct bt_stopper bt_stopper;

/* stops[0..n_stops): the stop strings (non-empty, valid UTF-8).  max_tokens:
 * the token limit, -1 for none (0 and other negatives are errors, as -n 0). */
enum bt_status bt_stopper_create(const char *const *stops, size_t n_stops, int64_t max_tokens, bt_stopper **out,
                                 char *err, size_t errlen);
void bt_stopper_free(bt_stopper *s);

/* on: an end-of-generation token does not end the output (it shows no
 * text, as every control token): ignore_eos. */
void bt_stopper_set_ignore_eog(bt_stopper *s, int on);
/* Control token id (-1: none) shows its text, as a tool-call mark that is
 * a control token in its vocabulary (Mistral's "[TOOL_CALLS]") must. */
void bt_stopper_show_token(bt_stopper *s, int32_t id);
/* One generated token.  *text / *len: the text that may be shown now (valid
 * until the next call).  After a reason other than BT_STOP_NONE the stopper
 * is done: everything that was held back and belongs to the output has been
 * given. */
enum bt_stop_reason bt_stopper_push(bt_stopper *s, const bt_tokenizer *tok, int32_t id, const char **text,
                                    size_t *len);

#endif
