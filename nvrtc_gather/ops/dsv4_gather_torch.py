"""The DeepSeek-V4 record gathers (and SGLang's V4.1 layouts) in vectorized torch: the CPU path
of ops/dsv4_gather.py, byte for byte what cuda_src/dsv4_gather.cu writes (NaNs as the GPU's
conversions give them: bf16 0x7fff, fp8 0x7f). Every index value is checked (ValueError naming the argument) before
anything is written."""
from __future__ import annotations

import torch

from ..kernels import dsv4_gather as spec

_U8, _FP8, _BF16 = torch.uint8, torch.float8_e4m3fn, torch.bfloat16
_DATA = torch.arange(spec.DATA_BYTES)
_SCALES = torch.arange(7)


def _pool_bytes(cache: torch.Tensor, page_size: int, token_bytes: int) -> torch.Tensor:
    """The pool's bytes as one flat uint8 view, up to the last page's last token."""
    extent = (cache.size(0) - 1) * cache.stride(0) + page_size * token_bytes
    return cache.view(_U8).as_strided((extent,), (1,), cache.storage_offset())


def _rows(cache: torch.Tensor, page_size: int, pages: torch.Tensor, slots: torch.Tensor, fp8_out: bool):
    """The 512 output values of each (page, slot), as the kernel converts them."""
    flat = _pool_bytes(cache, page_size, spec.RECORD_BYTES)
    base = pages * cache.stride(0)
    data = flat[(base + slots * spec.DATA_BYTES)[:, None] + _DATA]
    scale_bytes = flat[(base + page_size * spec.DATA_BYTES + slots * spec.SCALE_BYTES)[:, None] + _SCALES]
    scale = (scale_bytes.to(torch.int32) << 23).view(torch.float32)  # 2^(s - 127); 0 -> +0, 255 -> +inf
    nope = (data[:, :448].view(_FP8).to(torch.float32).view(-1, 7, 64) * scale[:, :, None]).view(-1, 448)
    rope = data[:, 448:].contiguous().view(_BF16)
    if not fp8_out:
        out = torch.cat([nope.to(_BF16), rope], 1)
        bits = out.view(torch.int16)
        bits[:, :448][torch.isnan(nope)] = 0x7fff
        return out
    wide = torch.cat([nope, rope.to(torch.float32)], 1)
    out = wide.clamp(-448.0, 448.0).to(_FP8)  # satfinite: |x| >= 464 and inf to +-448
    out.view(_U8)[torch.isnan(wide)] = 0x7f
    return out


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _rows_v41(cache: torch.Tensor, page_size: int, pages: torch.Tensor, slots: torch.Tensor, layout: str):
    """The 512 bf16 output values of each (page, slot) of a V4.1 layout, as the kernel converts them."""
    fp4, interleaved = spec.V41_LAYOUTS[layout]
    data_bytes, scale_bytes = (256, 32) if fp4 else (512, 16)
    flat = _pool_bytes(cache, page_size, data_bytes + scale_bytes)
    base = pages * cache.stride(0)
    if interleaved:
        data_at = base + slots * (data_bytes + scale_bytes)
        scales_at = data_at + data_bytes
    else:
        data_at, scales_at = base + slots * data_bytes, base + page_size * data_bytes + slots * scale_bytes
    data = flat[data_at[:, None] + torch.arange(data_bytes)]
    scale_bytes_ = flat[scales_at[:, None] + torch.arange(scale_bytes)]
    if fp4:  # value 2j in byte j's low nibble; e2m1 times its e4m3 scale (exact in fp32)
        codes = torch.stack([data & 15, data >> 4], 2).view(-1, 512).to(torch.int64)
        values = _E2M1[codes] * scale_bytes_.view(_FP8).to(torch.float32).repeat_interleave(16, 1)
    else:  # e4m3 times 2^(s - 127): s = 0 the fp32 subnormal 2^-127, s = 255 NaN
        s = scale_bytes_.to(torch.int32)
        scale = torch.where(s == 0, 0x00400000, s << 23).view(torch.float32)
        scale = torch.where(s == 255, float("nan"), scale)
        values = data.view(_FP8).to(torch.float32) * scale.repeat_interleave(32, 1)
    out = values.to(_BF16)
    out.view(torch.int16)[torch.isnan(values)] = 0x7fff
    return out


def flat_torch(cache, ids, page_size: int, out, n: int, fp8_out: bool, layout: str = "v4") -> None:
    """SGLang's forms: rows < n from ids, the rest zero."""
    num_slots = cache.size(0) * page_size
    ids64 = ids.to(torch.int64)
    bad = (ids64 < 0) | (ids64 >= num_slots)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ValueError(f"page_table_1_flattened: entry {i} = {int(ids64[i])} is outside [0, num_pages * page_size "
                         f"= {num_slots})")
    if n:  # (a pool of no pages has no record to read: every id above was refused)
        pages, slots = ids64 // page_size, ids64 % page_size
        out[:n, 0] = _rows(cache, page_size, pages, slots, fp8_out) if layout == "v4" else \
            _rows_v41(cache, page_size, pages, slots, layout)
    out[n:] = 0


def paged_torch(out, k_cache, seq_lens, gather_lens, block_table, block_size: int, offset: int) -> None:
    """vLLM's form: every request's rows checked, then written; other rows untouched."""
    m, max_blocks, num_blocks = out.size(1), block_table.size(1), k_cache.size(0)
    plan = []
    for r in range(out.size(0)):
        seq = int(seq_lens[r])
        g = seq if gather_lens is None else int(gather_lens[r])
        if g <= 0:
            continue
        if g > seq:
            raise ValueError(f"gather_lens: request {r} gathers {g} tokens, more than its seq_lens entry {seq}")
        if offset + g > m:
            raise ValueError(f"out: request {r} needs rows up to {offset + g - 1}, past out's {m} rows "
                             "(offset + gather length)")
        pos = torch.arange(seq - g, seq)
        cols = pos // block_size
        if int(cols[-1]) >= max_blocks:
            raise ValueError(f"block_table: request {r} needs block_table column {int(cols[-1])}, past its "
                             f"{max_blocks} columns")
        blocks = block_table[r, cols].to(torch.int64)
        if bool(((blocks < 0) | (blocks >= num_blocks)).any()):
            raise ValueError(f"block_table: request {r} maps to a physical block outside [0, {num_blocks})")
        plan.append((r, g, blocks, pos % block_size))
    for r, g, blocks, slots in plan:
        out[r, offset:offset + g] = _rows(k_cache, block_size, blocks, slots, False)
