"""Independent, obviously-correct references and random-case builders for the tests.

The reference walks requests and tokens one by one and computes every byte offset by
hand from DESIGN.md §1, sharing no code with the package."""
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


def to_device(case: GatherCase, device) -> GatherCase:
    """Same case on another device with the same shapes and strides."""
    def move(t):
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        out.copy_(t)
        return out
    return GatherCase(*(move(t) for t in case.args()), case.head_dim, case.scale_words, case.desc)
