/* random_model.c - a random-weight model as a GGUF file (random_model.h).
 *
 * The tensors are the ones the architecture expects (bt_arch_tensors, the list
 * the loader checks against), with q/k/v biases for the qwen2 family and
 * glm4moe (without its optional q/k norms; minimax-m2 without its optional
 * biases); each
 * tensor's values come from its own stream (the seed and its name). */
#include "random_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../rng.h"
#include "arch_impl.h"

void bt_random_model_default(struct bt_random_model *m) {
    *m = (struct bt_random_model){
        .arch = "qwen3moe", .n_layer = 4, .n_embd = 128, .n_head = 4, .n_head_kv = 2, .head_dim = 32,
        .n_ff = 256, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 64, .n_swa = 32, .swa_pattern = 6,
        .n_ctx = 4096, .n_vocab = 256,
        .type = BT_TYPE_F32, .seed = 42,
    };
}

#define FAIL(...) return snprintf(err, n_err, __VA_ARGS__), BT_ERR_INVALID

/* the architectures whose random model rotates half of each head (GLM-4.5's
 * and MiniMax-M2's partial rotary) */
static bool half_rope(const struct bt_arch *a) {
    return bt_arch_builder_of(a) == &bt_glm4moe_builder || bt_arch_builder_of(a) == &bt_minimax_m2_builder;
}

enum bt_status bt_random_model_check(const struct bt_random_model *m, char *err, size_t n_err) {
    const struct bt_arch *a = m->arch ? bt_arch_find(m->arch) : NULL;
    if (!a) FAIL("--arch: '%s' is not one of %s", m->arch ? m->arch : "", bt_arch_names());
    if (m->n_layer < 1 || m->n_embd < 1 || m->n_head < 1 || m->n_head_kv < 1 || m->head_dim < 2 || m->n_ff < 1 ||
        m->n_ff_exp < 1 || m->n_ctx < 1 || m->n_vocab < 1 || m->n_expert < 0 || m->n_expert_used < 1 ||
        m->n_swa < 0 || m->swa_pattern < 1)
        FAIL("a size of the model is not positive");
    if (m->n_head % m->n_head_kv)
        FAIL("--heads %lld is not a multiple of --heads-kv %lld", (long long)m->n_head, (long long)m->n_head_kv);
    if (m->head_dim % 2) FAIL("--head-dim %lld: must be even (rotary pairs)", (long long)m->head_dim);
    if ((a->mla || half_rope(a)) && m->head_dim % 4)
        FAIL("--head-dim %lld: %s's rope part (half a head) must be even", (long long)m->head_dim, m->arch);
    if (a->moe == 1 && m->n_expert == 0) FAIL("--experts 0: %s is a MoE architecture", m->arch);
    if (bt_arch_builder_of(a) == &bt_gpt_oss_builder && m->n_swa == 0)
        FAIL("--swa 0: %s has sliding-window layers (its window is required)", m->arch);
    if (a->moe != 0 && m->n_expert && m->n_expert_used > m->n_expert)
        FAIL("--experts-used %lld is more than --experts %lld", (long long)m->n_expert_used, (long long)m->n_expert);
    if (!bt_type_can_quantize(m->type))
        FAIL("--type %s: baton cannot make weights of that type", bt_type_name(m->type));
    const int64_t blk = bt_blck_size(m->type);
    if (m->n_embd % blk || m->n_ff % blk || m->n_ff_exp % blk || (m->n_head * m->head_dim) % blk)
        FAIL("--type %s: --embd, --ff, --ff-exp and --heads x --head-dim must be multiples of %lld",
             bt_type_name(m->type), (long long)blk);
    return BT_OK;
}

/* a tensor's random stream: the seed and its name */
static void tensor_rng(bt_rng *r, uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    bt_rng_seed(r, seed ^ h);
}

/* The values of one tensor, as the tests' numpy models make them: embeddings
 * in [-1, 1), matrices scaled by 1.7 / sqrt(inputs), the router by 4 more,
 * norms around 1, biases around 0. */
static void fill(const struct bt_arch_tensor *e, uint64_t seed, float *v, int64_t n) {
    bt_rng r;
    tensor_rng(&r, seed, e->name);
    const bool norm = strstr(e->name, "norm") != NULL, bias = strstr(e->name, ".bias") != NULL;
    double scale = 1.7 / sqrt((double)e->ne[0]), around = 0;
    if (!strcmp(e->name, "token_embd.weight")) scale = 1.0;
    else if (norm) scale = 0.25, around = 1.0;
    else if (bias) scale = 0.5;
    else if (strstr(e->name, "ffn_gate_inp.weight")) scale *= 4;
    for (int64_t i = 0; i < n; i++) v[i] = (float)(around + scale * (2 * bt_rng_uniform(&r) - 1));
}

/* The vocabulary file's tokenizer.* keys into w; its token count in *n_vocab. */
static enum bt_status copy_vocab(struct bt_gguf_writer *w, struct bt_gguf *g, int64_t *n_vocab, char *err,
                                 size_t n_err) {
    const int64_t it = bt_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (it < 0 || bt_gguf_kv_value(g, it)->type != BT_GGUF_TYPE_ARRAY)
        FAIL("%s: no vocabulary (the array tokenizer.ggml.tokens is missing)", bt_gguf_path(g));
    *n_vocab = (int64_t)bt_gguf_kv_value(g, it)->n;
    for (int64_t i = 0; i < bt_gguf_n_kv(g); i++) {
        const char *k = bt_gguf_kv_key(g, i);
        if (strncmp(k, "tokenizer.", 10) != 0) continue;
        const enum bt_status st = bt_gguf_writer_set_value(w, k, g, bt_gguf_kv_value(g, i));
        if (st != BT_OK) return snprintf(err, n_err, "%s", bt_gguf_writer_error(w)), st;
    }
    return BT_OK;
}

static enum bt_status write_keys(const struct bt_random_model *m, const struct bt_arch *a,
                                 const struct bt_hparams *h, struct bt_gguf_writer *w) {
    char key[128];
#define SET_U32(what, v) (snprintf(key, sizeof key, "%s." what, m->arch), bt_gguf_writer_set_u32(w, key, (uint32_t)(v)))
    const bool moe = h->n_expert > 0;
    enum bt_status st = bt_gguf_writer_set_str(w, "general.architecture", m->arch);
    if (st == BT_OK) st = bt_gguf_writer_set_str(w, "general.name", "baton random-weight model");
    if (st == BT_OK) st = SET_U32("block_count", h->n_layer);
    if (st == BT_OK) st = SET_U32("context_length", m->n_ctx);
    if (st == BT_OK) st = SET_U32("embedding_length", h->n_embd);
    if (st == BT_OK) st = SET_U32("attention.head_count", h->n_head);
    if (st == BT_OK) st = SET_U32("attention.head_count_kv", h->n_head_kv);
    if (st == BT_OK) st = SET_U32("attention.key_length", h->head_dim);
    if (st == BT_OK) st = SET_U32("attention.value_length", h->head_dim_v);
    if (st == BT_OK) st = SET_U32("rope.dimension_count", h->n_rot);
    if (st == BT_OK && a->mla) st = SET_U32("attention.kv_lora_rank", h->n_lora_kv);
    if (st == BT_OK && a->mla) st = SET_U32("attention.q_lora_rank", h->n_lora_q);
    if (st == BT_OK && a->mla) st = SET_U32("attention.key_length_mla", h->head_dim_mla);
    if (st == BT_OK && a->mla) st = SET_U32("attention.value_length_mla", h->head_dim_v_mla);
    /* deepseek2's routing keys, which glm4moe shares; minimax-m2 has its gating function alone */
    const bool routing = a->mla || bt_arch_builder_of(a) == &bt_glm4moe_builder;
    const bool gating = routing || bt_arch_builder_of(a) == &bt_minimax_m2_builder;
    if (st == BT_OK && routing) st = SET_U32("leading_dense_block_count", h->n_layer_dense_lead);
    if (st == BT_OK && routing && moe) st = SET_U32("expert_shared_count", h->n_expert_shared);
    if (st == BT_OK && gating && moe) st = SET_U32("expert_gating_func", 2);
    /* minimax-m2's converter writes the experts' width here too */
    if (st == BT_OK) st = SET_U32("feed_forward_length", h->n_ff > 0 ? h->n_ff : m->n_ff);
    if (st == BT_OK && moe) st = SET_U32("expert_count", h->n_expert);
    if (st == BT_OK && moe) st = SET_U32("expert_used_count", h->n_expert_used);
    if (st == BT_OK && moe) st = SET_U32("expert_feed_forward_length", h->n_ff_exp);
    if (st == BT_OK && moe && a->shared_expert) st = SET_U32("expert_shared_feed_forward_length", h->n_ff_shexp);
    /* gpt-oss (a builder of its own) needs its window */
    const bool swa = a->swa || bt_arch_builder_of(a) == &bt_gpt_oss_builder;
    if (st == BT_OK && swa && m->n_swa > 0) st = SET_U32("attention.sliding_window", m->n_swa);
    if (st == BT_OK && swa && m->n_swa > 0) st = SET_U32("attention.sliding_window_pattern", m->swa_pattern);
#undef SET_U32
    snprintf(key, sizeof key, "%s.rope.freq_base", m->arch);
    if (st == BT_OK) st = bt_gguf_writer_set_f32(w, key, 10000.0f);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", m->arch);
    if (st == BT_OK) st = bt_gguf_writer_set_f32(w, key, 1e-6f);
    snprintf(key, sizeof key, "%s.expert_weights_scale", m->arch);
    if (st == BT_OK && routing && moe) st = bt_gguf_writer_set_f32(w, key, h->moe_w_scale);
    snprintf(key, sizeof key, "%s.expert_weights_norm", m->arch);
    if (st == BT_OK && routing && moe) st = bt_gguf_writer_set_bool(w, key, true);
    return st;
}

/* The keys and every tensor's entry; with data, then each tensor's values. */
static enum bt_status write_model(const struct bt_random_model *m, struct bt_gguf *vocab, bool data,
                                  struct bt_gguf_writer *w, char *err, size_t n_err) {
    enum bt_status st = bt_random_model_check(m, err, n_err);
    if (st != BT_OK) return st;
    const struct bt_arch *a = bt_arch_find(m->arch);
    const bool moe = a->moe != 0 && m->n_expert > 0;
    struct bt_hparams h = {
        .n_layer = m->n_layer, .n_embd = m->n_embd, .n_head = m->n_head, .n_head_kv = m->n_head_kv,
        .head_dim = m->head_dim, .head_dim_v = m->head_dim, .n_ff = moe ? 0 : m->n_ff, .n_vocab = m->n_vocab,
        .n_expert = moe ? m->n_expert : 0, .n_expert_used = moe ? m->n_expert_used : 0, .n_ff_exp = m->n_ff_exp,
        .n_ff_shexp = m->n_ff, .n_rot = (int)m->head_dim,
        .tied_output = bt_arch_builder_of(a) != &bt_gpt_oss_builder &&
                       bt_arch_builder_of(a) != &bt_minimax_m2_builder,
    }; /* a tied output, but for gpt-oss and minimax-m2, whose llama.cpp loaders need output.weight */
    if (a->mla) {
        /* DeepSeek-V3's proportions to a head of hd (V3: 128): rope hd/2,
         * kv rank 4 hd, q rank 12 hd; one latent KV head; the first layer
         * dense, then sigmoid routing renormalised, times 2.5, and one
         * shared expert as wide as a routed one */
        const int64_t hd = m->head_dim;
        h.n_rot = (int)(hd / 2);
        h.n_lora_kv = 4 * hd;
        h.n_lora_q = 12 * hd;
        h.head_dim_mla = hd + hd / 2;
        h.head_dim_v_mla = hd;
        h.n_head_kv = 1;
        h.head_dim = h.n_lora_kv + h.n_rot;
        h.head_dim_v = h.n_lora_kv;
        h.n_ff = m->n_ff;
        h.n_layer_dense_lead = moe && m->n_layer > 1 ? 1 : 0;
        if (!moe) h.n_layer_dense_lead = m->n_layer;
        h.n_expert_shared = 1;
        h.n_ff_shexp = m->n_ff_exp;
        h.moe_w_scale = 2.5f;
    }
    if (half_rope(a)) h.n_rot = (int)(m->head_dim / 2);
    if (bt_arch_builder_of(a) == &bt_glm4moe_builder) {
        /* GLM-4.5's form: the rope over half of each head, the first layer
         * dense, sigmoid routing renormalised and times 2.5, one shared
         * expert as wide as a routed one (no prediction layer) */
        h.n_ff = m->n_ff;
        h.n_layer_dense_lead = m->n_layer > 1 ? 1 : 0;
        h.n_expert_shared = 1;
        h.n_ff_shexp = m->n_ff_exp;
        h.moe_w_scale = 2.5f;
    }
    /* MiniMax-M2's form: the rope over half of each head (64 of 128), every
     * layer MoE with sigmoid routing renormalised, the experts' width in
     * feed_forward_length too */
    if (bt_arch_builder_of(a) == &bt_minimax_m2_builder) h.n_ff = m->n_ff_exp;
    if (vocab && (st = copy_vocab(w, vocab, &h.n_vocab, err, n_err)) != BT_OK) return st;
    if ((st = write_keys(m, a, &h, w)) != BT_OK) return snprintf(err, n_err, "%s", bt_gguf_writer_error(w)), st;

    /* the tensors the loader expects, with q/k/v biases for the qwen2 family and glm4moe */
    const bool biases = strncmp(m->arch, "qwen2", 5) == 0 || bt_arch_builder_of(a) == &bt_glm4moe_builder;
    const int n_max = bt_arch_max_tensors(&h);
    struct bt_llm_globals gl;
    struct bt_arch_tensor *tt = calloc((size_t)n_max, sizeof *tt);
    struct bt_llm_layer *layers = calloc((size_t)h.n_layer, sizeof *layers);
    bool *kept = calloc((size_t)n_max, sizeof *kept);
    if (!tt || !layers || !kept) {
        snprintf(err, n_err, "out of memory");
        st = BT_ERR_NOMEM;
        goto out;
    }
    const int n_all = bt_arch_tensors(a, &h, &gl, layers, tt);
    /* every tensor's entry first (the header), then each one's data, made
     * one at a time */
    for (int i = 0; i < n_all && st == BT_OK; i++) {
        const struct bt_arch_tensor *e = &tt[i];
        kept[i] = e->required || (biases && strstr(e->name, ".bias"));
        if (!kept[i]) continue;
        const bool mat = !e->vector && !strstr(e->name, "ffn_gate_inp");
        int nd = 4;
        while (nd > 1 && e->ne[nd - 1] == 1) nd--;
        st = bt_gguf_writer_add_tensor(w, e->name, bt_ggml_type_from_bt(mat ? m->type : BT_TYPE_F32), nd, e->ne, NULL);
        if (st != BT_OK) snprintf(err, n_err, "%s", bt_gguf_writer_error(w));
    }
    for (int i = 0; data && i < n_all && st == BT_OK; i++) {
        if (!kept[i]) continue;
        const struct bt_arch_tensor *e = &tt[i];
        const int64_t n = e->ne[0] * e->ne[1] * e->ne[2] * e->ne[3];
        const bool mat = !e->vector && !strstr(e->name, "ffn_gate_inp");
        const enum bt_type ty = mat ? m->type : BT_TYPE_F32;
        float *v = malloc((size_t)n * sizeof *v);
        const size_t bytes = bt_row_size(ty, n);
        void *d = ty == BT_TYPE_F32 ? (void *)v : malloc(bytes);
        if (!v || !d) {
            free(v);
            snprintf(err, n_err, "out of memory for %s", e->name);
            st = BT_ERR_NOMEM;
            break;
        }
        fill(e, m->seed, v, n);
        if (ty != BT_TYPE_F32) bt_row_from_f32(ty, v, d, n);
        st = bt_gguf_writer_write_data(w, d, bytes);
        if (st != BT_OK) snprintf(err, n_err, "%s", bt_gguf_writer_error(w));
        if (d != v) free(d);
        free(v);
    }
out:
    free(kept);
    free(tt);
    free(layers);
    return st;
}

enum bt_status bt_random_model_write(const struct bt_random_model *m, struct bt_gguf *vocab,
                                     struct bt_gguf_writer *w, char *err, size_t n_err) {
    return write_model(m, vocab, true, w, err, n_err);
}

enum bt_status bt_random_model_describe(const struct bt_random_model *m, struct bt_gguf **g, void **header,
                                        char *err, size_t n_err) {
    *g = NULL;
    *header = NULL;
    static const char name[] = "the built-in model";
    struct bt_gguf_writer *w = NULL;
    size_t size = 0;
    uint64_t file_size = 0;
    enum bt_status st = bt_gguf_writer_open_memory(name, &w, err, n_err);
    if (st == BT_OK && (st = write_model(m, NULL, false, w, err, n_err)) != BT_OK) bt_gguf_writer_close(w);
    else if (st == BT_OK) st = bt_gguf_writer_finish_header(w, header, &size, &file_size, err, n_err);
    if (st == BT_OK && (st = bt_gguf_open_header(*header, size, file_size, name, g, err, n_err)) != BT_OK) {
        free(*header);
        *header = NULL;
    }
    return st;
}

enum bt_status bt_random_model_open(const struct bt_random_model *m, int64_t max_bytes, struct bt_gguf **g,
                                    void **bytes, char *err, size_t n_err) {
    *g = NULL;
    *bytes = NULL;
    static const char name[] = "the built-in model";
    if (max_bytes > 0) {
        void *header = NULL;
        enum bt_status st = bt_random_model_describe(m, g, &header, err, n_err);
        if (st != BT_OK) return st;
        const uint64_t size = bt_gguf_file_size(*g);
        bt_gguf_close(*g);
        *g = NULL;
        free(header);
        if (size > (uint64_t)max_bytes)
            return bt_error_printf(err, n_err, BT_ERR_NOMEM,
                                   "%s is %.1f MiB, made in memory by every rank: more than the %.1f MiB a rank may "
                                   "use here; a smaller model, or --model FILE",
                                   name, (double)size / 1048576.0, (double)max_bytes / 1048576.0);
    }
    struct bt_gguf_writer *w = NULL;
    size_t size = 0;
    enum bt_status st = bt_gguf_writer_open_memory(name, &w, err, n_err);
    if (st == BT_OK && (st = bt_random_model_write(m, NULL, w, err, n_err)) != BT_OK) bt_gguf_writer_close(w);
    else if (st == BT_OK) st = bt_gguf_writer_finish_memory(w, bytes, &size, err, n_err);
    if (st == BT_OK && (st = bt_gguf_open_memory(*bytes, size, name, g, err, n_err)) != BT_OK) {
        free(*bytes);
        *bytes = NULL;
    }
    return st;
}
