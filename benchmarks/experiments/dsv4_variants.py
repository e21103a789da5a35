"""DeepSeek-V4 record gathers: builds of cuda_src/dsv4_gather.cu side by side on the H200 (issue 33's
tuning, benchmarks/NOTES.md): passes per block, the f16 path of the fp8 form on and off, and the
access pattern alone (NG_V4_RAW: the loaded bytes stored unconverted), beside a copy of the same
bytes; SGLang's flat ids over shuffled 64-token pages, L2 flushed, interleaved.
    python benchmarks/experiments/dsv4_variants.py"""
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dsv4 as family  # noqa: E402
from timing import copy_fn, flush_buffer, l2_bytes, time_samples  # noqa: E402
from nvrtc_gather.jit import runtime  # noqa: E402
from nvrtc_gather.kernels import dsv4_gather as spec  # noqa: E402
from nvrtc_gather.ops import dsv4_gather as op  # noqa: E402

VARIANTS = {"p1": ("-DNG_V4_PASSES=1",), "p2": ("-DNG_V4_PASSES=2",), "p4": ("-DNG_V4_PASSES=4",),
            "p2_nof16": ("-DNG_V4_PASSES=2", "-DNG_V4_NO_F16"), "raw_p2": ("-DNG_V4_PASSES=2", "-DNG_V4_RAW=1")}


def launcher(name, options, fp8, cache, ids, out):
    module = dataclasses.replace(spec.FLAT_MODULE, name=f"dsv4_flat_x_{name}", options=options)
    layout = op._remembered(cache, 64, "quant_k_cache", False)
    dev = torch.cuda.current_device()
    go = runtime.load(module, dev).launcher(spec.flat_entry(fp8, "i64"), 0, layout.image)
    passes = int(options[0].split("=")[1])
    rows, n = out.size(0), ids.size(0)
    call = (cache.data_ptr(), out.data_ptr(), ids.data_ptr(), 0, 0, rows, n, out.stride(0) * out.element_size(), 0,
            ids.stride(0), 0, 0, 0)
    blocks = -(-rows // (8 * passes))  # a warp a token, 8 warps
    return lambda: go(call, 0, blocks)


def main():
    flush = flush_buffer()
    print("| tokens | form | copy | " + " | ".join(VARIANTS) + " |")
    for tokens in (32768, 131072, 524288):
        w = family.Workload(tokens, l2=l2_bytes())
        for fp8 in (False, True):
            want = family._cpu("sglang fp8" if fp8 else "sglang bf16", w).cuda()
            outs, fns = {}, {}
            for name, options in VARIANTS.items():
                outs[name] = torch.empty_like(want)
                fns[name] = launcher(name, options, fp8, w.cache, w.ids, outs[name])
                fns[name]()
                if "raw" not in name:
                    torch.cuda.synchronize()
                    assert torch.equal(outs[name].view(torch.uint8), want.view(torch.uint8)), name
            fns["copy"] = copy_fn(tokens * (584 + (512 if fp8 else 1024)))
            t = {k: sorted(v)[len(v) // 2] for k, v in time_samples(fns, flush, 40).items()}
            print(f"| {tokens} | {'fp8' if fp8 else 'bf16'} | {t['copy']:.1f} | "
                  + " | ".join(f"{t[k]:.1f} ({t[k] / t['copy']:.2f})" for k in VARIANTS) + " |", flush=True)


if __name__ == "__main__":
    main()
