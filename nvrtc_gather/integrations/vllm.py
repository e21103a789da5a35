"""Route vLLM's MLA and DeepSeek-V3.2 cache ops to nvrtc_gather's kernels.

``register()`` overrides the CUDA kernels of ``torch.ops._C_cache_ops.<op>`` for the indexer's
``cp_gather_indexer_k_quant_cache`` and ``indexer_k_quant_and_cache``, the MLA cache's
``concat_and_cache_mla`` and ``cp_gather_and_upconvert_fp8_kv_cache``, and the chunked-context
gathers every MLA model runs, ``cp_gather_cache`` and ``gather_and_maybe_dequant_cache`` (vLLM's
schemas, registered by its compiled library; ``vllm/_custom_ops.py`` calls them through
``torch.ops``) with nvrtc_gather's, through a ``torch.library`` FRAGMENT. Where vLLM's library is
not loaded, it defines those schemas itself (vLLM 0.33's, with CPU kernels and fake
implementations too), so the override also works, and is tested, without vLLM. Idempotent.

The ops follow the schema of the vLLM that is loaded: ``skip_scale`` is honoured where the
schema has it; calls we do not serve (the MLA gather's host-offload arguments ``host_cache`` /
``host_row_ids`` / ``device_row_ids``; a ``kv_cache_dtype`` outside ours: ``"fp8_e5m2"`` for the
MLA write; for the dequantizing gather, a string outside vLLM's own list, which vLLM's kernel
refuses too) go to vLLM's own kernel, fetched before the override
(``torch.library.get_kernel``); an op whose schema we cannot serve at all (vLLM's oldest MLA
gather, with ``seq_lens``; an older dequantizing gather with ``batch_size`` where 0.33 has
``token_to_seq``) is left to vLLM, and the log says why.

DeepSeek-V4's prefill gather, ``dequantize_and_gather_k_cache``, is a Python function in vLLM
(0.20 and later), not a ``torch.ops`` op: integrations/vllm_dsv4.py replaces it where the loaded
vLLM keeps it.

As a vLLM plugin: the package declares the ``vllm.general_plugins`` entry point ``nvrtc_gather``
(:func:`plugin`). vLLM calls it in every process (``vllm/plugins/__init__.py:
load_general_plugins``) when ``VLLM_PLUGINS`` is unset or names it; it replaces all seven unless
``NVRTC_GATHER_VLLM=0`` (integrations/activation.py), and loads the kernels on each worker's GPU
when the worker has set its device (integrations/vllm_worker.py). Its INFO line naming the ops
appears once in each process's vLLM log, forked ones included (integrations/vllm_log.py).

``kv_cache_dtype`` (our ops call it ``scale_fmt``) means what it means to vLLM's kernel:
``"ue8m0"`` gives power-of-two fp32 scales, ``"mxfp8"`` power-of-two scales stored as four UE8M0
bytes (integrations/mx_scales.py), any other string plain fp32 scales."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import sys
import threading
import warnings

import torch

from .. import concat_and_cache_mla, cp_gather_and_upconvert_fp8_kv_cache, cp_gather_cache, \
    cp_gather_indexer_k_quant_cache, gather_and_maybe_dequant_cache, indexer_k_quant_and_cache
from ..ops.cache_gather import KV_CACHE_DTYPES as GATHER_KV_CACHE_DTYPES, cp_gather_cache_fake, \
    gather_and_maybe_dequant_cache_fake
from ..ops.gather import gather_fake
from ..ops.indexer_k_quant import quant_fake
from ..ops.mla_gather import gather_fake as mla_gather_fake
from ..ops.mla_write import FORMATS as MLA_FORMATS, write_fake as mla_write_fake
from . import activation, mx_scales, vllm_dsv4, vllm_log, vllm_worker

NAMESPACE = "_C_cache_ops"
PLUGIN_NAME = "nvrtc_gather"
# vLLM's schemas, verbatim (tests/integrations/test_vllm_real.py compares them with the strings
# in vLLM's compiled library).
SCHEMAS = {
    "cp_gather_indexer_k_quant_cache": "cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor! dst_k, "
                                       "Tensor! dst_scale, Tensor block_table, Tensor cu_seq_lens) -> ()",
    "indexer_k_quant_and_cache": "indexer_k_quant_and_cache(Tensor k, Tensor! kv_cache, Tensor slot_mapping, "
                                 "int quant_block_size, str kv_cache_dtype) -> ()",
    "concat_and_cache_mla": "concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor! kv_cache, Tensor slot_mapping, "
                            "str kv_cache_dtype, Tensor scale, bool skip_scale=False) -> ()",
    "cp_gather_and_upconvert_fp8_kv_cache": "cp_gather_and_upconvert_fp8_kv_cache(Tensor src_cache, Tensor! dst, "
                                            "Tensor block_table, Tensor workspace_starts, int batch_size, "
                                            "Tensor? seq_starts, Tensor? host_cache=None, Tensor? host_row_ids=None, "
                                            "Tensor? device_row_ids=None) -> ()",
    "cp_gather_cache": "cp_gather_cache(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, "
                       "int batch_size, Tensor? seq_starts) -> ()",
    "gather_and_maybe_dequant_cache": "gather_and_maybe_dequant_cache(Tensor src_cache, Tensor! dst, "
                                      "Tensor block_table, Tensor cu_seq_lens, Tensor token_to_seq, int num_tokens, "
                                      "str kv_cache_dtype, Tensor scale, Tensor? seq_starts) -> ()",
}
# The arguments our implementations take, in order: a loaded schema must name a prefix of them
# (older vLLMs have fewer trailing arguments); anything else is left to vLLM.
_ARGUMENTS = {name: [a.name for a in torch._C.parse_schema(schema).arguments] for name, schema in SCHEMAS.items()}

_lock = threading.Lock()
_libraries: dict[str, torch.library.Library] = {}  # op -> its FRAGMENT, kept alive: dropping it undoes the override
_skipped: dict[str, str] = {}  # op -> why it was left to vLLM
_state = {"schemas": None, "activated_by": None, "disabled_by": None}


@dataclasses.dataclass(frozen=True)
class VllmStatus:
    """What the vLLM adapter did in this process (``dataclasses.asdict`` gives a plain dict).

    registered: whether any of vLLM's ops now runs nvrtc_gather's kernels on CUDA tensors.
    ops: the ops replaced, by vLLM's names (``torch.ops._C_cache_ops.<name>``, and
        ``dequantize_and_gather_k_cache`` once it is, or will be on vLLM's import, ours).
    schemas: ``"vllm"`` (vLLM's compiled library defined them; only its CUDA kernels were
        replaced) or ``"nvrtc_gather"`` (vLLM's library was not loaded: defined here, with CPU
        kernels); None before registering.
    activated_by: ``"plugin"`` (vLLM's plugin loader), ``"register()"`` (a direct call), or None.
    disabled_by: e.g. ``"NVRTC_GATHER_VLLM=off"`` (the value given) when the plugin ran but was
        switched off.
    preload: the worker hook's state (integrations/vllm_worker.py: ``status()``).
    left_to_vllm: ops asked for but left to vLLM, with why (a loaded schema we do not serve).
    dsv4_gather: ``vllm_dsv4.status()``: where vLLM's DeepSeek-V4 gather is ours, and the calls
        sent to vLLM's own function, with why.
    """

    registered: bool
    ops: tuple[str, ...]
    schemas: str | None
    activated_by: str | None
    disabled_by: str | None
    preload: str
    left_to_vllm: dict
    dsv4_gather: dict


def status() -> VllmStatus:
    """The adapter's state in this process: whether vLLM's ops were replaced, which, how."""
    ops = _replaced()
    return VllmStatus(bool(ops), ops, _state["schemas"], _state["activated_by"], _state["disabled_by"],
                      vllm_worker.status(), dict(_skipped), vllm_dsv4.status())


def _replaced() -> tuple[str, ...]:
    return tuple(name for name in SCHEMAS if name in _libraries) + \
        ((activation.DSV4_GATHER,) if vllm_dsv4.installed() else ())


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


def _mla_write(vllm_kernel, keyset, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *skip_scale):
    # ``skip_scale`` where the loaded schema has it (vLLM 0.33), passed on exactly as received
    if kv_cache_dtype not in MLA_FORMATS:  # e.g. "fp8_e5m2": vLLM's own kernel, where there is one
        return _to_vllm(vllm_kernel, keyset, "concat_and_cache_mla", f"kv_cache_dtype={kv_cache_dtype!r}", kv_c, k_pe,
                        kv_cache, slot_mapping, kv_cache_dtype, scale, *skip_scale)
    # the tile scales by vLLM's current rule (its fused Triton writer in 0.33 uses it too)
    concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *skip_scale)


def _mla_gather(vllm_kernel, keyset, src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None,
                host_cache=None, host_row_ids=None, device_row_ids=None):
    if host_cache is not None or host_row_ids is not None or device_row_ids is not None:
        # HiSparse's host-offload form: its semantics are vLLM's kernel's, not ours to guess
        return _to_vllm(vllm_kernel, keyset, "cp_gather_and_upconvert_fp8_kv_cache", "host-offload arguments",
                        src_cache, dst, block_table, workspace_starts, batch_size, seq_starts, host_cache,
                        host_row_ids, device_row_ids)
    cp_gather_and_upconvert_fp8_kv_cache(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)


def _dequant_gather(vllm_kernel, keyset, src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                    kv_cache_dtype, scale, seq_starts=None):
    if kv_cache_dtype not in GATHER_KV_CACHE_DTYPES:  # every string vLLM's kernel accepts is ours: its error
        return _to_vllm(vllm_kernel, keyset, "gather_and_maybe_dequant_cache", f"kv_cache_dtype={kv_cache_dtype!r}",
                        src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype, scale,
                        seq_starts)
    gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                   kv_cache_dtype, scale, seq_starts)


def _to_vllm(vllm_kernel, keyset, name: str, why: str, *args):
    """Run vLLM's own CUDA kernel of ``name`` (fetched before the override) on a call we do not serve."""
    if vllm_kernel is None:
        raise NotImplementedError(f"nvrtc_gather's {name} does not serve calls with {why}, and vLLM's own kernel "
                                  f"is not available here; set {activation.OPS_ENV} to leave this op to vLLM")
    return vllm_kernel.call_boxed(keyset, *args)


def _mla_gather_fake(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts=None, *host):
    mla_gather_fake(src_cache, dst, block_table, workspace_starts, batch_size, seq_starts)


# name -> (implementation, fake, whether it takes vLLM's original kernel and the keyset first)
_IMPLS = {"cp_gather_indexer_k_quant_cache": (cp_gather_indexer_k_quant_cache, gather_fake, False),
          "indexer_k_quant_and_cache": (_quant, quant_fake, False),
          "concat_and_cache_mla": (_mla_write, mla_write_fake, True),
          "cp_gather_and_upconvert_fp8_kv_cache": (_mla_gather, _mla_gather_fake, True),
          "cp_gather_cache": (cp_gather_cache, cp_gather_cache_fake, False),
          "gather_and_maybe_dequant_cache": (_dequant_gather, gather_and_maybe_dequant_cache_fake, True)}


def _has_schema(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::{name}", "")
        return True
    except RuntimeError:
        return False


def _unservable(name: str) -> str | None:
    """Why vLLM's loaded schema of ``name`` cannot be served by our implementation, or None."""
    loaded = [a.name for a in torch._C._get_schema(f"{NAMESPACE}::{name}", "").arguments]
    if loaded != _ARGUMENTS[name][:len(loaded)]:
        return f"vLLM's schema ({', '.join(loaded)}) is not one nvrtc_gather implements"
    return None


def _vllm_kernel(name: str):
    """vLLM's own CUDA kernel of ``name`` (None where torch cannot hand it out, or there is none)."""
    try:
        return torch.library.get_kernel(f"{NAMESPACE}::{name}", "CUDA")
    except (AttributeError, RuntimeError):  # torch < 2.9; no CUDA kernel registered
        return None


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
    ``ops`` names which (``"gather"``, ``"quant"``, ``"mla_write"``, ``"mla_gather"``,
    ``"cp_gather"``, ``"dequant_gather"``, ``"dsv4_gather"`` or their full names, an iterable or a
    comma-separated string; default all). Safe to call any number of times; returns the ops
    replaced in this process so far. Logs one line saying which (and one for ``dsv4_gather``)."""
    if ops is not None and not isinstance(ops, str):
        names = list(ops) if hasattr(ops, "__iter__") else None
        if names is None or not all(isinstance(o, str) for o in names):
            raise TypeError(f"ops: expected op names (a str, or an iterable of str: "
                            f"{', '.join(activation.SHORT_NAMES)}), got {ops!r}")
        ops = names
    wanted = activation.parse_ops(ops if isinstance(ops, str) else ",".join(ops), "ops") if ops is not None \
        else activation.ALL_OPS
    with _lock:
        new = [name for name in wanted if name in SCHEMAS and name not in _libraries and name not in _skipped]
        if new:
            _register(new)
        if activation.DSV4_GATHER in wanted and not vllm_dsv4.installed():
            vllm_dsv4.install(logger)
            if vllm_dsv4.installed():  # once in this process and in each forked one, as _register's line
                vllm_log.announce(logger, logging.INFO, "nvrtc_gather: vLLM's %s (%s, DeepSeek-V4) now runs "
                                  "nvrtc_gather's kernel on CUDA tensors; other calls go to vLLM's own function",
                                  activation.DSV4_GATHER, vllm_dsv4.status()["home"])
        if new or vllm_dsv4.installed():
            _state["activated_by"] = _state["activated_by"] or "register()"
        return _replaced()


def _register(names: list[str]) -> None:
    if not all(_has_schema(n) for n in SCHEMAS):
        _load_vllm_library()
    own, served = [], []
    for name in names:
        fn, fake, takes_original = _IMPLS[name]
        if _has_schema(name):
            why = _unservable(name)
            if why is not None:
                _skipped[name] = why
                logger().warning("nvrtc_gather: %s.%s left to vLLM: %s", NAMESPACE, name, why)
                continue
        lib = torch.library.Library(NAMESPACE, "FRAGMENT")
        if not _has_schema(name):
            lib.define(SCHEMAS[name])
            own.append(name)
        if takes_original:  # the calls we do not serve go to the kernel registered before ours
            fn = functools.partial(fn, None if name in own else _vllm_kernel(name))
        with warnings.catch_warnings():  # torch warns on every override; the log line below says it once
            warnings.filterwarnings("ignore", "Overriding a previously registered kernel")
            lib.impl(name, fn, "CUDA", with_keyset=takes_original)
        if name in own:  # our own schema: give it the CPU path and a fake too (vLLM's keep theirs)
            lib.impl(name, fn, "CPU", with_keyset=takes_original)
            torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
        _libraries[name] = lib
        served.append(name)
    if not served:
        return
    _state["schemas"] = _state["schemas"] or ("nvrtc_gather" if own else "vllm")
    kept = [n for n in SCHEMAS if n not in _libraries]
    # once in this process and in each forked one, where vLLM's log shows it (integrations/vllm_log.py)
    vllm_log.announce(logger, logging.INFO,
                      "nvrtc_gather: torch.ops.%s.{%s} now run nvrtc_gather's kernels on CUDA tensors (%s)%s",
                      NAMESPACE, ", ".join(served),
                      "schemas defined here: vLLM's library is not loaded" if own else "overriding vLLM's kernels",
                      f"; {', '.join(kept)} left to vLLM" if kept else "")


def plugin() -> None:
    """The ``vllm.general_plugins`` entry point. vLLM runs it in every process when
    ``VLLM_PLUGINS`` is unset or names ``nvrtc_gather`` (its own check, exact names, no spaces
    stripped). It replaces the ops of ``NVRTC_GATHER_VLLM_OPS`` (default all seven) unless
    ``NVRTC_GATHER_VLLM`` is off, and hooks the worker's device setup to load their kernels
    on that GPU before serving. A bad value of either variable raises ValueError naming it."""
    off = activation.switched_off_by()
    if off is None and torch.version.hip is not None:
        off = "a ROCm build of torch (NVRTC kernels need an NVIDIA GPU)"
    if off is not None:
        with _lock:
            _state["disabled_by"] = off
        vllm_log.announce(logger, logging.INFO, "nvrtc_gather: vLLM plugin loaded but off (%s); vLLM's own kernels run",
                          off)
        return
    ops = activation.vllm_ops()
    with _lock:
        _state["activated_by"] = _state["activated_by"] or "plugin"
    register(ops)
    vllm_worker.install(tuple(o for o in ops if o != activation.DSV4_GATHER or vllm_dsv4.installed()), logger)
