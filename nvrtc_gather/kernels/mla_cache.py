"""The MLA-cache family (cuda_src/mla_write.cu: concat_and_cache_mla; cuda_src/mla_gather.cu:
cp_gather_and_upconvert_fp8_kv_cache): the parameter structs, the modules and their entry
points, and the policies that pick a call's entry point and grid. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register

THREADS = 256
WARPS = THREADS // 32
RECORD_BYTES = 656          # fp8_ds_mla: 512 fp8 codes, 4 fp32 tile scales, 64 bf16 k_pe values
NOPE, ROPE, TILE = 512, 64, 128
SCALES_AT, ROPE_AT = 512, 528  # byte offsets in the record

WRITE_PARAMS = ParamStruct("MlaWriteParams", (
    ("kv_c", "ptr"), ("k_pe", "ptr"), ("slot_mapping", "ptr"), ("scale", "ptr"), ("kv_cache", "ptr"),
    ("kv_c_row_stride", "i64"), ("k_pe_row_stride", "i64"), ("block_stride", "i64"), ("entry_stride", "i64"),
    ("num_slots", "i64"),
    ("flags", "i32"), ("tokens_per_warp", "i32"), ("num_tokens", "i32"), ("block_size", "i32"),
    ("kv_lora_rank", "i32"), ("pe_dim", "i32"),
    ("error", "ptr"),
))
POW2_SCALES, SKIP_SCALE = 1, 2  # WRITE_PARAMS.flags (NG_MLA_* of cuda_src/mla_params.cuh)

GATHER_PARAMS = ParamStruct("MlaGatherParams", (
    ("src_cache", "ptr"), ("dst", "ptr"), ("block_table", "ptr"), ("workspace_starts", "ptr"), ("seq_starts", "ptr"),
    ("block_stride", "i64"), ("entry_stride", "i64"), ("dst_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_rows", "i32"), ("batch", "i32"), ("max_blocks", "i32"), ("num_blocks", "i32"), ("block_size", "i32"),
    ("rows_per_cta", "i32"),
    ("error", "ptr"),
))

MAX_TOKENS_PER_WARP = 2  # the writers' most tokens per warp (-DNG_MLA_TPW): all their loads in flight at once
MANY_TOKENS = 65536      # from here a write call takes MAX_TOKENS_PER_WARP (H200: 131K 1.23x -> 1.14x the
                         # copy, 1M 1.21x -> 1.11x); below, one (1024 tokens: 1.28x with two, 1.19x with one)
# --fmad=false: no a*b+c contraction; --ftz=false: subnormals kept (the default, made explicit).
_OPTIONS = ("--fmad=false", "--ftz=false", f"-DNG_MLA_TPW={MAX_TOKENS_PER_WARP}")
_TYPES = {"bf16": "MlaBf16", "f16": "MlaF16", "f32": "MlaF32"}
DS_TYPES = ("bf16", "f16")          # kv_c / k_pe types of fp8_ds_mla
PLAIN_MODES = ("copy", "fp8")       # "auto" / "bfloat16" / "float16": copy; "fp8" / "fp8_e4m3": fp8
VECTOR_WIDTHS = (16, 0)             # 16-byte accesses, or 0: any alignment (2/4-byte accesses)


def ds_entry(k_type: str, vec: int) -> str:
    return f"mla_ds_{k_type}_{'v16' if vec else 'any'}"


def plain_entry(k_type: str, mode: str) -> str:
    return f"mla_plain_{k_type}_{mode}"


def gather_entry(vec: int) -> str:
    return f"mla_gather_{'v16' if vec else 'v4'}"


# One module per (format, type): an engine writes one format and one dtype, so its first write
# compiles only that.
DS_MODULES = {k_type: KernelModule(
    name=f"mla_ds_{k_type}", source="mla_write.cu",
    entries=tuple(Entry(ds_entry(k_type, vec), f"mla_ds_body<{_TYPES[k_type]}, {vec or 2}>") for vec in VECTOR_WIDTHS),
    params=WRITE_PARAMS, label="concat_and_cache_mla", options=_OPTIONS, threads=THREADS,
) for k_type in DS_TYPES}
PLAIN_MODULES = {k_type: KernelModule(
    name=f"mla_plain_{k_type}", source="mla_write.cu",
    entries=tuple(Entry(plain_entry(k_type, mode), f"mla_plain_body<{_TYPES[k_type]}, {str(mode == 'fp8').lower()}>")
                  for mode in PLAIN_MODES),
    params=WRITE_PARAMS, label="concat_and_cache_mla", options=_OPTIONS, threads=THREADS,
) for k_type in _TYPES}
GATHER_MODULE = KernelModule(
    name="mla_gather", source="mla_gather.cu",
    entries=tuple(Entry(gather_entry(vec), f"mla_gather_body<{vec or 4}>") for vec in VECTOR_WIDTHS),
    params=GATHER_PARAMS, label="cp_gather_and_upconvert_fp8_kv_cache", options=_OPTIONS, threads=THREADS,
)
register(*DS_MODULES.values(), *PLAIN_MODULES.values(), GATHER_MODULE)


def vector_width(low_bits: int) -> int:
    """16 when every pointer and stride OR-ed into ``low_bits`` is a multiple of 16, else 0
    (the kernels of any alignment)."""
    return 0 if low_bits & 15 else 16


def tokens_per_warp(num_tokens: int) -> int:
    """A write call's tokens per warp: one for a small call (latency), more for a large one."""
    return MAX_TOKENS_PER_WARP if num_tokens >= MANY_TOKENS else 1


def write_grid(num_tokens: int, tokens_per_warp_: int) -> int:
    per_block = WARPS * tokens_per_warp_
    return (num_tokens + per_block - 1) // per_block


# -- gather tile policy -----------------------------------------------------------------------
MAX_ROWS_PER_CTA = 16   # 2 rows per warp, both in flight at once (a sweep on the H200: 16 < 32 < 64 < 8 rows)
MIN_ROWS_PER_CTA = WARPS


def rows_per_cta(num_rows: int, sm_count: int) -> int:
    """Rows per thread block: small calls spread over every SM (two blocks each), with at least
    one row per warp; large ones MAX_ROWS_PER_CTA."""
    spread = -(-num_rows // (2 * sm_count))
    return max(MIN_ROWS_PER_CTA, min(MAX_ROWS_PER_CTA, -(-spread // WARPS) * WARPS))


def gather_grid(num_rows: int, rows: int) -> int:
    return (num_rows + rows - 1) // rows
