"""torch.library registration: opcheck and torch.compile(fullgraph=True), on CPU (CI)."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers.reference import gather_reference, make_gather_case


def _case(seed=0):
    return make_gather_case(random.Random(seed), block_size=16, head_dim=128, quant_block_size=64, batch=5,
                            strided=False, extra_rows=3)


def test_registered_under_torch_ops():
    assert hasattr(torch.ops.nvrtc_gather, "cp_gather_indexer_k_quant_cache")


def test_opcheck_gather():
    c = _case()
    torch.library.opcheck(torch.ops.nvrtc_gather.cp_gather_indexer_k_quant_cache.default, c.args())


def test_custom_op_gives_the_same_bytes():
    c = _case(1)
    torch.ops.nvrtc_gather.cp_gather_indexer_k_quant_cache(*c.args())
    k, s = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 2)
    assert torch.equal(c.dst_k.view(torch.uint8), k) and torch.equal(c.dst_scale.view(torch.uint8), s)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_has_no_graph_break(backend):
    torch._dynamo.reset()

    def step(kv, dst_k, dst_s, bt, cu):
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)  # the plain entry point
        return dst_s.view(torch.uint8).to(torch.int64).sum()  # exact (random bytes as floats may be NaN)

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    c = _case(2)
    out = compiled(*c.args())
    k, s = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 2)
    assert torch.equal(c.dst_k.view(torch.uint8), k) and torch.equal(c.dst_scale.view(torch.uint8), s)
    assert int(out) == int(s.to(torch.int64).sum())


def test_opcheck_and_compile_write_op():
    from helpers.reference import make_quant_case
    c = make_quant_case(random.Random(3), head_dim=128, quant_block_size=64, block_size=16,
                        dtype=torch.bfloat16, scale_fmt="ue8m0", num_tokens=40)
    args = (c.k, c.kv_cache, c.slot_mapping, 64, "ue8m0")
    torch.library.opcheck(torch.ops.nvrtc_gather.indexer_k_quant_and_cache.default, args)
    torch._dynamo.reset()
    expect = c.kv_cache.clone()
    ng.indexer_k_quant_and_cache(c.k, expect, c.slot_mapping, 64, "ue8m0")

    def write(k, kv, slots):
        ng.indexer_k_quant_and_cache(k, kv, slots, 64, "ue8m0")
        return kv.sum()

    torch.compile(write, fullgraph=True, backend="aot_eager")(c.k, c.kv_cache, c.slot_mapping)
    assert torch.equal(c.kv_cache, expect)
