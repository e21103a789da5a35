// cp_gather_and_upconvert_fp8_kv_cache: each request's tokens from the paged fp8_ds_mla cache
// (656-byte records, mla_write.cu) into contiguous bf16 rows of 576 values (contract:
// docs/contract.md section 5).
//
// Request r (r < batch) owns dst rows [workspace_starts[r], next), next being
// workspace_starts[r + 1] or, for the last request, num_rows; row t of it holds the request's
// token seq_starts[r] + (t - workspace_starts[r]) (seq_starts null: 0), read through
// block_table[r]. Rows before workspace_starts[0] belong to no request and are never touched.
// Per row: values 0-511 = bf16(fp32(code) * tile scale) (one fp32 multiply, then nearest
// even; NaN -> 0x7fff), values 512-575 = the record's 64 bf16 k_pe values, bit for bit.
//
// Work split: block b owns dst rows [b * R, b * R + R), R = rows_per_cta <= NG_THREADS.
//  1. Two warps find the requests of the first and last of those rows (request_search.cuh).
//  2. One thread per row narrows to its own request in that range, checks every index, and
//     parks the row's (block, token) in shared memory (block -1: skip the row).
//  3. One warp per row converts it: lane l decodes the codes [8l, 8l + 8) and [256 + 8l, ...)
//     (two 8-byte loads, the record's 4 scales in one 16-byte load) into two 16-byte stores, so
//     every access instruction of the warp covers one contiguous run; lanes 0-7 copy k_pe. Each
//     warp loads two rows before storing either (bytes in flight).
// VEC = 4: the same with 4-byte accesses, for a cache or dst not 16-byte aligned.
// Index values are untrusted: any int32 in workspace_starts, seq_starts and block_table leaves
// every access in bounds; rows whose indices are bad are skipped, and reported in debug mode.
#include "mla_params.cuh"
#include "half_bits.cuh"
#include "request_search.cuh"


// Debug mode only: workspace_starts as a whole (non-negative, non-decreasing), by one block.
__device__ __forceinline__ void check_workspace_starts(const MlaGatherParams& p) {
    for (u32 r = threadIdx.x; r < (u32)p.batch; r += NG_THREADS) {
        const int a = __ldg(p.workspace_starts + r);
        const int before = r ? __ldg(p.workspace_starts + r - 1) : 0;
        if (a < before) ng_report(p.error, NG_ERR_WS_ORDER, r, a, before);
    }
}

// 8 fp8 codes (2 words) times their tile's scale -> 8 bf16 (4 words).
__device__ __forceinline__ void mla_upconvert8(const u32* c, float scale, u32* out) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float a, b, d, e;
        ng_float2_from_fp8e4m3x2(c[i] & 0xffffu, a, b);
        ng_float2_from_fp8e4m3x2(c[i] >> 16, d, e);
        out[2 * i] = ng_bf16x2_from_float(__fmul_rn(a, scale), __fmul_rn(b, scale));
        out[2 * i + 1] = ng_bf16x2_from_float(__fmul_rn(d, scale), __fmul_rn(e, scale));
    }
}

// One row's loads for one lane: codes [8l, 8l + 8) (half A, tile l / 16) and [256 + 8l, ...)
// (half B, tile 2 + l / 16) with their scales, and (lanes 0-7) 8 k_pe values. This split makes
// every load and store instruction of the warp one contiguous run.
template <int VEC>
struct MlaRow {
    u32 a[2], b[2], pe[4];
    float scale_a, scale_b;
    bool live;

    __device__ __forceinline__ void load(const MlaGatherParams& p, int2 loc, int lane) {
        live = loc.x >= 0;
        if (!live) return;
        const u8* rec = p.src_cache + (i64)loc.x * p.block_stride + (i64)loc.y * p.entry_stride;
        const int hi = lane >> 4;
        if (VEC == 16) {
            const uint2 x = __ldg(reinterpret_cast<const uint2*>(rec) + lane);
            const uint2 y = __ldg(reinterpret_cast<const uint2*>(rec + 256) + lane);
            const uint4 s = __ldg(reinterpret_cast<const uint4*>(rec + 512));
            a[0] = x.x; a[1] = x.y; b[0] = y.x; b[1] = y.y;
            scale_a = __uint_as_float(hi ? s.y : s.x);
            scale_b = __uint_as_float(hi ? s.w : s.z);
            if (lane < 8) {
                const uint4 e = __ldg(reinterpret_cast<const uint4*>(rec + 528) + lane);
                pe[0] = e.x; pe[1] = e.y; pe[2] = e.z; pe[3] = e.w;
            }
        } else {
            const u32* w = reinterpret_cast<const u32*>(rec);
            a[0] = __ldg(w + 2 * lane); a[1] = __ldg(w + 2 * lane + 1);
            b[0] = __ldg(w + 64 + 2 * lane); b[1] = __ldg(w + 64 + 2 * lane + 1);
            scale_a = __uint_as_float(__ldg(w + 128 + hi));
            scale_b = __uint_as_float(__ldg(w + 130 + hi));
            if (lane < 8) {
#pragma unroll
                for (int i = 0; i < 4; ++i) pe[i] = __ldg(w + 132 + 4 * lane + i);
            }
        }
    }

    __device__ __forceinline__ void store(const MlaGatherParams& p, int row, int lane) const {
        if (!live) return;
        u32 oa[4], ob[4];
        mla_upconvert8(a, scale_a, oa);
        mla_upconvert8(b, scale_b, ob);
        u8* dst = p.dst + (i64)row * p.dst_row_stride;
        if (VEC == 16) {
            uint4 x, y;
            x.x = oa[0]; x.y = oa[1]; x.z = oa[2]; x.w = oa[3];
            y.x = ob[0]; y.y = ob[1]; y.z = ob[2]; y.w = ob[3];
            reinterpret_cast<uint4*>(dst)[lane] = x;
            reinterpret_cast<uint4*>(dst + 512)[lane] = y;
            if (lane < 8) {
                uint4 e;
                e.x = pe[0]; e.y = pe[1]; e.z = pe[2]; e.w = pe[3];
                reinterpret_cast<uint4*>(dst + 1024)[lane] = e;
            }
        } else {
            u32* w = reinterpret_cast<u32*>(dst);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                w[4 * lane + i] = oa[i];
                w[128 + 4 * lane + i] = ob[i];
            }
            if (lane < 8) {
#pragma unroll
                for (int i = 0; i < 4; ++i) w[256 + 4 * lane + i] = pe[i];
            }
        }
    }
};

template <int VEC>
__device__ __forceinline__ void mla_gather_body(const MlaGatherParams& p) {
    __shared__ int2 s_loc[NG_THREADS];  // (block id, token in block) of each row; block -1 = skip
    __shared__ int s_req[2];            // requests of the block's first and last rows

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const i32* ws = p.workspace_starts;
    const int row0 = blockIdx.x * p.rows_per_cta;  // < num_rows + NG_THREADS <= INT32_MAX (host)
    const int n = min(p.rows_per_cta, p.num_rows - row0);
    if (p.error != 0 && blockIdx.x == 0) check_workspace_starts(p);

    if (tid < 64) {
        const int r = warp_find_request(ws, p.batch, tid < 32 ? row0 : row0 + n - 1);
        if (lane == 0) s_req[warp] = r;
    }
    __syncthreads();

    if (tid < n) {
        const int row = row0 + tid;
        const int r = narrow_request(ws, s_req[0], s_req[1] + 1, row);  // [lo, hi) empty if the starts decrease
        const int start = __ldg(ws + r);
        const int stop = r + 1 < p.batch ? __ldg(ws + r + 1) : p.num_rows;
        int2 loc = make_int2(-1, 0);
        if (start <= row && row < stop) {  // else: a row before ws[0], or starts out of order
            const int first = p.seq_starts ? __ldg(p.seq_starts + r) : 0;
            if (start < 0) {
                ng_report(p.error, NG_ERR_WS_ORDER, r, start, 0);
            } else if (first < 0) {
                ng_report(p.error, NG_ERR_SEQ_START, r, first, 0);
            } else {
                const u32 pos = (u32)first + (u32)(row - start);  // < 2^32: both terms < 2^31
                const u32 j = pos / (u32)p.block_size;
                if (j < (u32)p.max_blocks) {
                    const int b = __ldg(p.block_table + (i64)r * p.bt_row_stride + j);
                    if (b >= 0 && b < p.num_blocks) {
                        loc = make_int2(b, (int)(pos - j * (u32)p.block_size));
                    } else {
                        ng_report(p.error, NG_ERR_BLOCK_ID, row, r, b);
                    }
                } else {
                    ng_report(p.error, NG_ERR_BLOCK_INDEX, row, r, j);
                }
            }
        }
        s_loc[tid] = loc;
    }
    __syncthreads();

    const int warps = NG_THREADS / 32;
    for (int t = warp; t < n; t += 2 * warps) {
        MlaRow<VEC> a, b;
        a.load(p, s_loc[t], lane);
        const int t2 = t + warps;
        b.live = false;
        if (t2 < n) b.load(p, s_loc[t2], lane);
        a.store(p, row0 + t, lane);
        b.store(p, row0 + t2, lane);
    }
}

// Entry points: none here (nvrtc_gather/kernels/mla_cache.py names them; the JIT appends them).
