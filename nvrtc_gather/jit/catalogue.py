"""The catalogue of kernel modules: for each, its source file, entry points, parameter
struct and options, each written here once.

A module is compiled once per target arch into one cubin holding all its entry points
(build.py), loaded once per device (runtime.py) and launched through one handle. A new
kernel plugs in by adding a KernelModule here and its source to cuda_src/; compiling,
caching, loading and launching are shared."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

# Must match NG_THREADS in cuda_src/common.cuh.
THREADS_PER_BLOCK = 256

_FORMATS = {"ptr": "Q", "i64": "q", "i32": "i"}


@dataclass(frozen=True)
class ParamStruct:
    """A kernel's single by-value parameter struct, as declared in its ``.cuh`` (checked
    field by field by tests/jit/test_catalogue.py). The last field is always ``error``, the
    debug-mode error buffer, which the runtime fills in."""

    name: str
    fields: tuple[tuple[str, str], ...]  # (name, "ptr" | "i64" | "i32"), in declaration order
    layout: struct.Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        assert self.fields[-1] == ("error", "ptr"), "the debug error pointer must be the last field"
        fmt = "<" + "".join(_FORMATS[t] for _, t in self.fields)
        object.__setattr__(self, "layout", struct.Struct(fmt))


@dataclass(frozen=True)
class KernelModule:
    name: str                    # short id, used in cache file names
    source: str                  # file in cuda_src/ (or in ``source_dir``)
    kernels: tuple[str, ...]     # extern "C" entry points
    params: ParamStruct          # the struct every entry point takes
    label: str                   # the op it serves, for messages (debug-mode errors)
    options: tuple[str, ...] = ()  # extra NVRTC options (the arch is added per target)
    source_dir: str | None = None  # None: the package's cuda_src/; else a directory of its own


GATHER_PARAMS = ParamStruct("GatherParams", (
    ("kv_cache", "ptr"), ("dst_k", "ptr"), ("dst_scale", "ptr"), ("block_table", "ptr"), ("cu_seq_lens", "ptr"),
    ("block_stride", "i64"), ("dst_k_row_stride", "i64"), ("dst_scale_row_stride", "i64"), ("bt_row_stride", "i64"),
    ("num_tokens", "i32"), ("batch", "i32"), ("max_blocks", "i32"), ("num_blocks", "i32"), ("block_size", "i32"),
    ("head_dim", "i32"), ("scale_words", "i32"), ("tokens_per_cta", "i32"),
    ("error", "ptr"),
))
# (vector width, shape) -> entry point of cuda_src/gather_indexer_k.cu
GATHER_ENTRIES = {(vec, shape): f"gather_indexer_k_v{vec}" + (f"_{shape}" if shape else "")
                  for vec in (16, 8, 4) for shape in ("", "wide", "tiny")}
# One module per vector width (-DNG_GATHER_VEC selects its entry points): a process compiles
# only what its calls use, nearly always the 16-byte one, in a third of the whole file's time.
GATHER_MODULES = {vec: KernelModule(
    name=f"gather_indexer_k_v{vec}",
    source="gather_indexer_k.cu",
    kernels=tuple(name for (v, _), name in GATHER_ENTRIES.items() if v == vec),
    params=GATHER_PARAMS,
    label="cp_gather_indexer_k_quant_cache",
    options=(f"-DNG_GATHER_VEC={vec}",),
) for vec in (16, 8, 4)}
GATHER = GATHER_MODULES[16]  # the build nearly every call runs

QUANT_PARAMS = ParamStruct("QuantParams", (
    ("k", "ptr"), ("slot_mapping", "ptr"), ("kv_cache", "ptr"),
    ("k_row_stride", "i64"), ("block_stride", "i64"), ("num_slots", "i64"),
    ("num_tokens", "i32"), ("block_size", "i32"), ("head_dim", "i32"), ("quant_block_size", "i32"),
    ("tokens_per_pass", "i32"), ("ue8m0", "i32"),
    ("error", "ptr"),
))
# (k dtype name, vector width; 0 = the generic kernel) -> entry point of cuda_src/quant_cache.cu
QUANT_ENTRIES = {(dt, vec): f"quant_cache_{dt}_{f'v{vec}' if vec else 'any'}"
                 for dt in ("bf16", "f16", "f32") for vec in (16, 8, 0)}
# --fmad=false: no a*b+c contraction; --ftz=false: subnormals kept (the default, made explicit).
# Together they keep the kernel's fp32 arithmetic exactly the torch path's.
QUANT_OPTIONS = ("--fmad=false", "--ftz=false")
# One module per entry point (-DNG_QUANT_K and -DNG_QUANT_VEC select it): an engine writes one
# k dtype with one alignment, so its first write compiles one ninth of the file.
_QUANT_K = {"bf16": 1, "f16": 2, "f32": 4}
QUANT_MODULES = {(dt, vec): KernelModule(
    name=f"quant_cache_{dt}_{f'v{vec}' if vec else 'any'}",
    source="quant_cache.cu",
    kernels=(QUANT_ENTRIES[dt, vec],),
    params=QUANT_PARAMS,
    label="indexer_k_quant_and_cache",
    options=QUANT_OPTIONS + (f"-DNG_QUANT_K={_QUANT_K[dt]}", f"-DNG_QUANT_VEC={vec}"),
) for dt, vec in QUANT_ENTRIES}
QUANT = QUANT_MODULES["bf16", 16]  # what DeepSeek-V3.2 writes

# Every module the ops can launch (the warmup tool compiles all of them).
ALL_MODULES: tuple[KernelModule, ...] = (*GATHER_MODULES.values(), *QUANT_MODULES.values())
