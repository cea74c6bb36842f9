/* The per-item decode-attention routine, instantiated once per ISA translation unit.
 * Before including: define DP_ITEM_FN (the function name) and the primitives
 *   prim_dot_group(q, k, dtype, D, G, out)       out[g] = <q[g*D..], k>
 *   prim_axpy_group(acc, p, pstride, v, dtype, D, G)  acc[g*D..] += p[g*pstride] * v
 *   prim_scale(x, c, n)                            x *= c
 *   prim_exp_sub(s, n, m) -> sum                   s = exp(s - m), returns the sum
 * Online softmax (one pass over KV) per KV block, one GQA group per item so that each K/V
 * row read from memory serves every query head that shares it. */
#include <math.h>

void DP_ITEM_FN(const dp_attn_args *a, int b, int h, int t0, int t1,
                float *m, float *l, float *acc, float *ws) {
    const int G = a->G, D = a->D, BS = a->BS;
    const int esz = dp_elem_size(a->kv_dtype);
    float *qf = ws;               /* [G, D] query rows, pre-scaled */
    float *s = ws + G * D;        /* [G, BS] scores of one block */
    float *tmp = s + G * BS;      /* [G] */
    const int64_t q0 = ((int64_t)b * a->Hq + (int64_t)h * G) * D;
    for (int i = 0; i < G * D; i++) qf[i] = dp_load_elem(a->q, a->q_dtype, q0 + i) * a->scale;
    for (int g = 0; g < G; g++) { m[g] = -INFINITY; l[g] = 0.f; }
    memset(acc, 0, sizeof(float) * (size_t)G * D);
    const int32_t *bt = a->block_tables + (int64_t)b * a->max_blocks;
    const int64_t row = (int64_t)D * esz;
    for (int t = t0; t < t1;) {
        const int blk = t / a->BS, off = t % a->BS;
        const int n = (BS - off) < (t1 - t) ? (BS - off) : (t1 - t);
        const int64_t base = (((int64_t)bt[blk] * a->Hkv + h) * BS + off) * row;
        const char *kp = (const char *)a->k_cache + base;
        const char *vp = (const char *)a->v_cache + base;
        for (int i = 0; i < n; i++) {
            prim_dot_group(qf, kp + i * row, a->kv_dtype, D, G, tmp);
            for (int g = 0; g < G; g++) s[g * BS + i] = tmp[g];
        }
        for (int g = 0; g < G; g++) {
            float bm = s[g * BS];
            for (int i = 1; i < n; i++) bm = s[g * BS + i] > bm ? s[g * BS + i] : bm;
            const float mn = bm > m[g] ? bm : m[g];
            if (m[g] != -INFINITY && mn != m[g]) {
                const float c = expf(m[g] - mn);
                l[g] *= c;
                prim_scale(acc + (int64_t)g * D, c, D);
            }
            l[g] += prim_exp_sub(s + g * BS, n, mn);
            m[g] = mn;
        }
        for (int i = 0; i < n; i++)
            prim_axpy_group(acc, s + i, BS, vp + i * row, a->kv_dtype, D, G);
        t += n;
    }
}
