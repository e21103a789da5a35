#!/usr/bin/env bash
# CI: build the sdist, install it into a fresh environment (as a user of the package would,
# not this checkout) and run the CPU test suite from the unpacked sdist against that install.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python -m build --sdist --outdir "$work/dist" . >/dev/null
tar -xzf "$work"/dist/*.tar.gz -C "$work"
src=$(echo "$work"/nvrtc_gather-*/)
# what README's "what is where" says the sdist holds of benchmarks/: the benchmark and its record,
# not the lab notebook (benchmarks/experiments/)
for f in benchmarks/*.py benchmarks/*.cu benchmarks/*.md benchmarks/*.json benchmarks/*.png; do
  [ -f "$src/$f" ] || { echo "the sdist lacks $f" >&2; exit 1; }
done
[ ! -e "$src/benchmarks/experiments" ] || { echo "the sdist ships benchmarks/experiments/" >&2; exit 1; }
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
"$work/venv/bin/python" -m pip install -q "$(echo "$work"/dist/*.tar.gz)[test,cu13]"
rm -rf "$src/nvrtc_gather"   # the tests must import the installed package, not the sdist's copy
cd "$src"
"$work/venv/bin/python" -c 'import nvrtc_gather, sys; print("testing the installed", nvrtc_gather.__file__)'
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider --ignore=tests/packaging
