"""cp_gather_cache and gather_and_maybe_dequant_cache in vectorized torch: the CPU path of the
ops, byte for byte what the kernel writes (cuda_src/cache_gather.cu). Device-agnostic (the GPU
tests also run it on CUDA tensors, where its checks cost host syncs).

Unlike the kernel it can afford to look at the index tensors, so it checks them all and raises
ValueError before writing anything."""
from __future__ import annotations

import torch

from . import index_checks
from .mla_write_torch import bf16_bits

_F16_NAN = 0x7FFF        # the GPU's canonical fp16 NaN (cvt.rn.f16.f32)
_F32_NAN = 0x7FFFFFFF    # the GPU's canonical fp32 NaN (its multiply makes no other)
_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _first_bad(name: str, values: torch.Tensor, bad: torch.Tensor, what: str) -> None:
    if bool(bad.any()):
        r = int(torch.nonzero(bad)[0])
        raise ValueError(f"{name}: entry {r} = {int(values[r])} {what}")


def convert(records: torch.Tensor, conversion: str, scale: torch.Tensor | None) -> torch.Tensor:
    """Source rows (uint8 [n, row_bytes]) -> destination row bytes (uint8): "copy" as they
    are; "<fp8>_<out>": out(fp32(code) * scale), one fp32 multiply then nearest even, NaN ->
    the GPU's canonical NaN of the output type."""
    if conversion == "copy":
        return records
    fp8, out = conversion.split("_")
    x = records.view(_FP8[fp8]).float() * scale.reshape(()).to(torch.float32)
    if out == "bf16":
        bits = bf16_bits(x)
    elif out == "f16":
        bits = x.to(torch.float16).view(torch.int16)
        bits = torch.where(torch.isnan(x), torch.full_like(bits, _F16_NAN), bits)
    else:
        bits = x.view(torch.int32)
        bits = torch.where(torch.isnan(x), torch.full_like(bits, _F32_NAN), bits)
    return bits.contiguous().view(torch.uint8)


def gather_torch(plan, src_cache, dst, block_table, cu_seq_lens, seq_starts, scale) -> None:
    """Request r < plan.batch: rows [min(cu[r], T), min(cu[r + 1], T)) of dst (T =
    plan.num_rows) get its entries from position seq_starts[r] (or 0) on, through
    block_table[r]; every other row is left as it is."""
    b, total = plan.batch, plan.num_rows
    if b == 0 or total == 0:
        return
    dev = src_cache.device
    cu = cu_seq_lens[:b + 1].to(torch.int64)
    _first_bad("cu_seq_lens", cu, cu < 0, "is negative")
    if bool((cu[1:] < cu[:-1]).any()):
        r = int(torch.nonzero(cu[1:] < cu[:-1])[0])
        raise ValueError(f"cu_seq_lens: must be non-decreasing, but entry {r} = {int(cu[r])} > "
                         f"entry {r + 1} = {int(cu[r + 1])}")
    begin = cu[:-1].clamp(max=total)
    lens = cu[1:].clamp(max=total) - begin
    if seq_starts is not None:  # read only by a request that owns a row (as the kernel): the rest may be anything
        first = seq_starts[:b].to(torch.int64)
        _first_bad("seq_starts", first, (first < 0) & (lens > 0), "is negative")
    else:
        first = torch.zeros(b, dtype=torch.int64, device=dev)
    n = int(lens.sum())
    if n == 0:
        return
    req = torch.repeat_interleave(torch.arange(b, device=dev), lens, output_size=n)
    rows = torch.arange(n, device=dev) - (torch.cumsum(lens, 0) - lens)[req] + begin[req]
    pos = first[req] + (rows - cu[:-1][req])
    col = pos // plan.block_size
    blk = index_checks.physical_blocks(
        block_table, req, col, plan.max_blocks, plan.num_blocks,
        lambda i: f"block_table: request {int(req[i])} needs token {int(pos[i])}, past its {plan.max_blocks} "
                  f"columns of {plan.block_size}-token blocks")
    src = _unit_last(src_cache.reshape(plan.num_blocks, plan.block_size, -1)).view(torch.uint8)
    records = src[blk, pos % plan.block_size]
    _unit_last(dst.reshape(dst.shape[0], -1)).view(torch.uint8)[rows] = convert(records, plan.conversion, scale)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a size-1 last dimension's stride set to 1 (the same elements: that stride is
    never stepped), so that it views as bytes as the kernel reads it."""
    if t.size(-1) == 1 and t.stride(-1) != 1:
        return t.as_strided(t.shape, t.stride()[:-1] + (1,), t.storage_offset())
    return t
