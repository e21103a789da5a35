"""vLLM 0.33's MXFP4 indexer cache gathered by ``cp_gather_indexer_k_quant_cache`` (issue 25,
item 4; docs/contract.md, "MXFP4 indexer cache"): dst_k uint8 [T, 64], dst_scale uint8 [T, 4],
68-byte tokens split per block, byte-exact against each token's own record
(tests/helpers/mxfp4_cache.py), block sizes 16 and 64, ragged requests with empty ones, rows past
the last token untouched. On CPU through the op and through the vLLM adapter's op;
tests/emulator/test_gather_emulated.py and tests/gpu/test_mxfp4_cache_gpu.py run the kernel."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers.fresh_python import run
from helpers.mxfp4_cache import make_mxfp4_case, ragged_lens


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("seed", range(4))
def test_gather_of_the_mxfp4_layout_is_byte_exact(block_size, seed):
    rng = random.Random(f"mxfp4-{block_size}-{seed}")
    case = make_mxfp4_case(rng, block_size=block_size, lens=ragged_lens(rng, block_size),
                           extra_rows=rng.choice([0, 7]))
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    assert torch.equal(case.dst_k, case.want_k), case.desc
    assert torch.equal(case.dst_scale, case.want_scale), case.desc


def test_all_requests_empty_writes_nothing():
    case = make_mxfp4_case(random.Random(1), block_size=64, lens=[0, 0, 0], extra_rows=5)
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    assert torch.equal(case.dst_k, case.want_k) and torch.equal(case.dst_scale, case.want_scale)


def test_the_vllm_adapter_routes_the_mxfp4_gather_to_our_op():
    """After register(), the kernel vLLM's op runs on CUDA tensors is ours: called through the
    dispatcher's CUDA entry (here with CPU tensors, which our op serves on its CPU path), it
    gathers the MXFP4 layout byte-exact, through our op (a spy counts the calls)."""
    got = run("""
        import json, random, torch
        import nvrtc_gather.ops.gather as gather_op
        from nvrtc_gather.integrations import vllm as adapter
        from helpers.mxfp4_cache import make_mxfp4_case, ragged_lens
        calls = []
        plan = gather_op.plan_gather
        def spy(*args, **kwargs):
            calls.append([args[1].size(1), args[2].size(1), str(args[1].dtype), str(args[2].dtype)])
            return plan(*args, **kwargs)
        gather_op.plan_gather = spy
        adapter.register(["gather"])
        cuda = torch.library.get_kernel("_C_cache_ops::cp_gather_indexer_k_quant_cache", "CUDA")
        keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
        rng = random.Random(5)
        ok = []
        for bs in (16, 64):
            case = make_mxfp4_case(rng, block_size=bs, lens=ragged_lens(rng, bs), extra_rows=3)
            cuda.call_boxed(keys, *case.args())
            ok.append(torch.equal(case.dst_k, case.want_k) and torch.equal(case.dst_scale, case.want_scale))
        print(json.dumps({"ok": ok, "ops": list(adapter.status().ops), "calls": calls}))
    """)
    dst = [64, 4, "torch.uint8", "torch.uint8"]
    assert got == {"ok": [True, True], "ops": ["cp_gather_indexer_k_quant_cache"], "calls": [dst, dst]}, got
