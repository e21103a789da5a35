// cp_gather_indexer_k_quant_cache: copy each request's tokens out of the paged
// fp8 indexer cache into contiguous rows (contract: docs/contract.md section 1).
//
// Work split: block b owns destination rows [b*T, b*T + T), T = tokens_per_cta.
//  1. Two warps find the requests owning the first and last of those rows by a
//     32-ary search of cu_seq_lens (ceil(log32(batch)) dependent loads instead
//     of vLLM's scan over every request). For a single request, each row's
//     block_table entry is fetched meanwhile.
//  2. One thread per row narrows to its own request inside that small range
//     (those cu_seq_lens lines are in L1 by then), checks every index, and
//     parks the row's (block, token) in shared memory (block -1 = skip the row).
//  3. All threads copy the fp8 bytes (KVEC-byte vectors, UNROLL loads in flight
//     per thread) and the 4-byte scale words.
// Two shapes, chosen by the host (nvrtc_gather/ops/gather.py: tokens_per_cta): 16 KiB of
// fp8 values per block with 4 loads in flight per thread, or, for a call whose 16 KiB
// blocks would fill 3/4 to 1 wave, 32 KiB per block with 8 in flight ("wide" entry
// points): half the blocks, each issuing all its loads at once. Tiny calls run a third
// kernel, gather_tiny below.
// Rows at or past cu_seq_lens[-1] are never touched; rows whose indices are bad
// are skipped, and reported when debug mode passes an error buffer.
// Index values are untrusted: any int32 in cu_seq_lens and block_table must leave every
// access in bounds. A row's position in its request, row - cu_seq_lens[r] with
// cu_seq_lens[r] <= row, is taken in 32 unsigned bits (exact for any int32 cu_seq_lens[r]),
// so a huge position fails the max_blocks check instead of wrapping negative.
//
// Shared memory is kept to 2 KiB on purpose: the driver sizes the SM's shared-memory
// carve-out by it, and more costs small calls time.
#include "gather_params.cuh"
#include "request_search.cuh"

// x / d for any x < 2^32 (FastDiv takes x < 2^31).
__device__ __forceinline__ u32 udiv(const FastDiv& d, u32 x) {
    return d.shift >= 0 ? x >> d.shift : x / (u32)d.d;
}

// Debug mode only: cu_seq_lens as a whole (start, order, total), checked by one block.
__device__ __forceinline__ void check_cu_seq_lens(const GatherParams& p) {
    const i32* cu = p.cu_seq_lens;
    const int total = __ldg(cu + p.batch);
    if (threadIdx.x == 0 && __ldg(cu) != 0) ng_report(p.error, NG_ERR_CU_START, __ldg(cu), 0, 0);
    if (threadIdx.x == 0 && total > p.num_tokens) ng_report(p.error, NG_ERR_CU_TOTAL, total, p.num_tokens, 0);
    // Unsigned: r + NG_THREADS may pass INT32_MAX.
    for (u32 r = threadIdx.x; r < (u32)p.batch; r += NG_THREADS) {
        const int a = __ldg(cu + r), b = __ldg(cu + r + 1);
        if (b < a) ng_report(p.error, NG_ERR_CU_DECREASING, r, a, b);
    }
}

// Byte offsets in kv_cache of a (block, token)'s fp8 values and of its scales.
__device__ __forceinline__ i64 value_offset(const GatherParams& p, int2 loc) {
    return (i64)loc.x * p.block_stride + (i64)loc.y * p.head_dim;
}
__device__ __forceinline__ i64 scale_offset(const GatherParams& p, int2 loc) {
    return (i64)loc.x * p.block_stride + (i64)p.block_size * p.head_dim + (i64)loc.y * p.scale_words * 4;
}

template <int KVEC, int UNROLL>
__device__ __forceinline__ void gather_body(const GatherParams& p) {
    typedef typename Vec<KVEC>::T V;
    __shared__ int2 s_loc[NG_THREADS];  // (block id, token in block) of each row; block -1 = skip
    __shared__ int s_req[2];            // requests of the block's first and last rows
    __shared__ int s_total;             // cu_seq_lens[batch]

    const int tid = threadIdx.x;
    const i32* cu = p.cu_seq_lens;
    const int row0 = blockIdx.x * p.tokens_per_cta;
    // In debug mode the first block also checks cu_seq_lens as a whole.
    if (p.error != 0 && blockIdx.x == 0) check_cu_seq_lens(p);
    // Rows past cu_seq_lens[-1] fail the per-row check below (row < cu[r + 1] with r the
    // last request): nothing waits for the total before the first byte moves.
    // row0 + tokens_per_cta fits for num_tokens <= INT32_MAX - NG_THREADS, which the host
    // guarantees (ops/gather.py). Kept signed: the compiler may then assume it does.
    const int end = min(row0 + p.tokens_per_cta, p.num_tokens);
    const int n = end - row0;
    const FastDiv by_block(p.block_size), by_words(p.scale_words);

    // Everything up to the barrier is independent: one DRAM round trip per search level.
    if (tid < 64) {
        const int r = warp_find_request(cu, p.batch, tid < 32 ? row0 : end - 1);
        if ((tid & 31) == 0) s_req[tid >> 5] = r;
    } else if (tid == 64) {
        s_total = __ldg(cu + p.batch);
    }
    // One request: its rows start at 0 by contract, so each row's block_table entry can be
    // fetched now; it is used only once cu_seq_lens[0] == 0 is confirmed (then j0 is the row's
    // column j below, and j0 < max_blocks was checked here).
    int b0 = -1;
    if (p.batch == 1 && tid < n) {
        const u32 j0 = udiv(by_block, (u32)(row0 + tid));
        if (j0 < (u32)p.max_blocks) b0 = __ldg(p.block_table + j0);
    }
    __syncthreads();

    if (tid < n) {
        const int row = row0 + tid;
        const int r = narrow_request(cu, s_req[0], s_req[1] + 1, row);  // [lo, hi) empty if cu decreases
        const int start = __ldg(cu + r);
        const int stop = r + 1 == p.batch ? s_total : __ldg(cu + r + 1);
        int2 loc = make_int2(-1, 0);
        if (start <= row && row < stop) {
            const u32 pos = (u32)row - (u32)start;  // exact: start <= row
            const u32 j = udiv(by_block, pos);
            if (j < (u32)p.max_blocks) {
                const int b = p.batch == 1 && start == 0 ? b0 : __ldg(p.block_table + (i64)r * p.bt_row_stride + j);
                if (b >= 0 && b < p.num_blocks) {
                    loc = make_int2(b, (int)(pos - j * (u32)p.block_size));
                } else {
                    ng_report(p.error, NG_ERR_BLOCK_ID, row, r, b);
                }
            } else {
                ng_report(p.error, NG_ERR_BLOCK_INDEX, row, r, j);
            }
        } else if (row < s_total) {  // rows past the total are the untouched tail
            ng_report(p.error, NG_ERR_ROW_UNOWNED, row, r, 0);
        }
        s_loc[tid] = loc;
    }
    __syncthreads();

    // Scales first: this thread's first scale word is loaded before any store is issued,
    // so its DRAM round trip overlaps the fp8 loads instead of following them (the
    // compiler may not move a load above a store that could alias it).
    const int nwords = n * p.scale_words;
    u32 sw = 0;
    i64 sdst = -1;
    if (tid < nwords) {
        const int t = by_words(tid);
        const int w = tid - t * p.scale_words;
        const int2 loc = s_loc[t];
        if (loc.x >= 0) {
            sw = __ldg(reinterpret_cast<const u32*>(p.kv_cache + scale_offset(p, loc)) + w);
            sdst = (i64)(row0 + t) * p.dst_scale_row_stride + (i64)w * 4;
        }
    }

    // fp8 values: vector i of the block's rows is token i / vpt, column i % vpt.
    const int vpt = p.head_dim / KVEC;
    const FastDiv by_vpt(vpt);
    const int nvec = n * vpt;
    for (int base = tid; base < nvec; base += NG_THREADS * UNROLL) {
        V v[UNROLL];
        i64 dst[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int i = base + u * NG_THREADS;
            dst[u] = -1;
            if (i < nvec) {
                const int t = by_vpt(i);
                const int c = i - t * vpt;
                const int2 loc = s_loc[t];
                if (loc.x >= 0) {
                    v[u] = __ldg(reinterpret_cast<const V*>(p.kv_cache + value_offset(p, loc)) + c);
                    dst[u] = (i64)(row0 + t) * p.dst_k_row_stride + (i64)c * KVEC;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (dst[u] >= 0) *reinterpret_cast<V*>(p.dst_k + dst[u]) = v[u];
        }
    }

    if (sdst >= 0) *reinterpret_cast<u32*>(p.dst_scale + sdst) = sw;
    // The rest of the scale words (only when a block's tokens have more than NG_THREADS).
    for (int i = tid + NG_THREADS; i < nwords; i += NG_THREADS) {
        const int t = by_words(i);
        const int w = i - t * p.scale_words;
        const int2 loc = s_loc[t];
        if (loc.x >= 0) {
            const u32 x = __ldg(reinterpret_cast<const u32*>(p.kv_cache + scale_offset(p, loc)) + w);
            *(reinterpret_cast<u32*>(p.dst_scale + (i64)(row0 + t) * p.dst_scale_row_stride) + w) = x;
        }
    }
}

// Tiny calls (a few thousand rows at most: latency is all there is): one warp per row,
// NG_THREADS / 32 rows per block, no shared memory and no barrier. Each warp searches
// cu_seq_lens for its row (the total loaded alongside), then loads its block_table entry,
// then copies the row. With at most 32 requests (one search level), the lanes also load a
// window of block_table alongside the search: the first W columns of every request, W = 32
// / batch rounded down to a power of two (lane L: request L / W, column L % W). A row whose
// column is below W (with one request: below 32) takes its entry from a lane, so its bytes
// are two dependent DRAM round trips away instead of three.
// Between those trips every instruction is latency, and each taken branch measured more
// than straight-line arithmetic (benchmarks/NOTES.md, v13): the checks are folded into one
// branch, and the division by block_size is the plain one (straight-line) rather than
// FastDiv's shift-or-divide branch.
template <int KVEC>
__device__ __forceinline__ void gather_tiny(const GatherParams& p) {
    typedef typename Vec<KVEC>::T V;
    if (p.error != 0 && blockIdx.x == 0) check_cu_seq_lens(p);
    const int lane = threadIdx.x & 31;
    const u32 urow = blockIdx.x * (NG_THREADS / 32) + (threadIdx.x >> 5);
    if (urow >= (u32)p.num_tokens) return;  // the whole warp; unsigned: the grid may pass INT32_MAX
    const int row = (int)urow;
    const i32* cu = p.cu_seq_lens;
    const int total = __ldg(cu + p.batch);
    // At most 32 requests: the window (ng_ldg_now: issued here, not where it is used), and the
    // search's one level written out (warp_find_request's loop costs a branch per level).
    // wlog = log2(W), -1 without a window.
    const int wlog = p.batch <= 32 ? 5 - (32 - __clz(p.batch - 1)) : -1;
    int window = -1, r;
    if (wlog >= 0) {
        const int k = lane >> wlog, c = lane & ((1 << wlog) - 1);
        if (k < p.batch && c < p.max_blocks) window = ng_ldg_now(p.block_table + (i64)k * p.bt_row_stride + c);
        const u32 m = __ballot_sync(0xffffffffu, lane < p.batch && __ldg(cu + lane) <= row);
        r = m ? 31 - __clz(m) : 0;  // as warp_find_request: the last start <= row, else 0
    } else {
        r = warp_find_request(cu, p.batch, row);
    }
    const int start = __ldg(cu + r);  // in L1: the search just loaded this line
    const int stop = __ldg(cu + r + 1);
    const u32 pos = (u32)row - (u32)start;  // exact where owned (start <= row)
    const u32 j = pos / (u32)p.block_size;
    const bool owned = start <= row && row < stop;
    const bool in_table = j < (u32)p.max_blocks;
    const bool in_window = wlog >= 0 && j < (1u << wlog);
    // Every lane shuffles (the warp has one row, so this is uniform); the lane index is
    // only meaningful, and the value only used, inside the window.
    int b = __shfl_sync(0xffffffffu, window, (int)((((u32)r << (wlog & 31)) | j) & 31u));
    if (!in_window && owned && in_table) b = __ldg(p.block_table + (i64)r * p.bt_row_stride + j);
    if (!(owned && in_table && b >= 0 && b < p.num_blocks)) {  // skip the row; say why in debug mode
        if (lane == 0) {
            if (!owned) {
                if (row < total) ng_report(p.error, NG_ERR_ROW_UNOWNED, row, r, 0);  // past the total: untouched tail
            } else if (!in_table) {
                ng_report(p.error, NG_ERR_BLOCK_INDEX, row, r, j);
            } else {
                ng_report(p.error, NG_ERR_BLOCK_ID, row, r, b);
            }
        }
        return;
    }
    const int2 loc = make_int2(b, (int)(pos - j * (u32)p.block_size));
    const V* src = reinterpret_cast<const V*>(p.kv_cache + value_offset(p, loc));
    V* dst = reinterpret_cast<V*>(p.dst_k + (i64)row * p.dst_k_row_stride);
    const u32* ssrc = reinterpret_cast<const u32*>(p.kv_cache + scale_offset(p, loc));
    u32* sdst = reinterpret_cast<u32*>(p.dst_scale + (i64)row * p.dst_scale_row_stride);
    const int vpt = p.head_dim / KVEC;
    // The first vector and scale word are both loaded before either is stored (a load may
    // not move above a store that could alias it), so the two share one round trip.
    const bool has_v = lane < vpt, has_s = lane < p.scale_words;
    V v;
    u32 w = 0;
    if (has_v) v = __ldg(src + lane);
    if (has_s) w = __ldg(ssrc + lane);
    if (has_v) dst[lane] = v;
    if (has_s) sdst[lane] = w;
    for (int c = lane + 32; c < vpt; c += 32) dst[c] = __ldg(src + c);
    for (int c = lane + 32; c < p.scale_words; c += 32) sdst[c] = __ldg(ssrc + c);
}

// Entry points: none here. Each module's spec (nvrtc_gather/kernels/gather.py) names its
// entry points and the body each runs (gather_body<16, 4>, gather_tiny<8>, ...); the JIT
// appends one extern "C" wrapper per entry (jit/spec.py), so a module holds only its own.
