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


class LayoutMemo(dict):
    """Layouts by key; ``get`` is dict's own (the hot path). Bounded: cleared when full, so a
    process that sees ever new shapes does not grow without limit."""

    def __init__(self, max_size: int = 256):
        super().__init__()
        self.max_size = max_size

    def remember(self, key, layout) -> None:
        if len(self) >= self.max_size:
            self.clear()
        self[key] = layout


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
