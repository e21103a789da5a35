"""SGLang's index-K read (``GetKAndS``) as one launch: each request's fp8 keys and fp32 scales
out of a layer's paged index buffer, packed by request, from SGLang's own arguments (request
lengths, an int32 or int64 page table of any strides, ``seq_len_sum`` rows). Contract:
docs/contract.md, "SGLang's index-K read".

On CUDA tensors a call is two ``torch.empty`` (the outputs, as SGLang's function allocates
them) and one launch of cuda_src/index_k_read.cu: the kernel sums the lengths itself and writes
every output row (zeros past the lengths' sum and where an index is bad), so nothing else runs
on the host or the GPU. Repeated layouts (the same buffer shape, index tensors' metadata and
sizes) redo only the per-call arithmetic. CPU tensors: prefix sums in torch and the indexer
gather's CPU path, the same bytes, ValueError on a bad value before anything is returned."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..jit import driver, runtime
from ..kernels import index_k_read as spec
from . import checks, fast_path
from .gather import cp_gather_indexer_k_quant_cache

_U8 = torch.uint8
INDEX_DTYPES = (torch.int32, torch.int64)
_C_TYPES = {torch.int32: "i32", torch.int64: "i64"}
_INT32_MIN = -2**31
MAX_ROWS = checks.INT32_MAX - spec.THREADS  # the kernel's last block computes its end row in 32 bits


def layout_words(buf, page_size, index_head_dim, quant_block_size) -> int:
    """nq (fp32 scales per token) after checking the sizes and that ``buf`` is a layer's 2-D
    uint8 buffer of ``page_size`` tokens per page: per page, ``page_size * index_head_dim``
    fp8 bytes, then ``page_size * nq`` fp32 scales."""
    checks.host_int("page_size", page_size, positive=True)
    checks.host_int("index_head_dim", index_head_dim, positive=True)
    checks.host_int("quant_block_size", quant_block_size, positive=True)
    if index_head_dim % quant_block_size:
        raise ValueError(f"index_head_dim: {index_head_dim} is not a multiple of quant_block_size={quant_block_size}")
    if index_head_dim % 4:
        raise ValueError(f"index_head_dim: must be a multiple of 4, got {index_head_dim}")
    nq = index_head_dim // quant_block_size
    stride = index_head_dim + 4 * nq
    checks.tensor("buf", buf)
    checks.dtype_in("buf", buf, (_U8,))
    if buf.dim() != 2:
        raise ValueError(f"buf: expected the layer's 2-D uint8 index buffer [num_pages, page_size * "
                         f"(index_head_dim + 4 * nq)], got shape {tuple(buf.shape)}")
    if buf.size(1) != page_size * stride:
        raise ValueError(f"buf: expected {page_size} * {stride} = {page_size * stride} bytes per page "
                         f"(page_size={page_size}, index_head_dim={index_head_dim}), got shape {tuple(buf.shape)}")
    if buf.size(1) > 1 and buf.stride(1) != 1:
        checks.unit_inner_stride("buf", buf)
    if buf.size(0) > 1 and buf.stride(0) < buf.size(1):
        raise ValueError(f"buf: pages overlap: stride(0) = {buf.stride(0)} bytes is less than a page's {buf.size(1)}")
    return nq


class ReadPlan(NamedTuple):
    """One validated call's layout (everything but the pointers and the row count)."""

    device: int          # CUDA ordinal, -1 otherwise
    nq: int              # fp32 scales per token
    head_dim: int
    page_size: int
    batch: int
    max_pages: int
    num_pages: int
    page_stride: int     # bytes
    fields: dict         # IndexKReadParams fields but the call's and the error buffer
    entry_types: tuple   # (lengths C type, page ids C type)


def plan_read(buf, seq_len_tensor, page_indices, page_size, index_head_dim, quant_block_size) -> ReadPlan:
    """Everything about a call checkable without reading tensor data, but its two host ints."""
    nq = layout_words(buf, page_size, index_head_dim, quant_block_size)
    for name, t in (("seq_len_tensor", seq_len_tensor), ("page_indices", page_indices)):
        checks.tensor(name, t)
        checks.dtype_in(name, t, INDEX_DTYPES)
    if seq_len_tensor.dim() != 1:
        raise ValueError(f"seq_len_tensor: expected [batch], got shape {tuple(seq_len_tensor.shape)}")
    if page_indices.dim() != 2 or page_indices.size(0) != seq_len_tensor.size(0):
        raise ValueError(f"page_indices: expected [batch, max_pages] with batch = {seq_len_tensor.size(0)} "
                         f"(seq_len_tensor's length), got shape {tuple(page_indices.shape)}")
    dev = checks.same_device({"buf": buf, "seq_len_tensor": seq_len_tensor, "page_indices": page_indices})
    batch, max_pages = page_indices.shape
    num_pages = buf.size(0)
    for name, what, value in (("page_indices", "batch", batch), ("page_indices", "max_pages", max_pages),
                              ("buf", "num_pages", num_pages), ("buf", "bytes per page", buf.size(1))):
        checks.fits_int32(name, what, value)
    page_stride = buf.stride(0)
    checks.aligned("buf", "stride(0)", page_stride)
    fields = dict(page_stride=page_stride, dst_k_row_stride=index_head_dim, dst_scale_row_stride=4 * nq,
                  pt_row_stride=page_indices.stride(0), pt_col_stride=page_indices.stride(1),
                  seq_lens_stride=seq_len_tensor.stride(0), batch=batch, max_pages=max_pages, num_pages=num_pages,
                  page_size=page_size, head_dim=index_head_dim, scale_words=nq)
    return ReadPlan(dev.index if dev.type == "cuda" else -1, nq, index_head_dim, page_size, batch, max_pages,
                    num_pages, page_stride, fields, (_C_TYPES[seq_len_tensor.dtype], _C_TYPES[page_indices.dtype]))


def _check_call(plan: ReadPlan, seq_len_sum, max_seq_len) -> None:
    if checks.host_int("seq_len_sum", seq_len_sum) > MAX_ROWS:
        raise ValueError(f"seq_len_sum: {seq_len_sum} rows exceed the supported {MAX_ROWS}")
    if checks.host_int("max_seq_len", max_seq_len) > plan.max_pages * plan.page_size:
        raise ValueError(f"max_seq_len: {max_seq_len} tokens do not fit in page_indices' {plan.max_pages} "
                         f"pages of {plan.page_size}")


class ReadLayout(NamedTuple):
    """What a call with a remembered layout needs besides its pointers and row count."""

    device: int
    head_dim: int
    scale_bytes: int     # 4 * nq
    max_tokens: int      # max_pages * page_size: the largest max_seq_len
    widths: tuple        # vector width by the low 4 bits of buf's and dst_k's pointers (0: not 4-aligned)
    types: tuple         # (lengths C type, page ids C type): the module
    fixed: bool          # the layout is spec.FIXED_LAYOUT: its entries with the sizes as constants
    launch: object       # spec.launch_rule of the layout: (rows, max_seq_len) -> (rows per block, shape, blocks)
    image: object        # the struct image with the layout's fields
    launchers: dict      # (vector width, shape) -> launcher (per-call grid), made on first use
    calls: dict          # _call's key -> (launcher, rows per block, blocks)


def fixed_layout(plan: ReadPlan) -> bool:
    """Whether the plan's layout is spec.FIXED_LAYOUT: its calls launch the entries built with the
    sizes as constants."""
    return spec.is_fixed_layout(plan.page_size, plan.head_dim, plan.nq)


def _layout(plan: ReadPlan) -> ReadLayout:
    low = plan.page_stride | plan.head_dim
    widths = tuple(0 if bits & 3 else spec.vector_width(bits | low) for bits in range(16))
    image = spec.PARAMS.image(**plan.fields)
    fixed = fixed_layout(plan)
    launch = spec.launch_rule(plan.head_dim, driver.sm_count(plan.device), plan.batch, fixed)
    return ReadLayout(plan.device, plan.head_dim, 4 * plan.nq, plan.max_pages * plan.page_size, widths,
                      plan.entry_types, fixed, launch, image, {}, {})


def _launcher(layout: ReadLayout, vec: int, shape: str):
    handle = runtime.load(spec.MODULES[(vec, *layout.types)], layout.device, runtime.current_stream(layout.device))
    entry = spec.entry_name(vec, *layout.types, shape, layout.fixed)
    go = layout.launchers[vec, shape] = handle.launcher(entry, 0, layout.image)
    return go


_layouts = fast_path.LayoutMemo()


def read_index_k(buf: torch.Tensor, seq_len_tensor: torch.Tensor, page_indices: torch.Tensor, seq_len_sum: int,
                 max_seq_len: int, page_size: int, index_head_dim: int,
                 quant_block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_fp8 uint8 ``[seq_len_sum, index_head_dim]``, k_scale uint8 ``[seq_len_sum, 4 * nq]``):
    the integration's ``get_index_k_scale_buffer`` (its docstring has the contract), by the full
    checks; the layout remembered for :func:`read_remembered`, which callers try first."""
    plan = plan_read(buf, seq_len_tensor, page_indices, page_size, index_head_dim, quant_block_size)
    _check_call(plan, seq_len_sum, max_seq_len)
    if plan.device < 0:
        settings.debug_enabled()  # a bad NVRTC_GATHER_DEBUG is refused on every device
        return _read_torch(plan, buf, seq_len_tensor, page_indices, seq_len_sum)
    checks.aligned("buf", "data pointer", buf.data_ptr())
    layout = _layout(plan)
    out = _run(layout, buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len)
    if out is None:  # buf is aligned: only an allocator handing out unaligned memory gets here
        raise ValueError("dst: torch.empty returned outputs that are not 4-byte aligned")
    _layouts.remember(_key(buf, seq_len_tensor, page_indices, page_size, index_head_dim, quant_block_size), layout,
                      (buf, seq_len_tensor, page_indices), (page_size, index_head_dim, quant_block_size))
    return out


def _key(buf, seq_len_tensor, page_indices, page_size, index_head_dim, quant_block_size) -> tuple:
    """A call's metadata: what its layout (and so every check but the pointers') depends on."""
    return (fast_path.layout_key3(buf, seq_len_tensor, page_indices), page_size, index_head_dim, quant_block_size)


def read_remembered(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, page_size, index_head_dim,
                    quant_block_size):
    """:func:`read_index_k`'s outputs where a call with this metadata was checked in full before
    (its layout remembered; only the host ints and the pointers are checked here), else None:
    the caller runs the full checks, which accept exactly what this accepts. SGLang's hook calls
    it first, ahead of its own checks of the buffer, which a remembered layout has passed."""
    if type(page_size) is not int or type(index_head_dim) is not int or type(quant_block_size) is not int:
        return None  # 64.0 == 64 would find the int's layout: the checks refuse it by name
    check, sizes, layout = _layouts.last
    try:
        if not check(buf, seq_len_tensor, page_indices) or sizes != (page_size, index_head_dim, quant_block_size):
            layout = _layouts.find(_key(buf, seq_len_tensor, page_indices, page_size, index_head_dim,
                                        quant_block_size))
    # Not tensors, unhashable sizes, tensors without strides (sparse CSR, nested): the checks name them.
    except (AttributeError, TypeError, RuntimeError):
        return None
    if layout is None or type(seq_len_sum) is not int or not 0 <= seq_len_sum <= MAX_ROWS or \
            type(max_seq_len) is not int or not 0 <= max_seq_len <= layout.max_tokens:
        return None
    return _run(layout, buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len)


def _run(layout: ReadLayout, buf, seq_len_tensor, page_indices, seq_len_sum: int, max_seq_len: int):
    """The call on a checked layout (``max_seq_len`` checked too: it sizes the request-major
    grid): the outputs (fresh: they cannot overlap the inputs) and one launch with this call's
    grid; None when the pointers are not 4-byte aligned (only buf's pointer, the layer's, changes
    between calls of a layout)."""
    k = buf.new_empty(seq_len_sum, layout.head_dim)  # uint8 on buf's device, as torch.empty(..., dtype, device)
    s = buf.new_empty(seq_len_sum, layout.scale_bytes)
    if not seq_len_sum:
        return k, s
    kv_p, k_p = buf.data_ptr(), k.data_ptr()
    # An engine reads every layer of a step with the same row count and max_seq_len: one lookup
    # instead of the launch rule (seq_len_sum <= MAX_ROWS < 2^32 fills bits 4-35).
    key = (kv_p | k_p) & 15 | seq_len_sum << 4 | max_seq_len << 36
    call = layout.calls.get(key) or _call(layout, key)
    if call is None:
        return None
    go, tpc, blocks = call
    go((kv_p, k_p, s.data_ptr(), seq_len_tensor.data_ptr(), page_indices.data_ptr(), seq_len_sum, tpc), 0, blocks)
    return k, s


_MAX_CALLS = 1024  # (row count, max_seq_len) pairs a layout keeps (cleared when full: prefill brings new ones)


def _call(layout: ReadLayout, key: int):
    """(launcher, rows per block, blocks) of a call with ``key`` (low 4 pointer bits | rows << 4 |
    max_seq_len << 36), kept in ``layout.calls``; None when the pointers are not 4-byte aligned."""
    vec = layout.widths[key & 15]
    if not vec:
        return None
    tpc, shape, blocks = layout.launch(key >> 4 & 0xffffffff, key >> 36)
    go = layout.launchers.get((vec, shape)) or _launcher(layout, vec, shape)
    if len(layout.calls) >= _MAX_CALLS:
        layout.calls.clear()
    call = layout.calls[key] = go, tpc, blocks
    return call


# -- the CPU path --------------------------------------------------------------------------------

def _read_torch(plan: ReadPlan, buf, seq_len_tensor, page_indices, seq_len_sum):
    """CPU tensors: the values checked (ValueError naming the argument), prefix sums in int64,
    the indexer gather's CPU path into zeroed outputs: the kernel's bytes."""
    used = check_values(seq_len_tensor, page_indices, seq_len_sum, plan.page_size)
    k = torch.zeros(seq_len_sum, plan.head_dim, dtype=_U8, device=buf.device)
    s = torch.zeros(seq_len_sum, 4 * plan.nq, dtype=_U8, device=buf.device)
    cu_seq_lens = torch.zeros(plan.batch + 1, dtype=torch.int32, device=buf.device)
    cu_seq_lens[1:] = torch.cumsum(seq_len_tensor, 0, dtype=torch.int64).to(torch.int32)
    block_table = torch.where(used, page_indices, 0).to(torch.int32)  # a column no row reads: never looked at
    kv_cache = buf.view(plan.num_pages, plan.page_size, plan.head_dim + 4 * plan.nq)
    try:
        cp_gather_indexer_k_quant_cache(kv_cache, k, s, block_table, cu_seq_lens)
    except ValueError as e:  # a page id the gather refused: said in the caller's names
        raise ValueError(checks.renamed(str(e), _GATHER_NAMES).replace("physical block", "page")) from None
    return k, s


_GATHER_NAMES = {"block_table": "page_indices", "cu_seq_lens": "seq_len_tensor", "kv_cache": "buf",
                 "num_blocks": "num_pages"}


def check_values(seq_len_tensor: torch.Tensor, page_indices: torch.Tensor, seq_len_sum: int,
                 page_size: int) -> torch.Tensor:
    """Negative lengths, lengths that int32 cannot hold, a seq_len_sum below the lengths' sum,
    and page ids outside int32 in a column some row reads (reads the tensors). Returns which
    columns of ``page_indices`` rows read (bool, its shape)."""
    if seq_len_tensor.numel():
        lo, hi = int(seq_len_tensor.min()), int(seq_len_tensor.max())
        total = int(seq_len_tensor.sum(dtype=torch.int64))
        if lo < 0 or hi > checks.INT32_MAX or total > checks.INT32_MAX:
            raise ValueError(f"seq_len_tensor: lengths must be >= 0 and sum to at most {checks.INT32_MAX}, got min "
                             f"{lo}, max {hi}, sum {total}")
        if total > seq_len_sum:
            raise ValueError(f"seq_len_sum: {seq_len_sum} rows cannot hold the {total} tokens of seq_len_tensor "
                             "(seq_len_sum is the sum of the lengths)")
    starts = torch.arange(page_indices.size(1), dtype=torch.int64) * page_size
    used = starts[None, :] < seq_len_tensor.to(torch.int64)[:, None]
    if page_indices.dtype == torch.int64 and bool(used.any()):
        ids = page_indices[used]
        lo, hi = int(ids.min()), int(ids.max())
        if lo < _INT32_MIN or hi > checks.INT32_MAX:
            raise ValueError(f"page_indices: page ids must fit int32, got values in [{lo}, {hi}] in the columns "
                             "rows read")
    return used
