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


def _param_buffer():
    """(buffer, address of a void*[1] pointing at it), one pair per thread: launches from
    several threads never share parameter memory (the driver copies it at launch)."""
    b = getattr(_tls, "params", None)
    if b is None:
        buf = ctypes.create_string_buffer(_PARAM_BYTES)
        arr = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        b = _tls.params = (buf, ctypes.addressof(arr), arr)
    return b


def launch(device: int, function: int, grid: int, stream: int, layout: struct.Struct, values: tuple) -> None:
    """Launch ``function`` (a CUfunction of ``device``'s primary context) with a 1-D grid of
    ``grid`` blocks of THREADS_PER_BLOCK threads on ``stream`` (a raw CUstream handle)."""
    raw = driver.raw()
    buf, params, _keep = _param_buffer()
    layout.pack_into(buf, 0, *values)
    ctx = driver.primary_context(device)
    cur = ctypes.c_void_p()
    raw.ctx_get_current(ctypes.byref(cur))
    pushed = cur.value != ctx
    if pushed:  # e.g. tensors on cuda:1 while cuda:0 is current, or a thread that never used CUDA
        driver.check(raw.ctx_push(ctx), "cuCtxPushCurrent")
    try:
        rc = raw.launch(function, grid, 1, 1, THREADS_PER_BLOCK, 1, 1, 0, stream, params, None)
    finally:
        if pushed:
            raw.ctx_pop(ctypes.byref(cur))
    if rc:
        raise CudaError("cuLaunchKernel", rc, driver.error_name(rc))
