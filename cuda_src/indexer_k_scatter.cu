// indexer_k_scatter: already-quantized fp8 rows and their fp32 scales written byte for byte
// into the paged indexer cache (contract: docs/contract.md, "indexer_k_scatter"): SGLang's
// SetKAndS. Row i < num_tokens goes to slot s = slot_mapping[i] (block s / block_size, row
// s % block_size); s < 0 is padding and skipped, s >= num_slots is skipped (and reported in
// debug mode). Slot values are untrusted: no value of them leads outside the cache.
//
// Work split: one thread per unit, a unit being one VEC-byte vector of a token's values or one
// of its 4-byte scale words (values first, then scales), so neighbouring threads store
// neighbouring bytes of one cache row. Slots are int64 (vLLM) or int32 (SGLang), by entry point. A grid-stride loop covers any number of units (64-bit).
// FIXED: the entries of the spec's fixed layout, its sizes as constants (fixed_layout.cuh).
#include "fixed_layout.cuh"
#include "scatter_params.cuh"
#include "slot_split.cuh"

template <int VEC, typename ST, bool FIXED>
__device__ __forceinline__ void scatter_body(const ScatterParams& p) {
    typedef typename Vec<VEC>::T V;
    const LayoutSizes<FIXED> sz(p.block_size, p.head_dim, p.scale_words);
    const int vpt = sz.head_dim / VEC;  // vectors per token; the host guarantees head_dim % VEC == 0
    const i64 nvec = (i64)p.num_tokens * vpt;
    const i64 units = nvec + (i64)p.num_tokens * sz.scale_words;
    const FastDiv block_size(sz.page_size), by_vpt(vpt), by_words(sz.scale_words);
    // A unit's token by a shift where both counts per token are powers of two and units fit 31 bits
    const bool shifts = units <= 0x7fffffff && by_vpt.shift >= 0 && by_words.shift >= 0;
    for (i64 u = (i64)blockIdx.x * NG_THREADS + threadIdx.x; u < units; u += (i64)gridDim.x * NG_THREADS) {
        const bool is_value = u < nvec;
        const i64 w = is_value ? u : u - nvec;
        const int per = is_value ? vpt : sz.scale_words;
        const int t = shifts ? (int)w >> (is_value ? by_vpt.shift : by_words.shift) : (int)(w / per);  // < num_tokens
        const int c = (int)(w - (i64)t * per);
        // The slot and this unit's bytes, both loaded before either is looked at: one DRAM round
        // trip, not the slot's then the data's (the data does not depend on the slot, and row t
        // of k and k_scale exists whatever the slot: the host checks their rows).
        const ST slot = ng_ldg_now(reinterpret_cast<const ST*>(p.slot_mapping) + t);
        V v;
        u32 x = 0;
        if (is_value) {
            v = __ldg(reinterpret_cast<const V*>(p.k + (i64)t * p.k_row_stride) + c);
        } else {
            x = __ldg(reinterpret_cast<const u32*>(p.k_scale + (i64)t * p.scale_row_stride) + c);
        }
        const i64 s = (i64)slot;
        if (s < 0) continue;  // padding
        if (s >= p.num_slots) {
            if (c == 0 && is_value) ng_report(p.error, NG_ERR_SLOT, t, s, p.num_slots);
            continue;
        }
        i64 blk;
        int off;
        ng_split_slot(s, block_size, blk, off);
        u8* base = p.kv_cache + blk * p.block_stride;
        if (is_value) {
            *(reinterpret_cast<V*>(base + (i64)off * sz.head_dim) + c) = v;
        } else {
            *(reinterpret_cast<u32*>(base + (i64)sz.page_size * sz.head_dim + (i64)off * sz.scale_words * 4) + c) = x;
        }
    }
}
