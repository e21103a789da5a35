"""The chunked-context gather kernel itself (cuda_src/cache_gather.cu) run on the host by the
thread-per-lane emulator (tests/helpers/cuda_host_emu.cpp), with the entry point, grid and
packed struct bytes the op would hand the GPU (plan_for then launch_config): bit-exact against
the independent reference (tests/helpers/cache_gather_reference.py) and the CPU path, over the
whole storage of the destination (padding, rows no request covers and rows past T stay
poisoned).

Covers every conversion (byte copy of 1/2/4-byte entries, e4m3 and e5m2 into bf16 / fp16 /
fp32), both entry points of each (widest, and any alignment: forced, and chosen by genuinely
misaligned tensors), block sizes 1/16/64, ragged requests with empty ones, seq_starts, a first
request starting past row 0, T below cu_seq_lens[-1], several rows per block, 1..4096 requests
(search of one to three levels), entries of other widths and of several dimensions, and bad
indices skipped (reported in debug mode). Arithmetic is the host's IEEE arithmetic with the
kernel's own soft conversions: this checks indexing, struct layout and those conversions, not
the GPU's instructions (tests/gpu/ does). Skipped without a C++20 compiler."""
import itertools
import random

import pytest
import torch

from nvrtc_gather.kernels import cache_gather as spec
from nvrtc_gather.ops import cache_gather
from helpers.cache_gather_reference import SENTINEL, convert_row, make_case, ragged, reference, row_readings
from helpers.host_emu import emu_launch, emulator

H200_SMS = 132
CONVERSIONS = list(spec.CONVERSIONS)
COPY_DTYPES = [torch.uint8, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.int16]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="cache_gather")


def _op_args(case, op):
    return case.cp_args() if op == "cp_gather_cache" else case.dequant_args()


def run_kernel(dll, case, op, rows_per_cta=None, widths=None, err=None, tiny=None):
    """What the op does on a GPU for ``case`` (CPU tensors), with the kernel run by the
    emulator; ``widths``: force that entry point; ``rows_per_cta``: force the tile kernel with
    that many rows per block; ``tiny``: force the tiny kernel (True) or the tile one (False).
    Returns the plan."""
    plan = cache_gather.plan_for(op, *_op_args(case, op))
    rpc = rows_per_cta or spec.rows_per_cta(plan.row_bytes, plan.num_rows, H200_SMS)
    if tiny is None:
        tiny = rows_per_cta is None and spec.use_tiny(plan.row_bytes, plan.num_rows, H200_SMS)
    plan = plan._replace(rows_per_cta=rpc, tiny=tiny,
                         **({} if widths is None else dict(zip(("vec", "svec"), widths))))
    if plan.num_rows and plan.batch:
        cfg = cache_gather.launch_config(plan)
        emu_launch(dll, spec.PARAMS, cfg.entry, cfg.grid, cfg.fields, 0 if err is None else err.data_ptr())
    return plan


def _first_diff(got, want, desc):
    i = int(torch.nonzero(got != want)[0])
    return (f"{int((got != want).sum())} bytes differ, the first at storage byte {i}: {int(got[i]):#x} != "
            f"{int(want[i]):#x}; {desc}")


def check(dll, make, op=None, rows_per_cta=None, widths=None, want_widths=None):
    """Emulated kernel == reference == CPU path, whole destination storage. ``make()`` builds
    the case once for each path. Without a forced rows_per_cta, both kernels run it: the tile
    kernel and the tiny one (one warp per row; the op's choice for small calls, where the
    widest accesses are taken)."""
    case = make()
    op = op or ("cp_gather_cache" if case.conversion == "copy" else "gather_and_maybe_dequant_cache")
    want = reference(case)
    cpu = make()
    getattr(cache_gather, op)(*_op_args(cpu, op))
    assert torch.equal(cpu.dst_store, want), "CPU path: " + _first_diff(cpu.dst_store, want, case.desc)
    for tiny in ((False,) if rows_per_cta else (False, True)):
        case = make()
        plan = run_kernel(dll, case, op, rows_per_cta, widths, tiny=tiny)
        if want_widths is not None:
            assert (plan.vec, plan.svec) == want_widths, case.desc
        assert torch.equal(case.dst_store, want), \
            f"{op} {cache_gather.launch_config(plan).entry} rows_per_cta={plan.rows_per_cta}: " + \
            _first_diff(case.dst_store, want, case.desc)
    return plan


def _maker(seed, **kw):
    return lambda: make_case(random.Random(seed), **kw)


@pytest.mark.parametrize("conversion", CONVERSIONS)
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_every_conversion_and_block_size(emu, conversion, block_size):
    rng = random.Random(f"{conversion}-{block_size}")
    for seq_starts in (False, True):
        lens = ragged(rng, 9, 40)
        lens[3] = 0
        for forced in (None, spec.ANY):
            check(emu, _maker(rng.random(), lens=lens, block_size=block_size, conversion=conversion,
                              seq_starts=seq_starts, extra_rows=5),
                  widths=forced, want_widths=spec.widest(conversion) if forced is None else None)


@pytest.mark.parametrize("conversion", ["copy", "e4m3_bf16", "e5m2_f32"])
def test_misaligned_tensors_take_the_any_entry(emu, conversion):
    """A destination whose rows are 4-byte aligned only, and a cache whose entries are padded
    to 4-byte alignment, run the ANY entry point, with the same bytes."""
    rng = random.Random(f"misaligned-{conversion}")
    src_dtype = torch.bfloat16 if conversion == "copy" else torch.uint8
    check(emu, _maker(rng.random(), lens=[7, 0, 30, 5], conversion=conversion, src_dtype=src_dtype, pad_row=2,
                      seq_starts=True), want_widths=spec.ANY)
    # entries 4-byte aligned only: ANY, unless the widest load is 4 bytes already (fp32 output)
    check(emu, _maker(rng.random(), lens=[7, 0, 30, 5], conversion=conversion, pad_entry=4),
          want_widths=spec.ANY if spec.widest(conversion)[0] > 4 else spec.widest(conversion))


@pytest.mark.parametrize("dtype", COPY_DTYPES)
@pytest.mark.parametrize("entry", [(576,), (656,), (4,), (3, 4, 8), (1, 12)])
def test_copy_of_any_entry_dtype_and_width(emu, dtype, entry):
    rng = random.Random(f"copy-{dtype}-{entry}")
    check(emu, _maker(rng.random(), lens=ragged(rng, 6, 20), entry=entry, src_dtype=dtype, seq_starts=True,
                      extra_rows=3))


@pytest.mark.parametrize("batch", [1, 2, 31, 33, 300, 1025, 4096])
def test_request_counts(emu, batch):
    """Searches of one to three levels, tiles spanning many requests (tiny ones) or one."""
    rng = random.Random(f"batch-{batch}")
    mean = max(1, 2000 // batch)
    for conversion in ("copy", "e4m3_bf16"):
        check(emu, _maker(rng.random(), lens=ragged(rng, batch, mean, 0.3), conversion=conversion, entry=(64,),
                          seq_starts=batch % 2 == 1, extra_rows=2))


@pytest.mark.parametrize("rows_per_cta", [1, 3, 8, 37, 256])
def test_rows_per_block(emu, rows_per_cta):
    rng = random.Random(f"rpc-{rows_per_cta}")
    check(emu, _maker(rng.random(), lens=ragged(rng, 12, 30), conversion="e5m2_f16", seq_starts=True, extra_rows=4),
          rows_per_cta=rows_per_cta)


def test_first_request_after_row_zero_and_t_below_the_total(emu):
    """Rows before cu_seq_lens[0] and rows at or past T stay untouched; the last request is cut
    at T (gather_and_maybe_dequant_cache's num_tokens below dst.size(0) too)."""
    rng = random.Random("start-cut")
    check(emu, _maker(1, lens=[10, 20, 0, 15], start_row=7, cut_rows=9, seq_starts=True))
    check(emu, _maker(2, lens=[10, 20, 0, 15], start_row=3, conversion="e4m3_f16"))
    case = make_case(rng, lens=[10, 20, 15], conversion="e4m3_bf16", extra_rows=6)
    case.num_rows -= 12  # num_tokens below dst.size(0): the rows past it stay poisoned
    want = reference(case)
    run_kernel(emu, case, "gather_and_maybe_dequant_cache")
    assert torch.equal(case.dst_store, want)
    assert bool((case.dst_store.view(-1)[-12 * 1152:] == SENTINEL).all())


def test_bad_indices_are_skipped_and_reported(emu):
    """Block ids outside the cache, columns past max_blocks, negative seq_starts, a negative or
    decreasing cu_seq_lens: those rows are skipped (every other row is right), and debug mode
    reports the first; in both kernels."""
    for what, tiny in itertools.product(("block_id", "column", "seq_start", "cu_negative", "cu_decreasing"),
                                        (False, True)):
        case = make_case(random.Random(f"bad-{what}"), lens=[9, 12, 6, 10], conversion="e4m3_bf16", seq_starts=True,
                         extra_rows=2)
        cu = case.cu_seq_lens
        if what == "block_id":
            case.block_table[1, int(case.seq_starts[1]) // 16] = 10**6  # the first column request 1 reads
        elif what == "column":
            case.block_table = case.block_table[:, :1].contiguous()
        elif what == "seq_start":
            case.seq_starts[2] = -5
        elif what == "cu_negative":
            cu[0] = -4
        else:
            cu[2] = cu[1] - 3
        err = torch.zeros(4, dtype=torch.int64)
        plan = run_kernel(emu, case, "gather_and_maybe_dequant_cache", err=err, tiny=tiny)
        assert int(err[0]) != 0, what
        assert cache_gather.launch_config(plan).entry.endswith("_tiny") == tiny
        # every row holds one reading its (possibly malformed) indices allow, or stays poisoned
        # when they allow none
        dst = case.dst_store[:plan.num_rows * plan.dst_row_stride].view(plan.num_rows, -1)[:, :plan.dst_row_bytes]
        src = case.src_cache.view(torch.uint8)
        scale = float(case.scale)
        skipped = 0
        for row in range(plan.num_rows):
            reads = row_readings(case.block_table, cu.tolist(), case.seq_starts.tolist(), case.batch, plan.num_rows,
                                 16, case.src_cache.shape[0], row)
            got = bytes(dst[row].tolist())
            options = [convert_row(bytes(src[b, t].tolist()), case.conversion, scale) for b, t in reads]
            if not options:
                skipped += 1
                assert got == bytes([SENTINEL]) * plan.dst_row_bytes, (what, row)
            else:
                assert got in options, (what, row)
        assert skipped > 0, what


@pytest.mark.parametrize("start_row", [0, 5, 16])
def test_one_request_without_seq_starts(emu, start_row):
    """One request without seq_starts, its first row at 0 or past it (rows before it untouched),
    in the tile kernel at two rows-per-block choices."""
    for block_size in (1, 16):
        check(emu, _maker(f"one-{start_row}-{block_size}", lens=[70], start_row=start_row, block_size=block_size,
                          extra_rows=3), rows_per_cta=8)
        check(emu, _maker(f"one-{start_row}-{block_size}", lens=[70], start_row=start_row, block_size=block_size,
                          conversion="e5m2_f32"), rows_per_cta=37)


@pytest.mark.parametrize("owner", ["empty", "cut_off"])
def test_seq_starts_of_a_request_without_rows_is_never_read(emu, owner):
    """Issue #36 item 5: a negative seq_starts entry of a request that owns no row (an empty
    one, or one whose rows are all past T) is not read: the CPU path writes what the kernel
    writes and raises nothing, and the kernel in debug mode reports nothing (before: the CPU
    path raised ValueError, debug mode was silent)."""
    lens, cut = ([9, 0, 6, 10], 0) if owner == "empty" else ([9, 12, 6, 10], 14)
    victim = 1 if owner == "empty" else 3

    def make():
        case = make_case(random.Random(f"owner-{owner}"), lens=lens, conversion="e4m3_bf16", seq_starts=True,
                         cut_rows=cut)
        case.seq_starts[victim] = -5
        return case
    check(emu, make)
    for tiny in (False, True):
        err = torch.zeros(4, dtype=torch.int64)
        run_kernel(emu, make(), "gather_and_maybe_dequant_cache", err=err, tiny=tiny)
        assert int(err[0]) == 0, (owner, tiny, err.tolist())
