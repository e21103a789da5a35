"""The SGLang accessor against a plain reading of SGLang's page layout (buf.view(pages, 64, 132))."""
import random

import pytest
import torch

from nvrtc_gather.integrations.sglang import get_index_k_scale_buffer


def reference(buf, lens, pages, page_size=64, hd=128):
    """SGLang's layout read by hand: page p holds page_size * hd fp8 bytes, then page_size fp32 scales."""
    paged = buf.view(buf.size(0), page_size * (hd + 4))
    ks, ss = [], []
    for r, n in enumerate(lens):
        for i in range(n):
            p, t = int(pages[r, i // page_size]), i % page_size
            ks.append(paged[p, t * hd:(t + 1) * hd])
            ss.append(paged[p, page_size * hd + 4 * t: page_size * hd + 4 * (t + 1)])
    return torch.stack(ks), torch.stack(ss)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_matches_sglang_page_layout(seed, index_dtype):
    rng = random.Random(seed)
    num_pages, batch = 40, rng.randint(1, 6)
    buf = torch.randint(0, 256, (num_pages, 64 * 132), dtype=torch.uint8)
    lens = [rng.choice([0, 1, 63, 64, 65, rng.randint(1, 300)]) for _ in range(batch)]
    max_pages = max(1, -(-max(lens) // 64))
    order = list(range(num_pages))
    rng.shuffle(order)
    pages = torch.tensor([[order[(r * max_pages + j) % num_pages] for j in range(max_pages)] for r in range(batch)],
                         dtype=index_dtype)
    k, s = get_index_k_scale_buffer(buf, torch.tensor(lens, dtype=index_dtype), pages, sum(lens), max(lens))
    assert k.shape == (sum(lens), 128) and s.shape == (sum(lens), 4) and k.dtype == s.dtype == torch.uint8
    if sum(lens):
        k_ref, s_ref = reference(buf, lens, pages)
        assert torch.equal(k, k_ref) and torch.equal(s, s_ref)


def test_bad_buffer_shape_is_named():
    with pytest.raises(ValueError, match="buf: expected 64 \\* 132"):
        get_index_k_scale_buffer(torch.zeros(4, 64 * 130, dtype=torch.uint8), torch.tensor([3]),
                                 torch.zeros(1, 1, dtype=torch.int32), 3, 3)
