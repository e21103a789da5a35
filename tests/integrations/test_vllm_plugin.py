"""The vLLM plugin as vLLM runs it, without vLLM installed (issue 16, items 1-4): activation by
NVRTC_GATHER_VLLM / NVRTC_GATHER_VLLM_OPS, the log line in vLLM's logger, status(), the worker
hook that loads the kernels on the worker's GPU. test_vllm_real.py repeats the key ones with
vLLM's own package."""
import os
import textwrap

import pytest

from helpers.fresh_python import run, run_raw
from nvrtc_gather.integrations import activation

GATHER, QUANT = "cp_gather_indexer_k_quant_cache", "indexer_k_quant_and_cache"
MLA_WRITE, MLA_GATHER = "concat_and_cache_mla", "cp_gather_and_upconvert_fp8_kv_cache"
CP_GATHER, DEQUANT_GATHER = "cp_gather_cache", "gather_and_maybe_dequant_cache"
# vllm_dsv4.status() where vLLM's DeepSeek-V4 gather is untouched (this stand-in `vllm` has none)
DSV4_NONE = {"state": "not installed", "home": None, "modules": [], "left_to_vllm": {}}
DSV4_ABSENT = dict(DSV4_NONE, state="no DeepSeek-V4 in this vLLM")


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("TRUE", True), ("yes", True), (" On ", True),
                                       ("0", False), ("false", False), ("No", False), ("off", False), ("", False)])
def test_enable_variable_is_a_strict_boolean(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("NVRTC_GATHER_VLLM", raising=False)
    else:
        monkeypatch.setenv("NVRTC_GATHER_VLLM", value)
    assert activation.vllm_enabled() is on


@pytest.mark.parametrize("value", ["2", "enable", "nvrtc_gather", "0,1"])
def test_enable_variable_refuses_other_values_naming_it(monkeypatch, value):
    monkeypatch.setenv("NVRTC_GATHER_VLLM", value)
    with pytest.raises(ValueError, match=f"NVRTC_GATHER_VLLM={value!r} is not a boolean: set it to 1, true"):
        activation.vllm_enabled()


@pytest.mark.parametrize("value, ops", [("gather", (GATHER,)), ("quant", (QUANT,)), (" quant , gather", (GATHER, QUANT)),
                                        (GATHER, (GATHER,)), ("GATHER,gather", (GATHER,)),
                                        ("dequant_gather,cp_gather", (CP_GATHER, DEQUANT_GATHER)),
                                        (DEQUANT_GATHER, (DEQUANT_GATHER,)),
                                        ("", activation.ALL_OPS), ("  ", activation.ALL_OPS)])  # empty: as unset
def test_ops_variable_selects_ops(monkeypatch, value, ops):
    monkeypatch.setenv("NVRTC_GATHER_VLLM_OPS", value)
    assert activation.vllm_ops() == ops


@pytest.mark.parametrize("value", [",", "gather,", "scatter", "gather;quant"])
def test_ops_variable_refuses_unknown_names(monkeypatch, value):
    monkeypatch.setenv("NVRTC_GATHER_VLLM_OPS", value)
    with pytest.raises(ValueError, match="NVRTC_GATHER_VLLM_OPS=.*expected a comma-separated list of gather"):
        activation.vllm_ops()


# A process that runs vLLM: a `vllm` module is imported and vLLM's logging config is applied
# (vllm/logger.py: its own handler on the "vllm" logger, propagate=False, root left alone).
PLUGIN = """
    import dataclasses, io, json, logging, sys, types, torch
    sys.modules["vllm"] = types.ModuleType("vllm")
    vllm_log = io.StringIO()
    handler = logging.StreamHandler(vllm_log)
    logging.getLogger("vllm").addHandler(handler)
    logging.getLogger("vllm").setLevel(logging.INFO)
    logging.getLogger("vllm").propagate = False
    from importlib import metadata
    from nvrtc_gather.integrations import vllm
    before = dataclasses.asdict(vllm.status())
    try:
        vllm.plugin()  # what vLLM's load_general_plugins calls
        error = None
    except ValueError as e:
        error = str(e)
    def ours(name):
        try:
            dump = torch._C._dispatch_dump(f"_C_cache_ops::{name}")
        except RuntimeError:
            return False
        return any(l.startswith("CUDA: registered at") and "integrations/vllm.py" in l for l in dump.splitlines())
    print(json.dumps({"before": before, "status": dataclasses.asdict(vllm.status()), "error": error,
                      "gather": ours("cp_gather_indexer_k_quant_cache"), "quant": ours("indexer_k_quant_and_cache"),
                      "mla_write": ours("concat_and_cache_mla"),
                      "mla_gather": ours("cp_gather_and_upconvert_fp8_kv_cache"),
                      "cp_gather": ours("cp_gather_cache"), "dequant_gather": ours("gather_and_maybe_dequant_cache"),
                      "log": vllm_log.getvalue()}))
"""


def test_plugin_replaces_both_ops_by_default_and_says_so_in_vllms_log():
    got = run(PLUGIN)
    assert got["before"] == {"registered": False, "ops": [], "schemas": None, "activated_by": None,
                             "disabled_by": None, "preload": "not installed", "left_to_vllm": {},
                             "dsv4_gather": DSV4_NONE}
    assert got["error"] is None and got["gather"] and got["quant"] and got["mla_write"] and got["mla_gather"]
    assert got["cp_gather"] and got["dequant_gather"]
    assert got["status"] == {"registered": True, "ops": [GATHER, QUANT, MLA_WRITE, MLA_GATHER, CP_GATHER, DEQUANT_GATHER],
                             "schemas": "nvrtc_gather", "activated_by": "plugin", "disabled_by": None,
                             "preload": "waiting for vllm.v1.worker.worker_base", "left_to_vllm": {},
                             "dsv4_gather": DSV4_ABSENT}
    assert (f"torch.ops._C_cache_ops.{{{GATHER}, {QUANT}, {MLA_WRITE}, {MLA_GATHER}, {CP_GATHER}, {DEQUANT_GATHER}}} "
            "now run nvrtc_gather's kernels") in got["log"], got["log"]


@pytest.mark.parametrize("value, said", [("0", "NVRTC_GATHER_VLLM=0"), ("off", "NVRTC_GATHER_VLLM=off"),
                                         (" No", "NVRTC_GATHER_VLLM= No"), ("", "NVRTC_GATHER_VLLM='' (empty)")])
def test_plugin_switched_off_leaves_vllms_kernels_and_names_the_value_given(value, said):
    got = run(PLUGIN, NVRTC_GATHER_VLLM=value)
    assert got["error"] is None and not got["gather"] and not got["quant"]
    assert got["status"]["registered"] is False and got["status"]["disabled_by"] == said
    assert got["status"]["preload"] == "not installed"
    assert f"vLLM plugin loaded but off ({said})" in got["log"]


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_ops_list_means_all_six(value):
    got = run(PLUGIN, NVRTC_GATHER_VLLM_OPS=value)
    assert got["error"] is None, got["error"]
    assert got["status"]["ops"] == [GATHER, QUANT, MLA_WRITE, MLA_GATHER, CP_GATHER, DEQUANT_GATHER]


def test_plugin_with_a_bad_switch_raises_naming_the_variable():
    got = run(PLUGIN, NVRTC_GATHER_VLLM="nvrtc_gather")
    assert got["error"].startswith("NVRTC_GATHER_VLLM='nvrtc_gather' is not a boolean") and not got["gather"]


def test_per_op_opt_out_replaces_only_the_named_op_and_logs_which():
    got = run(PLUGIN, NVRTC_GATHER_VLLM_OPS="gather")
    assert got["gather"] and not got["quant"] and not got["mla_write"] and not got["mla_gather"]
    assert not got["cp_gather"] and not got["dequant_gather"]
    assert got["status"]["ops"] == [GATHER]
    assert f"{{{GATHER}}} now run nvrtc_gather's kernels" in got["log"]
    assert f"; {QUANT}, {MLA_WRITE}, {MLA_GATHER}, {CP_GATHER}, {DEQUANT_GATHER} left to vLLM" in got["log"]
    got = run(PLUGIN, NVRTC_GATHER_VLLM_OPS="mla_gather, quant")
    assert got["quant"] and got["mla_gather"] and not got["gather"] and not got["mla_write"]
    assert got["status"]["ops"] == [QUANT, MLA_GATHER]
    got = run(PLUGIN, NVRTC_GATHER_VLLM_OPS="dequant_gather")
    assert got["dequant_gather"] and not got["cp_gather"] and not got["gather"] and not got["mla_gather"]
    assert got["status"]["ops"] == [DEQUANT_GATHER]
    assert f"{{{DEQUANT_GATHER}}} now run nvrtc_gather's kernels" in got["log"]


def test_register_accepts_op_names_and_refuses_unknown_ones():
    got = run("""
        import json
        from nvrtc_gather.integrations import vllm
        first = vllm.register("quant")
        both = vllm.register(["gather", "quant"])
        try:
            vllm.register(["gahter"])
            err = None
        except ValueError as e:
            err = str(e)
        print(json.dumps({"first": first, "both": both, "err": err, "by": vllm.status().activated_by}))
    """)
    assert got["first"] == [QUANT] and got["both"] == [GATHER, QUANT] and got["by"] == "register()"
    assert got["err"].startswith("ops='gahter': expected a comma-separated list")


# A stand-in for vllm/v1/worker/worker_base.py with what the hook relies on: WorkerWrapperBase,
# whose init_device calls the worker's init_device (which sets the device: gpu_worker.py), and
# a worker with .device, .model_config.dtype and .cache_config.cache_dtype.
FAKE_WORKER_BASE = '''
import torch
class _Config:
    dtype = torch.bfloat16
class _CacheConfig:
    cache_dtype = "fp8"
class _Worker:
    model_config = _Config()
    cache_config = _CacheConfig()
    def __init__(self, index):
        self.index = index
    def init_device(self):
        self.device = torch.device("cuda", self.index)
class WorkerWrapperBase:
    def __init__(self, index):
        self.worker = _Worker(index)
    def init_device(self):
        self.worker.init_device()
        return "vllm's result"
'''

HOOK = """
    import json, sys, torch
    import nvrtc_gather.jit.runtime as runtime
    calls = []
    runtime.preload = lambda device=None, modules=None: calls.append([device, [m.name for m in modules]])
    from nvrtc_gather.integrations import vllm
    if IMPORT_FIRST:
        import vllm.v1.worker.worker_base as wb
    vllm.plugin()
    hooked_before_import = vllm.status().preload
    import vllm.v1.worker.worker_base as wb
    wrapper = wb.WorkerWrapperBase(3)
    result = wrapper.init_device()
    again = wb.WorkerWrapperBase(5)
    vllm.plugin()  # vLLM may load plugins again in the same process: still one wrapper
    again.init_device()
    print(json.dumps({"before": hooked_before_import, "result": result, "calls": calls,
                      "status": vllm.status().preload}))
"""


def _fake_vllm(tmp_path):
    pkg = tmp_path / "vllm" / "v1" / "worker"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "v1", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "worker_base.py").write_text(FAKE_WORKER_BASE)
    return str(tmp_path)


@pytest.mark.parametrize("import_first", [True, False])
def test_worker_hook_loads_the_kernels_on_the_workers_own_gpu_only(tmp_path, import_first):
    got = run(HOOK.replace("IMPORT_FIRST", str(import_first)), path=[_fake_vllm(tmp_path)])
    assert got["before"] == ("hooked" if import_first else "waiting for vllm.v1.worker.worker_base")
    assert got["result"] == "vllm's result"
    gather = ["gather_indexer_k_v16", "gather_indexer_k_v8", "gather_indexer_k_v4"]
    quant_bf16 = ["quant_cache_bf16_v16", "quant_cache_bf16_v16_small", "quant_cache_bf16_v8",
                  "quant_cache_bf16_v8_small", "quant_cache_bf16_any"]
    mla_bf16 = ["mla_ds_bf16", "mla_plain_bf16", "mla_gather"]
    chunked_fp8_bf16 = ["cache_gather_copy", "cache_gather_e4m3_bf16"]  # cache_dtype "fp8", model dtype bf16
    want = gather + quant_bf16 + mla_bf16 + chunked_fp8_bf16
    assert got["calls"] == [[3, want], [5, want]]  # one device per worker, no other
    assert got["status"].startswith("loaded on cuda:5 (13 modules, ")


def test_worker_hook_loads_only_the_replaced_ops_kernels(tmp_path):
    got = run(HOOK.replace("IMPORT_FIRST", "False"), path=[_fake_vllm(tmp_path)], NVRTC_GATHER_VLLM_OPS="gather")
    assert got["calls"][0] == [3, ["gather_indexer_k_v16", "gather_indexer_k_v8", "gather_indexer_k_v4"]]


@pytest.mark.parametrize("cache_dtype, dtype, want", [
    ("auto", "bfloat16", ["cache_gather_copy"]),
    ("fp8_e4m3", "float16", ["cache_gather_copy", "cache_gather_e4m3_f16"]),
    ("fp8_e5m2", "float32", ["cache_gather_copy", "cache_gather_e5m2_f32"]),
    # vLLM gathers fp8_ds_mla with the upconvert op; the dequantizing gather serves the string
    # too (e4m3, as vLLM's op does), so its module is loaded before any graph capture
    ("fp8_ds_mla", "bfloat16", ["cache_gather_copy", "cache_gather_e4m3_bf16"]),
    (None, "bfloat16", ["cache_gather_copy", "cache_gather_e4m3_bf16", "cache_gather_e5m2_bf16"]),
])
def test_worker_hook_loads_the_chunked_gathers_for_the_cache_and_model_dtypes(cache_dtype, dtype, want):
    """vLLM's chunked-context prefill gathers with cp_gather_cache (any cache, byte copy) or
    gather_and_maybe_dequant_cache ("auto": the copy; fp8: dequantized to the model's dtype)."""
    import torch

    from nvrtc_gather.integrations import vllm_worker
    got = vllm_worker.modules_for((CP_GATHER, DEQUANT_GATHER), getattr(torch, dtype), cache_dtype)
    assert [m.name for m in got] == want
    assert [m.name for m in vllm_worker.modules_for((CP_GATHER,), getattr(torch, dtype), cache_dtype)] == \
        ["cache_gather_copy"]


def test_worker_hook_is_not_installed_when_the_plugin_is_off(tmp_path):
    got = run(HOOK.replace("IMPORT_FIRST", "True"), path=[_fake_vllm(tmp_path)], NVRTC_GATHER_VLLM="0")
    assert got["calls"] == [] and got["status"] == "not installed"


def test_a_failed_preload_fails_the_workers_init_device(tmp_path):
    """NVRTC_GATHER_DISABLE_JIT=1 with an empty cache: the worker fails at startup, naming the fix."""
    r = run_raw("""
        import nvrtc_gather.jit.runtime as runtime
        from nvrtc_gather.errors import JitDisabledError
        def preload(device=None, modules=None):
            raise JitDisabledError("no cached kernel; run nvrtc-gather warmup")
        runtime.preload = preload
        from nvrtc_gather.integrations import vllm
        vllm.plugin()
        import vllm.v1.worker.worker_base as wb
        wb.WorkerWrapperBase(0).init_device()
    """, path=[_fake_vllm(tmp_path)])
    assert r.returncode != 0 and "JitDisabledError: no cached kernel; run nvrtc-gather warmup" in r.stderr


def test_worker_without_a_cuda_device_loads_nothing(tmp_path):
    got = run("""
        import json, torch
        import nvrtc_gather.jit.runtime as runtime
        calls = []
        runtime.preload = lambda device=None, modules=None: calls.append(device)
        torch.cuda.is_available = lambda: False
        from nvrtc_gather.integrations import vllm_worker
        vllm_worker._state["ops"] = ("cp_gather_indexer_k_quant_cache",)
        vllm_worker.preload_worker(object())
        print(json.dumps({"calls": calls, "status": vllm_worker.status()}))
    """)
    assert got == {"calls": [], "status": "not loaded: this worker has no CUDA device"}


REAL_PRELOAD = """
    import json, torch
    import nvrtc_gather.jit.runtime as runtime
    from nvrtc_gather.integrations import vllm
    vllm.plugin()
    import vllm.v1.worker.worker_base as wb
    try:
        wb.WorkerWrapperBase(torch.cuda.device_count() - 1).init_device()
        error = None
    except Exception as e:
        error = type(e).__name__
    print(json.dumps({"loaded": sorted(f"{m}@{d}" for m, d in runtime._loaded), "error": error,
                      "status": vllm.status().preload, "last": torch.cuda.device_count() - 1}))
"""


@pytest.mark.gpu
def test_worker_hook_really_loads_the_kernels_on_that_gpu_only(tmp_path):
    got = run(REAL_PRELOAD, path=[_fake_vllm(tmp_path)], NVRTC_GATHER_CACHE_DIR=str(tmp_path / "cache"))
    d = got["last"]
    assert got["error"] is None and got["status"].startswith(f"loaded on cuda:{d} (13 modules")
    assert got["loaded"] == sorted(f"{m}@{d}" for m in ("gather_indexer_k_v16", "gather_indexer_k_v8",
                                                        "gather_indexer_k_v4", "quant_cache_bf16_v16",
                                                        "quant_cache_bf16_v16_small", "quant_cache_bf16_v8",
                                                        "quant_cache_bf16_v8_small", "quant_cache_bf16_any",
                                                        "mla_ds_bf16", "mla_plain_bf16", "mla_gather",
                                                        "cache_gather_copy", "cache_gather_e4m3_bf16"))


@pytest.mark.gpu
def test_worker_with_jit_disabled_and_a_cold_cache_fails_at_init_device(tmp_path):
    got = run(REAL_PRELOAD, path=[_fake_vllm(tmp_path)], NVRTC_GATHER_CACHE_DIR=str(tmp_path / "empty"),
              NVRTC_GATHER_DISABLE_JIT="1")
    assert got["error"] == "JitDisabledError" and got["loaded"] == []
