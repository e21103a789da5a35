"""fp32 -> fp8-e4m3 codes in torch, as the kernels (cuda_src/fp8_e4m3.cuh) and vLLM's cache
kernels convert: CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)."""
from __future__ import annotations

import torch

FP8_NAN = 0x7F  # every NaN's code: cuda_fp8.hpp canonicalises a NaN (sign included) first


def fp8_codes(q: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp8 e4m3 codes (uint8): nearest even, finite overflow and +-inf saturating to
    +-448 (0x7e / 0xfe), every NaN 0x7f."""
    # torch's own conversion makes |q| >= 480 a NaN and keeps a NaN's sign (0xff on x86, whose
    # inf / inf is negative): clamp first (a NaN stays NaN through clamp), then set NaN codes.
    codes = q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(q), torch.full_like(codes, FP8_NAN), codes)


def amax_without_nan(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the last dimension with NaNs left out (0 where every value is a NaN): what
    vLLM's cache kernels compute with fmaxf, which returns its other operand for a NaN."""
    mag = x.abs()
    return torch.where(torch.isnan(mag), torch.zeros_like(mag), mag).amax(dim=-1)
