/* cpu_impl.h - internal interface between the CPU executor (cpu.c), the
 * thread pool (threadpool.c), the element-wise / row kernels (ops_cpu.c) and
 * the matrix kernels (matmul.c, fdot.c) and fused attention (attn.c).  Not part of the public API. */
#ifndef BATON_CPU_IMPL_H
#define BATON_CPU_IMPL_H

#include "baton/cpu.h"
#include "baton/ops.h"

#include <stdint.h>
#include <string.h>

/* ---- thread pool ---- */
typedef struct bt_threadpool bt_threadpool;
typedef void (*bt_task_fn)(void *arg, int ith, int nth);
/* n_threads workers in all, the caller being thread 0. */
bt_threadpool *bt_threadpool_new(int n_threads);
void bt_threadpool_free(bt_threadpool *pool);
int bt_threadpool_n_threads(const bt_threadpool *pool);
/* Run fn(arg, ith, nth) on every thread (the caller is ith 0); returns when
 * all have finished.  Idle workers spin briefly, then sleep. */
void bt_threadpool_run(bt_threadpool *pool, bt_task_fn fn, void *arg);
/* Barrier among the threads of the current run (for ops with phases). */
void bt_threadpool_barrier(bt_threadpool *pool);

/* ---- what one thread sees while computing one node ---- */
struct bt_cpu_params {
    int ith, nth;
    void *wdata;         /* work buffer shared by all threads, 64-byte aligned */
    size_t wsize;        /* its size: bt_cpu_work_size(node, nth) */
    bool reference;      /* use plain reference kernels */
    bt_threadpool *pool; /* for bt_threadpool_barrier */
    /* first run-time error of this node; any thread may set it */
    volatile int *status;
    char *errbuf;        /* message for *status, BT_CPU_ERRBUF bytes */
    /* this node's work counter, shared by its threads, 0 when the node
     * starts: a kernel hands out chunks of work with bt_cpu_next_chunk;
     * NULL: none (each thread keeps a fixed share) */
    int64_t *chunk;
    int node;            /* the node's index in the graph */
    int *fail_node;      /* where bt_cpu_fail records it (NULL: nowhere) */
};

/* The next chunk of the current node's work for this thread (0, 1, 2, ...
 * across all threads together, each index given once).  A thread that is
 * slowed (preempted, or sharing its core) simply takes fewer chunks. */
static inline int64_t bt_cpu_next_chunk(const struct bt_cpu_params *p) {
    return __atomic_fetch_add(p->chunk, 1, __ATOMIC_RELAXED);
}
#define BT_CPU_ERRBUF 256

/* Report a run-time error from a kernel (first one wins; thread-safe). */
void bt_cpu_fail(const struct bt_cpu_params *p, enum bt_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ops_cpu.c: every op except MUL_MAT / MUL_MAT_ID */
void bt_cpu_compute_op(const struct bt_cpu_params *p, struct bt_tensor *node);
bool bt_cpu_op_supported(const struct bt_tensor *node);
size_t bt_cpu_op_work_size(const struct bt_tensor *node, int nth);

/* matmul.c */
void bt_cpu_mul_mat(const struct bt_cpu_params *p, struct bt_tensor *dst);
void bt_cpu_mul_mat_id(const struct bt_cpu_params *p, struct bt_tensor *dst);
bool bt_cpu_mul_mat_supported(const struct bt_tensor *node);
size_t bt_cpu_mul_mat_work_size(const struct bt_tensor *node, int nth);

/* The rows a thread goes to after its current range (matmul.c's chunk
 * claims), asked for by a kernel's last tile so that it prefetches them:
 * true with next[0 .. rm) pointed at rm rows of them, false when there are
 * none.  fn NULL: never any. */
struct bt_cpu_next {
    bool (*fn)(void *ctx, int rm, const void **next);
    void *ctx;
};

/* fdot.c: rows [r0, r1) of float weights a (F32 or F16; k columns,
 * row stride a_nb1) times ncols F32 columns bcols into dcols[j][r], in the
 * one order of these types (fdot.c says which); buf: a thread's
 * bt_cpu_fdot_buf_bytes(n) bytes, n >= ncols; after: the rows the thread
 * goes to next (the direct path's last tile prefetches them). */
void bt_cpu_fdot_rows(enum bt_type type, const char *a, size_t a_nb1, int64_t k, int64_t ncols,
                      const float *const *bcols, float *const *dcols, int64_t r0, int64_t r1,
                      float *buf, struct bt_cpu_next after);
size_t bt_cpu_fdot_buf_bytes(int64_t ncols);
#ifndef BT_MM_FKC
/* The quantised GEMMs' column tiles: columns [j0, ncols) as tiles of 4,
 * then one of 2 and 1 where left; TILE(RN, j) runs the tile of RN columns
 * from column j (RN a constant, for the always-inline tiles). */
#define BT_CPU_COL_TILES_FROM(ncols, TILE, j0) \
    do {                                      \
        int64_t j_ = (j0);                    \
        for (; j_ + 4 <= (ncols); j_ += 4)    \
            TILE(4, j_);                      \
        if ((ncols) - j_ >= 2) {              \
            TILE(2, j_);                      \
            j_ += 2;                          \
        }                                     \
        if ((ncols) - j_ >= 1) TILE(1, j_);   \
    } while (0)
/* tiles of 8, then the rest as above (one of 4, 2 and 1 where left) */
#define BT_CPU_COL_TILES(ncols, TILE)           \
    do {                                        \
        int64_t j8_ = 0;                        \
        for (; j8_ + 8 <= (ncols); j8_ += 8)    \
            TILE(8, j8_);                       \
        BT_CPU_COL_TILES_FROM(ncols, TILE, j8_); \
    } while (0)
/* at most 4 columns a tile (AVX2's 16 registers) */
#define BT_CPU_COL_TILES4(ncols, TILE) BT_CPU_COL_TILES_FROM(ncols, TILE, 0)

#define BT_MM_FKC 1024 /* fdot.c: chunk of the float order, in elements (a multiple of 16) */
#endif

/* attn.c: FLASH_ATTN.  bt_cpu_flash_attn runs the widest kernel set the
 * CPU has (the plain C one under p->reference); every set gives the same
 * bits, and bt_cpu_flash_attn_isa runs a chosen one (for the tests). */
enum bt_cpu_attn_isa { BT_CPU_ATTN_C, BT_CPU_ATTN_AVX2, BT_CPU_ATTN_AVX512, BT_CPU_ATTN_NEON, BT_CPU_ATTN_ISA_COUNT };
void bt_cpu_flash_attn(const struct bt_cpu_params *p, struct bt_tensor *dst);
bool bt_cpu_flash_attn_supported(const struct bt_tensor *node);
size_t bt_cpu_flash_attn_work_size(const struct bt_tensor *node, int nth);
/* "c", "avx2", "avx512", "neon"; NULL for a set this build lacks */
const char *bt_cpu_attn_isa_name(enum bt_cpu_attn_isa isa);
/* built in and supported by this CPU */
bool bt_cpu_attn_isa_available(enum bt_cpu_attn_isa isa);
void bt_cpu_flash_attn_isa(const struct bt_cpu_params *p, struct bt_tensor *dst, enum bt_cpu_attn_isa isa);

#if defined(__AVX512F__) || (defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)))
#include <immintrin.h>
/* Transpose 16 x 16 32-bit values in registers (r[i] lane j <-> r[j] lane
 * i); only bit moves, so it serves integer data cast to __m512 too.  Built
 * for AVX-512 whatever the file's -march, for callers that choose their
 * instruction set at run time (attn.c). */
#if defined(__AVX512F__)
static inline void bt_cpu_transpose16(__m512 r[16]) {
#else
__attribute__((target("avx512f"))) static inline void bt_cpu_transpose16(__m512 r[16]) {
#endif
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* u[4g + j], 128-bit lane L: column 4L + j of rows 4g .. 4g+3 */
    for (int g = 0; g < 4; g++) {
        const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        const __m512d c = _mm512_castps_pd(t[4 * g + 1]), d = _mm512_castps_pd(t[4 * g + 3]);
        r[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for (int j = 0; j < 4; j++) {
        const __m512 s0 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 s1 = _mm512_shuffle_f32x4(r[j], r[4 + j], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512 s2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512 s3 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], _MM_SHUFFLE(3, 1, 3, 1));
        t[0 + j] = _mm512_shuffle_f32x4(s0, s2, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + j] = _mm512_shuffle_f32x4(s0, s2, _MM_SHUFFLE(3, 1, 3, 1));
        t[4 + j] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + j] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* Transpose 8 x 8 32-bit values in registers (r[i] lane j <-> r[j] lane i);
 * only bit moves, so it serves BF16 pairs cast to __m256 too.  Built for
 * AVX2 whatever the file's -march, as bt_cpu_transpose16 (attn.c). */
#if defined(__AVX2__)
static inline void bt_cpu_transpose8(__m256 r[8]) {
#else
__attribute__((target("avx2"))) static inline void bt_cpu_transpose8(__m256 r[8]) {
#endif
    __m256 t[8], s[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) { /* rows 4h .. 4h+3: s[4h + e] holds elements e and e + 4 */
        s[4 * h] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int e = 0; e < 4; e++) {
        r[e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x20);
        r[4 + e] = _mm256_permute2f128_ps(s[e], s[4 + e], 0x31);
    }
}
#endif


#if defined(__AVX2__)

/* The AVX2 integer dots (quant_i8.c, quant_dot.c): per int32 lane, the 4
 * products of unsigned bytes u and signed bytes s summed: vpdpbusd where the
 * build has AVX-VNNI or AVX-512 VNNI, else vpmaddubsw then vpmaddwd by ones (the same
 * integers when no pair of products reaches 32768, which the callers keep:
 * small u, or magnitudes against signs moved onto s). */
static inline __m256i bt_cpu_dot4_avx2(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
/* the sum of 8 int32 lanes */
static inline int32_t bt_cpu_hsum_i32x8(__m256i v) {
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(1, 0, 3, 2)));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(x);
}
/* 16 bytes of nibbles (p) as 32 bytes: 0..15 the low nibbles, 16..31 the
 * high ones; a broadcast load, one shift of the upper half, a mask */
static inline __m256i bt_cpu_nibbles32_avx2(const void *p) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}
/* a Q5 block's 32 fifth bits (qh, bit j element j) as bytes in element
 * order: 16 where the bit is set, else 0 */
static inline __m256i bt_cpu_q5_bits_avx2(const void *qh) {
    uint32_t h;
    memcpy(&h, qh, sizeof h);
    /* byte j <- byte j / 8 of qh, then bit j % 8 of it tested */
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                              _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                                 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
}
#endif

#if defined(__AVX512F__) || defined(__AVX2__)
/* Decode tiles over short weight rows (quant_i8.c, quant_dot.c, quant_iq.c): a tile of
 * rm rows of rb bytes reads them side by side; when the next tile's rows
 * are one block of memory (next[r] = next[0] + r rb, consecutive rows of a
 * weight matrix), the tile prefetches that block (or, for small tiles, the
 * one after it) in address order, share `step` of `nsteps` per step,
 * instead of a piece of each row: the order the memory and the hardware
 * prefetchers stream best.  With 2 MiB pages, on the 1152-byte Q4_0 rows of
 * a k = 2048 product: 1 thread 15.3 -> 17.6 GB/s, 2 threads (m = 32000)
 * 23.8 -> 28.3.  Prefetching changes no result. */
static inline bool bt_cpu_rows_block(const void *const *next, int rm, size_t rb) {
    if (!next) return false;
    for (int r = 1; r < rm; r++)
        if ((const char *)next[r] != (const char *)next[0] + (size_t)r * rb) return false;
    return true;
}
/* the lines of shares step .. step + n - 1 (of nsteps) of the `bytes` bytes
 * that start `ahead` bytes after block (addresses as integers: past the
 * block may be past its allocation, where a prefetch is harmless) */
static inline void bt_cpu_prefetch_share(const void *block, size_t ahead, size_t bytes, int64_t step, int64_t n,
                                         int64_t nsteps) {
    const uintptr_t p = (uintptr_t)block + ahead;
    const int64_t end = step + n < nsteps ? step + n : nsteps;
    const size_t lo = bytes * (size_t)step / (size_t)nsteps, hi = bytes * (size_t)end / (size_t)nsteps;
    if (hi <= lo) return;
    const uintptr_t l0 = (p + lo) & ~(uintptr_t)63, l1 = (p + hi - 1) & ~(uintptr_t)63;
    for (uintptr_t l = l0; l <= l1; l += 64) _mm_prefetch((const char *)l, _MM_HINT_T1);
}

/* The decode tiles' prefetch (the K-quants' and the 32-element types' in
 * quant_dot.c, IQ4_XS's in quant_iq.c): to L1, the block PF blocks ahead in each of a tile's rows,
 * about BT_CPU_TILE_PREFETCH bytes on (2048 into L1 rather than 1536 into L2 since the Q2_K and
 * Q3_K tiles take fewer instructions: Q4_K, Q5_K, Q6_K and IQ4_XS plain rows 3-10% faster from
 * memory, Q2_K and Q3_K 2-4%, AVX2 level or faster); near a row's end, the start of the row the next
 * tile reads (next, when there is one), so that it does not begin by waiting
 * on memory.  The hardware prefetcher alone leaves the 1-column tiles waiting
 * on memory: more rows' lines in flight read faster. */
#ifndef BT_CPU_TILE_PREFETCH
#define BT_CPU_TILE_PREFETCH 2048
#endif
#ifndef BT_CPU_TILE_BLOCK_ROW
#define BT_CPU_TILE_BLOCK_ROW 2048 /* rows up to this many bytes prefetch the next tiles as one block */
#endif
/* block (bt_cpu_tile_block_kind): the next tile's rows are one block of memory
 * (bt_cpu_rows_block) and short: per block b a share of the rows after them (the tile after the
 * next: at one tile, the next tile's last rows came too late for its first
 * blocks, Q6_K 20.7 -> 17.3 GB/s; at two, Q6_K as before, Q4_K 13 -> 15
 * GB/s, 1 thread, 2 MiB pages, k = 2048), in address order
 * (bt_cpu_prefetch_share) */
/* 0: no block; 1: block; 2: block, and the next tile does not follow this
 * one (a new chunk of rows, whose first tile no tile has prefetched yet: it
 * too) */
static inline int bt_cpu_tile_block_kind(const void *const *w_rows, const void *const *next, int64_t nblk,
                                         size_t bs, const int RM) {
    if ((size_t)nblk * bs > BT_CPU_TILE_BLOCK_ROW || !bt_cpu_rows_block(next, RM, (size_t)nblk * bs)) return 0;
    return (const char *)next[0] == (const char *)w_rows[0] + (size_t)RM * (size_t)nblk * bs ? 1 : 2;
}
/* for the n blocks b .. b + n - 1 of rows of nblk blocks of bs bytes: a tile
 * may prefetch for a group of blocks at once, nblk not a multiple of n */
static inline __attribute__((always_inline)) void bt_cpu_tile_prefetch_n(const void *const *w_rows,
                                                                         const void *const *next, int block, int64_t b,
                                                                         int n, int64_t nblk, size_t bs, const int RM) {
    if (block) {
        /* a 4-row tile is short: the tile after the next one */
        const size_t tb = (size_t)RM * (size_t)nblk * bs;
        bt_cpu_prefetch_share(next[0], tb, tb, b, n, nblk);
        if (block == 2) bt_cpu_prefetch_share(next[0], 0, tb, b, n, nblk);
        return;
    }
    const int64_t pf = (int64_t)(BT_CPU_TILE_PREFETCH / bs) + 1, pos = b + pf;
    const size_t bytes = (size_t)n * bs;
    _Pragma("GCC unroll 8")
    for (int r = 0; r < RM; r++) {
        /* rows shorter than the distance wrap round in the next tile's rows
         * (a group's blocks past a row's end: the next row's, as harmless) */
        const char *p = pos < nblk ? (const char *)w_rows[r] + (size_t)pos * bs
                        : next ? (const char *)next[r] + (size_t)((pos - nblk) % nblk) * bs
                               : NULL;
        if (p) {
            for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
            _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
        }
    }
}
/* The repacked decode tiles' prefetch (quant_i8.c, quant_dot.c): into L1 the
 * lines of bytes [at, at + n) of a group of gsize bytes, those past its end
 * in the next group (next; none when it is NULL) */
static inline __attribute__((always_inline)) void bt_cpu_group_prefetch(const uint8_t *g, size_t gsize,
                                                                        const uint8_t *next, size_t at, size_t n) {
    for (size_t o = at; o < at + n; o += 64) {
        if (o < gsize) _mm_prefetch((const char *)g + o, _MM_HINT_T0);
        else if (next) _mm_prefetch((const char *)next + (o - gsize), _MM_HINT_T0);
    }
}
/* part i of n of the prefetch above for a block of span bytes at at: a
 * kernel that reads a block in n steps issues a part at each.  All of a
 * 16-row block's lines at once (36 to 53 prefetches) left its loads waiting
 * for fill buffers: the Q6_K decode tile read 78-83% of the streaming
 * bandwidth so, 96-102% with the lines spread over its 16 steps (AVX-512,
 * from memory). */
static inline __attribute__((always_inline)) void bt_cpu_group_prefetch_part(const uint8_t *g, size_t gsize,
                                                                             const uint8_t *next, size_t at,
                                                                             size_t span, int i, int n) {
    const size_t step = (span + 64 * (size_t)n - 1) / (64 * (size_t)n) * 64, lo = (size_t)i * step;
    if (lo < span) bt_cpu_group_prefetch(g, gsize, next, at + lo, span - lo < step ? span - lo : step);
}
static inline __attribute__((always_inline)) void bt_cpu_tile_prefetch(const void *const *w_rows,
                                                                       const void *const *next, int block, int64_t b,
                                                                       int64_t nblk, size_t bs, const int RM) {
    bt_cpu_tile_prefetch_n(w_rows, next, block, b, 1, nblk, bs, RM);
}
#endif

/* 4 bytes at p (any alignment) as an int32 (quant_i8.c, quant_dot.c) */
static inline int32_t bt_cpu_load_i32(const void *p) {
    int32_t x;
    memcpy(&x, p, sizeof x);
    return x;
}

/* Work buffer bytes for node with nth threads (dispatches to the above). */
size_t bt_cpu_work_size(const struct bt_tensor *node, int nth);

/* cpu_plan.c: does thread 0 compute this node alone (with nth threads)? */
bool bt_cpu_node_solo(const struct bt_tensor *node, int nth);

#endif
