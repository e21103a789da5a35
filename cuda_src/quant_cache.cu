// indexer_k_quant_and_cache: quantize rows of k to fp8-e4m3 with one fp32 scale per quant
// block and write both into the paged indexer cache (contract: shared/DESIGN.md section 2).
//
// Vector kernels (quant_cache_<type>_v16 / _v8), picked by the host when k's alignment and
// the sizes allow: a lane owns ELEMS = VB / sizeof(element) consecutive elements of a token
// (one VB-byte load), a token takes head_dim / ELEMS lanes, a block covers
// tokens_per_pass = NG_THREADS / lanes tokens per pass and makes NG_QUNROLL passes with all
// their loads issued first (more bytes in flight). A quant block's amax: xor shuffles inside
// the largest power-of-two group of lanes that divides its lane count, then, only when the
// quant block is wider than that group, shared-memory atomicMax across the groups.
// Generic kernels (quant_cache_<type>_any): one thread per (token, quant block), element
// loads and byte stores; any alignment, any quant block size, any head_dim.
//
// Numerics are the torch path's (nvrtc_gather/quant_torch.py), bit for bit: amax in fp32,
// scale = max(amax, 1e-4f) / 448.0f as an IEEE division, ue8m0 rounding up to a power of two
// through the exponent bits, values = k / scale in fp32 (for a power-of-two scale k * 2^-e,
// the same correctly rounded number), then torch's fp32 -> e4m3 conversion (fp8_e4m3.cuh).
// The module is compiled with --fmad=false so no product is ever contracted.
// Slots < 0 are padding; slots >= num_slots are skipped, and reported in debug mode.
#include "quant_params.cuh"
#include "fp8_e4m3.cuh"

#define NG_QUNROLL 2  // passes per block in the vector kernels

struct Bf16 { enum { SIZE = 2 }; };
struct F16 { enum { SIZE = 2 }; };
struct F32 { enum { SIZE = 4 }; };

__device__ __forceinline__ float ng_half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));  // exact; no cuda_fp16.h under NVRTC
    return f;
}

// Reading elements as fp32 (exact for every type): from a 32-bit word, or one from memory.
template <typename T> struct Load;
template <> struct Load<Bf16> {
    enum { PER_WORD = 2 };
    static __device__ __forceinline__ void unpack(u32 w, float* f) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ float one(const u8* p) {
        return __uint_as_float((u32)__ldg(reinterpret_cast<const unsigned short*>(p)) << 16);
    }
};
template <> struct Load<F16> {
    enum { PER_WORD = 2 };
    static __device__ __forceinline__ void unpack(u32 w, float* f) {
        f[0] = ng_half_to_float((unsigned short)(w & 0xffffu));
        f[1] = ng_half_to_float((unsigned short)(w >> 16));
    }
    static __device__ __forceinline__ float one(const u8* p) {
        return ng_half_to_float(__ldg(reinterpret_cast<const unsigned short*>(p)));
    }
};
template <> struct Load<F32> {
    enum { PER_WORD = 1 };
    static __device__ __forceinline__ void unpack(u32 w, float* f) { f[0] = __uint_as_float(w); }
    static __device__ __forceinline__ float one(const u8* p) { return __ldg(reinterpret_cast<const float*>(p)); }
};

__device__ __forceinline__ void ng_words(const uint4& v, u32* w) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void ng_words(const uint2& v, u32* w) { w[0] = v.x; w[1] = v.y; }

// |x| as bits: ordered like |x|, with NaN above inf, so a max over them propagates a NaN
// as torch's amax does.
__device__ __forceinline__ u32 ng_abs_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }

// A quant block's scale from its amax bits. inv = 1 / scale when that is exact (a finite
// power-of-two scale: its exponent lies in [-22, 120], so 2^-e is a normal float), else 0.
__device__ __forceinline__ void ng_block_scale(u32 amax_bits, int ue8m0, float& scale, float& inv) {
    const float amax = __uint_as_float(amax_bits);
    const float lo = __uint_as_float(0x38d1b717u);  // (float)1e-4, what torch.clamp(min=1e-4) compares with
    scale = __fdiv_rn(amax < lo ? lo : amax, 448.0f);  // a NaN amax stays NaN, as in torch.clamp
    inv = 0.f;
    if (ue8m0) {
        const u32 b = __float_as_uint(scale);
        if ((b & 0x7f800000u) != 0x7f800000u) {  // finite: the smallest power of two >= scale
            const u32 r = (b + 0x7fffffu) & 0xff800000u;
            scale = __uint_as_float(r);
            inv = __uint_as_float(0x7f000000u - r);
        }
    }
}

__device__ __forceinline__ u32 ng_quant(float x, float scale, float inv) {
    return ng_fp8e4m3_from_f32(inv != 0.f ? __fmul_rn(x, inv) : __fdiv_rn(x, scale));
}

// N values at once, the multiply-or-divide choice made once for all of them.
template <int N>
__device__ __forceinline__ void ng_quant_n(const float* x, float scale, float inv, u32* b) {
    if (inv != 0.f) {
#pragma unroll
        for (int e = 0; e < N; ++e) b[e] = ng_fp8e4m3_from_f32(__fmul_rn(x[e], inv));
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) b[e] = ng_fp8e4m3_from_f32(__fdiv_rn(x[e], scale));
    }
}

// Cache block and row of a slot in [0, num_slots): a shift for power-of-two block sizes,
// 32-bit division for other slots below 2^31, 64-bit division beyond.
__device__ __forceinline__ void ng_split_slot(i64 s, const FastDiv& block_size, i64& blk, i64& off) {
    if (s <= 0x7fffffffll) {
        const int b = block_size((int)s);
        blk = b;
        off = (int)s - b * block_size.d;
    } else {
        blk = s / block_size.d;
        off = s - blk * block_size.d;
    }
}

// N fp8 bytes (low bytes of b[]) to dst; dst is 4-byte aligned for N >= 4 (host-checked).
template <int N> __device__ __forceinline__ void ng_store_fp8(u8* dst, const u32* b);
template <> __device__ __forceinline__ void ng_store_fp8<8>(u8* dst, const u32* b) {
    const u32 lo = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
    const u32 hi = __byte_perm(__byte_perm(b[4], b[5], 0x0040), __byte_perm(b[6], b[7], 0x0040), 0x5410);
    if (((u64)dst & 7) == 0) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
    } else {  // an 8-byte chunk at a 4-byte boundary (e.g. block_size 1, cache_stride 132)
        reinterpret_cast<u32*>(dst)[0] = lo;
        reinterpret_cast<u32*>(dst)[1] = hi;
    }
}
template <> __device__ __forceinline__ void ng_store_fp8<4>(u8* dst, const u32* b) {
    *reinterpret_cast<u32*>(dst) = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
}
template <> __device__ __forceinline__ void ng_store_fp8<2>(u8* dst, const u32* b) {
    *reinterpret_cast<unsigned short*>(dst) = (unsigned short)(b[0] | (b[1] << 8));
}

template <typename T, int VB>
__device__ __forceinline__ void quant_vec(const QuantParams& p) {
    typedef typename Vec<VB>::T V;
    enum { NW = VB / 4, ELEMS = VB / T::SIZE };
    __shared__ u32 s_amax[NG_QUNROLL][NG_THREADS];

    const int tid = threadIdx.x;
    const int lanes = p.head_dim / ELEMS;           // lanes per token, <= NG_THREADS (host-checked)
    const int lt = tid / lanes;                     // token within the pass
    const int c = tid - lt * lanes;                 // owns elements [c * ELEMS, (c + 1) * ELEMS)
    const int qlanes = p.quant_block_size / ELEMS;  // lanes per quant block (ELEMS divides it: host)
    const int group = min(32, qlanes & -qlanes);    // lanes combined by shuffles; aligned, within a warp
    const int q = c / qlanes;
    const FastDiv block_size(p.block_size);

    u32 w[NG_QUNROLL][NW];
    i64 tok[NG_QUNROLL], slot[NG_QUNROLL];
#pragma unroll
    for (int u = 0; u < NG_QUNROLL; ++u) {
        tok[u] = ((i64)blockIdx.x * NG_QUNROLL + u) * p.tokens_per_pass + lt;
        slot[u] = -1;
#pragma unroll
        for (int i = 0; i < NW; ++i) w[u][i] = 0u;
        if (lt < p.tokens_per_pass && tok[u] < p.num_tokens) {
            slot[u] = __ldg(p.slot_mapping + tok[u]);
            ng_words(__ldg(reinterpret_cast<const V*>(p.k + tok[u] * p.k_row_stride) + c), w[u]);
        }
    }

    // Every thread takes part in the reductions (full-warp shuffles, block barriers).
    float f[NG_QUNROLL][ELEMS];
    u32 amax[NG_QUNROLL];
#pragma unroll
    for (int u = 0; u < NG_QUNROLL; ++u) {
#pragma unroll
        for (int i = 0; i < NW; ++i) Load<T>::unpack(w[u][i], &f[u][i * Load<T>::PER_WORD]);
        amax[u] = 0u;
#pragma unroll
        for (int e = 0; e < ELEMS; ++e) amax[u] = max(amax[u], ng_abs_bits(f[u][e]));
    }
    for (int off = 1; off < group; off <<= 1) {
#pragma unroll
        for (int u = 0; u < NG_QUNROLL; ++u) amax[u] = max(amax[u], __shfl_xor_sync(0xffffffffu, amax[u], off));
    }
    if (group < qlanes) {  // quant block wider than a group (uniform: depends on params only)
        const int g = tid / qlanes;  // (token, quant block) within the pass
#pragma unroll
        for (int u = 0; u < NG_QUNROLL; ++u) s_amax[u][tid] = 0u;
        __syncthreads();
        if ((tid & (group - 1)) == 0) {
#pragma unroll
            for (int u = 0; u < NG_QUNROLL; ++u) atomicMax(&s_amax[u][g], amax[u]);
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < NG_QUNROLL; ++u) amax[u] = s_amax[u][g];
    }

    const int nq = p.head_dim / p.quant_block_size;
#pragma unroll
    for (int u = 0; u < NG_QUNROLL; ++u) {
        const i64 s = slot[u];
        if (s < 0) continue;  // padding (or no token)
        if (s >= p.num_slots) {
            if (c == 0) ng_report(p.error, NG_ERR_SLOT, tok[u], s, p.num_slots);
            continue;
        }
        i64 blk, off;
        ng_split_slot(s, block_size, blk, off);
        u8* base = p.kv_cache + blk * p.block_stride;
        float scale, inv;
        ng_block_scale(amax[u], p.ue8m0, scale, inv);
        u32 b[ELEMS];
        ng_quant_n<ELEMS>(f[u], scale, inv, b);
        ng_store_fp8<ELEMS>(base + off * p.head_dim + c * ELEMS, b);
        if (c == q * qlanes) {
            *reinterpret_cast<float*>(base + (i64)p.block_size * p.head_dim + (off * nq + q) * 4) = scale;
        }
    }
}

template <typename T>
__device__ __forceinline__ void quant_any(const QuantParams& p) {
    const int qbs = p.quant_block_size;
    const int nq = p.head_dim / qbs;
    const i64 i = (i64)blockIdx.x * NG_THREADS + threadIdx.x;
    if (i >= (i64)p.num_tokens * nq) return;
    const i64 tok = i / nq;
    const int q = (int)(i - tok * nq);
    const i64 s = __ldg(p.slot_mapping + tok);
    if (s < 0) return;
    if (s >= p.num_slots) {
        if (q == 0) ng_report(p.error, NG_ERR_SLOT, tok, s, p.num_slots);
        return;
    }
    const u8* src = p.k + tok * p.k_row_stride + (i64)q * qbs * T::SIZE;
    u32 amax = 0u;
    for (int e = 0; e < qbs; ++e) amax = max(amax, ng_abs_bits(Load<T>::one(src + e * T::SIZE)));
    i64 blk, off;
    ng_split_slot(s, FastDiv(p.block_size), blk, off);
    u8* base = p.kv_cache + blk * p.block_stride;
    float scale, inv;
    ng_block_scale(amax, p.ue8m0, scale, inv);
    u8* dst = base + off * p.head_dim + (i64)q * qbs;
    for (int e = 0; e < qbs; ++e) dst[e] = (u8)ng_quant(Load<T>::one(src + e * T::SIZE), scale, inv);
    *reinterpret_cast<float*>(base + (i64)p.block_size * p.head_dim + (off * nq + q) * 4) = scale;
}

// Fixed extern "C" names: the host finds them without NVRTC name expressions.
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_bf16_v16(const QuantParams p) { quant_vec<Bf16, 16>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_bf16_v8(const QuantParams p) { quant_vec<Bf16, 8>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_bf16_any(const QuantParams p) { quant_any<Bf16>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_f16_v16(const QuantParams p) { quant_vec<F16, 16>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_f16_v8(const QuantParams p) { quant_vec<F16, 8>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_f16_any(const QuantParams p) { quant_any<F16>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_f32_v16(const QuantParams p) { quant_vec<F32, 16>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_f32_v8(const QuantParams p) { quant_vec<F32, 8>(p); }
extern "C" __global__ void __launch_bounds__(NG_THREADS) quant_cache_f32_any(const QuantParams p) { quant_any<F32>(p); }
