"""From a KernelModule to GPU code: the cache key, then a verified file of the cubin cache or a
fresh NVRTC compile that is published there. Needs no GPU: the warmup tool and the runtime
(runtime.py, which loads what this builds) both come here.

- ``build_image(module, target)``: the image for one target, from the cache or NVRTC;
- ``image_for(module, capability, load)``: the one way a GPU gets its image: the target it
  loads (the cached cubin of its exact sm_XY without loading NVRTC, else compiler.pick_target's
  choice), built or read, handed to ``load``; a cached image the driver refuses is discarded,
  compiled afresh, published and loaded once more.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from .. import settings
from .._version import __version__
from ..errors import CacheLocationError, CudaError, JitDisabledError
from . import compiler, cubin_cache, sources
from .spec import KernelModule

log = logging.getLogger(__name__)
Loaded = TypeVar("Loaded")

# Counters for tests and the CLI: how often NVRTC ran, the disk served, the driver loaded.
stats = {"compiles": 0, "disk_hits": 0, "loads": 0}
_stats_lock = threading.Lock()  # the warmup tool builds from several threads


def count(what: str) -> None:
    with _stats_lock:
        stats[what] += 1


def cache_key(module: KernelModule, target: compiler.Target) -> str:
    """Everything that shapes the GPU code, and nothing that depends on where we are installed."""
    fields: list[tuple[str, str | bytes]] = [
        ("schema", str(cubin_cache.SCHEMA)),
        ("package", __version__),
        ("module", module.name),
        ("source_name", compiler.nvrtc_source_name(module.source)),  # the path -lineinfo records
        ("source", sources.module_source(module)),
    ]
    for name, text in sources.headers().items():
        fields += [("header_name", name), ("header", text)]
    fields += [("option", o) for o in compiler.module_options(module, target)]
    fields += [
        ("arch", target.arch),
        ("nvrtc", compiler.compiler_identity()),
        ("kernels", ",".join(module.kernels)),
    ]
    return cubin_cache.make_key(fields)


def cache_name(module: KernelModule, target: compiler.Target) -> str:
    """The name of the module's cache file for ``target``, without its key."""
    return f"{module.name}-{target.arch}"


@dataclass(frozen=True)
class BuildResult:
    image: bytes
    key: str
    from_cache: bool


def build_image(module: KernelModule, target: compiler.Target, disk: cubin_cache.DiskCache | None = None,
                use_default_cache: bool = True, compile_ok: bool | None = None) -> BuildResult:
    """GPU code for ``module`` on ``target``: a verified cache file, or a fresh compile that
    is then published. Raises CompileError / MissingDependencyError; never returns a bad image.
    A bad, foreign or unreadable file is a miss; an unusable disk means compile-only (the
    cache warns once). Thread- and process-safe; the per-file lock only saves compiles.
    ``compile_ok`` (default: unless NVRTC_GATHER_DISABLE_JIT is set) False makes a miss raise
    JitDisabledError instead of compiling."""
    key = cache_key(module, target)
    if disk is None and use_default_cache:
        disk = cubin_cache.current()
    name = cache_name(module, target)
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


def image_for(module: KernelModule, capability: int, load: Callable[[bytes], Loaded]) -> Loaded:
    """``load(image)`` of the image a GPU of compute capability ``capability`` runs, and its
    result. ``load`` raises CudaError when the driver refuses the image. The cached cubin for
    the GPU's exact sm_XY is taken as it is, read once, without loading NVRTC to ask which
    archs it supports (~50 ms of a warm first call); otherwise compiler.pick_target chooses.
    A cached image the driver refuses is replaced by a fresh compile, once; a fresh compile it
    refuses raises."""
    disk = cubin_cache.current()
    target, built = compiler.Target(f"sm_{capability}"), None
    if disk is not None:
        key = cache_key(module, target)
        image = _from_disk(disk, cache_name(module, target), key)
        if image is not None:
            built = BuildResult(image, key, True)
    if built is None:
        target = compiler.pick_target(capability)
        built = build_image(module, target, disk=disk, use_default_cache=False)
    try:
        return load(built.image)
    except CudaError as exc:
        if not built.from_cache:
            raise
        log.warning("nvrtc_gather: the driver refused the cached %s image (%s); compiling it afresh",
                    cache_name(module, target), exc)
    if disk is not None:
        disk.discard(cache_name(module, target), built.key)
    image = _compile(module, target, disk)
    if disk is not None:
        disk.put(cache_name(module, target), built.key, image)
    return load(image)


def _from_disk(disk: cubin_cache.DiskCache, name: str, key: str) -> bytes | None:
    image = disk.get(name, key)
    if image is not None:
        count("disk_hits")
        log.debug("%s: read from the kernel cache %s", name, disk.directory)
    return image


def _compile(module: KernelModule, target: compiler.Target, disk: cubin_cache.DiskCache | None,
             compile_ok: bool | None = None) -> bytes:
    if not (compile_ok if compile_ok is not None else not settings.jit_disabled()):
        if disk is None:
            raise JitDisabledError(
                f"{settings.DISABLE_JIT_ENV} is set and no disk cache is in use ({_no_cache_reason()}), so the "
                f"{module.name} kernels for {target.arch} cannot be read from one; point {settings.CACHE_DIR_ENV} "
                f"at a cache warmed with: nvrtc-gather warmup --arch {target.arch} --cache-dir DIR")
        raise JitDisabledError(
            f"{settings.DISABLE_JIT_ENV} is set and the {module.name} kernels for {target.arch} are not in the "
            f"kernel cache at {disk.directory}; warm it first: nvrtc-gather warmup --arch {target.arch} "
            f"--cache-dir {disk.directory}")
    count("compiles")
    t0 = time.perf_counter()
    image = compiler.compile_module(module, target).image
    log.info("compiled %s for %s in %.0f ms (%s)", module.name, target.arch, (time.perf_counter() - t0) * 1e3,
             f"cached in {disk.directory}" if disk is not None and disk.usable()
             else f"kept in memory: {disk.problem}" if disk is not None else "disk cache off: kept in memory")
    return image


def _no_cache_reason() -> str:
    if not settings.disk_cache_enabled():
        return f"{settings.DISABLE_CACHE_ENV} is set"
    try:
        settings.cache_dir()
    except CacheLocationError as exc:
        return str(exc)
    return "the disk cache was not used for this build"
