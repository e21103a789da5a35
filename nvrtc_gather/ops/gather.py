"""cp_gather_indexer_k_quant_cache: the torch-facing gather op (contract: docs/contract.md §1).

Checks every argument (raising before anything is written), then runs the NVRTC kernel
on CUDA tensors (one launch; the kernel family's spec and tile policy are in
nvrtc_gather/kernels/gather.py) or the vectorized torch implementation (gather_torch.py) on
CPU tensors. Repeated layouts take the shared fast path (fast_path.py). Registered as
torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..jit import driver
from ..kernels import gather as spec
from . import checks, fake_checks, fast_path, library, paged_layout
from .fast_path import Launch, LaunchConfig, LayoutMemo, layout_key5
from .gather_torch import gather_torch

_FP8 = torch.float8_e4m3fn
_KV_DTYPES = (torch.uint8, _FP8)
_K_DTYPES = (_FP8, torch.uint8)
_SCALE_DTYPES = (torch.uint8, torch.float32)
_U8, _I32 = torch.uint8, torch.int32
_is_compiling = torch.compiler.is_compiling
_NAMES = ("kv_cache", "dst_k", "dst_scale", "block_table", "cu_seq_lens")
# What the op writes and reads, in _extents' order: the one list the full checks
# (_check_disjoint), the fast path and the fake (gather_fake) take their names from.
WRITES, READS = ("dst_k", "dst_scale"), ("kv_cache", "block_table", "cu_seq_lens")
_SCALE_SHAPE = ("[num_tokens, 4 * head_dim // quant_block_size] (uint8) or "
                "[num_tokens, head_dim // quant_block_size] (float32)")


class GatherPlan(NamedTuple):
    """One validated call: sizes, byte strides, pointers, and the kernel's choices."""

    device: int               # CUDA ordinal, -1 for CPU
    vec: int                  # bytes per fp8 load/store on the GPU
    tokens_per_cta: int       # rows per thread block (0 on CPU)
    kv_ptr: int
    k_ptr: int
    s_ptr: int
    bt_ptr: int
    cu_ptr: int
    num_tokens: int           # rows of dst_k
    head_dim: int
    scale_words: int          # fp32 scales per token
    num_blocks: int
    block_size: int
    cache_stride: int         # bytes per token row of a block
    block_stride: int         # bytes between cache blocks
    dst_k_row_stride: int     # bytes
    dst_scale_row_stride: int  # bytes
    batch: int
    max_blocks: int
    bt_row_stride: int        # elements
    bt_col_stride: int        # elements
    cu_stride: int            # elements


# -- the full checks ---------------------------------------------------------------------------

def plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> GatherPlan:
    """Validate the arguments of cp_gather_indexer_k_quant_cache; reads no tensor data.
    Each step checks one argument (or one relation between them) and raises TypeError or
    ValueError naming it."""
    tensors = (kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    _check_types(tensors)
    device = _device(tensors)
    head_dim, scale_words, scale_row_stride = _destinations(dst_k, dst_scale)
    block_stride = paged_layout.block_stride(kv_cache, kv_cache.shape, head_dim, scale_words)
    batch, max_blocks = _indices(block_table, cu_seq_lens)
    num_tokens = dst_k.shape[0]
    num_blocks, block_size, cache_stride = kv_cache.shape
    _check_int32(num_tokens, batch, max_blocks, num_blocks, block_size * head_dim)
    plan = GatherPlan(
        device=device, vec=0, tokens_per_cta=0,
        kv_ptr=kv_cache.data_ptr(), k_ptr=dst_k.data_ptr(), s_ptr=dst_scale.data_ptr(),
        bt_ptr=block_table.data_ptr(), cu_ptr=cu_seq_lens.data_ptr(),
        num_tokens=num_tokens, head_dim=head_dim, scale_words=scale_words,
        num_blocks=num_blocks, block_size=block_size, cache_stride=cache_stride, block_stride=block_stride,
        dst_k_row_stride=dst_k.stride(0), dst_scale_row_stride=scale_row_stride,
        batch=batch, max_blocks=max_blocks, bt_row_stride=block_table.stride(0),
        bt_col_stride=block_table.stride(1), cu_stride=cu_seq_lens.stride(0))
    _check_alignment(plan)
    if num_tokens and batch:  # something is written: no written byte may be one the op reads
        _check_disjoint(plan, _extents(plan))
    vec = spec.vector_width(_low_bits(plan) | plan.kv_ptr | plan.k_ptr)
    if device < 0:
        return plan._replace(vec=vec)
    return plan._replace(vec=vec, tokens_per_cta=spec.tokens_per_cta(head_dim, num_tokens, driver.sm_count(device)))


def _check_types(tensors) -> None:
    kv_cache, dst_k, dst_scale, block_table, cu_seq_lens = tensors
    for name, t in zip(_NAMES, tensors):
        checks.tensor(name, t)
    # The usual call passes every check below: test that in one expression first (cheaper than
    # the ten helper calls); anything else runs the helpers, which name what is wrong.
    if kv_cache.dtype in _KV_DTYPES and dst_k.dtype in _K_DTYPES and dst_scale.dtype in _SCALE_DTYPES and \
            block_table.dtype is _I32 and cu_seq_lens.dtype is _I32 and kv_cache.dim() == 3 and \
            dst_k.dim() == 2 and dst_scale.dim() == 2 and block_table.dim() == 2 and cu_seq_lens.dim() == 1:
        return
    checks.dtype_in("kv_cache", kv_cache, _KV_DTYPES)
    checks.dtype_in("dst_k", dst_k, _K_DTYPES)
    checks.dtype_in("dst_scale", dst_scale, _SCALE_DTYPES)
    checks.dtype_in("block_table", block_table, (_I32,))
    checks.dtype_in("cu_seq_lens", cu_seq_lens, (_I32,))
    checks.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, cache_stride]")
    checks.rank("dst_k", dst_k, 2, "[num_tokens, head_dim]")
    checks.rank("dst_scale", dst_scale, 2, _SCALE_SHAPE)
    checks.rank("block_table", block_table, 2, "[batch, max_blocks]")
    checks.rank("cu_seq_lens", cu_seq_lens, 1, "[batch + 1]")


def _device(tensors) -> int:
    """The CUDA ordinal of the call, -1 for CPU; every tensor on one device."""
    kv_cache, dst_k, dst_scale, block_table, cu_seq_lens = tensors
    dev = kv_cache.device
    if dst_k.device == dev and dst_scale.device == dev and block_table.device == dev and \
            cu_seq_lens.device == dev and dev.type in ("cuda", "cpu"):  # the usual call: nothing to name
        return dev.index if dev.type == "cuda" else -1
    dev = checks.same_device(dict(zip(_NAMES, tensors)))
    return dev.index if dev.type == "cuda" else -1


def _destinations(dst_k, dst_scale) -> tuple[int, int, int]:
    """(head_dim, fp32 scales per token, dst_scale's row stride in bytes) of the outputs."""
    num_tokens, head_dim = dst_k.shape
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"dst_k: head_dim (dim 1) must be a positive multiple of 4, got {head_dim}")
    if head_dim > 1 and dst_k.stride(1) != 1:  # (the helper's own test, to skip the call when it passes)
        checks.unit_inner_stride("dst_k", dst_k)
    s_rows, s_cols = dst_scale.shape
    if dst_scale.dtype is _U8:
        if s_cols % 4:
            raise ValueError(f"dst_scale: a uint8 dst_scale holds 4 bytes per fp32 scale, so dim 1 must be a "
                             f"multiple of 4, got shape {tuple(dst_scale.shape)}")
        scale_words, row_stride = s_cols // 4, dst_scale.stride(0)
    else:
        scale_words, row_stride = s_cols, dst_scale.stride(0) * 4
    if scale_words < 1 or head_dim % scale_words:
        raise ValueError(
            f"dst_scale: {scale_words} scales per token must divide head_dim={head_dim} "
            f"(head_dim % quant_block_size must be 0), got shape {tuple(dst_scale.shape)}")
    if s_rows != num_tokens:
        raise ValueError(f"dst_scale: expected {num_tokens} rows like dst_k, got shape {tuple(dst_scale.shape)}")
    if s_cols > 1 and dst_scale.stride(1) != 1:
        checks.unit_inner_stride("dst_scale", dst_scale)
    if num_tokens > 1 and (dst_k.stride(0) < head_dim or row_stride < 4 * scale_words):
        raise ValueError(f"dst_k/dst_scale: rows overlap (dst_k.stride(0) = {dst_k.stride(0)} < head_dim = "
                         f"{head_dim}, or dst_scale's row stride {row_stride} bytes < {4 * scale_words})")
    return head_dim, scale_words, row_stride


def _indices(block_table, cu_seq_lens) -> tuple[int, int]:
    """(batch, max_blocks) of the index tensors."""
    batch, max_blocks = block_table.shape
    if cu_seq_lens.shape[0] != batch + 1:
        raise ValueError(f"cu_seq_lens: expected batch + 1 = {batch + 1} entries (block_table has {batch} rows), "
                         f"got {cu_seq_lens.shape[0]}")
    if max_blocks > 1 and block_table.stride(1) != 1:  # (the helper's own test, to skip the call when it passes)
        checks.unit_inner_stride("block_table", block_table)
    if batch > 0 and cu_seq_lens.stride(0) != 1:
        checks.unit_inner_stride("cu_seq_lens", cu_seq_lens)
    return batch, max_blocks


def _check_int32(num_tokens, batch, max_blocks, num_blocks, block_bytes) -> None:
    # num_tokens + a block's rows: the kernel's last block computes its end row in 32 bits.
    if max(num_tokens + spec.THREADS, batch, max_blocks, num_blocks, block_bytes) <= checks.INT32_MAX:
        return  # the usual call: no messages to format
    for name, what, value in (("dst_k", f"num_tokens + {spec.THREADS}", num_tokens + spec.THREADS),
                              ("block_table", "batch", batch),
                              ("block_table", "max_blocks", max_blocks),
                              ("kv_cache", "num_blocks", num_blocks),
                              ("kv_cache", "block_size * head_dim", block_bytes)):
        checks.fits_int32(name, what, value)


def _check_alignment(p: GatherPlan) -> None:
    if not (p.kv_ptr | p.block_stride | p.k_ptr | p.dst_k_row_stride | p.s_ptr | p.dst_scale_row_stride) & 3:
        return  # the usual call: all six 4-byte aligned
    for name, what, value in (("kv_cache", "data pointer", p.kv_ptr), ("kv_cache", "stride(0)", p.block_stride),
                              ("dst_k", "data pointer", p.k_ptr), ("dst_k", "stride(0)", p.dst_k_row_stride),
                              ("dst_scale", "data pointer", p.s_ptr),
                              ("dst_scale", "row stride in bytes", p.dst_scale_row_stride)):
        checks.aligned(name, what, value)


def _low_bits(p: GatherPlan) -> int:
    """The layout's bits of the vector width choice; the data pointers add theirs per call."""
    return p.block_stride | p.head_dim | p.dst_k_row_stride


# -- extents and overlap: one definition for the full checks and the fast path -----------------

def _extents(p: GatherPlan) -> tuple[int, int, int, int, int]:
    """Bytes from each data pointer to the end of what the call touches, in the order dst_k,
    dst_scale (written), kv_cache, block_table, cu_seq_lens (read). num_tokens, batch > 0."""
    return ((p.num_tokens - 1) * p.dst_k_row_stride + p.head_dim,
            (p.num_tokens - 1) * p.dst_scale_row_stride + 4 * p.scale_words,
            (p.num_blocks - 1) * p.block_stride + p.block_size * p.cache_stride if p.num_blocks else 0,
            4 * ((p.batch - 1) * p.bt_row_stride + (p.max_blocks - 1) * p.bt_col_stride + 1) if p.max_blocks else 0,
            4 * (p.batch * p.cu_stride + 1))


def _check_disjoint(p: GatherPlan, extents) -> None:
    """Raise ValueError if a written range (dst_k, dst_scale) overlaps a read one (kv_cache,
    block_table, cu_seq_lens). The op's fast path tests the same with plain comparisons."""
    spans = {n: (ptr, ptr + size) for n, ptr, size in
             zip(WRITES + READS, (p.k_ptr, p.s_ptr, p.kv_ptr, p.bt_ptr, p.cu_ptr), extents)}
    checks.disjoint({n: spans[n] for n in WRITES}, {n: spans[n] for n in READS})
    checks.written_apart("dst_k", p.k_ptr, p.head_dim, p.dst_k_row_stride,
                         "dst_scale", p.s_ptr, 4 * p.scale_words, p.dst_scale_row_stride, p.num_tokens)


# -- launching ---------------------------------------------------------------------------------

class GatherLayout(NamedTuple):
    """What a call with a remembered layout needs besides its data pointers (fast_path.py)."""

    device: int
    widths: tuple     # vector width by the low 4 bits of kv_cache's and dst_k's pointers
    extents: tuple    # _extents of the plan
    launches: dict    # vector width -> fast_path.Launch
    launchers: dict   # vector width -> its launcher, made on first use (fast_path.bind)


def struct_fields(p: GatherPlan) -> dict:
    """The GatherParams fields of a GPU plan, by name, but the error buffer."""
    return dict(kv_cache=p.kv_ptr, dst_k=p.k_ptr, dst_scale=p.s_ptr, block_table=p.bt_ptr, cu_seq_lens=p.cu_ptr,
                block_stride=p.block_stride, dst_k_row_stride=p.dst_k_row_stride,
                dst_scale_row_stride=p.dst_scale_row_stride, bt_row_stride=p.bt_row_stride,
                num_tokens=p.num_tokens, batch=p.batch, max_blocks=p.max_blocks, num_blocks=p.num_blocks,
                block_size=p.block_size, head_dim=p.head_dim, scale_words=p.scale_words,
                tokens_per_cta=p.tokens_per_cta)


def launch_config(p: GatherPlan) -> LaunchConfig:
    return LaunchConfig(spec.entry_for(p.vec, p.tokens_per_cta, p.head_dim), spec.grid(p.num_tokens, p.tokens_per_cta),
                        struct_fields(p))


def _layout(p: GatherPlan, module=None) -> GatherLayout:
    """The layout of a GPU plan with rows to copy: for each vector width, launch_config's
    launch, ready (from the op's module of that width, or from ``module``, another build holding
    the entry points); the struct fields but the pointers do not depend on the width."""
    launches = {}
    for vec in spec.VECTOR_WIDTHS:
        cfg = launch_config(p._replace(vec=vec))
        if not launches:
            image = spec.PARAMS.image(**{n: v for n, v in cfg.fields.items() if n not in _NAMES})
        launches[vec] = Launch(module or spec.MODULES[vec], cfg.entry, cfg.grid, image)
    low_bits = _low_bits(p)
    widths = fast_path.widths_by_alignment(lambda bits: spec.vector_width(bits | low_bits))
    return GatherLayout(p.device, widths, _extents(p), launches, {})


def _run(layout: GatherLayout, kv_p: int, k_p: int, s_p: int, bt_p: int, cu_p: int) -> None:
    """Launch a call of ``layout`` whose pointers passed the checks (the op's fast path has
    these two lines inline)."""
    vec = layout.widths[(kv_p | k_p) & 15]  # spec.vector_width(kv_p | k_p | _low_bits(plan))
    (layout.launchers.get(vec) or fast_path.bind(layout, vec))((kv_p, k_p, s_p, bt_p, cu_p))


_layouts = LayoutMemo()


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
        return library.traced("cp_gather_indexer_k_quant_cache", kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    check, _, layout = _layouts.last
    try:
        if not check(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
            layout = _layouts.find(layout_key5(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens))
    except (AttributeError, RuntimeError):  # not tensors: plan_gather says which
        layout = None
    if layout is not None:  # the fast path: only the pointer checks, then _run's launch
        # Written inline, not as calls: each Python call is ~0.15 µs of a ~10 µs call.
        kv_p, k_p, s_p = kv_cache.data_ptr(), dst_k.data_ptr(), dst_scale.data_ptr()
        bt_p, cu_p = block_table.data_ptr(), cu_seq_lens.data_ptr()
        k_n, s_n, kv_n, bt_n, cu_n = layout.extents
        k_e, s_e, kv_e, bt_e, cu_e = k_p + k_n, s_p + s_n, kv_p + kv_n, bt_p + bt_n, cu_p + cu_n
        if not (kv_p | k_p | s_p) & 3 and not (  # aligned, and no written range overlaps a read one
                (k_p < kv_e and kv_p < k_e) or (s_p < kv_e and kv_p < s_e) or (k_p < bt_e and bt_p < k_e) or
                (s_p < bt_e and bt_p < s_e) or (k_p < cu_e and cu_p < k_e) or (s_p < cu_e and cu_p < s_e) or
                (k_p < s_e and s_p < k_e)):  # dst_k and dst_scale apart (side by side: the full checks)
            vec = layout.widths[(kv_p | k_p) & 15]
            (layout.launchers.get(vec) or fast_path.bind(layout, vec))((kv_p, k_p, s_p, bt_p, cu_p))
            return
    plan = plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    if plan.device < 0:
        settings.debug_enabled()  # a bad NVRTC_GATHER_DEBUG is refused on every device
        gather_torch(plan, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
        return
    if plan.num_tokens == 0 or plan.batch == 0:
        return
    layout = _layout(plan)
    _run(layout, plan.kv_ptr, plan.k_ptr, plan.s_ptr, plan.bt_ptr, plan.cu_ptr)
    tensors = (kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    _layouts.remember(layout_key5(*tensors), layout, tensors)


def prepared(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens, *, module=None, tokens_per_cta=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call (CUDA
    tensors) exactly as the op does, optionally with another build of the gather source
    (``module``, holding the entry point the call needs) or another rows-per-block choice."""
    plan = plan_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)
    if tokens_per_cta is not None:
        plan = plan._replace(tokens_per_cta=tokens_per_cta)
    layout = _layout(plan, module) if plan.num_tokens and plan.batch else None

    def run(_keep=(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)):  # the tensors outlive it
        if layout is not None:  # as the op: nothing to launch for an empty call
            _run(layout, plan.kv_ptr, plan.k_ptr, plan.s_ptr, plan.bt_ptr, plan.cu_ptr)
    return run


def gather_fake(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens) -> None:
    """The fake (meta) implementation: plan_gather's overlap check on the traced tensors'
    storages, where data pointers are not available (ops/fake_checks.py says why), after the
    eager type and rank checks (shapes are read after them)."""
    _check_types((kv_cache, dst_k, dst_scale, block_table, cu_seq_lens))
    if dst_k.size(0) and block_table.size(0):  # as plan_gather: only a call that writes rows
        fake_checks.check(WRITES, READS, dict(kv_cache=kv_cache, dst_k=dst_k, dst_scale=dst_scale,
                                              block_table=block_table, cu_seq_lens=cu_seq_lens))
        if dst_k.dim() == 2 and dst_scale.dim() == 2 and fake_checks.shares(dst_k, dst_scale):
            ke, se = dst_k.element_size(), dst_scale.element_size()
            checks.written_apart("dst_k", fake_checks.start(dst_k), dst_k.size(1) * ke, dst_k.stride(0) * ke,
                                 "dst_scale", fake_checks.start(dst_scale), dst_scale.size(1) * se,
                                 dst_scale.stride(0) * se, min(dst_k.size(0), dst_scale.size(0)))


library.register("cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor(a!) dst_k, Tensor(b!) dst_scale, "
                 "Tensor block_table, Tensor cu_seq_lens) -> ()", cp_gather_indexer_k_quant_cache, gather_fake)
