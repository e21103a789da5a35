// Finding the request that owns a destination row, shared by the gathers: requests own
// consecutive row ranges given by a non-decreasing int32 array of start rows (cu_seq_lens,
// workspace_starts). ceil(log32(batch)) dependent loads per search instead of a scan over
// every request.
#pragma once
#include "common.cuh"

// Largest r in [0, batch) with starts[r] <= row, assuming starts is non-decreasing
// (with malformed starts the answer is still in range; callers re-check it).
// All 32 lanes of the warp must call it with the same row. No sum exceeds batch, so no
// batch up to INT32_MAX overflows.
__device__ __forceinline__ int warp_find_request(const i32* starts, int batch, int row) {
    const int lane = threadIdx.x & 31;
    int lo = 0, hi = batch;  // answer in [lo, hi)
    while (hi - lo > 1) {
        const int step = (int)(((u32)(hi - lo) + 31u) >> 5);
        const int off = lane * step;  // <= 31 * step < 2^31
        const bool le = off < hi - lo && __ldg(starts + lo + off) <= row;
        const u32 m = __ballot_sync(0xffffffffu, le);
        const int k = m ? 31 - __clz(m) : 0;
        lo += k * step;
        hi = lo + min(hi - lo, step);
    }
    return lo;
}


// The request of ``row`` among [lo, hi), the range the warp search gave for the rows of a
// tile: the largest r there with starts[r] <= row (lo if none). One thread per row; those
// entries are in L1 after the search. Callers check starts[r] <= row < their stop.
__device__ __forceinline__ int narrow_request(const i32* starts, int lo, int hi, int row) {
    while (hi - lo > 1) {
        const int mid = (int)(((u32)lo + (u32)hi) >> 1);
        if (__ldg(starts + mid) <= row) lo = mid; else hi = mid;
    }
    return lo;
}


// Small calls' search, one warp per row: the row's request. With at most 32 requests, also a
// window of block_table, loaded alongside: the first W = 2^wlog columns of every request, W =
// 32 / batch rounded down to a power of two (lane L holds request L >> wlog's column L & (W - 1),
// or -1). Its loads are issued here (ng_ldg_now: not where they are used) and the search is one
// ballot (warp_find_request's loop costs a branch per level). More requests: warp_find_request
// and wlog = -1 (no window).
__device__ __forceinline__ int warp_find_request_windowed(const i32* starts, int batch, int row, const i32* block_table,
                                                          i64 bt_row_stride, int max_blocks, int& wlog, int& window) {
    const int lane = threadIdx.x & 31;
    wlog = batch <= 32 ? 5 - (32 - __clz(batch - 1)) : -1;
    window = -1;
    if (wlog < 0) return warp_find_request(starts, batch, row);
    const int k = lane >> wlog, c = lane & ((1 << wlog) - 1);
    if (k < batch && c < max_blocks) window = ng_ldg_now(block_table + (i64)k * bt_row_stride + c);
    const u32 m = __ballot_sync(0xffffffffu, lane < batch && __ldg(starts + lane) <= row);
    return m ? 31 - __clz(m) : 0;  // as warp_find_request: the last start <= row, else 0
}

// Request r's block_table entry of column j from the window (every lane calls it, with the
// same r and j; the value means something only where wlog >= 0 and j < 2^wlog).
__device__ __forceinline__ int window_entry(int window, int wlog, int r, u32 j) {
    return __shfl_sync(0xffffffffu, window, (int)((((u32)r << (wlog & 31)) | j) & 31u));
}

