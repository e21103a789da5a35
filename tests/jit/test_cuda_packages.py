"""Which NVRTC a CUDA 12 or CUDA 13 install uses and what the hints tell users to install,
with the installed packages faked by their metadata (no library is loaded)."""
import re

import pytest

from nvrtc_gather.jit import compiler, cuda_packages


def fake_install(monkeypatch, **versions):
    """Pretend exactly these distributions are installed (name -> version)."""
    installed = {k.replace("_", "-"): v for k, v in versions.items()}
    monkeypatch.setattr(cuda_packages, "installed_version", installed.get)
    compiler.compiler_identity.cache_clear()

    def must_not_load():
        raise AssertionError("NVRTC was loaded to learn its version")
    monkeypatch.setattr(compiler, "nvrtc_version", must_not_load)


@pytest.fixture(autouse=True)
def _fresh_identity():
    yield
    compiler.compiler_identity.cache_clear()


@pytest.mark.parametrize("versions,identity", [
    ({"cuda_bindings": "12.9.4", "nvidia_cuda_nvrtc_cu12": "12.8.93"}, "nvidia-cuda-nvrtc-cu12 12.8.93"),
    ({"cuda_bindings": "13.3.1", "nvidia_cuda_nvrtc": "13.0.88"}, "nvidia-cuda-nvrtc 13.0.88"),
])
def test_identity_of_the_matching_wheel_without_loading_nvrtc(monkeypatch, versions, identity):
    fake_install(monkeypatch, **versions)
    assert compiler.compiler_identity() == identity


@pytest.mark.parametrize("versions", [
    {"cuda_bindings": "12.9.4", "nvidia_cuda_nvrtc": "13.0.88"},            # wheel of another major
    {"cuda_bindings": "13.3.1", "nvidia_cuda_nvrtc": "13.0.88", "nvidia_cuda_nvrtc_cu12": "12.8.93"},  # both
    {"cuda_bindings": "13.3.1"},                                              # a system libnvrtc
])
def test_ambiguous_installs_ask_the_loaded_library(monkeypatch, versions):
    fake_install(monkeypatch, **versions)
    monkeypatch.setattr(compiler, "nvrtc_version", lambda: (12, 4))
    assert compiler.compiler_identity() == "nvrtc 12.4"


# Each printed requirement must name a real distribution with a version that exists on the index
# for that major: nvidia-cuda-nvrtc holds 13.x only, nvidia-cuda-nvrtc-cu12 12.x, cuda-bindings both.
INSTALLABLE = {"nvidia-cuda-nvrtc": r"13(\.\d+)*(\.\*)?", "nvidia-cuda-nvrtc-cu12": r"12(\.\d+)*(\.\*)?"}


def requirements(hint: str) -> list[str]:
    return re.findall(r"'([^']+)'", hint)


def assert_installable(req: str) -> None:
    m = re.fullmatch(r"([a-z0-9-]+)(.*)", req)
    name, spec = m.groups()
    if name == "cuda-bindings":
        assert re.fullmatch(r">=(12\.8|13),<(13|14)", spec), req
        return
    assert name in INSTALLABLE, req
    assert re.fullmatch(r"==" + INSTALLABLE[name], spec), req


@pytest.mark.parametrize("bindings,expect", [("12.9.4", ["nvidia-cuda-nvrtc-cu12==12.*"]),
                                             ("13.5.0", ["nvidia-cuda-nvrtc==13.*"]),
                                             (None, ["cuda-bindings>=13,<14", "nvidia-cuda-nvrtc==13.*",
                                                     "cuda-bindings>=12.8,<13", "nvidia-cuda-nvrtc-cu12==12.*"])])
def test_install_hint_is_installable_as_printed(monkeypatch, bindings, expect):
    fake_install(monkeypatch, **({"cuda_bindings": bindings} if bindings else {}))
    hint = cuda_packages.install_hint()
    assert requirements(hint) == expect
    for req in requirements(hint):
        assert_installable(req)


@pytest.mark.parametrize("major,minor", [(12, None), (12, 4), (13, None), (13, 0)])
def test_driver_match_hints_are_installable(major, minor):
    reqs = requirements(cuda_packages.driver_match_hint(major, minor))
    assert len(reqs) == 2
    for req in reqs:
        assert_installable(req)


def test_every_hint_in_the_package_is_installable():
    """No message anywhere names an NVRTC version that does not exist (e.g. nvidia-cuda-nvrtc==12.*)."""
    from pathlib import Path
    root = Path(compiler.__file__).resolve().parents[1]  # the package
    text = "\n".join(p.read_text() for p in root.rglob("*.py"))
    for req in re.findall(r"'(nvidia-cuda-nvrtc[a-z0-9-]*==[0-9.*]+)'", text):
        assert_installable(req)
    assert "nvidia-cuda-nvrtc==12" not in text
