"""cp_gather_and_upconvert_fp8_kv_cache in vectorized torch: the CPU path of the op, byte for
byte what the kernel writes (cuda_src/mla_gather.cu). Device-agnostic (the GPU tests also run
it on CUDA tensors, where its checks cost host syncs).

Unlike the kernel it can afford to look at the index tensors, so it checks them all and raises
ValueError before writing anything."""
from __future__ import annotations

import torch

from ..kernels import mla_cache as spec
from . import index_checks
from .mla_write_torch import bf16_bits


def upconvert(records: torch.Tensor) -> torch.Tensor:
    """fp8_ds_mla records (uint8 [n, 656]) -> bf16 bits (int16 [n, 576]): values 0-511 =
    bf16(fp32(code) * tile scale), one fp32 multiply then nearest even (NaN -> 0x7fff);
    512-575 the record's k_pe bits."""
    n = records.shape[0]
    codes = records[:, :spec.NOPE].contiguous().view(torch.float8_e4m3fn).float().view(n, 4, spec.TILE)
    scales = records[:, spec.SCALES_AT:spec.ROPE_AT].contiguous().view(torch.float32)
    nope = bf16_bits(codes * scales.unsqueeze(-1)).view(n, spec.NOPE)
    rope = records[:, spec.ROPE_AT:].contiguous().view(torch.int16)
    return torch.cat((nope, rope), dim=1)


def gather_torch(plan, src_cache, dst, block_table, workspace_starts, seq_starts) -> None:
    b, total = plan.batch, plan.num_rows
    if b == 0 or total == 0:
        return
    dev = src_cache.device
    ws = workspace_starts[:b].to(torch.int64)
    if int(ws.min()) < 0:
        r = int(torch.nonzero(ws < 0)[0])
        raise ValueError(f"workspace_starts: entry {r} = {int(ws[r])} is negative")
    if b > 1 and bool((ws[1:] < ws[:-1]).any()):
        r = int(torch.nonzero(ws[1:] < ws[:-1])[0])
        raise ValueError(f"workspace_starts: must be non-decreasing, but entry {r} = {int(ws[r])} > "
                         f"entry {r + 1} = {int(ws[r + 1])}")
    first = seq_starts[:b].to(torch.int64) if seq_starts is not None else torch.zeros(b, dtype=torch.int64, device=dev)
    begin = ws.clamp(max=total)
    end = torch.cat((ws[1:], ws.new_full((1,), total))).clamp(max=total)
    lens = end - begin
    # Only a request that owns a row reads its seq_starts entry (as the kernel): the rest may be anything.
    if seq_starts is not None and bool(((first < 0) & (lens > 0)).any()):
        r = int(torch.nonzero((first < 0) & (lens > 0))[0])
        raise ValueError(f"seq_starts: entry {r} = {int(first[r])} is negative")
    n = int(lens.sum())
    if n == 0:
        return
    req = torch.repeat_interleave(torch.arange(b, device=dev), lens, output_size=n)
    rows = torch.arange(n, device=dev) - (torch.cumsum(lens, 0) - lens)[req] + begin[req]
    pos = first[req] + (rows - ws[req])
    col = pos // plan.block_size
    blk = index_checks.physical_blocks(
        block_table, req, col, plan.max_blocks, plan.num_blocks,
        lambda i: f"block_table: request {int(req[i])} needs token {int(pos[i])}, past its {plan.max_blocks} "
                  f"columns of {plan.block_size}-token blocks")
    records = src_cache.view(torch.uint8)[blk, pos % plan.block_size]
    dst.view(torch.int16)[rows] = upconvert(records)
