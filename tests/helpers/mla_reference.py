"""An independent reference of the MLA cache layout (concat_and_cache_mla and
cp_gather_and_upconvert_fp8_kv_cache), written from the contract (docs/contract.md §3-4,
the brief's "Semantics"), sharing no code with nvrtc_gather/ops/mla_*_torch.py or the
kernels: one token / one row at a time in Python and numpy float32 arithmetic, every byte
offset computed by hand from the strides, bytes packed with ``struct``.

Conversions are done the slow, obvious way:
- fp32 -> fp8 e4m3fn: a search over the table of all 127 non-negative finite codes, nearest
  value, ties to the even code, anything above 448 (inf included) saturating to 448, NaN -> 0x7f;
- fp32 -> bf16: truncate the bits and round the dropped 16 by hand (nearest even), NaN -> 0x7fff;
- the power-of-two tile scale by math.frexp.

Plus the case builders of the MLA tests: poisoned caches (SENTINEL bytes), padded entries and
blocks, strided inputs, ragged requests with empty ones, shuffled block tables, seq_starts,
and tiles of special values."""
from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass, field

import numpy as np
import torch

SENTINEL = 0xA5            # poison byte: every byte nobody should write holds it
RECORD = 656               # fp8_ds_mla record: 512 codes, 4 fp32 scales, 64 bf16 k_pe values
NOPE, ROPE, TILE = 512, 64, 128
DST_WIDTH = NOPE + ROPE    # the gather's bf16 values per row
F32 = np.float32
FLT_MIN = F32(1.17549435e-38)
FP8 = torch.float8_e4m3fn
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


# --- scalar conversions ------------------------------------------------------------------------

def e4m3_value(code: int) -> float:
    """The value of an fp8 e4m3fn code (exact), NaN for 0x7f / 0xff."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    if e == 0:
        return sign * m * 2.0 ** -9
    return sign * (1 + m / 8) * 2.0 ** (e - 7)


_POS_VALUES = [e4m3_value(c) for c in range(0x7F)]  # codes 0..0x7e: 0 .. 448, increasing
assert all(a < b for a, b in zip(_POS_VALUES, _POS_VALUES[1:])) and _POS_VALUES[-1] == 448.0


def e4m3_code(x) -> int:
    """fp32 ``x`` -> fp8 e4m3fn code: nearest of the table, ties to the even code, |x| > 448
    (inf included) -> 448, NaN -> 0x7f; the sign bit is x's (so -0.0 and tiny negatives -> 0x80)."""
    x = float(F32(x))
    if math.isnan(x):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a >= 448.0:
        return sign | 0x7E
    lo, hi = 0, len(_POS_VALUES) - 1   # the largest code with value <= a
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _POS_VALUES[mid] <= a:
            lo = mid
        else:
            hi = mid
    if _POS_VALUES[hi] <= a:
        lo = hi
    if _POS_VALUES[lo] == a or lo == len(_POS_VALUES) - 1:
        return sign | lo
    below, above = a - _POS_VALUES[lo], _POS_VALUES[lo + 1] - a  # exact in double
    if below < above or (below == above and lo % 2 == 0):
        return sign | lo
    return sign | (lo + 1)


def bits_f32(b: int) -> F32:
    return np.array([b], dtype=np.uint32).view(F32)[0]


def bf16_from_f32(x) -> int:
    """fp32 -> bf16 bits: nearest even by the dropped 16 bits; NaN -> 0x7fff."""
    x = F32(x)
    if np.isnan(x):
        return 0x7FFF
    u = int(np.array([x], dtype=F32).view(np.uint32)[0])
    upper, dropped = u >> 16, u & 0xFFFF
    if dropped > 0x8000 or (dropped == 0x8000 and upper & 1):
        upper += 1  # a carry into the exponent is right (up to inf)
    return upper


def value_f32(bits: int, dtype: str) -> F32:
    """The fp32 value of a 16/32-bit input element given by its bits."""
    if dtype == "bf16":
        return bits_f32(bits << 16)
    if dtype == "f16":
        return F32(np.array([bits], dtype=np.uint16).view(np.float16)[0])
    return bits_f32(bits)


def tile_scale(amax: F32, rule: str) -> F32:
    """The contract's tile scale from the tile's fp32 amax (NaN-free)."""
    with np.errstate(all="ignore"):
        s = F32(F32(amax) / F32(448.0))
    if rule == "plain":
        return max(s, FLT_MIN)
    s = max(s, F32(1e-4))
    if math.isinf(s):
        return s
    m, e = math.frexp(float(s))
    return F32(s) if m == 0.5 else F32(2.0 ** e)


# --- per-token write reference -----------------------------------------------------------------

def element_bits(t: torch.Tensor, row: int) -> list[int]:
    """The bits of row ``row`` of a 2-D bf16/fp16/fp32 tensor, one int per element."""
    x = t[row]
    if t.dtype == torch.float32:
        return [int(v) & 0xFFFFFFFF for v in x.view(torch.int32).tolist()]
    return [int(v) & 0xFFFF for v in x.view(torch.int16).tolist()]


def ds_record(kv_bits: list[int], pe_bits: list[int] | None, dtype: str, rule: str) -> bytes:
    """The 656-byte fp8_ds_mla record of one token (pe_bits None: bytes 528.. are zeros)."""
    vals = [value_f32(b, dtype) for b in kv_bits]
    codes, scales = [], []
    for t in range(4):
        tile = vals[t * TILE:(t + 1) * TILE]
        amax = F32(0.0)
        for v in tile:
            if not np.isnan(v) and abs(v) > amax:
                amax = F32(abs(v))
        s = tile_scale(amax, rule)
        scales.append(s)
        with np.errstate(all="ignore"):
            codes += [e4m3_code(F32(v / s)) for v in tile]
    out = bytes(codes) + b"".join(struct.pack("<I", int(np.array([s], dtype=F32).view(np.uint32)[0])) for s in scales)
    if pe_bits is None:
        return out + bytes(2 * ROPE)
    if dtype == "bf16":
        pe = pe_bits
    else:
        pe = [bf16_from_f32(value_f32(b, dtype)) for b in pe_bits]
    return out + b"".join(struct.pack("<H", b) for b in pe)


def plain_entry(kv_bits: list[int], pe_bits: list[int], dtype: str, mode: str, scale: F32) -> bytes:
    """One token's entry of a plain format: the bits (copy) or fp8 codes of value / scale."""
    bits = kv_bits + pe_bits
    if mode == "copy":
        fmt = "<I" if dtype == "f32" else "<H"
        return b"".join(struct.pack(fmt, b) for b in bits)
    with np.errstate(all="ignore"):
        return bytes(e4m3_code(F32(value_f32(b, dtype) / scale)) for b in bits)


PLAIN_MODES = {"auto": "copy", "bfloat16": "copy", "float16": "copy", "fp8": "fp8", "fp8_e4m3": "fp8"}


def write_reference(case: "WriteCase") -> torch.Tensor:
    """The cache's whole byte storage (uint8, flat) expected after the write of ``case``: each
    token with a slot in [0, num_slots) written at block_stride * (s // bs) + entry_stride * (s % bs)."""
    out = case.store.clone()
    kv = case.kv_cache
    nb, bs, _ = kv.shape
    esize = kv.element_size()
    base = kv.storage_offset() * esize
    block_stride, entry_stride = kv.stride(0) * esize, kv.stride(1) * esize
    dtype = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[case.kv_c.dtype]
    scale = F32(1.0) if case.skip_scale else F32(case.scale.reshape(-1)[0].item())
    for i, s in enumerate(case.slot_mapping.tolist()):
        if s < 0:
            continue
        assert s < nb * bs, "the reference is for well-formed slots"
        at = base + (s // bs) * block_stride + (s % bs) * entry_stride
        kv_bits = element_bits(case.kv_c, i)
        pe_bits = element_bits(case.k_pe, i) if case.k_pe.shape[1] else []
        if case.kv_cache_dtype == "fp8_ds_mla":
            rec = ds_record(kv_bits, pe_bits or None, dtype, case.ds_scale_rule)
            if not pe_bits:
                rec = rec[:NOPE + 16]  # bytes 528..655 untouched
        else:
            rec = plain_entry(kv_bits, pe_bits, dtype, PLAIN_MODES[case.kv_cache_dtype], scale)
        out[at: at + len(rec)] = torch.frombuffer(bytearray(rec), dtype=torch.uint8)
    return out


# --- per-row gather reference ------------------------------------------------------------------

_CODE_VALUES = np.array([e4m3_value(c) for c in range(256)], dtype=F32)  # exact in fp32


def bf16_from_f32_array(x: np.ndarray) -> np.ndarray:
    """bf16_from_f32 over a float32 array (the same explicit rounding of the dropped 16 bits)."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    upper, dropped = u >> 16, u & 0xFFFF
    up = (dropped > 0x8000) | ((dropped == 0x8000) & ((upper & 1) == 1))
    out = (upper + up).astype(np.uint32)
    return np.where(np.isnan(x), np.uint32(0x7FFF), out).astype(np.uint16)


def upconvert_record(rec: bytes) -> bytes:
    """One 656-byte record -> its 1152-byte bf16 row: code * tile scale (one fp32 multiply),
    to bf16 nearest even (NaN -> 0x7fff), then the record's k_pe bytes."""
    codes = np.frombuffer(rec[:NOPE], dtype=np.uint8)
    scales = np.frombuffer(rec[NOPE:NOPE + 16], dtype="<f4").astype(F32)
    with np.errstate(all="ignore"):
        prod = _CODE_VALUES[codes] * np.repeat(scales, TILE)  # float32 * float32: one IEEE multiply each
    assert prod.dtype == F32
    return bf16_from_f32_array(prod).astype("<u2").tobytes() + rec[NOPE + 16:]


def gather_reference(case: "GatherCase") -> torch.Tensor:
    """dst's whole byte storage (uint8, flat) expected after the gather of ``case``."""
    out = case.dst_store.clone()
    src = case.src_store
    c = case.src_cache
    bs = c.shape[1]
    src_base = c.storage_offset()
    block_stride, entry_stride = c.stride(0), c.stride(1)
    dst_base, dst_row = case.dst.storage_offset() * 2, case.dst.stride(0) * 2
    num_rows = case.dst.shape[0]
    ws = case.workspace_starts.tolist()[:case.batch]
    seq = case.seq_starts.tolist()[:case.batch] if case.seq_starts is not None else [0] * case.batch
    for r in range(case.batch):
        start = min(ws[r], num_rows)
        stop = min(ws[r + 1] if r + 1 < case.batch else num_rows, num_rows)
        for t in range(start, stop):
            pos = seq[r] + (t - ws[r])
            blk = int(case.block_table[r, pos // bs])
            at = src_base + blk * block_stride + (pos % bs) * entry_stride
            row = upconvert_record(bytes(src[at: at + RECORD].tolist()))
            out[dst_base + t * dst_row: dst_base + t * dst_row + 2 * DST_WIDTH] = \
                torch.frombuffer(bytearray(row), dtype=torch.uint8)
    return out


def gather_row_readings(src_cache, block_table, ws: list, seq: list | None, batch: int, num_rows: int,
                        row: int) -> list[tuple[int, int]]:
    """(block, entry) of every reading of dst row ``row`` that the (possibly malformed) indices
    allow: a request r < batch with 0 <= ws[r] <= row < its stop (ws[r + 1], or num_rows for
    the last), seq[r] >= 0, column (seq[r] + row - ws[r]) // block_size < max_blocks holding an
    id in [0, num_blocks). Exact integers. At most one for non-negative, non-decreasing ws."""
    nb, bs, _ = src_cache.shape
    out = []
    for r in range(batch):
        stop = ws[r + 1] if r + 1 < batch else num_rows
        first = seq[r] if seq is not None else 0
        if 0 <= ws[r] <= row < stop and first >= 0:
            pos = first + row - ws[r]
            j = pos // bs
            if j < block_table.shape[1]:
                b = int(block_table[r, j])
                if 0 <= b < nb:
                    out.append((b, pos % bs))
    return out


def record_bytes(src_cache, block: int, entry: int) -> bytes:
    """The 656 bytes of one record of a uint8 / fp8 [nb, bs, 656] view."""
    return bytes(src_cache.view(torch.uint8)[block, entry].tolist())


# --- values ------------------------------------------------------------------------------------

SPECIAL_TILES = ("zeros", "neg_zeros", "huge", "pow2_huge", "tiny", "subnormal", "nan", "all_nan", "inf", "neg_inf",
                 "s336", "ties", "max448")


def special_tile(kind: str, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """128 values of one kind (fp32, exactly representable in ``dtype``)."""
    base = torch.randn(TILE, generator=gen)
    big = {torch.bfloat16: 3.3e38, torch.float16: 65504.0, torch.float32: 3.3e38}[dtype]
    if kind == "zeros":
        t = torch.zeros(TILE)
    elif kind == "neg_zeros":
        t = -torch.zeros(TILE)
    elif kind == "huge":  # near the type's max
        t = base.sign() * big * torch.rand(TILE, generator=gen).clamp(min=0.5)
        t[3] = big
    elif kind == "pow2_huge":  # amax = 448 * 2^k exactly: a power-of-two scale with no rounding up
        k = 10 if dtype == torch.float16 else 100
        t = base.clamp(-1, 1) * 448.0 * 2.0 ** k
        t[5] = -448.0 * 2.0 ** k
    elif kind == "tiny":  # amax far below 448e-4: the 1e-4 floor
        t = base * 1e-6
    elif kind == "subnormal":  # the input type's subnormals
        sub = {torch.bfloat16: 1e-39, torch.float16: 3e-6, torch.float32: 1e-40}[dtype]
        t = base * sub
    elif kind == "nan":
        t = base * 10
        t[[0, 7, 64, 127]] = float("nan")
    elif kind == "all_nan":
        t = torch.full((TILE,), float("nan"))
    elif kind == "inf":
        t = base
        t[9] = float("inf")
    elif kind == "neg_inf":
        t = base
        t[1] = float("-inf")
    elif kind == "s336":  # 336 / 448 = 0.75: pow2 scale exactly 1
        t = torch.full((TILE,), 336.0)
    elif kind == "ties":  # values halfway between fp8 codes at scale 1 (amax 336 -> scale 1 under pow2)
        t = torch.tensor([(1 + (2 * (i % 8) + 1) / 16) * 2.0 ** (i % 9 - 4) for i in range(TILE)])
        t[0] = 336.0
        t[1] = 3 * 2.0 ** -10   # e4m3 subnormal tie
        t[2] = -(2.0 ** -10)
    else:  # max448: amax exactly 448 (plain rule: scale 1)
        t = base.clamp(-1, 1) * 300
        t[0] = 448.0
    return t.to(dtype).float()


def random_rows(gen: torch.Generator, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows of ``width`` values with a magnitude of its own per 128-value tile."""
    tiles = -(-width // TILE)
    mag = 2.0 ** torch.randint(-12, 9, (rows, tiles), generator=gen).float()
    x = torch.randn(rows, tiles * TILE, generator=gen) * mag.repeat_interleave(TILE, dim=1)
    return x[:, :width].to(dtype)


# --- write cases -------------------------------------------------------------------------------

@dataclass
class WriteCase:
    kv_c: torch.Tensor
    k_pe: torch.Tensor
    kv_cache: torch.Tensor
    slot_mapping: torch.Tensor
    kv_cache_dtype: str
    scale: torch.Tensor
    skip_scale: bool
    ds_scale_rule: str
    store: torch.Tensor = field(repr=False)   # the cache's whole storage, uint8 flat
    desc: str = ""

    def args(self):
        return (self.kv_c, self.k_pe, self.kv_cache, self.slot_mapping, self.kv_cache_dtype, self.scale,
                self.skip_scale, self.ds_scale_rule)

    def clone(self) -> "WriteCase":
        """The same case with its own copy of the cache storage (same strides)."""
        store = self.store.clone()
        kv = store.view(self.kv_cache.dtype) if self.kv_cache.dtype != torch.uint8 else store
        kv = kv.as_strided(self.kv_cache.shape, self.kv_cache.stride(), self.kv_cache.storage_offset())
        return WriteCase(self.kv_c, self.k_pe, kv, self.slot_mapping, self.kv_cache_dtype, self.scale,
                         self.skip_scale, self.ds_scale_rule, store, self.desc)


def make_write_case(rng: random.Random, *, fmt="fp8_ds_mla", dtype=torch.bfloat16, block_size=16, num_tokens=20,
                    num_blocks=None, pe_dim=64, rank=NOPE, rule="pow2", skip_scale=False, scale=None,
                    fused=False, entry_pad=0, block_pad=0, kv_offset=0, input_offset=0, extra_rows=0,
                    pad_frac=0.2, specials=(), fp8_view=False) -> WriteCase:
    """A write case on CPU: random rows (``specials``: tiles of SPECIAL_TILES kinds placed in
    random tokens), a cache poisoned with SENTINEL whose entries / blocks may be padded
    (``entry_pad`` / ``block_pad`` elements) and start ``kv_offset`` bytes into its storage,
    distinct random slots with a ``pad_frac`` share of -1. ``fused``: kv_c and k_pe are column
    slices of one [T, rank + pe_dim] tensor (vLLM's kv_a output); ``input_offset``: that
    storage starts that many elements in (misaligning the inputs)."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    rows = num_tokens + extra_rows
    if fused:
        whole = torch.empty(input_offset + rows * (rank + pe_dim) + 8, dtype=dtype)
        x = whole[input_offset: input_offset + rows * (rank + pe_dim)].view(rows, rank + pe_dim)
        kv_c, k_pe = x[:, :rank], x[:, rank:]
    else:
        kv_c = torch.empty(input_offset + rows * rank, dtype=dtype)[input_offset:].view(rows, rank)
        k_pe = torch.empty(input_offset + rows * pe_dim + 8, dtype=dtype)[input_offset: input_offset + rows * pe_dim]
        k_pe = k_pe.view(rows, pe_dim)
    kv_c.copy_(random_rows(gen, rows, rank, dtype))
    k_pe.copy_(random_rows(gen, rows, pe_dim, dtype) if pe_dim else k_pe)
    if extra_rows:  # rows past slot_mapping: never read
        kv_c[num_tokens:] = float("nan")
    for kind in specials:
        tok, tile = rng.randrange(num_tokens), rng.randrange(max(1, rank // TILE))
        kv_c[tok, tile * TILE:(tile + 1) * TILE] = special_tile(kind, dtype, gen)[:min(TILE, rank)].to(dtype)
        if pe_dim and rng.random() < 0.5:
            k_pe[tok] = special_tile(kind, dtype, gen)[:pe_dim].to(dtype)
    if "s336" in specials and rank == NOPE:  # the contract's example: scales [1, 1, 1, 2^-13]
        kv_c[0, :3 * TILE] = 336.0
        kv_c[0, 3 * TILE:] = 0.0

    width = RECORD if fmt == "fp8_ds_mla" else rank + pe_dim
    if fmt in ("fp8_ds_mla", "fp8", "fp8_e4m3"):
        cache_dtype = torch.uint8
    else:
        cache_dtype = dtype
    esize = torch.tensor([], dtype=cache_dtype).element_size()
    nb = num_blocks if num_blocks is not None else max(1, -(-num_tokens // block_size) + rng.randint(0, 2))
    entry = width + entry_pad
    blk = block_size * entry + block_pad
    assert kv_offset % esize == 0
    store = torch.full((kv_offset + nb * blk * esize + 64,), SENTINEL, dtype=torch.uint8)
    kv = store.view(cache_dtype) if cache_dtype != torch.uint8 else store
    kv = kv.as_strided((nb, block_size, width), (blk, entry, 1), kv_offset // esize)
    if fp8_view and cache_dtype == torch.uint8:
        kv = kv.view(FP8)

    n_slots = nb * block_size
    slots = rng.sample(range(n_slots), min(n_slots, num_tokens))
    slots += [-1] * (num_tokens - len(slots))
    slots = [-1 if rng.random() < pad_frac else s for s in slots]
    rng.shuffle(slots)
    if specials and num_tokens and slots[0] < 0:  # token 0 holds the contract's example: write it
        free = sorted(set(range(n_slots)) - set(slots))
        slots[0] = free[0] if free else slots[0]
    sm = torch.tensor(slots, dtype=torch.int64)
    if scale is None:
        scale = torch.tensor([rng.choice([1.0, 0.5, 3.0, 2.0 ** -7, 0.0137])], dtype=torch.float32)
    desc = (f"fmt={fmt} dtype={dtype} bs={block_size} nb={nb} T={num_tokens} pe={pe_dim} rank={rank} rule={rule} "
            f"skip={skip_scale} scale={scale.tolist()} fused={fused} entry_pad={entry_pad} block_pad={block_pad} "
            f"kv_offset={kv_offset} input_offset={input_offset} specials={specials}")
    return WriteCase(kv_c, k_pe, kv, sm, fmt, scale, skip_scale, rule, store, desc)


# --- gather cases ------------------------------------------------------------------------------

@dataclass
class GatherCase:
    src_cache: torch.Tensor
    dst: torch.Tensor
    block_table: torch.Tensor
    workspace_starts: torch.Tensor
    batch: int
    seq_starts: torch.Tensor | None
    src_store: torch.Tensor = field(repr=False)   # uint8 flat
    dst_store: torch.Tensor = field(repr=False)   # uint8 flat
    desc: str = ""

    def args(self):
        return self.src_cache, self.dst, self.block_table, self.workspace_starts, self.batch, self.seq_starts

    def clone(self) -> "GatherCase":
        store = self.dst_store.clone()
        dst = store.view(torch.bfloat16).as_strided(self.dst.shape, self.dst.stride(), self.dst.storage_offset())
        return GatherCase(self.src_cache, dst, self.block_table, self.workspace_starts, self.batch, self.seq_starts,
                          self.src_store, store, self.desc)


def fill_records(rng: random.Random, gen: torch.Generator, cache: torch.Tensor, dtype=torch.bfloat16,
                 garbage_frac=0.1) -> None:
    """Write a real record into most entries of a uint8 [nb, bs, 656] cache view (values of
    their own scale, some special tiles); the others keep random bytes (any scale, NaN codes)."""
    nb, bs, _ = cache.shape
    for b in range(nb):
        for t in range(bs):
            if rng.random() < garbage_frac:
                continue
            x = random_rows(gen, 1, NOPE, dtype)
            if rng.random() < 0.3:
                tile = rng.randrange(4)
                x[0, tile * TILE:(tile + 1) * TILE] = special_tile(rng.choice(SPECIAL_TILES), dtype, gen).to(dtype)
            pe = random_rows(gen, 1, ROPE, dtype)
            rec = ds_record(element_bits(x, 0), element_bits(pe, 0), "bf16" if dtype == torch.bfloat16 else "f16",
                            rng.choice(["pow2", "plain"]))
            cache[b, t] = torch.frombuffer(bytearray(rec), dtype=torch.uint8)


def make_gather_case(rng: random.Random, *, batch=5, block_size=16, lens=None, max_len=40, seq_starts=None,
                     first_row=None, tail_past=0, entry_pad=0, block_pad=0, dst_pad=0, src_offset=0, dst_offset=0,
                     extra_batch_rows=0, records=True, fp8_view=None) -> GatherCase:
    """A gather case on CPU: ``batch`` requests of ``lens`` tokens (random, some empty), rows
    starting at ``first_row`` (rows before it belong to nobody), ``tail_past`` trailing
    requests whose workspace start lies past the last row (empty), ``seq_starts`` (True: random
    starting tokens, None: random choice, False: none), shuffled physical blocks; block_table
    columns no row reads hold garbage (-7, 2^30), as do index entries past ``batch``
    (``extra_batch_rows``); dst poisoned with SENTINEL (rows ``dst_pad`` elements apart extra,
    storage offsets in bytes: ``src_offset`` % 4 == 0, ``dst_offset`` % 4 == 0 for the op)."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    if lens is None:
        lens = [0 if rng.random() < 0.2 else rng.randint(1, max_len) for _ in range(batch)]
    batch = len(lens)
    if seq_starts is None:
        seq_starts = rng.random() < 0.5
    first = [rng.randint(0, 2 * block_size + 3) if seq_starts else 0 for _ in range(batch)]
    first_row = rng.choice([0, 0, 3]) if first_row is None else first_row
    tail_past = min(tail_past, batch - 1) if batch else 0
    lens = list(lens[:batch - tail_past]) + [0] * tail_past
    ws = []
    row = first_row
    for n in lens:
        ws.append(row)
        row += n
    num_rows = row
    for i in range(batch - tail_past, batch):  # trailing requests starting past the rows: empty (the
        ws[i] = max(ws[i - 1], num_rows) + rng.randint(1, 5)  # one before them runs to num_rows)
    need = [-(-(first[r] + lens[r]) // block_size) for r in range(batch)]
    max_blocks = max([1] + need) + rng.randint(0, 2)
    total_blocks = sum(need) + rng.randint(1, 3)
    perm = list(range(total_blocks))
    rng.shuffle(perm)
    it = iter(perm)
    bt_rows = batch + extra_batch_rows
    bt = torch.full((max(1, bt_rows), max_blocks), -7, dtype=torch.int32)
    for r in range(batch):
        for j in range(max_blocks):
            if first[r] // block_size <= j < need[r]:
                bt[r, j] = next(it)
            elif j < first[r] // block_size:
                bt[r, j] = rng.choice([-7, 1 << 30])  # before seq_starts: never read
            else:
                bt[r, j] = rng.randrange(total_blocks)  # past the request: valid-looking, never read
    for r in range(batch, bt_rows):
        bt[r] = 1 << 30
    ws_t = torch.tensor(ws + [-5] * extra_batch_rows, dtype=torch.int32)
    seq_t = torch.tensor(first + [-9] * extra_batch_rows, dtype=torch.int32) if seq_starts else None

    entry = RECORD + entry_pad
    blk = block_size * entry + block_pad
    src_store = torch.randint(0, 256, (src_offset + total_blocks * blk + 32,), dtype=torch.uint8, generator=gen)
    src = src_store.as_strided((total_blocks, block_size, RECORD), (blk, entry, 1), src_offset)
    if records:
        fill_records(rng, gen, src)
    if fp8_view is None:
        fp8_view = rng.random() < 0.3
    if fp8_view:
        src = src.view(FP8)

    row_elems = DST_WIDTH + dst_pad
    assert dst_offset % 2 == 0
    dst_store = torch.full((dst_offset + 2 * row_elems * max(1, num_rows) + 64,), SENTINEL, dtype=torch.uint8)
    dst = dst_store.view(torch.bfloat16).as_strided((num_rows, DST_WIDTH), (row_elems, 1), dst_offset // 2)
    desc = (f"batch={batch} lens={lens} ws={ws} seq_starts={first if seq_starts else None} bs={block_size} "
            f"num_rows={num_rows} max_blocks={max_blocks} entry_pad={entry_pad} block_pad={block_pad} "
            f"dst_pad={dst_pad} src_offset={src_offset} dst_offset={dst_offset}")
    return GatherCase(src, dst, bt, ws_t, batch, seq_t, src_store, dst_store, desc)
