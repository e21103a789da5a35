"""vLLM 0.33's MXFP4 indexer cache (``use_fp4_cache``), built token by token the way vLLM's writer
stores it, for the gather tests (docs/contract.md, "MXFP4 indexer cache").

Read in vLLM 0.33.0's wheel: ``models/deepseek_v4/attention.py`` sizes a token at
``head_dim // 2 + head_dim // MXFP4_BLOCK_SIZE`` = 64 + 4 = 68 bytes (MXFP4_BLOCK_SIZE 32);
``models/deepseek_v4/common/ops/fused_compress_quant_cache.py``
(``_fused_kv_compress_norm_rope_insert_indexer_mxfp4_attn``) writes token ``pos`` of a block at
``block * stride(0) + pos * 64`` (packed e2m1, two values a byte) and its ue8m0 scale bytes at
``block * stride(0) + block_size * 64 + pos * 4``; ``model_executor/layers/sparse_attn_indexer.py``
gathers with ``cp_gather_indexer_k_quant_cache(kv_cache, dst_k uint8 [T, 64], dst_scale uint8 [T, 4],
block_table, cu_seq_lens)`` (``_gather_workspace_shapes``).

The expected output is each token's own record, in request order: no offset arithmetic of the
gather is shared with the package or with helpers/reference.py."""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch

from helpers.reference import SENTINEL

HEAD_DIM = 128
MXFP4_BLOCK = 32
VALUE_BYTES = HEAD_DIM // 2  # 64
SCALE_BYTES = HEAD_DIM // MXFP4_BLOCK  # 4
TOKEN_BYTES = VALUE_BYTES + SCALE_BYTES  # 68


@dataclass
class Mxfp4Case:
    kv_cache: torch.Tensor  # uint8 [num_blocks, block_size, 68]
    dst_k: torch.Tensor  # uint8 [rows, 64], poisoned
    dst_scale: torch.Tensor  # uint8 [rows, 4], poisoned
    block_table: torch.Tensor
    cu_seq_lens: torch.Tensor
    want_k: torch.Tensor  # what each row must hold after the gather (SENTINEL past the last token)
    want_scale: torch.Tensor
    desc: str

    def args(self):
        return self.kv_cache, self.dst_k, self.dst_scale, self.block_table, self.cu_seq_lens

    def to(self, device) -> "Mxfp4Case":
        moved = {f: getattr(self, f).to(device) for f in ("kv_cache", "dst_k", "dst_scale", "block_table",
                                                         "cu_seq_lens")}
        return Mxfp4Case(**moved, want_k=self.want_k, want_scale=self.want_scale, desc=self.desc)


def make_mxfp4_case(rng: random.Random, *, block_size: int, lens: list[int], extra_rows: int = 0) -> Mxfp4Case:
    """Requests of ``lens`` tokens (zeros allowed) in shuffled physical blocks; every token gets
    random packed values and ue8m0 bytes; cache bytes no token owns are random too."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    blocks_per = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_per) + rng.randint(1, 4)
    kv = torch.randint(0, 256, (num_blocks, block_size, TOKEN_BYTES), dtype=torch.uint8, generator=gen)
    flat = kv.view(num_blocks, block_size * TOKEN_BYTES)  # a block as vLLM's writer addresses it
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    it = iter(ids)
    max_blocks = max([1] + blocks_per) + 1
    block_table = torch.randint(0, num_blocks, (len(lens), max_blocks), dtype=torch.int32, generator=gen)
    want_k, want_s = [], []
    for r, n in enumerate(lens):
        for j in range(blocks_per[r]):
            block_table[r, j] = next(it)
        for i in range(n):
            values = torch.randint(0, 256, (VALUE_BYTES,), dtype=torch.uint8, generator=gen)
            scales = torch.randint(0, 256, (SCALE_BYTES,), dtype=torch.uint8, generator=gen)
            block, pos = int(block_table[r, i // block_size]), i % block_size
            flat[block, pos * VALUE_BYTES:(pos + 1) * VALUE_BYTES] = values
            flat[block, block_size * VALUE_BYTES + pos * SCALE_BYTES:
                 block_size * VALUE_BYTES + (pos + 1) * SCALE_BYTES] = scales
            want_k.append(values)
            want_s.append(scales)
    rows = sum(lens) + extra_rows
    pad_k = torch.full((extra_rows, VALUE_BYTES), SENTINEL, dtype=torch.uint8)
    pad_s = torch.full((extra_rows, SCALE_BYTES), SENTINEL, dtype=torch.uint8)
    want_k = torch.cat([torch.stack(want_k) if want_k else pad_k[:0], pad_k])
    want_s = torch.cat([torch.stack(want_s) if want_s else pad_s[:0], pad_s])
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    return Mxfp4Case(kv, torch.full((rows, VALUE_BYTES), SENTINEL, dtype=torch.uint8),
                     torch.full((rows, SCALE_BYTES), SENTINEL, dtype=torch.uint8), block_table, cu, want_k, want_s,
                     f"mxfp4 bs={block_size} lens={lens} extra={extra_rows}")


def ragged_lens(rng: random.Random, block_size: int) -> list[int]:
    """Ragged requests: some empty, partial last blocks, one spanning several blocks."""
    lens = [0, 1, block_size - 1, block_size, block_size + 1, 3 * block_size + rng.randint(1, block_size - 1)]
    lens += [0 if rng.random() < 0.2 else rng.randint(1, 2 * block_size) for _ in range(rng.randint(1, 6))]
    rng.shuffle(lens)
    return lens
