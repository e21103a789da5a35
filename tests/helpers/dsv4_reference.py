"""An independent CPU reference of the DeepSeek-V4 MLA cache reads (issue 33), written from the
facts in docs/dsv4_engines.md (SGLang 0.5.23, vLLM 0.33.0), sharing no code with the engines or with
nvrtc_gather: numpy arithmetic, every byte offset computed from the page layout.

The functions, with the engines' names and argument meaning:
- ``dequantize_k_cache_paged_dsv4(quant_k_cache, ids, page_size, out=None, layout="v4")``:
  SGLang's bf16 gather, every layout (v4, v41, v41_new, v41_fp4, v41_fp4_new) -> bf16 ``[n, 1, 512]``;
- ``gather_dequant_requant_fp8_paged_dsv4(quant_k_cache, ids, page_size, extra_rows=0, out=None)``:
  SGLang's Q8KV8 form (V4 layout only) -> fp8 e4m3fn ``[n + extra_rows, 1, 512]``, zero rows last;
- ``dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)``:
  vLLM's form, writes ``out[r, offset + i]`` for ``i < g_r``, leaves every other row alone.

Conversions, done the obvious way and not through torch's casts:
- e4m3fn -> value: a 256-entry table from the format (NaN for 0x7f / 0xff);
- V4 UE8M0 scale byte b -> 2^(b-127) for b in 1..254, 0.0 for b = 0 (the GPU flushes the
  subnormal 2^-127: SGLang's own reference, vLLM's CuTe bit-built bf16 scale), +inf for 255;
- V4.1 UE8M0 (SGLang ``_ue8m0_to_fp32``): b = 0 -> 2^-127, b = 255 -> NaN;
- fp32 -> bf16: round to nearest even on the bits (NaN -> 0x7fc0);
- fp32 -> e4m3fn: nearest finite code, ties to the even code, |x| > 448 (inf too) -> ±448,
  NaN -> 0x7f (PTX ``cvt.rn.satfinite.e4m3x2.f32``, which Triton emits for ``.to(float8e4nv)``).

Plus the builders the tests use: random caches in each layout (valid fp8 bytes, UE8M0 bytes in a
chosen range, random bf16 RoPE, pages padded as the engines allocate them, poisoned padding),
shuffled page tables, and vLLM's strided ``[num_blocks, block_size, 584]`` view."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

HEAD = 512                 # values per output row
V4_NOPE, V4_ROPE, V4_TILE = 448, 64, 64
V4_DATA = V4_NOPE + 2 * V4_ROPE   # 576: fp8 NoPE then bf16 RoPE
V4_SCALES = 8                      # 7 UE8M0 + 1 pad
FP8_MAX = 448.0
POISON = 0xA5              # padding bytes and V4's pad scale byte: nobody may read them into a row


@dataclass(frozen=True)
class Layout:
    name: str
    data_bytes: int
    scale_bytes: int
    tile: int              # values sharing one scale
    page_align: int        # the page stride is padded up to a multiple of this
    interleaved: bool      # scales right after each token's data (else: all data rows, then all scale rows)

    @property
    def bytes_per_token(self) -> int:
        return self.data_bytes + self.scale_bytes

    def page_bytes(self, page_size: int) -> int:
        raw = page_size * self.bytes_per_token
        return -(-raw // self.page_align) * self.page_align

    def data_offset(self, slot, page_size: int):
        return slot * (self.bytes_per_token if self.interleaved else self.data_bytes)

    def scale_offset(self, slot, page_size: int):
        if self.interleaved:
            return slot * self.bytes_per_token + self.data_bytes
        return page_size * self.data_bytes + slot * self.scale_bytes


LAYOUTS = {
    "v4": Layout("v4", 576, 8, 64, 576, False),
    "v41": Layout("v41", 512, 16, 32, 512, False),
    "v41_new": Layout("v41_new", 512, 16, 32, 528, True),
    "v41_fp4": Layout("v41_fp4", 256, 32, 16, 256, False),
    "v41_fp4_new": Layout("v41_fp4_new", 256, 32, 16, 288, True),
}


def layout_of(layout) -> Layout:
    """A layout name or an object with a ``.value`` name (SGLang's KVLayout enum)."""
    return LAYOUTS[str(getattr(layout, "value", layout)).lower()]


# --- scalar formats ---------------------------------------------------------------------------

def _e4m3_table() -> np.ndarray:
    t = np.empty(256, np.float64)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 0xF, c & 7
        if e == 15 and m == 7:
            t[c] = np.nan
        elif e == 0:
            t[c] = s * m * 2.0 ** -9
        else:
            t[c] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()                       # exact values (float64; every one fits fp32)
_POS = E4M3[:0x7F]                         # codes 0x00..0x7e: 0 .. 448, increasing
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], np.float64)


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    return E4M3[codes.astype(np.int64)].astype(np.float32)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """fp32 -> e4m3fn codes: RNE over the finite codes, saturating at ±448, NaN -> 0x7f."""
    x = np.asarray(x, np.float32).astype(np.float64)
    nan = np.isnan(x)
    a = np.minimum(np.abs(np.where(nan, 0, x)), FP8_MAX)
    hi = np.clip(np.searchsorted(_POS, a, side="left"), 0, 0x7E)    # first code >= a
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - _POS[lo], _POS[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = np.where(a == _POS[hi], hi, np.where(pick_hi, hi, lo)).astype(np.uint8)
    code |= np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(nan, np.uint8(0x7F), code).astype(np.uint8)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bits, round to nearest even (subnormals too), NaN -> 0x7fc0."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.where(np.isnan(x), 0x7FC0, r).astype(np.uint16)


def ue8m0_v4(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    s = np.ldexp(np.float32(1), np.minimum(b, 254) - 127).astype(np.float32)
    s = np.where(b == 0, np.float32(0), s)
    return np.where(b == 255, np.float32(np.inf), s).astype(np.float32)


def ue8m0_v41(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    s = np.ldexp(np.float32(1), np.minimum(b, 254) - 127).astype(np.float32)   # b = 0 -> 2^-127 (an fp32 subnormal)
    return np.where(b == 255, np.float32(np.nan), s).astype(np.float32)


# --- one token's row from its page -------------------------------------------------------------

def _flat_u8(cache: torch.Tensor) -> tuple[np.ndarray, int]:
    """(all bytes, page stride) of a SGLang pool buffer: contiguous, page stride = last dim in bytes."""
    if not cache.is_contiguous():
        raise ValueError("quant_k_cache must be contiguous (SGLang asserts it)")
    u8 = cache.view(torch.uint8)
    return u8.reshape(-1).numpy(), u8.shape[-1]


def _rows(flat: np.ndarray, page_base: np.ndarray, slot: np.ndarray, page_size: int, lay: Layout):
    """(data bytes [n, data_bytes], scale bytes [n, scale_bytes]) of the tokens."""
    d0 = page_base + lay.data_offset(slot, page_size)
    s0 = page_base + lay.scale_offset(slot, page_size)
    data = flat[d0[:, None] + np.arange(lay.data_bytes)]
    scales = flat[s0[:, None] + np.arange(lay.scale_bytes)]
    return data, scales


def _dequant_v4_f32(data, scales) -> tuple[np.ndarray, np.ndarray]:
    """(NoPE products fp32 [n, 448], RoPE bf16 bits [n, 64])."""
    vals = e4m3_decode(data[:, :V4_NOPE])
    scale = ue8m0_v4(scales[:, : V4_NOPE // V4_TILE])
    with np.errstate(invalid="ignore", over="ignore"):            # 0 x inf -> NaN, as on the GPU
        prod = (vals * np.repeat(scale, V4_TILE, axis=1)).astype(np.float32)
    rope = data[:, V4_NOPE:V4_DATA].copy().view(np.uint16)        # little-endian bf16, bit for bit
    return prod, rope


def _rows_bf16(data, scales, lay: Layout) -> np.ndarray:
    """bf16 bits [n, 512] of the dequantized rows."""
    n = data.shape[0]
    if lay.name == "v4":
        prod, rope = _dequant_v4_f32(data, scales)
        return np.concatenate([bf16_bits(prod), rope], axis=1)
    if lay.data_bytes == 512:                                      # v41 / v41_new: e4m3 x UE8M0 per 32
        vals = e4m3_decode(data)
        scale = ue8m0_v41(scales)
    else:                                                          # fp4: e2m1 x e4m3 per 16
        codes = np.empty((n, HEAD), np.int64)
        codes[:, 0::2] = data & 0xF                                # element 2j: low nibble of byte j
        codes[:, 1::2] = data >> 4
        vals = E2M1[codes].astype(np.float32)
        scale = e4m3_decode(scales)
    with np.errstate(invalid="ignore", over="ignore"):
        prod = (vals * np.repeat(scale, lay.tile, axis=1)).astype(np.float32)
    return bf16_bits(prod)


def _check_ids(ids: torch.Tensor, num_pages: int, page_size: int) -> np.ndarray:
    if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1:
        raise TypeError("page_table_1_flattened must be a 1-D int32 or int64 tensor")
    t = ids.numpy().astype(np.int64)
    if t.size and (t.min() < 0 or t.max() >= num_pages * page_size):
        raise ValueError("a token id is outside the cache")
    return t


# --- SGLang -----------------------------------------------------------------------------------

def dequantize_k_cache_paged_dsv4(quant_k_cache, page_table_1_flattened, page_size, out=None, layout="v4"):
    """SGLang 0.5.23's bf16 gather: row k = token ``ids[k]`` (page ids[k] // P, slot ids[k] % P)."""
    lay = layout_of(layout)
    flat, stride = _flat_u8(quant_k_cache)
    if stride < page_size * lay.bytes_per_token:
        raise ValueError("the page stride cannot hold page_size tokens of this layout")
    t = _check_ids(page_table_1_flattened, flat.size // stride, page_size)
    data, scales = _rows(flat, (t // page_size) * stride, t % page_size, page_size, lay)
    rows = torch.from_numpy(_rows_bf16(data, scales, lay).view(np.int16)).view(torch.bfloat16)
    if out is None:
        out = torch.empty((t.size, 1, HEAD), dtype=torch.bfloat16)
    elif out.shape != (t.size, 1, HEAD) or out.dtype != torch.bfloat16:
        raise ValueError("out must be bf16 [n, 1, 512]")
    out[:, 0, :] = rows
    return out


def gather_dequant_requant_fp8_paged_dsv4(quant_k_cache, page_table_1_flattened, page_size, extra_rows=0, out=None):
    """SGLang 0.5.23's Q8KV8 gather (V4 layout): NoPE product and RoPE bf16 each cast to e4m3fn
    (RNE, saturating at ±448, no requantization scale); rows n .. n+extra_rows-1 are zero."""
    if extra_rows < 0:
        raise ValueError("extra_rows must be >= 0")
    lay = LAYOUTS["v4"]
    flat, stride = _flat_u8(quant_k_cache)
    t = _check_ids(page_table_1_flattened, flat.size // stride, page_size)
    data, scales = _rows(flat, (t // page_size) * stride, t % page_size, page_size, lay)
    prod, rope_bits = _dequant_v4_f32(data, scales)
    rope = (rope_bits.astype(np.uint32) << 16).view(np.float32)    # bf16 -> fp32 is exact
    codes = np.concatenate([e4m3_encode(prod), e4m3_encode(rope)], axis=1)
    n = t.size
    if out is None:
        out = torch.zeros((n + extra_rows, 1, HEAD), dtype=torch.float8_e4m3fn)
    elif out.shape != (n + extra_rows, 1, HEAD) or out.dtype != torch.float8_e4m3fn:
        raise ValueError("out must be float8_e4m3fn [n + extra_rows, 1, 512]")
    o = out.view(torch.uint8)
    o[n:] = 0
    o[:n, 0, :] = torch.from_numpy(codes)
    return out


# --- vLLM -------------------------------------------------------------------------------------

def dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset):
    """vLLM 0.33.0's gather: request r's rows offset .. offset+g-1 (g = gather_lens[r], or
    seq_lens[r] when None) from cache positions seq_lens[r]-g .. seq_lens[r]-1; other rows untouched.
    ``k_cache``: uint8 [num_blocks, block_size, 584], any block stride (stride(0) bytes)."""
    if k_cache.dtype != torch.uint8 or k_cache.dim() != 3 or k_cache.shape[-1] != 584:
        raise TypeError("k_cache must be uint8 [num_blocks, block_size, 584]")
    if k_cache.stride(1) != 584 or k_cache.stride(2) != 1:
        raise ValueError("k_cache rows must be 584 dense bytes")
    if out.dtype != torch.bfloat16 or out.dim() != 3 or out.shape[-1] != HEAD:
        raise TypeError("out must be bf16 [num_reqs, M, 512]")
    nb, stride = k_cache.shape[0], k_cache.stride(0)
    span = (nb - 1) * stride + block_size * 584 if nb else 0
    flat = torch.as_strided(k_cache, (span,), (1,), k_cache.storage_offset()).numpy()
    lay = LAYOUTS["v4"]
    sl = seq_lens.numpy().astype(np.int64)
    gl = sl if gather_lens is None else gather_lens.numpy().astype(np.int64)
    bt = block_table.numpy().astype(np.int64)
    for r in range(sl.size):
        g = int(gl[r])
        if g <= 0:
            continue
        pos = sl[r] - g + np.arange(g)
        if pos[0] < 0 or offset + g > out.shape[1]:
            raise ValueError("gather_len exceeds seq_len or out's rows")
        blocks = bt[r, pos // block_size]
        if blocks.min() < 0 or blocks.max() >= nb:
            raise ValueError("a block id is outside the cache")
        data, scales = _rows(flat, blocks * stride, pos % block_size, block_size, lay)
        rows = torch.from_numpy(_rows_bf16(data, scales, lay).view(np.int16)).view(torch.bfloat16)
        out[r, offset:offset + g, :] = rows
    return None


# --- builders ---------------------------------------------------------------------------------

def random_fp8_codes(rng: np.random.Generator, shape) -> np.ndarray:
    """Uniform over the 254 non-NaN e4m3fn codes."""
    c = rng.integers(0, 254, size=shape, dtype=np.int64)
    return np.where(c >= 0x7F, c + 1, c).astype(np.uint8)     # skip 0x7f; 0xff is never drawn


def random_bf16(rng: np.random.Generator, shape, scale=4.0, big_fraction=0.0) -> np.ndarray:
    """bf16 bits of finite normal values (``big_fraction`` of them beyond ±448)."""
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    if big_fraction:
        big = rng.random(shape) < big_fraction
        v = np.where(big, np.sign(v) * rng.uniform(400, 5e4, shape), v).astype(np.float32)
    return bf16_bits(v)


def build_cache(layout, num_pages: int, page_size: int, *, seed: int = 0, scale_range=(110, 135),
                page_bytes: int | None = None, exact_fp8: bool = False, big_rope: float = 0.0) -> torch.Tensor:
    """A SGLang-style pool buffer: uint8 [num_pages, page_bytes] (default: the engines' padded stride),
    every token slot filled with random valid records, padding and V4's pad scale byte POISON.
    ``exact_fp8`` (V4 only): every NoPE product and RoPE value is exactly an e4m3 normal value or 0
    (no rounding in the requant form), for comparisons under the Triton interpreter."""
    lay = layout_of(layout)
    rng = np.random.default_rng(seed)
    stride = page_bytes or lay.page_bytes(page_size)
    assert stride >= page_size * lay.bytes_per_token
    buf = np.full((num_pages, stride), POISON, np.uint8)
    n = num_pages * page_size
    lo, hi = scale_range
    if lay.name == "v4":
        nope = random_fp8_codes(rng, (n, V4_NOPE))
        sc = rng.integers(lo, hi + 1, size=(n, 7)).astype(np.uint8)
        if exact_fp8:
            v = e4m3_decode(nope) * np.repeat(ue8m0_v4(sc), V4_TILE, axis=1)
            ok = (v == 0) | ((np.abs(v) >= 2.0 ** -6) & (np.abs(v) <= FP8_MAX) & (e4m3_decode(e4m3_encode(v)) == v))
            nope = np.where(ok, nope, np.uint8(0)).astype(np.uint8)
            rc = random_fp8_codes(rng, (n, V4_ROPE))
            rc = np.where(rc & 0x78, rc, rc & 0x80).astype(np.uint8)      # no e4m3 subnormals
            rope = (e4m3_decode(rc).view(np.uint32) >> 16).astype(np.uint16)
        else:
            rope = random_bf16(rng, (n, V4_ROPE), big_fraction=big_rope)
        data = np.concatenate([nope, rope.view(np.uint8).reshape(n, 2 * V4_ROPE)], axis=1)
        scales = np.concatenate([sc, np.full((n, 1), POISON, np.uint8)], axis=1)
    elif lay.data_bytes == 512:
        data = random_fp8_codes(rng, (n, 512))
        scales = rng.integers(lo, hi + 1, size=(n, 16)).astype(np.uint8)
    else:
        data = rng.integers(0, 256, size=(n, 256)).astype(np.uint8)
        scales = random_fp8_codes(rng, (n, 32))
    pages = np.repeat(np.arange(num_pages), page_size)
    slots = np.tile(np.arange(page_size), num_pages)
    flat = buf.reshape(-1)
    d0 = pages * stride + lay.data_offset(slots, page_size)
    s0 = pages * stride + lay.scale_offset(slots, page_size)
    flat[d0[:, None] + np.arange(lay.data_bytes)] = data
    flat[s0[:, None] + np.arange(lay.scale_bytes)] = scales
    return torch.from_numpy(buf)


def random_token_ids(num_pages: int, page_size: int, n: int, *, seed: int = 0, dtype=torch.int64) -> torch.Tensor:
    """n flat token ids (page * page_size + slot) over shuffled pages, repeats allowed."""
    rng = np.random.default_rng(seed + 1)
    pages = rng.permutation(num_pages)
    ids = pages[rng.integers(0, num_pages, n)] * page_size + rng.integers(0, page_size, n)
    return torch.from_numpy(ids.astype(np.int64)).to(dtype)


def vllm_view(cache: torch.Tensor, block_size: int) -> torch.Tensor:
    """vLLM's k_cache: uint8 [num_blocks, block_size, 584] over the padded pages (stride(0) = page bytes)."""
    return torch.as_strided(cache, (cache.shape[0], block_size, 584), (cache.stride(0), 584, 1))


def random_requests(num_blocks: int, block_size: int, seq_lens, *, seed: int = 0):
    """Block tables (int32 [reqs, max_blocks], shuffled distinct blocks) for the given seq_lens."""
    rng = np.random.default_rng(seed + 2)
    max_blocks = max(1, max(-(-int(s) // block_size) for s in seq_lens))
    perm = rng.permutation(num_blocks)
    bt = np.zeros((len(seq_lens), max_blocks), np.int32)
    k = 0
    for r, s in enumerate(seq_lens):
        nb = -(-int(s) // block_size)
        bt[r, :nb] = perm[k:k + nb] if k + nb <= num_blocks else rng.integers(0, num_blocks, nb)
        k += nb
    return torch.from_numpy(bt)
