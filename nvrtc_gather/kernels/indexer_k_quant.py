"""The write family (cuda_src/quant_cache.cu, indexer_k_quant_and_cache): its parameter
struct, one module per (k dtype, vector width), the entry points, and the policy that picks
the vector width and grid of a call. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register

THREADS = 256
UNROLL = 4  # tokens per lane of the vector kernels (-DNG_QUNROLL): a block covers UNROLL * tokens_per_pass
PARAMS = ParamStruct("QuantParams", (
    ("k", "ptr"), ("slot_mapping", "ptr"), ("kv_cache", "ptr"),
    ("k_row_stride", "i64"), ("block_stride", "i64"), ("num_slots", "i64"),
    ("num_tokens", "i32"), ("block_size", "i32"), ("head_dim", "i32"), ("quant_block_size", "i32"),
    ("tokens_per_pass", "i32"), ("ue8m0", "i32"),
    ("error", "ptr"),
))
K_TYPES = {"bf16": ("Bf16", 2), "f16": ("F16", 2), "f32": ("F32", 4)}  # name -> (source type, bytes)
VECTOR_WIDTHS = (16, 8, 0)  # bytes per k load; 0: the generic kernel (one thread per token and quant block)
# --fmad=false: no a*b+c contraction; --ftz=false: subnormals kept (the default, made explicit).
# Together they keep the kernel's fp32 arithmetic exactly the torch path's.
OPTIONS = ("--fmad=false", "--ftz=false", f"-DNG_QUNROLL={UNROLL}")


def entry_name(k_type: str, vec: int) -> str:
    return f"quant_cache_{k_type}_{f'v{vec}' if vec else 'any'}"


def _body(k_type: str, vec: int) -> str:
    t = K_TYPES[k_type][0]
    return f"quant_vec<{t}, {vec}>" if vec else f"quant_any<{t}>"


# One module per entry point: an engine writes one k dtype with one alignment, so its first
# write compiles one ninth of the file.
MODULES = {(k_type, vec): KernelModule(
    name=entry_name(k_type, vec),
    source="quant_cache.cu",
    entries=(Entry(entry_name(k_type, vec), _body(k_type, vec)),),
    params=PARAMS,
    label="indexer_k_quant_and_cache",
    options=OPTIONS,
    threads=THREADS,
) for k_type in K_TYPES for vec in VECTOR_WIDTHS}
register(*MODULES.values())


def vector_width(k_align: int, element_size: int, head_dim: int, quant_block_size: int) -> int:
    """Widest k load (16 or 8 bytes) that k's alignment allows, whose elements divide the quant
    block, and with at most THREADS lanes per token; 0 (the generic kernel) if none."""
    for vec in (16, 8):
        elems = vec // element_size
        if not k_align % vec and not quant_block_size % elems and head_dim // elems <= THREADS:
            return vec
    return 0


def tokens_per_pass(vec: int, element_size: int, head_dim: int) -> int:
    """Tokens one pass of a vector kernel's block covers (THREADS // lanes per token); 0 for
    the generic kernel."""
    return THREADS // (head_dim * element_size // vec) if vec else 0


def grid(vec: int, num_tokens: int, tokens_per_pass_: int, head_dim: int, quant_block_size: int) -> int:
    if vec:
        per_block = UNROLL * tokens_per_pass_
        return (num_tokens + per_block - 1) // per_block
    return (num_tokens * (head_dim // quant_block_size) + THREADS - 1) // THREADS  # one thread per quant block
