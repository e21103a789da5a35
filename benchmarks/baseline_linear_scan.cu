// Benchmark baseline only (never used by the ops): the gather as vLLM's shipped kernel
// does it, where every thread block finds each of its tokens' request by a linear scan
// of cu_seq_lens (docs/contract.md section 1). Same parameters as cuda_src/gather_indexer_k.cu.
#include "gather_params.cuh"

// 8 warps per block, one token per warp; lanes scan the batch, then copy 16-byte vectors.
extern "C" __global__ void __launch_bounds__(NG_THREADS) baseline_linear_scan(const GatherParams p) {
    __shared__ int s_req[NG_THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row = blockIdx.x * (NG_THREADS / 32) + warp;
    if (lane == 0) s_req[warp] = -1;
    __syncthreads();
    // Linear scan, as in vLLM: the whole block walks every request for each of its tokens.
    for (int i = threadIdx.x; i < p.batch * (NG_THREADS / 32); i += NG_THREADS) {
        const int w = i % (NG_THREADS / 32), r = i / (NG_THREADS / 32);
        const int t = blockIdx.x * (NG_THREADS / 32) + w;
        if (p.cu_seq_lens[r] <= t && t < p.cu_seq_lens[r + 1]) s_req[w] = r;
    }
    __syncthreads();
    const int r = s_req[warp];
    if (row >= p.num_tokens || r < 0) return;
    const int pos = row - p.cu_seq_lens[r];
    const int b = p.block_table[(i64)r * p.bt_row_stride + pos / p.block_size];
    const int t = pos % p.block_size;
    const u8* src = p.kv_cache + (i64)b * p.block_stride + (i64)t * p.head_dim;
    u8* dst = p.dst_k + (i64)row * p.dst_k_row_stride;
    for (int c = lane; c < p.head_dim / 16; c += 32)
        reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
    const u32* ssrc = reinterpret_cast<const u32*>(p.kv_cache + (i64)b * p.block_stride +
                                                   (i64)p.block_size * p.head_dim) + (i64)t * p.scale_words;
    u32* sdst = reinterpret_cast<u32*>(p.dst_scale + (i64)row * p.dst_scale_row_stride);
    for (int w = lane; w < p.scale_words; w += 32) sdst[w] = ssrc[w];
}
