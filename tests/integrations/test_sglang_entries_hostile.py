"""SGLang's four entries (the index-K read and write, DeepSeek-V4's two flat gathers) get the
battery the registered ops get (tests/ops/test_hostile5_*.py): a tensor whose bytes are not its
values is a TypeError naming it, one tensor on another device a ValueError naming it, and
nothing is written before either; on CUDA after a valid call of the same layout too (the
remembered path). Before: the read and the flat gathers raised torch's
RuntimeError for a sparse CSR or nested tensor (their remembered-layout lookup read its
strides), and a call with every tensor on meta was blamed on overlapping memory."""
import warnings

import pytest
import torch

from helpers import op_calls
from nvrtc_gather.integrations import sglang as sg

warnings.filterwarnings("ignore", message=".*(quantize|nested|Sparse CSR).*")

I32 = torch.int32
_READ_PAGE = 64 * 132  # bytes of a 64-token page of the index buffer (128 fp8 values, 1 scale)


def _read():
    buf = torch.randint(0, 256, (3, _READ_PAGE), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    return (buf, torch.tensor([10, 70], dtype=I32), torch.tensor([[2, 0], [1, 0]], dtype=I32)), (80, 70)


def _write():
    return (torch.zeros(3, _READ_PAGE, dtype=torch.uint8), torch.tensor([5, 130]),
            torch.ones(2, 128, dtype=torch.uint8), torch.ones(2, 1)), ()


def _flat():
    return (op_calls.calls()["dsv4_gather_flat"]()[0], torch.tensor([5, 0, 2], dtype=I32)), (4,)


# entry -> (the function, (its tensors in order, its other positional arguments), tensor names)
ENTRIES = {
    "get_index_k_scale_buffer": (lambda t, rest: sg.get_index_k_scale_buffer(t[0], t[1], t[2], *rest), _read,
                                 ("buf", "seq_len_tensor", "page_indices")),
    "set_index_k_scale_buffer": (lambda t, rest: sg.set_index_k_scale_buffer(*t), _write,
                                 ("buf", "loc", "index_k", "index_k_scale")),
    "dequantize_k_cache_paged_dsv4": (lambda t, rest: sg.dequantize_k_cache_paged_dsv4(*t, *rest), _flat,
                                      ("quant_k_cache", "page_table_1_flattened")),
    "gather_dequant_requant_fp8_paged_dsv4": (lambda t, rest: sg.gather_dequant_requant_fp8_paged_dsv4(*t, *rest, 2),
                                              _flat, ("quant_k_cache", "page_table_1_flattened")),
}
HOSTILE = {
    "quantized": lambda t: torch._make_per_tensor_quantized_tensor(torch.zeros(t.shape, dtype=torch.uint8,
                                                                               device=t.device), 1.0, 0),
    "sparse_coo": lambda t: torch.zeros(t.shape, device=t.device).to_sparse(),
    "sparse_csr": lambda t: torch.zeros(4, 4, device=t.device).to_sparse_csr(),
    "nested": lambda t: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], device=t.device),
    "negative view": lambda t: torch._neg_view(t),
}
CASES = [(entry, i, name) for entry, (_, _, names) in ENTRIES.items() for i, name in enumerate(names)]
IDS = [f"{e}-{n}" for e, _, n in CASES]
IMAG_DTYPES = (torch.float16, torch.float32, torch.float64)  # what a complex's .imag has
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def _call(entry, tensors, rest):
    return ENTRIES[entry][0](tensors, rest)


def _on(device, make):
    tensors, rest = make()
    return [t.to(device) for t in tensors], rest


def _snapshot(tensors):
    return [t.clone() for t in tensors if t.layout == torch.strided and not t.is_quantized and not t.is_nested
            and not t.is_neg() and t.device.type != "meta"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("entry,index,name", CASES, ids=IDS)
def test_a_tensor_whose_bytes_are_not_its_values_is_refused_by_name(entry, index, name, kind, device):
    tensors, rest = _on(device, ENTRIES[entry][1])
    if device == "cuda" and kind == "negative view" and tensors[index].dtype not in IMAG_DTYPES:
        pytest.skip("the public API makes a negative view only as a complex's .imag (fp16, fp32, fp64): on "
                    "CUDA the remembered path checks the bit of those dtypes' arguments alone")
    _call(entry, tensors, rest)  # a valid call first: on CUDA its layout is remembered
    try:
        tensors[index] = HOSTILE[kind](tensors[index])
    except (RuntimeError, NotImplementedError) as e:  # quantized CUDA tensors in some torch builds
        if device == "cpu":
            raise
        pytest.skip(f"torch makes no {kind} tensor on {device}: {type(e).__name__}")
    before = _snapshot(tensors)
    with pytest.raises(TypeError, match=rf"^{name}: expected a (dense|plain)"):
        _call(entry, tensors, rest)
    assert all(torch.equal(x, y) for x, y in zip(before, _snapshot(tensors)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,index,name", CASES, ids=IDS)
def test_one_tensor_on_meta_is_named(entry, index, name, device):
    tensors, rest = _on(device, ENTRIES[entry][1])
    _call(entry, tensors, rest)
    tensors[index] = tensors[index].to("meta")
    before = _snapshot(tensors)
    with pytest.raises(ValueError, match=rf"^{name}: expected a tensor on {device}(:0)? like \w+, got one on meta"):
        _call(entry, tensors, rest)
    assert all(torch.equal(x, y) for x, y in zip(before, _snapshot(tensors)))


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_tensor_on_meta_is_refused(entry):
    tensors, rest = ENTRIES[entry][1]()
    with pytest.raises(ValueError, match=rf"^{ENTRIES[entry][2][0]}: tensors on meta are not supported"):
        _call(entry, [t.to("meta") for t in tensors], rest)
