"""DeepSeek-V4's ``dequantize_and_gather_k_cache`` replaced in vLLM's own package (vLLM 0.33.0 in
``.venv-vllm``: scripts/setup_vllm_env.sh; skipped without it, as tests/integrations/test_vllm_real.py
is): vLLM's plugin loader runs the plugin, vLLM's own ``common/ops/__init__.py`` and
``cache_utils.py`` then execute, and the name they export is ours, with vLLM's function kept
behind it; a CPU call through it gives the reference bytes (tests/helpers/dsv4_reference.py).

That environment has vLLM without its dependencies, so two modules on the way are stood in for:
``vllm.models.deepseek_v4`` (its ``__init__`` resolves the platform and imports the whole model:
transformers, the fused MoE, ...; a bare package with vLLM's directory stands in) and
``quant_utils`` (``cache_utils`` imports ``get_fp8_min_max`` from it; its package imports
transformers). Every other module imported is vLLM's own. The backends that bind the function
(they need the full dependency set) are read in vLLM's source instead."""
import ast
import os

from helpers.fresh_python import run
from test_vllm_real import PYTHON, vllm_dir  # noqa: F401  (the module-scoped fixture)

HOME = "vllm.models.deepseek_v4.common.ops"
IMPORTERS = ("nvidia/flashmla.py", "amd/rocm.py", "xpu/xpu_sparse.py")


def test_vllms_own_module_exports_ours_and_a_cpu_call_gives_the_reference_bytes(vllm_dir):
    got = run("""
        import inspect, json, os, sys, types, torch
        import vllm.logger, vllm.plugins
        vllm.logger._configure_vllm_root_logger()
        vllm.plugins.load_general_plugins()  # vLLM's own loader runs our plugin
        from nvrtc_gather.integrations import vllm as adapter, vllm_dsv4
        out = {"before": vllm_dsv4.status(), "ops": list(adapter.status().ops)}
        import vllm.models
        bare = types.ModuleType("vllm.models.deepseek_v4")
        bare.__path__ = [os.path.join(os.path.dirname(vllm.models.__file__), "deepseek_v4")]
        sys.modules[bare.__name__] = bare
        quant_utils = types.ModuleType("vllm.model_executor.layers.quantization.utils.quant_utils")
        quant_utils.get_fp8_min_max = lambda *a, **k: (-448.0, 448.0)
        sys.modules[quant_utils.__name__] = quant_utils
        import vllm.models.deepseek_v4.common.ops as home
        from vllm.models.deepseek_v4.common.ops import cache_utils
        fn = home.dequantize_and_gather_k_cache
        ns = {}
        exec("from vllm.models.deepseek_v4.common.ops import dequantize_and_gather_k_cache", ns)  # flashmla's line
        vllms = fn.__wrapped__
        out["ours"] = fn.__code__.co_filename.endswith("vllm_dsv4.py") and ns["dequantize_and_gather_k_cache"] is fn \\
            and cache_utils.dequantize_and_gather_k_cache is fn
        out["kept"] = os.path.realpath(vllms.__code__.co_filename) == os.path.realpath(cache_utils.__file__)
        out["signature"] = [(p.name, None if p.default is p.empty else p.default)
                            for p in inspect.signature(vllms).parameters.values()]
        out["status"] = vllm_dsv4.status()
        from helpers import dsv4_reference as ref
        for bs, seq, gl, offset in ((64, [300, 0, 65, 7], None, 0), (16, [40, 33, 1], [9, 33, 0], 5)):
            nb = sum(-(-s // bs) for s in seq) + 2
            k_cache = ref.vllm_view(ref.build_cache("v4", nb, bs, seed=bs), bs)
            bt = ref.random_requests(nb, bs, seq, seed=bs)
            sl = torch.tensor(seq, dtype=torch.int32)
            g = None if gl is None else torch.tensor(gl, dtype=torch.int32)
            got = torch.empty(len(seq), offset + max(seq) + 3, 512, dtype=torch.bfloat16)
            got.view(torch.uint8).fill_(0xA5)
            want = got.clone()
            ref.dequantize_and_gather_k_cache(want, k_cache, sl, g, bt, bs, offset)
            fn(got, k_cache, seq_lens=sl, gather_lens=g, block_table=bt, block_size=bs, offset=offset)
            out[f"bytes {bs}"] = torch.equal(got.view(torch.int16), want.view(torch.int16))
        print(json.dumps(out))
    """, python=PYTHON, timeout=600)
    assert got["before"] == {"state": f"waiting for {HOME}", "home": HOME, "modules": [], "left_to_vllm": {}}, got
    assert got["ops"][-1] == "dequantize_and_gather_k_cache", got
    assert got["ours"] and got["kept"], got
    # the arguments our wrapper takes, by name (vLLM's backends pass most by keyword)
    assert got["signature"] == [["out", None], ["k_cache", None], ["seq_lens", None], ["gather_lens", None],
                                ["block_table", None], ["block_size", None], ["offset", None],
                                ["use_fnuz", False]], got["signature"]
    assert got["status"]["state"] == "replaced" and {HOME, HOME + ".cache_utils"} <= set(got["status"]["modules"])
    assert got["bytes 64"] and got["bytes 16"], got


def test_vllms_backends_bind_it_from_the_home_the_plugin_patches(vllm_dir):
    """What the import hook relies on, read in vLLM's installed source: each V4 backend binds the
    function with ``from vllm.models.deepseek_v4.common.ops import dequantize_and_gather_k_cache``
    (so it reads the home's attribute after the home executed) and calls it through that name."""
    for rel in IMPORTERS:
        with open(os.path.join(vllm_dir, "models", "deepseek_v4", rel)) as f:
            tree = ast.parse(f.read())
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and any(a.name == "dequantize_and_gather_k_cache" for a in n.names)]
        assert [(n.module, n.level, [(a.name, a.asname) for a in n.names if a.name.startswith("dequantize")])
                for n in froms] == [(HOME, 0, [("dequantize_and_gather_k_cache", None)])], rel
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "dequantize_and_gather_k_cache"]
        assert len(calls) == 2, rel
    with open(os.path.join(vllm_dir, "models", "deepseek_v4", "common", "ops", "__init__.py")) as f:
        assert "from .cache_utils import" in f.read()
