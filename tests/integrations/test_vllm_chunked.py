"""The vLLM adapter's chunked-context gathers (issue 27): torch.ops._C_cache_ops.cp_gather_cache
and gather_and_maybe_dequant_cache routed to nvrtc_gather, without vLLM installed (schemas defined
by the adapter, or by a stand-in for vLLM's library). Each scenario runs in a fresh interpreter,
since op registrations are process-wide. test_vllm_real.py repeats the routing with vLLM's own
package; tests/gpu/test_cache_gather_vllm_gpu.py runs the stand-in on CUDA tensors."""
from helpers import vllm_standin as standin
from helpers.fresh_python import run

OWN_SCHEMAS = """
    import dataclasses, json, random, torch
    from helpers.cache_gather_reference import make_case, reference
    from nvrtc_gather.integrations import vllm
    vllm.register(); vllm.register()  # idempotent
    out = {"schemas": vllm.status().schemas, "ops": list(vllm.status().ops)}
    rng = random.Random(3)
    # CPU tensors through torch.ops._C_cache_ops: the adapter's CPU kernel is our op's CPU path
    case = make_case(rng, lens=[12, 0, 75, 30], block_size=16, seq_starts=True, extra_rows=4)
    torch.ops._C_cache_ops.cp_gather_cache(*case.cp_args())
    out["cp_gather_cache"] = torch.equal(case.dst_store, reference(case))
    for fmt, kw in (("fp8", dict(conversion="e4m3_bf16")), ("fp8_e5m2", dict(conversion="e5m2_f32")),
                    ("auto", dict(src_dtype=torch.float16)), ("bfloat16", dict(src_dtype=torch.bfloat16)),
                    ("float16", dict(src_dtype=torch.float16)), ("fp8_ds_mla", dict(conversion="e4m3_f16"))):
        case = make_case(rng, lens=[50, 3, 0, 41], block_size=64, seq_starts=True, extra_rows=9, **kw)
        case = dataclasses.replace(case, num_rows=case.num_rows - 12)
        torch.ops._C_cache_ops.gather_and_maybe_dequant_cache(*case.dequant_args(fmt))
        out[f"dequant {fmt}"] = torch.equal(case.dst_store, reference(case))
    # a kv_cache_dtype outside ours, and no vLLM kernel to hand it to: an error naming the fix
    case = make_case(rng, lens=[9], conversion="e4m3_bf16")
    before = case.dst_store.clone()
    try:
        torch.ops._C_cache_ops.gather_and_maybe_dequant_cache(*case.dequant_args("int8_per_token_head"))
        out["unknown"] = None
    except NotImplementedError as e:
        out["unknown"] = str(e)
    out["unknown unchanged"] = torch.equal(case.dst_store, before)
    # fake CUDA tensors (no GPU needed): the schemas and fake kernels trace
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        src = torch.empty(8, 16, 576, dtype=torch.uint8, device="cuda")
        bt, cu = torch.empty(2, 4, dtype=torch.int32, device="cuda"), torch.empty(3, dtype=torch.int32, device="cuda")
        torch.ops._C_cache_ops.cp_gather_cache(src, torch.empty(40, 576, dtype=torch.uint8, device="cuda"), bt, cu,
                                               2, None)
        torch.ops._C_cache_ops.gather_and_maybe_dequant_cache(
            src, torch.empty(40, 576, dtype=torch.bfloat16, device="cuda"), bt, cu,
            torch.empty(40, dtype=torch.int32, device="cuda"), 30, "fp8", torch.empty(1, device="cuda"), None)
    out["fake"] = True
    print(json.dumps(out))
"""


def test_register_without_vllm_defines_both_schemas_and_routes_to_our_ops():
    got = run(OWN_SCHEMAS)
    assert got["schemas"] == "nvrtc_gather" and got["ops"][-2:] == ["cp_gather_cache", "gather_and_maybe_dequant_cache"]
    assert got["cp_gather_cache"] and got["dequant fp8"] and got["dequant fp8_e5m2"] and got["dequant auto"], got
    # vLLM's other strings, with its meaning: served here, not an error for want of vLLM's kernel
    assert got["dequant bfloat16"] and got["dequant float16"] and got["dequant fp8_ds_mla"], got
    assert got["fake"] and got["unknown unchanged"], got
    assert got["unknown"] == ("nvrtc_gather's gather_and_maybe_dequant_cache does not serve calls with "
                              "kv_cache_dtype='int8_per_token_head', and vLLM's own kernel is not available here; "
                              "set NVRTC_GATHER_VLLM_OPS to leave this op to vLLM"), got


def test_vllm_033s_schemas_run_our_ops_and_hand_other_kv_cache_dtypes_to_vllms_kernel():
    """The calls vLLM's chunked prefill makes (fp8 entries copied; auto / fp8 / fp8_e5m2 dequantized
    into bf16, fp16, fp32; seq_starts; num_tokens below the workspace's rows) run our kernels and
    never vLLM's; a kv_cache_dtype we do not implement reaches vLLM's kernel with all 9 arguments."""
    got = run(standin.snippet("cpu", "0.33"))
    assert got["ops"] == ["cp_gather_cache", "gather_and_maybe_dequant_cache"] and got["left"] == {}, got
    assert got["schemas"] == "vllm" and got["ours"] == {"cp_gather_cache": True, "gather_and_maybe_dequant_cache": True}
    assert got["results"] == standin.expected("0.33"), got


def test_an_older_dequant_gather_schema_is_left_to_vllm_with_why():
    """vLLM's earlier gather_and_maybe_dequant_cache took batch_size where 0.33 takes token_to_seq
    and num_tokens: not ours to reinterpret, so left to vLLM, and status() says why; the
    cp_gather_cache of that schema set (seq_starts with a default) is served."""
    got = run(standin.snippet("cpu", "older"))
    assert got["ops"] == ["cp_gather_cache"], got
    assert got["ours"] == {"cp_gather_cache": True, "gather_and_maybe_dequant_cache": False}, got
    why = got["left"]["gather_and_maybe_dequant_cache"]
    assert why.startswith("vLLM's schema (src_cache, dst, block_table, cu_seq_lens, batch_size, kv_cache_dtype,") \
        and why.endswith("is not one nvrtc_gather implements"), why
    assert got["results"] == standin.expected("older"), got
