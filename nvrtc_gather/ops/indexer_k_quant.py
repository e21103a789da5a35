"""indexer_k_quant_and_cache: the torch-facing write op (contract: docs/contract.md §2).

Checks every argument (raising before anything is written), then runs the NVRTC kernel
on CUDA tensors (one launch; the kernel family's spec and policy are in
nvrtc_gather/kernels/indexer_k_quant.py) or the vectorized torch implementation
(indexer_k_quant_torch.py) on CPU tensors. Repeated layouts take the shared fast path
(fast_path.py). Registered as torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..kernels import indexer_k_quant as spec
from ..jit import driver
from . import checks, fake_checks, fast_path, library, paged_layout
from .fast_path import Launch, LaunchConfig, LayoutMemo, layout_key3
from .indexer_k_quant_torch import quant_torch

_FP8 = torch.float8_e4m3fn
_KV_DTYPES = (torch.uint8, _FP8)
TYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}  # k dtype -> the spec's name
_K_DTYPES = tuple(TYPE_NAMES)
_I64 = torch.int64
_is_compiling = torch.compiler.is_compiling
_POINTERS = spec.PARAMS.pointer_names
# What the op writes and reads, in _extents' order: the one list the full checks (plan_quant),
# the fast path and the fake (quant_fake) take their names from.
WRITES, READS = ("kv_cache",), ("k", "slot_mapping")

# scale_fmt -> ue8m0. Plain fp32 scales are spelled "fp8_e4m3", "fp8e4m3" (vllm-xpu-kernels'
# tests), "" or None (what engines pass); anything else is a typo and rejected. vLLM's own op
# treats every value but "ue8m0" as plain: its adapter (integrations/vllm.py) does the same.
SCALE_FMTS = {"ue8m0": True, "fp8_e4m3": False, "fp8e4m3": False, "": False, None: False}


class QuantPlan(NamedTuple):
    """Sizes, byte strides, pointers and kernel choice of one validated call."""

    device: int               # CUDA ordinal, -1 for CPU
    k_type: str               # "bf16", "f16" or "f32"
    element_size: int         # bytes per k element
    num_tokens: int           # slot_mapping entries: rows of k written
    head_dim: int
    quant_block_size: int
    num_blocks: int
    block_size: int
    cache_stride: int         # bytes per token row of a block
    num_slots: int            # num_blocks * block_size
    block_stride: int         # bytes between cache blocks
    k_row_stride: int         # bytes
    slot_stride: int          # elements
    ue8m0: bool
    vec: int                  # bytes per k load of the vector kernels; 0: the generic kernel
    tokens_per_pass: int      # vector kernels: tokens one pass of a block covers
    sm_count: int             # the GPU's SMs (the kernel shape depends on them); 0 for CPU
    k_ptr: int
    slot_ptr: int
    kv_ptr: int


# -- the full checks ---------------------------------------------------------------------------

def plan_quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> QuantPlan:
    """Validate the arguments of indexer_k_quant_and_cache; reads no tensor data. Each step
    checks one argument (or one relation between them) and raises TypeError or ValueError
    naming it."""
    _check_types(k, kv_cache, slot_mapping)
    qbs = checks.int_arg("quant_block_size", quant_block_size, tensors=True)
    ue8m0 = _scale_fmt(scale_fmt)
    device = _device(k, kv_cache, slot_mapping)
    rows, head_dim = k.shape
    num_blocks, block_size, cache_stride = kv_cache.shape
    num_tokens = slot_mapping.shape[0]
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"k: head_dim (dim 1) must be a positive multiple of 4, got shape {tuple(k.shape)}")
    if qbs < 1 or head_dim % qbs:
        raise ValueError(f"quant_block_size: must be a positive divisor of head_dim={head_dim}, got {qbs}")
    if num_tokens > rows:
        raise ValueError(f"slot_mapping: {num_tokens} entries, more than the {rows} rows of k "
                         "(only the first len(slot_mapping) rows of k are written)")
    block_stride = paged_layout.block_stride(kv_cache, kv_cache.shape, head_dim, head_dim // qbs)
    checks.unit_inner_stride("k", k)
    if num_tokens > 1:
        checks.unit_inner_stride("slot_mapping", slot_mapping)
    for name, what, value in (("slot_mapping", "num_tokens", num_tokens),
                              ("kv_cache", "block_size * head_dim", block_size * head_dim),
                              ("kv_cache", "cache_stride", cache_stride)):
        checks.fits_int32(name, what, value)
    esize = k.element_size()
    plan = QuantPlan(
        device=device, k_type=TYPE_NAMES[k.dtype], element_size=esize, num_tokens=num_tokens, head_dim=head_dim,
        quant_block_size=qbs, num_blocks=num_blocks, block_size=block_size, cache_stride=cache_stride,
        num_slots=num_blocks * block_size, block_stride=block_stride, k_row_stride=k.stride(0) * esize,
        slot_stride=slot_mapping.stride(0), ue8m0=ue8m0, vec=0, tokens_per_pass=0, sm_count=0,
        k_ptr=k.data_ptr(), slot_ptr=slot_mapping.data_ptr(), kv_ptr=kv_cache.data_ptr())
    checks.aligned("kv_cache", "data pointer", plan.kv_ptr)
    checks.aligned("kv_cache", "stride(0)", block_stride)
    checks.aligned("k", "data pointer", plan.k_ptr, esize)
    if num_tokens:  # the kernel writes kv_cache while it reads k and slot_mapping
        extents = _extents(plan)
        if fast_path.overlapping(plan.kv_ptr, (plan.k_ptr, plan.slot_ptr), extents):
            checks.disjoint_from(WRITES[0], plan.kv_ptr, READS, (plan.k_ptr, plan.slot_ptr), extents)
    vec = spec.vector_width(plan.k_ptr | _low_bits(plan), esize, head_dim, qbs)
    return plan._replace(vec=vec, tokens_per_pass=spec.tokens_per_pass(vec, esize, head_dim),
                         sm_count=driver.sm_count(device) if device >= 0 else 0)


def _check_types(k, kv_cache, slot_mapping) -> None:
    for name, t in (("k", k), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
        checks.tensor(name, t)
    checks.dtype_in("k", k, _K_DTYPES)
    checks.dtype_in("kv_cache", kv_cache, _KV_DTYPES)
    checks.dtype_in("slot_mapping", slot_mapping, (_I64,))
    checks.rank("k", k, 2, "[num_tokens, head_dim]")
    checks.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, cache_stride]")
    checks.rank("slot_mapping", slot_mapping, 1, "[num_tokens]")


def _scale_fmt(scale_fmt) -> bool:
    """Whether scale_fmt asks for power-of-two (ue8m0) scales."""
    try:
        return SCALE_FMTS[scale_fmt]
    except (KeyError, TypeError):
        if not isinstance(scale_fmt, str):
            raise TypeError(f"scale_fmt: expected a str (\"ue8m0\" or \"fp8_e4m3\"), got "
                            f"{checks.type_name(scale_fmt)}") from None
        raise ValueError(f"scale_fmt: expected \"ue8m0\" (power-of-two scales) or \"fp8_e4m3\" "
                         f"(plain fp32 scales; \"fp8e4m3\", \"\" and None mean the same), got {scale_fmt!r}") from None


def _device(k, kv_cache, slot_mapping) -> int:
    dev = checks.same_device({"k": k, "kv_cache": kv_cache, "slot_mapping": slot_mapping})
    return dev.index if dev.type == "cuda" else -1


def _low_bits(p: QuantPlan) -> int:
    """The layout's bits of k's alignment; k's data pointer adds its own per call."""
    return p.k_row_stride if p.num_tokens > 1 else 0


# -- extents: one definition for the full checks and the fast path (fast_path.overlapping) ------

def _extents(p: QuantPlan) -> tuple[int, int, int]:
    """Bytes from each data pointer to the end of what the call touches: kv_cache (written),
    k, slot_mapping (read). num_tokens > 0."""
    return ((p.num_blocks - 1) * p.block_stride + p.block_size * p.cache_stride if p.num_blocks else 0,
            (p.num_tokens - 1) * p.k_row_stride + p.head_dim * p.element_size,
            8 * ((p.num_tokens - 1) * p.slot_stride + 1))


# -- launching ---------------------------------------------------------------------------------

class QuantLayout(NamedTuple):
    """What a call with a remembered layout needs besides its data pointers (fast_path.py)."""

    device: int
    widths: tuple           # vector width by the low 4 bits of k's pointer
    element_size: int
    extents: tuple          # _extents of the plan
    launches: dict          # vector width -> fast_path.Launch
    launchers: dict         # vector width -> its launcher, made on first use (fast_path.bind)


def struct_fields(p: QuantPlan) -> dict:
    """The QuantParams fields of a GPU plan, by name, but the error buffer."""
    return dict(k=p.k_ptr, slot_mapping=p.slot_ptr, kv_cache=p.kv_ptr, k_row_stride=p.k_row_stride,
                block_stride=p.block_stride, num_slots=p.num_slots, num_tokens=p.num_tokens,
                block_size=p.block_size, head_dim=p.head_dim, quant_block_size=p.quant_block_size,
                tokens_per_pass=p.tokens_per_pass, ue8m0=int(p.ue8m0))


def call_shape(p: QuantPlan, shape: str | None = None) -> str:
    """The kernel shape of a validated call: spec.shape_for's choice, or ``shape`` ("" or
    "small") forced on the vector kernels (the generic kernel has one shape, "")."""
    if shape is None or not p.vec:
        return spec.shape_for(p.vec, p.num_tokens, p.tokens_per_pass, p.sm_count)
    return shape


def launch_config(p: QuantPlan, shape: str | None = None) -> LaunchConfig:
    """The launch of a validated call with num_tokens > 0, in call_shape(p, shape)."""
    s = call_shape(p, shape)
    return LaunchConfig(spec.entry_name(p.k_type, p.vec, s),
                        spec.grid(p.vec, p.num_tokens, p.tokens_per_pass, p.head_dim, p.quant_block_size, s),
                        struct_fields(p))


def _layout(p: QuantPlan, module=None, shape: str | None = None) -> QuantLayout:
    """The layout of a GPU plan with tokens to write: a ready launch per vector width, from
    the op's module for it (or from ``module``, another build holding the entry points), in
    the call's shape (or in ``shape``, for the vector kernels)."""
    launches = {}
    for vec in spec.VECTOR_WIDTHS:
        if vec and spec.vector_width(vec, p.element_size, p.head_dim, p.quant_block_size) != vec:
            continue  # a width this layout never takes, whatever k's alignment
        pv = p._replace(vec=vec, tokens_per_pass=spec.tokens_per_pass(vec, p.element_size, p.head_dim))
        s = call_shape(pv, shape)
        cfg = launch_config(pv, s)
        launches[vec] = Launch(module or spec.MODULES[p.k_type, vec, s], cfg.entry, cfg.grid,
                               spec.PARAMS.image(**{n: v for n, v in cfg.fields.items() if n not in _POINTERS}))
    low_bits = _low_bits(p)
    widths = fast_path.widths_by_alignment(
        lambda bits: spec.vector_width(bits | low_bits, p.element_size, p.head_dim, p.quant_block_size))
    return QuantLayout(p.device, widths, p.element_size, _extents(p), launches, {})


def _run(layout: QuantLayout, k_p: int, sm_p: int, kv_p: int) -> None:
    """Launch a call of ``layout`` whose pointers passed the checks."""
    vec = layout.widths[k_p & 15]  # spec.vector_width(k_p | _low_bits(plan), ...)
    (layout.launchers.get(vec) or fast_path.bind(layout, vec))((k_p, sm_p, kv_p))


_layouts = LayoutMemo()


def indexer_k_quant_and_cache(k: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                              quant_block_size: int, scale_fmt: str | None) -> None:
    """Quantize rows of ``k`` to fp8-e4m3 and write them into the paged indexer cache.

    Row ``i < len(slot_mapping)`` of ``k`` goes to slot ``s = slot_mapping[i]``: cache block
    ``s // block_size``, row ``s % block_size``; ``s < 0`` is padding and skipped. Each quant
    block of ``quant_block_size`` elements gets an fp32 scale ``max(amax, 1e-4) / 448``
    (rounded up to a power of two when ``scale_fmt == "ue8m0"``; ``"fp8_e4m3"``,
    ``"fp8e4m3"``, ``""`` or None keep it plain) and its values are stored as fp8-e4m3 of ``k / scale``.

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation;
    slots past the cache are skipped (set NVRTC_GATHER_DEBUG=1 to have them reported). CPU
    tensors: a torch implementation with identical bytes that raises ValueError on such a
    slot before writing anything.
    """
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return library.traced("indexer_k_quant_and_cache", k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
    layout = None
    if type(quant_block_size) is int:  # a bool or an int-like object takes the full checks
        check, options, layout = _layouts.last
        try:
            if not check(k, kv_cache, slot_mapping) or options != (quant_block_size, scale_fmt):
                layout = _layouts.find(_key(k, kv_cache, slot_mapping, quant_block_size, scale_fmt))
        except (AttributeError, TypeError, RuntimeError):  # not tensors, an unhashable scale_fmt: plan_quant says which
            layout = None
    if layout is not None:  # the fast path: only the pointer checks
        k_p, sm_p, kv_p = k.data_ptr(), slot_mapping.data_ptr(), kv_cache.data_ptr()
        if not kv_p & 3 and not k_p % layout.element_size and \
                not fast_path.overlapping(kv_p, (k_p, sm_p), layout.extents):
            _run(layout, k_p, sm_p, kv_p)
            return
    plan = plan_quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
    if plan.device < 0:
        settings.debug_enabled()  # a bad NVRTC_GATHER_DEBUG is refused on every device
        quant_torch(plan, k, kv_cache, slot_mapping)
        return
    if plan.num_tokens == 0:
        return
    layout = _layout(plan)
    _run(layout, plan.k_ptr, plan.slot_ptr, plan.kv_ptr)
    if type(quant_block_size) is int:
        _layouts.remember(_key(k, kv_cache, slot_mapping, quant_block_size, scale_fmt), layout,
                          (k, kv_cache, slot_mapping), (quant_block_size, scale_fmt))


def _key(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> tuple:
    return (layout_key3(k, kv_cache, slot_mapping), quant_block_size, scale_fmt,
            k.is_neg())  # a float k may be a negative view (of a complex's .imag): full checks


def prepared(k, kv_cache, slot_mapping, quant_block_size, scale_fmt, *, module=None, shape=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call (CUDA
    tensors) exactly as the op does, optionally with another build of the quant source
    (``module``, holding the entry point the call needs) or the vector kernels' other shape
    (``shape``: "" or "small")."""
    plan = plan_quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
    layout = _layout(plan, module, shape) if plan.num_tokens else None

    def run(_keep=(k, kv_cache, slot_mapping)):  # the tensors outlive it
        if layout is not None:
            _run(layout, plan.k_ptr, plan.slot_ptr, plan.kv_ptr)
    return run


def quant_fake(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> None:
    """The fake (meta) implementation: plan_quant's overlap check on the traced tensors'
    storages (ops/fake_checks.py says why); only the rows of k that are read count. The eager
    type and rank checks come first (shapes are read after them)."""
    _check_types(k, kv_cache, slot_mapping)
    num_tokens = slot_mapping.size(0)
    if num_tokens and k.dim() == 2 and num_tokens <= k.size(0):
        fake_checks.check(WRITES, READS, dict(kv_cache=kv_cache, k=k, slot_mapping=slot_mapping), {"k": num_tokens})


library.register("indexer_k_quant_and_cache(Tensor k, Tensor(a!) kv_cache, Tensor slot_mapping, "
                 "int quant_block_size, str? scale_fmt) -> ()", indexer_k_quant_and_cache, quant_fake)
