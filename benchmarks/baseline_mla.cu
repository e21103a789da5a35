// Benchmark baselines only (never used by the ops): the MLA-cache ops and the chunked-context
// gathers launched the way vLLM's kernels are, written here from a description of that launch
// (not vLLM's code), so that the families of benchmarks/ can time them beside ours through the
// same runtime. The parameter structs are declared again in benchmarks/baselines.py (packed
// without padding: every i32 pair sits before the next 8-byte field). Inputs are trusted: no
// index is checked.
//
// The gathers: one thread block per (request, page) task, found by a serial scan over the
// requests (find_page_task; issue #27's description of vLLM 0.33's kernels); grid =
// ceil(num_rows / block_size) + 2 * batch. Block k takes the k-th page of the concatenation of
// every request's pages (request r: rows [min(cu[r], T), min(cu[r + 1], T)), entries from position
// seq0_r = seq_starts[r] (or 0) on, pages_r = ceil((seq0_r + len_r) / bs) - seq0_r / bs); thread 0
// finds it reading cu_seq_lens (and seq_starts) from global memory; blocks past the last page return.
// baseline_mla_gather (512 threads): one warp per token of the page (16 warps, stepping by 16):
//   lane l decodes the 8-byte code chunks c = l and c = 32 + l (uint2 loads), scale =
//   scales[c >> 4], fp8 -> float * scale -> bf16 (nearest even), one 16-byte store per chunk;
//   the 32 lanes copy the 128 k_pe bytes one int each.
// baseline_cp_gather (256 threads; vLLM drops to 128 from 2^20 rows, which no workload reaches):
//   the page's tokens are one contiguous run of bytes in the cache and in dst, copied with
//   16-byte loads, two in flight per thread (idx and idx + 256).
// baseline_dequant_<auto|fp8>_bf16 (256 threads): pages past the block_table row are skipped;
//   the page's (token, 8-value vector) pairs are spread over the threads, one vector each per
//   step: "auto" loads 16 bytes of bf16 and stores them, "fp8" loads 8 e4m3 codes, fp8 -> float
//   * scale -> bf16 (nearest even), one 16-byte store.
// baseline_mla_write (96 threads per block): one block per token. Threads 0-63 load 8 bf16
//   values each (16 bytes); a half-warp (16 lanes) holds one 128-value tile, whose amax takes 4
//   xor shuffles of width 16; scale = max(amax / 448, FLT_MIN) (the older scale rule: our op's
//   ds_scale_rule="plain"); codes = e4m3 of x / scale, one 8-byte store per thread; lanes 0 and
//   16 of warps 0-1 store their tile's scale; threads 64-95 copy the k_pe bytes, 4 each.
#include "common.cuh"
#include "fp8_e4m3.cuh"
#include "half_bits.cuh"

#define BASELINE_GATHER_THREADS 512
#define BASELINE_WRITE_THREADS 96
#define BASELINE_CHUNKED_THREADS 256

struct BaselineMlaWriteParams {
    const u8* kv_c;               // bf16 [num_tokens, 512], row i at kv_c + i * kv_c_row_stride
    const u8* k_pe;               // bf16 [num_tokens, 64]
    const i64* slot_mapping;      // num_tokens entries; < 0: padding
    u8* kv_cache;                 // 656-byte records
    i64 kv_c_row_stride;          // bytes
    i64 k_pe_row_stride;          // bytes
    i64 block_stride;             // bytes
    i64 entry_stride;             // bytes
    i32 num_tokens;
    i32 block_size;
    i64* error;                   // the runtime's debug buffer (not used)
};

// Eight fp8 e4m3 codes -> eight bf16: fp8 -> float * scale (one IEEE multiply) -> bf16 (nearest even).
__device__ __forceinline__ uint4 baseline_bf16x8(const uint2 v, const float scale) {
    float f[8];
    ng_float2_from_fp8e4m3x2(v.x & 0xffffu, f[0], f[1]);
    ng_float2_from_fp8e4m3x2(v.x >> 16, f[2], f[3]);
    ng_float2_from_fp8e4m3x2(v.y & 0xffffu, f[4], f[5]);
    ng_float2_from_fp8e4m3x2(v.y >> 16, f[6], f[7]);
    uint4 o;
    o.x = ng_bf16x2_from_float(__fmul_rn(f[0], scale), __fmul_rn(f[1], scale));
    o.y = ng_bf16x2_from_float(__fmul_rn(f[2], scale), __fmul_rn(f[3], scale));
    o.z = ng_bf16x2_from_float(__fmul_rn(f[4], scale), __fmul_rn(f[5], scale));
    o.w = ng_bf16x2_from_float(__fmul_rn(f[6], scale), __fmul_rn(f[7], scale));
    return o;
}

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

extern "C" __global__ void __launch_bounds__(BASELINE_GATHER_THREADS)
baseline_mla_gather(const BaselineCacheGatherParams p) {
    __shared__ int s[5];
    find_page_task(p, s);
    if (s[0] < 0) return;  // the over-provisioned blocks
    const i32 blk = p.block_table[(i64)s[0] * p.bt_row_stride + s[3]];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int page_start = s[3] * p.block_size;
    for (int pos = s[1] + warp; pos < s[2]; pos += BASELINE_GATHER_THREADS / 32) {
        const u8* rec = p.src_cache + (i64)blk * p.block_stride + (i64)(pos - page_start) * p.entry_stride;
        u8* out = p.dst + (i64)(s[4] + pos) * p.dst_row_stride;
        const float* scales = reinterpret_cast<const float*>(rec + 512);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int c = lane + 32 * half;  // 8-byte chunk of codes: values [8c, 8c + 8)
            reinterpret_cast<uint4*>(out)[c] = baseline_bf16x8(reinterpret_cast<const uint2*>(rec)[c], scales[c >> 4]);
        }
        reinterpret_cast<u32*>(out + 1024)[lane] = reinterpret_cast<const u32*>(rec + 528)[lane];
    }
}

#if defined(__CUDA_ARCH__)  // the host emulator (tests/benchmarks/) models no width-16 shuffles
extern "C" __global__ void __launch_bounds__(BASELINE_WRITE_THREADS)
baseline_mla_write(const BaselineMlaWriteParams p) {
    const int token = blockIdx.x;
    if (token >= p.num_tokens) return;
    const i64 slot = p.slot_mapping[token];
    if (slot < 0) return;
    const i64 blk = slot / p.block_size;
    u8* rec = p.kv_cache + blk * p.block_stride + (slot - blk * p.block_size) * p.entry_stride;
    const int t = threadIdx.x;
    if (t >= 64) {  // k_pe: 32 threads, 4 bytes each
        const int i = t - 64;
        reinterpret_cast<u32*>(rec + 528)[i] =
            reinterpret_cast<const u32*>(p.k_pe + (i64)token * p.k_pe_row_stride)[i];
        return;
    }
    // Threads 0-63: values [8t, 8t + 8); a half-warp is one 128-value tile.
    const uint4 v = reinterpret_cast<const uint4*>(p.kv_c + (i64)token * p.kv_c_row_stride)[t];
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    float x[8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        x[2 * i] = ng_bf16_to_float(w[i] & 0xffffu);
        x[2 * i + 1] = ng_bf16_to_float(w[i] >> 16);
        amax = fmaxf(amax, fmaxf(fabsf(x[2 * i]), fabsf(x[2 * i + 1])));
    }
#pragma unroll
    for (int m = 8; m >= 1; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m, 16));
    float scale = __fdiv_rn(amax, 448.0f);
    scale = fmaxf(scale, 1.17549435e-38f);  // FLT_MIN
    uint2 codes;
    codes.x = ng_fp8e4m3x2_from_f32(__fdiv_rn(x[0], scale), __fdiv_rn(x[1], scale)) |
              (ng_fp8e4m3x2_from_f32(__fdiv_rn(x[2], scale), __fdiv_rn(x[3], scale)) << 16);
    codes.y = ng_fp8e4m3x2_from_f32(__fdiv_rn(x[4], scale), __fdiv_rn(x[5], scale)) |
              (ng_fp8e4m3x2_from_f32(__fdiv_rn(x[6], scale), __fdiv_rn(x[7], scale)) << 16);
    reinterpret_cast<uint2*>(rec)[t] = codes;
    if ((t & 15) == 0) reinterpret_cast<float*>(rec + 512)[t >> 4] = scale;  // lanes 0 and 16 of warps 0-1
}
#endif

extern "C" __global__ void __launch_bounds__(BASELINE_CHUNKED_THREADS)
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
    for (; i + BASELINE_CHUNKED_THREADS < n; i += 2 * BASELINE_CHUNKED_THREADS) {
        const uint4 a = src[i], b = src[i + BASELINE_CHUNKED_THREADS];
        out[i] = a;
        out[i + BASELINE_CHUNKED_THREADS] = b;
    }
    for (; i < n; i += BASELINE_CHUNKED_THREADS) out[i] = src[i];
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
    for (int i = threadIdx.x; i < n; i += BASELINE_CHUNKED_THREADS) {
        const int t = i / vecs, v = i - t * vecs;
        const u8* rec = p.src_cache + (i64)blk * p.block_stride + (i64)(lo + t - s[3] * p.block_size) * p.entry_stride;
        uint4* out = reinterpret_cast<uint4*>(p.dst + (i64)(s[4] + lo + t) * p.dst_row_stride) + v;
        if (FP8) {
            *out = baseline_bf16x8(reinterpret_cast<const uint2*>(rec)[v], scale);
        } else {
            *out = reinterpret_cast<const uint4*>(rec)[v];
        }
    }
}

extern "C" __global__ void __launch_bounds__(BASELINE_CHUNKED_THREADS)
baseline_dequant_auto_bf16(const BaselineCacheGatherParams p) { dequant_page<false>(p); }

extern "C" __global__ void __launch_bounds__(BASELINE_CHUNKED_THREADS)
baseline_dequant_fp8_bf16(const BaselineCacheGatherParams p) { dequant_page<true>(p); }
