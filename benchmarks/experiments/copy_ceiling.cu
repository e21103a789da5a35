// Appended to cuda_src/cache_gather.cu by copy_ceiling.py (an experiment, not shipped): a
// contiguous copy written as a kernel of the chunked gathers' tile shape, to place the ceiling
// they are held to (a device copy_). Fields used: src_cache, dst, block_stride = bytes to copy
// (a multiple of 16).

// 16-byte loads, 4 in flight per thread, 16 KiB per block (the tile kernel's shape).
extern "C" __global__ void __launch_bounds__(NG_THREADS) exp_kcopy(const CacheGatherParams p) {
    const i64 n = p.block_stride / 16;
    const i64 base = (i64)blockIdx.x * (NG_THREADS * 4) + threadIdx.x;
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) if (base + u * NG_THREADS < n) v[u] = __ldg(reinterpret_cast<const uint4*>(p.src_cache) + base + u * NG_THREADS);
#pragma unroll
    for (int u = 0; u < 4; ++u) if (base + u * NG_THREADS < n) reinterpret_cast<uint4*>(p.dst)[base + u * NG_THREADS] = v[u];
}
