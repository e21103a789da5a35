"""SGLang's index-K read (our entry) against the indexer gather on the same rows (the gather given
the prefix sums the read computes in-kernel, both allocating their outputs per call as SGLang's
read does) and SGLang 0.5.23's own Triton read: where the read's 0.2-0.7 µs over the gather on
the multi-request rows goes, and whether SGLang's 0-3% lead there is real. Bytes checked equal
first; then 200 interleaved runs each (timing.time_samples: L2 flushed, CUDA events), medians
and the 25th-75th percentiles.

    python3 benchmarks/experiments/read_vs_gather.py"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
import paged_batch as pb
from timing import check_same, copy_fn, flush_buffer, time_samples
import nvrtc_gather as ng
from nvrtc_gather.integrations import sglang as hook

WORKLOADS = [(16, 2048), (64, 2048), (1, 131072), (1024, 256)]


def main():
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no")
    for batch, mean in WORKLOADS:
        w = ee.Workload(batch, mean)
        kv = w.buf.view(w.num_blocks, pb.BLOCK_SIZE, ee.RECORD)

        def gather():
            k = torch.empty(w.tokens, 128, dtype=torch.uint8, device="cuda")
            s = torch.empty(w.tokens, 4, dtype=torch.uint8, device="cuda")
            ng.cp_gather_indexer_k_quant_cache(kv, k.view(torch.float8_e4m3fn), s, w.block_table, w.cu)
            return k, s
        fns = {"read": lambda: hook.get_index_k_scale_buffer(*w.get_args()), "gather": gather}
        if acc:
            fns["sglang"] = lambda: acc.GetKAndS.triton(p, w.buf, w.block_table, w.lens_t, *w.get_args()[3:])
        want = torch.cat(fns["read"](), 1)
        for name in list(fns)[1:]:
            check_same(name, torch.cat(fns[name](), 1), want, w.name)
        fns["copy"] = copy_fn(w.moved)
        got = time_samples(fns, flush, 200)
        q = {k: statistics.quantiles(v, n=4) for k, v in got.items()}
        print(f"{w.name}: " + "  ".join(f"{k} {statistics.median(v):.2f} ({q[k][0]:.2f}-{q[k][2]:.2f})"
                                        for k, v in got.items()), flush=True)
        w = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
