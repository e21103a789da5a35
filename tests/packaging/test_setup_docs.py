"""What a new user meets first (issue 36, items 10 and 12): the set-up script installs numpy
with torch (torch imported without it warns "Failed to initialize NumPy"), the README never
tells anyone to install the unpublished name from the index, and the README's demo sample shows
the cubin this NVRTC builds now."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_setup_installs_numpy_with_torch_before_importing_torch():
    lines = (ROOT / "scripts" / "setup.sh").read_text().splitlines()
    torch_install = next(i for i, l in enumerate(lines) if "pip install" in l and "TORCH_SPEC" in l)
    first_import = next(i for i, l in enumerate(lines) if "import torch" in l)
    assert "numpy" in lines[torch_install].split(), lines[torch_install]
    assert torch_install < first_import


def test_setup_says_how_to_get_the_cpu_wheel():
    assert "download.pytorch.org/whl/cpu" in README and "torch==2.13.0+cpu" in README


def test_no_command_installs_the_unpublished_name_from_the_index():
    blocks = re.findall(r"```(?:bash|sh|dockerfile)\n(.*?)```", README, re.S)
    hits = [l for b in blocks for l in b.splitlines() if re.search(r"pip install\s+['\"]?nvrtc-gather\b", l)]
    assert blocks and not hits, hits


def test_demo_sample_shows_the_cubin_this_nvrtc_builds():
    from nvrtc_gather.errors import MissingDependencyError
    from nvrtc_gather.jit import compiler
    from nvrtc_gather.kernels import gather as gather_kernels

    m = re.search(r"NVRTC (\d+)\.(\d+): compiled the gather kernel for (sm_\d+) without a GPU \((\d+) bytes", README)
    assert m, "the README's demo sample lost its compile line"
    try:
        have = compiler.nvrtc_version()
    except MissingDependencyError:
        pytest.skip("no NVRTC here")
    if have != (int(m[1]), int(m[2])):
        pytest.skip(f"the sample is NVRTC {m[1]}.{m[2]}'s; this is {have}")
    code = compiler.compile_module(gather_kernels.MODULES[16], compiler.Target(m[3]))
    assert len(code.image) == int(m[4]), f"README says {m[4]} bytes, NVRTC builds {len(code.image)}"
