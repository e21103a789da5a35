"""indexer_k_quant_and_cache: the torch-facing write op (contract: docs/contract.md §2).

Checks every argument (raising before anything is written), then runs the NVRTC kernel
on CUDA tensors (one launch) or the vectorized torch implementation
(indexer_k_quant_torch.py) on CPU tensors. Registered as torch.ops.nvrtc_gather.* at the bottom."""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch
from torch import Tensor

from ..jit import runtime
from ..jit.catalogue import QUANT_ENTRIES, QUANT_MODULES, THREADS_PER_BLOCK
from . import checks as v
from . import fake_checks, library, paged_layout
from .indexer_k_quant_torch import quant_torch

_FP8 = torch.float8_e4m3fn
_KV_DTYPES = (torch.uint8, _FP8)
_K_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_I64 = torch.int64
_TYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_is_compiling = torch.compiler.is_compiling

# scale_fmt -> ue8m0. Plain fp32 scales are spelled "fp8_e4m3", "fp8e4m3" (vllm-xpu-kernels'
# tests), "" or None (what engines pass); anything else is a typo and rejected. vLLM's own op
# treats every value but "ue8m0" as plain: its adapter (integrations/vllm.py) does the same.
SCALE_FMTS = {"ue8m0": True, "fp8_e4m3": False, "fp8e4m3": False, "": False, None: False}

UNROLL = 4  # tokens per block of the vector kernels / tokens_per_pass: NG_QUNROLL of cuda_src/quant_cache.cu


class QuantPlan(NamedTuple):
    """Sizes, byte strides, pointers and kernel choice of one validated call."""

    device: int               # CUDA ordinal, -1 for CPU
    num_tokens: int           # slot_mapping entries: rows of k written
    head_dim: int
    quant_block_size: int
    num_blocks: int
    block_size: int
    num_slots: int            # num_blocks * block_size
    block_stride: int         # bytes between cache blocks
    k_row_stride: int         # bytes
    ue8m0: bool
    vec: int                  # bytes per k load of the vector kernels; 0: the generic kernel
    tokens_per_pass: int      # vector kernels: THREADS_PER_BLOCK // lanes per token
    k_ptr: int
    slot_ptr: int
    kv_ptr: int


def _vector_width(k_align: int, esize: int, head_dim: int, qbs: int) -> int:
    """Widest k load (16 or 8 bytes) that the alignment allows, whose elements divide the
    quant block, and with at most THREADS_PER_BLOCK lanes per token; 0 if none."""
    for vec in (16, 8):
        elems = vec // esize
        if not k_align % vec and not qbs % elems and head_dim // elems <= THREADS_PER_BLOCK:
            return vec
    return 0


def plan_quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> QuantPlan:
    """Validate the arguments of indexer_k_quant_and_cache; reads no tensor data.

    Flat, each attribute read once, like gather.plan_gather: it runs on every call."""
    if not (isinstance(k, Tensor) and isinstance(kv_cache, Tensor) and isinstance(slot_mapping, Tensor)):
        for name, t in (("k", k), ("kv_cache", kv_cache), ("slot_mapping", slot_mapping)):
            v.tensor(name, t)
    k_dt = k.dtype
    if k_dt not in _K_DTYPES:
        v.dtype_in("k", k, _K_DTYPES)
    if kv_cache.dtype not in _KV_DTYPES:
        v.dtype_in("kv_cache", kv_cache, _KV_DTYPES)
    if slot_mapping.dtype is not _I64:
        v.dtype_in("slot_mapping", slot_mapping, (_I64,))
    qbs = quant_block_size
    if type(qbs) is not int:
        if isinstance(qbs, bool) or not hasattr(qbs, "__index__"):
            raise TypeError(f"quant_block_size: expected an int, got {type(qbs).__name__}")
        try:
            qbs = operator.index(qbs)
        except TypeError:  # e.g. a float tensor: torch's own message would not name the argument
            what = f"a {qbs.dtype} tensor" if isinstance(qbs, Tensor) else type(qbs).__name__
            raise TypeError(f"quant_block_size: expected an int, got {what}") from None
    try:
        ue8m0 = SCALE_FMTS[scale_fmt]
    except (KeyError, TypeError):
        if not isinstance(scale_fmt, str):
            raise TypeError(f"scale_fmt: expected a str (\"ue8m0\" or \"fp8_e4m3\"), got "
                            f"{type(scale_fmt).__name__}") from None
        raise ValueError(f"scale_fmt: expected \"ue8m0\" (power-of-two scales) or \"fp8_e4m3\" "
                         f"(plain fp32 scales; \"fp8e4m3\", \"\" and None mean the same), got {scale_fmt!r}") from None

    k_shape, kv_shape, sm_shape = k.shape, kv_cache.shape, slot_mapping.shape
    if len(k_shape) != 2:
        v.rank("k", k, 2, "[num_tokens, head_dim]")
    if len(kv_shape) != 3:
        v.rank("kv_cache", kv_cache, 3, "[num_blocks, block_size, cache_stride]")
    if len(sm_shape) != 1:
        v.rank("slot_mapping", slot_mapping, 1, "[num_tokens]")
    device = kv_cache.get_device()  # -1 for CPU (and for meta, hence the thorough check there)
    if device < 0 or not (k.get_device() == slot_mapping.get_device() == device and kv_cache.is_cuda and
                          k.is_cuda and slot_mapping.is_cuda):
        v.same_device({"kv_cache": kv_cache, "k": k, "slot_mapping": slot_mapping})

    rows, head_dim = k_shape
    num_blocks, block_size, cache_stride = kv_shape
    num_tokens = sm_shape[0]
    if head_dim < 4 or head_dim % 4:
        raise ValueError(f"k: head_dim (dim 1) must be a positive multiple of 4, got shape {tuple(k_shape)}")
    if qbs < 1 or head_dim % qbs:
        raise ValueError(f"quant_block_size: must be a positive divisor of head_dim={head_dim}, got {qbs}")
    if num_tokens > rows:
        raise ValueError(f"slot_mapping: {num_tokens} entries, more than the {rows} rows of k "
                         "(only the first len(slot_mapping) rows of k are written)")
    nq = head_dim // qbs
    block_stride = paged_layout.block_stride(kv_cache, kv_shape, head_dim, nq)
    k_row, k_col = k.stride()
    if k_col != 1:
        v.unit_inner_stride("k", k)
    if num_tokens > 1 and slot_mapping.stride(0) != 1:
        v.unit_inner_stride("slot_mapping", slot_mapping)
    if (num_tokens | block_size * head_dim | cache_stride) > v.INT32_MAX:
        for name, what, value in (("slot_mapping", "num_tokens", num_tokens),
                                  ("kv_cache", "block_size * head_dim", block_size * head_dim),
                                  ("kv_cache", "cache_stride", cache_stride)):
            v.fits_int32(name, what, value)

    esize = k.element_size()
    k_ptr, kv_ptr = k.data_ptr(), kv_cache.data_ptr()
    k_row_bytes = k_row * esize
    if (kv_ptr | block_stride) & 3 or k_ptr % esize:
        v.aligned("kv_cache", "data pointer", kv_ptr)
        v.aligned("kv_cache", "stride(0)", block_stride)
        v.aligned("k", "data pointer", k_ptr, esize)
    slot_ptr = slot_mapping.data_ptr()
    if num_tokens:  # the kernel writes kv_cache while it reads k and slot_mapping
        kv_end = kv_ptr + (num_blocks - 1) * block_stride + block_size * cache_stride if num_blocks else kv_ptr
        k_end = k_ptr + (num_tokens - 1) * k_row_bytes + head_dim * esize
        sm_end = slot_ptr + 8 * ((num_tokens - 1) * slot_mapping.stride(0) + 1)
        if (k_ptr < kv_end and kv_ptr < k_end) or (slot_ptr < kv_end and kv_ptr < sm_end):
            v.disjoint({"kv_cache": (kv_ptr, kv_end)}, {"k": (k_ptr, k_end), "slot_mapping": (slot_ptr, sm_end)})
    vec = _vector_width(k_ptr | (k_row_bytes if num_tokens > 1 else 0), esize, head_dim, qbs)
    tpp = THREADS_PER_BLOCK // (head_dim * esize // vec) if vec else 0
    return QuantPlan(device, num_tokens, head_dim, qbs, num_blocks, block_size, num_blocks * block_size,
                     block_stride, k_row_bytes, ue8m0, vec, tpp, k_ptr, slot_ptr, kv_ptr)


def launch_config(plan: QuantPlan, k_dtype: torch.dtype) -> tuple[str, int, tuple]:
    """Entry point, grid size and parameter values (all but the error buffer) of a validated
    call with num_tokens > 0."""
    n = plan.num_tokens
    if plan.vec:
        per_block = UNROLL * plan.tokens_per_pass
        grid = (n + per_block - 1) // per_block
    else:  # one thread per (token, quant block)
        grid = (n * (plan.head_dim // plan.quant_block_size) + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    return QUANT_ENTRIES[_TYPE_NAMES[k_dtype], plan.vec], grid, (
        plan.k_ptr, plan.slot_ptr, plan.kv_ptr, plan.k_row_stride, plan.block_stride, plan.num_slots,
        n, plan.block_size, plan.head_dim, plan.quant_block_size, plan.tokens_per_pass, int(plan.ue8m0))


def indexer_k_quant_and_cache(k: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                              quant_block_size: int, scale_fmt: str | None) -> None:
    """Quantize rows of ``k`` to fp8-e4m3 and write them into the paged indexer cache.

    Row ``i < len(slot_mapping)`` of ``k`` goes to slot ``s = slot_mapping[i]``: cache block
    ``s // block_size``, row ``s % block_size``; ``s < 0`` is padding and skipped. Each quant
    block of ``quant_block_size`` elements gets an fp32 scale ``max(amax, 1e-4) / 448``
    (rounded up to a power of two when ``scale_fmt == "ue8m0"``; ``"fp8_e4m3"``,
    ``"fp8e4m3"``, ``""`` or None keep it plain) and its values are stored as fp8-e4m3 of ``k / scale``.

    CUDA tensors: one kernel launch on the current stream, no host sync, no allocation;
    slots past the cache are skipped (set NVRTC_GATHER_DEBUG=1 to have them reported). CPU
    tensors: a torch implementation with identical bytes that raises ValueError on such a
    slot before writing anything.
    """
    if _is_compiling():  # inside torch.compile: appear in the graph as the registered op (ops/library.py)
        return torch.ops.nvrtc_gather.indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size,
                                                                 scale_fmt)
    plan = plan_quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
    device = plan.device
    if device < 0:
        quant_torch(plan, k, kv_cache, slot_mapping)
        return
    if plan.num_tokens == 0:
        return
    _launch(plan, k.dtype, QUANT_MODULES[_TYPE_NAMES[k.dtype], plan.vec])


def _launch(plan: QuantPlan, k_dtype: torch.dtype, module) -> None:
    stream = runtime.current_stream(plan.device)
    entry, grid, values = launch_config(plan, k_dtype)
    runtime.load(module, plan.device, stream).launch(entry, grid, values, stream)


def prepared(k, kv_cache, slot_mapping, quant_block_size, scale_fmt, *, module=None):
    """The benchmark's and tests' hook: a no-argument function that runs this call (CUDA
    tensors) exactly as the op does, optionally with another build of the quant source
    (``module``, holding the entry point the call needs; default: the op's)."""
    plan = plan_quant(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)

    def run(_keep=(k, kv_cache, slot_mapping)):  # the tensors outlive it
        if plan.num_tokens:
            _launch(plan, k.dtype, module or QUANT_MODULES[_TYPE_NAMES[k.dtype], plan.vec])
    return run


def quant_fake(k, kv_cache, slot_mapping, quant_block_size, scale_fmt) -> None:
    """The fake (meta) implementation: plan_quant's overlap check on the traced tensors'
    storages (ops/fake_checks.py says why); only the rows of k that are read count."""
    num_tokens = slot_mapping.size(0)
    if num_tokens and k.dim() == 2 and num_tokens <= k.size(0):
        fake_checks.disjoint({"kv_cache": kv_cache}, {"k": k, "slot_mapping": slot_mapping}, {"k": num_tokens})


library.register("indexer_k_quant_and_cache(Tensor k, Tensor(a!) kv_cache, Tensor slot_mapping, "
                 "int quant_block_size, str? scale_fmt) -> ()", indexer_k_quant_and_cache, quant_fake)
