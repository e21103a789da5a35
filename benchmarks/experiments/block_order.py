"""Does the placement of a request's cache blocks cost the chunked gathers anything (one large
request at 1.10-1.13x a device copy_)? The family's workloads with their blocks shuffled over a
cache of 4x the L2 (as recorded), shuffled over a cache of just the blocks they use ("compact"),
and in order (block_table row = 0, 1, 2, ...: one contiguous run at the cache's start), the op
and the vLLM-style baseline on each, beside a device copy_ of the same bytes; outputs checked
byte for byte against the torch path, all timed interleaved, L2 flushed before each run.

    PYTHONPATH=. python benchmarks/experiments/block_order.py"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the chunked family
import chunked  # noqa: E402
from timing import check_same, copy_fn, flush_buffer, l2_bytes, summarize, time_samples  # noqa: E402
from nvrtc_gather.ops import cache_gather  # noqa: E402
from nvrtc_gather.ops.cache_gather_torch import gather_torch  # noqa: E402


def in_order(w: chunked.Workload) -> None:
    """Renumber w's blocks so that its block_table, read row by row, is 0, 1, 2, ..."""
    bt, k = w.block_table.cpu(), 0
    for r, used in enumerate(w.blocks_per):
        bt[r, :used] = torch.arange(k, k + used, dtype=torch.int32)
        k += used
    w.block_table = bt.to(w.device)


l2, flush = l2_bytes(), flush_buffer()
for variant in chunked.VARIANTS:
    for seq in (False, True):
        for batch, mean in [(1, 65536), (1, 131072), (8, 16384), (4096, 64)]:
            fns = {}
            for order in ("shuffled", "compact", "in_order"):
                w = chunked.Workload(batch, mean, variant, seq, 0 if order == "compact" else l2, seed=batch * 7 + mean)
                if order == "in_order":
                    in_order(w)
                want = w.dst()
                gather_torch(cache_gather.plan_for(w.op, *w.args(want)), *w.torch_args(want))
                for who, make in (("op", chunked.op), ("baseline", chunked.baseline)):
                    dst = w.dst()
                    fns[f"{who}_{order}"] = fn = make(w, dst)
                    fn()
                    torch.cuda.synchronize()
                    check_same(f"{who} {order}", dst, want, w.title)
            fns["copy"] = copy_fn(w.moved)
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{w.title:>42}: copy {row['copy_us']:.2f}; x copy: "
                  + " ".join(f"{n} {row[n + '_us'] / row['copy_us']:.3f}" for n in fns if n != "copy"), flush=True)
            w = fns = want = dst = fn = None
            torch.cuda.empty_cache()
