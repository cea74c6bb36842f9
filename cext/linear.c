/* Driver of the decode dense linear: picks the ISA path, splits W rows over threads. */
#include <omp.h>
#include "dp_internal.h"

int dp_linear(const float *x, int M, int K, const void *w, int w_dtype, int N,
              const float *bias, float *out, int isa, int num_threads) {
    dp_linear_fn fn = isa == DP_ISA_AVX512 ? dp_linear_avx512
                    : isa == DP_ISA_AVX2 ? dp_linear_avx2
                    : isa == DP_ISA_SCALAR ? dp_linear_scalar : NULL;
    if (!fn) return -1;
    if (M <= 0 || N <= 0 || K <= 0 || K % 16) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
    /* contiguous row ranges, multiples of 4 rows, one per thread */
    const int tiles = (N + 3) / 4;
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), T = omp_get_num_threads();
        const int lo = (int)((int64_t)tiles * t / T) * 4;
        int hi = (int)((int64_t)tiles * (t + 1) / T) * 4;
        if (hi > N) hi = N;
        if (lo < hi) fn(x, M, K, w, w_dtype, N, bias, out, lo, hi);
    }
    return 0;
}
