"""cp_gather_indexer_k_quant_cache: the torch-facing gather op (contract: DESIGN.md §1).

Checks every argument (raising before anything is written), then runs the NVRTC kernel
on CUDA tensors or the vectorized torch implementation (gather_torch.py) on CPU tensors."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from . import debug_check, launcher, registry, settings
from . import validation as v
from .gather_torch import gather_torch
from .kernels import GATHER, THREADS_PER_BLOCK

_FP8 = torch.float8_e4m3fn
_KV_DTYPES = (torch.uint8, _FP8)
_K_DTYPES = (_FP8, torch.uint8)
_SCALE_DTYPES = (torch.uint8, torch.float32)

# Mirrors struct GatherParams in cuda_src/gather_indexer_k.cu (6 pointers, 4 int64, 8 int32).
PARAMS = struct.Struct("<6Q4q8i")

# Bytes of fp8 values one thread block copies: 16 KiB keeps 4 16-byte loads in flight per thread.
_BYTES_PER_CTA = 16384


@dataclass(frozen=True)
class GatherPlan:
    """Sizes and byte strides of one validated call."""

    num_tokens: int
    head_dim: int
    scale_words: int          # fp32 scales per token
    batch: int
    max_blocks: int
    num_blocks: int
    block_size: int
    block_stride: int         # bytes between cache blocks
    dst_k_row_stride: int     # bytes
    dst_scale_row_stride: int  # bytes
    bt_row_stride: int        # elements
    vec: int                  # bytes per fp8 load/store on the GPU


def plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> GatherPlan:
    """Validate the arguments of cp_gather_indexer_k_quant_cache. Reads no tensor data."""
    v.tensor("kv_cache", kv_cache)
    v.tensor("dst_k", dst_k)
    v.tensor("dst_scale", dst_scale)
    v.tensor("block_table", block_table)
    v.tensor("cu_seq_lens", cu_seq_lens)

    v.dtype_in("kv_cache", kv_cache, _KV_DTYPES)
    v.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, cache_stride]")
    v.dtype_in("dst_k", dst_k, _K_DTYPES)
    v.rank("dst_k", dst_k, 2, "[num_tokens, head_dim]")
    scale_dt = v.dtype_in("dst_scale", dst_scale, _SCALE_DTYPES)
    v.rank("dst_scale", dst_scale, 2, "[num_tokens, 4 * head_dim // quant_block_size] (uint8) or "
           "[num_tokens, head_dim // quant_block_size] (float32)")
    v.dtype_in("block_table", block_table, (torch.int32,))
    v.rank("block_table", block_table, 2, "[batch, max_blocks]")
    v.dtype_in("cu_seq_lens", cu_seq_lens, (torch.int32,))
    v.rank("cu_seq_lens", cu_seq_lens, 1, "[batch + 1]")
    v.same_device({"kv_cache": kv_cache, "dst_k": dst_k, "dst_scale": dst_scale,
                   "block_table": block_table, "cu_seq_lens": cu_seq_lens})

    num_blocks, block_size, cache_stride = kv_cache.shape
    num_tokens, head_dim = dst_k.shape
    if block_size < 1:
        raise ValueError(f"kv_cache: block_size (dim 1) must be >= 1, got shape {tuple(kv_cache.shape)}")
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"dst_k: head_dim (dim 1) must be a positive multiple of 4, got {head_dim}")
    if scale_dt == torch.uint8:
        if dst_scale.size(1) % 4:
            raise ValueError(f"dst_scale: a uint8 dst_scale holds 4 bytes per fp32 scale, so dim 1 must be a "
                             f"multiple of 4, got shape {tuple(dst_scale.shape)}")
        scale_words = dst_scale.size(1) // 4
        scale_row_stride = dst_scale.stride(0)
    else:
        scale_words = dst_scale.size(1)
        scale_row_stride = dst_scale.stride(0) * 4
    if scale_words < 1 or head_dim % scale_words:
        raise ValueError(
            f"dst_scale: {scale_words} scales per token must divide head_dim={head_dim} "
            f"(head_dim % quant_block_size must be 0), got shape {tuple(dst_scale.shape)}")
    if dst_scale.size(0) != num_tokens:
        raise ValueError(f"dst_scale: expected {num_tokens} rows like dst_k, got shape {tuple(dst_scale.shape)}")
    need = head_dim + 4 * scale_words
    if cache_stride < need:
        raise ValueError(
            f"kv_cache: cache_stride (dim 2) must be at least head_dim + 4 * head_dim / quant_block_size = {need}, "
            f"got shape {tuple(kv_cache.shape)}")
    batch, max_blocks = block_table.shape
    if cu_seq_lens.size(0) != batch + 1:
        raise ValueError(f"cu_seq_lens: expected batch + 1 = {batch + 1} entries (block_table has {batch} rows), "
                         f"got {cu_seq_lens.size(0)}")

    # Layout: every cache block is contiguous; rows of the others may be strided.
    s0, s1, s2 = kv_cache.stride()
    if (cache_stride > 1 and s2 != 1) or (block_size > 1 and s1 != cache_stride) or \
            (num_blocks > 1 and s0 < block_size * cache_stride):
        raise ValueError(
            f"kv_cache: each block must be contiguous (strides (>= {block_size * cache_stride}, {cache_stride}, 1)), "
            f"got strides {tuple(kv_cache.stride())}")
    v.unit_inner_stride("dst_k", dst_k)
    v.unit_inner_stride("dst_scale", dst_scale)
    v.unit_inner_stride("block_table", block_table)
    v.unit_inner_stride("cu_seq_lens", cu_seq_lens)
    if num_tokens > 1 and dst_k.stride(0) < head_dim:
        raise ValueError(f"dst_k: rows overlap (stride(0) = {dst_k.stride(0)} < head_dim = {head_dim})")
    if num_tokens > 1 and scale_row_stride < 4 * scale_words:
        raise ValueError(f"dst_scale: rows overlap (row stride {scale_row_stride} bytes < {4 * scale_words})")

    v.fits_int32("dst_k", "num_tokens", num_tokens)
    v.fits_int32("block_table", "batch", batch)
    v.fits_int32("block_table", "max_blocks", max_blocks)
    v.fits_int32("kv_cache", "num_blocks", num_blocks)
    v.fits_int32("kv_cache", "block_size * head_dim", block_size * head_dim)

    kv_ptr, k_ptr, s_ptr = kv_cache.data_ptr(), dst_k.data_ptr(), dst_scale.data_ptr()
    block_stride = s0 if num_blocks > 1 else block_size * cache_stride
    k_row = dst_k.stride(0)
    v.aligned("kv_cache", "data pointer", kv_ptr)
    v.aligned("kv_cache", "stride(0)", block_stride)
    v.aligned("dst_k", "data pointer", k_ptr)
    v.aligned("dst_k", "stride(0)", k_row)
    v.aligned("dst_scale", "data pointer", s_ptr)
    v.aligned("dst_scale", "row stride in bytes", scale_row_stride)

    vec = 16
    while (kv_ptr | block_stride | head_dim | k_ptr | k_row) % vec:
        vec //= 2  # stops at 4: all five are multiples of 4 by now
    return GatherPlan(num_tokens, head_dim, scale_words, batch, max_blocks, num_blocks, block_size,
                      block_stride, k_row, scale_row_stride, block_table.stride(0), vec)


def _tokens_per_cta(head_dim: int) -> int:
    return max(1, min(THREADS_PER_BLOCK, _BYTES_PER_CTA // head_dim))


def cp_gather_indexer_k_quant_cache(kv_cache: torch.Tensor, dst_k: torch.Tensor, dst_scale: torch.Tensor,
                                    block_table: torch.Tensor, cu_seq_lens: torch.Tensor) -> None:
    """Gather each request's tokens from the paged fp8 indexer cache into contiguous rows.

    Token ``i`` of request ``r`` (rows ``cu_seq_lens[r]:cu_seq_lens[r+1]``) is read from
    physical block ``block_table[r, i // block_size]`` and written to row
    ``cu_seq_lens[r] + i`` of ``dst_k`` (fp8 values) and ``dst_scale`` (fp32 scales, as
    raw uint8 bytes or float32). Rows at or past ``cu_seq_lens[-1]`` are left untouched.

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation;
    rows with out-of-range indices are skipped (set NVRTC_GATHER_DEBUG=1 to have them
    reported). CPU tensors: a torch implementation with identical results that raises
    ValueError on malformed ``cu_seq_lens`` or block ids before writing anything.
    """
    plan = plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    if kv_cache.device.type == "cpu":
        gather_torch(plan, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
        return
    if plan.num_tokens == 0 or plan.batch == 0:
        return
    device = kv_cache.device.index
    stream = torch.cuda.current_stream(device).cuda_stream
    fn = registry.functions(GATHER, device, stream)[f"gather_indexer_k_v{plan.vec}"]
    tpc = _tokens_per_cta(plan.head_dim)
    grid = (plan.num_tokens + tpc - 1) // tpc
    err = debug_check.error_buffer(kv_cache.device) if settings.debug_enabled() else None
    launcher.launch(device, fn, grid, stream, PARAMS, (
        kv_cache.data_ptr(), dst_k.data_ptr(), dst_scale.data_ptr(), block_table.data_ptr(),
        cu_seq_lens.data_ptr(), 0 if err is None else err.data_ptr(),
        plan.block_stride, plan.dst_k_row_stride, plan.dst_scale_row_stride, plan.bt_row_stride,
        plan.num_tokens, plan.batch, plan.max_blocks, plan.num_blocks, plan.block_size, plan.head_dim,
        plan.scale_words, tpc))
    if err is not None:
        debug_check.raise_if_set(err, "cp_gather_indexer_k_quant_cache")
