"""The ops registered with torch.library as ``torch.ops.nvrtc_gather.<name>``, so that
``torch.compile(fullgraph=True)`` traces callers without a graph break.

Each op declares the tensors it mutates and has a fake (meta) implementation that does
nothing: the ops return None and only write into their arguments. The plain Python
functions stay the documented entry points (cheaper to call: benchmarks/README.md);
these wrappers call them."""
from __future__ import annotations

import torch
from torch import Tensor

from .gather import cp_gather_indexer_k_quant_cache as _gather
from .quant_cache import indexer_k_quant_and_cache as _quant

_LIB = "nvrtc_gather"


@torch.library.custom_op(f"{_LIB}::cp_gather_indexer_k_quant_cache", mutates_args=("dst_k", "dst_scale"))
def cp_gather_indexer_k_quant_cache(kv_cache: Tensor, dst_k: Tensor, dst_scale: Tensor, block_table: Tensor,
                                    cu_seq_lens: Tensor) -> None:
    _gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)


@cp_gather_indexer_k_quant_cache.register_fake
def _(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> None:
    return None


@torch.library.custom_op(f"{_LIB}::indexer_k_quant_and_cache", mutates_args=("kv_cache",))
def indexer_k_quant_and_cache(k: Tensor, kv_cache: Tensor, slot_mapping: Tensor, quant_block_size: int,
                              scale_fmt: str | None) -> None:
    _quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)


@indexer_k_quant_and_cache.register_fake
def _(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> None:
    return None
