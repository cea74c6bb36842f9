/* The decode-attention primitives of attention_body.h for a SIMD ISA, written once over a
 * vector type. Before including define:
 *   VEC, VW (lanes; D is a multiple of VW), QK_TT(G) (keys per q-chunk load, by register
 *   budget), and the inline functions
 *   vzero() vset1(f) vloadu(p) vstoreu(p, v) vload_w(p, dtype) vfma(a, b, c) vmul(a, b)
 *   vsub(a, b) vadd(a, b) vmax(a, b) vexp(x) (x <= 0) vreduce_add(v) vreduce_max(v).
 * Tails shorter than VW (a partial last block) take the scalar loop. */
#include <math.h>

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
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) s[g * BS + t] = vreduce_add(acc[t][g]);
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

/* Accumulators stay in registers across the block's tokens: one load and store of acc per
 * block instead of per token. */
static inline __attribute__((always_inline)) void prim_pv_block(
    float *acc, const float *s, int BS, const char *v, int64_t row, int n, int dtype, int D,
    int G) {
    const int esz = dp_elem_size(dtype);
    /* G <= 8 (every common GQA ratio): the whole group's accumulators for one D-chunk stay
     * in registers over the block; constant G lets the compiler unroll the head loop. */
    if (G <= 8) {
        for (int d = 0; d < D; d += VW) {
            VEC a[8];
            for (int g = 0; g < G; g++) a[g] = vloadu(acc + (int64_t)g * D + d);
            const char *vd = v + (int64_t)d * esz;
            for (int t = 0; t < n; t++, vd += row) {
                const VEC vv = vload_w(vd, dtype);
                for (int g = 0; g < G; g++) a[g] = vfma(vset1(s[g * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < G; g++) vstoreu(acc + (int64_t)g * D + d, a[g]);
        }
        return;
    }
    for (int d = 0; d < D; d += VW) {
        for (int g0 = 0; g0 < G; g0 += 8) {
            const int gn = G - g0 < 8 ? G - g0 : 8;
            VEC a[8];
            for (int g = 0; g < gn; g++) a[g] = vloadu(acc + (int64_t)(g0 + g) * D + d);
            for (int t = 0; t < n; t++) {
                const VEC vv = vload_w(v + t * row + (int64_t)d * esz, dtype);
                for (int g = 0; g < gn; g++)
                    a[g] = vfma(vset1(s[(g0 + g) * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < gn; g++) vstoreu(acc + (int64_t)(g0 + g) * D + d, a[g]);
        }
    }
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
