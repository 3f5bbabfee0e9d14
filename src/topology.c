/* topology.c - topology files: parse (libyaml document API), validate, and
 * explain every mistake as "FILE:LINE:COLUMN: what is wrong".  The schema is
 * documented in topology.h and docs/topology.md.
 *
 * The parser walks the document tree in a fixed order: the top-level keys,
 * then hosts, ranks (which name hosts), pipeline, transport and mpi (which name
 * ranks).  The first mistake found stops the walk; everything allocated so far
 * is freed and *out is zeroed.
 */
#define _GNU_SOURCE
#include "topology.h"
#include "mem.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* ---- the parse context and error messages ---- */

struct tp {
    const char *path;
    char *err;
    size_t errlen;
    yaml_document_t *doc;
    struct bt_topology *t;
};

/* A place in the schema, for messages: a section ("pipeline" + "." + key) or a
 * list entry ("rank 3" + ": " + key).  The top level has an empty name. */
struct where {
    char name[96];
    const char *sep;
};

static struct bt_topo_pos pos_of(const yaml_node_t *n) {
    struct bt_topo_pos p = {0, 0};
    if (n) {
        p.line = (int)n->start_mark.line + 1;
        p.col = (int)n->start_mark.column + 1;
    }
    return p;
}

static void vmsg(char *err, size_t errlen, const char *path, struct bt_topo_pos p, const char *fmt,
                 va_list ap) {
    if (!err || errlen == 0) return;
    int k;
    if (p.line > 0)
        k = snprintf(err, errlen, "%s:%d:%d: ", path, p.line, p.col);
    else
        k = snprintf(err, errlen, "%s: ", path);
    if (k < 0) k = 0;
    if ((size_t)k < errlen) vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
}

static enum bt_status fail_pos(struct tp *p, struct bt_topo_pos pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static enum bt_status fail_pos(struct tp *p, struct bt_topo_pos pos, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vmsg(p->err, p->errlen, p->path, pos, fmt, ap);
    va_end(ap);
    return BT_ERR_INVALID;
}

#define FAIL(p, node, ...) fail_pos((p), pos_of(node), __VA_ARGS__)

/* "pipeline.micro_batches", "rank 3: threads", "hosts" */
static const char *label(const struct where *w, const char *key, char *buf, size_t n) {
    snprintf(buf, n, "%s%s%s", w->name, w->name[0] ? w->sep : "", key);
    return buf;
}

static const char *scalar_text(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static bool scalar_is_empty(const yaml_node_t *n) {
    return n->type == YAML_SCALAR_NODE && n->data.scalar.length == 0 &&
           n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* What a node is, for "expected X, got Y": 'abc', nothing, a list, a mapping. */
static const char *describe(const yaml_node_t *n, char *buf, size_t bn) {
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (scalar_is_empty(n)) return "nothing";
    const char *s = scalar_text(n);
    size_t len = n->data.scalar.length, max = 40, o = 0;
    if (bn < max + 8) max = bn > 8 ? bn - 8 : 0;
    buf[o++] = '\'';
    for (size_t i = 0; i < len && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (len > max) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o++] = '\'';
    buf[o] = '\0';
    return buf;
}

/* ---- mappings: known keys, unknown keys, duplicates ---- */

struct field {
    const char *key;
    yaml_node_t *k; /* the key node, NULL when absent */
    yaml_node_t *v;
};

static yaml_node_t *node(struct tp *p, int id) { return yaml_document_get_node(p->doc, id); }

/* Fill f[i].k/.v from the mapping; an unknown key or a key given twice is an
 * error naming the allowed keys. */
static enum bt_status get_fields(struct tp *p, const struct where *w, yaml_node_t *map,
                                 struct field *f, int nf) {
    for (int i = 0; i < nf; i++) f[i].k = f[i].v = NULL;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        yaml_node_t *k = node(p, pr->key), *v = node(p, pr->value);
        char b[64];
        const char *ks = scalar_text(k);
        int hit = -1;
        for (int i = 0; ks && i < nf; i++)
            if (!strcmp(ks, f[i].key)) hit = i;
        if (hit < 0) {
            char allowed[256] = "";
            for (int i = 0; i < nf; i++) {
                strncat(allowed, f[i].key, sizeof allowed - strlen(allowed) - 1);
                if (i + 1 < nf) strncat(allowed, ", ", sizeof allowed - strlen(allowed) - 1);
            }
            const char *what = describe(k, b, sizeof b);
            if (w->name[0])
                return FAIL(p, k, "%s: unknown key %s (allowed: %s)", w->name, what, allowed);
            return FAIL(p, k, "unknown key %s (allowed: %s)", what, allowed);
        }
        if (f[hit].k) {
            struct bt_topo_pos first = pos_of(f[hit].k);
            char lb[160];
            return FAIL(p, k, "%s: given twice (first at %d:%d)", label(w, ks, lb, sizeof lb),
                        first.line, first.col);
        }
        f[hit].k = k;
        f[hit].v = v;
    }
    return BT_OK;
}

static enum bt_status need_key(struct tp *p, const struct where *w, yaml_node_t *map,
                               const struct field *f, const char *hint) {
    if (f->v) return BT_OK;
    if (w->name[0]) return FAIL(p, map, "%s: missing key '%s' (%s)", w->name, f->key, hint);
    return FAIL(p, map, "missing key '%s' (%s)", f->key, hint);
}

/* ---- typed values ---- */

static enum bt_status get_int(struct tp *p, const struct where *w, const char *key, yaml_node_t *v,
                              long long min, long long max, int *out) {
    char lb[160], b[64];
    label(w, key, lb, sizeof lb);
    const char *s = scalar_text(v);
    if (!s || scalar_is_empty(v))
        return FAIL(p, v, "%s: expected an integer, got %s", lb, describe(v, b, sizeof b));
    const char *q = s;
    if (*q == '+' || *q == '-') q++;
    if (!*q) return FAIL(p, v, "%s: expected an integer, got %s", lb, describe(v, b, sizeof b));
    for (const char *c = q; *c; c++)
        if (*c < '0' || *c > '9')
            return FAIL(p, v, "%s: expected an integer, got %s", lb, describe(v, b, sizeof b));
    errno = 0;
    long long x = strtoll(s, NULL, 10);
    bool neg = s[0] == '-';
    if ((errno == ERANGE && !neg) || (errno == 0 && x > max))
        return FAIL(p, v, "%s: %s is too large (at most %lld)", lb, describe(v, b, sizeof b), max);
    if (errno == ERANGE || x < min)
        return FAIL(p, v, "%s: must be at least %lld, got %s", lb, min, describe(v, b, sizeof b));
    *out = (int)x;
    return BT_OK;
}

/* A non-empty string scalar. */
static enum bt_status get_str(struct tp *p, const struct where *w, const char *key, yaml_node_t *v,
                              const char **out) {
    char lb[160], b[64];
    const char *s = scalar_text(v);
    if (!s || v->data.scalar.length == 0)
        return FAIL(p, v, "%s: expected a string, got %s", label(w, key, lb, sizeof lb),
                    describe(v, b, sizeof b));
    if (strlen(s) != v->data.scalar.length)
        return FAIL(p, v, "%s: the string contains a NUL byte", label(w, key, lb, sizeof lb));
    *out = s;
    return BT_OK;
}

/* One of names[0..n); *out = its index. */
/* v as one of names[0..n): its index in *out, its place in *pos (NULL: not
 * kept). */
static enum bt_status get_enum(struct tp *p, const struct where *w, const char *key, yaml_node_t *v,
                               const char *const *names, int n, int *out, struct bt_topo_pos *pos) {
    const char *s = scalar_text(v);
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            if (pos) *pos = pos_of(v);
            return BT_OK;
        }
    char lb[160], b[64], one[128] = "";
    for (int i = 0; i < n; i++) {
        if (i) strncat(one, i + 1 < n ? ", " : " or ", sizeof one - strlen(one) - 1);
        strncat(one, names[i], sizeof one - strlen(one) - 1);
    }
    return FAIL(p, v, "%s: expected %s, got %s", label(w, key, lb, sizeof lb), one,
                describe(v, b, sizeof b));
}

static enum bt_status need_seq(struct tp *p, const struct where *w, const char *key, yaml_node_t *v,
                               const char *what) {
    char lb[160], b[64];
    if (v->type != YAML_SEQUENCE_NODE)
        return FAIL(p, v, "%s: expected a list of %s, got %s", label(w, key, lb, sizeof lb), what,
                    describe(v, b, sizeof b));
    return BT_OK;
}

static enum bt_status need_map(struct tp *p, const char *name, yaml_node_t *v, const char *what) {
    char b[64];
    if (v->type != YAML_MAPPING_NODE)
        return FAIL(p, v, "%s: expected a mapping with %s, got %s", name, what,
                    describe(v, b, sizeof b));
    return BT_OK;
}

static int seq_len(const yaml_node_t *v) {
    return (int)(v->data.sequence.items.top - v->data.sequence.items.start);
}
static yaml_node_t *seq_at(struct tp *p, const yaml_node_t *v, int i) {
    return node(p, v->data.sequence.items.start[i]);
}

/* The mapping v (with what) of the place w, its keys in f, its place in *pos. */
static enum bt_status map_fields(struct tp *p, const struct where *w, yaml_node_t *v, const char *what,
                                 struct field *f, int nf, struct bt_topo_pos *pos) {
    enum bt_status st = need_map(p, w->name, v, what);
    if (st) return st;
    *pos = pos_of(v);
    return get_fields(p, w, v, f, nf);
}

/* Entry i of the list v named list: a mapping (with what) whose keys fill f,
 * its place in *pos; *we names it "list[i]" for messages. */
static enum bt_status list_map_at(struct tp *p, yaml_node_t *v, int i, const char *list, const char *what,
                                  struct where *we, struct field *f, int nf, yaml_node_t **e,
                                  struct bt_topo_pos *pos) {
    *e = seq_at(p, v, i);
    we->sep = ": ";
    snprintf(we->name, sizeof we->name, "%s[%d]", list, i);
    return map_fields(p, we, *e, what, f, nf, pos);
}

static char *dupstr(const char *s) {
    char *d = strdup(s);
    BT_ASSERT(d); /* a few bytes: out of memory here is not recoverable anyway */
    return d;
}

static void *xcalloc(size_t n, size_t size) {
    void *q = calloc(n ? n : 1, size);
    BT_ASSERT(q);
    return q;
}

/* "16GiB", "512 MiB", "1000000" (bytes): > 0, below 2^63 (an int64_t size). */
static enum bt_status get_memory(struct tp *p, const struct where *w, const char *key, yaml_node_t *v,
                                 uint64_t *out) {
    static const struct {
        const char *unit;
        uint64_t mult;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"KiB", 1ull << 10},
        {"MiB", 1ull << 20},
        {"GiB", 1ull << 30},
        {"TiB", 1ull << 40},
        {"KB", 1000ull},
        {"MB", 1000000ull},
        {"GB", 1000000000ull},
        {"TB", 1000000000000ull},
    };
    char lb[160], b[64];
    label(w, key, lb, sizeof lb);
    const char *s = scalar_text(v);
    if (!s || scalar_is_empty(v))
        return FAIL(p, v, "%s: expected a size like 16GiB, got %s", lb, describe(v, b, sizeof b));
    const char *c = s;
    uint64_t x = 0;
    bool overflow = false;
    if (*c < '0' || *c > '9') goto bad;
    for (; *c >= '0' && *c <= '9'; c++) {
        unsigned d = (unsigned)(*c - '0');
        if (x > (UINT64_MAX - d) / 10)
            overflow = true;
        else
            x = x * 10 + d;
    }
    while (*c == ' ') c++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(c, units[i].unit)) continue;
        if (overflow || (x && x > BT_TOPO_MAX_MEMORY / units[i].mult))
            return FAIL(p, v, "%s: %s is too large (at most 2^63-1 bytes)", lb,
                        describe(v, b, sizeof b));
        if (x == 0)
            return FAIL(p, v, "%s: must be more than 0 bytes, got %s", lb,
                        describe(v, b, sizeof b));
        *out = x * units[i].mult;
        return BT_OK;
    }
bad:
    return FAIL(
        p, v,
        "%s: expected a size like 16GiB (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), got %s", lb,
        describe(v, b, sizeof b));
}

/* ---- hosts ---- */

static bool host_name_ok(const char *s) {
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

static enum bt_status parse_hosts(struct tp *p, yaml_node_t *v) {
    struct bt_topology *t = p->t;
    struct where top = {"", ""};
    enum bt_status st = need_seq(p, &top, "hosts", v, "hosts");
    if (st) return st;
    int n = seq_len(v);
    if (n == 0) return FAIL(p, v, "hosts: the list is empty; give at least one host");
    if (n > BT_TOPO_MAX_HOSTS)
        return FAIL(p, v, "hosts: %d hosts, more than the %d baton supports", n, BT_TOPO_MAX_HOSTS);
    t->hosts = xcalloc((size_t)n, sizeof *t->hosts);
    t->n_hosts = n;
    for (int i = 0; i < n; i++) {
        yaml_node_t *e;
        struct bt_topo_host *h = &t->hosts[i];
        struct where w;
        struct field f[] = {{.key = "name"},    {.key = "slots"},      {.key = "gpus"},
                            {.key = "address"}, {.key = "gpu_memory"}, {.key = "model"}};
        if ((st = list_map_at(p, v, i, "hosts", "name and slots", &w, f, 6, &e, &h->pos))) return st;
        if ((st = need_key(p, &w, e, &f[0], "the host's name, used by ranks: host:"))) return st;
        const char *name;
        if ((st = get_str(p, &w, "name", f[0].v, &name))) return st;
        if (!host_name_ok(name))
            return FAIL(p, f[0].v,
                        "%s: name: '%s' is not a host name (letters, digits, '.', '_', '-')",
                        w.name, name);
        for (int j = 0; j < i; j++)
            if (!strcmp(t->hosts[j].name, name))
                return FAIL(p, f[0].v, "%s: name: host '%s' is listed twice (first at %d:%d)",
                            w.name, name, t->hosts[j].name_pos.line, t->hosts[j].name_pos.col);
        h->name = dupstr(name);
        h->name_pos = pos_of(f[0].v);
        snprintf(w.name, sizeof w.name, "host %s", name);
        if ((st = need_key(p, &w, e, &f[1], "process slots on the host, usually its cores")))
            return st;
        if ((st = get_int(p, &w, "slots", f[1].v, 1, BT_TOPO_MAX_SLOTS, &h->slots))) return st;
        h->slots_pos = pos_of(f[1].v);
        if (f[2].v) {
            if ((st = get_int(p, &w, "gpus", f[2].v, 0, BT_TOPO_MAX_GPUS, &h->gpus))) return st;
            h->gpus_pos = pos_of(f[2].v);
        }
        if (f[3].v) {
            const char *a;
            if ((st = get_str(p, &w, "address", f[3].v, &a))) return st;
            for (const char *c = a; *c; c++)
                if ((unsigned char)*c <= ' ')
                    return FAIL(p, f[3].v,
                                "%s: address: '%s' contains a space or control character", w.name,
                                a);
            h->address = dupstr(a);
            h->address_pos = pos_of(f[3].v);
        }
        if (f[4].v) {
            if ((st = get_memory(p, &w, "gpu_memory", f[4].v, &h->gpu_memory))) return st;
            h->gpu_memory_pos = pos_of(f[4].v);
        }
        if (f[5].v) {
            const char *m;
            if ((st = get_str(p, &w, "model", f[5].v, &m))) return st;
            h->model = dupstr(m);
            h->model_pos = pos_of(f[5].v);
        }
    }
    return BT_OK;
}

/* ---- ranks ---- */

static int find_host(const struct bt_topology *t, const char *name) {
    for (int i = 0; i < t->n_hosts; i++)
        if (!strcmp(t->hosts[i].name, name)) return i;
    return -1;
}

/* The integer value of a mapping's key, silently (-1 when absent or bad). */
static long long peek_int(struct tp *p, yaml_node_t *map, const char *key) {
    if (map->type != YAML_MAPPING_NODE) return -1;
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const char *k = scalar_text(node(p, pr->key));
        const char *s = scalar_text(node(p, pr->value));
        if (!k || !s || strcmp(k, key) || !*s) continue;
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (*end || errno || x < 0 || s[0] < '0' || s[0] > '9') return -1;
        return x;
    }
    return -1;
}

static enum bt_status parse_backend(struct tp *p, const struct where *w, yaml_node_t *v,
                                    struct bt_topo_rank *r) {
    char b[64];
    const char *s = scalar_text(v);
    const struct bt_topo_host *h = &p->t->hosts[r->host];
    if (s && !strcmp(s, "cpu")) {
        r->backend = BT_TOPO_BACKEND_CPU;
        r->device = -1;
        return BT_OK;
    }
    if (s && !strcmp(s, "cuda"))
        return FAIL(p, v, "%s: backend \"cuda\": name the device, e.g. cuda:0", w->name);
    if (!s || strncmp(s, "cuda:", 5))
        return FAIL(p, v, "%s: backend: expected cpu or cuda:N, got %s", w->name,
                    describe(v, b, sizeof b));
    const char *d = s + 5;
    size_t nd = strlen(d);
    if (nd == 0 || strspn(d, "0123456789") != nd)
        return FAIL(p, v, "%s: backend \"%s\": the device index must be an integer >= 0", w->name,
                    s);
    long long dev = nd > 9 ? LLONG_MAX : strtoll(d, NULL, 10);
    if (h->gpus == 0)
        return FAIL(p, v, "%s: backend \"%s\": host %s has no GPUs (gpus: 0)", w->name, s, h->name);
    if (dev >= h->gpus) {
        if (h->gpus == 1)
            return FAIL(p, v, "%s: backend \"%s\": host %s has 1 GPU (0)", w->name, s, h->name);
        return FAIL(p, v, "%s: backend \"%s\": host %s has %d GPUs (0-%d)", w->name, s, h->name,
                    h->gpus, h->gpus - 1);
    }
    r->backend = BT_TOPO_BACKEND_CUDA;
    r->device = (int)dev;
    return BT_OK;
}

struct dev_use {
    int host, device, order, rank;
};

static int dev_use_cmp(const void *x, const void *y) {
    const struct dev_use *a = x, *b = y;
    if (a->host != b->host) return a->host < b->host ? -1 : 1;
    if (a->device != b->device) return a->device < b->device ? -1 : 1;
    return (a->order > b->order) - (a->order < b->order);
}

static enum bt_status parse_ranks(struct tp *p, yaml_node_t *v) {
    struct bt_topology *t = p->t;
    struct where top = {"", ""};
    enum bt_status st = need_seq(p, &top, "ranks", v, "ranks");
    if (st) return st;
    int n = seq_len(v);
    if (n == 0) return FAIL(p, v, "ranks: the list is empty; give at least one rank");
    if (n > BT_TOPO_MAX_RANKS)
        return FAIL(p, v, "ranks: %d ranks, more than the %d baton runs (BT_SCHED_MAX_BACKENDS)", n,
                    BT_TOPO_MAX_RANKS);
    t->ranks = xcalloc((size_t)n, sizeof *t->ranks);
    t->n_ranks = n;
    /* Which indices the list holds (silently), to name a missing one. */
    bool *present = xcalloc((size_t)n, sizeof *present);
    bool *done = xcalloc((size_t)n, sizeof *done);
    int *order = xcalloc((size_t)n, sizeof *order); /* order[i]: rank of the i-th entry */
    for (int i = 0; i < n; i++) {
        long long x = peek_int(p, seq_at(p, v, i), "rank");
        if (x >= 0 && x < n) present[x] = true;
    }
    int missing = 0;
    while (missing < n && present[missing]) missing++;

    for (int i = 0; i < n && st == BT_OK; i++) {
        yaml_node_t *e = seq_at(p, v, i);
        struct where w = {"", ": "};
        snprintf(w.name, sizeof w.name, "ranks[%d]", i);
        if ((st = need_map(p, w.name, e, "rank, host and backend"))) break;
        long long peek = peek_int(p, e, "rank");
        if (peek >= 0) snprintf(w.name, sizeof w.name, "rank %lld", peek);
        struct field f[] = {{.key = "rank"},
                            {.key = "host"},
                            {.key = "backend"},
                            {.key = "threads"},
                            {.key = "memory"}};
        if ((st = get_fields(p, &w, e, f, 5))) break;
        if ((st = need_key(p, &w, e, &f[0], "this entry's MPI rank, 0.."))) break;
        int idx;
        if ((st = get_int(p, &w, "rank", f[0].v, 0, INT_MAX, &idx))) break;
        if (idx >= n) {
            st = FAIL(p, f[0].v,
                      "rank %d: out of range: %d ranks are listed, so they are numbered 0..%d "
                      "(rank %d is missing)",
                      idx, n, n - 1, missing);
            break;
        }
        struct bt_topo_rank *r = &t->ranks[idx];
        if (done[idx]) {
            st = FAIL(p, f[0].v, "rank %d is listed twice (first at %d:%d)", idx, r->rank_pos.line,
                      r->rank_pos.col);
            break;
        }
        done[idx] = true;
        order[i] = idx;
        r->rank = idx;
        r->pos = pos_of(e);
        r->rank_pos = pos_of(f[0].v);
        snprintf(w.name, sizeof w.name, "rank %d", idx);

        if ((st = need_key(p, &w, e, &f[1], "a name from hosts"))) break;
        const char *hn;
        if ((st = get_str(p, &w, "host", f[1].v, &hn))) break;
        r->host = find_host(t, hn);
        r->host_pos = pos_of(f[1].v);
        if (r->host < 0) {
            char known[256] = "";
            for (int j = 0; j < t->n_hosts && strlen(known) < 200; j++) {
                if (j) strncat(known, ", ", sizeof known - strlen(known) - 1);
                strncat(known, t->hosts[j].name, sizeof known - strlen(known) - 1);
            }
            if (strlen(known) >= 200) strncat(known, ", ...", sizeof known - strlen(known) - 1);
            st = FAIL(p, f[1].v, "rank %d: host '%s' is not in hosts (known: %s)", idx, hn, known);
            break;
        }

        if ((st = need_key(p, &w, e, &f[2], "cpu or cuda:N"))) break;
        if ((st = parse_backend(p, &w, f[2].v, r))) break;
        r->backend_pos = pos_of(f[2].v);

        r->threads = 1;
        if (f[3].v) {
            if (r->backend != BT_TOPO_BACKEND_CPU) {
                st = FAIL(p, f[3].k,
                          "rank %d: threads: only cpu ranks take threads (this rank is cuda:%d)",
                          idx, r->device);
                break;
            }
            if ((st = get_int(p, &w, "threads", f[3].v, 1, BT_TOPO_MAX_THREADS, &r->threads)))
                break;
            r->threads_pos = pos_of(f[3].v);
        }
        if (f[4].v) {
            if ((st = get_memory(p, &w, "memory", f[4].v, &r->memory))) break;
            r->memory_pos = pos_of(f[4].v);
        }
    }
    free(present);
    free(done);
    if (st) {
        free(order);
        return st;
    }

    /* One rank per CUDA device.  Sort the cuda ranks by (host, device, file
     * order); in each group of equal (host, device) the second entry is a clash;
     * report the clash written first in the file. */
    struct dev_use *u = xcalloc((size_t)n, sizeof *u);
    int nu = 0;
    for (int i = 0; i < n; i++)
        if (t->ranks[order[i]].backend == BT_TOPO_BACKEND_CUDA) {
            const struct bt_topo_rank *r = &t->ranks[order[i]];
            u[nu++] = (struct dev_use){r->host, r->device, i, r->rank};
        }
    qsort(u, (size_t)nu, sizeof *u, dev_use_cmp);
    int clash = -1; /* index into u of the reported rank */
    for (int i = 1; i < nu; i++)
        if (u[i].host == u[i - 1].host && u[i].device == u[i - 1].device &&
            (i < 2 || u[i - 2].host != u[i].host || u[i - 2].device != u[i].device) &&
            (clash < 0 || u[i].order < u[clash].order))
            clash = i;
    if (clash >= 0) {
        const struct bt_topo_rank *a = &t->ranks[u[clash].rank], *b = &t->ranks[u[clash - 1].rank];
        st = fail_pos(p, a->backend_pos,
                      "rank %d: backend \"cuda:%d\": device %d of host %s is already used by "
                      "rank %d (at %d:%d); one rank per GPU",
                      a->rank, a->device, a->device, t->hosts[a->host].name, b->rank,
                      b->backend_pos.line, b->backend_pos.col);
    }
    free(u);
    free(order);
    return st;
}

/* ---- pipeline ---- */

/* The group rank r is in, and its place there (-1: none). */
static int group_of(const struct bt_topology *t, int r, int *member) {
    for (int g = 0; g < t->pipeline.n_groups; g++)
        for (int i = 0; i < t->pipeline.groups[g].n_ranks; i++)
            if (t->pipeline.groups[g].ranks[i] == r) {
                *member = i;
                return g;
            }
    *member = -1;
    return -1;
}

/* pipeline.expert_groups: [[0, 1], [2, 3]] */
static enum bt_status parse_groups(struct tp *p, yaml_node_t *v) {
    struct bt_topology *t = p->t;
    struct where w = {"pipeline", "."};
    enum bt_status st;
    if ((st = need_seq(p, &w, "expert_groups", v, "groups, each a list of ranks (the first runs the layers)")))
        return st;
    const int n = seq_len(v);
    t->pipeline.groups = xcalloc((size_t)n + 1, sizeof *t->pipeline.groups);
    for (int g = 0; g < n; g++) {
        yaml_node_t *e = seq_at(p, v, g);
        struct bt_topo_group *grp = &t->pipeline.groups[g];
        struct where we = {"", ""};
        snprintf(we.name, sizeof we.name, "pipeline.expert_groups[%d]", g);
        grp->pos = pos_of(e);
        char b[64];
        if (e->type != YAML_SEQUENCE_NODE)
            return FAIL(p, e, "%s: expected a list of ranks, got %s", we.name, describe(e, b, sizeof b));
        const int m = seq_len(e);
        if (m < 2 || m > BT_TOPO_MAX_GROUP)
            return FAIL(p, e, "%s: %d rank%s; a group has 2 to %d", we.name, m, m == 1 ? "" : "s", BT_TOPO_MAX_GROUP);
        for (int i = 0; i < m; i++) {
            yaml_node_t *rv = seq_at(p, e, i);
            char key[24];
            snprintf(key, sizeof key, "[%d]", i);
            int r = 0;
            if ((st = get_int(p, &we, key, rv, 0, INT_MAX, &r))) return st;
            if (r >= t->n_ranks)
                return FAIL(p, rv, "%s: rank %d does not exist (ranks are 0..%d)", we.name, r, t->n_ranks - 1);
            int at = -1;
            const int other = group_of(t, r, &at);
            if (other >= 0)
                return FAIL(p, rv, "%s: rank %d is already in expert group %d (at %d:%d); a rank is in one group",
                            we.name, r, other, t->pipeline.groups[other].pos.line, t->pipeline.groups[other].pos.col);
            if (r == 0 && i > 0)
                return FAIL(p, rv,
                            "%s: rank 0 runs the model's first layers: it can lead a group, not be a member after "
                            "rank %d",
                            we.name, grp->ranks[0]);
            grp->ranks[i] = r;
            grp->n_ranks = i + 1;
        }
        t->pipeline.n_groups = g + 1;
    }
    return BT_OK;
}

static enum bt_status parse_pipeline(struct tp *p, yaml_node_t *v) {
    struct bt_topology *t = p->t;
    struct where w = {"pipeline", "."};
    struct field f[] = {{.key = "micro_batches"}, {.key = "partition"}, {.key = "pin"}, {.key = "model"},
                        {.key = "expert_groups"}, {.key = "divide"}, {.key = "expert_overlap"}};
    enum bt_status st = map_fields(p, &w, v,
                                   "micro_batches, partition, pin, expert_groups, divide, expert_overlap or model", f, 7,
                                   &t->pipeline.pos);
    if (st) return st;
    if (f[4].v && (st = parse_groups(p, f[4].v))) return st;
    if (f[5].v) {
        /* what the expert groups divide: their experts, or every product's
         * rows as well, or a prompt's tokens in the dense products (their
         * weights whole on every rank of a group) */
        static const char *const divides[] = {"experts", "all", "tokens"};
        int x = 0;
        if ((st = get_enum(p, &w, "divide", f[5].v, divides, 3, &x, NULL))) return st;
        if (x > 0 && t->pipeline.n_groups == 0)
            return FAIL(p, f[5].v, "pipeline.divide: %s: there are no expert_groups to divide the products",
                        divides[x]);
        for (int g = 0; x == 2 && g < t->pipeline.n_groups; g++)
            for (int i = 0; i < t->pipeline.groups[g].n_ranks; i++) {
                const struct bt_topo_rank *r = &t->ranks[t->pipeline.groups[g].ranks[i]];
                if (r->backend != BT_TOPO_BACKEND_CPU)
                    return FAIL(p, f[5].v,
                                "pipeline.divide: tokens: rank %d of expert group %d is cuda:%d; only cpu ranks "
                                "divide a product by tokens (divide: all divides its rows on any rank)",
                                t->pipeline.groups[g].ranks[i], g, r->device);
            }
        t->pipeline.divide_dense = x > 0;
        t->pipeline.divide_tokens = x == 2;
    }
    if (f[6].v) {
        /* experts held past the even share, so the first rank can balance
         * each layer's routed pairs per ubatch (dist.c: chain_bounds) */
        if ((st = get_int(p, &w, "expert_overlap", f[6].v, 0, BT_TOPO_MAX_EXPERT_OVERLAP, &t->pipeline.expert_overlap)))
            return st;
        if (t->pipeline.n_groups == 0)
            return FAIL(p, f[6].v, "pipeline.expert_overlap: there are no expert_groups whose experts could overlap");
    }
    if (f[3].v) {
        const char *m;
        if ((st = get_str(p, &w, "model", f[3].v, &m))) return st;
        t->pipeline.model = dupstr(m);
        t->pipeline.model_pos = pos_of(f[3].v);
    }
    if (f[0].v) {
        if ((st = get_int(p, &w, "micro_batches", f[0].v, 1, BT_TOPO_MAX_MICRO_BATCHES,
                          &t->pipeline.micro_batches)))
            return st;
        t->pipeline.micro_batches_pos = pos_of(f[0].v);
    }
    if (f[1].v) {
        yaml_node_t *pv = f[1].v;
        char b[64];
        t->pipeline.partition_pos = pos_of(pv);
        const char *s = scalar_text(pv);
        if (s && !strcmp(s, "auto")) {
            t->pipeline.partition_auto = true;
        } else if (pv->type != YAML_SEQUENCE_NODE) {
            return FAIL(p, pv,
                        "pipeline.partition: expected auto or a list of layer counts (one per "
                        "rank), got %s",
                        describe(pv, b, sizeof b));
        } else {
            int n = seq_len(pv);
            if (n != t->n_ranks)
                return FAIL(p, pv,
                            "pipeline.partition: %d layer count%s for %d rank%s; give one count "
                            "per rank (or auto)",
                            n, n == 1 ? "" : "s", t->n_ranks, t->n_ranks == 1 ? "" : "s");
            t->pipeline.partition_auto = false;
            t->pipeline.layers = xcalloc((size_t)n, sizeof *t->pipeline.layers);
            int64_t sum = 0;
            for (int i = 0; i < n; i++) {
                char key[32];
                snprintf(key, sizeof key, "partition[%d]", i);
                /* a member of an expert group runs no layer; every other rank one at least */
                int member = -1;
                group_of(t, i, &member);
                yaml_node_t *cv = seq_at(p, pv, i);
                if ((st = get_int(p, &w, key, cv, member > 0 ? 0 : 1, member > 0 ? 0 : INT_MAX,
                                  &t->pipeline.layers[i])))
                    return member > 0 ? FAIL(p, cv,
                                             "pipeline.partition[%d]: rank %d is a member of an expert group whose "
                                             "layers its first rank runs: its count must be 0",
                                             i, i)
                                      : st;
                sum += t->pipeline.layers[i]; /* <= 65536 * INT_MAX: no int64 overflow */
            }
            if (sum > INT_MAX)
                return FAIL(p, pv, "pipeline.partition: layer counts add up to %lld, more than %d",
                            (long long)sum, INT_MAX);
            t->pipeline.layers_sum = sum;
        }
    }
    if (f[2].v) {
        yaml_node_t *pv = f[2].v;
        if ((st = need_seq(p, &w, "pin", pv, "{pattern, rank} entries"))) return st;
        int n = seq_len(pv);
        t->pipeline.pin_pos = pos_of(pv);
        t->pipeline.pins = xcalloc((size_t)n, sizeof *t->pipeline.pins);
        for (int i = 0; i < n; i++) {
            struct bt_topo_pin *pin = &t->pipeline.pins[i];
            struct where we;
            struct field pf[] = {{.key = "pattern"}, {.key = "rank"}, {.key = "compute"}};
            yaml_node_t *e;
            if ((st = list_map_at(p, pv, i, "pipeline.pin", "pattern, rank and compute", &we, pf, 3, &e, &pin->pos)))
                return st;
            if ((st = need_key(p, &we, e, &pf[0], "a glob on tensor names, e.g. \"blk.0.*\"")))
                return st;
            const char *pat;
            if ((st = get_str(p, &we, "pattern", pf[0].v, &pat))) return st;
            pin->pattern = dupstr(pat);
            t->pipeline.n_pins = i + 1;
            pin->pattern_pos = pos_of(pf[0].v);
            if ((st = need_key(p, &we, e, &pf[1], "the rank the matching tensors live on")))
                return st;
            if ((st = get_int(p, &we, "rank", pf[1].v, 0, INT_MAX, &pin->rank))) return st;
            if (pin->rank >= t->n_ranks)
                return FAIL(p, pf[1].v, "%s: rank: rank %d does not exist (ranks are 0..%d)",
                            we.name, pin->rank, t->n_ranks - 1);
            pin->rank_pos = pos_of(pf[1].v);
            if (pf[2].v) {
                static const char *const computes[] = {"pinned", "layer"};
                int x = 0;
                if ((st = get_enum(p, &we, "compute", pf[2].v, computes, 2, &x, NULL))) return st;
                pin->compute_at_layer = x == 1;
            }
        }
    }
    return BT_OK;
}

/* ---- transport ---- */

static const char *const link_names[] = {"mpi", "nccl"};

static enum bt_status parse_transport(struct tp *p, yaml_node_t *v) {
    struct bt_topology *t = p->t;
    struct where w = {"transport", "."};
    struct field f[] = {{.key = "host"}, {.key = "device"}, {.key = "edges"}};
    enum bt_status st = map_fields(p, &w, v, "host, device or edges", f, 3, &t->transport.pos);
    if (st) return st;
    int n_cuda = bt_topology_n_cuda(t);
    if (f[0].v) {
        static const char *const host_names[] = {"mpi"};
        int x = 0;
        if ((st = get_enum(p, &w, "host", f[0].v, host_names, 1, &x, &t->transport.host_pos))) return st;
        t->transport.host = BT_TOPO_LINK_MPI;
    }
    if (f[1].v) {
        int x = 0;
        if ((st = get_enum(p, &w, "device", f[1].v, link_names, 2, &x, &t->transport.device_pos))) return st;
        t->transport.device = (enum bt_topo_link)x;
        t->transport.device_given = true;
        if (x == BT_TOPO_LINK_NCCL && n_cuda < 2)
            return FAIL(p, f[1].v,
                        "transport.device: nccl joins two CUDA ranks, but this file has %s; use "
                        "mpi (edges with a cpu rank always use MPI)",
                        n_cuda == 0 ? "no CUDA rank" : "only 1 CUDA rank");
    }
    if (f[2].v) {
        yaml_node_t *ev = f[2].v;
        if ((st = need_seq(p, &w, "edges", ev, "{ranks, device} entries"))) return st;
        int n = seq_len(ev);
        t->transport.edges_pos = pos_of(ev);
        t->transport.edges = xcalloc((size_t)n, sizeof *t->transport.edges);
        for (int i = 0; i < n; i++) {
            struct bt_topo_edge *ed = &t->transport.edges[i];
            struct where we;
            char b[64];
            struct field ef[] = {{.key = "ranks"}, {.key = "device"}};
            yaml_node_t *e;
            if ((st = list_map_at(p, ev, i, "transport.edges", "ranks and device", &we, ef, 2, &e, &ed->pos)))
                return st;
            if ((st = need_key(p, &we, e, &ef[0], "the two ranks of the edge, e.g. [0, 1]")))
                return st;
            yaml_node_t *rv = ef[0].v;
            if (rv->type != YAML_SEQUENCE_NODE || seq_len(rv) != 2)
                return FAIL(p, rv, "%s: ranks: expected a list of two ranks, e.g. [0, 1], got %s",
                            we.name,
                            rv->type == YAML_SEQUENCE_NODE
                                ? (seq_len(rv) == 1 ? "a list of 1" : "a longer or empty list")
                                : describe(rv, b, sizeof b));
            int ab[2];
            for (int k = 0; k < 2; k++) {
                yaml_node_t *x = seq_at(p, rv, k);
                char key[32];
                snprintf(key, sizeof key, "ranks[%d]", k);
                if ((st = get_int(p, &we, key, x, 0, INT_MAX, &ab[k]))) return st;
                if (ab[k] >= t->n_ranks)
                    return FAIL(p, x, "%s: rank %d does not exist (ranks are 0..%d)", we.name,
                                ab[k], t->n_ranks - 1);
            }
            if (ab[0] == ab[1])
                return FAIL(p, rv, "%s: ranks: an edge joins two different ranks, got [%d, %d]",
                            we.name, ab[0], ab[1]);
            ed->a = ab[0] < ab[1] ? ab[0] : ab[1];
            ed->b = ab[0] < ab[1] ? ab[1] : ab[0];
            ed->ranks_pos = pos_of(rv);
            for (int j = 0; j < i; j++)
                if (t->transport.edges[j].a == ed->a && t->transport.edges[j].b == ed->b)
                    return FAIL(p, rv, "%s: edge %d-%d is listed twice (first at %d:%d)", we.name,
                                ed->a, ed->b, t->transport.edges[j].ranks_pos.line,
                                t->transport.edges[j].ranks_pos.col);
            if ((st = need_key(p, &we, e, &ef[1], "nccl or mpi"))) return st;
            int x = 0;
            if ((st = get_enum(p, &we, "device", ef[1].v, link_names, 2, &x, &ed->device_pos))) return st;
            ed->device = (enum bt_topo_link)x;
            t->transport.n_edges = i + 1;
            if (x == BT_TOPO_LINK_NCCL) {
                for (int k = 0; k < 2; k++) {
                    int r = k ? ed->b : ed->a;
                    if (t->ranks[r].backend == BT_TOPO_BACKEND_CPU)
                        return FAIL(p, ef[1].v,
                                    "%s: device: nccl on edge %d-%d, but rank %d is a cpu rank; "
                                    "NCCL joins two CUDA ranks (edges with a cpu rank use MPI)",
                                    we.name, ed->a, ed->b, r);
                }
            }
        }
    }
    return BT_OK;
}

/* ---- mpi ---- */

static enum bt_status parse_mpi(struct tp *p, yaml_node_t *v) {
    struct bt_topology *t = p->t;
    struct where w = {"mpi", "."};
    struct field f[] = {{.key = "pml"}, {.key = "single_copy"}, {.key = "extra_args"}};
    enum bt_status st = map_fields(p, &w, v, "pml, single_copy or extra_args", f, 3, &t->mpi.pos);
    if (st) return st;
    if (f[0].v) {
        static const char *const names[] = {"ucx", "ob1"};
        int x = 0;
        if ((st = get_enum(p, &w, "pml", f[0].v, names, 2, &x, &t->mpi.pml_pos))) return st;
        t->mpi.pml = x == 0 ? BT_TOPO_PML_UCX : BT_TOPO_PML_OB1;
    }
    if (f[1].v) {
        static const char *const names[] = {"cma", "none"};
        int x = 0;
        if ((st = get_enum(p, &w, "single_copy", f[1].v, names, 2, &x, &t->mpi.single_copy_pos))) return st;
        t->mpi.single_copy = x == 0 ? BT_TOPO_SINGLE_COPY_CMA : BT_TOPO_SINGLE_COPY_NONE;
    }
    if (f[2].v) {
        yaml_node_t *av = f[2].v;
        if ((st = need_seq(p, &w, "extra_args", av, "strings"))) return st;
        int n = seq_len(av);
        t->mpi.extra_args_pos = pos_of(av);
        t->mpi.extra_args = xcalloc((size_t)n, sizeof *t->mpi.extra_args);
        for (int i = 0; i < n; i++) {
            char key[32];
            const char *s;
            snprintf(key, sizeof key, "extra_args[%d]", i);
            yaml_node_t *x = seq_at(p, av, i);
            if ((st = get_str(p, &w, key, x, &s))) return st;
            if (strchr(s, '\n'))
                return FAIL(p, x, "mpi.%s: an argument may not contain a newline", key);
            t->mpi.extra_args[i] = dupstr(s);
            t->mpi.n_extra_args = i + 1;
        }
    }
    return BT_OK;
}

/* ---- the file ---- */

static enum bt_status parse_root(struct tp *p, yaml_node_t *root) {
    struct bt_topology *t = p->t;
    struct where top = {"", ""};
    enum bt_status st;
    char b[64];
    if (root->type != YAML_MAPPING_NODE)
        return FAIL(p, root,
                    "expected a mapping with hosts, ranks, pipeline, transport and mpi "
                    "at the top level, got %s",
                    describe(root, b, sizeof b));
    t->root_pos = pos_of(root);
    struct field f[] = {{.key = "hosts"},
                        {.key = "ranks"},
                        {.key = "pipeline"},
                        {.key = "transport"},
                        {.key = "mpi"}};
    if ((st = get_fields(p, &top, root, f, 5))) return st;
    if ((st = need_key(p, &top, root, &f[0], "a list of the machines ranks run on"))) return st;
    if ((st = need_key(p, &top, root, &f[1], "a list saying where each MPI rank runs"))) return st;
    t->hosts_pos = pos_of(f[0].k);
    t->ranks_pos = pos_of(f[1].k);
    t->pipeline.micro_batches = 1;
    t->pipeline.partition_auto = true;
    t->transport.host = BT_TOPO_LINK_MPI;
    if ((st = parse_hosts(p, f[0].v))) return st;
    if ((st = parse_ranks(p, f[1].v))) return st;
    if (f[2].v && (st = parse_pipeline(p, f[2].v))) return st;
    if (f[3].v && (st = parse_transport(p, f[3].v))) return st;
    if (!t->transport.device_given)
        t->transport.device = bt_topology_n_cuda(t) >= 2 ? BT_TOPO_LINK_NCCL : BT_TOPO_LINK_MPI;
    if (f[4].v && (st = parse_mpi(p, f[4].v))) return st;
    return BT_OK;
}

static enum bt_status yaml_error(struct tp *p, const yaml_parser_t *ps) {
    if (ps->error == YAML_MEMORY_ERROR)
        return fail_pos(p, (struct bt_topo_pos){0, 0}, "out of memory");
    if (ps->error == YAML_READER_ERROR) {
        /* libyaml gives a byte offset here, not a mark: count lines up to it. */
        struct bt_topo_pos pos = {1, 1};
        FILE *f = fopen(p->path, "rb");
        for (size_t i = 0; f && i < ps->problem_offset; i++) {
            int c = fgetc(f);
            if (c == EOF) break;
            if (c == '\n') {
                pos.line++;
                pos.col = 1;
            } else if ((c & 0xc0) != 0x80) { /* count characters, not UTF-8 continuation bytes */
                pos.col++;
            }
        }
        if (f) fclose(f);
        return fail_pos(p, pos, "invalid YAML: %s (byte offset %zu)",
                        ps->problem ? ps->problem : "unreadable input", ps->problem_offset);
    }
    struct bt_topo_pos pos = {(int)ps->problem_mark.line + 1, (int)ps->problem_mark.column + 1};
    if (ps->context)
        return fail_pos(p, pos, "invalid YAML: %s (%s at %d:%d)", ps->problem, ps->context,
                        (int)ps->context_mark.line + 1, (int)ps->context_mark.column + 1);
    return fail_pos(p, pos, "invalid YAML: %s", ps->problem ? ps->problem : "syntax error");
}

/* The whole file, at most BT_TOPO_MAX_FILE_BYTES, into *text (NUL-ended). */
static enum bt_status read_capped(struct tp *p, unsigned char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    FILE *f = fopen(p->path, "rb");
    if (!f) {
        fail_pos(p, (struct bt_topo_pos){0, 0}, "cannot open: %s", strerror(errno));
        return BT_ERR_IO;
    }
    struct stat sb;
    enum bt_status st = BT_OK;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fail_pos(p, (struct bt_topo_pos){0, 0}, "cannot read: is a directory");
        st = BT_ERR_IO;
    } else if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > BT_TOPO_MAX_FILE_BYTES) {
        /* refused before reading a byte */
        st = fail_pos(p, (struct bt_topo_pos){0, 0},
                      "%lld bytes, more than the %d a topology file may have (BT_TOPO_MAX_FILE_BYTES)",
                      (long long)sb.st_size, BT_TOPO_MAX_FILE_BYTES);
    }
    unsigned char *buf = st == BT_OK ? malloc((size_t)BT_TOPO_MAX_FILE_BYTES + 2) : NULL;
    if (st == BT_OK && !buf) st = fail_pos(p, (struct bt_topo_pos){0, 0}, "out of memory");
    size_t n = 0;
    while (st == BT_OK && n <= (size_t)BT_TOPO_MAX_FILE_BYTES) {
        size_t k = fread(buf + n, 1, (size_t)BT_TOPO_MAX_FILE_BYTES + 1 - n, f);
        n += k;
        if (k == 0) break;
    }
    if (st == BT_OK && ferror(f)) {
        fail_pos(p, (struct bt_topo_pos){0, 0}, "cannot read: %s", strerror(errno));
        st = BT_ERR_IO;
    } else if (st == BT_OK && n > (size_t)BT_TOPO_MAX_FILE_BYTES) { /* a pipe or a growing file */
        st = fail_pos(p, (struct bt_topo_pos){0, 0},
                      "more than the %d bytes a topology file may have (BT_TOPO_MAX_FILE_BYTES)",
                      BT_TOPO_MAX_FILE_BYTES);
    }
    fclose(f);
    if (st != BT_OK) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return BT_OK;
}

/* libyaml's parser takes time quadratic in the nesting depth: walk the
 * events first and stop at the first list or mapping deeper than
 * BT_TOPO_MAX_DEPTH, before any deep work is done.  Syntax errors are left to
 * the loader, which reports them the same way. */
static enum bt_status check_depth(struct tp *p, const unsigned char *text, size_t len) {
    yaml_parser_t ps;
    BT_ASSERT(yaml_parser_initialize(&ps));
    yaml_parser_set_input_string(&ps, text, len);
    enum bt_status st = BT_OK;
    int depth = 0;
    for (;;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&ps, &e)) break;
        const yaml_event_type_t type = e.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > BT_TOPO_MAX_DEPTH)
                st = fail_pos(p,
                              (struct bt_topo_pos){(int)e.start_mark.line + 1, (int)e.start_mark.column + 1},
                              "lists and mappings nested more than %d deep (a topology needs 5)",
                              BT_TOPO_MAX_DEPTH);
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&e);
        if (st != BT_OK || type == YAML_STREAM_END_EVENT) break;
    }
    yaml_parser_delete(&ps);
    return st;
}

enum bt_status bt_topology_load(const char *path, struct bt_topology *out, char *err,
                                size_t errlen) {
    BT_ASSERT(path && out);
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';
    struct tp p = {path, err, errlen, NULL, out};

    unsigned char *text;
    size_t len;
    enum bt_status st = read_capped(&p, &text, &len);
    if (st != BT_OK) return st;
    if ((st = check_depth(&p, text, len)) != BT_OK) {
        free(text);
        return st;
    }

    yaml_parser_t ps;
    yaml_document_t doc, doc2;
    BT_ASSERT(yaml_parser_initialize(&ps));
    yaml_parser_set_input_string(&ps, text, len);
    if (!yaml_parser_load(&ps, &doc)) {
        st = yaml_error(&p, &ps);
        yaml_parser_delete(&ps);
        free(text);
        return st;
    }
    p.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) {
        st = fail_pos(&p, (struct bt_topo_pos){1, 1},
                      "the file is empty; a topology needs at least hosts: and ranks: (see "
                      "configs/README.md)");
    } else {
        /* One document per file: a second "---" is a mistake, not ignored. */
        if (!yaml_parser_load(&ps, &doc2)) {
            st = yaml_error(&p, &ps);
        } else {
            yaml_node_t *r2 = yaml_document_get_root_node(&doc2);
            if (r2)
                st = fail_pos(&p,
                              (struct bt_topo_pos){(int)doc2.start_mark.line + 1,
                                                   (int)doc2.start_mark.column + 1},
                              "a second YAML document; a topology file holds one");
            yaml_document_delete(&doc2);
        }
        if (st == BT_OK) {
            st = parse_root(&p, root);
            if (st == BT_OK) out->path = dupstr(path);
        }
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&ps);
    free(text);
    if (st != BT_OK) bt_topology_free(out);
    return st;
}

enum bt_status bt_topology_check_world(const struct bt_topology *t, int world_size, char *err,
                                       size_t errlen) {
    BT_ASSERT(t);
    if (world_size == t->n_ranks) return BT_OK;
    struct tp p = {t->path ? t->path : "(topology)", err, errlen, NULL, NULL};
    return fail_pos(&p, t->ranks_pos,
                    "ranks: the file lists %d rank%s but MPI started %d process%s; run it with "
                    "mpirun -np %d (launch/baton-run does this)",
                    t->n_ranks, t->n_ranks == 1 ? "" : "s", world_size, world_size == 1 ? "" : "es",
                    t->n_ranks);
}

enum bt_status bt_topology_check_layers(const struct bt_topology *t, int n_layers, char *err,
                                        size_t errlen) {
    BT_ASSERT(t);
    struct tp p = {t->path ? t->path : "(topology)", err, errlen, NULL, NULL};
    if (n_layers < 1)
        return fail_pos(&p, t->pipeline.partition_pos,
                        "pipeline.partition: the model has %d layers; nothing to place", n_layers);
    if (t->pipeline.partition_auto || t->pipeline.layers_sum == n_layers) return BT_OK;
    char terms[160] = "";
    for (int i = 0; i < t->n_ranks; i++) {
        char one[24];
        snprintf(one, sizeof one, "%s%d", i ? " + " : "", t->pipeline.layers[i]);
        if (strlen(terms) + strlen(one) > 120) {
            strncat(terms, " + ...", sizeof terms - strlen(terms) - 1);
            break;
        }
        strncat(terms, one, sizeof terms - strlen(terms) - 1);
    }
    return fail_pos(&p, t->pipeline.partition_pos,
                    "pipeline.partition: layer counts add up to %lld (%s) but the model has %d "
                    "layers",
                    (long long)t->pipeline.layers_sum, terms, n_layers);
}

void bt_topology_free(struct bt_topology *t) {
    if (!t) return;
    for (int i = 0; t->hosts && i < t->n_hosts; i++) {
        free(t->hosts[i].name);
        free(t->hosts[i].address);
        free(t->hosts[i].model);
    }
    free(t->hosts);
    free(t->ranks);
    free(t->pipeline.layers);
    for (int i = 0; i < t->pipeline.n_pins; i++) free(t->pipeline.pins[i].pattern);
    BT_FREE_ALL(t->pipeline.pins, t->pipeline.groups, t->pipeline.model, t->transport.edges);
    for (int i = 0; i < t->mpi.n_extra_args; i++) free(t->mpi.extra_args[i]);
    free(t->mpi.extra_args);
    free(t->path);
    memset(t, 0, sizeof *t);
}

/* ---- helpers ---- */

const struct bt_topo_rank *bt_topology_rank(const struct bt_topology *t, int r) {
    return t && r >= 0 && r < t->n_ranks ? &t->ranks[r] : NULL;
}

const struct bt_topo_host *bt_topology_host(const struct bt_topology *t, int h) {
    return t && h >= 0 && h < t->n_hosts ? &t->hosts[h] : NULL;
}

const char *bt_topology_host_target(const struct bt_topology *t, int h) {
    const struct bt_topo_host *x = bt_topology_host(t, h);
    if (!x) return NULL;
    return x->address ? x->address : x->name;
}

int bt_topology_local_rank(const struct bt_topology *t, int r) {
    if (!bt_topology_rank(t, r)) return -1;
    int k = 0;
    for (int i = 0; i < r; i++)
        if (t->ranks[i].host == t->ranks[r].host) k++;
    return k;
}

uint64_t bt_topology_rank_memory(const struct bt_topology *t, int r) {
    const struct bt_topo_rank *tr = bt_topology_rank(t, r);
    if (!tr) return 0;
    if (tr->memory || tr->backend != BT_TOPO_BACKEND_CUDA) return tr->memory;
    return t->hosts[tr->host].gpu_memory;
}

/* What host h's ranks take of its slots: one each (threads false), or a CPU
 * rank's threads and one for any other (threads true). */
static int64_t host_load(const struct bt_topology *t, int h, bool threads) {
    int64_t k = 0;
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].host == h)
            k += threads && t->ranks[i].backend == BT_TOPO_BACKEND_CPU ? t->ranks[i].threads : 1;
    return k;
}

static bool host_exceeds(const struct bt_topology *t, int h, bool threads) {
    const struct bt_topo_host *x = bt_topology_host(t, h);
    return x && host_load(t, h, threads) > x->slots;
}

static bool any_host_exceeds(const struct bt_topology *t, bool threads) {
    for (int h = 0; h < t->n_hosts; h++)
        if (host_exceeds(t, h, threads)) return true;
    return false;
}

int bt_topology_host_ranks(const struct bt_topology *t, int h) { return (int)host_load(t, h, false); }
int64_t bt_topology_host_threads(const struct bt_topology *t, int h) { return host_load(t, h, true); }
bool bt_topology_host_oversubscribed(const struct bt_topology *t, int h) { return host_exceeds(t, h, false); }
bool bt_topology_any_oversubscribed(const struct bt_topology *t) { return any_host_exceeds(t, false); }
bool bt_topology_host_threads_exceed(const struct bt_topology *t, int h) { return host_exceeds(t, h, true); }
bool bt_topology_any_threads_exceed(const struct bt_topology *t) { return any_host_exceeds(t, true); }

int bt_topology_n_cuda(const struct bt_topology *t) {
    int k = 0;
    for (int i = 0; i < t->n_ranks; i++)
        if (t->ranks[i].backend == BT_TOPO_BACKEND_CUDA) k++;
    return k;
}

bool bt_topology_has_cuda(const struct bt_topology *t) { return bt_topology_n_cuda(t) > 0; }

enum bt_topo_link bt_topology_edge_link(const struct bt_topology *t, int a, int b) {
    const struct bt_topo_rank *ra = bt_topology_rank(t, a), *rb = bt_topology_rank(t, b);
    BT_ASSERT(ra && rb && a != b);
    if (ra->backend == BT_TOPO_BACKEND_CPU || rb->backend == BT_TOPO_BACKEND_CPU)
        return BT_TOPO_LINK_MPI;
    int lo = a < b ? a : b, hi = a < b ? b : a;
    for (int i = 0; i < t->transport.n_edges; i++)
        if (t->transport.edges[i].a == lo && t->transport.edges[i].b == hi)
            return t->transport.edges[i].device;
    return t->transport.device;
}

