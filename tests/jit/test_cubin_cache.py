"""The disk cache, without a GPU: keys, publishing, verification, placement, processes."""
import contextlib
import dataclasses
import logging
import os
import re
import stat
import subprocess
import sys

import pytest

from nvrtc_gather.jit import build, compiler, cubin_cache, runtime, sources
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather import kernels

T90 = compiler.Target("sm_90")

@contextlib.contextmanager
def logged_warning(caplog, match):
    """Exactly one WARNING from the package inside, matching ``match``; none if ``match`` is None."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nvrtc_gather"):
        yield
    got = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if match is None:
        assert got == [], got
    else:
        assert len(got) == 1 and re.search(match, got[0]), got



@pytest.fixture
def disk(tmp_path):
    return cubin_cache.DiskCache(tmp_path / "c")


def test_key_is_length_prefixed_and_stable():
    assert cubin_cache.make_key([("a", "bc")]) != cubin_cache.make_key([("ab", "c")])
    assert cubin_cache.make_key([("a", "b"), ("c", "")]) != cubin_cache.make_key([("a", "bc")])
    assert cubin_cache.make_key([("a", "x")]) == cubin_cache.make_key([("a", b"x")])


def test_key_changes_with_source_options_and_arch(monkeypatch):
    base = build.cache_key(gather_kernels.MODULES[16], T90)
    assert build.cache_key(gather_kernels.MODULES[16], T90) == base
    assert build.cache_key(gather_kernels.MODULES[16], compiler.Target("sm_80")) != base
    m2 = dataclasses.replace(gather_kernels.MODULES[16], options=("-DX=1",))
    assert build.cache_key(m2, T90) != base
    real = sources.read_source
    monkeypatch.setattr(sources, "read_source", lambda n: real(n) + "\n// edited")
    assert build.cache_key(gather_kernels.MODULES[16], T90) != base


def test_key_has_no_install_path(monkeypatch, tmp_path):
    """The key depends on file contents, not where the package is installed."""
    base = build.cache_key(gather_kernels.MODULES[16], T90)
    copy = tmp_path / "elsewhere" / "cuda_src"
    copy.mkdir(parents=True)
    for p in sources.source_dir().iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(sources, "source_dir", lambda: copy)
    sources.read_source.cache_clear()
    try:
        assert build.cache_key(gather_kernels.MODULES[16], T90) == base
    finally:
        sources.read_source.cache_clear()


def test_roundtrip_and_permissions(disk):
    key = "ab" * 32
    assert disk.get("m", key) is None
    assert disk.put("m", key, b"payload")
    assert disk.get("m", key) == b"payload"
    assert stat.S_IMODE(disk.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(disk.path_for("m", key).stat().st_mode) == 0o600
    assert not [p for p in disk.directory.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("damage", ["empty", "truncated", "random", "other_key", "flipped_byte"])
def test_any_bad_entry_is_a_miss(disk, damage):
    key, other = "cd" * 32, "ef" * 32
    disk.put("m", key, b"x" * 1000)
    path = disk.path_for("m", key)
    blob = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(blob[:-10])
    elif damage == "random":
        path.write_bytes(os.urandom(len(blob)))
    elif damage == "other_key":
        disk.put("m", other, b"y" * 1000)
        os.replace(disk.path_for("m", other), path)
    elif damage == "flipped_byte":
        path.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    assert disk.get("m", key) is None


def test_bad_entry_is_recompiled_and_replaced(tmp_path):
    d = cubin_cache.DiskCache(tmp_path / "c")
    first = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
    assert not first.from_cache
    path = d.path_for(build.cache_name(gather_kernels.MODULES[16], T90), first.key)
    path.write_bytes(path.read_bytes()[:100])
    n = build.stats["compiles"]
    again = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
    assert not again.from_cache and build.stats["compiles"] == n + 1 and again.image == first.image
    assert build.build_image(gather_kernels.MODULES[16], T90, disk=d).from_cache


def test_untrusted_directory_is_not_used(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others, no sticky bit
    d = cubin_cache.DiskCache(shared)
    with logged_warning(caplog, "others may write to it"):
        assert not d.put("m", "ab" * 32, b"p")
    assert d.get("m", "ab" * 32) is None
    with logged_warning(caplog, None):  # warned once only
        d.put("m", "ab" * 32, b"p")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory_falls_back_to_memory(tmp_path, caplog):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    d = cubin_cache.DiskCache(ro)
    with logged_warning(caplog, "kept in memory"):
        assert not d.put("m", "ab" * 32, b"p")


def test_uncreatable_directory_falls_back_to_memory(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    d = cubin_cache.DiskCache(blocker / "sub")
    with logged_warning(caplog, "cannot create it"):
        assert d.get("m", "ab" * 32) is None
    built = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
    assert built.image[:4] == b"\x7fELF"


def test_environment_is_read_at_use(monkeypatch, tmp_path):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path / "one"))
    assert cubin_cache.current().directory == tmp_path / "one"
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path / "two"))
    assert cubin_cache.current().directory == tmp_path / "two"
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_CACHE", "1")
    assert cubin_cache.current() is None


def test_hit_in_a_new_process(tmp_path):
    code = ("from nvrtc_gather.jit import build, compiler; from nvrtc_gather.kernels import gather as gather_kernels;"
            "r = build.build_image(gather_kernels.MODULES[16], compiler.Target('sm_86'));"
            "print(r.from_cache, build.stats['compiles'])")
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    out = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
           for _ in range(2)]
    assert out[0].split() == ["False", "1"]
    assert out[1].split() == ["True", "0"]


@pytest.mark.parametrize("errno_name", ["EROFS", "ENOSPC", "EACCES"])
def test_refusing_disk_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch, errno_name, caplog):
    import errno
    import tempfile

    def refuse(*a, **k):
        code = getattr(errno, errno_name)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    d = cubin_cache.DiskCache(tmp_path / "c")
    with logged_warning(caplog, os.strerror(getattr(__import__("errno"), errno_name))):
        built = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
    assert built.image[:4] == b"\x7fELF" and not d.scan().images


# -- integrity through build.build_image: nothing wrong is ever loaded ---------------

@pytest.fixture(scope="module")
def ref():
    """Reference images (compiled once, no cache) and their keys, for sm_90 and sm_80."""
    out = {}
    for arch in ("sm_90", "sm_80"):
        t = compiler.Target(arch)
        out[arch] = (build.cache_key(gather_kernels.MODULES[16], t),
                     build.build_image(gather_kernels.MODULES[16], t, use_default_cache=False).image)
    return out


def _plant(d, ref, damage):
    """Put something wrong where the sm_90 entry belongs."""
    key, image = ref["sm_90"]
    name = build.cache_name(gather_kernels.MODULES[16], T90)
    d.usable()
    path = d.path_for(name, key)
    good = cubin_cache.encode_image_file(key, image)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "random":
        path.write_bytes(os.urandom(len(good)))
    elif damage == "other_arch":  # a whole, valid sm_80 entry renamed into the sm_90 slot
        key80, image80 = ref["sm_80"]
        path.write_bytes(cubin_cache.encode_image_file(key80, image80))
    elif damage == "other_source":  # a valid entry of the same module built from other source/options
        other = dataclasses.replace(gather_kernels.MODULES[16], options=("-DOTHER=1",))
        path.write_bytes(cubin_cache.encode_image_file(build.cache_key(other, T90), image[:-64] + bytes(64)))
    elif damage == "symlink":  # even to an intact entry: a symlinked entry is never followed
        elsewhere = d.directory.parent / "elsewhere.bin"
        elsewhere.write_bytes(good)
        path.symlink_to(elsewhere)
    elif damage == "foreign_owner":  # intact, but written by another user
        path.write_bytes(good)
        os.chown(path, 65534, 65534)
    elif damage == "fifo":  # must not block the reader
        os.mkfifo(path)
    elif damage == "temp_only":  # a writer died before os.replace
        (d.directory / f".{path.name}.x1y2z3w4.tmp").write_bytes(good)
    return path


DAMAGES = ["empty", "truncated", "random", "other_arch", "other_source", "symlink", "foreign_owner", "fifo", "temp_only"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_entry_is_never_loaded_but_recompiled_and_replaced(tmp_path, ref, damage):
    if damage == "foreign_owner" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    d = cubin_cache.DiskCache(tmp_path / "c")
    path = _plant(d, ref, damage)
    n = build.stats["compiles"]
    built = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
    assert not built.from_cache and build.stats["compiles"] == n + 1
    assert built.image == ref["sm_90"][1]
    st = os.lstat(path)  # replaced by a regular file of ours, intact
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert build.build_image(gather_kernels.MODULES[16], T90, disk=d).from_cache
    if damage == "symlink":
        assert (tmp_path / "elsewhere.bin").read_bytes() == cubin_cache.encode_image_file(*ref["sm_90"])  # target untouched


def test_entries_report_each_problem(tmp_path, ref):
    d = cubin_cache.DiskCache(tmp_path / "c")
    path = _plant(d, ref, "truncated")
    (d.directory / "stray.bin").write_bytes(b"x")
    by_name = {e.path.name: e for e in d.scan().images}
    assert by_name[path.name].problem == "truncated" and by_name[path.name].arch == "sm_90"
    assert by_name[path.name].module == gather_kernels.MODULES[16].name
    assert "stray.bin" not in by_name and d.scan().foreign == ["stray.bin"]  # not ours: never judged


# -- hostile or broken places: the op still works, one warning, nothing written ----------

@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_directory_owned_by_another_user_is_not_used(tmp_path, caplog):
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 65534, 65534)
    d = cubin_cache.DiskCache(other)
    with logged_warning(caplog, "owned by uid 65534"):
        built = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
    assert built.image[:4] == b"\x7fELF" and os.listdir(other) == []
    with logged_warning(caplog, None):  # warned once only
        build.build_image(gather_kernels.MODULES[16], T90, disk=d)


def test_symlinked_directory_is_judged_by_its_target(tmp_path, caplog):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(mine)
    d = cubin_cache.DiskCache(tmp_path / "link")
    assert d.put("m", "ab" * 32, b"p") and (mine / f"m-{'ab' * 32}.bin").is_file()
    if os.geteuid() == 0:
        os.chown(mine, 65534, 65534)
        with logged_warning(caplog, "owned by uid 65534"):
            assert not cubin_cache.DiskCache(tmp_path / "link").usable()


def test_world_writable_directory_with_sticky_bit_is_used(tmp_path):
    shared = tmp_path / "tmpdir"
    shared.mkdir()
    shared.chmod(0o1777)
    d = cubin_cache.DiskCache(shared)
    assert d.put("m", "ab" * 32, b"p") and d.get("m", "ab" * 32) == b"p"


def test_full_disk_during_write_leaves_no_temp_file(tmp_path, monkeypatch, caplog):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    d = cubin_cache.DiskCache(tmp_path / "c")
    with logged_warning(caplog, "No space left"):  # once, for both builds
        built = build.build_image(gather_kernels.MODULES[16], T90, disk=d)
        build.build_image(gather_kernels.MODULES[16], compiler.Target("sm_80"), disk=d)
    assert built.image[:4] == b"\x7fELF"
    assert all(n.endswith(".lock") for n in os.listdir(d.directory))  # no entry, no temp file


def test_read_only_file_system_at_mkdir(tmp_path, monkeypatch, caplog):
    import errno
    from pathlib import Path

    def ro(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(Path, "mkdir", ro)
    d = cubin_cache.DiskCache(tmp_path / "new")
    with logged_warning(caplog, "Read-only file system"):
        assert build.build_image(gather_kernels.MODULES[16], T90, disk=d).image[:4] == b"\x7fELF"


def test_directory_removed_while_running_is_recreated(tmp_path):
    import shutil

    d = cubin_cache.DiskCache(tmp_path / "c")
    assert d.put("m", "ab" * 32, b"p")
    shutil.rmtree(d.directory)
    assert d.put("m", "cd" * 32, b"q") and d.get("m", "cd" * 32) == b"q"
    assert stat.S_IMODE(d.directory.stat().st_mode) == 0o700


def test_disabled_cache_touches_no_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path / "never"))
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_CACHE", "yes")
    n = build.stats["compiles"]
    assert not build.build_image(gather_kernels.MODULES[16], T90).from_cache
    assert build.stats["compiles"] == n + 1 and not (tmp_path / "never").exists()


def test_relative_cache_dir_is_made_absolute_at_use(tmp_path, monkeypatch):
    from nvrtc_gather import settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", "rel")
    assert settings.cache_dir() == tmp_path / "rel"


def test_fifo_entry_does_not_block_a_reader(tmp_path):
    d = cubin_cache.DiskCache(tmp_path / "c")
    d.usable()
    os.mkfifo(d.path_for("m", "ab" * 32))
    assert d.get("m", "ab" * 32) is None
    assert cubin_cache.read_image_file(d.path_for("m", "ab" * 32)) == (None, "not a regular file")


def test_warm_target_lookup_does_not_load_nvrtc(tmp_path):
    """A fresh process whose cache holds the exact arch's cubin finds it without asking
    NVRTC anything (loading it costs ~50 ms; torch's CUDA build may map the library anyway)."""
    code = ("from nvrtc_gather.jit import build, compiler; from nvrtc_gather.kernels import gather as gather_kernels;"
            "image = build.image_for(gather_kernels.MODULES[16], 90, lambda image: image);"
            "assert image[:4] == b'\\x7fELF' and build.stats['disk_hits'] == 1 and build.stats['compiles'] == 0;"
            "print('sm_90', compiler.nvrtc_version.cache_info().currsize + "
            "compiler.supported_archs.cache_info().currsize)")
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", "from nvrtc_gather.jit import build, compiler; from nvrtc_gather.kernels import gather as gather_kernels;"
                    "build.build_image(gather_kernels.MODULES[16], compiler.Target('sm_90'))"], env=env, check=True)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    if compiler.compiler_identity().startswith("nvrtc "):
        pytest.skip("NVRTC is not installed from the nvidia-cuda-nvrtc wheel here")
    assert out.split() == ["sm_90", "0"]


# -- entry size: a huge file under an entry's name costs a lookup nothing ------------------

def test_entry_cap_is_fitted_to_real_entries():
    """The cap is a few MiB: far above the largest real entry, far below what hurts."""
    biggest = max(len(build.build_image(m, compiler.Target(a)).image)
                  for m in kernels.ALL_MODULES for a in ("sm_90", "sm_100"))
    assert 4 * biggest <= cubin_cache.MAX_IMAGE_BYTES <= 16 << 20


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)  # no data blocks: only a read would cost anything
    return path


def _peak_memory_and_time(fn):
    import time
    import tracemalloc

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1], time.perf_counter() - t0
    finally:
        tracemalloc.stop()


def test_huge_sparse_entry_is_refused_from_its_size_before_reading(tmp_path):
    d = cubin_cache.DiskCache(tmp_path / "c")
    d.usable()
    size = (16 << 20) + 1  # just over the cap (at most 16 MiB: test_entry_cap_is_fitted_to_real_entries)
    path = _sparse(d.path_for("m-sm_90", "ab" * 32), size)
    (blob, problem), peak, took = _peak_memory_and_time(lambda: cubin_cache.read_image_file(path))
    assert blob is None and problem.startswith("too large") and str(size) in problem
    assert peak < 1 << 20 and took < 1.0
    got, peak, took = _peak_memory_and_time(lambda: d.get("m-sm_90", "ab" * 32))
    assert got is None and peak < 1 << 20 and took < 1.0
    (info,), peak, took = _peak_memory_and_time(lambda: d.scan().images)  # what `cache list` / `verify` see
    assert info.problem.startswith("too large") and info.size == size and peak < 1 << 20 and took < 1.0


def test_a_file_growing_past_the_cap_is_read_no_further(tmp_path, monkeypatch):
    """fstat said small, the file is huge (it grew, or lies): the read stops at cap + 1 bytes."""
    d = cubin_cache.DiskCache(tmp_path / "c")
    d.usable()
    path = _sparse(d.path_for("m-sm_90", "ab" * 32), 64 << 20)
    real_fstat = os.fstat

    def small_fstat(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 100,
                               st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(os, "fstat", small_fstat)
    reads = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    (blob, problem), peak, _ = _peak_memory_and_time(lambda: cubin_cache.read_image_file(path))
    assert blob is None and problem.startswith("too large")
    assert sum(reads) == cubin_cache.MAX_IMAGE_BYTES + 1 and max(reads) <= 1 << 20  # bounded chunks
    assert peak < 3 * cubin_cache.MAX_IMAGE_BYTES


def test_an_entry_at_the_cap_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(cubin_cache, "MAX_IMAGE_BYTES", 4096)
    d = cubin_cache.DiskCache(tmp_path / "c")
    payload = b"p" * (4096 - cubin_cache._HEADER.size)
    assert d.put("m-sm_90", "ab" * 32, payload) and d.get("m-sm_90", "ab" * 32) == payload
    assert d.put("m-sm_90", "cd" * 32, payload + b"!") and d.get("m-sm_90", "cd" * 32) is None


# -- names: the cache owns only what it writes ---------------------------------------------

ENTRY = f"gather_indexer_k-sm_90-{'ab' * 32}.bin"
FOREIGN_NAMES = ["firmware.bin", "app.lock", "x.bin.lock", ".foo.bin.x.tmp", "notes.txt", ".hidden",
                 f"gather_indexer_k-sm_90-{'a' * 63}.bin",            # 63 hex digits
                 f"gather_indexer_k-sm_90-{'AB' * 32}.bin",           # uppercase hex
                 f"gather_indexer_k-sm_90-{'a' * 63}.bin.lock",
                 f"sm_90-{'ab' * 32}.bin",                            # no module
                 f"{ENTRY}.lock.bak", f"{ENTRY}~", f".{ENTRY}.tmp", f".{ENTRY}.abc.tmp",
                 f".{ENTRY}.ABCDEFGH.tmp", f".{ENTRY}.abcdefgh.tmp.x", f"{ENTRY}.abcdefgh.tmp"]


@pytest.mark.parametrize("name, kind", [
    (ENTRY, "image"), (ENTRY + ".lock", "lock"), (f".{ENTRY}.k3_j4x9z.tmp", "temp"),
    *[(n, None) for n in FOREIGN_NAMES]])
def test_name_kind(name, kind):
    assert cubin_cache.name_kind(name) == kind


def test_publish_temp_names_are_recognised(tmp_path, monkeypatch):
    import tempfile

    seen = []
    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    d = cubin_cache.DiskCache(tmp_path / "c")
    for _ in range(20):
        assert d.put("gather_indexer_k-sm_90", "ab" * 32, b"p")
    assert len(seen) == 20 and all(cubin_cache.name_kind(os.path.basename(p)) == "temp" for _, p in seen)


def _populate(directory):
    """A cache directory shared with other programs: our entries, locks (one orphan) and a
    temp file, and other programs' files, some named almost like ours, and subdirectories."""
    d = cubin_cache.DiskCache(directory)
    assert d.put("gather_indexer_k-sm_90", "ab" * 32, b"p") and d.put("quant_cache-sm_90", "cd" * 32, b"q")
    with d.lock("gather_indexer_k-sm_90", "ab" * 32):
        pass
    ours = sorted(os.listdir(directory)) + [f"quant_cache-sm_80-{'ef' * 32}.bin.lock",  # orphan lock
                                             f".{ENTRY}.a1b2c3d4.tmp"]
    for n in ours[-2:]:
        (directory / n).write_bytes(b"")
    for n in FOREIGN_NAMES:
        (directory / n).write_bytes(b"theirs " + n.encode())
    (directory / "subdir").mkdir()
    (directory / "subdir" / ENTRY).write_bytes(b"deep")
    (directory / f"quant_cache-sm_100-{'12' * 32}.bin").mkdir()  # a directory named like an entry
    foreign = sorted(FOREIGN_NAMES + ["subdir", f"quant_cache-sm_100-{'12' * 32}.bin"])
    return d, sorted(ours), foreign


def _snapshot(directory):
    return {p.relative_to(directory).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in directory.rglob("*")}


@pytest.mark.parametrize("via_symlink", [False, True], ids=["dir", "symlinked-dir"])
def test_clear_removes_only_the_caches_own_files(tmp_path, via_symlink):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    d, ours, foreign = _populate(real)
    if via_symlink:
        (tmp_path / "link").symlink_to(real)
        d = cubin_cache.DiskCache(tmp_path / "link")
    before = {k: v for k, v in _snapshot(real).items() if k not in ours}
    removal = d.clear()
    assert _snapshot(real) == before  # every foreign file, byte for byte, and the subdirectories
    assert real.is_dir() and (not via_symlink or (tmp_path / "link").is_symlink())
    assert sorted(removal.removed) == ours and removal.failed == []
    assert sorted(d.scan().foreign) == foreign and d.scan().images == []
