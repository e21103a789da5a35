// 16-bit floats <-> fp32 by their bits, shared by the kernels (no cuda_fp16.h / cuda_bf16.h
// under NVRTC). Every function is exact or rounds to nearest even, as torch's conversions do;
// NaN results are the GPU's canonical NaNs (fp32 0x7fffffff, bf16 and fp16 0x7fff).
#pragma once
#include "common.cuh"
#include "fp8_e4m3.cuh"  // NG_SOFT_FP8

__device__ __forceinline__ float ng_half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact (the host emulator emulates this one statement)
    return f;
}

__device__ __forceinline__ float ng_bf16_to_float(u32 h) { return __uint_as_float(h << 16); }

// fp32 -> bf16 bits, round to nearest even; NaN -> 0x7fff (what cvt.rn.bf16x2.f32 gives).
__device__ __forceinline__ u32 ng_bf16_from_float(float f) {
    const u32 b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

// Two fp32 -> packed bf16x2 (lo in the low half). One instruction on sm_80+.
__device__ __forceinline__ u32 ng_bf16x2_from_float(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));  // first source -> upper half
    return d;
#else
    return ng_bf16_from_float(lo) | (ng_bf16_from_float(hi) << 16);
#endif
}

// fp32 -> fp16 bits, round to nearest even, overflow to inf, subnormals kept; NaN -> 0x7fff.
// On the GPU one cvt.rn.f16.f32 (vLLM's float_to_half); elsewhere (the host emulator) the same
// rounding by bits: the normal range rebiased and rounded on the 13 dropped bits, the
// subnormal range by one IEEE add of 0.5f, whose ulp (2^-24) is fp16's subnormal step.
__device__ __forceinline__ u32 ng_half_from_float(float f) {
#if defined(__CUDA_ARCH__)
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    const u32 b = __float_as_uint(f), a = b & 0x7fffffffu, sign = (b >> 16) & 0x8000u;
    if (a > 0x7f800000u) return 0x7fffu;
    if (a >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (the tie above 65504): inf
    if (a >= 0x38800000u) {                       // >= 2^-14: normal
        const u32 r = a - 0x38000000u;            // exponent rebiased 127 -> 15
        return sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    }
    return sign | (__float_as_uint(__fadd_rn(__uint_as_float(a), 0.5f)) - 0x3f000000u);
#endif
}

// fp8 e4m3fn code (low byte) -> fp32, exact; the NaN codes 0x7f / 0xff give a NaN.
__device__ __forceinline__ float ng_float_from_fp8e4m3(u32 c) {
    const u32 e = (c >> 3) & 0xfu, m = c & 7u;
    u32 mag = e ? ((e + 120u) << 23) | (m << 20) : __float_as_uint((float)m * 0.001953125f);  // subnormal: m * 2^-9
    mag = (c & 0x7fu) == 0x7fu ? 0x7fffffffu : mag;
    return __uint_as_float(mag | ((c & 0x80u) << 24));
}

// Two fp8 e4m3fn codes (bits 0-7 and 8-15 of c) -> fp32, exact. One conversion instruction
// (to f16x2, exact for every e4m3 value) and two widenings on sm_89+.
__device__ __forceinline__ void ng_float2_from_fp8e4m3x2(u32 c, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !NG_SOFT_FP8
    u32 h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)(c & 0xffffu)));  // low byte -> low half
    lo = ng_half_to_float((unsigned short)(h2 & 0xffffu));
    hi = ng_half_to_float((unsigned short)(h2 >> 16));
#else
    lo = ng_float_from_fp8e4m3(c & 0xffu);
    hi = ng_float_from_fp8e4m3((c >> 8) & 0xffu);
#endif
}
