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
 * Each refused node is printed (op, name, types); exit 1 if any.
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
    bt_llm_kv_config(m, 64, 2, kv_type, &kc);
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

int main(void) {
    static const char *archs[] = {"llama", "llama-moe", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "olmoe"};
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
    int bad = 0;
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
