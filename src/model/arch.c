/* arch.c - the architecture table, hyperparameters from GGUF keys, the
 * expected tensors of each architecture, and loading a layer range's
 * weights.  See arch.h; the graph and the forward pass are in llm.c. */
#include "arch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch_impl.h"

/* ---- the table: one entry per architecture ------------------------------------ */

static const struct bt_arch arches[] = {
    /* name     rope mode   qk_norm_head qk_norm_full moe norm_w shared post_norm embd_scale gelu swa mla */
    {"llama", BT_ROPE_NORMAL, false, false, 2, true, false, false, false, false, false, false},
    {"qwen2", BT_ROPE_NEOX, false, false, 0, false, false, false, false, false, false, false},
    {"qwen3", BT_ROPE_NEOX, true, false, 0, false, false, false, false, false, false, false},
    {"qwen2moe", BT_ROPE_NEOX, false, false, 1, false, true, false, false, false, false, false},
    {"qwen3moe", BT_ROPE_NEOX, true, false, 1, true, false, false, false, false, false, false},
    {"olmoe", BT_ROPE_NEOX, false, true, 1, false, false, false, false, false, false, false},
    {"gemma3", BT_ROPE_NEOX, true, false, 0, false, false, true, true, true, true, false},
    /* deepseek2: renormalising and the shared experts come from the file's keys */
    {"deepseek2", BT_ROPE_NORMAL, false, false, 2, false, false, false, false, false, false, true},
    /* its own builder (gpt_oss.c; bt_arch_builder_of): the flags past moe are unused */
    {"gpt-oss", BT_ROPE_NEOX, false, false, 1, false, false, false, false, false, false, false},
    /* its own builder (glm4moe.c) for the keys and tensors, llm.c's layers */
    {"glm4moe", BT_ROPE_NEOX, false, false, 1, false, false, false, false, false, false, false},
    /* its own builder (minimax_m2.c) for the keys and tensors, llm.c's layers (qk_norm_full, renormalised) */
    {"minimax-m2", BT_ROPE_NEOX, false, true, 1, true, false, false, false, false, false, false},
};
#define N_ARCHES ((int)(sizeof arches / sizeof arches[0]))

const struct bt_arch *bt_arch_find(const char *name) {
    for (int i = 0; i < N_ARCHES; i++)
        if (name && strcmp(arches[i].name, name) == 0) return &arches[i];
    return NULL;
}

const char *bt_arch_names(void) {
    return "llama, qwen2, qwen3, qwen2moe, qwen3moe, olmoe, gemma3, deepseek2, gpt-oss, glm4moe, minimax-m2";
}

bool bt_hparams_layer_moe(const struct bt_hparams *h, int il) {
    return h->n_expert > 0 && il >= h->n_layer_dense_lead;
}

/* the architectures with a builder of their own */
static const struct {
    const char *name;
    const struct bt_arch_builder *builder;
} builders[] = {
    {"gpt-oss", &bt_gpt_oss_builder},
    {"glm4moe", &bt_glm4moe_builder},
    {"minimax-m2", &bt_minimax_m2_builder},
};

const struct bt_arch_builder *bt_arch_builder_of(const struct bt_arch *a) {
    for (size_t i = 0; i < sizeof builders / sizeof builders[0]; i++)
        if (strcmp(builders[i].name, a->name) == 0) return builders[i].builder;
    return NULL;
}

/* ---- errors ------------------------------------------------------------------------- */

#define FAIL(s, ...) return bt_error_printf(err, n_err, (s), __VA_ARGS__)

/* ---- hyperparameters ----------------------------------------------------------------- */

static bool is_number(enum bt_gguf_type t) {
    return t != BT_GGUF_TYPE_BOOL && t != BT_GGUF_TYPE_STRING && t != BT_GGUF_TYPE_ARRAY && t < BT_GGUF_TYPE_COUNT;
}

/* The index of key {arch}.<what> (written in key, n bytes), -1 when absent. */
static int64_t find_arch_key(struct bt_gguf *g, const char *arch, const char *what, char *key, size_t n) {
    snprintf(key, n, "%s.%s", arch, what);
    return bt_gguf_find_key(g, key);
}

/* {arch}.<what> as an integer in [lo, hi]; absent: def, or an error when def < 0
 * (required). */
static enum bt_status key_int(struct bt_gguf *g, const char *arch, const char *what, int64_t def, int64_t lo,
                              int64_t hi, int64_t *out, char *err, size_t n_err) {
    char key[160];
    const int64_t i = find_arch_key(g, arch, what, key, sizeof key);
    if (i < 0) {
        if (def < 0) FAIL(BT_ERR_INVALID, "%s: key %s is missing", bt_gguf_path(g), key);
        *out = def;
        return BT_OK;
    }
    const struct bt_gguf_value *v = bt_gguf_kv_value(g, i);
    if (!is_number(v->type) || v->type == BT_GGUF_TYPE_FLOAT32 || v->type == BT_GGUF_TYPE_FLOAT64)
        FAIL(BT_ERR_INVALID, "%s: key %s is %s, not an integer", bt_gguf_path(g), key, bt_gguf_type_name(v->type));
    const int64_t x = bt_gguf_value_i64(g, v);
    if (x < lo || x > hi)
        FAIL(BT_ERR_INVALID, "%s: key %s = %lld out of [%lld, %lld]", bt_gguf_path(g), key, (long long)x,
             (long long)lo, (long long)hi);
    *out = x;
    return BT_OK;
}

static enum bt_status key_float(struct bt_gguf *g, const char *arch, const char *what, double def, double lo,
                                double hi, float *out, char *err, size_t n_err) {
    char key[160];
    const int64_t i = find_arch_key(g, arch, what, key, sizeof key);
    if (i < 0) {
        if (isnan(def)) FAIL(BT_ERR_INVALID, "%s: key %s is missing", bt_gguf_path(g), key);
        *out = (float)def;
        return BT_OK;
    }
    const struct bt_gguf_value *v = bt_gguf_kv_value(g, i);
    if (!is_number(v->type)) FAIL(BT_ERR_INVALID, "%s: key %s is %s, not a number", bt_gguf_path(g), key,
                                  bt_gguf_type_name(v->type));
    const double x = bt_gguf_value_f64(g, v);
    if (!(x >= lo && x <= hi))
        FAIL(BT_ERR_INVALID, "%s: key %s = %g out of [%g, %g]", bt_gguf_path(g), key, x, lo, hi);
    *out = (float)x;
    return BT_OK;
}

/* {arch}.<what> as a boolean; absent: def. */
static enum bt_status key_bool(struct bt_gguf *g, const char *arch, const char *what, bool def, bool *out, char *err,
                               size_t n_err) {
    char key[160];
    const int64_t i = find_arch_key(g, arch, what, key, sizeof key);
    if (i < 0) {
        *out = def;
        return BT_OK;
    }
    if (bt_gguf_kv_value(g, i)->type != BT_GGUF_TYPE_BOOL)
        FAIL(BT_ERR_INVALID, "%s: key %s is %s, not a bool", bt_gguf_path(g), key,
             bt_gguf_type_name(bt_gguf_kv_value(g, i)->type));
    if (bt_gguf_get_bool(g, key, out) != BT_OK) FAIL(BT_ERR_INVALID, "%s", bt_gguf_error(g));
    return BT_OK;
}

enum bt_status bt_arch_key_int(struct bt_gguf *g, const char *arch, const char *what, int64_t def, int64_t lo,
                               int64_t hi, int64_t *out, char *err, size_t n_err) {
    return key_int(g, arch, what, def, lo, hi, out, err, n_err);
}

enum bt_status bt_arch_key_float(struct bt_gguf *g, const char *arch, const char *what, double def, double lo,
                                 double hi, float *out, char *err, size_t n_err) {
    return key_float(g, arch, what, def, lo, hi, out, err, n_err);
}

#define LIM (1 << 20)

/* The routing keys of DeepSeek-V3's MoE, which GLM-4.5's share (llama.cpp's
 * deepseek2 and glm4moe loaders): the leading dense layers (all of them
 * without experts), the shared experts (each n_ff_exp wide), the weights'
 * scale (0 or absent: 1) and renormalising, the gating function (1 softmax,
 * 2 sigmoid; 0 or absent: sigmoid when sigmoid_default, else softmax).
 * After the shared keys (n_layer, n_expert, n_ff, n_ff_exp known). */
enum bt_status bt_arch_read_routing(struct bt_gguf *g, const char *name, struct bt_hparams *h, bool sigmoid_default,
                                    char *err, size_t n_err) {
    const char *path = bt_gguf_path(g);
    int64_t x;
    TRY(key_int(g, name, "leading_dense_block_count", 0, 0, h->n_layer, &x, err, n_err));
    h->n_layer_dense_lead = h->n_expert > 0 ? (int)x : h->n_layer;
    if (h->n_layer_dense_lead > 0 && h->n_ff < 1)
        FAIL(BT_ERR_INVALID, "%s: key %s.feed_forward_length is missing or 0 (the first %d layers are dense)", path,
             name, h->n_layer_dense_lead);
    if (h->n_expert == 0) return BT_OK;
    TRY(key_int(g, name, "expert_shared_count", 0, 0, 4096, &h->n_expert_shared, err, n_err));
    h->n_ff_shexp = h->n_ff_exp * h->n_expert_shared;
    TRY(key_float(g, name, "expert_weights_scale", 0.0, 0.0, 1e6, &h->moe_w_scale, err, n_err));
    if (h->moe_w_scale == 0.0f) h->moe_w_scale = 1.0f; /* llama.cpp: 0, absent: no scaling */
    TRY(key_bool(g, name, "expert_weights_norm", false, &h->moe_norm_w, err, n_err));
    TRY(key_int(g, name, "expert_gating_func", 0, 0, 16, &x, err, n_err));
    if (x > 2)
        FAIL(BT_ERR_UNSUPPORTED, "%s: key %s.expert_gating_func = %lld is not supported (1 softmax, 2 sigmoid)", path,
             name, (long long)x);
    h->moe_sigmoid = x == 2 || (x == 0 && sigmoid_default);
    return BT_OK;
}

/* DeepSeek-V2/V3's keys (llama.cpp's deepseek2 loader): the latent
 * attention's ranks and head lengths, checked against the cache geometry the
 * converter writes (key_length R + r, value_length R, one KV head), and the
 * routing.  After the shared keys (n_expert, n_ff, n_ff_exp known). */
static enum bt_status read_mla_hparams(struct bt_gguf *g, const char *name, struct bt_hparams *h, char *err,
                                       size_t n_err) {
    const char *path = bt_gguf_path(g);
    char key[160];
    snprintf(key, sizeof key, "%s.attention.key_length_mla", name);
    if (bt_gguf_find_key(g, key) < 0 && bt_gguf_find_tensor(g, "blk.0.attn_kv_b.weight") >= 0)
        FAIL(BT_ERR_UNSUPPORTED, "%s: the older MLA layout (attn_kv_b, no key %s) is not supported; convert the "
             "model again with today's convert_hf_to_gguf.py (attn_k_b, attn_v_b)", path, key);
    TRY(key_int(g, name, "attention.kv_lora_rank", -1, 1, LIM, &h->n_lora_kv, err, n_err));
    TRY(key_int(g, name, "attention.q_lora_rank", 0, 0, LIM, &h->n_lora_q, err, n_err));
    TRY(key_int(g, name, "attention.key_length_mla", -1, 1, 65536, &h->head_dim_mla, err, n_err));
    TRY(key_int(g, name, "attention.value_length_mla", -1, 1, 65536, &h->head_dim_v_mla, err, n_err));
    if (h->n_head_kv != 1 || h->head_dim != h->n_lora_kv + h->n_rot || h->head_dim_v != h->n_lora_kv ||
        h->head_dim_mla <= h->n_rot)
        FAIL(BT_ERR_INVALID, "%s: %s's latent attention needs head_count_kv 1 (is %lld), key_length = kv_lora_rank + "
             "rope.dimension_count (%lld, %lld + %d), value_length = kv_lora_rank (%lld) and key_length_mla (%lld) > "
             "rope.dimension_count", path, name, (long long)h->n_head_kv, (long long)h->head_dim,
             (long long)h->n_lora_kv, h->n_rot, (long long)h->head_dim_v, (long long)h->head_dim_mla);
    h->attn_scale = 1.0f / sqrtf((float)h->head_dim_mla);
    h->kv_v_in_k = true; /* K = [c ; rope(kr)], V = c */
    float temp = 0.0f;
    TRY(key_float(g, name, "attention.temperature_scale", 0.0, -1e9, 1e9, &temp, err, n_err));
    if (temp != 0.0f)
        FAIL(BT_ERR_UNSUPPORTED, "%s: key %s.attention.temperature_scale (attention temperature tuning) is not "
             "supported", path, name);
    TRY(bt_arch_read_routing(g, name, h, false, err, n_err));
    if (h->n_expert == 0) return BT_OK;
    int64_t G, gu;
    TRY(key_int(g, name, "expert_group_count", 1, 0, h->n_expert, &G, err, n_err));
    if (G == 0) G = 1; /* llama.cpp's default: no groups */
    TRY(key_int(g, name, "expert_group_used_count", G, 0, G, &gu, err, n_err));
    if (gu == 0) gu = G;
    if (G > 1 && gu < G && (h->n_expert % G || h->n_expert / G < 2 || h->n_expert_used > h->n_expert / G * gu))
        FAIL(BT_ERR_INVALID, "%s: keys %s.expert_group_count = %lld, expert_group_used_count = %lld: %lld experts "
             "do not make groups of 2 or more, %lld of them in the groups used", path, name, (long long)G,
             (long long)gu, (long long)h->n_expert, (long long)h->n_expert_used);
    /* every group used: no restriction */
    h->n_group = gu < G ? G : 1;
    h->n_group_used = gu < G ? gu : 1;
    return BT_OK;
}

/* YaRN (rope.scaling.type "yarn"; deepseek2 only), as llama.cpp computes
 * it for DeepSeek-V2/V3: the rope's pairs mixed between extrapolated and
 * interpolated over the corr dims of original_context_length and the betas
 * (defaults 32 and 1), cos and sin unscaled (llama.cpp's attention factor
 * cancels its own 1 + 0.1 ln(factor) for this architecture), and q.k's
 * scale times m^2 with m = 1 + yarn_log_multiplier * ln(factor) (the file's
 * multiplier is 0.1 * mscale_all_dim: modeling_deepseek's softmax_scale). */
static enum bt_status read_yarn_hparams(struct bt_gguf *g, const char *name, struct bt_hparams *h, char *err,
                                        size_t n_err) {
    const char *path = bt_gguf_path(g);
    int64_t n_orig = 0;
    float beta_fast = 0.0f, beta_slow = 0.0f, log_mul = 0.0f, attn_factor = 1.0f;
    TRY(key_int(g, name, "rope.scaling.original_context_length", h->n_ctx_train, 0, INT64_MAX, &n_orig, err, n_err));
    if (n_orig < 1)
        FAIL(BT_ERR_INVALID, "%s: YaRN needs key %s.rope.scaling.original_context_length (or context_length)", path,
             name);
    TRY(key_float(g, name, "rope.scaling.yarn_beta_fast", 32.0, 1e-6, 1e6, &beta_fast, err, n_err));
    TRY(key_float(g, name, "rope.scaling.yarn_beta_slow", 1.0, 1e-6, 1e6, &beta_slow, err, n_err));
    TRY(key_float(g, name, "rope.scaling.yarn_log_multiplier", NAN, 0.0, 100.0, &log_mul, err, n_err));
    TRY(key_float(g, name, "rope.scaling.attn_factor", 1.0, 0.0, 1e6, &attn_factor, err, n_err));
    if (attn_factor != 1.0f)
        FAIL(BT_ERR_UNSUPPORTED, "%s: key %s.rope.scaling.attn_factor = %g is not supported (1)", path, name,
             (double)attn_factor);
    if (n_orig > INT32_MAX)
        FAIL(BT_ERR_INVALID, "%s: key %s.rope.scaling.original_context_length = %lld is out of range", path, name,
             (long long)n_orig);
    const float factor = 1.0f / h->rope_freq_scale;
    /* the rope scales cos and sin by attn_factor (1 + 0.1 ln factor): this
     * attn_factor cancels it, as llama.cpp's does */
    h->rope_yarn = (struct bt_rope_yarn){.ext_factor = 1.0f,
                                         .attn_factor = 1.0f / (1.0f + 0.1f * logf(factor)),
                                         .beta_fast = beta_fast,
                                         .beta_slow = beta_slow,
                                         .n_ctx_orig = (int)n_orig};
    const float m = factor > 1.0f ? 1.0f + log_mul * logf(factor) : 1.0f;
    h->attn_scale *= m * m;
    return BT_OK;
}

enum bt_status bt_arch_read_hparams(struct bt_gguf *g, const struct bt_arch **arch_out, struct bt_hparams *h,
                                    char *err, size_t n_err) {
    memset(h, 0, sizeof *h);
    struct bt_gguf_str s;
    if (bt_gguf_get_str(g, "general.architecture", &s) != BT_OK)
        FAIL(BT_ERR_INVALID, "%s", bt_gguf_error(g));
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)(s.n < 63 ? s.n : 63), s.data);
    const struct bt_arch *a = bt_arch_find(name);
    if (!a || s.n > 63)
        FAIL(BT_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported (baton knows %s)", bt_gguf_path(g), name,
             bt_arch_names());
    *arch_out = a;
    int64_t x;
    TRY(key_int(g, name, "block_count", -1, 1, 4096, &x, err, n_err));
    h->n_layer = (int)x;
    TRY(key_int(g, name, "embedding_length", -1, 1, LIM, &h->n_embd, err, n_err));
    TRY(key_int(g, name, "attention.head_count", -1, 1, 4096, &h->n_head, err, n_err));
    TRY(key_int(g, name, "attention.head_count_kv", h->n_head, 1, h->n_head, &h->n_head_kv, err, n_err));
    if (h->n_head % h->n_head_kv)
        FAIL(BT_ERR_INVALID, "%s: %s.attention.head_count (%lld) is not a multiple of head_count_kv (%lld)",
             bt_gguf_path(g), name, (long long)h->n_head, (long long)h->n_head_kv);
    const int64_t hd_def = h->n_embd % h->n_head == 0 ? h->n_embd / h->n_head : -1;
    TRY(key_int(g, name, "attention.key_length", hd_def, 1, 65536, &h->head_dim, err, n_err));
    TRY(key_int(g, name, "attention.value_length", h->head_dim, 1, 65536, &h->head_dim_v, err, n_err));
    TRY(key_int(g, name, "rope.dimension_count", h->head_dim, 2, h->head_dim, &x, err, n_err));
    if (x % 2) FAIL(BT_ERR_INVALID, "%s: %s.rope.dimension_count = %lld is odd", bt_gguf_path(g), name, (long long)x);
    h->n_rot = (int)x;
    TRY(key_float(g, name, "rope.freq_base", 10000.0, 1e-3, 1e12, &h->rope_base, err, n_err));
    TRY(key_float(g, name, "attention.layer_norm_rms_epsilon", NAN, 0.0, 1.0, &h->norm_eps, err, n_err));
    h->rope_freq_scale = 1.0f;
    bool yarn = false;
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", name);
    if (bt_gguf_find_key(g, key) >= 0) {
        if (bt_gguf_get_str(g, key, &s) != BT_OK) FAIL(BT_ERR_INVALID, "%s", bt_gguf_error(g));
        const bool none = s.n == 4 && memcmp(s.data, "none", 4) == 0;
        const bool linear = s.n == 6 && memcmp(s.data, "linear", 6) == 0;
        /* YaRN where the architecture takes it (deepseek2's latent attention, or
         * a builder of its own that says so): the factor here, the rest in its hparams */
        const bool takes_yarn = a->mla || (bt_arch_builder_of(a) && bt_arch_builder_of(a)->yarn);
        yarn = takes_yarn && s.n == 4 && memcmp(s.data, "yarn", 4) == 0;
        if (!none && !linear && !yarn)
            FAIL(BT_ERR_UNSUPPORTED, "%s: %s = \"%.*s\" is not supported (none, linear%s)", bt_gguf_path(g), key,
                 (int)(s.n < 32 ? s.n : 32), s.data, a->mla ? "; yarn for deepseek2" : takes_yarn ? ", yarn" : "");
        if (linear || yarn) {
            float f;
            TRY(key_float(g, name, "rope.scaling.factor", NAN, 1e-6, 1e6, &f, err, n_err));
            h->rope_freq_scale = 1.0f / f;
        }
    }
    TRY(key_int(g, name, "context_length", 0, 0, INT64_MAX, &h->n_ctx_train, err, n_err));
    h->attn_scale = 1.0f / sqrtf((float)h->head_dim);
    h->rope_base_swa = h->rope_base;
    h->rope_freq_scale_swa = h->rope_freq_scale;
    if (a->swa) {
        /* Gemma 3 (llama.cpp's gemma3 loader): a window makes every layer
         * but each pattern-th slide, at rope base freq_base_swa unscaled */
        TRY(key_int(g, name, "attention.sliding_window", 0, 0, 1 << 24, &h->n_swa, err, n_err));
        TRY(key_int(g, name, "attention.sliding_window_pattern", 6, 0, 4096, &x, err, n_err));
        h->swa_pattern = (int)x;
        TRY(key_float(g, name, "rope.freq_base_swa", 10000.0, 1e-3, 1e12, &h->rope_base_swa, err, n_err));
        h->rope_freq_scale_swa = 1.0f;
        float cap;
        TRY(key_float(g, name, "final_logit_softcapping", 0.0, 0.0, 1e9, &cap, err, n_err));
        if (cap != 0.0f)
            FAIL(BT_ERR_UNSUPPORTED, "%s: key %s.final_logit_softcapping = %g is not supported (baton has no tanh)",
                 bt_gguf_path(g), name, (double)cap);
        /* gemma_pytorch's query_pre_attn_scalar: n_embd / n_head for the 27B
         * (62 layers), head_dim for the others; the file does not say it */
        if (h->n_layer == 62) h->attn_scale = 1.0f / sqrtf((float)(h->n_embd / h->n_head));
    }
    TRY(key_int(g, name, "expert_count", 0, 0, 4096, &h->n_expert, err, n_err));
    const bool moe = a->moe == 1 || (a->moe == 2 && h->n_expert > 0);
    if (a->moe == 1 && h->n_expert == 0)
        FAIL(BT_ERR_INVALID, "%s: key %s.expert_count is missing or 0 (%s is a MoE architecture)", bt_gguf_path(g),
             name, name);
    TRY(key_int(g, name, "feed_forward_length", moe ? 0 : -1, 0, LIM, &h->n_ff, err, n_err));
    if (moe) {
        TRY(key_int(g, name, "expert_used_count", -1, 1, h->n_expert, &h->n_expert_used, err, n_err));
        TRY(key_int(g, name, "expert_feed_forward_length", h->n_ff > 0 ? h->n_ff : -1, 1, LIM, &h->n_ff_exp, err,
                    n_err));
        if (a->shared_expert)
            TRY(key_int(g, name, "expert_shared_feed_forward_length", h->n_ff > 0 ? h->n_ff : -1, 1, LIM,
                        &h->n_ff_shexp, err, n_err));
    } else {
        h->n_expert = 0;
        if (h->n_ff < 1 && !a->mla) FAIL(BT_ERR_INVALID, "%s: key %s.feed_forward_length is 0", bt_gguf_path(g), name);
    }
    h->moe_norm_w = a->moe_norm_w;
    h->moe_w_scale = 1.0f;
    if (a->mla) TRY(read_mla_hparams(g, name, h, err, n_err));
    if (yarn && a->mla) TRY(read_yarn_hparams(g, name, h, err, n_err));
    /* the vocabulary is token_embd's second dimension */
    const int64_t te = bt_gguf_find_tensor(g, "token_embd.weight");
    if (te < 0) FAIL(BT_ERR_INVALID, "%s: tensor \"token_embd.weight\" is missing (expected [%lld, n_vocab])",
                     bt_gguf_path(g), (long long)h->n_embd);
    h->n_vocab = bt_gguf_tensor(g, te)->ne[1];
    h->tied_output = bt_gguf_find_tensor(g, "output.weight") < 0;
    if (bt_arch_builder_of(a)) return bt_arch_builder_of(a)->hparams(g, name, h, err, n_err);
    return BT_OK;
}

/* ---- the expected tensors ----------------------------------------------------------- */

/* Each weight the model may have: where its pointer lives, its name, shape,
 * and whether it is required. */
static int add(struct bt_arch_tensor *t, int n, void *slot_owner, size_t slot_off, int layer, const char *fmt,
               int64_t ne0, int64_t ne1, int64_t ne2, bool required, bool vector) {
    struct bt_arch_tensor *e = &t[n];
    memset(e, 0, sizeof *e);
    if (layer >= 0)
        snprintf(e->name, sizeof e->name, fmt, layer);
    else
        snprintf(e->name, sizeof e->name, "%s", fmt);
    e->ne[0] = ne0;
    e->ne[1] = ne1;
    e->ne[2] = ne2;
    e->ne[3] = 1;
    e->layer = layer;
    e->required = required;
    e->vector = vector;
    e->slot = (struct bt_tensor **)((char *)slot_owner + slot_off);
    return n + 1;
}

int bt_arch_tensor_add(struct bt_arch_tensor *t, int n, void *slot_owner, size_t slot_off, int layer, const char *fmt,
                       int64_t ne0, int64_t ne1, int64_t ne2, bool required, bool vector) {
    return add(t, n, slot_owner, slot_off, layer, fmt, ne0, ne1, ne2, required, vector);
}

#define L(field) offsetof(struct bt_llm_layer, field)

int bt_arch_global_tensors(const struct bt_hparams *h, struct bt_llm_globals *gl, struct bt_arch_tensor *t) {
    const int64_t d = h->n_embd, V = h->n_vocab;
    int n = 0;
    n = add(t, n, gl, offsetof(struct bt_llm_globals, tok_embd), -1, "token_embd.weight", d, V, 1, true, false);
    n = add(t, n, gl, offsetof(struct bt_llm_globals, output_norm), -1, "output_norm.weight", d, 1, 1, true, true);
    if (!h->tied_output)
        n = add(t, n, gl, offsetof(struct bt_llm_globals, output), -1, "output.weight", d, V, 1, true, false);
    return n;
}

int bt_arch_attn_tensors(const struct bt_arch *a, const struct bt_hparams *h, struct bt_llm_layer *ly, int il,
                         struct bt_arch_tensor *t, int n) {
    const int64_t d = h->n_embd, q = h->n_head * h->head_dim, kd = h->n_head_kv * h->head_dim,
                  vd = h->n_head_kv * h->head_dim_v;
    n = add(t, n, ly, L(wq), il, "blk.%d.attn_q.weight", d, q, 1, true, false);
    n = add(t, n, ly, L(wk), il, "blk.%d.attn_k.weight", d, kd, 1, true, false);
    n = add(t, n, ly, L(wv), il, "blk.%d.attn_v.weight", d, vd, 1, true, false);
    n = add(t, n, ly, L(wo), il, "blk.%d.attn_output.weight", h->n_head * h->head_dim_v, d, 1, true, false);
    n = add(t, n, ly, L(bq), il, "blk.%d.attn_q.bias", q, 1, 1, false, true);
    n = add(t, n, ly, L(bk), il, "blk.%d.attn_k.bias", kd, 1, 1, false, true);
    n = add(t, n, ly, L(bv), il, "blk.%d.attn_v.bias", vd, 1, 1, false, true);
    if (a->qk_norm_head) {
        n = add(t, n, ly, L(q_norm), il, "blk.%d.attn_q_norm.weight", h->head_dim, 1, 1, true, true);
        n = add(t, n, ly, L(k_norm), il, "blk.%d.attn_k_norm.weight", h->head_dim, 1, 1, true, true);
    }
    if (a->qk_norm_full) {
        n = add(t, n, ly, L(q_norm), il, "blk.%d.attn_q_norm.weight", q, 1, 1, true, true);
        n = add(t, n, ly, L(k_norm), il, "blk.%d.attn_k_norm.weight", kd, 1, 1, true, true);
    }
    return n;
}

int bt_arch_biased_experts(const struct bt_hparams *h, struct bt_llm_layer *ly, int il, struct bt_arch_tensor *t,
                           int n) {
    const int64_t d = h->n_embd, E = h->n_expert, f = h->n_ff_exp;
    n = add(t, n, ly, L(ffn_gate_inp), il, "blk.%d.ffn_gate_inp.weight", d, E, 1, true, false);
    n = add(t, n, ly, L(ffn_exp_probs_b), il, "blk.%d.exp_probs_b.bias", E, 1, 1, true, true);
    n = add(t, n, ly, L(ffn_gate_exps), il, "blk.%d.ffn_gate_exps.weight", d, f, E, true, false);
    n = add(t, n, ly, L(ffn_up_exps), il, "blk.%d.ffn_up_exps.weight", d, f, E, true, false);
    return add(t, n, ly, L(ffn_down_exps), il, "blk.%d.ffn_down_exps.weight", f, d, E, true, false);
}

/* A deepseek2 layer's latent attention weights (arch.h): with R the KV rank,
 * r the rope length, n + r = head_dim_mla, dv = head_dim_v_mla. */
static int mla_tensors(const struct bt_hparams *h, struct bt_llm_layer *ly, int il, struct bt_arch_tensor *t, int n) {
    const int64_t d = h->n_embd, H = h->n_head, R = h->n_lora_kv, r = h->n_rot, nope = h->head_dim_mla - r,
                  qd = H * h->head_dim_mla, dv = h->head_dim_v_mla;
    if (h->n_lora_q > 0) {
        n = add(t, n, ly, L(wq_a), il, "blk.%d.attn_q_a.weight", d, h->n_lora_q, 1, true, false);
        n = add(t, n, ly, L(q_a_norm), il, "blk.%d.attn_q_a_norm.weight", h->n_lora_q, 1, 1, true, true);
        n = add(t, n, ly, L(wq_b), il, "blk.%d.attn_q_b.weight", h->n_lora_q, qd, 1, true, false);
    } else {
        n = add(t, n, ly, L(wq), il, "blk.%d.attn_q.weight", d, qd, 1, true, false);
    }
    n = add(t, n, ly, L(wkv_a_mqa), il, "blk.%d.attn_kv_a_mqa.weight", d, R + r, 1, true, false);
    n = add(t, n, ly, L(kv_a_norm), il, "blk.%d.attn_kv_a_norm.weight", R, 1, 1, true, true);
    n = add(t, n, ly, L(wk_b), il, "blk.%d.attn_k_b.weight", nope, R, H, true, false);
    n = add(t, n, ly, L(wv_b), il, "blk.%d.attn_v_b.weight", R, dv, H, true, false);
    n = add(t, n, ly, L(wo), il, "blk.%d.attn_output.weight", H * dv, d, 1, true, false);
    return n;
}

int bt_arch_tensors(const struct bt_arch *a, const struct bt_hparams *h, struct bt_llm_globals *gl,
                    struct bt_llm_layer *layers, struct bt_arch_tensor *t) {
    if (bt_arch_builder_of(a)) return bt_arch_builder_of(a)->tensors(h, gl, layers, t);
    const int64_t d = h->n_embd;
    int n = bt_arch_global_tensors(h, gl, t);
    for (int il = 0; il < h->n_layer; il++) {
        struct bt_llm_layer *ly = &layers[il];
        n = add(t, n, ly, L(attn_norm), il, "blk.%d.attn_norm.weight", d, 1, 1, true, true);
        if (a->mla) {
            n = mla_tensors(h, ly, il, t, n);
        } else {
            n = bt_arch_attn_tensors(a, h, ly, il, t, n);
        }
        if (a->post_norm) {
            n = add(t, n, ly, L(attn_post_norm), il, "blk.%d.post_attention_norm.weight", d, 1, 1, true, true);
            n = add(t, n, ly, L(ffn_post_norm), il, "blk.%d.post_ffw_norm.weight", d, 1, 1, true, true);
        }
        n = add(t, n, ly, L(ffn_norm), il, "blk.%d.ffn_norm.weight", d, 1, 1, true, true);
        if (!bt_hparams_layer_moe(h, il)) {
            n = add(t, n, ly, L(ffn_gate), il, "blk.%d.ffn_gate.weight", d, h->n_ff, 1, true, false);
            n = add(t, n, ly, L(ffn_up), il, "blk.%d.ffn_up.weight", d, h->n_ff, 1, true, false);
            n = add(t, n, ly, L(ffn_down), il, "blk.%d.ffn_down.weight", h->n_ff, d, 1, true, false);
            continue;
        }
        const int64_t E = h->n_expert, f = h->n_ff_exp, fs = h->n_ff_shexp;
        n = add(t, n, ly, L(ffn_gate_inp), il, "blk.%d.ffn_gate_inp.weight", d, E, 1, true, false);
        if (a->mla) n = add(t, n, ly, L(ffn_exp_probs_b), il, "blk.%d.exp_probs_b.bias", E, 1, 1, false, true);
        n = add(t, n, ly, L(ffn_gate_exps), il, "blk.%d.ffn_gate_exps.weight", d, f, E, true, false);
        n = add(t, n, ly, L(ffn_up_exps), il, "blk.%d.ffn_up_exps.weight", d, f, E, true, false);
        n = add(t, n, ly, L(ffn_down_exps), il, "blk.%d.ffn_down_exps.weight", f, d, E, true, false);
        if (a->shared_expert)
            n = add(t, n, ly, L(ffn_gate_inp_shexp), il, "blk.%d.ffn_gate_inp_shexp.weight", d, 1, 1, true, false);
        if (a->shared_expert || h->n_expert_shared > 0) {
            n = add(t, n, ly, L(ffn_gate_shexp), il, "blk.%d.ffn_gate_shexp.weight", d, fs, 1, true, false);
            n = add(t, n, ly, L(ffn_up_shexp), il, "blk.%d.ffn_up_shexp.weight", d, fs, 1, true, false);
            n = add(t, n, ly, L(ffn_down_shexp), il, "blk.%d.ffn_down_shexp.weight", fs, d, 1, true, false);
        }
    }
    return n;
}

int bt_arch_max_tensors(const struct bt_hparams *h) { return 3 + h->n_layer * 20; }

/* ---- loading ------------------------------------------------------------------------ */

static void shape_str(char *buf, size_t n, const int64_t ne[4]) {
    int nd = 4;
    while (nd > 1 && ne[nd - 1] == 1) nd--;
    int o = snprintf(buf, n, "[");
    for (int i = 0; i < nd; i++) o += snprintf(buf + o, n - (size_t)o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    snprintf(buf + o, n - (size_t)o, "]");
}

/* Is tensor t of the file needed by a model holding layers [il0, il1)? */
static bool in_range(const struct bt_arch_tensor *e, const struct bt_hparams *h, int il0, int il1) {
    if (e->layer >= 0) return e->layer >= il0 && e->layer < il1;
    if (strcmp(e->name, "token_embd.weight") == 0) return il0 == 0 || (h->tied_output && il1 == h->n_layer);
    return il1 == h->n_layer; /* output_norm, output */
}

/* Every expected tensor of the file (names, shapes, types) into tt; the
 * count in *nt. */
static enum bt_status check_tensors(struct bt_gguf *g, const struct bt_arch *arch, const struct bt_hparams *h,
                                    struct bt_arch_tensor *tt, int *nt_out, char *err, size_t n_err) {
    const char *path = bt_gguf_path(g);
    struct bt_llm_globals gl_dummy;
    struct bt_llm_layer *ly_dummy = calloc((size_t)h->n_layer, sizeof *ly_dummy);
    if (!ly_dummy) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    const int nt = bt_arch_tensors(arch, h, &gl_dummy, ly_dummy, tt);
    free(ly_dummy);
    BT_ASSERT(nt <= bt_arch_max_tensors(h));
    *nt_out = nt;
    for (int i = 0; i < nt; i++) {
        const struct bt_arch_tensor *e = &tt[i];
        char want[96], have[96];
        shape_str(want, sizeof want, e->ne);
        const int64_t ti = bt_gguf_find_tensor(g, e->name);
        if (ti < 0) {
            if (!e->required) continue;
            return bt_error_printf(err, n_err, BT_ERR_INVALID, "%s: tensor \"%s\" is missing (expected %s)", path,
                                   e->name, want);
        }
        const struct bt_gguf_tensor *ft = bt_gguf_tensor(g, ti);
        shape_str(have, sizeof have, ft->ne);
        if (ft->ne[0] != e->ne[0] || ft->ne[1] != e->ne[1] || ft->ne[2] != e->ne[2] || ft->ne[3] != e->ne[3])
            return bt_error_printf(err, n_err, BT_ERR_INVALID, "%s: tensor \"%s\" has shape %s, expected %s", path,
                                   e->name, have, want);
        enum bt_type ty;
        if (bt_gguf_tensor_bt_type(g, ft, &ty) != BT_OK)
            return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED, "%s", bt_gguf_error(g));
        if (e->vector && ty != BT_TYPE_F32)
            return bt_error_printf(err, n_err, BT_ERR_UNSUPPORTED, "%s: tensor \"%s\" is %s; baton needs f32 for it",
                                   path, e->name, bt_type_name(ty));
    }
    return BT_OK;
}

enum bt_status bt_llm_check_gguf(struct bt_gguf *g, const struct bt_arch **arch, struct bt_hparams *h, char *err,
                                 size_t n_err) {
    enum bt_status st = bt_arch_read_hparams(g, arch, h, err, n_err);
    if (st != BT_OK) return st;
    struct bt_arch_tensor *tt = calloc((size_t)bt_arch_max_tensors(h), sizeof *tt);
    if (!tt) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    int nt = 0;
    st = check_tensors(g, *arch, h, tt, &nt, err, n_err);
    free(tt);
    return st;
}

uint64_t bt_llm_part_bytes(struct bt_gguf *g, const struct bt_hparams *h, int l) {
    if (l >= 0 && l < h->n_layer) return bt_gguf_layer_bytes(g, l);
    const char *names[3] = {"token_embd.weight", NULL, NULL};
    if (l >= h->n_layer) {
        names[0] = "output_norm.weight";
        names[1] = "output.weight";
        names[2] = h->tied_output ? "token_embd.weight" : NULL;
    }
    uint64_t n = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t ti = names[i] ? bt_gguf_find_tensor(g, names[i]) : -1;
        if (ti >= 0) n += bt_gguf_tensor(g, ti)->size;
    }
    return n;
}

/* Can t's bytes in the mapping be used in place (host memory, its type's
 * alignment)? */
static bool usable_in_place(struct bt_gguf *g, const struct bt_gguf_tensor *ft, bt_buffer_type_t buft) {
    const uintptr_t p = (uintptr_t)bt_gguf_tensor_data(g, ft);
    return buft == bt_cpu_buffer_type() && p % 32 == 0 && ft->size > 0;
}

/* A weight tensor for a file's tensor (its type, shape and name), no data. */
static struct bt_tensor *new_weight(bt_context *ctx, const struct bt_gguf_tensor *ft) {
    struct bt_tensor *t = bt_new_tensor(ctx, ft->type, 4, ft->ne);
    if (t) {
        bt_set_name(t, ft->name);
        bt_set_weight(t);
    }
    return t;
}

/* bt_llm_load_gguf, or with `describe` every tensor of every layer without
 * memory (bt_llm_describe_gguf). */
static enum bt_status load_range(struct bt_gguf *g, int il0, int il1, bt_buffer_type_t buft, bool in_place,
                                 bool describe, struct bt_llm **out, char *err, size_t n_err) {
    *out = NULL;
    const char *path = bt_gguf_path(g);
    if (!buft) buft = bt_cpu_buffer_type();
    struct bt_llm *m = calloc(1, sizeof *m);
    struct bt_arch_tensor *tt = NULL;
    int64_t *fidx = NULL; /* per entry of tt: its index in the file, -1: not this range's */
    enum bt_status st;
    if (!m) return bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
    st = bt_arch_read_hparams(g, &m->arch, &m->hp, err, n_err);
    if (st != BT_OK) goto done;
    const struct bt_hparams *h = &m->hp;
    if (il1 < 0) il1 = h->n_layer;
    if (il0 < 0 || il0 >= il1 || il1 > h->n_layer) {
        st = bt_error_printf(err, n_err, BT_ERR_INVALID, "%s: layer range [%d, %d) is not inside the model's %d layers",
                             path, il0, il1, h->n_layer);
        goto done;
    }
    m->il0 = il0;
    m->il1 = il1;
    m->layers = calloc((size_t)h->n_layer, sizeof *m->layers);
    tt = calloc((size_t)bt_arch_max_tensors(h), sizeof *tt);
    if (!m->layers || !tt) {
        st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
        goto done;
    }
    /* every expected tensor of the file, checked before anything is allocated */
    int nt = 0;
    st = check_tensors(g, m->arch, h, tt, &nt, err, n_err);
    if (st != BT_OK) goto done;
    fidx = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *fidx);
    if (!fidx) {
        st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
        goto done;
    }
    int n_mine = 0;
    for (int i = 0; i < nt; i++) {
        fidx[i] = in_range(&tt[i], h, il0, il1) ? bt_gguf_find_tensor(g, tt[i].name) : -1;
        if (fidx[i] >= 0) n_mine++;
    }
    /* the range's weights: metadata; bytes used in place from the mapping
     * where they can be, else copied into one buffer of buft */
    m->wctx = bt_init((struct bt_init_params){(size_t)(n_mine + 5) * bt_tensor_overhead() + 1024, NULL, true});
    if (!m->wctx) {
        st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "out of memory");
        goto done;
    }
    const int nt2 = bt_arch_tensors(m->arch, h, &m->gl, m->layers, tt);
    BT_ASSERT(nt2 == nt);
    size_t copied = 0;
    for (int i = 0; i < nt; i++) {
        const struct bt_arch_tensor *e = &tt[i];
        if (fidx[i] < 0) continue;
        const struct bt_gguf_tensor *ft = bt_gguf_tensor(g, fidx[i]);
        BT_ASSERT(strcmp(ft->name, e->name) == 0);
        struct bt_tensor *t = new_weight(m->wctx, ft);
        if (!t) {
            st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "%s: out of memory (tensor \"%s\")", path, e->name);
            goto done;
        }
        BT_ASSERT(ft->size == bt_nbytes(t));
        if (describe) {
            /* metadata only */
        } else if (in_place && usable_in_place(g, ft, buft)) {
            /* host memory in the mapping: the tensor points at it (read only) */
            t->data = (void *)bt_gguf_tensor_data(g, ft);
            t->buffer = NULL;
            m->mapped_bytes += ft->size;
        } else {
            copied += ft->size;
        }
        *e->slot = t;
        /* a described model's tied output projection is a tensor of its own,
         * as each rank that uses the embedding holds its own copy of it */
        if (describe && h->tied_output && e->slot == &m->gl.tok_embd && !(m->gl.output = new_weight(m->wctx, ft))) {
            st = bt_error_printf(err, n_err, BT_ERR_NOMEM, "%s: out of memory (tensor \"%s\")", path, e->name);
            goto done;
        }
    }
    if (copied > 0) {
        m->wbuf = bt_alloc_ctx_tensors_from_buft(m->wctx, buft);
        if (!m->wbuf) {
            st = bt_error_printf(err, n_err, BT_ERR_NOMEM,
                                 "%s: cannot allocate %zu bytes for the weights of layers [%d, %d)", path, copied, il0,
                                 il1);
            goto done;
        }
        for (int i = 0; i < nt; i++) {
            const struct bt_arch_tensor *e = &tt[i];
            struct bt_tensor *t = fidx[i] >= 0 ? *e->slot : NULL;
            if (!t || !t->buffer) continue;
            const struct bt_gguf_tensor *ft = bt_gguf_tensor(g, fidx[i]);
            bt_tensor_set(t, bt_gguf_tensor_data(g, ft), 0, ft->size); /* a weight buffer type may repack it */
            if (t->flags & BT_TENSOR_FLAG_REPACKED) m->repacked_bytes += ft->size;
            bt_gguf_tensor_release(g, ft);
        }
    }
    st = BT_OK;
done:
    free(tt);
    free(fidx);
    if (st != BT_OK) {
        bt_llm_free(m);
        return st;
    }
    *out = m;
    return BT_OK;
}

enum bt_status bt_llm_load_gguf(struct bt_gguf *g, int il0, int il1, bt_buffer_type_t buft, bool in_place,
                                struct bt_llm **out, char *err, size_t n_err) {
    return load_range(g, il0, il1, buft, in_place, false, out, err, n_err);
}

enum bt_status bt_llm_describe_gguf(struct bt_gguf *g, struct bt_llm **out, char *err, size_t n_err) {
    return load_range(g, 0, -1, NULL, false, true, out, err, n_err);
}

enum bt_status bt_llm_load(const char *path, int il0, int il1, struct bt_llm **out, char *err, size_t n_err) {
    *out = NULL;
    struct bt_gguf *g = NULL;
    enum bt_status st = bt_gguf_open(path, &g, err, n_err);
    if (st != BT_OK) return st;
    st = bt_llm_load_gguf(g, il0, il1, NULL, false, out, err, n_err);
    if (st != BT_OK) {
        bt_gguf_close(g);
        return st;
    }
    (*out)->own_gguf = g; /* the weights may point into its mapping */
    return BT_OK;
}

void bt_llm_free(struct bt_llm *m) {
    if (!m) return;
    bt_buffer_free(m->wbuf);
    bt_free(m->wctx);
    bt_gguf_close(m->own_gguf);
    free(m->layers);
    free(m);
}

const struct bt_hparams *bt_llm_hparams(const struct bt_llm *m) { return &m->hp; }
void bt_llm_range(const struct bt_llm *m, int *il0, int *il1) {
    *il0 = m->il0;
    *il1 = m->il1;
}
const struct bt_llm_layer *bt_llm_layer(const struct bt_llm *m, int il) {
    BT_ASSERT(il >= m->il0 && il < m->il1);
    return &m->layers[il];
}
size_t bt_llm_weight_bytes(const struct bt_llm *m) { return (m->wbuf ? bt_buffer_get_size(m->wbuf) : 0) + m->mapped_bytes; }
