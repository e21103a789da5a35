"""The index-K read family (cuda_src/index_k_read.cu: SGLang's GetKAndS as one launch): its
parameter struct, one module per vector width with an entry point per (lengths dtype, page
table dtype), and the tile policy. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register
from . import gather

THREADS = gather.THREADS
# num_rows and tokens_per_cta follow the pointers: each call writes them (the row count is
# SGLang's seq_len_sum, new every call); everything after them is the layout's.
PARAMS = ParamStruct("IndexKReadParams", (
    ("kv_cache", "ptr"), ("dst_k", "ptr"), ("dst_scale", "ptr"), ("seq_lens", "ptr"), ("page_table", "ptr"),
    ("num_rows", "i64"), ("tokens_per_cta", "i64"),
    ("page_stride", "i64"), ("dst_k_row_stride", "i64"), ("dst_scale_row_stride", "i64"),
    ("pt_row_stride", "i64"), ("pt_col_stride", "i64"), ("seq_lens_stride", "i64"),
    ("batch", "i32"), ("max_pages", "i32"), ("num_pages", "i32"), ("page_size", "i32"), ("head_dim", "i32"),
    ("scale_words", "i32"),
    ("error", "ptr"),
))
CALL_FIELDS = ("kv_cache", "dst_k", "dst_scale", "seq_lens", "page_table", "num_rows", "tokens_per_cta")
VECTOR_WIDTHS = gather.VECTOR_WIDTHS
INDEX_TYPES = ("i32", "i64")  # the C types of int32 / int64 lengths and page ids


def entry_name(vec: int, lengths: str, pages: str) -> str:
    return f"index_k_read_v{vec}_l{lengths[1:]}_p{pages[1:]}"


MODULES = {vec: KernelModule(
    name=f"index_k_read_v{vec}",
    source="index_k_read.cu",
    entries=tuple(Entry(entry_name(vec, lt, pt), f"index_k_read_body<{vec}, 4, {lt}, {pt}>")
                  for lt in INDEX_TYPES for pt in INDEX_TYPES),
    params=PARAMS,
    label="get_index_k_scale_buffer",
    threads=THREADS,
) for vec in VECTOR_WIDTHS}
register(*MODULES.values())

vector_width = gather.vector_width


def tokens_per_cta(head_dim: int, num_rows: int, sm_count: int) -> int:
    """Rows per block: the indexer gather's 16 KiB tiles, small calls spread over every SM
    (about two blocks each, at least one row per warp); no 32 KiB tiles."""
    most = max(1, min(THREADS, gather.BYTES_PER_CTA // head_dim))
    spread = -(-num_rows // (2 * sm_count))
    return max(1, min(most, max(gather.MIN_TOKENS_PER_CTA, spread)))


def grid(num_rows: int, tokens_per_cta: int) -> int:
    return -(-num_rows // tokens_per_cta)
