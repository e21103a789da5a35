"""The branch's dsv4_gather.cu against main's (dsv4_gather_before.cu), in one process on the bench's
workloads (benchmarks/dsv4.py: shuffled 64-token pages), beside the copy of the same bytes:
- vLLM's form (dequantize_and_gather_k_cache, 4 requests) without gather_lens (its compressed-cache
  call): the row's block id loaded beside the request's length, two round trips instead of three;
  and with gather_lens and offset 3 (unchanged: a control);
- SGLang's flat fp8 and bf16 forms (outputs given): the NoPE lane load made one helper (the fp8
  entry's SASS changed by ptxas's allocation; bf16 identical: a control).
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
from nvrtc_gather.integrations import sglang as sg
from nvrtc_gather.jit import runtime
from nvrtc_gather.kernels import dsv4_gather as spec
from nvrtc_gather.ops import dsv4_gather as op

BEFORE = {m.name: dataclasses.replace(m, name=m.name + "_before", source="dsv4_gather_before.cu",
                                      source_dir=str(Path(__file__).resolve().parent))
          for m in (spec.PAGED_MODULE, spec.FLAT_MODULE)}


def before(call):
    """The call as the op launches it, launched from the source before the change."""
    seen = []
    real = op._launch
    op._launch = lambda layout, module, entry, blocks, fields: seen.append((layout, module, entry, blocks, fields))
    try:
        call()
    finally:
        op._launch = real
    layout, module, entry, blocks, fields = seen[0]
    go = runtime.load(BEFORE[module.name], layout.device, runtime.current_stream(layout.device)).launcher(
        entry, 0, layout.image)
    return lambda: go(fields, 0, blocks)


def main():
    flush = flush_buffer()
    print(torch.cuda.get_device_name(), torch.__version__)
    for tokens in dsv4.TOKENS:
        w = dsv4.Workload(tokens)
        gl = torch.full_like(w.seq, tokens // 4 - 5)
        swa = torch.empty(4, tokens // 4, 512, dtype=torch.bfloat16, device="cuda")
        fp8 = torch.empty(tokens + 1, 1, 512, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        bf16 = torch.empty(tokens, 1, 512, dtype=torch.bfloat16, device="cuda")
        outs = {"vllm": w.out, "vllm swa": swa, "sglang fp8": fp8, "sglang bf16": bf16}
        calls = {"vllm": lambda: ng.dequantize_and_gather_k_cache(w.out, w.k_cache, w.seq, None, w.bt, pb.BLOCK_SIZE, 0),
                 "vllm swa": lambda: ng.dequantize_and_gather_k_cache(swa, w.k_cache, w.seq, gl, w.bt, pb.BLOCK_SIZE, 3),
                 "sglang fp8": lambda: sg.gather_dequant_requant_fp8_paged_dsv4(w.cache, w.ids, pb.BLOCK_SIZE, 1,
                                                                                out=fp8),
                 "sglang bf16": lambda: sg.dequantize_k_cache_paged_dsv4(w.cache, w.ids, pb.BLOCK_SIZE, out=bf16)}
        fns = {}
        for name, call in calls.items():  # rows a call does not own stay as they were: zero
            fns[name], fns[name + " before"] = call, before(call)
            outs[name].view(torch.uint8).zero_()
            call()
            want = outs[name].view(torch.uint8).clone()
            outs[name].view(torch.uint8).zero_()
            fns[name + " before"]()
            check_same(name, outs[name].view(torch.uint8), want, str(tokens))
        fns["copy"] = copy_fn(tokens * (584 + 1024))
        got = {n: statistics.median(x) for n, x in time_samples(fns, flush, 200 if tokens < 100000 else 60).items()}
        print(f"{tokens} tokens: copy (584 + 1024 B a token) {got['copy']:.2f} µs", flush=True)
        for name in calls:
            print(f"  {name:12s} {got[name]:8.2f} µs, before {got[name + ' before']:8.2f} "
                  f"({got[name] / got[name + ' before']:.3f}x)", flush=True)
        w = fns = calls = outs = swa = fp8 = bf16 = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
