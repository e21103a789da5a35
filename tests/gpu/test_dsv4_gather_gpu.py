"""DeepSeek-V4's record gathers on the GPU: every layout (V4, and SGLang's V4.1 layouts) and form
byte for byte against the independent reference (tests/helpers/dsv4_reference.py) and the CPU
path, outputs poisoned first; against SGLang 0.5.23's own Triton kernels where their source is
at hand (the carried wheel, or NVRTC_GATHER_SGLANG_SRC); bad indices; and one launch, no sync,
per call."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers import dsv4_reference as ref
from helpers.launches import kernels_launched
from nvrtc_gather.integrations import sglang as sg

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def _poison(t):
    t.view(torch.uint8).fill_(0xA5)
    return t


@pytest.mark.parametrize("ps", [64, 16, 2])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("scales", [(110, 135), (0, 255)])
def test_flat_forms_match_the_reference(ps, ids_dtype, scales):
    cache = ref.build_cache("v4", 37, ps, seed=ps, scale_range=scales)
    ids = ref.random_token_ids(37, ps, 301, seed=ps, dtype=ids_dtype)
    want = ref.dequantize_k_cache_paged_dsv4(cache, ids, ps)
    got = sg.dequantize_k_cache_paged_dsv4(cache.cuda(), ids.cuda(), ps)
    nan = torch.isnan(want.float())
    assert torch.equal(got.cpu().view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    assert torch.isnan(got.cpu().float()[nan]).all()
    out = _poison(torch.empty(301 + 3, 1, 512, dtype=torch.float8_e4m3fn, device="cuda"))
    want8 = ref.gather_dequant_requant_fp8_paged_dsv4(cache, ids, ps, extra_rows=3)
    got8 = sg.gather_dequant_requant_fp8_paged_dsv4(cache.cuda(), ids.cuda(), ps, extra_rows=3, out=out)
    assert got8 is out
    assert torch.equal(got8.cpu().view(torch.uint8), want8.view(torch.uint8))
    # the CPU path gives the kernel's bytes (NaNs included)
    cpu = sg.dequantize_k_cache_paged_dsv4(cache, ids, ps)
    assert torch.equal(cpu.view(torch.int16), got.cpu().view(torch.int16))


@pytest.mark.parametrize("layout", ["v41", "v41_new", "v41_fp4", "v41_fp4_new"])
@pytest.mark.parametrize("ps", [64, 2])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_v41_flat_forms_match_the_reference(layout, ps, ids_dtype):
    """SGLang's V4.1 layouts (bf16 out), scale bytes 0..255, a fresh and a given strided ``out``
    (poisoned), the remembered second call, and the CPU path's bytes."""
    cache = ref.build_cache(layout, 37, ps, seed=ps, scale_range=(0, 255))
    ids = ref.random_token_ids(37, ps, 301, seed=ps, dtype=ids_dtype)
    want = ref.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=layout)
    nan = torch.isnan(want.float())
    cache_c, ids_c = cache.cuda(), ids.cuda()
    wide = _poison(torch.empty(301, 2, 512, dtype=torch.bfloat16, device="cuda"))
    for got in (sg.dequantize_k_cache_paged_dsv4(cache_c, ids_c, ps, layout=layout),
                sg.dequantize_k_cache_paged_dsv4(cache_c, ids_c, ps, layout=layout),  # remembered
                sg.dequantize_k_cache_paged_dsv4(cache_c, ids_c, ps, wide[:, 1:], layout)):
        got = got.cpu()
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
        assert (got.view(torch.int16)[nan] == 0x7fff).all()
    assert (wide[:, 0].view(torch.int16) == -23131).all()  # 0xA5A5: the rows beside stay poisoned
    cpu = sg.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=layout)
    assert torch.equal(cpu.view(torch.int16), got.view(torch.int16))


def test_remembered_flat_calls_gather_and_refuse_as_the_first_call_does():
    """After one fresh-output call, SGLang's form takes the remembered path (pointer checks only):
    other row counts, extra rows, strided and empty ids give the reference's bytes, and what
    the full checks refuse (bad extra_rows or page_size, a misaligned cache with the same
    metadata) is still refused by name."""
    cache = ref.build_cache("v4", 37, 16, seed=5)
    ids = ref.random_token_ids(37, 16, 301, seed=5, dtype=torch.int64)
    cache_c = cache.cuda()
    sg.gather_dequant_requant_fp8_paged_dsv4(cache_c, ids.cuda(), 16)  # checked in full, remembered
    wide = torch.stack([ids, ids.flip(0)], 1).cuda()
    for sub, extra in ((ids.cuda(), 0), (ids[:7].cuda(), 2), (wide[:, 1], 1), (ids[:0].cuda(), 3), (ids[:0].cuda(), 0)):
        want = ref.gather_dequant_requant_fp8_paged_dsv4(cache, sub.cpu(), 16, extra_rows=extra)
        got = sg.gather_dequant_requant_fp8_paged_dsv4(cache_c, sub, 16, extra_rows=extra)
        assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)), (sub.shape, extra)
    with pytest.raises(ValueError, match="^extra_rows"):
        sg.gather_dequant_requant_fp8_paged_dsv4(cache_c, ids.cuda(), 16, extra_rows=-1)
    with pytest.raises(TypeError, match="^extra_rows"):
        sg.gather_dequant_requant_fp8_paged_dsv4(cache_c, ids.cuda(), 16, extra_rows=True)
    with pytest.raises(TypeError, match="^page_size"):
        sg.gather_dequant_requant_fp8_paged_dsv4(cache_c, ids.cuda(), 16.0)
    base = torch.zeros(cache_c.numel() + 8, dtype=torch.uint8, device="cuda")
    shifted = base[8:].as_strided(cache_c.shape, cache_c.stride())  # the same metadata, 8 bytes off
    with pytest.raises(ValueError, match="^quant_k_cache: .*data pointer"):
        sg.gather_dequant_requant_fp8_paged_dsv4(shifted, ids.cuda(), 16)


@pytest.mark.parametrize("bs", [64, 16])
@pytest.mark.parametrize("with_gather_lens", [False, True])
def test_vllm_form_matches_the_reference(bs, with_gather_lens):
    rng = random.Random(bs)
    seq = [rng.randint(0, 300) for _ in range(7)] + [0]
    nb = sum(-(-s // bs) for s in seq) + 3
    cache = ref.build_cache("v4", nb, bs, seed=bs)
    k_cache = ref.vllm_view(cache, bs)
    bt = ref.random_requests(nb, bs, seq, seed=bs)
    gl = torch.tensor([rng.randint(0, s) if s else 0 for s in seq], dtype=torch.int32) if with_gather_lens else None
    sl = torch.tensor(seq, dtype=torch.int32)
    offset = rng.choice([0, 5])
    m = offset + max(seq) + 4
    want = _poison(torch.empty(len(seq), m, 512, dtype=torch.bfloat16))
    out = want.cuda()
    ref.dequantize_and_gather_k_cache(want, k_cache, sl, gl, bt, bs, offset)
    args = (k_cache.cuda(), sl.cuda(), None if gl is None else gl.cuda(), bt.cuda(), bs, offset)
    ng.dequantize_and_gather_k_cache(out, *args)
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))  # untouched rows stay poisoned
    again = _poison(torch.empty_like(out))  # the remembered call (pointer checks only) writes the same
    ng.dequantize_and_gather_k_cache(again, *args)
    assert torch.equal(again.cpu().view(torch.int16), want.view(torch.int16))


def test_bad_indices_give_zero_rows_and_debug_mode_raises(monkeypatch):
    cache = ref.build_cache("v4", 4, 16, seed=3).cuda()
    ids = torch.tensor([3, -1, 64, 5, 2**40], device="cuda")
    out = sg.dequantize_k_cache_paged_dsv4(cache, ids, 16)
    assert not out[[1, 2, 4]].view(torch.int16).any() and out[[0, 3]].view(torch.int16).any()
    cache41 = ref.build_cache("v41_fp4", 4, 16, seed=3).cuda()
    out41 = sg.dequantize_k_cache_paged_dsv4(cache41, ids, 16, layout="v41_fp4")
    assert not out41[[1, 2, 4]].view(torch.int16).any() and out41[[0, 3]].view(torch.int16).any()
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match=r"page_table_1_flattened: row [124] has token id (-1|64|1099511627776), outside"):
        sg.dequantize_k_cache_paged_dsv4(cache, ids, 16)
    with pytest.raises(ValueError, match=r"page_table_1_flattened: row [124] has token id (-1|64|1099511627776), outside"):
        sg.dequantize_k_cache_paged_dsv4(cache41, ids, 16, layout="v41_fp4")


def test_each_call_is_one_launch_without_a_sync():
    cache = ref.build_cache("v4", 40, 64, seed=1).cuda()
    ids = ref.random_token_ids(40, 64, 2000, seed=1).cuda()
    k_cache = ref.vllm_view(cache.cpu(), 64).cuda()
    sl = torch.tensor([100, 700], dtype=torch.int32, device="cuda")
    bt = ref.random_requests(40, 64, [100, 700], seed=1).cuda()
    out = torch.empty(2, 700, 512, dtype=torch.bfloat16, device="cuda")
    cache41 = ref.build_cache("v41_fp4_new", 40, 64, seed=1).cuda()
    calls = [lambda: sg.dequantize_k_cache_paged_dsv4(cache, ids, 64),
             lambda: sg.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 64, extra_rows=1),
             lambda: ng.dequantize_and_gather_k_cache(out, k_cache, sl, None, bt, 64, 0),
             lambda: sg.dequantize_k_cache_paged_dsv4(cache41, ids, 64, layout="v41_fp4_new")]
    kernels = kernels_launched(calls)
    assert len(kernels) == 4, kernels


def test_sglangs_own_triton_kernels_give_the_same_bytes():
    from tests.integrations import test_dsv4_engine_kernels_interpreted as eng
    if eng.SGL_DEQUANT is None:
        pytest.skip("SGLang 0.5.23's dsv4 sources are not installed here")
    if eng._TRITON is not None:
        pytest.skip(eng._TRITON)
    mod = eng.load_sglang(interpret=False)
    for ps in (64, 2):
        cache = ref.build_cache("v4", 37, ps, seed=ps, scale_range=(0, 255)).cuda()
        ids = ref.random_token_ids(37, ps, 999, seed=ps).cuda()
        theirs = mod.dequantize_k_cache_paged_dsv4(cache, ids, ps)
        ours = sg.dequantize_k_cache_paged_dsv4(cache, ids, ps)
        assert torch.equal(theirs.view(torch.int16), ours.view(torch.int16))
        theirs8 = mod.gather_dequant_requant_fp8_paged_dsv4(cache, ids, ps, extra_rows=1)
        ours8 = sg.gather_dequant_requant_fp8_paged_dsv4(cache, ids, ps, extra_rows=1)
        assert torch.equal(theirs8.view(torch.uint8), ours8.view(torch.uint8))
    # the V4.1 layouts: SGLang's own kernels refuse a GPU below SM100, so its module runs here with
    # the arch stubbed to 10.0 (its Triton kernels compile for this GPU as for any)
    for layout in ("V41", "V41_NEW", "V41_FP4", "V41_FP4_NEW"):
        for ps in (64, 2):
            cache = ref.build_cache(layout.lower(), 37, ps, seed=ps, scale_range=(0, 255)).cuda()
            ids = ref.random_token_ids(37, ps, 999, seed=ps, dtype=torch.int32).cuda()
            theirs = mod.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=mod.KVLayout[layout])
            ours = sg.dequantize_k_cache_paged_dsv4(cache, ids, ps, layout=mod.KVLayout[layout])
            assert torch.equal(theirs.view(torch.int16), ours.view(torch.int16)), (layout, ps)


def test_cuda_graph_replay_gathers_the_new_contents():
    cache = ref.build_cache("v4", 20, 64, seed=7).cuda()
    ids = ref.random_token_ids(20, 64, 500, seed=7).cuda()
    k_cache = ref.vllm_view(cache.cpu(), 64).cuda()
    sl = torch.tensor([300, 120], dtype=torch.int32, device="cuda")
    bt = ref.random_requests(20, 64, [300, 120], seed=7).cuda()
    out8 = torch.empty(501, 1, 512, dtype=torch.float8_e4m3fn, device="cuda")
    vout = torch.zeros(2, 300, 512, dtype=torch.bfloat16, device="cuda")
    cache41 = ref.build_cache("v41_new", 20, 64, seed=7).cuda()
    out41 = torch.empty(500, 1, 512, dtype=torch.bfloat16, device="cuda")
    ng.preload(0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # warm the layouts outside capture
        sg.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 64, 1, out=out8)
        ng.dequantize_and_gather_k_cache(vout, k_cache, sl, None, bt, 64, 0)
        sg.dequantize_k_cache_paged_dsv4(cache41, ids, 64, out41, "v41_new")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sg.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 64, 1, out=out8)
        ng.dequantize_and_gather_k_cache(vout, k_cache, sl, None, bt, 64, 0)
        sg.dequantize_k_cache_paged_dsv4(cache41, ids, 64, out41, "v41_new")
    fresh, fresh41 = ref.build_cache("v4", 20, 64, seed=8), ref.build_cache("v41_new", 20, 64, seed=8)
    cache41.copy_(fresh41.cuda())
    out41.view(torch.uint8).fill_(0xA5)
    cache.copy_(fresh.cuda())
    k_cache.copy_(ref.vllm_view(fresh, 64).cuda())
    out8.view(torch.uint8).fill_(0xA5)
    g.replay()
    torch.cuda.synchronize()
    want8 = ref.gather_dequant_requant_fp8_paged_dsv4(fresh, ids.cpu(), 64, 1)
    assert torch.equal(out8.cpu().view(torch.uint8), want8.view(torch.uint8))
    want = torch.zeros(2, 300, 512, dtype=torch.bfloat16)
    ref.dequantize_and_gather_k_cache(want, ref.vllm_view(fresh, 64), sl.cpu(), None, bt.cpu(), 64, 0)
    assert torch.equal(vout.cpu().view(torch.int16), want.view(torch.int16))
    want41 = ref.dequantize_k_cache_paged_dsv4(fresh41, ids.cpu(), 64, layout="v41_new")  # scales 110..135: no NaN
    assert torch.equal(out41.cpu().view(torch.int16), want41.view(torch.int16))


def test_the_hook_on_real_sglang_replaces_its_functions_with_the_same_bytes():
    import importlib
    from nvrtc_gather.integrations import sglang_dsv4
    try:
        mod = importlib.import_module(sglang_dsv4.defining() or sglang_dsv4.MODULES[0])
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"SGLang's {sglang_dsv4.MODULES[0]} does not import here: {type(e).__name__}: {e}")
    theirs = {n: getattr(mod, n) for n in sglang_dsv4.FUNCTIONS.values()}
    cache = ref.build_cache("v4", 30, 64, seed=9, scale_range=(0, 255)).cuda()
    ids = ref.random_token_ids(30, 64, 700, seed=9, dtype=torch.int32).cuda()
    try:
        sg.register(ops="dsv4_bf16,dsv4_fp8")
        assert set(theirs) <= set(sg.status()["hooked"])
        got = mod.dequantize_k_cache_paged_dsv4(cache, ids, 64)
        got8 = mod.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 64, 1)
        assert sg.status()["left_to_sglang"].get("dequantize_k_cache_paged_dsv4") is None
    finally:
        sg.unregister()
    assert getattr(mod, "dequantize_k_cache_paged_dsv4") is theirs["dequantize_k_cache_paged_dsv4"]
    want = theirs["dequantize_k_cache_paged_dsv4"](cache, ids, 64)
    want8 = theirs["gather_dequant_requant_fp8_paged_dsv4"](cache, ids, 64, 1)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(got8.view(torch.uint8), want8.view(torch.uint8))


def test_the_hook_serves_the_v41_layouts_on_this_gpu():
    """A V4.1 call through the hook is ours (SGLang's own raises below SM100): the reference's
    bytes, nothing left to SGLang."""
    from nvrtc_gather.integrations import sglang_dsv4

    def theirs(*args, **kwargs):
        raise AssertionError("left to SGLang")

    left = []
    hooked = sglang_dsv4._wrap("dequantize_k_cache_paged_dsv4", theirs, lambda *why: left.append(why))
    for layout in ("v41", "V41_NEW", "v41_fp4", "V41_FP4_NEW"):
        cache = ref.build_cache(layout.lower(), 30, 64, seed=3, scale_range=(0, 255))
        ids = ref.random_token_ids(30, 64, 500, seed=3, dtype=torch.int64)
        want = ref.dequantize_k_cache_paged_dsv4(cache, ids, 64, layout=layout.lower())
        got = hooked(cache.cuda(), ids.cuda(), 64, layout=layout).cpu()
        nan = torch.isnan(want.float())
        assert torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan]), layout
    assert not left
