/* glm4moe.c - the glm4moe architecture (Zhipu's GLM-4.5 / GLM-4.6, GGUF
 * general.architecture "glm4moe"): its keys beyond the shared ones and its
 * tensors (llama.cpp's names and shapes), reached through bt_arch_builder_of
 * (arch_impl.h).  Its layers are llm.c's:
 *
 * Layer il, x [d, T]:
 *   cur = rms(x) * attn_norm
 *   q, k, v = Wq cur + bq, Wk cur + bk, Wv cur + bv   [hd, H, T], [hd, Hk, T]
 *   q, k = rms(q) * q_norm, rms(k) * k_norm per head (where the file has them)
 *   q, k = rope_neox(q), rope_neox(k) over the first n_rot of each head
 *          (GLM-4.5: partial_rotary_factor 0.5), the rest unrotated
 *   h = x + Wo FLASH_ATTN(q, cache_k, cache_v, mask, 1/sqrt(hd))
 *   cur = rms(h) * post_attention_norm
 *   the first leading_dense_block_count layers: out = h + SwiGLU MLP(cur)
 *   the others: s = sigmoid(Wr cur) [E, T]; ids = top-k of s + exp_probs_b;
 *     w = s[ids] (renormalised over the k when expert_weights_norm) times
 *     expert_weights_scale; out = h + sum_k w_k expert_ids_k(cur) + shared(cur)
 *     (the shared experts ungated, n_ff_exp * expert_shared_count wide)
 *
 * The file's block_count counts the next-token-prediction layers
 * (nextn_predict_layers, the last ones) that llama.cpp skips when it
 * generates: the model's layers are the others, and the tensors of those
 * layers stay in the file, neither expected nor loaded.
 */
#include <stdio.h>
#include <string.h>

#include "arch_impl.h"

/* After the shared keys (llama.cpp's glm4moe loader): the prediction layers
 * taken off block_count, then deepseek2's routing keys with sigmoid gating
 * by default. */
static enum bt_status glm_hparams(struct bt_gguf *g, const char *arch, struct bt_hparams *h, char *err,
                                  size_t n_err) {
    const char *path = bt_gguf_path(g);
    int64_t nextn;
    TRY(bt_arch_key_int(g, arch, "nextn_predict_layers", 0, 0, h->n_layer - 1, &nextn, err, n_err));
    h->n_layer -= (int)nextn;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", arch);
    if (bt_gguf_find_key(g, key) >= 0)
        return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED,
                               "%s: key %s (GLM-4.5V's multimodal rope) is not supported", path, key);
    if (h->head_dim_v != h->head_dim)
        return bt_error_printf(err, n_err, BT_ERR_INVALID,
                               "%s: %s.attention.value_length (%lld) differs from key_length (%lld)", path, arch,
                               (long long)h->head_dim_v, (long long)h->head_dim);
    return bt_arch_read_routing(g, arch, h, true, err, n_err);
}

#define L(field) offsetof(struct bt_llm_layer, field)
#define ADD(field, fmt, ne0, ne1, ne2, required, vector) \
    n = bt_arch_tensor_add(t, n, ly, L(field), il, fmt, ne0, ne1, ne2, required, vector)

/* layer il's attention: the matrices, the biases and q/k norms (both
 * optional, as llama.cpp's loader has them: GLM-4.5's files carry the biases,
 * the 355B's the norms) */
static int glm_attn_tensors(const struct bt_hparams *h, struct bt_llm_layer *ly, int il, struct bt_arch_tensor *t,
                            int n) {
    const int64_t d = h->n_embd, hd = h->head_dim, q = h->n_head * hd, kd = h->n_head_kv * hd;
    ADD(attn_norm, "blk.%d.attn_norm.weight", d, 1, 1, true, true);
    ADD(wq, "blk.%d.attn_q.weight", d, q, 1, true, false);
    ADD(wk, "blk.%d.attn_k.weight", d, kd, 1, true, false);
    ADD(wv, "blk.%d.attn_v.weight", d, kd, 1, true, false);
    ADD(wo, "blk.%d.attn_output.weight", q, d, 1, true, false);
    ADD(bq, "blk.%d.attn_q.bias", q, 1, 1, false, true);
    ADD(bk, "blk.%d.attn_k.bias", kd, 1, 1, false, true);
    ADD(bv, "blk.%d.attn_v.bias", kd, 1, 1, false, true);
    ADD(q_norm, "blk.%d.attn_q_norm.weight", hd, 1, 1, false, true);
    ADD(k_norm, "blk.%d.attn_k_norm.weight", hd, 1, 1, false, true);
    return n;
}

static int glm_tensors(const struct bt_hparams *h, struct bt_llm_globals *gl, struct bt_llm_layer *layers,
                       struct bt_arch_tensor *t) {
    const int64_t d = h->n_embd, fs = h->n_ff_shexp;
    int n = bt_arch_global_tensors(h, gl, t);
    for (int il = 0; il < h->n_layer; il++) {
        struct bt_llm_layer *ly = &layers[il];
        n = glm_attn_tensors(h, ly, il, t, n);
        ADD(ffn_norm, "blk.%d.post_attention_norm.weight", d, 1, 1, true, true);
        if (!bt_hparams_layer_moe(h, il)) {
            ADD(ffn_gate, "blk.%d.ffn_gate.weight", d, h->n_ff, 1, true, false);
            ADD(ffn_up, "blk.%d.ffn_up.weight", d, h->n_ff, 1, true, false);
            ADD(ffn_down, "blk.%d.ffn_down.weight", h->n_ff, d, 1, true, false);
            continue;
        }
        n = bt_arch_biased_experts(h, ly, il, t, n);
        if (h->n_expert_shared > 0) {
            ADD(ffn_gate_shexp, "blk.%d.ffn_gate_shexp.weight", d, fs, 1, true, false);
            ADD(ffn_up_shexp, "blk.%d.ffn_up_shexp.weight", d, fs, 1, true, false);
            ADD(ffn_down_shexp, "blk.%d.ffn_down_shexp.weight", fs, d, 1, true, false);
        }
    }
    return n;
}

const struct bt_arch_builder bt_glm4moe_builder = {
    /* .yarn    = */ false,
    /* .hparams = */ glm_hparams,
    /* .tensors = */ glm_tensors,
    /* .layer   = */ NULL,
};
