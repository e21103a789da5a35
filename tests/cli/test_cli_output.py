"""The CLI when its standard output cannot be written (issue 37, item 7): closed (``>&-``), on a
full device (``> /dev/full``), and with stderr gone too. No traceback: exit 1 with one line on
stderr, or nothing where stderr cannot be written either."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# demo: small, CPU-only (no NVRTC compile: DISABLE_JIT skips it), so the test stays quick
COMMANDS = [("--version",), ("--help",), ("info",), ("cache", "list"), ("cache", "verify"),
            ("demo", "--batch", "2", "--mean-len", "16")]


def _closed(fd):
    """A preexec hook closing ``fd`` in the child (the shell's ``>&-``)."""
    return lambda: os.close(fd)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("where", ["closed", "full"])
def test_unwritable_stdout_is_one_line_on_stderr(argv, where, tmp_path):
    err = tmp_path / "err"
    with open(err, "wb") as e:
        if where == "full":
            with open("/dev/full", "wb") as full:
                r = subprocess.run([sys.executable, "-m", "nvrtc_gather", *argv], stdout=full, stderr=e,
                                   timeout=300, env=_env(tmp_path))
        else:
            r = subprocess.run([sys.executable, "-m", "nvrtc_gather", *argv], stderr=e, timeout=300,
                               preexec_fn=_closed(1), env=_env(tmp_path))
    text = err.read_text()
    assert r.returncode == 1, text
    assert "Traceback" not in text and "Exception ignored" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvrtc-gather: error: cannot write to standard output"), text


@pytest.mark.parametrize("argv", COMMANDS[:4], ids=" ".join)
def test_silent_when_stderr_is_gone_too(argv, tmp_path):
    with open("/dev/full", "wb") as full:
        r = subprocess.run([sys.executable, "-m", "nvrtc_gather", *argv], stdout=full, timeout=300,
                           preexec_fn=_closed(2), env=_env(tmp_path))
        assert r.returncode == 1
        r = subprocess.run([sys.executable, "-m", "nvrtc_gather", *argv], stdout=full, stderr=full, timeout=300,
                           env=_env(tmp_path))
        assert r.returncode == 1


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVRTC_GATHER_")}
    return env | {"PYTHONPATH": REPO, "NVRTC_GATHER_CACHE_DIR": str(tmp_path), "NVRTC_GATHER_DISABLE_JIT": "1"}


def test_a_reader_that_left_is_silent(tmp_path):
    r = subprocess.run(f"{sys.executable} -m nvrtc_gather info | head -c 1 >/dev/null; exit ${{PIPESTATUS[0]}}",
                       shell=True, executable="/bin/bash", capture_output=True, text=True, env=_env(tmp_path),
                       timeout=300)
    assert "Traceback" not in r.stderr and r.stderr == "", r.stderr
