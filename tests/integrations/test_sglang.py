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


# Issue 16, item 6: what the accessor refuses, naming the argument, before anything is written.
def _args(**over):
    args = dict(buf=torch.zeros(8, 64 * 132, dtype=torch.uint8), seq_len_tensor=torch.tensor([70, 3]),
                page_indices=torch.tensor([[1, 2], [3, 0]]), seq_len_sum=73, max_seq_len=70)
    args.update(over)
    return args


@pytest.mark.parametrize("over, error, match", [
    (dict(page_indices=torch.tensor([[2**32 + 1, 2], [3, 0]])), ValueError,
     r"page_indices: page ids must fit int32, got values in \[2, 4294967297\] in the columns rows read"),
    (dict(page_indices=torch.tensor([[-2**31 - 1, 2], [3, 0]])), ValueError, "page_indices: page ids must fit int32"),
    (dict(seq_len_tensor=torch.tensor([2**32 + 70, 3]), seq_len_sum=73), ValueError,
     "seq_len_tensor: lengths must be >= 0 and sum to at most 2147483647"),
    (dict(seq_len_tensor=torch.tensor([2**31 - 1, 3], dtype=torch.int32), seq_len_sum=73), ValueError,
     "seq_len_tensor: lengths must be >= 0 and sum to at most 2147483647, got min 3, max 2147483647, sum 2147483650"),
    (dict(seq_len_tensor=torch.tensor([-1, 3])), ValueError, "seq_len_tensor: lengths must be >= 0"),
    (dict(seq_len_tensor=torch.tensor([70.9, 3.0])), TypeError, "seq_len_tensor: expected dtype torch.int32 or torch.int64"),
    (dict(seq_len_tensor=[70, 3]), TypeError, "seq_len_tensor: expected a torch.Tensor, got list"),
    (dict(seq_len_sum=-1), ValueError, "seq_len_sum: expected a non-negative int, got -1"),
    (dict(seq_len_sum=73.0), TypeError, "seq_len_sum: expected a host int, got float"),
    (dict(seq_len_sum=torch.tensor(73)), TypeError, "seq_len_sum: expected a host int, got Tensor"),
    (dict(seq_len_sum=2**31), ValueError, "seq_len_sum: 2147483648 rows exceed the supported"),
    (dict(max_seq_len=200), ValueError, "max_seq_len: 200 tokens do not fit in page_indices' 2 pages of 64"),
    (dict(buf=torch.zeros(8, 64 * 132, dtype=torch.float32)), TypeError, "buf: expected dtype torch.uint8, got torch.float32"),
    (dict(buf=torch.zeros(8, 64, 132, dtype=torch.uint8)), ValueError, "buf: expected the layer's 2-D uint8 index buffer"),
    (dict(page_indices=torch.tensor([[1.0, 2.0], [3.0, 0.0]])), TypeError, "page_indices: expected dtype torch.int32"),
    (dict(page_indices=torch.tensor([1, 2])), ValueError, r"page_indices: expected \[batch, max_pages\] with batch = 2"),
    (dict(seq_len_tensor=torch.tensor([[70, 3]])), ValueError, r"seq_len_tensor: expected \[batch\]"),
])
def test_bad_arguments_are_named_and_nothing_is_computed(over, error, match):
    args = _args(**over)
    before = args["buf"].clone()
    with pytest.raises(error, match=match):
        get_index_k_scale_buffer(**args)
    assert torch.equal(args["buf"], before)


def test_int32_lengths_whose_sum_fits_are_accepted_at_the_limit_of_a_page():
    k, s = get_index_k_scale_buffer(**_args(seq_len_tensor=torch.tensor([64, 0], dtype=torch.int32), seq_len_sum=64,
                                            max_seq_len=64))
    assert k.shape == (64, 128) and s.shape == (64, 4)


# Issue 26, item 6: seq_len_sum past the lengths' sum, and page_indices with an inner stride.
def test_rows_past_the_lengths_sum_are_zero_not_uninitialised():
    buf = torch.randint(1, 256, (4, 64 * 132), dtype=torch.uint8)
    pages = torch.tensor([[1, 2]])
    k, s = get_index_k_scale_buffer(buf, torch.tensor([70]), pages, 75, 70)
    k_ref, s_ref = reference(buf, [70], pages)
    assert k.shape == (75, 128) and torch.equal(k[:70], k_ref) and torch.equal(s[:70], s_ref)
    assert not k[70:].any() and not s[70:].any()


def test_a_seq_len_sum_below_the_lengths_sum_is_named():
    buf = torch.zeros(4, 64 * 132, dtype=torch.uint8)
    with pytest.raises(ValueError, match="seq_len_sum: 60 rows cannot hold the 70 tokens of seq_len_tensor"):
        get_index_k_scale_buffer(buf, torch.tensor([70]), torch.tensor([[1, 2]]), 60, 70)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_page_indices_with_an_inner_stride_are_read_right(index_dtype):
    buf = torch.randint(0, 256, (8, 64 * 132), dtype=torch.uint8)
    wide = torch.tensor([[3, 9, 5, 9], [7, 9, 1, 9]], dtype=index_dtype)
    pages = wide[:, ::2]  # strides (4, 2)
    lens = [100, 65]
    k, s = get_index_k_scale_buffer(buf, torch.tensor(lens, dtype=index_dtype), pages, 165, 100)
    k_ref, s_ref = reference(buf, lens, pages.contiguous())
    assert torch.equal(k, k_ref) and torch.equal(s, s_ref)


def test_set_index_k_scale_buffer_writes_the_layout_and_skips_padding():
    from nvrtc_gather.integrations.sglang import set_index_k_scale_buffer
    buf = torch.randint(0, 256, (3, 64 * 132), dtype=torch.uint8)
    want = buf.clone()
    k = torch.randint(0, 256, (3, 128), dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.rand(3)
    loc = torch.tensor([130, -1, 5], dtype=torch.int32)
    for i, slot in enumerate(loc.tolist()):
        if slot >= 0:
            p, t = divmod(slot, 64)
            want[p, t * 128:(t + 1) * 128] = k[i].view(torch.uint8)
            want[p, 64 * 128 + 4 * t: 64 * 128 + 4 * (t + 1)] = scale[i:i + 1].view(torch.uint8)
    set_index_k_scale_buffer(buf, loc, k, scale)
    assert torch.equal(buf, want)
    with pytest.raises(TypeError, match="loc: expected dtype torch.int32 or torch.int64"):
        set_index_k_scale_buffer(buf, loc.float(), k, scale)
    with pytest.raises(ValueError, match="buf: expected 32 \\* 132 = 4224 bytes per page"):
        set_index_k_scale_buffer(buf, loc, k, scale, page_size=32)
