"""SGLang's DSA/NSA indexer cache read through nvrtc_gather's gather.

SGLang's pool (``DSATokenToKVPool``, formerly ``NSATokenToKVPool``) keeps each layer's indexer
keys in one uint8 buffer ``[num_pages, page_size * (index_head_dim + 4 * nq)]``: per page,
``page_size * index_head_dim`` fp8 bytes then ``page_size`` fp32 scales (``nq`` per token), the
paged layout of docs/contract.md §1 with ``block_size = page_size``. Its
``get_index_k_scale_buffer(layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len)``
picks the layer's buffer and calls ``GetKAndS.execute(pool, buf, page_indices=...,
seq_len_tensor=..., seq_len_sum=..., max_seq_len=...)`` in ``index_buf_accessor.py``
(``sglang/srt/layers/attention/dsa/``, ``.../nsa/`` before the rename), which returns every
request's keys packed by request: ``(k uint8 [seq_len_sum, index_head_dim], scales uint8
[seq_len_sum, 4 * nq])``.

:func:`register` replaces that ``execute`` in whichever of the two modules SGLang has: a uint8
(fp8) buffer goes to :func:`get_index_k_scale_buffer` (one gather launch, no host sync), anything
else (a bf16 index cache, a ROCm build, SGLang's older single-request call) to SGLang's own
``execute``. The pool method itself is untouched, so its layer-id translation (subclasses), its
layer-transfer waits and its bf16 branch still run as SGLang wrote them."""
from __future__ import annotations

import functools
import importlib
import logging
import sys

import torch

from .. import cp_gather_indexer_k_quant_cache
from .. import settings
from ..kernels import gather as gather_kernels
from ..ops import checks

log = logging.getLogger(__name__)

MODULES = ("sglang.srt.layers.attention.dsa.index_buf_accessor",  # current SGLang
           "sglang.srt.layers.attention.nsa.index_buf_accessor")  # before the NSA -> DSA rename
QUANT_BLOCK_SIZE = 128  # SGLang's indexer: one fp32 scale per 128 fp8 values
_INT32_MIN = -2**31
_INDEX_DTYPES = (torch.int32, torch.int64)
_TAG = "_nvrtc_gather_original"


def register() -> tuple[str, ...]:
    """Route SGLang's ``GetKAndS.execute`` to nvrtc_gather for fp8 (uint8) index buffers, in
    every accessor module SGLang has; returns their names. Idempotent. Raises
    ModuleNotFoundError when SGLang has neither module."""
    patched = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        _patch(module.GetKAndS)
        patched.append(name)
    if not patched:
        raise ModuleNotFoundError(f"nvrtc_gather.integrations.sglang.register(): SGLang's index buffer accessor is "
                                  f"not importable here (looked for {' and '.join(MODULES)})")
    log.info("nvrtc_gather: SGLang's GetKAndS.execute (%s) now runs nvrtc_gather's gather for fp8 index buffers",
             ", ".join(patched))
    return tuple(patched)


def unregister() -> None:
    """Give SGLang its own ``GetKAndS.execute`` back, in every module :func:`register` patched."""
    for name in MODULES:
        module = sys.modules.get(name)
        cls = getattr(module, "GetKAndS", None)
        original = cls.__dict__.get(_TAG) if cls is not None else None
        if original is not None:
            cls.execute = original
            delattr(cls, _TAG)


def _patch(cls) -> None:
    if _TAG in cls.__dict__:
        return
    original = cls.__dict__["execute"]  # a classmethod
    sglang_execute = original.__get__(None, cls)

    @functools.wraps(sglang_execute)
    def execute(klass, pool, buf, *args, **kwargs):
        if "seq_len" in kwargs or not _is_fp8_buffer(buf):  # SGLang's own path
            return sglang_execute(pool, buf, *args, **kwargs)
        return _from_pool(pool, buf, *args, **kwargs)

    setattr(cls, _TAG, original)
    cls.execute = classmethod(execute)


def _is_fp8_buffer(buf) -> bool:
    return isinstance(buf, torch.Tensor) and buf.dtype == torch.uint8 and torch.version.hip is None and \
        buf.device.type in ("cuda", "cpu")


def _from_pool(pool, buf, page_indices, seq_len_tensor, seq_len_sum, max_seq_len):
    """SGLang's GetKAndS arguments (same order as its ``triton``/``aiter`` methods)."""
    return get_index_k_scale_buffer(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len,
                                    page_size=pool.page_size, index_head_dim=pool.index_head_dim,
                                    quant_block_size=getattr(pool, "quant_block_size", QUANT_BLOCK_SIZE))


def get_index_k_scale_buffer(buf: torch.Tensor, seq_len_tensor: torch.Tensor, page_indices: torch.Tensor,
                             seq_len_sum: int, max_seq_len: int, *, page_size: int = 64,
                             index_head_dim: int = 128,
                             quant_block_size: int = QUANT_BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_fp8 uint8 ``[seq_len_sum, index_head_dim]``, k_scale uint8 ``[seq_len_sum, 4 * nq]``) for
    the requests of ``seq_len_tensor`` (lengths, ``[batch]``, int32/int64) whose pages are the rows
    of ``page_indices`` (``[batch, max_pages]``, int32/int64), packed by request, as SGLang's
    ``GetKAndS`` returns them. ``seq_len_sum`` (a host int, the sum of the lengths) sizes the
    outputs; ``max_seq_len`` must fit in ``page_indices``' pages.

    Arguments are checked before anything is written (TypeError/ValueError naming the argument).
    Page ids and lengths must fit int32: on CPU tensors one that does not raises ValueError; on
    CUDA tensors they stay on the device (no host sync) and one that does not is never read as
    another page: its request's rows are skipped (left unwritten), and NVRTC_GATHER_DEBUG=1
    raises the ValueError instead (one sync per call)."""
    nq = _check(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, page_size, index_head_dim,
                quant_block_size)
    dev = buf.device
    batch = seq_len_tensor.size(0)
    if dev.type == "cpu" or settings.debug_enabled():
        _check_values(seq_len_tensor, page_indices)
    # Prefix sums in int64 (int32 ones wrap); anything outside int32 becomes -1, out of range for
    # the kernel, which then skips that request's rows rather than reading a wrapped-around page.
    cu64 = torch.cumsum(seq_len_tensor, 0, dtype=torch.int64)
    cu_seq_lens = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    cu_seq_lens[1:] = _to_int32(cu64)
    block_table = page_indices if page_indices.dtype == torch.int32 else _to_int32(page_indices)
    k_fp8 = torch.empty(seq_len_sum, index_head_dim, dtype=torch.uint8, device=dev)
    k_scale = torch.empty(seq_len_sum, 4 * nq, dtype=torch.uint8, device=dev)
    kv_cache = buf.view(buf.size(0), page_size, index_head_dim + 4 * nq)
    cp_gather_indexer_k_quant_cache(kv_cache, k_fp8, k_scale, block_table, cu_seq_lens)
    return k_fp8, k_scale


def _to_int32(t: torch.Tensor) -> torch.Tensor:
    fits = (t >= _INT32_MIN) & (t <= checks.INT32_MAX)
    return torch.where(fits, t, -1).to(torch.int32)


def _host_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a host int, got {type(value).__name__}"
                        + (" (a tensor: pass the value, e.g. int(t), computed where the host already has it)"
                           if isinstance(value, torch.Tensor) else ""))
    if value < 0:
        raise ValueError(f"{name}: expected a non-negative int, got {value}")
    return value


def _check(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, page_size, index_head_dim,
           quant_block_size) -> int:
    """Everything checkable without reading tensor data; returns nq."""
    for name, t in (("buf", buf), ("seq_len_tensor", seq_len_tensor), ("page_indices", page_indices)):
        checks.tensor(name, t)
    checks.dtype_in("buf", buf, (torch.uint8,))
    checks.dtype_in("seq_len_tensor", seq_len_tensor, _INDEX_DTYPES)
    checks.dtype_in("page_indices", page_indices, _INDEX_DTYPES)
    if _host_int("seq_len_sum", seq_len_sum) > checks.INT32_MAX - gather_kernels.THREADS:  # the gather's row limit
        raise ValueError(f"seq_len_sum: {seq_len_sum} rows exceed the supported {checks.INT32_MAX - gather_kernels.THREADS}")
    _host_int("max_seq_len", max_seq_len)
    if index_head_dim % quant_block_size:
        raise ValueError(f"index_head_dim: {index_head_dim} is not a multiple of quant_block_size={quant_block_size}")
    nq = index_head_dim // quant_block_size
    stride = index_head_dim + 4 * nq
    if buf.dim() != 2:
        raise ValueError(f"buf: expected the layer's 2-D uint8 index buffer [num_pages, page_size * "
                         f"(index_head_dim + 4 * nq)], got shape {tuple(buf.shape)}")
    if buf.size(1) != page_size * stride:
        raise ValueError(f"buf: expected {page_size} * {stride} = {page_size * stride} bytes per page "
                         f"(page_size={page_size}, index_head_dim={index_head_dim}), got shape {tuple(buf.shape)}")
    if seq_len_tensor.dim() != 1:
        raise ValueError(f"seq_len_tensor: expected [batch], got shape {tuple(seq_len_tensor.shape)}")
    if page_indices.dim() != 2 or page_indices.size(0) != seq_len_tensor.size(0):
        raise ValueError(f"page_indices: expected [batch, max_pages] with batch = {seq_len_tensor.size(0)} "
                         f"(seq_len_tensor's length), got shape {tuple(page_indices.shape)}")
    if page_indices.size(1) * page_size < max_seq_len:
        raise ValueError(f"max_seq_len: {max_seq_len} tokens do not fit in page_indices' {page_indices.size(1)} "
                         f"pages of {page_size}")
    checks.same_device({"buf": buf, "seq_len_tensor": seq_len_tensor, "page_indices": page_indices})
    return nq


def _check_values(seq_len_tensor: torch.Tensor, page_indices: torch.Tensor) -> None:
    """Values that int32 cannot hold (reads the tensors: a sync on CUDA)."""
    if page_indices.dtype == torch.int64 and page_indices.numel():
        lo, hi = int(page_indices.min()), int(page_indices.max())
        if lo < _INT32_MIN or hi > checks.INT32_MAX:
            raise ValueError(f"page_indices: page ids must fit int32, got values in [{lo}, {hi}]")
    if seq_len_tensor.numel():
        lo = int(seq_len_tensor.min())
        total = int(seq_len_tensor.sum(dtype=torch.int64))
        if lo < 0 or int(seq_len_tensor.max()) > checks.INT32_MAX or total > checks.INT32_MAX:
            raise ValueError(f"seq_len_tensor: lengths must be >= 0 and sum to at most {checks.INT32_MAX}, got min {lo}, "
                             f"max {int(seq_len_tensor.max())}, sum {total}")
