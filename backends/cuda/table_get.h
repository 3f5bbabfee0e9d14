/* table_get.h - element j of a block of the table types (MXFP4, IQ4_NL,
 * IQ4_XS and the lattice types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S) as src/quants.c's bt_*_to_f32 gives it, bit for bit: the same
 * float operations in the same order, each rounded on its own.
 *
 * Written once for two compilers.  The CUDA kernels include it through
 * cuda_common.cuh, with the device's copies of the tables;
 * tests/test_cuda_tables.c compiles it for the CPU, with quants.c's tables,
 * and checks every element of random blocks against quants.c.  The includer
 * defines:
 *   BT_TG_FN          the functions' qualifiers
 *   BT_TG_MUL(a, b)   a * b rounded once (nvcc: __fmul_rn, never fused)
 *   BT_TG_ADD(a, b)   a + b rounded once
 *   BT_TG_H2F(h)      an IEEE half's bits as a float
 *   BT_TG_U2F(u)      a float's bits as a float
 *   BT_TG_TAB(name)   the table bt_name (bt_iq2xxs_grid, bt_iq2_signs, ...)
 * and includes quants.h first (the block layouts). */
#ifndef BATON_CUDA_TABLE_GET_H
#define BATON_CUDA_TABLE_GET_H

/* elements per block of a table type; 0 for any other type */
BT_TG_FN int bt_tg_blck(int type) {
    switch (type) {
        case BT_TYPE_MXFP4:
        case BT_TYPE_IQ4_NL: return BT_QK;
        case BT_TYPE_IQ4_XS:
        case BT_TYPE_IQ2_XXS:
        case BT_TYPE_IQ2_XS:
        case BT_TYPE_IQ2_S:
        case BT_TYPE_IQ3_XXS:
        case BT_TYPE_IQ3_S:
        case BT_TYPE_IQ1_S: return BT_QK_K;
        default: return 0;
    }
}

/* bytes per block of a table type; 0 for any other type */
BT_TG_FN int bt_tg_block_bytes(int type) {
    switch (type) {
        case BT_TYPE_MXFP4: return (int)sizeof(bt_block_mxfp4);
        case BT_TYPE_IQ4_NL: return (int)sizeof(bt_block_iq4_nl);
        case BT_TYPE_IQ4_XS: return (int)sizeof(bt_block_iq4_xs);
        case BT_TYPE_IQ2_XXS: return (int)sizeof(bt_block_iq2_xxs);
        case BT_TYPE_IQ2_XS: return (int)sizeof(bt_block_iq2_xs);
        case BT_TYPE_IQ2_S: return (int)sizeof(bt_block_iq2_s);
        case BT_TYPE_IQ3_XXS: return (int)sizeof(bt_block_iq3_xxs);
        case BT_TYPE_IQ3_S: return (int)sizeof(bt_block_iq3_s);
        case BT_TYPE_IQ1_S: return (int)sizeof(bt_block_iq1_s);
        default: return 0;
    }
}

/* nibble j (0..31) of 16 bytes in Q4_0's order: j low half of qs[j], j + 16 high */
BT_TG_FN int bt_tg_nibble(const uint8_t *qs, int j) { return j < BT_QK / 2 ? qs[j] & 0xF : qs[j - BT_QK / 2] >> 4; }

/* byte k of a lattice point, as a signed value */
BT_TG_FN float bt_tg_point(uint64_t entry, int k) { return (float)(int8_t)(uint8_t)(entry >> (8 * k)); }

/* (db * point) with sign bit k of signs */
BT_TG_FN float bt_tg_signed(float db, uint64_t entry, unsigned signs, int k) {
    const float v = BT_TG_MUL(db, bt_tg_point(entry, k));
    return (signs >> k) & 1 ? -v : v;
}

/* IQ2's and IQ3_XXS's sub-block scale: d (0.5 + ls) times 1/4 (IQ2) or 1/2 (IQ3_XXS) */
BT_TG_FN float bt_tg_half_scale(float d, unsigned ls, float f) {
    return BT_TG_MUL(BT_TG_MUL(d, BT_TG_ADD(0.5f, (float)ls)), f);
}

/* the 4-bit scale of 16-element group g (IQ2_XS, IQ2_S) or, with g = 2 sb, of 32-element sub-block sb */
BT_TG_FN unsigned bt_tg_scale4(const uint8_t *scales, int g) { return (scales[g / 4] >> (4 * ((g / 2) % 2))) & 0xF; }

/* a little-endian u32 from bytes (IQ3_XXS's scales and signs are 2-byte aligned) */
BT_TG_FN uint32_t bt_tg_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* MXFP4's scale 2^(e - 128): bt_e8m0_half */
BT_TG_FN float bt_tg_e8m0_half(uint8_t e) { return BT_TG_U2F(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23); }

BT_TG_FN float bt_tg_get_4bit(int type, const char *blk, int j) {
    if (type == BT_TYPE_MXFP4) {
        const bt_block_mxfp4 *b = (const bt_block_mxfp4 *)blk;
        return BT_TG_MUL(bt_tg_e8m0_half(b->e), (float)BT_TG_TAB(mxfp4_values)[bt_tg_nibble(b->qs, j)]);
    }
    if (type == BT_TYPE_IQ4_NL) {
        const bt_block_iq4_nl *b = (const bt_block_iq4_nl *)blk;
        return BT_TG_MUL(BT_TG_H2F(b->d), (float)BT_TG_TAB(iq4nl_values)[bt_tg_nibble(b->qs, j)]);
    }
    const bt_block_iq4_xs *b = (const bt_block_iq4_xs *)blk;
    const int ib = j / 32;
    const int ls = ((b->scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b->scales_h >> (2 * ib)) & 3) << 4);
    const float dl = BT_TG_MUL(BT_TG_H2F(b->d), (float)(ls - 32));
    return BT_TG_MUL(dl, (float)BT_TG_TAB(iq4nl_values)[bt_tg_nibble(b->qs + 16 * ib, j % 32)]);
}

BT_TG_FN float bt_tg_get_iq2(int type, const char *blk, int j) {
    const int g = j / 8, k = j % 8;
    if (type == BT_TYPE_IQ2_XXS) {
        const bt_block_iq2_xxs *b = (const bt_block_iq2_xxs *)blk;
        const int ib = j / 32, l = (j % 32) / 8;
        const uint32_t idx = (uint32_t)b->qs[4 * ib] | (uint32_t)b->qs[4 * ib + 1] << 16;
        const uint32_t sg = (uint32_t)b->qs[4 * ib + 2] | (uint32_t)b->qs[4 * ib + 3] << 16;
        const float db = bt_tg_half_scale(BT_TG_H2F(b->d), sg >> 28, 0.25f);
        return bt_tg_signed(db, BT_TG_TAB(iq2xxs_grid)[(idx >> (8 * l)) & 0xFF],
                            BT_TG_TAB(iq2_signs)[(sg >> (7 * l)) & 127], k);
    }
    if (type == BT_TYPE_IQ2_XS) {
        const bt_block_iq2_xs *b = (const bt_block_iq2_xs *)blk;
        const float db = bt_tg_half_scale(BT_TG_H2F(b->d), bt_tg_scale4(b->scales, g), 0.25f);
        return bt_tg_signed(db, BT_TG_TAB(iq2xs_grid)[b->qs[g] & 511], BT_TG_TAB(iq2_signs)[b->qs[g] >> 9], k);
    }
    const bt_block_iq2_s *b = (const bt_block_iq2_s *)blk;
    const float db = bt_tg_half_scale(BT_TG_H2F(b->d), bt_tg_scale4(b->scales, g), 0.25f);
    const int idx = b->qs[g] | (((b->qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
    return bt_tg_signed(db, BT_TG_TAB(iq2s_grid)[idx], b->signs[g], k);
}

BT_TG_FN float bt_tg_get_iq3_iq1(int type, const char *blk, int j) {
    if (type == BT_TYPE_IQ3_XXS) {
        const bt_block_iq3_xxs *b = (const bt_block_iq3_xxs *)blk;
        const int ib = j / 32, l = (j % 32) / 8, half = (j % 8) / 4;
        const uint32_t sg = bt_tg_u32(b->qs + BT_QK_K / 4 + 4 * ib);
        const float db = bt_tg_half_scale(BT_TG_H2F(b->d), sg >> 28, 0.5f);
        const unsigned s = BT_TG_TAB(iq2_signs)[(sg >> (7 * l)) & 127];
        return bt_tg_signed(db, BT_TG_TAB(iq3xxs_grid)[b->qs[8 * ib + 2 * l + half]], half ? s >> 4 : s & 0xF, j % 4);
    }
    if (type == BT_TYPE_IQ3_S) {
        const bt_block_iq3_s *b = (const bt_block_iq3_s *)blk;
        const int q = j / 4;
        const float db = BT_TG_MUL(BT_TG_H2F(b->d), (float)(1 + 2 * (int)bt_tg_scale4(b->scales, 2 * (q / 8))));
        const int idx = b->qs[q] | (((b->qh[q / 8] >> (q % 8)) & 1) << 8);
        const unsigned s = (uint8_t)(b->signs[q / 2] >> (4 * (q % 2)));
        return bt_tg_signed(db, BT_TG_TAB(iq3s_grid)[idx], s & 0xF, j % 4);
    }
    const bt_block_iq1_s *b = (const bt_block_iq1_s *)blk;
    const int ib = j / 32, l = (j % 32) / 8;
    const unsigned qh = b->qh[ib];
    const float dl = BT_TG_MUL(BT_TG_H2F(b->d), (float)(2 * ((qh >> 12) & 7) + 1));
    const float delta = qh & 0x8000 ? -BT_IQ1S_DELTA : BT_IQ1S_DELTA;
    const uint64_t e = BT_TG_TAB(iq1s_grid)[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
    return BT_TG_MUL(dl, BT_TG_ADD(bt_tg_point(e, j % 8), delta));
}

/* element j of a block of a table type (0 for any other type) */
BT_TG_FN float bt_tg_get(int type, const char *blk, int j) {
    switch (type) {
        case BT_TYPE_MXFP4:
        case BT_TYPE_IQ4_NL:
        case BT_TYPE_IQ4_XS: return bt_tg_get_4bit(type, blk, j);
        case BT_TYPE_IQ2_XXS:
        case BT_TYPE_IQ2_XS:
        case BT_TYPE_IQ2_S: return bt_tg_get_iq2(type, blk, j);
        case BT_TYPE_IQ3_XXS:
        case BT_TYPE_IQ3_S:
        case BT_TYPE_IQ1_S: return bt_tg_get_iq3_iq1(type, blk, j);
        default: return 0.0f;
    }
}

#endif
