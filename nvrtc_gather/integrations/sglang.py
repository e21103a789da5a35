"""SGLang's NSA indexer cache read through nvrtc_gather's gather.

SGLang's ``NSATokenToKVPool`` keeps each layer's indexer keys in one uint8 buffer of
``[num_pages, page_size * (index_head_dim + 4 * index_head_dim // 128)]``: per page,
``page_size * index_head_dim`` fp8 bytes then ``page_size`` fp32 scales, exactly the paged
layout of docs/contract.md §1 with ``block_size = page_size``. Its accessor
``get_index_k_scale_buffer(layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len)``
returns every request's keys packed by request; :func:`get_index_k_scale_buffer` does the same
from the layer's buffer, with one gather launch and no host sync::

    k_fp8, k_scale = get_index_k_scale_buffer(pool.index_k_with_scale_buffer[layer_id - pool.start_layer],
                                              seq_len_tensor, page_indices, seq_len_sum, max_seq_len,
                                              page_size=pool.page_size)
"""
from __future__ import annotations

import torch

from .. import cp_gather_indexer_k_quant_cache

QUANT_BLOCK_SIZE = 128  # SGLang's NSA indexer: one fp32 scale per 128 fp8 values


def get_index_k_scale_buffer(buf: torch.Tensor, seq_len_tensor: torch.Tensor, page_indices: torch.Tensor,
                             seq_len_sum: int, max_seq_len: int, *, page_size: int = 64,
                             index_head_dim: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_fp8 uint8 ``[seq_len_sum, index_head_dim]``, k_scale uint8 ``[seq_len_sum, 4 * nq]``) for
    the requests of ``seq_len_tensor`` (lengths, ``[batch]``) whose pages are the rows of
    ``page_indices`` (``[batch, max_pages]``), packed by request, as SGLang's accessor returns them.

    ``seq_len_sum`` (a host int, the sum of the lengths) sizes the outputs; ``max_seq_len`` is
    accepted for SGLang's signature and checked against ``page_indices``. The lengths stay on
    the device: their prefix sums are taken there."""
    if not isinstance(buf, torch.Tensor) or buf.dim() != 2:
        raise ValueError(f"buf: expected the layer's 2-D uint8 index buffer [num_pages, page_size * "
                         f"(index_head_dim + 4 * nq)], got {getattr(buf, 'shape', type(buf).__name__)}")
    nq = index_head_dim // QUANT_BLOCK_SIZE
    stride = index_head_dim + 4 * nq
    if buf.size(1) != page_size * stride:
        raise ValueError(f"buf: expected {page_size} * {stride} = {page_size * stride} bytes per page "
                         f"(page_size={page_size}, index_head_dim={index_head_dim}), got shape {tuple(buf.shape)}")
    if seq_len_tensor.dim() != 1 or page_indices.dim() != 2 or page_indices.size(0) != seq_len_tensor.size(0):
        raise ValueError(f"seq_len_tensor/page_indices: expected [batch] and [batch, max_pages], got "
                         f"{tuple(seq_len_tensor.shape)} and {tuple(page_indices.shape)}")
    if page_indices.size(1) * page_size < max_seq_len:
        raise ValueError(f"page_indices: {page_indices.size(1)} pages of {page_size} tokens cannot hold "
                         f"max_seq_len={max_seq_len}")
    dev = buf.device
    batch = seq_len_tensor.size(0)
    cu_seq_lens = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
    torch.cumsum(seq_len_tensor, 0, dtype=torch.int32, out=cu_seq_lens[1:])
    block_table = page_indices if page_indices.dtype == torch.int32 else page_indices.to(torch.int32)
    k_fp8 = torch.empty(seq_len_sum, index_head_dim, dtype=torch.uint8, device=dev)
    k_scale = torch.empty(seq_len_sum, 4 * nq, dtype=torch.uint8, device=dev)
    kv_cache = buf.view(torch.uint8).view(buf.size(0), page_size, stride)
    cp_gather_indexer_k_quant_cache(kv_cache, k_fp8, k_scale, block_table, cu_seq_lens)
    return k_fp8, k_scale
