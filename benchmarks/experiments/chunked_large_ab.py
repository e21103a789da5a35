"""The chunked-context gathers' tile kernel before and after an index-path change (issue 27):
the op's build against a build of another source of cache_gather.cu (the previous one, e.g.
``git show 190a5b5:cuda_src/cache_gather.cu > BEFORE.cu``) and a device copy of the same bytes,
interleaved, L2 flushed before each run, on bench_cache_gather's large workloads; both builds'
outputs checked byte for byte against the torch path first. From the repository root with
PYTHONPATH=.:benchmarks: ``python benchmarks/experiments/chunked_large_ab.py BEFORE.cu``."""
import dataclasses
import sys
from pathlib import Path

import torch

import bench_cache_gather as b
from bench_mla import _copy_fns, _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.kernels import cache_gather as spec
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch

before = Path(sys.argv[1]).resolve()
l2, flush = l2_bytes(), flush_buffer()
for variant in b.VARIANTS:
    for seq in (False, True):
        for batch, mean in [(1, 65536), (1, 131072), (8, 16384), (4096, 64)]:
            w = b.Workload(batch, mean, variant, seq, l2, seed=batch * 7 + mean)
            want = w.dst()
            plan = cache_gather.plan_for(w.op, *w.args(want))
            gather_torch(plan, *b._torch_args(w, want))
            op_module = spec.MODULES[plan.conversion, (plan.vec, plan.svec)]
            old = dataclasses.replace(op_module, name=op_module.name + "_before", source=before.name,
                                      source_dir=str(before.parent))
            fns = {}
            for name, module in (("after", None), ("before", old)):
                dst = w.dst()
                fns[name] = cache_gather.prepared(w.op, *w.args(dst), module=module, tiny=False)
                fns[name]()
                torch.cuda.synchronize()
                if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                    raise AssertionError(f"{name} differs on {w.title}: " + _first_diff(dst, want))
            want = None
            fns["copy"] = _copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(batch))
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{w.title:>42}: " + ", ".join(f"{n} {row[n + '_us']:.2f}" for n in fns)
                  + f"; after/copy {row['after_us'] / row['copy_us']:.3f}, before/copy "
                    f"{row['before_us'] / row['copy_us']:.3f}", flush=True)
            w = fns = None
            torch.cuda.empty_cache()
