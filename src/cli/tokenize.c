/* tokenize.c - `baton tokenize -m FILE (-p TEXT | -f FILE | --stdin)`: the
 * token ids of a text under a GGUF file's vocabulary, one line of ids
 * (--ids, as llama.cpp's llama-tokenize --ids) or one token a line with its
 * piece.  Like llama-tokenize: a BOS is added when the vocabulary asks
 * (--no-bos: never), special-token text is parsed (--no-parse-special: not),
 * and -p's backslash escapes are processed (--no-escape: not). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "common.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/vocab_gguf.h"

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: baton tokenize -m FILE (-p TEXT | -f FILE | --stdin) [options]\n"
            "\n"
            "Prints the tokens of a text under the vocabulary of a GGUF file\n"
            "(tokenizer.ggml.model \"llama\" or \"gpt2\").\n"
            "\n"
            "  -m, --model FILE      GGUF file with the vocabulary (required)\n"
            "  -p, --prompt TEXT     the text (\\n \\t \\r \\\\ \\\" \\' \\xHH escapes are processed)\n"
            "  -f, --file FILE       read the text from FILE\n"
            "      --stdin           read the text from standard input\n"
            "      --ids             one line: [id, id, ...] (as llama-tokenize --ids)\n"
            "      --show-count      then print the number of tokens\n"
            "      --no-bos          do not add the BOS / EOS tokens the vocabulary asks for\n"
            "      --no-parse-special  text such as <|im_end|> is plain text, not its control token\n"
            "      --no-escape       take -p's text as it is\n"
            "      --time            on stderr: bytes, tokens and seconds (loading and tokenizing)\n"
            "      --info            print the vocabulary's type, size, special tokens and chat template\n"
            "  -h, --help            this text\n"
            "\n"
            "Without --ids each token is a line: the id, then its piece in quotes (bytes\n"
            "that are not whole UTF-8 characters as \\xHH).\n"
            "\n"
            "gpt2 pre-tokenizers known (tokenizer.ggml.pre):\n ");
    int col = 1;
    for (const char *const *n = bt_tokenizer_pre_names(); *n; n++) {
        int l = (int)strlen(*n) + 1;
        if (col + l > 78) {
            fprintf(f, "\n ");
            col = 1;
        }
        fprintf(f, " %s", *n);
        col += l;
    }
    fprintf(f, "\n");
}

static void print_piece(const char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        int64_t bad = bt_utf8_check(p + i, n - i);
        size_t good = bad < 0 ? n - i : (size_t)bad;
        fwrite(p + i, 1, good, stdout);
        i += good;
        if (i < n) printf("\\x%02x", (unsigned char)p[i++]);
    }
}

enum { OPT_STDIN = 1000, OPT_IDS, OPT_SHOW_COUNT, OPT_NO_BOS, OPT_NO_PARSE, OPT_NO_ESCAPE, OPT_TIME, OPT_INFO };

/* --info: the vocabulary's kind, its special tokens, the chat template */
static void print_info(const bt_tokenizer *tok, const char *tmpl) {
    int32_t bos = bt_tokenizer_bos(tok), eos = bt_tokenizer_eos(tok), eot = bt_tokenizer_eot(tok);
    size_t l;
    printf("vocabulary: %s%s%s, %u tokens\n", bt_tokenizer_type(tok) == BT_VOCAB_SPM ? "llama (SentencePiece BPE)"
                                                                                    : "gpt2 (byte-level BPE)",
           bt_tokenizer_type(tok) == BT_VOCAB_BPE ? ", pre-tokenizer " : "", bt_tokenizer_pre(tok),
           bt_tokenizer_n_tokens(tok));
    printf("bos: %d '%s'%s\n", bos, bos >= 0 ? bt_tokenizer_piece(tok, bos, 1, &l) : "",
           bt_tokenizer_add_bos(tok) ? " (added)" : "");
    printf("eos: %d '%s'%s\n", eos, eos >= 0 ? bt_tokenizer_piece(tok, eos, 1, &l) : "",
           bt_tokenizer_add_eos(tok) ? " (added)" : "");
    printf("eot: %d '%s'\n", eot, eot >= 0 ? bt_tokenizer_piece(tok, eot, 1, &l) : "");
    const char *name = tmpl ? bt_chat_template_detect(tmpl) : NULL;
    printf("chat template: %s\n", !tmpl ? "none in the file" : name ? name : "not one baton knows");
}

/* the text to tokenize, from -p (escapes processed unless --no-escape), -f or standard input;
 * NULL after saying why */
static char *read_text(const char *prompt, const char *file, int escape, size_t *len, char *err, size_t err_size) {
    char *text = NULL;
    *len = 0;
    if (prompt) {
        *len = strlen(prompt);
        text = malloc(*len + 1);
        if (!text) {
            fprintf(stderr, "baton tokenize: out of memory\n");
            return NULL;
        }
        memcpy(text, prompt, *len + 1);
        if (escape) bt_cli_process_escapes(text, len);
    } else if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "baton tokenize: %s: %s\n", file, strerror(errno));
            return NULL;
        }
        text = bt_cli_read_all(f, file, len, err, err_size);
        fclose(f);
    } else {
        text = bt_cli_read_all(stdin, "standard input", len, err, err_size);
    }
    if (!text) fprintf(stderr, "baton tokenize: %s\n", err);
    return text;
}

/* the ids as a list, or one line per token with its piece */
static void print_tokens(const bt_tokenizer *tok, const bt_tokens *ids, int ids_only) {
    if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < ids->n; i++) printf(i ? ", %d" : "%d", ids->ids[i]);
        printf("]\n");
    } else {
        for (size_t i = 0; i < ids->n; i++) {
            size_t pl;
            const char *p = bt_tokenizer_piece(tok, ids->ids[i], 1, &pl);
            printf("%6d -> '", ids->ids[i]);
            print_piece(p, pl);
            printf("'\n");
        }
    }
}

int bt_cli_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL;
    int use_stdin = 0, ids_only = 0, show_count = 0, add_special = 1, parse_special = 1, escape = 1, timing = 0,
        info = 0;
    static const struct option longs[] = {
        {"model", required_argument, 0, 'm'},     {"prompt", required_argument, 0, 'p'},
        {"file", required_argument, 0, 'f'},      {"stdin", no_argument, 0, OPT_STDIN},
        {"ids", no_argument, 0, OPT_IDS},         {"show-count", no_argument, 0, OPT_SHOW_COUNT},
        {"no-bos", no_argument, 0, OPT_NO_BOS},   {"no-parse-special", no_argument, 0, OPT_NO_PARSE},
        {"no-escape", no_argument, 0, OPT_NO_ESCAPE}, {"time", no_argument, 0, OPT_TIME},
        {"info", no_argument, 0, OPT_INFO},       {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    while ((code = getopt_long(argc, argv, ":m:p:f:h", longs, NULL)) != -1) {
        switch (code) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'f': file = optarg; break;
        case OPT_STDIN: use_stdin = 1; break;
        case OPT_IDS: ids_only = 1; break;
        case OPT_SHOW_COUNT: show_count = 1; break;
        case OPT_NO_BOS: add_special = 0; break;
        case OPT_NO_PARSE: parse_special = 0; break;
        case OPT_NO_ESCAPE: escape = 0; break;
        case OPT_TIME: timing = 1; break;
        case OPT_INFO: info = 1; break;
        case 'h': tokenize_usage(stdout); return 0;
        case ':':
            fprintf(stderr, "baton tokenize: %s needs a value (try: baton tokenize --help)\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "baton tokenize: unknown option %s (try: baton tokenize --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton tokenize: unexpected argument '%s' (try: baton tokenize --help)\n", argv[optind]);
        return 2;
    }
    if (!model) {
        fprintf(stderr, "baton tokenize: missing -m FILE (try: baton tokenize --help)\n");
        return 2;
    }
    if (!*model || (file && !*file)) {
        fprintf(stderr, "baton tokenize: %s: the file name is empty (try: baton tokenize --help)\n",
                *model ? "-f" : "-m");
        return 2;
    }
    int n_src = (prompt != NULL) + (file != NULL) + use_stdin;
    if (n_src > 1) {
        fprintf(stderr, "baton tokenize: give the text one way: -p, -f or --stdin\n");
        return 2;
    }
    if (n_src == 0 && !info) {
        fprintf(stderr, "baton tokenize: no text: give -p TEXT, -f FILE or --stdin (try: baton tokenize --help)\n");
        return 2;
    }

    char err[1024];
    double t0 = bt_now_s();
    bt_tokenizer *tok;
    char *tmpl = NULL;
    if (bt_tokenizer_load(model, &tok, &tmpl, err, sizeof err) != BT_OK) {
        fprintf(stderr, "baton tokenize: %s\n", err);
        return 1;
    }
    double t1 = bt_now_s();
    if (info) {
        print_info(tok, tmpl);
        if (n_src == 0) {
            free(tmpl);
            bt_tokenizer_free(tok);
            return 0;
        }
    }
    free(tmpl);

    size_t len = 0;
    char *text = read_text(prompt, file, escape, &len, err, sizeof err);
    if (!text) {
        bt_tokenizer_free(tok);
        return 1;
    }

    bt_tokens ids = {0};
    double t2 = bt_now_s();
    enum bt_status st = bt_tokenizer_tokenize(tok, text, len, add_special, parse_special, &ids, err, sizeof err);
    double t3 = bt_now_s();
    if (st != BT_OK) {
        fprintf(stderr, "baton tokenize: %s: %s\n", prompt ? "-p" : file ? file : "standard input", err);
        free(text);
        bt_tokens_free(&ids);
        bt_tokenizer_free(tok);
        return 1;
    }
    print_tokens(tok, &ids, ids_only);
    if (show_count) printf("Total number of tokens: %zu\n", ids.n);
    if (timing)
        fprintf(stderr, "baton tokenize: %zu bytes -> %zu tokens: tokenize %.3f s (%.2f MB/s), load %.3f s\n", len,
                ids.n, t3 - t2, (double)len / 1e6 / (t3 - t2 > 0 ? t3 - t2 : 1e-9), t1 - t0);
    free(text);
    bt_tokens_free(&ids);
    bt_tokenizer_free(tok);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "baton tokenize: writing the output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}
