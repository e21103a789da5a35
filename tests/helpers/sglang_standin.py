"""A stand-in for SGLang's index-K accessor, written from SGLang's source (the accessor modules
of releases 0.5.10-0.5.23, ``nvrtc_gather.integrations.sglang.ACCESSORS``, and the pool's
``get_index_k_scale_buffer`` / ``set_index_k_scale_buffer``), for tests where SGLang is not
installed (the CI matrix, scripts/engine_matrix.sh, runs the same tests against the real
releases).

Kept faithful where the hook touches it: ``GetKAndS.execute`` is a classmethod called as
``execute(pool, buf, page_indices=..., seq_len_tensor=..., seq_len_sum=..., max_seq_len=...)``;
``SetKAndS.execute(*args, buf, **kwargs)`` is called with keywords ``pool, buf, loc, index_k,
index_k_scale``; the module has ``_use_aiter_preshuffle``. SGLang's own reads and writes of the
layout are its ``GetK/GetS.torch_fast`` and ``SetK/SetS.torch_fast`` (flat byte indices per
page), used here as the reference paths: the bytes the hook must reproduce. Their
``device="cuda"`` is the buffer's device here, so they also run on CPU."""
import os

ACCESSOR = '''
import torch
{broken}
calls = []  # which path ran: the hook must leave other buffers and old calls to SGLang
_use_aiter_preshuffle = {preshuffle}


def _page_size(pool):
    return pool.{page_attr}


class GetK:
    @classmethod
    def torch_fast(cls, pool, buf, seq_len, page_indices):
        buf_numel_per_page = buf.shape[1]
        num_k_bytes_per_page = _page_size(pool) * pool.index_head_dim
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
        num_s_bytes_per_page = buf.shape[1] - _page_size(pool) * pool.index_head_dim
        num_s_bytes_per_token = pool.index_head_dim // pool.quant_block_size * 4
        s_offset_in_page = _page_size(pool) * pool.index_head_dim
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


class SetK:
    @classmethod
    def torch_fast(cls, pool, buf, loc, index_k):
        (num_tokens_to_write,) = loc.shape
        buf_numel_per_page = buf.shape[1]
        num_k_bytes_per_token = pool.index_head_dim
        loc_page_index = loc // _page_size(pool)
        loc_token_offset_in_page = loc % _page_size(pool)
        flat_buf = buf.flatten()
        flat_indices = (
            (loc_page_index * buf_numel_per_page)[:, None]
            + (loc_token_offset_in_page * num_k_bytes_per_token)[:, None]
            + torch.arange(num_k_bytes_per_token, dtype=torch.int32, device=buf.device)[None, :]
        )
        flat_buf[flat_indices.flatten()] = index_k.view(torch.uint8).flatten()


class SetS:
    @classmethod
    def torch_fast(cls, pool, buf, loc, index_k_scale):
        buf_numel_per_page = buf.shape[1]
        num_s_bytes_per_token = 4
        s_offset_in_page = _page_size(pool) * pool.index_head_dim
        loc_page_index = loc // _page_size(pool)
        loc_token_offset_in_page = loc % _page_size(pool)
        flat_buf = buf.flatten()
        flat_indices = (
            (loc_page_index * buf_numel_per_page)[:, None]
            + s_offset_in_page
            + (loc_token_offset_in_page * num_s_bytes_per_token)[:, None]
            + torch.arange(num_s_bytes_per_token, dtype=torch.int32, device=buf.device)[None, :]
        )
        flat_buf[flat_indices.flatten()] = index_k_scale.contiguous().view(torch.uint8).flatten()


class SetKAndS:
    @classmethod
    def execute(cls, *args, buf, **kwargs):
        calls.append("sglang")
        cls.torch_path(*args, **kwargs, buf=buf)

    @classmethod
    def torch_path(cls, pool, buf, loc, index_k, index_k_scale):
        loc = loc.to(torch.int64)
        SetK.torch_fast(pool, buf, loc, index_k)
        SetS.torch_fast(pool, buf, loc, index_k_scale)
'''

POOL = '''
import torch
from {accessor_package} import {accessor_name} as index_buf_accessor


class DSATokenToKVPool:
    """The part of SGLang's pool the accessor sees (page sizes, index_head_dim, quant_block_size,
    one buffer per layer) and its get/set_index_k_scale_buffer, as SGLang writes them."""

    def __init__(self, buffers, page_size=64, index_head_dim=128, quant_block_size=128, index_page_size=None):
        self.page_size, self.index_head_dim, self.quant_block_size = page_size, index_head_dim, quant_block_size
        if index_page_size is not None:  # 0.5.23: page_size // index_kpool
            self.index_page_size = index_page_size
        self.index_k_with_scale_buffer = buffers
        self.device = buffers[0].device

    def get_index_k_scale_buffer(self, layer_id, seq_len_tensor, page_indices, seq_len_sum, max_seq_len):
        buf = self.index_k_with_scale_buffer[layer_id]
        return index_buf_accessor.GetKAndS.execute(
            self, buf, page_indices=page_indices, seq_len_tensor=seq_len_tensor, seq_len_sum=seq_len_sum,
            max_seq_len=max_seq_len)

    def set_index_k_scale_buffer(self, layer_id, loc, index_k, index_k_scale):
        buf = self.index_k_with_scale_buffer[layer_id]
        index_buf_accessor.SetKAndS.execute(pool=self, buf=buf, loc=loc, index_k=index_k, index_k_scale=index_k_scale)
'''


def write(root, modules, version="0.5.99", preshuffle=False, broken=None, page_attr="page_size") -> str:
    """Create the stand-in package ``sglang`` (release ``version``, with its dist-info) under
    ``root`` with the accessor at each module path of ``modules`` and a pool module
    ``sglang.srt.mem_cache.pool_<i>`` for the i-th (``pool_module(i)``). ``broken``: a module
    the accessor imports that is not installed (a missing dependency); ``page_attr``: the pool
    attribute the release's accessor reads ("page_size" or "index_page_size"). Returns
    ``root`` for sys.path."""
    root = str(root)
    for i, module in enumerate(modules):
        parts = module.split(".")
        d = os.path.join(root, *parts[:-1])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, parts[-1] + ".py"), "w") as f:
            f.write(ACCESSOR.format(broken=f"import {broken}" if broken else "", preshuffle=preshuffle,
                                    page_attr=page_attr))
        m = os.path.join(root, "sglang", "srt", "mem_cache")
        os.makedirs(m, exist_ok=True)
        with open(os.path.join(m, f"pool_{i}.py"), "w") as f:
            f.write(POOL.format(accessor_package=".".join(parts[:-1]), accessor_name=parts[-1]))
    os.makedirs(os.path.join(root, "sglang"), exist_ok=True)
    for dirpath, _, files in os.walk(os.path.join(root, "sglang")):
        if "__init__.py" not in files:
            open(os.path.join(dirpath, "__init__.py"), "w").close()
    info = os.path.join(root, f"sglang-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return root


def pool_module(i: int = 0) -> str:
    return f"sglang.srt.mem_cache.pool_{i}"
