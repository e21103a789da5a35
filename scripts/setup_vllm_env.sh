#!/usr/bin/env bash
# Create .venv-vllm: vLLM's own package beside a CPU torch, for tests/integrations/test_vllm_real.py
# (our plugin loaded by vLLM's plugin loader, vLLM's own op wrappers called; no GPU).
#   VLLM_SPEC   the vLLM to install (default vllm==0.33.0, a 336 MB wheel)
#   TORCH_SPEC  the torch beside it (default torch==2.13.0, the CPU wheel setup.sh uses)
#   VENV        where (default .venv-vllm)
# vLLM is installed with --no-deps: its full dependency set is a CUDA stack of several GB. What
# `import vllm.plugins`, `vllm._custom_ops` and the worker module need on CPU is listed below.
# vLLM pins another torch (0.33.0: torch==2.14.0); its compiled ops need libtorch_cuda and are
# never loaded here, so the CPU torch is enough for what the test calls.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.33.0}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
# pip ends each install with a check of every installed package's requirements: with vLLM
# installed --no-deps, that lists dozens of "vllm ... requires X, which is not installed" lines,
# all expected (see above). They are counted and left out; any other output passes through.
pip_install() {
    local log status=0 left
    log=$(mktemp)
    "${PIP[@]}" "$@" 2>"$log" || status=$?
    grep -v -e "which is not installed\.$" -e "dependency resolver does not currently take into account" "$log" >&2 || true
    left=$(grep -c "which is not installed\.$" "$log" || true)
    [ "$left" -eq 0 ] || echo "($left 'requires ..., which is not installed' lines from pip left out: expected, vLLM is installed without its dependencies)"
    rm -f "$log"
    return "$status"
}
pip_install "$TORCH_SPEC"
pip_install --no-deps "$VLLM_SPEC"
# msgspec: vLLM's own general plugins (LoRA resolvers) import it; without it vLLM logs their failure.
pip_install typing_extensions packaging regex requests numpy psutil pyzmq msgspec
# This checkout, editable, so that vLLM's loader finds our vllm.general_plugins entry point.
pip_install --no-deps -e .
echo "vLLM test environment in $VENV: $("$VENV/bin/python" -c 'import importlib.metadata as m; print("vllm", m.version("vllm"), "torch", m.version("torch"))')"
