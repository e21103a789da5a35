// float32 -> fp8 e4m3fn, bit for bit torch's conversion (c10's fp8e4m3fn_from_fp32_value):
// round to nearest even; finite overflow and inf saturate to +-448 (0x7e); NaN -> 0x7f | sign.
// Integer code plus one IEEE float add, so it runs on every arch (the cvt...e4m3x2 PTX
// needs sm_89) and the same text compiles on the host, where the tests check it against
// torch (tests/test_quant_cpu.py). Self-contained: no other header, no standard library.
#pragma once

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

// Result in the low byte.
NG_FP8_FN unsigned int ng_fp8e4m3_from_f32(float f) {
    const unsigned int bits = ng_bits(f);
    const unsigned int sign = (bits >> 24) & 0x80u;
    const unsigned int a = bits & 0x7fffffffu;
    unsigned int r;
    if (a > 0x43e80000u) {            // above 464 (the tie with 480 rounds down to 448), inf, NaN
        r = a > 0x7f800000u ? 0x7fu : 0x7eu;
    } else if (a < 0x3c800000u) {     // below 2^-6, e4m3's smallest normal: subnormal result.
        // Adding 2^14 leaves the ulp at 2^-9, e4m3's subnormal step; the FPU rounds to
        // nearest even, and the bits above 2^14's are the result (0..8).
        r = ng_bits(ng_add_rn(ng_from_bits(a), 16384.0f)) - 0x46800000u;
    } else {                          // normal: rebias 127 -> 7, round the 20 dropped bits to even
        r = (a + 0xc407ffffu + ((a >> 20) & 1u)) >> 20;  // 0xc407ffff = ((7 - 127) << 23) + 0x7ffff
    }
    return r | sign;
}
