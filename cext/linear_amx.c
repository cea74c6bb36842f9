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
 * Past 32 rows of x a panel takes a pass over its W rows per 32 rows, the later ones from
 * L2, and they add to the first: on the 2-core Emerald Rapids VM (2 threads, 700 MB of W
 * cycled) Llama-3-8B's 28672 x 4096 gate/up took 9.1-9.6 ms at 32 rows, 12.9-15.9 at 64 and
 * 21.7-25.2 at 128 (the DRAM read alone ~8.7). Tried there and dropped (2026-12-08, the
 * variants alternated in one process): the passes after the first prefetching the next
 * panel's rows into L2 (0.97-1.05x at K = 4096, 0.72-0.84x at K = 14336, whose 32-row panels
 * are 917 KB and then crowd the L2), and every pass prefetching its own rows PF_BYTES ahead
 * into L1 (0.88-1.09x). */
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

size_t dp_amx_packed_bytes(int M, int K) {
    return (size_t)((M + 15) / 16) * (size_t)K * 32;
}

/* x [M, K] fp32 -> xp: block b (x rows 16b..16b+15, zeros past M) is K/2 rows of 64 bytes,
 * row p holding (x[m][2p], x[m][2p+1]) for its 16 m: a B tile is 16 consecutive rows. This
 * thread's part of the (block, 32-k chunk) items: t of nth. */
void dp_amx_pack_x(const float *x, int M, int K, uint16_t *xp, int t, int nth) {
    const int blocks = (M + 15) / 16, chunks = K / 32;
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7,
                                                             6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(16));
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
            /* pair p of this row to dst[p * 16 + j] */
            _mm512_i32scatter_epi32(dst + j, rows, pairs, 4);
        }
    }
}

#define PF_BYTES 512  /* how far ahead of the tiles W's rows are prefetched */

/* C^T tiles of W rows [n, n + 16 * nw) and x blocks [b0, b0 + nb) (nw, nb in {1, 2}) over
 * all of K, then added into out. */
static inline __attribute__((always_inline)) void amx_panel(
    const uint16_t *xp, int M, int K, const uint16_t *w, int n, int nw, int b0, int nb,
    const float *bias, float *out, int N, int prefetch) {
    const int64_t ws = (int64_t)K * 2;
    const char *a0 = (const char *)(w + (int64_t)n * K), *a1 = a0 + 16 * ws;
    const char *bp0 = (const char *)(xp + (int64_t)b0 * K * 16), *bp1 = bp0 + (int64_t)K * 32;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int k = 0; k < K; k += 32) {
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
    float c[16][16] __attribute__((aligned(64)));
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
            for (int r = 0; r < 16; r++) {
                const float bv = bias ? bias[n0 + r] : 0.f;
                for (int m = 0; m < mm; m++) out[(int64_t)(m0 + m) * N + n0 + r] = c[r][m] + bv;
            }
        }
}

void dp_linear_amx(const float *x, const uint16_t *xp, int M, int K, const void *w, int N,
                   const float *bias, float *out, int n_lo, int n_hi) {
    const int n16 = n_lo + (n_hi - n_lo) / 16 * 16;
    const int blocks = (M + 15) / 16;
    if (n16 > n_lo) {
        amx_config();
        for (int n = n_lo; n < n16; n += 32) {
            const int nw = n + 32 <= n16 ? 2 : 1;
            for (int b = 0; b < blocks; b += 2) {
                const int nb = b + 1 < blocks ? 2 : 1, pf = b == 0;
                if (nw == 2 && nb == 2)
                    amx_panel(xp, M, K, w, n, 2, b, 2, bias, out, N, pf);
                else if (nw == 2)
                    amx_panel(xp, M, K, w, n, 2, b, 1, bias, out, N, pf);
                else if (nb == 2)
                    amx_panel(xp, M, K, w, n, 1, b, 2, bias, out, N, pf);
                else
                    amx_panel(xp, M, K, w, n, 1, b, 1, bias, out, N, pf);
            }
        }
        _tile_release();
    }
    if (n16 < n_hi) dp_linear_avx512(x, M, K, w, DP_BF16, N, bias, out, n16, n_hi);
}
