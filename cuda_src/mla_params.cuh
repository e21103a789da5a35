// Parameters of the MLA-cache kernels (mla_write.cu, mla_gather.cu), passed by value as one
// struct each. The host declares the same fields in nvrtc_gather/kernels/mla_cache.py
// (WRITE_PARAMS, GATHER_PARAMS); a test compares them.
#pragma once
#include "common.cuh"

struct MlaWriteParams {
    const u8* kv_c;           // token i at kv_c + i * kv_c_row_stride (kv_lora_rank elements)
    const u8* k_pe;           // token i at k_pe + i * k_pe_row_stride (pe_dim elements)
    const i64* slot_mapping;  // num_tokens entries; < 0: padding
    const float* scale;       // plain fp8 format: the per-tensor scale (one fp32 on the device)
    u8* kv_cache;             // slot s at kv_cache + (s / block_size) * block_stride + (s % block_size) * entry_stride
    i64 kv_c_row_stride;      // bytes
    i64 k_pe_row_stride;      // bytes
    i64 block_stride;         // bytes
    i64 entry_stride;         // bytes
    i64 num_slots;            // num_blocks * block_size
    // An even number of i32 fields: the host packs the fields back to back (jit/spec.py
    // ParamStruct refuses an order the compiler would pad).
    i32 flags;                // NG_MLA_* below
    i32 tokens_per_warp;      // 1..NG_MLA_TPW
    i32 num_tokens;
    i32 block_size;
    i32 kv_lora_rank;         // kv_c elements per token
    i32 pe_dim;               // k_pe elements per token
    i64* error;               // debug mode only, else null (always the last field)
};
#define NG_MLA_POW2_SCALES 1  // fp8_ds_mla: tile scales rounded up to a power of two (vLLM's current rule)
#define NG_MLA_SKIP_SCALE 2   // plain fp8: the per-tensor scale is taken as 1 (not read)

struct MlaGatherParams {
    const u8* src_cache;      // row t of block b at src_cache + b * block_stride + t * entry_stride
    u8* dst;                  // bf16 [num_rows, 576], row r at dst + r * dst_row_stride
    const i32* block_table;   // request r's blocks at block_table + r * bt_row_stride
    const i32* workspace_starts;  // batch entries: each request's first dst row
    const i32* seq_starts;    // batch entries (each request's first token), or null: 0
    i64 block_stride;         // bytes
    i64 entry_stride;         // bytes
    i64 dst_row_stride;       // bytes
    i64 bt_row_stride;        // elements
    i32 num_rows;             // dst rows: the last request runs to here
    i32 batch;
    i32 max_blocks;           // block_table columns
    i32 num_blocks;
    i32 block_size;
    i32 rows_per_cta;         // dst rows one thread block converts
    i64* error;               // debug mode only, else null (always the last field)
};
