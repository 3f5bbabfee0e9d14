/* quants.h - the block types beyond Q8_0 / Q4_0: their GGUF byte layouts
 * (ggml's block_q4_1 ... block_q8_K, block_iq4_nl ..., block_mxfp4, byte
 * for byte) and their row conversions to and from F32.
 *
 * Three families:
 *   - 32-element blocks: Q4_1, Q5_0, Q5_1 (one fp16 scale, and for the "_1"
 *     types an fp16 offset m: x = d * q + m);
 *   - 256-element super-blocks (the "K-quants"): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
 *     hold 8 or 16 sub-blocks, each with its own quantised scale (and for
 *     Q2_K, Q4_K, Q5_K a quantised min), the super-block an fp16 scale of the
 *     scales; Q8_K (float d, 256 int8, per-16 sums) is the activation format
 *     the K-quant dot products use;
 *   - the table types (below Q8_K): MXFP4, IQ4_NL, IQ4_XS, and the 1-3-bit
 *     lattice types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S.
 *
 * Dequantisation is bit-exact against ggml's dequantize_row_* and the gguf
 * Python package (quants.c is compiled without FMA contraction so that
 * d * q - m rounds twice, as they do).  Quantisation follows ggml's reference
 * quantisers (quantize_row_*_ref), K-quants with the same searches for the
 * sub-block scales (make_qkx2_quants, make_q3_quants, make_qx_quants);
 * IQ4_NL and IQ4_XS with the search of ggml's quantize_iq4_nl /
 * quantize_iq4_xs (what llama-quantize writes without an importance matrix),
 * MXFP4 as quantize_row_mxfp4_ref.
 */
#ifndef BATON_QUANTS_H
#define BATON_QUANTS_H

#include <string.h>

#include "baton/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BT_QK_K 256 /* elements per K-quant super-block */
#define BT_K_SCALE_SIZE 12

/* 20 bytes: x = d * q + m, q 0..15 (nibbles as Q4_0: j low, j+16 high) */
typedef struct {
    bt_fp16_t d;
    bt_fp16_t m;
    uint8_t qs[BT_QK / 2];
} bt_block_q4_1;

/* 22 bytes: x = d * (q - 16), q 0..31; bit j of qh (little-endian u32) is the
 * 5th bit of element j; the low 4 bits as Q4_0 */
typedef struct {
    bt_fp16_t d;
    uint8_t qh[4];
    uint8_t qs[BT_QK / 2];
} bt_block_q5_0;

/* 24 bytes: x = d * q + m, q 0..31, bits as Q5_0 */
typedef struct {
    bt_fp16_t d;
    bt_fp16_t m;
    uint8_t qh[4];
    uint8_t qs[BT_QK / 2];
} bt_block_q5_1;

/* 84 bytes: 16 sub-blocks of 16; scales[i] = scale (low nibble) | min (high);
 * x = d * sc * q - dmin * m, q 0..3.  qs: for each half (128 elements, 32
 * bytes), element 32*s + l of the half sits at bits 2s of byte l. */
typedef struct {
    uint8_t scales[BT_QK_K / 16];
    uint8_t qs[BT_QK_K / 4];
    bt_fp16_t d;
    bt_fp16_t dmin;
} bt_block_q2_K;

/* 110 bytes: 16 sub-blocks of 16, 6-bit signed scales (offset 32) packed in
 * 12 bytes; x = d * (sc - 32) * (q - 4 * !hbit), q's 2 low bits as Q2_K;
 * hmask: bit s of byte l is the high bit of element 32*s + l. */
typedef struct {
    uint8_t hmask[BT_QK_K / 8];
    uint8_t qs[BT_QK_K / 4];
    uint8_t scales[12];
    bt_fp16_t d;
} bt_block_q3_K;

/* 144 bytes: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes;
 * x = d * sc * q - dmin * m, q 0..15; byte l of 32-byte group g holds
 * element 64g + l (low nibble) and 64g + 32 + l (high nibble). */
typedef struct {
    bt_fp16_t d;
    bt_fp16_t dmin;
    uint8_t scales[BT_K_SCALE_SIZE];
    uint8_t qs[BT_QK_K / 2];
} bt_block_q4_K;

/* 176 bytes: as Q4_K with a 5th bit: bit 2g (2g+1) of qh[l] is the high bit
 * of element 64g + l (64g + 32 + l). */
typedef struct {
    bt_fp16_t d;
    bt_fp16_t dmin;
    uint8_t scales[BT_K_SCALE_SIZE];
    uint8_t qh[BT_QK_K / 8];
    uint8_t qs[BT_QK_K / 2];
} bt_block_q5_K;

/* 210 bytes: 16 sub-blocks of 16, int8 scales; x = d * sc * (q - 32), q
 * 0..63: low 4 bits in ql, high 2 bits in qh (per 128-element half: element
 * 32s + l has its low bits in ql[l + 32*(s&1)] >> 4*(s>>1), its high bits in
 * qh[l] >> 2s). */
typedef struct {
    uint8_t ql[BT_QK_K / 2];
    uint8_t qh[BT_QK_K / 4];
    int8_t scales[BT_QK_K / 16];
    bt_fp16_t d;
} bt_block_q6_K;

/* 292 bytes: activations for K-quant dot products; x = d * q, bsums[i] the
 * sum of q over elements 16i..16i+15. */
typedef struct {
    float d;
    int8_t qs[BT_QK_K];
    int16_t bsums[BT_QK_K / 16];
} bt_block_q8_K;

/* ---- the IQ types and MXFP4 (ggml's block_iq4_nl ... block_mxfp4) ----------
 * Values come from a fixed table, not a linear grid: IQ4_NL / IQ4_XS index 16
 * non-uniform int8 levels (bt_iq4nl_values); MXFP4 16 FP4 (E2M1) values
 * (doubled, bt_mxfp4_values) under a power-of-two scale; the 1-3-bit types
 * index lattices of 4 or 8 values (iq_grids.c) with separate signs. */

/* 17 bytes: e an E8M0 exponent; x = 2^(e-128) * v, v = bt_mxfp4_values[q]
 * (nibbles as Q4_0: element j low nibble of qs[j], j+16 high) */
typedef struct {
    uint8_t e;
    uint8_t qs[BT_QK / 2];
} bt_block_mxfp4;

/* 18 bytes: x = d * bt_iq4nl_values[q], nibbles as Q4_0 */
typedef struct {
    bt_fp16_t d;
    uint8_t qs[BT_QK / 2];
} bt_block_iq4_nl;

/* 136 bytes: 8 sub-blocks of 32 with 6-bit scales ls (low 4 bits in the
 * nibbles of scales_l, sub-block j at 4 (j % 2) of byte j / 2; high 2 bits at
 * 2j of scales_h); x = d * (ls - 32) * bt_iq4nl_values[q]; sub-block j's
 * nibbles in qs[16j .. 16j+15] as Q4_0's. */
typedef struct {
    bt_fp16_t d;
    uint16_t scales_h;
    uint8_t scales_l[BT_QK_K / 64];
    uint8_t qs[BT_QK_K / 2];
} bt_block_iq4_xs;

/* 66 bytes: per 32-element sub-block two u32 (qs[4s .. 4s+3] as u16): the
 * first the 4 grid indices (one byte each) of its groups of 8 elements, the
 * second four 7-bit sign indices (bits 7l) and the 4-bit scale ls (bits
 * 28..31); x = d (0.5 + ls) / 4 * grid * sign. */
typedef struct {
    bt_fp16_t d;
    uint16_t qs[BT_QK_K / 8];
} bt_block_iq2_xxs;

/* 74 bytes: per group of 8 a u16: 9-bit grid index, 7-bit sign index; scales
 * 4 bits per 16 elements (nibble 16-group j at 4 (j % 2) of byte j / 2). */
typedef struct {
    bt_fp16_t d;
    uint16_t qs[BT_QK_K / 8];
    uint8_t scales[BT_QK_K / 32];
} bt_block_iq2_xs;

/* 82 bytes: per group of 8 a 10-bit grid index (qs byte, 2 high bits from
 * qh: group g at 2 (g % 4) of qh[g / 4]) and 8 sign bits (signs[g]); scales
 * as IQ2_XS. */
typedef struct {
    bt_fp16_t d;
    uint8_t qs[BT_QK_K / 8];
    uint8_t signs[BT_QK_K / 8];
    uint8_t qh[BT_QK_K / 32];
    uint8_t scales[BT_QK_K / 32];
} bt_block_iq2_s;

/* 98 bytes: per group of 4 a byte grid index (qs[0..63]); then per
 * 32-element sub-block a u32: four 7-bit sign indices (each for 8
 * elements) and the scale ls in bits 28..31; x = d (0.5 + ls) / 2 * grid *
 * sign. */
typedef struct {
    bt_fp16_t d;
    uint8_t qs[3 * BT_QK_K / 8];
} bt_block_iq3_xxs;

/* 110 bytes: per group of 4 a 9-bit grid index (qs byte, the 9th bit bit
 * g % 8 of qh[g / 8]); a sign bit per element (signs[e / 8] bit e % 8);
 * 4-bit scales per 32 elements (nibbles as IQ2_XS); x = d (1 + 2 ls) *
 * grid * sign. */
typedef struct {
    bt_fp16_t d;
    uint8_t qs[BT_QK_K / 4];
    uint8_t qh[BT_QK_K / 32];
    uint8_t signs[BT_QK_K / 8];
    uint8_t scales[BT_QK_K / 64];
} bt_block_iq3_s;

/* 50 bytes: per group of 8 an 11-bit index (qs byte, 3 high bits at 3l of
 * its sub-block's qh) into a grid of -1, 0, 1; per 32-element sub-block qh
 * also holds the scale ls (bits 12..14) and the sign of delta (bit 15);
 * x = d (2 ls + 1) (grid + delta), delta = +-1/8. */
typedef struct {
    bt_fp16_t d;
    uint8_t qs[BT_QK_K / 8];
    uint16_t qh[BT_QK_K / 32];
} bt_block_iq1_s;

#define BT_IQ1S_DELTA 0.125f

/* the 16 levels of IQ4_NL and IQ4_XS; MXFP4's E2M1 values times 2 */
extern const int8_t bt_iq4nl_values[16];
extern const int8_t bt_mxfp4_values[16];
/* iq_grids.c: entry i's byte j is element j of lattice point i (int8) */
extern const uint64_t bt_iq2xxs_grid[256];
extern const uint64_t bt_iq2xs_grid[512];
extern const uint64_t bt_iq2s_grid[1024];
extern const uint32_t bt_iq3xxs_grid[256];
extern const uint32_t bt_iq3s_grid[512];
extern const uint64_t bt_iq1s_grid[2048];
/* IQ2's 8 sign bits from a 7-bit index (the 8th makes the parity even) */
extern const uint8_t bt_iq2_signs[128];

/* MXFP4's scale: 2^(e - 128) (E8M0 halved, as its values are doubled), as float bits (a constant
 * expression, for tables of it) and as a float */
#define BT_E8M0_HALF_BITS(e) ((e) < 2 ? 0x00200000u << (e) : (uint32_t)((e) - 1) << 23)
static inline float bt_e8m0_half(uint8_t e) {
    const uint32_t bits = BT_E8M0_HALF_BITS(e);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ggml's nearest_int: round to nearest, ties to even, for |f| < 2^22. */
static inline int bt_nearest_int(float f) {
    union { float f; int32_t i; } u;
    u.f = f + 12582912.f;
    return (u.i & 0x007fffff) - 0x00400000;
}

/* Row conversions (n a multiple of the type's block size); the type traits
 * in tensor.c point at these. */
void bt_q8_0_to_f32(const void *src, float *dst, int64_t n);
void bt_q8_0_from_f32(const float *src, void *dst, int64_t n);
void bt_q4_0_to_f32(const void *src, float *dst, int64_t n);
void bt_q4_0_from_f32(const float *src, void *dst, int64_t n);
void bt_q4_1_to_f32(const void *src, float *dst, int64_t n);
void bt_q4_1_from_f32(const float *src, void *dst, int64_t n);
void bt_q5_0_to_f32(const void *src, float *dst, int64_t n);
void bt_q5_0_from_f32(const float *src, void *dst, int64_t n);
void bt_q5_1_to_f32(const void *src, float *dst, int64_t n);
void bt_q5_1_from_f32(const float *src, void *dst, int64_t n);
void bt_q2_K_to_f32(const void *src, float *dst, int64_t n);
void bt_q2_K_from_f32(const float *src, void *dst, int64_t n);
void bt_q3_K_to_f32(const void *src, float *dst, int64_t n);
void bt_q3_K_from_f32(const float *src, void *dst, int64_t n);
void bt_q4_K_to_f32(const void *src, float *dst, int64_t n);
void bt_q4_K_from_f32(const float *src, void *dst, int64_t n);
void bt_q5_K_to_f32(const void *src, float *dst, int64_t n);
void bt_q5_K_from_f32(const float *src, void *dst, int64_t n);
void bt_q6_K_to_f32(const void *src, float *dst, int64_t n);
/* A Q6_K block's 256 6-bit values (0..63, element order) into its ql and
 * qh bytes. */
void bt_q6_K_pack(const uint8_t *v, uint8_t *ql, uint8_t *qh);
void bt_q6_K_from_f32(const float *src, void *dst, int64_t n);
void bt_q8_K_to_f32(const void *src, float *dst, int64_t n);
void bt_q8_K_from_f32(const float *src, void *dst, int64_t n);
void bt_mxfp4_to_f32(const void *src, float *dst, int64_t n);
void bt_mxfp4_from_f32(const float *src, void *dst, int64_t n);
void bt_iq4_nl_to_f32(const void *src, float *dst, int64_t n);
void bt_iq4_nl_from_f32(const float *src, void *dst, int64_t n);
void bt_iq4_xs_to_f32(const void *src, float *dst, int64_t n);
void bt_iq4_xs_from_f32(const float *src, void *dst, int64_t n);
/* the 1-3-bit IQ types: dequantisation only (quantising them well needs an
 * importance matrix; their traits have no from_float) */
void bt_iq2_xxs_to_f32(const void *src, float *dst, int64_t n);
void bt_iq2_xs_to_f32(const void *src, float *dst, int64_t n);
void bt_iq2_s_to_f32(const void *src, float *dst, int64_t n);
void bt_iq3_xxs_to_f32(const void *src, float *dst, int64_t n);
void bt_iq3_s_to_f32(const void *src, float *dst, int64_t n);
void bt_iq1_s_to_f32(const void *src, float *dst, int64_t n);

/* n elements (whole blocks) of random bytes of a lattice type, each block's
 * scale d in [scale / 2, scale): weights for tests and benchmarks of the
 * types baton does not quantise to.  *state: the generator's state
 * (xorshift64), advanced. */
void bt_row_random_blocks(enum bt_type t, void *dst, int64_t n, float scale, uint64_t *state);

/* IQ4_XS's 6-bit scale (0..63, offset 32) of sub-block j */
static inline int bt_iq4_xs_scale(const bt_block_iq4_xs *b, int j) {
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4);
}

/* The 6-bit scales and mins of a Q4_K / Q5_K block's 12 packed bytes q:
 * sub-block j (0..7) has sc[j], m[j].  Bytes 0..3 hold scales 0..3 (low 6
 * bits), 4..7 mins 0..3, 8..11 the low 4 bits of scales and mins 4..7, whose
 * high 2 bits are the top bits of bytes 0..7; four at a time, a word each. */
static inline void bt_q4_K_scales_mins(const uint8_t *q, uint8_t sc[8], uint8_t m[8]) {
    uint32_t u[3];
    memcpy(u, q, 12);
    const uint32_t sc_w[2] = {u[0] & 0x3f3f3f3fu, (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)};
    const uint32_t mn_w[2] = {u[1] & 0x3f3f3f3fu, ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)};
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(sc_w[j / 4] >> (8 * (j % 4)));
        m[j] = (uint8_t)(mn_w[j / 4] >> (8 * (j % 4)));
    }
}

/* The 16 signed scales (-32..31) of a Q3_K block's 12 packed bytes. */
static inline void bt_q3_K_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

#ifdef __cplusplus
}
#endif
#endif
