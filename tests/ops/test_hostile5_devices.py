"""Round five (issue #36 item 3, issue #37 item 5): one tensor on another device is refused
with a ValueError naming that tensor, the odd one out whatever its position, by the plain
function and by ``torch.ops.nvrtc_gather.<op>`` alike (before: a tensor on the meta device sent
the registered op to its fake implementation, which wrote nothing and raised nothing; the first
argument moved was blamed on the second)."""
import pytest
import torch

from helpers import op_calls

ENTRIES = {"plain": op_calls.plain, "torch.ops": op_calls.registered}
UNREAD = {("concat_and_cache_mla", "scale")}  # the call's format (fp8_ds_mla) never reads it
CASES = [(op, i, arg) for op in op_calls.calls() for i, arg in op_calls.tensor_names(op)]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("op,index,arg", CASES, ids=[f"{o}-{a}" for o, _, a in CASES])
def test_one_tensor_on_meta_is_named(op, index, arg, entry):
    torch.manual_seed(0)
    args = list(op_calls.calls()[op]())
    if index >= len(args):
        pytest.skip("an optional argument the call leaves out")
    args[index] = args[index].to("meta")
    if (op, arg) in UNREAD:  # any tensor will do: the call writes what an all-CPU one writes
        torch.manual_seed(0)
        want = list(op_calls.calls()[op]())
        op_calls.plain(op)(*want)
        ENTRIES[entry](op)(*args)
        assert all(torch.equal(a, w) for a, w in zip(args, want)
                   if isinstance(a, torch.Tensor) and a.device.type == "cpu")
        return
    with pytest.raises(ValueError, match=rf"^{arg}: expected a tensor on cpu like \w+, got one on meta"):
        ENTRIES[entry](op)(*args)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("op", list(op_calls.calls()))
def test_every_tensor_on_meta_is_refused(op, entry):
    args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in op_calls.calls()[op]()]
    first = op_calls.tensor_names(op)[0][1]
    with pytest.raises(ValueError, match=rf"^{first}: tensors on meta are not supported"):
        ENTRIES[entry](op)(*args)
