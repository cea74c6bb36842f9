/* AVX-512 path (Skylake-SP and newer, Zen 4). Compiled for that target only here; chosen at
 * run time when the CPU and OS report AVX-512 state. D is a multiple of 16: one zmm per step. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#include <immintrin.h>
#include <math.h>
#include "dp_internal.h"

static inline __m512 load16(const void *p, int dtype) {
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

#define MAXG 16
static inline void prim_dot_group(const float *q, const void *k, int dtype, int D, int G,
                                  float *out) {
    const int esz = dp_elem_size(dtype);
    for (int g0 = 0; g0 < G; g0 += MAXG) {
        const int gn = G - g0 < MAXG ? G - g0 : MAXG;
        __m512 acc[MAXG];
        for (int g = 0; g < gn; g++) acc[g] = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            const __m512 kv = load16((const char *)k + (int64_t)d * esz, dtype);
            for (int g = 0; g < gn; g++)
                acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + (g0 + g) * D + d), kv, acc[g]);
        }
        for (int g = 0; g < gn; g++) out[g0 + g] = _mm512_reduce_add_ps(acc[g]);
    }
}
static inline void prim_axpy_group(float *acc, const float *p, int pstride, const void *v,
                                   int dtype, int D, int G) {
    const int esz = dp_elem_size(dtype);
    for (int d = 0; d < D; d += 16) {
        const __m512 vv = load16((const char *)v + (int64_t)d * esz, dtype);
        for (int g = 0; g < G; g++) {
            float *a = acc + g * D + d;
            _mm512_storeu_ps(a, _mm512_fmadd_ps(_mm512_set1_ps(p[g * pstride]), vv,
                                                _mm512_loadu_ps(a)));
        }
    }
}
static inline void prim_scale(float *x, float c, int n) {
    const __m512 cv = _mm512_set1_ps(c);
    for (int i = 0; i < n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), cv));
}
static inline float prim_exp_sub(float *s, int n, float m) {
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
