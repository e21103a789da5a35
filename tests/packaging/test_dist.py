"""The distributions: the wheel holds the package and its CUDA sources, and nothing of the
benchmarks or tests; the sdist holds what the tests need; a wheel installed on its own (not
this checkout) imports, compiles a kernel from its shipped sources and answers the CLI.
(.ci/run also installs the sdist into a fresh environment and runs the CPU suite from it.)"""
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# Build with the setuptools installed here, in this process's environment (no isolated build
# environment: that would fetch setuptools from a package index, and GPU images have none).
# (The backend rewrites sys.argv: read the output directory first.)
_BUILD = ("import sys\nfrom setuptools import build_meta as backend\nout = sys.argv[1]\n"
          "print(backend.build_sdist(out))\nprint(backend.build_wheel(out))\n")


def _backend_problem() -> str | None:
    """Why the build backend pyproject.toml names cannot run here, or None."""
    need = re.search(r'requires = \["setuptools>=(\d+)"\]', (ROOT / "pyproject.toml").read_text())
    assert need, "pyproject.toml's build-system.requires changed: update this test"
    try:
        import setuptools
    except ImportError:
        return f"setuptools is not installed and the build uses what is installed (setuptools>={need[1]} needed)"
    have = int(setuptools.__version__.split(".")[0])
    if have < int(need[1]):
        return (f"setuptools {setuptools.__version__} is installed; the build backend needs setuptools>={need[1]} "
                "(PEP 639 license fields) and the build uses what is installed (no package index is assumed): "
                "pip install 'nvrtc-gather[test]' brings it")
    return None


def _build_lock() -> Path:
    """A lock file for building this checkout. The backend stages files in the checkout itself
    (nvrtc_gather-<version>/ and the egg-info beside pyproject.toml), so two builds of one checkout
    at once, as pytest-xdist workers that each run this module's fixture start them, delete each
    other's files: one build of a checkout at a time."""
    return Path(tempfile.gettempdir()) / f"nvrtc_gather_build_{hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]}.lock"


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    problem = _backend_problem()
    if problem:
        pytest.skip(problem)
    out = tmp_path_factory.mktemp("dist")
    with open(_build_lock(), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = subprocess.run([sys.executable, "-c", _BUILD, str(out)], cwd=ROOT, capture_output=True, text=True,
                           timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
    return wheel, sdist


def test_wheel_ships_the_package_and_kernels_only(dists):
    wheel, _ = dists
    names = zipfile.ZipFile(wheel).namelist()
    for need in ("nvrtc_gather/__init__.py", "nvrtc_gather/py.typed", "nvrtc_gather/ops/gather.py",
                 "nvrtc_gather/jit/runtime.py", "nvrtc_gather/kernels/gather.py", "nvrtc_gather/cli/__init__.py", "nvrtc_gather/integrations/vllm.py",
                 "nvrtc_gather/cuda_src/gather_indexer_k.cu", "nvrtc_gather/cuda_src/common.cuh"):
        assert need in names, need
    assert not [n for n in names if n.startswith(("benchmarks/", "tests/")) or "bench" in n.split("/")[-1]], names
    meta = "\n".join(zipfile.ZipFile(wheel).read(n).decode() for n in names
                     if n.endswith(("METADATA", "entry_points.txt")))
    assert "License-Expression: Apache-2.0" in meta and "Classifier: Operating System :: POSIX :: Linux" in meta
    assert "Provides-Extra: cu12" in meta and "Provides-Extra: cu13" in meta
    assert "nvrtc_gather = nvrtc_gather.integrations.vllm:plugin" in meta
    assert "[sglang.srt.plugins]\nnvrtc_gather = nvrtc_gather.integrations.sglang_plugin:plugin" in meta
    assert "nvrtc_gather/integrations/sglang_plugin.py" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_sdist_holds_what_the_tests_need(dists):
    _, sdist = dists
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for need in ("LICENSE", "README.md", "pyproject.toml", "cuda_src/gather_indexer_k.cu", "tests/conftest.py",
                 "tests/helpers/reference.py", "tests/helpers/cuda_host_emu.cpp", "scripts/setup.sh",
                 "docs/contract.md", "docs/architecture.md"):
        assert need in names, need
    # every file of the tests (their C and C++ sources among them): the sdist's suite reads them
    tracked = subprocess.run(["git", "ls-files", "tests"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert [f for f in tracked.stdout.split() if f not in names] == []
    # every local file benchmarks/README.md shows or links (its chart, record.png, among them)
    shown = re.findall(r"\]\(([^)#:]+)\)", (ROOT / "benchmarks" / "README.md").read_text())
    assert "record.png" in shown
    for rel in shown:
        assert f"benchmarks/{rel}" in names, rel


def test_installed_wheel_works_on_its_own(dists, tmp_path):
    wheel, _ = dists
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, timeout=300)
    code = ("import sys, nvrtc_gather, nvrtc_gather.cli as cli\n"
            f"assert nvrtc_gather.__file__.startswith({str(target)!r}), nvrtc_gather.__file__\n"
            "from nvrtc_gather.jit import compiler, sources\nfrom nvrtc_gather.kernels import gather as gather_kernels\n"
            f"assert str(sources.source_dir()).startswith({str(target)!r})\n"
            "img = compiler.compile_module(gather_kernels.MODULES[16], compiler.Target('sm_90')).image\n"
            "assert img[:4] == b'\\x7fELF'\n"
            "sys.exit(cli.main(['--version']))\n")
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith("nvrtc-gather ")


def test_the_readmes_wheel_install_line_resolves(dists):
    """README "Installing": ``pip install "<wheel>[cu13]"`` (the wheel's path with the extra) resolves
    against what is installed here (setup.sh installed torch and the cu13 extra's packages), with
    no package index: pip would install the wheel and nothing else."""
    wheel, _ = dists
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", f"{wheel}[cu13]"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # pip would install the wheel and nothing else, or nothing at all where this very version is
    # installed already (the H200 image's environment)
    would = re.findall(r"^Would install (.+)$", r.stdout, re.M)
    already = "nvrtc-gather is already installed with the same version as the provided wheel" in r.stdout
    assert (len(would) == 1 and re.fullmatch(r"nvrtc[-_]gather-\S+", would[0].strip())) or (not would and already), \
        r.stdout


def test_an_old_setuptools_is_a_skip_reason_naming_the_cause(monkeypatch):
    """Where no package index is reachable (GPU images) and setuptools is older than the
    backend needs, the build tests skip and say why, instead of erroring."""
    import setuptools
    monkeypatch.setattr(setuptools, "__version__", "69.5.1")
    reason = _backend_problem()
    assert reason and "setuptools 69.5.1" in reason and "setuptools>=77" in reason
