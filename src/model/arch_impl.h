/* arch_impl.h - what arch.c (table, hyperparameters, tensors, loading) and
 * llm.c (graph, forward pass) share; not part of the public API. */
#ifndef BATON_ARCH_IMPL_H
#define BATON_ARCH_IMPL_H

#include "arch.h"

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

#endif
