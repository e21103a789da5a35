"""vLLM's DeepSeek-V4 form (dequantize_and_gather_k_cache, no gather_lens: its compressed-cache
call) with the row's block id loaded beside the request's length (the branch) against the source
before it (dsv4_gather_before.cu: the length, then the block id, then the record), in one process
on the bench's workload (benchmarks/dsv4.py: 4 requests over shuffled 64-token pages), with a
SWA-style call (gather_lens given, offset 3: unchanged, a control) and the copy of the same bytes.
Bytes checked equal first; then interleaved runs (timing.time_samples: L2 flushed, CUDA events).

    python3 benchmarks/experiments/paged_guess/ab.py"""
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/

import torch

import dsv4
import paged_batch as pb
from timing import check_same, copy_fn, flush_buffer, time_samples
import nvrtc_gather as ng
from nvrtc_gather.jit import runtime
from nvrtc_gather.kernels import dsv4_gather as spec
from nvrtc_gather.ops import dsv4_gather as op

BEFORE = dataclasses.replace(spec.PAGED_MODULE, name="dsv4_paged_before", source="dsv4_gather_before.cu",
                             source_dir=str(Path(__file__).resolve().parent))


def before(call):
    """The call as the op launches it, launched from the source before the change."""
    seen = []
    real = op._launch
    op._launch = lambda layout, module, entry, blocks, fields: seen.append((layout, entry, blocks, fields))
    try:
        call()
    finally:
        op._launch = real
    layout, entry, blocks, fields = seen[0]
    go = runtime.load(BEFORE, layout.device, runtime.current_stream(layout.device)).launcher(entry, 0, layout.image)
    return lambda: go(fields, 0, blocks)


def main():
    flush = flush_buffer()
    print(torch.cuda.get_device_name(), torch.__version__)
    for tokens in dsv4.TOKENS:
        w = dsv4.Workload(tokens)
        gl = torch.full_like(w.seq, tokens // 4 - 5)
        out2 = torch.empty(4, tokens // 4, 512, dtype=torch.bfloat16, device="cuda")
        calls = {"op": lambda: ng.dequantize_and_gather_k_cache(w.out, w.k_cache, w.seq, None, w.bt, pb.BLOCK_SIZE, 0),
                 "swa op": lambda: ng.dequantize_and_gather_k_cache(out2, w.k_cache, w.seq, gl, w.bt, pb.BLOCK_SIZE, 3)}
        fns = dict(calls)
        fns["before"], fns["swa before"] = before(calls["op"]), before(calls["swa op"])
        for name, out in (("op", w.out), ("swa op", out2)):  # rows a call does not own stay as they were: zero
            out.zero_()
            fns[name]()
            want = out.clone()
            out.zero_()
            fns[name.replace("op", "before")]()
            check_same(name, out.view(torch.int16), want.view(torch.int16), str(tokens))
        fns["copy"] = copy_fn(tokens * (584 + 1024))
        got = {n: statistics.median(x) for n, x in time_samples(fns, flush, 200 if tokens < 100000 else 60).items()}
        print(f"{tokens} tokens: copy {got['copy']:.2f} µs  " + "  ".join(
            f"{n} {got[n]:.2f} ({got[n] / got['copy']:.3f}x)" for n in ("op", "before", "swa op", "swa before")),
            flush=True)
        w = fns = calls = out2 = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
