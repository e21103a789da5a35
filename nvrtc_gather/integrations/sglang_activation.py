"""The environment variables that switch the SGLang plugin, and the table of SGLang methods it
can hook; torch-free, read when the plugin runs.

``NVRTC_GATHER_SGLANG``: on by default; ``0``/``false``/``no``/``off``/empty turn the plugin off,
``1``/``true``/``yes``/``on`` keep it on (case-insensitive, settings.parse_flag). Anything else
raises InvalidSettingError (a ValueError) naming the variable, as NVRTC_GATHER_VLLM does.
``NVRTC_GATHER_SGLANG_OPS``: which of SGLang's methods to hook, comma-separated short names of
``OPS`` (spaces and case ignored); unset or empty means all. An unknown name raises ValueError
naming the variable."""
from __future__ import annotations

import os

from .. import settings

ENABLE_ENV = settings.SGLANG_ENV
OPS_ENV = settings.SGLANG_OPS_ENV

# Short name -> the SGLang method it replaces, in the order ops are named. One row per op: the
# hook itself is sglang.py's _HOOKS row of the same name.
OPS = {
    "get": "GetKAndS.execute",
    "set": "SetKAndS.execute",
    "dsv4_bf16": "dequantize_k_cache_paged_dsv4",          # DeepSeek-V4: sglang_dsv4.py (0.5.13-0.5.22: no _dsv4)
    "dsv4_fp8": "gather_dequant_requant_fp8_paged_dsv4",
}
ALL_OPS = tuple(OPS)


def sglang_enabled() -> bool:
    """NVRTC_GATHER_SGLANG as a strict boolean; unset means on."""
    raw = os.environ.get(ENABLE_ENV)
    return raw is None or settings.parse_flag(ENABLE_ENV, raw)


def sglang_ops() -> tuple[str, ...]:
    """The short names NVRTC_GATHER_SGLANG_OPS selects, in OPS order; unset or empty means all."""
    raw = os.environ.get(OPS_ENV)
    if raw is None or not raw.strip():
        return ALL_OPS
    return parse_ops(raw, OPS_ENV)


def parse_ops(raw: str, what: str) -> tuple[str, ...]:
    """Short names (comma-separated, spaces and case ignored) -> short names in OPS order.
    ``what`` names the source in the error (the variable, or ``ops``)."""
    items = [item.strip().lower() for item in raw.split(",")]
    unknown = [item for item in items if item not in OPS]
    if unknown or not any(items):
        raise ValueError(f"{what}={raw!r}: expected a comma-separated list of {', '.join(OPS)} "
                         f"(to turn the SGLang plugin off, set {ENABLE_ENV}=0)")
    return tuple(name for name in ALL_OPS if name in items)
