/* AVX-512 path (Skylake-SP and newer, Zen 4). Compiled for that target only here; chosen at
 * run time when the CPU and OS report AVX-512 state. D is a multiple of 16: one zmm per step. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#include "avx512_vec.h"
/* GQA 5 and 6 as one QK slice of 4 tokens (20-24 of the 32 zmm as accumulators), each K row
 * widened once, rather than 4 heads and then the rest: GQA 5 1.07-1.17x from DRAM (2-core
 * Intel Xeon VM, fp32 q over bf16 KV); GQA 8 keeps its two slices of 4 heads x 4 keys. */
#define QK_GT 6
#undef QK_TT
#define QK_TT(G) ((G) <= 6 ? 4 : ((G) <= 8 ? 2 : 1))
#include "attention_simd.h"

#define DP_ITEM_FN dp_attn_item_avx512
#include "attention_body.h"

#define FMA_CHAINS_FN dp_fma_chains_avx512
#include "fma_probe_body.h"

/* The linear's tile sums (linear_body.h): one tree for the tile's mr * nr <= 16
 * accumulators, then each row's nr sums as one masked store. Measured against a
 * horizontal sum per output, the llama.cpp comparison model's projections at M = 4 / 8 /
 * 16 / 32 rows: 1.09 / 1.03 / 1.11 / 1.09x (M = 1: the same, bound by W's reads). The
 * AVX2 path's hadd tree for a pair of rows measured 0.92-1.08x there, so it has none. */
#define DP_TILE_SUMS
static inline __attribute__((always_inline)) void tile_sums(VEC acc[4][4], int mr, int nr,
                                                           const float *bias, float *out,
                                                           int N) {
    VEC flat[16];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) flat[i * nr + j] = acc[i][j];
    const __m512 r = vreduce_many_v(flat, mr * nr);
    const __mmask16 row = (__mmask16)((1u << nr) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(row, bias) : _mm512_setzero_ps();
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int i = 0; i < mr; i++)  /* lanes i*nr.. hold row i's sums */
        _mm512_mask_storeu_ps(out + (int64_t)i * N, row, _mm512_add_ps(b, _mm512_permutexvar_ps(
            _mm512_add_epi32(first, _mm512_set1_epi32(i * nr)), r)));
}
#define LINEAR_FN dp_linear_avx512
#include "linear_body.h"

#define GEMM_NR DP_GEMM_NR_AVX512
#define GEMM_ROWS(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
#define GEMM_FN dp_gemm_avx512
#include "gemm_body.h"

#define PFA_R 12  /* 24 accumulators + 2 loads + a broadcast, of the 32 zmm */
#define PFA_ROWS(S) S(0) S(1) S(2) S(3) S(4) S(5) S(6) S(7) S(8) S(9) S(10) S(11)
#define PFA_ITEM_FN dp_pfa_item_avx512
#include "prefill_attention_body.h"

static inline __attribute__((always_inline)) VEC vsilu(VEC g) {
    const __m512 e = exp16(_mm512_or_ps(g, _mm512_set1_ps(-0.f)));  /* exp(-|g|) */
    const __mmask16 neg = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_div_ps(_mm512_mask_mul_ps(g, neg, g, e), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}
#define SILU_MUL_FN dp_silu_mul_avx512
#include "layer_body.h"
