"""``nvrtc-gather warmup``: compile every kernel module for the chosen archs into the disk
cache, with no GPU needed, so that no process of a fleet compiles at first use.

    nvrtc-gather warmup --arch sm_90 sm_100 [--cache-dir DIR] [-j N]
    nvrtc-gather warmup --all          # every arch this NVRTC supports
    nvrtc-gather warmup                # the archs of the GPUs present

Guarantees:
- every image goes through ``build.build_image`` (the one compile and cache path), so
  it lands under exactly the key a later process looks up;
- an arch given as a GPU (sm_90, 90, 9.0, sm_90a) is warmed as ``compiler.pick_target`` maps
  it, i.e. what such a GPU will actually load (sm_90a -> sm_90; a GPU newer than NVRTC gets
  PTX), and the output says so for each arch it maps;
- an image is reported ``compiled`` or ``cached`` only after it was read back from the
  cache directory and verified; the exit status is 0 only if every image is there
  (1: some failed, 2: bad arguments, no arch to warm, or NVRTC_GATHER_DISABLE_JIT set: warming
  is compiling).
Builds run on threads: NVRTC releases the GIL (measured: 13 archs, 2 threads on 2 cores,
1.8x faster than serial, the same as 2 processes), and threads need no start-up."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from .. import settings
from ..errors import MissingDependencyError
from ..jit import build, compiler, cubin_cache, spec
from .text import Progress, collected_warnings, help_text, human_size, table

_ARCH = re.compile(r"^(?:(sm|compute)_?(\d{2,3})([af]?)|(\d{1,2})\.(\d)([af]?)|(\d{2,3})([af]?))$")


def spelled_arch(text: str) -> tuple[str, int, str]:
    """('sm' | 'compute', compute capability, suffix 'a' | 'f' | '') from 'sm_90', '90', '9.0',
    'compute_90', 'sm_90a', ... as written, not yet mapped. Raises ValueError."""
    m = _ARCH.match(text.strip().lower())
    if not m:
        raise ValueError(f"cannot read arch {text!r}: write it as sm_90, 90, 9.0 or compute_90")
    kind, num, suffix, major, minor, suffix2, plain, suffix3 = m.groups()
    cc = int(num) if num else int(major) * 10 + int(minor) if major else int(plain)
    return kind or "sm", cc, suffix or suffix2 or suffix3 or ""


def parse_arch(text: str, supported: tuple[int, ...] | None = None) -> compiler.Target:
    """The target a GPU of arch ``text`` ('sm_90', '90', '9.0', 'sm_90a', ...) loads, as the
    runtime picks it (compiler.pick_target: the plain sm_XY cubin; PTX for a GPU newer than
    NVRTC). An arch-specific suffix ('sm_90a', '10.0f') names the same GPU, which loads the
    plain sm_XY: the ops use no arch-specific instructions. 'compute_XY' (PTX) is taken as
    given. Raises ValueError with a message for the user."""
    kind, cc, suffix = spelled_arch(text)
    if kind == "compute":
        return compiler.Target(f"compute_{cc}{suffix}")
    try:
        return compiler.pick_target(cc, supported)
    except MissingDependencyError as exc:
        raise ValueError(str(exc)) from None


def gpu_targets() -> list[compiler.Target]:
    """What the GPUs present will load. Raises MissingDependencyError without a driver."""
    from ..jit import driver

    return [compiler.pick_target(driver.capability(i)) for i in range(driver.device_count())]


@dataclass(frozen=True)
class Row:
    arch: str
    module: str
    size: int
    status: str      # compiled | cached | FAILED
    seconds: float
    error: str = ""


def warm_one(module: spec.KernelModule, target: compiler.Target, disk: cubin_cache.DiskCache) -> Row:
    """Build one image through build_image and check it can be read back. Never raises."""
    t0 = time.perf_counter()
    try:
        built = build.build_image(module, target, disk=disk, compile_ok=True)  # warming is compiling
        if disk.get(build.cache_name(module, target), built.key) is None:
            raise OSError(f"compiled, but not stored in {disk.directory} ({disk.problem or 'write failed'})")
        status, size, error = ("cached" if built.from_cache else "compiled"), len(built.image), ""
    except Exception as exc:  # CompileError, MissingDependencyError, OSError: report, keep going
        status, size, error = "FAILED", 0, f"{type(exc).__name__}: {exc}"
    return Row(target.arch, module.name, size, status, time.perf_counter() - t0, error)


def warm(targets, disk: cubin_cache.DiskCache, modules=None, jobs: int | None = None,
         progress: Progress | None = None) -> list[Row]:
    """Every module of ``modules`` (default: every registered one) for every target, in
    parallel; rows in (target, module) order."""
    tasks = [(m, t) for t in targets for m in (modules if modules is not None else spec.registered())]
    jobs = max(1, min(len(tasks), jobs or os.cpu_count() or 1))
    rows: dict[int, Row] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="nvrtc-gather-warmup") as pool:
        futures = {pool.submit(warm_one, m, t, disk): i for i, (m, t) in enumerate(tasks)}
        for fut in as_completed(futures):
            row = rows[futures[fut]] = fut.result()
            if progress is not None:
                progress.step(f"{row.arch} {row.module} {row.status}")
    return [rows[i] for i in range(len(tasks))]


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def torch_arch_list() -> list[str]:
    """The archs of $TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", "8.0 9.0a"), the variable torch's own
    extension builds read; "+PTX" is dropped (a GPU arch is warmed as that GPU loads it)."""
    text = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    return [a.strip().removesuffix("+PTX").removesuffix("+ptx") for a in re.split(r"[;\s,]+", text) if a.strip()]


def _targets(args, out) -> list[compiler.Target] | None:
    """The targets asked for (--all, --arch, else $TORCH_CUDA_ARCH_LIST, else the GPUs present),
    deduplicated in order; None (after a message) if none."""
    if args.all:
        return [compiler.Target(f"sm_{a}") for a in compiler.supported_archs()]
    archs = args.arch or torch_arch_list()
    if archs:
        if not args.arch:
            out.write(f"archs from TORCH_CUDA_ARCH_LIST: {' '.join(archs)}\n")
        supported = compiler.supported_archs()
        targets = []
        for text in archs:
            t = parse_arch(text, supported)
            kind, cc, suffix = spelled_arch(text)
            if t.arch != f"{kind}_{cc}{suffix}":  # remapped, not just respelled
                out.write(f"note: {text} is warmed as {t.arch}, what a GPU of compute capability {cc // 10}.{cc % 10} "
                          f"loads with NVRTC {'.'.join(map(str, compiler.nvrtc_version()))}"
                          + (" (the ops use no arch-specific instructions)" if suffix else "") + "\n")
            targets.append(t)
        return list(dict.fromkeys(targets))
    try:
        targets = gpu_targets()
    except MissingDependencyError as exc:
        sys.stderr.write(f"error: no GPU to take the archs from ({exc}).\n"
                         "Pass --arch (e.g. --arch sm_90 sm_100) or --all to warm the cache without a GPU.\n")
        return None
    if not targets:
        sys.stderr.write("error: the driver sees no GPU. Pass --arch (e.g. --arch sm_90) or --all.\n")
        return None
    return list(dict.fromkeys(targets))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nvrtc-gather warmup", description=help_text(__doc__))
    which = p.add_mutually_exclusive_group()
    which.add_argument("--arch", nargs="+", metavar="ARCH", help="archs to compile for: sm_90, 90, 9.0, compute_90 ...")
    which.add_argument("--all", action="store_true", help="every arch this NVRTC can compile for")
    p.add_argument("--cache-dir", type=str,  # (a str: Path("") would be ".")
                   help=f"cache directory (default, or empty: ${settings.CACHE_DIR_ENV} or the per-user cache)")
    p.add_argument("-j", "--jobs", type=positive_int, help="parallel compiles (default: CPU count)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)

    out = sys.stdout
    if settings.jit_disabled():  # a bad value raises InvalidSettingError: the CLI names the variable, exits 2
        sys.stderr.write(f"error: warmup compiles, and {settings.DISABLE_JIT_ENV} forbids compiling in this "
                         f"process; unset it for the warmup ({settings.DISABLE_JIT_ENV}=0 nvrtc-gather warmup ...)\n")
        return 2
    if not args.cache_dir and not settings.disk_cache_enabled():
        sys.stderr.write(f"error: the disk cache is disabled by {settings.DISABLE_CACHE_ENV}; "
                         "unset it, or pass --cache-dir\n")
        return 2
    directory = settings.cache_dir(args.cache_dir)
    try:
        targets = _targets(args, out)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except MissingDependencyError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    if targets is None:
        return 2

    disk = cubin_cache.DiskCache(directory)
    with collected_warnings() as caught:  # the cache's warnings, printed plainly below
        if not disk.usable():
            sys.stderr.write(f"error: cannot use the cache directory {directory}: {disk.problem}\n")
            return 1
        modules = spec.registered()
        out.write(f"warming {len(targets) * len(modules)} images ({len(modules)} module(s) x "
                  f"{len(targets)} arch(s)) in {directory}\n")
        out.flush()
        t0 = time.perf_counter()
        progress = Progress(len(targets) * len(modules), enabled=not args.no_progress)
        try:
            rows = warm(targets, disk, modules, args.jobs, progress)
        finally:
            progress.close()
        wall = time.perf_counter() - t0
    table(("arch", "module", "size", "status", "time"),
          [(r.arch, r.module, human_size(r.size) if r.size else "-", r.status, f"{r.seconds:.2f} s") for r in rows], out)
    failed = [r for r in rows if r.status == "FAILED"]
    n_compiled = sum(r.status == "compiled" for r in rows)
    out.write(f"{len(rows)} images: {n_compiled} compiled, {len(rows) - n_compiled - len(failed)} already cached, "
              f"{len(failed)} failed, in {wall:.1f} s\n")
    out.flush()  # the table first, then warnings and errors on stderr
    for w in dict.fromkeys(caught):
        sys.stderr.write(f"warning: {w}\n")
    for r in failed:
        sys.stderr.write(f"FAILED {r.arch} {r.module}: {r.error}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
