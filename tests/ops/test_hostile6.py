"""Round six of hostile input (our own probe of the DeepSeek-V4 gathers, SGLang's index-K read and
`info`; CPU tensors): each test failed before its fix."""
import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.integrations import sglang as sg
from nvrtc_gather.ops import checks

PAGE = 4 * 584  # bytes of a 4-token V4 page


def _pool(pages=2, stride=PAGE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    store = torch.randint(0, 256, ((pages - 1) * stride + PAGE,), dtype=torch.uint8, generator=gen)
    return store.as_strided((pages, PAGE), (stride, 1))


def _ids(n=4):
    return torch.arange(n, dtype=torch.int32)


def _cause_chain(e: BaseException) -> str:
    """The messages of an exception and its causes (torch.compile(fullgraph=True) reports an
    exception raised in the traced code as its Unsupported, the exception as its cause)."""
    out = []
    while e is not None:
        out.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(out)


def _assert_raised(info, error, says: str) -> None:
    """The compiled call raised ``error`` starting with ``says``: itself, or as the cause of
    dynamo's Unsupported ("Observed exception", fullgraph=True)."""
    chain = _cause_chain(info.value)  # torch 2.11 and 2.13 word dynamo's report differently: both name the error
    assert (isinstance(info.value, error) and str(info.value).startswith(says)) or \
        (f"{error.__name__}(" in chain and says in chain), chain[:3000]


# -- outputs whose rows share memory -------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: torch.zeros(4 * 512, dtype=torch.bfloat16).as_strided((4, 1, 512), (256, 512, 1)),
                                  lambda: torch.zeros(1, 1, 512, dtype=torch.bfloat16).expand(4, 1, 512)],
                         ids=["stride_256", "expanded"])
def test_sglang_form_refuses_an_out_whose_rows_overlap(make):
    out = make()
    before = out.clone()
    with pytest.raises(ValueError, match="out: rows overlap"):
        sg.dequantize_k_cache_paged_dsv4(_pool(), _ids(), 4, out=out)
    assert torch.equal(out, before)


def test_vllm_form_refuses_an_out_whose_request_planes_overlap():
    out = torch.zeros(1, 6, 512, dtype=torch.bfloat16).expand(2, 6, 512)
    with pytest.raises(ValueError, match="out: rows overlap"):
        ng.dequantize_and_gather_k_cache(out, _pool().view(2, 4, 584), torch.tensor([3, 3], dtype=torch.int32), None,
                                         torch.tensor([[0], [1]], dtype=torch.int32), 4, 0)


def test_vllm_form_takes_an_out_with_its_dimensions_swapped_in_memory():
    """Requests interleaved row by row (stride(0) = 512, stride(1) = reqs * 512): disjoint, accepted."""
    cache, seq, table = _pool().view(2, 4, 584), torch.tensor([3, 4], dtype=torch.int32), torch.tensor([[1], [0]])
    want = torch.zeros(2, 5, 512, dtype=torch.bfloat16)
    ng.dequantize_and_gather_k_cache(want, cache, seq, None, table.to(torch.int32), 4, 1)
    swapped = torch.zeros(5, 2, 512, dtype=torch.bfloat16).transpose(0, 1)
    ng.dequantize_and_gather_k_cache(swapped, cache, seq, None, table.to(torch.int32), 4, 1)
    assert torch.equal(swapped.view(torch.int16), want.view(torch.int16))


# -- the pool's layout ----------------------------------------------------------------------------

@pytest.mark.parametrize("fn, kw", [(sg.dequantize_k_cache_paged_dsv4, {}),
                                    (sg.gather_dequant_requant_fp8_paged_dsv4, {"extra_rows": 2})])
def test_a_pool_of_no_pages_with_padded_pages_gathers_nothing(fn, kw):
    pool = torch.zeros(1, PAGE + 16, dtype=torch.uint8)[:0]
    out = fn(pool, torch.zeros(0, dtype=torch.int32), 4, **kw)
    assert out.shape == (kw.get("extra_rows", 0), 1, 512) and not out.view(torch.uint8).any()


@pytest.mark.parametrize("stride", [16, 0])
def test_sglang_form_refuses_pages_that_overlap(stride):
    with pytest.raises(ValueError, match="quant_k_cache: pages overlap"):
        sg.dequantize_k_cache_paged_dsv4(_pool(stride=stride) if stride else _pool()[:1].expand(4, PAGE), _ids(), 4)


@pytest.mark.parametrize("three_d", [False, True])
def test_a_page_stride_off_16_bytes_is_refused_on_cpu_as_on_cuda(three_d):
    pool = _pool(stride=PAGE + 1)
    with pytest.raises(ValueError, match=r"stride\(0\) \(2337\) must be a multiple of 16 bytes"):
        if three_d:
            ng.dequantize_and_gather_k_cache(torch.zeros(1, 3, 512, dtype=torch.bfloat16),
                                             pool.as_strided((2, 4, 584), (PAGE + 1, 584, 1)),
                                             torch.tensor([3], dtype=torch.int32), None,
                                             torch.tensor([[1]], dtype=torch.int32), 4, 0)
        else:
            sg.dequantize_k_cache_paged_dsv4(pool, _ids(), 4)


def test_the_alignment_message_says_the_alignment_asked_for():
    with pytest.raises(ValueError, match="are 16-byte aligned"):
        checks.aligned("x", "stride(0)", 8, 16)


# -- extra_rows -----------------------------------------------------------------------------------

def test_extra_rows_past_the_kernels_row_count_is_a_value_error():
    with pytest.raises(ValueError, match="extra_rows: the output's rows n \\+ extra_rows = "):
        sg.gather_dequant_requant_fp8_paged_dsv4(_pool(), _ids(), 4, extra_rows=2**62)


@pytest.mark.parametrize("value, error, says", [(-10, ValueError, "extra_rows: expected a non-negative int"),
                                                (1.5, TypeError, "extra_rows: expected a host int, got float"),
                                                (None, TypeError, "extra_rows: expected a host int, got NoneType"),
                                                (True, TypeError, "extra_rows: expected a host int, got bool"),
                                                (2**62, ValueError, "extra_rows: the output's rows")])
def test_compiled_fp8_form_checks_extra_rows_before_sizing_out(value, error, says):
    torch._dynamo.reset()
    step = torch.compile(lambda c, i: sg.gather_dequant_requant_fp8_paged_dsv4(c, i, 4, extra_rows=value),
                         backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception) as info:
        step(_pool(), _ids())
    _assert_raised(info, error, says)


# -- a bool (or float, None) in an int argument under torch.compile -------------------------------

def _vllm_args():
    return (torch.zeros(1, 4, 512, dtype=torch.bfloat16), _pool().view(2, 4, 584), torch.tensor([2], dtype=torch.int32),
            torch.tensor([[0]], dtype=torch.int32))


def _cp_gather_args():
    return (torch.zeros(2, 4, 8, dtype=torch.uint8), torch.zeros(3, 8, dtype=torch.uint8),
            torch.tensor([[0]], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32))


CALLS = {  # (the call with its int argument v, the tensors it takes, that argument's name)
    "sglang_page_size": (lambda v, c, i: sg.dequantize_k_cache_paged_dsv4(c, i, v), lambda: (_pool(), _ids()),
                         "page_size"),
    "vllm_offset": (lambda v, o, c, s, t: ng.dequantize_and_gather_k_cache(o, c, s, None, t, 4, v), _vllm_args,
                    "offset"),
    "cp_gather_cache_batch_size": (lambda v, src, dst, bt, cu: ng.cp_gather_cache(src, dst, bt, cu, v, None),
                                   _cp_gather_args, "batch_size"),
}


@pytest.mark.parametrize("value", [True, 2.0, None], ids=["bool", "float", "None"])
@pytest.mark.parametrize("call", list(CALLS))
def test_compiled_calls_refuse_a_non_int_in_an_int_argument_as_eager_does(call, value):
    fn, tensors, arg = CALLS[call]
    with pytest.raises(TypeError, match=f"{arg}: expected a"):
        fn(value, *tensors())
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(lambda *t: fn(value, *t), backend="aot_eager", fullgraph=True)(*tensors())
    _assert_raised(info, TypeError, f"{arg}: expected a host int, got {type(value).__name__}")


def test_compiled_calls_with_ints_still_run():
    torch._dynamo.reset()
    fn, tensors, _ = CALLS["sglang_page_size"]
    want = fn(4, *tensors())
    got = torch.compile(lambda *t: fn(4, *t), backend="aot_eager", fullgraph=True)(*tensors())
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


# -- a negative view of the cache on a remembered layout (CPU) ------------------------------------

def test_a_negative_view_is_refused_on_every_cpu_call():
    pool = _pool()
    sg.dequantize_k_cache_paged_dsv4(pool, _ids(), 4)  # the layout is remembered
    with pytest.raises(TypeError, match="quant_k_cache: expected a plain tensor, got a negative view"):
        sg.dequantize_k_cache_paged_dsv4(torch._neg_view(pool), _ids(), 4)


# -- SGLang's index-K read --------------------------------------------------------------------------

def test_read_ignores_page_ids_in_columns_no_row_reads_even_past_int32():
    gen = torch.Generator().manual_seed(3)
    buf = torch.randint(0, 256, (2, 4 * 132), dtype=torch.uint8, generator=gen)
    seq = torch.tensor([3])
    want = sg.get_index_k_scale_buffer(buf, seq, torch.tensor([[1, -5]]), 3, 4, page_size=4)
    got = sg.get_index_k_scale_buffer(buf, seq, torch.tensor([[1, 2**40]]), 3, 4, page_size=4)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(got[0], buf[1, :3 * 128].view(3, 128))
    with pytest.raises(ValueError, match=r"page_indices: page ids must fit int32, got values in \[1, 1099511627776\] in the columns rows read"):
        sg.get_index_k_scale_buffer(buf, torch.tensor([5]), torch.tensor([[1, 2**40]]), 5, 8, page_size=4)


def test_read_errors_name_the_callers_buffer():
    seq, table = torch.tensor([1], dtype=torch.int32), torch.tensor([[0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^buf: data pointer"):
        sg.get_index_k_scale_buffer(torch.zeros(2 * 528 + 1, dtype=torch.uint8)[1:].view(2, 528), seq, table, 1, 1,
                                    page_size=4)
    with pytest.raises(ValueError, match=r"^buf: pages overlap"):
        sg.get_index_k_scale_buffer(torch.zeros(4 * 528, dtype=torch.uint8).as_strided((2, 528), (264, 1)), seq,
                                    table, 1, 1, page_size=4)
