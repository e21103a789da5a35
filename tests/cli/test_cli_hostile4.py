"""Round four of hostile input against the CLI (issue #26): cache paths the output encoding
cannot hold, the demo with a refused --arch, without NVRTC and with NVRTC_GATHER_DISABLE_JIT,
empty and odd locations, and stray arguments. Each case would print a traceback or the wrong
thing before its fix."""
import os
import subprocess
import sys

import pytest

import nvrtc_gather
from nvrtc_gather import settings
from nvrtc_gather.cli import demo
from nvrtc_gather.cli import main as cli_main
from nvrtc_gather.errors import CacheLocationError, MissingDependencyError
from nvrtc_gather.jit import build, compiler

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*argv, env=None, cwd=None, timeout=300):
    base = {k: v for k, v in os.environ.items() if not k.startswith("NVRTC_GATHER_")}
    return subprocess.run([sys.executable, "-m", "nvrtc_gather", *argv], capture_output=True, timeout=timeout,
                          env=base | {"PYTHONPATH": REPO} | (env or {}), cwd=cwd)


def _no_traceback(r):
    err = r.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "UnicodeEncodeError" not in err, err[-3000:]


# -- item 1: a cache path the output encoding cannot hold -----------------------------------

COMMANDS = [("cache", "list"), ("cache", "verify"), ("cache", "clear"), ("info",)]


def _odd_dirs(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/x_\xff"   # not UTF-8: a surrogate in Python's str
    os.mkdir(raw, 0o700)
    accented = tmp_path / "caché"
    accented.mkdir(mode=0o700)
    return {"surrogate": os.fsdecode(raw), "accented": str(accented)}


@pytest.mark.parametrize("encoding", ["utf-8:strict", "ascii"])
@pytest.mark.parametrize("which", ["surrogate", "accented"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_unprintable_cache_path_is_printed_escaped(command, which, encoding, tmp_path):
    if which == "accented" and encoding.startswith("utf-8"):
        pytest.skip("caché is printable in UTF-8")
    d = _odd_dirs(tmp_path)[which]
    r = _cli(*command, env={settings.CACHE_DIR_ENV: d, "PYTHONIOENCODING": encoding})
    _no_traceback(r)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.decode("ascii" if encoding == "ascii" else "utf-8")  # what was printed is valid
    assert ("\\udcff" if which == "surrogate" else "cach\\xe9") in out, out


def test_unprintable_cache_path_in_warmup(tmp_path):
    d = _odd_dirs(tmp_path)["surrogate"]
    r = _cli("warmup", "--arch", "sm_90", "--no-progress", "-j", "2",
             env={settings.CACHE_DIR_ENV: d, "PYTHONIOENCODING": "utf-8:strict"})
    _no_traceback(r)
    assert r.returncode == 0 and b"\\udcff" in r.stdout, r.stderr[-2000:]


def test_unprintable_cache_path_in_demo(tmp_path):
    d = _odd_dirs(tmp_path)["surrogate"]
    r = _cli("demo", "--batch", "2", "--mean-len", "64", env={settings.CACHE_DIR_ENV: d,
                                                              "PYTHONIOENCODING": "utf-8:strict"})
    _no_traceback(r)
    assert r.returncode == 0, r.stderr[-2000:]


# -- items 3 and 4: the demo's compile step -------------------------------------------------

def test_demo_with_an_arch_nvrtc_refuses_is_a_message(monkeypatch, capsys):
    monkeypatch.setattr(demo, "gpu_available", lambda: False)  # --arch is the no-GPU branch's compile step
    rc = cli_main(["demo", "--batch", "2", "--mean-len", "64", "--arch", "compute_999"])
    out, err = capsys.readouterr()
    assert rc == 1 and "could not compile for --arch compute_999" in err and "Traceback" not in err
    assert "matches a per-request loop: yes" in out  # the CPU part still ran


def test_demo_without_nvrtc_runs_the_cpu_part_and_says_how_to_install(monkeypatch, capsys):
    def missing(*_):
        raise MissingDependencyError("the NVRTC library could not be loaded (libnvrtc.so.12: cannot open); "
                                     "pip install nvidia-cuda-nvrtc")
    monkeypatch.setattr(compiler, "nvrtc_version", missing)
    monkeypatch.setattr(compiler, "supported_archs", missing)
    monkeypatch.setattr(compiler, "compile_module", missing)
    monkeypatch.setattr(demo, "gpu_available", lambda: False)  # the branch that compiles without a GPU
    rc = cli_main(["demo", "--batch", "2", "--mean-len", "64"])
    out, err = capsys.readouterr()
    assert rc == 0, (out, err)
    assert "usage" not in err and "--arch" not in err
    assert "compile step skipped: NVRTC is missing" in out and "pip install" in out
    assert "matches a per-request loop: yes" in out and "within fp8-e4m3 tolerance" in out


def test_demo_still_refuses_a_misspelt_arch_without_nvrtc(monkeypatch, capsys):
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (_ for _ in ()).throw(MissingDependencyError("x")))
    with pytest.raises(SystemExit) as e:
        demo.main(["--arch", "sm_nine"])
    assert e.value.code == 2 and "--arch" in capsys.readouterr().err


def test_demo_honours_disable_jit(monkeypatch, capsys):
    monkeypatch.setenv(settings.DISABLE_JIT_ENV, "1")
    before = build.stats["compiles"]
    calls = []
    monkeypatch.setattr(compiler, "compile_module", lambda *a: calls.append(a))
    monkeypatch.setattr(demo, "gpu_available", lambda: False)  # the branch that compiles without a GPU
    rc = cli_main(["demo", "--batch", "2", "--mean-len", "64"])
    out = capsys.readouterr().out
    assert rc == 0 and not calls and build.stats["compiles"] == before
    assert f"compile step skipped: {settings.DISABLE_JIT_ENV} is set" in out


def test_demo_refuses_a_bad_disable_jit(monkeypatch, capsys):
    monkeypatch.setenv(settings.DISABLE_JIT_ENV, "maybe")
    rc = cli_main(["demo", "--batch", "2", "--mean-len", "64"])
    err = capsys.readouterr().err
    assert rc == 2 and settings.DISABLE_JIT_ENV in err and "'maybe'" in err


# -- item 7: locations and arguments --------------------------------------------------------

def test_empty_cache_dir_option_means_the_default_like_the_empty_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(settings.CACHE_DIR_ENV, "")
    default = settings.cache_dir()
    assert settings.cache_dir("") == default == tmp_path / "xdg" / "nvrtc_gather"
    work = tmp_path / "work"
    work.mkdir()
    r = _cli("warmup", "--arch", "sm_90", "--no-progress", "--cache-dir", "", cwd=work,
             env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    _no_traceback(r)
    assert r.returncode == 0 and not list(work.iterdir()), (os.listdir(work), r.stderr[-2000:])
    assert any(n.endswith(".bin") for n in os.listdir(default))


@pytest.mark.parametrize("home", ["", "~nosuchuser", "relative/dir"])
def test_a_home_that_is_not_an_absolute_path_is_named(home, monkeypatch):
    monkeypatch.delenv(settings.CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", home)
    with pytest.raises(CacheLocationError, match=f"HOME={home!r} is not an absolute path"):
        settings.cache_dir()


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    monkeypatch.delenv(settings.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert settings.cache_dir() == tmp_path / ".cache" / "nvrtc_gather"


def test_version_with_extra_arguments_is_refused(capsys):
    assert cli_main(["--version", "extra", "junk"]) == 2
    assert "--version takes no arguments" in capsys.readouterr().err
    assert cli_main(["--version"]) == 0 and nvrtc_gather.__version__ in capsys.readouterr().out


def test_dev_null_as_the_cache_says_not_a_directory(caplog):
    from nvrtc_gather.jit import cubin_cache
    import logging

    disk = cubin_cache.DiskCache("/dev/null")
    assert disk.directory_problem(create=True) == "it is not a directory"
    with caplog.at_level(logging.INFO, logger="nvrtc_gather"):
        build.build_image(__import__("nvrtc_gather.kernels.gather", fromlist=["x"]).MODULES[16],
                          compiler.Target("sm_90"), disk=disk)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "cached in /dev/null" not in text and "it is not a directory" in text, text


# -- the battery, rerun: every command against hostile locations and encodings ---------------

def _hostile_settings(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/\xfe\xff"
    afile = tmp_path / "a_file"
    afile.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    long = str(tmp_path / ("x" * 300))
    return {
        "surrogate --cache-dir": ([os.fsdecode(raw)], {}),
        "surrogate XDG": ([], {"XDG_CACHE_HOME": os.fsdecode(raw)}),
        "file as cache": ([], {settings.CACHE_DIR_ENV: str(afile)}),
        "fifo as cache": ([], {settings.CACHE_DIR_ENV: str(fifo)}),
        "/dev/null": ([], {settings.CACHE_DIR_ENV: "/dev/null"}),
        "name too long": ([], {settings.CACHE_DIR_ENV: long}),
        "empty HOME": ([], {"HOME": "", "XDG_CACHE_HOME": ""}),
        "~user HOME": ([], {"HOME": "~nosuchuser", "XDG_CACHE_HOME": ""}),
        "newline path": ([], {settings.CACHE_DIR_ENV: str(tmp_path / "a\nb")}),
    }


@pytest.mark.parametrize("command,encoding", [(("cache", "list"), "ascii"), (("cache", "verify"), "utf-8:strict"),
                                              (("cache", "clear"), "utf-8:strict"), (("info",), "ascii")],
                         ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_battery_no_command_prints_a_traceback(command, encoding, tmp_path):
    for name, (cache_dir, env) in _hostile_settings(tmp_path).items():
        argv = list(command)
        if cache_dir and command[0] == "cache":
            argv += ["--cache-dir", *cache_dir]
        elif cache_dir:
            env = {settings.CACHE_DIR_ENV: cache_dir[0]}
        r = _cli(*argv, env={"PYTHONIOENCODING": encoding, **env})
        err = r.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, (name, err[-3000:])
        assert r.returncode in (0, 1, 2), (name, r.returncode, err[-2000:])
        (r.stdout + r.stderr).decode("ascii" if encoding == "ascii" else "utf-8")  # printable as promised
