#!/usr/bin/env bash
# The engine-version matrix: the SGLang adapter's tests against each real SGLang release (and the
# vLLM plugin's real-package tests against vLLM 0.33 and 0.34), each in its own environment; one
# summary line per release, e.g. "engine sglang==0.5.23: 154 passed, 5 skipped". Exit 1 if any row
# fails. Measured on the 2-core CI-like machine: 1016 s in all (each SGLang release 100-147 s, vLLM
# 0.33 53 s); vLLM 0.34 adds 56 s (its environment made and removed).
# The default releases: one of each layout SGLang's wheels show (read in every wheel 0.5.10-0.5.23):
# 0.5.10 no plugin loader (register() only), nsa accessor; 0.5.12 loader, nsa accessor, a V4 pool
# making the older single-request read; 0.5.15 srt.layers...dsa accessor, V4's bf16 gather in
# srt.layers...dsv4; 0.5.16 both moved to kernels.ops; 0.5.20 both V4 gathers, unsuffixed names;
# 0.5.22 pool.index_page_size, layout=; 0.5.23 kvcache accessor, _dsv4 names.
#   SGLANG_RELEASES  the releases (default "0.5.10 0.5.12 0.5.15 0.5.16 0.5.20 0.5.22 0.5.23")
#   VLLM_RELEASES    the vLLM releases whose real-package tests run (default "0.33.0 0.34.0")
#   MATRIX_DIR       where the environments go (default: a fresh temporary directory, removed after)
# Each SGLang environment: scripts/setup.sh (CPU torch 2.13.0, this checkout editable), then
# `pip install --no-deps sglang==X` plus what the accessor module's imports need on CPU
# (SGLANG_IMPORT_DEPS below: its chain runs through sglang.srt.utils). Nothing is cached between
# runs (pip --no-cache-dir). NVRTC_GATHER_REQUIRE_SGLANG=1 makes a missing or unimportable
# SGLang a failure, not a skip; a release whose accessor moved fails with its name and the paths
# tried (tests/integrations/test_sglang_real.py).
set -uo pipefail
cd "$(dirname "$0")/.."
RELEASES=${SGLANG_RELEASES:-"0.5.10 0.5.12 0.5.15 0.5.16 0.5.20 0.5.22 0.5.23"}
VLLM_DEFAULT=0.33.0  # scripts/setup_vllm_env.sh's vLLM (.venv-vllm, the main suite's)
VLLM_RELEASES=${VLLM_RELEASES:-"$VLLM_DEFAULT 0.34.0"}
SGLANG_IMPORT_DEPS="numpy orjson psutil pybase64 requests urllib3 idna certifi charset-normalizer triton packaging
  pillow starlette anyio sniffio msgspec pydantic pydantic-core typing-inspection annotated-types pyzmq tqdm ipython
  traitlets pygments aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist apache-tvm-ffi
  huggingface-hub==1.33.0"
# huggingface-hub: SGLang's configure_logger, which the plugin's test runs as a scheduler does,
# imports huggingface_hub.utils (0.5.23; the older releases' transformers needs it anyway).
# 0.5.10-0.5.22 import more at module level on the accessor's chain (sglang/__init__ ->
# transformers with the versions they pin, torchvision.io.decode_jpeg; xgrammar from 0.5.16), and
# every release's attention backends (0.5.23's DeepSeek-V4 backend included) need them too. No CPU build of
# torchvision for torch 2.13 is served to CI (PyPI's needs CUDA torch), so those environments get
# tests/helpers/torchvision_standin: the few torchvision names imported at module level, nothing
# the accessor runs.
MORE_IMPORT_DEPS="transformers==5.12.1 tokenizers==0.22.2 safetensors sentencepiece regex pyyaml
  httpx httpcore h11 httpx2 httpcore2 truststore dill openai partial-json-parser einops compressed-tensors loguru gguf
  xgrammar"
if [ -n "${MATRIX_DIR:-}" ]; then WORK=$MATRIX_DIR; mkdir -p "$WORK"; else WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
summary=()
status=0
t_all=$(date +%s)

row() {  # row NAME LOG SECONDS RC: the summary line of one pytest run
    local counts
    counts=$(grep -E '^[0-9]+ (passed|failed|skipped|error)|^=+ .*(passed|failed|error).* =+$|^[0-9]+ .* in [0-9.]+s' "$2" | tail -1 | sed -E 's/^=+ //; s/ =+$//; s/ in [0-9.]+s.*//')
    summary+=("engine $1: ${counts:-no result} ($3 s)")
    [ "$4" -eq 0 ] || status=1
}

for v in $RELEASES; do
    t0=$(date +%s)
    venv="$WORK/sglang-$v"
    log="$WORK/sglang-$v.log"
    extra=$MORE_IMPORT_DEPS  # every release: the V4 backends' imports too (test_sglang_real.py)
    if ! { VENV="$venv" bash scripts/setup.sh && "$venv/bin/python" -m pip install -q --no-deps "sglang==$v" $SGLANG_IMPORT_DEPS $extra \
           && { [ -z "$extra" ] || cp -r tests/helpers/torchvision_standin/torchvision \
                "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; }; } > "$log" 2>&1; then
        tail -20 "$log"
        summary+=("engine sglang==$v: environment FAILED ($(( $(date +%s) - t0 )) s)")
        status=1
        continue
    fi
    NVRTC_GATHER_REQUIRE_SGLANG=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        tests/integrations/test_sglang_real.py tests/integrations/test_sglang_plugin_real.py \
        tests/integrations/test_sglang_hook.py tests/integrations/test_sglang.py tests/integrations/test_sglang_plugin.py \
        > "$log.pytest" 2>&1
    rc=$?
    [ $rc -eq 0 ] || tail -40 "$log.pytest"
    row "sglang==$v" "$log.pytest" "$(( $(date +%s) - t0 ))" $rc
    rm -rf "$venv"
done

# vLLM: the real-package tests (tests/integrations/test_vllm_real.py, test_vllm_dsv4_real.py) per
# release; the first in .venv-vllm (scripts/setup_vllm_env.sh's default; made here if absent), the
# others each in a fresh environment of the same recipe.
for v in $VLLM_RELEASES; do
    t0=$(date +%s)
    venv=.venv-vllm
    [ "$v" = "$VLLM_DEFAULT" ] || venv="$WORK/vllm-$v"
    if [ -x "$venv/bin/python" ] || VENV="$venv" VLLM_SPEC="vllm==$v" bash scripts/setup_vllm_env.sh > "$WORK/vllm-$v-env.log" 2>&1; then
        got=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || echo "?")
        NVRTC_GATHER_VLLM_VENV="$(cd "$venv" && pwd)" NVRTC_GATHER_REQUIRE_VLLM_ENV=1 .venv/bin/python -m pytest -q \
            -p no:cacheprovider tests/integrations/test_vllm_real.py tests/integrations/test_vllm_dsv4_real.py \
            > "$WORK/vllm-$v.log" 2>&1
        rc=$?
        [ "$got" = "$v" ] || { echo "vllm: $venv holds vllm $got, not $v"; rc=1; }
        [ $rc -eq 0 ] || tail -40 "$WORK/vllm-$v.log"
        row "vllm==$got" "$WORK/vllm-$v.log" "$(( $(date +%s) - t0 ))" $rc
    else
        tail -20 "$WORK/vllm-$v-env.log"
        summary+=("engine vllm==$v: environment FAILED")
        status=1
    fi
    [ "$venv" = .venv-vllm ] || rm -rf "$venv"
done

echo "engine matrix ($(( $(date +%s) - t_all )) s):"
printf '  %s\n' "${summary[@]}"
exit $status
