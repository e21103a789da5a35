"""vLLM's ``"mxfp8"`` indexer-cache scale format, on top of nvrtc_gather's ``"ue8m0"`` write.

vLLM (0.33: ``sparse_attn_indexer.py`` passes ``"mxfp8"`` when ``mqa_logits_use_mx_scales()``,
SM100) stores each token's power-of-two scale as four equal UE8M0 bytes (its biased exponent)
instead of the fp32 scale; the fp8 values are those of the ``"ue8m0"`` write (dividing by a
power of two is exact). vLLM's Triton writers spell the packing out
(``vllm/v1/attention/ops/common.py: pack_ue8m0_x4``: ``((bits >> 23) & 0xFF) * 0x01010101``),
and its CUDA op requires ``head_dim == quant_block_size == 128`` for it.

So the adapter writes with ``"ue8m0"``, then rewrites the scale word of every slot it wrote,
with torch ops on the device: no host sync, capturable in a CUDA graph."""
from __future__ import annotations

import torch

from ..ops import paged_layout

MX_HEAD_DIM = 128


def check(k: torch.Tensor, quant_block_size: int) -> None:
    """vLLM's own condition for mxfp8 scales, raised before anything is written."""
    head_dim = k.size(1) if isinstance(k, torch.Tensor) and k.dim() == 2 else None
    if head_dim != MX_HEAD_DIM or quant_block_size != MX_HEAD_DIM:
        raise ValueError(f"kv_cache_dtype: \"mxfp8\" scales require head_dim == quant_block_size == 128 (as vLLM's "
                         f"op), got head_dim={head_dim}, quant_block_size={quant_block_size}")


def pack_written_scales(kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Replace the fp32 power-of-two scale of each slot in ``slot_mapping`` (negative or past the
    cache: not written, skipped) by its exponent byte repeated four times."""
    num_tokens = slot_mapping.size(0)
    if num_tokens == 0:
        return
    num_blocks, block_size, _ = kv_cache.shape
    stride = paged_layout.block_stride(kv_cache, kv_cache.shape, MX_HEAD_DIM, 1)
    _, scales = paged_layout.views(kv_cache, num_blocks, block_size, stride, MX_HEAD_DIM, 1)  # [blocks, size, 4]
    num_slots = num_blocks * block_size
    valid = (slot_mapping >= 0) & (slot_mapping < num_slots)
    # Tokens that wrote nothing are pointed at the first written slot, so that every index_put
    # to one slot carries the same value (computed from the same old bytes): no race, no sync.
    first = torch.argmax(valid.to(torch.uint8))
    target = torch.where(valid, slot_mapping, slot_mapping[first]).clamp(0, num_slots - 1)
    block, offset = target // block_size, target % block_size
    old = scales[block, offset]  # [num_tokens, 4]: little-endian fp32 bytes
    exponent = ((old[:, 3] & 0x7F) << 1) | (old[:, 2] >> 7)
    packed = exponent[:, None].expand(num_tokens, 4)
    scales.index_put_((block, offset), torch.where(valid.any(), packed, old))
