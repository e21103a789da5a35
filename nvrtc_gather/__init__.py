"""nvrtc_gather: DeepSeek-V3.2 cache ops (the indexer's K cache and the MLA cache) as CUDA C
compiled at first use by NVRTC.

Public API:
    cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
    indexer_k_scatter(k, k_scale, kv_cache, slot_mapping)   already-quantized rows into the cache (SGLang's SetKAndS)
    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False,
                         ds_scale_rule="pow2")
    cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, workspace_starts, batch_size,
                                         seq_starts=None)
    cp_gather_cache(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None)
    gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                   kv_cache_dtype, scale, seq_starts=None)
    dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)
                           DeepSeek-V4's 584-byte MLA record -> bf16 rows (vLLM's form; SGLang's forms:
                           nvrtc_gather.integrations.sglang)
    preload(device=None)   compile/load every kernel now (e.g. before CUDA-graph capture)
"""
import logging

from ._version import __version__
from .errors import (CacheLocationError, CaptureError, CompileError, CudaError, InvalidSettingError, JitDisabledError,
                     MissingDependencyError, NvrtcGatherError)
from .jit.runtime import preload
from .ops.cache_gather import cp_gather_cache, gather_and_maybe_dequant_cache
from .ops.dsv4_gather import dequantize_and_gather_k_cache
from .ops.gather import cp_gather_indexer_k_quant_cache  # importing an op registers torch.ops.nvrtc_gather.*
from .ops.indexer_k_quant import indexer_k_quant_and_cache
from .ops.indexer_k_scatter import indexer_k_scatter
from .ops.mla_gather import cp_gather_and_upconvert_fp8_kv_cache
from .ops.mla_write import concat_and_cache_mla

# A library prints nothing unless the application configures logging (the stdlib's advice):
# without this, logging's last-resort handler would print our warnings on stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "cp_gather_indexer_k_quant_cache",
    "indexer_k_quant_and_cache",
    "indexer_k_scatter",
    "concat_and_cache_mla",
    "cp_gather_and_upconvert_fp8_kv_cache",
    "cp_gather_cache",
    "gather_and_maybe_dequant_cache",
    "dequantize_and_gather_k_cache",
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
