"""Kernels on a device: load a module's GPU code (from build.py) into the device's primary
context once, and launch its entry points. Every op launches through ``LoadedModule.launch``.

- ``load(module, device, stream)``: the module's loaded handle, built and loaded on first use
  and kept for the process; refuses to compile or load while ``stream`` captures a CUDA graph.
- ``LoadedModule.launch(entry, grid, values, stream)``: one kernel launch. ``values`` are the
  parameter struct's fields but the last; that one, the debug error buffer, is filled in
  here: null normally, and with NVRTC_GATHER_DEBUG=1 a device buffer that is read back after
  the launch (one sync) and turned into a ValueError naming the bad index.
- ``preload(device)``: load every module now (before CUDA-graph capture).
"""
from __future__ import annotations

import ctypes
import logging
import threading

import torch

from .. import settings
from ..errors import CaptureError, CudaError
from . import build, compiler, driver
from .catalogue import THREADS_PER_BLOCK, KernelModule
from .debug_errors import raise_if_set

try:  # a C call returning the handle as an int (~0.1 µs)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # torch without it (or a CPU-only build): build a Stream object (~2 µs)
    _raw_stream = None


def current_stream(device: int) -> int:
    """Handle of torch's current stream on CUDA device ``device`` (0 = the legacy default stream)."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


log = logging.getLogger(__name__)
_PARAM_BYTES = 4096  # the driver's limit for kernel parameters
_tls = threading.local()


def _thread_state():
    """Per-thread launch state: the parameter buffer, the void*[1] pointing at it, the
    CUlaunchConfig, and a slot for cuCtxGetCurrent. Launches from several threads never
    share it; reuse within a thread is safe because the driver copies parameters at
    launch (graph capture included)."""
    st = getattr(_tls, "state", None)
    if st is None:
        buf = ctypes.create_string_buffer(_PARAM_BYTES)
        arr = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        cfg = driver.LaunchConfig(1, 1, 1, THREADS_PER_BLOCK, 1, 1, 0, None, None, 0)
        cur = ctypes.c_void_p()
        st = _tls.state = (buf, ctypes.addressof(arr), cfg, ctypes.addressof(cfg), cur, ctypes.byref(cur), arr)
    return st


def error_buffer(device: int) -> torch.Tensor:
    """A zeroed debug-mode error buffer (code and three details, cuda_src/common.cuh)."""
    return torch.zeros(4, dtype=torch.int64, device=torch.device("cuda", device))


class LoadedModule:
    """A kernel module loaded on one device: its entry points by name, and the one way to
    launch them (a 1-D grid of THREADS_PER_BLOCK threads, the struct packed per call)."""

    __slots__ = ("module", "device", "functions", "_context", "_pack", "_raw")

    def __init__(self, module: KernelModule, device: int, functions: dict[str, int]):
        self.module, self.device, self.functions = module, device, functions
        self._context = driver.primary_context(device)
        self._pack = module.params.layout.pack_into
        self._raw = driver.raw()

    def launch(self, entry: str, grid: int, values: tuple, stream: int) -> None:
        """Launch ``entry`` with ``grid`` blocks on ``stream`` (a raw CUstream handle);
        ``values``: the struct's fields but the last (the error buffer)."""
        if settings.debug_enabled():
            err = error_buffer(self.device)
            self._launch(self.functions[entry], grid, values, err.data_ptr(), stream)
            raise_if_set(err, self.module.label)
        else:
            self._launch(self.functions[entry], grid, values, 0, stream)

    def _launch(self, function: int, grid: int, values: tuple, err_ptr: int, stream: int) -> None:
        # Every op call runs this: kept to one pack, two config fields, the context check and
        # cuLaunchKernelEx (4 arguments through ctypes instead of cuLaunchKernel's 11).
        try:
            buf, params, cfg, cfg_addr, cur, cur_ref, _keep = _tls.state
        except AttributeError:
            buf, params, cfg, cfg_addr, cur, cur_ref, _keep = _thread_state()
        self._pack(buf, 0, *values, err_ptr)
        cfg.gridDimX = grid
        cfg.hStream = stream
        raw = self._raw
        raw.ctx_get_current(cur_ref)
        if cur.value == self._context:  # the usual case
            rc = raw.launch_ex(cfg_addr, function, params, None)
        else:  # tensors on another device than the current one, or a thread that never used CUDA
            rc = driver.in_primary_context(self.device, lambda: raw.launch_ex(cfg_addr, function, params, None))
        if rc:
            raise CudaError("cuLaunchKernelEx", rc, driver.error_name(rc))


_lock = threading.RLock()
_libraries: dict[tuple[str, str], object] = {}            # (module, arch) -> CUlibrary
_loaded: dict[tuple[str, int], LoadedModule] = {}          # (module, device) -> handle


def _load(module: KernelModule, target: compiler.Target, device: int, image: bytes | None) -> dict[str, int]:
    """Load (or reuse) the library for (module, arch) and fetch its kernels in ``device``'s
    context. Loading is lazy in the driver: a bad image may only fail at the fetch."""
    lk = (module.name, target.arch)
    lib = _libraries.get(lk)
    fresh = lib is None
    if fresh:
        lib = driver.load_library(image)
        build.count("loads")
        log.debug("%s-%s: loaded (%d bytes)", module.name, target.arch, len(image))
    try:
        fns = driver.in_primary_context(device, lambda: {name: driver.get_function(lib, name)
                                                          for name in module.kernels})
    except CudaError:
        if fresh:
            driver.unload_library(lib)
        raise
    _libraries[lk] = lib
    return fns


def _build_and_load(module: KernelModule, device: int) -> dict[str, int]:
    """Build (or read) the image the device loads and load it; a cached image that the driver
    refuses is discarded, compiled afresh and replaced, once."""
    settings.jit_disabled()  # a value it does not understand raises at every first load, cache hit or not
    target, built = build.image_for_gpu(module, driver.capability(device))
    if (module.name, target.arch) in _libraries:
        return _load(module, target, device, None)
    built = built or build.build_image(module, target)
    try:
        return _load(module, target, device, built.image)
    except CudaError:
        if not built.from_cache:
            raise
    return _load(module, target, device, build.rebuild(module, target, built))


def load(module: KernelModule, device: int, stream: int = 0) -> LoadedModule:
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
    """Compile/load every kernel for ``device`` (default: every visible GPU) now, so that
    no later call has to, e.g. before capturing CUDA graphs."""
    from .catalogue import ALL_MODULES

    devices = [device] if device is not None else range(driver.device_count())
    for d in devices:
        for m in modules or ALL_MODULES:
            load(m, d)
