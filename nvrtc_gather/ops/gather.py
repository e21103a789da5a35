"""cp_gather_indexer_k_quant_cache: the torch-facing gather op (contract: docs/contract.md §1).

Checks every argument (raising before anything is written), then runs the NVRTC kernel
on CUDA tensors (one launch, its tile policy below) or the vectorized torch implementation
(gather_torch.py) on CPU tensors. Registered as torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..jit import driver, runtime
from ..jit.catalogue import GATHER, GATHER_ENTRIES, GATHER_MODULES, THREADS_PER_BLOCK
from . import checks as v
from . import fake_checks, library, paged_layout
from .gather_torch import gather_torch

_FP8 = torch.float8_e4m3fn
_KV_DTYPES = (torch.uint8, _FP8)
_K_DTYPES = (_FP8, torch.uint8)
_SCALE_DTYPES = (torch.uint8, torch.float32)
_U8, _I32 = torch.uint8, torch.int32
_is_compiling = torch.compiler.is_compiling

# Bytes of fp8 values one thread block copies: 16 KiB keeps 4 16-byte loads in flight per thread.
_BYTES_PER_CTA = 16384


class GatherPlan(NamedTuple):
    """One validated call. Fields from kv_ptr on are the kernel's parameters in struct
    order (catalogue.GATHER_PARAMS but its last field, the error buffer), so launching
    passes ``plan[2:]`` as it is (a test checks the two lists agree)."""

    device: int               # CUDA ordinal, -1 for CPU
    vec: int                  # bytes per fp8 load/store on the GPU
    kv_ptr: int
    k_ptr: int
    s_ptr: int
    bt_ptr: int
    cu_ptr: int
    block_stride: int         # bytes between cache blocks
    dst_k_row_stride: int     # bytes
    dst_scale_row_stride: int  # bytes
    bt_row_stride: int        # elements
    num_tokens: int
    batch: int
    max_blocks: int
    num_blocks: int
    block_size: int
    head_dim: int
    scale_words: int          # fp32 scales per token
    tokens_per_cta: int       # rows per thread block (0 on CPU)


def _named(*tensors):
    return zip(("kv_cache", "dst_k", "dst_scale", "block_table", "cu_seq_lens"), tensors)


_SCALE_SHAPE = ("[num_tokens, 4 * head_dim // quant_block_size] (uint8) or "
                "[num_tokens, head_dim // quant_block_size] (float32)")


def plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> GatherPlan:
    """Validate the arguments of cp_gather_indexer_k_quant_cache; reads no tensor data.

    Written flat, each attribute read once: it runs on every call and its cost is most of
    the op's host time (benchmarks/NOTES.md). Messages are built only on failure."""
    if not (isinstance(kv_cache, Tensor) and isinstance(dst_k, Tensor) and isinstance(dst_scale, Tensor) and
            isinstance(block_table, Tensor) and isinstance(cu_seq_lens, Tensor)):
        for name, t in _named(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
            v.tensor(name, t)
    if kv_cache.dtype not in _KV_DTYPES:
        v.dtype_in("kv_cache", kv_cache, _KV_DTYPES)
    if dst_k.dtype not in _K_DTYPES:
        v.dtype_in("dst_k", dst_k, _K_DTYPES)
    scale_dt = dst_scale.dtype
    if scale_dt not in _SCALE_DTYPES:
        v.dtype_in("dst_scale", dst_scale, _SCALE_DTYPES)
    if block_table.dtype is not _I32:
        v.dtype_in("block_table", block_table, (_I32,))
    if cu_seq_lens.dtype is not _I32:
        v.dtype_in("cu_seq_lens", cu_seq_lens, (_I32,))

    kv_shape, k_shape, s_shape, bt_shape, cu_shape = (kv_cache.shape, dst_k.shape, dst_scale.shape,
                                                      block_table.shape, cu_seq_lens.shape)
    if len(kv_shape) != 3:
        v.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, cache_stride]")
    if len(k_shape) != 2:
        v.rank("dst_k", dst_k, 2, "[num_tokens, head_dim]")
    if len(s_shape) != 2:
        v.rank("dst_scale", dst_scale, 2, _SCALE_SHAPE)
    if len(bt_shape) != 2:
        v.rank("block_table", block_table, 2, "[batch, max_blocks]")
    if len(cu_shape) != 1:
        v.rank("cu_seq_lens", cu_seq_lens, 1, "[batch + 1]")
    device = kv_cache.get_device()  # -1 for CPU (and for meta, hence the thorough check there)
    if device < 0 or not (dst_k.get_device() == dst_scale.get_device() == block_table.get_device() ==
                          cu_seq_lens.get_device() == device and kv_cache.is_cuda and dst_k.is_cuda and
                          dst_scale.is_cuda and block_table.is_cuda and cu_seq_lens.is_cuda):
        v.same_device(dict(_named(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)))

    num_blocks, block_size, _cache_stride = kv_shape
    num_tokens, head_dim = k_shape
    s_rows, s_cols = s_shape
    batch, max_blocks = bt_shape
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"dst_k: head_dim (dim 1) must be a positive multiple of 4, got {head_dim}")
    s_stride = dst_scale.stride()
    if scale_dt is _U8:
        if s_cols % 4:
            raise ValueError(f"dst_scale: a uint8 dst_scale holds 4 bytes per fp32 scale, so dim 1 must be a "
                             f"multiple of 4, got shape {tuple(s_shape)}")
        scale_words = s_cols // 4
        scale_row_stride = s_stride[0]
    else:
        scale_words = s_cols
        scale_row_stride = s_stride[0] * 4
    if scale_words < 1 or head_dim % scale_words:
        raise ValueError(
            f"dst_scale: {scale_words} scales per token must divide head_dim={head_dim} "
            f"(head_dim % quant_block_size must be 0), got shape {tuple(s_shape)}")
    if s_rows != num_tokens:
        raise ValueError(f"dst_scale: expected {num_tokens} rows like dst_k, got shape {tuple(s_shape)}")
    block_stride = paged_layout.block_stride(kv_cache, kv_shape, head_dim, scale_words)
    if cu_shape[0] != batch + 1:
        raise ValueError(f"cu_seq_lens: expected batch + 1 = {batch + 1} entries (block_table has {batch} rows), "
                         f"got {cu_shape[0]}")

    k_row, k_col = dst_k.stride()
    bt_row, bt_col = block_table.stride()
    if k_col != 1:
        v.unit_inner_stride("dst_k", dst_k)
    if s_stride[1] != 1 and s_cols > 1:
        v.unit_inner_stride("dst_scale", dst_scale)
    if bt_col != 1 and max_blocks > 1:
        v.unit_inner_stride("block_table", block_table)
    if batch > 0 and cu_seq_lens.stride(0) != 1:
        v.unit_inner_stride("cu_seq_lens", cu_seq_lens)
    if num_tokens > 1 and (k_row < head_dim or scale_row_stride < 4 * scale_words):
        raise ValueError(f"dst_k/dst_scale: rows overlap (dst_k.stride(0) = {k_row} < head_dim = {head_dim}, or "
                         f"dst_scale's row stride {scale_row_stride} bytes < {4 * scale_words})")
    # num_tokens + a block's rows: the kernel's last block computes its end row in 32 bits.
    if (num_tokens + THREADS_PER_BLOCK | batch | max_blocks | num_blocks | block_size * head_dim) > v.INT32_MAX:
        for name, what, value in (("dst_k", f"num_tokens + {THREADS_PER_BLOCK}", num_tokens + THREADS_PER_BLOCK),
                                  ("block_table", "batch", batch),
                                  ("block_table", "max_blocks", max_blocks),
                                  ("kv_cache", "num_blocks", num_blocks),
                                  ("kv_cache", "block_size * head_dim", block_size * head_dim)):
            v.fits_int32(name, what, value)

    kv_ptr, k_ptr, s_ptr = kv_cache.data_ptr(), dst_k.data_ptr(), dst_scale.data_ptr()
    if (kv_ptr | block_stride | k_ptr | k_row | s_ptr | scale_row_stride) & 3:
        v.aligned("kv_cache", "data pointer", kv_ptr)
        v.aligned("kv_cache", "stride(0)", block_stride)
        v.aligned("dst_k", "data pointer", k_ptr)
        v.aligned("dst_k", "stride(0)", k_row)
        v.aligned("dst_scale", "data pointer", s_ptr)
        v.aligned("dst_scale", "row stride in bytes", scale_row_stride)
    bt_ptr, cu_ptr = block_table.data_ptr(), cu_seq_lens.data_ptr()
    if num_tokens and batch:  # something is written: no written byte may be one the op reads
        ptrs = (k_ptr, s_ptr, kv_ptr, bt_ptr, cu_ptr)
        lengths = _byte_lengths(num_tokens, head_dim, k_row, scale_words, scale_row_stride, num_blocks, block_size,
                                block_stride, _cache_stride, batch, max_blocks, bt_row, bt_col, cu_seq_lens.stride(0))
        if _overlapping(ptrs, lengths):
            k_end, s_end, kv_end, bt_end, cu_end = (p + n for p, n in zip(ptrs, lengths))
            v.disjoint({"dst_k": (k_ptr, k_end), "dst_scale": (s_ptr, s_end)},
                       {"kv_cache": (kv_ptr, kv_end), "block_table": (bt_ptr, bt_end),
                        "cu_seq_lens": (cu_ptr, cu_end)})
    low = kv_ptr | block_stride | head_dim | k_ptr | k_row
    vec = 16 if not low & 15 else (8 if not low & 7 else 4)
    tpc = 0
    if device >= 0:
        tpc = tokens_per_cta(head_dim, num_tokens, driver.sm_count(device))  # lru_cached
    return GatherPlan(device, vec, kv_ptr, k_ptr, s_ptr, bt_ptr, cu_ptr, block_stride, k_row, scale_row_stride,
                      bt_row, num_tokens, batch, max_blocks, num_blocks, block_size, head_dim, scale_words, tpc)


def _byte_lengths(num_tokens, head_dim, k_row, scale_words, scale_row_stride, num_blocks, block_size, block_stride,
                  cache_stride, batch, max_blocks, bt_row, bt_col, cu_stride) -> tuple[int, int, int, int, int]:
    """Bytes from each data pointer to the end of what the call touches, in the order dst_k,
    dst_scale (written), kv_cache, block_table, cu_seq_lens (read). num_tokens, batch > 0."""
    return ((num_tokens - 1) * k_row + head_dim,
            (num_tokens - 1) * scale_row_stride + 4 * scale_words,
            (num_blocks - 1) * block_stride + block_size * cache_stride if num_blocks else 0,
            4 * ((batch - 1) * bt_row + (max_blocks - 1) * bt_col + 1) if max_blocks else 0,
            4 * (batch * cu_stride + 1))


def _overlapping(ptrs: tuple, lengths: tuple) -> bool:
    """Whether a written range (dst_k, dst_scale) overlaps a read one (kv_cache, block_table,
    cu_seq_lens); both tuples in _byte_lengths' order."""
    k_p, s_p, kv_p, bt_p, cu_p = ptrs
    k_e, s_e, kv_e, bt_e, cu_e = k_p + lengths[0], s_p + lengths[1], kv_p + lengths[2], bt_p + lengths[3], \
        cu_p + lengths[4]
    return (k_p < kv_e and kv_p < k_e) or (s_p < kv_e and kv_p < s_e) or (k_p < bt_e and bt_p < k_e) or \
        (s_p < bt_e and bt_p < s_e) or (k_p < cu_e and cu_p < k_e) or (s_p < cu_e and cu_p < s_e)


def tokens_per_cta(head_dim: int, num_tokens: int, sm_count: int) -> int:
    """Rows per thread block: enough bytes per block to keep loads in flight, but small
    calls are spread over every SM (about 2 blocks each), since latency bounds them; at
    the floor of 8 rows (one per warp) the tiny kernel runs them (kernel_name).
    A call whose 16 KiB blocks fill between 3/4 of one wave and one wave gets blocks
    twice that size, run by the wide kernels (8 loads in flight per thread): faster there,
    slower below 3/4 of a wave (benchmarks/NOTES.md, v7)."""
    most = max(1, min(THREADS_PER_BLOCK, _BYTES_PER_CTA // head_dim))
    wave = most * sm_count * _CTAS_PER_SM  # rows of one wave of 16 KiB blocks
    if 2 * most <= THREADS_PER_BLOCK and wave >= num_tokens > wave * 3 // 4:
        return 2 * most
    spread = -(-num_tokens // (2 * sm_count))
    return max(1, min(most, max(_MIN_TOKENS_PER_CTA, spread)))


def kernel_name(plan: GatherPlan) -> str:
    """The entry point of cuda_src/gather_indexer_k.cu for a GPU plan: its vector width and
    shape. "tiny" (one warp per row) when tokens_per_cta chose its floor, one row per warp
    (small calls: at most 16 rows per SM); "wide" when it chose blocks of more than 16 KiB."""
    tpc, head_dim = plan.tokens_per_cta, plan.head_dim
    if tpc == _MIN_TOKENS_PER_CTA and tpc * head_dim < _BYTES_PER_CTA:
        return GATHER_ENTRIES[plan.vec, "tiny"]
    return GATHER_ENTRIES[plan.vec, "wide" if tpc * head_dim > _BYTES_PER_CTA else ""]


def launch_config(plan: GatherPlan) -> tuple[str, int, tuple]:
    """Entry point, grid size and parameter values (all but the error buffer) of a validated
    GPU call with rows to copy."""
    tpc = plan.tokens_per_cta
    return kernel_name(plan), (plan.num_tokens + tpc - 1) // tpc, plan[2:]


_MIN_TOKENS_PER_CTA = THREADS_PER_BLOCK // 32  # the tiny kernel's rows per block: one per warp
_CTAS_PER_SM = 2048 // THREADS_PER_BLOCK  # resident blocks of 256 threads per SM (one wave)


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
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return torch.ops.nvrtc_gather.cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table,
                                                                      cu_seq_lens)
    try:  # the layout's key (see _known below), everything plan_gather reads but the data pointers
        key = (kv_cache.device, kv_cache.dtype, kv_cache.shape, kv_cache.stride(),
               dst_k.device, dst_k.dtype, dst_k.shape, dst_k.stride(),
               dst_scale.device, dst_scale.dtype, dst_scale.shape, dst_scale.stride(),
               block_table.device, block_table.dtype, block_table.shape, block_table.stride(),
               cu_seq_lens.device, cu_seq_lens.dtype, cu_seq_lens.shape, cu_seq_lens.stride())
        known = _known.get(key)
    except AttributeError:  # not tensors: plan_gather says which
        key = known = None
    if known is not None and _launch_known(known, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
        return
    plan = plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    device = plan.device
    if device < 0:
        gather_torch(plan, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
        return
    if plan.num_tokens == 0 or plan.batch == 0:
        return
    _launch(plan, GATHER_MODULES[plan.vec])
    if key is not None:
        _remember(key, plan)


# The fast path. plan_gather's checks depend on the tensors' metadata (device, dtype, shape,
# strides) and on their data pointers; an engine calls the op layer after layer with the same
# metadata and new pointers. So a layout that passed plan_gather is remembered under its
# metadata with what the pointer-dependent part needs (byte extents, the constant bits of
# the alignment, the launch values after the pointers); a later call with that metadata redoes
# only the pointer checks (alignment, overlap) and launches. Anything those checks would
# reject falls through to plan_gather, which raises. Bounded: cleared when full.
_known: dict[tuple, tuple] = {}
_KNOWN_MAX = 256


def _remember(key: tuple, plan: GatherPlan) -> None:
    """After plan_gather accepted a CUDA call with rows to copy and it was launched."""
    if len(_known) >= _KNOWN_MAX:
        _known.clear()
    p = plan
    # key[2][2]: kv_cache's cache_stride; key[15][1], key[19][0]: block_table's and cu_seq_lens' inner strides
    lengths = _byte_lengths(p.num_tokens, p.head_dim, p.dst_k_row_stride, p.scale_words, p.dst_scale_row_stride,
                            p.num_blocks, p.block_size, p.block_stride, key[2][2], p.batch, p.max_blocks,
                            p.bt_row_stride, key[15][1], key[19][0])
    entries = {vec: kernel_name(p._replace(vec=vec)) for vec in (16, 8, 4)}
    grid = (p.num_tokens + p.tokens_per_cta - 1) // p.tokens_per_cta
    _known[key] = (p.device, p.block_stride | p.head_dim | p.dst_k_row_stride, lengths, entries, grid,
                   tuple(p[7:]), {})  # the last: loaded modules by vector width, filled as used


def _launch_known(known: tuple, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> bool:
    """Launch a call whose metadata plan_gather accepted before; False (nothing done) when
    its pointers fail a check, for plan_gather to report."""
    device, low_bits, lengths, entries, grid, tail, kernels = known
    kv_p, k_p, s_p = kv_cache.data_ptr(), dst_k.data_ptr(), dst_scale.data_ptr()
    bt_p, cu_p = block_table.data_ptr(), cu_seq_lens.data_ptr()
    if (kv_p | k_p | s_p) & 3 or _overlapping((k_p, s_p, kv_p, bt_p, cu_p), lengths):
        return False
    low = kv_p | k_p | low_bits
    vec = 16 if not low & 15 else (8 if not low & 7 else 4)
    stream = runtime.current_stream(device)
    handle = kernels.get(vec)
    if handle is None:  # first fast call with this vector width: the module is loaded already or now
        handle = kernels[vec] = runtime.load(GATHER_MODULES[vec], device, stream)
    handle.launch(entries[vec], grid, (kv_p, k_p, s_p, bt_p, cu_p) + tail, stream)
    return True


def _launch(plan: GatherPlan, module) -> None:
    stream = runtime.current_stream(plan.device)
    entry, grid, values = launch_config(plan)
    runtime.load(module, plan.device, stream).launch(entry, grid, values, stream)


def prepared(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens, *, module=None, tokens_per_cta=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call (CUDA
    tensors) exactly as the op does, optionally with another build of the gather source
    (``module``, holding the entry point the call needs; default: the op's) or another
    rows-per-block choice."""
    plan = plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    if tokens_per_cta is not None:
        plan = plan._replace(tokens_per_cta=tokens_per_cta)

    def run(_keep=(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)):  # the tensors outlive it
        if plan.num_tokens and plan.batch:  # as the op: nothing to launch for an empty call
            _launch(plan, module or GATHER_MODULES[plan.vec])
    return run


def gather_fake(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> None:
    """The fake (meta) implementation: plan_gather's overlap check on the traced tensors'
    storages, where data pointers are not available (ops/fake_checks.py says why)."""
    if dst_k.size(0) and block_table.size(0):  # as plan_gather: only a call that writes rows
        fake_checks.disjoint({"dst_k": dst_k, "dst_scale": dst_scale},
                             {"kv_cache": kv_cache, "block_table": block_table, "cu_seq_lens": cu_seq_lens})


library.register("cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor(a!) dst_k, Tensor(b!) dst_scale, "
                 "Tensor block_table, Tensor cu_seq_lens) -> ()", cp_gather_indexer_k_quant_cache, gather_fake)
