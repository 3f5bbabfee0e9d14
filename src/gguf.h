/* gguf.h - GGUF model files: a hardened reader over a read-only mapping and a
 * streaming writer.
 *
 * Format (little-endian; versions 2 and 3 read, 3 written):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv x      { string key, u32 value type, value }
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
 *   padding to general.alignment (default 32), then the data section; each
 *   tensor's offset is relative to the data section and a multiple of the
 *   alignment.
 *   string = u64 length + bytes (no NUL); array = u32 element type, u64 count,
 *   elements (arrays may nest).
 *
 * The reader never reads the file whole: it maps it and walks the header,
 * checking every count, length, offset and size against the file's size
 * before use.  Tensor data stays in the mapping until a caller touches it.
 * Every error names the file, the byte offset, and the key or tensor:
 *   model.gguf: offset 1234: tensor "blk.3.attn_q.weight": dimension 2 is 0
 *
 * A reader is used by one thread at a time (the getters keep their last error
 * message in it); the tensor table and values are immutable after open.
 */
#ifndef BATON_GGUF_H
#define BATON_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_GGUF_DEFAULT_ALIGNMENT 32
#define BT_GGUF_MAX_DIMS 4
#define BT_GGUF_MAX_NAME 64        /* tensor names are shorter (ggml's GGML_MAX_NAME) */
#define BT_GGUF_MAX_KEY 65535      /* the format's limit on a key's length */
#ifndef BT_GGUF_MAX_DEPTH
#define BT_GGUF_MAX_DEPTH 8        /* nested arrays deeper than this are refused */
#endif
#define BT_GGUF_ERR_LEN 512

/* Metadata value types, numbered as in the file. */
enum bt_gguf_type {
    BT_GGUF_TYPE_UINT8 = 0,
    BT_GGUF_TYPE_INT8 = 1,
    BT_GGUF_TYPE_UINT16 = 2,
    BT_GGUF_TYPE_INT16 = 3,
    BT_GGUF_TYPE_UINT32 = 4,
    BT_GGUF_TYPE_INT32 = 5,
    BT_GGUF_TYPE_FLOAT32 = 6,
    BT_GGUF_TYPE_BOOL = 7,
    BT_GGUF_TYPE_STRING = 8,
    BT_GGUF_TYPE_ARRAY = 9,
    BT_GGUF_TYPE_UINT64 = 10,
    BT_GGUF_TYPE_INT64 = 11,
    BT_GGUF_TYPE_FLOAT64 = 12,
    BT_GGUF_TYPE_COUNT,
};
const char *bt_gguf_type_name(enum bt_gguf_type t); /* "uint32", "string", ...; "?" if out of range */
size_t bt_gguf_type_size(enum bt_gguf_type t);      /* bytes of a scalar; 0 for string and array */

/* ---- tensor types as numbered in GGUF files (ggml's enum ggml_type) ---- */
struct bt_ggml_type_info {
    uint32_t id;        /* the number in the file */
    const char *name;   /* "Q4_K", as gguf-dump prints it */
    int64_t blck_size;  /* elements per block */
    size_t type_size;   /* bytes per block */
};
/* The info for a type number, NULL when the number is unknown (or removed from
 * ggml, as 4, 5 and 31-33). */
const struct bt_ggml_type_info *bt_ggml_type_info(uint32_t id);
/* baton's type for a GGUF type number; BT_TYPE_COUNT when baton has none
 * (found by name, so each type added to enum bt_type is picked up). */
enum bt_type bt_ggml_type_to_bt(uint32_t id);
/* The GGUF type number of a baton type (BT_ASSERT that it has one). */
uint32_t bt_ggml_type_from_bt(enum bt_type t);

/* A string inside the mapping: not NUL-terminated, may hold any bytes. */
struct bt_gguf_str {
    uint64_t n;
    const char *data;
};

/* A metadata value.  Scalars are read through the getters below; arrays of
 * strings or of arrays have one bt_gguf_value per element (see
 * bt_gguf_arr_elem). */
struct bt_gguf_value {
    enum bt_gguf_type type;
    enum bt_gguf_type elem_type; /* arrays */
    uint64_t n;                  /* strings: length in bytes; arrays: element count */
    uint64_t off;                /* file offset of the payload: a scalar, a string's bytes, an array's first element */
    uint64_t raw_off, raw_size;  /* the value's whole encoding (length / element header included) */
    int64_t first;               /* arrays of strings or arrays: index of element 0 in the reader's value pool */
};

struct bt_gguf_tensor {
    char name[BT_GGUF_MAX_NAME];
    uint32_t ggml_type;          /* the number in the file */
    enum bt_type type;           /* baton's type, BT_TYPE_COUNT when baton cannot compute it */
    int n_dims;
    int64_t ne[BT_GGUF_MAX_DIMS]; /* unused dimensions are 1 */
    uint64_t offset;             /* from the start of the data section */
    uint64_t file_offset;        /* from the start of the file */
    uint64_t size;               /* bytes of data */
    uint64_t info_offset;        /* where its entry in the tensor table starts (for messages) */
    int layer;                   /* N of a "blk.N." name, -1 otherwise */
    int shard;                   /* the file of a split model it is in (0: the first); file_offset is in it */
};

struct bt_gguf;

/* Open and check a file: header, every key and value, the tensor table and
 * the data section.  On error *out is NULL, err holds the message.
 *
 * A split model (llama.cpp's gguf-split and the gguf package's writer:
 * PREFIX-00001-of-0000N.gguf ..., keys split.no, split.count and
 * split.tensors.count) is opened from its first file: the others are found
 * beside it by name, each checked as a file of its own and as the shard it
 * claims to be, and their tensors join the first's table (the metadata is
 * the first file's).  Opening another shard than the first is an error that
 * names the first. */
enum bt_status bt_gguf_open(const char *path, struct bt_gguf **out, char *err, size_t n_err);
/* The same over bytes in memory (kept by the caller until close); name is
 * used in messages. */
enum bt_status bt_gguf_open_memory(const void *data, size_t size, const char *name, struct bt_gguf **out,
                                   char *err, size_t n_err);
/* A file's header alone (header_size bytes, kept by the caller until close)
 * for a file of file_size bytes: its keys and tensor table, checked as a
 * whole file's; reading a tensor's data is a programmer's error.  What a plan
 * of a model too large to make reads (bt_llm_describe_gguf). */
enum bt_status bt_gguf_open_header(const void *data, size_t header_size, uint64_t file_size, const char *name,
                                   struct bt_gguf **out, char *err, size_t n_err);
void bt_gguf_close(struct bt_gguf *g);

/* The last getter error ("model.gguf: key \"x\" is int32, not uint32"). */
const char *bt_gguf_error(const struct bt_gguf *g);

const char *bt_gguf_path(const struct bt_gguf *g);
uint32_t bt_gguf_version(const struct bt_gguf *g);
uint64_t bt_gguf_file_size(const struct bt_gguf *g); /* of every file of a split model together */
int bt_gguf_n_files(const struct bt_gguf *g);         /* 1, or a split model's shards */
uint32_t bt_gguf_alignment(const struct bt_gguf *g);
uint64_t bt_gguf_data_offset(const struct bt_gguf *g); /* file offset of the data section */
const uint8_t *bt_gguf_bytes(const struct bt_gguf *g); /* the whole mapping */
/* FNV-1a 64 of the header (the bytes before the data section, or the whole
 * file when it is shorter; every shard's, in order, for a split model): with
 * the file's size, what ranks compare to know they opened the same file,
 * without reading the data. */
uint64_t bt_gguf_header_checksum(const struct bt_gguf *g);

/* ---- metadata ---- */
int64_t bt_gguf_n_kv(const struct bt_gguf *g);
const char *bt_gguf_kv_key(const struct bt_gguf *g, int64_t i); /* NUL-terminated */
const struct bt_gguf_value *bt_gguf_kv_value(const struct bt_gguf *g, int64_t i);
int64_t bt_gguf_find_key(const struct bt_gguf *g, const char *key); /* -1 when absent */

/* Typed getters by key: BT_OK, or BT_ERR_INVALID with bt_gguf_error() naming
 * the key when it is absent or holds another type.  No conversion between
 * types. */
enum bt_status bt_gguf_get_u8(struct bt_gguf *g, const char *key, uint8_t *out);
enum bt_status bt_gguf_get_i8(struct bt_gguf *g, const char *key, int8_t *out);
enum bt_status bt_gguf_get_u16(struct bt_gguf *g, const char *key, uint16_t *out);
enum bt_status bt_gguf_get_i16(struct bt_gguf *g, const char *key, int16_t *out);
enum bt_status bt_gguf_get_u32(struct bt_gguf *g, const char *key, uint32_t *out);
enum bt_status bt_gguf_get_i32(struct bt_gguf *g, const char *key, int32_t *out);
enum bt_status bt_gguf_get_u64(struct bt_gguf *g, const char *key, uint64_t *out);
enum bt_status bt_gguf_get_i64(struct bt_gguf *g, const char *key, int64_t *out);
enum bt_status bt_gguf_get_f32(struct bt_gguf *g, const char *key, float *out);
enum bt_status bt_gguf_get_f64(struct bt_gguf *g, const char *key, double *out);
enum bt_status bt_gguf_get_bool(struct bt_gguf *g, const char *key, bool *out);
enum bt_status bt_gguf_get_str(struct bt_gguf *g, const char *key, struct bt_gguf_str *out);
/* An array whose elements have type elem (BT_GGUF_TYPE_COUNT: any); *out
 * points into the reader. */
enum bt_status bt_gguf_get_arr(struct bt_gguf *g, const char *key, enum bt_gguf_type elem,
                               const struct bt_gguf_value **out);
/* Element i of an array value (i < arr->n): strings and arrays are values of
 * their own, scalars are read with the bt_gguf_value_* readers. */
struct bt_gguf_value bt_gguf_arr_elem(const struct bt_gguf *g, const struct bt_gguf_value *arr, uint64_t i);
/* Element i of an array of strings (BT_ASSERT on the type and i). */
struct bt_gguf_str bt_gguf_arr_str(const struct bt_gguf *g, const struct bt_gguf_value *arr, uint64_t i);
/* Copy elements [i0, i0 + n) of an array of scalars into dst (the bytes of
 * the file: dst holds n * bt_gguf_type_size(arr->elem_type) bytes). */
void bt_gguf_arr_copy(const struct bt_gguf *g, const struct bt_gguf_value *arr, uint64_t i0, uint64_t n, void *dst);

/* Scalar readers of a value of any integer / float type (BT_ASSERT that v is
 * one); the string reader BT_ASSERTs a string. */
/* uint64 above INT64_MAX wraps; floats are truncated toward zero, clamped to
 * int64's range, NaN gives 0 */
int64_t bt_gguf_value_i64(const struct bt_gguf *g, const struct bt_gguf_value *v);
uint64_t bt_gguf_value_u64(const struct bt_gguf *g, const struct bt_gguf_value *v);
double bt_gguf_value_f64(const struct bt_gguf *g, const struct bt_gguf_value *v);
struct bt_gguf_str bt_gguf_value_str(const struct bt_gguf *g, const struct bt_gguf_value *v);

/* ---- tensors ---- */
int64_t bt_gguf_n_tensors(const struct bt_gguf *g);
const struct bt_gguf_tensor *bt_gguf_tensor(const struct bt_gguf *g, int64_t i); /* in file order */
int64_t bt_gguf_find_tensor(const struct bt_gguf *g, const char *name);        /* -1 when absent */
/* The tensor's bytes inside the mapping (aligned to the file's alignment
 * from the mapping's start, which is page-aligned for a file). */
const void *bt_gguf_tensor_data(const struct bt_gguf *g, const struct bt_gguf_tensor *t);
/* Done with tensor t's bytes for now (they were copied): the whole pages of
 * its range leave this process's resident memory (a later read maps them
 * again from the file).  A no-op for a file read into memory. */
void bt_gguf_tensor_release(struct bt_gguf *g, const struct bt_gguf_tensor *t);
/* baton's type for a tensor: BT_ERR_UNSUPPORTED and bt_gguf_error() naming
 * the tensor and its type when baton cannot compute it. */
enum bt_status bt_gguf_tensor_bt_type(struct bt_gguf *g, const struct bt_gguf_tensor *t, enum bt_type *out);

/* Layers: tensors named "blk.N.*".  n_layers is 1 + the largest N (0 when
 * none).  bt_gguf_layer_tensors gives the indices (file order) of layer N's
 * tensors, without touching any tensor's data; layer -1 gives the tensors of
 * no layer. */
int bt_gguf_n_layers(const struct bt_gguf *g);
int64_t bt_gguf_layer_tensors(const struct bt_gguf *g, int layer, const int64_t **idx);
uint64_t bt_gguf_layer_bytes(const struct bt_gguf *g, int layer);

/* ---- writer: GGUF v3, streamed to PATH.tmp.XXXXXX and renamed to PATH by
 * finish; close without finish removes the temporary file.
 *
 *   bt_gguf_writer_open, then set_* and add_tensor (in any order), then
 *   either bt_gguf_writer_finish (writes the data each add_tensor was given),
 *   or, to stream tensors made one at a time, add_tensor with data NULL for
 *   all of them, and bt_gguf_writer_write_data for each in the order added,
 *   then finish.  The header is written at the first write_data (or finish):
 *   set_* and add_tensor after that are a programmer's error.
 *
 * Keys are unique (a second set of one key is BT_ERR_INVALID, as are an empty
 * key, a bad name or shape, and a type with no known size); general.alignment,
 * when set, must be a power of two and is used for the data. */
struct bt_gguf_writer;

enum bt_status bt_gguf_writer_open(const char *path, struct bt_gguf_writer **out, char *err, size_t n_err);
const char *bt_gguf_writer_error(const struct bt_gguf_writer *w);
enum bt_status bt_gguf_writer_set_u8(struct bt_gguf_writer *w, const char *key, uint8_t v);
enum bt_status bt_gguf_writer_set_i8(struct bt_gguf_writer *w, const char *key, int8_t v);
enum bt_status bt_gguf_writer_set_u16(struct bt_gguf_writer *w, const char *key, uint16_t v);
enum bt_status bt_gguf_writer_set_i16(struct bt_gguf_writer *w, const char *key, int16_t v);
enum bt_status bt_gguf_writer_set_u32(struct bt_gguf_writer *w, const char *key, uint32_t v);
enum bt_status bt_gguf_writer_set_i32(struct bt_gguf_writer *w, const char *key, int32_t v);
enum bt_status bt_gguf_writer_set_u64(struct bt_gguf_writer *w, const char *key, uint64_t v);
enum bt_status bt_gguf_writer_set_i64(struct bt_gguf_writer *w, const char *key, int64_t v);
enum bt_status bt_gguf_writer_set_f32(struct bt_gguf_writer *w, const char *key, float v);
enum bt_status bt_gguf_writer_set_f64(struct bt_gguf_writer *w, const char *key, double v);
enum bt_status bt_gguf_writer_set_bool(struct bt_gguf_writer *w, const char *key, bool v);
enum bt_status bt_gguf_writer_set_str(struct bt_gguf_writer *w, const char *key, const char *v);
enum bt_status bt_gguf_writer_set_strn(struct bt_gguf_writer *w, const char *key, const char *v, uint64_t n);
/* An array of n scalars of type elem, data in the file's byte order. */
enum bt_status bt_gguf_writer_set_arr(struct bt_gguf_writer *w, const char *key, enum bt_gguf_type elem,
                                      const void *data, uint64_t n);
enum bt_status bt_gguf_writer_set_arr_str(struct bt_gguf_writer *w, const char *key, const char *const *v,
                                          uint64_t n);
/* A value of any type (nested arrays included) copied from a reader. */
enum bt_status bt_gguf_writer_set_value(struct bt_gguf_writer *w, const char *key, const struct bt_gguf *g,
                                        const struct bt_gguf_value *v);
/* A tensor of GGUF type ggml_type and shape ne[0..n_dims); data (its
 * bt_gguf-sized bytes, kept by the caller until finish) or NULL to stream. */
enum bt_status bt_gguf_writer_add_tensor(struct bt_gguf_writer *w, const char *name, uint32_t ggml_type,
                                         int n_dims, const int64_t *ne, const void *data);
/* The next tensor's data (size must equal its size). */
enum bt_status bt_gguf_writer_write_data(struct bt_gguf_writer *w, const void *data, uint64_t size);
/* Write what remains, flush, sync and rename into place; frees w. */
enum bt_status bt_gguf_writer_finish(struct bt_gguf_writer *w, char *err, size_t n_err);
/* A writer into memory (name is used in messages): the same calls, then
 * bt_gguf_writer_finish_memory, which gives the file's bytes (*data,
 * malloc'd: the caller frees it) and frees w. */
enum bt_status bt_gguf_writer_open_memory(const char *name, struct bt_gguf_writer **out, char *err, size_t n_err);
enum bt_status bt_gguf_writer_finish_memory(struct bt_gguf_writer *w, void **data, size_t *size, char *err,
                                            size_t n_err);
/* Instead of finish_memory, when every tensor was added without data: the
 * header alone (*data, malloc'd, *header_size bytes) and the size the whole
 * file would have (*file_size), for bt_gguf_open_header.  Frees w. */
enum bt_status bt_gguf_writer_finish_header(struct bt_gguf_writer *w, void **data, size_t *header_size,
                                            uint64_t *file_size, char *err, size_t n_err);
/* Discard: remove the temporary file, free w (NULL is fine). */
void bt_gguf_writer_close(struct bt_gguf_writer *w);

#ifdef __cplusplus
}
#endif

#endif
