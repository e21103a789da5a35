"""indexer_k_quant_and_cache in vectorized torch: the CPU path of the op, byte for byte what
the kernel writes (NaNs left out of each quant block's amax, every NaN code 0x7f, as vLLM's
kernel writes). Device-agnostic (the GPU tests and the benchmark also run it on CUDA tensors,
where its checks cost host syncs).

Unlike the kernel it can afford to look at slot_mapping, so it raises ValueError on a slot
past the cache before writing anything. Two tokens mapped to one slot: which one lands
is unspecified (as in the kernel)."""
from __future__ import annotations

import torch

from . import index_checks, paged_layout
from .fp8_torch import amax_without_nan, fp8_codes

_EXP = 0x7F800000     # fp32 exponent bits
_MANT = 0x7FFFFF      # fp32 mantissa bits
_HIGH = -0x800000     # int32 0xff800000: sign and exponent


def block_scales(amax: torch.Tensor, ue8m0: bool) -> torch.Tensor:
    """fp32 scales from fp32 amax: max(amax, 1e-4) / 448, or for ue8m0 the smallest power of
    two >= that (by the exponent bits, so exact). The divisor is a full tensor: CUDA torch
    turns a division by a Python number into a multiplication by its reciprocal, which is
    not the IEEE quotient the kernel computes."""
    scale = torch.clamp(amax, min=1e-4) / torch.full_like(amax, 448.0)
    if ue8m0:
        bits = scale.view(torch.int32)
        finite = (bits & _EXP) != _EXP
        scale = torch.where(finite, (bits + _MANT) & _HIGH, bits).view(torch.float32)
    return scale


def quant_torch(plan, k, kv_cache, slot_mapping) -> None:
    n = plan.num_tokens
    if n == 0:
        return
    slots = slot_mapping
    index_checks.slots_in_cache(slots, plan.num_slots)
    rows = torch.nonzero(slots >= 0).squeeze(1)  # padding (negative slots) is skipped
    if rows.numel() == 0:
        return
    s = slots[rows]
    hd, qbs = plan.head_dim, plan.quant_block_size
    nq = hd // qbs
    x = k[rows].float().view(-1, nq, qbs)
    scale = block_scales(amax_without_nan(x), plan.ue8m0)
    vals = fp8_codes(x / scale.unsqueeze(-1)).view(-1, hd)

    bs = plan.block_size
    k_dst, s_dst = paged_layout.views(kv_cache, plan.num_blocks, bs, plan.block_stride, hd, nq)
    blk, off = s // bs, s % bs
    k_dst[blk, off] = vals
    s_dst[blk, off] = scale.contiguous().view(torch.uint8)
