"""The paged indexer cache's byte layout (docs/contract.md §1), in one place: the check both ops
run on ``kv_cache`` and the views of its two regions that the torch paths read and write.

Block ``b`` starts ``block_stride`` bytes after block ``b - 1``; inside it, ``block_size``
token rows of ``head_dim`` fp8 bytes, then ``block_size`` rows of ``scale_words`` fp32 scales."""
from __future__ import annotations

import torch


def block_stride(kv_cache: torch.Tensor, kv_shape, head_dim: int, scale_words: int) -> int:
    """Check the paged cache's layout (docs/contract.md §1) for ``head_dim`` fp8 values and
    ``scale_words`` fp32 scales per token, and return the bytes between its blocks. Each
    block must be contiguous; the blocks themselves may be spaced out (a strided view)."""
    num_blocks, block_size, cache_stride = kv_shape
    if block_size < 1:
        raise ValueError(f"kv_cache: block_size (dim 1) must be >= 1, got shape {tuple(kv_shape)}")
    if cache_stride < head_dim + 4 * scale_words:
        raise ValueError(
            f"kv_cache: cache_stride (dim 2) must be at least head_dim + 4 * head_dim / quant_block_size = "
            f"{head_dim + 4 * scale_words}, got shape {tuple(kv_shape)}")
    s0, s1, s2 = kv_cache.stride()
    if (cache_stride > 1 and s2 != 1) or (block_size > 1 and s1 != cache_stride) or \
            (num_blocks > 1 and s0 < block_size * cache_stride):
        raise ValueError(
            f"kv_cache: each block must be contiguous (strides (>= {block_size * cache_stride}, {cache_stride}, 1)), "
            f"got strides {(s0, s1, s2)}")
    return s0 if num_blocks > 1 else block_size * cache_stride


def views(kv_cache: torch.Tensor, num_blocks: int, block_size: int, block_stride: int, head_dim: int,
          scale_words: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values uint8 [num_blocks, block_size, head_dim], scales uint8 [num_blocks,
    block_size, 4 * scale_words]): views into ``kv_cache``, for reading or writing."""
    kv = kv_cache.view(torch.uint8)
    base = kv.storage_offset()
    values = kv.as_strided((num_blocks, block_size, head_dim), (block_stride, head_dim, 1), base)
    scales = kv.as_strided((num_blocks, block_size, 4 * scale_words), (block_stride, 4 * scale_words, 1),
                           base + block_size * head_dim)
    return values, scales
