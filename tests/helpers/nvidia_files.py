"""Files of NVIDIA's pip wheels (the ``nvidia`` namespace package: nvidia/cu13/bin/nvdisasm,
nvidia/cu13/include/cuda.h, ...), which the test extra installs for the tests that read them."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def nvidia_file(pattern: str) -> Path | None:
    """The first file under the installed ``nvidia`` packages matching ``pattern`` (a glob
    relative to a namespace root, e.g. ``*/bin/nvdisasm``), or None."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else ()):
        for found in sorted(Path(root).glob(pattern)):
            return found
    return None
