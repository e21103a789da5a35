"""SGLang's DSA/NSA indexer cache read and written through nvrtc_gather's kernels.

SGLang's pool (``DSATokenToKVPool``, formerly ``NSATokenToKVPool``) keeps each layer's indexer
keys in one uint8 buffer ``[num_pages, page_size * (index_head_dim + 4 * nq)]``: per page,
``page_size * index_head_dim`` fp8 bytes then ``page_size`` fp32 scales (``nq`` per token), the
paged layout of docs/contract.md §1 with ``block_size = page_size``. The pool reads it with
``GetKAndS.execute(pool, buf, page_indices=..., seq_len_tensor=..., seq_len_sum=...,
max_seq_len=...)`` (every request's keys packed by request: ``(k uint8 [seq_len_sum,
index_head_dim], scales uint8 [seq_len_sum, 4 * nq])``) and writes it with
``SetKAndS.execute(pool=..., buf=..., loc=..., index_k=..., index_k_scale=...)`` (already
quantized fp8 keys and fp32 scales, one token per ``loc`` entry).

The accessor module moved between releases (``ACCESSORS``, newest first; read in each release's
wheel). :func:`register` finds the newest one this SGLang has and replaces both ``execute``
methods there (older paths are re-export shims of the same classes): a uint8 buffer in the
paged layout goes to :func:`get_index_k_scale_buffer` (one gather launch, no host sync) and to
:func:`set_index_k_scale_buffer` (one scatter launch); everything else stays with SGLang's own
``execute`` and is said once in the log and in :func:`status`: a bf16 index cache, ROCm (its
fnuz fp8, and aiter's "preshuffle" page layout, with which nothing is hooked at all), a page
layout we do not recognise, SGLang's older single-request call. The pool methods themselves
are untouched, so their layer-id translation, layer-transfer waits and bf16 branch still run
as SGLang wrote them. The page size is read as each release reads it: ``pool.index_page_size``
where the pool has it (from 0.5.22: ``page_size // index_kpool``, divided again under decode
context parallelism in 0.5.23), else ``pool.page_size``."""
from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading

import torch

from .. import indexer_k_scatter
from ..ops import checks, dsv4_gather, fast_path, index_k_read
from ..ops import indexer_k_scatter as indexer_k_scatter_op
from . import sglang_activation, sglang_dsv4, sglang_log

log = logging.getLogger(__name__)

# Where SGLang keeps GetKAndS / SetKAndS, newest first: (module, the release that introduced it).
# Later releases keep the older paths as deprecated re-exports of the same classes.
ACCESSORS = (
    ("sglang.kernels.ops.kvcache.dsa_index_k_cache", "0.5.23"),
    ("sglang.kernels.ops.attention.dsa.index_buf_accessor", "0.5.16"),
    ("sglang.srt.layers.attention.dsa.index_buf_accessor", "0.5.13"),
    ("sglang.srt.layers.attention.nsa.index_buf_accessor", "0.5.10"),
)
MODULES = tuple(name for name, _ in ACCESSORS)
QUANT_BLOCK_SIZE = 128  # SGLang's indexer: one fp32 scale per 128 fp8 values
_INDEX_DTYPES = (torch.int32, torch.int64)
_K_DTYPES = (torch.float8_e4m3fn, torch.uint8)
_TAG = "_nvrtc_gather_original"
_CLASSES = ("GetKAndS", "SetKAndS")

_lock = threading.RLock()  # register() records what it leaves to SGLang while holding it
_state = {"module": None, "hooked": {}, "left": {}}  # what status() reports


def register(ops=None) -> tuple[str, ...]:
    """Route SGLang's ``GetKAndS.execute`` and ``SetKAndS.execute`` to nvrtc_gather for fp8
    (uint8) index buffers in the paged layout, in the newest accessor module this SGLang has;
    returns its name (an empty tuple when SGLang's own aiter "preshuffle" layout is in use:
    nothing is hooked then, and status() says so); and, where the release has DeepSeek-V4
    (0.5.13 on), its record gathers (integrations/sglang_dsv4.py). ``ops``: which to hook,
    short names of ``sglang_activation.OPS`` (``"get"``, ``"set"``, ``"dsv4_bf16"``,
    ``"dsv4_fp8"``), a comma-separated str or an iterable of str; default all. Idempotent; a later call may add ops. Announces once per process what
    it hooked, in SGLang's log (integrations/sglang_log.py).

    Raises ImportError naming the cause: SGLang not installed; SGLang installed but the
    accessor module failing to import (a missing dependency: the original error is chained);
    or no known accessor module in this release (the message names the release and every
    path tried). TypeError/ValueError naming ``ops`` for anything but those names."""
    wanted = _wanted_ops(ops)
    name, module = _find_accessor()
    with _lock:
        _state["module"] = name
        if getattr(module, "_use_aiter_preshuffle", False):
            _leave("GetKAndS.execute", "aiter preshuffle", f"{name} uses aiter's preshuffled page layout (ROCm)")
            _leave("SetKAndS.execute", "aiter preshuffle", f"{name} uses aiter's preshuffled page layout (ROCm)")
            return ()
        hooked = []
        for op in wanted:
            if op in sglang_dsv4.FUNCTIONS:  # a function, not an accessor method
                found = sglang_dsv4.install(op, _leave)
                if found is not None:
                    fname, where = found
                    if fname not in _state["hooked"]:
                        hooked.append(fname)
                    _state["hooked"][fname] = where
                continue
            cls_name, make = _HOOKS[op]
            cls = getattr(module, cls_name, None)
            if cls is None:
                _leave(f"{cls_name}.execute", "absent", f"{name} has no {cls_name}")
                continue
            if _TAG not in cls.__dict__:
                _patch(cls, make)
                hooked.append(f"{cls_name}.execute")
            _state["hooked"][f"{cls_name}.execute"] = name
        v4 = sglang_dsv4.present()
        kept = [m for op, m in sglang_activation.OPS.items()
                if not set(sglang_dsv4.NAMES.get(op, (m,))) & set(_state["hooked"])
                and (v4 or op not in sglang_dsv4.FUNCTIONS)]
    if hooked:  # grouped by the module each lives in: "A and B in m1, C and D in m2"
        where = {}
        for method in hooked:
            where.setdefault(_state["hooked"][method], []).append(method)
        sglang_log.announce(logging.INFO, "SGLang %s: %s now run nvrtc_gather's kernels%s "
                            "(status() says what stays with SGLang)", _release(),
                            ", ".join(f"{' and '.join(ms)} in {m}" for m, ms in where.items()),
                            f"; {', '.join(kept)} left to SGLang" if kept else "")
    return (name,)


def _wanted_ops(ops) -> tuple[str, ...]:
    """register()'s ``ops`` as short names in table order (None: all)."""
    if ops is None:
        return sglang_activation.ALL_OPS
    if not isinstance(ops, str):
        names = list(ops) if hasattr(ops, "__iter__") else None
        if names is None or not all(isinstance(o, str) for o in names):
            raise TypeError(f"ops: expected op names (a str, or an iterable of str: "
                            f"{', '.join(sglang_activation.OPS)}), got {ops!r}")
        ops = ",".join(names)
    return sglang_activation.parse_ops(ops, "ops")


def unregister() -> None:
    """Give SGLang its own ``execute`` methods back, wherever :func:`register` patched them."""
    for name in MODULES:
        module = sys.modules.get(name)
        for cls_name in _CLASSES:
            cls = getattr(module, cls_name, None)
            original = cls.__dict__.get(_TAG) if isinstance(cls, type) else None
            if original is not None:
                cls.execute = original
                delattr(cls, _TAG)
    sglang_dsv4.uninstall()
    with _lock:
        _state.update(module=None, hooked={}, left={})


def status() -> dict:
    """What :func:`register` hooked where, and what was left to SGLang and why:
    ``{"sglang": release, "module": accessor module or None, "hooked": {method: module},
    "left_to_sglang": {method: {reason: first case seen}}}``. Reasons appear as calls meet them
    (each is also logged once)."""
    with _lock:
        return {"sglang": _release(), "module": _state["module"], "hooked": dict(_state["hooked"]),
                "left_to_sglang": {m: dict(r) for m, r in _state["left"].items()}}


# -- finding and patching the accessor ---------------------------------------------------------

def _release() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _find_accessor():
    """(name, module) of the newest accessor module this SGLang has, or ImportError. Which
    modules the release has is read from its files, without importing anything, so that an
    import that fails (a missing dependency, anywhere in SGLang's import chain) is reported as
    itself rather than as a module that is not there."""
    try:
        top = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        top = None
    if top is None or not top.submodule_search_locations:
        raise ImportError("nvrtc_gather.integrations.sglang.register(): SGLang is not installed here (no package "
                          f"sglang; looked for {', '.join(MODULES)})")
    tried = []
    for name, introduced in ACCESSORS:
        if not _has_module(top.submodule_search_locations, name):
            tried.append(f"{name} (since {introduced})")
            continue
        try:
            return name, importlib.import_module(name)
        except Exception as e:  # noqa: BLE001  any import-time failure: say which, keep the cause
            cause = str(e) if isinstance(e, ImportError) else f"{type(e).__name__}: {e}"
            raise ImportError(f"nvrtc_gather.integrations.sglang.register(): SGLang {_release() or '(no version)'} "
                              f"has {name}, but importing it failed: {cause}") from e
    raise ImportError(f"nvrtc_gather.integrations.sglang.register(): SGLang {_release() or '(no version)'} has none "
                      f"of the index-K accessor modules nvrtc_gather knows: tried {', '.join(tried)}. Its layout may "
                      "have moved again: nothing was hooked")


def _has_module(roots, name: str) -> bool:
    """Whether ``name`` (``sglang.a.b``) is a file or package under the package's ``roots``."""
    parts = name.split(".")[1:]
    return any(os.path.isfile(os.path.join(root, *parts) + ".py") or
               os.path.isfile(os.path.join(root, *parts, "__init__.py")) for root in roots)


def _patch(cls, make) -> None:
    if _TAG in cls.__dict__:
        return
    original = cls.__dict__["execute"]  # a classmethod
    setattr(cls, _TAG, original)
    cls.execute = classmethod(make(original.__get__(None, cls)))


def _leave(method: str, reason: str, detail: str) -> None:
    """Record (and log, the first time) a case left to SGLang's own ``method``. Under the lock:
    the hooks run on SGLang's threads while status() copies the record."""
    with _lock:
        reasons = _state["left"].setdefault(method, {})
        first = reason not in reasons
        if first:
            reasons[reason] = detail
    if first:
        log.info("nvrtc_gather: SGLang's %s keeps its own path for %s (%s)", method, reason, detail)


def _pool_sizes(pool) -> tuple:
    """(page_size, index_head_dim, quant_block_size) of an SGLang pool, as the read and write take
    them; AttributeError for an object without them."""
    page_size = pool.index_page_size if hasattr(pool, "index_page_size") else pool.page_size
    return page_size, pool.index_head_dim, getattr(pool, "quant_block_size", QUANT_BLOCK_SIZE)


_ROCM = torch.version.hip is not None


def _unserved(buf, pool, k=None, k_scale=None) -> tuple[str, str] | None:
    """(reason, detail) when nvrtc_gather does not serve this buffer; None when it does."""
    if _ROCM:
        return "ROCm", f"torch {torch.__version__} is a ROCm build"
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8:
        return "index cache dtype", f"a {getattr(buf, 'dtype', type(buf).__name__)} index buffer (not fp8 as uint8)"
    if buf.device.type not in ("cuda", "cpu"):
        return "device", f"tensors on {buf.device.type}"
    try:
        page_size, head_dim, block = _pool_sizes(pool)
        nq = head_dim // block
    except (AttributeError, TypeError, ZeroDivisionError) as e:
        return "pool", f"a pool without the sizes the layout needs ({e})"
    if buf.dim() != 2 or buf.size(1) != page_size * (head_dim + 4 * nq):
        return "page layout", (f"a buffer of shape {tuple(buf.shape)}, not [pages, page_size {page_size} * "
                               f"(index_head_dim {head_dim} + 4 * {nq})]")
    if k is not None and getattr(k, "dtype", None) not in _K_DTYPES:
        return "index_k dtype", f"index_k of dtype {getattr(k, 'dtype', type(k).__name__)}"
    if k_scale is not None and getattr(k_scale, "dtype", None) != torch.float32:
        return "index_k_scale dtype", f"index_k_scale of dtype {getattr(k_scale, 'dtype', type(k_scale).__name__)}"
    return None


def _get_args(pool, buf, page_indices, seq_len_tensor, seq_len_sum, max_seq_len):
    """GetKAndS's arguments (its ``triton``/``aiter`` methods, in every release), bound by
    Python itself: a TypeError means another call."""
    return pool, buf, page_indices, seq_len_tensor, seq_len_sum, max_seq_len


def _set_args(pool, buf, loc, index_k, index_k_scale):
    """SetKAndS's arguments (its ``triton`` method, in every release)."""
    return pool, buf, loc, index_k, index_k_scale


_ABSENT = object()  # a keyword the call did not pass


def _passed(kwargs: dict, names: tuple, values: tuple) -> dict:
    """``kwargs`` with those of a hook's keyword-only parameters the call passed: the call's
    keywords as it passed them, for SGLang's own function or the argument binding."""
    kwargs.update((name, value) for name, value in zip(names, values) if value is not _ABSENT)
    return kwargs


_GET_KEYWORDS = ("page_indices", "seq_len_tensor", "seq_len_sum", "max_seq_len")


def _get_hook(sglang_execute):
    # SGLang's four keywords are the hook's own keyword-only parameters: its call binds them
    # without building a dict, and any other call is forwarded with the arguments it came with.
    @functools.wraps(sglang_execute)
    def execute(klass, *args, page_indices=_ABSENT, seq_len_tensor=_ABSENT, seq_len_sum=_ABSENT,
                max_seq_len=_ABSENT, **kwargs):
        if len(args) == 2 and not kwargs and not _ROCM:
            # SGLang's own call, execute(pool, buf, page_indices=, seq_len_tensor=, seq_len_sum=,
            # max_seq_len=), on a layout the read remembers: the read's fast path, nothing else
            # (an absent keyword is no tensor or int: read_remembered returns None).
            pool, buf = args
            try:
                page_size, head_dim, block = pool.index_page_size, pool.index_head_dim, pool.quant_block_size
            except AttributeError:  # another pool: the general path below
                pass
            else:
                out = index_k_read.read_remembered(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len,
                                                   page_size, head_dim, block)
                if out is not None:
                    return out
        kwargs = _passed(kwargs, _GET_KEYWORDS, (page_indices, seq_len_tensor, seq_len_sum, max_seq_len))
        try:
            pool, buf, page_indices, seq_len_tensor, seq_len_sum, max_seq_len = _get_args(*args, **kwargs)
        except TypeError:  # another call (SGLang's older single-request one): its own path
            _leave("GetKAndS.execute", "call", "a call with other arguments")
            return sglang_execute(*args, **kwargs)
        try:
            sizes = _pool_sizes(pool)
        except AttributeError:  # a pool without the sizes: _unserved names it
            sizes = None
        if sizes and not _ROCM:  # a layout the read remembers passed every check _unserved makes: skip them
            out = index_k_read.read_remembered(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, *sizes)
            if out is not None:
                return out
        why = _unserved(buf, pool)
        if why is not None:
            _leave("GetKAndS.execute", *why)
            return sglang_execute(*args, **kwargs)
        # get_index_k_scale_buffer's full path: the remembered read was tried above (a pool without
        # the sizes is one _unserved refuses).
        return index_k_read.read_index_k(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, *sizes)
    return execute


_SET_KEYWORDS = ("pool", "buf", "loc", "index_k", "index_k_scale")


def _set_hook(sglang_execute):
    # As _get_hook: SGLang's five keywords are the hook's own keyword-only parameters.
    @functools.wraps(sglang_execute)
    def execute(klass, *args, pool=_ABSENT, buf=_ABSENT, loc=_ABSENT, index_k=_ABSENT, index_k_scale=_ABSENT,
                **kwargs):
        if not args and not kwargs and not _ROCM:
            # SGLang's own call, execute(pool=, buf=, loc=, index_k=, index_k_scale=), on a layout
            # the write remembers (its full checks include every one _unserved makes): one launch
            try:
                page_size, head_dim, block = pool.index_page_size, pool.index_head_dim, pool.quant_block_size
            except AttributeError:  # another pool: the general path below
                pass
            else:
                if _set_remembered(buf, loc, index_k, index_k_scale, page_size, head_dim, block):
                    return None
        kwargs = _passed(kwargs, _SET_KEYWORDS, (pool, buf, loc, index_k, index_k_scale))
        try:
            pool, buf, loc, index_k, index_k_scale = _set_args(*args, **kwargs)
        except TypeError:
            _leave("SetKAndS.execute", "call", "a call with other arguments")
            return sglang_execute(*args, **kwargs)
        why = _unserved(buf, pool, index_k, index_k_scale)
        if why is not None:
            _leave("SetKAndS.execute", *why)
            return sglang_execute(*args, **kwargs)
        page_size, head_dim, block = _pool_sizes(pool)
        set_index_k_scale_buffer(buf, loc, index_k, index_k_scale, page_size=page_size, index_head_dim=head_dim,
                                 quant_block_size=block)
    return execute


# sglang_activation.OPS short name -> (the accessor class, the hook of its execute): one row per op.
_HOOKS = {"get": ("GetKAndS", _get_hook), "set": ("SetKAndS", _set_hook),
          **{op: (None, None) for op in sglang_dsv4.FUNCTIONS}}  # functions: sglang_dsv4.install


# -- the accessor ------------------------------------------------------------------------------

def get_index_k_scale_buffer(buf: torch.Tensor, seq_len_tensor: torch.Tensor, page_indices: torch.Tensor,
                             seq_len_sum: int, max_seq_len: int, *, page_size: int = 64,
                             index_head_dim: int = 128,
                             quant_block_size: int = QUANT_BLOCK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_fp8 uint8 ``[seq_len_sum, index_head_dim]``, k_scale uint8 ``[seq_len_sum, 4 * nq]``) for
    the requests of ``seq_len_tensor`` (lengths, ``[batch]``, int32/int64, any stride) whose pages
    are the rows of ``page_indices`` (``[batch, max_pages]``, int32/int64, any strides), packed by
    request, as SGLang's ``GetKAndS`` returns them. ``seq_len_sum`` (a host int, the sum of the
    lengths) sizes the outputs; ``max_seq_len`` must fit in ``page_indices``' pages.

    CUDA tensors: the two outputs allocated with ``torch.empty`` and one kernel launch, which sums
    the lengths itself (no host sync, no other GPU work) and writes every row. Rows past the
    lengths' sum (``seq_len_sum`` larger) are zero. A ``seq_len_sum`` below the sum: the rows
    past it are not written anywhere (SGLang's Triton kernel writes past its outputs there).
    Index values are untrusted: a length that is negative or past int32 counts as 0, and a row
    whose page id is outside the buffer (or outside int32) or whose page column is past
    ``page_indices``' columns is zero; nothing is read outside the tensors.
    NVRTC_GATHER_DEBUG=1 raises ValueError for any of those (one sync per call). CPU tensors:
    ValueError naming the argument for the same values, the same bytes otherwise.

    Arguments are checked before anything is written (TypeError/ValueError naming the argument)."""
    out = index_k_read.read_remembered(buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, page_size,
                                       index_head_dim, quant_block_size)
    return out if out is not None else index_k_read.read_index_k(
        buf, seq_len_tensor, page_indices, seq_len_sum, max_seq_len, page_size, index_head_dim, quant_block_size)


_set_layouts = fast_path.LayoutMemo()  # the set entry's remembered layouts (the scatter's), by the call's metadata
_SCATTER_NAMES = {"k": "index_k", "k_scale": "index_k_scale", "kv_cache": "buf", "slot_mapping": "loc"}


def set_index_k_scale_buffer(buf: torch.Tensor, loc: torch.Tensor, index_k: torch.Tensor,
                             index_k_scale: torch.Tensor, *, page_size: int = 64, index_head_dim: int = 128,
                             quant_block_size: int = QUANT_BLOCK_SIZE) -> None:
    """Write token ``i``'s fp8 keys ``index_k[i]`` (float8_e4m3fn or uint8 ``[T, index_head_dim]``)
    and fp32 scales ``index_k_scale[i]`` (float32 ``[T]`` or ``[T, nq]``) into slot ``loc[i]``
    (int32 or int64 ``[T]``: page ``loc // page_size``, row ``loc % page_size``) of the layer's
    buffer, as SGLang's ``SetKAndS`` does (same bytes); one launch on CUDA tensors. ``loc < 0``
    is skipped; a slot past the buffer raises ValueError on CPU tensors and is skipped on CUDA
    ones (NVRTC_GATHER_DEBUG=1: ValueError); SGLang's Triton kernel writes outside the buffer for
    both. Arguments are checked against the buffer's layout before anything is written
    (TypeError/ValueError naming the argument)."""
    try:
        _set(buf, loc, index_k, index_k_scale, page_size, index_head_dim, quant_block_size)
    except ValueError as e:  # the scatter's value errors (a slot past the buffer): in the caller's names
        raise ValueError(checks.renamed(str(e), _SCATTER_NAMES)) from None


def _set_remembered(buf, loc, index_k, index_k_scale, page_size, index_head_dim, quant_block_size) -> bool:
    """The write launched where a call with this metadata was checked in full before (its layout
    remembered; only the pointers are checked here): True; else False, and the caller runs the
    full checks, which accept exactly what this accepts."""
    if type(page_size) is not int or type(index_head_dim) is not int or type(quant_block_size) is not int:
        return False  # 64.0 == 64 would find the int's layout: the checks refuse it by name
    check, last_sizes, layout = _set_layouts.last
    try:
        if not check(buf, loc, index_k, index_k_scale) or last_sizes != (page_size, index_head_dim, quant_block_size):
            layout = _set_layouts.find(_set_key(buf, loc, index_k, index_k_scale,
                                                (page_size, index_head_dim, quant_block_size)))
    except (AttributeError, TypeError, RuntimeError):  # not tensors, unhashable sizes, no strides: named later
        return False
    return layout is not None and indexer_k_scatter_op.run_remembered(
        layout, index_k.data_ptr(), index_k_scale.data_ptr(), loc.data_ptr(), buf.data_ptr())


def _set(buf, loc, index_k, index_k_scale, page_size, index_head_dim, quant_block_size) -> None:
    if _set_remembered(buf, loc, index_k, index_k_scale, page_size, index_head_dim, quant_block_size):
        return
    sizes = page_size, index_head_dim, quant_block_size
    nq = index_k_read.layout_words(buf, page_size, index_head_dim, quant_block_size)
    _check_rows(loc, index_k, index_k_scale, index_head_dim, nq)
    checks.same_device({"buf": buf, "loc": loc, "index_k": index_k, "index_k_scale": index_k_scale})  # SetKAndS's order
    kv_cache = buf.view(buf.size(0), page_size, index_head_dim + 4 * nq)
    try:
        plan = indexer_k_scatter_op.plan_scatter(index_k, index_k_scale, kv_cache, loc)
    except TypeError as e:  # what is left in the caller's names (ValueErrors: set_index_k_scale_buffer)
        raise TypeError(checks.renamed(str(e), _SCATTER_NAMES)) from None
    if plan.device < 0:
        indexer_k_scatter(index_k, index_k_scale, kv_cache, loc)
        return
    layout = indexer_k_scatter_op.launch_planned(plan)
    if layout is not None:
        _set_layouts.remember(_set_key(buf, loc, index_k, index_k_scale, sizes), layout,
                              (buf, loc, index_k, index_k_scale), sizes)


def _set_key(buf, loc, index_k, index_k_scale, sizes) -> tuple:
    """A set call's metadata: what its layout (and so every check but the pointers') depends on."""
    return (fast_path.layout_key4(buf, loc, index_k, index_k_scale), sizes,
            index_k_scale.is_neg())  # a negative view of the scales: the checks


def _check_rows(loc, index_k, index_k_scale, index_head_dim: int, nq: int) -> None:
    """The rows to write against the buffer's layout, in SetKAndS's names."""
    for name, t in (("loc", loc), ("index_k", index_k), ("index_k_scale", index_k_scale)):
        checks.tensor(name, t)
    checks.dtype_in("loc", loc, _INDEX_DTYPES)
    checks.dtype_in("index_k", index_k, _K_DTYPES)
    checks.dtype_in("index_k_scale", index_k_scale, (torch.float32,))
    checks.rank("loc", loc, 1, "[num_tokens]")
    checks.rank("index_k", index_k, 2, f"[num_tokens, index_head_dim={index_head_dim}]")
    if index_k.size(1) != index_head_dim:  # a narrower row would put the scales among another token's values
        raise ValueError(f"index_k: expected rows of index_head_dim = {index_head_dim} fp8 values (the buffer's "
                         f"layout), got shape {tuple(index_k.shape)}")
    scale_shape = f"[num_tokens, {nq}]" + (" or [num_tokens]" if nq == 1 else "")
    if not (index_k_scale.dim() == 2 and index_k_scale.size(1) == nq or index_k_scale.dim() == 1 and nq == 1):
        raise ValueError(f"index_k_scale: expected float32 {scale_shape} (index_head_dim / quant_block_size "
                         f"scales per token), got shape {tuple(index_k_scale.shape)}")
    n = loc.size(0)
    for name, t in (("index_k", index_k), ("index_k_scale", index_k_scale)):
        if t.size(0) < n:
            raise ValueError(f"{name}: {t.size(0)} rows, fewer than loc's {n} entries (one row per slot)")


# -- DeepSeek-V4's record gathers (SGLang 0.5.23's sglang.kernels.ops.attention.dsv4.dequant_k_cache) --------

def dequantize_k_cache_paged_dsv4(quant_k_cache: torch.Tensor, page_table_1_flattened: torch.Tensor,
                                  page_size: int, out: torch.Tensor | None = None, layout="v4") -> torch.Tensor:
    """SGLang's bf16 gather of the V4 record (584 bytes a token): row k of ``out`` (bf16 ``[n, 1,
    512]``, allocated with ``torch.empty`` when None, any row stride) is token
    ``page_table_1_flattened[k]`` (int32/int64 flat ids, page * page_size + slot) of the pool's
    buffer ``quant_k_cache`` (uint8 ``[num_pages, page bytes]``, any page stride), NoPE values
    times their UE8M0 scale rounded to bf16, RoPE copied. ``layout`` (SGLang's ``KVLayout`` or its
    name): ``v4``, or a V4.1 layout (``v41``, ``v41_new``: MXFP8; ``v41_fp4``, ``v41_fp4_new``),
    every value dequantized as SGLang's ``dequantize_k_cache_paged_v41`` does. One launch on CUDA
    tensors; a token id outside the buffer gives a zero row (NVRTC_GATHER_DEBUG=1 raises; CPU
    tensors: ValueError). Returns ``out``."""
    return dsv4_gather.gather_flat(quant_k_cache, page_table_1_flattened, page_size, out, 0, False, layout)


def gather_dequant_requant_fp8_paged_dsv4(quant_k_cache: torch.Tensor, page_table_1_flattened: torch.Tensor,
                                          page_size: int, extra_rows: int = 0,
                                          out: torch.Tensor | None = None) -> torch.Tensor:
    """SGLang's Q8KV8 gather (sparse prefill): as :func:`dequantize_k_cache_paged_dsv4`, but each
    NoPE product and RoPE value cast to fp8 e4m3 (round to nearest even, saturating at +-448,
    NaN 0x7f), into ``out`` fp8 ``[n + extra_rows, 1, 512]`` whose last ``extra_rows`` rows are
    zero (the backend's landing rows); one launch, zero rows included. Returns ``out``."""
    return dsv4_gather.gather_flat(quant_k_cache, page_table_1_flattened, page_size, out, extra_rows, True)
