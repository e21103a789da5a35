"""Tensors whose bytes are not their values (round five's hostile input), made like a given
tensor on its device, for the batteries of the registered ops (tests/ops/test_hostile5_tensors.py),
SGLang's entries (tests/integrations/test_sglang_entries_hostile.py) and the remembered-path
differential (tests/jit/test_remembered_paths_differential.py)."""
import warnings

import pytest
import torch

warnings.filterwarnings("ignore", message=".*(quantize|nested|Sparse CSR).*")

KINDS = {
    "quantized": lambda t: torch._make_per_tensor_quantized_tensor(
        torch.zeros(t.shape, dtype=torch.uint8, device=t.device), 1.0, 0),
    "sparse_coo": lambda t: torch.zeros(t.shape, device=t.device).to_sparse(),
    "sparse_csr": lambda t: torch.zeros(4, 4, device=t.device).to_sparse_csr(),
    "nested": lambda t: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], device=t.device),
    "negative view": lambda t: torch._neg_view(t),
}
IMAG_DTYPES = (torch.float16, torch.float32, torch.float64)  # what a complex's .imag has
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def skip_unless_checked_on_cuda(kind: str, t: torch.Tensor, device: str) -> None:
    """On CUDA a remembered layout reads the negative bit only of the dtypes the public API makes
    such views of (docs/contract.md): skip the rest there."""
    if device == "cuda" and kind == "negative view" and t.dtype not in IMAG_DTYPES:
        pytest.skip("the public API makes a negative view only as a complex's .imag (fp16, fp32, fp64): on "
                    "CUDA the remembered path checks the bit of those dtypes' arguments alone")


def make(kind: str, t: torch.Tensor, device: str) -> torch.Tensor:
    """A ``kind`` tensor like ``t``; skips where torch makes none on CUDA (quantized CUDA
    tensors in some builds); on CPU that is an error."""
    try:
        return KINDS[kind](t)
    except (RuntimeError, NotImplementedError) as e:
        if device == "cpu":
            raise
        pytest.skip(f"torch makes no {kind} tensor on {device}: {type(e).__name__}")
