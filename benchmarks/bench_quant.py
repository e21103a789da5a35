"""Benchmark of indexer_k_quant_and_cache (wired into bench.py): the op against a contiguous
device copy moving the same number of bytes, on DeepSeek-V3.2 shapes (bf16 k, head_dim 128,
quant block 128, block_size 64; 256 bytes read and 132 written per token).

"scattered": every token's slot is random over a cache several times the L2 (the worst
case for the writes); "paged": shuffled blocks filled in order, as an engine's prefill does.
The op, and the op forced to each shape of the vector kernels (``shape_usual``: 4 tokens
per lane, ``shape_small``: 2; the op picks by size, kernels/indexer_k_quant.py shape_for), are
checked bit-exact against the torch path (on the GPU, poisoned) before they are timed; they
and the copy are timed interleaved (timing.time_samples). (Earlier builds with other lane
widths or tokens per lane, and what they measured, are in benchmarks/NOTES.md.)"""
from __future__ import annotations

import torch

from nvrtc_gather.kernels import indexer_k_quant as quant_kernels
from nvrtc_gather.ops import indexer_k_quant
from nvrtc_gather.ops.indexer_k_quant_torch import quant_torch
from timing import summarize, time_samples

HEAD_DIM, QBS, BLOCK_SIZE = 128, 128, 64
CACHE_STRIDE = HEAD_DIM + 4 * (HEAD_DIM // QBS)  # 132

WORKLOADS = [  # (tokens, slot pattern, scale_fmt)
    (1024, "scattered", "ue8m0"), (16384, "scattered", "ue8m0"), (131072, "scattered", "ue8m0"),
    (1 << 20, "scattered", "ue8m0"), (1 << 20, "scattered", "fp8_e4m3"),
    (1024, "paged", "ue8m0"), (16384, "paged", "ue8m0"), (131072, "paged", "ue8m0"), (1 << 20, "paged", "ue8m0"),
    (1 << 20, "paged", "fp8_e4m3"),
]
SHAPE_KEYS = {shape: f"shape_{shape or 'usual'}" for shape in quant_kernels.SHAPES}


def _slots(tokens: int, num_blocks: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    if pattern == "scattered":
        return torch.randperm(num_blocks * BLOCK_SIZE, device="cuda", generator=gen)[:tokens]
    blocks = torch.randperm(num_blocks, device="cuda", generator=gen)
    i = torch.arange(tokens, device="cuda")
    return blocks[i // BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE


def bench_quant(reps: int, flush: torch.Tensor) -> list[dict]:
    """One row per workload: workload, tokens, bytes (read + written), shape (the op's
    choice), op_us, copy_us, cast_us (torch's bf16 -> fp8 cast of k), shape_usual_us,
    shape_small_us, their spreads, op_over_copy;
    medians of ``reps`` (5x under 100K tokens) interleaved runs, L2 flushed before each."""
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
        fns = {"op": lambda: indexer_k_quant.indexer_k_quant_and_cache(k, kv, slots, QBS, fmt)}
        for shape, key in SHAPE_KEYS.items():
            fns[key] = indexer_k_quant.prepared(k, kv, slots, QBS, fmt, shape=shape)
        # Poisoned: before each build runs, every byte the torch path writes holds its complement.
        poison = torch.bitwise_not(want)
        expected = poison.clone()
        quant_torch(indexer_k_quant.plan_quant(k, expected, slots, QBS, fmt), k, expected, slots)
        for name, fn in fns.items():
            kv.copy_(poison)
            fn()
            torch.cuda.synchronize()
            if not torch.equal(kv, expected):
                raise AssertionError(f"{name} of indexer_k_quant_and_cache is not bit-exact against the torch path "
                                     f"on {tokens} tokens ({pattern}, {fmt})")
        want = poison = expected = None

        moved = tokens * (HEAD_DIM * k.element_size() + CACHE_STRIDE)
        src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda", generator=gen)
        dst = torch.empty_like(src)
        fns["copy"] = lambda: dst.copy_(src)  # reads and writes moved / 2 bytes
        # torch's bf16 -> fp8 cast of k, contiguous: the op's mix of bytes (256 read, 128 written per
        # token) without scales or slots, a second yardstick beside the copy's even split.
        k8 = torch.empty(k.shape, dtype=torch.float8_e4m3fn, device="cuda")
        fns["cast"] = lambda: k8.copy_(k)
        name = f"quant {tokens} {pattern} {fmt}"
        row = {"workload": name, "tokens": tokens, "bytes": moved,
               "shape": indexer_k_quant.call_shape(indexer_k_quant.plan_quant(k, kv, slots, QBS, fmt)) or "usual"}
        summarize(row, time_samples(fns, flush, reps if tokens >= 100_000 else 5 * reps))
        row["op_over_copy"] = row["op_us"] / row["copy_us"]
        rows.append(row)
        kv = slots = k = k8 = src = dst = fns = None  # free this workload before the next
        torch.cuda.empty_cache()
    return rows
