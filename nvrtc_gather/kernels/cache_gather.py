"""The chunked-context cache gathers (cuda_src/cache_gather.cu: cp_gather_cache and
gather_and_maybe_dequant_cache): the parameter struct, two modules per conversion (the widest
loads and stores, and any alignment), and the tile policy. Torch-free."""
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
VECTOR_WIDTHS = (16, 8, 4)  # bytes per load / store; the host picks the widest the pointers allow
# conversion -> (fp8 format of the source: 0 none (byte copy), 1 e4m3, 2 e5m2; output type:
# 0 bytes as read, 1 bf16, 2 fp16, 3 fp32; output bytes per source byte)
CONVERSIONS = {
    "copy": (0, 0, 1),
    **{f"{fp8}_{out}": (1 + i, 1 + j, size) for i, fp8 in enumerate(("e4m3", "e5m2"))
       for j, (out, size) in enumerate((("bf16", 2), ("f16", 2), ("f32", 4)))},
}
# --fmad=false: no a*b+c contraction; --ftz=false: subnormals kept (the default, made explicit).
_OPTIONS = ("--fmad=false", "--ftz=false")


def widest(conversion: str) -> tuple[int, int]:
    """The (load, store) byte widths of a conversion's fast entry point: 16-byte stores, and
    loads of 16 / out-size bytes (one load's output is one store, so both are coalesced)."""
    return 16 // CONVERSIONS[conversion][2], 16


ANY = (4, 4)  # the entry point for any 4-byte aligned layout


def unroll(conversion: str) -> int:
    """Loads in flight per thread: 64 source bytes at the widest load."""
    return 4 * CONVERSIONS[conversion][2]


def entry_name(conversion: str, vec: int, svec: int, tiny: bool = False) -> str:
    return f"cache_gather_{conversion}_l{vec}_s{svec}{'_tiny' if tiny else ''}"


def _module(conversion: str, widths: tuple[int, int], suffix: str, tiny: bool = False) -> KernelModule:
    fp8, out, _ = CONVERSIONS[conversion]
    body = "cache_gather_tiny" if tiny else "cache_gather_body"
    return KernelModule(
        name=f"cache_gather_{conversion}{suffix}", source="cache_gather.cu",
        entries=(Entry(entry_name(conversion, *widths, tiny),
                       f"{body}<{widths[0]}, {fp8}, {out}, {unroll(conversion)}, {widths[1]}>"),),
        params=PARAMS, label="cp_gather_cache or gather_and_maybe_dequant_cache" if conversion == "copy"
        else "gather_and_maybe_dequant_cache",
        options=_OPTIONS, threads=THREADS)


# Modules of one entry point each (a dequantizing entry point takes 0.3-0.6 s to compile on a
# 2-core machine). Two per conversion for the tile kernel: the widest, which aligned tensors
# take, and ANY, compiled only when a call's pointers or strides are not 16-byte aligned. One
# more for small calls of aligned tensors: the tiny kernel (one warp per row). An engine
# gathers one cache format into one dtype, so its calls compile two modules.
MODULES = {(conv, w): _module(conv, w, "" if w != ANY else "_any")
           for conv in CONVERSIONS for w in (widest(conv), ANY)}
TINY_MODULES = {conv: _module(conv, widest(conv), "_tiny", tiny=True) for conv in CONVERSIONS}
register(*MODULES.values(), *TINY_MODULES.values())


def kernel_for(conversion: str, widths: tuple[int, int], tiny: bool, rows_per_cta: int) -> tuple[KernelModule, int]:
    """The module of a call and its rows per block: the tiny kernel's (one warp per row, WARPS
    rows per block) for a small call whose tensors take the widest accesses (use_tiny), else the
    tile kernel's of those widths (``rows_per_cta`` rows per block)."""
    if tiny and widths == widest(conversion):
        return TINY_MODULES[conversion], WARPS
    return MODULES[conversion, widths], rows_per_cta


def module_for(conversion: str, widths: tuple[int, int], tiny: bool) -> KernelModule:
    """The module of a call (kernel_for's)."""
    return kernel_for(conversion, widths, tiny, 0)[0]


def load_width(bits: int, conversion: str) -> int:
    """Widest load the OR of the source's pointer, strides and entry bytes allows, at most 16 /
    out-size bytes (4 always does: the op checks 4-byte alignment and whole words per entry)."""
    most = 16 // CONVERSIONS[conversion][2]
    return next((v for v in VECTOR_WIDTHS if v <= most and not bits % v), 4)


def store_width(bits: int) -> int:
    """Widest store the OR of the destination's pointer, row stride and row bytes allows."""
    return 16 if not bits & 15 else (8 if not bits & 7 else 4)


def pick(conversion: str, load: int, store: int) -> tuple[int, int]:
    """The (load, store) widths of a call whose source allows ``load`` and destination ``store``:
    the widest entry point where both allow it, else ANY."""
    w = widest(conversion)
    return w if load >= w[0] and store >= w[1] else ANY


# -- tile policy ------------------------------------------------------------------------------
BYTES_PER_CTA = 16384   # source bytes one block moves: all its loads in flight at once (unroll)
MIN_ROWS_PER_CTA = WARPS


def rows_per_cta(row_bytes: int, num_rows: int, sm_count: int) -> int:
    """Rows per thread block: 16 KiB of source bytes (64 per thread: one sweep of loads), but
    small calls spread over every SM (about two blocks each) since latency bounds them."""
    most = max(1, min(THREADS, BYTES_PER_CTA // row_bytes))
    spread = -(-num_rows // (2 * sm_count))
    return max(1, min(most, max(MIN_ROWS_PER_CTA, spread)))


def use_tiny(row_bytes: int, num_rows: int, sm_count: int) -> bool:
    """Small calls run the tiny kernel: those whose rows_per_cta is at its floor of one row per
    warp (at most two blocks of WARPS rows per SM) and whose rows fit the tile kernel's bytes
    at that floor."""
    return num_rows <= 2 * sm_count * MIN_ROWS_PER_CTA and MIN_ROWS_PER_CTA * row_bytes <= BYTES_PER_CTA


def grid(num_rows: int, rows: int) -> int:
    return (num_rows + rows - 1) // rows
