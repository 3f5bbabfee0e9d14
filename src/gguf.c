/* gguf.c - the GGUF reader (over a read-only mapping, every size checked
 * before use) and the streaming GGUF v3 writer.  The format is in gguf.h.
 *
 * Reader: one pass over the header with a cursor; each read first checks
 * that the bytes are in the file (sizes are compared against what is left,
 * never added up unchecked), then the tensor table is checked as a whole
 * (alignment, bounds, overlaps).  Values of variable size (strings, arrays of
 * strings or arrays) get one bt_gguf_value each in a pool, so element i of
 * an array of strings is O(1); a count is checked against the smallest bytes
 * its elements could take before anything is allocated for it, so the pool
 * never grows past the file's size in entries.
 *
 * Writer: metadata is serialised into memory as it is set; the header goes
 * out at the first tensor data (or finish), the data follows padded to the
 * alignment, into a temporary file renamed into place at the end.
 */
#include "gguf.h"
#include "mem.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads and writes GGUF's little-endian values in place: a little-endian host is required"
#endif

/* ---- types ---------------------------------------------------------------- */

static const char *const gguf_type_names[BT_GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool",  "string", "array", "uint64", "int64", "float64",
};
static const size_t gguf_type_sizes[BT_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *bt_gguf_type_name(enum bt_gguf_type t) {
    return ((unsigned)t < BT_GGUF_TYPE_COUNT) ? gguf_type_names[t] : "?";
}
size_t bt_gguf_type_size(enum bt_gguf_type t) { return ((unsigned)t < BT_GGUF_TYPE_COUNT) ? gguf_type_sizes[t] : 0; }

/* ggml's type numbers (ggml.h) with their block sizes; the one table that
 * maps GGUF files to baton's types (by name, see bt_ggml_type_to_bt). */
static const struct bt_ggml_type_info ggml_types[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},           {2, "Q4_0", 32, 18},       {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},        {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 40},
    {10, "Q2_K", 256, 84},     {11, "Q3_K", 256, 110},     {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},     {16, "IQ2_XXS", 256, 66},  {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},     {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},    {23, "IQ4_XS", 256, 136},   {24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},          {28, "F64", 1, 8},         {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},     {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
    {40, "NVFP4", 64, 36},     {41, "Q1_0", 128, 18},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const struct bt_ggml_type_info *bt_ggml_type_info(uint32_t id) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].id == id) return &ggml_types[i];
    return NULL;
}

enum bt_type bt_ggml_type_to_bt(uint32_t id) {
    const struct bt_ggml_type_info *info = bt_ggml_type_info(id);
    if (!info) return BT_TYPE_COUNT;
    for (int t = 0; t < BT_TYPE_COUNT; t++) {
        if (strcasecmp(bt_type_name((enum bt_type)t), info->name) != 0) continue;
        /* a baton type of the same name must have ggml's layout */
        BT_ASSERT(bt_blck_size((enum bt_type)t) == info->blck_size);
        BT_ASSERT(bt_type_size((enum bt_type)t) == info->type_size);
        return (enum bt_type)t;
    }
    return BT_TYPE_COUNT;
}

uint32_t bt_ggml_type_from_bt(enum bt_type t) {
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (strcasecmp(bt_type_name(t), ggml_types[i].name) == 0) return ggml_types[i].id;
    BT_ASSERT(!"baton type without a GGUF number");
    return UINT32_MAX;
}

/* ---- names: a printable quote of a key or tensor name for messages ------- */

/* "name" with non-printable bytes as \xHH, cut at 80 bytes with "..." */
static void quote(char *dst, size_t n, const char *s, uint64_t len) {
    size_t o = 0;
    if (n < 8) {
        if (n) dst[0] = 0;
        return;
    }
    dst[o++] = '"';
    for (uint64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= 80 || o + 8 >= n) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            dst[o++] = (char)c;
        } else {
            o += (size_t)snprintf(dst + o, n - o, "\\x%02x", c);
        }
    }
    dst[o++] = '"';
    dst[o] = 0;
}

/* ---- name sets: open addressing over (bytes, length), index payload ------ */

struct nameset {
    int64_t *slot;  /* -1 empty, else an index the caller resolves */
    uint64_t cap;   /* power of two, at least twice count */
    uint64_t count;
};

static uint64_t name_hash(const char *s, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}


/* ---- the reader ------------------------------------------------------------ */

struct bt_gguf {
    char *path;
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    bool header_only; /* bt_gguf_open_header: base holds the header, no data */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset;

    int64_t n_kv, cap_kv;
    char **keys;          /* NUL-terminated copies */
    uint64_t *key_off;    /* file offset of each key-value entry */
    int64_t *kv_val;      /* index of each key's value in pool */
    struct bt_gguf_value *pool;
    int64_t n_pool, cap_pool;
    struct nameset key_set;

    int64_t n_tensors, cap_tensors;
    struct bt_gguf_tensor *tensors;
    struct nameset tensor_set;
    int n_layers;
    int64_t *by_layer;    /* tensor indices sorted by (layer, index) */

    struct bt_gguf **shards; /* a split model's other files (shard k at [k - 1]), each a reader of its own */
    int n_other;             /* entries of shards */

    char err[BT_GGUF_ERR_LEN];
};

/* Arrays grow with what is parsed, never by a count the file claims: a
 * corrupted count in a large file must not allocate (and touch) gigabytes
 * before the entries it promises turn out not to be there. */
static bool grow(void **a, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    if ((uint64_t)c > SIZE_MAX / elem) return false;
    void *x = realloc(*a, (size_t)c * elem);
    if (!x) return false;
    *a = x;
    *cap = c;
    return true;
}

/* the set's lookup: keys or tensor names, depending on which set */
static const char *set_name(const struct bt_gguf *g, const struct nameset *s, int64_t i) {
    return s == &g->key_set ? g->keys[i] : g->tensors[i].name;
}
static int64_t nameset_find(const struct bt_gguf *g, const struct nameset *s, const char *name, uint64_t n) {
    if (!s->slot) return -1;
    for (uint64_t h = name_hash(name, n) & (s->cap - 1);; h = (h + 1) & (s->cap - 1)) {
        int64_t i = s->slot[h];
        if (i < 0) return -1;
        const char *o = set_name(g, s, i);
        if (strlen(o) == n && memcmp(o, name, n) == 0) return i;
    }
}
static void nameset_put(const struct bt_gguf *g, struct nameset *s, int64_t i) {
    const char *name = set_name(g, s, i);
    uint64_t h = name_hash(name, strlen(name)) & (s->cap - 1);
    while (s->slot[h] >= 0) h = (h + 1) & (s->cap - 1);
    s->slot[h] = i;
}
/* add index i, doubling (and rehashing) at half full; false when out of memory */
static bool nameset_add(const struct bt_gguf *g, struct nameset *s, int64_t i) {
    if ((s->count + 1) * 2 > s->cap) {
        uint64_t cap = s->cap ? s->cap * 2 : 32;
        if (cap > SIZE_MAX / sizeof(int64_t)) return false;
        int64_t *old = s->slot, *slot = malloc(cap * sizeof *slot);
        if (!slot) return false;
        for (uint64_t k = 0; k < cap; k++) slot[k] = -1;
        uint64_t old_cap = s->cap;
        s->slot = slot;
        s->cap = cap;
        for (uint64_t k = 0; k < old_cap; k++)
            if (old[k] >= 0) nameset_put(g, s, old[k]);
        free(old);
    }
    nameset_put(g, s, i);
    s->count++;
    return true;
}

struct parser {
    struct bt_gguf *g;
    uint64_t pos;
    char ctx[160]; /* `key "general.name"`, `tensor "x"`, or "" */
    char *err;
    size_t n_err;
    uint64_t n_kv, n_tensors; /* as the header claims */
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static bool fail(struct parser *p, uint64_t off, const char *fmt, ...) {
    char msg[BT_GGUF_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->err && p->n_err)
        snprintf(p->err, p->n_err, "%s: offset %" PRIu64 ": %s%s%s", p->g->path, off, p->ctx, p->ctx[0] ? ": " : "",
                 msg);
    return false;
}

static uint64_t left(const struct parser *p) { return p->g->size - p->pos; }

/* n bytes at the cursor, else a message naming what was being read */
static bool need(struct parser *p, uint64_t n, const char *what) {
    if (n <= left(p)) return true;
    return fail(p, p->pos, "%s truncated: %" PRIu64 " bytes needed, %" PRIu64 " left in the file", what, n, left(p));
}
static bool rd_u32(struct parser *p, uint32_t *v, const char *what) {
    if (!need(p, 4, what)) return false;
    memcpy(v, p->g->base + p->pos, 4);
    p->pos += 4;
    return true;
}
static bool rd_u64(struct parser *p, uint64_t *v, const char *what) {
    if (!need(p, 8, what)) return false;
    memcpy(v, p->g->base + p->pos, 8);
    p->pos += 8;
    return true;
}

/* a string's length and bytes; *s points into the mapping */
static bool rd_str(struct parser *p, uint64_t *n, const char **s, const char *what) {
    char w[64];
    uint64_t at = p->pos;
    snprintf(w, sizeof w, "%s length", what);
    if (!rd_u64(p, n, w)) return false;
    if (*n > left(p)) {
        return fail(p, at, "%s of %" PRIu64 " bytes runs past the end of the file (%" PRIu64 " bytes left)", what,
                    *n, left(p));
    }
    *s = (const char *)p->g->base + p->pos;
    p->pos += *n;
    return true;
}

static int64_t pool_reserve(struct parser *p, uint64_t n) {
    struct bt_gguf *g = p->g;
    if ((uint64_t)(g->cap_pool - g->n_pool) < n) {
        uint64_t need_cap = (uint64_t)g->n_pool + n, cap = g->cap_pool ? (uint64_t)g->cap_pool : 64;
        while (cap < need_cap) cap *= 2;
        if (cap > SIZE_MAX / sizeof *g->pool) return -1;
        struct bt_gguf_value *v = realloc(g->pool, cap * sizeof *v);
        if (!v) return -1;
        g->pool = v;
        g->cap_pool = (int64_t)cap;
    }
    int64_t first = g->n_pool;
    g->n_pool += (int64_t)n;
    return first;
}

/* parse one value of type `type` at the cursor into pool[slot] */
static bool parse_value(struct parser *p, enum bt_gguf_type type, int64_t slot, int depth) {
    struct bt_gguf *g = p->g;
    struct bt_gguf_value v = {.type = type, .elem_type = BT_GGUF_TYPE_COUNT, .raw_off = p->pos, .first = -1};
    if (type == BT_GGUF_TYPE_STRING) {
        const char *s;
        if (!rd_str(p, &v.n, &s, "string")) return false;
        v.off = p->pos - v.n;
    } else if (type == BT_GGUF_TYPE_ARRAY) {
        uint32_t et;
        uint64_t at = p->pos;
        if (!rd_u32(p, &et, "array element type")) return false;
        if (et >= BT_GGUF_TYPE_COUNT) return fail(p, at, "unknown array element type %" PRIu32, et);
        v.elem_type = (enum bt_gguf_type)et;
        at = p->pos;
        if (!rd_u64(p, &v.n, "array length")) return false;
        v.off = p->pos;
        if (et == BT_GGUF_TYPE_ARRAY && depth + 1 >= BT_GGUF_MAX_DEPTH)
            return fail(p, at, "arrays nested more than %d deep", BT_GGUF_MAX_DEPTH);
        uint64_t min = gguf_type_sizes[et] ? gguf_type_sizes[et] : (et == BT_GGUF_TYPE_STRING ? 8 : 12);
        if (v.n > left(p) / min) {
            return fail(p, at, "array of %" PRIu64 " %s elements needs at least %" PRIu64 "x%" PRIu64
                        " bytes, %" PRIu64 " left in the file",
                        v.n, gguf_type_names[et], v.n, min, left(p));
        }
        if (gguf_type_sizes[et]) {
            if (et == BT_GGUF_TYPE_BOOL) {
                for (uint64_t i = 0; i < v.n; i++) {
                    uint8_t b = g->base[p->pos + i];
                    if (b > 1) return fail(p, p->pos + i, "bool array element %" PRIu64 " is %u, not 0 or 1", i, b);
                }
            }
            p->pos += v.n * min;
        } else {
            int64_t first = pool_reserve(p, v.n);
            if (first < 0) return fail(p, at, "out of memory for an array of %" PRIu64 " elements", v.n);
            v.first = first;
            for (uint64_t i = 0; i < v.n; i++)
                if (!parse_value(p, v.elem_type, first + (int64_t)i, depth + 1)) return false;
        }
    } else {
        size_t sz = gguf_type_sizes[type];
        if (!need(p, sz, gguf_type_names[type])) return false;
        v.off = p->pos;
        if (type == BT_GGUF_TYPE_BOOL && g->base[p->pos] > 1)
            return fail(p, p->pos, "bool value is %u, not 0 or 1", g->base[p->pos]);
        p->pos += sz;
    }
    v.raw_size = p->pos - v.raw_off;
    g->pool[slot] = v;
    return true;
}

static bool parse_kv(struct parser *p) {
    struct bt_gguf *g = p->g;
    for (int64_t i = 0; (uint64_t)i < p->n_kv; i++) {
        uint64_t at = p->pos, n;
        const char *s;
        char what[48];
        snprintf(what, sizeof what, "key %" PRId64, i);
        p->ctx[0] = 0;
        if (!rd_str(p, &n, &s, what)) return false;
        if (n == 0) return fail(p, at, "key %" PRId64 " is empty", i);
        quote(p->ctx + 4, sizeof p->ctx - 4, s, n);
        memcpy(p->ctx, "key ", 4);
        if (n > BT_GGUF_MAX_KEY) return fail(p, at, "key is %" PRIu64 " bytes (at most %d)", n, BT_GGUF_MAX_KEY);
        if (memchr(s, 0, n)) return fail(p, at, "key contains a NUL byte");
        int64_t dup = nameset_find(g, &g->key_set, s, n);
        if (dup >= 0) return fail(p, at, "key appears twice (first at offset %" PRIu64 ")", g->key_off[dup]);
        /* three arrays of one capacity */
        int64_t c1 = g->cap_kv, c2 = g->cap_kv, c3 = g->cap_kv;
        if (!grow((void **)&g->keys, &c1, i + 1, sizeof *g->keys) ||
            !grow((void **)&g->key_off, &c2, i + 1, sizeof *g->key_off) ||
            !grow((void **)&g->kv_val, &c3, i + 1, sizeof *g->kv_val) || !(g->keys[i] = malloc(n + 1)))
            return fail(p, at, "out of memory");
        g->cap_kv = c1;
        g->n_kv = i + 1;
        memcpy(g->keys[i], s, n);
        g->keys[i][n] = 0;
        g->key_off[i] = at;
        if (!nameset_add(g, &g->key_set, i)) return fail(p, at, "out of memory");
        uint32_t type;
        uint64_t tat = p->pos;
        if (!rd_u32(p, &type, "value type")) return false;
        if (type >= BT_GGUF_TYPE_COUNT) return fail(p, tat, "unknown value type %" PRIu32, type);
        int64_t slot = pool_reserve(p, 1);
        if (slot < 0) return fail(p, tat, "out of memory");
        g->kv_val[i] = slot;
        if (!parse_value(p, (enum bt_gguf_type)type, slot, 0)) return false;
    }
    p->ctx[0] = 0;
    return true;
}

/* general.alignment: a uint32 power of two when present */
static bool parse_alignment(struct parser *p) {
    struct bt_gguf *g = p->g;
    g->alignment = BT_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = bt_gguf_find_key(g, "general.alignment");
    if (i < 0) return true;
    const struct bt_gguf_value *v = &g->pool[g->kv_val[i]];
    snprintf(p->ctx, sizeof p->ctx, "key \"general.alignment\"");
    if (v->type != BT_GGUF_TYPE_UINT32)
        return fail(p, v->raw_off, "is %s, must be uint32", gguf_type_names[v->type]);
    uint32_t a;
    memcpy(&a, g->base + v->off, 4);
    if (a == 0 || (a & (a - 1)) != 0) return fail(p, v->off, "alignment %" PRIu32 " is not a power of two", a);
    g->alignment = a;
    p->ctx[0] = 0;
    return true;
}

/* "blk.N." -> N, else -1 */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *c = name + 4;
    long n = 0;
    if (*c < '0' || *c > '9') return -1;
    for (; *c >= '0' && *c <= '9'; c++) {
        n = n * 10 + (*c - '0');
        if (n > INT_MAX / 2) return -1;
    }
    return *c == '.' ? (int)n : -1;
}

static bool parse_tensors(struct parser *p) {
    struct bt_gguf *g = p->g;
    for (int64_t i = 0; (uint64_t)i < p->n_tensors; i++) {
        uint64_t at = p->pos, n;
        if (!grow((void **)&g->tensors, &g->cap_tensors, i + 1, sizeof *g->tensors)) return fail(p, at, "out of memory");
        struct bt_gguf_tensor *t = &g->tensors[i];
        const char *s;
        char what[48];
        snprintf(what, sizeof what, "tensor %" PRId64 " name", i);
        p->ctx[0] = 0;
        if (!rd_str(p, &n, &s, what)) return false;
        if (n == 0) return fail(p, at, "tensor %" PRId64 " has an empty name", i);
        memcpy(p->ctx, "tensor ", 7);
        quote(p->ctx + 7, sizeof p->ctx - 7, s, n);
        if (n >= BT_GGUF_MAX_NAME)
            return fail(p, at, "name is %" PRIu64 " bytes (at most %d)", n, BT_GGUF_MAX_NAME - 1);
        if (memchr(s, 0, n)) return fail(p, at, "name contains a NUL byte");
        memcpy(t->name, s, n);
        t->name[n] = 0;
        t->info_offset = at;
        int64_t dup = nameset_find(g, &g->tensor_set, s, n);
        if (dup >= 0) return fail(p, at, "name appears twice (first at offset %" PRIu64 ")", g->tensors[dup].info_offset);
        uint32_t nd;
        uint64_t dat = p->pos;
        if (!rd_u32(p, &nd, "dimension count")) return false;
        if (nd > BT_GGUF_MAX_DIMS) return fail(p, dat, "%" PRIu32 " dimensions (at most %d)", nd, BT_GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        for (int d = 0; d < BT_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t e, eat = p->pos;
            snprintf(what, sizeof what, "dimension %" PRIu32, d);
            if (!rd_u64(p, &e, what)) return false;
            if (e == 0) return fail(p, eat, "dimension %" PRIu32 " is 0", d);
            if (e > (uint64_t)INT64_MAX) return fail(p, eat, "dimension %" PRIu32 " is negative (%" PRId64 ")", d, (int64_t)e);
            t->ne[d] = (int64_t)e;
        }
        uint32_t type;
        uint64_t tat = p->pos;
        if (!rd_u32(p, &type, "type")) return false;
        const struct bt_ggml_type_info *info = bt_ggml_type_info(type);
        if (!info) return fail(p, tat, "unknown tensor type %" PRIu32, type);
        t->ggml_type = type;
        t->type = bt_ggml_type_to_bt(type);
        if (t->ne[0] % info->blck_size != 0) {
            return fail(p, dat, "dimension 0 (%" PRId64 ") is not a multiple of %s's block size %" PRId64, t->ne[0],
                        info->name, info->blck_size);
        }
        int64_t ne = 1;
        for (int d = 0; d < BT_GGUF_MAX_DIMS; d++) {
            if (__builtin_mul_overflow(ne, t->ne[d], &ne))
                return fail(p, dat, "%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " elements overflow 64 bits",
                            t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        }
        uint64_t size;
        if (__builtin_mul_overflow((uint64_t)(ne / info->blck_size), (uint64_t)info->type_size, &size) ||
            size > g->size)
            return fail(p, dat, "%" PRId64 " elements of %s (%" PRIu64 " blocks of %zu bytes) cannot fit in a file of %" PRIu64 " bytes",
                        ne, info->name, (uint64_t)(ne / info->blck_size), info->type_size, g->size);
        t->size = size;
        uint64_t oat = p->pos;
        if (!rd_u64(p, &t->offset, "data offset")) return false;
        t->file_offset = oat; /* the offset field's position, until the data section is known */
        t->layer = layer_of(t->name);
        t->shard = 0;
        if (t->layer >= g->n_layers) g->n_layers = t->layer + 1;
        if (!nameset_add(g, &g->tensor_set, i)) return fail(p, at, "out of memory");
        g->n_tensors = i + 1;
    }
    p->ctx[0] = 0;
    return true;
}

static int cmp_by_offset_g_less(const struct bt_gguf_tensor *a, const struct bt_gguf_tensor *b) {
    return a->offset < b->offset ? -1 : a->offset > b->offset ? 1 : 0;
}
/* qsort has no context argument: sort an array of pointers */
static int cmp_tensor_ptr(const void *a, const void *b) {
    return cmp_by_offset_g_less(*(const struct bt_gguf_tensor *const *)a, *(const struct bt_gguf_tensor *const *)b);
}

static bool check_data(struct parser *p) {
    struct bt_gguf *g = p->g;
    uint64_t a = g->alignment;
    uint64_t data = p->pos % a ? p->pos + (a - p->pos % a) : p->pos;
    g->data_offset = data;
    if (g->n_tensors == 0) return true;
    if (data > g->size) {
        return fail(p, p->pos, "data section would start at offset %" PRIu64 " (aligned to %" PRIu64
                    "), past the end of the file (%" PRIu64 " bytes)",
                    data, a, g->size);
    }
    uint64_t room = g->size - data;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct bt_gguf_tensor *t = &g->tensors[i];
        uint64_t field = t->file_offset;
        snprintf(p->ctx, sizeof p->ctx, "tensor ");
        quote(p->ctx + 7, sizeof p->ctx - 7, t->name, strlen(t->name));
        if (t->offset % a)
            return fail(p, field, "data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64, t->offset, a);
        if (t->offset > room || t->size > room - t->offset) {
            return fail(p, field, "data [%" PRIu64 ", %" PRIu64 ") of the data section runs past the end of the file (the data section holds %" PRIu64 " bytes)",
                        t->offset, t->offset > UINT64_MAX - t->size ? UINT64_MAX : t->offset + t->size, room);
        }
        t->file_offset = data + t->offset;
    }
    struct bt_gguf_tensor **s = malloc((size_t)g->n_tensors * sizeof *s);
    if (!s) return fail(p, 8, "out of memory");
    for (int64_t i = 0; i < g->n_tensors; i++) s[i] = &g->tensors[i];
    qsort(s, (size_t)g->n_tensors, sizeof *s, cmp_tensor_ptr);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const struct bt_gguf_tensor *x = s[i - 1], *y = s[i];
        if (x->offset + x->size > y->offset) {
            /* report the later entry of the table */
            const struct bt_gguf_tensor *late = x->info_offset > y->info_offset ? x : y, *early = late == x ? y : x;
            char q[100];
            quote(q, sizeof q, early->name, strlen(early->name));
            snprintf(p->ctx, sizeof p->ctx, "tensor ");
            quote(p->ctx + 7, sizeof p->ctx - 7, late->name, strlen(late->name));
            free(s);
            return fail(p, late->info_offset,
                        "data [%" PRIu64 ", %" PRIu64 ") overlaps tensor %s [%" PRIu64 ", %" PRIu64 ")", late->offset,
                        late->offset + late->size, q, early->offset, early->offset + early->size);
        }
    }
    free(s);
    p->ctx[0] = 0;
    return true;
}

static int64_t g_layer_key(const struct bt_gguf *g, int64_t i) { return g->tensors[i].layer; }

/* g->by_layer for the tensor table as it is; false when out of memory */
static bool sort_layers(struct bt_gguf *g) {
    free(g->by_layer);
    g->by_layer = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *g->by_layer);
    if (!g->by_layer) return false;
    /* insertion by (layer, index) through a counting pass would need
     * n_layers counters; a stable merge sort keeps it O(n log n) in n_tensors */
    int64_t n = g->n_tensors;
    int64_t *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!tmp) return false;
    for (int64_t i = 0; i < n; i++) g->by_layer[i] = i;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                tmp[o++] = g_layer_key(g, g->by_layer[b]) < g_layer_key(g, g->by_layer[a]) ? g->by_layer[b++]
                                                                                           : g->by_layer[a++];
            while (a < mid) tmp[o++] = g->by_layer[a++];
            while (b < hi) tmp[o++] = g->by_layer[b++];
        }
        memcpy(g->by_layer, tmp, (size_t)n * sizeof *tmp);
    }
    free(tmp);
    return true;
}

static bool index_layers(struct parser *p) { return sort_layers(p->g) || fail(p, 8, "out of memory"); }

static bool parse(struct parser *p) {
    struct bt_gguf *g = p->g;
    if (g->size < 4) return fail(p, 0, "file is %" PRIu64 " bytes, too short for a GGUF header", g->size);
    if (memcmp(g->base, "GGUF", 4) != 0) {
        char q[48];
        quote(q, sizeof q, (const char *)g->base, 4);
        return fail(p, 0, "not a GGUF file (magic %s, expected \"GGUF\")", q);
    }
    p->pos = 4;
    uint32_t v;
    if (!rd_u32(p, &v, "version")) return false;
    uint32_t sw = __builtin_bswap32(v);
    if ((v & 0xffff) == 0 && sw >= 1 && sw <= 3)
        return fail(p, 4, "big-endian GGUF file (version %" PRIu32 " byte-swapped); only little-endian files are read", sw);
    if (v == 1) return fail(p, 4, "GGUF version 1 is not supported (versions 2 and 3 are)");
    if (v < 2 || v > 3) return fail(p, 4, "unsupported GGUF version %" PRIu32 " (versions 2 and 3 are)", v);
    g->version = v;
    uint64_t nt, nkv;
    if (!rd_u64(p, &nt, "tensor count") || !rd_u64(p, &nkv, "key-value count")) return false;
    /* smallest entries: a tensor 8+4+4+8 bytes (no dimension), a key-value 8+1+4+1 */
    if (nt > left(p) / 24)
        return fail(p, 8, "tensor count %" PRIu64 " cannot fit in the %" PRIu64 " bytes after the header", nt, left(p));
    if (nkv > left(p) / 14)
        return fail(p, 16, "key-value count %" PRIu64 " cannot fit in the %" PRIu64 " bytes after the header", nkv,
                    left(p));
    p->n_tensors = nt;
    p->n_kv = nkv;
    return parse_kv(p) && parse_alignment(p) && parse_tensors(p) && check_data(p) && index_layers(p);
}

static enum bt_status open_common(struct bt_gguf *g, struct bt_gguf **out, char *err, size_t n_err) {
    struct parser p = {.g = g, .err = err, .n_err = n_err};
    if (!parse(&p)) {
        bt_gguf_close(g);
        return BT_ERR_INVALID;
    }
    *out = g;
    return BT_OK;
}

static struct bt_gguf *gguf_new(const char *name) {
    struct bt_gguf *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->path = strdup(name ? name : "(memory)");
    if (!g->path) {
        free(g);
        return NULL;
    }
    return g;
}

/* data (size bytes; header_only: the header alone, size the whole file's)
 * parsed as a GGUF named name. */
static enum bt_status open_bytes(const void *data, uint64_t size, bool header_only, const char *name,
                                 struct bt_gguf **out, char *err, size_t n_err) {
    struct bt_gguf *g = gguf_new(name);
    if (!g) {
        snprintf(err, n_err, "%s: out of memory", name ? name : "(memory)");
        return BT_ERR_NOMEM;
    }
    g->base = data;
    g->size = size;
    g->header_only = header_only;
    return open_common(g, out, err, n_err);
}

enum bt_status bt_gguf_open_memory(const void *data, size_t size, const char *name, struct bt_gguf **out, char *err,
                                   size_t n_err) {
    *out = NULL;
    return open_bytes(data, size, false, name, out, err, n_err);
}

enum bt_status bt_gguf_open_header(const void *data, size_t header_size, uint64_t file_size, const char *name,
                                   struct bt_gguf **out, char *err, size_t n_err) {
    *out = NULL;
    if (file_size < header_size) {
        snprintf(err, n_err, "%s: the file (%" PRIu64 " bytes) is shorter than its header (%zu)", name, file_size,
                 header_size);
        return BT_ERR_INVALID;
    }
    /* the parser reads the header alone; the data section is checked
     * against the size the whole file has */
    return open_bytes(data, file_size, true, name, out, err, n_err);
}

static enum bt_status open_file(const char *path, struct bt_gguf **out, char *err, size_t n_err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, n_err, "%s: cannot open: %s", path, strerror(errno));
        return BT_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, n_err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return BT_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, n_err, "%s: not a regular file", path);
        close(fd);
        return BT_ERR_INVALID;
    }
    struct bt_gguf *g = gguf_new(path);
    if (!g) {
        snprintf(err, n_err, "%s: out of memory", path);
        close(fd);
        return BT_ERR_NOMEM;
    }
    g->size = (uint64_t)st.st_size;
    if (g->size == 0) {
        g->base = (const uint8_t *)"";
    } else {
        if ((uint64_t)st.st_size > SIZE_MAX) {
            snprintf(err, n_err, "%s: %" PRIu64 " bytes cannot be mapped", path, g->size);
            close(fd);
            bt_gguf_close(g);
            return BT_ERR_IO;
        }
        void *m = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            snprintf(err, n_err, "%s: cannot map %" PRIu64 " bytes: %s", path, g->size, strerror(errno));
            close(fd);
            bt_gguf_close(g);
            return BT_ERR_IO;
        }
        g->base = m;
        g->mapped = true;
    }
    close(fd);
    return open_common(g, out, err, n_err);
}

/* An integer key of a split model's file (split.no, split.count,
 * split.tensors.count); -1 when absent, -2 when not an integer. */
static int64_t split_key(const struct bt_gguf *g, const char *key) {
    const int64_t i = bt_gguf_find_key(g, key);
    if (i < 0) return -1;
    const struct bt_gguf_value *v = bt_gguf_kv_value(g, i);
    if (v->type == BT_GGUF_TYPE_STRING || v->type == BT_GGUF_TYPE_ARRAY || v->type == BT_GGUF_TYPE_FLOAT32 ||
        v->type == BT_GGUF_TYPE_FLOAT64 || v->type == BT_GGUF_TYPE_BOOL)
        return -2;
    const int64_t x = bt_gguf_value_i64(g, v);
    return x < 0 ? -2 : x;
}

/* The prefix of a shard's name PREFIX-%05d-of-%05d.gguf (no and count as
 * the file says) in prefix, or false when the name is not one. */
static bool shard_prefix(const char *path, int64_t no, int64_t count, char *prefix, size_t n) {
    char tail[64];
    snprintf(tail, sizeof tail, "-%05lld-of-%05lld.gguf", (long long)no, (long long)count);
    const size_t lp = strlen(path), lt = strlen(tail);
    if (lp <= lt || strcmp(path + lp - lt, tail) != 0 || lp - lt >= n) return false;
    memcpy(prefix, path, lp - lt);
    prefix[lp - lt] = 0;
    return true;
}

/* A split model's other files, opened beside the first and their tensors
 * joined to its table. */
static enum bt_status open_shards(struct bt_gguf *g, char *err, size_t n_err) {
    const int64_t count = split_key(g, "split.count"), no = split_key(g, "split.no");
    if (count == -1 || (count == 1 && no <= 0 && no != -2)) return BT_OK; /* one file */
    if (count < 1 || no < 0 || no >= count || count > 9999)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "%s: split.no %lld and split.count %lld do not name a shard of a split model", g->path,
                               (long long)no, (long long)count);
    char prefix[4096];
    if (!shard_prefix(g->path, no + 1, count, prefix, sizeof prefix))
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "%s: shard %lld of a model split in %lld files, but not named PREFIX-%05lld-of-%05lld.gguf: "
                               "the other shards cannot be found",
                               g->path, (long long)no + 1, (long long)count, (long long)no + 1, (long long)count);
    if (no != 0)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "%s is shard %lld of %lld of a split model: open the first, %s-00001-of-%05lld.gguf",
                               g->path, (long long)no + 1, (long long)count, prefix, (long long)count);
    g->shards = calloc((size_t)count - 1, sizeof *g->shards);
    if (!g->shards) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "%s: out of memory", g->path);
    for (int64_t k = 1; k < count; k++) {
        char name[4200];
        snprintf(name, sizeof name, "%s-%05lld-of-%05lld.gguf", prefix, (long long)k + 1, (long long)count);
        struct bt_gguf *sh = NULL;
        enum bt_status st = open_file(name, &sh, err, n_err);
        if (st != BT_OK) return st; /* the shard's own message names it */
        g->shards[g->n_other++] = sh;
        if (split_key(sh, "split.no") != k || split_key(sh, "split.count") != count)
            return bt_error_printf(err, n_err, BT_ERR_INVALID,
                                   "%s: not shard %lld of %lld of %s (its split.no is %lld, split.count %lld)", name,
                                   (long long)k + 1, (long long)count, g->path, (long long)split_key(sh, "split.no"),
                                   (long long)split_key(sh, "split.count"));
        for (int64_t i = 0; i < sh->n_tensors; i++) {
            const struct bt_gguf_tensor *t = &sh->tensors[i];
            const int64_t dup = nameset_find(g, &g->tensor_set, t->name, strlen(t->name));
            if (dup >= 0)
                return bt_error_printf(err, n_err, BT_ERR_INVALID, "%s: tensor \"%s\" is in shard %d too", name,
                                       t->name, g->tensors[dup].shard + 1);
            if (!grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors) ||
                !nameset_add(g, &g->tensor_set, (g->tensors[g->n_tensors] = *t, g->n_tensors)))
                return bt_error_printf(err, n_err, BT_ERR_NOMEM, "%s: out of memory", g->path);
            g->tensors[g->n_tensors].shard = (int)k;
            if (t->layer >= g->n_layers) g->n_layers = t->layer + 1;
            g->n_tensors++;
        }
    }
    const int64_t want = split_key(g, "split.tensors.count");
    if (want >= 0 && want != g->n_tensors)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "%s: split.tensors.count is %lld but the %lld shards hold %lld tensors", g->path,
                               (long long)want, (long long)count, (long long)g->n_tensors);
    if (!sort_layers(g)) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "%s: out of memory", g->path);
    return BT_OK;
}

enum bt_status bt_gguf_open(const char *path, struct bt_gguf **out, char *err, size_t n_err) {
    struct bt_gguf *g = NULL;
    enum bt_status st = open_file(path, &g, err, n_err);
    if (st == BT_OK) st = open_shards(g, err, n_err);
    if (st == BT_OK) *out = g;
    else bt_gguf_close(g);
    return st;
}

void bt_gguf_close(struct bt_gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_other; i++) bt_gguf_close(g->shards[i]);
    free(g->shards);
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    if (g->keys)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->keys[i]);
    BT_FREE_ALL(g->keys, g->key_off, g->kv_val, g->pool, g->key_set.slot, g->tensors, g->tensor_set.slot, g->by_layer,
                g->path, g);
}

const char *bt_gguf_error(const struct bt_gguf *g) { return g->err; }
const char *bt_gguf_path(const struct bt_gguf *g) { return g->path; }
uint32_t bt_gguf_version(const struct bt_gguf *g) { return g->version; }
uint64_t bt_gguf_file_size(const struct bt_gguf *g) {
    uint64_t n = g->size;
    for (int i = 0; i < g->n_other; i++) n += g->shards[i]->size;
    return n;
}
int bt_gguf_n_files(const struct bt_gguf *g) { return g->n_other + 1; }
uint32_t bt_gguf_alignment(const struct bt_gguf *g) { return g->alignment; }
uint64_t bt_gguf_data_offset(const struct bt_gguf *g) { return g->data_offset; }
const uint8_t *bt_gguf_bytes(const struct bt_gguf *g) { return g->base; }
uint64_t bt_gguf_header_checksum(const struct bt_gguf *g) {
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < bt_gguf_n_files(g); k++) {
        const struct bt_gguf *f = k == 0 ? g : g->shards[k - 1];
        const uint64_t n = f->data_offset < f->size ? f->data_offset : f->size;
        for (uint64_t i = 0; i < n; i++) h = (h ^ f->base[i]) * 1099511628211ull;
    }
    return h;
}

/* ---- metadata getters -------------------------------------------------------- */

int64_t bt_gguf_n_kv(const struct bt_gguf *g) { return g->n_kv; }
const char *bt_gguf_kv_key(const struct bt_gguf *g, int64_t i) {
    BT_ASSERT(i >= 0 && i < g->n_kv);
    return g->keys[i];
}
const struct bt_gguf_value *bt_gguf_kv_value(const struct bt_gguf *g, int64_t i) {
    BT_ASSERT(i >= 0 && i < g->n_kv);
    return &g->pool[g->kv_val[i]];
}
int64_t bt_gguf_find_key(const struct bt_gguf *g, const char *key) {
    return nameset_find(g, &g->key_set, key, strlen(key));
}

/* the value of key, type-checked; NULL and g->err otherwise */
static const struct bt_gguf_value *get_typed(struct bt_gguf *g, const char *key, enum bt_gguf_type type) {
    int64_t i = bt_gguf_find_key(g, key);
    char q[128];
    quote(q, sizeof q, key, strlen(key));
    if (i < 0) {
        snprintf(g->err, sizeof g->err, "%s: key %s not found", g->path, q);
        return NULL;
    }
    const struct bt_gguf_value *v = &g->pool[g->kv_val[i]];
    if (v->type != type) {
        if (v->type == BT_GGUF_TYPE_ARRAY)
            snprintf(g->err, sizeof g->err, "%s: offset %" PRIu64 ": key %s is an array of %s, not %s", g->path,
                     g->key_off[i], q, gguf_type_names[v->elem_type], gguf_type_names[type]);
        else
            snprintf(g->err, sizeof g->err, "%s: offset %" PRIu64 ": key %s is %s, not %s", g->path, g->key_off[i], q,
                     gguf_type_names[v->type], gguf_type_names[type]);
        return NULL;
    }
    return v;
}

#define BT_GGUF_GETTER(fn, ctype, gtype)                                           \
    enum bt_status fn(struct bt_gguf *g, const char *key, ctype *out) {            \
        const struct bt_gguf_value *v = get_typed(g, key, gtype);                  \
        if (!v) return BT_ERR_INVALID;                                             \
        memcpy(out, g->base + v->off, sizeof *out);                                \
        return BT_OK;                                                              \
    }
BT_GGUF_GETTER(bt_gguf_get_u8, uint8_t, BT_GGUF_TYPE_UINT8)
BT_GGUF_GETTER(bt_gguf_get_i8, int8_t, BT_GGUF_TYPE_INT8)
BT_GGUF_GETTER(bt_gguf_get_u16, uint16_t, BT_GGUF_TYPE_UINT16)
BT_GGUF_GETTER(bt_gguf_get_i16, int16_t, BT_GGUF_TYPE_INT16)
BT_GGUF_GETTER(bt_gguf_get_u32, uint32_t, BT_GGUF_TYPE_UINT32)
BT_GGUF_GETTER(bt_gguf_get_i32, int32_t, BT_GGUF_TYPE_INT32)
BT_GGUF_GETTER(bt_gguf_get_u64, uint64_t, BT_GGUF_TYPE_UINT64)
BT_GGUF_GETTER(bt_gguf_get_i64, int64_t, BT_GGUF_TYPE_INT64)
BT_GGUF_GETTER(bt_gguf_get_f32, float, BT_GGUF_TYPE_FLOAT32)
BT_GGUF_GETTER(bt_gguf_get_f64, double, BT_GGUF_TYPE_FLOAT64)

enum bt_status bt_gguf_get_bool(struct bt_gguf *g, const char *key, bool *out) {
    const struct bt_gguf_value *v = get_typed(g, key, BT_GGUF_TYPE_BOOL);
    if (!v) return BT_ERR_INVALID;
    *out = g->base[v->off] != 0;
    return BT_OK;
}

enum bt_status bt_gguf_get_str(struct bt_gguf *g, const char *key, struct bt_gguf_str *out) {
    const struct bt_gguf_value *v = get_typed(g, key, BT_GGUF_TYPE_STRING);
    if (!v) return BT_ERR_INVALID;
    *out = (struct bt_gguf_str){v->n, (const char *)g->base + v->off};
    return BT_OK;
}

enum bt_status bt_gguf_get_arr(struct bt_gguf *g, const char *key, enum bt_gguf_type elem,
                               const struct bt_gguf_value **out) {
    const struct bt_gguf_value *v = get_typed(g, key, BT_GGUF_TYPE_ARRAY);
    if (!v) return BT_ERR_INVALID;
    if (elem != BT_GGUF_TYPE_COUNT && v->elem_type != elem) {
        char q[128];
        quote(q, sizeof q, key, strlen(key));
        snprintf(g->err, sizeof g->err, "%s: offset %" PRIu64 ": key %s is an array of %s, not of %s", g->path,
                 g->key_off[bt_gguf_find_key(g, key)], q, gguf_type_names[v->elem_type], bt_gguf_type_name(elem));
        return BT_ERR_INVALID;
    }
    *out = v;
    return BT_OK;
}

struct bt_gguf_value bt_gguf_arr_elem(const struct bt_gguf *g, const struct bt_gguf_value *arr, uint64_t i) {
    BT_ASSERT(arr->type == BT_GGUF_TYPE_ARRAY && i < arr->n);
    if (arr->first >= 0) return g->pool[arr->first + (int64_t)i];
    size_t sz = gguf_type_sizes[arr->elem_type];
    uint64_t off = arr->off + i * sz;
    return (struct bt_gguf_value){.type = arr->elem_type, .elem_type = BT_GGUF_TYPE_COUNT, .off = off,
                                  .raw_off = off, .raw_size = sz, .first = -1};
}

struct bt_gguf_str bt_gguf_arr_str(const struct bt_gguf *g, const struct bt_gguf_value *arr, uint64_t i) {
    BT_ASSERT(arr->type == BT_GGUF_TYPE_ARRAY && arr->elem_type == BT_GGUF_TYPE_STRING && i < arr->n);
    const struct bt_gguf_value *e = &g->pool[arr->first + (int64_t)i];
    return (struct bt_gguf_str){e->n, (const char *)g->base + e->off};
}

void bt_gguf_arr_copy(const struct bt_gguf *g, const struct bt_gguf_value *arr, uint64_t i0, uint64_t n, void *dst) {
    BT_ASSERT(arr->type == BT_GGUF_TYPE_ARRAY && gguf_type_sizes[arr->elem_type] > 0);
    BT_ASSERT(i0 <= arr->n && n <= arr->n - i0);
    size_t sz = gguf_type_sizes[arr->elem_type];
    if (n) memcpy(dst, g->base + arr->off + i0 * sz, n * sz);
}

int64_t bt_gguf_value_i64(const struct bt_gguf *g, const struct bt_gguf_value *v) {
    const uint8_t *b = g->base + v->off;
    switch (v->type) {
    case BT_GGUF_TYPE_UINT8: return *b;
    case BT_GGUF_TYPE_INT8: return (int8_t)*b;
    case BT_GGUF_TYPE_BOOL: return *b;
#define RD(ct)                 \
    {                          \
        ct x;                  \
        memcpy(&x, b, sizeof x); \
        return (int64_t)x;     \
    }
    case BT_GGUF_TYPE_UINT16: RD(uint16_t)
    case BT_GGUF_TYPE_INT16: RD(int16_t)
    case BT_GGUF_TYPE_UINT32: RD(uint32_t)
    case BT_GGUF_TYPE_INT32: RD(int32_t)
    case BT_GGUF_TYPE_UINT64: RD(uint64_t)
    case BT_GGUF_TYPE_INT64: RD(int64_t)
#undef RD
    case BT_GGUF_TYPE_FLOAT32:
    case BT_GGUF_TYPE_FLOAT64: {
        /* truncated toward zero, clamped to int64's range, NaN as 0 (a
         * plain cast of an out-of-range float is undefined) */
        double x = bt_gguf_value_f64(g, v);
        if (x != x) return 0;
        if (x >= 9223372036854775807.0) return INT64_MAX;
        if (x <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)x;
    }
    default: BT_ASSERT(!"not a number"); return 0;
    }
}

uint64_t bt_gguf_value_u64(const struct bt_gguf *g, const struct bt_gguf_value *v) {
    if (v->type == BT_GGUF_TYPE_UINT64) {
        uint64_t x;
        memcpy(&x, g->base + v->off, 8);
        return x;
    }
    return (uint64_t)bt_gguf_value_i64(g, v);
}

double bt_gguf_value_f64(const struct bt_gguf *g, const struct bt_gguf_value *v) {
    if (v->type == BT_GGUF_TYPE_FLOAT32) {
        float x;
        memcpy(&x, g->base + v->off, 4);
        return x;
    }
    if (v->type == BT_GGUF_TYPE_FLOAT64) {
        double x;
        memcpy(&x, g->base + v->off, 8);
        return x;
    }
    if (v->type == BT_GGUF_TYPE_UINT64) return (double)bt_gguf_value_u64(g, v);
    return (double)bt_gguf_value_i64(g, v);
}

struct bt_gguf_str bt_gguf_value_str(const struct bt_gguf *g, const struct bt_gguf_value *v) {
    BT_ASSERT(v->type == BT_GGUF_TYPE_STRING);
    return (struct bt_gguf_str){v->n, (const char *)g->base + v->off};
}

/* ---- tensors ------------------------------------------------------------------ */

int64_t bt_gguf_n_tensors(const struct bt_gguf *g) { return g->n_tensors; }
const struct bt_gguf_tensor *bt_gguf_tensor(const struct bt_gguf *g, int64_t i) {
    BT_ASSERT(i >= 0 && i < g->n_tensors);
    return &g->tensors[i];
}
int64_t bt_gguf_find_tensor(const struct bt_gguf *g, const char *name) {
    return nameset_find(g, &g->tensor_set, name, strlen(name));
}
/* The file a tensor's bytes are in. */
static const struct bt_gguf *file_of(const struct bt_gguf *g, const struct bt_gguf_tensor *t) {
    return t->shard == 0 ? g : g->shards[t->shard - 1];
}

const void *bt_gguf_tensor_data(const struct bt_gguf *g, const struct bt_gguf_tensor *t) {
    BT_ASSERT(t >= g->tensors && t < g->tensors + g->n_tensors);
    BT_ASSERT(!g->header_only);
    return file_of(g, t)->base + t->file_offset;
}

void bt_gguf_tensor_release(struct bt_gguf *g, const struct bt_gguf_tensor *t) {
    BT_ASSERT(t >= g->tensors && t < g->tensors + g->n_tensors);
    const struct bt_gguf *f = file_of(g, t);
    if (!f->mapped) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t b = ((uintptr_t)(f->base + t->file_offset) + page - 1) / page * page;
    const uintptr_t e = (uintptr_t)(f->base + t->file_offset + t->size) / page * page;
    if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED); /* advice: nothing to undo if refused */
}

enum bt_status bt_gguf_tensor_bt_type(struct bt_gguf *g, const struct bt_gguf_tensor *t, enum bt_type *out) {
    if (t->type == BT_TYPE_COUNT) {
        char list[256] = "";
        size_t o = 0;
        for (int i = 0; i < BT_TYPE_COUNT && o < sizeof list; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? " " : "", bt_type_name((enum bt_type)i));
        snprintf(g->err, sizeof g->err, "%s: offset %" PRIu64 ": tensor \"%s\": type %s is not supported by baton (%s are)",
                 g->path, t->info_offset, t->name, bt_ggml_type_info(t->ggml_type)->name, list);
        return BT_ERR_UNSUPPORTED;
    }
    *out = t->type;
    return BT_OK;
}

int bt_gguf_n_layers(const struct bt_gguf *g) { return g->n_layers; }

int64_t bt_gguf_layer_tensors(const struct bt_gguf *g, int layer, const int64_t **idx) {
    /* by_layer is sorted by layer: binary search the first entry >= layer */
    int64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (g->tensors[g->by_layer[mid]].layer < layer) lo = mid + 1;
        else hi = mid;
    }
    int64_t end = lo;
    while (end < g->n_tensors && g->tensors[g->by_layer[end]].layer == layer) end++;
    *idx = g->by_layer + lo;
    return end - lo;
}

uint64_t bt_gguf_layer_bytes(const struct bt_gguf *g, int layer) {
    const int64_t *idx;
    int64_t n = bt_gguf_layer_tensors(g, layer, &idx);
    uint64_t b = 0;
    for (int64_t i = 0; i < n; i++) b += g->tensors[idx[i]].size;
    return b;
}

/* ---- the writer ------------------------------------------------------------------ */

struct wtensor {
    char name[BT_GGUF_MAX_NAME];
    uint32_t type;
    int n_dims;
    int64_t ne[BT_GGUF_MAX_DIMS];
    uint64_t size, offset;
    const void *data;
};

struct bt_gguf_writer {
    char *path, *tmp; /* tmp NULL: in memory (mem, mem_len) */
    FILE *f;
    char *mem;
    size_t mem_len;
    uint8_t *kv; /* serialised key-values */
    size_t kv_len, kv_cap;
    char **keys;
    int64_t n_kv, cap_keys;
    struct wtensor *t;
    int64_t n_t, cap_t;
    uint32_t alignment;
    bool header_written, failed;
    int64_t next; /* the next tensor whose data is written */
    uint64_t pos; /* bytes written so far */
    char err[BT_GGUF_ERR_LEN];
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static enum bt_status wfail(struct bt_gguf_writer *w, enum bt_status st, const char *fmt, ...) {
    int o = snprintf(w->err, sizeof w->err, "%s: ", w->path);
    if (o < 0 || (size_t)o >= sizeof w->err) o = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err + o, sizeof w->err - (size_t)o, fmt, ap);
    va_end(ap);
    if (st == BT_ERR_IO) w->failed = true;
    return st;
}

const char *bt_gguf_writer_error(const struct bt_gguf_writer *w) { return w->err; }

enum bt_status bt_gguf_writer_open(const char *path, struct bt_gguf_writer **out, char *err, size_t n_err) {
    *out = NULL;
    struct bt_gguf_writer *w = calloc(1, sizeof *w);
    size_t pl = strlen(path);
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(pl + 16))) {
        if (w) free(w->path);
        free(w);
        snprintf(err, n_err, "%s: out of memory", path);
        return BT_ERR_NOMEM;
    }
    snprintf(w->tmp, pl + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(w->tmp);
    if (fd < 0) {
        snprintf(err, n_err, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        free(w->tmp);
        free(w->path);
        free(w);
        return BT_ERR_IO;
    }
    mode_t um = umask(0);
    umask(um);
    if (fchmod(fd, 0666 & ~um) != 0 || !(w->f = fdopen(fd, "wb"))) {
        snprintf(err, n_err, "%s: cannot open a temporary file: %s", path, strerror(errno));
        close(fd);
        unlink(w->tmp);
        free(w->tmp);
        free(w->path);
        free(w);
        return BT_ERR_IO;
    }
    w->alignment = BT_GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return BT_OK;
}

enum bt_status bt_gguf_writer_open_memory(const char *name, struct bt_gguf_writer **out, char *err, size_t n_err) {
    *out = NULL;
    struct bt_gguf_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(name)) || !(w->f = open_memstream(&w->mem, &w->mem_len))) {
        if (w) free(w->path);
        free(w);
        snprintf(err, n_err, "%s: out of memory", name);
        return BT_ERR_NOMEM;
    }
    w->alignment = BT_GGUF_DEFAULT_ALIGNMENT;
    *out = w;
    return BT_OK;
}

static bool kv_put(struct bt_gguf_writer *w, const void *b, size_t n) {
    if (w->kv_cap - w->kv_len < n) {
        size_t cap = w->kv_cap ? w->kv_cap : 1024;
        while (cap - w->kv_len < n) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        uint8_t *k = realloc(w->kv, cap);
        if (!k) return false;
        w->kv = k;
        w->kv_cap = cap;
    }
    if (n) memcpy(w->kv + w->kv_len, b, n);
    w->kv_len += n;
    return true;
}
static bool kv_u32(struct bt_gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static bool kv_u64(struct bt_gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }
static bool kv_str(struct bt_gguf_writer *w, const char *s, uint64_t n) {
    return n <= SIZE_MAX && kv_u64(w, n) && kv_put(w, s, (size_t)n);
}

/* the key's header (name and type) after the checks every set shares */
static enum bt_status kv_begin(struct bt_gguf_writer *w, const char *key, enum bt_gguf_type type) {
    BT_ASSERT(!w->header_written);
    size_t n = strlen(key);
    if (n == 0) return wfail(w, BT_ERR_INVALID, "empty key");
    if (n > BT_GGUF_MAX_KEY) return wfail(w, BT_ERR_INVALID, "key of %zu bytes (at most %d)", n, BT_GGUF_MAX_KEY);
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return wfail(w, BT_ERR_INVALID, "key \"%s\" set twice", key);
    if (!strcmp(key, "general.alignment") && type != BT_GGUF_TYPE_UINT32)
        return wfail(w, BT_ERR_INVALID, "key \"general.alignment\" must be uint32, not %s", gguf_type_names[type]);
    if (w->n_kv == w->cap_keys) {
        int64_t cap = w->cap_keys ? w->cap_keys * 2 : 32;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return wfail(w, BT_ERR_NOMEM, "out of memory");
        w->keys = k;
        w->cap_keys = cap;
    }
    if (!(w->keys[w->n_kv] = strdup(key))) return wfail(w, BT_ERR_NOMEM, "out of memory");
    w->n_kv++;
    if (!kv_str(w, key, n) || !kv_u32(w, (uint32_t)type)) return wfail(w, BT_ERR_NOMEM, "out of memory");
    return BT_OK;
}

static enum bt_status set_scalar(struct bt_gguf_writer *w, const char *key, enum bt_gguf_type type, const void *v) {
    size_t mark = w->kv_len;
    enum bt_status st = kv_begin(w, key, type);
    if (st != BT_OK) return st;
    if (!kv_put(w, v, gguf_type_sizes[type])) {
        w->kv_len = mark;
        return wfail(w, BT_ERR_NOMEM, "out of memory");
    }
    return BT_OK;
}

#define BT_GGUF_SETTER(fn, ctype, gtype)                                              \
    enum bt_status fn(struct bt_gguf_writer *w, const char *key, ctype v) {           \
        return set_scalar(w, key, gtype, &v);                                         \
    }
BT_GGUF_SETTER(bt_gguf_writer_set_u8, uint8_t, BT_GGUF_TYPE_UINT8)
BT_GGUF_SETTER(bt_gguf_writer_set_i8, int8_t, BT_GGUF_TYPE_INT8)
BT_GGUF_SETTER(bt_gguf_writer_set_u16, uint16_t, BT_GGUF_TYPE_UINT16)
BT_GGUF_SETTER(bt_gguf_writer_set_i16, int16_t, BT_GGUF_TYPE_INT16)
BT_GGUF_SETTER(bt_gguf_writer_set_i32, int32_t, BT_GGUF_TYPE_INT32)
BT_GGUF_SETTER(bt_gguf_writer_set_u64, uint64_t, BT_GGUF_TYPE_UINT64)
BT_GGUF_SETTER(bt_gguf_writer_set_i64, int64_t, BT_GGUF_TYPE_INT64)
BT_GGUF_SETTER(bt_gguf_writer_set_f32, float, BT_GGUF_TYPE_FLOAT32)
BT_GGUF_SETTER(bt_gguf_writer_set_f64, double, BT_GGUF_TYPE_FLOAT64)

enum bt_status bt_gguf_writer_set_u32(struct bt_gguf_writer *w, const char *key, uint32_t v) {
    if (!strcmp(key, "general.alignment") && (v == 0 || (v & (v - 1)) != 0))
        return wfail(w, BT_ERR_INVALID, "general.alignment %" PRIu32 " is not a power of two", v);
    enum bt_status st = set_scalar(w, key, BT_GGUF_TYPE_UINT32, &v);
    if (st == BT_OK && !strcmp(key, "general.alignment")) w->alignment = v;
    return st;
}

enum bt_status bt_gguf_writer_set_bool(struct bt_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, BT_GGUF_TYPE_BOOL, &b);
}

enum bt_status bt_gguf_writer_set_strn(struct bt_gguf_writer *w, const char *key, const char *v, uint64_t n) {
    enum bt_status st = kv_begin(w, key, BT_GGUF_TYPE_STRING);
    if (st != BT_OK) return st;
    if (!kv_str(w, v, n)) return wfail(w, BT_ERR_NOMEM, "out of memory");
    return BT_OK;
}
enum bt_status bt_gguf_writer_set_str(struct bt_gguf_writer *w, const char *key, const char *v) {
    return bt_gguf_writer_set_strn(w, key, v, strlen(v));
}

enum bt_status bt_gguf_writer_set_arr(struct bt_gguf_writer *w, const char *key, enum bt_gguf_type elem,
                                      const void *data, uint64_t n) {
    if ((unsigned)elem >= BT_GGUF_TYPE_COUNT || gguf_type_sizes[elem] == 0)
        return wfail(w, BT_ERR_INVALID, "key \"%s\": set_arr takes scalars, not %s", key, bt_gguf_type_name(elem));
    if (n > SIZE_MAX / gguf_type_sizes[elem]) return wfail(w, BT_ERR_INVALID, "key \"%s\": array too long", key);
    enum bt_status st = kv_begin(w, key, BT_GGUF_TYPE_ARRAY);
    if (st != BT_OK) return st;
    if (!kv_u32(w, (uint32_t)elem) || !kv_u64(w, n) || !kv_put(w, data, (size_t)n * gguf_type_sizes[elem]))
        return wfail(w, BT_ERR_NOMEM, "out of memory");
    return BT_OK;
}

enum bt_status bt_gguf_writer_set_arr_str(struct bt_gguf_writer *w, const char *key, const char *const *v,
                                          uint64_t n) {
    enum bt_status st = kv_begin(w, key, BT_GGUF_TYPE_ARRAY);
    if (st != BT_OK) return st;
    if (!kv_u32(w, BT_GGUF_TYPE_STRING) || !kv_u64(w, n)) return wfail(w, BT_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++)
        if (!kv_str(w, v[i], strlen(v[i]))) return wfail(w, BT_ERR_NOMEM, "out of memory");
    return BT_OK;
}

enum bt_status bt_gguf_writer_set_value(struct bt_gguf_writer *w, const char *key, const struct bt_gguf *g,
                                        const struct bt_gguf_value *v) {
    if (!strcmp(key, "general.alignment") && v->type == BT_GGUF_TYPE_UINT32) {
        uint32_t a;
        memcpy(&a, g->base + v->off, 4);
        return bt_gguf_writer_set_u32(w, key, a);
    }
    enum bt_status st = kv_begin(w, key, v->type);
    if (st != BT_OK) return st;
    if (!kv_put(w, g->base + v->raw_off, (size_t)v->raw_size)) return wfail(w, BT_ERR_NOMEM, "out of memory");
    return BT_OK;
}

enum bt_status bt_gguf_writer_add_tensor(struct bt_gguf_writer *w, const char *name, uint32_t ggml_type,
                                         int n_dims, const int64_t *ne, const void *data) {
    BT_ASSERT(!w->header_written);
    size_t n = strlen(name);
    if (n == 0 || n >= BT_GGUF_MAX_NAME)
        return wfail(w, BT_ERR_INVALID, "tensor name \"%s\" must be 1 to %d bytes", name, BT_GGUF_MAX_NAME - 1);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) return wfail(w, BT_ERR_INVALID, "tensor \"%s\" added twice", name);
    const struct bt_ggml_type_info *info = bt_ggml_type_info(ggml_type);
    if (!info) return wfail(w, BT_ERR_INVALID, "tensor \"%s\": unknown type %" PRIu32, name, ggml_type);
    if (n_dims < 1 || n_dims > BT_GGUF_MAX_DIMS)
        return wfail(w, BT_ERR_INVALID, "tensor \"%s\": %d dimensions (1 to %d)", name, n_dims, BT_GGUF_MAX_DIMS);
    struct wtensor t = {.type = ggml_type, .n_dims = n_dims, .data = data};
    memcpy(t.name, name, n + 1);
    int64_t ne_all = 1;
    for (int d = 0; d < BT_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] <= 0) return wfail(w, BT_ERR_INVALID, "tensor \"%s\": dimension %d is %" PRId64, name, d, t.ne[d]);
        if (__builtin_mul_overflow(ne_all, t.ne[d], &ne_all))
            return wfail(w, BT_ERR_INVALID, "tensor \"%s\": too many elements", name);
    }
    if (t.ne[0] % info->blck_size)
        return wfail(w, BT_ERR_INVALID, "tensor \"%s\": dimension 0 (%" PRId64 ") is not a multiple of %s's block size %" PRId64,
                     name, t.ne[0], info->name, info->blck_size);
    if (__builtin_mul_overflow((uint64_t)(ne_all / info->blck_size), (uint64_t)info->type_size, &t.size))
        return wfail(w, BT_ERR_INVALID, "tensor \"%s\": too many bytes", name);
    uint64_t off = 0;
    if (w->n_t) {
        const struct wtensor *p = &w->t[w->n_t - 1];
        off = p->offset + p->size;
        off += (w->alignment - off % w->alignment) % w->alignment; /* re-done at the header with the final alignment */
    }
    t.offset = off;
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        struct wtensor *x = realloc(w->t, (size_t)cap * sizeof *x);
        if (!x) return wfail(w, BT_ERR_NOMEM, "out of memory");
        w->t = x;
        w->cap_t = cap;
    }
    w->t[w->n_t++] = t;
    return BT_OK;
}

static enum bt_status wput(struct bt_gguf_writer *w, const void *b, size_t n) {
    if (w->failed) return BT_ERR_IO;
    if (n && fwrite(b, 1, n, w->f) != n) return wfail(w, BT_ERR_IO, "write failed: %s", strerror(errno));
    w->pos += n;
    return BT_OK;
}
static enum bt_status wpad(struct bt_gguf_writer *w) {
    static const uint8_t zeros[256];
    uint64_t pad = (w->alignment - w->pos % w->alignment) % w->alignment;
    while (pad) {
        size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
        enum bt_status st = wput(w, zeros, k);
        if (st != BT_OK) return st;
        pad -= k;
    }
    return BT_OK;
}

static enum bt_status write_header(struct bt_gguf_writer *w) {
    w->header_written = true;
    uint32_t v = 3;
    uint64_t nt = (uint64_t)w->n_t, nkv = (uint64_t)w->n_kv;
    enum bt_status st;
    if ((st = wput(w, "GGUF", 4)) || (st = wput(w, &v, 4)) || (st = wput(w, &nt, 8)) || (st = wput(w, &nkv, 8)) ||
        (st = wput(w, w->kv, w->kv_len)))
        return st;
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        struct wtensor *t = &w->t[i];
        off += (w->alignment - off % w->alignment) % w->alignment;
        t->offset = off;
        off += t->size;
        uint64_t n = strlen(t->name);
        uint32_t nd = (uint32_t)t->n_dims;
        if ((st = wput(w, &n, 8)) || (st = wput(w, t->name, n)) || (st = wput(w, &nd, 4)) ||
            (st = wput(w, t->ne, (size_t)nd * 8)) || (st = wput(w, &t->type, 4)) || (st = wput(w, &t->offset, 8)))
            return st;
    }
    return wpad(w);
}

enum bt_status bt_gguf_writer_write_data(struct bt_gguf_writer *w, const void *data, uint64_t size) {
    enum bt_status st;
    if (!w->header_written && (st = write_header(w)) != BT_OK) return st;
    if (w->next >= w->n_t) return wfail(w, BT_ERR_INVALID, "data for more tensors than were added (%" PRId64 ")", w->n_t);
    const struct wtensor *t = &w->t[w->next];
    if (size != t->size)
        return wfail(w, BT_ERR_INVALID, "tensor \"%s\": %" PRIu64 " bytes of data given, it holds %" PRIu64, t->name,
                     size, t->size);
    if ((st = wput(w, data, (size_t)size)) || (st = wpad(w))) return st;
    w->next++;
    return BT_OK;
}

static void writer_free(struct bt_gguf_writer *w) {
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    BT_FREE_ALL(w->keys, w->kv, w->t, w->tmp, w->path, w);
}

/* The header if not written yet and the data not written yet. */
static enum bt_status write_rest(struct bt_gguf_writer *w) {
    enum bt_status st = BT_OK;
    if (!w->header_written) st = write_header(w);
    while (st == BT_OK && w->next < w->n_t) {
        const struct wtensor *t = &w->t[w->next];
        if (!t->data)
            return wfail(w, BT_ERR_INVALID, "tensor \"%s\" has no data (neither given to add_tensor nor written)",
                         t->name);
        st = bt_gguf_writer_write_data(w, t->data, t->size);
    }
    return st;
}

/* A memory writer's end: the stream closed, its buffer handed over (*data,
 * *size) when st is BT_OK, else the message in err; frees w. */
static enum bt_status hand_over(struct bt_gguf_writer *w, enum bt_status st, void **data, size_t *size, char *err,
                                size_t n_err) {
    if (fclose(w->f) != 0 && st == BT_OK) st = wfail(w, BT_ERR_NOMEM, "out of memory");
    w->f = NULL;
    if (st == BT_OK) {
        *data = w->mem; /* the stream's own buffer: no second copy of a large file */
        *size = w->mem_len;
        w->mem = NULL;
    } else {
        snprintf(err, n_err, "%s", w->err);
    }
    free(w->mem);
    writer_free(w);
    return st;
}

enum bt_status bt_gguf_writer_finish_memory(struct bt_gguf_writer *w, void **data, size_t *size, char *err,
                                            size_t n_err) {
    BT_ASSERT(!w->tmp);
    *data = NULL;
    *size = 0;
    return hand_over(w, write_rest(w), data, size, err, n_err);
}

enum bt_status bt_gguf_writer_finish_header(struct bt_gguf_writer *w, void **data, size_t *header_size,
                                            uint64_t *file_size, char *err, size_t n_err) {
    BT_ASSERT(!w->tmp && !w->header_written);
    *data = NULL;
    *header_size = 0;
    const enum bt_status st = write_header(w);
    *file_size = w->n_t ? w->pos + w->t[w->n_t - 1].offset + w->t[w->n_t - 1].size : w->pos;
    return hand_over(w, st, data, header_size, err, n_err);
}

enum bt_status bt_gguf_writer_finish(struct bt_gguf_writer *w, char *err, size_t n_err) {
    BT_ASSERT(w->tmp);
    enum bt_status st = write_rest(w);
    if (st == BT_OK && (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0))
        st = wfail(w, BT_ERR_IO, "write failed: %s", strerror(errno));
    if (fclose(w->f) != 0 && st == BT_OK) st = wfail(w, BT_ERR_IO, "write failed: %s", strerror(errno));
    w->f = NULL;
    if (st == BT_OK && rename(w->tmp, w->path) != 0)
        st = wfail(w, BT_ERR_IO, "cannot rename %s into place: %s", w->tmp, strerror(errno));
    if (st != BT_OK) {
        unlink(w->tmp);
        snprintf(err, n_err, "%s", w->err);
    }
    writer_free(w);
    return st;
}

void bt_gguf_writer_close(struct bt_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp) unlink(w->tmp);
    free(w->mem);
    writer_free(w);
}
