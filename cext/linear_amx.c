/* The decode linear on AMX tiles (Sapphire Rapids and later): out[M, n_lo:n_hi] =
 * x[M,K] @ W[n_lo:n_hi, K]^T (+ bias) for bf16 W, as TDPBF16PS products of 16 x 32 tiles.
 *
 * Why: a decode batch of 8-128 rows is no longer bound by streaming W on the AVX-512 body
 * (linear_body.h): each W element is widened to fp32 and FMAed once per 4 x-rows, and at 32
 * rows a 4096 x 4096 bf16 projection took 7.0 ms against 1.5 ms for oneDNN's AMX GEMM
 * (torch) on a 2-core AMX VM (Intel Xeon); the tiles do 16 x 16 x 32 MACs an instruction.
 *
 * Layout: the product is computed transposed, C^T[n][m] = sum_k W[n][k] x[m][k], so that
 * W's rows load straight into A tiles (16 rows of 32 bf16 each, stride K) and only x, a few
 * KB, is repacked: into the B tiles' pair-interleaved ("VNNI") form, in blocks of 16 rows
 * (dp_amx_pack_x, once per projection, before the threads' claims). x is rounded to bf16
 * there (round to nearest even), as the bf16 model's torch stages round it; products and
 * sums are fp32. Rows of W past the last whole 16 of a claim take the AVX-512 body, on the
 * fp32 x. Linux hands the tile state to a process only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM; inherited across fork): dp_amx_enable makes it.
 *
 * Past 32 rows of x a panel (32 W rows) takes a pass over its W rows per 32 rows of x, the
 * later ones from L2, in K blocks (amx_panels), the tiles carried through memory exactly. Past
 * 1 MiB of packed x the L2 no longer keeps x beside W, and a thread takes 4 panels at a time
 * (dp_amx_grouped), so that a K block of x serves all of them. On the 2-core Emerald Rapids VM
 * (2 threads, W cycled from DRAM, old and new builds alternated; 2026-12-08) the grouping took
 * Llama-3-8B's 4096 x 14336 down projection from 13.3 to 7.8-8.3 ms at 128 rows and from 7.2
 * to 5.4-5.5 at 64; a C tile's gathered write-out (amx_tiles) and x's gathered pack
 * (dp_amx_pack_x) the 28672 x 4096 gate/up from 22.7 to 14.8-16.2 ms at 128 rows and 13.8 to
 * 10.0-10.3 at 64 (the DRAM read alone ~7.3; torch's oneDNN AMX GEMM took 22.2 and 14.8-15.2).
 * What remains there is the first pass of each panel, from DRAM, and the later ones, from L2,
 * adding up rather than overlapping: a 16 x 16 x 32 product takes 4 ns on this core (4
 * TFLOP/s), a k step's four 1 KB tiles from L2 ~27 ns for the four products. Tried and dropped
 * on that VM, the variants alternated in one process: the passes after the first prefetching
 * the next panel's rows into L2 (0.97-1.05x, and again with the gathered write-out: 1.0x),
 * every pass prefetching its own rows PF_BYTES ahead into L1 (0.88-1.09x), the next k step's x
 * and W tiles prefetched into L1 (0.8-1.0x), and a K block of W repacked into contiguous 1 KB
 * tiles so that its 16 rows, 8 KB apart, no longer share one L1 set (0.9-1.0x). */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "dp_internal.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

int dp_amx_enable(void) {
    static int state;  /* 0: not asked yet; 1: granted; -1: not available */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (!s) {
        s = (dp_cpu_features() & DP_FEAT_AMX_BF16)
            && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

/* Every tile 16 rows of 64 bytes: C tiles 0-3 (16 W rows x 16 x rows, fp32), A tiles 4-5 (16
 * W rows x 32 k), B tiles 6-7 (16 k pairs x 16 x rows). */
static inline void amx_config(void) {
    dp_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) { c.colsb[i] = 64; c.rows[i] = 16; }
    _tile_loadconfig(&c);
}

/* Lane i: 16 i, the offsets of a 16 x 16 array's column (the pack's and the write-out's
 * transposing gathers). */
static inline __m512i column_offsets(void) {
    return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                               1, 0),
                              _mm512_set1_epi32(16));
}

/* x [M, K] fp32 -> xp: block b (x rows 16b..16b+15, zeros past M) is K/2 rows of 64 bytes,
 * row p holding (x[m][2p], x[m][2p+1]) for its 16 m: a B tile is 16 consecutive rows. This
 * thread's part of the (block, 32-k chunk) items: t of nth. */
void dp_amx_pack_x(const float *x, int M, int K, uint16_t *xp, int t, int nth) {
    const int blocks = (M + 15) / 16, chunks = K / 32;
    const __m512i col = column_offsets();
    uint32_t rows[16][16] __attribute__((aligned(64)));
    for (int64_t it = t; it < (int64_t)blocks * chunks; it += nth) {
        const int b = (int)(it / chunks), c = (int)(it % chunks);
        /* 16 k pairs of this chunk, rows p = 16c..16c+15 of block b */
        uint32_t *dst = (uint32_t *)(xp + ((int64_t)b * K + (int64_t)c * 32) * 16);
        for (int j = 0; j < 16; j++) {
            const int m = b * 16 + j;
            __m512i pairs = _mm512_setzero_si512();
            if (m < M) {
                const float *src = x + (int64_t)m * K + c * 32;
                pairs = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16),
                                                     _mm512_loadu_ps(src));
            }
            _mm512_store_si512(rows[j], pairs);
        }
        /* dst row p is pair p of the 16 rows: a gather from L1 and one 64-byte store each
         * (scattering each row's pairs over 16 lines instead, 128 rows of K = 4096 times 16
         * W rows took 0.14 ms against 0.11 on two Emerald Rapids cores) */
        for (int p = 0; p < 16; p++)
            _mm512_store_si512(dst + p * 16, _mm512_i32gather_epi32(col, &rows[0][p], 4));
    }
}

#define PF_BYTES 512  /* how far ahead of the tiles W's rows are prefetched */

/* C^T tiles of W rows [n, n + 16 * nw) and x blocks [b0, b0 + nb) (nw, nb in {1, 2}) over the
 * K block [k0, k1): started from zero when first, else from the carry cb (4 tiles of 16 x 16
 * fp32, exact, so a blocked sum is the unblocked one bit for bit); kept in cb unless last,
 * when they are added into out. prefetch: W's rows PF_BYTES ahead into L1 (the pass that
 * reads them from DRAM). */
static inline __attribute__((always_inline)) void amx_tiles(
    const uint16_t *xp, int M, int K, const uint16_t *w, int n, int nw, int b0, int nb,
    int k0, int k1, float *cb, int first, int last, const float *bias, float *out, int N,
    int prefetch) {
    const int64_t ws = (int64_t)K * 2;
    const char *a0 = (const char *)(w + (int64_t)n * K), *a1 = a0 + 16 * ws;
    const char *bp0 = (const char *)(xp + (int64_t)b0 * K * 16), *bp1 = bp0 + (int64_t)K * 32;
    if (first) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    } else {
        _tile_loadd(0, cb, 64); _tile_loadd(1, cb + 256, 64);
        _tile_loadd(2, cb + 512, 64); _tile_loadd(3, cb + 768, 64);
    }
    for (int k = k0; k < k1; k += 32) {
        if (prefetch && k * 2 + PF_BYTES < ws)
            for (int r = 0; r < 16 * nw; r++)
                _mm_prefetch(a0 + r * ws + k * 2 + PF_BYTES, _MM_HINT_T0);
        _tile_loadd(4, a0 + k * 2, ws);
        _tile_loadd(6, bp0 + (int64_t)k * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (nb == 2) {
            _tile_loadd(7, bp1 + (int64_t)k * 32, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (nw == 2) {
            _tile_loadd(5, a1 + k * 2, ws);
            _tile_dpbf16ps(2, 5, 6);
            if (nb == 2) _tile_dpbf16ps(3, 5, 7);
        }
    }
    if (!last) {
        _tile_stored(0, cb, 64); _tile_stored(1, cb + 256, 64);
        _tile_stored(2, cb + 512, 64); _tile_stored(3, cb + 768, 64);
        return;
    }
    float c[16][16] __attribute__((aligned(64)));
    const __m512i col = column_offsets();
    const __m512 bv[2] = {bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps(),
                          bias && nw == 2 ? _mm512_loadu_ps(bias + n + 16) : _mm512_setzero_ps()};
    for (int i = 0; i < nw; i++)
        for (int j = 0; j < nb; j++) {
            switch (i * 2 + j) {  /* tile numbers are immediates */
            case 0: _tile_stored(0, c, 64); break;
            case 1: _tile_stored(1, c, 64); break;
            case 2: _tile_stored(2, c, 64); break;
            default: _tile_stored(3, c, 64); break;
            }
            const int n0 = n + 16 * i, m0 = (b0 + j) * 16;
            const int mm = M - m0 < 16 ? M - m0 : 16;
            /* out row m0 + m gets column m of c: one gather, one 64-byte store (a scalar
             * store per element, 16 rows of out 4N bytes apart, took 30% of a 128-row
             * gate/up on two Emerald Rapids cores) */
            for (int m = 0; m < mm; m++)
                _mm512_storeu_ps(out + (int64_t)(m0 + m) * N + n0,
                                 _mm512_add_ps(_mm512_i32gather_ps(col, &c[0][m], 4), bv[i]));
        }
}

/* One K block of one panel's (W rows [n, n + 16 nw)) pair of x blocks from b: the tile
 * counts as immediates. */
static inline void amx_pair(const uint16_t *xp, int M, int K, const uint16_t *w, int n,
                            int nw, int b, int k0, int k1, float *cb, int first, int last,
                            const float *bias, float *out, int N, int prefetch) {
    const int nb = b + 1 < (M + 15) / 16 ? 2 : 1;
    if (nw == 2 && nb == 2)
        amx_tiles(xp, M, K, w, n, 2, b, 2, k0, k1, cb, first, last, bias, out, N, prefetch);
    else if (nw == 2)
        amx_tiles(xp, M, K, w, n, 2, b, 1, k0, k1, cb, first, last, bias, out, N, prefetch);
    else if (nb == 2)
        amx_tiles(xp, M, K, w, n, 1, b, 2, k0, k1, cb, first, last, bias, out, N, prefetch);
    else
        amx_tiles(xp, M, K, w, n, 1, b, 1, k0, k1, cb, first, last, bias, out, N, prefetch);
}

#define CARRIES (DP_AMX_GROUP_PANELS * DP_AMX_GROUP_MAX_ROWS / 32)  /* tile sets cb holds */
#define K_BLOCK_ALONE 512  /* a lone panel's K block */

/* W rows [n_lo, n_hi) (whole 16s), `group` panels of 32 rows at a time in K blocks of kb:
 * every pair of x blocks of each panel of the group over one K block before the next, each
 * (panel, pair)'s tiles carried in cb from block to block (group * pairs <= CARRIES, or kb
 * = K). Grouped panels (dp_amx_grouped) share a block of x read from L2; a lone panel's K
 * blocks take its first pair's pass, the one that reads W from DRAM and prefetches it, a
 * block at a time between the other pairs' passes over the block (which read it from L2):
 * Llama-3-8B's gate/up and QKV ran 1.05-1.07x faster at 64 and 128 rows on two Emerald
 * Rapids cores than with whole-K passes, and W prefetched 1-2 KB ahead instead of 512 bytes
 * 0.9-0.97x. */
static void amx_panels(const uint16_t *xp, int M, int K, const uint16_t *w, int N,
                       const float *bias, float *out, int n_lo, int n_hi, int group, int kb) {
    float cb[CARRIES][1024] __attribute__((aligned(64)));
    const int span = 32 * group, blocks = (M + 15) / 16, pairs = (blocks + 1) / 2;
    for (int g = n_lo; g < n_hi; g += span) {
        const int g_hi = g + span < n_hi ? g + span : n_hi;
        for (int k0 = 0; k0 < K; k0 += kb) {
            const int k1 = k0 + kb < K ? k0 + kb : K;
            for (int n = g, p = 0; n < g_hi; n += 32, p++)
                for (int b = 0; b < blocks; b += 2)
                    amx_pair(xp, M, K, w, n, n + 32 <= g_hi ? 2 : 1, b, k0, k1,
                             cb[p * pairs + b / 2], k0 == 0, k1 == K, bias, out, N, b == 0);
        }
    }
}

void dp_linear_amx(const float *x, const uint16_t *xp, int M, int K, const void *w, int N,
                   const float *bias, float *out, int n_lo, int n_hi) {
    const int n16 = n_lo + (n_hi - n_lo) / 16 * 16;
    const int pairs = ((M + 15) / 16 + 1) / 2;
    if (n16 > n_lo) {
        amx_config();
        if (dp_amx_grouped(M, K))
            amx_panels(xp, M, K, w, N, bias, out, n_lo, n16, DP_AMX_GROUP_PANELS,
                       DP_AMX_K_BLOCK);
        else
            amx_panels(xp, M, K, w, N, bias, out, n_lo, n16, 1,
                       pairs > 1 && pairs <= CARRIES ? K_BLOCK_ALONE : K);
        _tile_release();
    }
    if (n16 < n_hi) dp_linear_avx512(x, M, K, w, DP_BF16, N, bias, out, n16, n_hi);
}
