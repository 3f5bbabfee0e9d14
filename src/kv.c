/* kv.c - the KV cache: cache tensors in one host buffer, cell bookkeeping,
 * placement of a ubatch and its attention masks (the sliding layers' ring
 * beside the others' cells).  See kv.h. */
#include "kv.h"
#include "mem.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct bt_kv {
    struct bt_kv_config cfg;
    bt_context *ctx; /* no_alloc: the tensor structs */
    bt_buffer_t buf;
    struct bt_tensor **k, **v; /* indexed il - il0 */
    int32_t *pos, *seq;        /* per cell; pos -1 = free */
    int64_t n_used;
    /* the sliding layers' cells: ring W cells per sequence (ring), or n_ctx
     * placed as the others' (!ring) */
    bool swa, ring;
    int64_t swa_w, n_ctx_swa;
    int32_t *swa_pos, *swa_seq; /* per sliding cell; pos -1 = free */
    int32_t *swa_cells;         /* [n_ctx]: the last placement's */
};

/* W: a sequence's ring, or 0 when the sliding layers need none */
static int64_t ring_cells(const struct bt_kv_config *c) {
    if (c->n_swa <= 0 || c->n_ubatch <= 0) return 0;
    const int64_t w = (c->n_swa + c->n_ubatch + BT_KV_PAD - 1) / BT_KV_PAD * BT_KV_PAD;
    return w < c->n_ctx / c->n_seq_max ? w : 0;
}

int64_t bt_kv_config_layer_cells(const struct bt_kv_config *c, int il) {
    const int64_t w = ring_cells(c);
    return w > 0 && bt_kv_swa_layer(c->n_swa, c->swa_pattern, il) ? w * c->n_seq_max : c->n_ctx;
}

#define MAX_CTX (1 << 24)

enum bt_status bt_kv_check_config(const struct bt_kv_config *c, char *err, size_t n_err) {
    if (c->n_ctx <= 0 || c->n_ctx > MAX_CTX)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "KV cache: context size %lld out of [1, %d]",
                               (long long)c->n_ctx, MAX_CTX);
    if (c->n_seq_max <= 0 || c->n_seq_max > c->n_ctx)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "KV cache: %d sequences do not fit %lld cells", c->n_seq_max,
                               (long long)c->n_ctx);
    if (c->type != BT_TYPE_F16 && c->type != BT_TYPE_F32 && c->type != BT_TYPE_Q8_0)
        return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED, "KV cache: type %s not supported (f16, f32, q8_0)",
                               (int)c->type >= 0 && c->type < BT_TYPE_COUNT ? bt_type_name(c->type) : "?");
    if (c->il0 < 0 || c->il1 < c->il0)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "KV cache: bad layer range [%d, %d)", c->il0, c->il1);
    if (c->head_dim_k <= 0 || c->head_dim_v <= 0 || c->n_embd_k % c->head_dim_k || c->n_embd_v % c->head_dim_v)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "KV cache: rows of %lld/%lld are not whole heads of %lld/%lld", (long long)c->n_embd_k,
                               (long long)c->n_embd_v, (long long)c->head_dim_k, (long long)c->head_dim_v);
    if (c->v_in_k && (c->n_embd_k != c->head_dim_k || c->n_embd_v != c->head_dim_v || c->n_embd_v > c->n_embd_k))
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "KV cache: V inside K needs one head and V rows no longer than K's (%lld, %lld)",
                               (long long)c->n_embd_k, (long long)c->n_embd_v);
    const int64_t blk = bt_blck_size(c->type);
    if (c->head_dim_k % blk || c->head_dim_v % blk)
        return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED,
                               "KV cache: type %s needs head sizes that are multiples of %lld, got %lld and %lld",
                               bt_type_name(c->type), (long long)blk, (long long)c->head_dim_k,
                               (long long)c->head_dim_v);
    if (c->n_swa < 0 || c->n_swa > MAX_CTX || c->n_ubatch < 0 || c->n_ubatch > c->n_ctx)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "KV cache: sliding window %lld or ubatch %lld out of range",
                               (long long)c->n_swa, (long long)c->n_ubatch);

    return BT_OK;
}

size_t bt_kv_config_row_bytes(const struct bt_kv_config *c) {
    return bt_row_size(c->type, c->n_embd_k) + (c->v_in_k ? 0 : bt_row_size(c->type, c->n_embd_v));
}

enum bt_status bt_kv_new(const struct bt_kv_config *c, struct bt_kv **out, char *err, size_t n_err) {
    *out = NULL;
    const enum bt_status st = bt_kv_check_config(c, err, n_err);
    if (st != BT_OK) return st;
    struct bt_kv *kv = calloc(1, sizeof *kv);
    const int nl = c->il1 - c->il0;
    if (!kv) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "KV cache: out of memory");
    kv->cfg = *c;
    kv->k = calloc((size_t)nl + 1, sizeof *kv->k);
    kv->v = calloc((size_t)nl + 1, sizeof *kv->v);
    kv->pos = malloc((size_t)c->n_ctx * sizeof *kv->pos);
    kv->seq = malloc((size_t)c->n_ctx * sizeof *kv->seq);
    kv->swa = c->n_swa > 0;
    kv->swa_w = ring_cells(c);
    kv->ring = kv->swa_w > 0;
    kv->n_ctx_swa = kv->ring ? kv->swa_w * c->n_seq_max : c->n_ctx;
    kv->swa_pos = malloc((size_t)kv->n_ctx_swa * sizeof *kv->swa_pos);
    kv->swa_seq = malloc((size_t)kv->n_ctx_swa * sizeof *kv->swa_seq);
    kv->swa_cells = calloc((size_t)c->n_ctx, sizeof *kv->swa_cells);
    struct bt_init_params ip = {(size_t)(2 * nl + 1) * bt_tensor_overhead() + 1024, NULL, true};
    kv->ctx = bt_init(ip);
    if (!kv->k || !kv->v || !kv->pos || !kv->seq || !kv->swa_pos || !kv->swa_seq || !kv->swa_cells || !kv->ctx) {
        bt_kv_free(kv);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "KV cache: out of memory");
    }
    size_t bytes = 0;
    for (int il = c->il0; il < c->il1; il++) {
        const int64_t cells = bt_kv_config_layer_cells(c, il);
        struct bt_tensor *k = bt_new_tensor_2d(kv->ctx, c->type, c->n_embd_k, cells);
        struct bt_tensor *v = c->v_in_k ? NULL : bt_new_tensor_2d(kv->ctx, c->type, c->n_embd_v, cells);
        bytes += bt_kv_config_row_bytes(c) * (size_t)cells;
        if (!k || (!v && !c->v_in_k)) {
            bt_kv_free(kv);
            return bt_error_printf(err, n_err, BT_ERR_NOMEM, "KV cache: out of memory");
        }
        bt_format_name(k, "cache_k_l%d", il);
        if (v) bt_format_name(v, "cache_v_l%d", il);
        kv->k[il - c->il0] = k;
        kv->v[il - c->il0] = v;
    }
    if (nl > 0 && !c->no_memory) {
        kv->buf = bt_alloc_ctx_tensors_from_buft(kv->ctx, c->buft ? c->buft : bt_cpu_buffer_type());
        if (!kv->buf) {
            bt_kv_free(kv);
            return bt_error_printf(err, n_err, BT_ERR_NOMEM,
                                   "KV cache: cannot allocate %zu bytes (%lld cells, %d layers, %s)", bytes,
                                   (long long)c->n_ctx, nl, bt_type_name(c->type));
        }
        bt_buffer_clear(kv->buf, 0);
    }
    bt_kv_clear(kv);
    *out = kv;
    return BT_OK;
}

void bt_kv_free(struct bt_kv *kv) {
    if (!kv) return;
    bt_buffer_free(kv->buf);
    bt_free(kv->ctx);
    BT_FREE_ALL(kv->k, kv->v, kv->pos, kv->seq, kv->swa_pos, kv->swa_seq, kv->swa_cells, kv);
}

const struct bt_kv_config *bt_kv_get_config(const struct bt_kv *kv) { return &kv->cfg; }

struct bt_tensor *bt_kv_k(const struct bt_kv *kv, int il) {
    BT_ASSERT(il >= kv->cfg.il0 && il < kv->cfg.il1);
    return kv->k[il - kv->cfg.il0];
}
struct bt_tensor *bt_kv_v(const struct bt_kv *kv, int il) {
    BT_ASSERT(il >= kv->cfg.il0 && il < kv->cfg.il1);
    return kv->v[il - kv->cfg.il0];
}
size_t bt_kv_bytes(const struct bt_kv *kv) { return kv->buf ? bt_buffer_get_size(kv->buf) : 0; }

void bt_kv_clear(struct bt_kv *kv) {
    for (int64_t j = 0; j < kv->cfg.n_ctx; j++) {
        kv->pos[j] = -1;
        kv->seq[j] = -1;
    }
    for (int64_t j = 0; j < kv->n_ctx_swa; j++) {
        kv->swa_pos[j] = -1;
        kv->swa_seq[j] = -1;
    }
    kv->n_used = 0;
}

int64_t bt_kv_seq_rm(struct bt_kv *kv, int32_t seq) { return bt_kv_seq_trim(kv, seq, 0); }

int64_t bt_kv_seq_trim(struct bt_kv *kv, int32_t seq, int32_t p0) {
    int64_t n = 0;
    for (int64_t j = 0; j < kv->cfg.n_ctx; j++) {
        if (kv->pos[j] >= p0 && kv->seq[j] == seq) {
            kv->pos[j] = -1;
            kv->seq[j] = -1;
            n++;
        }
    }
    for (int64_t j = 0; j < kv->n_ctx_swa; j++) {
        if (kv->swa_pos[j] >= p0 && kv->swa_seq[j] == seq) {
            kv->swa_pos[j] = -1;
            kv->swa_seq[j] = -1;
        }
    }
    kv->n_used -= n;
    return n;
}

bool bt_kv_seq_reusable(const struct bt_kv *kv, int32_t seq, int32_t n) {
    if (n <= 0) return true;
    if (seq < 0 || seq >= kv->cfg.n_seq_max || n > bt_kv_seq_cells(kv)) return false;
    /* positions 0 .. n - 1 in the region (each at most once: count them) */
    const int64_t per = bt_kv_seq_cells(kv), r0 = (int64_t)seq * per;
    int64_t held = 0;
    int32_t top = -1;
    for (int64_t j = r0; j < r0 + per; j++) {
        if (kv->pos[j] < 0) continue;
        held += kv->pos[j] < n;
        if (kv->pos[j] > top) top = kv->pos[j];
    }
    if (held != n) return false;
    if (!kv->ring) return true;
    /* position q's ring cell went to q + W once the sequence reached it */
    const int64_t q0 = (int64_t)n - kv->cfg.n_swa + 1 > 0 ? (int64_t)n - kv->cfg.n_swa + 1 : 0;
    return q0 + kv->swa_w > top;
}

/* the K and V rows [j0, j0 + n) of every layer (ring layers: rings) to rows [k0, k0 + n) */
static void copy_rows(struct bt_kv *kv, bool ring_layers, int64_t j0, int64_t k0, int64_t n, void *buf) {
    for (int il = kv->cfg.il0; il < kv->cfg.il1; il++) {
        if ((kv->ring && bt_kv_swa_layer(kv->cfg.n_swa, kv->cfg.swa_pattern, il)) != ring_layers) continue;
        struct bt_tensor *t[2] = {kv->k[il - kv->cfg.il0], kv->v[il - kv->cfg.il0]};
        for (int i = 0; i < 2; i++) {
            /* no V with V inside K; a layer another rank holds (the runtime allocates the held ones) */
            if (!t[i] || !t[i]->data) continue;
            const size_t row = t[i]->nb[1];
            bt_tensor_get(t[i], buf, (size_t)j0 * row, (size_t)n * row);
            bt_tensor_set(t[i], buf, (size_t)k0 * row, (size_t)n * row);
        }
    }
}

enum bt_status bt_kv_seq_cp(struct bt_kv *kv, int32_t src, int32_t dst, int32_t n, char *err, size_t n_err) {
    const int64_t per = bt_kv_seq_cells(kv);
    if (src < 0 || dst < 0 || src >= kv->cfg.n_seq_max || dst >= kv->cfg.n_seq_max || src == dst)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "KV cache: copy of sequence %d into %d: a sequence id out of [0, %d)", src, dst,
                               kv->cfg.n_seq_max);
    if (n < 1 || n > per)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "KV cache: copy of sequence %d into %d: %d positions, out of [1, %lld]", src, dst, n,
                               (long long)per);
    int64_t held = 0;
    for (int64_t j = (int64_t)dst * per; j < (int64_t)(dst + 1) * per; j++) held += kv->pos[j] >= 0;
    if (held > 0)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "KV cache: copy of sequence %d into %d: sequence %d holds %lld cells", src, dst, dst,
                               (long long)held);
    if (!bt_kv_seq_reusable(kv, src, n))
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "KV cache: copy of sequence %d into %d: sequence %d does not hold positions 0 to %d",
                               src, dst, src, n - 1);
    /* the cells of positions < n: their span in src's region */
    int64_t top = -1;
    for (int64_t j = (int64_t)src * per; j < (int64_t)(src + 1) * per; j++) {
        if (kv->pos[j] >= 0 && kv->pos[j] < n) {
            kv->pos[j - (int64_t)src * per + (int64_t)dst * per] = kv->pos[j];
            kv->seq[j - (int64_t)src * per + (int64_t)dst * per] = dst;
            kv->n_used++;
            top = j - (int64_t)src * per;
        }
    }
    /* the sliding layers' cells: the ring's, or the others' */
    const int64_t sw = kv->ring ? kv->swa_w : per;
    for (int64_t j = 0; kv->swa && j < sw; j++) {
        const int64_t a = (int64_t)src * sw + j, b = (int64_t)dst * sw + j;
        if (kv->swa_pos[a] >= 0 && kv->swa_seq[a] == src && kv->swa_pos[a] < n) {
            kv->swa_pos[b] = kv->swa_pos[a];
            kv->swa_seq[b] = dst;
        }
    }
    /* the rows of the layers whose tensors have memory here: kv's own buffer,
     * or a runtime's that holds the cache like weights (model_dist.c) */
    size_t row = 0;
    for (int il = kv->cfg.il0; il < kv->cfg.il1; il++) {
        if (!kv->k[il - kv->cfg.il0]->data) continue;
        const struct bt_tensor *v = kv->v[il - kv->cfg.il0];
        const size_t rk = kv->k[il - kv->cfg.il0]->nb[1], rv = v ? v->nb[1] : 0;
        row = rk > row ? rk : row;
        row = rv > row ? rv : row;
    }
    const int64_t rows = kv->ring && sw > top + 1 ? sw : top + 1;
    if (row == 0) return BT_OK; /* no layers here: the bookkeeping alone */
    void *buf = malloc((size_t)rows * row);
    if (!buf) {
        bt_kv_seq_rm(kv, dst);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "KV cache: copy of sequence %d into %d: out of memory", src,
                               dst);
    }
    copy_rows(kv, false, (int64_t)src * per, (int64_t)dst * per, top + 1, buf);
    if (kv->ring) copy_rows(kv, true, (int64_t)src * kv->swa_w, (int64_t)dst * kv->swa_w, kv->swa_w, buf);
    free(buf);
    return BT_OK;
}

int64_t bt_kv_n_used(const struct bt_kv *kv) { return kv->n_used; }

int32_t bt_kv_seq_pos_max(const struct bt_kv *kv, int32_t seq) {
    int32_t m = -1;
    for (int64_t j = 0; j < kv->cfg.n_ctx; j++)
        if (kv->pos[j] >= 0 && kv->seq[j] == seq && kv->pos[j] > m) m = kv->pos[j];
    return m;
}

/* Each sequence has its own region of the cache, cells [s*per, (s+1)*per)
 * with per = n_ctx / n_seq_max (as llama.cpp's server splits its context
 * among slots), and a token goes to the lowest free cell of its region above
 * its sequence's highest cell: a sequence's cells are always in the order its
 * tokens came and at the same cells whatever else is in the cache, so the
 * attention (which walks cells in index order) computes the same bits for it
 * whatever ran before. */
enum bt_status bt_kv_place(struct bt_kv *kv, int64_t n, const int32_t *seq, const int32_t *pos,
                           int32_t *cells, char *err, size_t n_err) {
    const int64_t C = kv->cfg.n_ctx, per = bt_kv_seq_cells(kv);
    for (int64_t i = 0; i < n; i++) {
        if (seq[i] < 0 || seq[i] >= kv->cfg.n_seq_max)
            return bt_error_printf(err, n_err, BT_ERR_INVALID, "token %lld: sequence id %d out of [0, %d)",
                                   (long long)i, seq[i], kv->cfg.n_seq_max);
        if (pos[i] < 0)
            return bt_error_printf(err, n_err, BT_ERR_INVALID, "token %lld: negative position %d", (long long)i,
                                   pos[i]);
        for (int64_t i2 = 0; i2 < i; i2++)
            if (seq[i2] == seq[i] && pos[i2] == pos[i])
                return bt_error_printf(err, n_err, BT_ERR_INVALID, "tokens %lld and %lld: both sequence %d position %d",
                                       (long long)i2, (long long)i, seq[i], pos[i]);
    }
    if (n > C - kv->n_used)
        return bt_error_printf(err, n_err, BT_ERR_CAPACITY, "KV cache full: %lld tokens, %lld of %lld cells free",
                               (long long)n, (long long)(C - kv->n_used), (long long)C);
    for (int64_t i = 0; i < n; i++) {
        const int64_t r0 = (int64_t)seq[i] * per, r1 = r0 + per;
        for (int64_t j = r0; j < r1; j++)
            if (kv->pos[j] >= 0 && kv->seq[j] == seq[i] && kv->pos[j] == pos[i])
                return bt_error_printf(err, n_err, BT_ERR_INVALID, "token %lld: sequence %d already has position %d",
                                       (long long)i, seq[i], pos[i]);
    }
    if (kv->ring) {
        /* a token at p sees p - n_swa < p' <= p; the ring has overwritten
         * positions up to its sequence's highest minus W, so p must not be
         * more than W - n_swa behind the highest (in the cache or the batch) */
        int32_t *tops = kv->swa_cells; /* scratch here: each token's sequence's highest position */
        for (int64_t i = 0; i < n; i++) {
            int64_t first = 0;
            while (seq[first] != seq[i]) first++;
            if (first == i) {
                tops[i] = bt_kv_seq_pos_max(kv, seq[i]);
                for (int64_t i2 = i; i2 < n; i2++)
                    if (seq[i2] == seq[i] && pos[i2] > tops[i]) tops[i] = pos[i2];
            }
            const int32_t top = tops[first];
            if ((int64_t)pos[i] < (int64_t)top - (kv->swa_w - kv->cfg.n_swa))
                return bt_error_printf(err, n_err, BT_ERR_INVALID,
                                       "token %lld: sequence %d position %d is more than %lld behind its position %d: "
                                       "the sliding window's ring of %lld cells no longer holds what it would see",
                                       (long long)i, seq[i], pos[i], (long long)(kv->swa_w - kv->cfg.n_swa), top,
                                       (long long)kv->swa_w);
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t r0 = (int64_t)seq[i] * per, r1 = r0 + per;
        int64_t c = r1;
        while (c > r0 && kv->pos[c - 1] < 0) c--; /* one past the sequence's highest cell */
        if (c >= r1) {
            /* undo this call's placements: nothing placed on error */
            for (int64_t k = 0; k < i; k++) {
                kv->pos[cells[k]] = -1;
                kv->seq[cells[k]] = -1;
                kv->n_used--;
            }
            return bt_error_printf(
                err, n_err, BT_ERR_CAPACITY,
                "token %lld: sequence %d has used its share of the KV cache (%lld of %lld cells for %d "
                "sequences)",
                (long long)i, seq[i], (long long)per, (long long)C, kv->cfg.n_seq_max);
        }
        kv->pos[c] = pos[i];
        kv->seq[c] = seq[i];
        kv->n_used++;
        cells[i] = (int32_t)c;
    }
    /* the sliding layers' cells: the ring's slot of the position (what it
     * held is out of every window now), or the cell the others use */
    for (int64_t i = 0; i < n; i++) {
        const int64_t c = kv->ring ? (int64_t)seq[i] * kv->swa_w + pos[i] % kv->swa_w : cells[i];
        kv->swa_pos[c] = pos[i];
        kv->swa_seq[c] = seq[i];
        kv->swa_cells[i] = (int32_t)c;
    }
    return BT_OK;
}

int64_t bt_kv_seq_cells(const struct bt_kv *kv) { return kv->cfg.n_ctx / kv->cfg.n_seq_max; }

int64_t bt_kv_n_active(const struct bt_kv *kv) {
    int64_t top = 0;
    for (int64_t j = kv->cfg.n_ctx - 1; j >= 0; j--)
        if (kv->pos[j] >= 0) {
            top = j + 1;
            break;
        }
    int64_t n = (top + BT_KV_PAD - 1) / BT_KV_PAD * BT_KV_PAD;
    return n < kv->cfg.n_ctx ? n : kv->cfg.n_ctx;
}

void bt_kv_mask(const struct bt_kv *kv, int64_t n_kv, int64_t n, const int32_t *seq, const int32_t *pos,
                float *mask) {
    BT_ASSERT(n_kv <= kv->cfg.n_ctx);
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < n_kv; j++)
            mask[j + n_kv * t] =
                (kv->pos[j] >= 0 && kv->seq[j] == seq[t] && kv->pos[j] <= pos[t]) ? 0.0f : -INFINITY;
}

bool bt_kv_has_swa(const struct bt_kv *kv) { return kv->swa; }

const int32_t *bt_kv_swa_cells(const struct bt_kv *kv) { return kv->swa_cells; }

int64_t bt_kv_swa_n_kv(const struct bt_kv *kv, int64_t n_kv) { return kv->ring ? kv->n_ctx_swa : n_kv; }

void bt_kv_mask_swa(const struct bt_kv *kv, int64_t n_kv_swa, int64_t n, const int32_t *seq, const int32_t *pos,
                    float *mask) {
    BT_ASSERT(kv->swa && n_kv_swa <= kv->n_ctx_swa);
    const int64_t w = kv->cfg.n_swa;
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < n_kv_swa; j++) {
            const int32_t p = kv->swa_pos[j];
            mask[j + n_kv_swa * t] = (p >= 0 && kv->swa_seq[j] == seq[t] && p <= pos[t] && (int64_t)pos[t] - p < w)
                                         ? 0.0f
                                         : -INFINITY;
        }
}
