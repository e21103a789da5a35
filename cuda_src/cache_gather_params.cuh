// Parameters of the chunked-context cache gathers (cache_gather.cu), passed by value as one
// struct. The host declares the same fields in nvrtc_gather/kernels/cache_gather.py (PARAMS);
// a test compares them.
#pragma once
#include "common.cuh"

struct CacheGatherParams {
    const u8* src_cache;      // entry t of block b at src_cache + b * block_stride + t * entry_stride
    u8* dst;                  // row i at dst + i * dst_row_stride
    const i32* block_table;   // request r's blocks at block_table + r * bt_row_stride
    const i32* cu_seq_lens;   // batch + 1 entries: request r owns rows [cu[r], cu[r + 1])
    const i32* seq_starts;    // batch entries (each request's first position), or null: 0
    const float* scale;       // fp8 conversions: the one fp32 scale; else null (not read)
    i64 block_stride;         // bytes
    i64 entry_stride;         // bytes
    i64 dst_row_stride;       // bytes
    i64 bt_row_stride;        // elements
    i32 num_rows;             // rows the requests may cover (T); rows at or past it are never touched
    i32 batch;
    i32 max_blocks;           // block_table columns
    i32 num_blocks;
    i32 block_size;
    i32 row_vecs;             // source loads of VEC bytes per entry
    i32 rows_per_cta;         // rows one thread block moves (<= NG_THREADS)
    i32 reserved;             // 0: keeps the i32 fields even (the host packs fields back to back)
    i64* error;               // debug mode only, else null (always the last field)
};
