"""Rows-per-block sweep of the MLA gather (an experiment, not the record): each workload timed
with the op's own choice and with every rows_per_cta of --rows, beside the copy of the same
bytes, interleaved (bench_mla.time_samples). Prints one line per workload.

    PYTHONPATH=. python benchmarks/sweep_mla.py [--rows 8,16,32,64] [--reps 20]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_mla  # noqa: E402
from nvrtc_gather.ops import mla_gather  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="8,16,32,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--workloads", default="1x131072,256x1000,4096x64,1x1000")
    args = ap.parse_args(argv)
    flush, l2 = bench_mla.flush_buffer(), bench_mla.l2_bytes()
    for spec in args.workloads.split(","):
        batch, mean = (int(x) for x in spec.split("x"))
        w = bench_mla.GatherWorkload(batch, mean, l2, seed=batch * 7 + mean)
        dst = w.dst()
        fns = {"copy": bench_mla._copy_fns(w.moved, torch.Generator(device="cuda").manual_seed(1)),
               "op": lambda: mla_gather.cp_gather_and_upconvert_fp8_kv_cache(*w.args(dst))}
        for r in args.rows.split(","):
            fns[f"r{r}"] = mla_gather.prepared(*w.args(dst), rows_per_cta=int(r))
        s = bench_mla.time_samples(fns, flush, args.reps)
        med = {k: sorted(v)[len(v) // 2] for k, v in s.items()}
        chosen = mla_gather.plan_gather(*w.args(dst)).rows_per_cta
        print(f"{w.name:>10} tokens {w.tokens:>7} copy {med['copy']:7.1f} op(r{chosen}) {med['op']:7.1f} "
              f"({med['op'] / med['copy']:.2f}x) " +
              " ".join(f"{k} {v:.1f} ({v / med['copy']:.2f}x)" for k, v in med.items() if k.startswith("r")),
              flush=True)
        w = dst = fns = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
