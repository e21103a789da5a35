"""The chunked-context cache gathers (cuda_src/cache_gather.cu: cp_gather_cache and
gather_and_maybe_dequant_cache): the parameter struct, one module per conversion, their entry
points (one per vector width), and the tile policy. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register

THREADS = 256
WARPS = THREADS // 32
PARAMS = ParamStruct("CacheGatherParams", (
    ("src_cache", "ptr"), ("dst", "ptr"), ("block_table", "ptr"), ("cu_seq_lens", "ptr"), ("seq_starts", "ptr"),
    ("scale", "ptr"),
    ("block_stride", "i64"), ("entry_stride", "i64"), ("dst_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_rows", "i32"), ("batch", "i32"), ("max_blocks", "i32"), ("num_blocks", "i32"), ("block_size", "i32"),
    ("row_vecs", "i32"), ("rows_per_cta", "i32"), ("reserved", "i32"),
    ("error", "ptr"),
))
VECTOR_WIDTHS = (16, 8, 4)  # source bytes per load; the host picks the widest the pointers allow
UNROLL = 4                  # loads in flight per thread
# conversion -> (fp8 format of the source: 0 none (byte copy), 1 e4m3, 2 e5m2; output type:
# 0 bytes as read, 1 bf16, 2 fp16, 3 fp32; output bytes per source byte)
CONVERSIONS = {
    "copy": (0, 0, 1),
    **{f"{fp8}_{out}": (1 + i, 1 + j, size) for i, fp8 in enumerate(("e4m3", "e5m2"))
       for j, (out, size) in enumerate((("bf16", 2), ("f16", 2), ("f32", 4)))},
}
# --fmad=false: no a*b+c contraction; --ftz=false: subnormals kept (the default, made explicit).
_OPTIONS = ("--fmad=false", "--ftz=false")


def entry_name(conversion: str, vec: int) -> str:
    return f"cache_gather_{conversion}_v{vec}"


# One module per conversion: an engine gathers one cache format into one dtype, so its first
# call compiles only that.
MODULES = {conv: KernelModule(
    name=f"cache_gather_{conv}", source="cache_gather.cu",
    entries=tuple(Entry(entry_name(conv, vec), f"cache_gather_body<{vec}, {fp8}, {out}, {UNROLL}>")
                  for vec in VECTOR_WIDTHS),
    params=PARAMS, label="cp_gather_cache" if conv == "copy" else "gather_and_maybe_dequant_cache",
    options=_OPTIONS, threads=THREADS,
) for conv, (fp8, out, _) in CONVERSIONS.items()}
register(*MODULES.values())


def src_width(bits: int) -> int:
    """Widest source load the OR of the source's pointer, strides and row bytes allows (4
    always does: the op checks 4-byte alignment)."""
    return 16 if not bits & 15 else (8 if not bits & 7 else 4)


def dst_width(bits: int, out_per_byte: int) -> int:
    """Widest source load whose converted bytes (``out_per_byte`` times as many) the OR of the
    destination's pointer, stride and row bytes can take in stores of up to 16 bytes."""
    for vec in VECTOR_WIDTHS:
        if not bits % min(16, vec * out_per_byte):
            return vec
    return 4


# -- tile policy ------------------------------------------------------------------------------
BYTES_PER_CTA = 16384   # source bytes one block moves: 4 16-byte loads in flight per thread
MIN_ROWS_PER_CTA = WARPS


def rows_per_cta(row_bytes: int, num_rows: int, sm_count: int) -> int:
    """Rows per thread block: 16 KiB of source bytes (UNROLL 16-byte loads per thread), but
    small calls spread over every SM (about two blocks each) since latency bounds them."""
    most = max(1, min(THREADS, BYTES_PER_CTA // row_bytes))
    spread = -(-num_rows // (2 * sm_count))
    return max(1, min(most, max(MIN_ROWS_PER_CTA, spread)))


def grid(num_rows: int, rows: int) -> int:
    return (num_rows + rows - 1) // rows
