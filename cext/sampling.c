/* The exponential race of dualpace/sampling/sampler.py on CPU: for each row r,
 *
 *     out[r] = argmax_v  p[r, v] / E(key_r, v),   E = -log(u),
 *     u = ((SplitMix64 output v+1 from state key_r) >> 11 + 0.5) * 2^-53,
 *
 * the very doubles torch computes there ((probs.double() / noise).argmax(-1): first index of
 * the maximum, and of the first NaN if there is one). In torch that is ~15 passes of int64
 * and float64 tensor ops over the vocabulary, 1-6 ms a decode step for 1-8 random rows of a
 * 32k vocabulary on our machines, as long as the layers themselves. Here each element costs
 * its SplitMix64 bits and one comparison: since -log(u) >= 1 - u, p / E <= p / (1 - u), and
 * an element whose bound is at most the best ratio so far cannot win (ties keep the first
 * index), so the log and the division run only for the few that might. The skip keeps a
 * 1e-12 relative margin, far above the rounding of either side, so the answer is torch's
 * exactly. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "dp_internal.h"

#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ULL

typedef struct { double best; int64_t idx; int nan; } race_result;

static race_result race_span(const float *p, int64_t v0, int64_t v1, uint64_t key) {
    race_result r = {-INFINITY, -1, 0};
    for (int64_t v = v0; v < v1; v++) {
        uint64_t z = key + (uint64_t)(v + 1) * SPLITMIX_GAMMA;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        const double u = ((double)(z >> 11) + 0.5) * 0x1p-53;
        const double pv = (double)p[v];
        if (pv != pv) { r.idx = v; r.nan = 1; return r; }  /* torch's argmax: first NaN */
        if (r.idx >= 0 && pv <= r.best * (1.0 - u) * (1.0 - 1e-12)) continue;
        const double ratio = pv / -log(u);
        if (r.idx < 0 || ratio > r.best) { r.best = ratio; r.idx = v; }
    }
    return r;
}

typedef struct {
    const float *probs; int64_t V; int S; int64_t items; const int64_t *keys; race_result *part;
} race_job;

/* Items (row r, span s) of S spans a row, contiguous ranges of them per team member. */
static void race_task(void *p, int t, int nth) {
    const race_job *j = p;
    for (int64_t it = j->items * t / nth; it < j->items * (t + 1) / nth; it++) {
        const int64_t r = it / j->S, s = it % j->S;
        j->part[it] = race_span(j->probs + r * j->V, j->V * s / j->S, j->V * (s + 1) / j->S,
                                (uint64_t)j->keys[r]);
    }
}

int dp_exponential_race(const float *probs, int R, int64_t V, const int64_t *keys, int64_t *out,
                        int num_threads) {
    if (R <= 0 || V <= 0) return -2;
    const int nt = num_threads > 0 ? num_threads : 1;
    /* rows over the threads; a row alone (the usual decode step) split over them instead */
    const int S = R >= nt ? 1 : (nt + R - 1) / R;
    race_result *part = malloc(sizeof(race_result) * (size_t)R * S);
    if (!part) return -5;
    race_job j = {probs, V, S, (int64_t)R * S, keys, part};
    dp_team_run(nt, race_task, &j);  /* a decode step's: on the decode path's team */
    for (int r = 0; r < R; r++) {
        race_result w = part[(int64_t)r * S];
        for (int s = 1; s < S && !w.nan; s++) {  /* spans in order: ties keep the first */
            const race_result c = part[(int64_t)r * S + s];
            if (c.nan || (c.idx >= 0 && (w.idx < 0 || c.best > w.best))) w = c;
        }
        out[r] = w.idx;
    }
    free(part);
    return 0;
}
