"""indexer_k_scatter in vectorized torch: the CPU path of the op, byte for byte what the kernel
writes. Device-agnostic (the GPU tests also run it on CUDA tensors, where its checks cost host
syncs).

Unlike the kernel it can afford to look at slot_mapping, so it raises ValueError on a slot past
the cache before writing anything. Two tokens mapped to one slot: which one lands is unspecified
(as in the kernel)."""
from __future__ import annotations

import torch

from . import index_checks, paged_layout


def scatter_torch(plan, k, k_scale, kv_cache, slot_mapping) -> None:
    n = plan.num_tokens
    if n == 0:
        return
    index_checks.slots_in_cache(slot_mapping, plan.num_slots)
    rows = torch.nonzero(slot_mapping >= 0).squeeze(1)  # padding (negative slots) is skipped
    if rows.numel() == 0:
        return
    s = slot_mapping[rows]
    bs = plan.block_size
    k_dst, s_dst = paged_layout.views(kv_cache, plan.num_blocks, bs, plan.block_stride, plan.head_dim,
                                      plan.scale_words)
    blk, off = s // bs, s % bs
    k_dst[blk, off] = k.view(torch.uint8)[rows]
    s_dst[blk, off] = scale_bytes(k_scale)[rows]


def scale_bytes(k_scale: torch.Tensor) -> torch.Tensor:
    """k_scale's rows as bytes, uint8 [rows, 4 * scale_words] (a view)."""
    two_d = k_scale.unsqueeze(1) if k_scale.dim() == 1 else k_scale
    if two_d.size(1) == 1:  # a size-1 dimension's stride is arbitrary; the byte view needs 1
        two_d = two_d.as_strided(two_d.shape, (two_d.stride(0), 1))
    return two_d.view(torch.uint8)
