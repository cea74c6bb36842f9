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
 * Each call is one task of the thread team (team.c) whose phases are separated by
 * barriers; every projection
 * goes through the weight-streaming linear of linear_body.h with W's rows claimed by the
 * threads (dp_claim_rows), so a decode step costs three calls a layer (these two and attention) instead of
 * two dozen torch dispatches. Activations are fp32; weights fp32, bf16 or fp16. The order of
 * every operation is transformers' (RMSNorm: x * rsqrt(mean(x^2) + eps), then * weight;
 * RoPE: x * cos + rotate_half(x) * sin; SiLU: g / (1 + exp(-g))), so results agree with the
 * torch stages to rounding. Every index is checked before anything is written. */
#include <math.h>
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

typedef struct {
    const dp_layer_dims *m; const dp_layer_weights *w; const float *hidden; int T;
    const int64_t *positions, *slots; void *k_cache, *v_cache; int kv_dtype, BS;
    float *q_out, *x, *qkv; int isa, nt, N; dp_linear_fn linear; dp_share *sh; uint16_t *buf;
} pre_job;

static void pre_task(void *p, int t, int nth) {
    const pre_job *j = p;
    const dp_layer_dims *m = j->m;
    const int H = m->hidden, T = j->T;
    for (int r = t; r < T; r += nth)
        rms_norm_row(j->hidden + (int64_t)r * H, j->w->input_norm, m->eps, H, j->x + (int64_t)r * H);
    dp_team_barrier(nth);
    const uint16_t *xp = dp_amx_prepare(j->buf, j->isa, m->w_dtype, j->x, T, H, t, nth);
    const int units = dp_project_units(xp, T, H);
    for (int lo, hi; dp_claim_rows(j->sh, j->nt, t, j->N, units, &lo, &hi);)
        dp_project(j->linear, xp, j->x, T, H, j->w->qkv, m->w_dtype, j->N, j->w->qkv_bias,
                   j->qkv, lo, hi);
    dp_team_barrier(nth);
    for (int64_t it = t; it < (int64_t)T * (m->num_heads + m->num_kv_heads); it += nth)
        finish_qkv_item(m, j->w, j->qkv, it, j->positions, j->slots, j->k_cache, j->v_cache,
                        j->kv_dtype, j->BS, j->q_out);
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
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh[nt];
    dp_shares_init(sh, N, nt);
    pre_job j = {m, w, hidden, T, positions, slots, k_cache, v_cache, kv_dtype, BS, q_out,
                 scratch, scratch + (int64_t)T * H, isa, nt, N, f.linear, sh,
                 dp_amx_buffer(isa, m->w_dtype, T, H)};
    dp_team_run(nt, pre_task, &j);
    return 0;
}

/* --- the elementwise phases alone, for prefill chunks whose GEMMs run elsewhere ----------- */

/* One job for the three: rows (or items) [n * t / nth, n * (t + 1) / nth) per member. */
typedef struct {
    int kind; int64_t n;
    const float *x, *norm; int H; float eps; float *out;                /* rms norm */
    const dp_layer_dims *m; const dp_layer_weights *w; float *qkv;      /* q/k norm, RoPE */
    const int64_t *positions, *slots; void *k_cache, *v_cache; int kv_dtype, BS; float *q_out;
    int I; dp_silu_mul_fn silu_mul;                                     /* SiLU * up */
} rows_job;

enum { ROWS_NORM, ROWS_QKV, ROWS_SILU };

static void rows_task(void *p, int t, int nth) {
    const rows_job *j = p;
    for (int64_t r = j->n * t / nth; r < j->n * (t + 1) / nth; r++) {
        if (j->kind == ROWS_NORM)
            rms_norm_row(j->x + r * j->H, j->norm, j->eps, j->H, j->out + r * j->H);
        else if (j->kind == ROWS_QKV)
            finish_qkv_item(j->m, j->w, j->qkv, r, j->positions, j->slots, j->k_cache,
                            j->v_cache, j->kv_dtype, j->BS, j->q_out);
        else
            j->silu_mul(j->x + r * 2 * j->I, j->x + r * 2 * j->I + j->I, j->out + r * j->I,
                        j->I);
    }
}

int dp_rms_norm_rows(const float *x, int T, int H, const float *w, float eps, float *out,
                     int num_threads) {
    if (T <= 0 || H <= 0) return -2;
    rows_job j = {.kind = ROWS_NORM, .n = T, .x = x, .norm = w, .H = H, .eps = eps, .out = out};
    dp_team_run(num_threads > 0 ? num_threads : 1, rows_task, &j);
    return 0;
}

int dp_qkv_rope_append(const dp_layer_dims *m, const dp_layer_weights *w, float *qkv, int T,
                       const int64_t *positions, const int64_t *slots, void *k_cache,
                       void *v_cache, int kv_dtype, int64_t num_blocks, int BS, float *q_out,
                       int num_threads) {
    if (T <= 0 || m->head_dim % 2 || BS <= 0 || num_blocks <= 0) return -2;
    const int bad = check_indices(m, T, positions, slots, num_blocks, BS);
    if (bad) return bad;
    rows_job j = {.kind = ROWS_QKV, .n = (int64_t)T * (m->num_heads + m->num_kv_heads),
                  .m = m, .w = w, .qkv = qkv, .positions = positions, .slots = slots,
                  .k_cache = k_cache, .v_cache = v_cache, .kv_dtype = kv_dtype, .BS = BS,
                  .q_out = q_out};
    dp_team_run(num_threads > 0 ? num_threads : 1, rows_task, &j);
    return 0;
}

int dp_silu_mul_rows(const float *gate_up, int T, int I, float *act, int isa, int num_threads) {
    isa_fns f;
    if (pick(isa, &f)) return -1;
    if (T <= 0 || I <= 0) return -2;
    rows_job j = {.kind = ROWS_SILU, .n = T, .x = gate_up, .out = act, .I = I,
                  .silu_mul = f.silu_mul};
    dp_team_run(num_threads > 0 ? num_threads : 1, rows_task, &j);
    return 0;
}

typedef struct {
    const dp_layer_dims *m; const dp_layer_weights *w; const float *hidden, *attn; int T;
    float *hidden_out, *o, *x, *gu, *act; int isa, nt; isa_fns f;
    dp_share *sh_o, *sh_gu, *sh_down; uint16_t *buf;
} post_job;

static void post_task(void *p, int t, int nth) {
    const post_job *j = p;
    const dp_layer_dims *m = j->m;
    const dp_layer_weights *w = j->w;
    const int H = m->hidden, Q = m->num_heads * m->head_dim, I = m->intermediate, T = j->T;
    float *o = j->o, *x = j->x, *gu = j->gu, *act = j->act, *hidden_out = j->hidden_out;
    const float *hidden = j->hidden;
    const uint16_t *xp = dp_amx_prepare(j->buf, j->isa, m->w_dtype, j->attn, T, Q, t, nth);
    int units = dp_project_units(xp, T, Q);
    for (int lo, hi; dp_claim_rows(j->sh_o, j->nt, t, H, units, &lo, &hi);) {
        dp_project(j->f.linear, xp, j->attn, T, Q, w->o, m->w_dtype, H, w->o_bias, o, lo, hi);
        for (int r = 0; r < T; r++)
            for (int n = lo; n < hi; n++)
                hidden_out[(int64_t)r * H + n] = hidden[(int64_t)r * H + n] + o[(int64_t)r * H + n];
    }
    dp_team_barrier(nth);
    for (int r = t; r < T; r += nth)
        rms_norm_row(hidden_out + (int64_t)r * H, w->post_norm, m->eps, H, x + (int64_t)r * H);
    dp_team_barrier(nth);
    /* gate rows [lo, hi) and the matching up rows [I + lo, I + hi): this claim's slice
     * of the activation needs nothing another thread computes */
    xp = dp_amx_prepare(j->buf, j->isa, m->w_dtype, x, T, H, t, nth);
    units = dp_project_units(xp, T, H);
    for (int lo, hi; dp_claim_rows(j->sh_gu, j->nt, t, I, units, &lo, &hi);) {
        dp_project(j->f.linear, xp, x, T, H, w->gate_up, m->w_dtype, 2 * I, NULL, gu, lo, hi);
        dp_project(j->f.linear, xp, x, T, H, w->gate_up, m->w_dtype, 2 * I, NULL, gu, I + lo,
                   I + hi);
        for (int r = 0; r < T; r++)
            j->f.silu_mul(gu + (int64_t)r * 2 * I + lo, gu + (int64_t)r * 2 * I + I + lo,
                          act + (int64_t)r * I + lo, hi - lo);
    }
    dp_team_barrier(nth);
    xp = dp_amx_prepare(j->buf, j->isa, m->w_dtype, act, T, I, t, nth);
    units = dp_project_units(xp, T, I);
    for (int lo, hi; dp_claim_rows(j->sh_down, j->nt, t, H, units, &lo, &hi);) {
        dp_project(j->f.linear, xp, act, T, I, w->down, m->w_dtype, H, NULL, o, lo, hi);
        for (int r = 0; r < T; r++)
            for (int n = lo; n < hi; n++)
                hidden_out[(int64_t)r * H + n] += o[(int64_t)r * H + n];
    }
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
    post_job j = {m, w, hidden, attn, T, hidden_out, o, x, gu, act, isa, nt, f, sh_o, sh_gu,
                  sh_down, dp_amx_buffer(isa, m->w_dtype, T, k_max)};
    dp_team_run(nt, post_task, &j);
    return 0;
}

typedef struct {
    const float *x; int T, K; const float *norm; float eps; const void *w; int w_dtype, N;
    float *out, *scratch; int isa, nt; dp_linear_fn linear; dp_share *sh; uint16_t *buf;
} norm_linear_job;

static void norm_linear_task(void *p, int t, int nth) {
    const norm_linear_job *j = p;
    for (int r = t; r < j->T; r += nth)
        rms_norm_row(j->x + (int64_t)r * j->K, j->norm, j->eps, j->K, j->scratch + (int64_t)r * j->K);
    dp_team_barrier(nth);
    const uint16_t *xp = dp_amx_prepare(j->buf, j->isa, j->w_dtype, j->scratch, j->T, j->K, t,
                                        nth);
    const int units = dp_project_units(xp, j->T, j->K);
    for (int lo, hi; dp_claim_rows(j->sh, j->nt, t, j->N, units, &lo, &hi);)
        dp_project(j->linear, xp, j->scratch, j->T, j->K, j->w, j->w_dtype, j->N, NULL, j->out,
                   lo, hi);
}

int dp_norm_linear(const float *x, int T, int K, const float *norm, float eps, const void *w,
                   int w_dtype, int N, float *out, float *scratch, int isa, int num_threads) {
    isa_fns f;
    if (pick(isa, &f)) return -1;
    if (T <= 0 || K % 16 || N <= 0) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
    dp_share sh[nt];
    dp_shares_init(sh, N, nt);
    norm_linear_job j = {x, T, K, norm, eps, w, w_dtype, N, out, scratch, isa, nt, f.linear, sh,
                         dp_amx_buffer(isa, w_dtype, T, K)};
    dp_team_run(nt, norm_linear_task, &j);
    return 0;
}
