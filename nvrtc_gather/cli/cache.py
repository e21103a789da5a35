"""``nvrtc-gather cache list | verify | clear``: look after the disk cache.

    list    every image file: module, arch, size, whether it is intact, whether this install
            would use it (``stale``: left by another package or NVRTC version)
    verify  re-check every image file (exit 1 if any is bad, or the directory cannot be read
            or would not be used) and name the stale ones; ``--fix`` deletes the bad ones
            with their lock files (then exit 0 if all went, 1, naming each and why, if any
            could not be deleted); ``--arch sm_90 ...`` also exits 1 unless every kernel the
            ops can load on a GPU of each arch is present and current (a serving process
            there compiles nothing); an ARCH that names no GPU arch exits 2
    clear   remove every image file, lock file (orphans too) and leftover temp file, not the
            directory; exit 1, naming each file and why, if any could not be removed

They touch only the cache's own names (``{module}-{arch}-{key}.bin``, that + ``.lock``,
``.<image>.XXXXXXXX.tmp``): other files and subdirectories in the directory are listed
as not the cache's and left alone. None of them creates the directory; none raises for a
bad file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Optional

from .. import settings
from ..jit import cubin_cache
from .text import help_text, human_size, table


KeyFor = Optional[Callable[[str, str], Optional[str]]]


def current_keys() -> KeyFor:
    """A function (module, arch) -> the key this install would use (None for a module it
    does not know), or None when NVRTC is missing (keys include its version)."""
    from ..errors import MissingDependencyError
    from ..jit import build, compiler, spec

    modules = {m.name: m for m in spec.registered()}
    try:
        compiler.nvrtc_version()
    except MissingDependencyError:
        return None

    def key_for(module: str, arch: str) -> str | None:
        m = modules.get(module)
        return build.cache_key(m, compiler.Target(arch)) if m is not None else None
    return key_for


def _in_use(e: cubin_cache.ImageFile, key_for: KeyFor) -> str:
    if key_for is None or e.module is None:
        return "?"
    want = key_for(e.module, e.arch)
    return "?" if want is None else "yes" if want == e.key else "stale"


def _list(disk: cubin_cache.DiskCache) -> int:
    scan = disk.scan()
    key_for = current_keys()
    if scan.images:
        table(("module", "arch", "size", "valid", "in use", "key"),
              [(i.module, i.arch, human_size(i.size), "yes" if i.valid else f"NO ({i.problem})",
                _in_use(i, key_for), i.key[:12]) for i in scan.images])
    total = sum(i.size for i in scan.images)
    print(f"{len(scan.images)} image file(s), {human_size(total)}, in {disk.directory}{_dir_note(disk)}")
    if scan.temps:
        print(f"{len(scan.temps)} temp file(s) (a write in progress or a writer that died; "
              "ignored by readers, removed by `cache clear`)")
    if scan.orphan_locks:
        print(f"{len(scan.orphan_locks)} lock file(s) without an image file (harmless; removed by `cache clear`)")
    _print_foreign(scan.foreign)
    return 0


def _print_foreign(foreign: list[str]) -> None:
    if foreign:
        names = ", ".join(foreign[:10]) + (", ..." if len(foreign) > 10 else "")
        print(f"{len(foreign)} other file(s) here are not the cache's and are left alone: {names}")


def _report_failures(failed: list[tuple[str, str]], directory: Path, again: str) -> None:
    """Each failure (file name and reason) on stderr, then what to do."""
    for name, why in failed:
        what = f"list {directory}" if name == "." else f"remove {directory / name}"
        sys.stderr.write(f"error: could not {what}: {why}\n")
    if failed:
        files = [n for n, _ in failed if n != "."]
        what = f"{len(files)} file(s) were not removed from {directory}" if files else f"{directory} was not cleared"
        sys.stderr.write(f"error: {what}; make sure you own it and may write to it (or fix the reasons "
                         f"above), then run `{again}` again\n")


def _verify(disk: cubin_cache.DiskCache, fix: bool, archs: list | None) -> int:
    scan = disk.scan()
    if scan.error is not None and not isinstance(scan.error, FileNotFoundError):  # not "all well"
        sys.stderr.write(f"error: cannot list {disk.directory} ({scan.error.strerror or scan.error}); make sure "
                         "you own it and may read it\n")
        return 1
    images = scan.images
    key_for = current_keys()
    bad = [i for i in images if not i.valid]
    stale = [i for i in images if i.valid and _in_use(i, key_for) == "stale"]
    for i in bad:
        print(f"BAD {i.path.name}: {i.problem}")
    for i in stale:
        print(f"STALE {i.path.name}: intact, but made by another nvrtc_gather or NVRTC version; this install "
              "never loads it")
    failed: list[tuple[str, str]] = []
    if fix and bad:
        removal = disk.remove_images(i.path.name for i in bad)
        failed = removal.failed
        gone = set(removal.removed)
        print(f"deleted {sum(i.path.name in gone for i in bad)} of {len(bad)} bad image file(s) "
              f"(and {sum(n.endswith(cubin_cache.LOCK_SUFFIX) for n in gone)} lock file(s))")
    problem = disk.directory_problem()
    if problem == cubin_cache.MISSING:
        problem = None
    print(f"{len(images) - len(bad)} of {len(images)} image files intact in {disk.directory}"
          + (f" ({len(stale)} of them stale: `nvrtc-gather cache clear`, then warm again)" if stale else "")
          + ("" if key_for is not None else " (NVRTC is missing, so which are current is unknown)"))
    _print_foreign(scan.foreign)
    if problem:
        print(f"the directory would not be used: {problem}")
    if bad and not fix:
        print("run `nvrtc-gather cache verify --fix` to delete the bad files (they are also replaced at next use)")
    _report_failures(failed, disk.directory, "nvrtc-gather cache verify --fix")
    serves = _check_serves(disk, images, archs, problem) if archs else True
    return 1 if (bad and not fix) or failed or problem or not serves else 0


def _targets(archs: list[str]):
    """``--arch`` as the targets a GPU of each arch loads, mapped as warmup maps them (and, as
    for warmup, an arch that cannot be read or mapped is a usage error: exit 2); None after a
    message on stderr."""
    from .warmup import parse_arch

    try:
        return list(dict.fromkeys(parse_arch(a) for a in archs))
    except ValueError as exc:
        sys.stderr.write(f"error: --arch: {exc}\n")
        return None


def _check_serves(disk: cubin_cache.DiskCache, images: list[cubin_cache.ImageFile], targets: list,
                  problem: str | None) -> bool:
    """Whether a process of this install, on a GPU of each target, finds every kernel the ops
    can load in this cache (so it compiles nothing): a module is there when ``images`` (the
    scan, verified) hold an intact file under its key."""
    from ..jit import build, spec

    intact = {i.key for i in images if i.valid}  # a key names one module and arch
    ok = problem is None
    for t in targets:
        missing = []
        modules = spec.registered()
        for m in modules:
            if build.cache_key(m, t) not in intact:
                missing.append(m.name)
        print(f"{t.arch}: {len(modules) - len(missing)} of {len(modules)} kernel modules present and current"
              + (f"; missing: {', '.join(missing)}" if missing else ""))
        ok &= not missing
    if ok:
        print(f"this cache serves {', '.join(t.arch for t in targets)} without compiling")
    else:
        arch_args = " ".join(t.arch for t in targets)
        print(f"this cache would NOT serve {', '.join(t.arch for t in targets)} without compiling: run "
              f"`nvrtc-gather warmup --arch {arch_args} --cache-dir {disk.directory}`"
              + (f" (and fix: {problem})" if problem else ""))
    return ok


def _clear(disk: cubin_cache.DiskCache) -> int:
    removal = disk.clear()
    print(f"removed {len(removal.removed)} file(s) from {disk.directory}")
    _print_foreign(disk.scan(verify=False).foreign)
    _report_failures(removal.failed, disk.directory, "nvrtc-gather cache clear")
    return 1 if removal.failed else 0


def _dir_note(disk: cubin_cache.DiskCache) -> str:
    problem = disk.directory_problem()
    if problem == cubin_cache.MISSING:
        note = " (does not exist yet)"
    else:
        note = f" (not used: {problem})" if problem else ""
    if not settings.disk_cache_enabled():
        note += f" (disabled by {settings.DISABLE_CACHE_ENV})"
    return note


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nvrtc-gather cache", description=help_text(__doc__))
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,verify,clear}")
    parsers = {
        "list": sub.add_parser("list", help="list image files"),
        "verify": sub.add_parser("verify", help="re-check every image file; exit 1 if any is bad"),
        "clear": sub.add_parser("clear", help="remove image files, locks and temp files"),
    }
    for sp in parsers.values():
        sp.add_argument("--cache-dir", type=str,  # (a str: Path("") would be ".")
                        help=f"cache directory (default, or empty: ${settings.CACHE_DIR_ENV} or the per-user cache)")
    parsers["verify"].add_argument("--fix", action="store_true", help="delete bad image files (and their lock files)")
    parsers["verify"].add_argument(
        "--arch", nargs="+", metavar="ARCH",
        help="also exit 1 unless every kernel the ops can load on a GPU of each ARCH (sm_90, 9.0, ...) is present "
             "and current, i.e. unless a serving process there compiles nothing")
    args = p.parse_args(argv)
    disk = cubin_cache.DiskCache(settings.cache_dir(args.cache_dir))
    if args.action == "list":
        return _list(disk)
    if args.action == "verify":
        targets = _targets(args.arch) if args.arch else None
        if args.arch and targets is None:
            return 2
        return _verify(disk, args.fix, targets)
    return _clear(disk)


if __name__ == "__main__":
    sys.exit(main())
