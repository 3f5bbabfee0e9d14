/* chat.h - chat templates: a model's own (tokenizer.chat_template, or a
 * file's), run by the Jinja interpreter (jinja.h) as transformers runs it;
 * and the common formats written by hand, by name ("chatml", "llama3", ...),
 * for models without a template.  Which of those formats a Jinja text is can
 * be found by the marks it contains, as llama.cpp's llm_chat_detect_template
 * does. */
#ifndef BATON_TEXT_CHAT_H
#define BATON_TEXT_CHAT_H

#include <stddef.h>

#include "baton/tensor.h" /* enum bt_status */
#include "tool_call.h"

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

/* ---- the template a model is chatted with ---- */

typedef struct bt_chat_template bt_chat_template;

/* The template for --chat-template ARG (a name of bt_chat_template_names(),
 * else a file holding a Jinja text) when arg is given; else the model's
 * tokenizer.chat_template (model_tmpl, may be NULL) run as Jinja; else the
 * built-in format `fallback` (NULL: a model without a template is an error).
 * A model template that does not parse falls back to the built-in format
 * its marks show (else `fallback`), with a line in note saying so (note is
 * empty otherwise).  bos and eos: the texts the template gets as bos_token
 * and eos_token (NULL: empty).  Errors name the file and LINE:COLUMN. */
enum bt_status bt_chat_template_choose(const char *arg, const char *model_tmpl, const char *fallback, const char *bos,
                                       const char *eos, bt_chat_template **out, char *note, size_t notelen, char *err,
                                       size_t errlen);

/* "jinja" (the model's or a file's template) or the name of the built-in format. */
const char *bt_chat_template_kind(const bt_chat_template *t);
/* The tool-call format the Jinja text asks for (tool_call.h); NONE for a
 * built-in format, which has no tools. */
enum bt_tool_format bt_chat_template_tools(const bt_chat_template *t);

/* Write msgs[0..n) into a malloc'd NUL-terminated *out.  msg_json (may be
 * NULL; an entry may be NULL): message i as a JSON object, given to a Jinja
 * template in place of its role and content (tool_calls, tool_call_id, name,
 * ...).  tools_json: the tools as a JSON array, or NULL.  add_assistant: end
 * with the opening of the assistant's turn (add_generation_prompt).  A
 * template that raises gives its message in err. */
enum bt_status bt_chat_template_apply(const bt_chat_template *t, const bt_chat_msg *msgs, const char *const *msg_json,
                                      size_t n, const char *tools_json, int add_assistant, char **out, char *err,
                                      size_t errlen);

void bt_chat_template_free(bt_chat_template *t);

#endif
