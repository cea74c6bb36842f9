/* The decode-attention primitives of attention_body.h for a SIMD ISA, written once over a
 * vector type. Before including define:
 *   VEC, VW (lanes; D is a multiple of VW), QK_TT(G) (keys per q-chunk load, by register
 *   budget), and the inline functions
 *   vzero() vset1(f) vloadu(p) vstoreu(p, v) vload_w(p, dtype) vfma(a, b, c) vmul(a, b)
 *   vsub(a, b) vadd(a, b) vmax(a, b) vexp(x) (x <= 0)
 *   vreduce_many(v, n, out) (out[i] = lane sum of v[i], i < n <= VW),
 *   and for the softmax across a group's heads (G a power of two dividing VW):
 *   vswap(v, k) (lane i gets lane i ^ k, k a power of two < VW), vload_rep(p, G) (lane i =
 *   p[i % G]), vstore_first(p, v, G) (lanes < G to p), vload_tail(p, n, f) (lanes < n from
 *   p, the rest f), vzero_tail(v, n) (lanes from n zeroed), vany_ne(a, b).
 * A partial last block: QK takes its last tokens one at a time, the softmax masks its last
 * vector. */
#include <math.h>
#include "attention_softmax.h"

#define DP_QVW VW  /* q's chunk width (attention_body.h) */

#ifndef QK_GT
#define QK_GT 4  /* the most heads in one QK tile (prim_qk_block) */
#endif
#ifndef QK_GT_KV
#define QK_GT_KV(dtype) QK_GT  /* ... for a KV dtype, at most QK_GT */
#endif
#ifndef QK_TT_KV
#define QK_TT_KV(G, dtype) QK_TT(G)  /* QK_TT for a KV dtype */
#endif
#ifndef QK_STEP
#define QK_STEP 4  /* the heads of a slice when a group is larger than QK_GT */
#endif

/* s[t*ss + g] = the lane sum of acc[t][g] (scores token-major, ss the whole group's size):
 * all TT x G dot products of a tile reduced together, VW vectors per tree, and stored in
 * place when the tile holds the whole group. */
static inline __attribute__((always_inline)) void store_scores(
    VEC acc[4][QK_GT], int TT, int G, float *s, int ss) {
    VEC flat[4 * QK_GT];
    float sums[4 * QK_GT];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) flat[t * G + g] = acc[t][g];
    const int n = TT * G;
    float *out = G == ss ? s : sums;
    for (int i = 0; i < n; i += VW) vreduce_many(flat + i, n - i < VW ? n - i : VW, out + i);
    if (G != ss)
        for (int t = 0; t < TT; t++)
            for (int g = 0; g < G; g++) s[t * ss + g] = sums[t * G + g];
}

/* The line nxt bytes on, prefetched beside this one: the same row of the next head's rows
 * in this block, or of the next block (dp_prefetch_distance; 0 when there is none: the
 * prefetch then touches a line already in cache). Paged blocks are a few KB on their own
 * pages, where the hardware prefetchers stop. QK prefetches the K lines and PV the V lines, one
 * line per line read, so the prefetches spread evenly through the compute: issued all at
 * once per block they filled the line-fill buffers and stalled the core, and with both K's
 * and V's issued during QK (a third of a G = 8 step) a G = 8 step ran 1.3-1.5x slower from
 * DRAM on a Zen 5 (G = 4: 1.15-1.35x). Into L2 (dp_prefetch_dram). */
static inline __attribute__((always_inline)) void prefetch_next(const char *line, int64_t nxt) {
    dp_prefetch_dram(line + nxt);
}

/* q is chunk-major (attention_body.h): chunk c of head g at q[c * qs + g * VW], so one
 * pointer with constant offsets reaches every head's chunk. With a pointer per head row
 * (q + g * D, D known only at run time) G = 8 ran out of general registers: the K row
 * pointers went to the stack and were reloaded every chunk. */
static inline __attribute__((always_inline)) void qk_tile(
    const float *q, int qs, const char *k, int64_t row, int dtype, int D, int G, int TT,
    float *s, int ss, int pf, int64_t nxt) {
    const int esz = dp_elem_size(dtype);
    VEC acc[4][QK_GT];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = vzero();
    const float *qc = q;
    const char *kc = k;
    for (int c = 0; c < D / VW; c++, qc += qs, kc += VW * esz) {
        if (pf && (c * VW * esz) % 64 == 0)  /* a new cache line of each row */
            for (int t = 0; t < TT; t++) prefetch_next(kc + t * row, nxt);
        VEC kv[4];
        for (int t = 0; t < TT; t++) kv[t] = vload_w(kc + t * row, dtype);
        for (int g = 0; g < G; g++) {
            const VEC qv = vloadu(qc + g * VW);
            for (int t = 0; t < TT; t++) acc[t][g] = vfma(qv, kv[t], acc[t][g]);
        }
    }
    store_scores(acc, TT, G, s, ss);
}

/* Several tokens per pass: each q chunk loaded once serves TT keys. A group of more than
 * QK_GT heads goes through in slices of QK_GT, each K row read once per slice (from L1 after
 * the first): G = 8 as two slices of 4 heads x 4 keys ran 30% faster than 8 heads x 2 keys,
 * whose 16 FMAs a chunk each took their q operand from memory. The first slice prefetches. */
static inline __attribute__((always_inline)) void qk_slice(
    const float *q, const char *k, int64_t row, int n, int dtype, int D, int G, int g0,
    const int gn, float *s, int64_t nxt) {
    const int TT = QK_TT_KV(gn, dtype);
    int t = 0;
    for (; t + TT <= n; t += TT)
        qk_tile(q + g0 * VW, G * VW, k + t * row, row, dtype, D, gn, TT, s + t * G + g0, G,
                g0 == 0, nxt);
    for (; t < n; t++)
        qk_tile(q + g0 * VW, G * VW, k + t * row, row, dtype, D, gn, 1, s + t * G + g0, G,
                g0 == 0, nxt);
}

/* A group of up to QK_GT heads is one slice, a larger one slices of QK_STEP and the rest;
 * the sizes are constants (the rest through a switch): with the last
 * slice's size known only at run time (G = 5: 4 + 1) the compiler kept the tile's
 * accumulators in memory, zeroed and copied with rep stos / rep movs every tile, and the
 * AVX-512 kernel ran 3.6x slower at GQA 5 than at GQA 4. */
static inline __attribute__((always_inline)) void prim_qk_block(
    const float *q, const char *k, int64_t row, int n, int dtype, int D, int G, float *s,
    int64_t nxt) {
    int g0 = 0;
    if (G > QK_GT_KV(dtype))  /* a group that fits one tile goes whole */
        for (; g0 + QK_STEP <= G; g0 += QK_STEP)
            qk_slice(q, k, row, n, dtype, D, G, g0, QK_STEP, s, nxt);
    switch (G - g0) {  /* the rest, at most QK_GT_KV(dtype) heads */
#define DP_QK_REST(r) \
    case r: \
        if ((r) <= QK_GT_KV(dtype)) qk_slice(q, k, row, n, dtype, D, G, g0, (r), s, nxt); \
        break;
    DP_QK_REST(1) DP_QK_REST(2) DP_QK_REST(3) DP_QK_REST(4) DP_QK_REST(5) DP_QK_REST(6)
    DP_QK_REST(7) DP_QK_REST(8)
#undef DP_QK_REST
    default: break;
    }
}

/* The ISA file opts in, with DP_BF16_PAIRS_MAX_G, the largest group whose QK takes them
 * (measured faster with AVX2 at G <= 2, slower at G = 4 and 8, no faster with AVX-512), and
 * DP_BF16_PV_PAIRS_MAX_G, PV's. */
#ifdef DP_BF16_PAIRS
#define DP_HAVE_PAIRS 1  /* bf16 KV in even/odd pairs: see the section at the end */
#endif

/* Chunk c (VW elements) of a V row as fp32, vt pointing at the row's chunk j0: in natural
 * order, or (pairs) chunk j0 + c of the even/odd order, which holds the even or the odd
 * elements of its 2*VW-element span. Offsets relative to vt keep the per-token address
 * arithmetic to one pointer increment. */
static inline __attribute__((always_inline)) VEC pv_row(const char *vt, int c, int j0,
                                                       int esz, int dtype, int pairs) {
#ifdef DP_HAVE_PAIRS
    if (pairs) {
        const int half = (j0 + c) & 1;
        return vbf16_half(vt + (int64_t)(c - half) * VW * 2, half);
    }
#endif
    (void)pairs; (void)j0;
    return vload_w(vt + (int64_t)c * VW * esz, dtype);
}

/* PV for one block: acc[g*D + d] += sum_t p[t*G + g] v[t][d], with the probabilities p
 * token-major so that each token's G weights are G broadcasts from one pointer. The
 * accumulators stay in registers across the block's tokens (one load and store of acc per
 * block, not per token). Each token adds one FMA to every accumulator, so a pass is bound
 * by the FMA latency unless enough of them are independent: DC = PV_ACC / G head-dim
 * chunks go through the tokens together, PV_ACC accumulators (16 of the 32 zmm registers:
 * G = 4 takes D = 128 in 2 passes rather than 4, each token's weights broadcast once a
 * pass). Measured: with 8 accumulators and the weights addressed per head (s[g*BS + t])
 * the pointer bookkeeping spilled to the stack and the loop ran at half the FMA rate. */
#ifndef PV_ACC
#define PV_ACC 8
#endif
static inline __attribute__((always_inline)) void pv_pass(
    float *acc, const float *p, const char *v, int64_t row, int n, int dtype, int D, int G,
    int g0, int gn, int d0, const int DC, int pairs, int64_t nxt) {
    const int esz = dp_elem_size(dtype);
    VEC a[PV_ACC];
    for (int c = 0; c < DC; c++)
        for (int g = 0; g < gn; g++)
            a[c * gn + g] = vloadu(acc + (int64_t)(g0 + g) * D + d0 + c * VW);
    const char *vt = v + (int64_t)d0 * esz;
    const float *pt = p + g0;
    for (int t = 0; t < n; t++, vt += row, pt += G) {
        VEC w[8];
        for (int g = 0; g < gn; g++) w[g] = vset1(pt[g]);
        for (int c = 0; c < DC; c++) {
            /* a pass reads its own chunks of every row: the first slice of heads prefetches
             * the lines they start */
            if (g0 == 0 && ((d0 + c * VW) * esz) % 64 == 0)
                prefetch_next(vt + (int64_t)c * VW * esz, nxt);
            const VEC vv = pv_row(vt, c, d0 / VW, esz, dtype, pairs);
            for (int g = 0; g < gn; g++) a[c * gn + g] = vfma(w[g], vv, a[c * gn + g]);
        }
    }
    for (int c = 0; c < DC; c++)
        for (int g = 0; g < gn; g++)
            vstoreu(acc + (int64_t)(g0 + g) * D + d0 + c * VW, a[c * gn + g]);
}

/* The passes over the head dim for heads [g0, g0 + gn), gn <= PV_ACC and 8. */
static inline __attribute__((always_inline)) void pv_slice(
    float *acc, const float *p, const char *v, int64_t row, int n, int dtype, int D, int G,
    int g0, const int gn, int pairs, int64_t nxt) {
    const int DC = PV_ACC / gn < 8 ? PV_ACC / gn : 8;
    int d0 = 0;
    for (; d0 + DC * VW <= D; d0 += DC * VW)
        pv_pass(acc, p, v, row, n, dtype, D, G, g0, gn, d0, DC, pairs, nxt);
    /* the last (D / VW) % DC chunks: one pass with as many accumulators as are left */
    switch ((D - d0) / VW) {
#define DP_PV_REST(r) \
    case r: \
        if ((r) < DC) pv_pass(acc, p, v, row, n, dtype, D, G, g0, gn, d0, (r), pairs, nxt); \
        break;
    DP_PV_REST(1) DP_PV_REST(2) DP_PV_REST(3) DP_PV_REST(4) DP_PV_REST(5) DP_PV_REST(6)
    DP_PV_REST(7)
#undef DP_PV_REST
    default: break;
    }
}

#ifndef PV_GMAX
#define PV_GMAX(dtype) 8  /* the most heads of one PV slice (pv_passes) */
#endif
/* A group of up to PV_GMAX heads goes in one slice, a larger multiple of it (up to 8) in
 * slices of PV_GMAX, each reading V again (from L1), so that a pass keeps PV_ACC / PV_GMAX
 * head-dim chunks. */
static inline __attribute__((always_inline)) void pv_passes(
    float *acc, const float *p, const char *v, int64_t row, int n, int dtype, int D, int G,
    int pairs, int64_t nxt) {
    const int gs = PV_GMAX(dtype);
    if (G > gs && G <= 8 && G % gs == 0) {
        for (int g0 = 0; g0 < G; g0 += gs)
            pv_slice(acc, p, v, row, n, dtype, D, G, g0, gs, pairs, nxt);
        return;
    }
    if (G <= 8 && G <= PV_ACC) {
        pv_slice(acc, p, v, row, n, dtype, D, G, 0, G, pairs, nxt);
        return;
    }
    for (int g0 = 0; g0 < G; g0 += 8)
        for (int d0 = 0; d0 < D; d0 += VW)
            pv_pass(acc, p, v, row, n, dtype, D, G, g0, G - g0 < 8 ? G - g0 : 8, d0, 1, pairs,
                    nxt);
}

static inline __attribute__((always_inline)) void prim_pv_block(
    float *acc, const float *p, const char *v, int64_t row, int n, int dtype, int D, int G,
    int64_t nxt) {
    pv_passes(acc, p, v, row, n, dtype, D, G, 0, nxt);
}

static inline __attribute__((always_inline)) void prim_scale(float *x, float c, int n) {
    const VEC cv = vset1(c);
    for (int i = 0; i < n; i += VW) vstoreu(x + i, vmul(vloadu(x + i), cv));
}

/* vswap folds: after them each lane holds the reduction over the lanes of its head (lane
 * i is head i % G), every head at once. */
static inline __attribute__((always_inline)) VEC fold_max(VEC v, int G) {
    for (int k = VW / 2; k >= G; k /= 2) v = vmax(v, vswap(v, k));
    return v;
}
static inline __attribute__((always_inline)) VEC fold_add(VEC v, int G) {
    for (int k = VW / 2; k >= G; k /= 2) v = vadd(v, vswap(v, k));
    return v;
}

/* Vectors in one period of the heads' pattern over token-major scores: lcm(G, VW) / VW (lane
 * i of vector j is head (j * VW + i) % G). */
static inline int prim_softmax_periods(int G) {
    int a = G, b = VW;
    while (b) { const int r = a % b; a = b; b = r; }
    return G / a;  /* lcm(G, VW) / VW = G / gcd(G, VW) */
}
#define DP_SOFTMAX_MAX_PERIODS 16

/* The online-softmax update for a group whose size does not divide the vector width (GQA 5,
 * 6 and 7: Qwen's 40 over 8, 24 over 4, 28 over 4 heads), up to 16 vectors a period. The
 * maxima and the rescale are per head in scalar code (n * G compares), the exponentials
 * vectorized over the token-major scores with each lane's head maximum from a periodic
 * vector (vector j of a period, lane i: head (j * VW + i) % G), and the sums per head folded
 * from one sum vector per period position. The scalar form (dp_softmax_strided) took an expf
 * a score: at GQA 5 the AVX-512 kernel ran 3.4x slower than at GQA 4 with fewer heads
 * (2-core Intel Xeon VM, 32 x 1k tokens). */
static inline __attribute__((always_inline)) void prim_softmax_periodic(
    float *s, int n, int G, float *m, float *l, float *acc, int D) {
    const int P = prim_softmax_periods(G), ne = n * G;
    const int nv = (ne + VW - 1) / VW, tail = ne - (nv - 1) * VW;
    float mn[16 * VW], per[DP_SOFTMAX_MAX_PERIODS * VW], sums[DP_SOFTMAX_MAX_PERIODS * VW];
    for (int g = 0; g < G; g++) {
        float bm = -INFINITY;
        for (int t = 0; t < n; t++) bm = s[t * G + g] > bm ? s[t * G + g] : bm;
        mn[g] = bm > m[g] ? bm : m[g];
        if (m[g] != -INFINITY && mn[g] != m[g]) {
            const float c = expf(m[g] - mn[g]);
            l[g] *= c;
            prim_scale(acc + (int64_t)g * D, c, D);
        }
    }
    for (int j = 0; j < P * VW; j++) per[j] = mn[j % G];
    VEC sum[DP_SOFTMAX_MAX_PERIODS];
    for (int p = 0; p < P; p++) sum[p] = vzero();
    for (int i = 0, p = 0; i < nv; i++, p = p + 1 == P ? 0 : p + 1) {
        VEC e = vexp(vsub(vloadu(s + i * VW), vloadu(per + p * VW)));
        if (i == nv - 1) e = vzero_tail(e, tail);  /* lanes past the block: zero (NaN there) */
        vstoreu(s + i * VW, e);
        sum[p] = vadd(sum[p], e);
    }
    for (int p = 0; p < P; p++) vstoreu(sums + p * VW, sum[p]);
    for (int g = 0; g < G; g++) {
        float t = 0.f;
        for (int j = g; j < P * VW; j += G) t += sums[j];
        l[g] += t;
        m[g] = mn[g];
    }
}

/* The block's online-softmax update (attention_softmax.h) for the whole group at once. With
 * scores token-major and G dividing VW, a vector holds VW / G tokens of every head, lane i
 * head i % G: the block's max and sum per head are vertical maxes and adds over its
 * n * G / VW vectors and log2(VW / G) folds, with one vector exp a vector of scores and one
 * for the group's corrections, where a head at a time took a horizontal max, a horizontal
 * sum and a scalar expf per head and block (measured ~22 ns a token and KV head at G = 8 on
 * a Zen 4, as much as QK). The last vector's lanes past the block are -inf for the max and
 * zero after the exp: the bf16 PV reads the partner of an odd last token as a zero. Other
 * group sizes take the head-at-a-time form. */
static inline __attribute__((always_inline)) void prim_softmax(
    float *s, int n, int G, float *m, float *l, float *acc, int D) {
    if (VW % G != 0) {
        if (prim_softmax_periods(G) <= DP_SOFTMAX_MAX_PERIODS)
            prim_softmax_periodic(s, n, G, m, l, acc, D);
        else
            dp_softmax_strided(s, n, G, m, l, acc, D);
        return;
    }
    const int ne = n * G, nv = (ne + VW - 1) / VW, tail = ne - (nv - 1) * VW;
    VEC mx = vload_tail(s + (nv - 1) * VW, tail, -INFINITY);
    for (int i = 0; i < nv - 1; i++) mx = vmax(mx, vloadu(s + i * VW));
    const VEC mold = vload_rep(m, G);
    const VEC mn = vmax(fold_max(mx, G), mold);
    VEC c = vset1(1.f);
    if (vany_ne(mn, mold)) {
        /* exp(-inf - mn) on a head's first block is exp's lower clamp, ~1e-38: it meets
         * l = 0 and acc = 0, which the loop below does not scale */
        c = vexp(vsub(mold, mn));
        float cs[VW], ms[VW];
        vstoreu(cs, c);
        vstoreu(ms, mold);
        for (int g = 0; g < G; g++)
            if (ms[g] != -INFINITY && cs[g] != 1.f) prim_scale(acc + (int64_t)g * D, cs[g], D);
    }
    VEC sum = vzero();
    for (int i = 0; i < nv; i++) {
        VEC e = vexp(vsub(vloadu(s + i * VW), mn));
        if (i == nv - 1) e = vzero_tail(e, tail);
        vstoreu(s + i * VW, e);
        sum = vadd(sum, e);
    }
    vstore_first(l, vadd(vmul(vload_rep(l, G), c), fold_add(sum, G)), G);
    vstore_first(m, mn, G);
}

/* --- bf16 KV in pairs ---------------------------------------------------------------------
 * 2*VW bf16 elements load as one vector of 32-bit lanes, lane i holding elements 2i (low
 * half) and 2i+1 (high half): a shift gives the even-index elements as fp32, a mask the odd
 * ones (vbf16_half). Dot products do not care about the order of d, so q (and the PV
 * accumulators) are kept in that even/odd order per 2*VW chunk, and the widening of a bf16
 * vector costs one op instead of a zero-extend and a shift. */
#ifdef DP_HAVE_PAIRS

/* Position of element d in the even/odd order of its 2*VW chunk. */
static inline __attribute__((always_inline)) int pair_pos(int d) {
    const int c = d / (2 * VW) * (2 * VW), j = d - c;
    return c + (j & 1) * VW + (j >> 1);
}

static inline __attribute__((always_inline)) void qk_tile_pairs(
    const float *q, int qs, const char *k, int64_t row, int D, int G, int TT, float *s, int ss,
    int pf, int64_t nxt) {
    VEC acc[4][QK_GT];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = vzero();
    const float *qc = q;
    const char *kc = k;
    for (int c = 0; c < D / VW; c += 2, qc += 2 * qs, kc += 2 * VW * 2) {
        if (pf && (c * VW * 2) % 64 == 0)
            for (int t = 0; t < TT; t++) prefetch_next(kc + t * row, nxt);
        for (int half = 0; half < 2; half++) {
            VEC kv[4];
            for (int t = 0; t < TT; t++) kv[t] = vbf16_half(kc + t * row, half);
            for (int g = 0; g < G; g++) {
                const VEC qv = vloadu(qc + half * qs + g * VW);
                for (int t = 0; t < TT; t++) acc[t][g] = vfma(qv, kv[t], acc[t][g]);
            }
        }
    }
    store_scores(acc, TT, G, s, ss);
}

static inline __attribute__((always_inline)) void prim_qk_block_pairs(
    const float *q, const char *k, int64_t row, int n, int D, int G, float *s, int64_t nxt) {
    const int gt = QK_GT_KV(DP_BF16);  /* bf16's slices, as prim_qk_block's */
    for (int g0 = 0; g0 < G; g0 += gt) {
        const int gn = G - g0 < gt ? G - g0 : gt, TT = QK_TT_KV(gn, DP_BF16);
        int t = 0;
        for (; t + TT <= n; t += TT)
            qk_tile_pairs(q + g0 * VW, G * VW, k + t * row, row, D, gn, TT, s + t * G + g0,
                          G, g0 == 0, nxt);
        for (; t < n; t++)
            qk_tile_pairs(q + g0 * VW, G * VW, k + t * row, row, D, gn, 1, s + t * G + g0, G,
                          g0 == 0, nxt);
    }
}

static inline __attribute__((always_inline)) void prim_pv_block_pairs(
    float *acc, const float *p, const char *v, int64_t row, int n, int D, int G, int64_t nxt) {
    pv_passes(acc, p, v, row, n, DP_BF16, D, G, 1, nxt);
}
#endif /* DP_HAVE_PAIRS */
