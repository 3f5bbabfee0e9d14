/* test_cuda_support.c - the CUDA backend accepts every node of the
 * llama-family graphs the engine runs (needs no device: the support rules of
 * backends/cuda/supports.c are a function of the node alone).
 *
 * For each architecture of tests/model_ref.py (NORMAL and NEOX rope, q/k
 * norms, biases, MoE with and without renormalised top-k, a shared expert),
 * F32 and Q8_0 weights, each cache type the model allows (F16, F32, Q8_0
 * when the head sizes are whole blocks), one token and a
 * 7-token ubatch, and both the whole model and a later layer range: the
 * graph bt_llm_build_graph makes, every node through bt_cuda_op_supported.
 * Each refused node is printed (op, name, types); exit 1 if any.  Also:
 * Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K weights are accepted where the GPU reads
 * them (MUL_MAT, MUL_MAT_ID, GET_ROWS) and refused as a copy's ends.
 *
 *   test_cuda_support   (python3 with numpy and gguf writes the models) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_impl.h"
#include "kv.h"
#include "model/arch.h"

#ifndef BATON_SOURCE_DIR
#error "BATON_SOURCE_DIR must be defined"
#endif

static int g_graphs; /* graphs checked */

static int check_graph(const char *what, const struct bt_llm *m, enum bt_type kv_type, int64_t T) {
    char err[512];
    struct bt_kv_config kc;
    bt_llm_kv_config(m, 64, 2, 64, kv_type, &kc);
    if (bt_kv_check_config(&kc, err, sizeof err) != BT_OK) return 0; /* a cache no backend holds (a Q8_0 cache
                                                                        * of heads not whole blocks) */
    g_graphs++;
    struct bt_kv *kv = NULL;
    if (bt_kv_new(&kc, &kv, err, sizeof err) != BT_OK) {
        fprintf(stderr, "%s: cache: %s\n", what, err);
        return 1;
    }
    bt_context *ctx = bt_init((struct bt_init_params){bt_llm_graph_ctx_size(m), NULL, true});
    struct bt_llm_graph g;
    int bad = 0;
    if (!ctx || bt_llm_build_graph(m, kv, ctx, T, 32, T, &g) != BT_OK) {
        fprintf(stderr, "%s: graph: %s\n", what, ctx ? bt_context_error(ctx) : "no memory");
        bad = 1;
    }
    for (int i = 0; !bad && i < g.graph->n_nodes; i++) {
        const struct bt_tensor *n = g.graph->nodes[i];
        if (bt_cuda_op_supported(n)) continue;
        fprintf(stderr, "%s, cache %s, %lld tokens: CUDA refuses %s '%s' (%s", what, bt_type_name(kv_type),
                (long long)T, bt_op_name(n->op), n->name, bt_type_name(n->type));
        for (int s = 0; s < BT_MAX_SRC; s++)
            if (n->src[s]) fprintf(stderr, " <- %s", bt_type_name(n->src[s]->type));
        fprintf(stderr, ")\n");
        bad++;
    }
    bt_free(ctx);
    bt_kv_free(kv);
    return bad;
}

/* Weights of the types the GPU only reads (the K-quants but Q8_K, MXFP4 and
 * the IQ types): accepted as MUL_MAT's and MUL_MAT_ID's matrix and GET_ROWS'
 * table, refused as a copy's destination or source. */
static int check_read_only_types(void) {
    static const enum bt_type types[] = {BT_TYPE_Q4_1,    BT_TYPE_Q5_0,   BT_TYPE_Q5_1,   BT_TYPE_Q2_K,
                                         BT_TYPE_Q3_K,    BT_TYPE_Q4_K,   BT_TYPE_Q5_K,   BT_TYPE_Q6_K,
                                         BT_TYPE_MXFP4,   BT_TYPE_IQ4_NL, BT_TYPE_IQ4_XS, BT_TYPE_IQ2_XXS,
                                         BT_TYPE_IQ2_XS,  BT_TYPE_IQ2_S,  BT_TYPE_IQ3_XXS, BT_TYPE_IQ3_S,
                                         BT_TYPE_IQ1_S};
    int bad = 0;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        bt_context *ctx = bt_init((struct bt_init_params){1 << 20, NULL, true});
        struct bt_tensor *w = bt_new_tensor_2d(ctx, types[i], 512, 16);
        struct bt_tensor *we = bt_new_tensor_3d(ctx, types[i], 512, 16, 4);
        struct bt_tensor *x = bt_new_tensor_2d(ctx, BT_TYPE_F32, 512, 3);
        struct bt_tensor *ids = bt_new_tensor_2d(ctx, BT_TYPE_I32, 2, 3);
        struct bt_tensor *rows = bt_new_tensor_1d(ctx, BT_TYPE_I32, 5);
        struct bt_tensor *ok[3] = {bt_mul_mat(ctx, w, x),
                                   bt_mul_mat_id(ctx, we, bt_reshape_3d(ctx, x, 512, 1, 3), ids),
                                   bt_get_rows(ctx, w, rows)};
        struct bt_tensor *no[2] = {bt_cpy(ctx, x, bt_new_tensor_2d(ctx, types[i], 512, 3)),
                                   bt_cpy(ctx, bt_view_2d(ctx, w, 512, 3, w->nb[1], 0),
                                          bt_new_tensor_2d(ctx, BT_TYPE_F32, 512, 3))};
        for (int j = 0; j < 3; j++)
            if (!ok[j] || !bt_cuda_op_supported(ok[j])) {
                fprintf(stderr, "%s: CUDA refuses %s of its weights\n", bt_type_name(types[i]),
                        ok[j] ? bt_op_name(ok[j]->op) : bt_context_error(ctx));
                bad++;
            }
        for (int j = 0; j < 2; j++) /* (a lattice type has no quantiser: no copy into it is built at all) */
            if ((!no[j] && (j == 1 || bt_type_can_quantize(types[i]))) || (no[j] && bt_cuda_op_supported(no[j]))) {
                fprintf(stderr, "%s: CUDA accepts a copy %s it\n", bt_type_name(types[i]), j ? "from" : "into");
                bad++;
            }
        bt_free(ctx);
    }
    return bad;
}

int main(void) {
    static const char *archs[] = {"llama",  "llama-moe", "qwen2",    "qwen3",          "qwen2moe", "qwen3moe",
                                  "olmoe", "gemma3",    "deepseek2", "deepseek2-lite", "gpt-oss", "glm4moe", "minimax-m2"};
    static const char *wtypes[] = {"f32", "q8_0"};
    static const enum bt_type kv_types[] = {BT_TYPE_F16, BT_TYPE_F32, BT_TYPE_Q8_0};
    char dir[] = "/tmp/bt_cuda_support_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[128], ref[128];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    snprintf(ref, sizeof ref, "%s/ref.bin", dir);
    int bad = check_read_only_types();
    for (size_t a = 0; a < sizeof archs / sizeof *archs; a++)
        for (int w = 0; w < 2; w++) {
            char cmd[1024], what[96];
            snprintf(cmd, sizeof cmd, "python3 %s/tests/model_ref.py %s %s %s", BATON_SOURCE_DIR, archs[a], wtypes[w],
                     dir);
            if (system(cmd) != 0) {
                fprintf(stderr, "%s failed: python3 with numpy and gguf 0.19.0 is needed\n", cmd);
                bad++;
                continue;
            }
            for (int range = 0; range < 2; range++) { /* the whole model; layers [1, end) */
                char err[512];
                struct bt_llm *m = NULL;
                if (bt_llm_load(path, range, -1, &m, err, sizeof err) != BT_OK) {
                    fprintf(stderr, "%s %s: load: %s\n", archs[a], wtypes[w], err);
                    bad++;
                    continue;
                }
                snprintf(what, sizeof what, "%s %s layers [%d, end)", archs[a], wtypes[w], range);
                for (int k = 0; k < 3; k++) {
                    bad += check_graph(what, m, kv_types[k], 1);
                    bad += check_graph(what, m, kv_types[k], 7);
                }
                bt_llm_free(m);
            }
        }
    unlink(path);
    unlink(ref);
    rmdir(dir);
    printf("test_cuda_support: %d graphs, %d nodes refused\n", g_graphs, bad);
    return bad ? 1 : 0;
}
