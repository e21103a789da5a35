// Shared helpers for nvrtc_gather kernels.
// NVRTC has no standard headers (<cstdint> never works there), so the few
// fixed-width types we need are spelled out here.
#pragma once

typedef unsigned char u8;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;

// Threads per block of every entry point: -DNG_THREADS from the module's spec
// (jit/spec.py: KernelModule.threads), which the launcher uses too.
#ifndef NG_THREADS
#error "NG_THREADS is set by the module's spec (-DNG_THREADS)"
#endif

// Vector types used for the byte copies, chosen by the host from what the
// pointers and strides allow (16, 8 or 4 bytes).
template <int BYTES> struct Vec;
template <> struct Vec<16> { typedef uint4 T; };
template <> struct Vec<8> { typedef uint2 T; };
template <> struct Vec<4> { typedef u32 T; };

// Error codes reported in debug mode (NVRTC_GATHER_DEBUG=1). The host decodes them with
// nvrtc_gather/jit/debug_errors.py's table; tests/jit/test_spec.py checks the two agree.
#define NG_ERR_ROW_UNOWNED 1        // a row below cu_seq_lens[-1] belongs to no request
#define NG_ERR_BLOCK_INDEX 2        // token needs a block_table column >= max_blocks
#define NG_ERR_BLOCK_ID 3           // block_table entry outside [0, num_blocks)
#define NG_ERR_CU_START 4           // cu_seq_lens[0] != 0
#define NG_ERR_CU_DECREASING 5      // cu_seq_lens decreases
#define NG_ERR_CU_TOTAL 6           // cu_seq_lens[-1] > rows of the destination
#define NG_ERR_SLOT 7               // slot_mapping entry past the cache's last slot
#define NG_ERR_WS_ORDER 8           // workspace_starts entry negative or below the one before
#define NG_ERR_SEQ_START 9          // seq_starts entry negative
#define NG_ERR_CU_NEGATIVE 10       // cu_seq_lens entry negative (where a nonzero start is allowed)
#define NG_ERR_LENGTH 11            // a request length negative or past INT32_MAX
#define NG_ERR_LENGTH_SUM 12        // the lengths sum to more than the destination's rows
#define NG_ERR_PAGE_INDEX 13        // token needs a page_table column >= its columns
#define NG_ERR_PAGE_ID 14           // page_table entry outside [0, num_pages)
#define NG_ERR_TOKEN_ID 15          // a flat token id outside [0, num_pages * page_size)
#define NG_ERR_GATHER_LEN 16        // a request gathers more tokens than its sequence has
#define NG_ERR_OUT_ROWS 17          // a request's row lies past out's rows

// x / d for x >= 0, d > 0: a shift when d is a power of two (block sizes, vectors
// per row and scales per row usually are), since integer division costs ~20
// dependent instructions and these sit on the latency-bound path of small calls.
struct FastDiv {
    int d, shift;
    __device__ __forceinline__ explicit FastDiv(int d_) : d(d_), shift((d_ & (d_ - 1)) == 0 ? __ffs(d_) - 1 : -1) {}
    __device__ __forceinline__ int operator()(int x) const { return shift >= 0 ? x >> shift : x / d; }
};

// Record the first error only: err[0] = code, err[1..3] = details.
// err is null unless debug mode is on.
__device__ __forceinline__ void ng_report(i64* err, int code, i64 a, i64 b, i64 c) {
    if (err == 0) return;
    if (atomicCAS((u64*)err, 0ull, (u64)code) == 0ull) {
        err[1] = a;
        err[2] = b;
        err[3] = c;
    }
}

// A read-only load issued here, in program order. The compiler may sink a plain load whose
// value one branch alone uses into that branch, that is after the loads it was meant to
// overlap; a volatile asm statement is not moved.
template <typename T>  // a 4- or 8-byte integer
__device__ __forceinline__ T ng_ldg_now(const T* p) {
#ifdef __CUDA_ARCH__
    T v;
    if constexpr (sizeof(T) == 8) {
        asm volatile("ld.global.nc.b64 %0, [%1];" : "=l"(v) : "l"(p));
    } else {
        asm volatile("ld.global.nc.b32 %0, [%1];" : "=r"(v) : "l"(p));
    }
    return v;
#else
    return __ldg(p);
#endif
}

// A 4-byte load that stays ahead of the stores written after it: a coherent ld.global, which
// ptxas may not move below a store that could alias it. An .nc load (__ldg, ng_ldg_now) it may:
// it scheduled a warp-row copy's scale load after the row's value store, so the scale's DRAM
// round trip followed the values' instead of sharing it (sm_90 SASS; tests/jit/test_sass_order.py).
__device__ __forceinline__ u32 ng_ld_ordered(const u32* p) {
#ifdef __CUDA_ARCH__
    u32 v;
    asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return *p;
#endif
}
