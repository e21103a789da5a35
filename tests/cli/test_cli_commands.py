"""`nvrtc-gather warmup`, `cache list|verify|clear` and `info`, without a GPU (a fake driver
where GPUs matter), plus the install hints a version mismatch ends in."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvrtc_gather.jit import build, compiler, cubin_cache, driver, runtime
from nvrtc_gather.cli import cache as cli_cache, info, warmup
from nvrtc_gather import cli
from nvrtc_gather.errors import CompileError, MissingDependencyError
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather import kernels

ROOT = Path(__file__).resolve().parents[2]  # the checkout
KNOWN = (75, 80, 86, 87, 89, 90, 100, 120, 121)

# A fresh process builds every module for the archs in argv; prints compiles and disk hits.
FRESH = ("import sys\nfrom nvrtc_gather import kernels\nfrom nvrtc_gather.jit import build, compiler\n"
         "for a in sys.argv[1:]:\n"
         "    for m in kernels.ALL_MODULES:\n"
         "        build.build_image(m, compiler.Target(a))\n"
         "print(build.stats['compiles'], build.stats['disk_hits'])")


def _fresh_process(cache_dir, *archs):
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(cache_dir))
    out = subprocess.run([sys.executable, "-c", FRESH, *archs], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    return tuple(map(int, out.split()))


def _fake_gpus(monkeypatch, caps, version=13000):
    monkeypatch.setattr(driver, "device_count", lambda: len(caps))
    monkeypatch.setattr(driver, "capability", lambda i: caps[i])
    monkeypatch.setattr(driver, "device_name", lambda i: f"Fake GPU {i}")
    monkeypatch.setattr(driver, "driver_version", lambda: version)


def _no_driver(monkeypatch):
    def missing():
        raise MissingDependencyError("no usable NVIDIA driver was found (test)")
    monkeypatch.setattr(driver, "device_count", missing)
    monkeypatch.setattr(driver, "driver_version", missing)


# -- arch parsing ------------------------------------------------------------------------

@pytest.mark.parametrize("text, arch", [
    ("sm_90", "sm_90"), ("90", "sm_90"), ("9.0", "sm_90"), ("SM_90", "sm_90"), ("sm90", "sm_90"),
    ("compute_90", "compute_90"), ("10.0", "sm_100"), ("12.1", "sm_121"),
    ("sm_90a", "sm_90"), ("9.0a", "sm_90"), ("100f", "sm_100"),  # an H200 loads sm_90, whatever the suffix
    ("sm_91", "sm_90"),            # same major, newer minor: the older cubin runs there
    ("sm_130", "compute_121"),     # newer than NVRTC: PTX, as pick_target chooses at run time
])
def test_parse_arch(text, arch):
    assert warmup.parse_arch(text, KNOWN).arch == arch


@pytest.mark.parametrize("text", ["", "sm_", "ninety", "9", "sm_60"])
def test_parse_arch_rejects(text):
    with pytest.raises(ValueError):
        warmup.parse_arch(text, KNOWN)


# -- warmup --------------------------------------------------------------------------------

def test_warmup_then_a_fresh_process_compiles_nothing_even_after_copying(tmp_path, capsys):
    warm = tmp_path / "warm"
    assert warmup.main(["--arch", "sm_80", "9.0", "--cache-dir", str(warm), "--no-progress"]) == 0
    out = capsys.readouterr().out
    n = len(kernels.ALL_MODULES)
    assert out.count("compiled") >= 2 * n and f"{2 * n} images: {2 * n} compiled" in out
    assert "arch" in out and "module" in out and "size" in out and "time" in out
    # again: everything already cached
    assert warmup.main(["--arch", "sm_80", "sm_90", "--cache-dir", str(warm), "--no-progress"]) == 0
    assert f"0 compiled, {2 * n} already cached, 0 failed" in capsys.readouterr().out
    # a copy elsewhere is as good: keys hold no paths
    copy = tmp_path / "copied" / "cache"
    shutil.copytree(warm, copy)
    assert _fresh_process(copy, "sm_80", "sm_90") == (0, 2 * n)


def test_warmup_script_is_the_same_tool(tmp_path):
    d = tmp_path / "c"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "warmup_arch_cache.py"), "--arch", "sm_86",
                        "--cache-dir", str(d)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "sm_86" in r.stdout and "1/" in r.stderr  # table on stdout, progress on stderr
    assert _fresh_process(d, "sm_86") == (0, len(kernels.ALL_MODULES))


def test_warmup_all_uses_every_supported_arch(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compiler, "supported_archs", lambda: (80, 89))
    assert cli.main(["warmup", "--all", "--cache-dir", str(tmp_path), "--no-progress", "-j", "2"]) == 0
    got = {(e.module, e.arch) for e in cubin_cache.DiskCache(tmp_path).scan().images if e.valid}
    assert got == {(m.name, a) for m in kernels.ALL_MODULES for a in ("sm_80", "sm_89")}


def test_warmup_defaults_to_the_gpus_present(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)  # GPU images set it; it would win
    _fake_gpus(monkeypatch, [90, 90, 86])
    assert warmup.main(["--cache-dir", str(tmp_path), "--no-progress"]) == 0
    assert {e.arch for e in cubin_cache.DiskCache(tmp_path).scan().images} == {"sm_90", "sm_86"}


def test_warmup_without_gpu_or_arch_says_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    _no_driver(monkeypatch)
    assert warmup.main(["--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--arch" in err and "--all" in err and "Traceback" not in err


def test_warmup_bad_arch_is_a_usage_error(tmp_path, capsys):
    assert warmup.main(["--arch", "sm_90", "banana", "--cache-dir", str(tmp_path / "c")]) == 2
    assert "banana" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_warmup_reports_failures_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    real = compiler.compile_module

    def flaky(module, target):
        if target.arch == "sm_80":
            raise CompileError("simulated failure", "log line")
        return real(module, target)

    monkeypatch.setattr(compiler, "compile_module", flaky)
    assert warmup.main(["--arch", "sm_80", "sm_90", "--cache-dir", str(tmp_path), "--no-progress"]) == 1
    cap = capsys.readouterr()
    assert "FAILED" in cap.out and "simulated failure" in cap.err
    assert {e.arch for e in cubin_cache.DiskCache(tmp_path).scan().images} == {"sm_90"}


def test_warmup_on_a_full_disk_fails_with_the_reason(tmp_path, monkeypatch, capsys):
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    assert warmup.main(["--arch", "sm_90", "--cache-dir", str(tmp_path), "--no-progress"]) == 1
    cap = capsys.readouterr()
    assert "FAILED" in cap.out and "No space left on device" in cap.err and "not stored" in cap.err


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_warmup_into_a_directory_it_may_not_use_fails(tmp_path, capsys):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    assert warmup.main(["--arch", "sm_90", "--cache-dir", str(d)]) == 1
    assert "owned by uid 65534" in capsys.readouterr().err and os.listdir(d) == []


def test_warmup_refuses_a_disabled_default_cache(monkeypatch, capsys):
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_CACHE", "1")
    assert warmup.main(["--arch", "sm_90"]) == 2
    assert "NVRTC_GATHER_DISABLE_CACHE" in capsys.readouterr().err


# -- cache list | verify | clear ---------------------------------------------------------------

def test_cache_list_verify_fix_clear(tmp_path, capsys):
    d = cubin_cache.DiskCache(tmp_path / "c")
    t = compiler.Target("sm_90")
    built = build.build_image(gather_kernels.MODULES[16], t, disk=d)
    old_name = build.cache_name(gather_kernels.MODULES[16], compiler.Target("sm_80"))
    d.put(old_name, "ab" * 32, b"old")  # intact, but not under this install's key: stale
    stale = d.path_for(old_name, "ab" * 32)
    args = ["--cache-dir", str(d.directory)]

    assert cli_cache.main(["list", *args]) == 0
    out = capsys.readouterr().out
    assert "gather_indexer_k" in out and "sm_90" in out and "stale" in out and "2 image file(s)" in out
    assert cli_cache.main(["verify", *args]) == 0 and "2 of 2 image files intact" in capsys.readouterr().out

    path = d.path_for(build.cache_name(gather_kernels.MODULES[16], t), built.key)
    path.write_bytes(path.read_bytes()[:-1])
    (d.directory / f".{path.name}.zz9_ab01.tmp").write_bytes(b"half")
    assert cli.main(["cache", "list", *args]) == 0
    out = capsys.readouterr().out
    assert "NO (truncated)" in out and "1 temp file" in out
    assert cli.main(["cache", "verify", *args]) == 1
    assert f"BAD {path.name}: truncated" in capsys.readouterr().out and path.exists()
    assert cli.main(["cache", "verify", "--fix", *args]) == 0
    assert not path.exists() and stale.exists()
    assert cli.main(["cache", "clear", *args]) == 0
    assert os.listdir(d.directory) == []


def _shared_dir(tmp_path):
    """A cache directory that other programs also use: a built entry (with its lock), a
    damaged one, an orphan lock, and their files, some named almost like ours."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    d = cubin_cache.DiskCache(real)
    t = compiler.Target("sm_90")
    built = build.build_image(gather_kernels.MODULES[16], t, disk=d)
    good = d.path_for(build.cache_name(gather_kernels.MODULES[16], t), built.key)
    with d.lock("quant_cache-sm_90", "cd" * 32):
        pass
    bad = d.path_for("quant_cache-sm_90", "cd" * 32)
    bad.write_bytes(b"damaged")
    orphan = real / f"quant_cache-sm_80-{'ef' * 32}.bin.lock"
    orphan.write_bytes(b"")
    foreign = {"firmware.bin": b"\x7fELF firmware", "app.lock": b"pid 42", "x.bin.lock": b"",
               ".foo.bin.x.tmp": b"t", f"gather_indexer_k-sm_90-{'a' * 63}.bin": b"63",
               f"gather_indexer_k-sm_90-{'AB' * 32}.bin": b"upper", f"{bad.name}.bak": b"backup"}
    for name, data in foreign.items():
        (real / name).write_bytes(data)
    (real / "subdir").mkdir()
    (real / "subdir" / "firmware.bin").write_bytes(b"deep")
    return d, good, bad, orphan, foreign


def _foreign_intact(real, foreign):
    assert {n: (real / n).read_bytes() if (real / n).exists() else "deleted" for n in foreign} == foreign
    assert (real / "subdir" / "firmware.bin").read_bytes() == b"deep"


@pytest.mark.parametrize("via_symlink", [False, True], ids=["dir", "symlinked-dir"])
def test_cache_commands_leave_other_programs_files_alone(tmp_path, capsys, via_symlink):
    d, good, bad, orphan, foreign = _shared_dir(tmp_path)
    real = d.directory
    if via_symlink:
        (tmp_path / "link").symlink_to(real)
    args = ["--cache-dir", str(tmp_path / "link" if via_symlink else real)]

    assert cli_cache.main(["verify", *args]) == 1
    verified = capsys.readouterr().out
    assert cli_cache.main(["verify", "--fix", *args]) == 0
    capsys.readouterr()
    _foreign_intact(real, foreign)
    assert not bad.exists() and not Path(f"{bad}.lock").exists()   # the bad entry went with its lock
    assert good.exists() and Path(f"{good}.lock").exists() and orphan.exists()
    assert f"BAD {bad.name}" in verified and "1 of 2 image files intact" in verified and verified.count("BAD ") == 1
    assert "8 other file(s)" in verified and "firmware.bin" in verified

    assert cli_cache.main(["list", *args]) == 0
    out = capsys.readouterr().out
    assert "1 image file(s)" in out and "firmware.bin" in out and "8 other file(s)" in out and "left alone" in out
    assert "1 lock file(s) without an image file" in out

    assert cli_cache.main(["clear", *args]) == 0
    out = capsys.readouterr().out
    _foreign_intact(real, foreign)
    assert sorted(os.listdir(real)) == sorted([*foreign, "subdir"])
    assert "removed 3 file(s)" in out and "8 other file(s)" in out  # entry, its lock, the orphan lock
    assert not via_symlink or (tmp_path / "link").is_symlink()


def test_entry_locks_are_not_foreign_and_go_with_their_entries(tmp_path, capsys):
    d = cubin_cache.DiskCache(tmp_path / "c")
    built = build.build_image(gather_kernels.MODULES[16], compiler.Target("sm_90"), disk=d)
    path = d.path_for(build.cache_name(gather_kernels.MODULES[16], compiler.Target("sm_90")), built.key)
    lock = Path(f"{path}.lock")
    assert sorted(os.listdir(d.directory)) == sorted([path.name, lock.name])
    assert cli_cache.main(["list", "--cache-dir", str(d.directory)]) == 0
    assert "other file" not in capsys.readouterr().out
    path.write_bytes(b"bad")
    assert cli_cache.main(["verify", "--fix", "--cache-dir", str(d.directory)]) == 0
    assert os.listdir(d.directory) == [] and "1 lock file" in capsys.readouterr().out
    orphan = Path(f"{d.path_for('m-sm_80', 'cd' * 32)}.lock")
    orphan.write_bytes(b"")
    assert d.scan().foreign == [] and cli_cache.main(["clear", "--cache-dir", str(d.directory)]) == 0
    assert os.listdir(d.directory) == []


def test_put_leaves_a_lock_in_place(tmp_path):
    """A lock another process may be waiting on is never unlinked by a normal build."""
    d = cubin_cache.DiskCache(tmp_path / "c")
    with d.lock("m-sm_90", "ab" * 32) as taken:
        lock = Path(f"{d.path_for('m-sm_90', 'ab' * 32)}.lock")
        ino = lock.stat().st_ino
        assert taken and d.put("m-sm_90", "ab" * 32, b"p")
        assert lock.stat().st_ino == ino
    assert d.put("m-sm_90", "ab" * 32, b"q") and lock.stat().st_ino == ino


def _refuse_unlink(monkeypatch, directory):
    """os.unlink fails with EACCES inside ``directory`` (as a read-only directory does, even for root)."""
    import errno

    real = os.unlink

    def unlink(path, *a, **k):
        if Path(path).parent == Path(directory):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(os, "unlink", unlink)


def test_clear_that_fails_says_so_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    d = cubin_cache.DiskCache(tmp_path / "c")
    assert d.put("m-sm_90", "ab" * 32, b"p") and d.put("m-sm_80", "cd" * 32, b"q")
    before = sorted(os.listdir(d.directory))
    _refuse_unlink(monkeypatch, d.directory)
    assert cli_cache.main(["clear", "--cache-dir", str(d.directory)]) == 1
    cap = capsys.readouterr()
    for name in before:
        assert f"could not remove {d.directory / name}: Permission denied" in cap.err
    assert "2 file(s) were not removed" in cap.err and "may write to it" in cap.err and "cache clear" in cap.err
    assert "removed 0 file(s)" in cap.out and sorted(os.listdir(d.directory)) == before


def test_verify_fix_that_fails_says_so_and_exits_non_zero(tmp_path, monkeypatch, capsys):
    d = cubin_cache.DiskCache(tmp_path / "c")
    assert d.put("m-sm_90", "ab" * 32, b"p")
    path = d.path_for("m-sm_90", "ab" * 32)
    path.write_bytes(b"bad")
    _refuse_unlink(monkeypatch, d.directory)
    assert cli_cache.main(["verify", "--fix", "--cache-dir", str(d.directory)]) == 1
    cap = capsys.readouterr()
    assert f"could not remove {path}: Permission denied" in cap.err and "verify --fix" in cap.err
    assert path.exists()


def _permissions_bind(tmp_path) -> bool:
    """Whether a 0500 directory stops us (not for root, unless it runs without CAP_DAC_OVERRIDE)."""
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o500)
    try:
        (probe / "x").touch()
        return False
    except PermissionError:
        return True
    finally:
        probe.chmod(0o700)


def test_clear_and_verify_fix_in_a_read_only_directory_fail_loudly(tmp_path, capsys):
    if not _permissions_bind(tmp_path):
        pytest.skip("directory permissions do not bind this process (root); the two tests above fake them")
    d = cubin_cache.DiskCache(tmp_path / "c")
    assert d.put("m-sm_90", "ab" * 32, b"p") and d.put("m-sm_80", "cd" * 32, b"q")
    d.path_for("m-sm_80", "cd" * 32).write_bytes(b"bad")
    before = sorted(os.listdir(d.directory))
    d.directory.chmod(0o500)
    try:
        assert cli_cache.main(["verify", "--fix", "--cache-dir", str(d.directory)]) == 1
        assert "Permission denied" in capsys.readouterr().err
        assert cli_cache.main(["clear", "--cache-dir", str(d.directory)]) == 1
        cap = capsys.readouterr()
        assert cap.err.count("Permission denied") == 2 and "removed 0 file(s)" in cap.out
        assert sorted(os.listdir(d.directory)) == before
    finally:
        d.directory.chmod(0o700)


def test_cache_commands_on_a_missing_directory(tmp_path, capsys):
    missing = tmp_path / "nothing"
    for action in ("list", "verify", "clear"):
        assert cli_cache.main([action, "--cache-dir", str(missing)]) == 0
    assert "does not exist yet" in capsys.readouterr().out and not missing.exists()


# -- info ---------------------------------------------------------------------------------------

def test_info_without_a_driver(monkeypatch, capsys):
    _no_driver(monkeypatch)
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA driver found" in out and "Traceback" not in out
    for label in ("nvrtc-gather", "NVRTC", "cuda-bindings", "torch", "cache dir"):
        assert label in out
    assert " ".join(f"sm_{a}" for a in compiler.supported_archs()) in out


def test_info_real_machine_in_a_subprocess():
    r = subprocess.run([sys.executable, "-m", "nvrtc_gather", "info"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr and "cache dir" in r.stdout


def test_info_lists_gpus_and_warns_of_an_older_driver(monkeypatch, capsys):
    _fake_gpus(monkeypatch, [90], version=12080)
    info.main([])
    out = capsys.readouterr().out
    assert "GPU 0" in out and "Fake GPU 0, sm_90 -> loads sm_90 (cubin)" in out and "CUDA 12.8" in out
    assert "pip install 'nvidia-cuda-nvrtc-cu12==12.*' 'cuda-bindings>=12.8,<13'" in out  # what to install, runnable


def test_info_minor_driver_lag_matters_only_for_ptx(monkeypatch, capsys):
    newest = max(compiler.supported_archs())
    major, minor = compiler.nvrtc_version()
    if minor == 0:
        pytest.skip("needs an NVRTC x.y with y > 0")
    _fake_gpus(monkeypatch, [90, newest + 50], version=major * 1000)
    info.main([])
    out = capsys.readouterr().out
    assert "cubins load" in out and "A GPU here needs PTX" in out and f"nvidia-cuda-nvrtc=={major}.0.*" in out


def test_info_without_nvrtc_says_what_to_install(monkeypatch, capsys):
    def missing():
        raise MissingDependencyError("the NVRTC library could not be loaded; " + compiler._install_hint())
    monkeypatch.setattr(compiler, "nvrtc_version", missing)
    _no_driver(monkeypatch)
    assert info.main([]) == 0
    out = capsys.readouterr().out
    assert "NVRTC" in out and "not usable" in out and "pip install 'nvidia-cuda-nvrtc==" in out


# -- what a version mismatch tells the user ---------------------------------------------------

@pytest.mark.parametrize("code", [200, 209, 218, 222])
def test_load_failures_say_what_to_install(code):
    assert "nvidia-cuda-nvrtc" in driver._HINTS[code] and "driver" in driver._HINTS[code]


def test_install_hint_names_the_matching_nvrtc_major():
    from importlib.metadata import version
    major = version("cuda-bindings").split(".")[0]
    assert f"nvidia-cuda-nvrtc=={major}.*" in compiler._install_hint()
