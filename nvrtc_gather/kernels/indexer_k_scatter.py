"""The scatter family (cuda_src/indexer_k_scatter.cu, indexer_k_scatter): its parameter struct,
one module per vector width, and the policy that picks the width and grid of a call. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register
from .index_k_read import FIXED_LAYOUT, FIXED_OPTIONS, FIXED_TAG, is_fixed_layout  # noqa: F401 (the layout the fixed entries serve)

THREADS = 256
MAX_BLOCKS = 1 << 16  # the kernel's grid-stride loop covers the rest
PARAMS = ParamStruct("ScatterParams", (
    ("k", "ptr"), ("k_scale", "ptr"), ("slot_mapping", "ptr"), ("kv_cache", "ptr"),
    ("k_row_stride", "i64"), ("scale_row_stride", "i64"), ("block_stride", "i64"), ("num_slots", "i64"),
    ("num_tokens", "i32"), ("block_size", "i32"), ("head_dim", "i32"), ("scale_words", "i32"),
    ("error", "ptr"),
))
VECTOR_WIDTHS = (16, 8, 4)  # bytes per value load and store


SLOT_TYPES = ("i64", "i32")  # C types of int64 / int32 slot_mapping entries


def entry_name(vec: int, slots: str = "i64", fixed: bool = False) -> str:
    """``fixed``: the entry of a call of the fixed layout (is_fixed_layout: block_size, head_dim, scale words),
    built with those sizes as constants (FIXED_TAG in its name)."""
    return f"indexer_k_scatter_v{vec}" + (FIXED_TAG if fixed else "") + ("" if slots == "i64" else f"_{slots}")


# One module per width: a call needs one, and an engine's calls share one alignment.
MODULES = {vec: KernelModule(
    name=entry_name(vec),
    source="indexer_k_scatter.cu",
    entries=tuple(Entry(entry_name(vec, st, fixed), f"scatter_body<{vec}, {st}, {'true' if fixed else 'false'}>")
                  for fixed in (False, True) for st in SLOT_TYPES),
    params=PARAMS,
    label="indexer_k_scatter",
    options=FIXED_OPTIONS,
    threads=THREADS,
) for vec in VECTOR_WIDTHS}
register(*MODULES.values())


def vector_width(bits: int) -> int:
    """Widest of VECTOR_WIDTHS dividing ``bits``: k's and kv_cache's data pointers, k's row
    stride, the cache's block stride and head_dim or'ed together."""
    for vec in VECTOR_WIDTHS:
        if not bits % vec:
            return vec
    return 0  # not 4-byte aligned: the op's checks refuse such a call before any launch


def grid(vec: int, num_tokens: int, head_dim: int, scale_words: int) -> int:
    units = num_tokens * (head_dim // vec + scale_words)
    return max(1, min(MAX_BLOCKS, -(-units // THREADS)))
