// Appended to cuda_src/cache_gather.cu by chunked_pipeline_ab.py (an experiment, not shipped).
//
// cache_gather_pipe: the tile kernel made persistent and pipelined. Block b runs tiles b,
// b + gridDim.x, ...; while a tile's loads are in flight it finds the next tile's requests
// and locates its rows (into the other half of a double-buffered s_loc), so the index trips
// (search, seq_starts, block_table) of every tile but the block's first overlap data.
// One sweep of a tile's loads: UNROLL loads of this thread issued (dst[u] = -1: none), its
// (row t, column c) advanced past them.
template <int VEC, int OSZ, int UNROLL>
__device__ __forceinline__ void issue_sweep(const CacheGatherParams& p, const int2* loc, int row0, int base, int nvec,
                                            int& t, int& c, int step_t, int step_c,
                                            typename Vec<VEC>::T (&v)[UNROLL], i64 (&dst)[UNROLL]) {
    typedef typename Vec<VEC>::T V;
    const int vpr = p.row_vecs;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        dst[u] = -1;
        if (base + u * NG_THREADS < nvec) {
            const int2 l = loc[t];
            if (l.x >= 0) {
                const u8* src = p.src_cache + (i64)l.x * p.block_stride + (i64)l.y * p.entry_stride;
                v[u] = __ldg(reinterpret_cast<const V*>(src) + c);
                dst[u] = (i64)(row0 + t) * p.dst_row_stride + (i64)c * (VEC * OSZ);
            }
        }
        t += step_t;
        c += step_c;
        if (c >= vpr) { c -= vpr; ++t; }
    }
}

template <int VEC, int FP8, int OUT, int UNROLL, int SVEC>
__device__ __forceinline__ void store_sweep(const CacheGatherParams& p, const typename Vec<VEC>::T (&v)[UNROLL],
                                            const i64 (&dst)[UNROLL], float scale) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        if (dst[u] >= 0) put_vec<VEC, FP8, OUT, SVEC>(p.dst + dst[u], v[u], scale);
    }
}

// The requests of tile rows [row0, row0 + n) (two warps) and, after a barrier, each row's
// (block, slot) into loc (one thread per row).
__device__ __forceinline__ void locate_tile(const CacheGatherParams& p, int row0, int n, int2* loc, int* s_req) {
    const int tid = threadIdx.x;
    if (tid < 64) {
        const int r = warp_find_request(p.cu_seq_lens, p.batch, tid < 32 ? row0 : row0 + n - 1);
        if ((tid & 31) == 0) s_req[tid >> 5] = r;
    }
    __syncthreads();
    if (tid < n) loc[tid] = locate_row(p, row0 + tid, narrow_request(p.cu_seq_lens, s_req[0], s_req[1] + 1, row0 + tid));
}

template <int VEC, int FP8, int OUT, int UNROLL, int SVEC>
__device__ __forceinline__ void cache_gather_pipe(const CacheGatherParams& p) {
    typedef typename Vec<VEC>::T V;
    constexpr int OSZ = out_size(OUT);
    __shared__ int2 s_loc[2][NG_THREADS];
    __shared__ int s_req[2];

    const int tid = threadIdx.x;
    const int R = p.rows_per_cta;
    const u32 tiles = (u32)((p.num_rows + (i64)R - 1) / R);
    if (p.error != 0 && blockIdx.x == 0) check_cu_order(p);
    const float scale = FP8 ? __ldg(p.scale) : 1.0f;

    u32 tile = blockIdx.x;
    if (tile >= tiles) return;  // the whole block
    {
        const int row0 = (int)(tile * (u32)R);
        locate_tile(p, row0, min(R, p.num_rows - row0), s_loc[0], s_req);
        __syncthreads();
    }
    const int vpr = p.row_vecs;
    const int step_t = NG_THREADS / vpr, step_c = NG_THREADS - step_t * vpr;
    int cur = 0;
    for (; tile < tiles; tile += gridDim.x) {
        const int row0 = (int)(tile * (u32)R), n = min(R, p.num_rows - row0);
        const int nvec = n * vpr;
        const u32 next = tile + gridDim.x;  // < 2 * tiles < 2^32
        const int2* loc = s_loc[cur];
        int t = tid / vpr, c = tid - t * vpr;
        V v[UNROLL];
        i64 dst[UNROLL];
        issue_sweep<VEC, OSZ, UNROLL>(p, loc, row0, tid, nvec, t, c, step_t, step_c, v, dst);
        if (next < tiles) {  // the next tile's index trips, while these loads are in flight
            const int nrow0 = (int)(next * (u32)R);
            locate_tile(p, nrow0, min(R, p.num_rows - nrow0), s_loc[cur ^ 1], s_req);
        }
        store_sweep<VEC, FP8, OUT, UNROLL, SVEC>(p, v, dst, scale);
        for (int base = tid + NG_THREADS * UNROLL; base < nvec; base += NG_THREADS * UNROLL) {
            issue_sweep<VEC, OSZ, UNROLL>(p, loc, row0, base, nvec, t, c, step_t, step_c, v, dst);
            store_sweep<VEC, FP8, OUT, UNROLL, SVEC>(p, v, dst, scale);
        }
        __syncthreads();  // s_loc[cur ^ 1] complete; s_loc[cur] and s_req free
        cur ^= 1;
    }
}

// Entry points of this experiment's build (the "occupancy 8" tile kernel, and the pipe).
#define NG_EXP_ENTRIES(CONV, VEC, FP8, OUT, UNROLL, SVEC)                                                         \
    extern "C" __global__ void __launch_bounds__(NG_THREADS, 8) exp_occ8_##CONV(const CacheGatherParams p) {      \
        cache_gather_body<VEC, FP8, OUT, UNROLL, SVEC>(p);                                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NG_THREADS) exp_pipe_##CONV(const CacheGatherParams p) {         \
        cache_gather_pipe<VEC, FP8, OUT, UNROLL, SVEC>(p);                                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(NG_THREADS, 8) exp_pipe8_##CONV(const CacheGatherParams p) {     \
        cache_gather_pipe<VEC, FP8, OUT, UNROLL, SVEC>(p);                                                        \
    }
NG_EXP_ENTRIES(copy, 16, 0, 0, 4, 16)
NG_EXP_ENTRIES(e4m3_bf16, 8, 1, 1, 8, 16)
