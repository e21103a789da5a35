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
_contexts: dict[int, int] = {}  # device -> primary context handle


def _thread_state():
    """Per-thread parameter buffer, the void*[1] pointing at it, and a slot for
    cuCtxGetCurrent: launches from several threads never share parameter memory (the
    driver copies it at launch, so reuse within a thread is safe, graph capture included)."""
    st = getattr(_tls, "state", None)
    if st is None:
        buf = ctypes.create_string_buffer(_PARAM_BYTES)
        arr = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        cur = ctypes.c_void_p()
        st = _tls.state = (buf, ctypes.addressof(arr), cur, ctypes.byref(cur), arr)
    return st


def launch(device: int, function: int, grid: int, stream: int, layout: struct.Struct, values: tuple) -> None:
    """Launch ``function`` (a CUfunction of ``device``'s primary context) with a 1-D grid of
    ``grid`` blocks of THREADS_PER_BLOCK threads on ``stream`` (a raw CUstream handle)."""
    raw = driver.raw()
    buf, params, cur, cur_ref, _keep = _thread_state()
    layout.pack_into(buf, 0, *values)
    ctx = _contexts.get(device)
    if ctx is None:
        ctx = _contexts.setdefault(device, driver.primary_context(device))
    raw.ctx_get_current(cur_ref)
    if cur.value == ctx:
        rc = raw.launch(function, grid, 1, 1, THREADS_PER_BLOCK, 1, 1, 0, stream, params, None)
    else:  # tensors on another device than the current one, or a thread that never used CUDA
        driver.check(raw.ctx_push(ctx), "cuCtxPushCurrent")
        try:
            rc = raw.launch(function, grid, 1, 1, THREADS_PER_BLOCK, 1, 1, 0, stream, params, None)
        finally:
            raw.ctx_pop(cur_ref)
    if rc:
        raise CudaError("cuLaunchKernel", rc, driver.error_name(rc))
