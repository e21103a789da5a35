// fp32 scale arithmetic shared by the quantizing writers (quant_cache.cu, mla_write.cu): exact,
// and cheaper than the IEEE division it stands for.
#pragma once
#include "common.cuh"

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
__device__ __forceinline__ float ng_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else  // the host emulator (tests/cuda_host_emu.cpp)
static inline float ng_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#endif

// a / 448 correctly rounded for every float a >= 7.6e-37 (checked against the IEEE
// division for all of them; amax is clamped to >= 1e-4 before): a * RN(1/448) and one
// Newton step through the exact fma residual. Three fp32 instructions instead of a
// division's reciprocal, five fmas and range check.
__device__ __forceinline__ float ng_div448(float a) {
    const float y = __uint_as_float(0x3b124925u);  // RN(1 / 448)
    const float q = __fmul_rn(a, y);
    return ng_fma(ng_fma(-448.0f, q, a), y, q);
}

// The smallest power of two >= a / 448 for a finite a >= 2^-126, from a's bits alone (the IEEE
// quotient never lies within half an ulp above a power of two, so this is also the power of
// two just above the rounded quotient): 2^(E-8) while a's significand is <= 1.75, else 2^(E-7).
__device__ __forceinline__ u32 ng_pow2_above_div448(u32 a) {
    return ((a + 0x1fffffu) & 0xff800000u) - 0x04000000u;
}

// The exact inverse of a power of two 2^e (e in [-126, 126]): 2^-e, by the exponent bits.
__device__ __forceinline__ u32 ng_pow2_inverse(u32 p) { return 0x7f000000u - p; }
