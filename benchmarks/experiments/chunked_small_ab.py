"""The chunked-context gathers' small calls, tiny kernel against tile kernel (issue 27):
``python benchmarks/experiments/chunked_small_ab.py`` on a GPU machine, from the repository root
with PYTHONPATH=.:benchmarks.

For every workload of bench_cache_gather below 64K tokens (and 1x2000, 32x60), both kernels
and a device copy of the same bytes, interleaved, L2 flushed before each run (timing.time_samples),
600 runs each; both kernels' outputs checked byte for byte against the torch path first."""
import torch

import bench_cache_gather as b
from bench_mla import _copy_fns, _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch

l2, flush = l2_bytes(), flush_buffer()
for variant in b.VARIANTS:
    for seq in (False, True):
        for batch, mean in [(1, 1000), (8, 100), (1, 2000), (32, 60)]:
            w = b.Workload(batch, mean, variant, seq, l2, seed=batch * 7 + mean)
            want = w.dst()
            gather_torch(cache_gather.plan_for(w.op, *w.args(want)), *b._torch_args(w, want))
            fns = {}
            for name, tiny in (("tiny", True), ("tile", False)):
                dst = w.dst()
                fns[name] = cache_gather.prepared(w.op, *w.args(dst), tiny=tiny)
                fns[name]()
                torch.cuda.synchronize()
                if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                    raise AssertionError(f"{name} differs on {w.title}: " + _first_diff(dst, want))
            fns["copy"] = _copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(batch))
            row = {}
            summarize(row, time_samples(fns, flush, 600))
            print(f"{w.title:>40}: " + ", ".join(f"{n} {row[n + '_us']:.2f}" for n in fns)
                  + f"; tiny/copy {row['tiny_us'] / row['copy_us']:.3f}, tile/copy {row['tile_us'] / row['copy_us']:.3f}",
                  flush=True)
