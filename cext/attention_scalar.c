/* Portable reference path: plain C, any x86-64 or other CPU. */
#include <math.h>
#include "dp_internal.h"
#include "attention_softmax.h"

static inline __attribute__((always_inline)) void prim_qk_block(
    const float *q, const char *k, int64_t row, int n, int dtype, int D, int G, float *s,
    int64_t nxt) {
    (void)nxt;  /* the portable path leaves prefetching to the hardware */
    for (int t = 0; t < n; t++)
        for (int g = 0; g < G; g++) {
            float acc = 0.f;
            for (int d = 0; d < D; d++) acc += q[d * G + g] * dp_load_elem(k + t * row, dtype, d);
            s[t * G + g] = acc;
        }
}
static inline __attribute__((always_inline)) void prim_pv_block(
    float *acc, const float *p, const char *v, int64_t row, int n, int dtype, int D, int G,
    int64_t nxt) {
    (void)nxt;
    for (int t = 0; t < n; t++)
        for (int d = 0; d < D; d++) {
            const float vd = dp_load_elem(v + t * row, dtype, d);
            for (int g = 0; g < G; g++) acc[g * D + d] += p[t * G + g] * vd;
        }
}
static inline __attribute__((always_inline)) void prim_softmax(
    float *s, int n, int G, float *m, float *l, float *acc, int D) {
    dp_softmax_strided(s, n, G, m, l, acc, D);
}

#define DP_QVW 1  /* q chunk-major with 1-wide chunks: element d of head g at q[d * G + g] */
#define DP_ITEM_FN dp_attn_item_scalar
#include "attention_body.h"

double dp_stream_read_scalar(const float *buf, int64_t n) {
    float a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += buf[i + j];
    double s = 0;
    for (int j = 0; j < 8; j++) s += a[j];
    for (; i < n; i++) s += buf[i];
    return s;
}

typedef float VEC;
#define VW 1
static inline VEC vzero(void) { return 0.f; }
static inline VEC vloadu(const float *p) { return *p; }
static inline VEC vload_w(const char *p, int dtype) { return dp_load_elem(p, dtype, 0); }
static inline VEC vfma(VEC a, VEC b, VEC c) { return a * b + c; }
static inline float vreduce_add(VEC v) { return v; }
#define LINEAR_FN dp_linear_scalar
#include "linear_body.h"

static inline void vstoreu(float *p, VEC v) { *p = v; }
static inline VEC vmul(VEC a, VEC b) { return a * b; }
static float silu1(float g);
static inline VEC vsilu(VEC g) { return silu1(g); }
#define SILU_MUL_FN dp_silu_mul_scalar
#include "layer_body.h"
