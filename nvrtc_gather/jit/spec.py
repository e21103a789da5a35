"""What the JIT knows of a kernel: a module (one CUDA C source compiled into one image with
its entry points), the parameter struct every entry point takes, and the registry of the
modules the package ships (which warmup and preload read). Nothing here knows about an op:
each kernel family declares its spec in nvrtc_gather/kernels/ and registers it here.

Entry points are generated: a source defines its kernel bodies as templates, and the spec
names each entry point with the body it runs (``Entry("gather_indexer_k_v16",
"gather_body<16, 4>")``); sources.module_source appends one ``extern "C"`` wrapper per entry,
so a module holds exactly its entries and no ``#if`` ladder chooses them."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

_FORMATS = {"ptr": "Q", "i64": "q", "i32": "i"}


@dataclass(frozen=True)
class ParamStruct:
    """A kernel's single by-value parameter struct, as declared in its ``.cuh`` (checked
    field by field by tests/jit/test_spec.py). The last field is always ``error``, the
    debug-mode error buffer, which the runtime fills in at launch."""

    name: str
    fields: tuple[tuple[str, str], ...]  # (name, "ptr" | "i64" | "i32"), in declaration order
    layout: struct.Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        assert self.fields[-1] == ("error", "ptr"), "the debug error pointer must be the last field"
        # The host packs the fields back to back; the compiler aligns each to its size. Any
        # field the compiler would pad before is a struct the kernel reads differently.
        offset = 0
        for name, kind in self.fields:
            size = struct.calcsize("<" + _FORMATS[kind])
            if offset % size:
                raise ValueError(f"{self.name}.{name}: a {size}-byte field at byte {offset} would be padded by the "
                                 "compiler; reorder the fields (8-byte ones first) or widen one")
            offset += size
        fmt = "<" + "".join(_FORMATS[t] for _, t in self.fields)
        object.__setattr__(self, "layout", struct.Struct(fmt))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    @property
    def pointer_names(self) -> tuple[str, ...]:
        """The leading pointer fields (the data pointers a call gives; not the error buffer)."""
        out = []
        for name, kind in self.fields[:-1]:
            if kind != "ptr":
                break
            out.append(name)
        return tuple(out)

    def pack(self, **values) -> bytes:
        """The struct's bytes from every field by name (tests, the emulator)."""
        self._check(values, self.names)
        return self.layout.pack(*(values[n] for n in self.names))

    def image(self, **fixed) -> "StructImage":
        """The struct packed with the ``fixed`` fields (every field but its leading data
        pointers and the error buffer, which stays 0): what a launcher copies into its
        parameter buffer once, so that a call packs only its pointers (StructImage)."""
        free = tuple(n for n in self.names if n not in fixed)
        self._check({**fixed, **dict.fromkeys(free)}, self.names)
        pointers = free[:-1]
        if free[-1:] != ("error",) or self.names[:len(pointers)] != pointers or \
                any(kind not in ("ptr", "i64") for _, kind in self.fields[:len(pointers)]):
            raise TypeError(f"{self.name}: the fields left free must be the leading pointers (or 8-byte "
                            f"counts among them) and error, got {free}")
        values = {**fixed, **dict.fromkeys(free, 0)}
        return StructImage(self.layout.pack(*(values[n] for n in self.names)), pointers,
                           struct.Struct("<" + "Q" * len(pointers)).pack_into, self.layout.size - 8)

    def _check(self, given, expected) -> None:
        if set(given) != set(expected):
            missing, extra = set(expected) - set(given), set(given) - set(expected)
            raise TypeError(f"{self.name}: fields missing {sorted(missing)}, unknown {sorted(extra)}")


_PACK_ADDRESS = struct.Struct("<Q").pack_into


class StructImage(NamedTuple):
    """A parameter struct's bytes with every field set but the leading data pointers (named in
    ``pointers``) and the error buffer (0). A launcher keeps a copy per thread and a call writes
    only ``pack_pointers(buf, 0, *pointers)``, and in debug mode the error buffer's address at
    ``error_offset`` (``pack_error``)."""

    template: bytes
    pointers: tuple
    pack_pointers: Callable
    error_offset: int
    pack_error: Callable = _PACK_ADDRESS


@dataclass(frozen=True)
class Entry:
    """One ``extern "C"`` entry point: its name and the kernel body it runs (a call taking the
    parameter struct, e.g. ``gather_body<16, 4>``). ``body=None``: the source defines the
    entry point itself (a benchmark's baseline). ``min_blocks``: blocks an SM must hold at once
    (``__launch_bounds__``' second argument: ptxas keeps the registers within it), 0 for none."""

    name: str
    body: str | None = None
    min_blocks: int = 0


@dataclass(frozen=True)
class KernelModule:
    name: str                      # short id, used in cache file names
    source: str                    # file in cuda_src/ (or in ``source_dir``)
    entries: tuple[Entry, ...]     # its entry points
    params: ParamStruct            # the struct every entry point takes
    label: str                     # the op it serves, for messages (debug-mode errors)
    options: tuple[str, ...] = ()  # extra NVRTC options (-D constants of the spec, ...)
    threads: int = 256             # threads per block of every entry point (-DNG_THREADS)
    source_dir: str | None = None  # None: the package's cuda_src/; else a directory of its own

    @property
    def kernels(self) -> tuple[str, ...]:
        """The entry points' names."""
        return tuple(e.name for e in self.entries)

    @property
    def defines(self) -> tuple[str, ...]:
        """The -D options the source is compiled with (NG_THREADS first)."""
        return (f"-DNG_THREADS={self.threads}",) + tuple(o for o in self.options if o.startswith("-D"))

    def entry_wrappers(self) -> str:
        """The generated ``extern "C"`` entry points, appended to the source."""
        return "".join(
            f'extern "C" __global__ void __launch_bounds__(NG_THREADS{f", {e.min_blocks}" if e.min_blocks else ""}) '
            f"{e.name}(const {self.params.name} p) {{ {e.body}(p); }}\n" for e in self.entries if e.body is not None)


_registry: dict[str, KernelModule] = {}


def register(*modules: KernelModule) -> None:
    """Add a kernel family's modules to what warmup compiles and preload loads."""
    for m in modules:
        if _registry.setdefault(m.name, m) is not m:
            raise ValueError(f"a kernel module named {m.name!r} is registered already")


def registered() -> tuple[KernelModule, ...]:
    """Every module the ops can launch, in registration order (import nvrtc_gather.kernels
    first: each family registers itself when imported)."""
    return tuple(_registry.values())
