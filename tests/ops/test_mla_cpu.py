"""concat_and_cache_mla and cp_gather_and_upconvert_fp8_kv_cache on CPU tensors, bit-exact
against the independent per-token reference (tests/helpers/mla_reference.py), comparing the
whole storage of every output (so padding, unwritten entries and rows stay poisoned), over
block sizes, input dtypes, pe_dim 64 / 0, both fp8_ds_mla scale rules, every plain format,
strided and padded layouts and special values; the write -> gather round trip; the
torch.ops.nvrtc_gather.* registrations and torch.compile."""
import random

import numpy as np
import pytest
import torch

import nvrtc_gather as ng
from helpers.mla_reference import (DTYPES, NOPE, RECORD, ROPE, SENTINEL, SPECIAL_TILES, TILE, e4m3_value,
                                   make_gather_case, make_write_case, gather_reference, write_reference)

FP8 = torch.float8_e4m3fn


def check_write(case, op=None):
    """Run the write (``op``: another callable of the same signature) and compare the cache's
    whole storage with the reference's."""
    want = write_reference(case)
    (op or ng.concat_and_cache_mla)(*case.args())
    if not torch.equal(case.store, want):
        i = int(torch.nonzero(case.store != want)[0])
        raise AssertionError(f"{int((case.store != want).sum())} bytes differ, the first at storage byte {i}: "
                             f"got {int(case.store[i]):#x}, want {int(want[i]):#x}; {case.desc}")


def check_gather(case, op=None):
    want = gather_reference(case)
    (op or ng.cp_gather_and_upconvert_fp8_kv_cache)(*case.args())
    if not torch.equal(case.dst_store, want):
        i = int(torch.nonzero(case.dst_store != want)[0])
        raise AssertionError(f"{int((case.dst_store != want).sum())} bytes differ, the first at dst storage byte {i}: "
                             f"got {int(case.dst_store[i]):#x}, want {int(want[i]):#x}; {case.desc}")


# --- fp8_ds_mla writes ------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["pow2", "plain"])
@pytest.mark.parametrize("pe_dim", [64, 0])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_ds_write_matches_reference(bs, dt, pe_dim, rule):
    """Random rows with special tiles, padding slots, random layouts (fused [T, 576] inputs,
    padded entries and blocks, a cache starting off its storage's start, uint8 or fp8 view)."""
    rng = random.Random(f"ds-{bs}-{dt}-{pe_dim}-{rule}")
    for _ in range(3):
        fused = pe_dim and rng.random() < 0.5
        check_write(make_write_case(
            rng, dtype=DTYPES[dt], block_size=bs, num_tokens=rng.randint(1, 40), pe_dim=pe_dim, rule=rule,
            fused=fused, entry_pad=rng.choice([0, 0, 4, 16]), block_pad=rng.choice([0, 0, 8, 32]),
            kv_offset=rng.choice([0, 0, 4, 16]), extra_rows=rng.choice([0, 3]),
            specials=rng.sample(SPECIAL_TILES, 5), fp8_view=rng.random() < 0.5))


@pytest.mark.parametrize("kind", SPECIAL_TILES)
@pytest.mark.parametrize("rule", ["pow2", "plain"])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_ds_special_tiles(kind, rule, dt):
    """Each special tile (zeros, huge, 448 * 2^k, tiny, subnormal, NaN, inf, 336, ties) in
    every tile position of a token, other tiles random."""
    rng = random.Random(f"{kind}-{rule}-{dt}")
    case = make_write_case(rng, dtype=DTYPES[dt], block_size=4, num_tokens=4, num_blocks=1, rule=rule, pad_frac=0)
    from helpers.mla_reference import special_tile
    gen = torch.Generator().manual_seed(3)
    for tok in range(4):
        case.kv_c[tok, tok * TILE:(tok + 1) * TILE] = special_tile(kind, DTYPES[dt], gen).to(DTYPES[dt])
    case.k_pe[1] = special_tile(kind, DTYPES[dt], gen)[:ROPE].to(DTYPES[dt])
    check_write(case)


def test_vllm_pinned_example_scales():
    """vLLM's test: three tiles of 336 and one of zeros give scales [1, 1, 1, 2**-13] under the
    power-of-two rule; 336 at scale 1 is the tie between 320 (0x7a) and 352 (0x7b): the even
    code 0x7a; zeros give code 0."""
    for dt in (torch.bfloat16, torch.float16):
        kv_c = torch.cat((torch.full((1, 3 * TILE), 336.0), torch.zeros(1, TILE)), 1).to(dt)
        k_pe = torch.arange(ROPE, dtype=dt).view(1, ROPE)
        cache = torch.full((1, 1, RECORD), SENTINEL, dtype=torch.uint8)
        ng.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([0]), "fp8_ds_mla", torch.ones(1))
        rec = cache[0, 0]
        assert rec[NOPE:NOPE + 16].view(torch.float32).tolist() == [1.0, 1.0, 1.0, 2.0 ** -13]
        assert bool((rec[:3 * TILE] == 0x7A).all()) and (e4m3_value(0x7A), e4m3_value(0x7B)) == (320.0, 352.0)
        assert bool((rec[3 * TILE:NOPE] == 0).all())
        assert torch.equal(rec[NOPE + 16:].view(torch.bfloat16).float(), torch.arange(ROPE).float())
        cache.fill_(SENTINEL)  # the older rule: 336/448 and FLT_MIN
        ng.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([0]), "fp8_ds_mla", torch.ones(1),
                                ds_scale_rule="plain")
        s = cache[0, 0, NOPE:NOPE + 16].view(torch.float32)
        assert s.tolist()[:3] == [float(np.float32(336) / np.float32(448))] * 3
        assert s[3].item() == np.float32(1.17549435e-38)


def test_fp16_k_pe_is_rounded_to_bf16_and_nan_is_canonical():
    """fp16 k_pe -> the record's bf16: nearest even (ties both ways), overflow of the rounding
    into the next binade, an fp16 subnormal, NaN -> 0x7fff, -inf kept."""
    vals = [1 + 2 ** -10, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -10, 65504.0, -2.0 ** -24, float("nan"),
            float("-inf")]
    k_pe = torch.tensor([vals + [0.0] * (ROPE - len(vals))], dtype=torch.float16)
    cache = torch.full((1, 2, RECORD), SENTINEL, dtype=torch.uint8)
    ng.concat_and_cache_mla(torch.zeros(1, NOPE, dtype=torch.float16), k_pe, cache, torch.tensor([1]), "fp8_ds_mla",
                            torch.ones(1))
    pe = cache[0, 1, NOPE + 16:].view(torch.int16).tolist()[:len(vals)]
    assert [p & 0xFFFF for p in pe] == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x4780, 0xB380, 0x7FFF, 0xFF80]
    assert bool((cache[0, 0] == SENTINEL).all())


def test_pe_dim_0_leaves_the_k_pe_bytes_untouched():
    rng = random.Random(7)
    case = make_write_case(rng, num_tokens=10, pe_dim=0, pad_frac=0)
    check_write(case)
    cache = case.kv_cache.view(torch.uint8)
    written = case.slot_mapping.tolist()
    for s in written:
        assert bool((cache[s // 16, s % 16, NOPE + 16:] == SENTINEL).all())
        assert not bool((cache[s // 16, s % 16, :NOPE + 16] == SENTINEL).all())


# --- plain formats --------------------------------------------------------------------------

PLAIN = ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3"]


@pytest.mark.parametrize("skip_scale", [False, True])
@pytest.mark.parametrize("dt", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("fmt", PLAIN)
def test_plain_formats_match_reference(fmt, dt, skip_scale):
    rng = random.Random(f"{fmt}-{dt}-{skip_scale}")
    for bs in (1, 16, 64):
        rank, pe = rng.choice([(NOPE, ROPE), (NOPE, 0), (100, 7), (32, 64)])
        check_write(make_write_case(
            rng, fmt=fmt, dtype=DTYPES[dt], block_size=bs, num_tokens=rng.randint(1, 30), pe_dim=pe, rank=rank,
            skip_scale=skip_scale, fused=pe and rng.random() < 0.5, entry_pad=rng.choice([0, 0, 3]),
            block_pad=rng.choice([0, 5]), extra_rows=rng.choice([0, 2]),
            specials=rng.sample(SPECIAL_TILES, 3) if rank >= TILE else (), fp8_view=rng.random() < 0.5,
            scale=None if rng.random() < 0.8 else torch.tensor([float("nan") if skip_scale else 0.25, 9.0])))


def test_fp8_plain_skip_scale_never_reads_scale():
    """skip_scale=True divides by 1: a NaN scale (or an empty one) changes nothing."""
    rng = random.Random(11)
    a = make_write_case(rng, fmt="fp8", num_tokens=8, pe_dim=64, skip_scale=True, scale=torch.tensor([1.0]))
    b = a.clone()
    check_write(a)
    b.scale = torch.tensor([float("nan")])
    check_write(b)
    assert torch.equal(a.store, b.store)
    b = a.clone()
    b.scale = torch.empty(0)
    ng.concat_and_cache_mla(*b.args())
    assert torch.equal(a.store, b.store)


def test_fp32_inputs_for_plain_formats():
    rng = random.Random(12)
    for fmt in ("auto", "fp8"):
        check_write(make_write_case(rng, fmt=fmt, dtype=torch.float32, num_tokens=25, block_size=16,
                                    specials=("nan", "inf", "huge", "tiny")))


# --- slots ------------------------------------------------------------------------------------

@pytest.mark.parametrize("slots", [[], [-1], [-1, -5, -(2 ** 62)]])
def test_nothing_to_write_is_a_no_op(slots):
    for fmt, dt in (("fp8_ds_mla", torch.uint8), ("auto", torch.bfloat16), ("fp8", torch.uint8)):
        width = RECORD if fmt == "fp8_ds_mla" else NOPE + ROPE
        cache = torch.full((2, 16, width), 7, dtype=dt)
        before = cache.clone()
        ng.concat_and_cache_mla(torch.randn(4, NOPE, dtype=torch.bfloat16), torch.randn(4, ROPE, dtype=torch.bfloat16),
                                cache, torch.tensor(slots, dtype=torch.int64), fmt, torch.ones(1))
        assert torch.equal(cache, before)


def test_every_slot_of_the_cache_once():
    """Every slot written, in a shuffled order: entries land where s // bs, s % bs say."""
    rng = random.Random(13)
    for bs in (1, 16, 64):
        case = make_write_case(rng, block_size=bs, num_tokens=3 * bs, num_blocks=3, pad_frac=0)
        check_write(case)
        assert sorted(case.slot_mapping.tolist()) == list(range(3 * bs))


# --- the gather -------------------------------------------------------------------------------

@pytest.mark.parametrize("seq", [False, True], ids=["no_seq_starts", "seq_starts"])
@pytest.mark.parametrize("bs", [1, 16, 64])
def test_gather_matches_reference(bs, seq):
    """Ragged requests (some empty), rows before ws[0], trailing requests starting past the
    last row, padded records/blocks/rows, index tensors longer than batch_size."""
    rng = random.Random(f"gather-{bs}-{seq}")
    for batch in (1, 2, 5, 9):
        check_gather(make_gather_case(
            rng, batch=batch, block_size=bs, max_len=rng.choice([3, 40, 150]), seq_starts=seq,
            first_row=rng.choice([0, 0, 5]), tail_past=rng.choice([0, 0, 2]), entry_pad=rng.choice([0, 4, 16]),
            block_pad=rng.choice([0, 12]), dst_pad=rng.choice([0, 0, 2, 8]), src_offset=rng.choice([0, 4, 16]),
            dst_offset=rng.choice([0, 4, 16]), extra_batch_rows=rng.choice([0, 2])))


def test_gather_all_requests_empty_and_batch_0():
    rng = random.Random(21)
    check_gather(make_gather_case(rng, lens=[0, 0, 0], first_row=4))
    c = make_gather_case(rng, lens=[5, 3])
    c.batch = 0
    before = c.dst_store.clone()
    ng.cp_gather_and_upconvert_fp8_kv_cache(*c.args())
    assert torch.equal(c.dst_store, before)


def test_gather_rows_before_the_first_request_are_untouched():
    rng = random.Random(22)
    c = make_gather_case(rng, lens=[10, 0, 7], first_row=9, seq_starts=True)
    check_gather(c)
    assert bool((c.dst[:9].view(torch.uint8) == SENTINEL).all()) and not bool((c.dst[9:].view(torch.uint8) == SENTINEL).all(1).any())


def test_gather_decodes_every_code_and_scale_kind():
    """All 256 codes (NaN codes 0x7f / 0xff included) under scales 1, 2^-13, 2^100, 0, NaN,
    inf, a subnormal and a non-power of two; k_pe bytes copied as they are."""
    scales = [1.0, 2.0 ** -13, 2.0 ** 100, 0.0, float("nan"), float("inf"), 1e-40, 0.7]
    cache = torch.empty(len(scales), 2, RECORD, dtype=torch.uint8)
    for b, s in enumerate(scales):
        for t in range(2):
            cache[b, t, :NOPE] = torch.arange(NOPE) % 256
            cache[b, t, NOPE:NOPE + 16] = torch.tensor([s, -s, s * 3, 1.0], dtype=torch.float32).view(torch.uint8)
            cache[b, t, NOPE + 16:] = torch.randint(0, 256, (128,), generator=torch.Generator().manual_seed(b * 2 + t),
                                                    dtype=torch.uint8)
    from helpers.mla_reference import GatherCase
    n = 2 * len(scales)
    dst_store = torch.full((n * 2 * 576,), SENTINEL, dtype=torch.uint8)
    c = GatherCase(cache, dst_store.view(torch.bfloat16).view(n, 576), torch.arange(len(scales), dtype=torch.int32).view(-1, 1),
                   torch.arange(0, n, 2, dtype=torch.int32), len(scales), None, cache.view(-1), dst_store)
    check_gather(c)


# --- round trip -------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("rule", ["pow2", "plain"])
def test_write_then_gather_round_trip(dt, rule):
    """Tokens written with concat_and_cache_mla into a paged cache, then gathered back by
    request: each gathered row equals the reference upconversion of the written record, k_pe is
    the input's bf16 bits (bf16) or its rounding (fp16), and values are within fp8's precision
    of the inputs (|error| <= 1/16 of |x| plus half a subnormal step of the tile's scale)."""
    rng = random.Random(f"rt-{dt}-{rule}")
    dtype = DTYPES[dt]
    bs, lens = 16, [37, 0, 16, 5]
    total = sum(lens)
    case = make_write_case(rng, dtype=dtype, block_size=bs, num_tokens=total, num_blocks=8, pad_frac=0, rule=rule)
    # request r's token j at slot block_table[r, j // bs] * bs + j % bs, blocks shuffled
    blocks = list(range(8))
    rng.shuffle(blocks)
    bt = torch.zeros(len(lens), 3, dtype=torch.int32)
    slots, it = [], iter(blocks)
    for r, n in enumerate(lens):
        for j in range(-(-n // bs)):
            bt[r, j] = next(it)
        slots += [int(bt[r, j // bs]) * bs + j % bs for j in range(n)]
    case.slot_mapping = torch.tensor(slots, dtype=torch.int64)
    check_write(case)
    from helpers.mla_reference import GatherCase
    ws = torch.tensor([0, 37, 37, 53], dtype=torch.int32)
    dst_store = torch.full((total * 1152,), SENTINEL, dtype=torch.uint8)
    g = GatherCase(case.kv_cache, dst_store.view(torch.bfloat16).view(total, 576), bt, ws, len(lens), None,
                   case.store, dst_store)
    check_gather(g)
    got = g.dst.float()
    x = case.kv_c[:total].float()
    scales = torch.stack([case.kv_cache.view(torch.uint8)[s // bs, s % bs, NOPE:NOPE + 16].view(torch.float32)
                          for s in slots])
    tol = x.abs() / 16 + scales.repeat_interleave(TILE, 1) * 2.0 ** -10 + x.abs() * 2.0 ** -8
    assert bool(((got[:, :NOPE] - x).abs() <= tol).all())
    pe = case.k_pe[:total].to(torch.bfloat16)
    assert torch.equal(g.dst[:, NOPE:].view(torch.int16), pe.view(torch.int16))


# --- registrations ----------------------------------------------------------------------------

def test_torch_ops_give_the_same_bytes():
    rng = random.Random(31)
    for fmt in ("fp8_ds_mla", "auto", "fp8"):
        case = make_write_case(rng, fmt=fmt, num_tokens=20, specials=("nan", "s336"))
        check_write(case, torch.ops.nvrtc_gather.concat_and_cache_mla)
    check_gather(make_gather_case(rng, batch=4, seq_starts=True), torch.ops.nvrtc_gather.cp_gather_and_upconvert_fp8_kv_cache)
    check_gather(make_gather_case(rng, batch=4, seq_starts=False), torch.ops.nvrtc_gather.cp_gather_and_upconvert_fp8_kv_cache)


def test_opcheck():
    rng = random.Random(32)
    w = make_write_case(rng, num_tokens=12, pad_frac=0)
    torch.library.opcheck(torch.ops.nvrtc_gather.concat_and_cache_mla.default, w.args())
    g = make_gather_case(rng, batch=3, seq_starts=True)
    torch.library.opcheck(torch.ops.nvrtc_gather.cp_gather_and_upconvert_fp8_kv_cache.default, g.args())


def test_torch_compile_fullgraph_aot_eager():
    """Both ops inside one compiled function (the plain Python entry points), bytes as eager."""
    torch._dynamo.reset()
    rng = random.Random(33)
    w = make_write_case(rng, num_tokens=16, block_size=16, num_blocks=2, pad_frac=0)
    w.slot_mapping = torch.tensor(rng.sample(range(32), 16), dtype=torch.int64)
    want_cache = write_reference(w)
    bt = torch.tensor([[1, 0]], dtype=torch.int32)
    ws = torch.tensor([0], dtype=torch.int32)
    seq = torch.tensor([3], dtype=torch.int32)

    def step(kv_c, k_pe, cache, slots, scale, dst, bt, ws, seq):
        ng.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", scale)
        ng.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, bt, ws, 1, seq)
        return dst.view(torch.int16).to(torch.int64).sum()

    dst = torch.full((20, 576), 0, dtype=torch.bfloat16)
    dst.view(torch.uint8).fill_(SENTINEL)
    out = torch.compile(step, fullgraph=True, backend="aot_eager")(w.kv_c, w.k_pe, w.kv_cache, w.slot_mapping,
                                                                  w.scale, dst, bt, ws, seq)
    assert torch.equal(w.store, want_cache)
    from helpers.mla_reference import GatherCase
    eager_store = torch.full((20 * 1152,), SENTINEL, dtype=torch.uint8)
    g = GatherCase(w.kv_cache, eager_store.view(torch.bfloat16).view(20, 576), bt, ws, 1, seq, w.store, eager_store)
    check_gather(g)
    assert torch.equal(dst.view(torch.uint8).view(-1), eager_store)
    assert int(out) == int(eager_store.view(torch.int16).to(torch.int64).sum())


def _raises_overlap(fn, *args, match):
    with pytest.raises(Exception) as info:  # dynamo wraps the fake's ValueError in its TorchRuntimeError
        fn(*args)
    assert isinstance(info.value, ValueError) or type(info.value).__name__ == "TorchRuntimeError", info.value
    assert match in str(info.value), str(info.value)[:2000]


def test_compile_refuses_a_gather_output_viewing_the_cache():
    """Under aot_eager the op gets a copy of dst; the fake implementation must see that dst is
    a view of src_cache at trace time, before anything runs."""
    torch._dynamo.reset()
    cache = torch.randint(0, 256, (4, 16, RECORD), dtype=torch.uint8)
    before = cache.clone()
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    ws = torch.tensor([0], dtype=torch.int32)

    def step(cache, bt, ws):
        dst = cache.view(-1)[16 * RECORD * 2: 16 * RECORD * 2 + 10 * 1152].view(torch.bfloat16).view(10, 576)
        ng.cp_gather_and_upconvert_fp8_kv_cache(cache, dst, bt, ws, 1)
        return dst

    _raises_overlap(torch.compile(step, fullgraph=True, backend="aot_eager"), cache, bt, ws,
                    match="dst: its memory overlaps src_cache")
    assert torch.equal(cache, before)


def test_compile_refuses_a_cache_viewing_kv_c():
    torch._dynamo.reset()
    kv_c = torch.randn(40, NOPE, dtype=torch.bfloat16)
    k_pe = torch.randn(40, ROPE, dtype=torch.bfloat16)
    before = kv_c.clone()
    slots = torch.arange(8, dtype=torch.int64)

    def step(kv_c, k_pe, slots):
        cache = kv_c.view(torch.uint8).view(-1)[: 2 * 4 * RECORD].view(2, 4, RECORD)  # inside kv_c's rows
        ng.concat_and_cache_mla(kv_c, k_pe, cache, slots, "fp8_ds_mla", torch.ones(1))
        return cache

    _raises_overlap(torch.compile(step, fullgraph=True, backend="aot_eager"), kv_c, k_pe, slots,
                    match="kv_cache: its memory overlaps kv_c")
    assert torch.equal(kv_c, before)
