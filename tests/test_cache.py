"""The disk cache, without a GPU: keys, publishing, verification, placement, processes."""
import os
import stat
import subprocess
import sys
import warnings

import pytest

from nvrtc_gather import cache, compiler, kernels, registry, sources

T90 = compiler.Target("sm_90")


@pytest.fixture
def disk(tmp_path):
    return cache.DiskCache(tmp_path / "c")


def test_key_is_length_prefixed_and_stable():
    assert cache.make_key([("a", "bc")]) != cache.make_key([("ab", "c")])
    assert cache.make_key([("a", "b"), ("c", "")]) != cache.make_key([("a", "bc")])
    assert cache.make_key([("a", "x")]) == cache.make_key([("a", b"x")])


def test_key_changes_with_source_options_and_arch(monkeypatch):
    base = registry.cache_key(kernels.GATHER, T90)
    assert registry.cache_key(kernels.GATHER, T90) == base
    assert registry.cache_key(kernels.GATHER, compiler.Target("sm_80")) != base
    m2 = kernels.KernelModule(kernels.GATHER.name, kernels.GATHER.source, kernels.GATHER.kernels, ("-DX=1",))
    assert registry.cache_key(m2, T90) != base
    real = sources.read_source
    monkeypatch.setattr(sources, "read_source", lambda n: real(n) + "\n// edited")
    assert registry.cache_key(kernels.GATHER, T90) != base


def test_key_has_no_install_path(monkeypatch, tmp_path):
    """The key depends on file contents, not where the package is installed."""
    base = registry.cache_key(kernels.GATHER, T90)
    copy = tmp_path / "elsewhere" / "cuda_src"
    copy.mkdir(parents=True)
    for p in sources.source_dir().iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(sources, "source_dir", lambda: copy)
    sources.read_source.cache_clear()
    try:
        assert registry.cache_key(kernels.GATHER, T90) == base
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
    d = cache.DiskCache(tmp_path / "c")
    first = registry.build_image(kernels.GATHER, T90, disk=d)
    assert not first.from_cache
    path = d.path_for(registry.entry_name(kernels.GATHER, T90), first.key)
    path.write_bytes(path.read_bytes()[:100])
    n = registry.stats["compiles"]
    again = registry.build_image(kernels.GATHER, T90, disk=d)
    assert not again.from_cache and registry.stats["compiles"] == n + 1 and again.image == first.image
    assert registry.build_image(kernels.GATHER, T90, disk=d).from_cache


def test_untrusted_directory_is_not_used(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by others, no sticky bit
    d = cache.DiskCache(shared)
    with pytest.warns(RuntimeWarning, match="others may write to it"):
        assert not d.put("m", "ab" * 32, b"p")
    assert d.get("m", "ab" * 32) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        d.put("m", "ab" * 32, b"p")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory_falls_back_to_memory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    d = cache.DiskCache(ro)
    with pytest.warns(RuntimeWarning, match="kept in memory"):
        assert not d.put("m", "ab" * 32, b"p")


def test_uncreatable_directory_falls_back_to_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    d = cache.DiskCache(blocker / "sub")
    with pytest.warns(RuntimeWarning, match="cannot create it"):
        assert d.get("m", "ab" * 32) is None
    built = registry.build_image(kernels.GATHER, T90, disk=d)
    assert built.image[:4] == b"\x7fELF"


def test_environment_is_read_at_use(monkeypatch, tmp_path):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path / "one"))
    assert cache.current().directory == tmp_path / "one"
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path / "two"))
    assert cache.current().directory == tmp_path / "two"
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_CACHE", "1")
    assert cache.current() is None


def test_hit_in_a_new_process(tmp_path):
    code = ("from nvrtc_gather import registry, kernels, compiler;"
            "r = registry.build_image(kernels.GATHER, compiler.Target('sm_86'));"
            "print(r.from_cache, registry.stats['compiles'])")
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    out = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
           for _ in range(2)]
    assert out[0].split() == ["False", "1"]
    assert out[1].split() == ["True", "0"]


@pytest.mark.parametrize("errno_name", ["EROFS", "ENOSPC", "EACCES"])
def test_refusing_disk_falls_back_to_memory_with_one_warning(tmp_path, monkeypatch, errno_name):
    import errno
    import tempfile

    def refuse(*a, **k):
        code = getattr(errno, errno_name)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    d = cache.DiskCache(tmp_path / "c")
    with pytest.warns(RuntimeWarning, match=os.strerror(getattr(__import__("errno"), errno_name))):
        built = registry.build_image(kernels.GATHER, T90, disk=d)
    assert built.image[:4] == b"\x7fELF" and not d.entries()
