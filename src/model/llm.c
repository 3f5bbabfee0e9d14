/* llm.c - the forward graph of a llama-family model (arch.h) for one ubatch
 * over a KV cache, and a one-process context that cuts batches into ubatches,
 * places them in the cache, reuses one graph per ubatch shape and returns the
 * logits of the rows that need them.
 *
 * Layer il, x [d, T] (pre-norm):
 *   cur = rms(x) * attn_norm
 *   q, k, v = Wq cur (+ bq), Wk cur (+ bk), Wv cur (+ bv)
 *   (olmoe: q, k = rms(q) * q_norm, rms(k) * k_norm over the whole vector)
 *   q [hd, H, T], k [hd, Hk, T], v [hd_v, Hk, T]
 *   (qwen3, qwen3moe: q, k = rms(q) * q_norm, rms(k) * k_norm per head)
 *   q, k = rope(q), rope(k)                  NORMAL or NEOX, n_rot dims
 *   cache_k[:, cells] = k; cache_v[:, cells] = v       (SET_ROWS)
 *   a = FLASH_ATTN(q, cache_k[:, :n_kv], cache_v[:, :n_kv], mask, 1/sqrt(hd))
 *   h = x + Wo a
 *   cur = rms(h) * ffn_norm
 *   out = h + ffn(cur)   dense SwiGLU (model.c's MLP block), or MoE:
 *     p = softmax(router cur) [E, T]; ids = top-k of p; w = p[ids]
 *     (renormalised over the k when the architecture says so);
 *     sum_k w_k expert_ids_k(cur) (model.c's expert block)
 *     (+ sigmoid(shexp_gate . cur) * shared MLP(cur) for qwen2moe)
 * The attention reads the cache through views of the SET_ROWS results, so
 * the writes come before the reads in the graph's order.
 *
 * deepseek2 (arch.h): the latent attention's absorbed form (attn_mla: one
 * KV head of the latent and the shared rope key, q's unroped part through
 * attn_k_b, the heads' outputs through attn_v_b), dense or MoE layers by
 * leading_dense_block_count, sigmoid or softmax gating with a selection
 * bias, the weights scaled, ungated shared experts.
 *
 * gemma3 (arch.h) differs: x = embd * sqrt(d) on the first range; a sliding
 * layer writes and reads its own cells (the ring, kv.h) with its own mask and
 * rope base; the attention scale is the file's; the attention's output and
 * the FFN's (gelu(gate) * up) are RMS-normed before their residual adds:
 *   h = x + rms(Wo a) * post_attention_norm
 *   out = h + rms(ffn(rms(h) * ffn_norm)) * post_ffw_norm
 *
 * glm4moe (glm4moe.c: its keys and tensors) is built here: q/k/v biases,
 * per-head q/k norms where the file has them, the rope over the first n_rot
 * of each head, post_attention_norm as the FFN's norm, deepseek2's routing
 * (sigmoid, selection bias, renormalised, scaled) and ungated shared experts.
 *
 * minimax-m2 (minimax_m2.c: its keys and tensors) is built here too: olmoe's
 * q/k norms over the whole of q and k, the rope over the first n_rot of each
 * head, every layer MoE with deepseek2's routing (sigmoid, selection bias,
 * renormalised, unscaled) and no shared expert.
 *
 * An architecture with a builder of its own (arch_impl.h's
 * bt_arch_builder_of: gpt-oss, gpt_oss.c) builds its layers there, on the
 * same inputs, cache and head.
 */
#include <math.h>
#include <string.h>

#include "baton/alloc.h"
#include "baton/sched.h"
#include "baton/backend-reg.h"
#include "../mem.h"
#include "arch_impl.h"
#include "ffn.h"

#define nm bt_layer_name /* ffn.h */

static struct bt_tensor *add_bias(bt_context *ctx, struct bt_tensor *x, struct bt_tensor *b, int il,
                                  const char *what) {
    return b ? nm(bt_add(ctx, x, b), il, what) : x;
}

/* The top K of sel [E, T] among the experts of the n_group_used groups (of
 * np = E / n_group consecutive experts) whose two best scores add up
 * highest (llama.cpp's build_moe_ffn; the other groups' experts masked to
 * -inf there, left out here): ids I32 [K, T].  The expert ids of the chosen
 * groups come from an index table, the stable ARGSORT of sel - sel (all
 * zero: 0 .. E-1 in each column), taken by GET_ROWS as the scores are. */
static struct bt_tensor *group_topk(bt_context *ctx, const struct bt_hparams *h, struct bt_tensor *sel, int il) {
    const int64_t E = h->n_expert, K = h->n_expert_used, G = h->n_group, gu = h->n_group_used, np = E / G;
    const int64_t T = sel->ne[1];
    struct bt_tensor *s3 = nm(bt_reshape_3d(ctx, sel, np, G, T), il, "ffn_moe_groups");        /* [np, G, T] */
    struct bt_tensor *t2 = nm(bt_top_k(ctx, s3, 2), il, "ffn_moe_group_top2");                /* [2, G, T] */
    struct bt_tensor *v2 = nm(bt_get_rows(ctx, bt_reshape_4d(ctx, s3, 1, np, G, T), t2), il, "ffn_moe_group_top2_v");
    struct bt_tensor *gs = nm(bt_sum_rows(ctx, bt_reshape_3d(ctx, v2, 2, G, T)), il, "ffn_moe_group_scores");
    struct bt_tensor *gid = nm(bt_top_k(ctx, bt_reshape_2d(ctx, gs, G, T), (int)gu), il, "ffn_moe_group_topk");
    struct bt_tensor *idx = nm(bt_argsort(ctx, bt_sub(ctx, sel, sel), BT_SORT_ASC), il, "ffn_moe_expert_index");
    struct bt_tensor *cid = nm(bt_get_rows(ctx, bt_reshape_3d(ctx, idx, np, G, T), gid), il, "ffn_moe_group_ids");
    struct bt_tensor *csc = nm(bt_get_rows(ctx, s3, gid), il, "ffn_moe_group_sel");           /* [np, gu, T] */
    struct bt_tensor *j = nm(bt_top_k(ctx, bt_reshape_2d(ctx, csc, np * gu, T), (int)K), il, "ffn_moe_group_j");
    struct bt_tensor *id = nm(bt_get_rows(ctx, bt_reshape_3d(ctx, cid, 1, np * gu, T), j), il, "ffn_moe_ids_3d");
    return nm(bt_reshape_2d(ctx, id, K, T), il, "ffn_moe_ids"); /* [K, T] */
}

/* MoE routing as llama.cpp's build_moe_ffn: p = softmax(router cur), or
 * sigmoid (deepseek2's sigmoid gating); the experts chosen by p plus the
 * selection bias exp_probs_b where the layer has one, their weights taken
 * from p unbiased, renormalised over the k when the model says so, and
 * scaled by moe_w_scale: ids [K, T], weights [1, K, T].  (llama.cpp clamps
 * the renormalising sum to >= 2^-14; a sum of k probabilities that small
 * does not occur with softmax or sigmoid gating in float.) */
static void moe_route(bt_context *ctx, const struct bt_llm *m, const struct bt_llm_layer *ly, struct bt_tensor *cur,
                      int il, struct bt_tensor **ids, struct bt_tensor **w) {
    const int64_t E = m->hp.n_expert, K = m->hp.n_expert_used, T = cur->ne[1];
    struct bt_tensor *logits = nm(bt_mul_mat(ctx, ly->ffn_gate_inp, cur), il, "ffn_moe_logits"); /* [E, T] */
    struct bt_tensor *probs = m->hp.moe_sigmoid ? bt_sigmoid(ctx, logits) : bt_soft_max(ctx, logits);
    nm(probs, il, "ffn_moe_probs");
    struct bt_tensor *sel = probs;
    if (ly->ffn_exp_probs_b) sel = nm(bt_add(ctx, probs, ly->ffn_exp_probs_b), il, "ffn_moe_probs_biased");
    struct bt_tensor *id;
    if (m->hp.n_group > 1) {
        id = group_topk(ctx, &m->hp, sel, il);
    } else {
        id = nm(bt_top_k(ctx, sel, (int)K), il, "ffn_moe_ids"); /* [K, T] */
        if (id) nm(id->src[0], il, "ffn_moe_argsort");
    }
    struct bt_tensor *p3 = nm(bt_reshape_3d(ctx, probs, 1, E, T), il, "ffn_moe_probs_3d");
    struct bt_tensor *wt = nm(bt_get_rows(ctx, p3, id), il, "ffn_moe_weights"); /* [1, K, T] */
    if (m->hp.moe_norm_w && wt) {
        struct bt_tensor *w2 = nm(bt_reshape_2d(ctx, wt, K, T), il, "ffn_moe_weights_2d");
        struct bt_tensor *s = nm(bt_sum_rows(ctx, w2), il, "ffn_moe_weights_sum"); /* [1, T] */
        w2 = nm(bt_div(ctx, w2, s), il, "ffn_moe_weights_norm");
        wt = nm(bt_reshape_3d(ctx, w2, 1, K, T), il, "ffn_moe_weights_norm_3d");
    }
    if (m->hp.moe_w_scale != 1.0f) wt = nm(bt_scale(ctx, wt, m->hp.moe_w_scale), il, "ffn_moe_weights_scaled");
    *ids = id;
    *w = wt;
}

/* The new K and V rows [kd, T], [vd, T] into layer il's cache at cells; the
 * views [kd/heads, heads, n_kv] and [vd/heads, heads, n_kv] of its first n_kv
 * cells that the attention reads (views of the SET_ROWS results, so that the
 * writes come first in the graph's order). */
void bt_llm_cache_rw(bt_context *ctx, struct bt_kv *kv, int il, struct bt_tensor *k, struct bt_tensor *v,
                     struct bt_tensor *cells, int64_t n_kv, int64_t heads, struct bt_tensor **kc,
                     struct bt_tensor **vc) {
    struct bt_tensor *ck = bt_kv_k(kv, il), *cv = bt_kv_v(kv, il);
    const int64_t hd = ck->ne[0] / heads, hdv = v->ne[0] / heads;
    struct bt_tensor *ks = nm(bt_set_rows(ctx, ck, k, cells), il, "cache_k_write");
    *kc = ks ? nm(bt_view_3d(ctx, ks, hd, heads, n_kv, bt_row_size(ck->type, hd), ck->nb[1], 0), il, "cache_k_view")
             : NULL;
    if (!cv) { /* V inside K (kv.h's v_in_k): its first hdv elements of each row */
        *vc = ks ? nm(bt_view_3d(ctx, ks, hdv, 1, n_kv, bt_row_size(ck->type, hdv), ck->nb[1], 0), il,
                      "cache_v_view")
                 : NULL;
        return;
    }
    struct bt_tensor *vs = nm(bt_set_rows(ctx, cv, v, cells), il, "cache_v_write");
    *vc = vs ? nm(bt_view_3d(ctx, vs, hdv, heads, n_kv, bt_row_size(cv->type, hdv), cv->nb[1], 0), il,
                  "cache_v_view")
             : NULL;
}

/* deepseek2's latent attention (arch.h), cur [d, T] -> [d, T] before the
 * residual add.  R latent, r rope, n = head_dim_mla - r, dv value lengths. */
static struct bt_tensor *attn_mla(bt_context *ctx, const struct bt_llm *m, struct bt_kv *kv, struct bt_tensor *cur,
                                  int il, const struct bt_llm_graph *gi) {
    const struct bt_hparams *h = &m->hp;
    const struct bt_llm_layer *ly = &m->layers[il];
    const int64_t T = cur->ne[1], H = h->n_head, R = h->n_lora_kv, r = h->n_rot, hk = h->head_dim_mla, n = hk - r;
    struct bt_tensor *q;
    if (ly->wq_a) {
        q = nm(bt_mul_mat(ctx, ly->wq_a, cur), il, "q_a"); /* [q_lora, T] */
        q = bt_layer_rms_norm(ctx, q, ly->q_a_norm, h->norm_eps, il, "q_a");
        q = nm(bt_mul_mat(ctx, ly->wq_b, q), il, "q"); /* [hk * H, T] */
    } else {
        q = nm(bt_mul_mat(ctx, ly->wq, cur), il, "q");
    }
    q = nm(bt_reshape_3d(ctx, q, hk, H, T), il, "q_heads");
    struct bt_tensor *kvp = nm(bt_mul_mat(ctx, ly->wkv_a_mqa, cur), il, "kv_cmpr_pe"); /* [R + r, T] */
    if (!q || !kvp) return NULL;
    /* the latent c [R, T] normed, the shared rope key kr [r, 1, T] roped */
    struct bt_tensor *c = nm(bt_view_2d(ctx, kvp, R, T, kvp->nb[1], 0), il, "kv_cmpr");
    c = bt_layer_rms_norm(ctx, c, ly->kv_a_norm, h->norm_eps, il, "kv_cmpr");
    struct bt_tensor *kr = nm(bt_view_3d(ctx, kvp, r, 1, T, kvp->nb[1], kvp->nb[1], (size_t)R * kvp->nb[0]), il,
                              "k_pe");
    const struct bt_rope_yarn *yarn = h->rope_yarn.ext_factor != 0.0f ? &h->rope_yarn : NULL;
    kr = nm(bt_rope_ext(ctx, kr, gi->pos, (int)r, m->arch->rope_mode, h->rope_base, h->rope_freq_scale, yarn), il,
            "k_pe_rope");
    /* Q = [Wk_b^T q_nope ; rope(q_pe)] [R + r, H, T] */
    struct bt_tensor *qn = nm(bt_view_3d(ctx, q, n, H, T, q->nb[1], q->nb[2], 0), il, "q_nope");
    struct bt_tensor *qp = nm(bt_view_3d(ctx, q, r, H, T, q->nb[1], q->nb[2], (size_t)n * q->nb[0]), il, "q_pe");
    qp = nm(bt_rope_ext(ctx, qp, gi->pos, (int)r, m->arch->rope_mode, h->rope_base, h->rope_freq_scale, yarn), il,
            "q_pe_rope");
    qn = nm(bt_permute(ctx, qn, 0, 2, 1, 3), il, "q_nope_perm");                 /* [n, T, H] */
    struct bt_tensor *qa = nm(bt_mul_mat(ctx, ly->wk_b, qn), il, "q_nope_absorbed"); /* [R, T, H] */
    qa = nm(bt_permute(ctx, qa, 0, 2, 1, 3), il, "q_nope_absorbed_perm");         /* [R, H, T] */
    struct bt_tensor *Q = nm(bt_concat(ctx, qa, qp, 0), il, "q_mla");
    /* one KV head: K = [c ; kr] [R + r, T], V = c [R, T] */
    struct bt_tensor *K = nm(bt_concat(ctx, nm(bt_reshape_3d(ctx, c, R, 1, T), il, "kv_cmpr_3d"), kr, 0), il, "k_mla");
    K = nm(bt_reshape_2d(ctx, K, R + r, T), il, "k_rows");
    struct bt_tensor *kc = NULL, *vc = NULL;
    if (K && c) bt_llm_cache_rw(ctx, kv, il, K, c, gi->cells, gi->n_kv, 1, &kc, &vc);
    struct bt_tensor *a = nm(bt_flash_attn(ctx, Q, kc, vc, gi->mask, h->attn_scale), il, "attn"); /* [R, H, T] */
    /* per head h: o_h = attn_v_b[:, :, h] a_h, [dv, H, T] -> [dv * H, T] */
    a = nm(bt_permute(ctx, a, 0, 2, 1, 3), il, "attn_perm");          /* [R, T, H] */
    a = nm(bt_mul_mat(ctx, ly->wv_b, a), il, "attn_v_up");            /* [dv, T, H] */
    a = nm(bt_cont(ctx, bt_permute(ctx, a, 0, 2, 1, 3)), il, "attn_heads"); /* [dv, H, T] */
    a = nm(bt_reshape_2d(ctx, a, h->head_dim_v_mla * H, T), il, "attn_merged");
    return nm(bt_mul_mat(ctx, ly->wo, a), il, "attn_out");
}

/* The attention of the llama family (the file's header), cur [d, T] ->
 * [d, T] before the residual add (and gemma3's post-norm). */
static struct bt_tensor *attn_mha(bt_context *ctx, const struct bt_llm *m, struct bt_kv *kv, struct bt_tensor *cur,
                                  int il, const struct bt_llm_graph *gi) {
    const struct bt_hparams *h = &m->hp;
    const struct bt_llm_layer *ly = &m->layers[il];
    const int64_t T = cur->ne[1], H = h->n_head, Hk = h->n_head_kv, hd = h->head_dim, hdv = h->head_dim_v;
    struct bt_tensor *q = add_bias(ctx, nm(bt_mul_mat(ctx, ly->wq, cur), il, "q"), ly->bq, il, "q_bias");
    struct bt_tensor *k = add_bias(ctx, nm(bt_mul_mat(ctx, ly->wk, cur), il, "k"), ly->bk, il, "k_bias");
    struct bt_tensor *v = add_bias(ctx, nm(bt_mul_mat(ctx, ly->wv, cur), il, "v"), ly->bv, il, "v_bias");
    if (m->arch->qk_norm_full) {
        q = bt_layer_rms_norm(ctx, q, ly->q_norm, h->norm_eps, il, "q");
        k = bt_layer_rms_norm(ctx, k, ly->k_norm, h->norm_eps, il, "k");
    }
    q = nm(bt_reshape_3d(ctx, q, hd, H, T), il, "q_heads");
    k = nm(bt_reshape_3d(ctx, k, hd, Hk, T), il, "k_heads");
    if (!m->arch->qk_norm_full) { /* per head: qwen3's, gemma3's, glm4moe's where its file has them */
        if (ly->q_norm)
            q = bt_layer_rms_norm(ctx, q, ly->q_norm, h->norm_eps, il, "q");
        if (ly->k_norm)
            k = bt_layer_rms_norm(ctx, k, ly->k_norm, h->norm_eps, il, "k");
    }
    /* a sliding layer: its rope, its cells, its mask */
    const bool swa = bt_kv_swa_layer(h->n_swa, h->swa_pattern, il);
    const float base = swa ? h->rope_base_swa : h->rope_base;
    const float fscale = swa ? h->rope_freq_scale_swa : h->rope_freq_scale;
    struct bt_tensor *cells = swa ? gi->cells_swa : gi->cells, *mask = swa ? gi->mask_swa : gi->mask;
    const int64_t n_kv = swa ? gi->n_kv_swa : gi->n_kv;
    q = nm(bt_rope(ctx, q, gi->pos, h->n_rot, m->arch->rope_mode, base, fscale), il, "q_rope");
    k = nm(bt_rope(ctx, k, gi->pos, h->n_rot, m->arch->rope_mode, base, fscale), il, "k_rope");
    /* the new rows into the cache, the attention over its first n_kv cells */
    k = nm(bt_reshape_2d(ctx, k, hd * Hk, T), il, "k_rows");
    v = nm(bt_reshape_2d(ctx, v, hdv * Hk, T), il, "v_rows");
    struct bt_tensor *kc = NULL, *vc = NULL;
    if (k && v) bt_llm_cache_rw(ctx, kv, il, k, v, cells, n_kv, Hk, &kc, &vc);
    struct bt_tensor *a = nm(bt_flash_attn(ctx, q, kc, vc, mask, h->attn_scale), il, "attn");
    a = nm(bt_reshape_2d(ctx, a, hdv * H, T), il, "attn_merged");
    return nm(bt_mul_mat(ctx, ly->wo, a), il, "attn_out");
}

/* The feed-forward of layer il, cur [d, T] (normed) -> [d, T]. */
static struct bt_tensor *ffn(bt_context *ctx, const struct bt_llm *m, struct bt_tensor *cur, int il) {
    const struct bt_llm_layer *ly = &m->layers[il];
    if (!bt_hparams_layer_moe(&m->hp, il))
        return m->arch->gelu ? bt_ffn_mlp_gelu(ctx, cur, ly->ffn_gate, ly->ffn_up, ly->ffn_down, il, "ffn")
                             : bt_ffn_mlp(ctx, cur, ly->ffn_gate, ly->ffn_up, ly->ffn_down, il, "ffn");
    struct bt_tensor *ids = NULL, *w = NULL;
    if (cur) moe_route(ctx, m, ly, cur, il, &ids, &w);
    struct bt_tensor *f =
        bt_ffn_moe_experts(ctx, cur, ly->ffn_gate_exps, ly->ffn_up_exps, ly->ffn_down_exps, ids, w, il);
    if (!f || !ly->ffn_gate_shexp) return f;
    /* the shared experts: qwen2moe's gated by sigmoid(ffn_gate_inp_shexp . cur), deepseek2's not */
    struct bt_tensor *sh =
        bt_ffn_mlp(ctx, cur, ly->ffn_gate_shexp, ly->ffn_up_shexp, ly->ffn_down_shexp, il, "ffn_shexp");
    if (ly->ffn_gate_inp_shexp) {
        struct bt_tensor *gl = nm(bt_mul_mat(ctx, ly->ffn_gate_inp_shexp, cur), il, "ffn_shexp_gate_logit");
        struct bt_tensor *gs = nm(bt_sigmoid(ctx, gl), il, "ffn_shexp_gate"); /* [1, T] */
        sh = nm(bt_mul(ctx, sh, gs), il, "ffn_shexp_out");
    }
    return nm(bt_add(ctx, f, sh), il, "ffn_moe_shexp_out");
}

static struct bt_tensor *layer(bt_context *ctx, const struct bt_llm *m, struct bt_kv *kv, struct bt_tensor *x,
                               int il, const struct bt_llm_graph *gi) {
    const struct bt_hparams *h = &m->hp;
    const struct bt_llm_layer *ly = &m->layers[il];
    struct bt_tensor *cur = bt_layer_rms_norm(ctx, x, ly->attn_norm, h->norm_eps, il, "attn");
    struct bt_tensor *a = !cur           ? NULL
                          : m->arch->mla ? attn_mla(ctx, m, kv, cur, il, gi)
                                         : attn_mha(ctx, m, kv, cur, il, gi);
    if (m->arch->post_norm)
        a = bt_layer_rms_norm(ctx, a, ly->attn_post_norm, h->norm_eps, il, "attn_post");
    struct bt_tensor *hres = nm(bt_add(ctx, x, a), il, "attn_residual");

    cur = bt_layer_rms_norm(ctx, hres, ly->ffn_norm, h->norm_eps, il, "ffn");
    struct bt_tensor *f = ffn(ctx, m, cur, il);
    if (m->arch->post_norm)
        f = bt_layer_rms_norm(ctx, f, ly->ffn_post_norm, h->norm_eps, il, "ffn_post");
    return nm(bt_add(ctx, hres, f), il, "out");
}

static int graph_size(const struct bt_llm *m) {
    const int64_t per = 96 + 4 * m->hp.n_expert_used;
    return (int)(64 + (int64_t)(m->il1 - m->il0) * per);
}

size_t bt_llm_graph_ctx_size(const struct bt_llm *m) {
    const int n = graph_size(m);
    return (size_t)n * bt_tensor_overhead() + bt_graph_overhead(n) + 16 * BT_MEM_ALIGN;
}

enum bt_status bt_llm_build_graph(const struct bt_llm *m, struct bt_kv *kv, bt_context *ctx, int64_t n_tokens,
                                  int64_t n_kv, int64_t n_out, struct bt_llm_graph *out) {
    return bt_llm_build_graph_out(m, kv, ctx, n_tokens, n_kv, n_out, BT_LLM_OUT_LOGITS, out);
}

enum bt_status bt_llm_build_graph_out(const struct bt_llm *m, struct bt_kv *kv, bt_context *ctx, int64_t n_tokens,
                                      int64_t n_kv, int64_t n_out, enum bt_llm_out kind, struct bt_llm_graph *out) {
    memset(out, 0, sizeof *out);
    const struct bt_hparams *h = &m->hp;
    const bool first = m->il0 == 0, last = m->il1 == h->n_layer;
    const int64_t T = n_tokens;
    BT_ASSERT(T > 0 && n_kv > 0 && n_kv <= bt_kv_get_config(kv)->n_ctx && (!last || (n_out >= 0 && n_out <= T)));
    out->n_tokens = T;
    out->n_kv = n_kv;
    out->n_out = last ? n_out : 0;
    out->out_kind = last ? kind : BT_LLM_OUT_LOGITS;
    /* only the rows asked for reach the output projection: none, no projection */
    const bool head = last && n_out > 0;
    struct bt_tensor *x;
    if (first) {
        out->tokens = nm(bt_new_tensor_1d(ctx, BT_TYPE_I32, T), -1, "inp_tokens");
        if (out->tokens) bt_set_input(out->tokens);
        x = nm(bt_get_rows(ctx, m->gl.tok_embd, out->tokens), -1, "inp_embd");
        if (m->arch->embd_scale) x = nm(bt_scale(ctx, x, sqrtf((float)h->n_embd)), -1, "inp_scaled");
    } else {
        x = out->inp_x = nm(bt_new_tensor_2d(ctx, BT_TYPE_F32, h->n_embd, T), -1, "inp_x");
        if (x) bt_set_input(x);
    }
    out->pos = nm(bt_new_tensor_1d(ctx, BT_TYPE_I32, T), -1, "inp_pos");
    if (!out->pos) return BT_ERR_NOMEM;
    bt_set_input(out->pos);
    bool any_swa = false, any_full = false;
    for (int il = m->il0; il < m->il1; il++) {
        const bool swa = bt_kv_swa_layer(h->n_swa, h->swa_pattern, il);
        any_swa |= swa;
        any_full |= !swa;
    }
    /* the full layers' cells and mask (none when every layer slides: a file
     * of fewer layers than its pattern, or a stage of sliding layers only) */
    if (any_full) {
        out->cells = nm(bt_new_tensor_1d(ctx, BT_TYPE_I32, T), -1, "inp_kv_cells");
        out->mask = nm(bt_new_tensor_2d(ctx, BT_TYPE_F32, n_kv, T), -1, "inp_kq_mask");
        if (!out->cells || !out->mask) return BT_ERR_NOMEM;
        bt_set_input(out->cells);
        bt_set_input(out->mask);
    }
    if (any_swa) {
        BT_ASSERT(bt_kv_has_swa(kv));
        out->n_kv_swa = bt_kv_swa_n_kv(kv, n_kv);
        out->cells_swa = nm(bt_new_tensor_1d(ctx, BT_TYPE_I32, T), -1, "inp_kv_cells_swa");
        out->mask_swa = nm(bt_new_tensor_2d(ctx, BT_TYPE_F32, out->n_kv_swa, T), -1, "inp_kq_mask_swa");
        if (!out->cells_swa || !out->mask_swa) return BT_ERR_NOMEM;
        bt_set_input(out->cells_swa);
        bt_set_input(out->mask_swa);
    }
    const struct bt_arch_builder *own = bt_arch_builder_of(m->arch);
    for (int il = m->il0; il < m->il1 && x; il++)
        x = own && own->layer ? own->layer(ctx, m, kv, x, il, out) : layer(ctx, m, kv, x, il, out);
    if (head && x) {
        out->out_ids = nm(bt_new_tensor_1d(ctx, BT_TYPE_I32, n_out), -1, "inp_out_ids");
        if (out->out_ids) bt_set_input(out->out_ids);
        x = nm(bt_get_rows(ctx, x, out->out_ids), -1, "result_rows"); /* [d, n_out] */
        x = bt_layer_rms_norm(ctx, x, m->gl.output_norm, h->norm_eps, -1, "result");
        /* tied: the embedding (a described model has a tensor of its own for it) */
        if (kind == BT_LLM_OUT_LOGITS)
            x = nm(bt_mul_mat(ctx, m->gl.output ? m->gl.output : m->gl.tok_embd, x), -1, "result_output");
    }
    if (!x) return BT_ERR_NOMEM;
    bt_set_output(x);
    out->out = x;
    struct bt_graph *g = bt_graph_new(ctx, graph_size(m));
    if (!g) return BT_ERR_NOMEM;
    const enum bt_status st = bt_graph_build_forward_expand(g, x);
    if (st != BT_OK) return st;
    out->graph = g;
    return BT_OK;
}

void bt_hparams_kv_config(const struct bt_hparams *h, int il0, int il1, int64_t n_ctx, int n_seq_max, int64_t n_ubatch,
                          enum bt_type type, struct bt_kv_config *c) {
    memset(c, 0, sizeof *c);
    c->n_ctx = n_ctx;
    c->n_seq_max = n_seq_max;
    c->type = type;
    c->il0 = il0;
    c->il1 = il1;
    c->head_dim_k = h->head_dim;
    c->head_dim_v = h->head_dim_v;
    c->n_embd_k = h->head_dim * h->n_head_kv;
    c->n_embd_v = h->head_dim_v * h->n_head_kv;
    c->n_swa = h->n_swa;
    c->swa_pattern = h->swa_pattern;
    c->n_ubatch = n_ubatch;
    c->v_in_k = h->kv_v_in_k;
}

void bt_llm_kv_config(const struct bt_llm *m, int64_t n_ctx, int n_seq_max, int64_t n_ubatch, enum bt_type type,
                      struct bt_kv_config *c) {
    bt_hparams_kv_config(&m->hp, m->il0, m->il1, n_ctx, n_seq_max, n_ubatch, type, c);
}

/* ---- one stage ---------------------------------------------------------------------------- */

#define MAX_GRAPHS 8

/* One ubatch shape's graph and its scheduler: the splitter's plan (the
 * stage's backend, and beside a device backend that cannot run every op of
 * the range a CPU backend for those) and the memory it allocated, kept while
 * the shape repeats. */
struct graph_slot {
    bt_context *ctx;
    bt_sched_t sched;
    struct bt_llm_graph g;
    uint64_t last_use;
};

struct bt_llm_stage {
    const struct bt_llm *m;
    struct bt_kv *kv;
    /* in the scheduler's priority order: the stage's backend, then (beside
     * a device backend that needs it) the CPU, which runs what the device
     * cannot */
    bt_backend_t backends[2];
    int n_backends;
    bt_backend_t fallback; /* backends[1] when the stage made it (owned) */
    int64_t n_ubatch;
    struct graph_slot slots[MAX_GRAPHS];
    int n_built;
    uint64_t clock;
    int32_t *out_ids; /* [n_ubatch] */
    float *mask;      /* [n_ctx, n_ubatch] */
    float *mask_swa;  /* [n_ctx, n_ubatch] with sliding layers */
};

static void slot_free(struct graph_slot *s) {
    if (s->sched) bt_sched_free(s->sched);
    if (s->ctx) bt_free(s->ctx);
    memset(s, 0, sizeof *s);
}

static enum bt_status get_graph(struct bt_llm_stage *c, int64_t T, int64_t n_kv, int64_t n_out,
                                struct graph_slot **out, char *err, size_t n_err);

/* Whether backend runs every node of the range's graph (one token, with the
 * output projection on the last range): a device backend that does needs no
 * CPU threads beside it.  An allocation failure counts as "no" (the CPU
 * fallback is then there for nothing, which is harmless). */
static bool runs_every_op(const struct bt_llm *m, struct bt_kv *kv, bt_backend_t backend, int64_t n_ctx) {
    bt_context *ctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(m), NULL, true});
    struct bt_llm_graph g;
    bool all = ctx && bt_llm_build_graph(m, kv, ctx, 1, n_ctx < BT_KV_PAD ? n_ctx : BT_KV_PAD,
                                         m->il1 == m->hp.n_layer ? 1 : 0, &g) == BT_OK;
    for (int i = 0; all && i < g.graph->n_nodes; i++) all = bt_backend_supports_op(backend, g.graph->nodes[i]);
    if (ctx) bt_free(ctx);
    return all;
}

enum bt_status bt_llm_stage_new(const struct bt_llm *m, struct bt_kv *kv, bt_backend_t backend, int64_t n_ubatch,
                                struct bt_llm_stage **out, char *err, size_t n_err) {
    *out = NULL;
    const int64_t n_ctx = bt_kv_get_config(kv)->n_ctx;
    if (n_ubatch <= 0 || n_ubatch > n_ctx)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "ubatch size %lld out of [1, ctx size %lld]",
                               (long long)n_ubatch, (long long)n_ctx);
    struct bt_llm_stage *s = calloc(1, sizeof *s);
    if (!s) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    s->m = m;
    s->kv = kv;
    s->backends[s->n_backends++] = backend;
    s->n_ubatch = n_ubatch;
    s->out_ids = malloc((size_t)n_ubatch * sizeof *s->out_ids);
    s->mask = malloc((size_t)n_ubatch * (size_t)n_ctx * sizeof *s->mask);
    if (bt_kv_has_swa(kv)) s->mask_swa = malloc((size_t)n_ubatch * (size_t)n_ctx * sizeof *s->mask_swa);
    if (!s->out_ids || !s->mask || (bt_kv_has_swa(kv) && !s->mask_swa)) {
        bt_llm_stage_free(s);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory (the mask of %lld tokens x %lld cells)",
                               (long long)n_ubatch, (long long)n_ctx);
    }
    if (!bt_backend_is(backend, "cpu") && !runs_every_op(m, kv, backend, n_ctx)) {
        s->fallback = bt_backend_init_by_name("cpu", 0, NULL, 0);
        if (!s->fallback) {
            bt_llm_stage_free(s);
            return bt_error_printf(err, n_err, BT_ERR_NOMEM, "cannot start the CPU threads beside backend %s",
                                   bt_backend_name(backend));
        }
        s->backends[s->n_backends++] = s->fallback;
    }
    /* a probe: the splitter must find a backend for every op of the range's
     * graph (with the output projection on the last range: one row of
     * logits) */
    struct graph_slot *probe = NULL;
    const int64_t n_kv = n_ctx < BT_KV_PAD ? n_ctx : BT_KV_PAD;
    enum bt_status st = get_graph(s, 1, n_kv, m->il1 == m->hp.n_layer ? 1 : 0, &probe, err, n_err);
    if (st != BT_OK) {
        bt_llm_stage_free(s);
        return st;
    }
    s->n_built = 0; /* the probe is kept for one-token ubatches but not counted */
    *out = s;
    return BT_OK;
}

void bt_llm_stage_free(struct bt_llm_stage *s) {
    if (!s) return;
    for (int i = 0; i < MAX_GRAPHS; i++) slot_free(&s->slots[i]);
    if (s->fallback) bt_backend_free(s->fallback);
    BT_FREE_ALL(s->out_ids, s->mask, s->mask_swa, s);
}

int bt_llm_stage_n_graphs(const struct bt_llm_stage *s) { return s->n_built; }

/* The graph of shape (T, n_kv, n_out): reused when built before, else built
 * and allocated in the least recently used slot. */
static enum bt_status get_graph(struct bt_llm_stage *c, int64_t T, int64_t n_kv, int64_t n_out,
                                struct graph_slot **out, char *err, size_t n_err) {
    struct graph_slot *lru = &c->slots[0];
    c->clock++;
    for (int i = 0; i < MAX_GRAPHS; i++) {
        struct graph_slot *s = &c->slots[i];
        if (s->ctx && s->g.n_tokens == T && s->g.n_kv == n_kv && s->g.n_out == n_out) {
            s->last_use = c->clock;
            *out = s;
            return BT_OK;
        }
        if (s->last_use < lru->last_use) lru = s;
    }
    slot_free(lru);
    lru->ctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(c->m), NULL, true});
    if (!lru->ctx) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory (graph)");
    enum bt_status st = bt_llm_build_graph(c->m, c->kv, lru->ctx, T, n_kv, n_out, &lru->g);
    if (st != BT_OK) {
        st = bt_error_printf(err, n_err, st, "building the graph: %s", bt_context_error(lru->ctx));
        slot_free(lru);
        return st;
    }
    /* one micro-batch at a time: one copy slot */
    st = bt_sched_new(c->backends, NULL, c->n_backends, (size_t)lru->g.graph->size, 1, &lru->sched, err, n_err);
    if (st == BT_OK) {
        st = bt_sched_alloc_graph(lru->sched, lru->g.graph);
        if (st != BT_OK) {
            const char *why = bt_sched_error(lru->sched);
            st = bt_error_printf(err, n_err, st, st == BT_ERR_NOMEM ? "allocating the graph of layers [%d, %d): %s"
                                                                     : "planning the graph of layers [%d, %d): %s",
                                 c->m->il0, c->m->il1, why);
        }
    }
    if (st != BT_OK) {
        slot_free(lru);
        return st;
    }
    lru->last_use = c->clock;
    c->n_built++;
    *out = lru;
    return BT_OK;
}

enum bt_status bt_llm_stage_run(struct bt_llm_stage *s, int64_t T, const int32_t *token, const float *x,
                                const int32_t *pos, const int32_t *seq, const int32_t *cells, int64_t n_out,
                                const int32_t *out_ids, float *out, char *err, size_t n_err) {
    const struct bt_llm *m = s->m;
    const bool last = m->il1 == m->hp.n_layer;
    BT_ASSERT(T >= 1 && T <= s->n_ubatch && n_out >= 0 && n_out <= T);
    /* the graph's key: the rows asked for on the last range (none: no output
     * projection), 0 elsewhere (what bt_llm_build_graph records) */
    const int64_t n_out_g = last ? n_out : 0;
    for (int64_t i = 0; i < n_out_g; i++) s->out_ids[i] = out_ids[i];
    const int64_t n_kv = bt_kv_n_active(s->kv);
    struct graph_slot *slot = NULL;
    enum bt_status st = get_graph(s, T, n_kv, n_out_g, &slot, err, n_err);
    if (st != BT_OK) return st;
    const struct bt_llm_graph *g = &slot->g;
    /* the plan is kept while the shape repeats: this only takes the next
     * (the one) copy slot, and gives the inputs their memory back */
    st = bt_sched_alloc_graph(slot->sched, g->graph);
    if (st != BT_OK) return bt_error_printf(err, n_err, st, "scheduler: %s", bt_sched_error(slot->sched));
    bt_kv_mask(s->kv, n_kv, T, seq, pos, s->mask);
    if (g->tokens) bt_tensor_set(g->tokens, token, 0, (size_t)T * sizeof(int32_t));
    else if (x) bt_tensor_set(g->inp_x, x, 0, (size_t)(T * m->hp.n_embd) * sizeof(float));
    bt_tensor_set(g->pos, pos, 0, (size_t)T * sizeof(int32_t));
    if (g->cells) {
        bt_tensor_set(g->cells, cells, 0, (size_t)T * sizeof(int32_t));
        bt_tensor_set(g->mask, s->mask, 0, (size_t)(n_kv * T) * sizeof(float));
    }
    if (g->mask_swa) {
        bt_kv_mask_swa(s->kv, g->n_kv_swa, T, seq, pos, s->mask_swa);
        bt_tensor_set(g->cells_swa, bt_kv_swa_cells(s->kv), 0, (size_t)T * sizeof(int32_t));
        bt_tensor_set(g->mask_swa, s->mask_swa, 0, (size_t)(g->n_kv_swa * T) * sizeof(float));
    }
    if (g->out_ids) bt_tensor_set(g->out_ids, s->out_ids, 0, (size_t)n_out_g * sizeof(int32_t));
    st = bt_sched_graph_compute(slot->sched, g->graph);
    if (st != BT_OK) return bt_error_printf(err, n_err, st, "compute: %s", bt_sched_error(slot->sched));
    if (!last && out) bt_tensor_get(g->out, out, 0, (size_t)(T * m->hp.n_embd) * sizeof(float));
    else if (last && n_out > 0 && out)
        bt_tensor_get(g->out, out, 0, (size_t)(n_out * m->hp.n_vocab) * sizeof(float));
    return BT_OK;
}

/* ---- one process ------------------------------------------------------------------------ */

struct bt_llm_ctx {
    struct bt_llm *m;
    struct bt_llm_ctx_params p;
    struct bt_kv *kv;
    bt_backend_t backend;
    struct bt_llm_stage *stage;
    /* per-ubatch scratch */
    int32_t *cells, *out_ids;
};

void bt_llm_ctx_default_params(struct bt_llm_ctx_params *p) {
    p->n_ctx = 512;
    p->n_seq_max = 1;
    p->n_ubatch = 64;
    p->kv_type = BT_TYPE_F16;
    p->n_threads = 0;
}

enum bt_status bt_llm_ctx_new(struct bt_llm *m, const struct bt_llm_ctx_params *p, struct bt_llm_ctx **out,
                              char *err, size_t n_err) {
    *out = NULL;
    if (m->il0 != 0 || m->il1 != m->hp.n_layer)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "a one-process context needs the whole model (layers [0, %d))", m->hp.n_layer);
    if (p->n_ubatch <= 0 || p->n_ubatch > p->n_ctx)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "ubatch size %lld out of [1, ctx size %lld]",
                               (long long)p->n_ubatch, (long long)p->n_ctx);
    struct bt_llm_ctx *c = calloc(1, sizeof *c);
    if (!c) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    c->m = m;
    c->p = *p;
    struct bt_kv_config kc;
    bt_llm_kv_config(m, p->n_ctx, p->n_seq_max, p->n_ubatch, p->kv_type, &kc);
    enum bt_status st = bt_kv_new(&kc, &c->kv, err, n_err);
    if (st != BT_OK) {
        free(c);
        return st;
    }
    c->backend = bt_backend_init_by_name("cpu", p->n_threads, NULL, 0);
    c->cells = malloc((size_t)p->n_ubatch * sizeof *c->cells);
    c->out_ids = malloc((size_t)p->n_ubatch * sizeof *c->out_ids);
    if (!c->backend || !c->cells || !c->out_ids) {
        bt_llm_ctx_free(c);
        return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory (context of %lld cells)", (long long)p->n_ctx);
    }
    st = bt_llm_stage_new(m, c->kv, c->backend, p->n_ubatch, &c->stage, err, n_err);
    if (st == BT_OK) *out = c;
    else bt_llm_ctx_free(c);
    return st;
}

void bt_llm_ctx_free(struct bt_llm_ctx *c) {
    if (!c) return;
    bt_llm_stage_free(c->stage);
    if (c->backend) bt_backend_free(c->backend);
    bt_kv_free(c->kv);
    free(c->cells);
    free(c->out_ids);
    free(c);
}

struct bt_kv *bt_llm_ctx_kv(struct bt_llm_ctx *c) { return c->kv; }
int bt_llm_ctx_n_graphs(const struct bt_llm_ctx *c) { return bt_llm_stage_n_graphs(c->stage); }

enum bt_status bt_llm_decode(struct bt_llm_ctx *c, const struct bt_llm_batch *b, float *logits_out, char *err,
                             size_t n_err) {
    const struct bt_hparams *h = &c->m->hp;
    if (b->n_tokens <= 0) return bt_error_printf(err, n_err, BT_ERR_INVALID, "empty batch");
    if (b->out_kind != BT_LLM_OUT_LOGITS)
        return bt_error_printf(err, n_err, BT_ERR_INVALID, "a one-process context gives logits only (hidden states: the engine)");
    for (int64_t i = 0; i < b->n_tokens; i++)
        if (b->token[i] < 0 || b->token[i] >= h->n_vocab)
            return bt_error_printf(err, n_err, BT_ERR_INVALID, "token %lld: id %d out of the vocabulary [0, %lld)",
                                   (long long)i, b->token[i], (long long)h->n_vocab);
    int64_t n_written = 0;
    for (int64_t i0 = 0; i0 < b->n_tokens; i0 += c->p.n_ubatch) {
        const int64_t T = b->n_tokens - i0 < c->p.n_ubatch ? b->n_tokens - i0 : c->p.n_ubatch;
        enum bt_status st = bt_kv_place(c->kv, T, b->seq + i0, b->pos + i0, c->cells, err, n_err);
        if (st != BT_OK) return st;
        int64_t n_out = 0;
        for (int64_t i = 0; i < T; i++)
            if (b->logits && b->logits[i0 + i]) c->out_ids[n_out++] = (int32_t)i;
        st = bt_llm_stage_run(c->stage, T, b->token + i0, NULL, b->pos + i0, b->seq + i0, c->cells, n_out,
                              c->out_ids, logits_out ? logits_out + n_written * h->n_vocab : NULL, err, n_err);
        if (st != BT_OK) return st;
        if (logits_out) n_written += n_out;
    }
    return BT_OK;
}
