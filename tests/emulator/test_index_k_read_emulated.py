"""cuda_src/index_k_read.cu (SGLang's index-K read in one launch) on CPU threads under the host
emulator: every output byte against a row-by-row reference of SGLang's meaning (outputs
poisoned first, as torch.empty leaves them), across lengths and page-table dtypes, strides,
chunks of the lengths' scan, tile sizes and row counts; then hostile index values inside an
arena of guard bytes (no load outside the tensors, no stray byte, bad rows zero, debug mode
reports)."""
import random

import pytest
import torch

from helpers.host_emu import emu_launch, emulator
from helpers.index_fuzz import Arena, Launch, first_difference, launch_problem, pack, run_isolated, span
from nvrtc_gather.kernels import index_k_read as spec
from nvrtc_gather.ops import index_k_read as op

I32_MAX, I64_MAX = 2**31 - 1, 2**63 - 1
POISON = 0xA7


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="index_k_read")


def reference(buf, lens, pages, num_rows, page_size, hd, nq):
    """(k, scale) bytes of SGLang's read, row by row: a length outside [0, int32] counts as 0; a
    row whose page column or page id is out of range is zero; rows past the lengths' sum zero."""
    num_pages = buf.size(0)
    k = torch.zeros(num_rows, hd, dtype=torch.uint8)
    s = torch.zeros(num_rows, 4 * nq, dtype=torch.uint8)
    row = 0
    for r, n in enumerate(lens):
        n = n if 0 <= n <= I32_MAX else 0
        for pos in range(min(n, num_rows - row)):
            j = pos // page_size
            if j < len(pages[r]) and 0 <= pages[r][j] < num_pages:
                page, t = buf[pages[r][j]], pos % page_size
                k[row] = page[t * hd:(t + 1) * hd]
                s[row] = page[page_size * hd + 4 * nq * t: page_size * hd + 4 * nq * (t + 1)]
            row += 1
    return k, s


def call_fields(plan, kv_p, k_p, s_p, sl_p, pt_p, num_rows, tpc):
    return dict(plan.fields, kv_cache=kv_p, dst_k=k_p, dst_scale=s_p, seq_lens=sl_p, page_table=pt_p,
                num_rows=num_rows, tokens_per_cta=tpc)


def random_case(rng: random.Random, tiny: bool = False, fixed: bool = False):
    """A random call; ``fixed``: of spec.FIXED_LAYOUT (the entries built with its sizes as constants)."""
    ps = rng.choice([1, 3, 16, 64])
    hd = rng.choice([128, 128, 64, 32])
    nq = rng.choice([q for q in (1, 2) if hd % (q * 4) == 0])
    if fixed:
        ps, hd, nq = spec.FIXED_LAYOUT
    # 256, 257: one chunk of 256 lengths and one request past it; 300, 520, 1300: two to six chunks.
    # The tiny entry scans 32 lengths a step (520 is 17 steps): 1300 there took 95 s under the emulator.
    batch = rng.choice([0, 1, 2, 5, 40, 256, 257, 300, 520, 1300])
    mean = rng.choice([1, 3]) if batch > 520 else rng.choice([1, 5, 30]) if batch > 40 else rng.choice([1, 20, 130])
    batch = min(batch, 520) if tiny else batch
    lens = [0 if rng.random() < 0.15 else rng.randint(1, 2 * mean) for _ in range(batch)]
    max_pages = max([-(-n // ps) for n in lens] + [1]) + rng.choice([0, 2])
    num_pages = rng.randint(max(1, max_pages // 2), max_pages + 4)
    pages = [[rng.randrange(num_pages) for _ in range(max_pages)] for _ in range(batch)]
    total = sum(lens)
    num_rows = total + rng.choice([0, 0, 3, 70])  # SGLang's seq_len_sum may exceed the sum
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    stride = hd + 4 * nq
    buf = torch.randint(0, 256, (num_pages, ps * stride), dtype=torch.uint8, generator=gen)
    lt, pt = rng.choice([torch.int32, torch.int64]), rng.choice([torch.int32, torch.int64])
    seq = torch.tensor(lens, dtype=lt)
    if rng.random() < 0.3:  # a strided lengths tensor
        seq = torch.stack([seq, seq]).t()[:, 0]
    table = torch.tensor(pages, dtype=pt).view(batch, max_pages)
    if rng.random() < 0.4:  # column-major: SGLang's page table is a view of a larger one at times
        table = table.t().contiguous().t()
    return buf, seq, table, num_rows, ps, hd, nq, lens, pages


def counted_max(lens) -> int:
    """The longest length as the kernel counts it (a bad value counts as 0)."""
    return max([n for n in lens if 0 <= n <= I32_MAX] + [0])


def blocks(shape: str, num_rows: int, tpc: int, lens, max_len: int) -> int:
    """The grid of ``shape``: a block per tpc rows, or (request-major) a block per tile of
    ``max_len`` (the engine's max_seq_len) for each request."""
    return spec.grid_by_request(len(lens), max_len, tpc) if shape in spec.BY_REQUEST else spec.grid(num_rows, tpc)


def engine_max(lens, table, ps: int) -> int:
    """The max_seq_len an engine passes: the longest length, as far as the host's check lets it
    (at most the page table's max_pages * page_size)."""
    return min(counted_max(lens), table.size(1) * ps)


def run(dll, buf, seq, table, num_rows, ps, hd, nq, tpc=None, err_ptr=0, shape="", max_len=None):
    plan = op.plan_read(buf, seq, table, ps, hd, nq and hd // nq)
    k = torch.full((num_rows, hd), POISON, dtype=torch.uint8)
    s = torch.full((num_rows, 4 * nq), POISON, dtype=torch.uint8)
    if num_rows:
        vec = spec.vector_width(buf.data_ptr() | k.data_ptr() | plan.page_stride | hd)
        if tpc is None:
            tpc, shape = spec.shape_for(hd, num_rows, 132)
        if shape == "tiny":
            tpc = 8  # a warp a row
        entry = spec.entry_name(vec, *plan.entry_types, shape, op.fixed_layout(plan))
        max_len = engine_max(seq.tolist(), table, ps) if max_len is None else max_len
        emu_launch(dll, spec.PARAMS, entry, blocks(shape, num_rows, tpc, seq.tolist(), max_len),
                   call_fields(plan, buf.data_ptr(), k.data_ptr(), s.data_ptr(), seq.data_ptr(), table.data_ptr(),
                               num_rows, tpc), err_ptr)
    return k, s


# every shape's entry of any layout, and of the fixed one (its constant-size builds, "req_wide" its own)
_SHAPE_CASES = [(s, False) for s in spec.SHAPES] + [(s, True) for s in spec.SHAPES + ("req_wide",)]


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("shape, fixed", _SHAPE_CASES, ids=[f"{s or 'tile'}-{'fixed' if f else 'any'}"
                                                             for s, f in _SHAPE_CASES])
def test_emulated_read_matches_the_reference(emu, seed, shape, fixed):
    """Random calls, and calls of spec.FIXED_LAYOUT ("fixed": its constant-size entries, as the host
    launches them for it), on each shape's entry."""
    rng = random.Random(seed)
    buf, seq, table, num_rows, ps, hd, nq, lens, pages = random_case(rng, tiny=shape == "tiny", fixed=fixed)
    tpc = rng.choice([8, 37, 128, 256]) if shape != "tiny" else 8
    # request-major: a grid for the longest request, one too small (the blocks loop), one too large
    longest = engine_max(lens, table, ps)
    max_len = rng.choice([longest, longest, longest // 3, 0, longest + 300]) if shape in spec.BY_REQUEST else None
    k, s = run(emu, buf, seq, table, num_rows, ps, hd, nq, tpc, shape=shape, max_len=max_len)
    want_k, want_s = reference(buf, lens, pages, num_rows, ps, hd, nq)
    desc = (f"{shape or 'tile'} seed {seed}: batch {len(lens)} rows {num_rows} page {ps} hd {hd} nq {nq} tpc {tpc} "
            f"max_len {max_len} {seq.dtype} {table.dtype}")
    assert torch.equal(k, want_k), desc
    assert torch.equal(s, want_s), desc


def test_the_cpu_path_gives_the_kernels_bytes(emu):
    """get_index_k_scale_buffer on CPU tensors (prefix sums in torch, the gather's CPU path)
    and the kernel agree, spare rows included."""
    for seed in range(6):
        rng = random.Random(100 + seed)
        buf, seq, table, num_rows, ps, hd, nq, lens, pages = random_case(rng)
        if any(p >= buf.size(0) for r, n in enumerate(lens) for p in pages[r][:-(-n // ps)]):
            continue
        want = run(emu, buf, seq, table, num_rows, ps, hd, nq)
        got = op.read_index_k(buf, seq, table, num_rows, 0, ps, hd, hd // nq)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), seed


def test_a_row_count_below_the_lengths_sum_writes_only_its_rows(emu):
    rng = random.Random(7)
    buf = torch.randint(0, 256, (6, 16 * 132), dtype=torch.uint8)
    seq, table = torch.tensor([20, 30]), torch.tensor([[1, 2], [3, 4]])
    k, s = run(emu, buf, seq, table, 25, 16, 128, 1)
    want_k, want_s = reference(buf, [20, 30], [[1, 2], [3, 4]], 25, 16, 128, 1)
    assert torch.equal(k, want_k) and torch.equal(s, want_s)
    for shape in spec.SHAPES:
        err = torch.zeros(4, dtype=torch.int64)
        k, s = run(emu, buf, seq, table, 25, 16, 128, 1, tpc=8, err_ptr=err.data_ptr(), shape=shape)
        assert err.tolist() == [12, 50, 25, 0], shape  # NG_ERR_LENGTH_SUM: the lengths sum to 50 > 25 rows
        assert torch.equal(k, want_k) and torch.equal(s, want_s), shape
    del rng


@pytest.mark.parametrize("lens", [
    [5, I32_MAX, I32_MAX, I32_MAX, 7, 3],  # later sums wrap past 2^32 and land below the row count
    [3, 0, I32_MAX - 2, I32_MAX, 2, 9],
    [I32_MAX, I32_MAX, 1, 1],              # every row in the first request
    [2, 3, 0, 2**31, 4, I32_MAX],          # a length past int32 counts as 0
])
@pytest.mark.parametrize("lt", [torch.int32, torch.int64])
def test_small_calls_with_lengths_whose_sums_wrap(emu, lens, lt):
    """Lengths at and near INT32_MAX after short ones, whose running sums pass 2^31 and 2^32 within
    one chunk: each row still goes to its own request (a sum that wrapped instead of saturating
    would let a later request claim it), rows past the sum are zero; every shape against the
    reference, 40 rows from 4-page requests."""
    if lt == torch.int32 and any(n > I32_MAX for n in lens):
        lens = [n if n <= I32_MAX else -n % 2**31 for n in lens]
    ps, hd, nq, num_rows = 16, 128, 1, 40
    pages = [[(4 * r + j) % 11 for j in range(4)] for r in range(len(lens))]
    buf = torch.randint(0, 256, (11, ps * 132), dtype=torch.uint8, generator=torch.Generator().manual_seed(len(lens)))
    seq, table = torch.tensor(lens, dtype=lt), torch.tensor(pages, dtype=torch.int32)
    want_k, want_s = reference(buf, lens, pages, num_rows, ps, hd, nq)
    for shape in spec.SHAPES:
        k, s = run(emu, buf, seq, table, num_rows, ps, hd, nq, tpc=8, shape=shape)
        assert torch.equal(k, want_k) and torch.equal(s, want_s), (lens, shape)


@pytest.mark.parametrize("shape", spec.SHAPES)
@pytest.mark.parametrize("bad, code", [
    (dict(lens=[5, -3, 4]), 11), (dict(lens=[5, 2**31, 4]), 11), (dict(pages=[[0], [9], [1]]), 14),
    (dict(pages=[[0], [-1], [1]]), 14), (dict(lens=[5, 17, 4]), 13),
])
def test_debug_mode_reports_bad_values_and_their_rows_are_zero(emu, bad, code, shape):
    lens, pages = bad.get("lens", [5, 3, 4]), bad.get("pages", [[0], [2], [1]])
    buf = torch.randint(0, 256, (3, 16 * 132), dtype=torch.uint8)
    seq, table = torch.tensor(lens, dtype=torch.int64), torch.tensor(pages, dtype=torch.int64)
    err = torch.zeros(4, dtype=torch.int64)
    k, s = run(emu, buf, seq, table, 30, 16, 128, 1, tpc=8 if shape == "tiny" else 16, err_ptr=err.data_ptr(),
               shape=shape)
    assert err[0] == code
    want_k, want_s = reference(buf, lens, pages, 30, 16, 128, 1)
    assert torch.equal(k, want_k) and torch.equal(s, want_s)


# --- index fuzz: hostile values inside guard bytes -------------------------------------------------

def arena_case(lens, pages, lt, pt, num_pages: int, ps: int, num_rows: int, desc: str, hd: int = 128, nq: int = 1,
               **extra) -> dict:
    """A call's tensors in one arena of guard bytes: the buffer (random bytes), the lengths and the
    page table as the given dtypes, the outputs and the debug error buffer."""
    batch, max_pages = len(lens), len(pages[0]) if pages else 1
    a = Arena()
    stride = hd + 4 * nq
    bb = a.alloc(num_pages * ps * stride)
    bb.copy_(torch.randint(0, 256, bb.shape, dtype=torch.uint8))
    sl = a.alloc(batch * lt.itemsize).view(lt)
    sl.copy_(torch.tensor(lens, dtype=lt))
    tb = a.alloc(batch * max_pages * pt.itemsize).view(pt).view(batch, max_pages)
    tb.copy_(torch.tensor(pages, dtype=pt))
    k = a.alloc(num_rows * hd).view(num_rows, hd)
    s = a.alloc(num_rows * 4 * nq).view(num_rows, 4 * nq)
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    return dict(arena=a, buf=bb.view(num_pages, ps * stride), sl=sl, tb=tb, k=k, s=s, err=err, lens=lens,
                pages=pages, num_rows=num_rows, ps=ps, hd=hd, nq=nq, desc=f"{desc} {lt} {pt} rows {num_rows}", **extra)


def fuzz_case(seed: int):
    rng = random.Random(f"index-k-read-{seed}")
    ps = rng.choice([1, 16, 64])
    batch = rng.choice([1, 3, 40, 270])
    num_pages, max_pages = rng.randint(1, 4), rng.randint(1, 3)
    lt, pt = rng.choice([torch.int32, torch.int64]), rng.choice([torch.int32, torch.int64])
    lim = I32_MAX if lt == torch.int32 else I64_MAX
    pool_l = [-lim - 1, -1, 0, 1, 2, ps, ps + 1, max_pages * ps, max_pages * ps + 1, 2**31 - 1, lim, 7]
    lens = [rng.choice(pool_l) if rng.random() < 0.3 else rng.randint(0, 3) for _ in range(batch)]
    plim = I32_MAX if pt == torch.int32 else I64_MAX
    pool_p = [-plim - 1, -1, num_pages, num_pages + 1, 2**31 - 1, plim, 2**32 + 1 if pt == torch.int64 else 3]
    pages = [[rng.choice(pool_p) if rng.random() < 0.3 else rng.randrange(num_pages) for _ in range(max_pages)]
             for _ in range(batch)]
    return arena_case(lens, pages, lt, pt, num_pages, ps, rng.randint(1, 600),
                      f"seed {seed}: batch {batch} lens {lens[:20]} pages {pages[:10]}")


def run_in_arenas(emu, cases, shape: str, debug: bool, tpc_of) -> None:
    """Launch each case (``tpc_of(case)`` rows a block) in its own process and check its whole
    arena: every output byte as the reference has it, every other byte as it was (no stray write),
    no load outside the buffer, lengths and page table; in debug mode a bad length or a row count
    below the lengths' sum reported, else no error."""
    launches = []
    for c in cases:
        plan = op.plan_read(c["buf"], c["sl"], c["tb"], c["ps"], c["hd"], c["hd"] // c["nq"])
        fields = call_fields(plan, c["buf"].data_ptr(), c["k"].data_ptr(), c["s"].data_ptr(), c["sl"].data_ptr(),
                             c["tb"].data_ptr(), c["num_rows"], tpc_of(c))
        c["before"] = c["arena"].bytes.clone()
        vec = spec.vector_width(c["buf"].data_ptr() | c["k"].data_ptr() | plan.page_stride | c["hd"])
        launches.append(Launch(spec.entry_name(vec, *plan.entry_types, shape, op.fixed_layout(plan)),
                               blocks(shape, c["num_rows"], tpc_of(c), c["lens"],
                                      c.get("max_len", engine_max(c["lens"], c["tb"], c["ps"]))),
                               pack(spec.PARAMS, fields, c["err"].data_ptr() if debug else 0),
                               [span(c["buf"]), span(c["sl"]), span(c["tb"])]))
    for c, outcome in zip(cases, run_isolated(emu, launches)):
        problem = launch_problem(*outcome)
        assert problem is None, f"{problem}: {c['desc']}"
        expected = c["before"].clone()
        want_k, want_s = reference(c["buf"], c["lens"], c["pages"], c["num_rows"], c["ps"], c["hd"], c["nq"])
        arena0 = c["arena"].bytes.data_ptr()
        for name, want in (("k", want_k), ("s", want_s)):
            lo = c[name].data_ptr() - arena0
            expected[lo: lo + want.numel()] = want.view(-1)
        code = int(c["err"][0])
        if debug:
            lo = c["err"].data_ptr() - arena0
            expected[lo: lo + 32] = c["err"].view(torch.uint8)
            bad_len = any(not 0 <= n <= I32_MAX for n in c["lens"])
            short = sum(n for n in c["lens"] if 0 <= n <= I32_MAX) > c["num_rows"]
            if bad_len or short:
                assert code in (11, 12, 13, 14), c["desc"]
        else:
            assert code == 0
        regions = {n: (span(c[n])[0] - arena0, span(c[n])[1] - arena0) for n in ("buf", "sl", "tb", "k", "s", "err")}
        got = c["arena"].bytes
        assert torch.equal(got, expected), f"{first_difference(got, expected, regions)}: {c['desc']}"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() to isolate the launches")
@pytest.mark.parametrize("shape", spec.SHAPES)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_index_k_read_index_fuzz(emu, debug, shape):
    run_in_arenas(emu, [fuzz_case(seed) for seed in range(40)], shape, debug,
                  lambda c: 8 if shape == "tiny" else spec.shape_for(c["hd"], c["num_rows"], 4)[0])


def far_case(seed: int):
    """A batch of 600-9,000 requests, mostly empty, a few short requests spread over it (the scan's
    later chunks) and hostile lengths (negative, past int32, int32's max) among them."""
    rng = random.Random(f"index-k-read-far-{seed}")
    ps = rng.choice([1, 16, 64])
    batch = rng.choice([600, 4400, 4700, 9000])
    lt, pt = rng.choice([torch.int32, torch.int64]), rng.choice([torch.int32, torch.int64])
    lens = [0] * batch
    for r in rng.sample(range(batch), 40):
        lens[r] = rng.randint(1, 6)
    # int64: also values whose low word is a small length (2^32 + 3, -2^32 + 2): the high word counts
    bad = [-1, -2**31] + ([2**31, 2**40, -2**40, 2**32 + 3, -2**32 + 2] if lt == torch.int64 else [])
    for r in rng.sample(range(batch), 6):
        lens[r] = rng.choice(bad + [2**31 - 1] if rng.random() < 0.2 else bad)
    num_pages = rng.randint(2, 4)
    pages = [[rng.randrange(num_pages)] for _ in range(batch)]  # one column: the arena holds 9,000 int64s of each
    num_rows = sum(n for n in lens if 0 <= n <= I32_MAX and n < 100) + rng.choice([0, 5])
    return arena_case(lens, pages, lt, pt, num_pages, ps, num_rows,
                      f"seed {seed}: batch {batch} page {ps} lens {[(r, n) for r, n in enumerate(lens) if n]}",
                      tpc=rng.choice([8, 37, 128]))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() to isolate the launches")
@pytest.mark.parametrize("shape", ["", "wide"])
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_blocks_far_into_a_large_batch_find_their_rows(emu, debug, shape):
    """Blocks whose rows lie far into a batch of many chunks (the scan's later chunks, up to 35),
    which skip ahead 16 chunks a pass (8 with int64 lengths; skip_chunks): every byte as the
    reference has it, hostile lengths counted as 0 (an int64 length whose low
    word alone is a valid length too), nothing read or written outside the tensors; debug mode
    reports (every case has a bad length)."""
    run_in_arenas(emu, [far_case(seed) for seed in range(8)], shape, debug, lambda c: c["tpc"])


def one_request_case(seed: int):
    """One request (the tile entries' scan-free path outside debug mode): a length from a hostile
    pool (negative, past int32, an int64 whose low word alone is a valid length, one past the
    page table's columns), page ids from a hostile pool, more rows than the length at times."""
    rng = random.Random(f"index-k-read-one-{seed}")
    ps = rng.choice([1, 3, 16, 64])
    lt, pt = rng.choice([torch.int32, torch.int64]), rng.choice([torch.int32, torch.int64])
    max_pages, num_pages = rng.randint(1, min(40, 768 // ps)), rng.randint(1, 8)  # within the arena
    good = rng.randint(0, max_pages * ps)
    bad = [-1, -2**31, max_pages * ps + 1, 2**31 - 1] + ([2**32 + 3, -2**32 + 2, 2**40] if lt == torch.int64 else [])
    length = rng.choice(bad) if rng.random() < 0.3 else good
    plim = I32_MAX if pt == torch.int32 else I64_MAX
    pool_p = [-plim - 1, -1, num_pages, 2**31 - 1, plim] + ([2**32 + 1] if pt == torch.int64 else [])
    pages = [[rng.choice(pool_p) if rng.random() < 0.2 else rng.randrange(num_pages) for _ in range(max_pages)]]
    counted = length if 0 <= length <= I32_MAX else 0
    num_rows = max(1, min(counted, max_pages * ps + 3) + rng.choice([0, 0, 5, 70]))
    return arena_case([length], pages, lt, pt, num_pages, ps, num_rows,
                      f"seed {seed}: page {ps} length {length} pages {pages[0][:12]}", tpc=rng.choice([8, 37, 128, 256]))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() to isolate the launches")
@pytest.mark.parametrize("shape", spec.SHAPES)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_one_request_rows_are_its_positions(emu, debug, shape):
    """One request: row r is position r (the tile entries take its page id guessed for the row and
    read no prefix sums outside debug mode): every byte as the reference has it, rows past the
    length and rows of bad page ids zero, hostile lengths counted as 0, nothing read or written
    outside the tensors; debug mode reports a bad length."""
    run_in_arenas(emu, [one_request_case(seed) for seed in range(24)], shape, debug,
                  lambda c: 8 if shape == "tiny" else min(c["tpc"], 128 if shape == "" else 256))
