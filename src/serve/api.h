/* api.h - the OpenAI API as `baton serve` speaks it: a request body (JSON)
 * parsed and checked into a bt_api_request, and the JSON of responses,
 * stream chunks, model lists and error objects.  Pure functions of their
 * arguments: no model, no sockets (http.c carries the bytes, src/cli/serve_cmd.c runs
 * the model), so every bad request is a unit test.
 *
 * Errors follow OpenAI's shape:
 *   {"error": {"message": "...", "type": "invalid_request_error",
 *              "param": "max_tokens", "code": null}}
 * with the HTTP status beside it (400 bad value, 404 unknown model or path,
 * 413 body too large, ...). */
#ifndef BATON_SERVE_API_H
#define BATON_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../text/chat.h"
#include "../text/grammar.h"
#include "../text/sampler.h"
#include "../text/tool_call.h"

#ifndef BT_API_MAX_TOKENS
#define BT_API_MAX_TOKENS (1 << 24) /* the largest max_tokens taken; a request ends when its context share is full */
#endif
#ifndef BT_API_MAX_BIAS
#define BT_API_MAX_BIAS 1024 /* logit_bias entries per request */
#endif
#ifndef BT_API_MAX_STOPS
#define BT_API_MAX_STOPS 4 /* stop strings per request, as OpenAI */
#endif
#ifndef BT_API_MAX_STOP_LEN
#define BT_API_MAX_STOP_LEN 256 /* bytes per stop string */
#endif
#ifndef BT_API_MAX_EMBD_INPUTS
#define BT_API_MAX_EMBD_INPUTS 2048 /* inputs of one /v1/embeddings request, as OpenAI */
#endif
#ifndef BT_API_MAX_MESSAGES
#define BT_API_MAX_MESSAGES 1024 /* chat messages per request */
#endif

#ifndef BT_API_MAX_TOOLS
#define BT_API_MAX_TOOLS 128 /* tools per request, as OpenAI */
#endif

/* chat: whether and how the model calls tools (tool_choice) */
enum bt_api_tool_choice {
    BT_API_TOOLS_NONE = 0,     /* no tools given, or "none": text only */
    BT_API_TOOLS_AUTO = 1,     /* "auto" (the default with tools): text or calls, as the model writes */
    BT_API_TOOLS_REQUIRED = 2, /* "required": one or more calls, constrained */
    BT_API_TOOLS_NAMED = 3,    /* {"type": "function", "function": {"name": N}}: calls to N, constrained */
};

enum bt_api_kind {
    BT_API_COMPLETION = 0, /* POST /v1/completions */
    BT_API_CHAT = 1,       /* POST /v1/chat/completions */
};

/* An error a client gets: HTTP status, OpenAI error type, the parameter at
 * fault (NULL when none), a code (NULL when none) and the message. */
struct bt_api_error {
    int status;
    const char *type;  /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *param; /* "max_tokens", "messages[2].role", ... (points into param_buf or a literal) */
    const char *code;  /* "model_not_found", "context_length_exceeded", ... or NULL */
    char param_buf[256];
    char message[512];
};
/* Fill e (printf-style message). */
void bt_api_error_set(struct bt_api_error *e, int status, const char *type, const char *param, const char *code,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* What a request may ask, fixed by the server's options. */
struct bt_api_limits {
    const char *model_id;   /* the one model served ("model" must name it) */
    int64_t max_tokens;     /* the largest max_tokens (a sequence's share of the context) */
    uint32_t n_vocab;       /* token ids in a prompt given as ids must be below it */
    int n_slots;            /* the most choices (n) of one request: the sequence slots (0: no limit) */
};

/* A checked request.  Strings are owned (bt_api_request_free). */
struct bt_api_request {
    enum bt_api_kind kind;
    /* completions: the prompt as text, or as token ids (prompt_ids != NULL) */
    char *prompt;
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    /* chat: the messages (role and content owned) */
    bt_chat_msg *msgs;
    char **msg_json;        /* message i as the JSON a Jinja template gets: content as text, a tool call's
                             * arguments as an object (Hugging Face's form), every other field as sent */
    size_t n_msgs;
    bool stream;
    bool include_usage;     /* stream_options.include_usage: a last chunk with the usage */
    int64_t max_tokens;     /* -1: not given (until a stop or the context share is full) */
    bt_sampler_params sampling;
    bool seed_given;
    char *stops[BT_API_MAX_STOPS];
    size_t n_stops;
    bool echo;              /* completions: the prompt before the text */
    int32_t *bias_ids;      /* logit_bias: bias[i] on token bias_ids[i] */
    float *bias;
    size_t n_bias;
    int64_t min_tokens;     /* no end of generation before this many tokens (vLLM's) */
    bool ignore_eos;        /* no end-of-generation token ends it (vLLM's) */
    /* chat: logprobs true, top_logprobs N; completions: logprobs N.  Each
     * generated token's log-probability and its top_logprobs most likely
     * alternatives (0 to BT_MAX_TOP_LOGPROBS) */
    bool logprobs;
    int32_t top_logprobs;
    /* llama-server's cache_prompt (default true): reuse the cells of a
     * prompt prefix still in the cache; false: compute the whole prompt */
    bool cache_prompt;
    /* n: choices, 1 to the server's slots; the prompt is computed once, and
     * choice i samples with seed + i */
    int n;
    /* response_format json_object / json_schema: the grammar the answer
     * follows (json_schema.h), or NULL (text).  The server also puts a
     * tool-call grammar here (tool_choice required or named). */
    bt_grammar *grammar;
    /* chat: tools, checked (each name, each parameters schema compiles),
     * names and schemas owned; tools_json the array as the chat template
     * gets it.  With tool_choice "none" the tools are dropped. */
    struct bt_tool *tools;
    size_t n_tools;
    char *tools_json;
    enum bt_api_tool_choice tool_choice;
    int tool_named;           /* NAMED: the tool's index */
    bool parallel_tool_calls; /* more than one call may come (default true) */
};
void bt_api_request_free(struct bt_api_request *r);

/* Parse and check body[0..len) for kind.  Returns true and fills *out, or
 * false and fills *err (out is then empty, nothing to free).  The sampling
 * defaults are OpenAI's (temperature 1, top_p 1, no top_k, no min_p, no
 * penalties); top_k, min_p and repeat_penalty are accepted as llama.cpp's
 * server does.  A request without a seed gets default_seed. */
bool bt_api_parse(enum bt_api_kind kind, const char *body, size_t len, const struct bt_api_limits *lim,
                  uint64_t default_seed, struct bt_api_request *out, struct bt_api_error *err);

/* ---- what the server sends (malloc'd NUL-terminated JSON; NULL when out of memory) ---- */

/* One token's text as the answer shows it: its bytes (the tokenizer's piece). */
struct bt_api_piece {
    const char *text;
    size_t len;
};
/* The log-probabilities of the tokens an answer or a chunk carries, for a
 * request that asked for them: lp[i] (bt_logprobs, from the batcher) and the
 * text of each token it names (piece[i] for lp[i].id, top[i][k] for
 * lp[i].top_id[k]).  text_offset: completions' offset of the first token in
 * the choice's text, in characters (an echoed prompt counts). */
struct bt_api_logprobs {
    const bt_logprobs *lp;
    const struct bt_api_piece *piece;
    const struct bt_api_piece (*top)[BT_MAX_TOP_LOGPROBS];
    size_t n;
    int64_t text_offset;
};

char *bt_api_error_json(const struct bt_api_error *e);

/* The characters the tokens of lp show (UTF-8 lead bytes): how far a
 * stream's next text_offset moves. */
int64_t bt_api_logprobs_chars(const struct bt_api_logprobs *lp);

/* One finished request: OpenAI's text_completion / chat.completion object.
 * text[0..len) need not be valid UTF-8 (bad bytes become U+FFFD).  lp: the
 * tokens' log-probabilities when the request asked for them (else NULL:
 * "logprobs": null). */
/* The usage object: n_prompt prompt tokens (n_cached of them reused from the
 * cache: prompt_tokens_details.cached_tokens, as OpenAI's) and n_gen
 * generated. */
struct bt_api_usage {
    int64_t n_prompt, n_cached, n_gen;
};
char *bt_api_response_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                           const char *text, size_t len, const char *finish, const struct bt_api_usage *u,
                           const struct bt_api_logprobs *lp);
/* A response of n choices: choice i's text, finish reason and
 * log-probabilities (NULL when not asked) at "index": i. */
struct bt_api_choice {
    const char *text;
    size_t len;
    const char *finish;
    const struct bt_api_logprobs *lp;
};
char *bt_api_response_n_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                             const struct bt_api_choice *ch, size_t n, const struct bt_api_usage *u);
/* A chat answer that calls tools: content (NULL: null) and calls[0..n),
 * each with the id "call_" + the answer's id + "_" + its index, or where
 * the model wrote an id (Mistral) one of 9 letters or digits made from the
 * answer's id and the index; finish_reason "tool_calls". */
char *bt_api_tool_response_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                                const char *content, const struct bt_tool_call *calls, int n,
                                const struct bt_api_usage *u, const struct bt_api_logprobs *lp);
/* How much of a call one tool_calls entry carries: all of it (an answer),
 * or as a stream sends a call in two chunks, as OpenAI's API does: its
 * head (index, id, type, function name, arguments "") then its arguments
 * (index, function.arguments). */
enum bt_api_call_part {
    BT_API_CALL_WHOLE = 0,
    BT_API_CALL_HEAD = 1,
    BT_API_CALL_ARGS = 2,
};
/* A stream chunk whose delta carries part of call number index. */
char *bt_api_tool_chunk_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                             const struct bt_tool_call *call, int index, enum bt_api_call_part part);
/* One stream chunk: text (may be empty), the log-probabilities of the tokens
 * sampled since the last chunk (NULL when not asked), and finish (NULL until
 * the last).  first: a chat chunk carries the assistant's role. */
char *bt_api_chunk_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                        const char *text, size_t len, const struct bt_api_logprobs *lp, const char *finish,
                        bool first);
/* The same for choice index of a request of n > 1 choices. */
char *bt_api_chunk_index_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                              int index, const char *text, size_t len, const struct bt_api_logprobs *lp,
                              const char *finish, bool first);
/* The usage chunk of a stream that asked for it (choices empty). */
char *bt_api_usage_chunk_json(const struct bt_api_request *r, const char *id, int64_t created, const char *model,
                              const struct bt_api_usage *u);
/* GET /v1/models: the one model. */
char *bt_api_models_json(const char *model, int64_t created);
/* GET /v1/models/{id}: the model object /v1/models lists. */
char *bt_api_model_json(const char *model, int64_t created);
/* Whether id names the served model; else a 404 model_not_found in *err
 * (OpenAI's, as a request's unknown "model" gets). */
bool bt_api_model_check(const char *id, const char *model, struct bt_api_error *err);

/* ---- llama-server's POST /tokenize and POST /detokenize ---- */

/* {"content": "text", "add_special": false, "parse_special": true,
 *  "with_pieces": false}, checked.  content owned (bt_api_tokenize_free). */
struct bt_api_tokenize {
    char *content;
    size_t len;
    bool add_special;   /* BOS/EOS as the vocabulary asks */
    bool parse_special; /* control-token text such as "<|end|>" becomes its token */
    bool with_pieces;   /* [{"id", "piece"}] rather than [ids] */
};
bool bt_api_parse_tokenize(const char *body, size_t len, struct bt_api_tokenize *out, struct bt_api_error *err);
void bt_api_tokenize_free(struct bt_api_tokenize *t);
/* {"tokens": [ids]}, each id below lim->n_vocab: *ids (malloc'd; NULL when
 * n is 0) and *n, or false with *err. */
bool bt_api_parse_detokenize(const char *body, size_t len, const struct bt_api_limits *lim, int32_t **ids,
                             size_t *n, struct bt_api_error *err);
/* {"tokens": [ids]}, or with pieces (piece[i] the text of ids[i]) as
 * llama-server gives them: [{"id": n, "piece": "text"}], a piece that is not
 * valid UTF-8 as the array of its byte values. */
char *bt_api_tokenize_json(const int32_t *ids, size_t n, const struct bt_api_piece *piece);
/* {"content": text} (bytes that are not UTF-8 become U+FFFD). */
char *bt_api_detokenize_json(const char *text, size_t len);

/* ---- POST /v1/embeddings ---- */

/* One input: text (tokenized by the server, with BOS as llama-server does)
 * or token ids (ids != NULL). */
struct bt_api_embd_input {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n_ids;
};
/* {"model", "input": "text" | ["text", ...] | [ids] | [[ids], ...],
 *  "encoding_format": "float" | "base64"}, checked; "dimensions" is
 * refused, "user" and unknown fields ignored.  Owned
 * (bt_api_embeddings_free). */
struct bt_api_embeddings {
    struct bt_api_embd_input *in;
    size_t n;
    bool base64; /* each vector as the base64 of its little-endian float32 bytes */
};
bool bt_api_parse_embeddings(const char *body, size_t len, const struct bt_api_limits *lim,
                             struct bt_api_embeddings *out, struct bt_api_error *err);
void bt_api_embeddings_free(struct bt_api_embeddings *e);
/* OpenAI's list of n embedding objects (vec[i]: n_embd floats) with usage
 * (n_prompt tokens in all). */
char *bt_api_embeddings_json(const char *model, const float *const *vec, size_t n, int64_t n_embd, bool base64,
                             int64_t n_prompt);

#endif
