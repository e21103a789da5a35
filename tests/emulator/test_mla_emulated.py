"""The MLA kernels themselves (cuda_src/mla_write.cu, cuda_src/mla_gather.cu) run on the host
by the thread-per-lane emulator (tests/helpers/cuda_host_emu.cpp), with the entry point, grid
and packed struct bytes the op would hand the GPU (plan_* then launch_config): bit-exact
against the independent reference (tests/helpers/mla_reference.py) and the CPU path, over
the whole storage of the output (padding and unwritten entries / rows stay poisoned).

Covers both write kernels of fp8_ds_mla (16-byte accesses, and the any-alignment one, forced
and chosen by genuinely misaligned inputs), pe_dim 0, fp16, special tiles, both scale rules,
every plain format; the gather's two kernels with ragged requests, empty ones, seq_starts, rows
before workspace_starts[0], several rows per block and batches whose request search takes
two and three levels; slots past the cache and bad gather indices skipped (reported in debug
mode). Arithmetic is the host's IEEE arithmetic: this checks indexing, reductions, shuffles
and struct layout, not GPU rounding (tests/gpu/ does). Skipped without a C++20 compiler."""
import random

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.kernels import mla_cache as spec
from nvrtc_gather.ops import mla_gather, mla_write
from helpers.host_emu import emu_launch, emulator
from helpers.mla_reference import (DTYPES, NOPE, SENTINEL, SPECIAL_TILES, gather_reference, gather_row_readings,
                                   make_gather_case, make_write_case, record_bytes, upconvert_record,
                                   write_reference)

H200_SMS = 132


@pytest.fixture(scope="module")
def write_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="mla_write")


@pytest.fixture(scope="module")
def gather_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="mla_gather")


def run_write(dll, case, vec=None, err=None):
    """What the op does on a GPU for ``case`` (CPU tensors), with the kernel run by the
    emulator; ``vec``: force that kernel. Returns the plan."""
    plan = mla_write.plan_write(*case.args())
    if vec is not None:
        plan = plan._replace(vec=vec)
    if plan.num_tokens:
        cfg = mla_write.launch_config(plan)
        emu_launch(dll, spec.WRITE_PARAMS, cfg.entry, cfg.grid, cfg.fields, 0 if err is None else err.data_ptr())
    return plan


def run_gather(dll, case, rows_per_cta=None, vec=None, err=None):
    plan = mla_gather.plan_gather(*case.args())
    rpc = rows_per_cta or spec.rows_per_cta(plan.num_rows, H200_SMS)
    plan = plan._replace(rows_per_cta=rpc, **({} if vec is None else {"vec": vec}))
    if plan.num_rows and plan.batch:
        cfg = mla_gather.launch_config(plan)
        emu_launch(dll, spec.GATHER_PARAMS, cfg.entry, cfg.grid, cfg.fields, 0 if err is None else err.data_ptr())
    return plan


def _first_diff(got, want, desc):
    i = int(torch.nonzero(got != want)[0])
    return f"{int((got != want).sum())} bytes differ, the first at storage byte {i}: {int(got[i]):#x} != {int(want[i]):#x}; {desc}"


def check_write(dll, case, vec=None, want_vec=None):
    """Emulated kernel == reference == CPU path, whole storage."""
    want = write_reference(case)
    cpu = case.clone()
    ng.concat_and_cache_mla(*cpu.args())
    assert torch.equal(cpu.store, want), "CPU path: " + _first_diff(cpu.store, want, case.desc)
    plan = run_write(dll, case, vec)
    if want_vec is not None:
        assert plan.vec == want_vec, case.desc
    assert torch.equal(case.store, want), f"kernel {mla_write.launch_config(plan).entry}: " + \
        _first_diff(case.store, want, case.desc)


def check_gather(dll, case, rows_per_cta=None, vec=None, want_vec=None):
    want = gather_reference(case)
    cpu = case.clone()
    ng.cp_gather_and_upconvert_fp8_kv_cache(*cpu.args())
    assert torch.equal(cpu.dst_store, want), "CPU path: " + _first_diff(cpu.dst_store, want, case.desc)
    plan = run_gather(dll, case, rows_per_cta, vec)
    if want_vec is not None:
        assert plan.vec == want_vec, case.desc
    assert torch.equal(case.dst_store, want), f"rows_per_cta={plan.rows_per_cta} vec={plan.vec}: " + \
        _first_diff(case.dst_store, want, case.desc)


# --- the write kernels ------------------------------------------------------------------------

# (how the kernel is reached, the vector width the plan must pick or force)
LAYOUTS = ["v16", "forced_any", "kv_c_misaligned", "cache_misaligned", "k_pe_misaligned"]


def _layout_kwargs(layout):
    return {"v16": {}, "forced_any": {},
            "kv_c_misaligned": {"input_offset": 1},          # 2 bytes off: both inputs misaligned
            "cache_misaligned": {"kv_offset": 4},             # 4-byte aligned only
            "k_pe_misaligned": {"fused": True, "entry_pad": 4}}.get(layout)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rule", ["pow2", "plain"])
@pytest.mark.parametrize("pe_dim", [64, 0])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_ds_write_kernels(write_emu, dt, pe_dim, rule, layout):
    rng = random.Random(f"emu-ds-{dt}-{pe_dim}-{rule}-{layout}")
    kw = dict(_layout_kwargs(layout))
    if layout == "k_pe_misaligned" and not pe_dim:
        kw = {"entry_pad": 4}
    for bs, tokens in ((16, 21), (1, 9), (64, 12)):
        case = make_write_case(rng, dtype=DTYPES[dt], block_size=bs, num_tokens=tokens, pe_dim=pe_dim, rule=rule,
                               specials=rng.sample(SPECIAL_TILES, 6), extra_rows=2, **kw)
        want_vec = 16 if layout == "v16" else 0
        check_write(write_emu, case, vec=0 if layout == "forced_any" else None,
                    want_vec=None if layout == "forced_any" else want_vec)


@pytest.mark.parametrize("rule", ["pow2", "plain"])
@pytest.mark.parametrize("dt", ["bf16", "f16"])
@pytest.mark.parametrize("vec", [16, 0])
def test_ds_write_every_special_tile(write_emu, vec, dt, rule):
    """Every SPECIAL_TILES kind (zeros, huge, 448 * 2^k, tiny, subnormal, NaN, all-NaN, inf,
    336, ties, 448) in each of the 4 tile positions, k_pe special too, and the contract's
    [1, 1, 1, 2^-13] example in token 0."""
    from helpers.mla_reference import special_tile
    rng = random.Random(f"emu-special-{vec}-{dt}-{rule}")
    gen = torch.Generator().manual_seed(5)
    n = len(SPECIAL_TILES)
    case = make_write_case(rng, dtype=DTYPES[dt], block_size=16, num_tokens=n, num_blocks=2, pad_frac=0, rule=rule)
    for i, kind in enumerate(SPECIAL_TILES):
        for tile in range(4):
            if (i + tile) % 2 == 0:
                case.kv_c[i, tile * 128:(tile + 1) * 128] = special_tile(kind, DTYPES[dt], gen).to(DTYPES[dt])
        case.k_pe[i] = special_tile(kind, DTYPES[dt], gen)[:64].to(DTYPES[dt])
    case.kv_c[0, :384], case.kv_c[0, 384:] = 336.0, 0.0
    check_write(write_emu, case, vec=vec)
    if rule == "pow2":
        s = case.slot_mapping[0].item()
        rec = case.kv_cache[s // 16, s % 16]
        assert rec[NOPE:NOPE + 16].view(torch.float32).tolist() == [1.0, 1.0, 1.0, 2.0 ** -13]


@pytest.mark.parametrize("skip_scale", [False, True])
@pytest.mark.parametrize("fmt", ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3"])
@pytest.mark.parametrize("dt", ["bf16", "f16", "f32"])
def test_plain_write_kernels(write_emu, dt, fmt, skip_scale):
    rng = random.Random(f"emu-plain-{dt}-{fmt}-{skip_scale}")
    for bs, (rank, pe) in ((16, (512, 64)), (1, (100, 7)), (64, (512, 0)), (3, (33, 64))):
        case = make_write_case(rng, fmt=fmt, dtype=DTYPES[dt], block_size=bs, num_tokens=rng.randint(1, 20),
                               rank=rank, pe_dim=pe, skip_scale=skip_scale, fused=bool(pe) and rng.random() < 0.5,
                               entry_pad=rng.choice([0, 1]), block_pad=rng.choice([0, 3]),
                               input_offset=rng.choice([0, 1]), extra_rows=1,
                               specials=rng.sample(SPECIAL_TILES, 3) if rank >= 128 else ())
        check_write(write_emu, case)


@pytest.mark.parametrize("fmt,vec", [("fp8_ds_mla", 16), ("fp8_ds_mla", 0), ("auto", 0), ("fp8", 0)])
def test_slots_past_the_cache_are_skipped_and_reported(write_emu, fmt, vec):
    """CUDA skips a slot >= num_blocks * block_size (the CPU path raises instead); debug mode
    records (7, token, slot, num_slots)."""
    rng = random.Random(f"emu-past-{fmt}-{vec}")
    case = make_write_case(rng, fmt=fmt, block_size=16, num_tokens=20, num_blocks=2, pad_frac=0.1)
    want_case = case.clone()
    want = write_reference(want_case)
    bad = {3: 32, 11: 2 ** 40, 17: 2 ** 63 - 1}
    for i, s in bad.items():
        case.slot_mapping[i] = s
    want_case.slot_mapping = case.slot_mapping.clone()
    for i in bad:
        want_case.slot_mapping[i] = -1
    want = write_reference(want_case)
    err = torch.zeros(4, dtype=torch.int64)
    run_write(write_emu, case, vec=vec if fmt == "fp8_ds_mla" else None, err=err)
    assert torch.equal(case.store, want), _first_diff(case.store, want, case.desc)
    code, token, slot, num_slots = err.tolist()
    assert code == 7 and bad.get(token) == slot and num_slots == 32, err


def test_many_tokens_many_blocks(write_emu):
    """More tokens than one block's 8 warps, every slot of a 5-block cache, both kernels."""
    rng = random.Random(41)
    for vec in (16, 0):
        case = make_write_case(rng, block_size=16, num_tokens=80, num_blocks=5, pad_frac=0)
        check_write(write_emu, case, vec=vec)


# --- the gather kernels -----------------------------------------------------------------------

@pytest.mark.parametrize("rpc", [None, 8, 16, 64])
@pytest.mark.parametrize("seq", [False, True], ids=["no_seq_starts", "seq_starts"])
@pytest.mark.parametrize("vec", [16, 0])
def test_gather_kernels(gather_emu, vec, seq, rpc):
    rng = random.Random(f"emu-gather-{vec}-{seq}-{rpc}")
    for bs, batch, max_len in ((16, 5, 40), (1, 3, 9), (64, 4, 100)):
        case = make_gather_case(rng, batch=batch, block_size=bs, max_len=max_len, seq_starts=seq,
                                first_row=rng.choice([0, 3, 17]), tail_past=rng.choice([0, 2]),
                                entry_pad=rng.choice([0, 16]), block_pad=rng.choice([0, 32]),
                                dst_pad=rng.choice([0, 8]), extra_batch_rows=rng.choice([0, 2]))
        check_gather(gather_emu, case, rpc, vec=0 if vec == 0 else None, want_vec=16 if vec == 16 else None)


@pytest.mark.parametrize("src_offset,dst_offset,entry_pad,dst_pad", [(4, 0, 0, 0), (0, 4, 0, 0), (0, 0, 4, 0),
                                                                     (0, 0, 0, 2), (8, 12, 20, 6)])
def test_gather_misaligned_layouts_pick_the_4_byte_kernel(gather_emu, src_offset, dst_offset, entry_pad, dst_pad):
    rng = random.Random(f"emu-mis-{src_offset}-{dst_offset}-{entry_pad}-{dst_pad}")
    case = make_gather_case(rng, batch=6, block_size=16, max_len=50, src_offset=src_offset, dst_offset=dst_offset,
                            entry_pad=entry_pad, dst_pad=dst_pad, first_row=2)
    check_gather(gather_emu, case, 16, want_vec=0)


@pytest.mark.parametrize("batch", [33, 1100])
@pytest.mark.parametrize("vec", [16, 0])
def test_gather_multi_level_request_search(gather_emu, batch, vec):
    """33 requests: two levels of the 32-ary search; 1100: three. Short requests, many empty,
    rows spread over many blocks of rows."""
    rng = random.Random(f"emu-search-{batch}-{vec}")
    lens = [0 if rng.random() < 0.3 else rng.randint(1, 3) for _ in range(batch)]
    case = make_gather_case(rng, lens=lens, block_size=2, seq_starts=True, first_row=5, records=False)
    for rpc in (8, 64):
        check_gather(gather_emu, case.clone(), rpc, vec=vec)


def test_gather_rows_before_the_first_request_are_untouched(gather_emu):
    rng = random.Random(51)
    for rpc in (8, 64):
        case = make_gather_case(rng, lens=[0, 10, 0, 30], first_row=70, seq_starts=True)
        check_gather(gather_emu, case, rpc)
        assert bool((case.dst[:70].view(torch.uint8) == SENTINEL).all())


# Bad indices (the CPU path raises on each): rows whose indices are bad are skipped, the others
# written; debug mode reports the code. (what, how to break a case, the code)
def _break(case, what):
    ws, bt = case.workspace_starts, case.block_table
    if what == "ws_negative":
        ws[0] = -4          # request 0's rows: none (negative start)
    elif what == "ws_decreasing":
        ws[2] = ws[1] - 1
    elif what == "seq_negative":
        case.seq_starts[1] = -2
    elif what == "block_column":
        case.seq_starts[3] = 10 ** 6
    else:  # block_id
        bt[2, int(case.seq_starts[2]) // 16] = 10 ** 6


BAD = {"ws_negative": 8, "ws_decreasing": 8, "seq_negative": 9, "block_column": 2, "block_id": 3}


@pytest.mark.parametrize("vec", [16, 0])
@pytest.mark.parametrize("what", list(BAD))
def test_gather_bad_indices_are_skipped_and_reported(gather_emu, what, vec):
    """One bad index (the CPU path raises, writing nothing): the kernel writes each row with
    the one reading its indices allow (with out-of-order starts: one of those they allow) or
    leaves it untouched when they allow none, and debug mode reports the fault's code."""
    rng = random.Random(f"emu-bad-{what}")
    case = make_gather_case(rng, lens=[9, 12, 20, 7, 5], block_size=16, seq_starts=True, first_row=0)
    _break(case, what)
    cpu = case.clone()
    with pytest.raises(ValueError):
        ng.cp_gather_and_upconvert_fp8_kv_cache(*cpu.args())
    assert torch.equal(cpu.dst_store, case.dst_store), "the CPU path wrote before raising"
    before = case.dst_store.clone()
    err = torch.zeros(4, dtype=torch.int64)
    run_gather(gather_emu, case, 16, vec=vec, err=err)
    assert int(err[0]) == BAD[what], err
    ws, seq = case.workspace_starts.tolist(), case.seq_starts.tolist()
    monotone = all(0 <= a <= b for a, b in zip(ws, ws[1:5])) and ws[0] >= 0
    n = case.dst.shape[0]
    skipped = 0
    for t in range(n):
        got, old = case.dst_store[t * 1152:(t + 1) * 1152], before[t * 1152:(t + 1) * 1152]
        rows = [torch.frombuffer(bytearray(upconvert_record(record_bytes(case.src_cache, b, e))), dtype=torch.uint8)
                for b, e in gather_row_readings(case.src_cache, case.block_table, ws, seq, 5, n, t)]
        if monotone:
            assert torch.equal(got, rows[0]) if rows else torch.equal(got, old), f"row {t}: {case.desc}"
        else:
            assert torch.equal(got, old) or any(torch.equal(got, w) for w in rows), f"row {t}: {case.desc}"
        skipped += torch.equal(got, old)
    assert skipped or what == "ws_decreasing", "the fault skipped no row"  # (a start one lower: every row owned)
