/* AVX-512 path (Skylake-SP and newer, Zen 4). Compiled for that target only here; chosen at
 * run time when the CPU and OS report AVX-512 state. D is a multiple of 16: one zmm per step. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#include "avx512_vec.h"
#include "attention_simd.h"

#define DP_ITEM_FN dp_attn_item_avx512
#include "attention_body.h"

#define LINEAR_FN dp_linear_avx512
#include "linear_body.h"

static inline __attribute__((always_inline)) VEC vsilu(VEC g) {
    const __m512 e = exp16(_mm512_or_ps(g, _mm512_set1_ps(-0.f)));  /* exp(-|g|) */
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_div_ps(_mm512_mask_mul_ps(g, neg, g, e), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}
#define SILU_MUL_FN dp_silu_mul_avx512
#include "layer_body.h"
