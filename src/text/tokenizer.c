/* tokenizer.c - the vocabulary (token texts, scores, attributes, merges), the
 * two BPE variants ("llama" by score, "gpt2" by merge rank), the
 * pre-tokenizers (PCRE2 regular expressions), special tokens cut out of text,
 * and token ids back to text.
 *
 * Follows llama.cpp's src/llama-vocab.cpp so that its tokenizer test pairs
 * (models/ggml-vocab-*.gguf.inp/.out) come out exactly.  Differences on
 * purpose:
 *   - the pre-tokenizers run the models' own regular expressions with PCRE2
 *     (UTF, Unicode properties, JIT), not hand-written code-point tables;
 *     several expressions in a list split the pieces of the previous one, and
 *     the text between matches stays a piece of its own (as llama.cpp and the
 *     Hugging Face "Split ... isolated" pre-tokenizer do);
 *   - invalid UTF-8 is an error naming the byte offset, not replaced;
 *   - special-token and EOT detection walks ids in order (llama.cpp walks an
 *     unordered map), so the first matching id wins, the same on every run;
 *   - a special id outside the vocabulary is an error, not a warning;
 *   - so is a NaN score (llama.cpp merges by it, in no defined order).
 */
#define _GNU_SOURCE /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer.h"
#include "../mem.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------ */

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static size_t utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1; /* a stray continuation byte: one unit (only reached for vocabulary text) */
}

int64_t bt_utf8_check(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07, min = 0x10000;
        else return (int64_t)i;
        if (i + n > len) return (int64_t)i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (int64_t)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (int64_t)i;
        i += n;
    }
    return -1;
}

static size_t utf8_put(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* decode one code point at s (valid UTF-8 assumed); *n receives its length */
static uint32_t utf8_get(const unsigned char *s, size_t avail, size_t *n) {
    size_t l = utf8_len(s[0]);
    if (l > avail) l = avail;
    *n = l;
    if (l == 1) return s[0];
    uint32_t cp = s[0] & (0xFF >> (l + 1));
    for (size_t k = 1; k < l; k++) cp = (cp << 6) | (s[k] & 0x3F);
    return cp;
}

/* a growable byte string */
typedef struct {
    char *p;
    size_t n, cap;
} sbuf;

/* A growing array v of *cap elements of elem bytes, n of them in use: v
 * itself while there is room for one more, else v reallocated to twice the
 * room (first elements at the start) and *cap updated; NULL when out of
 * memory (v and *cap unchanged). */
static void *grow(void *v, size_t *cap, size_t n, size_t elem, size_t first) {
    if (n < *cap) return v;
    const size_t c = *cap ? *cap * 2 : first;
    void *p = realloc(v, c * elem);
    if (p) *cap = c;
    return p;
}

static int sbuf_reserve(sbuf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int sbuf_add(sbuf *b, const char *s, size_t n) {
    if (sbuf_reserve(b, n + 1)) return -1;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int tokens_push(bt_tokens *t, int32_t id) {
    int32_t *p = grow(t->ids, &t->cap, t->n, sizeof *p, 64);
    if (!p) return -1;
    t->ids = p;
    t->ids[t->n++] = id;
    return 0;
}

void bt_tokens_free(bt_tokens *t) {
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
}

/* ---- string -> value map (open addressing, FNV-1a) ---------------------- */

typedef struct {
    const char *key; /* points into the tokenizer's pool */
    uint32_t len;
    int32_t value; /* -1: empty slot */
    int32_t aux;
} smap_slot;

typedef struct {
    smap_slot *slots;
    size_t mask;
} smap;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int smap_init(smap *m, size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return -1;
    for (size_t i = 0; i < cap; i++) m->slots[i].value = -1;
    m->mask = cap - 1;
    return 0;
}

/* insert or overwrite (the later entry wins, as llama.cpp's token_to_id) */
static void smap_put(smap *m, const char *key, uint32_t len, int32_t value, int32_t aux) {
    size_t i = hash_bytes(key, len) & m->mask;
    for (;;) {
        smap_slot *s = &m->slots[i];
        if (s->value < 0) {
            s->key = key, s->len = len, s->value = value, s->aux = aux;
            return;
        }
        if (s->len == len && !memcmp(s->key, key, len)) {
            s->value = value, s->aux = aux;
            return;
        }
        i = (i + 1) & m->mask;
    }
}

static const smap_slot *smap_get(const smap *m, const char *key, size_t len) {
    size_t i = hash_bytes(key, len) & m->mask;
    for (;;) {
        const smap_slot *s = &m->slots[i];
        if (s->value < 0) return NULL;
        if (s->len == len && !memcmp(s->key, key, len)) return s;
        i = (i + 1) & m->mask;
    }
}

/* ---- set of 64-bit keys (open addressing; 0 is the empty slot) -------------- */

typedef struct {
    uint64_t *k;
    size_t mask, n;
} u64set;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int u64set_add(u64set *s, uint64_t key) {
    if (2 * (s->n + 1) > s->mask + 1 || !s->k) {
        size_t cap = s->k ? 2 * (s->mask + 1) : 1024;
        uint64_t *k = calloc(cap, sizeof *k);
        if (!k) return -1;
        for (size_t i = 0; s->k && i <= s->mask; i++) {
            if (!s->k[i]) continue;
            size_t j = mix64(s->k[i]) & (cap - 1);
            while (k[j]) j = (j + 1) & (cap - 1);
            k[j] = s->k[i];
        }
        free(s->k);
        s->k = k;
        s->mask = cap - 1;
    }
    size_t j = mix64(key) & s->mask;
    while (s->k[j]) {
        if (s->k[j] == key) return 0;
        j = (j + 1) & s->mask;
    }
    s->k[j] = key;
    s->n++;
    return 0;
}

static int u64set_has(const u64set *s, uint64_t key) {
    if (!s->k) return 0;
    size_t j = mix64(key) & s->mask;
    while (s->k[j]) {
        if (s->k[j] == key) return 1;
        j = (j + 1) & s->mask;
    }
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------ */

/* The models' expressions, as llama.cpp lists them (case-insensitive
 * contractions written out as [sS] so that PCRE2's Unicode case folding of
 * 's' and 'k' to U+017F and U+212A does not apply). */
#define RX_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                              \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                               \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN35                                                                                              \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_PORO " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+"
#define RX_GPT4O                                                                                               \
    RX_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
#define RX_TEKKEN                                                                                              \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[" \
    "\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_DEEPSEEK3                                                                                           \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "         \
    "?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_CJK "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+" /* [一-龥ࠀ-一가-퟿]+ */

static const char *const rx_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL};
static const char *const rx_llama3[] = {RX_LLAMA3, NULL};
static const char *const rx_qwen2[] = {RX_QWEN2, NULL};
static const char *const rx_qwen35[] = {RX_QWEN35, NULL};
static const char *const rx_gpt2[] = {RX_GPT2, NULL};
static const char *const rx_starcoder[] = {"\\p{N}", RX_GPT2, NULL}; /* digits one by one first */
static const char *const rx_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]", NULL};
static const char *const rx_poro[] = {RX_PORO, NULL};
static const char *const rx_viking[] = {RX_PORO, "\\p{N}", NULL};
static const char *const rx_gpt4o[] = {RX_GPT4O, NULL};
static const char *const rx_tekken[] = {RX_TEKKEN, NULL};
static const char *const rx_deepseek_coder[] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}", NULL};
static const char *const rx_deepseek3[] = {"\\p{N}{1,3}", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
                                           RX_DEEPSEEK3, NULL};
/* deepseek-llm: its letter class is spelled out in code-point ranges (as in
 * the model's tokenizer.json) */
static const char *const rx_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6\xbf\xc7\x84-\xca\x93\xca\x95-"
    "\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce"
    "\xa1\xce\xa3-\xcf\xb5\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0-"
    "\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab"
    "\xe1\xb5\xab-\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-"
    "\xe1\xbd\x85\xe1\xbd\x88-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-"
    "\xe1\xbd\xbd\xe1\xbe\x80-\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-"
    "\xe1\xbf\x8c\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac\xe1\xbf\xb2-\xe1\xbf\xb4"
    "\xe1\xbf\xb6-\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-\xe2\x84\x9d"
    "\xe2\x84\xa4\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4\xe2\x84\xb9\xe2\x84\xbc-"
    "\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-"
    "\xe2\xb3\xa4\xe2\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b"
    "\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-"
    "\xef\xac\x86\xef\xac\x93-\xef\xac\x97\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90"
    "\x91\x8f\xf0\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0"
    "\x90\xb3\x80-\xf0\x90\xb3\xb2\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
    "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
    "\\s+$",
    RX_CJK,
    "\\p{N}+",
    NULL};

struct pretok_def {
    const char *names; /* '|'-separated aliases of tokenizer.ggml.pre */
    const char *const *rx;
    int clean_spaces;  /* detokenize removes " ," " ." ... (Hugging Face clean_up_tokenization_spaces) */
    int ignore_merges; /* a piece that is a whole token is taken as it is */
    int add_bos;       /* default when tokenizer.ggml.add_bos_token is absent */
};

static const struct pretok_def k_pretoks[] = {
    {"default", rx_default, 1, 0, 0},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2", rx_llama3, 1, 1, 1},
    {"dbrx|smaug-bpe", rx_llama3, 1, 0, 0},
    {"qwen2|deepseek-r1-qwen|kormo", rx_qwen2, 0, 0, 0},
    {"megrez|stablelm2", rx_qwen2, 1, 0, 0},
    {"qwen35", rx_qwen35, 0, 0, 0},
    {"gpt-2|phi-2|mpt|olmo|jais|exaone4|jina-es|jina-de|gigachat", rx_gpt2, 1, 0, 0},
    {"starcoder|refact|codeshell|exaone|minerva-7b|mellum2", rx_starcoder, 1, 0, 0},
    {"command-r|smollm", rx_starcoder, 0, 0, 0},
    {"falcon", rx_falcon, 1, 0, 0},
    {"deepseek-llm", rx_deepseek_llm, 0, 0, 0},
    {"deepseek-coder", rx_deepseek_coder, 0, 0, 0},
    {"deepseek-v3", rx_deepseek3, 0, 0, 0},
    {"bloom|gpt3-finnish", rx_poro, 1, 0, 0},
    {"poro-chat", rx_poro, 0, 0, 0},
    {"viking", rx_viking, 0, 0, 0},
    {"gpt-4o|llama4", rx_gpt4o, 0, 0, 0},
    {"tekken", rx_tekken, 0, 1, 1},
};
#define N_PRETOKS (sizeof k_pretoks / sizeof k_pretoks[0])

static const char *const k_pretok_names[] = {
    "default", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
    "smaug-bpe", "qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "qwen35", "gpt-2", "phi-2", "mpt",
    "olmo", "jais", "mellum2", "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "exaone4", "jina-es", "jina-de",
    "gigachat", "command-r", "smollm", "falcon", "deepseek-llm", "deepseek-coder", "deepseek-v3", "bloom",
    "gpt3-finnish", "poro-chat", "viking", "gpt-4o", "llama4", "tekken", NULL};

const char *const *bt_tokenizer_pre_names(void) { return k_pretok_names; }

static int name_in(const char *names, const char *name) {
    size_t n = strlen(name);
    const char *p = names;
    while (*p) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, name, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

/* ---- the tokenizer ------------------------------------------------------- */

#define MAX_RX 8

struct bt_tokenizer {
    enum bt_vocab_type type;
    char pre_name[64];
    uint32_t n_tokens;
    char *pool;           /* every token text, then every merge text */
    const char **text;    /* [n_tokens] into pool */
    uint32_t *len;        /* [n_tokens] */
    float *score;         /* [n_tokens] */
    int32_t *attr;        /* [n_tokens] enum bt_token_attr */
    char **piece;         /* [n_tokens] the bytes each token stands for (special = 1) */
    uint32_t *piece_len;
    smap tok_map;         /* text -> id */
    smap merge_map;       /* "left right" -> rank, aux = length of left */
    int32_t byte_tok[256]; /* "llama": byte b -> <0xXX> (or the 1-byte token), else -1 */
    /* "llama": every pair of adjacent characters inside some token (key
     * cp1 << 21 | cp2, plus 1).  Between two characters that are not such a
     * pair no merge can ever happen, so the text is merged in independent
     * segments cut there: the same result as one pass over the whole text,
     * without a priority queue as long as the text. */
    u64set pairs;
    int32_t *special;     /* control / user-defined / unknown ids, longest text first */
    uint32_t n_special;
    int32_t bos, eos, eot, eom, unk;
    int add_bos, add_eos, add_space_prefix;
    int clean_spaces, ignore_merges;
    uint8_t *eog;         /* [n_tokens] 1 = ends generation */
    /* "gpt2": byte -> code point (GPT-2 bytes_to_unicode), and back */
    char byte_enc[256][2];
    uint8_t byte_enc_len[256];
    int16_t byte_dec[324]; /* code point -> byte, for code points < 324; -1 none */
    pcre2_code *rx[MAX_RX];
    int n_rx;
};

void bt_vocab_spec_init(bt_vocab_spec *spec) {
    memset(spec, 0, sizeof *spec);
    spec->bos_id = spec->eos_id = spec->eot_id = spec->eom_id = spec->unk_id = spec->sep_id = spec->pad_id = -1;
    spec->add_bos = spec->add_eos = spec->add_space_prefix = -1;
}

void bt_tokenizer_free(bt_tokenizer *tok) {
    if (!tok) return;
    for (int i = 0; i < tok->n_rx; i++) pcre2_code_free(tok->rx[i]);
    if (tok->piece)
        for (uint32_t i = 0; i < tok->n_tokens; i++) free(tok->piece[i]);
    BT_FREE_ALL(tok->piece, tok->piece_len, tok->pool, tok->text, tok->len, tok->score, tok->attr, tok->tok_map.slots,
                tok->merge_map.slots, tok->special, tok->eog, tok->pairs.k, tok);
}

static void byte_map_init(bt_tokenizer *t) {
    for (int i = 0; i < 324; i++) t->byte_dec[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        char u[4];
        size_t l = utf8_put(cp, u);
        memcpy(t->byte_enc[b], u, l);
        t->byte_enc_len[b] = (uint8_t)l;
        t->byte_dec[cp] = (int16_t)b;
    }
}

static int32_t find_tok(const bt_tokenizer *t, const char *s, size_t n) {
    const smap_slot *e = smap_get(&t->tok_map, s, n);
    return e ? e->value : BT_TOKEN_NONE;
}

int32_t bt_tokenizer_find(const bt_tokenizer *tok, const char *text, size_t len) { return find_tok(tok, text, len); }

/* the bytes token id stands for, with control/unknown text included (as
 * llama.cpp's token_to_piece(special = true)) */
static int make_piece(bt_tokenizer *t, uint32_t id, sbuf *out) {
    const char *s = t->text[id];
    size_t n = t->len[id];
    int a = t->attr[id];
    out->n = 0;
    if (sbuf_reserve(out, 1)) return -1;
    out->p[0] = 0;
    if (a & (BT_TOKEN_ATTR_UNKNOWN | BT_TOKEN_ATTR_CONTROL | BT_TOKEN_ATTR_USER_DEFINED)) return sbuf_add(out, s, n);
    if (a & BT_TOKEN_ATTR_NORMAL) {
        if (t->type == BT_VOCAB_SPM) {
            /* U+2581 -> ' ' */
            for (size_t i = 0; i < n;) {
                if (i + 3 <= n && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                    if (sbuf_add(out, " ", 1)) return -1;
                    i += 3;
                } else {
                    if (sbuf_add(out, s + i, 1)) return -1;
                    i++;
                }
            }
            return 0;
        }
        /* byte-level: each code point back to its byte */
        for (size_t i = 0; i < n;) {
            size_t l;
            uint32_t cp = utf8_get((const unsigned char *)s + i, n - i, &l);
            if (cp < 324 && t->byte_dec[cp] >= 0) {
                char b = (char)t->byte_dec[cp];
                if (sbuf_add(out, &b, 1)) return -1;
            } else if (sbuf_add(out, s + i, l)) {
                return -1;
            }
            i += l;
        }
        return 0;
    }
    if (a & BT_TOKEN_ATTR_BYTE) {
        unsigned v;
        char b;
        if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && sscanf(s + 3, "%2x", &v) == 1) b = (char)v;
        else if (n >= 1) b = s[0];
        else return 0;
        return sbuf_add(out, &b, 1);
    }
    return 0; /* undefined / unused: nothing */
}

/* special tokens sort longest first, then by id: keys (~len << 32 | id) ascending */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int lower_contains(const char *s, const char *needle) {
    char buf[256];
    size_t n = strlen(s);
    if (n >= sizeof buf) n = sizeof buf - 1;
    for (size_t i = 0; i < n; i++) buf[i] = (char)tolower((unsigned char)s[i]);
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

static enum bt_status check_id(const char *key, int64_t id, uint32_t n, int32_t *out, char *err, size_t errlen) {
    if (id < 0) return BT_OK; /* absent: keep the default */
    if (id >= (int64_t)n) {
        seterr(err, errlen, "tokenizer.ggml.%s = %lld is outside the vocabulary (%u tokens)", key, (long long)id, n);
        return BT_ERR_INVALID;
    }
    *out = (int32_t)id;
    return BT_OK;
}

enum bt_status bt_tokenizer_create(const bt_vocab_spec *spec, bt_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    if (!spec->model) {
        seterr(err, errlen, "tokenizer.ggml.model is missing (no vocabulary in this file)");
        return BT_ERR_INVALID;
    }
    enum bt_vocab_type type;
    if (!strcmp(spec->model, "llama")) type = BT_VOCAB_SPM;
    else if (!strcmp(spec->model, "gpt2")) type = BT_VOCAB_BPE;
    else {
        seterr(err, errlen, "tokenizer.ggml.model '%s' is not supported (baton supports: llama, gpt2)", spec->model);
        return BT_ERR_UNSUPPORTED;
    }
    if (spec->n_tokens == 0 || !spec->token_text || !spec->token_len) {
        seterr(err, errlen, "tokenizer.ggml.tokens is missing or empty");
        return BT_ERR_INVALID;
    }
    if (spec->n_tokens > (1u << 30)) {
        seterr(err, errlen, "tokenizer.ggml.tokens has %u entries (at most %u)", spec->n_tokens, 1u << 30);
        return BT_ERR_INVALID;
    }
    /* the merge order compares scores: a NaN has none */
    for (uint32_t i = 0; spec->scores && i < spec->n_tokens; i++)
        if (isnan(spec->scores[i])) {
            seterr(err, errlen, "tokenizer.ggml.scores[%u] is NaN", i);
            return BT_ERR_INVALID;
        }
    const struct pretok_def *pd = NULL;
    if (type == BT_VOCAB_BPE) {
        const char *pre = spec->pre && spec->pre[0] ? spec->pre : "default";
        for (size_t i = 0; i < N_PRETOKS && !pd; i++)
            if (name_in(k_pretoks[i].names, pre)) pd = &k_pretoks[i];
        if (!pd) {
            seterr(err, errlen, "tokenizer.ggml.pre '%s' is not a pre-tokenizer baton knows (see baton tokenize --help)",
                   pre);
            return BT_ERR_UNSUPPORTED;
        }
        if (spec->n_merges == 0 || !spec->merge_text || !spec->merge_len) {
            seterr(err, errlen, "tokenizer.ggml.merges is missing (a gpt2 vocabulary needs its merges)");
            return BT_ERR_INVALID;
        }
    }

    bt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto nomem;
    t->type = type;
    snprintf(t->pre_name, sizeof t->pre_name, "%s", pd ? (spec->pre && spec->pre[0] ? spec->pre : "default") : "");
    uint32_t n = spec->n_tokens;
    t->n_tokens = n;

    /* pool: token texts (an empty text becomes "[EMPTY_i]" as in llama.cpp) + merges */
    size_t pool_size = 0;
    for (uint32_t i = 0; i < n; i++) pool_size += (spec->token_len[i] ? spec->token_len[i] : 24) + 1;
    if (type == BT_VOCAB_BPE)
        for (uint32_t i = 0; i < spec->n_merges; i++) pool_size += spec->merge_len[i] + 1;
    t->pool = malloc(pool_size);
    t->text = malloc(n * sizeof *t->text);
    t->len = malloc(n * sizeof *t->len);
    t->score = malloc(n * sizeof *t->score);
    t->attr = malloc(n * sizeof *t->attr);
    t->eog = calloc(n, 1);
    t->piece = calloc(n, sizeof *t->piece);
    t->piece_len = calloc(n, sizeof *t->piece_len);
    if (!t->pool || !t->text || !t->len || !t->score || !t->attr || !t->eog || !t->piece || !t->piece_len) goto nomem;
    if (smap_init(&t->tok_map, n)) goto nomem;

    char *p = t->pool;
    for (uint32_t i = 0; i < n; i++) {
        size_t l = spec->token_len[i];
        if (l) memcpy(p, spec->token_text[i], l);
        else l = (size_t)sprintf(p, "[EMPTY_%u]", i);
        p[l] = 0;
        t->text[i] = p;
        t->len[i] = (uint32_t)l;
        p += l + 1;
        t->score[i] = spec->scores ? spec->scores[i] : 0.0f;
        int a = BT_TOKEN_ATTR_NORMAL;
        if (spec->types) {
            switch (spec->types[i]) {
            case BT_TOKEN_TYPE_UNKNOWN: a = BT_TOKEN_ATTR_UNKNOWN; break;
            case BT_TOKEN_TYPE_UNUSED: a = BT_TOKEN_ATTR_UNUSED; break;
            case BT_TOKEN_TYPE_NORMAL: a = BT_TOKEN_ATTR_NORMAL; break;
            case BT_TOKEN_TYPE_CONTROL: a = BT_TOKEN_ATTR_CONTROL; break;
            case BT_TOKEN_TYPE_USER_DEFINED: a = BT_TOKEN_ATTR_USER_DEFINED; break;
            case BT_TOKEN_TYPE_BYTE: a = BT_TOKEN_ATTR_BYTE; break;
            default: a = BT_TOKEN_ATTR_UNDEFINED; break;
            }
        }
        t->attr[i] = a;
        smap_put(&t->tok_map, t->text[i], t->len[i], (int32_t)i, 0);
    }

    if (type == BT_VOCAB_BPE) {
        if (smap_init(&t->merge_map, spec->n_merges)) goto nomem;
        for (uint32_t i = 0; i < spec->n_merges; i++) {
            size_t l = spec->merge_len[i];
            const char *m = spec->merge_text[i];
            const char *sp = l > 1 ? memchr(m + 1, ' ', l - 1) : NULL;
            if (!sp) {
                seterr(err, errlen, "tokenizer.ggml.merges[%u] '%.*s' is not two pieces separated by a space", i,
                       (int)(l > 60 ? 60 : l), m);
                bt_tokenizer_free(t);
                return BT_ERR_INVALID;
            }
            memcpy(p, m, l);
            p[l] = 0;
            smap_put(&t->merge_map, p, (uint32_t)l, (int32_t)i, (int32_t)(sp - m));
            p += l + 1;
        }
        byte_map_init(t);
    }

    /* defaults of the vocabulary type, then the file's keys */
    t->bos = t->eos = t->eot = t->eom = t->unk = BT_TOKEN_NONE;
    if (type == BT_VOCAB_SPM) {
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_bos = 1, t->add_eos = 0, t->add_space_prefix = 1;
        t->clean_spaces = 0;
    } else {
        t->bos = 11, t->eos = 11;
        t->add_bos = pd->add_bos, t->add_eos = 0, t->add_space_prefix = 0;
        t->clean_spaces = pd->clean_spaces;
        t->ignore_merges = pd->ignore_merges;
    }
    if (t->bos >= (int32_t)n) t->bos = BT_TOKEN_NONE;
    if (t->eos >= (int32_t)n) t->eos = BT_TOKEN_NONE;
    if (t->unk >= (int32_t)n) t->unk = BT_TOKEN_NONE;
    int32_t sep = BT_TOKEN_NONE, pad = BT_TOKEN_NONE;
    enum bt_status st;
    if ((st = check_id("bos_token_id", spec->bos_id, n, &t->bos, err, errlen)) ||
        (st = check_id("eos_token_id", spec->eos_id, n, &t->eos, err, errlen)) ||
        (st = check_id("eot_token_id", spec->eot_id, n, &t->eot, err, errlen)) ||
        (st = check_id("eom_token_id", spec->eom_id, n, &t->eom, err, errlen)) ||
        (st = check_id("unknown_token_id", spec->unk_id, n, &t->unk, err, errlen)) ||
        (st = check_id("seperator_token_id", spec->sep_id, n, &sep, err, errlen)) ||
        (st = check_id("padding_token_id", spec->pad_id, n, &pad, err, errlen))) {
        bt_tokenizer_free(t);
        return st;
    }
    if (spec->add_bos >= 0) t->add_bos = spec->add_bos;
    if (spec->add_eos >= 0) t->add_eos = spec->add_eos;
    if (spec->add_space_prefix >= 0) t->add_space_prefix = spec->add_space_prefix;
    if (t->add_bos && t->bos == BT_TOKEN_NONE) {
        seterr(err, errlen, "tokenizer.ggml.add_bos_token is set but the vocabulary has no BOS token");
        bt_tokenizer_free(t);
        return BT_ERR_INVALID;
    }
    if (t->add_eos && t->eos == BT_TOKEN_NONE) {
        seterr(err, errlen, "tokenizer.ggml.add_eos_token is set but the vocabulary has no EOS token");
        bt_tokenizer_free(t);
        return BT_ERR_INVALID;
    }

    /* EOT / EOM by their text when the file does not name them; control
     * tokens named "unused" are unused; end-of-generation set */
    static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
                                            "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                            "<end_of_utterance>", NULL};
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL};
    for (int k = 0; eot_texts[k] && t->eot == BT_TOKEN_NONE; k++) {
        int32_t id = find_tok(t, eot_texts[k], strlen(eot_texts[k]));
        if (id >= 0) {
            t->eot = id;
            t->attr[id] |= BT_TOKEN_ATTR_CONTROL;
        }
    }
    if (t->eom == BT_TOKEN_NONE) {
        int32_t id = find_tok(t, "<|eom_id|>", 10);
        if (id >= 0) t->eom = id, t->attr[id] |= BT_TOKEN_ATTR_CONTROL;
    }
    for (uint32_t i = 0; i < n; i++)
        if ((t->attr[i] & BT_TOKEN_ATTR_CONTROL) && strstr(t->text[i], "unused")) t->attr[i] |= BT_TOKEN_ATTR_UNUSED;
    for (int k = 0; eog_texts[k]; k++) {
        int32_t id = find_tok(t, eog_texts[k], strlen(eog_texts[k]));
        if (id >= 0) t->eog[id] = 1, t->attr[id] |= BT_TOKEN_ATTR_CONTROL;
    }
    static const char *const always_shown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
    for (int k = 0; always_shown[k]; k++) { /* gpt-oss: rendered as text */
        int32_t id = find_tok(t, always_shown[k], strlen(always_shown[k]));
        if (id >= 0) t->attr[id] = BT_TOKEN_ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    {
        /* o200k_harmony / solar-open: "<|end|>" ends a message, not the generation,
         * when "<|return|>" and "<|call|>" (or "<|calls|>" and "<|flush|>") exist */
        int32_t end = find_tok(t, "<|end|>", 7);
        int has_return = find_tok(t, "<|return|>", 10) >= 0, has_call = find_tok(t, "<|call|>", 8) >= 0;
        int has_calls = find_tok(t, "<|calls|>", 9) >= 0, has_flush = find_tok(t, "<|flush|>", 9) >= 0;
        if (end >= 0 && t->eog[end] && ((has_return && has_call) || (has_calls && has_flush))) {
            t->eog[end] = 0;
            t->attr[end] = BT_TOKEN_ATTR_USER_DEFINED;
        }
        /* gemma4 / plamo: "</s>" is a normal token there */
        int32_t s_id = find_tok(t, "</s>", 4);
        int32_t m1 = find_tok(t, "<|tool_response>", 16), m2 = find_tok(t, "<|plamo:eos|>", 13);
        if (s_id >= 0 && t->eog[s_id] && ((m1 >= 0 && t->eog[m1]) || (m2 >= 0 && t->eog[m2]))) {
            t->eog[s_id] = 0;
            t->attr[s_id] = BT_TOKEN_ATTR_NORMAL;
        }
    }

    /* "llama": the token of each byte */
    for (int b = 0; b < 256; b++) {
        char hex[7];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = find_tok(t, hex, 6);
        if (id < 0) {
            char c = (char)b;
            id = find_tok(t, &c, 1);
        }
        t->byte_tok[b] = id;
    }

    if (type == BT_VOCAB_SPM) {
        for (uint32_t i = 0; i < n; i++) {
            const unsigned char *s = (const unsigned char *)t->text[i];
            size_t l = t->len[i], a, b;
            for (size_t o = 0; o < l;) {
                uint32_t c1 = utf8_get(s + o, l - o, &a);
                if (o + a >= l) break;
                uint32_t c2 = utf8_get(s + o + a, l - o - a, &b);
                if (u64set_add(&t->pairs, ((uint64_t)c1 << 21 | c2) + 1)) goto nomem;
                o += a;
            }
        }
    }

    /* special tokens, longest first */
    t->special = malloc(n * sizeof *t->special);
    uint64_t *keys = malloc(n * sizeof *keys);
    if (!t->special || !keys) {
        free(keys);
        goto nomem;
    }
    for (uint32_t i = 0; i < n; i++)
        if (t->attr[i] & (BT_TOKEN_ATTR_CONTROL | BT_TOKEN_ATTR_USER_DEFINED | BT_TOKEN_ATTR_UNKNOWN))
            keys[t->n_special++] = ((uint64_t)(UINT32_MAX - t->len[i]) << 32) | i;
    qsort(keys, t->n_special, sizeof *keys, cmp_u64);
    for (uint32_t k = 0; k < t->n_special; k++) t->special[k] = (int32_t)(keys[k] & 0xFFFFFFFFu);
    free(keys);

    /* Phi-3: its special tokens eat the spaces after them (llama.cpp keys this on general.name) */
    if (spec->name && (lower_contains(spec->name, "phi-3") || lower_contains(spec->name, "phi3"))) {
        for (uint32_t k = 0; k < t->n_special; k++) t->attr[t->special[k]] |= BT_TOKEN_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>", NULL};
        int32_t id = find_tok(t, "</s>", 4);
        if (id >= 0) t->attr[id] |= BT_TOKEN_ATTR_RSTRIP;
        for (int k = 0; keep[k]; k++)
            if ((id = find_tok(t, keep[k], strlen(keep[k]))) >= 0) t->attr[id] &= ~BT_TOKEN_ATTR_RSTRIP;
    }

    /* pieces */
    {
        sbuf b = {0};
        for (uint32_t i = 0; i < n; i++) {
            if (make_piece(t, i, &b)) {
                free(b.p);
                goto nomem;
            }
            t->piece[i] = malloc(b.n + 1);
            if (!t->piece[i]) {
                free(b.p);
                goto nomem;
            }
            memcpy(t->piece[i], b.p, b.n);
            t->piece[i][b.n] = 0;
            t->piece_len[i] = (uint32_t)b.n;
        }
        free(b.p);
    }

    /* regular expressions */
    if (pd) {
        for (int k = 0; pd->rx[k]; k++) {
            BT_ASSERT(k < MAX_RX);
            int ec;
            PCRE2_SIZE eo;
            pcre2_code *re = pcre2_compile((PCRE2_SPTR)pd->rx[k], PCRE2_ZERO_TERMINATED,
                                           PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
            if (!re) { /* a built-in expression that does not compile is baton's bug */
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(ec, msg, sizeof msg);
                fprintf(stderr, "pre-tokenizer '%s' expression %d, offset %zu: %s\n", t->pre_name, k, (size_t)eo,
                        (const char *)msg);
                BT_ASSERT(re != NULL);
            }
            (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT it still matches, slower */
            t->rx[t->n_rx++] = re;
        }
    }
    *out = t;
    return BT_OK;
nomem:
    bt_tokenizer_free(t);
    seterr(err, errlen, "out of memory building the tokenizer (%u tokens)", spec->n_tokens);
    return BT_ERR_NOMEM;
}

/* ---- accessors ----------------------------------------------------------- */

enum bt_vocab_type bt_tokenizer_type(const bt_tokenizer *tok) { return tok->type; }
const char *bt_tokenizer_pre(const bt_tokenizer *tok) { return tok->pre_name; }
uint32_t bt_tokenizer_n_tokens(const bt_tokenizer *tok) { return tok->n_tokens; }
int32_t bt_tokenizer_bos(const bt_tokenizer *tok) { return tok->bos; }
int32_t bt_tokenizer_eos(const bt_tokenizer *tok) { return tok->eos; }
int32_t bt_tokenizer_eot(const bt_tokenizer *tok) { return tok->eot; }
int bt_tokenizer_add_bos(const bt_tokenizer *tok) { return tok->add_bos; }
int bt_tokenizer_add_eos(const bt_tokenizer *tok) { return tok->add_eos; }
int bt_tokenizer_is_eog(const bt_tokenizer *tok, int32_t id) {
    return id >= 0 && (uint32_t)id < tok->n_tokens && tok->eog[id];
}
const char *bt_tokenizer_piece(const bt_tokenizer *tok, int32_t id, int special, size_t *len) {
    if (id < 0 || (uint32_t)id >= tok->n_tokens || (!special && (tok->attr[id] & (BT_TOKEN_ATTR_CONTROL |
                                                                                 BT_TOKEN_ATTR_UNKNOWN)))) {
        *len = 0;
        return "";
    }
    *len = tok->piece_len[id];
    return tok->piece[id];
}

/* ---- BPE merging ---------------------------------------------------------- */

/* A word's symbols are kept by byte offset: len[off] is the bytes of the
 * symbol starting at off, 0 inside one (a merged-away start, a UTF-8
 * continuation byte).  A queued pair is one uint64: its key (smaller first)
 * above the left symbol's offset (smaller first on a tie, as llama.cpp); no
 * more is needed, since an entry is live exactly when the pair now at that
 * offset has that key (pair_key).  12 bytes a character where a symbol list
 * and a queue of full bigrams took 56: a prompt of one letter repeated (no
 * place to cut it, spm_tokenize) is one word. */
typedef struct {
    uint64_t *h;
    size_t n, cap;
} heap;

static int heap_push(heap *q, uint64_t g) {
    uint64_t *h = grow(q->h, &q->cap, q->n, sizeof *h, 64);
    if (!h) return -1;
    q->h = h;
    size_t i = q->n++;
    while (i > 0) {
        size_t par = (i - 1) / 2;
        if (g >= q->h[par]) break;
        q->h[i] = q->h[par];
        i = par;
    }
    q->h[i] = g;
    return 0;
}

static uint64_t heap_pop(heap *q) {
    uint64_t top = q->h[0];
    uint64_t last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && q->h[c + 1] < q->h[c]) c++;
        if (q->h[c] >= last) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

/* a word's ids, remembered for the rest of one tokenize call (words repeat:
 * BPE of a piece does not depend on its neighbours) */
typedef struct {
    const char *key; /* into the text being tokenized; NULL: empty slot */
    uint32_t len, first, n;
} wc_slot;

/* scratch shared by the merges of one tokenize call */
typedef struct {
    uint32_t *len; /* [n] of the word being merged: the symbol at each byte offset */
    size_t cap_len;
    heap q;
    sbuf key; /* "left right" for merge lookups */
    wc_slot *wc; /* word cache: open addressing, at most half full */
    size_t wc_mask, wc_n;
    bt_tokens wc_ids; /* the cached words' ids */
} work;

static void work_free(work *w) {
    BT_FREE_ALL(w->len, w->q.h, w->key.p, w->wc);
    bt_tokens_free(&w->wc_ids);
}

#define WC_MAX_WORD 256

static wc_slot *wc_find(work *w, const char *s, size_t n) {
    if (!w->wc) return NULL;
    size_t i = hash_bytes(s, n) & w->wc_mask;
    while (w->wc[i].key) {
        if (w->wc[i].len == n && !memcmp(w->wc[i].key, s, n)) return &w->wc[i];
        i = (i + 1) & w->wc_mask;
    }
    return NULL;
}

/* remember ids[first..] as the word s; a failed allocation only skips the cache */
static void wc_put(work *w, const char *s, size_t n, const bt_tokens *out, size_t first) {
    if (2 * (w->wc_n + 1) > (w->wc ? w->wc_mask + 1 : 0)) {
        size_t cap = w->wc ? 2 * (w->wc_mask + 1) : 4096;
        wc_slot *t = calloc(cap, sizeof *t);
        if (!t) return;
        for (size_t i = 0; w->wc && i <= w->wc_mask; i++) {
            if (!w->wc[i].key) continue;
            size_t j = hash_bytes(w->wc[i].key, w->wc[i].len) & (cap - 1);
            while (t[j].key) j = (j + 1) & (cap - 1);
            t[j] = w->wc[i];
        }
        free(w->wc);
        w->wc = t;
        w->wc_mask = cap - 1;
    }
    size_t at = w->wc_ids.n;
    for (size_t i = first; i < out->n; i++)
        if (tokens_push(&w->wc_ids, out->ids[i])) {
            w->wc_ids.n = at;
            return;
        }
    size_t i = hash_bytes(s, n) & w->wc_mask;
    while (w->wc[i].key) i = (i + 1) & w->wc_mask;
    w->wc[i] = (wc_slot){s, (uint32_t)n, (uint32_t)at, (uint32_t)(out->n - first)};
    w->wc_n++;
}

/* the word s: one symbol a UTF-8 character (a cut-off sequence at the end: its bytes) */
static int split_symbols(work *w, const char *s, size_t n) {
    if (n >= UINT32_MAX) return -1;
    w->q.n = 0;
    if (n > w->cap_len) {
        uint32_t *p = realloc(w->len, n * sizeof *p);
        if (!p) return -1;
        w->len = p;
        w->cap_len = n;
    }
    for (size_t off = 0; off < n;) {
        size_t l = utf8_len((unsigned char)s[off]);
        if (l > n - off) l = n - off;
        w->len[off] = (uint32_t)l;
        for (size_t k = 1; k < l; k++) w->len[off + k] = 0;
        off += l;
    }
    return 0;
}

/* "llama": -score as a uint32 in the same order (-0 as +0, as the comparison of floats) */
static uint32_t score_key(float score) {
    float x = -score;
    if (x == 0.0f) x = 0.0f;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The key of the pair of symbols at left and the one after it (smaller
 * merges first): "llama", when their concatenation is a token, its score;
 * "gpt2", when "left right" is a merge, its rank.  1 with *key, 0 when there
 * is no such pair, -1 out of memory. */
static int pair_key(const bt_tokenizer *t, work *w, const char *s, size_t n, uint32_t left, uint32_t *key) {
    const size_t ln = w->len[left], right = left + ln;
    if (ln == 0 || right >= n) return 0;
    const size_t rn = w->len[right];
    if (t->type == BT_VOCAB_SPM) {
        const int32_t id = find_tok(t, s + left, ln + rn);
        if (id < 0) return 0;
        *key = score_key(t->score[id]);
        return 1;
    }
    w->key.n = 0;
    if (sbuf_add(&w->key, s + left, ln) || sbuf_add(&w->key, " ", 1) || sbuf_add(&w->key, s + right, rn)) return -1;
    const smap_slot *e = smap_get(&t->merge_map, w->key.p, w->key.n);
    if (!e || (size_t)e->aux != ln) return 0;
    *key = (uint32_t)e->value;
    return 1;
}

static int queue_pair(const bt_tokenizer *t, work *w, const char *s, size_t n, uint32_t left) {
    uint32_t key;
    const int r = pair_key(t, w, s, n, left, &key);
    if (r <= 0) return r;
    return heap_push(&w->q, (uint64_t)key << 32 | left);
}

/* merge the queued pairs of word s, best first */
static int merge_word(const bt_tokenizer *t, work *w, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += w->len[i])
        if (queue_pair(t, w, s, n, (uint32_t)i)) return -1;
    while (w->q.n) {
        const uint64_t g = heap_pop(&w->q);
        const uint32_t left = (uint32_t)g;
        uint32_t key;
        /* an entry whose pair has changed since: the pair's own entry is queued too */
        const int r = pair_key(t, w, s, n, left, &key);
        if (r < 0) return -1;
        if (r == 0 || key != (uint32_t)(g >> 32)) continue;
        const size_t right = left + w->len[left];
        w->len[left] += w->len[right];
        w->len[right] = 0;
        size_t prev = left;
        while (prev > 0 && w->len[--prev] == 0) {}
        if (prev < left && w->len[prev] && queue_pair(t, w, s, n, (uint32_t)prev)) return -1;
        if (queue_pair(t, w, s, n, left)) return -1;
    }
    return 0;
}

static int emit_merged(const bt_tokenizer *t, work *w, const char *s, size_t n, bool spm, bt_tokens *out);

/* "llama": text is already escaped (spaces as U+2581); merged segment by
 * segment, cut between characters that no token holds side by side */
static int spm_tokenize(const bt_tokenizer *t, work *w, const char *s, size_t n, bt_tokens *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t start = 0, o = 0, a, b;
    while (o < n) {
        uint32_t c1 = utf8_get(u + o, n - o, &a);
        if (o + a >= n) break;
        uint32_t c2 = utf8_get(u + o + a, n - o - a, &b);
        o += a;
        if (!u64set_has(&t->pairs, ((uint64_t)c1 << 21 | c2) + 1)) {
            if (emit_merged(t, w, s + start, o - start, true, out)) return -1;
            start = o;
        }
    }
    return start < n ? emit_merged(t, w, s + start, n - start, true, out) : 0;
}

/* s split into symbols and merged; each symbol's token, or for a symbol that
 * is no token its bytes: SentencePiece's byte tokens (else unk) when spm,
 * else (as llama.cpp) each byte that is a token by itself. */
static int emit_merged(const bt_tokenizer *t, work *w, const char *s, size_t n, bool spm, bt_tokens *out) {
    if (split_symbols(w, s, n) || merge_word(t, w, s, n)) return -1;
    for (size_t off = 0; off < n; off += w->len[off]) {
        const size_t l = w->len[off];
        int32_t id = find_tok(t, s + off, l);
        if (id >= 0) {
            if (tokens_push(out, id)) return -1;
            continue;
        }
        for (size_t k = 0; k < l; k++) {
            int32_t b;
            if (spm) {
                b = t->byte_tok[(unsigned char)s[off + k]];
                if (b < 0) b = t->unk;
            } else {
                b = find_tok(t, s + off + k, 1);
            }
            if (b >= 0 && tokens_push(out, b)) return -1;
        }
    }
    return 0;
}

/* "gpt2": one pre-tokenized piece (already byte-encoded) */
static int bpe_word(const bt_tokenizer *t, work *w, const char *s, size_t n, bt_tokens *out) {
    if (t->ignore_merges) {
        int32_t id = find_tok(t, s, n);
        if (id >= 0) return tokens_push(out, id);
    }
    return emit_merged(t, w, s, n, false, out);
}

/* a piece of text: [off, off+len) */
typedef struct {
    size_t off, len;
} span;

typedef struct {
    span *v;
    size_t n, cap;
} spans;

static int spans_push(spans *s, size_t off, size_t len) {
    span *p = grow(s->v, &s->cap, s->n, sizeof *p, 64);
    if (!p) return -1;
    s->v = p;
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return 0;
}

/* split text by the pre-tokenizer's expressions, then byte-level BPE on each
 * piece.  Returns BT_OK or a status with err set. */
static enum bt_status bpe_tokenize(const bt_tokenizer *t, work *w, const char *text, size_t len, bt_tokens *out,
                                   char *err, size_t errlen) {
    enum bt_status st = BT_ERR_NOMEM;
    spans cur = {0}, nxt = {0};
    sbuf enc = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    pcre2_jit_stack *js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (!md || !mc || !js) goto done;
    pcre2_jit_stack_assign(mc, NULL, js);
    if (spans_push(&cur, 0, len)) goto done;
    for (int r = 0; r < t->n_rx; r++) {
        nxt.n = 0;
        for (size_t k = 0; k < cur.n; k++) {
            const char *s = text + cur.v[k].off;
            size_t n = cur.v[k].len, pos = 0, prev = 0;
            while (pos < n) {
                int rc = pcre2_match(t->rx[r], (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc < 0) {
                    PCRE2_UCHAR msg[120];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    seterr(err, errlen, "pre-tokenizer '%s': matching failed at byte %zu: %s", t->pre_name,
                           cur.v[k].off + pos, (const char *)msg);
                    st = BT_ERR_INVALID;
                    goto done;
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                size_t m0 = ov[0], m1 = ov[1];
                if (m1 == m0) { /* an empty match: step over one character */
                    pos = m0 + utf8_len((unsigned char)s[m0]);
                    continue;
                }
                if (m0 > prev && spans_push(&nxt, cur.v[k].off + prev, m0 - prev)) goto done;
                if (spans_push(&nxt, cur.v[k].off + m0, m1 - m0)) goto done;
                prev = pos = m1;
            }
            if (prev < n && spans_push(&nxt, cur.v[k].off + prev, n - prev)) goto done;
        }
        spans tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    for (size_t k = 0; k < cur.n; k++) {
        enc.n = 0;
        const unsigned char *s = (const unsigned char *)text + cur.v[k].off;
        size_t n = cur.v[k].len;
        const wc_slot *hit = n <= WC_MAX_WORD ? wc_find(w, (const char *)s, n) : NULL;
        if (hit) {
            for (uint32_t i = 0; i < hit->n; i++)
                if (tokens_push(out, w->wc_ids.ids[hit->first + i])) goto done;
            continue;
        }
        if (sbuf_reserve(&enc, 2 * n + 1)) goto done;
        for (size_t i = 0; i < n; i++) {
            memcpy(enc.p + enc.n, t->byte_enc[s[i]], t->byte_enc_len[s[i]]);
            enc.n += t->byte_enc_len[s[i]];
        }
        size_t first = out->n;
        if (bpe_word(t, w, enc.p, enc.n, out)) goto done;
        if (n <= WC_MAX_WORD) wc_put(w, (const char *)s, n, out, first);
    }
    st = BT_OK;
done:
    if (st == BT_ERR_NOMEM) seterr(err, errlen, "out of memory tokenizing %zu bytes", len);
    free(cur.v);
    free(nxt.v);
    free(enc.p);
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
    return st;
}

/* ---- special tokens cut out of the text ----------------------------------- */

typedef struct {
    size_t off, len; /* raw text, when id < 0 */
    int32_t id;      /* a special token, else -1 */
} fragment;

typedef struct {
    fragment *v;
    size_t n, cap;
} fragments;

static int frag_push(fragments *f, size_t off, size_t len, int32_t id) {
    fragment *p = grow(f->v, &f->cap, f->n, sizeof *p, 16);
    if (!p) return -1;
    f->v = p;
    f->v[f->n].off = off;
    f->v[f->n].len = len;
    f->v[f->n].id = id;
    f->n++;
    return 0;
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0 || nn > hn) return NULL;
    return memmem(h, hn, nd, nn);
}

static int partition(const bt_tokenizer *t, const char *text, size_t len, int parse_special, fragments *f) {
    fragments g = {0};
    f->n = 0;
    if (frag_push(f, 0, len, -1)) return -1;
    for (uint32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        int a = t->attr[id];
        if (!parse_special && (a & (BT_TOKEN_ATTR_CONTROL | BT_TOKEN_ATTR_UNKNOWN))) continue;
        const char *tx = t->text[id];
        size_t tn = t->len[id];
        g.n = 0;
        int found = 0;
        for (size_t i = 0; i < f->n; i++) {
            fragment fr = f->v[i];
            if (fr.id >= 0) {
                if (frag_push(&g, 0, 0, fr.id)) goto fail;
                continue;
            }
            size_t off = fr.off, n = fr.len;
            for (;;) {
                const char *m = find_bytes(text + off, n, tx, tn);
                if (!m) {
                    if (n > 0 && frag_push(&g, off, n, -1)) goto fail;
                    break;
                }
                found = 1;
                size_t mo = (size_t)(m - text);
                size_t ln = mo - off;
                if (a & BT_TOKEN_ATTR_LSTRIP)
                    while (ln > 0 && isspace((unsigned char)text[off + ln - 1])) ln--;
                if (ln > 0 && frag_push(&g, off, ln, -1)) goto fail;
                if (frag_push(&g, 0, 0, id)) goto fail;
                size_t ro = mo + tn, rn = off + n - ro;
                if (a & BT_TOKEN_ATTR_RSTRIP)
                    while (rn > 0 && isspace((unsigned char)text[ro])) ro++, rn--;
                off = ro;
                n = rn;
                if (n == 0) break;
            }
        }
        if (found) {
            fragments tmp = *f;
            *f = g;
            g = tmp;
        }
    }
    free(g.v);
    return 0;
fail:
    free(g.v);
    return -1;
}

enum bt_status bt_tokenizer_tokenize(const bt_tokenizer *t, const char *text, size_t len, int add_special,
                                     int parse_special, bt_tokens *out, char *err, size_t errlen) {
    int64_t bad = bt_utf8_check(text, len);
    if (bad >= 0) {
        seterr(err, errlen, "invalid UTF-8 at byte %lld (0x%02x)", (long long)bad, (unsigned char)text[bad]);
        return BT_ERR_INVALID;
    }
    enum bt_status st = BT_ERR_NOMEM;
    fragments f = {0};
    work w = {0};
    sbuf esc = {0};
    if (len > 0 && partition(t, text, len, parse_special, &f)) goto done;
    if (add_special && t->add_bos && tokens_push(out, t->bos)) goto done;
    int prev_special = 1; /* "llama": a space before the first text and after each special token */
    for (size_t i = 0; i < f.n; i++) {
        if (f.v[i].id >= 0) {
            if (tokens_push(out, f.v[i].id)) goto done;
            prev_special = 1;
            continue;
        }
        const char *s = text + f.v[i].off;
        size_t n = f.v[i].len;
        if (t->type == BT_VOCAB_SPM) {
            esc.n = 0;
            if (t->add_space_prefix && prev_special && sbuf_add(&esc, "\xe2\x96\x81", 3)) goto done;
            for (size_t k = 0; k < n; k++) {
                if (s[k] == ' ' ? sbuf_add(&esc, "\xe2\x96\x81", 3) : sbuf_add(&esc, s + k, 1)) goto done;
            }
            if (spm_tokenize(t, &w, esc.p, esc.n, out)) goto done;
        } else {
            enum bt_status s2 = bpe_tokenize(t, &w, s, n, out, err, errlen);
            if (s2 != BT_OK) {
                st = s2;
                goto done;
            }
        }
        prev_special = 0;
    }
    if (add_special && t->add_eos && tokens_push(out, t->eos)) goto done;
    st = BT_OK;
done:
    if (st == BT_ERR_NOMEM) seterr(err, errlen, "out of memory tokenizing %zu bytes", len);
    free(f.v);
    free(esc.p);
    work_free(&w);
    return st;
}

/* ---- ids back to text ------------------------------------------------------ */

char *bt_tokenizer_detokenize(const bt_tokenizer *t, const int32_t *ids, size_t n, int remove_special,
                              int unparse_special, size_t *len) {
    sbuf b = {0};
    if (sbuf_reserve(&b, 1)) return NULL;
    b.p[0] = 0;
    int remove_space = t->add_space_prefix;
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->bos) {
        remove_space = 0;
        ids++;
        n--;
    }
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->eos) n--;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *p = bt_tokenizer_piece(t, ids[i], unparse_special, &l);
        if (remove_space && l > 0 && p[0] == ' ') p++, l--;
        remove_space = 0;
        if (sbuf_add(&b, p, l)) {
            free(b.p);
            return NULL;
        }
    }
    if (t->clean_spaces && b.n > 0) {
        /* Hugging Face clean_up_tokenization_spaces, in llama.cpp's three passes */
        char *s = b.p;
        size_t total = b.n, k = 1;
        for (size_t i = 1; i < total; i++) { /* " ?" " !" " ." " ," */
            char x = s[i];
            if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) k--;
            s[k++] = x;
        }
        total = k, k = 1;
        for (size_t i = 1; i < total; i++) { /* " ' " -> "'" */
            char x = s[i];
            if (x == '\'' && i + 1 < total && s[i - 1] == ' ' && s[i + 1] == ' ') {
                k--;
                s[++i] = 0;
            }
            s[k++] = x;
        }
        total = k, k = 1;
        for (size_t i = 1; i < total; i++) { /* " 's" " 'm" " 're" " 've" */
            char x = s[i];
            if (s[i - 1] == ' ' && x == '\'' && i + 1 < total) {
                char x1 = s[i + 1];
                if (x1 == 's' || x1 == 'm') k--;
                else if (i + 2 < total && ((x1 == 'r' && s[i + 2] == 'e') || (x1 == 'v' && s[i + 2] == 'e'))) k--;
            }
            s[k++] = x;
        }
        b.n = k;
        s[k] = 0;
    }
    if (len) *len = b.n;
    return b.p;
}

void bt_detok_stream_init(bt_detok_stream *s) { memset(s, 0, sizeof *s); }

/* length of the longest prefix of p[0..n) that ends on a character boundary
 * (bytes that can never start a character count as whole: they pass through) */
static size_t complete_prefix(const unsigned char *p, size_t n) {
    size_t i = 0, done = 0;
    while (i < n) {
        unsigned char c = p[i];
        size_t l = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        if (i + l > n) {
            /* incomplete only if the bytes present are continuation bytes */
            size_t k = i + 1;
            while (k < n && (p[k] & 0xC0) == 0x80) k++;
            if (k == n) return done;
            l = 1;
        }
        i += l;
        done = i;
    }
    return done;
}

long bt_detok_stream_push(bt_detok_stream *s, const bt_tokenizer *tok, int32_t id, int special, char *buf,
                          size_t cap) {
    size_t l;
    const char *p = bt_tokenizer_piece(tok, id, special, &l);
    size_t total = (size_t)s->n_pending + l;
    if (cap < total) return -(long)total;
    memcpy(buf, s->pending, (size_t)s->n_pending);
    memcpy(buf + s->n_pending, p, l);
    size_t ok = complete_prefix((const unsigned char *)buf, total);
    size_t rest = total - ok;
    if (rest > 4) rest = 4, ok = total - 4; /* cannot happen for valid pieces; keep the bound */
    memcpy(s->pending, buf + ok, rest);
    s->n_pending = (int)rest;
    return (long)ok;
}

long bt_detok_stream_flush(bt_detok_stream *s, char *buf, size_t cap) {
    size_t need = (size_t)s->n_pending * 3;
    if (cap < need) return -(long)need;
    for (int i = 0; i < s->n_pending; i++) memcpy(buf + 3 * i, "\xef\xbf\xbd", 3);
    s->n_pending = 0;
    return (long)need;
}
