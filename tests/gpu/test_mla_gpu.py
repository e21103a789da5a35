"""concat_and_cache_mla and cp_gather_and_upconvert_fp8_kv_cache: their NVRTC kernels bit-exact
against the torch path, on a real GPU.

Every case is laid out in flat stores with guard bytes (helpers/mla_cases.py): outputs start
poisoned (the gather's dst with SENTINEL, the cache with random bytes), so every unwritten or
stray byte shows, and whole stores are compared. Small cases compare with the op run on the
CPU copy (the torch path, itself checked against the per-token reference on CPU by
tests/ops/test_mla_cpu.py); large ones with the torch path functions run on the GPU. The
kernel that ran is pinned by the plan's vector width (16: 16-byte accesses; 0: the kernels of
any alignment)."""
import itertools
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.jit import driver
from nvrtc_gather.kernels import mla_cache as spec
from nvrtc_gather.ops import mla_gather, mla_write
from nvrtc_gather.ops.mla_gather_torch import gather_torch, upconvert
from nvrtc_gather.ops.mla_write_torch import write_torch
from helpers.mla_cases import (BF16, F16, F32, FP8, NOPE, RECORD, ROPE, ROW, TILE_KINDS, make_gather_case,
                               make_write_case, ragged, row_values)
from helpers.reference import SENTINEL, assert_no_allocation_on_a_side_stream

pytestmark = pytest.mark.gpu
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
DTYPES = {"bf16": BF16, "f16": F16}
TYPE_NAMES = {BF16: "bf16", F16: "f16", F32: "f32"}
SENTINEL16 = int.from_bytes(bytes([SENTINEL, SENTINEL]), "little", signed=True)  # a poisoned bf16 value's bits


def _diff(got: torch.Tensor, want: torch.Tensor, n: int = 6) -> str:
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    bad = torch.nonzero(g != w).flatten()
    first = [(int(i), int(g[i]), int(w[i])) for i in bad[:n]]
    return f"{bad.numel()} bytes differ, first (byte, got, want) {first}"


def _debug(monkeypatch, on: bool) -> None:
    if on:
        monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    else:
        monkeypatch.delenv("NVRTC_GATHER_DEBUG", raising=False)


# =============================================================================================
# concat_and_cache_mla
# =============================================================================================

def check_write(case_cpu, expect_vec=None):
    """The kernel on a GPU copy of the case against the torch path on the CPU original: every
    byte of the cache's store (guards and gaps included). Returns the GPU plan."""
    g = case_cpu.to("cuda")
    plan = mla_write.plan_write(*g.args())
    if expect_vec is not None:
        assert plan.vec == expect_vec, case_cpu.desc
        if plan.num_tokens and plan.fmt == "ds":
            assert mla_write.launch_config(plan).entry == spec.ds_entry(plan.k_type, expect_vec)
    ng.concat_and_cache_mla(*case_cpu.args())
    ng.concat_and_cache_mla(*g.args())
    torch.cuda.synchronize()
    got = g.cache.bytes().cpu()
    want = case_cpu.cache.bytes()
    assert torch.equal(got, want), case_cpu.desc + ": " + _diff(got, want)
    return plan


# Ways to leave 16-byte alignment (so the any-alignment kernel runs), as make_write_case
# arguments: kv_c at an odd 2-byte offset, rows 8 bytes off, k_pe 4 bytes off, cache entries /
# blocks / data 4-byte but not 16-byte aligned.
WRITE_UNALIGNED = {
    "kv_c_odd_offset": dict(kv_c_offset=1), "kv_c_row_pad": dict(kv_c_row_pad=4),
    "k_pe_offset": dict(k_pe_offset=2), "k_pe_row_pad": dict(k_pe_row_pad=2),
    "entry_pad": dict(entry_pad=4), "block_pad": dict(block_pad=4), "cache_offset": dict(cache_offset=4),
}


def _write_unaligned_options(block_size: int, pe_dim: int) -> list[str]:
    """The WRITE_UNALIGNED keys that change the vector width for this shape (an entry stride
    is not used with one-entry blocks, nor k_pe's pointer and row stride without k_pe: an
    empty tensor's data pointer may be 0)."""
    return [k for k in WRITE_UNALIGNED if not (k == "entry_pad" and block_size == 1)
            and not (k.startswith("k_pe") and pe_dim == 0)]


def _ds_layout(rng: random.Random, vec: int, block_size: int, pe_dim: int) -> dict:
    if vec:  # 16-byte aligned pads, or none
        return dict(kv_c_row_pad=rng.choice([0, 8, 64]), k_pe_row_pad=rng.choice([0, 8]),
                    entry_pad=rng.choice([0, 16]), block_pad=rng.choice([0, 16]), cache_offset=rng.choice([0, 32]))
    return dict(WRITE_UNALIGNED[rng.choice(_write_unaligned_options(block_size, pe_dim))])


def _ds_grid():
    out, i = [], 0
    for bs in (1, 16, 64):
        for dt in DTYPES:
            for pe in (64, 0):
                for rule in ("pow2", "plain"):
                    for vec in (16, 0):
                        out.append(pytest.param(bs, dt, pe, rule, vec, (37, 300)[i % 2],
                                                id=f"bs{bs}-{dt}-pe{pe}-{rule}-v{vec}"))
                        i += 1
    return out


@pytest.mark.parametrize("bs,dt,pe,rule,vec,tokens", _ds_grid())
def test_ds_write_matches_cpu_on_grid(bs, dt, pe, rule, vec, tokens):
    rng = random.Random(f"ds-{bs}-{dt}-{pe}-{rule}-{vec}")
    case = make_write_case(rng, dtype=DTYPES[dt], block_size=bs, num_tokens=tokens, pe_dim=pe, rule=rule,
                           cache_fp8=rng.random() < 0.5, extra_rows=rng.choice([0, 5]),
                           **_ds_layout(rng, vec, bs, pe))
    check_write(case, expect_vec=vec)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("how", list(WRITE_UNALIGNED))
def test_ds_write_every_misalignment_runs_the_any_kernel(how, dt):
    rng = random.Random(f"mis-{how}-{dt}")
    for rule in ("pow2", "plain"):
        check_write(make_write_case(rng, dtype=DTYPES[dt], block_size=16, num_tokens=90, rule=rule,
                                    **WRITE_UNALIGNED[how]), expect_vec=0)


@pytest.mark.parametrize("vec", [16, 0])
@pytest.mark.parametrize("rule", ["pow2", "plain"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", TILE_KINDS)
def test_ds_write_tiles_of_one_kind(kind, dt, rule, vec):
    """Every tile all zeros, huge, subnormal, with NaNs, all NaN, with infs, or e4m3 ties."""
    rng = random.Random(f"kind-{kind}-{dt}-{rule}-{vec}")
    case = make_write_case(rng, dtype=DTYPES[dt], block_size=16, num_tokens=64, rule=rule, kinds=(kind,),
                           pad_frac=0.05, **({} if vec else {"kv_c_offset": 1}))
    check_write(case, expect_vec=vec)


# (format, input dtype): the copy formats store kv_c's dtype; the fp8 ones take every dtype.
PLAIN = [("auto", BF16), ("auto", F16), ("auto", F32), ("bfloat16", BF16), ("float16", F16)] + \
        [(f, dt) for f in ("fp8", "fp8_e4m3") for dt in (BF16, F16, F32)]


def _plain_grid():
    out = []
    for fmt, dt in PLAIN:
        for rank, pe in ((512, 64), (512, 0), (100, 7)):
            for skip in ((False, True) if fmt.startswith("fp8") else (False,)):
                out.append(pytest.param(fmt, dt, rank, pe, skip,
                                        id=f"{fmt}-{TYPE_NAMES[dt]}-{rank}+{pe}{'-skip' if skip else ''}"))
    return out


@pytest.mark.parametrize("fmt,dt,rank,pe,skip", _plain_grid())
def test_plain_formats_match_cpu(fmt, dt, rank, pe, skip):
    rng = random.Random(f"plain-{fmt}-{dt}-{rank}-{pe}-{skip}")
    for bs in (1, 16, 64):
        for aligned in (True, False):
            layout = {} if aligned else dict(kv_c_offset=1, k_pe_offset=1, kv_c_row_pad=1, entry_pad=1,
                                             cache_offset=1, block_pad=rng.choice([0, 3]))
            check_write(make_write_case(rng, fmt=fmt, dtype=dt, block_size=bs, num_tokens=rng.choice([5, 70]),
                                        rank=rank, pe_dim=pe, skip_scale=skip, cache_fp8=rng.random() < 0.5,
                                        **layout))


@pytest.mark.parametrize("fmt,dt", [("fp8_ds_mla", BF16), ("fp8_ds_mla", F16), ("auto", BF16), ("fp8", F32)])
def test_padding_only_and_empty_slot_mappings_write_nothing(fmt, dt):
    rng = random.Random(fmt)
    for slots in ([], [-1], [-1] * 9, [-1, -(1 << 40), -2, -1]):
        case = make_write_case(rng, fmt=fmt, dtype=dt, num_tokens=max(1, len(slots)), pad_frac=0.0)
        case.slot_mapping = torch.tensor(slots, dtype=torch.int64)
        before = case.cache.bytes().clone()
        check_write(case)
        assert torch.equal(case.cache.bytes(), before)


def _bad_slot_case(fmt, dt, vec):
    rng = random.Random(f"bad-slot-{fmt}-{dt}-{vec}")
    case = make_write_case(rng, fmt=fmt, dtype=dt, block_size=16, num_tokens=60, num_blocks=6, pad_frac=0.1,
                           **({} if vec else {"entry_pad": 4}))
    n = case.num_slots
    bad = case.slot_mapping.clone()
    bad[3], bad[17], bad[40] = n, n + 12345, 1 << 40
    good = bad.clone()
    good[[3, 17, 40]] = -1
    return case, bad, good


@pytest.mark.parametrize("fmt,dt,vec", [("fp8_ds_mla", BF16, 16), ("fp8_ds_mla", BF16, 0), ("fp8_ds_mla", F16, 16),
                                        ("auto", BF16, 0), ("fp8", F32, 0)])
def test_write_slots_past_the_cache_are_skipped_and_reported_in_debug_mode(fmt, dt, vec, monkeypatch):
    _debug(monkeypatch, False)
    case, bad, good = _bad_slot_case(fmt, dt, vec)
    with pytest.raises(ValueError, match=r"slot_mapping: entry 3 = \d+ is past the cache's last slot"):
        ng.concat_and_cache_mla(*case.args()[:3], bad, *case.args()[4:])  # the CPU path raises first
    g = case.to("cuda")
    g.slot_mapping = bad.cuda()
    case.slot_mapping = good  # the expectation: those rows as padding
    ng.concat_and_cache_mla(*g.args())  # no crash, no stray write
    ng.concat_and_cache_mla(*case.args())
    torch.cuda.synchronize()
    got = g.cache.bytes().cpu()
    assert torch.equal(got, case.cache.bytes()), _diff(got, case.cache.bytes())
    _debug(monkeypatch, True)
    with pytest.raises(ValueError, match=r"concat_and_cache_mla \(debug mode\): slot_mapping: entry (3|17|40) = \d+ "
                                         rf"is past the cache's last slot \({case.num_slots} slots\)"):
        ng.concat_and_cache_mla(*g.args())
    got = g.cache.bytes().cpu()  # the good rows written again, the same bytes; nothing else
    assert torch.equal(got, case.cache.bytes()), _diff(got, case.cache.bytes())


@pytest.mark.parametrize("fmt,dt", [("fp8_ds_mla", BF16), ("fp8_ds_mla", F16), ("auto", F32), ("fp8_e4m3", BF16)])
def test_write_debug_mode_is_silent_on_good_input(fmt, dt, monkeypatch):
    _debug(monkeypatch, True)
    check_write(make_write_case(random.Random(fmt), fmt=fmt, dtype=dt, block_size=64, num_tokens=100))


def _device_write(tokens, fmt="fp8_ds_mla", dt=BF16, num_blocks=None, high=False, seed=0, block_size=64):
    """Built on the GPU: random kv_c / k_pe, distinct random slots (~3% padding) over a random
    cache (``high``: only slots whose blocks start past the 4 GiB mark); the kernel against
    the torch path run on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = RECORD if fmt == "fp8_ds_mla" else NOPE + ROPE
    block_bytes = block_size * width
    num_blocks = num_blocks or 2 * -(-tokens // block_size) + 3
    lo = (4 << 30) // block_bytes + 1 if high else 0  # the first block wholly past 4 GiB
    cache = torch.randint(0, 256, (num_blocks, block_size, width), dtype=torch.uint8, device="cuda", generator=g)
    slots = torch.randperm((num_blocks - lo) * block_size, device="cuda", generator=g)[:tokens] + lo * block_size
    slots[torch.rand(tokens, device="cuda", generator=g) < 0.03] = -1
    mag = torch.pow(10.0, torch.empty(tokens, 4, 1, device="cuda").uniform_(-5, 3, generator=g))
    kv_c = (torch.randn(tokens, 4, 128, device="cuda", generator=g) * mag).view(tokens, NOPE).to(dt)
    k_pe = torch.randn(tokens, ROPE, device="cuda", generator=g).to(dt)
    scale = torch.tensor([0.37], device="cuda")
    want = cache.clone()
    plan = mla_write.plan_write(kv_c, k_pe, want, slots, fmt, scale)
    write_torch(plan, kv_c, k_pe, want, slots, scale)
    ng.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt, scale)
    torch.cuda.synchronize()
    assert torch.equal(cache, want), _diff(cache, want)
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("fmt,dt", [("fp8_ds_mla", BF16), ("fp8_ds_mla", F16), ("fp8", BF16)])
def test_write_131072_tokens(fmt, dt):
    plan = _device_write(131072, fmt, dt, seed=1)
    assert plan.vec == (16 if fmt == "fp8_ds_mla" else 0)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp8"])
def test_write_cache_above_4_gib(fmt):
    width = RECORD if fmt == "fp8_ds_mla" else NOPE + ROPE
    num_blocks = (4 << 30) // (64 * width) + 2000  # ~4.3 GB; every used block lies past the 4 GiB mark
    assert num_blocks * 64 * width > 4 << 30
    _device_write(50000, fmt, num_blocks=num_blocks, high=True, seed=4)
    torch.cuda.empty_cache()


# =============================================================================================
# cp_gather_and_upconvert_fp8_kv_cache
# =============================================================================================

def _rows(dst_strided, store=None) -> torch.Tensor:
    """The dst rows (int16 bits, [num_rows, 576]) of a case's dst view over ``store``."""
    s = dst_strided.store if store is None else store
    return s.view(torch.int16).as_strided(dst_strided.shape, dst_strided.stride, dst_strided.offset)


def check_gather(case_cpu, expect_vec=None, rows_per_cta=None, expect_rows_per_cta=None):
    """The kernel on a GPU copy of the case (``rows_per_cta``: forced through the op's
    ``prepared`` hook) against the torch path on the CPU original: dst's whole store, guards
    and the rows before workspace_starts[0] included. Returns the GPU plan."""
    g = case_cpu.to("cuda")
    plan = mla_gather.plan_gather(*g.args())
    if expect_vec is not None:
        assert plan.vec == expect_vec, case_cpu.desc
        if plan.device >= 0:  # (a CPU plan has no rows per block)
            assert mla_gather.launch_config(plan).entry == spec.gather_entry(expect_vec)
    if expect_rows_per_cta is not None:
        assert plan.rows_per_cta == expect_rows_per_cta, case_cpu.desc
    ng.cp_gather_and_upconvert_fp8_kv_cache(*case_cpu.args())
    if rows_per_cta is None:
        ng.cp_gather_and_upconvert_fp8_kv_cache(*g.args())
    else:
        mla_gather.prepared(*g.args(), rows_per_cta=rows_per_cta)()
    torch.cuda.synchronize()
    got = g.dst.store.cpu()
    want = case_cpu.dst.store
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), case_cpu.desc + ": " + _diff(got, want)
    rows = _rows(case_cpu.dst, got)
    assert bool((rows[:case_cpu.ws0] == SENTINEL16).all()), "a row before workspace_starts[0] was written"
    if case_cpu.batch:  # every owned row written (a decoded row of all-SENTINEL bytes never occurs)
        assert not bool((rows[case_cpu.ws0:] == SENTINEL16).all(dim=1).any()), case_cpu.desc
    return plan


# Ways to leave 16-byte alignment in the gather: cache entries, blocks or data 4 bytes off;
# dst 4 bytes off or rows 4 bytes apart from a multiple of 16.
GATHER_UNALIGNED = {"entry_pad": dict(entry_pad=4), "block_pad": dict(block_pad=4), "cache_offset": dict(cache_offset=4),
                    "dst_offset": dict(dst_offset=2), "dst_row_pad": dict(dst_row_pad=2)}


def _gather_layout(rng, vec, block_size, num_rows):
    if vec:
        return dict(entry_pad=rng.choice([0, 16]), block_pad=rng.choice([0, 16, 32]), cache_offset=rng.choice([0, 16]),
                    dst_offset=rng.choice([0, 8]), dst_row_pad=rng.choice([0, 8]))
    options = [k for k in GATHER_UNALIGNED if not (k == "entry_pad" and block_size == 1)
               and not (k == "dst_row_pad" and num_rows <= 1)]
    return dict(GATHER_UNALIGNED[rng.choice(options)])


def _gather_grid():
    out = []
    for bs in (1, 16, 64):
        for seq in (False, True):
            for cu in (True, False):
                for vec in (16, 0):
                    out.append(pytest.param(bs, seq, cu, vec, id=f"bs{bs}-{'seq' if seq else 'noseq'}-"
                                                                  f"{'cu' if cu else 'starts'}-v{vec}"))
    return out


@pytest.mark.parametrize("bs,seq,cu,vec", _gather_grid())
def test_gather_matches_cpu_on_grid(bs, seq, cu, vec):
    """Ragged requests with empty ones, seq_starts on / off, workspace_starts as cu_seq_lens
    (batch + 1 entries, the last one never read: given short of the truth) or batch entries,
    rows before workspace_starts[0], both vector widths, uint8 and fp8 caches."""
    rng = random.Random(f"gather-{bs}-{seq}-{cu}-{vec}")
    for batch in (1, 2, 37, 300):
        mean = rng.choice([1, 5, 40] if batch > 100 else [1, 5, 40, 200])
        lens = ragged(rng, batch, mean)
        ws0 = rng.choice([0, 0, 5, 64])
        case = make_gather_case(rng, lens=lens, block_size=bs, seq_starts=seq, cu_style=cu, ws0=ws0,
                                cu_tail=rng.choice([0, 3]) if cu else 0, src_fp8=rng.random() < 0.5,
                                **_gather_layout(rng, vec, bs, ws0 + sum(lens)))
        check_gather(case, expect_vec=vec)


@pytest.mark.parametrize("how", list(GATHER_UNALIGNED))
def test_gather_every_misalignment_runs_the_v4_kernel(how):
    rng = random.Random(how)
    case = make_gather_case(rng, lens=ragged(rng, 20, 30), block_size=16, seq_starts=True, ws0=3,
                            **GATHER_UNALIGNED[how])
    check_gather(case, expect_vec=0)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", TILE_KINDS)
def test_gather_of_records_with_special_tiles(kind, dt):
    """Records the write makes from tiles all zeros / huge / subnormal / NaN / inf / ties
    (both scale rules), gathered by both kernels."""
    rng = random.Random(f"records-{kind}-{dt}")
    for pow2 in (True, False):
        for vec in (16, 0):
            case = make_gather_case(rng, lens=ragged(rng, 9, 40), block_size=16, seq_starts=True, records="written",
                                    kinds=(kind,), dtype=DTYPES[dt], pow2=pow2, **({} if vec else {"dst_offset": 2}))
            check_gather(case, expect_vec=vec)


@pytest.mark.parametrize("batch", [1, 2, 31, 32, 33, 1024, 1025, 4096])
def test_gather_request_search(batch):
    """The 32-ary search over workspace_starts at its level boundaries, many empty requests."""
    rng = random.Random(batch)
    for seq in (False, True):
        case = make_gather_case(rng, lens=ragged(rng, batch, 3, empty_frac=0.3), block_size=16, seq_starts=seq,
                                ws0=rng.choice([0, 7]))
        check_gather(case)


def _lens_summing_to(rng, batch, total):
    cuts = sorted(rng.sample(range(1, total), batch - 1))
    lens = [b - a for a, b in zip([0] + cuts, cuts + [total])]
    return lens[:batch // 3] + [0, 0] + lens[batch // 3:]  # two empty requests too


@pytest.mark.parametrize("target", [spec.MIN_ROWS_PER_CTA, spec.MAX_ROWS_PER_CTA])
def test_gather_rows_per_cta_policy(target):
    """Sizes whose policy choice is the fewest rows per block (small calls) and the most (large ones)."""
    sm = driver.sm_count(0)
    total = 10 * sm if target == spec.MIN_ROWS_PER_CTA else 200 * sm
    rng = random.Random(target)
    case = make_gather_case(rng, lens=_lens_summing_to(rng, 37, total), block_size=64, seq_starts=True)
    assert spec.rows_per_cta(total, sm) == target
    check_gather(case, expect_vec=16, expect_rows_per_cta=target)


@pytest.mark.parametrize("rows_per_cta", [8, 24, 64])
@pytest.mark.parametrize("vec", [16, 0])
def test_gather_forced_rows_per_cta(rows_per_cta, vec):
    rng = random.Random(rows_per_cta * 3 + vec)
    case = make_gather_case(rng, lens=ragged(rng, 50, 60), block_size=64, seq_starts=True, ws0=9,
                            **({} if vec else {"entry_pad": 4}))
    check_gather(case, expect_vec=vec, rows_per_cta=rows_per_cta)


def test_gather_nothing_to_do():
    rng = random.Random(3)
    for lens, ws0 in (([], 0), ([], 6), ([0, 0, 0], 0), ([0, 0], 5)):
        check_gather(make_gather_case(rng, lens=lens, block_size=16, ws0=ws0))


def _device_gather(lens, block_size=64, num_blocks=None, high=False, seq_starts=False, seed=0):
    """Built on the GPU: random record bytes, shuffled blocks (``high``: only blocks that start
    past the 4 GiB mark), workspace_starts = cu_seq_lens; the kernel against the torch path run
    on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rng = random.Random(seed)
    firsts = [rng.randint(0, 200) if seq_starts else 0 for _ in lens]
    cols = [(f // block_size, -(-(f + n) // block_size)) if n else (0, 0) for f, n in zip(firsts, lens)]
    need = sum(b - a for a, b in cols)
    block_bytes = block_size * RECORD
    num_blocks = num_blocks or need + 11
    lo = (4 << 30) // block_bytes + 1 if high else 0
    assert num_blocks - lo >= need
    cache = torch.randint(0, 256, (num_blocks, block_size, RECORD), dtype=torch.uint8, device="cuda", generator=g)
    ids = (torch.randperm(num_blocks - lo, device="cuda", generator=g)[:need] + lo).to(torch.int32).cpu()
    max_blocks = max([b for _, b in cols] + [1])
    bt = torch.randint(-5, 0, (len(lens), max_blocks), dtype=torch.int32)  # unused columns: bad ids, never read
    k = 0
    for r, (a, b) in enumerate(cols):
        bt[r, a:b] = ids[k:k + b - a]
        k += b - a
    bt = bt.cuda()
    ws = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    seq = torch.tensor(firsts, dtype=torch.int32, device="cuda") if seq_starts else None
    dst = torch.empty(sum(lens), ROW, dtype=BF16, device="cuda")
    dst.view(torch.uint8).fill_(SENTINEL)
    want = dst.clone()
    plan = mla_gather.plan_gather(cache, want, bt, ws, len(lens), seq)
    gather_torch(plan, cache, want, bt, ws, seq)
    ng.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, bt, ws, len(lens), seq)
    torch.cuda.synchronize()
    assert torch.equal(dst.view(torch.int16), want.view(torch.int16)), _diff(dst, want)
    assert not bool((dst.view(torch.int16) == SENTINEL16).all(dim=1).any())
    return plan


@pytest.mark.slow
def test_gather_one_request_of_131072_tokens():
    plan = _device_gather([131072], seed=1)
    assert plan.vec == 16 and plan.rows_per_cta == spec.MAX_ROWS_PER_CTA


@pytest.mark.slow
def test_gather_4096_requests():
    _device_gather(ragged(random.Random(2), 4096, 64, empty_frac=0.05), seq_starts=True, seed=2)


@pytest.mark.slow
def test_gather_cache_above_4_gib():
    num_blocks = (4 << 30) // (64 * RECORD) + 2000  # ~4.3 GB, the used blocks all past the 4 GiB mark
    assert num_blocks * 64 * RECORD > 4 << 30
    _device_gather(ragged(random.Random(4), 16, 3000), num_blocks=num_blocks, high=True, seq_starts=True, seed=4)
    torch.cuda.empty_cache()


# --- bad indices: skipped (nothing else changes), reported in debug mode ---------------------

# fault -> what the debug-mode ValueError must say
GATHER_FAULTS = {
    "block_id_high": r"block_table: row \d+ \(request 2\) maps to physical block \d+, outside",
    "block_id_negative": r"block_table: row \d+ \(request 0\) maps to physical block -5, outside",
    "column_past_max_blocks": r"block_table: row \d+ \(request 3\) needs block_table column \d+",
    "seq_start_negative": r"seq_starts: entry 2 = -5 is negative",
    "ws_decreasing": r"workspace_starts: entry 3 = \d+ is negative or below the entry before it",
    "ws_negative": r"workspace_starts: entry 0 = -3 is negative",
}


def _faulty_gather_case(what, vec):
    """Six requests (one empty) of 16-token blocks from random first tokens, 4 rows before
    the first, every block_table entry a valid block id (so only ``what`` is wrong), then
    ``what`` broken."""
    rng = random.Random(f"fault-{what}-{vec}")
    c = make_gather_case(rng, lens=[20, 0, 33, 16, 5, 40], block_size=16, seq_starts=True, ws0=4,
                         all_columns_valid=True, **({} if vec else {"dst_offset": 2}))
    bt, ws, seq = c.block_table, c.workspace_starts, c.seq_starts
    if what == "block_id_high":
        bt[2, c.firsts[2] // 16 + 1] = c.cache.shape[0] + 1000000
    elif what == "block_id_negative":
        bt[0, c.firsts[0] // 16] = -5
    elif what == "column_past_max_blocks":  # request 3's last 11 tokens lie past its block_table row
        seq[3] = bt.shape[1] * 16 - 5
    elif what == "seq_start_negative":
        seq[2] = -5
    elif what == "ws_decreasing":  # request 3 starts inside request 0's rows
        ws[3] = 10
    else:
        ws[0] = -3
    return c


def _row_candidates(c):
    """Per dst row, the upconverted rows (int16 [576]) it may hold: those of each request that
    claims it with good indices (one request at most while workspace_starts is
    non-decreasing); no candidate: the row must stay poisoned."""
    b, num_rows = c.batch, c.num_rows
    ws = [int(x) for x in c.workspace_starts[:b]]
    firsts = [int(x) for x in c.seq_starts[:b]] if c.seq_starts is not None else [0] * b
    cache = c.cache.view().view(torch.uint8)
    nb, bs, _ = cache.shape
    max_blocks = c.block_table.shape[1]
    out = [[] for _ in range(num_rows)]
    for r in range(b):
        start = ws[r]
        stop = min(ws[r + 1] if r + 1 < b else num_rows, num_rows)
        if start < 0 or firsts[r] < 0:
            continue
        for t in range(start, stop):
            pos = firsts[r] + t - start
            if pos // bs >= max_blocks:
                continue
            blk = int(c.block_table[r, pos // bs])
            if 0 <= blk < nb:
                out[t].append(upconvert(cache[blk, pos % bs].unsqueeze(0))[0])
    return out


def _assert_rows_match_candidates(c, got_store, strict: bool):
    rows = _rows(c.dst, got_store)
    cands = _row_candidates(c)
    for t in range(c.num_rows):
        poisoned = bool((rows[t] == SENTINEL16).all())
        if strict:
            assert len(cands[t]) <= 1
            if cands[t]:
                assert torch.equal(rows[t], cands[t][0]), f"row {t}: {c.desc}"
            else:
                assert poisoned, f"row {t} should have been skipped: {c.desc}"
        else:
            assert poisoned or any(torch.equal(rows[t], w) for w in cands[t]), f"row {t}: {c.desc}"
    rest = got_store.clone()
    _rows(c.dst, rest).fill_(SENTINEL16)
    assert bool((rest.view(torch.uint8) == SENTINEL).all()), "a byte outside dst's rows was written"


@pytest.mark.parametrize("vec", [16, 0])
@pytest.mark.parametrize("what", list(GATHER_FAULTS))
def test_gather_bad_indices_are_skipped_and_reported_in_debug_mode(what, vec, monkeypatch):
    _debug(monkeypatch, False)
    c = _faulty_gather_case(what, vec)
    with pytest.raises(ValueError):  # the CPU path checks every index before writing
        ng.cp_gather_and_upconvert_fp8_kv_cache(*c.args())
    assert bool((c.dst.store.view(torch.uint8) == SENTINEL).all())
    g = c.to("cuda")
    assert mla_gather.plan_gather(*g.args()).vec == vec
    ng.cp_gather_and_upconvert_fp8_kv_cache(*g.args())  # no crash, no out-of-bounds access (memcheck run)
    torch.cuda.synchronize()
    strict = what != "ws_decreasing"  # out-of-order starts: a row may go to any request that claims it
    _assert_rows_match_candidates(c, g.dst.store.cpu(), strict)
    _debug(monkeypatch, True)
    with pytest.raises(ValueError, match=r"cp_gather_and_upconvert_fp8_kv_cache \(debug mode\): " + GATHER_FAULTS[what]):
        ng.cp_gather_and_upconvert_fp8_kv_cache(*g.args())
    _assert_rows_match_candidates(c, g.dst.store.cpu(), strict)


def test_gather_debug_mode_is_silent_on_good_input(monkeypatch):
    _debug(monkeypatch, True)
    rng = random.Random(11)
    for vec in (16, 0):
        check_gather(make_gather_case(rng, lens=ragged(rng, 30, 40), block_size=16, seq_starts=True, ws0=2,
                                      **({} if vec else {"cache_offset": 4})), expect_vec=vec)


# =============================================================================================
# both ops
# =============================================================================================

@pytest.mark.parametrize("rule", ["pow2", "plain"])
@pytest.mark.parametrize("dt", DTYPES)
def test_round_trip_write_then_gather(dt, rule):
    """Write each request's tokens with the op, gather them back: the same bytes as the CPU
    path, and kv_c within fp8 rounding (k_pe exact, or fp16 rounded to bf16)."""
    dtype, bs, lens = DTYPES[dt], 64, [300, 0, 37, 129, 1]
    gen = torch.Generator().manual_seed(5)
    blocks_per = [-(-n // bs) for n in lens]
    num_blocks = sum(blocks_per) + 4
    ids = torch.randperm(num_blocks, generator=gen)[:sum(blocks_per)].to(torch.int32)
    bt = torch.full((len(lens), max(blocks_per)), -1, dtype=torch.int32)
    slots, at = [], 0
    for r, (n, nb) in enumerate(zip(lens, blocks_per)):
        bt[r, :nb] = ids[at:at + nb]
        at += nb
        i = torch.arange(n)
        slots.append(bt[r, i // bs].long() * bs + i % bs)
    slot_mapping = torch.cat(slots)
    total = slot_mapping.numel()
    ws = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)
    kv_c = row_values(gen, total, NOPE, dtype, kinds=("normal",))
    k_pe = row_values(gen, total, ROPE, dtype, kinds=("normal",))
    cache = torch.randint(0, 256, (num_blocks, bs, RECORD), dtype=torch.uint8, generator=gen)
    scale = torch.ones(1)
    dst = torch.empty(total, ROW, dtype=BF16)
    dst.view(torch.uint8).fill_(SENTINEL)
    host = [kv_c, k_pe, cache, slot_mapping, scale, dst, bt, ws]
    dev = [t.cuda() for t in host]
    for t in (host, dev):
        ng.concat_and_cache_mla(t[0], t[1], t[2], t[3], "fp8_ds_mla", t[4], False, rule)
        ng.cp_gather_and_upconvert_fp8_kv_cache(t[2], t[5], t[6], t[7], len(lens))
    torch.cuda.synchronize()
    assert torch.equal(dev[2].cpu(), cache), _diff(dev[2].cpu(), cache)
    assert torch.equal(dev[5].cpu().view(torch.int16), dst.view(torch.int16)), _diff(dev[5].cpu(), dst)
    x = kv_c.float().view(total, 4, 128)
    got = dev[5].cpu().float()
    rec_scales = cache.view(-1, RECORD)[slot_mapping][:, 512:528].contiguous().view(torch.float32)  # [total, 4]
    err = (got[:, :NOPE].view(total, 4, 128) - x).abs()
    # e4m3: relative 2^-4 for normal codes, absolute 2^-10 * scale below; then bf16's 2^-9 relative.
    tol = x.abs() * (2.0 ** -4 + 2.0 ** -8) + rec_scales.unsqueeze(-1) * 2.0 ** -9
    assert bool((err <= tol).all()), float((err - tol).max())
    assert torch.equal(dev[5].cpu()[:, NOPE:], k_pe.to(BF16))


_CAPTURE = textwrap.dedent("""
    import sys, torch, nvrtc_gather as ng
    mode = sys.argv[1]
    NB, BS = 12, 16

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        kv_c = (torch.randn(40, 512, generator=g) * 3).to(torch.bfloat16)
        k_pe = torch.randn(40, 64, generator=g).to(torch.bfloat16)
        slots = torch.randperm(NB * BS, generator=g)[:40]
        slots[::9] = -1
        bt = torch.randperm(NB, generator=g)[:8].to(torch.int32).view(2, 4)
        ws = torch.tensor([0, 30], dtype=torch.int32)
        seq = torch.randint(0, 14, (2,), generator=g).to(torch.int32)  # tokens up to 43: block_table columns 0-2
        return [kv_c, k_pe, slots, bt, ws, seq]

    def ops(t, cache, scale, dst):
        ng.concat_and_cache_mla(t[0], t[1], cache, t[2], "fp8_ds_mla", scale)
        ng.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, t[3], t[4], 2, t[5])

    cache0 = torch.randint(0, 256, (NB, BS, 656), dtype=torch.uint8)
    scale = torch.ones(1)
    dev = [t.cuda() for t in inputs(1)]
    g_cache, g_scale = cache0.cuda(), scale.cuda()
    g_dst = torch.zeros(50, 576, dtype=torch.bfloat16, device="cuda")
    if mode == "preload":
        ng.preload(0)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            ops(dev, g_cache, g_scale, g_dst)
        outcome = "captured"
    except ng.CaptureError as exc:
        outcome = "CaptureError: " + str(exc)
    print(outcome)
    ng.preload(0)  # whatever happened, the process can capture and replay afterwards
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops(dev, g_cache, g_scale, g_dst)
    ok = True
    for seed in (2, 3):
        host = inputs(seed)
        for d, h in zip(dev, host):
            d.copy_(h)
        g_cache.copy_(cache0)
        g_dst.view(torch.int16).fill_(-23131)
        graph.replay()
        torch.cuda.synchronize()
        cache = cache0.clone()
        dst = torch.empty(50, 576, dtype=torch.bfloat16)
        dst.view(torch.int16).fill_(-23131)
        ops(host, cache, scale, dst)
        ok = ok and torch.equal(g_cache.cpu(), cache) and torch.equal(g_dst.cpu().view(torch.int16), dst.view(torch.int16))
    print("replay-ok" if ok else "replay-wrong")
""")


@pytest.mark.parametrize("mode", ["preload", "cold"])
def test_cuda_graph_capture_of_both_ops(mode):
    """In a fresh process: after nvrtc_gather.preload() both ops capture on their first call
    (without it, a CaptureError naming preload); replays follow new contents of the inputs."""
    r = subprocess.run([sys.executable, "-c", _CAPTURE, mode], env=dict(os.environ), cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    if mode == "preload":
        assert lines[0] == "captured", r.stdout
    else:
        assert lines[0].startswith("CaptureError") and "preload" in lines[0], r.stdout
    assert lines[-1] == "replay-ok", r.stdout + r.stderr


def test_cuda_graph_replay_in_process_follows_new_contents():
    rng = random.Random(12)
    w = make_write_case(rng, block_size=16, num_tokens=40, num_blocks=6, pad_frac=0.1)
    gc = make_gather_case(rng, lens=[30, 0, 17], block_size=16, seq_starts=True, ws0=2, all_columns_valid=True)
    poisoned = gc.dst.store.clone()
    wg, gg = w.to("cuda"), gc.to("cuda")
    ng.concat_and_cache_mla(*wg.args())  # loads the kernels before capture
    ng.cp_gather_and_upconvert_fp8_kv_cache(*gg.args())
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ng.concat_and_cache_mla(*wg.args())
        ng.cp_gather_and_upconvert_fp8_kv_cache(*gg.args())
    for trial in range(2):
        w2 = make_write_case(random.Random(100 + trial), block_size=16, num_tokens=40, num_blocks=6, pad_frac=0.1)
        for name in ("kv_c", "k_pe", "cache"):
            getattr(wg, name).store.copy_(getattr(w2, name).store)
        wg.slot_mapping.copy_(w2.slot_mapping)
        gen = torch.Generator().manual_seed(trial)
        gc.cache.store.copy_(torch.randint(0, 256, gc.cache.store.shape, dtype=torch.uint8, generator=gen))
        gc.block_table.copy_(torch.randint(0, gc.cache.shape[0], gc.block_table.shape, dtype=torch.int32,
                                           generator=gen))  # every entry a valid block
        gc.dst.store.copy_(poisoned)
        gg.cache.store.copy_(gc.cache.store)
        gg.block_table.copy_(gc.block_table)
        gg.dst.store.copy_(poisoned)
        graph.replay()
        torch.cuda.synchronize()
        ng.concat_and_cache_mla(*w2.args())
        ng.cp_gather_and_upconvert_fp8_kv_cache(*gc.args())
        assert torch.equal(wg.cache.bytes().cpu(), w2.cache.bytes()), f"trial {trial}: the write"
        assert torch.equal(gg.dst.store.cpu().view(torch.int16), gc.dst.store.view(torch.int16)), \
            f"trial {trial}: the gather"


def test_torch_ops_give_the_same_bytes():
    rng = random.Random(13)
    ops = torch.ops.nvrtc_gather
    for kw in (dict(), dict(rule="plain", dtype=F16, kv_c_offset=1), dict(fmt="fp8", skip_scale=True, dtype=F32),
               dict(fmt="auto", pe_dim=0)):
        c = make_write_case(rng, block_size=16, num_tokens=50, **kw)
        a, b = c.to("cuda"), c.to("cuda")
        ng.concat_and_cache_mla(*a.args())
        ops.concat_and_cache_mla(*b.args())
        torch.cuda.synchronize()
        assert torch.equal(a.cache.bytes().cpu(), b.cache.bytes().cpu()), c.desc
        ng.concat_and_cache_mla(*c.args())
        assert torch.equal(b.cache.bytes().cpu(), c.cache.bytes()), c.desc
    for seq, vec in ((False, 16), (True, 16), (True, 0)):
        c = make_gather_case(rng, lens=ragged(rng, 12, 30), block_size=16, seq_starts=seq, ws0=3,
                             **({} if vec else {"dst_offset": 2}))
        a, b = c.to("cuda"), c.to("cuda")
        ng.cp_gather_and_upconvert_fp8_kv_cache(*a.args())
        ops.cp_gather_and_upconvert_fp8_kv_cache(*b.args())
        torch.cuda.synchronize()
        assert torch.equal(a.dst.store.cpu().view(torch.int16), b.dst.store.cpu().view(torch.int16)), c.desc
        ng.cp_gather_and_upconvert_fp8_kv_cache(*c.args())
        assert torch.equal(b.dst.store.cpu().view(torch.int16), c.dst.store.view(torch.int16)), c.desc


def test_opcheck_on_gpu():
    g = torch.Generator(device="cuda").manual_seed(14)
    kv_c = torch.randn(20, NOPE, device="cuda", generator=g).to(BF16)
    k_pe = torch.randn(20, ROPE, device="cuda", generator=g).to(BF16)
    cache = torch.randint(0, 256, (4, 16, RECORD), dtype=torch.uint8, device="cuda", generator=g)
    slots = torch.randperm(64, device="cuda", generator=g)[:20]
    scale = torch.ones(1, device="cuda")
    torch.library.opcheck(torch.ops.nvrtc_gather.concat_and_cache_mla.default,
                          (kv_c, k_pe, cache, slots, "fp8_ds_mla", scale, False, "pow2"))
    dst = torch.zeros(30, ROW, dtype=BF16, device="cuda")
    bt = torch.randperm(4, device="cuda", generator=g).to(torch.int32).view(2, 2)
    ws = torch.tensor([0, 18, 30], dtype=torch.int32, device="cuda")
    seq = torch.tensor([3, 0], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.nvrtc_gather.cp_gather_and_upconvert_fp8_kv_cache.default,
                          (cache, dst, bt, ws, 2, seq))


def test_no_allocation_and_current_stream():
    rng = random.Random(15)
    w = make_write_case(rng, block_size=64, num_tokens=100).to("cuda")
    assert_no_allocation_on_a_side_stream(lambda: ng.concat_and_cache_mla(*w.args()))
    gc = make_gather_case(rng, lens=ragged(rng, 10, 50), block_size=64, seq_starts=True).to("cuda")
    assert_no_allocation_on_a_side_stream(lambda: ng.cp_gather_and_upconvert_fp8_kv_cache(*gc.args()))
