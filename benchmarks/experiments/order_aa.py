"""Does a timed call's time depend on which call ran before it? time_samples rotates its order,
so each function mostly follows the same one (the one before it in the dict; the first follows
the copy, whose buffers are not the workload's). Here the read through SGLang's entry twice
under two names (an A/A pair: the same launch), the gather, SGLang 0.5.23's Triton read (where it
imports) and the copy, timed rotated and then shuffled (a random order each round), 400 runs
each, medians and 25th-75th percentiles.

    python3 benchmarks/experiments/order_aa.py [BxM ...]

Prediction (before the run): if the predecessor matters (a warm TLB for the workload's buffers
after a call that read them), rotated "read" (after the copy) reads 0.2-0.5 us above "read_again"
(after the gather) and SGLang (after read_again) gains against both; shuffled, the A/A pair
agrees within 0.1 us and SGLang's lead on the mid rows shrinks by the same amount."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from read_vs_gather import checked, medians, ours
from timing import flush_buffer, time_samples
from nvrtc_gather.integrations import sglang as hook

WORKLOADS = [(16, 2048), (64, 512), (8, 100), (1, 131072), (64, 2048)]


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        mine = ours(w)
        fns = checked({"read": mine["read"], "gather": mine["gather"],
                       "read_again": lambda: hook.get_index_k_scale_buffer(*w.get_args())}, w, acc, p)
        for order in ("rotate", "shuffle"):
            print(f"{w.name} {order}: " + medians(time_samples(fns, flush, 400, order=order)), flush=True)
        w = fns = mine = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
