"""An independent reference of cp_gather_cache and gather_and_maybe_dequant_cache, written
from the contract (docs/contract.md §6) and issue #27's "The ops", sharing no code with
nvrtc_gather/ops/cache_gather*.py or the kernel: one request and one row at a time in Python,
every byte offset computed by hand from the strides, conversions by table and numpy float32
arithmetic (fp8 code -> exact value by its bit fields, one float32 multiply, then bf16 by
rounding the dropped 16 bits by hand / fp16 by numpy's nearest-even cast; NaN -> the GPU's
canonical NaN: bf16 / fp16 0x7fff, fp32 0x7fffffff).

Plus the case builder: poisoned destinations (SENTINEL bytes), padded entries and blocks,
strided destinations, ragged requests with empty ones, shuffled block tables, seq_starts, fp8
codes of every kind (NaN, inf, subnormal) and entries of any dtype."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch

from helpers.mla_reference import bf16_from_f32_array, e4m3_value

SENTINEL = 0xA5
F32 = np.float32
OUT_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
KV_CACHE_DTYPES = {"e4m3": ("fp8", "fp8_e4m3"), "e5m2": ("fp8_e5m2",)}


def e5m2_value(code: int) -> float:
    """The value of an fp8 e5m2 code (exact): inf for 0x7c / 0xfc, NaN for mantissa != 0 there."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 2) & 0x1F, code & 3
    if e == 0x1F:
        return math.nan if m else sign * math.inf
    if e == 0:
        return sign * m * 2.0 ** -16
    return sign * (1 + m / 4) * 2.0 ** (e - 15)


_VALUES = {"e4m3": np.array([e4m3_value(c) for c in range(256)], dtype=F32),
           "e5m2": np.array([e5m2_value(c) for c in range(256)], dtype=F32)}


def convert_row(raw: bytes, conversion: str, scale: float) -> bytes:
    """One entry's source bytes -> the bytes its destination row receives."""
    if conversion == "copy":
        return raw
    fp8, out = conversion.split("_")
    with np.errstate(all="ignore"):
        x = _VALUES[fp8][np.frombuffer(raw, dtype=np.uint8)] * F32(scale)
    assert x.dtype == F32
    nan = np.isnan(x)
    if out == "bf16":
        return bf16_from_f32_array(x).astype("<u2").tobytes()
    if out == "f16":
        with np.errstate(all="ignore"):
            h = x.astype(np.float16).view(np.uint16)
        return np.where(nan, np.uint16(0x7FFF), h).astype("<u2").tobytes()
    return np.where(nan, np.uint32(0x7FFFFFFF), x.view(np.uint32)).astype("<u4").tobytes()


def row_readings(block_table, cu: list, seq: list | None, batch: int, num_rows: int, block_size: int,
                 num_blocks: int, row: int) -> list[tuple[int, int]]:
    """(block, slot) of every reading of dst row ``row`` the (possibly malformed) indices allow:
    a request r < batch with 0 <= cu[r] <= row < min(cu[r + 1], num_rows), seq[r] >= 0, column
    (seq[r] + row - cu[r]) // block_size < max_blocks holding an id in [0, num_blocks). At most
    one for non-negative, non-decreasing cu."""
    out = []
    for r in range(batch):
        first = seq[r] if seq is not None else 0
        if 0 <= cu[r] <= row < min(cu[r + 1], num_rows) and first >= 0:
            pos = first + row - cu[r]
            j = pos // block_size
            if j < block_table.shape[1]:
                b = int(block_table[r, j])
                if 0 <= b < num_blocks:
                    out.append((b, pos % block_size))
    return out


@dataclass
class CacheCase:
    src_store: torch.Tensor    # uint8 storage of src_cache
    src_cache: torch.Tensor    # [nb, bs, entry...] view into it (padded entries / blocks)
    dst_store: torch.Tensor    # uint8 storage of dst, poisoned
    dst: torch.Tensor          # [rows, entry...] view into it (padded rows)
    block_table: torch.Tensor
    cu_seq_lens: torch.Tensor
    seq_starts: torch.Tensor | None
    scale: torch.Tensor
    num_rows: int              # T: dst.size(0) for cp_gather_cache, num_tokens for the other
    conversion: str            # "copy" or "<fp8>_<out>"
    desc: str

    @property
    def batch(self) -> int:
        return self.cu_seq_lens.shape[0] - 1

    def cp_args(self):
        return self.src_cache, self.dst, self.block_table, self.cu_seq_lens, self.batch, self.seq_starts

    def dequant_args(self, kv_cache_dtype: str | None = None):
        if kv_cache_dtype is None:
            kv_cache_dtype = "auto" if self.conversion == "copy" else KV_CACHE_DTYPES[self.conversion.split("_")[0]][0]
        token_to_seq = torch.zeros(max(1, self.num_rows), dtype=torch.int32, device=self.dst.device)
        return (self.src_cache, self.dst, self.block_table, self.cu_seq_lens, token_to_seq, self.num_rows,
                kv_cache_dtype, self.scale, self.seq_starts)


def reference(case: CacheCase) -> torch.Tensor:
    """dst's whole byte storage (uint8, flat) expected after the gather of ``case``."""
    out = case.dst_store.cpu().clone()
    src = case.src_store.cpu()
    c, d = case.src_cache, case.dst
    nb, bs = c.shape[:2]
    esz = c.element_size()
    row_bytes = math.prod(c.shape[2:]) * esz
    src_base, block_stride, entry_stride = c.storage_offset() * esz, c.stride(0) * esz, c.stride(1) * esz
    out_bytes = row_bytes * (1 if case.conversion == "copy" else d.element_size())
    dst_base, dst_row = d.storage_offset() * d.element_size(), d.stride(0) * d.element_size()
    cu = case.cu_seq_lens.tolist()
    seq = case.seq_starts.tolist() if case.seq_starts is not None else None
    scale = float(case.scale.reshape(-1)[0])
    for r in range(case.batch):
        for t in range(min(cu[r], case.num_rows), min(cu[r + 1], case.num_rows)):
            pos = (seq[r] if seq is not None else 0) + (t - cu[r])
            blk = int(case.block_table[r, pos // bs])
            at = src_base + blk * block_stride + (pos % bs) * entry_stride
            row = convert_row(bytes(src[at: at + row_bytes].tolist()), case.conversion, scale)
            assert len(row) == out_bytes
            out[dst_base + t * dst_row: dst_base + t * dst_row + out_bytes] = torch.frombuffer(bytearray(row),
                                                                                              dtype=torch.uint8)
    return out


def ragged(rng: random.Random, batch: int, mean: int, empty_frac: float = 0.15) -> list[int]:
    return [0 if rng.random() < empty_frac else rng.randint(1, max(1, 2 * mean)) for _ in range(batch)]


def fp8_bytes(gen: torch.Generator, n: int, fp8: str) -> torch.Tensor:
    """Random fp8 codes of every kind: mostly ordinary values, with NaN, inf (e5m2), zeros,
    subnormals and the extremes mixed in."""
    codes = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    special = torch.tensor([0x00, 0x80, 0x01, 0x81, 0x07, 0x7F, 0xFF, 0x7E, 0xFE, 0x7C, 0xFC, 0x7D, 0x03],
                           dtype=torch.uint8)
    pick = torch.randint(0, 8, (n,), generator=gen) == 0
    codes[pick] = special[torch.randint(0, len(special), (int(pick.sum()),), generator=gen)]
    return codes


def make_case(rng: random.Random, *, lens: list[int], block_size: int = 16, entry=(576,),
              src_dtype=torch.uint8, conversion: str = "copy", seq_starts: bool = False, extra_rows: int = 0,
              cut_rows: int = 0, start_row: int = 0, pad_entry: int = 0, pad_row: int = 0, scale: float = 0.37,
              extra_cols: int = 1, device="cpu") -> CacheCase:
    """A random case. Request r has ``lens[r]`` rows starting at ``start_row`` (cu[0]); its
    entries start at a random seq_starts[r] (or 0) in shuffled physical blocks; dst has
    ``extra_rows`` untouched rows past the last request, or ``cut_rows`` fewer than the
    requests need (T below cu[-1]: the last rows are cut); ``pad_entry`` / ``pad_row`` elements
    of padding after each cache entry / dst row (strided views)."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    batch = len(lens)
    first = [rng.randrange(0, 3 * block_size) if seq_starts else 0 for _ in range(batch)]
    blocks_each = [-(-(f + n) // block_size) for f, n in zip(first, lens)]
    max_blocks = max(blocks_each + [1]) + extra_cols
    nb = sum(blocks_each) + 3
    perm = list(range(nb))
    rng.shuffle(perm)
    bt = torch.full((max(batch, 1), max_blocks), -7, dtype=torch.int32)
    k = 0
    for r, m in enumerate(blocks_each):
        for j in range(m):
            bt[r, j] = perm[k]
            k += 1
    esz = torch.empty((), dtype=src_dtype).element_size()
    entry_elems = math.prod(entry)
    # the cache: uint8 storage, entries padded by pad_entry elements, one spare entry per block
    ent = entry_elems + pad_entry
    blk_elems = (block_size + 1) * ent
    store = torch.randint(0, 256, ((nb * blk_elems + ent) * esz,), dtype=torch.uint8, generator=gen)
    if conversion != "copy":
        store = fp8_bytes(gen, store.numel(), conversion.split("_")[0])
    flat = store.view(src_dtype)
    src = flat.as_strided((nb, block_size) + tuple(entry),
                          (blk_elems, ent) + tuple(int(math.prod(entry[i + 1:])) for i in range(len(entry))),
                          storage_offset=ent)
    cu = [start_row]
    for n in lens:
        cu.append(cu[-1] + n)
    rows = max(0, cu[-1] + extra_rows - cut_rows)
    out_dtype = src_dtype if conversion == "copy" else OUT_DTYPES[conversion.split("_")[1]]
    osz = torch.empty((), dtype=out_dtype).element_size()
    row_elems = entry_elems + pad_row
    dst_store = torch.full(((rows * row_elems + 8) * osz,), SENTINEL, dtype=torch.uint8)
    dst = dst_store.view(out_dtype).as_strided((rows,) + tuple(entry),
                                               (row_elems,) + tuple(int(math.prod(entry[i + 1:]))
                                                                    for i in range(len(entry))),
                                               storage_offset=4 // osz if osz < 4 and pad_row else 0)
    case = CacheCase(store, src, dst_store, dst, bt, torch.tensor(cu, dtype=torch.int32),
                     torch.tensor(first, dtype=torch.int32) if seq_starts else None,
                     torch.tensor([scale], dtype=torch.float32), rows, conversion,
                     f"lens={lens[:6]}{'...' if batch > 6 else ''} bs={block_size} entry={entry} {src_dtype} "
                     f"{conversion} seq={seq_starts} T={rows}")
    return to_device(case, device) if str(device) != "cpu" else case


def to_device(case: CacheCase, device) -> CacheCase:
    """The same case on ``device`` (views rebuilt over the moved storages)."""
    src_store = case.src_store.to(device)
    dst_store = case.dst_store.to(device)
    c, d = case.src_cache, case.dst
    src = src_store.view(c.dtype).as_strided(c.shape, c.stride(), c.storage_offset())
    dst = dst_store.view(d.dtype).as_strided(d.shape, d.stride(), d.storage_offset())
    return CacheCase(src_store, src, dst_store, dst, case.block_table.to(device), case.cu_seq_lens.to(device),
                     case.seq_starts.to(device) if case.seq_starts is not None else None, case.scale.to(device),
                     case.num_rows, case.conversion, case.desc)
