/* jinja.h - a Jinja interpreter for chat templates: the subset of Jinja2
 * that models' tokenizer.chat_template texts use, rendered as Hugging Face
 * transformers renders them (jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loopcontrols extension, and the globals
 * raise_exception and strftime_now, tojson as json.dumps with
 * ensure_ascii=False), so a prompt is byte for byte what the model was
 * trained on.
 *
 * The context is a JSON object (messages, tools, add_generation_prompt,
 * bos_token, ...); its values are the template's variables.  A name the
 * context lacks is jinja2's Undefined: false, printed as nothing, an error
 * when its attribute is read.
 *
 * Every failure is one message:
 *  - a template that does not parse, or uses what baton does not implement,
 *    is "LINE:COLUMN: what" at parse time (jinja2 too refuses an unknown
 *    filter or test when it compiles the template);
 *  - an error while rendering (a type error, an undefined's attribute, a
 *    limit passed) is "LINE:COLUMN: what";
 *  - raise_exception(msg) is BT_ERR_ABORTED with msg itself.
 * Loops, recursion, output and memory are bounded (bt_jinja_opts). */
#ifndef BATON_TEXT_JINJA_H
#define BATON_TEXT_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "baton/tensor.h" /* enum bt_status */

typedef struct bt_jinja bt_jinja; /* a parsed template */

typedef struct bt_jinja_opts {
    int64_t now;       /* the time strftime_now formats, seconds since the epoch (local time); 0: the clock's */
    size_t max_steps;  /* loop iterations and macro calls in one render; 0: 1,000,000 */
    size_t max_bytes;  /* memory of one render, output included; 0: 256 MiB */
} bt_jinja_opts;

/* Parse src[0..n).  *out is freed with bt_jinja_free.  A syntax error or an
 * unsupported construct is BT_ERR_INVALID with "LINE:COLUMN: what" in err. */
enum bt_status bt_jinja_parse(const char *src, size_t n, bt_jinja **out, char *err, size_t errlen);

/* Render t with the variables of context_json (a JSON object; NULL: none)
 * into a malloc'd NUL-terminated *out of *out_n bytes (out_n may be NULL).
 * opts may be NULL.  BT_ERR_ABORTED: the template called raise_exception,
 * err holds its message; BT_ERR_INVALID: any other error, "LINE:COLUMN:
 * what"; BT_ERR_NOMEM: out of memory or past max_bytes. */
enum bt_status bt_jinja_render(const bt_jinja *t, const char *context_json, const bt_jinja_opts *opts, char **out,
                               size_t *out_n, char *err, size_t errlen);

void bt_jinja_free(bt_jinja *t);

#endif
