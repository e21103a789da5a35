"""vLLM's DeepSeek-V4 prefill gather, ``dequantize_and_gather_k_cache``, routed to nvrtc_gather's.

vLLM calls it as a Python function, not through ``torch.ops``, so it is replaced where vLLM keeps
it (``HOMES``, newest first; read in the wheels: the function in 0.33.0 and 0.21.0, the file
lists of 0.19.0-0.34.0):
- 0.22 .. 0.34: ``vllm.models.deepseek_v4.common.ops`` (defined in its ``cache_utils``;
  ``(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, use_fnuz=False)``),
  bound by ``from vllm.models.deepseek_v4.common.ops import dequantize_and_gather_k_cache`` in
  ``.nvidia.flashmla``, ``.amd.rocm`` and (from 0.25) ``.xpu.xpu_sparse``;
- 0.20, 0.21: ``vllm.v1.attention.ops.deepseek_v4_ops`` (same arguments without ``use_fnuz``),
  bound in ``vllm.model_executor.layers.deepseek_v4_attention``;
- 0.19 and older: no DeepSeek-V4; nothing is done.

Nothing is imported here: importing the home is not cheap. ``vllm.models.deepseek_v4``'s own
``__init__`` resolves vLLM's platform and imports the whole model (fused MoE, distributed, the
attention backends, which import the function themselves); 0.21's package imports its Triton
kernels. The home is found on disk; if it is already imported it is patched at once (with every
module in ``sys.modules`` that holds vLLM's function), else an import hook patches it right
after it executes, before the ``from ... import`` that imported it reads the name, so vLLM's
backends bind ours. Both the home and its ``cache_utils`` are patched.

The replacement (:func:`wrapper`) serves calls on CUDA tensors (and CPU tensors, where vLLM's
Triton and CuTe kernels cannot run and ours give their bytes) with ``use_fnuz`` false, a uint8
``k_cache`` ``[..., 584]``, a bf16 ``out`` and int32 index tensors; every other call goes to
vLLM's own function, kept, and the reason is logged once and kept in :func:`status`."""
from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import threading
from typing import NamedTuple

import torch

from ..ops import dsv4_gather
from .import_hook import AfterImport

NAME = "dequantize_and_gather_k_cache"
RECORD_BYTES = 584  # DeepSeek-V4's MLA record: 448 fp8 + 64 bf16 + 8 scale bytes


class Home(NamedTuple):
    package: str       # where vLLM's backends import the function from
    defining: str      # the module that defines it
    releases: str


HOMES = (Home("vllm.models.deepseek_v4.common.ops", "vllm.models.deepseek_v4.common.ops.cache_utils", "0.22-0.34"),
         Home("vllm.v1.attention.ops.deepseek_v4_ops", "vllm.v1.attention.ops.deepseek_v4_ops.cache_utils",
              "0.20-0.21"))
# Paths (under vllm/) that only a vLLM with DeepSeek-V4 has: one without a known home is a layout
# we do not know, left alone with a warning.
V4_MARKERS = ("models/deepseek_v4", "v1/attention/ops/deepseek_v4_ops", "model_executor/layers/deepseek_v4_attention.py",
              "model_executor/models/deepseek_v4.py")
_TAG = "_nvrtc_gather_original"
_UNSET = object()

_lock = threading.RLock()
_state = {"state": "not installed", "home": None, "original": None, "wrapper": None, "logger": None,
          "left": {}}


def status() -> dict:
    """``{"state", "home", "modules", "left_to_vllm"}``: state is ``"not installed"``, ``"no
    DeepSeek-V4 in this vLLM"``, ``"waiting for <home>"`` (the import hook is set),
    ``"replaced"``, or ``"left to vLLM: <why>"`` (a layout we do not know); modules: where the
    name is ours now; left_to_vllm: ``{reason: first call}`` for calls sent to vLLM's function."""
    with _lock:
        wrapper = _state["wrapper"]
        modules = sorted(n for n, m in list(sys.modules.items())
                         if wrapper is not None and getattr(m, "__dict__", {}).get(NAME) is wrapper)
        return {"state": _state["state"], "home": _state["home"], "modules": modules,
                "left_to_vllm": dict(_state["left"])}


def installed() -> bool:
    """Whether vLLM's function is, or will be when vLLM imports it, ours."""
    return _state["state"] == "replaced" or _state["state"].startswith("waiting")


def _vllm_dirs() -> list[str]:
    """vLLM's package directories, found without importing anything below ``vllm``."""
    module = sys.modules.get("vllm")
    paths = getattr(module, "__path__", None) if module is not None else None
    if paths is None and module is None:
        try:
            spec = importlib.util.find_spec("vllm")
        except (ImportError, ValueError):
            spec = None
        paths = spec.submodule_search_locations if spec is not None else None
    return list(paths or ())


def _on_disk(dirs, rel: str) -> bool:
    return any(os.path.exists(os.path.join(d, *rel.split("/"))) for d in dirs)


def install(logger) -> str:
    """Replace vLLM's function in the home this vLLM has (now, or when vLLM imports it); returns
    the state (see :func:`status`). Idempotent."""
    with _lock:
        _state["logger"] = logger
        if installed():
            return _state["state"]
        dirs = _vllm_dirs()
        home = next((h for h in HOMES if _on_disk(dirs, h.package.split(".", 1)[1].replace(".", "/") + "/__init__.py")),
                    None)
        if home is None:
            if any(_on_disk(dirs, m) for m in V4_MARKERS):
                _leave_layout(f"this vLLM has DeepSeek-V4 files but none of {', '.join(h.package for h in HOMES)}")
            else:
                _state["state"] = "no DeepSeek-V4 in this vLLM"
            return _state["state"]
        _state["home"] = home.package
        if home.package in sys.modules:
            _patch_loaded(home)
        else:
            _state["state"] = f"waiting for {home.package}"
            if not any(isinstance(f, _ImportHook) for f in sys.meta_path):
                sys.meta_path.insert(0, _ImportHook(home))
        return _state["state"]


def unregister() -> None:
    """Give vLLM its own function back wherever it is ours, and drop the import hook."""
    with _lock:
        for finder in [f for f in sys.meta_path if isinstance(f, _ImportHook)]:
            sys.meta_path.remove(finder)
        _restore()
        _state.update(state="not installed", home=None, original=None, wrapper=None, left={})


def _restore() -> None:
    """vLLM's function back in every module where the name is ours."""
    wrapper, original = _state["wrapper"], _state["original"]
    if wrapper is not None:
        for module in list(sys.modules.values()):
            for attr, value in list(getattr(module, "__dict__", {}).items()):
                if value is wrapper:
                    setattr(module, attr, original)


def _leave_layout(why: str) -> None:
    _state["state"] = f"left to vLLM: {why}"
    _state["logger"]().warning("nvrtc_gather: vLLM's %s left to vLLM: %s", NAME, why)


def _patch_loaded(home: Home) -> None:
    """Replace the function in ``home`` (imported) and in every imported module bound to it."""
    package = sys.modules[home.package]
    original = package.__dict__.get(NAME)
    if not callable(original):
        _restore()  # its cache_utils may have had it: vLLM's own everywhere
        _leave_layout(f"{home.package} has no {NAME} (a layout nvrtc_gather does not know)")
        return
    if _state["wrapper"] is None:
        original = getattr(original, _TAG, original)
        _state["original"], _state["wrapper"] = original, wrapper(original)
    for module in list(sys.modules.values()):  # the home, its cache_utils, the backends already imported
        if getattr(module, "__dict__", {}).get(NAME) is _state["original"]:
            setattr(module, NAME, _state["wrapper"])
    _state["state"] = "replaced"


def _patch_defining(module) -> None:
    """The defining module right after it executed: the home's own ``from .cache_utils import``
    then binds ours."""
    original = module.__dict__.get(NAME)
    if callable(original) and _state["wrapper"] is None:
        _state["original"], _state["wrapper"] = original, wrapper(original)
    if original is _state["original"] and original is not None:
        setattr(module, NAME, _state["wrapper"])


def wrapper(original):
    """vLLM's ``dequantize_and_gather_k_cache`` with the calls we serve sent to nvrtc_gather's."""

    @functools.wraps(original)
    def dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset,
                                      use_fnuz=_UNSET):
        why = _unserved(out, k_cache, seq_lens, gather_lens, block_table, use_fnuz)
        if why is None:
            return dsv4_gather.dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table,
                                                             block_size, offset)
        _note(why, k_cache)
        if use_fnuz is _UNSET:  # passed on exactly as given (0.21's function has no use_fnuz)
            return original(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)
        return original(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, use_fnuz=use_fnuz)

    setattr(dequantize_and_gather_k_cache, _TAG, original)
    return dequantize_and_gather_k_cache


def _unserved(out, k_cache, seq_lens, gather_lens, block_table, use_fnuz) -> str | None:
    """Why a call is not ours (None: it is). Metadata only: no sync, no allocation."""
    tensors = (out, k_cache, seq_lens, block_table) + (() if gather_lens is None else (gather_lens,))
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "an argument that is not a tensor"
    if use_fnuz is not _UNSET and use_fnuz:
        return "use_fnuz=True (ROCm's fnuz fp8)"
    if k_cache.device.type not in ("cuda", "cpu"):
        return f"{k_cache.device.type} tensors"
    if k_cache.dtype != torch.uint8 or k_cache.dim() != 3 or k_cache.size(2) != RECORD_BYTES:
        return f"k_cache other than uint8 [num_blocks, block_size, {RECORD_BYTES}]"
    if out.dtype != torch.bfloat16:
        return f"out of dtype {out.dtype}"
    if any(t.dtype != torch.int32 for t in tensors[2:]):
        return "index tensors other than int32"
    return None


def _note(why: str, k_cache) -> None:
    if why in _state["left"]:
        return
    with _lock:
        if why in _state["left"]:
            return
        _state["left"][why] = f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} on {k_cache.device}" \
            if isinstance(k_cache, torch.Tensor) else repr(type(k_cache))
    get_logger = _state["logger"] or (lambda: logging.getLogger(__name__))
    get_logger().info("nvrtc_gather: a call of vLLM's %s with %s goes to vLLM's own function", NAME, why)


class _ImportHook(AfterImport):
    """Patches the home's defining module and the home right after each is first executed."""

    def __init__(self, home: Home):
        super().__init__((home.package, home.defining))
        self.home = home

    def after(self, name, module) -> None:
        with _lock:
            if self not in sys.meta_path:  # unregistered meanwhile
                return
            if name == self.home.defining:
                _patch_defining(module)
                return
            sys.meta_path.remove(self)
            _patch_loaded(self.home)
