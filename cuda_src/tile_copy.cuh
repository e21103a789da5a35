// The copy phases of the tile gathers (gather_indexer_k.cu, index_k_read.cu): a block's rows,
// each parked in shared memory as (block id, token in block) by the block's search phase,
// copied out of the paged indexer cache (docs/contract.md section 1: a block's fp8 values,
// token-major, then its fp32 scales) into contiguous destination rows.
#pragma once
#include "common.cuh"

// Rows row0 .. row0 + n - 1 (n <= NG_THREADS) of the destination from s_loc[0 .. n-1]. A row
// whose block id is negative is skipped, or, with ZERO_SKIPPED, written as zeros. fp8 values
// move in KVEC-byte vectors, UNROLL loads in flight per thread; scales as 4-byte words.
template <int KVEC, int UNROLL, bool ZERO_SKIPPED>
__device__ __forceinline__ void copy_tile(const u8* kv_cache, i64 block_stride, int block_size, int head_dim,
                                          int scale_words, u8* dst_k, i64 dst_k_row_stride, u8* dst_scale,
                                          i64 dst_scale_row_stride, const int2* s_loc, int row0, int n) {
    typedef typename Vec<KVEC>::T V;
    const int tid = threadIdx.x;
    // A block's scales follow its values, at (i64)block_size * head_dim: computed where used (held
    // in a register across the value loop, it took the gather's entries from 40 to 47 registers).
    const FastDiv by_words(scale_words);
    // Scales first: this thread's first scale word is loaded before any store is issued,
    // so its DRAM round trip overlaps the fp8 loads instead of following them (the
    // compiler may not move a load above a store that could alias it).
    const int nwords = n * scale_words;
    u32 sw = 0;
    i64 sdst = -1;
    if (tid < nwords) {
        const int t = by_words(tid);
        const int w = tid - t * scale_words;
        const int2 loc = s_loc[t];
        if (loc.x >= 0) {
            sw = __ldg(reinterpret_cast<const u32*>(kv_cache + (i64)loc.x * block_stride +
                                                    (i64)block_size * head_dim + (i64)loc.y * scale_words * 4) + w);
        }
        if (loc.x >= 0 || ZERO_SKIPPED) sdst = (i64)(row0 + t) * dst_scale_row_stride + (i64)w * 4;
    }

    // fp8 values: vector i of the block's rows is token i / vpt, column i % vpt.
    const int vpt = head_dim / KVEC;
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
                    v[u] = __ldg(reinterpret_cast<const V*>(kv_cache + (i64)loc.x * block_stride +
                                                            (i64)loc.y * head_dim) + c);
                    dst[u] = (i64)(row0 + t) * dst_k_row_stride + (i64)c * KVEC;
                } else if (ZERO_SKIPPED) {
                    v[u] = V();
                    dst[u] = (i64)(row0 + t) * dst_k_row_stride + (i64)c * KVEC;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (dst[u] >= 0) *reinterpret_cast<V*>(dst_k + dst[u]) = v[u];
        }
    }

    if (sdst >= 0) *reinterpret_cast<u32*>(dst_scale + sdst) = sw;
    // The rest of the scale words (only when a block's tokens have more than NG_THREADS).
    for (int i = tid + NG_THREADS; i < nwords; i += NG_THREADS) {
        const int t = by_words(i);
        const int w = i - t * scale_words;
        const int2 loc = s_loc[t];
        u32 x = 0;
        if (loc.x >= 0) {
            x = __ldg(reinterpret_cast<const u32*>(kv_cache + (i64)loc.x * block_stride +
                                                   (i64)block_size * head_dim + (i64)loc.y * scale_words * 4) + w);
        }
        if (loc.x >= 0 || ZERO_SKIPPED) *(reinterpret_cast<u32*>(dst_scale + (i64)(row0 + t) * dst_scale_row_stride) + w) = x;
    }
}

// One row copied by one warp (the tiny shapes, a warp a row): vpt vectors of V from src to dst,
// scale_words 4-byte words from ssrc to sdst. The first vector and scale word are both loaded
// before either is stored, so the two share one DRAM round trip: the scale word through
// ng_ld_ordered, which ptxas cannot sink below the value store (an .nc load it did).
template <typename V>
__device__ __forceinline__ void copy_row_by_warp(const V* src, V* dst, int vpt, const u32* ssrc, u32* sdst,
                                                 int scale_words, int lane) {
    const bool has_v = lane < vpt, has_s = lane < scale_words;
    V v;
    u32 sw = 0;
    if (has_v) v = __ldg(src + lane);
    if (has_s) sw = ng_ld_ordered(ssrc + lane);
    if (has_v) dst[lane] = v;
    if (has_s) sdst[lane] = sw;
    for (int c = lane + 32; c < vpt; c += 32) dst[c] = __ldg(src + c);
    for (int c = lane + 32; c < scale_words; c += 32) sdst[c] = __ldg(ssrc + c);
}
