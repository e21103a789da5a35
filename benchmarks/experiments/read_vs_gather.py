"""SGLang's index-K read (our entry) against the indexer gather on the same rows (the gather given
the prefix sums the read computes in-kernel, both allocating their outputs per call as SGLang's
read does) and SGLang 0.5.23's own Triton read: where the read's 0.2-0.7 µs over the gather on
the multi-request rows goes, and whether SGLang's 0-3% lead there is real. Bytes checked equal
first; then 200 interleaved runs each (timing.time_samples: L2 flushed, CUDA events), medians
and the 25th-75th percentiles.

    python3 benchmarks/experiments/read_vs_gather.py

`tiles [BxM ...]`: the read at 64, 128 and 256 rows a block beside the gather and the copy (is
the scan's L2 traffic, which grows with the grid, the 4096x64 row's extra time?).

`profile [BxM ...]` launches our read and gather (checked equal first) PROFILE_REPS times each
per workload, untimed, for Nsight Compute: where the read's extra ~9 µs at 4096 requests of 64
tokens goes (NOTES.md v21: neither its lengths' round trips nor its scan's instructions).

    ncu --clock-control none --csv --print-units base --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        --kernel-name regex:'index_k_read|gather_indexer' \\
        python3 benchmarks/experiments/read_vs_gather.py profile [BxM ...] > ncu_read.csv

`rotate [BxM ...]`: the same three without the L2 flush, each cycling through 8 copies of the
workload's buffers (data cold, code warm): is the read's event-timed gap its code's fetch?

`report ncu_read.csv` prints, per profiled kernel in launch order, its duration, the SM's
shared-memory carve-out it ran with (add `--metrics launch__shared_mem_config_size` to the ncu
command), occupancy, and the warp-state stalls above 0.5 cycles an issued instruction."""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
import paged_batch as pb
from timing import check_same, copy_fn, flush_buffer, time_samples
import nvrtc_gather as ng
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.jit import runtime
from nvrtc_gather.kernels import index_k_read as spec
from nvrtc_gather.ops import index_k_read

WORKLOADS = [(16, 2048), (64, 2048), (1, 131072), (1024, 256)]
PROFILE_WORKLOADS = [(4096, 64), (2048, 128), (1024, 256)]  # the slow row, then the same bytes fast
PROFILE_REPS = 5


def ours(w) -> dict:
    """Our read as SGLang's entry calls it and our gather on the same rows, each allocating its outputs."""
    kv = w.buf.view(w.num_blocks, pb.BLOCK_SIZE, ee.RECORD)

    def gather():
        k = torch.empty(w.tokens, 128, dtype=torch.uint8, device="cuda")
        s = torch.empty(w.tokens, 4, dtype=torch.uint8, device="cuda")
        ng.cp_gather_indexer_k_quant_cache(kv, k.view(torch.float8_e4m3fn), s, w.block_table, w.cu)
        return k, s
    return {"read": lambda: hook.get_index_k_scale_buffer(*w.get_args()), "gather": gather}


def layout_of(w):
    """The layout our read remembered for workload ``w`` (SGLang's sizes), after one call."""
    return index_k_read._layouts.get(index_k_read._key(w.buf, w.lens_t, w.block_table, 64, 128, 128))


def read_on(layout, w):
    """The timed call of our read on ``layout`` (a variant's: forced, rebuilt) for workload ``w``:
    its launch alone (``_run``), with the arguments SGLang's pool passes (``w.get_args()``)."""
    args = w.get_args()
    return lambda: index_k_read._run(layout, *args)


def forced(layout, launch, launchers=None):
    """``layout`` launching, on every call, what ``launch(rows, max_seq_len) -> (rows a block,
    shape, blocks)`` picks (the remembered calls cleared; ``launchers``: (vector width, shape) ->
    launcher, built on first use where not given)."""
    return layout._replace(launch=launch, launchers=dict(launchers or {}), calls={})


def rebuilt(layout, modules: dict, on_load=None):
    """``layout`` with every launcher built from ``modules`` (spec.MODULES' keys -> a module of the
    same entry points: a base or variant build), each loaded module given to ``on_load`` first."""
    launchers = {}
    for vec in spec.VECTOR_WIDTHS:
        handle = runtime.load(modules[(vec, *layout.types)], layout.device, runtime.current_stream(layout.device))
        if on_load is not None:
            on_load(handle)
        for shape in spec.SHAPES:  # a base build from before a shape existed lacks its entry
            # the layout's entry (fixed: its constant-size build), else (a base build without those) the shape's
            names = [spec.entry_name(vec, *layout.types, shape, f) for f in (layout.fixed, False)]
            name = next((n for n in names if n in modules[(vec, *layout.types)].kernels), None)
            if name is not None:
                launchers[vec, shape] = handle.launcher(name, 0, layout.image)
    return layout._replace(launchers=launchers, calls={})


def checked(fns: dict, w, acc, p) -> dict:
    """``fns`` (reads of workload ``w``, the reference first) with SGLang's Triton read added where
    it imports (``acc``, its pool ``p``), every function's bytes checked equal to the first's, and
    a copy of the same bytes added last: the set the scripts time."""
    if acc:
        fns["sglang"] = w.sglang_read(acc, p)
    first, *rest = fns
    want = torch.cat(fns[first](), 1)
    for name in rest:
        check_same(name, torch.cat(fns[name](), 1), want, w.name)
    fns["copy"] = copy_fn(w.moved)
    return fns


def medians(got: dict) -> str:
    """Each function's median µs and its 25th-75th percentiles, as the scripts print them."""
    q = {k: statistics.quantiles(v, n=4) for k, v in got.items()}
    return "  ".join(f"{k} {statistics.median(v):.2f} ({q[k][0]:.2f}-{q[k][2]:.2f})" for k, v in got.items())


def main():
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in WORKLOADS:
        w = ee.Workload(batch, mean)
        fns = checked(ours(w), w, acc, p)
        print(f"{w.name}: " + medians(time_samples(fns, flush, 200)), flush=True)
        w = None
        torch.cuda.empty_cache()


def profile(workloads):
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)
        check_same("gather", torch.cat(fns["gather"](), 1), torch.cat(fns["read"](), 1), w.name)
        for fn in fns.values():
            for _ in range(PROFILE_REPS):
                fn()
        torch.cuda.synchronize()
        print(f"{w.name}: read and gather x {PROFILE_REPS}", file=sys.stderr)


def tiles(workloads):
    """The read at 64, 128 and 256 rows a block (the 16 KiB entry; at 256 also the wide one, 8
    loads in flight a thread; the policy picks 128 on these rows). Every block scans the lengths
    before its rows, so the grid sets the scan's L2 traffic (O(grid x batch): ~18 MB at 4096x64,
    2048 blocks, beside the copy's ~140 MB through L2). If that traffic is the read's extra time at
    4096 requests, it halves with the grid (256 rows) and doubles with it (64); if the copy phase
    is, the rows a block change little."""
    flush = flush_buffer()
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = ours(w)
        want = torch.cat(fns["read"](), 1)
        layout = layout_of(w)
        for tpc, shape in ((64, ""), (128, ""), (256, ""), (256, "wide")):
            name = f"read {tpc}{' wide' if shape else ''}"
            fixed = forced(layout, lambda n, m, tpc=tpc, shape=shape: (tpc, shape, -(-n // tpc)))
            fns[name] = read_on(fixed, w)
            check_same(name, torch.cat(fns[name](), 1), want, w.name)
        fns["copy"] = copy_fn(w.moved)
        got = time_samples(fns, flush, 200)
        print(f"{w.name} (policy: {layout.launch(w.tokens, w.longest)}): " + "  ".join(
            f"{k} {statistics.median(v):.2f}" for k, v in got.items()), flush=True)
        w = None
        torch.cuda.empty_cache()


def rotate(workloads, copies: int = 8) -> None:
    """The read, the gather and SGLang's read timed with the kernels' code kept warm: no L2 flush;
    each function cycles through ``copies`` separate copies of the workload's buffers instead
    (together over twice the L2), so its data is cold on every call while its code, which every
    call runs, stays in L2. Where the read's event-timed gap over the gather (1.0-1.6 µs at
    64x2048, 0.7-0.8 µs at 1x131072 in NOTES v25, against ~0.3 and ~0 in ncu's kernel times) is
    its code fetched after the flush, the gap shrinks here to the kernel's."""
    acc, p = ee.accessor(), ee.pool()
    no_flush = torch.zeros(1, dtype=torch.int32, device="cuda")
    for batch, mean in workloads:
        ws = [ee.Workload(batch, mean) for _ in range(copies)]
        sets = [ours(w) for w in ws]
        if acc:
            for w, fns in zip(ws, sets):
                fns["sglang"] = w.sglang_read(acc, p)
        want = torch.cat(sets[0]["read"](), 1)
        for name in list(sets[0])[1:]:
            check_same(name, torch.cat(sets[0][name](), 1), want, ws[0].name)
        turn = {name: iter(range(1 << 62)) for name in sets[0]}
        fns = {name: (lambda name=name: sets[next(turn[name]) % copies][name]()) for name in sets[0]}
        print(f"{ws[0].name} ({copies} copies, code warm): " + medians(time_samples(fns, no_flush, 200)), flush=True)
        ws = sets = fns = None
        torch.cuda.empty_cache()


def report(path: str) -> None:
    """A compact view of an ncu --csv file of the sections in the docstring's command."""
    import csv
    kernels = {}
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]
    head = rows[0]
    col = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    for r in rows[1:]:
        k = kernels.setdefault(r[col["ID"]], {"name": r[col["Kernel Name"]]})
        k[r[col["Metric Name"]]] = r[col["Metric Value"]]
    keep = ("Duration", "gpu__time_duration.sum", "launch__shared_mem_config_size", "Achieved Occupancy",
            "Registers Per Thread", "Block Limit Registers", "Block Limit Shared Mem", "Waves Per SM")
    for i, k in kernels.items():
        stalls = sorted(((float(v.replace(",", "")), m) for m, v in k.items()
                         if "stall" in m.lower() and v.replace(",", "").replace(".", "", 1).isdigit()), reverse=True)
        print(i, k["name"][:40], " ".join(f"{m}={k[m]}" for m in keep if m in k),
              "stalls:", ", ".join(f"{m} {v:.2f}" for v, m in stalls if v >= 0.5), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:
        report(sys.argv[2])
        sys.exit()
    args = [tuple(int(x) for x in a.split("x")) for a in sys.argv[2:]] or PROFILE_WORKLOADS
    if sys.argv[1:2] == ["profile"]:
        profile(args)
    elif sys.argv[1:2] == ["tiles"]:
        tiles(args)
    elif sys.argv[1:2] == ["rotate"]:
        rotate([tuple(int(x) for x in a.split("x")) for a in sys.argv[2:]] or WORKLOADS)
    else:
        main()
