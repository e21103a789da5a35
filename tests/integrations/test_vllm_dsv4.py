"""vLLM's DeepSeek-V4 ``dequantize_and_gather_k_cache`` replaced by the plugin where the loaded
vLLM keeps it (integrations/vllm_dsv4.py), on a stand-in vLLM tree on disk in each layout
(tests/helpers/vllm_dsv4_standin.py): the replacement lands in the home and in the backends that
bind it, whether they are imported after the plugin (vLLM's order) or before; calls we do not
serve reach vLLM's function with their arguments; opt-out; the log lines; unregister; releases
without the function; layouts we do not know are left alone, with a warning. CPU only: calls
we serve run our CPU path, compared byte for byte with tests/helpers/dsv4_reference.py."""
import textwrap

import pytest

from helpers import vllm_dsv4_standin as standin
from helpers.fresh_python import run

# A process that runs vLLM: vLLM's logger has a handler (vllm/logger.py), the plugin runs, then
# the scenario's BODY. Prints {"status": ..., "log": ..., **res} last.
PRELUDE = """
    import dataclasses, io, json, logging, sys, torch
    log = io.StringIO()
    logging.getLogger("vllm").addHandler(logging.StreamHandler(log))
    logging.getLogger("vllm").setLevel(logging.INFO)
    logging.getLogger("vllm").propagate = False
    import vllm  # the stand-in package
    from nvrtc_gather.integrations import vllm as adapter, vllm_dsv4
    import nvrtc_gather.ops.dsv4_gather as ours
    res = {}

    def who(f):  # ours (functools.wraps copies vLLM's __module__), or the module defining it
        return "ours" if f.__code__.co_filename.endswith("vllm_dsv4.py") else f.__module__
""" + standin.CASE
REPORT = """
    st = dataclasses.asdict(adapter.status())
    print(json.dumps({"status": st, "log": log.getvalue(), **res}))
"""
OURS = "ours"


def _run(tmp_path, layout, body, **env):
    root = standin.build(str(tmp_path), layout)
    return run("".join(textwrap.dedent(part) for part in (PRELUDE, body, REPORT)), path=[root], **env)


def test_the_plugin_before_vllm_imports_the_backends_replaces_it_where_they_bind_it(tmp_path):
    got = _run(tmp_path, "0.33", """
        adapter.plugin()
        res["before"] = vllm_dsv4.status()
        import vllm.models.deepseek_v4  # imports the NVIDIA backend, which binds the function
        import vllm.models.deepseek_v4.amd.rocm, vllm.models.deepseek_v4.xpu.xpu_sparse  # later importers
        from vllm.models.deepseek_v4.common.ops import cache_utils
        from vllm.models.deepseek_v4.nvidia import flashmla
        res["where"] = {n: who(getattr(sys.modules[n], "dequantize_and_gather_k_cache")) for n in
                        ("vllm.models.deepseek_v4.common.ops", "vllm.models.deepseek_v4.common.ops.cache_utils",
                         *__IMPORTERS__)}
        args, want = case("cpu")
        flashmla.call(*args[:2], seq_lens=args[2], gather_lens=args[3], block_table=args[4], block_size=args[5],
                      offset=args[6])  # as flashmla.py calls it
        res["bytes"] = torch.equal(args[0].view(torch.int16), want.view(torch.int16))
        args, want = case("cpu", with_gather_lens=False, offset=0, bs=64)
        vllm.models.deepseek_v4.amd.rocm.call(*args, use_fnuz=False)
        res["bytes, no gather_lens"] = torch.equal(args[0].view(torch.int16), want.view(torch.int16))
        res["vllm calls"] = cache_utils.CALLS
    """.replace("__IMPORTERS__", repr(standin.NEW_IMPORTERS)))
    assert got["before"] == {"state": "waiting for vllm.models.deepseek_v4.common.ops",
                             "home": "vllm.models.deepseek_v4.common.ops", "modules": [], "left_to_vllm": {}}
    assert set(got["where"].values()) == {OURS}, got["where"]
    assert got["bytes"] and got["bytes, no gather_lens"] and got["vllm calls"] == [], got
    st = got["status"]
    assert st["ops"][-1] == "dequantize_and_gather_k_cache" and st["registered"], st
    assert st["dsv4_gather"]["state"] == "replaced" and set(st["dsv4_gather"]["modules"]) == set(got["where"]), st
    assert ("nvrtc_gather: vLLM's dequantize_and_gather_k_cache (vllm.models.deepseek_v4.common.ops, DeepSeek-V4) "
            "now runs nvrtc_gather's kernel on CUDA tensors") in got["log"], got["log"]
    assert st["preload"] == "waiting for vllm.v1.worker.worker_base"


def test_importers_loaded_before_the_plugin_are_patched_too(tmp_path):
    got = _run(tmp_path, "0.33", """
        import vllm.models.deepseek_v4.nvidia.flashmla as flashmla
        import vllm.models.deepseek_v4.common.ops as home
        original = home.dequantize_and_gather_k_cache
        res["returned"] = adapter.register("dsv4_gather")
        res["patched"] = [who(m.dequantize_and_gather_k_cache) for m in (home, flashmla, home.cache_utils)]
        res["kept"] = vllm_dsv4.status()["state"] == "replaced" and \\
            flashmla.dequantize_and_gather_k_cache.__wrapped__ is original
        args, want = case("cpu")
        flashmla.call(*args)
        res["bytes"] = torch.equal(args[0].view(torch.int16), want.view(torch.int16)) and home.CALLS == []
    """)
    assert got["returned"] == ["dequantize_and_gather_k_cache"] and got["patched"] == [OURS] * 3, got
    assert got["kept"] and got["bytes"], got
    assert got["status"]["activated_by"] == "register()" and got["status"]["ops"] == ["dequantize_and_gather_k_cache"]


def test_calls_we_do_not_serve_reach_vllms_function_and_the_reason_is_said_once(tmp_path):
    got = _run(tmp_path, "0.33", """
        adapter.plugin()
        from vllm.models.deepseek_v4.nvidia import flashmla
        from vllm.models.deepseek_v4.common.ops import CALLS
        args, _ = case("cpu")
        untouched = args[0].clone()
        flashmla.call(*args, use_fnuz=True)
        flashmla.call(*args, True)  # positional, as well
        meta = [t.to("meta") if t is not None else None for t in args[:5]] + args[5:]
        flashmla.call(*meta)
        fp32 = [args[0].float()] + args[1:]
        flashmla.call(*fp32)
        i64 = args[:2] + [args[2].long()] + args[3:]
        flashmla.call(*i64)
        v41 = [args[0], torch.zeros(4, 16, 528, dtype=torch.uint8)] + args[2:]  # V4.1's MXFP8 record
        flashmla.call(*v41)
        res["calls"] = CALLS
        res["untouched"] = torch.equal(args[0].view(torch.int16), untouched.view(torch.int16))
    """)
    calls = got["calls"]
    assert [c.get("use_fnuz") for c in calls] == [True, True, False, False, False, False], calls
    assert [c["k_cache"] for c in calls] == ["cpu", "cpu", "meta", "cpu", "cpu", "cpu"], calls
    assert calls[3]["out"] == "torch.float32" and all(c["offset"] == 3 and c["block_size"] == 16 for c in calls)
    assert got["untouched"], got
    left = got["status"]["dsv4_gather"]["left_to_vllm"]
    assert sorted(left) == sorted(["use_fnuz=True (ROCm's fnuz fp8)", "meta tensors", "out of dtype torch.float32",
                                   "index tensors other than int32",
                                   "k_cache other than uint8 [num_blocks, block_size, 584]"]), left
    assert got["log"].count("with use_fnuz=True (ROCm's fnuz fp8) goes to vLLM's own function") == 1, got["log"]
    assert got["log"].count("goes to vLLM's own function") == 5, got["log"]


def test_opted_out_it_stays_vllms(tmp_path):
    got = _run(tmp_path, "0.33", """
        adapter.plugin()
        import vllm.models.deepseek_v4
        from vllm.models.deepseek_v4.nvidia import flashmla
        from vllm.models.deepseek_v4.common.ops import cache_utils
        res["vllms"] = flashmla.dequantize_and_gather_k_cache is cache_utils.dequantize_and_gather_k_cache and \\
            who(flashmla.dequantize_and_gather_k_cache) == cache_utils.__name__
        res["hook"] = any(type(f).__name__ == "_ImportHook" and type(f).__module__ == vllm_dsv4.__name__
                          for f in sys.meta_path)
    """, NVRTC_GATHER_VLLM_OPS="gather,quant")
    assert got["vllms"] and not got["hook"], got
    assert got["status"]["ops"] == ["cp_gather_indexer_k_quant_cache", "indexer_k_quant_and_cache"]
    assert got["status"]["dsv4_gather"]["state"] == "not installed"
    assert "dequantize_and_gather_k_cache" not in got["log"], got["log"]


def test_the_opt_out_name_is_dsv4_gather(tmp_path):
    got = _run(tmp_path, "0.33", """
        adapter.plugin()
        import vllm.models.deepseek_v4
    """, NVRTC_GATHER_VLLM_OPS="dsv4_gather")
    assert got["status"]["ops"] == ["dequantize_and_gather_k_cache"], got["status"]
    assert got["status"]["dsv4_gather"]["state"] == "replaced"


@pytest.mark.parametrize("when", ["before import", "after import"])
def test_unregister_gives_vllm_its_function_back(tmp_path, when):
    got = _run(tmp_path, "0.33", """
        if __AFTER__:
            import vllm.models.deepseek_v4
        adapter.register(["dsv4_gather"])
        vllm_dsv4.unregister()
        import vllm.models.deepseek_v4
        import vllm.models.deepseek_v4.xpu.xpu_sparse, vllm.models.deepseek_v4.amd.rocm
        from vllm.models.deepseek_v4.common.ops import cache_utils
        names = [getattr(sys.modules[n], "dequantize_and_gather_k_cache") for n in
                 ("vllm.models.deepseek_v4.common.ops", *__IMPORTERS__)]
        res["vllms"] = all(f is cache_utils.dequantize_and_gather_k_cache for f in names) and \\
            who(cache_utils.dequantize_and_gather_k_cache) == cache_utils.__name__
        res["dsv4"] = vllm_dsv4.status()
    """.replace("__AFTER__", str(when == "after import")).replace("__IMPORTERS__",
                                                                   repr(standin.NEW_IMPORTERS)))
    assert got["vllms"], got
    assert got["dsv4"] == {"state": "not installed", "home": None, "modules": [], "left_to_vllm": {}}
    assert "dequantize_and_gather_k_cache" not in got["status"]["ops"]


def test_vllm_0_21_keeps_it_in_the_older_home_without_use_fnuz(tmp_path):
    got = _run(tmp_path, "0.21", """
        adapter.plugin()
        import vllm.model_executor.layers.deepseek_v4_attention as attn
        from vllm.v1.attention.ops.deepseek_v4_ops import CALLS
        res["ours"] = who(attn.dequantize_and_gather_k_cache)
        args, want = case("cpu")
        attn.call(*args)
        res["bytes"] = torch.equal(args[0].view(torch.int16), want.view(torch.int16)) and CALLS == []
        attn.call(*[t.to("meta") if t is not None else None for t in args[:5]], *args[5:])
        res["calls"] = CALLS  # no use_fnuz passed on: 0.21's function has none
    """)
    assert got["ours"] == OURS and got["bytes"], got
    assert got["calls"] == [{"k_cache": "meta", "out": "torch.bfloat16", "block_size": 16, "offset": 3}], got
    assert got["status"]["dsv4_gather"]["home"] == "vllm.v1.attention.ops.deepseek_v4_ops"
    assert "(vllm.v1.attention.ops.deepseek_v4_ops, DeepSeek-V4) now runs" in got["log"], got["log"]


def test_a_vllm_without_deepseek_v4_is_left_alone_quietly(tmp_path):
    got = _run(tmp_path, "0.19", """
        adapter.plugin()
        res["hook"] = any(type(f).__module__ == vllm_dsv4.__name__ for f in sys.meta_path)
    """)
    assert not got["hook"] and "dequantize_and_gather_k_cache" not in got["status"]["ops"], got
    assert got["status"]["dsv4_gather"]["state"] == "no DeepSeek-V4 in this vLLM"
    assert "dequantize_and_gather_k_cache" not in got["log"] and "DeepSeek-V4" not in got["log"], got["log"]


def test_v4_files_without_a_known_home_are_left_alone_with_a_warning(tmp_path):
    got = _run(tmp_path, "moved", """
        adapter.plugin()
    """)
    state = got["status"]["dsv4_gather"]["state"]
    assert state == ("left to vLLM: this vLLM has DeepSeek-V4 files but none of vllm.models.deepseek_v4.common.ops, "
                     "vllm.v1.attention.ops.deepseek_v4_ops"), state
    assert "nvrtc_gather: vLLM's dequantize_and_gather_k_cache left to vLLM: this vLLM has DeepSeek-V4 files" \
        in got["log"], got["log"]
    assert "dequantize_and_gather_k_cache" not in got["status"]["ops"]


def test_a_home_without_the_function_is_left_alone_with_a_warning(tmp_path):
    got = _run(tmp_path, "renamed", """
        adapter.plugin()
        import vllm.models.deepseek_v4.common.ops as home
        res["vllms"] = home.dequant_v2 is home.cache_utils.dequantize_and_gather_k_cache and \\
            who(home.dequant_v2) == home.cache_utils.__name__
    """)
    assert got["vllms"], got
    assert got["status"]["dsv4_gather"]["state"] == ("left to vLLM: vllm.models.deepseek_v4.common.ops has no "
                                                     "dequantize_and_gather_k_cache (a layout nvrtc_gather does not "
                                                     "know)"), got["status"]
    assert "dequantize_and_gather_k_cache left to vLLM: vllm.models.deepseek_v4.common.ops has no" in got["log"]
    assert "dequantize_and_gather_k_cache" not in got["status"]["ops"]
