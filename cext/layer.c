/* The dense stages of one decoder layer for decode-sized batches, each stage one call
 * (paper §2.1, Fig. 2; issue 14 item 2):
 *
 *   dp_layer_pre   RMSNorm, packed QKV (+ bias), q/k norm, RoPE, KV append   -> q
 *   dp_layer_post  O proj (+ bias) + residual, RMSNorm, packed gate/up, SiLU * up,
 *                  down proj + residual                                       -> hidden
 *   dp_norm_linear RMSNorm then one projection (the final norm + LM head)
 *
 * and, for prefill chunks, whose projections are compute-bound GEMMs better left to torch's
 * BLAS, the elementwise phases between them as one call each: dp_rms_norm_rows,
 * dp_qkv_rope_append (q/k norm, RoPE, KV append after the QKV GEMM) and dp_silu_mul_rows.
 *
 * Each call is one OpenMP region whose phases are separated by barriers; every projection
 * goes through the weight-streaming linear of linear_body.h with W's rows claimed by the
 * threads (dp_claim_rows), so a decode step costs three calls a layer (these two and attention) instead of
 * two dozen torch dispatches. Activations are fp32; weights fp32, bf16 or fp16. The order of
 * every operation is transformers' (RMSNorm: x * rsqrt(mean(x^2) + eps), then * weight;
 * RoPE: x * cos + rotate_half(x) * sin; SiLU: g / (1 + exp(-g))), so results agree with the
 * torch stages to rounding. Every index is checked before anything is written. */
#include <math.h>
#include <omp.h>
#include "dp_internal.h"

typedef void (*dp_silu_mul_fn)(const float *, const float *, float *, int);

void dp_silu_mul_scalar(const float *, const float *, float *, int);
void dp_silu_mul_avx2(const float *, const float *, float *, int);
void dp_silu_mul_avx512(const float *, const float *, float *, int);

typedef struct { dp_linear_fn linear; dp_silu_mul_fn silu_mul; } isa_fns;

static int pick(int isa, isa_fns *f) {
    f->linear = dp_linear_for(isa);
    isa = dp_dense_isa(isa);
    f->silu_mul = isa == DP_ISA_AVX512 ? dp_silu_mul_avx512 : isa == DP_ISA_AVX2
                ? dp_silu_mul_avx2 : dp_silu_mul_scalar;
    return f->linear ? 0 : -1;
}

/* out = x * rsqrt(mean(x^2) + eps) * w, the sum of squares in double. */
static void rms_norm_row(const float *x, const float *w, float eps, int n, float *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = 1.f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* NeoX half rotation of one head in place, cos/sin rows of the position. */
static void rope_head(float *x, const float *cos, const float *sin, int D) {
    const int h = D / 2;
    for (int i = 0; i < h; i++) {
        const float a = x[i], b = x[i + h];
        x[i] = a * cos[i] + (-b) * sin[i];
        x[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}

/* Positions inside the RoPE table and slots inside the cache, checked before any write. */
static int check_indices(const dp_layer_dims *m, int T, const int64_t *positions,
                         const int64_t *slots, int64_t num_blocks, int BS) {
    for (int r = 0; r < T; r++) {
        if (positions[r] < 0 || positions[r] >= m->max_positions) return -3;
        if (slots[r] < 0 || slots[r] >= num_blocks * BS) return -4;
    }
    return 0;
}

/* One (row, head) of the projected qkv [T, (Hq + 2 Hkv) D]: a q head -> q_out (q norm, RoPE);
 * a KV head: k norm and RoPE in place, then k and v into the row's slot. */
static void finish_qkv_item(const dp_layer_dims *m, const dp_layer_weights *w, float *qkv,
                            int64_t it, const int64_t *positions, const int64_t *slots,
                            void *k_cache, void *v_cache, int kv_dtype, int BS, float *q_out) {
    const int Hq = m->num_heads, Hkv = m->num_kv_heads, D = m->head_dim;
    const int heads = Hq + Hkv, N = (Hq + 2 * Hkv) * D;
    const int r = (int)(it / heads), h = (int)(it % heads);
    const float *cos = m->cos + positions[r] * D, *sin = m->sin + positions[r] * D;
    float *row = qkv + (int64_t)r * N;
    if (h < Hq) {
        float *q = q_out + ((int64_t)r * Hq + h) * D;
        if (w->q_norm) rms_norm_row(row + h * D, w->q_norm, m->eps, D, q);
        else memcpy(q, row + h * D, sizeof(float) * D);
        rope_head(q, cos, sin, D);
        return;
    }
    const int kh = h - Hq;
    float *k = row + (Hq + kh) * D;
    const float *v = row + (Hq + Hkv + kh) * D;
    if (w->k_norm) rms_norm_row(k, w->k_norm, m->eps, D, k);
    rope_head(k, cos, sin, D);
    const int64_t block = slots[r] / BS, off = slots[r] % BS;
    const int64_t at = ((block * Hkv + kh) * BS + off) * D;
    dp_store_row(k_cache, kv_dtype, at, k, D, 1.f);
    dp_store_row(v_cache, kv_dtype, at, v, D, 1.f);
}

int dp_layer_pre(const dp_layer_dims *m, const dp_layer_weights *w, const float *hidden, int T,
                 const int64_t *positions, const int64_t *slots, void *k_cache, void *v_cache,
                 int kv_dtype, int64_t num_blocks, int BS, float *q_out, float *scratch,
                 int isa, int num_threads) {
    isa_fns f;
    if (pick(isa, &f)) return -1;
    const int H = m->hidden, Hq = m->num_heads, Hkv = m->num_kv_heads, D = m->head_dim;
    if (T <= 0 || H % 16 || D % 2 || BS <= 0 || num_blocks <= 0) return -2;
    const int bad = check_indices(m, T, positions, slots, num_blocks, BS);
    if (bad) return bad;
    const int N = (Hq + 2 * Hkv) * D;
    float *x = scratch, *qkv = scratch + (int64_t)T * H;
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh[nt];
    dp_shares_init(sh, N, nt);
    uint16_t *buf = dp_amx_buffer(isa, m->w_dtype, T, H);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), nth = omp_get_num_threads();
        for (int r = t; r < T; r += nth)
            rms_norm_row(hidden + (int64_t)r * H, w->input_norm, m->eps, H, x + (int64_t)r * H);
#pragma omp barrier
        const uint16_t *xp = dp_amx_prepare(buf, isa, m->w_dtype, x, T, H, t, nth);
        for (int lo, hi; dp_claim_rows(sh, nt, t, N, &lo, &hi);)
            dp_project(f.linear, xp, x, T, H, w->qkv, m->w_dtype, N, w->qkv_bias, qkv, lo, hi);
#pragma omp barrier
        for (int64_t it = t; it < (int64_t)T * (Hq + Hkv); it += nth)
            finish_qkv_item(m, w, qkv, it, positions, slots, k_cache, v_cache, kv_dtype, BS,
                            q_out);
    }
    return 0;
}

/* --- the elementwise phases alone, for prefill chunks whose GEMMs run elsewhere ----------- */

int dp_rms_norm_rows(const float *x, int T, int H, const float *w, float eps, float *out,
                     int num_threads) {
    if (T <= 0 || H <= 0) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < T; r++)
        rms_norm_row(x + (int64_t)r * H, w, eps, H, out + (int64_t)r * H);
    return 0;
}

int dp_qkv_rope_append(const dp_layer_dims *m, const dp_layer_weights *w, float *qkv, int T,
                       const int64_t *positions, const int64_t *slots, void *k_cache,
                       void *v_cache, int kv_dtype, int64_t num_blocks, int BS, float *q_out,
                       int num_threads) {
    if (T <= 0 || m->head_dim % 2 || BS <= 0 || num_blocks <= 0) return -2;
    const int bad = check_indices(m, T, positions, slots, num_blocks, BS);
    if (bad) return bad;
    const int64_t items = (int64_t)T * (m->num_heads + m->num_kv_heads);
    const int nt = num_threads > 0 ? num_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t it = 0; it < items; it++)
        finish_qkv_item(m, w, qkv, it, positions, slots, k_cache, v_cache, kv_dtype, BS, q_out);
    return 0;
}

int dp_silu_mul_rows(const float *gate_up, int T, int I, float *act, int isa, int num_threads) {
    isa_fns f;
    if (pick(isa, &f)) return -1;
    if (T <= 0 || I <= 0) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < T; r++)
        f.silu_mul(gate_up + (int64_t)r * 2 * I, gate_up + (int64_t)r * 2 * I + I,
                   act + (int64_t)r * I, I);
    return 0;
}

int dp_layer_post(const dp_layer_dims *m, const dp_layer_weights *w, const float *hidden,
                  const float *attn, int T, float *hidden_out, float *scratch, int isa,
                  int num_threads) {
    isa_fns f;
    if (pick(isa, &f)) return -1;
    const int H = m->hidden, Q = m->num_heads * m->head_dim, I = m->intermediate;
    if (T <= 0 || H % 16 || Q % 16 || I % 16) return -2;
    float *o = scratch, *x = o + (int64_t)T * H, *gu = x + (int64_t)T * H;
    float *act = gu + (int64_t)T * 2 * I;
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh_o[nt], sh_gu[nt], sh_down[nt];
    dp_shares_init(sh_o, H, nt);
    dp_shares_init(sh_gu, I, nt);
    dp_shares_init(sh_down, H, nt);
    const int k_max = Q > H ? (Q > I ? Q : I) : (H > I ? H : I);
    uint16_t *buf = dp_amx_buffer(isa, m->w_dtype, T, k_max);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), nth = omp_get_num_threads();
        const uint16_t *xp = dp_amx_prepare(buf, isa, m->w_dtype, attn, T, Q, t, nth);
        for (int lo, hi; dp_claim_rows(sh_o, nt, t, H, &lo, &hi);) {
            dp_project(f.linear, xp, attn, T, Q, w->o, m->w_dtype, H, w->o_bias, o, lo, hi);
            for (int r = 0; r < T; r++)
                for (int n = lo; n < hi; n++)
                    hidden_out[(int64_t)r * H + n] = hidden[(int64_t)r * H + n] + o[(int64_t)r * H + n];
        }
#pragma omp barrier
        for (int r = t; r < T; r += nth)
            rms_norm_row(hidden_out + (int64_t)r * H, w->post_norm, m->eps, H, x + (int64_t)r * H);
#pragma omp barrier
        /* gate rows [lo, hi) and the matching up rows [I + lo, I + hi): this claim's slice
         * of the activation needs nothing another thread computes */
        xp = dp_amx_prepare(buf, isa, m->w_dtype, x, T, H, t, nth);
        for (int lo, hi; dp_claim_rows(sh_gu, nt, t, I, &lo, &hi);) {
            dp_project(f.linear, xp, x, T, H, w->gate_up, m->w_dtype, 2 * I, NULL, gu, lo, hi);
            dp_project(f.linear, xp, x, T, H, w->gate_up, m->w_dtype, 2 * I, NULL, gu, I + lo,
                       I + hi);
            for (int r = 0; r < T; r++)
                f.silu_mul(gu + (int64_t)r * 2 * I + lo, gu + (int64_t)r * 2 * I + I + lo,
                           act + (int64_t)r * I + lo, hi - lo);
        }
#pragma omp barrier
        xp = dp_amx_prepare(buf, isa, m->w_dtype, act, T, I, t, nth);
        for (int lo, hi; dp_claim_rows(sh_down, nt, t, H, &lo, &hi);) {
            dp_project(f.linear, xp, act, T, I, w->down, m->w_dtype, H, NULL, o, lo, hi);
            for (int r = 0; r < T; r++)
                for (int n = lo; n < hi; n++)
                    hidden_out[(int64_t)r * H + n] += o[(int64_t)r * H + n];
        }
    }
    return 0;
}

int dp_norm_linear(const float *x, int T, int K, const float *norm, float eps, const void *w,
                   int w_dtype, int N, float *out, float *scratch, int isa, int num_threads) {
    isa_fns f;
    if (pick(isa, &f)) return -1;
    if (T <= 0 || K % 16 || N <= 0) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh[nt];
    dp_shares_init(sh, N, nt);
    uint16_t *buf = dp_amx_buffer(isa, w_dtype, T, K);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num(), nth = omp_get_num_threads();
        for (int r = t; r < T; r += nth)
            rms_norm_row(x + (int64_t)r * K, norm, eps, K, scratch + (int64_t)r * K);
#pragma omp barrier
        const uint16_t *xp = dp_amx_prepare(buf, isa, w_dtype, scratch, T, K, t, nth);
        for (int lo, hi; dp_claim_rows(sh, nt, t, N, &lo, &hi);)
            dp_project(f.linear, xp, scratch, T, K, w, w_dtype, N, NULL, out, lo, hi);
    }
    return 0;
}
