"""Every kind of bad argument of concat_and_cache_mla and cp_gather_and_upconvert_fp8_kv_cache
raises TypeError/ValueError naming the argument, before anything is written: every CPU tensor
of the call (outputs poisoned with SENTINEL, inputs too) holds the same bytes afterwards."""
import pytest
import torch

import nvrtc_gather as ng
from helpers.mla_reference import RECORD, SENTINEL

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _snapshot(args: dict) -> dict:
    return {n: _bytes(t).clone() for n, t in args.items() if isinstance(t, torch.Tensor) and t.device.type == "cpu"}


def _unchanged(args: dict, snap: dict) -> None:
    for n, before in snap.items():
        assert torch.equal(_bytes(args[n]), before), f"{n} was written before the bad argument was found"


# --- concat_and_cache_mla ----------------------------------------------------------------------

def good_write():
    return dict(kv_c=torch.randn(6, 512, dtype=BF16), k_pe=torch.randn(6, 64, dtype=BF16),
                kv_cache=torch.full((4, 16, RECORD), SENTINEL, dtype=torch.uint8),
                slot_mapping=torch.tensor([0, 17, -1, 40, 63, 2], dtype=torch.int64),
                kv_cache_dtype="fp8_ds_mla", scale=torch.ones(1), skip_scale=False, ds_scale_rule="pow2")


def good_plain(fmt="auto"):
    a = good_write()
    a["kv_cache_dtype"] = fmt
    a["kv_cache"] = torch.zeros(4, 16, 576, dtype=BF16 if fmt == "auto" else torch.uint8)
    a["kv_cache"].view(torch.uint8).fill_(SENTINEL)
    return a


def write(a):
    ng.concat_and_cache_mla(a["kv_c"], a["k_pe"], a["kv_cache"], a["slot_mapping"], a["kv_cache_dtype"], a["scale"],
                            a["skip_scale"], a["ds_scale_rule"])


def test_good_write_arguments_pass():
    for a in (good_write(), good_plain("auto"), good_plain("fp8")):
        before = a["kv_cache"].clone()
        write(a)
        assert not torch.equal(a["kv_cache"], before)


def _shared(a, n_bytes, offset=0):
    """n_bytes of kv_cache's storage, from ``offset``: a buffer the op writes."""
    return a["kv_cache"].view(torch.uint8).view(-1)[offset: offset + n_bytes]


WRITE_CASES = [
    # (argument, replacement builder, exception, message fragment, base)
    ("kv_c", lambda a: a["kv_c"].float().numpy(), TypeError, "kv_c: expected a torch.Tensor", "ds"),
    ("kv_c", lambda a: a["kv_c"].to(torch.int16), TypeError, "kv_c: expected dtype", "ds"),
    ("kv_c", lambda a: a["kv_c"].float(), TypeError, "kv_c: expected dtype", "ds"),  # fp32: plain formats only
    ("kv_c", lambda a: a["kv_c"].flatten(), ValueError, "kv_c: expected 2 dimensions", "ds"),
    ("kv_c", lambda a: a["kv_c"][:, :511], ValueError, "kv_c: fp8_ds_mla stores 512", "ds"),
    ("kv_c", lambda a: torch.randn(6, 576, dtype=BF16), ValueError, "kv_c: fp8_ds_mla stores 512", "ds"),
    ("kv_c", lambda a: a["kv_c"][:5], ValueError, "slot_mapping: 6 entries, more than the 5 rows of kv_c", "ds"),
    ("kv_c", lambda a: torch.randn(512, 6, dtype=BF16).t(), ValueError, "kv_c: the last dimension", "ds"),
    ("kv_c", lambda a: a["kv_c"].to("meta"), ValueError, "kv_c: expected a tensor on cpu like k_pe", "ds"),
    ("k_pe", lambda a: a["k_pe"].half(), TypeError, "k_pe: expected dtype torch.bfloat16 like kv_c", "ds"),
    ("k_pe", lambda a: a["k_pe"].float(), TypeError, "k_pe: expected dtype torch.bfloat16 like kv_c", "plain"),
    ("k_pe", lambda a: "k_pe", TypeError, "k_pe: expected a torch.Tensor", "ds"),
    ("k_pe", lambda a: a["k_pe"][:, :32], ValueError, "k_pe: fp8_ds_mla stores 64 values per token", "ds"),
    ("k_pe", lambda a: torch.randn(6, 128, dtype=BF16), ValueError, "k_pe: fp8_ds_mla stores 64", "ds"),
    ("k_pe", lambda a: a["k_pe"].unsqueeze(0), ValueError, "k_pe: expected 2 dimensions", "ds"),
    ("k_pe", lambda a: a["k_pe"][:3], ValueError, "slot_mapping: 6 entries, more than the 3 rows of k_pe", "ds"),
    ("k_pe", lambda a: torch.randn(64, 6, dtype=BF16).t(), ValueError, "k_pe: the last dimension", "ds"),
    ("k_pe", lambda a: a["k_pe"].to("meta"), ValueError, "k_pe: expected a tensor on cpu like kv_c", "ds"),
    ("kv_cache", lambda a: [0] * 3, TypeError, "kv_cache: expected a torch.Tensor", "ds"),
    ("kv_cache", lambda a: a["kv_cache"].float(), TypeError, "kv_cache: expected dtype", "ds"),
    ("kv_cache", lambda a: a["kv_cache"].to(torch.int8), TypeError, "kv_cache: expected dtype", "ds"),
    ("kv_cache", lambda a: a["kv_cache"].flatten(1), ValueError, "kv_cache: expected 3 dimensions", "ds"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 655, dtype=torch.uint8), ValueError,
     "kv_cache: dim 2 must be the 656-byte fp8_ds_mla record", "ds"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 576, dtype=torch.uint8), ValueError, "kv_cache: dim 2 must be", "ds"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 656, dtype=BF16), ValueError, "kv_cache: dim 2 must be kv_lora_rank "
     "\\+ pe_dim = 576", "plain"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 577, dtype=BF16), ValueError, "kv_cache: dim 2 must be", "plain"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 576, dtype=torch.float16), TypeError, "kv_cache: the", "plain"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 576, dtype=torch.uint8), TypeError, "kv_cache: the", "plain"),
    ("kv_cache", lambda a: torch.zeros(4, 0, RECORD, dtype=torch.uint8), ValueError, "kv_cache: block_size", "ds"),
    ("kv_cache", lambda a: torch.zeros(4, 16, RECORD, 2, dtype=torch.uint8)[..., 0], ValueError,
     "kv_cache: each entry \\(dim 2\\) must be contiguous", "ds"),
    ("kv_cache", lambda a: torch.zeros(4 * 16 * 600 + 56, dtype=torch.uint8).as_strided((4, 16, RECORD), (9600, 600, 1)),
     ValueError, "kv_cache: entries overlap", "ds"),
    ("kv_cache", lambda a: torch.zeros(16 * RECORD, dtype=torch.uint8).as_strided((4, 16, RECORD), (0, RECORD, 1)),
     ValueError, "kv_cache: entries overlap", "ds"),
    ("kv_cache", lambda a: torch.zeros(4 * 16 * RECORD + 2, dtype=torch.uint8)[2:].view(4, 16, RECORD), ValueError,
     "kv_cache: data pointer", "ds"),
    ("kv_cache", lambda a: torch.zeros(4, 16, 658, dtype=torch.uint8)[:, :, :RECORD], ValueError,
     "kv_cache: stride\\(1\\) in bytes", "ds"),
    ("kv_cache", lambda a: torch.zeros(4, 16 * RECORD + 2, dtype=torch.uint8)[:, :16 * RECORD].view(4, 16, RECORD),
     ValueError, "kv_cache: stride\\(0\\) in bytes", "ds"),
    ("kv_cache", lambda a: a["kv_cache"].to("meta"), ValueError, "kv_cache: expected a tensor on cpu like kv_c", "ds"),
    ("slot_mapping", lambda a: a["slot_mapping"].int(), TypeError, "slot_mapping: expected dtype torch.int64", "ds"),
    ("slot_mapping", lambda a: a["slot_mapping"].view(2, 3), ValueError, "slot_mapping: expected 1 dimensions", "ds"),
    ("slot_mapping", lambda a: torch.arange(12)[::2], ValueError, "slot_mapping: the last dimension", "ds"),
    ("slot_mapping", lambda a: torch.arange(7), ValueError, "slot_mapping: 7 entries, more than the 6 rows of kv_c",
     "ds"),
    ("slot_mapping", lambda a: torch.tensor([0, 64, 1]), ValueError,
     "slot_mapping: entry 1 = 64 is past the cache's last slot \\(64 slots", "ds"),
    ("slot_mapping", lambda a: torch.tensor([3, -1, 2 ** 62]), ValueError, "slot_mapping: entry 2", "plain"),
    ("slot_mapping", lambda a: a["slot_mapping"].to("meta"), ValueError, "slot_mapping: expected a tensor on cpu",
     "ds"),
    ("kv_cache_dtype", lambda a: "fp8_e5m2", ValueError, "kv_cache_dtype: expected one of", "ds"),
    ("kv_cache_dtype", lambda a: "fp8_ds_MLA", ValueError, "kv_cache_dtype: expected one of .*got 'fp8_ds_MLA'", "ds"),
    ("kv_cache_dtype", lambda a: "fp8-ds-mla", ValueError, "kv_cache_dtype: expected one of", "ds"),
    ("kv_cache_dtype", lambda a: "", ValueError, "kv_cache_dtype: expected one of", "ds"),
    ("kv_cache_dtype", lambda a: None, TypeError, "kv_cache_dtype: expected a str, got NoneType", "ds"),
    ("kv_cache_dtype", lambda a: torch.uint8, TypeError, "kv_cache_dtype: expected a str", "ds"),
    ("kv_cache_dtype", lambda a: 1, TypeError, "kv_cache_dtype: expected a str, got int", "ds"),
    ("skip_scale", lambda a: 1, TypeError, "skip_scale: expected a bool, got int", "ds"),
    ("skip_scale", lambda a: "True", TypeError, "skip_scale: expected a bool", "plain"),
    ("ds_scale_rule", lambda a: "ue8m0", ValueError, "ds_scale_rule: expected \"pow2\"", "ds"),
    ("ds_scale_rule", lambda a: None, ValueError, "ds_scale_rule: expected", "ds"),
    ("scale", lambda a: 1.0, TypeError, "scale: expected a torch.Tensor", "ds"),
    ("scale", lambda a: torch.ones(1, dtype=torch.float16), TypeError, "scale: expected dtype torch.float32", "fp8"),
    ("scale", lambda a: torch.ones(1, dtype=torch.float64), TypeError, "scale: expected dtype torch.float32", "fp8"),
    ("scale", lambda a: torch.ones(0), ValueError, "scale: the fp8 format divides by scale\\[0\\]", "fp8"),
    ("scale", lambda a: torch.ones(1, device="meta"), ValueError, "scale: expected a tensor on cpu", "fp8"),
    # The cache sharing memory with what the op reads: a race on a GPU.
    ("kv_c", lambda a: _shared(a, 6 * 1024).view(BF16).view(6, 512), ValueError, "kv_cache: its memory overlaps kv_c",
     "ds"),
    ("k_pe", lambda a: _shared(a, 6 * 128, 5000).view(BF16).view(6, 64), ValueError,
     "kv_cache: its memory overlaps k_pe", "ds"),
    ("k_pe", lambda a: _shared(a, 6 * 1152, 64).view(BF16).view(6, 576)[:, 512:], ValueError,
     "kv_cache: its memory overlaps k_pe", "ds"),
    ("slot_mapping", lambda a: _shared(a, 48, 4096).view(torch.int64), ValueError,
     "kv_cache: its memory overlaps slot_mapping", "ds"),
    ("scale", lambda a: _shared(a, 4, 1024).view(torch.float32), ValueError, "kv_cache: its memory overlaps scale",
     "fp8"),
]


@pytest.mark.parametrize("name,make,exc,match,base", WRITE_CASES,
                         ids=[f"{c[0]}-{c[4]}-{i}" for i, c in enumerate(WRITE_CASES)])
def test_bad_write_argument_raises_naming_it_and_writes_nothing(name, make, exc, match, base):
    a = good_write() if base == "ds" else good_plain("auto" if base == "plain" else "fp8")
    a[name] = make(a)
    snap = _snapshot(a)
    with pytest.raises(exc, match=match):
        write(a)
    _unchanged(a, snap)
    if a["kv_cache"] is not None and isinstance(a["kv_cache"], torch.Tensor) and a["kv_cache"].device.type == "cpu" \
            and name not in ("kv_cache",):
        assert bool((a["kv_cache"].view(torch.uint8) == SENTINEL).all())


def test_scale_is_not_checked_where_it_is_not_read():
    """fp8_ds_mla and the copy formats never read scale: any tensor will do; fp8 with skip_scale
    takes an empty one."""
    for a in (good_write(), good_plain("auto")):
        a["scale"] = torch.ones(3, dtype=torch.int8, device="meta")
        write(a)
    a = good_plain("fp8")
    a["skip_scale"], a["scale"] = True, torch.ones(0)  # float32 (checked), but empty: never read
    write(a)


@pytest.mark.parametrize("fmt,dtype", [("fp8", BF16), ("fp8", torch.float32), ("auto", BF16), ("fp8_ds_mla", BF16)])
def test_inputs_right_after_the_cache_are_accepted(fmt, dtype):
    """The cache's written extent ends at its last entry's last byte: kv_c / k_pe placed right
    after it in one buffer are disjoint (the fp8 format's extent once counted kv_c's element
    size per cache element and refused them)."""
    width = RECORD if fmt == "fp8_ds_mla" else 576
    cache_dtype = dtype if fmt == "auto" else torch.uint8
    esize = torch.tensor([], dtype=dtype).element_size()
    cache_bytes = 2 * 4 * width * torch.tensor([], dtype=cache_dtype).element_size()
    buf = torch.zeros(cache_bytes + 2 * 576 * esize, dtype=torch.uint8)
    cache = buf[:cache_bytes].view(cache_dtype).view(2, 4, width)
    x = buf[cache_bytes:].view(dtype).view(2, 576)
    x.copy_(torch.randn(2, 576))
    before = x.clone()
    ng.concat_and_cache_mla(x[:, :512], x[:, 512:], cache, torch.tensor([0, 5]), fmt, torch.ones(1))
    assert bool(cache.view(torch.uint8)[0, 0].ne(0).any()) and bool(cache.view(torch.uint8)[1, 1].ne(0).any())
    assert torch.equal(x, before)  # the inputs are intact


def test_pe_dim_0_accepted_other_widths_refused():
    a = good_write()
    a["k_pe"] = torch.empty(6, 0, dtype=BF16)
    write(a)
    for width in (1, 63, 65):
        a = good_write()
        a["k_pe"] = torch.empty(6, width, dtype=BF16)
        with pytest.raises(ValueError, match=f"k_pe: .*got pe_dim {width}"):
            write(a)
        assert bool((a["kv_cache"] == SENTINEL).all())


# --- cp_gather_and_upconvert_fp8_kv_cache ------------------------------------------------------

def good_gather():
    cache = torch.randint(0, 256, (4, 16, RECORD), dtype=torch.uint8)
    cache[:, :, 512:528] = torch.tensor([1.0, 2.0, 0.5, 1.0]).view(torch.uint8)  # finite scales
    dst = torch.zeros(30, 576, dtype=BF16)
    dst.view(torch.uint8).fill_(SENTINEL)
    return dict(src_cache=cache, dst=dst, block_table=torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32),
                workspace_starts=torch.tensor([0, 10, 25], dtype=torch.int32), batch_size=3,
                seq_starts=torch.tensor([0, 4, 1], dtype=torch.int32))


def gather(a):
    ng.cp_gather_and_upconvert_fp8_kv_cache(a["src_cache"], a["dst"], a["block_table"], a["workspace_starts"],
                                            a["batch_size"], a["seq_starts"])


def test_good_gather_arguments_pass():
    a = good_gather()
    gather(a)
    assert not bool((a["dst"].view(torch.uint8) == SENTINEL).all(1).any())


def _in_dst(a, n_bytes, offset=0):
    return a["dst"].view(torch.uint8).view(-1)[offset: offset + n_bytes]


GATHER_CASES = [
    ("batch_size", lambda a: True, TypeError, "batch_size: expected an int, got bool"),
    ("batch_size", lambda a: 3.0, TypeError, "batch_size: expected an int, got float"),
    ("batch_size", lambda a: "3", TypeError, "batch_size: expected an int, got str"),
    ("batch_size", lambda a: torch.tensor(3), TypeError, "batch_size: expected an int, got a torch.int64 tensor"),
    ("batch_size", lambda a: None, TypeError, "batch_size: expected an int"),
    ("batch_size", lambda a: -1, ValueError, "batch_size: must be >= 0, got -1"),
    ("batch_size", lambda a: 4, ValueError, "block_table: batch_size = 4 requests, but it has only 3 rows"),
    ("workspace_starts", lambda a: a["workspace_starts"][:2], ValueError,
     "workspace_starts: batch_size = 3 requests, but it has only 2 rows"),
    ("seq_starts", lambda a: a["seq_starts"][:1], ValueError, "seq_starts: batch_size = 3 requests, but it has only 1"),
    ("src_cache", lambda a: a["src_cache"].numpy(), TypeError, "src_cache: expected a torch.Tensor"),
    ("src_cache", lambda a: a["src_cache"].to(torch.int8), TypeError, "src_cache: expected dtype"),
    ("src_cache", lambda a: a["src_cache"].flatten(1), ValueError, "src_cache: expected 3 dimensions"),
    ("src_cache", lambda a: torch.zeros(4, 16, 655, dtype=torch.uint8), ValueError,
     "src_cache: dim 2 must be the 656-byte fp8_ds_mla record"),
    ("src_cache", lambda a: torch.zeros(4, 16, 576, dtype=torch.uint8), ValueError, "src_cache: dim 2 must be"),
    ("src_cache", lambda a: torch.zeros(4, 0, RECORD, dtype=torch.uint8), ValueError, "src_cache: block_size"),
    ("src_cache", lambda a: torch.zeros(4, 16, RECORD, 2, dtype=torch.uint8)[..., 0], ValueError,
     "src_cache: each record \\(dim 2\\) must be contiguous"),
    ("src_cache", lambda a: torch.zeros(4 * 16 * RECORD + 2, dtype=torch.uint8)[2:].view(4, 16, RECORD), ValueError,
     "src_cache: data pointer"),
    ("src_cache", lambda a: torch.zeros(4, 16, 658, dtype=torch.uint8)[:, :, :RECORD], ValueError,
     "src_cache: stride\\(1\\)"),
    ("src_cache", lambda a: a["src_cache"].to("meta"), ValueError, "src_cache: expected a tensor on cpu like dst"),
    ("dst", lambda a: a["dst"].float(), TypeError, "dst: expected dtype torch.bfloat16"),
    ("dst", lambda a: a["dst"].half(), TypeError, "dst: expected dtype torch.bfloat16"),
    ("dst", lambda a: a["dst"].view(torch.uint8), TypeError, "dst: expected dtype torch.bfloat16"),
    ("dst", lambda a: a["dst"].view(-1), ValueError, "dst: expected 2 dimensions"),
    ("dst", lambda a: a["dst"][:, :575], ValueError, "dst: expected \\[num_rows, 576\\]"),
    ("dst", lambda a: torch.zeros(30, 512, dtype=BF16), ValueError, "dst: expected \\[num_rows, 576\\]"),
    ("dst", lambda a: torch.zeros(576, 30, dtype=BF16).t(), ValueError, "dst: the last dimension"),
    ("dst", lambda a: torch.zeros(30 * 500 + 76, dtype=BF16).as_strided((30, 576), (500, 1)), ValueError,
     "dst: rows overlap"),
    ("dst", lambda a: torch.zeros(576, dtype=BF16).as_strided((30, 576), (0, 1)), ValueError, "dst: rows overlap"),
    ("dst", lambda a: torch.zeros(30 * 576 + 1, dtype=BF16)[1:].view(30, 576), ValueError, "dst: data pointer"),
    ("dst", lambda a: torch.zeros(30, 577, dtype=BF16)[:, :576], ValueError, "dst: row stride in bytes"),
    ("dst", lambda a: a["dst"].to("meta"), ValueError, "dst: expected a tensor on cpu like src_cache"),
    ("block_table", lambda a: a["block_table"].long(), TypeError, "block_table: expected dtype torch.int32"),
    ("block_table", lambda a: a["block_table"].flatten(), ValueError, "block_table: expected 2 dimensions"),
    ("block_table", lambda a: torch.zeros(2, 3, dtype=torch.int32).t(), ValueError, "block_table: the last dimension"),
    ("block_table", lambda a: a["block_table"].to("meta"), ValueError, "block_table: expected a tensor on cpu"),
    ("workspace_starts", lambda a: a["workspace_starts"].long(), TypeError,
     "workspace_starts: expected dtype torch.int32"),
    ("workspace_starts", lambda a: a["workspace_starts"].view(3, 1), ValueError,
     "workspace_starts: expected 1 dimensions"),
    ("workspace_starts", lambda a: torch.tensor([0, 9, 10, 9, 25, 9], dtype=torch.int32)[::2], ValueError,
     "workspace_starts: the last dimension"),
    ("workspace_starts", lambda a: [0, 10, 25], TypeError, "workspace_starts: expected a torch.Tensor"),
    ("workspace_starts", lambda a: a["workspace_starts"].to("meta"), ValueError,
     "workspace_starts: expected a tensor on cpu"),
    ("seq_starts", lambda a: a["seq_starts"].long(), TypeError, "seq_starts: expected dtype torch.int32"),
    ("seq_starts", lambda a: a["seq_starts"].view(1, 3), ValueError, "seq_starts: expected 1 dimensions"),
    ("seq_starts", lambda a: torch.tensor([0, 7, 4, 7, 1, 7], dtype=torch.int32)[::2], ValueError,
     "seq_starts: the last dimension"),
    ("seq_starts", lambda a: (0, 4, 1), TypeError, "seq_starts: expected a torch.Tensor"),
    ("seq_starts", lambda a: a["seq_starts"].to("meta"), ValueError, "seq_starts: expected a tensor on cpu"),
    # values the CPU path checks before writing
    ("workspace_starts", lambda a: torch.tensor([-1, 10, 25], dtype=torch.int32), ValueError,
     "workspace_starts: entry 0 = -1 is negative"),
    ("workspace_starts", lambda a: torch.tensor([0, 26, 25], dtype=torch.int32), ValueError,
     "workspace_starts: must be non-decreasing, but entry 1 = 26 > entry 2 = 25"),
    ("workspace_starts", lambda a: torch.tensor([0, 10, -2 ** 31], dtype=torch.int32), ValueError,
     "workspace_starts: entry 2 = -2147483648 is negative"),
    ("seq_starts", lambda a: torch.tensor([0, -3, 1], dtype=torch.int32), ValueError,
     "seq_starts: entry 1 = -3 is negative"),
    ("seq_starts", lambda a: torch.tensor([0, 4, 32], dtype=torch.int32), ValueError,
     "block_table: request 2 needs token 32, past its 2 columns of 16-token blocks"),
    ("seq_starts", lambda a: torch.tensor([0, 4, 2 ** 31 - 1], dtype=torch.int32), ValueError,
     "block_table: request 2 needs token"),
    ("block_table", lambda a: torch.tensor([[0, 1], [2, 4], [1, 0]], dtype=torch.int32), ValueError,
     "block_table: entry \\[1, 1\\] = 4 is outside \\[0, num_blocks=4\\)"),
    ("block_table", lambda a: torch.tensor([[-1, 1], [2, 3], [1, 0]], dtype=torch.int32), ValueError,
     "block_table: entry \\[0, 0\\] = -1 is outside"),
    ("block_table", lambda a: torch.tensor([[0], [2], [1]], dtype=torch.int32), ValueError,
     "block_table: request 1 needs token 16, past its 1 columns"),
    # dst sharing memory with what the op reads
    ("dst", lambda a: a["src_cache"].view(-1)[: 30 * 1152].view(BF16).view(30, 576), ValueError,
     "dst: its memory overlaps src_cache"),
    ("dst", lambda a: a["src_cache"].view(-1)[4000: 4000 + 30 * 1152].view(BF16).view(30, 576), ValueError,
     "dst: its memory overlaps src_cache"),
    ("block_table", lambda a: _in_dst(a, 24, 2000).view(torch.int32).view(3, 2), ValueError,
     "dst: its memory overlaps block_table"),
    ("workspace_starts", lambda a: _in_dst(a, 12, 30 * 1152 - 12).view(torch.int32), ValueError,
     "dst: its memory overlaps workspace_starts"),
    ("seq_starts", lambda a: _in_dst(a, 12, 4).view(torch.int32), ValueError, "dst: its memory overlaps seq_starts"),
]


@pytest.mark.parametrize("name,make,exc,match", GATHER_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(GATHER_CASES)])
def test_bad_gather_argument_raises_naming_it_and_writes_nothing(name, make, exc, match):
    a = good_gather()
    a[name] = make(a)
    snap = _snapshot(a)
    with pytest.raises(exc, match=match):
        gather(a)
    _unchanged(a, snap)
    dst = a["dst"]
    if isinstance(dst, torch.Tensor) and dst.device.type == "cpu" and name != "dst":
        assert bool((dst.view(torch.uint8) == SENTINEL).all())


def test_rows_past_the_last_request_and_clamped_starts_are_fine():
    """workspace_starts past num_rows is not an error (clamped: those requests are empty)."""
    a = good_gather()
    a["workspace_starts"] = torch.tensor([0, 30, 1000], dtype=torch.int32)
    a["seq_starts"] = None
    gather(a)
    assert not bool((a["dst"].view(torch.uint8) == SENTINEL).all(1).any())


def test_disjoint_views_of_one_buffer_are_accepted():
    """Overlap is judged by address ranges: cache, dst and indices carved from one buffer
    without overlap are fine, and the result is that of separate tensors."""
    a = good_gather()
    b = good_gather()
    b["src_cache"] = a["src_cache"]
    nc, nd = a["src_cache"].numel(), 30 * 1152
    buf = torch.full((nc + nd + 4 * 12,), SENTINEL, dtype=torch.uint8)
    buf[:nc] = a["src_cache"].view(-1)
    a["src_cache"] = buf[:nc].view(4, 16, RECORD)
    a["dst"] = buf[nc: nc + nd].view(BF16).view(30, 576)
    idx = buf[nc + nd:].view(torch.int32)
    idx[:6] = b["block_table"].view(-1)
    idx[6:9] = b["workspace_starts"]
    idx[9:] = b["seq_starts"]
    a["block_table"], a["workspace_starts"], a["seq_starts"] = idx[:6].view(3, 2), idx[6:9], idx[9:]
    gather(a)
    gather(b)
    assert torch.equal(a["dst"].view(torch.uint8), b["dst"].view(torch.uint8))
