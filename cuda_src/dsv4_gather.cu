// DeepSeek-V4's MLA record (584 bytes a token) gathered out of its paged cache and dequantized
// (contract: docs/contract.md, "DeepSeek-V4 record gathers"). A page of P tokens holds the P
// data records first (448 fp8-e4m3 NoPE values, then 64 bf16 RoPE values: 576 bytes), then
// the P scale rows (7 UE8M0 bytes, one per 64 NoPE values, and a pad byte: 8 bytes).
// Output rows of 512 values: NoPE value v = e4m3 * 2^(scale - 127) (exact in fp32), then
//  - bf16 (SGLang's dequantize_k_cache_paged_dsv4, vLLM's dequantize_and_gather_k_cache):
//    round to nearest even; RoPE copied bit for bit;
//  - fp8 (SGLang's gather_dequant_requant_fp8_paged_dsv4): e4m3 round to nearest even,
//    finite overflow and inf to +-448, NaN 0x7f; RoPE bf16 cast the same way.
// Scale byte 0 gives a scale of +0 (2^-127 flushed, as SGLang's and vLLM's kernels do), 255
// +inf.
//
// Work split: 64 threads per token, 16 tokens per block of 256 threads (four passes of four).
// Thread unit g < 56 converts NoPE values [8g, 8g + 8) (one 8-byte load and its scale byte);
// g >= 56 carries RoPE values [8g - 448, 8g - 440) (one 16-byte load). Each thread issues the
// loads of its four tokens before any store. Output element 8g lands at byte 16g (bf16) or
// 8g (fp8) of the row.
// Index values are untrusted: a token id outside [0, num_slots), a block id outside
// [0, num_pages), a block column past max_blocks, a gather longer than its sequence or a row
// past out: SGLang's forms write that row as zeros, vLLM's skips it (rows it does not own
// stay untouched); debug mode reports the first.
#include "dsv4_params.cuh"
#include "half_bits.cuh"
#include "fp8_e4m3.cuh"

#define NG_V4_RECORD 576          // data bytes of a token
#define NG_V4_SCALES 8            // scale bytes of a token
#define NG_V4_TOKENS_PER_PASS (NG_THREADS / 64)
#ifndef NG_V4_PASSES
#error "NG_V4_PASSES (passes of four tokens per block) is set by the spec (kernels/dsv4_gather.py)"
#endif
#define NG_V4_ROWS (NG_V4_TOKENS_PER_PASS * NG_V4_PASSES)
#ifndef NG_V4_RAW
#define NG_V4_RAW 0  // experiments only: store the loaded bytes unconverted (the access pattern's ceiling)
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !NG_SOFT_FP8 && !defined(NG_V4_NO_F16)
#define NG_V4_F16 1
#else
#define NG_V4_F16 0
#endif

// One thread's source bytes of a token: 16 of RoPE, or 8 of NoPE (in v.x, v.y) and their scale byte.
__device__ __forceinline__ void load_unit(const DsV4GatherParams& p, int page, int slot, int g, uint4& v, u32& scale) {
    const u8* base = p.cache + (i64)page * p.page_stride;
    const u8* rec = base + (i64)slot * NG_V4_RECORD;
    if (g < 56) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(rec) + g);
        v = make_uint4(x.x, x.y, 0u, 0u);
        scale = __ldg(base + (i64)p.page_size * NG_V4_RECORD + (i64)slot * NG_V4_SCALES + (g >> 3));
    } else {
        v = __ldg(reinterpret_cast<const uint4*>(rec + 448) + (g - 56));
        scale = 0;
    }
}

// 2^(s - 127) by its bits: s = 0 gives +0, s = 255 gives +inf.
__device__ __forceinline__ float ue8m0(u32 s) { return __uint_as_float(s << 23); }

// Four NoPE values (codes in c, lowest byte first) times the scale.
__device__ __forceinline__ void nope4(u32 c, float scale, float* f) {
    ng_float2_from_fp8e4m3x2(c & 0xffffu, f[0], f[1]);
    ng_float2_from_fp8e4m3x2(c >> 16, f[2], f[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __fmul_rn(f[i], scale);
}

#if NG_V4_F16
// Four NoPE values to e4m3 through f16: e4m3 -> f16 is exact, and so is the product by 2^(s - 127)
// for s in [113, 142] (an f16 normal): a 4-bit significand times a power of two is an f16 value,
// or so small that e4m3 rounds it to +-0 either way, and an f16 overflow to inf saturates to +-448
// as the f32 product does; so the bytes are the f32 path's, in half the instructions.
__device__ __forceinline__ u32 nope4_fp8_f16(u32 c, u32 s) {
    const u32 scale = ((s - 112u) << 10) * 0x10001u;  // f16x2 of 2^(s - 127), both halves
    u32 lo, hi;
    unsigned short a, b;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"((unsigned short)(c & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"((unsigned short)(c >> 16)));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(lo) : "r"(scale));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(hi) : "r"(scale));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(a) : "r"(lo));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(b) : "r"(hi));
    return (u32)a | ((u32)b << 16);
}
#endif

template <bool FP8_OUT>
__device__ __forceinline__ void store_unit(u8* dst, const uint4& v, u32 scale, int g) {
    float f[8];
    if (NG_V4_RAW) {
        if (FP8_OUT) *reinterpret_cast<uint2*>(dst) = make_uint2(v.x, v.y); else *reinterpret_cast<uint4*>(dst) = v;
        return;
    }
#if NG_V4_F16
    if (FP8_OUT && g < 56 && scale - 113u <= 29u) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(nope4_fp8_f16(v.x, scale), nope4_fp8_f16(v.y, scale));
        return;
    }
#endif
    if (g < 56) {
        const float s = ue8m0(scale);
        nope4(v.x, s, f);
        nope4(v.y, s, f + 4);
    } else if (FP8_OUT) {
        const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = ng_bf16_to_float(w[i] & 0xffffu);
            f[2 * i + 1] = ng_bf16_to_float(w[i] >> 16);
        }
    } else {
        *reinterpret_cast<uint4*>(dst) = v;  // RoPE bf16, bit for bit
        return;
    }
    if (FP8_OUT) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(ng_fp8e4m3x4_from_f32(f[0], f[1], f[2], f[3]),
                                                    ng_fp8e4m3x4_from_f32(f[4], f[5], f[6], f[7]));
    } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(ng_bf16x2_from_float(f[0], f[1]), ng_bf16x2_from_float(f[2], f[3]),
                                                    ng_bf16x2_from_float(f[4], f[5]), ng_bf16x2_from_float(f[6], f[7]));
    }
}

template <bool FP8_OUT>
__device__ __forceinline__ void store_zero(u8* dst) {
    if (FP8_OUT) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
    } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// SGLang's forms: out row r < num_ids from token id ids[r] (page id / page_size, slot id %
// page_size); rows num_ids .. rows - 1 (extra_rows) and rows with a bad id are zero.
template <typename IT, bool FP8_OUT>
__device__ __forceinline__ void dsv4_flat_body(const DsV4GatherParams& p) {
    const int g = threadIdx.x & 63, q = threadIdx.x >> 6;
    const i64 row0 = (i64)blockIdx.x * NG_V4_ROWS;
    const FastDiv by_page(p.page_size);
    const int unit_bytes = FP8_OUT ? 8 : 16;
    uint4 v[NG_V4_PASSES];
    u32 sc[NG_V4_PASSES];
    int state[NG_V4_PASSES];  // 1: load and store, 0: zero row, -1: no row
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        const i64 row = row0 + q + u * NG_V4_TOKENS_PER_PASS;
        state[u] = row < p.rows ? 0 : -1;
        if (row < p.num_ids) {
            const i64 id = (i64)__ldg(reinterpret_cast<const IT*>(p.ids) + row * p.ids_stride);
            if (id >= 0 && id < p.num_slots) {  // num_slots <= INT32_MAX (host)
                const int page = by_page((int)id);
                load_unit(p, page, (int)id - page * p.page_size, g, v[u], sc[u]);
                state[u] = 1;
            } else if (g == 0) {
                ng_report(p.error, NG_ERR_TOKEN_ID, row, id, p.num_slots);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        if (state[u] < 0) continue;
        u8* dst = p.out + (row0 + q + u * NG_V4_TOKENS_PER_PASS) * p.out_row_stride + (i64)g * unit_bytes;
        if (state[u]) store_unit<FP8_OUT>(dst, v[u], sc[u], g); else store_zero<FP8_OUT>(dst);
    }
}

// vLLM's form: request r = block / tiles_per_req writes rows offset + i of out[r] for i in its
// tile, i < g (g = gather_lens[r], or seq_lens[r] without gather_lens), from cache position
// seq_lens[r] - g + i through block_table[r]. Rows it does not write stay untouched.
__device__ __forceinline__ void dsv4_paged_body(const DsV4GatherParams& p) {
    const int g = threadIdx.x & 63, q = threadIdx.x >> 6;
    const int r = (int)(blockIdx.x / (u64)p.tiles_per_req);
    const i64 i0 = (i64)(blockIdx.x - (u64)r * p.tiles_per_req) * NG_V4_ROWS;
    const i64 seq = __ldg(reinterpret_cast<const i32*>(p.seq_lens) + r);
    const i64 len = p.gather_lens ? (i64)__ldg(reinterpret_cast<const i32*>(p.gather_lens) + r) : seq;
    if (i0 >= len) return;  // the whole block: past this request's rows (or len <= 0)
    const FastDiv by_block(p.page_size);
    uint4 v[NG_V4_PASSES];
    u32 sc[NG_V4_PASSES];
    bool ok[NG_V4_PASSES];
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        const i64 i = i0 + q + u * NG_V4_TOKENS_PER_PASS;
        ok[u] = false;
        if (i >= len) continue;
        const i64 pos = seq - len + i;
        if (pos < 0) {  // gathering more tokens than the sequence has
            if (g == 0) ng_report(p.error, NG_ERR_GATHER_LEN, r, len, seq);
            continue;
        }
        if (p.offset + i >= p.rows) {
            if (g == 0) ng_report(p.error, NG_ERR_OUT_ROWS, r, p.offset + i, p.rows);
            continue;
        }
        const int j = by_block((int)pos);  // 0 <= pos < seq <= INT32_MAX
        if (j >= p.max_blocks) {
            if (g == 0) ng_report(p.error, NG_ERR_BLOCK_INDEX, i, r, j);
            continue;
        }
        const int b = __ldg(reinterpret_cast<const i32*>(p.ids) + (i64)r * p.ids_stride + j);
        if (b < 0 || b >= p.num_pages) {
            if (g == 0) ng_report(p.error, NG_ERR_BLOCK_ID, i, r, b);
            continue;
        }
        load_unit(p, b, (int)(pos - j * p.page_size), g, v[u], sc[u]);
        ok[u] = true;
    }
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        if (!ok[u]) continue;
        const i64 row = p.offset + i0 + q + u * NG_V4_TOKENS_PER_PASS;
        store_unit<false>(p.out + (i64)r * p.out_req_stride + row * p.out_row_stride + (i64)g * 16, v[u], sc[u], g);
    }
}

// Entry points: none here. The spec (nvrtc_gather/kernels/dsv4_gather.py) names them and the
// body each runs (dsv4_flat_body<i64, true>, dsv4_paged_body, ...); the JIT appends the wrappers.
