"""cp_gather_cache and gather_and_maybe_dequant_cache: the torch-facing chunked-context cache
gathers (contract: docs/contract.md §6).

Both map request r's rows [min(cu[r], T), min(cu[r + 1], T)) of dst to its cache entries from
position seq_starts[r] (or 0) on; the first copies the entry bytes, the second copies or
dequantizes fp8 entries. One plan, one kernel family (nvrtc_gather/kernels/cache_gather.py),
one CPU path (cache_gather_torch.py). Checks every argument (raising before anything is
written); repeated layouts take the shared fast path (fast_path.py). Registered as
torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..jit import driver
from ..kernels import cache_gather as spec
from . import checks, fake_checks, fast_path, library
from .cache_gather_torch import gather_torch
from .fast_path import Launch, LaunchConfig, LayoutMemo

_I32 = torch.int32
_OUT_TYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_FP8_SOURCES = {"e4m3": (torch.uint8, torch.float8_e4m3fn), "e5m2": (torch.uint8, torch.float8_e5m2)}
# vLLM's kv_cache_dtype strings -> fp8 format (None: entries copied as they are): every string its
# get_fp8_kv_cache_data_type (csrc/attention/dtype_fp8.cuh) accepts, with its meaning; its
# DISPATCH_BY_KV_CACHE_DTYPE refuses any other in gather_and_maybe_dequant_cache.
KV_CACHE_DTYPES = {"auto": None, "bfloat16": None, "float16": None,
                   "fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_ds_mla": "e4m3", "fp8_e5m2": "e5m2"}
_is_compiling = torch.compiler.is_compiling
_POINTERS = spec.PARAMS.pointer_names
# What both ops write and read, in _extents' order: the one list the full checks (plan_gather),
# the fast path (_read_pointers) and the fakes (_fake_disjoint) take their names from.
# token_to_seq is accepted and checked, never read (docs/contract.md §6).
WRITES, READS, UNREAD = ("dst",), ("src_cache", "block_table", "cu_seq_lens", "seq_starts", "scale"), ("token_to_seq",)


class CacheGatherPlan(NamedTuple):
    """Sizes, byte strides, pointers and kernel choice of one validated call."""

    device: int               # CUDA ordinal, -1 for CPU
    conversion: str           # a key of spec.CONVERSIONS
    vec: int                  # source bytes per load (16, 8, 4)
    svec: int                 # destination bytes per store (16, 8, 4)
    rows_per_cta: int         # 0 on CPU
    num_rows: int             # dst rows the requests may cover (T)
    batch: int
    max_blocks: int
    num_blocks: int
    block_size: int
    row_bytes: int            # source bytes per entry
    dst_row_bytes: int
    block_stride: int         # bytes
    entry_stride: int         # bytes
    dst_row_stride: int       # bytes
    bt_row_stride: int        # elements
    bt_col_stride: int        # elements
    cu_stride: int            # elements
    seq_stride: int           # elements
    src_ptr: int
    dst_ptr: int
    bt_ptr: int
    cu_ptr: int
    seq_ptr: int              # 0: no seq_starts
    scale_ptr: int            # 0: not read ("copy")
    tiny: bool = False        # a small call: the tiny kernel where the widest accesses are taken


# -- the full checks ---------------------------------------------------------------------------

def _check_types(src_cache, dst, block_table, cu_seq_lens, seq_starts) -> None:
    """Types and ranks, before any shape is read (plan_gather and the fakes)."""
    for name, t in (("src_cache", src_cache), ("dst", dst), ("block_table", block_table),
                    ("cu_seq_lens", cu_seq_lens)):
        checks.tensor(name, t)
    if seq_starts is not None:
        checks.tensor("seq_starts", seq_starts)
        checks.dtype_in("seq_starts", seq_starts, (_I32,))
        checks.rank("seq_starts", seq_starts, 1, "[batch]")
    checks.dtype_in("block_table", block_table, (_I32,))
    checks.dtype_in("cu_seq_lens", cu_seq_lens, (_I32,))
    checks.rank("block_table", block_table, 2, "[batch, max_blocks]")
    checks.rank("cu_seq_lens", cu_seq_lens, 1, "[batch + 1]")
    if src_cache.dim() < 3:
        raise ValueError(f"src_cache: expected [num_blocks, block_size, entry...] (3 or more dimensions), "
                         f"got shape {tuple(src_cache.shape)}")
    if dst.dim() < 2:
        raise ValueError(f"dst: expected [rows, entry...] (2 or more dimensions), got shape {tuple(dst.shape)}")


def _inner_contiguous(name: str, t: torch.Tensor, first: int) -> int:
    """Elements per entry of ``t``'s dims from ``first`` on, which must be laid out contiguously
    (row-major) so that an entry is one run of bytes."""
    expected = 1
    for size, stride in zip(reversed(t.shape[first:]), reversed(t.stride()[first:])):
        if size > 1 and stride != expected:
            raise ValueError(f"{name}: each entry (dims {first} and on) must be contiguous, got shape "
                             f"{tuple(t.shape)} with strides {tuple(t.stride())}")
        expected *= size
    return expected


def plan_gather(src_cache, dst, block_table, cu_seq_lens, batch, num_rows, fp8, scale, seq_starts,
                batch_name: str, rows_name: str, token_to_seq=None) -> CacheGatherPlan:
    """Validate one call of either op (``fp8``: None for a byte copy, else the source's fp8
    format); reads no tensor data. Each step checks one argument (or one relation between
    them) and raises TypeError or ValueError naming it."""
    _check_types(src_cache, dst, block_table, cu_seq_lens, seq_starts)
    if fp8 is None:
        if dst.dtype != src_cache.dtype:
            raise TypeError(f"dst: expected src_cache's dtype {src_cache.dtype} (a byte copy), got {dst.dtype}")
        conversion = "copy"
    else:
        checks.dtype_in("src_cache", src_cache, _FP8_SOURCES[fp8])
        conversion = f"{fp8}_{_OUT_TYPES[checks.dtype_in('dst', dst, tuple(_OUT_TYPES))]}"
    named = {"src_cache": src_cache, "dst": dst, "block_table": block_table, "cu_seq_lens": cu_seq_lens}
    if token_to_seq is not None:
        named["token_to_seq"] = token_to_seq
    if scale is not None:
        named["scale"] = scale
    if seq_starts is not None:
        named["seq_starts"] = seq_starts
    dev = checks.same_device(named)
    if batch < 0:
        raise ValueError(f"{batch_name}: must be >= 0, got {batch}")
    if cu_seq_lens.shape[0] != batch + 1:
        raise ValueError(f"cu_seq_lens: expected {batch_name} + 1 = {batch + 1} entries, got {cu_seq_lens.shape[0]}")
    for name, t in (("block_table", block_table), ("seq_starts", seq_starts)):
        if t is not None and t.shape[0] < batch:
            raise ValueError(f"{name}: {batch} requests, but it has only {t.shape[0]} rows")
    checks.unit_inner_stride("cu_seq_lens", cu_seq_lens)
    if seq_starts is not None and batch > 1:
        checks.unit_inner_stride("seq_starts", seq_starts)
    if block_table.shape[1] > 1:
        checks.unit_inner_stride("block_table", block_table)
    if num_rows < 0 or num_rows > dst.shape[0]:
        raise ValueError(f"{rows_name}: must be in [0, dst.size(0) = {dst.shape[0]}], got {num_rows}")
    num_blocks, block_size = src_cache.shape[:2]
    if block_size < 1:
        raise ValueError(f"src_cache: block_size (dim 1) must be >= 1, got shape {tuple(src_cache.shape)}")
    entries = _inner_contiguous("src_cache", src_cache, 2)
    dst_entries = _inner_contiguous("dst", dst, 1)
    if dst_entries != entries:
        raise ValueError(f"dst: each row must hold src_cache's {entries} values per entry, got shape "
                         f"{tuple(dst.shape)} for src_cache {tuple(src_cache.shape)}")
    row_bytes = entries * src_cache.element_size()
    if row_bytes == 0 or row_bytes % 4:
        raise ValueError(f"src_cache: an entry of {row_bytes} bytes cannot be moved in 4-byte words; entries "
                         f"must be a non-zero multiple of 4 bytes (shape {tuple(src_cache.shape)}, {src_cache.dtype})")
    if fp8 is not None:
        checks.dtype_in("scale", scale, (torch.float32,))
        if scale.numel() != 1:
            raise ValueError(f"scale: expected one float32 value, got shape {tuple(scale.shape)}")
    max_blocks = block_table.shape[1]
    for name, what, value in (("dst", f"{rows_name} + {spec.THREADS}", num_rows + spec.THREADS),
                              ("src_cache", "num_blocks", num_blocks), ("src_cache", "block_size", block_size),
                              ("block_table", "max_blocks", max_blocks), ("cu_seq_lens", "entries", batch + 1),
                              ("src_cache", "entry bytes + 64 KiB", row_bytes + 65536)):
        checks.fits_int32(name, what, value)
    dst_row_bytes = row_bytes * spec.CONVERSIONS[conversion][2]
    s0, s1 = src_cache.stride(0) * src_cache.element_size(), src_cache.stride(1) * src_cache.element_size()
    plan = CacheGatherPlan(
        device=dev.index if dev.type == "cuda" else -1, conversion=conversion, vec=4, svec=4, rows_per_cta=0,
        num_rows=num_rows, batch=batch, max_blocks=max_blocks, num_blocks=num_blocks, block_size=block_size,
        row_bytes=row_bytes, dst_row_bytes=dst_row_bytes,
        block_stride=s0 if num_blocks > 1 else block_size * s1, entry_stride=s1 if block_size > 1 else row_bytes,
        dst_row_stride=dst.stride(0) * dst.element_size() if dst.shape[0] > 1 else dst_row_bytes,
        bt_row_stride=block_table.stride(0), bt_col_stride=block_table.stride(1), cu_stride=cu_seq_lens.stride(0),
        seq_stride=seq_starts.stride(0) if seq_starts is not None else 0,
        src_ptr=src_cache.data_ptr(), dst_ptr=dst.data_ptr(), bt_ptr=block_table.data_ptr(),
        cu_ptr=cu_seq_lens.data_ptr(), seq_ptr=seq_starts.data_ptr() if seq_starts is not None else 0,
        scale_ptr=scale.data_ptr() if fp8 is not None else 0)
    if num_rows > 1 and plan.dst_row_stride < plan.dst_row_bytes:
        raise ValueError(f"dst: rows overlap (row stride {plan.dst_row_stride} bytes < {plan.dst_row_bytes})")
    for name, what, value in (("src_cache", "data pointer", plan.src_ptr), ("src_cache", "stride(0) in bytes", plan.block_stride),
                              ("src_cache", "stride(1) in bytes", plan.entry_stride), ("dst", "data pointer", plan.dst_ptr),
                              ("dst", "row stride in bytes", plan.dst_row_stride)):
        checks.aligned(name, what, value)
    if num_rows and batch:  # something may be written: no written byte may be one the op reads
        extents = _extents(plan)
        if fast_path.overlapping(plan.dst_ptr, _read_pointers(plan), extents):
            checks.disjoint_from(WRITES[0], plan.dst_ptr, READS, _read_pointers(plan), extents)
    vec, svec = _width_table(plan)[_alignment(plan.src_ptr, plan.dst_ptr)]
    plan = plan._replace(vec=vec, svec=svec)
    if plan.device < 0:
        return plan
    sm_count = driver.sm_count(plan.device)
    return plan._replace(rows_per_cta=spec.rows_per_cta(row_bytes, num_rows, sm_count),
                         tiny=spec.use_tiny(row_bytes, num_rows, sm_count))


def _alignment(src_ptr: int, dst_ptr: int) -> int:
    """The index of a call's data pointers' low 4 bits in _width_table."""
    return (src_ptr & 15) << 4 | (dst_ptr & 15)


def _width_table(p: CacheGatherPlan) -> tuple:
    """The (load, store) widths by _alignment(src_ptr, dst_ptr): the widest load the source's
    pointer, strides and entry bytes allow, the widest store the destination's (spec.pick)."""
    src_bits = p.block_stride | p.entry_stride | p.row_bytes
    dst_bits = (p.dst_row_stride if p.num_rows > 1 else 0) | p.dst_row_bytes
    loads = fast_path.widths_by_alignment(lambda bits: spec.load_width(bits | src_bits, p.conversion))
    stores = fast_path.widths_by_alignment(lambda bits: spec.store_width(bits | dst_bits))
    return tuple(spec.pick(p.conversion, loads[a], stores[b]) for a in range(16) for b in range(16))


# -- extents and overlap: one definition for the full checks and the fast path -----------------

def _extents(p: CacheGatherPlan) -> tuple:
    """Bytes from each data pointer to the end of what the call touches: dst (written),
    src_cache, block_table, cu_seq_lens, seq_starts, scale (read; 0: not read). batch > 0,
    num_rows > 0."""
    return ((p.num_rows - 1) * p.dst_row_stride + p.dst_row_bytes,
            (p.num_blocks - 1) * p.block_stride + (p.block_size - 1) * p.entry_stride + p.row_bytes
            if p.num_blocks else 0,
            4 * ((p.batch - 1) * p.bt_row_stride + (p.max_blocks - 1) * p.bt_col_stride + 1) if p.max_blocks else 0,
            4 * (p.batch * p.cu_stride + 1),
            4 * ((p.batch - 1) * p.seq_stride + 1) if p.seq_ptr else 0,
            4 if p.scale_ptr else 0)


def _read_pointers(p: CacheGatherPlan) -> tuple:
    return p.src_ptr, p.bt_ptr, p.cu_ptr, p.seq_ptr, p.scale_ptr


# -- launching ---------------------------------------------------------------------------------

class CacheGatherLayout(NamedTuple):
    """What a call with a remembered layout needs besides its data pointers (fast_path.py)."""

    device: int
    reads_scale: bool  # the fp8 conversions read scale
    widths: tuple      # (load, store) widths by _alignment(src_ptr, dst_ptr)
    extents: tuple     # _extents of the plan
    launches: dict     # (load, store) widths -> fast_path.Launch
    launchers: dict    # (load, store) widths -> launcher, made on first use (fast_path.bind)


def struct_fields(p: CacheGatherPlan) -> dict:
    """The CacheGatherParams fields of a GPU plan, by name, but the error buffer."""
    return dict(src_cache=p.src_ptr, dst=p.dst_ptr, block_table=p.bt_ptr, cu_seq_lens=p.cu_ptr, seq_starts=p.seq_ptr,
                scale=p.scale_ptr, block_stride=p.block_stride, entry_stride=p.entry_stride,
                dst_row_stride=p.dst_row_stride, bt_row_stride=p.bt_row_stride, num_rows=p.num_rows, batch=p.batch,
                max_blocks=p.max_blocks, num_blocks=p.num_blocks, block_size=p.block_size,
                row_vecs=p.row_bytes // p.vec, rows_per_cta=p.rows_per_cta, reserved=0)


def launch_config(p: CacheGatherPlan) -> LaunchConfig:
    """The launch of a validated call with rows and requests: the tiny kernel (one warp per row)
    or the tile kernel (rows_per_cta rows per block)."""
    m, rows = spec.kernel_for(p.conversion, (p.vec, p.svec), p.tiny, p.rows_per_cta)
    return LaunchConfig(m.kernels[0], spec.grid(p.num_rows, rows), struct_fields(p))


def _layout(p: CacheGatherPlan, module=None) -> CacheGatherLayout:
    widths = _width_table(p)
    launches = {}
    for vec, svec in set(widths):
        cfg = launch_config(p._replace(vec=vec, svec=svec))
        launches[vec, svec] = Launch(module or spec.module_for(p.conversion, (vec, svec), p.tiny), cfg.entry, cfg.grid,
                                     spec.PARAMS.image(**{n: v for n, v in cfg.fields.items() if n not in _POINTERS}))
    return CacheGatherLayout(p.device, p.scale_ptr != 0, widths, _extents(p), launches, {})


def _run(layout: CacheGatherLayout, ptrs: tuple) -> None:
    """Launch a call of ``layout`` whose pointers (struct order) passed the checks."""
    widths = layout.widths[(ptrs[0] & 15) << 4 | (ptrs[1] & 15)]
    (layout.launchers.get(widths) or fast_path.bind(layout, widths))(ptrs)


def _pointers(p: CacheGatherPlan) -> tuple:
    return p.src_ptr, p.dst_ptr, p.bt_ptr, p.cu_ptr, p.seq_ptr, p.scale_ptr


_layouts = LayoutMemo()


def _key(src_cache, dst, block_table, cu_seq_lens, seq_starts, scale, extra) -> tuple | None:
    """A call's layout key: its tensors' metadata and ``extra`` (the op's other arguments);
    None when an argument is not a tensor (the full checks say which)."""
    try:
        return (fast_path.layout_key4(src_cache, dst, block_table, cu_seq_lens), extra,
                # any dtype: a conjugate or negative view (its bytes are not its values) never takes
                # a layout remembered for plain tensors; the full checks refuse it by name
                src_cache.is_conj() or src_cache.is_neg() or dst.is_conj() or dst.is_neg(),
                None if seq_starts is None else (seq_starts.device, seq_starts.dtype, seq_starts.shape, seq_starts.stride()),
                # scale's and token_to_seq's strides are never used: their layout stands for them (a
                # sparse one has no storage, and the full checks refuse it by name)
                None if scale is None else (scale.device, scale.dtype, scale.shape, scale.is_neg(), scale.layout))
    except (AttributeError, RuntimeError):
        return None


def _fast(key, src_cache, dst, block_table, cu_seq_lens, seq_starts, scale) -> bool:
    """Run a call whose layout is remembered, after only the pointer checks; False when there
    is none or the pointers need the full checks (which then raise or plan anew)."""
    layout = _layouts.get(key)
    if layout is None:
        return False
    ptrs = (src_cache.data_ptr(), dst.data_ptr(), block_table.data_ptr(), cu_seq_lens.data_ptr(),
            seq_starts.data_ptr() if seq_starts is not None else 0, scale.data_ptr() if layout.reads_scale else 0)
    if (ptrs[0] | ptrs[1]) & 3 or fast_path.overlapping(ptrs[1], ptrs[:1] + ptrs[2:], layout.extents):
        return False
    _run(layout, ptrs)
    return True


def _slow(key, src_cache, dst, block_table, cu_seq_lens, batch, num_rows, fp8, scale, seq_starts,
          batch_name: str, rows_name: str, token_to_seq=None) -> None:
    """The full checks, then the kernel (remembering the layout under ``key``) or the CPU path."""
    plan = plan_gather(src_cache, dst, block_table, cu_seq_lens, batch, num_rows, fp8, scale, seq_starts,
                       batch_name, rows_name, token_to_seq)
    if plan.device < 0:
        settings.debug_enabled()  # a bad NVRTC_GATHER_DEBUG is refused on every device
        gather_torch(plan, src_cache, dst, block_table, cu_seq_lens, seq_starts, scale)
        return
    if plan.num_rows == 0 or plan.batch == 0:
        return
    layout = _layout(plan)
    _run(layout, _pointers(plan))
    if key is not None:
        _layouts.remember(key, layout)


def _kv_cache_format(kv_cache_dtype) -> str | None:
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {checks.type_name(kv_cache_dtype)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: expected one of {', '.join(map(repr, KV_CACHE_DTYPES))}, "
                         f"got {kv_cache_dtype!r}")
    return KV_CACHE_DTYPES[kv_cache_dtype]


def cp_gather_cache(src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                    cu_seq_lens: torch.Tensor, batch_size: int, seq_starts: torch.Tensor | None = None) -> None:
    """Gather each request's cache entries into contiguous rows, byte for byte (vLLM's op).

    Request ``r < batch_size`` fills rows ``[min(cu_seq_lens[r], T), min(cu_seq_lens[r + 1],
    T))`` of ``dst`` (``T = dst.size(0)``) with its entries from position ``seq_starts[r]``
    (``seq_starts`` None: 0) on: position ``p`` is slot ``p % block_size`` of block
    ``block_table[r, p // block_size]`` of ``src_cache`` (``[num_blocks, block_size,
    entry...]``, any dtype; ``dst`` ``[rows, entry...]`` of the same dtype and entry size).
    Rows no request covers are left untouched. ``cu_seq_lens`` (int32 ``[batch_size + 1]``)
    must be non-negative and non-decreasing.

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation; rows
    with out-of-range indices are skipped (NVRTC_GATHER_DEBUG=1 reports them). CPU tensors: a
    torch implementation with identical results that raises ValueError on such indices first.
    """
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return library.traced("cp_gather_cache", src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts)
    key = _key(src_cache, dst, block_table, cu_seq_lens, seq_starts, None, batch_size) \
        if type(batch_size) is int else None
    if key is not None and _fast(key, src_cache, dst, block_table, cu_seq_lens, seq_starts, None):
        return
    batch = checks.int_arg("batch_size", batch_size)
    checks.tensor("src_cache", src_cache)
    checks.tensor("dst", dst)
    _slow(key, src_cache, dst, block_table, cu_seq_lens, batch, dst.shape[0] if dst.dim() else 0, None, None,
          seq_starts, "batch_size", "dst.size(0)")


def gather_and_maybe_dequant_cache(src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                                   cu_seq_lens: torch.Tensor, token_to_seq: torch.Tensor, num_tokens: int,
                                   kv_cache_dtype: str, scale: torch.Tensor,
                                   seq_starts: torch.Tensor | None = None) -> None:
    """Gather each request's cache entries into rows, dequantizing fp8 ones (vLLM's op).

    The mapping of cp_gather_cache over ``cu_seq_lens.size(0) - 1`` requests and the first
    ``num_tokens`` rows of ``dst`` (``num_tokens <= dst.size(0)``). ``kv_cache_dtype``
    ``"auto"`` (or ``"bfloat16"`` / ``"float16"``, as vLLM reads them): entries copied as they
    are (``src_cache`` and ``dst`` of one dtype: bf16, fp16 or fp32); ``"fp8"`` /
    ``"fp8_e4m3"`` / ``"fp8_ds_mla"`` (e4m3, as vLLM) / ``"fp8_e5m2"``: ``src_cache`` holds fp8 codes
    (uint8, or the matching float8 dtype) and each value becomes ``float(code) * scale``
    (``scale``: one float32 on the device, one fp32 multiply) rounded to nearest even in
    ``dst``'s dtype (bf16, fp16, fp32), NaN as the GPU's canonical NaN: vLLM's kernel's bits.
    ``token_to_seq`` is accepted for vLLM's schema and checked (an integer tensor of one
    dimension on the same device) but never read: the kernel finds each row's request itself.
    """
    if _is_compiling():
        return library.traced("gather_and_maybe_dequant_cache", src_cache, dst, block_table, cu_seq_lens,
                              token_to_seq, num_tokens, kv_cache_dtype, scale, seq_starts)
    key = None
    if type(num_tokens) is int and type(kv_cache_dtype) is str:
        try:
            extra = (num_tokens, kv_cache_dtype, token_to_seq.device, token_to_seq.dtype, token_to_seq.dim(),
                     token_to_seq.layout)
        except (AttributeError, RuntimeError):
            extra = None
        key = extra and _key(src_cache, dst, block_table, cu_seq_lens, seq_starts, scale, extra)
    if key and _fast(key, src_cache, dst, block_table, cu_seq_lens, seq_starts, scale):
        return
    fp8, rows, batch = _dequant_args(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                     kv_cache_dtype, scale)
    _slow(key, src_cache, dst, block_table, cu_seq_lens, batch, rows, fp8, scale if fp8 is not None else None,
          seq_starts, "cu_seq_lens.size(0) - 1", "num_tokens", token_to_seq)


def _dequant_args(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype, scale):
    """gather_and_maybe_dequant_cache's own checks, before plan_gather's (the op and its fake):
    (the fp8 format or None, num_tokens, batch)."""
    fp8 = _kv_cache_format(kv_cache_dtype)
    rows = fake_checks.int_arg("num_tokens", num_tokens)
    for name, t in (("src_cache", src_cache), ("dst", dst), ("block_table", block_table), ("cu_seq_lens", cu_seq_lens),
                    ("token_to_seq", token_to_seq), ("scale", scale)):
        checks.tensor(name, t)
    checks.dtype_in("token_to_seq", token_to_seq, (torch.int32, torch.int64))
    checks.rank("token_to_seq", token_to_seq, 1, "[max tokens] (accepted for vLLM's schema, not read)")
    if fp8 is None:
        checks.dtype_in("dst", dst, tuple(_OUT_TYPES))
    batch = cu_seq_lens.shape[0] - 1 if cu_seq_lens.dim() == 1 else 0
    if cu_seq_lens.dim() == 1 and cu_seq_lens.shape[0] == 0:
        raise ValueError("cu_seq_lens: expected [batch + 1] entries (at least one), got none")
    return fp8, rows, batch


def prepared(op: str, *args, module=None, rows_per_cta=None, tiny=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call of ``op``
    ("cp_gather_cache" or "gather_and_maybe_dequant_cache", its arguments as the op takes them;
    CUDA tensors) exactly as the op does, optionally with another build (``module``), another
    rows-per-block choice (the tile kernel then, unless ``tiny``) or the kernel forced
    (``tiny``: True, the tiny kernel where the widest accesses are taken; False, the tile one)."""
    plan = plan_for(op, *args)
    if rows_per_cta is not None:
        plan = plan._replace(rows_per_cta=rows_per_cta, tiny=False)
    if tiny is not None:
        plan = plan._replace(tiny=tiny)
    layout = _layout(plan, module) if plan.num_rows and plan.batch else None
    ptrs = _pointers(plan)

    def run(_keep=args):  # the tensors outlive it
        if layout is not None:
            _run(layout, ptrs)
    return run


def plan_for(op: str, *args) -> CacheGatherPlan:
    """The validated plan of one call of ``op`` with ``args`` as the op takes them (tests,
    benchmarks, the emulator)."""
    if op == "cp_gather_cache":
        src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts = (args + (None,))[:6]
        return plan_gather(src_cache, dst, block_table, cu_seq_lens, checks.int_arg("batch_size", batch_size),
                           dst.shape[0], None, None, seq_starts, "batch_size", "dst.size(0)")
    src_cache, dst, block_table, cu_seq_lens, _, num_tokens, kv_cache_dtype, scale, seq_starts = (args + (None,))[:9]
    fp8 = _kv_cache_format(kv_cache_dtype)
    return plan_gather(src_cache, dst, block_table, cu_seq_lens, cu_seq_lens.shape[0] - 1, num_tokens, fp8,
                       scale if fp8 is not None else None, seq_starts, "cu_seq_lens.size(0) - 1", "num_tokens")


# -- torch.ops.nvrtc_gather registration -------------------------------------------------------

def _fake_disjoint(src_cache, dst, block_table, cu_seq_lens, batch, rows, scale, seq_starts) -> None:
    """plan_gather's overlap check (WRITES, READS) on the traced tensors' storages
    (ops/fake_checks.py says why): dst's first ``rows`` rows against what the op reads, of the
    per-request tensors the first ``batch`` requests' entries, as in the full checks."""
    if not rows or not batch or cu_seq_lens.shape[0] < 2:
        return
    fake_checks.check(WRITES, READS, dict(dst=dst, src_cache=src_cache, block_table=block_table,
                                          cu_seq_lens=cu_seq_lens, seq_starts=seq_starts, scale=scale),
                      {"dst": rows, "block_table": batch, "cu_seq_lens": batch + 1, "seq_starts": batch, "scale": 1})


def cp_gather_cache_fake(src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None) -> None:
    fake_checks.int_arg("batch_size", batch_size)
    _check_types(src_cache, dst, block_table, cu_seq_lens, seq_starts)
    _fake_disjoint(src_cache, dst, block_table, cu_seq_lens, batch_size, dst.size(0), None, seq_starts)


def gather_and_maybe_dequant_cache_fake(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                        kv_cache_dtype, scale, seq_starts=None) -> None:
    fp8, rows, batch = _dequant_args(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                     kv_cache_dtype, scale)
    _check_types(src_cache, dst, block_table, cu_seq_lens, seq_starts)
    _fake_disjoint(src_cache, dst, block_table, cu_seq_lens, batch, rows, scale if fp8 is not None else None,
                   seq_starts)


library.register("cp_gather_cache(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor cu_seq_lens, "
                 "int batch_size, Tensor? seq_starts=None) -> ()", cp_gather_cache, cp_gather_cache_fake)
library.register("gather_and_maybe_dequant_cache(Tensor src_cache, Tensor(a!) dst, Tensor block_table, "
                 "Tensor cu_seq_lens, Tensor token_to_seq, int num_tokens, str kv_cache_dtype, Tensor scale, "
                 "Tensor? seq_starts=None) -> ()", gather_and_maybe_dequant_cache, gather_and_maybe_dequant_cache_fake)
