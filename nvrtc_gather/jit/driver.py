"""The CUDA driver API: the few calls the package makes, with errors that say what to do.

Every call goes straight to the driver library's exported entry points through ctypes
(bound once by name; no cuGetProcAddress, so compute-sanitizer's API-error report sees no
failed lookups from us, where cuda.bindings' driver module resolves its whole table). The
hot path (context check, launch) is the cheapest launch from Python: cuLaunchKernelEx, 4
arguments, the configuration prepared once per thread."""
from __future__ import annotations

import ctypes
import sys
import threading
from functools import lru_cache

from ..errors import CudaError, MissingDependencyError

# The driver library; the tests point it at a fake one built from C.
LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"

_DRIVER_HINT = (
    "no usable NVIDIA driver was found: install the NVIDIA driver (libcuda.so.1) for your GPU; "
    "on a machine without a GPU only the CPU path of the ops and the compiler work"
)

# Hints for CUresults a user can act on. A freshly compiled image that will not load is
# almost always NVRTC newer than the driver; `nvrtc-gather info` shows both versions.
_VERSION_HINT = ("if `nvrtc-gather info` shows the driver's CUDA version older than NVRTC's, upgrade the NVIDIA "
                 "driver or install NVRTC of the driver's CUDA major version (for a CUDA 12 driver: "
                 "pip install 'nvidia-cuda-nvrtc-cu12==12.*' 'cuda-bindings>=12.8,<13'); a damaged cached image is "
                 "replaced automatically, and `nvrtc-gather cache clear` removes them all")
_HINTS = {
    200: "the driver rejected the kernel image: " + _VERSION_HINT,  # INVALID_IMAGE
    209: "no kernel image for this GPU: " + _VERSION_HINT,  # NO_BINARY_FOR_GPU
    218: "the driver rejected the PTX: " + _VERSION_HINT,  # INVALID_PTX
    222: "the driver is older than the NVRTC that produced this PTX: upgrade the NVIDIA driver, or install "
         "NVRTC of the driver's CUDA version, e.g. for a CUDA 12 driver pip install 'nvidia-cuda-nvrtc-cu12==12.*' "
         "'cuda-bindings>=12.8,<13' (`nvrtc-gather info` prints the command for this machine)",  # UNSUPPORTED_PTX_VERSION
    221: "this GPU is newer than NVRTC, so its kernels are PTX for the driver to JIT-compile, and the driver "
         "cannot: install an NVRTC that supports this GPU (pip install --upgrade nvidia-cuda-nvrtc)",  # JIT_COMPILER_NOT_FOUND
    223: "this GPU is newer than NVRTC, so its kernels are PTX for the driver to JIT-compile, and JIT is "
         "disabled (CUDA_DISABLE_JIT?): install an NVRTC that supports this GPU (pip install --upgrade nvidia-cuda-nvrtc)",  # JIT_COMPILATION_DISABLED
    34: "the libcuda.so found is the CUDA toolkit's stub, not the driver: install the NVIDIA driver, or fix "
        "LD_LIBRARY_PATH so the driver's libcuda.so.1 comes first",  # STUB_LIBRARY
    36: "the NVIDIA driver is older than this call needs: upgrade the driver "
        "(`nvrtc-gather info` shows its CUDA version)",  # CALL_REQUIRES_NEWER_DRIVER
    803: "the NVIDIA kernel module and libcuda.so.1 are different versions: reinstall the driver or reboot",  # SYSTEM_DRIVER_MISMATCH
    100: "no CUDA-capable GPU is visible (check CUDA_VISIBLE_DEVICES)",  # NO_DEVICE
}


_p = ctypes.c_void_p
_pp = ctypes.POINTER(ctypes.c_void_p)
_int, _uint = ctypes.c_int, ctypes.c_uint
_pint = ctypes.POINTER(ctypes.c_int)

# Entry point -> (the library's exported symbol, argument types). Symbols with an ABI
# version are named as cuda.h maps them (cuCtxPushCurrent -> cuCtxPushCurrent_v2).
_SIGNATURES = {
    "cuInit": ("cuInit", _uint),
    "cuDriverGetVersion": ("cuDriverGetVersion", _pint),
    "cuDeviceGetCount": ("cuDeviceGetCount", _pint),
    "cuDeviceGet": ("cuDeviceGet", _pint, _int),
    "cuDeviceGetAttribute": ("cuDeviceGetAttribute", _pint, _int, _int),
    "cuDeviceGetName": ("cuDeviceGetName", ctypes.c_char_p, _int, _int),
    "cuDevicePrimaryCtxRetain": ("cuDevicePrimaryCtxRetain", _pp, _int),
    "cuLibraryLoadData": ("cuLibraryLoadData", _pp, ctypes.c_char_p, _p, _p, _uint, _p, _p, _uint),
    "cuLibraryUnload": ("cuLibraryUnload", _p),
    "cuLibraryGetKernel": ("cuLibraryGetKernel", _pp, _p, ctypes.c_char_p),
    "cuKernelGetFunction": ("cuKernelGetFunction", _pp, _p),
    "cuCtxGetCurrent": ("cuCtxGetCurrent", _pp),
    "cuCtxPushCurrent": ("cuCtxPushCurrent_v2", _p),
    "cuCtxPopCurrent": ("cuCtxPopCurrent_v2", _pp),
    "cuStreamIsCapturing": ("cuStreamIsCapturing", _p, _pint),
    "cuLaunchKernelEx": ("cuLaunchKernelEx", _p, _p, _p, _p),
    "cuGetErrorName": ("cuGetErrorName", _int, ctypes.POINTER(ctypes.c_char_p)),
}
# CUdevice_attribute values (cuda.h)
_MULTIPROCESSOR_COUNT, _CC_MAJOR, _CC_MINOR = 16, 75, 76


class _Driver:
    """The driver library's entry points the package calls, bound by name."""

    def __init__(self, path: str):
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise MissingDependencyError(f"{_DRIVER_HINT} ({exc})") from exc
        for name, (symbol, *argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(lib, symbol)
            except AttributeError as exc:
                raise MissingDependencyError(
                    f"the NVIDIA driver ({path}) has no {symbol}: it is older than CUDA 12.0, which this package "
                    f"needs; upgrade the NVIDIA driver") from exc
            fn.restype, fn.argtypes = ctypes.c_int, argtypes
            setattr(self, name, fn)


@lru_cache(maxsize=None)
def _library(path: str) -> _Driver:
    return _Driver(path)


def _lib() -> _Driver:
    return _library(LIBRARY)


def error_name(code: int) -> str:
    name = ctypes.c_char_p()
    try:
        rc = _lib().cuGetErrorName(code, ctypes.byref(name))
    except MissingDependencyError:
        return "CUresult"
    return name.value.decode() if rc == 0 and name.value else "CUresult"


def fail(call: str, code: int):
    """Raise the CudaError of driver call ``call`` returning ``code``: its name, and what to do
    where we know."""
    raise CudaError(call, code, error_name(code), _HINTS.get(code, ""))


def _call(name: str, *args, label: str | None = None) -> None:
    """Call entry point ``name``; CudaError unless CUDA_SUCCESS."""
    code = getattr(_lib(), name)(*args)
    if code != 0:
        fail(label or name, code)


_init_lock = threading.Lock()
_initialized = False


def init() -> None:
    """cuInit once per process. MissingDependencyError when there is no driver or no GPU."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        try:
            _call("cuInit", 0)
        except CudaError as exc:
            if exc.code != 100:
                raise
            raise MissingDependencyError(f"{_DRIVER_HINT} ({exc})") from exc
        _initialized = True


def _int_out(name: str, *args) -> int:
    out = ctypes.c_int()
    _call(name, ctypes.byref(out), *args)
    return out.value


def driver_version() -> int:
    """e.g. 13000 for CUDA 13.0."""
    init()
    return _int_out("cuDriverGetVersion")


def device_count() -> int:
    init()
    return _int_out("cuDeviceGetCount")


@lru_cache(maxsize=None)
def _device(ordinal: int) -> int:
    init()
    return _int_out("cuDeviceGet", ordinal)


def _attribute(attribute: int, ordinal: int) -> int:
    return _int_out("cuDeviceGetAttribute", attribute, _device(ordinal))


@lru_cache(maxsize=None)
def capability(ordinal: int) -> int:
    """Compute capability as one int: 90 for sm_90."""
    return _attribute(_CC_MAJOR, ordinal) * 10 + _attribute(_CC_MINOR, ordinal)


@lru_cache(maxsize=None)
def sm_count(ordinal: int) -> int:
    return _attribute(_MULTIPROCESSOR_COUNT, ordinal)


def device_name(ordinal: int) -> str:
    buf = ctypes.create_string_buffer(256)
    _call("cuDeviceGetName", buf, len(buf), _device(ordinal))
    return buf.value.decode(errors="replace")


def _handle_out(name: str, *args, label: str | None = None) -> int:
    out = ctypes.c_void_p()
    _call(name, ctypes.byref(out), *args, label=label)
    return out.value or 0


@lru_cache(maxsize=None)
def primary_context(ordinal: int) -> int:
    """The device's primary context (the one torch's runtime uses), retained for the process."""
    return _handle_out("cuDevicePrimaryCtxRetain", _device(ordinal))


def load_library(image: bytes) -> int:
    """Load a cubin/PTX image. Loading may be lazy: errors can surface at get_function."""
    init()
    return _handle_out("cuLibraryLoadData", image, None, None, 0, None, None, 0)


def unload_library(lib: int) -> None:
    _lib().cuLibraryUnload(lib)


def get_function(lib: int, name: str) -> int:
    """The kernel ``name`` as a CUfunction of the *current* context (which loads it there)."""
    kernel = _handle_out("cuLibraryGetKernel", lib, name.encode(), label=f"cuLibraryGetKernel({name})")
    return _handle_out("cuKernelGetFunction", kernel, label=f"cuKernelGetFunction({name})")


def in_primary_context(device: int, fn):
    """fn() with ``device``'s primary context current, the caller's restored afterwards
    (push/pop, so torch's idea of the current device never changes). Pushes only when
    another context, or none, is current."""
    r = raw()
    ctx = primary_context(device)
    cur = ctypes.c_void_p()
    r.ctx_get_current(ctypes.byref(cur))
    if cur.value == ctx:
        return fn()
    rc = r.ctx_push(ctx)
    if rc != 0:
        fail("cuCtxPushCurrent", rc)
    try:
        return fn()
    finally:
        r.ctx_pop(ctypes.byref(ctypes.c_void_p()))


# CUstreamCaptureStatus: NONE = 0, ACTIVE = 1, INVALIDATED = 2
def stream_is_capturing(stream: int) -> bool:
    status = ctypes.c_int()
    _call("cuStreamIsCapturing", stream, ctypes.byref(status))
    return status.value != 0


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, for cuLaunchKernelEx."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
    ]


class _Raw:
    """The hot path's entry points, called without a wrapper: each returns its CUresult."""

    def __init__(self):
        init()
        lib = _lib()
        self.ctx_get_current = lib.cuCtxGetCurrent
        self.ctx_push = lib.cuCtxPushCurrent
        self.ctx_pop = lib.cuCtxPopCurrent
        # The launch keeps the GIL, as torch's own launches do (a CDLL call releases and retakes
        # it around the driver call).
        launch = ctypes.PyDLL(LIBRARY).cuLaunchKernelEx
        launch.restype, launch.argtypes = ctypes.c_int, _SIGNATURES["cuLaunchKernelEx"][1:]
        self.launch_ex = launch


@lru_cache(maxsize=None)
def raw() -> _Raw:
    return _Raw()
