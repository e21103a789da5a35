"""SGLang's index-K read and write entries on the GPU (one launch each): bytes against the CPU
path across lengths / page-table dtypes and strides, spare rows zero, bad indices zero rows
(debug mode raises), and no host sync and exactly one kernel per call."""
import random

import pytest
import torch

from helpers.launches import kernels_launched
from nvrtc_gather.integrations import sglang as sg
from nvrtc_gather.kernels import index_k_read as spec

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def case(rng, batch, mean, ps=64, lt=torch.int32, pt=torch.int32, strided=False, spare=0, low=0):
    lens = [rng.randint(low, 2 * mean - low) for _ in range(batch)]
    max_pages = max([-(-n // ps) for n in lens] + [1])
    num_pages = sum(-(-n // ps) for n in lens) + 3
    perm = list(range(num_pages))
    rng.shuffle(perm)
    pages, k = [], 0
    for n in lens:
        need = -(-n // ps)
        pages.append(perm[k:k + need] + [-1] * (max_pages - need))
        k += need
    buf = torch.randint(0, 256, (num_pages, ps * 132), dtype=torch.uint8)
    table = torch.tensor(pages, dtype=pt).view(batch, max_pages)
    if strided:
        table = table.t().contiguous().t()
    return buf, torch.tensor(lens, dtype=lt), table, sum(lens) + spare, max(lens + [0])


# (1, 20000), (1, 60500): one request (no scan) in the tile and the wide entries (132 SMs). (4096, 64): blocks far
# into a batch of 16 chunks of lengths. (int64, int32): SGLang 0.5.23's own call (forward_batch.seq_lens
# and an int32 page table).
@pytest.mark.parametrize("shape", [(1, 1000), (1, 20000), (1, 60500), (8, 100), (16, 2048), (300, 40), (1024, 256),
                                   (4096, 64)])
@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int64, torch.int64), (torch.int32, torch.int64),
                                    (torch.int64, torch.int32)])
def test_read_matches_the_cpu_path(shape, dtypes):
    rng = random.Random(shape[0] * 7 + shape[1])
    buf, lens, table, total, longest = case(rng, *shape, lt=dtypes[0], pt=dtypes[1], strided=shape[0] % 2 == 0,
                                            spare=rng.choice([0, 5]))
    want = sg.get_index_k_scale_buffer(buf, lens, table, total, longest)
    for _ in range(2):  # the first call plans, the second takes the remembered layout
        got = sg.get_index_k_scale_buffer(buf.cuda(), lens.cuda(), table.cuda(), total, longest)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])


# Request-major tiles (2 to 256 requests; the launch rule takes them in place of narrow row-major
# ones where their grid is within 2x of the row-major one): lengths 0.5x-1.5x the mean, max_seq_len
# as the engine passes it, above the longest length, and below it (fewer blocks a request: each
# loops over its request's tiles). (8, 10000): a grid past one wave of resident blocks (704-1008 of
# 128 rows), which SGLang's default layout launches as its 256-row tiles ("req_wide").
@pytest.mark.parametrize("shape", [(16, 2048), (32, 512), (64, 512), (4, 8192), (2, 30000), (8, 10000)])
@pytest.mark.parametrize("longest_by", [1.0, 1.3, 0.6])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int32), (torch.int32, torch.int64)])
def test_request_major_tiles_match_the_cpu_path(shape, longest_by, dtypes):
    rng = random.Random(shape[0] * 11 + shape[1])
    buf, lens, table, total, longest = case(rng, *shape, lt=dtypes[0], pt=dtypes[1], strided=shape[0] % 2 == 1,
                                            spare=rng.choice([0, 7]), low=shape[1] // 2)
    max_seq_len = min(int(longest * longest_by), table.size(1) * 64)
    want = sg.get_index_k_scale_buffer(buf, lens, table, total, max_seq_len)
    args = buf.cuda(), lens.cuda(), table.cuda(), total, max_seq_len
    for _ in range(2):  # the first call plans, the second takes the remembered layout
        got = sg.get_index_k_scale_buffer(*args)
        assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, expected, _ = spec.launch_rule(128, sms, shape[0], True)(total, max_seq_len)
    if longest_by == 1.0 and sms >= 100:  # an engine's own max_seq_len: request-major on these rows
        assert expected == ("req_wide" if shape == (8, 10000) else "req"), expected


_LAUNCHES = [((16, 2048), 3000), ((4, 8192), 12000), ((8, 10000), 15000), ((300, 40), 80), ((1, 20000), 20000)]


@pytest.mark.parametrize("shape, max_seq_len", _LAUNCHES, ids=[f"{b}x{m}" for (b, m), _ in _LAUNCHES])
def test_the_read_launches_the_entry_its_launch_rule_names(shape, max_seq_len):
    """The kernel a call launches is the one spec.launch_rule names for its rows and max_seq_len:
    request-major tiles for a few long requests, row-major ones past 256 requests or for one (the
    profiler it reads them with does not run under compute-sanitizer: the sanitizers run the
    bytes tests above)."""
    rng = random.Random(shape[0])
    buf, lens, table, total, _ = case(rng, *shape, lt=torch.int64, low=shape[1] // 2)
    args = buf.cuda(), lens.cuda(), table.cuda(), total, min(max_seq_len, table.size(1) * 64)
    (name,) = kernels_launched([lambda: sg.get_index_k_scale_buffer(*args)])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    _, expected, _ = spec.launch_rule(128, sms, shape[0], True)(total, args[-1])
    # SGLang's default layout: the shape's constant-size entry where it has one
    assert name == spec.entry_name(16, "i64", "i32", expected, fixed=True), name
    if sms >= 100:
        assert (expected in spec.BY_REQUEST) == (shape[0] in (16, 4, 8)), expected
        assert (expected == "req_wide") == (shape[0] == 8), expected  # past one wave of 4 blocks an SM


def test_bad_values_give_zero_rows_and_debug_mode_raises(monkeypatch):
    buf = torch.randint(1, 256, (4, 16 * 132), dtype=torch.uint8, device="cuda")
    lens = torch.tensor([5, -3, 4], device="cuda")
    table = torch.tensor([[0], [1], [9]], device="cuda")
    k, s = sg.get_index_k_scale_buffer(buf, lens, table, 12, 16, page_size=16)
    assert k[:5].all(dim=1).any() and not k[5:].any() and not s[5:].any()
    monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    with pytest.raises(ValueError, match="seq_len_tensor: entry 1 = -3"):
        sg.get_index_k_scale_buffer(buf, lens, table, 12, 16, page_size=16)


def test_read_and_write_are_one_launch_without_a_sync():
    rng = random.Random(3)
    buf, lens, table, total, longest = case(rng, 64, 300)
    buf, lens, table = buf.cuda(), lens.cuda(), table.cuda()
    loc = torch.randperm(buf.size(0) * 64, device="cuda")[:500].to(torch.int32)
    k = torch.randint(0, 256, (500, 128), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    ks = torch.rand(500, device="cuda")
    calls = [lambda: sg.get_index_k_scale_buffer(buf, lens, table, total, longest),
             lambda: sg.set_index_k_scale_buffer(buf, loc, k, ks)]
    kernels = kernels_launched(calls)
    assert len(kernels) == 2, kernels
