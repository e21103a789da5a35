"""The scatter kernels (cuda_src/indexer_k_scatter.cu) on the host emulator
(tests/helpers/cuda_host_emu.cpp), launched as the op would launch them on a GPU
(indexer_k_scatter.launch_config): bit-exact against the independent per-token reference
(tests/helpers/scatter_cases.py) over random bytes (untouched bytes must stay as they were), in
every vector width and with grids smaller than the work (the grid-stride loop); and an index
fuzz: extreme int64 slots inside guard bytes (tests/helpers/index_fuzz.py), with and without
the debug error buffer. Skipped without a C++20 compiler (the fuzz also without fork())."""
import random
import re

import pytest
import torch

from helpers.host_emu import emu_launch, emulator
from helpers.index_fuzz import (I64_MAX, I64_MIN, Arena, Launch, draw_slots, first_difference, launch_problem,
                                one_token_per_row, pack, run_isolated, same_view, span)
from helpers.scatter_cases import FP8, make_scatter_case, scatter_reference
from nvrtc_gather.kernels import indexer_k_scatter as spec
from nvrtc_gather.ops import indexer_k_scatter as op


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="scatter")


def run(dll, case, grid=None, err_ptr=0):
    plan = op.plan_scatter(*case.args())
    if plan.num_tokens:
        entry, g, fields = op.launch_config(plan)
        emu_launch(dll, spec.PARAMS, entry, grid or g, fields, err_ptr)
    return plan


# (k offset, kv offset, head_dim) reaching each width: v16 (all 16-aligned), v8, v4 (head_dim 12 or offsets)
WIDTHS = [(0, 0, 128, 16), (8, 0, 128, 8), (0, 8, 64, 8), (4, 0, 128, 4), (0, 0, 12, 4), (0, 4, 32, 4)]


@pytest.mark.parametrize("k_off,kv_off,hd,vec", WIDTHS)
@pytest.mark.parametrize("seed", range(3))
def test_emulated_kernel_matches_the_reference(emu, k_off, kv_off, hd, vec, seed):
    rng = random.Random(seed * 100 + vec + hd)
    for _ in range(4):
        c = make_scatter_case(rng, head_dim=hd, k_offset=k_off, kv_offset=kv_off,
                              slot_dtype=(torch.int64, torch.int32)[seed % 2])  # vLLM's slots, SGLang's loc
        want = scatter_reference(c)
        plan = run(emu, c)
        if plan.num_tokens:
            got_vec = int(re.search(r"_v(\d+)", op.launch_config(plan).entry).group(1))
            assert got_vec <= vec, c.desc
        assert torch.equal(c.store, want), f"{int((c.store != want).sum())} bytes differ: {c.desc}"


@pytest.mark.parametrize("k_off,kv_off,vec", [(0, 0, 16), (8, 0, 8), (0, 4, 4)])
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32])
def test_emulated_fixed_layout_entries_match_the_reference(emu, k_off, kv_off, vec, slot_dtype):
    """Calls of SGLang's default layout (spec.FIXED_LAYOUT: block 64, head_dim 128, one scale)
    launch the entries built with those sizes as constants, in every width and slot dtype."""
    bs, hd, nq = spec.FIXED_LAYOUT
    for seed in range(4):
        rng = random.Random(seed * 100 + vec)
        c = make_scatter_case(rng, head_dim=hd, nq=nq, block_size=bs, num_blocks=4, num_tokens=rng.randint(1, 200),
                              k_offset=k_off, kv_offset=kv_off, slot_dtype=slot_dtype)
        want = scatter_reference(c)
        entry = op.launch_config(op.plan_scatter(*c.args())).entry
        assert spec.FIXED_TAG in entry and int(re.search(r"_v(\d+)", entry).group(1)) == vec, (entry, c.desc)
        run(emu, c)
        assert torch.equal(c.store, want), f"{int((c.store != want).sum())} bytes differ: {c.desc}"


@pytest.mark.parametrize("grid", [1, 3])
def test_grids_smaller_than_the_work_cover_it(emu, grid):
    c = make_scatter_case(random.Random(grid), head_dim=128, nq=1, block_size=64, num_blocks=4, num_tokens=200,
                          padding=0.1)
    want = scatter_reference(c)
    run(emu, c, grid=grid)
    assert torch.equal(c.store, want), c.desc


def test_debug_mode_reports_a_slot_past_the_cache(emu):
    c = make_scatter_case(random.Random(5), head_dim=128, nq=1, block_size=16, num_blocks=2, num_tokens=6, padding=0)
    c.slot_mapping[3] = 32
    err = torch.zeros(4, dtype=torch.int64)
    good = c.slot_mapping.clone()
    good[3] = -1
    want = scatter_reference(type(c)(c.store, c.kv_cache, c.k, c.k_scale, good, c.block_stride, c.desc))
    run(emu, c, err_ptr=err.data_ptr())
    assert err.tolist() == [7, 3, 32, 32]
    assert torch.equal(c.store, want)  # the other rows are written, the bad one skipped


# --- index fuzz -------------------------------------------------------------------------------

# "fixed", "fixed_alias": SGLang's default layout (spec.FIXED_LAYOUT), whose calls run the entries
# built with its sizes as constants; the alias kinds: valid slots far past 2^31 (block stride 0)
KINDS = ("mixed", "extreme", "random", "alias", "alias_pow2", "fixed", "fixed_alias")


def fuzz_case(seed: str, kind: str, vec: int):
    """One call in an arena with guard bytes: k, k_scale, slot_mapping, kv_cache, err."""
    rng = random.Random(seed)
    fixed = kind.startswith("fixed")
    hd = spec.FIXED_LAYOUT[1] if fixed else {16: 128, 8: 64, 4: 12}[vec]
    nq = spec.FIXED_LAYOUT[2] if fixed else rng.choice([q for q in (1, 2, 4) if hd % q == 0])
    alias = "alias" in kind
    bs = spec.FIXED_LAYOUT[0] if fixed else \
        {"alias": rng.choice([3, 5]), "alias_pow2": 16}.get(kind) or rng.choice([1, 3, 4, 16])
    nb = 1 if alias else rng.randint(1, 5)
    num_slots = (1 << 40) if alias else nb * bs
    T = rng.randint(1, 24)
    pool = [I64_MIN, I64_MIN + 1, -2**32, -2**31 - 1, -2**31, -1, num_slots, num_slots + 1, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**32 + 1, 1 << 40, I64_MAX - 1, I64_MAX, rng.randint(I64_MIN, I64_MAX)]
    if alias:  # block 0 of stride 0 stands for every block: valid slots far above 2^31
        bases = [2**31, 2**32 - 8, 2**31 - 9, 2**32, (1 << 40) - 8, rng.randrange(1 << 31, 1 << 39)]
        offs = rng.sample(range(bs), min(bs, T))
        valid = [b + (t - b) % bs for b, t in zip(bases * bs, offs)]
    else:
        valid = rng.sample(range(num_slots), min(num_slots, T))
    slots = draw_slots(rng, kind, T, pool, valid)
    one_token_per_row(slots, num_slots, bs if alias else None)
    a = Arena()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    k_off = {16: 0, 8: 8, 4: 4}[vec]
    k_row = hd + rng.choice([0, 16])
    rows = T + rng.choice([0, 2])
    kb = a.alloc((rows - 1) * k_row + hd, k_off)
    kb.copy_(torch.randint(0, 256, kb.shape, dtype=torch.uint8, generator=gen))
    k = kb.as_strided((rows, hd), (k_row, 1)).view(FP8)
    sb = a.alloc(rows * 4 * nq)
    sb.copy_(torch.randint(0, 256, sb.shape, dtype=torch.uint8, generator=gen))
    k_scale = sb.view(torch.float32).view(rows, nq)
    cs = hd + 4 * nq + rng.choice([0, 4])
    block_stride = -(-bs * cs // 16) * 16 + rng.choice([0, 16])  # 16-byte aligned: the width is k's
    kvb = a.alloc((nb - 1) * block_stride + bs * cs)
    kvb.copy_(torch.randint(0, 256, kvb.shape, dtype=torch.uint8, generator=gen))
    kv = kvb.as_strided((nb, bs, cs), (block_stride, cs, 1))
    sm = a.alloc(8 * T).view(torch.int64)
    sm.copy_(torch.tensor(slots, dtype=torch.int64))
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    desc = (f"[scatter v{vec} seed={seed!r} kind={kind}] head_dim={hd} nq={nq} block_size={bs} num_blocks={nb} "
            f"num_slots={num_slots} slot_mapping={slots}")
    return dict(arena=a, k=k, k_scale=k_scale, kv=kv, sm=sm, err=err, slots=slots, bs=bs, hd=hd, nq=nq,
                num_slots=num_slots, alias=alias, fixed=fixed, block_stride=block_stride, desc=desc)


def fuzz_launch(c, vec, debug):
    plan = op.plan_scatter(c["k"], c["k_scale"], c["kv"], c["sm"])
    entry, grid, fields = op.launch_config(plan)
    assert entry == spec.entry_name(vec, "i64", c["fixed"]), c["desc"]
    if c["alias"]:
        fields = dict(fields, block_stride=0, num_slots=c["num_slots"])
    T = len(c["slots"])
    k = c["k"]
    k_hi = k.data_ptr() + (T - 1) * k.stride(0) + k.size(1)  # rows past T: never read
    s = c["k_scale"]
    s_hi = s.data_ptr() + ((T - 1) * s.stride(0) + s.size(1)) * 4
    c["before"] = c["arena"].bytes.clone()
    return Launch(entry, grid, pack(spec.PARAMS, fields, c["err"].data_ptr() if debug else 0),
                  [(k.data_ptr(), k_hi), (s.data_ptr(), s_hi), span(c["sm"])])


def fuzz_check(c, debug, outcome):
    problem = launch_problem(*outcome)
    assert problem is None, f"{problem}: {c['desc']}"
    before, bs, hd, nq = c["before"], c["bs"], c["hd"], c["nq"]
    expected = before.clone()
    arena0 = c["arena"].bytes.data_ptr()
    kv0 = c["kv"].data_ptr() - arena0
    for i, s in enumerate(c["slots"]):
        if not 0 <= s < c["num_slots"]:
            continue
        b, t = (0, s % bs) if c["alias"] else divmod(s, bs)
        base = kv0 + b * c["block_stride"]
        expected[base + t * hd: base + (t + 1) * hd] = same_view(c["k"], before)[i]
        expected[base + bs * hd + 4 * nq * t: base + bs * hd + 4 * nq * (t + 1)] = \
            same_view(c["k_scale"], before)[i]
    if debug:
        bad = [i for i, s in enumerate(c["slots"]) if s >= c["num_slots"]]
        code, a, b, v = c["err"].tolist()
        if bad:
            assert code == 7 and a in bad and b == c["slots"][a] and v == c["num_slots"], c["desc"]
        else:
            assert [code, a, b, v] == [0, 0, 0, 0], c["desc"]
        same_view(c["err"], expected).copy_(c["err"].view(torch.uint8))
    regions = {n: (span(c[n])[0] - arena0, span(c[n])[1] - arena0) for n in ("k", "k_scale", "kv", "sm", "err")}
    got = c["arena"].bytes
    assert torch.equal(got, expected), f"{first_difference(got, expected, regions)}: {c['desc']}"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() to isolate the launches")
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("vec", spec.VECTOR_WIDTHS)
def test_scatter_slot_fuzz(emu, vec, debug):
    cases = [fuzz_case(f"scatter-v{vec}-{kind}-{rep}", kind, vec) for rep in range(3) for kind in KINDS]
    outcomes = run_isolated(emu, [fuzz_launch(c, vec, debug) for c in cases])
    for c, outcome in zip(cases, outcomes):
        fuzz_check(c, debug, outcome)
