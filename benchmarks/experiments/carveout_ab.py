"""Is the read's event-timed gap to SGLang's Triton read outside its kernel? Nsight Compute
(NOTES v35 section 7) timed the read's request-major kernel 0.4 us faster than SGLang 0.5.23's
Triton kernel at 2x16384 (6.9 against 7.35) and level at 8x16384 (14.85 against 14.94), while
CUDA events around the calls had SGLang's 0.05-0.2 ahead: ~0.4 us more outside our kernel than
outside Triton's. One difference: the read keeps its tile's page ids in 3 KB of static shared
memory; SGLang's kernel, torch's memset (the flush) and its spin kernel use none, so an SM may
have to change its L1/shared split before the read's blocks start. Arms (SGLang's entry as it is
called, the bytes checked equal first): read, SGLang and a copy, each timed as the bench times it
(L2 flushed, a spin, then the events around the call) and again with an untimed kernel between
the spin and the start event: "_smem" a small torch reduction (a kernel with shared memory),
"_plain" a small elementwise add (none).

    [REPS=300] python3 benchmarks/experiments/carveout_ab.py [BxM ...]

Prediction (before the run): if the split change costs the read ~0.4 us, read_smem is 0.3-0.5
below read and read_plain level with read, while sglang_smem is level with or above sglang;
if not, every _smem and _plain arm within 0.1 of its plain arm. Result (H100, 300 shuffled runs,
medians us; read / sglang, then _smem, then _plain): 2x16384 10.08/10.27, 9.89/9.82, 9.92/9.86;
8x16384 20.35/20.06, 20.16/19.94, 20.22/19.97; 16x2048 8.99/9.06, 8.86/8.90, 8.93/9.02 (the copy:
11.39/11.12/11.17, 20.45/20.24/20.26, 9.76/10.50/10.35). A kernel before the start event moved
the arms (read 0.06-0.19 lower, SGLang 0.04-0.45 lower), the shared-memory one 0.03-0.12 below the
plain one for read and SGLang alike: refuted, no split change shows. SGLang stays
0.2-0.3 ahead at 8x16384 in all three pairs; 2x16384 and 16x2048 are within 0.1 either way."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from read_vs_gather import checked, medians, ours
from timing import flush_buffer, time_samples

REPS = int(os.environ.get("REPS", 300))
WORKLOADS = [(2, 16384), (8, 16384), (16, 2048)]


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    small = torch.ones(1 << 16, device="cuda")
    smem = lambda: small.sum()  # noqa: E731  torch's reduce kernel: shared memory
    plain = lambda: small.add_(0.0)  # noqa: E731  an elementwise kernel: none
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = checked({"read": ours(w)["read"]}, w, acc, p)  # read, sglang (where it imports), copy
        pre = {}
        for name in list(fns):
            for tag, fn in (("smem", smem), ("plain", plain)):
                fns[f"{name}_{tag}"] = fns[name]
                pre[f"{name}_{tag}"] = fn
        got = time_samples(fns, flush, REPS, order="shuffle", pre=pre)
        print(f"{w.name}: " + medians(got), flush=True)
        w = fns = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
