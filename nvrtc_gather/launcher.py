"""The one kernel launcher: pack a kernel's parameter struct, make sure the device's
primary context is current, cuLaunchKernel on the given stream. Nothing else.

Every kernel takes a single by-value struct, so a launch is one ``struct.pack_into``
into a per-thread buffer plus one raw driver call (see driver.raw())."""
from __future__ import annotations

import ctypes
import struct
import threading

from . import driver
from .errors import CudaError
from .kernels import THREADS_PER_BLOCK

_tls = threading.local()
_PARAM_BYTES = 4096  # the driver's limit for kernel parameters


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


def launch(device: int, function: int, grid: int, stream: int, layout: struct.Struct, values: tuple) -> None:
    """Launch ``function`` (a CUfunction of ``device``'s primary context) with a 1-D grid of
    ``grid`` blocks of THREADS_PER_BLOCK threads on ``stream`` (a raw CUstream handle),
    its single struct parameter packed from ``values`` with ``layout``.

    cuLaunchKernelEx with a prepared config: 4 arguments through ctypes instead of 11,
    about 1 µs less per call than cuLaunchKernel (benchmarks/NOTES.md)."""
    raw = driver.raw()  # lru_cached
    buf, params, cfg, cfg_addr, cur, cur_ref, _keep = _thread_state()
    layout.pack_into(buf, 0, *values)
    cfg.gridDimX = grid
    cfg.hStream = stream
    ctx = driver.primary_context(device)  # lru_cached
    raw.ctx_get_current(cur_ref)
    if cur.value == ctx:  # the usual case, checked inline: this runs on every op call
        rc = raw.launch_ex(cfg_addr, function, params, None)
    else:  # tensors on another device than the current one, or a thread that never used CUDA
        rc = driver.in_primary_context(device, lambda: raw.launch_ex(cfg_addr, function, params, None))
    if rc:
        raise CudaError("cuLaunchKernelEx", rc, driver.error_name(rc))
