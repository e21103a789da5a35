"""The requests the families' workloads are made of, on any device (the dry runs build them on
the CPU): ragged lengths, a block table over shuffled blocks of a cache at least 4x the L2,
cu_seq_lens, and the slot patterns of the writes."""
from __future__ import annotations

import math
import random

import torch

BLOCK_SIZE = 64  # tokens per cache block (DeepSeek's)


def ragged_lengths(rng: random.Random, batch: int, mean: int) -> list[int]:
    """Lengths around ``mean`` (0.5x..1.5x), about 5% empty when batch > 1; a single request is exact."""
    if batch == 1:
        return [mean]
    return [0 if rng.random() < 0.05 else max(1, round(mean * rng.uniform(0.5, 1.5))) for _ in range(batch)]


def cache_blocks(need: int, block_bytes: int, l2: int) -> int:
    """Blocks of a cache that holds ``need`` blocks and is at least 4x the L2."""
    return max(need, 1, 4 * l2 // block_bytes)


class Batch:
    """``batch`` requests of about ``mean`` tokens (``self.name`` "BATCHxMEAN"); with
    ``seq_starts`` each one's context starts at a random position below ``mean`` (pages partial
    at both ends, as in a later prefill chunk). Its block table points at shuffled blocks of a
    cache of ``block_bytes`` blocks at least 4x ``l2`` (``self.num_blocks``)."""

    def __init__(self, batch: int, mean: int, block_bytes: int, l2: int, seed: int, device: str = "cuda",
                 seq_starts: bool = False):
        rng = random.Random(seed)
        self.name, self.batch = f"{batch}x{mean}", batch
        self.lens = ragged_lengths(rng, batch, mean)
        self.tokens = sum(self.lens)
        self.longest = max(self.lens)  # an engine's max_seq_len: an int it already has at each call
        self.starts = [rng.randrange(0, max(1, mean)) if seq_starts else 0 for _ in range(batch)]
        self.blocks_per = [math.ceil((s + n) / BLOCK_SIZE) if n else 0 for s, n in zip(self.starts, self.lens)]
        need = sum(self.blocks_per)
        self.num_blocks = cache_blocks(need, block_bytes, l2)
        ids = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(seed))[:need].to(torch.int32)
        bt = torch.zeros(batch, max(self.blocks_per + [1]), dtype=torch.int32)
        k = 0
        for r, nb in enumerate(self.blocks_per):
            bt[r, :nb] = ids[k:k + nb]
            k += nb
        self.block_table = bt.to(device)
        self.cu_host = [0]
        for n in self.lens:
            self.cu_host.append(self.cu_host[-1] + n)
        self.cu = torch.tensor(self.cu_host, dtype=torch.int32, device=device)
        self.seq_starts = torch.tensor(self.starts, dtype=torch.int32, device=device) if seq_starts else None


def slots(tokens: int, num_blocks: int, pattern: str, seed: int, device: str = "cuda") -> torch.Tensor:
    """Slots of a write: "scattered", random slots anywhere in the cache (decode tokens of as
    many requests); "paged", shuffled blocks filled in order (one prefill)."""
    gen = torch.Generator().manual_seed(seed)
    if pattern == "scattered":
        return torch.randperm(num_blocks * BLOCK_SIZE, generator=gen)[:tokens].to(device)
    blocks = torch.randperm(num_blocks, generator=gen)
    i = torch.arange(tokens)
    return (blocks[i // BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE).to(device)


def cache(num_blocks: int, record_bytes: int, seed: int, device: str = "cuda", lazy: bool = False,
          dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """A cache [num_blocks, BLOCK_SIZE, record_bytes / dtype size] of random bytes (every fp8 code,
    NaN included, and every bf16 bit pattern); ``lazy`` (the dry runs) leaves it unwritten."""
    if lazy:
        return torch.empty(num_blocks, BLOCK_SIZE, record_bytes, dtype=torch.uint8, device=device).view(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(0, 256, (num_blocks, BLOCK_SIZE, record_bytes), dtype=torch.uint8, device=device,
                         generator=gen).view(dtype)
