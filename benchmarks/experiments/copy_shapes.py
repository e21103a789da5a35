"""Contiguous kernel copies of several shapes against a device copy_ of the same bytes (issue
27: what shape, if any, reaches the copy_ that the chunked gathers are held to).
copy_ceiling.cu's exp_full_u* / exp_gs_u*: U 16-byte loads in flight per thread, T threads per
block, one block per tile or a grid-stride loop on k blocks per SM. Each output checked, then
all timed interleaved, L2 flushed before each run. From the repository root with
PYTHONPATH=.:benchmarks:benchmarks/experiments: ``python benchmarks/experiments/copy_shapes.py``."""
import torch

from timing import flush_buffer, summarize, time_samples
from nvrtc_gather.jit.spec import Entry

import copy_ceiling_ab as cc  # builds copy_exp.cu

SMS, DEV = cc.SMS, cc.DEV
MODULES = {t: cc.module(f"copy_shapes_t{t}", "copy_exp.cu",
                        tuple(Entry(f"exp_{k}_u{u}") for k in ("full", "gs") for u in (2, 4, 8)), threads=t)
           for t in (128, 256, 512, 1024)}
SHAPES = [(t, k, u, per_sm) for t in (128, 256, 512, 1024) for u in (2, 4, 8) for k, per_sm in
          (("full", None), ("gs", 2048 // t), ("gs", 4096 // t))]

flush = flush_buffer()
for moved in (75497472, 150994944, 288734976):
    src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda")
    n16 = src.numel() // 16
    fns = {}
    for t, k, u, per_sm in SHAPES:
        tiles = -(-n16 // (t * u))
        grid = tiles if per_sm is None else min(tiles, per_sm * SMS)
        d = torch.zeros_like(src)
        fns[f"t{t}_u{u}_{k}{per_sm or ''}"] = cc.kernel_copy(MODULES[t], f"exp_{k}_u{u}", src, d, grid)
        fns[f"t{t}_u{u}_{k}{per_sm or ''}"]()
        torch.cuda.synchronize()
        assert torch.equal(d, src), (t, k, u)
    dcopy = torch.empty_like(src)
    fns["copy_"] = lambda: dcopy.copy_(src)
    row = {}
    summarize(row, time_samples(fns, flush, 100))
    best = sorted(fns, key=lambda n: row[n + "_us"])
    print(f"{moved / 1e6:.1f} MB, copy_ {row['copy__us']:.2f} us; fastest first (x copy_): "
          + ", ".join(f"{n} {row[n + '_us'] / row['copy__us']:.3f}" for n in best), flush=True)
    src = fns = d = dcopy = None
    torch.cuda.empty_cache()
