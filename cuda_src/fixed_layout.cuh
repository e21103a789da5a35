// SGLang's default indexer layout as compile-time constants, for the entries the host launches
// for that layout alone (kernels/index_k_read.py FIXED_LAYOUT: page or block size 64, head_dim
// 128, one fp32 scale a token; the spec passes it as the NG_FIXED_* defines). With constants ptxas
// folds the layout's divisions and scale-word loops, and the entry's code is smaller (sm_90):
// after the L2 flush a kernel's code comes from DRAM too.
#pragma once
#include "common.cuh"

#if !defined(NG_FIXED_PAGE_SIZE) || !defined(NG_FIXED_HEAD_DIM) || !defined(NG_FIXED_SCALE_WORDS)
#error "NG_FIXED_PAGE_SIZE, NG_FIXED_HEAD_DIM and NG_FIXED_SCALE_WORDS are set by the spec (kernels/index_k_read.py)"
#endif

// The layout fields a body reads: the call's, or with FIXED the constants.
template <bool FIXED> struct LayoutSizes {
    int page_size, head_dim, scale_words;
    __device__ __forceinline__ LayoutSizes(int page_size_, int head_dim_, int scale_words_)
        : page_size(FIXED ? NG_FIXED_PAGE_SIZE : page_size_), head_dim(FIXED ? NG_FIXED_HEAD_DIM : head_dim_),
          scale_words(FIXED ? NG_FIXED_SCALE_WORDS : scale_words_) {}
};
