"""concat_and_cache_mla in vectorized torch: the CPU path of the op, byte for byte what the
kernels write (cuda_src/mla_write.cu). Device-agnostic (the GPU tests also run it on CUDA
tensors, where its checks cost host syncs).

Unlike the kernel it can afford to look at slot_mapping, so it raises ValueError on a slot
past the cache before writing anything. Two tokens mapped to one slot: which one lands is
unspecified (as in the kernel)."""
from __future__ import annotations

import torch

from ..kernels import mla_cache as spec
from . import index_checks
from .fp8_torch import amax_without_nan, fp8_codes

_FLT_MIN = 1.17549435e-38
_BF16_NAN = 0x7FFF   # the GPU's canonical bf16 NaN (cvt.rn.bf16x2.f32)


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 bits (int16): nearest even, NaN -> 0x7fff, as the kernels' conversion."""
    bits = x.to(torch.bfloat16).view(torch.int16)
    return torch.where(torch.isnan(x), torch.full_like(bits, _BF16_NAN), bits)


def tile_scales(amax: torch.Tensor, pow2: bool) -> torch.Tensor:
    """fp32 tile scales from fp32 amax (no NaN): amax / 448 (IEEE division: the divisor is a
    full tensor, as CUDA torch would multiply by a Python number's reciprocal), then
    max(., 1e-4) rounded up to a power of two by the exponent bits (exact), or max(., FLT_MIN)."""
    s = amax / torch.full_like(amax, 448.0)
    if not pow2:
        return torch.clamp(s, min=_FLT_MIN)
    bits = torch.clamp(s, min=1e-4).view(torch.int32)
    finite = bits < 0x7F800000
    return torch.where(finite, (bits + 0x7FFFFF) & -0x800000, bits).view(torch.float32)


def ds_records(kv_c: torch.Tensor, k_pe: torch.Tensor | None, pow2: bool) -> torch.Tensor:
    """The fp8_ds_mla records (uint8 [n, 656]) of rows of kv_c [n, 512] and k_pe [n, 64] (None:
    bytes 528-655 are zeros, and not written by the caller)."""
    n = kv_c.shape[0]
    x = kv_c.float().view(n, 4, spec.TILE)
    scale = tile_scales(amax_without_nan(x), pow2)
    rec = torch.zeros(n, spec.RECORD_BYTES, dtype=torch.uint8, device=kv_c.device)
    rec[:, :spec.NOPE] = fp8_codes(x / scale.unsqueeze(-1)).view(n, spec.NOPE)
    rec[:, spec.SCALES_AT:spec.ROPE_AT] = scale.contiguous().view(torch.uint8)
    if k_pe is not None:
        pe = k_pe.view(torch.int16) if k_pe.dtype == torch.bfloat16 else bf16_bits(k_pe.float())
        rec[:, spec.ROPE_AT:] = pe.contiguous().view(torch.uint8)
    return rec


def write_torch(plan, kv_c, k_pe, kv_cache, slot_mapping, scale) -> None:
    n = plan.num_tokens
    if n == 0:
        return
    slots = slot_mapping
    index_checks.slots_in_cache(slots, plan.num_slots)
    rows = torch.nonzero(slots[:n] >= 0).squeeze(1)  # padding (negative slots) is skipped
    if rows.numel() == 0:
        return
    s = slots[rows]
    blk, off = s // plan.block_size, s % plan.block_size
    c, e = kv_c[rows], k_pe[rows]
    if plan.fmt == "ds":
        rec = ds_records(c, e if plan.pe_dim else None, bool(plan.flags & spec.POW2_SCALES))
        cache = kv_cache.view(torch.uint8)
        if plan.pe_dim:
            cache[blk, off] = rec
        else:
            cache[blk, off, :spec.ROPE_AT] = rec[:, :spec.ROPE_AT]
    elif plan.fmt == "copy":
        kv_cache[blk, off] = torch.cat((c, e), dim=1)
    else:  # plain fp8: both rows, value / scale[0]
        x = torch.cat((c, e), dim=1).float()
        divisor = torch.ones_like(x) if plan.flags & spec.SKIP_SCALE else \
            scale.reshape(-1)[:1].to(torch.float32).expand_as(x).contiguous()
        kv_cache.view(torch.uint8)[blk, off] = fp8_codes(x / divisor)
