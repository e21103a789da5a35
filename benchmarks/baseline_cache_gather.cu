// Benchmark baselines only (never used by the ops): the chunked-context gathers launched the way
// vLLM 0.33's kernels are (issue #27's description: one thread block per (request, page) task,
// found by a serial scan over the requests; token_to_seq not read), written here from that
// description, not from vLLM's code, so that benchmarks/bench_cache_gather.py can time them beside
// ours through the same runtime. One parameter struct (declared again in bench_cache_gather.py,
// packed without padding). Inputs are trusted and laid out as the benchmark makes them (entries
// and rows contiguous, 16-byte aligned): no index or alignment is checked.
//
// Both: 256 threads per block (vLLM drops to 128 from 2^20 rows, which no workload reaches);
// grid = ceil(num_rows / block_size) + 2 * batch. Block k takes the k-th page of the concatenation
// of every request's pages (request r: rows [min(cu[r], T), min(cu[r + 1], T)), entries from
// position seq0_r = seq_starts[r] (or 0) on, pages_r = ceil((seq0_r + len_r) / bs) - seq0_r / bs);
// thread 0 finds it by a serial scan of the requests, reading cu_seq_lens (and seq_starts) from
// global memory; blocks past the last page return.
// baseline_cp_gather: the page's tokens are one contiguous run of bytes in the cache and in dst;
//   copied with 16-byte loads, two in flight per thread (idx and idx + 256).
// baseline_dequant_<auto|fp8>_bf16: pages past the block_table row are skipped; the page's
//   (token, 8-value vector) pairs are spread over the threads, one vector each per step: "auto"
//   loads 16 bytes of bf16 and stores them, "fp8" loads 8 e4m3 codes, fp8 -> float * scale ->
//   bf16 (nearest even), one 16-byte store.
#include "common.cuh"
#include "half_bits.cuh"

#define BASELINE_THREADS 256

struct BaselineCacheGatherParams {
    const u8* src_cache;      // entry (block b, slot t) at src_cache + b * block_stride + t * entry_stride
    u8* dst;                  // row i at dst + i * dst_row_stride
    const i32* block_table;   // request r's blocks at block_table + r * bt_row_stride
    const i32* cu_seq_lens;   // batch + 1 entries
    const i32* seq_starts;    // batch entries, or null (0)
    const float* scale;       // the fp8 dequantization's scale (unused otherwise)
    i64 block_stride;         // bytes
    i64 entry_stride;         // bytes
    i64 dst_row_stride;       // bytes
    i64 bt_row_stride;        // elements
    i32 num_rows;             // T
    i32 batch;
    i32 block_size;
    i32 max_blocks;           // block_table columns
    i32 row_bytes;            // source bytes per entry
    i32 unused;
    i64* error;               // the runtime's debug buffer (not used)
};

// The task of block k: s[0] request (-1: none), s[1] first position, s[2] position end, s[3]
// page (block_table column), s[4] dst row of position 0.
__device__ __forceinline__ void find_page_task(const BaselineCacheGatherParams& p, int* s) {
    if (threadIdx.x == 0) {
        const int k = blockIdx.x;
        int acc = 0;
        s[0] = -1;
        for (int r = 0; r < p.batch; ++r) {  // serial scan, as vLLM's kernels do
            const int begin = min(p.cu_seq_lens[r], p.num_rows);
            const int len = min(p.cu_seq_lens[r + 1], p.num_rows) - begin;
            if (len <= 0) continue;
            const int seq0 = p.seq_starts ? p.seq_starts[r] : 0;
            const int first = seq0 / p.block_size;
            const int pages = (seq0 + len + p.block_size - 1) / p.block_size - first;
            if (k < acc + pages) {
                const int page = first + (k - acc);
                s[0] = r;
                s[1] = max(seq0, page * p.block_size);
                s[2] = min(seq0 + len, (page + 1) * p.block_size);
                s[3] = page;
                s[4] = begin - seq0;
                break;
            }
            acc += pages;
        }
    }
    __syncthreads();
}

extern "C" __global__ void __launch_bounds__(BASELINE_THREADS)
baseline_cp_gather(const BaselineCacheGatherParams p) {
    __shared__ int s[5];
    find_page_task(p, s);
    if (s[0] < 0) return;
    const i32 blk = p.block_table[(i64)s[0] * p.bt_row_stride + s[3]];
    const int lo = s[1], hi = s[2];
    const uint4* src = reinterpret_cast<const uint4*>(p.src_cache + (i64)blk * p.block_stride +
                                                      (i64)(lo - s[3] * p.block_size) * p.row_bytes);
    uint4* out = reinterpret_cast<uint4*>(p.dst + (i64)(s[4] + lo) * p.row_bytes);
    const int n = (hi - lo) * (p.row_bytes / 16);
    int i = threadIdx.x;
    for (; i + BASELINE_THREADS < n; i += 2 * BASELINE_THREADS) {
        const uint4 a = src[i], b = src[i + BASELINE_THREADS];
        out[i] = a;
        out[i + BASELINE_THREADS] = b;
    }
    for (; i < n; i += BASELINE_THREADS) out[i] = src[i];
}

template <bool FP8>
__device__ __forceinline__ void dequant_page(const BaselineCacheGatherParams& p) {
    __shared__ int s[5];
    find_page_task(p, s);
    if (s[0] < 0 || s[3] >= p.max_blocks) return;  // vLLM skips pages past the block_table row
    const i32 blk = p.block_table[(i64)s[0] * p.bt_row_stride + s[3]];
    const int lo = s[1], hi = s[2];
    const int vecs = p.row_bytes / (FP8 ? 8 : 16);  // 8-value vectors per entry
    const float scale = FP8 ? *p.scale : 0.0f;
    const int n = (hi - lo) * vecs;
    for (int i = threadIdx.x; i < n; i += BASELINE_THREADS) {
        const int t = i / vecs, v = i - t * vecs;
        const u8* rec = p.src_cache + (i64)blk * p.block_stride + (i64)(lo + t - s[3] * p.block_size) * p.entry_stride;
        uint4* out = reinterpret_cast<uint4*>(p.dst + (i64)(s[4] + lo + t) * p.dst_row_stride) + v;
        if (FP8) {
            const uint2 c = reinterpret_cast<const uint2*>(rec)[v];
            float f[8];
            ng_float2_from_fp8e4m3x2(c.x & 0xffffu, f[0], f[1]);
            ng_float2_from_fp8e4m3x2(c.x >> 16, f[2], f[3]);
            ng_float2_from_fp8e4m3x2(c.y & 0xffffu, f[4], f[5]);
            ng_float2_from_fp8e4m3x2(c.y >> 16, f[6], f[7]);
            uint4 o;
            o.x = ng_bf16x2_from_float(__fmul_rn(f[0], scale), __fmul_rn(f[1], scale));
            o.y = ng_bf16x2_from_float(__fmul_rn(f[2], scale), __fmul_rn(f[3], scale));
            o.z = ng_bf16x2_from_float(__fmul_rn(f[4], scale), __fmul_rn(f[5], scale));
            o.w = ng_bf16x2_from_float(__fmul_rn(f[6], scale), __fmul_rn(f[7], scale));
            *out = o;
        } else {
            *out = reinterpret_cast<const uint4*>(rec)[v];
        }
    }
}

extern "C" __global__ void __launch_bounds__(BASELINE_THREADS)
baseline_dequant_auto_bf16(const BaselineCacheGatherParams p) { dequant_page<false>(p); }

extern "C" __global__ void __launch_bounds__(BASELINE_THREADS)
baseline_dequant_fp8_bf16(const BaselineCacheGatherParams p) { dequant_page<true>(p); }
