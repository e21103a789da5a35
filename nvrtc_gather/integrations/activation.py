"""The environment variables that switch the vLLM plugin, read when the plugin runs.

``NVRTC_GATHER_VLLM``: on by default; ``0``/``false``/``no``/``off``/empty turn the plugin off,
``1``/``true``/``yes``/``on`` keep it on (case-insensitive). Anything else raises, naming the
variable: a typo must not silently leave vLLM's kernels (or ours) in place.
``NVRTC_GATHER_VLLM_OPS``: which of vLLM's ops to replace, comma-separated (unset or empty: all
seven): ``gather`` (cp_gather_indexer_k_quant_cache), ``quant`` (indexer_k_quant_and_cache),
``mla_write`` (concat_and_cache_mla), ``mla_gather`` (cp_gather_and_upconvert_fp8_kv_cache),
``cp_gather`` (cp_gather_cache), ``dequant_gather`` (gather_and_maybe_dequant_cache), all
``torch.ops._C_cache_ops`` ops, and ``dsv4_gather`` (dequantize_and_gather_k_cache, DeepSeek-V4's
Python function, where the loaded vLLM has it: integrations/vllm_dsv4.py); the ops' full names
are accepted too."""
from __future__ import annotations

import os

from .. import settings

ENABLE_ENV = settings.VLLM_ENV
OPS_ENV = settings.VLLM_OPS_ENV

GATHER = "cp_gather_indexer_k_quant_cache"
QUANT = "indexer_k_quant_and_cache"
MLA_WRITE = "concat_and_cache_mla"
MLA_GATHER = "cp_gather_and_upconvert_fp8_kv_cache"
CP_GATHER = "cp_gather_cache"
DEQUANT_GATHER = "gather_and_maybe_dequant_cache"
DSV4_GATHER = "dequantize_and_gather_k_cache"
CACHE_OPS = (GATHER, QUANT, MLA_WRITE, MLA_GATHER, CP_GATHER, DEQUANT_GATHER)  # torch.ops._C_cache_ops.*
ALL_OPS = CACHE_OPS + (DSV4_GATHER,)  # the fixed order ops are named in
SHORT_NAMES = {"gather": GATHER, "quant": QUANT, "mla_write": MLA_WRITE, "mla_gather": MLA_GATHER,
               "cp_gather": CP_GATHER, "dequant_gather": DEQUANT_GATHER, "dsv4_gather": DSV4_GATHER}
OP_NAMES = {**SHORT_NAMES, **{name: name for name in ALL_OPS}}


def vllm_enabled() -> bool:
    """NVRTC_GATHER_VLLM as a strict boolean (settings.parse_flag: InvalidSettingError, a
    ValueError, for anything else); unset means on."""
    return switched_off_by() is None


def switched_off_by() -> str | None:
    """``NVRTC_GATHER_VLLM=<the value given>`` when that variable turns the plugin off (``off``,
    ``no``, empty, ...), else None. Raises InvalidSettingError for a value that is not a boolean."""
    raw = os.environ.get(ENABLE_ENV)
    if raw is None or settings.parse_flag(ENABLE_ENV, raw):
        return None
    return f"{ENABLE_ENV}={raw}" if raw.strip() else f"{ENABLE_ENV}={raw!r} (empty)"


def vllm_ops() -> tuple[str, ...]:
    """The full names of the ops NVRTC_GATHER_VLLM_OPS selects, in a fixed order; unset or empty
    (spaces only) means all, as for every other NVRTC_GATHER_ variable."""
    raw = os.environ.get(OPS_ENV)
    if raw is None or not raw.strip():
        return ALL_OPS
    return parse_ops(raw, OPS_ENV)


def parse_ops(raw: str, what: str) -> tuple[str, ...]:
    """Names (short or full, comma-separated, spaces ignored) -> full op names, in a fixed order."""
    items = [item.strip().lower() for item in raw.split(",")]
    unknown = [item for item in items if item not in OP_NAMES]
    if unknown or not any(items):
        raise ValueError(f"{what}={raw!r}: expected a comma-separated list of {', '.join(SHORT_NAMES)} "
                         f"(to turn the plugin off, set {ENABLE_ENV}=0)")
    chosen = {OP_NAMES[item] for item in items}
    return tuple(name for name in ALL_OPS if name in chosen)
