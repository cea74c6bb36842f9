/* Decode-shaped dense linear out[M,N] = x[M,K] @ W[N,K]^T (+ bias), instantiated per ISA.
 * Decode batches have few rows, so the product is bound by streaming W from memory: each
 * thread's claim (dp_claim_rows) is a contiguous range of W rows, and a register tile of
 * MR x-rows by NR W-rows reads every W element once per MR rows of x. Before including
 * define: VEC, VW (lanes), vzero(), vloadu(p), vload_w(p, dtype), vfma(a, b, c),
 * vreduce_add(v), and LINEAR_FN; and, with DP_TILE_SUMS, tile_sums(acc, mr, nr, bias, out,
 * N): out[i*N + j] = the lane sum of acc[i][j] (+ bias[j]) for the whole tile, which the
 * ISA does as one reduction tree (a horizontal sum per output was ~10 ops against its 32
 * FMAs at K = 512). */
#define MR 4
#define NR 4

static inline __attribute__((always_inline)) void lin_tile(
    const float *x, int K, int mr, const char *w, int wdt, int nr, const float *bias,
    float *out, int N, int n0, const char *pf) {
    const int esz = dp_elem_size(wdt);
    VEC acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = vzero();
    for (int k = 0; k < K; k += VW) {
        /* the next tile's rows, one tile ahead: the DRAM stream stays in flight while this
         * tile computes (measured: the hardware prefetchers alone leave M = 4..16 at half
         * the bandwidth) */
        if (pf && (k * esz) % 64 == 0)
            for (int j = 0; j < NR; j++) __builtin_prefetch(pf + ((int64_t)j * K + k) * esz, 0, 3);
        VEC wv[NR];
        for (int j = 0; j < NR; j++)
            wv[j] = j < nr ? vload_w(w + ((int64_t)j * K + k) * esz, wdt) : vzero();
        for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            const VEC xv = vloadu(x + (int64_t)i * K + k);
            for (int j = 0; j < NR; j++)
                if (j < nr) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
        }
    }
#ifdef DP_TILE_SUMS
    if (mr * nr > 1) {  /* with the 1 x 1 tiles too, GCC's code for M >= 16 ran 0.85x */
        tile_sums(acc, mr, nr, bias ? bias + n0 : NULL, out + n0, N);
        return;
    }
#endif
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            out[(int64_t)i * N + n0 + j] = vreduce_add(acc[i][j]) + (bias ? bias[n0 + j] : 0.f);
}

/* The row loop for one weight dtype: a constant wdt lets the compiler drop the dtype switch
 * from the inner loops of every tile variant (it does not unswitch them all by itself). */
static inline __attribute__((always_inline)) void lin_rows(
    const float *x, int M, int K, const void *w, const int wdt, int N, const float *bias,
    float *out, int n_lo, int n_hi) {
    const int esz = dp_elem_size(wdt);
    for (int n = n_lo; n < n_hi; n += NR) {
        const int nr = n_hi - n < NR ? n_hi - n : NR;
        const char *wp = (const char *)w + (int64_t)n * K * esz;
        for (int m = 0; m < M; m += MR) {
            const int mr = M - m < MR ? M - m : MR;
            const float *xp = x + (int64_t)m * K;
            float *op = out + (int64_t)m * N;
            /* the first pass over this tile fetches the next tile (later passes hit L1),
             * past this claim too: the thread's next claim is most often the next rows */
            const char *pf = m == 0 && n + 2 * NR <= N ? wp + (int64_t)NR * K * esz : NULL;
            /* constant tile sizes let the compiler keep every accumulator in a register */
            if (nr == NR) {
                switch (mr) {
                case 4: lin_tile(xp, K, 4, wp, wdt, NR, bias, op, N, n, pf); break;
                case 3: lin_tile(xp, K, 3, wp, wdt, NR, bias, op, N, n, pf); break;
                case 2: lin_tile(xp, K, 2, wp, wdt, NR, bias, op, N, n, pf); break;
                default: lin_tile(xp, K, 1, wp, wdt, NR, bias, op, N, n, pf); break;
                }
            } else {
                lin_tile(xp, K, mr, wp, wdt, nr, bias, op, N, n, NULL);
            }
        }
    }
}
void LINEAR_FN(const float *x, int M, int K, const void *w, int wdt, int N,
               const float *bias, float *out, int n_lo, int n_hi) {
    switch (wdt) {
    case DP_BF16: lin_rows(x, M, K, w, DP_BF16, N, bias, out, n_lo, n_hi); break;
    case DP_F16: lin_rows(x, M, K, w, DP_F16, N, bias, out, n_lo, n_hi); break;
    default: lin_rows(x, M, K, w, DP_F32, N, bias, out, n_lo, n_hi); break;
    }
}
#undef MR
#undef NR
