"""Random cases of the MLA-cache ops (concat_and_cache_mla, cp_gather_and_upconvert_fp8_kv_cache)
for the GPU tests (tests/gpu/test_mla_gpu.py): CPU tensors laid out as views of flat stores
with guard bytes around them (strides, offsets and pads chosen by the caller), so that a GPU
copy keeps every pointer's alignment and every stray byte shows. The expected bytes come from
running the op on the CPU case (its torch path), compared store against store."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from nvrtc_gather.ops.mla_write_torch import ds_records
from helpers.reference import SENTINEL

FP8 = torch.float8_e4m3fn
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
RECORD, NOPE, ROPE, TILE, ROW = 656, 512, 64, 128, 576
GUARD = 64  # bytes (or elements) of store before the first view element: 16-byte aligned
# Kinds of 128-value tiles (and of k_pe rows): "normal" is random magnitudes; the rest are the
# edge cases of the scale and the conversions.
TILE_KINDS = ("normal", "zeros", "huge", "tiny", "nan", "all_nan", "inf", "ties")


def tile_values(gen: torch.Generator, kind: str, count: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """[count, n] fp32 values: ``count`` tiles of ``kind``, representable in (or meant to round
    into) ``dtype``."""
    f16 = dtype == F16
    shape = (count, n)
    sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
    if kind == "zeros":
        return sign * 0.0  # +0 and -0
    if kind == "huge":
        top = 65504.0 if f16 else 3.3e38
        return sign * top * torch.empty(shape).uniform_(0.25, 1.0, generator=gen)
    if kind == "tiny":  # subnormals of the input dtype
        return torch.randn(shape, generator=gen) * (3e-6 if f16 else 1e-39 if dtype == BF16 else 1e-41)
    rows = torch.arange(count)
    if kind == "ties":  # e4m3 ties between normals and between subnormals, amax 448 * 2^E: scale 2^E
        e_big = torch.randint(-3, 6, (count, 1), generator=gen).to(F32)
        m = torch.randint(0, 8, shape, generator=gen).to(F32)
        e = torch.randint(-6, 8, shape, generator=gen).to(F32)
        normal = (1 + (2 * m + 1) / 16) * torch.pow(2.0, e)
        sub = (2 * m + 1) * 2.0 ** -10
        x = torch.where(torch.rand(shape, generator=gen) < 0.7, normal, sub) * sign
        x[rows, torch.randint(0, n, (count,), generator=gen)] = 448.0
        return x * torch.pow(2.0, e_big)
    lo, hi = (-3.0, 3.5) if f16 else (-6.0, 4.0)
    mag = torch.pow(10.0, torch.empty(count, 1).uniform_(lo, hi, generator=gen))
    x = torch.randn(shape, generator=gen) * mag
    if kind == "nan":
        x[torch.rand(shape, generator=gen) < 0.1] = float("nan")
    elif kind == "all_nan":
        x[:] = float("nan")
    elif kind == "inf":
        x[rows, torch.randint(0, n, (count,), generator=gen)] = float("inf")
        x[rows, torch.randint(0, n, (count,), generator=gen)] = float("-inf")
    return x


def row_values(gen, rows: int, width: int, dtype, kinds=TILE_KINDS, normal_weight: int = 4) -> torch.Tensor:
    """[rows, width] values of ``dtype``, each 128-value tile of a row (the last one of a row
    may be shorter) a random kind, ``normal`` ``normal_weight`` times as likely as each other."""
    out = torch.empty(rows, width)
    if rows == 0 or width == 0:
        return out.to(dtype)
    weights = torch.tensor([float(normal_weight if k == "normal" else 1) for k in kinds])
    for a in range(0, width, TILE):
        n = min(TILE, width - a)
        pick = torch.multinomial(weights, rows, replacement=True, generator=gen)
        for i, kind in enumerate(kinds):
            sel = torch.nonzero(pick == i).flatten()
            if sel.numel():
                out[sel, a:a + n] = tile_values(gen, kind, sel.numel(), n, dtype)
    return out.to(dtype)


@dataclass
class Strided:
    """A view of a flat store: ``store.as_strided(shape, stride, offset)`` (in the store's
    elements), optionally reinterpreted as ``dtype`` (same element size)."""

    store: torch.Tensor
    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype | None = None

    def view(self) -> torch.Tensor:
        t = self.store.as_strided(self.shape, self.stride, self.offset)
        return t.view(self.dtype) if self.dtype is not None else t

    def to(self, device) -> "Strided":
        """The same view of a copy of the store on ``device`` (alignment kept: stores start at
        least 64-byte aligned on CPU and GPU alike)."""
        return Strided(self.store.to(device, copy=True), self.shape, self.stride, self.offset, self.dtype)

    def bytes(self) -> torch.Tensor:
        return self.store.view(torch.uint8)


def _rows_view(dtype, rows: int, width: int, row_pad: int, offset: int, fill: torch.Tensor | None, gen) -> Strided:
    """[rows, width] of ``dtype`` at ``offset`` elements past GUARD, rows ``width + row_pad``
    apart, in a store of garbage (NaN / inf / random: never to be read)."""
    stride = width + row_pad
    n = GUARD + offset + rows * stride + GUARD
    store = torch.randn(n, generator=gen).to(dtype)
    store[::5] = float("nan")
    store[1::7] = float("inf")
    s = Strided(store, (rows, width), (stride, 1), GUARD + offset)
    if fill is not None:
        s.view()[:fill.shape[0]] = fill
    return s


# -- concat_and_cache_mla -----------------------------------------------------------------------

@dataclass
class WriteCase:
    kv_c: Strided
    k_pe: Strided
    cache: Strided
    slot_mapping: torch.Tensor
    kv_cache_dtype: str
    scale: torch.Tensor
    skip_scale: bool
    rule: str
    block_size: int
    num_blocks: int
    desc: str

    def args(self):
        return (self.kv_c.view(), self.k_pe.view(), self.cache.view(), self.slot_mapping, self.kv_cache_dtype,
                self.scale, self.skip_scale, self.rule)

    def to(self, device) -> "WriteCase":
        return WriteCase(self.kv_c.to(device), self.k_pe.to(device), self.cache.to(device),
                         self.slot_mapping.to(device), self.kv_cache_dtype, self.scale.to(device), self.skip_scale,
                         self.rule, self.block_size, self.num_blocks, self.desc)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size


def make_write_case(rng: random.Random, *, fmt: str = "fp8_ds_mla", dtype=BF16, block_size: int = 16,
                    num_tokens: int = 50, rank: int = NOPE, pe_dim: int = ROPE, rule: str = "pow2",
                    skip_scale: bool = False, cache_fp8: bool = False, kinds=TILE_KINDS, values=None,
                    kv_c_offset: int = 0, kv_c_row_pad: int = 0, k_pe_offset: int = 0, k_pe_row_pad: int = 0,
                    entry_pad: int = 0, block_pad: int = 0, cache_offset: int = 0, num_blocks: int | None = None,
                    pad_frac: float = 0.15, extra_rows: int = 3, scale_value: float | None = None) -> WriteCase:
    """A random CPU case of concat_and_cache_mla. Offsets and pads are in elements of the
    tensor's store (bytes for a uint8 cache); ``values``: (kv_c, k_pe) rows to use instead
    of random tiles of ``kinds``. Slots are distinct, ``pad_frac`` of them negative
    (padding); rows past len(slot_mapping) and every pad hold garbage; the cache, its guards
    and the gaps between entries and blocks random bytes."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    if values is None:
        kv = row_values(gen, num_tokens, rank, dtype, kinds)
        pe = row_values(gen, num_tokens, pe_dim, dtype, kinds) if pe_dim else torch.empty(num_tokens, 0, dtype=dtype)
    else:
        kv, pe = values
        num_tokens = kv.shape[0]
    rows = num_tokens + extra_rows
    kv_c = _rows_view(dtype, rows, rank, kv_c_row_pad, kv_c_offset, kv, gen)
    k_pe = _rows_view(dtype, rows, pe_dim, k_pe_row_pad, k_pe_offset, pe, gen)
    ds = fmt == "fp8_ds_mla"
    fp8 = fmt in ("fp8", "fp8_e4m3")
    width = RECORD if ds else rank + pe_dim
    cache_dtype = torch.uint8 if ds or fp8 else dtype
    need = -(-num_tokens // block_size)
    num_blocks = num_blocks if num_blocks is not None else need + rng.randint(1, 5)
    entry = width + entry_pad
    block = block_size * entry + block_pad
    n = GUARD + cache_offset + num_blocks * block + GUARD
    store = torch.randint(0, 256, (n * torch.empty(0, dtype=cache_dtype).element_size(),), dtype=torch.uint8,
                          generator=gen).view(cache_dtype)
    cache = Strided(store, (num_blocks, block_size, width), (block, entry, 1), GUARD + cache_offset,
                    FP8 if cache_fp8 and cache_dtype == torch.uint8 else None)
    slots = rng.sample(range(num_blocks * block_size), num_tokens)
    slots = [(-1 if rng.random() < 0.7 else -rng.randint(2, 1 << 40)) if rng.random() < pad_frac else s
             for s in slots]
    if scale_value is None:
        scale_value = rng.choice([1.0, 0.0371, 3.5, 2.0 ** -7, 1000.0])
    scale = torch.tensor([scale_value], dtype=F32)
    desc = (f"{fmt} {dtype} bs={block_size} T={num_tokens} rank={rank} pe={pe_dim} rule={rule} skip={skip_scale} "
            f"fp8cache={cache_fp8} kv_c(off={kv_c_offset}, pad={kv_c_row_pad}) k_pe(off={k_pe_offset}, "
            f"pad={k_pe_row_pad}) cache(entry_pad={entry_pad}, block_pad={block_pad}, off={cache_offset}) "
            f"scale={scale_value}")
    return WriteCase(kv_c, k_pe, cache, torch.tensor(slots, dtype=torch.int64), fmt, scale, skip_scale, rule,
                     block_size, num_blocks, desc)


# -- cp_gather_and_upconvert_fp8_kv_cache -------------------------------------------------------

@dataclass
class GatherCase:
    cache: Strided
    dst: Strided
    block_table: torch.Tensor
    workspace_starts: torch.Tensor
    batch: int
    seq_starts: torch.Tensor | None
    lens: list
    firsts: list          # each request's first token (seq_starts or 0)
    ws0: int              # dst rows before it belong to no request
    desc: str

    def args(self):
        return (self.cache.view(), self.dst.view(), self.block_table, self.workspace_starts, self.batch,
                self.seq_starts)

    def to(self, device) -> "GatherCase":
        return GatherCase(self.cache.to(device), self.dst.to(device), self.block_table.to(device),
                          self.workspace_starts.to(device), self.batch,
                          None if self.seq_starts is None else self.seq_starts.to(device), self.lens, self.firsts,
                          self.ws0, self.desc)

    @property
    def num_rows(self) -> int:
        return self.dst.shape[0]


def ragged(rng: random.Random, batch: int, mean: int, empty_frac: float = 0.15) -> list[int]:
    return [0 if rng.random() < empty_frac else max(1, int(rng.uniform(0.3, 1.7) * mean)) for _ in range(batch)]


def make_gather_case(rng: random.Random, *, lens: list[int], block_size: int = 16, seq_starts: bool = False,
                     cu_style: bool = True, ws0: int = 0, cu_tail: int = 0, src_fp8: bool = False,
                     entry_pad: int = 0, block_pad: int = 0, cache_offset: int = 0, dst_offset: int = 0,
                     dst_row_pad: int = 0, extra_blocks: int = 3, garbage_cols: int = 2, records: str = "random",
                     kinds=TILE_KINDS, dtype=BF16, pow2: bool = True, all_columns_valid: bool = False,
                     num_blocks: int | None = None) -> GatherCase:
    """A random CPU case of the gather. Request r reads its tokens [first_r, first_r + lens[r])
    (first_r random with ``seq_starts``, else 0) through shuffled physical blocks; unused
    block_table columns hold garbage (never read), unless ``all_columns_valid``. dst has
    ``ws0`` rows before the first request (never touched), is poisoned with SENTINEL, and
    sits ``dst_offset`` elements into a store with ``dst_row_pad`` elements between rows.
    ``cu_style``: workspace_starts has batch + 1 entries (cu_seq_lens), the last one (never
    read) ``cu_tail`` short of the truth. ``records``: "random" bytes, or "written": each
    entry the fp8_ds_mla record of random tiles of ``kinds`` (``dtype`` input, ``pow2`` rule)."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    batch = len(lens)
    firsts = [rng.randint(0, 3 * block_size) if seq_starts else 0 for _ in range(batch)]
    cols = [range(f // block_size, -(-(f + n) // block_size)) if n else range(0) for f, n in zip(firsts, lens)]
    num_rows = ws0 + sum(lens)
    need = sum(len(c) for c in cols)
    max_blocks = max([c.stop for c in cols] + [1]) + garbage_cols
    if all_columns_valid:
        max_blocks = max(max_blocks, -(-(max(firsts + [0]) + num_rows) // block_size) + 2)
    num_blocks = num_blocks if num_blocks is not None else need + extra_blocks
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    garbage = [-7, -1, num_blocks, num_blocks + 12345, 2 ** 31 - 1, -2 ** 31]
    bt = torch.tensor([[rng.choice(garbage) for _ in range(max_blocks)] for _ in range(batch + 1)], dtype=torch.int32)
    if all_columns_valid:
        bt = torch.randint(0, num_blocks, bt.shape, dtype=torch.int32, generator=gen)
    it = iter(ids)
    for r, c in enumerate(cols):
        for j in c:
            bt[r, j] = next(it)
    starts = [ws0]
    for n in lens:
        starts.append(starts[-1] + n)
    ws = starts if cu_style else starts[:-1]
    if cu_style:
        ws = ws[:-1] + [ws[-1] - cu_tail]
    entry = RECORD + entry_pad
    block = block_size * entry + block_pad
    n = GUARD + cache_offset + num_blocks * block + GUARD
    store = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    cache = Strided(store, (num_blocks, block_size, RECORD), (block, entry, 1), GUARD + cache_offset,
                    FP8 if src_fp8 else None)
    if records == "written":
        total = num_blocks * block_size
        rec = ds_records(row_values(gen, total, NOPE, dtype, kinds), row_values(gen, total, ROPE, dtype, kinds), pow2)
        cache.store.as_strided((num_blocks, block_size, RECORD), (block, entry, 1), GUARD + cache_offset)[:] = \
            rec.view(num_blocks, block_size, RECORD)
    dst_stride = ROW + dst_row_pad
    dn = GUARD + dst_offset + num_rows * dst_stride + GUARD
    dst_store = torch.full((dn,), 0, dtype=BF16)
    dst_store.view(torch.uint8).fill_(SENTINEL)
    dst = Strided(dst_store, (num_rows, ROW), (dst_stride, 1), GUARD + dst_offset)
    seq = torch.tensor(firsts, dtype=torch.int32) if seq_starts else None
    desc = (f"bs={block_size} batch={batch} rows={num_rows} ws0={ws0} seq_starts={seq_starts} cu={cu_style} "
            f"tail={cu_tail} fp8src={src_fp8} cache(entry_pad={entry_pad}, block_pad={block_pad}, "
            f"off={cache_offset}) dst(off={dst_offset}, pad={dst_row_pad}) records={records}")
    return GatherCase(cache, dst, bt, torch.tensor(ws, dtype=torch.int32), batch, seq, list(lens), firsts, ws0, desc)
