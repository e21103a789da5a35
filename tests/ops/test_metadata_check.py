"""The layout memos' ``last`` slot (ops/fast_path.py): torch's C-level metadata check stands for
building a call's key and looking it up, so it must refuse every difference the key holds, never
abort the process (TensorGuards aborts on a nested tensor), and the memo must hand out the layout
it was built for. The ops' own remembered paths are held to their full checks in
tests/jit/test_remembered_paths_differential.py, which runs each changed call right after a
remembered one (so through this check)."""
import warnings

import pytest
import torch

from nvrtc_gather.ops import fast_path

warnings.filterwarnings("ignore", message=".*nested.*")


def test_torch_has_a_check_that_behaves_as_relied_on():
    # Without it every op still works (the dict alone), at ~0.6 µs more a call: say so loudly.
    assert fast_path._make_check is not None, (
        f"torch {torch.__version__}: torch._C._dynamo.guards.TensorGuards is missing or behaves otherwise "
        "(fast_path._metadata_check_factory's probe); the memos fall back to their dicts")


class Sub(torch.Tensor):
    pass


def _base():
    return torch.zeros(4, 6), torch.zeros(8, dtype=torch.int64), torch.zeros(3, 2, dtype=torch.int32)


CHANGES = {
    "dtype": lambda t: t.to(torch.float64 if t.is_floating_point() else torch.int16),
    "shape": lambda t: torch.zeros(t.numel() + 1, dtype=t.dtype).view(-1)[: t.numel() + 1],
    "stride": lambda t: torch.zeros(*t.shape, 2, dtype=t.dtype)[..., 0],
    "device": lambda t: torch.zeros(t.shape, dtype=t.dtype, device="meta"),
    "negative view": lambda t: t.clone()._neg_view(),
    "subclass": lambda t: t.clone().as_subclass(Sub),
    "nested": lambda t: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]),
    "sparse": lambda t: t.clone().to_sparse(),
    "0-d": lambda t: torch.zeros((), dtype=t.dtype),
}


@pytest.mark.parametrize("position", range(3))
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_check_refuses_every_metadata_difference(change, position):
    base = _base()
    check = fast_path._make_check(base)
    assert check(*_base()) is True  # other tensors, same metadata
    args = list(_base())
    args[position] = CHANGES[change](args[position])
    if change in ("shape", "stride"):
        assert args[position].shape != base[position].shape or args[position].stride() != base[position].stride()
    assert not check(*args)


def test_check_refuses_other_modes_and_raises_attribute_error_for_non_tensors():
    check = fast_path._make_check(_base())
    a, b, c = _base()
    assert check(a, b, torch.zeros(3, 2, dtype=torch.int32)) is True
    g = torch.zeros(4, 6, requires_grad=True)
    assert not check(g, b, c)
    with torch.inference_mode():  # the dispatch keys torch applies in this mode differ: a miss, not an error
        assert not check(a, b, torch.zeros(3, 2, dtype=torch.int32))
    with pytest.raises(AttributeError):
        check(a, 3, c)


def test_memo_find_and_remember_set_last():
    memo = fast_path.LayoutMemo(max_size=2)
    check, others, layout = memo.last
    assert layout is None and not check(*_base())
    memo.remember("k1", "L1", _base(), ("o", 1))
    check, others, layout = memo.last
    assert (others, layout) == (("o", 1), "L1") and check(*_base())
    memo.remember("k2", "L2", (torch.zeros(2),), None)
    assert memo.last[2] == "L2" and memo.find("k1") == "L1" and memo.last[2] == "L1"
    memo.remember("k3", "L3")  # no tensors: the dict only, ``last`` kept
    assert memo.last[2] == "L1" and memo.find("k3") == "L3" and memo.last[2] == "L1"
    assert len(memo) <= 2 and memo.find("missing") is None
