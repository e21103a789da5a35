"""SGLang's four entries (the index-K read and write, DeepSeek-V4's two flat gathers) get the
battery the registered ops get (tests/ops/test_hostile5_*.py): a tensor whose bytes are not its
values is a TypeError naming it, one tensor on another device a ValueError naming it, and
nothing is written before either; on CUDA after a valid call of the same layout too (the
remembered path). Before: the read and the flat gathers raised torch's
RuntimeError for a sparse CSR or nested tensor (their remembered-layout lookup read its
strides), and a call with every tensor on meta was blamed on overlapping memory."""
import pytest
import torch

from helpers import hostile_tensors, op_calls
from nvrtc_gather.integrations import sglang as sg

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
CASES = [(entry, i, name) for entry, (_, _, names) in ENTRIES.items() for i, name in enumerate(names)]
IDS = [f"{e}-{n}" for e, _, n in CASES]
DEVICES = hostile_tensors.DEVICES


def _call(entry, tensors, rest):
    return ENTRIES[entry][0](tensors, rest)


def _on(device, make):
    tensors, rest = make()
    return [t.to(device) for t in tensors], rest


def _snapshot(tensors):
    return [t.clone() for t in tensors if t.layout == torch.strided and not t.is_quantized and not t.is_nested
            and not t.is_neg() and t.device.type != "meta"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", hostile_tensors.KINDS)
@pytest.mark.parametrize("entry,index,name", CASES, ids=IDS)
def test_a_tensor_whose_bytes_are_not_its_values_is_refused_by_name(entry, index, name, kind, device):
    tensors, rest = _on(device, ENTRIES[entry][1])
    hostile_tensors.skip_unless_checked_on_cuda(kind, tensors[index], device)
    _call(entry, tensors, rest)  # a valid call first: on CUDA its layout is remembered
    tensors[index] = hostile_tensors.make(kind, tensors[index], device)
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
