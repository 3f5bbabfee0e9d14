/* tokenizer.h - text to token ids and back, from a model file's vocabulary
 * (the tokenizer.ggml.* keys of GGUF).
 *
 * Two vocabulary types, as llama.cpp names them:
 *   "llama"  SentencePiece-style BPE: merges chosen by token score, a leading
 *            space, spaces written as U+2581, byte fallback tokens <0xXX>;
 *   "gpt2"   byte-level BPE: the text is split by the pre-tokenizer's regular
 *            expressions (PCRE2), each piece's bytes are mapped to printable
 *            code points (GPT-2's bytes_to_unicode) and merged by merge rank.
 * Special tokens (control, user-defined, unknown) are cut out of the text
 * first (control ones only when parse_special is set).
 *
 * The core takes plain arrays (bt_vocab_spec) so that it does not depend on
 * how the file was read; text/vocab_gguf.c fills the spec from a GGUF file.
 * A bt_tokenizer is immutable after creation; tokenize allocates its own
 * scratch, so one tokenizer may be used from several threads.
 */
#ifndef BATON_TEXT_TOKENIZER_H
#define BATON_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "baton/tensor.h" /* enum bt_status */

#define BT_TOKEN_NONE (-1)

/* GGUF tokenizer.ggml.token_type values */
enum bt_token_type {
    BT_TOKEN_TYPE_UNDEFINED = 0,
    BT_TOKEN_TYPE_NORMAL = 1,
    BT_TOKEN_TYPE_UNKNOWN = 2,
    BT_TOKEN_TYPE_CONTROL = 3,
    BT_TOKEN_TYPE_USER_DEFINED = 4,
    BT_TOKEN_TYPE_UNUSED = 5,
    BT_TOKEN_TYPE_BYTE = 6,
};

/* per-token attributes (a set of flags) */
enum bt_token_attr {
    BT_TOKEN_ATTR_UNDEFINED = 0,
    BT_TOKEN_ATTR_UNKNOWN = 1 << 0,
    BT_TOKEN_ATTR_UNUSED = 1 << 1,
    BT_TOKEN_ATTR_NORMAL = 1 << 2,
    BT_TOKEN_ATTR_CONTROL = 1 << 3,
    BT_TOKEN_ATTR_USER_DEFINED = 1 << 4,
    BT_TOKEN_ATTR_BYTE = 1 << 5,
    BT_TOKEN_ATTR_LSTRIP = 1 << 7, /* eat the spaces before it when cut out of text */
    BT_TOKEN_ATTR_RSTRIP = 1 << 8, /* eat the spaces after it */
};

enum bt_vocab_type {
    BT_VOCAB_SPM = 1, /* "llama" */
    BT_VOCAB_BPE = 2, /* "gpt2" */
};

/* A vocabulary as plain arrays.  Strings are (pointer, length), not
 * NUL-terminated; the tokenizer copies what it keeps. */
typedef struct bt_vocab_spec {
    const char *model;        /* tokenizer.ggml.model: "llama" or "gpt2" (NUL-terminated) */
    const char *pre;          /* tokenizer.ggml.pre, or NULL (NUL-terminated) */
    const char *name;         /* general.name or NULL: Phi-3's special tokens strip spaces */
    uint32_t n_tokens;
    const char *const *token_text;
    const uint32_t *token_len;
    const float *scores;      /* n_tokens scores, or NULL (all 0) */
    const int32_t *types;     /* n_tokens enum bt_token_type, or NULL (all normal) */
    uint32_t n_merges;        /* "gpt2" only: "left right", rank = index */
    const char *const *merge_text;
    const uint32_t *merge_len;
    /* special token ids from the file; -1 when the key is absent (then the
     * model type's default is used, as llama.cpp does) */
    int64_t bos_id, eos_id, eot_id, eom_id, unk_id, sep_id, pad_id;
    /* tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix:
     * -1 absent, else 0 or 1 */
    int add_bos, add_eos, add_space_prefix;
} bt_vocab_spec;

/* an all-absent spec: ids -1, flags -1, pointers NULL */
void bt_vocab_spec_init(bt_vocab_spec *spec);

typedef struct bt_tokenizer bt_tokenizer;

/* Build a tokenizer.  A user's error (an unsupported model or pre-tokenizer,
 * a count that does not match, a merge without a space) returns
 * BT_ERR_INVALID / BT_ERR_UNSUPPORTED with one message in err. */
enum bt_status bt_tokenizer_create(const bt_vocab_spec *spec, bt_tokenizer **out, char *err, size_t errlen);
void bt_tokenizer_free(bt_tokenizer *tok);

/* A growable list of token ids; zero-initialise, free with bt_tokens_free. */
typedef struct bt_tokens {
    int32_t *ids;
    size_t n, cap;
} bt_tokens;
void bt_tokens_free(bt_tokens *t);

/* Check that text[0..len) is valid UTF-8 (no overlongs, no surrogates, at
 * most U+10FFFF).  Returns -1 when valid, else the byte offset of the first
 * bad sequence. */
int64_t bt_utf8_check(const char *text, size_t len);

/* Append the ids of text[0..len) to out.  add_special: BOS/EOS as the
 * vocabulary asks (add_bos_token / add_eos_token).  parse_special: text such
 * as "<|im_end|>" becomes its control token; otherwise only user-defined
 * tokens are cut out and control-token text is tokenized as text.
 * Invalid UTF-8 is BT_ERR_INVALID naming the byte offset. */
enum bt_status bt_tokenizer_tokenize(const bt_tokenizer *tok, const char *text, size_t len, int add_special,
                                     int parse_special, bt_tokens *out, char *err, size_t errlen);

/* The bytes a token stands for.  special: also the text of control and
 * unknown tokens (else they are empty).  *len receives the length; the
 * pointer stays valid while tok lives.  An id out of range is empty. */
const char *bt_tokenizer_piece(const bt_tokenizer *tok, int32_t id, int special, size_t *len);

/* The whole text of ids (as llama.cpp's detokenize): the leading space a
 * "llama" vocabulary adds is removed; remove_special drops a leading BOS and
 * a trailing EOS the vocabulary adds; unparse_special prints control tokens.
 * Returns a malloc'd NUL-terminated string (its length in *len), or NULL when
 * out of memory. */
char *bt_tokenizer_detokenize(const bt_tokenizer *tok, const int32_t *ids, size_t n, int remove_special,
                              int unparse_special, size_t *len);

/* Streaming detokenisation: bytes of pieces go in, only whole UTF-8
 * characters come out; a token that ends inside a character prints nothing
 * until the character is complete. */
typedef struct bt_detok_stream {
    unsigned char pending[4];
    int n_pending;
} bt_detok_stream;
void bt_detok_stream_init(bt_detok_stream *s);
/* Feed token id; writes the text now complete into buf (at most cap bytes;
 * cap >= piece length + 4 always suffices) and returns its length, or -needed
 * when cap is too small (nothing consumed then). */
long bt_detok_stream_push(bt_detok_stream *s, const bt_tokenizer *tok, int32_t id, int special, char *buf,
                          size_t cap);
/* What is left at the end of a stream: an incomplete character comes out as
 * U+FFFD per byte.  Returns the length written (cap >= 12 suffices). */
long bt_detok_stream_flush(bt_detok_stream *s, char *buf, size_t cap);

/* ---- what the vocabulary says ---- */
enum bt_vocab_type bt_tokenizer_type(const bt_tokenizer *tok);
const char *bt_tokenizer_pre(const bt_tokenizer *tok); /* the pre-tokenizer's name ("llama-bpe", ...); "" for "llama" */
uint32_t bt_tokenizer_n_tokens(const bt_tokenizer *tok);
int32_t bt_tokenizer_bos(const bt_tokenizer *tok); /* BT_TOKEN_NONE when absent */
int32_t bt_tokenizer_eos(const bt_tokenizer *tok);
int32_t bt_tokenizer_eot(const bt_tokenizer *tok);
int bt_tokenizer_add_bos(const bt_tokenizer *tok);
int bt_tokenizer_add_eos(const bt_tokenizer *tok);
int bt_tokenizer_is_eog(const bt_tokenizer *tok, int32_t id); /* end of generation: EOS, EOT, EOM, ... */
/* The id of a token's exact text, or BT_TOKEN_NONE. */
int32_t bt_tokenizer_find(const bt_tokenizer *tok, const char *text, size_t len);

/* The pre-tokenizer names baton knows, NULL-terminated (for messages). */
const char *const *bt_tokenizer_pre_names(void);

#endif
