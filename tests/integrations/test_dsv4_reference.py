"""The DeepSeek-V4 reference's own contract (tests/helpers/dsv4_reference.py; facts: docs/dsv4_engines.md):
its conversions against torch's where they agree, and the cases the interpreted engine comparison
cannot reach (rounding, saturation, the UE8M0 end bytes, bf16 subnormals)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import dsv4_reference as R


def _u8(t):
    return t.contiguous().view(torch.uint8).numpy()


def test_e4m3_table_and_encode_match_torch_in_range():
    codes = np.arange(256, dtype=np.uint8)
    tv = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(R.e4m3_decode(codes), tv, equal_nan=True)
    x = np.random.default_rng(0).standard_normal(50000).astype(np.float32) * np.float32(60)
    x = np.concatenate([x, np.float32([0, -0.0, 2 ** -10, 3 * 2 ** -11, -(2 ** -11), 1e-30, 447, 448])])
    want = torch.from_numpy(np.clip(x, -448, 448)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(R.e4m3_encode(x), want)


def test_e4m3_encode_saturates_where_torch_gives_nan():
    x = np.float32([464, 479, 480, 1e6, np.inf, -480, -np.inf, np.nan])
    assert R.e4m3_encode(x).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F]


def test_bf16_rounding_matches_torch_including_subnormals():
    rng = np.random.default_rng(1)
    y = np.concatenate([rng.standard_normal(50000) * 1e-39, rng.standard_normal(50000)]).astype(np.float32)
    assert np.array_equal(R.bf16_bits(y), torch.from_numpy(y).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))


def test_ue8m0_end_bytes():
    b = np.array([0, 1, 127, 254, 255], np.uint8)
    assert R.ue8m0_v4(b).tolist() == [0.0, 2.0 ** -126, 1.0, 2.0 ** 127, float("inf")]
    v41 = R.ue8m0_v41(b)
    assert v41[:4].tolist() == [2.0 ** -127, 2.0 ** -126, 1.0, 2.0 ** 127] and np.isnan(v41[4])


def _one_token_cache(nope_codes, scale_bytes, rope_bits, page_size=4, slot=2):
    cache = R.build_cache("v4", 1, page_size, seed=0)
    flat = cache.view(-1)
    flat[slot * 576: slot * 576 + 448] = torch.from_numpy(np.asarray(nope_codes, np.uint8))
    flat[slot * 576 + 448: slot * 576 + 576] = torch.from_numpy(np.asarray(rope_bits, np.uint16).view(np.uint8))
    s0 = page_size * 576 + slot * 8
    flat[s0: s0 + 7] = torch.from_numpy(np.asarray(scale_bytes, np.uint8))
    return cache, torch.tensor([slot])


def test_v4_bf16_row_layout_and_end_scales():
    nope = np.full(448, 0x38, np.uint8)                 # 1.0
    nope[64:128] = 0xB8                                  # -1.0 under a zero scale byte -> -0.0
    scales = np.array([127, 0, 1, 255, 130, 120, 127], np.uint8)
    rope = np.random.default_rng(2).integers(0, 65536, 64).astype(np.uint16)   # any bits, NaNs included
    cache, ids = _one_token_cache(nope, scales, rope)
    row = R.dequantize_k_cache_paged_dsv4(cache, ids, 4)[0, 0].view(torch.int16).numpy().view(np.uint16)
    assert (row[:64] == 0x3F80).all() and (row[64:128] == 0x8000).all()
    assert (row[128:192] == 0x0080).all() and (row[192:256] == 0x7F80).all()   # 2^-126, +inf
    assert (row[256:320] == 0x4100).all() and (row[320:384] == 0x3C00).all()   # 8, 2^-7
    assert np.array_equal(row[448:], rope)


def test_fp8_requant_rounds_to_even_and_saturates():
    nope = np.zeros(448, np.uint8)
    nope[0], nope[1], nope[2], nope[3] = 0x39, 0x3B, 0x7E, 0x01      # 1.125, 1.375, 448, 2^-9
    scales = np.array([126, 127, 127, 127, 127, 127, 127], np.uint8)  # tile 0 halves
    rope = R.bf16_bits(np.float32([1.0625, 1.1875, 500.0, -1e4] + [0.0] * 60))
    cache, ids = _one_token_cache(nope, scales, rope)
    out = R.gather_dequant_requant_fp8_paged_dsv4(cache, ids, 4, extra_rows=2)
    o = _u8(out)
    # 0.5625 = e4m3 0x31 exactly; 0.6875 exact (0x33); 224 (0x76); 2^-10 ties to even -> 0
    assert o[0, 0, :4].tolist() == [0x31, 0x33, 0x76, 0x00]
    # 1.0625 ties between 1.0 (0x38) and 1.125 (0x39): even -> 0x38; 1.1875 -> 0x3A; 500 -> 448; -1e4 -> -448
    assert o[0, 0, 448:452].tolist() == [0x38, 0x3A, 0x7E, 0xFE]
    assert out.shape == (3, 1, 512) and not o[1:].any()


@pytest.mark.parametrize("layout", sorted(R.LAYOUTS))
def test_builder_pages_and_ids(layout):
    lay = R.LAYOUTS[layout]
    cache = R.build_cache(layout, 3, 64, seed=1)
    assert cache.shape == (3, lay.page_bytes(64)) and cache.dtype == torch.uint8
    ids = R.random_token_ids(3, 64, 50)
    assert int(ids.min()) >= 0 and int(ids.max()) < 3 * 64
    out = R.dequantize_k_cache_paged_dsv4(cache, ids, 64, layout=layout)
    assert out.shape == (50, 1, 512)


def test_page_strides_as_the_engines_allocate():
    assert [R.LAYOUTS["v4"].page_bytes(p) for p in (64, 16, 2)] == [37440, 9792, 1728]
    assert R.LAYOUTS["v41_new"].page_bytes(64) == 64 * 528 and R.LAYOUTS["v41_fp4_new"].page_bytes(64) == 64 * 288


def test_vllm_rows_outside_untouched_and_bad_inputs():
    cache = R.build_cache("v4", 4, 16, seed=3)
    k = R.vllm_view(cache, 16)
    bt = torch.tensor([[2, 0, 3], [1, 0, 0]], dtype=torch.int32)
    sl = torch.tensor([40, 5], dtype=torch.int32)
    gl = torch.tensor([20, 0], dtype=torch.int32)
    out = torch.full((2, 30, 512), 7.0, dtype=torch.bfloat16)
    R.dequantize_and_gather_k_cache(out, k, sl, gl, bt, 16, 3)
    assert (out[0, :3] == 7).all() and (out[0, 23:] == 7).all() and (out[1] == 7).all()
    # positions 20..39 of request 0: blocks bt[0, 1] (pos 20..31 -> block 0) and bt[0, 2] (32..39 -> block 3)
    ids = [int(bt[0, p // 16]) * 16 + p % 16 for p in range(20, 40)]
    assert torch.equal(out[0, 3:23].view(torch.int16), R.dequantize_k_cache_paged_dsv4(cache, torch.tensor(ids), 16)[:, 0].view(torch.int16))
    with pytest.raises(ValueError):
        R.dequantize_and_gather_k_cache(out, k, torch.tensor([3], dtype=torch.int32), torch.tensor([4], dtype=torch.int32), bt[:1], 16, 0)
    with pytest.raises(ValueError):
        R.dequantize_k_cache_paged_dsv4(cache, torch.tensor([-1]), 16)
