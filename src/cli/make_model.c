/* make_model.c - `baton make-model OUT.gguf --vocab FILE`: a small model of one
 * of the supported architectures with random weights and a real vocabulary
 * (model/random_model.h), as a GGUF file any GGUF reader (llama.cpp's
 * included) can open.  What the main job runs when no model is given: the
 * text is nonsense, but every path of a real model (tokenizer, layers, MoE
 * routing, KV cache, sampling, the pipeline over ranks) is taken.  The same
 * options give the same bytes. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "gguf.h"
#include "outfile.h"

#define MM_PROG "baton make-model"

struct mm_opts {
    const char *out, *vocab;
    struct bt_random_model m;
};

static void mm_usage(FILE *f, const struct mm_opts *o) {
    fprintf(f,
            "usage: baton make-model OUT.gguf --vocab FILE [options]\n"
            "\n"
            "Writes a small model with random weights (from --seed) and the vocabulary of\n"
            "FILE (a GGUF file's tokenizer.* keys, e.g. tests/data/vocab/ggml-vocab-gpt-2.gguf)\n"
            "to OUT.gguf.  It generates nonsense, through every path a real model takes.\n"
            "\n"
            "  --vocab FILE         the vocabulary (required)\n"
            "  -h, --help           this text\n");
    bt_cli_model_help(f, &o->m, true);
}

static int parse_mm(int argc, char **argv, struct mm_opts *o, char *err, size_t errn) {
    enum { O_VOCAB = OPT_MODEL_LAST + 1 };
    static const struct option longs[] = {
        {"vocab", required_argument, 0, O_VOCAB}, {"ctx", required_argument, 0, OPT_CTX},
        {"help", no_argument, 0, 'h'},           BT_CLI_MODEL_LONG_OPTIONS,
        {0, 0, 0, 0},
    };
    bt_cli_getopt_start();
    int code;
    while ((code = bt_cli_next_opt(argc, argv, ":h", longs, err)) != -1) {
        switch (code) {
        case O_VOCAB: bt_cli_file_arg("--vocab", optarg, &o->vocab, err, errn); break;
        case 'h': return 0;
        case ':': snprintf(err, errn, "%s needs a value", argv[optind - 1]); break;
        case '?': snprintf(err, errn, "unknown option %s", argv[optind - 1]); break;
        default: bt_cli_model_option(&o->m, code, optarg, err, errn); break;
        }
        if (bt_cli_try_help("make-model", err, errn)) return 2;
    }
    if (optind + 1 != argc) {
        snprintf(err, errn, "%s (try: baton make-model --help)",
                 optind >= argc ? "missing OUT.gguf" : "give one output file");
        return 2;
    }
    o->out = argv[optind];
    if (!o->out[0]) {
        snprintf(err, errn, "OUT.gguf: the file name is empty (try: baton make-model --help)");
        return 2;
    }
    if (!o->vocab) {
        snprintf(err, errn, "missing --vocab FILE (try: baton make-model --help)");
        return 2;
    }
    if (bt_random_model_check(&o->m, err, errn) != BT_OK) return 2;
    return -1;
}

int bt_cli_make_model(int argc, char **argv) {
    struct mm_opts o = {0};
    bt_random_model_default(&o.m);
    char err[1024] = "";
    const int prc = parse_mm(argc, argv, &o, err, sizeof err);
    if (prc == 0) {
        mm_usage(stdout, &o);
        return 0;
    }
    if (prc > 0) {
        fprintf(stderr, MM_PROG ": %s\n", err);
        return prc;
    }
    /* an OUT that cannot be written (a directory, no such folder) is found
     * before the work, not at the rename after it */
    struct bt_gguf *vocab = NULL;
    struct bt_gguf_writer *w = NULL;
    int rc = 1;
    if (bt_outfile_check(o.out, err, sizeof err) != BT_OK || bt_gguf_open(o.vocab, &vocab, err, sizeof err) != BT_OK ||
        bt_gguf_writer_open(o.out, &w, err, sizeof err) != BT_OK ||
        bt_random_model_write(&o.m, vocab, w, err, sizeof err) != BT_OK)
        goto out;
    const enum bt_status st = bt_gguf_writer_finish(w, err, sizeof err);
    w = NULL;
    if (st == BT_OK) rc = 0;
out:
    if (rc) fprintf(stderr, MM_PROG ": %s\n", err);
    bt_gguf_writer_close(w);
    bt_gguf_close(vocab);
    return rc;
}
