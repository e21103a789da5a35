"""indexer_k_quant_and_cache before and after NaNs were left out of amax (issue 26): the op's
build against a build of the previous source (quant_cache_before_nan.cu, beside this file),
and a device copy of the same bytes, interleaved, L2 flushed before each run. bf16 k without
NaNs (both builds write the same bytes there, checked first). Run from the repository root
with PYTHONPATH=.:benchmarks: ``python benchmarks/experiments/quant_nan_ab.py BEFORE.cu``, where
BEFORE.cu is the previous source (``git show e75a610:cuda_src/quant_cache.cu > BEFORE.cu``)."""
import dataclasses
import sys
from pathlib import Path

import torch

from bench_quant import BLOCK_SIZE, CACHE_STRIDE, HEAD_DIM, QBS, _slots
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.kernels import indexer_k_quant as quant_kernels
from nvrtc_gather.ops import indexer_k_quant

usual, small = quant_kernels.MODULES["bf16", 16, ""], quant_kernels.MODULES["bf16", 16, "small"]
before = Path(sys.argv[1]).resolve()
BEFORE = dataclasses.replace(usual, name="quant_before_nan", source=before.name, source_dir=str(before.parent),
                             entries=usual.entries + small.entries)
l2, flush = l2_bytes(), flush_buffer()
for tokens, pattern, fmt in [(1024, "paged", "ue8m0"), (16384, "scattered", "ue8m0"), (131072, "paged", "ue8m0"),
                             (1 << 20, "paged", "ue8m0"), (1 << 20, "paged", "fp8_e4m3")]:
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    num_blocks = max(4 * (tokens + BLOCK_SIZE - 1) // BLOCK_SIZE, 4 * l2 // (BLOCK_SIZE * CACHE_STRIDE))
    kv = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, CACHE_STRIDE), dtype=torch.uint8, device="cuda", generator=gen)
    slots = _slots(tokens, num_blocks, pattern, gen)
    k = torch.randn(tokens, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    fns = {"after": indexer_k_quant.prepared(k, kv, slots, QBS, fmt),
           "before": indexer_k_quant.prepared(k, kv, slots, QBS, fmt, module=BEFORE)}
    outs = {}
    for name, fn in fns.items():
        kv.fill_(0xA5)
        fn()
        torch.cuda.synchronize()
        outs[name] = kv.clone()
    assert torch.equal(outs["after"], outs["before"]), f"{tokens} {pattern} {fmt}: the builds differ"
    outs = None
    moved = tokens * (HEAD_DIM * 2 + CACHE_STRIDE)
    src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    fns["copy"] = lambda: dst.copy_(src)
    row = {}
    summarize(row, time_samples(fns, flush, 200 if tokens >= 100_000 else 600))
    print(f"quant {tokens} {pattern} {fmt}: " + ", ".join(f"{n} {row[n + '_us']:.2f}" for n in fns)
          + f"; after/before {row['after_us'] / row['before_us']:.3f}, after/copy {row['after_us'] / row['copy_us']:.3f}",
          flush=True)
    kv = slots = k = src = dst = fns = None
    torch.cuda.empty_cache()
