"""The chunked-context gathers' tile kernel against two variants (issue 27, the rows of one
large request that sit at 1.10-1.14x the copy): "occ8", the same kernel held to 32 registers
(8 blocks of 256 threads per SM instead of 6 / 5), and "pipe", the tile kernel made
persistent and pipelined (chunked_pipeline.cu: each block runs tiles b, b + grid, ... and
locates the next tile's rows while the current tile's loads are in flight), on grids of
k blocks per SM. All launched on the op's plan (same rows per block, widths, struct), each
output checked byte for byte against the torch path, then timed interleaved with a device
copy of the same bytes, L2 flushed before each run. From the repository root with
PYTHONPATH=.:benchmarks: ``python benchmarks/experiments/chunked_pipeline_ab.py``."""
import dataclasses
import tempfile
from pathlib import Path

import torch

import bench_cache_gather as b
from bench_mla import _copy_fns, _first_diff
from timing import flush_buffer, l2_bytes, summarize, time_samples
from nvrtc_gather.jit import runtime, sources
from nvrtc_gather.jit.spec import Entry
from nvrtc_gather.kernels import cache_gather as spec
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch

HERE = Path(__file__).resolve().parent
build = Path(tempfile.mkdtemp())
(build / "cache_gather_exp.cu").write_text(sources.read_source("cache_gather.cu") + "\n"
                                           + (HERE / "chunked_pipeline.cu").read_text())
CONVERSIONS = ("copy", "e4m3_bf16")  # the entry points chunked_pipeline.cu defines
MODULE = dataclasses.replace(spec.MODULES["copy", (16, 16)], name="cache_gather_exp", source="cache_gather_exp.cu",
                             source_dir=str(build),
                             entries=tuple(Entry(f"exp_{k}_{c}") for c in CONVERSIONS for k in ("occ8", "pipe", "pipe8")))
SMS = torch.cuda.get_device_properties(0).multi_processor_count
WORKLOADS = [(1, 65536), (1, 131072), (8, 16384), (64, 2048), (4096, 64), (1024, 256), (8, 100), (1, 1000)]


def launcher(w, dst, entry, grid_per_sm=None):
    p = cache_gather.plan_for(w.op, *w.args(dst))._replace(tiny=False)
    image = spec.PARAMS.image(**cache_gather.struct_fields(p))
    tiles = spec.grid(p.num_rows, p.rows_per_cta)
    grid = tiles if grid_per_sm is None else min(tiles, grid_per_sm * SMS)
    dev = torch.cuda.current_device()
    go = runtime.load(MODULE, dev, runtime.current_stream(dev)).launcher(f"{entry}_{p.conversion}", grid, image)
    return lambda _keep=(w, dst): go(())


l2, flush = l2_bytes(), flush_buffer()
for variant in b.VARIANTS:
    if variant[0] == "dequant auto bf16":
        continue
    for seq in (False, True):
        for batch, mean in WORKLOADS:
            w = b.Workload(batch, mean, variant, seq, l2, seed=batch * 7 + mean)
            want = w.dst()
            cache_gather.prepared(w.op, *w.args(want), tiny=False)()  # the op's tile kernel: the reference here
            ref = w.dst()
            gather_torch(cache_gather.plan_for(w.op, *w.args(ref)), *b._torch_args(w, ref))
            torch.cuda.synchronize()
            assert torch.equal(want.view(torch.uint8), ref.view(torch.uint8)), _first_diff(want, ref)
            ref = None
            fns = {}
            for name, entry, k in (("op", None, None), ("occ8", "exp_occ8", None), ("pipe4", "exp_pipe", 4),
                                   ("pipe6", "exp_pipe", 6), ("pipe8", "exp_pipe8", 8), ("pipe16", "exp_pipe", 16)):
                dst = w.dst()
                fns[name] = (cache_gather.prepared(w.op, *w.args(dst), tiny=False) if entry is None
                             else launcher(w, dst, entry, k))
                fns[name]()
                torch.cuda.synchronize()
                if not torch.equal(dst.view(torch.uint8), want.view(torch.uint8)):
                    raise AssertionError(f"{name} differs on {w.title}: " + _first_diff(dst, want))
            want = None
            fns["copy"] = _copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(batch))
            row = {}
            summarize(row, time_samples(fns, flush, 200))
            print(f"{w.title:>42}: " + ", ".join(f"{n} {row[n + '_us']:.2f}" for n in fns)
                  + "; /copy " + " ".join(f"{n} {row[n + '_us'] / row['copy_us']:.3f}" for n in fns if n != "copy"),
                  flush=True)
            w = fns = None
            torch.cuda.empty_cache()
