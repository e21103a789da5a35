"""What the ops' fake (meta) implementations check at trace time: that no output shares memory
with an input the op reads.

The eager checks compare data pointers. Under ``torch.compile`` with a functionalizing backend
(``aot_eager``) the compiled graph hands the op copies of its outputs and copies them back
afterwards, so an output that is a view of ``kv_cache`` passes the eager check and the copy-back
overwrites the cache. The fake tensors dynamo traces with keep their views' storage, offsets
and strides, so the same overlap is found there, once per trace, before anything runs."""
from __future__ import annotations

import torch

from . import checks


def int_arg(name: str, value):
    """checks.int_arg, but a traced SymInt is returned as it is (reading it as an int would
    specialize the graph on its value)."""
    return value if isinstance(value, torch.SymInt) else checks.int_arg(name, value)


def _span(t: torch.Tensor, rows=None) -> tuple[int, int]:
    """Bytes [start, end) of ``t``'s address span inside its storage (a strided view counts
    with its gaps, as the eager check does); ``rows``: only its first rows (no view is made:
    slicing a fake CUDA tensor fails on a CPU-only torch)."""
    size = t.element_size()
    start = t.storage_offset() * size
    shape = list(t.shape)
    if rows is not None and shape:
        shape[0] = min(shape[0], rows)
    if any(n == 0 for n in shape):
        return start, start
    last = sum((n - 1) * s for n, s in zip(shape, t.stride()))
    return start, start + (last + 1) * size


def disjoint(written: dict[str, torch.Tensor], read: dict[str, torch.Tensor], rows: dict[str, int] | None = None) -> None:
    """Raise ValueError naming both arguments (checks.disjoint's message) when a written tensor
    and a read one share a storage and their spans in it overlap (``rows``: of the tensors named
    there, only the first rows count). Offsets in the message are bytes from the start of the
    shared storage."""
    for w, wt in written.items():
        w_storage = wt.untyped_storage()
        for r, rt in read.items():
            if rt.untyped_storage()._cdata == w_storage._cdata:
                checks.disjoint({w: _span(wt, (rows or {}).get(w))}, {r: _span(rt, (rows or {}).get(r))})


def check(writes: tuple, reads: tuple, args: dict, rows: dict[str, int] | None = None) -> None:
    """``disjoint`` for an op's one list of what it writes and reads (the names its full checks
    use too, so the two cannot drift): ``args`` maps each name to the traced tensor, or None
    for one this call does not read (an optional argument, a scale the format ignores)."""
    disjoint({n: args[n] for n in writes if args[n] is not None},
             {n: args[n] for n in reads if args[n] is not None}, rows)
