/* chat.c - the template a model is chatted with: its own Jinja text run by
 * jinja.c with the context transformers gives (bt_chat_template_*), or one
 * of the common chat formats, detected from the marks in a model's
 * Jinja chat template and written by hand, following llama.cpp's
 * src/llama-chat.cpp (the same rules in the same order, so a template is
 * given the same format; its tests/test-chat-template.cpp outputs are
 * baton's tests).  Formats that llama.cpp detects after the last one baton
 * writes (exaone, granite, ...) are reported as unknown rather than guessed. */
#include "chat.h"
#include "../mem.h"
#include "jinja.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum fmt {
    F_CHATML, F_LLAMA2, F_LLAMA2_SYS, F_LLAMA2_SYS_BOS, F_LLAMA2_SYS_STRIP, F_MISTRAL_V1, F_MISTRAL_V3,
    F_MISTRAL_V3_TEKKEN, F_MISTRAL_V7, F_MISTRAL_V7_TEKKEN, F_PHI3, F_PHI4, F_FALCON3, F_ZEPHYR, F_MONARCH, F_GEMMA,
    F_ORION, F_OPENCHAT, F_VICUNA, F_VICUNA_ORCA, F_DEEPSEEK, F_DEEPSEEK2, F_DEEPSEEK3, F_COMMAND_R, F_LLAMA3,
    F_CHATGLM3, F_CHATGLM4, F_GLMEDGE, F_MINICPM, F_COUNT, F_UNKNOWN = -1,
};

static const char *const k_names[F_COUNT + 1] = {
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma",
    "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "command-r", "llama3",
    "chatglm3", "chatglm4", "glmedge", "minicpm", NULL,
};

const char *const *bt_chat_template_names(void) { return k_names; }

static int has(const char *t, const char *s) { return strstr(t, s) != NULL; }

static enum fmt detect(const char *t) {
    for (int i = 0; i < F_COUNT; i++)
        if (!strcmp(t, k_names[i])) return (enum fmt)i;
    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>")) return F_PHI4;
        if (has(t, "<end_of_utterance>")) return F_UNKNOWN; /* SmolVLM: not chatml */
        return F_CHATML;
    }
    if (!strncmp(t, "mistral", 7) || has(t, "[INST]")) {
        if (has(t, "[SYSTEM_PROMPT]")) return F_MISTRAL_V7;
        if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
            if (has(t, " [INST]")) return F_MISTRAL_V1;
            if (has(t, "\"[INST]\"")) return F_MISTRAL_V3_TEKKEN;
            return F_MISTRAL_V3;
        }
        if (has(t, "content.strip()")) return F_LLAMA2_SYS_STRIP;
        if (has(t, "bos_token + '[INST]")) return F_LLAMA2_SYS_BOS;
        if (has(t, "<<SYS>>")) return F_LLAMA2_SYS;
        return F_LLAMA2;
    }
    if (has(t, "<|assistant|>") && has(t, "<|end|>")) return F_PHI3;
    if (has(t, "[gMASK]<sop>")) return F_CHATGLM4;
    if (has(t, "<|assistant|>") && has(t, "<|user|>")) {
        if (has(t, "<|tool_declare|>")) return F_UNKNOWN; /* exaone-moe */
        return has(t, "</s>") ? F_FALCON3 : F_GLMEDGE;
    }
    if (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>")) return F_GLMEDGE;
    if (has(t, "<|user|>") && has(t, "<|endoftext|>")) return F_ZEPHYR;
    if (has(t, "bos_token + message['role']")) return F_MONARCH;
    if (has(t, "<start_of_turn>")) return F_GEMMA;
    if (has(t, "'\\n\\nAssistant: ' + eos_token")) return F_ORION;
    if (has(t, "GPT4 Correct ")) return F_OPENCHAT;
    if (has(t, "USER: ") && has(t, "ASSISTANT: ")) return has(t, "SYSTEM: ") ? F_VICUNA_ORCA : F_VICUNA;
    if (has(t, "### Instruction:") && has(t, "<|EOT|>")) return F_DEEPSEEK;
    if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>")) return F_COMMAND_R;
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) return F_LLAMA3;
    if (has(t, "[gMASK]sop")) return F_CHATGLM3;
    if (has(t, "<\xe7\x94\xa8\xe6\x88\xb7>")) return F_MINICPM; /* <用户> */
    if (has(t, "'Assistant: ' + message['content'] + eos_token")) return F_DEEPSEEK2;
    if (has(t, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") && has(t, "<\xef\xbd\x9c" "User\xef\xbd\x9c>") &&
        has(t, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"))
        return F_DEEPSEEK3;
    return F_UNKNOWN;
}

const char *bt_chat_template_detect(const char *tmpl) {
    enum fmt f = detect(tmpl);
    return f == F_UNKNOWN ? NULL : k_names[f];
}

/* ---- writing ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} out_buf;

static void put_n(out_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    char *p = bt_grow(b->p, &b->cap, b->n + n + 1, 1, 256);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void put(out_buf *b, const char *s) { put_n(b, s, strlen(s)); }

/* s without leading and trailing white space */
static void put_trim(out_buf *b, const char *s) {
    size_t a = 0, e = strlen(s);
    while (a < e && isspace((unsigned char)s[a])) a++;
    while (e > a && isspace((unsigned char)s[e - 1])) e--;
    put_n(b, s + a, e - a);
}

static int is(const char *role, const char *r) { return !strcmp(role, r); }

#define EOS_DEEPSEEK "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

/* the [INST] formats: Mistral's and Llama 2's */
static void write_inst(enum fmt f, const bt_chat_msg *m, size_t n, out_buf *b) {
    switch (f) {
    case F_MISTRAL_V7:
    case F_MISTRAL_V7_TEKKEN: {
        const char *sp = f == F_MISTRAL_V7 ? " " : "";
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) put(b, "[SYSTEM_PROMPT]"), put(b, sp), put(b, m[i].content), put(b, "[/SYSTEM_PROMPT]");
            else if (is(m[i].role, "user")) put(b, "[INST]"), put(b, sp), put(b, m[i].content), put(b, "[/INST]");
            else put(b, sp), put(b, m[i].content), put(b, "</s>");
        }
        break;
    }
    case F_MISTRAL_V1:
    case F_MISTRAL_V3:
    case F_MISTRAL_V3_TEKKEN: {
        const char *lead = f == F_MISTRAL_V1 ? " " : "", *trail = f == F_MISTRAL_V3_TEKKEN ? "" : " ";
        int inside = 0;
        for (size_t i = 0; i < n; i++) {
            if (!inside) put(b, lead), put(b, "[INST]"), put(b, trail), inside = 1;
            if (is(m[i].role, "system")) put(b, m[i].content), put(b, "\n\n");
            else if (is(m[i].role, "user")) put(b, m[i].content), put(b, lead), put(b, "[/INST]");
            else {
                put(b, trail);
                if (f == F_MISTRAL_V3) put_trim(b, m[i].content);
                else put(b, m[i].content);
                put(b, "</s>");
                inside = 0;
            }
        }
        break;
    }
    case F_LLAMA2:
    case F_LLAMA2_SYS:
    case F_LLAMA2_SYS_BOS:
    case F_LLAMA2_SYS_STRIP: {
        int sys = f != F_LLAMA2, bos = f == F_LLAMA2_SYS_BOS, strip = f == F_LLAMA2_SYS_STRIP, inside = 1;
        put(b, "[INST] ");
        for (size_t i = 0; i < n; i++) {
            if (!inside) inside = 1, put(b, bos ? "<s>[INST] " : "[INST] ");
            void (*content)(out_buf *, const char *) = strip ? put_trim : put;
            if (is(m[i].role, "system")) {
                if (sys) put(b, "<<SYS>>\n"), content(b, m[i].content), put(b, "\n<</SYS>>\n\n");
                else content(b, m[i].content), put(b, "\n");
            } else if (is(m[i].role, "user")) {
                content(b, m[i].content), put(b, " [/INST]");
            } else {
                content(b, m[i].content), put(b, "</s>");
                inside = 0;
            }
        }
        break;
    }
    default: break;
    }
}

/* Gemma, Orion, OpenChat and Vicuna */
static void write_turns(enum fmt f, const bt_chat_msg *m, size_t n, int add_ass, out_buf *b) {
    switch (f) {
    case F_GEMMA: {
        out_buf sys = {0};
        put(&sys, "");
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) { /* no system turn in gemma: merged into the next user turn */
                put_trim(&sys, m[i].content);
                continue;
            }
            const char *role = is(m[i].role, "assistant") ? "model" : m[i].role;
            put(b, "<start_of_turn>"), put(b, role), put(b, "\n");
            if (sys.n && strcmp(role, "model")) put(b, sys.p), put(b, "\n\n"), sys.n = 0;
            put_trim(b, m[i].content), put(b, "<end_of_turn>\n");
        }
        if (sys.oom) b->oom = 1;
        free(sys.p);
        if (add_ass) put(b, "<start_of_turn>model\n");
        break;
    }
    case F_ORION: {
        out_buf sys = {0};
        put(&sys, "");
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) put(&sys, m[i].content);
            else if (is(m[i].role, "user")) {
                put(b, "Human: ");
                if (sys.n) put(b, sys.p), put(b, "\n\n"), sys.n = 0;
                put(b, m[i].content), put(b, "\n\nAssistant: </s>");
            } else put(b, m[i].content), put(b, "</s>");
        }
        if (sys.oom) b->oom = 1;
        free(sys.p);
        break;
    }
    case F_OPENCHAT:
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) put(b, m[i].content), put(b, "<|end_of_turn|>");
            else {
                char c = (char)toupper((unsigned char)m[i].role[0]);
                put(b, "GPT4 Correct "), put_n(b, &c, m[i].role[0] ? 1 : 0), put(b, m[i].role[0] ? m[i].role + 1 : ""),
                    put(b, ": "), put(b, m[i].content), put(b, "<|end_of_turn|>");
            }
        }
        if (add_ass) put(b, "GPT4 Correct Assistant:");
        break;
    case F_VICUNA:
    case F_VICUNA_ORCA:
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) {
                if (f == F_VICUNA_ORCA) put(b, "SYSTEM: "), put(b, m[i].content), put(b, "\n");
                else put(b, m[i].content), put(b, "\n\n");
            } else if (is(m[i].role, "user")) put(b, "USER: "), put(b, m[i].content), put(b, "\n");
            else if (is(m[i].role, "assistant")) put(b, "ASSISTANT: "), put(b, m[i].content), put(b, "</s>\n");
        }
        if (add_ass) put(b, "ASSISTANT:");
        break;
    default: break;
    }
}

/* The formats that write each message as PRE role MID content END (the
 * first message's PRE is FIRST) and the assistant's turn as GEN; false for
 * another format. */
static bool write_tagged(enum fmt f, const bt_chat_msg *m, size_t n, int add_ass, out_buf *b) {
    static const struct {
        enum fmt f;
        const char *first, *pre, *mid, *end, *gen;
    } tags[] = {
        {F_CHATML, "<|im_start|>", "<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n"},
        {F_PHI3, "<|", "<|", "|>\n", "<|end|>\n", "<|assistant|>\n"},
        {F_PHI4, "<|im_start|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"},
        {F_FALCON3, "<|", "<|", "|>\n", "\n", "<|assistant|>\n"},
        {F_ZEPHYR, "<|", "<|", "|>\n", "<|endoftext|>\n", "<|assistant|>\n"},
        {F_MONARCH, "", "<s>", "\n", "</s>\n", "<s>assistant\n"},
    };
    const size_t n_tags = sizeof tags / sizeof tags[0];
    size_t t = 0;
    while (t < n_tags && tags[t].f != f) t++;
    if (t == n_tags) return false;
    for (size_t i = 0; i < n; i++)
        put(b, i ? tags[t].pre : tags[t].first), put(b, m[i].role), put(b, tags[t].mid), put(b, m[i].content),
            put(b, tags[t].end);
    if (add_ass) put(b, tags[t].gen);
    return true;
}

static void write_fmt(enum fmt f, const bt_chat_msg *m, size_t n, int add_ass, out_buf *b) {
    if (write_tagged(f, m, n, add_ass, b)) return;
    switch (f) {
    case F_MISTRAL_V7:
    case F_MISTRAL_V7_TEKKEN:
    case F_MISTRAL_V1:
    case F_MISTRAL_V3:
    case F_MISTRAL_V3_TEKKEN:
    case F_LLAMA2:
    case F_LLAMA2_SYS:
    case F_LLAMA2_SYS_BOS:
    case F_LLAMA2_SYS_STRIP:
        write_inst(f, m, n, b);
        break;
    case F_GEMMA:
    case F_ORION:
    case F_OPENCHAT:
    case F_VICUNA:
    case F_VICUNA_ORCA:
        write_turns(f, m, n, add_ass, b);
        break;
    case F_DEEPSEEK:
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) put(b, m[i].content);
            else if (is(m[i].role, "user")) put(b, "### Instruction:\n"), put(b, m[i].content), put(b, "\n");
            else if (is(m[i].role, "assistant")) put(b, "### Response:\n"), put(b, m[i].content), put(b, "\n<|EOT|>\n");
        }
        if (add_ass) put(b, "### Response:\n");
        break;
    case F_DEEPSEEK2:
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) put(b, m[i].content), put(b, "\n\n");
            else if (is(m[i].role, "user")) put(b, "User: "), put(b, m[i].content), put(b, "\n\n");
            else if (is(m[i].role, "assistant")) put(b, "Assistant: "), put(b, m[i].content), put(b, EOS_DEEPSEEK);
        }
        if (add_ass) put(b, "Assistant:");
        break;
    case F_DEEPSEEK3:
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "system")) put(b, m[i].content), put(b, "\n\n");
            else if (is(m[i].role, "user")) put(b, "<\xef\xbd\x9cUser\xef\xbd\x9c>"), put(b, m[i].content);
            else if (is(m[i].role, "assistant"))
                put(b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"), put(b, m[i].content), put(b, EOS_DEEPSEEK);
        }
        if (add_ass) put(b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
        break;
    case F_COMMAND_R:
        for (size_t i = 0; i < n; i++) {
            const char *tag = is(m[i].role, "system") ? "<|SYSTEM_TOKEN|>" : is(m[i].role, "user") ? "<|USER_TOKEN|>"
                              : is(m[i].role, "assistant")                  ? "<|CHATBOT_TOKEN|>" : NULL;
            if (!tag) continue;
            put(b, "<|START_OF_TURN_TOKEN|>"), put(b, tag), put_trim(b, m[i].content), put(b, "<|END_OF_TURN_TOKEN|>");
        }
        if (add_ass) put(b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        break;
    case F_LLAMA3:
        for (size_t i = 0; i < n; i++) put(b, "<|start_header_id|>"), put(b, m[i].role),
                                       put(b, "<|end_header_id|>\n\n"), put_trim(b, m[i].content), put(b, "<|eot_id|>");
        if (add_ass) put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case F_CHATGLM3:
        put(b, "[gMASK]sop");
        for (size_t i = 0; i < n; i++) put(b, "<|"), put(b, m[i].role), put(b, "|>\n "), put(b, m[i].content);
        if (add_ass) put(b, "<|assistant|>");
        break;
    case F_CHATGLM4:
        put(b, "[gMASK]<sop>");
        for (size_t i = 0; i < n; i++) put(b, "<|"), put(b, m[i].role), put(b, "|>\n"), put(b, m[i].content);
        if (add_ass) put(b, "<|assistant|>\n");
        break;
    case F_GLMEDGE:
        for (size_t i = 0; i < n; i++) put(b, "<|"), put(b, m[i].role), put(b, "|>\n"), put(b, m[i].content);
        if (add_ass) put(b, "<|assistant|>");
        break;
    case F_MINICPM:
        for (size_t i = 0; i < n; i++) {
            if (is(m[i].role, "user")) put(b, "<\xe7\x94\xa8\xe6\x88\xb7>"), put_trim(b, m[i].content), put(b, "<AI>");
            else put_trim(b, m[i].content);
        }
        break;
    default: /* F_UNKNOWN, F_COUNT: write_tagged wrote the tagged formats */
        BT_ASSERT(!"unknown format");
    }
}

enum bt_status bt_chat_apply(const char *tmpl, const bt_chat_msg *msgs, size_t n, int add_assistant, char **out,
                             char *err, size_t errlen) {
    *out = NULL;
    enum fmt f = tmpl ? detect(tmpl) : F_UNKNOWN;
    if (f == F_UNKNOWN) {
        size_t o = 0;
        if (tmpl && strlen(tmpl) < 40 && !strchr(tmpl, '{'))
            o += (size_t)snprintf(err, errlen, "unknown chat template '%s'", tmpl);
        else o += (size_t)snprintf(err, errlen, "the chat template is not one baton knows");
        if (o < errlen) o += (size_t)snprintf(err + o, errlen - o, " (names:");
        for (int i = 0; i < F_COUNT && o < errlen; i++) o += (size_t)snprintf(err + o, errlen - o, " %s", k_names[i]);
        if (o < errlen) snprintf(err + o, errlen - o, ")");
        return BT_ERR_UNSUPPORTED;
    }
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            snprintf(err, errlen, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
            return BT_ERR_INVALID;
        }
    }
    out_buf b = {0};
    put(&b, "");
    write_fmt(f, msgs, n, add_assistant, &b);
    if (b.oom) {
        free(b.p);
        snprintf(err, errlen, "out of memory writing the chat");
        return BT_ERR_NOMEM;
    }
    *out = b.p;
    return BT_OK;
}

/* ---- the template a model is chatted with: Jinja, or a built-in format ---- */

struct bt_chat_template {
    bt_jinja *jinja;    /* NULL: the built-in format `name` */
    const char *name;   /* one of k_names, or "jinja" */
    char *bos, *eos;
    enum bt_tool_format tools; /* how the Jinja text asks for tool calls */
};

static char *dup_or_empty(const char *s) {
    size_t n = s ? strlen(s) : 0;
    char *d = malloc(n + 1);
    if (d) memcpy(d, s ? s : "", n), d[n] = 0;
    return d;
}

static enum bt_status new_template(bt_jinja *j, const char *name, enum bt_tool_format tools, const char *bos,
                                   const char *eos, bt_chat_template **out, char *err, size_t errlen) {
    bt_chat_template *t = calloc(1, sizeof *t);
    if (t) t->bos = dup_or_empty(bos), t->eos = dup_or_empty(eos);
    if (!t || !t->bos || !t->eos) {
        if (t) free(t->bos), free(t->eos);
        free(t);
        bt_jinja_free(j);
        snprintf(err, errlen, "out of memory");
        return BT_ERR_NOMEM;
    }
    t->jinja = j, t->name = name, t->tools = tools;
    *out = t;
    return BT_OK;
}

static const char *builtin(const char *name) {
    for (int i = 0; i < F_COUNT; i++)
        if (!strcmp(name, k_names[i])) return k_names[i];
    return NULL;
}

/* the text of a file, or NULL with err set */
static char *read_file(const char *path, size_t *n, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open", path);
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *p = malloc(cap);
    for (size_t k; p && (k = fread(p + len, 1, cap - len, f)) > 0;) {
        len += k;
        if (len == cap) {
            char *q = cap <= ((size_t)64 << 20) ? realloc(p, cap *= 2) : NULL;
            if (!q) {
                free(p);
                p = NULL;
                snprintf(err, errlen, "%s: too large for a chat template", path);
                fclose(f);
                return NULL;
            }
            p = q;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!p || bad) {
        free(p);
        snprintf(err, errlen, bad ? "%s: read error" : "out of memory", path);
        return NULL;
    }
    *n = len;
    return p;
}

enum bt_status bt_chat_template_choose(const char *arg, const char *model_tmpl, const char *fallback, const char *bos,
                                       const char *eos, bt_chat_template **out, char *note, size_t notelen, char *err,
                                       size_t errlen) {
    *out = NULL;
    if (notelen) note[0] = 0;
    char e[512];
    bt_jinja *j = NULL;
    if (arg) {
        const char *name = builtin(arg);
        if (name) return new_template(NULL, name, BT_TOOL_FORMAT_NONE, bos, eos, out, err, errlen);
        size_t n;
        char *src = read_file(arg, &n, e, sizeof e);
        if (!src) {
            size_t o = (size_t)snprintf(err, errlen, "'%s' is neither a chat template file (%s) nor one of the names:",
                                        arg, e);
            for (int i = 0; i < F_COUNT && o < errlen; i++) o += (size_t)snprintf(err + o, errlen - o, " %s", k_names[i]);
            return BT_ERR_INVALID;
        }
        enum bt_status st = bt_jinja_parse(src, n, &j, e, sizeof e);
        const enum bt_tool_format tools = bt_tool_format_detect(src);
        free(src);
        if (st != BT_OK) {
            snprintf(err, errlen, "%s:%s", arg, e);
            return st;
        }
        return new_template(j, "jinja", tools, bos, eos, out, err, errlen);
    }
    if (model_tmpl) {
        enum bt_status st = bt_jinja_parse(model_tmpl, strlen(model_tmpl), &j, e, sizeof e);
        if (st == BT_OK) return new_template(j, "jinja", bt_tool_format_detect(model_tmpl), bos, eos, out, err, errlen);
        if (st == BT_ERR_NOMEM) {
            snprintf(err, errlen, "tokenizer.chat_template: %s", e);
            return st;
        }
        const char *det = bt_chat_template_detect(model_tmpl);
        if (det || fallback) {
            snprintf(note, notelen, "the model's chat template cannot be run (tokenizer.chat_template:%s): chats use "
                     "the built-in format %s", e, det ? det : fallback);
            return new_template(NULL, det ? det : fallback, BT_TOOL_FORMAT_NONE, bos, eos, out, err, errlen);
        }
        snprintf(err, errlen, "tokenizer.chat_template:%s", e);
        return BT_ERR_UNSUPPORTED;
    }
    if (fallback && builtin(fallback))
        return new_template(NULL, builtin(fallback), BT_TOOL_FORMAT_NONE, bos, eos, out, err, errlen);
    snprintf(err, errlen, "the model has no chat template (tokenizer.chat_template)");
    return BT_ERR_INVALID;
}

const char *bt_chat_template_kind(const bt_chat_template *t) { return t->name; }
enum bt_tool_format bt_chat_template_tools(const bt_chat_template *t) { return t->tools; }

void bt_chat_template_free(bt_chat_template *t) {
    if (!t) return;
    bt_jinja_free(t->jinja);
    free(t->bos), free(t->eos);
    free(t);
}

/* s as a JSON string */
static void put_json_str(out_buf *b, const char *s) {
    put(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char tmp[8];
        if (c == '"') put(b, "\\\"");
        else if (c == '\\') put(b, "\\\\");
        else if (c == '\n') put(b, "\\n");
        else if (c == '\r') put(b, "\\r");
        else if (c == '\t') put(b, "\\t");
        else if (c < 0x20) snprintf(tmp, sizeof tmp, "\\u%04x", c), put(b, tmp);
        else put_n(b, (const char *)&c, 1);
    }
    put(b, "\"");
}

enum bt_status bt_chat_template_apply(const bt_chat_template *t, const bt_chat_msg *msgs, const char *const *msg_json,
                                      size_t n, const char *tools_json, int add_assistant, char **out, char *err,
                                      size_t errlen) {
    *out = NULL;
    if (!t->jinja) return bt_chat_apply(t->name, msgs, n, add_assistant, out, err, errlen);
    for (size_t i = 0; i < n; i++) {
        if ((!msg_json || !msg_json[i]) && (!msgs[i].role || !msgs[i].content)) {
            snprintf(err, errlen, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
            return BT_ERR_INVALID;
        }
    }
    /* the context transformers gives: messages, tools, add_generation_prompt, bos_token, eos_token */
    out_buf b = {0};
    put(&b, "{\"messages\": [");
    for (size_t i = 0; i < n; i++) {
        if (i) put(&b, ", ");
        if (msg_json && msg_json[i]) put(&b, msg_json[i]);
        else put(&b, "{\"role\": "), put_json_str(&b, msgs[i].role), put(&b, ", \"content\": "),
            put_json_str(&b, msgs[i].content), put(&b, "}");
    }
    put(&b, "], \"tools\": "), put(&b, tools_json ? tools_json : "null");
    put(&b, ", \"add_generation_prompt\": "), put(&b, add_assistant ? "true" : "false");
    put(&b, ", \"bos_token\": "), put_json_str(&b, t->bos);
    put(&b, ", \"eos_token\": "), put_json_str(&b, t->eos), put(&b, "}");
    if (b.oom) {
        free(b.p);
        snprintf(err, errlen, "out of memory writing the chat");
        return BT_ERR_NOMEM;
    }
    char e[512];
    enum bt_status st = bt_jinja_render(t->jinja, b.p, NULL, out, NULL, e, sizeof e);
    free(b.p);
    if (st == BT_ERR_ABORTED) snprintf(err, errlen, "the chat template refused the messages: %s", e);
    else if (st != BT_OK) snprintf(err, errlen, "the chat template failed: %s", e);
    return st;
}
