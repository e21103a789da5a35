"""cp_gather_cache and gather_and_maybe_dequant_cache on CPU tensors (the torch path): bit-exact
against the independent per-row reference (tests/helpers/cache_gather_reference.py) over the
whole destination storage, bad index values refused with ValueError before anything is written,
the registered torch.ops, and the fakes' overlap check under torch.compile."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers.cache_gather_reference import SENTINEL, e5m2_value, make_case, ragged, reference

CONVERSIONS = ["copy", "e4m3_bf16", "e4m3_f16", "e4m3_f32", "e5m2_bf16", "e5m2_f16", "e5m2_f32"]


def _run(case, op=None):
    if (op or ("cp" if case.conversion == "copy" else "dequant")) == "cp":
        ng.cp_gather_cache(*case.cp_args())
    else:
        ng.gather_and_maybe_dequant_cache(*case.dequant_args())


def _check(case, op=None):
    want = reference(case)
    _run(case, op)
    assert torch.equal(case.dst_store, want), case.desc


@pytest.mark.parametrize("conversion", CONVERSIONS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_matches_the_reference(conversion, block_size):
    rng = random.Random(f"cpu-{conversion}-{block_size}")
    for seq_starts in (False, True):
        for kw in ({}, {"extra_rows": 4}, {"cut_rows": 5}, {"start_row": 3, "pad_row": 4}, {"pad_entry": 4}):
            _check(make_case(rng, lens=ragged(rng, 7, 30), block_size=block_size, conversion=conversion,
                             seq_starts=seq_starts, **kw))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.int32,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
def test_cp_gather_cache_copies_any_dtype(dtype):
    rng = random.Random(f"dtype-{dtype}")
    for entry in ((576,), (2, 128), (656,) if dtype.itemsize == 1 else (320,)):
        _check(make_case(rng, lens=[3, 0, 17, 9], entry=entry, src_dtype=dtype, seq_starts=True, extra_rows=2))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_auto_copies_the_values(dtype):
    rng = random.Random(f"auto-{dtype}")
    _check(make_case(rng, lens=[3, 0, 17, 9], src_dtype=dtype, seq_starts=True, extra_rows=2), op="dequant")


# vLLM's get_fp8_kv_cache_data_type (csrc/attention/dtype_fp8.cuh): "bfloat16" and "float16" are
# "auto", "fp8_ds_mla" is e4m3; its gather_and_maybe_dequant_cache accepts these seven strings.
@pytest.mark.parametrize("name, conversion, src_dtype", [
    ("bfloat16", "copy", torch.bfloat16), ("float16", "copy", torch.float16), ("bfloat16", "copy", torch.float32),
    ("fp8_ds_mla", "e4m3_bf16", torch.uint8), ("fp8_ds_mla", "e4m3_f32", torch.uint8)])
def test_every_kv_cache_dtype_vllm_accepts_with_its_meaning(name, conversion, src_dtype):
    case = make_case(random.Random(11), lens=[9, 0, 30], block_size=16, seq_starts=True, extra_rows=3,
                     conversion=conversion, src_dtype=src_dtype)
    want = reference(case)
    ng.gather_and_maybe_dequant_cache(*case.dequant_args(name))
    assert torch.equal(case.dst_store, want), (name, case.desc)
    ng.gather_and_maybe_dequant_cache(*case.dequant_args(name))  # the layout memo's second call: the same
    torch.ops.nvrtc_gather.gather_and_maybe_dequant_cache(*case.dequant_args(name))
    assert torch.equal(case.dst_store, want), (name, case.desc)


def test_many_requests():
    rng = random.Random("many")
    for batch in (1, 100, 4096):
        _check(make_case(rng, lens=ragged(rng, batch, 3, 0.3), entry=(16,), seq_starts=True, conversion="e4m3_bf16"))


def test_every_fp8_code_and_its_nan():
    """All 256 codes of both formats times a scale, each output type: NaN codes -> the GPU's
    canonical NaN, e5m2 inf stays inf, values as float(code) * scale rounded once."""
    for fp8, kv in (("e4m3", "fp8_e4m3"), ("e5m2", "fp8_e5m2")):
        for out, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
            src = torch.arange(256, dtype=torch.uint8).view(1, 1, 256)
            dst = torch.zeros(1, 256, dtype=dtype)
            cu = torch.tensor([0, 1], dtype=torch.int32)
            bt = torch.zeros(1, 1, dtype=torch.int32)
            ng.gather_and_maybe_dequant_cache(src, dst, bt, cu, cu, 1, kv, torch.tensor([0.75]))
            fdtype = torch.float8_e4m3fn if fp8 == "e4m3" else torch.float8_e5m2
            x = src.view(fdtype).float().view(1, 256) * torch.tensor(0.75)
            nan = torch.isnan(x)
            bits = dst.view(torch.int16 if dtype != torch.float32 else torch.int32)
            assert bool((bits[nan] == (0x7FFF if dtype != torch.float32 else 0x7FFFFFFF)).all())
            assert torch.equal(dst[~nan], x.to(dtype)[~nan])
            if fp8 == "e5m2":
                assert e5m2_value(0x7C) == float("inf") and float(dst[0, 0x7C]) == float("inf")


def test_bad_index_values_raise_before_anything_is_written():
    rng = random.Random("bad")
    for what, msg in (("block_id", "block_table: entry"), ("column", "past its"), ("seq_negative", "seq_starts"),
                      ("cu_negative", "cu_seq_lens: entry 0"), ("cu_decreasing", "non-decreasing")):
        case = make_case(rng, lens=[9, 12, 6], conversion="e4m3_bf16", seq_starts=True)
        if what == "block_id":
            case.block_table[1, 0] = case.src_cache.shape[0]
        elif what == "column":
            case.block_table = case.block_table[:, :1].contiguous()
        elif what == "seq_negative":
            case.seq_starts[2] = -1
        elif what == "cu_negative":
            case.cu_seq_lens[0] = -2
        else:
            case.cu_seq_lens[2] = 3
        before = case.dst_store.clone()
        with pytest.raises(ValueError, match=msg):
            _run(case)
        assert torch.equal(case.dst_store, before), what


def test_nothing_to_do():
    rng = random.Random("empty")
    for lens in ([], [0, 0]):
        case = make_case(rng, lens=lens, extra_rows=3)
        before = case.dst_store.clone()
        _run(case)
        assert torch.equal(case.dst_store, before)
    case = make_case(rng, lens=[5, 6], conversion="e4m3_bf16")
    case.num_rows = 0
    before = case.dst_store.clone()
    _run(case)
    assert torch.equal(case.dst_store, before)


def test_registered_ops_run_the_same():
    rng = random.Random("ops")
    for conversion in ("copy", "e5m2_f16"):
        case = make_case(rng, lens=[4, 0, 11], conversion=conversion, seq_starts=True, extra_rows=2)
        want = reference(case)
        if conversion == "copy":
            torch.ops.nvrtc_gather.cp_gather_cache(*case.cp_args())
        else:
            torch.ops.nvrtc_gather.gather_and_maybe_dequant_cache(*case.dequant_args())
        assert torch.equal(case.dst_store, want)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_fullgraph_and_overlapping_scale_refused(backend):
    """torch.compile(fullgraph=True) traces both ops without a graph break and gives the eager
    bytes; a scale that lies inside dst is refused at trace time (the fake checks it: under
    aot_eager the eager pointer check alone would miss it)."""
    torch._dynamo.reset()
    rng = random.Random(f"compile-{backend}")
    case = make_case(rng, lens=[5, 7], conversion="e4m3_bf16", seq_starts=True)
    want = reference(case)

    def f(*args):
        ng.gather_and_maybe_dequant_cache(*args)

    torch.compile(f, backend=backend, fullgraph=True)(*case.dequant_args())
    assert torch.equal(case.dst_store, want)

    case = make_case(rng, lens=[5, 7], conversion="e4m3_f32")
    args = list(case.dequant_args())
    args[7] = case.dst.view(-1)[3:4]  # scale inside dst
    before = case.dst_store.clone()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="dst: its memory overlaps scale"):
        torch.compile(f, backend=backend, fullgraph=True)(*args)
    assert torch.equal(case.dst_store, before)

    def g(*args):
        ng.cp_gather_cache(*args)

    case = make_case(rng, lens=[5, 7], seq_starts=True)
    want = reference(case)
    torch._dynamo.reset()
    torch.compile(g, backend=backend, fullgraph=True)(*case.cp_args())
    assert torch.equal(case.dst_store, want)


def test_sentinel_is_what_the_reference_leaves():
    """The reference itself leaves rows no request covers as SENTINEL (the tests above compare
    whole storages, so this is what an untouched row must hold)."""
    rng = random.Random("sentinel")
    case = make_case(rng, lens=[2, 3], extra_rows=2, start_row=1)
    want = reference(case).view(-1)[: case.dst.shape[0] * 576].view(-1, 576)
    assert bool((want[0] == SENTINEL).all()) and bool((want[-1] == SENTINEL).all())
    assert not bool((want[1] == SENTINEL).all())


def test_opcheck():
    """The registered schemas, fakes and dispatch pass torch's own consistency checks."""
    rng = random.Random("opcheck")
    for conversion in ("copy", "e4m3_bf16"):
        c = make_case(rng, lens=[5, 9], conversion=conversion, seq_starts=True)
        if conversion == "copy":
            torch.library.opcheck(torch.ops.nvrtc_gather.cp_gather_cache.default, c.cp_args())
        else:
            torch.library.opcheck(torch.ops.nvrtc_gather.gather_and_maybe_dequant_cache.default, c.dequant_args())
