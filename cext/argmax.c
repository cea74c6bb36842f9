/* Greedy sampling's argmax over each row of fp32 logits, as torch.argmax(dim=-1) gives it:
 * the first index of the maximum, or of the first NaN when the row has one. torch's CPU
 * argmax took 50 us for a row of a 32k vocabulary and 0.79 ms for 32 rows on a 2-core AMX VM
 * (Intel Xeon), 8% of a 32-row bf16 decode step of the llama.cpp comparison model; here a
 * row is one pass of compares and masked moves (per-lane best and index; strict > keeps
 * each lane's first), split over the threads as the exponential race splits its rows
 * (sampling.c): 8 us and 57 us there. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "dp_internal.h"

typedef struct { float best; int64_t idx; int nan; } amax_result;

#define ARGMAX_PER_THREAD (1 << 17)

static amax_result amax_scalar(const float *x, int64_t v0, int64_t v1) {
    amax_result r = {-INFINITY, -1, 0};
    for (int64_t v = v0; v < v1; v++) {
        if (x[v] != x[v]) { r.idx = v; r.nan = 1; return r; }
        if (r.idx < 0 || x[v] > r.best) { r.best = x[v]; r.idx = v; }
    }
    return r;
}

/* The lanes' (best, first index) folded: the largest, on a tie the smallest index; then the
 * scalar tail [t, v1) (a NaN there is the row's first: the vector part had none). */
static amax_result amax_fold(const float *bv, const int32_t *bi, int lanes, int64_t v0,
                             const float *x, int64_t t, int64_t v1) {
    amax_result r = {bv[0], v0 + bi[0], 0};
    for (int l = 1; l < lanes; l++)
        if (bv[l] > r.best || (bv[l] == r.best && v0 + bi[l] < r.idx)) {
            r.best = bv[l];
            r.idx = v0 + bi[l];
        }
    for (int64_t v = t; v < v1; v++) {
        if (x[v] != x[v]) { r.idx = v; r.nan = 1; return r; }
        if (x[v] > r.best) { r.best = x[v]; r.idx = v; }
    }
    return r;
}

__attribute__((target("avx512f")))
static amax_result amax_avx512(const float *x, int64_t v0, int64_t v1) {
    const int64_t end = v0 + (v1 - v0) / 16 * 16;
    if (end == v0) return amax_scalar(x, v0, v1);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i cur = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 best = _mm512_loadu_ps(x + v0);
    __m512i idx = cur;
    __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
    for (int64_t v = v0 + 16; v < end; v += 16) {
        cur = _mm512_add_epi32(cur, step);
        const __m512 xv = _mm512_loadu_ps(x + v);
        const __mmask16 gt = _mm512_cmp_ps_mask(xv, best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, gt, xv);
        idx = _mm512_mask_mov_epi32(idx, gt, cur);
        nan |= _mm512_cmp_ps_mask(xv, xv, _CMP_UNORD_Q);
    }
    if (nan) return amax_scalar(x, v0, v1);
    float bv[16];
    int32_t bi[16];
    _mm512_storeu_ps(bv, best);
    _mm512_storeu_si512(bi, idx);
    return amax_fold(bv, bi, 16, v0, x, end, v1);
}

__attribute__((target("avx2")))
static amax_result amax_avx2(const float *x, int64_t v0, int64_t v1) {
    const int64_t end = v0 + (v1 - v0) / 8 * 8;
    if (end == v0) return amax_scalar(x, v0, v1);
    const __m256i step = _mm256_set1_epi32(8);
    __m256i cur = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0);
    __m256 best = _mm256_loadu_ps(x + v0);
    __m256i idx = cur;
    __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
    for (int64_t v = v0 + 8; v < end; v += 8) {
        cur = _mm256_add_epi32(cur, step);
        const __m256 xv = _mm256_loadu_ps(x + v);
        const __m256 gt = _mm256_cmp_ps(xv, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, xv, gt);
        idx = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(idx),
                                                   _mm256_castsi256_ps(cur), gt));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return amax_scalar(x, v0, v1);
    float bv[8];
    int32_t bi[8];
    _mm256_storeu_ps(bv, best);
    _mm256_storeu_si256((__m256i *)bi, idx);
    return amax_fold(bv, bi, 8, v0, x, end, v1);
}

typedef struct {
    const float *x; int64_t V; int S; int64_t items; int dense; amax_result *part;
} argmax_job;

/* Items (row r, span s) of S spans a row, contiguous ranges of them per member. */
static void argmax_task(void *p, int t, int nth) {
    const argmax_job *j = p;
    for (int64_t it = j->items * t / nth; it < j->items * (t + 1) / nth; it++) {
        const int64_t r = it / j->S, s = it % j->S;
        const float *row = j->x + r * j->V;
        const int64_t v0 = j->V * s / j->S, v1 = j->V * (s + 1) / j->S;
        j->part[it] = j->dense == DP_ISA_AVX512 ? amax_avx512(row, v0, v1)
                    : j->dense == DP_ISA_AVX2 ? amax_avx2(row, v0, v1)
                    : amax_scalar(row, v0, v1);
    }
}

int dp_argmax_rows(const float *x, int R, int64_t V, int64_t *out, int isa, int num_threads) {
    if (R <= 0 || V <= 0 || V > INT32_MAX) return -2;
    if (isa < DP_ISA_SCALAR || isa > DP_ISA_AMX) return -1;
    const int dense = dp_dense_isa(isa);
    /* A thread per ARGMAX_PER_THREAD logits at most: a row of a 32k vocabulary is ~10 us on
     * one core, and a second thread's wake-up costs more than that on cores the engine
     * shares (served single stream on a 2-core Zen 4 VM: ~0.3-0.5 ms a step, against
     * 14 us in-process, when the team had fallen asleep in the Python before the call). */
    const int64_t fill = ((int64_t)R * V + ARGMAX_PER_THREAD - 1) / ARGMAX_PER_THREAD;
    const int nt = num_threads <= 1 ? 1 : (fill < num_threads ? (int)fill : num_threads);
    /* rows over the threads; a row alone (the usual decode step) split over them instead */
    const int S = R >= nt ? 1 : (nt + R - 1) / R;
    amax_result *part = malloc(sizeof(amax_result) * (size_t)R * S);
    if (!part) return -5;
    argmax_job j = {x, V, S, (int64_t)R * S, dense, part};
    dp_team_run(nt, argmax_task, &j);
    for (int r = 0; r < R; r++) {
        amax_result w = part[(int64_t)r * S];
        for (int s = 1; s < S && !w.nan; s++) {  /* spans in order: ties keep the first */
            const amax_result c = part[(int64_t)r * S + s];
            if (c.nan || (c.idx >= 0 && (w.idx < 0 || c.best > w.best))) w = c;
        }
        out[r] = w.idx;
    }
    free(part);
    return 0;
}
