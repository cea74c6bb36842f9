/* The per-item decode-attention routine, instantiated once per ISA translation unit.
 * Before including: define DP_ITEM_FN (the function name) and the primitives
 * and DP_QVW, the width of q's chunks: q holds a group's G query rows chunk-major, chunk c
 * (DP_QVW elements) of head g at q[(c * G + g) * DP_QVW], so that a tile reaches every
 * head's chunk from one pointer.
 *   prim_qk_block(q, k, row, n, dtype, D, G, s, nxt)
 *                                                  s[t*G+g] = <q head g, k[t]>, t < n, and
 *                                                  a prefetch of the K rows nxt bytes on
 *   prim_softmax(s, n, G, m, l, acc, D)            the online-softmax update of the block
 *                                                  (attention_softmax.h), s to probabilities
 *   prim_pv_block(acc, p, v, row, n, dtype, D, G, nxt)
 *                                                  acc[g*D..] += sum_t p[t*G+g] v[t], and
 *                                                  a prefetch of the V rows nxt bytes on
 * Online softmax (one pass over KV) per KV block and GQA group, so that each K/V row read
 * from memory serves every query head that shares it. The scores are token-major from QK to
 * PV: PV wants each token's G weights side by side, and the softmax vectorizes across the
 * group's heads in that order (before, head-major scores cost a horizontal max and sum per
 * head and block, scalar bookkeeping, and a scalar transpose for PV).
 *
 * An item walks its tokens block by block, and each block through its range of KV heads.
 * The cache is [num_blocks, Hkv, BS, D]: a block's heads lie side by side, so an item over
 * all heads reads Hkv * BS rows in one contiguous run (32 KB of K and of V at Llama-3-8B's
 * shape in bf16) where an item per head read 4 KB pieces at random, each on its own page.
 * Measured single-threaded here, a plain read of random 4 KB pieces reached 9.4 GB/s and of
 * 32 KB pieces 12.3, the same as a sequential read. */
#include <math.h>

/* One block (n rows) of KV head h: QK (prefetching the rows nxt bytes on, the next head's),
 * the online-softmax update of the group's G query heads, PV. */
static inline __attribute__((always_inline)) void block_head(
    const dp_attn_args *a, const char *kp, const char *vp, int n, const float *qf,
    float *m, float *l, float *acc, float *s, int64_t nxt, const int G, const int kvdt,
    const int pairs, const int pv_pairs) {
    const int D = a->D;
    const int64_t row = (int64_t)D * dp_elem_size(kvdt);
#ifdef DP_HAVE_PAIRS
    if (pairs) prim_qk_block_pairs(qf, kp, row, n, D, G, s, nxt);
    else
#endif
    prim_qk_block(qf, kp, row, n, kvdt, D, G, s, nxt);
    (void)pairs; (void)pv_pairs;
    prim_softmax(s, n, G, m, l, acc, D);
#ifdef DP_HAVE_PAIRS
    if (pv_pairs) prim_pv_block_pairs(acc, s, vp, row, n, D, G, nxt);
    else
#endif
    prim_pv_block(acc, s, vp, row, n, kvdt, D, G, nxt);
}

static inline __attribute__((always_inline)) void item_impl(
    const dp_attn_args *a, int b, int h0, int h1, int t0, int t1, float *m, float *l,
    float *acc, float *ws, const int G, const int kvdt) {
    const int D = a->D, BS = a->BS, Hkv = a->Hkv;
    const int64_t row = (int64_t)D * dp_elem_size(kvdt);
    const int64_t head_bytes = (int64_t)BS * row;          /* one block of one KV head */
    const int nh = h1 - h0;
    float *qf = ws;                       /* [nh][D / DP_QVW][G][DP_QVW] q, pre-scaled */
    /* [BS, G] scores of one block and head, then its probabilities (dp_attn_scores_floats:
     * the softmax's vectors may run past BS * G) */
    float *s = ws + (int64_t)nh * G * D;
    const int64_t q0 = ((int64_t)b * a->Hq + (int64_t)h0 * G) * D;
    int pairs = 0, pv_pairs = 0;
#ifdef DP_HAVE_PAIRS
    /* bf16 KV whose rows split into whole pairs of vectors: the even/odd order, for QK (q in
     * that order) and for PV (the accumulators in it) each up to its own group size */
    const int pair_rows = kvdt == DP_BF16 && D % (2 * VW) == 0;
    pairs = pair_rows && G <= DP_BF16_PAIRS_MAX_G;
    pv_pairs = pair_rows && G <= DP_BF16_PV_PAIRS_MAX_G;
#endif
    float *qrow = s + dp_attn_scores_floats(G, BS);  /* [D] one query row in fp32 */
    for (int h = 0; h < nh; h++)
        for (int g = 0; g < G; g++) {
            dp_load_row(a->q, a->q_dtype, q0 + ((int64_t)h * G + g) * D, D, a->scale, qrow);
            float *qh = qf + (int64_t)h * G * D + g * DP_QVW;
#ifdef DP_HAVE_PAIRS
            if (pairs) {
                for (int d = 0; d < D; d++) {
                    const int pos = pair_pos(d);  /* where element d goes in its head's row */
                    qh[pos / DP_QVW * G * DP_QVW + pos % DP_QVW] = qrow[d];
                }
                continue;
            }
#endif
            for (int c = 0; c < D / DP_QVW; c++)
                memcpy(qh + (int64_t)c * G * DP_QVW, qrow + c * DP_QVW, sizeof(float) * DP_QVW);
        }
    m += h0 * G; l += h0 * G; acc += (int64_t)h0 * G * D;
    dp_item_reset(m, l, acc, nh * G, D);
    const int32_t *bt = a->block_tables + (int64_t)b * a->max_blocks;
    for (int t = t0; t < t1;) {
        int64_t base, nxt;  /* the next block's same rows are nxt bytes on */
        const int n = dp_item_block(bt, t, t1, BS, Hkv, h0, head_bytes, row, &base, &nxt);
        for (int h = 0; h < nh; h++) {
            const int64_t hb = base + h * head_bytes;
            block_head(a, (const char *)a->k_cache + hb, (const char *)a->v_cache + hb, n,
                       qf + (int64_t)h * G * D, m + h * G, l + h * G, acc + (int64_t)h * G * D,
                       s, dp_prefetch_distance(h, nh, head_bytes, nxt), G, kvdt, pairs,
                       pv_pairs);
        }
        t += n;
    }
#ifdef DP_HAVE_PAIRS
    if (pv_pairs)  /* the accumulators back in the natural order of d (qf is free now) */
        for (int g = 0; g < nh * G; g++) {
            float *ag = acc + (int64_t)g * D;
            for (int d = 0; d < D; d++) qf[d] = ag[pair_pos(d)];
            memcpy(ag, qf, sizeof(float) * (size_t)D);
        }
#endif
}

/* Constant GQA group sizes and KV dtypes let the compiler keep the per-head accumulators in
 * registers and drop the dtype switch from the inner loops; other shapes take the generic
 * instantiation. */
#define DP_CASE(g, dt) \
    case (g) * 4 + (dt): item_impl(a, b, h0, h1, t0, t1, m, l, acc, ws, (g), (dt)); return;
void DP_ITEM_FN(const dp_attn_args *a, int b, int h0, int h1, int t0, int t1,
                float *m, float *l, float *acc, float *ws) {
    switch (a->G * 4 + a->kv_dtype) {
    DP_CASE(1, DP_F32) DP_CASE(1, DP_BF16) DP_CASE(1, DP_F16)
    DP_CASE(2, DP_F32) DP_CASE(2, DP_BF16) DP_CASE(2, DP_F16)
    DP_CASE(4, DP_F32) DP_CASE(4, DP_BF16) DP_CASE(4, DP_F16)
    DP_CASE(8, DP_F32) DP_CASE(8, DP_BF16) DP_CASE(8, DP_F16)
    DP_CASE(5, DP_F32) DP_CASE(5, DP_BF16)
    DP_CASE(6, DP_F32) DP_CASE(6, DP_BF16)
    DP_CASE(7, DP_F32) DP_CASE(7, DP_BF16)
    default: item_impl(a, b, h0, h1, t0, t1, m, l, acc, ws, a->G, a->kv_dtype);
    }
}
#undef DP_CASE
