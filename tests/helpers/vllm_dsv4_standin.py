"""A stand-in vLLM package tree on disk for DeepSeek-V4's ``dequantize_and_gather_k_cache``
(integrations/vllm_dsv4.py), in each layout vLLM's wheels have (docs/dsv4_engines.md §4), and a case
with its reference bytes. Used by tests/integrations/test_vllm_dsv4.py (CPU) and
tests/gpu/test_vllm_dsv4_gpu.py.

The tree's import order is vLLM 0.33's: importing ``vllm.models.deepseek_v4`` imports its
backends, which bind the function with ``from vllm.models.deepseek_v4.common.ops import
dequantize_and_gather_k_cache`` while ``common.ops`` is first imported. vLLM's function is a
recorder: it appends ``[backend-visible arguments]`` to ``CALLS`` in its ``cache_utils`` and
writes nothing, so a call that reaches it is seen, and one that we serve must not reach it.
Each backend has ``call(*args, **kwargs)`` calling the function through its own module
global, as vLLM's backends do."""
import os
import textwrap

_RECORDER = """
    CALLS = []


    def dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset{fnuz}):
        CALLS.append({{"k_cache": str(k_cache.device), "out": str(out.dtype), "block_size": block_size,
                      "offset": offset{fnuz_rec}}})
"""
_IMPORTER = """
    from {home} import dequantize_and_gather_k_cache


    def call(*args, **kwargs):
        return dequantize_and_gather_k_cache(*args, **kwargs)
"""
NEW_HOME, OLD_HOME = "vllm.models.deepseek_v4.common.ops", "vllm.v1.attention.ops.deepseek_v4_ops"
NEW_IMPORTERS = ("vllm.models.deepseek_v4.nvidia.flashmla", "vllm.models.deepseek_v4.amd.rocm",
                 "vllm.models.deepseek_v4.xpu.xpu_sparse")
OLD_IMPORTERS = ("vllm.model_executor.layers.deepseek_v4_attention",)


def _write(root: str, module: str, text: str = "", package: bool = False) -> None:
    parts = module.split(".")
    for i in range(1, len(parts) + (1 if package else 0)):  # every parent package
        d = os.path.join(root, *parts[:i])
        os.makedirs(d, exist_ok=True)
        init = os.path.join(d, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()
    path = os.path.join(root, *parts, "__init__.py") if package else os.path.join(root, *parts) + ".py"
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def build(root: str, layout: str) -> str:
    """Write a ``vllm`` package of ``layout`` under ``root`` and return ``root``:
    ``"0.33"`` (0.22-0.34: the home ``vllm.models.deepseek_v4.common.ops``, use_fnuz),
    ``"0.21"`` (0.20-0.21: ``vllm.v1.attention.ops.deepseek_v4_ops``, no use_fnuz),
    ``"0.19"`` (no DeepSeek-V4), ``"renamed"`` (the 0.33 home without the function) and
    ``"moved"`` (DeepSeek-V4 files, no known home)."""
    _write(root, "vllm", "", package=True)
    if layout in ("0.33", "renamed"):
        fnuz = dict(fnuz=", use_fnuz=False", fnuz_rec=', "use_fnuz": use_fnuz')
        _write(root, NEW_HOME + ".cache_utils", _RECORDER.format(**fnuz))
        name = "dequantize_and_gather_k_cache" if layout == "0.33" else "dequantize_and_gather_k_cache as dequant_v2"
        _write(root, NEW_HOME, f"from .cache_utils import CALLS, {name}\n", package=True)
        if layout == "0.33":
            for module in NEW_IMPORTERS:
                _write(root, module, _IMPORTER.format(home=NEW_HOME))
        # the package's own __init__ imports the model, hence the NVIDIA backend, first
        _write(root, "vllm.models.deepseek_v4", "from .nvidia import flashmla  # noqa: F401\n"
               if layout == "0.33" else "", package=True)
    elif layout == "0.21":
        _write(root, OLD_HOME + ".cache_utils", _RECORDER.format(fnuz="", fnuz_rec=""))
        _write(root, OLD_HOME, "from .cache_utils import CALLS, dequantize_and_gather_k_cache\n", package=True)
        _write(root, OLD_IMPORTERS[0], _IMPORTER.format(home=OLD_HOME))
    elif layout == "moved":
        _write(root, "vllm.models.deepseek_v4.attention", "")
    elif layout != "0.19":
        raise ValueError(f"layout: unknown {layout!r}")
    return root


# A request batch as vLLM's prefill passes it, with its reference rows; `out` poisoned so
# untouched rows are checked too. Runs in the snippet's interpreter.
CASE = """
    import torch
    from helpers import dsv4_reference as ref

    def case(device, bs=16, seq=(40, 0, 77, 5), with_gather_lens=True, offset=3, seed=5):
        nb = sum(-(-s // bs) for s in seq) + 2
        k_cache = ref.vllm_view(ref.build_cache("v4", nb, bs, seed=seed), bs)
        bt = ref.random_requests(nb, bs, list(seq), seed=seed)
        sl = torch.tensor(seq, dtype=torch.int32)
        gl = torch.tensor([max(0, s - 7) for s in seq], dtype=torch.int32) if with_gather_lens else None
        out = torch.empty(len(seq), offset + max(seq) + 2, 512, dtype=torch.bfloat16)
        out.view(torch.uint8).fill_(0xA5)
        want = out.clone()
        ref.dequantize_and_gather_k_cache(want, k_cache, sl, gl, bt, bs, offset)
        args = [t.to(device) if t is not None else None for t in (out, k_cache, sl, gl, bt)] + [bs, offset]
        if device != "cpu":  # keep the padded block stride on the device too
            args[1] = ref.vllm_view(ref.build_cache("v4", nb, bs, seed=seed).to(device), bs)
        return args, want
"""
