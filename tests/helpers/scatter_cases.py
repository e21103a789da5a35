"""Cases and the independent reference of indexer_k_scatter (tests/ops, tests/emulator,
tests/gpu): each case's cache is a view into one byte store (blocks possibly spaced out), and
the reference writes each token's bytes into a copy of that store by hand, from the layout of
docs/contract.md §1 (block b at b * block_stride; token t's values at t * head_dim, its scales
at block_size * head_dim + t * 4 * nq), not through the package's views."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn


@dataclass
class ScatterCase:
    store: torch.Tensor     # uint8, holds kv_cache
    kv_cache: torch.Tensor  # [num_blocks, block_size, cache_stride] view of store
    k: torch.Tensor
    k_scale: torch.Tensor
    slot_mapping: torch.Tensor
    block_stride: int
    desc: str

    def args(self):
        return self.k, self.k_scale, self.kv_cache, self.slot_mapping


def scale_row_bytes(k_scale: torch.Tensor, i: int) -> torch.Tensor:
    row = k_scale[i].reshape(-1) if k_scale.dim() == 2 else k_scale[i:i + 1]
    return row.contiguous().view(torch.uint8)


def scatter_reference(case: ScatterCase) -> torch.Tensor:
    """The store after the call, token by token."""
    out = case.store.clone()
    nb, bs, _ = case.kv_cache.shape
    hd = case.k.size(1)
    base0 = case.kv_cache.storage_offset() * case.kv_cache.element_size() - case.store.storage_offset()
    for i, s in enumerate(case.slot_mapping.tolist()):
        if s < 0 or s >= nb * bs:
            continue
        b, t = divmod(s, bs)
        base = base0 + b * case.block_stride
        out[base + t * hd: base + (t + 1) * hd] = case.k[i].contiguous().view(torch.uint8)
        sb = scale_row_bytes(case.k_scale, i)
        out[base + bs * hd + t * sb.numel(): base + bs * hd + (t + 1) * sb.numel()] = sb
    return out


def make_scatter_case(rng: random.Random, device="cpu", head_dim=None, nq=None, block_size=None, num_blocks=None,
                      num_tokens=None, k_offset=0, kv_offset=0, scale_kind=None, padding=0.2,
                      slot_dtype=torch.int64) -> ScatterCase:
    """A random call: distinct valid slots (two rows for one slot land in unspecified order),
    some padding (-1), rows of k and k_scale past slot_mapping, random bytes everywhere."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 62))
    hd = head_dim or rng.choice([128, 128, 64, 32, 12])
    nq = nq or rng.choice([q for q in (1, 2, 4) if hd % q == 0])
    bs = block_size or rng.choice([1, 3, 16, 64])
    nb = num_blocks or rng.randint(1, 6)
    T = num_tokens if num_tokens is not None else rng.randint(0, min(40, nb * bs))
    cs = hd + 4 * nq + rng.choice([0, 0, 4])
    block_stride = bs * cs + rng.choice([0, 0, 16])
    size = kv_offset + (nb - 1) * block_stride + bs * cs + 32
    store = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    kv = store[kv_offset:].as_strided((nb, bs, cs), (block_stride, cs, 1))
    if rng.random() < 0.5:
        kv = kv.view(FP8)
    rows = T + rng.choice([0, 2])
    k_row = hd + rng.choice([0, 0, 16])
    k_store = torch.randint(0, 256, (k_offset + rows * k_row + 16,), dtype=torch.uint8, generator=gen)
    k = k_store[k_offset:].as_strided((rows, hd), (k_row, 1))
    if rng.random() < 0.7:
        k = k.view(FP8)
    scale_kind = scale_kind or rng.choice(["f32_1d" if nq == 1 else "f32", "f32", "u8"])
    raw = torch.randint(0, 256, (rows * 4 * nq,), dtype=torch.uint8, generator=gen)
    if scale_kind == "f32_1d":
        k_scale = raw.view(torch.float32)
    elif scale_kind == "f32":
        k_scale = raw.view(torch.float32).view(rows, nq)
    else:
        k_scale = raw.view(rows, 4 * nq)
    valid = rng.sample(range(nb * bs), min(T, nb * bs))
    slots = [-1 if rng.random() < padding else s for s in valid] + [-1] * (T - len(valid))
    sm = torch.tensor(slots, dtype=slot_dtype)
    desc = (f"slots {slot_dtype} " f"head_dim={hd} nq={nq} block_size={bs} num_blocks={nb} cache_stride={cs} block_stride={block_stride} "
            f"k={k.dtype} row {k_row} off {k_offset} scale={scale_kind} kv_off={kv_offset} slots={slots}")
    if device != "cpu":
        store = store.to(device)
        kv = store[kv_offset:].as_strided((nb, bs, cs), (block_stride, cs, 1)).view(kv.dtype)
        k_store = k_store.to(device)
        k = k_store[k_offset:].as_strided((rows, hd), (k_row, 1)).view(k.dtype)
        k_scale, sm = k_scale.to(device), sm.to(device)
    return ScatterCase(store, kv, k, k_scale, sm, block_stride, desc)
