"""Round five (issue #36 item 1, issue #37 item 6): a tensor whose bytes are not its values (a
quantized, sparse or nested tensor, a conjugate or negative view) is refused with a TypeError
naming the argument, before anything is written, by the plain function and by
``torch.ops.nvrtc_gather.<op>`` alike (before: a quantized src_cache crashed the interpreter;
a conjugate view raised torch's RuntimeError in one and was resolved in the other)."""
import pytest
import torch

from helpers import hostile_tensors, op_calls

ENTRIES = {"plain": op_calls.plain, "torch.ops": op_calls.registered}
CASES = [(op, i, arg) for op in op_calls.calls() for i, arg in op_calls.tensor_names(op)]


@pytest.mark.parametrize("device", hostile_tensors.DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("kind", hostile_tensors.KINDS)
@pytest.mark.parametrize("op,index,arg", CASES, ids=[f"{o}-{a}" for o, _, a in CASES])
def test_a_tensor_whose_bytes_are_not_its_values_is_refused_by_name(op, index, arg, kind, entry, device):
    """On CUDA after a valid call of the same layout (the op's remembered path)."""
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in op_calls.calls()[op]()]
    if index >= len(args):
        pytest.skip("an optional argument the call leaves out")
    if device == "cuda":
        hostile_tensors.skip_unless_checked_on_cuda(kind, args[index], device)
        ENTRIES[entry](op)(*args)  # remembered
    args[index] = hostile_tensors.make(kind, args[index], device)
    before = [a.clone() for a in args if isinstance(a, torch.Tensor) and a.layout == torch.strided
              and not a.is_quantized and not a.is_nested and not a.is_neg()]
    with pytest.raises(TypeError, match=rf"^{arg}: expected a (dense|plain)"):
        ENTRIES[entry](op)(*args)
    after = [a for a in args if isinstance(a, torch.Tensor) and a.layout == torch.strided
             and not a.is_quantized and not a.is_nested and not a.is_neg()]
    assert all(_same_bytes(x, y) for x, y in zip(before, after))


def _same_bytes(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit for bit (torch.equal calls a NaN unequal to itself: the CUDA call before writes NaNs
    where the random fp8 cache holds NaN codes)."""
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.reshape(-1).view(torch.uint8),
                                                                     y.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("arg", ["src_cache", "dst"])
def test_a_conjugate_view_is_refused_by_name(arg, entry):
    src, dst = torch.randn(2, 4, 4, dtype=torch.complex64), torch.zeros(4, 4, dtype=torch.complex64)
    args = {"src_cache": src, "dst": dst}
    args[arg] = args[arg].conj()
    with pytest.raises(TypeError, match=rf"^{arg}: expected a plain tensor, got a conjugate view"):
        ENTRIES[entry]("cp_gather_cache")(args["src_cache"], args["dst"], torch.tensor([[0, 1]], dtype=torch.int32),
                                          torch.tensor([0, 4], dtype=torch.int32), 1)
    assert not dst.any()


def test_a_quantized_cache_does_not_crash_the_interpreter():
    from helpers.fresh_python import run
    got = run("""
        import json, torch, nvrtc_gather as ng
        q = torch._make_per_tensor_quantized_tensor(torch.zeros(2, 4, 8, dtype=torch.uint8), 1.0, 0)
        d = torch._make_per_tensor_quantized_tensor(torch.zeros(4, 8, dtype=torch.uint8), 1.0, 0)
        names = []
        for f in (ng.cp_gather_cache, torch.ops.nvrtc_gather.cp_gather_cache):
            try:
                f(q, d, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32), 1)
            except TypeError as exc:
                names.append(str(exc).split(":")[0])
        print(json.dumps(names))
    """)
    assert got == ["src_cache", "src_cache"], got
