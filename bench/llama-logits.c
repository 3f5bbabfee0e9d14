/* llama-logits.c - llama.cpp's logits for a list of token ids: the yardstick's side of an
 * architecture check (tests/model_ref.py writes the numpy side in the same layout).
 *
 *   llama-logits MODEL.gguf IDS OUT.bin [whole|single] [THREADS] [f16|f32]
 *
 * IDS is comma-separated token ids of one sequence at positions 0..n-1.  "whole" (the default)
 * decodes them as one batch, "single" one token at a time.  OUT.bin is int32 n_tokens, int32
 * n_vocab, int32 tokens[n_tokens], float32 logits[n_tokens][n_vocab].  The last argument:
 * f16 (the default) runs llama.cpp as it comes (an f16 KV cache, flash attention where it
 * chooses it); f32 runs an f32 cache and its attention without flash attention, for
 * comparisons at 1e-4: its CPU flash attention works in f16 (a tiny gpt-oss model's logits
 * 4.4e-4 from a float64 reference with it, 3e-7 without, both with an f32 cache).
 *
 * Built against a llama.cpp build by bench/llama-logits.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int fail(const char *what) {
    fprintf(stderr, "llama-logits: %s\n", what);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) return fail("usage: llama-logits MODEL.gguf IDS OUT.bin [whole|single] [THREADS] [f16|f32]");
    const int single = argc > 4 && strcmp(argv[4], "single") == 0;
    const int threads = argc > 5 ? atoi(argv[5]) : 1;
    if (argc > 6 && strcmp(argv[6], "f16") != 0 && strcmp(argv[6], "f32") != 0)
        return fail("KV type: f16 or f32");
    const int kv_f32 = argc > 6 && strcmp(argv[6], "f32") == 0;
    int32_t ids[4096];
    int n = 0;
    for (char *s = argv[2]; *s && n < 4096;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) return fail("IDS: not a comma-separated list of token ids");
        ids[n++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    if (n == 0) return fail("IDS: no token ids");
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return fail("llama.cpp could not load the model");
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n < 256 ? 256 : n + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)n;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = 1;
    if (kv_f32) {
        cp.type_k = cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return fail("llama.cpp could not make a context");
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    float *out = malloc((size_t)n * (size_t)n_vocab * sizeof(float));
    if (!out) return fail("out of memory");
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i0 = 0; i0 < n; i0 += single ? 1 : n) {
        const int m = single ? 1 : n;
        b.n_tokens = m;
        for (int i = 0; i < m; i++) {
            b.token[i] = ids[i0 + i];
            b.pos[i] = i0 + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        if (llama_decode(ctx, b) != 0) return fail("llama_decode failed");
        for (int i = 0; i < m; i++)
            memcpy(out + (size_t)(i0 + i) * (size_t)n_vocab, llama_get_logits_ith(ctx, i),
                   (size_t)n_vocab * sizeof(float));
    }
    FILE *f = fopen(argv[3], "wb");
    if (!f) return fail("cannot write OUT.bin");
    int32_t hdr[2] = {n, n_vocab};
    int ok = fwrite(hdr, sizeof hdr, 1, f) == 1 && fwrite(ids, sizeof(int32_t), (size_t)n, f) == (size_t)n &&
             fwrite(out, sizeof(float), (size_t)n * (size_t)n_vocab, f) == (size_t)n * (size_t)n_vocab;
    if (fclose(f) != 0 || !ok) return fail("writing OUT.bin failed");
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    free(out);
    return 0;
}
