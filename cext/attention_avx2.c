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

typedef __m256 VEC;
#define VW 8
/* keys per q-chunk load, by the 16 ymm registers: G = 4 takes 3 (12 accumulators, 3 keys,
 * a q chunk), measured 14% faster than 2 on fp32 KV with the KV in cache */
#define QK_TT(G) ((G) <= 2 ? 4 : ((G) <= 4 ? 3 : 1))
/* ... by KV dtype, from DRAM: fewer keys a tile read faster there though slower in cache.
 * Measured on a Zen 3 (2 threads, the grid's 12 shapes a row, 3 interleaved runs): fp32 KV
 * at 2 keys rather than 4 (G 1) and 3 (G 4) 0.82-0.93 -> 0.88-1.06 and 0.67-0.74 ->
 * 0.77-0.85 of the read bandwidth; bf16 at G 1 2 keys rather than 4 0.80-1.01 -> 0.88-1.08,
 * at G 4 2 keys 0.61-0.74 against 3's 0.63-0.79, so G 4 keeps 3. Against the commit before,
 * later the same day (all the grid, interleaved): fp32 G 4 means 0.74 -> 0.79 and G 8 0.60
 * -> 0.66 (the next define), every row; bf16 G 1 0.86 -> 0.90 in one run and 0.89 -> 0.85
 * in another, within the box's drift. */
#define QK_TT_KV(G, dtype) \
    ((dtype) == DP_F32 ? ((G) <= 4 ? 2 : 1) : (dtype) == DP_BF16 && (G) <= 2 ? 2 : QK_TT(G))
static inline __attribute__((always_inline)) VEC vzero(void) { return _mm256_setzero_ps(); }
static inline __attribute__((always_inline)) VEC vset1(float f) { return _mm256_set1_ps(f); }
static inline __attribute__((always_inline)) VEC vloadu(const float *p) { return _mm256_loadu_ps(p); }
static inline __attribute__((always_inline)) void vstoreu(float *p, VEC v) { _mm256_storeu_ps(p, v); }
static inline __attribute__((always_inline)) VEC vload_w(const char *p, int dtype) { return load8(p, dtype); }
static inline __attribute__((always_inline)) VEC vfma(VEC a, VEC b, VEC c) { return _mm256_fmadd_ps(a, b, c); }
static inline __attribute__((always_inline)) VEC vmul(VEC a, VEC b) { return _mm256_mul_ps(a, b); }
static inline __attribute__((always_inline)) VEC vsub(VEC a, VEC b) { return _mm256_sub_ps(a, b); }
static inline __attribute__((always_inline)) VEC vadd(VEC a, VEC b) { return _mm256_add_ps(a, b); }
static inline __attribute__((always_inline)) VEC vmax(VEC a, VEC b) { return _mm256_max_ps(a, b); }
static inline __attribute__((always_inline)) VEC vexp(VEC x) { return exp8(x); }
static inline __attribute__((always_inline)) float vreduce_add(VEC v) { return hsum8(v); }
/* out[i] = the lane sum of v[i], i < n <= 8: one hadd tree for all of them. */
static inline __attribute__((always_inline)) void vreduce_many(const VEC *v, int n, float *out) {
    const __m256 z = _mm256_setzero_ps();
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = i < n ? v[i] : z;
    const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                                   _mm256_permute2f128_ps(t0, t1, 0x31));
    if (n == 8) {
        _mm256_storeu_ps(out, r);
    } else {
        float tmp[8];
        _mm256_storeu_ps(tmp, r);
        for (int i = 0; i < n; i++) out[i] = tmp[i];
    }
}
/* The softmax's lane moves (attention_simd.h). */
static inline __attribute__((always_inline)) VEC vswap(VEC v, int k) {
    switch (k) {
    case 4: return _mm256_permute2f128_ps(v, v, 1);
    case 2: return _mm256_permute_ps(v, 0x4E);
    default: return _mm256_permute_ps(v, 0xB1);
    }
}
static inline __attribute__((always_inline)) __m256 lanes_below(int n) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(
        _mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
static inline __attribute__((always_inline)) VEC vload_rep(const float *p, int G) {
    switch (G) {
    case 8: return _mm256_loadu_ps(p);
    case 4: return _mm256_broadcast_ps((const __m128 *)p);
    case 2: return _mm256_castpd_ps(_mm256_broadcast_sd((const double *)p));
    default: return _mm256_broadcast_ss(p);
    }
}
static inline __attribute__((always_inline)) void vstore_first(float *p, VEC v, int G) {
    _mm256_maskstore_ps(p, _mm256_castps_si256(lanes_below(G)), v);
}
static inline __attribute__((always_inline)) VEC vload_tail(const float *p, int n, float f) {
    const __m256 live = lanes_below(n);
    return _mm256_blendv_ps(_mm256_set1_ps(f),
                            _mm256_maskload_ps(p, _mm256_castps_si256(live)), live);
}
static inline __attribute__((always_inline)) VEC vzero_tail(VEC v, int n) {
    return _mm256_and_ps(v, lanes_below(n));
}
static inline __attribute__((always_inline)) int vany_ne(VEC a, VEC b) {
    return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_NEQ_UQ)) != 0;
}
/* bf16 pairs (attention_simd.h): 16 bf16 as fp32, the even (half 0) or odd (half 1) ones. */
static inline __attribute__((always_inline)) VEC vbf16_half(const char *p, int half) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)p);
    return _mm256_castsi256_ps(half ? _mm256_and_si256(x, _mm256_set1_epi32((int)0xFFFF0000u))
                                    : _mm256_slli_epi32(x, 16));
}
#define DP_BF16_PAIRS
/* Measured against the plain widening: 20% faster at G = 1, 7-11% slower at G = 4 and 8,
 * where the pairs' two halves per 2*VW elements cost the QK tile its registers. */
#define DP_BF16_PAIRS_MAX_G 2
/* PV takes them at every group size up to 8 (its accumulators in the even/odd order, q
 * not), and a bf16 group of 8 goes through PV as two slices of 4 heads x 2 chunks, the
 * chunks the even and odd halves of one 32-byte load: one shift and one mask a V load,
 * where the zero-extend and shift of the plain widening cost an FMA port (a Zen 3, one
 * core, PV over 16 bf16 tokens in L1 at G 8 and head dim 128: 8 heads x 1 chunk 28.2 ns a
 * token, 4 x 2 plain 24.8, 4 x 2 in pairs 21.6, the FMAs alone 20). From DRAM there (2
 * threads, the grid's 12 shapes a group, 3 interleaved runs): GQA 4 0.63-0.84 -> 0.69-0.82
 * of the read bandwidth, in cache 0.78-1.20 -> 0.97-1.30; GQA 8 0.41-0.47 -> 0.45-0.48, in
 * cache 0.45-0.61 -> 0.54-0.70; GQA 5-7 level or better (means 0.50 / 0.45 / 0.42 ->
 * 0.53 / 0.46 / 0.42). Two later runs against the commit before these tile changes put GQA
 * 4 and 8 level from DRAM (means 0.68 -> 0.70 and 0.64 -> 0.64, 0.40 -> 0.41) and faster in
 * cache (GQA 4 head dims 64-80 0.66-0.81 -> 0.80-0.97): these rows wait on the overlap of
 * reads and compute (G 4) or on the FMAs (G 8), not on PV's widening. */
#define DP_BF16_PV_PAIRS_MAX_G 8
#define PV_GMAX(dtype) ((dtype) == DP_BF16 ? 4 : 8)
/* QK tiles: an fp32 group of up to 8 heads in one tile of 1 key (8 accumulators, q as the
 * FMAs' memory operands, each K row read once); bf16 and f16 groups over 4 in slices of 4
 * heads x 3 keys (attention_simd.h). Measured on a Zen 3 from DRAM (2 threads, the grid's
 * 12 shapes a group, 3 interleaved runs): fp32 KV GQA 8 0.57-0.65 -> 0.65-0.75 of the read
 * bandwidth, GQA 6-7 1.0-1.25x; bf16 GQA 5-8 0.95-1.05x, so they keep the slices. */
#define QK_GT 8
#define QK_GT_KV(dtype) ((dtype) == DP_F32 ? 8 : 4)
#include "attention_simd.h"

#define DP_ITEM_FN dp_attn_item_avx2
#include "attention_body.h"

double dp_stream_read_avx2(const float *buf, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        /* 1 KB ahead by hand, into L2 as the kernels do: the roofline is what a prefetching
         * reader gets (measured ~5% above the hardware prefetchers alone, and on a Zen 4
         * 5-15% above the same prefetches into L1) */
        dp_prefetch_dram(buf + i + 256);
        dp_prefetch_dram(buf + i + 272);
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(buf + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(buf + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(buf + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(buf + i + 24));
    }
    double s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += buf[i];
    return s;
}

#define FMA_CHAINS_FN dp_fma_chains_avx2
#include "fma_probe_body.h"

#define LINEAR_FN dp_linear_avx2
#define LIN_NR_DEEP 3  /* 16 ymm: a 4 x 3 tile from 4 rows of x (linear_body.h) */
#include "linear_body.h"

#define GEMM_NR DP_GEMM_NR_AVX2
#define GEMM_ROWS(S) S(0) S(1) S(2) S(3) S(4) S(5)
#define GEMM_FN dp_gemm_avx2
#include "gemm_body.h"

#define PFA_R 6  /* 12 accumulators + 2 loads + a broadcast: 15 of the 16 ymm */
#define PFA_ROWS(S) S(0) S(1) S(2) S(3) S(4) S(5)
#define PFA_ITEM_FN dp_pfa_item_avx2
#include "prefill_attention_body.h"

static inline __attribute__((always_inline)) VEC vsilu(VEC g) {
    const __m256 e = exp8(_mm256_or_ps(g, _mm256_set1_ps(-0.f)));  /* exp(-|g|) */
    const __m256 neg = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_div_ps(_mm256_blendv_ps(g, _mm256_mul_ps(g, e), neg),
                         _mm256_add_ps(_mm256_set1_ps(1.f), e));
}
#define SILU_MUL_FN dp_silu_mul_avx2
#include "layer_body.h"
