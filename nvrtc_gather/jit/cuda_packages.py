"""Which pip packages provide NVRTC and the CUDA bindings for each CUDA major, what is
installed, and what to install: the one place install hints are written. Reads package
metadata only; loads no library.

NVRTC's wheel is ``nvidia-cuda-nvrtc-cu12`` for CUDA 12 and ``nvidia-cuda-nvrtc`` for CUDA 13
(that name holds 13.x only); a CUDA build of torch already depends on the one of its major.
cuda-bindings of major N loads NVRTC through cuda.pathfinder, which searches both wheels'
folders, so which library a process loads is unambiguous only when one NVRTC wheel is present."""
from __future__ import annotations

from .._version import installed_version

BINDINGS = "cuda-bindings"
NVRTC_WHEELS = {12: "nvidia-cuda-nvrtc-cu12", 13: "nvidia-cuda-nvrtc"}
_BINDINGS_SPECS = {12: "cuda-bindings>=12.8,<13", 13: "cuda-bindings>=13,<14"}


def major(version: str | None) -> int | None:
    try:
        return int(version.split(".")[0]) if version else None
    except ValueError:
        return None


def bindings_major() -> int | None:
    return major(installed_version(BINDINGS))


def nvrtc_wheels() -> dict[int, tuple[str, str]]:
    """CUDA major -> (distribution, version) of each NVRTC wheel installed."""
    found = {}
    for dist in NVRTC_WHEELS.values():
        version = installed_version(dist)
        if version and major(version) is not None:
            found[major(version)] = (dist, version)
    return found


def nvrtc_spec(cuda_major: int, minor: int | None = None) -> str:
    """A pip requirement for NVRTC of that CUDA major (and minor), quoted for a shell."""
    wheel = NVRTC_WHEELS.get(cuda_major, NVRTC_WHEELS[max(NVRTC_WHEELS)])
    return f"'{wheel}=={cuda_major}.{minor}.*'" if minor is not None else f"'{wheel}=={cuda_major}.*'"


def bindings_spec(cuda_major: int) -> str:
    return f"'{_BINDINGS_SPECS.get(cuda_major, f'cuda-bindings=={cuda_major}.*')}'"


def install_hint() -> str:
    """The pip command that gives this environment a working NVRTC, as printed, runnable."""
    m = bindings_major()
    if m in NVRTC_WHEELS:
        return f"pip install {nvrtc_spec(m)} (NVRTC for the installed cuda-bindings {installed_version(BINDINGS)})"
    return (f"pip install {bindings_spec(13)} {nvrtc_spec(13)} for a CUDA 13 driver, or "
            f"pip install {bindings_spec(12)} {nvrtc_spec(12)} for a CUDA 12 driver "
            "(`nvidia-smi` shows the driver's CUDA version)")


def driver_match_hint(cuda_major: int, minor: int | None = None) -> str:
    """What to install so NVRTC and the bindings match a driver of that CUDA version."""
    return f"pip install {nvrtc_spec(cuda_major, minor)} {bindings_spec(cuda_major)}"
