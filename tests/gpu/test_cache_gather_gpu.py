"""cp_gather_cache and gather_and_maybe_dequant_cache: the NVRTC kernel (cuda_src/cache_gather.cu)
bit-exact against the torch path, on a real GPU.

Every case lives in flat stores (helpers/cache_gather_reference.py): the destination starts
poisoned (SENTINEL), so every unwritten or stray byte shows, and whole stores are compared with
the op run on the CPU copy (the torch path, itself checked against the per-row reference on CPU
by tests/ops/test_cache_gather_cpu.py). The entry point that ran is pinned by the plan's
(load, store) widths. The GPU's own conversion instructions (cvt.rn.bf16x2.f32, cvt.rn.f16.f32,
e4m3x2 -> f16x2, its NaNs) are what these check beyond the emulator."""
import random

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.kernels import cache_gather as spec
from nvrtc_gather.ops import cache_gather
from nvrtc_gather.ops.cache_gather_torch import gather_torch
from nvrtc_gather.ops.fast_path import LayoutMemo
from helpers.cache_gather_reference import SENTINEL, make_case, ragged, to_device
from helpers.reference import assert_no_allocation_on_a_side_stream

pytestmark = pytest.mark.gpu
CONVERSIONS = list(spec.CONVERSIONS)


def _diff(got: torch.Tensor, want: torch.Tensor, n: int = 6) -> str:
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    bad = torch.nonzero(g != w).flatten()
    return f"{bad.numel()} bytes differ, first (byte, got, want) {[(int(i), int(g[i]), int(w[i])) for i in bad[:n]]}"


def _op(case):
    return "cp_gather_cache" if case.conversion == "copy" else "gather_and_maybe_dequant_cache"


def _args(case, op):
    return case.cp_args() if op == "cp_gather_cache" else case.dequant_args()


def check(case_cpu, op=None, want_widths=None):
    """The kernel on a GPU copy of ``case_cpu`` against the torch path on the original: every
    byte of the destination's store. Returns the GPU plan."""
    op = op or _op(case_cpu)
    g = to_device(case_cpu, "cuda")
    plan = cache_gather.plan_for(op, *_args(g, op))
    if want_widths is not None:
        assert (plan.vec, plan.svec) == want_widths, case_cpu.desc
    getattr(ng, op)(*_args(case_cpu, op))
    getattr(ng, op)(*_args(g, op))
    torch.cuda.synchronize()
    got = g.dst_store.cpu()
    assert torch.equal(got, case_cpu.dst_store), f"{op} {case_cpu.desc}: " + _diff(got, case_cpu.dst_store)
    return plan


@pytest.fixture(params=["tiny", "tile"])
def small_kernel(request, monkeypatch):
    """The kernel the op runs small calls with: its own choice, the tiny kernel (one warp per
    row, where the widest accesses are taken), or ("tile") the tile kernel, by patching the
    small-call policy (and a fresh layout memo, so no layout planned before is reused)."""
    if request.param == "tile":
        monkeypatch.setattr(spec, "use_tiny", lambda *a: False)
    monkeypatch.setattr(cache_gather, "_layouts", LayoutMemo())
    return request.param


@pytest.mark.parametrize("conversion", CONVERSIONS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("seq_starts", [False, True])
@pytest.mark.parametrize("layout", ["aligned", "misaligned"])
def test_matches_the_cpu_path_on_grid(conversion, block_size, seq_starts, layout, small_kernel):
    rng = random.Random(f"gpu-{conversion}-{block_size}-{seq_starts}-{layout}")
    kw = {} if layout == "aligned" else {"pad_row": 4 if conversion == "copy" else 2, "pad_entry": 4}
    for lens, extra in ((ragged(rng, 9, 40), 5), ([0, 130, 0, 1, 64], 0), ([300], 3), ([1000], 2),
                        (ragged(rng, 33, 20), 1)):
        case = make_case(rng, lens=lens, block_size=block_size, conversion=conversion, seq_starts=seq_starts,
                         extra_rows=extra, **kw)
        plan = check(case, want_widths=spec.widest(conversion) if layout == "aligned" else spec.ANY)
        tiny = cache_gather.launch_config(plan).entry.endswith("_tiny")
        assert tiny == (small_kernel == "tiny" and layout == "aligned"), case.desc


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("entry", [(576,), (512,), (320,), (656,), (2, 64), (4,)])
def test_copy_of_any_dtype_and_width(dtype, entry):
    if entry == (656,) and dtype.itemsize > 1 or entry == (4,) and dtype.itemsize == 1:
        entry = (576,)
    rng = random.Random(f"copy-{dtype}-{entry}")
    check(make_case(rng, lens=ragged(rng, 11, 50), entry=entry, src_dtype=dtype, seq_starts=True, extra_rows=3))
    if dtype in (torch.bfloat16, torch.float16, torch.float32):  # "auto": the same copy
        check(make_case(rng, lens=ragged(rng, 11, 50), entry=entry, src_dtype=dtype, seq_starts=True),
              op="gather_and_maybe_dequant_cache")


@pytest.mark.parametrize("batch", [1, 2, 8, 33, 64, 256, 1024, 4096])
@pytest.mark.parametrize("conversion", ["copy", "e4m3_bf16"])
def test_request_counts(batch, conversion):
    rng = random.Random(f"batch-{batch}-{conversion}")
    mean = max(1, 20000 // batch)
    check(make_case(rng, lens=ragged(rng, batch, mean, 0.1), block_size=64, conversion=conversion,
                    seq_starts=batch % 2 == 0, extra_rows=7))


def test_first_request_after_row_zero_and_rows_cut_at_t():
    rng = random.Random("start-cut")
    for conversion in ("copy", "e5m2_bf16"):
        check(make_case(rng, lens=[40, 0, 70, 9], start_row=5, cut_rows=30, conversion=conversion, seq_starts=True))
    case = make_case(rng, lens=[40, 0, 70, 9], conversion="e4m3_f16", extra_rows=8)
    case.num_rows -= 20  # num_tokens below dst.size(0): those rows stay poisoned
    check(case)
    tail = case.dst_store[(case.dst.shape[0] - 20) * 1152: case.dst.shape[0] * 1152]
    assert bool((tail == SENTINEL).all())


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("out", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("scale", [0.75, 1.0, 3.0e38, 1e-40, 448.0])
def test_every_fp8_code_and_scale(fp8, out, scale):
    """All 256 codes (NaN, inf, subnormals, extremes) times scales that overflow, underflow into
    subnormals and round: the GPU's conversions give the CPU path's bits."""
    src = torch.arange(256, dtype=torch.uint8).repeat(2).view(2, 1, 256)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[out]
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    bt = torch.tensor([[0], [1]], dtype=torch.int32)
    kv = "fp8" if fp8 == "e4m3" else "fp8_e5m2"
    s = torch.tensor([scale], dtype=torch.float32)
    want = torch.zeros(2, 256, dtype=dtype)
    ng.gather_and_maybe_dequant_cache(src, want, bt, cu, cu, 2, kv, s)
    got = torch.zeros(2, 256, dtype=dtype, device="cuda")
    ng.gather_and_maybe_dequant_cache(src.cuda(), got, bt.cuda(), cu.cuda(), cu.cuda(), 2, kv, s.cuda())
    torch.cuda.synchronize()
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8)), _diff(got.cpu(), want)


# --- bad indices: skipped (nothing else changes), reported in debug mode -----------------------

FAULTS = {
    "block_id": r"block_table: row \d+ \(request 1\) maps to physical block \d+, outside",
    "column": r"block_table: row \d+ \(request \d\) needs block_table column \d+",
    "seq_negative": r"seq_starts: entry 2 = -5 is negative",
    "cu_negative": r"cu_seq_lens: entry 0 = -4 is negative",
    # rows of the overlapping ranges may meet a bad column first: either report is right
    "cu_decreasing": r"cu_seq_lens: must be non-decreasing|block_table: row",
}


def _faulty(what):
    rng = random.Random(f"fault-{what}")
    case = make_case(rng, lens=[30, 20, 12, 40], conversion="e4m3_bf16", seq_starts=True, extra_rows=3)
    if what == "block_id":  # in the first column request 1 reads (its seq_starts may skip column 0)
        case.block_table[1, int(case.seq_starts[1]) // case.src_cache.size(1)] = 10**6
    elif what == "column":
        case.block_table = case.block_table[:, :1].contiguous()
    elif what == "seq_negative":
        case.seq_starts[2] = -5
    elif what == "cu_negative":
        case.cu_seq_lens[0] = -4
    else:
        case.cu_seq_lens[2] = int(case.cu_seq_lens[1]) - 3
    return case


@pytest.mark.parametrize("what", list(FAULTS))
def test_bad_indices_are_skipped_and_reported_in_debug_mode(what, monkeypatch, small_kernel):
    case = _faulty(what)
    with pytest.raises(ValueError):  # the CPU path refuses them outright
        ng.gather_and_maybe_dequant_cache(*case.dequant_args())
    monkeypatch.delenv("NVRTC_GATHER_DEBUG", raising=False)
    g = to_device(case, "cuda")
    before = g.dst_store.clone()
    ng.gather_and_maybe_dequant_cache(*g.dequant_args())  # no error: bad rows skipped
    torch.cuda.synchronize()
    assert not torch.equal(g.dst_store, before)  # the good rows were written
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    g2 = to_device(case, "cuda")
    with pytest.raises(ValueError, match=FAULTS[what]):
        ng.gather_and_maybe_dequant_cache(*g2.dequant_args())
    assert torch.equal(g2.dst_store, g.dst_store)  # the same rows skipped


def test_debug_mode_is_silent_on_good_input(monkeypatch, small_kernel):
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    rng = random.Random("debug-good")
    for conversion in ("copy", "e4m3_bf16"):
        check(make_case(rng, lens=ragged(rng, 40, 30), conversion=conversion, seq_starts=True, start_row=2,
                        cut_rows=5))


# --- large ---------------------------------------------------------------------------------------

def _device_case(lens, conversion, seed, **kw):
    """A large case built on the GPU's copy and checked with the torch path run there."""
    case = to_device(make_case(random.Random(seed), lens=lens, conversion=conversion, block_size=64, **kw), "cuda")
    want = case.dst_store.clone()
    want_case = type(case)(**{**case.__dict__, "dst_store": want,
                              "dst": want.view(case.dst.dtype).as_strided(case.dst.shape, case.dst.stride(),
                                                                           case.dst.storage_offset())})
    op = _op(case)
    plan = cache_gather.plan_for(op, *_args(case, op))
    gather_torch(plan, want_case.src_cache, want_case.dst, case.block_table, case.cu_seq_lens, case.seq_starts,
                 case.scale if conversion != "copy" else None)
    getattr(ng, op)(*_args(case, op))
    torch.cuda.synchronize()
    assert torch.equal(case.dst_store, want), _diff(case.dst_store, want)
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("conversion", ["copy", "e4m3_bf16"])
def test_one_request_of_131072_tokens(conversion):
    _device_case([131072], conversion, 1)


@pytest.mark.slow
@pytest.mark.parametrize("conversion", ["copy", "e5m2_f32"])
def test_4096_requests(conversion):
    _device_case(ragged(random.Random(2), 4096, 64, 0.05), conversion, 2, seq_starts=True)


@pytest.mark.slow
def test_cache_above_4_gib():
    """Block ids whose byte offsets pass 2^32: the used blocks all past the 4 GiB mark."""
    free, _ = torch.cuda.mem_get_info()
    if free < (6 << 30):
        pytest.skip("needs 6 GiB of free GPU memory")
    rng = random.Random(4)
    lens = ragged(rng, 16, 3000)
    bs, width = 64, 576
    blocks = sum(-(-n // bs) for n in lens) + 2
    num_blocks = (4 << 30) // (bs * width) + blocks
    cache = torch.empty(num_blocks, bs, width, dtype=torch.uint8, device="cuda")
    high = torch.arange(num_blocks - blocks, num_blocks, dtype=torch.int32)
    cache[-blocks:] = torch.randint(0, 256, (blocks, bs, width), dtype=torch.uint8, device="cuda")
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    bt = torch.full((len(lens), max(-(-n // bs) for n in lens)), -1, dtype=torch.int32)
    for r, n in enumerate(lens):
        m = -(-n // bs)
        bt[r, :m] = high[torch.randperm(blocks - 1)[:m]]
    total = int(cu[-1])
    scale = torch.full((1,), 0.5, device="cuda")
    for conversion in ("copy", "e4m3_bf16"):
        dtype = torch.uint8 if conversion == "copy" else torch.bfloat16
        got = torch.zeros(total, width, dtype=dtype, device="cuda")
        want = torch.zeros(total, width, dtype=dtype, device="cuda")
        if conversion == "copy":
            op, args = "cp_gather_cache", (cache, got, bt.cuda(), cu.cuda(), len(lens))
        else:
            op, args = "gather_and_maybe_dequant_cache", (cache, got, bt.cuda(), cu.cuda(), cu.cuda(), total, "fp8",
                                                          scale)
        getattr(ng, op)(*args)
        plan = cache_gather.plan_for(op, *args)
        assert plan.block_stride * (num_blocks - 1) > 1 << 32
        gather_torch(plan, cache, want, bt.cuda(), cu.cuda(), None, scale)
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), conversion
    del cache
    torch.cuda.empty_cache()


# --- graphs, compile, torch.ops, the fast path -------------------------------------------------

def test_cuda_graph_capture_and_replay_follow_new_contents():
    rng = random.Random(12)
    cases = {conv: make_case(rng, lens=[30, 0, 17, 50], conversion=conv, seq_starts=True, extra_rows=2)
             for conv in ("copy", "e4m3_f16")}
    dev = {conv: to_device(c, "cuda") for conv, c in cases.items()}
    for conv, g in dev.items():  # loads the kernels before capture
        getattr(ng, _op(g))(*_args(g, _op(g)))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for conv, g in dev.items():
            getattr(ng, _op(g))(*_args(g, _op(g)))
    for trial in range(2):
        for conv, c in cases.items():
            g = dev[conv]
            gen = torch.Generator().manual_seed(trial)
            c.src_store.copy_(torch.randint(0, 256, c.src_store.shape, dtype=torch.uint8, generator=gen))
            c.seq_starts.copy_(torch.randint(0, 16, c.seq_starts.shape, dtype=torch.int32, generator=gen))
            c.dst_store.fill_(SENTINEL)
            g.src_store.copy_(c.src_store)
            g.seq_starts.copy_(c.seq_starts)
            g.dst_store.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        for conv, c in cases.items():
            getattr(ng, _op(c))(*_args(c, _op(c)))
            assert torch.equal(dev[conv].dst_store.cpu(), c.dst_store), f"trial {trial} {conv}"


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_torch_compile_fullgraph(backend):
    torch._dynamo.reset()
    rng = random.Random(f"compile-{backend}")
    for conv in ("copy", "e5m2_bf16"):
        c = make_case(rng, lens=[30, 0, 17], conversion=conv, seq_starts=True, extra_rows=2)
        g = to_device(c, "cuda")
        op = _op(c)

        def f(*args):
            getattr(ng, op)(*args)

        torch.compile(f, backend=backend, fullgraph=True)(*_args(g, op))
        getattr(ng, op)(*_args(c, op))
        torch.cuda.synchronize()
        assert torch.equal(g.dst_store.cpu(), c.dst_store), f"{backend} {conv}"


def test_torch_ops_and_opcheck():
    rng = random.Random(13)
    for conv in ("copy", "e4m3_bf16"):
        c = make_case(rng, lens=ragged(rng, 12, 30), conversion=conv, seq_starts=True)
        a, b = to_device(c, "cuda"), to_device(c, "cuda")
        op = _op(c)
        getattr(ng, op)(*_args(a, op))
        getattr(torch.ops.nvrtc_gather, op)(*_args(b, op))
        torch.cuda.synchronize()
        assert torch.equal(a.dst_store.cpu(), b.dst_store.cpu()), conv
        d = to_device(make_case(rng, lens=[5, 9], conversion=conv, seq_starts=True), "cuda")
        torch.library.opcheck(getattr(torch.ops.nvrtc_gather, op).default, _args(d, op))


def test_fast_path_follows_new_pointers_and_alignment():
    """The same layout again with other tensors (the layout memo's path): right bytes; a
    destination moved off 16-byte alignment takes the ANY entry point with the same bytes."""
    rng = random.Random(14)
    for conv in ("copy", "e4m3_bf16"):
        for trial in range(3):
            check(make_case(random.Random(f"fast-{conv}"), lens=[9, 40, 3], conversion=conv, seq_starts=True))
        base = make_case(rng, lens=[9, 40, 3], conversion=conv, seq_starts=True, extra_rows=1)
        g = to_device(base, "cuda")
        shifted = g.dst_store[4:4 + g.dst.shape[0] * g.dst.stride(0) * g.dst.element_size()]
        g.dst = shifted.view(g.dst.dtype).view(g.dst.shape)
        want = to_device(base, "cuda")
        want.dst = want.dst_store[4:4 + g.dst.numel() * g.dst.element_size()].view(g.dst.dtype).view(g.dst.shape)
        op = _op(base)
        plan = cache_gather.plan_for(op, *_args(g, op))
        assert (plan.vec, plan.svec) == spec.ANY
        getattr(ng, op)(*_args(g, op))
        gather_torch(plan, want.src_cache, want.dst, want.block_table, want.cu_seq_lens, want.seq_starts,
                     want.scale if conv != "copy" else None)
        torch.cuda.synchronize()
        assert torch.equal(g.dst_store, want.dst_store), conv


def test_no_allocation_and_current_stream():
    rng = random.Random(15)
    for conv in ("copy", "e4m3_bf16"):
        c = to_device(make_case(rng, lens=ragged(rng, 10, 50), conversion=conv, block_size=64, seq_starts=True),
                      "cuda")
        op = _op(c)
        assert_no_allocation_on_a_side_stream(lambda: getattr(ng, op)(*_args(c, op)))


def test_rows_per_cta_policy():
    from nvrtc_gather.jit import driver
    sms = driver.sm_count(0)
    assert spec.rows_per_cta(576, 10**6, sms) == 16384 // 576
    assert spec.rows_per_cta(576, 100, sms) == spec.MIN_ROWS_PER_CTA
    assert spec.rows_per_cta(1 << 20, 100, sms) == 1
