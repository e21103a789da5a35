// indexer_k_quant_and_cache: quantize rows of k to fp8-e4m3 with one fp32 scale per quant
// block and write both into the paged indexer cache (contract: docs/contract.md section 2).
//
// Vector kernels (quant_cache_<type>_v16 / _v8), picked by the host when k's alignment and
// the sizes allow: a lane owns NV adjacent VB-byte vectors of a token (ELEMS elements), a
// token takes head_dim / ELEMS lanes, a block covers tokens_per_pass tokens per pass and
// makes UNROLL / NV passes with all their loads issued first (bytes in flight). NV = 2
// whenever that keeps the host's layout (power-of-two lanes per token, an even number of
// vectors per quant block: the same UNROLL * tokens_per_pass tokens per block), else 1.
// UNROLL (tokens per lane) is the entry point's: 4, or 2 for calls of less than a wave
// (nvrtc_gather/kernels/indexer_k_quant.py: SHAPES).
// A quant block's amax: xor shuffles inside the largest power-of-two group of lanes that
// divides its lane count, then, only when the quant block is wider than that group,
// shared-memory atomicMax across the groups (ng_pass_amax).
// Generic kernels (quant_cache_<type>_any): one thread per (token, quant block), element
// loads and byte stores; any alignment, any quant block size, any head_dim.
//
// What keeps the vector kernels at the copy's pace is instructions per element, not bytes:
// - fp8 conversion by cvt.rn.satfinite.e4m3x2.f32 on sm_89+ (fp8_e4m3.cuh): one instruction
//   per pair, packed by the conversion itself;
// - amax of 16-bit types on the packed words (__vmaxu2: one VIMNMX per two elements, three
//   words per VIMNMX3 on sm_90), two passes' amaxes sharing each shuffle;
// - ue8m0: the scale from amax's bits without a division, and every value multiplied by its
//   inverse (even for an inf scale, see ng_block_scale); plain scales: amax / 448 in three
//   fp32 instructions (ng_div448), each value's quotient a multiply and two fmas (ng_div_plain)
//   instead of a division (the generic kernel keeps the division);
// - two vectors per lane (NV = 2): half the per-lane work that does not grow with the
//   elements (slot split, addresses, scale, shuffles) per element, 16-byte stores;
// - the uniform choices (ue8m0, power-of-two block size) taken once, outside the passes.
//
// Numerics are the torch path's (nvrtc_gather/ops/indexer_k_quant_torch.py), bit for bit: amax in fp32,
// scale = max(amax, 1e-4f) / 448.0f correctly rounded, ue8m0 rounding up to a power of two
// through the exponent bits, values = k / scale in fp32 (for a power-of-two scale k * 2^-e,
// the same correctly rounded number), then CUDA's satfinite fp32 -> e4m3 conversion, vLLM's
// (fp8_e4m3.cuh): every NaN code 0x7f. The module is compiled with --fmad=false so no product
// is ever contracted. +-inf in k: its quant block's scale is inf, its finite values +-0 and the
// infs 0x7f (inf / inf), as vLLM writes. NaN in k: left out of its quant block's amax, as
// vLLM's fmaxf leaves it out (a block of NaNs has amax 0), the NaNs written 0x7f; the fast
// reduction lets a NaN win, and a block where one did reduces again (ng_pass_amax).
// Slots < 0 are padding; slots >= num_slots are skipped, and reported in debug mode.
// NG_SOFT_FP8=1 builds the integer fp8 encoder (sm_80/86's) for every arch, so that tests run
// it on newer GPUs too (tests/helpers/builds.py).
#include "quant_params.cuh"
#include "fp8_e4m3.cuh"
#include "half_bits.cuh"
#include "scale_math.cuh"
#include "slot_split.cuh"

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
__device__ __forceinline__ u32 ng_vmaxu2(u32 a, u32 b) { return __vmaxu2(a, b); }
#else  // the host emulator (tests/cuda_host_emu.cpp)
static inline u32 ng_vmaxu2(u32 a, u32 b) {
    return max(a & 0xffff0000u, b & 0xffff0000u) | max(a & 0xffffu, b & 0xffffu);
}
#endif

// NaN-safe keys of a word's two 16-bit elements: (magnitude + off) mod 2^15 per half, where off
// = 2^15 - (inf's bits + 1) (bf16 0x7f, fp16 0x3ff). A half's sum stays below 2^16, so no carry
// crosses into the other half. The non-NaNs keep their order (keys off .. 0x7fff), every NaN
// wraps below them (keys 0 .. off - 1).
__device__ __forceinline__ u32 ng_nan_keys2(u32 w, u32 off) {
    return ((w & 0x7fff7fffu) + (off * 0x10001u)) & 0x7fff7fffu;
}
// Back to magnitude bits per half: key - off, and 0 for the NaN keys below off.
__device__ __forceinline__ u32 ng_unkey2(u32 x, u32 off) {
    return ng_vmaxu2(x, off * 0x10001u) - off * 0x10001u;
}

struct Bf16 { enum { SIZE = 2 }; };
struct F16 { enum { SIZE = 2 }; };
struct F32 { enum { SIZE = 4 }; };


// Per element type: the elements of a 32-bit word as fp32 (exact for every type), one element
// from memory, and amax keys. 16-bit types keep two keys per word (their magnitude bits), so
// one __vmaxu2 merges two and two passes share each shuffle. Two kinds of key:
//   acc(a, w)        folds a word of k into a lane's accumulator a (starts at 0): the magnitude
//                    bits, which order like |x| with a NaN above inf (the fast pass);
//   acc_nansafe(a, w) the same with NaN-safe keys, (magnitude + off) mod 2^15 (2^31 for fp32,
//                    off = 2^31 - inf's bits - 1): |x|'s order for the non-NaNs, NaNs below all;
//   unkey(x)         NaN-safe keys back to magnitude bits, a NaN (or no element) as 0;
//   pair(a, b)   the keys of two passes' accumulators in one word (KEYS of them);
//   merge(x, y)  the max of two such words;
//   bits(x, i)   the fp32 bits of magnitude key i of x: the amax.
template <typename T> struct Load;
template <> struct Load<Bf16> {
    enum { PER_WORD = 2, KEYS = 2 };
    static __device__ __forceinline__ void unpack(u32 w, float* f) {
        f[0] = __uint_as_float(w << 16);
        f[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ float one(const u8* p) {
        return __uint_as_float((u32)__ldg(reinterpret_cast<const unsigned short*>(p)) << 16);
    }
    static __device__ __forceinline__ u32 acc(u32 a, u32 w) { return ng_vmaxu2(a, w & 0x7fff7fffu); }
    static __device__ __forceinline__ u32 acc_nansafe(u32 a, u32 w) { return ng_vmaxu2(a, ng_nan_keys2(w, 0x7fu)); }
    static __device__ __forceinline__ u32 unkey(u32 x) { return ng_unkey2(x, 0x7fu); }
    static __device__ __forceinline__ u32 pair(u32 a, u32 b) {
        return ng_vmaxu2(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
    }
    static __device__ __forceinline__ u32 merge(u32 x, u32 y) { return ng_vmaxu2(x, y); }
    static __device__ __forceinline__ u32 bits(u32 x, int i) { return i ? x & 0xffff0000u : x << 16; }
};
template <> struct Load<F16> {
    enum { PER_WORD = 2, KEYS = 2 };
    static __device__ __forceinline__ void unpack(u32 w, float* f) {
        f[0] = ng_half_to_float((unsigned short)(w & 0xffffu));
        f[1] = ng_half_to_float((unsigned short)(w >> 16));
    }
    static __device__ __forceinline__ float one(const u8* p) {
        return ng_half_to_float(__ldg(reinterpret_cast<const unsigned short*>(p)));
    }
    static __device__ __forceinline__ u32 acc(u32 a, u32 w) { return ng_vmaxu2(a, w & 0x7fff7fffu); }
    static __device__ __forceinline__ u32 acc_nansafe(u32 a, u32 w) { return ng_vmaxu2(a, ng_nan_keys2(w, 0x3ffu)); }
    static __device__ __forceinline__ u32 unkey(u32 x) { return ng_unkey2(x, 0x3ffu); }
    static __device__ __forceinline__ u32 pair(u32 a, u32 b) {
        return ng_vmaxu2(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
    }
    static __device__ __forceinline__ u32 merge(u32 x, u32 y) { return ng_vmaxu2(x, y); }
    static __device__ __forceinline__ u32 bits(u32 x, int i) {  // fp16 -> fp32 keeps the order
        return __float_as_uint(ng_half_to_float((unsigned short)(i ? x >> 16 : x & 0xffffu)));
    }
};
template <> struct Load<F32> {
    enum { PER_WORD = 1, KEYS = 1 };
    static __device__ __forceinline__ void unpack(u32 w, float* f) { f[0] = __uint_as_float(w); }
    static __device__ __forceinline__ float one(const u8* p) { return __ldg(reinterpret_cast<const float*>(p)); }
    static __device__ __forceinline__ u32 acc(u32 a, u32 w) { return max(a, w & 0x7fffffffu); }
    static __device__ __forceinline__ u32 acc_nansafe(u32 a, u32 w) {
        return max(a, ((w & 0x7fffffffu) + 0x7fffffu) & 0x7fffffffu);
    }
    static __device__ __forceinline__ u32 unkey(u32 x) { return max(x, 0x7fffffu) - 0x7fffffu; }
    static __device__ __forceinline__ u32 pair(u32 a, u32) { return a; }
    static __device__ __forceinline__ u32 merge(u32 x, u32 y) { return max(x, y); }
    static __device__ __forceinline__ u32 bits(u32 x, int) { return x; }
};

__device__ __forceinline__ void ng_words(const uint4& v, u32* w) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void ng_words(const uint2& v, u32* w) { w[0] = v.x; w[1] = v.y; }


// A quant block's scale from its amax bits, and for UE8M0 the factor that takes values to
// the fp8 range: inv = 2^-e for a finite scale 2^e (exact: e lies in [-22, 120]), 0 for an
// inf scale, so that x * inv is exactly what x / scale gives (finite x / inf = +-0,
// inf / inf = NaN) and no value needs a division.
template <bool UE8M0>
__device__ __forceinline__ void ng_block_scale(u32 amax_bits, float& scale, float& inv) {
    // max(amax, 1e-4f) on the bits (magnitudes order as integers; amax is never a NaN);
    // 0x38d1b717 is (float)1e-4, what torch.clamp(min=1e-4) compares with.
    const u32 a = max(amax_bits, 0x38d1b717u);
    const bool inf = a == 0x7f800000u;
    if (UE8M0) {
        // The smallest power of two >= a / 448 (rounded), from a's bits alone: 2^(E-8) while
        // a's significand is <= 1.75, else 2^(E-7) (checked for every a in [1e-4, FLT_MAX]).
        const u32 r = ng_pow2_above_div448(a);
        scale = __uint_as_float(inf ? a : r);
        inv = __uint_as_float(inf ? 0u : ng_pow2_inverse(r));
    } else {
        scale = inf ? __uint_as_float(a) : ng_div448(__uint_as_float(a));
        inv = __frcp_rn(scale);  // RN(1 / scale): 0 for an inf scale
    }
}

// x / scale for plain scales, given inv = RN(1 / scale) and rscale = scale (0 for an inf scale),
// without a division: q = x * inv is within an ulp of the quotient, and one Newton step through
// the exact fma residual rounds it correctly (Markstein) wherever the fp8 code can depend on it
// (quotients down to 2^-126; below, every candidate converts to the same signed zero). The
// residual 0 keeps q itself (an exact quotient, -0 included). An inf scale (rscale 0) leaves
// q = x * 0, as x / inf. Checked code for code against the IEEE quotient
// for every bf16 and fp16 x of every block a bf16 or fp16 amax allows.
__device__ __forceinline__ float ng_div_plain(float x, float rscale, float inv) {
    const float q = __fmul_rn(x, inv);
    const float e = ng_fma(-q, rscale, x);
    return e == 0.0f ? q : ng_fma(e, inv, q);
}

__device__ __forceinline__ void ng_block_scale(u32 amax_bits, int ue8m0, float& scale, float& inv) {
    if (ue8m0) {
        ng_block_scale<true>(amax_bits, scale, inv);
    } else {
        ng_block_scale<false>(amax_bits, scale, inv);
    }
}

__device__ __forceinline__ float ng_scaled(float x, float scale, float inv, int ue8m0) {
    return ue8m0 ? __fmul_rn(x, inv) : __fdiv_rn(x, scale);
}

// Stores of 4, 8 and 16 bytes. Inline PTX for the vector ones on the GPU: written as C, the
// compiler merges an aligned vector store and its unaligned fallback (same bytes, same
// addresses) into the fallback's 4-byte stores.
__device__ __forceinline__ void ng_st2(u8* dst, u32 a, u32 b) {
#ifdef __CUDA_ARCH__
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" : : "l"(dst), "r"(a), "r"(b) : "memory");
#else
    *reinterpret_cast<uint2*>(dst) = make_uint2(a, b);
#endif
}
__device__ __forceinline__ void ng_st4(u8* dst, u32 a, u32 b, u32 c, u32 d) {
#ifdef __CUDA_ARCH__
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" : : "l"(dst), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
#else
    uint4 v;
    v.x = a; v.y = b; v.z = c; v.w = d;
    *reinterpret_cast<uint4*>(dst) = v;
#endif
}

// N values (already scaled) as fp8 to dst: 4-byte aligned for N >= 4 (host-checked); aligned
// to N when `aligned` says so, else the widest stores its address allows.
template <int N> __device__ __forceinline__ void ng_store_fp8(u8* dst, const float* v, bool aligned);
template <> __device__ __forceinline__ void ng_store_fp8<16>(u8* dst, const float* v, bool aligned) {
    u32 b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) b[i] = ng_fp8e4m3x4_from_f32(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
    if (aligned || ((u64)dst & 15) == 0) {
        ng_st4(dst, b[0], b[1], b[2], b[3]);
    } else if (((u64)dst & 7) == 0) {
        ng_st2(dst, b[0], b[1]);
        ng_st2(dst + 8, b[2], b[3]);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) reinterpret_cast<u32*>(dst)[i] = b[i];
    }
}
template <> __device__ __forceinline__ void ng_store_fp8<8>(u8* dst, const float* v, bool aligned) {
    const u32 lo = ng_fp8e4m3x4_from_f32(v[0], v[1], v[2], v[3]);
    const u32 hi = ng_fp8e4m3x4_from_f32(v[4], v[5], v[6], v[7]);
    if (aligned || ((u64)dst & 7) == 0) {
        ng_st2(dst, lo, hi);
    } else {  // an 8-byte chunk at a 4-byte boundary (e.g. block_size 1, cache_stride 132)
        reinterpret_cast<u32*>(dst)[0] = lo;
        reinterpret_cast<u32*>(dst)[1] = hi;
    }
}
template <> __device__ __forceinline__ void ng_store_fp8<4>(u8* dst, const float* v, bool) {
    *reinterpret_cast<u32*>(dst) = ng_fp8e4m3x4_from_f32(v[0], v[1], v[2], v[3]);
}
template <> __device__ __forceinline__ void ng_store_fp8<2>(u8* dst, const float* v, bool) {
    *reinterpret_cast<unsigned short*>(dst) = (unsigned short)ng_fp8e4m3x2_from_f32(v[0], v[1]);
}

// A lane's fixed destinations: cache + this lane's offsets, so that a pass only adds its
// block and row.
struct PassOut {
    u8* vals;        // kv_cache + lane * ELEMS
    u8* scales;      // kv_cache + block_size * head_dim + 4 * quant block
    int nq4;         // scale bytes per token
    bool scale_lane; // writes its quant block's scale
    bool aligned;    // every ELEMS-byte store aligned to ELEMS
    bool reporter;   // reports bad slots (debug mode)
};

// The stores of a lane's passes. POW2: block_size is a power of two (a slot splits by shift
// and mask, any slot); UE8M0: power-of-two scales (values multiplied by 2^-e).
template <typename T, int NW, int ELEMS, int U, bool POW2, bool UE8M0>
__device__ __forceinline__ void ng_write_passes(const QuantParams& p, const PassOut& o, const u32 (&w)[U][NW],
                                                const i64 (&slot)[U], const u32 (&amax)[U],
                                                const FastDiv& block_size, u32 tok0, int tpp) {
    typedef Load<T> L;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const i64 s = slot[u];
        if ((u64)s >= (u64)p.num_slots) {  // padding or no token (s < 0), or past the cache
            if (s >= 0 && o.reporter) ng_report(p.error, NG_ERR_SLOT, tok0 + u * tpp, s, p.num_slots);
            continue;
        }
        i64 blk;
        int off;
        if (POW2) {
            blk = (i64)((u64)s >> block_size.shift);
            off = (int)s & (block_size.d - 1);
        } else {
            ng_split_slot(s, block_size, blk, off);
        }
        const i64 boff = blk * p.block_stride;
        float scale, inv;
        ng_block_scale<UE8M0>(amax[u], scale, inv);
        const float rscale = inv == 0.0f ? 0.0f : scale;  // plain scales: ng_div_plain's residual scale
        float v[ELEMS];
#pragma unroll
        for (int i = 0; i < NW; ++i) L::unpack(w[u][i], &v[i * L::PER_WORD]);
#pragma unroll
        for (int e = 0; e < ELEMS; ++e) v[e] = UE8M0 ? __fmul_rn(v[e], inv) : ng_div_plain(v[e], rscale, inv);
        ng_store_fp8<ELEMS>(o.vals + boff + off * p.head_dim, v, o.aligned);
        if (o.scale_lane) *reinterpret_cast<float*>(o.scales + boff + (i64)off * o.nq4) = scale;
    }
}

// The amax bits of each pass's quant block, in every lane of it: the lane's keys, xor shuffles
// inside its group of lanes, then, only when the quant block is wider than a group,
// shared-memory atomicMax across the groups. NANSAFE: NaNs left out (else a NaN's key wins).
template <typename T, int NW, int U, bool NANSAFE>
__device__ __forceinline__ void ng_pass_amax(const u32 (&w)[U][NW], int group, int qlanes, const FastDiv& qdiv,
                                             u32 (&s_amax)[U][NG_THREADS], u32 (&amax)[U]) {
    typedef Load<T> L;
    enum { NK = (U + L::KEYS - 1) / L::KEYS };
    u32 key[NK];
#pragma unroll
    for (int k = 0; k < NK; ++k) {
        u32 acc[2] = {0u, 0u};
#pragma unroll
        for (int j = 0; j < L::KEYS; ++j) {
            if (k * L::KEYS + j < U) {
#pragma unroll
                for (int i = 0; i < NW; ++i) {
                    acc[j] = NANSAFE ? L::acc_nansafe(acc[j], w[k * L::KEYS + j][i]) : L::acc(acc[j], w[k * L::KEYS + j][i]);
                }
            }
        }
        key[k] = L::pair(acc[0], acc[1]);
    }
    for (int off = 1; off < group; off <<= 1) {
#pragma unroll
        for (int k = 0; k < NK; ++k) key[k] = L::merge(key[k], __shfl_xor_sync(0xffffffffu, key[k], off));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const u32 x = key[u / L::KEYS];
        amax[u] = L::bits(NANSAFE ? L::unkey(x) : x, u % L::KEYS);
    }
    if (group < qlanes) {  // quant block wider than a group (uniform: depends on params only)
        const int tid = threadIdx.x;
        const int g = qdiv(tid);  // (token, quant block) within the pass
#pragma unroll
        for (int u = 0; u < U; ++u) s_amax[u][tid] = 0u;
        __syncthreads();
        if ((tid & (group - 1)) == 0) {
#pragma unroll
            for (int u = 0; u < U; ++u) atomicMax(&s_amax[u][g], amax[u]);
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < U; ++u) amax[u] = s_amax[u][g];
    }
}

// The vector kernels' body for NV vectors (VB bytes each, adjacent) per lane, UNROLL tokens
// per lane; see the top.
template <typename T, int VB, int NV, int UNROLL>
__device__ __forceinline__ void quant_vec_impl(const QuantParams& p) {
    typedef typename Vec<VB>::T V;
    typedef Load<T> L;
    enum {
        NW = NV * VB / 4,           // words of k per lane and pass
        ELEMS = NV * VB / T::SIZE,  // elements per lane and pass
        U = UNROLL / NV,            // passes: UNROLL * tokens_per_pass tokens per block for any NV
    };
    __shared__ u32 s_amax[U][NG_THREADS];

    const int tid = threadIdx.x;
    const int tpp = p.tokens_per_pass * NV;         // tokens per pass (NV = 2 only when exact)
    const int lanes = (u32)p.head_dim / ELEMS;      // lanes per token, <= NG_THREADS (host-checked)
    // Token within the pass (NV = 2 only with a power-of-two lane count: a shift).
    const int lt = NV == 2 ? tid >> (__ffs(lanes) - 1) : FastDiv(lanes)(tid);
    const int c = tid - lt * lanes;                 // owns elements [c * ELEMS, (c + 1) * ELEMS)
    const int qlanes = (u32)p.quant_block_size / ELEMS;  // lanes per quant block (ELEMS divides it)
    const int group = min(32, qlanes & -qlanes);    // lanes combined by shuffles; aligned, within a warp
    const FastDiv qdiv(qlanes);
    // Token of pass u: tok0 + u * tpp; 32 bits suffice, the grid ends within U * tpp tokens
    // of num_tokens < 2^31.
    const u32 tok0 = (u32)blockIdx.x * (u32)(U * tpp) + (u32)lt;
    const bool live = lt < tpp;

    u32 w[U][NW];
    i64 slot[U];
    {
        const u8* kp = p.k + (i64)tok0 * p.k_row_stride + c * (NV * VB);
        const i64 kstep = (i64)tpp * p.k_row_stride;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const u32 tok = tok0 + u * tpp;
            slot[u] = -1;
#pragma unroll
            for (int i = 0; i < NW; ++i) w[u][i] = 0u;
            if (live && tok < (u32)p.num_tokens) {
                slot[u] = __ldg(p.slot_mapping + tok);
#pragma unroll
                for (int j = 0; j < NV; ++j) {
                    ng_words(__ldg(reinterpret_cast<const V*>(kp + u * kstep) + j), &w[u][j * (VB / 4)]);
                }
            }
        }
    }

    // Every thread takes part in the reductions (full-warp shuffles, block barriers).
    u32 amax[U];
    ng_pass_amax<T, NW, U, false>(w, group, qlanes, qdiv, s_amax, amax);
    // NaNs are left out of amax (vLLM's fmaxf): the rare quant block that met one makes its warp
    // (its block, when the reduction crossed warps) reduce again with NaN-safe keys.
    bool nan = false;
#pragma unroll
    for (int u = 0; u < U; ++u) nan |= amax[u] > 0x7f800000u;
    if (group < qlanes ? __syncthreads_or(nan) != 0 : __ballot_sync(0xffffffffu, nan) != 0u) {
        ng_pass_amax<T, NW, U, true>(w, group, qlanes, qdiv, s_amax, amax);
    }

    const int q = qdiv(c);
    const PassOut o = {
        p.kv_cache + c * ELEMS,                                     // + row: this lane's fp8 bytes
        p.kv_cache + (i64)p.block_size * p.head_dim + 4 * q,        // + block: this lane's scale column
        4 * qdiv(lanes),                                            // scale bytes per token
        c == q * qlanes,                                            // first lane of its quant block
        // Every lane's ELEMS bytes aligned to ELEMS: ELEMS divides head_dim, so base and stride decide.
        (((u64)p.kv_cache | (u64)p.block_stride) & (ELEMS - 1)) == 0,
        c == 0,
    };
    // The uniform choices made once, not in every pass.
    // (Plain scales: the divisions dwarf a per-pass branch on the block size.)
    const FastDiv block_size(p.block_size);
    if (!p.ue8m0) {
        ng_write_passes<T, NW, ELEMS, U, false, false>(p, o, w, slot, amax, block_size, tok0, tpp);
    } else if (block_size.shift >= 0) {
        ng_write_passes<T, NW, ELEMS, U, true, true>(p, o, w, slot, amax, block_size, tok0, tpp);
    } else {
        ng_write_passes<T, NW, ELEMS, U, false, true>(p, o, w, slot, amax, block_size, tok0, tpp);
    }
}

// Two adjacent vectors per lane halve the per-lane work that does not depend on the element
// count (slot split, addresses, scale, shuffles), and give 16-byte stores for 2-byte types.
// Taken when it keeps the host's layout: a power-of-two lane count (so tokens per pass
// exactly doubles: the same tokens per block) and quant blocks of an even number of vectors.
template <typename T, int VB, int UNROLL>
__device__ __forceinline__ void quant_vec(const QuantParams& p) {
    if constexpr (UNROLL % 2 == 0) {  // else U = UNROLL / 2 would not be whole
        const u32 lanes = (u32)p.head_dim / (VB / T::SIZE), qlanes = (u32)p.quant_block_size / (VB / T::SIZE);
        if (lanes >= 2 && (lanes & (lanes - 1)) == 0 && qlanes % 2 == 0) {
            quant_vec_impl<T, VB, 2, UNROLL>(p);
            return;
        }
    }
    quant_vec_impl<T, VB, 1, UNROLL>(p);
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
    for (int e = 0; e < qbs; ++e) {
        const u32 m = __float_as_uint(Load<T>::one(src + e * T::SIZE)) & 0x7fffffffu;
        if (m <= 0x7f800000u) amax = max(amax, m);  // NaNs left out
    }
    i64 blk;
    int off;
    ng_split_slot(s, FastDiv(p.block_size), blk, off);
    u8* base = p.kv_cache + blk * p.block_stride;
    float scale, inv;
    ng_block_scale(amax, p.ue8m0, scale, inv);
    u8* dst = base + (i64)off * p.head_dim + (i64)q * qbs;
    for (int e = 0; e < qbs; ++e) {
        dst[e] = (u8)ng_fp8e4m3x2_from_f32(ng_scaled(Load<T>::one(src + e * T::SIZE), scale, inv, p.ue8m0), 0.f);
    }
    *reinterpret_cast<float*>(base + (i64)p.block_size * p.head_dim + ((i64)off * nq + q) * 4) = scale;
}

// Entry points: none here. Each module's spec (nvrtc_gather/kernels/indexer_k_quant.py) names
// its entry points and the body each runs (quant_vec<Bf16, 16, 4>, quant_any<F32>, ...); the JIT
// appends one extern "C" wrapper per entry (jit/spec.py), so a module holds only its own.
