"""indexer_k_scatter: already-quantized fp8 rows and their fp32 scales written byte for byte
into the paged indexer cache (contract: docs/contract.md, "indexer_k_scatter"; SGLang's
``SetKAndS``).

Checks every argument (raising before anything is written), then runs the NVRTC kernel on CUDA
tensors (one launch; the family's spec is nvrtc_gather/kernels/indexer_k_scatter.py) or the
torch implementation (indexer_k_scatter_torch.py) on CPU tensors. Repeated layouts take the
shared fast path (fast_path.py). Registered as torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..kernels import indexer_k_scatter as spec
from . import checks, fake_checks, fast_path, library, paged_layout
from .fast_path import Launch, LayoutMemo, LaunchConfig, layout_key4
from .indexer_k_scatter_torch import scatter_torch

_K_DTYPES = (torch.float8_e4m3fn, torch.uint8)
_SCALE_DTYPES = (torch.float32, torch.uint8)
_KV_DTYPES = (torch.uint8, torch.float8_e4m3fn)
_SLOT_DTYPES = (torch.int64, torch.int32)
_SLOT_TYPES = {torch.int64: "i64", torch.int32: "i32"}  # the entry point's C type
_is_compiling = torch.compiler.is_compiling
_POINTERS = spec.PARAMS.pointer_names
WRITES, READS = ("kv_cache",), ("k", "k_scale", "slot_mapping")  # one list: the eager checks and the fake


class ScatterPlan(NamedTuple):
    """Sizes, byte strides and pointers of one validated call."""

    device: int            # CUDA ordinal, -1 for CPU
    num_tokens: int        # slot_mapping entries: rows of k and k_scale written
    head_dim: int          # fp8 bytes per token
    scale_words: int       # fp32 scales per token
    num_blocks: int
    block_size: int
    cache_stride: int      # bytes per token row of a block
    num_slots: int         # num_blocks * block_size
    block_stride: int      # bytes between cache blocks
    k_row_stride: int      # bytes
    scale_row_stride: int  # bytes
    slot_stride: int       # elements
    slot_type: str         # "i64" or "i32": the entry point
    k_ptr: int
    scale_ptr: int
    slot_ptr: int
    kv_ptr: int


def plan_scatter(k, k_scale, kv_cache, slot_mapping) -> ScatterPlan:
    """Validate the arguments of indexer_k_scatter; reads no tensor data. Raises TypeError or
    ValueError naming the argument."""
    _check_types(k, k_scale, kv_cache, slot_mapping)
    dev = checks.same_device({"k": k, "k_scale": k_scale, "kv_cache": kv_cache, "slot_mapping": slot_mapping})
    rows, head_dim = k.shape
    scale2d, scale_words = _scale_rows(k_scale)
    num_tokens = slot_mapping.size(0)
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"k: head_dim (dim 1) must be a positive multiple of 4, got shape {tuple(k.shape)}")
    if scale_words < 1 or head_dim % scale_words:
        raise ValueError(f"k_scale: {scale_words} scales per token do not divide head_dim={head_dim} "
                         f"(one fp32 scale per quant block), got shape {tuple(k_scale.shape)}")
    if num_tokens > rows:
        raise ValueError(f"slot_mapping: {num_tokens} entries, more than the {rows} rows of k "
                         "(only the first len(slot_mapping) rows of k are written)")
    if num_tokens > scale2d.size(0):
        raise ValueError(f"slot_mapping: {num_tokens} entries, more than the {scale2d.size(0)} rows of k_scale")
    num_blocks, block_size, cache_stride = kv_cache.shape
    block_stride = paged_layout.block_stride(kv_cache, kv_cache.shape, head_dim, scale_words)
    checks.unit_inner_stride("k", k)
    checks.unit_inner_stride("k_scale", scale2d)
    if num_tokens > 1:
        checks.unit_inner_stride("slot_mapping", slot_mapping)
    for name, what, value in (("slot_mapping", "num_tokens", num_tokens),
                              ("kv_cache", "block_size * cache_stride", block_size * cache_stride)):
        checks.fits_int32(name, what, value)
    plan = ScatterPlan(
        device=dev.index if dev.type == "cuda" else -1, num_tokens=num_tokens, head_dim=head_dim,
        scale_words=scale_words, num_blocks=num_blocks, block_size=block_size, cache_stride=cache_stride,
        num_slots=num_blocks * block_size, block_stride=block_stride, k_row_stride=k.stride(0),
        scale_row_stride=scale2d.stride(0) * scale2d.element_size(), slot_stride=slot_mapping.stride(0),
        slot_type=_SLOT_TYPES[slot_mapping.dtype],
        k_ptr=k.data_ptr(), scale_ptr=k_scale.data_ptr(), slot_ptr=slot_mapping.data_ptr(),
        kv_ptr=kv_cache.data_ptr())
    checks.aligned("kv_cache", "data pointer", plan.kv_ptr)
    checks.aligned("kv_cache", "stride(0)", block_stride)
    checks.aligned("k", "data pointer", plan.k_ptr)
    checks.aligned("k_scale", "data pointer", plan.scale_ptr)
    if num_tokens > 1:
        checks.aligned("k", "row stride", plan.k_row_stride)
        checks.aligned("k_scale", "row stride", plan.scale_row_stride)
    if num_tokens:
        extents = _extents(plan)
        reads = (plan.k_ptr, plan.scale_ptr, plan.slot_ptr)
        if fast_path.overlapping(plan.kv_ptr, reads, extents):
            checks.disjoint_from(WRITES[0], plan.kv_ptr, READS, reads, extents)
    return plan


def _check_types(k, k_scale, kv_cache, slot_mapping) -> None:
    for name, t in (("k", k), ("k_scale", k_scale), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        checks.tensor(name, t)
    checks.dtype_in("k", k, _K_DTYPES)
    checks.dtype_in("k_scale", k_scale, _SCALE_DTYPES)
    checks.dtype_in("kv_cache", kv_cache, _KV_DTYPES)
    checks.dtype_in("slot_mapping", slot_mapping, _SLOT_DTYPES)
    checks.rank("k", k, 2, "[num_tokens, head_dim]")
    checks.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, cache_stride]")
    checks.rank("slot_mapping", slot_mapping, 1, "[num_tokens]")
    _scale_rows(k_scale)


def _scale_rows(k_scale: torch.Tensor) -> tuple[torch.Tensor, int]:
    """k_scale as rows ([rows, scale_words] float32 or [rows, 4 * scale_words] uint8) and
    scale_words. A 1-D float32 k_scale is one scale per token (SGLang's [num_tokens])."""
    if k_scale.dtype == torch.float32 and k_scale.dim() == 1:
        return k_scale.unsqueeze(1), 1
    checks.rank("k_scale", k_scale, 2, "[num_tokens, scales per token] (float32; or [num_tokens] for one "
                                       "scale per token; or uint8 [num_tokens, 4 * scales per token])")
    if k_scale.dtype == torch.float32:
        return k_scale, k_scale.size(1)
    if k_scale.size(1) % 4:
        raise ValueError(f"k_scale: a uint8 k_scale holds 4 bytes per fp32 scale, got shape {tuple(k_scale.shape)}")
    return k_scale, k_scale.size(1) // 4


def _extents(p: ScatterPlan) -> tuple[int, int, int, int]:
    """Bytes from each data pointer to the end of what the call touches: kv_cache (written),
    k, k_scale, slot_mapping (read). num_tokens > 0."""
    return ((p.num_blocks - 1) * p.block_stride + p.block_size * p.cache_stride if p.num_blocks else 0,
            (p.num_tokens - 1) * p.k_row_stride + p.head_dim,
            (p.num_tokens - 1) * p.scale_row_stride + 4 * p.scale_words,
            (8 if p.slot_type == "i64" else 4) * ((p.num_tokens - 1) * p.slot_stride + 1))


def _low_bits(p: ScatterPlan) -> int:
    """The layout's bits of the vector width's alignment; the pointers add theirs per call."""
    return p.head_dim | (p.k_row_stride if p.num_tokens > 1 else 0) | (p.block_stride if p.num_blocks > 1 else 0)


class ScatterLayout(NamedTuple):
    """What a call with a remembered layout needs besides its data pointers (fast_path.py)."""

    device: int
    widths: tuple     # vector width by the low 4 bits of (k's pointer | kv_cache's pointer)
    extents: tuple    # _extents of the plan
    launches: dict    # vector width -> fast_path.Launch
    launchers: dict   # vector width -> its launcher, made on first use (fast_path.bind)


def struct_fields(p: ScatterPlan) -> dict:
    """The ScatterParams fields of a GPU plan, by name, but the error buffer."""
    return dict(k=p.k_ptr, k_scale=p.scale_ptr, slot_mapping=p.slot_ptr, kv_cache=p.kv_ptr,
                k_row_stride=p.k_row_stride, scale_row_stride=p.scale_row_stride, block_stride=p.block_stride,
                num_slots=p.num_slots, num_tokens=p.num_tokens, block_size=p.block_size, head_dim=p.head_dim,
                scale_words=p.scale_words)


def launch_config(p: ScatterPlan, vec: int | None = None) -> LaunchConfig:
    """The launch of a validated call with num_tokens > 0, at the width its pointers allow (or
    at ``vec``)."""
    vec = vec or spec.vector_width(p.k_ptr | p.kv_ptr | _low_bits(p))
    fixed = spec.is_fixed_layout(p.block_size, p.head_dim, p.scale_words)
    return LaunchConfig(spec.entry_name(vec, p.slot_type, fixed),
                        spec.grid(vec, p.num_tokens, p.head_dim, p.scale_words), struct_fields(p))


def _layout(p: ScatterPlan) -> ScatterLayout:
    low = _low_bits(p)
    launches = {}
    for vec in spec.VECTOR_WIDTHS:
        if low % vec:
            continue  # a width this layout never takes, whatever the pointers
        cfg = launch_config(p, vec)
        launches[vec] = Launch(spec.MODULES[vec], cfg.entry, cfg.grid,
                               spec.PARAMS.image(**{n: v for n, v in cfg.fields.items() if n not in _POINTERS}))
    widths = fast_path.widths_by_alignment(lambda bits: spec.vector_width(bits | low))
    return ScatterLayout(p.device, widths, _extents(p), launches, {})


def _run(layout: ScatterLayout, k_p: int, ks_p: int, sm_p: int, kv_p: int) -> None:
    """Launch a call of ``layout`` whose pointers passed the checks."""
    vec = layout.widths[(k_p | kv_p) & 15]
    (layout.launchers.get(vec) or fast_path.bind(layout, vec))((k_p, ks_p, sm_p, kv_p))


def run_remembered(layout: ScatterLayout, k_p: int, ks_p: int, sm_p: int, kv_p: int) -> bool:
    """The fast path of a call whose metadata matches ``layout``: launch it if its pointers pass
    the pointer checks (4-byte aligned, the cache overlapping no input) and say so; False: the
    caller runs the full checks, which name what is wrong."""
    if not (k_p | ks_p | kv_p) & 3 and not fast_path.overlapping(kv_p, (k_p, ks_p, sm_p), layout.extents):
        _run(layout, k_p, ks_p, sm_p, kv_p)
        return True
    return False


def launch_planned(plan: ScatterPlan) -> ScatterLayout | None:
    """Launch a validated GPU plan (nothing when it has no rows); its layout, for run_remembered."""
    if plan.num_tokens == 0:
        return None
    layout = _layout(plan)
    _run(layout, plan.k_ptr, plan.scale_ptr, plan.slot_ptr, plan.kv_ptr)
    return layout


_layouts = LayoutMemo()


def indexer_k_scatter(k: torch.Tensor, k_scale: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Write already-quantized rows into the paged indexer cache, byte for byte.

    Row ``i < len(slot_mapping)`` of ``k`` (fp8-e4m3 or uint8, ``[num_tokens, head_dim]``) and
    of ``k_scale`` (float32 ``[num_tokens, nq]``, or ``[num_tokens]`` for ``nq == 1``, or uint8
    ``[num_tokens, 4 * nq]``) go to slot ``s = slot_mapping[i]`` (int64 or int32): cache block
    ``s // block_size``, row ``s % block_size``, values and scales where docs/contract.md §1
    puts them; ``s < 0`` is padding and skipped.

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation; slots
    past the cache are skipped (NVRTC_GATHER_DEBUG=1 reports them). CPU tensors: a torch
    implementation with identical bytes that raises ValueError on such a slot before writing
    anything. Two rows for one slot: which lands is unspecified."""
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return library.traced("indexer_k_scatter", k, k_scale, kv_cache, slot_mapping)
    check, _, layout = _layouts.last
    try:
        if not check(k, k_scale, kv_cache, slot_mapping):
            layout = _layouts.find(_key(k, k_scale, kv_cache, slot_mapping))
    except (AttributeError, TypeError, RuntimeError):  # not tensors: plan_scatter says which
        layout = None
    if layout is not None and run_remembered(layout, k.data_ptr(), k_scale.data_ptr(), slot_mapping.data_ptr(),
                                             kv_cache.data_ptr()):  # the fast path: only the pointer checks
        return
    plan = plan_scatter(k, k_scale, kv_cache, slot_mapping)
    if plan.device < 0:
        scatter_torch(plan, k, k_scale, kv_cache, slot_mapping)
        return
    layout = launch_planned(plan)
    if layout is not None:
        _layouts.remember(_key(k, k_scale, kv_cache, slot_mapping), layout, (k, k_scale, kv_cache, slot_mapping))


def _key(k, k_scale, kv_cache, slot_mapping) -> tuple:
    return (layout_key4(k, k_scale, kv_cache, slot_mapping),
            k_scale.is_neg())  # fp32 scales may be a negative view (of a complex's .imag): full checks


def scatter_fake(k, k_scale, kv_cache, slot_mapping) -> None:
    """The fake (meta) implementation: plan_scatter's overlap check on the traced tensors'
    storages (ops/fake_checks.py says why); only the rows that are read count. The eager
    type and rank checks come first (shapes are read after them)."""
    _check_types(k, k_scale, kv_cache, slot_mapping)
    n = slot_mapping.size(0)
    if n:
        fake_checks.check(WRITES, READS, dict(kv_cache=kv_cache, k=k, k_scale=k_scale, slot_mapping=slot_mapping),
                          {"k": n, "k_scale": n})


library.register("indexer_k_scatter(Tensor k, Tensor k_scale, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()",
                 indexer_k_scatter, scatter_fake)
