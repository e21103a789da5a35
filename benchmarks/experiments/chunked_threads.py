"""The chunked gathers' tile kernel with 128-thread blocks against the op's 256 (issue 27: a
contiguous kernel copy ran 1-3% faster in 128-thread blocks than in the tile kernel's 256 on
75-289 MB, copy_shapes.py). The op's source, built with NG_THREADS = 128 and unroll U, run
with R rows per block (the op's plan otherwise); each output checked byte for byte against
the op's, then all timed interleaved with a device copy_ of the same bytes, L2 flushed
before each run. From the repository root with PYTHONPATH=.:benchmarks:
``python benchmarks/experiments/chunked_threads.py``."""
import dataclasses

import torch

import bench_cache_gather as b
from bench_mla import _copy_fns, _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.jit.spec import Entry
from nvrtc_gather.kernels import cache_gather as spec
from nvrtc_gather.ops import cache_gather

# (name, threads per block, loads in flight per thread as a multiple of the op's, rows per block)
VARIANTS = (("t128_r14", 128, 1, 14), ("t128_r28", 128, 1, 28), ("t128_u2x_r28", 128, 2, 28),
            ("t128_r7", 128, 0.5, 7), ("t256_r14", 256, 1, 14))


def build(conv, widths, threads, umul):
    base = spec.MODULES[conv, widths]
    u = max(1, int(spec.unroll(conv) * umul))
    fp8, out, _ = spec.CONVERSIONS[conv]
    name = f"{base.name}_t{threads}_u{u}"
    return dataclasses.replace(base, name=name, threads=threads,
                               entries=(Entry(base.kernels[0], f"cache_gather_body<{widths[0]}, {fp8}, {out}, {u}, {widths[1]}>"),))


l2, flush = l2_bytes(), flush_buffer()
for variant in b.VARIANTS:
    for seq in (False, True):
        for batch, mean in [(1, 65536), (1, 131072), (8, 16384), (64, 2048), (1024, 256), (4096, 64)]:
            w = b.Workload(batch, mean, variant, seq, l2, seed=batch * 7 + mean)
            want = w.dst()
            cache_gather.prepared(w.op, *w.args(want), tiny=False)()
            plan = cache_gather.plan_for(w.op, *w.args(want))
            fns = {}
            for name, threads, umul, rows in (("op", None, None, None),) + VARIANTS:
                dst = w.dst()
                mod = None if threads is None else build(plan.conversion, (plan.vec, plan.svec), threads, umul)
                fns[name] = cache_gather.prepared(w.op, *w.args(dst), module=mod, rows_per_cta=rows, tiny=False)
                fns[name]()
                torch.cuda.synchronize()
                if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                    raise AssertionError(f"{name} differs on {w.title}: " + _first_diff(dst, want))
            want = None
            fns["copy"] = _copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(batch))
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{w.title:>42}: copy {row['copy_us']:.2f}; x copy: "
                  + " ".join(f"{n} {row[n + '_us'] / row['copy_us']:.3f}" for n in fns if n != "copy"), flush=True)
            w = fns = None
            torch.cuda.empty_cache()
