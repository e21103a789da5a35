#!/usr/bin/env bash
# Create .venv and install nvrtc_gather with what its tests need.
#   TORCH_SPEC  the torch to install (default torch==2.13.0; on a GPU machine use your
#               CUDA build, e.g. TORCH_SPEC=torch, or an index URL via PIP_EXTRA_INDEX_URL)
#   VENV        where to put the environment (default .venv)
#   CUDA_EXTRA  cu12 or cu13: the NVRTC / cuda-bindings major (default: the CUDA major of the
#               installed torch, cu13 for a CPU build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first and pinned, so the package's "torch>=2.4" is already met by it. Where a CPU wheel
# of that version is served (a local wheel directory or the PyTorch CPU index, as on our CI),
# that is the CPU build; from plain PyPI on Linux, torch==2.13.0 is the default CUDA build
# and pulls its multi-GB nvidia-* wheels even on a machine without a GPU (add
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu, or TORCH_SPEC=torch==2.13.0+cpu with it).
# numpy with it: torch imported without numpy warns "Failed to initialize NumPy" (the line below imports it).
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC" numpy
CUDA_EXTRA=${CUDA_EXTRA:-$("$VENV/bin/python" -c 'import torch; v = torch.version.cuda; print("cu12" if v and v.startswith("12.") else "cu13")')}
"$VENV/bin/python" -m pip install -q -e ".[test,$CUDA_EXTRA]"
echo "installed into $VENV: $("$VENV/bin/python" -c 'import torch, nvrtc_gather; print("nvrtc_gather", nvrtc_gather.__version__, "torch", torch.__version__)')"
