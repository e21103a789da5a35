"""Route vLLM's indexer-cache ops to nvrtc_gather's kernels.

``register()`` overrides the CUDA kernels of ``torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache``
and ``torch.ops._C_cache_ops.indexer_k_quant_and_cache`` (vLLM's schemas, registered by its
compiled library; ``vllm/_custom_ops.py`` calls them through ``torch.ops``) with nvrtc_gather's,
through a ``torch.library`` FRAGMENT. Where vLLM's library is not loaded, it defines those schemas
itself (with CPU kernels and fake implementations too), so the override also works, and is
tested, without vLLM. Idempotent.

As a vLLM plugin: the package declares the ``vllm.general_plugins`` entry point ``nvrtc_gather``
(:func:`plugin`). vLLM calls it in every process (``vllm/plugins/__init__.py:
load_general_plugins``) when ``VLLM_PLUGINS`` is unset or names it; it replaces both ops unless
``NVRTC_GATHER_VLLM=0`` (integrations/activation.py), and loads the kernels on each worker's GPU
when the worker has set its device (integrations/vllm_worker.py).

``kv_cache_dtype`` (our ops call it ``scale_fmt``) means what it means to vLLM's kernel:
``"ue8m0"`` gives power-of-two fp32 scales, ``"mxfp8"`` power-of-two scales stored as four UE8M0
bytes (integrations/mx_scales.py), any other string plain fp32 scales."""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
import threading
import warnings

import torch

from .. import cp_gather_indexer_k_quant_cache, indexer_k_quant_and_cache
from ..ops.gather import gather_fake
from ..ops.indexer_k_quant import quant_fake
from . import activation, mx_scales, vllm_worker

NAMESPACE = "_C_cache_ops"
PLUGIN_NAME = "nvrtc_gather"
# vLLM's schemas, verbatim (tests/integrations/test_vllm_real.py compares them with the strings
# in vLLM's compiled library).
SCHEMAS = {
    "cp_gather_indexer_k_quant_cache": "cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor! dst_k, "
                                       "Tensor! dst_scale, Tensor block_table, Tensor cu_seq_lens) -> ()",
    "indexer_k_quant_and_cache": "indexer_k_quant_and_cache(Tensor k, Tensor! kv_cache, Tensor slot_mapping, "
                                 "int quant_block_size, str kv_cache_dtype) -> ()",
}
_SHORT = {"cp_gather_indexer_k_quant_cache": "gather", "indexer_k_quant_and_cache": "quant"}

_lock = threading.Lock()
_libraries: dict[str, torch.library.Library] = {}  # op -> its FRAGMENT, kept alive: dropping it undoes the override
_state = {"schemas": None, "activated_by": None, "disabled_by": None}


@dataclasses.dataclass(frozen=True)
class VllmStatus:
    """What the vLLM adapter did in this process (``dataclasses.asdict`` gives a plain dict).

    registered: whether any of vLLM's ops now runs nvrtc_gather's kernels on CUDA tensors.
    ops: the ops replaced, by vLLM's names (``torch.ops._C_cache_ops.<name>``).
    schemas: ``"vllm"`` (vLLM's compiled library defined them; only its CUDA kernels were
        replaced) or ``"nvrtc_gather"`` (vLLM's library was not loaded: defined here, with CPU
        kernels); None before registering.
    activated_by: ``"plugin"`` (vLLM's plugin loader), ``"register()"`` (a direct call), or None.
    disabled_by: e.g. ``"NVRTC_GATHER_VLLM=0"`` when the plugin ran but was switched off.
    preload: the worker hook's state (integrations/vllm_worker.py: ``status()``).
    """

    registered: bool
    ops: tuple[str, ...]
    schemas: str | None
    activated_by: str | None
    disabled_by: str | None
    preload: str


def status() -> VllmStatus:
    """The adapter's state in this process: whether vLLM's ops were replaced, which, how."""
    ops = tuple(name for name in SCHEMAS if name in _libraries)
    return VllmStatus(bool(ops), ops, _state["schemas"], _state["activated_by"], _state["disabled_by"],
                      vllm_worker.status())


def logger() -> logging.Logger:
    """vLLM configures only its ``vllm`` logger (own handler, ``propagate=False``;
    ``vllm/logger.py``), so in a process that runs vLLM the adapter logs as its child
    ``vllm.nvrtc_gather`` and its lines appear in vLLM's log; elsewhere as this module."""
    return logging.getLogger("vllm.nvrtc_gather" if "vllm" in sys.modules else __name__)


def _quant(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype) -> None:
    # vLLM's kernel: "ue8m0" and "mxfp8" are power-of-two scales (mxfp8 stored as UE8M0 bytes);
    # every other value is plain fp32 scales.
    if kv_cache_dtype == "mxfp8":
        mx_scales.check(k, quant_block_size)
        indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, "ue8m0")
        mx_scales.pack_written_scales(kv_cache, slot_mapping)
        return
    indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size,
                              "ue8m0" if kv_cache_dtype == "ue8m0" else None)


_IMPLS = {"cp_gather_indexer_k_quant_cache": (cp_gather_indexer_k_quant_cache, gather_fake),  # the same arguments
          "indexer_k_quant_and_cache": (_quant, quant_fake)}


def _has_schema(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::{name}", "")
        return True
    except RuntimeError:
        return False


def _load_vllm_library() -> None:
    """Import vLLM's compiled ops when vLLM is installed, so that its schemas (not ours) are
    the ones defined; without vLLM, nothing happens."""
    try:
        if importlib.util.find_spec("vllm") is None:
            return
    except ValueError:  # a module named vllm without a spec (built in memory): not vLLM's package
        return
    try:
        importlib.import_module("vllm._custom_ops")
    except Exception as exc:  # a vLLM that cannot load here: fall back to our own schemas
        logger().warning("nvrtc_gather: vLLM is installed but its ops could not be loaded (%s); "
                         "defining the %s schemas here", exc, NAMESPACE)


def register(ops=None) -> tuple[str, ...]:
    """Make vLLM's ``torch.ops._C_cache_ops`` ops run nvrtc_gather's kernels on CUDA tensors:
    ``ops`` names which (``"gather"``, ``"quant"`` or their full names, an iterable or a
    comma-separated string; default both). Safe to call any number of times; returns the ops
    replaced in this process so far. Logs one line saying which."""
    wanted = activation.parse_ops(ops if isinstance(ops, str) else ",".join(ops), "ops") if ops is not None \
        else (activation.GATHER, activation.QUANT)
    with _lock:
        new = [name for name in wanted if name not in _libraries]
        if new:
            _register(new)
            _state["activated_by"] = _state["activated_by"] or "register()"
        return tuple(name for name in SCHEMAS if name in _libraries)


def _register(names: list[str]) -> None:
    if not all(_has_schema(n) for n in SCHEMAS):
        _load_vllm_library()
    own = []
    for name in names:
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        fn, fake = _IMPLS[name]
        if not _has_schema(name):
            lib.define(SCHEMAS[name])
            own.append(name)
        with warnings.catch_warnings():  # torch warns on every override; the log line below says it once
            warnings.filterwarnings("ignore", "Overriding a previously registered kernel")
            lib.impl(name, fn, "CUDA")
        if name in own:  # our own schema: give it the CPU path and a fake too (vLLM's keep theirs)
            lib.impl(name, fn, "CPU")
            torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        _libraries[name] = lib
    _state["schemas"] = _state["schemas"] or ("nvrtc_gather" if own else "vllm")
    kept = [n for n in SCHEMAS if n not in _libraries]
    logger().info("nvrtc_gather: torch.ops.%s.{%s} now run nvrtc_gather's kernels on CUDA tensors (%s)%s",
                  NAMESPACE, ", ".join(names),
                  "schemas defined here: vLLM's library is not loaded" if own else "overriding vLLM's kernels",
                  f"; {', '.join(kept)} left to vLLM" if kept else "")


def plugin() -> None:
    """The ``vllm.general_plugins`` entry point. vLLM runs it in every process when
    ``VLLM_PLUGINS`` is unset or names ``nvrtc_gather`` (its own check, exact names, no spaces
    stripped). It replaces the ops of ``NVRTC_GATHER_VLLM_OPS`` (default both) unless
    ``NVRTC_GATHER_VLLM`` is off, and hooks the worker's device setup to load their kernels
    on that GPU before serving. A bad value of either variable raises ValueError naming it."""
    off = None if activation.vllm_enabled() else f"{activation.ENABLE_ENV}=0"
    if off is None and torch.version.hip is not None:
        off = "a ROCm build of torch (NVRTC kernels need an NVIDIA GPU)"
    if off is not None:
        with _lock:
            _state["disabled_by"] = off
        logger().info("nvrtc_gather: vLLM plugin loaded but off (%s); vLLM's own kernels run", off)
        return
    ops = activation.vllm_ops()
    with _lock:
        _state["activated_by"] = _state["activated_by"] or "plugin"
    register(ops)
    vllm_worker.install(ops, logger)
