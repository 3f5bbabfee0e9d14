/* tool_call.h - the way a chat template asks a model to call tools: which
 * format it uses (found in the template's text), the grammar of a reply
 * that calls them (each call's arguments following the tool's parameters
 * schema), and a reply parsed back into calls.
 *
 * Formats:
 *   - Hermes (NousResearch Hermes 2 Pro / 3, Qwen2.5, Qwen3, QwQ, SmolLM3,
 *     ...): a template that mentions "<tool_call>"; each call is
 *       <tool_call>
 *       {"name": "NAME", "arguments": {...}}
 *       </tool_call>
 *     and several calls follow one another.
 *   - Llama 3.1 / 3.2 / 3.3: a template that has an "ipython" header
 *     ("<|start_header_id|>ipython<|end_header_id|>"); one call, the reply
 *       {"name": "NAME", "parameters": {...}}
 *     (a leading "<|python_tag|>" and a "type": "function" member taken
 *     too when parsing; the template allows a single call).  Not
 *     functionary v3.1's template, which has the header and "<function=".
 *   - Mistral, JSON list (Mistral-Nemo): a template with "[TOOL_CALLS]" but
 *     no "[ARGS]"; the calls in one list, each with an id of 9 letters or
 *     digits that the model writes
 *       [TOOL_CALLS][{"name": "NAME", "arguments": {...}, "id": "a1b2c3d4e"}, ...]
 *   - Mistral, [ARGS] (Devstral, Ministral 3, Magistral): "[TOOL_CALLS]"
 *     and "[ARGS]"; each call
 *       [TOOL_CALLS]NAME[ARGS]{...}
 *   - Mistral, [CALL_ID] (Mistral-Small-3.2): "[TOOL_CALLS]", "[ARGS]" and
 *     "[CALL_ID]"; each call with an id the model writes
 *       [TOOL_CALLS]NAME[CALL_ID]a1b2c3d4e[ARGS]{...}
 * Detection looks for these marks in that order (Hermes first: the
 * Hermes-3 Llama-3.1 templates speak of ipython too). */
#ifndef BATON_TEXT_TOOL_CALL_H
#define BATON_TEXT_TOOL_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

#ifndef BT_TOOL_MAX_CALLS
#define BT_TOOL_MAX_CALLS 8 /* calls in one reply when parallel calls are allowed */
#endif

enum bt_tool_format {
    BT_TOOL_FORMAT_NONE = 0,   /* the template shows no format baton knows */
    BT_TOOL_FORMAT_HERMES = 1, /* <tool_call>{"name", "arguments"}</tool_call> */
    BT_TOOL_FORMAT_LLAMA3 = 2,  /* {"name", "parameters"} */
    BT_TOOL_FORMAT_MISTRAL = 3, /* [TOOL_CALLS][{"name", "arguments", "id"}, ...] */
    BT_TOOL_FORMAT_MISTRAL_ARGS = 4,    /* [TOOL_CALLS]NAME[ARGS]{...} */
    BT_TOOL_FORMAT_MISTRAL_CALL_ID = 5, /* [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...} */
};

/* The format of a Jinja chat template's text (NULL: NONE). */
enum bt_tool_format bt_tool_format_detect(const char *template_text);
/* "hermes", "llama3", "mistral", "mistral-args", "mistral-call-id", or "none" */
const char *bt_tool_format_name(enum bt_tool_format f);
/* The text that opens a call in format f ("<tool_call>", "{\"name\"",
 * "[TOOL_CALLS]"; NULL for NONE): with tool_choice "auto" the reply is free
 * until it, then the calls' grammar applies (the grammar's text starts with
 * it). */
const char *bt_tool_format_trigger(enum bt_tool_format f);

/* A tool as a request gives it: its name and its parameters schema (a JSON
 * text; NULL: any object). */
struct bt_tool {
    const char *name;
    const char *params;
};

/* The grammar of a reply of 1..max_calls calls (1 in LLAMA3) in format f to tools[only]
 * (only >= 0) or to any of tools[0..n).  *out owned by the caller
 * (bt_grammar_free).  A parameters schema that does not compile is
 * BT_ERR_INVALID with the tool's index in *bad_tool, the path inside its
 * schema in where and the reason in err. */
enum bt_status bt_tool_grammar_build(enum bt_tool_format f, const struct bt_tool *tools, size_t n, int only,
                                     int max_calls, bt_grammar **out, int *bad_tool, char *where, size_t wherelen,
                                     char *err, size_t errlen);

/* A call parsed from a reply: the function's name, its arguments as a
 * compact JSON text, and the id the model wrote (Mistral; NULL: none) (all
 * malloc'd). */
struct bt_tool_call {
    char *name;
    char *arguments;
    char *id;
};
/* The calls in text[0..len) (format f): *calls (malloc'd, n entries) and
 * *content, the text outside the calls with the whitespace around it
 * trimmed (malloc'd; NULL when empty).  Returns the number of calls: 0 when
 * the text has none or one is not well formed (then *content is the whole
 * text, trimmed), -1 when out of memory. */
int bt_tool_calls_parse(enum bt_tool_format f, const char *text, size_t len, struct bt_tool_call **calls,
                        char **content);
void bt_tool_calls_free(struct bt_tool_call *calls, int n);
/* How much of text[0..len) is sure not to be part of a call: the bytes
 * before the first call's opening mark, or before a tail that may still
 * become one (what a stream may show as content at once). */
size_t bt_tool_calls_plain_len(enum bt_tool_format f, const char *text, size_t len);

/* A reply read call by call as it grows (a stream), and whole (the parse
 * above).  Start zeroed. */
struct bt_tool_scan {
    size_t pos;  /* the text before it is read */
    size_t from; /* after a call: text[from..open) lies outside calls, */
    size_t open; /* and the call's own text (its opening mark on) starts at open */
    bool inside; /* Mistral's list: after its "[", before its "]" */
};
/* The next whole call of text[0..len) from s->pos on into *call (its
 * members malloc'd: bt_tool_call_clear frees them).  1: a call (s->pos after it); 0: no call yet (ended: none
 * more; the rest lies outside calls); -1: a call that cannot be whole
 * (ended: its text is not well formed), or out of memory (*oom). */
int bt_tool_scan_next(enum bt_tool_format f, struct bt_tool_scan *s, const char *text, size_t len, bool ended,
                      struct bt_tool_call *call, bool *oom);
void bt_tool_call_clear(struct bt_tool_call *call);

/* A reply as a stream sends it: content as it is written, but for a tail
 * that may still open a call; each call once its text is whole, as its
 * head and then its arguments (the content before it first, unless only
 * whitespace); after the first call, text outside calls waits for the next
 * call or the end, and is sent then unless only whitespace (the syntax of
 * Mistral's list, "," and "]", is none).  A call that is not well formed
 * when the reply ends: the rest of the reply is content (the calls before
 * it stay sent).  Start zeroed; bt_tool_stream_free. */
struct bt_tool_stream {
    struct bt_tool_scan scan;
    struct bt_tool_call call; /* read and not sent yet (name NULL: none) */
    bool head_sent;           /* its head sent, its arguments next */
    bool broken;              /* a call not well formed at the end */
    int n_sent;               /* calls sent whole */
};
/* What comes next of text[0..len) (ended: the reply is whole), *seen the
 * bytes sent or read so far (moved here past text that is sent as
 * nothing): *call, the head (!s->head_sent) or the arguments of s->call,
 * call number s->n_sent; else content text[*seen..returned) when the
 * returned offset is past *seen; else nothing yet (or, ended, nothing
 * more). */
size_t bt_tool_stream_news(enum bt_tool_format f, struct bt_tool_stream *s, const char *text, size_t len, bool ended,
                           size_t *seen, bool *call);
/* The part of s->call that news announced is sent; after its arguments
 * *seen moves past the call's text. */
void bt_tool_stream_call_sent(struct bt_tool_stream *s, size_t *seen);
void bt_tool_stream_free(struct bt_tool_stream *s);

#endif
