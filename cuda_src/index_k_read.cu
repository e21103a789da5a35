// The index-K read as SGLang calls it (GetKAndS; contract: docs/contract.md, "SGLang's
// index-K read"): each request's tokens out of the paged fp8 indexer cache into contiguous
// rows, from the request *lengths* (not prefix sums) and an int32 or int64 page table of any
// strides, in one launch. Rows past the lengths' sum and rows whose indices are bad are
// written as zeros, so the host allocates the outputs with torch.empty.
// Three bodies, the host's launch rule picking one a call: the row-major tiles described here
// (index_k_read_body), request-major tiles for 2 to NG_THREADS requests
// (index_k_read_by_request) and a warp a row for small calls (index_k_read_tiny).
//
// Row-major work split: block b owns destination rows [b*T, b*T + T), T = tokens_per_cta.
//  1. The block scans the lengths NG_THREADS at a time (one per thread, a block-wide prefix
//     sum), saturating at INT32_MAX (no row reaches it: the host keeps num_rows + NG_THREADS
//     <= INT32_MAX). Each of its rows that falls inside the chunk finds its request by a
//     binary search of the chunk's prefix sums in shared memory, between the requests of the
//     block's first and last rows (ballots beside the scan's barrier find both: where a block
//     spans one or two requests, one step instead of eight), checks its page and parks
//     (page, token in page) in shared memory (page -1: a zero row). The scan stops once
//     it has passed the block's last row: early blocks read few lengths. A block whose rows lie
//     past the first chunk of a batch of more than two chunks skips ahead (skip_chunks): it
//     sums 16 chunks of lengths a round trip, not one, and scans from its own chunk.
//  2. copy_tile (tile_copy.cuh) copies the values and scales, zeros for parked -1 rows.
// Page ids are fetched alongside the first lengths where the row's request can be guessed, so
// a small call's bytes are two DRAM round trips away instead of three: with one request each
// row's own column (its rows start at 0: no scan at all, outside debug mode); with up to
// WINDOW_REQS requests a window of the first W = NG_THREADS / 2^ceil(log2(batch)) columns of every
// request (thread t: request t / W, column t % W), kept in shared memory; a row past its window
// loads its page id after the scan.
// Index values are untrusted: a length that is negative or past INT32_MAX counts as 0 (and is
// reported in debug mode), a page id outside [0, num_pages) or a column past max_pages leaves
// the row zero; no value leads outside the cache or the page table.
#include "fixed_layout.cuh"
#include "index_k_read_params.cuh"
#include "tile_copy.cuh"

template <typename T>
__device__ __forceinline__ i64 load_index(const u8* base, i64 i) {
    return (i64)__ldg(reinterpret_cast<const T*>(base) + i);
}

// The same load issued here, in program order (not sunk past the scan's barriers: ng_ldg_now),
// as its own type: a caller converts it where it uses it. A conversion right after the load (an
// int32 id sign-extended to 64 bits) made ptxas wait for it there, before the next load was
// issued: the lengths' round trip then followed the page ids' instead of sharing it (sm_90 SASS;
// tests/jit/test_sass_order.py).
template <typename T> __device__ __forceinline__ T load_now(const u8* base, i64 i) {
    return ng_ldg_now(reinterpret_cast<const T*>(base) + i);
}

// Inclusive prefix sum over the block of each thread's v (<= INT32_MAX each), saturating at
// INT32_MAX; *total gets the block's saturated sum. Shuffles within warps, then the warp sums.
__device__ __forceinline__ u32 block_prefix_sat(u32 v, u32* s_warp, u32* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 cap = 0x7fffffffu;
    for (int d = 1; d < 32; d <<= 1) {
        const u32 y = (u32)__shfl_sync(0xffffffffu, (int)v, lane >= d ? lane - d : lane);
        if (lane >= d) v = min(v + y, cap);  // both <= cap: no wrap
    }
    if (lane == 31) s_warp[warp] = v;
    __syncthreads();
    u32 before = 0, all = 0;
    for (int w = 0; w < NG_THREADS / 32; ++w) {
        if (w < warp) before = min(before + s_warp[w], cap);
        all = min(all + s_warp[w], cap);
    }
    *total = all;
    return min(v + before, cap);
}

#define WINDOW_REQS 64  // W >= 4 columns

// A length as the kernel counts it, from its value x: 0 for a value that is negative or past int32.
__device__ __forceinline__ u32 length_value(i64 x) { return x >= 0 && x <= 0x7fffffff ? (u32)x : 0u; }

// Request r's length (length_value), a bad value reported in debug mode.
__device__ __forceinline__ u32 checked_length(const IndexKReadParams& p, u32 r, i64 x) {
    if (x >= 0 && x <= 0x7fffffff) return (u32)x;
    ng_report(p.error, NG_ERR_LENGTH, r, x, 0);
    return 0;
}

// Request r's length (checked_length), 0 past the batch. NOW: the load issued in program order.
template <typename LT, bool NOW>
__device__ __forceinline__ u32 length_of(const IndexKReadParams& p, u32 r) {
    if (r >= (u32)p.batch) return 0;
    const i64 x = NOW ? (i64)load_now<LT>(p.seq_lens, (i64)r * p.seq_lens_stride)
                      : load_index<LT>(p.seq_lens, (i64)r * p.seq_lens_stride);
    return checked_length(p, r, x);
}

// Chunks of NG_THREADS requests one pass of skip_chunks sums (one round trip a pass): 16 of int32
// lengths, 8 of int64 (16 registers of lengths a thread either way).
template <typename LT> struct SkipChunks { static constexpr int N = sizeof(LT) == 4 ? 16 : 8; };
static_assert(16 * (NG_THREADS / 32) + 16 + 1 <= NG_THREADS, "skip_chunks' words fit in s_inc");

// Where a block's chunk scan goes on after its first chunk: from chunk `from` (carry: the rows
// before it, at most row0, the block's first row), the last chunk whose requests start at or
// before row0 (its rows before it in carry), or batch when every request ends at or before row0.
// SkipChunks<LT>::N chunks a pass: thread t loads request t of each (coalesced), all before any
// is used, so a block far into a large batch waits one round trip a pass instead of one a chunk.
// Lengths count as the scan counts them (checked_length, without its reports: in debug mode block
// 0 scans every chunk itself). s: N * NG_THREADS / 32 + N + 1 words of shared memory the caller
// does not use meanwhile. Block-uniform; ends with a barrier.
template <typename LT>
__device__ __forceinline__ u32 skip_chunks(const IndexKReadParams& p, u32 row0, u32 from, u32* s, u32& carry) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 cap = 0x7fffffffu;
    constexpr int N = SkipChunks<LT>::N;
    u32* part = s;                           // [chunk][warp]: a warp's sum of its requests
    u32* start = s + N * (NG_THREADS / 32);  // [chunk]: rows before it; [N]: after them all
    for (u32 c0 = from; c0 < (u32)p.batch; c0 += N * NG_THREADS) {
        // Each length as 32-bit words (an int64's low and high word), and past the batch the last
        // length (ignored): unconditional 32-bit loads, all issued before any is used (with 64-bit
        // or predicated loads ptxas used each at once, a round trip a load: sm_90 SASS).
        u32 lo[N], hi[N];
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const i64 e = (i64)min(c0 + k * NG_THREADS + threadIdx.x, (u32)p.batch - 1) * p.seq_lens_stride;
            lo[k] = load_now<u32>(p.seq_lens, sizeof(LT) == 8 ? 2 * e : e);
            hi[k] = sizeof(LT) == 8 ? load_now<u32>(p.seq_lens, 2 * e + 1) : 0u;
        }
#pragma unroll
        for (int k = 0; k < N; ++k) {
            // checked_length's rule: a length outside [0, INT32_MAX] counts as 0
            u32 t = c0 + k * NG_THREADS + threadIdx.x < (u32)p.batch && hi[k] == 0u && lo[k] <= 0x7fffffffu ? lo[k] : 0u;
#pragma unroll
            for (int d = 16; d; d >>= 1) t = min(t + (u32)__shfl_xor_sync(0xffffffffu, (int)t, d), cap);
            if (lane == 0) part[k * (NG_THREADS / 32) + warp] = t;
        }
        __syncthreads();
        if (warp == 0) {  // lane k < N: chunk k's rows, then the chunks' starts by a prefix sum
            u32 t = 0;
            if (lane < N) {
#pragma unroll
                for (int w = 0; w < NG_THREADS / 32; ++w) t = min(t + part[lane * (NG_THREADS / 32) + w], cap);
            }
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const u32 y = (u32)__shfl_sync(0xffffffffu, (int)t, lane >= d ? lane - d : lane);
                if (lane >= d) t = min(t + y, cap);
            }
            if (lane < N) start[lane + 1] = min(carry + t, cap);
            if (lane == 0) start[0] = carry;
        }
        __syncthreads();
        const u32 past = c0 + N * NG_THREADS;  // the pass's end (may pass batch)
        if (start[N] <= row0 && past < (u32)p.batch) {  // row0 lies past the pass: on to the next
            carry = start[N];
            __syncthreads();  // start and part are rewritten by the next pass
            continue;
        }
        int k = N - 1;  // the last chunk of the pass that exists and starts at or before row0
        while (k > 0 && (c0 + (u32)k * NG_THREADS >= (u32)p.batch || start[k] > row0)) --k;
        const u32 at = start[k];
        const u32 found = start[N] <= row0 ? (u32)p.batch : c0 + (u32)k * NG_THREADS;
        carry = start[N] <= row0 ? start[N] : at;
        __syncthreads();
        return found;
    }
    return (u32)p.batch;
}

// The first NG_THREADS (or 32) lengths' values as loaded, 0 past the batch: issued before the
// page ids, and nothing waits for either until both are in flight.
template <typename LT>
__device__ __forceinline__ LT first_length(const IndexKReadParams& p, u32 r) {
    return r < (u32)p.batch ? load_now<LT>(p.seq_lens, (i64)r * p.seq_lens_stride) : (LT)0;
}

// A page id as the row's location needs it: the id where it is in [0, num_pages), else -1.
__device__ __forceinline__ int valid_page(i64 page, int num_pages) {
    return page >= 0 && page < num_pages ? (int)page : -1;
}

// The layout fields a body reads: the call's, or with FIXED the spec's fixed layout
// (fixed_layout.cuh; the host launches those entries for that layout only).
template <bool FIXED> struct ReadSizes : LayoutSizes<FIXED> {
    __device__ __forceinline__ explicit ReadSizes(const IndexKReadParams& p)
        : LayoutSizes<FIXED>(p.page_size, p.head_dim, p.scale_words) {}
};

template <int KVEC, int UNROLL, typename LT, typename PT, bool FIXED>
__device__ __forceinline__ void index_k_read_body(const IndexKReadParams& p) {
    const ReadSizes<FIXED> sz(p);
    __shared__ int2 s_loc[NG_THREADS];  // (page, token in page) of each row; page -1 = a zero row
    __shared__ u32 s_inc[NG_THREADS];   // the chunk's inclusive prefix sums (rows before included); skip_chunks' words
    __shared__ u32 s_warp[NG_THREADS / 32];
    __shared__ u32 s_bound[NG_THREADS / 32];  // per warp: its requests ending at or before row0 (low half), end - 1 (high)
    __shared__ int s_win[NG_THREADS];   // the window of page ids (valid_page), with <= WINDOW_REQS requests

    const int tid = threadIdx.x;
    const int tpc = (int)p.tokens_per_cta;
    const int row0 = (int)blockIdx.x * tpc;  // num_rows + NG_THREADS <= INT32_MAX (host)
    const int end = (int)min((i64)row0 + tpc, p.num_rows);
    const int n = end - row0;
    const int row = row0 + tid;  // this thread's row, where tid < n
    const FastDiv by_page(sz.page_size);
    // Debug mode: block 0 reads every length (and reports the bad ones and a short num_rows).
    const bool read_all = p.error != 0 && blockIdx.x == 0;
    if (tid < n) s_loc[tid] = make_int2(-1, 0);
    // One request outside debug mode: every thread reads its length (the rows are its positions).
    const bool one = p.batch == 1 && p.error == 0;
    // The first lengths, then the guesses (see the top), all issued before any is waited for.
    const LT len0 = first_length<LT>(p, one ? 0 : tid);
    int wlog = -1;  // log2(W), -1 without a window
    PT guess = -1;  // one request: this row's page id; a window: this thread's id in it
    if (p.batch == 1) {
        const u32 j0 = tid < n ? (u32)by_page(row) : 0xffffffffu;
        if (j0 < (u32)p.max_pages) guess = load_now<PT>(p.page_table, (i64)j0 * p.pt_col_stride);
    } else if (p.batch <= WINDOW_REQS) {
        wlog = __ffs(NG_THREADS) - 1 - (32 - __clz(p.batch - 1));  // NG_THREADS / 2^ceil(log2(batch))
        const int k = tid >> wlog, c = tid & ((1 << wlog) - 1);
        if (k < p.batch && c < p.max_pages)
            guess = load_now<PT>(p.page_table, (i64)k * p.pt_row_stride + (i64)c * p.pt_col_stride);
    }
    if (wlog >= 0) s_win[tid] = valid_page((i64)guess, p.num_pages);  // -1 where nothing was loaded

    if (one) {  // rows [0, length) are the request's positions 0, 1, ...; the ids were guessed for them
        if (tid < n && (u32)row < checked_length(p, 0, (i64)len0)) {
            const u32 j = (u32)by_page(row);
            if (j < (u32)p.max_pages && (i64)guess >= 0 && (i64)guess < p.num_pages)
                s_loc[tid] = make_int2((int)guess, (int)((u32)row - j * (u32)sz.page_size));
        }
    } else {
        u32 carry = 0;  // rows of the requests before the chunk, saturated
        for (u32 c0 = 0; c0 < (u32)p.batch;) {
            const u32 r = c0 + tid;
            // len0: 0 past the batch
            const u32 len = c0 ? length_of<LT, false>(p, r) : checked_length(p, r, (i64)len0);
            u32 chunk;
            const u32 inc = min(block_prefix_sat(len, s_warp, &chunk) + carry, 0x7fffffffu);
            s_inc[tid] = inc;
            const u32 stop = min(carry + chunk, 0x7fffffffu);
            // The requests of the block's first and last rows bound every row's search: the
            // chunk's requests ending at or before each (s_inc is non-decreasing), counted by warp.
            const u32 below_first = __popc(__ballot_sync(0xffffffffu, inc <= (u32)row0));
            const u32 below_last = __popc(__ballot_sync(0xffffffffu, inc <= (u32)end - 1));
            if ((tid & 31) == 0) s_bound[tid >> 5] = below_first | below_last << 16;
            __syncthreads();
            if (tid < n && (u32)row >= carry && (u32)row < stop) {
                // The first k of the chunk with s_inc[k] > row: the row's request, between the
                // first and the last row's (the chunk's last request has s_inc = stop > row).
                u32 bounds = 0;
#pragma unroll
                for (int w = 0; w < NG_THREADS / 32; ++w) bounds += s_bound[w];
                int lo = (int)(bounds & 0xffffu);
                int hi = (int)min(bounds >> 16, min((u32)NG_THREADS, (u32)p.batch - c0) - 1);
                while (lo < hi) {
                    const int mid = (lo + hi) >> 1;
                    if (s_inc[mid] > (u32)row) hi = mid; else lo = mid + 1;
                }
                const u32 start = lo ? s_inc[lo - 1] : carry;  // <= row
                const u32 pos = (u32)row - start;
                const int rq = (int)(c0 + lo);
                const u32 j = (u32)by_page((int)pos);
                if (j < (u32)p.max_pages) {
                    const bool in_window = wlog >= 0 && j < (1u << wlog);
                    const i64 at = (i64)rq * p.pt_row_stride + (i64)j * p.pt_col_stride;
                    const i64 page = p.batch == 1 ? (i64)guess  // rq 0, start 0: j is the guessed column
                        : in_window ? (i64)s_win[(rq << wlog) + j] : load_index<PT>(p.page_table, at);
                    if (page >= 0 && page < p.num_pages) {
                        s_loc[tid] = make_int2((int)page, (int)(pos - j * (u32)sz.page_size));
                    } else {
                        ng_report(p.error, NG_ERR_PAGE_ID, row, rq,
                                  in_window ? load_index<PT>(p.page_table, at) : page);  // the id as stored
                    }
                } else {
                    ng_report(p.error, NG_ERR_PAGE_INDEX, row, rq, j);
                }
            }
            carry = stop;
            if (carry >= (u32)end && !read_all) break;  // every row of the block placed (uniform)
            __syncthreads();  // s_inc and s_warp are rewritten by the next chunk
            c0 += NG_THREADS;
            // A block whose rows lie past the first chunk, in a batch of more than two: skip to its chunk
            // (s_inc is free until the next chunk rewrites it).
            if (c0 == NG_THREADS && !read_all && (u32)p.batch > 2 * NG_THREADS && carry <= (u32)row0)
                c0 = skip_chunks<LT>(p, (u32)row0, c0, s_inc, carry);
        }
        if (read_all && tid == 0 && (i64)carry > p.num_rows)
            ng_report(p.error, NG_ERR_LENGTH_SUM, carry, p.num_rows, 0);
    }
    __syncthreads();
    copy_tile<KVEC, UNROLL, true>(p.kv_cache, p.page_stride, sz.page_size, sz.head_dim, sz.scale_words, p.dst_k,
                                  p.dst_k_row_stride, p.dst_scale, p.dst_scale_row_stride, s_loc, row0, n);
}

// Request-major tiles (the host's choice for 2 to NG_THREADS requests in place of the narrow
// row-major tiles, where their grid, sized by the engine's max_seq_len, is within 2x of the
// row-major one: kernels/index_k_read.py launch_rule; T <= NG_THREADS, the rows s_loc holds: the
// row-major tiles' T, or NG_THREADS with 8 loads in flight, "req_wide"): block b works
// for request r = b % R (R = max(batch, 1)) on its positions [y*T, y*T + T), y = b / R, then
// y + Y, y + 2Y, ... (Y = gridDim.x / R, T = tokens_per_cta), so the grid sets only how many
// blocks share a request, never which rows are written. A block knows its request from its
// index, so its rows' page ids load beside the lengths: every row's bytes are two DRAM round
// trips away, with no scan and no search between. The lengths before r are summed (saturating)
// for the destination rows alone. The last request's blocks also write the zero rows past the
// lengths' sum, up to num_rows. Index values are untrusted as in index_k_read_body, with the
// same reports in debug mode.
template <int KVEC, int UNROLL, typename LT, typename PT, bool FIXED>
__device__ __forceinline__ void index_k_read_by_request(const IndexKReadParams& p) {
    const ReadSizes<FIXED> sz(p);
    __shared__ int2 s_loc[NG_THREADS];  // (page, token in page) of each row of the tile; page -1 = a zero row
    __shared__ u32 s_part[NG_THREADS / 32];  // per warp: its lengths before the request, saturated

    const int tid = threadIdx.x, lane = tid & 31;
    const u32 cap = 0x7fffffffu;
    const u32 R = (u32)max(p.batch, 1), Y = gridDim.x / R;
    if (blockIdx.x >= R * Y) return;  // the whole block (the host launches R * Y)
    const u32 rq = blockIdx.x % R, y0 = blockIdx.x / R;
    const bool last = rq == R - 1, has = rq < (u32)p.batch;
    const u32 T = (u32)p.tokens_per_cta;
    const FastDiv by_page(sz.page_size);
    // One round trip: the lengths before the request (one a thread), its own, the first tile's page
    // ids (the column found first: with the division between them, ptxas waited for the lengths).
    const u64 pos0 = (u64)y0 * T + (u32)tid;
    const u32 j0 = has && (u32)tid < T && pos0 <= cap ? (u32)by_page((int)pos0) : 0xffffffffu;
    const LT x0 = (u32)tid < rq ? load_now<LT>(p.seq_lens, (i64)tid * p.seq_lens_stride) : (LT)0;
    const LT xr = has ? load_now<LT>(p.seq_lens, (i64)rq * p.seq_lens_stride) : (LT)0;
    PT id0 = -1;
    if (j0 < (u32)p.max_pages) id0 = load_now<PT>(p.page_table, (i64)rq * p.pt_row_stride + (i64)j0 * p.pt_col_stride);
    const u32 own = last && tid == 0 && has ? checked_length(p, rq, (i64)xr) : length_value((i64)xr);
    if (!last && (u64)y0 * T >= own) return;  // the whole block: no position of the request is its
    u32 before = (u32)tid < rq ? checked_length(p, tid, (i64)x0) : 0u;
    for (u32 r = tid + NG_THREADS; r < rq; r += NG_THREADS) before = min(before + length_of<LT, false>(p, r), cap);
#pragma unroll
    for (int d = 16; d; d >>= 1) before = min(before + (u32)__shfl_xor_sync(0xffffffffu, (int)before, d), cap);
    if (lane == 0) s_part[tid >> 5] = before;
    // The first tile's rows: a position of the request with a valid column and page id, else zero.
    int why = 0;  // debug mode: 1 a column past max_pages, 2 a bad page id (reported once the row is known)
    if ((u32)tid < T) {
        int2 loc = make_int2(-1, 0);
        if (pos0 < own) {
            if (j0 >= (u32)p.max_pages) why = 1;
            else if ((i64)id0 < 0 || (i64)id0 >= p.num_pages) why = 2;
            else loc = make_int2((int)id0, (int)((u32)pos0 - j0 * (u32)sz.page_size));
        }
        s_loc[tid] = loc;
    }
    __syncthreads();
    u32 offset = 0;  // the request's first row: the lengths before it, saturated
#pragma unroll
    for (int w = 0; w < NG_THREADS / 32; ++w) offset = min(offset + s_part[w], cap);
    if (why && (u64)offset + pos0 < (u64)p.num_rows)
        ng_report(p.error, why == 1 ? NG_ERR_PAGE_INDEX : NG_ERR_PAGE_ID, (i64)offset + (i64)pos0, rq,
                  why == 1 ? (i64)j0 : (i64)id0);
    if (last && y0 == 0 && tid == 0 && (i64)min(offset + own, cap) > p.num_rows)
        ng_report(p.error, NG_ERR_LENGTH_SUM, min(offset + own, cap), p.num_rows, 0);
    // The request's rows [offset, offset + own) below num_rows; the last request's run on to num_rows.
    const u64 stop = last ? (u64)p.num_rows : min((u64)offset + own, (u64)p.num_rows);
    const u64 span = stop > offset ? stop - offset : 0;
    for (u64 c = y0; c * T < span; c += Y) {
        if (c != y0) {  // a later tile: its page ids now
            __syncthreads();  // the previous tile's copy read s_loc
            if ((u32)tid < T) {
                const u64 pos = c * T + (u32)tid;  // < span + T <= 2^32
                int2 loc = make_int2(-1, 0);
                if (pos < own) {
                    const u32 j = (u32)by_page((int)pos);
                    const i64 row = (i64)offset + (i64)pos;
                    if (j >= (u32)p.max_pages) {
                        if (row < p.num_rows) ng_report(p.error, NG_ERR_PAGE_INDEX, row, rq, j);
                    } else {
                        const i64 page = load_index<PT>(p.page_table, (i64)rq * p.pt_row_stride + (i64)j * p.pt_col_stride);
                        if (page >= 0 && page < p.num_pages) loc = make_int2((int)page, (int)((u32)pos - j * (u32)sz.page_size));
                        else if (row < p.num_rows) ng_report(p.error, NG_ERR_PAGE_ID, row, rq, page);
                    }
                }
                s_loc[tid] = loc;
            }
            __syncthreads();
        }
        copy_tile<KVEC, UNROLL, true>(p.kv_cache, p.page_stride, sz.page_size, sz.head_dim, sz.scale_words, p.dst_k,
                                      p.dst_k_row_stride, p.dst_scale, p.dst_scale_row_stride, s_loc,
                                      (int)(offset + c * T), (int)min((u64)T, span - c * T));
    }
}

// Lane src's page id, as a 64-bit value (every lane calls it): one shuffle for an int32 id.
__device__ __forceinline__ i64 shfl_id(i32 id, int src) { return __shfl_sync(0xffffffffu, id, src); }
__device__ __forceinline__ i64 shfl_id(i64 id, int src) {
    const u32 hi = (u32)__shfl_sync(0xffffffffu, (int)(id >> 32), src);
    const u32 lo = (u32)__shfl_sync(0xffffffffu, (int)id, src);
    return (i64)(((u64)hi << 32) | lo);
}

// Small calls (a few thousand rows: latency is all there is): one warp per row, NG_THREADS / 32
// rows per block, no shared memory and no barrier. The warp sums the lengths 32 at a time
// (shuffles) and finds its row's request by a ballot; with at most 32 requests the lanes also
// load a window of the page table alongside the lengths (lane l: request l / W, column l % W, W
// = 32 / 2^ceil(log2(batch))), so a row whose column is in the window is two DRAM round trips
// from its bytes. Rows past the lengths' sum and rows with bad indices are written as zeros.
template <int KVEC, typename LT, typename PT, bool FIXED>
__device__ __forceinline__ void index_k_read_tiny(const IndexKReadParams& p) {
    const ReadSizes<FIXED> sz(p);
    typedef typename Vec<KVEC>::T V;
    const int lane = threadIdx.x & 31;
    const u32 urow = blockIdx.x * (NG_THREADS / 32) + (threadIdx.x >> 5);
    if (urow >= (u64)p.num_rows) return;  // the whole warp
    const int row = (int)urow;
    const bool read_all = p.error != 0 && urow == 0;  // debug mode: one warp reads every length
    // The first 32 lengths, then the window, both issued before either is waited for.
    const LT len0 = first_length<LT>(p, lane);
    int wlog = -1;
    PT window = -1;
    if (p.batch <= 32) {
        wlog = 5 - (32 - __clz(max(p.batch, 1) - 1));  // 32 / 2^ceil(log2(batch)) columns a request
        const int k = lane >> wlog, c = lane & ((1 << wlog) - 1);
        if (k < p.batch && c < p.max_pages) {
            window = load_now<PT>(p.page_table, (i64)k * p.pt_row_stride + (i64)c * p.pt_col_stride);
        }
    }
    const u32 cap = 0x7fffffffu;
    u32 carry = 0, start = 0;
    int rq = -1;
    for (u32 c0 = 0; c0 < (u32)p.batch; c0 += 32) {
        const u32 r = c0 + lane;
        const u32 len = c0 ? length_of<LT, true>(p, r) : checked_length(p, r, (i64)len0);  // len0: 0 past the batch
        u32 inc = len;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const u32 y = (u32)__shfl_sync(0xffffffffu, (int)inc, lane >= d ? lane - d : lane);
            if (lane >= d) inc = min(inc + y, cap);
        }
        inc = min(inc + carry, cap);
        const u32 prev = (u32)__shfl_sync(0xffffffffu, (int)inc, lane ? lane - 1 : 0);  // every lane shuffles
        const u32 excl = lane ? prev : carry;
        const u32 m = __ballot_sync(0xffffffffu, r < (u32)p.batch && inc > (u32)row);
        if (m && rq < 0) {
            const int k = __ffs(m) - 1;
            rq = (int)c0 + k;
            start = (u32)__shfl_sync(0xffffffffu, (int)excl, k);
        }
        carry = (u32)__shfl_sync(0xffffffffu, (int)inc, 31);
        if (rq >= 0 && !read_all) break;
    }
    if (read_all && lane == 0 && (i64)carry > p.num_rows) ng_report(p.error, NG_ERR_LENGTH_SUM, carry, p.num_rows, 0);
    int page = -1, slot = 0;
    if (rq >= 0) {
        const u32 pos = (u32)row - start;  // start <= row
        const u32 j = pos / (u32)sz.page_size;
        // Every lane shuffles (rq and j are the warp's); the value counts only inside the window.
        const i64 w = shfl_id(window, (int)((((u32)rq << (wlog & 31)) | j) & 31u));
        i64 id = -1;
        if (j >= (u32)p.max_pages) {
            if (lane == 0) ng_report(p.error, NG_ERR_PAGE_INDEX, row, rq, j);
        } else {
            id = wlog >= 0 && j < (1u << wlog) ? w
                : load_index<PT>(p.page_table, (i64)rq * p.pt_row_stride + (i64)j * p.pt_col_stride);
            if (id >= 0 && id < p.num_pages) {
                page = (int)id;
                slot = (int)(pos - j * (u32)sz.page_size);
            } else if (lane == 0) {
                ng_report(p.error, NG_ERR_PAGE_ID, row, rq, id);
            }
        }
    }
    const int vpt = sz.head_dim / KVEC;
    V* dst = reinterpret_cast<V*>(p.dst_k + (i64)row * p.dst_k_row_stride);
    u32* sdst = reinterpret_cast<u32*>(p.dst_scale + (i64)row * p.dst_scale_row_stride);
    if (page < 0) {  // a zero row
        for (int c = lane; c < vpt; c += 32) dst[c] = V();
        for (int c = lane; c < sz.scale_words; c += 32) sdst[c] = 0u;
        return;
    }
    const u8* base = p.kv_cache + (i64)page * p.page_stride;
    const V* src = reinterpret_cast<const V*>(base + (i64)slot * sz.head_dim);
    const u32* ssrc = reinterpret_cast<const u32*>(base + (i64)sz.page_size * sz.head_dim + (i64)slot * sz.scale_words * 4);
    copy_row_by_warp(src, dst, vpt, ssrc, sdst, sz.scale_words, lane);
}

// Entry points: none here. The spec (nvrtc_gather/kernels/index_k_read.py) names them and the
// body each runs (index_k_read_body<16, 4, i32, i64, false>, ...); the JIT appends the wrappers.
