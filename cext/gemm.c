/* Driver of the prefill GEMM (gemm_body.h): out[M,N] = add + x[M,K] @ W[N,K]^T + bias.
 *
 * Blocked over K (DP_GEMM_KC steps) and M (DP_GEMM_MB rows): the threads pack one block of
 * x into panels together, then each computes its columns of it against W, claimed in
 * units of tiles as the decode linear claims rows (dp_claim_rows: contiguous shares,
 * taken from the back of a preempted thread's). A block of x is DP_GEMM_MB * DP_GEMM_KC
 * floats (256 KB): it stays in L2 while the W rows of a tile stay in L1, so W is read once
 * per block of rows. Each output's sum runs over k in order, block after block, whatever
 * the threads: its value depends neither on which thread computed it nor on how many. */
#include "dp_internal.h"

#define DP_GEMM_MB 128  /* a multiple of both ISAs' panel rows (16 and 32) */

/* Rows [m0, m0 + rows) and K steps [k0, k0 + kc) of x into panels of mr rows:
 * xp[p * mr * kc + k * mr + i] = x[m0 + p * mr + i][k0 + k], rows past M zero. Panels
 * [p_lo, p_hi) only (the threads share the packing). */
static void pack_panels(const float *x, int M, int K, int m0, int rows, int k0, int kc,
                        int mr, int p_lo, int p_hi, float *xp) {
    for (int p = p_lo; p < p_hi; p++) {
        float *dst = xp + (int64_t)p * mr * kc;
        for (int i = 0; i < mr; i++) {
            const int m = m0 + p * mr + i;
            if (p * mr + i < rows && m < M) {
                const float *src = x + (int64_t)m * K + k0;
                for (int k = 0; k < kc; k++) dst[(int64_t)k * mr + i] = src[k];
            } else {
                for (int k = 0; k < kc; k++) dst[(int64_t)k * mr + i] = 0.f;
            }
        }
    }
}

typedef struct {
    const float *x; int M, K; const char *w; int wdt; int N; const float *bias, *add;
    float *out;
    int mb, mr, nr, tiles; dp_gemm_fn fn; float *xp; dp_share *sh;
} gemm_job;

static void gemm_task(void *p, int t, int T) {
    const gemm_job *j = p;
    const int M = j->M, K = j->K, N = j->N, mr = j->mr, nr = j->nr, tiles = j->tiles;
    for (int k0 = 0; k0 < K; k0 += DP_GEMM_KC) {
        const int kc = K - k0 < DP_GEMM_KC ? K - k0 : DP_GEMM_KC;
        for (int m0 = 0; m0 < M; m0 += j->mb) {
            const int rows = M - m0 < j->mb ? M - m0 : j->mb;
            const int panels = (rows + mr - 1) / mr;
            pack_panels(j->x, M, K, m0, rows, k0, kc, mr, panels * t / T, panels * (t + 1) / T,
                        j->xp);
            if (t == 0) dp_shares_init(j->sh, tiles * DP_UNIT_ROWS, T);
            dp_team_barrier(T);
            for (int lo, hi;
                 dp_claim_rows(j->sh, T, t, tiles * DP_UNIT_ROWS, DP_CLAIM_UNITS, &lo, &hi);) {
                const int n_lo = lo / DP_UNIT_ROWS * nr;
                const int n_hi = hi / DP_UNIT_ROWS * nr < N ? hi / DP_UNIT_ROWS * nr : N;
                j->fn(j->xp, rows, kc, j->w + (int64_t)k0 * dp_elem_size(j->wdt), j->wdt,
                      K, n_lo, n_hi, j->bias,
                      j->add ? j->add + (int64_t)m0 * N : NULL, j->out + (int64_t)m0 * N, N,
                      k0 == 0);
            }
            dp_team_barrier(T);
        }
    }
}

int dp_gemm(const float *x, int M, int K, const void *w, int w_dtype, int N,
            const float *bias, const float *add, float *out, int isa, int num_threads) {
    const int disa = dp_dense_isa(isa);
    const dp_gemm_fn fn = dp_gemm_for(disa);
    if (!fn) return -1;
    if (M <= 0 || N <= 0 || K <= 0 || !x || !w || !out) return -2;
    /* a narrow W is widened VW elements at a time, K block by K block (gemm_body.h) */
    if (w_dtype != DP_F32 && ((w_dtype != DP_BF16 && w_dtype != DP_F16) || K % 16)) return -2;
    const int mr = dp_gemm_mr(disa), nr = dp_gemm_nr(disa);
    const int nt = num_threads > 0 ? num_threads : 1;
    const int mb = M < DP_GEMM_MB ? (M + mr - 1) / mr * mr : DP_GEMM_MB;
    const int kcap = K < DP_GEMM_KC ? K : DP_GEMM_KC;
    float *xp = (float *)dp_thread_scratch((size_t)mb * kcap * sizeof(float));
    if (!xp) return -5;
    /* the claims count tiles: unit u of the shares is tile u (dp_claim_rows hands out
     * multiples of DP_UNIT_ROWS "rows") */
    dp_share sh[nt];
    gemm_job j = {x, M, K, (const char *)w, w_dtype, N, bias, add, out, mb, mr, nr,
                  (N + nr - 1) / nr, fn, xp, sh};
    dp_team_run(nt, gemm_task, &j);
    return 0;
}
