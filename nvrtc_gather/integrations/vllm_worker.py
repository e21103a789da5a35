"""Load the replaced ops' kernels on each vLLM worker's own GPU before it serves.

vLLM's startup never runs the gather (its dummy runs return early through the indexer's fake
path), so without this the first real prefill pays the load, or a compile. Where to hook, from
vLLM's source (0.33.0; the same shape since the V1 engine):
- ``WorkerWrapperBase.init_worker`` (``vllm/v1/worker/worker_base.py``) calls
  ``load_general_plugins()`` before the worker exists: no device is set when the plugin runs;
- the executors (``vllm/v1/executor/uniproc_executor.py``, ``multiproc_executor.py``) then call
  ``WorkerWrapperBase.init_device``, which calls the worker's ``init_device``
  (``vllm/v1/worker/gpu_worker.py``: ``torch.accelerator.set_device_index(self.device)``), then
  load the model, profile memory and capture CUDA graphs.
So the plugin wraps ``WorkerWrapperBase.init_device``: after vLLM's, it loads (from the kernel
cache, or compiles) the replaced ops' modules on ``worker.device`` only. Nothing runs in
processes that never set up a worker (API server, engine core of a multi-process executor).
Where the plugin runs before that module is imported (vLLM's in-process engine loads plugins
while parsing its arguments), an import hook wraps the class when the module is first imported.

A failure to load (``NVRTC_GATHER_DISABLE_JIT=1`` with a cache that lacks the GPU's kernels, no
NVRTC) raises there, so the worker fails at startup with our message instead of at the first
request."""
from __future__ import annotations

import functools
import sys
import threading
import time

import torch

from ..jit import runtime
from ..kernels import cache_gather as cache_gather_kernels, dsv4_gather as dsv4_kernels, \
    gather as gather_kernels, indexer_k_quant as quant_kernels, mla_cache as mla_kernels
from ..ops.cache_gather import KV_CACHE_DTYPES as GATHER_KV_CACHE_DTYPES
from ..ops.indexer_k_quant import TYPE_NAMES
from ..ops.mla_write import TYPE_NAMES as MLA_TYPE_NAMES
from . import activation
from .import_hook import AfterImport

MODULE = "vllm.v1.worker.worker_base"
CLASS = "WorkerWrapperBase"
_TAG = "_nvrtc_gather_preload"

_lock = threading.Lock()
_state = {"ops": (), "logger": None, "status": "not installed"}


def status() -> str:
    """``"not installed"``, ``"waiting for <module>"`` (import hook set), ``"hooked"`` (the
    class is wrapped), ``"loaded on cuda:N (...)"`` after a worker set up, or why not."""
    return _state["status"]


def modules_for(ops, dtype: torch.dtype | None = None, cache_dtype: str | None = None) -> tuple:
    """The kernel modules the given vLLM ops can launch: every gather module (one per vector
    width), the write ops' modules for the model's dtype (every dtype when unknown), the
    chunked-context gathers' byte copy and the fp8 dequantization of the KV cache's dtype
    (vLLM's ``cache_dtype``; both fp8 formats when unknown) into the model's dtype, and
    DeepSeek-V4's paged gather."""
    mods = []
    if activation.GATHER in ops:
        mods += gather_kernels.MODULES.values()
    if activation.QUANT in ops:
        want = TYPE_NAMES.get(dtype)
        mods += [m for (dt, *_), m in quant_kernels.MODULES.items() if want in (None, dt)]
    if activation.MLA_WRITE in ops:
        want = MLA_TYPE_NAMES.get(dtype)
        mods += [m for dt, m in mla_kernels.DS_MODULES.items() if want in (None, dt)]
        mods += [m for dt, m in mla_kernels.PLAIN_MODULES.items() if want in (None, dt)]
    if activation.MLA_GATHER in ops:
        mods.append(mla_kernels.GATHER_MODULE)
    # The chunked gathers: each conversion's widest module (the one aligned tensors, as vLLM's, take).
    convs = []
    if activation.CP_GATHER in ops or activation.DEQUANT_GATHER in ops:
        convs.append("copy")  # cp_gather_cache; the "auto" dequantizing gather
    if activation.DEQUANT_GATHER in ops:  # fp8 caches only
        formats = ("e4m3", "e5m2") if cache_dtype is None else (GATHER_KV_CACHE_DTYPES.get(cache_dtype),)
        want = TYPE_NAMES.get(dtype)
        convs += [c for c in cache_gather_kernels.CONVERSIONS
                  if c != "copy" and c.split("_")[0] in formats and want in (None, c.split("_")[1])]
    mods += [cache_gather_kernels.MODULES[c, cache_gather_kernels.widest(c)] for c in convs]
    if activation.DSV4_GATHER in ops:
        mods.append(dsv4_kernels.PAGED_MODULE)
    return tuple(mods)


def install(ops, logger) -> None:
    """Wrap vLLM's ``WorkerWrapperBase.init_device`` now, or when its module is imported."""
    with _lock:
        _state["ops"], _state["logger"] = tuple(ops), logger
        module = sys.modules.get(MODULE)
        if module is None and not any(isinstance(f, _ImportHook) for f in sys.meta_path):
            sys.meta_path.insert(0, _ImportHook())
            _state["status"] = f"waiting for {MODULE}"
    if module is not None:
        _wrap(module)


def _wrap(module) -> None:
    cls = getattr(module, CLASS, None)
    original = getattr(cls, "init_device", None)
    if original is None:
        _state["status"] = f"not hooked: {MODULE}.{CLASS}.init_device not found (kernels load at first call)"
        _state["logger"]().warning("nvrtc_gather: %s", _state["status"])
        return
    if getattr(original, _TAG, False):
        return

    @functools.wraps(original)
    def init_device(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        preload_worker(getattr(self, "worker", None))
        return result

    setattr(init_device, _TAG, True)
    cls.init_device = init_device
    _state["status"] = "hooked"


def _device_of(worker) -> int | None:
    device = getattr(worker, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        return device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def preload_worker(worker) -> None:
    """Load the replaced ops' kernels on ``worker``'s CUDA device (vLLM's ``Worker.device``,
    else the current device); only that one."""
    if torch.version.hip is not None:
        _state["status"] = "not loaded: a ROCm build of torch"
        return
    device = _device_of(worker)
    if device is None:
        _state["status"] = "not loaded: this worker has no CUDA device"
        return
    dtype = getattr(getattr(worker, "model_config", None), "dtype", None)
    cache_dtype = getattr(getattr(worker, "cache_config", None), "cache_dtype", None)
    modules = modules_for(_state["ops"], dtype, cache_dtype if isinstance(cache_dtype, str) else None)
    start = time.perf_counter()
    runtime.preload(device, modules=modules)
    ms = (time.perf_counter() - start) * 1e3
    _state["status"] = f"loaded on cuda:{device} ({len(modules)} modules, {ms:.0f} ms)"
    _state["logger"]().info("nvrtc_gather: kernels of %s loaded on cuda:%d before serving (%d modules, %.0f ms)",
                            ", ".join(_state["ops"]), device, len(modules), ms)


class _ImportHook(AfterImport):
    """Wraps the class right after vLLM's worker module is first executed."""

    def __init__(self):
        super().__init__((MODULE,))

    def after(self, name, module) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        _wrap(module)
