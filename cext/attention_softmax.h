/* The online-softmax update of one KV block for a GQA group (attention_body.h), over
 * token-major scores: s[t * G + g] is the score of token t for query head g, so that the
 * probabilities leave in the order PV consumes them (each token's G weights side by side).
 * Per head g, with the running max m[g], denominator l[g] and accumulator acc[g * D ..]:
 *   mn = max(m[g], max_t s); acc, l *= exp(m[g] - mn) when the max moved;
 *   s = exp(s - mn); l += sum_t s; m[g] = mn.
 * This is the portable form, one head at a time with scalar expf: the scalar path's, and
 * the SIMD paths' for a group whose size does not divide the vector width (attention_simd.h
 * vectorizes it across the heads otherwise). */
#ifndef DP_ATTENTION_SOFTMAX_H
#define DP_ATTENTION_SOFTMAX_H
#include <math.h>

static inline __attribute__((always_inline)) void dp_softmax_strided(
    float *s, int n, int G, float *m, float *l, float *acc, int D) {
    for (int g = 0; g < G; g++) {
        float bm = -INFINITY;
        for (int t = 0; t < n; t++) bm = s[t * G + g] > bm ? s[t * G + g] : bm;
        const float mn = bm > m[g] ? bm : m[g];
        if (m[g] != -INFINITY && mn != m[g]) {
            const float c = expf(m[g] - mn);
            l[g] *= c;
            for (int d = 0; d < D; d++) acc[(int64_t)g * D + d] *= c;
        }
        float sum = 0.f;
        for (int t = 0; t < n; t++) {
            const float e = expf(s[t * G + g] - mn);
            s[t * G + g] = e;
            sum += e;
        }
        l[g] += sum;
        m[g] = mn;
    }
}
#endif
