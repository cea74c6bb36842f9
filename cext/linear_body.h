/* Decode-shaped dense linear out[M,N] = x[M,K] @ W[N,K]^T (+ bias), instantiated per ISA.
 * Decode batches have few rows, so the product is bound by streaming W from memory: each
 * thread's claim (dp_claim_rows) is a contiguous range of W rows, and a register tile of
 * MR x-rows by NR W-rows reads every W element once per MR rows of x. Before including
 * define: VEC, VW (lanes), vzero(), vloadu(p), vload_w(p, dtype), vfma(a, b, c),
 * vreduce_add(v), and LINEAR_FN; and, with DP_TILE_SUMS, tile_sums(acc, mr, nr, bias, out,
 * N): out[i*N + j] = the lane sum of acc[i][j] (+ bias[j]) for the whole tile, which the
 * ISA does as one reduction tree (a horizontal sum per output was ~10 ops against its 32
 * FMAs at K = 512).
 *
 * From 5 rows of x a tile takes ceil(M / MR) passes over its W rows, the first from DRAM,
 * the rest from L1, and the compute of the later passes barely overlaps the next tile's
 * reads: on a Zen 5 (2 threads, the llama.cpp comparison model's K = 512 projections) 8
 * rows took about the 4-row time plus the 8-row time with W hot in cache (gate/up: 139 + ~70 ->
 * ~180 us), 0.55-0.65 of the DRAM bandwidth against 0.8-0.9 at 4 rows. Tried there against
 * this loop (both builds in one process, calls interleaved) and dropped: an 8 x 2 tile on
 * AVX-512 (one pass at 8 rows: 1.0-1.09x at 8 rows, 0.6-0.9x at 16 and 32), the seq loop up
 * to 8 rows (0.85x), the prefetch into L2 (1.0x) or two tiles ahead (1.0x), and from 24
 * rows of fp32 W the prefill GEMM's tile (gemm_body.h) on x packed per thread (0.55-0.8x at
 * 24-64 rows, 0.67-1.1x at 128). What did pay, once the prefetches went into L2: each pass
 * prefetches its share of the next tile's rows (lin_rows), so the memory stays busy while
 * the later passes compute; on a Zen 4 (2 threads, the 177 MB --past-llc bench model, the
 * two alternated in one process) 1.12x at 8 rows, 1.27x at 16, 1.14x at 32 with fp32 W,
 * 1.18x at 8 with bf16 W, level forced to AVX2 (FMA-bound there from 8 rows). */
#define MR 4
#define NR 4  /* the widest tile; the array dimension of the accumulators */
/* The tile's width (W rows) from LIN_NR_FULL rows of x on, where the tile is MR x-rows deep:
 * the ISA file may narrow it to fit its registers. AVX2 has 16 ymm, and a 4 x 4 tile's 16
 * accumulators beside 4 W vectors and an x vector spilled accumulators to the stack every
 * step; 4 x 3 (12 + 3 + 1) fits. Measured on a Zen 3 (AVX2, one thread, fp32 W, the
 * comparison model's projections and a 4096 x 4096 one, W cycled past the L3): 1.1x at 4
 * rows, 1.3-1.4x at 8, 1.45-1.75x at 32; bf16 W 1.0-1.1x at 4, 1.1-1.3x at 8, 0.95-1.15x
 * at 32. Under 4 rows the tile is at most 3 deep and 4 wide fits (2 x 4 with 3 wide ran
 * 0.65-0.9x), so narrower tiles start at LIN_NR_FULL rows. */
#ifndef LIN_NR_DEEP
#define LIN_NR_DEEP NR
#endif
#define LIN_NR_FULL 4

static inline __attribute__((always_inline)) void lin_tile(
    const float *x, int K, int mr, const char *w, int wdt, int nr, const float *bias,
    float *out, int N, int n0, const char *pf, int pf_j0, int pf_j1, const int seq,
    const int NRT) {
    const int esz = dp_elem_size(wdt);
    VEC acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = vzero();
    if (seq) {
        /* The tile's W rows one after the other, each front to back: one sequential stream
         * per thread, which the hardware prefetchers follow on their own. The same
         * accumulators in the same order as the interleaved loop below, so the same sums
         * to the bit. */
        for (int j = 0; j < NRT; j++) {
            if (j >= nr) break;
            const char *wj = w + (int64_t)j * K * esz;
            for (int k = 0; k < K; k += VW) {
                const VEC wv = vload_w(wj + (int64_t)k * esz, wdt);
                for (int i = 0; i < MR; i++) {
                    if (i >= mr) break;
                    acc[i][j] = vfma(vloadu(x + (int64_t)i * K + k), wv, acc[i][j]);
                }
            }
        }
    } else {
        for (int k = 0; k < K; k += VW) {
            /* the next tile's rows, one tile ahead: the DRAM stream stays in flight while
             * this tile computes (measured: the hardware prefetchers alone leave M = 4..16
             * at half the bandwidth), into L2 (dp_prefetch_dram) */
            if (pf && (k * esz) % 64 == 0)
                for (int j = pf_j0; j < pf_j1; j++)
                    dp_prefetch_dram(pf + ((int64_t)j * K + k) * esz);
            VEC wv[NR];
            for (int j = 0; j < NRT; j++)
                wv[j] = j < nr ? vload_w(w + ((int64_t)j * K + k) * esz, wdt) : vzero();
            for (int i = 0; i < MR; i++) {
                if (i >= mr) break;
                const VEC xv = vloadu(x + (int64_t)i * K + k);
                for (int j = 0; j < NRT; j++)
                    if (j < nr) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
            }
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

/* One interleaved tile of nr W rows (a constant at each call) with the row count mr as a
 * constant too. */
static inline __attribute__((always_inline)) void lin_tile_mr(
    const float *xp, int K, int mr, const char *wp, int wdt, const int nr, const float *bias,
    float *op, int N, int n, const char *pf, int j0, int j1, const int NRT) {
    switch (mr) {
#define DP_LIN_MR(r) \
    lin_tile(xp, K, r, wp, wdt, nr, bias, op, N, n, pf, j0, j1, 0, NRT); break;
    case 4: DP_LIN_MR(4)
    case 3: DP_LIN_MR(3)
    case 2: DP_LIN_MR(2)
    default: DP_LIN_MR(1)
#undef DP_LIN_MR
    }
}

/* The row loop for one weight dtype: a constant wdt lets the compiler drop the dtype switch
 * from the inner loops of every tile variant (it does not unswitch them all by itself). */
static inline __attribute__((always_inline)) void lin_rows(
    const float *x, int M, int K, const void *w, const int wdt, int N, const float *bias,
    float *out, int n_lo, int n_hi, const int NRT) {
    const int esz = dp_elem_size(wdt);
    /* One row of x over short W rows: each tile's W rows read one after the other (the
     * seq loop of lin_tile). Measured on a Zen 5 at M = 1 and 2 on the llama.cpp comparison
     * model's projections (K = 512 and 1376, rows of 2-5 KB in fp32): 1.3-1.6x the weight
     * bytes a second of the interleaved loop when its prefetches went into L1; at K = 4096
     * (16 KB rows, which the interleaved loop already streams well) and where x outgrows half
     * the L1 it measured slower. With the prefetches into L2 (dp_prefetch_dram), on a Zen 4
     * (2 threads, 256 MB of W cycled, the two loops alternated in one process) the
     * interleaved loop read 0.93-1.21x as fast at M = 1, 0.99-1.33x at M = 2 (fp32 1.0-1.08,
     * bf16 1.05-1.33) and 1.10-1.87x at M = 4, so from 2 rows it takes the interleaved
     * loop. */
    const int seq = M == 1 && (int64_t)K * esz <= 8192;
    const int np = (M + MR - 1) / MR;  /* passes over each tile */
    for (int n = n_lo; n < n_hi; n += NRT) {
        const int nr = n_hi - n < NRT ? n_hi - n : NRT;
        const char *wp = (const char *)w + (int64_t)n * K * esz;
        for (int m = 0; m < M; m += MR) {
            const int mr = M - m < MR ? M - m : MR;
            const float *xp = x + (int64_t)m * K;
            float *op = out + (int64_t)m * N;
            /* The passes over this tile fetch the next tile (past this claim too: the
             * thread's next claim is most often the next rows), each pass its share of the
             * next tile's W rows, so the DRAM stream stays in flight through every pass
             * (the later passes read this tile from L1 / L2). Fetched all by the first
             * pass, the memory sat idle during the others: on a Zen 4 (2 threads, fp32) an
             * 8-row step took the 4-row step's time plus the second pass's FMAs. */
            const int p = m / MR;
            const char *pf = n + 2 * NRT <= N ? wp + (int64_t)NRT * K * esz : NULL;
            const int j0 = p * NRT / np, j1 = (p + 1) * NRT / np;
            /* constant tile sizes let the compiler keep every accumulator in a register */
            if (nr == NRT) {
                if (seq)  /* one pass over the tile: W once, in order */
                    lin_tile(xp, K, 1, wp, wdt, NRT, bias, op, N, n, NULL, 0, 0, 1, NRT);
                else
                    lin_tile_mr(xp, K, mr, wp, wdt, NRT, bias, op, N, n, pf, j0, j1, NRT);
            } else if (!seq) {
                /* a narrower tile at the end of a claim, on constant sizes too: a 3-wide
                 * tile leaves 2 rows of every 32-row claim (dp_claim_rows), and in a tile
                 * whose sizes are known only at run time they cost the comparison model's
                 * QKV 1.3-1.8x */
                switch (nr) {
                case 3: lin_tile_mr(xp, K, mr, wp, wdt, 3, bias, op, N, n, NULL, 0, 0, NRT); break;
                case 2: lin_tile_mr(xp, K, mr, wp, wdt, 2, bias, op, N, n, NULL, 0, 0, NRT); break;
                default: lin_tile_mr(xp, K, mr, wp, wdt, 1, bias, op, N, n, NULL, 0, 0, NRT);
                }
            } else {
                lin_tile(xp, K, mr, wp, wdt, nr, bias, op, N, n, NULL, 0, 0, seq, NRT);
            }
        }
    }
}
/* Each weight dtype with the tile width of its row count (constants: the accumulators stay
 * in registers). */
static inline __attribute__((always_inline)) void lin_dtype(
    const float *x, int M, int K, const void *w, const int wdt, int N, const float *bias,
    float *out, int n_lo, int n_hi) {
    if (LIN_NR_DEEP != NR && M >= LIN_NR_FULL)
        lin_rows(x, M, K, w, wdt, N, bias, out, n_lo, n_hi, LIN_NR_DEEP);
    else
        lin_rows(x, M, K, w, wdt, N, bias, out, n_lo, n_hi, NR);
}
void LINEAR_FN(const float *x, int M, int K, const void *w, int wdt, int N,
               const float *bias, float *out, int n_lo, int n_hi) {
    switch (wdt) {
    case DP_BF16: lin_dtype(x, M, K, w, DP_BF16, N, bias, out, n_lo, n_hi); break;
    case DP_F16: lin_dtype(x, M, K, w, DP_F16, N, bias, out, n_lo, n_hi); break;
    default: lin_dtype(x, M, K, w, DP_F32, N, bias, out, n_lo, n_hi); break;
    }
}
#undef MR
#undef NR
#undef LIN_NR_DEEP
#undef LIN_NR_FULL
