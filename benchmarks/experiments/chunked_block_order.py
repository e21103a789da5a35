"""Does the placement of a request's cache blocks cost the chunked gathers anything (issue 27:
one large request at 1.10-1.13x a device copy_)? The benchmark's workloads with their blocks
shuffled over a cache of 4x the L2 (as recorded), shuffled over a cache of just the blocks they
use ("compact"), and in order (block_table row = 0, 1, 2, ..., so the source is one contiguous
run at the cache's start), the op and the vLLM-style baseline on each, and a
device copy_ of the same bytes; outputs checked byte for byte against the torch path, all
timed interleaved, L2 flushed before each run. From the repository root with
PYTHONPATH=.:benchmarks: ``python benchmarks/experiments/chunked_block_order.py``."""
import torch

import bench_cache_gather as b
from bench_mla import _copy_fns, _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch


def in_order(w: b.Workload) -> None:
    """Renumber w's blocks so that its block_table, read row by row, is 0, 1, 2, ..."""
    bt = w.block_table.cpu()
    k = 0
    for r in range(bt.shape[0]):
        used = -(-(w.starts[r] + w.lens[r]) // b.BLOCK_SIZE) if w.lens[r] else 0
        bt[r, :used] = torch.arange(k, k + used, dtype=torch.int32)
        k += used
    w.block_table = bt.to(w.device)


l2, flush = l2_bytes(), flush_buffer()
for variant in b.VARIANTS:
    for seq in (False, True):
        for batch, mean in [(1, 65536), (1, 131072), (8, 16384), (4096, 64)]:
            fns = {}
            for order in ("shuffled", "compact", "in_order"):
                w = b.Workload(batch, mean, variant, seq, 0 if order == "compact" else l2, seed=batch * 7 + mean)
                if order == "in_order":
                    in_order(w)
                want = w.dst()
                gather_torch(cache_gather.plan_for(w.op, *w.args(want)), *b._torch_args(w, want))
                for who in ("op", "baseline"):
                    dst = w.dst()
                    fn = b._op(w, dst) if who == "op" else b.baseline(w, dst)
                    fn()
                    torch.cuda.synchronize()
                    if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                        raise AssertionError(f"{who} {order} differs on {w.title}: " + _first_diff(dst, want))
                    fns[f"{who}_{order}"] = fn
                title, moved = w.title, w.moved
            fns["copy"] = _copy_fns(moved, torch.Generator(device="cuda").manual_seed(batch))
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{title:>42}: copy {row['copy_us']:.2f}; x copy: "
                  + " ".join(f"{n} {row[n + '_us'] / row['copy_us']:.3f}" for n in fns if n != "copy"), flush=True)
            w = fns = want = dst = fn = None
            torch.cuda.empty_cache()
