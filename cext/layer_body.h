/* The elementwise part of layer.c's MLP, instantiated per ISA: out = SiLU(g) * u with
 * SiLU(g) = g / (1 + exp(-g)) as transformers computes it, exp taken only of -|g| <= 0 (the
 * range vexp covers): g < 0 gives g e / (1 + e), g >= 0 gives g / (1 + e), e = exp(-|g|).
 * Before including define VEC, VW, vloadu, vstoreu, vmul, vsilu and SILU_MUL_FN. */
#include <math.h>

static inline float silu1(float g) {
    const float e = expf(-fabsf(g));
    return (g < 0.f ? g * e : g) / (1.f + e);
}

void SILU_MUL_FN(const float *g, const float *u, float *out, int n) {
    int i = 0;
    for (; i + VW <= n; i += VW) vstoreu(out + i, vmul(vsilu(vloadu(g + i)), vloadu(u + i)));
    for (; i < n; i++) out[i] = silu1(g[i]) * u[i];
}
#undef SILU_MUL_FN
