"""The wide rows' regression, split: the op, its v14 source, and v14 with only the row search
taken from request_search.cuh (narrow_request). One process, interleaved with the copy."""
import dataclasses
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
import torch

import indexer
from timing import check_same, copy_fn, flush_buffer, l2_bytes, time_samples
from nvrtc_gather.kernels import gather as spec
from nvrtc_gather.ops import gather

BUILDS = {n: dataclasses.replace(spec.MODULES[16], name=f"gather_ab_{n}", source_dir=str(HERE / n))
          for n in ("v14", "v14_narrow")}
flush = flush_buffer()
for batch, mean in ((1, 131072), (4, 32768), (64, 2048), (256, 1000)):
    w = indexer.GatherWorkload(batch, mean, l2_bytes(), seed=batch * 7 + mean)
    k, s = w.outputs()
    fns = {"op": gather.prepared(*w.args(k, s))}
    fns["op"]()
    want = torch.cat([k.view(torch.uint8), s], 1)
    for n, m in BUILDS.items():
        k2, s2 = w.outputs()
        fns[n] = gather.prepared(*w.args(k2, s2), module=m)
        fns[n]()
        check_same(n, torch.cat([k2.view(torch.uint8), s2], 1), want, w.name)
    fns["copy"] = copy_fn(w.bytes_moved)
    got = {n: statistics.median(x) for n, x in time_samples(fns, flush, 80).items()}
    print(f"{w.name}: copy {got['copy']:.1f}  " + "  ".join(f"{n} {got[n]:.1f} ({got[n] / got['copy']:.2f}x)"
                                                       for n in ("op", "v14", "v14_narrow")), flush=True)
