"""Case builders and checks of the index fuzz (tests/emulator/test_index_fuzz_emulated.py,
tests/gpu/test_index_extremes_gpu.py): each case laid out in one buffer with guard bytes
around every tensor, the launches the op would make, and what the buffer must hold after."""
from __future__ import annotations

import ctypes
import mmap
import os
import random
from dataclasses import dataclass, field

import pytest
import torch

from nvrtc_gather.ops import gather, indexer_k_quant
from nvrtc_gather.kernels import gather as gather_kernels, indexer_k_quant as quant_kernels
from helpers.host_emu import emulator
from helpers.reference import SENTINEL, quant_reference, random_k_values

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() to isolate the launches")

I32_MIN, I32_MAX = -2**31, 2**31 - 1
I64_MIN, I64_MAX = -2**63, 2**63 - 1
GUARD = 4096            # guard bytes at least, before and after every buffer
ARENA = 256 << 10       # bytes of one case's mapping
TIMEOUT_MS = 60_000     # a launch running longer is a hang
_PATTERN = ((torch.arange(ARENA) * 37 + 11) % 251).to(torch.uint8)  # the guard pattern


class Arena:
    """Buffers carved out of one shared anonymous mapping (the forked launch's writes show
    here); every byte outside them keeps the guard pattern."""

    def __init__(self):
        self.mm = mmap.mmap(-1, ARENA)  # MAP_SHARED | MAP_ANONYMOUS
        self.bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.bytes.copy_(_PATTERN)
        self.top = GUARD

    def alloc(self, nbytes: int, offset: int = 0) -> torch.Tensor:
        """nbytes (uint8) starting ``offset`` bytes past a 256-byte boundary."""
        start = -(-self.top // 256) * 256 + offset
        self.top = start + nbytes + GUARD
        assert self.top <= ARENA, "case too large for its arena"
        return self.bytes[start: start + nbytes]


def span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, past the last byte) of a (possibly strided) tensor."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def same_view(t: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """The bytes of arena view ``t`` (any dtype, as uint8) inside another arena-sized tensor."""
    u = t.view(torch.uint8)
    return whole.as_strided(u.shape, u.stride(), u.storage_offset())


def pack(params, fields: dict, err_ptr: int) -> bytes:
    """The struct bytes runtime.LoadedModule.launcher would pass: ``fields`` and the error buffer."""
    return params.pack(**fields, error=err_ptr)


@dataclass
class Launch:
    name: str       # entry point
    grid: int
    params: bytes   # the packed parameter struct
    bounds: list    # [lo, hi) address pairs its __ldg's must stay in; empty: unchecked


NOT_RUN = -2000  # status of a launch after the one that ended the child


def run_isolated(dll, launches: list[Launch], timeout_ms: int = TIMEOUT_MS) -> list[tuple[int, int, int]]:
    """Run ``launches`` one after another in one forked child (one fork for many launches);
    for each, (status, misaligned accesses, out-of-bounds loads): status 0 once it finished,
    the child's end (see emu_launch_isolated) for the launch it ended in, NOT_RUN after that.
    A launch running past ``timeout_ms`` (each its own) ends the child as hung."""
    n = len(launches)
    size = len(launches[0].params)
    assert all(len(x.params) == size for x in launches)
    flat = [v for x in launches for pair in x.bounds for v in pair]
    out = (ctypes.c_int * (3 * n))()
    rc = dll.emu_launch_isolated(
        n, (ctypes.c_void_p * n)(*[ctypes.cast(getattr(dll, x.name), ctypes.c_void_p).value for x in launches]),
        b"".join(x.params for x in launches), size, (ctypes.c_int * n)(*[x.grid for x in launches]),
        (ctypes.c_ulonglong * max(1, len(flat)))(*flat), (ctypes.c_int * n)(*[len(x.bounds) for x in launches]),
        timeout_ms, out)
    result, ended = [], False
    for i in range(n):
        done, faults, oob = out[3 * i: 3 * i + 3]
        result.append((0, faults, oob) if done else (NOT_RUN if ended else rc or -1004, 0, 0))
        ended = ended or not done
    return result


def launch_problem(rc: int, faults: int, oob: int) -> str | None:
    if rc == NOT_RUN:
        return "the launch did not run: an earlier one of its batch ended the child"
    if rc == -1000:
        return f"the launch hung (killed after {TIMEOUT_MS} ms)"
    if rc < -1000:
        return f"the launch could not run (status {rc})"
    if rc < 0:
        return f"the launch died of signal {-rc} (a stray access)"
    if oob:
        return f"{oob} loads outside the tensors the kernel was given"
    if faults:
        return f"{faults} misaligned vector accesses"
    return None


def first_difference(got: torch.Tensor, want: torch.Tensor, regions: dict) -> str:
    i = int(torch.nonzero(got != want)[0])
    where = "a guard byte"
    for name, (lo, hi) in regions.items():
        if lo <= i < hi:
            where = f"{name} byte {i - lo}"
    return f"{int((got != want).sum())} bytes differ, the first at {where}: {int(got[i])} != {int(want[i])}"


def int32_pool(rng, n):
    """Extreme int32 values and ones near 0..n (the rows)."""
    return [I32_MIN, I32_MIN + 1, -n, -3, -1, 0, 1, n // 2, n - 1, n, n + 1, 1 << 30, I32_MAX - 1, I32_MAX,
            rng.randint(I32_MIN, I32_MAX)]


def request_indices(rng, kind: str, count: int, batch: int, n: int, bs: int, nb: int, mb: int, stop):
    """The index values of a gather fuzz case (MLA_GATHER_KINDS / CACHE_GATHER_KINDS): ``count``
    request starts (workspace_starts or cu_seq_lens) over ``n`` rows, seq_starts (or None) and
    block_table rows of ``batch`` requests, ``nb`` blocks of ``bs``, ``mb`` columns (more for
    "valid", which makes every index good; ``stop(starts, r)``: request r's end row there)."""
    pool = int32_pool(rng, n)
    if kind in ("valid", "bad_ids"):
        starts = sorted(rng.randint(0, n + 1) for _ in range(count))
    elif kind == "monotone":
        starts = sorted(rng.choice(pool) for _ in range(count))
    elif kind == "chaos":
        starts = [rng.choice(pool) for _ in range(count)]
    else:
        starts = [rng.randint(I32_MIN, I32_MAX) for _ in range(count)]
    with_seq = rng.random() < 0.6
    if kind == "valid":
        seq = [rng.randint(0, 2 * bs) for _ in range(batch)] if with_seq else None
        need = max([1] + [-(-((seq[r] if seq else 0) + max(0, stop(starts, r) - starts[r])) // bs)
                          for r in range(batch)])
        mb = need + rng.randint(0, 1)
        return starts, seq, [[rng.randrange(nb) for _ in range(mb)] for _ in range(batch)]
    seq_pool = [I32_MIN, -1, 0, 0, 1, bs, mb * bs - 1, mb * bs, I32_MAX, rng.randint(I32_MIN, I32_MAX)]
    seq = [rng.choice(seq_pool) if rng.random() < 0.4 else rng.randint(0, bs) for _ in range(batch)] \
        if with_seq else None
    bt_pool = [I32_MIN, -1, nb, nb + 1, I32_MAX, rng.randint(I32_MIN, I32_MAX)]
    bt = [[rng.choice(bt_pool) if rng.random() < 0.3 else rng.randrange(nb) for _ in range(mb)]
          for _ in range(batch)]
    if kind == "random":
        bt = [[rng.randint(I32_MIN, I32_MAX) for _ in range(mb)] for _ in range(batch)]
    return starts, seq, bt


# --- the gather -------------------------------------------------------------------------------

GATHER_ENTRIES = [(vec, shape) for shape in ("", "wide", "tiny") for vec in (16, 8, 4)]
# How a case's cu_seq_lens is made; block_table gets extreme ids in every kind.
# valid: good indices (debug mode must stay silent), often with rows past the total; bad_ids:
# good cu_seq_lens, ids just outside [0, num_blocks) where rows read them, extreme ones, and a
# request one column longer than block_table has; past_total: good but for a total past the
# rows; issue_*: the filed issue's values; single: one request (the speculative block_table
# fetch); shifted: one whose rows start off 0.
GATHER_KINDS = ("valid", "bad_ids", "past_total", "issue_3", "issue_1", "monotone", "single", "shifted", "chaos",
                "random")
GATHER_REPEATS = 2


@dataclass
class GatherFuzz:
    seed: str
    kind: str
    block_size: int
    head_dim: int
    nq: int
    num_blocks: int
    num_tokens: int
    tpc: int
    cu: list
    bt: list
    arena: Arena = field(repr=False)
    tensors: tuple = field(repr=False)
    err: torch.Tensor = field(repr=False)
    plan: object = field(default=None, repr=False)
    desc: str = field(default="", repr=False)
    before: torch.Tensor = field(default=None, repr=False)

    def describe(self, entry: str, debug: bool) -> str:
        return (f"[{entry} debug={debug} seed={self.seed!r} kind={self.kind}] block_size={self.block_size} "
                f"head_dim={self.head_dim} nq={self.nq} num_blocks={self.num_blocks} num_tokens={self.num_tokens} "
                f"tokens_per_cta={self.tpc} cu_seq_lens={self.cu} block_table={self.bt}")


def _gather_indices(rng, kind, T, bs):
    """(cu_seq_lens, max_blocks) of one kind."""
    pool = int32_pool(rng, T)
    if kind == "issue_3":
        return [0, I32_MIN, 5, 25], rng.randint(1, 6)
    if kind == "issue_1":
        return [I32_MIN, 5], rng.randint(1, 6)
    if kind in ("valid", "bad_ids", "past_total"):
        batch = rng.randint(1, 5)
        lens = [0 if rng.random() < 0.2 else rng.randint(1, max(1, T // batch + 2)) for _ in range(batch)]
        cu = [0]
        for n in lens:
            cu.append(min(max(0, T - rng.choice([0, 1, 3])), cu[-1] + n))
        if kind == "past_total":
            cu[-1] = T + 1  # (far past: monotone, chaos)
        need = -(-max(min(b, T) - a for a, b in zip(cu, cu[1:])) // bs)
        return cu, max(1, need - 1 if kind == "bad_ids" else need + rng.randint(0, 1))
    if kind == "single":
        cu = [rng.choice([0, 0] + pool), rng.choice(pool)]
    elif kind == "shifted":  # columns that cover every row, distinct ids (gather_case)
        cu = [rng.choice([-2 * bs, -3, -1, 1, 2, bs, T // 2]), rng.choice([T, T + 1, I32_MAX])]
        return cu, -(-(T + 2 * bs) // bs)
    elif kind == "monotone":
        cu = sorted(rng.choice(pool) for _ in range(rng.randint(2, 6)))
    elif kind == "chaos":
        cu = [rng.choice(pool) for _ in range(rng.randint(2, 6))]
    else:  # random
        cu = [rng.randint(I32_MIN, I32_MAX) for _ in range(rng.randint(2, 6))]
    return cu, rng.randint(1, 6)


def gather_case(seed: str, kind: str, vec: int, shape: str, mxfp4: bool = False) -> GatherFuzz:
    """``mxfp4``: vLLM's MXFP4 indexer cache (tests/helpers/mxfp4_cache.py): 64 value bytes and one
    4-byte scale word per token, 68-byte rows, blocks of 16 where the vector width needs aligned blocks."""
    rng = random.Random(seed)
    if mxfp4:
        hd, tpc = 64, (8 if shape == "tiny" else rng.choice([3, 5, 16, 37]))
    elif shape == "tiny":
        hd, tpc = rng.choice([16, 64, 128]), 8
    elif shape == "wide":
        hd, tpc = rng.choice([(128, 256), (128, 130), (256, 100)])
    else:
        hd, tpc = rng.choice([16, 64, 128]), rng.choice([3, 5, 16, 37])
    nq = 1 if mxfp4 else rng.choice([q for q in (1, 2, 4) if hd % q == 0 and hd // q >= 4])
    bs = rng.choice([1, 2, 3] if kind == "bad_ids" else [1, 2, 3, 16])
    if mxfp4 and vec > 4:
        bs = 16
    T = rng.randint(1, min(20, 4 * tpc))  # at most 4 blocks of 256 host threads
    cu, mb = _gather_indices(rng, kind, T, bs)
    batch = len(cu) - 1
    nb = rng.randint(1, 8) if kind != "shifted" else mb + rng.randint(0, 3)
    bt_pool = [I32_MIN, I32_MIN + 1, -1, -1, nb, nb, nb + 1, 1 << 30, I32_MAX - 1, I32_MAX,
               rng.randint(I32_MIN, I32_MAX)]
    p_bad = {"valid": 0.0, "past_total": 0.0}.get(kind, 0.3)
    bt = [[rng.choice(bt_pool) if rng.random() < p_bad else rng.randrange(nb) for _ in range(mb)]
          for _ in range(batch)]
    if kind == "random":
        bt = [[rng.randint(I32_MIN, I32_MAX) for _ in range(mb)] for _ in range(batch)]
    if kind == "shifted":  # distinct ids: a row read through the wrong column shows
        bt = [rng.sample(range(nb), mb)]
    if kind == "bad_ids":  # the ids just outside [0, num_blocks) where rows read them
        used = [(r, j) for r in range(batch) for j in range(min(mb, -(-(min(cu[r + 1], T) - cu[r]) // bs)))]
        for (r, j), b in zip(rng.sample(used, min(len(used), 2)), (nb, -1)):
            bt[r][j] = b

    a = Arena()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    cs = -(-(hd + 4 * nq) // 16) * 16 + rng.choice([0, 16])  # multiples of 16: the vector width is dst_k's choice
    if mxfp4:
        cs = hd + 4 * nq
    block_stride = bs * cs + rng.choice([0, 16])
    kv_bytes = a.alloc(nb * block_stride)
    kv_bytes.copy_(torch.randint(0, 256, kv_bytes.shape, dtype=torch.uint8, generator=gen))
    kv = kv_bytes.as_strided((nb, bs, cs), (block_stride, cs, 1))
    if rng.random() < 0.5:
        kv = kv.view(torch.float8_e4m3fn)
    k_row = hd + rng.choice([0, 16])
    dst_k = a.alloc((T - 1) * k_row + hd, {16: 0, 8: 8, 4: 4}[vec]).as_strided((T, hd), (k_row, 1))
    dst_k.fill_(SENTINEL)
    if rng.random() < 0.5:
        dst_k = dst_k.view(torch.float8_e4m3fn)
    s_row = 4 * nq + rng.choice([0, 8])
    dst_s = a.alloc((T - 1) * s_row + 4 * nq).as_strided((T, 4 * nq), (s_row, 1))
    dst_s.fill_(SENTINEL)
    if rng.random() < 0.5:
        dst_s = dst_s.view(torch.float32)
    bt_row = mb + rng.choice([0, 0, 3])  # strided: the columns past max_blocks hold valid-looking ids
    bt_t = a.alloc(4 * ((batch - 1) * bt_row + mb)).view(torch.int32).as_strided((batch, mb), (bt_row, 1))
    flat = bt_t.as_strided(((batch - 1) * bt_row + mb,), (1,))
    flat.copy_(torch.randint(0, nb, flat.shape, dtype=torch.int32, generator=gen))
    bt_t.copy_(torch.tensor(bt, dtype=torch.int32).view(batch, mb))
    cu_t = a.alloc(4 * (batch + 1)).view(torch.int32)
    cu_t.copy_(torch.tensor(cu, dtype=torch.int32))
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    return GatherFuzz(seed, kind, bs, hd, nq, nb, T, tpc, cu, bt, a, (kv, dst_k, dst_s, bt_t, cu_t), err)


def _gather_candidates(c: GatherFuzz, row: int) -> list[tuple[int, int]]:
    """(block, token) of every reading of ``row`` that the indices allow: request r with
    cu[r] <= row < cu[r + 1], its column (row - cu[r]) // block_size < max_blocks holding an id
    in [0, num_blocks). Exact integers: at most one for a non-decreasing cu_seq_lens."""
    out = []
    for r in range(len(c.cu) - 1):
        if c.cu[r] <= row < c.cu[r + 1]:
            pos = row - c.cu[r]
            j = pos // c.block_size
            if j < len(c.bt[r]) and 0 <= c.bt[r][j] < c.num_blocks:
                out.append((c.bt[r][j], pos % c.block_size))
    return out


def gather_is_bad(c: GatherFuzz) -> bool:
    """What the CPU path raises on (and debug mode must report)."""
    cu = c.cu
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] > c.num_tokens:
        return True
    return any(not _gather_candidates(c, row) for row in range(cu[-1]))


def _check_gather_report(c: GatherFuzz, err: list[int]) -> str | None:
    """None if debug mode's report ``err`` is right for the case, else what is wrong."""
    code, a, b, v = err
    cu, bs = c.cu, c.block_size
    batch = len(cu) - 1
    if not gather_is_bad(c):
        return None if err == [0, 0, 0, 0] else f"reported {err} for good indices"
    owner = 0 <= b < batch and 0 <= a < c.num_tokens and cu[b] <= a < cu[b + 1]
    ok = {
        1: 0 <= a < min(c.num_tokens, cu[-1]) and 0 <= b < batch and not owner and v == 0,
        2: owner and v == (a - cu[b]) // bs >= len(c.bt[b]),
        3: owner and (a - cu[b]) // bs < len(c.bt[b]) and v == c.bt[b][(a - cu[b]) // bs] and
        not 0 <= v < c.num_blocks,
        4: a == cu[0] != 0,
        5: 0 <= a < batch and b == cu[a] and v == cu[a + 1] and v < b,
        6: a == cu[-1] > c.num_tokens and b == c.num_tokens,
    }.get(code, False)
    return None if ok else f"debug report {err} does not describe a bad index of the case"


def gather_launch(c: GatherFuzz, vec: int, shape: str, debug: bool) -> Launch:
    """What the op would launch for the case (``shape`` forced through tokens_per_cta); keeps
    the arena's bytes before it in c.before."""
    kv, _, _, bt_t, cu_t = c.tensors
    c.plan = gather.plan_gather(*c.tensors)._replace(tokens_per_cta=c.tpc)
    name, grid, fields = gather.launch_config(c.plan)
    c.desc = c.describe(gather_kernels.entry_name(vec, shape), debug)
    assert name == gather_kernels.entry_name(vec, shape), c.desc
    c.before = c.arena.bytes.clone()
    return Launch(name, grid, pack(gather_kernels.PARAMS, fields, c.err.data_ptr() if debug else 0),
                  [span(kv), span(bt_t), span(cu_t)])


def check_gather(c: GatherFuzz, debug: bool, outcome) -> None:
    kv, dst_k, dst_s, _, _ = c.tensors
    desc, plan, before = c.desc, c.plan, c.before
    problem = launch_problem(*outcome)
    assert problem is None, f"{problem}: {desc}"

    expected = before.clone()
    got_k, got_s = dst_k.view(torch.uint8), dst_s.view(torch.uint8)
    old_k, old_s = same_view(dst_k, before), same_view(dst_s, before)
    blocks = kv.view(torch.uint8).as_strided((c.num_blocks, plan.block_stride), (plan.block_stride, 1))
    hd, ns, bs = c.head_dim, 4 * c.nq, c.block_size
    monotone = all(a <= b for a, b in zip(c.cu, c.cu[1:]))
    for row in range(c.num_tokens):
        want = [(blocks[b, t * hd: (t + 1) * hd], blocks[b, bs * hd + t * ns: bs * hd + (t + 1) * ns])
                for b, t in _gather_candidates(c, row)]
        untouched = torch.equal(got_k[row], old_k[row]) and torch.equal(got_s[row], old_s[row])
        matches = any(torch.equal(got_k[row], wk) and torch.equal(got_s[row], ws) for wk, ws in want)
        if monotone:  # one reading at most: written with it, or untouched without
            assert matches if want else untouched, \
                f"row {row} should be {'its reading' if want else 'untouched'}: {desc}"
        else:  # a written row must be one the indices allow
            assert untouched or matches, f"row {row} written with bytes no reading of the indices gives: {desc}"
    same_view(dst_k, expected).copy_(got_k)
    same_view(dst_s, expected).copy_(got_s)

    err = c.err.tolist()
    if debug:
        problem = _check_gather_report(c, err)
        assert problem is None, f"{problem}: {desc}"
        same_view(c.err, expected).copy_(c.err.view(torch.uint8))
    regions = {n: (span(t)[0] - c.arena.bytes.data_ptr(), span(t)[1] - c.arena.bytes.data_ptr())
               for n, t in zip(("kv_cache", "dst_k", "dst_scale", "block_table", "cu_seq_lens", "err"),
                               c.tensors + (c.err,))}
    assert torch.equal(c.arena.bytes, expected), f"{first_difference(c.arena.bytes, expected, regions)}: {desc}"


# --- the write op -----------------------------------------------------------------------------

QUANT_ENTRIES = [(dt, vec, shape) for dt in ("bf16", "f16", "f32") for vec in (16, 8, 0)
                 for shape in quant_kernels.shapes(vec)]
QUANT_IDS = [quant_kernels.entry_name(dt, vec, shape)[len("quant_cache_"):] for dt, vec, shape in QUANT_ENTRIES]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
# mixed: valid slots among extreme ones; extreme / random: every slot so; alias*: a one-block
# cache of stride 0 told it has 2^40 slots, so valid slots pass 2^31 and 2^32 (the 64-bit
# split of ng_split_slot for block sizes that are not powers of two, the shift for those that are).
# one_bad: a single slot past the cache, in a later pass of its block.
QUANT_KINDS = ("mixed", "one_bad", "extreme", "random", "alias", "alias_pow2")
QUANT_REPEATS = 2


@dataclass
class QuantFuzz:
    seed: str
    kind: str
    head_dim: int
    qbs: int
    block_size: int
    num_blocks: int
    num_slots: int      # what the kernel is told (alias: 2^40 over one block of stride 0)
    scale_fmt: str
    slots: list
    arena: Arena = field(repr=False)
    tensors: tuple = field(repr=False)  # k, kv_cache, slot_mapping
    err: torch.Tensor = field(repr=False)
    desc: str = field(default="", repr=False)
    before: torch.Tensor = field(default=None, repr=False)

    def describe(self, entry: str, debug: bool) -> str:
        return (f"[{entry} debug={debug} seed={self.seed!r} kind={self.kind}] head_dim={self.head_dim} "
                f"quant_block_size={self.qbs} block_size={self.block_size} num_blocks={self.num_blocks} "
                f"num_slots={self.num_slots} {self.scale_fmt} slot_mapping={self.slots}")

    def valid(self, s: int) -> bool:
        return 0 <= s < self.num_slots


def quant_case(seed: str, kind: str, dt: str, vec: int, shape: str = "") -> QuantFuzz:
    rng = random.Random(seed)
    dtype = DTYPES[dt]
    esize = torch.tensor([], dtype=dtype).element_size()
    if vec:
        elems = vec // esize
        # 512: few tokens per pass, so a block makes several passes (one_bad's bad slot is in a late one)
        hd = 512 if kind == "one_bad" else rng.choice([32, 128, 512])
        qbs = rng.choice([q for q in (2, 4, 8, 16, 32, 64, 128, 512)
                          if hd % q == 0 and q % elems == 0 and hd // q <= 16])
        k_off = 0 if vec == 16 else 8                     # bytes past a 16-byte boundary
        k_row = hd + rng.choice([0, 16 // esize])          # rows stay 16-byte aligned
    else:
        hd = rng.choice([12, 32, 64])
        qbs = rng.choice([q for q in range(1, hd + 1) if hd % q == 0 and hd // q <= 16])
        k_off = rng.choice([2, 4, 6]) if esize == 2 else 4  # not 8-byte aligned: the generic kernel
        k_row = hd + rng.choice([0, 1])
    nq = hd // qbs  # <= 16: the reference takes a quant block at a time
    alias = kind.startswith("alias")
    bs = {"alias": rng.choice([3, 5]), "alias_pow2": 16}.get(kind) or rng.choice([1, 3, 4, 16])
    nb = 1 if alias else rng.randint(1, 6)
    num_slots = (1 << 40) if alias else nb * bs
    T = 24 if kind == "one_bad" else rng.randint(1, 24)

    pool = [I64_MIN, I64_MIN + 1, -2**32, -2**31 - 1, I32_MIN, -1, num_slots, num_slots + 1, I32_MAX, 2**31,
            2**32 - 1, 2**32, 2**32 + 1, 1 << 40, I64_MAX - 1, I64_MAX, rng.randint(I64_MIN, I64_MAX)]
    if alias:  # every block is block 0: valid slots of distinct rows, many above 2^31
        # The first slot >= each base that lands in the wanted row: below 2^31, in [2^31, 2^32)
        # (past an int: the 64-bit split) and above 2^32.
        bases = [2**31, 2**32 - 8, I32_MAX - 8, 2**32, (1 << 40) - 8, rng.randrange(1 << 31, 1 << 39)]
        offs = rng.sample(range(bs), min(bs, T))
        valid = [b + (t - b) % bs for b, t in zip(bases * bs, offs)]
    else:
        valid = rng.sample(range(num_slots), min(num_slots, T))
        for s in (0, num_slots - 1):  # the edges of the cache when they fit
            if s not in valid and rng.random() < 0.5:
                valid[rng.randrange(len(valid))] = s
    # one_bad: the last token of the vector kernels' first block (in its last pass), else the last.
    bad_at = quant_kernels.SHAPES[shape] * (quant_kernels.THREADS // (hd * esize // vec)) - 1 if vec else T - 1
    valid_it = iter(valid)
    slots = []
    for _ in range(T):
        if kind == "random":
            s = rng.randint(I64_MIN, I64_MAX)
        elif kind == "one_bad":
            s = next(valid_it, -1) if len(slots) != bad_at else rng.choice([num_slots, I64_MAX, 2**32])
        elif kind == "extreme" or rng.random() < 0.35:
            s = rng.choice(pool)
        else:
            s = next(valid_it, -1)
        slots.append(s)
    one_token_per_row(slots, num_slots, bs if alias else None)

    a = Arena()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    extra = rng.choice([0, 2])  # rows of k past slot_mapping: never read
    rows = T + extra
    k_bytes = a.alloc(((rows - 1) * k_row + hd) * esize, k_off)
    k = k_bytes.view(dtype).as_strided((rows, hd), (k_row, 1))
    k.fill_(float("nan"))
    lo, hi = (-3.0, 3.5) if dtype == torch.float16 else (-7.0, 4.0)
    k[:T] = random_k_values(gen, T, hd, qbs, lo, hi).to(dtype)
    cs = hd + 4 * nq + rng.choice([0, 4, 12])
    block_stride = bs * cs + rng.choice([0, 0, 16])
    kv_bytes = a.alloc((nb - 1) * block_stride + bs * cs)
    kv_bytes.copy_(torch.randint(0, 256, kv_bytes.shape, dtype=torch.uint8, generator=gen))
    kv = kv_bytes.as_strided((nb, bs, cs), (block_stride, cs, 1))
    if rng.random() < 0.5:
        kv = kv.view(torch.float8_e4m3fn)
    sm = a.alloc(8 * T).view(torch.int64)
    sm.copy_(torch.tensor(slots, dtype=torch.int64))
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    fmt = rng.choice(["ue8m0", "fp8_e4m3"])
    return QuantFuzz(seed, kind, hd, qbs, bs, nb, num_slots, fmt, slots, a, (k, kv, sm), err)


def quant_launch(c: QuantFuzz, dt: str, vec: int, debug: bool, shape: str = "") -> Launch:
    """What the op would launch for the case in ``shape``; keeps the arena's bytes before it in
    c.before."""
    k, kv, sm = c.tensors
    plan = indexer_k_quant.plan_quant(k, kv, sm, c.qbs, c.scale_fmt)
    name, grid, fields = indexer_k_quant.launch_config(plan, shape)
    c.desc = c.describe(quant_kernels.entry_name(dt, vec, shape), debug)
    assert name == quant_kernels.entry_name(dt, vec, shape), c.desc
    if c.kind.startswith("alias"):  # one block of stride 0 that every block aliases, 2^40 slots
        fields = dict(fields, block_stride=0, num_slots=c.num_slots)
    T = len(c.slots)
    k_hi = k.data_ptr() + ((T - 1) * k.stride(0) + k.size(1)) * k.element_size()  # rows past T: never read
    c.before = c.arena.bytes.clone()
    return Launch(name, grid, pack(quant_kernels.PARAMS, fields, c.err.data_ptr() if debug else 0),
                  [(k.data_ptr(), k_hi), span(sm)])


def check_quant(c: QuantFuzz, debug: bool, outcome) -> None:
    k, kv, sm = c.tensors
    desc, before, T = c.desc, c.before, len(c.slots)
    problem = launch_problem(*outcome)
    assert problem is None, f"{problem}: {desc}"

    expected = before.clone()
    kept = [(s % c.block_size if c.kind.startswith("alias") else s) if c.valid(s) else -1 for s in c.slots]
    old_kv = same_view(kv, before)
    want = quant_reference(k[:T], old_kv, torch.tensor(kept, dtype=torch.int64), c.qbs, c.scale_fmt)
    same_view(kv, expected).copy_(want.view(old_kv.shape))

    err = c.err.tolist()
    if debug:
        bad = [i for i, s in enumerate(c.slots) if s >= c.num_slots]
        code, a, b, v = err
        if bad:
            assert code == 7 and a in bad and b == c.slots[a] and v == c.num_slots, f"debug report {err}: {desc}"
        else:
            assert err == [0, 0, 0, 0], f"debug report {err} for good slots: {desc}"
        same_view(c.err, expected).copy_(c.err.view(torch.uint8))
    regions = {n: (span(t)[0] - c.arena.bytes.data_ptr(), span(t)[1] - c.arena.bytes.data_ptr())
               for n, t in zip(("k", "kv_cache", "slot_mapping", "err"), c.tensors + (c.err,))}
    assert torch.equal(c.arena.bytes, expected), f"{first_difference(c.arena.bytes, expected, regions)}: {desc}"


# --- the MLA gather (cuda_src/mla_gather.cu) -----------------------------------------------------

MLA_GATHER_ENTRIES = [16, 0]           # vector widths: mla_gather_v16, mla_gather_v4
# valid: good indices (debug mode silent); monotone / chaos / random: workspace_starts of the
# pool, any order, any int32; bad_ids: good starts, block ids and seq_starts just outside.
MLA_GATHER_KINDS = ("valid", "bad_ids", "monotone", "chaos", "random")
MLA_GATHER_REPEATS = 3


@dataclass
class MlaGatherFuzz:
    seed: str
    kind: str
    block_size: int
    num_blocks: int
    num_rows: int
    rows_per_cta: int
    ws: list
    seq: list | None
    bt: list
    arena: Arena = field(repr=False)
    tensors: tuple = field(repr=False)  # src_cache, dst, block_table, workspace_starts, seq_starts (or None)
    err: torch.Tensor = field(repr=False)
    desc: str = field(default="", repr=False)
    before: torch.Tensor = field(default=None, repr=False)


def mla_gather_case(seed: str, kind: str, vec: int) -> MlaGatherFuzz:
    from helpers.mla_reference import RECORD
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 16])
    n = rng.randint(1, 20)
    batch = rng.randint(1, 5)
    nb = rng.randint(1, 3)
    mb = rng.randint(1, 4)
    ws, seq, bt = request_indices(rng, kind, batch, batch, n, bs, nb, mb,
                                  lambda ws, r: min(ws[r + 1] if r + 1 < batch else n, n))
    mb = len(bt[0])
    rpc = rng.choice([8, 16, 64])

    a = Arena()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    entry = RECORD + rng.choice([0, 16])
    block_stride = bs * entry + rng.choice([0, 16])
    src_bytes = a.alloc((nb - 1) * block_stride + (bs - 1) * entry + RECORD)
    src_bytes.copy_(torch.randint(0, 256, src_bytes.shape, dtype=torch.uint8, generator=gen))
    src = src_bytes.as_strided((nb, bs, RECORD), (block_stride, entry, 1))
    if rng.random() < 0.5:
        src = src.view(torch.float8_e4m3fn)
    row = 576 + rng.choice([0, 8])
    dst = a.alloc(2 * ((n - 1) * row + 576), 0 if vec else 4).view(torch.bfloat16).as_strided((n, 576), (row, 1))
    dst.view(torch.uint8).fill_(SENTINEL)
    bt_t = a.alloc(4 * batch * mb).view(torch.int32).view(batch, mb)
    bt_t.copy_(torch.tensor(bt, dtype=torch.int32))
    ws_t = a.alloc(4 * batch).view(torch.int32)
    ws_t.copy_(torch.tensor(ws, dtype=torch.int32))
    seq_t = None
    if seq is not None:
        seq_t = a.alloc(4 * batch).view(torch.int32)
        seq_t.copy_(torch.tensor(seq, dtype=torch.int32))
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    return MlaGatherFuzz(seed, kind, bs, nb, n, rpc, ws, seq, bt, a, (src, dst, bt_t, ws_t, seq_t), err)


def mla_gather_launch(c: MlaGatherFuzz, vec: int, debug: bool) -> Launch:
    from nvrtc_gather.kernels import mla_cache
    from nvrtc_gather.ops import mla_gather
    src, dst, bt_t, ws_t, seq_t = c.tensors
    plan = mla_gather.plan_gather(src, dst, bt_t, ws_t, len(c.ws), seq_t)._replace(rows_per_cta=c.rows_per_cta)
    cfg = mla_gather.launch_config(plan)
    c.desc = f"[{cfg.entry} debug={debug}] {c!r}"
    assert cfg.entry == mla_cache.gather_entry(vec), c.desc
    c.before = c.arena.bytes.clone()
    bounds = [span(src), span(bt_t), span(ws_t)] + ([span(seq_t)] if seq_t is not None else [])
    return Launch(cfg.entry, cfg.grid, pack(mla_cache.GATHER_PARAMS, cfg.fields, c.err.data_ptr() if debug else 0),
                  bounds)


def check_gather_rows(c, debug: bool, outcome, dst, starts_ok: bool, owned, readings, names, codes) -> None:
    """A gather fuzz case after its launch: the launch ran clean; every row of ``dst`` holds
    one of ``readings(row)`` (the bytes its indices allow; exactly the one, or untouched when
    none, if ``starts_ok``: the request starts are non-negative and non-decreasing); debug mode
    reported one of ``codes`` exactly when something was bad (a start, or a row ``owned(row)``
    by a request with no reading); no other byte of the arena changed (``names``: of the
    case's tensors, for the message)."""
    problem = launch_problem(*outcome)
    assert problem is None, f"{problem}: {c.desc}"
    expected = c.before.clone()
    got, old = same_view(dst, c.arena.bytes), same_view(dst, c.before)
    faulty_row = False
    for row in range(c.num_rows):
        want = readings(row)
        g = got[row].reshape(-1)
        untouched = torch.equal(g, old[row].reshape(-1))
        if starts_ok:
            assert torch.equal(g, want[0]) if want else untouched, \
                f"row {row} should be {'its reading' if want else 'untouched'}: {c.desc}"
            faulty_row = faulty_row or (owned(row) and not want)
        else:
            assert untouched or any(torch.equal(g, w) for w in want), \
                f"row {row} written with bytes no reading of the indices gives: {c.desc}"
    same_view(dst, expected).copy_(got)
    if debug:
        code = int(c.err[0])
        if not starts_ok or faulty_row:
            assert code in codes, f"debug report {c.err.tolist()} for bad indices: {c.desc}"
        else:
            assert code == 0, f"debug report {c.err.tolist()} for good indices: {c.desc}"
        same_view(c.err, expected).copy_(c.err.view(torch.uint8))
    regions = {nm: (span(t)[0] - c.arena.bytes.data_ptr(), span(t)[1] - c.arena.bytes.data_ptr())
               for nm, t in zip(names + ("err",), c.tensors + (c.err,)) if t is not None}
    assert torch.equal(c.arena.bytes, expected), f"{first_difference(c.arena.bytes, expected, regions)}: {c.desc}"


def check_mla_gather(c: MlaGatherFuzz, debug: bool, outcome) -> None:
    from helpers.mla_reference import gather_row_readings, record_bytes, upconvert_record
    src, dst, bt_t, ws_t, seq_t = c.tensors
    batch, n = len(c.ws), c.num_rows

    def readings(row):
        return [torch.frombuffer(bytearray(upconvert_record(record_bytes(src, b, e))), dtype=torch.uint8).view(-1)
                for b, e in gather_row_readings(src, bt_t, c.ws, c.seq, batch, n, row)]

    def owned(row):
        return any(c.ws[r] <= row < (c.ws[r + 1] if r + 1 < batch else n) for r in range(batch))

    check_gather_rows(c, debug, outcome, dst, c.ws[0] >= 0 and all(a <= b for a, b in zip(c.ws, c.ws[1:])), owned,
                      readings, ("src_cache", "dst", "block_table", "workspace_starts", "seq_starts"), (2, 3, 8, 9))


# --- the MLA write (cuda_src/mla_write.cu) --------------------------------------------------------

# (kv_cache_dtype, input dtype, vector width of the fp8_ds_mla kernel; 0 for the plain ones)
MLA_WRITE_ENTRIES = [("fp8_ds_mla", "bf16", 16), ("fp8_ds_mla", "bf16", 0), ("fp8_ds_mla", "f16", 16),
                     ("fp8_ds_mla", "f16", 0), ("auto", "bf16", 0), ("fp8", "f16", 0), ("auto", "f32", 0)]
MLA_WRITE_IDS = [f"{f}-{d}-v{v}" for f, d, v in MLA_WRITE_ENTRIES]
MLA_WRITE_KINDS = ("mixed", "extreme", "random")
MLA_WRITE_REPEATS = 2


@dataclass
class MlaWriteFuzz:
    seed: str
    kind: str
    slots: list
    num_slots: int
    case: object = field(repr=False)     # helpers.mla_reference.WriteCase over the arena
    arena: Arena = field(repr=False)
    err: torch.Tensor = field(repr=False)
    desc: str = field(default="", repr=False)
    before: torch.Tensor = field(default=None, repr=False)
    want: torch.Tensor = field(default=None, repr=False)


def mla_write_case(seed: str, kind: str, fmt: str, dt: str, vec: int) -> MlaWriteFuzz:
    from helpers.mla_reference import RECORD, WriteCase, random_rows
    rng = random.Random(seed)
    dtype = DTYPES[dt]
    esize = torch.tensor([], dtype=dtype).element_size()
    rank, pe = (512, rng.choice([64, 0])) if fmt == "fp8_ds_mla" else rng.choice([(512, 64), (40, 8)])
    bs, nb = rng.choice([1, 3, 16]), rng.randint(1, 3)
    num_slots = nb * bs
    T = rng.randint(1, 12)
    a = Arena()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    off = 0 if vec else rng.choice([2, 4]) // esize * esize or esize  # misaligned inputs for the any-alignment kernel
    kv_c = a.alloc(T * rank * esize, off).view(dtype).view(T, rank)
    kv_c.copy_(random_rows(gen, T, rank, dtype))
    k_pe = a.alloc(T * pe * esize, off).view(dtype).view(T, pe)
    if pe:
        k_pe.copy_(random_rows(gen, T, pe, dtype))
    width = RECORD if fmt == "fp8_ds_mla" else rank + pe
    cache_dtype = dtype if fmt == "auto" else torch.uint8
    csize = torch.tensor([], dtype=cache_dtype).element_size()
    entry = width + rng.choice([0, 16 // csize])
    kv = a.alloc(nb * bs * entry * csize).view(cache_dtype).view(nb, bs, entry)[:, :, :width]
    scale = a.alloc(4).view(torch.float32)
    scale.fill_(rng.choice([1.0, 0.25, 3.0]))
    pool = [I64_MIN, I64_MIN + 1, -2 ** 32, I32_MIN, -1, num_slots, num_slots + 1, I32_MAX, 2 ** 31, 2 ** 32,
            1 << 40, I64_MAX, rng.randint(I64_MIN, I64_MAX)]
    slots = draw_slots(rng, kind, T, pool, rng.sample(range(num_slots), min(num_slots, T)))
    sm = a.alloc(8 * T).view(torch.int64)
    sm.copy_(torch.tensor(slots, dtype=torch.int64))
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    case = WriteCase(kv_c, k_pe, kv, sm, fmt, scale, False, rng.choice(["pow2", "plain"]), a.bytes)
    return MlaWriteFuzz(seed, kind, slots, num_slots, case, a, err)


def mla_write_launch(c: MlaWriteFuzz, fmt: str, dt: str, vec: int, debug: bool) -> Launch:
    from helpers.mla_reference import write_reference
    from nvrtc_gather.kernels import mla_cache
    from nvrtc_gather.ops import mla_write
    w = c.case
    plan = mla_write.plan_write(*w.args())
    cfg = mla_write.launch_config(plan)
    c.desc = f"[{cfg.entry} debug={debug} rule={w.ds_scale_rule}] {c!r}"
    want_entry = mla_cache.ds_entry(dt, vec) if fmt == "fp8_ds_mla" else \
        mla_cache.plain_entry(dt, "copy" if fmt == "auto" else "fp8")
    assert cfg.entry == want_entry, c.desc
    c.before = c.arena.bytes.clone()
    # what must land: the well-formed slots' entries (the reference skips -1)
    kept = torch.tensor([s if 0 <= s < c.num_slots else -1 for s in c.slots], dtype=torch.int64)
    real = w.slot_mapping
    w.slot_mapping = kept
    c.want = write_reference(w)
    w.slot_mapping = real
    T = len(c.slots)
    bounds = [span(w.kv_c[:T]), span(real)] + ([span(w.k_pe[:T])] if w.k_pe.shape[1] else []) + \
        ([span(w.scale)] if plan.scale_ptr else [])
    return Launch(cfg.entry, cfg.grid, pack(mla_cache.WRITE_PARAMS, cfg.fields, c.err.data_ptr() if debug else 0),
                  bounds)


def check_mla_write(c: MlaWriteFuzz, debug: bool, outcome) -> None:
    problem = launch_problem(*outcome)
    assert problem is None, f"{problem}: {c.desc}"
    expected = c.want.clone()
    if debug:
        bad = [i for i, s in enumerate(c.slots) if s >= c.num_slots]
        code, a, b, v = c.err.tolist()
        if bad:
            assert code == 7 and a in bad and b == c.slots[a] and v == c.num_slots, f"debug report {c.err.tolist()}: {c.desc}"
        else:
            assert c.err.tolist() == [0, 0, 0, 0], f"debug report {c.err.tolist()} for good slots: {c.desc}"
        same_view(c.err, expected).copy_(c.err.view(torch.uint8))
    w = c.case
    regions = {n: (span(t)[0] - c.arena.bytes.data_ptr(), span(t)[1] - c.arena.bytes.data_ptr())
               for n, t in (("kv_c", w.kv_c), ("k_pe", w.k_pe), ("kv_cache", w.kv_cache),
                            ("slot_mapping", w.slot_mapping), ("err", c.err))}
    assert torch.equal(c.arena.bytes, expected), f"{first_difference(c.arena.bytes, expected, regions)}: {c.desc}"


# --- the chunked-context gathers (cuda_src/cache_gather.cu) ----------------------------------------

def _cache_gather_entries():
    from nvrtc_gather.kernels import cache_gather as spec
    return [(conv, w, False) for conv, w in spec.MODULES] + [(conv, spec.widest(conv), True) for conv in spec.TINY_MODULES]


CACHE_GATHER_ENTRIES = _cache_gather_entries()   # (conversion, (load, store) widths, tiny): every module
CACHE_GATHER_IDS = [f"{conv}-l{w[0]}-s{w[1]}{'-tiny' if tiny else ''}" for conv, w, tiny in CACHE_GATHER_ENTRIES]
# valid: good indices (debug mode silent); monotone / chaos / random: cu_seq_lens of the pool,
# any order, any int32; bad_ids: good cu_seq_lens, block ids and seq_starts just outside.
CACHE_GATHER_KINDS = ("valid", "bad_ids", "monotone", "chaos", "random")
CACHE_GATHER_REPEATS = 3


@dataclass
class CacheGatherFuzz:
    seed: str
    kind: str
    conversion: str
    block_size: int
    num_blocks: int
    num_rows: int
    rows_per_cta: int
    cu: list
    seq: list | None
    bt: list
    arena: Arena = field(repr=False)
    tensors: tuple = field(repr=False)  # src_cache, dst, block_table, cu_seq_lens, seq_starts (or None), scale
    err: torch.Tensor = field(repr=False)
    desc: str = field(default="", repr=False)
    before: torch.Tensor = field(default=None, repr=False)


def cache_gather_case(seed: str, kind: str, conversion: str, widths: tuple) -> CacheGatherFuzz:
    from nvrtc_gather.kernels import cache_gather as spec
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 16])
    n = rng.randint(1, 20)
    batch = rng.randint(1, 5)
    nb = rng.randint(1, 3)
    mb = rng.randint(1, 4)
    cu, seq, bt = request_indices(rng, kind, batch + 1, batch, n, bs, nb, mb, lambda cu, r: min(cu[r + 1], n))
    mb = len(bt[0])
    rpc = rng.choice([1, 8, 16, 64])

    a = Arena()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    fast = widths != spec.ANY
    width = rng.choice([16, 48, 64])                  # source bytes per entry
    out = spec.CONVERSIONS[conversion][2]
    entry = width + (0 if fast else rng.choice([0, 4]))
    block_stride = bs * entry + rng.choice([0, 16])
    src_bytes = a.alloc((nb - 1) * block_stride + (bs - 1) * entry + width)
    src_bytes.copy_(torch.randint(0, 256, src_bytes.shape, dtype=torch.uint8, generator=gen))
    src = src_bytes.as_strided((nb, bs, width), (block_stride, entry, 1))
    if conversion != "copy" and rng.random() < 0.5:
        src = src.view(torch.float8_e4m3fn if conversion.startswith("e4m3") else torch.float8_e5m2)
    out_dtype = {1: torch.uint8, 2: torch.bfloat16 if "bf16" in conversion else torch.float16, 4: torch.float32}[out]
    row = width * out + (0 if fast else rng.choice([0, 4, 8]))
    dst_bytes = a.alloc((n - 1) * row + width * out, 0 if fast else rng.choice([0, 4]))
    dst_bytes.fill_(SENTINEL)
    esz = out_dtype.itemsize
    dst = dst_bytes.view(out_dtype).as_strided((n, width), (row // esz, 1))
    bt_t = a.alloc(4 * batch * mb).view(torch.int32).view(batch, mb)
    bt_t.copy_(torch.tensor(bt, dtype=torch.int32))
    cu_t = a.alloc(4 * (batch + 1)).view(torch.int32)
    cu_t.copy_(torch.tensor(cu, dtype=torch.int32))
    seq_t = None
    if seq is not None:
        seq_t = a.alloc(4 * batch).view(torch.int32)
        seq_t.copy_(torch.tensor(seq, dtype=torch.int32))
    scale = a.alloc(4).view(torch.float32)
    scale.fill_(rng.choice([0.5, 0.37, 3.0, 1e-30]))
    err = a.alloc(32).view(torch.int64)
    err.zero_()
    return CacheGatherFuzz(seed, kind, conversion, bs, nb, n, rpc, cu, seq, bt, a,
                           (src, dst, bt_t, cu_t, seq_t, scale), err)


def _cache_gather_args(c: CacheGatherFuzz):
    src, dst, bt_t, cu_t, seq_t, scale = c.tensors
    if c.conversion == "copy":
        return "cp_gather_cache", (src, dst, bt_t, cu_t, len(c.cu) - 1, seq_t)
    kv = "fp8_e5m2" if c.conversion.startswith("e5m2") else "fp8"
    return "gather_and_maybe_dequant_cache", (src, dst, bt_t, cu_t, cu_t, c.num_rows, kv, scale, seq_t)


def cache_gather_launch(c: CacheGatherFuzz, widths: tuple, debug: bool, tiny: bool = False) -> Launch:
    from nvrtc_gather.kernels import cache_gather as spec
    from nvrtc_gather.ops import cache_gather
    src, dst, bt_t, cu_t, seq_t, scale = c.tensors
    plan = cache_gather.plan_for(*_cache_gather_args(c)[:1], *_cache_gather_args(c)[1])
    plan = plan._replace(rows_per_cta=c.rows_per_cta, tiny=tiny)
    if (plan.vec, plan.svec) != widths:  # the layout allows the fast entry: force the one under test
        assert widths == spec.ANY, c
        plan = plan._replace(vec=widths[0], svec=widths[1])
    cfg = cache_gather.launch_config(plan)
    c.desc = f"[{cfg.entry} debug={debug}] {c!r}"
    assert cfg.entry == spec.entry_name(c.conversion, *widths, tiny), c.desc
    c.before = c.arena.bytes.clone()
    bounds = [span(src), span(bt_t), span(cu_t)] + ([span(seq_t)] if seq_t is not None else []) + \
        ([span(scale)] if c.conversion != "copy" else [])
    return Launch(cfg.entry, cfg.grid, pack(spec.PARAMS, cfg.fields, c.err.data_ptr() if debug else 0), bounds)


def check_cache_gather(c: CacheGatherFuzz, debug: bool, outcome) -> None:
    from helpers.cache_gather_reference import convert_row, row_readings
    src, dst, bt_t, cu_t, seq_t, scale = c.tensors
    batch, n, s = len(c.cu) - 1, c.num_rows, float(scale)
    src_u8 = src.view(torch.uint8)

    def readings(row):
        return [torch.frombuffer(bytearray(convert_row(bytes(src_u8[b, e].tolist()), c.conversion, s)),
                                 dtype=torch.uint8)
                for b, e in row_readings(bt_t, c.cu, c.seq, batch, n, c.block_size, c.num_blocks, row)]

    def owned(row):
        return any(c.cu[r] <= row < c.cu[r + 1] for r in range(batch))

    check_gather_rows(c, debug, outcome, dst, c.cu[0] >= 0 and all(a <= b for a, b in zip(c.cu, c.cu[1:])), owned,
                      readings, ("src_cache", "dst", "block_table", "cu_seq_lens", "seq_starts", "scale"),
                      (2, 3, 5, 9, 10))


def draw_slots(rng, kind: str, T: int, pool: list, valid: list) -> list:
    """T slot_mapping entries: "random": any int64; "extreme": all from ``pool``; otherwise
    mostly the ``valid`` ones in order (-1 once they run out), about a third from ``pool``."""
    it = iter(valid)
    slots = []
    for _ in range(T):
        if kind == "random":
            slots.append(rng.randint(I64_MIN, I64_MAX))
        elif kind == "extreme" or rng.random() < 0.35:
            slots.append(rng.choice(pool))
        else:
            slots.append(next(it, -1))
    return slots


def one_token_per_row(slots: list, num_slots: int, alias_block_size=None) -> None:
    """Two tokens for one cache row: which lands is unspecified, so a case keeps the first and
    makes the others -1 (in place). ``alias_block_size``: every block is block 0 (the row is
    ``s % alias_block_size``)."""
    seen = set()
    for i, s in enumerate(slots):
        if 0 <= s < num_slots:
            row = s % alias_block_size if alias_block_size else s
            slots[i] = -1 if row in seen else s
            seen.add(row)
