"""Sweeps of the MLA kernels (experiments, not the record), each beside the copy of the same
bytes, interleaved (timing.time_samples), one line per workload:
- the gather with the op's own rows-per-block choice and every rows_per_cta of --rows, with the
  shipped build and one capped at 32 registers per thread (full occupancy);
- the fp8_ds_mla write with the shipped build and the 32-register one.

    PYTHONPATH=. python benchmarks/sweep_mla.py [--rows 8,16,32,64] [--reps 20]"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_mla  # noqa: E402
import timing  # noqa: E402
from nvrtc_gather.kernels import mla_cache  # noqa: E402
from nvrtc_gather.ops import mla_gather, mla_write  # noqa: E402


def capped(module):
    """The module built with at most 32 registers per thread (8 blocks of 256 per SM)."""
    return dataclasses.replace(module, name=module.name + "_regs32", options=module.options + ("--maxrregcount=32",))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="8,16,32,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--workloads", default="1x65536,1x131072,256x1000,4096x64,1x1000")
    ap.add_argument("--writes", default="16384 paged,131072 paged,1048576 paged,1048576 scattered")
    args = ap.parse_args(argv)
    flush, l2 = timing.flush_buffer(), timing.l2_bytes()
    for spec in args.workloads.split(","):
        batch, mean = (int(x) for x in spec.split("x"))
        w = bench_mla.GatherWorkload(batch, mean, l2, seed=batch * 7 + mean)
        dst = w.dst()
        fns = {"copy": bench_mla._copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(1)),
               "op": lambda: mla_gather.cp_gather_and_upconvert_fp8_kv_cache(*w.args(dst))}
        regs32 = capped(mla_cache.GATHER_MODULE)
        for r in args.rows.split(","):
            fns[f"r{r}"] = mla_gather.prepared(*w.args(dst), rows_per_cta=int(r))
            fns[f"r{r}/regs32"] = mla_gather.prepared(*w.args(dst), rows_per_cta=int(r), module=regs32)
        s = timing.time_samples(fns, flush, args.reps)
        med = {k: sorted(v)[len(v) // 2] for k, v in s.items()}
        chosen = mla_gather.plan_gather(*w.args(dst)).rows_per_cta
        print(f"gather {w.name:>10} tokens {w.tokens:>7} copy {med['copy']:7.1f} op(r{chosen}) {med['op']:7.1f} "
              f"({med['op'] / med['copy']:.2f}x) " +
              " ".join(f"{k} {v:.1f} ({v / med['copy']:.2f}x)" for k, v in med.items() if k.startswith("r")),
              flush=True)
        w = dst = fns = None
        torch.cuda.empty_cache()
    for spec in args.writes.split(","):
        tokens, pattern = spec.split()
        w = bench_mla.WriteWorkload(int(tokens), pattern, l2, seed=int(tokens))
        cache = w.cache.clone()
        fns = {"copy": bench_mla._copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(1)),
               "op": mla_write.prepared(*w.args(cache)),
               "regs32": mla_write.prepared(*w.args(cache), module=capped(mla_cache.DS_MODULES["bf16"]))}
        s = timing.time_samples(fns, flush, args.reps)
        med = {k: sorted(v)[len(v) // 2] for k, v in s.items()}
        print(f"write {w.name:>18} copy {med['copy']:7.1f} " +
              " ".join(f"{k} {v:.1f} ({v / med['copy']:.2f}x)" for k, v in med.items() if k != "copy"), flush=True)
        w = cache = fns = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
