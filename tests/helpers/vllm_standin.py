"""A stand-in for vLLM's compiled ``_C_cache_ops`` (stand_in_library; tests/integrations/test_vllm.py's
MLA scenarios use it too), and the scenario of the chunked-context gathers' schemas
(``cp_gather_cache``, ``gather_and_maybe_dequant_cache``), as a snippet for a fresh interpreter
(helpers.fresh_python.run): the CPU test (tests/integrations/test_vllm_chunked.py) and the GPU
test (tests/gpu/test_cache_gather_vllm_gpu.py) run the same one.

The stand-in's CUDA kernels only record their calls: a call we serve must never reach them, and
one we do not serve (a ``kv_cache_dtype`` outside ours) must reach them with every argument.
On "cpu" our CUDA kernel is called boxed through torch's dispatcher table with CPU tensors (no
GPU here: our op then runs its CPU path); on "cuda" the ops are called as vLLM's wrappers call
them. Every result is compared byte for byte with tests/helpers/cache_gather_reference.py."""
import json

# vLLM 0.33.0's schemas (its _C_stable_libtorch library; csrc/libtorch_stable/torch_bindings.cpp)
# and an older pair: cp_gather_cache with a default for seq_starts (served), and a dequantizing
# gather that took batch_size where 0.33 takes token_to_seq and num_tokens (left to vLLM).
SCHEMA_SETS = {
    "0.33": ["cp_gather_cache(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, "
             "int batch_size, Tensor? seq_starts) -> ()",
             "gather_and_maybe_dequant_cache(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, "
             "Tensor token_to_seq, int num_tokens, str kv_cache_dtype, Tensor scale, Tensor? seq_starts) -> ()"],
    "older": ["cp_gather_cache(Tensor src_cache, Tensor! dst, Tensor block_table, Tensor cu_seq_lens, "
              "int batch_size, Tensor? seq_starts=None) -> ()",
              "gather_and_maybe_dequant_cache(Tensor src_cache, Tensor! dst, Tensor block_table, "
              "Tensor cu_seq_lens, int batch_size, str kv_cache_dtype, Tensor scale, "
              "Tensor? seq_starts=None) -> ()"],
}

def stand_in_library(schemas):
    """A ``_C_cache_ops`` library defining ``schemas``, whose CUDA kernels append ``[name,
    number of arguments]`` to the returned list (keep the library alive: dropping it undoes
    the definitions). Registered as vLLM's C++ library registers its kernels: with the
    dispatcher, not through Library.impl's Python bookkeeping."""
    import torch
    stub = torch.library.Library("_C_cache_ops", "DEF")
    calls = []
    for schema in schemas:
        stub.define(schema)
        name = schema.split("(")[0]

        def kernel(*args, _name=name):
            calls.append([_name, len(args)])
        stub.m.impl(name, "CUDA", kernel, False)
    return stub, calls


_SNIPPET = """
    import dataclasses, json, random, torch
    from helpers.cache_gather_reference import make_case, reference
    from helpers.vllm_standin import stand_in_library
    DEVICE, SCHEMAS = __DEVICE__, __SCHEMAS__
    stub, calls = stand_in_library(SCHEMAS)
    from nvrtc_gather.integrations import vllm
    vllm.register(["cp_gather", "dequant_gather"])
    st = vllm.status()
    out = {"ops": list(st.ops), "left": st.left_to_vllm, "schemas": st.schemas}

    def ours(name):
        dump = torch._C._dispatch_dump(f"_C_cache_ops::{name}").splitlines()
        return any(l.startswith("CUDA: registered at") and "integrations/vllm.py" in l for l in dump)
    out["ours"] = {n: ours(n) for n in ("cp_gather_cache", "gather_and_maybe_dequant_cache")}
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)

    def call(name, *args):
        if DEVICE == "cpu":  # our CUDA kernel as the dispatcher holds it, with CPU tensors
            torch.library.get_kernel(f"_C_cache_ops::{name}", "CUDA").call_boxed(ks, *args)
        else:
            getattr(torch.ops._C_cache_ops, name)(*args)
            torch.cuda.synchronize()

    def same(case):
        return torch.equal(case.dst_store.cpu(), reference(case))

    rng = random.Random(27)
    res = {}
    if out["ours"]["cp_gather_cache"]:
        for label, kw in (("fp8 entries, seq_starts, spare rows", dict(lens=[5, 0, 70, 33, 1], seq_starts=True,
                                                                        extra_rows=3)),
                          ("bf16 entries", dict(lens=[40, 17, 0], src_dtype=torch.bfloat16, block_size=64)),
                          ("rows cut", dict(lens=[64, 64, 9], seq_starts=True, cut_rows=20))):
            case = make_case(rng, device=DEVICE, **kw)
            n = len(calls)
            call("cp_gather_cache", *case.cp_args())
            res[f"cp {label}"] = same(case) and len(calls) == n
    if out["ours"]["gather_and_maybe_dequant_cache"]:
        for label, kw, fmt in (("fp8 -> bf16, seq_starts", dict(conversion="e4m3_bf16", seq_starts=True), "fp8"),
                               ("fp8_e4m3 -> fp32", dict(conversion="e4m3_f32"), "fp8_e4m3"),
                               ("fp8_e5m2 -> fp16", dict(conversion="e5m2_f16", seq_starts=True), "fp8_e5m2"),
                               ("auto bf16", dict(src_dtype=torch.bfloat16, seq_starts=True), "auto"),
                               # vLLM's other names (get_fp8_kv_cache_data_type): copies, and e4m3
                               ("bfloat16 bf16", dict(src_dtype=torch.bfloat16), "bfloat16"),
                               ("float16 fp16", dict(src_dtype=torch.float16, seq_starts=True), "float16"),
                               ("fp8_ds_mla -> bf16", dict(conversion="e4m3_bf16"), "fp8_ds_mla")):
            case = make_case(rng, lens=[33, 0, 90, 7], block_size=16, extra_rows=6, device=DEVICE, **kw)
            case = dataclasses.replace(case, num_rows=case.num_rows - 10)  # num_tokens below dst.size(0)
            n = len(calls)
            call("gather_and_maybe_dequant_cache", *case.dequant_args(fmt))
            res[f"dequant {label}"] = same(case) and len(calls) == n
        # a kv_cache_dtype we do not serve: vLLM's own kernel, every argument, nothing written by us
        case = make_case(rng, lens=[20, 3], conversion="e4m3_bf16", device=DEVICE)
        before = case.dst_store.clone()
        call("gather_and_maybe_dequant_cache", *case.dequant_args("fp8_inc"))
        res["fp8_inc to vllm"] = calls[-1:] == [["gather_and_maybe_dequant_cache", 9]] and \\
            torch.equal(case.dst_store, before)
    out["results"] = res
    print(json.dumps(out))
"""


def snippet(device: str, schema_set: str) -> str:
    """The stand-in scenario on ``device`` ("cpu" or "cuda") with vLLM's ``schema_set`` schemas."""
    return _SNIPPET.replace("__DEVICE__", repr(device)).replace("__SCHEMAS__", json.dumps(SCHEMA_SETS[schema_set]))


def expected(schema_set: str) -> dict:
    """What the scenario prints when the adapter does its job."""
    cp = {"cp fp8 entries, seq_starts, spare rows": True, "cp bf16 entries": True, "cp rows cut": True}
    dequant = {"dequant fp8 -> bf16, seq_starts": True, "dequant fp8_e4m3 -> fp32": True,
               "dequant fp8_e5m2 -> fp16": True, "dequant auto bf16": True, "dequant bfloat16 bf16": True,
               "dequant float16 fp16": True, "dequant fp8_ds_mla -> bf16": True, "fp8_inc to vllm": True}
    return cp | dequant if schema_set == "0.33" else cp
