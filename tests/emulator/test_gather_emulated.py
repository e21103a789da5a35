"""The gather kernel itself (cuda_src/gather_indexer_k.cu) run on the host by the
thread-per-lane emulator (tests/helpers/cuda_host_emu.cpp), with the entry point, grid and packed
PARAMS bytes the op hands the GPU: bit-exact against the per-token reference, with
poisoned outputs. This checks the kernel's search, single-request speculation and
bad-index paths, both block shapes (16 KiB, and wide) and all three vector widths
without a GPU, with several rows-per-block choices (the op picks it
at run time). Skipped without a C++20 compiler; test_gather_gpu.py runs the same
kernels on a GPU."""
import ctypes
import random

import pytest
import torch

from nvrtc_gather.ops import gather
from nvrtc_gather.kernels import gather as gather_kernels
from helpers.host_emu import emu_launch, emulator
from helpers.mxfp4_cache import make_mxfp4_case, ragged_lens
from helpers.reference import (MALFORMED, SENTINEL, SINGLE_REQUEST_FAULTS, assert_only_rows_skipped,
                       assert_single_request_result, bad_block_id_case, break_indices, gather_reference,
                       make_gather_case, single_request_case, small_gather_case)

H200_SMS = 132
BUILDS = {"default": ()}  # the op's build (-D options of other builds would go here)


def run_kernel(dll, case, tokens_per_cta=None, err=None):
    """What the op does on a GPU for ``case`` (CPU tensors), with the kernel run by the emulator."""
    plan = gather.plan_gather(*case.args())
    tpc = tokens_per_cta or gather_kernels.tokens_per_cta(plan.head_dim, plan.num_tokens, H200_SMS)
    name, grid, fields = gather.launch_config(plan._replace(tokens_per_cta=tpc))
    emu_launch(dll, gather_kernels.PARAMS, name, grid, fields, 0 if err is None else err.data_ptr())


def check(dll, case, tokens_per_cta=None):
    k_ref, s_ref = gather_reference(case.kv_cache, case.block_table, case.cu_seq_lens, case.dst_k.size(0),
                                    case.head_dim, case.scale_words)
    run_kernel(dll, case, tokens_per_cta)
    assert torch.equal(case.dst_k.view(torch.uint8), k_ref), case.desc + f" tpc={tokens_per_cta}"
    assert torch.equal(case.dst_scale.view(torch.uint8), s_ref), case.desc + f" tpc={tokens_per_cta}"


@pytest.fixture(scope="module", params=list(BUILDS), ids=list(BUILDS))
def build(request, tmp_path_factory):
    return request.param, emulator(tmp_path_factory, BUILDS[request.param], kernel="gather")


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 37, 40, 600, 1100])
def test_matches_reference(build, batch):
    name, dll = build
    rng = random.Random(f"{name}-{batch}")
    for bs, hd, qbs in ((64, 128, 128), (16, 64, 32), (1, 256, 64)):
        max_len = 3 if batch >= 600 else rng.choice([1, 5, 64, 200])
        case = make_gather_case(rng, block_size=bs, head_dim=hd, quant_block_size=qbs, batch=batch, max_len=max_len)
        # Rows per block as the op picks them, or another choice; at most ~40 blocks (each is
        # 256 host threads).
        tpc = rng.choice([None, 1, 8, 37, 128, 256])
        if tpc is not None:
            tpc = min(256, max(tpc, -(-case.dst_k.size(0) // 40)))
        check(dll, case, tpc)


@pytest.mark.parametrize("batch", [1, 2, 3, 4, 8, 9, 16, 17, 31, 32, 33])
def test_tiny_kernel_block_table_window(build, batch):
    """The tiny kernel's block_table window (at most 32 requests; 32 / batch columns each,
    rounded down to a power of two): small block sizes put rows on both sides of it, so
    entries come from the window's lanes and from the row's own load; strided tables too."""
    _, dll = build
    rng = random.Random(f"window-{batch}")
    for bs in (1, 4, 16):
        case = make_gather_case(rng, block_size=bs, head_dim=64, quant_block_size=32, batch=batch,
                                max_len=max(2, 300 // batch), strided=bool(batch % 2))
        check(dll, case, 8)


def test_one_long_request_over_many_blocks(build):
    _, dll = build
    rng = random.Random(3)
    for tpc in (None, 128, 256):
        check(dll, make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=1, lens=[1500],
                                    extra_rows=40), tpc)


def test_rows_whose_vectors_do_not_divide_the_block(build):
    """head_dim 96, 100 and 200 (6, 25 and 50 vectors a row at the widths the pointers allow): the
    vectors a row do not divide a block's threads, so a thread's vectors, NG_THREADS apart, fall
    in different columns of different rows (the tile copy's mapping of a vector to its row and
    column), over blocks of several vectors a thread."""
    _, dll = build
    rng = random.Random(11)
    for hd, qbs in ((96, 32), (100, 25), (200, 50)):
        for tpc in (37, 128, 256):
            check(dll, make_gather_case(rng, block_size=16, head_dim=hd, quant_block_size=qbs, batch=3,
                                        lens=[300, 0, 457]), tpc)


# Rows per block for the bad-index tests: the tiny kernel (8) and the 16 KiB one.
SHAPES = pytest.mark.parametrize("tpc", [8, 37], ids=["tiny", "blocks"])


@SHAPES
@pytest.mark.parametrize("what", MALFORMED)
def test_malformed_indices_are_skipped_and_reported(build, what, tpc):
    _, dll = build
    c = small_gather_case()
    break_indices(c, what)
    run_kernel(dll, c, tpc)  # no fault: the emulator reads host memory, a stray index would crash it
    err = torch.zeros(4, dtype=torch.int64)
    run_kernel(dll, c, tpc, err=err)
    assert int(err[0]) != 0
    if what not in ("cu_decreasing", "cu_start"):  # these also make rows unowned, whichever is met first
        assert int(err[0]) == MALFORMED[what], err


@SHAPES
def test_rows_with_good_indices_survive_a_bad_block_id(build, tpc):
    _, dll = build
    c, k_ref, bad = bad_block_id_case()
    run_kernel(dll, c, tpc)
    assert_only_rows_skipped(c.dst_k.view(torch.uint8), k_ref, bad)


@SHAPES
@pytest.mark.parametrize("what", SINGLE_REQUEST_FAULTS)
def test_single_request_speculation_never_uses_a_bad_guess(build, what, tpc):
    """One request: the 16 KiB-block kernel fetches block ids before cu_seq_lens[0] is
    known to be 0; the tiny kernel must handle the same inputs."""
    _, dll = build
    c, k_ref = single_request_case(what)
    run_kernel(dll, c, tpc)
    assert_single_request_result(c.dst_k.view(torch.uint8), k_ref, what)


@pytest.mark.parametrize("offset,vec", [(0, 16), (8, 8), (4, 4)])
@pytest.mark.parametrize("tpc,shape", [(128, ""), (256, "_wide"), (8, "_tiny")])
def test_every_entry_point(build, offset, vec, tpc, shape):
    """Each of the nine kernels (3 vector widths x 3 shapes): dst_k placed at a byte
    offset picks the width; 256 rows at head_dim 128 make a wide block, 8 a tiny one."""
    _, dll = build
    c = make_gather_case(random.Random(offset + tpc), block_size=16, head_dim=128, quant_block_size=64, batch=7,
                         max_len=120, strided=False, extra_rows=5)
    k_ref, s_ref = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 2)
    store = torch.full((c.dst_k.numel() + 64,), SENTINEL, dtype=torch.uint8)
    c.dst_k = store[offset: offset + c.dst_k.numel()].view(c.dst_k.shape).view(c.dst_k.dtype)
    plan = gather.plan_gather(*c.args())._replace(tokens_per_cta=tpc)
    assert gather.launch_config(plan).entry == f"gather_indexer_k_v{vec}{shape}"
    run_kernel(dll, c, tpc)
    assert torch.equal(c.dst_k.view(torch.uint8), k_ref) and torch.equal(c.dst_scale.view(torch.uint8), s_ref)
    assert bool((store[:offset] == SENTINEL).all()) and bool((store[offset + c.dst_k.numel():] == SENTINEL).all())


@pytest.mark.parametrize("block_size", [16, 64])
def test_vllms_mxfp4_indexer_cache(build, block_size):
    """vLLM 0.33's MXFP4 layout (68-byte tokens: 64 packed bytes, then 4 ue8m0 bytes per block
    row; tests/helpers/mxfp4_cache.py), byte-exact against each token's own record, poisoned
    outputs, upper-bound rows untouched, several rows-per-block choices."""
    name, dll = build
    rng = random.Random(f"{name}-mxfp4-{block_size}")
    for tpc in (None, 1, 8, 37):
        case = make_mxfp4_case(rng, block_size=block_size, lens=ragged_lens(rng, block_size),
                               extra_rows=rng.choice([0, 9]))
        if tpc is not None:
            tpc = max(tpc, -(-case.dst_k.size(0) // 40))
        run_kernel(dll, case, tpc)
        assert torch.equal(case.dst_k, case.want_k), f"{case.desc} tpc={tpc}"
        assert torch.equal(case.dst_scale, case.want_scale), f"{case.desc} tpc={tpc}"
