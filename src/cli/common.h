/* common.h - what the baton program's subcommands share: model options,
 * the topology and MPI start-up, a progress display, small parsers. */
#ifndef BATON_CLI_COMMON_H
#define BATON_CLI_COMMON_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dist.h"
#include "model/random_model.h"
#include "topology.h"

/* ---- the options of a random-weight model (model/random_model.h): make-model
 * writes one; demo, bench pipeline and plan make one in memory when given no
 * file.  getopt_long codes >= 1000 so they clash with no letter. */
enum {
    OPT_ARCH = 1000,
    OPT_LAYERS,
    OPT_EMBD,
    OPT_HEADS,
    OPT_HEADS_KV,
    OPT_HEAD_DIM,
    OPT_FF,
    OPT_EXPERTS,
    OPT_EXPERTS_USED,
    OPT_FF_EXP,
    OPT_SWA,
    OPT_SWA_PATTERN,
    OPT_TYPE,
    OPT_SEED,
    OPT_CTX,     /* make-model only: the context length written */
    OPT_N_VOCAB, /* in memory only: make-model takes its vocabulary from a file */
    OPT_MODEL_LAST,
};

#define BT_CLI_MODEL_LONG_OPTIONS                                                                                   \
    {"arch", required_argument, 0, OPT_ARCH}, {"layers", required_argument, 0, OPT_LAYERS},                        \
        {"embd", required_argument, 0, OPT_EMBD}, {"heads", required_argument, 0, OPT_HEADS},                      \
        {"heads-kv", required_argument, 0, OPT_HEADS_KV}, {"head-dim", required_argument, 0, OPT_HEAD_DIM},       \
        {"ff", required_argument, 0, OPT_FF}, {"experts", required_argument, 0, OPT_EXPERTS},                      \
        {"experts-used", required_argument, 0, OPT_EXPERTS_USED}, {"ff-exp", required_argument, 0, OPT_FF_EXP},   \
        {"swa", required_argument, 0, OPT_SWA}, {"swa-pattern", required_argument, 0, OPT_SWA_PATTERN},           \
        {"type", required_argument, 0, OPT_TYPE}, {"seed", required_argument, 0, OPT_SEED}
/* ...and the token count, for the commands that make the model in memory
 * (demo, bench pipeline, plan, a cluster file's model section) */
#define BT_CLI_BUILTIN_MODEL_LONG_OPTIONS                                                                           \
    {"n-vocab", required_argument, 0, OPT_N_VOCAB}, BT_CLI_MODEL_LONG_OPTIONS

/* The model of demo, bench pipeline and plan when given no file: finishes in
 * seconds on two ranks of a 2-core machine and still shows the pipeline
 * (several micro-batches, several layers per rank, MoE layers with a gated
 * shared expert). */
void bt_cli_model_defaults(struct bt_random_model *m);
/* A random model of architecture arch (no experts) in these dimensions, the
 * rest bt_random_model_default's. */
struct bt_cli_model_dims {
    int n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
};
void bt_cli_model_shape(struct bt_random_model *m, const char *arch, const struct bt_cli_model_dims *d);
/* The model options' help, each with its range and m's value as default
 * (one table in common.c gives the help and the parser's ranges); file: the
 * options of make-model (--ctx; no --n-vocab), else of a model in memory. */
void bt_cli_model_help(FILE *f, const struct bt_random_model *m, bool file);
/* Apply one model option (OPT_ARCH .. OPT_MODEL_LAST-1); false and a message
 * in err for a bad value. */
bool bt_cli_model_option(struct bt_random_model *m, int code, const char *value, char *err, size_t n);
/* Collective: the built-in model made in memory on every rank (refused, with
 * one message from the lowest failing rank in err on every rank, when it
 * would be larger than this host's memory divided among its ranks). */
enum bt_status bt_cli_model_open(const struct bt_random_model *m, bt_transport *t, struct bt_gguf **g, void **bytes,
                                 char *err, size_t n);

/* ---- the rank options of the subcommands that run a GGUF model through the
 * engine (generate, serve, bench model): one parser and one help, so that
 * -t means --threads in each and each takes the same five. */
struct bt_cli_engine_opts {
    const char *topology;  /* --topology FILE, else $BATON_TOPOLOGY (bt_cli_engine_finish) */
    const char *backend;   /* --backend cpu|cuda, NULL when not given */
    const char *partition; /* --partition P, NULL when not given */
    int threads;           /* -t N, 0 when not given */
    bool mmap;             /* --mmap */
};
enum { BT_CLI_OPT_TOPOLOGY = 3000, BT_CLI_OPT_BACKEND, BT_CLI_OPT_PARTITION, BT_CLI_OPT_MMAP };
#define BT_CLI_ENGINE_LONGOPTS                                                                                   \
    {"threads", required_argument, 0, 't'}, {"topology", required_argument, 0, BT_CLI_OPT_TOPOLOGY},             \
        {"backend", required_argument, 0, BT_CLI_OPT_BACKEND},                                                   \
        {"partition", required_argument, 0, BT_CLI_OPT_PARTITION}, {"mmap", no_argument, 0, BT_CLI_OPT_MMAP}
/* The five options' help lines, descriptions from column col. */
void bt_cli_engine_help(FILE *f, int col);
/* True when code (getopt_long's) is one of BT_CLI_ENGINE_LONGOPTS ('t' among
 * them): value applied, or its message in err. */
bool bt_cli_engine_option(struct bt_cli_engine_opts *o, int code, const char *value, char *err, size_t n);
/* bt_cli_next_opt for a command with the engine's options: 0 for one of
 * them, applied to o (or its message in err). */
int bt_cli_next_engine_opt(int argc, char **argv, const char *shorts, const struct option *longs,
                           struct bt_cli_engine_opts *o, char *err, size_t n);
/* After parsing: the topology from $BATON_TOPOLOGY when none was given, then
 * --backend and a topology together refused (bt_rank_backend_topology_check).
 * False with the message in err (err NULL: an error already found, the
 * message not wanted). */
bool bt_cli_engine_finish(struct bt_cli_engine_opts *o, char *err, size_t n);
/* The rank configuration of an engine subcommand (prog starts its messages):
 * the options' topology, backend, threads and partition; copies and the
 * layer count from the topology; the MPI progress thread's period. */
struct bt_rank_config bt_cli_engine_rank_config(const char *prog, const struct bt_cli_engine_opts *o,
                                                int progress_us);

/* --threads N: at least 1 and at most the machine's online cores (more
 * threads than cores make every barrier between ops wait for the OS
 * scheduler: 4096 threads on 2 cores never finish).  what names the value in
 * the message ("--threads", "rank 1: threads"). */
bool bt_cli_threads_check(long threads, const char *what, char *err, size_t n);
/* A short flag that means one thing in every subcommand, as in llama.cpp (-t --threads, -m --model,
 * -c --ctx-size), given to a subcommand without that option: err says what it means and, in here, how
 * to say what was meant. */
void bt_cli_short_flag_elsewhere(char flag, const char *here, char *err, size_t n);
long bt_cli_cores(void);

/* Strict number parsers: the whole string, in range. */
bool bt_cli_parse_int(const char *s, long lo, long hi, long *out);
bool bt_cli_parse_u64(const char *s, uint64_t *out);
/* A flag's value as a finite float (strtod's syntax, nothing after it), or
 * as an int32_t: *dst, or "FLAG: 'ARG' is not a number" ("... an integer")
 * in err. */
void bt_cli_float_arg(const char *flag, const char *arg, float *dst, char *err, size_t n);
void bt_cli_i32_arg(const char *flag, const char *arg, int32_t *dst, char *err, size_t n);

/* --dump-plan FILE: the plan as text (bt_plan_dump), written whole or not at
 * all (outfile.h); 0, or 1 after "PROG: FILE: cannot write the plan: why". */
int bt_cli_dump_plan(const struct bt_plan *plan, const char *path, const char *prog);

/* The end of a command that returned rc: when rc is 0 but a write to stdout
 * failed (a full disk, a closed pipe; now, or earlier, which left stdout's
 * error flag), "PROG: writing the output: why" on stderr and 1; else rc.  A
 * command that failed has said why already. */
int bt_cli_stdout_finish(const char *prog, int rc);

/* The chat template of serve and generate: --chat-template ARG (a built-in
 * format's name or a file with a Jinja text) when given, else the model's
 * tokenizer.chat_template, else `fallback` (NULL: an error); bos_token and
 * eos_token are the texts of the vocabulary's BOS and EOS.  See
 * bt_chat_template_choose for note. */
struct bt_gguf;
struct bt_tokenizer;
struct bt_chat_template;
enum bt_status bt_cli_chat_template(const char *arg, struct bt_gguf *g, const struct bt_tokenizer *tok,
                                    const char *fallback, struct bt_chat_template **out, char *note, size_t notelen,
                                    char *err, size_t errlen);

/* A flag's text: *dst = arg, or, when it is empty, "FLAG: the WHAT is
 * empty" in err (the callers' usage error, exit 2); bt_cli_file_arg for a
 * file name. */
void bt_cli_text_arg(const char *flag, const char *what, const char *arg, const char **dst, char *err, size_t n);
void bt_cli_file_arg(const char *flag, const char *arg, const char **dst, char *err, size_t n);
/* The pieces of a subcommand's getopt_long loop (demo, generate, serve):
 * bt_cli_getopt_start resets getopt for a new argv (quiet: the command
 * words its own messages); bt_cli_getopt_error words getopt's ':' (a flag
 * without its value) and '?' (an unknown flag) in err; bt_cli_try_help ends a
 * message in err with " (try: baton CMD --help)" and says whether there was
 * one; bt_cli_extra_arg words a word left after the flags the same way. */
void bt_cli_getopt_start(void);
void bt_cli_getopt_error(int code, char **argv, char *err, size_t n);
bool bt_cli_try_help(const char *cmd, char *err, size_t n);
bool bt_cli_extra_arg(int argc, char **argv, const char *cmd, char *err, size_t n);
/* getopt_long's next code (-1 after the flags), err emptied for its message. */
int bt_cli_next_opt(int argc, char **argv, const char *shorts, const struct option *longs, char *err);
/* llama.cpp's spellings, before getopt: argv's flags rewritten in place to
 * the command's own where they mean the same (-np --parallel, -ub and -b
 * --ubatch, --batch-size --ubatch, -s --seed, --temperature --temp, -f
 * --file), each only where the command has that option (longs; shorts is its
 * getopt string, so that an option's value is never taken for a flag).
 * False and one message in err for a flag of llama.cpp's that does not apply
 * here (-ngl: a rank's backend and the topology place the layers; -cnv). */
bool bt_cli_llama_flags(int argc, char **argv, const char *shorts, const struct option *longs, char *err, size_t n);
/* bt_cli_llama_flags, then bt_cli_getopt_start; false and the message in
 * err, ending " (try: baton CMD --help)", for a flag that does not apply. */
bool bt_cli_llama_start(int argc, char **argv, const char *shorts, const struct option *longs, const char *cmd,
                        char *err, size_t n);

/* Under mpirun, Open MPI forwards the ranks' stdout and drops its own write
 * errors (a full disk, /dev/full: exit 0, the output lost).  Rank 0 started
 * by mpirun on its host writes straight to mpirun's stdout instead (the same
 * open file where Linux lets it take mpirun's; else, opened again, a pipe, a
 * device or a file opened for appending; see common.c), so that
 * bt_cli_stdout_finish sees the errors; else nothing changes.  Called once,
 * first thing. */
void bt_cli_stdout_direct(void);

struct bt_engine;
/* A sequence of per_seq cells (--ctx-size N over --parallel) holds positions
 * past the model's trained context (<arch>.context_length): baton has no RoPE
 * scaling beyond what the file sets, so the output there degrades.  The run is
 * legitimate (short sequences never get there): one warning on stderr, rank 0. */
void bt_cli_ctx_warn(const char *prog, const struct bt_engine *e, long n_ctx, long parallel);

/* The world rank before MPI starts (from the launcher's environment), so only
 * rank 0 prints usage errors. */
int bt_cli_env_rank(void);

/* A subcommand's start over ranks: bt_cli_env_rank, with prog's signal
 * handlers (signals.h) installed for that rank at once: a signal during MPI's
 * start-up (seconds on a loaded machine) must not end the rank without its
 * line; bt_cli_rank_start (agree.h) installs them again once MPI has started. */
int bt_cli_start(const char *prog);
/* --help: usage written to stdout by rank 0 alone (env_rank, bt_cli_start's);
 * the exit code, 0. */
int bt_cli_help(int env_rank, void (*usage)(FILE *));

/* Progress on long steps, rank 0 only, only when stderr is a terminal (or
 * BATON_PROGRESS=1, which launch/baton-run sets when its stderr is one;
 * BATON_PROGRESS=0 turns it off). */
struct bt_progress {
    bool on;
    const char *label;
    int last_pct;
};
void bt_progress_begin(struct bt_progress *p, bool rank0, const char *label);
void bt_progress_update(struct bt_progress *p, int64_t done, int64_t total);
void bt_progress_end(struct bt_progress *p);

/* -p's backslash escapes (\n \r \t \' \" \\ \xHH), in place, as llama.cpp's
 * string_process_escapes; *len is updated. */
void bt_cli_process_escapes(char *s, size_t *len);
/* The whole of a stream (NUL-terminated, its length in *len); NULL and a
 * message naming `name` on failure, and past BT_CLI_READ_MAX bytes (an
 * endless stream, /dev/zero or `yes`, would take the machine's memory). */
#define BT_CLI_READ_MAX ((size_t)256 << 20)
char *bt_cli_read_all(FILE *f, const char *name, size_t *len, char *err, size_t errlen);
/* s[0..n) as a JSON string; a byte that is not part of valid UTF-8 becomes \u00XX. */
void bt_cli_json_str(FILE *f, const char *s, uint64_t n);

/* The token ids of prompt k of n tokens (a fixed spread over the vocabulary):
 * the prompts `demo --model` and `bench pipeline --model` run, the same on
 * every rank and in the one-process check. */
void bt_cli_prompt_tokens(int64_t k, int64_t n, int64_t n_vocab, int32_t *tok);

/* Those prompts in one process (bt_llm_decode on a CPU backend), the
 * yardstick `demo --model` and `bench pipeline --model` compare with: each a
 * sequence of its own at positions 0..n-1, its last token's logits in
 * logits.  n_ctx: the cache's cells (>= n); threads 0: the default. */
struct bt_cli_prompts {
    struct bt_llm *m;
    struct bt_llm_ctx *c;
    int64_t n;
    int32_t *tok, *pos, *seq;
    int8_t *want;
    float *logits; /* [n_vocab] */
};
bool bt_cli_prompts_init(struct bt_cli_prompts *p, struct bt_gguf *g, int64_t n, int64_t n_ctx, int threads,
                         char *err, size_t n_err);
void bt_cli_prompts_free(struct bt_cli_prompts *p);
/* Prompt k (the cache emptied first). */
enum bt_status bt_cli_prompts_run(struct bt_cli_prompts *p, int64_t k, char *err, size_t n_err);

/* Seconds on the monotonic clock. */

#endif
