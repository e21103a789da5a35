// Parameters of the index-K read kernels (index_k_read.cu), passed by value as one struct. The
// host declares the same fields in nvrtc_gather/kernels/index_k_read.py (PARAMS); a test
// compares them. num_rows and tokens_per_cta lead with the pointers: a call writes them.
#pragma once
#include "common.cuh"

struct IndexKReadParams {
    const u8* kv_cache;        // page b starts at kv_cache + b * page_stride
    u8* dst_k;                 // row i at dst_k + i * dst_k_row_stride
    u8* dst_scale;             // row i at dst_scale + i * dst_scale_row_stride
    const u8* seq_lens;        // batch lengths, int32 or int64 (the entry point's LT)
    const u8* page_table;      // request r's column j at element r * pt_row_stride + j * pt_col_stride (PT)
    i64 num_rows;              // rows of dst_k and dst_scale (SGLang's seq_len_sum), per call
    i64 tokens_per_cta;        // rows per thread block, <= NG_THREADS, per call
    i64 page_stride;           // bytes
    i64 dst_k_row_stride;      // bytes
    i64 dst_scale_row_stride;  // bytes
    i64 pt_row_stride;         // elements
    i64 pt_col_stride;         // elements
    i64 seq_lens_stride;       // elements
    i32 batch;
    i32 max_pages;             // columns of page_table
    i32 num_pages;
    i32 page_size;
    i32 head_dim;              // fp8 bytes per token
    i32 scale_words;           // fp32 scales per token
    i64* error;                // debug mode only, else null (always the last field)
};
