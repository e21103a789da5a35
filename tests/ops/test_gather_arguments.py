"""Every kind of bad argument raises TypeError/ValueError naming it, before anything is written."""
import pytest
import torch

import nvrtc_gather as ng
from helpers.reference import SENTINEL

FP8 = torch.float8_e4m3fn


def good():
    return dict(
        kv_cache=torch.randint(0, 256, (4, 16, 132), dtype=torch.uint8),
        dst_k=torch.full((40, 128), SENTINEL, dtype=torch.uint8).view(FP8),
        dst_scale=torch.full((40, 4), SENTINEL, dtype=torch.uint8),
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        cu_seq_lens=torch.tensor([0, 20, 30], dtype=torch.int32),
    )


def call(a):
    ng.cp_gather_indexer_k_quant_cache(a["kv_cache"], a["dst_k"], a["dst_scale"], a["block_table"], a["cu_seq_lens"])


def test_good_arguments_pass():
    call(good())


CASES = [
    # (argument, replacement builder, exception, message fragment)
    ("kv_cache", lambda a: a["kv_cache"].numpy(), TypeError, "kv_cache: expected a torch.Tensor"),
    ("kv_cache", lambda a: a["kv_cache"].float(), TypeError, "kv_cache: expected dtype"),
    ("kv_cache", lambda a: a["kv_cache"].flatten(1), ValueError, "kv_cache: expected 3 dimensions"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 140, dtype=torch.uint8)[:, :, :132], ValueError, "kv_cache: each block must be contiguous"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 131, dtype=torch.uint8), ValueError, "kv_cache: cache_stride"),
    ("kv_cache", lambda a: a["kv_cache"].transpose(0, 1), ValueError, "kv_cache: each block must be contiguous"),
    ("kv_cache", lambda a: torch.zeros(4 * 16 * 132 + 1, dtype=torch.uint8)[1:].view(4, 16, 132), ValueError,
     "kv_cache: data pointer"),
    ("kv_cache", lambda a: torch.zeros(4, 16 * 132 + 2, dtype=torch.uint8)[:, :16 * 132].view(4, 16, 132),
     ValueError, "kv_cache: stride"),
    ("dst_k", lambda a: a["dst_k"].view(torch.uint8).to(torch.float16), TypeError, "dst_k: expected dtype"),
    ("dst_k", lambda a: a["dst_k"].view(torch.uint8).flatten(), ValueError, "dst_k: expected 2 dimensions"),
    ("dst_k", lambda a: torch.zeros(40, 126, dtype=torch.uint8), ValueError, "dst_k: head_dim"),
    ("dst_k", lambda a: torch.zeros(128, 40, dtype=torch.uint8).t(), ValueError, "dst_k: the last dimension"),
    ("dst_k", lambda a: torch.zeros(40 * 130 + 2, dtype=torch.uint8)[2:].view(40, 130)[:, :128], ValueError,
     "dst_k: data pointer"),
    ("dst_k", lambda a: torch.zeros(40, 130, dtype=torch.uint8)[:, :128], ValueError, "dst_k: stride"),
    ("dst_scale", lambda a: torch.zeros(40, 4, dtype=torch.int32), TypeError, "dst_scale: expected dtype"),
    ("dst_scale", lambda a: torch.zeros(40, 6, dtype=torch.uint8), ValueError, "dst_scale: .*multiple of 4"),
    ("dst_scale", lambda a: torch.zeros(40, 3, dtype=torch.float32), ValueError, "dst_scale: 3 scales per token"),
    ("dst_scale", lambda a: torch.zeros(40, 0, dtype=torch.float32), ValueError, "dst_scale: 0 scales"),
    ("dst_scale", lambda a: torch.zeros(39, 4, dtype=torch.uint8), ValueError, "dst_scale: expected 40 rows"),
    ("dst_scale", lambda a: torch.zeros(40, 4, 1, dtype=torch.uint8), ValueError, "dst_scale: expected 2 dim"),
    ("dst_scale", lambda a: torch.zeros(40, 8, dtype=torch.uint8)[:, ::2], ValueError, "dst_scale: the last dim"),
    ("dst_scale", lambda a: torch.zeros(40, 6, dtype=torch.uint8)[:, :4], ValueError, "dst_scale: row stride"),
    ("block_table", lambda a: a["block_table"].long(), TypeError, "block_table: expected dtype torch.int32"),
    ("block_table", lambda a: a["block_table"].flatten(), ValueError, "block_table: expected 2 dimensions"),
    ("block_table", lambda a: a["block_table"].t(), ValueError, "block_table: the last dimension"),
    ("cu_seq_lens", lambda a: a["cu_seq_lens"].long(), TypeError, "cu_seq_lens: expected dtype torch.int32"),
    ("cu_seq_lens", lambda a: a["cu_seq_lens"][:2], ValueError, "cu_seq_lens: expected batch \\+ 1 = 3"),
    ("cu_seq_lens", lambda a: a["cu_seq_lens"].view(3, 1), ValueError, "cu_seq_lens: expected 1 dimensions"),
    ("cu_seq_lens", lambda a: torch.tensor([0, 0, 20, 0, 30, 0], dtype=torch.int32)[::2], ValueError,
     "cu_seq_lens: the last dimension"),
    ("cu_seq_lens", lambda a: a["cu_seq_lens"].to("meta"), ValueError, "cu_seq_lens: expected a tensor on cpu"),
    ("dst_k", lambda a: a["dst_k"].to("meta"), ValueError, "dst_k: expected a tensor on cpu"),
    # Written memory shared with memory the op reads: a race on a GPU.
    ("dst_k", lambda a: a["kv_cache"].view(-1)[: 40 * 128].view(40, 128), ValueError,
     "dst_k: its memory overlaps kv_cache"),
    ("dst_k", lambda a: a["kv_cache"].view(-1)[1000: 1000 + 40 * 128].view(40, 128).view(FP8), ValueError,
     "dst_k: its memory overlaps kv_cache"),
    ("dst_scale", lambda a: a["kv_cache"].view(-1)[-164:-4].view(40, 4), ValueError,
     "dst_scale: its memory overlaps kv_cache"),
    ("dst_scale", lambda a: a["kv_cache"].view(-1)[:160].view(torch.float32).view(40, 1), ValueError,
     "dst_scale: its memory overlaps kv_cache"),
    ("block_table", lambda a: a["dst_k"].view(torch.uint8).view(-1)[:16].view(torch.int32).view(2, 2), ValueError,
     "dst_k: its memory overlaps block_table"),
    ("cu_seq_lens", lambda a: a["dst_scale"].view(-1)[8:20].view(torch.int32), ValueError,
     "dst_scale: its memory overlaps cu_seq_lens"),
]


@pytest.mark.parametrize("name,make,exc,match", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_argument_raises_naming_it_and_writes_nothing(name, make, exc, match):
    a = good()
    a[name] = make(a)
    with pytest.raises(exc, match=match):
        call(a)
    for out in ("dst_k", "dst_scale"):
        t = a[out]
        if t.device.type == "cpu" and t.dtype in (torch.uint8, FP8) and t.numel():
            assert bool((t.view(torch.uint8) == SENTINEL).all()) or out == name


def test_head_dim_not_divisible_by_quant_block():
    a = good()
    a["dst_k"] = torch.zeros(40, 132, dtype=torch.uint8)
    a["dst_scale"] = torch.zeros(40, 5, dtype=torch.float32)
    a["kv_cache"] = torch.zeros(4, 16, 152, dtype=torch.uint8)
    with pytest.raises(ValueError, match="must divide head_dim=132"):
        call(a)


def test_float32_scales_are_accepted():
    a = good()
    a["dst_scale"] = torch.zeros(40, 1, dtype=torch.float32)
    call(a)
    assert torch.equal(a["dst_scale"][:30].view(torch.uint8), ng_ref_scales(a)[:30])


def ng_ref_scales(a):
    from helpers.reference import gather_reference
    _, s = gather_reference(a["kv_cache"], a["block_table"], a["cu_seq_lens"], 40, 128, 1)
    return s


def test_disjoint_views_of_one_buffer_are_accepted():
    """The overlap check compares address ranges, not storages: the cache, the outputs and
    the index tensors may all be views into one buffer as long as they do not overlap."""
    a = good()
    kv_bytes, k_bytes, s_bytes = 4 * 16 * 132, 40 * 128, 40 * 4
    buf = torch.full((kv_bytes + k_bytes + s_bytes + 16 + 12,), SENTINEL, dtype=torch.uint8)
    buf[:kv_bytes] = a["kv_cache"].view(-1)
    kv = buf[:kv_bytes].view(4, 16, 132)
    dst_k = buf[kv_bytes: kv_bytes + k_bytes].view(40, 128)
    dst_scale = buf[kv_bytes + k_bytes: kv_bytes + k_bytes + s_bytes].view(40, 4)
    idx = buf[kv_bytes + k_bytes + s_bytes:].view(torch.int32)
    idx[:4] = a["block_table"].view(-1)
    idx[4:] = a["cu_seq_lens"]
    ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_scale, idx[:4].view(2, 2), idx[4:])
    from helpers.reference import gather_reference
    k_ref, s_ref = gather_reference(a["kv_cache"], a["block_table"], a["cu_seq_lens"], 40, 128, 1)
    assert torch.equal(dst_k, k_ref) and torch.equal(dst_scale, s_ref)


@pytest.mark.parametrize("row_stride,col_stride", [(1, 2), (1, 0), (3, 1)])
def test_float32_scale_column_of_any_inner_stride(row_stride, col_stride):
    """A float32 dst_scale [N, 1]: the stride of its one column is meaningless, so every
    value is accepted and the rows are written; nothing may fail after dst_k is written."""
    a = good()
    storage = torch.full((40 * max(row_stride, col_stride) + 8,), float("nan"))
    a["dst_scale"] = storage.as_strided((40, 1), (row_stride, col_stride))
    call(a)
    k_ref, s_ref = ng_ref(a)
    assert torch.equal(a["dst_k"].view(torch.uint8), k_ref)
    assert torch.equal(a["dst_scale"][:30, 0].clone(memory_format=torch.contiguous_format).view(torch.uint8).view(30, 4), s_ref[:30])
    assert bool(a["dst_scale"][30:].isnan().all())


def ng_ref(a):
    from helpers.reference import gather_reference
    return gather_reference(a["kv_cache"], a["block_table"], a["cu_seq_lens"], 40, 128, 1)
