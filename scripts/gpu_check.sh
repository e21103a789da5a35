#!/usr/bin/env bash
# Everything that needs the GPU in one go (one device call): the test suite, the CLI as a
# user runs it, the GPU tests again under compute-sanitizer memcheck, and the benchmark.
#   scripts/gpu_check.sh [tests] [cli] [quick] [gpu] [twogpu] [memcheck] [racecheck] [resources] [bench] [bench_mla] [PATH ...]
#   (default: tests cli memcheck bench; tests_gpu + tests_emulator + tests_rest = tests in three parts,
#   tests/gpu and tests/integrations, tests/emulator, then the rest, for device calls shorter than
#   the whole suite (tests_rest with the emulator ran past 600 s on the H200 machine); cli = demo, info, warmup, cache list / verify --arch of this
#   GPU in a fresh cache directory; quick = the GPU tests without the slow ones; gpu = tests/gpu
#   and tests/integrations, slow ones included; twogpu = tests/gpu/test_two_gpus.py alone (tensor-parallel
#   workers, one per GPU, and one process on two GPUs; its 2-GPU parts skip with the reason on one GPU);
#   resources = registers, shared memory and spills of every module's kernels for this GPU;
#   profile = the gather builds' kernel durations under Nsight Compute (benchmarks/experiments/profile_gather.py);
#   bench = benchmarks/bench.py, every family (indexer, mla, chunked; --families / --skip in BENCH_ARGS
#   choose, --skip-mla leaves out mla and chunked, --skip-chunked the latter); bench_mla = the same
#   driver on the MLA families alone (--families mla,chunked; BENCH_MLA_ARGS passes more options);
#   a PATH is a test file run on its own; BENCH_ARGS passes options to the benchmark,
#   PROFILE_ARGS workloads (BATCHxMEAN ...) to the profile)
# Logs and results go to $OUT (the device tool's output folder) or ./out.
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# SGLang's wheels carried in .whl/ for its GPU tests (tests/gpu/test_sglang_triton_gpu.py), which
# must then run rather than skip.
. scripts/carried_wheels.sh || status=1
# accessor: SGLang must import, but only its accessor's imports are carried (not its backends')
ls .whl/sglang-*.whl > /dev/null 2>&1 && export NVRTC_GATHER_REQUIRE_SGLANG=accessor
# One compute-sanitizer run (its tool, then pytest's paths and options) of the fast GPU tests,
# appended to $OUT/<tool>.log, its summary lines shown; a failure sets status
sanitize() {
  local tool=$1; shift
  compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 python3 -m pytest -q -m "gpu and not slow" \
    "$@" 2>&1 | tee -a "$OUT/$tool.log" | tail -8 || status=1
}
stages=${*:-tests cli memcheck bench}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, '| cuda-bindings', m.version('cuda-bindings'), '| nvidia-cuda-nvrtc', m.version('nvidia-cuda-nvrtc'))"
for stage in $stages; do
  echo "=== $stage ==="
  case $stage in
    tests|tests_gpu|tests_emulator|tests_rest)
      # pytest-xdist where installed (the H200 image has it): tests spread over the workers, each
      # test's name and outcome in the log; TEST_WORKERS=0 runs in one process
      par=$(python3 -c "import xdist" 2>/dev/null && [ "${TEST_WORKERS:-8}" != 0 ] && echo "-n ${TEST_WORKERS:-8} --dist load -v" || echo -q)
      case $stage in
        tests) paths="tests" ;;
        tests_gpu) paths="tests/gpu tests/integrations" ;;
        tests_emulator) paths="tests/emulator" ;;
        tests_rest) paths="tests --ignore=tests/gpu --ignore=tests/integrations --ignore=tests/emulator" ;;
      esac
      python3 -m pytest -rfEs -p no:cacheprovider $par $paths > "$OUT/pytest_$stage.log" 2>&1 || status=1
      grep -E "^(FAILED|ERROR)|^SKIPPED|passed|failed" "$OUT/pytest_$stage.log" | tail -40 ;;
    cli)
      cc=$(python3 -c "import torch; print('%d%d' % torch.cuda.get_device_capability())")
      export NVRTC_GATHER_CACHE_DIR=$(mktemp -d)
      { for cmd in "demo" "info" "warmup --no-progress" "cache list" "cache verify --arch sm_$cc"; do
          # as a user runs it: without the tests' switch (info would call it an unknown variable)
          echo "\$ nvrtc-gather $cmd"; env -u NVRTC_GATHER_REQUIRE_SGLANG python3 -m nvrtc_gather $cmd; rc=$?; echo "[exit $rc]"
        done; } 2>&1 | tee "$OUT/cli.log"
      grep -q "exit [^0]" "$OUT/cli.log" && status=1
      unset NVRTC_GATHER_CACHE_DIR ;;
    quick)
      python3 -m pytest -q -rs -p no:cacheprovider -m "gpu and not slow" tests 2>&1 | tee "$OUT/quick.log" | tail -25 || status=1 ;;
    gpu)
      python3 -m pytest -q -rs -p no:cacheprovider tests/gpu tests/integrations 2>&1 | tee "$OUT/gpu.log" | tail -25 || status=1 ;;
    twogpu)
      nvidia-smi -L
      python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_two_gpus.py 2>&1 | tee "$OUT/twogpu.log" | tail -25 || status=1 ;;
    memcheck)
      : > "$OUT/memcheck.log"  # one log for the five runs (a device call brings back 8 files at most)
      sanitize memcheck tests/gpu/test_gather_gpu.py tests/gpu/test_quant_gpu.py tests/gpu/test_index_extremes_gpu.py \
        -k "not second_process"
      # the MLA-cache ops: their bad-index and misalignment tests (the whole grid would take long under memcheck)
      sanitize memcheck tests/gpu/test_mla_gpu.py -k "bad_indices or slots_past or misalignment or nothing_to_do or padding_only"
      # the chunked-context gathers: bad indices, the ANY entry points, cut rows
      sanitize memcheck tests/gpu/test_cache_gather_gpu.py -k "bad_indices or misaligned or rows_cut or fast_path"
      # SGLang's index-K read and DeepSeek-V4's record gathers: bad values, small calls, vLLM's form
      sanitize memcheck tests/gpu/test_index_k_read_gpu.py tests/gpu/test_dsv4_gather_gpu.py \
        -k "bad_values or bad_indices or shape0 or shape1 or vllm_form or flat_forms or request_major"
      # SGLang's index-K write (the scatter): every width, its fixed-layout entries, slots past the cache
      sanitize memcheck tests/gpu/test_scatter_gpu.py -k "not many_tokens" ;;
    racecheck)
      : > "$OUT/racecheck.log"  # one log for the four runs, as memcheck's
      sanitize racecheck tests/gpu/test_gather_gpu.py tests/gpu/test_quant_gpu.py -k "37 or wide"
      # the MLA gather (shared memory between its search and copy phases) and the write (warp shuffles)
      sanitize racecheck tests/gpu/test_mla_gpu.py -k "forced_rows_per_cta or request_search or round_trip"
      # the chunked-context gathers (shared memory between the row search and the copy)
      sanitize racecheck tests/gpu/test_cache_gather_gpu.py -k "request_counts and (33 or 1024)"
      # SGLang's index-K read (shared memory between its lengths' scan, row search and copy)
      sanitize racecheck tests/gpu/test_index_k_read_gpu.py -k "read_matches or request_major" ;;
    resources)
      mkdir -p "$OUT/cubins"
      python3 -c "
from nvrtc_gather import kernels
from nvrtc_gather.jit import compiler, driver
t = compiler.pick_target(driver.capability(0))
for m in kernels.ALL_MODULES:
    open(f'$OUT/cubins/{m.name}.{t.arch}.cubin', 'wb').write(compiler.compile_module(m, t).image)
" && for f in "$OUT"/cubins/*.cubin; do echo "$(basename "$f")"; cuobjdump --dump-resource-usage "$f" | grep -E "Function|REG"; done \
        2>&1 | tee "$OUT/resources.log" | grep -E "cubin|gather" -A1 | head -60 || status=1 ;;
    profile)
      ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,launch__shared_mem_config_size \
        --kernel-name regex:'gather_indexer|baseline' python3 benchmarks/experiments/profile_gather.py run ${PROFILE_ARGS:-} > "$OUT/ncu.csv" \
        && python3 benchmarks/experiments/profile_gather.py report "$OUT/ncu.csv" ${PROFILE_ARGS:-} | tee "$OUT/profile.log" || status=1 ;;
    bench)
      python3 benchmarks/bench.py "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1 ;;
    bench_mla)
      mkdir -p "$OUT/bench_mla"
      python3 benchmarks/bench.py "$OUT/bench_mla" --families mla,chunked ${BENCH_MLA_ARGS:-} 2>&1 | tee "$OUT/bench_mla.log" || status=1 ;;
    *) python3 -m pytest -q -rs $stage 2>&1 | tail -25 || status=1 ;;
  esac
done
exit $status
