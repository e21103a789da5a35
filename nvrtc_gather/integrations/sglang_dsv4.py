"""SGLang's DeepSeek-V4 record gathers routed to nvrtc_gather (sglang.py's register() calls
:func:`install` for the ops ``dsv4_bf16`` and ``dsv4_fp8``).

SGLang 0.5.23 defines ``dequantize_k_cache_paged_dsv4`` and ``gather_dequant_requant_fp8_paged_dsv4``
in ``sglang.kernels.ops.attention.dsv4.dequant_k_cache`` (Triton); 0.5.16-0.5.22 define the same
functions there as ``dequantize_k_cache_paged`` (0.5.16 on) and ``gather_dequant_requant_fp8_paged``
(0.5.19 on), and 0.5.13-0.5.15 define ``dequantize_k_cache_paged`` in
``sglang.srt.layers.attention.dsv4.dequant_k_cache``: the same arguments (``layout=`` from 0.5.21)
and output bits throughout (MODULES, NAMES; read in each release's wheel). Its V4 attention
backends bind them by ``from ... import``
(``sglang.srt.layers.attention.deepseek_v4_backend``; the bf16 one also
``deepseek_v4_backend_hip_radix``). So the defining module's attributes are replaced (a backend
imported later binds ours) and so is every already-imported ``sglang`` module attribute holding
SGLang's function. The replacement serves the V4 layout and, in the bf16 function, the V4.1
layouts (``layout=`` V41, V41_NEW, V41_FP4, V41_FP4_NEW; SGLang's own kernel for those refuses
GPUs below SM100) on CUDA (a pool buffer of 1-byte elements, ids int32/int64, bf16 or fp8
e4m3fn outputs) and gives every other call, other layouts and ROCm included, to SGLang's own
function, saying why once."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys

import torch

from ..ops import dsv4_gather

MODULES = ("sglang.kernels.ops.attention.dsv4.dequant_k_cache",  # 0.5.16 on
           "sglang.srt.layers.attention.dsv4.dequant_k_cache")  # 0.5.13-0.5.15
# op -> SGLang's names for its function, newest first (0.5.23's, then 0.5.13-0.5.22's). The
# unsuffixed names also exist in the dsa modules (DeepSeek-V3.2's layout): only attributes holding
# the V4 module's own function object are replaced.
NAMES = {"dsv4_bf16": ("dequantize_k_cache_paged_dsv4", "dequantize_k_cache_paged"),
         "dsv4_fp8": ("gather_dequant_requant_fp8_paged_dsv4", "gather_dequant_requant_fp8_paged")}
FUNCTIONS = {op: names[0] for op, names in NAMES.items()}  # the op's name in status() where none is found
_TAG = "_nvrtc_gather_original"
_BYTES = (torch.uint8, torch.float8_e4m3fn)
_ROCM = torch.version.hip is not None
_SERVED_DEVICE = "cuda"  # the device type whose calls we take (the CPU tests' fake driver stands CPU in)


def defining() -> str | None:
    """The module this SGLang keeps the V4 gathers in (found without importing it), or None."""
    for name in MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except (ImportError, ValueError):  # a parent package missing: not in this release
            continue
    return None


def present() -> bool:
    """Whether this SGLang has DeepSeek-V4's gathers."""
    return defining() is not None


def install(op: str, leave) -> tuple[str, str] | None:
    """Replace the function of ``op`` where SGLang keeps it (``defining()``); (the name it has in
    this release, that module), or None (said through ``leave(method, reason, detail)``) where this SGLang has none or its module
    fails to import."""
    name, where = FUNCTIONS[op], defining()
    if where is None:
        return None  # a release without DeepSeek-V4: nothing to replace, nothing to say
    try:
        module = importlib.import_module(where)
    except Exception as e:  # noqa: BLE001  no V4 in this release, or a dependency missing: SGLang's own
        leave(name, "absent" if isinstance(e, ImportError) else "import",
              f"{where} does not import here ({type(e).__name__}: {e})")
        return None
    name = next((n for n in NAMES[op] if callable(getattr(module, n, None))), None)
    if name is None:
        leave(FUNCTIONS[op], "absent", f"{where} has none of {', '.join(NAMES[op])}")
        return None
    original = getattr(module, name)
    original = getattr(original, _TAG, original)
    ours = getattr(module, name) if hasattr(getattr(module, name), _TAG) else _wrap(name, original, leave)
    for mod in [module] + [m for k, m in list(sys.modules.items()) if k.startswith("sglang.") and m is not module]:
        if getattr(mod, name, None) is original:
            setattr(mod, name, ours)
    return name, where


def uninstall() -> None:
    """SGLang's own functions back, in every sglang module holding ours."""
    for key, mod in list(sys.modules.items()):
        if not key.startswith("sglang."):
            continue
        for name in (n for names in NAMES.values() for n in names):
            f = getattr(mod, name, None)
            if f is not None and hasattr(f, _TAG):
                setattr(mod, name, getattr(f, _TAG))


def _unserved(cache, ids, out, fp8: bool, layout) -> tuple[str, str] | None:
    try:
        dsv4_gather.layout_name(layout, fp8)
    except (TypeError, ValueError):
        return "layout", f"the {getattr(layout, 'name', layout)} layout"
    if _ROCM:
        return "ROCm", f"torch {torch.__version__} is a ROCm build"
    if not isinstance(cache, torch.Tensor) or cache.dtype not in _BYTES or cache.device.type != _SERVED_DEVICE:
        return "cache", f"a {getattr(cache, 'dtype', type(cache).__name__)} cache on " \
                        f"{getattr(getattr(cache, 'device', None), 'type', '?')} (we serve 1-byte CUDA buffers)"
    if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
        return "ids", f"page_table_1_flattened of {getattr(ids, 'dtype', type(ids).__name__)}"
    if out is not None and getattr(out, "dtype", None) != (torch.float8_e4m3fn if fp8 else torch.bfloat16):
        return "out dtype", f"out of {getattr(out, 'dtype', type(out).__name__)}"
    return None


def _wrap(name: str, original, leave):
    fp8 = name in NAMES["dsv4_fp8"]

    @functools.wraps(original)
    def gather(quant_k_cache, page_table_1_flattened, page_size, *args, **kwargs):
        try:
            if fp8:
                extra_rows, out, layout = _fp8_args(*args, **kwargs)
            else:
                out, layout = _bf16_args(*args, **kwargs)
                extra_rows = 0
        except TypeError:
            leave(name, "call", "a call with other arguments")
            return original(quant_k_cache, page_table_1_flattened, page_size, *args, **kwargs)
        # A remembered layout passed every check _unserved makes: skip them. Not while torch.compile
        # traces (gather_flat records the op there; a fake tensor has no data pointer to launch on).
        if out is None and not _ROCM and not dsv4_gather._is_compiling():
            got = dsv4_gather._flat_remembered(quant_k_cache, page_table_1_flattened, page_size, extra_rows, fp8,
                                               layout)
            if got is not None:
                return got
        why = _unserved(quant_k_cache, page_table_1_flattened, out, fp8, layout)
        if why is not None:
            leave(name, *why)
            return original(quant_k_cache, page_table_1_flattened, page_size, *args, **kwargs)
        return dsv4_gather.gather_flat(quant_k_cache, page_table_1_flattened, page_size, out, extra_rows, fp8, layout)

    setattr(gather, _TAG, original)
    return gather


def _bf16_args(out=None, layout="v4"):
    """dequantize_k_cache_paged_dsv4's arguments after the first three (``layout`` from 0.5.21)."""
    return out, layout


def _fp8_args(extra_rows=0, out=None):
    """gather_dequant_requant_fp8_paged_dsv4's arguments after the first three (0.5.19-0.5.23)."""
    return extra_rows, out, "v4"
