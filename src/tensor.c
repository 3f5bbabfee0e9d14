/* tensor.c - element types (their traits; F16 and BF16 conversions here, the
 * block types' in quants.c), the context arena, and tensor creation and inspection. */
#include "baton/tensor.h"

#include "quants.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

const char *bt_status_str(enum bt_status s) {
    switch (s) {
    case BT_OK: return "ok";
    case BT_ERR_INVALID: return "invalid argument";
    case BT_ERR_NOMEM: return "out of memory";
    case BT_ERR_CAPACITY: return "capacity exceeded";
    case BT_ERR_UNSUPPORTED: return "unsupported";
    case BT_ERR_IO: return "i/o error";
    case BT_ERR_ABORTED: return "aborted";
    case BT_ERR_COMM: return "communication error";
    case BT_ERR_MISMATCH: return "mismatch";
    }
    return "unknown status";
}

/* ---- scalar conversions ------------------------------------------------ */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float bt_fp16_to_fp32(bt_fp16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        const float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf / nan */
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

bt_fp16_t bt_fp32_to_fp16(float f) {
    const uint32_t x = f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (bt_fp16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) return (bt_fp16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* result is subnormal (or zero): round |f| / 2^-24 to nearest even */
        const float v = bits_f32(ax) * 0x1p24f;
        return (bt_fp16_t)(sign | (uint32_t)nearbyintf(v));
    }
    /* normal: rebias exponent, round 13 dropped bits to nearest even */
    const uint32_t mant_odd = (ax >> 13) & 1;
    const uint32_t r = ax + 0xfffu + mant_odd;
    return (bt_fp16_t)(sign | ((r - 0x38000000u) >> 13));
}

float bt_bf16_to_fp32(bt_bf16_t h) { return bits_f32((uint32_t)h << 16); }

bt_bf16_t bt_fp32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (bt_bf16_t)((x >> 16) | 0x40); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1);
    return (bt_bf16_t)(x >> 16);
}

/* ---- row conversions ---------------------------------------------------- */

static void f32_to_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void f32_from_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

/* ELEM's rows to f32 (each element TO_F32(x)) and back (FROM_F32(x)). */
#define ROW_CONVERSIONS(name, ELEM, TO_F32, FROM_F32)                     \
    static void name##_to_f32(const void *src, float *dst, int64_t n) {   \
        const ELEM *s = src;                                              \
        for (int64_t i = 0; i < n; i++) dst[i] = TO_F32(s[i]);            \
    }                                                                     \
    static void name##_from_f32(const float *src, void *dst, int64_t n) { \
        ELEM *d = dst;                                                    \
        for (int64_t i = 0; i < n; i++) d[i] = FROM_F32(src[i]);          \
    }
#define I32_TO_F32(x) ((float)(x))
#define F32_TO_I32(x) ((int32_t)(x))
ROW_CONVERSIONS(f16, bt_fp16_t, bt_fp16_to_fp32, bt_fp32_to_fp16)
ROW_CONVERSIONS(bf16, bt_bf16_t, bt_bf16_to_fp32, bt_fp32_to_bf16)
ROW_CONVERSIONS(i32, int32_t, I32_TO_F32, F32_TO_I32)
#undef ROW_CONVERSIONS

static const struct bt_type_traits type_traits[BT_TYPE_COUNT] = {
    [BT_TYPE_F32] = {"f32", 1, sizeof(float), false, f32_to_f32, f32_from_f32},
    [BT_TYPE_F16] = {"f16", 1, sizeof(bt_fp16_t), false, f16_to_f32, f16_from_f32},
    [BT_TYPE_BF16] = {"bf16", 1, sizeof(bt_bf16_t), false, bf16_to_f32, bf16_from_f32},
    [BT_TYPE_I32] = {"i32", 1, sizeof(int32_t), false, i32_to_f32, i32_from_f32},
#define QTYPE(T, name, blck, blk) [T] = {#name, blck, sizeof(blk), true, bt_##name##_to_f32, bt_##name##_from_f32}
    QTYPE(BT_TYPE_Q8_0, q8_0, BT_QK, bt_block_q8_0),
    QTYPE(BT_TYPE_Q4_0, q4_0, BT_QK, bt_block_q4_0),
    QTYPE(BT_TYPE_Q4_1, q4_1, BT_QK, bt_block_q4_1),
    QTYPE(BT_TYPE_Q5_0, q5_0, BT_QK, bt_block_q5_0),
    QTYPE(BT_TYPE_Q5_1, q5_1, BT_QK, bt_block_q5_1),
    QTYPE(BT_TYPE_Q2_K, q2_K, BT_QK_K, bt_block_q2_K),
    QTYPE(BT_TYPE_Q3_K, q3_K, BT_QK_K, bt_block_q3_K),
    QTYPE(BT_TYPE_Q4_K, q4_K, BT_QK_K, bt_block_q4_K),
    QTYPE(BT_TYPE_Q5_K, q5_K, BT_QK_K, bt_block_q5_K),
    QTYPE(BT_TYPE_Q6_K, q6_K, BT_QK_K, bt_block_q6_K),
    QTYPE(BT_TYPE_Q8_K, q8_K, BT_QK_K, bt_block_q8_K),
    QTYPE(BT_TYPE_MXFP4, mxfp4, BT_QK, bt_block_mxfp4),
    QTYPE(BT_TYPE_IQ4_NL, iq4_nl, BT_QK, bt_block_iq4_nl),
    QTYPE(BT_TYPE_IQ4_XS, iq4_xs, BT_QK_K, bt_block_iq4_xs),
#define DQTYPE(T, name, blk) [T] = {#name, BT_QK_K, sizeof(blk), true, bt_##name##_to_f32, NULL}
    DQTYPE(BT_TYPE_IQ2_XXS, iq2_xxs, bt_block_iq2_xxs),
    DQTYPE(BT_TYPE_IQ2_XS, iq2_xs, bt_block_iq2_xs),
    DQTYPE(BT_TYPE_IQ2_S, iq2_s, bt_block_iq2_s),
    DQTYPE(BT_TYPE_IQ3_XXS, iq3_xxs, bt_block_iq3_xxs),
    DQTYPE(BT_TYPE_IQ3_S, iq3_s, bt_block_iq3_s),
    DQTYPE(BT_TYPE_IQ1_S, iq1_s, bt_block_iq1_s),
#undef DQTYPE
#undef QTYPE
};

_Static_assert(sizeof(bt_block_q8_0) == 34, "Q8_0 block must match GGUF (34 bytes)");
_Static_assert(sizeof(bt_block_q4_0) == 18, "Q4_0 block must match GGUF (18 bytes)");
_Static_assert(sizeof(bt_block_q4_1) == 20, "Q4_1 block must match GGUF (20 bytes)");
_Static_assert(sizeof(bt_block_q5_0) == 22, "Q5_0 block must match GGUF (22 bytes)");
_Static_assert(sizeof(bt_block_q5_1) == 24, "Q5_1 block must match GGUF (24 bytes)");
_Static_assert(sizeof(bt_block_q2_K) == 84, "Q2_K block must match GGUF (84 bytes)");
_Static_assert(sizeof(bt_block_q3_K) == 110, "Q3_K block must match GGUF (110 bytes)");
_Static_assert(sizeof(bt_block_q4_K) == 144, "Q4_K block must match GGUF (144 bytes)");
_Static_assert(sizeof(bt_block_q5_K) == 176, "Q5_K block must match GGUF (176 bytes)");
_Static_assert(sizeof(bt_block_q6_K) == 210, "Q6_K block must match GGUF (210 bytes)");
_Static_assert(sizeof(bt_block_q8_K) == 292, "Q8_K block must match ggml (292 bytes)");
_Static_assert(sizeof(bt_block_mxfp4) == 17, "MXFP4 block must match GGUF (17 bytes)");
_Static_assert(sizeof(bt_block_iq4_nl) == 18, "IQ4_NL block must match GGUF (18 bytes)");
_Static_assert(sizeof(bt_block_iq4_xs) == 136, "IQ4_XS block must match GGUF (136 bytes)");
_Static_assert(sizeof(bt_block_iq2_xxs) == 66, "IQ2_XXS block must match GGUF (66 bytes)");
_Static_assert(sizeof(bt_block_iq2_xs) == 74, "IQ2_XS block must match GGUF (74 bytes)");
_Static_assert(sizeof(bt_block_iq2_s) == 82, "IQ2_S block must match GGUF (82 bytes)");
_Static_assert(sizeof(bt_block_iq3_xxs) == 98, "IQ3_XXS block must match GGUF (98 bytes)");
_Static_assert(sizeof(bt_block_iq3_s) == 110, "IQ3_S block must match GGUF (110 bytes)");
_Static_assert(sizeof(bt_block_iq1_s) == 50, "IQ1_S block must match GGUF (50 bytes)");

const struct bt_type_traits *bt_type_traits(enum bt_type t) {
    BT_ASSERT(t >= 0 && t < BT_TYPE_COUNT);
    return &type_traits[t];
}
const char *bt_type_name(enum bt_type t) {
    return (t >= 0 && t < BT_TYPE_COUNT) ? type_traits[t].name : "?";
}
size_t bt_type_size(enum bt_type t) { return bt_type_traits(t)->type_size; }
bool bt_type_can_quantize(enum bt_type t) { return bt_type_traits(t)->from_float != NULL; }
int64_t bt_blck_size(enum bt_type t) { return bt_type_traits(t)->blck_size; }
size_t bt_row_size(enum bt_type t, int64_t ne0) {
    const struct bt_type_traits *tt = bt_type_traits(t);
    return (size_t)(ne0 / tt->blck_size) * tt->type_size;
}

void bt_row_to_f32(enum bt_type t, const void *src, float *dst, int64_t n) {
    bt_type_traits(t)->to_float(src, dst, n);
}
void bt_row_from_f32(enum bt_type t, const float *src, void *dst, int64_t n) {
    BT_ASSERT(bt_type_traits(t)->from_float != NULL); /* callers check bt_type_can_quantize */
    bt_type_traits(t)->from_float(src, dst, n);
}

/* ---- ops: names ---------------------------------------------------------- */

static const char *const op_names[BT_OP_COUNT] = {
    [BT_OP_NONE] = "NONE",         [BT_OP_ADD] = "ADD",
    [BT_OP_SUB] = "SUB",           [BT_OP_MUL] = "MUL",
    [BT_OP_DIV] = "DIV",           [BT_OP_SCALE] = "SCALE",
    [BT_OP_SQR] = "SQR",           [BT_OP_SQRT] = "SQRT",
    [BT_OP_SUM_ROWS] = "SUM_ROWS", [BT_OP_MEAN] = "MEAN",
    [BT_OP_MUL_MAT] = "MUL_MAT",   [BT_OP_MUL_MAT_ID] = "MUL_MAT_ID",
    [BT_OP_GET_ROWS] = "GET_ROWS", [BT_OP_SET_ROWS] = "SET_ROWS",
    [BT_OP_CPY] = "CPY",           [BT_OP_CONT] = "CONT",
    [BT_OP_VIEW] = "VIEW",         [BT_OP_RESHAPE] = "RESHAPE",
    [BT_OP_PERMUTE] = "PERMUTE",   [BT_OP_TRANSPOSE] = "TRANSPOSE",
    [BT_OP_RMS_NORM] = "RMS_NORM", [BT_OP_NORM] = "NORM",
    [BT_OP_SOFT_MAX] = "SOFT_MAX", [BT_OP_ROPE] = "ROPE",
    [BT_OP_SILU] = "SILU",         [BT_OP_GELU] = "GELU",
    [BT_OP_RELU] = "RELU",         [BT_OP_SIGMOID] = "SIGMOID",
    [BT_OP_SWIGLU] = "SWIGLU",     [BT_OP_ARGSORT] = "ARGSORT",
    [BT_OP_CONCAT] = "CONCAT",     [BT_OP_FLASH_ATTN] = "FLASH_ATTN",
    [BT_OP_SWIGLU_OAI] = "SWIGLU_OAI", [BT_OP_MOE_SUM] = "MOE_SUM",
};

const char *bt_op_name(enum bt_op op) {
    return (op >= 0 && op < BT_OP_COUNT && op_names[op]) ? op_names[op] : "?";
}

bool bt_op_is_view(enum bt_op op) {
    return op == BT_OP_VIEW || op == BT_OP_RESHAPE || op == BT_OP_PERMUTE || op == BT_OP_TRANSPOSE;
}

enum bt_status bt_error_printf(char *err, size_t n, enum bt_status st, const char *fmt, ...) {
    if (err && n > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* ---- contexts ------------------------------------------------------------ */

struct bt_context {
    uint8_t *mem;
    size_t mem_size;
    size_t used;
    bool owns_mem;
    bool no_alloc;
    char err[256];
    struct bt_tensor **tensors; /* every tensor made in this context, in order */
    int n_tensors, cap_tensors;
};

double bt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* From 4 MiB up on huge pages: a decode step streams every weight once, and
 * with 4 KiB pages the TLB misses and the prefetchers stopping at each page
 * cost a fifth of its speed here (Q4_0 tg 90 -> 110 tokens/s).  Where the
 * kernel's THP defrag is "madvise", a fault in such memory may compact
 * memory first: the first copy of a model's weights can then take seconds
 * of system time (`--mmap` avoids the copy). */
void *bt_host_alloc(size_t size) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (size >= 2 * huge) {
        if (posix_memalign(&p, huge, size) != 0) return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(p, size, MADV_HUGEPAGE); /* advice: a kernel without THP keeps 4 KiB pages */
#endif
        return p;
    }
    return posix_memalign(&p, BT_MEM_ALIGN, size ? size : BT_MEM_ALIGN) == 0 ? p : NULL;
}

bt_context *bt_init(struct bt_init_params params) {
    bt_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    ctx->mem_size = params.mem_size;
    ctx->no_alloc = params.no_alloc;
    if (params.mem_buffer) {
        ctx->mem = params.mem_buffer;
    } else if (params.mem_size > 0) {
        if (!(ctx->mem = bt_host_alloc(params.mem_size))) {
            free(ctx);
            return NULL;
        }
        ctx->owns_mem = true;
    }
    return ctx;
}

void bt_free(bt_context *ctx) {
    if (!ctx) return;
    if (ctx->owns_mem) free(ctx->mem);
    free(ctx->tensors);
    free(ctx);
}

size_t bt_used_mem(const bt_context *ctx) { return ctx->used; }
bool bt_get_no_alloc(const bt_context *ctx) { return ctx->no_alloc; }
size_t bt_tensor_overhead(void) {
    return (sizeof(struct bt_tensor) + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN;
}

const char *bt_context_error(const bt_context *ctx) { return ctx->err; }
void bt_context_clear_error(bt_context *ctx) { ctx->err[0] = '\0'; }
void bt_context_set_error(bt_context *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
}

void *bt_context_alloc(bt_context *ctx, size_t n) {
    const size_t start = (ctx->used + BT_MEM_ALIGN - 1) / BT_MEM_ALIGN * BT_MEM_ALIGN;
    if (!ctx->mem || start > ctx->mem_size || n > ctx->mem_size - start) {
        bt_context_set_error(ctx, "context arena full: %zu bytes requested, %zu of %zu used", n,
                             ctx->used, ctx->mem_size);
        return NULL;
    }
    ctx->used = start + n;
    return ctx->mem + start;
}

struct bt_tensor *bt_context_new_tensor_struct(bt_context *ctx) {
    if (ctx->n_tensors == ctx->cap_tensors) {
        const int cap = ctx->cap_tensors ? 2 * ctx->cap_tensors : 64;
        struct bt_tensor **nt = realloc(ctx->tensors, (size_t)cap * sizeof *nt);
        if (!nt) {
            bt_context_set_error(ctx, "out of memory for the tensor list");
            return NULL;
        }
        ctx->tensors = nt;
        ctx->cap_tensors = cap;
    }
    struct bt_tensor *t = bt_context_alloc(ctx, sizeof(struct bt_tensor));
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    ctx->tensors[ctx->n_tensors++] = t;
    return t;
}

int bt_context_n_tensors(const bt_context *ctx) { return ctx->n_tensors; }
struct bt_tensor *bt_context_tensor(const bt_context *ctx, int i) {
    BT_ASSERT(i >= 0 && i < ctx->n_tensors);
    return ctx->tensors[i];
}

/* ---- tensors ------------------------------------------------------------- */

struct bt_tensor *bt_new_tensor(bt_context *ctx, enum bt_type type, int n_dims, const int64_t *ne) {
    if (type < 0 || type >= BT_TYPE_COUNT) {
        bt_context_set_error(ctx, "new tensor: unknown type %d", (int)type);
        return NULL;
    }
    if (n_dims < 1 || n_dims > BT_MAX_DIMS) {
        bt_context_set_error(ctx, "new tensor: %d dimensions (1 to %d allowed)", n_dims, BT_MAX_DIMS);
        return NULL;
    }
    int64_t shape[BT_MAX_DIMS] = {1, 1, 1, 1};
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] <= 0) {
            bt_context_set_error(ctx, "new tensor: ne[%d] = %lld must be positive", i, (long long)ne[i]);
            return NULL;
        }
        shape[i] = ne[i];
    }
    const struct bt_type_traits *tt = bt_type_traits(type);
    if (shape[0] % tt->blck_size != 0) {
        bt_context_set_error(ctx, "new tensor: ne[0] = %lld is not a multiple of %s's block size %lld",
                             (long long)shape[0], tt->name, (long long)tt->blck_size);
        return NULL;
    }
    /* bytes, with an overflow check: rows * row size must fit in size_t */
    size_t nbytes = bt_row_size(type, shape[0]);
    for (int i = 1; i < BT_MAX_DIMS; i++) {
        if ((uint64_t)shape[i] > SIZE_MAX / (nbytes ? nbytes : 1)) {
            bt_context_set_error(ctx, "new tensor: size overflows");
            return NULL;
        }
        nbytes *= (size_t)shape[i];
    }
    const size_t used_before = ctx->used;
    struct bt_tensor *t = bt_context_new_tensor_struct(ctx);
    if (!t) return NULL;
    void *data = NULL;
    if (!ctx->no_alloc) {
        data = bt_context_alloc(ctx, nbytes);
        if (!data) {
            ctx->used = used_before; /* leave the arena as it was */
            ctx->n_tensors--;
            return NULL;
        }
    }
    t->type = type;
    for (int i = 0; i < BT_MAX_DIMS; i++) t->ne[i] = shape[i];
    t->nb[0] = tt->type_size;
    t->nb[1] = bt_row_size(type, shape[0]);
    for (int i = 2; i < BT_MAX_DIMS; i++) t->nb[i] = t->nb[i - 1] * (size_t)shape[i - 1];
    t->data = data;
    return t;
}

struct bt_tensor *bt_new_tensor_1d(bt_context *ctx, enum bt_type type, int64_t ne0) {
    return bt_new_tensor(ctx, type, 1, &ne0);
}
struct bt_tensor *bt_new_tensor_2d(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1) {
    const int64_t ne[2] = {ne0, ne1};
    return bt_new_tensor(ctx, type, 2, ne);
}
struct bt_tensor *bt_new_tensor_3d(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1,
                                   int64_t ne2) {
    const int64_t ne[3] = {ne0, ne1, ne2};
    return bt_new_tensor(ctx, type, 3, ne);
}
struct bt_tensor *bt_new_tensor_4d(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1,
                                   int64_t ne2, int64_t ne3) {
    const int64_t ne[4] = {ne0, ne1, ne2, ne3};
    return bt_new_tensor(ctx, type, 4, ne);
}

struct bt_tensor *bt_dup_tensor(bt_context *ctx, const struct bt_tensor *src) {
    if (!src) return NULL;
    return bt_new_tensor(ctx, src->type, BT_MAX_DIMS, src->ne);
}

struct bt_tensor *bt_dup_tensor_layout(bt_context *ctx, const struct bt_tensor *src) {
    struct bt_tensor *t = bt_dup_tensor(ctx, src);
    if (!t) return NULL;
    /* keep src's strides; the data block must cover them */
    const size_t need = bt_nbytes(src);
    for (int i = 0; i < BT_MAX_DIMS; i++) t->nb[i] = src->nb[i];
    if (t->data && need > bt_nbytes(t)) {
        void *data = bt_context_alloc(ctx, need);
        if (!data) return NULL;
        t->data = data;
    }
    return t;
}

int64_t bt_nelements(const struct bt_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }
int64_t bt_nrows(const struct bt_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t bt_nbytes(const struct bt_tensor *t) {
    for (int i = 0; i < BT_MAX_DIMS; i++)
        if (t->ne[i] <= 0) return 0;
    const int64_t blck = bt_blck_size(t->type);
    size_t n = bt_row_size(t->type, t->ne[0]);
    if (blck == 1) n = bt_type_size(t->type);
    if (blck == 1) {
        for (int i = 0; i < BT_MAX_DIMS; i++) n += (size_t)(t->ne[i] - 1) * t->nb[i];
    } else {
        for (int i = 1; i < BT_MAX_DIMS; i++) n += (size_t)(t->ne[i] - 1) * t->nb[i];
    }
    return n;
}

int bt_n_dims(const struct bt_tensor *t) {
    for (int i = BT_MAX_DIMS - 1; i >= 1; i--)
        if (t->ne[i] > 1) return i + 1;
    return 1;
}

bool bt_is_contiguous(const struct bt_tensor *t) {
    size_t next = bt_type_size(t->type);
    if (t->ne[0] != bt_blck_size(t->type) && t->nb[0] != next) return false;
    next = bt_row_size(t->type, t->ne[0]);
    for (int i = 1; i < BT_MAX_DIMS; i++) {
        if (t->ne[i] != 1 && t->nb[i] != next) return false;
        next *= (size_t)t->ne[i];
    }
    return true;
}

bool bt_is_contiguous_rows(const struct bt_tensor *t) { return t->nb[0] == bt_type_size(t->type); }

bool bt_are_same_shape(const struct bt_tensor *a, const struct bt_tensor *b) {
    for (int i = 0; i < BT_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

bool bt_is_view(const struct bt_tensor *t) { return t->view_src != NULL; }

struct bt_tensor *bt_set_name(struct bt_tensor *t, const char *name) {
    if (!t) return NULL;
    snprintf(t->name, sizeof t->name, "%s", name);
    return t;
}

struct bt_tensor *bt_format_name(struct bt_tensor *t, const char *fmt, ...) {
    if (!t) return NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    return t;
}

const char *bt_get_name(const struct bt_tensor *t) { return t->name; }
void bt_set_input(struct bt_tensor *t) { t->flags |= BT_TENSOR_FLAG_INPUT; }
void bt_set_output(struct bt_tensor *t) { t->flags |= BT_TENSOR_FLAG_OUTPUT; }
void bt_set_weight(struct bt_tensor *t) { t->flags |= BT_TENSOR_FLAG_WEIGHT; }

/* ---- element access ------------------------------------------------------ */

static void *elem_ptr(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    BT_ASSERT(t->data != NULL);
    BT_ASSERT(i0 >= 0 && i0 < t->ne[0] && i1 >= 0 && i1 < t->ne[1]);
    BT_ASSERT(i2 >= 0 && i2 < t->ne[2] && i3 >= 0 && i3 < t->ne[3]);
    const int64_t blck = bt_blck_size(t->type);
    return (uint8_t *)t->data + (size_t)(i0 / blck) * t->nb[0] + (size_t)i1 * t->nb[1] +
           (size_t)i2 * t->nb[2] + (size_t)i3 * t->nb[3];
}

float bt_get_f32_nd(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    const void *p = elem_ptr(t, i0, i1, i2, i3);
    switch (t->type) {
    case BT_TYPE_F32: return *(const float *)p;
    case BT_TYPE_F16: return bt_fp16_to_fp32(*(const bt_fp16_t *)p);
    case BT_TYPE_BF16: return bt_bf16_to_fp32(*(const bt_bf16_t *)p);
    case BT_TYPE_I32: return (float)*(const int32_t *)p;
    default: {
        float block[BT_QK_K]; /* the largest block */
        const int64_t blck = bt_blck_size(t->type);
        bt_row_to_f32(t->type, p, block, blck);
        return block[i0 % blck];
    }
    }
}

void bt_set_f32_nd(struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v) {
    void *p = elem_ptr(t, i0, i1, i2, i3);
    switch (t->type) {
    case BT_TYPE_F32: *(float *)p = v; break;
    case BT_TYPE_F16: *(bt_fp16_t *)p = bt_fp32_to_fp16(v); break;
    case BT_TYPE_BF16: *(bt_bf16_t *)p = bt_fp32_to_bf16(v); break;
    case BT_TYPE_I32: *(int32_t *)p = (int32_t)v; break;
    default: {
        /* re-quantise the block with one element changed */
        float block[BT_QK_K]; /* the largest block */
        const int64_t blck = bt_blck_size(t->type);
        bt_row_to_f32(t->type, p, block, blck);
        block[i0 % blck] = v;
        bt_row_from_f32(t->type, block, p, blck);
    }
    }
}

int32_t bt_get_i32_nd(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    if (t->type == BT_TYPE_I32) return *(const int32_t *)elem_ptr(t, i0, i1, i2, i3);
    return (int32_t)bt_get_f32_nd(t, i0, i1, i2, i3);
}

void bt_set_i32_nd(struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int32_t v) {
    if (t->type == BT_TYPE_I32) {
        *(int32_t *)elem_ptr(t, i0, i1, i2, i3) = v;
        return;
    }
    bt_set_f32_nd(t, i0, i1, i2, i3, (float)v);
}
