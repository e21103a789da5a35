"""The vLLM plugin proven against vLLM's own code (issue 16): vLLM's plugin loader
(``vllm.plugins.load_general_plugins``) loads our entry point, and vLLM's own wrappers
(``vllm._custom_ops``) run our kernels' CPU paths bit-exact; our schemas are the strings vLLM's
compiled library carries; the worker hook relies on what vLLM's worker module does.

Runs in the environment ``scripts/setup_vllm_env.sh`` creates (``.venv-vllm``: vllm 0.33.0
installed with --no-deps beside CPU torch, this checkout installed editable so that its entry
point is visible), or the one ``NVRTC_GATHER_VLLM_VENV`` names (scripts/engine_matrix.sh: one per
vLLM release, 0.34.0 too). Without it these tests skip, unless NVRTC_GATHER_REQUIRE_VLLM_ENV=1 (set by
.ci/run), where a missing environment fails. vLLM's compiled ops need libtorch_cuda and a
driver, so on CPU the schemas are the ones ``register()`` defines."""
import ast
import os
import re

import pytest

from helpers.fresh_python import REPO, run, run_raw
from nvrtc_gather.integrations.vllm import SCHEMAS

VENV = os.environ.get("NVRTC_GATHER_VLLM_VENV", os.path.join(REPO, ".venv-vllm"))
PYTHON = os.path.join(VENV, "bin", "python")


def _site_vllm() -> str:
    found = [os.path.join(root, "vllm") for root, dirs, _ in os.walk(os.path.join(VENV, "lib"))
             if "vllm" in dirs and root.endswith("site-packages")]
    return found[0] if found else ""


@pytest.fixture(scope="module")
def vllm_dir():
    if not os.path.exists(PYTHON) or not _site_vllm():
        msg = f"no vLLM test environment at {VENV}: run scripts/setup_vllm_env.sh"
        if os.environ.get("NVRTC_GATHER_REQUIRE_VLLM_ENV") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return _site_vllm()


LOAD_AND_CALL = """
    import dataclasses, json, random, torch
    import vllm.logger, vllm.plugins
    # vLLM's processes configure its logger before loading plugins (0.33: configure_logging in the
    # engine and worker entry points); this is its bootstrap from its environment variables.
    vllm.logger._configure_vllm_root_logger()
    vllm.plugins.load_general_plugins()  # vLLM's own loader: entry points, VLLM_PLUGINS
    import nvrtc_gather as ng
    from nvrtc_gather.integrations import vllm as adapter
    out = {"status": dataclasses.asdict(adapter.status())}
    if out["status"]["registered"]:
        import vllm._custom_ops as ops  # vLLM's own wrappers, calling torch.ops._C_cache_ops
        from helpers.reference import make_gather_case, make_quant_case, gather_reference
        rng = random.Random(3)
        case = make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=6, max_len=300)
        k_ref, s_ref = gather_reference(case.kv_cache, case.block_table, case.cu_seq_lens, case.dst_k.size(0),
                                        case.head_dim, case.scale_words)
        if "cp_gather_indexer_k_quant_cache" in out["status"]["ops"]:
            ops.cp_gather_indexer_k_quant_cache(*case.args())
            out["gather"] = torch.equal(case.dst_k.view(torch.uint8), k_ref) and \\
                torch.equal(case.dst_scale.view(torch.uint8), s_ref)
        for fmt in ("ue8m0", "fp8_e4m3", "mxfp8") if "indexer_k_quant_and_cache" in out["status"]["ops"] else ():
            case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=torch.bfloat16,
                                   scale_fmt="ue8m0", num_tokens=70)
            got, want = case.kv_cache.clone(), case.kv_cache.clone()
            ops.indexer_k_quant_and_cache(case.k, got, case.slot_mapping, 128, fmt)
            torch.ops._C_cache_ops.indexer_k_quant_and_cache(case.k, want, case.slot_mapping, 128, fmt)
            mine = case.kv_cache.clone()
            ng.indexer_k_quant_and_cache(case.k, mine, case.slot_mapping, 128, "ue8m0" if fmt != "fp8_e4m3" else None)
            out[fmt] = torch.equal(got, want) and not torch.equal(got, case.kv_cache) and \\
                (torch.equal(got, mine) if fmt != "mxfp8" else not torch.equal(got, mine))
    if "concat_and_cache_mla" in out["status"]["ops"]:
        # the MLA ops through vLLM's wrappers (0.33: skip_scale, host-offload arguments) against ours
        kv_c, k_pe = torch.randn(40, 512).bfloat16() * 30, torch.randn(40, 64).bfloat16()
        slots = torch.randperm(8 * 16)[:40].to(torch.int64)
        slots[3] = -1
        cache = torch.full((8, 16, 656), 0xA5, dtype=torch.uint8)
        mine = cache.clone()
        ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1))
        ng.concat_and_cache_mla(kv_c, k_pe, mine, slots, "fp8_ds_mla", torch.ones(1))
        out["mla_write"] = torch.equal(cache, mine) and not torch.equal(cache, torch.full_like(cache, 0xA5))
        bt = torch.randperm(8).to(torch.int32).view(2, 4)
        ws = torch.tensor([0, 30], dtype=torch.int32)
        got_rows = torch.full((70, 576), 7.0, dtype=torch.bfloat16)
        want_rows = got_rows.clone()
        ops.cp_gather_and_upconvert_fp8_kv_cache(cache, got_rows, bt, ws, 2, torch.tensor([5, 0], dtype=torch.int32))
        ng.cp_gather_and_upconvert_fp8_kv_cache(cache, want_rows, bt, ws, 2, torch.tensor([5, 0], dtype=torch.int32))
        out["mla_gather"] = torch.equal(got_rows.view(torch.int16), want_rows.view(torch.int16)) and \
            not torch.equal(got_rows, torch.full_like(got_rows, 7.0))
    if "cp_gather_cache" in out["status"]["ops"]:
        # the chunked-context gathers as vLLM's MLA prefill calls them (mla_attention.py): keywords,
        # seq_starts, the whole workspace with num_tokens below its rows; against the independent reference
        from helpers.cache_gather_reference import make_case, reference
        rng = random.Random(27)
        case = make_case(rng, lens=[30, 0, 77, 5], block_size=64, seq_starts=True, extra_rows=4)
        ops.cp_gather_cache(src_cache=case.src_cache, dst=case.dst, block_table=case.block_table,
                            cu_seq_lens=case.cu_seq_lens, batch_size=case.batch, seq_starts=case.seq_starts)
        out["cp_gather"] = torch.equal(case.dst_store, reference(case))
        for fmt, kw in (("auto", dict(src_dtype=torch.bfloat16)), ("fp8", dict(conversion="e4m3_bf16")),
                        ("fp8_e5m2", dict(conversion="e5m2_f16"))):
            case = make_case(rng, lens=[41, 3, 0, 66], block_size=16, seq_starts=True, extra_rows=20, **kw)
            case = dataclasses.replace(case, num_rows=case.num_rows - 25)
            args = case.dequant_args(fmt)
            ops.gather_and_maybe_dequant_cache(src_cache=args[0], dst=args[1], block_table=args[2],
                                               cu_seq_lens=args[3], token_to_seq=args[4], num_tokens=args[5],
                                               kv_cache_dtype=args[6], scale=args[7], seq_starts=args[8])
            out[f"dequant_gather {fmt}"] = torch.equal(case.dst_store, reference(case))
    print(json.dumps(out))
"""


def _load(**env):
    r = run_raw(LOAD_AND_CALL, python=PYTHON, timeout=600, **env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    lines = r.stdout.strip().splitlines()
    import json
    return json.loads(lines[-1]), r.stdout + r.stderr


def test_vllms_loader_loads_the_plugin_and_vllms_wrappers_run_our_ops(vllm_dir):
    got, log = _load()
    home = "vllm.models.deepseek_v4.common.ops"  # not imported here: replaced when vLLM imports it
    assert got["status"] == {"registered": True, "ops": [*SCHEMAS, "dequantize_and_gather_k_cache"],
                             "schemas": "nvrtc_gather", "activated_by": "plugin", "disabled_by": None,
                             "preload": "waiting for vllm.v1.worker.worker_base", "left_to_vllm": {},
                             "dsv4_gather": {"state": f"waiting for {home}", "home": home, "modules": [],
                                             "left_to_vllm": {}}}, got
    assert got["gather"] and got["ue8m0"] and got["fp8_e4m3"] and got["mxfp8"], got
    assert got["mla_write"] and got["mla_gather"], got
    assert got["cp_gather"] and got["dequant_gather auto"] and got["dequant_gather fp8"] and \
        got["dequant_gather fp8_e5m2"], got
    # vLLM's logger (its own handler, propagate=False) carries our line
    assert re.search(r"INFO .*nvrtc_gather: torch\.ops\._C_cache_ops\.\{cp_gather_indexer_k_quant_cache, "
                     r"indexer_k_quant_and_cache, concat_and_cache_mla, cp_gather_and_upconvert_fp8_kv_cache, "
                     r"cp_gather_cache, gather_and_maybe_dequant_cache\} "
                     r"now run nvrtc_gather's kernels", log), log[-3000:]


@pytest.mark.parametrize("plugins, loaded", [("nvrtc_gather", True), ("other,nvrtc_gather", True),
                                             ("other, nvrtc_gather", False), ("", False), ("other", False)])
def test_vllm_plugins_is_honoured_exactly_as_vllm_parses_it(vllm_dir, plugins, loaded):
    """VLLM_PLUGINS is vLLM's allow-list, split on "," without stripping (vllm/envs.py): with a
    space before the name, vLLM never calls us (README says so)."""
    got, _ = _load(VLLM_PLUGINS=plugins)
    assert got["status"]["registered"] is loaded, got


def test_switched_off_under_vllm_leaves_vllms_ops_and_says_so(vllm_dir):
    got, log = _load(NVRTC_GATHER_VLLM="off")
    assert got["status"]["registered"] is False and got["status"]["disabled_by"] == "NVRTC_GATHER_VLLM=off"
    assert "nvrtc_gather: vLLM plugin loaded but off (NVRTC_GATHER_VLLM=off)" in log, log[-3000:]


def test_only_the_gather_under_vllm(vllm_dir):
    got, log = _load(NVRTC_GATHER_VLLM_OPS="gather")
    assert got["status"]["ops"] == ["cp_gather_indexer_k_quant_cache"] and got["gather"] and "mxfp8" not in got, got
    assert ("indexer_k_quant_and_cache, concat_and_cache_mla, cp_gather_and_upconvert_fp8_kv_cache, cp_gather_cache, "
            "gather_and_maybe_dequant_cache left to vLLM") in log


def test_only_the_chunked_gathers_under_vllm(vllm_dir):
    got, log = _load(NVRTC_GATHER_VLLM_OPS="cp_gather,dequant_gather")
    assert got["status"]["ops"] == ["cp_gather_cache", "gather_and_maybe_dequant_cache"], got
    assert got["cp_gather"] and got["dequant_gather fp8"] and "gather" not in got and "mla_write" not in got, got


def test_our_schemas_are_the_strings_in_vllms_compiled_library(vllm_dir):
    found = {}
    for name in os.listdir(vllm_dir):
        if name.endswith(".so"):
            with open(os.path.join(vllm_dir, name), "rb") as f:
                data = f.read()
            for op in SCHEMAS:
                for m in re.finditer(re.escape(op.encode()) + rb"\([^\x00]*?\) -> \(\)", data):
                    found.setdefault(op, set()).add((name, m.group().decode()))
    for op, schema in SCHEMAS.items():  # whitespace aside (vLLM spreads some over lines; torch's parser ignores it)
        assert {re.sub(r"\s+", " ", s) for _, s in found.get(op, ())} == {schema}, (op, found.get(op))


def _method(tree, cls, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _calls(fn) -> list[str]:
    return [ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)]


def test_the_worker_hook_matches_vllms_worker_code(vllm_dir):
    """What integrations/vllm_worker.py relies on, read in vLLM's installed source (importing the
    worker module needs vLLM's full dependency set): plugins are loaded in
    WorkerWrapperBase.init_worker; its init_device calls the worker's, which sets the device;
    both executors call the wrapper's init_device."""
    def tree(*parts):
        with open(os.path.join(vllm_dir, *parts)) as f:
            return ast.parse(f.read())
    base = tree("v1", "worker", "worker_base.py")
    assert "load_general_plugins" in _calls(_method(base, "WorkerWrapperBase", "init_worker"))
    assert "self.worker.init_device" in _calls(_method(base, "WorkerWrapperBase", "init_device"))
    gpu = _calls(_method(tree("v1", "worker", "gpu_worker.py"), "Worker", "init_device"))
    assert "torch.accelerator.set_device_index" in gpu or "torch.cuda.set_device" in gpu, gpu
    for executor in ("uniproc_executor.py", "multiproc_executor.py"):
        src = open(os.path.join(vllm_dir, "v1", "executor", executor)).read()
        assert "WorkerWrapperBase(" in src and ".init_device()" in src, executor


def test_the_plugin_never_imports_vllms_worker_module_itself(vllm_dir):
    got = run("""
        import json, sys
        import vllm.plugins
        vllm.plugins.load_general_plugins()
        from nvrtc_gather.integrations import vllm_worker
        print(json.dumps({"imported": "vllm.v1.worker.worker_base" in sys.modules,
                          "status": vllm_worker.status()}))
    """, python=PYTHON, timeout=600)
    assert got == {"imported": False, "status": "waiting for vllm.v1.worker.worker_base"}
