"""The quant kernels themselves (cuda_src/quant_cache.cu) run on the host by a thread-per-lane
emulator (tests/helpers/cuda_host_emu.cpp), with the kernel name, grid and packed PARAMS bytes the op
would hand the GPU (indexer_k_quant.launch_config): bit-exact against the torch path. This
catches indexing, reduction and struct-layout bugs without a GPU; it says nothing about
GPU arithmetic (that is test_quant_gpu.py's job). Skipped without a C++20 compiler."""
import ctypes
import random

import pytest
import torch

from nvrtc_gather.ops import indexer_k_quant, paged_layout
from nvrtc_gather.ops.indexer_k_quant_torch import quant_torch
from nvrtc_gather.kernels import indexer_k_quant as quant_kernels
from helpers.host_emu import emu_launch, emulator
from helpers.reference import make_quant_case, special_k

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return emulator(tmp_path_factory)


def launch(dll, name, grid, fields, err_ptr=0):
    emu_launch(dll, quant_kernels.PARAMS, name, grid, fields, err_ptr)


def run_kernel(dll, case, err=None, shape=""):
    """What the op does on a GPU, with the kernel (of ``shape``) run by the emulator."""
    plan = indexer_k_quant.plan_quant(*case.args())
    if plan.num_tokens:
        launch(dll, *indexer_k_quant.launch_config(plan, shape), 0 if err is None else err.data_ptr())
    return plan


def check(dll, case, vec=None):
    """The case in every shape of the vector kernels (the generic kernel has one)."""
    want = make_copy(case)
    quant_torch(indexer_k_quant.plan_quant(*want.args()), want.k, want.kv_cache, want.slot_mapping)
    for shape in quant_kernels.SHAPES:
        got = make_copy(case)
        plan = run_kernel(dll, got, shape=shape)
        if vec is not None:
            assert plan.vec == vec, case.desc
        assert torch.equal(got.kv_store, want.kv_store), \
            f"{case.desc} (shape {shape!r}): {int((got.kv_store != want.kv_store).sum())} bytes differ"


def make_copy(case):
    return type(case)(case.k_store.clone(), case.k_view, case.kv_store.clone(), case.kv_view,
                      case.slot_mapping.clone(), case.quant_block_size, case.scale_fmt, case.desc)


# (dtype, head_dim, qbs, k row pad, k offset) chosen to reach every kernel and every path in it:
CASES = [
    ("bf16", 128, 128, 0, 0, 16),   # 16 lanes per token, shuffles only
    ("bf16", 128, 32, 0, 0, 16),    # 4 lanes per quant block
    ("bf16", 512, 512, 0, 0, 16),   # 64 lanes per quant block: shuffles + shared memory
    ("bf16", 192, 96, 0, 0, 16),    # 24 lanes per token (idle threads), 12 per quant block (groups of 4)
    ("f16", 256, 64, 0, 0, 16),
    ("f16", 128, 128, 4, 0, 8),     # 264-byte rows
    ("bf16", 48, 12, 0, 0, 8),      # 8 elements do not divide 12
    ("f32", 128, 128, 0, 0, 16),    # 32 lanes per token
    ("f32", 512, 256, 0, 0, 16),    # 64 lanes per quant block
    ("f32", 128, 64, 2, 0, 8),      # 2 elements per lane, 2-byte stores
    ("f32", 12, 6, 0, 0, 8),
    ("bf16", 128, 64, 2, 0, 0),     # 260-byte rows: generic kernel
    ("f16", 128, 128, 0, 1, 0),
    ("f32", 64, 32, 1, 0, 0),
    ("bf16", 12, 3, 0, 0, 0),
    ("f32", 4, 1, 0, 0, 0),
    ("bf16", 4096, 128, 0, 0, 0),   # too many lanes per token for a block
]


@pytest.mark.parametrize("dt,hd,qbs,row_pad,offset,vec", CASES, ids=[f"{c[0]}-hd{c[1]}-q{c[2]}-v{c[5]}" for c in CASES])
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_emulated_kernel_matches_torch_path(emu, dt, hd, qbs, row_pad, offset, vec, fmt):
    rng = random.Random(f"{dt}{hd}{qbs}{row_pad}{offset}{fmt}")
    for bs, tokens in ((1, 37), (16, 70), (3, 5)):
        check(emu, make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=bs, dtype=DTYPES[dt],
                                   scale_fmt=fmt, num_tokens=tokens, extra_rows=3, k_row_pad=row_pad,
                                   k_offset=offset, block_pad=rng.choice([0, 4, 16])), vec)


@pytest.mark.parametrize("dt,hd,qbs,row_pad,offset,vec", CASES, ids=[f"{c[0]}-hd{c[1]}-q{c[2]}-v{c[5]}" for c in CASES])
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_emulated_nans_are_left_out_of_amax(emu, dt, hd, qbs, row_pad, offset, vec, fmt):
    """NaNs in k are left out of their quant block's amax, as vLLM's fmaxf leaves them out (issue
    #26 item 5), in every kernel and both reductions (shuffles only, and shuffles + shared
    memory, where the block votes with __syncthreads_or): a NaN makes its warp or block reduce
    again, and the blocks beside it, with and without NaNs, equal the torch path's bytes."""
    rng = random.Random(f"nan{dt}{hd}{qbs}{row_pad}{offset}{fmt}")
    case = make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=16, dtype=DTYPES[dt],
                           scale_fmt=fmt, num_tokens=40, pad_frac=0.1, k_row_pad=row_pad, k_offset=offset)
    k = case.k
    for row in range(0, 40, 3):  # one NaN of either sign in every third row
        k[row, rng.randrange(hd)] = rng.choice([1.0, -1.0]) * float("nan")
    k[1, :qbs] = float("nan")  # a quant block of NaNs only: amax 0
    k[4, 0], k[4, qbs - 1] = float("nan"), float("inf")  # a NaN beside an inf: amax inf
    want = make_copy(case)
    quant_torch(indexer_k_quant.plan_quant(*want.args()), want.k, want.kv_cache, want.slot_mapping)
    plan = indexer_k_quant.plan_quant(*want.args())
    _, s_dst = paged_layout.views(want.kv_cache, plan.num_blocks, 16, plan.block_stride, hd, hd // qbs)
    written = want.slot_mapping[want.slot_mapping >= 0]
    scales = s_dst[written // 16, written % 16].contiguous().view(torch.float32)
    assert not bool(torch.isnan(scales).any())  # no NaN scale in a written row
    check(emu, case, vec)


@pytest.mark.parametrize("dt,hd,qbs,vec", [("bf16", 128, 64, 16), ("f32", 128, 128, 8), ("f16", 64, 2, 0)])
def test_emulated_slots_past_the_cache_are_skipped_and_reported(emu, dt, hd, qbs, vec):
    rng = random.Random(hd)
    row_pad = 2 if vec == 8 else 0
    case = make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=16, dtype=DTYPES[dt],
                           scale_fmt="ue8m0", num_tokens=40, num_blocks=3, block_pad=16, pad_frac=0.0,
                           k_row_pad=row_pad)
    slots = torch.randperm(48)[:40]
    slots[[5, 30]] = torch.tensor([48, 1 << 40])
    case.slot_mapping = slots
    want = make_copy(case)
    want.slot_mapping[[5, 30]] = -1
    quant_torch(indexer_k_quant.plan_quant(*want.args()), want.k, want.kv_cache, want.slot_mapping)
    err = torch.zeros(4, dtype=torch.int64)
    assert run_kernel(emu, case, err).vec == vec
    assert torch.equal(case.kv_store, want.kv_store)
    code, a, b, c = err.tolist()
    assert code == 7 and (a, b) in ((5, 48), (30, 1 << 40)) and c == 48


def test_emulated_slots_above_2_31(emu):
    """The 64-bit slot split: a zero block stride makes every block alias block 0, so a slot
    of 2^35 + 5 lands in row 5 of the one real block."""
    rng = random.Random(1)
    case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=16, dtype=torch.bfloat16,
                           scale_fmt="ue8m0", num_tokens=1, num_blocks=1, pad_frac=0.0)
    case.slot_mapping = torch.tensor([5])
    want = make_copy(case)
    quant_torch(indexer_k_quant.plan_quant(*want.args()), want.k, want.kv_cache, want.slot_mapping)
    plan = indexer_k_quant.plan_quant(*case.args())
    name, grid, fields = indexer_k_quant.launch_config(plan)
    case.slot_mapping[0] = (1 << 35) + 5
    launch(emu, name, grid, dict(fields, block_stride=0, num_slots=1 << 40))
    assert torch.equal(case.kv_store, want.kv_store)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_emulated_rounding_ties_zeros_and_subnormals(tmp_path_factory, dt, fmt):
    """The values of gpu/test_quant_gpu.py's tie test, through the op's build."""
    dll = emulator(tmp_path_factory)
    k = special_k(DTYPES[dt])
    slots = torch.randperm(4 * 16, generator=torch.Generator().manual_seed(1))[:k.shape[0]]
    kv = torch.randint(0, 256, (4, 16, 128 + 4 * 4), dtype=torch.uint8)
    want = kv.clone()
    quant_torch(indexer_k_quant.plan_quant(k, want, slots, 32, fmt), k, want, slots)
    plan = indexer_k_quant.plan_quant(k, kv, slots, 32, fmt)
    launch(dll, *indexer_k_quant.launch_config(plan))
    assert torch.equal(kv, want)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
@pytest.mark.parametrize("offset", [0, 1], ids=["vector", "generic"])  # k one element off: the generic kernel
def test_emulated_inf_nan_bytes_are_the_torch_paths(tmp_path_factory, dt, fmt, offset):
    """+-inf, NaN of either sign and the largest finite values in k (issue #26 item 5): value bytes
    equal the torch path's (NaN codes 0x7f, never 0xff: vLLM's __nv_cvt_float_to_fp8); scales
    equal too, none a NaN (NaNs are left out of amax)."""
    dll = emulator(tmp_path_factory)
    dtype = DTYPES[dt]
    big = torch.finfo(dtype).max
    store = torch.randn(8 * 128 + offset, generator=torch.Generator().manual_seed(21)).to(dtype)
    k = store[offset:].view(8, 128)
    k[0, 3], k[0, 4] = float("inf"), float("-inf")
    k[1, 70] = float("-inf")
    k[2, 10] = float("nan")
    k[3, 100] = -float("nan")
    k[4, :64] = big
    k[4, 64:] = -big
    k[5, 0], k[5, 1] = big, float("inf")
    slots = torch.randperm(4 * 16, generator=torch.Generator().manual_seed(2))[:8]
    kv = torch.randint(0, 256, (4, 16, 128 + 4 * 2), dtype=torch.uint8)
    want = kv.clone()
    quant_torch(indexer_k_quant.plan_quant(k, want, slots, 64, fmt), k, want, slots)
    plan = indexer_k_quant.plan_quant(k, kv, slots, 64, fmt)
    assert (plan.vec == 0) == bool(offset)
    launch(dll, *indexer_k_quant.launch_config(plan))
    got_v, want_v = kv[:, :, :].reshape(4, -1)[:, :16 * 128], want.reshape(4, -1)[:, :16 * 128]
    assert torch.equal(got_v, want_v), int((got_v != want_v).sum())
    rows = (slots // 16, slots % 16)  # the written slots' two scales each
    got_s = kv.reshape(4, -1)[:, 16 * 128:].contiguous().view(torch.float32).view(4, 16, 2)[rows]
    want_s = want.reshape(4, -1)[:, 16 * 128:].contiguous().view(torch.float32).view(4, 16, 2)[rows]
    assert not bool(torch.isnan(want_s).any())  # NaNs are left out of amax: no NaN scale
    assert torch.equal(got_s, want_s)
    assert not bool((want_v.view(4, 16, 128)[slots // 16, slots % 16] == 0xFF).any())
