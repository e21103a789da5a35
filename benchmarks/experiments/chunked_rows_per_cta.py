"""The chunked-context gathers' tile kernel at other rows-per-block choices (issue 27: where one
request's 64K-128K-token calls lose their 2-3 us against a copy): the op forced to 7, 14, 28
(its own choice for 576-byte entries: 16 KiB per block), 56 and 112 rows per block, and a device
copy of the same bytes, interleaved, L2 flushed before each run, every build's output checked
byte for byte first. From the repository root with PYTHONPATH=.:benchmarks:
``python benchmarks/experiments/chunked_rows_per_cta.py``."""
import torch

import bench_cache_gather as b
from bench_mla import _copy_fns, _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch

CHOICES = (7, 14, 28, 56, 112)
l2, flush = l2_bytes(), flush_buffer()
for variant in (b.VARIANTS[0], b.VARIANTS[2]):
    for seq in (False, True):
        for batch, mean in [(1, 65536), (1, 131072), (8, 16384), (4096, 64)]:
            w = b.Workload(batch, mean, variant, seq, l2, seed=batch * 7 + mean)
            want = w.dst()
            gather_torch(cache_gather.plan_for(w.op, *w.args(want)), *b._torch_args(w, want))
            own = cache_gather.plan_for(w.op, *w.args(want))
            fns = {}
            for rows in CHOICES:
                dst = w.dst()
                fns[f"r{rows}"] = cache_gather.prepared(w.op, *w.args(dst), rows_per_cta=rows)
                fns[f"r{rows}"]()
                torch.cuda.synchronize()
                if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                    raise AssertionError(f"{rows} rows per block differ on {w.title}: " + _first_diff(dst, want))
            want = None
            fns["copy"] = _copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(batch))
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{w.title:>42} (op's choice {own.rows_per_cta}): copy {row['copy_us']:.2f}; " + ", ".join(
                f"{n} {row[n + '_us'] / row['copy_us']:.3f}" for n in fns if n != "copy"), flush=True)
            w = fns = None
            torch.cuda.empty_cache()
