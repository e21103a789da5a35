// Parameters of the indexer_k_scatter kernels, passed by value as one struct. The host declares
// the same fields in nvrtc_gather/kernels/indexer_k_scatter.py (PARAMS); a test compares them.
#pragma once
#include "common.cuh"

struct ScatterParams {
    const u8* k;              // token i's head_dim fp8 bytes at k + i * k_row_stride
    const u8* k_scale;        // token i's scale_words fp32 scales at k_scale + i * scale_row_stride
    const u8* slot_mapping;   // num_tokens entries, int64 or int32 (the entry point's ST)
    u8* kv_cache;             // block b starts at kv_cache + b * block_stride
    i64 k_row_stride;         // bytes
    i64 scale_row_stride;     // bytes
    i64 block_stride;         // bytes
    i64 num_slots;            // num_blocks * block_size
    i32 num_tokens;           // slot_mapping entries: the rows of k and k_scale that are written
    i32 block_size;
    i32 head_dim;             // bytes of fp8 values per token
    i32 scale_words;          // fp32 scales per token
    i64* error;               // debug mode only, else null (always the last field)
};
