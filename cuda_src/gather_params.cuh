// Parameters of the gather kernels, passed by value as one struct. The host declares the
// same fields in nvrtc_gather/kernels/gather.py (PARAMS); a test compares them.
#pragma once
#include "common.cuh"

struct GatherParams {
    const u8* kv_cache;        // block b starts at kv_cache + b * block_stride
    u8* dst_k;                 // row i at dst_k + i * dst_k_row_stride
    u8* dst_scale;             // row i at dst_scale + i * dst_scale_row_stride
    const i32* block_table;    // request r at block_table + r * bt_row_stride
    const i32* cu_seq_lens;    // batch + 1 entries
    i64 block_stride;          // bytes
    i64 dst_k_row_stride;      // bytes
    i64 dst_scale_row_stride;  // bytes
    i64 bt_row_stride;         // elements
    i32 num_tokens;            // rows of dst_k (an upper bound of cu_seq_lens[-1])
    i32 batch;
    i32 max_blocks;
    i32 num_blocks;
    i32 block_size;
    i32 head_dim;              // fp8 bytes per token
    i32 scale_words;           // fp32 scales per token (head_dim / quant_block_size)
    i32 tokens_per_cta;        // <= NG_THREADS
    i64* error;                // debug mode only, else null (always the last field)
};
