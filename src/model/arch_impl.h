/* arch_impl.h - what arch.c (table, hyperparameters, tensors, loading) and
 * llm.c (graph, forward pass) share; not part of the public API. */
#ifndef BATON_ARCH_IMPL_H
#define BATON_ARCH_IMPL_H

#include "arch.h"

/* The hyperparameter readers' step: return a failing status as it is. */
#define TRY(x)                        \
    do {                              \
        enum bt_status st_ = (x);     \
        if (st_ != BT_OK) return st_; \
    } while (0)

struct bt_llm_globals {
    struct bt_tensor *tok_embd, *output_norm, *output;
};

/* One expected weight: name, shape (ne[0] first), whether the file must have
 * it, whether it is a vector (norm, bias: must be F32), and the pointer it
 * fills. */
struct bt_arch_tensor {
    char name[BT_GGUF_MAX_NAME];
    int64_t ne[4];
    int layer; /* -1: not a layer's */
    bool required, vector;
    struct bt_tensor **slot;
};

struct bt_llm {
    const struct bt_arch *arch;
    struct bt_hparams hp;
    int il0, il1;
    struct bt_llm_globals gl;
    struct bt_llm_layer *layers; /* n_layer entries; only [il0, il1) filled */
    bt_context *wctx;            /* no_alloc: weight metadata */
    bt_buffer_t wbuf;            /* the weights copied (NULL when every one is used in place) */
    size_t mapped_bytes;         /* weights used in place in the file's mapping */
    size_t repacked_bytes;       /* weights repacked for the CPU's matmul */
    struct bt_gguf *own_gguf;    /* bt_llm_load's file, closed with the model */
};

enum bt_status bt_arch_read_hparams(struct bt_gguf *g, const struct bt_arch **arch, struct bt_hparams *h, char *err,
                                    size_t n_err);
/* Fill t[] (bt_arch_max_tensors entries) with every expected weight; returns
 * the count. */
int bt_arch_tensors(const struct bt_arch *a, const struct bt_hparams *h, struct bt_llm_globals *gl,
                    struct bt_llm_layer *layers, struct bt_arch_tensor *t);
int bt_arch_max_tensors(const struct bt_hparams *h);

/* ---- an architecture with a builder of its own (gpt_oss.c, glm4moe.c, minimax_m2.c) ---- */
struct bt_arch_builder {
    /* takes rope.scaling.type "yarn" (the shared part reads its factor) */
    bool yarn;
    /* the keys beyond the shared ones, read after them into h */
    enum bt_status (*hparams)(struct bt_gguf *g, const char *arch, struct bt_hparams *h, char *err, size_t n_err);
    /* every expected weight, as bt_arch_tensors (at most
     * bt_arch_max_tensors) */
    int (*tensors)(const struct bt_hparams *h, struct bt_llm_globals *gl, struct bt_llm_layer *layers,
                   struct bt_arch_tensor *t);
    /* layer il's graph: x [n_embd, T] -> [n_embd, T]; NULL: llm.c's layer() */
    struct bt_tensor *(*layer)(bt_context *ctx, const struct bt_llm *m, struct bt_kv *kv, struct bt_tensor *x,
                               int il, const struct bt_llm_graph *gi);
};
/* The builder of architecture a; NULL: the shared one (arch.c, llm.c). */
const struct bt_arch_builder *bt_arch_builder_of(const struct bt_arch *a);
/* The new K and V rows [kd, T], [vd, T] of layer il into its cache at cells,
 * and the views [kd/heads, heads, n_kv], [vd/heads, heads, n_kv] of its first
 * n_kv cells the attention reads (llm.c; V inside K where the cache has no V). */
void bt_llm_cache_rw(bt_context *ctx, struct bt_kv *kv, int il, struct bt_tensor *k, struct bt_tensor *v,
                     struct bt_tensor *cells, int64_t n_kv, int64_t heads, struct bt_tensor **kc,
                     struct bt_tensor **vc);
extern const struct bt_arch_builder bt_gpt_oss_builder;
extern const struct bt_arch_builder bt_glm4moe_builder;
extern const struct bt_arch_builder bt_minimax_m2_builder;

/* For builders: {arch}.<what> as an integer in [lo, hi] or a number in
 * [lo, hi]; absent: def, or an error naming the key when def < 0 (NAN for
 * the number).  One expected weight into t[n]; returns n + 1 (layer < 0: a
 * global, fmt used as it is; slot: the pointer at slot_off in slot_owner). */
enum bt_status bt_arch_key_int(struct bt_gguf *g, const char *arch, const char *what, int64_t def, int64_t lo,
                               int64_t hi, int64_t *out, char *err, size_t n_err);
enum bt_status bt_arch_key_float(struct bt_gguf *g, const char *arch, const char *what, double def, double lo,
                                 double hi, float *out, char *err, size_t n_err);
/* DeepSeek-V3's routing keys (arch.c), shared with GLM-4.5: leading dense
 * layers, shared experts, the weights' scale and renormalising, the gating
 * (absent or 0: sigmoid when sigmoid_default, else softmax). */
enum bt_status bt_arch_read_routing(struct bt_gguf *g, const char *name, struct bt_hparams *h, bool sigmoid_default,
                                    char *err, size_t n_err);
int bt_arch_tensor_add(struct bt_arch_tensor *t, int n, void *slot_owner, size_t slot_off, int layer, const char *fmt,
                       int64_t ne0, int64_t ne1, int64_t ne2, bool required, bool vector);
/* Groups of expected weights into t from t[0] (the globals: token_embd,
 * output_norm, output unless tied; returns the count) or from t[n] (returns
 * n plus theirs): layer il's attention as the shared table has it (q, k, v,
 * output, the optional q/k/v biases, a's q/k norms), and its routed experts
 * with DeepSeek-V3's selection bias (ffn_gate_inp, exp_probs_b required,
 * ffn_{gate,up,down}_exps n_ff_exp wide). */
int bt_arch_global_tensors(const struct bt_hparams *h, struct bt_llm_globals *gl, struct bt_arch_tensor *t);
int bt_arch_attn_tensors(const struct bt_arch *a, const struct bt_hparams *h, struct bt_llm_layer *ly, int il,
                         struct bt_arch_tensor *t, int n);
int bt_arch_biased_experts(const struct bt_hparams *h, struct bt_llm_layer *ly, int il, struct bt_arch_tensor *t,
                           int n);

#endif
