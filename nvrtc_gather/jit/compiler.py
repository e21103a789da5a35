"""NVRTC: CUDA C source -> cubin (or PTX) for one target arch. Needs no GPU.

Everything that talks to NVRTC lives here; the rest of the package sees
``compile_module(module, target) -> CompiledCode`` and ``pick_target(cc)``."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache

from ..errors import CompileError, MissingDependencyError
from . import cuda_packages, sources
from .spec import KernelModule

BASE_OPTIONS: tuple[str, ...] = ("--std=c++17", "-lineinfo")

# The directory NVRTC is told the sources sit in (no such directory needs to exist).
# -lineinfo records each file's path in the image (DWARF line table, PTX .file), and NVRTC
# makes a relative name absolute with the process's working directory, so a plain
# "gather_indexer_k.cu" made the bytes depend on the cwd and leaked it into the cache. A
# fixed absolute name for the program, and a ``#line`` naming each header the same way
# (headers are found by their bare #include name, so that name cannot change), make the
# image a function of the cache key alone; NVRTC's messages say e.g.
# /nvrtc_gather/cuda_src/gather_indexer_k.cu(26) for cuda_src/gather_indexer_k.cu.
SOURCE_ROOT = "/nvrtc_gather/cuda_src"
_log = logging.getLogger(__name__)


def _install_hint() -> str:
    return "install NVRTC for Python: " + cuda_packages.install_hint()


@dataclass(frozen=True)
class Target:
    """What to compile for. ``arch`` is the NVRTC -arch value: 'sm_90' gives a cubin,
    'compute_90' gives PTX that the driver JIT-compiles at load."""

    arch: str

    @property
    def is_ptx(self) -> bool:
        return self.arch.startswith("compute_")


@dataclass(frozen=True)
class CompiledCode:
    target: Target
    image: bytes  # cubin, or NUL-terminated PTX
    log: str


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # cuda-bindings itself is missing
        raise MissingDependencyError(f"cuda.bindings is not importable ({exc}); {_install_hint()}") from exc
    return nvrtc


def _check(nvrtc, result, what: str):
    """Unpack a cuda.bindings NVRTC return tuple, raising on error."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err.name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def _call(fn, *args):
    """Call an NVRTC binding; a missing libnvrtc surfaces here as a RuntimeError from
    cuda.pathfinder (DynamicLibNotFoundError), which we turn into an install hint."""
    try:
        return fn(*args)
    except RuntimeError as exc:
        if type(exc).__name__ == "DynamicLibNotFoundError" or "nvrtc" in str(exc).lower():
            raise MissingDependencyError(f"the NVRTC library could not be loaded ({exc}); {_install_hint()}") from exc
        raise


@lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    major, minor = _check(nvrtc, _call(nvrtc.nvrtcVersion), "nvrtcVersion")
    return int(major), int(minor)


@lru_cache(maxsize=None)
def compiler_identity() -> str:
    """Which NVRTC compiles here, as the cache key records it. Loading NVRTC costs ~50 ms,
    which a first call on a warm cache should not pay just to learn a version, so when the
    one NVRTC wheel installed is of cuda-bindings' major (cu12 or cu13: what cuda.pathfinder
    then loads) its exact version is read from its metadata; otherwise (no wheel, a wheel of
    another major, or both) the loaded library is asked for its major.minor."""
    wheels = cuda_packages.nvrtc_wheels()
    bindings = cuda_packages.bindings_major()
    if len(wheels) == 1 and bindings in wheels:
        dist, version = wheels[bindings]
        return f"{dist} {version}"
    return "nvrtc %d.%d" % nvrtc_version()


@lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities NVRTC can emit a cubin for, e.g. (75, 80, 86, ..., 120)."""
    nvrtc = _nvrtc()
    archs = _check(nvrtc, _call(nvrtc.nvrtcGetSupportedArchs), "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def pick_target(capability: int, supported: tuple[int, ...] | None = None) -> Target:
    """Target for a GPU of compute capability ``capability`` (e.g. 90).

    The exact sm_XY when NVRTC knows it; else the newest known sm_XZ of the same
    major with Z < Y (cubins run on later minors); else, for a GPU newer than NVRTC,
    PTX for the newest arch NVRTC knows, which the driver JIT-compiles."""
    known = supported if supported is not None else supported_archs()
    if capability in known:
        return Target(f"sm_{capability}")
    same_major = [a for a in known if a // 10 == capability // 10 and a < capability]
    if same_major:
        return Target(f"sm_{max(same_major)}")
    older = [a for a in known if a < capability]
    if not older:
        raise MissingDependencyError(
            f"this NVRTC ({'.'.join(map(str, nvrtc_version()))}) cannot compile for compute capability "
            f"{capability // 10}.{capability % 10} (it supports {', '.join(f'sm_{a}' for a in known)}); "
            "the GPU is older than the oldest arch it supports: install CUDA 12's NVRTC, which still supports it: "
            f"{cuda_packages.driver_match_hint(12)}"
        )
    return Target(f"compute_{max(older)}")


def module_options(module: KernelModule, target: Target) -> tuple[str, ...]:
    """The full option list: part of the cache key, so it must be deterministic."""
    extra = tuple(o for o in module.options if not o.startswith("-D"))
    return BASE_OPTIONS + module.defines + extra + (f"--gpu-architecture={target.arch}",)


def nvrtc_source_name(name: str) -> str:
    """The path NVRTC is given for the file ``name`` of cuda_src/ (see SOURCE_ROOT)."""
    return f"{SOURCE_ROOT}/{name}"


def compile_module(module: KernelModule, target: Target) -> CompiledCode:
    """Compile one kernel module. Raises CompileError with NVRTC's log on failure. The
    image depends only on what the cache key holds (not on the working directory)."""
    nvrtc = _nvrtc()
    src = sources.module_source(module).encode()
    hdrs = sources.headers()
    names = [n.encode() for n in hdrs]
    texts = [f'#line 1 "{nvrtc_source_name(n)}"\n{t}'.encode() for n, t in hdrs.items()]
    prog = _check(
        nvrtc,
        _call(nvrtc.nvrtcCreateProgram, src, nvrtc_source_name(module.source).encode(), len(hdrs), texts, names),
        "nvrtcCreateProgram",
    )
    try:
        opts = [o.encode() for o in module_options(module, target)]
        (err,) = _call(nvrtc.nvrtcCompileProgram, prog, len(opts), opts)
        log = _program_log(nvrtc, prog)
        if log:
            _log.debug("NVRTC log for %s (%s):\n%s", module.name, target.arch, log)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC could not compile {module.source} for {target.arch} ({err.name})", log)
        if target.is_ptx:
            size = _check(nvrtc, nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        else:
            size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            if size == 0:  # NVRTC reports no error for a virtual arch; never store an empty image
                raise CompileError(f"NVRTC produced no cubin for {target.arch}", log)
            buf = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        return CompiledCode(target=target, image=bytes(buf), log=log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program_log(nvrtc, prog) -> str:
    size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    if size <= 1:
        return ""
    buf = b" " * size
    _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.rstrip(b"\0 ").decode(errors="replace")
