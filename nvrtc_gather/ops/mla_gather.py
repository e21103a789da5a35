"""cp_gather_and_upconvert_fp8_kv_cache: the torch-facing MLA-cache gather (contract:
docs/contract.md §5).

Checks every argument (raising before anything is written), then runs the NVRTC kernel on CUDA
tensors (one launch; spec and tile policy in nvrtc_gather/kernels/mla_cache.py) or the
vectorized torch implementation (mla_gather_torch.py) on CPU tensors. Repeated layouts take the
shared fast path (fast_path.py). Registered as torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..jit import driver
from ..kernels import mla_cache as spec
from . import checks, fake_checks, fast_path, library
from .fast_path import Launch, LaunchConfig, LayoutMemo
from .mla_gather_torch import gather_torch

_CACHE_DTYPES = (torch.uint8, torch.float8_e4m3fn)
_I32 = torch.int32
_is_compiling = torch.compiler.is_compiling
_POINTERS = spec.GATHER_PARAMS.pointer_names
# What the op writes and reads, in _extents' order: the one list the full checks (plan_gather),
# the fast path (_read_pointers) and the fake (gather_fake) take their names from.
WRITES, READS = ("dst",), ("src_cache", "block_table", "workspace_starts", "seq_starts")
DST_WIDTH = spec.NOPE + spec.ROPE  # 576 bf16 values per row


class MlaGatherPlan(NamedTuple):
    """Sizes, byte strides, pointers and kernel choice of one validated call."""

    device: int               # CUDA ordinal, -1 for CPU
    vec: int                  # 16: 16-byte accesses; 0: 4-byte ones
    rows_per_cta: int         # 0 on CPU
    num_rows: int             # dst rows
    batch: int
    max_blocks: int
    num_blocks: int
    block_size: int
    block_stride: int         # bytes
    entry_stride: int         # bytes
    dst_row_stride: int       # bytes
    bt_row_stride: int        # elements
    bt_col_stride: int        # elements
    ws_stride: int            # elements
    seq_stride: int           # elements
    src_ptr: int
    dst_ptr: int
    bt_ptr: int
    ws_ptr: int
    seq_ptr: int              # 0: no seq_starts


# -- the full checks ---------------------------------------------------------------------------

def plan_gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None) -> MlaGatherPlan:
    """Validate the arguments of cp_gather_and_upconvert_fp8_kv_cache; reads no tensor data.
    Each step checks one argument (or one relation between them) and raises TypeError or
    ValueError naming it."""
    batch = checks.int_arg("batch_size", batch_size)
    _check_types(src_cache, dst, block_table, workspace_starts, seq_starts)
    named = {"src_cache": src_cache, "dst": dst, "block_table": block_table, "workspace_starts": workspace_starts}
    if seq_starts is not None:
        named["seq_starts"] = seq_starts
    dev = checks.same_device(named)
    _check_batch(batch, block_table, workspace_starts, seq_starts)
    num_blocks, block_size, width = src_cache.shape
    if width != spec.RECORD_BYTES:
        raise ValueError(f"src_cache: dim 2 must be the {spec.RECORD_BYTES}-byte fp8_ds_mla record, "
                         f"got shape {tuple(src_cache.shape)}")
    if block_size < 1:
        raise ValueError(f"src_cache: block_size (dim 1) must be >= 1, got shape {tuple(src_cache.shape)}")
    s0, s1, s2 = src_cache.stride()
    if s2 != 1:
        raise ValueError(f"src_cache: each record (dim 2) must be contiguous, got strides {(s0, s1, s2)}")
    num_rows = dst.shape[0]
    if dst.shape[1] != DST_WIDTH:
        raise ValueError(f"dst: expected [num_rows, {DST_WIDTH}] bf16 rows, got shape {tuple(dst.shape)}")
    checks.unit_inner_stride("dst", dst)
    if num_rows > 1 and dst.stride(0) < DST_WIDTH:
        raise ValueError(f"dst: rows overlap (stride(0) = {dst.stride(0)} < {DST_WIDTH})")
    max_blocks = block_table.shape[1]
    for name, what, value in (("dst", f"num_rows + {spec.THREADS}", num_rows + spec.THREADS),
                              ("src_cache", "num_blocks", num_blocks), ("src_cache", "block_size", block_size),
                              ("block_table", "max_blocks", max_blocks)):
        checks.fits_int32(name, what, value)
    plan = MlaGatherPlan(
        device=dev.index if dev.type == "cuda" else -1, vec=0, rows_per_cta=0, num_rows=num_rows, batch=batch,
        max_blocks=max_blocks, num_blocks=num_blocks, block_size=block_size,
        block_stride=s0 if num_blocks > 1 else block_size * s1, entry_stride=s1 if block_size > 1 else width,
        dst_row_stride=dst.stride(0) * 2, bt_row_stride=block_table.stride(0), bt_col_stride=block_table.stride(1),
        ws_stride=workspace_starts.stride(0), seq_stride=seq_starts.stride(0) if seq_starts is not None else 0,
        src_ptr=src_cache.data_ptr(), dst_ptr=dst.data_ptr(), bt_ptr=block_table.data_ptr(),
        ws_ptr=workspace_starts.data_ptr(), seq_ptr=seq_starts.data_ptr() if seq_starts is not None else 0)
    for name, what, value in (("src_cache", "data pointer", plan.src_ptr), ("src_cache", "stride(0)", plan.block_stride),
                              ("src_cache", "stride(1)", plan.entry_stride), ("dst", "data pointer", plan.dst_ptr),
                              ("dst", "row stride in bytes", plan.dst_row_stride)):
        checks.aligned(name, what, value)
    if num_rows and batch:  # something is written: no written byte may be one the op reads
        extents = _extents(plan)
        if fast_path.overlapping(plan.dst_ptr, _read_pointers(plan), extents):
            checks.disjoint_from(WRITES[0], plan.dst_ptr, READS, _read_pointers(plan), extents)
    vec = spec.vector_width(_low_bits(plan) | plan.src_ptr | plan.dst_ptr)
    if plan.device < 0:
        return plan._replace(vec=vec)
    return plan._replace(vec=vec, rows_per_cta=spec.rows_per_cta(num_rows, driver.sm_count(plan.device)))


def _check_types(src_cache, dst, block_table, workspace_starts, seq_starts) -> None:
    for name, t in (("src_cache", src_cache), ("dst", dst), ("block_table", block_table),
                    ("workspace_starts", workspace_starts)):
        checks.tensor(name, t)
    if seq_starts is not None:
        checks.tensor("seq_starts", seq_starts)
        checks.dtype_in("seq_starts", seq_starts, (_I32,))
        checks.rank("seq_starts", seq_starts, 1, "[batch_size]")
    checks.dtype_in("src_cache", src_cache, _CACHE_DTYPES)
    checks.dtype_in("dst", dst, (torch.bfloat16,))
    checks.dtype_in("block_table", block_table, (_I32,))
    checks.dtype_in("workspace_starts", workspace_starts, (_I32,))
    checks.rank("src_cache", src_cache, 3, f"[num_blocks, block_size, {spec.RECORD_BYTES}]")
    checks.rank("dst", dst, 2, f"[num_rows, {DST_WIDTH}]")
    checks.rank("block_table", block_table, 2, "[batch, max_blocks]")
    checks.rank("workspace_starts", workspace_starts, 1, "[batch_size] (or more: only the first batch_size are read)")


def _check_batch(batch, block_table, workspace_starts, seq_starts) -> None:
    if batch < 0:
        raise ValueError(f"batch_size: must be >= 0, got {batch}")
    for name, t in (("block_table", block_table), ("workspace_starts", workspace_starts), ("seq_starts", seq_starts)):
        if t is not None and t.shape[0] < batch:
            raise ValueError(f"{name}: batch_size = {batch} requests, but it has only {t.shape[0]} rows")
    if batch > 1:
        checks.unit_inner_stride("workspace_starts", workspace_starts)
        if seq_starts is not None:
            checks.unit_inner_stride("seq_starts", seq_starts)
    if block_table.shape[1] > 1:
        checks.unit_inner_stride("block_table", block_table)


def _low_bits(p: MlaGatherPlan) -> int:
    """The layout's bits of the vector width choice; the data pointers add theirs per call."""
    return p.block_stride | p.entry_stride | (p.dst_row_stride if p.num_rows > 1 else 0)


# -- extents and overlap: one definition for the full checks and the fast path -----------------

def _extents(p: MlaGatherPlan) -> tuple[int, int, int, int, int]:
    """Bytes from each data pointer to the end of what the call touches: dst (written),
    src_cache, block_table, workspace_starts, seq_starts (read; 0: none). num_rows, batch > 0."""
    return ((p.num_rows - 1) * p.dst_row_stride + 2 * DST_WIDTH,
            (p.num_blocks - 1) * p.block_stride + (p.block_size - 1) * p.entry_stride + spec.RECORD_BYTES
            if p.num_blocks else 0,
            4 * ((p.batch - 1) * p.bt_row_stride + (p.max_blocks - 1) * p.bt_col_stride + 1) if p.max_blocks else 0,
            4 * ((p.batch - 1) * p.ws_stride + 1),
            4 * ((p.batch - 1) * p.seq_stride + 1) if p.seq_ptr else 0)


def _read_pointers(p: MlaGatherPlan) -> tuple[int, int, int, int]:
    return p.src_ptr, p.bt_ptr, p.ws_ptr, p.seq_ptr


# -- launching ---------------------------------------------------------------------------------

class MlaGatherLayout(NamedTuple):
    """What a call with a remembered layout needs besides its data pointers (fast_path.py)."""

    device: int
    widths: tuple     # vector width by the OR of src_cache's and dst's pointers' low 4 bits
    extents: tuple    # _extents of the plan
    launches: dict    # vector width -> fast_path.Launch
    launchers: dict   # vector width -> launcher, made on first use (fast_path.bind)


def struct_fields(p: MlaGatherPlan) -> dict:
    """The MlaGatherParams fields of a GPU plan, by name, but the error buffer."""
    return dict(src_cache=p.src_ptr, dst=p.dst_ptr, block_table=p.bt_ptr, workspace_starts=p.ws_ptr,
                seq_starts=p.seq_ptr, block_stride=p.block_stride, entry_stride=p.entry_stride,
                dst_row_stride=p.dst_row_stride, bt_row_stride=p.bt_row_stride, num_rows=p.num_rows, batch=p.batch,
                max_blocks=p.max_blocks, num_blocks=p.num_blocks, block_size=p.block_size,
                rows_per_cta=p.rows_per_cta)


def launch_config(p: MlaGatherPlan) -> LaunchConfig:
    """The launch of a validated call with rows and requests."""
    return LaunchConfig(spec.gather_entry(p.vec), spec.gather_grid(p.num_rows, p.rows_per_cta), struct_fields(p))


def _layout(p: MlaGatherPlan, module=None) -> MlaGatherLayout:
    launches = {}
    for vec in spec.VECTOR_WIDTHS:
        cfg = launch_config(p._replace(vec=vec))
        launches[vec] = Launch(module or spec.GATHER_MODULE, cfg.entry, cfg.grid,
                               spec.GATHER_PARAMS.image(**{n: v for n, v in cfg.fields.items() if n not in _POINTERS}))
    low = _low_bits(p)
    return MlaGatherLayout(p.device, fast_path.widths_by_alignment(lambda bits: spec.vector_width(bits | low)),
                           _extents(p), launches, {})


def _run(layout: MlaGatherLayout, src_p: int, dst_p: int, bt_p: int, ws_p: int, seq_p: int) -> None:
    """Launch a call of ``layout`` whose pointers passed the checks."""
    vec = layout.widths[(src_p | dst_p) & 15]
    (layout.launchers.get(vec) or fast_path.bind(layout, vec))((src_p, dst_p, bt_p, ws_p, seq_p))


_layouts = LayoutMemo()


def _key(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts):
    base = fast_path.layout_key4(src_cache, dst, block_table, workspace_starts)
    if seq_starts is None:
        return base, batch_size, None
    return base, batch_size, (seq_starts.device, seq_starts.dtype, seq_starts.shape, seq_starts.stride())


def cp_gather_and_upconvert_fp8_kv_cache(src_cache: torch.Tensor, dst: torch.Tensor, block_table: torch.Tensor,
                                         workspace_starts: torch.Tensor, batch_size: int,
                                         seq_starts: torch.Tensor | None = None) -> None:
    """Gather each request's tokens from the paged fp8_ds_mla cache into bf16 rows (vLLM's op).

    Request ``r < batch_size`` owns rows ``[workspace_starts[r], next)`` of ``dst`` (bf16
    ``[num_rows, 576]``), ``next`` being ``workspace_starts[r + 1]``, or ``num_rows`` for the
    last request; its row ``t`` receives the request's token ``seq_starts[r] + t -
    workspace_starts[r]`` (``seq_starts`` None: from token 0), read through ``block_table[r]``
    from ``src_cache`` (uint8 ``[num_blocks, block_size, 656]``): values 0-511 are
    ``bf16(fp8 code * tile scale)``, values 512-575 the record's bf16 k_pe, bit for bit. Rows
    no request owns (before ``workspace_starts[0]``) are left untouched. ``workspace_starts``
    must be non-negative and non-decreasing.

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation; rows
    with out-of-range indices are skipped (NVRTC_GATHER_DEBUG=1 reports them). CPU tensors: a
    torch implementation with identical results that raises ValueError on such indices first.
    """
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return library.traced("cp_gather_and_upconvert_fp8_kv_cache", src_cache, dst, block_table, workspace_starts,
                              batch_size, seq_starts)
    layout = None
    if type(batch_size) is int:
        check, options, layout = _layouts.last
        try:  # ``last`` holds calls without seq_starts only
            if seq_starts is not None or options != batch_size or \
                    not check(src_cache, dst, block_table, workspace_starts):
                layout = _layouts.find(_key(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts))
        except (AttributeError, RuntimeError):  # not tensors: plan_gather says which
            layout = None
    if layout is not None:  # the fast path: only the pointer checks
        src_p, dst_p, bt_p, ws_p = src_cache.data_ptr(), dst.data_ptr(), block_table.data_ptr(), workspace_starts.data_ptr()
        seq_p = seq_starts.data_ptr() if seq_starts is not None else 0
        if not (src_p | dst_p) & 3 and not fast_path.overlapping(dst_p, (src_p, bt_p, ws_p, seq_p), layout.extents):
            _run(layout, src_p, dst_p, bt_p, ws_p, seq_p)
            return
    plan = plan_gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if plan.device < 0:
        settings.debug_enabled()  # a bad NVRTC_GATHER_DEBUG is refused on every device
        gather_torch(plan, src_cache, dst, block_table, workspace_starts, seq_starts)
        return
    if plan.num_rows == 0 or plan.batch == 0:
        return
    layout = _layout(plan)
    _run(layout, plan.src_ptr, plan.dst_ptr, plan.bt_ptr, plan.ws_ptr, plan.seq_ptr)
    tensors = (src_cache, dst, block_table, workspace_starts)
    _layouts.remember(_key(*tensors, batch_size, seq_starts), layout, tensors if seq_starts is None else (),
                      batch_size)


def prepared(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None, *, module=None,
             rows_per_cta=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call (CUDA
    tensors) exactly as the op does, optionally with another build (``module``) or another
    rows-per-block choice."""
    plan = plan_gather(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)
    if rows_per_cta is not None:
        plan = plan._replace(rows_per_cta=rows_per_cta)
    layout = _layout(plan, module) if plan.num_rows and plan.batch else None

    def run(_keep=(src_cache, dst, block_table, workspace_starts, seq_starts)):  # the tensors outlive it
        if layout is not None:
            _run(layout, plan.src_ptr, plan.dst_ptr, plan.bt_ptr, plan.ws_ptr, plan.seq_ptr)
    return run


def gather_fake(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None) -> None:
    """The fake (meta) implementation: plan_gather's overlap check (WRITES, READS) on the traced
    tensors' storages (ops/fake_checks.py says why); of the per-request tensors only the first
    batch_size rows count, as in the full checks; the eager type and rank checks come first
    (shapes are read after them)."""
    fake_checks.int_arg("batch_size", batch_size)
    _check_types(src_cache, dst, block_table, workspace_starts, seq_starts)
    if dst.size(0) and batch_size:
        fake_checks.check(WRITES, READS, dict(dst=dst, src_cache=src_cache, block_table=block_table,
                                              workspace_starts=workspace_starts, seq_starts=seq_starts),
                          {"block_table": batch_size, "workspace_starts": batch_size, "seq_starts": batch_size})


library.register("cp_gather_and_upconvert_fp8_kv_cache(Tensor src_cache, Tensor(a!) dst, Tensor block_table, "
                 "Tensor workspace_starts, int batch_size, Tensor? seq_starts=None) -> ()",
                 cp_gather_and_upconvert_fp8_kv_cache, gather_fake)
