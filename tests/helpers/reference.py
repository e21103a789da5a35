"""Independent, obviously-correct references and random-case builders for the tests.

The reference walks requests and tokens one by one and computes every byte offset by
hand from docs/contract.md §1, sharing no code with the package."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

SENTINEL = 0xA5  # poison byte for outputs: every unwritten row shows


def gather_reference(kv_cache, block_table, cu_seq_lens, num_tokens, head_dim, scale_words):
    """(k_bytes uint8 [num_tokens, head_dim], scale_bytes uint8 [num_tokens, 4*scale_words]);
    rows past cu_seq_lens[-1] hold SENTINEL."""
    kv = kv_cache.contiguous().view(torch.uint8).flatten()  # contiguous copy: offsets by hand below
    nb, bs, cs = kv_cache.shape
    k = torch.full((num_tokens, head_dim), SENTINEL, dtype=torch.uint8)
    s = torch.full((num_tokens, 4 * scale_words), SENTINEL, dtype=torch.uint8)
    cu = [int(x) for x in cu_seq_lens]
    for r in range(len(cu) - 1):
        for i in range(cu[r + 1] - cu[r]):
            block = int(block_table[r, i // bs])
            t = i % bs
            base = block * bs * cs
            k[cu[r] + i] = kv[base + t * head_dim: base + (t + 1) * head_dim]
            sbase = base + bs * head_dim + t * 4 * scale_words
            s[cu[r] + i] = kv[sbase: sbase + 4 * scale_words]
    return k, s


@dataclass
class GatherCase:
    kv_cache: torch.Tensor
    dst_k: torch.Tensor
    dst_scale: torch.Tensor
    block_table: torch.Tensor
    cu_seq_lens: torch.Tensor
    head_dim: int
    scale_words: int
    desc: str

    def args(self):
        return self.kv_cache, self.dst_k, self.dst_scale, self.block_table, self.cu_seq_lens


def make_gather_case(rng: random.Random, *, block_size, head_dim, quant_block_size, batch,
                     max_len=None, lens=None, extra_rows=None, scale_as_float=None, k_fp8=None,
                     strided=None, extra_blocks=None, device="cpu", generator=None) -> GatherCase:
    """A random case: ragged lengths (some empty, most with a partial last block), shuffled
    physical blocks, random cache bytes, outputs poisoned, optionally strided views and an
    upper-bound destination with a sentinel tail."""
    nq = head_dim // quant_block_size
    if lens is None:
        max_len = max_len if max_len is not None else rng.choice([1, 5, 64, 200, 700])
        lens = [0 if rng.random() < 0.15 else rng.randint(1, max_len) for _ in range(batch)]
    total = sum(lens)
    blocks_per = [(n + block_size - 1) // block_size for n in lens]
    max_blocks = max([1] + blocks_per) + rng.randint(0, 2)
    num_blocks = sum(blocks_per) + (extra_blocks if extra_blocks is not None else rng.randint(1, 8))
    cache_stride = head_dim + 4 * nq + rng.choice([0, 0, 4, 12])
    strided = rng.random() < 0.4 if strided is None else strided
    extra_rows = rng.choice([0, 0, 3, 50]) if extra_rows is None else extra_rows
    scale_as_float = rng.random() < 0.5 if scale_as_float is None else scale_as_float
    k_fp8 = rng.random() < 0.5 if k_fp8 is None else k_fp8
    gen = generator

    # Cache: random bytes everywhere (never zeros); strided variant is a view of a wider buffer.
    pad_blk = 16 if strided else 0
    raw = torch.randint(0, 256, (num_blocks, block_size * cache_stride + pad_blk), dtype=torch.uint8, generator=gen)
    kv = raw[:, : block_size * cache_stride].view(num_blocks, block_size, cache_stride)
    perm = list(range(num_blocks))
    rng.shuffle(perm)
    bt = torch.full((batch, max_blocks + (3 if strided else 0)), -7, dtype=torch.int32)
    it = iter(perm)
    for r, nb_r in enumerate(blocks_per):
        for j in range(nb_r):
            bt[r, j] = next(it)
    for r in range(batch):  # unused columns hold valid-looking ids too (engines leave garbage there)
        for j in range(blocks_per[r], max_blocks):
            bt[r, j] = rng.randrange(num_blocks)
    block_table = bt[:, :max_blocks] if strided else bt
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32)

    n_rows = total + extra_rows
    row_pad = 32 if strided else 0
    k_store = torch.full((n_rows, head_dim + row_pad), 0x5A, dtype=torch.uint8)
    dst_k = k_store[:, :head_dim]
    if k_fp8:
        dst_k = dst_k.view(torch.float8_e4m3fn)
    if scale_as_float:
        s_store = torch.full((n_rows, 4 * (nq + (4 if strided else 0))), 0x5A, dtype=torch.uint8).view(torch.float32)
        dst_scale = s_store[:, :nq]
    else:
        s_store = torch.full((n_rows, 4 * nq + (8 if strided else 0)), 0x5A, dtype=torch.uint8)
        dst_scale = s_store[:, : 4 * nq]
    dst_k.view(torch.uint8).fill_(SENTINEL)
    dst_scale.view(torch.uint8).fill_(SENTINEL)
    desc = (f"bs={block_size} hd={head_dim} qbs={quant_block_size} batch={batch} total={total} "
            f"extra={extra_rows} float_scale={scale_as_float} fp8={k_fp8} strided={strided} cs={cache_stride}")
    case = GatherCase(kv, dst_k, dst_scale, block_table, cu, head_dim, nq, desc)
    if device != "cpu":
        case = to_device(case, device)
    return case


def copy_to(t, device):
    """``t`` on ``device`` with the same shape and strides (a plain value as it is)."""
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    out.copy_(t)
    return out


def to_device(case: GatherCase, device) -> GatherCase:
    """Same case on another device with the same shapes and strides."""
    return GatherCase(*(copy_to(t, device) for t in case.args()), case.head_dim, case.scale_words, case.desc)


# --- indexer_k_quant_and_cache -------------------------------------------------------------

# Bad indices, shared by the kernel's emulator and GPU tests: what is broken -> the
# debug-mode error code it must raise (cu_decreasing and cu_start may also surface first
# as rows that belong to no request, code 1).
MALFORMED = {"block_id_high": 3, "block_id_negative": 3, "cu_decreasing": 5, "cu_total_past_rows": 6,
             "cu_start": 4, "too_many_blocks": 2}


def small_gather_case() -> GatherCase:
    """Six requests of 16-token blocks, one empty, a 6-row spare tail (CPU tensors)."""
    return make_gather_case(random.Random(99), block_size=16, head_dim=128, quant_block_size=128, batch=6,
                            lens=[20, 0, 33, 16, 5, 40], extra_rows=6, strided=False, extra_blocks=2)


def break_indices(c: GatherCase, what: str) -> None:
    """Make one of MALFORMED's faults in ``c`` (a small_gather_case, on any device), in place."""
    bt, cu = c.block_table, c.cu_seq_lens
    if what == "block_id_high":
        bt[2, 1] = c.kv_cache.size(0) + 1000000
    elif what == "block_id_negative":
        bt[0, 0] = -5
    elif what == "cu_decreasing":
        cu[3] = 10
    elif what == "cu_total_past_rows":
        cu[-1] = c.dst_k.size(0) + 500
    elif what == "cu_start":
        cu[0] = 3
    else:  # too_many_blocks: request 0 longer than its block_table row covers
        cu[1:] = torch.clamp(torch.maximum(cu[1:], torch.tensor(16 * bt.size(1) + 1, dtype=torch.int32,
                                                                 device=cu.device)), max=c.dst_k.size(0))


def bad_block_id_case():
    """(small_gather_case with request 2's second block id out of range, the reference
    bytes of the case without that fault, the rows the fault must leave untouched)."""
    c = small_gather_case()
    c.block_table[2, 1] = c.block_table[2, 0]
    k_ref, _ = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 1)
    c.block_table[2, 1] = 10 ** 6  # request 2 (rows 20..52), tokens 16..32
    return c, k_ref, slice(20 + 16, 20 + 32)


def assert_only_rows_skipped(got: torch.Tensor, k_ref: torch.Tensor, bad: slice) -> None:
    """Rows ``bad`` of ``got`` (dst_k bytes) were never written; every other row is exact."""
    assert bool((got[bad] == SENTINEL).all())
    keep = torch.ones(got.size(0), dtype=torch.bool)
    keep[bad] = False
    assert torch.equal(got[keep], k_ref[keep])


SINGLE_REQUEST_FAULTS = ("cu_start", "block_id_high", "total_past_rows")


def single_request_case(what: str):
    """(one request of 70 tokens with fault ``what`` of SINGLE_REQUEST_FAULTS, the reference
    bytes without it): block ids a kernel fetches before cu_seq_lens[0] is known to be 0
    must never be used on a bad guess."""
    c = make_gather_case(random.Random(5), block_size=16, head_dim=128, quant_block_size=128, batch=1, lens=[70],
                         extra_rows=10, strided=False)
    k_ref, _ = gather_reference(c.kv_cache, c.block_table, c.cu_seq_lens, c.dst_k.size(0), 128, 1)
    if what == "cu_start":
        c.cu_seq_lens[0] = 16  # rows 0..15 belong to nobody; 16.. are request 0's tokens 0..
    elif what == "block_id_high":
        c.block_table[0, 2] = 1 << 30
    else:
        c.cu_seq_lens[1] = c.dst_k.size(0) + 100
    return c, k_ref


def assert_single_request_result(got: torch.Tensor, k_ref: torch.Tensor, what: str) -> None:
    if what == "cu_start":
        assert bool((got[:16] == SENTINEL).all())
        assert torch.equal(got[16:70], k_ref[:54])
    elif what == "block_id_high":
        assert bool((got[32:48] == SENTINEL).all()) and torch.equal(got[:32], k_ref[:32])
    else:
        assert torch.equal(got[:70], k_ref[:70])


def quant_reference(k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
    """The kv_cache bytes (uint8, shape [num_blocks, block_size, cache_stride]) expected after
    indexer_k_quant_and_cache, token by token from docs/contract.md §2: numpy fp32 arithmetic for
    amax and scale, math.frexp for the ue8m0 power of two, torch's fp32 -> e4m3 conversion
    (the spec) for the values. Unwritten bytes keep the input's."""
    import math

    import numpy as np

    nb, bs, cs = kv_cache.shape
    out = kv_cache.cpu().view(torch.uint8).contiguous().clone()
    flat = out.view(-1)
    hd = k.size(1)
    qbs = quant_block_size
    nq = hd // qbs
    k_cpu = k.cpu()
    for i, s in enumerate(slot_mapping.cpu().tolist()):
        if s < 0:
            continue
        b, t = divmod(s, bs)
        base = b * bs * cs
        row = k_cpu[i].float().numpy().reshape(nq, qbs)
        for q in range(nq):
            amax = np.float32(np.abs(row[q]).max())
            scale = np.float32(max(amax, np.float32(1e-4))) / np.float32(448.0)
            if scale_fmt == "ue8m0":
                m, e = math.frexp(float(scale))  # scale = m * 2**e, 0.5 <= m < 1
                scale = np.float32(2.0 ** (e - 1) if m == 0.5 else 2.0 ** e)
            vals = torch.from_numpy(row[q] / scale).to(torch.float8_e4m3fn).view(torch.uint8)
            start = base + t * hd + q * qbs
            flat[start: start + qbs] = vals
            sstart = base + bs * hd + 4 * (t * nq + q)
            flat[sstart: sstart + 4] = torch.from_numpy(np.array([scale], dtype=np.float32).view(np.uint8))
    return out


@dataclass
class QuantCase:
    """Arguments of one call; k and kv_cache are views (shape, stride, offset) into larger
    buffers k_store / kv_store, so guard bytes around and between them can be checked."""
    k_store: torch.Tensor
    k_view: tuple
    kv_store: torch.Tensor
    kv_view: tuple
    slot_mapping: torch.Tensor
    quant_block_size: int
    scale_fmt: str
    desc: str

    @property
    def k(self):
        return self.k_store.as_strided(*self.k_view)

    @property
    def kv_cache(self):
        return self.kv_store.as_strided(*self.kv_view)

    def args(self):
        return self.k, self.kv_cache, self.slot_mapping, self.quant_block_size, self.scale_fmt

    def to(self, device):
        return QuantCase(self.k_store.to(device), self.k_view, self.kv_store.to(device), self.kv_view,
                         self.slot_mapping.to(device), self.quant_block_size, self.scale_fmt, self.desc)

    def outside_cache(self):
        """Bytes of kv_store that are not part of kv_cache (guards and gaps between blocks)."""
        mask = torch.ones(self.kv_store.numel(), dtype=torch.bool, device=self.kv_store.device)
        idx = torch.arange(self.kv_store.numel(), device=self.kv_store.device).as_strided(*self.kv_view)
        mask[idx.reshape(-1)] = False
        return self.kv_store[mask]


def random_k_values(gen, rows, head_dim, quant_block_size, lo=-7.0, hi=4.0):
    """fp32 values whose quant blocks span magnitudes 10**lo .. 10**hi (so the 1e-4 floor,
    e4m3 subnormals and large scales all occur), random signs, never exactly zero."""
    nq = head_dim // quant_block_size
    mag = torch.pow(10.0, torch.empty(rows, nq, 1).uniform_(lo, hi, generator=gen))
    x = torch.randn(rows, nq, quant_block_size, generator=gen) * mag
    x = torch.where(x == 0, mag, x)
    return x.view(rows, head_dim)


def make_quant_case(rng: random.Random, *, head_dim, quant_block_size, block_size, dtype, scale_fmt,
                    num_tokens, extra_rows=0, pad_frac=0.2, k_row_pad=0, k_offset=0, block_pad=0,
                    num_blocks=None, seed=None) -> QuantCase:
    """A random CPU case: distinct random slots (some -1), k rows past len(slot_mapping)
    holding NaN/inf (never to be read), the cache and its guard bytes random (never zeros
    only). k_row_pad / k_offset (elements) make k row-strided / shifted; block_pad (bytes)
    leaves gaps between cache blocks."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62) if seed is None else seed)
    nq = head_dim // quant_block_size
    cache_stride = head_dim + 4 * nq + rng.choice([0, 0, 4, 12])
    need = (num_tokens + block_size - 1) // block_size
    num_blocks = num_blocks if num_blocks is not None else need + rng.randint(1, 6)
    num_slots = num_blocks * block_size
    slots = rng.sample(range(num_slots), num_tokens)
    slots = [-1 if rng.random() < pad_frac else s for s in slots]
    slot_mapping = torch.tensor(slots, dtype=torch.int64)

    rows = num_tokens + extra_rows
    row_stride = head_dim + k_row_pad
    k_store = torch.full((k_offset + rows * row_stride + 8,), float("nan"), dtype=torch.float32)
    lo, hi = (-3.0, 3.5) if dtype == torch.float16 else (-7.0, 4.0)  # inside fp16's range
    vals = random_k_values(gen, num_tokens, head_dim, quant_block_size, lo, hi)
    k_store = k_store.to(dtype)
    k_view = ((rows, head_dim), (row_stride, 1), k_offset)
    k = k_store.as_strided(*k_view)
    k[:num_tokens] = vals.to(dtype)
    if extra_rows:
        k[num_tokens:, ::2] = float("inf")  # rows past the slots: must never be read

    block_bytes = block_size * cache_stride
    guard = 64
    kv_store = torch.randint(0, 256, (2 * guard + num_blocks * (block_bytes + block_pad),), dtype=torch.uint8,
                             generator=gen)
    kv_view = ((num_blocks, block_size, cache_stride), (block_bytes + block_pad, cache_stride, 1), guard)
    desc = (f"hd={head_dim} qbs={quant_block_size} bs={block_size} {dtype} {scale_fmt} T'={num_tokens} "
            f"extra={extra_rows} k_row_pad={k_row_pad} k_offset={k_offset} block_pad={block_pad} cs={cache_stride}")
    return QuantCase(k_store, k_view, kv_store, kv_view, slot_mapping, quant_block_size, scale_fmt, desc)


def assert_no_allocation_on_a_side_stream(call, times=10):
    """After one warm-up call, ``times`` more on a fresh side stream allocate no device
    memory (the ops promise none) and complete on that stream."""
    call()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(times):
            call()
    s.synchronize()
    assert torch.cuda.memory_allocated() == before


def special_k(dt, hd=128, qbs=32):
    """Rows of quant blocks whose amax is 448 * 2^e (so the scale is 2^e in both formats and
    k / scale is exact): e4m3 ties between normals and between subnormals (round to even),
    values just beside them, zeros of both signs, results below e4m3's smallest subnormal."""
    m = torch.arange(8, dtype=torch.float64)
    normal_ties = torch.cat([(1 + (2 * m + 1) / 16) * 2.0 ** e for e in (-6, -1, 0, 3, 7)])  # between normals
    sub_ties = (2 * torch.arange(8, dtype=torch.float64) + 1) * 2.0 ** -10                    # between subnormals
    pool = torch.cat([normal_ties, -normal_ties, sub_ties, -sub_ties, normal_ties * (1 + 2.0 ** -7),
                      sub_ties * (1 - 2.0 ** -7),
                      torch.tensor([0.0, -0.0, 2.0 ** -12, -(2.0 ** -12), 2.0 ** -11, 448.0, -448.0], dtype=torch.float64)])
    rows = []
    gen = torch.Generator().manual_seed(11)
    for e in ((-4, 0, 3) if dt == torch.float16 else (-20, -4, 0, 3, 40)):
        for r in range(6):
            x = pool[torch.randint(0, pool.numel(), (hd,), generator=gen)].clone()
            x.view(-1, qbs)[:, r % qbs] = 448.0  # amax 448 in every quant block: scale 2^e
            rows.append(x * 2.0 ** e)
    return torch.stack(rows).to(dt)
