/* mpi_test_engine.c - a GGUF model over the ranks of a job (src/run/engine.h)
 * under mpiexec (1 to 4 ranks, and 8: ranks with no layer): logits bitwise
 * equal to the one-process bt_llm_ctx for a dense and a MoE model, for a
 * prompt in one ubatch, token by token with ubatches in flight, and several
 * sequences in flight at once; and the errors of open and submit.
 *
 * The models are tiny random-weight llama files rank 0 writes with baton's
 * GGUF writer (the tensors every architecture expects come from the
 * architecture table itself). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/arch_impl.h"
#include "mpi_testutil.h"
#include "run/engine.h"
#include "testutil.h"

static struct bt_rank R;
static char DIR_[256];

#define N_VOCAB 100
#define N_EMBD 64
#define N_LAYER 4

/* A llama model (moe: Mixtral-style, 4 experts, 2 used) with n_layer
 * layers, random weights from seed, written to path. */
static void write_model(const char *path, bool moe, int n_layer, uint64_t seed) {
    struct bt_gguf_writer *w = NULL;
    char err[512];
    ck_assert_msg(bt_gguf_writer_open(path, &w, err, sizeof err) == BT_OK, "%s", err);
    struct bt_hparams h;
    memset(&h, 0, sizeof h);
    h.n_layer = n_layer;
    h.n_embd = N_EMBD;
    h.n_head = 4;
    h.n_head_kv = 2;
    h.head_dim = h.head_dim_v = 16;
    h.n_ff = 96;
    h.n_vocab = N_VOCAB;
    h.n_expert = moe ? 4 : 0;
    h.n_expert_used = moe ? 2 : 0;
    h.n_ff_exp = moe ? 32 : 0;
    bt_gguf_writer_set_str(w, "general.architecture", "llama");
    bt_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)n_layer);
    bt_gguf_writer_set_u32(w, "llama.embedding_length", N_EMBD);
    bt_gguf_writer_set_u32(w, "llama.attention.head_count", 4);
    bt_gguf_writer_set_u32(w, "llama.attention.head_count_kv", 2);
    bt_gguf_writer_set_u32(w, "llama.feed_forward_length", 96);
    bt_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (moe) {
        bt_gguf_writer_set_u32(w, "llama.expert_count", 4);
        bt_gguf_writer_set_u32(w, "llama.expert_used_count", 2);
        bt_gguf_writer_set_u32(w, "llama.expert_feed_forward_length", 32);
    }
    const struct bt_arch *a = bt_arch_find("llama");
    struct bt_arch_tensor *tt = calloc((size_t)bt_arch_max_tensors(&h), sizeof *tt);
    struct bt_llm_layer *ly = calloc((size_t)n_layer, sizeof *ly);
    struct bt_llm_globals gl;
    const int nt = bt_arch_tensors(a, &h, &gl, ly, tt);
    float **data = calloc((size_t)nt, sizeof *data);
    tu_rng rng;
    tu_rng_init(&rng, seed);
    for (int i = 0; i < nt; i++) {
        if (!tt[i].required) continue; /* no biases */
        const int64_t n = tt[i].ne[0] * tt[i].ne[1] * tt[i].ne[2];
        data[i] = malloc((size_t)n * sizeof(float));
        for (int64_t j = 0; j < n; j++)
            data[i][j] = tt[i].vector ? tu_rng_f32(&rng, 0.8f, 1.2f) : tu_rng_f32(&rng, -0.3f, 0.3f);
        const int nd = tt[i].ne[2] > 1 ? 3 : tt[i].ne[1] > 1 ? 2 : 1;
        ck_assert(bt_gguf_writer_add_tensor(w, tt[i].name, bt_ggml_type_from_bt(BT_TYPE_F32), nd, tt[i].ne, data[i]) ==
                  BT_OK);
    }
    ck_assert_msg(bt_gguf_writer_finish(w, err, sizeof err) == BT_OK, "%s", err);
    for (int i = 0; i < nt; i++) free(data[i]);
    free(data);
    free(tt);
    free(ly);
}

/* Rank 0 makes the file; every rank gets its path. */
static void shared_model(char *path, size_t n, const char *name, bool moe, int n_layer, uint64_t seed) {
    snprintf(path, n, "%s/%s", DIR_, name);
    if (T->rank == 0 && access(path, R_OK) != 0) write_model(path, moe, n_layer, seed);
    ck_assert(T->iface.barrier(T) == BT_OK);
}

static struct bt_engine *open_engine(const char *path, int64_t n_ctx, int n_seq, int64_t n_ubatch, int inflight) {
    struct bt_engine_params p;
    bt_engine_default_params(&p);
    p.model = path;
    p.n_ctx = n_ctx;
    p.n_seq_max = n_seq;
    p.n_ubatch = n_ubatch;
    p.max_inflight = inflight;
    struct bt_engine *e = NULL;
    char err[1024] = "";
    ck_assert_msg(bt_engine_open(&R, &p, &e, err, sizeof err) == BT_OK, "%s", err);
    return e;
}

/* The one-process reference: every token's logits. */
static void reference(const char *path, int n_seq, const int32_t *tok, const int32_t *pos, const int32_t *seq, int n,
                      float *out) {
    struct bt_llm *m = NULL;
    char err[512];
    ck_assert_msg(bt_llm_load(path, 0, -1, &m, err, sizeof err) == BT_OK, "%s", err);
    struct bt_llm_ctx_params cp;
    bt_llm_ctx_default_params(&cp);
    cp.n_ctx = 128;
    cp.n_seq_max = n_seq;
    cp.n_ubatch = 64;
    cp.n_threads = 1;
    struct bt_llm_ctx *c = NULL;
    ck_assert_msg(bt_llm_ctx_new(m, &cp, &c, err, sizeof err) == BT_OK, "%s", err);
    int8_t *lg = malloc((size_t)n);
    memset(lg, 1, (size_t)n);
    struct bt_llm_batch b = {n, tok, pos, seq, lg};
    ck_assert_msg(bt_llm_decode(c, &b, out, err, sizeof err) == BT_OK, "%s", err);
    free(lg);
    bt_llm_ctx_free(c);
    bt_llm_free(m);
}

static void submit(struct bt_engine *e, int n, const int32_t *tok, const int32_t *pos, const int32_t *seq,
                   const int8_t *lg) {
    struct bt_llm_batch b = {n, tok, pos, seq, lg};
    uint64_t id;
    ck_assert_msg(bt_engine_submit(e, &b, &id) == BT_OK, "%s", bt_engine_error(e));
}

static void collect(struct bt_engine *e, uint64_t want_id, int64_t want_rows, float *out) {
    uint64_t id = 99999;
    int64_t n_out = -1;
    ck_assert_msg(bt_engine_collect(e, &id, out, &n_out) == BT_OK, "%s", bt_engine_error(e));
    ck_assert_int_eq(id, want_id);
    ck_assert_int_eq(n_out, want_rows);
}

/* The scenarios of one model, on rank 0; the other ranks serve. */
static void check_model(const char *name, bool moe, const int *counts) {
    char path[512];
    shared_model(path, sizeof path, name, moe, N_LAYER, moe ? 77 : 42);
    enum { NT = 12, NS = 3 };
    const size_t V = N_VOCAB, row = V * sizeof(float);
    int32_t tok[NT], pos[NT], seq0[NT];
    for (int i = 0; i < NT; i++) {
        tok[i] = (i * 37 + 11) % N_VOCAB;
        pos[i] = i;
        seq0[i] = 0;
    }

    /* one prompt in one ubatch, every row */
    R.layer_counts = (int *)counts;
    struct bt_engine *e = open_engine(path, 128, NS, 16, 0);
    R.layer_counts = NULL;
    int il0, il1;
    bt_engine_range(e, T->rank, &il0, &il1);
    ck_assert_int_ge(il0, 0);
    ck_assert_int_le(il1, N_LAYER);
    if (T->rank == 0) {
        /* the ranges tile the layers in rank order */
        int next = 0;
        for (int r = 0; r < bt_engine_n_ranks(e); r++) {
            bt_engine_range(e, r, &il0, &il1);
            if (il1 > il0) {
                ck_assert_int_eq(il0, next);
                next = il1;
            }
        }
        ck_assert_int_eq(next, N_LAYER);
        float *ref = malloc(NT * row), *got = malloc(NT * row);
        reference(path, NS, tok, pos, seq0, NT, ref);
        int8_t all[NT];
        memset(all, 1, sizeof all);
        submit(e, NT, tok, pos, seq0, all);
        collect(e, 0, NT, got);
        ck_assert_msg(memcmp(ref, got, NT * row) == 0, "%s on %d ranks: one ubatch differs from one process", name,
                      T->size);

        /* token by token in sequence 1, every ubatch submitted before any is
         * collected (the engine keeps max_inflight in the chain) */
        int32_t seq1[NT];
        for (int i = 0; i < NT; i++) seq1[i] = 1;
        for (int i = 0; i < NT; i++) submit(e, 1, tok + i, pos + i, seq1 + i, NULL);
        ck_assert_int_eq(bt_engine_n_inflight(e), NT);
        for (int i = 0; i < NT; i++) collect(e, 1 + (uint64_t)i, 1, got + (size_t)i * V);
        ck_assert_int_eq(bt_engine_n_inflight(e), 0);
        ck_assert_msg(memcmp(ref, got, NT * row) == 0, "%s on %d ranks: token by token differs from one process", name,
                      T->size);
        ck_assert_int_eq(bt_engine_seq_pos_max(e, 1), NT - 1);

        /* sequences 0 and 1 removed; three sequences in flight at once, one
         * ubatch each per step, collected in submission order */
        ck_assert(bt_engine_seq_rm(e, 0) == BT_OK);
        ck_assert(bt_engine_seq_rm(e, 1) == BT_OK);
        ck_assert_int_eq(bt_engine_seq_pos_max(e, 0), -1);
        int32_t st[NS][NT], ss[NS][NT];
        float *alone = malloc(NS * NT * row), *together = malloc(NS * NT * row);
        for (int s = 0; s < NS; s++) {
            for (int i = 0; i < NT; i++) {
                st[s][i] = (i * 13 + 7 * s + 3) % N_VOCAB;
                ss[s][i] = s;
            }
            reference(path, NS, st[s], pos, ss[s], NT, alone + (size_t)s * NT * V);
        }
        uint64_t id = 1 + NT;
        /* prompts of 5 in one ubatch each, then one token at a time */
        for (int s = 0; s < NS; s++) submit(e, 5, st[s], pos, ss[s], all);
        for (int s = 0; s < NS; s++) collect(e, id++, 5, together + ((size_t)s * NT) * V);
        for (int i = 5; i < NT; i++)
            for (int s = 0; s < NS; s++) submit(e, 1, &st[s][i], &pos[i], &ss[s][i], NULL);
        for (int i = 5; i < NT; i++)
            for (int s = 0; s < NS; s++) collect(e, id++, 1, together + ((size_t)s * NT + (size_t)i) * V);
        for (int s = 0; s < NS; s++)
            for (int i = 0; i < NT; i++)
                ck_assert_msg(memcmp(alone + ((size_t)s * NT + i) * V, together + ((size_t)s * NT + i) * V, row) == 0,
                              "%s on %d ranks: sequence %d token %d differs from one process", name, T->size, s, i);
        free(alone);
        free(together);
        free(ref);
        free(got);
        ck_assert(bt_engine_stop(e) == BT_OK);
    } else {
        ck_assert_msg(bt_engine_serve(e) == BT_OK, "%s", bt_engine_error(e));
    }
    struct bt_engine_stats *all = T->rank == 0 ? calloc((size_t)T->size, sizeof *all) : NULL;
    ck_assert(bt_engine_gather_stats(e, all) == BT_OK);
    if (T->rank == 0) {
        uint64_t tokens = 0;
        for (int r = 0; r < T->size; r++) {
            int a, b;
            bt_engine_range(e, r, &a, &b);
            if (b > a) {
                ck_assert_uint_gt(all[r].weight_bytes, 0);
                ck_assert_uint_gt(all[r].kv_bytes, 0);
                tokens = all[r].tokens;
            }
            ck_assert_uint_gt(all[r].peak_rss, 0);
        }
        ck_assert_uint_eq(tokens, NT + NT + NS * NT); /* every stage saw every token */
    }
    free(all);
    bt_engine_close(e);
}

START_TEST(test_dense_bitwise) { check_model("dense.gguf", false, NULL); }
END_TEST

START_TEST(test_moe_bitwise) { check_model("moe.gguf", true, NULL); }
END_TEST

/* a fixed partition in which rank 0 holds no layer: it only drives, stage 0
 * is rank 1 */
START_TEST(test_rank0_drives_only) {
    int counts[8] = {0};
    if (T->size == 1 || T->size > 8) return; /* one rank holds every layer */
    for (int l = 0; l < N_LAYER; l++) counts[1 + l % (T->size - 1)]++;
    check_model("dense.gguf", false, counts);
}
END_TEST

int main(int argc, char **argv) {
    struct bt_rank_config rc;
    memset(&rc, 0, sizeof rc);
    rc.prog = "mpi_test_engine";
    rc.threads = 1;
    if (bt_rank_init(&R, &rc, &argc, &argv) != BT_OK) {
        fprintf(stderr, "%s\n", R.error);
        return 1;
    }
    T = R.t;
    /* one directory for the job's files, named by rank 0 */
    if (T->rank == 0) {
        snprintf(DIR_, sizeof DIR_, "/tmp/bt_engine_XXXXXX");
        if (!mkdtemp(DIR_)) return 1;
    }
    T->iface.bcast(T, DIR_, sizeof DIR_, 0);
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_dense_bitwise);
    tcase_add_test(tc, test_moe_bitwise);
    tcase_add_test(tc, test_rank0_drives_only);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* MPI and fork() do not mix */
    srunner_run_all(sr, T->rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    int64_t f = failed;
    T->iface.allreduce_max(T, &f, 1);
    T->iface.barrier(T);
    if (T->rank == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
        if (system(cmd) != 0) f = 1;
    }
    T = NULL;
    bt_rank_free(&R);
    return f == 0 ? 0 : 1;
}
