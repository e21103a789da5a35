"""The CUDA driver API: the few calls the package makes, with errors that say what to do.

Slow-path calls (init, device queries, loading code) go through cuda.bindings. The
per-call hot path (context check, launch) goes through raw driver entry points taken
once from cuGetProcAddress and called with ctypes, the cheapest launch path from Python
(cuLaunchKernelEx: 4 arguments, the configuration prepared once per thread)."""
from __future__ import annotations

import ctypes
import threading
from functools import lru_cache

from ..errors import CudaError, MissingDependencyError

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
    36: "the NVIDIA driver is older than cuda-bindings needs: upgrade the driver, or install cuda-bindings of "
        "the driver's CUDA major version (see `nvrtc-gather info`)",  # CALL_REQUIRES_NEWER_DRIVER
    803: "the NVIDIA kernel module and libcuda.so.1 are different versions: reinstall the driver or reboot",  # SYSTEM_DRIVER_MISMATCH
    100: "no CUDA-capable GPU is visible (check CUDA_VISIBLE_DEVICES)",  # NO_DEVICE
}


def _bindings():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise MissingDependencyError(f"cuda.bindings is not importable ({exc}): pip install cuda-bindings") from exc
    return driver


def check(result, call: str):
    """Unpack a cuda.bindings return tuple; raise CudaError unless CUDA_SUCCESS."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    code = int(err)
    if code != 0:
        raise CudaError(call, code, getattr(err, "name", ""), _HINTS.get(code, ""))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


_init_lock = threading.Lock()
_initialized = False


def init() -> None:
    """cuInit once per process. MissingDependencyError when there is no driver."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        drv = _bindings()
        try:
            check(drv.cuInit(0), "cuInit")
        except RuntimeError as exc:
            if isinstance(exc, CudaError) and exc.code != 100:
                raise
            raise MissingDependencyError(f"{_DRIVER_HINT} ({exc})") from exc
        _initialized = True


def driver_version() -> int:
    """e.g. 13000 for CUDA 13.0."""
    init()
    return int(check(_bindings().cuDriverGetVersion(), "cuDriverGetVersion"))


def device_count() -> int:
    init()
    return int(check(_bindings().cuDeviceGetCount(), "cuDeviceGetCount"))


@lru_cache(maxsize=None)
def _device(ordinal: int):
    init()
    return check(_bindings().cuDeviceGet(ordinal), "cuDeviceGet")


@lru_cache(maxsize=None)
def capability(ordinal: int) -> int:
    """Compute capability as one int: 90 for sm_90."""
    drv = _bindings()
    dev = _device(ordinal)
    a = drv.CUdevice_attribute
    major = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    return int(major) * 10 + int(minor)


@lru_cache(maxsize=None)
def sm_count(ordinal: int) -> int:
    drv = _bindings()
    a = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(check(drv.cuDeviceGetAttribute(a, _device(ordinal)), "cuDeviceGetAttribute"))


def device_name(ordinal: int) -> str:
    raw = check(_bindings().cuDeviceGetName(256, _device(ordinal)), "cuDeviceGetName")
    return raw.split(b"\0", 1)[0].decode()


@lru_cache(maxsize=None)
def primary_context(ordinal: int) -> int:
    """The device's primary context (the one torch's runtime uses), retained for the process."""
    ctx = check(_bindings().cuDevicePrimaryCtxRetain(_device(ordinal)), "cuDevicePrimaryCtxRetain")
    return int(ctx)


def load_library(image: bytes):
    """Load a cubin/PTX image. Loading may be lazy: errors can surface at get_function."""
    init()
    return check(_bindings().cuLibraryLoadData(image, None, None, 0, None, None, 0), "cuLibraryLoadData")


def unload_library(lib) -> None:
    _bindings().cuLibraryUnload(lib)


def get_function(lib, name: str) -> int:
    """The kernel ``name`` as a CUfunction of the *current* context (which loads it there)."""
    drv = _bindings()
    kernel = check(drv.cuLibraryGetKernel(lib, name.encode()), f"cuLibraryGetKernel({name})")
    return int(check(drv.cuKernelGetFunction(kernel), f"cuKernelGetFunction({name})"))


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
    check(r.ctx_push(ctx), "cuCtxPushCurrent")
    try:
        return fn()
    finally:
        r.ctx_pop(ctypes.byref(ctypes.c_void_p()))


def stream_is_capturing(stream: int) -> bool:
    drv = _bindings()
    status = check(drv.cuStreamIsCapturing(drv.CUstream(stream)), "cuStreamIsCapturing")
    return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, for cuLaunchKernelEx."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint),
    ]


class _Raw:
    """Raw driver entry points for the hot path, resolved once through cuGetProcAddress."""

    def __init__(self):
        init()
        drv = _bindings()
        flags = drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        vp = ctypes.c_void_p

        def resolve(symbol: str, restype, *argtypes):
            pfn, _status = check(drv.cuGetProcAddress(symbol.encode(), 12000, flags), f"cuGetProcAddress({symbol})")
            return ctypes.CFUNCTYPE(restype, *argtypes)(int(pfn))

        i = ctypes.c_int
        self.ctx_get_current = resolve("cuCtxGetCurrent", i, ctypes.POINTER(vp))
        self.ctx_push = resolve("cuCtxPushCurrent", i, vp)
        self.ctx_pop = resolve("cuCtxPopCurrent", i, ctypes.POINTER(vp))
        self.launch_ex = resolve("cuLaunchKernelEx", i, vp, vp, vp, vp)


@lru_cache(maxsize=None)
def raw() -> _Raw:
    return _Raw()


def error_name(code: int) -> str:
    try:
        return _bindings().CUresult(code).name
    except Exception:
        return "CUresult"
