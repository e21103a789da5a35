"""Round five (issue #37 item 3): a size-1 last dimension with a non-unit stride (its stride is
never stepped) is accepted on every path: the CPU path raised torch's "self.stride(-1) must be
1 to view Float as Byte" after the plan accepted it."""
import pytest
import torch

import nvrtc_gather as ng

I32 = torch.int32


def _args(dtype):
    src = torch.arange(28, dtype=torch.float64).to(dtype).as_strided((7, 4, 1), (4, 1, 7))
    return src, torch.tensor([[2, 0, 5]], dtype=I32), torch.tensor([0, 10], dtype=I32)


def _want(src, bt):
    flat = src.reshape(7 * 4)[torch.cat([torch.arange(b * 4, b * 4 + 4) for b in bt[0].tolist()])]
    return flat[:10].reshape(10, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float64])
@pytest.mark.parametrize("odd", ["src_cache", "dst", "both"])
def test_cp_gather_cache_size_one_last_dim_any_stride(dtype, odd):
    src, bt, cu = _args(dtype)
    if odd == "dst":
        src = src.contiguous()
    dst = torch.zeros(10, 1, dtype=dtype)
    if odd != "src_cache":  # rows 3 apart, the size-1 dim's stride 5
        dst = torch.zeros(10 * 3, dtype=dtype).as_strided((10, 1), (3, 5))
    ng.cp_gather_cache(src, dst, bt, cu, 1)
    assert torch.equal(dst, _want(src, bt))


@pytest.mark.parametrize("dtype", [torch.float32])  # an entry is a whole number of 4-byte words
def test_dequant_auto_size_one_last_dim_any_stride(dtype):
    src, bt, cu = _args(dtype)
    dst = torch.zeros(30, dtype=dtype).as_strided((10, 1), (3, 5))
    ng.gather_and_maybe_dequant_cache(src, dst, bt, cu, torch.zeros(10, dtype=I32), 10, "auto", torch.ones(1))
    assert torch.equal(dst, _want(src, bt))
