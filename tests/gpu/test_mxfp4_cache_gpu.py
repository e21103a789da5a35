"""vLLM 0.33's MXFP4 indexer cache (docs/contract.md, "MXFP4 indexer cache") gathered by the NVRTC
kernel on a GPU: byte-exact against each token's own record (tests/helpers/mxfp4_cache.py),
block sizes 16 and 64, ragged requests with empty ones, poisoned outputs, upper-bound rows
untouched; through our op and through vLLM's op name after the adapter's register()."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers.fresh_python import run
from helpers.mxfp4_cache import make_mxfp4_case, ragged_lens

pytestmark = pytest.mark.gpu


def _check(case):
    torch.cuda.synchronize()
    assert torch.equal(case.dst_k.cpu(), case.want_k), case.desc
    assert torch.equal(case.dst_scale.cpu(), case.want_scale), case.desc


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("seed", range(6))
def test_gather_of_the_mxfp4_layout_is_byte_exact(block_size, seed):
    rng = random.Random(f"mxfp4-gpu-{block_size}-{seed}")
    case = make_mxfp4_case(rng, block_size=block_size, lens=ragged_lens(rng, block_size),
                           extra_rows=rng.choice([0, 5, 100])).to("cuda")
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    _check(case)


@pytest.mark.parametrize("block_size", [16, 64])
def test_many_requests(block_size):
    rng = random.Random(f"mxfp4-gpu-many-{block_size}")
    lens = [0 if rng.random() < 0.1 else rng.randint(1, 3 * block_size) for _ in range(600)]
    case = make_mxfp4_case(rng, block_size=block_size, lens=lens, extra_rows=33).to("cuda")
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    _check(case)


def test_vllms_op_name_runs_our_kernel_on_the_mxfp4_layout():
    got = run("""
        import json, random, torch
        from nvrtc_gather.integrations import vllm as adapter
        from helpers.mxfp4_cache import make_mxfp4_case, ragged_lens
        adapter.register(["gather"])
        rng = random.Random(11)
        ok = []
        for bs in (16, 64):
            case = make_mxfp4_case(rng, block_size=bs, lens=ragged_lens(rng, bs), extra_rows=4).to("cuda")
            torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache(*case.args())
            torch.cuda.synchronize()
            ok.append(torch.equal(case.dst_k.cpu(), case.want_k) and torch.equal(case.dst_scale.cpu(), case.want_scale))
        print(json.dumps({"ok": ok, "ops": list(adapter.status().ops)}))
    """)
    assert got == {"ok": [True, True], "ops": ["cp_gather_indexer_k_quant_cache"]}, got
