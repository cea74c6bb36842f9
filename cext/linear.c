/* Driver of the decode dense linear: picks the ISA path, W's rows claimed by the team's
 * threads (team.c). */
#include "dp_internal.h"

typedef struct {
    const float *x; int M, K; const void *w; int w_dtype, N; const float *bias; float *out;
    int isa, nt; dp_linear_fn fn; dp_share *sh; uint16_t *buf;
} linear_job;

static void linear_task(void *p, int t, int nth) {
    const linear_job *j = p;
    const uint16_t *xp = dp_amx_prepare(j->buf, j->isa, j->w_dtype, j->x, j->M, j->K, t, nth);
    const int units = dp_project_units(xp, j->M, j->K);
    for (int lo, hi; dp_claim_rows(j->sh, j->nt, t, j->N, units, &lo, &hi);)
        dp_project(j->fn, xp, j->x, j->M, j->K, j->w, j->w_dtype, j->N, j->bias, j->out, lo, hi);
}

int dp_linear(const float *x, int M, int K, const void *w, int w_dtype, int N,
              const float *bias, float *out, int isa, int num_threads) {
    const dp_linear_fn fn = dp_linear_for(isa);
    if (!fn) return -1;
    if (M <= 0 || N <= 0 || K <= 0 || K % 16) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh[nt];
    dp_shares_init(sh, N, nt);
    linear_job j = {x, M, K, w, w_dtype, N, bias, out, isa, nt, fn, sh,
                    dp_amx_buffer(isa, w_dtype, M, K)};
    dp_team_run(nt, linear_task, &j);
    return 0;
}

int dp_linear_uses_amx(int isa, int w_dtype, int M, int K) {
    return dp_use_amx(isa, w_dtype, M, K);
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
