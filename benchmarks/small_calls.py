"""Small gathers, repeated: ``python benchmarks/small_calls.py`` on a GPU machine.

The op, the linear-scan baseline (vLLM's approach, bench.py's) and a device copy of the same
bytes on the 1x1000 and 8x100 workloads, three interleaved runs of 600 each with the L2 flushed
before every run (timing.time_samples): these sizes are within noise of each other in one pass,
so the ratios are reported per run, with their spread. bench.py checks the same op and baseline
bit-exact on these workloads before timing them; this script only times."""
import torch

import bench
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.ops import gather

l2, flush = l2_bytes(), flush_buffer()
for rnd in range(3):
    for batch, mean in [(1, 1000), (8, 100)]:
        w = bench.Workload(batch, mean, l2, seed=batch * 7 + mean)
        k, s = w.outputs()
        src = torch.randint(0, 256, (w.tokens * 132,), dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        fns = {"op": gather.prepared(w.kv, k, s, w.block_table, w.cu), "linear_scan": bench.baseline_prepared(w, k, s),
               "copy": lambda: dst.copy_(src)}
        row = {}
        summarize(row, time_samples(fns, flush, 600))
        print(f"run {rnd} {w.name}: " + ", ".join(
            f"{n} {row[n + '_us']:.2f} [{row[n + '_spread_us'][0]:.2f}-{row[n + '_spread_us'][1]:.2f}]" for n in fns)
              + f"; op/copy {row['op_us'] / row['copy_us']:.3f}, scan/op {row['linear_scan_us'] / row['op_us']:.3f}",
              flush=True)
