"""The torch (CPU) path of the gather against the independent per-token reference."""
import random

import pytest
import torch

import nvrtc_gather as ng
from helpers.reference import SENTINEL, gather_reference, make_gather_case


def _check(case):
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    k, s = gather_reference(case.kv_cache, case.block_table, case.cu_seq_lens, case.dst_k.size(0),
                            case.head_dim, case.scale_words)
    assert torch.equal(case.dst_k.view(torch.uint8).cpu(), k), case.desc
    assert torch.equal(case.dst_scale.view(torch.uint8).cpu(), s), case.desc


def grid_params(seed, n):
    rng = random.Random(seed)
    out = []
    for bs in (1, 16, 64):
        for hd in (64, 128, 256):
            for qbs in [q for q in (32, 64, 128, 256) if q <= hd]:
                out.append((bs, hd, qbs))
    picks = []
    for i in range(n):
        bs, hd, qbs = out[i % len(out)]
        batch = rng.choice([1, 2, 7, 33, 128, 300])
        picks.append((seed * 1000 + i, bs, hd, qbs, batch))
    return picks


@pytest.mark.parametrize("seed,bs,hd,qbs,batch", grid_params(1, 60))
def test_cpu_matches_reference_on_random_grid(seed, bs, hd, qbs, batch):
    rng = random.Random(seed)
    max_len = rng.choice([1, 5, 64, 200]) if batch > 100 else rng.choice([1, 5, 64, 200, 700])
    _check(make_gather_case(rng, block_size=bs, head_dim=hd, quant_block_size=qbs, batch=batch, max_len=max_len))


def test_upper_bound_rows_keep_their_contents():
    rng = random.Random(5)
    case = make_gather_case(rng, block_size=16, head_dim=128, quant_block_size=128, batch=9, extra_rows=40)
    total = int(case.cu_seq_lens[-1])
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    assert bool((case.dst_k.view(torch.uint8)[total:] == SENTINEL).all())
    assert bool((case.dst_scale.view(torch.uint8)[total:] == SENTINEL).all())
    assert not bool((case.dst_k.view(torch.uint8)[:total] == SENTINEL).all(dim=1).any())


@pytest.mark.parametrize("lens", [[0], [0, 0, 0], [0, 5, 0, 64, 0], [64, 64], [1], [65]])
def test_empty_partial_and_exact_requests(lens):
    rng = random.Random(len(lens))
    _check(make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=64, batch=len(lens), lens=lens,
                            extra_rows=3))


def test_strided_views_and_padded_cache_stride():
    rng = random.Random(11)
    for _ in range(5):
        _check(make_gather_case(rng, block_size=16, head_dim=256, quant_block_size=32, batch=20, strided=True))


def test_zero_rows_and_zero_batch_are_no_ops():
    kv = torch.randint(0, 256, (4, 16, 132), dtype=torch.uint8)
    ng.cp_gather_indexer_k_quant_cache(kv, torch.empty(0, 128, dtype=torch.uint8), torch.empty(0, 4, dtype=torch.uint8),
                                       torch.zeros(0, 3, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))


def _simple():
    kv = torch.randint(0, 256, (4, 16, 132), dtype=torch.uint8)
    dst_k = torch.full((40, 128), SENTINEL, dtype=torch.uint8)
    dst_s = torch.full((40, 4), SENTINEL, dtype=torch.uint8)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    cu = torch.tensor([0, 20, 30], dtype=torch.int32)
    return kv, dst_k, dst_s, bt, cu


@pytest.mark.parametrize("mutate,match", [
    (lambda bt, cu: cu.__setitem__(0, 1), r"cu_seq_lens\[0\] must be 0"),
    (lambda bt, cu: cu.__setitem__(1, 40), "non-decreasing"),
    (lambda bt, cu: cu.__setitem__(2, 41), "exceeds the 40 rows"),
    (lambda bt, cu: bt.__setitem__((1, 0), 4), "outside"),
    (lambda bt, cu: bt.__setitem__((0, 1), -1), "outside"),
    (lambda bt, cu: cu.copy_(torch.tensor([0, 33, 35])), "more than its 2 columns"),
])
def test_cpu_path_rejects_malformed_indices_before_writing(mutate, match):
    kv, dst_k, dst_s, bt, cu = _simple()
    mutate(bt, cu)
    with pytest.raises(ValueError, match=match):
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    assert bool((dst_k == SENTINEL).all()) and bool((dst_s == SENTINEL).all())


def test_fp8_kv_cache_dtype_is_accepted():
    rng = random.Random(3)
    case = make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=4)
    case.kv_cache = case.kv_cache.view(torch.float8_e4m3fn)
    _check(case)


def test_rows_per_block():
    from nvrtc_gather.kernels.gather import tokens_per_cta
    assert tokens_per_cta(128, 950000, 132) == 128   # big calls: 16 KiB of fp8 data per block
    assert tokens_per_cta(512, 10 ** 6, 132) == 32
    assert tokens_per_cta(128, 1000, 132) == 8       # small calls: spread over the SMs, >= 8 rows
    assert tokens_per_cta(128, 20000, 132) == 76     # ~2 blocks per SM
    assert tokens_per_cta(4, 10 ** 6, 132) == 256    # never more rows than threads
    # 16 KiB blocks filling 3/4 to 1 wave (6 to 8 per SM): 32 KiB blocks instead.
    assert tokens_per_cta(128, 131072, 132) == 256
    assert tokens_per_cta(128, 128 * 132 * 8, 132) == 256
    assert tokens_per_cta(128, 128 * 132 * 8 + 1, 132) == 128
    assert tokens_per_cta(128, 128 * 132 * 6, 132) == 128
    assert tokens_per_cta(128, 128 * 132 * 6 + 1, 132) == 256
    assert tokens_per_cta(512, 30000, 132) == 64
    assert tokens_per_cta(64, 100000, 132) == 256    # 16 KiB is already 256 rows: no wider block


def test_each_block_shape_has_its_kernel():
    from nvrtc_gather.kernels.gather import entry_for
    assert entry_for(16, 128, 128) == "gather_indexer_k_v16"
    assert entry_for(4, 76, 128) == "gather_indexer_k_v4"
    assert entry_for(16, 256, 128) == "gather_indexer_k_v16_wide"
    assert entry_for(8, 64, 512) == "gather_indexer_k_v8_wide"
    assert entry_for(16, 256, 64) == "gather_indexer_k_v16"
    assert entry_for(4, 8, 128) == "gather_indexer_k_v4_tiny"   # small calls: a warp per row
    assert entry_for(16, 8, 2048) == "gather_indexer_k_v16"     # 8 rows of 2 KiB: a full block
