/* vocab_gguf.h - a tokenizer from a GGUF file (tokenizer.ggml.* keys). */
#ifndef BATON_TEXT_VOCAB_GGUF_H
#define BATON_TEXT_VOCAB_GGUF_H

#include <stddef.h>

#include "tokenizer.h"

struct bt_gguf;

/* The tokenizer of an open GGUF file.  The tokenizer copies what it keeps:
 * the file may be closed afterwards.  Errors name the file and the key. */
enum bt_status bt_tokenizer_from_gguf(struct bt_gguf *g, bt_tokenizer **out, char *err, size_t errlen);

/* Open path, build its tokenizer, close it.  chat_template (may be NULL)
 * receives a malloc'd copy of tokenizer.chat_template, or NULL when the file
 * has none. */
enum bt_status bt_tokenizer_load(const char *path, bt_tokenizer **out, char **chat_template, char *err,
                                 size_t errlen);

#endif
