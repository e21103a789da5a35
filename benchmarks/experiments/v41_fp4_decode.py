"""DeepSeek-V4.1's FP4 record (SGLang's V41_FP4 layout, bf16 out): the shipped decode (two e2m1
codes as one e4m3 pair, one conversion instruction) against the per-code integer decode it
replaced, both built from cuda_src/ (the old one by replacing the decode in a copy of the
source), checked byte for byte against each other, then timed interleaved with a copy of the
same bytes (288 read, 1,024 written a token; timing.time_samples: L2 flushed, CUDA events).

    python3 benchmarks/experiments/v41_fp4_decode.py [tokens ...]"""
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import dsv4
import paged_batch as pb
from timing import check_same, copy_fn, flush_buffer, l2_bytes, time_samples
from nvrtc_gather.integrations import sglang as sg
from nvrtc_gather.jit import runtime
from nvrtc_gather.kernels import dsv4_gather as spec

SRC = Path(__file__).resolve().parents[2] / "cuda_src"
NEW_START, NEW_END = "    // 8 e2m1 codes (c: value 2j", "        } else {\n            // 2^(s - 127) by its bits"
OLD = """    static __device__ __forceinline__ float e2m1(u32 c) {
        const u32 m = c & 7u;
        const u32 mag = m < 2u ? (m ? 0x3f000000u : 0u) : (((m >> 1) + 126u) << 23) | ((m & 1u) << 22);
        return __uint_as_float(mag | ((c & 8u) << 28));
    }
    static __device__ __forceinline__ void store(u8* dst, const Lane& x, u32 s, int lane) {
        u32 o[8];
        if (FP4) {
            const float scale = ng_float_from_fp8e4m3(s);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const u32 b = ((i < 4 ? x.c.x : x.c.y) >> (8 * (i & 3))) & 0xffu;
                o[i] = ng_bf16x2_from_float(__fmul_rn(e2m1(b & 15u), scale), __fmul_rn(e2m1(b >> 4), scale));
            }
"""


def old_source_dir() -> str:
    d = tempfile.mkdtemp(prefix="v41_old_")
    for f in SRC.iterdir():
        text = f.read_text()
        if f.name == "dsv4_gather.cu":
            i, j = text.index(NEW_START), text.index(NEW_END)
            text = text[:i] + OLD + text[j:]
        (Path(d) / f.name).write_text(text)
    return d


def launcher(w, module):
    dev = w.cache.device.index
    image = spec.PARAMS.image(page_stride=w.cache.stride(0), num_slots=w.num_pages * pb.BLOCK_SIZE,
                              page_size=pb.BLOCK_SIZE, num_pages=w.num_pages)
    go = runtime.load(module, dev, runtime.current_stream(dev)).launcher(spec.v41_entry("v41_fp4", "i64"), 0, image)
    rows = w.tokens

    def run():
        out = torch.empty(rows, 1, 512, dtype=torch.bfloat16, device="cuda")
        go((w.cache.data_ptr(), out.data_ptr(), w.ids.data_ptr(), 0, 0, rows, rows, 1024, 0, w.ids.stride(0),
            0, 0, 0), 0, spec.tiles(rows))
        return out
    return run


def main(tokens_list):
    flush = flush_buffer()
    print(torch.cuda.get_device_name(), torch.__version__)
    old = dataclasses.replace(spec.V41_MODULE, name="dsv41_flat_exp_old_decode", source_dir=old_source_dir())
    for tokens in tokens_list:
        w = dsv4.Workload(tokens, l2=l2_bytes())
        fns = {"shipped": lambda: sg.dequantize_k_cache_paged_dsv4(w.cache, w.ids, pb.BLOCK_SIZE, layout="v41_fp4"),
               "old decode": launcher(w, old)}
        check_same("old decode", fns["old decode"](), fns["shipped"](), f"{tokens}")
        fns["copy"] = copy_fn(tokens * (288 + 1024))
        row = {k: statistics.median(xs) for k, xs in time_samples(fns, flush, 40).items()}
        print(f"{tokens // 1024}K fp4 copy {row['copy']:.1f} us  " + "  ".join(
            f"{n} {row[n]:.1f} ({row[n] / row['copy']:.2f}x)" for n in ("shipped", "old decode")), flush=True)
        w = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1:]] or list(dsv4.TOKENS))
