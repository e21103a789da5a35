"""Finding and reading the CUDA C sources in cuda_src/.

The sources ship inside the wheel as ``nvrtc_gather/cuda_src`` (pyproject.toml maps
the top-level ``cuda_src/`` there); in a plain checkout they sit beside the package."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=None)
def source_dir() -> Path:
    for candidate in (_PACKAGE_DIR / "cuda_src", _PACKAGE_DIR.parent / "cuda_src"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(
        f"nvrtc_gather's CUDA sources (cuda_src/) were not found next to {_PACKAGE_DIR}; "
        "reinstall the package (pip install --force-reinstall nvrtc-gather)"
    )


@lru_cache(maxsize=None)
def read_source(name: str) -> str:
    """Text of one file of cuda_src/, by bare file name."""
    return (source_dir() / name).read_text(encoding="utf-8")


def headers() -> dict[str, str]:
    """Every header (``*.cuh``) by include name. They are handed to NVRTC as text, so no
    include path (and no absolute path) ever reaches the compiler options or the cache key."""
    return {p.name: read_source(p.name) for p in sorted(source_dir().glob("*.cuh"))}


def module_source(module) -> str:
    """What NVRTC compiles for a KernelModule: its source file (from cuda_src/, or from its own
    ``source_dir``: a build that is not the package's, e.g. a benchmark baseline; headers still
    come from cuda_src/), followed by the entry points its spec generates."""
    if module.source_dir is None:
        text = read_source(module.source)
    else:
        text = (Path(module.source_dir) / module.source).read_text(encoding="utf-8")
    wrappers = module.entry_wrappers()
    return text + ("\n// Entry points of module " + module.name + " (generated from its spec)\n" + wrappers
                   if wrappers else "")
