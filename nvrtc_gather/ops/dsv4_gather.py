"""DeepSeek-V4's MLA record (584 bytes a token) gathered and dequantized, in the engines' forms
(contract: docs/contract.md, "DeepSeek-V4 record gathers"):

- ``dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size,
  offset)``: vLLM's (bf16 ``[reqs, M, 512]``, per-request rows through a block table);
- ``gather_flat(cache, ids, page_size, out, extra_rows, fp8_out, layout)``: SGLang's two functions
  (flat token ids; bf16 rows, or fp8 rows with ``extra_rows`` zero rows after them); bf16 rows
  also from SGLang's V4.1 layouts (``layout``: v41, v41_new, v41_fp4, v41_fp4_new).

One launch of cuda_src/dsv4_gather.cu on CUDA tensors; the remembered layout is the cache's (its
metadata, the ids' dtype, the page size), so a call whose only change is its row count, its
output or its index tensors (every prefill chunk) redoes only cheap shape checks. CPU tensors:
dsv4_gather_torch.py, the same bytes, ValueError on a bad index value."""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import settings
from ..jit import runtime
from ..kernels import dsv4_gather as spec
from . import checks, fake_checks, fast_path, library
from .dsv4_gather_torch import flat_torch, paged_torch

_U8, _FP8, _BF16, _I32, _I64 = torch.uint8, torch.float8_e4m3fn, torch.bfloat16, torch.int32, torch.int64
_CACHE_DTYPES = (_U8, _FP8)
_C_TYPES = {_I32: "i32", _I64: "i64"}
_is_compiling = torch.compiler.is_compiling
# What each form writes and reads: the eager overlap check and the fake take their names from it.
FLAT_WRITES, FLAT_READS = ("out",), ("quant_k_cache", "page_table_1_flattened")
PAGED_WRITES, PAGED_READS = ("out",), ("k_cache", "seq_lens", "gather_lens", "block_table")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, past the last byte) of a strided tensor (empty: nothing)."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    return lo, lo + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _apart(writes: tuple, reads: tuple, named: dict) -> None:
    """A given ``out`` overlapping what the call reads: ValueError naming both (a race on the GPU)."""
    checks.disjoint({n: _span(named[n]) for n in writes}, {n: _span(named[n]) for n in reads if named[n] is not None})


class CacheLayout(NamedTuple):
    """A validated cache: what every call on it shares."""

    device: int          # CUDA ordinal, -1 for CPU
    num_pages: int
    page_size: int
    page_stride: int     # bytes
    image: object        # the struct image with the cache's fields (None on CPU)
    launchers: dict      # entry -> launcher (per-call grid), made on first use


def _cache_layout(cache, page_size: int, name: str, three_d: bool, token_bytes: int) -> CacheLayout:
    checks.tensor(name, cache)
    checks.dtype_in(name, cache, _CACHE_DTYPES)
    checks.host_int("block_size" if three_d else "page_size", page_size, positive=True)
    if three_d:
        if cache.dim() != 3 or cache.size(1) != page_size or cache.size(2) != spec.RECORD_BYTES:
            raise ValueError(f"{name}: expected uint8 [num_blocks, block_size={page_size}, {spec.RECORD_BYTES}], got "
                             f"shape {tuple(cache.shape)}")
        if cache.size(0) > 1 and cache.stride(0) < page_size * spec.RECORD_BYTES or \
                page_size > 1 and cache.stride(1) != spec.RECORD_BYTES or cache.stride(2) != 1:
            raise ValueError(f"{name}: expected strides (block bytes >= {page_size * spec.RECORD_BYTES}, "
                             f"{spec.RECORD_BYTES}, 1): a block's records then its scale rows, got {cache.stride()}")
    else:
        if cache.dim() != 2 or cache.size(1) < page_size * token_bytes:
            raise ValueError(f"{name}: expected the pool's 2-D buffer [num_pages, page bytes >= page_size * "
                             f"{token_bytes} = {page_size * token_bytes}], got shape {tuple(cache.shape)}")
        if cache.size(1) > 1 and cache.stride(1) != 1:
            checks.unit_inner_stride(name, cache)
        if cache.size(0) > 1 and cache.stride(0) < page_size * token_bytes:
            raise ValueError(f"{name}: pages overlap: stride(0) = {cache.stride(0)} bytes is less than a page's "
                             f"page_size * {token_bytes} = {page_size * token_bytes}")
    num_pages, page_stride = cache.size(0), cache.stride(0)
    checks.fits_int32(name, "num_pages * page_size", num_pages * page_size)
    if num_pages > 1:  # on every device: the kernel's 16-byte accesses need it, and CPU gives CUDA's answer
        checks.aligned(name, "stride(0)", page_stride, 16)
    dev = cache.device
    if dev.type != "cuda":
        return CacheLayout(-1, num_pages, page_size, page_stride, None, {})
    image = spec.PARAMS.image(page_stride=page_stride, num_slots=num_pages * page_size, page_size=page_size,
                              num_pages=num_pages)
    return CacheLayout(dev.index, num_pages, page_size, page_stride, image, {})


_layouts = fast_path.LayoutMemo()


def _remembered(cache, page_size, name, three_d, token_bytes=spec.RECORD_BYTES) -> CacheLayout:
    if type(page_size) is not int:  # 16.0 == 16 would find the int's layout: refuse it by name
        return _cache_layout(cache, page_size, name, three_d, token_bytes)
    try:
        key = (cache.device, cache.dtype, cache.shape, cache.stride(), page_size, three_d, token_bytes)
        layout = _layouts.get(key)
    except (AttributeError, TypeError, RuntimeError):  # no strides (sparse CSR, nested): named below
        return _cache_layout(cache, page_size, name, three_d, token_bytes)  # raises, naming the argument
    if layout is None:
        layout = _cache_layout(cache, page_size, name, three_d, token_bytes)
        _layouts.remember(key, layout)
    elif layout.device < 0:  # the CPU path reads values, not bytes: a negative view is refused on every call
        checks.tensor(name, cache)
    return layout


def _launch(layout: CacheLayout, module, entry: str, blocks: int, call: tuple):
    """Launch ``entry`` with ``blocks`` blocks and the call's fields; returns its launcher."""
    go = layout.launchers.get(entry)
    if go is None:
        handle = runtime.load(module, layout.device, runtime.current_stream(layout.device))
        go = layout.launchers[entry] = handle.launcher(entry, 0, layout.image)
    go(call, 0, blocks)
    return go


def _aligned16(name: str, ptr: int) -> None:
    if ptr & 15:
        checks.aligned(name, "data pointer", ptr, 16)


# -- SGLang's forms --------------------------------------------------------------------------------

def layout_name(layout, fp8_out: bool) -> str:
    """SGLang's ``KVLayout`` (a str enum) or its value, any case, as the spec's name: ``v4``, or a
    V4.1 layout for the bf16 form. TypeError/ValueError naming ``layout`` otherwise."""
    name = getattr(layout, "value", layout)
    if not isinstance(name, str):
        raise TypeError(f"layout: expected SGLang's KVLayout or its name, got {type(layout).__name__}")
    name = name.lower()
    if name not in spec.TOKEN_BYTES:
        raise ValueError(f"layout: expected one of {', '.join(spec.TOKEN_BYTES)}, got {name!r}")
    if fp8_out and name != "v4":
        raise ValueError(f"layout: the fp8 form reads the v4 layout only, got {name!r}")
    return name


def _entry(fp8_out: bool, ids_dtype, layout: str) -> tuple:
    """(module, entry) of a flat-form call."""
    if layout == "v4":
        return spec.FLAT_MODULE, spec.flat_entry(fp8_out, _C_TYPES[ids_dtype])
    return spec.V41_MODULE, spec.v41_entry(layout, _C_TYPES[ids_dtype])


def gather_flat(cache, ids, page_size: int, out, extra_rows: int, fp8_out: bool, layout="v4"):
    if _is_compiling():  # inside torch.compile: the registered op (out allocated in the graph)
        if out is None and isinstance(ids, torch.Tensor) and isinstance(cache, torch.Tensor):
            library.traced_int("extra_rows", extra_rows)  # it sizes out: checked first, as eager does
            if isinstance(extra_rows, int) and extra_rows < 0:
                checks.host_int("extra_rows", extra_rows)
            checks.rank("page_table_1_flattened", ids, 1, "[n] (flat token ids: page * page_size + slot)")
            out = torch.empty(_rows_of(ids.size(0), extra_rows), 1, spec.ROW_VALUES,
                              dtype=_FP8 if fp8_out else _BF16, device=cache.device)
        library.traced("dsv4_gather_flat", cache, ids, page_size, out, extra_rows, fp8_out,
                       layout_name(layout, fp8_out))
        return out
    if out is None:
        got = _flat_remembered(cache, ids, page_size, extra_rows, fp8_out, layout)
        if got is not None:
            return got
    return _gather_flat(cache, ids, page_size, out, extra_rows, fp8_out, layout_name(layout, fp8_out))


class FlatReady(NamedTuple):
    """An SGLang-form call with ``out=None`` that passed every check: what a call with the same
    metadata (the cache's, the ids' device, dtype and rank, the page size, the output dtype, the
    layout) needs besides its pointers, ids stride and row counts."""

    go: object      # the entry's launcher (per-call grid)
    dtype: object   # the output's torch dtype
    row_bytes: int  # 512 values of it


_flat_ready = fast_path.LayoutMemo()


def _flat_key(cache, ids, page_size: int, fp8_out: bool, layout) -> tuple:
    # ids' layout: a sparse vector (no strides, no data pointer) never takes a dense call's entry;
    # ``layout`` as given (a KVLayout equals and hashes as its name): only a checked call is remembered
    return (cache.device, cache.dtype, cache.shape, cache.stride(), ids.device, ids.dtype, ids.dim(), ids.layout,
            page_size, fp8_out, layout)


def _flat_remembered(cache, ids, page_size, extra_rows, fp8_out, layout):
    """The call's fresh ``out``, gathered, where its metadata was checked in full before; else
    None (the full checks run, and accept exactly what this accepts)."""
    try:
        if type(page_size) is not int or type(extra_rows) is not int:
            return None  # 16.0 == 16 would find the int's entry: the checks refuse it by name
        ready = _flat_ready.get(_flat_key(cache, ids, page_size, fp8_out, layout))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, or no strides (sparse CSR, nested)
        return None
    if ready is None or extra_rows < 0:
        return None
    n = ids.size(0)
    rows, cache_p = n + extra_rows, cache.data_ptr()
    if rows > checks.INT32_MAX or cache_p & 15:
        return None
    out = cache.new_empty((rows, 1, spec.ROW_VALUES), dtype=ready.dtype)  # torch.empty on cache's device
    if rows:
        out_p = out.data_ptr()
        if out_p & 15:
            checks.aligned("out", "data pointer", out_p, 16)
        ready.go((cache_p, out_p, ids.data_ptr(), 0, 0, rows, n, ready.row_bytes, 0, ids.stride(0), 0, 0, 0), 0,
                 spec.tiles(rows))
    return out


def _rows_of(n: int, extra_rows: int) -> int:
    """The output's rows, n + extra_rows, within the kernel's 32-bit row count."""
    checks.fits_int32("extra_rows", "the output's rows n + extra_rows", n + extra_rows)
    return n + extra_rows


def _gather_flat(cache, ids, page_size: int, out, extra_rows: int, fp8_out: bool, record: str):
    """SGLang's ``dequantize_k_cache_paged_dsv4`` (bf16, ``extra_rows`` 0, any ``layout``) and
    ``gather_dequant_requant_fp8_paged_dsv4`` (fp8, the V4 layout): row r < n of ``out`` ``[n +
    extra_rows, 1, 512]`` from token id ``ids[r]``, rows n .. n + extra_rows - 1 zero; ``out``
    allocated with ``torch.empty`` when None (the kernel writes every row). Returns ``out``."""
    layout = _remembered(cache, page_size, "quant_k_cache", False, spec.TOKEN_BYTES[record])
    checks.tensor("page_table_1_flattened", ids)
    if ids.dtype not in _C_TYPES or ids.dim() != 1:
        checks.dtype_in("page_table_1_flattened", ids, (_I32, _I64))
        checks.rank("page_table_1_flattened", ids, 1, "[n] (flat token ids: page * page_size + slot)")
    checks.host_int("extra_rows", extra_rows)
    n = ids.size(0)
    rows = _rows_of(n, extra_rows)
    dtype = _FP8 if fp8_out else _BF16
    if out is None:  # fresh: apart from everything
        out = torch.empty(rows, 1, spec.ROW_VALUES, dtype=dtype, device=cache.device)
        given = False
    else:
        given = True
        checks.tensor("out", out)
        if out.dtype != dtype or tuple(out.shape) != (rows, 1, spec.ROW_VALUES):
            raise ValueError(f"out: expected {dtype} of shape ({rows}, 1, {spec.ROW_VALUES}), got {out.dtype} "
                             f"{tuple(out.shape)}")
        if out.stride(2) != 1:
            checks.unit_inner_stride("out", out)
        if rows > 1 and out.stride(0) < spec.ROW_VALUES:
            raise ValueError(f"out: rows overlap (stride(0) = {out.stride(0)} < {spec.ROW_VALUES} values a row)")
    if ids.device != cache.device or out.device != cache.device or layout.device < 0 and cache.device.type != "cpu":
        checks.same_device({"quant_k_cache": cache, "page_table_1_flattened": ids, **({"out": out} if given else {})})
    if given and rows:
        _apart(FLAT_WRITES, FLAT_READS, {"out": out, "quant_k_cache": cache, "page_table_1_flattened": ids})
    if layout.device < 0:
        settings.debug_enabled()
        flat_torch(cache, ids, layout.page_size, out, n, fp8_out, record)
        return out
    if rows:
        out_p, row_bytes = out.data_ptr(), out.stride(0) * out.element_size()
        _aligned16("quant_k_cache", cache.data_ptr())
        if (out_p | (row_bytes if rows > 1 else 0)) & 15:
            checks.aligned("out", "data pointer and row stride", out_p | row_bytes, 16)
        go = _launch(layout, *_entry(fp8_out, ids.dtype, record), spec.tiles(rows),
                     (cache.data_ptr(), out_p, ids.data_ptr(), 0, 0, rows, n, row_bytes, 0, ids.stride(0), 0, 0, 0))
        if not given and type(page_size) is int and type(extra_rows) is int:
            _flat_ready.remember(_flat_key(cache, ids, page_size, fp8_out, record), FlatReady(go, dtype, row_bytes))
    return out


# -- vLLM's form -----------------------------------------------------------------------------------

def dequantize_and_gather_k_cache(out: torch.Tensor, k_cache: torch.Tensor, seq_lens: torch.Tensor,
                                  gather_lens: torch.Tensor | None, block_table: torch.Tensor, block_size: int,
                                  offset: int) -> None:
    """vLLM's DeepSeek-V4 prefill gather (``vllm.models.deepseek_v4.common.ops``): request r's
    rows ``offset .. offset + g - 1`` of ``out[r]`` (bf16 ``[reqs, M, 512]``), g = ``gather_lens[r]``
    (``seq_lens[r]`` when ``gather_lens`` is None), dequantized from cache positions
    ``seq_lens[r] - g .. seq_lens[r] - 1`` through ``block_table[r]``; other rows untouched.
    ``k_cache``: uint8 ``[num_blocks, block_size, 584]``, a block's records then its scale rows,
    the block stride padded as vLLM allocates it. One launch on CUDA tensors, no host sync;
    rows with bad indices are skipped (NVRTC_GATHER_DEBUG=1 raises); CPU tensors: ValueError."""
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return library.traced("dequantize_and_gather_k_cache", out, k_cache, seq_lens, gather_lens, block_table,
                              block_size, offset)
    try:  # a call whose metadata was seen: only the pointer checks (fast_path.py)
        key = (out.device, out.dtype, out.shape, out.stride(), k_cache.device, k_cache.dtype, k_cache.shape,
               k_cache.stride(), seq_lens.device, seq_lens.dtype, seq_lens.shape, seq_lens.stride(),
               None if gather_lens is None else (gather_lens.device, gather_lens.dtype, gather_lens.shape,
                                                 gather_lens.stride()),
               block_table.device, block_table.dtype, block_table.shape, block_table.stride(),
               type(block_size), block_size, type(offset), offset)
        seen = _paged_calls.get(key)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable, no strides: the checks name them
        key = seen = None
    if seen is not None:
        layout, blocks, tail, extents = seen
        out_p, kv_p, sl_p, bt_p = out.data_ptr(), k_cache.data_ptr(), seq_lens.data_ptr(), block_table.data_ptr()
        gl_p = 0 if gather_lens is None else gather_lens.data_ptr()
        if not (out_p | kv_p) & 15 and not fast_path.overlapping(out_p, (kv_p, sl_p, gl_p, bt_p), extents):
            _launch(layout, spec.PAGED_MODULE, spec.PAGED_ENTRY, blocks, (kv_p, out_p, bt_p, sl_p, gl_p) + tail)
            return
    layout = _remembered(k_cache, block_size, "k_cache", True)
    _check_paged(out, seq_lens, gather_lens, block_table, offset, k_cache)
    _apart(PAGED_WRITES, PAGED_READS, {"out": out, "k_cache": k_cache, "seq_lens": seq_lens,
                                       "gather_lens": gather_lens, "block_table": block_table})
    reqs, m = out.size(0), out.size(1)
    if layout.device < 0:
        settings.debug_enabled()
        paged_torch(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)
        return
    rows = m - offset
    if reqs == 0 or rows <= 0:
        return
    out_p = out.data_ptr()
    _aligned16("k_cache", k_cache.data_ptr())
    if (out_p | out.stride(0) * 2 | out.stride(1) * 2) & 15:
        checks.aligned("out", "data pointer and row strides", out_p | out.stride(0) * 2 | out.stride(1) * 2, 16)
    tiles = spec.tiles(rows)
    tail = (m, reqs, out.stride(1) * 2, out.stride(0) * 2, block_table.stride(0), block_table.size(1), offset, tiles)
    _launch(layout, spec.PAGED_MODULE, spec.PAGED_ENTRY, reqs * tiles,
            (k_cache.data_ptr(), out_p, block_table.data_ptr(), seq_lens.data_ptr(),
             0 if gather_lens is None else gather_lens.data_ptr()) + tail)
    if key is not None:
        spans = [_span(t) if t is not None else (0, 0) for t in (out, k_cache, seq_lens, gather_lens, block_table)]
        _paged_calls.remember(key, (layout, reqs * tiles, tail, tuple(hi - lo for lo, hi in spans)))


_paged_calls = fast_path.LayoutMemo()  # vLLM's form: (layout, grid, the call's sizes, byte extents) by the call's metadata


def _check_paged(out, seq_lens, gather_lens, block_table, offset, k_cache) -> None:
    named = {"out": out, "seq_lens": seq_lens}  # the op's order (k_cache, second, is checked apart)
    if gather_lens is not None:
        named["gather_lens"] = gather_lens
    named["block_table"] = block_table
    for name, t in named.items():
        checks.tensor(name, t)
    checks.dtype_in("out", out, (_BF16,))
    for name in ("seq_lens", "gather_lens", "block_table"):
        if name in named:
            checks.dtype_in(name, named[name], (_I32,))
    checks.rank("out", out, 3, f"[num_reqs, max_rows, {spec.ROW_VALUES}]")
    if out.size(2) != spec.ROW_VALUES:
        raise ValueError(f"out: expected {spec.ROW_VALUES} values a row, got shape {tuple(out.shape)}")
    if out.stride(2) != 1:
        checks.unit_inner_stride("out", out)
    _rows_apart(out)
    reqs = out.size(0)
    for name in ("seq_lens", "gather_lens"):
        if name in named and (named[name].dim() != 1 or named[name].size(0) != reqs):
            raise ValueError(f"{name}: expected int32 [num_reqs = {reqs}] (out's dim 0), got shape "
                             f"{tuple(named[name].shape)}")
        if name in named and reqs > 1 and named[name].stride(0) != 1:
            checks.unit_inner_stride(name, named[name])
    if block_table.dim() != 2 or block_table.size(0) != reqs:
        raise ValueError(f"block_table: expected int32 [num_reqs = {reqs}, max_blocks], got shape "
                         f"{tuple(block_table.shape)}")
    if block_table.size(1) > 1 and block_table.stride(1) != 1:
        checks.unit_inner_stride("block_table", block_table)
    checks.host_int("offset", offset)
    if any(t.device != k_cache.device for t in named.values()) or k_cache.device.type not in ("cpu", "cuda"):
        checks.same_device({"out": out, "k_cache": k_cache, **named})  # "out" keeps its place: the op's order
    for name, what, value in (("out", "rows per request", out.size(1)), ("block_table", "max_blocks",
                                                                          block_table.size(1))):
        checks.fits_int32(name, what, value)


def _rows_apart(out) -> None:
    """``out``'s rows [reqs, M] (512 contiguous values each) must not share memory. Checked as
    nested strides (one dimension's rows inside the other's span): what a view of a dense
    tensor or a padded allocation has; an interleaving of the two dimensions is refused too."""
    dims = sorted((out.stride(d), out.size(d)) for d in (0, 1) if out.size(d) > 1)
    span = spec.ROW_VALUES
    for stride, size in dims:
        if stride < span:
            raise ValueError(f"out: rows overlap: strides {tuple(out.stride())} for shape {tuple(out.shape)} put two "
                             f"rows of {spec.ROW_VALUES} values less than a row apart (expected stride(1) >= "
                             f"{spec.ROW_VALUES} and stride(0) >= (M - 1) * stride(1) + {spec.ROW_VALUES}, or the same "
                             "with the two dimensions swapped)")
        span = (size - 1) * stride + span


# -- torch.ops.nvrtc_gather (torch.compile, CUDA graphs) ------------------------------------------------

def _flat_op(quant_k_cache, page_table_1_flattened, page_size, out, extra_rows, fp8_out, layout="v4") -> None:
    _gather_flat(quant_k_cache, page_table_1_flattened, page_size, out, extra_rows, fp8_out,
                 layout_name(layout, fp8_out))


def _flat_fake(quant_k_cache, page_table_1_flattened, page_size, out, extra_rows, fp8_out, layout="v4") -> None:
    layout_name(layout, fp8_out)
    checks.tensor("quant_k_cache", quant_k_cache)
    checks.tensor("page_table_1_flattened", page_table_1_flattened)
    checks.tensor("out", out)
    fake_checks.check(FLAT_WRITES, FLAT_READS, dict(out=out, quant_k_cache=quant_k_cache,
                                                    page_table_1_flattened=page_table_1_flattened))


def _paged_fake(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset) -> None:
    checks.tensor("k_cache", k_cache)
    _check_paged(out, seq_lens, gather_lens, block_table, offset, k_cache)
    fake_checks.check(PAGED_WRITES, PAGED_READS, dict(out=out, k_cache=k_cache, seq_lens=seq_lens,
                                                      gather_lens=gather_lens, block_table=block_table))


library.register("dsv4_gather_flat(Tensor quant_k_cache, Tensor page_table_1_flattened, int page_size, "
                 "Tensor(a!) out, int extra_rows, bool fp8_out, str layout=\"v4\") -> ()", _flat_op, _flat_fake)
library.register("dequantize_and_gather_k_cache(Tensor(a!) out, Tensor k_cache, Tensor seq_lens, "
                 "Tensor? gather_lens, Tensor block_table, int block_size, int offset) -> ()",
                 dequantize_and_gather_k_cache, _paged_fake)
