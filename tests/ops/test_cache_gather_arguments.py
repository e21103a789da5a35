"""Every kind of bad argument of cp_gather_cache and gather_and_maybe_dequant_cache raises
TypeError/ValueError naming the argument, before anything is written: every CPU tensor of the
call (the destination poisoned with SENTINEL) holds the same bytes afterwards."""
import pytest
import torch

import nvrtc_gather as ng
from helpers.cache_gather_reference import SENTINEL

BF16 = torch.bfloat16
I32 = torch.int32


def good(conversion="copy"):
    """A valid call: 3 requests of 5, 0, 7 entries over 4 blocks of 4."""
    src = torch.randint(0, 256, (4, 4, 576), dtype=torch.uint8)
    dst_dtype = torch.uint8 if conversion == "copy" else BF16
    a = dict(src_cache=src, dst=torch.zeros(14, 576, dtype=dst_dtype),
             block_table=torch.tensor([[0, 1, 2], [3, 3, 3], [2, 1, 0]], dtype=I32),
             cu_seq_lens=torch.tensor([0, 5, 5, 12], dtype=I32), batch_size=3,
             token_to_seq=torch.zeros(14, dtype=I32), num_tokens=14, kv_cache_dtype="fp8", scale=torch.ones(1),
             seq_starts=torch.tensor([1, 0, 3], dtype=I32))
    a["dst"].view(torch.uint8).fill_(SENTINEL)
    return a


def cp(a):
    ng.cp_gather_cache(a["src_cache"], a["dst"], a["block_table"], a["cu_seq_lens"], a["batch_size"], a["seq_starts"])


def dq(a):
    ng.gather_and_maybe_dequant_cache(a["src_cache"], a["dst"], a["block_table"], a["cu_seq_lens"], a["token_to_seq"],
                                      a["num_tokens"], a["kv_cache_dtype"], a["scale"], a["seq_starts"])


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def expect(op, a, exc, match):
    snap = {n: _bytes(t).clone() for n, t in a.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(exc, match=match):
        op(a)
    for n, before in snap.items():
        assert torch.equal(_bytes(a[n]), before), f"{n} was written before the bad argument was found"


def test_good_arguments_write():
    for op, conv in ((cp, "copy"), (dq, "e4m3_bf16")):
        a = good(conv)
        before = a["dst"].clone()
        op(a)
        assert not torch.equal(a["dst"].view(torch.uint8), before.view(torch.uint8))
        assert bool((a["dst"][12:].view(torch.uint8) == SENTINEL).all())  # past cu[-1]: untouched


BOTH = [(cp, "copy"), (dq, "e4m3_bf16")]


@pytest.mark.parametrize("op,conv", BOTH, ids=["cp_gather_cache", "dequant"])
@pytest.mark.parametrize("name", ["src_cache", "dst", "block_table", "cu_seq_lens", "seq_starts"])
def test_not_a_tensor(op, conv, name):
    a = good(conv)
    a[name] = [1, 2, 3]
    expect(op, a, TypeError, f"{name}: expected a torch.Tensor")


@pytest.mark.parametrize("op,conv", BOTH, ids=["cp_gather_cache", "dequant"])
@pytest.mark.parametrize("name,dtype", [("block_table", torch.int64), ("cu_seq_lens", torch.int64),
                                        ("seq_starts", torch.int64), ("block_table", torch.float32)])
def test_index_dtypes(op, conv, name, dtype):
    a = good(conv)
    a[name] = a[name].to(dtype)
    expect(op, a, TypeError, f"{name}: expected dtype torch.int32")


@pytest.mark.parametrize("op,conv", BOTH, ids=["cp_gather_cache", "dequant"])
@pytest.mark.parametrize("name,value,match", [
    ("block_table", torch.zeros(3, dtype=I32), "block_table: expected 2 dimensions"),
    ("cu_seq_lens", torch.zeros(2, 2, dtype=I32), "cu_seq_lens: expected 1 dimensions"),
    ("seq_starts", torch.zeros(3, 1, dtype=I32), "seq_starts: expected 1 dimensions"),
    ("src_cache", torch.zeros(4, 576, dtype=torch.uint8), "src_cache: expected \\[num_blocks, block_size"),
    ("dst", torch.zeros(14 * 576, dtype=torch.uint8), "dst: expected \\[rows, entry"),
    ("block_table", torch.zeros(2, 3, dtype=I32), "block_table: 3 requests, but it has only 2 rows"),
    ("seq_starts", torch.zeros(2, dtype=I32), "seq_starts: 3 requests, but it has only 2 rows"),
    ("src_cache", torch.zeros(4, 0, 576, dtype=torch.uint8), "src_cache: block_size"),
    ("dst", torch.zeros(14, 512, dtype=torch.uint8), "dst: each row must hold src_cache's 576"),
])
def test_shapes(op, conv, name, value, match):
    a = good(conv)
    if name == "dst" and conv != "copy":
        value = value.to(BF16)
    a[name] = value
    expect(op, a, ValueError, match)


def test_cp_gather_cache_batch_size():
    for bad, exc, match in ((2, ValueError, r"cu_seq_lens: expected batch_size \+ 1 = 3 entries, got 4"),
                            (-1, ValueError, "batch_size: must be >= 0"), (True, TypeError, "batch_size: expected an int"),
                            (3.0, TypeError, "batch_size: expected an int")):
        a = good()
        a["batch_size"] = bad
        expect(cp, a, exc, match)


def test_cp_gather_cache_dtype_and_width():
    a = good()
    a["dst"] = torch.zeros(14, 576, dtype=BF16)
    expect(cp, a, TypeError, "dst: expected src_cache's dtype torch.uint8")
    a = good()
    a["src_cache"] = torch.zeros(4, 4, 6, dtype=torch.uint8)
    a["dst"] = torch.zeros(14, 6, dtype=torch.uint8)
    expect(cp, a, ValueError, "src_cache: an entry of 6 bytes cannot be moved in 4-byte words")
    a = good()
    a["src_cache"] = torch.zeros(4, 4, 576, 2, dtype=torch.uint8)[..., 0]  # entries strided
    expect(cp, a, ValueError, "src_cache: each entry .* must be contiguous")
    a = good()
    a["dst"] = torch.zeros(14, 576, 2, dtype=torch.uint8)[..., 0]
    expect(cp, a, ValueError, "dst: each entry .* must be contiguous")
    a = good()
    a["dst"] = torch.zeros(14 * 576 + 1, dtype=torch.uint8)[1:].view(14, 576)
    expect(cp, a, ValueError, "dst: data pointer .* must be a multiple of 4 bytes")
    a = good()
    a["src_cache"] = torch.zeros(4 * 4 * 576 + 2, dtype=torch.uint8)[2:].view(4, 4, 576)
    expect(cp, a, ValueError, "src_cache: data pointer")


def test_dequant_scalar_arguments():
    for name, bad, exc, match in (
            ("kv_cache_dtype", "fp8_e4m3fn", ValueError, "kv_cache_dtype: expected one of 'auto', 'bfloat16'"),
            ("kv_cache_dtype", 8, TypeError, "kv_cache_dtype: expected a str"),
            ("num_tokens", 15, ValueError, r"num_tokens: must be in \[0, dst.size\(0\) = 14\]"),
            ("num_tokens", -1, ValueError, "num_tokens: must be in"),
            ("num_tokens", True, TypeError, "num_tokens: expected an int"),
            ("token_to_seq", torch.zeros(14, dtype=torch.float32), TypeError, "token_to_seq: expected dtype"),
            ("token_to_seq", torch.zeros(2, 7, dtype=I32), ValueError, "token_to_seq: expected 1 dimensions"),
            ("token_to_seq", None, TypeError, "token_to_seq: expected a torch.Tensor"),
            ("scale", 1.0, TypeError, "scale: expected a torch.Tensor"),
            ("scale", torch.ones(1, dtype=torch.float64), TypeError, "scale: expected dtype torch.float32"),
            ("scale", torch.ones(2), ValueError, "scale: expected one float32 value"),
            ("cu_seq_lens", torch.zeros(0, dtype=I32), ValueError, "cu_seq_lens: expected \\[batch \\+ 1\\] entries")):
        a = good("e4m3_bf16")
        a[name] = bad
        expect(dq, a, exc, match)


def test_dequant_dtypes():
    a = good("e4m3_bf16")
    a["dst"] = torch.zeros(14, 576, dtype=torch.float64)
    expect(dq, a, TypeError, "dst: expected dtype torch.bfloat16 or torch.float16 or torch.float32")
    a = good("e4m3_bf16")
    a["src_cache"] = torch.zeros(4, 4, 576, dtype=BF16)
    expect(dq, a, TypeError, "src_cache: expected dtype torch.uint8 or torch.float8_e4m3fn")
    a = good("e4m3_bf16")
    a["src_cache"] = torch.zeros(4, 4, 576, dtype=torch.float8_e5m2)  # e5m2 codes read as e4m3: refused
    expect(dq, a, TypeError, "src_cache: expected dtype torch.uint8 or torch.float8_e4m3fn")
    a = good("e4m3_bf16")
    a["kv_cache_dtype"] = "auto"  # a uint8 cache cannot be copied into bf16 rows
    expect(dq, a, TypeError, "dst: expected src_cache's dtype")
    a = good("e4m3_bf16")
    a["kv_cache_dtype"], a["src_cache"], a["dst"] = "auto", torch.zeros(4, 4, 576, dtype=torch.uint8), \
        torch.zeros(14, 576, dtype=torch.uint8)
    expect(dq, a, TypeError, "dst: expected dtype torch.bfloat16")


@pytest.mark.parametrize("op,conv", BOTH, ids=["cp_gather_cache", "dequant"])
@pytest.mark.parametrize("victim", ["src_cache", "block_table", "cu_seq_lens", "seq_starts", "scale"])
def test_dst_overlapping_an_input(op, conv, victim):
    """An input inside dst's storage (a view of it) is refused: the kernel would read what it writes."""
    a = good(conv)
    if victim == "scale" and conv == "copy":
        pytest.skip("cp_gather_cache has no scale")
    dst_bytes = a["dst"].numel() * a["dst"].element_size()
    store = torch.full((dst_bytes + 16384,), SENTINEL, dtype=torch.uint8)  # dst, then room for the victim
    a["dst"] = store[:dst_bytes].view(a["dst"].dtype).view(a["dst"].shape)
    shape = a[victim].shape
    n = a[victim].numel() * a[victim].element_size()
    a[victim] = store[1152: 1152 + n].view(a[victim].dtype).view(shape)
    if victim in ("block_table", "cu_seq_lens", "seq_starts", "src_cache"):
        a[victim].copy_(good(conv)[victim])
    elif victim == "scale":
        a[victim].fill_(1.0)
    expect(op, a, ValueError, f"dst: its memory overlaps {victim}")


def test_auto_mode_does_not_read_the_scale():
    """"auto" never reads scale: any tensor passes, even one inside dst."""
    a = good("e4m3_bf16")
    a["kv_cache_dtype"], a["src_cache"] = "auto", torch.randn(4, 4, 576).to(BF16)
    a["scale"] = a["dst"].view(-1)[:1]
    dq(a)
