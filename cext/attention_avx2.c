/* AVX2 + FMA + F16C path (Haswell and newer, Zen). Compiled for that target only here;
 * chosen at run time when the CPU reports the features. */
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>
#include <math.h>
#include "dp_internal.h"

static inline __attribute__((always_inline)) __m256 load8(const void *p, int dtype) {
    switch (dtype) {
    case DP_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    case DP_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default: return _mm256_loadu_ps((const float *)p);
    }
}
static inline float hsum8(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
/* exp for x <= 0 (scores minus their max): Cephes polynomial, ~1 ulp over [-87, 0]. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                 _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

static inline __attribute__((always_inline)) void qk_tile(const float *q, const char *k, int64_t row, int dtype,
                                        int D, int G, int TT, float *s, int BS) {
    const int esz = dp_elem_size(dtype);
    __m256 acc[4][16];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = _mm256_setzero_ps();
    for (int d = 0; d < D; d += 8) {
        __m256 kv[4];
        for (int t = 0; t < TT; t++) kv[t] = load8(k + t * row + (int64_t)d * esz, dtype);
        for (int g = 0; g < G; g++) {
            const __m256 qv = _mm256_loadu_ps(q + g * D + d);
            for (int t = 0; t < TT; t++) acc[t][g] = _mm256_fmadd_ps(qv, kv[t], acc[t][g]);
        }
    }
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) s[g * BS + t] = hsum8(acc[t][g]);
}
/* Several tokens per pass: each q chunk loaded once serves TT keys. */
static inline __attribute__((always_inline)) void prim_qk_block(const float *q, const char *k, int64_t row, int n,
                                              int dtype, int D, int G, float *s, int BS) {
    int t = 0;
    if (G <= 16) {
        const int TT = G <= 2 ? 4 : (G <= 4 ? 2 : 1);
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
static inline __attribute__((always_inline)) void prim_pv_block(float *acc, const float *s, int BS, const char *v,
                                              int64_t row, int n, int dtype, int D, int G) {
    const int esz = dp_elem_size(dtype);
    /* G <= 8 (every common GQA ratio): the whole group's accumulators for one D-chunk stay
     * in registers over the block; constant G lets the compiler unroll the head loop. */
    if (G <= 8) {
        for (int d = 0; d < D; d += 8) {
            __m256 a[8];
            for (int g = 0; g < G; g++) a[g] = _mm256_loadu_ps(acc + (int64_t)g * D + d);
            const char *vd = v + (int64_t)d * esz;
            for (int t = 0; t < n; t++, vd += row) {
                const __m256 vv = load8(vd, dtype);
                for (int g = 0; g < G; g++) a[g] = _mm256_fmadd_ps(_mm256_set1_ps(s[g * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < G; g++) _mm256_storeu_ps(acc + (int64_t)g * D + d, a[g]);
        }
        return;
    }
    for (int d = 0; d < D; d += 8) {
        for (int g0 = 0; g0 < G; g0 += 8) {
            const int gn = G - g0 < 8 ? G - g0 : 8;
            __m256 a[8];
            for (int g = 0; g < gn; g++) a[g] = _mm256_loadu_ps(acc + (int64_t)(g0 + g) * D + d);
            for (int t = 0; t < n; t++) {
                const __m256 vv = load8(v + t * row + (int64_t)d * esz, dtype);
                for (int g = 0; g < gn; g++)
                    a[g] = _mm256_fmadd_ps(_mm256_set1_ps(s[(g0 + g) * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < gn; g++) _mm256_storeu_ps(acc + (int64_t)(g0 + g) * D + d, a[g]);
        }
    }
}
static inline __attribute__((always_inline)) float prim_max(const float *s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + i));
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    float r = _mm_cvtss_f32(x);
    for (; i < n; i++) r = s[i] > r ? s[i] : r;
    return r;
}
static inline __attribute__((always_inline)) void prim_scale(float *x, float c, int n) {
    const __m256 cv = _mm256_set1_ps(c);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), cv));
}
static inline __attribute__((always_inline)) float prim_exp_sub(float *s, int n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float r = hsum8(sum);
    for (; i < n; i++) { s[i] = expf(s[i] - m); r += s[i]; }
    return r;
}

#define DP_ITEM_FN dp_attn_item_avx2
#include "attention_body.h"

double dp_stream_read_avx2(const float *buf, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(buf + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(buf + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(buf + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(buf + i + 24));
    }
    double s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += buf[i];
    return s;
}

typedef __m256 VEC;
#define VW 8
static inline VEC vzero(void) { return _mm256_setzero_ps(); }
static inline VEC vload_x(const float *p) { return _mm256_loadu_ps(p); }
static inline VEC vload_w(const char *p, int dtype) { return load8(p, dtype); }
static inline VEC vfma(VEC a, VEC b, VEC c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vreduce(VEC v) { return hsum8(v); }
#define LINEAR_FN dp_linear_avx2
#include "linear_body.h"
