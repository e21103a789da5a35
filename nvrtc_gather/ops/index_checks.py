"""The torch (CPU) paths' checks of index values, which they can afford to read (the kernels
skip what these reject): each raises ValueError naming the tensor and the first bad entry,
before anything is written."""
from __future__ import annotations

import torch


def slots_in_cache(slots: torch.Tensor, num_slots: int) -> None:
    """Every slot_mapping entry below num_slots (negative ones are padding)."""
    bad = slots >= num_slots
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ValueError(f"slot_mapping: entry {i} = {int(slots[i])} is past the cache's last slot "
                         f"({num_slots} slots = num_blocks * block_size)")


def physical_blocks(block_table: torch.Tensor, req: torch.Tensor, col: torch.Tensor, max_blocks: int,
                    num_blocks: int, too_far) -> torch.Tensor:
    """block_table[req, col] (int64) after checking each column is below max_blocks (else
    ``too_far(i)`` says which row i of the call is past its request's columns) and each block id
    in [0, num_blocks)."""
    past = col >= max_blocks
    if bool(past.any()):
        raise ValueError(too_far(int(torch.nonzero(past)[0])))
    blk = block_table[req, col].to(torch.int64)
    bad = (blk < 0) | (blk >= num_blocks)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ValueError(f"block_table: entry [{int(req[i])}, {int(col[i])}] = {int(blk[i])} is outside "
                         f"[0, num_blocks={num_blocks})")
    return blk
