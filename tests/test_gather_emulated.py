"""The gather kernel itself (cuda_src/gather_indexer_k.cu) run on the host by the
thread-per-lane emulator (tests/cuda_host_emu.cpp), with the entry point, grid and packed
PARAMS bytes the op hands the GPU: bit-exact against the per-token reference, with
poisoned outputs. This checks the kernel's search, single-request speculation and
bad-index paths, both block shapes (16 KiB, and wide) and all three vector widths
without a GPU, in the default build and any benchmark build with other compile options
(kernels.BENCH_GATHER_VARIANTS), with several rows-per-block choices (the op picks it
at run time). Skipped without a C++20 compiler; test_gather_gpu.py runs the same
kernels on a GPU."""
import ctypes
import random

import pytest
import torch

from nvrtc_gather import gather, kernels
from host_emu import emulator
from reference import SENTINEL, gather_reference, make_gather_case

H200_SMS = 132
# The default build, and every other benchmark build as its -D options.
BUILDS = {"default": ()} | {m.name: m.options for m in kernels.BENCH_GATHER_VARIANTS if m.options}


def run_kernel(dll, case, tokens_per_cta=None, err=None):
    """What the op does on a GPU for ``case`` (CPU tensors), with the kernel run by the emulator."""
    plan = gather.plan_gather(*case.args())
    tpc = tokens_per_cta or gather.tokens_per_cta(plan.head_dim, plan.num_tokens, H200_SMS)
    name, grid, values = gather.launch_config(plan._replace(tokens_per_cta=tpc), 0 if err is None else err.data_ptr())
    fn = ctypes.cast(getattr(dll, name), ctypes.c_void_p)
    assert dll.emu_launch(fn, gather.PARAMS.pack(*values), grid) == gather.PARAMS.size  # struct sizes agree
    assert dll.emu_faults() == 0, "misaligned vector load or store"


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


def test_one_long_request_over_many_blocks(build):
    _, dll = build
    rng = random.Random(3)
    for tpc in (None, 128, 256):
        check(dll, make_gather_case(rng, block_size=64, head_dim=128, quant_block_size=128, batch=1, lens=[1500],
                                    extra_rows=40), tpc)


def _small_case():
    return make_gather_case(random.Random(99), block_size=16, head_dim=128, quant_block_size=128, batch=6,
                            lens=[20, 0, 33, 16, 5, 40], extra_rows=6, strided=False, extra_blocks=2)


# Rows per block for the bad-index tests: the tiny kernel (8) and the 16 KiB one.
SHAPES = pytest.mark.parametrize("tpc", [8, 37], ids=["tiny", "blocks"])


@SHAPES
@pytest.mark.parametrize("what,code", [("block_id_high", 3), ("block_id_negative", 3), ("cu_decreasing", 5),
                                       ("cu_total_past_rows", 6), ("cu_start", 4), ("too_many_blocks", 2)])
def test_malformed_indices_are_skipped_and_reported(build, what, code, tpc):
    _, dll = build
    c = _small_case()
    bt, cu = c.block_table, c.cu_seq_lens
    if what == "block_id_high":
        bt[2, 1] = c.kv_cache.size(0) + 1000000
    elif what == "block_id_negative":
        bt[0, 0] = -5
    elif what == "cu_decreasing":
        cu[3] = 10
    elif what == "cu_total_past_rows":
        cu[-1] = c.dst_k.size(0) + 500
    elif what == "cu_start":
        cu[0] = 3
    else:  # request 0 longer than its block_table row covers
        cu[1:] = torch.clamp(torch.maximum(cu[1:], torch.tensor(16 * bt.size(1) + 1, dtype=torch.int32)),
                             max=c.dst_k.size(0))
    run_kernel(dll, c, tpc)  # no fault: the emulator reads host memory, a stray index would crash it
    err = torch.zeros(4, dtype=torch.int64)
    run_kernel(dll, c, tpc, err=err)
    assert int(err[0]) != 0
    if what not in ("cu_decreasing", "cu_start"):  # these also make rows unowned, whichever is met first
        assert int(err[0]) == code, err


@SHAPES
def test_rows_with_good_indices_survive_a_bad_block_id(build, tpc):
    _, dll = build
    c = _small_case()
    c.block_table[2, 1] = 10 ** 6  # request 2, tokens 16..32 are bad
    run_kernel(dll, c, tpc)
    c.block_table[2, 1] = c.block_table[2, 0]
    k_ref, _ = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 1)
    got = c.dst_k.view(torch.uint8)
    bad = slice(20 + 16, 20 + 32)
    assert bool((got[bad] == SENTINEL).all())
    keep = torch.ones(got.size(0), dtype=torch.bool)
    keep[bad] = False
    assert torch.equal(got[keep], k_ref[keep])


@SHAPES
@pytest.mark.parametrize("what", ["cu_start", "block_id_high", "total_past_rows"])
def test_single_request_speculation_never_uses_a_bad_guess(build, what, tpc):
    """One request: the 16 KiB-block kernel fetches block ids before cu_seq_lens[0] is
    known to be 0; the tiny kernel must handle the same inputs."""
    _, dll = build
    c = make_gather_case(random.Random(5), block_size=16, head_dim=128, quant_block_size=128, batch=1, lens=[70],
                         extra_rows=10, strided=False)
    k_ref, _ = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 1)
    if what == "cu_start":
        c.cu_seq_lens[0] = 16  # rows 0..15 belong to nobody; 16.. are request 0's tokens 0..
    elif what == "block_id_high":
        c.block_table[0, 2] = 1 << 30
    else:
        c.cu_seq_lens[1] = c.dst_k.size(0) + 100
    run_kernel(dll, c, tpc)
    got = c.dst_k.view(torch.uint8)
    if what == "cu_start":
        assert bool((got[:16] == SENTINEL).all())
        assert torch.equal(got[16:70], k_ref[:54])
    elif what == "block_id_high":
        assert bool((got[32:48] == SENTINEL).all()) and torch.equal(got[:32], k_ref[:32])
    else:
        assert torch.equal(got[:70], k_ref[:70])


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
    assert gather.kernel_name(plan) == f"gather_indexer_k_v{vec}{shape}"
    run_kernel(dll, c, tpc)
    assert torch.equal(c.dst_k.view(torch.uint8), k_ref) and torch.equal(c.dst_scale.view(torch.uint8), s_ref)
    assert bool((store[:offset] == SENTINEL).all()) and bool((store[offset + c.dst_k.numel():] == SENTINEL).all())
