"""concat_and_cache_mla: the torch-facing MLA-cache write op (contract: docs/contract.md §4).

Checks every argument (raising before anything is written), then runs the NVRTC kernel on CUDA
tensors (one launch; spec and policy in nvrtc_gather/kernels/mla_cache.py) or the vectorized
torch implementation (mla_write_torch.py) on CPU tensors. Repeated layouts take the shared fast
path (fast_path.py). Registered as torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..kernels import mla_cache as spec
from . import checks, fake_checks, fast_path, library
from .fast_path import Launch, LaunchConfig, LayoutMemo
from .mla_write_torch import write_torch

_FP8 = torch.float8_e4m3fn
_BYTE_CACHES = (torch.uint8, _FP8)
TYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}  # kv_c dtype -> the spec's name
_is_compiling = torch.compiler.is_compiling
_POINTERS = spec.WRITE_PARAMS.pointer_names
# What the op writes and reads, in _extents' order: the one list the full checks (plan_write),
# the fast path (_read_pointers) and the fake (write_fake) take their names from.
WRITES, READS = ("kv_cache",), ("kv_c", "k_pe", "slot_mapping", "scale")

# kv_cache_dtype -> format, as vLLM's op reads it ("fp8_e5m2" and the nvfp4 record are not
# served: DeepSeek's caches are e4m3).
FORMATS = {"fp8_ds_mla": "ds", "auto": "copy", "bfloat16": "copy", "float16": "copy", "fp8": "fp8", "fp8_e4m3": "fp8"}
# ds_scale_rule -> flags: the fp8_ds_mla tile scale, vLLM's current rule or its older one.
SCALE_RULES = {"pow2": spec.POW2_SCALES, "plain": 0}


class WritePlan(NamedTuple):
    """Sizes, byte strides, pointers and kernel choice of one validated call."""

    device: int               # CUDA ordinal, -1 for CPU
    fmt: str                  # "ds", "copy" or "fp8"
    k_type: str               # "bf16", "f16" or "f32"
    element_size: int
    num_tokens: int           # slot_mapping entries: rows of kv_c / k_pe written
    kv_lora_rank: int
    pe_dim: int
    num_blocks: int
    block_size: int
    num_slots: int
    block_stride: int         # bytes
    entry_stride: int         # bytes
    kv_c_row_stride: int      # bytes
    k_pe_row_stride: int      # bytes
    slot_stride: int          # elements
    flags: int                # spec.POW2_SCALES | spec.SKIP_SCALE
    vec: int                  # fp8_ds_mla: 16, or 0 (the kernel of any alignment)
    kv_c_ptr: int
    k_pe_ptr: int
    slot_ptr: int
    scale_ptr: int            # 0 unless the plain fp8 format reads it
    kv_ptr: int


# -- the full checks ---------------------------------------------------------------------------

def plan_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False,
               ds_scale_rule="pow2") -> WritePlan:
    """Validate the arguments of concat_and_cache_mla; reads no tensor data. Each step checks
    one argument (or one relation between them) and raises TypeError or ValueError naming it."""
    fmt = _format(kv_cache_dtype)
    flags = _flags(fmt, skip_scale, ds_scale_rule)
    _check_types(kv_c, k_pe, kv_cache, slot_mapping, scale, fmt)
    reads_scale = _reads_scale(fmt, flags)
    named = {"kv_c": kv_c, "k_pe": k_pe, "kv_cache": kv_cache, "slot_mapping": slot_mapping}
    if reads_scale:
        named["scale"] = scale
    dev = checks.same_device(named)
    num_tokens = slot_mapping.shape[0]
    rank, pe_dim = kv_c.shape[1], k_pe.shape[1]
    for name, t in (("kv_c", kv_c), ("k_pe", k_pe)):
        if num_tokens > t.shape[0]:
            raise ValueError(f"slot_mapping: {num_tokens} entries, more than the {t.shape[0]} rows of {name} "
                             "(only the first len(slot_mapping) rows are written)")
        checks.unit_inner_stride(name, t)
    if num_tokens > 1:
        checks.unit_inner_stride("slot_mapping", slot_mapping)
    width = _check_widths(fmt, kv_c, rank, pe_dim, kv_cache)
    block_stride, entry_stride = _entry_strides(kv_cache, width)
    if reads_scale and scale.numel() < 1:
        raise ValueError("scale: the fp8 format divides by scale[0]; got an empty tensor")
    num_blocks, block_size, _ = kv_cache.shape
    for name, what, value in (("slot_mapping", "num_tokens", num_tokens), ("kv_cache", "block_size", block_size),
                              ("kv_c", "kv_lora_rank", rank), ("k_pe", "pe_dim", pe_dim)):
        checks.fits_int32(name, what, value)
    esize = kv_c.element_size()
    plan = WritePlan(
        device=dev.index if dev.type == "cuda" else -1, fmt=fmt, k_type=TYPE_NAMES[kv_c.dtype], element_size=esize,
        num_tokens=num_tokens, kv_lora_rank=rank, pe_dim=pe_dim, num_blocks=num_blocks, block_size=block_size,
        num_slots=num_blocks * block_size, block_stride=block_stride, entry_stride=entry_stride,
        kv_c_row_stride=kv_c.stride(0) * esize, k_pe_row_stride=k_pe.stride(0) * esize,
        slot_stride=slot_mapping.stride(0), flags=flags, vec=0,
        kv_c_ptr=kv_c.data_ptr(), k_pe_ptr=k_pe.data_ptr(), slot_ptr=slot_mapping.data_ptr(),
        scale_ptr=scale.data_ptr() if reads_scale else 0, kv_ptr=kv_cache.data_ptr())
    if fmt == "ds":  # the record's scales are 4-byte words
        for what, value in (("data pointer", plan.kv_ptr), ("stride(0) in bytes", block_stride),
                            ("stride(1) in bytes", entry_stride)):
            checks.aligned("kv_cache", what, value)
    if num_tokens:
        extents = _extents(plan)
        if fast_path.overlapping(plan.kv_ptr, _read_pointers(plan), extents):
            checks.disjoint_from(WRITES[0], plan.kv_ptr, READS, _read_pointers(plan), extents)
    return plan._replace(vec=spec.vector_width(_low_bits(plan) | plan.kv_c_ptr | plan.k_pe_ptr | plan.kv_ptr)
                         if fmt == "ds" else 0)


def _reads_scale(fmt: str, flags: int) -> bool:
    """Whether the call reads scale[0]: the plain fp8 format, unless skip_scale."""
    return fmt == "fp8" and not flags & spec.SKIP_SCALE


def _format(kv_cache_dtype) -> str:
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {checks.type_name(kv_cache_dtype)}")
    try:
        return FORMATS[kv_cache_dtype]
    except KeyError:
        raise ValueError(f"kv_cache_dtype: expected one of {', '.join(repr(f) for f in FORMATS)}, "
                         f"got {kv_cache_dtype!r}") from None


def _flags(fmt: str, skip_scale, ds_scale_rule) -> int:
    if not isinstance(skip_scale, bool):
        raise TypeError(f"skip_scale: expected a bool, got {checks.type_name(skip_scale)}")
    if ds_scale_rule not in SCALE_RULES:
        raise ValueError(f"ds_scale_rule: expected \"pow2\" (tile scales rounded up to a power of two, vLLM's "
                         f"current rule) or \"plain\" (max(amax / 448, FLT_MIN), its older one), got {ds_scale_rule!r}")
    return SCALE_RULES[ds_scale_rule] | (spec.SKIP_SCALE if skip_scale else 0)


def _check_types(kv_c, k_pe, kv_cache, slot_mapping, scale, fmt) -> None:
    for name, t in (("kv_c", kv_c), ("k_pe", k_pe), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping),
                    ("scale", scale)):
        checks.tensor(name, t)
    types = (torch.bfloat16, torch.float16) if fmt == "ds" else tuple(TYPE_NAMES)
    checks.dtype_in("kv_c", kv_c, types)
    if k_pe.dtype != kv_c.dtype:
        raise TypeError(f"k_pe: expected dtype {kv_c.dtype} like kv_c, got {k_pe.dtype}")
    if fmt == "copy":
        if kv_cache.dtype != kv_c.dtype:
            raise TypeError(f"kv_cache: the \"auto\" / \"bfloat16\" / \"float16\" formats store kv_c's dtype "
                            f"{kv_c.dtype}, got {kv_cache.dtype}")
    else:
        checks.dtype_in("kv_cache", kv_cache, _BYTE_CACHES)
    checks.dtype_in("slot_mapping", slot_mapping, (torch.int64,))
    checks.rank("kv_c", kv_c, 2, "[num_tokens, kv_lora_rank]")
    checks.rank("k_pe", k_pe, 2, "[num_tokens, pe_dim]")
    checks.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, entry]")
    checks.rank("slot_mapping", slot_mapping, 1, "[num_tokens]")
    if fmt == "fp8":
        checks.dtype_in("scale", scale, (torch.float32,))


def _check_widths(fmt, kv_c, rank, pe_dim, kv_cache) -> int:
    """The entry width of the format in kv_cache's elements, checked against its dim 2."""
    if fmt == "ds":
        if rank != spec.NOPE:
            raise ValueError(f"kv_c: fp8_ds_mla stores {spec.NOPE} values per token, got shape {tuple(kv_c.shape)}")
        if pe_dim not in (spec.ROPE, 0):
            raise ValueError(f"k_pe: fp8_ds_mla stores {spec.ROPE} values per token (or none: pe_dim 0), "
                             f"got pe_dim {pe_dim}")
        width = spec.RECORD_BYTES
    else:
        width = rank + pe_dim
    if kv_cache.shape[2] != width:
        what = f"the {spec.RECORD_BYTES}-byte fp8_ds_mla record" if fmt == "ds" else "kv_lora_rank + pe_dim"
        raise ValueError(f"kv_cache: dim 2 must be {what} = {width}, got shape {tuple(kv_cache.shape)}")
    return width


def _entry_strides(kv_cache, width: int) -> tuple[int, int]:
    """(block stride, entry stride) in bytes; every entry contiguous and apart from the others."""
    num_blocks, block_size, _ = kv_cache.shape
    if block_size < 1:
        raise ValueError(f"kv_cache: block_size (dim 1) must be >= 1, got shape {tuple(kv_cache.shape)}")
    s0, s1, s2 = kv_cache.stride()
    if width > 1 and s2 != 1:
        raise ValueError(f"kv_cache: each entry (dim 2) must be contiguous, got strides {(s0, s1, s2)}")
    s0, s1 = (s0 if num_blocks > 1 else block_size * width), (s1 if block_size > 1 else width)
    nested = s1 >= width and s0 >= s1 * (block_size - 1) + width
    transposed = s0 >= width and s1 >= s0 * (num_blocks - 1) + width
    if not (nested or transposed):
        raise ValueError(f"kv_cache: entries overlap (strides {tuple(kv_cache.stride())} for shape "
                         f"{tuple(kv_cache.shape)}); each slot needs {width} elements of its own")
    esize = kv_cache.element_size()
    return s0 * esize, s1 * esize


def _low_bits(p: WritePlan) -> int:
    """The layout's bits of the vector width choice; the data pointers add theirs per call."""
    pe = p.k_pe_row_stride if p.pe_dim else 0
    return p.block_stride | p.entry_stride | (p.kv_c_row_stride if p.num_tokens > 1 else 0) | \
        (pe if p.num_tokens > 1 else 0)


# -- extents and overlap: one definition for the full checks and the fast path -----------------

def _extents(p: WritePlan) -> tuple[int, int, int, int, int]:
    """Bytes from each data pointer to the end of what the call touches: kv_cache (written),
    kv_c, k_pe, slot_mapping, scale (read; 0: not read). num_tokens > 0."""
    # the entry's bytes: the plain fp8 format stores one byte per element, not kv_c's element size
    # (which made the extent too long, refusing an input placed right after the cache)
    width = spec.RECORD_BYTES if p.fmt == "ds" else (p.kv_lora_rank + p.pe_dim) * (1 if p.fmt == "fp8" else p.element_size)
    last = p.num_tokens - 1
    return ((p.num_blocks - 1) * p.block_stride + (p.block_size - 1) * p.entry_stride + width if p.num_blocks else 0,
            last * p.kv_c_row_stride + p.kv_lora_rank * p.element_size,
            last * p.k_pe_row_stride + p.pe_dim * p.element_size if p.pe_dim else 0,
            8 * (last * p.slot_stride + 1),
            4 if p.scale_ptr else 0)


def _read_pointers(p: WritePlan) -> tuple[int, int, int, int]:
    return p.kv_c_ptr, p.k_pe_ptr, p.slot_ptr, p.scale_ptr


# -- launching ---------------------------------------------------------------------------------

class WriteLayout(NamedTuple):
    """What a call with a remembered layout needs besides its data pointers (fast_path.py)."""

    device: int
    align_mask: int         # kv_cache's data pointer & align_mask must be 0 (fp8_ds_mla: 4-byte scale words)
    widths: tuple           # vector width by the OR of the data pointers' low 4 bits
    extents: tuple          # _extents of the plan
    launches: dict          # vector width -> fast_path.Launch
    launchers: dict         # vector width -> launcher, made on first use (fast_path.bind)


def struct_fields(p: WritePlan) -> dict:
    """The MlaWriteParams fields of a GPU plan, by name, but the error buffer."""
    return dict(kv_c=p.kv_c_ptr, k_pe=p.k_pe_ptr, slot_mapping=p.slot_ptr, scale=p.scale_ptr, kv_cache=p.kv_ptr,
                kv_c_row_stride=p.kv_c_row_stride, k_pe_row_stride=p.k_pe_row_stride, block_stride=p.block_stride,
                entry_stride=p.entry_stride, num_slots=p.num_slots, num_tokens=p.num_tokens,
                block_size=p.block_size, kv_lora_rank=p.kv_lora_rank, pe_dim=p.pe_dim, flags=p.flags,
                tokens_per_warp=spec.tokens_per_warp(p.num_tokens))


def _module(p: WritePlan):
    return spec.DS_MODULES[p.k_type] if p.fmt == "ds" else spec.PLAIN_MODULES[p.k_type]


def launch_config(p: WritePlan) -> LaunchConfig:
    """The launch of a validated call with num_tokens > 0."""
    entry = spec.ds_entry(p.k_type, p.vec) if p.fmt == "ds" else spec.plain_entry(p.k_type, p.fmt)
    fields = struct_fields(p)
    return LaunchConfig(entry, spec.write_grid(p.num_tokens, fields["tokens_per_warp"]), fields)


def _layout(p: WritePlan, module=None) -> WriteLayout:
    """The layout of a GPU plan with tokens to write: a ready launch per vector width (one for
    the plain formats, whose kernels take any alignment)."""
    launches = {}
    for vec in (spec.VECTOR_WIDTHS if p.fmt == "ds" else (0,)):
        cfg = launch_config(p._replace(vec=vec))
        launches[vec] = Launch(module or _module(p), cfg.entry, cfg.grid,
                               spec.WRITE_PARAMS.image(**{n: v for n, v in cfg.fields.items() if n not in _POINTERS}))
    low = _low_bits(p)
    widths = fast_path.widths_by_alignment(lambda bits: spec.vector_width(bits | low) if p.fmt == "ds" else 0)
    return WriteLayout(p.device, 3 if p.fmt == "ds" else 0, widths, _extents(p), launches, {})


def _run(layout: WriteLayout, kv_c_p: int, k_pe_p: int, sm_p: int, sc_p: int, kv_p: int) -> None:
    """Launch a call of ``layout`` whose pointers passed the checks."""
    vec = layout.widths[(kv_c_p | k_pe_p | kv_p) & 15]
    (layout.launchers.get(vec) or fast_path.bind(layout, vec))((kv_c_p, k_pe_p, sm_p, sc_p, kv_p))


_layouts = LayoutMemo()


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                         kv_cache_dtype: str, scale: torch.Tensor, skip_scale: bool = False,
                         ds_scale_rule: str = "pow2") -> None:
    """Write each token's ``kv_c`` and ``k_pe`` rows into the paged MLA cache (vLLM's op).

    Row ``i < len(slot_mapping)`` goes to slot ``s = slot_mapping[i]``: entry ``s % block_size``
    of block ``s // block_size``; ``s < 0`` is padding and skipped. ``kv_cache_dtype``:

    - ``"fp8_ds_mla"``: ``kv_cache`` uint8 ``[num_blocks, block_size, 656]``; each entry is
      the 512 ``kv_c`` values as fp8-e4m3 in 4 tiles of 128 (``value / tile_scale``), the 4
      fp32 tile scales, and the 64 ``k_pe`` values as bf16 (``pe_dim`` 0: left untouched).
      Tile scale ``2 ** ceil(log2(max(amax / 448, 1e-4)))`` (``ds_scale_rule="pow2"``, vLLM's
      current rule), or ``max(amax / 448, FLT_MIN)`` (``"plain"``, its older one); NaN values
      do not count in amax and are stored as 0x7f. ``scale`` is not used.
    - ``"auto"``, ``"bfloat16"``, ``"float16"``: ``kv_cache`` of kv_c's dtype, ``[..., kv_lora_rank
      + pe_dim]``: both rows copied.
    - ``"fp8"``, ``"fp8_e4m3"``: ``kv_cache`` uint8 / float8_e4m3fn ``[..., kv_lora_rank +
      pe_dim]``: fp8-e4m3 of ``value / scale[0]`` (float32 on the device; ``skip_scale``: 1).

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation; slots
    past the cache are skipped (NVRTC_GATHER_DEBUG=1 reports them). CPU tensors: a torch
    implementation with identical bytes that raises ValueError on such a slot first.
    """
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return library.traced("concat_and_cache_mla", kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                              skip_scale, ds_scale_rule)
    check, options, layout = _layouts.last
    try:
        if not check(kv_c, k_pe, kv_cache, slot_mapping, scale) or \
                options != (kv_cache_dtype, skip_scale, ds_scale_rule):
            layout = _layouts.find(_key(kv_c, k_pe, kv_cache, slot_mapping, scale, kv_cache_dtype, skip_scale,
                                        ds_scale_rule))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable options: plan_write says which
        layout = None
    if layout is not None:  # the fast path: only the pointer checks, written inline (each call is ~0.1 µs)
        kv_c_p, k_pe_p, sm_p, kv_p = kv_c.data_ptr(), k_pe.data_ptr(), slot_mapping.data_ptr(), kv_cache.data_ptr()
        kv_n, c_n, pe_n, sm_n, sc_n = layout.extents
        sc_p, kv_e = scale.data_ptr() if sc_n else 0, kv_p + kv_n
        if not kv_p & layout.align_mask and not (  # the cache overlapping no read range
                (c_n and kv_c_p < kv_e and kv_p < kv_c_p + c_n) or (pe_n and k_pe_p < kv_e and kv_p < k_pe_p + pe_n)
                or (sm_n and sm_p < kv_e and kv_p < sm_p + sm_n) or (sc_n and sc_p < kv_e and kv_p < sc_p + sc_n)):
            _run(layout, kv_c_p, k_pe_p, sm_p, sc_p, kv_p)
            return
    plan = plan_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale, ds_scale_rule)
    if plan.device < 0:
        settings.debug_enabled()  # a bad NVRTC_GATHER_DEBUG is refused on every device
        write_torch(plan, kv_c, k_pe, kv_cache, slot_mapping, scale)
        return
    if plan.num_tokens == 0:
        return
    layout = _layout(plan)
    _run(layout, plan.kv_c_ptr, plan.k_pe_ptr, plan.slot_ptr, plan.scale_ptr, plan.kv_ptr)
    options = kv_cache_dtype, skip_scale, ds_scale_rule
    _layouts.remember(_key(kv_c, k_pe, kv_cache, slot_mapping, scale, *options), layout,
                      (kv_c, k_pe, kv_cache, slot_mapping, scale), options)


def _key(kv_c, k_pe, kv_cache, slot_mapping, scale, kv_cache_dtype, skip_scale, ds_scale_rule) -> tuple:
    return (fast_path.layout_key5(kv_c, k_pe, kv_cache, slot_mapping, scale), kv_cache_dtype, skip_scale,
            ds_scale_rule, kv_c.is_neg() or k_pe.is_neg() or scale.is_neg())  # negative views: full checks


def prepared(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False, ds_scale_rule="pow2", *,
             module=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call (CUDA
    tensors) exactly as the op does, optionally with another build (``module``)."""
    plan = plan_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale, ds_scale_rule)
    layout = _layout(plan, module) if plan.num_tokens else None

    def run(_keep=(kv_c, k_pe, kv_cache, slot_mapping, scale)):  # the tensors outlive it
        if layout is not None:
            _run(layout, plan.kv_c_ptr, plan.k_pe_ptr, plan.slot_ptr, plan.scale_ptr, plan.kv_ptr)
    return run


def write_fake(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, skip_scale=False,
               ds_scale_rule="pow2") -> None:
    """The fake (meta) implementation: plan_write's overlap check (WRITES, READS) on the traced
    tensors' storages (ops/fake_checks.py says why); only the rows that are read count, and
    scale only where the format reads it, after the eager format, type and rank checks (shapes
    are read after them). Other arguments the full checks refuse are left to them."""
    fmt = _format(kv_cache_dtype)
    _flags(fmt, skip_scale, ds_scale_rule)
    _check_types(kv_c, k_pe, kv_cache, slot_mapping, scale, fmt)
    n = slot_mapping.size(0)
    if not (n and n <= kv_c.size(0) and n <= k_pe.size(0)):
        return
    reads_scale = _reads_scale(fmt, spec.SKIP_SCALE if skip_scale else 0) and scale.numel() > 0
    fake_checks.check(WRITES, READS, dict(kv_cache=kv_cache, kv_c=kv_c, k_pe=k_pe, slot_mapping=slot_mapping,
                                          scale=scale if reads_scale else None), {"kv_c": n, "k_pe": n, "scale": 1})


library.register("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
                 "str kv_cache_dtype, Tensor scale, bool skip_scale=False, str ds_scale_rule=\"pow2\") -> ()",
                 concat_and_cache_mla, write_fake)
