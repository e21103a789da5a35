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


# As the indexer gather's (4 or 8 loads in flight per thread; a warp a row), and the request-major
# tiles (a block per tile of one request: index_k_read_by_request, 4 loads in flight per thread;
# "req_wide", tiles of THREADS rows with 8, has a constant-size build only: FIXED_SHAPES).
SHAPES = ("", "wide", "tiny", "req")
_BODIES = {"": "index_k_read_body<{vec}, 4, {lt}, {pt}, {fixed}>",
           "wide": "index_k_read_body<{vec}, 8, {lt}, {pt}, {fixed}>",
           "tiny": "index_k_read_tiny<{vec}, {lt}, {pt}, {fixed}>",
           "req": "index_k_read_by_request<{vec}, 4, {lt}, {pt}, {fixed}>",
           "req_wide": "index_k_read_by_request<{vec}, 8, {lt}, {pt}, {fixed}>"}
# (page_size, index_head_dim, scale words a token): SGLang's default layout. The shapes of
# FIXED_SHAPES have a second entry (FIXED_TAG in its name) compiled with these as constants
# (fixed_layout.cuh), which calls of this layout launch: a quarter to half less code (sm_90), and
# after the L2 flush (in an engine, the other kernels of a layer) a kernel's code comes from DRAM.
# The write (indexer_k_scatter.py) builds its entries of this layout from the same constants.
FIXED_LAYOUT = (64, 128, 1)
FIXED_TAG = "_p64k128"
# the source's constants of it (fixed_layout.cuh)
FIXED_OPTIONS = tuple(f"-DNG_FIXED_{name}={value}"
                 for name, value in zip(("PAGE_SIZE", "HEAD_DIM", "SCALE_WORDS"), FIXED_LAYOUT))


def is_fixed_layout(page_size: int, head_dim: int, scale_words: int) -> bool:
    """Whether a call's layout (page or block size, head_dim, scale words a token) is FIXED_LAYOUT:
    the read and the write then launch their entries built with it as constants."""
    return (page_size, head_dim, scale_words) == FIXED_LAYOUT

# The shapes with such a build. Not the row-major one: with the sizes as constants ptxas split its
# skip pass (skip_chunks: 16 length loads, one round trip a pass) into 3-4 round trips (sm_90, NVRTC
# 13.0 and 13.5; tests/jit/test_sass_order.py), and that entry serves the calls of over 256 requests.
# The request-major build needs 58-64 registers where the general one needs 48: it is bounded at
# FIXED_RESIDENT blocks an SM, not RESIDENT (within 48 it spilled, a local load a tile before its
# copy, and measured 0.4 us slower at 8x16384). The tiny build spills nothing where the general one does.
FIXED_SHAPES = ("wide", "tiny", "req", "req_wide")
BY_REQUEST = ("req", "req_wide")
# Blocks of the request-major entry an SM holds at once, guaranteed by its __launch_bounds__ (48
# registers, as ptxas chose them; bounded to 6 blocks, as the row-major entry's 40 allow, it
# spilled and measured no faster).
RESIDENT = 5
# The wide entry's __launch_bounds__ block count: a wide grid is at most one wave of these (blocks
# of twice the rows: gather.tokens_per_cta), and its 64 registers a thread allow them (sm_90, NVRTC
# 13.0 and 13.5, with or without the bound). Asked for, ptxas schedules the copy otherwise, and it
# measured 0.5-0.7 us faster at 1x131072, 64x2048 and 4x32768 (H100, A/A within 0.1 us). The
# gather's wide entry measured 1.2-1.5 us slower bounded so, and stays free.
WIDE_RESIDENT = gather.CTAS_PER_SM // 2
# The request-major constant-size entry's block count: its 64 registers a thread allow 4 blocks
# (sm_90, NVRTC 13.0 and 13.5: no spill). Measured against the general entry at RESIDENT (H100,
# 300 runs): 0.15 us faster at 2x16384, 0.20 at 16x2048, 0.03 at 8x16384 (1448 blocks: 2.7
# waves of 4 blocks an SM against 2.2 of 5).
FIXED_RESIDENT = 4
# The fixed layout's request-major grids past one wave of FIXED_RESIDENT blocks an SM take tiles of
# THREADS rows with 8 loads in flight a thread ("req_wide": 68-80 registers, 3 blocks an SM, 96 KB in
# flight an SM against 64). After other kernels leave the L2 dirty (the bench's flush; an engine's
# layer) every line the read brings in waits for a write-back, and more bytes in flight hide it.
# Measured against the 128-row tiles (H100, 300 runs, L2 dirty): 0.13 us faster at 8x16384, 0.35 at
# 8x8192, 0.71 at 4x16384, within 0.1 of SGLang's Triton read on all three; with a clean L2 the
# 128-row tiles were already 0.25-0.6 ahead of it.
REQ_WIDE_RESIDENT = 3
_BOUNDS = {"req": RESIDENT, "wide": WIDE_RESIDENT}  # shape -> its entry's blocks an SM
_FIXED_BOUNDS = {**_BOUNDS, "req": FIXED_RESIDENT, "req_wide": REQ_WIDE_RESIDENT}  # the constant-size entries


def module_name(vec: int, lengths: str, pages: str) -> str:
    return f"index_k_read_v{vec}_l{lengths[1:]}_p{pages[1:]}"


def entry_name(vec: int, lengths: str, pages: str, shape: str = "", fixed: bool = False) -> str:
    """The entry of a shape (the name's last part); ``fixed`` (a call of FIXED_LAYOUT): its build
    with the sizes as constants where the shape has one (FIXED_TAG before the shape)."""
    tag = FIXED_TAG if fixed and shape in FIXED_SHAPES else ""
    return module_name(vec, lengths, pages) + tag + (f"_{shape}" if shape else "")


# One module per vector width and index dtypes: a deployment uses one of each (SGLang: int32).
MODULES = {(vec, lt, pt): KernelModule(
    name=module_name(vec, lt, pt),
    source="index_k_read.cu",
    entries=tuple(Entry(entry_name(vec, lt, pt, s, fixed),
                        _BODIES[s].format(vec=vec, lt=lt, pt=pt, fixed="true" if fixed else "false"),
                        (_FIXED_BOUNDS if fixed else _BOUNDS).get(s, 0))
                  for fixed in (False, True) for s in (FIXED_SHAPES if fixed else SHAPES)),
    params=PARAMS,
    label="get_index_k_scale_buffer",
    options=FIXED_OPTIONS,
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


def launch_rule(head_dim: int, sm_count: int, batch: int, fixed: bool = False):
    """A layout's launch as a function of a call's row count and the engine's max_seq_len:
    (rows per block, entry shape, blocks). shape_rule's tiles; request-major ones of the same
    rows (a block per tile of a request, grid_by_request) in place of its 16 KiB tiles for 2 to
    THREADS requests where that grid is within a factor of two of the row-major grid: not where
    the longest request would leave most of it empty (its blocks past the requests' ends exit
    after one round trip), nor where a max_seq_len below the rows would leave few blocks looping
    (it is the engine's host int: it sizes the grid, and the kernel covers every row whatever it
    says). Not in place of the wide tiles (a grid of one wave: request-major ones measured 0.7-1
    µs slower). Measured on an H100 against the row-major tiles: 0.1-0.4 µs faster where the
    grid fits one wave, 0.2-0.8 µs faster on grids of 1.1-2.2 waves (2-200 requests). ``fixed`` (a
    layout of FIXED_LAYOUT): such a grid past one wave of FIXED_RESIDENT blocks an SM takes the
    "req_wide" tiles (THREADS rows) instead."""
    rule = shape_rule(head_dim, sm_count)
    by_request = 2 <= batch <= THREADS
    wave = FIXED_RESIDENT * sm_count if fixed else None

    def launch(n: int, max_len: int) -> tuple[int, str, int]:
        tpc, shape = rule(n)
        blocks = -(-n // tpc)
        if by_request and shape == "":
            mine = grid_by_request(batch, max_len, tpc)
            if blocks <= 2 * mine and mine <= 2 * blocks + batch:
                if wave is not None and mine > wave:
                    return THREADS, "req_wide", grid_by_request(batch, max_len, THREADS)
                return tpc, "req", mine
        return tpc, shape, blocks
    return launch


def grid(num_rows: int, tokens_per_cta: int) -> int:
    """Blocks of the row-major shapes: a block per tokens_per_cta rows."""
    return -(-num_rows // tokens_per_cta)


def grid_by_request(batch: int, max_len: int, tokens_per_cta: int) -> int:
    """Blocks of the request-major shapes: a block per tile of the longest request's length, for
    each request (at least one each)."""
    return max(batch, 1) * max(1, -(-max_len // tokens_per_cta))
