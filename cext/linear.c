/* Driver of the decode dense linear: picks the ISA path, W's rows claimed by the threads. */
#include <omp.h>
#include "dp_internal.h"

int dp_linear(const float *x, int M, int K, const void *w, int w_dtype, int N,
              const float *bias, float *out, int isa, int num_threads) {
    const dp_linear_fn fn = dp_linear_for(isa);
    if (!fn) return -1;
    if (M <= 0 || N <= 0 || K <= 0 || K % 16) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh[nt];
    dp_shares_init(sh, N, nt);
    uint16_t *buf = dp_amx_buffer(isa, w_dtype, M, K);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        const uint16_t *xp = dp_amx_prepare(buf, isa, w_dtype, x, M, K, t, omp_get_num_threads());
        for (int lo, hi; dp_claim_rows(sh, nt, t, N, &lo, &hi);)
            dp_project(fn, xp, x, M, K, w, w_dtype, N, bias, out, lo, hi);
    }
    return 0;
}

/* A buffer of at least ``bytes`` owned by the calling thread, grown as needed and kept: the
 * AMX path's packed x (dp_amx_buffer) and the prefill GEMM's panels (gemm.c) were allocated
 * and freed per projection before, and a buffer above malloc's mmap threshold faulted its
 * pages in afresh on every call (a large model's 128-row batch; 33 GEMM calls a decode step
 * at batch 32). Each call uses it only while it runs, so one per thread serves both. NULL
 * when out of memory. */
void *dp_thread_scratch(size_t bytes) {
    static __thread void *buf;
    static __thread size_t cap;
    if (bytes > cap) {
        free(buf);
        cap = (bytes + 4095) / 4096 * 4096;
        buf = aligned_alloc(64, cap);
        if (!buf) cap = 0;
    }
    return buf;
}
