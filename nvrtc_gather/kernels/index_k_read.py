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


SHAPES = ("", "wide", "tiny")  # as the indexer gather's: 4 or 8 loads in flight per thread; a warp a row
_BODIES = {"": "index_k_read_body<{vec}, 4, {lt}, {pt}>", "wide": "index_k_read_body<{vec}, 8, {lt}, {pt}>",
           "tiny": "index_k_read_tiny<{vec}, {lt}, {pt}>"}


def module_name(vec: int, lengths: str, pages: str) -> str:
    return f"index_k_read_v{vec}_l{lengths[1:]}_p{pages[1:]}"


def entry_name(vec: int, lengths: str, pages: str, shape: str = "") -> str:
    return module_name(vec, lengths, pages) + (f"_{shape}" if shape else "")


# One module per vector width and index dtypes: a deployment uses one of each (SGLang: int32).
MODULES = {(vec, lt, pt): KernelModule(
    name=module_name(vec, lt, pt),
    source="index_k_read.cu",
    entries=tuple(Entry(entry_name(vec, lt, pt, s), _BODIES[s].format(vec=vec, lt=lt, pt=pt)) for s in SHAPES),
    params=PARAMS,
    label="get_index_k_scale_buffer",
    threads=THREADS,
) for vec in gather.VECTOR_WIDTHS for lt in INDEX_TYPES for pt in INDEX_TYPES}
register(*MODULES.values())

vector_width = gather.vector_width


def shape_for(head_dim: int, num_rows: int, sm_count: int) -> tuple[int, str]:
    """(rows per block, entry shape): the indexer gather's tile policy (gather.tokens_per_cta,
    gather.entry_for), the same rows per block and the same three shapes."""
    tpc = gather.tokens_per_cta(head_dim, num_rows, sm_count)
    entry = gather.entry_for(16, tpc, head_dim)
    return tpc, "tiny" if entry.endswith("_tiny") else "wide" if entry.endswith("_wide") else ""


def shape_rule(head_dim: int, sm_count: int):
    """shape_for of one layout as a function of the row count alone, its constants bound once (a
    call's host cost: it runs on every call)."""
    most = max(1, min(THREADS, gather.BYTES_PER_CTA // head_dim))
    wave, floor, two_sms = most * sm_count * gather.CTAS_PER_SM, gather.MIN_TOKENS_PER_CTA, 2 * sm_count
    wide_ok = 2 * most <= THREADS and 2 * most * head_dim > gather.BYTES_PER_CTA
    tiny = (floor, "tiny") if floor * head_dim < gather.BYTES_PER_CTA else (floor, "")

    def rule(n: int) -> tuple[int, str]:
        if wide_ok and wave >= n > wave * 3 // 4:
            return 2 * most, "wide"
        spread = -(-n // two_sms)
        if spread <= floor:
            return tiny if most >= floor else (most, "")
        return (spread, "") if spread < most else (most, "")
    return rule


def grid(num_rows: int, tokens_per_cta: int) -> int:
    return -(-num_rows // tokens_per_cta)
