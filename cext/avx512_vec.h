/* The AVX-512 vector primitives of attention_simd.h (see its header comment), shared by the
 * AVX-512 translation units: each includes this after its own target pragma. */
#ifndef DP_AVX512_VEC_H
#define DP_AVX512_VEC_H
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

typedef __m512 VEC;
#define VW 16
#define QK_TT(G) ((G) <= 4 ? 4 : ((G) <= 8 ? 2 : 1)) /* 32 zmm registers */
#define PV_ACC 16 /* PV accumulators (attention_simd.h) */

static inline __attribute__((always_inline)) VEC vzero(void) { return _mm512_setzero_ps(); }
static inline __attribute__((always_inline)) VEC vset1(float f) { return _mm512_set1_ps(f); }
static inline __attribute__((always_inline)) VEC vloadu(const float *p) { return _mm512_loadu_ps(p); }
static inline __attribute__((always_inline)) void vstoreu(float *p, VEC v) { _mm512_storeu_ps(p, v); }
static inline __attribute__((always_inline)) VEC vload_w(const char *p, int dtype) { return load16(p, dtype); }
static inline __attribute__((always_inline)) VEC vfma(VEC a, VEC b, VEC c) { return _mm512_fmadd_ps(a, b, c); }
static inline __attribute__((always_inline)) VEC vmul(VEC a, VEC b) { return _mm512_mul_ps(a, b); }
static inline __attribute__((always_inline)) VEC vsub(VEC a, VEC b) { return _mm512_sub_ps(a, b); }
static inline __attribute__((always_inline)) VEC vadd(VEC a, VEC b) { return _mm512_add_ps(a, b); }
static inline __attribute__((always_inline)) VEC vmax(VEC a, VEC b) { return _mm512_max_ps(a, b); }
static inline __attribute__((always_inline)) VEC vexp(VEC x) { return exp16(x); }
static inline __attribute__((always_inline)) float vreduce_add(VEC v) { return _mm512_reduce_add_ps(v); }
/* The softmax's lane moves (attention_simd.h). */
static inline __attribute__((always_inline)) VEC vswap(VEC v, int k) {
    switch (k) {
    case 8: return _mm512_shuffle_f32x4(v, v, 0x4E);  /* 256-bit halves */
    case 4: return _mm512_shuffle_f32x4(v, v, 0xB1);  /* 128-bit lanes in pairs */
    case 2: return _mm512_permute_ps(v, 0x4E);
    default: return _mm512_permute_ps(v, 0xB1);
    }
}
static inline __attribute__((always_inline)) __mmask16 lanes_below(int n) {
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}
static inline __attribute__((always_inline)) VEC vload_rep(const float *p, int G) {
    const __m512i idx = _mm512_and_si512(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(G - 1));
    return _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(lanes_below(G), p));
}
static inline __attribute__((always_inline)) void vstore_first(float *p, VEC v, int G) {
    _mm512_mask_storeu_ps(p, lanes_below(G), v);
}
static inline __attribute__((always_inline)) VEC vload_tail(const float *p, int n, float f) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(f), lanes_below(n), p);
}
static inline __attribute__((always_inline)) VEC vzero_tail(VEC v, int n) {
    return _mm512_maskz_mov_ps(lanes_below(n), v);
}
static inline __attribute__((always_inline)) int vany_ne(VEC a, VEC b) {
    return _mm512_cmp_ps_mask(a, b, _CMP_NEQ_UQ) != 0;
}
/* The lane sums of v[i], i < n <= 16, in lane i, as one transpose-and-add tree (~3 shuffles
 * and adds a sum) instead of a full horizontal reduction per vector. After the 128-bit folds
 * f[4L + P] holds the sum of v[L + 4P]; one permute restores the order. */
static inline __attribute__((always_inline)) __m512 vreduce_many_v(const VEC *v, int n) {
    const __m512 z = _mm512_setzero_ps();
    __m512 w[8], u[4];
    for (int i = 0; i < 8; i++) {
        const __m512 a = 2 * i < n ? v[2 * i] : z, b = 2 * i + 1 < n ? v[2 * i + 1] : z;
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
    const __m512 s0 = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
    const __m512 s1 = _mm512_add_ps(_mm512_unpacklo_ps(u[2], u[3]), _mm512_unpackhi_ps(u[2], u[3]));
    const __m512d d0 = _mm512_castps_pd(s0), d1 = _mm512_castps_pd(s1);
    const __m512 f = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, f);
}
/* out[i] = the lane sum of v[i], i < n <= 16. */
static inline __attribute__((always_inline)) void vreduce_many(const VEC *v, int n, float *out) {
    _mm512_mask_storeu_ps(out, (__mmask16)((1u << n) - 1u), vreduce_many_v(v, n));
}
/* n floats (a multiple of 32) from "pv order" back to natural order, a 32-element chunk at
 * a time: the order in which products against two V rows interleaved by unpacklo/hi_epi16
 * leave them (attention_avx512bf16.c, attention_amx.c), element 8L + e (e < 4) of 128-bit
 * lane L in lane 4L + e of the chunk's first 16 floats, element 8L + 4 + e in the same lane
 * of the next 16. */
static inline void pv_order_to_natural(float *acc, int64_t n) {
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21,
                                             22, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28,
                                             29, 30, 31);
    for (int64_t i = 0; i < n; i += 32) {
        const __m512 x = _mm512_loadu_ps(acc + i), y = _mm512_loadu_ps(acc + i + 16);
        _mm512_storeu_ps(acc + i, _mm512_permutex2var_ps(x, lo_idx, y));
        _mm512_storeu_ps(acc + i + 16, _mm512_permutex2var_ps(x, hi_idx, y));
    }
}
#endif
