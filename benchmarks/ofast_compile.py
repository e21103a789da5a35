"""Does NVRTC's --Ofast-compile=max (about 3x faster compiles of the write op's module on the
CI machine) cost kernel time or change bytes? For each k dtype: the op's build and the same
source built with the option, bit-exact against each other on random cases, then timed
interleaved (L2 flushed) on DeepSeek-V3.2 write workloads.

    PYTHONPATH=. python benchmarks/ofast_compile.py"""
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing  # noqa: E402
from bench_quant import BLOCK_SIZE, CACHE_STRIDE, HEAD_DIM, QBS, _slots  # noqa: E402

from nvrtc_gather.ops import indexer_k_quant  # noqa: E402
from nvrtc_gather.kernels import indexer_k_quant as quant_kernels

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def main() -> int:
    flush = timing.flush_buffer()
    for dt, dtype in DTYPES.items():
        op_module = quant_kernels.MODULES[dt, 16, ""]  # the workloads are 16-byte aligned; the usual shape
        fast = dataclasses.replace(op_module, name=op_module.name + "_ofc", options=op_module.options + ("--Ofast-compile=max",))
        for tokens, pattern, fmt in ((16384, "paged", "ue8m0"), (1 << 20, "paged", "ue8m0"),
                                     (1 << 20, "scattered", "fp8_e4m3"), (131072, "scattered", "ue8m0")):
            gen = torch.Generator(device="cuda").manual_seed(tokens + len(dt))
            num_blocks = max(4 * tokens // BLOCK_SIZE, 4096)
            kv = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, CACHE_STRIDE), dtype=torch.uint8, device="cuda", generator=gen)
            kv2 = kv.clone()
            slots = _slots(tokens, num_blocks, pattern, gen)
            mag = torch.pow(10.0, torch.empty(tokens, 1, device="cuda").uniform_(-6, 4, generator=gen))
            k = (torch.randn(tokens, HEAD_DIM, device="cuda", generator=gen) * mag).to(dtype)
            a = indexer_k_quant.prepared(k, kv, slots, QBS, fmt, shape="")
            b = indexer_k_quant.prepared(k, kv2, slots, QBS, fmt, module=fast, shape="")
            a()
            b()
            torch.cuda.synchronize()
            if not torch.equal(kv, kv2):
                print(f"{dt} {tokens} {pattern} {fmt}: NOT bit-exact ({int((kv != kv2).sum())} bytes differ)")
                return 1
            us = timing.time_interleaved({"op": a, "ofc": b}, flush, 60)
            print(f"{dt:>4} {tokens:>8} {pattern:>9} {fmt:>8}: op {us['op']:7.1f} us  Ofast-compile=max {us['ofc']:7.1f} us"
                  f"  ({us['ofc'] / us['op']:.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
