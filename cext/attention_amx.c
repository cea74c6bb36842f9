/* Paged decode attention on AMX tiles (Sapphire Rapids and later), bf16 KV: the `amx` path's
 * item where dp_attn_amx_applies, the AVX512_BF16 item (attention_avx512bf16.c) elsewhere.
 *
 * Why: at GQA 8 the FMA routes are compute-bound on an Intel core. Per (token, KV head) at
 * head dim 128 they spend 128 512-bit FMAs plus the widening of every K and V chunk and a
 * horizontal reduction per score; on a 2-core Xeon VM (AMX) the AVX-512 item took ~47 ns a
 * token and KV head on one core with the KV in L1 (the FMAs alone ~18), and read at
 * 0.42-0.65 of the DRAM bandwidth at 32k tokens. One TDPBF16PS does 16 tokens x 16 columns x
 * 32 elements. Measured against it there: 1.16-1.22x from DRAM, 1.46-1.77x in L1 (README).
 *
 *   QK: S[16 tokens][N] = K[16 tokens][32 d] . B, A = sixteen K rows as they lie in the cache
 *       (one tile load, stride = the row), B = q in the tiles' pair-interleaved ("VNNI")
 *       form, built once per item: row r of chunk c holds (q[g][32c+2r], q[g][32c+2r+1]) for
 *       every column g. An fp32 q (the serving case: fp32 activations over bf16 KV) goes in
 *       as two bf16 parts, q = hi + lo (lo = the bf16 rounding of q - hi), side by side as
 *       columns g and G + g: N = 2G, one product, and the score is their sum (~2^-16
 *       relative, where hi alone is 2^-8). A bf16 q is exact: N = G. The scale multiplies
 *       the summed scores. The tile's rows are token-major, the order the softmax
 *       (attention_simd.h's prim_softmax) and PV take.
 *   PV: acc[G][16 d] += P[G][tokens] . V[tokens][16 d], A = the probabilities head-major in
 *       bf16, B = V's rows pair-interleaved: unpacklo/hi_epi16 of two token rows, the
 *       avx512bf16 item's "pv order" of d, undone once per item. For an fp32 q the
 *       probabilities go in as hi + lo too, two P tiles multiplied into the same
 *       accumulators against the same V tile (A = [hi | lo] against V's pairs written twice
 *       took twice the repack's stores); for a bf16 q they are rounded to bf16 as
 *       FlashAttention rounds P (attention_avx512bf16.c's bound). The accumulators stay fp32
 *       in memory: a tile load and store per 16 d.
 *   Everything else as attention_body.h: the online softmax per block, the prefetch of the
 *   next head's rows, m / l / acc per segment for the driver's merge.
 * Blocks go through in 16-token tiles, so the route takes block sizes that are a multiple of
 * 16 (a tile's rows never leave the block) and head dims that are a multiple of 16: whole
 * 32-element chunks and, for an odd multiple (80: Phi-2, StableLM), a last 16-element one on
 * tiles of its own shape (a 64-byte K tile there would read past the row, and at a block's
 * last row past the block); on a 2-core Xeon VM head dim 80 read 1.03x (block 16) to
 * 1.19-1.20x (blocks 32, 64) faster than on the AVX-512 route (32 x 1k tokens, interleaved
 * runs). The last tile of a sequence reads up to 15 rows past its length inside its block:
 * their scores are never read, and their V rows are zeros in the repack, never loaded (the
 * slots may hold NaN, and 0 x NaN is NaN in a tile product too). Linux grants the tile state
 * on request (dp_amx_enable, linear_amx.c); without it the item takes the AVX-512 route. */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,amx-tile,amx-bf16")
#include "avx512_vec.h"
#include "attention_simd.h"

#define AMX_T 16   /* tokens a tile */
#define AMX_CH 32  /* head-dim elements a chunk (a K tile's row: 64 bytes) */
#define AMX_TAIL 16  /* the last chunk of a head dim that is an odd multiple of 16 */

/* Tiles: 0 S (16 tokens x N fp32), 1 K (16 tokens x 32 d), 2 q (16 pairs x N), 3 acc (G x 16
 * fp32), 4 P (G x 16 bf16), 5 V (8 pairs x 16 d), 6 P's lo parts (two), 7 K's last 16 d of a
 * head dim that is an odd multiple of 16 (16 tokens x 16 d). That tail's q tile is 8 pairs x
 * N: tile 6 for a bf16 q, which has no lo parts; tile 5 for an fp32 q, whose N = 2G = 16
 * columns make it V's shape (64-byte rows). */
static void tiles_config(int G, int two) {
    dp_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    const int N = two ? 2 * G : G;
    c.rows[0] = AMX_T; c.colsb[0] = (uint16_t)(N * 4);
    c.rows[1] = AMX_T; c.colsb[1] = AMX_CH * 2;
    c.rows[2] = AMX_CH / 2; c.colsb[2] = (uint16_t)(N * 4);
    c.rows[3] = (uint8_t)G; c.colsb[3] = 64;
    c.rows[4] = (uint8_t)G; c.colsb[4] = AMX_T * 2;
    c.rows[5] = AMX_T / 2; c.colsb[5] = 64;
    if (two) {
        c.rows[6] = (uint8_t)G; c.colsb[6] = AMX_T * 2;
    } else {
        c.rows[6] = AMX_TAIL / 2; c.colsb[6] = (uint16_t)(N * 4);
    }
    c.rows[7] = AMX_T; c.colsb[7] = AMX_TAIL * 2;
    _tile_loadconfig(&c);
}

int dp_attn_amx_applies(int q_dtype, int kv_dtype, int G, int D, int BS) {
    const int two = q_dtype != DP_BF16;
    return kv_dtype == DP_BF16 && D % AMX_TAIL == 0 && BS % AMX_T == 0
        && G >= DP_AMX_ATTN_MIN_G && (two ? 2 * G : G) <= 16 && dp_amx_enable();
}

/* Chunk c's B tile of q at qb + c * 16 * N * 2 (uint16): row r, column j holds the pair
 * (x[32c + 2r], x[32c + 2r + 1]) of column j's vector; column g < G is head g's q (its bf16
 * hi part when two), G + g its lo part (two). Unscaled. A chunk's 32 elements in bf16 are 16
 * such pairs, one 32-bit lane each: one scatter puts them down column g. (Element by element
 * in scalar code this took as long as the item's tiles over ~100 tokens.) A last chunk of 16
 * elements (D an odd multiple of 16) is a tile of 8 rows, the first 8 lanes' pairs. */
static void amx_pack_q(const float *qrow, int D, int G, int g, int two, uint16_t *qb) {
    const int N = two ? 2 * G : G;
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(N));
    for (int c = 0; c * AMX_CH < D; c++) {
        const int half = D - c * AMX_CH == AMX_TAIL;
        const __mmask16 live = half ? 0xFF : 0xFFFF;
        const __m512 x0 = vloadu(qrow + c * AMX_CH);
        const __m512 x1 = half ? _mm512_setzero_ps() : vloadu(qrow + c * AMX_CH + VW);
        const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);  /* x0's in the low half */
        uint32_t *col = (uint32_t *)(qb + (int64_t)c * (AMX_CH / 2) * N * 2);
        _mm512_mask_i32scatter_epi32(col + g, live, rows, hi, 4);
        if (two) {
            /* what the bf16 parts leave: x - hi, element by element in the same order */
            const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
            const __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(
                hi, _mm512_set1_epi32((int)0xFFFF0000u)));
            /* lane r of h0 is element 2r, of h1 element 2r + 1; x0, x1 hold elements 0-15,
             * 16-31: the residuals in pair order take x's even and odd elements */
            const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                                 26, 28, 30);
            const __m512 xe = _mm512_permutex2var_ps(x0, ev, x1);
            const __m512 xo = _mm512_permutex2var_ps(x0, _mm512_add_epi32(ev, _mm512_set1_epi32(1)), x1);
            const __m512i le = (__m512i)_mm512_castsi256_si512(
                (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(xe, h0)));
            const __m512i lo = (__m512i)_mm512_castsi256_si512(
                (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(xo, h1)));
            /* pair r = (even residual r, odd residual r) */
            const __m512i pr = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(le)),
                                               _mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                                   _mm512_castsi512_si256(lo)), 16));
            _mm512_mask_i32scatter_epi32(col + G + g, live, rows, pr, 4);
        }
    }
}

/* The scores of one 16-token tile: s[t * G + g] = scale * (S[t][g] (+ S[t][G + g])), t < 16
 * (rows past the block's n are never read). */
static inline __attribute__((always_inline)) void amx_qk_tile(
    const char *k, int64_t row, const uint16_t *qb, int nch, int tail, int G, int two,
    float scale, float *s, float *stage) {
    const int N = two ? 2 * G : G;
    _tile_zero(0);
    for (int c = 0; c < nch; c++) {
        _tile_loadd(1, k + c * AMX_CH * 2, row);
        _tile_loadd(2, qb + (int64_t)c * (AMX_CH / 2) * N * 2, N * 4);
        _tile_dpbf16ps(0, 1, 2);
    }
    if (tail) {  /* the last 16 d: 32 bytes of each row, the q tile's 8 pairs */
        _tile_loadd(7, k + nch * AMX_CH * 2, row);
        if (two) {
            _tile_loadd(5, qb + (int64_t)nch * (AMX_CH / 2) * N * 2, N * 4);
            _tile_dpbf16ps(0, 7, 5);
        } else {
            _tile_loadd(6, qb + (int64_t)nch * (AMX_CH / 2) * N * 2, N * 4);
            _tile_dpbf16ps(0, 7, 6);
        }
    }
    const VEC sc = vset1(scale);
    if (!two) {
        _tile_stored(0, s, G * 4);
        for (int i = 0; i < AMX_T * G; i += VW) vstoreu(s + i, vmul(vloadu(s + i), sc));
        return;
    }
    _tile_stored(0, stage, N * 4);
    if (G == 8) {  /* a row is one vector, hi in lanes 0-7 and lo in 8-15: two rows a vector */
        for (int t = 0; t < AMX_T; t += 2) {
            const VEC r0 = vloadu(stage + t * 16), r1 = vloadu(stage + (t + 1) * 16);
            const VEC hi = _mm512_shuffle_f32x4(r0, r1, 0x44), lo = _mm512_shuffle_f32x4(r0, r1, 0xEE);
            vstoreu(s + t * 8, vmul(vadd(hi, lo), sc));
        }
        return;
    }
    for (int t = 0; t < AMX_T; t++)
        for (int g = 0; g < G; g++)
            s[t * G + g] = scale * (stage[t * N + g] + stage[t * N + G + g]);
}

/* The P tiles of tokens [t0, t0 + 16), zeros from n on: pa[g][0..15] head g's probabilities
 * in bf16, pl[g][0..15] the bf16 rounding of what that left (two). */
static inline __attribute__((always_inline)) void amx_pack_p(
    const float *s, int t0, int n, int G, int two, uint16_t *pa, uint16_t *pl) {
    const int live = n - t0 < AMX_T ? n - t0 : AMX_T;
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(G));
    for (int g = 0; g < G; g++) {
        const __m512 x = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes_below(live), idx,
                                                  s + (int64_t)t0 * G + g, 4);
        const __m256bh hi = _mm512_cvtneps_pbh(x);
        _mm256_storeu_si256((__m256i *)(pa + g * AMX_T), (__m256i)hi);
        if (two) {
            const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32((__m256i)hi), 16));
            _mm256_storeu_si256((__m256i *)(pl + g * AMX_T),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(x, back)));
        }
    }
}

/* The repack's prefetches for one line (at bytes into the row) of a pair of rows: their K
 * lines nxt bytes on into L1, their V lines far bytes on into L2. */
static inline __attribute__((always_inline)) void prefetch_rows_line(
    const char *k, const char *va, const char *vr, int64_t ka, int64_t kb, int64_t at,
    int64_t nxt, int64_t far) {
    if (nxt) {
        _mm_prefetch(k + ka + at + nxt, _MM_HINT_T0);
        _mm_prefetch(k + kb + at + nxt, _MM_HINT_T0);
    }
    if (far) {
        _mm_prefetch(va + at + far, _MM_HINT_T1);
        _mm_prefetch(vr + at + far, _MM_HINT_T1);
    }
}

/* V rows [t0, t0 + 16) pair-interleaved, zeros from n on (never loaded: a slot past the
 * sequence may hold NaN): chunk c's two B tiles (unpacklo, unpackhi) at vb + (c * 2 + h) * 128
 * (uint32 pairs, 8 rows of 16); a last 16 d (tail) one tile at vb + nch * 2 * 128, in natural
 * order. Prefetches the same rows' K lines nxt bytes on into L1 (the next head's, whose QK
 * comes next) and their V lines far bytes on into L2. */
static inline __attribute__((always_inline)) void amx_pack_v(
    const char *v, const char *k, int64_t row, int t0, int n, int nch, int tail, uint32_t *vb,
    int64_t nxt, int64_t far) {
    for (int p = 0; p < AMX_T / 2; p++) {
        const int64_t ta = t0 + 2 * p, tb = ta + 1;
        const char *va = v + ta * row, *vr = v + tb * row;
        for (int c = 0; c < nch; c++) {
            prefetch_rows_line(k, va, vr, ta * row, tb * row, c * 64, nxt, far);
            const __m512i r0 = ta < n ? _mm512_loadu_si512(va + c * 64) : _mm512_setzero_si512();
            const __m512i r1 = tb < n ? _mm512_loadu_si512(vr + c * 64) : _mm512_setzero_si512();
            uint32_t *lo = vb + (int64_t)c * 2 * 128;
            _mm512_storeu_si512(lo + p * 16, _mm512_unpacklo_epi16(r0, r1));
            _mm512_storeu_si512(lo + 128 + p * 16, _mm512_unpackhi_epi16(r0, r1));
        }
        if (tail) {  /* rows are 32-byte multiples: offset nch * 64 is the tail's line */
            const int64_t at = nch * 64;
            prefetch_rows_line(k, va, vr, ta * row, tb * row, at, nxt, far);
            const __m256i r0 = ta < n ? _mm256_loadu_si256((const __m256i *)(va + at))
                                      : _mm256_setzero_si256();
            const __m256i r1 = tb < n ? _mm256_loadu_si256((const __m256i *)(vr + at))
                                      : _mm256_setzero_si256();
            _mm512_storeu_si512(vb + (int64_t)nch * 2 * 128 + p * 16, _mm512_or_si512(
                _mm512_cvtepu16_epi32(r0), _mm512_slli_epi32(_mm512_cvtepu16_epi32(r1), 16)));
        }
    }
}

/* PV's line prefetches, spread over its tile products: line `line` of rows r0 .. r1 - 1,
 * the next head's V into L1, the next block's K into L2. */
static inline __attribute__((always_inline)) void pv_prefetch(
    const char *vp, const char *kp, int64_t row, int r0, int r1, int line, int64_t nxt,
    int64_t far) {
    for (int r = r0; r < r1; r++) {
        const int64_t at = r * row + line * 64;
        if (nxt) _mm_prefetch(vp + at + nxt, _MM_HINT_T0);
        if (far) _mm_prefetch(kp + at + far, _MM_HINT_T1);
    }
}
/* acc[G][16 d] at ac += P . V: the accumulators tile-loaded, multiplied into (twice, hi and
 * lo, for an fp32 q) and stored back. */
static inline __attribute__((always_inline)) void pv_tile(float *ac, int D, const uint32_t *vt,
                                                          int two) {
    _tile_loadd(3, ac, D * 4);
    _tile_loadd(5, vt, 64);
    _tile_dpbf16ps(3, 4, 5);
    if (two) _tile_dpbf16ps(3, 6, 5);
    _tile_stored(3, ac, D * 4);
}

/* The per-item scratch. */
typedef struct {
    float *s;        /* [BS * G + 32] scores, then probabilities, of one block and head */
    float *stage;    /* [16 * N] S of one tile (two) */
    uint16_t *pa;    /* [G * 16] P tile */
    uint16_t *pl;    /* [G * 16] P's lo tile (two) */
    uint32_t *vb;    /* [D / 32 * 2 * 128] V's B tiles of one tile of tokens */
} amx_ws;

/* One block (n rows) of one KV head: QK a tile at a time into s, the online softmax of the
 * group's G heads (attention_simd.h), then PV a tile at a time: accumulators tile-loaded,
 * multiplied into and stored back per 16 d. Prefetches: the next head's rows (nxt bytes on)
 * into L1, its K during the repack of V and its V during PV; the next block's same rows
 * (far bytes on) into L2, its V during the repack and its K during PV. A head's QK, softmax
 * and PV each wait on the one before, and the core stalls on a prefetch that finds every
 * line-fill buffer taken, so the prefetches are spread through the loops that take the most
 * time: with the next head's K prefetched during QK and V during the repack (bursts of 64
 * lines) the G = 8 kernel ran at about the sum of its compute and its DRAM time; with the
 * next block in L2 1.05-1.2x faster, with its K prefetched during PV rather than in bursts
 * during QK another 1.04-1.06x (2-core Xeon VM, 32 x 1k tokens, interleaved runs). */
static inline __attribute__((always_inline)) void block_head_amx(
    const char *kp, const char *vp, int n, int D, const uint16_t *qb, float scale, float *m,
    float *l, float *acc, const amx_ws *w, int64_t nxt, int64_t far, const int G,
    const int two) {
    const int64_t row = (int64_t)D * 2;
    const int nch = D / AMX_CH, tail = D % AMX_CH != 0;
    for (int t0 = 0; t0 < n; t0 += AMX_T)
        amx_qk_tile(kp + t0 * row, row, qb, nch, tail, G, two, scale, w->s + t0 * G,
                    w->stage);
    prim_softmax(w->s, n, G, m, l, acc, D);
    for (int t0 = 0; t0 < n; t0 += AMX_T) {
        amx_pack_v(vp, kp, row, t0, n, nch, tail, w->vb, nxt, far);
        amx_pack_p(w->s, t0, n, G, two, w->pa, w->pl);
        _tile_loadd(4, w->pa, AMX_T * 2);
        if (two) _tile_loadd(6, w->pl, AMX_T * 2);
        for (int c = 0; c < nch; c++)
            for (int h = 0; h < 2; h++) {  /* line c of 8 rows a product */
                pv_prefetch(vp, kp, row, t0 + h * 8, t0 + h * 8 + 8, c, nxt, far);
                pv_tile(acc + c * AMX_CH + h * 16, D, w->vb + (int64_t)(c * 2 + h) * 128, two);
            }
        if (tail) {  /* the tail's line of all 16 rows */
            pv_prefetch(vp, kp, row, t0, t0 + AMX_T, nch, nxt, far);
            pv_tile(acc + nch * AMX_CH, D, w->vb + (int64_t)nch * 2 * 128, two);
        }
    }
}

/* ws (floats, dp_attn_ws_floats): q's B tiles (nh * D * N / 2), the scores (BS * G + 32),
 * S's staging (16 * N), the P tiles (16 * G), V's B tiles (8 * D), a query row (D). */
static inline __attribute__((always_inline)) void item_amx(
    const dp_attn_args *a, int b, int h0, int h1, int t0, int t1, float *m, float *l,
    float *acc, float *ws, const int G, const int two) {
    const int D = a->D, BS = a->BS, Hkv = a->Hkv, N = two ? 2 * G : G;
    const int64_t row = (int64_t)D * 2, head_bytes = (int64_t)BS * row;
    const int nh = h1 - h0;
    uint16_t *qb = (uint16_t *)ws;  /* [nh][D * N] */
    amx_ws w;
    w.s = ws + (int64_t)nh * D * N / 2;
    w.stage = w.s + (int64_t)BS * G + 32;
    w.pa = (uint16_t *)(w.stage + AMX_T * N);
    w.pl = w.pa + G * AMX_T;
    w.vb = (uint32_t *)(w.pl + G * AMX_T);
    float *qrow = (float *)(w.vb + (int64_t)D / AMX_TAIL * 128);
    const int64_t q0 = ((int64_t)b * a->Hq + (int64_t)h0 * G) * D;
    for (int h = 0; h < nh; h++)
        for (int g = 0; g < G; g++) {
            dp_load_row(a->q, a->q_dtype, q0 + ((int64_t)h * G + g) * D, D, 1.f, qrow);
            amx_pack_q(qrow, D, G, g, two, qb + (int64_t)h * D * N);
        }
    m += h0 * G; l += h0 * G; acc += (int64_t)h0 * G * D;
    dp_item_reset(m, l, acc, nh * G, D);
    tiles_config(G, two);
    const int32_t *bt = a->block_tables + (int64_t)b * a->max_blocks;
    for (int t = t0; t < t1;) {
        int64_t base, nxt;  /* segments start on a block (attention.c): n = BS but the last */
        const int n = dp_item_block(bt, t, t1, BS, Hkv, h0, head_bytes, row, &base, &nxt);
        for (int h = 0; h < nh; h++) {
            const int64_t hb = base + h * head_bytes;
            block_head_amx((const char *)a->k_cache + hb, (const char *)a->v_cache + hb, n, D,
                           qb + (int64_t)h * D * N, a->scale, m + h * G, l + h * G,
                           acc + (int64_t)h * G * D, &w,
                           dp_prefetch_distance(h, nh, head_bytes, nxt), nxt, G, two);
        }
        t += n;
    }
    _tile_release();
    for (int r = 0; r < nh * G; r++)  /* each row's whole chunks; a tail is natural order */
        pv_order_to_natural(acc + (int64_t)r * D, D / AMX_CH * AMX_CH);
}

/* Constant group sizes keep the loops' bounds known; the AVX512_BF16 item where the tiles do
 * not apply. */
#define DP_CASE(g) \
    case g: \
        if (two) item_amx(a, b, h0, h1, t0, t1, m, l, acc, ws, (g), 1); \
        else item_amx(a, b, h0, h1, t0, t1, m, l, acc, ws, (g), 0); \
        return;
void dp_attn_item_amx(const dp_attn_args *a, int b, int h0, int h1, int t0, int t1,
                      float *m, float *l, float *acc, float *ws) {
    if (!dp_attn_amx_applies(a->q_dtype, a->kv_dtype, a->G, a->D, a->BS)) {
        dp_attn_item_avx512bf16(a, b, h0, h1, t0, t1, m, l, acc, ws);
        return;
    }
    const int two = a->q_dtype != DP_BF16;
    switch (a->G) {
    DP_CASE(8)
    default:
        if (two) item_amx(a, b, h0, h1, t0, t1, m, l, acc, ws, a->G, 1);
        else item_amx(a, b, h0, h1, t0, t1, m, l, acc, ws, a->G, 0);
    }
}
#undef DP_CASE
