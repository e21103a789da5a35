// Parameters of the indexer_k_quant_and_cache kernels, passed by value as one struct. The host
// declares the same fields in nvrtc_gather/kernels/indexer_k_quant.py (PARAMS); a test compares them.
#pragma once
#include "common.cuh"

struct QuantParams {
    const u8* k;              // token i at k + i * k_row_stride
    const i64* slot_mapping;  // num_tokens entries
    u8* kv_cache;             // block b starts at kv_cache + b * block_stride
    i64 k_row_stride;         // bytes
    i64 block_stride;         // bytes
    i64 num_slots;            // num_blocks * block_size
    i32 num_tokens;           // slot_mapping entries: the rows of k that are written
    i32 block_size;
    i32 head_dim;
    i32 quant_block_size;     // elements per scale; divides head_dim
    i32 tokens_per_pass;      // vector kernels: tokens one pass of the block covers (NG_THREADS / lanes)
    i32 ue8m0;                // 1: scales rounded up to a power of two
    i64* error;               // debug mode only, else null (always the last field)
};
