/* Run-time CPU feature detection (CPUID + XGETBV: the OS must have enabled the state). */
#include <cpuid.h>
#include "dp_cext.h"

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

uint32_t dp_cpu_features(void) {
    uint32_t a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave) return 0;
    const uint64_t xcr0 = xgetbv0();
    const int ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xe6) == 0xe6;
    const int tile_ok = (xcr0 & 0x60000) == 0x60000;
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1;
    const int avx512vl = (b >> 31) & 1, avx512dq = (b >> 17) & 1, amx_bf16 = (d >> 22) & 1;
    if (ymm_ok && avx2) f |= DP_FEAT_AVX2;
    if (ymm_ok && fma) f |= DP_FEAT_FMA;
    if (ymm_ok && f16c) f |= DP_FEAT_F16C;
    if (zmm_ok && avx512f && avx512bw && avx512vl && avx512dq) f |= DP_FEAT_AVX512;
    if (tile_ok && amx_bf16) f |= DP_FEAT_AMX_BF16;
    __cpuid_count(7, 1, a, b, c, d);
    if ((f & DP_FEAT_AVX512) && ((a >> 5) & 1)) f |= DP_FEAT_AVX512_BF16;
    return f;
}
