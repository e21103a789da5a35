"""Round five (issue #36 item 1, issue #37 item 6): a tensor whose bytes are not its values (a
quantized, sparse or nested tensor, a conjugate or negative view) is refused with a TypeError
naming the argument, before anything is written, by the plain function and by
``torch.ops.nvrtc_gather.<op>`` alike (before: a quantized src_cache crashed the interpreter;
a conjugate view raised torch's RuntimeError in one and was resolved in the other)."""
import warnings

import pytest
import torch

from helpers import op_calls

warnings.filterwarnings("ignore", message=".*(quantize|nested).*")


def _quantized(t):
    return torch._make_per_tensor_quantized_tensor(torch.zeros(t.shape, dtype=torch.uint8, device=t.device), 1.0, 0)


def _nested(t):
    return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], device=t.device)


HOSTILE = {
    "quantized": _quantized,
    "sparse_coo": lambda t: torch.zeros(t.shape, device=t.device).to_sparse(),
    "sparse_csr": lambda t: torch.zeros(4, 4, device=t.device).to_sparse_csr(),
    "nested": _nested,
    "negative view": lambda t: torch._neg_view(t),
}
ENTRIES = {"plain": op_calls.plain, "torch.ops": op_calls.registered}
CASES = [(op, i, arg) for op in op_calls.calls() for i, arg in op_calls.tensor_names(op)]
IMAG_DTYPES = (torch.float16, torch.float32, torch.float64)  # what a complex's .imag has
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("op,index,arg", CASES, ids=[f"{o}-{a}" for o, _, a in CASES])
def test_a_tensor_whose_bytes_are_not_its_values_is_refused_by_name(op, index, arg, kind, entry, device):
    """On CUDA after a valid call of the same layout (the op's remembered path)."""
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in op_calls.calls()[op]()]
    if index >= len(args):
        pytest.skip("an optional argument the call leaves out")
    if device == "cuda":
        if kind == "negative view" and args[index].dtype not in IMAG_DTYPES:
            pytest.skip("the public API makes a negative view only as a complex's .imag (fp16, fp32, fp64): "
                        "on CUDA the remembered path checks the bit of those dtypes' arguments alone")
        ENTRIES[entry](op)(*args)  # remembered
    try:
        args[index] = HOSTILE[kind](args[index])
    except (RuntimeError, NotImplementedError) as e:  # quantized CUDA tensors in some torch builds
        if device == "cpu":
            raise
        pytest.skip(f"torch makes no {kind} tensor on {device}: {type(e).__name__}")
    before = [a.clone() for a in args if isinstance(a, torch.Tensor) and a.layout == torch.strided
              and not a.is_quantized and not a.is_nested and not a.is_neg()]
    with pytest.raises(TypeError, match=rf"^{arg}: expected a (dense|plain)"):
        ENTRIES[entry](op)(*args)
    after = [a for a in args if isinstance(a, torch.Tensor) and a.layout == torch.strided
             and not a.is_quantized and not a.is_nested and not a.is_neg()]
    assert all(torch.equal(x, y) for x, y in zip(before, after))


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
