"""From a KernelModule to launchable functions on a device: compile (or take from the
disk cache), load, and keep in memory. The one path every kernel goes through.

- ``build_image(module, target)``: the GPU code for a target, from the disk cache or
  NVRTC (needs no GPU; the warmup tool uses it).
- ``functions(module, device)``: CUfunction handles of the module's kernels in that
  device's primary context, built on first use and kept for the process.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from . import cache as cache_mod
from . import compiler, driver, settings, sources
from ._version import __version__
from .errors import CaptureError, CudaError, JitDisabledError
from .kernels import KernelModule

log = logging.getLogger(__name__)

# Counters for tests and the CLI: how often NVRTC ran, how often the disk served.
stats = {"compiles": 0, "disk_hits": 0, "loads": 0}
_stats_lock = threading.Lock()  # the warmup tool builds from several threads


def _count(what: str) -> None:
    with _stats_lock:
        stats[what] += 1


_lock = threading.RLock()
_libraries: dict[tuple[str, str], object] = {}       # (module, arch) -> CUlibrary
_functions: dict[tuple[str, int], dict[str, int]] = {}  # (module, device) -> name -> CUfunction


def cache_key(module: KernelModule, target: compiler.Target) -> str:
    """Everything that shapes the GPU code, and nothing that depends on where we are installed."""
    fields: list[tuple[str, str | bytes]] = [
        ("schema", str(cache_mod.SCHEMA)),
        ("package", __version__),
        ("module", module.name),
        ("source_name", compiler.nvrtc_source_name(module.source)),  # the path -lineinfo records
        ("source", sources.read_source(module.source)),
    ]
    for name, text in sources.headers().items():
        fields += [("header_name", name), ("header", text)]
    fields += [("option", o) for o in compiler.module_options(module, target)]
    fields += [
        ("arch", target.arch),
        ("nvrtc", compiler.compiler_identity()),
        ("kernels", ",".join(module.kernels)),
    ]
    return cache_mod.make_key(fields)


def entry_name(module: KernelModule, target: compiler.Target) -> str:
    return f"{module.name}-{target.arch}"


@dataclass(frozen=True)
class BuildResult:
    image: bytes
    key: str
    from_cache: bool


def build_image(module: KernelModule, target: compiler.Target, disk: cache_mod.DiskCache | None = None,
                use_default_cache: bool = True, compile_ok: bool | None = None) -> BuildResult:
    """GPU code for ``module`` on ``target``: a verified disk entry, or a fresh compile that
    is then published. Raises CompileError / MissingDependencyError; never returns a bad image.
    A bad, foreign or unreadable entry is a miss; an unusable disk means compile-only (the
    cache warns once). Thread- and process-safe; the per-entry lock only saves compiles.
    ``compile_ok`` (default: unless NVRTC_GATHER_DISABLE_JIT is set) False makes a miss raise
    JitDisabledError instead of compiling."""
    key = cache_key(module, target)
    if disk is None and use_default_cache:
        disk = cache_mod.current()
    name = entry_name(module, target)
    if disk is not None:
        image = _from_disk(disk, name, key)
        if image is not None:
            return BuildResult(image, key, True)
        with disk.lock(name, key):
            image = _from_disk(disk, name, key)  # another process may have published it meanwhile
            if image is not None:
                return BuildResult(image, key, True)
            image = _compile(module, target, disk, compile_ok)
            disk.put(name, key, image)
            return BuildResult(image, key, False)
    return BuildResult(_compile(module, target, None, compile_ok), key, False)


def _from_disk(disk: cache_mod.DiskCache, name: str, key: str) -> bytes | None:
    image = disk.get(name, key)
    if image is not None:
        _count("disk_hits")
        log.debug("%s: read from the kernel cache %s", name, disk.directory)
    return image


def _compile(module: KernelModule, target: compiler.Target, disk: cache_mod.DiskCache | None,
             compile_ok: bool | None = None) -> bytes:
    if not (compile_ok if compile_ok is not None else not settings.jit_disabled()):
        where = disk.directory if disk is not None else settings.cache_dir()
        raise JitDisabledError(
            f"{settings.DISABLE_JIT_ENV} is set and the {module.name} kernels for {target.arch} are not in the "
            f"kernel cache at {where}; warm it first: nvrtc-gather warmup --arch {target.arch} --cache-dir {where}")
    _count("compiles")
    t0 = time.perf_counter()
    image = compiler.compile_module(module, target).image
    log.info("compiled %s for %s in %.0f ms (%s)", module.name, target.arch, (time.perf_counter() - t0) * 1e3,
             f"cached in {disk.directory}" if disk is not None else "disk cache off: kept in memory")
    return image


def _load(module: KernelModule, target: compiler.Target, device: int, image: bytes | None) -> dict[str, int]:
    """Load (or reuse) the library for (module, arch) and fetch its kernels in ``device``'s
    context. Loading is lazy in the driver: a bad image may only fail at the fetch."""
    lk = (module.name, target.arch)
    lib = _libraries.get(lk)
    fresh = lib is None
    if fresh:
        lib = driver.load_library(image)
        _count("loads")
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


def _build_and_load(module: KernelModule, target: compiler.Target, device: int,
                    built: BuildResult | None = None) -> dict[str, int]:
    """Load ``built`` (or build the image now); a cached image that fails to load is
    discarded, compiled afresh and replaced, once."""
    if (module.name, target.arch) in _libraries:
        return _load(module, target, device, None)
    built = built or build_image(module, target)
    try:
        return _load(module, target, device, built.image)
    except CudaError:
        if not built.from_cache:
            raise
    disk = cache_mod.current()
    name = entry_name(module, target)
    if disk is not None:
        disk.discard(name, built.key)
    image = _compile(module, target, disk)
    if disk is not None:
        disk.put(name, built.key, image)
    return _load(module, target, device, image)


def _cached_exact(module: KernelModule, capability: int) -> tuple[compiler.Target, BuildResult | None]:
    """The target for a GPU, with its image when the disk cache holds a cubin for the GPU's
    exact sm_XY: that is taken as it is, read once, without loading NVRTC to ask which
    archs it supports (~50 ms of a warm first call). Otherwise compiler.pick_target's
    target and no image yet."""
    exact = compiler.Target(f"sm_{capability}")
    disk = cache_mod.current()
    if disk is not None:
        key = cache_key(module, exact)
        image = _from_disk(disk, entry_name(module, exact), key)
        if image is not None:
            return exact, BuildResult(image, key, True)
    return compiler.pick_target(capability), None


def functions(module: KernelModule, device: int, stream: int = 0) -> dict[str, int]:
    """name -> CUfunction for ``device``'s primary context. The first call per (module,
    device) compiles/loads; it refuses to do so while ``stream`` is capturing a CUDA graph."""
    fk = (module.name, device)
    fns = _functions.get(fk)
    if fns is not None:
        return fns
    with _lock:
        fns = _functions.get(fk)
        if fns is not None:
            return fns
        if stream and driver.stream_is_capturing(stream):
            raise CaptureError(
                f"nvrtc_gather's {module.name} kernels are not loaded on cuda:{device} yet and the stream is "
                f"capturing a CUDA graph; call nvrtc_gather.preload({device}) (or run the op once) before capture"
            )
        target, built = _cached_exact(module, driver.capability(device))
        fns = _build_and_load(module, target, device, built)
        _functions[fk] = fns
        return fns


def preload(device: int | None = None, modules=None) -> None:
    """Compile/load every kernel for ``device`` (default: every visible GPU) now, so that
    no later call has to, e.g. before capturing CUDA graphs."""
    from .kernels import ALL_MODULES

    devices = [device] if device is not None else range(driver.device_count())
    for d in devices:
        for m in modules or ALL_MODULES:
            functions(m, d)
