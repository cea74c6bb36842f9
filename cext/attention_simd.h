/* The decode-attention primitives of attention_body.h for a SIMD ISA, written once over a
 * vector type. Before including define:
 *   VEC, VW (lanes; D is a multiple of VW), QK_TT(G) (keys per q-chunk load, by register
 *   budget), and the inline functions
 *   vzero() vset1(f) vloadu(p) vstoreu(p, v) vload_w(p, dtype) vfma(a, b, c) vmul(a, b)
 *   vsub(a, b) vadd(a, b) vmax(a, b) vexp(x) (x <= 0) vreduce_add(v) vreduce_max(v)
 *   vreduce_many(v, n, out) (out[i] = lane sum of v[i], i < n <= VW).
 * Tails shorter than VW (a partial last block) take the scalar loop. */
#include <math.h>

/* s[g*BS + t] = the lane sum of acc[t][g]: all TT x G dot products of a tile reduced
 * together, VW vectors per tree. */
static inline __attribute__((always_inline)) void store_scores(
    VEC acc[4][16], int TT, int G, float *s, int BS) {
    VEC flat[64];
    float sums[64];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) flat[t * G + g] = acc[t][g];
    const int n = TT * G;
    for (int i = 0; i < n; i += VW) vreduce_many(flat + i, n - i < VW ? n - i : VW, sums + i);
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) s[g * BS + t] = sums[t * G + g];
}

static inline __attribute__((always_inline)) void qk_tile(
    const float *q, const char *k, int64_t row, int dtype, int D, int G, int TT, float *s,
    int BS) {
    const int esz = dp_elem_size(dtype);
    VEC acc[4][16];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = vzero();
    for (int d = 0; d < D; d += VW) {
        VEC kv[4];
        for (int t = 0; t < TT; t++) kv[t] = vload_w(k + t * row + (int64_t)d * esz, dtype);
        for (int g = 0; g < G; g++) {
            const VEC qv = vloadu(q + g * D + d);
            for (int t = 0; t < TT; t++) acc[t][g] = vfma(qv, kv[t], acc[t][g]);
        }
    }
    store_scores(acc, TT, G, s, BS);
}

/* Several tokens per pass: each q chunk loaded once serves TT keys. */
static inline __attribute__((always_inline)) void prim_qk_block(
    const float *q, const char *k, int64_t row, int n, int dtype, int D, int G, float *s,
    int BS) {
    int t = 0;
    if (G <= 16) {
        const int TT = QK_TT(G);
        for (; t + TT <= n; t += TT) qk_tile(q, k + t * row, row, dtype, D, G, TT, s + t, BS);
        for (; t < n; t++) qk_tile(q, k + t * row, row, dtype, D, G, 1, s + t, BS);
    } else {
        for (int g0 = 0; g0 < G; g0 += 16)
            for (t = 0; t < n; t++)
                qk_tile(q + g0 * D, k + t * row, row, dtype, D, G - g0 < 16 ? G - g0 : 16, 1,
                        s + g0 * BS + t, BS);
    }
}

#ifdef DP_BF16_PAIRS  /* the ISA file opts in: measured faster with AVX2, slower with AVX-512 */
#define DP_HAVE_PAIRS 1  /* bf16 KV in even/odd pairs: see the section at the end */
#endif

/* V row t's head-dim chunk d as fp32: in natural order, or (pairs) chunk d of the even/odd
 * order, which holds the even or the odd elements of its 2*VW-element span. */
static inline __attribute__((always_inline)) VEC pv_row(const char *vt, int d, int esz,
                                                       int dtype, int pairs) {
#ifdef DP_HAVE_PAIRS
    if (pairs) {
        const int half = (d / VW) & 1;
        return vbf16_half(vt + (int64_t)(d - half * VW) * 2, half);
    }
#endif
    (void)pairs;
    return vload_w(vt + (int64_t)d * esz, dtype);
}

/* Accumulators stay in registers across the block's tokens: one load and store of acc per
 * block instead of per token. Each token adds one FMA to every accumulator, so the loop is
 * bound by the FMA latency (4 cycles) unless enough accumulators are independent: two FMA
 * ports need 8 chains. With G query heads, DC = 8 / G d-chunks go through the tokens
 * together (G = 1: a whole 128-wide row per token), G x DC = 8 chains for every G <= 8; one
 * d-chunk at a time left G = 1 at an eighth of the FMA rate and G = 4 at half. */
static inline __attribute__((always_inline)) void pv_passes(
    float *acc, const float *s, int BS, const char *v, int64_t row, int n, int dtype, int D,
    int G, int pairs) {
    const int esz = dp_elem_size(dtype);
    if (G <= 8) {
        const int DC = 8 / G;
        const float *sg[8];
        for (int g = 0; g < G; g++) sg[g] = s + (int64_t)g * BS;
        for (int d0 = 0; d0 < D; d0 += DC * VW) {
            const int dc = (D - d0) / VW < DC ? (D - d0) / VW : DC;
            VEC a[8];
            for (int i = 0; i < 8; i++) a[i] = vzero();  /* dead for c >= dc; quiets -Wall */
            for (int c = 0; c < DC; c++)
                if (c < dc)
                    for (int g = 0; g < G; g++)
                        a[c * G + g] = vloadu(acc + (int64_t)g * D + d0 + c * VW);
            for (int64_t t = 0; t < n; t++)
                for (int c = 0; c < DC; c++)
                    if (c < dc) {
                        const VEC vv = pv_row(v + t * row, d0 + c * VW, esz, dtype, pairs);
                        for (int g = 0; g < G; g++)
                            a[c * G + g] = vfma(vset1(sg[g][t]), vv, a[c * G + g]);
                    }
            for (int c = 0; c < DC; c++)
                if (c < dc)
                    for (int g = 0; g < G; g++)
                        vstoreu(acc + (int64_t)g * D + d0 + c * VW, a[c * G + g]);
        }
        return;
    }
    for (int d = 0; d < D; d += VW) {
        for (int g0 = 0; g0 < G; g0 += 8) {
            const int gn = G - g0 < 8 ? G - g0 : 8;
            VEC a[8];
            for (int g = 0; g < gn; g++) a[g] = vloadu(acc + (int64_t)(g0 + g) * D + d);
            for (int64_t t = 0; t < n; t++) {
                const VEC vv = pv_row(v + t * row, d, esz, dtype, pairs);
                for (int g = 0; g < gn; g++)
                    a[g] = vfma(vset1(s[(g0 + g) * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < gn; g++) vstoreu(acc + (int64_t)(g0 + g) * D + d, a[g]);
        }
    }
}

static inline __attribute__((always_inline)) void prim_pv_block(
    float *acc, const float *s, int BS, const char *v, int64_t row, int n, int dtype, int D,
    int G) {
    pv_passes(acc, s, BS, v, row, n, dtype, D, G, 0);
}

static inline __attribute__((always_inline)) float prim_max(const float *s, int n) {
    VEC m = vset1(-INFINITY);
    int i = 0;
    for (; i + VW <= n; i += VW) m = vmax(m, vloadu(s + i));
    float r = vreduce_max(m);
    for (; i < n; i++) r = s[i] > r ? s[i] : r;
    return r;
}

static inline __attribute__((always_inline)) void prim_scale(float *x, float c, int n) {
    const VEC cv = vset1(c);
    for (int i = 0; i < n; i += VW) vstoreu(x + i, vmul(vloadu(x + i), cv));
}

static inline __attribute__((always_inline)) float prim_exp_sub(float *s, int n, float m) {
    const VEC mv = vset1(m);
    VEC sum = vzero();
    int i = 0;
    for (; i + VW <= n; i += VW) {
        const VEC e = vexp(vsub(vloadu(s + i), mv));
        vstoreu(s + i, e);
        sum = vadd(sum, e);
    }
    float r = vreduce_add(sum);
    for (; i < n; i++) { s[i] = expf(s[i] - m); r += s[i]; }
    return r;
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
    const float *q, const char *k, int64_t row, int D, int G, int TT, float *s, int BS) {
    VEC acc[4][16];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = vzero();
    for (int d = 0; d < D; d += 2 * VW) {
        for (int half = 0; half < 2; half++) {
            VEC kv[4];
            for (int t = 0; t < TT; t++) kv[t] = vbf16_half(k + t * row + (int64_t)d * 2, half);
            for (int g = 0; g < G; g++) {
                const VEC qv = vloadu(q + g * D + d + half * VW);
                for (int t = 0; t < TT; t++) acc[t][g] = vfma(qv, kv[t], acc[t][g]);
            }
        }
    }
    store_scores(acc, TT, G, s, BS);
}

static inline __attribute__((always_inline)) void prim_qk_block_pairs(
    const float *q, const char *k, int64_t row, int n, int D, int G, float *s, int BS) {
    int t = 0;
    if (G <= 16) {
        const int TT = QK_TT(G);
        for (; t + TT <= n; t += TT) qk_tile_pairs(q, k + t * row, row, D, G, TT, s + t, BS);
        for (; t < n; t++) qk_tile_pairs(q, k + t * row, row, D, G, 1, s + t, BS);
    } else {
        for (int g0 = 0; g0 < G; g0 += 16)
            for (t = 0; t < n; t++)
                qk_tile_pairs(q + g0 * D, k + t * row, row, D, G - g0 < 16 ? G - g0 : 16, 1,
                              s + g0 * BS + t, BS);
    }
}

static inline __attribute__((always_inline)) void prim_pv_block_pairs(
    float *acc, const float *s, int BS, const char *v, int64_t row, int n, int D, int G) {
    pv_passes(acc, s, BS, v, row, n, DP_BF16, D, G, 1);
}
#endif /* DP_HAVE_PAIRS */
