"""Exceptions raised by nvrtc_gather besides the ValueError/TypeError of bad input."""


class NvrtcGatherError(RuntimeError):
    """Base class for runtime failures of the compile / cache / launch machinery."""


class MissingDependencyError(NvrtcGatherError):
    """NVRTC, the CUDA driver or a Python package is missing; the message says what to install."""


class CompileError(NvrtcGatherError):
    """NVRTC rejected a kernel source. ``log`` holds the compiler's own output."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(f"{message}\n--- NVRTC log ---\n{log}" if log else message)
        self.log = log


class CudaError(NvrtcGatherError):
    """A CUDA driver call failed. ``code`` is the CUresult as an int."""

    def __init__(self, call: str, code: int, name: str = "", hint: str = ""):
        msg = f"{call} failed: {name or 'CUresult'} ({code})"
        if hint:
            msg += f". {hint}"
        super().__init__(msg)
        self.call = call
        self.code = code


class CaptureError(NvrtcGatherError):
    """A kernel would have to be compiled or loaded while a CUDA graph is being captured."""


class JitDisabledError(NvrtcGatherError):
    """NVRTC_GATHER_DISABLE_JIT is set and a kernel is not in the disk cache; the message names
    the warmup command that puts it there."""


class InvalidSettingError(NvrtcGatherError, ValueError):
    """An NVRTC_GATHER_* environment variable holds a value it does not accept; the message
    names the variable and the values it takes."""


class CacheLocationError(NvrtcGatherError):
    """The kernel cache directory cannot be determined (a ``~`` that does not expand, a user
    with no home directory). The ops fall back to memory with one warning; the CLI says what
    to set."""
