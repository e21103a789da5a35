// concat_and_cache_mla: write each token's kv_c (kv_lora_rank values) and k_pe (pe_dim values)
// into the paged MLA cache at slot_mapping[i] (contract: docs/contract.md section 3).
//
// fp8_ds_mla (mla_ds_<type>_v16 / _any): a 656-byte record per token: bytes 0-511 the 512
// kv_c values as fp8 e4m3 in 4 tiles of 128, bytes 512-527 the 4 fp32 tile scales, bytes
// 528-655 the 64 k_pe values as bf16. One warp per token: lane l owns kv_c values
// [16l, 16l + 16) (two 16-byte loads, one 16-byte store of their codes), so a tile is 8
// lanes and its amax 3 xor shuffles; lanes 0-7 carry k_pe (one 16-byte load and store each);
// lane 0 stores the 4 scales. The _any kernels are the same with 2-byte loads and 4-byte
// stores, for inputs or caches not 16-byte aligned.
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

// A tile's fp32 scale from its amax (never NaN: NaN values are left out of it).
__device__ __forceinline__ float mla_tile_scale(float amax, bool pow2) {
    const float s = __fdiv_rn(amax, 448.0f);
    if (!pow2) return s > 1.17549435e-38f ? s : 1.17549435e-38f;  // FLT_MIN
    const u32 b = __float_as_uint(s > 1e-4f ? s : 1e-4f);
    return __uint_as_float(b < 0x7f800000u ? (b + 0x7fffffu) & 0xff800000u : b);  // up to 2^k; inf stays
}

// The token's cache entry, or null for a padding slot or one past the cache (reported).
// Every lane of the warp gets the same answer.
__device__ __forceinline__ u8* mla_entry(const MlaWriteParams& p, u32 token, int lane) {
    const i64 slot = __ldg(p.slot_mapping + token);
    if (slot < 0) return 0;
    if (slot >= p.num_slots) {
        if (lane == 0) ng_report(p.error, NG_ERR_SLOT, token, slot, p.num_slots);
        return 0;
    }
    const int bs = p.block_size;
    const i64 blk = (bs & (bs - 1)) == 0 ? slot >> (__ffs(bs) - 1) : slot / bs;  // production: 64
    return p.kv_cache + blk * p.block_stride + (slot - blk * bs) * p.entry_stride;
}

template <typename T, int VEC>
__device__ __forceinline__ void mla_ds_body(const MlaWriteParams& p) {
    const int lane = threadIdx.x & 31;
    const u32 token = blockIdx.x * (NG_THREADS / 32) + (threadIdx.x >> 5);
    if (token >= (u32)p.num_tokens) return;  // the whole warp
    u8* rec = mla_entry(p, token, lane);
    if (rec == 0) return;  // the whole warp

    // Every load first: the lane's 16 kv_c values (8 words) and, lanes 0-7, 8 k_pe values.
    const u8* src = p.kv_c + (i64)token * p.kv_c_row_stride + lane * 32;
    const bool has_pe = p.pe_dim != 0 && lane < 8;
    const u8* pe_src = p.k_pe + (i64)token * p.k_pe_row_stride + lane * 16;
    u32 w[8], pe[4];
    if (VEC == 16) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(src)), b = __ldg(reinterpret_cast<const uint4*>(src) + 1);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
        if (has_pe) {
            const uint4 c = __ldg(reinterpret_cast<const uint4*>(pe_src));
            pe[0] = c.x; pe[1] = c.y; pe[2] = c.z; pe[3] = c.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = mla_load<T>(src + 4 * i) | (mla_load<T>(src + 4 * i + 2) << 16);
        if (has_pe) {
#pragma unroll
            for (int i = 0; i < 4; ++i) pe[i] = mla_load<T>(pe_src + 4 * i) | (mla_load<T>(pe_src + 4 * i + 2) << 16);
        }
    }

    // The tile's amax as the largest |bits| (orders like |value| for bf16 and fp16), NaNs as 0.
    u32 key = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const u32 lo = w[i] & 0x7fffu, hi = (w[i] >> 16) & 0x7fffu;
        key = max(key, max(lo > (u32)T::NAN_KEY ? 0u : lo, hi > (u32)T::NAN_KEY ? 0u : hi));
    }
    key = max(key, __shfl_xor_sync(0xffffffffu, key, 4));
    key = max(key, __shfl_xor_sync(0xffffffffu, key, 2));
    key = max(key, __shfl_xor_sync(0xffffffffu, key, 1));
    const bool pow2 = (p.flags & NG_MLA_POW2_SCALES) != 0;
    const float scale = mla_tile_scale(mla_to_float<T>(key), pow2);
    const float inv = __fdiv_rn(1.0f, scale);  // exact when scale is a power of two

    u32 codes[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
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
    // Tiles 1-3's scales to lane 0 (lanes 8, 16, 24 hold them).
    const u32 sb = __float_as_uint(scale);
    const u32 s1 = __shfl_xor_sync(0xffffffffu, sb, 8), s2 = __shfl_xor_sync(0xffffffffu, sb, 16),
              s3 = __shfl_xor_sync(0xffffffffu, sb, 24);
    if (has_pe && T::NAN_KEY == MlaF16::NAN_KEY) {  // fp16 k_pe: rounded to the record's bf16
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            pe[i] = ng_bf16x2_from_float(ng_half_to_float((unsigned short)(pe[i] & 0xffffu)),
                                         ng_half_to_float((unsigned short)(pe[i] >> 16)));
        }
    }

    u8* codes_dst = rec + lane * 16;
    u8* pe_dst = rec + 528 + lane * 16;
    if (VEC == 16) {
        uint4 v;
        v.x = codes[0]; v.y = codes[1]; v.z = codes[2]; v.w = codes[3];
        *reinterpret_cast<uint4*>(codes_dst) = v;
        if (lane == 0) {
            uint4 s;
            s.x = sb; s.y = s1; s.z = s2; s.w = s3;
            *reinterpret_cast<uint4*>(rec + 512) = s;
        }
        if (has_pe) {
            uint4 e;
            e.x = pe[0]; e.y = pe[1]; e.z = pe[2]; e.w = pe[3];
            *reinterpret_cast<uint4*>(pe_dst) = e;
        }
    } else {  // the entry is 4-byte aligned (checked by the host)
#pragma unroll
        for (int i = 0; i < 4; ++i) reinterpret_cast<u32*>(codes_dst)[i] = codes[i];
        if (lane == 0) {
            u32* s = reinterpret_cast<u32*>(rec + 512);
            s[0] = sb; s[1] = s1; s[2] = s2; s[3] = s3;
        }
        if (has_pe) {
#pragma unroll
            for (int i = 0; i < 4; ++i) reinterpret_cast<u32*>(pe_dst)[i] = pe[i];
        }
    }
}

template <typename T, bool FP8>
__device__ __forceinline__ void mla_plain_body(const MlaWriteParams& p) {
    const int lane = threadIdx.x & 31;
    const u32 token = blockIdx.x * (NG_THREADS / 32) + (threadIdx.x >> 5);
    if (token >= (u32)p.num_tokens) return;  // the whole warp
    u8* rec = mla_entry(p, token, lane);
    if (rec == 0) return;
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

// Entry points: none here. The spec (nvrtc_gather/kernels/mla_cache.py) names each module's
// entry points and the body each runs; the JIT appends the extern "C" wrappers.
