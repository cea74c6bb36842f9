/* The vector-FMA throughput probe (dp_fma_probe), instantiated per ISA as linear_body.h is:
 * before including define VEC, vset1(f), vfma(a, b, c) (a * b + c), vadd(a, b),
 * vreduce_add(v) and FMA_CHAINS_FN. DP_FMA_CHAINS independent chains, more than FMA latency x
 * FMA ports on any core these paths run on (Zen 1: 5 x 1 of 256 bits; Haswell to Zen 5 and
 * Sapphire Rapids: at most 4 x 2), so the loop measures throughput, not latency. */
double FMA_CHAINS_FN(int64_t iters) {
    VEC a[DP_FMA_CHAINS];
    for (int j = 0; j < DP_FMA_CHAINS; j++) a[j] = vset1(0.001f * (float)j);
    const VEC b = vset1(0.9999f), c = vset1(1e-4f);
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < DP_FMA_CHAINS; j++) a[j] = vfma(a[j], b, c);
    VEC s = a[0];
    for (int j = 1; j < DP_FMA_CHAINS; j++) s = vadd(s, a[j]);
    return vreduce_add(s);
}
#undef FMA_CHAINS_FN
