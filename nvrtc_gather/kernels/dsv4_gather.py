"""The DeepSeek-V4 record gathers (cuda_src/dsv4_gather.cu): the parameter struct, SGLang's flat
token-id forms (bf16 or fp8 out, int32 or int64 ids; V4.1's records in their own module, bf16
out) and vLLM's paged form, and the grid policy. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register

THREADS = 256
PASSES = 1                        # tokens per warp (-DNG_V4_PASSES): 1 measured best on the H200
ROWS_PER_CTA = THREADS // 32 * PASSES  # a warp a token (NG_V4_ROWS)
RECORD_BYTES = 584                # 448 fp8 NoPE + 64 bf16 RoPE + 7 UE8M0 scales + 1 pad
DATA_BYTES, SCALE_BYTES = 576, 8  # a page: every token's data, then every token's scales
ROW_VALUES = 512                  # values of an output row
PAGE_ALIGN = 576                  # the engines pad a page to a multiple of one data record
PARAMS = ParamStruct("DsV4GatherParams", (
    ("cache", "ptr"), ("out", "ptr"), ("ids", "ptr"), ("seq_lens", "ptr"), ("gather_lens", "ptr"),
    ("rows", "i64"), ("num_ids", "i64"), ("out_row_stride", "i64"), ("out_req_stride", "i64"),
    ("ids_stride", "i64"), ("max_blocks", "i64"), ("offset", "i64"), ("tiles_per_req", "i64"),
    ("page_stride", "i64"), ("num_slots", "i64"),
    ("page_size", "i32"), ("num_pages", "i32"),
    ("error", "ptr"),
))
CALL_FIELDS = PARAMS.names[:13]  # written by each call (pointers, sizes and strides of its tensors)


def flat_entry(fp8_out: bool, ids: str) -> str:
    return f"dsv4_flat_{'fp8' if fp8_out else 'bf16'}_{ids}"


# SGLang's V4.1 layouts (KVLayout values) -> (fp4 codes, scales right after each token's data).
# A token: MXFP8 512 e4m3 codes + 16 UE8M0 scales; FP4 256 bytes of e2m1 pairs + 32 e4m3 scales.
V41_LAYOUTS = {"v41": (False, False), "v41_new": (False, True), "v41_fp4": (True, False), "v41_fp4_new": (True, True)}
TOKEN_BYTES = {"v4": RECORD_BYTES, "v41": 528, "v41_new": 528, "v41_fp4": 288, "v41_fp4_new": 288}


def v41_entry(layout: str, ids: str) -> str:
    return f"dsv41_flat_{layout}_{ids}"


PAGED_ENTRY = "dsv4_paged_bf16"
FLAT_MODULE = KernelModule(
    name="dsv4_flat", source="dsv4_gather.cu",
    entries=tuple(Entry(flat_entry(f, it), f"dsv4_flat_body<{it}, V4Record<{'true' if f else 'false'}>>")
                  for f in (False, True) for it in ("i32", "i64")),
    params=PARAMS, label="dsv4 record gather (SGLang)", threads=THREADS, options=(f"-DNG_V4_PASSES={PASSES}",))
V41_MODULE = KernelModule(
    name="dsv41_flat", source="dsv4_gather.cu",
    entries=tuple(Entry(v41_entry(lay, it), f"dsv4_flat_body<{it}, V41Record<{str(fp4).lower()}, "
                                            f"{str(inter).lower()}>>")
                  for lay, (fp4, inter) in V41_LAYOUTS.items() for it in ("i32", "i64")),
    params=PARAMS, label="dsv4.1 record gather (SGLang)", threads=THREADS, options=(f"-DNG_V4_PASSES={PASSES}",))
PAGED_MODULE = KernelModule(
    name="dsv4_paged", source="dsv4_gather.cu", entries=(Entry(PAGED_ENTRY, "dsv4_paged_body"),),
    params=PARAMS, label="dequantize_and_gather_k_cache", threads=THREADS, options=(f"-DNG_V4_PASSES={PASSES}",))
register(FLAT_MODULE, PAGED_MODULE, V41_MODULE)


def page_bytes(page_size: int) -> int:
    """The page stride both engines allocate: the records rounded up to a multiple of 576."""
    return -(-page_size * RECORD_BYTES // PAGE_ALIGN) * PAGE_ALIGN


def tiles(rows: int) -> int:
    return -(-rows // ROWS_PER_CTA)
