/* Paged decode attention driver: split-KV work items over (sequence, kv head, KV segment),
 * claimed one at a time by the thread team (team.c), then a log-sum-exp merge of the segments per query head.
 * Scratch is per call and per thread; the library holds no global mutable state. */
#include <math.h>
#include <stdlib.h>
#include "dp_internal.h"

/* Segments shorter than this cost more in merge traffic than they gain in parallelism. */
#define DP_MIN_SEGMENT 128

static dp_attn_item_fn pick(int isa) {
    switch (isa) {
    case DP_ISA_SCALAR: return dp_attn_item_scalar;
    case DP_ISA_AVX2: return dp_attn_item_avx2;
    case DP_ISA_AVX512: return dp_attn_item_avx512;
    case DP_ISA_AVX512_BF16: return dp_attn_item_avx512bf16;
    case DP_ISA_AMX: return dp_attn_item_amx;
    default: return NULL;
    }
}

typedef struct {
    dp_attn_args a;
    dp_attn_item_fn fn;
    const int *seg_seq, *seg_first;
    int seg, HG, hmax;
    int64_t items;
    float *pm, *pl, *pacc;
    void *out;
    int B;
    int64_t next;  /* the next item to claim (dynamic schedule, one at a time) */
    int oom;
} attn_job;

/* The items claimed one at a time (their costs differ with their lengths), then after a
 * barrier each query head's segments merged, rows split over the members. */
static void attn_task(void *p, int t, int nth) {
    attn_job *j = p;
    const dp_attn_args *a = &j->a;
    const int Hq = a->Hq, Hkv = a->Hkv, D = a->D, G = a->G, HG = j->HG;
    float *ws = malloc(sizeof(float) * (size_t)dp_attn_ws_floats(j->hmax, G, D, a->BS));
    if (!ws) __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED);
    for (int64_t it; ws && (it = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED)) < j->items;) {
        const int64_t sidx = it / HG;
        const int hg = (int)(it % HG), b = j->seg_seq[sidx];
        const int h0 = (int)((int64_t)hg * Hkv / HG);
        const int h1 = (int)((int64_t)(hg + 1) * Hkv / HG);
        const int t0 = (int)(sidx - j->seg_first[b]) * j->seg;
        const int t1 = t0 + j->seg < a->seq_lens[b] ? t0 + j->seg : a->seq_lens[b];
        j->fn(a, b, h0, h1, t0, t1, j->pm + sidx * Hq, j->pl + sidx * Hq,
              j->pacc + sidx * Hq * D, ws);
    }
    free(ws);
    dp_team_barrier(nth);
    if (__atomic_load_n(&j->oom, __ATOMIC_RELAXED)) return;
    const int64_t rows = (int64_t)j->B * Hq;
    for (int64_t r = rows * t / nth; r < rows * (t + 1) / nth; r++) {
        const int b = (int)(r / Hq), qh = (int)(r % Hq), h = qh / G, g = qh % G;
        float M = -INFINITY, L = 0.f;
        for (int s = j->seg_first[b]; s < j->seg_first[b + 1]; s++) {
            const float ms = j->pm[((int64_t)s * Hkv + h) * G + g];
            M = ms > M ? ms : M;
        }
        float o[D];
        for (int d = 0; d < D; d++) o[d] = 0.f;
        for (int s = j->seg_first[b]; s < j->seg_first[b + 1]; s++) {
            const int64_t i = ((int64_t)s * Hkv + h) * G + g;
            const float w = expf(j->pm[i] - M);
            L += j->pl[i] * w;
            const float *acc = j->pacc + i * D;
            for (int d = 0; d < D; d++) o[d] += acc[d] * w;
        }
        dp_store_row(j->out, a->q_dtype, r * D, o, D, 1.f / L);
    }
}

int dp_paged_decode_attention(
    const void *q, int q_dtype, const void *k_cache, const void *v_cache, int kv_dtype,
    const int32_t *block_tables, int max_blocks, const int32_t *seq_lens, void *out,
    int B, int Hq, int Hkv, int D, int BS, int num_blocks, float scale,
    int isa, int num_threads) {
    dp_attn_item_fn fn = pick(isa);
    if (!fn) return -1;
    if (B <= 0 || Hkv <= 0 || Hq % Hkv || D <= 0 || D % 16 || BS <= 0 || num_blocks <= 0)
        return -2;
    const int G = Hq / Hkv, nt = num_threads > 0 ? num_threads : 1;
    int max_len = 0;
    for (int b = 0; b < B; b++) {
        const int L = seq_lens[b];
        if (L < 1 || (int64_t)L > (int64_t)max_blocks * BS) return -3;
        for (int i = 0; i < (L + BS - 1) / BS; i++) {
            const int32_t id = block_tables[(int64_t)b * max_blocks + i];
            if (id < 0 || id >= num_blocks) return -4;
        }
        if (L > max_len) max_len = L;
    }
    /* Items are (sequence, KV segment, range of KV heads). An item over all of a block's
     * heads reads them as one contiguous run (attention_body.h), so a sequence is split
     * only while there are too few items to keep every thread busy: first into KV segments
     * (no shorter than DP_MIN_SEGMENT), then into head ranges. */
    const int64_t want = 4 * (int64_t)nt;
    int seg = max_len;
    if (B < want) {
        seg = (int)((max_len + (want + B - 1) / B - 1) / ((want + B - 1) / B));
        if (seg < DP_MIN_SEGMENT) seg = DP_MIN_SEGMENT;
        seg = (seg + BS - 1) / BS * BS;
    }
    int64_t nseg_total = 0;
    int *seg_first = malloc(sizeof(int) * ((size_t)B + 1));
    if (!seg_first) return -5;
    for (int b = 0; b < B; b++) {
        seg_first[b] = (int)nseg_total;
        nseg_total += (seq_lens[b] + seg - 1) / seg;
    }
    seg_first[B] = (int)nseg_total;
    int HG = 1;  /* head ranges per segment */
    if (nseg_total < want) {
        HG = (int)((want + nseg_total - 1) / nseg_total);
        if (HG > Hkv) HG = Hkv;
    }
    const int hmax = (Hkv + HG - 1) / HG;  /* the most heads in one range */
    int *seg_seq = malloc(sizeof(int) * (size_t)nseg_total);
    const int64_t items = nseg_total * HG;
    float *pm = malloc(sizeof(float) * (size_t)(nseg_total * Hq));
    float *pl = malloc(sizeof(float) * (size_t)(nseg_total * Hq));
    float *pacc = malloc(sizeof(float) * (size_t)(nseg_total * Hq * D));
    if (!seg_seq || !pm || !pl || !pacc) {
        free(seg_first); free(seg_seq); free(pm); free(pl); free(pacc);
        return -5;
    }
    for (int b = 0; b < B; b++)
        for (int s = seg_first[b]; s < seg_first[b + 1]; s++) seg_seq[s] = b;

    attn_job j = {{q, q_dtype, k_cache, v_cache, kv_dtype, block_tables, max_blocks, seq_lens,
                   Hq, Hkv, D, BS, G, scale},
                  fn, seg_seq, seg_first, seg, HG, hmax, items, pm, pl, pacc, out, B, 0, 0};
    dp_team_run(nt, attn_task, &j);
    free(seg_first); free(seg_seq); free(pm); free(pl); free(pacc);
    return j.oom ? -5 : 0;
}

int dp_bf16_dot_on = 1;

void dp_set_bf16_dot(int on) { __atomic_store_n(&dp_bf16_dot_on, on != 0, __ATOMIC_RELAXED); }

int dp_get_bf16_dot(void) { return __atomic_load_n(&dp_bf16_dot_on, __ATOMIC_RELAXED); }

int dp_attn_bf16_dot(int q_dtype, int kv_dtype, int G, int D) {
    return dp_bf16_dot_applies(q_dtype, kv_dtype, G, D);
}

double dp_bf16_dot_chains(int64_t iters);

/* vdpbf16ps instructions of DP_FMA_CHAINS independent chains (attention_avx512bf16.c), as
 * dp_fma_probe counts FMAs; -1 where the CPU has no AVX512_BF16. */
int64_t dp_bf16_dot_probe(int64_t iters, double *sink) {
    if (iters <= 0 || !sink) return -2;
    if (!(dp_cpu_features() & DP_FEAT_AVX512_BF16)) return -1;
    *sink = dp_bf16_dot_chains(iters);
    return iters * DP_FMA_CHAINS;
}

double dp_fma_chains_avx2(int64_t iters);
double dp_fma_chains_avx512(int64_t iters);

int64_t dp_fma_probe(int isa, int64_t iters, int *lanes, double *sink) {
    if (iters <= 0 || !lanes || !sink) return -2;
    switch (isa) {
    case DP_ISA_AVX2:
        *lanes = 8;
        *sink = dp_fma_chains_avx2(iters);
        break;
    case DP_ISA_AVX512:
    case DP_ISA_AVX512_BF16:
    case DP_ISA_AMX:
        *lanes = 16;
        *sink = dp_fma_chains_avx512(iters);
        break;
    default:
        return -1;  /* the scalar path: no vector FMAs to count */
    }
    return iters * DP_FMA_CHAINS;
}

double dp_stream_read_scalar(const float *buf, int64_t n);
double dp_stream_read_avx2(const float *buf, int64_t n);

typedef struct { const float *buf; int64_t n; int avx2; double *part; } stream_job;

static void stream_task(void *p, int t, int nth) {
    const stream_job *j = p;
    const int64_t lo = j->n * t / nth, hi = j->n * (t + 1) / nth;
    j->part[t] = j->avx2 ? dp_stream_read_avx2(j->buf + lo, hi - lo)
                         : dp_stream_read_scalar(j->buf + lo, hi - lo);
}

double dp_stream_read(const float *buf, int64_t n, int num_threads) {
    const int nt = num_threads > 0 ? num_threads : 1;
    const int avx2 = (dp_cpu_features() & DP_FEAT_AVX2) != 0;
    double part[nt];
    for (int t = 0; t < nt; t++) part[t] = 0;
    stream_job j = {buf, n, avx2, part};
    dp_team_run(nt, stream_task, &j);
    double total = 0;
    for (int t = 0; t < nt; t++) total += part[t];
    return total;
}
