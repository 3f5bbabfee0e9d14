/* chat.h - chat templates: which of the common formats a model's
 * tokenizer.chat_template (a Jinja text) is, found by the marks it contains
 * as llama.cpp's llm_chat_detect_template does, and a list of messages
 * written in that format.  Not a Jinja interpreter: each format is a small
 * function that writes what its Jinja text would. */
#ifndef BATON_TEXT_CHAT_H
#define BATON_TEXT_CHAT_H

#include <stddef.h>

#include "tensor.h" /* enum bt_status */

typedef struct bt_chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} bt_chat_msg;

/* The names baton applies, NULL-terminated ("chatml", "llama3", ...). */
const char *const *bt_chat_template_names(void);

/* The name of the format tmpl is: tmpl itself when it is one of the names,
 * else found by the marks in the Jinja text; NULL when none fits. */
const char *bt_chat_template_detect(const char *tmpl);

/* Write msgs[0..n) in the format of tmpl (a name or a Jinja text) into a
 * malloc'd NUL-terminated *out.  add_assistant: end with the opening of the
 * assistant's turn.  A template baton does not know is BT_ERR_UNSUPPORTED
 * with a message listing the names it knows. */
enum bt_status bt_chat_apply(const char *tmpl, const bt_chat_msg *msgs, size_t n, int add_assistant, char **out,
                             char *err, size_t errlen);

#endif
