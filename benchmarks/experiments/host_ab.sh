#!/usr/bin/env bash
# Host cost per call of every entry, two trees in turn (A B A B: the host's speed drifts, and
# each run's torch copy_ is its yardstick): benchmarks/bench.py --host-cost-only of this tree
# and of the tree given (another commit's `git archive`), on the device. Prints each run's
# host-cost table; the JSON records go to $OUT/host_ab/.
#   benchmarks/experiments/host_ab.sh BASE_TREE [rounds]
set -uo pipefail
cd "$(dirname "$0")/../.."
base=$(cd "$1" && pwd) rounds=${2:-2}  # absolute: each run changes into its tree
OUT=${OUT:-out}; mkdir -p "$OUT/host_ab"; OUT=$(cd "$OUT" && pwd)
extra=$(ls -d /tmp/ng-site 2>/dev/null || true)  # the carried wheels (scripts/gpu_check.sh installs them)
for i in $(seq "$rounds"); do
  for tree in "$base" "$PWD"; do
    name=$([ "$tree" = "$PWD" ] && echo new || echo base)
    echo "=== $name (round $i) ==="
    (cd "$tree" && PYTHONPATH=$tree${extra:+:$extra} python3 benchmarks/bench.py "$OUT/host_ab/${name}_$i" \
       --host-cost-only > "$OUT/host_ab/${name}_$i.log" 2>&1; echo "[exit $?]")
    sed -n '/host cost per call/,/^$/p' "$OUT/host_ab/${name}_$i/bench.md" 2>/dev/null || tail -20 "$OUT/host_ab/${name}_$i.log"
  done
done
