// A cache slot's (block, row in block): shared by the kernels that write by slot_mapping
// (quant_cache.cu, indexer_k_scatter.cu).
#pragma once
#include "common.cuh"

// Cache block and row of a slot in [0, num_slots): shift and mask for power-of-two block
// sizes, 32-bit division for other slots below 2^31, 64-bit division beyond. off < block_size.
__device__ __forceinline__ void ng_split_slot(i64 s, const FastDiv& block_size, i64& blk, int& off) {
    if (block_size.shift >= 0) {
        blk = (i64)((u64)s >> block_size.shift);
        off = (int)s & (block_size.d - 1);
    } else if (s <= 0x7fffffffll) {
        const int b = (int)s / block_size.d;
        blk = b;
        off = (int)s - b * block_size.d;
    } else {
        blk = s / block_size.d;
        off = (int)(s - blk * block_size.d);
    }
}
