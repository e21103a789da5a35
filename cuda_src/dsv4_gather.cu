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
// +inf. SGLang's bf16 flat form also reads DeepSeek-V4.1's records (V41Record below).
//
// Work split: one warp per token, NG_V4_PASSES tokens per warp (every token id loaded, then every
// record, before any store). Lane l < 28 converts NoPE values [16l, 16l + 16) (one 16-byte load; its scale byte
// from the token's 8-byte scale row, one broadcast load); in the bf16 forms lanes 28-31 carry the
// RoPE values [32(l - 28), +32) bytes (two 16-byte loads), in the fp8 form every lane converts
// RoPE values 2l and 2l + 1 (a 4-byte load, a 2-byte store). Every other access is 16 bytes wide
// but the scale row.
// Index values are untrusted: a token id outside [0, num_slots), a block id outside
// [0, num_pages), a block column past max_blocks, a gather longer than its sequence or a row
// past out: SGLang's forms write that row as zeros, vLLM's skips it (rows it does not own
// stay untouched); debug mode reports the first.
#include "dsv4_params.cuh"
#include "half_bits.cuh"
#include "fp8_e4m3.cuh"

#define NG_V4_RECORD 576  // data bytes of a token
#define NG_V4_SCALES 8    // scale bytes of a token
#define NG_V4_WARPS (NG_THREADS / 32)
#ifndef NG_V4_PASSES
#error "NG_V4_PASSES (tokens per warp) is set by the spec (kernels/dsv4_gather.py)"
#endif
#define NG_V4_ROWS (NG_V4_WARPS * NG_V4_PASSES)
#ifndef NG_V4_RAW
#define NG_V4_RAW 0  // experiments only: store the loaded bytes unconverted (the access pattern's ceiling)
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !NG_SOFT_FP8 && !defined(NG_V4_NO_F16)
#define NG_V4_F16 1
#else
#define NG_V4_F16 0
#endif

// A lane's source bytes of one token: a = 16 NoPE codes (lane < 28) or the first 16 RoPE bytes,
// b = the next 16 RoPE bytes; s = the NoPE lane's scale byte.
struct V4Lane {
    uint4 a, b;
};

// NoPE lane l < 28 of a token: its 16 codes (a) and their scale byte (s), from the token's record
// (rec) in the page at base.
__device__ __forceinline__ void load_nope(const DsV4GatherParams& p, const u8* base, const u8* rec, int slot,
                                          int lane, uint4& a, u32& s) {
    a = __ldg(reinterpret_cast<const uint4*>(rec) + lane);
    const uint2 row = __ldg(reinterpret_cast<const uint2*>(base + (i64)p.page_size * NG_V4_RECORD +
                                                           (i64)slot * NG_V4_SCALES));
    const int k = lane >> 2;  // 16 values a lane, 64 a scale
    s = ((k < 4 ? row.x : row.y) >> (8 * (k & 3))) & 0xffu;
}

__device__ __forceinline__ void load_lane(const DsV4GatherParams& p, int page, int slot, int lane, V4Lane& x,
                                          u32& s) {
    const u8* base = p.cache + (i64)page * p.page_stride;
    const u8* rec = base + (i64)slot * NG_V4_RECORD;
    if (lane < 28) {
        load_nope(p, base, rec, slot, lane, x.a, s);
    } else {
        const uint4* r = reinterpret_cast<const uint4*>(rec + 448) + 2 * (lane - 28);
        x.a = __ldg(r);
        x.b = __ldg(r + 1);
        s = 0;
    }
}

// 2^(s - 127) by its bits: s = 0 gives +0, s = 255 gives +inf.
__device__ __forceinline__ float ue8m0(u32 s) { return __uint_as_float(s << 23); }

// Four NoPE values (codes in c, lowest byte first) times the scale, as fp32.
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
__device__ __forceinline__ u32 nope4_fp8_f16(u32 c, u32 scale2) {
    u32 lo, hi;
    unsigned short a, b;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"((unsigned short)(c & 0xffffu)));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"((unsigned short)(c >> 16)));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(lo) : "r"(scale2));
    asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(hi) : "r"(scale2));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(a) : "r"(lo));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(b) : "r"(hi));
    return (u32)a | ((u32)b << 16);
}
#endif

__device__ __forceinline__ u32 fp8x4_of_f32(const float* f) { return ng_fp8e4m3x4_from_f32(f[0], f[1], f[2], f[3]); }
__device__ __forceinline__ u32 bf16x2_of_f32(const float* f) { return ng_bf16x2_from_float(f[0], f[1]); }

// 16 NoPE codes (x) times 2^(s - 127) into 16 fp8 bytes (FP8_OUT) or 32 bf16 bytes at dst.
template <bool FP8_OUT>
__device__ __forceinline__ void store_nope(u8* dst, const uint4& x, u32 s) {
    const u32 c[4] = {x.x, x.y, x.z, x.w};
    if (FP8_OUT) {
#if NG_V4_F16
        if (s - 113u <= 29u) {
            const u32 scale2 = ((s - 112u) << 10) * 0x10001u;  // f16x2 of 2^(s - 127), both halves
            *reinterpret_cast<uint4*>(dst) = make_uint4(nope4_fp8_f16(c[0], scale2), nope4_fp8_f16(c[1], scale2),
                                                        nope4_fp8_f16(c[2], scale2), nope4_fp8_f16(c[3], scale2));
            return;
        }
#endif
        u32 o[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float f[4];
            nope4(c[i], ue8m0(s), f);
            o[i] = fp8x4_of_f32(f);
        }
        *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
    } else {
        u32 o[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float f[4];
            nope4(c[i], ue8m0(s), f);
            o[2 * i] = bf16x2_of_f32(f);
            o[2 * i + 1] = bf16x2_of_f32(f + 2);
        }
        *reinterpret_cast<uint4*>(dst) = make_uint4(o[0], o[1], o[2], o[3]);
        *reinterpret_cast<uint4*>(dst + 16) = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

// A lane's share of one bf16 output row (dst: the row's first byte).
__device__ __forceinline__ void store_lane(u8* dst, const V4Lane& x, u32 s, int lane) {
    if (NG_V4_RAW) {  // experiments: the same stores, unconverted
        uint4* d = reinterpret_cast<uint4*>(dst + (lane < 28 ? 32 * lane : 896 + 32 * (lane - 28)));
        d[0] = x.a;
        d[1] = lane < 28 ? x.a : x.b;
        return;
    }
    if (lane < 28) {
        store_nope<false>(dst + 32 * lane, x.a, s);
    } else {
        uint4* d = reinterpret_cast<uint4*>(dst + 896 + 32 * (lane - 28));  // RoPE bf16, bit for bit
        d[0] = x.a;
        d[1] = x.b;
    }
}

template <int ROW_BYTES>  // 512 (fp8) or 1024 (bf16) bytes a row over 32 lanes
__device__ __forceinline__ void zero_lane(u8* dst, int lane) {
    uint4* d = reinterpret_cast<uint4*>(dst + ROW_BYTES / 32 * lane);
    d[0] = make_uint4(0u, 0u, 0u, 0u);
    if (ROW_BYTES == 1024) d[1] = make_uint4(0u, 0u, 0u, 0u);
}

// The fp8 form's lanes: NoPE as above (lanes 0-27), and every lane converts two RoPE values (4
// bytes at 448 + 4 * lane: one coalesced 128-byte load and a 64-byte store a warp), so the RoPE
// conversion is one instruction a lane, not sixteen on four lanes that the warp waits for.
__device__ __forceinline__ void load_lane_fp8(const DsV4GatherParams& p, int page, int slot, int lane, V4Lane& x,
                                              u32& s) {
    const u8* base = p.cache + (i64)page * p.page_stride;
    const u8* rec = base + (i64)slot * NG_V4_RECORD;
    s = 0;
    if (lane < 28) load_nope(p, base, rec, slot, lane, x.a, s);
    x.b.x = __ldg(reinterpret_cast<const u32*>(rec + 448) + lane);
}

__device__ __forceinline__ void store_lane_fp8(u8* dst, const V4Lane& x, u32 s, int lane) {
    if (NG_V4_RAW) {  // experiments: the same stores, unconverted
        if (lane < 28) *reinterpret_cast<uint4*>(dst + 16 * lane) = x.a;
        *reinterpret_cast<unsigned short*>(dst + 448 + 2 * lane) = (unsigned short)(x.b.x & 0xffffu);
        return;
    }
    if (lane < 28) store_nope<true>(dst + 16 * lane, x.a, s);
    const u32 w = x.b.x;  // RoPE values 2 lane, 2 lane + 1 (bf16)
    *reinterpret_cast<unsigned short*>(dst + 448 + 2 * lane) =
        (unsigned short)ng_fp8e4m3x2_from_f32(ng_bf16_to_float(w & 0xffffu), ng_bf16_to_float(w >> 16));
}

// The record formats the flat forms read: load(p, page, slot, lane, x, s) brings a lane's source
// bytes and scale, store(dst, x, s, lane) writes its share of the output row; ROW_BYTES a row.
template <bool FP8_OUT>
struct V4Record {  // DeepSeek-V4's 584-byte record, bf16 or fp8 out
    static constexpr int ROW_BYTES = FP8_OUT ? 512 : 1024;
    typedef V4Lane Lane;
    static __device__ __forceinline__ void load(const DsV4GatherParams& p, int page, int slot, int lane, Lane& x,
                                                u32& s) {
        if (FP8_OUT) load_lane_fp8(p, page, slot, lane, x, s); else load_lane(p, page, slot, lane, x, s);
    }
    static __device__ __forceinline__ void store(u8* dst, const Lane& x, u32 s, int lane) {
        if (FP8_OUT) store_lane_fp8(dst, x, s, lane); else store_lane(dst, x, s, lane);
    }
};

// DeepSeek-V4.1's records (SGLang's KVLayout V41, V41_NEW, V41_FP4, V41_FP4_NEW), bf16 out: all
// 512 values quantized (RoPE too); lane l converts values [16l, 16l + 16).
//  - MXFP8 (FP4 false): 512 e4m3 codes, then 16 UE8M0 scales, one per 32 values: v = e4m3 *
//    2^(s - 127) in fp32 without flush to zero; s = 0 is 2^-127 (an fp32 subnormal), s = 255 NaN.
//  - FP4: 256 bytes of e2m1 codes (value 2j in byte j's low nibble), then 32 e4m3 scales, one per
//    16 values: v = e2m1 * e4m3 in fp32 (exact).
// Then bf16, round to nearest even (NaN 0x7fff). Where a token's bytes are: split (V41,
// V41_FP4): data at slot * DATA, scales at page_size * DATA + slot * SCALES; interleaved (*_NEW):
// data at slot * (DATA + SCALES), its scales right after. Every offset is a multiple of 16.
template <bool FP4, bool INTERLEAVED>
struct V41Record {
    static constexpr int ROW_BYTES = 1024, DATA = FP4 ? 256 : 512, SCALES = FP4 ? 32 : 16;
    struct Lane {
        uint4 c;  // the lane's 16 codes (FP4: 8 bytes, in c.x and c.y)
    };
    static __device__ __forceinline__ void load(const DsV4GatherParams& p, int page, int slot, int lane, Lane& x,
                                                u32& s) {
        const u8* base = p.cache + (i64)page * p.page_stride;
        const u8* rec = base + (i64)slot * (INTERLEAVED ? DATA + SCALES : DATA);
        const u8* scales = INTERLEAVED ? rec + DATA : base + (i64)p.page_size * DATA + (i64)slot * SCALES;
        if (FP4) {
            const uint2 c = __ldg(reinterpret_cast<const uint2*>(rec) + lane);
            x.c = make_uint4(c.x, c.y, 0u, 0u);
            s = __ldg(scales + lane);
        } else {
            x.c = __ldg(reinterpret_cast<const uint4*>(rec) + lane);
            s = __ldg(scales + (lane >> 1));
        }
    }
    // 8 e2m1 codes (c: value 2j in byte j's low nibble) as e4m3 bytes of a 64th of their values,
    // value pairs (0, 1), (2, 3) in lo and (4, 5), (6, 7) in hi: magnitude bits e1 e0 m0 moved to
    // e4m3's bits 4-2 give 2^(e - 7) (1 + m0 / 2), and for e = 0 the subnormal m0 * 2^-7; sign bit 3
    // to bit 7. So one e4m3 pair conversion decodes two codes (exactly, never a NaN code).
    static __device__ __forceinline__ void e2m1x8_as_e4m3(u32 c, u32& lo, u32& hi) {
        const u32 even = ((c & 0x07070707u) << 2) | ((c & 0x08080808u) << 4);
        const u32 odd = ((c >> 2) & 0x1c1c1c1cu) | (c & 0x80808080u);
        lo = __byte_perm(even, odd, 0x5140);
        hi = __byte_perm(even, odd, 0x7362);
    }
    static __device__ __forceinline__ void store(u8* dst, const Lane& x, u32 s, int lane) {
        u32 o[8];
        if (FP4) {
            // v = (e2m1 / 64) * (64 e4m3): both factors and the product exact in fp32, as e2m1 * e4m3
            const float scale64 = __fmul_rn(ng_float_from_fp8e4m3(s), 64.0f);
            u32 e[4];
            e2m1x8_as_e4m3(x.c.x, e[0], e[1]);
            e2m1x8_as_e4m3(x.c.y, e[2], e[3]);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float f[2];
                ng_float2_from_fp8e4m3x2(e[i >> 1] >> (16 * (i & 1)), f[0], f[1]);
                o[i] = ng_bf16x2_from_float(__fmul_rn(f[0], scale64), __fmul_rn(f[1], scale64));
            }
        } else {
            // 2^(s - 127) by its bits, s = 0 the subnormal 2^-127, s = 255 NaN
            const float scale = __uint_as_float(s == 0u ? 0x00400000u : s == 255u ? 0x7fffffffu : s << 23);
            const u32 c[4] = {x.c.x, x.c.y, x.c.z, x.c.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float f[4];
                nope4(c[i], scale, f);
                o[2 * i] = bf16x2_of_f32(f);
                o[2 * i + 1] = bf16x2_of_f32(f + 2);
            }
        }
        uint4* d = reinterpret_cast<uint4*>(dst + 32 * lane);
        d[0] = make_uint4(o[0], o[1], o[2], o[3]);
        d[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
};

// SGLang's forms: out row r < num_ids from token id ids[r] (page id / page_size, slot id %
// page_size) in record format R; rows num_ids .. rows - 1 (extra_rows) and rows with a bad id
// are zero.
template <typename IT, class R>
__device__ __forceinline__ void dsv4_flat_body(const DsV4GatherParams& p) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 row0 = (i64)blockIdx.x * NG_V4_ROWS + w;
    const FastDiv by_page(p.page_size);
    typename R::Lane x[NG_V4_PASSES];
    u32 s[NG_V4_PASSES];
    int state[NG_V4_PASSES];  // 1: load and store, 0: zero row, -1: no row
    IT ids[NG_V4_PASSES];     // every pass's token id, issued before any is waited for
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        const i64 row = row0 + u * NG_V4_WARPS;
        ids[u] = row < p.num_ids ? ng_ldg_now(reinterpret_cast<const IT*>(p.ids) + row * p.ids_stride) : (IT)-1;
    }
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        const i64 row = row0 + u * NG_V4_WARPS;
        state[u] = row < p.rows ? 0 : -1;
        if (row < p.num_ids) {
            const i64 id = (i64)ids[u];
            if (id >= 0 && id < p.num_slots) {  // num_slots <= INT32_MAX (host)
                const int page = by_page((int)id);
                R::load(p, page, (int)id - page * p.page_size, lane, x[u], s[u]);
                state[u] = 1;
            } else if (lane == 0) {
                ng_report(p.error, NG_ERR_TOKEN_ID, row, id, p.num_slots);
            }
        }
    }
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        if (state[u] < 0) continue;
        u8* dst = p.out + (row0 + u * NG_V4_WARPS) * p.out_row_stride;
        if (state[u]) R::store(dst, x[u], s[u], lane); else zero_lane<R::ROW_BYTES>(dst, lane);
    }
}

// vLLM's form: request r = block / tiles_per_req writes rows offset + i of out[r] for i in its
// tile, i < g (g = gather_lens[r], or seq_lens[r] without gather_lens), from cache position
// seq_lens[r] - g + i through block_table[r]. Rows it does not write stay untouched.
// Without gather_lens (vLLM's compressed-cache call) row i's position is i whatever the length,
// so its block id is loaded beside the length (a column inside block_table, used only once the
// row is known to be the request's): the record is two round trips away instead of three.
__device__ __forceinline__ void dsv4_paged_body(const DsV4GatherParams& p) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int r = (int)(blockIdx.x / (u64)p.tiles_per_req);
    const i64 i0 = (i64)(blockIdx.x - (u64)r * p.tiles_per_req) * NG_V4_ROWS;
    const FastDiv by_block(p.page_size);
    const i32* bt_row = reinterpret_cast<const i32*>(p.ids) + (i64)r * p.ids_stride;
    // The lengths and the guesses are issued before any is waited for, each kept in its loaded type
    // until then (a conversion right after a load made ptxas wait for it there: sm_90 SASS).
    const i32 seq_value = ng_ldg_now(reinterpret_cast<const i32*>(p.seq_lens) + r);
    const i32 len_value = p.gather_lens ? ng_ldg_now(reinterpret_cast<const i32*>(p.gather_lens) + r) : 0;
    i32 guess[NG_V4_PASSES];  // without gather_lens: row i's block id
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        const i64 i = i0 + w + u * NG_V4_WARPS;
        guess[u] = -1;
        if (!p.gather_lens && i <= 0x7fffffff && i < p.max_blocks * p.page_size)  // column i / page_size exists
            guess[u] = ng_ldg_now(bt_row + by_block((int)i));
    }
    const i64 seq = seq_value, len = p.gather_lens ? (i64)len_value : seq;
    if (i0 >= len) return;  // the whole block: past this request's rows (or len <= 0)
    V4Lane x[NG_V4_PASSES];
    u32 s[NG_V4_PASSES];
    bool ok[NG_V4_PASSES];
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        const i64 i = i0 + w + u * NG_V4_WARPS;
        ok[u] = false;
        if (i >= len) continue;
        const i64 pos = seq - len + i;
        if (pos < 0) {  // gathering more tokens than the sequence has
            if (lane == 0) ng_report(p.error, NG_ERR_GATHER_LEN, r, len, seq);
            continue;
        }
        if (p.offset + i >= p.rows) {
            if (lane == 0) ng_report(p.error, NG_ERR_OUT_ROWS, r, p.offset + i, p.rows);
            continue;
        }
        const int j = by_block((int)pos);  // 0 <= pos < seq <= INT32_MAX
        if (j >= p.max_blocks) {
            if (lane == 0) ng_report(p.error, NG_ERR_BLOCK_INDEX, i, r, j);
            continue;
        }
        const int b = p.gather_lens ? __ldg(bt_row + j) : guess[u];  // no gather_lens: pos = i, so j is the guess's column
        if (b < 0 || b >= p.num_pages) {
            if (lane == 0) ng_report(p.error, NG_ERR_BLOCK_ID, i, r, b);
            continue;
        }
        load_lane(p, b, (int)(pos - (i64)j * p.page_size), lane, x[u], s[u]);
        ok[u] = true;
    }
#pragma unroll
    for (int u = 0; u < NG_V4_PASSES; ++u) {
        if (!ok[u]) continue;
        const i64 row = p.offset + i0 + w + u * NG_V4_WARPS;
        store_lane(p.out + (i64)r * p.out_req_stride + row * p.out_row_stride, x[u], s[u], lane);
    }
}

// Entry points: none here. The spec (nvrtc_gather/kernels/dsv4_gather.py) names them and the
// body each runs (dsv4_flat_body<i64, V4Record<true>>, dsv4_paged_body, ...); the JIT appends the
// wrappers.
