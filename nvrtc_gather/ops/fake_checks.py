"""What the ops' fake (meta) implementations check at trace time: that no output shares memory
with an input the op reads.

The eager checks compare data pointers. Under ``torch.compile`` with a functionalizing backend
(``aot_eager``) the compiled graph hands the op copies of its outputs and copies them back
afterwards, so an output that is a view of ``kv_cache`` passes the eager check and the copy-back
overwrites the cache. The fake tensors dynamo traces with keep their views' storage, offsets
and strides, so the same overlap is found there, once per trace, before anything runs.

Two torch storages over the same memory (``torch.from_numpy`` of one array twice, two
``from_dlpack`` of one buffer) look disjoint to a fake tensor. So the plain functions also put
the op's guard in the graph (library.traced): at run time it runs these same checks on the real
tensors' addresses (:func:`on_addresses`), before the op is handed its copies."""
from __future__ import annotations

import contextvars

import torch

from . import checks

_ADDRESSES = contextvars.ContextVar("nvrtc_gather_fake_checks_addresses", default=False)


def on_addresses(fake, *args) -> None:
    """Run the op's fake checks on real tensors, comparing addresses instead of storages."""
    token = _ADDRESSES.set(True)
    try:
        fake(*args)
    finally:
        _ADDRESSES.reset(token)


def shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the spans of ``a`` and ``b`` are comparable: one storage (trace time), or one
    device's address space (run time)."""
    if _ADDRESSES.get():
        return a.device == b.device
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def start(t: torch.Tensor) -> int:
    """Byte offset of ``t``'s first element in its storage (trace time), or its address (run time)."""
    return t.data_ptr() if _ADDRESSES.get() else t.storage_offset() * t.element_size()


def int_arg(name: str, value):
    """checks.int_arg, but a traced SymInt is returned as it is (reading it as an int would
    specialize the graph on its value)."""
    return value if isinstance(value, torch.SymInt) else checks.int_arg(name, value)


def _span(t: torch.Tensor, rows=None) -> tuple[int, int]:
    """Bytes [start, end) of ``t``'s address span inside its storage (a strided view counts
    with its gaps, as the eager check does); ``rows``: only its first rows (no view is made:
    slicing a fake CUDA tensor fails on a CPU-only torch)."""
    size = t.element_size()
    first = start(t)
    shape = list(t.shape)
    if rows is not None and shape:
        shape[0] = min(shape[0], rows)
    if any(n == 0 for n in shape):
        return first, first
    last = sum((n - 1) * s for n, s in zip(shape, t.stride()))
    return first, first + (last + 1) * size


def disjoint(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor], rows: dict[str, int] | None = None) -> None:
    """Raise ValueError naming both arguments (checks.disjoint's message) when a written tensor
    and a read one share a storage (run time: a device) and their spans in it overlap (``rows``:
    of the tensors named there, only the first rows count). Offsets in the message are bytes
    from the start of the shared storage (run time: addresses, as the eager check prints)."""
    for w, wt in written.items():
        for r, rt in read.items():
            if shares(wt, rt):
                checks.disjoint({w: _span(wt, (rows or {}).get(w))}, {r: _span(rt, (rows or {}).get(r))})


def check(writes: tuple, reads: tuple, args: dict, rows: dict[str, int] | None = None) -> None:
    """``disjoint`` for an op's one list of what it writes and reads (the names its full checks
    use too, so the two cannot drift): ``args`` maps each name to the traced tensor, or None
    for one this call does not read (an optional argument, a scale the format ignores)."""
    disjoint({n: args[n] for n in writes if args[n] is not None},
             {n: args[n] for n in reads if args[n] is not None}, rows)
