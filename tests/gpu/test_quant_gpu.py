"""indexer_k_quant_and_cache's NVRTC kernels, bit-exact against the torch path, on a real GPU.

The cache and the guard bytes around and between its blocks start as random bytes (every
unwritten or stray byte shows); k is random and never zero. Small cases compare every byte
with the torch path run on the CPU (itself checked against the per-token reference in
test_quant_cpu.py); large ones with the torch path run on the GPU.

The op's own module converts to fp8 with the e4m3x2 instruction on sm_89+ (an H200 runs that
through every test here); the integer encoder it uses on sm_80/86 is run on this GPU too,
through the test build helpers.builds.QUANT_SOFT_FP8."""
import random

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.kernels import indexer_k_quant as quant_kernels
from nvrtc_gather.ops import indexer_k_quant
from nvrtc_gather.ops.indexer_k_quant_torch import block_scales, quant_torch
from helpers.builds import QUANT_SOFT_FP8
from helpers.reference import assert_no_allocation_on_a_side_stream, make_quant_case, special_k

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _first_diffs(got, want, n=8):
    bad = torch.nonzero(got != want).flatten()[:n].tolist()
    return f"{int((got != want).sum())} bytes differ, first at {[(i, int(got[i]), int(want[i])) for i in bad]}"


def check_gpu(case_cpu, expect_vec=None):
    """The kernel on GPU copies of the case against the torch path on the CPU original: every
    byte of the cache store, guards and gaps included. Three runs: the op (its own shape
    choice), then the call forced to each shape of the vector kernels (spec.SHAPES)."""
    runs = {"op": case_cpu.to("cuda"), **{f"shape {s!r}": case_cpu.to("cuda") for s in quant_kernels.SHAPES}}
    if expect_vec is not None:
        assert indexer_k_quant.plan_quant(*runs["op"].args()).vec == expect_vec, case_cpu.desc
    ng.indexer_k_quant_and_cache(*case_cpu.args())
    for name, g in runs.items():
        if name == "op":
            ng.indexer_k_quant_and_cache(*g.args())
        else:
            indexer_k_quant.prepared(*g.args(), shape=name[7:-1])()
        torch.cuda.synchronize()
        got = g.kv_store.cpu()
        assert torch.equal(got, case_cpu.kv_store), f"{case_cpu.desc} ({name}): " + _first_diffs(got, case_cpu.kv_store)


def _grid():
    out, i = [], 0
    for hd in (64, 128, 256, 512):
        for qbs in [q for q in (32, 64, 128, 256, 512) if q <= hd]:
            for bs in (1, 16, 64):
                for dt in DTYPES:
                    for fmt in ("ue8m0", "fp8_e4m3"):
                        t = (37, 300)[i % 2]
                        i += 1
                        out.append(pytest.param(hd, qbs, bs, dt, fmt, t, id=f"hd{hd}-q{qbs}-bs{bs}-{dt}-{fmt}-t{t}"))
    return out


@pytest.mark.parametrize("hd,qbs,bs,dt,fmt,tokens", _grid())
def test_kernel_matches_cpu_on_grid(hd, qbs, bs, dt, fmt, tokens):
    rng = random.Random(f"gpu-{hd}-{qbs}-{bs}-{dt}-{fmt}")
    check_gpu(make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=bs, dtype=DTYPES[dt],
                              scale_fmt=fmt, num_tokens=tokens, extra_rows=rng.choice([0, 7]),
                              k_row_pad=rng.choice([0, 0, 4, 8, 1]), block_pad=rng.choice([0, 0, 4, 16])))


# (k row pad, k offset) in elements -> the vector width the plan must pick, per element size.
_LAYOUTS = {2: [((0, 0), 16), ((4, 0), 8), ((0, 4), 8), ((2, 0), 0), ((0, 1), 0)],
            4: [((0, 0), 16), ((2, 0), 8), ((0, 2), 8), ((1, 0), 0), ((0, 1), 0)]}


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("layout", range(5))
def test_every_kernel_variant(dt, layout):
    (row_pad, offset), vec = _LAYOUTS[DTYPES[dt].itemsize][layout]
    rng = random.Random(layout)
    for fmt in ("ue8m0", "fp8_e4m3"):
        check_gpu(make_quant_case(rng, head_dim=128, quant_block_size=64, block_size=16, dtype=DTYPES[dt],
                                  scale_fmt=fmt, num_tokens=77, extra_rows=3, k_row_pad=row_pad,
                                  k_offset=offset), expect_vec=vec)


@pytest.mark.parametrize("hd,qbs", [
    (4, 1), (4, 2), (12, 3), (12, 4), (48, 12), (48, 16),  # quant blocks narrower than a lane's elements
    (192, 96), (192, 64), (96, 96),                        # lanes per token not a power of two
    (512, 512), (1024, 1024), (1024, 32),                  # quant blocks spanning several warps
    (2048, 128), (4096, 128), (4096, 4096),                # more lanes than threads: generic kernel
])
@pytest.mark.parametrize("dt", DTYPES)
def test_unusual_shapes(hd, qbs, dt):
    rng = random.Random(hd * 7 + qbs)
    for fmt in ("ue8m0", "fp8_e4m3"):
        check_gpu(make_quant_case(rng, head_dim=hd, quant_block_size=qbs, block_size=rng.choice([1, 3, 16]),
                                  dtype=DTYPES[dt], scale_fmt=fmt, num_tokens=rng.choice([1, 5, 70]),
                                  extra_rows=2, k_row_pad=rng.choice([0, 0, 2])))


def test_fp8_cache_dtype_and_single_token():
    rng = random.Random(4)
    case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=BF16,
                           scale_fmt="ue8m0", num_tokens=1, pad_frac=0.0)
    g = case.to("cuda")
    ng.indexer_k_quant_and_cache(g.k, g.kv_cache.view(FP8), g.slot_mapping, 128, "ue8m0")
    ng.indexer_k_quant_and_cache(*case.args())
    assert torch.equal(g.kv_store.cpu(), case.kv_store)


def test_nothing_to_write():
    k = torch.randn(3, 128, device="cuda", dtype=BF16)
    kv = torch.randint(0, 256, (2, 16, 132), dtype=torch.uint8, device="cuda")
    before = kv.clone()
    for slots in ([], [-1, -1]):
        ng.indexer_k_quant_and_cache(k, kv, torch.tensor(slots, dtype=torch.int64, device="cuda"), 128, "ue8m0")
    assert torch.equal(kv, before)


def _bad_slot_case():
    rng = random.Random(5)
    case = make_quant_case(rng, head_dim=128, quant_block_size=64, block_size=16, dtype=BF16, scale_fmt="ue8m0",
                           num_tokens=50, num_blocks=50, block_pad=16, pad_frac=0.1)
    num_slots = 50 * 16
    bad = case.slot_mapping.clone()
    bad[3], bad[17], bad[40] = num_slots, num_slots + 12345, 1 << 40
    good = bad.clone()
    good[[3, 17, 40]] = -1
    case.slot_mapping = good
    return case, bad


def test_slots_past_the_cache_are_skipped_without_touching_other_memory(monkeypatch):
    case, bad = _bad_slot_case()
    g = case.to("cuda")
    g.slot_mapping = bad.cuda()
    ng.indexer_k_quant_and_cache(*g.args())  # no crash, no stray write (also run under memcheck)
    ng.indexer_k_quant_and_cache(*case.args())  # the CPU path with those rows as padding
    torch.cuda.synchronize()
    got = g.kv_store.cpu()
    assert torch.equal(got, case.kv_store), _first_diffs(got, case.kv_store)
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match=r"debug mode.*slot_mapping: entry (3|17|40) = \d+ is past the cache's "
                                         r"last slot \(800 slots\)"):
        ng.indexer_k_quant_and_cache(*g.args())


def test_debug_mode_is_silent_on_good_input(monkeypatch):
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    case, _ = _bad_slot_case()
    check_gpu(case)


def _round_trip(dt, qbs, fmt, lens=(400, 0, 37, 600), bs=64, hd=128, seed=0):
    """Write with the op, read back with the gather, dequantize: within fp8 rounding of k."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nq = hd // qbs
    blocks_per = [(n + bs - 1) // bs for n in lens]
    num_blocks = sum(blocks_per) + 5
    ids = torch.randperm(num_blocks, device="cuda", generator=g)[:sum(blocks_per)].to(torch.int32)
    bt = torch.full((len(lens), max(blocks_per)), -1, dtype=torch.int32, device="cuda")
    slots, at = [], 0
    for r, (n, nb) in enumerate(zip(lens, blocks_per)):
        bt[r, :nb] = ids[at:at + nb]
        at += nb
        i = torch.arange(n, device="cuda")
        slots.append(bt[r, i // bs].long() * bs + i % bs)
    slot_mapping = torch.cat(slots)
    total = slot_mapping.numel()
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    mag = torch.pow(10.0, torch.empty(total, nq, 1, device="cuda").uniform_(-6, 4, generator=g))
    k = (torch.randn(total, nq, qbs, device="cuda", generator=g) * mag).view(total, hd).to(dt)
    kv = torch.randint(0, 256, (num_blocks, bs, hd + 4 * nq), dtype=torch.uint8, device="cuda", generator=g)
    ng.indexer_k_quant_and_cache(k, kv, slot_mapping, qbs, fmt)
    dst_k = torch.empty(total, hd, dtype=FP8, device="cuda")
    dst_s = torch.empty(total, nq, dtype=torch.float32, device="cuda")
    ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
    x = k.float().view(total, nq, qbs)
    scale = dst_s.unsqueeze(-1)
    assert torch.equal(dst_s, block_scales(x.abs().amax(-1), fmt == "ue8m0"))
    err = (dst_k.float().view(total, nq, qbs) * scale - x).abs()
    # e4m3: relative error <= 2^-4 for normal values, absolute <= 2^-10 (times the scale) below 2^-6.
    tol = x.abs() * 2.0 ** -4 * (1 + 1e-5) + scale * 2.0 ** -10
    assert bool((err <= tol).all()), float((err - tol).max())


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("qbs", [32, 128])
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_round_trip_through_the_gather(dt, qbs, fmt):
    _round_trip(DTYPES[dt], qbs, fmt)


def test_capturable_in_a_cuda_graph():
    rng = random.Random(8)
    case = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=BF16,
                           scale_fmt="ue8m0", num_tokens=200)
    g = case.to("cuda")
    start = g.kv_store.clone()
    ng.indexer_k_quant_and_cache(*g.args())  # loads the kernels before capture
    g.kv_store.copy_(start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ng.indexer_k_quant_and_cache(*g.args())
    g.kv_store.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    ng.indexer_k_quant_and_cache(*case.args())
    assert torch.equal(g.kv_store.cpu(), case.kv_store)


def test_no_allocation_and_current_stream():
    rng = random.Random(6)
    g = make_quant_case(rng, head_dim=128, quant_block_size=128, block_size=64, dtype=BF16,
                        scale_fmt="ue8m0", num_tokens=100).to("cuda")
    assert_no_allocation_on_a_side_stream(lambda: ng.indexer_k_quant_and_cache(*g.args()))


def _large(tokens, dt=BF16, hd=128, qbs=128, bs=64, fmt="ue8m0", num_blocks=None, high=False, row_pad=0, seed=0):
    """Built on the GPU: random k (a padded tail of rows), shuffled distinct slots with ~3%
    padding, a random cache; the kernel against the torch path run on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    nq = hd // qbs
    num_blocks = num_blocks or (tokens + bs - 1) // bs * 2
    cs = hd + 4 * nq
    kv = torch.randint(0, 256, (num_blocks, bs, cs), dtype=torch.uint8, device="cuda", generator=g)
    lo_slot = (num_blocks * bs - 2 * tokens) if high else 0  # high: every slot above the 4 GiB mark
    slots = torch.randperm(num_blocks * bs - lo_slot, device="cuda", generator=g)[:tokens] + lo_slot
    slots[torch.rand(tokens, device="cuda", generator=g) < 0.03] = -1
    mag = torch.pow(10.0, torch.empty(tokens + 5, nq, 1, device="cuda").uniform_(-6, 4, generator=g))
    store = torch.randn(tokens + 5, hd + row_pad, device="cuda", generator=g)
    store[:, :hd] = (torch.randn(tokens + 5, nq, qbs, device="cuda", generator=g) * mag).view(-1, hd)
    k = store.to(dt)[:, :hd]
    want = kv.clone()
    plan = indexer_k_quant.plan_quant(k, want, slots, qbs, fmt)
    quant_torch(plan, k, want, slots)
    ng.indexer_k_quant_and_cache(k, kv, slots, qbs, fmt)
    torch.cuda.synchronize()
    assert torch.equal(kv, want), _first_diffs(kv.view(-1), want.view(-1))
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_131072_tokens(fmt):
    assert _large(131072, fmt=fmt, seed=1).vec == 16


@pytest.mark.slow
def test_1m_tokens_fp32_small_quant_blocks():
    _large(1 << 20, dt=torch.float32, qbs=32, fmt="fp8_e4m3", seed=2)


@pytest.mark.slow
def test_large_generic_kernel():
    assert _large(100000, dt=torch.float16, qbs=64, row_pad=1, seed=3).vec == 0


@pytest.mark.slow
def test_cache_above_4_gib():
    block_bytes = 64 * 132
    num_blocks = (4 << 30) // block_bytes + 4000  # ~4.3 GB; the top 200000 slots lie above the 4 GiB mark
    _large(100000, num_blocks=num_blocks, high=True, seed=4)
    torch.cuda.empty_cache()


# --- the integer fp8 encoder (sm_80/86's path), on this GPU ---

def check_variant(module, case_cpu):
    """``module``'s kernel on a GPU copy of the case against the torch path on the CPU."""
    g = case_cpu.to("cuda")
    ng.indexer_k_quant_and_cache(*case_cpu.args())
    if g.slot_mapping.numel():
        indexer_k_quant.prepared(*g.args(), module=module)()
    torch.cuda.synchronize()
    got = g.kv_store.cpu()
    assert torch.equal(got, case_cpu.kv_store), f"{module.name}: {case_cpu.desc}: " + _first_diffs(got, case_cpu.kv_store)


@pytest.mark.parametrize("hd,qbs,bs,dt,fmt,tokens", _grid())
def test_soft_fp8_kernel_matches_cpu_on_grid(hd, qbs, bs, dt, fmt, tokens):
    rng = random.Random(f"soft-{hd}-{qbs}-{bs}-{dt}-{fmt}")
    check_variant(QUANT_SOFT_FP8, make_quant_case(
        rng, head_dim=hd, quant_block_size=qbs, block_size=bs, dtype=DTYPES[dt], scale_fmt=fmt, num_tokens=tokens,
        extra_rows=rng.choice([0, 7]), k_row_pad=rng.choice([0, 0, 4, 8, 1]), block_pad=rng.choice([0, 0, 4, 16])))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_soft_fp8_build_131072_tokens(fmt):
    module = QUANT_SOFT_FP8
    g = torch.Generator(device="cuda").manual_seed(7)
    tokens, num_blocks = 131072, 4096
    kv = torch.randint(0, 256, (num_blocks, 64, 132), dtype=torch.uint8, device="cuda", generator=g)
    slots = torch.randperm(num_blocks * 64, device="cuda", generator=g)[:tokens]
    slots[torch.rand(tokens, device="cuda", generator=g) < 0.03] = -1
    mag = torch.pow(10.0, torch.empty(tokens, 1, 1, device="cuda").uniform_(-6, 4, generator=g))
    k = (torch.randn(tokens, 1, 128, device="cuda", generator=g) * mag).view(tokens, 128).to(BF16)
    want = kv.clone()
    quant_torch(indexer_k_quant.plan_quant(k, want, slots, 128, fmt), k, want, slots)
    indexer_k_quant.prepared(k, kv, slots, 128, fmt, module=module)()
    torch.cuda.synchronize()
    assert torch.equal(kv, want), _first_diffs(kv.view(-1), want.view(-1))


# --- values chosen to hit every rounding case exactly -------------------------------------

@pytest.mark.parametrize("module", [None, QUANT_SOFT_FP8], ids=["op", "soft_fp8"])  # None: the op's own build
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_rounding_ties_zeros_and_subnormals(module, dt, fmt):
    k = special_k(DTYPES[dt])
    slots = torch.randperm(4 * 16)[:k.shape[0]]
    start = torch.randint(0, 256, (4, 16, 128 + 4 * 4), dtype=torch.uint8)
    want = start.clone()
    ng.indexer_k_quant_and_cache(k, want, slots, 32, fmt)  # the CPU path: torch's own conversion
    got = start.cuda()
    indexer_k_quant.prepared(k.cuda(), got, slots.cuda(), 32, fmt, module=module)()
    torch.cuda.synchronize()
    got = got.cpu()
    assert torch.equal(got, want), _first_diffs(got.view(-1), want.view(-1))


def _special_values_run(module, fmt, seed, tokens, num_blocks, poke):
    """bf16 k (head_dim 128, quant blocks of 64) with ``poke`` planting special values,
    written by ``module``'s kernel to distinct random slots of 16-token blocks, and by the
    torch path on the GPU: (kv from the kernel, kv from the torch path, slots)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(tokens, 128, device="cuda", generator=g).to(BF16)
    poke(k)
    kv = torch.randint(0, 256, (num_blocks, 16, 128 + 4 * 2), dtype=torch.uint8, device="cuda", generator=g)
    slots = torch.randperm(num_blocks * 16, device="cuda", generator=g)[:tokens]
    want = kv.clone()
    quant_torch(indexer_k_quant.plan_quant(k, want, slots, 64, fmt), k, want, slots)
    indexer_k_quant.prepared(k, kv, slots, 64, fmt, module=module)()
    torch.cuda.synchronize()
    return kv, want, slots


@pytest.mark.parametrize("module", [None, QUANT_SOFT_FP8], ids=["op", "soft_fp8"])  # None: the op's own build
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_inf_blocks_match_the_torch_path_on_the_gpu(module, fmt):
    """A quant block holding +-inf: scale inf, finite values +-0, the infs NaN, code 0x7f (what
    vLLM's kernel writes: __nv_cvt_float_to_fp8 canonicalises NaNs), the same bytes as the torch
    path on the GPU and on the CPU (issue #26 item 5: the CPU path wrote 0xff there)."""
    def poke(k):
        k[5, 3], k[9, 70], k[9, 71], k[20, 127] = float("inf"), float("-inf"), float("inf"), float("-inf")

    kv, want, slots = _special_values_run(module, fmt, seed=3, tokens=64, num_blocks=8, poke=poke)
    assert torch.equal(kv, want), _first_diffs(kv.view(-1), want.view(-1))
    s = int(slots[5])
    at = s // 16 * 16 * 136 + s % 16 * 128 + 3
    assert int(kv.view(-1)[at]) == 0x7F


def test_inf_and_nan_bytes_equal_the_cpu_paths():
    """The op on the GPU and on the CPU write the same bytes for +-inf and NaN of either sign in
    k (NaNs left out of amax on both)."""
    g = torch.Generator().manual_seed(8)
    for dt in (BF16, torch.float16, torch.float32):
        for fmt in ("ue8m0", "fp8_e4m3"):
            k = torch.randn(32, 128, generator=g).to(dt)
            k[1, 3], k[2, 64], k[3, 5], k[4, 90] = float("inf"), float("-inf"), float("nan"), -float("nan")
            k[5, :64] = torch.finfo(dt).max
            kv = torch.randint(0, 256, (4, 16, 136), dtype=torch.uint8, generator=g)
            slots = torch.randperm(64, generator=g)[:32]
            cpu = kv.clone()
            ng.indexer_k_quant_and_cache(k, cpu, slots, 64, fmt)
            gpu = kv.cuda()
            ng.indexer_k_quant_and_cache(k.cuda(), gpu, slots.cuda(), 64, fmt)
            assert torch.equal(gpu.cpu(), cpu), (dt, fmt, _first_diffs(gpu.cpu().view(-1), cpu.view(-1)))


# (dtype, head_dim, quant block, k offset): shuffles only (bf16, f32); shuffles + shared memory,
# where the block votes by __syncthreads_or (groups of 4 lanes in 12; 128 lanes per quant
# block); the generic kernel (k one element off).
NAN_SHAPES = [(BF16, 128, 64, 0), (torch.float32, 512, 256, 0), (BF16, 192, 96, 0), (torch.float32, 1024, 1024, 0),
              (BF16, 128, 64, 1)]


@pytest.mark.parametrize("dt,hd,qbs,offset", NAN_SHAPES, ids=[f"{d}-hd{h}-q{q}-o{o}" for d, h, q, o in NAN_SHAPES])
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_nans_are_left_out_of_amax_in_every_kernel_shape(dt, hd, qbs, offset, fmt):
    """NaNs (either sign) in some rows, a quant block of NaNs, a NaN beside an inf: the GPU's
    bytes are the CPU path's (NaNs left out of amax) in every reduction the kernels have."""
    g = torch.Generator().manual_seed(hd + qbs)
    store = torch.randn(300 * hd + offset, generator=g).to(dt)
    k = store[offset:].view(300, hd)
    rows = torch.arange(0, 300, 7)
    k[rows, torch.randint(0, hd, (rows.numel(),), generator=g)] = float("nan")
    k[3, :qbs] = -float("nan")
    k[5, 1], k[5, 2] = float("nan"), float("-inf")
    nq = hd // qbs
    kv = torch.randint(0, 256, (40, 16, hd + 4 * nq), dtype=torch.uint8, generator=g)
    slots = torch.randperm(40 * 16, generator=g)[:300]
    cpu = kv.clone()
    ng.indexer_k_quant_and_cache(k, cpu, slots, qbs, fmt)
    gpu = kv.cuda()
    ng.indexer_k_quant_and_cache(store.cuda()[offset:].view(300, hd), gpu, slots.cuda(), qbs, fmt)
    assert torch.equal(gpu.cpu(), cpu), _first_diffs(gpu.cpu().view(-1), cpu.view(-1))


@pytest.mark.parametrize("module", [None, QUANT_SOFT_FP8], ids=["op", "soft_fp8"])  # None: the op's own build
@pytest.mark.parametrize("fmt", ["ue8m0", "fp8_e4m3"])
def test_nan_blocks(module, fmt):
    """NaNs in k are left out of their quant block's amax, as vLLM's fmaxf leaves them out: the
    block is scaled by its other values and the NaN written 0x7f (as __nv_cvt_float_to_fp8
    writes any NaN); a block of NaNs only has amax 0; a NaN beside an inf gives amax inf. Every
    byte is the torch path's, and no scale is a NaN."""
    def poke(k):
        k[7, 10] = float("nan")
        k[8, :64] = float("nan")
        k[9, 70], k[9, 71] = -float("nan"), float("inf")

    kv, want, slots = _special_values_run(module, fmt, seed=4, tokens=32, num_blocks=4, poke=poke)
    assert torch.equal(kv, want), _first_diffs(kv.view(-1), want.view(-1))
    flat = kv.view(-1)

    def at(token, col):  # (value byte, scale bytes) of token's element col
        s = int(slots[token])
        base = s // 16 * 16 * 136
        sc = base + 16 * 128 + s % 16 * 8 + 4 * (col // 64)
        return base + s % 16 * 128 + col, flat[sc:sc + 4].view(torch.float32).item()

    v, scale = at(7, 10)
    assert int(flat[v]) == 0x7F
    g = torch.Generator(device="cuda").manual_seed(4)
    k7 = torch.randn(32, 128, device="cuda", generator=g).to(BF16)[7, :64].float()
    k7[10] = 0.0
    assert scale == block_scales(k7.abs().amax().view(1), fmt == "ue8m0").item()
    assert at(8, 0)[1] == block_scales(torch.zeros(1, device="cuda"), fmt == "ue8m0").item()
    assert at(9, 70)[1] == float("inf")
    scales = kv.view(4, -1)[:, 16 * 128:].contiguous().view(torch.float32).view(4, 16, 2)[slots // 16, slots % 16]
    assert not bool(torch.isnan(scales).any())
