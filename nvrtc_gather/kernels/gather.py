"""The gather family (cuda_src/gather_indexer_k.cu, cp_gather_indexer_k_quant_cache): its
parameter struct, one module per vector width, the entry points, and the tile policy that
picks rows per thread block and the entry point for a call. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register

THREADS = 256
PARAMS = ParamStruct("GatherParams", (
    ("kv_cache", "ptr"), ("dst_k", "ptr"), ("dst_scale", "ptr"), ("block_table", "ptr"), ("cu_seq_lens", "ptr"),
    ("block_stride", "i64"), ("dst_k_row_stride", "i64"), ("dst_scale_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_tokens", "i32"), ("batch", "i32"), ("max_blocks", "i32"), ("num_blocks", "i32"), ("block_size", "i32"),
    ("head_dim", "i32"), ("scale_words", "i32"), ("tokens_per_cta", "i32"),
    ("error", "ptr"),
))
VECTOR_WIDTHS = (16, 8, 4)  # bytes per fp8 load/store; the host picks the widest the pointers allow
SHAPES = ("", "wide", "tiny")  # loads in flight per thread: 4, 8; "tiny": one warp per row


def entry_name(vec: int, shape: str) -> str:
    return f"gather_indexer_k_v{vec}" + (f"_{shape}" if shape else "")


_BODIES = {"": "gather_body<{vec}, 4>", "wide": "gather_body<{vec}, 8>", "tiny": "gather_tiny<{vec}>"}
# One module per vector width: a process compiles only what its calls use, nearly always the
# 16-byte one, in a third of the whole file's time.
MODULES = {vec: KernelModule(
    name=f"gather_indexer_k_v{vec}",
    source="gather_indexer_k.cu",
    entries=tuple(Entry(entry_name(vec, s), _BODIES[s].format(vec=vec)) for s in SHAPES),
    params=PARAMS,
    label="cp_gather_indexer_k_quant_cache",
    threads=THREADS,
) for vec in VECTOR_WIDTHS}
register(*MODULES.values())

# -- tile policy ------------------------------------------------------------------------------
BYTES_PER_CTA = 16384   # fp8 bytes one block copies: 16 KiB keeps 4 16-byte loads in flight per thread
MIN_TOKENS_PER_CTA = THREADS // 32   # the tiny kernel's rows per block: one per warp
CTAS_PER_SM = 2048 // THREADS        # resident blocks per SM (one wave)


def vector_width(low_bits: int) -> int:
    """Widest access the OR of the cache and dst_k pointers and strides allows (4 always does:
    the op checks 4-byte alignment)."""
    return 16 if not low_bits & 15 else (8 if not low_bits & 7 else 4)


def tokens_per_cta(head_dim: int, num_tokens: int, sm_count: int) -> int:
    """Rows per thread block: enough bytes per block to keep loads in flight, but small
    calls are spread over every SM (about 2 blocks each), since latency bounds them; at
    the floor of one row per warp the tiny kernel runs them (entry_for).
    A call whose 16 KiB blocks fill between 3/4 of one wave and one wave gets blocks
    twice that size, run by the wide kernels (8 loads in flight per thread): faster there,
    slower below 3/4 of a wave."""
    most = max(1, min(THREADS, BYTES_PER_CTA // head_dim))
    wave = most * sm_count * CTAS_PER_SM  # rows of one wave of 16 KiB blocks
    if 2 * most <= THREADS and wave >= num_tokens > wave * 3 // 4:
        return 2 * most
    spread = -(-num_tokens // (2 * sm_count))
    return max(1, min(most, max(MIN_TOKENS_PER_CTA, spread)))


def entry_for(vec: int, tokens_per_cta: int, head_dim: int) -> str:
    """The entry point for a call: its vector width and shape. "tiny" (one warp per row) when
    tokens_per_cta chose its floor; "wide" when it chose blocks of more than 16 KiB."""
    if tokens_per_cta == MIN_TOKENS_PER_CTA and tokens_per_cta * head_dim < BYTES_PER_CTA:
        return entry_name(vec, "tiny")
    return entry_name(vec, "wide" if tokens_per_cta * head_dim > BYTES_PER_CTA else "")


def grid(num_tokens: int, tokens_per_cta: int) -> int:
    return (num_tokens + tokens_per_cta - 1) // tokens_per_cta
