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
 * AVX-512 (one pass at 8 rows: 1.0-1.09x at 8 rows, 0.6-0.9x at 16 and 32), the row-by-row
 * loop (below) up to 8 rows (0.85x), the prefetch into L2 (1.0x) or two tiles ahead (1.0x), and from 24
 * rows of fp32 W the prefill GEMM's tile (gemm_body.h) on x packed per thread (0.55-0.8x at
 * 24-64 rows, 0.67-1.1x at 128). What did pay, once the prefetches went into L2: each pass
 * prefetches its share of the next tile's rows (lin_rows), so the memory stays busy while
 * the later passes compute; on a Zen 4 (2 threads, the 177 MB --past-llc bench model, the
 * two alternated in one process) 1.12x at 8 rows, 1.27x at 16, 1.14x at 32 with fp32 W,
 * 1.18x at 8 with bf16 W, level forced to AVX2 (FMA-bound there from 8 rows).
 *
 * One row of x takes the same interleaved loop. Until 2026-12-08 a single row over W rows
 * of up to 8 KB read them one after the other (a "seq" loop: one accumulator chain a row,
 * no software prefetch, the hardware prefetchers following one stream), chosen on a Zen 5
 * when the prefetches went into L1 (1.3-1.6x there then); with them into L2 a Zen 4 gave
 * the interleaved loop 0.93-1.21x at one row. On the 2-core Emerald Rapids VM (2 threads,
 * the two alternated in one process, medians of 3 x 15-31 calls) the interleaved loop ran
 * one row of bf16 W from DRAM 1.6-1.97x as fast (Llama-3-8B's 28672 x 4096 gate/up 0.59 ->
 * 0.98 of the read bandwidth on AVX-512, 0.49 -> 0.97 forced to AVX2), fp32 1.07-1.26x, and
 * the llama.cpp comparison model's projections in the L3 1.0-1.45x (fp32) and 1.17-1.81x
 * (bf16). Both loops summed each output in the same order, so no result changed. */
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
    const float *x, int K, int kl, int mr, const char *w, int wdt, int nr, const float *bias,
    float *out, int N, int n0, const char *pf, int pf_j0, int pf_j1, const int NRT,
    VEC (*carry)[NR], int cin, int cout) {
    const int esz = dp_elem_size(wdt);
    VEC acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = cin ? carry[i][j] : vzero();
    for (int k = 0; k < kl; k += VW) {
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
    if (cout) {  /* a K block before the last: the sums go on in the next block */
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++)
                if (i < mr && j < nr) carry[i][j] = acc[i][j];
        return;
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
    const float *xp, int K, int kl, int mr, const char *wp, int wdt, const int nr,
    const float *bias, float *op, int N, int n, const char *pf, int j0, int j1, const int NRT,
    VEC (*carry)[NR], int cin, int cout) {
    switch (mr) {
#define DP_LIN_MR(r) \
    lin_tile(xp, K, kl, r, wp, wdt, nr, bias, op, N, n, pf, j0, j1, NRT, carry, cin, cout); \
    break;
    case 4: DP_LIN_MR(4)
    case 3: DP_LIN_MR(3)
    case 2: DP_LIN_MR(2)
    default: DP_LIN_MR(1)
#undef DP_LIN_MR
    }
}

/* K blocks and panels. A tile's passes over its W rows read them from L1 only while the
 * rows fit it; at K = 4096 four fp32 rows are 64 KB, so every pass read W and x from L2.
 * From more than one pass, a tile's W rows past LIN_W_BLOCK_FROM bytes are taken in K
 * blocks of at most LIN_W_BLOCK bytes, each pass's accumulators carried from block to
 * block in vectors (carry), so every output's sums run over k in the same order as
 * unblocked, to the bit. And a tile reads all of x, M x K: past LIN_X_PANEL bytes (32 rows
 * at K = 14336, Llama-3-8B's down projection) x no longer stays in L2 beside the streaming
 * W, and every tile read it from L3; then a K block of x serves a panel of up to
 * LIN_PANEL_MAX tiles (as many as LIN_CARRY carried tiles allow) before the next block.
 * Measured on the 2-core Emerald Rapids VM (2 threads, W cycled past the L3, the variants
 * alternated in one process, medians of 3 x 15 calls), fp32 W, as a fraction of the FMA
 * peak, before -> after: AVX-512 N 4096 x K 4096 at 16 / 32 / 64 rows 1.26 / 1.23 / 1.16x,
 * 1024 x 2752 1.16-1.25x, 4096 x 14336 at 32 / 64 / 128 rows 0.29 -> 0.45, 0.27 -> 0.46,
 * 0.29 -> 0.40; AVX2 4096 x 14336 at 32 / 64 rows 0.49 -> 0.59, 0.43 -> 0.59, 1024 x 2752
 * 1.04-1.14x, 4096 x 4096 1.05-1.1x; bf16 W at K = 4096 (32 KB a tile) level (0.93-1.10x).
 * Blocked, the 22 KB tiles of K = 1376 (fp32) ran 0.91-0.97x (that core's L1 is 48 KB),
 * hence the threshold above the block. At 4096 x 14336 blocks of 8 KB measured 0.93-1.0x
 * of 16 KB and 32 KB 0.83-0.88x, panels of 4 tiles 0.93-1.0x of 8, and panels from 128 KB
 * of x rather than 1 MB (16-64 rows at K = 4096) within the noise of these runs (+-10%). */
#define LIN_W_BLOCK 16384
#define LIN_W_BLOCK_FROM 24576
#define LIN_X_PANEL (1 << 20)
#define LIN_PANEL_MAX 8
#define LIN_CARRY 64   /* tiles of carried accumulators: 64 KB of zmm, 32 KB of ymm */
/* The K block of a tile's passes: K whole, or from more than one pass over W rows past
 * LIN_W_BLOCK_FROM bytes, K split evenly into blocks of at most LIN_W_BLOCK bytes of the
 * tile's rows, each a multiple of 32 elements (whole lines of fp32 and bf16). */
static inline int lin_k_block(int M, int K, int esz, int NRT) {
    const int64_t tile = (int64_t)NRT * K * esz;
    if (M <= MR || tile <= LIN_W_BLOCK_FROM) return K;
    const int nb = (int)((tile + LIN_W_BLOCK - 1) / LIN_W_BLOCK);
    return ((K + nb - 1) / nb + 31) / 32 * 32;
}
/* Tiles of a panel: the carried tiles' room over a group's gp passes, from LIN_X_PANEL
 * bytes of x. */
static inline int lin_panel(int M, int K, int gp) {
    if ((int64_t)M * K * (int64_t)sizeof(float) <= LIN_X_PANEL) return 1;
    const int P = LIN_CARRY / gp;
    return P > LIN_PANEL_MAX ? LIN_PANEL_MAX : (P < 1 ? 1 : P);
}

/* The row loop for one weight dtype: a constant wdt lets the compiler drop the dtype switch
 * from the inner loops of every tile variant (it does not unswitch them all by itself). */
static inline __attribute__((always_inline)) void lin_rows(
    const float *x, int M, int K, const void *w, const int wdt, int N, const float *bias,
    float *out, int n_lo, int n_hi, const int NRT) {
    const int esz = dp_elem_size(wdt);
    const int kc = lin_k_block(M, K, esz, NRT);
    const int mg = kc < K && M > LIN_CARRY * MR ? LIN_CARRY * MR : M;
    const int gp = (mg + MR - 1) / MR;   /* passes of a group */
    const int P = kc < K ? lin_panel(M, K, gp) : 1;
    VEC carry[LIN_CARRY][MR][NR];
    const int np = (M + MR - 1) / MR;  /* passes over each tile and K block */
    for (int n0 = n_lo; n0 < n_hi; n0 += P * NRT) {
        const int n1 = n_hi - n0 < P * NRT ? n_hi : n0 + P * NRT;
        for (int g = 0; g < M; g += mg) {
            const int ge = M - g < mg ? M : g + mg;
            for (int k0 = 0; k0 < K; k0 += kc) {
                const int kl = K - k0 < kc ? K - k0 : kc;
                const int cin = k0 > 0, cout = k0 + kl < K;
                for (int n = n0; n < n1; n += NRT) {
                    const int nr = n1 - n < NRT ? n1 - n : NRT;
                    const char *wp = (const char *)w + (int64_t)n * K * esz;
                    const char *wk = wp + (int64_t)k0 * esz;
                    /* The passes over this tile fetch the W that comes next (past this
                     * claim too: the thread's next claim is most often the next rows),
                     * each pass its share of the rows, so the DRAM stream stays in
                     * flight through every pass (the later passes read this tile from L1
                     * / L2). Fetched all by the first pass, the memory sat idle during the
                     * others: on a Zen 4 (2 threads, fp32) an 8-row step took the 4-row
                     * step's time plus the second pass's FMAs. One tile: the next tile's
                     * rows over this K block; a panel: this tile's next K block, after the
                     * last the next panel's first. */
                    const char *pf = NULL;
                    if (P == 1) {
                        if (n + 2 * NRT <= N) pf = wk + (int64_t)NRT * K * esz;
                    } else if (cout) {
                        pf = wk + (int64_t)kl * esz;
                    } else if (n + P * NRT + NRT <= N) {
                        pf = wp + (int64_t)P * NRT * K * esz;
                    }
                    for (int m = g; m < ge; m += MR) {
                        const int mr = ge - m < MR ? ge - m : MR;
                        const float *xp = x + (int64_t)m * K + k0;
                        float *op = out + (int64_t)m * N;
                        VEC (*cy)[NR] = kc < K ? carry[(n - n0) / NRT * gp + (m - g) / MR]
                                               : NULL;
                        const int p = m / MR;
                        const int j0 = p * NRT / np, j1 = (p + 1) * NRT / np;
                        /* constant tile sizes let the compiler keep every accumulator in a
                         * register */
                        if (nr == NRT) {
                            lin_tile_mr(xp, K, kl, mr, wk, wdt, NRT, bias, op, N, n, pf, j0, j1,
                                        NRT, cy, cin, cout);
                        } else {
                            /* a narrower tile at the end of a claim, on constant sizes too:
                             * a 3-wide tile leaves 2 rows of every 32-row claim
                             * (dp_claim_rows), and in a tile whose sizes are known only at
                             * run time they cost the comparison model's QKV 1.3-1.8x */
                            switch (nr) {
#define DP_LIN_NR(c) lin_tile_mr(xp, K, kl, mr, wk, wdt, c, bias, op, N, n, NULL, 0, 0, NRT, \
                                 cy, cin, cout)
                            case 3: DP_LIN_NR(3); break;
                            case 2: DP_LIN_NR(2); break;
                            default: DP_LIN_NR(1);
#undef DP_LIN_NR
                            }
                        }
                    }
                }
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
#undef LIN_CARRY
#undef LIN_W_BLOCK
#undef LIN_W_BLOCK_FROM
#undef LIN_X_PANEL
#undef LIN_PANEL_MAX
