"""The vLLM adapter: torch.ops._C_cache_ops.* routed to nvrtc_gather, without vLLM installed.
Each scenario runs in a fresh interpreter, since op registrations are process-wide."""
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers/ importable


def run(code: str, **env) -> dict:
    """Run ``code`` in a fresh interpreter (tests/ on its path); it prints one JSON line last."""
    full_env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"} | env
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env=full_env | {"PYTHONPATH": TESTS + os.pathsep + os.environ.get("PYTHONPATH", "")},
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


CPU_BYTES = """
    import json, random, torch, nvrtc_gather as ng
    from nvrtc_gather.integrations import vllm
    from helpers.reference import make_gather_case, make_quant_case, gather_reference
    vllm.register(); vllm.register()  # idempotent
    out = {}
    rng = random.Random(5)
    # write op: every scale_fmt but "ue8m0" is plain fp32 scales, as in vLLM's kernel
    for fmt, ours in (("ue8m0", "ue8m0"), ("fp8_e4m3", None), ("other", None), ("", None)):
        case = make_quant_case(rng, head_dim=128, quant_block_size=64, block_size=16, dtype=torch.bfloat16,
                               scale_fmt="ue8m0", num_tokens=30)
        a, b = case.kv_cache.clone(), case.kv_cache.clone()
        torch.ops._C_cache_ops.indexer_k_quant_and_cache(case.k, a, case.slot_mapping, 64, fmt)
        ng.indexer_k_quant_and_cache(case.k, b, case.slot_mapping, 64, ours)
        out[f"quant {fmt!r}"] = torch.equal(a, b) and not torch.equal(a, case.kv_cache)
    case = make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=5, max_len=200)
    k_ref, s_ref = gather_reference(case.kv_cache, case.block_table, case.cu_seq_lens, case.dst_k.size(0),
                                    case.head_dim, case.scale_words)
    torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache(*case.args())
    out["gather"] = torch.equal(case.dst_k.view(torch.uint8), k_ref) and torch.equal(case.dst_scale.view(torch.uint8), s_ref)
    # fake CUDA tensors (no GPU needed): the schema and fake kernel trace
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        kv = torch.empty(4, 64, 132, dtype=torch.uint8, device="cuda")
        torch.ops._C_cache_ops.indexer_k_quant_and_cache(torch.empty(8, 128, dtype=torch.bfloat16, device="cuda"),
                                                         kv, torch.empty(8, dtype=torch.int64, device="cuda"), 128, "ue8m0")
        torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache(
            kv, torch.empty(9, 128, dtype=torch.uint8, device="cuda"), torch.empty(9, 4, dtype=torch.uint8, device="cuda"),
            torch.empty(2, 3, dtype=torch.int32, device="cuda"), torch.empty(3, dtype=torch.int32, device="cuda"))
    out["fake"] = True
    dump = torch._C._dispatch_dump("_C_cache_ops::cp_gather_indexer_k_quant_cache")
    out["cuda_kernel_is_ours"] = any(l.startswith("CUDA: registered at") and "integrations/vllm.py" in l
                                     for l in dump.splitlines())
    print(json.dumps(out))
"""


def test_register_without_vllm_defines_the_schemas_and_routes_to_our_ops():
    got = run(CPU_BYTES)
    assert got == {"quant 'ue8m0'": True, "quant 'fp8_e4m3'": True, "quant 'other'": True, "quant ''": True,
                   "gather": True, "fake": True, "cuda_kernel_is_ours": True}


OVERRIDE = """
    import json, torch, logging
    logging.basicConfig(level=logging.INFO)
    # A stand-in for vLLM's compiled library: its schemas, kernels that must never run.
    stub = torch.library.Library("_C_cache_ops", "DEF")
    stub.define("cp_gather_indexer_k_quant_cache(Tensor kv_cache, Tensor! dst_k, Tensor! dst_scale, "
                "Tensor block_table, Tensor cu_seq_lens) -> ()")
    stub.define("indexer_k_quant_and_cache(Tensor k, Tensor! kv_cache, Tensor slot_mapping, "
                "int quant_block_size, str kv_cache_dtype) -> ()")
    def stub_kernel(*args):
        raise RuntimeError("vLLM's stub kernel ran")
    for name in ("cp_gather_indexer_k_quant_cache", "indexer_k_quant_and_cache"):
        # vLLM's kernels are registered from C++; torch < 2.13 refuses to override a kernel that
        # another Python Library registered, so the stand-in registers its kernels as C++ does,
        # straight with the dispatcher (not through Library.impl's Python bookkeeping).
        stub.m.impl(name, "CUDA", stub_kernel, False)
        stub.m.impl(name, "CPU", stub_kernel, False)
    from nvrtc_gather.integrations import vllm
    vllm.register()
    out = {}
    for name in ("cp_gather_indexer_k_quant_cache", "indexer_k_quant_and_cache"):
        dump = torch._C._dispatch_dump(f"_C_cache_ops::{name}").splitlines()
        out[name] = [l.split(":")[0] + (" ours" if "integrations/vllm.py" in l else " stub")
                     for l in dump if " registered at " in l and l.split(":")[0] in ("CPU", "CUDA")]
    print(json.dumps(out))
"""


def test_register_overrides_an_existing_libraries_cuda_kernels_only():
    got = run(OVERRIDE)
    for name in ("cp_gather_indexer_k_quant_cache", "indexer_k_quant_and_cache"):
        assert got[name] == ["CPU stub", "CUDA ours"], got


PLUGIN = """
    import json, torch
    from importlib import metadata
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "nvrtc_gather"]
    eps[0].load()()  # what vLLM's load_general_plugins does
    try:
        torch._C._dispatch_find_schema_or_throw("_C_cache_ops::indexer_k_quant_and_cache", "")
        registered = True
    except RuntimeError:
        registered = False
    print(json.dumps({"entry_point": eps[0].value, "registered": registered}))
"""


def test_plugin_entry_point_is_declared_and_on_by_default():
    """vLLM calls every installed general plugin unless VLLM_PLUGINS leaves it out; ours then
    replaces the ops unless NVRTC_GATHER_VLLM turns it off (integrations/activation.py)."""
    try:
        metadata.version("nvrtc-gather")
    except metadata.PackageNotFoundError:
        pytest.skip("nvrtc-gather is not installed here (a checkout on PYTHONPATH has no entry points)")
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "nvrtc_gather"]
    if not eps:
        pytest.fail("the vllm.general_plugins entry point nvrtc_gather is not installed (reinstall the package)")
    assert run(PLUGIN) == {"entry_point": "nvrtc_gather.integrations.vllm:plugin", "registered": True}
    assert run(PLUGIN, NVRTC_GATHER_VLLM="0")["registered"] is False


MXFP8 = """
    import json, random, torch, nvrtc_gather as ng
    from nvrtc_gather.integrations import vllm
    from helpers.reference import make_quant_case
    vllm.register()
    out = {}
    rng = random.Random(7)
    for dtype in (torch.bfloat16, torch.float32):
        case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=16, dtype=dtype,
                               scale_fmt="ue8m0", num_tokens=50, block_pad=12)
        got, want = case.kv_cache.clone(), case.kv_cache.clone()
        torch.ops._C_cache_ops.indexer_k_quant_and_cache(case.k, got, case.slot_mapping, 128, "mxfp8")
        # vLLM's mxfp8: the ue8m0 write, each written token's fp32 scale replaced by its exponent
        # byte four times (vllm/v1/attention/ops/common.py: pack_ue8m0_x4), read here per slot.
        ng.indexer_k_quant_and_cache(case.k, want, case.slot_mapping, 128, "ue8m0")
        bs, cs = want.shape[1], want.shape[2]
        flat = want.view(want.size(0), -1) if want.is_contiguous() else None
        for s in case.slot_mapping.tolist():
            if s < 0:
                continue
            b, t = divmod(s, bs)
            word = want[b].reshape(-1)[bs * 128 + 4 * t: bs * 128 + 4 * t + 4]
            bits = int.from_bytes(bytes(word.tolist()), "little")
            want[b].reshape(-1)[bs * 128 + 4 * t: bs * 128 + 4 * t + 4] = (bits >> 23) & 0xFF
        out[str(dtype)] = torch.equal(got, want)
        out[str(dtype) + " changed"] = not torch.equal(got, case.kv_cache)
    # padding only: nothing written
    case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=16, dtype=torch.bfloat16,
                           scale_fmt="ue8m0", num_tokens=5)
    kv = case.kv_cache.clone()
    torch.ops._C_cache_ops.indexer_k_quant_and_cache(case.k, kv, torch.full((5,), -1, dtype=torch.int64), 128, "mxfp8")
    out["all padding"] = torch.equal(kv, case.kv_cache)
    # vLLM's own condition: head_dim == quant_block_size == 128, refused before writing
    case = make_quant_case(rng, head_dim=128, quant_block_size=64, block_size=16, dtype=torch.bfloat16,
                           scale_fmt="ue8m0", num_tokens=5)
    kv = case.kv_cache.clone()
    try:
        torch.ops._C_cache_ops.indexer_k_quant_and_cache(case.k, kv, case.slot_mapping, 64, "mxfp8")
        out["error"] = None
    except ValueError as e:
        out["error"] = str(e)
    out["unchanged"] = torch.equal(kv, case.kv_cache)
    print(json.dumps(out))
"""


def test_mxfp8_scales_are_vllms_packed_ue8m0_bytes():
    """vLLM 0.33 passes kv_cache_dtype="mxfp8" on SM100 (sparse_attn_indexer.py): power-of-two
    scales stored as four UE8M0 bytes. Plain fp32 scales there would be read as garbage."""
    got = run(MXFP8)
    assert got == {"torch.bfloat16": True, "torch.bfloat16 changed": True, "torch.float32": True,
                   "torch.float32 changed": True, "all padding": True, "unchanged": True,
                   "error": "kv_cache_dtype: \"mxfp8\" scales require head_dim == quant_block_size == 128 (as vLLM's "
                            "op), got head_dim=128, quant_block_size=64"}, got


GPU_OVERRIDE = OVERRIDE.replace("    print(json.dumps(out))\n", "") + """
    import random, nvrtc_gather as ng
    from helpers.reference import make_gather_case, make_quant_case, gather_reference
    rng = random.Random(11)
    res = {}
    for fmt, ours in (("ue8m0", "ue8m0"), ("fp8e4m3", None)):
        case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=torch.bfloat16,
                               scale_fmt="ue8m0", num_tokens=300)
        k, sm = case.k.cuda(), case.slot_mapping.cuda()
        a, b = case.kv_cache.cuda(), case.kv_cache.clone()
        torch.ops._C_cache_ops.indexer_k_quant_and_cache(k, a, sm, 128, fmt)
        ng.indexer_k_quant_and_cache(case.k, b, case.slot_mapping, 128, ours)  # CPU path
        res[f"quant {fmt}"] = torch.equal(a.cpu(), b)
    # mxfp8 (vLLM 0.33 on SM100): the GPU write and repack against the same op's CPU path
    case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=torch.bfloat16,
                           scale_fmt="ue8m0", num_tokens=300, block_pad=16)
    a, b = case.kv_cache.cuda(), case.kv_cache.clone()
    torch.ops._C_cache_ops.indexer_k_quant_and_cache(case.k.cuda(), a, case.slot_mapping.cuda(), 128, "mxfp8")
    from nvrtc_gather.integrations import mx_scales
    ng.indexer_k_quant_and_cache(case.k, b, case.slot_mapping, 128, "ue8m0")
    mx_scales.pack_written_scales(b, case.slot_mapping)
    res["quant mxfp8"] = torch.equal(a.cpu(), b) and not torch.equal(b, case.kv_cache)
    case = make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=9, max_len=700)
    k_ref, s_ref = gather_reference(case.kv_cache, case.block_table, case.cu_seq_lens, case.dst_k.size(0),
                                    case.head_dim, case.scale_words)
    args = [t.cuda() for t in case.args()]
    torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache(*args)
    res["gather"] = torch.equal(args[1].view(torch.uint8).cpu(), k_ref) and \\
        torch.equal(args[2].view(torch.uint8).cpu(), s_ref)
    print(json.dumps(res))
"""


@pytest.mark.gpu
def test_override_runs_our_kernels_on_the_gpu_bit_exact():
    assert run(GPU_OVERRIDE) == {"quant ue8m0": True, "quant fp8e4m3": True, "quant mxfp8": True, "gather": True}


MLA_STUB = """
    import json, logging, torch
    # A stand-in for vLLM's compiled library with the MLA ops' schemas of SCHEMA_SET; its kernels
    # record their calls (vLLM's own kernel is where the calls we do not serve must go).
    schemas = {
        "0.33": ["concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor! kv_cache, Tensor slot_mapping, "
                 "str kv_cache_dtype, Tensor scale, bool skip_scale=False) -> ()",
                 "cp_gather_and_upconvert_fp8_kv_cache(Tensor src_cache, Tensor! dst, Tensor block_table, "
                 "Tensor workspace_starts, int batch_size, Tensor? seq_starts, Tensor? host_cache=None, "
                 "Tensor? host_row_ids=None, Tensor? device_row_ids=None) -> ()"],
        "older": ["concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor! kv_cache, Tensor slot_mapping, "
                  "str kv_cache_dtype, Tensor scale) -> ()",
                  "cp_gather_and_upconvert_fp8_kv_cache(Tensor src_cache, Tensor! dst, Tensor block_table, "
                  "Tensor seq_lens, Tensor workspace_starts, int batch_size) -> ()"],
    }["SCHEMA_SET"]
    from helpers.vllm_standin import stand_in_library
    stub, calls = stand_in_library(schemas)
    from nvrtc_gather.integrations import vllm
    vllm.register(["mla_write", "mla_gather"])
    import nvrtc_gather as ng
    out = {"status": vllm.status().ops, "left": vllm.status().left_to_vllm}
    def ours(name):
        dump = torch._C._dispatch_dump(f"_C_cache_ops::{name}").splitlines()
        return any(l.startswith("CUDA: registered at") and "integrations/vllm.py" in l for l in dump)
    out["ours"] = {n: ours(n) for n in ("concat_and_cache_mla", "cp_gather_and_upconvert_fp8_kv_cache")}
    # Our CUDA kernel as torch's dispatcher holds it, called boxed with CPU tensors (no GPU here):
    # a call we serve runs our op (here its CPU path), the others reach vLLM's kernel.
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    kv_c, k_pe = torch.randn(5, 512).bfloat16(), torch.randn(5, 64).bfloat16()
    cache, want = torch.zeros(2, 4, 656, dtype=torch.uint8), torch.zeros(2, 4, 656, dtype=torch.uint8)
    slots = torch.tensor([0, 3, 4, -1, 7])
    write = torch.library.get_kernel("_C_cache_ops::concat_and_cache_mla", "CUDA")
    write.call_boxed(ks, kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1), *EXTRA_WRITE)
    ng.concat_and_cache_mla(kv_c, k_pe, want, slots, "fp8_ds_mla", torch.ones(1))
    out["write ours"] = torch.equal(cache, want) and not calls
    write.call_boxed(ks, kv_c, k_pe, cache, slots, "fp8_e5m2", torch.ones(1), *EXTRA_WRITE)
    # (torch drops trailing arguments equal to their defaults when it calls a Python kernel: 6 here)
    out["e5m2 to vllm"] = calls[-1:] == [["concat_and_cache_mla", 6]] and torch.equal(cache, want)
    if out["ours"]["cp_gather_and_upconvert_fp8_kv_cache"]:
        gather = torch.library.get_kernel("_C_cache_ops::cp_gather_and_upconvert_fp8_kv_cache", "CUDA")
        bt, ws = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
        dst, ref = torch.zeros(8, 576, dtype=torch.bfloat16), torch.zeros(8, 576, dtype=torch.bfloat16)
        n = len(calls)
        gather.call_boxed(ks, cache, dst, bt, ws, 1, None, None, None, None)
        ng.cp_gather_and_upconvert_fp8_kv_cache(cache, ref, bt, ws, 1)
        out["gather ours"] = torch.equal(dst.view(torch.int16), ref.view(torch.int16)) and len(calls) == n
        rows = torch.arange(8, dtype=torch.int32)
        gather.call_boxed(ks, cache, dst, bt, ws, 1, None, cache.view(-1, 656), rows, rows)
        out["host offload to vllm"] = calls[-1:] == [["cp_gather_and_upconvert_fp8_kv_cache", 9]]
    print(json.dumps(out))
"""


def test_mla_ops_follow_vllm_033s_schemas_and_hand_what_they_do_not_serve_to_vllms_kernel():
    """vLLM 0.33's schemas (skip_scale; the gather's host-offload arguments): our kernels serve
    the calls they implement, and HiSparse's host-offload form and formats we do not write
    (fp8_e5m2) reach vLLM's own kernel, fetched before the override, with every argument."""
    got = run(MLA_STUB.replace("SCHEMA_SET", "0.33").replace("EXTRA_WRITE", "[False]"))
    assert got["status"] == ["concat_and_cache_mla", "cp_gather_and_upconvert_fp8_kv_cache"] and not got["left"], got
    assert got["ours"] == {"concat_and_cache_mla": True, "cp_gather_and_upconvert_fp8_kv_cache": True}, got
    assert got["write ours"] and got["e5m2 to vllm"] and got["gather ours"] and got["host offload to vllm"], got


def test_mla_ops_of_an_older_vllm_the_write_served_the_seq_lens_gather_left_to_vllm_with_why():
    got = run(MLA_STUB.replace("SCHEMA_SET", "older").replace("EXTRA_WRITE", "[]"))
    assert got["status"] == ["concat_and_cache_mla"], got
    assert got["ours"] == {"concat_and_cache_mla": True, "cp_gather_and_upconvert_fp8_kv_cache": False}, got
    assert "seq_lens" in got["left"]["cp_gather_and_upconvert_fp8_kv_cache"], got
    assert got["write ours"] and got["e5m2 to vllm"], got


GPU_MLA_OVERRIDE = MLA_STUB.replace("SCHEMA_SET", "0.33").replace("EXTRA_WRITE", "[False]").replace(
    "    print(json.dumps(out))\n", "") + """
    # The same routing on CUDA tensors, through torch's dispatcher as vLLM's wrappers call it.
    gen = torch.Generator().manual_seed(5)
    kv_c = (torch.randn(300, 512, generator=gen) * 20).bfloat16()
    k_pe = torch.randn(300, 64, generator=gen).bfloat16()
    slots = torch.randperm(16 * 64, generator=gen)[:300]
    slots[7] = -1
    cache = torch.full((16, 64, 656), 0xA5, dtype=torch.uint8)
    want = cache.clone()
    ng.concat_and_cache_mla(kv_c, k_pe, want, slots, "fp8_ds_mla", torch.ones(1))  # CPU path
    got = cache.cuda()
    n = len(calls)
    torch.ops._C_cache_ops.concat_and_cache_mla(kv_c.cuda(), k_pe.cuda(), got, slots.cuda(), "fp8_ds_mla",
                                                torch.ones(1, device="cuda"), False)
    res = {"cuda write": torch.equal(got.cpu(), want) and len(calls) == n}
    bt = torch.randperm(16, generator=gen).to(torch.int32).view(4, 4)
    ws = torch.tensor([0, 100, 100, 180], dtype=torch.int32)
    rows = torch.zeros(250, 576, dtype=torch.bfloat16)
    ng.cp_gather_and_upconvert_fp8_kv_cache(want, rows, bt, ws, 4, None)  # CPU path
    got_rows = torch.zeros(250, 576, dtype=torch.bfloat16, device="cuda")
    torch.ops._C_cache_ops.cp_gather_and_upconvert_fp8_kv_cache(got.cuda(), got_rows, bt.cuda(), ws.cuda(), 4, None)
    res["cuda gather"] = torch.equal(got_rows.cpu().view(torch.int16), rows.view(torch.int16)) and len(calls) == n
    ids = torch.arange(16 * 64, dtype=torch.int32, device="cuda")
    torch.ops._C_cache_ops.cp_gather_and_upconvert_fp8_kv_cache(got, got_rows, bt.cuda(), ws.cuda(), 4, None,
                                                                got.view(-1, 656), ids, ids)
    res["cuda host offload to vllm"] = calls[-1:] == [["cp_gather_and_upconvert_fp8_kv_cache", 9]]
    torch.cuda.synchronize()
    print(json.dumps(res))
"""


@pytest.mark.gpu
def test_mla_override_runs_our_kernels_on_the_gpu_and_hands_host_offload_to_vllm():
    """vLLM 0.33's MLA schemas on a stand-in library: torch.ops._C_cache_ops on CUDA tensors runs
    our kernels, bit-exact with the CPU path, and the host-offload gather reaches vLLM's kernel."""
    assert run(GPU_MLA_OVERRIDE) == {"cuda write": True, "cuda gather": True, "cuda host offload to vllm": True}
