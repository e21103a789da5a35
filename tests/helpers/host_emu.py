"""Builds the host emulator of the kernels (tests/helpers/cuda_host_emu.cpp running a file of
cuda_src/ on CPU threads) for the tests that need it."""
import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from nvrtc_gather.jit import sources
from nvrtc_gather.kernels import cache_gather, gather as gather_kernels, indexer_k_quant as quant_kernels, mla_cache
from nvrtc_gather.kernels import dsv4_gather, index_k_read, indexer_k_scatter as scatter_kernels

_BUILDS: dict = {}
# kernel -> its family's modules: one emulator build holds every entry point of the family
# (every module of a family shares one source and one parameter struct)
KERNELS = {
    "quant": quant_kernels.MODULES,
    "gather": gather_kernels.MODULES,
    "mla_write": {**{("ds", k): m for k, m in mla_cache.DS_MODULES.items()},
                  **{("plain", k): m for k, m in mla_cache.PLAIN_MODULES.items()}},
    "mla_gather": {"gather": mla_cache.GATHER_MODULE},
    "cache_gather": {**cache_gather.MODULES, **{("tiny", c): m for c, m in cache_gather.TINY_MODULES.items()}},
    "scatter": scatter_kernels.MODULES,
    "index_k_read": index_k_read.MODULES,
    "dsv4": {"flat": dsv4_gather.FLAT_MODULE, "paged": dsv4_gather.PAGED_MODULE, "v41": dsv4_gather.V41_MODULE},
}


def emulator(tmp_path_factory, defines: tuple = (), kernel: str = "quant", modules=None):
    """The emulator of ``kernel``'s source built as its spec builds it (the spec's -D
    constants, the entry points it generates for every module of the family) with extra
    ``-D`` ``defines`` (one build per kernel and set, per process); skips the test when no
    C++20 compiler is available. ``modules``: a family not in KERNELS (a benchmark's
    baseline, whose source lives in its ``source_dir``), built under the name ``kernel``.

    Several builds live in one process, each with its own __shared__ arrays (static locals of
    templates: GCC would make them STB_GNU_UNIQUE, one object for every library that defines
    the symbol, whatever its size there; -fno-gnu-unique keeps them apart)."""
    if (kernel, defines) in _BUILDS:
        return _BUILDS[kernel, defines]
    modules = list(modules if modules is not None else KERNELS[kernel].values())
    first = modules[0]
    source, params = first.source, first.params.name
    assert all(m.source == source and m.params == first.params and m.defines == first.defines for m in modules), kernel
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the host emulator of the kernels")
    build_dir = tmp_path_factory.mktemp("emu")
    lib = build_dir / f"lib{kernel}emu.so"
    entries = build_dir / "entries.inc"
    entries.write_text("".join(m.entry_wrappers() for m in modules))
    here = Path(__file__).resolve().parent
    cmd = [cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-pthread", "-shared",
           "-fPIC", "-Wno-unknown-pragmas", f"-I{sources.source_dir()}",
           *([f"-I{first.source_dir}"] if first.source_dir else []),
           f'-DKERNEL_FILE="{source}"', f'-DKERNEL_ENTRIES="{entries}"', f"-DKERNEL_PARAMS={params}",
           *first.defines, *defines, str(here / "cuda_host_emu.cpp"), "-o", str(lib)]
    r = subprocess.run(cmd[:1] + ["-fno-gnu-unique"] + cmd[1:], capture_output=True, text=True)
    if r.returncode and "gnu-unique" in r.stderr:  # not GCC: clang does not make them unique
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        # the source fails, or the entry points generated from the spec (an emulator that skipped
        # here once hid that a two-argument __launch_bounds__ did not build)
        if any(str(d) in r.stderr for d in (sources.source_dir(), first.source_dir, entries) if d):
            pytest.fail(f"the host emulator of {source} {' '.join(defines)} does not build: {r.stderr[-1500:]}")
        pytest.skip(f"could not build the host emulator (a C++20 compiler is needed): {r.stderr[-800:]}")
    dll = ctypes.CDLL(str(lib))
    dll.emu_launch.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int)
    dll.emu_launch.restype = ctypes.c_int
    dll.emu_faults.restype = ctypes.c_int
    dll.emu_oob.restype = ctypes.c_int
    dll.emu_divergent.restype = ctypes.c_int
    dll.emu_set_bounds.argtypes = (ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int)
    dll.emu_set_bounds.restype = None
    dll.emu_launch_isolated.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_int,
                                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulonglong),
                                        ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(ctypes.c_int))
    dll.emu_launch_isolated.restype = ctypes.c_int
    _BUILDS[kernel, defines] = dll
    return dll


def emu_launch(dll, params, entry: str, grid: int, fields: dict, err_ptr: int = 0) -> None:
    """Run ``entry`` of an emulator build on ``grid`` blocks with the struct ``params`` (a
    family's PARAMS) packed from ``fields`` (every field but the error buffer, by name) and
    ``err_ptr``, as runtime.LoadedModule.launcher packs it for the GPU."""
    fn = ctypes.cast(getattr(dll, entry), ctypes.c_void_p)
    packed = params.pack(**fields, error=err_ptr)
    assert dll.emu_launch(fn, packed, grid) == params.layout.size  # the C++ struct has the same size
    assert dll.emu_faults() == 0, "misaligned vector load or store"
    assert dll.emu_divergent() == 0, "a warp shuffle or ballot that some lanes of a warp skipped"
