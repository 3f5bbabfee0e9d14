/* test_attn.c - FLASH_ATTN (ops.h, backends/cpu/attn.c): against a plain
 * two-pass softmax reference in double (NMSE) for F32 / F16 / Q8_0 k and v,
 * grouped-query heads, F32 and F16 masks, fully masked rows, attention sinks
 * (with and without: the determinism checks run both); bitwise
 * determinism over thread counts, over the other query rows in the batch and
 * the row's position in it, and over where the unmasked cells sit in the
 * cache; every instruction-set variant the CPU has against the plain C one,
 * bitwise; a prompt's rows computed in blocks against the same rows decoded
 * one at a time over a growing cache, bitwise, in every variant; shares of
 * the q heads (a group's) against the whole, bitwise; the constructor's
 * shape errors. */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"
#include "testutil.h"

struct attn_case {
    int64_t D, Dv, H, Hk, N, T;
    enum bt_type kv_type, mask_type;
    bool with_mask;
    bool with_sinks; /* gpt-oss's sinks: one more logit per q head */
};

/* out[:, h, t] in double from dense logical-order arrays (k/v already
 * dequantised, as the kernel sees them) */
static void ref_attn(const struct attn_case *c, const float *q, const float *k, const float *v,
                     const float *mask, const float *sinks, float scale, float *out) {
    const int64_t group = c->H / c->Hk;
    double *s = malloc((size_t)c->N * sizeof *s);
    for (int64_t t = 0; t < c->T; t++) {
        for (int64_t h = 0; h < c->H; h++) {
            const int64_t hk = h / group;
            double mx = -INFINITY;
            for (int64_t j = 0; j < c->N; j++) {
                double d = 0;
                for (int64_t i = 0; i < c->D; i++)
                    d += (double)q[i + c->D * (h + c->H * t)] * k[i + c->D * (hk + c->Hk * j)];
                s[j] = d * scale + (mask ? mask[j + c->N * t] : 0.0);
                if (s[j] > mx) mx = s[j];
            }
            const bool any = mx != -INFINITY; /* a fully masked row is 0, sink or not */
            if (sinks && sinks[h] > mx) mx = sinks[h];
            double sum = sinks && any ? exp(sinks[h] - mx) : 0.0; /* the sink's share: no v */
            for (int64_t j = 0; j < c->N; j++) {
                s[j] = !any ? 0.0 : exp(s[j] - mx);
                sum += s[j];
            }
            for (int64_t i = 0; i < c->Dv; i++) {
                double a = 0;
                for (int64_t j = 0; j < c->N; j++) a += s[j] * v[i + c->Dv * (hk + c->Hk * j)];
                out[i + c->Dv * (h + c->H * t)] = sum > 0 ? (float)(a / sum) : 0.0f;
            }
        }
    }
    free(s);
}

/* mask values: 0, a small bias, or -inf (about a third), written as floats */
static void fill_mask(struct bt_tensor *m, tu_rng *r, int64_t N, int64_t T) {
    float *mv = malloc((size_t)N * T * sizeof *mv);
    for (int64_t i = 0; i < N * T; i++) {
        const int64_t u = tu_rng_int(r, 6);
        mv[i] = u < 2 ? -INFINITY : (u == 2 ? tu_rng_f32(r, -1.0f, 1.0f) : 0.0f);
    }
    tu_write_f32(m, mv);
    free(mv);
}

static void check_case(const struct attn_case *c, double tol) {
    bt_context *ctx = tu_ctx(16);
    tu_rng r;
    tu_rng_init(&r, 1000 + (uint64_t)(c->D * 7 + c->H * 5 + c->N * 3 + c->T + c->kv_type * 11));
    struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, c->D, c->H, c->T);
    struct bt_tensor *k = bt_new_tensor_3d(ctx, c->kv_type, c->D, c->Hk, c->N);
    struct bt_tensor *v = bt_new_tensor_3d(ctx, c->kv_type, c->Dv, c->Hk, c->N);
    struct bt_tensor *m = c->with_mask ? bt_new_tensor_2d(ctx, c->mask_type, c->N, c->T + 3) : NULL;
    tu_fill_uniform(q, &r, -2.0f, 2.0f);
    tu_fill(k, &r);
    tu_fill(v, &r);
    if (m) fill_mask(m, &r, c->N, c->T + 3);
    /* one row with every cell masked */
    if (m && c->T > 2)
        for (int64_t j = 0; j < c->N; j++) bt_set_f32_nd(m, j, 1, 0, 0, -INFINITY);
    struct bt_tensor *sk = c->with_sinks ? bt_new_tensor_1d(ctx, BT_TYPE_F32, c->H) : NULL;
    if (sk) tu_fill_uniform(sk, &r, -3.0f, 3.0f); /* some above the scores, some below */
    const float scale = 1.0f / sqrtf((float)c->D);
    struct bt_tensor *out = bt_flash_attn_ext(ctx, q, k, v, m, sk, scale);
    TU_OK(ctx, out);
    ck_assert_int_eq(out->ne[0], c->Dv);
    ck_assert_int_eq(out->ne[1], c->H);
    ck_assert_int_eq(out->ne[2], c->T);
    tu_compute(ctx, out, 2);

    float *qv = tu_read_f32(q), *kv = tu_read_f32(k), *vv = tu_read_f32(v);
    float *mv = m ? tu_read_f32(m) : NULL, *sv = sk ? tu_read_f32(sk) : NULL;
    float *ref = malloc((size_t)bt_nelements(out) * sizeof *ref);
    ref_attn(c, qv, kv, vv, mv, sv, scale, ref);
    const double e = tu_nmse_tensor(out, ref);
    ck_assert_msg(e <= tol, "D %lld H %lld/%lld N %lld T %lld %s: NMSE %g > %g", (long long)c->D,
                  (long long)c->H, (long long)c->Hk, (long long)c->N, (long long)c->T,
                  bt_type_name(c->kv_type), e, tol);
    if (m && c->T > 2) {
        float *o = tu_read_f32(out);
        for (int64_t i = 0; i < c->Dv * c->H; i++) ck_assert_msg(o[i + c->Dv * c->H] == 0.0f, "masked row");
        free(o);
    }
    free(qv);
    free(kv);
    free(vv);
    free(mv);
    free(sv);
    free(ref);
    bt_free(ctx);
}

START_TEST(test_against_reference) {
    const struct attn_case cases[] = {
        {16, 16, 4, 4, 9, 5, BT_TYPE_F32, BT_TYPE_F32, true, false},
        {64, 64, 8, 2, 37, 11, BT_TYPE_F16, BT_TYPE_F32, true, false},  /* GQA 4:1 */
        {32, 32, 6, 3, 50, 7, BT_TYPE_F16, BT_TYPE_F16, true, false},   /* F16 mask */
        {64, 32, 4, 1, 20, 3, BT_TYPE_Q8_0, BT_TYPE_F32, true, false},  /* MQA, Q8_0, Dv != D */
        {24, 40, 2, 2, 13, 4, BT_TYPE_F32, BT_TYPE_F32, false, false},  /* no mask */
        {128, 128, 4, 2, 300, 2, BT_TYPE_F16, BT_TYPE_F32, true, false}, /* long context */
        {64, 64, 8, 2, 37, 11, BT_TYPE_F16, BT_TYPE_F32, true, true},  /* sinks, GQA, a fully masked row */
        {16, 16, 4, 4, 9, 5, BT_TYPE_F32, BT_TYPE_F32, true, true},
        {24, 40, 2, 2, 13, 4, BT_TYPE_F32, BT_TYPE_F32, false, true}, /* sinks, no mask */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], 1e-10);
}
END_TEST

/* out (T rows) computed for a mask/q; returns the output bytes (malloc'd) */
static float *run_attn(bt_context *ctx, struct bt_tensor *q, struct bt_tensor *k, struct bt_tensor *v,
                       struct bt_tensor *m, struct bt_tensor *sk, int nth) {
    struct bt_tensor *out = bt_flash_attn_ext(ctx, q, k, v, m, sk, 0.125f);
    TU_OK(ctx, out);
    tu_compute(ctx, out, nth);
    float *o = malloc(bt_nbytes(out));
    memcpy(o, out->data, bt_nbytes(out));
    return o;
}

/* with_sinks: the same with a sink per head (the row's last step) */
static void bitwise_invariance(bool with_sinks) {
    const int64_t D = 64, H = 8, Hk = 2, N = 40, T = 9;
    bt_context *ctx = tu_ctx(32);
    tu_rng r;
    tu_rng_init(&r, 77);
    struct bt_tensor *sk = with_sinks ? bt_new_tensor_1d(ctx, BT_TYPE_F32, H) : NULL;
    if (sk) tu_fill_uniform(sk, &r, -2.0f, 2.0f);
    struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, D, H, T);
    struct bt_tensor *k = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, N);
    struct bt_tensor *v = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, N);
    struct bt_tensor *m = bt_new_tensor_2d(ctx, BT_TYPE_F32, N, T);
    tu_fill_uniform(q, &r, -3.0f, 3.0f);
    tu_fill(k, &r);
    tu_fill(v, &r);
    /* causal: row t sees cells 0 .. 30 + t */
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N; j++) bt_set_f32_nd(m, j, t, 0, 0, j <= 30 + t ? 0.0f : -INFINITY);
    float *base = run_attn(ctx, q, k, v, m, sk, 1);
    const size_t row = (size_t)D * H * sizeof(float);

    /* thread counts */
    for (int nth = 2; nth <= 4; nth++) {
        float *o = run_attn(ctx, q, k, v, m, sk, nth);
        ck_assert_msg(memcmp(o, base, row * T) == 0, "%d threads differ from 1", nth);
        free(o);
    }
    /* each row alone (T = 1), and in a batch in reverse order */
    struct bt_tensor *q1 = bt_new_tensor_3d(ctx, BT_TYPE_F32, D, H, 1);
    struct bt_tensor *m1 = bt_new_tensor_2d(ctx, BT_TYPE_F32, N, 1);
    struct bt_tensor *qr = bt_new_tensor_3d(ctx, BT_TYPE_F32, D, H, T);
    struct bt_tensor *mr = bt_new_tensor_2d(ctx, BT_TYPE_F32, N, T);
    for (int64_t t = 0; t < T; t++) {
        memcpy(q1->data, (char *)q->data + t * q->nb[2], row);
        memcpy(m1->data, (char *)m->data + t * m->nb[1], (size_t)N * 4);
        memcpy((char *)qr->data + (T - 1 - t) * qr->nb[2], (char *)q->data + t * q->nb[2], row);
        memcpy((char *)mr->data + (T - 1 - t) * mr->nb[1], (char *)m->data + t * m->nb[1], (size_t)N * 4);
        float *o = run_attn(ctx, q1, k, v, m1, sk, 3);
        ck_assert_msg(memcmp(o, (char *)base + t * row, row) == 0, "row %lld alone differs", (long long)t);
        free(o);
    }
    float *o = run_attn(ctx, qr, k, v, mr, sk, 2);
    for (int64_t t = 0; t < T; t++)
        ck_assert_msg(memcmp((char *)o + (T - 1 - t) * row, (char *)base + t * row, row) == 0,
                      "row %lld at position %lld differs", (long long)t, (long long)(T - 1 - t));
    free(o);

    /* the same cells spread over a bigger cache, masked cells between them
     * holding other values (another sequence's): cell j -> 2j + 1 */
    const int64_t N2 = 2 * N + 3;
    struct bt_tensor *k2 = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, N2);
    struct bt_tensor *v2 = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, N2);
    struct bt_tensor *m2 = bt_new_tensor_2d(ctx, BT_TYPE_F32, N2, T);
    tu_fill_uniform(k2, &r, -5.0f, 5.0f);
    tu_fill_uniform(v2, &r, -5.0f, 5.0f);
    for (int64_t j = 0; j < N; j++) {
        memcpy((char *)k2->data + (2 * j + 1) * k2->nb[2], (char *)k->data + j * k->nb[2], k->nb[2]);
        memcpy((char *)v2->data + (2 * j + 1) * v2->nb[2], (char *)v->data + j * v->nb[2], v->nb[2]);
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < N2; j++)
            bt_set_f32_nd(m2, j, t, 0, 0,
                          (j % 2 == 1 && j / 2 < N) ? bt_get_f32_nd(m, j / 2, t, 0, 0) : -INFINITY);
    o = run_attn(ctx, q, k2, v2, m2, sk, 4);
    ck_assert_msg(memcmp(o, base, row * T) == 0, "spread cells differ");
    free(o);
    free(base);
    bt_free(ctx);
}

START_TEST(test_bitwise_invariance) {
    bitwise_invariance(false);
    bitwise_invariance(true);
}
END_TEST

/* dst computed by one instruction-set variant with nth threads (run one
 * after another: the threads share nothing but the scratch buffer, each its
 * own slice); returns a malloc'd copy of the output */
static void run_isa_into(struct bt_tensor *dst, enum bt_cpu_attn_isa isa, int nth) {
    const size_t ws = bt_cpu_flash_attn_work_size(dst, nth);
    void *w = NULL;
    ck_assert_int_eq(posix_memalign(&w, 64, ws > 0 ? ws : 64), 0);
    for (int ith = 0; ith < nth; ith++) {
        volatile int status = 0;
        char errbuf[BT_CPU_ERRBUF];
        struct bt_cpu_params p = {.ith = ith, .nth = nth, .wdata = w, .wsize = ws,
                                  .status = &status, .errbuf = errbuf, .node = -1};
        bt_cpu_flash_attn_isa(&p, dst, isa);
    }
    free(w);
}

static float *run_isa(struct bt_tensor *dst, enum bt_cpu_attn_isa isa, int nth) {
    memset(dst->data, 0xff, bt_nbytes(dst)); /* NaN: an unwritten element shows */
    run_isa_into(dst, isa, nth);
    float *o = malloc(bt_nbytes(dst));
    memcpy(o, dst->data, bt_nbytes(dst));
    return o;
}

/* a case's q [D, H, T], k [D, Hk, N], v [Dv, Hk, N] and mask [N, T] (NULL
 * without one), unfilled */
static void case_tensors(bt_context *ctx, const struct attn_case *c, struct bt_tensor **q, struct bt_tensor **k,
                         struct bt_tensor **v, struct bt_tensor **m) {
    *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, c->D, c->H, c->T);
    *k = bt_new_tensor_3d(ctx, c->kv_type, c->D, c->Hk, c->N);
    *v = bt_new_tensor_3d(ctx, c->kv_type, c->Dv, c->Hk, c->N);
    *m = c->with_mask ? bt_new_tensor_2d(ctx, c->mask_type, c->N, c->T) : NULL;
}

/* the first index where a and b differ bitwise, -1 if none */
static int64_t first_diff(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return -1;
}

/* Shapes that reach every kernel's edges: D and Dv multiples of 16, of 8
 * only, of neither (the generic k tile, the masked and plain-C tails of the
 * accumulation); partial tiles (N not a multiple of 16); F32 / F16 / Q8_0
 * k and v; F16 masks; MQA and MHA; causal masks (even cases: whole tiles
 * every row sees) and random ones (odd cases), and no mask; scores large
 * enough that new maxima and exp's underflow to 0 occur inside tiles. */
START_TEST(test_isa_variants) {
    const struct attn_case cases[] = {
        {64, 64, 8, 2, 100, 37, BT_TYPE_F16, BT_TYPE_F32, true, false},
        {128, 128, 4, 2, 45, 6, BT_TYPE_F16, BT_TYPE_F16, true, false},
        {40, 24, 6, 3, 33, 5, BT_TYPE_F16, BT_TYPE_F32, true, false},
        {20, 72, 2, 1, 17, 9, BT_TYPE_F16, BT_TYPE_F32, true, false},
        {64, 96, 4, 4, 50, 3, BT_TYPE_F32, BT_TYPE_F32, true, false},
        {64, 64, 8, 1, 31, 4, BT_TYPE_Q8_0, BT_TYPE_F16, true, false},
        {32, 32, 2, 2, 16, 1, BT_TYPE_F16, BT_TYPE_F32, false, false},
        {48, 80, 8, 2, 90, 12, BT_TYPE_F16, BT_TYPE_F32, false, false},
        {64, 64, 8, 2, 100, 37, BT_TYPE_F16, BT_TYPE_F32, true, true}, /* sinks */
        {40, 24, 6, 3, 33, 5, BT_TYPE_F16, BT_TYPE_F32, true, true},
    };
    int n_variants = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const struct attn_case *c = &cases[ci];
        bt_context *ctx = tu_ctx(16);
        tu_rng r;
        tu_rng_init(&r, 500 + ci);
        struct bt_tensor *q, *k, *v, *m;
        case_tensors(ctx, c, &q, &k, &v, &m);
        /* case 6: scores within 1e-3 of each other (exp near 1) */
        tu_fill_uniform(q, &r, ci == 6 ? -0.002f : -6.0f, ci == 6 ? 0.002f : 6.0f);
        tu_fill_uniform(k, &r, -3.0f, 3.0f);
        tu_fill(v, &r);
        if (m && ci % 2 == 0) { /* causal over the last T of N cells: whole tiles unmasked */
            for (int64_t t = 0; t < c->T; t++)
                for (int64_t j = 0; j < c->N; j++)
                    bt_set_f32_nd(m, j, t, 0, 0, j <= c->N - c->T + t ? 0.0f : -INFINITY);
        } else if (m) {
            fill_mask(m, &r, c->N, c->T);
        }
        struct bt_tensor *sk = c->with_sinks ? bt_new_tensor_1d(ctx, BT_TYPE_F32, c->H) : NULL;
        if (sk) tu_fill_uniform(sk, &r, -4.0f, 4.0f);
        struct bt_tensor *out = bt_flash_attn_ext(ctx, q, k, v, m, sk, 1.0f / sqrtf((float)c->D));
        TU_OK(ctx, out);
        float *base = run_isa(out, BT_CPU_ATTN_C, 1);
        const int64_t n = bt_nelements(out);
        for (int64_t i = 0; i < n; i++) ck_assert_msg(!isnan(base[i]), "case %zu: element %lld unset", ci, (long long)i);
        for (int isa = 0; isa < BT_CPU_ATTN_ISA_COUNT; isa++) {
            if (!bt_cpu_attn_isa_available((enum bt_cpu_attn_isa)isa)) continue;
            if (ci == 0) n_variants++;
            for (int nth = 1; nth <= 3; nth += 2) {
                float *o = run_isa(out, (enum bt_cpu_attn_isa)isa, nth);
                const int64_t d = first_diff(o, base, n);
                ck_assert_msg(d < 0, "case %zu: %s with %d threads differs from c at %lld: %a vs %a", ci,
                              bt_cpu_attn_isa_name((enum bt_cpu_attn_isa)isa), nth, (long long)d, o[d < 0 ? 0 : d],
                              base[d < 0 ? 0 : d]);
                free(o);
            }
        }
        /* the graph path (the widest variant) agrees too */
        tu_compute(ctx, out, 2);
        ck_assert_msg(first_diff(out->data, base, n) < 0, "case %zu: the graph's result differs", ci);
        free(base);
        bt_free(ctx);
    }
#if defined(__x86_64__)
    /* this test is only worth its name where there is a SIMD variant */
    if (__builtin_cpu_supports("avx2")) ck_assert_int_ge(n_variants, 2);
#endif
    ck_assert_int_ge(n_variants, 1);
}
END_TEST

/* A prompt of T tokens at once (causal mask over N = T cells, rows in
 * blocks) against the same tokens decoded one at a time: token t alone (one
 * query row), over a cache of n_kv = t + 1 + pad cells whose cells past t hold
 * other values and are masked.  Bitwise, in every variant. */
START_TEST(test_prompt_equals_decode) {
    const int64_t D = 64, H = 8, Hk = 2, T = 70;
    bt_context *ctx = tu_ctx(32);
    tu_rng r;
    tu_rng_init(&r, 4242);
    struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, D, H, T);
    struct bt_tensor *k = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, T);
    struct bt_tensor *v = bt_new_tensor_3d(ctx, BT_TYPE_F16, D, Hk, T);
    struct bt_tensor *m = bt_new_tensor_2d(ctx, BT_TYPE_F32, T, T);
    tu_fill_uniform(q, &r, -5.0f, 5.0f);
    tu_fill_uniform(k, &r, -2.0f, 2.0f);
    tu_fill(v, &r);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < T; j++) bt_set_f32_nd(m, j, t, 0, 0, j <= t ? 0.0f : -INFINITY);
    struct bt_tensor *out = bt_flash_attn(ctx, q, k, v, m, 0.125f);
    TU_OK(ctx, out);
    const size_t row = (size_t)D * H * sizeof(float);
    for (int isa = 0; isa < BT_CPU_ATTN_ISA_COUNT; isa++) {
        if (!bt_cpu_attn_isa_available((enum bt_cpu_attn_isa)isa)) continue;
        const char *name = bt_cpu_attn_isa_name((enum bt_cpu_attn_isa)isa);
        float *whole = run_isa(out, (enum bt_cpu_attn_isa)isa, 1);
        float *whole2 = run_isa(out, (enum bt_cpu_attn_isa)isa, 2);
        ck_assert_msg(first_diff(whole, whole2, (int64_t)(row / 4) * T) < 0, "%s: 1 and 2 threads differ", name);
        free(whole2);
        for (int64_t t = 0; t < T; t++) {
            const int64_t pad = t % 5, n_kv = t + 1 + pad;
            bt_context *c1 = tu_ctx(4);
            struct bt_tensor *q1 = bt_new_tensor_3d(c1, BT_TYPE_F32, D, H, 1);
            struct bt_tensor *k1 = bt_new_tensor_3d(c1, BT_TYPE_F16, D, Hk, n_kv);
            struct bt_tensor *v1 = bt_new_tensor_3d(c1, BT_TYPE_F16, D, Hk, n_kv);
            struct bt_tensor *m1 = bt_new_tensor_2d(c1, BT_TYPE_F32, n_kv, 1);
            tu_fill_uniform(k1, &r, -9.0f, 9.0f); /* the cells past t: other values */
            tu_fill_uniform(v1, &r, -9.0f, 9.0f);
            memcpy(q1->data, (char *)q->data + t * q->nb[2], row);
            memcpy(k1->data, k->data, (size_t)(t + 1) * k->nb[2]);
            memcpy(v1->data, v->data, (size_t)(t + 1) * v->nb[2]);
            for (int64_t j = 0; j < n_kv; j++) bt_set_f32_nd(m1, j, 0, 0, 0, j <= t ? 0.0f : -INFINITY);
            struct bt_tensor *o1 = bt_flash_attn(c1, q1, k1, v1, m1, 0.125f);
            TU_OK(c1, o1);
            float *dec = run_isa(o1, (enum bt_cpu_attn_isa)isa, 1);
            const int64_t d = first_diff(dec, (float *)((char *)whole + t * row), (int64_t)(row / 4));
            ck_assert_msg(d < 0, "%s: token %lld decoded over %lld cells differs from the prompt at %lld", name,
                          (long long)t, (long long)n_kv, (long long)d);
            free(dec);
            bt_free(c1);
        }
        free(whole);
    }
    bt_free(ctx);
}
END_TEST

/* A group's share of the q heads (the node's row_lo/hi: dist.c's attention
 * chains): each share computes its heads and nothing else, and the shares
 * together are bitwise the whole, in every variant, with one and two
 * threads; GQA (shares of whole kv-head groups), MHA, MQA and MLA's shape
 * (one latent kv head of 576, v of 512: any range of heads), with sinks. */
START_TEST(test_head_shares) {
    const struct attn_case cases[] = {
        {64, 64, 8, 2, 100, 37, BT_TYPE_F16, BT_TYPE_F16, true, false},
        {32, 48, 4, 4, 40, 9, BT_TYPE_F32, BT_TYPE_F32, true, true},
        {64, 64, 6, 1, 50, 20, BT_TYPE_Q8_0, BT_TYPE_F32, true, false},
        {576, 512, 5, 1, 48, 33, BT_TYPE_F16, BT_TYPE_F16, true, false},
        {40, 24, 6, 3, 33, 5, BT_TYPE_F16, BT_TYPE_F32, true, true},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const struct attn_case *c = &cases[ci];
        bt_context *ctx = tu_ctx(32);
        tu_rng r;
        tu_rng_init(&r, 900 + ci);
        struct bt_tensor *q, *k, *v, *m;
        case_tensors(ctx, c, &q, &k, &v, &m);
        tu_fill_uniform(q, &r, -4.0f, 4.0f);
        tu_fill_uniform(k, &r, -2.0f, 2.0f);
        tu_fill(v, &r);
        for (int64_t t = 0; t < c->T; t++) /* causal over the last T cells */
            for (int64_t j = 0; j < c->N; j++) bt_set_f32_nd(m, j, t, 0, 0, j <= c->N - c->T + t ? 0.0f : -INFINITY);
        struct bt_tensor *sk = c->with_sinks ? bt_new_tensor_1d(ctx, BT_TYPE_F32, c->H) : NULL;
        if (sk) tu_fill_uniform(sk, &r, -4.0f, 4.0f);
        struct bt_tensor *out = bt_flash_attn_ext(ctx, q, k, v, m, sk, 1.0f / sqrtf((float)c->D));
        TU_OK(ctx, out);
        float *base = run_isa(out, BT_CPU_ATTN_C, 1);
        const int64_t n = bt_nelements(out), unit = c->Hk > 1 ? c->H / c->Hk : 1, n_units = c->H / unit;
        for (int isa = 0; isa < BT_CPU_ATTN_ISA_COUNT; isa++) {
            if (!bt_cpu_attn_isa_available((enum bt_cpu_attn_isa)isa)) continue;
            const char *name = bt_cpu_attn_isa_name((enum bt_cpu_attn_isa)isa);
            for (int nth = 1; nth <= 2; nth++) {
                memset(out->data, 0xff, bt_nbytes(out));
                /* the shares: the first unit, the next half of the rest, the others */
                const int64_t cut[4] = {0, 1, 1 + (n_units - 1) / 2, n_units};
                for (int s = 0; s < 3; s++) {
                    if (cut[s] == cut[s + 1]) continue;
                    out->row_lo = (int32_t)(cut[s] * unit);
                    out->row_hi = (int32_t)(cut[s + 1] * unit);
                    run_isa_into(out, (enum bt_cpu_attn_isa)isa, nth);
                    /* its heads written, the heads of the shares after it not yet */
                    for (int64_t i = 0; i < n; i++) {
                        const int64_t h = i / c->Dv % c->H;
                        const bool done = h < out->row_hi;
                        ck_assert_msg(done != isnan(((float *)out->data)[i]),
                                      "case %zu, %s, %d threads: heads [%d, %d): element %lld (head %lld) %s", ci,
                                      name, nth, out->row_lo, out->row_hi, (long long)i, (long long)h,
                                      done ? "unset" : "written");
                    }
                }
                out->row_lo = out->row_hi = 0;
                const int64_t d = first_diff(out->data, base, n);
                ck_assert_msg(d < 0, "case %zu, %s, %d threads: the shares differ from the whole at %lld: %a vs %a", ci,
                              name, nth, (long long)d, ((float *)out->data)[d < 0 ? 0 : d], base[d < 0 ? 0 : d]);
            }
        }
        free(base);
        bt_free(ctx);
    }
}
END_TEST

START_TEST(test_errors) {
    bt_context *ctx = tu_ctx(4);
    struct bt_tensor *q = bt_new_tensor_3d(ctx, BT_TYPE_F32, 16, 6, 3);
    struct bt_tensor *k = bt_new_tensor_3d(ctx, BT_TYPE_F16, 16, 4, 10);
    struct bt_tensor *v = bt_new_tensor_3d(ctx, BT_TYPE_F16, 16, 4, 10);
    bt_set_name(q, "q");
    bt_set_name(k, "k");
    ck_assert_ptr_null(bt_flash_attn(ctx, q, k, v, NULL, 1.0f));
    ck_assert_str_eq(bt_context_error(ctx), "FLASH_ATTN: q heads (6) must be a multiple of k heads (4)");
    bt_context_clear_error(ctx);

    struct bt_tensor *k2 = bt_new_tensor_3d(ctx, BT_TYPE_F16, 8, 2, 10);
    bt_set_name(k2, "k2");
    ck_assert_ptr_null(bt_flash_attn(ctx, q, k2, v, NULL, 1.0f));
    ck_assert_str_eq(bt_context_error(ctx),
                     "FLASH_ATTN: head sizes of q 'q'  [16, 6, 3, 1] and k 'k2'  [8, 2, 10, 1] differ");
    bt_context_clear_error(ctx);

    struct bt_tensor *k3 = bt_new_tensor_3d(ctx, BT_TYPE_F16, 16, 2, 10);
    struct bt_tensor *v3 = bt_new_tensor_3d(ctx, BT_TYPE_F16, 16, 2, 10);
    struct bt_tensor *m = bt_new_tensor_2d(ctx, BT_TYPE_F32, 10, 2);
    bt_set_name(m, "mask");
    ck_assert_ptr_null(bt_flash_attn(ctx, q, k3, v3, m, 1.0f));
    ck_assert_msg(strstr(bt_context_error(ctx), "FLASH_ATTN: mask 'mask'  [10, 2, 1, 1] does not fit") != NULL,
                  "%s", bt_context_error(ctx));
    bt_context_clear_error(ctx);

    struct bt_tensor *ki = bt_new_tensor_3d(ctx, BT_TYPE_I32, 16, 2, 10);
    ck_assert_ptr_null(bt_flash_attn(ctx, q, ki, v3, NULL, 1.0f));
    ck_assert_str_eq(bt_context_error(ctx), "FLASH_ATTN: k and v must be f32, f16 or q8_0, got i32 and f16");
    bt_context_clear_error(ctx);

    struct bt_tensor *sk = bt_new_tensor_1d(ctx, BT_TYPE_F32, 5);
    bt_set_name(sk, "sinks");
    ck_assert_ptr_null(bt_flash_attn_ext(ctx, q, k3, v3, NULL, sk, 1.0f));
    ck_assert_str_eq(bt_context_error(ctx),
                     "FLASH_ATTN: sinks 'sinks'  [5, 1, 1, 1] must be f32 [6] (one per q head of 'q'  [16, 6, 3, 1])");
    bt_context_clear_error(ctx);

    /* a NULL source keeps the earlier message */
    ck_assert_ptr_null(bt_flash_attn(ctx, NULL, k3, v3, NULL, 1.0f));

    /* well formed: GQA 6 over 2 */
    struct bt_tensor *out = bt_flash_attn(ctx, q, k3, v3, NULL, 1.0f);
    TU_OK(ctx, out);
    ck_assert(bt_op_is_well_formed(out));
    ck_assert(bt_cpu_supports_op(out));
    struct bt_tensor *sk6 = bt_new_tensor_1d(ctx, BT_TYPE_F32, 6);
    struct bt_tensor *with = bt_flash_attn_ext(ctx, q, k3, v3, NULL, sk6, 1.0f);
    TU_OK(ctx, with);
    ck_assert(bt_op_is_well_formed(with));
    with->src[4] = sk; /* a sink count that is not the q heads' */
    ck_assert(!bt_op_is_well_formed(with));
    out->src[2] = NULL; /* a hand-broken node is refused, not crashed on */
    ck_assert(!bt_op_is_well_formed(out));
    ck_assert(!bt_cpu_supports_op(out));
    bt_free(ctx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("attn");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_against_reference);
    tcase_add_test(tc, test_bitwise_invariance);
    tcase_add_test(tc, test_isa_variants);
    tcase_add_test(tc, test_prompt_equals_decode);
    tcase_add_test(tc, test_head_shares);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
