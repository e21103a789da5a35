"""Benchmark of indexer_k_quant_and_cache (wired into bench.py): the op against a contiguous
device copy moving the same number of bytes, on DeepSeek-V3.2 shapes (bf16 k, head_dim 128,
quant block 128, block_size 64; 256 bytes read and 132 written per token).

"scattered": every token's slot is random over a cache several times the L2 (the worst
case for the writes); "paged": shuffled blocks filled in order, as an engine's prefill does.
The op is checked bit-exact against the torch path (on the GPU) before it is timed.
(Earlier builds with other passes per block or lane widths, and what they measured, are in
benchmarks/NOTES.md; the kernel source no longer has those knobs.)"""
from __future__ import annotations

import torch

from nvrtc_gather.ops import indexer_k_quant
from nvrtc_gather.ops.indexer_k_quant_torch import quant_torch

HEAD_DIM, QBS, BLOCK_SIZE = 128, 128, 64
CACHE_STRIDE = HEAD_DIM + 4 * (HEAD_DIM // QBS)  # 132

WORKLOADS = [  # (tokens, slot pattern, scale_fmt)
    (1024, "scattered", "ue8m0"), (16384, "scattered", "ue8m0"), (131072, "scattered", "ue8m0"),
    (1 << 20, "scattered", "ue8m0"), (1 << 20, "scattered", "fp8_e4m3"),
    (16384, "paged", "ue8m0"), (131072, "paged", "ue8m0"), (1 << 20, "paged", "ue8m0"), (1 << 20, "paged", "fp8_e4m3"),
]
def _slots(tokens: int, num_blocks: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    if pattern == "scattered":
        return torch.randperm(num_blocks * BLOCK_SIZE, device="cuda", generator=gen)[:tokens]
    blocks = torch.randperm(num_blocks, device="cuda", generator=gen)
    i = torch.arange(tokens, device="cuda")
    return blocks[i // BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE


def bench_quant(reps: int, flush: torch.Tensor, time_gpu) -> list[dict]:
    """One row per workload: workload, tokens, bytes
    (read + written), op_us, copy_us, op_over_copy. ``time_gpu(fn, flush, reps)`` returns the
    median µs of ``fn``, L2 flushed."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 60 << 20)
    rows = []
    for tokens, pattern, fmt in WORKLOADS:
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        need = (tokens + BLOCK_SIZE - 1) // BLOCK_SIZE
        num_blocks = max(4 * need, 4 * l2 // (BLOCK_SIZE * CACHE_STRIDE))
        kv = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, CACHE_STRIDE), dtype=torch.uint8, device="cuda",
                           generator=gen)
        slots = _slots(tokens, num_blocks, pattern, gen)
        k = torch.randn(tokens, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
        want = kv.clone()
        quant_torch(indexer_k_quant.plan_quant(k, want, slots, QBS, fmt), k, want, slots)
        indexer_k_quant.indexer_k_quant_and_cache(k, kv, slots, QBS, fmt)
        torch.cuda.synchronize()
        if not torch.equal(kv, want):
            raise AssertionError(f"indexer_k_quant_and_cache is not bit-exact against the torch path on "
                                 f"{tokens} tokens ({pattern}, {fmt})")
        want = None

        moved = tokens * (HEAD_DIM * k.element_size() + CACHE_STRIDE)
        op_us = time_gpu(lambda: indexer_k_quant.indexer_k_quant_and_cache(k, kv, slots, QBS, fmt), flush, reps)
        src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda", generator=gen)
        dst = torch.empty_like(src)
        copy_us = time_gpu(lambda: dst.copy_(src), flush, reps)  # reads and writes moved / 2 bytes
        name = f"quant {tokens} {pattern} {fmt}"
        rows.append({"workload": name, "tokens": tokens, "bytes": moved,
                     "op_us": op_us, "copy_us": copy_us, "op_over_copy": op_us / copy_us})
        kv = slots = k = src = dst = None  # free this workload before the next
        torch.cuda.empty_cache()
    return rows
