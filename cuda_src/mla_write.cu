// concat_and_cache_mla: write each token's kv_c (kv_lora_rank values) and k_pe (pe_dim values)
// into the paged MLA cache at slot_mapping[i] (contract: docs/contract.md section 4).
//
// fp8_ds_mla (mla_ds_<type>_v16 / _any): a 656-byte record per token: bytes 0-511 the 512
// kv_c values as fp8 e4m3 in 4 tiles of 128, bytes 512-527 the 4 fp32 tile scales, bytes
// 528-655 the 64 k_pe values as bf16. One warp per token: lane l owns kv_c values
// [8l, 8l + 8) and [256 + 8l, 256 + 8l + 8) (one 16-byte load and one 8-byte store of codes
// each: every access instruction of the warp covers one contiguous run), so a tile is 16 lanes
// and both its amaxes share 4 xor shuffles; lanes 0-7 carry k_pe (one 16-byte load and store
// each); lane 0 stores the 4 scales. The _any kernels are the same with 2-byte loads and
// 4-byte stores, for inputs or caches not 16-byte aligned.
// Numerics (the torch path's, ops/mla_write_torch.py, bit for bit; vLLM's kernel's for bf16):
// - amax over the tile's |values| in fp32, NaN values ignored (vLLM's fmaxf);
// - scale = amax / 448 (IEEE division), then either vLLM's current rule, rounded up to a
//   power of two after max(., 1e-4) (flags & NG_MLA_POW2_SCALES), or its older one,
//   max(., FLT_MIN);
// - code = fp8 e4m3 of value / scale (saturating, nearest even): for a power-of-two scale the
//   product with its exact inverse, the same number; a NaN value gives 0x7f;
// - k_pe: bf16 bits copied; fp16 rounded to bf16 (nearest even; vLLM copies fp16 bits into the
//   bf16 field, and takes the fp16 amax over raw bits: both fixed here).
// Plain formats (mla_plain_<type>_copy / _fp8): kv_cache [num_blocks, block_size, kv_lora_rank +
// pe_dim]; one warp per token, one element per lane and step: "copy" stores the elements' bits
// (kv_cache has kv_c's dtype), "fp8" stores fp8 e4m3 of value / scale[0] (scale 1 with
// NG_MLA_SKIP_SCALE), both kv_c and k_pe, as vLLM's kernel does.
// Slots < 0 are padding; slots >= num_slots are skipped, and reported in debug mode.
// The module is compiled with --fmad=false: no product is contracted into an add.
#include "mla_params.cuh"
#include "fp8_e4m3.cuh"
#include "half_bits.cuh"
#include "scale_math.cuh"

// kv_c / k_pe element types. NAN_KEY: the largest |bits| that is not a NaN (inf).
struct MlaBf16 { enum { SIZE = 2, NAN_KEY = 0x7f80 }; };
struct MlaF16 { enum { SIZE = 2, NAN_KEY = 0x7c00 }; };
struct MlaF32 { enum { SIZE = 4, NAN_KEY = 0 }; };

template <typename T> __device__ __forceinline__ float mla_to_float(u32 bits);
template <> __device__ __forceinline__ float mla_to_float<MlaBf16>(u32 bits) { return ng_bf16_to_float(bits); }
template <> __device__ __forceinline__ float mla_to_float<MlaF16>(u32 bits) {
    return ng_half_to_float((unsigned short)bits);
}
template <> __device__ __forceinline__ float mla_to_float<MlaF32>(u32 bits) { return __uint_as_float(bits); }

template <typename T> __device__ __forceinline__ u32 mla_load(const u8* p) {
    if (T::SIZE == 2) return __ldg(reinterpret_cast<const unsigned short*>(p));
    return __ldg(reinterpret_cast<const u32*>(p));
}

// The GPU's arithmetic makes only positive NaNs, which the fp8 conversion turns into 0x7f;
// the integer encoder keeps a NaN's sign, and the host emulator's arithmetic keeps NaN signs:
// map 0xff to 0x7f there, so every build stores what the GPU stores.
__device__ __forceinline__ u32 mla_nan_code(u32 w) {
#if NG_FP8_HW
    return w;
#else
    for (int i = 0; i < 32; i += 8) {
        if (((w >> i) & 0xffu) == 0xffu) w &= ~(0x80u << i);
    }
    return w;
#endif
}

// A tile's fp32 scale and (power-of-two rule) its exact inverse, from its amax's fp32 bits
// (never a NaN: NaN values are left out of it), without a division:
// - pow2: 2^ceil(log2(max(amax / 448, 1e-4))) = max(the power of two above amax / 448, 2^-13)
//   (2^-13 is the power of two above 1e-4; amax is raised to 0.0448 first, where both give
//   2^-13, to stay in ng_pow2_above_div448's range); inf stays inf, with inverse 0;
// - plain: max(amax / 448, FLT_MIN), the quotient by ng_div448 (exact from 2^-119; below,
//   the quotient is under FLT_MIN anyway).
__device__ __forceinline__ void mla_tile_scale(u32 amax, bool pow2, float& scale, float& inv) {
    if (amax >= 0x7f800000u) {
        scale = __uint_as_float(0x7f800000u);
        inv = 0.0f;
    } else if (pow2) {
        const u32 r = max(ng_pow2_above_div448(max(amax, 0x3d378034u)), 0x39000000u);  // 0.0448f, 2^-13
        scale = __uint_as_float(r);
        inv = __uint_as_float(ng_pow2_inverse(r));
    } else {
        const float q = amax < 0x04000000u ? 0.0f : ng_div448(__uint_as_float(amax));  // 2^-119
        scale = q > 1.17549435e-38f ? q : 1.17549435e-38f;  // FLT_MIN
        inv = 0.0f;
    }
}

// The most tokens per warp (-DNG_MLA_TPW from the spec, nvrtc_gather/kernels/mla_cache.py); a
// call uses p.tokens_per_warp <= NG_MLA_TPW of them (the host's choice: 1 for small calls, whose
// time is latency, more for large ones, whose time is bytes in flight). A warp loads all its
// tokens' slots, then all their values, before it computes and stores any.
#ifndef NG_MLA_TPW
#error "NG_MLA_TPW is set by the module's spec (-DNG_MLA_TPW)"
#endif

// The warp's first token; every lane of the warp gets the same.
__device__ __forceinline__ u32 mla_first_token(const MlaWriteParams& p) {
    return (blockIdx.x * (NG_THREADS / 32) + (threadIdx.x >> 5)) * (u32)p.tokens_per_warp;
}

// The cache entry of ``token`` (slot ``slot``), or null for a token past the call, a padding
// slot or one past the cache (reported). Every lane of the warp gets the same answer.
__device__ __forceinline__ u8* mla_entry(const MlaWriteParams& p, u32 token, i64 slot, int lane) {
    if (slot < 0) return 0;  // also a token past the call or the warp's share (mla_entries)
    if (slot >= p.num_slots) {
        if (lane == 0) ng_report(p.error, NG_ERR_SLOT, token, slot, p.num_slots);
        return 0;
    }
    const int bs = p.block_size;
    const i64 blk = (bs & (bs - 1)) == 0 ? slot >> (__ffs(bs) - 1) : slot / bs;  // production: 64
    return p.kv_cache + blk * p.block_stride + (slot - blk * bs) * p.entry_stride;
}

// The warp's tokens' entries (null: nothing to write), their slots loaded together.
__device__ __forceinline__ void mla_entries(const MlaWriteParams& p, int lane, u8** rec) {
    const u32 first = mla_first_token(p);
    i64 slot[NG_MLA_TPW];
#pragma unroll
    for (int j = 0; j < NG_MLA_TPW; ++j) {
        slot[j] = j < p.tokens_per_warp && first + j < (u32)p.num_tokens ? __ldg(p.slot_mapping + first + j) : -1;
    }
#pragma unroll
    for (int j = 0; j < NG_MLA_TPW; ++j) rec[j] = mla_entry(p, first + j, slot[j], lane);
}

// Max of each 16-bit half of two words.
__device__ __forceinline__ u32 mla_max2(u32 x, u32 y) {
    return max(x & 0xffff0000u, y & 0xffff0000u) | max(x & 0xffffu, y & 0xffffu);
}

// The largest |bits| of 8 values (4 words; orders like |value| for bf16 and fp16), NaNs as 0.
template <typename T>
__device__ __forceinline__ u32 mla_key8(const u32* w) {
    u32 key = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 lo = w[i] & 0x7fffu, hi = (w[i] >> 16) & 0x7fffu;
        key = max(key, max(lo > (u32)T::NAN_KEY ? 0u : lo, hi > (u32)T::NAN_KEY ? 0u : hi));
    }
    return key;
}

// 8 values (4 words) -> 8 fp8 codes (2 words) of value / scale (times the exact inverse for a
// power-of-two scale: the same number).
template <typename T>
__device__ __forceinline__ void mla_codes8(const u32* w, float scale, float inv, bool pow2, u32* codes) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float f[4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const u32 x = w[2 * i + j];
            const float a = mla_to_float<T>(x & 0xffffu), b = mla_to_float<T>(x >> 16);
            f[2 * j] = pow2 ? __fmul_rn(a, inv) : __fdiv_rn(a, scale);
            f[2 * j + 1] = pow2 ? __fmul_rn(b, inv) : __fdiv_rn(b, scale);
        }
        codes[i] = mla_nan_code(ng_fp8e4m3x4_from_f32(f[0], f[1], f[2], f[3]));
    }
}

template <typename T>
__device__ __forceinline__ void mla_load8(const u8* p, u32* w, bool vec16) {
    if (vec16) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
        w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = mla_load<T>(p + 4 * i) | (mla_load<T>(p + 4 * i + 2) << 16);
    }
}

// One token's loads for one lane: values [8l, 8l + 8) (half A: tile l / 16) and
// [256 + 8l, 256 + 8l + 8) (half B: tile 2 + l / 16), so that each load and store instruction of
// the warp covers one contiguous run; lanes 0-7 also 8 k_pe values.
template <typename T, int VEC>
struct MlaDsToken {
    u32 a[4], b[4], pe[4];

    __device__ __forceinline__ void load(const MlaWriteParams& p, u32 token, int lane) {
        const u8* src = p.kv_c + (i64)token * p.kv_c_row_stride + lane * 16;
        mla_load8<T>(src, a, VEC == 16);
        mla_load8<T>(src + 512, b, VEC == 16);
        if (p.pe_dim != 0 && lane < 8) mla_load8<T>(p.k_pe + (i64)token * p.k_pe_row_stride + lane * 16, pe, VEC == 16);
    }

    __device__ __forceinline__ void store(const MlaWriteParams& p, u8* rec, int lane) {
        // Both tiles' amax keys in one word (A high, B low), reduced over the tile's 16 lanes.
        u32 key = (mla_key8<T>(a) << 16) | mla_key8<T>(b);
        key = mla_max2(key, __shfl_xor_sync(0xffffffffu, key, 8));
        key = mla_max2(key, __shfl_xor_sync(0xffffffffu, key, 4));
        key = mla_max2(key, __shfl_xor_sync(0xffffffffu, key, 2));
        key = mla_max2(key, __shfl_xor_sync(0xffffffffu, key, 1));
        const bool pow2 = (p.flags & NG_MLA_POW2_SCALES) != 0;
        float scale_a, inv_a, scale_b, inv_b;
        mla_tile_scale(__float_as_uint(mla_to_float<T>(key >> 16)), pow2, scale_a, inv_a);
        mla_tile_scale(__float_as_uint(mla_to_float<T>(key & 0xffffu)), pow2, scale_b, inv_b);
        u32 codes_a[2], codes_b[2];
        mla_codes8<T>(a, scale_a, inv_a, pow2, codes_a);
        mla_codes8<T>(b, scale_b, inv_b, pow2, codes_b);
        // Lane 0 holds the scales of tiles 0 and 2, lane 16 those of tiles 1 and 3.
        const u32 s0 = __float_as_uint(scale_a), s2 = __float_as_uint(scale_b);
        const u32 s1 = __shfl_xor_sync(0xffffffffu, s0, 16), s3 = __shfl_xor_sync(0xffffffffu, s2, 16);
        const bool has_pe = p.pe_dim != 0 && lane < 8;
        if (has_pe && T::NAN_KEY == MlaF16::NAN_KEY) {  // fp16 k_pe: rounded to the record's bf16
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                pe[i] = ng_bf16x2_from_float(ng_half_to_float((unsigned short)(pe[i] & 0xffffu)),
                                             ng_half_to_float((unsigned short)(pe[i] >> 16)));
            }
        }
        u8* pe_dst = rec + 528 + lane * 16;
        if (VEC == 16) {
            *reinterpret_cast<uint2*>(rec + lane * 8) = make_uint2(codes_a[0], codes_a[1]);
            *reinterpret_cast<uint2*>(rec + 256 + lane * 8) = make_uint2(codes_b[0], codes_b[1]);
            if (lane == 0) {
                uint4 s;
                s.x = s0; s.y = s1; s.z = s2; s.w = s3;
                *reinterpret_cast<uint4*>(rec + 512) = s;
            }
            if (has_pe) {
                uint4 e;
                e.x = pe[0]; e.y = pe[1]; e.z = pe[2]; e.w = pe[3];
                *reinterpret_cast<uint4*>(pe_dst) = e;
            }
        } else {  // the entry is 4-byte aligned (checked by the host)
            u32* ca = reinterpret_cast<u32*>(rec + lane * 8);
            u32* cb = reinterpret_cast<u32*>(rec + 256 + lane * 8);
            ca[0] = codes_a[0]; ca[1] = codes_a[1]; cb[0] = codes_b[0]; cb[1] = codes_b[1];
            if (lane == 0) {
                u32* sc = reinterpret_cast<u32*>(rec + 512);
                sc[0] = s0; sc[1] = s1; sc[2] = s2; sc[3] = s3;
            }
            if (has_pe) {
#pragma unroll
                for (int i = 0; i < 4; ++i) reinterpret_cast<u32*>(pe_dst)[i] = pe[i];
            }
        }
    }
};

template <typename T, int VEC>
__device__ __forceinline__ void mla_ds_body(const MlaWriteParams& p) {
    const int lane = threadIdx.x & 31;
    u8* rec[NG_MLA_TPW];
    mla_entries(p, lane, rec);
    const u32 first = mla_first_token(p);
    MlaDsToken<T, VEC> tok[NG_MLA_TPW];
#pragma unroll
    for (int j = 0; j < NG_MLA_TPW; ++j) {  // every token's loads before any store
        if (rec[j] != 0) tok[j].load(p, first + j, lane);
    }
#pragma unroll
    for (int j = 0; j < NG_MLA_TPW; ++j) {
        if (rec[j] != 0) tok[j].store(p, rec[j], lane);  // warp-uniform: the shuffles see every lane
    }
}

template <typename T, bool FP8>
__device__ __forceinline__ void mla_plain_token(const MlaWriteParams& p, u32 token, u8* rec, int lane) {
    const u8* c = p.kv_c + (i64)token * p.kv_c_row_stride;
    const u8* e = p.k_pe + (i64)token * p.k_pe_row_stride - (i64)p.kv_lora_rank * T::SIZE;
    const float scale = FP8 && !(p.flags & NG_MLA_SKIP_SCALE) ? __ldg(p.scale) : 1.0f;
    const int width = p.kv_lora_rank + p.pe_dim;
    for (int i = lane; i < width; i += 32) {
        const u32 x = mla_load<T>((i < p.kv_lora_rank ? c : e) + (i64)i * T::SIZE);
        if (FP8) {
            const float q = __fdiv_rn(mla_to_float<T>(x), scale);
            rec[i] = (u8)mla_nan_code(ng_fp8e4m3x2_from_f32(q, 0.0f) & 0xffu);
        } else if (T::SIZE == 2) {
            reinterpret_cast<unsigned short*>(rec)[i] = (unsigned short)x;
        } else {
            reinterpret_cast<u32*>(rec)[i] = x;
        }
    }
}

template <typename T, bool FP8>
__device__ __forceinline__ void mla_plain_body(const MlaWriteParams& p) {
    const int lane = threadIdx.x & 31;
    u8* rec[NG_MLA_TPW];
    mla_entries(p, lane, rec);
    const u32 first = mla_first_token(p);
#pragma unroll
    for (int j = 0; j < NG_MLA_TPW; ++j) {
        if (rec[j] != 0) mla_plain_token<T, FP8>(p, first + j, rec[j], lane);
    }
}

// Entry points: none here. The spec (nvrtc_gather/kernels/mla_cache.py) names each module's
// entry points and the body each runs; the JIT appends the extern "C" wrappers.
