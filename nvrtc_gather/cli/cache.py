"""``nvrtc-gather cache list | verify | clear``: look after the disk cache.

    list    every entry: module, arch, size, whether it is intact, whether this install
            would use it (``stale``: left by another package or NVRTC version)
    verify  re-check every entry (exit 1 if any is bad, or the directory cannot be read
            or would not be used); ``--fix`` deletes the bad ones with their lock files
            (then exit 0 if all went, 1, naming each and why, if any could not be deleted)
    clear   remove every entry, lock file (orphans too) and leftover temp file, not the
            directory; exit 1, naming each file and why, if any could not be removed

They touch only the cache's own names (``{module}-{arch}-{key}.bin``, that + ``.lock``,
``.<entry>.XXXXXXXX.tmp``): other files and subdirectories in the directory are listed
as not the cache's and left alone. None of them creates the directory; none raises for a
bad entry."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from .. import settings
from ..jit import cubin_cache as cache_mod
from .text import human_size, table


KeyFor = Optional[Callable[[str, str], Optional[str]]]


def current_keys() -> KeyFor:
    """A function (module, arch) -> the key this install would use (None for a module it
    does not know), or None when NVRTC is missing (keys include its version)."""
    from ..errors import MissingDependencyError
    from ..jit import build, catalogue, compiler

    modules = {m.name: m for m in catalogue.ALL_MODULES}
    try:
        compiler.nvrtc_version()
    except MissingDependencyError:
        return None

    def key_for(module: str, arch: str) -> str | None:
        m = modules.get(module)
        return build.cache_key(m, compiler.Target(arch)) if m is not None else None
    return key_for


def _in_use(e: cache_mod.EntryInfo, key_for: KeyFor) -> str:
    if key_for is None or e.module is None:
        return "?"
    want = key_for(e.module, e.arch)
    return "?" if want is None else "yes" if want == e.key else "stale"


def _list(disk: cache_mod.DiskCache) -> int:
    entries = disk.entries()
    key_for = current_keys()
    if entries:
        table(("module", "arch", "size", "valid", "in use", "key"),
              [(e.module, e.arch, human_size(e.size), "yes" if e.valid else f"NO ({e.problem})",
                _in_use(e, key_for), e.key[:12]) for e in entries])
    total = sum(e.size for e in entries)
    print(f"{len(entries)} entries, {human_size(total)}, in {disk.directory}{_dir_note(disk)}")
    temps = disk.temp_files()
    if temps:
        print(f"{len(temps)} temp file(s) (a write in progress or a writer that died; "
              "ignored by readers, removed by `cache clear`)")
    orphans = disk.orphan_locks()
    if orphans:
        print(f"{len(orphans)} lock file(s) without an entry (harmless; removed by `cache clear`)")
    _print_foreign(disk)
    return 0


def _print_foreign(disk: cache_mod.DiskCache) -> None:
    foreign = disk.foreign()
    if foreign:
        names = ", ".join(p.name for p in foreign[:10]) + (", ..." if len(foreign) > 10 else "")
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


def _verify(disk: cache_mod.DiskCache, fix: bool) -> int:
    try:
        disk.listing()
    except FileNotFoundError:
        pass
    except OSError as exc:  # entries() would show none, as if all were well
        sys.stderr.write(f"error: cannot list {disk.directory} ({exc.strerror or exc}); make sure you own it "
                         "and may read it\n")
        return 1
    entries = disk.entries()
    bad = [e for e in entries if not e.valid]
    for e in bad:
        print(f"BAD {e.path.name}: {e.problem}")
    failed: list[tuple[str, str]] = []
    if fix and bad:
        removal = disk.remove_entries(e.path.name for e in bad)
        failed = removal.failed
        gone = set(removal.removed)
        print(f"deleted {sum(e.path.name in gone for e in bad)} of {len(bad)} bad entries "
              f"(and {sum(n.endswith(cache_mod.LOCK_SUFFIX) for n in gone)} lock file(s))")
    problem = disk.directory_problem() if disk.directory.exists() else None
    print(f"{len(entries) - len(bad)} of {len(entries)} entries intact in {disk.directory}")
    _print_foreign(disk)
    if problem:
        print(f"the directory would not be used: {problem}")
    if bad and not fix:
        print("run `nvrtc-gather cache verify --fix` to delete the bad entries (they are also replaced at next use)")
    _report_failures(failed, disk.directory, "nvrtc-gather cache verify --fix")
    return 1 if (bad and not fix) or failed or problem else 0


def _clear(disk: cache_mod.DiskCache) -> int:
    removal = disk.clear()
    print(f"removed {len(removal.removed)} file(s) from {disk.directory}")
    _print_foreign(disk)
    _report_failures(removal.failed, disk.directory, "nvrtc-gather cache clear")
    return 1 if removal.failed else 0


def _dir_note(disk: cache_mod.DiskCache) -> str:
    if not disk.directory.exists():
        return " (does not exist yet)"
    problem = disk.directory_problem()
    note = f" (not used: {problem})" if problem else ""
    if not settings.disk_cache_enabled():
        note += f" (disabled by {settings.DISABLE_CACHE_ENV})"
    return note


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nvrtc-gather cache", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,verify,clear}")
    parsers = {
        "list": sub.add_parser("list", help="list entries"),
        "verify": sub.add_parser("verify", help="re-check every entry; exit 1 if any is bad"),
        "clear": sub.add_parser("clear", help="remove entries, locks and temp files"),
    }
    for sp in parsers.values():
        sp.add_argument("--cache-dir", type=Path,
                        help=f"cache directory (default: ${settings.CACHE_DIR_ENV} or the per-user cache)")
    parsers["verify"].add_argument("--fix", action="store_true", help="delete bad entries (and their lock files)")
    args = p.parse_args(argv)
    directory = Path(os.path.abspath(args.cache_dir)) if args.cache_dir else settings.cache_dir()
    disk = cache_mod.DiskCache(directory)
    if args.action == "list":
        return _list(disk)
    if args.action == "verify":
        return _verify(disk, args.fix)
    return _clear(disk)


if __name__ == "__main__":
    sys.exit(main())
