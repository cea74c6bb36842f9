/* AVX-512 with AVX512_BF16 (Cooper Lake, Sapphire Rapids and newer, Zen 4 and newer): decode
 * attention over bf16 q and bf16 KV with the bf16 dot-product instruction (vdpbf16ps: 32
 * products a zmm, summed in pairs into 16 fp32 lanes). Everything else takes the plain
 * AVX-512 item (dp_attn_item_avx512bf16 at the end says which).
 *
 *   QK: the q and K rows go straight in, no widening (the products are exact in fp32); the
 *       scale is applied to the reduced scores.
 *   PV: pairs run along the tokens: two V rows interleaved (unpacklo/hi_epi16) times the
 *       two tokens' probabilities as a bf16 pair. They are rounded to bf16 as FlashAttention
 *       rounds P before its PV MMA: at most a relative 2^-8 per weight, which moves the output
 *       by at most 2^-8 * max|v|, the size of its own rounding to bf16 (the output is q's
 *       dtype, bf16). l
 *       sums the fp32 probabilities. The accumulators are in the unpack's lane order per
 *       32-element chunk ("pv order": unpacklo puts elements 8L + e, e < 4, of 128-bit lane
 *       L in lane 4L + e of the chunk's first 16 floats, unpackhi elements 8L + 4 + e in the
 *       same lane of the next 16) and go back to natural order once per item.
 * Per (token, KV head) at G = 8, D = 128 the fp32 route spends 128 FMAs plus the widening of
 * every K and V chunk; this one 64 dot products. Measured on a Zen 5 from DRAM (32 x 1k
 * tokens, 2 threads, against the AVX-512 item, head dims 64/96/128 x blocks 16/64, two
 * runs): G = 8 1.12-1.31x (one 0.97), G = 4 0.89-1.17x, G = 2 0.90-1.10x, G = 1 0.9x; so it
 * takes groups of 8 or more, where the FMA route is compute-bound, on a CPU whose dot
 * products issue at 0.75 of its FMA rate or more (dp_set_bf16_dot from the Python probe;
 * an Intel Xeon with AMX measured 0.25 and the route 0.75-0.90x the FMA route there).
 * An fp32 q (the serving case: fp32 activations over bf16 KV) would need q and the
 * probabilities in two bf16 parts each (hi + lo) to keep fp32 precision; twice the dot
 * products measured 0.97-1.09x at G = 2-8, so it takes the AVX-512 item.
 * Everything else (the item over a range of KV heads, the online softmax per block, the
 * prefetch of the next block, m / l / acc per segment for the driver's merge) is as in
 * attention_body.h. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")
#include "avx512_vec.h"
#include "attention_simd.h"

#define BF_CH DP_BF16_DOT_CHUNK  /* bf16 elements a chunk: one zmm, one cache line */
#define BF_QK_GT 4  /* the most heads in one QK tile, as QK_GT */
#define BF_PV_ACC 16  /* PV accumulators a pass: 2 (lo / hi) per head and chunk */

/* s[t*ss + g] = scale * the lane sum of acc[t][g], t < TT, g < G, TT * G <= 16 (scores
 * token-major, ss the whole group's size): one tree, then one masked store, or one a token
 * when the tile holds a slice of the group. */
static inline __attribute__((always_inline)) void vstore_scores(
    const VEC *flat, int TT, int G, float scale, float *s, int ss) {
    const __m512 r = _mm512_mul_ps(vreduce_many_v(flat, TT * G), _mm512_set1_ps(scale));
    if (G == ss) {
        _mm512_mask_storeu_ps(s, lanes_below(TT * G), r);
        return;
    }
    for (int t = 0; t < TT; t++)  /* lanes t*G.. land at s + t*ss */
        _mm512_mask_storeu_ps(s + t * (ss - G), (__mmask16)(((1u << G) - 1u) << (t * G)), r);
}
/* s[t*ss + g] = scale * <q head g, k[t]> for a tile of TT keys and G heads. q is bf16,
 * chunk-major: chunk c of head g at q[c * qs + g * BF_CH]. */
static inline __attribute__((always_inline)) void qk_tile_bf(
    const uint16_t *q, int qs, const char *k, int64_t row, int nch, int G, int TT, float *s,
    int ss, float scale, int pf, int64_t nxt) {
    VEC acc[4][BF_QK_GT];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = vzero();
    const uint16_t *qc = q;
    const char *kc = k;
    for (int c = 0; c < nch; c++, qc += qs, kc += BF_CH * 2) {
        __m512i kv[4];
        for (int t = 0; t < TT; t++) {
            if (pf) prefetch_next(kc + t * row, nxt);
            kv[t] = _mm512_loadu_si512(kc + t * row);
        }
        for (int g = 0; g < G; g++) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(qc + g * BF_CH);
            for (int t = 0; t < TT; t++)
                acc[t][g] = _mm512_dpbf16_ps(acc[t][g], qv, (__m512bh)kv[t]);
        }
    }
    VEC flat[4 * BF_QK_GT];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) flat[t * G + g] = acc[t][g];
    vstore_scores(flat, TT, G, scale, s, ss);
}

static inline __attribute__((always_inline)) void qk_block_bf(
    const uint16_t *q, const char *k, int64_t row, int n, int nch, int G, float *s,
    float scale, int64_t nxt) {
    for (int g0 = 0; g0 < G; g0 += BF_QK_GT) {
        const int gn = G - g0 < BF_QK_GT ? G - g0 : BF_QK_GT, TT = QK_TT(gn);
        const uint16_t *qg = q + g0 * BF_CH;
        int t = 0;
        for (; t + TT <= n; t += TT)
            qk_tile_bf(qg, G * BF_CH, k + t * row, row, nch, gn, TT, s + t * G + g0, G,
                       scale, g0 == 0, nxt);
        for (; t < n; t++)
            qk_tile_bf(qg, G * BF_CH, k + t * row, row, nch, gn, 1, s + t * G + g0, G,
                       scale, g0 == 0, nxt);
    }
}

/* One PV pass over the block's n tokens: heads [g0, g0 + gn) of G, chunks [c0, c0 + DCH).
 * pw[j * G + g]: head g's probabilities of tokens 2j and 2j + 1 as a bf16 pair in one 32-bit
 * word (to_bf16_pairs). acc[g * D ..] in pv order. */
static inline __attribute__((always_inline)) void pv_pass_bf(
    float *acc, const uint32_t *pw, int G, const char *v, int64_t row, int n, int D,
    int g0, int gn, int c0, const int DCH, int64_t nxt) {
    VEC a[BF_PV_ACC];
    for (int c = 0; c < DCH; c++)
        for (int g = 0; g < gn; g++)
            for (int h = 0; h < 2; h++)
                a[(c * gn + g) * 2 + h] =
                    vloadu(acc + (int64_t)(g0 + g) * D + (c0 + c) * BF_CH + h * VW);
    const char *vt = v + (int64_t)c0 * BF_CH * 2;
    const uint32_t *pt = pw + g0;
    for (int t = 0; t < n; t += 2, vt += 2 * row, pt += G) {
        uint32_t w[8];
        for (int g = 0; g < gn; g++) w[g] = pt[g];
        for (int c = 0; c < DCH; c++) {
            if (g0 == 0) {  /* as attention_simd.h's pv_pass: the lines this pass reads */
                prefetch_next(vt + c * BF_CH * 2, nxt);
                if (t + 1 < n) prefetch_next(vt + row + c * BF_CH * 2, nxt);
            }
            const __m512i r0 = _mm512_loadu_si512(vt + c * BF_CH * 2);
            const __m512i r1 = t + 1 < n ? _mm512_loadu_si512(vt + row + c * BF_CH * 2)
                                         : _mm512_setzero_si512();
            const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
            const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
            for (int g = 0; g < gn; g++) {
                const __m512bh wv = (__m512bh)_mm512_set1_epi32((int)w[g]);
                VEC *ag = a + (c * gn + g) * 2;
                ag[0] = _mm512_dpbf16_ps(ag[0], lo, wv);
                ag[1] = _mm512_dpbf16_ps(ag[1], hi, wv);
            }
        }
    }
    for (int c = 0; c < DCH; c++)
        for (int g = 0; g < gn; g++)
            for (int h = 0; h < 2; h++)
                vstoreu(acc + (int64_t)(g0 + g) * D + (c0 + c) * BF_CH + h * VW,
                        a[(c * gn + g) * 2 + h]);
}

static inline __attribute__((always_inline)) void pv_block_bf(
    float *acc, const uint32_t *pw, const char *v, int64_t row, int n, int D, int G,
    int64_t nxt) {
    const int nch = D / BF_CH;
    for (int g0 = 0; g0 < G; g0 += 8) {
        const int gn = G - g0 < 8 ? G - g0 : 8;
        const int DCH = BF_PV_ACC / 2 / gn;  /* 1 (G = 8) to 8 (G = 1) chunks a pass */
        int c0 = 0;
        for (; c0 + DCH <= nch; c0 += DCH)
            pv_pass_bf(acc, pw, G, v, row, n, D, g0, gn, c0, DCH, nxt);
        switch (nch - c0) {  /* the rest in one pass with as many accumulators as it needs */
#define DP_PV_REST(r) \
        case r: \
            if ((r) < DCH) pv_pass_bf(acc, pw, G, v, row, n, D, g0, gn, c0, (r), nxt); \
            break;
        DP_PV_REST(1) DP_PV_REST(2) DP_PV_REST(3) DP_PV_REST(4) DP_PV_REST(5) DP_PV_REST(6)
        DP_PV_REST(7)
#undef DP_PV_REST
        default: break;
        }
    }
}

/* The 16-bit permute of to_bf16_pairs for a group of G dividing 16: output o (pair o / 2G,
 * head o % 2G / 2, token o % 2 of the pair) takes element (2 * pair + token) * G + head of
 * 32 token-major probabilities. Built once per item. */
static inline __m512i pairs_perm(int G) {
    uint16_t idx[32];
    for (int o = 0; o < 32; o++) {
        const int pr = o / (2 * G), g = o % (2 * G) / 2, tt = o % 2;
        idx[o] = (uint16_t)((2 * pr + tt) * G + g);
    }
    return _mm512_loadu_si512(idx);
}

/* pw[j * G + g] = head g's probabilities of tokens 2j and 2j + 1 (p token-major, p[t * G +
 * g]) rounded to bf16, as one 32-bit word (low half token 2j), j < ceil(n / 2), with a zero
 * partner for an odd last token. For G dividing 16, 32 probabilities (32 / G tokens) at a
 * time: two conversions and one 16-bit permute (perm, pairs_perm), the tokens of each pair
 * side by side. */
static inline __attribute__((always_inline)) void to_bf16_pairs(const float *p, int n, int G,
                                                               __m512i perm, uint32_t *pw) {
    const int ne = n * G;
    if (16 % G == 0) {
        /* lanes past the block load as zero: the PV pairs an odd last token with a zero V
         * row, and 0 * a stale NaN in the workspace would still be NaN (2G divides 32 and an
         * odd n * G is not a multiple of 2G, so the chunks reach that partner) */
        for (int i = 0; i < ne; i += 32) {
            const __m512 lo = _mm512_maskz_loadu_ps(lanes_below(ne - i), p + i);
            const __m512 hi = _mm512_maskz_loadu_ps(lanes_below(ne - i - 16 > 0 ? ne - i - 16 : 0),
                                                    p + i + 16);
            const __m512i b = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            _mm512_storeu_si512(pw + i / 2, _mm512_permutexvar_epi16(perm, b));
        }
        return;
    }
    for (int j = 0; 2 * j < n; j++)
        for (int g = 0; g < G; g++) {
            const uint32_t a = dp_f32_to_bf16(p[2 * j * G + g]);
            const uint32_t b = 2 * j + 1 < n ? dp_f32_to_bf16(p[(2 * j + 1) * G + g]) : 0;
            pw[j * G + g] = a | b << 16;
        }
}

/* One block (n rows) of one KV head: QK, the online softmax of the group's G heads (as
 * attention_body.h's), the probabilities to bf16 pairs, PV. */
static inline __attribute__((always_inline)) void block_head_bf(
    const char *kp, const char *vp, int n, int D, const uint16_t *qb, float scale,
    float *m, float *l, float *acc, float *s, uint32_t *pw, __m512i perm, int64_t nxt,
    const int G) {
    const int64_t row = (int64_t)D * 2;
    qk_block_bf(qb, kp, row, n, D / BF_CH, G, s, scale, nxt);
    prim_softmax(s, n, G, m, l, acc, D);
    to_bf16_pairs(s, n, G, perm, pw);
    pv_block_bf(acc, pw, vp, row, n, D, G, nxt);
}

/* ws (floats): q (nh * G * D / 2), then the scores region (dp_attn_scores_floats): the
 * token-major scores (G * BS, and the softmax's last vector up to 16 past them), the bf16
 * probability pairs (at most G * BS / 2 + 16 words). */
static inline __attribute__((always_inline)) void item_bf(
    const dp_attn_args *a, int b, int h0, int h1, int t0, int t1, float *m, float *l,
    float *acc, float *ws, const int G) {
    const int D = a->D, BS = a->BS, Hkv = a->Hkv, nch = D / BF_CH;
    const int64_t row = (int64_t)D * 2, head_bytes = (int64_t)BS * row;
    const int nh = h1 - h0;
    uint16_t *qb = (uint16_t *)ws;             /* [nh][nch][G][32] q, unscaled */
    float *s = ws + (int64_t)nh * G * D / 2;   /* [BS, G] scores of one block and head */
    uint32_t *pw = (uint32_t *)(s + G * BS + 16);  /* [ceil(BS / 2), G] probability pairs */
    const __m512i perm = 16 % G == 0 ? pairs_perm(G) : _mm512_setzero_si512();
    const uint16_t *q = (const uint16_t *)a->q + ((int64_t)b * a->Hq + (int64_t)h0 * G) * D;
    for (int h = 0; h < nh; h++)
        for (int g = 0; g < G; g++)
            for (int c = 0; c < nch; c++)
                memcpy(qb + (((int64_t)h * nch + c) * G + g) * BF_CH,
                       q + ((int64_t)h * G + g) * D + c * BF_CH, BF_CH * 2);
    m += h0 * G; l += h0 * G; acc += (int64_t)h0 * G * D;
    dp_item_reset(m, l, acc, nh * G, D);
    const int32_t *bt = a->block_tables + (int64_t)b * a->max_blocks;
    for (int t = t0; t < t1;) {
        int64_t base, nxt;
        const int n = dp_item_block(bt, t, t1, BS, Hkv, h0, head_bytes, row, &base, &nxt);
        for (int h = 0; h < nh; h++) {
            const int64_t hb = base + h * head_bytes;
            block_head_bf((const char *)a->k_cache + hb, (const char *)a->v_cache + hb, n, D,
                          qb + (int64_t)h * G * D, a->scale, m + h * G, l + h * G,
                          acc + (int64_t)h * G * D, s, pw, perm,
                          dp_prefetch_distance(h, nh, head_bytes, nxt), G);
        }
        t += n;
    }
    pv_order_to_natural(acc, (int64_t)nh * G * D);
}

/* The bf16 dot products where dp_bf16_dot_applies; constant group sizes keep the
 * accumulators in registers. */
#define DP_CASE(g) case g: item_bf(a, b, h0, h1, t0, t1, m, l, acc, ws, (g)); return;
void dp_attn_item_avx512bf16(const dp_attn_args *a, int b, int h0, int h1, int t0, int t1,
                             float *m, float *l, float *acc, float *ws) {
    if (!dp_bf16_dot_applies(a->q_dtype, a->kv_dtype, a->G, a->D)) {
        dp_attn_item_avx512(a, b, h0, h1, t0, t1, m, l, acc, ws);
        return;
    }
    switch (a->G) {
    DP_CASE(8)
    default: item_bf(a, b, h0, h1, t0, t1, m, l, acc, ws, a->G);
    }
}
#undef DP_CASE

/* The throughput probe of the bf16 dot product (dp_bf16_dot_probe): DP_FMA_CHAINS
 * independent chains, as fma_probe_body.h's FMAs. */
double dp_bf16_dot_chains(int64_t iters) {
    VEC a[DP_FMA_CHAINS];
    for (int j = 0; j < DP_FMA_CHAINS; j++) a[j] = vset1(0.001f * (float)j);
    const __m512bh b = (__m512bh)_mm512_set1_epi32(0x3F7F3F7F);  /* bf16 pairs of ~0.996 */
    const __m512bh c = (__m512bh)_mm512_set1_epi32(0x38D138D1);  /* ~1e-4 */
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < DP_FMA_CHAINS; j++) a[j] = _mm512_dpbf16_ps(a[j], b, c);
    VEC s = a[0];
    for (int j = 1; j < DP_FMA_CHAINS; j++) s = vadd(s, a[j]);
    return _mm512_reduce_add_ps(s);
}
