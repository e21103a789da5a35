"""The working tree's index-K read and index-K write against a base build of each (the same entry
points compiled from the .cu files in BASE_DIR, e.g. `git show HEAD~1:cuda_src/index_k_read.cu`),
in one process, beside our gather (read rows), SGLang 0.5.23's Triton kernels (where they import)
and a copy of the same bytes. Lengths and slots int64, page ids int32, as SGLang passes them.
Bytes checked equal first; then 200 interleaved runs (timing.time_samples: L2 flushed, CUDA
events), medians and 25th-75th percentiles.

    python3 benchmarks/experiments/search_bounds_ab.py BASE_DIR [BxM ...]

The change it was written for (prediction before the run): the read's row search bounded by the
requests of the block's first and last rows (counted by ballots beside the scan's barrier): 1-2
shared-memory steps instead of 8 where a block spans one or two requests (16x2048, 64x2048,
1024x256), ~0.05-0.1 us; the write's unit-to-token split by a shift instead of a division
(MUFU.RCP chain, ~80 cycles before the slot load), ~0.05 us on the latency-bound rows (1x1000,
8x100). Both are small against the rows' spreads; a run decides."""
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from read_vs_gather import layout_of, medians, ours, read_on, rebuilt
from timing import check_same, copy_fn, flush_buffer, time_samples
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.kernels import index_k_read as read_spec
from nvrtc_gather.kernels import indexer_k_scatter as write_spec
from nvrtc_gather.ops import indexer_k_scatter

WORKLOADS = [(1, 1000), (8, 100), (16, 2048), (64, 2048), (1, 131072), (1024, 256), (4096, 64)]


def base_modules(spec, base_dir: str) -> dict:
    """spec's modules built from the sources in ``base_dir``, less the entries whose body template
    that source does not define (a shape added since)."""
    text = (Path(base_dir) / next(iter(spec.MODULES.values())).source).read_text()
    return {key: dataclasses.replace(m, name=f"{m.name}_base", source_dir=base_dir,
                                     entries=tuple(e for e in m.entries if e.body.split("<")[0] in text))
            for key, m in spec.MODULES.items()}


def main(base_dir: str, workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    reads, writes = base_modules(read_spec, base_dir), base_modules(write_spec, base_dir)
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        # the read: ours through SGLang's entry, the base build on the same layout
        fns = ours(w)
        want = torch.cat(fns["read"](), 1)
        old = rebuilt(layout_of(w), reads)
        fns["read_base"] = read_on(old, w)
        if acc:
            fns["sglang"] = w.sglang_read(acc, p)
        for name in list(fns)[1:]:
            check_same(name, torch.cat(fns[name](), 1), want, w.name)
        fns["copy"] = copy_fn(w.moved)
        report(w.name + " read", time_samples(fns, flush, 200))
        # the write: ours through SGLang's entry, the base build on the same layout
        mine, base, theirs = w.buf.clone(), w.buf.clone(), w.buf.clone()
        hook.set_index_k_scale_buffer(mine, w.loc, w.k, w.scale)
        lay = hook._set_layouts.last[2]
        old_w = lay._replace(launches={v: l._replace(module=writes[v]) for v, l in lay.launches.items()}, launchers={})
        ptrs = (w.k.data_ptr(), w.scale.data_ptr(), w.loc.data_ptr())
        wfns = {"write": lambda: hook.set_index_k_scale_buffer(mine, w.loc, w.k, w.scale),
                "write_base": lambda: indexer_k_scatter._run(old_w, *ptrs, base.data_ptr())}
        wfns["write_base"]()
        check_same("write_base", base, mine, w.name)
        if acc:
            wfns["sglang"] = lambda: acc.SetKAndS.triton(p, theirs, w.loc, w.k, w.scale)
            wfns["sglang"]()
            check_same("sglang", theirs, mine, w.name)
        wfns["copy"] = copy_fn(w.moved)
        report(w.name + " write", time_samples(wfns, flush, 200))
        w = fns = wfns = old = mine = base = theirs = None
        torch.cuda.empty_cache()


def report(name: str, got: dict) -> None:
    print(f"{name}: {medians(got)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [tuple(int(x) for x in a.split("x")) for a in sys.argv[2:]] or WORKLOADS)
