"""DeepSeek-V4's SGLang forms with other block shapes: threads a block (a warp a token, so a block
of 256 threads frees its slot only when the slowest of its 8 tokens is done; 64-thread blocks
free theirs 2 tokens at a time, at the same 64 warps an SM) and tokens a warp (NG_V4_PASSES).
Each build is checked byte for byte against the shipped op, then timed interleaved with a copy of
the same bytes (timing.time_samples: L2 flushed, CUDA events).

    python3 benchmarks/experiments/v4_block_shapes.py [tokens ...]"""
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import dsv4
import paged_batch as pb
from timing import check_same, copy_fn, flush_buffer, l2_bytes, time_samples
from nvrtc_gather.integrations import sglang as sg
from nvrtc_gather.jit import runtime
from nvrtc_gather.kernels import dsv4_gather as spec

SHAPES = ((256, 1), (128, 1), (64, 1), (64, 2))  # (threads a block, tokens a warp); the first is shipped


def launcher(w, threads: int, passes: int, fp8: bool):
    module = dataclasses.replace(spec.FLAT_MODULE, name=f"dsv4_flat_exp_t{threads}_p{passes}", threads=threads,
                                 options=(f"-DNG_V4_PASSES={passes}",))
    dev = w.cache.device.index
    image = spec.PARAMS.image(page_stride=w.cache.stride(0), num_slots=w.num_pages * pb.BLOCK_SIZE,
                              page_size=pb.BLOCK_SIZE, num_pages=w.num_pages)
    go = runtime.load(module, dev, runtime.current_stream(dev)).launcher(spec.flat_entry(fp8, "i64"), 0, image)
    rows, n = w.tokens + fp8, w.tokens  # the fp8 form: one zero landing row, as the bench's
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    per_block = threads // 32 * passes

    def run():
        out = torch.empty(rows, 1, 512, dtype=dtype, device="cuda")
        go((w.cache.data_ptr(), out.data_ptr(), w.ids.data_ptr(), 0, 0, rows, n, out.stride(0) * out.element_size(),
            0, w.ids.stride(0), 0, 0, 0), 0, -(-rows // per_block))
        return out
    return run


def main(tokens_list):
    flush = flush_buffer()
    print(torch.cuda.get_device_name(), torch.__version__)
    names = [f"t{t}p{p}" for t, p in SHAPES]
    for tokens in tokens_list:
        w = dsv4.Workload(tokens, l2=l2_bytes())
        for fp8 in (True, False):
            want = (sg.gather_dequant_requant_fp8_paged_dsv4(w.cache, w.ids, pb.BLOCK_SIZE, 1) if fp8
                    else sg.dequantize_k_cache_paged_dsv4(w.cache, w.ids, pb.BLOCK_SIZE))
            fns = {}
            for name, (t, p) in zip(names, SHAPES):
                fns[name] = launcher(w, t, p, fp8)
                check_same(name, fns[name](), want, f"{tokens} fp8={fp8}")
            fns["copy"] = copy_fn(tokens * (584 + (512 if fp8 else 1024)))
            row = {f"{k}_us": statistics.median(xs) for k, xs in time_samples(fns, flush, 40).items()}
            print(f"{tokens // 1024}K {'fp8 ' if fp8 else 'bf16'} copy {row['copy_us']:.1f} us  " + "  ".join(
                f"{n} {row[f'{n}_us']:.1f} ({row[f'{n}_us'] / row['copy_us']:.2f}x)" for n in names), flush=True)
        w = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1:]] or list(dsv4.TOKENS))
