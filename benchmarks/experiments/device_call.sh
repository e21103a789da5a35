#!/usr/bin/env bash
# One device call (the carried wheels installed: scripts/carried_wheels.sh): the steps named in STEPS, in
# order, logs in $OUT. rule, copy, req, profile, code (its rows: CODE_ROWS), write, host: the A/B scripts and the Nsight call of NOTES v29-v30;
# readgpu: the index-K read's and the write's GPU test files alone; bench: the record's run; truth: scripts/gpu_check.sh's GPU tests beside its memcheck and
# racecheck stages; any other step: scripts/gpu_check.sh's stage of that name.
#   STEPS="bench cli truth" [TAG=v30] [TRUTH_S=420] bash benchmarks/experiments/device_call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
. scripts/carried_wheels.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, '| nvrtc', m.version('nvidia-cuda-nvrtc'))"
for step in ${STEPS:-bench copy req profile}; do  # a step not named below: scripts/gpu_check.sh's stage
  echo "=== $step $(date +%T) ==="
  case $step in
    rule) REPS=400 python3 benchmarks/experiments/rule_ab.py 8x16384 8x8192 16x4096 4x16384 200x300 32x2048 128x512 2>&1 | tee "$OUT/rule_ab.log" ;;
    code) python3 benchmarks/experiments/code_ab.py ${CODE_ROWS:-} 2>&1 | tee "$OUT/code_ab.log" ;;
    write) python3 benchmarks/experiments/write_ab.py 2>&1 | tee "$OUT/write_ab.log" ;;
    host) python3 benchmarks/experiments/host_breakdown.py 2>&1 | tee "$OUT/host.log" ;;
    readgpu) python3 -m pytest -q -p no:cacheprovider -n ${TEST_WORKERS:-8} tests/gpu/test_index_k_read_gpu.py tests/gpu/test_sglang_triton_gpu.py tests/gpu/test_scatter_gpu.py \
               tests/gpu/test_index_extremes_gpu.py 2>&1 | tee "$OUT/readgpu.log" | tail -12 ;;
    bench) python3 benchmarks/bench.py "$OUT" --skip-first-calls --tag "${TAG:-unlabelled}" > "$OUT/bench.log" 2>&1; tail -5 "$OUT/bench.log" ;;
    copy) VARIANTS=same,rows6 REPS=300 python3 benchmarks/experiments/copy_ab.py 8x16384 4x32768 4096x64 1024x256 2>&1 | tee "$OUT/copy_ab.log" ;;
    req) TILES=1 TILE_LIST="128,4,5 256,4,4 256,8,3" ORDER=shuffle REPS=300 \
           python3 benchmarks/experiments/by_request_ab.py 8x16384 4x32768 2x16384 2>&1 | tee "$OUT/req_ab.log" ;;
    profile) ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg,launch__registers_per_thread,launch__grid_size \
           --kernel-name regex:'index_k_read|gather_indexer|_get_k_and_s' python3 benchmarks/experiments/by_request_ab.py profile 8x16384 1024x256 \
           > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; tail -3 "$OUT/ncu.err" ;;
    # the GPU tests beside gpu_check.sh's memcheck and racecheck stages (each run cut at TRUTH_S seconds)
    truth) timeout ${TRUTH_S:-420} env TEST_WORKERS=${TEST_WORKERS:-12} scripts/gpu_check.sh tests_gpu &
           timeout ${TRUTH_S:-420} scripts/gpu_check.sh memcheck racecheck
           wait ;;
    *) TEST_WORKERS=${TEST_WORKERS:-13} scripts/gpu_check.sh $step ;;
  esac
done
echo "=== done $(date +%T) ==="
