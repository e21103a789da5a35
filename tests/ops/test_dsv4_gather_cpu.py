"""DeepSeek-V4's record gathers on CPU tensors: the torch path against the independent reference
(tests/helpers/dsv4_reference.py) in every form, bad index values refused before anything is
written, and argument errors naming the argument."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers import dsv4_reference as ref
from nvrtc_gather.integrations import sglang as sg


@pytest.mark.parametrize("ps", [64, 16, 2])
@pytest.mark.parametrize("scales", [(110, 135), (0, 255)])
def test_flat_forms_match_the_reference(ps, scales):
    cache = ref.build_cache("v4", 9, ps, seed=ps, scale_range=scales)
    ids = ref.random_token_ids(9, ps, 77, seed=ps, dtype=torch.int32)
    want = ref.dequantize_k_cache_paged_dsv4(cache, ids, ps)
    got = sg.dequantize_k_cache_paged_dsv4(cache, ids, ps)
    nan = torch.isnan(want.float())
    assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    assert (got.view(torch.int16)[nan] == 0x7fff).all()  # the GPU's canonical NaN
    out = torch.full((80, 1, 512), 3.0).to(torch.float8_e4m3fn)
    got8 = sg.gather_dequant_requant_fp8_paged_dsv4(cache, ids, ps, extra_rows=3, out=out)
    assert got8 is out
    assert torch.equal(out.view(torch.uint8), ref.gather_dequant_requant_fp8_paged_dsv4(cache, ids, ps, 3).view(torch.uint8))


@pytest.mark.parametrize("seed", range(4))
def test_vllm_form_matches_the_reference_and_leaves_other_rows(seed):
    rng = random.Random(seed)
    bs = rng.choice([64, 16, 2])
    seq = [rng.randint(0, 150) for _ in range(5)]
    nb = sum(-(-s // bs) for s in seq) + 2
    k_cache = ref.vllm_view(ref.build_cache("v4", nb, bs, seed=seed), bs)
    bt = ref.random_requests(nb, bs, seq, seed=seed)
    gl = torch.tensor([rng.randint(0, s) for s in seq], dtype=torch.int32) if seed % 2 else None
    sl = torch.tensor(seq, dtype=torch.int32)
    want = torch.full((5, 3 + max(seq), 512), -7.0, dtype=torch.bfloat16)
    out = want.clone()
    ref.dequantize_and_gather_k_cache(want, k_cache, sl, gl, bt, bs, 3)
    ng.dequantize_and_gather_k_cache(out, k_cache, sl, gl, bt, bs, 3)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_bad_values_are_refused_before_anything_is_written():
    cache = ref.build_cache("v4", 3, 16, seed=1)
    out = torch.zeros(3, 1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="page_table_1_flattened: entry 1 = 48 is outside"):
        sg.dequantize_k_cache_paged_dsv4(cache, torch.tensor([0, 48, 2]), 16, out=out)
    assert not out.view(torch.int16).any()
    k_cache = ref.vllm_view(cache, 16)
    vout = torch.zeros(2, 20, 512, dtype=torch.bfloat16)
    sl, bt = torch.tensor([10, 20], dtype=torch.int32), torch.tensor([[0, 1], [2, 5]], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_table: request 1 maps to a physical block outside"):
        ng.dequantize_and_gather_k_cache(vout, k_cache, sl, None, bt, 16, 0)
    with pytest.raises(ValueError, match="gather_lens: request 0 gathers 11 tokens"):
        ng.dequantize_and_gather_k_cache(vout, k_cache, sl, torch.tensor([11, 1], dtype=torch.int32), bt, 16, 0)
    assert not vout.view(torch.int16).any()


@pytest.mark.parametrize("call, error, match", [
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c.float(), i, 16), TypeError, "quant_k_cache: expected dtype"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i.float(), 16), TypeError, "page_table_1_flattened: expected dtype"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 16.0), TypeError, "page_size: expected a host int"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 0), ValueError, "page_size: expected a positive int"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 17), ValueError, "quant_k_cache: expected the pool's 2-D buffer"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 16, out=torch.zeros(4, 1, 512)), ValueError, "out: expected torch.bfloat16"),
    (lambda c, i: sg.gather_dequant_requant_fp8_paged_dsv4(c, i, 16, extra_rows=-1), ValueError, "extra_rows"),
    (lambda c, i: ng.dequantize_and_gather_k_cache(torch.zeros(1, 4, 512, dtype=torch.bfloat16), c, torch.tensor([2], dtype=torch.int32), None,
                                                   torch.tensor([[0]], dtype=torch.int32), 16, 0),
     ValueError, "k_cache: expected uint8 \\[num_blocks, block_size=16, 584\\]"),
    (lambda c, i: ng.dequantize_and_gather_k_cache(torch.zeros(1, 4, 512, dtype=torch.bfloat16), ref.vllm_view(c, 16),
                                                   torch.tensor([2, 3], dtype=torch.int32), None, torch.tensor([[0]], dtype=torch.int32), 16, 0),
     ValueError, "seq_lens: expected int32 \\[num_reqs = 1\\]"),
    (lambda c, i: ng.dequantize_and_gather_k_cache(torch.zeros(1, 4, 512, dtype=torch.bfloat16), ref.vllm_view(c, 16),
                                                   torch.tensor([2], dtype=torch.int32), None, torch.tensor([[0]], dtype=torch.int32), 16, -1),
     ValueError, "offset: expected a non-negative int"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 16, layout="v5"), ValueError, "layout: expected one of v4, v41"),
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 16, layout=41), TypeError, "layout: expected SGLang's KVLayout"),
    # the V4 pages (9,792 bytes) hold 16 V4.1 MXFP8 records of 528 bytes, not 19
    (lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 19, layout="v41"), ValueError,
     "quant_k_cache: expected the pool's 2-D buffer \\[num_pages, page bytes >= page_size \\* 528 = 10032\\]"),
    (lambda c, i: torch.ops.nvrtc_gather.dsv4_gather_flat(c, i, 16, torch.empty(4, 1, 512, dtype=torch.float8_e4m3fn),
                                                          0, True, "v41_fp4"),
     ValueError, "layout: the fp8 form reads the v4 layout only"),
])
def test_argument_errors_name_the_argument(call, error, match):
    cache = ref.build_cache("v4", 3, 16, seed=2)
    with pytest.raises(error, match=match):
        call(cache, torch.tensor([1, 2, 3, 4]))


def test_registered_ops_trace_and_run_under_compile():
    torch._dynamo.reset()
    cache = ref.build_cache("v4", 5, 16, seed=4)
    ids = ref.random_token_ids(5, 16, 30, seed=4)
    k_cache = ref.vllm_view(cache, 16)
    bt = ref.random_requests(5, 16, [20, 9], seed=4)
    sl = torch.tensor([20, 9], dtype=torch.int32)

    def both(cache, ids, k_cache, sl, bt, out):
        flat = sg.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 16, 2)
        ng.dequantize_and_gather_k_cache(out, k_cache, sl, None, bt, 16, 1)
        return flat

    out = torch.zeros(2, 21, 512, dtype=torch.bfloat16)
    got = torch.compile(both, fullgraph=True, backend="aot_eager")(cache, ids, k_cache, sl, bt, out)
    assert torch.equal(got.view(torch.uint8), ref.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 16, 2).view(torch.uint8))
    want = torch.zeros(2, 21, 512, dtype=torch.bfloat16)
    ref.dequantize_and_gather_k_cache(want, k_cache, sl, None, bt, 16, 1)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    torch.library.opcheck(torch.ops.nvrtc_gather.dequantize_and_gather_k_cache.default,
                          (torch.zeros(2, 21, 512, dtype=torch.bfloat16), k_cache, sl, None, bt, 16, 1))


def test_an_out_overlapping_the_cache_is_refused():
    cache = ref.build_cache("v4", 4, 16, seed=5)
    out = cache.view(-1)[:4 * 1024].view(torch.bfloat16).view(4, 1, 512)
    with pytest.raises(ValueError, match="out: its memory overlaps quant_k_cache"):
        sg.dequantize_k_cache_paged_dsv4(cache, torch.tensor([0, 1, 2, 3]), 16, out=out)


@pytest.mark.parametrize("layout", ["v41", "v41_new", "v41_fp4", "v41_fp4_new"])
@pytest.mark.parametrize("ps", [64, 4, 1])
def test_v41_layouts_match_the_reference(layout, ps):
    """SGLang's V4.1 layouts through the bf16 form (``layout=``, any case), scale bytes 0..255,
    into a given strided ``out`` and a fresh one; the page stride past the engines' padding."""
    lay = ref.layout_of(layout)
    cache = ref.build_cache(layout, 9, ps, seed=ps, scale_range=(0, 255), page_bytes=lay.page_bytes(ps) + 32)
    ids = ref.random_token_ids(9, ps, 150, seed=ps, dtype=torch.int32)
    want = ref.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=layout)
    nan = torch.isnan(want.float())
    wide = torch.full((150, 2, 512), -3.0, dtype=torch.bfloat16)
    for got in (sg.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=layout.upper()),
                sg.dequantize_k_cache_paged_dsv4(cache, ids, ps, wide[:, 1:], layout)):
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
        assert (got.view(torch.int16)[nan] == 0x7fff).all()  # the GPU's canonical NaN
    assert (wide[:, 0] == -3.0).all()


def test_v41_bad_ids_are_refused_before_anything_is_written():
    cache = ref.build_cache("v41_new", 3, 4, seed=1)
    out = torch.zeros(3, 1, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="page_table_1_flattened: entry 2 = 12 is outside"):
        sg.dequantize_k_cache_paged_dsv4(cache, torch.tensor([0, 11, 12]), 4, out=out, layout="v41_new")
    assert not out.view(torch.int16).any()


def test_a_v41_layout_traces_and_runs_under_compile():
    torch._dynamo.reset()
    cache = ref.build_cache("v41_fp4_new", 5, 16, seed=4, scale_range=(0, 255))
    ids = ref.random_token_ids(5, 16, 30, seed=4)
    f = torch.compile(lambda c, i: sg.dequantize_k_cache_paged_dsv4(c, i, 16, layout="V41_FP4_NEW"), fullgraph=True,
                      backend="aot_eager")
    want = ref.dequantize_k_cache_paged_dsv4(cache, ids, 16, layout="v41_fp4_new")
    assert torch.equal(f(cache, ids).view(torch.int16), want.view(torch.int16))
    torch.library.opcheck(torch.ops.nvrtc_gather.dsv4_gather_flat.default,
                          (cache, ids, 16, torch.empty(30, 1, 512, dtype=torch.bfloat16), 0, False, "v41_fp4_new"))
