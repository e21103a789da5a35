"""The NVRTC kernel, bit-exact against the references, on a real GPU.

Outputs are poisoned first (every unwritten row shows), inputs are random bytes (never
zeros). Small cases compare with the independent per-token reference; large ones with
the vectorized torch path run on the GPU (itself checked against the reference on CPU)."""
import itertools
import os
import random
import subprocess
import sys

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather.ops import gather
from nvrtc_gather.ops.gather_torch import gather_torch
from helpers.reference import (MALFORMED, SENTINEL, SINGLE_REQUEST_FAULTS, assert_no_allocation_on_a_side_stream,
                       assert_only_rows_skipped, assert_single_request_result, bad_block_id_case, break_indices,
                       gather_reference, make_gather_case, single_request_case, small_gather_case, to_device)

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn


def _run_and_compare(case_cpu, device="cuda"):
    k_ref, s_ref = gather_reference(case_cpu.kv_cache, case_cpu.block_table, case_cpu.cu_seq_lens,
                                    case_cpu.dst_k.size(0), case_cpu.head_dim, case_cpu.scale_words)
    case = to_device(case_cpu, device)
    ng.cp_gather_indexer_k_quant_cache(*case.args())
    torch.cuda.synchronize()
    assert torch.equal(case.dst_k.view(torch.uint8).cpu(), k_ref), case.desc
    assert torch.equal(case.dst_scale.view(torch.uint8).cpu(), s_ref), case.desc


def _grid():
    rng = random.Random(7)
    out = []
    for bs in (1, 16, 64):
        for hd in (64, 128, 256):
            for qbs in [q for q in (32, 64, 128, 256) if q <= hd]:
                for batch in (1, 37, 300):
                    out.append((rng.randrange(1 << 30), bs, hd, qbs, batch))
    return out


@pytest.mark.parametrize("seed,bs,hd,qbs,batch", _grid())
def test_kernel_matches_reference_on_grid(seed, bs, hd, qbs, batch):
    rng = random.Random(seed)
    _run_and_compare(make_gather_case(rng, block_size=bs, head_dim=hd, quant_block_size=qbs, batch=batch,
                                      max_len=rng.choice([1, 5, 64, 200])))


@pytest.mark.parametrize("bs,hd,qbs", [(64, 128, 128), (16, 64, 32), (1, 256, 64)])
def test_search_of_many_requests(bs, hd, qbs):
    """The 32-ary search at its level boundaries: 2 levels from 33 requests, 3 from 1025."""
    rng = random.Random(bs * hd)
    for batch in (32, 33, 1024, 1025, 2000):
        _run_and_compare(make_gather_case(rng, block_size=bs, head_dim=hd, quant_block_size=qbs, batch=batch,
                                          max_len=rng.choice([3, 8])))


@pytest.mark.parametrize("offset,vec", [(0, 16), (8, 8), (4, 4), (12, 4)])
def test_every_vector_width(offset, vec):
    """Misaligned (but 4-byte aligned) pointers pick narrower vectors and stay exact."""
    rng = random.Random(offset)
    c = make_gather_case(rng, block_size=16, head_dim=128, quant_block_size=64, batch=20, strided=False,
                         extra_rows=5)
    g = to_device(c, "cuda")
    store = torch.full((g.dst_k.numel() + 64,), SENTINEL, dtype=torch.uint8, device="cuda")
    g.dst_k = store[offset: offset + g.dst_k.numel()].view(g.dst_k.shape).view(g.dst_k.dtype)
    assert gather.plan_gather(*g.args()).vec == vec
    k_ref, s_ref = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 2)
    ng.cp_gather_indexer_k_quant_cache(*g.args())
    assert torch.equal(g.dst_k.view(torch.uint8).cpu(), k_ref)
    assert torch.equal(g.dst_scale.view(torch.uint8).cpu(), s_ref)
    assert bool((store[:offset] == SENTINEL).all()) and bool((store[offset + g.dst_k.numel():] == SENTINEL).all())


def _random_ragged(rng, batch, mean, empty_frac=0.1):
    return [0 if rng.random() < empty_frac else max(1, int(rng.uniform(0.5, 1.5) * mean)) for _ in range(batch)]


def _device_case(lens, block_size=64, head_dim=128, nq=1, extra_rows=17, num_blocks=None, high_blocks=False,
                 seed=0):
    """A large case built directly on the GPU: random cache bytes, shuffled blocks."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per = [(n + block_size - 1) // block_size for n in lens]
    need = sum(blocks_per)
    num_blocks = num_blocks or need + 11
    cs = head_dim + 4 * nq
    kv = torch.randint(0, 256, (num_blocks, block_size, cs), dtype=torch.uint8, device="cuda", generator=g)
    ids = torch.randperm(num_blocks, device="cuda", generator=g)
    if high_blocks:  # use the highest block ids so byte offsets pass 4 GiB
        ids = torch.arange(num_blocks - need, num_blocks, device="cuda")[torch.randperm(need, device="cuda", generator=g)]
    max_blocks = max(blocks_per + [1])
    bt = torch.randint(0, num_blocks, (len(lens), max_blocks), dtype=torch.int32, device="cuda", generator=g)
    starts = [0]
    for n in blocks_per:
        starts.append(starts[-1] + n)
    rows = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(blocks_per, device="cuda"))
    cols = torch.arange(need, device="cuda") - torch.tensor(starts[:-1], device="cuda").repeat_interleave(
        torch.tensor(blocks_per, device="cuda"))
    bt[rows, cols] = ids[:need].to(torch.int32)
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    n_rows = sum(lens) + extra_rows
    dst_k = torch.full((n_rows, head_dim), SENTINEL, dtype=torch.uint8, device="cuda").view(FP8)
    dst_s = torch.full((n_rows, nq), 0, dtype=torch.float32, device="cuda")
    dst_s.view(torch.uint8).fill_(SENTINEL)
    return kv, dst_k, dst_s, bt, cu


def _check_against_torch_path(args):
    kv, dst_k, dst_s, bt, cu = args
    ref_k, ref_s = dst_k.clone(), dst_s.clone()
    plan = gather.plan_gather(kv, ref_k, ref_s, bt, cu)
    gather_torch(plan, kv, ref_k, ref_s, bt, cu)
    ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    torch.cuda.synchronize()
    assert torch.equal(dst_k.view(torch.uint8), ref_k.view(torch.uint8))
    assert torch.equal(dst_s.view(torch.uint8), ref_s.view(torch.uint8))
    total = int(cu[-1])
    assert bool((dst_k.view(torch.uint8)[total:] == SENTINEL).all())
    assert not bool((dst_k.view(torch.uint8)[:total] == SENTINEL).all(dim=1).any())


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 16, 17, 32, 33])
@pytest.mark.parametrize("bs", [1, 4, 16, 64])
def test_tiny_kernel_block_table_window(batch, bs, monkeypatch):
    """The tiny kernel (forced: 8 rows per block) takes a row's block_table entry from the
    window its lanes load with cu_seq_lens when the row's column is inside it, and loads it
    otherwise; both match the reference, strided tables included."""
    _force_rows_per_block(monkeypatch, 8)
    rng = random.Random(batch * 100 + bs)
    _run_and_compare(make_gather_case(rng, block_size=bs, head_dim=128, quant_block_size=128, batch=batch,
                                      max_len=rng.choice([3, 70, 700]), strided=bool(bs % 2)))


@pytest.mark.slow
def test_one_request_of_131072_tokens():
    _check_against_torch_path(_device_case([131072], seed=1))


@pytest.mark.parametrize("head_dim,nq,parts", [(128, 1, [0.99]), (128, 1, [0.5, 0, 0.4, 0.0001]),
                                               (512, 4, [0.45, 0.45])])
def test_wide_blocks(head_dim, nq, parts):
    """Calls of 3/4 to 1 wave of 16 KiB blocks run the wide kernels (twice the rows per
    block, 8 loads per thread). ``parts``: request lengths as fractions of one wave."""
    wave = (16384 // head_dim) * gather.driver.sm_count(0) * 8
    args = _device_case([max(1, int(f * wave)) if f else 0 for f in parts], head_dim=head_dim, nq=nq,
                        seed=len(parts))
    plan = gather.plan_gather(*args)
    assert gather.launch_config(plan).entry.endswith("_wide")
    _check_against_torch_path(args)


@pytest.mark.slow
def test_4096_requests():
    _check_against_torch_path(_device_case(_random_ragged(random.Random(2), 4096, 64), seed=2))


@pytest.mark.slow
def test_head_dim_512_and_small_quant_blocks():
    _check_against_torch_path(_device_case(_random_ragged(random.Random(3), 64, 900), head_dim=512, nq=16, seed=3))


@pytest.mark.slow
def test_cache_above_4_gib():
    block_bytes = 64 * 132
    num_blocks = (4 << 30) // block_bytes + 2000  # ~4.3 GB, the used blocks all above the 4 GiB mark
    args = _device_case(_random_ragged(random.Random(4), 16, 5000), num_blocks=num_blocks, high_blocks=True, seed=4)
    assert args[0].numel() > (4 << 30)
    _check_against_torch_path(args)
    del args
    torch.cuda.empty_cache()


# Rows per block for the bad-index tests: the op's choice for these small cases (the tiny
# kernel, a warp per row) and 37 (the 16 KiB-block kernel).
SHAPES = pytest.mark.parametrize("tpc", [None, 37], ids=["tiny", "blocks"])


def _force_rows_per_block(monkeypatch, tpc):
    if tpc is not None:
        monkeypatch.setattr(gather_kernels, "tokens_per_cta", lambda head_dim, num_tokens, sm_count: tpc)
        monkeypatch.setattr(gather, "_layouts", gather.LayoutMemo())  # no layout planned with another choice


@SHAPES
@pytest.mark.parametrize("what", MALFORMED)
def test_malformed_indices_are_skipped_without_touching_other_memory(what, tpc, monkeypatch):
    _force_rows_per_block(monkeypatch, tpc)
    c = to_device(small_gather_case(), "cuda")
    break_indices(c, what)
    ng.cp_gather_indexer_k_quant_cache(*c.args())  # no crash, no out-of-bounds access (memcheck run)
    torch.cuda.synchronize()
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match="debug mode"):
        ng.cp_gather_indexer_k_quant_cache(*c.args())


def test_debug_mode_is_silent_on_good_input(monkeypatch):
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    _run_and_compare(small_gather_case())


@SHAPES
def test_rows_with_good_indices_survive_a_bad_block_id(tpc, monkeypatch):
    _force_rows_per_block(monkeypatch, tpc)
    c_cpu, k_ref, bad = bad_block_id_case()
    c = to_device(c_cpu, "cuda")
    ng.cp_gather_indexer_k_quant_cache(*c.args())
    assert_only_rows_skipped(c.dst_k.view(torch.uint8).cpu(), k_ref, bad)


def test_no_allocation_and_current_stream():
    c = to_device(small_gather_case(), "cuda")
    assert_no_allocation_on_a_side_stream(lambda: ng.cp_gather_indexer_k_quant_cache(*c.args()))


def test_second_process_on_warm_cache_compiles_nothing(tmp_path):
    code = ("import torch, nvrtc_gather as ng, sys; sys.path.insert(0, 'tests');"
            "from nvrtc_gather.jit import build; from helpers.reference import *; import random;"
            "c = to_device(make_gather_case(random.Random(1), block_size=64, head_dim=128, quant_block_size=128, "
            "batch=3), 'cuda'); ng.cp_gather_indexer_k_quant_cache(*c.args()); torch.cuda.synchronize();"
            "print(build.stats['compiles'])")
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    first = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.split()[-1] == "1" and second.stdout.split()[-1] == "0"


@SHAPES
@pytest.mark.parametrize("what", SINGLE_REQUEST_FAULTS)
def test_single_request_speculation_never_uses_a_bad_guess(what, tpc, monkeypatch):
    """One request: the 16 KiB-block kernel fetches block ids before cu_seq_lens[0] is
    known to be 0; the tiny kernel must handle the same inputs."""
    _force_rows_per_block(monkeypatch, tpc)
    c_cpu, k_ref = single_request_case(what)
    c = to_device(c_cpu, "cuda")
    ng.cp_gather_indexer_k_quant_cache(*c.args())
    assert_single_request_result(c.dst_k.view(torch.uint8).cpu(), k_ref, what)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match="debug mode"):
        ng.cp_gather_indexer_k_quant_cache(*c.args())
