"""nvrtc_gather: DeepSeek-V3.2 indexer-cache ops as CUDA C compiled at first use by NVRTC.

Public API:
    cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
    preload(device=None)   compile/load every kernel now (e.g. before CUDA-graph capture)
"""
import logging

from ._version import __version__
from .errors import (CacheLocationError, CaptureError, CompileError, CudaError, InvalidSettingError, JitDisabledError,
                     MissingDependencyError, NvrtcGatherError)
from .jit.runtime import preload
from .ops.gather import cp_gather_indexer_k_quant_cache  # importing an op registers torch.ops.nvrtc_gather.*
from .ops.indexer_k_quant import indexer_k_quant_and_cache

# A library prints nothing unless the application configures logging (the stdlib's advice):
# without this, logging's last-resort handler would print our warnings on stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "cp_gather_indexer_k_quant_cache",
    "indexer_k_quant_and_cache",
    "preload",
    "NvrtcGatherError",
    "MissingDependencyError",
    "CompileError",
    "CudaError",
    "CaptureError",
    "JitDisabledError",
    "InvalidSettingError",
    "CacheLocationError",
]
