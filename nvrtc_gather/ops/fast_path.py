"""The layout fast path both ops share.

An op's checks depend on its tensors' metadata (device, dtype, shape, strides), its other
arguments, and its tensors' data pointers; an engine calls the op layer after layer with the
same metadata and new pointers. So each op remembers, under the metadata (``layout_key``), a
*layout*: a named record of what the pointer-dependent checks and the launch need (byte
extents, the alignment bits that stay fixed, one ready launch per vector width with the
parameter struct's fixed fields bound by name, and its launcher once the module is loaded). A
later call with that metadata redoes only the pointer checks (alignment, outputs overlapping
inputs) and launches: one call into the launcher (``bind``); anything they would
reject falls through to the op's full checks, which raise. A layout is recorded only after
the full checks accepted a call, so both paths accept exactly the same calls."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..jit import runtime


class Launch(NamedTuple):
    """One ready launch of a layout: the module, its entry point, the grid, and the struct image
    with every struct field but the data pointers and the error buffer bound."""

    module: object   # jit.spec.KernelModule
    entry: str
    grid: int
    image: object    # ParamStruct.image(...)


class LaunchConfig(NamedTuple):
    """One launch of an op's validated GPU plan (each op's ``launch_config(plan)``); the tests
    and the emulator launch it by hand."""

    entry: str
    grid: int
    fields: dict   # the op's struct_fields(plan): every struct field but the error buffer, by name


def _metadata_check_factory():
    """``make(tensors)``: a C-level check that later tensors have ``tensors``' metadata, where
    this torch's TensorGuards (what torch.compile's guards are built on) behaves as relied on:
    the returned ``check(*tensors)`` is True only for tensors of the same Python type, dispatch
    keys (device type, negative/conjugate views), dtype, device index, requires_grad, sizes and
    strides. Probed once; None where anything differs (the memo's dict alone serves then).
    TensorGuards aborts the process on a nested tensor (a C++ exception it does not catch, torch
    2.13): the check refuses those first, in Python."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None

    def make(tensors):
        guard = TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                             dynamic_dims_strides=[list(t.stride()) for t in tensors]).check
        if len(tensors) == 3:
            return lambda a, b, c: not (a.is_nested or b.is_nested or c.is_nested) and guard(a, b, c)
        if len(tensors) == 4:
            return lambda a, b, c, d: not (a.is_nested or b.is_nested or c.is_nested or d.is_nested) and \
                guard(a, b, c, d)
        if len(tensors) == 5:
            return lambda a, b, c, d, e: not (a.is_nested or b.is_nested or c.is_nested or d.is_nested or
                                              e.is_nested) and guard(a, b, c, d, e)
        return lambda *ts: not any(t.is_nested for t in ts) and guard(*ts)

    try:
        base = torch.zeros(2, 3)
        check = make((base,))
        others = (torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, 2).t(),
                  torch.zeros(2, 3, device="meta"), torch.zeros(2, 3)._neg_view(), torch.nn.Parameter(base),
                  torch.zeros(2, 3, requires_grad=True), torch.zeros(2, 3, 1))
        works = check(torch.ones(2, 3)) is True and not any(check(t) for t in others)
    except Exception:  # noqa: BLE001  another signature or behaviour: not relied on
        return None
    return make if works else None


_make_check = _metadata_check_factory()
_NEVER = (lambda *tensors: False, None, None)


class LayoutMemo(dict):
    """Layouts by key, bounded: cleared when full, so a process that sees ever new shapes does
    not grow without limit. ``last`` is ``(check, others, layout)`` of the layout found last:
    ``check(*tensors)`` (torch's C-level metadata check, built once per layout) and ``others ==``
    the call's other key parts stand for building the key and looking it up (0.3 against 0.9 µs
    for three tensors on the CI machine). An op reads ``last`` first and on a miss ``find``s
    the key; its fast path accepts the same calls either way. ``check`` raises AttributeError
    for a non-tensor (as building the key does)."""

    def __init__(self, max_size: int = 256):
        super().__init__()
        self.max_size = max_size
        self.last = _NEVER
        self._checks = {}

    def remember(self, key, layout, tensors: tuple = (), others=None) -> None:
        """``layout`` under ``key``, the key of a call with ``tensors`` (their metadata is in
        ``key``) and non-tensor key parts ``others``."""
        if len(self) >= self.max_size:
            self.clear()
            self._checks.clear()
        self[key] = layout
        if tensors and _make_check is not None:
            self.last = self._checks[key] = _make_check(tensors), others, layout

    def find(self, key):
        """The layout under ``key`` (None: none), its entry now ``last`` where it has one."""
        entry = self._checks.get(key)
        if entry is None:
            return self.get(key)
        self.last = entry
        return entry[2]


def layout_key3(a, b, c) -> tuple:
    """The metadata of three tensors (raises AttributeError for a non-tensor)."""
    return (a.device, a.dtype, a.shape, a.stride(), b.device, b.dtype, b.shape, b.stride(),
            c.device, c.dtype, c.shape, c.stride())


def layout_key4(a, b, c, d) -> tuple:
    """The metadata of four tensors (raises AttributeError for a non-tensor)."""
    return (a.device, a.dtype, a.shape, a.stride(), b.device, b.dtype, b.shape, b.stride(),
            c.device, c.dtype, c.shape, c.stride(), d.device, d.dtype, d.shape, d.stride())


def layout_key5(a, b, c, d, e) -> tuple:
    """The metadata of five tensors (raises AttributeError for a non-tensor)."""
    return (a.device, a.dtype, a.shape, a.stride(), b.device, b.dtype, b.shape, b.stride(),
            c.device, c.dtype, c.shape, c.stride(), d.device, d.dtype, d.shape, d.stride(),
            e.device, e.dtype, e.shape, e.stride())


def overlapping(written: int, read: tuple, extents: tuple) -> bool:
    """Whether the one written range, ``extents[0]`` bytes from ``written``, overlaps a read
    one, ``extents[i + 1]`` bytes from ``read[i]`` (0: not read). Every op call runs it: a
    counter instead of zip over a slice (0.37 against 0.78 µs for two read ranges on the CI
    machine)."""
    end = written + extents[0]
    i = 0
    for ptr in read:
        i += 1
        n = extents[i]
        if n and ptr < end and written < ptr + n:
            return True
    return False


def widths_by_alignment(width_of) -> tuple:
    """``width_of(bits)`` for each value of a data pointer's low 4 bits, so a call picks its
    vector width with one index (``widths[pointer & 15]``) instead of a function call. Exact
    because no vector is wider than 16 bytes: the choice depends on those bits only."""
    return tuple(width_of(bits) for bits in range(16))


def bind(layout, vec: int):
    """The launcher of ``layout``'s ready launch for vector width ``vec``, made on its first use
    and kept in ``layout.launchers`` (the op's hot path reads that dict first): ``go(pointers)``
    (runtime.LoadedModule.launcher) launches on torch's current stream of ``layout.device``,
    the ready launch's struct image with the call's data pointers, in struct order. The module
    is loaded already or now. A layout is any record with ``device``, ``launches`` (vector
    width -> Launch) and ``launchers`` (a dict, empty at first)."""
    ready = layout.launches[vec]
    handle = runtime.load(ready.module, layout.device, runtime.current_stream(layout.device))
    go = layout.launchers[vec] = handle.launcher(ready.entry, ready.grid, ready.image)
    return go
