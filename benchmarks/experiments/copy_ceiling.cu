// Appended to cuda_src/cache_gather.cu by copy_ceiling_ab.py (an experiment, not shipped):
// contiguous copies written three ways, to place the ceiling the chunked gathers are held to
// (a device copy_), and the load hint ld_hint the "hint" build of the tile kernel uses.
// Fields used: src_cache, dst, block_stride = bytes to copy (a multiple of 16).

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

// The same with ld_hint.
extern "C" __global__ void __launch_bounds__(NG_THREADS) exp_kcopy_hint(const CacheGatherParams p) {
    const i64 n = p.block_stride / 16;
    const i64 base = (i64)blockIdx.x * (NG_THREADS * 4) + threadIdx.x;
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) if (base + u * NG_THREADS < n) v[u] = ld_hint(reinterpret_cast<const uint4*>(p.src_cache) + base + u * NG_THREADS);
#pragma unroll
    for (int u = 0; u < 4; ++u) if (base + u * NG_THREADS < n) reinterpret_cast<uint4*>(p.dst)[base + u * NG_THREADS] = v[u];
}

// The bulk copy engine: one thread per block moves ~16 KiB chunks b, b + grid, ... through
// three shared-memory stages (cp.async.bulk global -> shared on an mbarrier, then shared ->
// global), the next loads in flight while a chunk is stored.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

extern "C" __global__ void __launch_bounds__(NG_THREADS) exp_tma(const CacheGatherParams p) {
    constexpr int CH = 16368, S = 3;  // 3 stages and the barriers in 48 KB of static shared memory
    __shared__ __align__(128) u8 buf[S][CH];
    __shared__ __align__(8) u64 bar[S];
    if (threadIdx.x != 0) return;
    const i64 total = p.block_stride;
    const i64 nch = (total + CH - 1) / CH;
    if ((i64)blockIdx.x >= nch) return;
    const i64 mine = (nch - blockIdx.x + gridDim.x - 1) / gridDim.x;
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    auto load = [&](i64 k) {
        const int s = (int)(k % S);
        const i64 c = blockIdx.x + k * gridDim.x;
        const u32 bytes = (u32)min((i64)CH, total - c * CH);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&bar[s])), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(smem_addr(buf[s])), "l"(p.src_cache + c * CH), "r"(bytes), "r"(smem_addr(&bar[s])) : "memory");
    };
    for (i64 k = 0; k < S && k < mine; ++k) load(k);
    for (i64 k = 0; k < mine; ++k) {
        const int s = (int)(k % S);
        const u32 parity = (u32)((k / S) & 1);
        u32 done = 0;
        while (!done) {
            asm volatile("{ .reg .pred P; mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2; selp.u32 %0, 1, 0, P; }"
                         : "=r"(done) : "r"(smem_addr(&bar[s])), "r"(parity) : "memory");
        }
        const i64 c = blockIdx.x + k * gridDim.x;
        const u32 bytes = (u32)min((i64)CH, total - c * CH);
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     ::"l"(p.dst + c * CH), "r"(smem_addr(buf[s])), "r"(bytes) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        if (k >= 1 && k - 1 + S < mine) {  // chunk k - 1's store has read its stage: reload it
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            load(k - 1 + S);
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Copy shapes: UNROLL 16-byte loads in flight per thread, NG_THREADS threads per block;
// "full": one block per NG_THREADS * UNROLL vectors; "gs": a grid-stride loop over such tiles.
template <int UNROLL>
__device__ __forceinline__ void kcopy_tile(const CacheGatherParams& p, i64 tile, i64 n) {
    const i64 base = tile * (NG_THREADS * UNROLL) + threadIdx.x;
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) if (base + u * NG_THREADS < n) v[u] = __ldg(reinterpret_cast<const uint4*>(p.src_cache) + base + u * NG_THREADS);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) if (base + u * NG_THREADS < n) reinterpret_cast<uint4*>(p.dst)[base + u * NG_THREADS] = v[u];
}
#define NG_KCOPY(U)                                                                                 \
    extern "C" __global__ void __launch_bounds__(NG_THREADS) exp_full_u##U(const CacheGatherParams p) { \
        kcopy_tile<U>(p, blockIdx.x, p.block_stride / 16);                                          \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(NG_THREADS) exp_gs_u##U(const CacheGatherParams p) {   \
        const i64 n = p.block_stride / 16, tiles = (n + NG_THREADS * U - 1) / (NG_THREADS * U);        \
        for (i64 t = blockIdx.x; t < tiles; t += gridDim.x) kcopy_tile<U>(p, t, n);                  \
    }
NG_KCOPY(2)
NG_KCOPY(4)
NG_KCOPY(8)
