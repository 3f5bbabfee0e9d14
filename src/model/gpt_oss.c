/* gpt_oss.c - the gpt-oss architecture (OpenAI's gpt-oss-20b / -120b, GGUF
 * general.architecture "gpt-oss"): its keys beyond the shared ones, its
 * tensors (llama.cpp's names and shapes) and its layer's graph, reached
 * through bt_arch_builder_of (arch_impl.h).
 *
 * Layer il, x [d, T]:
 *   cur = rms(x) * attn_norm
 *   q, k, v = Wq cur + bq, Wk cur + bk, Wv cur + bv   [hd, H, T], [hd, Hk, T]
 *   q, k = rope_neox_yarn(q), rope_neox_yarn(k)  (the file's base and YaRN on
 *                                                 every layer)
 *   a = FLASH_ATTN(q, cache_k, cache_v, mask, sinks, 1/sqrt(hd))
 *       (a sliding layer: its own cells and mask, the last n_swa positions)
 *   h = x + (Wo a + bo)
 *   cur = rms(h) * post_attention_norm
 *   l = Wr cur + br [E, T]; ids = top-k of l; w = softmax over the k of l[ids]
 *   e_k = down_k(swiglu_oai(gate_k cur + bg_k, up_k cur + bu_k)) + bd_k
 *   out = h + sum_k w_k e_k
 * where swiglu_oai(g, u) = min(g, 7) * sigmoid(1.702 min(g, 7)) *
 * (clamp(u, -7, 7) + 1) (SWIGLU_OAI).
 *
 * The experts' biases: a bias [n, E] is taken for each (slot, token) by
 * GET_ROWS with the routing's ids laid out as [K*T] (one CONT of the ids),
 * then added: ggml's ADD_ID as two ops that copy and add, element by
 * element, so a token's bits do not depend on its batch.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch_impl.h"
#include "ffn.h"

#define OAI_ALPHA 1.702f /* ggml's swiglu_oai, llama.cpp's LLM_FFN_SWIGLU_OAI_MOE */
#define OAI_LIMIT 7.0f

#define nm bt_layer_name /* ffn.h */

/* ---- hyperparameters ----------------------------------------------------------------- */

/* After the shared keys (llama.cpp's openai-moe loader): the window (required),
 * the pattern (default 2), the sliding layers' rope (the file's base unless
 * rope.freq_base_swa, the file's scaling); YaRN's parameters as llama.cpp's
 * context derives them from rope.scaling.* (beta_fast 32, beta_slow 1, the
 * original context length, attn_factor mscale / (1 + 0.1 ln factor) times
 * rope.scaling.attn_factor: ggml's rope multiplies by 1 + 0.1 ln factor
 * again). */
static enum bt_status oai_hparams(struct bt_gguf *g, const char *arch, struct bt_hparams *h, char *err,
                                  size_t n_err) {
    int64_t x;
    TRY(bt_arch_key_int(g, arch, "attention.sliding_window", -1, 1, 1 << 24, &h->n_swa, err, n_err));
    TRY(bt_arch_key_int(g, arch, "attention.sliding_window_pattern", 2, 0, 4096, &x, err, n_err));
    h->swa_pattern = (int)x;
    TRY(bt_arch_key_float(g, arch, "rope.freq_base_swa", h->rope_base, 1e-3, 1e12, &h->rope_base_swa, err, n_err));
    h->rope_freq_scale_swa = h->rope_freq_scale;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    struct bt_gguf_str s;
    const bool yarn = bt_gguf_find_key(g, key) >= 0 && bt_gguf_get_str(g, key, &s) == BT_OK && s.n == 4 &&
                      memcmp(s.data, "yarn", 4) == 0;
    if (!yarn) return BT_OK;
    const float factor = 1.0f / h->rope_freq_scale;
    float attn = factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
    attn *= 1.0f / (1.0f + 0.1f * logf(factor));
    float key_attn;
    TRY(bt_arch_key_float(g, arch, "rope.scaling.attn_factor", 1.0, 1e-6, 1e6, &key_attn, err, n_err));
    TRY(bt_arch_key_int(g, arch, "rope.scaling.original_context_length", h->n_ctx_train > 0 ? h->n_ctx_train : -1, 1,
                        INT32_MAX, &x, err, n_err));
    h->rope_yarn = (struct bt_rope_yarn){.ext_factor = 1.0f,
                                         .attn_factor = attn * key_attn,
                                         .beta_fast = 32.0f,
                                         .beta_slow = 1.0f,
                                         .n_ctx_orig = (int)x};
    return BT_OK;
}

/* ---- tensors ------------------------------------------------------------------------- */

#define L(field) offsetof(struct bt_llm_layer, field)
#define ADD(field, fmt, ne0, ne1, ne2, vector) \
    n = bt_arch_tensor_add(t, n, ly, L(field), il, fmt, ne0, ne1, ne2, true, vector)

static int oai_tensors(const struct bt_hparams *h, struct bt_llm_globals *gl, struct bt_llm_layer *layers,
                       struct bt_arch_tensor *t) {
    const int64_t d = h->n_embd, H = h->n_head, q = H * h->head_dim,
                  kd = h->n_head_kv * h->head_dim, vd = h->n_head_kv * h->head_dim_v, E = h->n_expert,
                  f = h->n_ff_exp;
    int n = bt_arch_global_tensors(h, gl, t);
    for (int il = 0; il < h->n_layer; il++) {
        struct bt_llm_layer *ly = &layers[il];
        ADD(attn_norm, "blk.%d.attn_norm.weight", d, 1, 1, true);
        ADD(wq, "blk.%d.attn_q.weight", d, q, 1, false);
        ADD(wk, "blk.%d.attn_k.weight", d, kd, 1, false);
        ADD(wv, "blk.%d.attn_v.weight", d, vd, 1, false);
        ADD(wo, "blk.%d.attn_output.weight", H * h->head_dim_v, d, 1, false);
        ADD(bq, "blk.%d.attn_q.bias", q, 1, 1, true);
        ADD(bk, "blk.%d.attn_k.bias", kd, 1, 1, true);
        ADD(bv, "blk.%d.attn_v.bias", vd, 1, 1, true);
        ADD(bo, "blk.%d.attn_output.bias", d, 1, 1, true);
        ADD(attn_sinks, "blk.%d.attn_sinks.weight", H, 1, 1, true);
        ADD(ffn_norm, "blk.%d.post_attention_norm.weight", d, 1, 1, true);
        ADD(ffn_gate_inp, "blk.%d.ffn_gate_inp.weight", d, E, 1, false);
        ADD(ffn_gate_inp_b, "blk.%d.ffn_gate_inp.bias", E, 1, 1, true);
        ADD(ffn_gate_exps, "blk.%d.ffn_gate_exps.weight", d, f, E, false);
        ADD(ffn_up_exps, "blk.%d.ffn_up_exps.weight", d, f, E, false);
        ADD(ffn_down_exps, "blk.%d.ffn_down_exps.weight", f, d, E, false);
        ADD(ffn_gate_exps_b, "blk.%d.ffn_gate_exps.bias", f, E, 1, true);
        ADD(ffn_up_exps_b, "blk.%d.ffn_up_exps.bias", f, E, 1, true);
        ADD(ffn_down_exps_b, "blk.%d.ffn_down_exps.bias", d, E, 1, true);
    }
    return n;
}

/* ---- the layer ----------------------------------------------------------------------- */

/* b [n, E] for each (slot, token) of ids_flat [K*T]: [n, K, T] */
static struct bt_tensor *expert_bias(bt_context *ctx, struct bt_tensor *b, struct bt_tensor *ids_flat, int64_t K,
                                     int64_t T, int il, const char *what) {
    char n[48];
    snprintf(n, sizeof n, "%s_rows", what);
    struct bt_tensor *r = nm(bt_get_rows(ctx, b, ids_flat), il, n); /* [n, K*T] */
    return r ? nm(bt_reshape_3d(ctx, r, b->ne[0], K, T), il, what) : NULL;
}

/* the routed experts with their biases and the clamped SwiGLU: cur [d, T] ->
 * [d, T] (weighted and summed over the K slots by MOE_SUM, as ffn.c's) */
static struct bt_tensor *oai_moe(bt_context *ctx, const struct bt_llm *m, const struct bt_llm_layer *ly,
                                 struct bt_tensor *cur, int il) {
    const int64_t E = m->hp.n_expert, K = m->hp.n_expert_used, d = cur->ne[0], T = cur->ne[1];
    struct bt_tensor *logits = nm(bt_mul_mat(ctx, ly->ffn_gate_inp, cur), il, "ffn_moe_logits"); /* [E, T] */
    logits = nm(bt_add(ctx, logits, ly->ffn_gate_inp_b), il, "ffn_moe_logits_biased");
    struct bt_tensor *ids = nm(bt_top_k(ctx, logits, (int)K), il, "ffn_moe_ids"); /* [K, T] */
    if (!ids) return NULL;
    nm(ids->src[0], il, "ffn_moe_argsort");
    struct bt_tensor *w = nm(bt_get_rows(ctx, nm(bt_reshape_3d(ctx, logits, 1, E, T), il, "ffn_moe_logits_3d"), ids),
                             il, "ffn_moe_weights_logits"); /* [1, K, T] */
    w = nm(bt_soft_max(ctx, nm(bt_reshape_2d(ctx, w, K, T), il, "ffn_moe_weights_2d")), il, "ffn_moe_weights");
    w = nm(bt_reshape_3d(ctx, w, 1, K, T), il, "ffn_moe_weights_3d");
    struct bt_tensor *ids_flat = nm(bt_reshape_1d(ctx, nm(bt_cont(ctx, ids), il, "ffn_moe_ids_cont"), K * T), il,
                                    "ffn_moe_ids_flat");
    struct bt_tensor *x3 = nm(bt_reshape_3d(ctx, cur, d, 1, T), il, "ffn_moe_in"); /* [d, 1, T] */
    struct bt_tensor *up = nm(bt_mul_mat_id(ctx, ly->ffn_up_exps, x3, ids), il, "ffn_moe_up"); /* [f, K, T] */
    up = nm(bt_add(ctx, up, expert_bias(ctx, ly->ffn_up_exps_b, ids_flat, K, T, il, "ffn_moe_up_b")), il,
            "ffn_moe_up_biased");
    struct bt_tensor *gate = nm(bt_mul_mat_id(ctx, ly->ffn_gate_exps, x3, ids), il, "ffn_moe_gate");
    gate = nm(bt_add(ctx, gate, expert_bias(ctx, ly->ffn_gate_exps_b, ids_flat, K, T, il, "ffn_moe_gate_b")), il,
              "ffn_moe_gate_biased");
    struct bt_tensor *act = nm(bt_swiglu_oai(ctx, gate, up, OAI_ALPHA, OAI_LIMIT), il, "ffn_moe_swiglu_oai");
    struct bt_tensor *dn = nm(bt_mul_mat_id(ctx, ly->ffn_down_exps, act, ids), il, "ffn_moe_down"); /* [d, K, T] */
    dn = nm(bt_add(ctx, dn, expert_bias(ctx, ly->ffn_down_exps_b, ids_flat, K, T, il, "ffn_moe_down_b")), il,
            "ffn_moe_down_biased");
    return nm(bt_moe_sum(ctx, dn, w), il, "ffn_moe_out");
}

/* q, k, v of one ubatch into the cache and the attention over it: [hd_v * H, T] */
static struct bt_tensor *oai_attn(bt_context *ctx, const struct bt_llm *m, struct bt_kv *kv,
                                  const struct bt_llm_layer *ly, struct bt_tensor *cur, int il,
                                  const struct bt_llm_graph *gi) {
    const struct bt_hparams *h = &m->hp;
    const int64_t T = cur->ne[1], H = h->n_head, Hk = h->n_head_kv, hd = h->head_dim, hdv = h->head_dim_v;
    struct bt_tensor *q = nm(bt_add(ctx, nm(bt_mul_mat(ctx, ly->wq, cur), il, "q"), ly->bq), il, "q_bias");
    struct bt_tensor *k = nm(bt_add(ctx, nm(bt_mul_mat(ctx, ly->wk, cur), il, "k"), ly->bk), il, "k_bias");
    struct bt_tensor *v = nm(bt_add(ctx, nm(bt_mul_mat(ctx, ly->wv, cur), il, "v"), ly->bv), il, "v_bias");
    q = nm(bt_reshape_3d(ctx, q, hd, H, T), il, "q_heads");
    k = nm(bt_reshape_3d(ctx, k, hd, Hk, T), il, "k_heads");
    const bool swa = bt_kv_swa_layer(h->n_swa, h->swa_pattern, il);
    const float base = swa ? h->rope_base_swa : h->rope_base;
    const float fscale = swa ? h->rope_freq_scale_swa : h->rope_freq_scale;
    const struct bt_rope_yarn *y = h->rope_yarn.ext_factor != 0.0f ? &h->rope_yarn : NULL;
    q = nm(bt_rope_ext(ctx, q, gi->pos, h->n_rot, BT_ROPE_NEOX, base, fscale, y), il, "q_rope");
    k = nm(bt_rope_ext(ctx, k, gi->pos, h->n_rot, BT_ROPE_NEOX, base, fscale, y), il, "k_rope");
    struct bt_tensor *cells = swa ? gi->cells_swa : gi->cells, *mask = swa ? gi->mask_swa : gi->mask;
    const int64_t n_kv = swa ? gi->n_kv_swa : gi->n_kv;
    k = nm(bt_reshape_2d(ctx, k, hd * Hk, T), il, "k_rows");
    v = nm(bt_reshape_2d(ctx, v, hdv * Hk, T), il, "v_rows");
    struct bt_tensor *kc = NULL, *vc = NULL;
    if (k && v) bt_llm_cache_rw(ctx, kv, il, k, v, cells, n_kv, Hk, &kc, &vc);
    if (!kc || !vc) return NULL;
    struct bt_tensor *a = nm(bt_flash_attn_ext(ctx, q, kc, vc, mask, ly->attn_sinks, h->attn_scale), il, "attn");
    return nm(bt_reshape_2d(ctx, a, hdv * H, T), il, "attn_merged");
}

static struct bt_tensor *oai_layer(bt_context *ctx, const struct bt_llm *m, struct bt_kv *kv, struct bt_tensor *x,
                                   int il, const struct bt_llm_graph *gi) {
    const struct bt_hparams *h = &m->hp;
    const struct bt_llm_layer *ly = &m->layers[il];
    struct bt_tensor *cur = bt_layer_rms_norm(ctx, x, ly->attn_norm, h->norm_eps, il, "attn");
    struct bt_tensor *a = cur ? oai_attn(ctx, m, kv, ly, cur, il, gi) : NULL;
    a = nm(bt_mul_mat(ctx, ly->wo, a), il, "attn_out");
    a = nm(bt_add(ctx, a, ly->bo), il, "attn_out_biased");
    struct bt_tensor *hres = nm(bt_add(ctx, x, a), il, "attn_residual");
    cur = bt_layer_rms_norm(ctx, hres, ly->ffn_norm, h->norm_eps, il, "ffn");
    struct bt_tensor *f = cur ? oai_moe(ctx, m, ly, cur, il) : NULL;
    return nm(bt_add(ctx, hres, f), il, "out");
}

const struct bt_arch_builder bt_gpt_oss_builder = {
    /* .yarn    = */ true,
    /* .hparams = */ oai_hparams,
    /* .tensors = */ oai_tensors,
    /* .layer   = */ oai_layer,
};
