"""concat_and_cache_mla's bytes for +-inf, NaN of either sign and overflow on the CPU path: what
vLLM's kernels write (csrc/libtorch_stable/cache_kernels.cu @00eb0c87: fmaxf amax, which leaves
NaNs out; __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3): overflow and +-inf to
+-448, every NaN 0x7f). The emulator and GPU tests compare the kernels with this path."""
import pytest
import torch

import nvrtc_gather as ng

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_plain_fp8_saturates_overflow_and_inf_and_writes_0x7f_for_every_nan(dtype):
    kv_c = torch.zeros(1, 8, dtype=dtype)
    k_pe = torch.zeros(1, 8, dtype=dtype)
    kv_c[0, :8] = torch.tensor([1000.0, -1000.0, INF, -INF, NAN, -NAN, 1.0, -0.0]).to(dtype)
    cache = torch.full((1, 4, 16), 0xA5, dtype=torch.uint8)
    ng.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([2]), "fp8", torch.tensor([0.5]))
    assert cache[0, 2, :8].tolist() == [0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7F, 0x40, 0x80]
    assert cache[0, 2, 8:].tolist() == [0] * 8 and bool((cache[0, [0, 1, 3]] == 0xA5).all())


def test_fp8_ds_mla_inf_and_nan_tiles():
    kv_c = torch.randn(1, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    kv_c[0, 5], kv_c[0, 6] = INF, -INF   # tile 0: scale inf, finite values +-0, the infs 0x7f
    kv_c[0, 200] = -NAN                  # tile 1: NaN left out of amax, itself 0x7f
    k_pe = torch.randn(1, 64).to(torch.bfloat16)
    cache = torch.zeros(1, 1, 656, dtype=torch.uint8)
    ng.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([0]), "fp8_ds_mla", torch.ones(1))
    rec = cache[0, 0]
    scales = rec[512:528].contiguous().view(torch.float32)
    assert scales[0].item() == INF and torch.isfinite(scales[1:]).all()
    tile0 = kv_c[0, :128].float()
    want0 = torch.where(torch.isinf(tile0), 0x7F, torch.where(torch.signbit(tile0), 0x80, 0)).to(torch.uint8)
    assert torch.equal(rec[:128], want0)
    assert rec[200].item() == 0x7F
    others = torch.cat([kv_c[0, 128:200], kv_c[0, 201:256]]).float().abs()
    assert scales[1].item() >= others.max().item() / 448  # amax of the finite values only
    assert not bool((rec[:512] == 0xFF).any())
