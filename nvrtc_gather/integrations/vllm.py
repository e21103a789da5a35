"""Route vLLM's indexer-cache ops to nvrtc_gather's kernels.

``register()`` overrides the CUDA kernels of ``torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache``
and ``torch.ops._C_cache_ops.indexer_k_quant_and_cache`` (vLLM's schemas, registered in its
``csrc/torch_bindings.cpp``) with nvrtc_gather's, through a ``torch.library`` FRAGMENT. Where
vLLM's library is not loaded, it defines those schemas itself (with CPU kernels too and fake
implementations), so the override also works, and is tested, without vLLM. Idempotent.

As a vLLM plugin: the package declares a ``vllm.general_plugins`` entry point named
``nvrtc_gather``; it is opt-in: it registers only when ``VLLM_PLUGINS`` names it
(``VLLM_PLUGINS=nvrtc_gather``), since vLLM loads every installed plugin when the variable is unset.

``scale_fmt`` (vLLM's schema calls it ``kv_cache_dtype``) means exactly what it means to vLLM's
kernel: ``"ue8m0"`` gives power-of-two scales, any other string plain fp32 scales."""
from __future__ import annotations

import importlib.util
import logging
import os
import threading
import warnings

import torch

from .. import cp_gather_indexer_k_quant_cache, indexer_k_quant_and_cache

NAMESPACE = "_C_cache_ops"
PLUGIN_NAME = "nvrtc_gather"
# vLLM's schemas, verbatim.
SCHEMAS = {
    "cp_gather_indexer_k_quant_cache": "cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor! dst_k, "
                                       "Tensor! dst_scale, Tensor block_table, Tensor cu_seq_lens) -> ()",
    "indexer_k_quant_and_cache": "indexer_k_quant_and_cache(Tensor k, Tensor! kv_cache, Tensor slot_mapping, "
                                 "int quant_block_size, str kv_cache_dtype) -> ()",
}

log = logging.getLogger(__name__)
_lock = threading.Lock()
_library: torch.library.Library | None = None  # kept alive: dropping it would undo the registrations


def _quant(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype) -> None:
    # vLLM's kernel: use_ue8m0 = scale_fmt == "ue8m0"; every other value is plain fp32 scales.
    indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size,
                              "ue8m0" if kv_cache_dtype == "ue8m0" else None)


def _fake(*args) -> None:
    return None


def _has_schema(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::{name}", "")
        return True
    except RuntimeError:
        return False


def _load_vllm_library() -> None:
    """Import vLLM's compiled ops when vLLM is installed, so that its schemas (not ours) are
    the ones defined; without vLLM, nothing happens."""
    if importlib.util.find_spec("vllm") is None:
        return
    try:
        importlib.import_module("vllm._custom_ops")
    except Exception as exc:  # a vLLM that cannot load here: fall back to our own schemas
        log.warning("nvrtc_gather: vLLM is installed but its ops could not be loaded (%s); "
                    "defining the %s schemas here", exc, NAMESPACE)


def register() -> None:
    """Make ``torch.ops._C_cache_ops.{cp_gather_indexer_k_quant_cache, indexer_k_quant_and_cache}``
    run nvrtc_gather's kernels on CUDA tensors. Safe to call any number of times."""
    global _library
    with _lock:
        if _library is not None:
            return
        if not all(_has_schema(n) for n in SCHEMAS):
            _load_vllm_library()
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        own = [name for name in SCHEMAS if not _has_schema(name)]
        for name in own:
            lib.define(SCHEMAS[name])
        impls = {"cp_gather_indexer_k_quant_cache": cp_gather_indexer_k_quant_cache,  # the same arguments
                 "indexer_k_quant_and_cache": _quant}
        for name, fn in impls.items():
            with warnings.catch_warnings():  # torch warns on every override; the log line below says it once
                warnings.filterwarnings("ignore", "Overriding a previously registered kernel")
                lib.impl(name, fn, "CUDA")
            if name in own:  # our own schema: give it the CPU path and a fake too (vLLM's keep theirs)
                lib.impl(name, fn, "CPU")
                torch.library.register_fake(f"{NAMESPACE}::{name}", _fake, lib=lib)
        _library = lib
        log.info("nvrtc_gather: torch.ops.%s.{%s} now run nvrtc_gather's kernels on CUDA tensors (%s)",
                 NAMESPACE, ", ".join(SCHEMAS),
                 "schemas defined here: vLLM's library is not loaded" if own else "overriding vLLM's kernels")


def plugin() -> None:
    """The ``vllm.general_plugins`` entry point: registers only when ``VLLM_PLUGINS`` names
    ``nvrtc_gather`` (opt-in), since vLLM runs every installed plugin when it is unset."""
    selected = [p.strip() for p in os.environ.get("VLLM_PLUGINS", "").split(",")]
    if PLUGIN_NAME in selected:
        register()
    else:
        log.debug("nvrtc_gather: vLLM plugin installed but not enabled (set VLLM_PLUGINS=%s)", PLUGIN_NAME)
