"""Kernels on a device: load a module's GPU code (from build.py) into the device's primary
context once, and launch its entry points. Every launch goes through ``LoadedModule.launcher``.

- ``load(module, device, stream)``: the module's loaded handle, built and loaded on first use
  and kept for the process; refuses to compile or load while ``stream`` captures a CUDA graph.
- ``LoadedModule.launcher(entry, grid, image)``: ``go(pointers)``, which launches ``entry`` with
  ``grid`` blocks on torch's current stream of the module's device, the parameter struct
  ``image`` (ParamStruct.image: every field but the data pointers and the error buffer) with
  the call's ``pointers`` written in. The error buffer is null normally, and with
  NVRTC_GATHER_DEBUG=1 a device buffer that is read back after the launch (one sync) and
  turned into a ValueError naming the bad index. The ops keep one per layout and vector
  width (ops/fast_path.py), so a call is one Python call into the launcher, not a chain.
- ``preload(device)``: load every registered module now (before CUDA-graph capture).
"""
from __future__ import annotations

import ctypes
import logging
import threading
from typing import Callable

import torch

from .. import settings
from ..errors import CaptureError, CudaError
from . import build, driver, spec
from .debug_errors import raise_if_set

def _current_stream_object(device: int) -> int:
    """Handle of torch's current stream on CUDA device ``device`` (0 = the legacy default stream)."""
    return torch.cuda.current_stream(device).cuda_stream


# current_stream(device): handle of torch's current stream on CUDA device ``device`` (0 = the
# legacy default stream). torch's C call returning it as an int (~0.1 µs) where it has one; else
# (an older or CPU-only build) from a Stream object (~2 µs).
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream_object)


log = logging.getLogger(__name__)


def _launch_state(image: spec.StructImage, grid: int, threads: int) -> tuple:
    """One thread's state for one launcher: the parameter buffer (a copy of the struct image),
    the void*[1] pointing at it, the CUlaunchConfig with grid and block set, and a slot for
    cuCtxGetCurrent. Launches from several threads never share it; reuse within a thread is
    safe because the driver copies parameters at launch (graph capture included)."""
    buf = ctypes.create_string_buffer(image.template, len(image.template))
    arr = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
    cfg = driver.LaunchConfig(grid, 1, 1, threads, 1, 1, 0, None, None, 0)  # the stream set per launch
    cur = ctypes.c_void_p()
    return buf, ctypes.addressof(arr), cfg, ctypes.addressof(cfg), cur, ctypes.byref(cur), arr


def error_buffer(device: int) -> torch.Tensor:
    """A zeroed debug-mode error buffer (code and three details, cuda_src/common.cuh)."""
    return torch.zeros(4, dtype=torch.int64, device=torch.device("cuda", device))


class LoadedModule:
    """A kernel module loaded on one device: its entry points by name, and the one way to
    launch them (a 1-D grid of the module's threads per block, the struct packed per call)."""

    __slots__ = ("module", "device", "functions", "_context", "_threads", "_raw")

    def __init__(self, module: spec.KernelModule, device: int, functions: dict[str, int]):
        self.module, self.device, self.functions = module, device, functions
        self._context = driver.primary_context(device)
        self._threads = module.threads
        self._raw = driver.raw()

    def launcher(self, entry: str, grid: int, image: spec.StructImage,
                 stream_of: Callable[[int], int] | None = None):
        """``go(pointers)``: launch ``entry`` with ``grid`` blocks on ``stream_of(device)``
        (``grid`` 0: a per-call grid, ``go(pointers, 0, blocks)``; the pointers may then include
        the leading 8-byte counts of the struct that each call sets)
        (default: torch's current stream, asked at each call), the parameter struct ``image``
        with the call's data ``pointers`` (in struct order) written in. Everything fixed is
        bound here once, and each thread keeps its own copy of the struct and launch config
        with the fixed fields already in, so a launch is this closure, one pack of the
        pointers and the driver calls (``go``'s ``err_ptr`` is its own: the debug-mode buffer
        of the call it wraps)."""
        function, threads, context = self.functions[entry], self._threads, self._context
        device, raw = self.device, self._raw
        stream_of = stream_of or current_stream
        label = self.module.label
        env_data, debug_key = settings.debug_unset_test()
        pack_pointers, pack_error, error_offset = image.pack_pointers, image.pack_error, image.error_offset
        per_thread = threading.local()

        def go(pointers, err_ptr: int = 0, blocks: int = 0) -> None:
            # Every op call runs this: the pointers packed, the stream set, cuLaunchKernelEx (4
            # arguments through ctypes instead of cuLaunchKernel's 11). Debug mode: an error
            # buffer, read back after the launch (the usual unset variable tested inline).
            # ``blocks``: this call's grid, for a launcher whose grid changes per call (grid 0).
            if not err_ptr and (env_data is None or debug_key in env_data) and settings.debug_enabled():
                err = error_buffer(device)
                go(pointers, err.data_ptr(), blocks)
                raise_if_set(err, label)
                return
            try:
                buf, params, cfg, cfg_addr, cur, cur_ref, _keep = per_thread.state
            except AttributeError:
                buf, params, cfg, cfg_addr, cur, cur_ref, _keep = per_thread.state = _launch_state(image, grid, threads)
            pack_pointers(buf, 0, *pointers)
            cfg.hStream = stream_of(device)
            if blocks:
                cfg.gridDimX = blocks
            if err_ptr:  # debug mode: this launch only, then the buffer's error field is null again
                pack_error(buf, error_offset, err_ptr)
            try:
                # Launched as if the device's primary context were current, as it nearly always
                # is (asking first costs a driver call per launch): see _after_refusal.
                rc = raw.launch_ex(cfg_addr, function, params, None)
                if rc:
                    _after_refusal(rc, raw, cfg_addr, function, params, cur, cur_ref, context, device)
            finally:
                if err_ptr:
                    pack_error(buf, error_offset, 0)
        return go


def _after_refusal(rc: int, raw, cfg_addr, function, params, cur, cur_ref, context, device) -> None:
    """A launch the driver refused with ``rc``. A function of one context never runs in
    another: where that context is not current (tensors on another device than the current
    one, a thread that never used CUDA) the driver refuses the launch (measured on the H200 for
    a thread with no context current; a driver that ran it in its own context instead would give
    the same result). So only now is the current context asked for, and if it is another the
    launch is repeated with the primary context pushed; any other refusal raises."""
    raw.ctx_get_current(cur_ref)
    if cur.value != context:
        rc = driver.in_primary_context(device, lambda: raw.launch_ex(cfg_addr, function, params, None))
    if rc:
        driver.fail("cuLaunchKernelEx", rc)


_lock = threading.RLock()
_libraries: dict[tuple[str, int], object] = {}             # (module, compute capability) -> CUlibrary
_loaded: dict[tuple[str, int], LoadedModule] = {}          # (module, device) -> handle


def _functions(module: spec.KernelModule, lib, device: int) -> dict[str, int]:
    """The module's kernels in ``device``'s context. Loading is lazy in the driver: a bad
    image may only fail here."""
    return driver.in_primary_context(device, lambda: {name: driver.get_function(lib, name) for name in module.kernels})


def _load_library(module: spec.KernelModule, device: int, image: bytes):
    """Load ``image`` as a library and fetch its kernels on ``device``; unloaded again if the
    driver refuses it (CudaError)."""
    lib = driver.load_library(image)
    build.count("loads")
    log.debug("%s: loaded (%d bytes) for cuda:%d", module.name, len(image), device)
    try:
        return lib, _functions(module, lib, device)
    except CudaError:
        driver.unload_library(lib)
        raise


def _build_and_load(module: spec.KernelModule, device: int) -> dict[str, int]:
    """The module's kernels on ``device``: from a library already loaded for a GPU of the same
    compute capability (no disk, no NVRTC), else from build.image_for."""
    settings.jit_disabled()  # a value it does not understand raises at every first load, cache hit or not
    capability = driver.capability(device)
    lib = _libraries.get((module.name, capability))
    if lib is not None:
        return _functions(module, lib, device)
    lib, functions = build.image_for(module, capability, lambda image: _load_library(module, device, image))
    _libraries[module.name, capability] = lib
    return functions


def load(module: spec.KernelModule, device: int, stream: int = 0) -> LoadedModule:
    """``module`` loaded on CUDA device ``device``. The first call per (module, device)
    builds and loads; it refuses to while ``stream`` is capturing a CUDA graph."""
    handle = _loaded.get((module.name, device))
    if handle is not None:
        return handle
    with _lock:
        handle = _loaded.get((module.name, device))
        if handle is not None:
            return handle
        if stream and driver.stream_is_capturing(stream):
            raise CaptureError(
                f"nvrtc_gather's {module.name} kernels are not loaded on cuda:{device} yet and the stream is "
                f"capturing a CUDA graph; call nvrtc_gather.preload({device}) (or run the op once) before capture"
            )
        handle = LoadedModule(module, device, _build_and_load(module, device))
        _loaded[module.name, device] = handle
        return handle


def preload(device: int | None = None, modules=None) -> None:
    """Compile/load every kernel module the ops use (spec.registered()) for ``device``
    (default: every visible GPU) now, so that no later call has to, e.g. before capturing
    CUDA graphs."""
    devices = [device] if device is not None else range(driver.device_count())
    for d in devices:
        for m in modules or spec.registered():
            load(m, d)
