"""Where each SGLang release keeps DeepSeek-V4's record gathers, read in its wheel (the tests'
own table, independent of integrations/sglang_dsv4.py's lookup): 0.5.12 and older have none;
0.5.13-0.5.15 define ``dequantize_k_cache_paged`` in sglang.srt.layers.attention.dsv4.dequant_k_cache;
0.5.16 moves it to sglang.kernels.ops.attention.dsv4.dequant_k_cache, 0.5.19 adds
``gather_dequant_requant_fp8_paged`` there, and 0.5.23 renames both with a ``_dsv4`` suffix."""
from __future__ import annotations

import pytest

KERNELS = "sglang.kernels.ops.attention.dsv4.dequant_k_cache"
SRT = "sglang.srt.layers.attention.dsv4.dequant_k_cache"
_TABLE = (  # (first release, module, names), newest first
    ((0, 5, 23), KERNELS, ("dequantize_k_cache_paged_dsv4", "gather_dequant_requant_fp8_paged_dsv4")),
    ((0, 5, 19), KERNELS, ("dequantize_k_cache_paged", "gather_dequant_requant_fp8_paged")),
    ((0, 5, 16), KERNELS, ("dequantize_k_cache_paged",)),
    ((0, 5, 13), SRT, ("dequantize_k_cache_paged",)),
    ((0, 5, 10), None, ()),
)


def v4_hooks(release: str) -> dict[str, str]:
    """{function name: defining module} the hook must replace in ``release``."""
    key = tuple(int(x) for x in release.split(".")[:3] if x.isdigit())
    for first, module, names in _TABLE:
        if key >= first:
            return dict.fromkeys(names, module)
    pytest.fail(f"SGLang {release} is older than every release these tests know")
