"""One small valid CPU call of every registered op, as (op name, positional arguments in schema
order): the hostile-input tests transform one tensor argument at a time and compare the plain
function with ``torch.ops.nvrtc_gather.<op>``."""
import torch

import nvrtc_gather as ng
from nvrtc_gather.ops.dsv4_gather import gather_flat

I32 = torch.int32


def calls() -> dict:
    """op name -> a function making fresh arguments (a valid call) each time."""
    bt, cu = (lambda: torch.tensor([[0, 1]], dtype=I32)), (lambda: torch.tensor([0, 4], dtype=I32))
    return {
        "cp_gather_indexer_k_quant_cache": lambda: (
            torch.zeros(2, 16, 132, dtype=torch.uint8), torch.zeros(4, 128, dtype=torch.uint8),
            torch.zeros(4, 4, dtype=torch.uint8), bt(), cu()),
        "indexer_k_quant_and_cache": lambda: (
            torch.randn(2, 128), torch.zeros(2, 16, 132, dtype=torch.uint8), torch.tensor([0, 1]), 128, "ue8m0"),
        "indexer_k_scatter": lambda: (
            torch.zeros(2, 128, dtype=torch.uint8), torch.ones(2, 1), torch.zeros(2, 16, 132, dtype=torch.uint8),
            torch.tensor([0, 1])),
        "concat_and_cache_mla": lambda: (
            torch.randn(2, 512, dtype=torch.bfloat16), torch.randn(2, 64, dtype=torch.bfloat16),
            torch.zeros(1, 16, 656, dtype=torch.uint8), torch.tensor([0, 1]), "fp8_ds_mla", torch.ones(1)),
        "cp_gather_and_upconvert_fp8_kv_cache": lambda: (
            torch.zeros(1, 16, 656, dtype=torch.uint8), torch.zeros(4, 576, dtype=torch.bfloat16),
            torch.tensor([[0]], dtype=I32), torch.tensor([0], dtype=I32), 1),
        "cp_gather_cache": lambda: (
            torch.randn(2, 4, 8), torch.zeros(4, 8), bt(), cu(), 1),
        "gather_and_maybe_dequant_cache": lambda: (
            torch.randint(0, 255, (2, 4, 8), dtype=torch.uint8), torch.zeros(4, 8, dtype=torch.bfloat16), bt(),
            cu(), torch.zeros(4, dtype=I32), 4, "fp8", torch.ones(1)),
        "dequantize_and_gather_k_cache": lambda: (
            torch.zeros(1, 4, 512, dtype=torch.bfloat16), _v4_pages(2).view(2, 4, 584), torch.tensor([3], dtype=I32),
            torch.tensor([2], dtype=I32), torch.tensor([[1]], dtype=I32), 4, 1),
        "dsv4_gather_flat": lambda: (
            _v4_pages(2), torch.tensor([5, 0, 2], dtype=I32), 4, torch.zeros(4, 1, 512, dtype=torch.float8_e4m3fn), 1,
            True),
    }


def _v4_pages(n: int) -> torch.Tensor:
    """n pages of 4 DeepSeek-V4 records (584 bytes: 448 fp8 values, 7 UE8M0 scales, 64 bf16),
    the pool's 2-D buffer; values and scales that decode to finite numbers."""
    return torch.randint(0, 100, (n, 4 * 584), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))


def plain(name: str):
    """The op's plain function (the flat form's: the one both SGLang entries call)."""
    return gather_flat if name == "dsv4_gather_flat" else getattr(ng, name)


def registered(name: str):
    return getattr(torch.ops.nvrtc_gather, name)


def tensor_names(name: str) -> list:
    """The schema's names of the op's tensor arguments, by position: [(index, name)]."""
    schema = registered(name).default._schema
    return [(i, a.name) for i, a in enumerate(schema.arguments) if "Tensor" in str(a.type)]
