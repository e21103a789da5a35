"""The ops registered with torch.library as ``torch.ops.nvrtc_gather.<name>``, so that
``torch.compile(fullgraph=True)`` traces callers without a graph break.

Each schema marks the tensors the op writes (``Tensor(a!)``) and returns nothing; the
fake (meta) implementations do nothing, since the ops only write into their arguments.
Registered with the low-level ``torch.library.Library`` API and CPU/CUDA kernels rather
than ``torch.library.custom_op``: the same tracing, at about a tenth of the dispatch cost
per call (benchmarks/NOTES.md). The plain Python functions stay the documented entry
points; inside torch.compile they route themselves through these ops."""
from __future__ import annotations

import torch

from .gather import cp_gather_indexer_k_quant_cache
from .quant_cache import indexer_k_quant_and_cache

NAMESPACE = "nvrtc_gather"

_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor(a!) dst_k, Tensor(b!) dst_scale, "
            "Tensor block_table, Tensor cu_seq_lens) -> ()")
_lib.define("indexer_k_quant_and_cache(Tensor k, Tensor(a!) kv_cache, Tensor slot_mapping, "
            "int quant_block_size, str? scale_fmt) -> ()")

for _key in ("CPU", "CUDA"):
    _lib.impl("cp_gather_indexer_k_quant_cache", cp_gather_indexer_k_quant_cache, _key)
    _lib.impl("indexer_k_quant_and_cache", indexer_k_quant_and_cache, _key)


@torch.library.register_fake(f"{NAMESPACE}::cp_gather_indexer_k_quant_cache", lib=_lib)
def _gather_fake(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> None:
    return None


@torch.library.register_fake(f"{NAMESPACE}::indexer_k_quant_and_cache", lib=_lib)
def _quant_fake(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> None:
    return None
