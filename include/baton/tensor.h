/* tensor.h - element types, the tensor struct, contexts (arenas), status codes.
 *
 * A tensor has up to 4 dimensions: ne[i] elements along dimension i and nb[i]
 * byte strides (dimension 0 is the fastest).  For block types (Q8_0, Q4_0,
 * and the types of quants.h) nb[0] is the block size in bytes and nb[1] = row
 * size; a row always holds whole blocks, so ne[0] must be a multiple of the
 * type's block size (32, or 256 for the K-quants).
 *
 * A context is one arena: tensor metadata (and, unless no_alloc, tensor data)
 * is carved from it in order; nothing is freed until the context is.
 */
#ifndef BATON_TENSOR_H
#define BATON_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BT_API marks the library's public functions, those libbaton.so exports:
 * the library is compiled with hidden visibility, so nothing else is seen
 * from outside it. */
#ifndef BT_API
#if defined(__GNUC__) || defined(__clang__)
#define BT_API __attribute__((visibility("default")))
#else
#define BT_API
#endif
#endif

#define BT_MAX_DIMS 4
#ifndef BT_MAX_SRC
#define BT_MAX_SRC 5 /* FLASH_ATTN: q, k, v, mask, sinks */
#endif
#define BT_MAX_OP_PARAMS 64 /* bytes */
#ifndef BT_MAX_NAME
#define BT_MAX_NAME 64
#endif
#define BT_MEM_ALIGN 64

/* Host memory as contexts and the CPU buffer type allocate it (free() it):
 * BT_MEM_ALIGN aligned, and from 4 MiB up on a 2 MiB boundary advised for
 * transparent huge pages.  NULL when out of memory. */
BT_API void *bt_host_alloc(size_t size);

/* The monotonic clock in seconds (timings, deadlines, watchdogs). */
BT_API double bt_now_s(void);
#define BT_QK 32 /* elements per Q8_0 / Q4_0 block */

/* Programmer's errors (broken invariants inside baton): abort with file:line. */
#define BT_ASSERT(x)                                                              \
    do {                                                                          \
        if (!(x)) {                                                               \
            fprintf(stderr, "%s:%d: BT_ASSERT(%s) failed\n", __FILE__, __LINE__, #x); \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* A user's or the world's errors: returned as a status, never aborted on. */
enum bt_status {
    BT_OK = 0,
    BT_ERR_INVALID = -1,     /* bad argument, shape or file content */
    BT_ERR_NOMEM = -2,       /* arena or allocation exhausted */
    BT_ERR_CAPACITY = -3,    /* a fixed capacity (graph size, ...) exceeded */
    BT_ERR_UNSUPPORTED = -4, /* op or type not supported by a backend */
    BT_ERR_IO = -5,
    BT_ERR_ABORTED = -6,     /* stopped by a callback */
    BT_ERR_COMM = -7,        /* transport / peer failure */
    BT_ERR_MISMATCH = -8,    /* e.g. graph hashes differ between ranks */
};
BT_API const char *bt_status_str(enum bt_status s);

enum bt_type {
    BT_TYPE_F32 = 0,
    BT_TYPE_F16,
    BT_TYPE_BF16,
    BT_TYPE_I32,
    BT_TYPE_Q8_0,
    BT_TYPE_Q4_0,
    /* quants.h */
    BT_TYPE_Q4_1,
    BT_TYPE_Q5_0,
    BT_TYPE_Q5_1,
    BT_TYPE_Q2_K,
    BT_TYPE_Q3_K,
    BT_TYPE_Q4_K,
    BT_TYPE_Q5_K,
    BT_TYPE_Q6_K,
    BT_TYPE_Q8_K, /* activations of K-quant dot products */
    BT_TYPE_MXFP4,
    BT_TYPE_IQ4_NL,
    BT_TYPE_IQ4_XS,
    BT_TYPE_IQ2_XXS, /* the 1-3-bit lattice types: no from_float */
    BT_TYPE_IQ2_XS,
    BT_TYPE_IQ2_S,
    BT_TYPE_IQ3_XXS,
    BT_TYPE_IQ3_S,
    BT_TYPE_IQ1_S,
    BT_TYPE_COUNT,
};

typedef uint16_t bt_fp16_t;
typedef uint16_t bt_bf16_t;

/* GGUF byte layout: 34 bytes, d (fp16) then 32 signed quants; x = d * q */
typedef struct {
    bt_fp16_t d;
    int8_t qs[BT_QK];
} bt_block_q8_0;

/* GGUF byte layout: 18 bytes, d (fp16) then 16 bytes of nibbles;
 * element j (0..15) is the low nibble of qs[j], element j+16 the high nibble;
 * x = d * (q - 8) */
typedef struct {
    bt_fp16_t d;
    uint8_t qs[BT_QK / 2];
} bt_block_q4_0;

typedef void (*bt_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*bt_from_float_fn)(const float *src, void *dst, int64_t n);

struct bt_type_traits {
    const char *name;
    int64_t blck_size;  /* elements per block (1 for plain types) */
    size_t type_size;   /* bytes per block */
    bool is_quantized;
    bt_to_float_fn to_float;     /* n elements (multiple of blck_size) */
    bt_from_float_fn from_float; /* n elements (multiple of blck_size); NULL
                                  * for the types baton cannot quantise to */
};
BT_API const struct bt_type_traits *bt_type_traits(enum bt_type t);
BT_API const char *bt_type_name(enum bt_type t);
BT_API size_t bt_type_size(enum bt_type t);
BT_API bool bt_type_can_quantize(enum bt_type t); /* has from_float (rows can be written from F32) */
BT_API int64_t bt_blck_size(enum bt_type t);
BT_API size_t bt_row_size(enum bt_type t, int64_t ne0); /* bytes of ne0 elements */

BT_API float bt_fp16_to_fp32(bt_fp16_t h);
BT_API bt_fp16_t bt_fp32_to_fp16(float f); /* round to nearest even */
BT_API float bt_bf16_to_fp32(bt_bf16_t h);
BT_API bt_bf16_t bt_fp32_to_bf16(float f); /* round to nearest even */

/* Row conversion between any type and F32 (n a multiple of the block size;
 * I32 converts by value). */
BT_API void bt_row_to_f32(enum bt_type t, const void *src, float *dst, int64_t n);
BT_API void bt_row_from_f32(enum bt_type t, const float *src, void *dst, int64_t n);

enum bt_op {
    BT_OP_NONE = 0,

    BT_OP_ADD,
    BT_OP_SUB,
    BT_OP_MUL,
    BT_OP_DIV,
    BT_OP_SCALE,
    BT_OP_SQR,
    BT_OP_SQRT,
    BT_OP_SUM_ROWS,
    BT_OP_MEAN,

    BT_OP_MUL_MAT,
    BT_OP_MUL_MAT_ID,

    BT_OP_GET_ROWS,
    BT_OP_SET_ROWS,
    BT_OP_CPY,
    BT_OP_CONT,

    BT_OP_VIEW,
    BT_OP_RESHAPE,
    BT_OP_PERMUTE,
    BT_OP_TRANSPOSE,

    BT_OP_RMS_NORM,
    BT_OP_NORM,
    BT_OP_SOFT_MAX,
    BT_OP_ROPE,

    BT_OP_SILU,
    BT_OP_GELU,
    BT_OP_RELU,
    BT_OP_SIGMOID,
    BT_OP_SWIGLU,

    BT_OP_ARGSORT,
    BT_OP_CONCAT,

    BT_OP_FLASH_ATTN, /* fused attention with an online softmax (ops.h) */
    BT_OP_SWIGLU_OAI, /* gpt-oss's clamped SwiGLU (ops.h) */
    BT_OP_MOE_SUM,    /* a MoE's expert results weighted and summed over the slots (ops.h) */

    BT_OP_COUNT,
};
BT_API const char *bt_op_name(enum bt_op op);
/* VIEW, RESHAPE, PERMUTE, TRANSPOSE compute nothing: their data is their
 * source's.  (CPY and SET_ROWS are views too but write into their view_src.) */
BT_API bool bt_op_is_view(enum bt_op op);

enum bt_tensor_flag {
    BT_TENSOR_FLAG_INPUT = 1,  /* set by the user before each run */
    BT_TENSOR_FLAG_OUTPUT = 2, /* read by the user after a run; never freed early */
    BT_TENSOR_FLAG_WEIGHT = 4, /* model parameter: set once */
    /* memory placed by a scheduler's allocator (sched.h), which takes it
     * back when it plans the tensor's graph again; not part of a graph's hash */
    BT_TENSOR_FLAG_SCHED = 8,
    /* bytes in the CPU backend's repacked layout (cpu.h,
     * bt_cpu_weight_repack): only its matmul and GET_ROWS read them; bt_tensor_set,
     * _get, _memset and _copy refuse such a tensor */
    BT_TENSOR_FLAG_REPACKED = 16,
};

struct bt_buffer; /* backend.h */

struct bt_tensor {
    enum bt_type type;
    int64_t ne[BT_MAX_DIMS]; /* elements per dimension */
    size_t nb[BT_MAX_DIMS];  /* bytes per step in each dimension */

    enum bt_op op;
    int32_t op_params[BT_MAX_OP_PARAMS / sizeof(int32_t)];
    int32_t flags; /* enum bt_tensor_flag */

    struct bt_tensor *src[BT_MAX_SRC];

    struct bt_tensor *view_src; /* the tensor that owns the data, for views */
    size_t view_offs;           /* byte offset into view_src's data */

    void *data;
    struct bt_buffer *buffer;
    void *extra; /* backend-specific */

    /* A weight of experts [.., .., n_expert] of which this process holds
     * only [expert_lo, expert_hi) (an expert group's share): data still
     * addresses expert 0, the others' bytes are not there, and MUL_MAT_ID
     * computes only the (slot, token) pairs whose expert is held, leaving
     * the rest of its result as it was; of an attention's per-head weight
     * [.., .., n_head], MUL_MAT computes only the held heads' matrices of
     * its result.  expert_hi 0: every expert. */
    int32_t expert_lo, expert_hi;
    /* A 2-d weight of which this process holds only rows [row_lo, row_hi)
     * (a group's share of a dense product): data still addresses row 0, the
     * other rows' bytes are not there, and MUL_MAT computes only those rows
     * of its result, leaving the rest as it was.  On a FLASH_ATTN node: only
     * rows [row_lo, row_hi) of its dimension 1 (a group's share of the q
     * heads); on a CONCAT along dimension 0: the rows of dimension 1 outside
     * them only the second source's part (the first's is another rank's).
     * row_hi 0: every row. */
    int32_t row_lo, row_hi;
    /* A MUL_MAT (or SWIGLU) node that computes only columns [col_lo,
     * col_hi) of its result (a group's share of a prompt's tokens), each
     * the same bits as in the whole, leaving the others as they were.
     * col_hi 0: every column. */
    int32_t col_lo, col_hi;
    /* A GLU node of an expert chain, of one row per (slot, token) ([n, K,
     * T]), where an expert group's rank computes a share of the chain's
     * experts: held_ids [K, T] the chain's ids, and the CPU computes only
     * the rows whose expert lies in [expert_lo, expert_hi), leaving the
     * rest as they were (no later node of the chain reads them).  NULL:
     * every row. */
    const struct bt_tensor *held_ids;

    char name[BT_MAX_NAME];
};

/* ---- contexts ---------------------------------------------------------- */

struct bt_init_params {
    size_t mem_size;   /* bytes of the arena */
    void *mem_buffer;  /* NULL: the context allocates (and frees) it */
    bool no_alloc;     /* true: tensors get metadata only, data placed later */
};

typedef struct bt_context bt_context;

/* NULL when the arena cannot be allocated. */
BT_API bt_context *bt_init(struct bt_init_params params);
BT_API void bt_free(bt_context *ctx);
BT_API size_t bt_used_mem(const bt_context *ctx);
BT_API bool bt_get_no_alloc(const bt_context *ctx);
/* Bytes the arena needs per tensor of metadata (for sizing mem_size). */
BT_API size_t bt_tensor_overhead(void);
/* Carve n bytes (aligned) from the arena; NULL and an error when full. */
BT_API void *bt_context_alloc(bt_context *ctx, size_t n);
/* A zeroed tensor struct carved from the arena and recorded in the context's
 * list of tensors (op constructors and views use it); NULL when full. */
BT_API struct bt_tensor *bt_context_new_tensor_struct(bt_context *ctx);
/* The tensors of a context in creation order: i from 0 to bt_context_n_tensors. */
BT_API int bt_context_n_tensors(const bt_context *ctx);
BT_API struct bt_tensor *bt_context_tensor(const bt_context *ctx, int i);

/* The last error a constructor in this context reported (a shape error, an
 * exhausted arena); "" when none.  Constructors that fail return NULL, and a
 * constructor given a NULL source returns NULL and keeps the first message,
 * so a chain of calls can be checked once at its end. */
BT_API const char *bt_context_error(const bt_context *ctx);
BT_API void bt_context_clear_error(bt_context *ctx);
BT_API void bt_context_set_error(bt_context *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* A constructor's failure (the one error convention, baton.h): the
 * message into the caller's buffer err of n bytes (nothing when err is NULL
 * or n is 0), and st returned. */
BT_API enum bt_status bt_error_printf(char *err, size_t n, enum bt_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* ---- tensors ----------------------------------------------------------- */

BT_API struct bt_tensor *bt_new_tensor(bt_context *ctx, enum bt_type type, int n_dims, const int64_t *ne);
BT_API struct bt_tensor *bt_new_tensor_1d(bt_context *ctx, enum bt_type type, int64_t ne0);
BT_API struct bt_tensor *bt_new_tensor_2d(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1);
BT_API struct bt_tensor *bt_new_tensor_3d(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1,
                                   int64_t ne2);
BT_API struct bt_tensor *bt_new_tensor_4d(bt_context *ctx, enum bt_type type, int64_t ne0, int64_t ne1,
                                   int64_t ne2, int64_t ne3);
/* Same type and shape, contiguous, new data. */
BT_API struct bt_tensor *bt_dup_tensor(bt_context *ctx, const struct bt_tensor *src);
/* Same type, shape and strides (not necessarily contiguous), new data. */
BT_API struct bt_tensor *bt_dup_tensor_layout(bt_context *ctx, const struct bt_tensor *src);

BT_API int64_t bt_nelements(const struct bt_tensor *t);
BT_API int64_t bt_nrows(const struct bt_tensor *t); /* ne1*ne2*ne3 */
BT_API size_t bt_nbytes(const struct bt_tensor *t); /* span of the data, strides included */
BT_API int bt_n_dims(const struct bt_tensor *t);    /* highest dim with ne>1, plus one (>= 1) */
BT_API bool bt_is_contiguous(const struct bt_tensor *t);
BT_API bool bt_is_contiguous_rows(const struct bt_tensor *t); /* nb[0] == element size */
BT_API bool bt_are_same_shape(const struct bt_tensor *a, const struct bt_tensor *b);
BT_API bool bt_is_view(const struct bt_tensor *t);

BT_API struct bt_tensor *bt_set_name(struct bt_tensor *t, const char *name);
BT_API struct bt_tensor *bt_format_name(struct bt_tensor *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
BT_API const char *bt_get_name(const struct bt_tensor *t);
BT_API void bt_set_input(struct bt_tensor *t);
BT_API void bt_set_output(struct bt_tensor *t);
BT_API void bt_set_weight(struct bt_tensor *t);

/* Element access (host data only; i in elements of a contiguous view of the
 * tensor's logical index order).  For tests and small tools. */
BT_API float bt_get_f32_nd(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
BT_API void bt_set_f32_nd(struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v);
BT_API int32_t bt_get_i32_nd(const struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
BT_API void bt_set_i32_nd(struct bt_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int32_t v);

/* op_params helpers */
static inline int32_t bt_get_op_param_i32(const struct bt_tensor *t, int i) { return t->op_params[i]; }
static inline void bt_set_op_param_f32(struct bt_tensor *t, int i, float v) {
    union { float f; int32_t i; } u;
    u.f = v;
    t->op_params[i] = u.i;
}
static inline float bt_get_op_param_f32(const struct bt_tensor *t, int i) {
    union { float f; int32_t i; } u;
    u.i = t->op_params[i];
    return u.f;
}

#ifdef __cplusplus
}
#endif
#endif
