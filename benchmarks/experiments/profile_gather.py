"""Kernel durations of the gather and its benchmark builds under Nsight Compute, which
flushes the caches before each kernel and reads the GPU's own timer: no event or launch
overhead in the number, so differences of a few hundred nanoseconds show.

    ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,launch__shared_mem_config_size \\
        --kernel-name regex:'gather_indexer|baseline' python3 benchmarks/experiments/profile_gather.py run [BxM ...] > ncu.csv
    python3 benchmarks/experiments/profile_gather.py report ncu.csv [BxM ...]

`run` launches, per workload, every configuration REPS times in a fixed order;
`report` groups ncu's rows back by that order and prints medians."""
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the indexer family

WORKLOADS = [(1, 131072), (64, 2048), (4, 32768), (1, 70000), (1, 40000), (8, 131072), (4096, 64), (1, 1000),
             (8, 100)]
REPS = 15


# (label, benchmark build or None for the op, rows per block or None for the op's rule; at
# head_dim 128, 256 rows run the wide kernels): "baseline" is the linear scan
CONFIGS = (("op", None, None), ("control", "control", None), ("op, 16K blocks", None, 128),
           ("op, 32K wide", None, 256), ("linear scan", "baseline", None))


def run(workloads) -> None:
    import torch

    import indexer
    import timing
    from nvrtc_gather.ops import gather
    for batch, mean in workloads:
        w = indexer.GatherWorkload(batch, mean, timing.l2_bytes(), seed=batch * 7 + mean)
        k, s = w.outputs()
        for _, module, tpc in CONFIGS:
            fn = indexer.baseline_prepared(w, k, s) if module == "baseline" else gather.prepared(
                *w.args(k, s), module=indexer.GATHER_CONTROL if module else None, tokens_per_cta=tpc)
            for _ in range(REPS):
                fn()
        torch.cuda.synchronize()
        print(f"{w.name}: {len(CONFIGS)} configurations x {REPS}", file=sys.stderr)


def report(path: str, workloads) -> None:
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    head, rows = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(head)}
    per_launch = {}  # launch id -> {metric: value}
    for r in rows:
        per_launch.setdefault(int(r[col["ID"]]), {})[r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    launches = [per_launch[i] for i in sorted(per_launch)]
    names = [c[0] for c in CONFIGS]
    print("kernel duration, median us (shared-memory carve-out the driver chose)")
    print(f"{'workload':>10} " + " ".join(f"{n[:18]:>18}" for n in names))
    i = 0
    for batch, mean in workloads:
        cells = []
        for _ in names:
            group = launches[i:i + REPS]
            i += REPS
            t = statistics.median(g["gpu__time_duration.sum"] for g in group)
            cfg = group[0].get("launch__shared_mem_config_size", float("nan"))
            cells.append(f"{t / 1000:7.2f} ({cfg / 1024:3.0f}K)")
        print(f"{f'{batch}x{mean}':>10} " + " ".join(f"{c:>18}" for c in cells))
    if i != len(launches):
        print(f"warning: {len(launches)} launches profiled, {i} expected")


if __name__ == "__main__":
    named = [tuple(int(x) for x in a.split("x")) for a in sys.argv[2 + (sys.argv[1:2] == ["report"]):]] or WORKLOADS
    if sys.argv[1:2] == ["run"]:
        run(named)
    elif sys.argv[1:2] == ["report"] and len(sys.argv) >= 3:
        report(sys.argv[2], named)
    else:
        sys.exit(__doc__)
