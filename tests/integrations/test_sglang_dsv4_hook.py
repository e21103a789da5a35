"""The SGLang hook of DeepSeek-V4's record gathers (integrations/sglang_dsv4.py) on stand-ins of
SGLang 0.5.23's modules (and of 0.5.16-0.5.22's unsuffixed names): register() replaces both functions in the defining module and in a backend
that bound them by ``from ... import``; calls we serve give the reference bytes on CPU... are left to
SGLang (CPU tensors are SGLang's: its Triton kernels), layouts other than V4 and V4.1's and other
dtypes go to SGLang's own function, unregister() restores it, and a release without V4 hooks nothing and says
nothing."""
import importlib.machinery
import sys
import types

import pytest
import torch

from helpers import dsv4_reference as ref
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.integrations import sglang_dsv4
from nvrtc_gather.ops import dsv4_gather

DEFINING = sglang_dsv4.MODULES[0]
BACKEND = "sglang.srt.layers.attention.deepseek_v4_backend"


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__dict__.update(attrs)
    return m


def _parents(monkeypatch):
    """Stand-ins of the defining module's parent packages that SGLang's import would have made."""
    parts = DEFINING.split(".")
    for i in range(2, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, _module(name))


@pytest.fixture
def v4(monkeypatch, standin):
    standin((hook.MODULES[0],))  # an accessor module, so that register() finds this "SGLang"
    calls = []

    def dequantize_k_cache_paged_dsv4(quant_k_cache, page_table_1_flattened, page_size, out=None, layout="V4"):
        calls.append(("bf16", layout))
        return "sglang's"

    def gather_dequant_requant_fp8_paged_dsv4(quant_k_cache, page_table_1_flattened, page_size, extra_rows=0,
                                              out=None):
        calls.append(("fp8", extra_rows))
        return "sglang's"

    fns = dict(dequantize_k_cache_paged_dsv4=dequantize_k_cache_paged_dsv4,
               gather_dequant_requant_fp8_paged_dsv4=gather_dequant_requant_fp8_paged_dsv4)
    _parents(monkeypatch)
    monkeypatch.setitem(sys.modules, DEFINING, _module(DEFINING, **fns))
    monkeypatch.setitem(sys.modules, BACKEND, _module(BACKEND, **fns))  # bound before register()
    yield calls, fns
    hook.unregister()


def test_register_replaces_both_functions_where_sglang_binds_them(v4):
    calls, fns = v4
    hook.register()
    for mod in (sys.modules[DEFINING], sys.modules[BACKEND]):
        for name, original in fns.items():
            assert getattr(mod, name) is not original and getattr(mod, name).__wrapped__ is original
    assert {"dequantize_k_cache_paged_dsv4", "gather_dequant_requant_fp8_paged_dsv4"} <= set(hook.status()["hooked"])
    hook.unregister()
    for mod in (sys.modules[DEFINING], sys.modules[BACKEND]):
        for name, original in fns.items():
            assert getattr(mod, name) is original


def test_calls_we_do_not_serve_go_to_sglang_and_say_why(v4):
    calls, _ = v4
    hook.register()
    mod = sys.modules[BACKEND]
    cache = ref.build_cache("v4", 3, 16, seed=1)
    ids = torch.tensor([0, 5])
    assert mod.dequantize_k_cache_paged_dsv4(cache, ids, 16, layout="UNIFORM_FP8") == "sglang's"  # TRT-LLM's
    assert mod.dequantize_k_cache_paged_dsv4(cache, ids, 16) == "sglang's"  # CPU tensors: SGLang's path
    assert mod.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 16, 1) == "sglang's"
    assert calls == [("bf16", "UNIFORM_FP8"), ("bf16", "V4"), ("fp8", 1)]
    left = hook.status()["left_to_sglang"]
    assert "layout" in left["dequantize_k_cache_paged_dsv4"] and "cache" in left["dequantize_k_cache_paged_dsv4"]


def test_on_rocm_every_call_goes_to_sglang_before_any_remembered_path(v4, monkeypatch):
    """ROCm torch: SGLang's own function (its HIP kernels), the remembered path never asked (a
    layout is remembered after a CUDA launch, so it would not hold one; it must not be trusted to)."""
    calls, _ = v4
    monkeypatch.setattr(sglang_dsv4, "_ROCM", True)
    monkeypatch.setattr(sglang_dsv4.dsv4_gather, "_flat_remembered", lambda *a: pytest.fail("remembered path asked"))
    hook.register()
    mod = sys.modules[BACKEND]
    cache = ref.build_cache("v4", 3, 16, seed=1)
    assert mod.dequantize_k_cache_paged_dsv4(cache, torch.tensor([0, 5]), 16) == "sglang's"
    assert mod.gather_dequant_requant_fp8_paged_dsv4(cache, torch.tensor([0, 5]), 16, 1) == "sglang's"
    assert calls == [("bf16", "V4"), ("fp8", 1)]
    left = hook.status()["left_to_sglang"]
    assert all("ROCm" in left[name] for name in ("dequantize_k_cache_paged_dsv4",
                                                 "gather_dequant_requant_fp8_paged_dsv4")), left


@pytest.mark.parametrize("layout", ["V4", "v41", "V41_NEW", "v41_fp4", "V41_FP4_NEW"])
def test_the_v41_layouts_are_ours_where_the_cache_is(layout):
    """A V4.1 layout is not a reason to leave a call to SGLang (its own kernel refuses GPUs below
    SM100): only the cache's device is, here (CPU tensors)."""
    cache = ref.build_cache(layout.lower(), 3, 16, seed=1)
    why = sglang_dsv4._unserved(cache, torch.tensor([0, 5]), None, False, layout)
    assert why is not None and why[0] == "cache"
    assert sglang_dsv4._unserved(cache, torch.tensor([0, 5]), None, False, "uniform_fp8")[0] == "layout"


def test_the_ops_variable_names_each_function(v4):
    _, fns = v4
    hook.register(ops="dsv4_fp8")
    mod = sys.modules[DEFINING]
    assert mod.dequantize_k_cache_paged_dsv4 is fns["dequantize_k_cache_paged_dsv4"]
    assert mod.gather_dequant_requant_fp8_paged_dsv4 is not fns["gather_dequant_requant_fp8_paged_dsv4"]


def test_a_release_without_v4_hooks_nothing_and_says_nothing(standin):
    standin((hook.MODULES[0],))
    hook.register()
    try:
        st = hook.status()
        assert not set(sglang_dsv4.FUNCTIONS.values()) & (set(st["hooked"]) | set(st["left_to_sglang"]))
    finally:
        hook.unregister()


DSA = "sglang.kernels.ops.attention.dsa.dequant_k_cache"
DSA_BACKEND = "sglang.srt.layers.attention.dsa_backend"


def test_the_unsuffixed_names_of_0_5_16_to_0_5_22_are_hooked_and_v3_2s_namesakes_kept(monkeypatch, standin):
    """0.5.19-0.5.22 name the V4 gathers without the ``_dsv4`` suffix; DeepSeek-V3.2's module (dsa)
    has functions of the same names over another layout, bound in its backend: those stay SGLang's."""
    standin((hook.MODULES[0],))

    def dequantize_k_cache_paged(quant_k_cache, page_table_1_flattened, page_size, out=None):
        return "sglang's v4"

    def gather_dequant_requant_fp8_paged(quant_k_cache, page_table_1_flattened, page_size, extra_rows=0, out=None):
        return "sglang's v4"

    def v32(*args, **kwargs):
        return "sglang's v3.2"

    _parents(monkeypatch)
    v4_fns = dict(dequantize_k_cache_paged=dequantize_k_cache_paged,
                  gather_dequant_requant_fp8_paged=gather_dequant_requant_fp8_paged)
    v32_fns = dict(dequantize_k_cache_paged=v32, gather_dequant_requant_fp8_paged=v32)
    monkeypatch.setitem(sys.modules, DEFINING, _module(DEFINING, **v4_fns))
    monkeypatch.setitem(sys.modules, BACKEND, _module(BACKEND, **v4_fns))
    monkeypatch.setitem(sys.modules, DSA, _module(DSA, **v32_fns))
    monkeypatch.setitem(sys.modules, DSA_BACKEND, _module(DSA_BACKEND, **v32_fns))
    try:
        hook.register()
        assert set(hook.status()["hooked"]) >= {"dequantize_k_cache_paged", "gather_dequant_requant_fp8_paged"}
        for mod in (sys.modules[DEFINING], sys.modules[BACKEND]):
            for name, original in v4_fns.items():
                assert getattr(mod, name).__wrapped__ is original
        for mod in (sys.modules[DSA], sys.modules[DSA_BACKEND]):
            assert all(getattr(mod, name) is v32 for name in v32_fns)
        cache = ref.build_cache("v4", 3, 16, seed=1)
        assert sys.modules[BACKEND].dequantize_k_cache_paged(cache, torch.tensor([0, 5]), 16) == "sglang's v4"  # CPU: SGLang's
    finally:
        hook.unregister()
    assert all(getattr(sys.modules[BACKEND], n) is f for n, f in v4_fns.items())


def test_a_v4_module_with_only_the_bf16_gather_hooks_it_and_leaves_the_fp8_op(monkeypatch, standin):
    """0.5.16-0.5.18: dequantize_k_cache_paged only; status() says the fp8 gather is absent."""
    standin((hook.MODULES[0],))

    def dequantize_k_cache_paged(quant_k_cache, page_table_1_flattened, page_size, out=None):
        return "sglang's"

    _parents(monkeypatch)
    monkeypatch.setitem(sys.modules, DEFINING, _module(DEFINING, dequantize_k_cache_paged=dequantize_k_cache_paged))
    try:
        hook.register()
        st = hook.status()
        assert st["hooked"]["dequantize_k_cache_paged"] == DEFINING
        assert "absent" in st["left_to_sglang"]["gather_dequant_requant_fp8_paged_dsv4"]
    finally:
        hook.unregister()


def test_0_5_13_to_0_5_15s_module_is_hooked_where_the_newer_one_is_absent(monkeypatch, standin):
    """0.5.13-0.5.15 keep the bf16 gather in sglang.srt.layers.attention.dsv4.dequant_k_cache."""
    standin((hook.MODULES[0],))
    old = sglang_dsv4.MODULES[1]

    def dequantize_k_cache_paged(quant_k_cache, page_table_1_flattened, page_size, out=None):
        return "sglang's"

    parts = old.split(".")
    for i in range(2, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, _module(name))
    monkeypatch.setitem(sys.modules, old, _module(old, dequantize_k_cache_paged=dequantize_k_cache_paged))
    monkeypatch.setitem(sys.modules, BACKEND, _module(BACKEND, dequantize_k_cache_paged=dequantize_k_cache_paged))
    assert sglang_dsv4.defining() == old
    try:
        hook.register()
        assert hook.status()["hooked"]["dequantize_k_cache_paged"] == old
        assert sys.modules[BACKEND].dequantize_k_cache_paged.__wrapped__ is dequantize_k_cache_paged
    finally:
        hook.unregister()
    assert sys.modules[BACKEND].dequantize_k_cache_paged is dequantize_k_cache_paged


def test_the_hook_traces_under_compile_with_its_layout_remembered(monkeypatch):
    """torch.compile (fullgraph) of SGLang's function as hooked, after an eager call remembered
    the layout: the traced call records the op (gather_flat's compiled path) instead of taking
    the remembered launch, which needs data pointers a fake tensor does not have."""
    monkeypatch.setattr(sglang_dsv4, "_SERVED_DEVICE", "cpu")  # CPU tensors stand for CUDA's here
    cache = ref.build_cache("v4", 5, 16, seed=4)
    ids = ref.random_token_ids(5, 16, 30, seed=4)
    key = dsv4_gather._flat_key(cache, ids, 16, False, "v4")
    monkeypatch.setattr(dsv4_gather, "_flat_ready", dsv4_gather.fast_path.LayoutMemo())
    dsv4_gather._flat_ready.remember(key, dsv4_gather.FlatReady(lambda *a: pytest.fail("launched"), torch.bfloat16,
                                                                1024))
    hooked = sglang_dsv4._wrap("dequantize_k_cache_paged_dsv4", lambda *a, **k: "sglang's", lambda *why: None)
    torch._dynamo.reset()
    f = torch.compile(lambda c, i: hooked(c, i, 16), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(cache, ids).view(torch.int16), ref.dequantize_k_cache_paged_dsv4(cache, ids, 16).view(torch.int16))
