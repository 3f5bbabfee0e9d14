/* common.c - model options, number parsers and the progress display shared
 * by the baton program's subcommands. */
#include "common.h"
#include "../mem.h"
#include "signals.h"

#include "outfile.h"
#include "plan.h"
#include "model/arch.h"
#include "run/bringup.h"
#include "run/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

extern char **environ;

void bt_cli_model_shape(struct bt_random_model *m, const char *arch, const struct bt_cli_model_dims *d) {
    bt_random_model_default(m);
    m->arch = arch;
    m->n_layer = d->n_layer;
    m->n_embd = d->n_embd;
    m->n_head = d->n_head;
    m->n_head_kv = d->n_head_kv;
    m->head_dim = d->head_dim;
    m->n_ff = d->n_ff;
    m->n_vocab = d->n_vocab;
    m->n_expert = 0;
}

void bt_cli_model_defaults(struct bt_random_model *m) {
    bt_cli_model_shape(m, "qwen2moe", &(struct bt_cli_model_dims){8, 256, 8, 4, 32, 512, 1024});
    m->n_expert = 8;
    m->n_expert_used = 2;
    m->n_ff_exp = 256;
}

/* strtol and strtoull skip blanks and take a sign; a value here is digits
 * (with a '-' where negatives are allowed), nothing else */
bool bt_cli_parse_int(const char *s, long lo, long hi, long *out) {
    if (!s || !(*s == '-' || (*s >= '0' && *s <= '9'))) return false;
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool bt_cli_parse_u64(const char *s, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return false; /* strtoull takes " -5" as 2^64-5 */
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = (uint64_t)v;
    return true;
}

void bt_cli_float_arg(const char *flag, const char *arg, float *dst, char *err, size_t n) {
    char *end = NULL;
    errno = 0;
    const double v = strtod(arg, &end);
    if (!*arg || *end || errno || !isfinite(v)) snprintf(err, n, "%s: '%s' is not a number", flag, arg);
    else *dst = (float)v;
}

void bt_cli_i32_arg(const char *flag, const char *arg, int32_t *dst, char *err, size_t n) {
    long v;
    if (!bt_cli_parse_int(arg, INT32_MIN, INT32_MAX, &v)) snprintf(err, n, "%s: '%s' is not an integer", flag, arg);
    else *dst = (int32_t)v;
}

long bt_cli_cores(void) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

void bt_cli_short_flag_elsewhere(char flag, const char *here, char *err, size_t n) {
    const char *what = flag == 't' ? "--threads" : flag == 'm' ? "--model" : flag == 'c' ? "--ctx-size" : "?";
    snprintf(err, n, "-%c is %s in every baton subcommand that has it (as in llama.cpp); %s", flag, what, here);
}

bool bt_cli_threads_check(long threads, const char *what, char *err, size_t n) {
    const long cores = bt_cli_cores();
    if (threads >= 1 && threads <= cores) return true;
    if (threads < 1) snprintf(err, n, "%s: must be at least 1, got %ld", what, threads);
    else snprintf(err, n, "%s: %ld threads, more than this machine's %ld cores", what, threads, cores);
    return false;
}

void bt_cli_engine_help(FILE *f, int col) {
    static const char *const lines[][2] = {
        {"  -t, --threads N", "CPU threads per rank (default: the topology's, else the"},
        {"", "node's cores divided among its ranks)"},
        {"      --topology FILE", "topology file (default: $BATON_TOPOLOGY, else every"},
        {"", "rank on --backend)"},
        {"      --backend cpu|cuda", "without a topology (default cpu)"},
        {"      --partition P", "auto, or layer counts per rank: 12,12"},
        {"      --mmap", "use the weights in place in the file's mapping (4 KiB"},
        {"", "pages: less memory, a slower decode; default: copied"},
        {"", "onto huge pages)"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        const int w = (int)strlen(lines[i][0]);
        fprintf(f, "%s%*s%s\n", lines[i][0], w < col ? col - w : 1, "", lines[i][1]);
    }
}

bool bt_cli_engine_option(struct bt_cli_engine_opts *o, int code, const char *value, char *err, size_t n) {
    long v;
    switch (code) {
    case 't':
        if (!bt_cli_parse_int(value, 1, 4096, &v)) snprintf(err, n, "--threads: '%s' is not an integer in [1, 4096]", value);
        else if (bt_cli_threads_check(v, "--threads", err, n)) o->threads = (int)v;
        return true;
    case BT_CLI_OPT_TOPOLOGY:
        bt_cli_file_arg("--topology", value, &o->topology, err, n);
        return true;
    case BT_CLI_OPT_BACKEND:
        if (!strcmp(value, "cpu") || !strcmp(value, "cuda")) o->backend = value;
        else snprintf(err, n, "--backend: '%s' is not cpu or cuda", value);
        return true;
    case BT_CLI_OPT_PARTITION: o->partition = value; return true;
    case BT_CLI_OPT_MMAP: o->mmap = true; return true;
    default: return false;
    }
}

int bt_cli_next_engine_opt(int argc, char **argv, const char *shorts, const struct option *longs,
                           struct bt_cli_engine_opts *o, char *err, size_t n) {
    const int code = bt_cli_next_opt(argc, argv, shorts, longs, err);
    return code != -1 && bt_cli_engine_option(o, code, optarg, err, n) ? 0 : code;
}

struct bt_rank_config bt_cli_engine_rank_config(const char *prog, const struct bt_cli_engine_opts *o,
                                                int progress_us) {
    return (struct bt_rank_config){
        .prog = prog,
        .topology = o->topology,
        .backend = o->backend,
        .threads = o->threads,
        .copies = 0,
        .partition = o->partition,
        .n_layers = 0,
        .progress_us = progress_us,
    };
}

bool bt_cli_engine_finish(struct bt_cli_engine_opts *o, char *err, size_t n) {
    char scratch[8];
    if (!err) err = scratch, n = sizeof scratch;
    if (!o->topology) o->topology = getenv("BATON_TOPOLOGY");
    return bt_rank_backend_topology_check(o->backend, o->topology, err, n);
}

enum bt_status bt_cli_model_open(const struct bt_random_model *m, bt_transport *t, struct bt_gguf **g, void **bytes,
                                 char *err, size_t n) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const int64_t phys = pages > 0 && page > 0 ? (int64_t)pages * page : (int64_t)8 << 30;
    const int64_t share = phys / (t->local_size > 0 ? t->local_size : 1);
    const enum bt_status st = bt_random_model_open(m, share, g, bytes, err, n);
    return bt_rank_agree(t, st, NULL, err, n);
}

/* The weight types a random model can have: those baton quantises to whose
 * blocks fit small models (32 values). */
static bool parse_type(const char *s, enum bt_type *t) {
    const enum bt_type ok[] = {BT_TYPE_F32,  BT_TYPE_F16,  BT_TYPE_BF16, BT_TYPE_Q8_0,
                               BT_TYPE_Q4_0, BT_TYPE_Q4_1, BT_TYPE_Q5_0, BT_TYPE_Q5_1};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (!strcmp(s, bt_type_name(ok[i]))) {
            *t = ok[i];
            return true;
        }
    }
    return false;
}

/* The integer model options: the parser's ranges and the help's, from one
 * table. */
struct int_opt {
    int code;
    const char *name, *help;
    size_t field; /* offsetof(struct bt_random_model, ...) */
    bool is_int;  /* an int field, else int64_t */
    long lo, hi;
};
#define FIELD(f) offsetof(struct bt_random_model, f)
static const struct int_opt int_opts[] = {
    {OPT_LAYERS, "layers", "transformer layers", FIELD(n_layer), true, 1, 512},
    {OPT_EMBD, "embd", "embedding length", FIELD(n_embd), false, 32, 16384},
    {OPT_HEADS, "heads", "attention heads", FIELD(n_head), false, 1, 256},
    {OPT_HEADS_KV, "heads-kv", "key/value heads", FIELD(n_head_kv), false, 1, 256},
    {OPT_HEAD_DIM, "head-dim", "a head's length", FIELD(head_dim), false, 2, 1024},
    {OPT_FF, "ff", "dense (and shared expert's) feed-forward length", FIELD(n_ff), false, 1, 65536},
    {OPT_EXPERTS, "experts", "routed experts, 0: dense (llama only)", FIELD(n_expert), false, 0, 256},
    {OPT_EXPERTS_USED, "experts-used", "experts per token (= experts: dense MoE)", FIELD(n_expert_used), false, 1,
     256},
    {OPT_FF_EXP, "ff-exp", "an expert's feed-forward length", FIELD(n_ff_exp), false, 1, 65536},
    {OPT_SWA, "swa", "sliding window in tokens (gemma3, gpt-oss; 0: none)", FIELD(n_swa), false, 0, 1L << 20},
    {OPT_SWA_PATTERN, "swa-pattern", "every N-th layer global, the rest slide", FIELD(swa_pattern), true,
     1, 4096},
    {OPT_CTX, "ctx", "context_length written to the file", FIELD(n_ctx), false, 1, 1L << 24},
    {OPT_N_VOCAB, "n-vocab", "tokens in the vocabulary", FIELD(n_vocab), false, 2, 1L << 22},
};
#undef FIELD

static long get_int(const struct bt_random_model *m, const struct int_opt *o) {
    const char *p = (const char *)m + o->field;
    return o->is_int ? (long)*(const int *)p : (long)*(const int64_t *)p;
}

void bt_cli_model_help(FILE *f, const struct bt_random_model *m, bool file) {
    fprintf(f, "model (random weights from --seed, of a supported architecture):\n");
    fprintf(f, "  %-20s %-50s (default %s)\n", "--arch A", bt_arch_names(), m->arch);
    for (size_t i = 0; i < sizeof int_opts / sizeof int_opts[0]; i++) {
        const struct int_opt *o = &int_opts[i];
        if ((o->code == OPT_CTX && !file) || (o->code == OPT_N_VOCAB && file)) continue;
        char flag[32], text[96];
        snprintf(flag, sizeof flag, "--%s N", o->name);
        snprintf(text, sizeof text, "%s [%ld, %ld]", o->help, o->lo, o->hi);
        fprintf(f, "  %-20s %-50s (default %ld)\n", flag, text, get_int(m, o));
    }
    fprintf(f, "  %-20s %-50s (default %s)\n", "--type T", "weights: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1", bt_type_name(m->type));
    fprintf(f, "  %-20s %-50s (default %llu)\n", "--seed N", "the weights [0, 2^64-1]", (unsigned long long)m->seed);
}

bool bt_cli_model_option(struct bt_random_model *m, int code, const char *value, char *err, size_t n) {
    long v = 0;
    for (size_t i = 0; i < sizeof int_opts / sizeof int_opts[0]; i++) {
        const struct int_opt *o = &int_opts[i];
        if (o->code != code) continue;
        if (!bt_cli_parse_int(value, o->lo, o->hi, &v)) {
            snprintf(err, n, "--%s: '%s' is not an integer in [%ld, %ld]", o->name, value, o->lo, o->hi);
            return false;
        }
        char *p = (char *)m + o->field;
        if (o->is_int) *(int *)p = (int)v;
        else *(int64_t *)p = v;
        return true;
    }
    switch (code) {
    case OPT_ARCH:
        if (!bt_arch_find(value)) {
            snprintf(err, n, "--arch: '%s' is not one of %s", value, bt_arch_names());
            return false;
        }
        m->arch = bt_arch_find(value)->name; /* the table's: value may not outlive m */
        return true;
    case OPT_TYPE:
        if (!parse_type(value, &m->type)) {
            snprintf(err, n, "--type: '%s' is not one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1", value);
            return false;
        }
        return true;
    case OPT_SEED:
        if (!bt_cli_parse_u64(value, &m->seed)) {
            snprintf(err, n, "--seed: '%s' is not a non-negative integer", value);
            return false;
        }
        return true;
    }
    snprintf(err, n, "unknown model option");
    return false;
}


int bt_cli_env_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v) return atoi(v);
    }
    return 0;
}

int bt_cli_start(const char *prog) {
    const int env_rank = bt_cli_env_rank();
    bt_cli_signals_install(prog, env_rank);
    return env_rank;
}

int bt_cli_help(int env_rank, void (*usage)(FILE *)) {
    if (env_rank == 0) usage(stdout);
    return 0;
}

void bt_progress_begin(struct bt_progress *p, bool rank0, const char *label) {
    /* under mpirun stderr is a pipe: the launcher sets BATON_PROGRESS=1 when
     * its own stderr is a terminal */
    const char *env = getenv("BATON_PROGRESS");
    p->on = rank0 && (env ? strcmp(env, "1") == 0 : isatty(STDERR_FILENO));
    p->label = label;
    p->last_pct = -1;
    if (p->on) {
        fprintf(stderr, "\r%s ...", label);
        fflush(stderr);
    }
}

void bt_progress_update(struct bt_progress *p, int64_t done, int64_t total) {
    if (!p->on || total <= 0) return;
    const int pct = (int)(100 * done / total);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    fprintf(stderr, "\r%s %3d%%", p->label, pct);
    fflush(stderr);
}

void bt_progress_end(struct bt_progress *p) {
    if (!p->on) return;
    /* the total was an estimate (rank 0's share of the weights is known only
     * once planned): the step is complete now */
    bt_progress_update(p, 1, 1);
    fprintf(stderr, "\r%s done\x1b[K\n", p->label);
    fflush(stderr);
}

/* ---- text helpers (tokenize, generate, gguf) ---- */

/* -p's escapes, in place (llama.cpp's string_process_escapes) */
void bt_cli_process_escapes(char *s, size_t *len) {
    size_t o = 0, n = *len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            s[o++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case '\'': s[o++] = '\''; break;
        case '"': s[o++] = '"'; break;
        case '\\': s[o++] = '\\'; break;
        case 'x': {
            int v = 0, k = 0;
            while (k < 2 && i + 1 < n) {
                char h = s[i + 1];
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) break;
                v = v * 16 + d;
                i++, k++;
            }
            if (k == 2) s[o++] = (char)v;
            else {
                s[o++] = '\\';
                s[o++] = 'x';
                i -= (size_t)k;
            }
            break;
        }
        default:
            s[o++] = '\\';
            s[o++] = c;
        }
    }
    *len = o;
}

/* the whole of a stream; NULL with err set on failure */
char *bt_cli_read_all(FILE *f, const char *name, size_t *len, char *err, size_t errlen) {
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    if (!b) {
        snprintf(err, errlen, "out of memory reading %s", name);
        return NULL;
    }
    for (;;) {
        if (n == cap) {
            if (cap > BT_CLI_READ_MAX) {
                free(b);
                snprintf(err, errlen, "%s: more than %zu MiB: baton reads at most that much text", name,
                         BT_CLI_READ_MAX >> 20);
                return NULL;
            }
            cap = cap * 2 > BT_CLI_READ_MAX ? BT_CLI_READ_MAX + 1 : cap * 2; /* one byte past: is there more? */
            char *p = realloc(b, cap + 1);
            if (!p) {
                free(b);
                snprintf(err, errlen, "out of memory reading %s", name);
                return NULL;
            }
            b = p;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(b);
        snprintf(err, errlen, "%s: read error: %s", name, strerror(errno));
        return NULL;
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* length of the valid UTF-8 sequence at s (0 when invalid) */
static int utf8_len(const unsigned char *s, uint64_t n) {
    int k = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    if (k == 0 || (uint64_t)k > n) return 0;
    for (int i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return k;
}

/* a JSON string; a byte that is not part of valid UTF-8 becomes \u00XX */
void bt_cli_json_str(FILE *f, const char *s, uint64_t n) {
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', f);
    for (uint64_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c == '"' || c == '\\') {
            fprintf(f, "\\%c", c);
            i++;
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else {
            int k = utf8_len(u + i, n - i);
            if (k == 0) {
                fprintf(f, "\\u%04x", c);
                i++;
            } else {
                fwrite(u + i, 1, (size_t)k, f);
                i += (uint64_t)k;
            }
        }
    }
    fputc('"', f);
}

int bt_cli_dump_plan(const struct bt_plan *plan, const char *path, const char *prog) {
    struct bt_outfile o;
    char err[4200];
    if (bt_outfile_open(&o, path, "the plan", err, sizeof err) == BT_OK) {
        bt_plan_dump(plan, o.f);
        if (bt_outfile_commit(&o, "the plan", err, sizeof err) == BT_OK) return 0;
    }
    fprintf(stderr, "%s: %s\n", prog, err);
    return 1;
}

void bt_cli_getopt_start(void) {
    opterr = 0;
    optind = 1;
}

int bt_cli_next_opt(int argc, char **argv, const char *shorts, const struct option *longs, char *err) {
    err[0] = '\0';
    return getopt_long(argc, argv, shorts, longs, NULL);
}

void bt_cli_getopt_error(int code, char **argv, char *err, size_t n) {
    if (code == ':') snprintf(err, n, "%s needs a value", argv[optind - 1]);
    else if (optopt) snprintf(err, n, "unknown option -%c", optopt);
    else snprintf(err, n, "unknown option %s", argv[optind - 1]);
}

bool bt_cli_try_help(const char *cmd, char *err, size_t n) {
    if (!err[0]) return false;
    const size_t len = strlen(err);
    snprintf(err + len, n - len, " (try: baton %s --help)", cmd);
    return true;
}

bool bt_cli_extra_arg(int argc, char **argv, const char *cmd, char *err, size_t n) {
    if (optind >= argc) return false;
    snprintf(err, n, "unexpected argument '%s'", argv[optind]);
    return bt_cli_try_help(cmd, err, n);
}

static const struct option *find_long(const struct option *longs, const char *name) {
    for (; longs->name; longs++)
        if (!strcmp(longs->name, name)) return longs;
    return NULL;
}

bool bt_cli_llama_flags(int argc, char **argv, const char *shorts, const struct option *longs, char *err, size_t n) {
    static const struct {
        const char *flag, *ours;
    } same[] = {{"-np", "--parallel"}, {"-ub", "--ubatch"},        {"-b", "--ubatch"}, {"--batch-size", "--ubatch"},
                {"-s", "--seed"},      {"--temperature", "--temp"}, {"-f", "--file"}, {"-cnv", "--conversation"}};
    static const char gpu_layers[] = "where the layers run is a rank's backend (--backend cuda puts a rank's layers "
                                     "on its GPU) and the topology's placement, not a count",
                      chat[] = "the interactive chat is `baton generate -cnv`";
    static const struct {
        const char *flag, *why;
    } not_here[] = {{"-ngl", gpu_layers}, {"--n-gpu-layers", gpu_layers}, {"--gpu-layers", gpu_layers},
                    {"-cnv", chat},       {"--conversation", chat}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) break;
        if (a[0] != '-' || !a[1]) continue;
        /* this option's value is the next word: skip it */
        const bool is_long = a[1] == '-';
        const struct option *lo = is_long && !strchr(a, '=') ? find_long(longs, a + 2) : NULL;
        const char *so = !is_long && !a[2] ? strchr(shorts, a[1]) : NULL;
        if ((lo && lo->has_arg == required_argument) || (so && so[1] == ':')) {
            i++;
            continue;
        }
        if (lo || so) continue;
        bool mapped = false;
        for (size_t k = 0; k < sizeof same / sizeof same[0] && !mapped; k++) {
            const struct option *ours = find_long(longs, same[k].ours + 2);
            if (strcmp(a, same[k].flag) || !ours) continue;
            argv[i] = (char *)same[k].ours; /* getopt reorders argv's pointers, never writes its strings */
            if (ours->has_arg == required_argument) i++;
            mapped = true;
        }
        for (size_t k = 0; k < sizeof not_here / sizeof not_here[0] && !mapped; k++)
            if (!strcmp(a, not_here[k].flag)) {
                snprintf(err, n, "%s is llama.cpp's and does not apply: %s", a, not_here[k].why);
                return false;
            }
    }
    return true;
}

bool bt_cli_llama_start(int argc, char **argv, const char *shorts, const struct option *longs, const char *cmd,
                        char *err, size_t n) {
    if (!bt_cli_llama_flags(argc, argv, shorts, longs, err, n)) {
        bt_cli_try_help(cmd, err, n);
        return false;
    }
    bt_cli_getopt_start();
    return true;
}

void bt_cli_text_arg(const char *flag, const char *what, const char *arg, const char **dst, char *err, size_t n) {
    if (!*arg) snprintf(err, n, "%s: the %s is empty", flag, what);
    else *dst = arg;
}

void bt_cli_file_arg(const char *flag, const char *arg, const char **dst, char *err, size_t n) {
    bt_cli_text_arg(flag, "file name", arg, dst, err, n);
}

int bt_cli_stdout_finish(const char *prog, int rc) {
    if (rc != 0) return rc;
    errno = 0;
    const bool now = fflush(stdout) != 0;
    const int e = errno;
    if (!now && !ferror(stdout)) return 0;
    /* an earlier write failed and its bytes were dropped: the flag is all that is left */
    fprintf(stderr, "%s: writing the output: %s\n", prog, now && e ? strerror(e) : "a write to stdout failed");
    return 1;
}

/* True, with mpirun's pid, when this process is Open MPI's rank 0 started by
 * mpirun on its host, the user asked nothing of the output (no --tag-output,
 * --timestamp-output, --output-filename, --xml: OMPI_MCA_orte_*output*) and
 * our stdout is mpirun's forwarding pty or pipe. */
static bool under_mpirun(long *ppid) {
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r || strcmp(r, "0") != 0) return false;
    for (char **e = environ; *e; e++)
        if (!strncmp(*e, "OMPI_MCA_orte_", 14) && strstr(*e, "output") && strstr(*e, "output") < strchr(*e, '='))
            return false;
    struct stat ours;
    if (fstat(STDOUT_FILENO, &ours) != 0 || !(S_ISCHR(ours.st_mode) || S_ISFIFO(ours.st_mode))) return false;
    *ppid = (long)getppid();
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%ld/comm", *ppid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    const bool got = fgets(comm, sizeof comm, f) != NULL;
    fclose(f);
    comm[strcspn(comm, "\n")] = 0;
    return got && (strcmp(comm, "mpirun") == 0 || strcmp(comm, "mpiexec") == 0 || strcmp(comm, "orterun") == 0);
}

/* mpirun's stdout itself (pidfd_getfd, Linux 5.6, where this process may
 * ptrace its parent): the same open file, so the same offset in a file. */
static int launcher_fd(long ppid) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    const int pfd = (int)syscall(SYS_pidfd_open, (pid_t)ppid, 0);
    if (pfd < 0) return -1;
    const int fd = (int)syscall(SYS_pidfd_getfd, pfd, STDOUT_FILENO, 0);
    close(pfd);
    return fd;
#else
    (void)ppid;
    return -1;
#endif
}

/* Else mpirun's stdout opened again through /proc: only a pipe, a device or
 * a file opened for appending (its flags, octal, in fdinfo), where a second
 * open file cannot clobber what mpirun writes at its own offset. */
static int launcher_open(long ppid) {
    char path[64], info[64];
    snprintf(path, sizeof path, "/proc/%ld/fd/1", ppid);
    snprintf(info, sizeof info, "/proc/%ld/fdinfo/1", ppid);
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    int flags = O_WRONLY | O_NOCTTY | O_CLOEXEC;
    if (S_ISREG(st.st_mode)) {
        FILE *f = fopen(info, "r");
        if (!f) return -1;
        char line[128];
        unsigned long fl = 0;
        bool append = false;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "flags: %lo", &fl) == 1) append = (fl & O_APPEND) != 0;
        fclose(f);
        if (!append) return -1;
        flags |= O_APPEND;
    } else if (!S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
        return -1;
    }
    return open(path, flags);
}

void bt_cli_stdout_direct(void) {
    long ppid;
    if (!under_mpirun(&ppid)) return;
    int fd = launcher_fd(ppid);
    if (fd < 0) fd = launcher_open(ppid);
    if (fd < 0) return;
    /* a terminal stays with mpirun (its writes to one do not fail) */
    struct stat ours, theirs;
    if (!isatty(fd) && fstat(fd, &theirs) == 0 && fstat(STDOUT_FILENO, &ours) == 0 &&
        !(theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino)) {
        fflush(stdout);
        dup2(fd, STDOUT_FILENO);
    }
    close(fd);
}

void bt_cli_ctx_warn(const char *prog, const struct bt_engine *e, long n_ctx, long parallel) {
    const struct bt_hparams *h = bt_engine_hparams(e);
    const long per_seq = n_ctx / parallel;
    if (h->n_ctx_train <= 0 || per_seq <= h->n_ctx_train) return;
    char how[96];
    if (parallel > 1) snprintf(how, sizeof how, "--ctx-size %ld / --parallel %ld gives", n_ctx, parallel);
    else snprintf(how, sizeof how, "--ctx-size %ld gives", n_ctx);
    fprintf(stderr,
            "%s: warning: %s each sequence %ld positions, more than the %lld the model was trained on "
            "(%s.context_length): past position %lld the output degrades\n",
            prog, how, per_seq, (long long)h->n_ctx_train, bt_engine_arch(e)->name, (long long)h->n_ctx_train);
}

void bt_cli_prompt_tokens(int64_t k, int64_t n, int64_t n_vocab, int32_t *tok) {
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)((k * 7919 + i * 104729 + 17) % n_vocab);
}

bool bt_cli_prompts_init(struct bt_cli_prompts *p, struct bt_gguf *g, int64_t n, int64_t n_ctx, int threads,
                         char *err, size_t n_err) {
    memset(p, 0, sizeof *p);
    p->n = n;
    if (bt_llm_load_gguf(g, 0, -1, NULL, false, &p->m, err, n_err) != BT_OK) return false;
    struct bt_llm_ctx_params cp;
    bt_llm_ctx_default_params(&cp);
    cp.n_ctx = n_ctx;
    cp.n_seq_max = 1;
    cp.n_ubatch = n;
    if (threads > 0) cp.n_threads = threads;
    if (bt_llm_ctx_new(p->m, &cp, &p->c, err, n_err) != BT_OK) return false;
    p->tok = malloc((size_t)n * sizeof *p->tok);
    p->pos = malloc((size_t)n * sizeof *p->pos);
    p->seq = calloc((size_t)n, sizeof *p->seq);
    p->want = calloc((size_t)n, 1);
    p->logits = malloc((size_t)bt_llm_hparams(p->m)->n_vocab * sizeof *p->logits);
    if (!p->tok || !p->pos || !p->seq || !p->want || !p->logits) {
        snprintf(err, n_err, "out of memory");
        return false;
    }
    for (int64_t i = 0; i < n; i++) p->pos[i] = (int32_t)i;
    p->want[n - 1] = 1;
    return true;
}

void bt_cli_prompts_free(struct bt_cli_prompts *p) {
    bt_llm_ctx_free(p->c);
    bt_llm_free(p->m);
    BT_FREE_ALL(p->tok, p->pos, p->seq, p->want, p->logits);
    memset(p, 0, sizeof *p);
}

enum bt_status bt_cli_prompts_run(struct bt_cli_prompts *p, int64_t k, char *err, size_t n_err) {
    bt_kv_clear(bt_llm_ctx_kv(p->c));
    bt_cli_prompt_tokens(k, p->n, bt_llm_hparams(p->m)->n_vocab, p->tok);
    const struct bt_llm_batch b = {p->n, p->tok, p->pos, p->seq, p->want, BT_LLM_OUT_LOGITS};
    return bt_llm_decode(p->c, &b, p->logits, err, n_err);
}

/* the text of token id, or NULL when the vocabulary has none */
static char *token_text(const bt_tokenizer *tok, int32_t id) {
    if (id == BT_TOKEN_NONE) return NULL;
    size_t n;
    const char *p = bt_tokenizer_piece(tok, id, 1, &n);
    char *s = malloc(n + 1);
    if (s) memcpy(s, p, n), s[n] = 0;
    return s;
}

enum bt_status bt_cli_chat_template(const char *arg, struct bt_gguf *g, const bt_tokenizer *tok, const char *fallback,
                                    bt_chat_template **out, char *note, size_t notelen, char *err, size_t errlen) {
    char *model_tmpl = NULL;
    struct bt_gguf_str s;
    if (!arg && bt_gguf_find_key(g, "tokenizer.chat_template") >= 0 &&
        bt_gguf_get_str(g, "tokenizer.chat_template", &s) == BT_OK) {
        if (!(model_tmpl = malloc(s.n + 1))) {
            snprintf(err, errlen, "out of memory");
            return BT_ERR_NOMEM;
        }
        memcpy(model_tmpl, s.data, s.n);
        model_tmpl[s.n] = 0;
    }
    char *bos = token_text(tok, bt_tokenizer_bos(tok)), *eos = token_text(tok, bt_tokenizer_eos(tok));
    enum bt_status st = bt_chat_template_choose(arg, model_tmpl, fallback, bos, eos, out, note, notelen, err, errlen);
    free(model_tmpl), free(bos), free(eos);
    return st;
}
