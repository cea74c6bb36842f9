/* The per-item decode-attention routine, instantiated once per ISA translation unit.
 * Before including: define DP_ITEM_FN (the function name) and the primitives
 *   prim_qk_block(q, k, row, n, dtype, D, G, s, BS)  s[g*BS+t] = <q[g*D..], k[t]>, t < n
 *   prim_pv_block(acc, s, BS, v, row, n, dtype, D, G) acc[g*D..] += sum_t s[g*BS+t] v[t]
 *   prim_max(s, n) -> max of s[0..n)
 *   prim_scale(x, c, n)                            x *= c
 *   prim_exp_sub(s, n, m) -> sum                   s = exp(s - m), returns the sum
 * Online softmax (one pass over KV) per KV block, one GQA group per item so that each K/V
 * row read from memory serves every query head that shares it. */
#include <math.h>

#define DP_QK_SLICE 4  /* tokens of scores between two slices of the next block's prefetch */

static inline __attribute__((always_inline)) void item_impl(
    const dp_attn_args *a, int b, int h, int t0, int t1, float *m, float *l, float *acc,
    float *ws, const int G, const int kvdt) {
    const int D = a->D, BS = a->BS;
    const int esz = dp_elem_size(kvdt);
    float *qf = ws;               /* [G, D] query rows, pre-scaled */
    float *s = ws + G * D;        /* [G, BS] scores of one block */
    const int64_t q0 = ((int64_t)b * a->Hq + (int64_t)h * G) * D;
#ifdef DP_HAVE_PAIRS
    /* bf16 KV whose rows split into whole pairs of vectors: the even/odd order. */
    const int pairs = kvdt == DP_BF16 && D % (2 * VW) == 0;
#endif
    for (int i = 0; i < G * D; i++) {
        const float x = dp_load_elem(a->q, a->q_dtype, q0 + i) * a->scale;
#ifdef DP_HAVE_PAIRS
        if (pairs) { qf[i / D * D + pair_pos(i % D)] = x; continue; }
#endif
        qf[i] = x;
    }
    for (int g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.f; }
    memset(acc, 0, sizeof(float) * (size_t)G * D);
    const int32_t *bt = a->block_tables + (int64_t)b * a->max_blocks;
    const int64_t row = (int64_t)D * esz;
    for (int t = t0; t < t1;) {
        const int blk = t / a->BS, off = t % a->BS;
        const int n = (BS - off) < (t1 - t) ? (BS - off) : (t1 - t);
        const int64_t base = (((int64_t)bt[blk] * a->Hkv + h) * BS + off) * row;
        const char *kp = (const char *)a->k_cache + base;
        const char *vp = (const char *)a->v_cache + base;
        /* Each block of one head is a few KB on its own pages: the hardware prefetchers stop
         * at page boundaries, so the next block's K and V are fetched by hand while this
         * one computes (its id is in the table). The prefetches go out a slice at a time
         * between the score tiles: issued all at once they filled the line-fill buffers and
         * stalled the core for a fifth of its time when the KV was already in cache. */
        const char *nk = NULL, *nv = NULL;
        int64_t pf_step = 0;
        if (t + n < t1) {
            const int64_t nb = (((int64_t)bt[(t + n) / BS] * a->Hkv + h) * BS) * row;
            nk = (const char *)a->k_cache + nb;
            nv = (const char *)a->v_cache + nb;
            /* the next block's bytes over this block's n tokens: a share per score tile */
            pf_step = ((int64_t)BS * row + n - 1) / n;
        }
        for (int tq = 0; tq < n; tq += DP_QK_SLICE) {
            const int nq = n - tq < DP_QK_SLICE ? n - tq : DP_QK_SLICE;
#ifdef DP_HAVE_PAIRS
            if (pairs) prim_qk_block_pairs(qf, kp + tq * row, row, nq, D, G, s + tq, BS);
            else
#endif
            prim_qk_block(qf, kp + tq * row, row, nq, kvdt, D, G, s + tq, BS);
            if (nk) {
                const int64_t lo = tq * pf_step, hi = (tq + nq) * pf_step;
                for (int64_t off = lo & ~(int64_t)63; off < hi && off < BS * row; off += 64) {
                    __builtin_prefetch(nk + off, 0, 3);
                    __builtin_prefetch(nv + off, 0, 3);
                }
            }
        }
        for (int g = 0; g < G; g++) {
            const float bm = prim_max(s + g * BS, n);
            const float mn = bm > m[g] ? bm : m[g];
            if (m[g] != -INFINITY && mn != m[g]) {
                const float c = expf(m[g] - mn);
                l[g] *= c;
                prim_scale(acc + (int64_t)g * D, c, D);
            }
            l[g] += prim_exp_sub(s + g * BS, n, mn);
            m[g] = mn;
        }
#ifdef DP_HAVE_PAIRS
        if (pairs) prim_pv_block_pairs(acc, s, BS, vp, row, n, D, G);
        else
#endif
        prim_pv_block(acc, s, BS, vp, row, n, kvdt, D, G);
        t += n;
    }
#ifdef DP_HAVE_PAIRS
    if (pairs)  /* the accumulators back in the natural order of d (qf is free now) */
        for (int g = 0; g < G; g++) {
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
    case (g) * 4 + (dt): item_impl(a, b, h, t0, t1, m, l, acc, ws, (g), (dt)); return;
void DP_ITEM_FN(const dp_attn_args *a, int b, int h, int t0, int t1,
                float *m, float *l, float *acc, float *ws) {
    switch (a->G * 4 + a->kv_dtype) {
    DP_CASE(1, DP_F32) DP_CASE(1, DP_BF16) DP_CASE(1, DP_F16)
    DP_CASE(2, DP_F32) DP_CASE(2, DP_BF16) DP_CASE(2, DP_F16)
    DP_CASE(4, DP_F32) DP_CASE(4, DP_BF16) DP_CASE(4, DP_F16)
    DP_CASE(8, DP_F32) DP_CASE(8, DP_BF16) DP_CASE(8, DP_F16)
    default: item_impl(a, b, h, t0, t1, m, l, acc, ws, a->G, a->kv_dtype);
    }
}
#undef DP_CASE
