// cp_gather_cache and gather_and_maybe_dequant_cache: each request's cache entries from the
// paged cache into contiguous destination rows, copied byte for byte or dequantized from fp8
// (contract: docs/contract.md section 6).
//
// Request r (r < batch) owns dst rows [cu[r], cu[r + 1]) below num_rows; row t of it holds the
// request's entry at position seq_starts[r] + (t - cu[r]) (seq_starts null: 0), slot p %
// block_size of block block_table[r][p / block_size]. Rows no request owns are never touched.
// FP8 = 0: the entry's bytes as they are; 1 / 2: each byte an fp8 e4m3fn / e5m2 code, written
// as out(fp32(code) * scale), one fp32 multiply, then nearest even into OUT = 1 bf16, 2 fp16,
// 3 fp32 (vLLM's scaled_convert: fp8 -> half -> float, times the scale, to the output type),
// NaN as the GPU's canonical NaN.
//
// Work split (as gather_indexer_k.cu): block b owns dst rows [b * R, b * R + R), R =
// rows_per_cta <= NG_THREADS, so the grid follows the rows, not the requests.
//  1. Two warps find the requests of the first and last of those rows (request_search.cuh).
//  2. One thread per row narrows to its own request in that range, checks every index, and
//     parks the row's (block, slot) in shared memory (block -1: skip the row).
//  3. All threads move the rows: VEC-byte loads, UNROLL in flight per thread, each load's
//     converted VEC * out-size bytes written in SVEC-byte stores. A thread's (row, column)
//     advances by a constant step, so only its first needs a division.
// Small calls (at most two rows per warp of the GPU's SMs, the host's choice) run
// cache_gather_tiny instead: one warp per row and no barrier (see there).
// Index values are untrusted: any int32 in cu_seq_lens, seq_starts and block_table leaves
// every access in bounds; rows whose indices are bad are skipped, and reported in debug mode.
#include "cache_gather_params.cuh"
#include "half_bits.cuh"
#include "request_search.cuh"

// Debug mode only: cu_seq_lens as a whole (non-negative, non-decreasing), by one block.
__device__ __forceinline__ void check_cu_order(const CacheGatherParams& p) {
    for (u32 r = threadIdx.x; r <= (u32)p.batch; r += NG_THREADS) {
        const int a = __ldg(p.cu_seq_lens + r);
        if (a < 0) {
            ng_report(p.error, NG_ERR_CU_NEGATIVE, r, a, 0);
        } else if (r > 0) {
            const int before = __ldg(p.cu_seq_lens + r - 1);
            if (a < before) ng_report(p.error, NG_ERR_CU_DECREASING, r - 1, before, a);
        }
    }
}

__device__ __forceinline__ void ng_words(const uint4& v, u32* w) { w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w; }
__device__ __forceinline__ void ng_words(const uint2& v, u32* w) { w[0] = v.x; w[1] = v.y; }
__device__ __forceinline__ void ng_words(const u32& v, u32* w) { w[0] = v; }

// Two fp8 codes (bits 0-7 and 8-15 of c) -> fp32, exact.
template <int FP8>
__device__ __forceinline__ void decode2(u32 c, float& lo, float& hi) {
    if constexpr (FP8 == 1) {
        ng_float2_from_fp8e4m3x2(c, lo, hi);
    } else {  // e5m2 is the upper byte of an fp16
        lo = ng_half_to_float((unsigned short)((c & 0xffu) << 8));
        hi = ng_half_to_float((unsigned short)(c & 0xff00u));
    }
}

__device__ __forceinline__ u32 ng_f32_canonical(float x) {
    const u32 b = __float_as_uint(x);
    return (b & 0x7fffffffu) > 0x7f800000u ? 0x7fffffffu : b;
}

// One word of 4 codes -> its converted words (2 of 16-bit pairs, or 4 of fp32), low code first.
template <int FP8, int OUT>
__device__ __forceinline__ void convert4(u32 w, float scale, u32* o) {
    float a, b, c, d;
    decode2<FP8>(w & 0xffffu, a, b);
    decode2<FP8>(w >> 16, c, d);
    a = __fmul_rn(a, scale); b = __fmul_rn(b, scale); c = __fmul_rn(c, scale); d = __fmul_rn(d, scale);
    if constexpr (OUT == 1) {
        o[0] = ng_bf16x2_from_float(a, b);
        o[1] = ng_bf16x2_from_float(c, d);
    } else if constexpr (OUT == 2) {
        o[0] = ng_half_from_float(a) | (ng_half_from_float(b) << 16);
        o[1] = ng_half_from_float(c) | (ng_half_from_float(d) << 16);
    } else {
        o[0] = ng_f32_canonical(a); o[1] = ng_f32_canonical(b);
        o[2] = ng_f32_canonical(c); o[3] = ng_f32_canonical(d);
    }
}

// NW words to dst in SVEC-byte stores (dst is SVEC-aligned).
template <int NW, int SVEC>
__device__ __forceinline__ void store_words(u8* dst, const u32* w) {
#pragma unroll
    for (int i = 0; i < NW; i += SVEC / 4) {
        if constexpr (SVEC == 16) {
            uint4 v;
            v.x = w[i]; v.y = w[i + 1]; v.z = w[i + 2]; v.w = w[i + 3];
            reinterpret_cast<uint4*>(dst)[i / 4] = v;
        } else if constexpr (SVEC == 8) {
            uint2 v;
            v.x = w[i]; v.y = w[i + 1];
            reinterpret_cast<uint2*>(dst)[i / 2] = v;
        } else {
            reinterpret_cast<u32*>(dst)[i] = w[i];
        }
    }
}

// Output bytes per source byte: 1 for a copy, 2 for bf16 / fp16, 4 for fp32.
__device__ constexpr int out_size(int out) { return out == 0 ? 1 : (out == 3 ? 4 : 2); }

// One VEC-byte load of the source (v) to dst (SVEC-aligned): copied, or converted from fp8
// (VEC * OSZ bytes, OSZ output bytes per code).
template <int VEC, int FP8, int OUT, int SVEC, typename V>
__device__ __forceinline__ void put_vec(u8* dst, const V& v, float scale) {
    constexpr int OSZ = out_size(OUT);
    u32 w[VEC / 4], o[VEC * OSZ / 4];
    ng_words(v, w);
    if constexpr (FP8 == 0) {
#pragma unroll
        for (int i = 0; i < VEC / 4; ++i) o[i] = w[i];
    } else {
#pragma unroll
        for (int i = 0; i < VEC / 4; ++i) convert4<FP8, OUT>(w[i], scale, o + i * OSZ);
    }
    store_words<VEC * OSZ / 4, SVEC>(dst, o);
}

// The (block, slot) a row reads, or block -1: a row no request owns (untouched) or one whose
// indices are bad (skipped; reported in debug mode). r: the row's request by the search.
__device__ __forceinline__ int2 locate_row(const CacheGatherParams& p, int row, int r) {
    const int start = __ldg(p.cu_seq_lens + r);
    const int stop = __ldg(p.cu_seq_lens + r + 1);
    if (!(start <= row && row < stop)) return make_int2(-1, 0);  // before cu[0], or cu out of order
    if (start < 0) {
        ng_report(p.error, NG_ERR_CU_NEGATIVE, r, start, 0);
        return make_int2(-1, 0);
    }
    const int first = p.seq_starts ? __ldg(p.seq_starts + r) : 0;
    if (first < 0) {
        ng_report(p.error, NG_ERR_SEQ_START, r, first, 0);
        return make_int2(-1, 0);
    }
    const u32 pos = (u32)first + (u32)(row - start);  // < 2^32: both terms < 2^31
    const u32 j = pos / (u32)p.block_size;
    if (j >= (u32)p.max_blocks) {
        ng_report(p.error, NG_ERR_BLOCK_INDEX, row, r, j);
        return make_int2(-1, 0);
    }
    const int b = __ldg(p.block_table + (i64)r * p.bt_row_stride + j);
    if (b < 0 || b >= p.num_blocks) {
        ng_report(p.error, NG_ERR_BLOCK_ID, row, r, b);
        return make_int2(-1, 0);
    }
    return make_int2(b, (int)(pos - j * (u32)p.block_size));
}

template <int VEC, int FP8, int OUT, int UNROLL, int SVEC>
__device__ __forceinline__ void cache_gather_body(const CacheGatherParams& p) {
    typedef typename Vec<VEC>::T V;
    constexpr int OSZ = out_size(OUT);
    __shared__ int2 s_loc[NG_THREADS];  // (block id, slot) of each row; block -1 = skip
    __shared__ int s_req[2];            // requests of the block's first and last rows

    const int tid = threadIdx.x;
    const i32* cu = p.cu_seq_lens;
    const int row0 = blockIdx.x * p.rows_per_cta;  // < num_rows + NG_THREADS <= INT32_MAX (host)
    const int n = min(p.rows_per_cta, p.num_rows - row0);
    if (p.error != 0 && blockIdx.x == 0) check_cu_order(p);

    if (tid < 64) {
        const int r = warp_find_request(cu, p.batch, tid < 32 ? row0 : row0 + n - 1);
        if ((tid & 31) == 0) s_req[tid >> 5] = r;
    }
    const float scale = FP8 ? __ldg(p.scale) : 1.0f;  // issued before the barrier: overlaps the search
    __syncthreads();

    if (tid < n) {
        const int row = row0 + tid;
        s_loc[tid] = locate_row(p, row, narrow_request(cu, s_req[0], s_req[1] + 1, row));
    }
    __syncthreads();

    // Load i of the block is row i / vpr, column i % vpr; this thread's loads are tid +
    // k * NG_THREADS, so its (row, column) steps by (NG_THREADS / vpr, NG_THREADS % vpr).
    const int vpr = p.row_vecs;
    const int nvec = n * vpr;  // <= max(16 KiB, one entry) / VEC (host)
    const int step_t = NG_THREADS / vpr, step_c = NG_THREADS - step_t * vpr;
    int t = tid / vpr, c = tid - t * vpr;
    for (int base = tid; base < nvec; base += NG_THREADS * UNROLL) {
        V v[UNROLL];
        i64 dst[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            dst[u] = -1;
            if (base + u * NG_THREADS < nvec) {
                const int2 loc = s_loc[t];
                if (loc.x >= 0) {
                    const u8* src = p.src_cache + (i64)loc.x * p.block_stride + (i64)loc.y * p.entry_stride;
                    v[u] = __ldg(reinterpret_cast<const V*>(src) + c);
                    dst[u] = (i64)(row0 + t) * p.dst_row_stride + (i64)c * (VEC * OSZ);
                }
            }
            t += step_t;
            c += step_c;
            if (c >= vpr) { c -= vpr; ++t; }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (dst[u] >= 0) put_vec<VEC, FP8, OUT, SVEC>(p.dst + dst[u], v[u], scale);
        }
    }
}

// Small calls, where latency is all there is: one warp per row, NG_THREADS / 32 rows per
// block, no shared memory and no barrier. With at most 32 requests, the lanes load alongside
// the search of cu_seq_lens (one ballot) each request's first position (seq_starts) and a
// window of block_table: the first W columns of every request, W = 32 / batch rounded down to
// a power of two (lane L: request L / W, column L % W). A row whose column lies inside the
// window takes its block id by shuffle, so its bytes are two dependent DRAM trips away
// (indices, then data) instead of four (search, seq_starts, block_table, data); outside it,
// three. Each lane issues all its loads of the row (up to UNROLL) before any store.
// The checks and reports are locate_row's; taken branches between the trips cost more than
// straight-line arithmetic, so they are folded into one.
template <int VEC, int FP8, int OUT, int UNROLL, int SVEC>
__device__ __forceinline__ void cache_gather_tiny(const CacheGatherParams& p) {
    typedef typename Vec<VEC>::T V;
    constexpr int OSZ = out_size(OUT);
    if (p.error != 0 && blockIdx.x == 0) check_cu_order(p);
    const int lane = threadIdx.x & 31;
    const u32 urow = blockIdx.x * (NG_THREADS / 32) + (threadIdx.x >> 5);
    if (urow >= (u32)p.num_rows) return;  // the whole warp; unsigned: the grid may pass INT32_MAX
    const int row = (int)urow;
    const i32* cu = p.cu_seq_lens;
    const float scale = FP8 ? __ldg(p.scale) : 1.0f;
    // At most 32 requests: lane L loads request L's seq_starts with the search (ng_ldg_now:
    // issued here, not where it is used).
    int first = 0;
    if (p.seq_starts && p.batch <= 32 && lane < p.batch) first = ng_ldg_now(p.seq_starts + lane);
    int wlog, window;  // wlog = log2(W), -1 without a window (more than 32 requests)
    const int r = warp_find_request_windowed(cu, p.batch, row, p.block_table, p.bt_row_stride, p.max_blocks, wlog, window);
    if (wlog >= 0) {
        first = __shfl_sync(0xffffffffu, first, r);
    } else if (p.seq_starts) {
        first = __ldg(p.seq_starts + r);
    }
    const int start = __ldg(cu + r);  // in L1: the search just loaded this line
    const int stop = __ldg(cu + r + 1);
    const u32 pos = (u32)first + ((u32)row - (u32)start);  // exact where checked (0 <= start <= row, first >= 0)
    const u32 j = pos / (u32)p.block_size;
    const bool owned = start <= row && row < stop;
    const bool valid = owned && start >= 0 && first >= 0 && j < (u32)p.max_blocks;
    const bool in_window = wlog >= 0 && j < (1u << wlog);
    // Every lane shuffles (the warp has one row: uniform); the value is only used inside the window.
    int b = window_entry(window, wlog, r, j);
    if (!in_window && valid) b = __ldg(p.block_table + (i64)r * p.bt_row_stride + j);
    if (!(valid && b >= 0 && b < p.num_blocks)) {  // skip the row; say why in debug mode
        if (lane == 0 && owned) {
            if (start < 0) {
                ng_report(p.error, NG_ERR_CU_NEGATIVE, r, start, 0);
            } else if (first < 0) {
                ng_report(p.error, NG_ERR_SEQ_START, r, first, 0);
            } else if (j >= (u32)p.max_blocks) {
                ng_report(p.error, NG_ERR_BLOCK_INDEX, row, r, j);
            } else {
                ng_report(p.error, NG_ERR_BLOCK_ID, row, r, b);
            }
        }
        return;
    }
    const V* src = reinterpret_cast<const V*>(p.src_cache + (i64)b * p.block_stride +
                                              (i64)(pos - j * (u32)p.block_size) * p.entry_stride);
    u8* dst = p.dst + (i64)row * p.dst_row_stride;
    const int vpr = p.row_vecs;
    for (int c0 = lane; c0 < vpr; c0 += 32 * UNROLL) {
        V v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (c0 + 32 * u < vpr) v[u] = __ldg(src + c0 + 32 * u);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (c0 + 32 * u < vpr) put_vec<VEC, FP8, OUT, SVEC>(dst + (i64)(c0 + 32 * u) * (VEC * OSZ), v[u], scale);
        }
    }
}

// Entry points: none here (nvrtc_gather/kernels/cache_gather.py names them; the JIT appends them).
