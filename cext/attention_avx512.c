/* AVX-512 path (Skylake-SP and newer, Zen 4). Compiled for that target only here; chosen at
 * run time when the CPU and OS report AVX-512 state. D is a multiple of 16: one zmm per step. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#include <immintrin.h>
#include <math.h>
#include "dp_internal.h"

static inline __attribute__((always_inline)) __m512 load16(const void *p, int dtype) {
    switch (dtype) {
    case DP_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
    case DP_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    default: return _mm512_loadu_ps((const float *)p);
    }
}
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 fx = _mm512_roundscale_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(y, fx);
}

static inline __attribute__((always_inline)) void qk_tile(const float *q, const char *k, int64_t row, int dtype,
                                        int D, int G, int TT, float *s, int BS) {
    const int esz = dp_elem_size(dtype);
    __m512 acc[4][16];
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) acc[t][g] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __m512 kv[4];
        for (int t = 0; t < TT; t++) kv[t] = load16(k + t * row + (int64_t)d * esz, dtype);
        for (int g = 0; g < G; g++) {
            const __m512 qv = _mm512_loadu_ps(q + g * D + d);
            for (int t = 0; t < TT; t++) acc[t][g] = _mm512_fmadd_ps(qv, kv[t], acc[t][g]);
        }
    }
    for (int t = 0; t < TT; t++)
        for (int g = 0; g < G; g++) s[g * BS + t] = _mm512_reduce_add_ps(acc[t][g]);
}
/* Several tokens per pass: each q chunk loaded once serves TT keys. */
static inline __attribute__((always_inline)) void prim_qk_block(const float *q, const char *k, int64_t row, int n,
                                              int dtype, int D, int G, float *s, int BS) {
    int t = 0;
    if (G <= 16) {
        const int TT = G <= 4 ? 4 : (G <= 8 ? 2 : 1);
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
        for (int d = 0; d < D; d += 16) {
            __m512 a[8];
            for (int g = 0; g < G; g++) a[g] = _mm512_loadu_ps(acc + (int64_t)g * D + d);
            const char *vd = v + (int64_t)d * esz;
            for (int t = 0; t < n; t++, vd += row) {
                const __m512 vv = load16(vd, dtype);
                for (int g = 0; g < G; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(s[g * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < G; g++) _mm512_storeu_ps(acc + (int64_t)g * D + d, a[g]);
        }
        return;
    }
    for (int d = 0; d < D; d += 16) {
        for (int g0 = 0; g0 < G; g0 += 8) {
            const int gn = G - g0 < 8 ? G - g0 : 8;
            __m512 a[8];
            for (int g = 0; g < gn; g++) a[g] = _mm512_loadu_ps(acc + (int64_t)(g0 + g) * D + d);
            for (int t = 0; t < n; t++) {
                const __m512 vv = load16(v + t * row + (int64_t)d * esz, dtype);
                for (int g = 0; g < gn; g++)
                    a[g] = _mm512_fmadd_ps(_mm512_set1_ps(s[(g0 + g) * BS + t]), vv, a[g]);
            }
            for (int g = 0; g < gn; g++) _mm512_storeu_ps(acc + (int64_t)(g0 + g) * D + d, a[g]);
        }
    }
}
static inline __attribute__((always_inline)) float prim_max(const float *s, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + i));
    if (i < n)
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                  (__mmask16)((1u << (n - i)) - 1), s + i));
    return _mm512_reduce_max_ps(m);
}
static inline __attribute__((always_inline)) void prim_scale(float *x, float c, int n) {
    const __m512 cv = _mm512_set1_ps(c);
    for (int i = 0; i < n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), cv));
}
static inline __attribute__((always_inline)) float prim_exp_sub(float *s, int n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
        _mm512_storeu_ps(s + i, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), mv));
        _mm512_mask_storeu_ps(s + i, k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(sum);
}

#define DP_ITEM_FN dp_attn_item_avx512
#include "attention_body.h"

typedef __m512 VEC;
#define VW 16
static inline VEC vzero(void) { return _mm512_setzero_ps(); }
static inline VEC vload_x(const float *p) { return _mm512_loadu_ps(p); }
static inline VEC vload_w(const char *p, int dtype) { return load16(p, dtype); }
static inline VEC vfma(VEC a, VEC b, VEC c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vreduce(VEC v) { return _mm512_reduce_add_ps(v); }
#define LINEAR_FN dp_linear_avx512
#include "linear_body.h"
