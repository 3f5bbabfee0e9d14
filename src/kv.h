/* kv.h - the KV cache of the layers one process owns: per layer a K and a V
 * tensor of n_ctx cells (rows), and the bookkeeping of which cell holds which
 * token (sequence id, position).
 *
 *   k[il], v[il]   type [n_embd_k, n_ctx] / [n_embd_v, n_ctx], row j = cell j
 *                  (n_embd_k = head_dim * n_head_kv); F16 by default, F32 or
 *                  Q8_0 selectable (Q8_0 needs rows of whole 32-element
 *                  blocks per head: head sizes multiples of 32).  With
 *                  v_in_k (one head; deepseek2's latent, whose V is the
 *                  first n_embd_v elements of K) there is no V tensor: the
 *                  attention reads V as a view of the K rows.
 *   cells          pos[j] (-1: free) and seq[j] of each cell; one sequence
 *                  per cell
 *
 * A ubatch is placed with bt_kv_place (each sequence in its own region of
 * n_ctx / n_seq_max cells, in token order); the graph writes its new K/V rows into those cells with SET_ROWS
 * (the cell indices are a graph input), so the graph is the same for every
 * ubatch of one shape.  Attention reads the first n_kv cells
 * (bt_kv_n_active: one past the highest used cell, padded), masked by
 * bt_kv_mask: a token of sequence s at position p sees exactly the cells of
 * s with position <= p.  Every process that owns layers keeps its own cells
 * in step (placement depends only on the batches), so the mask is built
 * where it is used, never sent.
 *
 * Sliding-window layers (n_swa > 0; which layers: bt_kv_swa_layer) see only
 * the last n_swa positions (a token at p sees p - n_swa < p' <= p), and
 * keep only those: each sequence has a ring of W = n_swa + n_ubatch cells
 * (rounded up to BT_KV_PAD) in their own K/V tensors, position p in cell
 * s*W + p % W, a cell overwritten once no token can see it any more (as
 * llama.cpp's SWA cache of n_swa + n_ubatch cells per sequence).  When the
 * ring would not be smaller than a sequence's region (W >= n_ctx /
 * n_seq_max), those layers keep n_ctx cells placed as the others'.  A token
 * then reads cells in the order the ring holds them, which depends on W: its
 * bits are the same for every batch and thread count at one ubatch size, as
 * the cell order is a function of the position alone.
 */
#ifndef BATON_KV_H
#define BATON_KV_H

#include "baton/backend.h"
#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cells the attention reads are a multiple of this (fewer graph shapes) */
#ifndef BT_KV_PAD
#define BT_KV_PAD 32
#endif

struct bt_kv_config {
    int64_t n_ctx;            /* cells */
    int n_seq_max;            /* sequence ids 0 .. n_seq_max-1 */
    enum bt_type type;        /* F16 (default), F32 or Q8_0 */
    int il0, il1;             /* layers [il0, il1) held here */
    int64_t n_embd_k, n_embd_v; /* per layer: head_dim * n_head_kv */
    int64_t head_dim_k, head_dim_v;
    bt_buffer_type_t buft;    /* where the cache lives; NULL: host memory */
    bool no_memory;           /* the tensors without memory: a plan's graph (bt_model_plan) */
    int64_t n_swa;            /* sliding window (tokens) of the sliding layers; 0: none */
    int swa_pattern;          /* which layers slide (bt_kv_swa_layer) */
    int64_t n_ubatch;         /* most tokens of one ubatch: the ring holds n_swa + n_ubatch (0: no ring) */
    bool v_in_k;              /* V is the first n_embd_v elements of each K row: no V tensors */
};
/* Bytes of one cell of one layer (K and V rows; K alone with v_in_k). */
size_t bt_kv_config_row_bytes(const struct bt_kv_config *c);

/* Whether layer il is a sliding-window layer: with a window, every layer but
 * each pattern-th (il % pattern == pattern - 1: Gemma 3's global layers);
 * pattern 0: every layer slides (llama.cpp's rule). */
static inline bool bt_kv_swa_layer(int64_t n_swa, int pattern, int il) {
    return n_swa > 0 && (pattern <= 0 || il % pattern < pattern - 1);
}

struct bt_kv;

/* BT_OK and *out, or an error with one message in err (a bad size, a type
 * the cache cannot hold, memory). */
enum bt_status bt_kv_new(const struct bt_kv_config *c, struct bt_kv **out, char *err, size_t n_err);
void bt_kv_free(struct bt_kv *kv);
/* The checks bt_kv_new makes before it allocates (sizes, type, head sizes). */
enum bt_status bt_kv_check_config(const struct bt_kv_config *c, char *err, size_t n_err);
const struct bt_kv_config *bt_kv_get_config(const struct bt_kv *kv);
/* Cells of layer il's cache tensors: n_ctx, or n_seq_max * W for a sliding
 * layer with a ring (also without a kv, from a config alone). */
int64_t bt_kv_config_layer_cells(const struct bt_kv_config *c, int il);
/* Layer il's cache tensors (il in [il0, il1)). */
struct bt_tensor *bt_kv_k(const struct bt_kv *kv, int il);
struct bt_tensor *bt_kv_v(const struct bt_kv *kv, int il); /* NULL with v_in_k */
/* Bytes of cache memory. */
size_t bt_kv_bytes(const struct bt_kv *kv);

/* Free every cell. */
void bt_kv_clear(struct bt_kv *kv);
/* Free the cells of sequence seq; returns how many. */
int64_t bt_kv_seq_rm(struct bt_kv *kv, int32_t seq);
/* Free the cells of sequence seq at positions >= p0 (p0 0: every one, as
 * bt_kv_seq_rm), in the sliding layers' cells too; returns how many.  The
 * positions below p0 stay in their cells, so the next token of seq lands
 * where it would have had the sequence never gone past p0 - 1. */
int64_t bt_kv_seq_trim(struct bt_kv *kv, int32_t seq, int32_t p0);
/* Whether sequence seq's first n positions can be kept for new tokens from
 * position n on (after bt_kv_seq_trim(kv, seq, n)) with the cells they read
 * exactly those of a run that stopped at n - 1: seq holds positions 0 ..
 * n - 1, and with a ring none of the positions the window of n sees (n -
 * n_swa + 1 .. n - 1) was overwritten by a later one (at most W - n_swa
 * positions past them).  n 0: true. */
bool bt_kv_seq_reusable(const struct bt_kv *kv, int32_t seq, int32_t n);
/* Copy sequence src's positions 0 .. n - 1 into sequence dst: each cell (and
 * the sliding layers' ring cell) of src at the same offset of dst's region,
 * bookkeeping and every layer's K/V rows (read and written with bt_tensor_get
 * / set: the caller makes sure nothing computes into the cache meanwhile).
 * dst must hold no cells and src must hold those positions reusably
 * (bt_kv_seq_reusable); else BT_ERR_INVALID with one message, nothing
 * changed.  dst's next token then reads what it would have had it computed
 * the n tokens itself. */
enum bt_status bt_kv_seq_cp(struct bt_kv *kv, int32_t src, int32_t dst, int32_t n, char *err, size_t n_err);
/* Cells in use. */
int64_t bt_kv_n_used(const struct bt_kv *kv);
/* Position of the last token of seq in the cache, -1 when it has none. */
int32_t bt_kv_seq_pos_max(const struct bt_kv *kv, int32_t seq);

/* Place n tokens (seq[i], pos[i]): cells[i] gets the lowest free cell of
 * sequence seq[i]'s region (cells [s*per, (s+1)*per), per =
 * bt_kv_seq_cells) above that sequence's highest cell, and the cell is
 * marked; in the sliding layers' cells, bt_kv_swa_cells.  Errors (nothing
 * placed): a sequence id out of [0, n_seq_max), a negative position, a (seq,
 * pos) already in the cache or twice in the batch, no free cells left, a
 * sequence whose region is used up; with a ring, a position so far behind
 * its sequence's highest one that cells it would see are overwritten
 * (p < highest - (W - n_swa)). */
enum bt_status bt_kv_place(struct bt_kv *kv, int64_t n, const int32_t *seq, const int32_t *pos,
                           int32_t *cells, char *err, size_t n_err);
/* Cells each sequence may use: n_ctx / n_seq_max. */
int64_t bt_kv_seq_cells(const struct bt_kv *kv);
/* Cells the attention must read: one past the highest used cell, rounded up
 * to BT_KV_PAD, at most n_ctx (0 when empty). */
int64_t bt_kv_n_active(const struct bt_kv *kv);
/* mask[j + n_kv*t] (F32 [n_kv, n]) = 0 when cell j holds seq[t] at a position
 * <= pos[t], else -INFINITY. */
void bt_kv_mask(const struct bt_kv *kv, int64_t n_kv, int64_t n, const int32_t *seq, const int32_t *pos,
                float *mask);

/* ---- the sliding layers' cells (a cache with n_swa > 0) ---- */
/* Whether the cache has sliding layers. */
bool bt_kv_has_swa(const struct bt_kv *kv);
/* The sliding layers' cells of the tokens of the last bt_kv_place (in its
 * order; its n entries). */
const int32_t *bt_kv_swa_cells(const struct bt_kv *kv);
/* Cells the sliding layers' attention reads when the others read n_kv: the
 * same n_kv without a ring, the whole ring (n_seq_max * W) with one. */
int64_t bt_kv_swa_n_kv(const struct bt_kv *kv, int64_t n_kv);
/* mask[j + n_kv_swa*t] = 0 when sliding cell j holds seq[t] at a position p'
 * with pos[t] - n_swa < p' <= pos[t], else -INFINITY. */
void bt_kv_mask_swa(const struct bt_kv *kv, int64_t n_kv_swa, int64_t n, const int32_t *seq, const int32_t *pos,
                    float *mask);

#ifdef __cplusplus
}
#endif
#endif
