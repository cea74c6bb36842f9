/* Shared between the ISA-specific attention translation units. */
#ifndef DP_INTERNAL_H
#define DP_INTERNAL_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dp_cext.h"

/* The decode path's thread team (team.c): fn(arg, t, nth) on nth threads, t = 0 the
 * caller; dp_team_barrier(nth) inside it waits for all nth. nth may be below the nt asked
 * for (a helper that would not start, another thread dispatching: then 1). */
#define DP_TEAM_MAX 1023
typedef void (*dp_team_fn)(void *arg, int t, int nth);
void dp_team_run(int nt, dp_team_fn fn, void *arg);
void dp_team_barrier(int nth);

typedef struct {
    const void *q; int q_dtype;
    const void *k_cache, *v_cache; int kv_dtype;
    const int32_t *block_tables; int max_blocks;
    const int32_t *seq_lens;
    int Hq, Hkv, D, BS, G;
    float scale;
} dp_attn_args;

/* One work item: sequence b, kv heads [h0, h1), tokens [t0, t1). Writes m, l (G per head)
 * and acc (G*D per head, unnormalised) of those heads, indexed from head 0. ws:
 * (h1-h0)*G*D + 2*G*BS + D floats of per-thread scratch. */
typedef void (*dp_attn_item_fn)(const dp_attn_args *a, int b, int h0, int h1, int t0, int t1,
                                float *m, float *l, float *acc, float *ws);

void dp_attn_item_scalar(const dp_attn_args *, int, int, int, int, int, float *, float *,
                         float *, float *);
void dp_attn_item_avx2(const dp_attn_args *, int, int, int, int, int, float *, float *,
                       float *, float *);
void dp_attn_item_avx512(const dp_attn_args *, int, int, int, int, int, float *, float *,
                         float *, float *);
void dp_attn_item_avx512bf16(const dp_attn_args *, int, int, int, int, int, float *, float *,
                             float *, float *);
/* The AMX item (attention_amx.c): tile products for bf16 KV where dp_attn_amx_applies
 * (groups of DP_AMX_ATTN_MIN_G or more), the AVX512_BF16 item elsewhere. */
void dp_attn_item_amx(const dp_attn_args *, int, int, int, int, int, float *, float *,
                      float *, float *);
#define DP_AMX_ATTN_MIN_G 8
/* The 64-byte tile configuration LDTILECFG reads (palette 1: 8 tiles of at most 16 rows of 64
 * bytes), shared by the AMX linear and attention. */
typedef struct __attribute__((packed)) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} dp_tilecfg;

/* Causal prefill attention (prefill_attention.c): each sequence b's new rows
 * q[query_start[b] .. query_start[b + 1]) at positions seq_lens[b] - rows .. seq_lens[b] - 1. */
typedef struct {
    const float *q; float *out;  /* [T, Hq, D] fp32 */
    const void *k_cache, *v_cache; int kv_dtype;
    const int32_t *block_tables; int max_blocks;
    const int32_t *query_start, *seq_lens;
    int Hq, Hkv, D, BS, G;
    float scale;
} dp_pfa_args;
/* One item (prefill_attention_body.h): sequence b, KV head h, query vectors [v_lo, v_hi)
 * (vector v: row v / G, head h * G + v % G), at most DP_PFA_ITEM_VECS of them; ws holds
 * dp_pfa_ws_floats(D) floats. */
typedef void (*dp_pfa_item_fn)(const dp_pfa_args *a, int b, int h, int v_lo, int v_hi,
                               float *ws);
void dp_pfa_item_avx2(const dp_pfa_args *, int, int, int, int, float *);
void dp_pfa_item_avx512(const dp_pfa_args *, int, int, int, int, float *);
#define DP_PFA_KCH 256       /* keys per chunk: a multiple of both ISAs' key tiles (16, 32) */
#define DP_PFA_ITEM_VECS 96  /* a multiple of both ISAs' tiles (6, 12 vectors) */
#define DP_PFA_R_MAX 12
static inline int64_t dp_pfa_ws_floats(int D) {
    return 2 * (int64_t)DP_PFA_ITEM_VECS * D + 2 * DP_PFA_ITEM_VECS
         + (int64_t)DP_PFA_R_MAX * DP_PFA_KCH + 2 * (int64_t)DP_PFA_KCH * D;
}

/* An attention item's walk over its tokens [t, t1), block by block: the rows n of the block
 * holding token t, the byte offset of KV head h0's first of them in the caches (*base), and
 * the distance from them to the same rows of the next block (*nxt, 0 at the end of the
 * range: the prefetches then touch lines already read). */
static inline int dp_item_block(const int32_t *bt, int t, int t1, int BS, int Hkv, int h0,
                                int64_t head_bytes, int64_t row, int64_t *base, int64_t *nxt) {
    const int blk = t / BS, off = t % BS;
    const int n = (BS - off) < (t1 - t) ? (BS - off) : (t1 - t);
    *base = ((int64_t)bt[blk] * Hkv + h0) * head_bytes + off * row;
    *nxt = t + n < t1 ? ((int64_t)bt[blk + 1] - bt[blk]) * Hkv * head_bytes - off * row : 0;
    return n;
}
/* The prefetch distance for head h (of an item's nh) of the block at hand, whose next block's
 * same rows are nxt bytes on (0: none): the next head's rows of this block, which lie right
 * after its own, or after the last head the item's first head in the next block. A block
 * ahead (all of its heads: 32-128 KB of K and V at Hkv = 8) the prefetched lines outran the
 * L1 and came back from L2; a head ahead they land just before their turn. Measured from
 * DRAM on a Zen 5 (32 x 1k tokens, Hkv = 8, D = 128, 2 threads, interleaved A/B): 1.0-1.09x
 * on the AVX-512 item (fp32 KV G = 4 1.09x, G = 8 1.06x), 1.02-1.06x on AVX2's. */
/* At least DP_PREFETCH_AHEAD bytes ahead, in whole heads: with bf16 KV at head dim 64 a
 * head's block is 2 KB, and prefetched one head ahead its lines came too late (0.81-0.96x
 * the block-ahead distance at G = 1-8, same box and harness; 4 KB heads gained as above). */
#define DP_PREFETCH_AHEAD 4096
static inline int64_t dp_prefetch_distance(int h, int nh, int64_t head_bytes, int64_t nxt) {
    const int k = (int)((DP_PREFETCH_AHEAD + head_bytes - 1) / head_bytes);  /* heads ahead */
    if (h + k < nh) return (int64_t)k * head_bytes;
    if (!nxt) return 0;
    const int j = h + k - nh < nh - 1 ? h + k - nh : nh - 1;  /* that head of the next block */
    return nxt + (int64_t)(j - h) * head_bytes;
}
/* A prefetch of a line on its way from DRAM: into L2 (prefetcht1), not L1. A prefetch into L1
 * holds one of the core's few L1 miss buffers (Zen 4: 24) for the whole DRAM latency, so at
 * ~150 ns on a VM one core kept at most ~10 GB/s in flight however far ahead it prefetched;
 * the L2 tracks several times as many misses, and the demand load then waits an L2 hit.
 * Measured on a 2-core Zen 4 VM (AVX-512, 32 MiB L3, rows 2-4x past it, the two hints
 * alternated in one process, each call paired with a streaming read): decode attention
 * 1.14-1.88x (fp32 KV G 1-4 0.51-0.59 -> 0.89-1.08 of the read bandwidth, bf16 G 8 D 128
 * 0.55 -> 0.70), forced to AVX2 1.16-1.77x; the decode linear's tile-ahead prefetch 1.14-1.29x
 * at 4 and 8 rows of x (1 row then read sequentially and took none); the streaming read that is
 * the benches' roofline 5-15% faster. Not measured on an Intel core nor on Zen 5 (where the
 * L1 hint reached 0.83-1.0 at G 1), nor a distance further ahead: 8 and 16 KB read at
 * 0.96-1.09x of 4 KB with this hint, 32 KB up to 0.55x. */
static inline __attribute__((always_inline)) void dp_prefetch_dram(const void *p) {
    __builtin_prefetch(p, 0, 2);
}
/* An item's online-softmax state for its heads' n query rows, empty: m = -inf, l = 0,
 * acc = 0 (D floats a row). */
/* The scores region of an attention item's workspace, in floats: a block's [BS, G] scores,
 * room for the softmax's vectors and the bf16 path's probability pairs to run past it (each
 * at most 32 floats past BS * G), then one more block's worth that the bf16 path uses. */
static inline int64_t dp_attn_scores_floats(int G, int BS) { return 2 * (int64_t)G * BS + 64; }
/* An item's whole workspace, in floats, for items over at most hmax KV heads: q (hmax * G * D,
 * which the AMX item's hi / lo q tiles also fill), the scores region, a query row (D), and
 * the AMX item's own: S's staging (32 * G), two P tiles (16 * G) and V's pair tiles (16 * D). */
static inline int64_t dp_attn_ws_floats(int hmax, int G, int D, int BS) {
    return (int64_t)hmax * G * D + dp_attn_scores_floats(G, BS) + D + 48 * (int64_t)G
         + 16 * (int64_t)D;
}

static inline void dp_item_reset(float *m, float *l, float *acc, int n, int D) {
    for (int g = 0; g < n; g++) { m[g] = -INFINITY; l[g] = 0.f; }
    memset(acc, 0, sizeof(float) * (size_t)n * D);
}

/* Independent FMA chains of the throughput probe (dp_fma_probe): 12 covers latency x ports
 * up to 4 x 2 with a margin, within the 16 ymm registers of AVX2. */
#define DP_FMA_CHAINS 12

/* Where the AVX512_BF16 item takes bf16 dot products (attention_avx512bf16.c, where they
 * measured faster): bf16 q and KV, GQA groups of 8 or more, whole 32-element chunks of the
 * head dim. */
#define DP_BF16_DOT_CHUNK 32
/* Whether this CPU's bf16 dot products pay (dp_set_bf16_dot, set once at load from a
 * throughput probe: dualpace/kernels/cpu.py bf16_dot_pays): 1 until then. */
extern int dp_bf16_dot_on;
static inline int dp_bf16_dot_applies(int q_dtype, int kv_dtype, int G, int D) {
    return __atomic_load_n(&dp_bf16_dot_on, __ATOMIC_RELAXED)
        && q_dtype == DP_BF16 && kv_dtype == DP_BF16 && G >= 8 && D % DP_BF16_DOT_CHUNK == 0;
}

/* The ISA whose bodies run the dense stages on a path: their activations are fp32, which
 * the bf16 dot product would round, so the AVX512_BF16 path runs the AVX-512 ones; so does
 * the AMX path, but for the projections dp_use_amx picks. */
static inline int dp_dense_isa(int isa) {
    return isa == DP_ISA_AVX512_BF16 || isa == DP_ISA_AMX ? DP_ISA_AVX512 : isa;
}

/* The decode linear's per-ISA bodies (linear_body.h): out rows [n_lo, n_hi) of
 * x[M,K] @ W[N,K]^T + bias; drivers in linear.c and layer.c split the rows over threads. */
typedef void (*dp_linear_fn)(const float *, int, int, const void *, int, int, const float *,
                             float *, int, int);
void dp_linear_scalar(const float *, int, int, const void *, int, int, const float *, float *,
                      int, int);
void dp_linear_avx2(const float *, int, int, const void *, int, int, const float *, float *,
                    int, int);
void dp_linear_avx512(const float *, int, int, const void *, int, int, const float *, float *,
                      int, int);
/* The AMX linear (linear_amx.c): x packed by dp_amx_pack_x into xp, W bf16; rows of W past
 * the claim's last whole 16 take dp_linear_avx512 on x. */
void dp_linear_amx(const float *x, const uint16_t *xp, int M, int K, const void *w, int N,
                   const float *bias, float *out, int n_lo, int n_hi);
void dp_amx_pack_x(const float *x, int M, int K, uint16_t *xp, int t, int nth);
/* Bytes of x packed for the tiles: blocks of 16 rows, zeros past M, K bf16 a row. */
static inline size_t dp_amx_packed_bytes(int M, int K) {
    return (size_t)((M + 15) / 16) * (size_t)K * 32;
}

/* From this many rows a bf16 projection on the AMX path takes the tiles; below, the AVX-512
 * body streams W at the same speed and keeps x in fp32. */
#define DP_AMX_MIN_ROWS 4
static inline int dp_use_amx(int isa, int w_dtype, int M, int K) {
    return isa == DP_ISA_AMX && w_dtype == DP_BF16 && M >= DP_AMX_MIN_ROWS && K % 32 == 0;
}

/* Past 1 MiB of packed x the L2 no longer keeps it beside the streaming W, and a panel's
 * passes read it from L3: there the AMX linear takes DP_AMX_GROUP_PANELS panels of 32 W rows
 * at a time, in K blocks of DP_AMX_K_BLOCK, so that one block of x serves all of them
 * (linear_amx.c). Up to DP_AMX_GROUP_MAX_ROWS rows of x: the carried tiles' room. On two
 * Emerald Rapids cores, Llama-3-8B's down projection (K = 14336) ran 1.13-1.2x faster at 64
 * rows and 1.5-1.6x at 128; the 128-row gate/up (K = 4096, 1 MiB of x) 0.9-0.95x, hence the
 * bound; K = 5120 at 128 rows (1.25 MiB) 1.07-1.12x. */
#define DP_AMX_GROUP_FROM (1 << 20)
#define DP_AMX_GROUP_PANELS 4
#define DP_AMX_GROUP_MAX_ROWS 128
#define DP_AMX_K_BLOCK 1024
static inline int dp_amx_grouped(int M, int K) {
    return M <= DP_AMX_GROUP_MAX_ROWS && dp_amx_packed_bytes(M, K) > DP_AMX_GROUP_FROM;
}

/* The calling thread's kept scratch buffer (linear.c), valid until its next call. */
void *dp_thread_scratch(size_t bytes);

/* The packed-x buffer of a call whose bf16 projections of M rows may take the tiles, room
 * for the widest input (K_max), or NULL: they all take the AVX-512 body (not the AMX path,
 * too few rows, no tile state from the OS, or no memory). The calling thread's own buffer
 * (dp_thread_scratch), valid until its next call: not freed by the caller. */
static inline uint16_t *dp_amx_buffer(int isa, int w_dtype, int M, int K_max) {
    if (!dp_use_amx(isa, w_dtype, M, 32) || !dp_amx_enable()) return NULL;
    return (uint16_t *)dp_thread_scratch(dp_amx_packed_bytes(M, K_max));
}
/* Inside a team task (team.c), by every member: x packed into buf for a projection that takes the tiles,
 * then a barrier; returns buf, or NULL (no barrier) when the projection takes the body. */
static inline const uint16_t *dp_amx_prepare(uint16_t *buf, int isa, int w_dtype,
                                             const float *x, int M, int K, int t, int nth) {
    if (!buf || !dp_use_amx(isa, w_dtype, M, K)) return NULL;
    dp_amx_pack_x(x, M, K, buf, t, nth);
    dp_team_barrier(nth);
    return buf;
}
/* Rows [lo, hi) of one projection: on the tiles when xp (dp_amx_prepare), else fn. */
static inline void dp_project(dp_linear_fn fn, const uint16_t *xp, const float *x, int M, int K,
                              const void *w, int w_dtype, int N, const float *bias, float *out,
                              int lo, int hi) {
    if (xp) dp_linear_amx(x, xp, M, K, w, N, bias, out, lo, hi);
    else fn(x, M, K, w, w_dtype, N, bias, out, lo, hi);
}

static inline dp_linear_fn dp_linear_for(int isa) {
    isa = dp_dense_isa(isa);
    return isa == DP_ISA_AVX512 ? dp_linear_avx512 : isa == DP_ISA_AVX2 ? dp_linear_avx2
         : isa == DP_ISA_SCALAR ? dp_linear_scalar : NULL;
}
/* The prefill GEMM's per-ISA tiles (gemm_body.h): columns [n_lo, n_hi) of a packed block
 * of x against W; the driver (gemm.c) packs, blocks and splits. */
typedef void (*dp_gemm_fn)(const float *, int, int, const char *, int, int64_t, int, int,
                           const float *, const float *, float *, int64_t, int);
void dp_gemm_avx2(const float *, int, int, const char *, int, int64_t, int, int,
                  const float *, const float *, float *, int64_t, int);
void dp_gemm_avx512(const float *, int, int, const char *, int, int64_t, int, int,
                    const float *, const float *, float *, int64_t, int);
/* The GEMM's K block (gemm.c): a block of x is DP_GEMM_MB x DP_GEMM_KC floats, a tile of
 * widened bf16/fp16 W GEMM_NR x DP_GEMM_KC (gemm_body.h). */
#define DP_GEMM_KC 512
/* Tiles per ISA: AVX2 6 W rows x 16 x rows (12 of the 16 ymm registers accumulate),
 * AVX-512 12 x 32 (24 of the 32 zmm). isa: a dense ISA (dp_dense_isa). */
#define DP_GEMM_NR_AVX2 6
#define DP_GEMM_NR_AVX512 12
static inline dp_gemm_fn dp_gemm_for(int isa) {
    return isa == DP_ISA_AVX512 ? dp_gemm_avx512 : isa == DP_ISA_AVX2 ? dp_gemm_avx2 : NULL;
}
static inline int dp_gemm_mr(int isa) { return isa == DP_ISA_AVX512 ? 32 : 16; }
static inline int dp_gemm_nr(int isa) {
    return isa == DP_ISA_AVX512 ? DP_GEMM_NR_AVX512 : DP_GEMM_NR_AVX2;
}
/* Rows [0, n) of a projection over the T threads of a region, in 16-row units: thread t
 * owns the t-th contiguous share and takes it from the front, `units` at a time
 * (DP_CLAIM_UNITS, or dp_project_units); a thread whose share is done takes the same
 * amount from the back of another's. The engine, the other tier and the clients share these cores, and a thread the kernel
 * preempts then leaves the rest of its share to the running one instead of holding the
 * barrier for it (single stream on 2 cores), while without preemption every thread still
 * streams one contiguous range. Every boundary is a multiple of 16 (or n): a row's result
 * (the SIMD body's, whatever the ISA's lanes) depends neither on which thread computed it
 * nor on how many there are. One share's front and back are one 64-bit word (CAS). */
#define DP_CLAIM_UNITS 2
#define DP_UNIT_ROWS 16  /* a multiple of every ISA's lanes (the SiLU body's tail) */

/* A projection's claim size in units: a group of panels where the AMX linear groups them
 * (dp_amx_grouped; xp: dp_amx_prepare's answer), else DP_CLAIM_UNITS. */
static inline int dp_project_units(const uint16_t *xp, int M, int K) {
    return xp && dp_amx_grouped(M, K) ? 32 / DP_UNIT_ROWS * DP_AMX_GROUP_PANELS
                                      : DP_CLAIM_UNITS;
}

typedef struct __attribute__((aligned(64))) { uint64_t front_back; } dp_share;  /* a line each */

static inline void dp_shares_init(dp_share *sh, int n, int T) {
    const int64_t units = (n + DP_UNIT_ROWS - 1) / DP_UNIT_ROWS;
    for (int t = 0; t < T; t++) {
        const uint64_t f = (uint64_t)(units * t / T), b = (uint64_t)(units * (t + 1) / T);
        sh[t].front_back = f | (b << 32);
    }
}

/* Units [u, u + take) of share *s, from its front or its back; 0 if it is empty. */
static inline int dp_share_take(dp_share *s, int from_back, int units, int *u) {
    uint64_t cur = __atomic_load_n(&s->front_back, __ATOMIC_RELAXED);
    for (;;) {
        const uint32_t f = (uint32_t)cur, b = (uint32_t)(cur >> 32);
        if (f >= b) return 0;
        const uint32_t take = b - f < (uint32_t)units ? b - f : (uint32_t)units;
        const uint64_t next = from_back ? f | ((uint64_t)(b - take) << 32)
                                        : (f + take) | ((uint64_t)b << 32);
        if (__atomic_compare_exchange_n(&s->front_back, &cur, next, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            *u = (int)(from_back ? b - take : f);
            return (int)take;
        }
    }
}

/* This thread's next rows [lo, hi): its own share first, then the others' backs. */
static inline int dp_claim_rows(dp_share *sh, int T, int self, int n, int units, int *lo,
                                int *hi) {
    for (int k = 0; k < T; k++) {
        int u;
        const int take = dp_share_take(&sh[(self + k) % T], k > 0, units, &u);
        if (take) {
            *lo = u * DP_UNIT_ROWS;
            *hi = (u + take) * DP_UNIT_ROWS < n ? (u + take) * DP_UNIT_ROWS : n;
            return 1;
        }
    }
    return 0;
}

static inline float dp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t dp_f32_to_bf16(float f) {  /* round to nearest even, NaN kept */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float dp_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = s;
        else { /* subnormal: renormalise */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) { m <<= 1; e--; }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) u = s | 0x7f800000u | (m << 13);
    else u = s | ((e + 127 - 15) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t dp_f32_to_f16(float f) {  /* round to nearest even */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000; int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t m = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
    if (e >= 31) return (uint16_t)(s | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)s;
        m |= 0x800000; int shift = 14 - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = (uint32_t)(e << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(s | r);
}
static inline float dp_load_elem(const void *p, int dtype, int64_t i) {
    switch (dtype) {
    case DP_BF16: return dp_bf16_to_f32(((const uint16_t *)p)[i]);
    case DP_F16: return dp_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}
static inline int dp_elem_size(int dtype) { return dtype == DP_F32 ? 4 : 2; }
/* dst[i] = src[off + i] * scale as fp32, i < n: the dtype switch once per row, not per element
 * (per element it was most of a short decode call's time). */
static inline void dp_load_row(const void *src, int dtype, int64_t off, int n, float scale,
                               float *dst) {
    const uint16_t *h = (const uint16_t *)src + off;
    const float *f = (const float *)src + off;
    switch (dtype) {
    case DP_BF16: for (int i = 0; i < n; i++) dst[i] = dp_bf16_to_f32(h[i]) * scale; break;
    case DP_F16: for (int i = 0; i < n; i++) dst[i] = dp_f16_to_f32(h[i]) * scale; break;
    default: for (int i = 0; i < n; i++) dst[i] = f[i] * scale;
    }
}
/* dst[off + i] = src[i] * scale in dtype, i < n. */
static inline void dp_store_row(void *dst, int dtype, int64_t off, const float *src, int n,
                                float scale) {
    uint16_t *h = (uint16_t *)dst + off;
    float *f = (float *)dst + off;
    switch (dtype) {
    case DP_BF16: for (int i = 0; i < n; i++) h[i] = dp_f32_to_bf16(src[i] * scale); break;
    case DP_F16: for (int i = 0; i < n; i++) h[i] = dp_f32_to_f16(src[i] * scale); break;
    default: for (int i = 0; i < n; i++) f[i] = src[i] * scale;
    }
}
#endif
