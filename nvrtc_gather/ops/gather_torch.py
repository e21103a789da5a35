"""The gather in vectorized torch: the CPU path of the op, byte-for-byte what the kernel
writes. Device-agnostic (the benchmark and the large GPU tests also run it on CUDA
tensors, where its checks cost host syncs).

Unlike the kernel it can afford to look at the index tensors, so it checks them all and
raises ValueError before writing anything."""
from __future__ import annotations

import torch

from . import index_checks, paged_layout


def gather_torch(plan, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> None:
    dev = kv_cache.device
    cu = cu_seq_lens.to(torch.int64)
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seq_lens: cu_seq_lens[0] must be 0, got {int(cu[0])}")
    lens = cu[1:] - cu[:-1]
    if plan.batch and int(lens.min()) < 0:
        r = int(torch.nonzero(lens < 0)[0])
        raise ValueError(f"cu_seq_lens: must be non-decreasing, but entry {r} = {int(cu[r])} > "
                         f"entry {r + 1} = {int(cu[r + 1])}")
    total = int(cu[-1])
    if total > plan.num_tokens:
        raise ValueError(f"cu_seq_lens: cu_seq_lens[-1] = {total} exceeds the {plan.num_tokens} rows of dst_k")
    if total == 0:
        return
    req = torch.repeat_interleave(torch.arange(plan.batch, device=dev), lens, output_size=total)
    pos = torch.arange(total, device=dev) - cu[req]
    col = pos // plan.block_size
    tok = pos % plan.block_size
    blk = index_checks.physical_blocks(
        block_table, req, col, plan.max_blocks, plan.num_blocks,
        lambda i: f"block_table: request {int(req[i])} has {int(lens[req[i]])} tokens, more than its "
                  f"{plan.max_blocks} columns of {plan.block_size}-token blocks hold")

    k_src, s_src = paged_layout.views(kv_cache, plan.num_blocks, plan.block_size, plan.block_stride,
                                      plan.head_dim, plan.scale_words)
    # Both gathered before either is written; the scales are copied as int32 words when
    # dst_scale is float32 (a view of equal element size works for every stride, and copies bits).
    k_rows, s_rows = k_src[blk, tok], s_src[blk, tok]
    if dst_scale.dtype != torch.uint8:
        s_rows = s_rows.view(torch.int32)
    dst_k.view(torch.uint8)[:total] = k_rows
    dst_scale.view(s_rows.dtype)[:total] = s_rows
