"""A stand-in for SGLang's index buffer accessor, written from SGLang's source
(``python/sglang/srt/layers/attention/dsa/index_buf_accessor.py`` and the pool's
``get_index_k_scale_buffer`` in ``mem_cache``), for tests where SGLang is not installed
(installing it in CI would pull its whole CUDA stack).

Kept faithful where the hook touches it: ``GetKAndS.execute`` is a classmethod called as
``execute(pool, buf, page_indices=..., seq_len_tensor=..., seq_len_sum=..., max_seq_len=...)``;
the pool picks the layer's buffer and calls it. SGLang's own reads of the layout are its
``GetK.torch_fast`` / ``GetS.torch_fast`` (flat byte indices per page), used here per request
as ``GetKAndS``'s reference path: the bytes the hook must reproduce. Their ``device="cuda"``
is the buffer's device here, so they also run on CPU."""
import os

ACCESSOR = '''
import torch

calls = []  # which path ran: the hook must leave bf16 buffers and old calls to SGLang


class GetK:
    @classmethod
    def torch_fast(cls, pool, buf, seq_len, page_indices):
        buf_numel_per_page = buf.shape[1]
        num_k_bytes_per_page = pool.page_size * pool.index_head_dim
        num_k_bytes_per_token = pool.index_head_dim
        flat_buf = buf.flatten()
        flat_indices = (page_indices * buf_numel_per_page)[:, None] + torch.arange(
            num_k_bytes_per_page, dtype=torch.int32, device=buf.device)[None, :]
        flat_indices = flat_indices.flatten()[: seq_len * num_k_bytes_per_token]
        return flat_buf[flat_indices].view(-1, 128)


class GetS:
    @classmethod
    def torch_fast(cls, pool, buf, seq_len, page_indices):
        buf_numel_per_page = buf.shape[1]
        num_s_bytes_per_page = buf.shape[1] - pool.page_size * pool.index_head_dim
        num_s_bytes_per_token = pool.index_head_dim // pool.quant_block_size * 4
        s_offset_in_page = pool.page_size * pool.index_head_dim
        flat_buf = buf.flatten()
        flat_indices = ((page_indices * buf_numel_per_page)[:, None]
                        + torch.arange(num_s_bytes_per_page, dtype=torch.int32, device=buf.device)[None, :]
                        + s_offset_in_page)
        flat_indices = flat_indices.flatten()[: seq_len * num_s_bytes_per_token]
        return flat_buf[flat_indices].view(-1, 4)


class GetKAndS:
    @classmethod
    def execute(cls, *args, **kwargs):
        calls.append("sglang")
        return cls.torch_path(*args, **kwargs)

    @classmethod
    def torch_path(cls, pool, buf, page_indices, seq_len_tensor, seq_len_sum, max_seq_len):
        """GetKAndS's result from SGLang's torch reads: each request's pages, packed by request."""
        ks, ss = [], []
        for r, n in enumerate(seq_len_tensor.tolist()):
            if n:
                ks.append(GetK.torch_fast(pool, buf, n, page_indices[r]))
                ss.append(GetS.torch_fast(pool, buf, n, page_indices[r]))
        empty = torch.empty(0, 128, dtype=torch.uint8, device=buf.device)
        return (torch.cat(ks) if ks else empty), (torch.cat(ss) if ss else empty[:, :4])
'''

POOL = '''
import torch
from sglang.srt.layers.attention.{kind} import index_buf_accessor


class DSATokenToKVPool:
    """The part of SGLang's pool the accessor sees (page_size, index_head_dim, quant_block_size,
    one buffer per layer) and its get_index_k_scale_buffer, as SGLang writes it."""

    def __init__(self, buffers, page_size=64, index_head_dim=128, quant_block_size=128):
        self.page_size, self.index_head_dim, self.quant_block_size = page_size, index_head_dim, quant_block_size
        self.index_k_with_scale_buffer = buffers
        self.device = buffers[0].device

    def get_index_k_scale_buffer(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
        buf = self.index_k_with_scale_buffer[layer_id]
        return index_buf_accessor.GetKAndS.execute(
            self, buf, page_indices=page_indices, seq_len_tensor=seq_len_tensor, seq_len_sum=seq_len_sum,
            max_seq_len=max_seq_len)
'''


def write(root, kinds=("dsa",)) -> str:
    """Create the stand-in package under ``root`` with the accessor at each of ``kinds``
    (``"dsa"``, ``"nsa"``) and a pool module ``sglang.srt.mem_cache.<kind>_pool``; returns
    ``root`` for sys.path."""
    root = str(root)
    for kind in kinds:
        d = os.path.join(root, "sglang", "srt", "layers", "attention", kind)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "index_buf_accessor.py"), "w") as f:
            f.write(ACCESSOR)
        m = os.path.join(root, "sglang", "srt", "mem_cache")
        os.makedirs(m, exist_ok=True)
        with open(os.path.join(m, f"{kind}_pool.py"), "w") as f:
            f.write(POOL.replace("{kind}", kind))
    for dirpath, _, files in os.walk(os.path.join(root, "sglang")):
        if "__init__.py" not in files:
            open(os.path.join(dirpath, "__init__.py"), "w").close()
    return root
