#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh installs on the device (it has no package index), into .whl/
# (git-ignored; pass it to the device tool as a carried path): SGLang 0.5.23, for the GPU tests
# and benchmark rows against its own Triton kernels, with the modules its index-K accessor and
# V4 module import that the device image lacks (found by importing them in a loop over
# ModuleNotFoundError; benchmarks/NOTES.md, "Session of 2026-12-05 (sixth)"), and nvdisasm for
# tests/jit/test_sass_order.py. Built for the device's Python (3.12, x86_64 manylinux).
#   scripts/device_wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
mkdir -p .whl
pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl \
  sglang==0.5.23 orjson==3.13.0 pybase64==1.5.1 starlette==1.10.0 msgspec==0.23.0 pydantic==2.14.4 \
  pydantic_core==2.50.5 typing_inspection==0.4.5 pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1 \
  apache-tvm-ffi==0.1.15.post2 nvidia-cuda-nvdisasm==13.5.37
du -sh .whl
