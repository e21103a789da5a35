"""Does SGLang's write (SetKAndS through nvrtc_gather.integrations.sglang) gain from its layout as
constants? The scatter's entries built with SGLang's default layout (block 64, head_dim 128, one
scale word: kernels/index_k_read.py FIXED_LAYOUT) as constants are 3.5-3.7 KB of sm_90 code, the
general ones 4.9-5.8 KB (NVRTC 13.5; 40 -> 30 registers, the int64-slot entry). The write of 8x100
measured 0.1-0.2 us behind SGLang 0.5.23's Triton write (NOTES v33). Arms, each through the hook's
entry as SGLang calls it, int64 loc: "write" (as shipped: the fixed entry), "generic" (the same
layout launching its general entry, by the op's launch alone), "fixed" (the shipped entry by the
same launch alone), SGLang's Triton write, and a copy of the same bytes; each
checked byte for byte against SGLang's first. REPS shuffled runs (L2 flushed, CUDA events),
medians and 25th-75th percentiles.

    [REPS=300] python3 benchmarks/experiments/write_ab.py [BxM ...]

Needs the scatter's fixed entries (in the package since NOTES v35); without them it stops at the
first row ("not the fixed layout").

Prediction (written before the first run): write 0.05-0.2 us faster than generic on the small rows
(1x1000, 8x100, 16x100), within 0.1 on the large ones (the stores' bytes dominate). Run 1 (H100,
300 runs, medians us; write / generic / SGLang / copy): 1x1000 4.93/4.99/4.99/4.80, 8x100
4.93/4.93/4.83/4.64, 16x100 4.99/5.31/5.25/4.80, 16x2048 8.26/8.32/22.53/10.34, 1024x256
31.01/31.42/156.80/30.82: held at 1x1000 (0.06) and 16x100 (0.32), not at 8x100 (0.00); the large
rows 0.06 and 0.41 faster; it landed. Run 2: 1x1000 4.83/4.86, 8x100 5.06/4.80 (SGLang 4.70),
16x100 4.83/4.90, 16x2048 8.03/8.16, 1024x256 30.78/31.26. Run 3 (REPS=600, 8x100 1x1000 16x100
8x100 twice, with "fixed"): fixed against generic -0.03 to +0.07 on every small row, write within
0.05 of fixed, SGLang 0.07-0.10 ahead at 8x100 and 0.24-0.26 behind at 16x100. So on the small
rows the prediction is refuted (no gain past the runs' noise: run 1's 0.32 at 16x100 did not
repeat); the gain is on the large rows (NOTES v35).

Next (NARROW=64,128, written before any run): SGLang's Triton write runs a program of 128 threads
per token (596 programs at 8x100, on every SM); ours blocks of 256 threads of 9 units a token
(21 blocks at 8x100: 21 of 132 SMs issue every load and store). Prediction: t64 (84 blocks) and
t128 (42) 0.05-0.15 us faster than fixed at 8x100 and 1x1000 (36 blocks), level at 16x100 (57)
and on the large rows (within 0.1). Run 4 (H100, 300 runs, medians us; fixed / t64 / t128 /
SGLang): 1x1000 4.86/4.93/4.93/4.91, 8x100 4.83/4.83/4.86/4.74, 16x100 4.88/4.96/4.93/5.15,
16x2048 8.16/8.19/8.22/22.50, 1024x256 31.01/31.07/30.90/156.70: refuted; narrower blocks gain
nothing at 8x100 or 1x1000 (within 0.07 of fixed everywhere), and SGLang stays 0.09 ahead at
8x100 (NOTES v36). The grid's width is not the write's small-row gap."""
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from read_vs_gather import medians
from timing import check_same, copy_fn, flush_buffer, time_samples
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.kernels import indexer_k_scatter as spec
from nvrtc_gather.ops import indexer_k_scatter as op

REPS = int(os.environ.get("REPS", 300))
# NARROW=64,128: also the shipped fixed entry built with blocks of that many threads ("t64", ...)
NARROW = [int(t) for t in os.environ.get("NARROW", "").split(",") if t]
WORKLOADS = [(1, 1000), (8, 100), (16, 100), (16, 2048), (1024, 256)]


def generic(layout):
    """``layout`` (the fixed one) launching its general entries."""
    assert all(spec.FIXED_TAG in launch.entry for launch in layout.launches.values()), "not the fixed layout"
    return layout._replace(launches={vec: launch._replace(entry=launch.entry.replace(spec.FIXED_TAG, ""))
                                     for vec, launch in layout.launches.items()}, launchers={})


def narrow(layout, threads: int, num_tokens: int):
    """``layout`` launching its entries from a build with blocks of ``threads`` (NG_THREADS: the
    kernel's unit of work is a thread, so the grid grows as the blocks shrink)."""
    launches = {}
    for vec, launch in layout.launches.items():
        module = dataclasses.replace(launch.module, name=f"{launch.module.name}_t{threads}", threads=threads)
        units = num_tokens * (spec.FIXED_LAYOUT[1] // vec + spec.FIXED_LAYOUT[2])
        launches[vec] = launch._replace(module=module, grid=min(spec.MAX_BLOCKS, -(-units // threads)))
    return layout._replace(launches=launches, launchers={})


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        bufs = {name: w.buf.clone() for name in ("write", "generic", "sglang")}
        fns = {"write": lambda: hook.set_index_k_scale_buffer(bufs["write"], w.loc, w.k, w.scale)}
        fns["write"]()
        layout = hook._set_layouts.last[2]
        lay = generic(layout)
        ptrs = (w.k.data_ptr(), w.scale.data_ptr(), w.loc.data_ptr(), bufs["generic"].data_ptr())
        fns["generic"] = lambda: op._run(lay, *ptrs)
        fns["generic"]()
        # "fixed": the shipped entry's launch alone, the host path "generic" has (write - fixed:
        # what the entry's host work adds to the timed span; fixed - generic: the kernels alone)
        bufs["fixed"] = w.buf.clone()
        fixed_ptrs = ptrs[:3] + (bufs["fixed"].data_ptr(),)
        fns["fixed"] = lambda: op._run(layout, *fixed_ptrs)
        fns["fixed"]()
        for threads in NARROW:  # the fixed entry in blocks of fewer threads, the grid grown to match
            name = f"t{threads}"
            bufs[name] = w.buf.clone()
            lay_t = narrow(layout, threads, w.k.size(0))
            ptrs_t = ptrs[:3] + (bufs[name].data_ptr(),)
            fns[name] = lambda lay_t=lay_t, ptrs_t=ptrs_t: op._run(lay_t, *ptrs_t)
            fns[name]()
        if acc:
            fns["sglang"] = lambda: acc.SetKAndS.triton(p, bufs["sglang"], w.loc, w.k, w.scale)
        else:
            hook.set_index_k_scale_buffer(bufs["sglang"], w.loc, w.k, w.scale)
        fns.get("sglang", lambda: None)()
        for name in ("write", "generic", "fixed", *(f"t{t}" for t in NARROW)):
            check_same(name, bufs[name], bufs["sglang"], w.name)
        fns["copy"] = copy_fn(w.moved)
        got = time_samples(fns, flush, REPS, order="shuffle")
        vec = max(layout.launches)
        print(f"{w.name} (entries {layout.launches[vec].entry} / {lay.launches[vec].entry}): " + medians(got), flush=True)
        w = fns = bufs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
