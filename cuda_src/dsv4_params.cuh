// Parameters of the DeepSeek-V4 record gathers (dsv4_gather.cu), passed by value as one
// struct. The host declares the same fields in nvrtc_gather/kernels/dsv4_gather.py (PARAMS);
// a test compares them. Everything up to tiles_per_req is written by each call.
#pragma once
#include "common.cuh"

struct DsV4GatherParams {
    const u8* cache;         // page p at cache + p * page_stride (docs/contract.md, "DeepSeek-V4")
    u8* out;                 // bf16 or fp8 rows of 512 values
    const u8* ids;           // SGLang: flat token ids (the entry's IT); vLLM: block_table (int32)
    const u8* seq_lens;      // vLLM: int32 [requests]; SGLang: unused
    const u8* gather_lens;   // vLLM: int32 [requests], or null (gather seq_lens); SGLang: unused
    i64 rows;                // SGLang: rows of out written (ids, then zero rows); vLLM: out's rows per request
    i64 num_ids;             // SGLang: ids (rows below it read one); vLLM: requests
    i64 out_row_stride;      // bytes
    i64 out_req_stride;      // bytes (vLLM)
    i64 ids_stride;          // elements: SGLang's id stride; vLLM: block_table's row stride
    i64 max_blocks;          // vLLM: block_table's columns
    i64 offset;              // vLLM: a request's first row in out
    i64 tiles_per_req;       // vLLM: thread blocks per request
    i64 page_stride;         // bytes
    i64 num_slots;           // num_pages * page_size
    i32 page_size;
    i32 num_pages;
    i64* error;              // debug mode only, else null (always the last field)
};
