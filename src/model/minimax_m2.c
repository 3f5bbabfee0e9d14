/* minimax_m2.c - the minimax-m2 architecture (MiniMax-M2 and M2.1, 230B-A10B,
 * GGUF general.architecture "minimax-m2"): its keys beyond the shared ones and
 * its tensors (llama.cpp's names and shapes), reached through
 * bt_arch_builder_of (arch_impl.h).  Its layers are llm.c's:
 *
 * Layer il, x [d, T]:
 *   cur = rms(x) * attn_norm
 *   q, k, v = Wq cur, Wk cur, Wv cur                 [H*hd, T], [Hk*hd, T]
 *   q, k = rms(q) * q_norm, rms(k) * k_norm over the whole of q and of k
 *          (attn_q_norm [H*hd], attn_k_norm [Hk*hd]: its qk_norm_type
 *          "per_layer", olmoe's form), then cut into heads
 *   q, k = rope_neox(q), rope_neox(k) over the first n_rot of each head
 *          (rotary_dim 64 of 128), the rest unrotated
 *   h = x + Wo FLASH_ATTN(q, cache_k, cache_v, mask, 1/sqrt(hd))
 *   cur = rms(h) * ffn_norm
 *   s = sigmoid(Wr cur) [E, T]; ids = top-k of s + exp_probs_b;
 *   w = s[ids] / sum s[ids]; out = h + sum_k w_k expert_ids_k(cur)
 * Every layer is MoE; no shared expert, no scaling of the weights.
 *
 * The keys as llama.cpp's minimax-m2 loader reads them: the experts are
 * feed_forward_length wide (the converter writes intermediate_size there and
 * to expert_feed_forward_length, which llama.cpp requires too), the gating
 * function is the file's (sigmoid in MiniMax's; llama.cpp has no default), the
 * weights are always renormalised, and the output projection is its own
 * tensor.  Keys of other MoE forms that this loader does not read (leading
 * dense layers, shared experts, expert groups, a scale of the weights) are
 * refused when they ask for something, as a model neither computes.
 */
#include <stdio.h>
#include <string.h>

#include "arch_impl.h"

#define TRY(x)                        \
    do {                              \
        enum bt_status st_ = (x);     \
        if (st_ != BT_OK) return st_; \
    } while (0)
#define FAIL(s, ...) return bt_error_printf(err, n_err, (s), __VA_ARGS__)

/* After the shared keys (n_ff, n_ff_exp, n_expert known). */
static enum bt_status mm2_hparams(struct bt_gguf *g, const char *arch, struct bt_hparams *h, char *err,
                                  size_t n_err) {
    const char *path = bt_gguf_path(g);
    if (h->head_dim_v != h->head_dim)
        FAIL(BT_ERR_INVALID, "%s: %s.attention.value_length (%lld) differs from key_length (%lld)", path, arch,
             (long long)h->head_dim_v, (long long)h->head_dim);
    int64_t x; /* expert_feed_forward_length required, as llama.cpp's loader has it (the shared part read it) */
    TRY(bt_arch_key_int(g, arch, "expert_feed_forward_length", -1, 1, 1 << 20, &x, err, n_err));
    if (h->n_ff != h->n_ff_exp)
        FAIL(BT_ERR_INVALID, "%s: key %s.feed_forward_length (%lld, the experts' width) is not "
             "expert_feed_forward_length (%lld)", path, arch, (long long)h->n_ff, (long long)h->n_ff_exp);
    TRY(bt_arch_key_int(g, arch, "expert_gating_func", -1, 0, 16, &x, err, n_err));
    if (x != 1 && x != 2)
        FAIL(BT_ERR_UNSUPPORTED, "%s: key %s.expert_gating_func = %lld is not supported (1 softmax, 2 sigmoid)", path,
             arch, (long long)x);
    h->moe_sigmoid = x == 2;
    /* each key's values that ask for nothing: 0 (as absent) and `also` */
    static const struct {
        const char *key;
        float also;
    } unread[] = {{"leading_dense_block_count", 0.0f}, {"expert_shared_count", 0.0f}, {"expert_group_count", 1.0f},
                  {"expert_weights_scale", 1.0f}};
    for (size_t i = 0; i < sizeof unread / sizeof unread[0]; i++) {
        float v;
        TRY(bt_arch_key_float(g, arch, unread[i].key, 0.0, -1e9, 1e9, &v, err, n_err));
        if (v != 0.0f && v != unread[i].also)
            FAIL(BT_ERR_UNSUPPORTED, "%s: key %s.%s = %g is not supported (MiniMax-M2 has none; llama.cpp's "
                 "minimax-m2 does not read it)", path, arch, unread[i].key, (double)v);
    }
    h->tied_output = false; /* llama.cpp requires output.weight */
    return BT_OK;
}

/* a layer's norm weight [n_embd] */
#define NORM(field, fmt) \
    n = bt_arch_tensor_add(t, n, ly, offsetof(struct bt_llm_layer, field), il, fmt, h->n_embd, 1, 1, true, true)

/* The shared attention (the table's qk_norm_full: attn_q_norm [H*hd],
 * attn_k_norm [Hk*hd] required; q/k/v biases taken where present, as
 * llama.cpp's loader does), ffn_norm, the routed experts with the selection
 * bias. */
static int mm2_tensors(const struct bt_hparams *h, struct bt_llm_globals *gl, struct bt_llm_layer *layers,
                       struct bt_arch_tensor *t) {
    const struct bt_arch *a = bt_arch_find("minimax-m2");
    int n = bt_arch_global_tensors(h, gl, t);
    for (int il = 0; il < h->n_layer; il++) {
        struct bt_llm_layer *ly = &layers[il];
        NORM(attn_norm, "blk.%d.attn_norm.weight");
        n = bt_arch_attn_tensors(a, h, ly, il, t, n);
        NORM(ffn_norm, "blk.%d.ffn_norm.weight");
        n = bt_arch_biased_experts(h, ly, il, t, n);
    }
    return n;
}

const struct bt_arch_builder bt_minimax_m2_builder = {
    /* .yarn    = */ false,
    /* .hparams = */ mm2_hparams,
    /* .tensors = */ mm2_tensors,
    /* .layer   = */ NULL,
};
