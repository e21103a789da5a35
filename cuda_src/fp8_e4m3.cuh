// float32 -> fp8 e4m3fn as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), the
// conversion vLLM's cache kernels use: round to nearest even; finite overflow and inf saturate
// to +-448 (0x7e / 0xfe); every NaN -> 0x7f (cuda_fp8.hpp canonicalises a NaN, sign included,
// before converting). Bit for bit torch's conversion (c10's fp8e4m3fn_from_fp32_value) for
// every value below 464 in magnitude; torch gives 0x7f | sign for a NaN.
//
// ng_fp8e4m3_from_f32: integer code plus one IEEE float add, branch-free, so it runs on every
// arch and the same text compiles on the host, where the tests check it against torch
// (tests/ops/test_indexer_k_quant_cpu.py). Self-contained: no other header, no standard library.
//
// ng_fp8e4m3x2_from_f32: two values. On sm_89+ one hardware instruction,
// cvt.rn.satfinite.e4m3x2.f32: round to nearest even, finite overflow and inf to +-448, the
// same bytes as the integer code (a NaN: 0x7f; tests/gpu/test_quant_gpu.py checks the byte).
// Elsewhere, or with NG_SOFT_FP8=1 (so the integer code can be run and tested on any GPU),
// two calls of the integer code.
#pragma once

#ifndef NG_SOFT_FP8
#define NG_SOFT_FP8 0
#endif

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define NG_FP8_FN __device__ __forceinline__
NG_FP8_FN unsigned int ng_bits(float x) { return __float_as_uint(x); }
NG_FP8_FN float ng_from_bits(unsigned int x) { return __uint_as_float(x); }
NG_FP8_FN float ng_add_rn(float a, float b) { return __fadd_rn(a, b); }
#else  // host build (tests): the same arithmetic in plain C
#define NG_FP8_FN static inline
NG_FP8_FN unsigned int ng_bits(float x) { union { float f; unsigned int u; } v; v.f = x; return v.u; }
NG_FP8_FN float ng_from_bits(unsigned int x) { union { float f; unsigned int u; } v; v.u = x; return v.f; }
NG_FP8_FN float ng_add_rn(float a, float b) { return a + b; }
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !NG_SOFT_FP8
#define NG_FP8_HW 1  // the e4m3x2 conversion instruction exists (sm_89+)
#else
#define NG_FP8_HW 0
#endif

// Result in the low byte. All three candidates are computed and one selected: a branch per
// element costs more than the few extra operations.
NG_FP8_FN unsigned int ng_fp8e4m3_from_f32(float f) {
    const unsigned int bits = ng_bits(f);
    const unsigned int a = bits & 0x7fffffffu;
    // Normal result: rebias 127 -> 7, round the 20 dropped bits to even. 0xc407ffff =
    // ((7 - 127) << 23) + 0x7ffff. At or above 464 (the tie with 480 rounds down to 448) this
    // exceeds 0x7e and the min saturates it; below 2^-6 it is garbage and not selected.
    unsigned int n = (a + 0xc407ffffu + ((a >> 20) & 1u)) >> 20;
    n = n < 0x7eu ? n : 0x7eu;
    // Below 2^-6, e4m3's smallest normal: subnormal result. Adding 2^14 leaves the ulp at
    // 2^-9, e4m3's subnormal step; the FPU rounds to nearest even, and the bits above 2^14's
    // are the result (0..8).
    const unsigned int s = ng_bits(ng_add_rn(ng_from_bits(a), 16384.0f)) - 0x46800000u;
    unsigned int r = a < 0x3c800000u ? s : n;
    r |= (bits >> 24) & 0x80u;
    return a > 0x7f800000u ? 0x7fu : r;  // NaN, either sign
}

// lo in the low byte, hi in the next, the upper 16 bits zero.
NG_FP8_FN unsigned int ng_fp8e4m3x2_from_f32(float lo, float hi) {
#if NG_FP8_HW
    unsigned short d;
    // d = {first source -> upper byte, second source -> lower byte}
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
#else
    return ng_fp8e4m3_from_f32(lo) | (ng_fp8e4m3_from_f32(hi) << 8);
#endif
}

// Four values, a in the low byte: two conversions and one byte permute.
NG_FP8_FN unsigned int ng_fp8e4m3x4_from_f32(float a, float b, float c, float d) {
#if NG_FP8_HW
    unsigned int r;
    asm("{\n\t.reg .b16 lo, hi;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
        "mov.b32 %0, {lo, hi};\n\t}"
        : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
#else
    return ng_fp8e4m3x2_from_f32(a, b) | (ng_fp8e4m3x2_from_f32(c, d) << 16);
#endif
}
