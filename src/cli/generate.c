/* generate.c - `baton generate`: text from a GGUF model run over the ranks the
 * program was launched with.  One prompt (-p) streams its completion to stdout
 * as it is produced; many (--prompts FILE, one a line) run as sequences
 * through the pipeline (--parallel N at a time, src/run/batcher.h) and print
 * their completions in input order.  At the end, on stderr: prompt and
 * generation tokens/s and the ranks' statistics; --json puts everything in
 * one object on stdout instead.
 *
 * Every check that needs only the command line is made before MPI starts; the
 * ones that need the file (vocabulary, chat template, the prompts' token
 * counts against the context) are made by rank 0 once the engine is open, and
 * every rank leaves with the same exit code.
 *
 * -cnv (--conversation) is an interactive chat instead: one user turn a line
 * of stdin, each reply streamed to stdout and ended with a newline; the
 * conversation so far goes through the chat template each turn, and its
 * cells stay in the cache between turns, so only what the template renders
 * anew is computed (the batcher's prefix reuse, bitwise a cold run). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agree.h"
#include "cli.h"
#include "common.h"
#include "signals.h"
#include "run/batcher.h"
#include "run/bringup.h"
#include "run/engine.h"
#include "dump_tensors.h"
#include "run/model_plan.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/vocab_gguf.h"

#define GEN_MAX_STOPS 16
#define GEN_PROG "baton generate"

struct gen_opts {
    const char *model, *prompt, *prompts_file;
    const char *prompt_file; /* -f/--file: one prompt, the file's whole text */
    const char *chat_template, *system;
    const char *dump_tensors; /* --dump-tensors PATTERN */
    const char *dump_plan;    /* --dump-plan FILE */
    const char *stops[GEN_MAX_STOPS];
    int n_stops;
    bool chat, json, escape;
    bool conversation; /* -cnv: user turns from stdin */
    long n_predict;
    long n_ctx, n_ubatch, parallel;
    struct bt_cli_engine_opts eng;
    bt_sampler_params sp;
};

static void gen_usage(FILE *f) {
    bt_sampler_params d;
    bt_sampler_params_default(&d);
    fprintf(f,
            "usage: baton generate -m FILE (-p TEXT | --prompts FILE | -cnv) [options]\n"
            "       mpirun -np N baton generate ...\n"
            "       launch/baton-run -t TOPOLOGY -- baton generate ...\n"
            "\n"
            "Generates text with a GGUF model (llama, qwen2, qwen3, qwen2moe, qwen3moe, olmoe, gemma3,\n"
            "deepseek2, gpt-oss, glm4moe, minimax-m2) whose layers are spread over the ranks\n"
            "it was launched with.  One prompt streams its completion to stdout; --prompts runs\n"
            "many as sequences through the pipeline and prints each completion, labelled,\n"
            "in input order.  At the end (stderr): prompt and generation tokens/s and\n"
            "per-rank statistics.\n"
            "\n"
            "  -m, --model FILE        the GGUF model (required, unless the topology's\n"
            "                          pipeline section names it)\n"
            "  -p, --prompt TEXT       the prompt (\\n \\t \\\\ \\xHH ... escapes are processed)\n"
            "      --no-escape         take -p's text as it is\n"
            "  -f, --file FILE         the prompt is the file's text (as it is)\n"
            "      --prompts FILE      one prompt a line (taken as they are)\n"
            "      --parallel N        sequences at once (default 1; the context is shared:\n"
            "                          each holds -c / N tokens)\n"
            "  -n, --n-predict N       tokens to generate per prompt, -1: until an end token\n"
            "                          or the context is full (default 128; 0 is an error)\n"
            "      --stop S            stop when S appears (not printed; repeatable, at most %d)\n"
            "      --chat              write the prompt as a user message in the model's chat\n"
            "                          template (tokenizer.chat_template, run as Jinja)\n"
            "      --chat-template NAME|FILE  a file holding a Jinja chat template, or a built-in\n"
            "                          format (chatml, llama3, ...) instead (implies --chat)\n"
            "      --system TEXT       a system message first (with --chat)\n"
            "  -cnv, --conversation    an interactive chat (implies --chat): one user turn a\n"
            "                          line of stdin, each reply on stdout; the conversation's\n"
            "                          cells stay in the cache between turns\n"
            "\n"
            "sampling (llama.cpp's flags and order):\n"
            "      --temp T            temperature, 0: greedy (default %g)\n"
            "      --top-k K           0: off (default %d)\n"
            "      --top-p P           1: off (default %g)\n"
            "      --min-p P           0: off (default %g)\n"
            "      --repeat-penalty X  1: off (default %g)\n"
            "      --repeat-last-n N   tokens the penalties look back at, -1: all (default %d)\n"
            "      --presence-penalty X, --frequency-penalty X   0: off (default 0)\n"
            "      --seed N            the random stream's seed (default %llu): the same\n"
            "                          seed gives the same text\n"
            "\n"
            "run:\n"
            "  -c, --ctx-size N        KV cache cells, shared by the sequences (default 4096)\n"
            "      --ubatch N          most tokens in one ubatch (default 512, at most -c)\n",
            GEN_MAX_STOPS, (double)d.temp, d.top_k, (double)d.top_p, (double)d.min_p, (double)d.repeat_penalty,
            d.penalty_last_n, (unsigned long long)d.seed);
    bt_cli_engine_help(f, 26);
    fprintf(f,
            "      --json              the completions and statistics as one JSON object\n"
            "      --dump-tensors PATTERN  each computed node whose name matches PATTERN\n"
            "                          (a glob: 'blk.3.*', 'result_output', '*') to stderr,\n"
            "                          from the rank that computes it: shape, min, max,\n"
            "                          mean and a hash of its values, per ubatch\n"
            "      --dump-plan FILE    write the plan this run carries out (placement, splits,\n"
            "                          transfers) as text, to compare with baton plan -m\n"
            "                          --dump-plan\n"
            "  -h, --help              this text\n"
            "\n"
            "Greedy output (--temp 0) is the same for any number of ranks, threads and\n"
            "--parallel.  llama.cpp's spellings -np, -ub, -b, -s, --temperature and\n"
            "--batch-size are taken as --parallel, --ubatch, --seed and --temp.\n");
}

enum {
    OPT_NO_ESCAPE = 1000,
    OPT_PROMPTS,
    OPT_FILE,
    OPT_PARALLEL,
    OPT_STOP,
    OPT_CHAT,
    OPT_CHAT_TEMPLATE,
    OPT_SYSTEM,
    OPT_TEMP,
    OPT_TOPK,
    OPT_TOPP,
    OPT_MINP,
    OPT_REPEAT_PENALTY,
    OPT_REPEAT_LAST_N,
    OPT_PRESENCE,
    OPT_FREQUENCY,
    OPT_SEED_,
    OPT_UBATCH,
    OPT_JSON,
    OPT_DUMP_TENSORS,
    OPT_DUMP_PLAN,
    OPT_CONVERSATION,
};

/* 0: --help; 2: a bad flag or value (message in err); -1: go on. */
static int check_generate(const struct gen_opts *o, char *err, size_t errn);

static int parse_generate(int argc, char **argv, struct gen_opts *o, char *err, size_t errn) {
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"no-escape", no_argument, 0, OPT_NO_ESCAPE},
        {"prompts", required_argument, 0, OPT_PROMPTS},
        {"file", required_argument, 0, OPT_FILE},
        {"parallel", required_argument, 0, OPT_PARALLEL},
        {"n-predict", required_argument, 0, 'n'},
        {"stop", required_argument, 0, OPT_STOP},
        {"chat", no_argument, 0, OPT_CHAT},
        {"chat-template", required_argument, 0, OPT_CHAT_TEMPLATE},
        {"system", required_argument, 0, OPT_SYSTEM},
        {"conversation", no_argument, 0, OPT_CONVERSATION},
        {"temp", required_argument, 0, OPT_TEMP},
        {"top-k", required_argument, 0, OPT_TOPK},
        {"top-p", required_argument, 0, OPT_TOPP},
        {"min-p", required_argument, 0, OPT_MINP},
        {"repeat-penalty", required_argument, 0, OPT_REPEAT_PENALTY},
        {"repeat-last-n", required_argument, 0, OPT_REPEAT_LAST_N},
        {"presence-penalty", required_argument, 0, OPT_PRESENCE},
        {"frequency-penalty", required_argument, 0, OPT_FREQUENCY},
        {"seed", required_argument, 0, OPT_SEED_},
        {"ctx-size", required_argument, 0, 'c'},
        {"ubatch", required_argument, 0, OPT_UBATCH},
        BT_CLI_ENGINE_LONGOPTS,
        {"json", no_argument, 0, OPT_JSON},
        {"dump-tensors", required_argument, 0, OPT_DUMP_TENSORS},
        {"dump-plan", required_argument, 0, OPT_DUMP_PLAN},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    if (!bt_cli_llama_start(argc, argv, ":m:p:n:c:t:h", longs, "generate", err, errn)) return 2;
    int code;
    long v;
    while ((code = bt_cli_next_engine_opt(argc, argv, ":m:p:n:c:t:h", longs, &o->eng, err, errn)) != -1) {
        switch (code) {
        case 0: break;
        case 'm':
            bt_cli_file_arg("-m", optarg, &o->model, err, errn);
            break;
        case 'p': o->prompt = optarg; break;
        case OPT_NO_ESCAPE: o->escape = false; break;
        case OPT_PROMPTS:
            bt_cli_file_arg("--prompts", optarg, &o->prompts_file, err, errn);
            break;
        case OPT_FILE: bt_cli_file_arg("--file", optarg, &o->prompt_file, err, errn); break;
        case OPT_PARALLEL:
            if (!bt_cli_parse_int(optarg, 1, 1024, &v)) snprintf(err, errn, "--parallel: '%s' is not an integer in [1, 1024]", optarg);
            else o->parallel = v;
            break;
        case 'n':
            if (!bt_cli_parse_int(optarg, LONG_MIN, LONG_MAX, &v)) snprintf(err, errn, "-n: '%s' is not an integer", optarg);
            else if (v == 0 || v < -1) snprintf(err, errn, "-n %ld: the number of tokens to generate must be positive (or -1: until an end token or the context is full)", v);
            else o->n_predict = v;
            break;
        case OPT_STOP:
            if (o->n_stops == GEN_MAX_STOPS) snprintf(err, errn, "--stop: at most %d stop strings", GEN_MAX_STOPS);
            else o->stops[o->n_stops++] = optarg;
            break;
        case OPT_CHAT: o->chat = true; break;
        case OPT_CHAT_TEMPLATE: o->chat_template = optarg, o->chat = true; break;
        case OPT_SYSTEM: o->system = optarg; break;
        case OPT_CONVERSATION: o->conversation = o->chat = true; break;
        case OPT_TEMP: bt_cli_float_arg("--temp", optarg, &o->sp.temp, err, errn); break;
        case OPT_TOPK: bt_cli_i32_arg("--top-k", optarg, &o->sp.top_k, err, errn); break;
        case OPT_TOPP: bt_cli_float_arg("--top-p", optarg, &o->sp.top_p, err, errn); break;
        case OPT_MINP: bt_cli_float_arg("--min-p", optarg, &o->sp.min_p, err, errn); break;
        case OPT_REPEAT_PENALTY: bt_cli_float_arg("--repeat-penalty", optarg, &o->sp.repeat_penalty, err, errn); break;
        case OPT_REPEAT_LAST_N: bt_cli_i32_arg("--repeat-last-n", optarg, &o->sp.penalty_last_n, err, errn); break;
        case OPT_PRESENCE: bt_cli_float_arg("--presence-penalty", optarg, &o->sp.presence_penalty, err, errn); break;
        case OPT_FREQUENCY: bt_cli_float_arg("--frequency-penalty", optarg, &o->sp.frequency_penalty, err, errn); break;
        case OPT_SEED_:
            if (!bt_cli_parse_u64(optarg, &o->sp.seed)) snprintf(err, errn, "--seed: '%s' is not a non-negative integer", optarg);
            break;
        case 'c':
            if (!bt_cli_parse_int(optarg, 1, 1L << 24, &v)) snprintf(err, errn, "--ctx-size: '%s' is not an integer in [1, %ld]", optarg, 1L << 24);
            else o->n_ctx = v;
            break;
        case OPT_UBATCH:
            if (!bt_cli_parse_int(optarg, 1, 65536, &v)) snprintf(err, errn, "--ubatch: '%s' is not an integer in [1, 65536]", optarg);
            else o->n_ubatch = v;
            break;
        case OPT_JSON: o->json = true; break;
        case OPT_DUMP_PLAN: bt_cli_file_arg("--dump-plan", optarg, &o->dump_plan, err, errn); break;
        case OPT_DUMP_TENSORS: bt_cli_text_arg("--dump-tensors", "pattern", optarg, &o->dump_tensors, err, errn); break;
        case 'h': return 0;
        case ':':
        case '?': bt_cli_getopt_error(code, argv, err, errn); break;
        default: BT_ASSERT(!"an option without a case");
        }
        if (bt_cli_try_help("generate", err, errn)) return 2;
    }
    if (bt_cli_extra_arg(argc, argv, "generate", err, errn)) return 2;
    return check_generate(o, err, errn);
}

/* The checks of parse_generate's options taken together: -1, or 2 and a
 * message. */
static int check_generate(const struct gen_opts *o, char *err, size_t errn) {
    if (!o->model && !o->eng.topology && !getenv("BATON_TOPOLOGY")) {
        snprintf(err, errn, "missing -m FILE, the GGUF model (try: baton generate --help)");
        return 2;
    }
    if (o->conversation && (o->prompt || o->prompts_file || o->prompt_file || o->json)) {
        snprintf(err, errn,
                 "-cnv reads the user's turns from stdin: give no -p, -f or --prompts (--system for a system "
                 "message), nor --json (try: baton generate --help)");
        return 2;
    }
    if (!o->conversation && (o->prompt != NULL) + (o->prompts_file != NULL) + (o->prompt_file != NULL) != 1) {
        snprintf(err, errn,
                 "give the prompt one way: -p TEXT, -f FILE or --prompts FILE (try: baton generate --help)");
        return 2;
    }
    if (o->system && !o->chat) {
        snprintf(err, errn, "--system needs --chat (the system message is part of the chat template)");
        return 2;
    }
    if (bt_sampler_params_check(&o->sp, err, errn) != BT_OK) return 2;
    for (int i = 0; i < o->n_stops; i++) {
        if (!o->stops[i][0]) {
            snprintf(err, errn, "--stop: the stop string is empty");
            return 2;
        }
        const int64_t bad = bt_utf8_check(o->stops[i], strlen(o->stops[i]));
        if (bad >= 0) {
            snprintf(err, errn, "--stop: invalid UTF-8 at byte %lld", (long long)bad);
            return 2;
        }
    }
    if (o->parallel > o->n_ctx) {
        snprintf(err, errn,
                 "--parallel %ld with --ctx-size %ld: each sequence needs its own cells of the context; at most "
                 "--parallel %ld",
                 o->parallel, o->n_ctx, o->n_ctx);
        return 2;
    }
    return -1;
}

/* ---- the prompts ---- */

struct prompt {
    char *text; /* NUL-terminated; the user's text before any template */
    size_t len;
    bt_tokens ids;
    /* the completion, rank 0 */
    char *out;
    size_t n_out, cap_out;
    int32_t *gen;
    size_t n_gen, cap_gen;
    struct bt_gen_result res;
    uint64_t id; /* the batcher's, once added */
    bool done;
    struct gen_run *run;
};

struct gen_run {
    const struct gen_opts *o;
    const char *model; /* the file the engine opened */
    struct prompt *p;
    size_t n;
    bool stream; /* one prompt, not --json: its text goes to stdout as it comes */
    int write_errno; /* the first failed write of the stream (stdout drops its bytes) */
    bool nomem;
    size_t failed; /* 1 + the prompt that ended with BT_FINISH_ERROR (NaN logits), or 0 */
    size_t n_done;
    double t_start, t_first_token, t_end;
};

/* A stop asked for (^C, SIGTERM, the launcher's SIGUSR1): the signal's
 * number.  Rank 0 cancels what runs and ends with what it has. */
static volatile sig_atomic_t gen_stop;

static void free_prompts(struct prompt *p, size_t n) {
    for (size_t i = 0; p && i < n; i++) {
        free(p[i].text);
        bt_tokens_free(&p[i].ids);
        free(p[i].out);
        free(p[i].gen);
    }
    free(p);
}

/* -f FILE (llama.cpp's): the file's text is one prompt, as it is but for one
 * newline at its end.  rc 1 with a message naming the file. */
static int read_prompt_file(const char *path, struct prompt **out, size_t *n_out, char *err, size_t errn) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errn, "--file %s: %s", path, strerror(errno));
        return 1;
    }
    size_t len = 0;
    char *all = bt_cli_read_all(f, path, &len, err, errn);
    fclose(f);
    if (!all) return 1;
    if (len > 0 && all[len - 1] == '\n') len--;
    all[len] = '\0';
    const int64_t bad = bt_utf8_check(all, len);
    if (len == 0) snprintf(err, errn, "--file %s: the prompt is empty", path);
    else if (bad >= 0) snprintf(err, errn, "--file %s: the prompt is not valid UTF-8: byte %lld", path, (long long)bad);
    else if (memchr(all, '\0', len)) snprintf(err, errn, "--file %s: the prompt holds a NUL byte", path);
    struct prompt *p = err[0] ? NULL : calloc(1, sizeof *p);
    if (!err[0] && !p) snprintf(err, errn, "out of memory");
    if (err[0]) {
        free(all);
        return 1;
    }
    p->text = all;
    p->len = len;
    *out = p;
    *n_out = 1;
    return 0;
}

/* The prompts of the command line: -p (escapes processed), -f FILE, or one a
 * line of --prompts FILE.  Each non-empty and valid UTF-8.  rc 2 (-p) or 1 (FILE)
 * with a message. */
static int read_prompts(const struct gen_opts *o, struct prompt **out, size_t *n_out, char *err, size_t errn) {
    *out = NULL;
    *n_out = 0;
    if (o->prompt) {
        struct prompt *p = calloc(1, sizeof *p);
        size_t len = strlen(o->prompt);
        if (!p || !(p->text = malloc(len + 1))) {
            free(p);
            snprintf(err, errn, "out of memory");
            return 1;
        }
        memcpy(p->text, o->prompt, len + 1);
        if (o->escape) bt_cli_process_escapes(p->text, &len);
        p->text[len] = '\0';
        p->len = len;
        const int64_t bad = bt_utf8_check(p->text, len);
        if (len == 0) snprintf(err, errn, "-p: the prompt is empty");
        else if (bad >= 0) snprintf(err, errn, "-p: the prompt is not valid UTF-8: byte %lld", (long long)bad);
        else if (memchr(p->text, '\0', len)) snprintf(err, errn, "-p: the prompt holds a NUL byte");
        if (err[0]) {
            free_prompts(p, 1);
            return 2;
        }
        *out = p;
        *n_out = 1;
        return 0;
    }
    if (o->prompt_file) return read_prompt_file(o->prompt_file, out, n_out, err, errn);
    FILE *f = fopen(o->prompts_file, "rb");
    if (!f) {
        snprintf(err, errn, "--prompts %s: %s", o->prompts_file, strerror(errno));
        return 1;
    }
    size_t len = 0;
    char *all = bt_cli_read_all(f, o->prompts_file, &len, err, errn);
    fclose(f);
    if (!all) return 1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += all[i] == '\n';
    if (len > 0 && all[len - 1] != '\n') n++;
    if (n == 0) {
        snprintf(err, errn, "--prompts %s: the file holds no prompt", o->prompts_file);
        free(all);
        return 1;
    }
    struct prompt *p = calloc(n, sizeof *p);
    if (!p) {
        snprintf(err, errn, "out of memory for %zu prompts", n);
        free(all);
        return 1;
    }
    size_t k = 0, line_start = 0;
    for (size_t i = 0; i <= len && k < n; i++) {
        if (i < len && all[i] != '\n') continue;
        size_t l = i - line_start;
        if (l > 0 && all[line_start + l - 1] == '\r') l--; /* CRLF */
        const char *s = all + line_start;
        const int64_t bad = bt_utf8_check(s, l);
        if (l == 0) snprintf(err, errn, "%s:%zu: the prompt is empty", o->prompts_file, k + 1);
        else if (bad >= 0)
            snprintf(err, errn, "%s:%zu: the prompt is not valid UTF-8: byte %lld of the line", o->prompts_file,
                     k + 1, (long long)bad);
        else if (memchr(s, '\0', l)) snprintf(err, errn, "%s:%zu: the prompt holds a NUL byte", o->prompts_file, k + 1);
        else if (!(p[k].text = malloc(l + 1))) snprintf(err, errn, "out of memory");
        if (err[0]) {
            free_prompts(p, n);
            free(all);
            return 1;
        }
        memcpy(p[k].text, s, l);
        p[k].text[l] = '\0';
        p[k].len = l;
        k++;
        line_start = i + 1;
    }
    free(all);
    *out = p;
    *n_out = n;
    return 0;
}

static int tokenize_each(const struct gen_opts *o, const bt_tokenizer *tok, const bt_chat_template *tmpl,
                         struct prompt *p, size_t n, int64_t share, char *err, size_t errn);

/* Rank 0, once the model is open: the vocabulary, the chat template (when
 * asked) and the tokens of each prompt, checked against the context.  1 and
 * a message. */
static int tokenize_prompts(const struct gen_opts *o, const char *model, struct bt_gguf *g, bt_tokenizer **tok_out,
                            bt_chat_template **tmpl_out, struct prompt *p, size_t n, int64_t share, char *err,
                            size_t errn) {
    bt_tokenizer *tok = NULL;
    char e[768];
    if (bt_tokenizer_from_gguf(g, &tok, e, sizeof e) != BT_OK) {
        snprintf(err, errn, "%s", e);
        return 1;
    }
    *tok_out = tok;
    bt_chat_template *tmpl = NULL;
    if (o->chat) {
        if (!o->chat_template && bt_gguf_find_key(g, "tokenizer.chat_template") < 0) {
            snprintf(err, errn, "%s: --chat: the file has no tokenizer.chat_template; name one with --chat-template",
                     model);
            return 1;
        }
        char note[768];
        if (bt_cli_chat_template(o->chat_template, g, tok, NULL, &tmpl, note, sizeof note, e, sizeof e) != BT_OK) {
            snprintf(err, errn, "%s%s", o->chat_template ? "--chat-template: " : "--chat: ", e);
            return 1;
        }
        if (note[0]) fprintf(stderr, "baton generate: %s\n", note);
    }
    const int rc = tokenize_each(o, tok, tmpl, p, n, share, err, errn);
    *tmpl_out = tmpl;
    return rc;
}

/* The tokens of text[0..len), or with --chat of the messages msgs[0..nm)
 * in the template with the assistant's turn opened; 1 and a message in
 * err (prefixed with where) when the template or the tokenizer fails. */
static int chat_tokens(const struct gen_opts *o, const bt_tokenizer *tok, const bt_chat_template *tmpl,
                       const bt_chat_msg *msgs, size_t nm, const char *text, size_t len, const char *where,
                       bt_tokens *ids, char *err, size_t errn) {
    char e[768];
    char *chat = NULL;
    if (o->chat) {
        if (bt_chat_template_apply(tmpl, msgs, NULL, nm, NULL, 1, &chat, e, sizeof e) != BT_OK) {
            snprintf(err, errn, "%s%s", o->chat_template ? "--chat-template: " : "--chat: ", e);
            return 1;
        }
        text = chat;
        len = strlen(chat);
    }
    const enum bt_status st = bt_tokenizer_tokenize(tok, text, len, 1, 1, ids, e, sizeof e);
    free(chat);
    if (st != BT_OK) {
        snprintf(err, errn, "%s: %s", where, e);
        return 1;
    }
    /* a template that writes the BOS text itself, and a vocabulary that adds one: one BOS, as serve */
    const int32_t bos = bt_tokenizer_bos(tok);
    if (o->chat && ids->n >= 2 && bos != BT_TOKEN_NONE && ids->ids[0] == bos && ids->ids[1] == bos) {
        memmove(ids->ids, ids->ids + 1, (ids->n - 1) * sizeof *ids->ids);
        ids->n--;
    }
    return 0;
}

/* Each prompt's tokens, checked against a sequence's share of the context. */
static int tokenize_each(const struct gen_opts *o, const bt_tokenizer *tok, const bt_chat_template *tmpl,
                         struct prompt *p, size_t n, int64_t share, char *err, size_t errn) {
    for (size_t i = 0; i < n; i++) {
        bt_chat_msg msgs[2];
        size_t nm = 0;
        if (o->system) msgs[nm++] = (bt_chat_msg){"system", o->system};
        msgs[nm++] = (bt_chat_msg){"user", p[i].text};
        char where[32];
        snprintf(where, sizeof where, "prompt %zu", i + 1);
        if (chat_tokens(o, tok, tmpl, msgs, nm, p[i].text, p[i].len, where, &p[i].ids, err, errn) != 0) return 1;
        if (p[i].ids.n == 0) {
            snprintf(err, errn, "prompt %zu: no tokens", i + 1);
            return 1;
        }
        if ((int64_t)p[i].ids.n > share) {
            if (o->parallel > 1)
                snprintf(err, errn,
                         "prompt %zu has %zu tokens but each of the %ld sequences holds %lld (--ctx-size %ld / "
                         "--parallel %ld): raise --ctx-size or lower --parallel",
                         i + 1, p[i].ids.n, o->parallel, (long long)share, o->n_ctx, o->parallel);
            else
                snprintf(err, errn, "prompt %zu has %zu tokens but the context holds %lld (--ctx-size %ld)", i + 1,
                         p[i].ids.n, (long long)share, o->n_ctx);
            return 1;
        }
    }
    return 0;
}

/* ---- the callbacks (rank 0, the step thread) ---- */

static bool grow(void **buf, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*buf, c * elem);
    if (!q) return false;
    *buf = q;
    *cap = c;
    return true;
}

static void on_token(void *user, int32_t id, const char *text, size_t len, const bt_logprobs *lp) {
    (void)lp; /* not asked */
    struct prompt *p = user;
    struct gen_run *run = p->run;
    if (run->t_first_token == 0) run->t_first_token = bt_now_s();
    if (!grow((void **)&p->gen, &p->cap_gen, p->n_gen + 1, sizeof *p->gen) ||
        !grow((void **)&p->out, &p->cap_out, p->n_out + len + 1, 1)) {
        run->nomem = true;
        return;
    }
    p->gen[p->n_gen++] = id;
    memcpy(p->out + p->n_out, text, len);
    p->n_out += len;
    p->out[p->n_out] = '\0';
    if (run->stream && len && (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) && !run->write_errno)
        run->write_errno = errno ? errno : EIO;
}

static void on_done(void *user, const struct bt_gen_result *r) {
    struct prompt *p = user;
    p->res = *r;
    p->done = true;
    if (r->finish == BT_FINISH_ERROR && !p->run->failed) p->run->failed = (size_t)(p - p->run->p) + 1;
    p->run->n_done++;
    p->run->t_end = bt_now_s();
}

/* ---- output ---- */

static void print_rank_table(FILE *f, const struct bt_engine *e, const struct bt_engine_stats *all, int P) {
    fprintf(f, "rank  layers   ubatches   tokens  compute_s   wait_s   sent_MiB  recv_MiB  weights_MiB  kv_MiB  "
               "peak_MiB  backend\n");
    for (int r = 0; r < P; r++) {
        const struct bt_engine_stats *s = &all[r];
        int il0 = 0, il1 = 0;
        bt_engine_range(e, r, &il0, &il1);
        char layers[32];
        if (il1 > il0) snprintf(layers, sizeof layers, "%d-%d", il0, il1 - 1);
        else snprintf(layers, sizeof layers, "-");
        fprintf(f, "%4d  %-7s %9llu %8llu  %9.3f  %7.3f  %9.2f  %8.2f  %11.2f  %6.2f  %8.2f  %s\n", r, layers,
                (unsigned long long)s->ubatches, (unsigned long long)s->tokens, s->compute_s, s->wait_s,
                s->bytes_sent / 1048576.0, s->bytes_received / 1048576.0, s->weight_bytes / 1048576.0,
                s->kv_bytes / 1048576.0, s->peak_rss / 1048576.0, bt_engine_rank_backend(e, r));
    }
}

struct gen_totals {
    uint64_t digest; /* FNV-1a 64 of every completion's token ids (little-endian int32), in input order */
    int64_t n_prompt, n_gen, n_decode;
    double prompt_s, gen_s, wall_s, prompt_tps, gen_tps;
};

/* Prompt tokens/s: each prompt's tokens over the time to its first token,
 * summed; generation tokens/s: the tokens sampled after each first one over
 * the time from the first first token to the end (one prompt: exactly
 * llama.cpp's prompt eval and eval rates). */
static void totals(const struct gen_run *run, struct gen_totals *t) {
    memset(t, 0, sizeof *t);
    t->digest = 1469598103934665603ull;
    for (size_t i = 0; i < run->n; i++) {
        const struct bt_gen_result *r = &run->p[i].res;
        for (size_t k = 0; k < run->p[i].n_gen; k++)
            for (int byte = 0; byte < 4; byte++)
                t->digest = (t->digest ^ (((uint32_t)run->p[i].gen[k] >> (8 * byte)) & 0xff)) * 1099511628211ull;
        t->n_prompt += r->n_prompt;
        t->n_gen += r->n_gen;
        t->n_decode += r->n_gen > 0 ? r->n_gen - 1 : 0;
        t->prompt_s += r->t_prompt_s;
    }
    t->wall_s = run->t_end - run->t_start;
    t->gen_s = run->t_first_token > 0 ? run->t_end - run->t_first_token : 0;
    if (run->n == 1) t->gen_s = run->p[0].res.t_gen_s;
    t->prompt_tps = t->prompt_s > 0 ? (double)t->n_prompt / t->prompt_s : 0;
    t->gen_tps = t->gen_s > 0 ? (double)t->n_decode / t->gen_s : 0;
}

static void print_json(const struct gen_run *run, const struct gen_totals *t, const struct bt_engine *e,
                       const struct bt_engine_stats *all, int P) {
    printf("{\"model\": ");
    bt_cli_json_str(stdout, run->model, strlen(run->model));
    printf(", \"ranks\": %d, \"parallel\": %ld, \"completions\": [", P, run->o->parallel);
    for (size_t i = 0; i < run->n; i++) {
        const struct prompt *p = &run->p[i];
        printf("%s{\"prompt\": ", i ? ", " : "");
        bt_cli_json_str(stdout, p->text, p->len);
        printf(", \"text\": ");
        bt_cli_json_str(stdout, p->out ? p->out : "", p->n_out);
        printf(", \"finish_reason\": \"%s\", \"prompt_tokens\": %lld, \"completion_tokens\": %lld, \"tokens\": [",
               bt_finish_name(p->res.finish), (long long)p->res.n_prompt, (long long)p->res.n_gen);
        for (size_t k = 0; k < p->n_gen; k++) printf(k ? ", %d" : "%d", p->gen[k]);
        printf("]}");
    }
    printf("], \"prompt_tokens\": %lld, \"completion_tokens\": %lld, \"prompt_tokens_per_s\": %.2f, "
           "\"gen_tokens_per_s\": %.2f, \"wall_s\": %.6f, \"token_digest\": \"%016llx\", \"per_rank\": [",
           (long long)t->n_prompt, (long long)t->n_gen, t->prompt_tps, t->gen_tps, t->wall_s,
           (unsigned long long)t->digest);
    for (int r = 0; r < P; r++) {
        const struct bt_engine_stats *s = &all[r];
        int il0 = 0, il1 = 0;
        bt_engine_range(e, r, &il0, &il1);
        printf("%s{\"rank\": %d, \"first_layer\": %d, \"last_layer\": %d, \"ubatches\": %llu, \"tokens\": %llu, "
               "\"compute_s\": %.6f, \"wait_s\": %.6f, \"bytes_sent\": %llu, \"bytes_received\": %llu, "
               "\"weight_bytes\": %zu, \"kv_bytes\": %zu, \"compute_bytes\": %zu, \"peak_rss\": %zu, \"backend\": ",
               r ? ", " : "", r, il0, il1 - 1, (unsigned long long)s->ubatches, (unsigned long long)s->tokens,
               s->compute_s, s->wait_s, (unsigned long long)s->bytes_sent, (unsigned long long)s->bytes_received,
               s->weight_bytes, s->kv_bytes, s->compute_bytes, s->peak_rss);
        const char *be = bt_engine_rank_backend(e, r);
        bt_cli_json_str(stdout, be, strlen(be));
        printf("}");
    }
    printf("]}\n");
}

static void print_text(const struct gen_run *run) {
    if (run->stream) {
        printf("\n");
        return;
    }
    for (size_t i = 0; i < run->n; i++) {
        const struct prompt *p = &run->p[i];
        printf("[%zu] %s\n", i + 1, p->text);
        printf("[%zu] => ", i + 1);
        fwrite(p->out ? p->out : "", 1, p->n_out, stdout);
        printf("\n[%zu] (%s, %lld tokens)\n\n", i + 1, bt_finish_name(p->res.finish), (long long)p->res.n_gen);
    }
}

/* ---- rank 0's loop: every prompt through the batcher ---- */

static uint64_t engine_computing(const void *e) { return bt_engine_computing(e); }

/* --dump-plan: the plan the runtime runs (its full ubatch's), as `baton plan
 * -m --dump-plan` writes the plan it makes.  Rank 0. */
static int dump_engine_plan(const struct bt_engine *e, const char *path) {
    return bt_cli_dump_plan(bt_engine_plan(e), path, GEN_PROG);
}

static int run_prompts(struct gen_run *run, struct bt_engine *e, const bt_tokenizer *tok, char *err, size_t errn) {
    struct bt_batcher_params bp;
    bt_batcher_default_params(&bp);
    struct bt_batcher *b = NULL;
    if (bt_batcher_new(e, tok, &bp, &b, err, errn) != BT_OK) return 1;
    int rc = 0;
    size_t next = 0;
    run->t_start = bt_now_s();
    bool cancelled = false;
    while (run->n_done < next || (next < run->n && !gen_stop)) {
        if (gen_stop && !cancelled) { /* once: the rest are not started */
            for (size_t i = 0; i < next; i++)
                if (!run->p[i].done) bt_batcher_cancel(b, run->p[i].id);
            cancelled = true;
        }
        while (next < run->n && bt_batcher_n_free(b) > 0 && !gen_stop) {
            struct prompt *p = &run->p[next];
            const struct bt_gen_request req = {
                .prompt = p->ids.ids,
                .n_prompt = p->ids.n,
                .sampling = run->o->sp,
                .max_tokens = run->o->n_predict,
                .stops = run->o->stops,
                .n_stops = (size_t)run->o->n_stops,
                .on_token = on_token,
                .on_done = on_done,
                .user = p,
            };
            char e2[768];
            if (bt_batcher_add(b, &req, &p->id, e2, sizeof e2) != BT_OK) {
                snprintf(err, errn, "prompt %zu: %s", next + 1, e2);
                rc = 1;
                break;
            }
            next++;
        }
        if (rc) break;
        if (bt_batcher_step(b) != BT_OK) {
            snprintf(err, errn, "%s", bt_batcher_error(b));
            rc = 1;
            break;
        }
        if (run->nomem) {
            snprintf(err, errn, "out of memory keeping the completions");
            rc = 1;
            break;
        }
        if (run->failed) { /* the batcher goes on; this run does not */
            snprintf(err, errn, "prompt %zu: %s", run->failed, bt_batcher_error(b));
            rc = 1;
            break;
        }
    }
    for (size_t i = next; i < run->n; i++) run->p[i].res.finish = BT_FINISH_CANCELLED; /* stopped first */
    bt_batcher_free(b);
    return rc;
}

/* ---- -cnv: a conversation through the chat template (rank 0) ---- */

/* One reply, as it comes: streamed to stdout, kept for the next turns. */
struct conv_turn {
    char *text;
    size_t len, cap;
    bool done, nomem;
    int write_errno;
    struct bt_gen_result res;
};

static void conv_on_token(void *user, int32_t id, const char *text, size_t len, const bt_logprobs *lp) {
    (void)id;
    (void)lp;
    struct conv_turn *t = user;
    if (!grow((void **)&t->text, &t->cap, t->len + len + 1, 1)) {
        t->nomem = true;
        return;
    }
    memcpy(t->text + t->len, text, len);
    t->len += len;
    t->text[t->len] = '\0';
    if (len && (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0) && !t->write_errno)
        t->write_errno = errno ? errno : EIO;
}

static void conv_on_done(void *user, const struct bt_gen_result *r) {
    struct conv_turn *t = user;
    t->res = *r;
    t->done = true;
}

/* The conversation so far: roles are literals, contents owned. */
struct conv_msgs {
    bt_chat_msg *m;
    size_t n, cap;
};

static bool conv_push(struct conv_msgs *c, const char *role, const char *text, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy || !grow((void **)&c->m, &c->cap, c->n + 1, sizeof *c->m)) {
        free(copy);
        return false;
    }
    memcpy(copy, text, len);
    copy[len] = '\0';
    c->m[c->n++] = (bt_chat_msg){role, copy};
    return true;
}

static void conv_free(struct conv_msgs *c) {
    for (size_t i = 0; i < c->n; i++) free((char *)c->m[i].content);
    free(c->m);
}

/* One turn: the conversation's tokens, its reply streamed (then a newline),
 * the reply kept as the assistant's message; 1 and a message in err. */
static int conv_turn(const struct gen_opts *o, struct bt_batcher *b, const bt_tokenizer *tok,
                     const bt_chat_template *tmpl, struct conv_msgs *c, size_t turn, int64_t share, char *err,
                     size_t errn) {
    char where[32];
    snprintf(where, sizeof where, "turn %zu", turn);
    bt_tokens ids = {0};
    if (chat_tokens(o, tok, tmpl, c->m, c->n, NULL, 0, where, &ids, err, errn) != 0) return 1;
    if ((int64_t)ids.n >= share) {
        snprintf(err, errn, "turn %zu: the conversation has %zu tokens but the context holds %lld (--ctx-size %ld%s)",
                 turn, ids.n, (long long)share, o->n_ctx, o->parallel > 1 ? " / --parallel" : "");
        bt_tokens_free(&ids);
        return 1;
    }
    struct conv_turn t = {0};
    const struct bt_gen_request req = {
        .prompt = ids.ids,
        .n_prompt = ids.n,
        .sampling = o->sp,
        .max_tokens = o->n_predict,
        .stops = o->stops,
        .n_stops = (size_t)o->n_stops,
        .on_token = conv_on_token,
        .on_done = conv_on_done,
        .user = &t,
    };
    uint64_t id;
    char e[768];
    int rc = 0;
    if (bt_batcher_add(b, &req, &id, e, sizeof e) != BT_OK) {
        snprintf(err, errn, "turn %zu: %s", turn, e);
        rc = 1;
    }
    bool cancelled = false;
    while (!rc && !t.done) {
        if (gen_stop && !cancelled) {
            bt_batcher_cancel(b, id);
            cancelled = true;
        }
        if (bt_batcher_step(b) != BT_OK) {
            snprintf(err, errn, "%s", bt_batcher_error(b));
            rc = 1;
        }
    }
    if (!rc && t.res.finish == BT_FINISH_ERROR) snprintf(err, errn, "turn %zu: %s", turn, bt_batcher_error(b));
    if (!rc && t.nomem) snprintf(err, errn, "out of memory keeping the reply");
    if (!rc && (fputc('\n', stdout) == EOF || fflush(stdout) != 0) && !t.write_errno)
        t.write_errno = errno ? errno : EIO;
    if (!rc && t.write_errno) snprintf(err, errn, "writing the output: %s", strerror(t.write_errno));
    if (!rc && err[0]) rc = 1;
    if (!rc) {
        fprintf(stderr, GEN_PROG ": turn %zu: %zu prompt tokens, %lld cached, %lld generated\n", turn, ids.n,
                (long long)t.res.n_cached, (long long)t.res.n_gen);
        if (!conv_push(c, "assistant", t.text ? t.text : "", t.len)) {
            snprintf(err, errn, "out of memory keeping the conversation");
            rc = 1;
        }
    }
    free(t.text);
    bt_tokens_free(&ids);
    return rc;
}

/* The conversation: one user turn a line of stdin (blank lines skipped)
 * until its end; its cells stay in the batcher's slot between turns. */
static int run_conversation(const struct gen_opts *o, struct bt_engine *e, const bt_tokenizer *tok,
                            const bt_chat_template *tmpl, int64_t share, char *err, size_t errn) {
    struct bt_batcher_params bp;
    bt_batcher_default_params(&bp);
    struct bt_batcher *b = NULL;
    if (bt_batcher_new(e, tok, &bp, &b, err, errn) != BT_OK) return 1;
    struct conv_msgs c = {0};
    int rc = 0;
    if (o->system && !conv_push(&c, "system", o->system, strlen(o->system))) {
        snprintf(err, errn, "out of memory");
        rc = 1;
    }
    char *line = NULL;
    size_t cap = 0, turn = 0, lineno = 0;
    ssize_t got;
    const bool tty = isatty(STDIN_FILENO);
    while (!rc && !gen_stop && (!tty || (fputs("> ", stdout) != EOF && fflush(stdout) == 0)) &&
           (got = getline(&line, &cap, stdin)) >= 0) {
        size_t len = (size_t)got;
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (len == 0) continue;
        const int64_t bad = bt_utf8_check(line, len);
        if (bad >= 0 || memchr(line, '\0', len)) {
            if (bad >= 0) snprintf(err, errn, "stdin line %zu: not valid UTF-8: byte %lld", lineno, (long long)bad);
            else snprintf(err, errn, "stdin line %zu: a NUL byte", lineno);
            rc = 1;
            break;
        }
        if (!conv_push(&c, "user", line, len)) {
            snprintf(err, errn, "out of memory keeping the conversation");
            rc = 1;
            break;
        }
        rc = conv_turn(o, b, tok, tmpl, &c, ++turn, share, err, errn);
    }
    if (!rc && ferror(stdin) && !gen_stop) { /* a stop asked for cuts the read short */
        snprintf(err, errn, "reading stdin: %s", strerror(errno));
        rc = 1;
    }
    free(line);
    conv_free(&c);
    bt_batcher_free(b);
    return rc;
}

/* What every rank must have the same of. */
static int agree_items(const struct gen_opts *o, struct bt_cli_agree_item *it) {
    int n = 0;
    bt_cli_agree_add_where(it, &n, o->eng.topology, o->eng.backend);
    bt_cli_agree_add(it, &n, "-m", o->model != NULL, "%s", o->model ? o->model : "");
    bt_cli_agree_add(it, &n, "--ctx-size", true, "%ld", o->n_ctx);
    bt_cli_agree_add(it, &n, "--ubatch", true, "%ld", o->n_ubatch);
    bt_cli_agree_add(it, &n, "--parallel", true, "%ld", o->parallel);
    bt_cli_agree_add(it, &n, "--partition", o->eng.partition != NULL, "%s", o->eng.partition ? o->eng.partition : "");
    return n;
}
#define GEN_AGREE_ITEMS 7

int bt_cli_generate(int argc, char **argv) {
    int stop_rc = 0; /* a stop asked for: the exit status after the output */
    struct gen_opts o;
    memset(&o, 0, sizeof o);
    bt_sampler_params_default(&o.sp);
    o.n_predict = 128;
    o.n_ctx = 4096;
    o.n_ubatch = 0; /* 512, at most the context */
    o.parallel = 1;
    o.escape = true;
    const int env_rank = bt_cli_start(GEN_PROG);
    char perr[1024] = "";
    int prc = parse_generate(argc, argv, &o, perr, sizeof perr);
    if (prc == 0) return bt_cli_help(env_rank, gen_usage);
    if (prc < 0) prc = 0;
    if (o.n_ubatch == 0) o.n_ubatch = o.n_ctx < 512 ? o.n_ctx : 512;
    if (!prc && o.n_ubatch > o.n_ctx) {
        snprintf(perr, sizeof perr, "--ubatch %ld is larger than --ctx-size %ld", o.n_ubatch, o.n_ctx);
        prc = 2;
    }
    if (!bt_cli_engine_finish(&o.eng, prc ? NULL : perr, sizeof perr) && !prc) prc = 2;
    struct prompt *prompts = NULL;
    size_t n_prompts = 0;
    if (!prc && !o.conversation) prc = read_prompts(&o, &prompts, &n_prompts, perr, sizeof perr);

    const struct bt_rank_config rcfg = bt_cli_engine_rank_config(GEN_PROG, &o.eng, 0);
    struct bt_rank R;
    if (!bt_cli_rank_start(&R, &rcfg, env_rank, &prc, perr, sizeof perr, &argc, &argv)) {
        free_prompts(prompts, n_prompts);
        return prc;
    }
    bt_transport *t = R.t;
    const int P = R.size, rank = R.rank;
    int rc = 0;
    char err[1024] = "";
    struct bt_engine *e = NULL;
    struct bt_cli_dump dump = {0}; /* --dump-tensors' callback state */
    bt_tokenizer *tok = NULL;
    bt_chat_template *tmpl = NULL;
    struct bt_engine_stats *all = NULL;

    struct bt_cli_agree_item items[GEN_AGREE_ITEMS];
    const int n_items = agree_items(&o, items);
    BT_ASSERT(n_items == GEN_AGREE_ITEMS);
    rc = bt_cli_rank_agree(&R, &rcfg, prc, perr, sizeof perr, items, n_items, err, sizeof err);
    if (rc != 0) goto out;

    struct bt_engine_params ep;
    bt_engine_default_params(&ep);
    ep.model = o.model;
    ep.n_ctx = o.n_ctx;
    ep.n_seq_max = (int)o.parallel;
    ep.n_ubatch = o.n_ubatch;
    ep.mmap = o.eng.mmap;
    if (bt_engine_open(&R, &ep, &e, err, sizeof err) != BT_OK) {
        rc = 1;
        goto out;
    }
    dump = (struct bt_cli_dump){.pattern = o.dump_tensors, .rank = rank, .ubatch = engine_computing, .ctx = e,
                                .f = stderr};
    if (o.dump_tensors) bt_engine_set_eval_callback(e, bt_cli_dump_eval, &dump);

    /* rank 0: the vocabulary and the prompts' tokens; every rank learns the
     * verdict before rank 0 starts driving */
    int64_t verdict = 0;
    if (rank == 0) bt_cli_ctx_warn(GEN_PROG, e, o.n_ctx, o.parallel);
    if (rank == 0)
        verdict = tokenize_prompts(&o, bt_gguf_path(bt_engine_gguf(e)), bt_engine_gguf(e), &tok, &tmpl, prompts,
                                   n_prompts, o.n_ctx / o.parallel, err, sizeof err);
    if (rank == 0 && !verdict && o.dump_plan && dump_engine_plan(e, o.dump_plan) != 0) verdict = 1;
    if (t->iface.allreduce_max(t, &verdict, 1) != BT_OK && !verdict) {
        snprintf(err, sizeof err, "the ranks could not agree: %s", "transport failure");
        verdict = 1;
    }
    struct gen_run run = {.o = &o, .model = bt_gguf_path(bt_engine_gguf(e)), .p = prompts, .n = n_prompts, .stream = n_prompts == 1 && !o.json};
    for (size_t i = 0; i < n_prompts; i++) prompts[i].run = &run;
    bt_cli_signals_finish_on_stop(rank, &gen_stop, GEN_PROG ": stop requested: ending with what it has (a second signal stops at once)");
    if (rank == 0) {
        if (!verdict && o.conversation) rc = run_conversation(&o, e, tok, tmpl, o.n_ctx / o.parallel, err, sizeof err);
        else if (!verdict) rc = run_prompts(&run, e, tok, err, sizeof err);
        else rc = (int)verdict;
        if (bt_engine_stop(e) != BT_OK && !rc) {
            snprintf(err, sizeof err, "%s", bt_engine_error(e));
            rc = 1;
        }
    } else if (bt_engine_serve(e) != BT_OK) {
        snprintf(err, sizeof err, "%s", bt_engine_error(e));
        rc = 1;
    }
    all = calloc((size_t)P, sizeof *all);
    if (!all || bt_engine_gather_stats(e, all) != BT_OK) {
        if (!rc) snprintf(err, sizeof err, "gathering the ranks' statistics: %s", all ? bt_engine_error(e) : "out of memory");
        rc = 1;
    }
    if (rank == 0 && !verdict && !rc && !o.conversation) {
        struct gen_totals tt;
        totals(&run, &tt);
        if (o.json) {
            print_json(&run, &tt, e, all, P);
        } else {
            print_text(&run);
            fflush(stdout);
            fprintf(stderr, "\n" GEN_PROG ": %d rank%s, %zu prompt%s, --parallel %ld\n", P, P > 1 ? "s" : "",
                    n_prompts, n_prompts > 1 ? "s" : "", o.parallel);
            fprintf(stderr, "prompt:     %6lld tokens in %8.3f s = %9.2f tokens/s\n", (long long)tt.n_prompt,
                    tt.prompt_s, tt.prompt_tps);
            fprintf(stderr, "generation: %6lld tokens in %8.3f s = %9.2f tokens/s (after each first token)\n",
                    (long long)tt.n_decode, tt.gen_s, tt.gen_tps);
            fprintf(stderr, "wall:       %.3f s\n", tt.wall_s);
            fprintf(stderr, "tokens:     %lld generated, digest %016llx (FNV-1a 64 of the ids: equal digests, equal tokens)\n\n",
                    (long long)tt.n_gen, (unsigned long long)tt.digest);
            print_rank_table(stderr, e, all, P);
        }
        if (fflush(stdout) != 0 || run.write_errno) {
            snprintf(err, sizeof err, "writing the output: %s", strerror(run.write_errno ? run.write_errno : errno));
            rc = 1;
        }
    }
    int64_t rcv = rc;
    t->iface.allreduce_max(t, &rcv, 1);
    rc = (int)rcv;
    /* stopped on request: what it had is out; ^C, SIGTERM and SIGHUP exit as
     * the shell's convention (128 + the signal), the launcher's SIGUSR1 0
     * (the launcher says how it was stopped) */
    if (rank == 0 && gen_stop && !rc && !verdict) {
        const int sig = (int)gen_stop;
        fprintf(stderr, GEN_PROG ": stopped by %s: the output above is what was generated until then\n",
                sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGUSR1");
        stop_rc = sig == SIGUSR1 ? 0 : 128 + sig;
    }

out:
    if (err[0] && rank == 0) fprintf(stderr, GEN_PROG ": %s\n", err);
    free(all);
    bt_tokenizer_free(tok);
    bt_chat_template_free(tmpl);
    bt_engine_close(e);
    bt_cli_dump_free(&dump);
    free_prompts(prompts, n_prompts);
    bt_cli_rank_end(&R, rc);
    return rc ? rc : stop_rc;
}
