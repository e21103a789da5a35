"""The write family (cuda_src/quant_cache.cu, indexer_k_quant_and_cache): its parameter
struct, one module per (k dtype, vector width, shape), the entry points, and the policy that
picks the vector width, shape and grid of a call. Torch-free."""
from __future__ import annotations

from ..jit.spec import Entry, KernelModule, ParamStruct, register

THREADS = 256
# Tokens per lane of the vector kernels by shape (a block covers unroll * tokens_per_pass tokens,
# all its loads issued at once). "small": calls of less than a wave (shape_for), where more,
# smaller blocks start sooner (measured on an H200: see shape_for).
SHAPES = {"": 4, "small": 2}
SMALL_CALL_BLOCKS_PER_SM = 4  # blocks of 256 threads at 64 registers an SM holds: one wave
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
OPTIONS = ("--fmad=false", "--ftz=false")


def entry_name(k_type: str, vec: int, shape: str = "") -> str:
    return f"quant_cache_{k_type}_{f'v{vec}' if vec else 'any'}" + (f"_{shape}" if shape else "")


def _body(k_type: str, vec: int, shape: str) -> str:
    t = K_TYPES[k_type][0]
    return f"quant_vec<{t}, {vec}, {SHAPES[shape]}>" if vec else f"quant_any<{t}>"


def shapes(vec: int) -> tuple:
    """The shapes of a vector width's kernels (the generic kernel has one)."""
    return tuple(SHAPES) if vec else ("",)


# One module per entry point: an engine writes one k dtype with one alignment, so its first
# write compiles one entry point of the file (0.5-0.8 s each on the 2-core CI machine; a module
# holding both shapes would take about their sum).
MODULES = {(k_type, vec, shape): KernelModule(
    name=entry_name(k_type, vec, shape),
    source="quant_cache.cu",
    entries=(Entry(entry_name(k_type, vec, shape), _body(k_type, vec, shape)),),
    params=PARAMS,
    label="indexer_k_quant_and_cache",
    options=OPTIONS,
    threads=THREADS,
) for k_type in K_TYPES for vec in VECTOR_WIDTHS for shape in shapes(vec)}
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


def shape_for(vec: int, num_tokens: int, tokens_per_pass_: int, sm_count: int) -> str:
    """"small" when the usual shape's blocks would not fill one wave of the GPU (at
    SMALL_CALL_BLOCKS_PER_SM): twice as many blocks of half the tokens then finish sooner (on an
    H200, 1024 tokens: 5.1 against 5.3 µs; 16K: 7.0 against 7.2); from a wave on the usual shape
    is as fast or faster (1M tokens: 106 against 113 µs)."""
    if vec and grid(vec, num_tokens, tokens_per_pass_, 0, 0) < SMALL_CALL_BLOCKS_PER_SM * sm_count:
        return "small"
    return ""


def grid(vec: int, num_tokens: int, tokens_per_pass_: int, head_dim: int, quant_block_size: int,
         shape: str = "") -> int:
    if vec:
        per_block = SHAPES[shape] * tokens_per_pass_
        return (num_tokens + per_block - 1) // per_block
    return (num_tokens * (head_dim // quant_block_size) + THREADS - 1) // THREADS  # one thread per quant block
